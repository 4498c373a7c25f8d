//! Statements through the connection's statement cache: the hot paths (the intake's
//! enqueue, the dispatcher's claims, marks and reads) run the same few statements again and
//! again, so each is parsed and planned once per connection (issue 13's profiles showed
//! SQLite's parser at a fifth to a third of the time without it). Owns no SQL of its own
//! beyond the savepoint's; it must not hold statements across calls.

use rusqlite::{Connection, OptionalExtension, Params, Row};

use super::Result;

/// `execute` through the statement cache.
pub(super) fn exec(conn: &Connection, sql: &str, params: impl Params) -> Result<usize> {
    Ok(conn.prepare_cached(sql)?.execute(params)?)
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

/// A one-row query that always answers (an aggregate, a count) through the statement cache.
pub(super) fn one<T>(
    conn: &Connection,
    sql: &str,
    params: impl Params,
    f: impl FnOnce(&Row<'_>) -> rusqlite::Result<T>,
) -> Result<T> {
    Ok(conn.prepare_cached(sql)?.query_row(params, f)?)
}

/// The savepoint one item of a group (a request, a claim) runs in. Its three statements are
/// cached too (rusqlite's `Savepoint` prepares its SQL anew each time).
const SAVEPOINT_SQL: &str = "SAVEPOINT item";
const RELEASE_SQL: &str = "RELEASE item";
const ROLLBACK_TO_SQL: &str = "ROLLBACK TO item";

/// Run `f` inside a savepoint: its writes are kept when it succeeds and undone alone when it
/// fails. The outer
/// `Err` means the savepoint statements themselves failed, which leaves the transaction in an
/// unknown state, so the caller must abandon it.
pub(super) fn in_savepoint<T>(
    conn: &Connection,
    f: impl FnOnce() -> Result<T>,
) -> Result<Result<T>> {
    in_savepoint_if(conn, f, |r| r.is_ok())
}

/// Run `f` inside a savepoint and keep its writes only when `keep` says so of its result
/// (otherwise they are rolled back alone). The outer `Err` as for `in_savepoint`.
pub(super) fn in_savepoint_if<T>(
    conn: &Connection,
    f: impl FnOnce() -> T,
    keep: impl FnOnce(&T) -> bool,
) -> Result<T> {
    exec(conn, SAVEPOINT_SQL, [])?;
    let r = f();
    if !keep(&r) {
        exec(conn, ROLLBACK_TO_SQL, [])?;
    }
    exec(conn, RELEASE_SQL, [])?;
    Ok(r)
}
