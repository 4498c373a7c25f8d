//! Reads for the CLI and observe: batch listings, one batch with its events and attempts,
//! and the document's inputs. Nothing here writes.

use rusqlite::{Row, params_from_iter};

use super::{Result, Store, StoreError};
use crate::vocab::{AttemptOutcome, BatchState, Klass};

/// One batch as stored (no payloads).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct BatchRow {
    pub id: i64,
    pub route: String,
    pub source: String,
    pub destination: String,
    pub key: String,
    pub state: BatchState,
    pub first_at: f64,
    pub last_at: f64,
    pub quiet_s: f64,
    pub max_s: f64,
    pub max_events: i64,
    pub max_bytes: i64,
    pub not_before: Option<f64>,
    pub count: i64,
    pub bytes: i64,
    pub sealed_at: Option<f64>,
    pub content_hash: Option<String>,
    pub attempts: i64,
    pub next_attempt_at: Option<f64>,
    pub lease_until: Option<f64>,
    pub lease_owner: Option<String>,
    pub last_error: Option<String>,
    pub last_class: Option<Klass>,
    pub delivered_at: Option<f64>,
    pub result: Option<String>,
    pub dropped_at: Option<f64>,
}

pub(super) const BATCH_COLUMNS: &str =
    "id, route, source, destination, key, state, first_at, last_at,
    quiet_s, max_s, max_events, max_bytes, not_before, count, bytes, sealed_at, content_hash,
    attempts, next_attempt_at, lease_until, lease_owner, last_error, last_class, delivered_at,
    result, dropped_at";

impl BatchRow {
    pub(super) fn from_row(r: &Row<'_>) -> rusqlite::Result<BatchRow> {
        Ok(BatchRow {
            id: r.get(0)?,
            route: r.get(1)?,
            source: r.get(2)?,
            destination: r.get(3)?,
            key: r.get(4)?,
            state: r.get(5)?,
            first_at: r.get(6)?,
            last_at: r.get(7)?,
            quiet_s: r.get(8)?,
            max_s: r.get(9)?,
            max_events: r.get(10)?,
            max_bytes: r.get(11)?,
            not_before: r.get(12)?,
            count: r.get(13)?,
            bytes: r.get(14)?,
            sealed_at: r.get(15)?,
            content_hash: r.get(16)?,
            attempts: r.get(17)?,
            next_attempt_at: r.get(18)?,
            lease_until: r.get(19)?,
            lease_owner: r.get(20)?,
            last_error: r.get(21)?,
            last_class: r.get(22)?,
            delivered_at: r.get(23)?,
            result: r.get(24)?,
            dropped_at: r.get(25)?,
        })
    }
}

/// One event's facts; the payload only when asked for.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct EventRow {
    pub id: i64,
    pub batch_id: i64,
    pub source: String,
    pub route: String,
    pub event_type: String,
    pub dedup_id: Option<String>,
    pub received_at: f64,
    pub size: i64,
    pub excluded_at: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload: Option<String>,
}

/// One attempt row.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct AttemptRow {
    pub id: i64,
    pub batch_id: i64,
    pub n: i64,
    pub destination: String,
    pub started_at: f64,
    pub finished_at: Option<f64>,
    /// `None` while the attempt is running.
    pub outcome: Option<AttemptOutcome>,
    pub klass: Option<Klass>,
    pub status: Option<i64>,
    pub error: Option<String>,
    pub duration_ms: Option<i64>,
    pub probe: bool,
    pub counted: bool,
    pub delivery_id: Option<String>,
    pub events_delivered: Option<i64>,
    pub failed_event_id: Option<i64>,
}

/// `list_batches` reads the newest ids in windows of this many, in id order...
pub const LIST_SCAN_WINDOW: i64 = 20_000;
/// ...at most this many windows before it lets the planner choose for the rest.
pub const LIST_SCAN_WINDOWS: usize = 5;

