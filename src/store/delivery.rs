//! Delivery bookkeeping (spec 5, 6): readiness sealing, the FIFO-per-group candidate query,
//! claims fenced by lease_owner (the attempt row written before the request), lease
//! recovery, and the destination rows (the breaker's persisted state; its rules live in
//! the dispatcher). Recording results is `marks`.

use super::db::{Connection, Row};
use rusqlite::params;
use rusqlite::types::Value;

use super::cached::{Step, each_in_savepoints, exec, one_row, planned_with, row};

use super::content::{CanonicalEvent, content_hash};
use super::marks::LEASE_EXPIRED;
use super::query::{BATCH_COLUMNS, BatchRow};
use super::{Result, Store, StoreError};
use crate::failpoint;
use crate::vocab::{AttemptOutcome, BatchState, BreakerState, Klass};
use std::collections::HashMap;

/// The queries of one dispatcher tick, named so a benchmark can print their plans without a
/// copy of their text (`TICK_QUERIES`). Readiness of open batches (spec 5), each term on an
/// index of its expression, so the cost follows the ready batches, not the open ones.
pub const SEAL_READY_SQL: &str =
    "SELECT id FROM batches WHERE state = 'open' AND quiet_s + max_s <= 0
     UNION SELECT id FROM batches WHERE state = 'open' AND last_at + quiet_s <= ?1
     UNION SELECT id FROM batches WHERE state = 'open' AND first_at + max_s <= ?1
     ORDER BY 1";
/// On PostgreSQL, the batches `SEAL_READY_SQL` finds, locked in id order, each only if it
/// is still open and ready once its lock is taken (PostgreSQL checks the outer conditions
/// again on the row an intake's commit left), each beside its events (as
/// `canonical_events` reads them; NULLs for a batch whose events are all excluded), in
/// batch and event order: a seal's find, lock and reads in one statement where a find, a
/// lock and a read per batch were. The ready ids are an array computed first (each term on
/// its index), then looked up by primary key: as `id IN (...)` the planner hashed every
/// open batch.
///
/// A ready batch whose `open_hash` is set (PostgreSQL schema 7: the intake that opened it
/// stored the hash of its events, and nothing changed them since) is sealed with that hash
/// by this statement (`quick`), its row alone in the result with `true` in column 1; the
/// others come with their events and `false`, for the caller to hash and seal
/// (`SEAL_ALL_PG_SQL`). `ready` returns each row as its lock found it: a batch an intake
/// joined while the lock waited carries the NULL that join wrote, so its events are read.
/// Every ready batch is locked in one pass in id order, as the intake's group path locks
/// its group's open batches.
///
/// The events are read by `batch_events_now` (PostgreSQL schema 6), called for each batch
/// once its lock is held: a join would read them as of the statement's start, and miss an
/// event an intake committed into the batch while the lock waited for it (PostgreSQL checks
/// the batch's row again, not the other tables), so the hash would not cover it.
static SEAL_READY_EVENTS_PG_SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "WITH ready AS (
             SELECT id, open_hash FROM batches
             WHERE id = ANY(ARRAY({SEAL_READY_SQL}))
               AND state = 'open'
               AND (quiet_s + max_s <= 0 OR last_at + quiet_s <= ?1 OR first_at + max_s <= ?1)
             ORDER BY id
             FOR UPDATE),
         quick AS (
             UPDATE batches b SET state = 'sealed', sealed_at = ?1, content_hash = r.open_hash
             FROM ready r
             WHERE b.id = ANY(ARRAY(SELECT id FROM ready WHERE open_hash IS NOT NULL))
               AND b.id = r.id
             RETURNING b.id)
         SELECT q.id, true, NULL::bigint, NULL::text, NULL::float8, NULL::text, NULL::text
         FROM quick q
         UNION ALL
         SELECT r.id, false, e.id, e.event_type, e.received_at, e.dedup_id, e.payload
         FROM ready r LEFT JOIN LATERAL batch_events_now(r.id) e ON true
         WHERE r.open_hash IS NULL
         ORDER BY 1, 3"
    )
});
/// On PostgreSQL, every seal of a tick in one statement: `?1` a JSON list of (id, hash)
/// records, `?2` the time. The rows are those `SEAL_READY_EVENTS_PG_SQL` found open and
/// locked, so they are found by primary key alone (a state condition here could lead the
/// planner of a spool not yet analyzed to walk a partial index of every open batch).
const SEAL_ALL_PG_SQL: &str =
    "WITH r AS (SELECT * FROM json_to_recordset(?1) AS r(id bigint, hash text))
     UPDATE batches b SET state = 'sealed', sealed_at = ?2, content_hash = r.hash
     FROM r WHERE b.id = ANY(ARRAY(SELECT id FROM r)) AND b.id = r.id";
/// Leased batches, for lease recovery.
pub const LEASED_SQL: &str =
    "SELECT id, lease_owner, lease_until FROM batches WHERE state = 'leased'";
/// Heads of groups that may be claimed, oldest first (spec 6.1), among the first
/// `?3` rows of the partial FIFO index: the walk stops at its LIMIT instead of sorting a
/// backlog, and at `?3` rows when the backlog sits on few keys (then `HEAD_NEXT_KEY_SQL`
/// and `HEAD_NEXT_ROUTE_SQL` answer).
///
/// The head of a group is its unfinished batch holding the earliest committed event
/// (`first_event_id`, the smallest events.id of the batch; one probe of `batches_heads`), so
/// per-key order is commit order. `first_at` orders the groups but cannot order the batches
/// within one: it is the `now` a writer read before it took the write lock, so with
/// concurrent writers (two intakes, the CLI, script emits, the intake's own async handlers)
/// a batch created after another can carry an earlier `first_at`, and was delivered first,
/// before events committed ahead of its own (found by the live concurrency test). Split
/// parts keep their events, so they stay at the head.
pub const CANDIDATES_SQL: &str =
    "SELECT b.id, b.route, b.key, b.destination, b.state, b.first_at, b.attempts
             FROM (SELECT * FROM batches INDEXED BY batches_claimable
                   WHERE state IN ('sealed', 'retry')
                   ORDER BY first_at, id LIMIT ?3) b
             WHERE (b.state = 'sealed' OR b.next_attempt_at <= ?1)
               AND (b.not_before IS NULL OR b.not_before <= ?1)
               AND NOT EXISTS (
                   SELECT 1 FROM batches o INDEXED BY batches_heads
                   WHERE o.route = b.route AND o.key = b.key
                     AND o.finished = 0
                     AND o.first_event_id < b.first_event_id)
             ORDER BY b.first_at, b.id
             LIMIT ?2";
/// The head of the next group after (`?1`, `?2`) in (route, key) order within route `?1`:
/// one seek of `batches_heads`, whose first entry for a group is its head. Stepping from
/// group to group finds every head at a cost that follows the number of groups, not of
/// their batches. (A row-value `(route, key) > (?1, ?2)` is planned as a seek too but
/// measured 12x slower: it compares row values over the rest of the route.)
pub const HEAD_NEXT_KEY_SQL: &str =
    "SELECT id, route, key, destination, state, first_at, attempts, next_attempt_at, not_before
             FROM batches INDEXED BY batches_heads
             WHERE finished = 0
               AND route = ?1 AND key > ?2
             ORDER BY key, first_event_id
             LIMIT 1";
/// The head of the first group of the next route after `?1` (see `HEAD_NEXT_KEY_SQL`).
pub const HEAD_NEXT_ROUTE_SQL: &str =
    "SELECT id, route, key, destination, state, first_at, attempts, next_attempt_at, not_before
             FROM batches INDEXED BY batches_heads
             WHERE finished = 0
               AND route > ?1
             ORDER BY route, key, first_event_id
             LIMIT 1";
