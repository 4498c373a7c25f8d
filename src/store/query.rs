//! Reads for the CLI and observe: batch listings, one batch with its events and attempts,
//! and the document's inputs. Nothing here writes.

use std::time::{Duration, Instant};

use rusqlite::OptionalExtension;

use super::db::{Row, params_from_iter};

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

impl EventRow {
    /// A row whose first columns are id, batch_id, source, route, event_type, dedup_id,
    /// received_at, size, excluded_at, and, when `with_payload`, the payload tenth.
    pub(super) fn from_row(r: &Row<'_>, with_payload: bool) -> rusqlite::Result<EventRow> {
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
    }
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

/// A scan in id order reads the table in windows of ids, the first this wide...
pub const SCAN_WINDOW_FIRST: i64 = 1_000;
/// ...each one `SCAN_WINDOW_GROWTH` times the last while the page is not full...
pub const SCAN_WINDOW_GROWTH: i64 = 4;
/// ...up to this many ids (or fewer, when the time left would not cover one).
pub const SCAN_WINDOW_MAX: i64 = 200_000;
/// A received-between filter (since/until) whose window holds at most this many batches
/// below the page's start is answered from `batches_first_at`, sorted by id; a wider one is
/// read in id order like any other filter.
pub const FIRST_AT_SORT_MAX: i64 = 5_000;
/// Dead (or dropped) batches one step of a walk down `batches_terminal` examines.
pub const TERMINAL_STEP: i64 = 2_000;

/// How much one page of [`Store::list_batches_page`] may examine before it answers with
/// what it found and where it stopped. A filter an index answers (a dedup id, a narrow
/// received-between window) is never cut; the others (a JSON path, a search, a key prefix,
/// a rare source) cost a scan, and a scan is bounded by this.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanBudget {
    /// Batches examined: the ids of each window of the table, or the entries of an index
    /// walk.
    pub rows_max: i64,
    /// Time taken, read after each statement (a page takes at most this and one window,
    /// whose width is chosen from the time the last one took). Elapsed time on the
    /// monotonic clock, never the spool's time.
    pub time_max: Option<Duration>,
}

impl ScanBudget {
    /// To the end of the spool: `hookspool list` and every caller of [`Store::list_batches`].
    pub const UNLIMITED: ScanBudget = ScanBudget {
        rows_max: i64::MAX,
        time_max: None,
    };
}

/// One page of [`Store::list_batches_page`].
#[derive(Debug, Clone, PartialEq)]
pub struct BatchPage {
    /// The filter's newest batches below `before_id`, at most `limit`, newest first.
    pub rows: Vec<BatchRow>,
    /// The next page's `before_id`: the last row's id when more matching batches follow,
    /// or where the scan stopped on its budget; `None` when nothing below can match.
    pub next_before: Option<i64>,
    /// `Some(id)` when the budget ran out before the page was full: every batch from `id`
    /// up to the page's start was examined and the matches are in `rows` (possibly none),
    /// and batches below `id` were not looked at. `next_before` is then `id`, so the pages
    /// that follow neither skip nor repeat a batch.
    pub scanned_to: Option<i64>,
}

