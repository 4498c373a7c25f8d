//! The operator's actions (spec 4.1, 9, 16; issue 31: one code path for each operation):
//! replay (ids, or the dead batches a filter matches; a quarantine batch is reclassified),
//! retry, split, exclude, drop, pause, resume, and an issue's ack / resolve / ignore. The
//! CLI (`cli::operate`, `cli::issues`) and the admin API (`admin::api`) both call these;
//! each is the store's transaction with its audit row, then `observe::issues` resolves what
//! the operator just cleared.
//!
//! Must not: import `cli` or `admin`, print, or ask for confirmation (`--yes` and the
//! CSRF header are the callers' gates); who acts is the store connection's actor
//! (`Store::set_actor`), so the audit rows say it.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use crate::config::Config;
use crate::observe::issues;
use crate::sources::{self, Request, Verdict};
use crate::store::{
    BatchRow, EnqueueOutcome, IssueRow, SplitSpec, Store, StoreError, StoredRequest,
};

/// Why an action did not happen.
#[derive(Debug, thiserror::Error)]
pub enum OpError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The config no longer allows it (a quarantined request's source is gone or broken).
    #[error("{0}")]
    Config(String),
    /// Nothing to act on (no such destination or issue, no batch matches, a bad size); the
    /// message says what to send instead.
    #[error("{0}")]
    Refused(String),
}

/// One batch's result in a replay or drop: `row` is the CLI's JSON row.
#[derive(Debug)]
pub struct Done {
    pub batch: i64,
    /// The row's extra fields when it happened (`warning`, `note`, `reclassified`).
    pub result: Result<Value, OpError>,
}

impl Done {
    /// `{"batch", "ok": true, ...}` or `{"batch", "ok": false, "error"}`.
    pub fn row(&self) -> Value {
        match &self.result {
            Ok(extra) => {
                let mut row = json!({"batch": self.batch, "ok": true});
                if let (Some(r), Some(e)) = (row.as_object_mut(), extra.as_object()) {
                    r.extend(e.clone());
                }
                row
            }
            Err(e) => json!({"batch": self.batch, "ok": false, "error": e.to_string()}),
        }
    }
}

/// The filter of a bulk replay: dead batches (quarantine excluded) whose first event is in
/// [since, until), of this destination and source.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeadFilter {
    pub destination: Option<String>,
    pub source: Option<String>,
    pub since: Option<f64>,
    pub until: Option<f64>,
}

/// The dead batches `f` matches, oldest first (what a bulk replay, or its dry run, takes).
pub fn dead_matching(store: &Store, f: &DeadFilter) -> Result<Vec<i64>, OpError> {
    Ok(store.dead_batch_ids(
        f.destination.as_deref(),
        f.source.as_deref(),
        f.since,
        f.until,
    )?)
}

fn out_of_order(store: &Store, id: i64) -> Result<Option<String>, OpError> {
    let later = store.later_delivered_in_group(id)?;
    if later == 0 {
        return Ok(None);
    }
    let b = store.batch(id)?;
    Ok(Some(format!(
        "{later} newer batch(es) of group (route {}, key {}) were already delivered; the destination gets this one out of order",
        b.route, b.key
    )))
}

/// Replay each batch (dead -> retry, due now; a quarantine batch is reclassified), each in
/// its own transaction, then resolve the dead-batch and quarantine issues cleared.
pub fn replay(c: &Config, store: &mut Store, ids: &[i64], now: f64) -> Result<Vec<Done>, OpError> {
    let mut done = Vec::with_capacity(ids.len());
    let mut destinations = BTreeSet::new();
    let mut sources = BTreeSet::new();
    for &id in ids {
        let is_q = match store.is_quarantine(id) {
            Ok(q) => q,
            Err(e) => {
                done.push(Done {
                    batch: id,
                    result: Err(e.into()),
                });
                continue;
            }
        };
        if is_q {
            match reclassify(c, store, id, now) {
                Ok((source, extra)) => {
                    sources.insert(source);
                    done.push(Done {
                        batch: id,
                        result: Ok(extra),
                    });
                }
                Err(e) => done.push(Done {
                    batch: id,
                    result: Err(e),
                }),
            }
            continue;
        }
        let warning = out_of_order(store, id)?;
        let destination = store.batch(id)?.destination;
        let mut result = store.replay(&[id], now)?;
        match result.pop() {
            Some(Ok(())) => {
                destinations.insert(destination);
                done.push(Done {
                    batch: id,
                    result: Ok(json!({"warning": warning})),
                });
            }
            Some(Err(e)) => done.push(Done {
                batch: id,
                result: Err(e.into()),
            }),
            None => {}
        }
    }
    for d in &destinations {
        issues::dead_batches_cleared(store, d, now)?;
    }
    for s in &sources {
        issues::quarantine_cleared(store, s, now)?;
    }
    Ok(done)
}

