//! Statements through the connection's statement cache: the hot paths (the intake's
//! enqueue, the dispatcher's claims, marks and reads) run the same few statements again and
//! again, so each is parsed and planned once per connection (issue 13's profiles showed
//! SQLite's parser at a fifth to a third of the time without it). Owns no SQL of its own
//! beyond the savepoint's; it must not hold statements across calls.

use rusqlite::OptionalExtension;

use super::db::{Connection, Params, Row};

use super::Result;

/// `execute` through the statement cache.
pub(super) fn exec(conn: &Connection, sql: &str, params: impl Params) -> Result<usize> {
    Ok(conn.prepare_cached(sql)?.execute(params)?)
}

/// Assert a transition: `n`, what its statement changed, is the one row the transaction
/// read in the state the transition starts from (the statement's WHERE names that state).
/// Any other count means the spool broke an invariant: the error abandons the transaction,
/// so nothing is written, and `StoreError::Corrupt` stops the service, which systemd
/// restarts on the intact spool (STYLE: assertions on every state transition).
pub(super) fn one_row(n: usize, what: impl FnOnce() -> String) -> Result<()> {
    if n == 1 {
        Ok(())
    } else {
        Err(super::StoreError::Corrupt(format!(
            "{}: changed {n} rows, not 1",
            what()
        )))
    }
}

/// An optional one-row query through the statement cache.
pub(super) fn row<T>(
    conn: &Connection,
    sql: &str,
    params: impl Params,
    f: impl FnOnce(&Row<'_>) -> rusqlite::Result<T>,
) -> Result<Option<T>> {
    Ok(conn.prepare_cached(sql)?.query_row(params, f).optional()?)
}

/// Run `f` (one PostgreSQL statement) with planner settings of its own: `set` (`SET LOCAL`
/// statements) before it and `reset` after it, both deferred to the next statement (no
/// round trip of their own). `reset` is sent only when `f` succeeded: after a failure the
/// transaction (or the savepoint around `f`) is rolled back, which undoes `set`, and a
/// deferred statement sent into an aborted transaction would fail the ROLLBACK sent with
/// it. Outside a transaction `SET LOCAL` would do nothing, so `f` runs as it is. `reset`
/// (`SET LOCAL ... TO DEFAULT`) gives the setting its session default, which discards a
/// `SET` of the session's own (`Store::plan_on_indexes`, the intake writer's): not for a
/// setting such a session sets.
pub(super) fn planned_with<T>(
    conn: &Connection,
    set: &str,
    reset: &str,
    f: impl FnOnce() -> Result<T>,
) -> Result<T> {
    if conn.is_autocommit() {
        return f();
    }
    exec(conn, set, ())?;
    let r = f()?;
    exec(conn, reset, ())?;
    Ok(r)
}

/// The savepoint one item of a group (a request, a claim) runs in. Its three statements are
/// cached too (rusqlite's `Savepoint` prepares its SQL anew each time).
const SAVEPOINT_SQL: &str = "SAVEPOINT item";
const RELEASE_SQL: &str = "RELEASE item";
const ROLLBACK_TO_SQL: &str = "ROLLBACK TO item";

/// Run `f` inside a savepoint and keep its writes only when `keep` says so of its result
/// (otherwise they are rolled back alone). The outer `Err` means the savepoint statements
/// themselves failed, which leaves the transaction in an unknown state, so the caller must
/// abandon it.
pub(super) fn in_savepoint_if<T>(
    conn: &Connection,
    f: impl FnOnce() -> T,
    keep: impl FnOnce(&T) -> bool,
) -> Result<T> {
    exec(conn, SAVEPOINT_SQL, ())?;
    let r = f();
    if !keep(&r) {
        exec(conn, ROLLBACK_TO_SQL, ())?;
    }
    exec(conn, RELEASE_SQL, ())?;
    Ok(r)
}

/// What one item of a group did, for `each_in_savepoints`.
pub(super) enum Step<T> {
    /// Written, or refused before writing anything: kept as it is.
    Keep(T),
    /// Failed after it may have written: its writes must be undone, and only its own.
    Undo(T),
}

/// Run `f` for every item of a group (the intake's requests, a tick's claims) inside the
/// caller's transaction, each item's writes kept or undone alone as `f` says.
///
/// The group runs first under ONE savepoint: a savepoint per item made SQLite copy every
/// page that earlier items had changed into its undo journal before changing it again, and
/// ran two more statements per item (issue 13: 5 % of the intake's writer, 3 % of the
/// dispatcher). Only when an item answers `Undo` is the group rolled back and run again,
/// each item in a savepoint of its own, rolled back when it answers `Undo`: the results are
/// those the per-item savepoints would have given from the start. An `Err` from `f` ends
/// the call with the group undone; the caller abandons the transaction.
pub(super) fn each_in_savepoints<I, T>(
    conn: &Connection,
    items: &[I],
    mut f: impl FnMut(&I) -> Result<Step<T>>,
) -> Result<Vec<T>> {
    let grouped = in_savepoint_if(
        conn,
        || -> Result<Option<Vec<T>>> {
            let mut out = Vec::with_capacity(items.len());
            for item in items {
                match f(item)? {
                    Step::Keep(t) => out.push(t),
                    Step::Undo(_) => return Ok(None),
                }
            }
            Ok(Some(out))
        },
        |r| matches!(r, Ok(Some(_))),
    )??;
    if let Some(out) = grouped {
        return Ok(out);
    }
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        let step = in_savepoint_if(conn, || f(item), |r| matches!(r, Ok(Step::Keep(_))))??;
        out.push(match step {
            Step::Keep(t) | Step::Undo(t) => t,
        });
    }
    Ok(out)
}