/// Every group's head in one statement, for PostgreSQL: the walk of `HEAD_NEXT_KEY_SQL` and
/// `HEAD_NEXT_ROUTE_SQL` as a recursive query (a skip scan of `batches_heads`, one seek per
/// group, the row-value comparison an index condition there), so a backlog on 50 keys is one
/// round trip to the server instead of 51.
pub const HEADS_PG_SQL: &str = "WITH RECURSIVE heads AS (
         (SELECT id, route, key, destination, state, first_at, attempts, next_attempt_at,
                 not_before
          FROM batches WHERE finished = 0
          ORDER BY route, key, first_event_id LIMIT 1)
       UNION ALL
         SELECT n.* FROM heads h CROSS JOIN LATERAL (
             SELECT id, route, key, destination, state, first_at, attempts, next_attempt_at,
                    not_before
             FROM batches WHERE finished = 0 AND (route, key) > (h.route, h.key)
             ORDER BY route, key, first_event_id LIMIT 1) n
     )
     SELECT id, route, key, destination, state, first_at, attempts, next_attempt_at, not_before
     FROM heads";
/// The rows `CANDIDATES_SQL` walks: the first `?3` of `batches_claimable`.
const CANDIDATES_WALK: &str = "(SELECT * FROM batches INDEXED BY batches_claimable
                   WHERE state IN ('sealed', 'retry')
                   ORDER BY first_at, id LIMIT ?3) b";
/// The values `CANDIDATES_COUNTED_PG_SQL` takes for `candidate_prefix(now, limit)`.
fn walk_pg_values(now: f64, limit: usize) -> Vec<Value> {
    let walk = walk_rows(limit) as i64;
    vec![
        Value::Real(now),
        Value::Integer(limit as i64),
        Value::Integer(walk),
        Value::Integer(walk + 1),
    ]
}

/// The rows of `batches_claimable` the FIFO walk for `limit` heads reads.
fn walk_rows(limit: usize) -> usize {
    limit.saturating_mul(CANDIDATE_WALK_PER_LIMIT).max(1)
}

/// Whether a walk for `limit` heads that found `heads` among rows of which `claimable` (at
/// most the walk's rows and one) were claimable saw every head: it found `limit`, or it
/// read every claimable row.
fn walk_exact(heads: usize, claimable: i64, limit: usize) -> bool {
    heads >= limit || claimable <= walk_rows(limit) as i64
}

/// `CANDIDATES_COUNTED_PG_SQL`'s one plan for every call (`planned_with`): its custom plans
/// (each call's limits known) are so much cheaper on paper than a generic one that
/// PostgreSQL planned it anew at every call, 0.3 - 0.4 ms a tick (pg_stat_statements during
/// bench_dispatch pg), for the same index walk.
const CANDIDATES_PLAN_SQL: &str = "SET LOCAL plan_cache_mode = force_generic_plan";
/// The setting back after `CANDIDATES_COUNTED_PG_SQL`.
const CANDIDATES_PLAN_RESET_SQL: &str = "SET LOCAL plan_cache_mode TO DEFAULT";
/// On PostgreSQL, `CANDIDATES_SQL` with the count `claimable_at_most` reads (claimable
/// rows, at most `?4`) on every row, in one statement; one row of NULLs and the count when
/// no head is claimable. One walk of `batches_claimable` (`?4` = `?3` + 1 rows: the walk's
/// length and one) answers both: as a count of its own, statistics taken when the backlog
/// was all sealed (the dispatcher's start) planned the count as a sequential scan, which in
/// a drain skipped every batch delivered so far (2.8 ms at the end of a drain of 20 000,
/// bench_dispatch pg with auto_explain).
static CANDIDATES_COUNTED_PG_SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    assert!(
        CANDIDATES_SQL.contains(CANDIDATES_WALK),
        "CANDIDATES_SQL walks CANDIDATES_WALK"
    );
    let walk = CANDIDATES_SQL.replace(
        CANDIDATES_WALK,
        "(SELECT * FROM walked ORDER BY first_at, id LIMIT ?3) b",
    );
    format!(
        "WITH walked AS MATERIALIZED (SELECT * FROM batches
                 WHERE state IN ('sealed', 'retry') ORDER BY first_at, id LIMIT ?4)
         SELECT c.*, n.claimable FROM (SELECT count(*) AS claimable FROM walked) n
             LEFT JOIN ({walk}) c ON true
         ORDER BY c.first_at, c.id"
    )
});
/// Retry batches made due now (`Redue`), through `batches_due`: those waiting for one of
/// two classes (`?2`, `?3`), of one destination (`?4`) or of every one (`?4` NULL).
pub const REDUE_SQL: &str = "UPDATE batches SET next_attempt_at = ?1
     WHERE state = 'retry' AND next_attempt_at > ?1
       AND (last_class = ?2 OR last_class = ?3)
       AND (CAST(?4 AS TEXT) IS NULL OR destination = ?4)";

/// Which retry batches wait for nothing any more, because what they waited for was just
/// proven gone (`Store::redue_retries`). They are made due now; the FIFO walk still claims
/// only each group's head, so per-key order holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Redue<'a> {
    /// Every config-class retry: a config reload succeeded (spec 6.5).
    Config,
    /// One destination's transport- and throttle-class retries: a success closed its
    /// breaker, so the destination is proven healthy again (issue 28).
    Recovered(&'a str),
}

/// Rows of the FIFO index `CANDIDATES_SQL` walks before the group-by-group walk
/// (`HEAD_NEXT_KEY_SQL`) takes over: with one batch per key the first `limit` rows are the answer;
/// a backlog on few keys has fewer heads than this among its first rows.
pub const CANDIDATE_WALK_PER_LIMIT: usize = 2;
/// (name, SQL) of every query a tick makes.
pub const TICK_QUERIES: [(&str, &str); 5] = [
    ("seal_ready", SEAL_READY_SQL),
    ("recover", LEASED_SQL),
    ("candidates", CANDIDATES_SQL),
    ("head_next_key", HEAD_NEXT_KEY_SQL),
    ("head_next_route", HEAD_NEXT_ROUTE_SQL),
];

/// Seal one open batch: freeze its content and set content_hash. Asserts the transition.
pub(super) fn seal_tx(conn: &Connection, batch_id: i64, now: f64) -> Result<()> {
    let hash = hash_tx(conn, batch_id)?;
    let n = exec(
        conn,
        "UPDATE batches SET state = 'sealed', sealed_at = ?2, content_hash = ?3
         WHERE id = ?1 AND state = 'open'",
        params![batch_id, now, hash],
    )?;
    if n != 1 {
        return Err(StoreError::Corrupt(format!(
            "sealing batch {batch_id}: it was not open"
        )));
    }
    Ok(())
}

/// `Store::seal_ready` on PostgreSQL in two statements whatever the number of ready
/// batches (three per batch before): the ready batches locked with their events, then
/// every seal; in one when each ready batch's `open_hash` is set (the find seals those).
/// Returns the sealed ids in id order.
fn seal_ready_pg(tx: &Connection, now: f64) -> Result<Vec<i64>> {
    let found = find_ready_pg(tx, now)?;
    let sealed: Vec<i64> = found.iter().map(|(id, ..)| *id).collect();
    #[derive(serde::Serialize)]
    struct Seal {
        id: i64,
        hash: String,
    }
    let seals = found
        .iter()
        .filter(|(_, quick, _)| !*quick)
        .map(|(id, _, events)| {
            let hash = content_hash(events)
                .map_err(|e| StoreError::Corrupt(format!("batch {id}: {e}")))?;
            Ok(Seal { id: *id, hash })
        })
        .collect::<Result<Vec<Seal>>>()?;
    if seals.is_empty() {
        return Ok(sealed);
    }
    let json = serde_json::to_string(&seals).map_err(|e| StoreError::Invalid(e.to_string()))?;
    let n = exec(tx, SEAL_ALL_PG_SQL, params![json, now])?;
    if n != seals.len() {
        return Err(StoreError::Corrupt(format!(
            "sealing {} batches found open and locked changed {n}",
            seals.len()
        )));
    }
    Ok(sealed)
}

