//! The enqueue transaction on PostgreSQL (issue 32; `Store::enqueue_group` comes here on a
//! PostgreSQL spool): the contract of `store::enqueue` (the request checks are its own
//! `validate`), written for a database that several writers share, so it takes no write
//! lock (`PG_WRITE_LOCK_KEY`) and locks rows instead. The join rule reads the group's open batch and writes the
//! event into it; two intakes that both found no open batch race on the unique partial
//! index `batches_open_group`, and the loser's request (its savepoint undone) runs again and joins
//! the winner's batch; a writer that finds the open batch locks it (`FOR UPDATE`), so two
//! joins of one batch take turns and each seals on the figures the other left. A dedup id two writers insert at once races the same way on dedup's
//! primary key, and the loser then answers "duplicate". Size seals, tee copies, quarantine,
//! a dedup hit that replays a dead batch (with its audit row) and the `meta` timestamps are
//! as on SQLite. The group of requests shares one transaction and one COMMIT, each request
//! in its own savepoint; a group that stored a new event notifies `PG_WAKE_CHANNEL` in it.
//!
//! Must not: answer for a request before the COMMIT returned (the caller answers after
//! `enqueue_many` returns), or keep a request's writes when it failed.

use super::client::Transaction;
use serde_json::json;
use tokio_postgres::error::SqlState;

use super::super::content::{CanonicalEvent, content_hash};
use super::super::enqueue::{
    Copy, EnqueueOutcome, EnqueueRequest, Quarantine, event_size, raw_is_payload,
    source_last_event_key, validate,
};
use super::super::{Result, StoreError};
use super::{PgStore, pg_error};
use crate::vocab::BatchState;

/// How many times a request runs again after losing a race (the group's open batch, a
/// dedup id) to another writer; each loss means another writer committed, so the writers
/// as a whole always progress. Past this a request is `Busy` (the intake's 503, which the
/// sender retries): with four writers on one group sealing every 7 events, 3 was reached
/// on a loaded machine.
pub const PG_RACE_RETRIES_MAX: usize = 16;

/// Why placing a request failed: a race to run again, or an error.
pub(super) enum Failure {
    Race,
    Store(StoreError),
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Failure {
        Failure::Store(e)
    }
}

pub(super) type Placed<T> = std::result::Result<T, Failure>;

/// The connection's prepared statements, by their text: each statement of the enqueue path
/// is parsed and planned once per connection, so running it is one round trip, not two.
#[derive(Default)]
pub(super) struct Statements(std::collections::HashMap<&'static str, tokio_postgres::Statement>);

/// A transaction (or a request's savepoint) with the connection's prepared statements.
pub(super) struct Tx<'a, 'b> {
    tx: &'a mut Transaction<'b>,
    stmts: &'a mut Statements,
}

type Params<'p> = [&'p (dyn tokio_postgres::types::ToSql + Sync)];

impl Tx<'_, '_> {
    pub(super) fn prepared(
        &mut self,
        sql: &'static str,
    ) -> std::result::Result<tokio_postgres::Statement, tokio_postgres::Error> {
        if let Some(s) = self.stmts.0.get(sql) {
            return Ok(s.clone());
        }
        let s = self.tx.prepare(sql)?;
        self.stmts.0.insert(sql, s.clone());
        Ok(s)
    }
    pub(super) fn execute(
        &mut self,
        sql: &'static str,
        p: &Params<'_>,
    ) -> std::result::Result<u64, tokio_postgres::Error> {
        let s = self.prepared(sql)?;
        self.tx.execute(&s, p)
    }
    pub(super) fn query(
        &mut self,
        sql: &'static str,
        p: &Params<'_>,
    ) -> std::result::Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
        let s = self.prepared(sql)?;
        self.tx.query(&s, p)
    }
    pub(super) fn query_one(
        &mut self,
        sql: &'static str,
        p: &Params<'_>,
    ) -> std::result::Result<tokio_postgres::Row, tokio_postgres::Error> {
        let s = self.prepared(sql)?;
        self.tx.query_one(&s, p)
    }
    pub(super) fn query_opt(
        &mut self,
        sql: &'static str,
        p: &Params<'_>,
    ) -> std::result::Result<Option<tokio_postgres::Row>, tokio_postgres::Error> {
        let s = self.prepared(sql)?;
        self.tx.query_opt(&s, p)
    }
}

