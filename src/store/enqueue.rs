//! Enqueue (spec 5, 7, 9): the join rule, size sealing, tee copies, dedup and quarantine.
//! `enqueue_many` commits several requests in ONE transaction; a request that fails is
//! undone alone (`cached::each_in_savepoints`), so it never aborts the others and the
//! intake can group-commit (RUST-ADAPTATION "Performance design"). Nothing is acknowledged
//! before COMMIT.

use super::db::Connection;
use rusqlite::params;

use super::cached::{Step, each_in_savepoints, exec, row};
use super::{KEY_BYTES_MAX, Result, Store, StoreError, TEE_COPIES_MAX, set_meta_tx};
use crate::failpoint;
use crate::vocab::BatchState;

/// The coalesce window a batch is opened with; copied into the batch row so config changes
/// never move an open batch (spec 3).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Window {
    pub quiet_s: f64,
    pub max_s: f64,
    pub max_events: i64,
    pub max_bytes: i64,
}

/// One place an event goes: the primary route or a tee route.
#[derive(Debug, Clone, PartialEq)]
pub struct Copy {
    pub route: String,
    pub destination: String,
    pub window: Window,
}

/// Marks a request whose classification failed after verification (spec 9).
#[derive(Debug, Clone, PartialEq)]
pub struct Quarantine {
    /// The error's class name only (never its message, which could quote the body).
    pub error_class: String,
}

impl Quarantine {
    /// The class of a verified request the store refused (a bug of ours, which spec 9
    /// quarantines rather than answer 5xx): the intake's fallback.
    pub const STORE_REFUSED: &'static str = "StoreRefused";

    /// Why the request was quarantined, as the batch's last_error and the intake's log say
    /// it: a plugin's error by its class (spec 9), or the store's refusal, which is not a
    /// plugin's.
    pub fn reason(&self) -> String {
        if self.error_class == Quarantine::STORE_REFUSED {
            format!(
                "the store refused the verified request ({})",
                Quarantine::STORE_REFUSED
            )
        } else {
            format!("plugin error: {}", self.error_class)
        }
    }
}

/// One accepted request, classified. For a quarantined request `payload` is `None`, `raw`
/// holds the body and `headers` every request header except the source's auth headers.
#[derive(Debug, Clone, PartialEq)]
pub struct EnqueueRequest {
    pub source: String,
    pub key: String,
    pub event_type: String,
    pub dedup_id: Option<String>,
    pub dedup_window_s: f64,
    /// JSON text, what the destination receives.
    pub payload: Option<String>,
    pub raw: Option<Vec<u8>>,
    /// JSON object text of the kept headers.
    pub headers: String,
    pub primary: Copy,
    pub tees: Vec<Copy>,
    pub quarantine: Option<Quarantine>,
    pub now: f64,
}

/// What happened to one request. `copies` lists (event_id, batch_id, route), primary first.
#[derive(Debug, Clone, PartialEq)]
pub enum EnqueueOutcome {
    Queued {
        copies: Vec<(i64, i64, String)>,
    },
    Duplicate {
        event_id: i64,
    },
    /// A dedup hit on a dead batch replays it (spec 7).
    Replayed {
        batch_id: i64,
    },
    Quarantined {
        event_id: i64,
        batch_id: i64,
    },
}

impl EnqueueOutcome {
    /// Whether the request stored a new event (queued, or quarantined). A duplicate, and a
    /// dedup hit that replays a dead batch, is the sender repeating an old one: it must not
    /// refresh the source's liveness, or a sender that keeps redelivering would hide a
    /// source that went silent (issue 29).
    pub fn is_new(&self) -> bool {
        match self {
            EnqueueOutcome::Queued { .. } | EnqueueOutcome::Quarantined { .. } => true,
            EnqueueOutcome::Duplicate { .. } | EnqueueOutcome::Replayed { .. } => false,
        }
    }

