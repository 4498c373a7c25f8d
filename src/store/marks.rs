//! Recording attempt results (spec 6.2, 6.5, 6.6): fenced marks, the attempt counter, emits
//! committed with the mark, the destination rows a result changes, and the attempt history
//! the dispatcher's rules read (poison strikes, consecutive throttles, a previous bad emit).
//! Also the dispatcher's heartbeat.
//!
//! Invariants: a mark applies only while the batch is still leased to the reporting owner;
//! a result that lost its lease (discarded) changes its own attempt row and nothing else
//! (no batch column, no destination row, no emit); a destination row is read and written
//! back inside the one transaction that records the results which change it, so an
//! operator's pause committed meanwhile is never overwritten. The rules themselves (which
//! mark, which breaker change) are the dispatcher's: it decides inside the transaction from
//! the row as the transaction sees it. Must not: read the clock.

use std::collections::HashMap;

use super::db::Connection;
use rusqlite::params;

use super::cached::{exec, in_savepoint_if, one_row, planned_with, row};
use super::delivery::{
    DestinationRow, Redue, destination_for_update, destination_tx, redue_tx, save_destination_tx,
};
use super::enqueue::{EnqueueRequest, enqueue_one};
use super::{Result, Store, StoreError, set_meta_tx};
use crate::failpoint;
use crate::vocab::{AttemptOutcome, BatchState, Klass};

/// What lease recovery writes into `last_error` and the attempt's `error`: the fixed phrase
/// the history reads below skip.
pub const LEASE_EXPIRED: &str = "lease expired";

/// The exit status a bad emit is recorded with: only a script that exited 0 has its emits
/// read, and every other batch-class failure carries a non-zero status or none (a signal,
/// stdout over its cap). So (klass batch, status 0) is how the "bad emit twice, then
/// permanent" rule (spec 6.5, 6.6) recognises an earlier bad emit without parsing text.
pub const BAD_EMIT_STATUS: i64 = 0;

/// What a worker's result does to its batch.
#[derive(Debug, Clone, PartialEq)]
pub enum Mark {
    Delivered {
        result: Option<String>,
        /// Script emits, enqueued in the same transaction as the mark (spec 6.6).
        emits: Vec<EnqueueRequest>,
    },
    Retry {
        klass: Klass,
        next_attempt_at: f64,
    },
    /// `Klass::Batch` is a batch dead at max_attempts; `Permanent` and `Poison` the others.
    Dead {
        klass: Klass,
    },
}

impl Mark {
    /// Whether this attempt counts (spec 6.5's table: ok and batch-class failures, the one
    /// that exhausts max_attempts included; transport, throttle, config, permanent and
    /// poison do not). A probe is never counted (spec 4.2).
    pub fn counted(&self, probe: bool) -> bool {
        if probe {
            return false;
        }
        match self {
            Mark::Delivered { .. } => true,
            Mark::Retry { klass, .. } | Mark::Dead { klass } => *klass == Klass::Batch,
        }
    }

    /// The batch state the mark moves to.
    pub fn state(&self) -> BatchState {
        match self {
            Mark::Delivered { .. } => BatchState::Delivered,
            Mark::Retry { .. } => BatchState::Retry,
            Mark::Dead { .. } => BatchState::Dead,
        }
    }

    fn klass(&self) -> Option<Klass> {
        match self {
            Mark::Delivered { .. } => None,
            Mark::Retry { klass, .. } | Mark::Dead { klass } => Some(*klass),
        }
    }

    fn outcome(&self) -> AttemptOutcome {
        match self {
            Mark::Delivered { .. } => AttemptOutcome::Ok,
            Mark::Retry { .. } => AttemptOutcome::Retry,
            Mark::Dead { .. } => AttemptOutcome::Dead,
        }
    }

    fn has_emits(&self) -> bool {
        matches!(self, Mark::Delivered { emits, .. } if !emits.is_empty())
    }
}