/// A driver error inside a request: a unique violation is a lost race, and so is a deadlock
/// (two requests' tee copies locking two groups' open batches in opposite orders): rolling
/// back to the request's savepoint releases what it locked, and it runs again.
pub(super) fn fail(target: &str, e: tokio_postgres::Error) -> Failure {
    let code = e.code();
    if code == Some(&SqlState::UNIQUE_VIOLATION)
        || code == Some(&SqlState::T_R_DEADLOCK_DETECTED)
        || code == Some(&SqlState::T_R_SERIALIZATION_FAILURE)
    {
        Failure::Race
    } else {
        Failure::Store(pg_error(target, &e))
    }
}

impl PgStore {
    /// Enqueue one request in its own transaction.
    pub fn enqueue(&mut self, req: &EnqueueRequest) -> Result<EnqueueOutcome> {
        let mut out = self.enqueue_many(std::slice::from_ref(req))?;
        out.pop()
            .unwrap_or_else(|| Err(StoreError::Invalid("empty enqueue".into())))
    }

    /// Enqueue a group of requests in one transaction, as `Store::enqueue_many`: the outer
    /// `Err` means nothing was kept (the COMMIT failed, or the database became unreachable
    /// or full, which fails the group so the caller answers 503 to all of it); an inner
    /// `Err` left nothing of that request behind.
    pub fn enqueue_many(&mut self, reqs: &[EnqueueRequest]) -> Result<Vec<Result<EnqueueOutcome>>> {
        self.enqueue_group(reqs, &[])
    }

    /// `enqueue_many` that also adds the intake's rejection counts in the same transaction
    /// (as `Store::enqueue_group`).
    pub fn enqueue_group(
        &mut self,
        reqs: &[EnqueueRequest],
        rejections: &[crate::store::RejectionCount],
    ) -> Result<Vec<Result<EnqueueOutcome>>> {
        let target = self.target.clone();
        let err = |e: tokio_postgres::Error| pg_error(&target, &e);
        let PgStore { client, stmts, .. } = self;
        let mut tx = client.transaction();
        // Each request is checked once (a refusal is its answer on every path below).
        let mut checks: Vec<Result<()>> = reqs.iter().map(validate).collect();
        let valid: Vec<bool> = checks.iter().map(Result::is_ok).collect();
        // First the whole group planned in memory and written with a few statements
        // (`grouped`); a group it does not plan, and one that lost a race or failed a
        // statement there, comes back undone and runs below.
        // No savepoint around it (two round trips per group): what it wrote is undone by
        // rolling the transaction back, the only writes in it so far.
        let placed = super::grouped::place_group(
            &mut Tx {
                tx: &mut tx,
                stmts: &mut *stmts,
            },
            &target,
            reqs,
            &valid,
        );
        let planned: Option<Vec<EnqueueOutcome>> = match placed {
            Ok(Some(outcomes)) => Some(outcomes),
            // Nothing written.
            Ok(None) => None,
            Err(Failure::Store(e)) if e.is_weather() => return Err(e),
            Err(_) => {
                tx.rollback().map_err(err)?;
                tx = client.transaction();
                None
            }
        };
        // Then the requests one after another under ONE savepoint: a savepoint per request
        // is two more round trips per event (the profile's 13.6 %). Only when a request
        // fails after it may have written (a lost race, a statement's error) is the group
        // undone and run again below, each request in a savepoint of its own, which gives
        // the results the per-request savepoints would have given from the start.
        let grouped = if planned.is_some() {
            planned
        } else {
            let mut sp = tx.savepoint("requests");
            let mut out = Vec::with_capacity(reqs.len());
            let mut whole = true;
            for req in reqs.iter().zip(&valid).filter(|(_, v)| **v).map(|(r, _)| r) {
                let placed = place(
                    &mut Tx {
                        tx: &mut sp,
                        stmts: &mut *stmts,
                    },
                    &target,
                    req,
                );
                match placed {
                    Ok(outcome) => out.push(outcome),
                    Err(Failure::Store(e)) if e.is_weather() => return Err(e),
                    Err(_) => {
                        whole = false;
                        break;
                    }
                }
            }
            if whole {
                sp.commit().map_err(err)?;
                Some(out)
            } else {
                // Dropping the savepoint rolls the group back.
                None
            }
        };
        let mut placed_each = Vec::new();
        for req in reqs
            .iter()
            .zip(&valid)
            .filter(|(_, v)| grouped.is_none() && **v)
            .map(|(r, _)| r)
        {
            let mut races = 0;
            let result = loop {
                let mut sp = tx.savepoint("request");
                let placed = place(
                    &mut Tx {
                        tx: &mut sp,
                        stmts: &mut *stmts,
                    },
                    &target,
                    req,
                );
                match placed {
                    Ok(outcome) => {
                        sp.commit().map_err(err)?;
                        break Ok(outcome);
                    }
                    // Dropping the savepoint rolls it back.
                    Err(Failure::Race) if races < PG_RACE_RETRIES_MAX => races += 1,
                    Err(Failure::Race) => break Err(StoreError::Busy),
                    Err(Failure::Store(e)) if e.is_weather() => return Err(e),
                    Err(Failure::Store(e)) => break Err(e),
                }
            };
            placed_each.push(result);
        }
        // The answers in the requests' order: a refusal where `validate` refused, else the
        // next placed result.
        let mut outcomes = match grouped {
            Some(out) => out.into_iter().map(Ok).collect(),
            None => placed_each,
        }
        .into_iter();
        let results: Vec<Result<EnqueueOutcome>> = checks
            .iter_mut()
            .map(|check| match std::mem::replace(check, Ok(())) {
                Err(e) => Err(e),
                Ok(()) => outcomes.next().unwrap_or_else(|| {
                    Err(StoreError::Corrupt(
                        "an enqueue path answered fewer requests than it placed".into(),
                    ))
                }),
            })
            .collect();
        let kept = reqs
            .iter()
            .zip(&results)
            .filter_map(|(req, r)| r.as_ref().is_ok_and(EnqueueOutcome::is_new).then_some(req));
        touch_meta(
            &mut Tx {
                tx: &mut tx,
                stmts: &mut *stmts,
            },
            &target,
            kept,
        )?;
        for c in rejections.iter().filter(|c| c.count > 0) {
            tx.execute(
                "INSERT INTO rejections (hour, source, reason, count) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (hour, source, reason)
                 DO UPDATE SET count = rejections.count + excluded.count",
                &[&c.hour, &c.source, &c.reason, &c.count],
            )
            .map_err(err)?;
        }
        if results
            .iter()
            .any(|r| r.as_ref().is_ok_and(EnqueueOutcome::is_new))
        {
            // Delivered to listening dispatchers when (and only if) this COMMIT succeeds;
            // sent with the COMMIT, in the same write.
            tx.defer(&format!("NOTIFY {}", super::PG_WAKE_CHANNEL));
        }
        crate::failpoint::hit("enqueue.before_commit");
        tx.commit().map_err(err)?;
        crate::failpoint::hit("enqueue.after_commit");
        Ok(results)
    }
}

