//! `hookspool issues [list|ack|resolve|ignore <id|fingerprint>]` (spec 11.4, 16). Listing
//! shows open and acked issues (all with `--all`), newest activity first, paged by
//! `--limit`. An issue is named by its id or by its fingerprint (`config:file`,
//! `delivery:http:audit:paused`), which stays the same across reopenings.

use clap::{Args, Subcommand};
use serde_json::json;

use super::{Ctx, Exit, relative, table};
use crate::store::IssueRow;

/// The default page of `issues list`.
pub const ISSUES_LIMIT_DEFAULT: usize = 50;

#[derive(Debug, Args)]
pub struct IssuesArgs {
    #[command(subcommand)]
    pub action: Option<IssuesAction>,
    /// Include resolved and ignored issues (listing only).
    #[arg(long)]
    pub all: bool,
    #[arg(long, default_value_t = ISSUES_LIMIT_DEFAULT)]
    pub limit: usize,
}

#[derive(Debug, Subcommand)]
pub enum IssuesAction {
    /// Open and acked issues (the default).
    List,
    /// Seen: no more alerts until it resolves and reopens.
    Ack {
        /// The issue's id, or its fingerprint.
        issue: String,
    },
    /// Resolve by hand (ignored-answer issues resolve only this way).
    Resolve {
        /// The issue's id, or its fingerprint.
        issue: String,
    },
    /// Never alert or reopen again (use sparingly).
    Ignore {
        /// The issue's id, or its fingerprint.
        issue: String,
    },
}

pub fn run(ctx: &Ctx, a: IssuesArgs) -> Result<(), Exit> {
    let c = ctx.config_for_reading()?;
    let mut store = ctx.store(&c)?;
    let now = ctx.clock.now();
    let (id, state) = match a.action.unwrap_or(IssuesAction::List) {
        IssuesAction::List => {
            let states: &[&str] = if a.all { &[] } else { &["open", "acked"] };
            let rows = store.issues(states, a.limit)?;
            if ctx.json {
                ctx.print_json(&json!(rows));
            } else if rows.is_empty() {
                ctx.say(if a.all { "no issues" } else { "no open issues" });
            } else {
                ctx.say(render(&rows, now));
                if rows.len() == a.limit {
                    say!(ctx, "(showing {}; raise --limit for more)", a.limit);
                }
            }
            return Ok(());
        }
        IssuesAction::Ack { issue } => (issue, "acked"),
        IssuesAction::Resolve { issue } => (issue, "resolved"),
        IssuesAction::Ignore { issue } => (issue, "ignored"),
    };
    let row = crate::ops::set_issue(&mut store, &id, state, now)?;
    let id = row.id;
    if ctx.json {
        ctx.print_json(&json!(row));
    } else {
        say!(ctx, "issue {id} {state}: {}", row.fingerprint);
    }
    Ok(())
}

fn render(rows: &[IssueRow], now: f64) -> String {
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|i| {
            vec![
                i.id.to_string(),
                i.state.clone(),
                i.kind.clone(),
                i.fingerprint.clone(),
                i.count.to_string(),
                relative(now, i.first_at),
                relative(now, i.last_at),
                i.sample_batch_id
                    .map(|b| b.to_string())
                    .unwrap_or_else(|| "-".into()),
                if i.alerted_at.is_some() { "yes" } else { "no" }.into(),
                i.last_error.clone().unwrap_or_default(),
            ]
        })
        .collect();
    table(
        &[
            "ID",
            "STATE",
            "KIND",
            "FINGERPRINT",
            "COUNT",
            "FIRST",
            "LAST",
            "BATCH",
            "ALERTED",
            "LAST ERROR",
        ],
        &body,
    )
}