    /// The answer `hookspool enqueue --json` prints and the admin API's enqueue returns.
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::json;
        match self {
            EnqueueOutcome::Queued { copies } => json!({
                "status": "queued",
                "copies": copies.iter().map(|(e, b, r)| json!({"event": e, "batch": b, "route": r})).collect::<Vec<_>>(),
            }),
            EnqueueOutcome::Duplicate { event_id } => {
                json!({"status": "duplicate", "event": event_id})
            }
            EnqueueOutcome::Replayed { batch_id } => {
                json!({"status": "replayed", "batch": batch_id})
            }
            EnqueueOutcome::Quarantined { event_id, batch_id } => {
                json!({"status": "quarantined", "event": event_id, "batch": batch_id})
            }
        }
    }

    /// The intake's answer word (spec 9).
    pub fn status_word(&self) -> &'static str {
        match self {
            EnqueueOutcome::Queued { .. } => "queued",
            EnqueueOutcome::Duplicate { .. } => "duplicate",
            EnqueueOutcome::Replayed { .. } => "replayed",
            EnqueueOutcome::Quarantined { .. } => "quarantined",
        }
    }
}

impl Store {
    /// Enqueue one request in its own transaction.
    pub fn enqueue(&mut self, req: &EnqueueRequest) -> Result<EnqueueOutcome> {
        let mut out = self.enqueue_many(std::slice::from_ref(req))?;
        out.pop()
            .unwrap_or_else(|| Err(StoreError::Invalid("empty enqueue".into())))
    }

    /// Enqueue a group of requests in one transaction, each request on its own: the outer
    /// `Err` means the COMMIT itself failed and nothing was kept; the inner results say what
    /// happened to each request (an inner `Err` left nothing of that request behind).
    /// The `meta` timestamps are written once per group, after the requests, with the last
    /// kept request's `now`: the same final values as writing them per request.
    ///
    /// The requests share one savepoint (`each_in_savepoints`). A request the store refuses
    /// before writing (`validate`) is answered there; one that fails after it may have
    /// written is undone alone.
    pub fn enqueue_many(&mut self, reqs: &[EnqueueRequest]) -> Result<Vec<Result<EnqueueOutcome>>> {
        self.enqueue_group(reqs, &[])
    }

    /// `enqueue_many` that also adds the intake's rejection counts in the same transaction
    /// (the writer's group: counts ride along with the requests instead of a write of their
    /// own). Counts are stored only if the group commits.
    pub fn enqueue_group(
        &mut self,
        reqs: &[EnqueueRequest],
        rejections: &[super::RejectionCount],
    ) -> Result<Vec<Result<EnqueueOutcome>>> {
        if let super::db::Connection::Pg(pg) = &self.conn {
            // PostgreSQL's enqueue, written for writers that share the database (`pg::enqueue`).
            let mut pg = pg.borrow_mut();
            pg.revive()?;
            return pg.with(|pg| pg.enqueue_group(reqs, rejections));
        }
        let tx = self.begin()?;
        let results = each_in_savepoints(&tx, reqs, |req| {
            Ok(match validate(req) {
                Err(e) => Step::Keep(Err(e)),
                Ok(()) => match place_valid(&tx, req) {
                    Ok(outcome) => Step::Keep(Ok(outcome)),
                    Err(e) => Step::Undo(Err(e)),
                },
            })
        })?;
        let kept = reqs
            .iter()
            .zip(&results)
            .filter_map(|(req, r)| r.as_ref().is_ok_and(EnqueueOutcome::is_new).then_some(req));
        touch_enqueue_meta(&tx, kept)?;
        super::rejections::add_rejections_tx(&tx, rejections)?;
        failpoint::hit("enqueue.before_commit");
        tx.commit()?;
        failpoint::hit("enqueue.after_commit");
        Ok(results)
    }
}

/// What an enqueue under an idempotency key did.
#[derive(Debug, Clone, PartialEq)]
pub enum Idempotent {
    /// The key was new: the request was enqueued, and its answer kept under the key.
    Fresh(serde_json::Value),
    /// The key was used before with the same fingerprint: the original answer, nothing new.
    Repeat(serde_json::Value),
    /// The key was used before for different content: nothing was done.
    Conflict,
}

