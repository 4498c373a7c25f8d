//! Operator transitions (spec 4.1, 16): replay, retry, split, exclude, drop, pause and
//! resume. Each is one transaction that also writes an `audit` row saying what happened.
//! Automatic code never calls `drop_batches`: dropped exists so an operator can discard a
//! batch deliberately and the audit trail says so.

use super::db::Connection;
use rusqlite::{OptionalExtension, params};
use serde_json::json;

use super::cached::one_row;
use super::delivery::{canonical_events, destination_for_update, hash_tx, save_destination_tx};
use super::enqueue::{EnqueueOutcome, EnqueueRequest, enqueue_one};
use super::{Result, Store, StoreError};
use crate::vocab::{BatchState, BreakerState};

/// How to cut a batch (spec 16 `split`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SplitSpec {
    /// Parts of at most N events.
    MaxEvents(i64),
    /// Parts of at most B bytes (a single larger event gets a part of its own).
    MaxBytes(i64),
    /// Two parts: the events before this event id, and the rest.
    At(i64),
}

/// A quarantined request as stored, handed back to classification on replay (spec 9).
#[derive(Debug, Clone, PartialEq)]
pub struct StoredRequest {
    pub event_id: i64,
    pub source: String,
    pub received_at: f64,
    pub raw: Option<Vec<u8>>,
    /// JSON object text of the stored request headers (auth headers already removed).
    pub headers: String,
}

/// One audit row; `by` (the connection's actor, when one is set) goes into the detail.
#[allow(clippy::too_many_arguments)]
pub(super) fn audit(
    conn: &Connection,
    by: Option<&str>,
    now: f64,
    action: &str,
    batch_id: Option<i64>,
    target: Option<&str>,
    mut detail: serde_json::Value,
) -> Result<()> {
    if let (Some(who), Some(obj)) = (by, detail.as_object_mut()) {
        obj.entry("by").or_insert_with(|| json!(who));
    }
    conn.execute(
        "INSERT INTO audit (at, action, batch_id, target, detail) VALUES (?1, ?2, ?3, ?4, ?5)",
        params![now, action, batch_id, target, detail.to_string()],
    )?;
    Ok(())
}

fn batch_state(conn: &Connection, batch_id: i64) -> Result<(BatchState, String)> {
    batch_state_by(
        conn,
        batch_id,
        "SELECT state, destination FROM batches WHERE id = ?1",
    )
}

/// `batch_state`, with the batch's row locked on PostgreSQL, where intakes write beside the
/// spool's write lock: an intake joining the batch commits first, and every statement after
/// this one reads its event (a statement that waited for the row's lock itself would read
/// the other tables as of its start). SQLite has one writer, whose transaction holds it all.
fn batch_state_locked(conn: &Connection, batch_id: i64) -> Result<(BatchState, String)> {
    if !conn.is_pg() {
        return batch_state(conn, batch_id);
    }
    batch_state_by(
        conn,
        batch_id,
        "SELECT state, destination FROM batches WHERE id = ?1 FOR UPDATE",
    )
}