/// Every ready batch in id order (`SEAL_READY_EVENTS_PG_SQL`), `true` for those the find
/// sealed itself, the others with their events.
fn find_ready_pg(tx: &Connection, now: f64) -> Result<Vec<(i64, bool, Vec<CanonicalEvent>)>> {
    let mut stmt = tx.prepare_cached(&SEAL_READY_EVENTS_PG_SQL)?;
    let last = std::cell::Cell::new(None);
    grouped(stmt.query_map([now], |r| joined_row(r, &last, 2, |r| r.get::<_, bool>(1)))?)
}

/// The content hash of a batch's non-excluded events, in events.id order.
pub(super) fn hash_tx(conn: &Connection, batch_id: i64) -> Result<String> {
    content_hash(&canonical_events(conn, batch_id)?)
        .map_err(|e| StoreError::Corrupt(format!("batch {batch_id}: {e}")))
}

/// The event read from `r`'s columns `at..at + 5`: id, event_type, received_at, dedup_id,
/// payload.
fn canonical_at(r: &Row<'_>, at: usize) -> rusqlite::Result<CanonicalEvent> {
    Ok(CanonicalEvent {
        id: r.get(at)?,
        event_type: r.get(at + 1)?,
        received_at: r.get(at + 2)?,
        dedup_id: r.get(at + 3)?,
        payload: r.get(at + 4)?,
    })
}

pub(super) fn canonical_events(conn: &Connection, batch_id: i64) -> Result<Vec<CanonicalEvent>> {
    let mut stmt = conn.prepare_cached(
        "SELECT id, event_type, received_at, dedup_id, payload FROM events
         WHERE batch_id = ?1 AND excluded_at IS NULL ORDER BY id",
    )?;
    let rows = stmt
        .query_map([batch_id], |r| canonical_at(r, 0))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(rows)
}

/// The start of the candidate list (`Store::candidate_prefix`): `heads` are the first
/// `heads.len()` entries of `candidates(now, limit)`, and all of them when `exact`.
#[derive(Debug, Clone, PartialEq)]
pub struct CandidatePrefix {
    pub heads: Vec<Candidate>,
    pub exact: bool,
}

/// A batch the gate may claim: the head of its group, sealed or due for retry.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub batch_id: i64,
    pub route: String,
    pub key: String,
    pub destination: String,
    pub state: BatchState,
    pub first_at: f64,
    pub attempts: i64,
}

impl Candidate {
    /// Columns 0-6 of `CANDIDATES_SQL` and of the head-walk statements, in that order.
    fn from_row(r: &Row<'_>) -> rusqlite::Result<Candidate> {
        Ok(Candidate {
            batch_id: r.get(0)?,
            route: r.get(1)?,
            key: r.get(2)?,
            destination: r.get(3)?,
            state: r.get(4)?,
            first_at: r.get(5)?,
            attempts: r.get(6)?,
        })
    }
}

/// A won claim.
#[derive(Debug, Clone, PartialEq)]
pub struct Claim {
    pub batch_id: i64,
    pub attempt_id: i64,
    /// The attempt number (1 for the first try), sent as X-Hookspool-Attempt.
    pub attempt_n: i64,
    pub lease_owner: String,
    pub lease_until: f64,
}

/// The id the destination will be sent for an attempt of a claim, recorded on the attempt
/// row: one for every attempt of the batch, or a prefix followed by the attempt's id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeliveryId {
    Batch(String),
    PerAttempt { prefix: String },
}

impl DeliveryId {
    /// Ids made of `prefix` and the attempt's id.
    pub fn per_attempt(prefix: impl Into<String>) -> DeliveryId {
        DeliveryId::PerAttempt {
            prefix: prefix.into(),
        }
    }

    /// The id of attempt `attempt_id`.
    pub fn for_attempt(&self, attempt_id: i64) -> String {
        match self {
            DeliveryId::Batch(id) => id.clone(),
            DeliveryId::PerAttempt { prefix } => format!("{prefix}{attempt_id}"),
        }
    }
}

/// One claim of `claim_many`.
#[derive(Debug, Clone)]
pub struct ClaimRequest {
    pub batch_id: i64,
    pub lease_until: f64,
    pub probe: bool,
    pub delivery_id: DeliveryId,
}

/// Claim one batch inside the caller's transaction: the attempt row first, then the lease
/// if the batch is still sealed or retry (spec 6.2). A batch that is not claimable is
/// refused before anything is written (`Keep(None)`); a lease lost after the attempt row
/// was written must be undone (`Undo(None)`).
const CLAIM_READ_SQL: &str = "SELECT state, destination,
            (SELECT count(*) + 1 FROM attempts WHERE batch_id = ?1)
     FROM batches WHERE id = ?1";
const ATTEMPT_INSERT_SQL: &str =
    "INSERT INTO attempts (batch_id, n, destination, started_at, probe, counted)
     VALUES (?1, ?2, ?3, ?4, ?5, 0)";

fn claim_tx(
    tx: &Connection,
    owner_prefix: &str,
    now: f64,
    req: &ClaimRequest,
) -> Result<Step<Option<Claim>>> {
    let batch_id = req.batch_id;
    // The batch's state and destination and its next attempt number in one statement.
    let found: Option<(BatchState, String, i64)> = row(tx, CLAIM_READ_SQL, [batch_id], |r| {
        Ok((r.get(0)?, r.get(1)?, r.get(2)?))
    })?;
    let Some((state, destination, n)) = found else {
        return Ok(Step::Keep(None));
    };
    match state {
        BatchState::Sealed | BatchState::Retry => {}
        BatchState::Open
        | BatchState::Leased
        | BatchState::Delivered
        | BatchState::Dead
        | BatchState::Dropped => return Ok(Step::Keep(None)),
    }
    exec(
        tx,
        ATTEMPT_INSERT_SQL,
        params![batch_id, n, destination, now, req.probe as i64],
    )?;
    let attempt_id = tx.last_insert_rowid();
    exec(
        tx,
        "UPDATE attempts SET delivery_id = ?2 WHERE id = ?1",
        params![attempt_id, req.delivery_id.for_attempt(attempt_id)],
    )?;
    failpoint::hit("claim.after_attempt");
    let lease_owner = format!("{owner_prefix}:{attempt_id}");
    let won = exec(
        tx,
        "UPDATE batches SET state = 'leased', lease_until = ?2, lease_owner = ?3
         WHERE id = ?1 AND state IN ('sealed', 'retry')",
        params![batch_id, req.lease_until, lease_owner],
    )?;
    if won != 1 {
        return Ok(Step::Undo(None));
    }
    Ok(Step::Keep(Some(Claim {
        batch_id,
        attempt_id,
        attempt_n: n,
        lease_owner,
        lease_until: req.lease_until,
    })))
}

/// On PostgreSQL, every claim of a tick in one statement: `?1` the claims as a JSON list of
/// records, `?2` the start time, `?3` the lease owner's prefix. Each batch is looked up
/// on its own and locked if it is claimable (a lateral join: as `id = ANY(...) AND state
/// IN (...)` the planner of a spool not yet analyzed walks the whole partial FIFO index,
/// `batches_claimable` holding `id` after `first_at`), its next attempt number counted and
/// an attempt id drawn; then the leases (the locked rows by primary key), the attempt row
/// of each lease won and of no other (its delivery id made from the drawn id), and what
/// the dispatcher reads of the won batches (`claimed_batches`' columns, then the attempt's
/// id and number).
static CLAIM_ALL_PG_SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "WITH {}
         SELECT {}, e.id, e.event_type, e.received_at, e.dedup_id, e.payload,
                c.attempt_id, c.n
         FROM won JOIN c ON c.batch_id = won.id
         LEFT JOIN events e ON e.batch_id = won.id AND e.excluded_at IS NULL
         ORDER BY won.id, e.id",
        claim_ctes(
            "json_to_recordset(?1) AS w(batch_id bigint, lease_until double precision,
                                        probe bigint, id_text text, per_attempt boolean)",
            "",
            "?2",
            "?3"
        ),
        won_columns()
    )
});

