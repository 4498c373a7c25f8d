//! Forward-only schema migrations (spec 17). Each numbered file in `migrations/` runs in
//! one `BEGIN IMMEDIATE` transaction that also records the new version in
//! `meta.schema_version` and `PRAGMA user_version`. A migration that rebuilds a table turns
//! foreign keys off before BEGIN and runs `PRAGMA foreign_key_check` before COMMIT.
//! Callers that may migrate hold dispatch.lock (the dispatcher and `hookspool migrate`).

use rusqlite::OptionalExtension;

use super::{Result, Store, StoreError, set_meta_tx};

/// (version, name, SQL). Embedded so the binary carries its own schema.
pub const MIGRATIONS: &[(i64, &str, &str)] = &[
    (1, "0001_v2", include_str!("../../migrations/0001_v2.sql")),
    (
        2,
        "0002_unwrap",
        include_str!("../../migrations/0002_unwrap.sql"),
    ),
    (
        3,
        "0003_polls",
        include_str!("../../migrations/0003_polls.sql"),
    ),
    (
        4,
        "0004_heads",
        include_str!("../../migrations/0004_heads.sql"),
    ),
    (
        5,
        "0005_transitions",
        include_str!("../../migrations/0005_transitions.sql"),
    ),
    (
        6,
        "0006_raw_is_payload",
        include_str!("../../migrations/0006_raw_is_payload.sql"),
    ),
    (
        7,
        "0007_checks_without_lists",
        include_str!("../../migrations/0007_checks_without_lists.sql"),
    ),
    (
        8,
        "0008_finished",
        include_str!("../../migrations/0008_finished.sql"),
    ),
    (
        9,
        "0009_one_open_batch",
        include_str!("../../migrations/0009_one_open_batch.sql"),
    ),
    (
        10,
        "0010_list_indexes",
        include_str!("../../migrations/0010_list_indexes.sql"),
    ),
    (
        11,
        "0011_rejections",
        include_str!("../../migrations/0011_rejections.sql"),
    ),
    (
        12,
        "0012_open_hash",
        include_str!("../../migrations/0012_open_hash.sql"),
    ),
];

/// The schema this binary knows.
pub const SCHEMA_VERSION: i64 = 12;

/// Migrations whose SQL rebuilds a table and so must run with foreign keys off.
fn rebuilds_table(sql: &str) -> bool {
    sql.contains("-- rebuilds-table")
}

/// `meta.schema_version` as the transaction on `conn` sees it (0 before the first
/// migration).
fn version_tx(conn: &super::db::Connection) -> Result<i64> {
    let has_meta = conn
        .query_row(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'",
            (),
            |_| Ok(()),
        )
        .optional()?
        .is_some();
    if !has_meta {
        return Ok(0);
    }
    let v: Option<String> = conn
        .query_row(
            "SELECT value FROM meta WHERE key = 'schema_version'",
            (),
            |r| r.get(0),
        )
        .optional()?;
    Ok(v.and_then(|s| s.parse().ok()).unwrap_or(0))
}

impl Store {
    /// The schema version: `meta.schema_version`, or 0 for a database with no schema yet.
    /// A mismatch with `PRAGMA user_version` means someone edited the file by hand. On
    /// SQLite its reads share one snapshot (a read transaction, unless one is open): read
    /// one by one, a migration another process committed between them (the dispatcher's at
    /// its start) looked like that mismatch, and the reader stopped on a spool called
    /// corrupt.
    pub fn schema_version(&self) -> Result<i64> {
        if let super::db::Connection::Pg(pg) = &self.conn {
            return pg.borrow_mut().with(|pg| pg.schema_version());
        }
        if !self.conn.is_autocommit() {
            return self.schema_version_lite();
        }
        self.conn.execute_batch("BEGIN DEFERRED")?;
        let v = self.schema_version_lite();
        // A read transaction has nothing to keep.
        if self.conn.execute_batch("COMMIT").is_err() {
            let _ = self.conn.execute_batch("ROLLBACK");
        }
        v
    }

