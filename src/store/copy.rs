//! `hookspool spool copy` (issue 32): a whole spool from SQLite into an empty PostgreSQL
//! spool, or back, in ONE transaction on the destination, then verified inside that
//! transaction before it commits: the rows of every table (their count and a SHA-256 over
//! their values in key order) equal the source's, and every batch's content_hash
//! recomputed from the copied events equals the one recomputed from the source's. The
//! source is read in one snapshot and read again afterwards: a source that changed meanwhile
//! (a service still running) rolls the copy back. Ids are kept (webhook-ids, the audit trail
//! and every operator command name them), so is `meta.instance_id`; `meta.schema_version`
//! is each backend's own and is not copied.
//!
//! Must not: write into a destination that holds any row outside `meta`, or leave half a
//! copy (nothing is committed unless every check passed). The callers hold the spools' locks.

use super::db::Connection;
use rusqlite::types::ValueRef;
use sha2::{Digest, Sha256};
use tokio_postgres::types::ToSql;

use super::content::{CanonicalEvent, content_hash};
use super::pg::{PgStore, pg_error};
use super::{Result, Store, StoreError};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ty {
    Int,
    Real,
    Text,
    Blob,
}

/// A table as the copy reads and writes it: its columns in order and the key that orders
/// its rows (the same on both backends: PostgreSQL compares text keys as bytes, `COLLATE
/// "C"`, as SQLite does).
struct Table {
    name: &'static str,
    order: &'static str,
    /// Identity column whose sequence PostgreSQL must move past the copied ids.
    identity: Option<&'static str>,
    cols: &'static [(&'static str, Ty)],
}

use Ty::{Blob, Int, Real, Text};

/// Every table, parents before children (events reference batches).
const TABLES: &[Table] = &[
    Table {
        name: "meta",
        order: "key",
        identity: None,
        cols: &[("key", Text), ("value", Text)],
    },
    Table {
        name: "batches",
        order: "id",
        identity: Some("id"),
        cols: &[
            ("id", Int),
            ("route", Text),
            ("source", Text),
            ("destination", Text),
            ("key", Text),
            ("state", Text),
            ("first_at", Real),
            ("last_at", Real),
            ("quiet_s", Real),
            ("max_s", Real),
            ("max_events", Int),
            ("max_bytes", Int),
            ("not_before", Real),
            ("count", Int),
            ("bytes", Int),
            ("sealed_at", Real),
            ("content_hash", Text),
            ("attempts", Int),
            ("next_attempt_at", Real),
            ("lease_until", Real),
            ("lease_owner", Text),
            ("last_error", Text),
            ("last_class", Text),
            ("delivered_at", Real),
            ("result", Text),
            ("dropped_at", Real),
            ("first_event_id", Int),
            ("finished", Int),
            ("open_hash", Text),
        ],
    },
    Table {
        name: "events",
        order: "id",
        identity: Some("id"),
        cols: &[
            ("id", Int),
            ("source", Text),
            ("route", Text),
            ("batch_id", Int),
            ("event_type", Text),
            ("dedup_id", Text),
            ("received_at", Real),
            ("payload", Text),
            ("raw", Blob),
            ("headers", Text),
            ("size", Int),
            ("excluded_at", Real),
            ("raw_is_payload", Int),
        ],
    },
    Table {
        name: "dedup",
        order: "source, dedup_id",
        identity: None,
        cols: &[
            ("source", Text),
            ("dedup_id", Text),
            ("event_id", Int),
            ("seen_at", Real),
            ("dup_count", Int),
        ],
    },
    Table {
        name: "attempts",
        order: "id",
        identity: Some("id"),
        cols: &[
            ("id", Int),
            ("batch_id", Int),
            ("n", Int),
            ("destination", Text),
            ("started_at", Real),
            ("finished_at", Real),
            ("outcome", Text),
            ("klass", Text),
            ("status", Int),
            ("error", Text),
            ("duration_ms", Int),
            ("probe", Int),
            ("counted", Int),
            ("delivery_id", Text),
            ("events_delivered", Int),
            ("failed_event_id", Int),
        ],
    },
    Table {
        name: "destinations",
        order: "name",
        identity: None,
        cols: &[
            ("name", Text),
            ("state", Text),
            ("consecutive_failures", Int),
            ("opened_at", Real),
            ("cooldown_s", Real),
            ("probe_until", Real),
            ("last_probe_batch_id", Int),
            ("paused_at", Real),
            ("paused_by", Text),
            ("last_ok_at", Real),
            ("last_error", Text),
            ("retry_after_until", Real),
        ],
    },
    Table {
        name: "issues",
        order: "id",
        identity: Some("id"),
        cols: &[
            ("id", Int),
            ("fingerprint", Text),
            ("kind", Text),
            ("destination", Text),
            ("route", Text),
            ("state", Text),
            ("first_at", Real),
            ("last_at", Real),
            ("count", Int),
            ("sample_batch_id", Int),
            ("last_error", Text),
            ("alerted_at", Real),
        ],
    },
    Table {
        name: "alerts",
        order: "kind",
        identity: None,
        cols: &[("kind", Text), ("last_at", Real), ("suppressed", Int)],
    },
    Table {
        name: "audit",
        order: "id",
        identity: Some("id"),
        cols: &[
            ("id", Int),
            ("at", Real),
            ("action", Text),
            ("batch_id", Int),
            ("target", Text),
            ("detail", Text),
        ],
    },
    Table {
        name: "polls",
        order: "instance",
        identity: None,
        cols: &[
            ("instance", Text),
            ("next_at", Real),
            ("last_tick_at", Real),
            ("last_batch_id", Int),
            ("delivered_at", Real),
            ("delivered_tick_at", Real),
            ("skipped", Int),
            ("created_at", Real),
        ],
    },
    Table {
        name: "rejections",
        order: "hour, source, reason",
        identity: None,
        cols: &[
            ("hour", Int),
            ("source", Text),
            ("reason", Text),
            ("count", Int),
        ],
    },
];

