//! Reload: SIGHUP and a saved config file (`sys::watch`, the watcher the dispatcher reloads
//! by too, so both halves apply a save within the same second) rebuild the snapshot of
//! sources and routes. systemd sees RELOADING=1 with
//! MONOTONIC_USEC, then READY=1 whether or not the new config was good: a bad config keeps
//! the previous one serving, says why in the log and opens the config:file issue (through
//! the writer, the intake's one store connection); the next good reload resolves it.
//! Connections are never dropped.
//!
//! Must not: change listeners or the writer (settings that need a restart are named in a
//! warning instead), or block the runtime (loading reads files on the blocking pool).

use std::sync::Arc;
use std::time::Duration;

use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::watch;

use super::{Shared, Snapshot};
use crate::sys::notify;
use crate::sys::watch::{ConfigWatch, FALLBACK_POLL_S};

/// The SIGHUP handler, installed as this is called: `serve` calls it before READY=1, so a
/// `systemctl reload` right after the start meets it instead of SIGHUP's default action
/// (which ends the process). None when `on_sighup` is off or no handler can be installed.
pub fn sighup(on_sighup: bool) -> Option<Signal> {
    if !on_sighup {
        return None;
    }
    match signal(SignalKind::hangup()) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(component = "intake", reason = %e, "no SIGHUP handler; reload by editing the config file");
            None
        }
    }
}

/// Reloads on each SIGHUP (`hup`, from [`sighup`]) and each save of the config file, until
/// shutdown.
pub async fn run(
    shared: Arc<Shared>,
    notify: bool,
    mut hup: Option<Signal>,
    mut shutdown: watch::Receiver<bool>,
) {
    let (path, _) = shared.inputs.config_path();
    let mut watch = ConfigWatch::new(&path, Duration::from_secs(FALLBACK_POLL_S));
    loop {
        let why = tokio::select! {
            _ = super::stopping(&mut shutdown) => return,
            Some(()) = async {
                match hup.as_mut() {
                    Some(h) => h.recv().await,
                    None => std::future::pending().await,
                }
            } => {
                watch.mark_seen();
                "SIGHUP"
            }
            _ = watch.changed() => "config file changed",
        };
        reload(&shared, notify, why).await;
    }
}

/// One reload: RELOADING=1, build, swap or keep, READY=1.
pub async fn reload(shared: &Arc<Shared>, notify: bool, why: &str) {
    if notify {
        notify::reloading();
    }
    let inputs = shared.inputs.clone();
    let loaded = tokio::task::spawn_blocking(move || Snapshot::load(&inputs)).await;
    let problems = match &loaded {
        Ok(Ok(_)) => None,
        Ok(Err(e)) => Some(e.to_string()),
        Err(e) => Some(format!("loading the config failed: {e}")),
    };
    match loaded {
        Ok(Ok(next)) => {
            let restart = shared.snapshot().restart_only_changes(&next);
            if !restart.is_empty() {
                tracing::warn!(
                    component = "intake",
                    reason = %restart.join(", "),
                    "these settings changed but apply only after a restart"
                );
            }
            shared.replace_snapshot(next);
            tracing::info!(component = "intake", reason = why, "config reloaded");
        }
        Ok(Err(e)) => {
            tracing::error!(
                component = "intake",
                reason = %e,
                "config reload failed; the previous config stays in force"
            );
        }
        Err(e) => {
            tracing::error!(component = "intake", reason = %e, "config reload failed");
        }
    }
    // The issue after the swap: a writer that cannot take it (busy, stopping) delays
    // nothing else, and the dispatcher's own reload records the same result.
    if let Err(e) = shared.writer.config_loaded(problems).await {
        tracing::warn!(component = "intake", reason = %e, "could not record the reload in config:file");
    }
    if notify {
        notify::ready(&shared.snapshot().status_line(&shared.listeners));
    }
}