    /// `schema_version`'s reads on SQLite.
    fn schema_version_lite(&self) -> Result<i64> {
        let has_meta: bool = self
            .conn
            .query_row(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'",
                (),
                |_| Ok(true),
            )
            .optional()?
            .unwrap_or(false);
        if !has_meta {
            return Ok(0);
        }
        let v: Option<String> = self
            .conn
            .query_row(
                "SELECT value FROM meta WHERE key = 'schema_version'",
                (),
                |r| r.get(0),
            )
            .optional()?;
        let version = match v {
            Some(s) => s
                .parse::<i64>()
                .map_err(|_| StoreError::Corrupt(format!("meta.schema_version is {s:?}")))?,
            None => 0,
        };
        let user_version: i64 = self
            .conn
            .query_row("PRAGMA user_version", (), |r| r.get(0))?;
        if user_version != version {
            return Err(StoreError::Corrupt(format!(
                "meta.schema_version {version} disagrees with PRAGMA user_version {user_version}"
            )));
        }
        Ok(version)
    }

    /// The migrations that would run, as (version, name).
    pub fn pending_migrations(&self) -> Result<Vec<(i64, &'static str)>> {
        if let super::db::Connection::Pg(pg) = &self.conn {
            return pg.borrow_mut().with(|pg| pg.pending_migrations());
        }
        let current = self.schema_version()?;
        Ok(MIGRATIONS
            .iter()
            .filter(|(v, _, _)| *v > current)
            .map(|(v, n, _)| (*v, *n))
            .collect())
    }

    /// Apply pending migrations (or only list them with `dry_run`). Returns what ran.
    pub fn migrate(&mut self, dry_run: bool) -> Result<Vec<(i64, &'static str)>> {
        if let super::db::Connection::Pg(pg) = &self.conn {
            // migrations/postgres/, under the advisory lock.
            return pg.borrow_mut().with(|pg| pg.migrate(dry_run));
        }
        let current = self.schema_version()?;
        if current > SCHEMA_VERSION {
            return Err(StoreError::SchemaTooNew {
                found: current,
                known: SCHEMA_VERSION,
            });
        }
        let pending = self.pending_migrations()?;
        if dry_run {
            return Ok(pending);
        }
        self.migrate_to(SCHEMA_VERSION)?;
        Ok(pending)
    }

    /// Apply migrations up to and including `target` only: `migrate` applies them all this
    /// way, and tests of upgrades from every released schema build an old database with it.
    pub fn migrate_to(&mut self, target: i64) -> Result<()> {
        let current = self.schema_version()?;
        for (version, _name, sql) in MIGRATIONS
            .iter()
            .filter(|(v, _, _)| *v > current && *v <= target)
        {
            self.apply_one(*version, sql)?;
        }
        if current == 0 {
            self.mint_instance_id()?;
        }
        Ok(())
    }

    fn apply_one(&mut self, version: i64, sql: &str) -> Result<()> {
        let rebuild = rebuilds_table(sql);
        if rebuild {
            self.conn.execute_batch("PRAGMA foreign_keys=OFF")?;
        }
        let result = (|| -> Result<()> {
            let tx = self.begin()?;
            // Two first connections to a new spool (the intake and the dispatcher halves of
            // `hookspool run` start together) both see schema 0; the one that waited for the
            // write lock finds the migration applied and leaves it.
            if version_tx(&tx)? >= version {
                return Ok(());
            }
            if version == 9 {
                seal_extra_open_tx(&tx)?;
            }
            tx.execute_batch(sql)?;
            if rebuild {
                let bad: Option<String> = tx
                    .query_row("PRAGMA foreign_key_check", (), |r| r.get(0))
                    .optional()?;
                if let Some(table) = bad {
                    return Err(StoreError::Corrupt(format!(
                        "migration {version} left a foreign key violation in {table}"
                    )));
                }
            }
            set_meta_tx(&tx, "schema_version", &version.to_string())?;
            tx.lite()
                .ok_or_else(|| StoreError::Corrupt("a SQLite migration on PostgreSQL".into()))?
                .pragma_update(None, "user_version", version)?;
            tx.commit()?;
            Ok(())
        })();
        if rebuild {
            self.conn.execute_batch("PRAGMA foreign_keys=ON")?;
        }
        result
    }

    fn mint_instance_id(&mut self) -> Result<()> {
        if self.meta("instance_id")?.is_some() {
            return Ok(());
        }
        let id: [u8; 8] = rand::random();
        let tx = self.begin()?;
        tx.execute(
            "INSERT OR IGNORE INTO meta (key, value) VALUES ('instance_id', ?1)",
            [hex::encode(id)],
        )?;
        tx.commit()?;
        Ok(())
    }
}

