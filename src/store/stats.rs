//! Aggregates for `status`, /healthz and /metrics (spec 11.1, 11.2): counts and ages
//! computed from the tables at read time, over the retention window. Nothing here writes,
//! and every query is indexed or bounded by the size of a small table (destinations,
//! sources), so a scrape stays cheap on a large spool.

use rusqlite::params;

use super::{Result, Store};

/// hookspool_attempts_30d{destination,outcome,klass}.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct AttemptCount {
    pub destination: String,
    /// ok, retry, dead, discarded, or "running" for an attempt not finished yet.
    pub outcome: String,
    /// The class, "" for none (a success).
    pub klass: String,
    pub count: i64,
}

/// hookspool_attempt_duration_seconds_sum_30d / _count_30d{destination}.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct AttemptDuration {
    pub destination: String,
    pub sum_s: f64,
    pub count: i64,
}

/// One row of the polls table (spec 14.4), and whether its last tick is still undelivered.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PollRow {
    pub instance: String,
    pub next_at: f64,
    pub last_tick_at: Option<f64>,
    pub last_batch_id: Option<i64>,
    pub delivered_at: Option<f64>,
    pub delivered_tick_at: Option<f64>,
    pub skipped: i64,
    pub created_at: f64,
    pub pending: bool,
}

