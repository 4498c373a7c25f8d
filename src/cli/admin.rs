//! `hookspool admin`: the management API (issue 31: `/api/v1` reads, and actions with the
//! CSRF header) on a loopback address with the token from a file (mode 0600; `hookspool
//! secret new` makes one; audited as `admin-token`), and/or on a Unix socket (`--socket`,
//! mode 0660: no token; audited as the caller's `uid:<n>`), and/or on the sockets systemd
//! passed (hookspool-admin.socket: /run/hookspool/admin.sock, group hookspool-admin). Sends
//! READY=1 once serving; runs until SIGTERM/SIGINT, or with `--idle-exit` until no
//! connection has been open for that long.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use tokio::sync::{Notify, watch};

use super::{Ctx, EXIT_CONFIG, Exit};
use crate::admin::{self, Admin};
use crate::sys::listen::StdListener;

/// The admin API's default address (the intake's is 8650).
pub const ADMIN_LISTEN_DEFAULT: &str = crate::config::ADMIN_LISTEN_DEFAULT;

#[derive(Debug, Args)]
pub struct AdminArgs {
    /// A loopback address to listen on (127.0.0.1:<port> or [::1]:<port>; 0 picks a port,
    /// printed at start; default 127.0.0.1:8651). Needs --token-file.
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// The file holding the token every TCP request must send as `Authorization: Bearer
    /// <token>` (mode 0600).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Also (or only) listen on a Unix socket at PATH, created mode 0660: a request on it
    /// needs no token, and its actions are audited with the caller's uid (default: the
    /// config's `[admin] socket`).
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Exit after this long with no connection open (e.g. 10min): under socket activation
    /// (hookspool-admin.socket) systemd starts it again on the next request.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub idle_exit: Option<std::time::Duration>,
}