/// `meta.last_enqueue_at` and each source's `last_event_at`, from the requests that stored a
/// new event (the last one of each source wins).
fn touch_meta<'a>(
    tx: &mut Tx<'_, '_>,
    target: &str,
    kept: impl Iterator<Item = &'a EnqueueRequest>,
) -> Result<()> {
    let mut last: Option<f64> = None;
    let mut per_source: Vec<(&str, f64)> = Vec::new();
    for req in kept {
        last = Some(req.now);
        match per_source.iter_mut().find(|(s, _)| *s == req.source) {
            Some(entry) => entry.1 = req.now,
            None => per_source.push((&req.source, req.now)),
        }
    }
    let Some(last) = last else {
        return Ok(());
    };
    let mut keys = vec!["last_enqueue_at".to_string()];
    let mut values = vec![last.to_string()];
    for (source, now) in per_source {
        keys.push(source_last_event_key(source));
        values.push(now.to_string());
    }
    // One statement for them all (the keys are distinct).
    tx.execute(
        "INSERT INTO meta (key, value) SELECT * FROM unnest($1::text[], $2::text[])
         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        &[&keys, &values],
    )
    .map_err(|e| pg_error(target, &e))?;
    Ok(())
}

/// Dedup, the copies and quarantine of one validated request.
fn place(tx: &mut Tx<'_, '_>, target: &str, req: &EnqueueRequest) -> Placed<EnqueueOutcome> {
    let now = req.now;
    let f = |e| fail(target, e);
    if let Some(q) = &req.quarantine {
        return quarantine(tx, target, req, q);
    }
    let mut repoint = false;
    if let Some(dedup_id) = &req.dedup_id {
        let hit = tx
            .query_opt(
                "SELECT event_id, seen_at FROM dedup WHERE source = $1 AND dedup_id = $2",
                &[&req.source, dedup_id],
            )
            .map_err(f)?
            .map(|r| (r.get::<_, i64>(0), r.get::<_, f64>(1)));
        if let Some((event_id, seen_at)) = hit {
            if seen_at + req.dedup_window_s < now {
                tx.execute(
                    "DELETE FROM dedup WHERE source = $1 AND dedup_id = $2",
                    &[&req.source, dedup_id],
                )
                .map_err(f)?;
            } else {
                let batch = tx
                    .query_opt(
                        "SELECT b.id, b.state FROM events e JOIN batches b ON b.id = e.batch_id
                         WHERE e.id = $1",
                        &[&event_id],
                    )
                    .map_err(f)?
                    .map(|r| (r.get::<_, i64>(0), r.get::<_, String>(1)));
                let batch = match batch {
                    Some((id, state)) => Some((
                        id,
                        BatchState::parse(&state).ok_or_else(|| {
                            StoreError::Corrupt(format!("batch {id} has state {state:?}"))
                        })?,
                    )),
                    None => None,
                };
                match batch {
                    Some((batch_id, BatchState::Dead)) => {
                        bump_dup(tx, target, &req.source, dedup_id)?;
                        replay_dead(tx, target, batch_id, now)?;
                        return Ok(EnqueueOutcome::Replayed { batch_id });
                    }
                    Some((_, BatchState::Dropped)) => repoint = true,
                    Some((
                        _,
                        BatchState::Open
                        | BatchState::Sealed
                        | BatchState::Leased
                        | BatchState::Retry
                        | BatchState::Delivered,
                    ))
                    | None => {
                        bump_dup(tx, target, &req.source, dedup_id)?;
                        return Ok(EnqueueOutcome::Duplicate { event_id });
                    }
                }
            }
        }
    }
    let mut copies = Vec::with_capacity(1 + req.tees.len());
    let mut destinations: Vec<&str> = Vec::with_capacity(1 + req.tees.len());
    for copy in std::iter::once(&req.primary).chain(req.tees.iter()) {
        if destinations.contains(&copy.destination.as_str()) {
            continue;
        }
        destinations.push(&copy.destination);
        let (event_id, batch_id) = place_copy(tx, target, req, copy)?;
        crate::failpoint::hit("enqueue.after_copy");
        copies.push((event_id, batch_id, copy.route.clone()));
    }
    if let Some(dedup_id) = &req.dedup_id {
        let primary_event = copies[0].0;
        if repoint {
            tx.execute(
                "UPDATE dedup SET event_id = $3, seen_at = $4 WHERE source = $1 AND dedup_id = $2",
                &[&req.source, dedup_id, &primary_event, &now],
            )
            .map_err(f)?;
        } else {
            tx.execute(
                "INSERT INTO dedup (source, dedup_id, event_id, seen_at, dup_count)
                 VALUES ($1, $2, $3, $4, 0)",
                &[&req.source, dedup_id, &primary_event, &now],
            )
            .map_err(f)?;
        }
    }
    Ok(EnqueueOutcome::Queued { copies })
}