/// The meta rows each backend keeps for itself.
const META_OWN: &str = "schema_version";

/// One value as both backends hold it.
#[derive(Debug, Clone, PartialEq)]
enum Val {
    Null,
    Int(i64),
    Real(f64),
    Text(String),
    Blob(Vec<u8>),
}

/// What a copy found, table by table.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct CopyReport {
    /// (table, rows copied), each equal on both sides in count and content.
    pub tables: Vec<(String, i64)>,
    /// Batches with a content_hash, each recomputed from the copied events and found equal
    /// to the one recomputed from the source's.
    pub hashes_recomputed: i64,
    /// Of those, how many equal the stored content_hash (all frozen batches do; a delivered
    /// batch whose events retention removed does not).
    pub hashes_equal_to_stored: i64,
}

impl CopyReport {
    pub fn rows(&self, table: &str) -> i64 {
        self.tables
            .iter()
            .find(|(t, _)| t == table)
            .map(|(_, n)| *n)
            .unwrap_or(0)
    }
}

/// A table's rows as a count and a digest over their values in key order.
#[derive(Debug, Clone, PartialEq, Default)]
struct Tally {
    rows: i64,
    digest: [u8; 32],
}

struct Hasher {
    rows: i64,
    h: Sha256,
}

impl Hasher {
    fn new() -> Hasher {
        Hasher {
            rows: 0,
            h: Sha256::new(),
        }
    }
    fn row(&mut self, row: &[Val]) {
        self.rows += 1;
        for v in row {
            match v {
                Val::Null => self.h.update([0u8]),
                Val::Int(i) => {
                    self.h.update([1u8]);
                    self.h.update(i.to_be_bytes());
                }
                Val::Real(f) => {
                    self.h.update([2u8]);
                    self.h.update(f.to_bits().to_be_bytes());
                }
                Val::Text(s) => {
                    self.h.update([3u8]);
                    self.h.update((s.len() as u64).to_be_bytes());
                    self.h.update(s.as_bytes());
                }
                Val::Blob(b) => {
                    self.h.update([4u8]);
                    self.h.update((b.len() as u64).to_be_bytes());
                    self.h.update(b);
                }
            }
        }
    }
    fn done(self) -> Tally {
        Tally {
            rows: self.rows,
            digest: self.h.finalize().into(),
        }
    }
}

