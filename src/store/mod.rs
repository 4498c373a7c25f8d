//! The spool: the only module that owns rusqlite and the PostgreSQL client and speaks SQL
//! (invariant; a tidy test enforces it). The same `Store` runs on an SQLite file or a
//! PostgreSQL database (`Store::open_at`; `db` is the connection both speak through, `pg`
//! PostgreSQL's session, migrations and concurrent enqueue), and `copy` moves a spool
//! between the two. It holds the schema and its migrations, and every state transition of the
//! data model (spec 3-8) as one `BEGIN IMMEDIATE` transaction. It never reads the clock:
//! every transition takes `now` as an argument. It never logs bodies or secrets.
//!
//! Connection settings (spec 2): WAL, synchronous=FULL, foreign_keys=ON, a busy timeout set
//! by the caller (10 s intake, 30 s dispatcher and CLI) and waited out in short fixed sleeps
//! ([`BUSY_SLEEP_US`]), one connection per thread. The intake's writer alone moves the
//! WAL's sync out of COMMIT (`walsync`: synchronous=NORMAL plus its own fdatasync before
//! any answer).

mod browse;
mod cached;
mod content;
mod copy;
mod db;
mod delivery;
mod enqueue;
mod export;
mod issues;
mod marks;
mod migrate;
mod operator;
pub mod pg;
mod polls;
mod query;
mod rejections;
mod retention;
mod stats;
mod vocab;
mod walsync;

pub use browse::{
    BacklogSpan, FeedCursor, FeedItem, LATENCY_SAMPLE_MAX, LastError, backlog_series, percentile,
};
pub use content::{CanonicalEvent, UnreadablePayload, content_hash};
pub use copy::CopyReport;
pub use delivery::{
    CANDIDATE_WALK_PER_LIMIT, CANDIDATES_SQL, Candidate, CandidatePrefix, Claim, ClaimRequest,
    ClaimedMany, ClaimedReads, DeliveryId, DestinationRow, FastGate, FastTick, HEAD_NEXT_KEY_SQL,
    HEAD_NEXT_ROUTE_SQL, LEASED_SQL, REDUE_SQL, RecoveredLease, Redue, SEAL_READY_SQL,
    TICK_QUERIES,
};
pub use enqueue::{Copy, EnqueueOutcome, EnqueueRequest, Idempotent, Quarantine, Window};
pub use export::{EXPORT_PAGE_BATCHES_MAX, ExportFilter};
pub use issues::{AlertRate, ISSUE_KINDS, ISSUE_OPERATOR_STATES, IssueChange, IssueRow, NewIssue};
pub use marks::{
    AttemptReport, BAD_EMIT_STATUS, Decision, LEASE_EXPIRED, Mark, MarkResult, Recorded,
};
pub use migrate::{MIGRATIONS, SCHEMA_VERSION};
pub use operator::{SplitSpec, StoredRequest};
pub use polls::{Fired, PollClockRow, is_undelivered, tick_dedup_id};
pub use query::{
    AttemptRow, BatchFilter, BatchPage, BatchRow, EventRow, ScanBudget, TRACEPARENT_KEY,
    json_path_ok,
};
pub use rejections::{REJECTION_HOUR_S, RejectionCount, rejection_hour};
pub use retention::{
    PRUNE_BURST_MS, PRUNE_GAP_MS, PRUNE_ROWS_MAX, PrunePass, PruneReport, REJECTIONS_KEEP_S,
    Retention,
};
pub use stats::{AttemptCount, AttemptDuration, PollRow, SessionRow};
pub use walsync::WalSync;

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::config::DbConfig;
use rusqlite::{ErrorCode, OpenFlags};

use db::Connection;

/// Busy timeout for the dispatcher and the CLI (spec 2).
pub const DEFAULT_BUSY_TIMEOUT_S: u64 = 30;
/// Coalesce keys are opaque strings of at most this many bytes (spec 5).
pub const KEY_BYTES_MAX: usize = 512;
/// At most this many tee copies per event (spec 14.1).
pub const TEE_COPIES_MAX: usize = 8;
/// Prepared statements each connection keeps (rusqlite's cache, LRU; its default is 16).
/// Every hot statement of the intake's writer and of the dispatcher's tick goes through
/// `prepare_cached`, and together they number a few dozen: parsing and planning them again
/// for each event was the largest cost of the writer thread (issue 13's profile).
pub const STATEMENT_CACHE_STATEMENTS_MAX: usize = 128;

