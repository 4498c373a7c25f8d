//! The dispatcher's durable clock for poll sources (spec 14.4), the `polls` table (schema
//! 3): one row per poll instance.
//!
//! Owns: the three rules of 14.4, each one `BEGIN IMMEDIATE` transaction that re-reads the
//! row it changes, and the record of a delivered tick:
//!
//! 1. [`Store::poll_schedule_new`]: a new instance gets the `next_at` the caller drew
//!    (`now + U(0, jitter_s)`).
//! 2. and 3. [`Store::poll_fire`]: a due instance whose last tick batch is still open,
//!    sealed, leased, retry or dead only moves `next_at` and counts `skipped`; otherwise ONE
//!    tick event is enqueued (through the enqueue path's own `enqueue_one`, dedup id
//!    `poll:<i>:<scheduled next_at>`) and `last_tick_at`, `last_batch_id` and `next_at` are
//!    written in the same transaction, so a kill between the two leaves both or neither
//!    (failpoint `poll.after_enqueue` sits between them).
//!
//! Plus [`Store::poll_reschedule`] (a reload shortened the period: pull `next_at` in) and
//! [`Store::poll_record_delivered`]: the clock reads the tick batch's state, and once it is
//! delivered copies its `delivered_at` and the tick's time into `delivered_at` /
//! `delivered_tick_at`. Delivery is recorded here, by the clock, not in the mark's
//! transaction, so the delivery path stays the same for every source (spec promise 2).
//!
//! Must not: read the clock or draw the jitter (the caller passes `now` and the next times).

use rusqlite::{OptionalExtension, params};

use super::enqueue::{EnqueueOutcome, EnqueueRequest, enqueue_one};
use super::{Result, Store, StoreError};
use crate::failpoint;
use crate::vocab::BatchState;

/// What the clock reads of one instance to decide whether it needs a write.
#[derive(Debug, Clone, PartialEq)]
pub struct PollClockRow {
    pub instance: String,
    pub next_at: f64,
    pub last_tick_at: Option<f64>,
    pub created_at: f64,
    /// The last tick batch's state; `None` when there is none (or it was pruned).
    pub last_state: Option<BatchState>,
    /// The last tick was delivered and that is not recorded yet.
    pub delivery_unrecorded: bool,
}

/// What one firing did.
#[derive(Debug, Clone, PartialEq)]
pub enum Fired {
    /// Rule 3: a tick was enqueued into this batch.
    Ticked { batch_id: i64, scheduled_at: f64 },
    /// Rule 2: the last tick batch is undelivered; only `next_at` moved.
    Skipped {
        skipped: i64,
        last_state: BatchState,
    },
    /// The row was not due when the transaction read it (or is gone).
    NotDue,
}

/// The dedup id of the tick scheduled at `scheduled_at` (14.4): a second attempt at the same
/// window carries the same id.
pub fn tick_dedup_id(instance: &str, scheduled_at: f64) -> String {
    format!("poll:{instance}:{scheduled_at}")
}

/// A batch state that means the last tick is not delivered yet (rule 2).
pub fn is_undelivered(state: BatchState) -> bool {
    match state {
        BatchState::Open
        | BatchState::Sealed
        | BatchState::Leased
        | BatchState::Retry
        | BatchState::Dead => true,
        BatchState::Delivered | BatchState::Dropped => false,
    }
}