/// The claims' common table expressions `c`, `won` and `attempt` (see `CLAIM_ALL_PG_SQL`)
/// over `from`, a FROM item `w` of the batches to claim with columns batch_id,
/// lease_until, probe, id_text and per_attempt (the delivery id, or its prefix the attempt
/// id completes), and `extra` (more of `w`'s columns `c` keeps); `started` and `owner` the
/// placeholders of the start time and the lease owner's prefix.
fn claim_ctes(from: &str, extra: &str, started: &str, owner: &str) -> String {
    format!(
        "c AS (
             SELECT w.batch_id, w.lease_until, w.probe, w.id_text, w.per_attempt{extra},
                    b.destination,
                    (SELECT count(*) + 1 FROM attempts a WHERE a.batch_id = b.id) AS n,
                    nextval('attempts_id_seq') AS attempt_id
             FROM {from}
             CROSS JOIN LATERAL (
                 SELECT id, destination FROM batches
                 WHERE id = w.batch_id AND state IN ('sealed', 'retry')
                 FOR UPDATE) b),
         won AS (
             UPDATE batches b SET state = 'leased', lease_until = c.lease_until,
                                  lease_owner = {owner} || ':' || c.attempt_id
             FROM c WHERE b.id = ANY(ARRAY(SELECT batch_id FROM c)) AND b.id = c.batch_id
             RETURNING b.*),
         attempt AS (
             INSERT INTO attempts (id, batch_id, n, destination, started_at, probe, counted,
                                   delivery_id)
             SELECT c.attempt_id, c.batch_id, c.n, c.destination, {started}, c.probe, 0,
                    CASE WHEN c.per_attempt THEN c.id_text || c.attempt_id ELSE c.id_text END
             FROM c JOIN won ON won.id = c.batch_id)"
    )
}

/// `BATCH_COLUMNS` of the claims' `won`.
fn won_columns() -> String {
    BATCH_COLUMNS
        .split(',')
        .map(|c| format!("won.{}", c.trim()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// On PostgreSQL, the claims a wake-up's tick can make without reading its gates first,
/// sent with the seal's find and the COMMIT in one write (`Store::seal_and_claim_fast`):
/// the FIFO walk and its count `candidate_prefix` reads (`CANDIDATES_COUNTED_PG_SQL`, `?1`
/// to `?4` as `walk_pg_values` gives them), then the longest start of its heads that
/// `choose` would pick first: each head's destination is in `?5` (`FastGate` records: the gate was open on the row as the dispatcher last read
/// it, and the row still reads so: closed, with the same `retry_after_until`, or absent,
/// which reads as closed), within its `cap` (free slots and tokens), and at most `?7` in
/// all (the free slots). The first head that is not ends it, as it would end the claims
/// `choose` makes before it; the dispatcher reads the gates and picks from the rest
/// afterwards. Nothing is claimed while a ready batch is still open (the find could not
/// seal it: its events must be hashed): sealed by the seal that follows, it may be older
/// than these heads, and `choose` would give it a slot first. Those heads are claimed as
/// `CLAIM_ALL_PG_SQL` claims (`?6` the lease owner's prefix, `?1` the start time), their delivery ids made from
/// each gate's `id_prefix`. Each row: the won batch with an event, the attempt's id and
/// number and the head's place in the walk, as `CLAIM_ALL_PG_SQL` (one row of NULLs when
/// nothing was won); then the heads the walk found and its count of claimable rows.
static FAST_CLAIM_PG_SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "WITH counted AS MATERIALIZED ({counted}),
         cand AS MATERIALIZED (
             SELECT h.id, h.destination, row_number() OVER (ORDER BY h.first_at, h.id) AS pos
             FROM counted h WHERE h.id IS NOT NULL),
         g AS (
             SELECT a.* FROM json_to_recordset(?5) AS a(destination text, cap bigint,
                 lease_until double precision, id_prefix text, per_attempt boolean,
                 retry_after_until double precision)
             WHERE coalesce((SELECT d.state = 'closed'
                                    AND d.retry_after_until IS NOT DISTINCT FROM a.retry_after_until
                             FROM destinations d WHERE d.name = a.destination),
                            a.retry_after_until IS NULL)),
         ranked AS (
             SELECT h.id, h.pos, g.lease_until, g.id_prefix, g.per_attempt,
                    coalesce(row_number() OVER (PARTITION BY h.destination ORDER BY h.pos)
                             <= g.cap, false) AS ok
             FROM cand h LEFT JOIN g ON g.destination = h.destination),
         unsealed AS (
             SELECT EXISTS (SELECT 1 FROM batches
                            WHERE id = ANY(ARRAY({SEAL_READY_SQL})) AND state = 'open') AS open),
         chosen AS (
             SELECT r.id AS batch_id, r.lease_until, 0::bigint AS probe,
                    r.id_prefix || r.id || CASE WHEN r.per_attempt THEN '_' ELSE '' END
                        AS id_text,
                    r.per_attempt, r.pos
             FROM ranked r
             WHERE r.pos <= ?7
               AND NOT (SELECT open FROM unsealed)
               AND NOT EXISTS (SELECT 1 FROM ranked x WHERE x.pos <= r.pos AND NOT x.ok)),
         {}
         SELECT x.*, n.heads, n.claimable FROM
             (SELECT (SELECT count(*) FROM cand) AS heads,
                     (SELECT max(claimable) FROM counted) AS claimable) n
         LEFT JOIN (
             SELECT {}, e.id AS event_id, e.event_type, e.received_at, e.dedup_id, e.payload,
                    c.attempt_id, c.n, c.pos
             FROM won JOIN c ON c.batch_id = won.id
             LEFT JOIN events e ON e.batch_id = won.id AND e.excluded_at IS NULL) x ON true
         ORDER BY x.pos, x.event_id",
        claim_ctes("chosen w", ", w.pos", "?1", "?6"),
        won_columns(),
        counted = &*CANDIDATES_COUNTED_PG_SQL,
    )
});

/// A destination whose heads `Store::seal_and_claim_fast` may claim: its gate was open on its
/// row as the dispatcher last read it, whose `retry_after_until` this is (the claims are
/// made only if the row still reads so); at most `cap` of them (its free slots and its
/// rate's tokens), each leased until `lease_until`, its delivery id `<id_prefix><batch id>`,
/// followed by `_<attempt id>` when `per_attempt`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FastGate {
    pub destination: String,
    pub cap: i64,
    pub lease_until: f64,
    pub id_prefix: String,
    pub per_attempt: bool,
    pub retry_after_until: Option<f64>,
}

/// What `Store::seal_and_claim_fast` did, committed.
#[derive(Debug, Default)]
pub struct FastTick {
    /// The batches the find sealed, in id order.
    pub sealed: Vec<i64>,
    /// The find found ready batches it could not seal itself (their events must be hashed):
    /// a seal must run again.
    pub reseal: bool,
    /// The claims made, in the walk's order, each with its destination.
    pub claims: Vec<(Claim, String)>,
    /// The won batches' rows and events.
    pub read: ClaimedReads,
    /// The walk found heads it did not claim, or may not have seen them all: the
    /// dispatcher's own choice must follow.
    pub more: bool,
}

/// One claim of `CLAIM_ALL_PG_SQL`, a record of its JSON list.
#[derive(serde::Serialize)]
struct ClaimRecord<'a> {
    batch_id: i64,
    lease_until: f64,
    probe: i64,
    id_text: &'a str,
    per_attempt: bool,
}

