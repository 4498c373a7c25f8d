//! What a standby dispatcher does while it waits for the spool's dispatcher lock (issue 33):
//! it watches the active one's heartbeat. A session that holds the lock while its
//! dispatcher writes no heartbeat (a hung or frozen process, a host that stopped answering
//! before PostgreSQL ended its session) keeps every standby waiting, and nothing is
//! delivered: after `issues::DISPATCHER_INACTIVE_HEARTBEATS` missed heartbeats the standby
//! opens `spool:no_active_dispatcher`, and runs the alert pass (at most once a heartbeat)
//! so the operator hears of it, since the one that would send alerts is the one that
//! stopped. The active dispatcher resolves the issue with its next heartbeat.
//!
//! Alerts cannot go out twice in the normal case: a standby runs an alert pass only while
//! the heartbeat is stale, the active dispatcher only with a heartbeat it writes. The one
//! overlap is a stalled active dispatcher that resumes while a standby's pass is running;
//! that pass and the resumed one's first may both send the same issue (alerts are at least
//! once, as when an alert command succeeds but hookspool stops before recording it).
//!
//! Must not: write anything but the issue and the alert pass's rows, or stop the standby
//! over weather (a busy or unreachable spool is tried again at the next poll).

use crate::clock::SharedClock;
use crate::config::Config;
use crate::observe::alerts::Alerter;
use crate::observe::issues;
use crate::store::{Store, StoreError};

/// The standby's watch on the active dispatcher's heartbeat.
#[derive(Debug, Default)]
pub struct Watch {
    /// When the last alert pass was started (the clock's time).
    alert_at: Option<f64>,
    alerter: Alerter,
}

impl Watch {
    /// One look at the heartbeat, at each standby poll. Weather is logged and left for the
    /// next poll; any other store error is returned (the standby stops, as a dispatcher
    /// does, and systemd starts it again).
    pub fn check(
        &mut self,
        store: &mut Store,
        cfg: &Config,
        clock: &SharedClock,
    ) -> Result<(), StoreError> {
        match self.check_once(store, cfg, clock) {
            Err(e) if e.is_weather() => {
                tracing::warn!(component = "dispatch", reason = %e, "standby: the heartbeat check is deferred");
                Ok(())
            }
            other => other,
        }
    }

    fn check_once(
        &mut self,
        store: &mut Store,
        cfg: &Config,
        clock: &SharedClock,
    ) -> Result<(), StoreError> {
        let now = clock.now();
        if issues::check_dispatcher_heartbeat(store, cfg.dispatch.heartbeat_s, now)?.is_none() {
            return Ok(());
        }
        if self
            .alert_at
            .is_none_or(|t| now - t >= cfg.dispatch.heartbeat_s)
        {
            self.alert_at = Some(now);
            match cfg.spool_at() {
                Ok(at) => {
                    if let Some(Err(e)) = self.alerter.tick(&at, &cfg.alerts, clock) {
                        tracing::warn!(component = "dispatch", reason = %e, "alert pass failed");
                    }
                }
                Err(e) => {
                    tracing::warn!(component = "dispatch", reason = %e, "alert pass not started");
                }
            }
        }
        Ok(())
    }

    /// This dispatcher takes the lock: wait for a running alert pass, so the engine's own
    /// passes never overlap one of this process.
    pub fn finish(&mut self) {
        if let Some(Err(e)) = self.alerter.finish() {
            tracing::warn!(component = "dispatch", reason = %e, "alert pass failed");
        }
    }
}
