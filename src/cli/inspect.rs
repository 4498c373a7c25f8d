//! `hookspool list` and `hookspool show` (spec 16): read-only views of batches, events and
//! attempts. Payloads are printed only on request, with a warning on a terminal.

use std::io::IsTerminal;

use clap::Args;
use serde_json::json;

use super::{Ctx, Exit, relative, table};
use crate::store::BatchFilter;
use crate::vocab::{AttemptOutcome, BatchState, Klass};

/// The default page of `list`.
pub const LIST_LIMIT_DEFAULT: usize = 50;

#[derive(Debug, Args)]
pub struct ListArgs {
    #[arg(long)]
    pub state: Option<String>,
    #[arg(long)]
    pub source: Option<String>,
    /// `quarantine` lists quarantined requests.
    #[arg(long)]
    pub destination: Option<String>,
    #[arg(long, default_value_t = LIST_LIMIT_DEFAULT)]
    pub limit: usize,
    /// Continue a listing: only batches with an id below this.
    #[arg(long)]
    pub before: Option<i64>,
    /// Only batches whose first event is at or after T (Unix s, RFC 3339, or 2h / 7d ago;
    /// the admin API's `since` filter).
    #[arg(long, value_name = "T")]
    pub since: Option<String>,
    /// Only batches whose first event is before T (the forms --since takes).
    #[arg(long, value_name = "T")]
    pub until: Option<String>,
    /// Only batches whose key contains TEXT, or holding an event whose dedup (provider) id
    /// or event type is TEXT (the admin API's `search` filter).
    #[arg(long, value_name = "TEXT")]
    pub search: Option<String>,
}

#[derive(Debug, Args)]
pub struct ShowArgs {
    pub batch: i64,
    /// List the events (ids, types, sizes, dedup ids, exclusion), no payloads.
    #[arg(long)]
    pub events: bool,
    /// Include each event's payload (may contain personal data or secrets).
    #[arg(long)]
    pub payload: bool,
    #[arg(long)]
    pub attempts: bool,
}

pub fn list(ctx: &Ctx, a: ListArgs) -> Result<(), Exit> {
    let c = ctx.config_for_reading()?;
    let store = ctx.store(&c)?;
    let now = ctx.clock.now();
    let since = a
        .since
        .as_deref()
        .map(|t| super::parse_since(t, now))
        .transpose()?;
    let until = a
        .until
        .as_deref()
        .map(|t| {
            super::parse_since(t, now)
                .map_err(|e| Exit::usage(e.message.replacen("--since", "--until", 1)))
        })
        .transpose()?;
    let rows = store.list_batches(&BatchFilter {
        state: a.state,
        source: a.source,
        destination: a.destination,
        since,
        until,
        before_id: a.before,
        limit: a.limit,
        search: a.search.filter(|s| !s.is_empty()),
        ..Default::default()
    })?;
    if ctx.json {
        ctx.print_json(&json!(rows));
        return Ok(());
    }
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|b| {
            vec![
                b.id.to_string(),
                b.state.to_string(),
                b.source.clone(),
                b.route.clone(),
                b.key.clone(),
                b.destination.clone(),
                b.count.to_string(),
                b.bytes.to_string(),
                relative(now, b.first_at),
                b.last_class
                    .map(Klass::as_str)
                    .unwrap_or_default()
                    .to_string(),
            ]
        })
        .collect();
    say!(
        ctx,
        "{}",
        table(
            &[
                "ID",
                "STATE",
                "SOURCE",
                "ROUTE",
                "KEY",
                "DESTINATION",
                "EVENTS",
                "BYTES",
                "FIRST",
                "LAST CLASS"
            ],
            &body
        )
    );
    if rows.len() == a.limit
        && let Some(last) = rows.last()
    {
        say!(ctx, "(more: --before {})", last.id);
    }
    Ok(())
}

