//! `hookspool enqueue` (spec 16): spool an event by hand or from a sweep, through the same
//! validation and routing as the intake (the payload must be a JSON object within the
//! source's max_body_bytes; the key at most 512 bytes).

use std::io::Read;
use std::path::PathBuf;

use clap::Args;

use super::{Ctx, EXIT_CONFIG, EXIT_NOT_FOUND, Exit};
use crate::config::Injected;
use crate::store::EnqueueOutcome;

#[derive(Debug, Args)]
pub struct EnqueueArgs {
    #[arg(long)]
    pub source: String,
    #[arg(long)]
    pub key: String,
    /// Deliver to this destination, through the route <source>><destination> (its own batches).
    #[arg(long)]
    pub destination: Option<String>,
    #[arg(long, default_value = "")]
    pub event_type: String,
    #[arg(long)]
    pub dedup_id: Option<String>,
    /// Read the JSON payload from this file instead of standard input.
    #[arg(long)]
    pub file: Option<PathBuf>,
}

pub fn run(ctx: &Ctx, a: EnqueueArgs) -> Result<(), Exit> {
    let c = ctx.config()?;
    let bad = |m: String| Exit::new(EXIT_NOT_FOUND, m);
    let limit = c.injected_body_max(&a.source).max(0) as u64;
    let mut body = Vec::new();
    let reader: Box<dyn Read> = match &a.file {
        Some(p) => {
            Box::new(std::fs::File::open(p).map_err(|e| bad(format!("{}: {e}", p.display())))?)
        }
        None => Box::new(std::io::stdin()),
    };
    // A hard read cap: never hold more than the source accepts plus one byte.
    reader.take(limit + 1).read_to_end(&mut body)?;
    let text = String::from_utf8(body.clone())
        .map_err(|_| bad("the payload is not UTF-8 JSON; enqueue takes one JSON object".into()))?;
    let req = c
        .injected_request(&Injected {
            source: &a.source,
            key: &a.key,
            event_type: &a.event_type,
            dedup_id: a.dedup_id.as_deref(),
            destination: a.destination.as_deref(),
            payload: &text,
            raw: Some(&body),
            now: ctx.clock.now(),
        })
        .map_err(|e| {
            let code = if e.is_config() {
                EXIT_CONFIG
            } else {
                EXIT_NOT_FOUND
            };
            Exit::new(code, e.to_string())
        })?;
    let mut store = ctx.store_creating(&c)?;
    let outcome = store.enqueue(&req)?;
    let v = outcome.to_json();
    if ctx.json {
        ctx.print_json(&v);
    } else {
        match &outcome {
            EnqueueOutcome::Queued { copies } => {
                for (e, b, r) in copies {
                    say!(ctx, "queued event {e} in batch {b} (route {r})");
                }
            }
            other => say!(ctx, "{}", other.status_word()),
        }
    }
    Ok(())
}