fn bump_dup(tx: &mut Tx<'_, '_>, target: &str, source: &str, dedup_id: &str) -> Placed<()> {
    tx.execute(
        "UPDATE dedup SET dup_count = dup_count + 1 WHERE source = $1 AND dedup_id = $2",
        &[&source, &dedup_id],
    )
    .map_err(|e| fail(target, e))?;
    Ok(())
}

/// A dedup hit on a dead batch replays it (spec 7), with the audit row the operator's
/// replay writes.
fn replay_dead(tx: &mut Tx<'_, '_>, target: &str, batch_id: i64, now: f64) -> Placed<()> {
    let f = |e| fail(target, e);
    let n = tx
        .execute(
            "UPDATE batches SET state = 'retry', finished = 0, attempts = 0, next_attempt_at = $2,
                    not_before = $2, last_class = NULL
             WHERE id = $1 AND state = 'dead' AND destination <> 'quarantine'",
            &[&batch_id, &now],
        )
        .map_err(f)?;
    if n != 1 {
        return Err(StoreError::WrongState {
            batch: batch_id,
            state: "not dead".into(),
            op: "replay",
            takes: "only a dead batch",
        }
        .into());
    }
    tx.execute(
        "INSERT INTO audit (at, action, batch_id, target, detail) VALUES ($1, 'replay', $2, NULL, $3)",
        &[&now, &batch_id, &json!({ "why": "dedup hit" }).to_string()],
    )
    .map_err(f)?;
    Ok(())
}

