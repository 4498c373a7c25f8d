//! The management service (issue 31): `hookspool admin` (and in-process in `hookspool
//! run`), a JSON API under `/api/v1` and the dashboard, apart from the intake so that a
//! heavy query never slows a sender. Reads (`api`): status (the /healthz document), batches
//! with filters and keyset pages, one batch with its events' metadata and attempts
//! (payloads only when asked), events by dedup id, issues, destinations, sources and
//! bobbins, polls, the backlog series, and the live stream of what happens
//! (`/api/v1/events/stream`, read from the spool). Actions (`act`): replay, retry, split,
//! exclude, drop, pause, resume, issues ack / resolve / ignore through `crate::ops` as the
//! CLI's are, and enqueue with an Idempotency-Key.
//!
//! Security: it listens on loopback only (a wider address is refused at start); every
//! request carries the token (`Authorization: Bearer <token>`, compared in constant time);
//! the Host header must name a loopback host (a DNS-rebinding page in a browser reaches
//! 127.0.0.1 under its own name, and is refused); no CORS header is ever sent, so another
//! origin's script cannot read an answer. An action also needs the CSRF header and is
//! audited (journal and spool) as `admin-token`. GET / is the dashboard's overview
//! (`page`): `/?token=` once sets a session cookie that authenticates reads only.
//!
//! On a Unix socket (`bind_unix`, created mode 0660) the file's mode and group are the
//! gate: a request needs no token, keeps the Host and CSRF rules, and its actions are
//! audited with the caller's uid from SO_PEERCRED (`uid:<n>`).
//!
//! Under socket activation (hookspool-admin.socket) `Activity` counts open connections so
//! `hookspool admin --idle-exit` can leave when nobody uses it.
//!
//! Must not: write the spool except through `crate::ops` or the store's enqueue on the
//! action connection (queries use their own), log a token, a payload, a body, a header value or a query string, or
//! serve a secret.

pub mod act;
pub mod api;
pub mod openapi;
pub mod page;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;

use crate::clock::SharedClock;
use crate::config::Config;
use crate::store::{Role, Store};

/// How long a query waits for a lock the writers hold.
pub const ADMIN_BUSY_TIMEOUT_S: u64 = 5;
/// The longest a client may take to send a request head.
pub const ADMIN_HEADER_READ_S: u64 = 10;

/// Why the service could not start.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error(
        "{0} is not a loopback address; the admin API listens on 127.0.0.1, [::1] or a Unix socket only (publish it behind a proxy with its own authentication)"
    )]
    NotLoopback(SocketAddr),
    #[error("cannot listen on {0}: {1}")]
    Listen(SocketAddr, std::io::Error),
    #[error("cannot listen on {}: {}", .0.display(), .1)]
    Socket(PathBuf, String),
    #[error("the spool: {0}")]
    Store(#[from] crate::store::StoreError),
}

/// What the handlers share: the config it started with, the reader connection for queries,
/// the action connection (its actor set to each action's caller), the token (empty on a
/// socket-only service: then no TCP request passes).
pub struct Admin {
    pub(crate) cfg: Config,
    pub(crate) store: Mutex<Store>,
    pub(crate) actions: Mutex<Store>,
    pub(crate) token: String,
    pub(crate) clock: SharedClock,
    pub(crate) activity: Activity,
}

/// Open connections and the last moment one ended or began: what `hookspool admin
/// --idle-exit` reads to leave when nobody has used it for a while (socket activation
/// starts it again on the next connection).
#[derive(Debug)]
pub struct Activity {
    open: std::sync::atomic::AtomicUsize,
    last: Mutex<std::time::Instant>,
}

impl Default for Activity {
    fn default() -> Activity {
        Activity {
            open: std::sync::atomic::AtomicUsize::new(0),
            last: Mutex::new(std::time::Instant::now()),
        }
    }
}

impl Activity {
    fn touch(&self) {
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = std::time::Instant::now();
    }

    /// How long nothing has been connected: None while a connection is open.
    pub fn idle_for(&self) -> Option<Duration> {
        if self.open.load(std::sync::atomic::Ordering::SeqCst) > 0 {
            return None;
        }
        Some(
            self.last
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .elapsed(),
        )
    }

    /// Count a connection until the guard drops.
    fn enter(&self) -> ActivityGuard<'_> {
        self.open.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.touch();
        ActivityGuard(self)
    }
}

struct ActivityGuard<'a>(&'a Activity);

impl Drop for ActivityGuard<'_> {
    fn drop(&mut self) {
        self.0.touch();
        self.0
            .open
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Resolve once nothing has been connected for `idle` (checked every second).
pub async fn idle(admin: Arc<Admin>, idle: Duration) {
    loop {
        tokio::time::sleep(Duration::from_secs(1).min(idle)).await;
        if admin.activity.idle_for().is_some_and(|d| d >= idle) {
            return;
        }
    }
}

impl Admin {
    /// Open the spool as a reader (an older schema is refused, as for the intake).
    pub fn open(cfg: Config, token: String, clock: SharedClock) -> Result<Admin, AdminError> {
        let store = cfg.open_spool(Role::Reader, Duration::from_secs(ADMIN_BUSY_TIMEOUT_S))?;
        let mut actions =
            cfg.open_spool(Role::Reader, Duration::from_secs(ADMIN_BUSY_TIMEOUT_S))?;
        actions.set_actor(act::TOKEN_ACTOR);
        Ok(Admin {
            cfg,
            store: Mutex::new(store),
            actions: Mutex::new(actions),
            token,
            clock,
            activity: Activity::default(),
        })
    }
}

/// The admin socket's mode: owner and group read and write, nobody else.
pub const SOCKET_MODE: u32 = 0o660;

/// Who sent a request: the token's holder on TCP, or the socket peer's uid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    Token,
    Uid(u32),
}

