//! `hookspool prune [--vacuum]` and `hookspool export [--state S] [--since T]` (spec 8, 16):
//! retention by hand, and the JSONL copy of batches, events and attempts.

use clap::Args;
use serde_json::json;

use super::{Ctx, EXIT_NOT_FOUND, Exit, parse_since};
use crate::observe::status;
use crate::store::ExportFilter;

/// VACUUM rewrites the file: it needs about this many times the spool's size free.
const VACUUM_FREE_FACTOR: u64 = 2;

#[derive(Debug, Args)]
pub struct PruneArgs {
    /// Also VACUUM the database afterwards (needs 2x its size free; blocks writers meanwhile).
    #[arg(long)]
    pub vacuum: bool,
}

#[derive(Debug, Args)]
pub struct ExportArgs {
    /// Only batches in this state.
    #[arg(long)]
    pub state: Option<String>,
    /// Only batches active at or after T (Unix s, RFC 3339, or 2h / 7d ago).
    #[arg(long, value_name = "T")]
    pub since: Option<String>,
}

pub fn prune(ctx: &Ctx, a: PruneArgs) -> Result<(), Exit> {
    let c = ctx.config()?;
    let mut store = ctx.store(&c)?;
    let report = store.prune(ctx.clock.now(), &c.retention())?;
    let before = status::spool_bytes(&c.db);
    if a.vacuum {
        let free = crate::sys::fs::spool_free_bytes(&c.db).unwrap_or(0);
        if free < before.saturating_mul(VACUUM_FREE_FACTOR) {
            return Err(Exit::new(
                EXIT_NOT_FOUND,
                format!(
                    "pruned, but VACUUM needs about {} bytes free and the filesystem has {free}; free space first",
                    before.saturating_mul(VACUUM_FREE_FACTOR)
                ),
            ));
        }
        store.vacuum()?;
    }
    let after = status::spool_bytes(&c.db);
    if ctx.json {
        ctx.print_json(&json!({"pruned": report, "vacuum": a.vacuum,
            "spool_bytes_before": before, "spool_bytes": after}));
    } else {
        say!(
            ctx,
            "pruned {} batches, {} events, {} attempts, {} dedup rows, {} issues, {} idempotency keys, {} rejection hours",
            report.batches,
            report.events,
            report.attempts,
            report.dedup,
            report.issues,
            report.idempotency_keys,
            report.rejection_hours
        );
        if a.vacuum {
            say!(ctx, "vacuumed: {before} -> {after} bytes");
        }
    }
    Ok(())
}

/// One JSON object per line whatever `--json` says: the format is JSONL by definition.
pub fn export(ctx: &Ctx, a: ExportArgs) -> Result<(), Exit> {
    let c = ctx.config()?;
    let store = ctx.store(&c)?;
    let since = a
        .since
        .as_deref()
        .map(|s| parse_since(s, ctx.clock.now()))
        .transpose()?;
    let mut write_err = None;
    let n = store.export(
        &ExportFilter {
            state: a.state,
            since,
        },
        &mut |record| {
            if write_err.is_none() {
                let mut line = record.to_string();
                line.push('\n');
                if let Err(e) = ctx.write_raw(line.as_bytes()) {
                    write_err = Some(e);
                }
            }
        },
    )?;
    if let Some(e) = write_err {
        return Err(e);
    }
    eprintln!("exported {n} batches");
    Ok(())
}