/// Every claim of `reqs` on PostgreSQL in one statement (one round trip for a tick's
/// claims, two per claim before), which also reads the won batches (`CLAIM_ALL_PG_SQL`). A
/// batch that is not claimable is not leased and gets no attempt row, as a lost claim is
/// undone on SQLite.
fn claim_all_pg(
    tx: &Connection,
    owner_prefix: &str,
    now: f64,
    reqs: &[ClaimRequest],
) -> Result<(Vec<Option<Claim>>, ClaimedReads)> {
    // A batch asked for twice is claimed at most once, by its first request (as on
    // SQLite, where the second finds it leased): it is sent once, and its claim below is
    // taken by the first request that asks for it.
    let mut asked = std::collections::HashSet::with_capacity(reqs.len());
    let records: Vec<ClaimRecord<'_>> = reqs
        .iter()
        .filter(|req| asked.insert(req.batch_id))
        .map(|req| {
            let (id_text, per_attempt) = match &req.delivery_id {
                DeliveryId::Batch(id) => (id.as_str(), false),
                DeliveryId::PerAttempt { prefix } => (prefix.as_str(), true),
            };
            ClaimRecord {
                batch_id: req.batch_id,
                lease_until: req.lease_until,
                probe: req.probe as i64,
                id_text,
                per_attempt,
            }
        })
        .collect();
    let json = serde_json::to_string(&records).map_err(|e| StoreError::Invalid(e.to_string()))?;
    let at = BATCH_COLUMNS.split(',').count();
    let won = {
        let mut stmt = tx.prepare_cached(&CLAIM_ALL_PG_SQL)?;
        let last = std::cell::Cell::new(None);
        let rows = stmt.query_map(params![json, now, owner_prefix], |r| {
            joined_row(r, &last, at, |r| {
                Ok((
                    BatchRow::from_row(r)?,
                    r.get::<_, i64>(at + 5)?,
                    r.get(at + 6)?,
                ))
            })
        })?;
        grouped(rows)?
    };
    failpoint::hit("claim.after_attempt");
    // Each won batch's attempt, and its lease owner as the statement wrote it.
    let mut drawn: HashMap<i64, (i64, i64, String)> = HashMap::with_capacity(won.len());
    let mut read: ClaimedReads = HashMap::with_capacity(won.len());
    for (id, (batch, attempt_id, attempt_n), events) in won {
        let owner = batch.lease_owner.clone().ok_or_else(|| {
            StoreError::Corrupt(format!("batch {id} was leased without a lease owner"))
        })?;
        drawn.insert(id, (attempt_id, attempt_n, owner));
        read.insert(id, (batch, events));
    }
    let claims = reqs
        .iter()
        .map(|req| {
            let (attempt_id, attempt_n, lease_owner) = drawn.remove(&req.batch_id)?;
            Some(Claim {
                batch_id: req.batch_id,
                attempt_id,
                attempt_n,
                lease_owner,
                lease_until: req.lease_until,
            })
        })
        .collect();
    Ok((claims, read))
}

/// What the dispatcher reads of claimed batches: each batch's row and its frozen events.
pub type ClaimedReads = HashMap<i64, (BatchRow, Vec<CanonicalEvent>)>;

/// The claims of `Store::claim_many`, following its requests, and the won batches' reads
/// when the claim's statements returned them (PostgreSQL); the rest the caller reads with
/// `claimed_batches` once they are committed.
#[derive(Debug)]
pub struct ClaimedMany {
    pub claims: Vec<Option<Claim>>,
    pub read: ClaimedReads,
}