/// How a page reads the batches table.
enum Access {
    /// The ids the dedup rows name, as integer literals.
    Ids(Vec<i64>),
    /// A narrow received-between window through `batches_first_at`, sorted by id.
    FirstAt,
    /// A walk down `batches_terminal` for this state (`dead` or `dropped`).
    Terminal(&'static str),
    /// The table in id order, in windows.
    Table,
}

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
/// A path `json_path_ok` took (`$.items[0].id`) as its steps joined by commas
/// (`items,0,id`), for PostgreSQL's `string_to_array`.
fn pg_json_path(path: &str) -> String {
    let steps: Vec<&str> = path
        .trim_start_matches('$')
        .split(['.', '[', ']'])
        .filter(|s| !s.is_empty())
        .collect();
    steps.join(",")
}

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
        Ok(stmt
            .query_row([batch_id], |r| r.get(0))
            .optional()?
            .flatten())
    }

    pub fn batch(&self, id: i64) -> Result<BatchRow> {
        let sql = format!("SELECT {BATCH_COLUMNS} FROM batches WHERE id = ?1");
        super::cached::row(&self.conn, &sql, [id], BatchRow::from_row)?
            .ok_or_else(|| StoreError::NotFound(format!("batch {id}")))
    }

    /// Batches, newest first: the filter's first `f.limit` below `f.before_id`, scanning as
    /// far as it takes (`hookspool list` and the tests).
    pub fn list_batches(&self, f: &BatchFilter) -> Result<Vec<BatchRow>> {
        Ok(self
            .scan(f, f.limit.max(1), ScanBudget::UNLIMITED, FIRST_AT_SORT_MAX)?
            .0)
    }

    /// One page of the admin API and the dashboard: the filter's first `f.limit` below
    /// `f.before_id`, and where the next page starts. A page examines at most what
    /// `budget` allows; when it runs out first, the page holds what it found (possibly
    /// nothing) and `scanned_to` says how far it read.
    ///
    /// How the table is read (EXPLAIN QUERY PLAN for each is in `plans_tests`): a dedup id
    /// through the dedup rows; a received-between window holding at most
    /// `FIRST_AT_SORT_MAX` batches through `batches_first_at`, sorted by id; `state = dead`
    /// or `dropped` down `batches_terminal` in id order; anything else through the table
    /// in id order, in windows of ids that grow while the page is not full. Without
    /// statistics SQLite would read an equality on an indexed column (state, route,
    /// destination) through that index and then sort every match by id, seconds on a large
    /// spool when the value is common; in id order a common value fills the page in the
    /// first window, and the budget bounds a rare one. The windows are contiguous, so
    /// nothing is skipped or repeated.
    pub fn list_batches_page(&self, f: &BatchFilter, budget: ScanBudget) -> Result<BatchPage> {
        self.list_batches_page_with(f, budget, FIRST_AT_SORT_MAX)
    }

    /// `list_batches_page` with the received-between window's bound given (the tests use
    /// small ones).
    fn list_batches_page_with(
        &self,
        f: &BatchFilter,
        budget: ScanBudget,
        first_at_sort_max: i64,
    ) -> Result<BatchPage> {
        let limit = f.limit.max(1);
        // One more than the page tells whether there is a next page.
        let (mut rows, stopped) = self.scan(f, limit + 1, budget, first_at_sort_max)?;
        if rows.len() > limit {
            rows.truncate(limit);
            let next_before = rows.last().map(|b| b.id);
            return Ok(BatchPage {
                rows,
                next_before,
                scanned_to: None,
            });
        }
        Ok(BatchPage {
            rows,
            next_before: stopped,
            scanned_to: stopped,
        })
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

    /// Which way a page below `top` reads the table (see `list_batches_page`).
    fn access(&self, f: &BatchFilter, top: i64, first_at_sort_max: i64) -> Result<Access> {
        if let Some(d) = &f.dedup_id {
            return Ok(Access::Ids(self.batches_by_dedup(d, f.source.as_deref())?));
        }
        if f.since.is_some() || f.until.is_some() {
            let mut sql = String::from(
                "SELECT count(*) FROM (SELECT 1 FROM batches INDEXED BY batches_first_at
                 WHERE id < ?1",
            );
            let mut args: Vec<rusqlite::types::Value> = vec![top.into()];
            if let Some(t) = f.since {
                args.push(t.into());
                sql.push_str(&format!(" AND first_at >= ?{}", args.len()));
            }
            if let Some(t) = f.until {
                args.push(t.into());
                sql.push_str(&format!(" AND first_at < ?{}", args.len()));
            }
            args.push((first_at_sort_max + 1).into());
            sql.push_str(&format!(" LIMIT ?{}) AS scanned", args.len()));
            let n: i64 = self
                .conn
                .prepare_cached(&sql)?
                .query_row(params_from_iter(args), |r| r.get(0))?;
            if n <= first_at_sort_max {
                return Ok(Access::FirstAt);
            }
        }
        match f.state.as_deref().and_then(BatchState::parse) {
            Some(s @ (BatchState::Dead | BatchState::Dropped)) => Ok(Access::Terminal(s.as_str())),
            _ => Ok(Access::Table),
        }
    }

    /// The filter's newest `want` rows below `f.before_id`, and `Some(id)` when the budget
    /// stopped the scan at `id` first.
    fn scan(
        &self,
        f: &BatchFilter,
        want: usize,
        budget: ScanBudget,
        first_at_sort_max: i64,
    ) -> Result<(Vec<BatchRow>, Option<i64>)> {
        if let Some((path, _)) = &f.json
            && !json_path_ok(path)
        {
            return Err(StoreError::Invalid(format!(
                "{path:?} is not a JSON path the filter takes ($.a.b or $.items[0].id)"
            )));
        }
        let started = Instant::now();
        let top = match f.before_id {
            Some(b) => b,
            None => {
                let max: Option<i64> =
                    self.conn
                        .query_row("SELECT max(id) FROM batches", (), |r| r.get(0))?;
                max.unwrap_or(0).saturating_add(1)
            }
        };
        let mut out = Vec::new();
        if top <= 0 {
            return Ok((out, None));
        }
        let access = self.access(f, top, first_at_sort_max)?;
        let spent = |examined: i64| {
            examined >= budget.rows_max || budget.time_max.is_some_and(|t| started.elapsed() >= t)
        };
        let (mut hi, mut examined) = (top, 0i64);
        let mut window = SCAN_WINDOW_FIRST;
        loop {
            let left = budget.rows_max.saturating_sub(examined).max(1);
            let t = Instant::now();
            let (lo, read) = match access {
                // Bounded by the dedup ids or by FIRST_AT_SORT_MAX: one statement, never cut.
                Access::Ids(_) | Access::FirstAt => (0, 0),
                Access::Terminal(state) => {
                    let step = TERMINAL_STEP.min(left);
                    // The step-th entry below `hi` (so [lo, hi) holds `step` of them), or
                    // the end when fewer are left.
                    let lo = super::cached::row(
                        &self.conn,
                        "SELECT id FROM batches INDEXED BY batches_terminal
                         WHERE state IN ('dead', 'dropped') AND state = ?1 AND id < ?2
                         ORDER BY id DESC LIMIT 1 OFFSET ?3",
                        rusqlite::params![state, hi, step - 1],
                        |r| r.get::<_, i64>(0),
                    )?
                    .unwrap_or(0);
                    (lo, step)
                }
                Access::Table => {
                    let w = window.min(left);
                    (hi.saturating_sub(w).max(0), w)
                }
            };
            examined = examined.saturating_add(read);
            out.extend(self.list_batches_in(f, &access, lo, hi, want - out.len())?);
            hi = lo;
            if out.len() >= want || hi <= 0 {
                return Ok((out, None));
            }
            if spent(examined) {
                return Ok((out, Some(hi)));
            }
            // The next window: wider, but no wider than the time left covers at the rate
            // this one was read (a JSON path costs some ten times a column).
            window = window
                .saturating_mul(SCAN_WINDOW_GROWTH)
                .min(SCAN_WINDOW_MAX);
            if let Some(max) = budget.time_max {
                let per_id = t.elapsed().as_secs_f64() / read.max(1) as f64;
                let left_s = max.saturating_sub(started.elapsed()).as_secs_f64();
                if per_id > 0.0 {
                    window = window.min(((left_s / per_id) as i64).max(SCAN_WINDOW_FIRST));
                }
            }
        }
    }

    /// One statement of a page: ids in [lo, hi) the way `access` reads them, newest first,
    /// at most `limit`.
    fn list_batches_in(
        &self,
        f: &BatchFilter,
        access: &Access,
        lo: i64,
        hi: i64,
        limit: usize,
    ) -> Result<Vec<BatchRow>> {
        let (sql, args) = page_statement(f, access, lo, hi, limit, self.conn.is_pg());
        let mut stmt = self.conn.prepare_cached(&sql)?;
        let rows = stmt
            .query_map(params_from_iter(args), BatchRow::from_row)?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }
}

