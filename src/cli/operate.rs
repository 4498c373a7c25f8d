//! The operator's transitions (spec 4.1, 9, 16): replay (and quarantine reclassification),
//! retry, split, exclude, drop, pause and resume. Each is a store transaction with an audit
//! row; this file parses, asks for `--yes` where a command cannot be undone, warns, and
//! lets `observe::issues` resolve what the operator just cleared.

use std::collections::BTreeSet;

use clap::{ArgGroup, Args};
use serde_json::{Value, json};

use super::{Ctx, EXIT_CONFIG, EXIT_NOT_FOUND, Exit, parse_since, require_yes};
use crate::config::Config;
use crate::observe::issues;
use crate::sources::{self, Request, Verdict};
use crate::store::{EnqueueOutcome, SplitSpec, Store, StoredRequest};
use crate::vocab::BatchState;

#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// Dead batches to replay (a quarantine batch is reclassified).
    pub batches: Vec<i64>,
    /// Every dead batch matching the filters below (quarantine batches excluded).
    #[arg(long)]
    pub dead: bool,
    #[arg(long, requires = "dead")]
    pub destination: Option<String>,
    #[arg(long, requires = "dead")]
    pub source: Option<String>,
    /// Only batches whose first event is at or after T (Unix s, RFC 3339, or 2h / 7d ago).
    #[arg(long, requires = "dead", value_name = "T")]
    pub since: Option<String>,
}

#[derive(Debug, Args)]
pub struct RetryArgs {
    pub batch: i64,
}

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("how").required(true).args(["max_events", "max_bytes", "at"])))]
pub struct SplitArgs {
    pub batch: i64,
    /// Parts of at most N events.
    #[arg(long, value_name = "N")]
    pub max_events: Option<i64>,
    /// Parts of at most B bytes (an event larger than B gets a part of its own).
    #[arg(long, value_name = "B")]
    pub max_bytes: Option<i64>,
    /// Two parts: the events before this event id, and the rest.
    #[arg(long, value_name = "EVENT_ID")]
    pub at: Option<i64>,
}

#[derive(Debug, Args)]
pub struct ExcludeArgs {
    pub batch: i64,
    #[arg(required = true)]
    pub events: Vec<i64>,
    /// Required: the document changes for good.
    #[arg(long)]
    pub yes: bool,
}

#[derive(Debug, Args)]
pub struct DropArgs {
    #[arg(required = true)]
    pub batches: Vec<i64>,
    /// Required: dropped batches are never delivered.
    #[arg(long)]
    pub yes: bool,
}

#[derive(Debug, Args)]
pub struct PauseArgs {
    pub destination: String,
    #[arg(long)]
    pub reason: Option<String>,
}

#[derive(Debug, Args)]
pub struct ResumeArgs {
    pub destination: String,
}

/// Who runs the command, for `paused_by`.
fn operator() -> String {
    std::env::var("SUDO_USER")
        .or_else(|_| std::env::var("USER"))
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "operator".into())
}

/// Each batch's result as one JSON row and one text line; the exit code is 1 when any
/// batch failed (the others still happened: each is its own transaction).
fn finish(ctx: &Ctx, verb: &str, past: &str, rows: Vec<Value>) -> Result<(), Exit> {
    let failed = rows.iter().filter(|r| r["ok"] == json!(false)).count();
    if ctx.json {
        ctx.print_json(&json!({ verb: rows }));
    } else {
        for r in &rows {
            let id = &r["batch"];
            match r["error"].as_str() {
                Some(e) => say!(ctx, "batch {id}: not {past}: {e}"),
                None => {
                    let extra = r["note"]
                        .as_str()
                        .map(|n| format!(" ({n})"))
                        .unwrap_or_default();
                    say!(ctx, "batch {id}: {past}{extra}");
                }
            }
            if let Some(w) = r["warning"].as_str() {
                say!(ctx, "  warning: {w}");
            }
        }
    }
    if failed > 0 {
        return Err(Exit::new(
            EXIT_NOT_FOUND,
            format!("{failed} of {} batches could not be {past}", rows.len()),
        ));
    }
    Ok(())
}