/// What went wrong in the store. Each variant is retryable, permanent, or a bug.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// SQLITE_BUSY past the busy timeout: retry later (the intake answers 503).
    #[error("database is busy")]
    Busy,
    /// SQLITE_FULL or ENOSPC: the spool cannot take the write (503).
    #[error("no space left for the spool")]
    Full,
    #[error(
        "database schema {found} is older than this hookspool ({known}); run `hookspool migrate`"
    )]
    SchemaTooOld { found: i64, known: i64 },
    #[error(
        "database schema {found} is newer than schema {known}, the newest this hookspool knows; a spool is never migrated backwards and nothing was changed: reinstall the newer hookspool (the one that wrote schema {found}), or restore the backup taken before the upgrade"
    )]
    SchemaTooNew { found: i64, known: i64 },
    #[error("{0} not found")]
    NotFound(String),
    /// An operator asked for a transition the batch's state does not allow. `takes` says
    /// which batches the operation takes, as the end of "`op` takes ...".
    #[error("batch {batch} is {state}: {op} takes {takes}")]
    WrongState {
        batch: i64,
        state: String,
        op: &'static str,
        takes: &'static str,
    },
    /// Input that the store refuses (bad key, bad JSON): permanent for this request.
    #[error("{0}")]
    Invalid(String),
    #[error("database integrity check failed: {0}")]
    Corrupt(String),
    #[error("{context}: {source}")]
    Io {
        context: String,
        source: std::io::Error,
    },
    #[error("sqlite: {0}")]
    Sqlite(rusqlite::Error),
    /// A PostgreSQL spool that cannot be reached now (refused, timed out, connection lost):
    /// weather, like `Busy`. Names the target as `user@host:port/db`, never the password.
    #[error("cannot reach PostgreSQL at {target}: {reason}")]
    PgUnreachable { target: String, reason: String },
    /// PostgreSQL refused (authentication, a missing database, a statement's error).
    #[error("PostgreSQL at {target}: {reason}")]
    Pg { target: String, reason: String },
    /// The spool's lock is held by another process (exit 3).
    #[error("the spool is locked: {0}")]
    Locked(String),
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> StoreError {
        // A PostgreSQL error, classified where it happened (`db`).
        let e = match e {
            rusqlite::Error::ToSqlConversionFailure(b) => match b.downcast::<StoreError>() {
                Ok(inner) => return *inner,
                Err(other) => rusqlite::Error::ToSqlConversionFailure(other),
            },
            e => e,
        };
        match e.sqlite_error_code() {
            Some(ErrorCode::DatabaseBusy) | Some(ErrorCode::DatabaseLocked) => StoreError::Busy,
            Some(ErrorCode::DiskFull) => StoreError::Full,
            Some(ErrorCode::SystemIoFailure) if is_enospc(&e) => StoreError::Full,
            _ => StoreError::Sqlite(e),
        }
    }
}

fn is_enospc(e: &rusqlite::Error) -> bool {
    // SQLite reports ENOSPC during a write as SQLITE_IOERR_WRITE / SQLITE_FULL; the extended
    // code is all we get, so treat an I/O error while the filesystem reports no space as full.
    // SQLITE_IOERR_SHMSIZE: the `-shm` cannot grow (or be created) on a full disk; the
    // same test as `StoreError::is_full`.
    if let rusqlite::Error::SqliteFailure(f, _) = e {
        return f.code == ErrorCode::DiskFull
            || f.extended_code == rusqlite::ffi::SQLITE_IOERR_SHMSIZE;
    }
    false
}

impl StoreError {
    /// Whether the same request may succeed later without anyone changing anything.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            StoreError::Busy | StoreError::Full | StoreError::PgUnreachable { .. }
        )
    }
}

pub type Result<T> = std::result::Result<T, StoreError>;

/// Who opens the store decides what it may do with an older schema (spec 17).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The intake and read-only CLI commands: an older schema is an error (exit 2).
    Reader,
    /// `hookspool migrate` and the dispatcher (under dispatch.lock): applies migrations.
    Migrator,
}