fn select_sql(t: &Table, pg: bool) -> String {
    let cols: Vec<&str> = t.cols.iter().map(|(c, _)| *c).collect();
    let order: Vec<String> = t
        .order
        .split(", ")
        .map(|k| {
            let text = t.cols.iter().any(|(c, ty)| *c == k && *ty == Text);
            if pg && text {
                format!("{k} COLLATE \"C\"")
            } else {
                k.to_string()
            }
        })
        .collect();
    let skip = if t.name == "meta" {
        format!(" WHERE key <> '{META_OWN}'")
    } else {
        String::new()
    };
    format!(
        "SELECT {} FROM {}{skip} ORDER BY {}",
        cols.join(", "),
        t.name,
        order.join(", ")
    )
}

fn insert_sql(t: &Table, pg: bool) -> String {
    let cols: Vec<&str> = t.cols.iter().map(|(c, _)| *c).collect();
    let marks: Vec<String> = (1..=cols.len())
        .map(|i| if pg { format!("${i}") } else { format!("?{i}") })
        .collect();
    format!(
        "INSERT INTO {} ({}) VALUES ({})",
        t.name,
        cols.join(", "),
        marks.join(", ")
    )
}

/// One side of a copy: the source read in a snapshot, or the destination written in its
/// transaction (and read back there before it commits).
trait Side {
    fn each_row(&mut self, t: &Table, f: &mut dyn FnMut(&[Val]) -> Result<()>) -> Result<()>;
    fn insert(&mut self, t: &Table, row: &[Val]) -> Result<()>;
    /// The first table outside `meta` that holds a row.
    fn first_nonempty(&mut self) -> Result<Option<&'static str>>;
    /// Remove the meta rows the copy replaces (all but the schema version).
    fn clear_meta(&mut self) -> Result<()>;
    /// After every insert: move identity sequences past the copied ids.
    fn after_inserts(&mut self) -> Result<()>;
    fn canonical_events(&mut self, batch_id: i64) -> Result<Vec<CanonicalEvent>>;
    /// (batch id, stored content_hash) of every batch that has one, in id order.
    fn hashed_batches(&mut self) -> Result<Vec<(i64, String)>>;

    fn tally(&mut self, t: &Table) -> Result<Tally> {
        let mut h = Hasher::new();
        self.each_row(t, &mut |row| {
            h.row(row);
            Ok(())
        })?;
        Ok(h.done())
    }
}

struct Lite<'a>(&'a Connection);

impl Lite<'_> {
    fn value(t: &Table, i: usize, v: ValueRef<'_>) -> Result<Val> {
        let (col, ty) = t.cols[i];
        let bad = |what: &str| {
            StoreError::Corrupt(format!(
                "{}.{col} holds {what} where the schema says {ty:?}",
                t.name
            ))
        };
        Ok(match (ty, v) {
            (_, ValueRef::Null) => Val::Null,
            (Int, ValueRef::Integer(i)) => Val::Int(i),
            (Int, ValueRef::Real(f)) if f.fract() == 0.0 && f.abs() < 9.0e15 => Val::Int(f as i64),
            (Real, ValueRef::Real(f)) => Val::Real(f),
            (Real, ValueRef::Integer(i)) => Val::Real(i as f64),
            (Text, ValueRef::Text(b)) => {
                Val::Text(String::from_utf8(b.to_vec()).map_err(|_| bad("text that is not UTF-8"))?)
            }
            (Blob, ValueRef::Blob(b) | ValueRef::Text(b)) => Val::Blob(b.to_vec()),
            (_, other) => return Err(bad(&format!("a {:?} value", other.data_type()))),
        })
    }
}