/// The `meta` key an idempotency key's answer is kept under.
fn idempotency_meta_key(key: &str) -> String {
    format!("idempotency:{key}")
}

impl Store {
    /// An operator's enqueue (the admin API's), audited as the connection's actor. With an
    /// idempotency `key` (and `fingerprint`, a digest of the request's content) it happens
    /// once per key (spoold's durable curl): the first request is enqueued and its answer
    /// kept in the same transaction; a later one with the same key and fingerprint is
    /// answered the kept answer, and one with another fingerprint is a conflict. Either way
    /// a repeat writes nothing.
    pub fn enqueue_idempotent(
        &mut self,
        req: &EnqueueRequest,
        key: Option<(&str, &str)>,
    ) -> Result<Idempotent> {
        let meta_key = key.map(|(k, _)| idempotency_meta_key(k));
        let fingerprint = key.map_or("", |(_, f)| f);
        let by = self.actor.clone();
        let tx = self.begin()?;
        let kept: Option<String> = match &meta_key {
            Some(m) => row(
                &tx,
                "SELECT value FROM meta WHERE key = ?1",
                [m.as_str()],
                |r| r.get(0),
            )?,
            None => None,
        };
        if let (Some(kept), Some(meta_key)) = (kept, &meta_key) {
            let v: serde_json::Value = serde_json::from_str(&kept)
                .map_err(|e| StoreError::Corrupt(format!("meta {meta_key}: {e}")))?;
            return Ok(if v["fingerprint"] == fingerprint {
                Idempotent::Repeat(v["answer"].clone())
            } else {
                Idempotent::Conflict
            });
        }
        validate(req)?;
        let outcome = place_valid(&tx, req)?;
        if outcome.is_new() {
            touch_enqueue_meta(&tx, std::iter::once(req))?;
        }
        let answer = outcome.to_json();
        if let Some(meta_key) = &meta_key {
            let kept =
                serde_json::json!({"fingerprint": fingerprint, "answer": answer, "at": req.now});
            set_meta_tx(&tx, meta_key, &kept.to_string())?;
        }
        // The operator's enqueue is audited (who, when, which batch); no payload, no key.
        let batch = match &outcome {
            EnqueueOutcome::Queued { copies } => copies.first().map(|c| c.1),
            EnqueueOutcome::Replayed { batch_id } => Some(*batch_id),
            EnqueueOutcome::Quarantined { batch_id, .. } => Some(*batch_id),
            EnqueueOutcome::Duplicate { .. } => None,
        };
        super::operator::audit(
            &tx,
            by.as_deref(),
            req.now,
            "enqueue",
            batch,
            Some(&req.source),
            serde_json::json!({"status": outcome.status_word(), "idempotent": meta_key.is_some()}),
        )?;
        tx.commit()?;
        Ok(Idempotent::Fresh(answer))
    }
}

/// `meta.last_enqueue_at` and each source's `last_event_at`, from the requests that stored
/// a new event, in order (the last one wins, as if each had written its own).
fn touch_enqueue_meta<'a>(
    conn: &Connection,
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
    set_meta_tx(conn, "last_enqueue_at", &last.to_string())?;
    for (source, now) in per_source {
        set_meta_tx(conn, &source_last_event_key(source), &now.to_string())?;
    }
    Ok(())
}

/// The `meta` key that remembers when a source last delivered an event (spec 11.4).
pub(super) fn source_last_event_key(source: &str) -> String {
    format!("source:{source}:last_event_at")
}

