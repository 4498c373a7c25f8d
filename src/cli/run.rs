//! `hookspool run`: the intake and the dispatcher in one process (development and tiny
//! hosts; the README's first command). With no config anywhere it starts on an embedded
//! starter: a home under $XDG_STATE_HOME/hookspool or ./hookspool-home (nothing is written
//! outside it), a commented config.toml, a generated secret, a demo source whose batches a
//! sandboxed script writes to `<home>/outbox/`, and a printed, ready-to-paste signed curl.
//! Beside them it serves the admin API on `[admin] listen` (`run_admin`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use hmac::{KeyInit, Mac};
use tokio::sync::{Notify, oneshot, watch};

use super::{Ctx, EXIT_NOT_FOUND, Exit, service};
use crate::config::PathInputs;
use crate::dispatch::retry::Backoff;
use crate::dispatch::{self, DispatchError, DispatchOptions};
use crate::intake::{self, IntakeError, IntakeOptions};
use crate::sys::listen::{self, InheritedSocket, StdListener};
use crate::wake::NotifyWaker;

const STARTER: &str = include_str!("starter.toml");
/// The demo's port; `HOOKSPOOL_PORT` overrides it when the starter is first written.
pub const STARTER_PORT: u16 = 8650;
const DEMO_BODY: &str =
    r#"{"id":"demo-1","topic":"hello","type":"greeting","text":"my first webhook"}"#;

/// The home `run` uses when nothing names one, absolute (as `cli::run_with` makes a named
/// one), so that nothing derived from it depends on the working directory.
pub fn default_run_home() -> PathBuf {
    let home = match std::env::var_os("XDG_STATE_HOME").filter(|v| !v.is_empty()) {
        Some(x) => PathBuf::from(x).join("hookspool"),
        None => PathBuf::from("hookspool-home"),
    };
    // Without a working directory the relative path is all there is; the config load then
    // reports what depends on it.
    std::path::absolute(&home).unwrap_or(home)
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

/// How to run this binary again from a shell: `hookspool` when the PATH finds this very
/// binary, else its own path (issue 29: after `cargo run -- run` the banner said
/// `hookspool --home ...`, which is not on PATH).
fn self_command() -> String {
    use std::os::unix::fs::PermissionsExt;
    let Ok(exe) = std::env::current_exe() else {
        return "hookspool".into();
    };
    let first_on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("hookspool"))
            .find(|p| {
                std::fs::metadata(p)
                    .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            })
    });
    let same = |p: &Path| std::fs::canonicalize(p).ok() == std::fs::canonicalize(&exe).ok();
    if first_on_path.as_deref().is_some_and(same) {
        return "hookspool".into();
    }
    let shown = exe.display().to_string();
    if shown
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "/._-+".contains(c))
    {
        shown
    } else {
        format!("'{}'", shown.replace('\'', r"'\''"))
    }
}

/// Where the spool is, for the banner: the SQLite file, or the PostgreSQL database as
/// `user@host:port/db` (never the password), read from one short connection that touches
/// no schema; when that fails, the reference and why (the dispatcher half waits for it).
fn spool_line(cfg: &crate::config::Config) -> String {
    let url = match super::pg_url(cfg) {
        Ok(None) => return format!("The spool is the SQLite file {}.", cfg.db.display()),
        Ok(Some(url)) => url,
        Err(e) => return format!("The spool is in PostgreSQL, but {}.", e.message),
    };
    let named = match crate::store::pg::PgStore::connect(&url) {
        Ok(s) => format!("the PostgreSQL database {}", s.target()),
        Err(e) => format!("in PostgreSQL (spool.url; not reachable now: {e})"),
    };
    format!(
        "The spool is {named} (spool.url). The host whose dispatcher is active writes the outbox:\nthis one, unless a dispatcher elsewhere holds the spool's dispatcher lock."
    )
}

