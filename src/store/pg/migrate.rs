//! PostgreSQL's forward-only migrations (`migrations/postgres/`, numbered on their own) and
//! the session advisory lock that is dispatch.lock's analogue. Each migration runs in one
//! transaction that first takes the transaction-level form of the same lock, reads the
//! version again and records the new one in `meta.schema_version`, so two migrators that
//! race (two hosts' dispatchers starting together) apply each migration once.

use super::super::{Result, StoreError};
use super::PgStore;

/// (version, name, SQL), embedded so the binary carries its own schema.
pub const PG_MIGRATIONS: &[(i64, &str, &str)] = &[
    (
        1,
        "0001_schema",
        include_str!("../../../migrations/postgres/0001_schema.sql"),
    ),
    (
        2,
        "0002_list_indexes",
        include_str!("../../../migrations/postgres/0002_list_indexes.sql"),
    ),
    (
        3,
        "0003_rejections",
        include_str!("../../../migrations/postgres/0003_rejections.sql"),
    ),
    (
        4,
        "0004_json_valid",
        include_str!("../../../migrations/postgres/0004_json_valid.sql"),
    ),
    (
        5,
        "0005_attempts_fillfactor",
        include_str!("../../../migrations/postgres/0005_attempts_fillfactor.sql"),
    ),
    (
        6,
        "0006_seal_events",
        include_str!("../../../migrations/postgres/0006_seal_events.sql"),
    ),
    (
        7,
        "0007_open_hash",
        include_str!("../../../migrations/postgres/0007_open_hash.sql"),
    ),
];

/// The PostgreSQL schema this binary knows (the equivalent of SQLite schema 12, with the
/// attempts table's fillfactor and the seal's `batch_events_now`).
pub const PG_SCHEMA_VERSION: i64 = 7;

/// One server session: its process id and its start (Unix seconds), which together name it
/// (a process id alone may be another session's after that one ended).
#[derive(Debug, Clone, PartialEq)]
pub struct ServerSession {
    pub pid: i32,
    pub started: f64,
}

/// The advisory lock key every dispatcher and `hookspool migrate` take on a PostgreSQL spool
/// (`pg_try_advisory_lock`): the bytes of "hookspoo" as a big-endian integer, so a DBA who
/// lists pg_locks can tell whose it is.
pub const PG_DISPATCH_LOCK_KEY: i64 = i64::from_be_bytes(*b"hookspoo");

/// The transaction-level advisory lock every write transaction of the store takes on
/// PostgreSQL (`BEGIN IMMEDIATE` becomes `BEGIN` and `pg_advisory_xact_lock` of this key):
/// the dispatcher's ticks, marks and retention, the CLI's and the admin API's operations
/// take turns as SQLite's single writer makes them, so each reads the rows it decides on
/// unchanged until it commits. The intake's enqueue (`pg::enqueue`) does not take it:
/// intakes write concurrently, and the rows they share with the others are locked row by
/// row (the open batch a request joins, which a seal locks too). "hookspow" as bytes.
pub const PG_WRITE_LOCK_KEY: i64 = i64::from_be_bytes(*b"hookspow");

impl PgStore {
    /// `meta.schema_version` (0 for a database with no schema yet).
    pub fn schema_version(&mut self) -> Result<i64> {
        let has_meta: bool = self
            .client
            .query_one("SELECT to_regclass('meta') IS NOT NULL", &[])
            .map_err(|e| self.err(&e))?
            .get(0);
        if !has_meta {
            return Ok(0);
        }
        match self.meta("schema_version")? {
            None => Ok(0),
            Some(v) => v
                .parse()
                .map_err(|_| StoreError::Corrupt(format!("meta.schema_version is {v:?}"))),
        }
    }

    /// The migrations that would run, as (version, name).
    pub fn pending_migrations(&mut self) -> Result<Vec<(i64, &'static str)>> {
        let current = self.schema_version()?;
        Ok(PG_MIGRATIONS
            .iter()
            .filter(|(v, _, _)| *v > current)
            .map(|(v, n, _)| (*v, *n))
            .collect())
    }

    /// Take the spool's advisory lock for this session, without waiting: false when another
    /// session (a dispatcher, a migrate, a copy) holds it. It lasts as long as the
    /// connection, as dispatch.lock lasts as long as its file is open.
    pub fn try_dispatch_lock(&mut self) -> Result<bool> {
        Ok(self.try_dispatch_lock_as()?.is_some())
    }

