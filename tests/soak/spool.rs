//! What the soak reads from the spool itself (measurement, not product code; the SQLite
//! file, or with `--hosts` the PostgreSQL database in `pg`): the
//! events it holds, the batch states, the issues opened. And the planted fault: one acked
//! event row deleted, to show the checker fails when something acknowledged is gone.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, params};

pub fn open_ro(db: &Path) -> rusqlite::Result<Connection> {
    let c = Connection::open_with_flags(
        db,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    c.busy_timeout(Duration::from_secs(10))?;
    Ok(c)
}

/// Batches a drained spool has none of.
pub fn unfinished(c: &Connection) -> rusqlite::Result<i64> {
    c.query_row(
        "SELECT count(*) FROM batches WHERE state IN ('open','sealed','leased','retry')",
        [],
        |r| r.get(0),
    )
}

pub fn states(c: &Connection) -> rusqlite::Result<BTreeMap<String, i64>> {
    let mut st = c.prepare("SELECT state, count(*) FROM batches GROUP BY state")?;
    let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
    rows.collect()
}

/// (source, dedup id) of every event held.
pub fn stored(c: &Connection) -> rusqlite::Result<HashSet<(String, String)>> {
    let mut st =
        c.prepare("SELECT DISTINCT source, dedup_id FROM events WHERE dedup_id IS NOT NULL")?;
    let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
    rows.collect()
}

/// Issues by kind and state, e.g. ("spool", "open") -> 1.
pub fn issues(c: &Connection) -> rusqlite::Result<Vec<(String, String, String)>> {
    let mut st = c.prepare("SELECT kind, fingerprint, state FROM issues ORDER BY id")?;
    let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
    rows.collect()
}

/// Dead batches: (id, route, last_class, last_error).
pub fn dead(c: &Connection) -> rusqlite::Result<Vec<(i64, String, String, String)>> {
    let mut st = c.prepare(
        "SELECT id, route, coalesce(last_class, ''), coalesce(last_error, '') FROM batches
         WHERE state = 'dead' ORDER BY id",
    )?;
    let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?;
    rows.collect()
}

/// The planted fault: delete one acked event from an open batch that holds at least two
/// (fixing the batch's count and bytes, so the spool stays consistent and the dispatcher
/// delivers the rest). Returns the dedup id deleted, or None when no candidate is there yet.
pub fn plant_loss(db: &Path, acked: &HashSet<String>) -> rusqlite::Result<Option<String>> {
    let mut c = Connection::open(db)?;
    c.busy_timeout(Duration::from_secs(10))?;
    let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let candidates: Vec<(i64, String, i64, i64)> = {
        let mut st = tx.prepare(
            "SELECT e.id, e.dedup_id, e.batch_id, e.size FROM events e
             JOIN batches b ON b.id = e.batch_id
             WHERE b.state = 'open' AND b.count >= 2 AND e.dedup_id IS NOT NULL
             ORDER BY e.id LIMIT 500",
        )?;
        let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?;
        rows.collect::<rusqlite::Result<_>>()?
    };
    let Some((event, dedup, batch, size)) = candidates
        .into_iter()
        .find(|(_, d, _, _)| acked.contains(d))
    else {
        return Ok(None);
    };
    tx.execute("DELETE FROM events WHERE id = ?1", params![event])?;
    tx.execute(
        "UPDATE batches SET count = count - 1, bytes = bytes - ?2 WHERE id = ?1",
        params![batch, size],
    )?;
    tx.commit()?;
    Ok(Some(dedup))
}

/// The same reads on the PostgreSQL spool of `--hosts` (over the bridge, from the root
/// namespace); the planted fault is SQLite's only.
pub mod pg {
    use std::collections::{BTreeMap, HashSet};

    use postgres::{Client, NoTls};

    pub fn connect(url: &str) -> Result<Client, postgres::Error> {
        Client::connect(url, NoTls)
    }

    pub fn unfinished(c: &mut Client) -> Result<i64, postgres::Error> {
        Ok(c.query_one(
            "SELECT count(*) FROM batches WHERE state IN ('open','sealed','leased','retry')",
            &[],
        )?
        .get(0))
    }

    pub fn states(c: &mut Client) -> Result<BTreeMap<String, i64>, postgres::Error> {
        Ok(
            c.query("SELECT state, count(*) FROM batches GROUP BY state", &[])?
                .iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect(),
        )
    }

    pub fn stored(c: &mut Client) -> Result<HashSet<(String, String)>, postgres::Error> {
        Ok(c.query(
            "SELECT DISTINCT source, dedup_id FROM events WHERE dedup_id IS NOT NULL",
            &[],
        )?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect())
    }

    pub fn issues(c: &mut Client) -> Result<Vec<(String, String, String)>, postgres::Error> {
        Ok(c.query(
            "SELECT kind, fingerprint, state FROM issues ORDER BY id",
            &[],
        )?
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect())
    }

    pub fn dead(c: &mut Client) -> Result<Vec<(i64, String, String, String)>, postgres::Error> {
        Ok(c.query(
            "SELECT id, route, coalesce(last_class, ''), coalesce(last_error, '') FROM batches
                 WHERE state = 'dead' ORDER BY id",
            &[],
        )?
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect())
    }
}