/// Before schema 9's unique index: seal every open batch of a group but the newest, as of
/// its last event, so a spool that ever broke the join rule migrates instead of failing
/// (the sealed ones keep their place: FIFO is by the first event). Returns how many.
fn seal_extra_open_tx(conn: &super::db::Connection) -> Result<usize> {
    let extra: Vec<(i64, f64)> = {
        let mut stmt = conn.prepare(
            "SELECT b.id, b.last_at FROM batches b WHERE b.state = 'open'
               AND b.id < (SELECT max(o.id) FROM batches o
                           WHERE o.state = 'open' AND o.route = b.route AND o.key = b.key)
             ORDER BY b.id",
        )?;
        stmt.query_map((), |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<_>>()?
    };
    for (id, last_at) in &extra {
        super::delivery::seal_tx(conn, *id, *last_at)?;
    }
    Ok(extra.len())
}

#[cfg(test)]
mod tests {
    use super::super::{Role, Store, StoreError};
    use super::*;
    use rusqlite::params;
    use std::time::Duration;

    fn open(path: &std::path::Path, role: Role) -> Result<Store> {
        Store::open(path, role, Duration::from_secs(5))
    }

    /// A connection with no pragmas and no migration: a database an older build left.
    fn bare(path: &std::path::Path) -> Store {
        Store {
            conn: crate::store::db::Connection::Lite(rusqlite::Connection::open(path).unwrap()),
            path: path.to_path_buf(),
            heads_by_group_first: std::cell::Cell::new(false),
            actor: None,
        }
    }

    /// A new WAL database at `path`, migrated by hand to `version` (an older spool).
    fn bare_at(path: &std::path::Path, version: i64) -> Store {
        let conn = rusqlite::Connection::open(path).unwrap();
        conn.execute_batch("PRAGMA journal_mode=WAL").unwrap();
        drop(conn);
        let mut store = bare(path);
        store.migrate_to(version).unwrap();
        store
    }

    #[test]
    fn a_migration_applied_by_another_first_connection_meanwhile_is_left_alone() {
        // Both connections saw schema 0 (the race of `run`'s two halves on a new spool);
        // the one that gets the write lock second must not run the migration again.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let mut late = Store::open_unmigrated(&path, Duration::from_secs(5)).unwrap();
        assert_eq!(late.schema_version().unwrap(), 0);
        let first = open(&path, Role::Migrator).unwrap();
        let id = first.instance_id().unwrap();
        for (version, _, sql) in MIGRATIONS {
            late.apply_one(*version, sql).unwrap();
        }
        assert_eq!(late.schema_version().unwrap(), SCHEMA_VERSION);
        assert_eq!(late.instance_id().unwrap(), id);
    }

    #[test]
    fn new_database_gets_the_whole_schema_and_an_instance_id() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(&dir.path().join("s.db"), Role::Reader).unwrap();
        assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
        let uv: i64 = store
            .conn
            .query_row("PRAGMA user_version", (), |r| r.get(0))
            .unwrap();
        assert_eq!(uv, SCHEMA_VERSION);
        assert_eq!(store.instance_id().unwrap().len(), 16);
        for table in [
            "meta",
            "events",
            "dedup",
            "batches",
            "attempts",
            "destinations",
            "issues",
            "alerts",
            "polls",
            "rejections",
        ] {
            let n: i64 = store
                .conn
                .query_row(
                    "SELECT count(*) FROM sqlite_master WHERE type='table' AND name=?1",
                    [table],
                    |r| r.get(0),
                )
                .unwrap();
            assert_eq!(n, 1, "table {table}");
        }
    }

    #[test]
    fn every_released_schema_migrates_forward_keeping_data() {
        for start in 1..SCHEMA_VERSION {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("s.db");
            {
                // Build a database at `start` by hand, with a row in it.
                let store = bare_at(&path, start);
                store
                    .conn
                    .execute(
                        "INSERT INTO attempts (batch_id, n, destination, started_at) VALUES (1, 1, 'd', 1.0)",
                        (),
                    )
                    .unwrap();
                assert_eq!(store.schema_version().unwrap(), start);
            }
            // A reader refuses it and says to migrate.
            let err = open(&path, Role::Reader).unwrap_err();
            assert!(
                matches!(err, StoreError::SchemaTooOld { found, known } if found == start && known == SCHEMA_VERSION),
                "{err}"
            );
            assert!(err.to_string().contains("hookspool migrate"));
            // Dry run lists, then a migrator applies.
            let mut store = bare(&path);
            let pending = store.migrate(true).unwrap();
            assert_eq!(pending.len() as i64, SCHEMA_VERSION - start);
            assert_eq!(store.schema_version().unwrap(), start);
            drop(store);
            let store = open(&path, Role::Migrator).unwrap();
            assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
            let n: i64 = store
                .conn
                .query_row("SELECT count(*) FROM attempts", (), |r| r.get(0))
                .unwrap();
            assert_eq!(n, 1, "data kept across the migration from {start}");
            store
                .conn
                .execute("UPDATE attempts SET events_delivered = 3", ())
                .unwrap();
        }
    }

    /// Schema 4 gives every batch its first_event_id from the events it holds, so a spool
    /// written before it keeps its per-key order: here the batch stamped first holds the
    /// later event, and the other one stays the head after the migration.
    #[test]
    fn heads_migration_keeps_the_head_of_each_group_of_an_older_spool() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        {
            let store = bare_at(&path, 3);
            store
                .conn
                .execute_batch(
                    "INSERT INTO batches (id, route, source, destination, key, state, first_at,
                         last_at, quiet_s, max_s, max_events, max_bytes, count, bytes, sealed_at)
                     VALUES (1, 'r', 's', 'd', 'k', 'sealed', 20.0, 20.0, 0, 0, 1, 100, 1, 2, 21.0),
                            (2, 'r', 's', 'd', 'k', 'sealed', 10.0, 10.0, 0, 0, 1, 100, 1, 2, 21.0);
                     INSERT INTO events (id, source, route, batch_id, event_type, received_at,
                         payload, headers, size)
                     VALUES (7, 's', 'r', 1, 't', 20.0, '{}', '{}', 2),
                            (8, 's', 'r', 2, 't', 10.0, '{}', '{}', 2);",
                )
                .unwrap();
        }
        let store = open(&path, Role::Migrator).unwrap();
        let first: Vec<(i64, Option<i64>)> = pairs(
            &store.conn,
            "SELECT id, first_event_id FROM batches ORDER BY id",
        );
        assert_eq!(first, vec![(1, Some(7)), (2, Some(8))]);
        for limit in [1, 100] {
            let heads: Vec<i64> = store
                .candidates(30.0, limit)
                .unwrap()
                .iter()
                .map(|c| c.batch_id)
                .collect();
            assert_eq!(heads, vec![1], "limit {limit}");
        }
    }

    /// The writes an event's join, a seal, a claim and a mark make, as the store writes
    /// them, and a breaker's and an issue's: in the words schema 6 compiles (the store's
    /// INSERT and terminal marks also write schema 8's `finished`).
    fn hot_writes() -> Vec<&'static str> {
        vec![
            "INSERT INTO batches (route, source, destination, key, state, first_at, last_at,
                                  quiet_s, max_s, max_events, max_bytes, count, bytes)
             VALUES (?1, ?2, ?3, ?4, 'open', ?5, ?5, ?6, ?7, ?8, ?9, 0, 0)",
            "UPDATE batches SET last_at = max(last_at, ?2), count = count + 1, bytes = bytes + ?3,
                    first_event_id = coalesce(first_event_id, ?4)
             WHERE id = ?1 AND state = 'open'",
            "UPDATE batches SET state = 'sealed', sealed_at = ?2, content_hash = ?3
             WHERE id = ?1 AND state = 'open'",
            "UPDATE batches SET state = 'leased', lease_until = ?2, lease_owner = ?3
             WHERE id = ?1 AND state IN ('sealed', 'retry')",
            "UPDATE batches SET state = ?3, delivered_at = ?4, result = ?5,
                    attempts = attempts + ?6, last_class = NULL, last_error = NULL,
                    lease_until = NULL, lease_owner = NULL
             WHERE id = ?1 AND state = 'leased' AND lease_owner = ?2",
            "INSERT INTO attempts (batch_id, n, destination, started_at, probe, counted)
             VALUES (?1, ?2, ?3, ?4, ?5, 0)",
            "UPDATE attempts SET finished_at = ?2, outcome = ?3, klass = ?4, status = ?5
             WHERE id = ?1",
            "INSERT INTO destinations (name, state) VALUES (?1, ?2)
             ON CONFLICT(name) DO UPDATE SET state = excluded.state",
            "UPDATE issues SET state = ?2 WHERE id = ?1",
        ]
    }

    /// How many ephemeral tables (`OpenEphemeral`) the statement's program builds.
    fn ephemeral_tables(conn: &rusqlite::Connection, sql: &str) -> usize {
        let mut stmt = conn.prepare(&format!("EXPLAIN {sql}")).unwrap();
        // EXPLAIN runs nothing, so the statement's parameters stay unbound.
        let mut rows = stmt.raw_query();
        let mut n = 0;
        while let Some(r) = rows.next().unwrap() {
            n += usize::from(r.get::<_, String>(1).unwrap() == "OpenEphemeral");
        }
        n
    }

    /// Schema 7 writes the state sets of the CHECK constraints and of `batches_heads` as
    /// comparisons: SQLite built an ephemeral b-tree of an `IN` list of more than two
    /// constants on every write that evaluated it. The hot writes now build none, on
    /// the migrating connection and on one that had loaded schema 6 (another process),
    /// and every set still takes its own words and refuses anything else.
    #[test]
    fn schema_7_checks_sets_by_comparison_and_refuses_what_schema_6_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        drop(bare_at(&path, 6));
        let other = rusqlite::Connection::open(&path).unwrap();
        let built_before: usize = hot_writes()
            .iter()
            .map(|sql| ephemeral_tables(&other, sql))
            .sum();
        assert!(built_before >= 8, "schema 6 builds lists ({built_before})");
        let store = open(&path, Role::Migrator).unwrap();
        assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
        // EXPLAIN compiles against the schema the connection holds; the other connection
        // reads the changed cookie (and reloads) when it next reads, as a process's next
        // statement does.
        let _: i64 = other
            .query_row("SELECT count(*) FROM batches", (), |r| r.get(0))
            .unwrap();
        for (who, conn) in [("migrator", store.conn.lite().unwrap()), ("other", &other)] {
            // The head queries name `batches_heads` by its new WHERE (schema 6 had no such
            // index: they could not be planned there).
            let heads = [
                super::super::delivery::HEAD_NEXT_KEY_SQL,
                super::super::delivery::HEAD_NEXT_ROUTE_SQL,
                super::super::delivery::CANDIDATES_SQL,
            ];
            for sql in hot_writes().into_iter().chain(heads) {
                assert_eq!(ephemeral_tables(conn, sql), 0, "{who}: {sql}");
            }
        }
        let refused = |sql: &str, args: &[&dyn rusqlite::ToSql]| {
            let err = other.execute(sql, args).unwrap_err().to_string();
            assert!(err.contains("CHECK constraint failed"), "{sql}: {err}");
        };
        // (`finished` is schema 8's, held to the state by its own CHECK.)
        let batch = "INSERT INTO batches (route, source, destination, key, state, finished,
                         first_at, last_at, quiet_s, max_s, max_events, max_bytes)
                     VALUES ('r', 's', 'd', 'k', ?1, ?2, 1, 1, 0, 0, 1, 1)";
        for s in crate::vocab::BatchState::ALL {
            other
                .execute(batch, params![s.as_str(), finished(s)])
                .unwrap();
        }
        refused(batch, &[&"Open", &0]);
        refused(batch, &[&"gone", &1]);
        let attempt = "INSERT INTO attempts (batch_id, n, destination, started_at, outcome)
                       VALUES (1, 1, 'd', 1, ?1)";
        for o in crate::vocab::AttemptOutcome::ALL {
            other.execute(attempt, [o.as_str()]).unwrap();
        }
        other.execute(attempt, [None::<String>]).unwrap();
        refused(attempt, &[&"okay"]);
        let destination = "INSERT INTO destinations (name, state) VALUES (?1, ?2)";
        for s in crate::vocab::BreakerState::ALL {
            other
                .execute(
                    destination,
                    [format!("d-{}", s.as_str()), s.as_str().into()],
                )
                .unwrap();
        }
        refused(destination, &[&"d-x", &"half-open"]);
        let issue = "INSERT INTO issues (fingerprint, kind, state, first_at, last_at)
                     VALUES (?1, ?2, ?3, 1, 1)";
        let mut n = 0;
        for kind in super::super::issues::ISSUE_KINDS {
            for state in ["open", "acked", "resolved", "ignored"] {
                n += 1;
                other
                    .execute(issue, [format!("f{n}"), kind.into(), state.into()])
                    .unwrap();
            }
        }
        refused(issue, &[&"f-kind", &"alert", &"open"]);
        refused(issue, &[&"f-state", &"spool", &"closed"]);
        // The heads index holds exactly the unfinished batches and the head query uses it.
        let in_index: i64 = other
            .query_row(
                "SELECT count(*) FROM batches INDEXED BY batches_heads
                 WHERE finished = 0 AND route = 'r' AND key = 'k'",
                (),
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(in_index, 4);
        let ok: String = other
            .query_row("PRAGMA integrity_check", (), |r| r.get(0))
            .unwrap();
        assert_eq!(ok, "ok");
    }

    /// The rows of a two-column query.
    fn pairs<A: rusqlite::types::FromSql, B: rusqlite::types::FromSql>(
        conn: &crate::store::db::Connection,
        sql: &str,
    ) -> Vec<(A, B)> {
        conn.prepare(sql)
            .unwrap()
            .query_map((), |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap()
    }

    /// Schema 8's `finished` for a batch in state `s`.
    fn finished(s: &crate::vocab::BatchState) -> i64 {
        use crate::vocab::BatchState as B;
        match s {
            B::Delivered | B::Dead | B::Dropped => 1,
            B::Open | B::Sealed | B::Leased | B::Retry => 0,
        }
    }

    /// Whether the statement's program opens the b-tree rooted at page `root` for writing.
    fn writes_btree(conn: &rusqlite::Connection, sql: &str, root: i64) -> bool {
        let mut stmt = conn.prepare(&format!("EXPLAIN {sql}")).unwrap();
        let mut rows = stmt.raw_query();
        while let Some(r) = rows.next().unwrap() {
            if r.get::<_, String>(1).unwrap() == "OpenWrite" && r.get::<_, i64>(3).unwrap() == root
            {
                return true;
            }
        }
        false
    }

    fn heads_root(conn: &rusqlite::Connection) -> i64 {
        conn.query_row(
            "SELECT rootpage FROM sqlite_schema WHERE name = 'batches_heads'",
            (),
            |r| r.get(0),
        )
        .unwrap()
    }

    /// Schema 8 keys `batches_heads` on `finished` instead of the state. A spool of schema 7
    /// with a batch in every state comes out with `finished` set on the delivered, dead and
    /// dropped ones only, the index holding the other four, and a CHECK refusing a flag that
    /// disagrees with the state. A claim (sealed -> leased) no longer writes the index, which
    /// it did at schema 7; a mark that finishes the batch still does (it leaves the index).
    #[test]
    fn schema_8_flags_finished_batches_and_a_claim_leaves_the_heads_index_alone() {
        use crate::vocab::BatchState;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let claim = "UPDATE batches SET state = 'leased', lease_until = ?2, lease_owner = ?3
                     WHERE id = ?1 AND state IN ('sealed', 'retry')";
        {
            let store = bare_at(&path, 7);
            let root = heads_root(store.conn.lite().unwrap());
            assert!(
                writes_btree(store.conn.lite().unwrap(), claim, root),
                "schema 7: a claim rewrites its heads entry"
            );
            for (i, s) in BatchState::ALL.iter().enumerate() {
                store
                    .conn
                    .execute(
                        "INSERT INTO batches (route, source, destination, key, state, first_at,
                             last_at, quiet_s, max_s, max_events, max_bytes, first_event_id)
                         VALUES ('r', 's', 'd', 'k', ?1, 1, 1, 0, 0, 1, 1, ?2)",
                        params![s.as_str(), i as i64 + 1],
                    )
                    .unwrap();
            }
        }
        let store = open(&path, Role::Migrator).unwrap();
        assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
        let flags: Vec<(String, i64)> = pairs(
            &store.conn,
            "SELECT state, finished FROM batches ORDER BY id",
        );
        let want: Vec<(String, i64)> = BatchState::ALL
            .iter()
            .map(|s| (s.as_str().to_string(), finished(s)))
            .collect();
        assert_eq!(flags, want);
        let in_index: Vec<String> = store
            .conn
            .prepare(
                "SELECT state FROM batches INDEXED BY batches_heads
                 WHERE finished = 0 AND route = 'r' AND key = 'k' ORDER BY first_event_id",
            )
            .unwrap()
            .query_map((), |r| r.get(0))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        let unfinished: Vec<String> = BatchState::ALL
            .iter()
            .filter(|s| finished(s) == 0)
            .map(|s| s.as_str().to_string())
            .collect();
        assert_eq!(in_index, unfinished);
        let root = heads_root(store.conn.lite().unwrap());
        assert!(
            !writes_btree(store.conn.lite().unwrap(), claim, root),
            "schema 8: a claim"
        );
        let mark = "UPDATE batches SET state = 'delivered', finished = 1, delivered_at = ?2
                    WHERE id = ?1 AND state = 'leased'";
        assert!(
            writes_btree(store.conn.lite().unwrap(), mark, root),
            "schema 8: a mark"
        );
        let refused = |sql: &str| {
            let err = store.conn.execute(sql, ()).unwrap_err().to_string();
            assert!(err.contains("CHECK constraint failed"), "{sql}: {err}");
        };
        refused("UPDATE batches SET state = 'delivered' WHERE state = 'leased'");
        refused("UPDATE batches SET state = 'retry' WHERE state = 'dead'");
        refused(
            "INSERT INTO batches (route, source, destination, key, state, first_at, last_at,
                 quiet_s, max_s, max_events, max_bytes)
             VALUES ('r', 's', 'd', 'k2', 'open', 1, 1, 0, 0, 1, 1)",
        );
        let ok: String = store
            .conn
            .query_row("PRAGMA integrity_check", (), |r| r.get(0))
            .unwrap();
        assert_eq!(ok, "ok");
    }

    /// Schema 9 states the join rule: a second open batch in a group is refused by the
    /// index, and a schema-8 spool that broke the rule migrates with its older open batches
    /// sealed (content hash set, FIFO kept) instead of failing.
    #[test]
    fn schema_9_one_open_batch_per_group_is_an_index_and_old_breaches_are_sealed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        {
            let store = bare_at(&path, 8);
            for (key, first_event_id, last_at) in [
                ("k", 1, 5.0),
                ("k", 2, 6.0),
                ("k", 3, 7.0),
                ("other", 4, 8.0),
            ] {
                store
                    .conn
                    .execute(
                        "INSERT INTO batches (route, source, destination, key, state, first_at,
                             last_at, quiet_s, max_s, max_events, max_bytes, first_event_id,
                             finished)
                         VALUES ('r', 's', 'd', ?1, 'open', 1, ?3, 0, 0, 10, 1000, ?2, 0)",
                        params![key, first_event_id, last_at],
                    )
                    .unwrap();
            }
        }
        let store = open(&path, Role::Migrator).unwrap();
        assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
        let rows: Vec<(String, f64)> = pairs(
            &store.conn,
            "SELECT state, coalesce(sealed_at, -1) FROM batches ORDER BY id",
        );
        assert_eq!(
            rows,
            vec![
                ("sealed".to_string(), 5.0),
                ("sealed".to_string(), 6.0),
                ("open".to_string(), -1.0),
                ("open".to_string(), -1.0),
            ]
        );
        let unhashed: i64 = store
            .conn
            .query_row(
                "SELECT count(*) FROM batches WHERE state = 'sealed' AND content_hash IS NULL",
                (),
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(unhashed, 0);
        let err = store
            .conn
            .execute(
                "INSERT INTO batches (route, source, destination, key, state, first_at, last_at,
                     quiet_s, max_s, max_events, max_bytes, finished)
                 VALUES ('r', 's', 'd', 'k', 'open', 1, 1, 0, 0, 1, 1, 0)",
                (),
            )
            .unwrap_err()
            .to_string();
        assert!(err.contains("UNIQUE constraint failed"), "{err}");
        // Another key, or the same key once its batch is sealed, opens freely.
        store
            .conn
            .execute(
                "INSERT INTO batches (route, source, destination, key, state, first_at, last_at,
                     quiet_s, max_s, max_events, max_bytes, finished)
                 VALUES ('r2', 's', 'd', 'k', 'open', 1, 1, 0, 0, 1, 1, 0)",
                (),
            )
            .unwrap();
    }

    #[test]
    fn newer_database_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let store = open(&path, Role::Migrator).unwrap();
        store
            .conn
            .execute_batch(
                "UPDATE meta SET value='99' WHERE key='schema_version'; PRAGMA user_version=99;",
            )
            .unwrap();
        drop(store);
        for role in [Role::Reader, Role::Migrator] {
            let err = open(&path, role).unwrap_err();
            assert!(
                matches!(err, StoreError::SchemaTooNew { found: 99, .. }),
                "{err}"
            );
        }
    }

    #[test]
    fn database_file_is_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        open(&path, Role::Migrator).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }
}