/// The facts of one finished attempt.
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptReport {
    pub batch_id: i64,
    pub attempt_id: i64,
    pub lease_owner: String,
    pub now: f64,
    pub status: Option<i64>,
    /// Scrubbed detail for last_error / attempts.error (never a body or secret).
    pub error: Option<String>,
    pub duration_ms: i64,
    pub delivery_id: Option<String>,
    pub events_delivered: Option<i64>,
    pub failed_event_id: Option<i64>,
    pub mark: Mark,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkResult {
    Applied,
    /// The worker had lost its lease; the attempt is recorded as `discarded` and the
    /// outcome (emits included) was not applied (spec 6.2).
    Discarded,
}

/// One result as `record_results` recorded it: the report it wrote (the second one when
/// the store refused the first one's emits) and whether the fence held.
#[derive(Debug, Clone, PartialEq)]
pub struct Recorded {
    pub report: AttemptReport,
    pub result: MarkResult,
    /// The store's reason for refusing the first report's emits, when it did.
    pub emits_refused: Option<String>,
    /// How many of the destination's retries its `Decision::recovered` made due now.
    pub redue: usize,
}

/// The caller's decision for one result of `record_results`: the report to write, and
/// whether the result proved its destination healthy again (its breaker closed), so that
/// the destination's transport- and throttle-class retries are due now
/// (`Redue::Recovered`), in the same transaction, once the mark applies.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub report: AttemptReport,
    pub recovered: bool,
}

impl From<AttemptReport> for Decision {
    fn from(report: AttemptReport) -> Decision {
        Decision {
            report,
            recovered: false,
        }
    }
}

/// One earlier attempt of a batch, as the history rules read it.
struct Past {
    started_at: f64,
    finished_at: f64,
    outcome: AttemptOutcome,
    klass: Option<Klass>,
    status: Option<i64>,
}

impl Store {
    /// Record one attempt's result, fenced by lease_owner (spec 6.2), with no destination
    /// change. Emits of a delivered mark are enqueued in the same transaction, so either the
    /// script's effects are recorded and the batch is done, or neither (spec 6.6); emits the
    /// store refuses fail the whole mark.
    pub fn mark(&mut self, rep: &AttemptReport) -> Result<MarkResult> {
        let tx = self.begin()?;
        let r = mark_tx(&tx, rep)?;
        tx.commit()?;
        Ok(r)
    }

    /// Record several finished attempts in ONE transaction (one fsync per loop turn of the
    /// dispatcher). For result `i`, `decide(i, row, refused)` is handed the destination row
    /// of `destinations[i]` as this transaction sees it (after the earlier results of the
    /// same call) and returns the report to write (`Decision`), changing the row as the
    /// result requires (breaker, Retry-After). The row change, and the retries a recovered
    /// destination makes due (`Decision::recovered`), are kept only when the mark applies: a
    /// discarded result changes nothing but its own attempt row. When the store refuses the
    /// report's emits, that report is rolled back alone (its SAVEPOINT) and `decide` is
    /// asked again with the store's reason, for the bad-emit record that replaces it.
    /// A busy or full database fails the whole call with nothing written, so the caller
    /// keeps every result and retries. Results follow `destinations`.
    ///
    /// `decide` may be asked more than once for a result: on PostgreSQL every result is
    /// decided first to try writing them in one statement (`record_at_once_pg`), and asked
    /// again, `refused` None, when they are then recorded one by one. So it must have no
    /// effect but its answer and the row it is handed; the last answer for each `i` is the
    /// one written.
    ///
    /// In a transaction of its own on PostgreSQL, the last destination row written and the
    /// COMMIT go in one write (`mark.before_commit` then comes after the commit).
    pub fn record_results<F>(
        &mut self,
        destinations: &[&str],
        mut decide: F,
    ) -> Result<Vec<Recorded>>
    where
        F: FnMut(usize, &mut DestinationRow, Option<&str>) -> Decision,
    {
        let tx = self.begin()?;
        // Every destination row first, in name order, as every writer that locks several
        // takes them (`destination_for_update`): two such transactions never wait on each
        // other in a circle.
        let mut names = destinations.to_vec();
        names.sort_unstable();
        names.dedup();
        let mut rows: HashMap<&str, (DestinationRow, bool)> = HashMap::new();
        for name in names {
            rows.insert(name, (destination_for_update(&tx, name)?, false));
        }
        // On PostgreSQL, several marks without emits go in one statement when they all
        // apply (`record_at_once_pg`); otherwise, and on SQLite, one by one.
        let at_once = if tx.is_pg() && destinations.len() > 1 {
            record_at_once_pg(&tx, destinations, &mut rows, &mut decide)?
        } else {
            None
        };
        let out = match at_once {
            Some(out) => out,
            None => record_one_by_one(&tx, destinations, &mut rows, &mut decide)?,
        };
        let changed: Vec<&DestinationRow> = rows
            .values()
            .filter(|(_, changed)| *changed)
            .map(|(row, _)| row)
            .collect();
        for (i, row) in changed.iter().enumerate() {
            if i + 1 == changed.len() {
                // On PostgreSQL the last write and the COMMIT go in one write.
                tx.commit_with_next();
            }
            save_destination_tx(&tx, row)?;
        }
        failpoint::hit("mark.before_commit");
        tx.commit()?;
        Ok(out)
    }