impl Store {
    /// Every poll instance, by name.
    pub fn polls(&self) -> Result<Vec<PollRow>> {
        let mut stmt = self.conn.prepare(
            "SELECT p.instance, p.next_at, p.last_tick_at, p.last_batch_id, p.delivered_at,
                    p.delivered_tick_at, p.skipped, p.created_at,
                    CASE WHEN b.state IN ('open', 'sealed', 'retry', 'leased', 'dead') THEN 1 ELSE 0 END
             FROM polls p LEFT JOIN batches b ON b.id = p.last_batch_id
             ORDER BY p.instance",
        )?;
        let rows = stmt
            .query_map((), |r| {
                Ok(PollRow {
                    instance: r.get(0)?,
                    next_at: r.get(1)?,
                    last_tick_at: r.get(2)?,
                    last_batch_id: r.get(3)?,
                    delivered_at: r.get(4)?,
                    delivered_tick_at: r.get(5)?,
                    skipped: r.get(6)?,
                    created_at: r.get(7)?,
                    pending: r.get::<_, i64>(8)? != 0,
                })
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    /// Finished and running attempts started at or after `since`, per (destination,
    /// outcome, klass).
    pub fn attempt_counts_since(&self, since: f64) -> Result<Vec<AttemptCount>> {
        let mut stmt = self.conn.prepare(
            "SELECT destination, coalesce(outcome, 'running'), coalesce(klass, ''), count(*)
             FROM attempts WHERE started_at >= ?1
             GROUP BY 1, 2, 3 ORDER BY 1, 2, 3",
        )?;
        let rows = stmt
            .query_map([since], |r| {
                Ok(AttemptCount {
                    destination: r.get(0)?,
                    outcome: r.get(1)?,
                    klass: r.get(2)?,
                    count: r.get(3)?,
                })
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    /// Durations of finished attempts started at or after `since`, per destination.
    pub fn attempt_durations_since(&self, since: f64) -> Result<Vec<AttemptDuration>> {
        let mut stmt = self.conn.prepare(
            "SELECT destination, coalesce(sum(duration_ms), 0) / 1000.0, count(*)
             FROM attempts WHERE started_at >= ?1 AND duration_ms IS NOT NULL
             GROUP BY 1 ORDER BY 1",
        )?;
        let rows = stmt
            .query_map([since], |r| {
                Ok(AttemptDuration {
                    destination: r.get(0)?,
                    sum_s: r.get(1)?,
                    count: r.get(2)?,
                })
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    /// Batches delivered at or after `since`, per destination (reclassified quarantine
    /// batches are not deliveries and are left out).
    pub fn delivered_since(&self, since: f64) -> Result<Vec<(String, i64)>> {
        let mut stmt = self.conn.prepare(
            "SELECT destination, count(*) FROM batches
             WHERE state = 'delivered' AND delivered_at >= ?1 AND destination != 'quarantine'
             GROUP BY 1 ORDER BY 1",
        )?;
        let rows = stmt
            .query_map([since], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    /// Dead quarantine batches: quarantined requests waiting for a fix and a replay.
    pub fn quarantined_count(&self) -> Result<i64> {
        Ok(self.conn.query_row(
            "SELECT count(*) FROM batches WHERE destination = 'quarantine' AND state = 'dead'",
            (),
            |r| r.get(0),
        )?)
    }

    /// Dead batches of one destination (what keeps a permanent/poison issue open).
    pub fn dead_count(&self, destination: &str) -> Result<i64> {
        Ok(self.conn.query_row(
            "SELECT count(*) FROM batches WHERE destination = ?1 AND state = 'dead'",
            [destination],
            |r| r.get(0),
        )?)
    }

    /// Dead quarantine batches of one source (what keeps config:plugin:<source> open).
    pub fn quarantined_count_for(&self, source: &str) -> Result<i64> {
        Ok(self.conn.query_row(
            "SELECT count(*) FROM batches
             WHERE destination = 'quarantine' AND state = 'dead' AND source = ?1",
            [source],
            |r| r.get(0),
        )?)
    }

    /// The first_at of the oldest unfinished (open, sealed, retry, leased) batch per
    /// destination, quarantine excluded, ordered by destination.
    pub fn oldest_pending(&self) -> Result<Vec<(String, f64)>> {
        let mut stmt = self.conn.prepare(
            "SELECT destination, min(first_at) FROM batches
             WHERE state IN ('open', 'sealed', 'retry', 'leased') AND destination != 'quarantine'
             GROUP BY 1 ORDER BY 1",
        )?;
        let rows = stmt
            .query_map((), |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    /// The unfinished (open, sealed, retry, leased) batches per destination, quarantine
    /// excluded: (destination, how many, the oldest's first_at), ordered by destination.
    /// The admin dashboard's backlog.
    pub fn pending_by_destination(&self) -> Result<Vec<(String, i64, f64)>> {
        let mut stmt = self.conn.prepare(
            "SELECT destination, count(*), min(first_at) FROM batches
             WHERE state IN ('open', 'sealed', 'retry', 'leased') AND destination != 'quarantine'
             GROUP BY 1 ORDER BY 1",
        )?;
        let rows = stmt
            .query_map((), |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    /// Destinations that have batches of any state, for gauges of destinations the
    /// dispatcher has not touched yet.
    pub fn batch_destinations(&self) -> Result<Vec<String>> {
        let mut stmt = self.conn.prepare(
            "SELECT DISTINCT destination FROM batches WHERE destination != 'quarantine'
             ORDER BY 1",
        )?;
        let rows = stmt
            .query_map((), |r| r.get(0))?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    /// meta.source:<name>:last_event_at for every source that has one: (source, at).
    pub fn source_last_events(&self) -> Result<Vec<(String, f64)>> {
        let mut stmt = self.conn.prepare(
            "SELECT substr(key, 8, length(key) - 7 - 14), CAST(value AS REAL) FROM meta
             WHERE key LIKE 'source:%:last_event_at' ORDER BY key",
        )?;
        let rows = stmt
            .query_map((), |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    /// Delivered batches of the same group that are newer than `batch_id`: a replay of it
    /// reaches the destination after them (the out-of-order warning of `replay`).
    pub fn later_delivered_in_group(&self, batch_id: i64) -> Result<i64> {
        Ok(self.conn.query_row(
            "SELECT count(*) FROM batches o JOIN batches b ON b.id = ?1
             WHERE o.route = b.route AND o.key = b.key AND o.state = 'delivered'
               AND (o.first_at > b.first_at OR (o.first_at = b.first_at AND o.id > b.id))",
            [batch_id],
            |r| r.get(0),
        )?)
    }

    /// The stored time in a meta key, when it parses as a number.
    pub fn meta_time(&self, key: &str) -> Result<Option<f64>> {
        Ok(self.meta(key)?.and_then(|v| v.trim().parse::<f64>().ok()))
    }

    /// Set a meta key to `value` only when it is absent; returns the value now stored.
    pub fn meta_time_init(&mut self, key: &str, value: f64) -> Result<f64> {
        let tx = self.begin()?;
        tx.execute(
            "INSERT INTO meta (key, value) VALUES (?1, ?2) ON CONFLICT(key) DO NOTHING",
            params![key, value.to_string()],
        )?;
        let v: String =
            tx.query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0))?;
        tx.commit()?;
        Ok(v.trim().parse::<f64>().unwrap_or(value))
    }
}

/// A hookspool process connected to a PostgreSQL spool, from the server's own session list
/// (`pg_stat_activity`, by the `application_name` each session gives itself).
#[derive(Debug, Clone, PartialEq)]
pub struct SessionRow {
    /// `intake`, `dispatch`, `run`, `admin` or `cli`.
    pub role: String,
    pub host: String,
    pub pid: i64,
    /// Whether one of its sessions holds the spool's dispatcher lock: the active dispatcher.
    pub active: bool,
    /// Seconds since its oldest session began.
    pub age_s: f64,
}

impl Store {
    /// Whether this spool is PostgreSQL's (several hosts may share it) rather than a file.
    pub fn is_postgres(&self) -> bool {
        self.conn.is_pg()
    }

    /// On PostgreSQL, the database's size on the server's disk (`pg_database_size`: tables,
    /// indexes, TOAST, free space inside them; not the WAL). `None` on SQLite, whose spool
    /// is the files beside `spool.db` (`observe::status::spool_bytes`).
    pub fn database_bytes(&self) -> Result<Option<u64>> {
        if !self.conn.is_pg() {
            return Ok(None);
        }
        let n: i64 =
            self.conn
                .query_row("SELECT pg_database_size(current_database())", (), |r| {
                    r.get(0)
                })?;
        Ok(Some(n.max(0) as u64))
    }

    /// The hookspool processes connected to this spool now, by role then host and pid. On
    /// SQLite, none: the spool has one host, and `status` reads its dispatcher's heartbeat.
    pub fn sessions(&self) -> Result<Vec<SessionRow>> {
        if !self.conn.is_pg() {
            return Ok(Vec::new());
        }
        let key = super::pg::PG_DISPATCH_LOCK_KEY;
        let (hi, lo) = (i64::from((key >> 32) as u32), i64::from(key as u32));
        let mut stmt = self.conn.prepare(
            "SELECT a.application_name,
                    extract(epoch FROM now() - a.backend_start)::double precision,
                    CASE WHEN EXISTS (SELECT 1 FROM pg_locks l
                                      WHERE l.pid = a.pid AND l.locktype = 'advisory'
                                        AND l.granted AND l.classid = CAST(?1 AS bigint)::oid
                                        AND l.objid = CAST(?2 AS bigint)::oid)
                         THEN 1 ELSE 0 END
             FROM pg_stat_activity a
             WHERE a.datname = current_database() AND a.application_name LIKE 'hookspool %'",
        )?;
        let rows = stmt
            .query_map([hi, lo], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, f64>(1)?,
                    r.get::<_, i64>(2)? == 1,
                ))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        let mut out: Vec<SessionRow> = Vec::new();
        for (name, age, holds) in rows {
            let rest = name
                .strip_prefix(super::pg::SESSION_PREFIX)
                .unwrap_or(&name);
            let Some((role, at)) = rest.split_once(' ') else {
                continue;
            };
            let Some((host, pid)) = at.rsplit_once(':') else {
                continue;
            };
            let Ok(pid) = pid.parse::<i64>() else {
                continue;
            };
            match out.iter_mut().find(|s| s.host == host && s.pid == pid) {
                Some(s) => {
                    s.active |= holds;
                    s.age_s = s.age_s.max(age);
                }
                None => out.push(SessionRow {
                    role: role.to_string(),
                    host: host.to_string(),
                    pid,
                    active: holds,
                    age_s: age,
                }),
            }
        }
        out.sort_by(|a, b| (&a.role, &a.host, a.pid).cmp(&(&b.role, &b.host, b.pid)));
        Ok(out)
    }
}