/// How long a connection sleeps between tries for a lock another connection holds (issue
/// 17). SQLite's default busy handler sleeps 1, 2, 5, 10 ... up to 100 ms per try, so a
/// writer that found the lock taken a few times slept 100 ms at a time while another
/// intake's writer committed group after group (two intakes on one spool: p99 10 ms ->
/// 0.8-1.5 s). A short fixed sleep keeps every waiter in the race; `busy_timeout` still
/// bounds the whole wait.
pub const BUSY_SLEEP_US: u64 = 1000;

/// Wait for a lock in [`BUSY_SLEEP_US`] steps, for at most `timeout` per episode (what
/// `busy_timeout` bounded before).
fn install_busy_handler(conn: &mut rusqlite::Connection, timeout: Duration) -> Result<()> {
    let mut started = std::time::Instant::now();
    conn.busy_handler(Some(move |tries: i32| {
        // SQLite calls with tries = 0 first for each busy episode.
        if tries == 0 {
            started = std::time::Instant::now();
        }
        if started.elapsed() >= timeout {
            return false;
        }
        std::thread::sleep(Duration::from_micros(BUSY_SLEEP_US));
        true
    }))?;
    Ok(())
}

/// One connection to the spool database.
pub struct Store {
    conn: Connection,
    path: PathBuf,
    /// Whether `candidates` steps group by group first: its last call found few groups
    /// behind a FIFO walk that held too few heads. A cost hint only; both ways give the
    /// same answer.
    heads_by_group_first: std::cell::Cell<bool>,
    /// Who acts through this connection (`Store::set_actor`), written as `by` into the
    /// audit row of every operator transition; None for the CLI, as before.
    actor: Option<String>,
}

/// Where a spool is: the SQLite file, or a PostgreSQL database by its libpq URL (which may
/// hold a password: `Debug` shows the backend only, never the URL).
#[derive(Clone, PartialEq, Eq)]
pub enum SpoolAt {
    File(PathBuf),
    Postgres(String),
}

impl std::fmt::Debug for SpoolAt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SpoolAt::File(p) => f.debug_tuple("File").field(p).finish(),
            SpoolAt::Postgres(_) => f.write_str("Postgres(..)"),
        }
    }
}

/// A read transaction opened by `Store::begin_reads`, to be ended with `Store::end_reads`.
#[must_use = "a read transaction must be ended with Store::end_reads"]
pub struct ReadScope(());

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("path", &self.path).finish()
    }
}

/// SQLite's process-wide settings, made once before the first connection of the process
/// (they can only be made before SQLite initialises). Memory statistics off: with them on,
/// every allocation and free SQLite makes takes one global mutex to count bytes that
/// nothing here reads (no `sqlite3_memory_used`, no soft heap limit); a tick thread and
/// the intake's writer allocate for every statement step. If something opened a
/// connection first, the setting is refused and SQLite keeps counting: slower, not wrong.
fn configure_sqlite() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: sqlite3_config is documented as callable before sqlite3_initialize and
        // returns SQLITE_MISUSE (changing nothing) afterwards; the Once keeps this thread the
        // only caller, and rusqlite initialises SQLite on the first open, which follows.
        let _ = unsafe {
            rusqlite::ffi::sqlite3_config(
                rusqlite::ffi::SQLITE_CONFIG_MEMSTATUS,
                0 as std::ffi::c_int,
            )
        };
    });
}

impl Store {
    /// Open (creating if needed) the database at `path` with the spool's settings. A new
    /// file is created with mode 0600 and its directory must exist (0700, see `ensure_home`).
    /// With `Role::Migrator` pending migrations are applied; with `Role::Reader` a database
    /// that is not at `SCHEMA_VERSION` is refused. A brand-new empty file is initialised by
    /// either role, since there is nothing to migrate.
    pub fn open(path: &Path, role: Role, busy_timeout: Duration) -> Result<Store> {
        let mut store = Store::open_unmigrated(path, busy_timeout)?;
        let version = store.schema_version()?;
        if version == 0 || role == Role::Migrator {
            store.migrate(false)?;
        } else if version < SCHEMA_VERSION {
            return Err(StoreError::SchemaTooOld {
                found: version,
                known: SCHEMA_VERSION,
            });
        }
        let version = store.schema_version()?;
        if version > SCHEMA_VERSION {
            return Err(StoreError::SchemaTooNew {
                found: version,
                known: SCHEMA_VERSION,
            });
        }
        Ok(store)
    }

