//! Listening sockets and connections: binding `intake.listen` when systemd passed nothing
//! (TCP loopback, or `unix:/path` created mode 0660 with a stale socket file replaced), the
//! accept loops, one hyper HTTP/1 connection per accepted stream, the connection cap, and
//! the drain protocol (mini-redis style: a shutdown signal every connection watches, and a
//! channel whose closing proves every connection has finished).
//!
//! Every connection is admitted under the cap (`conns`: at the cap the idlest connection is
//! closed for the new one) and must finish a request head within [`HEADER_READ_S_MAX`] of
//! being ready for one (accepted, or its previous answer sent), so keep-alive idling is
//! bounded too; hyper's buffers are allocated only once a first byte has arrived.
//!
//! Must not: interpret requests (that is `handler`'s), or bind a non-loopback address unless
//! the config says `intake.allow_remote = true` (checked again here, not only by `check`).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::{mpsc, watch};

use super::conns::{Admitted, Stream};
use super::handler::{self, Peer};
use super::{IntakeError, Shared};
use crate::sys::listen::StdListener;

/// Mode of a Unix socket the intake creates (the proxy's group may connect).
pub const UNIX_SOCKET_MODE: u32 = 0o660;
/// A client must finish a request head within this of the connection being ready for one
/// (accepted, or the previous answer sent), so it also bounds keep-alive idling. The reverse
/// proxy on loopback writes a whole head at once, so a real request needs microseconds;
/// 5 s leaves room for a stalled host while an idle or slowloris connection holds a slot for
/// at most that long. The proxy must drop idle upstream connections sooner (nginx:
/// `keepalive_timeout 4s;` in the upstream block), or it may send a request on a connection
/// the intake is closing.
pub const HEADER_READ_S_MAX: u64 = 5;
/// Each connection's head deadline is [`HEADER_READ_S_MAX`] less up to this much, spread
/// over connections in accept order: an idle flood opened at once then times out, and
/// reconnects, over a second instead of in one wave that queues normal requests behind
/// thousands of accepts (measured: max 188 ms in a wave of 5 000).
pub const HEADER_READ_SPREAD_MS: u64 = 1000;
/// The most one connection buffers at once; a request head (start line and headers) must
/// fit, or it is answered 431. Webhook heads are a few KiB (GitHub's about 2 KiB, a Pub/Sub
/// OIDC bearer token about 1 KiB); small enough that a full cap of slow heads holds at most
/// 128 MiB of them.
pub const CONNECTION_BUFFER_BYTES_MAX: usize = 16 * 1024;
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
                        Ok((Stream::tcp(s), Peer::Tcp(a)))
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
                            Ok((Stream::unix(s), Peer::Unix))
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

async fn accept_loop<F, Fut>(accept: F, shared: Arc<Shared>, drain: Drain)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = std::io::Result<(Stream, Peer)>>,
{
    let mut shutdown = drain.shutdown.clone();
    loop {
        let accepted = tokio::select! {
            _ = super::stopping(&mut shutdown) => return,
            a = accept() => a,
        };
        match accepted {
            Ok((stream, peer)) => {
                let admitted = tokio::select! {
                    _ = super::stopping(&mut shutdown) => return,
                    a = shared.conns.admit() => a,
                };
                let shared = shared.clone();
                let drain = drain.clone();
                tokio::spawn(connection(stream, peer, shared, drain, admitted));
            }
            Err(e) => {
                tracing::warn!(component = "intake", reason = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(ACCEPT_BACKOFF_MS)).await;
            }
        }
    }
}

async fn connection(
    mut stream: Stream,
    peer: Peer,
    shared: Arc<Shared>,
    drain: Drain,
    admitted: Admitted,
) {
    let _alive = drain.alive;
    let mut shutdown = drain.shutdown;
    let activity = admitted.activity().clone();
    stream.track(activity.clone());
    // Wait for the first byte before hyper allocates its buffers: an idle connection costs
    // a task and a socket until then. The head deadline counts from the accept.
    let accepted = Instant::now();
    let head_deadline = head_deadline();
    tokio::select! {
        r = tokio::time::timeout(head_deadline, stream.first_byte()) => {
            if r.is_err() {
                admitted.conns().head_timed_out();
                return;
            }
        }
        _ = activity.evicted() => return,
        _ = super::stopping(&mut shutdown) => return,
    }
    let first_head = head_deadline.saturating_sub(accepted.elapsed());
    // Boxed: the hyper connection is the bulk of this task's state, and an idle connection
    // should not carry it inline while it waits above.
    Box::pin(http(
        stream, peer, shared, activity, first_head, &admitted, shutdown,
    ))
    .await;
}

/// This connection's head deadline: [`HEADER_READ_S_MAX`] less a spread that differs from
/// one accept to the next (a multiplicative step through the spread, no randomness needed).
fn head_deadline() -> Duration {
    static ACCEPTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = ACCEPTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    // 7919 is prime, so consecutive accepts land far apart in 0..SPREAD.
    let less = n.wrapping_mul(7919) % HEADER_READ_SPREAD_MS;
    Duration::from_millis(HEADER_READ_S_MAX * 1000 - less)
}

/// Serve HTTP/1 on a connection whose first byte has arrived.
async fn http(
    stream: Stream,
    peer: Peer,
    shared: Arc<Shared>,
    activity: super::conns::Activity,
    first_head: Duration,
    admitted: &Admitted,
    mut shutdown: watch::Receiver<bool>,
) {
    let for_requests = activity.clone();
    let svc = service_fn(move |req| {
        handler::handle(shared.clone(), peer.clone(), for_requests.clone(), req)
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        // hyper restarts this timer whenever it waits for a head (the first, and after each
        // answer). It gets what is left of the accept's deadline, which for a proxy that
        // writes as soon as it connects is all of it, so no head ever gets longer.
        .header_read_timeout(first_head.max(Duration::from_millis(1)))
        .max_buf_size(CONNECTION_BUFFER_BYTES_MAX)
        .keep_alive(true)
        .serve_connection(TokioIo::new(stream), svc);
    tokio::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => {
            match r {
                Err(e) if e.is_timeout() => admitted.conns().head_timed_out(),
                Err(e) => tracing::debug!(component = "intake", reason = %e, "connection ended with an error"),
                Ok(()) => {}
            }
        }
        // The cap chose this connection (the idlest, with no request in progress):
        // dropping it closes the socket.
        _ = activity.evicted() => {}
        _ = super::stopping(&mut shutdown) => {
            // Finish the request in flight (if any), then close.
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}