impl Caller {
    /// Who acts, in the audit rows and the journal.
    pub fn actor(self) -> String {
        match self {
            Caller::Token => act::TOKEN_ACTOR.to_string(),
            Caller::Uid(uid) => format!("uid:{uid}"),
        }
    }
}

/// Bind a Unix socket at `path`, mode `SOCKET_MODE`. A socket file left by a process that is
/// gone is replaced; one that still accepts is in use, and anything else at the path is
/// refused rather than removed.
pub fn bind_unix(path: &Path) -> Result<tokio::net::UnixListener, AdminError> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let fail = |m: String| AdminError::Socket(path.to_path_buf(), m);
    if let Ok(m) = std::fs::symlink_metadata(path) {
        if !m.file_type().is_socket() {
            return Err(fail(
                "the path exists and is not a socket; remove it or choose another path".into(),
            ));
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(fail("another process is serving it".into()));
        }
        std::fs::remove_file(path).map_err(|e| fail(e.to_string()))?;
    }
    let std = std::os::unix::net::UnixListener::bind(path).map_err(|e| fail(e.to_string()))?;
    // bind(2) creates the file as 0777 less the umask; until this chmod only the umask
    // guards it (connecting needs write permission, which the usual 022 denies others).
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(SOCKET_MODE))
        .map_err(|e| fail(e.to_string()))?;
    std.set_nonblocking(true).map_err(|e| fail(e.to_string()))?;
    tokio::net::UnixListener::from_std(std).map_err(|e| fail(e.to_string()))
}

/// Serve `listener` (a Unix socket) until `shutdown` resolves; each connection's caller is
/// its peer's uid (SO_PEERCRED), and a connection whose peer cannot be read is closed.
pub async fn serve_unix(
    admin: Arc<Admin>,
    listener: tokio::net::UnixListener,
    shutdown: impl std::future::Future<Output = ()>,
) {
    serve_on(admin, listener, shutdown).await
}

/// A listener the service accepts on, and who each connection's caller is: the token's
/// holder on TCP, the peer's uid on the Unix socket (`None`: unknown, close it).
trait Accept {
    type Stream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static;
    fn next(
        &self,
    ) -> impl std::future::Future<Output = std::io::Result<(Self::Stream, Option<Caller>)>>;
}

impl Accept for tokio::net::TcpListener {
    type Stream = tokio::net::TcpStream;
    async fn next(&self) -> std::io::Result<(Self::Stream, Option<Caller>)> {
        let (stream, _) = self.accept().await?;
        Ok((stream, Some(Caller::Token)))
    }
}

impl Accept for tokio::net::UnixListener {
    type Stream = tokio::net::UnixStream;
    async fn next(&self) -> std::io::Result<(Self::Stream, Option<Caller>)> {
        let (stream, _) = self.accept().await?;
        let caller = match stream.peer_cred() {
            Ok(c) => Some(Caller::Uid(c.uid())),
            Err(e) => {
                tracing::warn!(component = "admin", reason = %e, "cannot read the peer's credentials; connection closed");
                None
            }
        };
        Ok((stream, caller))
    }
}

/// The accept loop of either listener, until `shutdown` resolves.
async fn serve_on<L: Accept>(
    admin: Arc<Admin>,
    listener: L,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        let (stream, caller) = tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.next() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(component = "admin", reason = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        if let Some(caller) = caller {
            tokio::spawn(connection(admin.clone(), caller, stream));
        }
    }
}

/// One connection: HTTP/1.1 requests until the client closes it.
async fn connection<S>(admin: Arc<Admin>, caller: Caller, stream: S)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let counted = admin.clone();
    let _guard = counted.activity.enter();
    let svc = service_fn(move |req| {
        let admin = admin.clone();
        async move { Ok::<_, Infallible>(api::serve(admin, caller, req).await) }
    });
    let _ = http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(Duration::from_secs(ADMIN_HEADER_READ_S))
        .serve_connection(TokioIo::new(stream), svc)
        .await;
}

/// Bind `addr` (loopback only).
pub fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener, AdminError> {
    if !addr.ip().is_loopback() {
        return Err(AdminError::NotLoopback(addr));
    }
    let std = std::net::TcpListener::bind(addr).map_err(|e| AdminError::Listen(addr, e))?;
    std.set_nonblocking(true)
        .map_err(|e| AdminError::Listen(addr, e))?;
    tokio::net::TcpListener::from_std(std).map_err(|e| AdminError::Listen(addr, e))
}

/// Serve `listener` (loopback TCP, the token's holders) until `shutdown` resolves.
pub async fn serve(
    admin: Arc<Admin>,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()>,
) {
    serve_on(admin, listener, shutdown).await
}