    /// Open the spool wherever it is (`Store::open` or `Store::open_pg`).
    pub fn open_at(at: &SpoolAt, role: Role, busy_timeout: Duration) -> Result<Store> {
        match at {
            SpoolAt::File(path) => Store::open(path, role, busy_timeout),
            SpoolAt::Postgres(url) => Store::open_pg(url, role, busy_timeout),
        }
    }

    /// Open a PostgreSQL spool (`[spool] backend = "postgres"`): connect, check the session
    /// and the schema as `PgStore::open` does (a migrator applies pending migrations under
    /// the advisory lock; a reader refuses another schema). The store's API is then the
    /// same as on SQLite. `busy_timeout` bounds each wait for a row another session locked
    /// (`lock_timeout`), which then fails as `Busy`, as SQLite's busy timeout does.
    pub fn open_pg(url: &str, role: Role, busy_timeout: Duration) -> Result<Store> {
        let pg = db::off_runtime(|| -> Result<pg::PgStore> {
            let mut pg = pg::PgStore::open(url, role)?;
            pg.set_lock_timeout(busy_timeout)?;
            if role == Role::Migrator {
                // Fresh statistics for the planner at the dispatcher's start (after a
                // migration or a `spool copy`), as the hourly pass keeps them (`checkpoint`).
                pg.client
                    .batch_execute("ANALYZE batches")
                    .map_err(|e| pg.err(&e))?;
            }
            Ok(pg)
        })?;
        let target = pg.target().to_string();
        let conn = db::PgConn::reconnecting(pg, url, busy_timeout);
        Ok(Store {
            conn: Connection::Pg(Box::new(std::cell::RefCell::new(conn))),
            path: PathBuf::from(target),
            heads_by_group_first: std::cell::Cell::new(false),
            actor: None,
        })
    }

    /// On PostgreSQL, plan this session's statements, and the foreign key checks its
    /// inserts make, on indexes (`enable_seqscan = off`): the intake's writer calls it.
    /// Every statement of the intake's write path has an index to use, but the session
    /// caches its plan of the `events.batch_id` check, and one made while a fresh spool's
    /// `batches` was a few pages scans the table (its dead row versions included) on every
    /// event until an analysis of the table makes it plan again (bench/README.md: 42 % of
    /// the server's time in a 20 s run on a fresh spool). Not for other sessions: the
    /// admin API's and the CLI's searches are planned as the server sees fit. Nothing on
    /// SQLite.
    ///
    /// Its prepared statements (the enqueue paths, and the intake's status and metrics
    /// reads, all by key or index range) also keep one plan each (`plan_cache_mode =
    /// force_generic_plan`): PostgreSQL planned the group's dedup lookup and its draw of ids
    /// (arrays through `unnest` and `generate_series`) anew at every group, about 0.27 ms of
    /// the server's time per group of one request (pg_stat_statements with
    /// `track_planning` during `bench_dispatch pg_latency`), for the same plan: one index
    /// probe per element.
    pub fn plan_on_indexes(&self) {
        if let Connection::Pg(p) = &self.conn {
            let mut p = p.borrow_mut();
            p.set_for_session("SET enable_seqscan = off");
            p.set_for_session("SET plan_cache_mode = force_generic_plan");
        }
    }

    /// On PostgreSQL, plan this session's statements on indexes (`enable_seqscan = off`):
    /// the dispatcher's engine calls it on its own session (`Engine::new`). Its tick's
    /// statements (the seal's find, the FIFO walk, the claims) each have an index to use,
    /// but the plans the session caches for them are made at its first ticks, and on a
    /// fresh spool whose `batches` has not been analyzed yet those were sequential scans of
    /// the whole table, its dead row versions included, five of them in each seal, on every
    /// tick until an analysis made the session plan again (auto_explain during
    /// `bench_dispatch pg_latency`). Its other statements (heartbeats, retention,
    /// maintenance, alerts) read by key or index range too. Nothing on SQLite.
    pub fn plan_ticks_on_indexes(&self) {
        if let Connection::Pg(p) = &self.conn {
            p.borrow_mut().set_for_session("SET enable_seqscan = off");
        }
    }

