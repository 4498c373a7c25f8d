//! `hookspool source test <name> --request FILE` (spec 16): replay a captured HTTP request
//! (`.http`: start line, headers, blank line, body) through the configured source offline,
//! in the intake's order (`sources::flow::evaluate`), and show what the intake would do and
//! where the event would go. Nothing is stored. Secrets are resolved from the config's
//! references (use test secrets); the payload is shown by size only.

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::{Args, Subcommand};
use serde_json::{Value, json};

use super::{Ctx, EXIT_CONFIG, EXIT_NOT_FOUND, Exit};
use crate::config::{Config, SecretRefs, SourceConfig};
use crate::sources::{self, SecretError, SecretSource, Verdict};

#[derive(Debug, Args)]
pub struct SourceArgs {
    #[command(subcommand)]
    pub action: SourceAction,
}

#[derive(Debug, Subcommand)]
pub enum SourceAction {
    /// Run a captured request through the source without storing anything.
    Test {
        /// The `[sources.<name>]` to test.
        name: String,
        /// The capture: request line, headers, blank line, body.
        #[arg(long, value_name = "FILE")]
        request: PathBuf,
    },
}

/// The config's secret references, resolved at every call (rotation applies at once).
pub struct ConfigSecrets<'a> {
    pub refs: &'a BTreeMap<String, SecretRefs>,
}

impl SecretSource for ConfigSecrets<'_> {
    fn candidates(&self, name: &str) -> Result<Vec<Vec<u8>>, SecretError> {
        let refs = self
            .refs
            .get(name)
            .ok_or_else(|| SecretError::NotConfigured {
                name: name.to_string(),
            })?;
        refs.refs()
            .into_iter()
            .map(|r| {
                r.resolve().map_err(|e| SecretError::Unreadable {
                    name: name.to_string(),
                    reason: e.to_string(),
                })
            })
            .collect()
    }
}

pub fn run(ctx: &Ctx, a: SourceArgs) -> Result<(), Exit> {
    let SourceAction::Test { name, request } = a.action;
    let c = ctx.config()?;
    let cfg = c.sources.get(&name).ok_or_else(|| {
        Exit::new(
            EXIT_CONFIG,
            format!("no [sources.{name}] in the config; add it first"),
        )
    })?;
    let text = std::fs::read_to_string(&request)
        .map_err(|e| Exit::new(EXIT_NOT_FOUND, format!("{}: {e}", request.display())))?;
    let now = ctx.clock.now();
    let req = sources::parse_capture(&text, now)
        .map_err(|e| Exit::new(EXIT_NOT_FOUND, format!("{}: {e}", request.display())))?;
    let src = sources::build(&cfg.name, &cfg.kind, &cfg.options)
        .map_err(|e| Exit::new(EXIT_CONFIG, format!("sources.{name}: {e}")))?;
    let secrets = ConfigSecrets { refs: &cfg.secrets };
    let verdict = sources::evaluate(src.as_ref(), &req, &secrets);
    let (doc, accepted) = describe(&c, cfg, src.as_ref(), &verdict);
    if ctx.json {
        ctx.print_json(&doc);
    } else {
        render(ctx, &doc);
    }
    if accepted {
        Ok(())
    } else {
        Err(Exit::new(
            EXIT_NOT_FOUND,
            format!(
                "the intake would not enqueue this request ({})",
                doc["verdict"].as_str().unwrap_or("?")
            ),
        ))
    }
}

/// The verdict as JSON, and whether the intake would answer it with a 2xx.
fn describe(
    c: &Config,
    cfg: &SourceConfig,
    src: &dyn sources::Source,
    verdict: &Verdict,
) -> (Value, bool) {
    match verdict {
        Verdict::Unauthorized => (
            json!({"verdict": "unauthorized", "status": 401,
                   "hint": "the signature or token did not verify with the configured secret"}),
            false,
        ),
        Verdict::Undecided(e) => (
            json!({"verdict": "undecided", "status": 503, "error": e.to_string()}),
            false,
        ),
        Verdict::Answer(r) => (
            json!({"verdict": "handshake", "status": r.status, "body_bytes": r.body.len()}),
            true,
        ),
        Verdict::Ignored(why) => (
            json!({"verdict": "ignored", "status": 200, "reason": why}),
            true,
        ),
        Verdict::Quarantine { class } => (
            json!({"verdict": "quarantine", "status": 202,
                   "error": format!("plugin error: {class}")}),
            false,
        ),
        Verdict::Accept(acc) => {
            let mut attrs = acc.attrs.clone();
            attrs
                .entry("event_type".into())
                .or_insert_with(|| acc.event_type.clone());
            let routes = c
                .resolve_routes(cfg, &attrs, acc.action.as_deref(), Some(src.declared().span))
                .map(|r| {
                    json!({
                        "primary": {"route": r.primary.route, "destination": r.primary.destination},
                        "tees": r.tees.iter().map(|t| json!({"route": t.route, "destination": t.destination})).collect::<Vec<_>>(),
                    })
                });
            (
                json!({
                    "verdict": "accept",
                    "status": 202,
                    "key": acc.key,
                    "dedup_id": acc.dedup_id,
                    "event_type": acc.event_type,
                    "attrs": acc.attrs,
                    "payload_bytes": acc.payload.to_string().len(),
                    "routes": routes,
                }),
                true,
            )
        }
    }
}

fn render(ctx: &Ctx, d: &Value) {
    say!(
        ctx,
        "verdict {}  (the intake answers {})",
        d["verdict"].as_str().unwrap_or("?"),
        d["status"]
    );
    for k in ["hint", "error", "reason"] {
        if let Some(v) = d[k].as_str() {
            say!(ctx, "  {k}: {v}");
        }
    }
    if d["verdict"] == "accept" {
        say!(ctx, "  key {}", d["key"].as_str().unwrap_or(""));
        say!(
            ctx,
            "  event_type {}",
            d["event_type"].as_str().unwrap_or("")
        );
        say!(ctx, "  dedup_id {}", d["dedup_id"].as_str().unwrap_or("-"));
        if let Some(attrs) = d["attrs"].as_object() {
            for (k, v) in attrs {
                say!(ctx, "  attr {k} = {}", v.as_str().unwrap_or(""));
            }
        }
        say!(ctx, "  payload {} bytes", d["payload_bytes"]);
        match d["routes"].as_object() {
            Some(r) => {
                say!(
                    ctx,
                    "  route {} -> {}",
                    r["primary"]["route"].as_str().unwrap_or(""),
                    r["primary"]["destination"].as_str().unwrap_or("")
                );
                for t in r["tees"].as_array().into_iter().flatten() {
                    say!(
                        ctx,
                        "  tee {} -> {}",
                        t["route"].as_str().unwrap_or(""),
                        t["destination"].as_str().unwrap_or("")
                    );
                }
            }
            None => ctx.say(
                "  no destination: set the source's action or add a [[routes]] entry that matches",
            ),
        }
    }
}
