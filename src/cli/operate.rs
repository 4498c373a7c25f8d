//! The operator's transitions (spec 4.1, 9, 16): replay (and quarantine reclassification),
//! retry, split, exclude, drop, pause and resume. Each is a store transaction with an audit
//! row, done by `crate::ops` (the admin API's actions call the same functions); this file
//! parses, asks for `--yes` where a command cannot be undone, and prints.

use clap::{ArgGroup, Args};
use serde_json::{Value, json};

use super::{Ctx, EXIT_NOT_FOUND, Exit, parse_since, require_yes};
use crate::ops::{self, DeadFilter};
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
    /// Only batches whose first event is before T (the forms --since takes).
    #[arg(long, requires = "dead", value_name = "T")]
    pub until: Option<String>,
    /// Say how many dead batches (and which) the filters match; change nothing.
    #[arg(long, requires = "dead")]
    pub dry_run: bool,
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

pub fn replay(ctx: &Ctx, a: ReplayArgs) -> Result<(), Exit> {
    let c = ctx.config()?;
    let mut store = ctx.store_mut(&c)?;
    let now = ctx.clock.now();
    let ids = match (a.dead, a.batches.is_empty()) {
        (true, true) => {
            let when = |t: &Option<String>, flag: &str| -> Result<Option<f64>, Exit> {
                t.as_deref()
                    .map(|s| {
                        parse_since(s, now)
                            .map_err(|e| Exit::usage(e.message.replacen("--since", flag, 1)))
                    })
                    .transpose()
            };
            let filter = DeadFilter {
                destination: a.destination.clone(),
                source: a.source.clone(),
                since: when(&a.since, "--since")?,
                until: when(&a.until, "--until")?,
            };
            let ids = ops::dead_matching(&store, &filter)?;
            if a.dry_run {
                if ctx.json {
                    ctx.print_json(&json!({"dry_run": true, "count": ids.len(), "batches": ids}));
                } else {
                    let list: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
                    say!(
                        ctx,
                        "{} dead batch(es) would be replayed{}{}; nothing was changed",
                        ids.len(),
                        if ids.is_empty() { "" } else { ": " },
                        list.join(", ")
                    );
                }
                return Ok(());
            }
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
    let done = ops::replay(&c, &mut store, &ids, now)?;
    finish(
        ctx,
        "replay",
        "replayed",
        done.iter().map(ops::Done::row).collect(),
    )
}

pub fn retry(ctx: &Ctx, a: RetryArgs) -> Result<(), Exit> {
    let c = ctx.config()?;
    let mut store = ctx.store_mut(&c)?;
    ops::retry(&mut store, a.batch, ctx.clock.now())?;
    finish(
        ctx,
        "retry",
        "due now",
        vec![json!({"batch": a.batch, "ok": true})],
    )
}

pub fn split(ctx: &Ctx, a: SplitArgs) -> Result<(), Exit> {
    let spec = ops::split_spec(a.max_events, a.max_bytes, a.at)?;
    let c = ctx.config()?;
    let mut store = ctx.store_mut(&c)?;
    let parts = ops::split(&mut store, a.batch, spec, ctx.clock.now())?;
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
    let b = ops::exclude(&mut store, a.batch, &a.events, ctx.clock.now())?;
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
    let done = ops::drop_batches(&mut store, &a.batches, ctx.clock.now())?;
    finish(
        ctx,
        "drop",
        "dropped",
        done.iter().map(ops::Done::row).collect(),
    )
}

pub fn pause(ctx: &Ctx, a: PauseArgs) -> Result<(), Exit> {
    let c = ctx.config()?;
    let mut store = ctx.store_mut(&c)?;
    let by = operator();
    let now = ctx.clock.now();
    ops::pause(
        &c,
        &mut store,
        &a.destination,
        &by,
        a.reason.as_deref(),
        now,
    )?;
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
    ops::resume(&c, &mut store, &a.destination, ctx.clock.now())?;
    if ctx.json {
        ctx.print_json(&json!({"destination": a.destination, "state": "closed"}));
    } else {
        say!(ctx, "{} resumed (closed)", a.destination);
    }
    Ok(())
}
