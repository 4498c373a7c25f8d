//! The connection the store's modules speak through, on either backend (issue 32's seam).
//!
//! The store's SQL was written for SQLite and reads SQLite's value model: every value is
//! NULL, an integer, a real, a text or a blob, parameters are anything rusqlite can bind
//! (`params![...]`, arrays, slices, `Vec<Value>`) and rows are read with rusqlite's
//! `FromSql` (the vocabulary words, `Option`s, integers read as reals). `Connection`,
//! `Statement` and `Row` here keep exactly that model and those method names, over a
//! SQLite connection or a PostgreSQL one:
//!
//! * on SQLite they are rusqlite itself, one `match` away (parameters bound in place,
//!   statements from the connection's cache, rows read as they are stepped);
//! * on PostgreSQL each statement is rewritten once per connection (`to_pg`: `?N`
//!   placeholders to `$N`, `INDEXED BY` hints dropped, `max(a, b)` to `greatest`, `INSERT
//!   OR IGNORE` to `ON CONFLICT DO NOTHING`, `BEGIN IMMEDIATE` to `BEGIN`, `rowid` to
//!   `ctid`), prepared once and cached by its SQLite text; a parameter is converted to the
//!   type PostgreSQL inferred for its placeholder (`PgValue`), and each column of an answer
//!   to the SQLite value of its type (integers, floats, numerics, booleans, texts, bytea),
//!   which rusqlite's `FromSql` then reads as it reads SQLite's.
//!
//! A statement whose meaning differs between the two (JSON functions, `FOR UPDATE`, the
//! rowid ranges of `batches`) is written twice in its module, chosen with
//! `Connection::is_pg`.
//!
//! Errors keep rusqlite's type so `?` and `.optional()` work unchanged: a PostgreSQL error
//! travels as `rusqlite::Error::ToSqlConversionFailure` holding the classified `StoreError`
//! (`pg_error`: unreachable, busy, full, or the statement's error), which
//! `From<rusqlite::Error> for StoreError` takes out again; "no rows" is rusqlite's
//! `QueryReturnedNoRows` on both.
//!
//! Must not: put a parameter's value in an error (a body may be one), or keep a statement
//! from one PostgreSQL connection for another.

use std::cell::RefCell;
use std::collections::HashMap;

use rusqlite::types::{FromSql, ToSql, ToSqlOutput, Value, ValueRef};

use super::StoreError;
use super::pg::PgStore;

/// After ending this process's own lost session that held the dispatcher lock
/// (`PgConn::take_dispatch_again`), how many times, and how many ms apart, the lock is
/// tried again while that server process exits: 5 s in all.
const LOCK_HOLDER_EXIT_POLLS: u32 = 50;
const LOCK_HOLDER_EXIT_POLL_MS: u64 = 100;

/// A connection to the spool: SQLite's or PostgreSQL's.
pub enum Connection {
    Lite(rusqlite::Connection),
    Pg(Box<RefCell<PgConn>>),
}

/// A PostgreSQL connection with the statements prepared on it and whether a transaction is
/// open (the driver does not say; `BEGIN`, `COMMIT` and `ROLLBACK` go through `execute`).
pub struct PgConn {
    /// `None` only while `Drop` closes it.
    store: Option<PgStore>,
    stmts: HashMap<String, tokio_postgres::Statement>,
    in_tx: bool,
    /// How to connect again after the connection was lost (`revive`): the URL (held in
    /// memory only, never shown).
    again: Option<String>,
    /// This session holds the spool's dispatcher lock (`Store::take_dispatch`): a session
    /// made again must take it again before anything else, or fail.
    leader: bool,
    /// The server session (process id and start time) that took the dispatcher lock last:
    /// after that session was lost here, the server may still keep it, and the lock with it
    /// (`PgStore::end_own_lock_holder`).
    leader_session: Option<super::pg::ServerSession>,
    /// A session made again must take the dispatcher lock back before any statement runs
    /// (`revive`); set until it has, so an error on the way leaves no session in use that
    /// does not hold it.
    retake: bool,
    /// `SET`s made for this session (its lock timeout, `Store::plan_on_indexes`), made
    /// again on a session made again.
    settings: Vec<String>,
    /// Whether this session's write transactions take the spool's write lock
    /// (`PG_WRITE_LOCK_KEY`); not the dispatcher's recorder (`Store::become_recorder`).
    write_lock: bool,
    /// The open transaction's COMMIT goes right after the next statement, in the same
    /// write (`commit_with_next`).
    commit_next: bool,
    /// Reads asked for with `read_ahead`, each sent after every statement and holding the
    /// rows of the last, until a query takes them or the transaction ends.
    ahead: Vec<Ahead>,
    /// Statements asked for with `after_next`, sent once, right after the next statement and
    /// before the reads sent ahead and the COMMIT; then their rows (`after_next_rows`).
    once: Vec<Ahead>,
    /// The rows of the statements `after_next` sent after the last statement, by text.
    once_rows: Vec<(&'static str, rusqlite::Result<Vec<PgRow>>)>,
    /// This session plans every statement on indexes, without hash joins
    /// (`plan_on_indexes_only`).
    indexes_only: bool,
}

/// A read `PgConn::read_ahead` sends with each statement until it is used, and its rows
/// from the last one.
struct Ahead {
    sql: &'static str,
    stmt: tokio_postgres::Statement,
    values: Vec<Value>,
    before: &'static str,
    after: &'static str,
    rows: Option<Vec<PgRow>>,
}

impl PgConn {
    pub fn new(store: PgStore) -> PgConn {
        PgConn {
            store: Some(store),
            stmts: HashMap::new(),
            in_tx: false,
            again: None,
            leader: false,
            leader_session: None,
            retake: false,
            settings: Vec::new(),
            write_lock: true,
            commit_next: false,
            ahead: Vec::new(),
            once: Vec::new(),
            once_rows: Vec::new(),
            indexes_only: false,
        }
    }

    /// Plan every statement of this session (and of a session made again) on indexes and
    /// without hash joins (`Store::become_recorder`: its statements find rows by key).
    pub fn plan_on_indexes_only(&mut self) {
        self.set_for_session("SET enable_seqscan = off");
        self.set_for_session("SET enable_hashjoin = off");
        self.indexes_only = true;
    }

    /// Send the read `sql` with `values` (a statement inside the open transaction that
    /// writes nothing) right after the next statement, in the same write, between
    /// `before` and `after` (`SET LOCAL`s, empty for none), and again after each statement
    /// that follows until a `query` of the same `sql` and `values` takes its rows from the
    /// last one, without a round trip (what it read is then as of the statement before:
    /// nothing ran since). COMMIT, ROLLBACK (also to a savepoint), an error, `execute_batch`
    /// and a session made again forget it. Nothing outside a transaction (`false`).
    pub fn read_ahead(
        &mut self,
        sql: &'static str,
        values: Vec<Value>,
        before: &'static str,
        after: &'static str,
    ) -> rusqlite::Result<bool> {
        let Some(a) = self.ahead_of(sql, values, before, after)? else {
            return Ok(false);
        };
        self.ahead.push(a);
        Ok(true)
    }

    /// `sql` prepared, with `values`, to go after a statement (`read_ahead`, `after_next`);
    /// `None` outside a transaction.
    fn ahead_of(
        &mut self,
        sql: &'static str,
        values: Vec<Value>,
        before: &'static str,
        after: &'static str,
    ) -> rusqlite::Result<Option<Ahead>> {
        if !self.in_tx {
            return Ok(None);
        }
        let stmt = self.prepared(sql)?;
        Ok(Some(Ahead {
            sql,
            stmt,
            values,
            before,
            after,
            rows: None,
        }))
    }