pub fn run(ctx: &Ctx) -> Result<(), Exit> {
    crate::store::pg::name_sessions("run");
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
                "hookspool is running{} with home {}\n{}\n\nSend a first signed webhook:\n\n  {curl}\n\nWithin a few seconds the batch document appears in {}/outbox/. Sent again it is answered\n\"duplicate\"; change \"id\" for a new event, and send several within 2 s to see them coalesce.\nInspect with: {} --home {} list   (and: show <id> --events --attempts)\n",
                if fresh {
                    " on a new starter config"
                } else {
                    ""
                },
                home.display(),
                spool_line(&cfg),
                home.display(),
                self_command(),
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
        let stop_tx = Arc::new(stop_tx);
        let on_signal = stop_tx.clone();
        let signal_reload = reload.clone();
        // The handlers are installed here, before either half announces READY=1.
        let terminated = service::signals(signal_reload);
        let signals = tokio::spawn(async move {
            terminated.await;
            let _ = on_signal.send(true);
        });
        // The intake never migrates and refuses an older schema: it starts once the
        // dispatcher half has opened (and migrated) the spool.
        let migrated = Arc::new(watch::channel(false).0);
        // The admin API: bound and announced now, served once the spool is migrated.
        super::run_admin::start(&cfg, clock.clone(), migrated.subscribe(), stop_rx.clone());
        let intake_half = {
            let (inputs, stop_rx, clock) = (inputs.clone(), stop_rx.clone(), clock.clone());
            let migrated_rx = migrated.subscribe();
            let waker = Arc::new(NotifyWaker(wake.clone()));
            let mut sockets = Sockets::new(inherited);
            move |up: oneshot::Sender<()>| {
                // Under `failpoints`, `run.intake_stops` (as an error) stops the first start
                // once it serves, as a failure of the intake half would.
                let fail = crate::failpoint::error_once("run.intake_stops");
                let (fail_tx, fail_rx) = oneshot::channel::<()>();
                let stop = stopped(stop_rx.clone());
                let mut iopts = IntakeOptions::new(
                    inputs.clone(),
                    waker.clone(),
                    Box::pin(async move {
                        tokio::select! {
                            _ = stop => {}
                            Ok(()) = fail_rx => {}
                        }
                    }),
                );
                iopts.inherited = sockets.next();
                // The dispatcher speaks to systemd for the pair (READY once it is up,
                // WATCHDOG per tick).
                iopts.notify = false;
                iopts.clock = clock.clone();
                let (tx, rx) = oneshot::channel();
                iopts.on_ready = Some(tx);
                tokio::spawn(async move {
                    if rx.await.is_ok() {
                        let _ = up.send(());
                        if fail {
                            let _ = fail_tx.send(());
                        }
                    }
                });
                let mut migrated_rx = migrated_rx.clone();
                let stopping = stopped(stop_rx.clone());
                Box::pin(async move {
                    tokio::select! {
                        // A sender gone (the dispatcher half ended) ends `run` anyway.
                        _ = migrated_rx.wait_for(|m| *m) => {}
                        _ = stopping => return Ok(()),
                    }
                    intake::serve(iopts).await?;
                    if fail {
                        return Err(IntakeError::Io {
                            context: "failpoint run.intake_stops",
                            error: std::io::Error::other("the intake half failed"),
                        });
                    }
                    Ok(())
                }) as HalfFuture<IntakeError>
            }
        };
        let dispatch_half = {
            let stop_rx = stop_rx.clone();
            move |up: oneshot::Sender<()>| {
                let dopts = DispatchOptions {
                    inputs: inputs.clone(),
                    clock: clock.clone(),
                    wake: wake.clone(),
                    reload: reload.clone(),
                    ready: Some(up),
                    migrated: Some(migrated.clone()),
                };
                Box::pin(dispatch::run(dopts, stopped(stop_rx.clone())))
                    as HalfFuture<DispatchError>
            }
        };
        let mut i_sup = tokio::spawn(supervise(
            Half::Intake,
            intake_half,
            intake_weather,
            stop_rx.clone(),
        ));
        let mut d_sup = tokio::spawn(supervise(
            Half::Dispatcher,
            dispatch_half,
            |_| false,
            stop_rx,
        ));
        // A supervisor ends only at shutdown, or when its half cannot start at all (a
        // config, lock or address problem no retry fixes): then the other half stops too.
        let (first, other) = tokio::select! {
            r = &mut i_sup => (r, d_sup),
            r = &mut d_sup => (r, i_sup),
        };
        let _ = stop_tx.send(true);
        let second = other.await;
        signals.abort();
        let joined = |r: Result<Result<(), Exit>, tokio::task::JoinError>| {
            r.unwrap_or_else(|e| Err(Exit::new(EXIT_NOT_FOUND, format!("run: {e}"))))
        };
        joined(first)?;
        joined(second)
    })
}

/// A half that failed is started again after this long, doubling up to
/// `HALF_RESTART_S_MAX`; the delay starts over once a start has stayed up
/// `HALF_STABLE_S`.
pub const HALF_RESTART_S_MIN: f64 = 1.0;
pub const HALF_RESTART_S_MAX: f64 = 30.0;
pub const HALF_STABLE_S: f64 = 60.0;

/// One start of a half: its future, told through the sender once it is up.
type HalfFuture<E> = std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), E>> + Send>>;

#[derive(Debug, Clone, Copy)]
enum Half {
    Intake,
    Dispatcher,
}

impl Half {
    fn name(self) -> &'static str {
        match self {
            Half::Intake => "intake",
            Half::Dispatcher => "dispatcher",
        }
    }
}

/// Resolves once `rx` says stop.
async fn stopped(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|v| *v).await;
}

/// An intake start refused by weather (a busy spool, or a full one whose `-shm` cannot be
/// created) is waited out like any later failure, not taken for a broken config. The
/// dispatcher waits out weather itself, so its start failures are never weather.
fn intake_weather(e: &IntakeError) -> bool {
    matches!(e, IntakeError::Store(s) if s.is_weather())
}