/// Validate what the store itself guarantees about a request.
pub(super) fn validate(req: &EnqueueRequest) -> Result<()> {
    // A refusal of a verified request the intake lets through only by a bug of ours: the
    // test of the intake's StoreRefused fallback makes one this way (through the binary).
    if req.quarantine.is_none() && failpoint::error_once("enqueue.refused") {
        return Err(StoreError::Invalid(
            "failpoint enqueue.refused: the store refused a verified request".into(),
        ));
    }
    if req.key.len() > KEY_BYTES_MAX {
        return Err(StoreError::Invalid(format!(
            "key is {} bytes; keys are at most {KEY_BYTES_MAX} bytes",
            req.key.len()
        )));
    }
    if req.tees.len() > TEE_COPIES_MAX {
        return Err(StoreError::Invalid(format!(
            "{} tee copies; at most {TEE_COPIES_MAX} per event",
            req.tees.len()
        )));
    }
    if req.quarantine.is_none() {
        let Some(p) = req.payload.as_deref() else {
            return Err(StoreError::Invalid("payload is required".into()));
        };
        if serde_json::from_str::<serde::de::IgnoredAny>(p).is_err() {
            return Err(StoreError::Invalid("payload is not valid JSON".into()));
        }
    }
    for c in std::iter::once(&req.primary).chain(req.tees.iter()) {
        let w = c.window;
        if w.max_events < 1 || w.max_bytes < 1 || w.quiet_s < 0.0 || w.max_s < 0.0 {
            return Err(StoreError::Invalid(format!(
                "route {}: window needs max_events >= 1, max_bytes >= 1, quiet_s and max_s >= 0",
                c.route
            )));
        }
    }
    Ok(())
}

/// Enqueue one request inside the caller's transaction (script emits in the mark's
/// transaction, reclassified quarantine requests), `meta` timestamps included.
pub(super) fn enqueue_one(conn: &Connection, req: &EnqueueRequest) -> Result<EnqueueOutcome> {
    let outcome = place_request(conn, req)?;
    touch_enqueue_meta(conn, std::iter::once(req).filter(|_| outcome.is_new()))?;
    Ok(outcome)
}

/// Dedup, the copies and quarantine of one request; `meta` is the caller's.
fn place_request(conn: &Connection, req: &EnqueueRequest) -> Result<EnqueueOutcome> {
    validate(req)?;
    place_valid(conn, req)
}