    /// Read a destination row, change it, and write it back in one transaction, so a change
    /// committed by another process in between (an operator's pause) is seen, never
    /// overwritten. Written only when `change` changed it. Returns the row as written.
    pub fn update_destination(
        &mut self,
        name: &str,
        change: impl FnOnce(&mut DestinationRow),
    ) -> Result<DestinationRow> {
        let tx = self.begin()?;
        let before = destination_for_update(&tx, name)?;
        let mut row = before.clone();
        change(&mut row);
        if row != before {
            save_destination_tx(&tx, &row)?;
        }
        tx.commit()?;
        Ok(row)
    }

    /// The poison rule's strike count (spec 4.2) for a transport failure of `batch_id` that
    /// started at `started_at`: how many consecutive transport failures of this batch, this
    /// one included, each came after the destination accepted another batch since the
    /// batch's previous failure. Expired leases and discarded results are skipped; any other
    /// outcome ends the run.
    pub fn poison_strikes(&self, batch_id: i64, destination: &str, started_at: f64) -> Result<i64> {
        let history = history(&self.conn, batch_id, started_at)?;
        let mut strikes = 0;
        let mut later_start = started_at;
        let mut accepted = self.conn.prepare_cached(
            "SELECT 1 FROM attempts WHERE destination = ?1 AND batch_id != ?2 AND outcome = ?5
               AND finished_at > ?3 AND finished_at <= ?4 LIMIT 1",
        )?;
        for past in history {
            if past.outcome != AttemptOutcome::Retry || past.klass != Some(Klass::Transport) {
                break;
            }
            let ok = accepted.exists(params![
                destination,
                batch_id,
                past.finished_at,
                later_start,
                AttemptOutcome::Ok
            ])?;
            if !ok {
                break;
            }
            strikes += 1;
            later_start = past.started_at;
        }
        Ok(strikes)
    }

    /// How many of this batch's attempts before `started_at`, newest first, were throttled
    /// in a row (spec 6.5: a throttle without Retry-After backs off on these).
    pub fn consecutive_throttles(&self, batch_id: i64, started_at: f64) -> Result<i64> {
        Ok(history(&self.conn, batch_id, started_at)?
            .iter()
            .take_while(|p| p.outcome == AttemptOutcome::Retry && p.klass == Some(Klass::Throttle))
            .count() as i64)
    }

    /// Since when `destination` has answered `batch_id` only throttles, as the spool knows
    /// it: the start of the batch's run of throttled attempts before `started_at`, or the
    /// destination's last success when that came later. `None` when the run is empty. The
    /// dispatcher keeps this in memory; a new process reads it here once per destination,
    /// so a restart does not restart `dispatch.throttle_alert_s`.
    pub fn throttled_since(
        &self,
        batch_id: i64,
        destination: &str,
        started_at: f64,
    ) -> Result<Option<f64>> {
        let run_start = history(&self.conn, batch_id, started_at)?
            .iter()
            .take_while(|p| p.outcome == AttemptOutcome::Retry && p.klass == Some(Klass::Throttle))
            .last()
            .map(|p| p.started_at);
        let Some(run_start) = run_start else {
            return Ok(None);
        };
        let last_ok_at = destination_tx(&self.conn, destination)?.last_ok_at;
        Ok(Some(last_ok_at.map_or(run_start, |ok| ok.max(run_start))))
    }