fn out_of_order(store: &Store, id: i64) -> Result<Option<String>, Exit> {
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

pub fn replay(ctx: &Ctx, a: ReplayArgs) -> Result<(), Exit> {
    let c = ctx.config()?;
    let mut store = ctx.store_mut(&c)?;
    let now = ctx.clock.now();
    let ids = match (a.dead, a.batches.is_empty()) {
        (true, true) => {
            let since = a
                .since
                .as_deref()
                .map(|s| parse_since(s, now))
                .transpose()?;
            let ids = store.dead_batch_ids(a.destination.as_deref(), a.source.as_deref(), since)?;
            if ids.is_empty() {
                return Err(Exit::new(
                    EXIT_NOT_FOUND,
                    "no dead batches match; nothing to replay",
                ));
            }
            ids
        }
        (false, false) => a.batches.clone(),
        (true, false) => {
            return Err(Exit::new(
                EXIT_NOT_FOUND,
                "name batches or use --dead with filters, not both",
            ));
        }
        (false, true) => {
            return Err(Exit::new(
                EXIT_NOT_FOUND,
                "name the batches to replay, or use --dead [--destination D] [--source S] [--since T]",
            ));
        }
    };
    let mut rows = Vec::with_capacity(ids.len());
    let mut destinations = BTreeSet::new();
    let mut sources = BTreeSet::new();
    for id in ids {
        let is_q = match store.is_quarantine(id) {
            Ok(q) => q,
            Err(e) => {
                rows.push(json!({"batch": id, "ok": false, "error": e.to_string()}));
                continue;
            }
        };
        if is_q {
            match reclassify(&c, &mut store, id, now) {
                Ok((source, row)) => {
                    sources.insert(source);
                    rows.push(row);
                }
                Err(e) => rows.push(json!({"batch": id, "ok": false, "error": e.message})),
            }
            continue;
        }
        let warning = out_of_order(&store, id)?;
        let destination = store.batch(id)?.destination;
        let mut result = store.replay(&[id], now)?;
        match result.pop() {
            Some(Ok(())) => {
                destinations.insert(destination);
                rows.push(json!({"batch": id, "ok": true, "warning": warning}));
            }
            Some(Err(e)) => rows.push(json!({"batch": id, "ok": false, "error": e.to_string()})),
            None => {}
        }
    }
    for d in &destinations {
        issues::dead_batches_cleared(&mut store, d, now)?;
    }
    for s in &sources {
        issues::quarantine_cleared(&mut store, s, now)?;
    }
    finish(ctx, "replay", "replayed", rows)
}

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
fn reclassify(c: &Config, store: &mut Store, id: i64, now: f64) -> Result<(String, Value), Exit> {
    let stored = store.quarantined_requests(id)?;
    let source_name = stored.first().map(|r| r.source.clone()).unwrap_or_default();
    let mut reqs = Vec::new();
    let mut ignored = 0;
    for r in &stored {
        let cfg = c.sources.get(&r.source).ok_or_else(|| {
            Exit::new(
                EXIT_CONFIG,
                format!(
                    "source {} is no longer configured; add [sources.{}] back, or drop the batch",
                    r.source, r.source
                ),
            )
        })?;
        let src = sources::build(&cfg.name, &cfg.kind, &cfg.options)
            .map_err(|e| Exit::new(EXIT_CONFIG, format!("sources.{}: {e}", cfg.name)))?;
        let req = stored_request(r, now);
        let secrets = super::source::ConfigSecrets { refs: &cfg.secrets };
        // The stored request was verified when it arrived (and its auth headers are gone),
        // so classification resumes after verify, as the intake's would have.
        let verdict = sources::flow::accept(src.as_ref(), &req, &secrets).map_err(|e| {
            Exit::new(
                EXIT_NOT_FOUND,
                format!(
                    "event {} still fails classification ({e}); fix the source and replay again",
                    r.event_id
                ),
            )
        })?;
        let Verdict::Accept(acc) = verdict else {
            ignored += 1;
            continue;
        };
        let req = c
            .accepted_request(cfg, src.as_ref(), &req, acc, now)
            .map_err(|e| {
                Exit::new(
                    EXIT_CONFIG,
                    format!("event {} of source {}: {e}", r.event_id, cfg.name),
                )
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
    Ok((
        source_name,
        json!({"batch": id, "ok": true, "note": note, "reclassified": copies}),
    ))
}

pub fn retry(ctx: &Ctx, a: RetryArgs) -> Result<(), Exit> {
    let c = ctx.config()?;
    let mut store = ctx.store_mut(&c)?;
    store.retry_now(a.batch, ctx.clock.now())?;
    finish(
        ctx,
        "retry",
        "due now",
        vec![json!({"batch": a.batch, "ok": true})],
    )
}

pub fn split(ctx: &Ctx, a: SplitArgs) -> Result<(), Exit> {
    let spec = match (a.max_events, a.max_bytes, a.at) {
        (Some(n), _, _) if n >= 1 => SplitSpec::MaxEvents(n),
        (_, Some(b), _) if b >= 1 => SplitSpec::MaxBytes(b),
        (_, _, Some(e)) => SplitSpec::At(e),
        _ => {
            return Err(Exit::new(
                EXIT_NOT_FOUND,
                "--max-events and --max-bytes take a number >= 1",
            ));
        }
    };
    let c = ctx.config()?;
    let mut store = ctx.store_mut(&c)?;
    let now = ctx.clock.now();
    let destination = store.batch(a.batch)?.destination;
    let parts = store.split(a.batch, spec, now)?;
    issues::dead_batches_cleared(&mut store, &destination, now)?;
    if ctx.json {
        ctx.print_json(&json!({"batch": a.batch, "into": parts}));
    } else {
        let list: Vec<String> = parts.iter().map(|p| p.to_string()).collect();
        say!(
            ctx,
            "batch {} split into {} (sealed, due now); the original is dropped with result split",
            a.batch,
            list.join(", ")
        );
    }
    Ok(())
}

pub fn exclude(ctx: &Ctx, a: ExcludeArgs) -> Result<(), Exit> {
    require_yes(a.yes, "exclude")?;
    let c = ctx.config()?;
    let mut store = ctx.store_mut(&c)?;
    store.exclude(a.batch, &a.events, ctx.clock.now())?;
    let b = store.batch(a.batch)?;
    if ctx.json {
        ctx.print_json(
            &json!({"batch": a.batch, "excluded": a.events, "count": b.count,
            "bytes": b.bytes, "content_hash": b.content_hash}),
        );
    } else {
        let list: Vec<String> = a.events.iter().map(|e| e.to_string()).collect();
        say!(
            ctx,
            "batch {}: excluded event(s) {}; {} event(s), {} bytes remain",
            a.batch,
            list.join(", "),
            b.count,
            b.bytes
        );
        if b.state == BatchState::Dead {
            say!(ctx, "  replay it with: hookspool replay {}", a.batch);
        }
    }
    Ok(())
}

pub fn drop(ctx: &Ctx, a: DropArgs) -> Result<(), Exit> {
    require_yes(a.yes, "drop")?;
    let c = ctx.config()?;
    let mut store = ctx.store_mut(&c)?;
    let now = ctx.clock.now();
    let mut owners = Vec::new();
    for id in &a.batches {
        if let Ok(b) = store.batch(*id) {
            owners.push((b.destination, b.source));
        }
    }
    let results = store.drop_batches(&a.batches, now)?;
    let rows: Vec<Value> = a
        .batches
        .iter()
        .zip(results)
        .map(|(id, r)| match r {
            Ok(()) => json!({"batch": id, "ok": true}),
            Err(e) => json!({"batch": id, "ok": false, "error": e.to_string()}),
        })
        .collect();
    for (destination, source) in owners {
        if destination == "quarantine" {
            issues::quarantine_cleared(&mut store, &source, now)?;
        } else {
            issues::dead_batches_cleared(&mut store, &destination, now)?;
        }
    }
    finish(ctx, "drop", "dropped", rows)
}

fn known_destination(c: &Config, store: &Store, name: &str) -> Result<(), Exit> {
    let known = c.destinations.contains_key(name)
        || store.destinations()?.iter().any(|d| d.name == name)
        || store.batch_destinations()?.iter().any(|d| d == name);
    if known {
        Ok(())
    } else {
        Err(Exit::new(
            EXIT_NOT_FOUND,
            format!(
                "destination {name} is not configured and has no batches; check the name (hookspool status lists them)"
            ),
        ))
    }
}

pub fn pause(ctx: &Ctx, a: PauseArgs) -> Result<(), Exit> {
    let c = ctx.config()?;
    let mut store = ctx.store_mut(&c)?;
    known_destination(&c, &store, &a.destination)?;
    let by = operator();
    let now = ctx.clock.now();
    store.pause(&a.destination, &by, a.reason.as_deref(), now)?;
    // Spec 4.2: an operator pause opens (or updates) a delivery issue.
    issues::destination_paused(&mut store, &a.destination, &by, a.reason.as_deref(), now)?;
    if ctx.json {
        ctx.print_json(&json!({"destination": a.destination, "state": "paused", "by": by}));
    } else {
        say!(
            ctx,
            "{} paused by {by}: events keep spooling; hookspool resume {} delivers them",
            a.destination,
            a.destination
        );
    }
    Ok(())
}

pub fn resume(ctx: &Ctx, a: ResumeArgs) -> Result<(), Exit> {
    let c = ctx.config()?;
    let mut store = ctx.store_mut(&c)?;
    known_destination(&c, &store, &a.destination)?;
    let now = ctx.clock.now();
    store.resume(&a.destination, now)?;
    issues::destination_resumed(&mut store, &a.destination, now)?;
    if ctx.json {
        ctx.print_json(&json!({"destination": a.destination, "state": "closed"}));
    } else {
        say!(ctx, "{} resumed (closed)", a.destination);
    }
    Ok(())
}