/// `place_request` for a request `validate` has passed.
fn place_valid(conn: &Connection, req: &EnqueueRequest) -> Result<EnqueueOutcome> {
    let now = req.now;

    if let Some(q) = &req.quarantine {
        return quarantine(conn, req, q);
    }

    // Dedup runs once, before any copy is placed (spec 5, 7).
    let mut repoint = false;
    if let Some(dedup_id) = &req.dedup_id {
        let hit: Option<(i64, f64)> = row(
            conn,
            "SELECT event_id, seen_at FROM dedup WHERE source = ?1 AND dedup_id = ?2",
            params![req.source, dedup_id],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        if let Some((event_id, seen_at)) = hit {
            if seen_at + req.dedup_window_s < now {
                // Outside the window but not yet pruned: the window has passed, so the id is
                // free again (spec 7: the prune is what makes the window).
                exec(
                    conn,
                    "DELETE FROM dedup WHERE source = ?1 AND dedup_id = ?2",
                    params![req.source, dedup_id],
                )?;
            } else {
                let batch: Option<(i64, BatchState)> = row(
                    conn,
                    "SELECT b.id, b.state FROM events e JOIN batches b ON b.id = e.batch_id
                         WHERE e.id = ?1",
                    [event_id],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )?;
                match batch {
                    Some((batch_id, BatchState::Dead)) => {
                        bump_dup(conn, &req.source, dedup_id)?;
                        super::operator::replay_dead_tx(conn, None, batch_id, now, "dedup hit")?;
                        return Ok(EnqueueOutcome::Replayed { batch_id });
                    }
                    Some((_, BatchState::Dropped)) => {
                        repoint = true;
                    }
                    // Still on its way (or pruned): the id is a duplicate.
                    Some((
                        _,
                        BatchState::Open
                        | BatchState::Sealed
                        | BatchState::Leased
                        | BatchState::Retry
                        | BatchState::Delivered,
                    ))
                    | None => {
                        bump_dup(conn, &req.source, dedup_id)?;
                        return Ok(EnqueueOutcome::Duplicate { event_id });
                    }
                }
            }
        }
    }

    let mut copies = Vec::with_capacity(1 + req.tees.len());
    let mut destinations: Vec<&str> = Vec::with_capacity(1 + req.tees.len());
    for copy in std::iter::once(&req.primary).chain(req.tees.iter()) {
        // One event never reaches one destination twice (spec 14.1).
        if destinations.contains(&copy.destination.as_str()) {
            continue;
        }
        destinations.push(&copy.destination);
        let (event_id, batch_id) = place_copy(conn, req, copy)?;
        failpoint::hit("enqueue.after_copy");
        copies.push((event_id, batch_id, copy.route.clone()));
    }

    if let Some(dedup_id) = &req.dedup_id {
        let primary_event = copies[0].0;
        if repoint {
            exec(
                conn,
                "UPDATE dedup SET event_id = ?3, seen_at = ?4 WHERE source = ?1 AND dedup_id = ?2",
                params![req.source, dedup_id, primary_event, now],
            )?;
        } else {
            exec(
                conn,
                "INSERT INTO dedup (source, dedup_id, event_id, seen_at, dup_count)
                 VALUES (?1, ?2, ?3, ?4, 0)",
                params![req.source, dedup_id, primary_event, now],
            )?;
        }
    }
    Ok(EnqueueOutcome::Queued { copies })
}

fn bump_dup(conn: &Connection, source: &str, dedup_id: &str) -> Result<()> {
    exec(
        conn,
        "UPDATE dedup SET dup_count = dup_count + 1 WHERE source = ?1 AND dedup_id = ?2",
        params![source, dedup_id],
    )?;
    Ok(())
}

pub(super) fn event_size(req: &EnqueueRequest) -> i64 {
    let n = match (&req.raw, &req.payload) {
        (Some(raw), _) => raw.len(),
        (None, Some(p)) => p.len(),
        (None, None) => 0,
    };
    n as i64
}

/// The open batch of a (route, key) as the join rule reads it.
struct OpenBatch {
    id: i64,
    count: i64,
    bytes: i64,
    max_events: i64,
    max_bytes: i64,
}

/// The open batch of a group (the join rule, spec 5), through `batches_open_group`.
pub(super) const OPEN_BATCH_SQL: &str =
    "SELECT id, count, bytes, max_events, max_bytes FROM batches
     WHERE route = ?1 AND key = ?2 AND state = 'open'";
/// `OPEN_BATCH_SQL` on PostgreSQL: the open batch locked until the transaction ends, as
/// `pg::enqueue` locks it, so an operator's enqueue or a script's emit and an intake's
/// request joining one batch take turns, each sealing on the counts the other left.
const OPEN_BATCH_LOCKED_SQL: &str = "SELECT id, count, bytes, max_events, max_bytes FROM batches
     WHERE route = ?1 AND key = ?2 AND state = 'open' FOR UPDATE";

/// A new open batch of a group.
const INSERT_OPEN_SQL: &str = "INSERT INTO batches (route, source, destination, key, state,
         finished, first_at, last_at, quiet_s, max_s, max_events, max_bytes, count, bytes)
     VALUES (?1, ?2, ?3, ?4, 'open', 0, ?5, ?5, ?6, ?7, ?8, ?9, 0, 0)";
/// `INSERT_OPEN_SQL` on PostgreSQL: its id, or no row when another writer's open batch of
/// the group is there first (`batches_open_group`).
const INSERT_OPEN_PG_SQL: &str = "INSERT INTO batches (route, source, destination, key, state,
         finished, first_at, last_at, quiet_s, max_s, max_events, max_bytes, count, bytes)
     VALUES (?1, ?2, ?3, ?4, 'open', 0, ?5, ?5, ?6, ?7, ?8, ?9, 0, 0)
     ON CONFLICT DO NOTHING RETURNING id";
