//! Listening sockets and connections: binding `intake.listen` when systemd passed nothing
//! (TCP loopback, or `unix:/path` created mode 0660 with a stale socket file replaced), the
//! accept loops, one hyper HTTP/1 connection per accepted stream, and the drain protocol
//! (mini-redis style: a shutdown signal every connection watches, and a channel whose
//! closing proves every connection has finished).
//!
//! Must not: interpret requests (that is `handler`'s), or bind a non-loopback address unless
//! the config says `intake.allow_remote = true` (checked again here, not only by `check`).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::{Semaphore, mpsc, watch};

use super::handler::{self, Peer};
use super::{IntakeError, Shared};
use crate::sys::listen::StdListener;

/// Mode of a Unix socket the intake creates (the proxy's group may connect).
pub const UNIX_SOCKET_MODE: u32 = 0o660;
/// Connections served at once; more wait in the kernel's backlog.
pub const CONNECTIONS_MAX: usize = 4096;
/// A client must finish sending request headers within this.
pub const HEADER_READ_S_MAX: u64 = 30;
/// After an accept error (EMFILE, ...) wait this long before accepting again.
pub const ACCEPT_BACKOFF_MS: u64 = 100;

/// Bind every `intake.listen` entry.
pub fn bind_all(listen: &[String], allow_remote: bool) -> Result<Vec<StdListener>, IntakeError> {
    let mut out = Vec::new();
    for l in listen {
        crate::config::check_listen(l, allow_remote).map_err(|reason| IntakeError::Bind {
            addr: l.clone(),
            reason,
            in_use: false,
        })?;
        let bound = match l.strip_prefix("unix:") {
            Some(path) => bind_unix(Path::new(path)).map(StdListener::Unix),
            None => std::net::TcpListener::bind(l.replace("localhost:", "127.0.0.1:"))
                .map(StdListener::Tcp),
        };
        out.push(bound.map_err(|e| IntakeError::Bind {
            addr: l.clone(),
            reason: e.to_string(),
            in_use: e.kind() == std::io::ErrorKind::AddrInUse,
        })?);
    }
    Ok(out)
}

/// Bind a Unix socket, replacing a stale socket file (one nobody accepts on) but never a
/// live one or a file that is not a socket.
fn bind_unix(path: &Path) -> std::io::Result<std::os::unix::net::UnixListener> {
    use std::os::unix::fs::FileTypeExt;
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "the path exists and is not a socket; remove it or choose another path",
            ));
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AddrInUse,
                "another process is serving on this socket",
            ));
        }
        std::fs::remove_file(path)?;
    }
    let l = std::os::unix::net::UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(UNIX_SOCKET_MODE))?;
    Ok(l)
}

/// What every accept loop and connection shares for the drain.
#[derive(Clone)]
pub struct Drain {
    pub shutdown: watch::Receiver<bool>,
    /// Held by every live connection; the receiver sees `None` when all are gone.
    pub alive: mpsc::Sender<()>,
    pub slots: Arc<Semaphore>,
}

/// Serve one listener until shutdown. A Unix socket file stays behind (systemd owns an
/// inherited one; a stale one we bound is replaced at the next start).
pub async fn serve(listener: StdListener, shared: Arc<Shared>, drain: Drain) {
    let result = match listener {
        StdListener::Tcp(l) => match l
            .set_nonblocking(true)
            .and_then(|_| tokio::net::TcpListener::from_std(l))
        {
            Ok(l) => {
                accept_loop(
                    || async {
                        let (s, a) = l.accept().await?;
                        // Small JSON answers must not wait for Nagle.
                        let _ = s.set_nodelay(true);
                        Ok((Box::new(s) as Box<dyn Stream>, Peer::Tcp(a)))
                    },
                    shared,
                    drain,
                )
                .await;
                Ok(())
            }
            Err(e) => Err(e),
        },
        StdListener::Unix(l) => {
            match l
                .set_nonblocking(true)
                .and_then(|_| tokio::net::UnixListener::from_std(l))
            {
                Ok(l) => {
                    accept_loop(
                        || async {
                            let (s, _) = l.accept().await?;
                            Ok((Box::new(s) as Box<dyn Stream>, Peer::Unix))
                        },
                        shared,
                        drain,
                    )
                    .await;
                    Ok(())
                }
                Err(e) => Err(e),
            }
        }
    };
    if let Err(e) = result {
        tracing::error!(component = "intake", reason = %e, "listener could not be served");
    }
}

trait Stream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin> Stream for T {}

async fn accept_loop<F, Fut>(accept: F, shared: Arc<Shared>, drain: Drain)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = std::io::Result<(Box<dyn Stream>, Peer)>>,
{
    let mut shutdown = drain.shutdown.clone();
    loop {
        let slot = tokio::select! {
            _ = super::stopping(&mut shutdown) => return,
            s = drain.slots.clone().acquire_owned() => match s {
                Ok(s) => s,
                Err(_) => return,
            },
        };
        let accepted = tokio::select! {
            _ = super::stopping(&mut shutdown) => return,
            a = accept() => a,
        };
        match accepted {
            Ok((stream, peer)) => {
                let shared = shared.clone();
                let drain = drain.clone();
                tokio::spawn(async move {
                    connection(stream, peer, shared, drain).await;
                    drop(slot);
                });
            }
            Err(e) => {
                tracing::warn!(component = "intake", reason = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(ACCEPT_BACKOFF_MS)).await;
            }
        }
    }
}

async fn connection(stream: Box<dyn Stream>, peer: Peer, shared: Arc<Shared>, drain: Drain) {
    let _alive = drain.alive;
    let mut shutdown = drain.shutdown;
    let svc = service_fn(move |req| handler::handle(shared.clone(), peer.clone(), req));
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(HEADER_READ_S_MAX))
        .keep_alive(true)
        .serve_connection(TokioIo::new(stream), svc);
    tokio::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => {
            if let Err(e) = r {
                tracing::debug!(component = "intake", reason = %e, "connection ended with an error");
            }
        }
        _ = super::stopping(&mut shutdown) => {
            // Finish the request in flight (if any), then close.
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}