/// The join rule (spec 5) for one copy: join the group's open batch, sealing it first when
/// the event would overflow its bytes, or open a new one; seal at the size bounds.
fn place_copy(
    tx: &mut Tx<'_, '_>,
    target: &str,
    req: &EnqueueRequest,
    copy: &Copy,
) -> Placed<(i64, i64)> {
    let f = |e| fail(target, e);
    let now = req.now;
    let size = event_size(req);
    let open = tx
        .query_opt(
            // FOR UPDATE: another writer joining the same batch waits here, then reads the
            // figures that writer left (or finds the batch sealed and opens a new one), so
            // the size seal decides on current counts.
            "SELECT id, count, bytes, max_events, max_bytes FROM batches
             WHERE route = $1 AND key = $2 AND state = 'open' FOR UPDATE",
            &[&copy.route, &req.key],
        )
        .map_err(f)?
        .map(|r| {
            (
                r.get::<_, i64>(0),
                r.get::<_, i64>(1),
                r.get::<_, i64>(2),
                r.get::<_, i64>(3),
                r.get::<_, i64>(4),
            )
        });
    let mut found = None;
    if let Some((id, count, bytes, max_events, max_bytes)) = open {
        if bytes + size > max_bytes && count >= 1 {
            seal(tx, target, id, now)?;
        } else {
            found = Some((id, count, bytes, max_events, max_bytes));
        }
    }
    let (batch_id, count, bytes, max_events, max_bytes) = match found {
        Some(b) => b,
        None => {
            let w = copy.window;
            let id: i64 = tx
                .query_one(
                    "INSERT INTO batches (route, source, destination, key, state, finished,
                                          first_at, last_at, quiet_s, max_s, max_events,
                                          max_bytes, count, bytes)
                     VALUES ($1, $2, $3, $4, 'open', 0, $5, $5, $6, $7, $8, $9, 0, 0)
                     RETURNING id",
                    &[
                        &copy.route,
                        &req.source,
                        &copy.destination,
                        &req.key,
                        &now,
                        &w.quiet_s,
                        &w.max_s,
                        &w.max_events,
                        &w.max_bytes,
                    ],
                )
                .map_err(f)?
                .get(0);
            (id, 0, 0, w.max_events, w.max_bytes)
        }
    };
    let event_id = insert_event(tx, target, req, &copy.route, batch_id, size)?;
    let joined = tx
        .execute(
            "UPDATE batches SET last_at = greatest(last_at, $2), count = count + 1,
                    bytes = bytes + $3, first_event_id = coalesce(first_event_id, $4),
                    open_hash = NULL
             WHERE id = $1 AND state = 'open'",
            &[&batch_id, &now, &size, &event_id],
        )
        .map_err(f)?;
    if joined != 1 {
        return Err(StoreError::Corrupt(format!(
            "batch {batch_id} stopped being open while an event joined it"
        ))
        .into());
    }
    if count + 1 >= max_events || bytes + size >= max_bytes {
        seal(tx, target, batch_id, now)?;
    }
    Ok((event_id, batch_id))
}

fn insert_event(
    tx: &mut Tx<'_, '_>,
    target: &str,
    req: &EnqueueRequest,
    route: &str,
    batch_id: i64,
    size: i64,
) -> Placed<i64> {
    let same = raw_is_payload(req);
    let raw = if same { None } else { req.raw.as_deref() };
    let row = tx
        .query_one(
            "INSERT INTO events (source, route, batch_id, event_type, dedup_id, received_at,
                                 payload, raw, raw_is_payload, headers, size)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
             RETURNING id",
            &[
                &req.source,
                &route,
                &batch_id,
                &req.event_type,
                &req.dedup_id,
                &req.now,
                &req.payload,
                &raw,
                &i64::from(same),
                &req.headers,
                &size,
            ],
        )
        .map_err(|e| fail(target, e))?;
    Ok(row.get(0))
}