/// How often one copy reads its group's open batch again after another writer opened it
/// first; each time another writer committed, so the writers as a whole progress.
const OPEN_RACES_MAX: usize = 16;

/// The join rule (spec 5), for one copy.
fn place_copy(conn: &Connection, req: &EnqueueRequest, copy: &Copy) -> Result<(i64, i64)> {
    let now = req.now;
    let size = event_size(req);
    let open_sql = if conn.is_pg() {
        OPEN_BATCH_LOCKED_SQL
    } else {
        OPEN_BATCH_SQL
    };
    let w = copy.window;
    let mut lost = 0;
    let batch = loop {
        let open: Option<OpenBatch> = row(conn, open_sql, params![copy.route, req.key], |r| {
            Ok(OpenBatch {
                id: r.get(0)?,
                count: r.get(1)?,
                bytes: r.get(2)?,
                max_events: r.get(3)?,
                max_bytes: r.get(4)?,
            })
        })?;
        if let Some(b) = open {
            if b.bytes + size > b.max_bytes && b.count >= 1 {
                // Pre-join seal: keeps max_bytes a true bound (a document is never larger
                // than max_bytes plus one event).
                super::delivery::seal_tx(conn, b.id, now)?;
            } else {
                break b;
            }
        }
        let p = params![
            copy.route,
            req.source,
            copy.destination,
            req.key,
            now,
            w.quiet_s,
            w.max_s,
            w.max_events,
            w.max_bytes
        ];
        let id = if conn.is_pg() {
            // An intake on another connection (it does not take the write lock) may open
            // this group's batch between the read above and this INSERT: the unique
            // open-batch index then makes it insert nothing (once that intake committed),
            // and the group's open batch is read again and joined.
            match row(conn, INSERT_OPEN_PG_SQL, p, |r| r.get(0))? {
                Some(id) => id,
                None if lost < OPEN_RACES_MAX => {
                    lost += 1;
                    continue;
                }
                None => return Err(StoreError::Busy),
            }
        } else {
            exec(conn, INSERT_OPEN_SQL, p)?;
            conn.last_insert_rowid()
        };
        break OpenBatch {
            id,
            count: 0,
            bytes: 0,
            max_events: w.max_events,
            max_bytes: w.max_bytes,
        };
    };
    let batch_id = batch.id;
    let event_id = insert_event(conn, req, &copy.route, batch_id, size)?;
    // The row was read (or written) in this transaction, so its new figures are known here:
    // no second read, and no RETURNING (SQLite buffers RETURNING rows in an ephemeral table
    // whose pager it builds and frees for every statement: a pessimisation on this path).
    let joined = exec(
        conn,
        "UPDATE batches SET last_at = max(last_at, ?2), count = count + 1, bytes = bytes + ?3,
                first_event_id = coalesce(first_event_id, ?4), open_hash = NULL
         WHERE id = ?1 AND state = 'open'",
        params![batch_id, now, size, event_id],
    )?;
    if joined != 1 {
        return Err(StoreError::Corrupt(format!(
            "batch {batch_id} stopped being open while an event joined it"
        )));
    }
    if batch.count + 1 >= batch.max_events || batch.bytes + size >= batch.max_bytes {
        super::delivery::seal_tx(conn, batch_id, now)?;
    }
    Ok((event_id, batch_id))
}

fn insert_event(
    conn: &Connection,
    req: &EnqueueRequest,
    route: &str,
    batch_id: i64,
    size: i64,
) -> Result<i64> {
    // A raw body identical to the payload is stored once (schema 6, `raw_is_payload`).
    let raw_is_payload = raw_is_payload(req);
    let raw = if raw_is_payload {
        None
    } else {
        req.raw.as_deref()
    };
    exec(
        conn,
        "INSERT INTO events (source, route, batch_id, event_type, dedup_id, received_at,
                             payload, raw, raw_is_payload, headers, size)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
        params![
            req.source,
            route,
            batch_id,
            req.event_type,
            req.dedup_id,
            req.now,
            req.payload,
            raw,
            raw_is_payload,
            req.headers,
            size
        ],
    )?;
    Ok(conn.last_insert_rowid())
}