fn batch_state_by(conn: &Connection, batch_id: i64, sql: &str) -> Result<(BatchState, String)> {
    conn.query_row(sql, [batch_id], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?
        .ok_or_else(|| StoreError::NotFound(format!("batch {batch_id}")))
}

/// dead -> retry, due now, attempts = 0 (spec 4.1). Content stays frozen.
pub(super) fn replay_dead_tx(
    conn: &Connection,
    by: Option<&str>,
    batch_id: i64,
    now: f64,
    why: &str,
) -> Result<()> {
    let n = conn.execute(
        "UPDATE batches SET state = 'retry', finished = 0, attempts = 0, next_attempt_at = ?2,
                not_before = ?2, last_class = NULL
         WHERE id = ?1 AND state = 'dead' AND destination != 'quarantine'",
        params![batch_id, now],
    )?;
    if n != 1 {
        let (state, _) = batch_state(conn, batch_id)?;
        return Err(StoreError::WrongState {
            batch: batch_id,
            state: state.to_string(),
            op: "replay",
            takes: "only a dead batch",
        });
    }
    audit(
        conn,
        by,
        now,
        "replay",
        Some(batch_id),
        None,
        json!({ "why": why }),
    )
}

impl Store {
    /// Whether a batch is a quarantine batch (its replay reclassifies instead).
    pub fn is_quarantine(&self, batch_id: i64) -> Result<bool> {
        let (_, destination) = batch_state(&self.conn, batch_id)?;
        Ok(destination == "quarantine")
    }

    /// Replay dead batches: dead -> retry, due now, attempts reset. Each batch is its own
    /// transaction so one wrong id does not stop the rest; results follow `ids`.
    pub fn replay(&mut self, ids: &[i64], now: f64) -> Result<Vec<Result<()>>> {
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            let by = self.actor.clone();
            let tx = self.begin()?;
            match replay_dead_tx(&tx, by.as_deref(), *id, now, "operator") {
                Ok(()) => {
                    tx.commit()?;
                    out.push(Ok(()));
                }
                Err(e) => out.push(Err(e)),
            }
        }
        Ok(out)
    }

    /// The stored requests of a quarantine batch, for reclassification.
    pub fn quarantined_requests(&self, batch_id: i64) -> Result<Vec<StoredRequest>> {
        let mut stmt = self.conn.prepare(&format!(
            "SELECT id, source, received_at, {}, headers
             FROM events WHERE batch_id = ?1 ORDER BY id",
            super::enqueue::RAW_BODY_SQL
        ))?;
        let rows = stmt
            .query_map([batch_id], |r| {
                Ok(StoredRequest {
                    event_id: r.get(0)?,
                    source: r.get(1)?,
                    received_at: r.get(2)?,
                    raw: r.get(3)?,
                    headers: r.get(4)?,
                })
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    /// Replay of a quarantine batch (spec 9): every stored request becomes a normal event
    /// (with its copies) through `reclassified`, and the quarantine batch is marked
    /// delivered with result "reclassified", all in one transaction.
    pub fn reclassify_quarantine(
        &mut self,
        batch_id: i64,
        reclassified: &[EnqueueRequest],
        now: f64,
    ) -> Result<Vec<EnqueueOutcome>> {
        let by = self.actor.clone();
        let tx = self.begin()?;
        let (state, destination) = batch_state(&tx, batch_id)?;
        if destination != "quarantine" || state != BatchState::Dead {
            return Err(StoreError::WrongState {
                batch: batch_id,
                state: state.to_string(),
                op: "reclassify",
                takes: "only a dead quarantine batch",
            });
        }
        let mut outcomes = Vec::with_capacity(reclassified.len());
        for req in reclassified {
            outcomes.push(enqueue_one(&tx, req)?);
        }
        let n = tx.execute(
            "UPDATE batches SET state = 'delivered', finished = 1, delivered_at = ?2,
                    result = 'reclassified'
             WHERE id = ?1 AND state = 'dead'",
            params![batch_id, now],
        )?;
        one_row(n, || format!("reclassifying dead batch {batch_id}"))?;
        audit(
            &tx,
            by.as_deref(),
            now,
            "reclassify",
            Some(batch_id),
            None,
            json!({ "events": reclassified.len() }),
        )?;
        tx.commit()?;
        Ok(outcomes)
    }

    /// retry -> due now (skip the backoff).
    pub fn retry_now(&mut self, batch_id: i64, now: f64) -> Result<()> {
        let by = self.actor.clone();
        let tx = self.begin()?;
        let n = tx.execute(
            "UPDATE batches SET next_attempt_at = ?2 WHERE id = ?1 AND state = 'retry'",
            params![batch_id, now],
        )?;
        if n != 1 {
            let (state, _) = batch_state(&tx, batch_id)?;
            return Err(StoreError::WrongState {
                batch: batch_id,
                state: state.to_string(),
                op: "retry",
                takes: "only a batch in state retry (waiting out its backoff); a dead batch is sent again with hookspool replay",
            });
        }
        audit(
            &tx,
            by.as_deref(),
            now,
            "retry",
            Some(batch_id),
            None,
            json!({}),
        )?;
        tx.commit()?;
        Ok(())
    }

    /// Cut a sealed, retry or dead batch into new batches of the same group (spec 16).
    /// The parts are created sealed (content frozen, hash set) with not_before = now rather
    /// than open: an open part would break "at most one open batch per group" and could
    /// take new events. The original becomes dropped with result "split". Returns the new
    /// batch ids in group order.
    pub fn split(&mut self, batch_id: i64, spec: SplitSpec, now: f64) -> Result<Vec<i64>> {
        let by = self.actor.clone();
        let tx = self.begin()?;
        let (state, destination) = batch_state(&tx, batch_id)?;
        let splittable = match state {
            BatchState::Sealed | BatchState::Retry | BatchState::Dead => true,
            BatchState::Open | BatchState::Leased | BatchState::Delivered | BatchState::Dropped => {
                false
            }
        };
        if !splittable || destination == "quarantine" {
            return Err(StoreError::WrongState {
                batch: batch_id,
                state: state.to_string(),
                op: "split",
                takes: "only a sealed, retry or dead batch (not a quarantine)",
            });
        }
        let events: Vec<(i64, i64, f64, bool)> = {
            let mut stmt = tx.prepare(
                "SELECT id, size, received_at, excluded_at IS NOT NULL FROM events
                 WHERE batch_id = ?1 ORDER BY id",
            )?;
            stmt.query_map([batch_id], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
            })?
            .collect::<rusqlite::Result<_>>()?
        };
        let parts = cut(&events, spec);
        if parts.len() < 2 {
            return Err(StoreError::Invalid(format!(
                "batch {batch_id}: that split leaves one part; choose a smaller size or another --at"
            )));
        }
        let mut new_ids = Vec::with_capacity(parts.len());
        for part in &parts {
            let included: Vec<&(i64, i64, f64, bool)> = part.iter().filter(|e| !e.3).collect();
            let first_at = part.iter().map(|e| e.2).fold(f64::INFINITY, f64::min);
            let last_at = part.iter().map(|e| e.2).fold(f64::NEG_INFINITY, f64::max);
            let bytes: i64 = included.iter().map(|e| e.1).sum();
            tx.execute(
                "INSERT INTO batches (route, source, destination, key, state, finished, first_at,
                        last_at, quiet_s, max_s, max_events, max_bytes, not_before, count,
                        bytes, sealed_at)
                 SELECT route, source, destination, key, 'sealed', 0, ?2, ?3, quiet_s, max_s,
                        max_events, max_bytes, ?4, ?5, ?6, ?4
                 FROM batches WHERE id = ?1",
                params![
                    batch_id,
                    first_at,
                    last_at,
                    now,
                    included.len() as i64,
                    bytes
                ],
            )?;
            let new_id = tx.last_insert_rowid();
            for e in part {
                tx.execute(
                    "UPDATE events SET batch_id = ?2 WHERE id = ?1",
                    params![e.0, new_id],
                )?;
            }
            let hash = hash_tx(&tx, new_id)?;
            // The part's head key (first_event_id): its smallest event id.
            let first_event_id = part.iter().map(|e| e.0).min();
            let n = tx.execute(
                "UPDATE batches SET content_hash = ?2, first_event_id = ?3 WHERE id = ?1",
                params![new_id, hash, first_event_id],
            )?;
            one_row(n, || format!("sealing part {new_id} of batch {batch_id}"))?;
            new_ids.push(new_id);
        }
        let n = tx.execute(
            "UPDATE batches SET state = 'dropped', finished = 1, result = 'split', dropped_at = ?2,
                    lease_until = NULL, lease_owner = NULL
             WHERE id = ?1 AND state IN ('sealed', 'retry', 'dead')",
            params![batch_id, now],
        )?;
        one_row(n, || format!("retiring split batch {batch_id}"))?;
        audit(
            &tx,
            by.as_deref(),
            now,
            "split",
            Some(batch_id),
            None,
            json!({ "into": new_ids, "spec": format!("{spec:?}") }),
        )?;
        tx.commit()?;
        Ok(new_ids)
    }

    /// Exclude events from a batch's document (spec 3): they stay stored and listed; count,
    /// bytes and (for a sealed batch) content_hash are recomputed over the rest.
    pub fn exclude(&mut self, batch_id: i64, event_ids: &[i64], now: f64) -> Result<()> {
        let by = self.actor.clone();
        let tx = self.begin()?;
        // An open batch may be taking an intake's event: its count and bytes below are
        // recomputed after that intake's commit, not over the events before it.
        let (state, destination) = batch_state_locked(&tx, batch_id)?;
        let excludable = match state {
            BatchState::Open | BatchState::Sealed | BatchState::Retry | BatchState::Dead => true,
            BatchState::Leased | BatchState::Delivered | BatchState::Dropped => false,
        };
        if !excludable || destination == "quarantine" {
            return Err(StoreError::WrongState {
                batch: batch_id,
                state: state.to_string(),
                op: "exclude",
                takes: "only an open, sealed, retry or dead batch (not a quarantine)",
            });
        }
        for id in event_ids {
            let n = tx.execute(
                "UPDATE events SET excluded_at = coalesce(excluded_at, ?3)
                 WHERE id = ?1 AND batch_id = ?2",
                params![id, batch_id, now],
            )?;
            if n != 1 {
                return Err(StoreError::NotFound(format!(
                    "event {id} in batch {batch_id}"
                )));
            }
        }
        let remaining = canonical_events(&tx, batch_id)?;
        if remaining.is_empty() {
            return Err(StoreError::Invalid(format!(
                "excluding those events leaves batch {batch_id} empty; use `hookspool drop {batch_id} --yes` instead"
            )));
        }
        let n = tx.execute(
            "UPDATE batches SET
                open_hash = NULL,
                count = (SELECT count(*) FROM events WHERE batch_id = ?1 AND excluded_at IS NULL),
                bytes = (SELECT coalesce(sum(size), 0) FROM events
                         WHERE batch_id = ?1 AND excluded_at IS NULL)
             WHERE id = ?1 AND state = ?2",
            params![batch_id, state],
        )?;
        one_row(n, || {
            format!("recounting batch {batch_id} after an exclude")
        })?;
        if state != BatchState::Open {
            let hash = hash_tx(&tx, batch_id)?;
            let n = tx.execute(
                "UPDATE batches SET content_hash = ?2 WHERE id = ?1 AND state = ?3",
                params![batch_id, hash, state],
            )?;
            one_row(n, || format!("rehashing batch {batch_id} after an exclude"))?;
        }
        audit(
            &tx,
            by.as_deref(),
            now,
            "exclude",
            Some(batch_id),
            None,
            json!({ "events": event_ids }),
        )?;
        tx.commit()?;
        Ok(())
    }

    /// open | sealed | retry | dead -> dropped (operator only). Results follow `ids`.
    pub fn drop_batches(&mut self, ids: &[i64], now: f64) -> Result<Vec<Result<()>>> {
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            let by = self.actor.clone();
            let tx = self.begin()?;
            let n = tx.execute(
                "UPDATE batches SET state = 'dropped', finished = 1, dropped_at = ?2,
                        result = 'dropped'
                 WHERE id = ?1 AND state IN ('open', 'sealed', 'retry', 'dead')",
                params![id, now],
            )?;
            if n != 1 {
                let r = batch_state(&tx, *id).and_then(|(state, _)| {
                    Err(StoreError::WrongState {
                        batch: *id,
                        state: state.to_string(),
                        op: "drop",
                        takes: "only an open, sealed, retry or dead batch",
                    })
                });
                out.push(r);
                continue;
            }
            audit(&tx, by.as_deref(), now, "drop", Some(*id), None, json!({}))?;
            tx.commit()?;
            out.push(Ok(()));
        }
        Ok(out)
    }

    /// Operator gate: paused means spool only (spec 4.2).
    pub fn pause(
        &mut self,
        destination: &str,
        by: &str,
        reason: Option<&str>,
        now: f64,
    ) -> Result<()> {
        let actor = self.actor.clone();
        let tx = self.begin()?;
        let mut d = destination_for_update(&tx, destination)?;
        d.state = BreakerState::Paused;
        d.paused_at = Some(now);
        d.paused_by = Some(by.to_string());
        if let Some(r) = reason {
            d.last_error = Some(r.to_string());
        }
        save_destination_tx(&tx, &d)?;
        audit(
            &tx,
            actor.as_deref(),
            now,
            "pause",
            None,
            Some(destination),
            json!({ "by": by }),
        )?;
        tx.commit()?;
        Ok(())
    }

    /// paused (or any state) -> closed with the counters reset (spec 4.2).
    pub fn resume(&mut self, destination: &str, now: f64) -> Result<()> {
        let by = self.actor.clone();
        let tx = self.begin()?;
        let mut d = destination_for_update(&tx, destination)?;
        d.state = BreakerState::Closed;
        d.consecutive_failures = 0;
        d.opened_at = None;
        d.cooldown_s = None;
        d.probe_until = None;
        d.paused_at = None;
        d.paused_by = None;
        save_destination_tx(&tx, &d)?;
        audit(
            &tx,
            by.as_deref(),
            now,
            "resume",
            None,
            Some(destination),
            json!({}),
        )?;
        tx.commit()?;
        Ok(())
    }
}

