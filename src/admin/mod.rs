//! The management service (issue 31, first slice): `hookspool admin`, a JSON API under
//! `/api/v1` on a loopback TCP address, apart from the intake so that a heavy query never
//! slows a sender. Read-only for now: status (the /healthz document), batches with filters
//! and keyset pages, one batch with its events' metadata and attempts (payloads only when
//! asked), and issues; and the actions (`act`: replay, retry, split, exclude, drop, pause,
//! resume, issues ack / resolve / ignore), through `crate::ops` as the CLI's are.
//!
//! Security: it listens on loopback only (a wider address is refused at start); every
//! request carries the token (`Authorization: Bearer <token>`, compared in constant time);
//! the Host header must name a loopback host (a DNS-rebinding page in a browser reaches
//! 127.0.0.1 under its own name, and is refused); no CORS header is ever sent, so another
//! origin's script cannot read an answer. An action also needs the CSRF header and is
//! audited (journal and spool) as `admin-token`.
//!
//! Must not: write the spool except through `crate::ops` on the action connection (queries
//! use their own), log a token, a payload, a body, a header value or a query string, or
//! serve a secret.

pub mod act;
pub mod api;

use std::convert::Infallible;
use std::net::SocketAddr;
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
    #[error("the spool: {0}")]
    Store(#[from] crate::store::StoreError),
}

/// What the handlers share: the config it started with, the reader connection for queries,
/// the action connection (its actor is `act::TOKEN_ACTOR`), the token.
pub struct Admin {
    pub(crate) cfg: Config,
    pub(crate) store: Mutex<Store>,
    pub(crate) actions: Mutex<Store>,
    pub(crate) token: String,
    pub(crate) clock: SharedClock,
}

impl Admin {
    /// Open the spool as a reader (an older schema is refused, as for the intake).
    pub fn open(cfg: Config, token: String, clock: SharedClock) -> Result<Admin, AdminError> {
        let store = Store::open(
            &cfg.db,
            Role::Reader,
            Duration::from_secs(ADMIN_BUSY_TIMEOUT_S),
        )?;
        let mut actions = Store::open(
            &cfg.db,
            Role::Reader,
            Duration::from_secs(ADMIN_BUSY_TIMEOUT_S),
        )?;
        actions.set_actor(act::TOKEN_ACTOR);
        Ok(Admin {
            cfg,
            store: Mutex::new(store),
            actions: Mutex::new(actions),
            token,
            clock,
        })
    }
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

/// Serve `listener` until `shutdown` resolves.
pub async fn serve(
    admin: Arc<Admin>,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        let (stream, _) = tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(component = "admin", reason = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let admin = admin.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| {
                let admin = admin.clone();
                async move { Ok::<_, Infallible>(api::handle(admin, req).await) }
            });
            let _ = http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(Duration::from_secs(ADMIN_HEADER_READ_S))
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}