    /// Whether this batch's attempt before `started_at` was a bad emit (see
    /// [`BAD_EMIT_STATUS`]).
    pub fn previous_was_bad_emit(&self, batch_id: i64, started_at: f64) -> Result<bool> {
        Ok(history(&self.conn, batch_id, started_at)?
            .first()
            .is_some_and(|p| {
                p.outcome == AttemptOutcome::Retry
                    && p.klass == Some(Klass::Batch)
                    && p.status == Some(BAD_EMIT_STATUS)
            }))
    }

    /// The dispatcher's heartbeat (spec 2, 11.1), in one transaction: the wall-clock time
    /// the intake's /healthz ages, the clock guard `last_tick_at`, and what only the
    /// dispatcher's memory holds (per-destination in-flight counts, busy retries) as JSON
    /// for `status`.
    pub fn heartbeat(&mut self, wall: f64, last_tick_at: f64, published: &str) -> Result<()> {
        let tx = self.begin()?;
        set_meta_tx(&tx, "dispatcher_heartbeat_at", &wall.to_string())?;
        set_meta_tx(&tx, "last_tick_at", &last_tick_at.to_string())?;
        set_meta_tx(&tx, "dispatcher_published", published)?;
        tx.commit()?;
        Ok(())
    }
}

/// The destination rows of `record_results`, each with whether a result changed it.
type LockedRows<'n> = HashMap<&'n str, (DestinationRow, bool)>;

/// `record_results`' results one at a time: each result's `decide` sees the row as the
/// results before it left it, a discarded result changes nothing but its attempt row, and a
/// mark whose emits the store refuses is undone alone and decided again.
fn record_one_by_one<'n, F>(
    tx: &Connection,
    destinations: &[&'n str],
    rows: &mut LockedRows<'n>,
    decide: &mut F,
) -> Result<Vec<Recorded>>
where
    F: FnMut(usize, &mut DestinationRow, Option<&str>) -> Decision,
{
    let mut out = Vec::with_capacity(destinations.len());
    for (i, &name) in destinations.iter().enumerate() {
        // Every name of `destinations` was read above.
        let current = rows[name].0.clone();
        let mut scratch = current.clone();
        let Decision {
            report,
            mut recovered,
        } = decide(i, &mut scratch, None);
        // A mark with emits that fails is undone alone (its savepoint rolled back), to be
        // recorded again without them. Any other failure ends the call and the whole
        // transaction is rolled back with `tx`, so such a mark needs no savepoint of its
        // own: one per mark made SQLite copy the pages earlier marks had changed into its
        // undo journal, and ran two more statements per result.
        let marked = if report.mark.has_emits() {
            in_savepoint_if(tx, || mark_tx(tx, &report), |r| r.is_ok())?
        } else {
            mark_tx(tx, &report)
        };
        let mut recorded = match marked {
            Ok(result) => Recorded {
                report,
                result,
                emits_refused: None,
                redue: 0,
            },
            Err(e) if e.is_weather() => return Err(e),
            // The emits are the only input of a mark that the store can refuse; a
            // mark without emits that fails is a bug and stops the caller.
            Err(e) if report.mark.has_emits() => {
                let why = e.to_string();
                scratch = current.clone();
                let replacement = decide(i, &mut scratch, Some(&why));
                if replacement.report.mark.has_emits() {
                    return Err(StoreError::Invalid(format!(
                        "batch {}: a refused emit was answered with emits again",
                        report.batch_id
                    )));
                }
                recovered = replacement.recovered;
                let result = mark_tx(tx, &replacement.report)?;
                Recorded {
                    report: replacement.report,
                    result,
                    emits_refused: Some(why),
                    redue: 0,
                }
            }
            Err(e) => return Err(e),
        };
        if recorded.result == MarkResult::Applied {
            if scratch != current
                && let Some(slot) = rows.get_mut(name)
            {
                *slot = (scratch, true);
            }
            if recovered {
                recorded.redue = redue_tx(tx, Redue::Recovered(name), recorded.report.now)?;
            }
        }
        out.push(recorded);
    }
    Ok(out)
}

