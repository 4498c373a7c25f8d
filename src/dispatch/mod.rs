//! The dispatcher (spec 2, 4, 5, 6): the only process that delivers. It holds an exclusive
//! flock on `<home>/dispatch.lock` (a second dispatcher exits 3), applies migrations and runs
//! quick_check at startup, recovers leases, then ticks every poll_s or when the intake
//! nudges it. `engine` holds the loop's state; `breaker`, `retry` and `rate` (the request
//! rate per destination) are pure arithmetic; `registry` builds destinations from config;
//! `document` renders what is delivered; `emits` validates script emits. The dispatcher
//! never answers senders and never touches the intake's sockets.

pub mod breaker;
pub mod document;
pub mod emits;
pub mod engine;
pub mod polls;
pub mod rate;
pub mod registry;
pub mod retry;
pub mod standby;
pub mod verdict;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use crate::clock::SharedClock;
use crate::config::{self, PathInputs};
use crate::store::{self, Role, StoreError};
use crate::sys::notify;
use crate::sys::watch::{ConfigWatch, FALLBACK_POLL_S};

pub use engine::{Engine, LEASE_CHECK_EVERY_S};

/// How long SIGTERM waits for in-flight attempts before exiting (their leases are recovered
/// at the next start).
pub const DRAIN_S_MAX: f64 = 10.0;
/// A reload whose result could not be recorded (a busy spool) is tried again after this.
pub const CONFIG_CHECK_EVERY_S: f64 = 1.0;

#[derive(Debug, thiserror::Error)]
pub enum DispatchError {
    #[error("{0} is held by another dispatcher (or a migrate); only one may run")]
    Locked(String),
    #[error("{0}")]
    Config(#[from] config::ConfigError),
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error(
        "script destination(s) {destinations} set sandbox.required = true, but this kernel enforces only: {enforced}; run on a kernel with landlock and seccomp, or set sandbox.required = false for them"
    )]
    SandboxRequired {
        destinations: String,
        enforced: String,
    },
    #[error("{context}: {source}")]
    Io {
        context: String,
        source: std::io::Error,
    },
}

/// Everything `run` needs. `wake` is shared with an in-process intake under `hookspool run`.
pub struct DispatchOptions {
    pub inputs: PathInputs,
    pub clock: SharedClock,
    pub wake: Arc<Notify>,
    /// Config reload requests (SIGHUP) arrive here as notifications.
    pub reload: Arc<Notify>,
    /// Told once the dispatcher is ready (after the lock, migrations, checks and lease
    /// recovery): `hookspool run` tells a start failure from a later one by it.
    pub ready: Option<tokio::sync::oneshot::Sender<()>>,
    /// Set once the spool is open and migrated: `hookspool run` starts its intake (which
    /// never migrates, and refuses an older schema) only then.
    pub migrated: Option<Arc<tokio::sync::watch::Sender<bool>>>,
}

/// Take `<home>/dispatch.lock` without waiting. The lock lives as long as the file.
pub fn lock(home: &std::path::Path) -> Result<std::fs::File, DispatchError> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = home.join("dispatch.lock");
    let f = std::fs::OpenOptions::new()
        .mode(0o600)
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| DispatchError::Io {
            context: format!("opening {}", path.display()),
            source: e,
        })?;
    match f.try_lock() {
        Ok(()) => Ok(f),
        Err(std::fs::TryLockError::WouldBlock) => {
            Err(DispatchError::Locked(path.display().to_string()))
        }
        Err(std::fs::TryLockError::Error(e)) => Err(DispatchError::Io {
            context: format!("locking {}", path.display()),
            source: e,
        }),
    }
}

/// The dispatcher's busy timeout: spec 2's 30 s. Under the `failpoints` feature,
/// `HOOKSPOOL_TEST_BUSY_TIMEOUT_MS` shortens it, so a test can hold the write lock past it
/// through the real binary without waiting half a minute.
fn busy_timeout() -> Duration {
    #[cfg(feature = "failpoints")]
    if let Some(ms) = std::env::var("HOOKSPOOL_TEST_BUSY_TIMEOUT_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        return Duration::from_millis(ms);
    }
    Duration::from_secs(store::DEFAULT_BUSY_TIMEOUT_S)
}

/// What the startup steps share while they wait out weather: the shutdown to watch, and
/// when a step was first refused for lack of space (the engine then records `spool:full`
/// with its first write).
struct StartWait<'a> {
    shutdown: &'a mut (dyn Future<Output = ()> + Unpin + Send),
    clock: SharedClock,
    full_since: Option<f64>,
}

/// How much more start time each retry of a startup step asks systemd for
/// (EXTEND_TIMEOUT_USEC): a start waiting for space is weather, not a failed start.
pub const START_EXTEND_S: f64 = 30.0;