/// The original body of an event row, as every reader of it selects it: a raw body identical
/// to the payload is stored once, as the payload (schema 6, `raw_is_payload`).
pub(super) const RAW_BODY_SQL: &str =
    "CASE WHEN raw_is_payload = 1 THEN CAST(payload AS BLOB) ELSE raw END";

/// Whether the request's raw body is byte for byte its payload's text (then only the payload
/// is written, and readers of the raw body read the payload's bytes).
pub(super) fn raw_is_payload(req: &EnqueueRequest) -> bool {
    matches!((&req.raw, &req.payload), (Some(raw), Some(p)) if raw.as_slice() == p.as_bytes())
}

/// A quarantine batch of one stored request: dead at birth, never delivered (spec 9).
fn quarantine(conn: &Connection, req: &EnqueueRequest, q: &Quarantine) -> Result<EnqueueOutcome> {
    let size = event_size(req);
    exec(
        conn,
        "INSERT INTO batches (route, source, destination, key, state, first_at, last_at,
                              quiet_s, max_s, max_events, max_bytes, count, bytes,
                              last_error, last_class)
         VALUES (?1, ?1, 'quarantine', 'quarantine', 'dead', ?2, ?2, 0, 0, 1, ?3, 1, ?3,
                 ?4, 'quarantine')",
        params![req.source, req.now, size.max(1), q.reason()],
    )?;
    let batch_id = conn.last_insert_rowid();
    let event_id = insert_event(conn, req, &req.source, batch_id, size)?;
    Ok(EnqueueOutcome::Quarantined { event_id, batch_id })
}

#[cfg(test)]
mod tests {
    use super::super::tests::{req, window};
    use super::super::testutil::{both_backends, temp_store};
    use super::*;

    // The enqueue slice runs on SQLite and on PostgreSQL (store::pg::enqueue): each body
    // below is one test per backend.
    both_backends!(
        group_meta_is_the_last_kept_request_per_source,
        a_duplicate_does_not_refresh_the_sources_liveness,
        a_group_of_refused_requests_touches_no_meta,
        size_seals_at_the_bound_from_the_row_read_in_the_join,
    );

    fn batch_of(o: &EnqueueOutcome) -> i64 {
        match o {
            EnqueueOutcome::Queued { copies } => copies[0].1,
            other => panic!("expected queued, got {other:?}"),
        }
    }

    /// The meta timestamps are written once per group now: they must still say what
    /// per-request writes said (the last kept request of each source wins) and skip a
    /// request whose savepoint was rolled back.
    fn group_meta_is_the_last_kept_request_per_source() {
        let (_d, mut s) = temp_store();
        let store = &mut s;
        let mut a1 = req("r", "k", "{}", 100.0);
        a1.source = "a".into();
        let mut b = req("r", "k2", "{}", 101.0);
        b.source = "b".into();
        let mut a2 = req("r", "k", "{}", 102.0);
        a2.source = "a".into();
        let mut refused = req("r", "k", "not json", 103.0);
        refused.source = "c".into();
        let out = store.enqueue_many(&[a1, b, a2, refused]).expect("commit");
        assert!(out[..3].iter().all(|r| r.is_ok()));
        assert!(matches!(out[3], Err(StoreError::Invalid(_))));
        assert_eq!(store.meta_time("last_enqueue_at").unwrap(), Some(102.0));
        assert_eq!(
            store.meta_time("source:a:last_event_at").unwrap(),
            Some(102.0)
        );
        assert_eq!(
            store.meta_time("source:b:last_event_at").unwrap(),
            Some(101.0)
        );
        assert_eq!(store.meta_time("source:c:last_event_at").unwrap(), None);
    }