    /// Send `sql` with `values` (a statement inside the open transaction, which may write)
    /// once, right after the next statement, in the same write, ahead of the reads sent
    /// ahead and of a COMMIT asked for with `commit_with_next`; its rows are then
    /// `after_next_rows`. Its error is that statement's answer (the COMMIT after it rolls
    /// back). COMMIT, ROLLBACK, `execute_batch` and a session made again forget it. Nothing
    /// outside a transaction (`false`).
    pub fn after_next(&mut self, sql: &'static str, values: Vec<Value>) -> rusqlite::Result<bool> {
        let Some(a) = self.ahead_of(sql, values, "", "")? else {
            return Ok(false);
        };
        self.once.push(a);
        Ok(true)
    }

    /// The rows of `sql`, sent by `after_next` after the last statement, if it went and
    /// answered (taken).
    fn after_next_rows(&mut self, sql: &str) -> Option<rusqlite::Result<Vec<PgRow>>> {
        let at = self.once_rows.iter().position(|(s, _)| *s == sql)?;
        Some(self.once_rows.remove(at).1)
    }

    /// The rows `read_ahead` got for `sql` with `values`, if it did (taken).
    fn read_already(&mut self, sql: &str, values: &[Value]) -> Option<Vec<PgRow>> {
        let at = self
            .ahead
            .iter()
            .position(|a| a.rows.is_some() && a.sql == sql && a.values == values)?;
        self.ahead.remove(at).rows
    }

    /// Forget what waits for the next statement: the reads sent ahead and a COMMIT asked
    /// to go with it. At the end of their transaction (COMMIT, ROLLBACK, `execute_batch`)
    /// and with a session made again; a COMMIT asked for a statement that never ran is not
    /// carried over.
    fn forget_pending(&mut self) {
        self.ahead.clear();
        self.once.clear();
        self.once_rows.clear();
        self.commit_next = false;
    }

    /// Forget what `after_next` asked for that has not gone (its statement never ran).
    pub fn forget_after_next(&mut self) {
        self.once.clear();
    }

    /// The open transaction commits with the next statement: its COMMIT is sent right
    /// after it in the same write (`pg::client`'s `trail`), and the transaction is over
    /// once that statement has returned (after its error the COMMIT rolls back), unless the
    /// statement was refused before it was sent: then nothing went, and the transaction is
    /// still open. COMMIT, ROLLBACK and a session made again drop a request no statement
    /// took; so does `false`, which says whether one was pending.
    pub fn commit_with_next(&mut self, on: bool) -> bool {
        let was = self.commit_next;
        self.commit_next = on && self.in_tx;
        was
    }

    /// Run `f` (one statement) with the reads sent ahead after it and the COMMIT
    /// `commit_with_next` asked for, if any.
    fn statement<R: Send>(
        &mut self,
        f: impl FnOnce(&mut PgStore) -> Result<R, tokio_postgres::Error> + Send,
    ) -> Result<R, tokio_postgres::Error> {
        let commit = std::mem::take(&mut self.commit_next);
        if commit {
            // A read after the COMMIT would be outside the transaction.
            self.ahead.clear();
        }
        let once = std::mem::take(&mut self.once);
        self.once_rows.clear();
        // What `after_next` asked for goes first, once; the reads sent ahead go again after
        // this statement: what they read before it may have changed.
        for a in once.iter().chain(&self.ahead) {
            let params = a
                .values
                .iter()
                .map(|v| {
                    Box::new(PgOwned(v.clone()))
                        as Box<dyn tokio_postgres::types::ToSql + Sync + Send>
                })
                .collect();
            let stmt = a.stmt.clone();
            let client = &mut self.store.as_mut().expect("open").client;
            if !a.before.is_empty() {
                client.trail(a.before);
            }
            client.read_after(stmt, params);
            if !a.after.is_empty() {
                client.trail(a.after);
            }
        }
        if commit {
            self.pg().client.trail("COMMIT");
        }
        let r = self.with(f);
        // Refused before it was written, the statement took nothing trailing with it: the
        // transaction is still open, for its caller to roll back.
        if commit && self.pg().client.trailing_went() {
            self.in_tx = false;
        }
        let answered = match (&r, self.ahead.is_empty() && once.is_empty()) {
            (Ok(_), false) => self.pg().client.answered(),
            _ => Vec::new(),
        };
        if answered.len() == once.len() + self.ahead.len() {
            let mut answered = answered.into_iter();
            for (a, rows) in once.iter().zip(answered.by_ref()) {
                let rows = rows.iter().map(PgRow::read).collect();
                self.once_rows.push((a.sql, rows));
            }
            for (a, rows) in self.ahead.iter_mut().zip(answered) {
                a.rows = rows
                    .iter()
                    .map(PgRow::read)
                    .collect::<rusqlite::Result<_>>()
                    .ok();
            }
        } else {
            self.ahead.clear();
        }
        r
    }

    /// Set `sql` (a `SET ...`) for this session and for every session made again after it.
    pub fn set_for_session(&mut self, sql: &str) {
        self.pg().client.defer_alone(sql);
        self.settings.push(sql.to_string());
    }

    /// This session's write transactions take no spool write lock from now on: each of
    /// them locks the rows it decides on instead (`Store::become_recorder`).
    pub fn without_write_lock(&mut self) {
        self.write_lock = false;
    }

    /// Take the spool's dispatcher lock for this session, without waiting (`false`: another
    /// session holds it). Held, it is taken again whenever the session is made again.
    pub fn take_dispatch(&mut self) -> super::Result<bool> {
        self.revive()?;
        self.leader = self.try_dispatch_lock_noted()?;
        Ok(self.leader)
    }

    /// Try the dispatcher lock; when won, note the server session that holds it
    /// (`leader_session`).
    fn try_dispatch_lock_noted(&mut self) -> super::Result<bool> {
        let Some(session) = self.with(|pg| pg.try_dispatch_lock_as())? else {
            return Ok(false);
        };
        self.leader_session = Some(session);
        Ok(true)
    }

    /// Take the dispatcher lock again on a session made again: at once when it is free; or,
    /// when the holder is the very server session that took it before (`leader_session`),
    /// which the server keeps because it has not noticed the link was lost, once that
    /// session is ended. `false`: another session holds it.
    fn take_dispatch_again(&mut self) -> super::Result<bool> {
        if self.try_dispatch_lock_noted()? {
            return Ok(true);
        }
        let Some(old) = self.leader_session.clone() else {
            return Ok(false);
        };
        let pid = old.pid;
        if !self.with(move |pg| pg.end_own_lock_holder(&old))? {
            return Ok(false);
        }
        tracing::warn!(
            component = "store",
            "ended this dispatcher's own earlier PostgreSQL session (server process {pid}), which the server still kept with the dispatcher lock after the link to it was lost; set the server's tcp_keepalives_* or tcp_user_timeout so it notices lost clients itself"
        );
        // The ended process releases the lock as it exits.
        for _ in 0..LOCK_HOLDER_EXIT_POLLS {
            if self.try_dispatch_lock_noted()? {
                return Ok(true);
            }
            off_runtime(|| {
                std::thread::sleep(std::time::Duration::from_millis(LOCK_HOLDER_EXIT_POLL_MS));
            });
        }
        Ok(false)
    }