pub fn run(ctx: &Ctx, mut a: AdminArgs) -> Result<(), Exit> {
    crate::store::pg::name_sessions("admin");
    if a.listen.is_some() && a.token_file.is_none() {
        return Err(Exit::usage(
            "--listen needs --token-file FILE: every TCP request carries the token",
        ));
    }
    // Before any thread exists: the sockets systemd passed (hookspool-admin.socket).
    let inherited =
        crate::sys::listen::take_inherited().map_err(|e| Exit::new(EXIT_CONFIG, e.to_string()))?;
    let c = ctx.config()?;
    if a.socket.is_none() && inherited.is_empty() {
        a.socket = c.admin.socket.clone();
    }
    let inherited_tcp = inherited
        .iter()
        .any(|s| matches!(s.listener, StdListener::Tcp(_)));
    if inherited_tcp && a.token_file.is_none() {
        return Err(Exit::usage(
            "systemd passed a TCP socket: it needs --token-file FILE (every TCP request carries the token)",
        ));
    }
    if a.token_file.is_none() && a.socket.is_none() && inherited.is_empty() {
        return Err(Exit::usage(
            "admin needs --token-file FILE (TCP on --listen, default 127.0.0.1:8651) or --socket PATH (a Unix socket; or [admin] socket), or both",
        ));
    }
    let token = a.token_file.as_deref().map(read_token).transpose()?;
    // Read-only, and never the one to create a spool.
    let probe = ctx.store(&c)?;
    drop(probe);
    let rt = super::service::runtime(Some(1))?;
    rt.block_on(async {
        let config_err = |e: admin::AdminError| Exit::new(EXIT_CONFIG, e.to_string());
        let tcp = match &a.token_file {
            Some(_) if inherited_tcp => None,
            Some(file) => {
                let listener =
                    admin::bind(a.listen.unwrap_or_else(default_listen)).map_err(config_err)?;
                let local = listener
                    .local_addr()
                    .map_err(|e| Exit::new(EXIT_CONFIG, e.to_string()))?;
                Some((listener, local, file.clone()))
            }
            None => None,
        };
        let unix = match &a.socket {
            Some(path) => Some((admin::bind_unix(path).map_err(config_err)?, path.clone())),
            None => None,
        };
        let state = Arc::new(
            Admin::open(c, token.unwrap_or_default(), crate::clock::system())
                .map_err(config_err)?,
        );
        let (stop_tx, stop_rx) = watch::channel(false);
        let stopped = move || {
            let mut rx = stop_rx.clone();
            async move {
                let _ = rx.wait_for(|v| *v).await;
            }
        };
        let mut tasks = Vec::new();
        if let Some((listener, local, file)) = tcp {
            tracing::info!(
                component = "admin",
                status = "serving",
                "admin API on http://{local}/api/v1 (token from {})",
                file.display()
            );
            tasks.push(tokio::spawn(admin::serve(
                state.clone(),
                listener,
                stopped(),
            )));
        }
        if let Some((listener, path)) = unix {
            tracing::info!(
                component = "admin",
                status = "serving",
                "admin API on unix:{} (mode 0660: its group may act, as its uid; no token)",
                path.display()
            );
            tasks.push(tokio::spawn(admin::serve_unix(
                state.clone(),
                listener,
                stopped(),
            )));
        }
        for s in inherited {
            let what = s.listener.describe();
            match s.listener {
                StdListener::Tcp(l) => {
                    let local = l
                        .local_addr()
                        .map_err(|e| Exit::new(EXIT_CONFIG, e.to_string()))?;
                    if !local.ip().is_loopback() {
                        return Err(config_err(admin::AdminError::NotLoopback(local)));
                    }
                    let l = l
                        .set_nonblocking(true)
                        .and_then(|()| tokio::net::TcpListener::from_std(l))
                        .map_err(|e| Exit::new(EXIT_CONFIG, format!("{what}: {e}")))?;
                    tracing::info!(component = "admin", status = "serving", "admin API on http://{what}/api/v1 (from systemd; token needed)");
                    tasks.push(tokio::spawn(admin::serve(state.clone(), l, stopped())));
                }
                StdListener::Unix(l) => {
                    let l = l
                        .set_nonblocking(true)
                        .and_then(|()| tokio::net::UnixListener::from_std(l))
                        .map_err(|e| Exit::new(EXIT_CONFIG, format!("{what}: {e}")))?;
                    tracing::info!(component = "admin", status = "serving", "admin API on {what} (from systemd: the socket's group may act, as its uid)");
                    tasks.push(tokio::spawn(admin::serve_unix(
                        state.clone(),
                        l,
                        stopped(),
                    )));
                }
            }
        }
        // The handlers before READY=1: a stop right after it meets them.
        let terminated = super::service::signals(Arc::new(Notify::new()));
        crate::sys::notify::ready("serving the admin API");
        let idle = a.idle_exit;
        let quiet = state.clone();
        tokio::select! {
            _ = terminated => {}
            _ = async move {
                match idle {
                    Some(d) => admin::idle(quiet, d).await,
                    None => std::future::pending().await,
                }
            } => {
                tracing::info!(component = "admin", status = "idle", "no connection for {}; exiting (the socket starts it again)", humantime::format_duration(idle.unwrap_or_default()));
            }
        }
        crate::sys::notify::stopping();
        let _ = stop_tx.send(true);
        for t in tasks {
            let _ = t.await;
        }
        if let Some(path) = &a.socket {
            let _ = std::fs::remove_file(path);
        }
        Ok(())
    })
}

fn default_listen() -> SocketAddr {
    // A constant that parses (the config's tests validate the same text).
    ADMIN_LISTEN_DEFAULT
        .parse()
        .unwrap_or(SocketAddr::from(([127, 0, 0, 1], 8651)))
}

/// The token: the file's text without surrounding white space; never logged.
fn read_token(path: &std::path::Path) -> Result<String, Exit> {
    use std::os::unix::fs::PermissionsExt;
    let text = std::fs::read_to_string(path).map_err(|e| {
        Exit::new(
            EXIT_CONFIG,
            format!(
                "{}: cannot read the admin token ({e}); write one (e.g. hookspool secret new {}) and pass --token-file",
                path.display(),
                path.display()
            ),
        )
    })?;
    if let Ok(m) = std::fs::metadata(path)
        && m.permissions().mode() & 0o077 != 0
    {
        eprintln!(
            "warning: {} has mode {:04o}: group or others can read the admin token; run chmod 600 {}",
            path.display(),
            m.permissions().mode() & 0o777,
            path.display()
        );
    }
    let token = text.trim().to_string();
    if token.len() < 16 {
        return Err(Exit::new(
            EXIT_CONFIG,
            format!(
                "{}: the admin token is shorter than 16 characters; write a long random one (hookspool secret new {})",
                path.display(),
                path.display()
            ),
        ));
    }
    Ok(token)
}
