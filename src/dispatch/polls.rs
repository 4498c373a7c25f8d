//! The poll clock's driver (spec 14.4): on every pass of the dispatcher's loop, before
//! sealing, it reads the `polls` rows once and takes a write transaction only for an
//! instance that is new, due, scheduled further out than `every_s + jitter_s` (a reload
//! shortened the period), or whose last tick was delivered and is not recorded yet. The
//! rules themselves are the store's (`store::polls`), one transaction each; this module
//! decides which to call, draws the jitter and builds the tick event through the one
//! routing rule (`Config::injected_request`).
//!
//! A due instance gets ONE tick however many windows it missed (its next time is counted
//! from now), so a dispatcher stopped for a day yields one tick, never a burst.
//!
//! Must not: read the clock (the engine passes `now_eff`) or write anything the store's
//! poll transactions do not.

use crate::config::Config;
use crate::config::inject::Injected;
use crate::config::poll::PollSchedule;
use crate::store::{Fired, PollClockRow, Store, StoreError, tick_dedup_id};

/// The key every tick of an instance is coalesced under (14.4).
pub const TICK_KEY: &str = "poll";
/// The event type of a tick (14.4).
pub const TICK_EVENT_TYPE: &str = "poll";

/// What one pass did, per instance.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct PollPass {
    /// Rule 1: instances scheduled for the first time.
    pub scheduled: Vec<String>,
    /// Rule 3: instances that got a tick, with the batch it joined.
    pub ticked: Vec<(String, i64)>,
    /// Rule 2: instances whose window passed while the last tick was undelivered.
    pub skipped: Vec<String>,
    /// Instances pulled in after a reload shortened their period.
    pub rescheduled: Vec<String>,
    /// Instances whose last tick's delivery was recorded.
    pub delivered: Vec<String>,
}

impl PollPass {
    /// How many write transactions the pass took.
    pub fn writes(&self) -> usize {
        self.scheduled.len()
            + self.ticked.len()
            + self.skipped.len()
            + self.rescheduled.len()
            + self.delivered.len()
    }
}

/// One pass over every configured poll instance. `draw` returns a uniform number in [0, 1)
/// for the jitter. A config without poll sources reads nothing.
pub fn pass(
    store: &mut Store,
    cfg: &Config,
    now: f64,
    draw: &mut dyn FnMut() -> f64,
) -> Result<PollPass, StoreError> {
    let mut out = PollPass::default();
    let configured: Vec<(&str, PollSchedule)> = cfg
        .sources
        .iter()
        .filter_map(|(name, s)| s.poll.map(|p| (name.as_str(), p)))
        .collect();
    if configured.is_empty() {
        return Ok(out);
    }
    let rows = store.poll_clock_rows()?;
    for (instance, schedule) in configured {
        let row = rows.iter().find(|r| r.instance == instance);
        let jitter = |draw: &mut dyn FnMut() -> f64| schedule.jitter_s * draw().clamp(0.0, 1.0);
        let Some(row) = row else {
            if store.poll_schedule_new(instance, rule_1_first_at(now, jitter(draw)), now)? {
                out.scheduled.push(instance.to_string());
            }
            continue;
        };
        if row.delivery_unrecorded && store.poll_record_delivered(instance)? {
            out.delivered.push(instance.to_string());
        }
        if is_due(row, now) {
            let next_at = rule_2_3_next_at(now, schedule, jitter(draw));
            let tick = tick_request(cfg, instance, row.next_at, now)?;
            match store.poll_fire(instance, row.next_at, &tick, next_at, now)? {
                Fired::Ticked { batch_id, .. } => {
                    tracing::info!(source = %instance, batch = batch_id, "poll tick enqueued");
                    out.ticked.push((instance.to_string(), batch_id));
                }
                Fired::Skipped {
                    skipped,
                    last_state,
                } => {
                    tracing::info!(
                        source = %instance,
                        reason = last_state.as_str(),
                        "poll window passed while the last tick is undelivered ({skipped} skipped)"
                    );
                    out.skipped.push(instance.to_string());
                }
                Fired::NotDue => {}
            }
        } else if is_too_far_out(row, now, schedule) {
            let next_at = shortened_next_at(row, now, schedule, jitter(draw));
            if store.poll_reschedule(instance, row.next_at, next_at)? {
                out.rescheduled.push(instance.to_string());
            }
        }
    }
    Ok(out)
}