    /// A connection that connects again on its own after it was lost, its lock timeout
    /// (already set on `store`) set again on each session made again.
    pub fn reconnecting(store: PgStore, url: &str, lock_timeout: std::time::Duration) -> PgConn {
        let mut c = PgConn::new(store);
        c.again = Some(url.to_string());
        c.settings.push(super::pg::lock_timeout_sql(lock_timeout));
        c
    }

    /// Connect again if the connection was lost (the server restarted, the network cut it)
    /// and no transaction is open (one that was is gone with the connection: its COMMIT
    /// never returned, so its caller answered nothing). The new session starts with no
    /// prepared statements. While the server cannot be reached this is `PgUnreachable`,
    /// which callers treat as weather: the intake answers 503, the dispatcher waits.
    pub fn revive(&mut self) -> super::Result<()> {
        let closed = self.store.as_ref().is_some_and(|s| s.client.is_closed());
        if self.in_tx || !(closed || self.retake) {
            return Ok(());
        }
        if closed {
            self.connect_again()?;
        }
        // The dispatcher lock went with the old session. If nobody took it meanwhile this
        // session takes it back; if another dispatcher did, it has recovered this one's
        // leases, and nothing more may be written as the active dispatcher. An error on the
        // way (`retake` stays set) leaves it for the next statement to try again.
        if self.retake {
            let again = self.take_dispatch_again()?;
            self.retake = false;
            if !again {
                self.leader = false;
                return Err(super::StoreError::Locked(
                    "another dispatcher took the spool's dispatcher lock while this one was cut off from PostgreSQL; this one stops and comes back as a standby".into(),
                ));
            }
        }
        Ok(())
    }

    /// `revive`'s new session in place of the lost one, to take the dispatcher lock back
    /// first when the lost one held it (`retake`).
    fn connect_again(&mut self) -> super::Result<()> {
        let Some(url) = self.again.clone() else {
            return Ok(());
        };
        let mut fresh = off_runtime(move || PgStore::connect(&url))?;
        // The session's settings go with its first statement.
        for sql in &self.settings {
            fresh.client.defer_alone(sql);
        }
        tracing::info!(
            component = "store",
            reason = fresh.target(),
            "connected to PostgreSQL again"
        );
        if let Some(old) = self.store.replace(fresh) {
            off_runtime(move || drop(old));
        }
        self.stmts.clear();
        self.forget_pending();
        self.retake = self.leader;
        Ok(())
    }

    fn pg(&mut self) -> &mut PgStore {
        self.store
            .as_mut()
            .expect("a PgConn holds its connection until dropped")
    }

    /// Run `f` on the connection where its driver may block (`off_runtime`).
    pub fn with<R: Send>(&mut self, f: impl FnOnce(&mut PgStore) -> R + Send) -> R {
        let pg = self.pg();
        off_runtime(move || f(pg))
    }

    fn fail(&self, e: &tokio_postgres::Error) -> rusqlite::Error {
        wrap(self.store.as_ref().expect("open").err(e))
    }

    /// A statement's error, naming the statement (its text holds no values: they are
    /// parameters).
    fn fail_in(&self, sql: &str, e: &tokio_postgres::Error) -> rusqlite::Error {
        let mut err = self.store.as_ref().expect("open").err(e);
        if let StoreError::Pg { reason, .. } = &mut err {
            let one_line: String = sql.split_whitespace().collect::<Vec<_>>().join(" ");
            let cut: String = one_line.chars().take(160).collect();
            reason.push_str(&format!(" (in: {cut})"));
        }
        wrap(err)
    }

    fn prepared(&mut self, sql: &str) -> rusqlite::Result<tokio_postgres::Statement> {
        self.revive().map_err(wrap)?;
        if let Some(s) = self.stmts.get(sql) {
            return Ok(s.clone());
        }
        let text = to_pg(sql);
        let prepared = self.with(|pg| pg.client.prepare(&text));
        let s = match prepared {
            Ok(s) => s,
            Err(e) => return Err(self.fail_in(&text, &e)),
        };
        self.stmts.insert(sql.to_string(), s.clone());
        Ok(s)
    }

    /// Transaction control (and `SET LOCAL`, a setting of the transaction) goes as a simple
    /// query (deferred to the next statement but for COMMIT and ROLLBACK) and is tracked;
    /// `None` for anything else.
    fn control(&mut self, sql: &str) -> Option<rusqlite::Result<usize>> {
        let t = sql.trim().trim_end_matches(';').trim();
        let upper = t.to_ascii_uppercase();
        let word = upper.split_whitespace().next().unwrap_or("");
        let is_control = matches!(
            word,
            "BEGIN" | "COMMIT" | "SAVEPOINT" | "RELEASE" | "ROLLBACK"
        ) || upper.starts_with("SET LOCAL ");
        if !is_control {
            return None;
        }
        // BEGIN IMMEDIATE: a write transaction, which takes the spool's write lock
        // (`PG_WRITE_LOCK_KEY`); BEGIN DEFERRED: reads that share one snapshot, as SQLite's
        // read transaction does.
        let write_lock;
        if let Err(e) = self.revive() {
            return Some(Err(wrap(e)));
        }
        let text = match upper.as_str() {
            "BEGIN IMMEDIATE" if !self.write_lock => "BEGIN",
            "BEGIN IMMEDIATE" => {
                write_lock = format!(
                    "BEGIN; SELECT pg_advisory_xact_lock({})",
                    super::pg::PG_WRITE_LOCK_KEY
                );
                write_lock.as_str()
            }
            "BEGIN DEFERRED" => "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY",
            _ if word == "BEGIN" => "BEGIN",
            _ => t,
        };
        // Everything but COMMIT and a transaction's ROLLBACK goes with the next statement
        // (`pg::client`): its failure is that statement's answer, and it costs no round
        // trip of its own.
        let now = word == "COMMIT" || (word == "ROLLBACK" && !upper.contains(" TO "));
        if word == "COMMIT" || word == "ROLLBACK" {
            self.forget_pending();
        }
        let r = if now {
            self.with(|pg| pg.client.batch_execute(text))
        } else {
            self.pg().client.defer(text);
            Ok(())
        };
        match word {
            "BEGIN" => self.in_tx = r.is_ok() || self.in_tx,
            // A failed COMMIT ends the transaction too (PostgreSQL rolls it back).
            "COMMIT" => self.in_tx = false,
            "ROLLBACK" if !upper.contains(" TO ") => self.in_tx = false,
            _ => {}
        }
        Some(r.map(|()| 0).map_err(|e| self.fail(&e)))
    }

    fn execute(&mut self, sql: &str, values: &[Value]) -> rusqlite::Result<usize> {
        if values.is_empty()
            && let Some(r) = self.control(sql)
        {
            return r;
        }
        let s = self.prepared(sql)?;
        let args = pg_args(values);
        let refs: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = args
            .iter()
            .map(|a| a as &(dyn tokio_postgres::types::ToSql + Sync))
            .collect();
        match self.statement(|pg| pg.client.execute(&s, &refs)) {
            Ok(n) => Ok(n as usize),
            Err(e) => Err(self.fail_in(sql, &e)),
        }
    }

