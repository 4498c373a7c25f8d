//! Issues and the alert rate limit (spec 3 `issues`, `alerts`; spec 11.4): the SQL behind
//! `observe::issues` and `observe::alerts`. Each write is one transaction. The state rules
//! (what reopens, what never alerts) are decided here so every caller gets the same ones:
//!
//! * unknown fingerprint -> a new `open` row (alerted_at NULL, so it alerts once);
//! * `open` or `acked` -> count + 1, last_at, last_error and sample refreshed, state kept;
//! * `resolved` -> reopened: `open`, alerted_at cleared (one alert per reopening);
//! * `ignored` -> count and last_at only: it never alerts and never reopens.
//!
//! Must not: decide fingerprints or when to open (that is `observe::issues`), or run
//! anything.

use super::db::Row;
use rusqlite::{OptionalExtension, params};
use serde_json::json;

use super::cached::{exec, row};
use super::operator::audit;
use super::{Result, Store, StoreError, set_meta_tx};

/// The issue kinds of the schema's CHECK constraint (spec 11.4).
pub const ISSUE_KINDS: [&str; 4] = ["delivery", "source_silent", "spool", "config"];
/// Issue states an operator can set (`hookspool issues ack|resolve|ignore`).
pub const ISSUE_OPERATOR_STATES: [&str; 3] = ["acked", "resolved", "ignored"];

/// One issue row.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct IssueRow {
    pub id: i64,
    pub fingerprint: String,
    pub kind: String,
    pub destination: Option<String>,
    pub route: Option<String>,
    pub state: String,
    pub first_at: f64,
    pub last_at: f64,
    pub count: i64,
    pub sample_batch_id: Option<i64>,
    pub last_error: Option<String>,
    pub alerted_at: Option<f64>,
}

const ISSUE_COLUMNS: &str = "id, fingerprint, kind, destination, route, state, first_at, last_at,
    count, sample_batch_id, last_error, alerted_at";

impl IssueRow {
    fn from_row(r: &Row<'_>) -> rusqlite::Result<IssueRow> {
        Ok(IssueRow {
            id: r.get(0)?,
            fingerprint: r.get(1)?,
            kind: r.get(2)?,
            destination: r.get(3)?,
            route: r.get(4)?,
            state: r.get(5)?,
            first_at: r.get(6)?,
            last_at: r.get(7)?,
            count: r.get(8)?,
            sample_batch_id: r.get(9)?,
            last_error: r.get(10)?,
            alerted_at: r.get(11)?,
        })
    }
}

/// What opening an issue needs. `last_error` must already be scrubbed (no body, no secret).
#[derive(Debug, Clone, PartialEq)]
pub struct NewIssue {
    pub fingerprint: String,
    pub kind: String,
    pub destination: Option<String>,
    pub route: Option<String>,
    pub sample_batch_id: Option<i64>,
    pub last_error: Option<String>,
}

/// What `issue_open_or_bump` did, with the issue id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase", tag = "change", content = "id")]
pub enum IssueChange {
    Opened(i64),
    Reopened(i64),
    /// Already open or acked: counted.
    Bumped(i64),
    /// Ignored by an operator: counted, nothing else.
    Ignored(i64),
}

impl IssueChange {
    pub fn id(self) -> i64 {
        match self {
            IssueChange::Opened(i)
            | IssueChange::Reopened(i)
            | IssueChange::Bumped(i)
            | IssueChange::Ignored(i) => i,
        }
    }
}

/// The persisted rate limit of one alert kind.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize)]
pub struct AlertRate {
    pub last_at: Option<f64>,
    pub suppressed: i64,
}

