//! The intake: the HTTP service that takes webhooks from the reverse proxy, verifies and
//! classifies them, commits them to the spool and only then answers 2xx (spec 9, 10; issue 3).
//!
//! Owns: the hyper 1 server on TCP and Unix listeners (inherited from systemd or bound from
//! `intake.listen`: `listener`), the connection cap that closes the idlest connection for
//! a new one (`conns`), the request pipeline in spec 9's order (`handler`, with its
//! statuses and bodies in `answer`), the unverified body read into one buffer against a
//! process-wide budget (`body`), the panic guard around source code (`guard`), the secret
//! adapter (`secrets`), Plaid's key fetch (`plaid_fetch`), the single group-committing
//! writer thread (`writer`), free-space backpressure (`disk`), /healthz and /metrics
//! (`health`, `metrics`), returning memory after a flood (`memory`), what is served right
//! now and its reload (`snapshot`, `reload`), the watchdog (`watchdog`), and the
//! `hookspool intake` process around it all (`entry`).
//!
//! Must not: migrate the schema (an older database is `StoreError::SchemaTooOld`, exit 2),
//! speak SQL (the store does, on the writer thread), deliver anything, or log a body, a
//! secret, a header value or a query string.
//!
//! Invariants: no 2xx for a stored request before the COMMIT that holds it; the only 5xx is
//! 503 (the spool cannot take the write, or verification could not decide); a verified
//! request that source code fails on is quarantined (202), never 5xx'd; WATCHDOG=1 is sent
//! only after the writer thread answered a probe.

pub mod answer;
mod body;
mod conns;
pub mod disk;
pub mod entry;
mod guard;
mod handler;
mod health;
pub mod jwks_fetch;
mod listener;
mod memory;
pub mod metrics;
pub mod plaid_fetch;
mod reload;
pub mod snapshot;
mod watchdog;
pub mod writer;

#[cfg(test)]
mod tests;

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};

use crate::clock::SharedClock;
use crate::config::{ConfigError, PathInputs};
use crate::sources::SourceConfigError;
use crate::store::{Role, Store, StoreError};
use crate::sys::listen::{InheritedSocket, ListenError, StdListener};
use crate::sys::notify;
use crate::wake::Waker;

pub use entry::run_blocking;
pub use snapshot::Snapshot;

/// How long in-flight requests get to finish after shutdown begins.
pub const DRAIN_S_MAX: u64 = 10;
/// How long the writer gets to commit what is queued after the drain.
pub const WRITER_STOP_S_MAX: u64 = 10;