    fn query(&mut self, sql: &str, values: &[Value]) -> rusqlite::Result<Vec<PgRow>> {
        // Not while something waits to go right after the next statement: it would go
        // with a later one.
        if !self.commit_next
            && self.once.is_empty()
            && let Some(rows) = self.read_already(sql, values)
        {
            return Ok(rows);
        }
        let s = self.prepared(sql)?;
        let args = pg_args(values);
        let refs: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = args
            .iter()
            .map(|a| a as &(dyn tokio_postgres::types::ToSql + Sync))
            .collect();
        let rows = match self.statement(|pg| pg.client.query(&s, &refs)) {
            Ok(r) => r,
            Err(e) => return Err(self.fail_in(sql, &e)),
        };
        rows.iter().map(PgRow::read).collect()
    }
}

impl Drop for PgConn {
    fn drop(&mut self) {
        // Closing the connection blocks on the driver's runtime too.
        if let Some(pg) = self.store.take() {
            off_runtime(move || drop(pg));
        }
    }
}

/// Run `f`, which may block on the synchronous driver's own runtime, where that is allowed:
/// the synchronous PostgreSQL client drives its connection with a runtime of its own, which
/// may not be entered from a thread that runs async tasks (the admin API's handlers, `run`'s
/// tasks reach the store from one). On a worker of a multi-thread runtime, `block_in_place`
/// hands the worker's tasks to another thread first; on a current-thread runtime, `f` runs
/// on a thread of its own; anywhere else (the intake's writer, the dispatcher's thread), it
/// simply runs.
pub fn off_runtime<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current() {
        Err(_) => f(),
        Ok(h) if h.runtime_flavor() == RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        Ok(_) => std::thread::scope(|s| {
            s.spawn(f)
                .join()
                .unwrap_or_else(|p| std::panic::resume_unwind(p))
        }),
    }
}

/// A `StoreError` carried through rusqlite's error type (see the module's comment).
fn wrap(e: StoreError) -> rusqlite::Error {
    rusqlite::Error::ToSqlConversionFailure(Box::new(e))
}

impl Connection {
    /// The SQLite connection, for what only SQLite has (PRAGMAs, the WAL).
    pub fn lite(&self) -> Option<&rusqlite::Connection> {
        match self {
            Connection::Lite(c) => Some(c),
            Connection::Pg(_) => None,
        }
    }

    pub fn is_pg(&self) -> bool {
        matches!(self, Connection::Pg(_))
    }

    pub fn prepare_cached(&self, sql: &str) -> rusqlite::Result<Statement<'_>> {
        match self {
            Connection::Lite(c) => Ok(Statement::Cached(c.prepare_cached(sql)?)),
            Connection::Pg(p) => Ok(Statement::Pg(p, sql.to_string())),
        }
    }

    pub fn prepare(&self, sql: &str) -> rusqlite::Result<Statement<'_>> {
        match self {
            Connection::Lite(c) => Ok(Statement::Plain(c.prepare(sql)?)),
            Connection::Pg(p) => Ok(Statement::Pg(p, sql.to_string())),
        }
    }

    pub fn execute<P: Params>(&self, sql: &str, params: P) -> rusqlite::Result<usize> {
        match self {
            Connection::Lite(c) => {
                let mut s = c.prepare(sql)?;
                params.bind_lite(&mut s)?;
                s.raw_execute()
            }
            Connection::Pg(p) => p.borrow_mut().execute(sql, &params.values()?),
        }
    }

    pub fn query_row<T, P: Params, F: FnOnce(&Row<'_>) -> rusqlite::Result<T>>(
        &self,
        sql: &str,
        params: P,
        f: F,
    ) -> rusqlite::Result<T> {
        self.prepare(sql)?.query_row(params, f)
    }

    /// Several statements without parameters (a migration, PRAGMAs on SQLite).
    pub fn execute_batch(&self, sql: &str) -> rusqlite::Result<()> {
        match self {
            Connection::Lite(c) => c.execute_batch(sql),
            Connection::Pg(p) => {
                let mut p = p.borrow_mut();
                p.forget_pending();
                let text = to_pg(sql);
                let r = p.with(|pg| pg.client.batch_execute(&text));
                r.map_err(|e| p.fail(&e))
            }
        }
    }

    /// The id the last INSERT of this connection gave its row (PostgreSQL: the sequence
    /// value the last identity column took in this session).
    pub fn last_insert_rowid(&self) -> i64 {
        match self {
            Connection::Lite(c) => c.last_insert_rowid(),
            Connection::Pg(p) => p
                .borrow_mut()
                .with(|pg| pg.client.query_one("SELECT lastval()", &[]))
                .map(|r| r.get::<_, i64>(0))
                .unwrap_or(0),
        }
    }

    /// On PostgreSQL, send the read `sql` with `values` right after the next statement
    /// (`PgConn::read_ahead`); nothing on SQLite (`false`).
    pub fn read_ahead(
        &self,
        sql: &'static str,
        values: Vec<Value>,
        before: &'static str,
        after: &'static str,
    ) -> rusqlite::Result<bool> {
        match self {
            Connection::Lite(_) => Ok(false),
            Connection::Pg(p) => p.borrow_mut().read_ahead(sql, values, before, after),
        }
    }

    /// On PostgreSQL, send `sql` with `values` once, right after the next statement
    /// (`PgConn::after_next`); nothing on SQLite (`false`).
    pub fn after_next(&self, sql: &'static str, values: Vec<Value>) -> rusqlite::Result<bool> {
        match self {
            Connection::Lite(_) => Ok(false),
            Connection::Pg(p) => p.borrow_mut().after_next(sql, values),
        }
    }

    /// Forget what `after_next` asked for that has not gone (`PgConn::forget_after_next`).
    pub fn forget_after_next(&self) {
        if let Connection::Pg(p) = self {
            p.borrow_mut().forget_after_next();
        }
    }

    /// The rows of `sql` that `after_next` sent after the last statement, each read by `f`
    /// (`None`: it did not go, or the statement before it failed).
    pub fn after_next_rows<T>(
        &self,
        sql: &str,
        mut f: impl FnMut(&Row<'_>) -> rusqlite::Result<T>,
    ) -> Option<rusqlite::Result<Vec<T>>> {
        match self {
            Connection::Lite(_) => None,
            Connection::Pg(p) => {
                let rows = p.borrow_mut().after_next_rows(sql)?;
                Some(rows.and_then(|rows| rows.iter().map(|r| f(&Row::Pg(r))).collect()))
            }
        }
    }

    /// On PostgreSQL, whether this session plans every statement on indexes, without hash
    /// joins (`PgConn::plan_on_indexes_only`); never on SQLite.
    pub fn plans_on_indexes_only(&self) -> bool {
        match self {
            Connection::Lite(_) => false,
            Connection::Pg(p) => p.borrow().indexes_only,
        }
    }

    /// On PostgreSQL, the open transaction commits with the next statement
    /// (`PgConn::commit_with_next`); nothing on SQLite. Returns whether a request was
    /// pending.
    pub fn commit_with_next(&self, on: bool) -> bool {
        match self {
            Connection::Lite(_) => false,
            Connection::Pg(p) => p.borrow_mut().commit_with_next(on),
        }
    }

    pub fn is_autocommit(&self) -> bool {
        match self {
            Connection::Lite(c) => c.is_autocommit(),
            Connection::Pg(p) => !p.borrow().in_tx,
        }
    }
}