/// PostgreSQL's marks, one or several without emits, in one statement: for each report the
/// attempt's probe flag read, the batch locked (in the order of `?1`, by id) and the fence
/// decided on it (still leased, to this owner), the batch updated when it held and the
/// attempt row finished as it decided (`discarded` when it did not); a batch is changed
/// only when its attempt exists, and a probe never counts. Rows are found by primary key
/// alone: each attempt in a subquery of its own (`LIMIT 1` keeps it one), the rows to
/// update by `id = ANY(ARRAY(...))`; as joins, or with a state condition beside the id,
/// the planner of a spool not yet analyzed hashed the whole attempts table or walked
/// `batches_retention` through every leased batch's entries. It answers how many attempts
/// it found, how many batches it changed (the fence held) and how many attempts it
/// finished.
const MARK_MANY_PG_SQL: &str = "WITH x AS (
         SELECT * FROM json_to_recordset(?1) AS x(
             attempt_id bigint, batch_id bigint, lease_owner text, now double precision,
             kind text, outcome text, klass text, status bigint, error text,
             duration_ms bigint, delivery_id text, events_delivered bigint,
             failed_event_id bigint, counted bigint, state text, result text,
             next_attempt_at double precision)),
     p AS (
         SELECT x.*, t.probe,
                coalesce(bb.state = 'leased' AND bb.lease_owner = x.lease_owner, false) AS fenced
         FROM x
         CROSS JOIN LATERAL (SELECT probe FROM attempts
                             WHERE id = x.attempt_id AND batch_id = x.batch_id LIMIT 1) t
         LEFT JOIN LATERAL (SELECT state, lease_owner FROM batches WHERE id = x.batch_id
                            FOR UPDATE) bb ON true),
     b AS (UPDATE batches t SET state = p.state,
                  finished = CASE WHEN p.kind = 'retry' THEN t.finished ELSE 1 END,
                  delivered_at = CASE WHEN p.kind = 'delivered' THEN p.now ELSE t.delivered_at END,
                  result = CASE WHEN p.kind = 'delivered' THEN p.result ELSE t.result END,
                  next_attempt_at = CASE WHEN p.kind = 'retry' THEN p.next_attempt_at
                                         ELSE t.next_attempt_at END,
                  last_class = p.klass,
                  last_error = CASE WHEN p.kind = 'delivered' THEN NULL ELSE p.error END,
                  lease_until = NULL, lease_owner = NULL,
                  attempts = t.attempts + CASE WHEN p.probe = 0 THEN p.counted ELSE 0 END
           FROM p WHERE t.id = ANY(ARRAY(SELECT batch_id FROM p WHERE fenced))
                    AND t.id = p.batch_id AND p.fenced
           RETURNING t.id),
     a AS (UPDATE attempts t SET finished_at = p.now,
                  outcome = CASE WHEN EXISTS (SELECT 1 FROM b WHERE b.id = p.batch_id)
                                 THEN p.outcome ELSE 'discarded' END,
                  klass = p.klass, status = p.status, error = p.error,
                  duration_ms = p.duration_ms,
                  counted = CASE WHEN EXISTS (SELECT 1 FROM b WHERE b.id = p.batch_id)
                                      AND p.probe = 0 THEN p.counted ELSE 0 END,
                  delivery_id = coalesce(p.delivery_id, t.delivery_id),
                  events_delivered = p.events_delivered, failed_event_id = p.failed_event_id
           FROM p WHERE t.id = ANY(ARRAY(SELECT attempt_id FROM p)) AND t.id = p.attempt_id
           RETURNING t.id)
     SELECT (SELECT count(*) FROM p), (SELECT count(*) FROM b), (SELECT count(*) FROM a)";

/// How `MARK_MANY_PG_SQL` is planned: by the indexes, whatever the statistics say. On a spool
/// whose attempts were never analyzed (a fresh one, until autovacuum's first pass) the
/// planner takes the table for ten pages, hashes it whole for a join of a few rows, and
/// keeps that plan (bench_dispatch pg: 1.9 ms for a statement of 13 marks on 20 000
/// attempts, against 0.7 ms by the indexes). Set for this statement alone (`planned_with`),
/// but on the dispatcher's recorder, whose session plans this way (`Store::become_recorder`).
const MARK_MANY_PLAN_SQL: &str = "SET LOCAL enable_seqscan = off; SET LOCAL enable_hashjoin = off";
const MARK_MANY_PLAN_RESET_SQL: &str =
    "SET LOCAL enable_seqscan TO DEFAULT; SET LOCAL enable_hashjoin TO DEFAULT";

