//! `hookspool enqueue` (spec 16): spool an event by hand or from a sweep, through the same
//! validation and routing as the intake (the payload must be a JSON object within the
//! source's max_body_bytes; the key at most 512 bytes).

use std::collections::BTreeMap;
use std::io::Read;
use std::path::PathBuf;

use clap::Args;
use serde_json::json;

use super::{Ctx, EXIT_CONFIG, EXIT_NOT_FOUND, Exit};
use crate::config::{self, SourceConfig};
use crate::store::{Copy, EnqueueOutcome, EnqueueRequest, KEY_BYTES_MAX};

#[derive(Debug, Args)]
pub struct EnqueueArgs {
    #[arg(long)]
    pub source: String,
    #[arg(long)]
    pub key: String,
    /// Deliver to this destination (the route is the source's implicit route).
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
    if a.key.len() > KEY_BYTES_MAX {
        return Err(bad(format!(
            "--key is {} bytes; keys are at most {KEY_BYTES_MAX}",
            a.key.len()
        )));
    }
    // A sweep may enqueue for a source that only exists for it; it then needs --destination.
    let source = match c.sources.get(&a.source) {
        Some(s) => s.clone(),
        None if a.destination.is_some() => SourceConfig {
            name: a.source.clone(),
            kind: "template".into(),
            secrets: BTreeMap::new(),
            span: None,
            window: Default::default(),
            expect_every_s: 0.0,
            dedup_window_s: config::DEDUP_WINDOW_S_DEFAULT,
            max_body_bytes: c.intake.max_body_bytes.min(c.coalesce.max_bytes),
            action: None,
            keep_headers: vec![],
            store_raw: c.store_raw,
            options: Default::default(),
        },
        None => {
            return Err(Exit::new(
                EXIT_CONFIG,
                format!(
                    "source {:?} is not configured; pass --destination, or add [sources.{}] to the config",
                    a.source, a.source
                ),
            ));
        }
    };
    let limit = source.max_body_bytes as u64;
    let mut body = Vec::new();
    let reader: Box<dyn Read> = match &a.file {
        Some(p) => {
            Box::new(std::fs::File::open(p).map_err(|e| bad(format!("{}: {e}", p.display())))?)
        }
        None => Box::new(std::io::stdin()),
    };
    reader.take(limit + 1).read_to_end(&mut body)?;
    if body.len() as u64 > limit {
        return Err(bad(format!(
            "the payload is over the source's max_body_bytes ({limit})"
        )));
    }
    let value: serde_json::Value = serde_json::from_slice(&body).map_err(|e| {
        bad(format!(
            "the payload is not JSON ({e}); enqueue takes one JSON object"
        ))
    })?;
    if !value.is_object() {
        return Err(bad("the payload must be a JSON object".into()));
    }
    let attrs = BTreeMap::from([("event_type".to_string(), a.event_type.clone())]);
    let resolved = match &a.destination {
        Some(d) => config::Resolved {
            primary: Copy {
                route: source.name.clone(),
                destination: d.clone(),
                window: config::resolve_window(&c.spans, &c.coalesce, &source, None),
            },
            tees: vec![],
        },
        None => c.resolve_routes(&source, &attrs, None, None).ok_or_else(|| {
            Exit::new(
                EXIT_CONFIG,
                format!("no destination for source {}: pass --destination, set sources.{}.action, or add a [[routes]] entry", source.name, source.name),
            )
        })?,
    };
    let now = ctx.clock.now();
    let req = EnqueueRequest {
        source: source.name.clone(),
        key: a.key.clone(),
        event_type: a.event_type.clone(),
        dedup_id: a.dedup_id.clone(),
        dedup_window_s: source.dedup_window_s,
        raw: source.store_raw.then(|| body.clone()),
        payload: Some(String::from_utf8_lossy(&body).into_owned()),
        headers: "{}".into(),
        primary: resolved.primary,
        tees: resolved.tees,
        quarantine: None,
        now,
    };
    let mut store = ctx.store(&c)?;
    let outcome = store.enqueue(&req)?;
    let v = match &outcome {
        EnqueueOutcome::Queued { copies } => json!({
            "status": "queued",
            "copies": copies.iter().map(|(e, b, r)| json!({"event": e, "batch": b, "route": r})).collect::<Vec<_>>(),
        }),
        EnqueueOutcome::Duplicate { event_id } => json!({"status": "duplicate", "event": event_id}),
        EnqueueOutcome::Replayed { batch_id } => json!({"status": "replayed", "batch": batch_id}),
        EnqueueOutcome::Quarantined { event_id, batch_id } => {
            json!({"status": "quarantined", "event": event_id, "batch": batch_id})
        }
    };
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
