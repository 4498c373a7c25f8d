//! Retention (spec 8): delete what has aged out, then checkpoint the WAL. Dead batches are
//! never pruned.
//!
//! A pass is a [`PrunePass`] walked one step at a time: every step is one transaction that
//! deletes at most [`PRUNE_ROWS_MAX`] rows, counted as rows (a batch is its events plus
//! itself), so no transaction outlasts the intake's busy timeout however large the batches
//! are, and a caller with other work (the dispatcher's tick) runs as many steps as its
//! budget allows and comes back for the rest. A delivered or dropped batch with more events
//! than one step may delete loses its events over several steps (oldest first) and its row
//! in the step after the last of them. The first of those steps also makes it `dropped`
//! with result `pruning` ([`PRUNING_RESULT`]), so between the steps (or after a crash
//! between them) no batch is shown as delivered with events missing: a dropped batch
//! claims no events (the invariant checker exempts it), is never delivered or replayed,
//! and the next batch step, of this pass or the next, finishes it before anything else.

use std::time::{Duration, Instant};

use rusqlite::{OptionalExtension, params};

use super::{Result, Store};
use crate::failpoint;
use crate::vocab::BatchState;

/// Rows deleted per transaction (spec 8: "small transactions (1 000 rows each)").
pub const PRUNE_ROWS_MAX: i64 = 1000;
/// A pass runs its steps in bursts of at most this long, then leaves the write lock free
/// for `PRUNE_GAP_MS`. Small transactions alone do not let a waiting writer in: SQLite's
/// busy handler retries at intervals that grow to 100 ms, and steps committed back to back
/// leave gaps it keeps missing (measured by `bench/retention.sh`: an intake-like writer
/// waited 8.5 s). A gap at least as long as its longest retry interval always lets it in.
pub const PRUNE_BURST_MS: u64 = 50;
pub const PRUNE_GAP_MS: u64 = 100;
const DAY_S: f64 = 86_400.0;
/// The `result` of a batch retention has begun to delete (see the module doc).
pub const PRUNING_RESULT: &str = "pruning";

/// Ages from config, and each source's dedup window.
#[derive(Debug, Clone)]
pub struct Retention {
    pub delivered_days: f64,
    pub attempts_days: f64,
    pub dropped_days: f64,
    pub issues_days: f64,
    /// (source, dedup_window_s); a source not listed uses `default_dedup_window_s`.
    pub dedup_windows: Vec<(String, f64)>,
    pub default_dedup_window_s: f64,
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            delivered_days: 7.0,
            attempts_days: 30.0,
            dropped_days: 7.0,
            issues_days: 90.0,
            dedup_windows: Vec::new(),
            default_dedup_window_s: 86_400.0,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct PruneReport {
    pub batches: i64,
    pub events: i64,
    pub attempts: i64,
    pub dedup: i64,
    pub issues: i64,
    /// Idempotency keys of the admin API's enqueue older than `IDEMPOTENCY_KEEP_S`.
    pub idempotency_keys: i64,
    /// Rows of the intake's rejection counts (an hour, a source, a reason) older than
    /// `REJECTIONS_KEEP_S`.
    pub rejection_hours: i64,
}

/// How long an enqueue's Idempotency-Key answers a repeat (spoold keeps its keys seven
/// days); the retention pass forgets older ones.
pub const IDEMPOTENCY_KEEP_S: f64 = 7.0 * DAY_S;
/// How long the intake's rejection counts are kept, by hour: the dashboard shows the last
/// day, the API at most `REJECTIONS_KEEP_S` back.
pub const REJECTIONS_KEEP_S: f64 = 7.0 * DAY_S;

/// Where a pass is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Delivered batches with their events.
    Delivered,
    /// Dropped batches with their events.
    Dropped,
    Attempts,
    Issues,
    /// The dedup rows of `dedup_windows[i]`.
    Dedup(usize),
    /// The dedup rows of every source without a window of its own.
    DedupDefault,
    /// The admin API's idempotency keys (meta rows) past `IDEMPOTENCY_KEEP_S`.
    Idempotency,
    /// The intake's rejection counts of hours that ended `REJECTIONS_KEEP_S` ago.
    Rejections,
    Checkpoint,
    Done,
}