/// Rule 1: a new instance's first time, `now + U(0, jitter_s)`, so instances do not all
/// fire at startup.
fn rule_1_first_at(now: f64, jitter: f64) -> f64 {
    now + jitter
}

/// Rules 2 and 3: the next time after a due window, counted from now (never from the missed
/// schedule, which would fire again at once for every window missed).
fn rule_2_3_next_at(now: f64, schedule: PollSchedule, jitter: f64) -> f64 {
    now + schedule.every_s + jitter
}

fn is_due(row: &PollClockRow, now: f64) -> bool {
    now >= row.next_at
}

/// Scheduled further out than a fresh schedule could be: the period was shortened.
fn is_too_far_out(row: &PollClockRow, now: f64, schedule: PollSchedule) -> bool {
    row.next_at > now + schedule.every_s + schedule.jitter_s
}

/// After a shortened period: as if the new period had been in force since the last tick (or
/// the first schedule), but not before now.
fn shortened_next_at(row: &PollClockRow, now: f64, schedule: PollSchedule, jitter: f64) -> f64 {
    let base = row.last_tick_at.unwrap_or(row.created_at);
    (base + schedule.every_s).max(now) + jitter
}

/// The tick event for the window scheduled at `scheduled_at`, routed like any injected
/// event: source and route `<i>`, key `poll`, event type `poll`, dedup id
/// `poll:<i>:<scheduled_at>`; the source's immediate span gives the window.
fn tick_request(
    cfg: &Config,
    instance: &str,
    scheduled_at: f64,
    now: f64,
) -> Result<crate::store::EnqueueRequest, StoreError> {
    let payload = serde_json::json!({
        "tick": scheduled_at.floor() as i64,
        "instance": instance,
    })
    .to_string();
    let dedup = tick_dedup_id(instance, scheduled_at);
    cfg.injected_request(&Injected {
        source: instance,
        key: TICK_KEY,
        event_type: TICK_EVENT_TYPE,
        dedup_id: Some(&dedup),
        destination: None,
        payload: &payload,
        raw: None,
        now,
    })
    // The config validated this source and its action; a refusal here is a bug.
    .map_err(|e| StoreError::Invalid(format!("poll tick for {instance}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(next_at: f64, last_tick_at: Option<f64>) -> PollClockRow {
        PollClockRow {
            instance: "feed".into(),
            next_at,
            last_tick_at,
            created_at: 1000.0,
            last_state: None,
            delivery_unrecorded: false,
        }
    }

    const S: PollSchedule = PollSchedule {
        every_s: 900.0,
        jitter_s: 90.0,
    };

    #[test]
    fn poll_clock_next_time_is_counted_from_now_not_from_the_missed_window() {
        // Stopped for a day: the next time is one period after now, not a day of periods.
        assert_eq!(
            rule_2_3_next_at(1000.0 + 86_400.0, S, 10.0),
            87_400.0 + 910.0
        );
        assert!(is_due(&row(1900.0, None), 87_400.0));
    }

    #[test]
    fn poll_clock_a_shortened_period_pulls_next_at_in_but_not_before_now() {
        let far = row(1000.0 + 86_400.0, Some(1000.0));
        assert!(is_too_far_out(&far, 1500.0, S));
        assert!(!is_too_far_out(&row(1500.0 + 990.0, None), 1500.0, S));
        assert_eq!(shortened_next_at(&far, 1500.0, S, 0.0), 1900.0);
        // The last tick is older than the new period: due now (plus jitter).
        assert_eq!(shortened_next_at(&far, 5000.0, S, 7.0), 5007.0);
    }
}