impl Side for Lite<'_> {
    fn each_row(&mut self, t: &Table, f: &mut dyn FnMut(&[Val]) -> Result<()>) -> Result<()> {
        let lite = self.0.lite().ok_or_else(|| {
            StoreError::Invalid("the SQLite side of a copy is a PostgreSQL spool".into())
        })?;
        let mut stmt = lite.prepare(&select_sql(t, false))?;
        let mut rows = stmt.query(())?;
        let mut vals = Vec::with_capacity(t.cols.len());
        while let Some(r) = rows.next()? {
            vals.clear();
            for i in 0..t.cols.len() {
                vals.push(Lite::value(t, i, r.get_ref(i)?)?);
            }
            f(&vals)?;
        }
        Ok(())
    }

    fn insert(&mut self, t: &Table, row: &[Val]) -> Result<()> {
        use rusqlite::types::Value;
        let params: Vec<Value> = row
            .iter()
            .map(|v| match v {
                Val::Null => Value::Null,
                Val::Int(i) => Value::Integer(*i),
                Val::Real(f) => Value::Real(*f),
                Val::Text(s) => Value::Text(s.clone()),
                Val::Blob(b) => Value::Blob(b.clone()),
            })
            .collect();
        self.0
            .prepare_cached(&insert_sql(t, false))?
            .execute(super::db::params_from_iter(params))?;
        Ok(())
    }

    fn first_nonempty(&mut self) -> Result<Option<&'static str>> {
        for t in TABLES.iter().filter(|t| t.name != "meta") {
            let any: bool = self.0.query_row(
                &format!("SELECT EXISTS (SELECT 1 FROM {})", t.name),
                (),
                |r| r.get(0),
            )?;
            if any {
                return Ok(Some(t.name));
            }
        }
        Ok(None)
    }

    fn clear_meta(&mut self) -> Result<()> {
        self.0
            .execute(&format!("DELETE FROM meta WHERE key <> '{META_OWN}'"), ())?;
        Ok(())
    }

    fn after_inserts(&mut self) -> Result<()> {
        // INTEGER PRIMARY KEY takes max(id) + 1 by itself.
        Ok(())
    }

    fn canonical_events(&mut self, batch_id: i64) -> Result<Vec<CanonicalEvent>> {
        super::delivery::canonical_events(self.0, batch_id)
    }

    fn hashed_batches(&mut self) -> Result<Vec<(i64, String)>> {
        let mut stmt = self.0.prepare(
            "SELECT id, content_hash FROM batches WHERE content_hash IS NOT NULL ORDER BY id",
        )?;
        let rows = stmt
            .query_map((), |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }
}

struct Pg<'a, 'b> {
    tx: &'a mut super::pg::client::Transaction<'b>,
    target: String,
    /// Each table's INSERT, prepared once.
    inserts: std::collections::HashMap<&'static str, tokio_postgres::Statement>,
}

impl<'a, 'b> Pg<'a, 'b> {
    fn new(tx: &'a mut super::pg::client::Transaction<'b>, target: &str) -> Pg<'a, 'b> {
        Pg {
            tx,
            target: target.to_string(),
            inserts: Default::default(),
        }
    }
}

impl Pg<'_, '_> {
    fn err(&self, e: tokio_postgres::Error) -> StoreError {
        pg_error(&self.target, &e)
    }

    fn value(
        t: &Table,
        i: usize,
        r: &tokio_postgres::Row,
    ) -> std::result::Result<Val, tokio_postgres::Error> {
        Ok(match t.cols[i].1 {
            Int => r.try_get::<_, Option<i64>>(i)?.map_or(Val::Null, Val::Int),
            Real => r.try_get::<_, Option<f64>>(i)?.map_or(Val::Null, Val::Real),
            Text => r
                .try_get::<_, Option<String>>(i)?
                .map_or(Val::Null, Val::Text),
            Blob => r
                .try_get::<_, Option<Vec<u8>>>(i)?
                .map_or(Val::Null, Val::Blob),
        })
    }
}