/// Partition events (id, size, received_at, excluded) by a split spec, keeping order.
fn cut(events: &[(i64, i64, f64, bool)], spec: SplitSpec) -> Vec<Vec<(i64, i64, f64, bool)>> {
    let mut parts: Vec<Vec<(i64, i64, f64, bool)>> = Vec::new();
    match spec {
        SplitSpec::At(at) => {
            let (a, b): (Vec<_>, Vec<_>) = events.iter().partition(|e| e.0 < at);
            parts.push(a);
            parts.push(b);
        }
        SplitSpec::MaxEvents(n) => {
            let n = n.max(1) as usize;
            let mut cur = Vec::new();
            let mut included = 0usize;
            for e in events {
                if !e.3 && included == n {
                    parts.push(std::mem::take(&mut cur));
                    included = 0;
                }
                if !e.3 {
                    included += 1;
                }
                cur.push(*e);
            }
            parts.push(cur);
        }
        SplitSpec::MaxBytes(b) => {
            let mut cur = Vec::new();
            let mut bytes = 0i64;
            let mut included = 0usize;
            for e in events {
                if !e.3 && included > 0 && bytes + e.1 > b {
                    parts.push(std::mem::take(&mut cur));
                    bytes = 0;
                    included = 0;
                }
                if !e.3 {
                    bytes += e.1;
                    included += 1;
                }
                cur.push(*e);
            }
            parts.push(cur);
        }
    }
    // A part with no included event would be an empty document: fold it into a neighbour.
    let mut out: Vec<Vec<(i64, i64, f64, bool)>> = Vec::new();
    for p in parts.into_iter().filter(|p| !p.is_empty()) {
        let has_included = p.iter().any(|e| !e.3);
        match out.last_mut() {
            Some(last) if !has_included => last.extend(p),
            _ => out.push(p),
        }
    }
    if out.len() > 1 && !out[0].iter().any(|e| !e.3) {
        let first = out.remove(0);
        let mut merged = first;
        merged.extend(out.remove(0));
        out.insert(0, merged);
    }
    out
}