/// Why the intake could not start (or stopped). The CLI's `exit` module maps it to a code.
#[derive(Debug, thiserror::Error)]
pub enum IntakeError {
    #[error(transparent)]
    Config(ConfigError),
    #[error("sources.{source_name}: {error}")]
    Source {
        source_name: String,
        error: SourceConfigError,
    },
    #[error("{0}")]
    Store(StoreError),
    /// `in_use`: another process serves the address (exit 3, like a held lock).
    #[error("cannot listen on {addr}: {reason}")]
    Bind {
        addr: String,
        reason: String,
        in_use: bool,
    },
    #[error(transparent)]
    Listen(#[from] ListenError),
    #[error("{context}: {error}")]
    Io {
        context: &'static str,
        error: std::io::Error,
    },
}

/// Everything `serve` needs. Build it with [`IntakeOptions::new`] and adjust the fields.
pub struct IntakeOptions {
    /// Where the config and the spool are (flag -> env -> config -> default).
    pub inputs: PathInputs,
    /// Woken after every COMMIT that queued something: `DatagramWaker` for `hookspool
    /// intake`, `NotifyWaker` under `hookspool run`.
    pub waker: Arc<dyn Waker>,
    /// Resolves when the intake should stop (SIGTERM/SIGINT in `hookspool intake`).
    pub shutdown: Pin<Box<dyn Future<Output = ()> + Send>>,
    /// Sockets from `sys::listen::take_inherited()` (call it before the runtime starts);
    /// empty means bind `intake.listen`.
    pub inherited: Vec<InheritedSocket>,
    /// Send READY=1, RELOADING=1, STOPPING=1, STATUS= and WATCHDOG=1 to systemd. Under
    /// `hookspool run` the caller may prefer to send them itself for both halves.
    pub notify: bool,
    /// Reload sources and routes on SIGHUP (the config file's mtime is watched regardless).
    pub reload_on_sighup: bool,
    pub clock: SharedClock,
    /// Install the reqwest-based Plaid key fetcher process-wide (`sources::plaid::
    /// set_fetcher`); tests that share a process with other suites turn it off.
    pub install_plaid_fetcher: bool,
    /// Told the listening addresses once the intake serves (tests bind port 0).
    pub on_ready: Option<oneshot::Sender<Vec<String>>>,
}

impl IntakeOptions {
    pub fn new(
        inputs: PathInputs,
        waker: Arc<dyn Waker>,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Self {
        IntakeOptions {
            inputs,
            waker,
            shutdown: Box::pin(shutdown),
            inherited: Vec::new(),
            notify: true,
            reload_on_sighup: true,
            clock: crate::clock::system(),
            install_plaid_fetcher: true,
            on_ready: None,
        }
    }
}

/// What the connections, the reloader and the watchdog share.
pub(crate) struct Shared {
    snapshot: RwLock<Arc<Snapshot>>,
    writer: writer::WriterHandle,
    metrics: metrics::Metrics,
    disk: disk::DiskGuard,
    /// The bytes unverified bodies hold together (issue 17).
    bodies: body::Budget,
    /// Every connection of every listener, and the cap (issue 17).
    conns: Arc<conns::Connections>,
    clock: SharedClock,
    inputs: PathInputs,
    listeners: Vec<String>,
}

impl Shared {
    pub(crate) fn snapshot(&self) -> Arc<Snapshot> {
        // The lock only guards an Arc swap; a poisoned one still holds a whole snapshot.
        self.snapshot
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn replace_snapshot(&self, next: Snapshot) {
        *self.snapshot.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(next);
    }
}

/// Run the intake until `opts.shutdown` resolves, then drain and return `Ok(())`.
///
/// Loads the config and builds every source (a bad config or source is an error: exit 2),
/// opens the spool without migrating (an older schema is `StoreError::SchemaTooOld`: exit
/// 2), binds or adopts the listeners, starts the writer thread, and sends READY=1 with
/// STATUS=. While serving: SIGHUP (when `reload_on_sighup`) and a save of the config file
/// (`sys::watch`: inotify, the mtime every second as the fallback) reload sources and
/// routes, WATCHDOG=1 follows each writer probe.
/// On shutdown: STOPPING=1, listeners close, in-flight requests get `DRAIN_S_MAX`, the
/// writer commits what is queued, and the function returns. A failed sync of the spool's WAL
/// (`writer`: nothing is acknowledged after it) stops the intake the same way and returns
/// an error, so it is restarted on a fresh connection.
///
/// Call it on a multi-thread tokio runtime (Plaid's key fetch blocks a pool thread); under
/// `hookspool run` it shares the runtime with the dispatcher.
pub async fn serve(opts: IntakeOptions) -> Result<(), IntakeError> {
    let inputs = opts.inputs.clone();
    let first = tokio::task::spawn_blocking(move || Snapshot::load(&inputs))
        .await
        .map_err(|e| IntakeError::Io {
            context: "loading the config",
            error: std::io::Error::other(e.to_string()),
        })??;
    serve_snapshot(first, opts).await
}

/// Traces (issue 35), when `[telemetry] otlp_endpoint` is set: read at start only; a
/// failure to start them is logged and the intake serves without.
pub(crate) fn start_telemetry(t: &crate::config::Telemetry) {
    let Some(endpoint) = &t.otlp_endpoint else {
        return;
    };
    if let Err(e) = crate::telemetry::init(endpoint, t.queue_spans) {
        tracing::warn!(component = "intake", reason = %e, "traces are off");
    }
}

/// `serve` with the first snapshot already built (tests inject sources this way).
pub(crate) async fn serve_snapshot(
    first: Snapshot,
    opts: IntakeOptions,
) -> Result<(), IntakeError> {
    start_telemetry(&first.config.telemetry);
    if opts.install_plaid_fetcher {
        install_key_fetchers();
    }
    let config = &first.config;
    crate::store::ensure_home(&config.home).map_err(IntakeError::Store)?;
    let busy = Duration::from_secs_f64(config.intake.busy_timeout_s);
    let at = config.spool_at().map_err(IntakeError::Store)?;
    let store = tokio::task::spawn_blocking(move || Store::open_at(&at, Role::Reader, busy))
        .await
        .map_err(|e| IntakeError::Io {
            context: "opening the spool",
            error: std::io::Error::other(e.to_string()),
        })?
        .map_err(IntakeError::Store)?;
    // One descriptor per connection: the cap follows the (raised) limit.
    let nofile = conns::raise_nofile();
    let cap = conns::cap_for(nofile);
    if cap < conns::CONNECTIONS_MAX {
        tracing::warn!(
            component = "intake",
            reason = "descriptor limit",
            "the descriptor limit ({}) lowers the connection cap to {cap}; raise LimitNOFILE",
            nofile.unwrap_or(0)
        );
    }
    let listeners: Vec<StdListener> = if opts.inherited.is_empty() {
        listener::bind_all(&config.intake.listen, config.intake.allow_remote)?
    } else {
        opts.inherited.into_iter().map(|s| s.listener).collect()
    };
    let addrs: Vec<String> = listeners.iter().map(StdListener::describe).collect();
    let bounds = writer::GroupBounds {
        events_max: config.intake.group_events_max.max(1) as usize,
        wait: Duration::from_secs_f64(config.intake.group_wait_ms / 1000.0),
        pipelined: config.intake.pipelined_sync,
    };
    let db_dir = config
        .db
        .parent()
        .map(|p| p.to_path_buf())
        .unwrap_or_else(|| config.home.clone());
    // On PostgreSQL this host's free space is no limit on the spool (`disk`'s module doc).
    let on_this_host = !store.is_postgres();
    let guard = |dir: &std::path::Path| {
        if on_this_host {
            disk::DiskGuard::new(dir.to_path_buf())
        } else {
            disk::DiskGuard::off()
        }
    };
    // The writer's session plans on indexes (`Store::plan_on_indexes`: the foreign key
    // check of every stored event).
    store.plan_on_indexes();
    let unstored = Arc::new(metrics::Unstored::default());
    let (writer, writer_thread) = writer::spawn(
        store,
        config.dispatch.heartbeat_s,
        bounds,
        guard(&db_dir),
        opts.waker,
        opts.clock.clone(),
        unstored.clone(),
    )
    .map_err(|error| IntakeError::Io {
        context: "starting the writer thread",
        error,
    })?;
    let shared = Arc::new(Shared {
        snapshot: RwLock::new(Arc::new(first)),
        writer,
        metrics: metrics::Metrics::new(unstored),
        disk: guard(&db_dir),
        bodies: body::Budget::new(body::UNVERIFIED_BODIES_BYTES_MAX),
        conns: conns::Connections::new(cap),
        clock: opts.clock,
        inputs: opts.inputs,
        listeners: addrs.clone(),
    });

    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let (alive_tx, mut alive_rx) = mpsc::channel::<()>(1);
    let drain = listener::Drain {
        shutdown: shutdown_rx.clone(),
        alive: alive_tx,
    };
    for l in listeners {
        tokio::spawn(listener::serve(l, shared.clone(), drain.clone()));
    }
    drop(drain);

    // Installed before READY=1 (as the caller's shutdown signals are): a reload right after
    // the start meets the handler.
    let hup = reload::sighup(opts.reload_on_sighup);
    let status = shared.snapshot().status_line(&shared.listeners);
    tracing::info!(component = "intake", status = %status, "ready");
    if opts.notify {
        notify::ready(&status);
    }
    if let Some(tx) = opts.on_ready {
        // A caller that stopped listening for the addresses does not need them.
        let _ = tx.send(addrs);
    }
    let trimmer = tokio::spawn(memory::run(shared.conns.clone(), shutdown_rx.clone()));
    let watchdog = opts
        .notify
        .then(|| tokio::spawn(watchdog::run(shared.clone(), shutdown_rx.clone())));
    let reloader = tokio::spawn(reload::run(
        shared.clone(),
        opts.notify,
        hup,
        shutdown_rx.clone(),
    ));

    // The WAL's sync failed: the writer acknowledges nothing more; stop as on shutdown and
    // fail, so systemd (or `run`'s supervisor) starts a fresh intake on a fresh connection.
    let failed = tokio::select! {
        _ = opts.shutdown => None,
        why = shared.writer.failed() => Some(why),
    };

    tracing::info!(
        component = "intake",
        "stopping: no new connections, draining"
    );
    if opts.notify {
        notify::stopping();
    }
    // Every receiver is alive (we hold one), so the send cannot fail.
    let _ = shutdown_tx.send(true);
    let drained = tokio::time::timeout(Duration::from_secs(DRAIN_S_MAX), alive_rx.recv()).await;
    if drained.is_err() {
        tracing::warn!(
            component = "intake",
            reason = "drain bound reached",
            "some connections were still busy; closing them"
        );
    }
    for task in [Some(reloader), Some(trimmer), watchdog]
        .into_iter()
        .flatten()
    {
        task.abort();
    }
    shared.writer.stop();
    let joined = tokio::time::timeout(
        Duration::from_secs(WRITER_STOP_S_MAX),
        tokio::task::spawn_blocking(move || writer_thread.join()),
    )
    .await;
    if !matches!(joined, Ok(Ok(Ok(())))) {
        tracing::warn!(
            component = "intake",
            reason = "writer did not stop in time",
            "exiting anyway; requests it had not committed were never acknowledged"
        );
    }
    tracing::info!(component = "intake", "stopped");
    match failed {
        Some(why) => Err(IntakeError::Io {
            context: "the spool's WAL",
            error: std::io::Error::other(why),
        }),
        None => Ok(()),
    }
}

/// Resolves once shutdown has begun (the watch guard is dropped before returning, so the
/// future stays `Send`).
pub(crate) async fn stopping(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await.map(|_| ());
}

/// The process's key fetchers, Plaid's once, and the JWK Set one (the sources module owns
/// when they are called): for the intake, and for `source test`, which verifies a
/// capture with keys fetched as the intake fetches them.
pub fn install_key_fetchers() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| match plaid_fetch::ReqwestJwkFetcher::new() {
        Ok(f) => crate::sources::plaid::set_fetcher(Arc::new(f)),
        Err(e) => tracing::error!(
            component = "intake",
            reason = %e,
            "no Plaid key fetcher: Plaid requests will be answered 503"
        ),
    });
    // The JWK Set fetcher (Google's OIDC keys, a recipe's jwks_url): built per fetch, so
    // installing it cannot fail.
    crate::sources::jwks::set_fetcher(Arc::new(jwks_fetch::ReqwestJwksFetcher));
}
