//! `hookspool run`: the intake and the dispatcher in one process (development and tiny
//! hosts; the README's first command). With no config anywhere it starts on an embedded
//! starter: a home under $XDG_STATE_HOME/hookspool or ./hookspool-home (nothing is written
//! outside it), a commented config.toml, a generated secret, a demo source whose batches a
//! sandboxed script writes to `<home>/outbox/`, and a printed, ready-to-paste signed curl.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use hmac::{KeyInit, Mac};
use tokio::sync::{Notify, watch};

use super::{Ctx, EXIT_NOT_FOUND, Exit, service};
use crate::config::PathInputs;
use crate::dispatch::{self, DispatchOptions};
use crate::intake::{self, IntakeOptions};
use crate::sys::listen;
use crate::wake::NotifyWaker;

const STARTER: &str = include_str!("starter.toml");
/// The demo's port; `HOOKSPOOL_PORT` overrides it when the starter is first written.
pub const STARTER_PORT: u16 = 8650;
const DEMO_BODY: &str =
    r#"{"id":"demo-1","topic":"hello","type":"greeting","text":"my first webhook"}"#;

/// The home `run` uses when nothing names one.
pub fn default_run_home() -> PathBuf {
    match std::env::var_os("XDG_STATE_HOME").filter(|v| !v.is_empty()) {
        Some(x) => PathBuf::from(x).join("hookspool"),
        None => PathBuf::from("hookspool-home"),
    }
}

/// Write a new file readable by its owner only; never replaces an existing one.
pub fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

/// Write the starter into `home` unless it already has a config. Returns whether it did.
pub fn ensure_starter(home: &Path) -> std::io::Result<bool> {
    let cfg = home.join("config.toml");
    if cfg.exists() {
        return Ok(false);
    }
    crate::store::ensure_home(home).map_err(|e| std::io::Error::other(e.to_string()))?;
    let home = std::fs::canonicalize(home)?;
    let secrets = home.join("secrets");
    std::fs::create_dir_all(&secrets)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&secrets, std::fs::Permissions::from_mode(0o700))?;
    let secret_path = secrets.join("demo");
    if !secret_path.exists() {
        let raw: [u8; 24] = rand::random();
        write_private(&secret_path, hex::encode(raw).as_bytes())?;
    }
    let port = std::env::var("HOOKSPOOL_PORT")
        .ok()
        .and_then(|p| p.parse::<u16>().ok())
        .unwrap_or(STARTER_PORT);
    let text = STARTER
        .replace("@HOME@", &home.display().to_string())
        .replace("@PORT@", &port.to_string());
    write_private(&cfg, text.as_bytes())?;
    Ok(true)
}

/// The curl command that sends a correctly signed demo webhook.
pub fn demo_curl(home: &Path, listen: &str) -> Option<String> {
    let secret = std::fs::read(home.join("secrets/demo")).ok()?;
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&secret).ok()?;
    mac.update(DEMO_BODY.as_bytes());
    let sig = hex::encode(mac.finalize().into_bytes());
    Some(format!(
        "curl -sS -X POST http://{listen}/hooks/demo -H 'Content-Type: application/json' -H 'X-Signature: sha256={sig}' --data '{DEMO_BODY}'"
    ))
}

pub fn run(ctx: &Ctx) -> Result<(), Exit> {
    let explicit = ctx.inputs.home_flag.is_some()
        || ctx.inputs.env_home.is_some()
        || ctx.inputs.config_flag.is_some()
        || ctx.inputs.env_config.is_some();
    let mut inputs = ctx.inputs.clone();
    if !explicit {
        inputs = PathInputs {
            home_flag: Some(default_run_home()),
            ..inputs
        };
    }
    let mut fresh = false;
    if inputs.config_flag.is_none() && inputs.env_config.is_none() {
        let home = inputs
            .home_flag
            .clone()
            .or(inputs.env_home.clone())
            .unwrap_or_else(default_run_home);
        fresh = ensure_starter(&home).map_err(|e| {
            Exit::new(
                EXIT_NOT_FOUND,
                format!("writing the starter config in {}: {e}", home.display()),
            )
        })?;
    }
    let inherited =
        listen::take_inherited().map_err(|e| Exit::new(EXIT_NOT_FOUND, e.to_string()))?;
    intake::entry::install_panic_hook();
    let cfg = ctx.config_from(&inputs)?;
    let home = std::fs::canonicalize(&cfg.home).unwrap_or_else(|_| cfg.home.clone());
    if cfg.sources.contains_key("demo") {
        let listen = cfg.intake.listen.first().map(String::as_str).unwrap_or("");
        if let Some(curl) = demo_curl(&home, listen) {
            eprintln!(
                "hookspool is running{} with home {}\n\nSend a first signed webhook:\n\n  {curl}\n\nWithin a few seconds the batch document appears in {}/outbox/. Sent again it is answered\n\"duplicate\"; change \"id\" for a new event, and send several within 2 s to see them coalesce.\nInspect with: hookspool --home {} list   (and: show <id> --events --attempts)\n",
                if fresh {
                    " on a new starter config"
                } else {
                    ""
                },
                home.display(),
                home.display(),
                home.display(),
            );
        }
    }
    let rt = service::runtime(cfg.intake.threads)?;
    rt.block_on(async move {
        let (stop_tx, stop_rx) = watch::channel(false);
        let reload = Arc::new(Notify::new());
        let wake = Arc::new(Notify::new());
        let clock = crate::clock::system();
        let stopped = |mut rx: watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|v| *v).await;
        };
        let mut iopts = IntakeOptions::new(
            inputs.clone(),
            Arc::new(NotifyWaker(wake.clone())),
            Box::pin(stopped(stop_rx.clone())),
        );
        iopts.inherited = inherited;
        // The dispatcher speaks to systemd for the pair (READY once it is up, WATCHDOG per tick).
        iopts.notify = false;
        iopts.clock = clock.clone();
        let dopts = DispatchOptions {
            inputs,
            clock,
            wake,
            reload: reload.clone(),
        };
        let stop_tx = Arc::new(stop_tx);
        let on_signal = stop_tx.clone();
        let signals = tokio::spawn(async move {
            service::signals(reload).await;
            let _ = on_signal.send(true);
        });
        // When either half stops (a signal, or a failure such as a port in use), stop the other.
        let i_fut = intake::serve(iopts);
        let d_fut = dispatch::run(dopts, stopped(stop_rx));
        tokio::pin!(i_fut, d_fut);
        let (i, d) = tokio::select! {
            i = &mut i_fut => { let _ = stop_tx.send(true); (i, d_fut.await) }
            d = &mut d_fut => { let _ = stop_tx.send(true); (i_fut.await, d) }
        };
        signals.abort();
        i?;
        d.map_err(Exit::from)
    })
}