/// Run one half of `run` until shutdown: no failure of one half ends the other (issue 17).
///
/// A half that fails before it has ever come up, with an error no retry fixes (a config
/// error, `sandbox.required` on a weak kernel, a lock or an address held), ends `run` with
/// that error's exit code, as a failed start should: someone is watching the terminal.
/// Weather at its start (`weather`) is retried. Once a half has been up, any failure (an
/// error, a panic, or returning while no shutdown was asked for) is logged and the half
/// is started again after a backoff, while the other half keeps serving or delivering:
/// a dispatcher that stopped on a broken invariant restarts on intact data (a separate
/// `hookspool dispatch` would be restarted by systemd), and an intake that stopped is
/// what senders need back most; its listeners are bound again (or the inherited sockets
/// served again).
async fn supervise<E: std::fmt::Display + Into<Exit> + Send + 'static>(
    half: Half,
    mut start: impl FnMut(oneshot::Sender<()>) -> HalfFuture<E>,
    weather: fn(&E) -> bool,
    stop: watch::Receiver<bool>,
) -> Result<(), Exit> {
    let mut ever_up = false;
    let mut backoff = Backoff::new(HALF_RESTART_S_MIN, HALF_RESTART_S_MAX);
    loop {
        let (tx, mut rx) = oneshot::channel();
        let started = std::time::Instant::now();
        let mut task = tokio::spawn(start(tx));
        let mut up = false;
        let mut told = false;
        let ended = loop {
            tokio::select! {
                r = &mut rx, if !told => {
                    told = true;
                    up = r.is_ok();
                }
                r = &mut task => break r,
            }
        };
        up |= rx.try_recv().is_ok();
        let stopping = *stop.borrow();
        let mut waits_out = false;
        let why = match ended {
            Ok(Ok(())) if stopping => return Ok(()),
            Ok(Ok(())) => "it stopped by itself".to_string(),
            Ok(Err(e)) if stopping => {
                tracing::warn!(component = "run", reason = %e, "the {} half failed while stopping", half.name());
                return Ok(());
            }
            Ok(Err(e)) if !ever_up && !up && !weather(&e) => return Err(e.into()),
            Ok(Err(e)) => {
                waits_out = weather(&e);
                e.to_string()
            }
            Err(j) if j.is_panic() => "it panicked".to_string(),
            Err(j) => j.to_string(),
        };
        ever_up |= up;
        if started.elapsed() >= std::time::Duration::from_secs_f64(HALF_STABLE_S) {
            backoff.reset();
        }
        let other = match half {
            Half::Intake => "the dispatcher keeps delivering",
            Half::Dispatcher => "the intake keeps serving",
        };
        if waits_out {
            tracing::warn!(
                component = "run",
                reason = %why,
                "the {} half cannot start yet; {other}; trying again in {:.0} s",
                half.name(),
                backoff.delay_s()
            );
        } else {
            tracing::error!(
                component = "run",
                reason = %why,
                "the {} half stopped; {other}; starting it again in {:.0} s",
                half.name(),
                backoff.delay_s()
            );
        }
        let mut stop_wait = stop.clone();
        tokio::select! {
            _ = tokio::time::sleep(std::time::Duration::from_secs_f64(backoff.delay_s())) => {}
            _ = stop_wait.wait_for(|v| *v) => return Ok(()),
        }
        // Weather is retried as the dispatcher retries it, so a start waiting for space
        // comes up within seconds of space returning.
        let cap = if waits_out {
            crate::dispatch::engine::BUSY_RETRY_S_MAX
        } else {
            HALF_RESTART_S_MAX
        };
        backoff.set_cap_s(cap);
        backoff.grow();
    }
}

/// The intake's inherited sockets (LISTEN_FDS), kept so that a restarted intake half
/// serves the same ones: each start gets duplicates of them.
struct Sockets {
    kept: Vec<InheritedSocket>,
}

impl Sockets {
    fn new(kept: Vec<InheritedSocket>) -> Sockets {
        Sockets { kept }
    }

    /// Duplicates of the kept sockets; one that cannot be duplicated is left out (and
    /// logged), so the intake then binds `intake.listen` as without systemd.
    fn next(&mut self) -> Vec<InheritedSocket> {
        self.kept
            .iter()
            .filter_map(|s| {
                let dup = match &s.listener {
                    StdListener::Tcp(l) => l.try_clone().map(StdListener::Tcp),
                    StdListener::Unix(l) => l.try_clone().map(StdListener::Unix),
                };
                match dup {
                    Ok(listener) => Some(InheritedSocket {
                        name: s.name.clone(),
                        listener,
                    }),
                    Err(e) => {
                        tracing::error!(component = "run", reason = %e, "cannot reuse an inherited socket");
                        None
                    }
                }
            })
            .collect()
    }
}
