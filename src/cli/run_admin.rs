//! The admin API inside `hookspool run` (issue 31): bound on `[admin] listen` (and on
//! `[admin] socket`, a Unix socket, when set) before the halves start (a taken port falls back to a free one on the same address), served once
//! the dispatcher half has migrated the spool, with `[admin] token` or a token generated at
//! start, and announced in the banner with a ready-to-paste curl, the way notebook servers
//! print their URL, and the dashboard's sign-in address.
//!
//! Must not: stop `run` (a token it cannot read, an address it cannot bind or a spool it
//! cannot open leaves the admin API off with a warning), or put the token in a log line:
//! the banner is printed only when stderr is plain text for a person; when it is the
//! journal (JOURNAL_STREAM) or JSON lines (HOOKSPOOL_LOG=json) there is no banner, and
//! without `[admin] token` the API stays off (a token nobody can read opens nothing).

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::watch;

use crate::admin::{self, Admin, AdminError};
use crate::clock::SharedClock;
use crate::config::{Config, SecretRef};

/// A configured token shorter than this is refused (as `hookspool admin --token-file`).
pub const ADMIN_TOKEN_CHARS_MIN: usize = 16;
/// The generated token's random bytes (hex-encoded in it).
pub const ADMIN_TOKEN_BYTES: usize = 24;

/// The token and what the banner's curl line writes for it.
struct Token {
    value: String,
    shown: String,
    /// A generated token: the banner also prints the dashboard's sign-in address with it.
    generated: bool,
}

/// Whether stderr is text for a person: not the journal, not JSON lines.
fn plain_stderr() -> bool {
    std::env::var_os("JOURNAL_STREAM").is_none_or(|v| v.is_empty())
        && !std::env::var(crate::observe::logging::LOG_FORMAT_ENV)
            .is_ok_and(|v| v.eq_ignore_ascii_case("json"))
}

/// The token: `[admin] token` resolved now, or a new random one when the banner can show
/// it. Why not, as a warning.
fn token(cfg: &Config, plain: bool) -> Result<Token, String> {
    let Some(r) = &cfg.admin.token else {
        if !plain {
            return Err("the admin API is off: its generated token is shown on a terminal only, and stderr is the journal or JSON lines; set [admin] token (e.g. token = { file = \"/etc/hookspool/admin.token\" }) or admin.listen = \"\"".into());
        }
        let raw: [u8; ADMIN_TOKEN_BYTES] = rand::random();
        let value = hex::encode(raw);
        return Ok(Token {
            shown: value.clone(),
            value,
            generated: true,
        });
    };
    let bytes = r
        .resolve()
        .map_err(|e| format!("admin.token: {e}; the admin API is off"))?;
    let value = String::from_utf8(bytes)
        .map_err(|_| "admin.token: not UTF-8 text; the admin API is off".to_string())?
        .trim()
        .to_string();
    if value.chars().count() < ADMIN_TOKEN_CHARS_MIN {
        return Err(format!(
            "admin.token: shorter than {ADMIN_TOKEN_CHARS_MIN} characters; write a long random one (hookspool secret new FILE); the admin API is off"
        ));
    }
    let shown = match r {
        SecretRef::File { file } => format!("$(cat {})", file.display()),
        SecretRef::Env { env } => format!("${env}"),
        SecretRef::EnvFile { .. } => "<admin.token>".to_string(),
    };
    Ok(Token {
        value,
        shown,
        generated: false,
    })
}

/// Bind `addr`; a taken port is replaced by a free one on the same address.
fn bind(addr: SocketAddr) -> Result<(tokio::net::TcpListener, SocketAddr), AdminError> {
    let listener = match admin::bind(addr) {
        Err(AdminError::Listen(_, e))
            if e.kind() == std::io::ErrorKind::AddrInUse && addr.port() != 0 =>
        {
            tracing::warn!(
                component = "admin",
                "admin.listen {addr} is taken; the admin API serves on a free port instead"
            );
            admin::bind(SocketAddr::new(addr.ip(), 0))?
        }
        other => other?,
    };
    let local = listener
        .local_addr()
        .map_err(|e| AdminError::Listen(addr, e))?;
    Ok((listener, local))
}

/// Start the admin API for `run` on the current runtime: bind now, print the banner, and
/// serve from once `migrated` says the spool is current until `stop`. Nothing here ends
/// `run`: each failure is a warning and the API stays off.
pub fn start(
    cfg: &Config,
    clock: SharedClock,
    migrated: watch::Receiver<bool>,
    stop: watch::Receiver<bool>,
) {
    let plain = plain_stderr();
    let tcp = cfg.admin.listen.and_then(|addr| {
        let token = match token(cfg, plain) {
            Ok(t) => t,
            Err(why) => {
                tracing::warn!(component = "admin", "{why}");
                return None;
            }
        };
        match bind(addr) {
            Ok((listener, local)) => Some((listener, local, token)),
            Err(e) => {
                tracing::warn!(component = "admin", reason = %e, "the admin API is off on TCP");
                None
            }
        }
    });
    let unix = cfg
        .admin
        .socket
        .as_deref()
        .and_then(|path| match admin::bind_unix(path) {
            Ok(l) => Some((l, path.to_path_buf())),
            Err(e) => {
                tracing::warn!(component = "admin", reason = %e, "the admin socket is off");
                None
            }
        });
    if tcp.is_none() && unix.is_none() {
        return;
    }
    if let Some((_, local, token)) = &tcp {
        if plain {
            let dashboard = if token.generated {
                format!("http://{local}/?token={}", token.value)
            } else {
                format!("http://{local}/?token=<the token>")
            };
            eprintln!(
                "The admin API (JSON under /api/v1; actions also need the header X-Hookspool-CSRF: 1):\n\n  curl -H 'Authorization: Bearer {}' http://{local}/api/v1/status\n\nThe dashboard: open {dashboard}\n",
                token.shown
            );
        }
        tracing::info!(
            component = "admin",
            status = "serving",
            "admin API on http://{local}/api/v1"
        );
    }
    if let Some((_, path)) = &unix {
        tracing::info!(
            component = "admin",
            status = "serving",
            "admin API on unix:{} (mode 0660: its group may act, as its uid; no token)",
            path.display()
        );
    }
    let cfg = cfg.clone();
    tokio::spawn(async move {
        let mut migrated = migrated;
        let mut waiting = stop.clone();
        tokio::select! {
            // A sender gone (the dispatcher half ended) ends `run` anyway.
            r = migrated.wait_for(|m| *m) => if r.is_err() { return },
            _ = waiting.wait_for(|v| *v) => return,
        }
        // Without TCP the token is empty, which no TCP request could match anyway.
        let value = tcp
            .as_ref()
            .map(|(_, _, t)| t.value.clone())
            .unwrap_or_default();
        let state = match Admin::open(cfg, value, clock) {
            Ok(s) => Arc::new(s),
            Err(e) => {
                tracing::warn!(component = "admin", reason = %e, "the admin API is off");
                return;
            }
        };
        let stopped = move || {
            let mut stop = stop.clone();
            async move {
                let _ = stop.wait_for(|v| *v).await;
            }
        };
        let tcp_task = tcp
            .map(|(listener, _, _)| tokio::spawn(admin::serve(state.clone(), listener, stopped())));
        if let Some((listener, path)) = unix {
            admin::serve_unix(state, listener, stopped()).await;
            let _ = std::fs::remove_file(&path);
        }
        if let Some(t) = tcp_task {
            let _ = t.await;
        }
    });
}