/// Filters of `hookspool list` (spec 16).
#[derive(Debug, Clone, Default)]
pub struct BatchFilter {
    pub state: Option<String>,
    pub source: Option<String>,
    pub destination: Option<String>,
    pub route: Option<String>,
    /// Batches whose key starts with this.
    pub key_prefix: Option<String>,
    /// First event received at or after this...
    pub since: Option<f64>,
    /// ...and before this.
    pub until: Option<f64>,
    /// Batches holding an event of this type.
    pub event_type: Option<String>,
    /// Batches holding the event a source recorded under this dedup (provider) id, while
    /// its dedup row lasts (the source's dedup window).
    pub dedup_id: Option<String>,
    /// Batches holding an event whose JSON payload has this value at this path: a SQLite
    /// JSON path (`$.a.b`, `$.items[0].id`; see [`json_path_ok`]) and the value as text
    /// (`42`, `paid`, `true`, `null`).
    pub json: Option<(String, String)>,
    /// Batches whose key contains this text, or holding an event whose dedup id or event
    /// type is this text (`hookspool list --search`).
    pub search: Option<String>,
    /// Only batches with an id below this (paging newest-first).
    pub before_id: Option<i64>,
    pub limit: usize,
}

/// The key of an event's stored headers that holds the intake span's W3C traceparent when
/// traces are on (issue 35): not an HTTP header name, so a sender's kept `traceparent`
/// stays its own.
pub const TRACEPARENT_KEY: &str = "hookspool-traceparent";
/// Whether `path` is a JSON path the batch filter takes: `$` followed by `.name` (letters,
/// digits, `_`, `-`) and `[N]` steps, at most 16 of them. Anything else is refused before
/// it reaches SQLite (whose path errors would fail the whole query).
pub fn json_path_ok(path: &str) -> bool {
    let Some(mut rest) = path.strip_prefix('$') else {
        return false;
    };
    let mut steps = 0;
    while !rest.is_empty() {
        steps += 1;
        if steps > 16 {
            return false;
        }
        if let Some(r) = rest.strip_prefix('.') {
            let end = r
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-'))
                .unwrap_or(r.len());
            if end == 0 {
                return false;
            }
            rest = &r[end..];
        } else if let Some(r) = rest.strip_prefix('[') {
            let Some((n, r)) = r.split_once(']') else {
                return false;
            };
            if n.is_empty() || n.len() > 9 || !n.bytes().all(|b| b.is_ascii_digit()) {
                return false;
            }
            rest = r;
        } else {
            return false;
        }
    }
    true
}