/// A write transaction of the spool (`Store::begin`), its BEGIN, COMMIT and ROLLBACK cached
/// like the statements inside it. Inside a tick's transaction (`Store::begin_tick`) it is a
/// savepoint of that transaction instead, committed with it. Dropped without `commit`, it
/// rolls back (a failed COMMIT too).
pub(super) struct Tx<'a> {
    conn: &'a Connection,
    nest: Nest,
    open: bool,
}

/// Whether a `Tx` is the transaction itself or a part of the tick's.
#[derive(Clone, Copy)]
enum Nest {
    Top,
    Part,
}

const BEGIN_SQL: &str = "BEGIN IMMEDIATE";
const COMMIT_SQL: &str = "COMMIT";
const ROLLBACK_SQL: &str = "ROLLBACK";
const PART_SQL: &str = "SAVEPOINT tick_part";
const PART_RELEASE_SQL: &str = "RELEASE tick_part";
const PART_ROLLBACK_SQL: &str = "ROLLBACK TO tick_part";

impl<'a> Tx<'a> {
    /// `BEGIN IMMEDIATE` (every write in the spool starts this way, spec 2), or a savepoint
    /// when a transaction is already open on `conn` (the tick's).
    pub(super) fn begin(conn: &'a Connection) -> Result<Tx<'a>> {
        let nest = if conn.is_autocommit() {
            exec(conn, BEGIN_SQL, ())?;
            Nest::Top
        } else {
            exec(conn, PART_SQL, ())?;
            Nest::Part
        };
        Ok(Tx {
            conn,
            nest,
            open: true,
        })
    }

    pub(super) fn commit(mut self) -> Result<()> {
        if self.ended_with_statement() {
            self.open = false;
            return Ok(());
        }
        match self.nest {
            Nest::Top => exec(self.conn, COMMIT_SQL, ())?,
            Nest::Part => exec(self.conn, PART_RELEASE_SQL, ())?,
        };
        self.open = false;
        Ok(())
    }
}

impl Tx<'_> {
    /// On PostgreSQL, a transaction of its own commits with the next statement, its COMMIT
    /// sent in the same write (`Connection::commit_with_next`): asked right before its last
    /// statement, `commit` then has nothing left to do (a failure of that statement rolls
    /// it back; one refused before it was sent leaves it open, and dropped, this rolls it
    /// back). Nothing on SQLite, or for a part of the tick's transaction.
    pub(super) fn commit_with_next(&self) {
        if matches!(self.nest, Nest::Top) && self.conn.is_pg() {
            self.conn.commit_with_next(true);
        }
    }

    /// A PostgreSQL transaction that a statement in it committed (or rolled back): its own
    /// (`commit_with_next`), or the tick's that this is a part of
    /// (`Store::claim_many_and_commit_tick`). Nothing is left to commit, release or roll
    /// back.
    fn ended_with_statement(&self) -> bool {
        self.conn.is_pg() && self.conn.is_autocommit()
    }
}

impl std::ops::Deref for Tx<'_> {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        self.conn
    }
}

impl Drop for Tx<'_> {
    fn drop(&mut self) {
        if !self.open || self.ended_with_statement() {
            return;
        }
        // Errors are ignored as rusqlite's own Transaction ignores them on drop: a failed
        // rollback leaves SQLite rolling back itself (the connection's next statement or
        // its close).
        match self.nest {
            Nest::Top => {
                let _ = exec(self.conn, ROLLBACK_SQL, ());
            }
            Nest::Part => {
                let _ = exec(self.conn, PART_ROLLBACK_SQL, ());
                let _ = exec(self.conn, PART_RELEASE_SQL, ());
            }
        }
    }
}