impl Store {
    /// Open a new issue, reopen a resolved one, or count another occurrence (module doc).
    pub fn issue_open_or_bump(&mut self, new: &NewIssue, now: f64) -> Result<IssueChange> {
        if !ISSUE_KINDS.contains(&new.kind.as_str()) {
            return Err(StoreError::Invalid(format!(
                "issue kind {:?}; one of {}",
                new.kind,
                ISSUE_KINDS.join(", ")
            )));
        }
        let tx = self.begin()?;
        let existing: Option<(i64, String)> = tx
            .query_row(
                "SELECT id, state FROM issues WHERE fingerprint = ?1",
                [&new.fingerprint],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        let change = match existing {
            None => {
                tx.execute(
                    "INSERT INTO issues (fingerprint, kind, destination, route, state, first_at,
                            last_at, count, sample_batch_id, last_error, alerted_at)
                     VALUES (?1, ?2, ?3, ?4, 'open', ?5, ?5, 1, ?6, ?7, NULL)",
                    params![
                        new.fingerprint,
                        new.kind,
                        new.destination,
                        new.route,
                        now,
                        new.sample_batch_id,
                        new.last_error
                    ],
                )?;
                IssueChange::Opened(tx.last_insert_rowid())
            }
            Some((id, state)) if state == "ignored" => {
                tx.execute(
                    "UPDATE issues SET count = count + 1, last_at = max(last_at, ?2) WHERE id = ?1",
                    params![id, now],
                )?;
                IssueChange::Ignored(id)
            }
            Some((id, state)) => {
                let reopen = state == "resolved";
                tx.execute(
                    "UPDATE issues SET count = count + 1, last_at = max(last_at, ?2),
                            sample_batch_id = coalesce(?3, sample_batch_id),
                            last_error = coalesce(?4, last_error),
                            state = CASE WHEN ?5 THEN 'open' ELSE state END,
                            alerted_at = CASE WHEN ?5 THEN NULL ELSE alerted_at END
                     WHERE id = ?1",
                    params![id, now, new.sample_batch_id, new.last_error, reopen],
                )?;
                if reopen {
                    IssueChange::Reopened(id)
                } else {
                    IssueChange::Bumped(id)
                }
            }
        };
        tx.commit()?;
        Ok(change)
    }

    /// Auto-resolve: `open` or `acked` -> `resolved`. Returns whether a row changed.
    pub fn issue_resolve(&mut self, fingerprint: &str, now: f64) -> Result<bool> {
        // Called after every success, for an issue that is almost never open: a read
        // answers without a write transaction. An issue opened after this read is one
        // opened after the resolve, as if the resolve had run first.
        let open = row(
            &self.conn,
            "SELECT 1 FROM issues WHERE fingerprint = ?1 AND state IN ('open', 'acked')",
            [fingerprint],
            |_| Ok(()),
        )?;
        if open.is_none() {
            return Ok(false);
        }
        let tx = self.begin()?;
        let n = exec(
            &tx,
            "UPDATE issues SET state = 'resolved', last_at = max(last_at, ?2)
             WHERE fingerprint = ?1 AND state IN ('open', 'acked')",
            params![fingerprint, now],
        )?;
        tx.commit()?;
        Ok(n == 1)
    }

    /// An operator's ack, resolve or ignore of issue `id`, with an audit row.
    pub fn issue_set_state(&mut self, id: i64, state: &str, now: f64) -> Result<IssueRow> {
        if !ISSUE_OPERATOR_STATES.contains(&state) {
            return Err(StoreError::Invalid(format!(
                "issue state {state:?}; one of {}",
                ISSUE_OPERATOR_STATES.join(", ")
            )));
        }
        let by = self.actor.clone();
        let tx = self.begin()?;
        let from: String = tx
            .query_row("SELECT state FROM issues WHERE id = ?1", [id], |r| r.get(0))
            .optional()?
            .ok_or_else(|| StoreError::NotFound(format!("issue {id}")))?;
        // Acking is for an issue that is still open; a resolved or ignored one stays put.
        if state == "acked" && from != "open" {
            return Err(StoreError::Invalid(format!(
                "issue {id} is {from}: only an open issue can be acked"
            )));
        }
        tx.execute(
            "UPDATE issues SET state = ?2 WHERE id = ?1",
            params![id, state],
        )?;
        audit(
            &tx,
            by.as_deref(),
            now,
            &format!("issue_{state}"),
            None,
            Some(&id.to_string()),
            json!({ "from": from }),
        )?;
        tx.commit()?;
        self.issue(id)
    }

    /// Whether the issue with this fingerprint is open (a process that did not live to
    /// resolve it may have left it so).
    pub fn issue_is_open(&self, fingerprint: &str) -> Result<bool> {
        Ok(row(
            &self.conn,
            "SELECT 1 FROM issues WHERE fingerprint = ?1 AND state = 'open'",
            [fingerprint],
            |_| Ok(()),
        )?
        .is_some())
    }

    pub fn issue(&self, id: i64) -> Result<IssueRow> {
        let sql = format!("SELECT {ISSUE_COLUMNS} FROM issues WHERE id = ?1");
        self.conn
            .query_row(&sql, [id], IssueRow::from_row)
            .optional()?
            .ok_or_else(|| StoreError::NotFound(format!("issue {id}")))
    }

    pub fn issue_by_fingerprint(&self, fingerprint: &str) -> Result<Option<IssueRow>> {
        let sql = format!("SELECT {ISSUE_COLUMNS} FROM issues WHERE fingerprint = ?1");
        Ok(self
            .conn
            .query_row(&sql, [fingerprint], IssueRow::from_row)
            .optional()?)
    }