pub fn show(ctx: &Ctx, a: ShowArgs) -> Result<(), Exit> {
    let c = ctx.config_for_reading()?;
    let store = ctx.store(&c)?;
    let b = store.batch(a.batch)?;
    let events = if a.events || a.payload {
        Some(store.events(a.batch, a.payload)?)
    } else {
        None
    };
    let attempts = if a.attempts {
        Some(store.attempts(a.batch)?)
    } else {
        None
    };
    if a.payload && std::io::stdout().is_terminal() {
        eprintln!(
            "warning: payloads may hold personal data or secrets; this prints them to your terminal"
        );
    }
    if ctx.json {
        let mut v = json!({ "batch": b });
        if let Some(e) = &events {
            v["events"] = json!(e);
        }
        if let Some(at) = &attempts {
            v["attempts"] = json!(at);
        }
        ctx.print_json(&v);
        return Ok(());
    }
    let now = ctx.clock.now();
    let opt = |o: Option<f64>| o.map(|t| relative(now, t)).unwrap_or_else(|| "-".into());
    say!(ctx, "batch {}  {}", b.id, b.state);
    say!(
        ctx,
        "  source {}  route {}  key {}",
        b.source,
        b.route,
        b.key
    );
    say!(ctx, "  destination {}", b.destination);
    say!(
        ctx,
        "  events {}  bytes {}  first {}  last {}",
        b.count,
        b.bytes,
        relative(now, b.first_at),
        relative(now, b.last_at)
    );
    say!(
        ctx,
        "  window quiet_s {} max_s {} max_events {} max_bytes {}",
        b.quiet_s,
        b.max_s,
        b.max_events,
        b.max_bytes
    );
    say!(
        ctx,
        "  sealed {}  content_hash {}",
        opt(b.sealed_at),
        b.content_hash.as_deref().unwrap_or("-")
    );
    say!(
        ctx,
        "  attempts {} (counted)  next attempt {}",
        b.attempts,
        opt(b.next_attempt_at)
    );
    if let Some(e) = &b.last_error {
        say!(
            ctx,
            "  last error [{}] {}",
            b.last_class.map_or("-", Klass::as_str),
            e
        );
    }
    if let Some(d) = b.delivered_at {
        say!(
            ctx,
            "  delivered {} {}",
            relative(now, d),
            b.result.as_deref().unwrap_or("")
        );
    }
    if b.state == BatchState::Dead {
        say!(ctx, "  replay with: hookspool replay {}", b.id);
    }
    if let Some(events) = events {
        ctx.say("");
        let rows: Vec<Vec<String>> = events
            .iter()
            .map(|e| {
                vec![
                    e.id.to_string(),
                    e.event_type.clone(),
                    e.size.to_string(),
                    e.dedup_id.clone().unwrap_or_else(|| "-".into()),
                    relative(now, e.received_at),
                    if e.excluded_at.is_some() {
                        "excluded".into()
                    } else {
                        String::new()
                    },
                ]
            })
            .collect();
        say!(
            ctx,
            "{}",
            table(
                &["EVENT", "TYPE", "BYTES", "DEDUP ID", "RECEIVED", ""],
                &rows
            )
        );
        if a.payload {
            for e in &events {
                say!(
                    ctx,
                    "--- event {} payload\n{}",
                    e.id,
                    e.payload.as_deref().unwrap_or("(none: quarantined)")
                );
            }
        }
    }
    if let Some(attempts) = attempts {
        ctx.say("");
        let rows: Vec<Vec<String>> = attempts
            .iter()
            .map(|t| {
                vec![
                    t.n.to_string(),
                    relative(now, t.started_at),
                    t.outcome
                        .map_or("running", AttemptOutcome::as_str)
                        .to_string(),
                    t.klass.map(Klass::as_str).unwrap_or_default().to_string(),
                    t.status.map(|s| s.to_string()).unwrap_or_default(),
                    t.duration_ms.map(|d| format!("{d}ms")).unwrap_or_default(),
                    if t.probe {
                        "probe".into()
                    } else {
                        String::new()
                    },
                    t.error.clone().unwrap_or_default(),
                ]
            })
            .collect();
        say!(
            ctx,
            "{}",
            table(
                &[
                    "N", "STARTED", "OUTCOME", "CLASS", "STATUS", "TOOK", "", "ERROR"
                ],
                &rows
            )
        );
    }
    Ok(())
}