/// One report of `MARK_MANY_PG_SQL`'s JSON: the arguments `mark_pg` binds.
#[derive(serde::Serialize)]
struct ManyMark<'r> {
    attempt_id: i64,
    batch_id: i64,
    lease_owner: &'r str,
    now: f64,
    kind: &'static str,
    outcome: AttemptOutcome,
    klass: Option<Klass>,
    status: Option<i64>,
    error: Option<&'r str>,
    duration_ms: i64,
    delivery_id: Option<&'r str>,
    events_delivered: Option<i64>,
    failed_event_id: Option<i64>,
    counted: i64,
    state: BatchState,
    result: Option<&'r str>,
    next_attempt_at: Option<f64>,
}

/// What `MARK_MANY_PG_SQL` did: attempts found, batches changed (fence held), attempts
/// finished.
struct MarkedMany {
    found: i64,
    applied: i64,
    finished: i64,
}

/// Mark every report (none with emits, each of its own batch and attempt) in one
/// statement, planned on indexes (`MARK_MANY_PLAN_SQL`).
fn mark_many_pg(tx: &Connection, reports: &[&AttemptReport]) -> Result<MarkedMany> {
    let mut marks: Vec<ManyMark<'_>> = reports
        .iter()
        .map(|rep| {
            let (kind, result, next_attempt_at) = match &rep.mark {
                Mark::Delivered { result, .. } => ("delivered", result.as_deref(), None),
                Mark::Retry {
                    next_attempt_at, ..
                } => ("retry", None, Some(*next_attempt_at)),
                Mark::Dead { .. } => ("dead", None, None),
            };
            ManyMark {
                attempt_id: rep.attempt_id,
                batch_id: rep.batch_id,
                lease_owner: &rep.lease_owner,
                now: rep.now,
                kind,
                outcome: rep.mark.outcome(),
                klass: rep.mark.klass(),
                status: rep.status,
                error: rep.error.as_deref(),
                duration_ms: rep.duration_ms,
                delivery_id: rep.delivery_id.as_deref(),
                events_delivered: rep.events_delivered,
                failed_event_id: rep.failed_event_id,
                counted: rep.mark.counted(false) as i64,
                state: rep.mark.state(),
                result,
                next_attempt_at,
            }
        })
        .collect();
    marks.sort_unstable_by_key(|m| m.batch_id);
    let json = serde_json::to_string(&marks).map_err(|e| StoreError::Invalid(e.to_string()))?;
    let read = || {
        row(tx, MARK_MANY_PG_SQL, params![json], |r| {
            Ok(MarkedMany {
                found: r.get(0)?,
                applied: r.get(1)?,
                finished: r.get(2)?,
            })
        })
    };
    // The dispatcher's recorder plans its whole session this way already.
    let counts = if tx.plans_on_indexes_only() {
        read()?
    } else {
        planned_with(tx, MARK_MANY_PLAN_SQL, MARK_MANY_PLAN_RESET_SQL, read)?
    };
    counts.ok_or_else(|| StoreError::Corrupt("the marks' statement answered no row".into()))
}

#[cfg(test)]
thread_local! {
    /// `record_at_once_pg` on this thread: how many calls sent the statement, and how many
    /// of those kept what it wrote.
    pub(super) static MARKED_AT_ONCE: std::cell::Cell<(usize, usize)> =
        const { std::cell::Cell::new((0, 0)) };
}