/// A prepared statement on either backend.
pub enum Statement<'c> {
    Cached(rusqlite::CachedStatement<'c>),
    Plain(rusqlite::Statement<'c>),
    Pg(&'c RefCell<PgConn>, String),
}

impl Statement<'_> {
    /// Whether the statement returns at least one row.
    pub fn exists<P: Params>(&mut self, params: P) -> rusqlite::Result<bool> {
        match self.query_row(params, |_| Ok(())) {
            Ok(()) => Ok(true),
            Err(rusqlite::Error::QueryReturnedNoRows) => Ok(false),
            Err(e) => Err(e),
        }
    }

    pub fn execute<P: Params>(&mut self, params: P) -> rusqlite::Result<usize> {
        let s: &mut rusqlite::Statement<'_> = match self {
            Statement::Cached(s) => s,
            Statement::Plain(s) => s,
            Statement::Pg(p, sql) => return p.borrow_mut().execute(sql, &params.values()?),
        };
        params.bind_lite(s)?;
        s.raw_execute()
    }

    /// Every row of the answer, each read by `f`.
    pub fn query_map<'s, T: 's, P: Params, F>(
        &'s mut self,
        params: P,
        mut f: F,
    ) -> rusqlite::Result<Box<dyn Iterator<Item = rusqlite::Result<T>> + 's>>
    where
        F: FnMut(&Row<'_>) -> rusqlite::Result<T> + 's,
    {
        let s: &mut rusqlite::Statement<'_> = match self {
            Statement::Cached(s) => s,
            Statement::Plain(s) => s,
            Statement::Pg(p, sql) => {
                let rows = p.borrow_mut().query(sql, &params.values()?)?;
                return Ok(Box::new(
                    rows.into_iter()
                        .map(move |r| f(&Row::Pg(&r)))
                        .collect::<Vec<_>>()
                        .into_iter(),
                ));
            }
        };
        params.bind_lite(s)?;
        let rows = s.raw_query();
        Ok(Box::new(rows.mapped(move |r| f(&Row::Lite(r)))))
    }

    /// The first row of the answer read by `f`; `QueryReturnedNoRows` when there is none.
    pub fn query_row<T, P: Params, F: FnOnce(&Row<'_>) -> rusqlite::Result<T>>(
        &mut self,
        params: P,
        f: F,
    ) -> rusqlite::Result<T> {
        let s: &mut rusqlite::Statement<'_> = match self {
            Statement::Cached(s) => s,
            Statement::Plain(s) => s,
            Statement::Pg(p, sql) => {
                let rows = p.borrow_mut().query(sql, &params.values()?)?;
                return match rows.first() {
                    Some(r) => f(&Row::Pg(r)),
                    None => Err(rusqlite::Error::QueryReturnedNoRows),
                };
            }
        };
        params.bind_lite(s)?;
        let mut rows = s.raw_query();
        match rows.next()? {
            Some(r) => f(&Row::Lite(r)),
            None => Err(rusqlite::Error::QueryReturnedNoRows),
        }
    }
}

/// One row of an answer.
pub enum Row<'a> {
    Lite(&'a rusqlite::Row<'a>),
    Pg(&'a PgRow),
}

/// A column by its position or its name.
pub trait ColumnIndex {
    fn position(&self, names: &[String]) -> rusqlite::Result<usize>;
    fn lite<T: FromSql>(&self, r: &rusqlite::Row<'_>) -> rusqlite::Result<T>;
}

impl ColumnIndex for usize {
    fn position(&self, names: &[String]) -> rusqlite::Result<usize> {
        if *self < names.len() {
            Ok(*self)
        } else {
            Err(rusqlite::Error::InvalidColumnIndex(*self))
        }
    }
    fn lite<T: FromSql>(&self, r: &rusqlite::Row<'_>) -> rusqlite::Result<T> {
        r.get(*self)
    }
}

impl ColumnIndex for &str {
    fn position(&self, names: &[String]) -> rusqlite::Result<usize> {
        names
            .iter()
            .position(|n| n == self)
            .ok_or_else(|| rusqlite::Error::InvalidColumnName(self.to_string()))
    }
    fn lite<T: FromSql>(&self, r: &rusqlite::Row<'_>) -> rusqlite::Result<T> {
        r.get(*self)
    }
}

impl Row<'_> {
    /// A column read as rusqlite reads SQLite's value (the same `FromSql`).
    pub fn get<I: ColumnIndex, T: FromSql>(&self, idx: I) -> rusqlite::Result<T> {
        match self {
            Row::Lite(r) => idx.lite(r),
            Row::Pg(r) => {
                let i = idx.position(&r.names)?;
                T::column_result(ValueRef::from(&r.values[i])).map_err(|e| match e {
                    rusqlite::types::FromSqlError::InvalidType => {
                        rusqlite::Error::InvalidColumnType(
                            i,
                            r.names[i].clone(),
                            r.values[i].data_type(),
                        )
                    }
                    other => rusqlite::Error::FromSqlConversionFailure(
                        i,
                        r.values[i].data_type(),
                        Box::new(other),
                    ),
                })
            }
        }
    }
}

/// A PostgreSQL row as SQLite values.
pub struct PgRow {
    names: Vec<String>,
    values: Vec<Value>,
}

impl PgRow {
    fn read(row: &tokio_postgres::Row) -> rusqlite::Result<PgRow> {
        let mut names = Vec::with_capacity(row.len());
        let mut values = Vec::with_capacity(row.len());
        for (i, c) in row.columns().iter().enumerate() {
            names.push(c.name().to_string());
            let v: AsLite = row.try_get(i).map_err(|e| {
                rusqlite::Error::FromSqlConversionFailure(
                    i,
                    rusqlite::types::Type::Null,
                    Box::new(e),
                )
            })?;
            values.push(v.0);
        }
        Ok(PgRow { names, values })
    }
}

/// A PostgreSQL value read as the SQLite value of its type.
struct AsLite(Value);

impl<'a> tokio_postgres::types::FromSql<'a> for AsLite {
    fn from_sql(
        ty: &tokio_postgres::types::Type,
        raw: &'a [u8],
    ) -> std::result::Result<AsLite, Box<dyn std::error::Error + Sync + Send>> {
        use tokio_postgres::types::{FromSql as F, Type};
        let v = match *ty {
            Type::INT2 => Value::Integer(i64::from(i16::from_sql(ty, raw)?)),
            Type::INT4 => Value::Integer(i64::from(i32::from_sql(ty, raw)?)),
            Type::INT8 => Value::Integer(i64::from_sql(ty, raw)?),
            Type::OID => Value::Integer(i64::from(u32::from_sql(ty, raw)?)),
            Type::FLOAT4 => Value::Real(f64::from(f32::from_sql(ty, raw)?)),
            Type::FLOAT8 => Value::Real(f64::from_sql(ty, raw)?),
            Type::BOOL => Value::Integer(i64::from(bool::from_sql(ty, raw)?)),
            Type::BYTEA => Value::Blob(raw.to_vec()),
            Type::NUMERIC => numeric(raw)?,
            // jsonb's binary form is a version byte (1) and the text.
            Type::JSONB => match raw.split_first() {
                Some((1, text)) => Value::Text(std::str::from_utf8(text)?.to_string()),
                _ => return Err("jsonb of an unknown version".into()),
            },
            _ => Value::Text(<&str as F>::from_sql(ty, raw)?.to_string()),
        };
        Ok(AsLite(v))
    }

    fn from_sql_null(
        _: &tokio_postgres::types::Type,
    ) -> std::result::Result<AsLite, Box<dyn std::error::Error + Sync + Send>> {
        Ok(AsLite(Value::Null))
    }