pub use crate::secret::ConfigSecrets;

/// The stored request as the source sees it again.
fn stored_request(r: &StoredRequest, now: f64) -> Request {
    let mut req = Request::new("POST", &format!("/hooks/{}", r.source), now);
    if let Ok(Value::Object(h)) = serde_json::from_str::<Value>(&r.headers) {
        for (k, v) in h {
            if let Some(v) = v.as_str() {
                req = req.with_header(&k, v);
            }
        }
    }
    req.body = r.raw.clone().unwrap_or_default();
    req
}

/// Re-run classification for every request of quarantine batch `id` through the (fixed)
/// source and move them to normal batches in one transaction. Nothing changes if any
/// request still fails.
fn reclassify(
    c: &Config,
    store: &mut Store,
    id: i64,
    now: f64,
) -> Result<(String, Value), OpError> {
    let stored = store.quarantined_requests(id)?;
    let source_name = stored.first().map(|r| r.source.clone()).unwrap_or_default();
    let mut reqs = Vec::new();
    let mut ignored = 0;
    for r in &stored {
        let cfg = c.sources.get(&r.source).ok_or_else(|| {
            OpError::Config(format!(
                "source {} is no longer configured; add [sources.{}] back, or drop the batch",
                r.source, r.source
            ))
        })?;
        let src = sources::build(&cfg.name, &cfg.kind, &cfg.options)
            .map_err(|e| OpError::Config(format!("sources.{}: {e}", cfg.name)))?;
        let req = stored_request(r, now);
        let secrets = ConfigSecrets::new(&cfg.secrets);
        // The stored request was verified when it arrived (and its auth headers are gone),
        // so classification resumes after verify, as the intake's would have.
        let verdict = sources::flow::accept(src.as_ref(), &req, &secrets).map_err(|e| {
            OpError::Refused(format!(
                "event {} still fails classification ({e}); fix the source and replay again",
                r.event_id
            ))
        })?;
        let Verdict::Accept(acc) = verdict else {
            ignored += 1;
            continue;
        };
        let req = c
            .accepted_request(cfg, src.as_ref(), &req, acc, now)
            .map_err(|e| {
                OpError::Config(format!("event {} of source {}: {e}", r.event_id, cfg.name))
            })?;
        reqs.push(req);
    }
    let outcomes = store.reclassify_quarantine(id, &reqs, now)?;
    let copies: Vec<Value> = outcomes
        .iter()
        .map(|o| match o {
            EnqueueOutcome::Queued { copies } => json!({
                "status": "queued",
                "copies": copies.iter().map(|(e, b, r)| json!({"event": e, "batch": b, "route": r})).collect::<Vec<_>>(),
            }),
            other => json!({"status": other.status_word()}),
        })
        .collect();
    let note = format!(
        "reclassified: {} event(s) queued, {ignored} ignored",
        reqs.len()
    );
    Ok((source_name, json!({"note": note, "reclassified": copies})))
}

/// retry -> due now (skip the backoff).
pub fn retry(store: &mut Store, id: i64, now: f64) -> Result<(), OpError> {
    Ok(store.retry_now(id, now)?)
}