/// One retention pass in progress (see the module doc).
#[derive(Debug, Clone)]
pub struct PrunePass {
    now: f64,
    retention: Retention,
    stage: Stage,
    pub report: PruneReport,
    /// Transactions this pass has committed, and the most rows one of them deleted.
    pub transactions: i64,
    pub rows_in_one_transaction_max: i64,
}

impl PrunePass {
    /// A pass pruning what is older than its age at `now`. Touches nothing yet.
    pub fn new(now: f64, retention: &Retention) -> PrunePass {
        PrunePass {
            now,
            retention: retention.clone(),
            stage: Stage::Delivered,
            report: PruneReport::default(),
            transactions: 0,
            rows_in_one_transaction_max: 0,
        }
    }

    pub fn is_done(&self) -> bool {
        self.stage == Stage::Done
    }

    fn deleted(&mut self, rows: i64) {
        self.transactions += 1;
        self.rows_in_one_transaction_max = self.rows_in_one_transaction_max.max(rows);
    }

    fn next_stage(&mut self) {
        self.stage = match self.stage {
            Stage::Delivered => Stage::Dropped,
            Stage::Dropped => Stage::Attempts,
            Stage::Attempts => Stage::Issues,
            Stage::Issues if self.retention.dedup_windows.is_empty() => Stage::DedupDefault,
            Stage::Issues => Stage::Dedup(0),
            Stage::Dedup(i) if i + 1 < self.retention.dedup_windows.len() => Stage::Dedup(i + 1),
            Stage::Dedup(_) => Stage::DedupDefault,
            Stage::DedupDefault => Stage::Idempotency,
            Stage::Idempotency => Stage::Rejections,
            Stage::Rejections => Stage::Checkpoint,
            Stage::Checkpoint | Stage::Done => Stage::Done,
        };
    }
}

impl Store {
    /// Run a whole retention pass at `now` (`hookspool prune`), in bursts of steps with the
    /// lock left free between them (see `PRUNE_GAP_MS`).
    pub fn prune(&mut self, now: f64, r: &Retention) -> Result<PruneReport> {
        let mut pass = PrunePass::new(now, r);
        loop {
            let burst = Instant::now() + Duration::from_millis(PRUNE_BURST_MS);
            while Instant::now() < burst {
                if self.prune_step(&mut pass)? {
                    return Ok(pass.report);
                }
            }
            std::thread::sleep(Duration::from_millis(PRUNE_GAP_MS));
        }
    }