impl Side for Pg<'_, '_> {
    fn each_row(&mut self, t: &Table, f: &mut dyn FnMut(&[Val]) -> Result<()>) -> Result<()> {
        let target = self.target.clone();
        let err = |e: tokio_postgres::Error| pg_error(&target, &e);
        let mut vals = Vec::with_capacity(t.cols.len());
        self.tx
            .for_each_row(&select_sql(t, true), |r| -> Result<()> {
                vals.clear();
                for i in 0..t.cols.len() {
                    vals.push(Pg::value(t, i, &r).map_err(err)?);
                }
                f(&vals)
            })
            .map_err(err)?
    }

    fn insert(&mut self, t: &Table, row: &[Val]) -> Result<()> {
        let boxed: Vec<Box<dyn ToSql + Sync>> = row
            .iter()
            .zip(t.cols)
            .map(|(v, (_, ty))| -> Box<dyn ToSql + Sync> {
                match (v, ty) {
                    (Val::Null, Int) => Box::new(None::<i64>),
                    (Val::Null, Real) => Box::new(None::<f64>),
                    (Val::Null, Text) => Box::new(None::<String>),
                    (Val::Null, Blob) => Box::new(None::<Vec<u8>>),
                    (Val::Int(i), _) => Box::new(*i),
                    (Val::Real(f), _) => Box::new(*f),
                    (Val::Text(s), _) => Box::new(s.clone()),
                    (Val::Blob(b), _) => Box::new(b.clone()),
                }
            })
            .collect();
        let params: Vec<&(dyn ToSql + Sync)> = boxed.iter().map(|b| b.as_ref()).collect();
        let stmt = match self.inserts.get(t.name) {
            Some(s) => s.clone(),
            None => {
                let s = self
                    .tx
                    .prepare(&insert_sql(t, true))
                    .map_err(|e| self.err(e))?;
                self.inserts.insert(t.name, s.clone());
                s
            }
        };
        self.tx.execute(&stmt, &params).map_err(|e| {
            let e = self.err(e);
            StoreError::Invalid(format!("copying a row of {}: {e}", t.name))
        })?;
        Ok(())
    }

    fn first_nonempty(&mut self) -> Result<Option<&'static str>> {
        for t in TABLES.iter().filter(|t| t.name != "meta") {
            let any: bool = self
                .tx
                .query_one(&format!("SELECT EXISTS (SELECT 1 FROM {})", t.name), &[])
                .map_err(|e| self.err(e))?
                .get(0);
            if any {
                return Ok(Some(t.name));
            }
        }
        Ok(None)
    }

    fn clear_meta(&mut self) -> Result<()> {
        self.tx
            .execute(&format!("DELETE FROM meta WHERE key <> '{META_OWN}'"), &[])
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    fn after_inserts(&mut self) -> Result<()> {
        for t in TABLES {
            if let Some(col) = t.identity {
                let sql = format!(
                    "SELECT setval(pg_get_serial_sequence('{0}', '{col}'),
                                   coalesce((SELECT max({col}) FROM {0}), 0) + 1, false)",
                    t.name
                );
                self.tx.execute(&sql, &[]).map_err(|e| self.err(e))?;
            }
        }
        Ok(())
    }

    fn canonical_events(&mut self, batch_id: i64) -> Result<Vec<CanonicalEvent>> {
        let rows = self
            .tx
            .query(
                "SELECT id, event_type, received_at, dedup_id, payload FROM events
                 WHERE batch_id = $1 AND excluded_at IS NULL ORDER BY id",
                &[&batch_id],
            )
            .map_err(|e| self.err(e))?;
        Ok(rows
            .iter()
            .map(|r| CanonicalEvent {
                id: r.get(0),
                event_type: r.get(1),
                received_at: r.get(2),
                dedup_id: r.get(3),
                payload: r.get(4),
            })
            .collect())
    }

    fn hashed_batches(&mut self) -> Result<Vec<(i64, String)>> {
        let rows = self
            .tx
            .query(
                "SELECT id, content_hash FROM batches WHERE content_hash IS NOT NULL ORDER BY id",
                &[],
            )
            .map_err(|e| self.err(e))?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }
}

/// What `copy` found, with what it read from the source in its snapshot, for the second
/// read that proves the source did not change meanwhile.
struct Copied {
    report: CopyReport,
    tallies: Vec<Tally>,
    hashed: Vec<(i64, String)>,
}