    fn accepts(ty: &tokio_postgres::types::Type) -> bool {
        use tokio_postgres::types::{FromSql as F, Type};
        matches!(
            *ty,
            Type::INT2
                | Type::INT4
                | Type::INT8
                | Type::OID
                | Type::FLOAT4
                | Type::FLOAT8
                | Type::BOOL
                | Type::BYTEA
                | Type::NUMERIC
                | Type::JSONB
        ) || <&str as F>::accepts(ty)
    }
}

/// PostgreSQL's binary NUMERIC (what `sum` of a bigint answers): base-10000 digits with a
/// weight and a sign. An integral value that fits is an integer, anything else a real.
fn numeric(raw: &[u8]) -> std::result::Result<Value, Box<dyn std::error::Error + Sync + Send>> {
    let word = |i: usize| -> std::result::Result<u16, Box<dyn std::error::Error + Sync + Send>> {
        raw.get(i..i + 2)
            .map(|b| u16::from_be_bytes([b[0], b[1]]))
            .ok_or_else(|| "a short numeric".into())
    };
    let ndigits = usize::from(word(0)?);
    let weight = i32::from(word(2)? as i16);
    let sign = word(4)?;
    if sign == 0xC000 {
        return Ok(Value::Real(f64::NAN));
    }
    let mut int: Option<i128> = Some(0);
    let mut fraction = false;
    let mut real = 0.0f64;
    for k in 0..ndigits {
        let d = word(8 + 2 * k)?;
        let power = weight - k as i32;
        real += f64::from(d) * 10000f64.powi(power);
        if power >= 0 {
            int = int.and_then(|v| {
                v.checked_add(i128::from(d).checked_mul(10000i128.checked_pow(power as u32)?)?)
            });
        } else if d != 0 {
            fraction = true;
        }
    }
    let negative = sign == 0x4000;
    if !fraction
        && let Some(v) = int.and_then(|v| i64::try_from(if negative { -v } else { v }).ok())
    {
        return Ok(Value::Integer(v));
    }
    Ok(Value::Real(if negative { -real } else { real }))
}

/// A SQLite value bound to a PostgreSQL placeholder, converted to the type PostgreSQL
/// inferred for it (an integer into a double precision column, a number into text).
#[derive(Debug)]
struct PgValue<'a>(&'a Value);

/// A value `PgValue` binds, owned (a read sent ahead holds its own).
#[derive(Debug)]
struct PgOwned(Value);

impl tokio_postgres::types::ToSql for PgOwned {
    fn to_sql(
        &self,
        ty: &tokio_postgres::types::Type,
        out: &mut bytes::BytesMut,
    ) -> std::result::Result<tokio_postgres::types::IsNull, Box<dyn std::error::Error + Sync + Send>>
    {
        PgValue(&self.0).to_sql(ty, out)
    }

    fn accepts(_: &tokio_postgres::types::Type) -> bool {
        true
    }

    tokio_postgres::types::to_sql_checked!();
}

fn pg_args(values: &[Value]) -> Vec<PgValue<'_>> {
    values.iter().map(PgValue).collect()
}

impl tokio_postgres::types::ToSql for PgValue<'_> {
    fn to_sql(
        &self,
        ty: &tokio_postgres::types::Type,
        out: &mut bytes::BytesMut,
    ) -> std::result::Result<tokio_postgres::types::IsNull, Box<dyn std::error::Error + Sync + Send>>
    {
        use tokio_postgres::types::{IsNull, ToSql as T, Type};
        let textual = matches!(
            *ty,
            Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN
        );
        match (self.0, ty) {
            (Value::Null, _) => Ok(IsNull::Yes),
            (Value::Integer(i), &Type::INT8) => T::to_sql(i, ty, out),
            (Value::Integer(i), &Type::INT4) => T::to_sql(&i32::try_from(*i)?, ty, out),
            (Value::Integer(i), &Type::INT2) => T::to_sql(&i16::try_from(*i)?, ty, out),
            (Value::Integer(i), &Type::FLOAT8) => T::to_sql(&(*i as f64), ty, out),
            (Value::Integer(i), &Type::FLOAT4) => T::to_sql(&(*i as f32), ty, out),
            (Value::Integer(i), &Type::BOOL) => T::to_sql(&(*i != 0), ty, out),
            (Value::Integer(i), &Type::NUMERIC) => numeric_from(*i as f64, out),
            (Value::Integer(i), _) if textual => T::to_sql(&i.to_string().as_str(), ty, out),
            (Value::Real(f), &Type::FLOAT8) => T::to_sql(f, ty, out),
            (Value::Real(f), &Type::FLOAT4) => T::to_sql(&(*f as f32), ty, out),
            (Value::Real(f), &Type::INT8) if f.fract() == 0.0 && f.abs() < 9.0e18 => {
                T::to_sql(&(*f as i64), ty, out)
            }
            (Value::Real(f), &Type::NUMERIC) => numeric_from(*f, out),
            (Value::Real(f), _) if textual => T::to_sql(&f.to_string().as_str(), ty, out),
            (Value::Text(s), &Type::JSON) => {
                out.extend_from_slice(s.as_bytes());
                Ok(IsNull::No)
            }
            (Value::Text(s), &Type::JSONB) => {
                out.extend_from_slice(&[1]);
                out.extend_from_slice(s.as_bytes());
                Ok(IsNull::No)
            }
            (Value::Text(s), &Type::BYTEA) => T::to_sql(&s.as_bytes(), ty, out),
            (Value::Text(s), _) => T::to_sql(&s.as_str(), ty, out),
            (Value::Blob(b), &Type::BYTEA) => T::to_sql(&b.as_slice(), ty, out),
            (Value::Blob(b), _) if textual => T::to_sql(&std::str::from_utf8(b)?, ty, out),
            (v, ty) => Err(format!("a {:?} value cannot be bound as {ty}", v.data_type()).into()),
        }
    }

    fn accepts(_: &tokio_postgres::types::Type) -> bool {
        true
    }

    tokio_postgres::types::to_sql_checked!();
}

/// A number bound to a NUMERIC placeholder, through its text form (PostgreSQL's `numeric_in`
/// is not reachable in binary; `round(x, n)` asks for one).
fn numeric_from(
    f: f64,
    out: &mut bytes::BytesMut,
) -> std::result::Result<tokio_postgres::types::IsNull, Box<dyn std::error::Error + Sync + Send>> {
    // Binary NUMERIC: ndigits, weight, sign, dscale, then base-10000 digits. Only
    // integers are bound as NUMERIC here (a rounding precision).
    if f.fract() != 0.0 || f.abs() >= 1e15 {
        return Err("only an integer is bound as numeric".into());
    }
    let negative = f < 0.0;
    let mut n = f.abs() as u64;
    let mut digits: Vec<u16> = Vec::new();
    while n > 0 {
        digits.push((n % 10000) as u16);
        n /= 10000;
    }
    digits.reverse();
    let weight = digits.len() as i16 - 1;
    out.extend_from_slice(&(digits.len() as u16).to_be_bytes());
    out.extend_from_slice(&weight.max(0).to_be_bytes());
    out.extend_from_slice(&(if negative { 0x4000u16 } else { 0 }).to_be_bytes());
    out.extend_from_slice(&0u16.to_be_bytes());
    for d in digits {
        out.extend_from_slice(&d.to_be_bytes());
    }
    Ok(tokio_postgres::types::IsNull::No)
}