    /// Make this store the active dispatcher's recorder, on PostgreSQL: a second session
    /// that records results while the dispatcher's own session seals and claims
    /// (`dispatch::Engine`). Its write transactions take no spool write lock: each locks
    /// the rows it decides on (a mark its batch, `record_results` its destination rows),
    /// so an operator's change to those rows waits for it, or it for them. Its session
    /// plans on indexes without hash joins (its statements find rows by key), so the marks'
    /// statement needs no planner settings of its own. `false` on SQLite, whose one writer
    /// at a time leaves nothing to run beside.
    pub fn become_recorder(&self) -> bool {
        match &self.conn {
            Connection::Pg(p) => {
                let mut p = p.borrow_mut();
                p.without_write_lock();
                // Its statements find rows by key: the marks need no settings of their own.
                p.plan_on_indexes_only();
                true
            }
            Connection::Lite(_) => false,
        }
    }

    /// Become the spool's active dispatcher. On SQLite, dispatch.lock (taken by the caller)
    /// is that already: `true`. On PostgreSQL, the session advisory lock
    /// `PG_DISPATCH_LOCK_KEY`, without waiting: `false` while another dispatcher holds it
    /// (this one is a standby). The lock lives as long as this connection's session; a
    /// session made again takes it again or fails with `Locked`.
    pub fn take_dispatch(&mut self) -> Result<bool> {
        match &self.conn {
            Connection::Lite(_) => Ok(true),
            Connection::Pg(pg) => pg.borrow_mut().take_dispatch(),
        }
    }