    /// One step of `pass`: one transaction of at most [`PRUNE_ROWS_MAX`] deleted rows, or
    /// the closing checkpoint. Returns whether the pass is done.
    pub fn prune_step(&mut self, pass: &mut PrunePass) -> Result<bool> {
        let now = pass.now;
        let r = pass.retention.clone();
        let deleted = match pass.stage {
            Stage::Done => return Ok(true),
            Stage::Checkpoint => {
                self.checkpoint()?;
                pass.next_stage();
                return Ok(true);
            }
            // Only delivered and dropped batches age out; dead ones never do.
            Stage::Delivered => self.prune_batches_step(
                pass,
                BatchState::Delivered,
                "delivered_at",
                now - r.delivered_days * DAY_S,
            )?,
            Stage::Dropped => self.prune_batches_step(
                pass,
                BatchState::Dropped,
                "dropped_at",
                now - r.dropped_days * DAY_S,
            )?,
            Stage::Attempts => {
                let n = self.delete_up_to(
                    "DELETE FROM attempts WHERE id IN
                       (SELECT id FROM attempts WHERE started_at < ?1 LIMIT ?2)",
                    params![now - r.attempts_days * DAY_S, PRUNE_ROWS_MAX],
                )?;
                pass.report.attempts += n;
                n
            }
            Stage::Issues => {
                let n = self.delete_up_to(
                    "DELETE FROM issues WHERE id IN (SELECT id FROM issues
                       WHERE state IN ('resolved', 'ignored') AND last_at < ?1 LIMIT ?2)",
                    params![now - r.issues_days * DAY_S, PRUNE_ROWS_MAX],
                )?;
                pass.report.issues += n;
                n
            }
            Stage::Dedup(i) => {
                let (source, window) = &r.dedup_windows[i];
                let n = self.delete_up_to(
                    "DELETE FROM dedup WHERE rowid IN (SELECT rowid FROM dedup
                       WHERE source = ?1 AND seen_at < ?2 LIMIT ?3)",
                    params![source, now - window, PRUNE_ROWS_MAX],
                )?;
                pass.report.dedup += n;
                n
            }
            Stage::DedupDefault => {
                let named: Vec<&str> = r.dedup_windows.iter().map(|(s, _)| s.as_str()).collect();
                // A list of names as JSON is the one way to bind it; it cannot fail.
                let named = serde_json::to_string(&named).unwrap_or_else(|_| "[]".into());
                let n = self.delete_up_to(
                    "DELETE FROM dedup WHERE rowid IN (SELECT rowid FROM dedup
                       WHERE seen_at < ?1 AND source NOT IN (SELECT value FROM json_each(?2))
                       LIMIT ?3)",
                    params![now - r.default_dedup_window_s, named, PRUNE_ROWS_MAX],
                )?;
                pass.report.dedup += n;
                n
            }
            Stage::Idempotency => {
                // The meta key's range (its primary key), then the kept answer's time.
                let n = self.delete_up_to(
                    "DELETE FROM meta WHERE key IN (SELECT key FROM meta
                       WHERE key >= 'idempotency:' AND key < 'idempotency;'
                         AND json_valid(value) AND json_extract(value, '$.at') < ?1 LIMIT ?2)",
                    params![now - IDEMPOTENCY_KEEP_S, PRUNE_ROWS_MAX],
                )?;
                pass.report.idempotency_keys += n;
                n
            }
            Stage::Rejections => {
                // Hours that ended before the cut: a row holds its whole hour.
                let n = self.delete_up_to(
                    "DELETE FROM rejections WHERE rowid IN (SELECT rowid FROM rejections
                       WHERE hour <= ?1 LIMIT ?2)",
                    params![
                        super::rejections::rejection_hour(now - REJECTIONS_KEEP_S)
                            - super::rejections::REJECTION_HOUR_S,
                        PRUNE_ROWS_MAX
                    ],
                )?;
                pass.report.rejection_hours += n;
                n
            }
        };
        pass.deleted(deleted);
        // A step that had nothing left to delete (or less than a full step) ends its stage;
        // a batch step ends it only when it found no batch at all.
        let stage_done = match pass.stage {
            Stage::Delivered | Stage::Dropped => deleted == 0,
            Stage::Attempts
            | Stage::Issues
            | Stage::Dedup(_)
            | Stage::DedupDefault
            | Stage::Idempotency
            | Stage::Rejections
            | Stage::Checkpoint
            | Stage::Done => deleted < PRUNE_ROWS_MAX,
        };
        if stage_done {
            pass.next_stage();
        }
        if !pass.is_done() {
            // A transaction committed and more are to come (spec 18: a crash mid-pass).
            failpoint::hit("prune.between_steps");
        }
        Ok(pass.is_done())
    }

    fn prune_batches_step(
        &mut self,
        pass: &mut PrunePass,
        state: BatchState,
        column: &str,
        cutoff: f64,
    ) -> Result<i64> {
        let (batches, events) = self.prune_batches(state, column, cutoff, pass.now)?;
        pass.report.batches += batches;
        pass.report.events += events;
        Ok(batches + events)
    }

    /// One transaction of a batch stage: first the rest of a batch a step before began
    /// (`PRUNING_RESULT`); else whole batches (events first) oldest first while they fit in
    /// [`PRUNE_ROWS_MAX`] rows, or, when the oldest alone does not fit, that many of its
    /// events, the batch made `dropped` / `pruning` in the same transaction. Returns
    /// (batches, events) deleted.
    fn prune_batches(
        &mut self,
        state: BatchState,
        column: &str,
        cutoff: f64,
        now: f64,
    ) -> Result<(i64, i64)> {
        let tx = self.begin()?;
        let begun: Option<(i64, i64)> = tx
            .prepare_cached(
                "SELECT b.id, (SELECT count(*) FROM events e WHERE e.batch_id = b.id)
                 FROM batches b WHERE b.state = 'dropped' AND b.result = ?1 LIMIT 1",
            )?
            .query_row([PRUNING_RESULT], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?;
        if let Some((id, n)) = begun {
            let (batches, events) = prune_one_batch_tx(&tx, id, n, now)?;
            failpoint::hit("prune.before_commit");
            tx.commit()?;
            return Ok((batches, events));
        }
        let found: Vec<(i64, i64)> = {
            let mut stmt = tx.prepare_cached(&format!(
                "SELECT b.id, (SELECT count(*) FROM events e WHERE e.batch_id = b.id)
                 FROM batches b WHERE b.state = ?1 AND b.{column} < ?2
                 ORDER BY b.{column}, b.id LIMIT ?3"
            ))?;
            stmt.query_map(params![state, cutoff, PRUNE_ROWS_MAX], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })?
            .collect::<rusqlite::Result<_>>()?
        };
        let (mut batches, mut events) = (0i64, 0i64);
        match found.first() {
            None => {}
            Some(&(id, n)) if n + 1 > PRUNE_ROWS_MAX => {
                let (b, e) = prune_one_batch_tx(&tx, id, n, now)?;
                batches += b;
                events += e;
            }
            Some(_) => {
                for (id, n) in found {
                    if batches + events + n + 1 > PRUNE_ROWS_MAX {
                        break;
                    }
                    events += tx.execute("DELETE FROM events WHERE batch_id = ?1", [id])? as i64;
                    batches += tx.execute("DELETE FROM batches WHERE id = ?1", [id])? as i64;
                }
            }
        }
        failpoint::hit("prune.before_commit");
        tx.commit()?;
        Ok((batches, events))
    }

    fn delete_up_to(&mut self, sql: &str, args: impl super::db::Params) -> Result<i64> {
        let tx = self.begin()?;
        let n = tx.execute(sql, args)? as i64;
        tx.commit()?;
        Ok(n)
    }
}