impl Store {
    /// Every poll row with its last tick batch's state, by instance: the clock's read.
    pub fn poll_clock_rows(&self) -> Result<Vec<PollClockRow>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT p.instance, p.next_at, p.last_tick_at, p.created_at, b.state,
                    b.state = 'delivered'
                      AND (p.delivered_tick_at IS NULL OR p.delivered_tick_at < p.last_tick_at)
             FROM polls p LEFT JOIN batches b ON b.id = p.last_batch_id
             ORDER BY p.instance",
        )?;
        let rows = stmt
            .query_map((), |r| {
                Ok(PollClockRow {
                    instance: r.get(0)?,
                    next_at: r.get(1)?,
                    last_tick_at: r.get(2)?,
                    created_at: r.get(3)?,
                    last_state: r.get(4)?,
                    delivery_unrecorded: r.get::<_, Option<bool>>(5)?.unwrap_or(false),
                })
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    /// Rule 1: schedule a new instance at `next_at`. Returns false when the row already
    /// existed (nothing changed).
    pub fn poll_schedule_new(&mut self, instance: &str, next_at: f64, now: f64) -> Result<bool> {
        let tx = self.begin()?;
        let n = tx.execute(
            "INSERT INTO polls (instance, next_at, created_at) VALUES (?1, ?2, ?3)
             ON CONFLICT(instance) DO NOTHING",
            params![instance, next_at, now],
        )?;
        tx.commit()?;
        Ok(n == 1)
    }

    /// Rules 2 and 3 for a due instance, in one transaction: skip (the last tick batch is
    /// undelivered) or enqueue `tick` and write `last_tick_at` (the scheduled time),
    /// `last_batch_id` and `next_at`. `tick` is built by the caller for the scheduled time it
    /// read; if the row's `next_at` changed since, nothing happens.
    pub fn poll_fire(
        &mut self,
        instance: &str,
        scheduled_at: f64,
        tick: &EnqueueRequest,
        next_at: f64,
        now: f64,
    ) -> Result<Fired> {
        let tx = self.begin()?;
        let row: Option<(f64, Option<BatchState>, i64)> = tx
            .query_row(
                "SELECT p.next_at, b.state, p.skipped
                 FROM polls p LEFT JOIN batches b ON b.id = p.last_batch_id
                 WHERE p.instance = ?1",
                [instance],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()?;
        let Some((current, last_state, skipped)) = row else {
            return Ok(Fired::NotDue);
        };
        if current != scheduled_at || now < current {
            return Ok(Fired::NotDue);
        }
        if let Some(state) = last_state.filter(|s| is_undelivered(*s)) {
            tx.execute(
                "UPDATE polls SET next_at = ?2, skipped = skipped + 1 WHERE instance = ?1",
                params![instance, next_at],
            )?;
            tx.commit()?;
            return Ok(Fired::Skipped {
                skipped: skipped + 1,
                last_state: state,
            });
        }
        let batch_id = match enqueue_one(&tx, tick)? {
            EnqueueOutcome::Queued { copies } => copies
                .first()
                .map(|c| c.1)
                .ok_or_else(|| StoreError::Invalid("a tick enqueued no copy".into()))?,
            // The same window's tick is already in the spool (a second attempt at it):
            // point at the batch that holds it.
            EnqueueOutcome::Duplicate { event_id } => tx.query_row(
                "SELECT batch_id FROM events WHERE id = ?1",
                [event_id],
                |r| r.get(0),
            )?,
            EnqueueOutcome::Replayed { batch_id } => batch_id,
            EnqueueOutcome::Quarantined { .. } => {
                return Err(StoreError::Invalid("a tick is never quarantined".into()));
            }
        };
        failpoint::hit("poll.after_enqueue");
        tx.execute(
            "UPDATE polls SET next_at = ?2, last_tick_at = ?3, last_batch_id = ?4
             WHERE instance = ?1",
            params![instance, next_at, scheduled_at, batch_id],
        )?;
        failpoint::hit("poll.before_commit");
        tx.commit()?;
        Ok(Fired::Ticked {
            batch_id,
            scheduled_at,
        })
    }

    /// A reload shortened the period: an instance scheduled further out than its new
    /// `every_s + jitter_s` gets the `next_at` the caller computed, if the row still holds
    /// `seen_next_at`. Returns whether it changed.
    pub fn poll_reschedule(
        &mut self,
        instance: &str,
        seen_next_at: f64,
        next_at: f64,
    ) -> Result<bool> {
        let tx = self.begin()?;
        let n = tx.execute(
            "UPDATE polls SET next_at = ?3 WHERE instance = ?1 AND next_at = ?2",
            params![instance, seen_next_at, next_at],
        )?;
        tx.commit()?;
        Ok(n == 1)
    }

    /// The last tick's batch is delivered: record when (the batch's own `delivered_at`) and
    /// which tick (`delivered_tick_at = last_tick_at`). Returns whether it changed.
    pub fn poll_record_delivered(&mut self, instance: &str) -> Result<bool> {
        let tx = self.begin()?;
        let n = tx.execute(
            "UPDATE polls SET
                 delivered_at = (SELECT b.delivered_at FROM batches b WHERE b.id = polls.last_batch_id),
                 delivered_tick_at = last_tick_at
             WHERE instance = ?1
               AND EXISTS (SELECT 1 FROM batches b
                           WHERE b.id = polls.last_batch_id AND b.state = 'delivered')
               AND (delivered_tick_at IS NULL OR delivered_tick_at < last_tick_at)",
            [instance],
        )?;
        tx.commit()?;
        Ok(n == 1)
    }
}