/// How to split, from the CLI's flags or the API's body: the first one given.
pub fn split_spec(
    max_events: Option<i64>,
    max_bytes: Option<i64>,
    at: Option<i64>,
) -> Result<SplitSpec, OpError> {
    match (max_events, max_bytes, at) {
        (Some(n), _, _) if n >= 1 => Ok(SplitSpec::MaxEvents(n)),
        (_, Some(b), _) if b >= 1 => Ok(SplitSpec::MaxBytes(b)),
        (_, _, Some(e)) => Ok(SplitSpec::At(e)),
        _ => Err(OpError::Refused(
            "--max-events and --max-bytes take a number >= 1".into(),
        )),
    }
}

/// Cut a batch into parts (sealed, due now); the original is dropped with result split.
pub fn split(store: &mut Store, id: i64, spec: SplitSpec, now: f64) -> Result<Vec<i64>, OpError> {
    let destination = store.batch(id)?.destination;
    let parts = store.split(id, spec, now)?;
    issues::dead_batches_cleared(store, &destination, now)?;
    Ok(parts)
}

/// Exclude events from a batch's document; the batch as it is after.
pub fn exclude(store: &mut Store, id: i64, events: &[i64], now: f64) -> Result<BatchRow, OpError> {
    store.exclude(id, events, now)?;
    Ok(store.batch(id)?)
}

/// Drop each batch (its own transaction), then resolve the issues cleared.
pub fn drop_batches(store: &mut Store, ids: &[i64], now: f64) -> Result<Vec<Done>, OpError> {
    let mut owners = Vec::new();
    for id in ids {
        if let Ok(b) = store.batch(*id) {
            owners.push((b.destination, b.source));
        }
    }
    let results = store.drop_batches(ids, now)?;
    let done = ids
        .iter()
        .zip(results)
        .map(|(id, r)| Done {
            batch: *id,
            result: r.map(|()| json!({})).map_err(OpError::from),
        })
        .collect();
    for (destination, source) in owners {
        if destination == "quarantine" {
            issues::quarantine_cleared(store, &source, now)?;
        } else {
            issues::dead_batches_cleared(store, &destination, now)?;
        }
    }
    Ok(done)
}

fn known_destination(c: &Config, store: &Store, name: &str) -> Result<(), OpError> {
    let known = c.destinations.contains_key(name)
        || store.destinations()?.iter().any(|d| d.name == name)
        || store.batch_destinations()?.iter().any(|d| d == name);
    if known {
        Ok(())
    } else {
        Err(OpError::Refused(format!(
            "destination {name} is not configured and has no batches; check the name (hookspool status lists them)"
        )))
    }
}

/// Pause a destination (spool only) and open its delivery issue (spec 4.2).
pub fn pause(
    c: &Config,
    store: &mut Store,
    destination: &str,
    by: &str,
    reason: Option<&str>,
    now: f64,
) -> Result<(), OpError> {
    known_destination(c, store, destination)?;
    store.pause(destination, by, reason, now)?;
    issues::destination_paused(store, destination, by, reason, now)?;
    Ok(())
}

/// Resume a destination (closed, counters reset) and resolve its pause issue.
pub fn resume(c: &Config, store: &mut Store, destination: &str, now: f64) -> Result<(), OpError> {
    known_destination(c, store, destination)?;
    store.resume(destination, now)?;
    issues::destination_resumed(store, destination, now)?;
    Ok(())
}

/// The id of the issue an operator named by id or fingerprint.
pub fn issue_id(store: &Store, named: &str) -> Result<i64, OpError> {
    if let Ok(id) = named.parse::<i64>() {
        return Ok(id);
    }
    match store.issue_by_fingerprint(named)? {
        Some(row) => Ok(row.id),
        None => Err(OpError::Refused(format!(
            "no issue has the fingerprint {named:?}; hookspool issues --all lists them"
        ))),
    }
}

/// An operator's ack (`acked`), resolve (`resolved`) or ignore (`ignored`) of an issue
/// named by id or fingerprint.
pub fn set_issue(
    store: &mut Store,
    named: &str,
    state: &str,
    now: f64,
) -> Result<IssueRow, OpError> {
    let id = issue_id(store, named)?;
    Ok(store.issue_set_state(id, state, now)?)
}