    /// Open with the spool's connection settings but touch no schema (for `migrate
    /// --dry-run`, which must change nothing).
    pub fn open_unmigrated(path: &Path, busy_timeout: Duration) -> Result<Store> {
        let existed = path.exists();
        if !existed {
            create_private_file(path)?;
        }
        configure_sqlite();
        let mut conn = rusqlite::Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_CREATE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        install_busy_handler(&mut conn, busy_timeout)?;
        conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE_STATEMENTS_MAX);
        // The query planner stability guarantee: a plan never depends on a bound value.
        // Without it SQLite marks a statement whose plan looked at one (a `LIMIT ?`, an
        // `x = ?` it weighed as maybe 0 or 1) to be prepared again whenever its bindings are
        // cleared, which rusqlite does each time a statement goes back to the cache: the
        // attempt history, the group-head seek and a batch's events were parsed and planned
        // again on every use (12 % of the dispatcher's CPU). No query here relies on a bound
        // value to pick an index: the partial indexes are named by literal states.
        conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
        let mode: String = conn.query_row("PRAGMA journal_mode=WAL", (), |r| r.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::Invalid(format!(
                "could not put {} in WAL mode (got {mode})",
                path.display()
            )));
        }
        // temp_store=MEMORY: the sub-journal of the savepoints a group runs in (one per
        // request, claim or mark) stays in memory instead of spilling to a temporary file
        // past 64 KiB (the dispatcher's profile showed those pwrites at 9 %). It only undoes
        // a savepoint; durability is the WAL's and synchronous=FULL's.
        conn.execute_batch(
            "PRAGMA synchronous=FULL; PRAGMA foreign_keys=ON; PRAGMA temp_store=MEMORY;",
        )?;
        Ok(Store {
            conn: Connection::Lite(conn),
            path: path.to_path_buf(),
            heads_by_group_first: std::cell::Cell::new(false),
            actor: None,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Name who acts through this connection (e.g. `admin-token` for the admin API's
    /// token): every audit row of an operator transition it makes then says `"by": who`.
    pub fn set_actor(&mut self, who: &str) {
        self.actor = Some(who.to_string());
    }

    /// PRAGMA quick_check (spec 2, 12): run at dispatcher start and by `check`. On
    /// PostgreSQL, a round trip: the server checks its own pages (data checksums, WAL
    /// replay), which no client query can redo.
    pub fn quick_check(&self) -> Result<()> {
        if self.conn.is_pg() {
            let _: i64 = self.conn.query_row("SELECT 1", (), |r| r.get(0))?;
            return Ok(());
        }
        let mut stmt = self.conn.prepare("PRAGMA quick_check")?;
        let rows: Vec<String> = stmt
            .query_map((), |r| r.get::<_, String>(0))?
            .collect::<rusqlite::Result<_>>()?;
        if rows.len() == 1 && rows[0] == "ok" {
            Ok(())
        } else {
            Err(StoreError::Corrupt(rows.join("; ")))
        }
    }

    /// A read of a `meta` value.
    pub fn meta(&self, key: &str) -> Result<Option<String>> {
        use rusqlite::OptionalExtension;
        Ok(self
            .conn
            .query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0))
            .optional()?)
    }

    /// Write one `meta` value in its own transaction.
    pub fn set_meta(&mut self, key: &str, value: &str) -> Result<()> {
        let tx = self.begin()?;
        set_meta_tx(&tx, key, value)?;
        tx.commit()?;
        Ok(())
    }

    /// The instance id minted once per spool and used in outbound webhook-ids (spec 3, 6.4).
    pub fn instance_id(&self) -> Result<String> {
        self.meta("instance_id")?
            .ok_or_else(|| StoreError::Corrupt("meta.instance_id is missing".into()))
    }

    /// `BEGIN IMMEDIATE`: every write in the spool starts this way (spec 2). Inside a
    /// tick's transaction, a part of it (`cached::Tx`).
    fn begin(&mut self) -> Result<cached::Tx<'_>> {
        cached::Tx::begin(&self.conn)
    }

    /// Open the dispatcher tick's transaction: the writes of `seal_ready`,
    /// `recover_expired_leases` and `claim_many` until `commit_tick` are committed together,
    /// in one fsync (issue 13: after the intake's commit, the claim is the only durable
    /// step before the request). Only the dispatcher calls it, from one thread.
    pub fn begin_tick(&mut self) -> Result<()> {
        if !self.conn.is_autocommit() {
            return Err(StoreError::Corrupt(
                "a tick's transaction was begun inside another transaction".into(),
            ));
        }
        cached::exec(&self.conn, "BEGIN IMMEDIATE", ())?;
        Ok(())
    }

    /// Commit the tick's transaction. It must still be open: SQLite rolls a transaction
    /// back itself after some errors, and one that ended unreported would otherwise pass
    /// for committed.
    pub fn commit_tick(&mut self) -> Result<()> {
        if self.conn.is_autocommit() {
            return Err(tick_ended());
        }
        cached::exec(&self.conn, "COMMIT", ())?;
        Ok(())
    }

    /// Whether a transaction (the tick's) is open on this connection.
    pub fn in_transaction(&self) -> bool {
        !self.conn.is_autocommit()
    }

    /// Roll back the tick's transaction, if one is open (after an error in it).
    pub fn abandon_tick(&mut self) {
        if !self.conn.is_autocommit() {
            // A failed ROLLBACK leaves SQLite rolling back itself; nothing else to do.
            let _ = cached::exec(&self.conn, "ROLLBACK", ());
        }
    }

    /// Open a read transaction, so the reads that follow share one snapshot and take the
    /// WAL's read lock once: the dispatcher reads each claimed batch and its events right
    /// after the tick's commit, and every read on its own took and dropped that lock (two
    /// `fcntl` calls) and read the WAL index again. Only reads may follow until
    /// `end_reads`; a write would find this transaction open. `None` when a transaction is
    /// already open (then there is nothing to end).
    pub fn begin_reads(&mut self) -> Result<Option<ReadScope>> {
        if !self.conn.is_autocommit() {
            return Ok(None);
        }
        cached::exec(&self.conn, "BEGIN DEFERRED", ())?;
        Ok(Some(ReadScope(())))
    }

    /// End the read transaction `begin_reads` opened. A read transaction has nothing to
    /// keep: if COMMIT fails, ROLLBACK ends it, so the next write can begin.
    pub fn end_reads(&mut self, scope: ReadScope) {
        let ReadScope(()) = scope;
        if !self.conn.is_autocommit() && cached::exec(&self.conn, "COMMIT", ()).is_err() {
            let _ = cached::exec(&self.conn, "ROLLBACK", ());
        }
    }

    /// PRAGMA wal_checkpoint(TRUNCATE), after a retention pass (spec 8). On PostgreSQL,
    /// which checkpoints and vacuums on its own schedule, `ANALYZE batches` instead: a spool
    /// of a million delivered batches that gains ten thousand open ones changes too little
    /// for autovacuum to analyze it, and the tick's plans then scan every open batch
    /// (bench_dispatch pg_tick: 21.6 ms p99 before, 1.84 ms after).
    pub fn checkpoint(&self) -> Result<()> {
        if self.conn.is_pg() {
            self.conn.execute_batch("ANALYZE batches")?;
            return Ok(());
        }
        self.conn
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", (), |_| Ok(()))?;
        Ok(())
    }

    /// A tiny durable write that proves the spool is writable (spec 11.1).
    pub fn touch_writable(&mut self, now: f64) -> Result<()> {
        self.set_meta("writable_checked_at", &now.to_string())
    }
}