/// The copy itself, from `src` (in its snapshot) into `dst` (in its transaction); checks
/// everything `CopyReport` states.
fn copy(src: &mut dyn Side, dst: &mut dyn Side, dst_name: &str) -> Result<Copied> {
    if let Some(t) = dst.first_nonempty()? {
        return Err(StoreError::Invalid(format!(
            "{dst_name} is not an empty spool (its {t} table holds rows): spool copy writes only into an empty one; nothing was written"
        )));
    }
    dst.clear_meta()?;
    let mut src_tallies = Vec::new();
    let mut tables = Vec::new();
    for t in TABLES {
        let mut h = Hasher::new();
        src.each_row(t, &mut |row| {
            h.row(row);
            dst.insert(t, row)
        })?;
        let tally = h.done();
        tables.push((t.name.to_string(), tally.rows));
        src_tallies.push(tally);
    }
    dst.after_inserts()?;
    for (t, want) in TABLES.iter().zip(&src_tallies) {
        let got = dst.tally(t)?;
        if got != *want {
            return Err(StoreError::Corrupt(format!(
                "the copy of {} differs from the source ({} rows copied, {} read back); nothing was written",
                t.name, want.rows, got.rows
            )));
        }
    }
    let hashed = src.hashed_batches()?;
    if dst.hashed_batches()? != hashed {
        return Err(StoreError::Corrupt(
            "the copied batches' content_hash differ from the source's; nothing was written".into(),
        ));
    }
    let mut equal_to_stored = 0;
    for (id, stored) in &hashed {
        let unreadable =
            |e: super::UnreadablePayload| StoreError::Corrupt(format!("batch {id}: {e}"));
        let mine = content_hash(&dst.canonical_events(*id)?).map_err(unreadable)?;
        let theirs = content_hash(&src.canonical_events(*id)?).map_err(unreadable)?;
        if mine != theirs {
            return Err(StoreError::Corrupt(format!(
                "batch {id}: the content_hash recomputed from the copied events differs from the source's; nothing was written"
            )));
        }
        equal_to_stored += i64::from(mine == *stored);
    }
    let report = CopyReport {
        tables,
        hashes_recomputed: hashed.len() as i64,
        hashes_equal_to_stored: equal_to_stored,
    };
    Ok(Copied {
        report,
        tallies: src_tallies,
        hashed,
    })
}

fn changed(target: &str) -> StoreError {
    StoreError::Invalid(format!(
        "the source spool changed while it was copied, so a service still writes to it: stop hookspool-intake.socket, hookspool-intake.service and hookspool-dispatch.service (or hookspool run) and copy again; nothing was written to {target}"
    ))
}

impl Store {
    /// Copy this SQLite spool into the empty PostgreSQL spool `dst` (migrated to its
    /// current schema), verified before it commits.
    pub fn copy_to_pg(&mut self, dst: &mut PgStore) -> Result<CopyReport> {
        let target = dst.target().to_string();
        let err = |e: tokio_postgres::Error| pg_error(&target, &e);
        let mut tx = dst.client.transaction();
        super::cached::exec(&self.conn, "BEGIN DEFERRED", ())?;
        let result = {
            let mut d = Pg::new(&mut tx, &target);
            copy(
                &mut Lite(&self.conn),
                &mut d,
                &format!("the PostgreSQL database {target}"),
            )
        };
        // The snapshot ends; what the source holds now must be what was copied.
        let ended = super::cached::exec(&self.conn, "ROLLBACK", ());
        let Copied {
            report,
            tallies,
            hashed,
        } = result?;
        ended?;
        let mut now = Lite(&self.conn);
        for (t, was) in TABLES.iter().zip(&tallies) {
            if now.tally(t)? != *was {
                return Err(changed(&target));
            }
        }
        if now.hashed_batches()? != hashed {
            return Err(changed(&target));
        }
        tx.commit().map_err(err)?;
        Ok(report)
    }
}