    /// Issue 29: a duplicate refreshed the source's liveness, so a sender that keeps
    /// redelivering one event hid a silent source. Only a new event counts.
    fn a_duplicate_does_not_refresh_the_sources_liveness() {
        let (_d, mut s) = temp_store();
        let store = &mut s;
        let mut first = req("r", "k", "{}", 100.0);
        first.source = "a".into();
        first.dedup_id = Some("d1".into());
        let out = store.enqueue(&first).expect("enqueue");
        assert!(matches!(out, EnqueueOutcome::Queued { .. }), "{out:?}");
        let mut again = first.clone();
        again.now = 200.0;
        let out = store.enqueue(&again).expect("enqueue");
        assert!(matches!(out, EnqueueOutcome::Duplicate { .. }), "{out:?}");
        // In a group too: the duplicate after a new event of another source.
        let mut other = req("r", "k2", "{}", 300.0);
        other.source = "b".into();
        let mut third = first.clone();
        third.now = 301.0;
        let out = store.enqueue_many(&[other, third]).expect("commit");
        assert!(
            matches!(out[1], Ok(EnqueueOutcome::Duplicate { .. })),
            "{out:?}"
        );
        assert_eq!(
            store.meta_time("source:a:last_event_at").unwrap(),
            Some(100.0)
        );
        assert_eq!(
            store.meta_time("source:b:last_event_at").unwrap(),
            Some(300.0)
        );
        assert_eq!(store.meta_time("last_enqueue_at").unwrap(), Some(300.0));
    }

    /// A group in which nothing was kept writes no meta at all.
    fn a_group_of_refused_requests_touches_no_meta() {
        let (_d, mut s) = temp_store();
        let store = &mut s;
        let out = store
            .enqueue_many(&[req("r", "k", "{", 5.0)])
            .expect("commit");
        assert!(out[0].is_err());
        assert_eq!(store.meta_time("last_enqueue_at").unwrap(), None);
    }

    /// The size seal works from the figures of the row the join read (no second read):
    /// max_events and max_bytes still seal exactly at their bound, within one group too.
    fn size_seals_at_the_bound_from_the_row_read_in_the_join() {
        let (_d, mut s) = temp_store();
        let store = &mut s;
        let mut reqs = Vec::new();
        for i in 0..7 {
            let mut r = req("r", "k", "{\"n\":1}", 10.0 + i as f64);
            r.primary.window = window(60.0, 600.0, 3, 1_000_000);
            reqs.push(r);
        }
        let out = store.enqueue_many(&reqs).expect("commit");
        let batches: Vec<i64> = out.iter().map(|r| batch_of(r.as_ref().unwrap())).collect();
        assert_eq!(batches[0], batches[2]);
        assert_ne!(batches[2], batches[3]);
        assert_eq!(batches[3], batches[5]);
        assert_ne!(batches[5], batches[6]);
        let counts: std::collections::BTreeMap<BatchState, i64> =
            store.batch_counts().unwrap().into_iter().collect();
        assert_eq!(counts[&BatchState::Sealed], 2);
        assert_eq!(counts[&BatchState::Open], 1);

        // Bytes: 7-byte payloads, max_bytes 14: two events fill a batch and seal it.
        let mut by_bytes = Vec::new();
        for i in 0..3 {
            let mut r = req("r", "kb", "{\"n\":1}", 20.0 + i as f64);
            r.primary.window = window(60.0, 600.0, 500, 14);
            by_bytes.push(r);
        }
        let out = store.enqueue_many(&by_bytes).expect("commit");
        let b: Vec<i64> = out.iter().map(|r| batch_of(r.as_ref().unwrap())).collect();
        assert_eq!(b[0], b[1]);
        assert_ne!(b[1], b[2]);
        let counts: std::collections::BTreeMap<BatchState, i64> =
            store.batch_counts().unwrap().into_iter().collect();
        assert_eq!(counts[&BatchState::Sealed], 3);
    }
}