/// One row of a statement that reads batches joined with their events (NULLs for a batch
/// whose events are all excluded), in batch and event order, with the batch's id in column
/// 0 and the event's columns from `at`: the id, `head` of the batch's first row (read
/// once per batch; `last` is the id of the row before), and the event.
fn joined_row<H>(
    r: &Row<'_>,
    last: &std::cell::Cell<Option<i64>>,
    at: usize,
    head: impl FnOnce(&Row<'_>) -> rusqlite::Result<H>,
) -> rusqlite::Result<(i64, Option<H>, Option<CanonicalEvent>)> {
    let id: i64 = r.get(0)?;
    let head = if last.replace(Some(id)) == Some(id) {
        None
    } else {
        Some(head(r)?)
    };
    let event = match r.get::<_, Option<i64>>(at)? {
        Some(_) => Some(canonical_at(r, at)?),
        None => None,
    };
    Ok((id, head, event))
}

/// `joined_row`s grouped: each batch once, in order, with its head and its events.
fn grouped<H>(
    rows: impl Iterator<Item = rusqlite::Result<(i64, Option<H>, Option<CanonicalEvent>)>>,
) -> Result<Vec<(i64, H, Vec<CanonicalEvent>)>> {
    let mut out: Vec<(i64, H, Vec<CanonicalEvent>)> = Vec::new();
    for row in rows {
        let (id, head, event) = row?;
        if let Some(h) = head {
            out.push((id, h, Vec::new()));
        }
        if let (Some(e), Some((_, _, events))) = (event, out.last_mut()) {
            events.push(e);
        }
    }
    Ok(out)
}

/// A lease moved back to retry by recovery.
#[derive(Debug, Clone, PartialEq)]
pub struct RecoveredLease {
    pub batch_id: i64,
    pub lease_owner: Option<String>,
}

/// The persisted runtime state of a destination (spec 3, 4.2).
#[derive(Debug, Clone, PartialEq)]
pub struct DestinationRow {
    pub name: String,
    pub state: BreakerState,
    pub consecutive_failures: i64,
    pub opened_at: Option<f64>,
    pub cooldown_s: Option<f64>,
    pub probe_until: Option<f64>,
    pub last_probe_batch_id: Option<i64>,
    pub paused_at: Option<f64>,
    pub paused_by: Option<String>,
    pub last_ok_at: Option<f64>,
    pub last_error: Option<String>,
    pub retry_after_until: Option<f64>,
}

impl DestinationRow {
    pub fn closed(name: &str) -> DestinationRow {
        DestinationRow {
            name: name.to_string(),
            state: BreakerState::Closed,
            consecutive_failures: 0,
            opened_at: None,
            cooldown_s: None,
            probe_until: None,
            last_probe_batch_id: None,
            paused_at: None,
            paused_by: None,
            last_ok_at: None,
            last_error: None,
            retry_after_until: None,
        }
    }

    fn from_row(r: &Row<'_>) -> rusqlite::Result<DestinationRow> {
        Ok(DestinationRow {
            name: r.get(0)?,
            state: r.get(1)?,
            consecutive_failures: r.get(2)?,
            opened_at: r.get(3)?,
            cooldown_s: r.get(4)?,
            probe_until: r.get(5)?,
            last_probe_batch_id: r.get(6)?,
            paused_at: r.get(7)?,
            paused_by: r.get(8)?,
            last_ok_at: r.get(9)?,
            last_error: r.get(10)?,
            retry_after_until: r.get(11)?,
        })
    }
}

const DESTINATION_COLUMNS: &str = "name, state, consecutive_failures, opened_at, cooldown_s,
    probe_until, last_probe_batch_id, paused_at, paused_by, last_ok_at, last_error,
    retry_after_until";

impl Store {
    /// A batch's frozen content: its non-excluded events in document order.
    pub fn frozen_events(&self, batch_id: i64) -> Result<Vec<CanonicalEvent>> {
        canonical_events(&self.conn, batch_id)
    }

    /// What the dispatcher reads of the batches it just claimed, each with its frozen
    /// events (as `batch` and `frozen_events` give them), in two statements for all of them.
    /// On PostgreSQL the claim's statement reads them already (`ClaimedMany::read`). An id
    /// not stored is missing from the map.
    pub fn claimed_batches(&self, ids: &[i64]) -> Result<ClaimedReads> {
        let mut out = HashMap::with_capacity(ids.len());
        if ids.is_empty() {
            return Ok(out);
        }
        let list = serde_json::to_string(ids).map_err(|e| StoreError::Invalid(e.to_string()))?;
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT {BATCH_COLUMNS} FROM batches
             WHERE id IN (SELECT CAST(value AS INTEGER) FROM json_each(?1))"
        ))?;
        for b in stmt.query_map([&list], BatchRow::from_row)? {
            let b = b?;
            out.insert(b.id, (b, Vec::new()));
        }
        let mut stmt = self.conn.prepare_cached(
            "SELECT batch_id, id, event_type, received_at, dedup_id, payload FROM events
             WHERE batch_id IN (SELECT CAST(value AS INTEGER) FROM json_each(?1))
               AND excluded_at IS NULL
             ORDER BY batch_id, id",
        )?;
        let rows = stmt.query_map([&list], |r| Ok((r.get::<_, i64>(0)?, canonical_at(r, 1)?)))?;
        for row in rows {
            let (batch_id, event) = row?;
            if let Some((_, events)) = out.get_mut(&batch_id) {
                events.push(event);
            }
        }
        Ok(out)
    }

    /// Seal every open batch that is ready at `now` (spec 5). Each lookup uses an index on
    /// the readiness expression, so the cost follows the number of ready batches.
    pub fn seal_ready(&mut self, now: f64) -> Result<Vec<i64>> {
        let tx = self.begin()?;
        // On PostgreSQL an intake may be joining a ready batch (`pg::enqueue` locks it
        // first): the find waits for its commit and keeps only what is still open and
        // still ready, so the hash covers every event the batch will ever hold. An intake
        // that sealed it by size meanwhile, or whose event restarted its quiet window,
        // leaves it to that seal or to a later tick.
        if tx.is_pg() {
            let sealed = seal_ready_pg(&tx, now)?;
            failpoint::hit("seal.before_commit");
            tx.commit()?;
            return Ok(sealed);
        }
        let ids: Vec<i64> = {
            let mut stmt = tx.prepare_cached(SEAL_READY_SQL)?;
            stmt.query_map([now], |r| r.get(0))?
                .collect::<rusqlite::Result<_>>()?
        };
        let mut sealed = Vec::with_capacity(ids.len());
        for id in &ids {
            seal_tx(&tx, *id, now)?;
            sealed.push(*id);
        }
        failpoint::hit("seal.before_commit");
        tx.commit()?;
        Ok(sealed)
    }

    /// Heads of groups that may be claimed at `now`, oldest first (spec 6.1): per (route,
    /// key) only the oldest unfinished batch, and only if it is sealed, or retry and due, and
    /// its not_before has passed. The FIFO walk answers when its first rows hold `limit`
    /// heads or are all the claimable rows; otherwise (a backlog on few keys) every group's
    /// head is read, one seek each, and the claimable ones sorted.
    pub fn candidates(&self, now: f64, limit: usize) -> Result<Vec<Candidate>> {
        let walk = walk_rows(limit);
        if self.heads_by_group_first.get() {
            return self.heads_by_group(now, limit, walk);
        }
        let first = self.candidate_prefix(now, limit)?;
        if first.exact {
            return Ok(first.heads);
        }
        self.heads_by_group(now, limit, walk)
    }

    /// The FIFO walk alone (`CANDIDATES_SQL` over at most `limit` x
    /// `CANDIDATE_WALK_PER_LIMIT` rows): always the start of `candidates(now, limit)`, since
    /// every head it skips sorts after every row it read, and `exact` when it is all of it.
    /// On a backlog of few keys the walk finds fewer heads than `limit` among its rows (each
    /// group's later batches are blocked by its head) and is not exact, yet it can hold
    /// enough heads for the dispatcher's free slots: then no group-by-group walk is needed.
    pub fn candidate_prefix(&self, now: f64, limit: usize) -> Result<CandidatePrefix> {
        let walk = walk_rows(limit);
        if self.conn.is_pg() {
            // The walk and the count of claimable rows in one statement (one round trip).
            let read = || -> Result<(Vec<Candidate>, i64)> {
                let mut stmt = self.conn.prepare_cached(&CANDIDATES_COUNTED_PG_SQL)?;
                let mut heads = Vec::new();
                let mut claimable = 0i64;
                let rows = stmt.query_map(walk_pg_values(now, limit), |r| {
                    let c: i64 = r.get(7)?;
                    let head = match r.get::<_, Option<i64>>(0)? {
                        Some(_) => Some(Candidate::from_row(r)?),
                        None => None,
                    };
                    Ok((head, c))
                })?;
                for row in rows {
                    let (head, c) = row?;
                    claimable = c;
                    heads.extend(head);
                }
                Ok((heads, claimable))
            };
            let (heads, claimable) = planned_with(
                &self.conn,
                CANDIDATES_PLAN_SQL,
                CANDIDATES_PLAN_RESET_SQL,
                read,
            )?;
            let exact = walk_exact(heads.len(), claimable, limit);
            return Ok(CandidatePrefix { heads, exact });
        }
        let mut stmt = self.conn.prepare_cached(CANDIDATES_SQL)?;
        let heads = stmt
            .query_map(params![now, limit as i64, walk as i64], Candidate::from_row)?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        let exact = heads.len() >= limit || self.claimable_at_most(walk)?;
        Ok(CandidatePrefix { heads, exact })
    }

    /// Before a dispatcher tick's `seal_ready` on PostgreSQL: the walk `candidate_prefix(now,
    /// limit)` reads and the rows of `destinations` go right after the seal's first
    /// statement, in the same write (`Connection::read_ahead`). When nothing is sealed
    /// (nothing written in between) they answer those calls without round trips of their
    /// own; a seal, a recovered lease or any other statement in between makes them read
    /// anew. Nothing on SQLite, or outside a transaction.
    pub fn read_ahead_for_claims(
        &self,
        now: f64,
        limit: usize,
        destinations: &[String],
    ) -> Result<()> {
        if !self.conn.is_pg() {
            return Ok(());
        }
        self.conn.read_ahead(
            &CANDIDATES_COUNTED_PG_SQL,
            walk_pg_values(now, limit),
            CANDIDATES_PLAN_SQL,
            CANDIDATES_PLAN_RESET_SQL,
        )?;
        for name in destinations {
            self.conn
                .read_ahead(&DESTINATION_SQL, vec![Value::Text(name.clone())], "", "")?;
        }
        Ok(())
    }

    /// Whether the claimable rows number `n` or fewer (then a walk of `n` rows saw them all).
    fn claimable_at_most(&self, n: usize) -> Result<bool> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT count(*) FROM (SELECT 1 FROM batches INDEXED BY batches_claimable
             WHERE state IN ('sealed', 'retry') LIMIT ?1) AS claimable",
        )?;
        let seen: i64 = stmt.query_row([n as i64 + 1], |r| r.get(0))?;
        Ok(seen <= n as i64)
    }

    /// Every group's head (`HEAD_NEXT_KEY_SQL`, `HEAD_NEXT_ROUTE_SQL`: one seek per group),
    /// the claimable ones oldest first, at most `limit`. Up to `walk` groups, the next call
    /// starts here too (a backlog on few keys stays one for many ticks).
    fn heads_by_group(&self, now: f64, limit: usize, walk: usize) -> Result<Vec<Candidate>> {
        type Head = (Candidate, Option<f64>, Option<f64>);
        fn head(r: &Row<'_>) -> rusqlite::Result<Head> {
            Ok((Candidate::from_row(r)?, r.get(7)?, r.get(8)?))
        }
        let mut out = Vec::new();
        let mut groups = 0usize;
        // On PostgreSQL every head comes from one statement; on SQLite one seek per group.
        let mut all = if self.conn.is_pg() {
            let mut stmt = self.conn.prepare_cached(HEADS_PG_SQL)?;
            let heads = stmt.query_map((), head)?;
            Some(heads.collect::<rusqlite::Result<Vec<_>>>()?.into_iter())
        } else {
            None
        };
        // The empty route sorts before every real one (routes are config names).
        let (mut route, mut key) = (String::new(), String::new());
        loop {
            let head = match &mut all {
                Some(heads) => heads.next(),
                None => match row(&self.conn, HEAD_NEXT_KEY_SQL, params![route, key], head)? {
                    Some(h) => Some(h),
                    None => row(&self.conn, HEAD_NEXT_ROUTE_SQL, [&route], head)?,
                },
            };
            let Some((c, due, not_before)) = head else {
                break;
            };
            groups += 1;
            route.clone_from(&c.route);
            key.clone_from(&c.key);
            let claimable = match c.state {
                BatchState::Sealed => true,
                BatchState::Retry => due.is_some_and(|d| d <= now),
                BatchState::Open
                | BatchState::Leased
                | BatchState::Delivered
                | BatchState::Dead
                | BatchState::Dropped => false,
            };
            if claimable && not_before.is_none_or(|t| t <= now) {
                out.push(c);
            }
        }
        out.sort_by(|a, b| {
            a.first_at
                .total_cmp(&b.first_at)
                .then(a.batch_id.cmp(&b.batch_id))
        });
        out.truncate(limit);
        self.heads_by_group_first.set(groups <= walk);
        Ok(out)
    }

    /// Claim a batch (spec 6.2): the attempt row is written first, then the batch is leased
    /// to `<owner_prefix>:<attempt_id>` if it is still sealed or retry. `None` means another
    /// claimant won. `delivery_id` is the id the destination is sent for the new attempt.
    pub fn claim(
        &mut self,
        batch_id: i64,
        owner_prefix: &str,
        lease_until: f64,
        now: f64,
        probe: bool,
        delivery_id: DeliveryId,
    ) -> Result<Option<Claim>> {
        let req = ClaimRequest {
            batch_id,
            lease_until,
            probe,
            delivery_id,
        };
        Ok(self
            .claim_many(owner_prefix, now, std::slice::from_ref(&req))?
            .claims
            .pop()
            .flatten())
    }

    /// Claim several batches in ONE transaction (one fsync for a tick's claims). On SQLite
    /// they share one savepoint (`each_in_savepoints`): a lost claim is undone alone and
    /// does not undo the others. On PostgreSQL they are one statement for all of them
    /// (`claim_all_pg`), which also reads the won batches. Claims follow `reqs`.
    pub fn claim_many(
        &mut self,
        owner_prefix: &str,
        now: f64,
        reqs: &[ClaimRequest],
    ) -> Result<ClaimedMany> {
        let tx = self.begin()?;
        let (claims, read) = if tx.is_pg() {
            claim_all_pg(&tx, owner_prefix, now, reqs)?
        } else {
            let claims =
                each_in_savepoints(&tx, reqs, |req| claim_tx(&tx, owner_prefix, now, req))?;
            (claims, HashMap::new())
        };
        failpoint::hit("claim.before_commit");
        tx.commit()?;
        Ok(ClaimedMany { claims, read })
    }

    /// `claim_many` in the dispatcher tick's transaction (`begin_tick`), then that
    /// transaction's commit (`commit_tick`). On PostgreSQL the COMMIT is sent right after
    /// the claims' statement, in the same write: the claims and the commit are one round
    /// trip, and the failpoints after the statement come after the commit. An error of the
    /// statement or of the COMMIT means nothing of the tick committed (rolled back, or
    /// still open when the statement was refused before it was sent, for the caller to
    /// roll back), as does a lost session (the COMMIT's answer unknown, as before any
    /// COMMIT). On PostgreSQL an error in reading the statement's rows (a bug: a row that
    /// does not decode, a leased batch without a lease owner) comes after the COMMIT: the
    /// dispatcher stops on it (it is no weather), and its next start recovers those leases.
    /// On SQLite, a transaction SQLite rolled back itself before the commit is an error.
    pub fn claim_many_and_commit_tick(
        &mut self,
        owner_prefix: &str,
        now: f64,
        reqs: &[ClaimRequest],
    ) -> Result<ClaimedMany> {
        if !self.in_transaction() {
            return Err(super::tick_ended());
        }
        self.conn.commit_with_next(true);
        let claimed = self.claim_many(owner_prefix, now, reqs);
        // A request no statement took (an error before the claims' statement) goes.
        self.conn.commit_with_next(false);
        let claimed = claimed?;
        // Not committed with the statement (SQLite): now.
        if !self.conn.is_pg() || self.in_transaction() {
            self.commit_tick()?;
        }
        Ok(claimed)
    }

    /// A wake-up's tick on PostgreSQL in one round trip: in the tick's transaction
    /// (`begin_tick`), the seal's find (which seals the ready batches whose `open_hash` is
    /// known), the claims `FAST_CLAIM_PG_SQL` makes of the FIFO walk's first heads for
    /// `gates` (at most `free`; `limit` heads walked, as `candidate_prefix(now, limit)`) and
    /// the transaction's COMMIT go in one write. Two round trips before (the find with the
    /// walk, then the claims with the COMMIT). After it the tick's transaction is over: an
    /// error means none of it committed (rolled back, or still open when the find was
    /// refused before it was sent, for the caller to roll back), as does a lost session.
    /// Ready batches the find could not seal are left open (`reseal`: a seal must follow,
    /// in a transaction of its own); heads it did not claim are the dispatcher's to choose
    /// from (`more`). An error in reading the claims' rows (a bug) comes after the COMMIT,
    /// as in `claim_many_and_commit_tick`.
    pub fn seal_and_claim_fast(
        &mut self,
        now: f64,
        limit: usize,
        gates: &[FastGate],
        free: usize,
        owner_prefix: &str,
    ) -> Result<FastTick> {
        if !self.conn.is_pg() || !self.in_transaction() {
            return Err(StoreError::Invalid(
                "a fast tick needs PostgreSQL and the tick's transaction".into(),
            ));
        }
        let json = serde_json::to_string(gates).map_err(|e| StoreError::Invalid(e.to_string()))?;
        let mut values = walk_pg_values(now, limit);
        values.extend([
            Value::Text(json),
            Value::Text(owner_prefix.to_string()),
            Value::Integer(free as i64),
        ]);
        // One plan for every call, as the walk's (`CANDIDATES_PLAN_SQL`), for the find too
        // (planned so already); the transaction ends with this write, and the setting with
        // it.
        exec(&self.conn, CANDIDATES_PLAN_SQL, ())?;
        self.conn.after_next(&FAST_CLAIM_PG_SQL, values)?;
        self.conn.commit_with_next(true);
        let found = find_ready_pg(&self.conn, now);
        // What no statement took (the find refused before it was sent) goes.
        self.conn.commit_with_next(false);
        self.conn.forget_after_next();
        let found = found?;
        let at = BATCH_COLUMNS.split(',').count();
        // Every row holds the walk's counts; the won batches' rows are read as
        // `claim_all_pg` reads them.
        let last = std::cell::Cell::new(None);
        let rows = self
            .conn
            .after_next_rows(&FAST_CLAIM_PG_SQL, |r| {
                let counts = (r.get::<_, i64>(at + 8)?, r.get::<_, i64>(at + 9)?);
                let won = match r.get::<_, Option<i64>>(0)? {
                    Some(_) => Some(joined_row(r, &last, at, |r| {
                        Ok((
                            BatchRow::from_row(r)?,
                            r.get::<_, i64>(at + 5)?,
                            r.get::<_, i64>(at + 6)?,
                        ))
                    })?),
                    None => None,
                };
                Ok((won, counts))
            })
            .ok_or_else(|| StoreError::Corrupt("the fast claims did not answer".into()))??;
        failpoint::hit("claim.after_attempt");
        let (heads, claimable) = rows.last().map(|(_, c)| *c).unwrap_or_default();
        let mut tick = FastTick {
            reseal: found.iter().any(|(_, quick, _)| !*quick),
            sealed: found
                .iter()
                .filter(|(_, quick, _)| *quick)
                .map(|(id, ..)| *id)
                .collect(),
            ..FastTick::default()
        };
        for (id, (batch, attempt_id, attempt_n), events) in
            grouped(rows.into_iter().filter_map(|(won, _)| won.map(Ok)))?
        {
            let leased =
                |what: &str| StoreError::Corrupt(format!("batch {id} was leased without a {what}"));
            let claim = Claim {
                batch_id: id,
                attempt_id,
                attempt_n,
                lease_owner: batch
                    .lease_owner
                    .clone()
                    .ok_or_else(|| leased("lease owner"))?,
                lease_until: batch.lease_until.ok_or_else(|| leased("lease time"))?,
            };
            tick.claims.push((claim, batch.destination.clone()));
            tick.read.insert(id, (batch, events));
        }
        let exact = walk_exact(heads as usize, claimable, limit);
        tick.more = heads > tick.claims.len() as i64 || !exact;
        Ok(tick)
    }

    /// Startup recovery (spec 6.2): every leased row belongs to a dead process (the flock
    /// guarantees it) and goes to retry, due now, uncounted.
    pub fn recover_all_leases(&mut self, now: f64) -> Result<Vec<RecoveredLease>> {
        self.recover(now, None, &[])
    }

    /// Per-tick recovery: leases past lease_until that no live worker of this process holds.
    /// A live worker's lease is never touched; its own deadline ends that attempt.
    pub fn recover_expired_leases(
        &mut self,
        now: f64,
        live_owners: &[String],
    ) -> Result<Vec<RecoveredLease>> {
        self.recover(now, Some(now), live_owners)
    }

    fn recover(
        &mut self,
        now: f64,
        expired_before: Option<f64>,
        live_owners: &[String],
    ) -> Result<Vec<RecoveredLease>> {
        let tx = self.begin()?;
        let leased: Vec<(i64, Option<String>, Option<f64>)> = {
            let mut stmt = tx.prepare_cached(LEASED_SQL)?;
            stmt.query_map((), |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                .collect::<rusqlite::Result<_>>()?
        };
        let mut recovered = Vec::new();
        for (id, owner, until) in leased {
            if let Some(limit) = expired_before
                && until.is_some_and(|u| u >= limit)
            {
                continue;
            }
            if owner.as_ref().is_some_and(|o| live_owners.contains(o)) {
                continue;
            }
            let n = exec(
                &tx,
                "UPDATE batches SET state = ?3, next_attempt_at = ?2, lease_until = NULL,
                        lease_owner = NULL, last_error = ?4
                 WHERE id = ?1 AND state = 'leased'",
                params![id, now, BatchState::Retry, LEASE_EXPIRED],
            )?;
            one_row(n, || format!("recovering batch {id}'s expired lease"))?;
            exec(
                &tx,
                "UPDATE attempts SET finished_at = ?2, outcome = ?3, klass = ?4, error = ?5,
                        counted = 0
                 WHERE batch_id = ?1 AND finished_at IS NULL",
                params![
                    id,
                    now,
                    AttemptOutcome::Retry,
                    Klass::Transport,
                    LEASE_EXPIRED
                ],
            )?;
            recovered.push(RecoveredLease {
                batch_id: id,
                lease_owner: owner,
            });
        }
        tx.commit()?;
        Ok(recovered)
    }

    /// Make the retry batches `which` names due now, in one transaction (a savepoint of the
    /// tick's when one is open). Returns how many.
    pub fn redue_retries(&mut self, which: Redue<'_>, now: f64) -> Result<usize> {
        let tx = self.begin()?;
        let n = redue_tx(&tx, which, now)?;
        tx.commit()?;
        Ok(n)
    }

    /// The destination's persisted state; a destination seen for the first time is closed.
    pub fn destination(&self, name: &str) -> Result<DestinationRow> {
        destination_tx(&self.conn, name)
    }

    pub fn destinations(&self) -> Result<Vec<DestinationRow>> {
        let sql = format!("SELECT {DESTINATION_COLUMNS} FROM destinations ORDER BY name");
        let mut stmt = self.conn.prepare(&sql)?;
        let rows = stmt
            .query_map((), DestinationRow::from_row)?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }
}