impl PgStore {
    /// Copy this PostgreSQL spool into the empty SQLite spool `dst`, verified before it
    /// commits.
    pub fn copy_to_sqlite(&mut self, dst: &mut Store) -> Result<CopyReport> {
        let target = self.target().to_string();
        let dst_name = format!("the SQLite spool {}", dst.path().display());
        let report = {
            let mut snap = self
                .client
                .transaction_as("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY");
            let tx = dst.begin()?;
            let r = copy(&mut Pg::new(&mut snap, &target), &mut Lite(&tx), &dst_name)?;
            // Read the source again outside the snapshot before committing.
            drop(snap);
            let mut again = self.client.transaction();
            let mut now = Pg::new(&mut again, &target);
            for (t, was) in TABLES.iter().zip(&r.tallies) {
                if now.tally(t)? != *was {
                    return Err(changed(&dst_name));
                }
            }
            if now.hashed_batches()? != r.hashed {
                return Err(changed(&dst_name));
            }
            drop(again);
            tx.commit()?;
            r.report
        };
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::req;
    use super::super::testutil::{temp_pg as temp_pg_store, temp_sqlite_store as temp_store}; // the copy's SQLite side
    use super::*;

    /// A service still writing to the source while it is copied (another connection
    /// committing events throughout): the copy sees the source changed, says so, and leaves
    /// the destination as empty as it found it.
    #[test]
    fn a_source_written_during_the_copy_rolls_the_copy_back() {
        let Some((_cluster, mut dst)) = temp_pg_store() else {
            return;
        };
        let (dir, mut src) = temp_store();
        let reqs: Vec<_> = (0..2000)
            .map(|i| req("r", &format!("k{}", i % 50), "{\"n\":1}", 10.0 + i as f64))
            .collect();
        src.enqueue_many(&reqs).unwrap();
        let path = dir.path().join("spool.db");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let written = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let writer = {
            let (stop, written) = (stop.clone(), written.clone());
            std::thread::spawn(move || {
                let mut w = Store::open(
                    &path,
                    super::super::Role::Reader,
                    std::time::Duration::from_secs(5),
                )
                .unwrap();
                let mut n = 0;
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    n += 1;
                    w.enqueue(&req("w", "k", "{\"n\":2}", 1e5 + n as f64))
                        .unwrap();
                    written.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
            })
        };
        while written.load(std::sync::atomic::Ordering::SeqCst) == 0 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let result = src.copy_to_pg(&mut dst);
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        writer.join().unwrap();
        let err = result
            .expect_err("a source that changed is refused")
            .to_string();
        assert!(err.contains("changed while it was copied"), "{err}");
        assert_eq!(
            dst.batch_counts()
                .unwrap()
                .iter()
                .map(|(_, n)| n)
                .sum::<i64>(),
            0,
            "nothing was committed"
        );
    }

    /// The copy names every column of every table of the latest SQLite schema, so a column
    /// a later migration adds cannot be left behind unnoticed.
    #[test]
    fn the_copy_knows_every_table_and_column_of_the_schema() {
        let (_dir, store) = temp_store();
        let tables: Vec<String> = store
            .conn
            .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
            .unwrap()
            .query_map((), |r| r.get(0))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        let mut mine: Vec<String> = TABLES.iter().map(|t| t.name.to_string()).collect();
        mine.sort();
        assert_eq!(mine, tables);
        for t in TABLES {
            let cols: Vec<(String, String)> = store
                .conn
                .prepare(&format!(
                    "SELECT name, type FROM pragma_table_info('{}')",
                    t.name
                ))
                .unwrap()
                .query_map((), |r| Ok((r.get(0)?, r.get(1)?)))
                .unwrap()
                .collect::<rusqlite::Result<_>>()
                .unwrap();
            let want: Vec<(String, String)> = t
                .cols
                .iter()
                .map(|(c, ty)| {
                    let sql = match ty {
                        Int => "INTEGER",
                        Real => "REAL",
                        Text => "TEXT",
                        Blob => "BLOB",
                    };
                    (c.to_string(), sql.to_string())
                })
                .collect();
            assert_eq!(cols, want, "table {}", t.name);
        }
    }
}