/// The statement of one page step: ids in [lo, hi) the way `access` reads them, newest
/// first, at most `limit` (?1 hi, ?2 lo, ?3 the limit, then the filter's values).
fn page_statement(
    f: &BatchFilter,
    access: &Access,
    lo: i64,
    hi: i64,
    limit: usize,
    pg: bool,
) -> (String, Vec<rusqlite::types::Value>) {
    let from = match access {
        Access::Ids(_) => "batches",
        Access::FirstAt => "batches INDEXED BY batches_first_at",
        Access::Terminal(_) => "batches INDEXED BY batches_terminal",
        // The rowid range, no index: see `list_batches_page`.
        Access::Table => "batches NOT INDEXED",
    };
    let mut sql = format!("SELECT {BATCH_COLUMNS} FROM {from} WHERE id < ?1 AND id >= ?2");
    let mut args: Vec<rusqlite::types::Value> =
        vec![hi.into(), lo.into(), (limit.max(1) as i64).into()];
    if let Access::Terminal(state) = access {
        // The partial index's own term, then the state: a literal from the vocabulary.
        sql.push_str(&format!(
            " AND state IN ('dead', 'dropped') AND state = '{state}'"
        ));
    } else if let Some(s) = &f.state {
        args.push(s.clone().into());
        sql.push_str(&format!(" AND state = ?{}", args.len()));
    }
    if let Some(s) = &f.source {
        args.push(s.clone().into());
        sql.push_str(&format!(" AND source = ?{}", args.len()));
    }
    if let Some(d) = &f.destination {
        args.push(d.clone().into());
        sql.push_str(&format!(" AND destination = ?{}", args.len()));
    }
    if let Some(r) = &f.route {
        args.push(r.clone().into());
        sql.push_str(&format!(" AND route = ?{}", args.len()));
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
        sql.push_str(&format!(" AND first_at >= ?{}", args.len()));
    }
    if let Some(t) = f.until {
        args.push(t.into());
        sql.push_str(&format!(" AND first_at < ?{}", args.len()));
    }
    if let Some(t) = &f.event_type {
        args.push(t.clone().into());
        sql.push_str(&format!(
            " AND EXISTS (SELECT 1 FROM events e WHERE e.batch_id = batches.id AND e.event_type = ?{})",
            args.len()
        ));
    }
    if let Access::Ids(ids) = access {
        // The batches the dedup rows name (each source's key, never a scan of the
        // events), as integer literals.
        let list: Vec<String> = ids.iter().map(i64::to_string).collect();
        sql.push_str(&format!(" AND id IN ({})", list.join(", ")));
    }
    if let Some((path, value)) = &f.json
        && pg
    {
        // PostgreSQL: the path as its steps joined by commas (`json_path_ok` allows only
        // names of [A-Za-z0-9_-] and indexes, so no step holds a comma); booleans and
        // null compare by their JSON type, numbers and strings by their text.
        args.push(pg_json_path(path).into());
        args.push(value.clone().into());
        let (p, v) = (args.len() - 1, args.len());
        sql.push_str(&format!(
            " AND EXISTS (SELECT 1 FROM events e WHERE e.batch_id = batches.id AND CASE WHEN hookspool_json_valid(e.payload) THEN (CASE json_typeof(e.payload::json #> string_to_array(?{p}, ',')) WHEN 'null' THEN ?{v} = 'null' WHEN 'object' THEN false WHEN 'array' THEN false ELSE (e.payload::json #>> string_to_array(?{p}, ',')) = ?{v} END) ELSE false END)"
        ));
    } else if let Some((path, value)) = &f.json {
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
    sql.push_str(" ORDER BY id DESC LIMIT ?3");
    (sql, args)
}

impl Store {
    /// A batch's events in document order, excluded ones included (and marked).
    pub fn events(&self, batch_id: i64, with_payload: bool) -> Result<Vec<EventRow>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT id, batch_id, source, route, event_type, dedup_id, received_at, size,
                    excluded_at, payload
             FROM events WHERE batch_id = ?1 ORDER BY id",
        )?;
        let rows = stmt
            .query_map([batch_id], |r| EventRow::from_row(r, with_payload))?
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
            .query_map((), |r| {
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
               AND (CAST(?1 AS TEXT) IS NULL OR destination = ?1) AND (CAST(?2 AS TEXT) IS NULL OR source = ?2)
               AND (CAST(?3 AS REAL) IS NULL OR first_at >= ?3) AND (CAST(?4 AS REAL) IS NULL OR first_at < ?4)
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
                .query_map((), |r| r.get::<_, i64>(0))?
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
        // A frozen batch's hash must match its content; so must an open batch's open_hash,
        // when known (it is what its seal will store).
        let hashed: Vec<(i64, String, String)> = {
            let mut stmt = self.conn.prepare(
                "SELECT id, content_hash, 'content_hash' FROM batches WHERE content_hash IS NOT NULL
                   AND state IN ('sealed', 'leased', 'retry', 'dead')
                 UNION ALL
                 SELECT id, open_hash, 'open_hash' FROM batches
                 WHERE state = 'open' AND open_hash IS NOT NULL",
            )?;
            stmt.query_map((), |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                .collect::<rusqlite::Result<_>>()?
        };
        for (id, hash, column) in hashed {
            if super::delivery::hash_tx(&self.conn, id)? != hash {
                bad.push(format!("batch {id}: {column} does not match its events"));
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
mod page_tests {
    use super::*;
    use crate::store::tests::req;
    use crate::store::testutil::temp_store;

    /// 90 batches: routes "rare" (every 9th) and "common", keys k<i>, first events one
    /// second apart from 1000, payloads {"n": i % 4}, every 7th dead and every 11th
    /// dropped.
    fn spool() -> (tempfile::TempDir, Store) {
        spool_on(temp_store())
    }

    fn spool_on((d, mut st): (tempfile::TempDir, Store)) -> (tempfile::TempDir, Store) {
        for i in 0..90 {
            let route = if i % 9 == 0 { "rare" } else { "common" };
            let payload = format!(r#"{{"n":{}}}"#, i % 4);
            st.enqueue(&req(
                route,
                &format!("k{i}"),
                &payload,
                1000.0 + f64::from(i),
            ))
            .unwrap();
        }
        st.conn
            .execute_batch(
                "UPDATE batches SET state = 'dead', finished = 1 WHERE id % 7 = 0;
                 UPDATE batches SET state = 'dropped', finished = 1 WHERE id % 11 = 0 AND id % 7 != 0;",
            )
            .unwrap();
        (d, st)
    }

    fn ids_where(st: &Store, cond: &str) -> Vec<i64> {
        st.conn
            .prepare(&format!(
                "SELECT id FROM batches WHERE {cond} ORDER BY id DESC"
            ))
            .unwrap()
            .query_map((), |r| r.get(0))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap()
    }

    /// Paged with any budget, a filter's pages are exactly its rows newest first (the
    /// expected rows from plain SQL written here), whether each page fills, stops on its
    /// budget or ends; and a small budget does stop sparse filters early.
    fn pages_are_the_filters_rows_without_gaps_or_repeats_whatever_the_budget() {
        let (_d, st) = spool();
        let json = |v: &str| Some(("$.n".to_string(), v.to_string()));
        let cases: Vec<(BatchFilter, &str)> = vec![
            (BatchFilter::default(), "1 = 1"),
            (
                BatchFilter {
                    route: Some("rare".into()),
                    ..Default::default()
                },
                "route = 'rare'",
            ),
            (
                BatchFilter {
                    route: Some("common".into()),
                    ..Default::default()
                },
                "route = 'common'",
            ),
            (
                BatchFilter {
                    state: Some("dead".into()),
                    ..Default::default()
                },
                "state = 'dead'",
            ),
            (
                BatchFilter {
                    state: Some("dropped".into()),
                    route: Some("common".into()),
                    ..Default::default()
                },
                "state = 'dropped' AND route = 'common'",
            ),
            (
                BatchFilter {
                    since: Some(1010.0),
                    until: Some(1040.0),
                    ..Default::default()
                },
                "first_at >= 1010 AND first_at < 1040",
            ),
            (
                BatchFilter {
                    since: Some(1050.0),
                    state: Some("dead".into()),
                    ..Default::default()
                },
                "first_at >= 1050 AND state = 'dead'",
            ),
            (
                BatchFilter {
                    key_prefix: Some("k1".into()),
                    ..Default::default()
                },
                "key LIKE 'k1%'",
            ),
            (
                BatchFilter {
                    json: json("3"),
                    ..Default::default()
                },
                "CAST(json_extract((SELECT payload FROM events e WHERE e.batch_id = batches.id), '$.n') AS TEXT) = '3'",
            ),
            (
                BatchFilter {
                    search: Some("k8".into()),
                    ..Default::default()
                },
                "instr(key, 'k8') > 0",
            ),
        ];
        let budgets = [1, 3, 10, 40, i64::MAX];
        for (filter, cond) in &cases {
            let want = ids_where(&st, cond);
            assert!(!want.is_empty(), "{cond}: the spool holds matches");
            for sort_max in [1, FIRST_AT_SORT_MAX] {
                for rows_max in budgets {
                    for limit in [1, 4, 10] {
                        let budget = ScanBudget {
                            rows_max,
                            time_max: None,
                        };
                        let (mut got, mut before, mut stops) = (Vec::new(), None, 0);
                        for _ in 0..1000 {
                            let page = st
                                .list_batches_page_with(
                                    &BatchFilter {
                                        before_id: before,
                                        limit,
                                        ..filter.clone()
                                    },
                                    budget,
                                    sort_max,
                                )
                                .unwrap();
                            assert!(page.rows.len() <= limit);
                            if let Some(at) = page.scanned_to {
                                stops += 1;
                                assert_eq!(page.next_before, Some(at));
                                assert!(page.rows.iter().all(|b| b.id >= at));
                            }
                            got.extend(page.rows.iter().map(|b| b.id));
                            match page.next_before {
                                Some(b) => before = Some(b),
                                None => break,
                            }
                        }
                        let what = format!(
                            "{cond}: budget {rows_max}, limit {limit}, sort_max {sort_max}"
                        );
                        assert_eq!(got, want, "{what}");
                        // The whole spool in one page: nothing to stop for.
                        if rows_max == i64::MAX {
                            assert_eq!(stops, 0, "{what}");
                        }
                        // A budget of one row cannot fill a page of a sparse filter read
                        // in id order.
                        if rows_max == 1 && cond.starts_with("route = 'rare'") {
                            assert!(stops > 0, "{what}");
                        }
                    }
                }
            }
        }
        // `list_batches` reads to the end.
        for (filter, cond) in &cases {
            let all = st
                .list_batches(&BatchFilter {
                    limit: 1000,
                    ..filter.clone()
                })
                .unwrap();
            let ids: Vec<i64> = all.iter().map(|b| b.id).collect();
            assert_eq!(ids, ids_where(&st, cond), "{cond}");
        }
    }

    /// Each way of reading is the plan it claims: the terminal states down their partial
    /// index, a narrow received window through batches_first_at, the rest by rowid ranges
    /// with no index (and no sort but the narrow window's).
    #[test]
    fn each_access_is_the_plan_it_claims() {
        let (_d, st) = spool_on(crate::store::testutil::temp_sqlite_store()); // SQLite's plans
        let plan = |f: &BatchFilter, access: Access| -> String {
            let (sql, args) = page_statement(f, &access, 0, 100, 10, false);
            st.conn
                .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
                .unwrap()
                .query_map(params_from_iter(args), |r| r.get::<_, String>(3))
                .unwrap()
                .collect::<rusqlite::Result<Vec<_>>>()
                .unwrap()
                .join("; ")
        };
        let dead = BatchFilter {
            state: Some("dead".into()),
            ..Default::default()
        };
        let p = plan(&dead, Access::Terminal("dead"));
        assert!(
            p.contains("USING COVERING INDEX batches_terminal")
                || p.contains("USING INDEX batches_terminal"),
            "{p}"
        );
        assert!(!p.contains("TEMP B-TREE"), "no sort: {p}");
        let since = BatchFilter {
            since: Some(1080.0),
            ..Default::default()
        };
        let p = plan(&since, Access::FirstAt);
        assert!(p.contains("batches_first_at (first_at>?)"), "{p}");
        let rare = BatchFilter {
            route: Some("rare".into()),
            ..Default::default()
        };
        let p = plan(&rare, Access::Table);
        assert!(
            p.contains("INTEGER PRIMARY KEY (rowid>? AND rowid<?)"),
            "{p}"
        );
        assert!(!p.contains("TEMP B-TREE") && !p.contains("INDEX"), "{p}");
        // And the pages choose them.
        assert!(matches!(
            st.access(&dead, 100, FIRST_AT_SORT_MAX).unwrap(),
            Access::Terminal("dead")
        ));
        assert!(matches!(
            st.access(&since, 100, FIRST_AT_SORT_MAX).unwrap(),
            Access::FirstAt
        ));
        assert!(matches!(st.access(&since, 100, 5).unwrap(), Access::Table));
        assert!(matches!(
            st.access(&rare, 100, FIRST_AT_SORT_MAX).unwrap(),
            Access::Table
        ));
    }
    crate::store::testutil::both_backends!(
        pages_are_the_filters_rows_without_gaps_or_repeats_whatever_the_budget,
    );
}