/// Parameters as rusqlite takes them, readable by either backend: `()`, arrays
/// (`[id]`), slices (`params![...]`) and vectors of anything rusqlite can bind.
pub trait Params {
    /// Bind to a SQLite statement in place, from the first placeholder on.
    fn bind_lite(&self, stmt: &mut rusqlite::Statement<'_>) -> rusqlite::Result<()>;
    /// The values, for PostgreSQL.
    fn values(&self) -> rusqlite::Result<Vec<Value>>;
}

fn bind_each<T: ToSql>(items: &[T], stmt: &mut rusqlite::Statement<'_>) -> rusqlite::Result<()> {
    let want = stmt.parameter_count();
    if items.len() != want {
        return Err(rusqlite::Error::InvalidParameterCount(items.len(), want));
    }
    for (i, x) in items.iter().enumerate() {
        stmt.raw_bind_parameter(i + 1, x)?;
    }
    Ok(())
}

fn owned(v: ValueRef<'_>) -> Value {
    match v {
        ValueRef::Null => Value::Null,
        ValueRef::Integer(i) => Value::Integer(i),
        ValueRef::Real(f) => Value::Real(f),
        ValueRef::Text(t) => Value::Text(String::from_utf8_lossy(t).into_owned()),
        ValueRef::Blob(b) => Value::Blob(b.to_vec()),
    }
}

fn values_of<T: ToSql>(items: &[T]) -> rusqlite::Result<Vec<Value>> {
    items
        .iter()
        .map(|x| match x.to_sql()? {
            ToSqlOutput::Borrowed(v) => Ok(owned(v)),
            ToSqlOutput::Owned(v) => Ok(v),
            _ => Err(rusqlite::Error::ToSqlConversionFailure(
                "a parameter only SQLite can bind".into(),
            )),
        })
        .collect()
}

impl Params for () {
    fn bind_lite(&self, stmt: &mut rusqlite::Statement<'_>) -> rusqlite::Result<()> {
        bind_each::<i64>(&[], stmt)
    }
    fn values(&self) -> rusqlite::Result<Vec<Value>> {
        Ok(Vec::new())
    }
}

impl<T: ToSql, const N: usize> Params for [T; N] {
    fn bind_lite(&self, stmt: &mut rusqlite::Statement<'_>) -> rusqlite::Result<()> {
        bind_each(self, stmt)
    }
    fn values(&self) -> rusqlite::Result<Vec<Value>> {
        values_of(self)
    }
}

impl<T: ToSql, const N: usize> Params for &[T; N] {
    fn bind_lite(&self, stmt: &mut rusqlite::Statement<'_>) -> rusqlite::Result<()> {
        bind_each(*self, stmt)
    }
    fn values(&self) -> rusqlite::Result<Vec<Value>> {
        values_of(*self)
    }
}

impl<T: ToSql> Params for &[T] {
    fn bind_lite(&self, stmt: &mut rusqlite::Statement<'_>) -> rusqlite::Result<()> {
        bind_each(self, stmt)
    }
    fn values(&self) -> rusqlite::Result<Vec<Value>> {
        values_of(self)
    }
}

impl<T: ToSql> Params for Vec<T> {
    fn bind_lite(&self, stmt: &mut rusqlite::Statement<'_>) -> rusqlite::Result<()> {
        bind_each(self, stmt)
    }
    fn values(&self) -> rusqlite::Result<Vec<Value>> {
        values_of(self)
    }
}

/// Parameters from an iterator (rusqlite's `params_from_iter`).
pub fn params_from_iter<I: IntoIterator>(items: I) -> Vec<I::Item>
where
    I::Item: ToSql,
{
    items.into_iter().collect()
}

/// SQLite's text of a statement as PostgreSQL's (see the module's comment). Quoted text
/// ('...', "...") is copied as it is.
pub fn to_pg(sql: &str) -> String {
    let b = sql.as_bytes();
    let mut out = String::with_capacity(sql.len() + 16);
    let mut i = 0;
    let mut next_bare = 1;
    let mut or_ignore = false;
    while i < b.len() {
        let c = b[i];
        if c == b'\'' || c == b'"' {
            let start = i;
            i += 1;
            while i < b.len() && b[i] != c {
                i += 1;
            }
            i = (i + 1).min(b.len());
            out.push_str(&sql[start..i]);
            continue;
        }
        if c == b'?' {
            let start = i + 1;
            let mut j = start;
            while j < b.len() && b[j].is_ascii_digit() {
                j += 1;
            }
            if j > start {
                out.push('$');
                out.push_str(&sql[start..j]);
            } else {
                out.push_str(&format!("${next_bare}"));
                next_bare += 1;
            }
            i = j;
            continue;
        }
        if c.is_ascii_alphabetic() || c == b'_' {
            let start = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            let word = &sql[start..i];
            let lower = word.to_ascii_lowercase();
            let prev_dot = start > 0 && b[start - 1] == b'.';
            match lower.as_str() {
                "indexed"
                    if next_word(sql, i).is_some_and(|(w, _)| w.eq_ignore_ascii_case("by")) =>
                {
                    // INDEXED BY <name>: skip the three words and the space before them.
                    let (_, after_by) = next_word(sql, i).expect("checked");
                    while out.ends_with(' ') {
                        out.pop();
                    }
                    i = next_word(sql, after_by).map_or(after_by, |(_, e)| e);
                }
                "not"
                    if next_word(sql, i)
                        .is_some_and(|(w, _)| w.eq_ignore_ascii_case("indexed")) =>
                {
                    // NOT INDEXED (a scan hint): skip both words.
                    i = next_word(sql, i).expect("checked").1;
                    while out.ends_with(' ') {
                        out.pop();
                    }
                }
                "immediate" | "deferred"
                    if out.trim_end().to_ascii_uppercase().ends_with("BEGIN") => {}
                "or" if out.trim_end().to_ascii_uppercase().ends_with("INSERT")
                    && next_word(sql, i).is_some_and(|(w, _)| w.eq_ignore_ascii_case("ignore")) =>
                {
                    let (_, e) = next_word(sql, i).expect("checked");
                    i = e;
                    or_ignore = true;
                    // Drop the space that preceded OR.
                    while out.ends_with(' ') {
                        out.pop();
                    }
                }
                "max" | "min" if !prev_dot && two_args(sql, i) => {
                    out.push_str(if lower == "max" { "greatest" } else { "least" });
                }
                "ifnull" if !prev_dot => out.push_str("coalesce"),
                "json_each" if !prev_dot => out.push_str("json_array_elements_text"),
                "json_valid" if !prev_dot => out.push_str("hookspool_json_valid"),
                "json_extract" if !prev_dot => match json_extract(sql, i) {
                    Some((text, end)) => {
                        out.push_str(&text);
                        i = end;
                    }
                    None => out.push_str(word),
                },
                "cast" if sql[i..].starts_with("(payload AS BLOB)") => {
                    out.push_str("convert_to(payload, 'UTF8')");
                    i += "(payload AS BLOB)".len();
                }
                // `x IS ?N` / `x IS NOT ?N`: SQLite's null-safe comparison with a value.
                "is" if placeholder_follows(sql, i) => out.push_str("IS NOT DISTINCT FROM"),
                "is" if next_word(sql, i).is_some_and(|(w, e)| {
                    w.eq_ignore_ascii_case("not") && placeholder_follows(sql, e)
                }) =>
                {
                    out.push_str("IS DISTINCT FROM");
                    i = next_word(sql, i).expect("checked").1;
                }
                "instr" if !prev_dot => out.push_str("strpos"),
                "rowid" if !prev_dot => out.push_str("ctid"),
                "real" if out.trim_end().to_ascii_uppercase().ends_with(" AS") => {
                    out.push_str("double precision")
                }
                _ => out.push_str(word),
            }
            continue;
        }
        out.push(c as char);
        i += 1;
    }
    let kept = out.trim_end().len();
    out.truncate(kept);
    if or_ignore {
        let upper = out.to_ascii_uppercase();
        match upper.rfind("RETURNING") {
            Some(at) => out.insert_str(at, "ON CONFLICT DO NOTHING "),
            None => {
                let trimmed = out.trim_end().trim_end_matches(';').len();
                out.truncate(trimmed);
                out.push_str(" ON CONFLICT DO NOTHING");
            }
        }
    }
    out
}

/// Whether a placeholder (`?`) is the next thing after position `i`.
fn placeholder_follows(sql: &str, i: usize) -> bool {
    sql[i..].trim_start().starts_with('?')
}

/// `json_extract(doc, '$.a.b')` (its name ends at `i`) with a path of keys as PostgreSQL's
/// `(doc::json #>> '{a,b}')`, the value as text, and where the call ends. `None` for any
/// other path (an index, a path given as a parameter): such a statement is written for
/// PostgreSQL in its module.
fn json_extract(sql: &str, i: usize) -> Option<(String, usize)> {
    let call = call_at(sql, i)?;
    let (open, close) = (call.open, call.close);
    let comma = *call.commas.last()?;
    let doc = to_pg(sql[open + 1..comma].trim());
    let path = sql[comma + 1..close].trim();
    let path = path.strip_prefix("'$.")?.strip_suffix('\'')?;
    let keys: Vec<String> = path
        .split('.')
        .map(|k| k.trim_matches('"').to_string())
        .collect();
    if keys
        .iter()
        .any(|k| k.is_empty() || k.contains(['[', ']', ',', '{', '}', '\'', '"']))
    {
        return None;
    }
    Some((
        format!("(({doc})::json #>> '{{{}}}')", keys.join(",")),
        close + 1,
    ))
}

/// The next word after position `i` (spaces skipped), and where it ends.
fn next_word(sql: &str, i: usize) -> Option<(&str, usize)> {
    let b = sql.as_bytes();
    let mut s = i;
    while s < b.len() && b[s].is_ascii_whitespace() {
        s += 1;
    }
    let mut e = s;
    while e < b.len() && (b[e].is_ascii_alphanumeric() || b[e] == b'_') {
        e += 1;
    }
    (e > s).then(|| (&sql[s..e], e))
}

/// A call whose name ends at `i`: where its `(` and its `)` are and the commas between its
/// top-level arguments (quoted text and nested parentheses skipped).
struct Call {
    open: usize,
    commas: Vec<usize>,
    close: usize,
}

fn call_at(sql: &str, i: usize) -> Option<Call> {
    let b = sql.as_bytes();
    let open = i + b[i..].iter().position(|c| !c.is_ascii_whitespace())?;
    if b[open] != b'(' {
        return None;
    }
    let (mut depth, mut quote, mut commas) = (0, None::<u8>, Vec::new());
    for (k, &c) in b.iter().enumerate().skip(open) {
        if let Some(q) = quote {
            if c == q {
                quote = None;
            }
            continue;
        }
        match c {
            b'\'' | b'"' => quote = Some(c),
            b'(' => depth += 1,
            b')' => {
                depth -= 1;
                if depth == 0 {
                    return Some(Call {
                        open,
                        commas,
                        close: k,
                    });
                }
            }
            b',' if depth == 1 => commas.push(k),
            _ => {}
        }
    }
    None
}

/// Whether the call whose name ends at `i` has two or more arguments: SQLite's scalar
/// `max(a, b)` rather than the aggregate `max(x)`.
fn two_args(sql: &str, i: usize) -> bool {
    call_at(sql, i).is_some_and(|c| !c.commas.is_empty())
}

#[cfg(test)]
mod tests {
    use super::to_pg;