fn set_meta_tx(conn: &Connection, key: &str, value: &str) -> Result<()> {
    conn.prepare_cached(
        "INSERT INTO meta (key, value) VALUES (?1, ?2)
         ON CONFLICT(key) DO UPDATE SET value = excluded.value",
    )?
    .execute(rusqlite::params![key, value])?;
    Ok(())
}

fn create_private_file(path: &Path) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map(|_| ())
        .or_else(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                Ok(())
            } else {
                Err(io_err(format!("creating {}", path.display()), e))
            }
        })
}

/// Create the spool home with mode 0700 if it does not exist (spec 10).
pub fn ensure_home(home: &Path) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    if home.is_dir() {
        return Ok(());
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(home)
        .map_err(|e| io_err(format!("creating {}", home.display()), e))
}

/// A dispatcher tick's transaction that is no longer open where its commit was due.
fn tick_ended() -> StoreError {
    StoreError::Invalid("the tick's transaction ended before its commit".into())
}

fn io_err(context: String, source: std::io::Error) -> StoreError {
    if source.raw_os_error() == Some(nix::libc::ENOSPC) {
        return StoreError::Full;
    }
    StoreError::Io { context, source }
}

#[cfg(test)]
#[path = "../../tests/support/pg.rs"]
pub(crate) mod test_pg;
/// The one skip rule and the throwaway PostgreSQL cluster, shared with the integration
/// tests (tests/support/).
#[cfg(test)]
#[path = "../../tests/support/skip.rs"]
pub(crate) mod test_skip;

#[cfg(test)]
pub(crate) mod testutil {
    use super::*;

    /// A migrated PostgreSQL spool on a cluster of its own (kept alive by the returned
    /// `Cluster`) as the bare PostgreSQL connection (`spool copy`'s side, `pg::enqueue`'s
    /// concurrency test), or `None` after the one skip rule.
    pub fn temp_pg() -> Option<(super::test_pg::Cluster, pg::PgStore)> {
        let cluster = match super::test_pg::Cluster::start() {
            Ok(c) => c,
            Err(why) => {
                super::test_skip::skip_or_fail(&why);
                return None;
            }
        };
        let url = cluster.database("spool");
        let store = pg::PgStore::open(&url, Role::Migrator).expect("migrate the spool");
        Some((cluster, store))
    }

    /// The environment variable that runs every test written on `temp_store` against
    /// PostgreSQL, not only those in `both_backends!`: `HOOKSPOOL_TEST_SPOOL=postgres`
    /// (by hand; `cargo test` runs the `both_backends!` ones on each backend already).
    pub const TEST_SPOOL_ENV: &str = "HOOKSPOOL_TEST_SPOOL";