/// One step of one batch's deletion, inside `tx`: the whole batch when its `n` events and
/// its row fit in [`PRUNE_ROWS_MAX`], else [`PRUNE_ROWS_MAX`] of its events (oldest first),
/// the batch made `dropped` / [`PRUNING_RESULT`] if it is not yet (see the module doc).
/// Returns (batches, events) deleted.
fn prune_one_batch_tx(tx: &super::db::Connection, id: i64, n: i64, now: f64) -> Result<(i64, i64)> {
    if n < PRUNE_ROWS_MAX {
        let events = tx.execute("DELETE FROM events WHERE batch_id = ?1", [id])? as i64;
        let batches = tx.execute("DELETE FROM batches WHERE id = ?1", [id])? as i64;
        return Ok((batches, events));
    }
    tx.execute(
        "UPDATE batches SET state = 'dropped', finished = 1, result = ?2,
                dropped_at = coalesce(dropped_at, ?3)
         WHERE id = ?1 AND NOT (state = 'dropped' AND result IS ?2)",
        params![id, PRUNING_RESULT, now],
    )?;
    let events = tx.execute(
        "DELETE FROM events WHERE id IN
           (SELECT id FROM events WHERE batch_id = ?1 ORDER BY id LIMIT ?2)",
        params![id, PRUNE_ROWS_MAX],
    )? as i64;
    Ok((0, events))
}