/// Retry `f` while the spool is busy or full (`is_weather`; the busy timeout has already
/// waited each time), with a backoff, logging the first retry and then one in
/// `WEATHER_LOG_EVERY_S`; any other error is returned. `Ok(None)` when `shutdown` came
/// first. Startup steps use it (opening and migrating the spool, the checks, lease
/// recovery, the first issue writes): a dispatcher that gave up would deliver nothing, and
/// one started on a full disk must wait for space, not exit.
async fn until_weather_clears<T>(
    what: &str,
    start: &mut StartWait<'_>,
    mut f: impl FnMut() -> Result<T, StoreError>,
) -> Result<Option<T>, StoreError> {
    let mut backoff = retry::Backoff::new(engine::BUSY_RETRY_S_MIN, engine::BUSY_RETRY_S_MAX);
    let mut logged: Option<std::time::Instant> = None;
    loop {
        match tokio::task::block_in_place(&mut f) {
            Err(e) if e.is_weather() => {
                if e.is_full() && start.full_since.is_none() {
                    start.full_since = Some(start.clock.now());
                }
                let every = Duration::from_secs_f64(engine::WEATHER_LOG_EVERY_S);
                if logged.is_none_or(|at| at.elapsed() >= every) {
                    logged = Some(std::time::Instant::now());
                    tracing::warn!(component = "dispatch", reason = %e, "{what} deferred; retrying until the spool takes it");
                    notify::status(&format!("waiting: {what} deferred ({e})"));
                }
                notify::extend_timeout(Duration::from_secs_f64(START_EXTEND_S));
                // A standby (already ready) waiting for an unreachable PostgreSQL is alive:
                // as in the run loop (`Engine::progress_possible`), the answer feeds the
                // watchdog.
                if matches!(e, StoreError::PgUnreachable { .. }) {
                    notify::watchdog();
                }
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs_f64(backoff.delay_s())) => {}
                    _ = &mut *start.shutdown => return Ok(None),
                }
                backoff.grow();
            }
            Err(e) => return Err(e),
            Ok(v) => return Ok(Some(v)),
        }
    }
}

/// Sets its flag when dropped: the wake listener's thread ends within its tick when the
/// dispatcher returns, however it returns.
struct StopOnDrop(Arc<std::sync::atomic::AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// How often a standby dispatcher tries the spool's dispatcher lock.
pub const STANDBY_POLL_S: f64 = 0.5;

/// Wait until this dispatcher is the spool's active one (`Store::take_dispatch`): at once on
/// SQLite (dispatch.lock is held already), and on PostgreSQL when no other dispatcher's
/// session holds the lock. Meanwhile it is a standby: it says so once, tells systemd it is
/// up, and writes nothing but what `standby::Watch` does when the active one's heartbeat
/// stops. `None`: a shutdown while waiting.
async fn become_active(
    st: &mut crate::store::Store,
    start: &mut StartWait<'_>,
    cfg: &config::Config,
) -> Result<Option<()>, StoreError> {
    let mut standby_since: Option<std::time::Instant> = None;
    let mut watch = standby::Watch::default();
    loop {
        match until_weather_clears("taking the dispatcher lock", start, || st.take_dispatch())
            .await?
        {
            None => {
                tokio::task::block_in_place(|| watch.finish());
                return Ok(None);
            }
            Some(true) => {
                tokio::task::block_in_place(|| watch.finish());
                if let Some(since) = standby_since {
                    tracing::info!(
                        component = "dispatch",
                        duration_ms = since.elapsed().as_millis() as u64,
                        "active: took the spool's dispatcher lock from standby"
                    );
                }
                return Ok(Some(()));
            }
            Some(false) => {
                if standby_since.is_none() {
                    standby_since = Some(std::time::Instant::now());
                    tracing::info!(
                        component = "dispatch",
                        "standby: another dispatcher holds the spool's dispatcher lock; this one takes over when its session ends"
                    );
                    notify::ready("standby");
                }
                tokio::task::block_in_place(|| watch.check(st, cfg, &start.clock))?;
                // A standby's turn is its health proof: it asked for the lock and looked at
                // the active one's heartbeat. Without it systemd's watchdog restarted every
                // standby each WatchdogSec.
                notify::watchdog();
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs_f64(STANDBY_POLL_S)) => {}
                    _ = &mut *start.shutdown => {
                        tokio::task::block_in_place(|| watch.finish());
                        return Ok(None);
                    }
                }
            }
        }
    }
}

/// Script destinations that set `sandbox.required = true`: they must not run with less
/// isolation than landlock and seccomp together.
fn sandbox_required_by(cfg: &config::Config) -> Vec<String> {
    cfg.destinations
        .values()
        .filter(|d| matches!(&d.spec, config::DestinationSpec::Script(s) if s.sandbox.required))
        .map(|d| d.name.clone())
        .collect()
}