    #[test]
    fn sqlite_text_becomes_postgres_text() {
        assert_eq!(
            to_pg("SELECT id FROM batches INDEXED BY batches_heads WHERE id = ?1 AND k = ?12"),
            "SELECT id FROM batches WHERE id = $1 AND k = $12"
        );
        assert_eq!(to_pg("BEGIN IMMEDIATE"), "BEGIN");
        assert_eq!(
            to_pg(
                "UPDATE b SET r = ?2 WHERE NOT (s = 'x' AND r IS ?2) AND q IS NOT ?3 AND t IS NULL"
            ),
            "UPDATE b SET r = $2 WHERE NOT (s = 'x' AND r IS NOT DISTINCT FROM $2) AND q IS DISTINCT FROM $3 AND t IS NULL"
        );
        assert_eq!(
            to_pg(
                "SELECT json_extract(headers, '$.\"a-b\"') FROM e WHERE json_valid(headers) AND s IN (SELECT value FROM json_each(?1))"
            ),
            "SELECT ((headers)::json #>> '{a-b}') FROM e WHERE hookspool_json_valid(headers) AND s IN (SELECT value FROM json_array_elements_text($1))"
        );
        assert_eq!(
            to_pg(
                "SELECT json_extract((SELECT p FROM e WHERE e.id = ?1), '$.n.m') = 3, json_extract(x, ?2)"
            ),
            "SELECT (((SELECT p FROM e WHERE e.id = $1))::json #>> '{n,m}') = 3, json_extract(x, $2)"
        );
        assert_eq!(
            to_pg("SELECT CASE WHEN raw_is_payload = 1 THEN CAST(payload AS BLOB) ELSE raw END"),
            "SELECT CASE WHEN raw_is_payload = 1 THEN convert_to(payload, 'UTF8') ELSE raw END"
        );
        assert_eq!(
            to_pg("SELECT id FROM batches NOT INDEXED WHERE x IS NOT NULL"),
            "SELECT id FROM batches WHERE x IS NOT NULL"
        );
        assert_eq!(
            to_pg("SELECT max(a, b), max(c), min(x, (1 + 2)) FROM t WHERE s = 'max(1, 2) ?3'"),
            "SELECT greatest(a, b), max(c), least(x, (1 + 2)) FROM t WHERE s = 'max(1, 2) ?3'"
        );
        assert_eq!(
            to_pg("INSERT OR IGNORE INTO dedup (a) VALUES (?1)"),
            "INSERT INTO dedup (a) VALUES ($1) ON CONFLICT DO NOTHING"
        );
        assert_eq!(
            to_pg("INSERT OR IGNORE INTO t (a) VALUES (?) RETURNING id"),
            "INSERT INTO t (a) VALUES ($1) ON CONFLICT DO NOTHING RETURNING id"
        );
        assert_eq!(
            to_pg("DELETE FROM dedup WHERE rowid IN (SELECT rowid FROM dedup LIMIT ?1)"),
            "DELETE FROM dedup WHERE ctid IN (SELECT ctid FROM dedup LIMIT $1)"
        );
        assert_eq!(
            to_pg("SELECT CAST(value AS REAL), ifnull(a, 0), instr(key, ?2) FROM meta"),
            "SELECT CAST(value AS double precision), coalesce(a, 0), strpos(key, $2) FROM meta"
        );
    }
}