    thread_local! {
        /// Set by `with_backend` for the test running on this thread.
        static ON_PG: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    /// Whether `temp_store` makes PostgreSQL spools on this thread: inside
    /// `with_backend(true, ..)`, or everywhere with `HOOKSPOOL_TEST_SPOOL=postgres`.
    pub fn on_postgres() -> bool {
        ON_PG.with(|c| c.get()) || std::env::var(TEST_SPOOL_ENV).is_ok_and(|v| v == "postgres")
    }

    /// Run the test body `f` with `temp_store` on PostgreSQL (`pg`) or SQLite. Without
    /// PostgreSQL here, the PostgreSQL run follows the one skip rule (a failure in CI).
    pub fn with_backend(pg: bool, f: fn()) {
        if pg && let Err(why) = shared_cluster() {
            super::test_skip::skip_or_fail(why);
            return;
        }
        ON_PG.with(|c| c.set(pg));
        f();
        ON_PG.with(|c| c.set(false));
    }

    /// Test bodies written on `temp_store`, each run as `<name>::sqlite` and
    /// `<name>::postgres` (issue 32: one suite for both backends, parameterised).
    macro_rules! both_backends {
        ($($name:ident),+ $(,)?) => {$(
            mod $name {
                #[test]
                fn sqlite() {
                    crate::store::testutil::with_backend(false, super::$name);
                }
                #[test]
                fn postgres() {
                    crate::store::testutil::with_backend(true, super::$name);
                }
            }
        )+};
    }
    pub(crate) use both_backends;

    /// One cluster for the whole test process, each spool a database of its own in it
    /// (`createdb` takes a tenth of a second; a cluster takes seconds). The cluster's guard
    /// stops it when the process ends.
    fn shared_cluster() -> std::result::Result<&'static super::test_pg::Cluster, &'static str> {
        static CLUSTER: std::sync::OnceLock<std::result::Result<super::test_pg::Cluster, String>> =
            std::sync::OnceLock::new();
        CLUSTER
            .get_or_init(super::test_pg::Cluster::start)
            .as_ref()
            .map_err(String::as_str)
    }

    /// The URL of each shared-cluster spool, by the target its store reports as its path.
    fn pg_urls() -> &'static std::sync::Mutex<std::collections::HashMap<PathBuf, String>> {
        static URLS: std::sync::OnceLock<
            std::sync::Mutex<std::collections::HashMap<PathBuf, String>>,
        > = std::sync::OnceLock::new();
        URLS.get_or_init(Default::default)
    }

    /// A new, migrated spool database in the process's shared cluster.
    pub fn shared_pg_store() -> Store {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let cluster = shared_cluster().unwrap_or_else(|why| {
            panic!("a PostgreSQL spool was asked for, but no cluster could start: {why}")
        });
        let url = cluster.database(&format!("spool_{}_{n}", std::process::id()));
        let store = Store::open_pg(&url, Role::Migrator, Duration::from_secs(5))
            .expect("migrate the spool");
        pg_urls()
            .lock()
            .unwrap()
            .insert(store.path().to_path_buf(), url);
        store
    }

    /// Another connection to the spool `s` (made by `temp_store` in `dir`), on either
    /// backend.
    pub fn reopen(dir: &tempfile::TempDir, s: &Store, busy: Duration) -> Store {
        if s.conn.is_pg() {
            let url = pg_urls().lock().unwrap()[s.path()].clone();
            return Store::open_pg(&url, Role::Migrator, busy).expect("reopen the spool");
        }
        Store::open(&dir.path().join("spool.db"), Role::Migrator, busy).expect("reopen")
    }

    /// A store on a SQLite file whatever the test process's backend: for a test of what
    /// only SQLite has (its plans, its statement cache, triggers, the WAL), or of the
    /// SQLite side of a copy.
    pub fn temp_sqlite_store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(
            &dir.path().join("spool.db"),
            Role::Migrator,
            Duration::from_secs(5),
        )
        .expect("open store");
        (dir, store)
    }

    /// A store on a real temporary file (in-memory databases cannot use WAL), or, with
    /// `HOOKSPOOL_TEST_SPOOL=postgres`, a PostgreSQL spool (the directory is then empty).
    pub fn temp_store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().expect("tempdir");
        if on_postgres() {
            return (dir, shared_pg_store());
        }
        let store = Store::open(
            &dir.path().join("spool.db"),
            Role::Migrator,
            Duration::from_secs(5),
        )
        .expect("open store");
        (dir, store)
    }
}
#[cfg(test)]
mod model_tests;
#[cfg(test)]
pub(crate) mod tests;