/// Probe what this kernel's sandbox enforces (spec 10; `sandbox::probe`), record it for
/// `status` and the `config:sandbox` issue, and refuse to start when it is incomplete and
/// a script destination requires it.
async fn probe_sandbox(
    engine: &mut Engine,
    start: &mut StartWait<'_>,
) -> Result<(), DispatchError> {
    let (text, complete) = match crate::sandbox::probe().await {
        Ok(e) => (crate::sandbox::describe_enforcement(&e), e.complete()),
        Err(e) => (format!("the sandbox probe failed: {e}"), false),
    };
    if until_weather_clears("recording the sandbox probe", start, || {
        engine.record_sandbox(&text, complete)
    })
    .await?
    .is_none()
    {
        return Ok(());
    }
    if complete {
        tracing::info!(component = "dispatch", reason = %text, "script sandbox");
        return Ok(());
    }
    let required = sandbox_required_by(engine.config());
    if !required.is_empty() {
        return Err(DispatchError::SandboxRequired {
            destinations: required.join(", "),
            enforced: text,
        });
    }
    tracing::warn!(
        component = "dispatch",
        reason = %text,
        "script sandbox degraded: scripts run with less isolation (status shows it; issue config:sandbox)"
    );
    Ok(())
}

/// Run the dispatcher until `shutdown` completes.
pub async fn run(
    mut opts: DispatchOptions,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), DispatchError> {
    crate::store::pg::name_sessions("dispatch");
    // The watch begins before the load, so a save during it (or during the start that
    // follows, which can take seconds) is reported and loaded again. The intake watches
    // the file the same way (sys::watch), so both halves apply a save together.
    let (config_path, _) = opts.inputs.config_path();
    let mut watch = ConfigWatch::new(&config_path, Duration::from_secs(FALLBACK_POLL_S));
    let (cfg, warnings) = config::load(&opts.inputs, false)?;
    for w in warnings {
        tracing::warn!(component = "dispatch", reason = %w, "config warning");
    }
    if let Some(endpoint) = &cfg.telemetry.otlp_endpoint
        && let Err(e) = crate::telemetry::init(endpoint, cfg.telemetry.queue_spans)
    {
        tracing::warn!(component = "dispatch", reason = %e, "traces are off");
    }
    tokio::pin!(shutdown);
    let mut start = StartWait {
        shutdown: &mut shutdown,
        clock: opts.clock.clone(),
        full_since: None,
    };
    // Every startup step that writes, or opens the spool (a first connection on a full
    // disk cannot create the `-shm` file), waits out weather; `None` is a shutdown
    // during the wait.
    macro_rules! wait_out {
        ($what:expr, $f:expr) => {
            match until_weather_clears($what, &mut start, $f).await? {
                Some(v) => v,
                None => return Ok(()),
            }
        };
    }
    wait_out!("creating the spool home", || store::ensure_home(&cfg.home));
    let _lock = lock(&cfg.home)?;
    // Opening (and migrating) the spool, PRAGMA quick_check and the spool's structural
    // invariants (spec 4, 5), one step: a violation is reported, one line each, and
    // delivery goes on (the data is intact enough to deliver; the operator decides what
    // to repair).
    let (st, broken) = wait_out!("opening and checking the spool", || {
        let st = cfg.open_spool(Role::Migrator, busy_timeout())?;
        st.quick_check()?;
        let broken = st.check_invariants()?;
        Ok((st, broken))
    });
    if let Some(tx) = &opts.migrated {
        tx.send_replace(true);
    }
    for line in &broken {
        tracing::error!(component = "dispatch", reason = %line, "spool invariant violated");
    }
    let mut st = st;
    if become_active(&mut st, &mut start, &cfg).await?.is_none() {
        return Ok(());
    }
    // On PostgreSQL a second session records results while the first seals and claims
    // (`Engine::set_recorder`); SQLite has one writer at a time.
    let recorder = if st.is_postgres() {
        Some(wait_out!("opening the recorder's session", || {
            cfg.open_spool(Role::Reader, busy_timeout())
        }))
    } else {
        None
    };
    let mut engine = Engine::new(Arc::new(cfg), st, opts.clock.clone())?;
    if let Some(rec) = recorder {
        engine.set_recorder(rec);
    }
    let recovered = wait_out!("startup lease recovery", || engine.startup());
    if recovered > 0 {
        tracing::warn!(
            component = "dispatch",
            count = recovered,
            "recovered leases of a previous run"
        );
    }
    // A start on a good config is a good load: a config:file issue left by a failed
    // reload resolves.
    wait_out!("resolving config:file", || engine
        .config_reload_issue(Ok(())));
    wait_out!("recording config:secrets", || engine.secrets_issue());
    probe_sandbox(&mut engine, &mut start).await?;
    if let Some(since) = start.full_since {
        engine.full_at_start(since);
    }
    let _wake_task =
        crate::wake::listen(&engine.config().home, opts.wake.clone()).map_err(|e| {
            DispatchError::Io {
                context: "binding the wake-up socket".into(),
                source: e,
            }
        })?;
    // On PostgreSQL, intakes on any host wake this dispatcher through NOTIFY too.
    let wake_stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let _pg_wake = match engine.config().spool_at() {
        Ok(crate::store::SpoolAt::Postgres(url)) => {
            let wake = opts.wake.clone();
            Some(
                crate::store::pg::wake_listener(url, wake_stop.clone(), move || wake.notify_one())
                    .map_err(|e| DispatchError::Io {
                        context: "starting the PostgreSQL wake-up listener".into(),
                        source: e,
                    })?,
            )
        }
        _ => None,
    };
    let _stop_listening = StopOnDrop(wake_stop);
    notify::ready("dispatching");
    tracing::info!(component = "dispatch", "dispatcher ready");
    if let Some(tx) = opts.ready.take() {
        // A caller that stopped waiting for readiness does not need it.
        let _ = tx.send(());
    }
    let mut last_config_check = f64::NEG_INFINITY;
    let mut reload_due = false;
    loop {
        let poll = Duration::from_secs_f64(engine.config().dispatch.poll_s);
        tokio::select! {
            _ = &mut shutdown => break,
            _ = tokio::time::sleep(engine.next_wait(poll)) => {}
            _ = opts.wake.notified() => {}
            _ = opts.reload.notified() => {
                watch.mark_seen();
                reload_due = true;
                last_config_check = f64::NEG_INFINITY;
            }
            _ = watch.changed() => {
                reload_due = true;
                last_config_check = f64::NEG_INFINITY;
            }
            done = engine.next_finished() => {
                // Recorded by the tick below, with everything else that finished meanwhile.
                if let Some(done) = done {
                    engine.accept(done);
                    engine.gather_results().await;
                }
            }
        }
        let now = engine.now_eff();
        if reload_due && now - last_config_check >= CONFIG_CHECK_EVERY_S {
            last_config_check = now;
            // Not done: try again next second, the result must reach config:file.
            reload_due = !tokio::task::block_in_place(|| reload_config(&mut engine, &opts.inputs))?;
        }
        // Weather (a busy or full spool) was logged, counted and put the ticks in a
        // backoff (spec 12); anything else stops the dispatcher so systemd (or `run`)
        // restarts it on intact data.
        let ticked = match tokio::task::block_in_place(|| engine.tick()) {
            Err(e) if !e.is_weather() => return Err(e.into()),
            other => other,
        };
        if crate::failpoint::error_once("dispatch.tick_fails") {
            return Err(StoreError::Invalid("failpoint dispatch.tick_fails".into()).into());
        }
        // Watchdog pings are a health proof (see `Engine::progress_possible`).
        if engine.progress_possible(ticked.as_ref()) {
            notify::watchdog();
        }
    }
    notify::stopping();
    let drained = engine.drain(Duration::from_secs_f64(DRAIN_S_MAX)).await?;
    engine.finish_alerts();
    if !drained {
        tracing::warn!(
            component = "dispatch",
            inflight = engine.inflight(),
            "stopping with attempts in flight or results not recorded ({} waiting for the spool); their leases are recovered at the next start and those batches delivered again",
            engine.unrecorded()
        );
    }
    Ok(())
}

/// A changed config file: load it; a good one is applied (and resolves config:file) and its
/// warnings logged, a bad one keeps the previous config and opens config:file (spec 12, 15). A busy database
/// only delays the issue (`Ok(false)`: try again); it never stops the dispatcher.
fn reload_config(engine: &mut Engine, inputs: &PathInputs) -> Result<bool, DispatchError> {
    let result = match config::load(inputs, false) {
        Ok((c, warnings)) => {
            // As at the start, and as the intake does: an unknown key a reload left out is
            // said by both halves that apply the file (issue 29).
            for w in warnings {
                tracing::warn!(component = "dispatch", reason = %w, "config warning");
            }
            engine.reload(Arc::new(c)).map(|n| {
                tracing::info!(component = "dispatch", redue = n, "config reloaded");
            })
        }
        Err(e) => {
            let text = e.to_string();
            tracing::error!(component = "dispatch", reason = %text, "config reload failed; keeping the previous config");
            engine.config_reload_issue(Err(&text))
        }
    };
    match result {
        Ok(()) => Ok(true),
        Err(e) if e.is_weather() => {
            engine.note_busy(&e, "recording the config reload");
            Ok(false)
        }
        Err(e) => Err(e.into()),
    }
}