    /// `try_dispatch_lock`, with this session's server process when it got the lock (what
    /// `end_own_lock_holder` is given after the session was lost).
    pub fn try_dispatch_lock_as(&mut self) -> Result<Option<ServerSession>> {
        let row = self
            .client
            .query_one(
                "WITH l AS (SELECT pg_try_advisory_lock($1) AS got)
                 SELECT got, pg_backend_pid(),
                        CASE WHEN got THEN (SELECT extract(epoch FROM backend_start)::float8
                                            FROM pg_stat_activity
                                            WHERE pid = pg_backend_pid()) END
                 FROM l",
                &[&PG_DISPATCH_LOCK_KEY],
            )
            .map_err(|e| self.err(&e))?;
        // A standby asks twice a second: pg_stat_activity is read only when the lock is won.
        Ok(row.get::<_, bool>(0).then(|| ServerSession {
            pid: row.get(1),
            started: row.get::<_, Option<f64>>(2).unwrap_or_default(),
        }))
    }

    /// End the server session `s` if it still holds the spool's dispatcher lock and is a
    /// session of this process (the same `application_name`, which names this host and
    /// process): this dispatcher's own earlier session, lost on its side (a cut link timed
    /// out here) while the server, which has not noticed, keeps it and the lock. Until the
    /// server's own timeouts end it, no dispatcher could take the lock. The process id and
    /// start time name one server session (a process id alone may be another's after a
    /// restart). Returns whether it was ended; the lock is free once that process exits.
    pub fn end_own_lock_holder(&mut self, s: &ServerSession) -> Result<bool> {
        let ended = self
            .client
            .query_opt(
                "SELECT pg_terminate_backend(a.pid)
                 FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid
                 WHERE a.pid = $1 AND a.pid <> pg_backend_pid()
                   AND extract(epoch FROM a.backend_start)::float8 = $3
                   AND a.application_name = current_setting('application_name')
                   AND a.datname = current_database()
                   AND l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
                   AND l.database = (SELECT oid FROM pg_database
                                     WHERE datname = current_database())
                   AND ((l.classid::bigint << 32) | l.objid::bigint) = $2",
                &[&s.pid, &PG_DISPATCH_LOCK_KEY, &s.started],
            )
            .map_err(|e| self.err(&e))?
            .is_some_and(|r| r.get::<_, bool>(0));
        Ok(ended)
    }

    /// The session lock or `StoreError::Locked` naming what holds it.
    pub fn dispatch_lock(&mut self) -> Result<()> {
        if self.try_dispatch_lock()? {
            Ok(())
        } else {
            Err(StoreError::Locked(format!(
                "PostgreSQL advisory lock {PG_DISPATCH_LOCK_KEY} on {} (a dispatcher, a migrate or a spool copy holds it)",
                self.target()
            )))
        }
    }

    /// Apply pending migrations (or only list them with `dry_run`); returns what ran. A
    /// newer schema is refused and changes nothing.
    pub fn migrate(&mut self, dry_run: bool) -> Result<Vec<(i64, &'static str)>> {
        let current = self.schema_version()?;
        if current > PG_SCHEMA_VERSION {
            return Err(StoreError::SchemaTooNew {
                found: current,
                known: PG_SCHEMA_VERSION,
            });
        }
        let pending = self.pending_migrations()?;
        if dry_run {
            return Ok(pending);
        }
        for (version, _, sql) in PG_MIGRATIONS.iter().filter(|(v, _, _)| *v > current) {
            self.apply_one(*version, sql)?;
        }
        Ok(pending)
    }

    fn apply_one(&mut self, version: i64, sql: &str) -> Result<()> {
        let target = self.target().to_string();
        let err = |e: tokio_postgres::Error| super::pg_error(&target, &e);
        let mut tx = self.client.transaction();
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&PG_DISPATCH_LOCK_KEY])
            .map_err(err)?;
        let has_meta: bool = tx
            .query_one("SELECT to_regclass('meta') IS NOT NULL", &[])
            .map_err(err)?
            .get(0);
        if has_meta {
            let v: Option<String> = tx
                .query_opt("SELECT value FROM meta WHERE key = 'schema_version'", &[])
                .map_err(err)?
                .and_then(|r| r.get(0));
            if v.and_then(|v| v.parse::<i64>().ok()).unwrap_or(0) >= version {
                // Another migrator applied it while this one waited for the lock.
                return Ok(());
            }
        }
        tx.batch_execute(sql).map_err(err)?;
        tx.execute(
            "INSERT INTO meta (key, value) VALUES ('schema_version', $1)
             ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            &[&version.to_string()],
        )
        .map_err(err)?;
        let id: [u8; 8] = rand::random();
        tx.execute(
            "INSERT INTO meta (key, value) VALUES ('instance_id', $1) ON CONFLICT (key) DO NOTHING",
            &[&hex::encode(id)],
        )
        .map_err(err)?;
        tx.commit().map_err(err)?;
        Ok(())
    }
}