    /// Issues in the given states (all when empty), most recent first, at most `limit`.
    pub fn issues(&self, states: &[&str], limit: usize) -> Result<Vec<IssueRow>> {
        let states_json = serde_json::to_string(states).unwrap_or_else(|_| "[]".into());
        let sql = format!(
            "SELECT {ISSUE_COLUMNS} FROM issues
             WHERE json_array_length(?1) = 0 OR state IN (SELECT value FROM json_each(?1))
             ORDER BY last_at DESC, id DESC LIMIT ?2"
        );
        let mut stmt = self.conn.prepare(&sql)?;
        let rows = stmt
            .query_map(
                params![states_json, limit.max(1) as i64],
                IssueRow::from_row,
            )?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    /// Open and acked issues: what `status` and `hookspool_issues_open` count.
    pub fn issues_open_count(&self) -> Result<i64> {
        Ok(self.conn.query_row(
            "SELECT count(*) FROM issues WHERE state IN ('open', 'acked')",
            (),
            |r| r.get(0),
        )?)
    }

    /// Open issues that have not alerted since they (re)opened, oldest first.
    pub fn issues_unalerted(&self) -> Result<Vec<IssueRow>> {
        let sql = format!(
            "SELECT {ISSUE_COLUMNS} FROM issues WHERE state = 'open' AND alerted_at IS NULL
             ORDER BY id"
        );
        let mut stmt = self.conn.prepare(&sql)?;
        let rows = stmt
            .query_map((), IssueRow::from_row)?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    pub fn alert_rate(&self, kind: &str) -> Result<AlertRate> {
        Ok(self
            .conn
            .query_row(
                "SELECT last_at, suppressed FROM alerts WHERE kind = ?1",
                [kind],
                |r| {
                    Ok(AlertRate {
                        last_at: r.get(0)?,
                        suppressed: r.get(1)?,
                    })
                },
            )
            .optional()?
            .unwrap_or_default())
    }

    /// How many issues of `kind` the rate limit is holding back right now.
    pub fn alert_set_suppressed(&mut self, kind: &str, suppressed: i64) -> Result<()> {
        let tx = self.begin()?;
        tx.execute(
            "INSERT INTO alerts (kind, last_at, suppressed) VALUES (?1, NULL, ?2)
             ON CONFLICT(kind) DO UPDATE SET suppressed = excluded.suppressed",
            params![kind, suppressed],
        )?;
        tx.commit()?;
        Ok(())
    }

    /// An alert for `kind` went out (or was recorded dry) at `now` and covered `issue_ids`:
    /// alerted_at is set on them, the rate limit restarts, and the failure mark is cleared.
    /// A dry run also keeps the text in the audit trail, which is what "records" means.
    pub fn alert_sent(
        &mut self,
        kind: &str,
        issue_ids: &[i64],
        now: f64,
        dry_text: Option<&str>,
    ) -> Result<()> {
        let tx = self.begin()?;
        for id in issue_ids {
            tx.execute(
                "UPDATE issues SET alerted_at = ?2 WHERE id = ?1 AND state = 'open'",
                params![id, now],
            )?;
        }
        tx.execute(
            "INSERT INTO alerts (kind, last_at, suppressed) VALUES (?1, ?2, 0)
             ON CONFLICT(kind) DO UPDATE SET last_at = excluded.last_at, suppressed = 0",
            params![kind, now],
        )?;
        tx.execute("DELETE FROM meta WHERE key = ?1", [alert_failed_key(kind)])?;
        if let Some(text) = dry_text {
            audit(
                &tx,
                None,
                now,
                "alert_dry",
                None,
                Some(kind),
                json!({ "issues": issue_ids, "text": text }),
            )?;
        }
        tx.commit()?;
        Ok(())
    }

    /// The alert command failed at `now`: remembered so the next try waits a little.
    pub fn alert_failed(&mut self, kind: &str, now: f64) -> Result<()> {
        let tx = self.begin()?;
        set_meta_tx(&tx, &alert_failed_key(kind), &now.to_string())?;
        tx.commit()?;
        Ok(())
    }

    pub fn alert_failed_at(&self, kind: &str) -> Result<Option<f64>> {
        Ok(self
            .meta(&alert_failed_key(kind))?
            .and_then(|v| v.parse::<f64>().ok()))
    }

    /// Texts recorded by dry-run alerts, oldest first: (at, kind, text).
    pub fn dry_alerts(&self) -> Result<Vec<(f64, String, String)>> {
        let mut stmt = self.conn.prepare(
            "SELECT at, target, json_extract(detail, '$.text') FROM audit
             WHERE action = 'alert_dry' ORDER BY id",
        )?;
        let rows = stmt
            .query_map((), |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }
}

fn alert_failed_key(kind: &str) -> String {
    format!("alerts:{kind}:failed_at")
}
