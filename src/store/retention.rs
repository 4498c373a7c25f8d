//! Retention (spec 8): delete what has aged out, in transactions of at most
//! `PRUNE_BATCH_ROWS_MAX` rows so the intake never waits long, then checkpoint the WAL.
//! Dead batches are never pruned.

use rusqlite::params;

use super::{Result, Store};
use crate::failpoint;

/// Rows deleted per transaction (spec 8).
pub const PRUNE_BATCH_ROWS_MAX: i64 = 1000;
const DAY_S: f64 = 86_400.0;

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
}

impl Store {
    /// Run retention once at `now`.
    pub fn prune(&mut self, now: f64, r: &Retention) -> Result<PruneReport> {
        let mut rep = PruneReport::default();
        for (state, column, days) in [
            ("delivered", "delivered_at", r.delivered_days),
            ("dropped", "dropped_at", r.dropped_days),
        ] {
            let cutoff = now - days * DAY_S;
            loop {
                let tx = self.begin()?;
                let ids: Vec<i64> = {
                    let mut stmt = tx.prepare_cached(&format!(
                        "SELECT id FROM batches WHERE state = ?1 AND {column} < ?2 LIMIT ?3"
                    ))?;
                    stmt.query_map(params![state, cutoff, PRUNE_BATCH_ROWS_MAX], |r| r.get(0))?
                        .collect::<rusqlite::Result<_>>()?
                };
                if ids.is_empty() {
                    break;
                }
                for id in &ids {
                    rep.events +=
                        tx.execute("DELETE FROM events WHERE batch_id = ?1", [id])? as i64;
                    rep.batches += tx.execute("DELETE FROM batches WHERE id = ?1", [id])? as i64;
                }
                failpoint::hit("prune.before_commit");
                tx.commit()?;
            }
        }
        rep.attempts += self.delete_chunked(
            "DELETE FROM attempts WHERE id IN (SELECT id FROM attempts WHERE started_at < ?1 LIMIT ?2)",
            now - r.attempts_days * DAY_S,
        )?;
        rep.issues += self.delete_chunked(
            "DELETE FROM issues WHERE id IN (SELECT id FROM issues
               WHERE state IN ('resolved', 'ignored') AND last_at < ?1 LIMIT ?2)",
            now - r.issues_days * DAY_S,
        )?;
        // Dedup rows per source window; sources without a configured window use the default.
        let named: Vec<&str> = r.dedup_windows.iter().map(|(s, _)| s.as_str()).collect();
        for (source, window) in &r.dedup_windows {
            rep.dedup += self.delete_dedup(Some(source), &[], now - window)?;
        }
        rep.dedup += self.delete_dedup(None, &named, now - r.default_dedup_window_s)?;
        self.checkpoint()?;
        Ok(rep)
    }

    fn delete_chunked(&mut self, sql: &str, cutoff: f64) -> Result<i64> {
        let mut total = 0i64;
        loop {
            let tx = self.begin()?;
            let n = tx.execute(sql, params![cutoff, PRUNE_BATCH_ROWS_MAX])? as i64;
            tx.commit()?;
            total += n;
            if n < PRUNE_BATCH_ROWS_MAX {
                return Ok(total);
            }
        }
    }

    fn delete_dedup(&mut self, source: Option<&str>, except: &[&str], cutoff: f64) -> Result<i64> {
        let mut total = 0i64;
        let except_json = serde_json::to_string(except).unwrap_or_else(|_| "[]".into());
        loop {
            let tx = self.begin()?;
            let n = tx.execute(
                "DELETE FROM dedup WHERE rowid IN (
                    SELECT rowid FROM dedup
                    WHERE seen_at < ?1 AND (?2 IS NULL OR source = ?2)
                      AND (?2 IS NOT NULL OR source NOT IN (SELECT value FROM json_each(?3)))
                    LIMIT ?4)",
                params![cutoff, source, except_json, PRUNE_BATCH_ROWS_MAX],
            )? as i64;
            tx.commit()?;
            total += n;
            if n < PRUNE_BATCH_ROWS_MAX {
                return Ok(total);
            }
        }
    }
}
