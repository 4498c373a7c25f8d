//! WATCHDOG=1 as a health proof, not a timer (RUST-ADAPTATION "systemd, for real"): every
//! half watchdog interval the writer thread is sent a probe, and the ping goes out only if it
//! answered within that half interval. A writer wedged in a transaction (or a dead one)
//! stops the pings and systemd restarts the process on intact data.
//!
//! Must not: ping when systemd did not ask for a watchdog (WATCHDOG_USEC unset), or ping on
//! a timer alone. Note for unit files: WatchdogSec should exceed intake.busy_timeout_s,
//! since a writer waiting on SQLITE_BUSY is legitimately silent that long.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::Shared;
use crate::sys::notify;

/// The shortest probe period, whatever WATCHDOG_USEC says.
pub const PROBE_PERIOD_MS_MIN: u64 = 50;

pub async fn run(shared: Arc<Shared>, mut shutdown: watch::Receiver<bool>) {
    let Some(interval) = notify::watchdog_interval() else {
        return;
    };
    let period = (interval / 2).max(Duration::from_millis(PROBE_PERIOD_MS_MIN));
    loop {
        let answered = tokio::select! {
            _ = super::stopping(&mut shutdown) => return,
            r = tokio::time::timeout(period, shared.writer.probe()) => matches!(r, Ok(true)),
        };
        if answered {
            notify::watchdog();
        } else {
            tracing::warn!(
                component = "intake",
                reason = "writer did not answer the health probe",
                "no watchdog ping"
            );
        }
        tokio::select! {
            _ = super::stopping(&mut shutdown) => return,
            _ = tokio::time::sleep(period) => {}
        }
    }
}