impl Store {
    /// The traceparent the intake stored with the batch's first event that has one (issue
    /// 35), for the dispatcher's batch and attempt spans.
    pub fn batch_traceparent(&self, batch_id: i64) -> Result<Option<String>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT json_extract(headers, '$.\"hookspool-traceparent\"') FROM events
             WHERE batch_id = ?1 AND json_valid(headers)
               AND json_extract(headers, '$.\"hookspool-traceparent\"') IS NOT NULL
             ORDER BY id LIMIT 1",
        )?;
        let mut rows = stmt.query([batch_id])?;
        match rows.next()? {
            Some(r) => Ok(r.get(0)?),
            None => Ok(None),
        }
    }

    pub fn batch(&self, id: i64) -> Result<BatchRow> {
        let sql = format!("SELECT {BATCH_COLUMNS} FROM batches WHERE id = ?1");
        super::cached::row(&self.conn, &sql, [id], BatchRow::from_row)?
            .ok_or_else(|| StoreError::NotFound(format!("batch {id}")))
    }

    /// Batches, newest first: the filter's first `f.limit` below `f.before_id`.
    ///
    /// Without statistics SQLite reads an equality on an indexed column (state, route,
    /// destination) through that index and then sorts every match by id, seconds on a
    /// large spool when the value is common. So the newest ids are read first in windows
    /// of `LIST_SCAN_WINDOW` rows in id order with the indexes left out (`+column`): a
    /// common value fills the page in the first window. A rare value that has not filled
    /// it after `LIST_SCAN_WINDOWS` windows is read below them by the planner's choice,
    /// where an index serves it well. The windows are contiguous, so nothing is skipped or
    /// repeated; each is its own statement.
    pub fn list_batches(&self, f: &BatchFilter) -> Result<Vec<BatchRow>> {
        self.list_batches_windowed(f, LIST_SCAN_WINDOW, LIST_SCAN_WINDOWS)
    }

    /// The batches holding the event each source recorded under `dedup_id` (through the
    /// dedup rows: within each source's dedup window), for `source` or every source the
    /// spool has seen.
    fn batches_by_dedup(&self, dedup_id: &str, source: Option<&str>) -> Result<Vec<i64>> {
        let sources: Vec<String> = match source {
            Some(s) => vec![s.to_string()],
            None => self
                .source_last_events()?
                .into_iter()
                .map(|(s, _)| s)
                .collect(),
        };
        let mut ids = Vec::new();
        for s in sources {
            if let Some(e) = self.event_by_dedup(&s, dedup_id)? {
                ids.push(e.batch_id);
            }
        }
        Ok(ids)
    }

    /// `list_batches` with the windows given (the tests use small ones).
    fn list_batches_windowed(
        &self,
        f: &BatchFilter,
        window: i64,
        windows: usize,
    ) -> Result<Vec<BatchRow>> {
        let limit = f.limit.max(1);
        let top = match f.before_id {
            Some(b) => b,
            None => {
                let max: Option<i64> =
                    self.conn
                        .query_row("SELECT max(id) FROM batches", [], |r| r.get(0))?;
                max.unwrap_or(0).saturating_add(1)
            }
        };
        let mut out = Vec::new();
        let mut hi = top;
        for _ in 0..windows {
            if hi <= 0 || out.len() >= limit {
                return Ok(out);
            }
            let lo = hi.saturating_sub(window.max(1)).max(0);
            out.extend(self.list_batches_in(f, true, Some(lo), hi, limit - out.len())?);
            hi = lo;
        }
        if hi > 0 && out.len() < limit {
            out.extend(self.list_batches_in(f, false, None, hi, limit - out.len())?);
        }
        Ok(out)
    }

    /// One statement of `list_batches`: ids in [lo, hi), newest first, at most `limit`;
    /// `by_id` leaves the equality columns' indexes out.
    fn list_batches_in(
        &self,
        f: &BatchFilter,
        by_id: bool,
        lo: Option<i64>,
        hi: i64,
        limit: usize,
    ) -> Result<Vec<BatchRow>> {
        let plus = if by_id { "+" } else { "" };
        let mut sql = format!("SELECT {BATCH_COLUMNS} FROM batches WHERE 1 = 1");
        let mut args: Vec<rusqlite::types::Value> = Vec::new();
        if let Some(s) = &f.state {
            args.push(s.clone().into());
            sql.push_str(&format!(" AND {plus}state = ?{}", args.len()));
        }
        if let Some(s) = &f.source {
            args.push(s.clone().into());
            sql.push_str(&format!(" AND {plus}source = ?{}", args.len()));
        }
        if let Some(d) = &f.destination {
            args.push(d.clone().into());
            sql.push_str(&format!(" AND {plus}destination = ?{}", args.len()));
        }
        if let Some(r) = &f.route {
            args.push(r.clone().into());
            sql.push_str(&format!(" AND {plus}route = ?{}", args.len()));
        }
        if let Some(p) = &f.key_prefix {
            args.push((p.chars().count() as i64).into());
            args.push(p.clone().into());
            sql.push_str(&format!(
                " AND substr(key, 1, ?{}) = ?{}",
                args.len() - 1,
                args.len()
            ));
        }
        if let Some(t) = f.since {
            args.push(t.into());
            sql.push_str(&format!(" AND {plus}first_at >= ?{}", args.len()));
        }
        if let Some(t) = f.until {
            args.push(t.into());
            sql.push_str(&format!(" AND {plus}first_at < ?{}", args.len()));
        }
        if let Some(t) = &f.event_type {
            args.push(t.clone().into());
            sql.push_str(&format!(
                " AND EXISTS (SELECT 1 FROM events e WHERE e.batch_id = batches.id AND e.event_type = ?{})",
                args.len()
            ));
        }
        if let Some(d) = &f.dedup_id {
            // The batches the dedup rows name (each source's key, never a scan of the
            // events), as integer literals.
            let ids = self.batches_by_dedup(d, f.source.as_deref())?;
            let list: Vec<String> = ids.iter().map(i64::to_string).collect();
            sql.push_str(&format!(" AND id IN ({})", list.join(", ")));
        }
        if let Some((path, value)) = &f.json {
            if !json_path_ok(path) {
                return Err(StoreError::Invalid(format!(
                    "{path:?} is not a JSON path the filter takes ($.a.b or $.items[0].id)"
                )));
            }
            args.push(path.clone().into());
            args.push(value.clone().into());
            let (p, v) = (args.len() - 1, args.len());
            // json_valid first: a payload that is not JSON (a form body) matches nothing
            // instead of failing the query. true/false/null compare by their JSON type.
            sql.push_str(&format!(
                " AND EXISTS (SELECT 1 FROM events e WHERE e.batch_id = batches.id AND CASE WHEN json_valid(e.payload) THEN (CASE json_type(e.payload, ?{p}) WHEN 'true' THEN ?{v} = 'true' WHEN 'false' THEN ?{v} = 'false' WHEN 'null' THEN ?{v} = 'null' WHEN 'object' THEN 0 WHEN 'array' THEN 0 ELSE CAST(json_extract(e.payload, ?{p}) AS TEXT) = ?{v} END) ELSE 0 END)"
            ));
        }
        if let Some(q) = &f.search {
            args.push(q.clone().into());
            let n = args.len();
            sql.push_str(&format!(
                " AND (instr(key, ?{n}) > 0 OR EXISTS (SELECT 1 FROM events e WHERE e.batch_id = batches.id AND (e.dedup_id = ?{n} OR e.event_type = ?{n})))"
            ));
        }
        args.push(hi.into());
        sql.push_str(&format!(" AND id < ?{}", args.len()));
        if let Some(lo) = lo {
            args.push(lo.into());
            sql.push_str(&format!(" AND id >= ?{}", args.len()));
        }
        args.push((limit.max(1) as i64).into());
        sql.push_str(&format!(" ORDER BY id DESC LIMIT ?{}", args.len()));
        let mut stmt = self.conn.prepare(&sql)?;
        let rows = stmt
            .query_map(params_from_iter(args), BatchRow::from_row)?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    /// A batch's events in document order, excluded ones included (and marked).
    pub fn events(&self, batch_id: i64, with_payload: bool) -> Result<Vec<EventRow>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT id, batch_id, source, route, event_type, dedup_id, received_at, size,
                    excluded_at, payload
             FROM events WHERE batch_id = ?1 ORDER BY id",
        )?;
        let rows = stmt
            .query_map([batch_id], |r| {
                Ok(EventRow {
                    id: r.get(0)?,
                    batch_id: r.get(1)?,
                    source: r.get(2)?,
                    route: r.get(3)?,
                    event_type: r.get(4)?,
                    dedup_id: r.get(5)?,
                    received_at: r.get(6)?,
                    size: r.get(7)?,
                    excluded_at: r.get(8)?,
                    payload: if with_payload { r.get(9)? } else { None },
                })
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    pub fn attempts(&self, batch_id: i64) -> Result<Vec<AttemptRow>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT id, batch_id, n, destination, started_at, finished_at, outcome, klass,
                    status, error, duration_ms, probe, counted, delivery_id, events_delivered,
                    failed_event_id
             FROM attempts WHERE batch_id = ?1 ORDER BY id",
        )?;
        let rows = stmt
            .query_map([batch_id], |r| {
                Ok(AttemptRow {
                    id: r.get(0)?,
                    batch_id: r.get(1)?,
                    n: r.get(2)?,
                    destination: r.get(3)?,
                    started_at: r.get(4)?,
                    finished_at: r.get(5)?,
                    outcome: r.get(6)?,
                    klass: r.get(7)?,
                    status: r.get(8)?,
                    error: r.get(9)?,
                    duration_ms: r.get(10)?,
                    probe: r.get::<_, i64>(11)? != 0,
                    counted: r.get::<_, i64>(12)? != 0,
                    delivery_id: r.get(13)?,
                    events_delivered: r.get(14)?,
                    failed_event_id: r.get(15)?,
                })
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    /// Count of batches per state, every state present (zeros included), in the order
    /// status prints them.
    pub fn batch_counts(&self) -> Result<Vec<(BatchState, i64)>> {
        let mut counts: Vec<(BatchState, i64)> = [
            BatchState::Open,
            BatchState::Sealed,
            BatchState::Leased,
            BatchState::Retry,
            BatchState::Delivered,
            BatchState::Dead,
            BatchState::Dropped,
        ]
        .iter()
        .map(|s| (*s, 0))
        .collect();
        let mut stmt = self
            .conn
            .prepare("SELECT state, count(*) FROM batches GROUP BY state")?;
        let rows = stmt
            .query_map([], |r| {
                Ok((r.get::<_, BatchState>(0)?, r.get::<_, i64>(1)?))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        for (state, n) in rows {
            if let Some(c) = counts.iter_mut().find(|c| c.0 == state) {
                c.1 = n;
            }
        }
        Ok(counts)
    }

    /// Dead batches matching a bulk replay's filters (spec 16 `replay --dead`; first event
    /// in [since, until)), oldest first; `list --state dead` and the admin API filter alike.
    pub fn dead_batch_ids(
        &self,
        destination: Option<&str>,
        source: Option<&str>,
        since: Option<f64>,
        until: Option<f64>,
    ) -> Result<Vec<i64>> {
        let mut stmt = self.conn.prepare(
            "SELECT id FROM batches WHERE state = 'dead' AND destination != 'quarantine'
               AND (?1 IS NULL OR destination = ?1) AND (?2 IS NULL OR source = ?2)
               AND (?3 IS NULL OR first_at >= ?3) AND (?4 IS NULL OR first_at < ?4)
             ORDER BY first_at, id",
        )?;
        let ids = stmt
            .query_map(rusqlite::params![destination, source, since, until], |r| {
                r.get(0)
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(ids)
    }
}

impl Store {
    /// Check the spool's structural invariants; each violation is one line. Used by the
    /// model and crash tests, and by `check`.
    pub fn check_invariants(&self) -> Result<Vec<String>> {
        let mut bad = Vec::new();
        let mut q = |sql: &str, what: &str| -> Result<()> {
            let mut stmt = self.conn.prepare(sql)?;
            let rows = stmt
                .query_map([], |r| r.get::<_, i64>(0))?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            for id in rows {
                bad.push(format!("batch {id}: {what}"));
            }
            Ok(())
        };
        q(
            "SELECT b.id FROM batches b WHERE b.destination != 'quarantine' AND b.state != 'dropped'
               AND b.count != (SELECT count(*) FROM events e WHERE e.batch_id = b.id AND e.excluded_at IS NULL)",
            "count differs from its events",
        )?;
        q(
            "SELECT b.id FROM batches b WHERE b.destination != 'quarantine' AND b.state != 'dropped'
               AND b.bytes != (SELECT coalesce(sum(size), 0) FROM events e
                               WHERE e.batch_id = b.id AND e.excluded_at IS NULL)",
            "bytes differ from its events",
        )?;
        q(
            "SELECT min(id) FROM batches WHERE state = 'open' GROUP BY route, key HAVING count(*) > 1",
            "more than one open batch in its group",
        )?;
        q(
            "SELECT id FROM batches WHERE state IN ('sealed', 'leased', 'retry', 'delivered')
               AND destination != 'quarantine' AND content_hash IS NULL",
            "sealed without a content_hash",
        )?;
        q(
            "SELECT id FROM batches WHERE state = 'leased' AND (lease_owner IS NULL OR lease_until IS NULL)",
            "leased without an owner",
        )?;
        q(
            "SELECT id FROM batches WHERE state != 'dropped' AND count > max_events",
            "more events than max_events",
        )?;
        q(
            "SELECT id FROM batches WHERE state != 'dropped' AND count > 1 AND bytes > max_bytes",
            "more bytes than max_bytes",
        )?;
        // A frozen batch's hash must match its content.
        let frozen: Vec<(i64, String)> = {
            let mut stmt = self.conn.prepare(
                "SELECT id, content_hash FROM batches WHERE content_hash IS NOT NULL
                   AND state IN ('sealed', 'leased', 'retry', 'dead')",
            )?;
            stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<rusqlite::Result<_>>()?
        };
        for (id, hash) in frozen {
            if super::delivery::hash_tx(&self.conn, id)? != hash {
                bad.push(format!(
                    "batch {id}: content_hash does not match its events"
                ));
            }
        }
        Ok(bad)
    }
}

impl StoreError {
    /// Whether the spool refused for lack of space (spec 9, 12): `Full` (SQLITE_FULL or
    /// ENOSPC), or SQLITE_IOERR_SHMSIZE, which SQLite raises when it cannot grow the `-shm`
    /// file: it writes one byte into every new page of it precisely so that a full
    /// filesystem fails there rather than with SIGBUS later. That is the error of every
    /// first connection to a spool whose `-shm` was removed (the last connection closed
    /// cleanly) while the disk is full. `From<rusqlite::Error>` maps only SQLITE_FULL to
    /// `Full` (its `is_enospc` compares the primary code with SQLITE_FULL inside the arm
    /// for SQLITE_IOERR, so it is never true); this reads the extended code as well.
    pub fn is_full(&self) -> bool {
        match self {
            StoreError::Full => true,
            StoreError::Sqlite(rusqlite::Error::SqliteFailure(f, _)) => {
                f.extended_code == rusqlite::ffi::SQLITE_IOERR_SHMSIZE
            }
            _ => false,
        }
    }

    /// Weather, not a fault: a busy or a full spool, which the dispatcher waits out with a
    /// backoff (keeping what it has not recorded in memory) instead of stopping.
    pub fn is_weather(&self) -> bool {
        self.is_retryable() || self.is_full()
    }
}

#[cfg(test)]
mod window_tests {
    use super::*;
    use crate::store::tests::req;
    use crate::store::testutil::temp_store;

    /// The windowed reading returns exactly the filter's newest rows, page after page,
    /// whether the page fills inside the windows, across them, or only below them.
    #[test]
    fn windowed_pages_are_the_filters_newest_rows_without_gaps_or_repeats() {
        let (_d, mut st) = temp_store();
        for i in 0..60 {
            let route = if i % 9 == 0 { "rare" } else { "common" };
            st.enqueue(&req(route, &format!("k{i}"), "{}", 1000.0 + f64::from(i)))
                .unwrap();
        }
        let all = st
            .list_batches_windowed(
                &BatchFilter {
                    limit: 1000,
                    ..Default::default()
                },
                1 << 40,
                1,
            )
            .unwrap();
        assert_eq!(all.len(), 60);
        for route in ["rare", "common"] {
            let want: Vec<i64> = all
                .iter()
                .filter(|b| b.route == route)
                .map(|b| b.id)
                .collect();
            for (window, windows) in [(1, 1), (3, 2), (7, 3), (100, 5), (2, 0)] {
                for limit in [1, 4, 10] {
                    let mut got = Vec::new();
                    let mut before = None;
                    loop {
                        let page = st
                            .list_batches_windowed(
                                &BatchFilter {
                                    route: Some(route.into()),
                                    before_id: before,
                                    limit,
                                    ..Default::default()
                                },
                                window,
                                windows,
                            )
                            .unwrap();
                        assert!(page.len() <= limit);
                        let Some(last) = page.last() else { break };
                        before = Some(last.id);
                        got.extend(page.iter().map(|b| b.id));
                    }
                    assert_eq!(
                        got, want,
                        "{route} window {window} x {windows}, limit {limit}"
                    );
                }
            }
        }
    }
}