/// `record_results` on PostgreSQL in one mark statement, when that gives what one by one
/// would: every result is decided first against the row as the results before it leave it
/// when they apply, and written at once if none has emits or recovers its destination and
/// each is of its own batch. If every mark applied (the usual case: a discarded result is a
/// lost lease), that is what one by one writes; if not, the statement is rolled back (its
/// savepoint) and `None` says to record them one by one, `decide` being asked again. The
/// recorder's marks were one round trip and one statement's execution each, the longest
/// part of its transaction.
fn record_at_once_pg<'n, F>(
    tx: &Connection,
    destinations: &[&'n str],
    rows: &mut LockedRows<'n>,
    decide: &mut F,
) -> Result<Option<Vec<Recorded>>>
where
    F: FnMut(usize, &mut DestinationRow, Option<&str>) -> Decision,
{
    let mut after: HashMap<&str, DestinationRow> =
        rows.iter().map(|(n, (r, _))| (*n, r.clone())).collect();
    let mut decisions = Vec::with_capacity(destinations.len());
    for (i, &name) in destinations.iter().enumerate() {
        let Some(row) = after.get_mut(name) else {
            return Err(StoreError::Invalid(format!(
                "destination {name} was not read before its results"
            )));
        };
        decisions.push(decide(i, row, None));
    }
    let mut batches: Vec<i64> = decisions.iter().map(|d| d.report.batch_id).collect();
    batches.sort_unstable();
    batches.dedup();
    // A recovered destination makes its waiting retries due before the next result is
    // marked (a retry marked after it keeps its own time): one by one, as is an emit.
    if batches.len() != decisions.len()
        || decisions
            .iter()
            .any(|d| d.recovered || d.report.mark.has_emits())
    {
        return Ok(None);
    }
    let reports: Vec<&AttemptReport> = decisions.iter().map(|d| &d.report).collect();
    #[cfg(test)]
    MARKED_AT_ONCE.with(|n| n.set((n.get().0 + 1, n.get().1)));
    // Every attempt found, every fence held, every attempt finished: as one by one.
    let n = reports.len() as i64;
    let all = |m: &MarkedMany| (m.found, m.applied, m.finished) == (n, n, n);
    let marked = in_savepoint_if(
        tx,
        || mark_many_pg(tx, &reports),
        |r| r.as_ref().is_ok_and(all),
    )??;
    if !all(&marked) {
        return Ok(None);
    }
    #[cfg(test)]
    MARKED_AT_ONCE.with(|n| n.set((n.get().0, n.get().1 + 1)));
    let out = decisions
        .into_iter()
        .map(|d| Recorded {
            report: d.report,
            result: MarkResult::Applied,
            emits_refused: None,
            redue: 0,
        })
        .collect();
    for (name, row) in after {
        if let Some(slot) = rows.get_mut(name)
            && slot.0 != row
        {
            *slot = (row, true);
        }
    }
    Ok(Some(out))
}

/// A batch's finished attempts that started before `before`, newest first, without the
/// rows that say nothing about the destination's answer: results discarded after a lost
/// lease, and leases recovered after a crash.
fn history(conn: &Connection, batch_id: i64, before: f64) -> Result<Vec<Past>> {
    let mut stmt = conn.prepare_cached(
        "SELECT started_at, finished_at, outcome, klass, status FROM attempts
         WHERE batch_id = ?1 AND finished_at IS NOT NULL AND started_at < ?2
           AND outcome != ?3 AND coalesce(error, '') != ?4
         ORDER BY id DESC",
    )?;
    let rows = stmt
        .query_map(
            params![batch_id, before, AttemptOutcome::Discarded, LEASE_EXPIRED],
            |r| {
                Ok(Past {
                    started_at: r.get(0)?,
                    finished_at: r.get(1)?,
                    outcome: r.get(2)?,
                    klass: r.get(3)?,
                    status: r.get(4)?,
                })
            },
        )?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(rows)
}

/// One mark inside the caller's transaction. The fence is the batch's lease_owner: a
/// result whose owner lost the lease completes its own attempt row as discarded and writes
/// nothing else.
fn mark_tx(tx: &Connection, rep: &AttemptReport) -> Result<MarkResult> {
    let marked = if tx.is_pg() {
        mark_pg(tx, rep)?
    } else {
        mark_lite(tx, rep)?
    };
    let Some((result, finished)) = marked else {
        return Err(StoreError::NotFound(format!(
            "attempt {} of batch {}",
            rep.attempt_id, rep.batch_id
        )));
    };
    one_row(finished, || {
        format!(
            "finishing attempt {} of batch {}",
            rep.attempt_id, rep.batch_id
        )
    })?;
    if result == MarkResult::Applied
        && let Mark::Delivered { emits, .. } = &rep.mark
    {
        for emit in emits {
            enqueue_one(tx, emit)?;
        }
        failpoint::hit("mark.after_emits");
    }
    Ok(result)
}

