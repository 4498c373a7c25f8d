//! The dispatcher (spec 2, 4, 5, 6): the only process that delivers. It holds an exclusive
//! flock on `<home>/dispatch.lock` (a second dispatcher exits 3), applies migrations and runs
//! quick_check at startup, recovers leases, then ticks every poll_s or when the intake
//! nudges it. `engine` holds the loop's state; `breaker` and `retry` are pure arithmetic;
//! `registry` builds destinations from config; `document` renders what is delivered;
//! `emits` validates script emits. The dispatcher never answers senders and never touches
//! the intake's sockets.

pub mod breaker;
pub mod document;
pub mod emits;
pub mod engine;
pub mod registry;
pub mod retry;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use crate::clock::SharedClock;
use crate::config::{self, PathInputs};
use crate::store::{self, Role, Store, StoreError};
use crate::sys::notify;

pub use engine::Engine;

/// How long SIGTERM waits for in-flight attempts before exiting (their leases are recovered
/// at the next start).
pub const DRAIN_S_MAX: f64 = 10.0;
/// How often the config file's mtime is compared (spec 15: every tick).
pub const CONFIG_CHECK_EVERY_S: f64 = 1.0;

#[derive(Debug, thiserror::Error)]
pub enum DispatchError {
    #[error("{0} is held by another dispatcher (or a migrate); only one may run")]
    Locked(String),
    #[error("{0}")]
    Config(#[from] config::ConfigError),
    #[error("{0}")]
    Store(#[from] StoreError),
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

fn config_mtime(cfg: &config::Config) -> Option<std::time::SystemTime> {
    cfg.file
        .as_ref()
        .and_then(|f| std::fs::metadata(f).ok())
        .and_then(|m| m.modified().ok())
}

/// Run the dispatcher until `shutdown` completes.
pub async fn run(
    opts: DispatchOptions,
    shutdown: impl Future<Output = ()>,
) -> Result<(), DispatchError> {
    let (cfg, warnings) = config::load(&opts.inputs, false)?;
    for w in warnings {
        tracing::warn!(component = "dispatch", reason = %w, "config warning");
    }
    store::ensure_home(&cfg.home)?;
    let _lock = lock(&cfg.home)?;
    let st = Store::open(
        &cfg.db,
        Role::Migrator,
        Duration::from_secs(store::DEFAULT_BUSY_TIMEOUT_S),
    )?;
    st.quick_check()?;
    let mut engine = Engine::new(Arc::new(cfg), st, opts.clock.clone())?;
    let recovered = engine.startup()?;
    if recovered > 0 {
        tracing::warn!(
            component = "dispatch",
            count = recovered,
            "recovered leases of a previous run"
        );
    }
    let _wake_task =
        crate::wake::listen(&engine.config().home, opts.wake.clone()).map_err(|e| {
            DispatchError::Io {
                context: "binding the wake-up socket".into(),
                source: e,
            }
        })?;
    let mut mtime = config_mtime(engine.config());
    notify::ready("dispatching");
    tracing::info!(component = "dispatch", "dispatcher ready");
    tokio::pin!(shutdown);
    let mut last_config_check = f64::NEG_INFINITY;
    loop {
        let poll = Duration::from_secs_f64(engine.config().dispatch.poll_s);
        tokio::select! {
            _ = &mut shutdown => break,
            _ = tokio::time::sleep(poll) => {}
            _ = opts.wake.notified() => {}
            _ = opts.reload.notified() => { last_config_check = f64::NEG_INFINITY; mtime = None; }
            done = engine.next_finished() => {
                if let Some(done) = done {
                    // Everything that finished meanwhile joins the same transaction.
                    tokio::task::block_in_place(|| engine.finish_with_pending(done))?;
                }
            }
        }
        let now = engine.now_eff();
        if now - last_config_check >= CONFIG_CHECK_EVERY_S {
            last_config_check = now;
            let current = config_mtime(engine.config());
            if current != mtime {
                mtime = current;
                match config::load(&opts.inputs, false) {
                    Ok((c, _)) => {
                        let n = engine.reload(Arc::new(c))?;
                        tracing::info!(component = "dispatch", redue = n, "config reloaded");
                    }
                    Err(e) => {
                        tracing::error!(component = "dispatch", reason = %e, "config reload failed; keeping the previous config")
                    }
                }
            }
        }
        let tick = tokio::task::block_in_place(|| engine.tick());
        match tick {
            Ok(_) => notify::watchdog(),
            // A busy database is retried next tick (spec 12); anything else stops the process
            // so systemd restarts it on intact data.
            Err(StoreError::Busy) => tracing::warn!(
                component = "dispatch",
                reason = "database busy",
                "tick skipped"
            ),
            Err(e) => return Err(e.into()),
        }
    }
    notify::stopping();
    let drained = engine.drain(Duration::from_secs_f64(DRAIN_S_MAX)).await?;
    engine.finish_alerts();
    if !drained {
        tracing::warn!(
            component = "dispatch",
            inflight = engine.inflight(),
            "stopping with attempts in flight; their leases are recovered at the next start"
        );
    }
    Ok(())
}