/// `Redue`'s UPDATE on the caller's transaction; how many batches it made due.
pub(super) fn redue_tx(conn: &Connection, which: Redue<'_>, now: f64) -> Result<usize> {
    let (a, b, destination) = match which {
        Redue::Config => (Klass::Config, Klass::Config, None),
        Redue::Recovered(d) => (Klass::Transport, Klass::Throttle, Some(d)),
    };
    exec(conn, REDUE_SQL, params![now, a, b, destination])
}

/// A destination's row, and the same locked (`destination_for_update`): made once, read
/// on every recording and every tick's gates.
static DESTINATION_SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!("SELECT {DESTINATION_COLUMNS} FROM destinations WHERE name = ?1")
});
static DESTINATION_FOR_UPDATE_SQL: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| format!("{} FOR UPDATE", DESTINATION_SQL.as_str()));

pub(super) fn destination_tx(conn: &Connection, name: &str) -> Result<DestinationRow> {
    Ok(
        row(conn, &DESTINATION_SQL, [name], DestinationRow::from_row)?
            .unwrap_or_else(|| DestinationRow::closed(name)),
    )
}

/// `destination_tx` in a write transaction that writes the row back. On PostgreSQL the row
/// is locked (`FOR UPDATE`), made first (closed, as an absent row reads) when the
/// destination has none yet: the dispatcher's recorder takes no spool write lock
/// (`Store::become_recorder`), so it and a writer that does (an operator's pause, a gate
/// the tick opens) change the row one after the other, each on the other's result.
pub(super) fn destination_for_update(conn: &Connection, name: &str) -> Result<DestinationRow> {
    if !conn.is_pg() {
        return destination_tx(conn, name);
    }
    let sql = DESTINATION_FOR_UPDATE_SQL.as_str();
    if let Some(r) = row(conn, sql, [name], DestinationRow::from_row)? {
        return Ok(r);
    }
    exec(
        conn,
        "INSERT INTO destinations (name) VALUES (?1) ON CONFLICT (name) DO NOTHING",
        [name],
    )?;
    row(conn, sql, [name], DestinationRow::from_row)?.ok_or_else(|| {
        StoreError::Invalid(format!(
            "destination {name}: its row vanished as it was made"
        ))
    })
}

pub(super) fn save_destination_tx(conn: &Connection, d: &DestinationRow) -> Result<()> {
    exec(
        conn,
        "INSERT INTO destinations (name, state, consecutive_failures, opened_at, cooldown_s,
                probe_until, last_probe_batch_id, paused_at, paused_by, last_ok_at, last_error,
                retry_after_until)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)
         ON CONFLICT(name) DO UPDATE SET state = excluded.state,
                consecutive_failures = excluded.consecutive_failures,
                opened_at = excluded.opened_at, cooldown_s = excluded.cooldown_s,
                probe_until = excluded.probe_until,
                last_probe_batch_id = excluded.last_probe_batch_id,
                paused_at = excluded.paused_at, paused_by = excluded.paused_by,
                last_ok_at = excluded.last_ok_at, last_error = excluded.last_error,
                retry_after_until = excluded.retry_after_until",
        params![
            d.name,
            d.state,
            d.consecutive_failures,
            d.opened_at,
            d.cooldown_s,
            d.probe_until,
            d.last_probe_batch_id,
            d.paused_at,
            d.paused_by,
            d.last_ok_at,
            d.last_error,
            d.retry_after_until
        ],
    )?;
    Ok(())
}