/// The mark's result and how many attempt rows it finished (1), or `None` when the batch
/// has no such attempt (then nothing is written): `mark_pg` and `mark_lite`.
type Marked = Option<(MarkResult, usize)>;

/// A PostgreSQL mark: `MARK_MANY_PG_SQL` with one report (one statement, one round trip;
/// the dispatcher's engine waits for each), what `mark_lite` does in three.
fn mark_pg(tx: &Connection, rep: &AttemptReport) -> Result<Marked> {
    let m = mark_many_pg(tx, &[rep])?;
    if m.found == 0 {
        return Ok(None);
    }
    let result = if m.applied == 1 {
        MarkResult::Applied
    } else {
        MarkResult::Discarded
    };
    Ok(Some((result, m.finished as usize)))
}

/// A mark in three statements (SQLite, in-process: each is a function call).
fn mark_lite(tx: &Connection, rep: &AttemptReport) -> Result<Marked> {
    let Some(probe) = row(
        tx,
        "SELECT probe FROM attempts WHERE id = ?1 AND batch_id = ?2",
        params![rep.attempt_id, rep.batch_id],
        |r| r.get::<_, i64>(0).map(|p| p != 0),
    )?
    else {
        return Ok(None);
    };
    let counted = rep.mark.counted(probe);
    let applied = match &rep.mark {
        Mark::Delivered { result, .. } => exec(
            tx,
            "UPDATE batches SET state = ?3, finished = 1, delivered_at = ?4, result = ?5,
                    attempts = attempts + ?6, last_class = NULL, last_error = NULL,
                    lease_until = NULL, lease_owner = NULL
             WHERE id = ?1 AND state = 'leased' AND lease_owner = ?2",
            params![
                rep.batch_id,
                rep.lease_owner,
                BatchState::Delivered,
                rep.now,
                result,
                counted as i64
            ],
        )?,
        Mark::Retry {
            klass,
            next_attempt_at,
        } => exec(
            tx,
            "UPDATE batches SET state = ?3, next_attempt_at = ?4,
                    attempts = attempts + ?5, last_class = ?6, last_error = ?7,
                    lease_until = NULL, lease_owner = NULL
             WHERE id = ?1 AND state = 'leased' AND lease_owner = ?2",
            params![
                rep.batch_id,
                rep.lease_owner,
                BatchState::Retry,
                next_attempt_at,
                counted as i64,
                klass,
                rep.error
            ],
        )?,
        Mark::Dead { klass } => exec(
            tx,
            "UPDATE batches SET state = ?3, finished = 1, attempts = attempts + ?4,
                    last_class = ?5, last_error = ?6, lease_until = NULL, lease_owner = NULL
             WHERE id = ?1 AND state = 'leased' AND lease_owner = ?2",
            params![
                rep.batch_id,
                rep.lease_owner,
                BatchState::Dead,
                counted as i64,
                klass,
                rep.error
            ],
        )?,
    };
    let result = if applied == 1 {
        MarkResult::Applied
    } else {
        MarkResult::Discarded
    };
    let outcome = match result {
        MarkResult::Applied => rep.mark.outcome(),
        MarkResult::Discarded => AttemptOutcome::Discarded,
    };
    let n = exec(
        tx,
        "UPDATE attempts SET finished_at = ?2, outcome = ?3, klass = ?4, status = ?5,
                error = ?6, duration_ms = ?7, counted = ?8,
                delivery_id = coalesce(?9, delivery_id),
                events_delivered = ?10, failed_event_id = ?11
         WHERE id = ?1",
        params![
            rep.attempt_id,
            rep.now,
            outcome,
            rep.mark.klass(),
            rep.status,
            rep.error,
            rep.duration_ms,
            (counted && result == MarkResult::Applied) as i64,
            rep.delivery_id,
            rep.events_delivered,
            rep.failed_event_id
        ],
    )?;
    Ok(Some((result, n)))
}