/// Seal an open batch: its content is frozen and hashed (spec 6.1).
fn seal(tx: &mut Tx<'_, '_>, target: &str, batch_id: i64, now: f64) -> Placed<()> {
    let f = |e| fail(target, e);
    let events: Vec<CanonicalEvent> = tx
        .query(
            "SELECT id, event_type, received_at, dedup_id, payload FROM events
             WHERE batch_id = $1 AND excluded_at IS NULL ORDER BY id",
            &[&batch_id],
        )
        .map_err(f)?
        .iter()
        .map(|r| CanonicalEvent {
            id: r.get(0),
            event_type: r.get(1),
            received_at: r.get(2),
            dedup_id: r.get(3),
            payload: r.get(4),
        })
        .collect();
    let hash =
        content_hash(&events).map_err(|e| StoreError::Corrupt(format!("batch {batch_id}: {e}")))?;
    let n = tx
        .execute(
            "UPDATE batches SET state = 'sealed', sealed_at = $2, content_hash = $3
             WHERE id = $1 AND state = 'open'",
            &[&batch_id, &now, &hash],
        )
        .map_err(f)?;
    if n != 1 {
        return Err(
            StoreError::Corrupt(format!("sealing batch {batch_id}: it was not open")).into(),
        );
    }
    Ok(())
}

/// A quarantine batch of one stored request: dead at birth, never delivered (spec 9).
fn quarantine(
    tx: &mut Tx<'_, '_>,
    target: &str,
    req: &EnqueueRequest,
    q: &Quarantine,
) -> Placed<EnqueueOutcome> {
    let size = event_size(req);
    let batch_id: i64 = tx
        .query_one(
            "INSERT INTO batches (route, source, destination, key, state, finished, first_at,
                                  last_at, quiet_s, max_s, max_events, max_bytes, count, bytes,
                                  last_error, last_class)
             VALUES ($1, $1, 'quarantine', 'quarantine', 'dead', 1, $2, $2, 0, 0, 1, $3, 1, $3,
                     $4, 'quarantine')
             RETURNING id",
            &[&req.source, &req.now, &size.max(1), &q.reason()],
        )
        .map_err(|e| fail(target, e))?
        .get(0);
    let event_id = insert_event(tx, target, req, &req.source, batch_id, size)?;
    Ok(EnqueueOutcome::Quarantined { event_id, batch_id })
}

#[cfg(test)]
mod tests {
    use super::super::super::tests::{req, window};
    use super::super::super::testutil::temp_pg as temp_pg_store;
    use super::*;

    /// Four writers on four connections, one group: the join rule holds across writers (at
    /// most one open batch, never more events than max_events in a batch, every event in
    /// exactly one batch), the races lost on `batches_open_group` run again and join.
    #[test]
    fn concurrent_writers_keep_one_open_batch_per_group_and_the_size_bound() {
        let Some((cluster, mut store)) = temp_pg_store() else {
            return;
        };
        let url = cluster.url("spool");
        const WRITERS: usize = 4;
        const EACH: usize = 50;
        let threads: Vec<_> = (0..WRITERS)
            .map(|w| {
                let url = url.clone();
                std::thread::spawn(move || {
                    let mut s = PgStore::open(&url, super::super::super::Role::Reader).unwrap();
                    for i in 0..EACH {
                        let mut r = req(
                            "r",
                            "k",
                            &format!("{{\"w\":{w},\"i\":{i}}}"),
                            10.0 + i as f64,
                        );
                        r.primary.window = window(60.0, 600.0, 7, 1_000_000);
                        // Busy is the intake's 503: the sender sends again.
                        let mut tries = 0;
                        let out = loop {
                            match s.enqueue(&r) {
                                Err(StoreError::Busy) if tries < 50 => tries += 1,
                                other => break other.unwrap(),
                            }
                        };
                        assert!(matches!(out, EnqueueOutcome::Queued { .. }), "{out:?}");
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let counts: std::collections::BTreeMap<BatchState, i64> =
            store.batch_counts().unwrap().into_iter().collect();
        assert!(counts[&BatchState::Open] <= 1, "{counts:?}");
        let rows = store
            .client
            .query(
                "SELECT b.count, (SELECT count(*) FROM events e WHERE e.batch_id = b.id)
                 FROM batches b",
                &[],
            )
            .unwrap();
        let mut total = 0;
        for r in rows {
            let (count, events): (i64, i64) = (r.get(0), r.get(1));
            assert!(
                count <= 7 && count == events,
                "count {count}, events {events}"
            );
            total += events;
        }
        assert_eq!(total, (WRITERS * EACH) as i64);
        assert_eq!(counts[&BatchState::Sealed], (WRITERS * EACH / 7) as i64);
    }
}
