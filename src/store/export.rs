//! `hookspool export` and `hookspool prune --vacuum` (spec 8, 16): the spool's by-hand
//! maintenance. Export writes batches with their events and attempts as JSON
//! records, streamed page by page so a large spool never sits in memory. This is a backup and
//! forensics format: it includes payloads, raw bodies (base64) and stored headers, which
//! is why it goes to a file the operator names and never to a log.

use base64::Engine as _;
use rusqlite::params;
use serde_json::{Value, json};

use super::enqueue::RAW_BODY_SQL;
use super::query::{BATCH_COLUMNS, BatchRow};
use super::{Result, Store};

/// Batches read per page.
pub const EXPORT_PAGE_BATCHES_MAX: i64 = 500;

/// What to export. `since` keeps batches whose last activity (last event, delivery or
/// drop) is at or after it.
#[derive(Debug, Clone, Default)]
pub struct ExportFilter {
    pub state: Option<String>,
    pub since: Option<f64>,
}

impl Store {
    /// VACUUM the database (spec 8: only by hand; it needs about twice the file's size free
    /// and holds the write lock while it runs), then truncate the WAL.
    pub fn vacuum(&self) -> Result<()> {
        self.conn.execute_batch("VACUUM")?;
        self.checkpoint()
    }

    /// Calls `emit` with one record per batch, then its events, then its attempts, in batch
    /// id order. Records carry `"record": "batch" | "event" | "attempt"`. Returns the
    /// number of batches exported.
    pub fn export(&self, f: &ExportFilter, emit: &mut dyn FnMut(Value)) -> Result<i64> {
        let mut after = 0i64;
        let mut total = 0i64;
        loop {
            let sql = format!(
                "SELECT {BATCH_COLUMNS} FROM batches
                 WHERE id > ?1 AND (CAST(?2 AS TEXT) IS NULL OR state = ?2)
                   AND (CAST(?3 AS REAL) IS NULL OR max(last_at, coalesce(delivered_at, 0),
                                          coalesce(dropped_at, 0)) >= ?3)
                 ORDER BY id LIMIT ?4"
            );
            let page: Vec<BatchRow> = {
                let mut stmt = self.conn.prepare_cached(&sql)?;
                stmt.query_map(
                    params![after, f.state, f.since, EXPORT_PAGE_BATCHES_MAX],
                    BatchRow::from_row,
                )?
                .collect::<rusqlite::Result<_>>()?
            };
            let Some(last) = page.last() else {
                return Ok(total);
            };
            after = last.id;
            for b in page {
                let id = b.id;
                let mut v = json!(b);
                v["record"] = json!("batch");
                emit(v);
                self.export_events(id, emit)?;
                for a in self.attempts(id)? {
                    let mut v = json!(a);
                    v["record"] = json!("attempt");
                    emit(v);
                }
                total += 1;
            }
        }
    }

    fn export_events(&self, batch_id: i64, emit: &mut dyn FnMut(Value)) -> Result<()> {
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT id, batch_id, source, route, event_type, dedup_id, received_at, size,
                    excluded_at, payload, {RAW_BODY_SQL}, headers
             FROM events WHERE batch_id = ?1 ORDER BY id"
        ))?;
        let rows = stmt
            .query_map([batch_id], |r| {
                let raw: Option<Vec<u8>> = r.get(10)?;
                let headers: String = r.get(11)?;
                Ok(json!({
                    "record": "event",
                    "id": r.get::<_, i64>(0)?,
                    "batch_id": r.get::<_, i64>(1)?,
                    "source": r.get::<_, String>(2)?,
                    "route": r.get::<_, String>(3)?,
                    "event_type": r.get::<_, String>(4)?,
                    "dedup_id": r.get::<_, Option<String>>(5)?,
                    "received_at": r.get::<_, f64>(6)?,
                    "size": r.get::<_, i64>(7)?,
                    "excluded_at": r.get::<_, Option<f64>>(8)?,
                    "payload": r.get::<_, Option<String>>(9)?,
                    "raw_base64": raw.map(|b| base64::engine::general_purpose::STANDARD.encode(b)),
                    "headers": serde_json::from_str::<Value>(&headers).unwrap_or(Value::Null),
                }))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        for v in rows {
            emit(v);
        }
        Ok(())
    }
}
