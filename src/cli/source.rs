//! `hookspool source test <name> --request FILE [--at UNIX_S]` (spec 16): replay a captured
//! HTTP request (`.http`: start line, headers, blank line, body) through the configured
//! source offline, in the intake's order (`sources::flow::evaluate`), and print every step
//! the intake takes (signature, challenge, ignore, key, dedup id, event type, attrs, route
//! and window through the intake's own `Config::accepted_request`) and the exact status and
//! body the intake would answer. Nothing is stored. Exit 0 only when the intake would
//! answer 2xx without quarantining. Secrets are resolved from the config's references (use
//! test secrets); the payload is shown by size only. A source that fetches its keys (Plaid's
//! key service with the source's client_id and secret, a JWK Set URL) fetches them as the
//! intake does, through the same fetchers and the egress policy.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use serde_json::{Value, json};

use super::{Ctx, EXIT_CONFIG, EXIT_NOT_FOUND, Exit};
use crate::config::{Config, SourceConfig};
use crate::intake::answer::Said;
use crate::sources::{self, SecretSource, Source, Verdict};
use crate::store::{Copy, EnqueueRequest};

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
        /// The time the intake received it, in Unix seconds (a timestamped capture is
        /// tested at its own time; default: now).
        #[arg(long, value_name = "UNIX_S")]
        at: Option<f64>,
    },
}

pub use crate::ops::ConfigSecrets;

pub fn run(ctx: &Ctx, a: SourceArgs) -> Result<(), Exit> {
    let SourceAction::Test { name, request, at } = a.action;
    let c = ctx.config()?;
    let cfg = c.sources.get(&name).ok_or_else(|| {
        Exit::new(
            EXIT_CONFIG,
            format!("no [sources.{name}] in the config; add it first"),
        )
    })?;
    if cfg.is_poll() {
        return Err(Exit::new(
            EXIT_CONFIG,
            format!(
                "{name} is a poll source (spec 14.4): it has no URL and takes no requests, so there is nothing to test with a capture; its ticks come from the dispatcher's clock (hookspool status shows polls.{name}), and `hookspool bobbin check` runs its poller on its captures/poll-*.json"
            ),
        ));
    }
    let text = std::fs::read_to_string(&request)
        .map_err(|e| Exit::new(EXIT_NOT_FOUND, format!("{}: {e}", request.display())))?;
    let now = match at {
        Some(t) if t.is_finite() && t >= 0.0 => t,
        Some(_) => {
            return Err(Exit::usage("--at takes Unix seconds, e.g. --at 1700000000"));
        }
        None => ctx.clock.now(),
    };
    let req = sources::parse_capture(&text, now)
        .map_err(|e| Exit::new(EXIT_NOT_FOUND, format!("{}: {e}", request.display())))?;
    let src = sources::build(&cfg.name, &cfg.kind, &cfg.options)
        .map_err(|e| Exit::new(EXIT_CONFIG, format!("sources.{name}: {e}")))?;
    if src.declared().fetches_keys {
        // Keys are fetched as the intake fetches them, at most once for this run: Plaid's
        // verification key from its key service (POST /webhook_verification_key/get with
        // the source's client_id and secret), a JWK Set URL's under the egress policy and
        // the source's jwks_allow_private.
        crate::intake::install_key_fetchers();
    }
    let secrets = ConfigSecrets::new(&cfg.secrets);
    let verdict = sources::evaluate(src.as_ref(), &req, &secrets);
    let t = trace(&c, cfg, src.as_ref(), &req, &secrets, verdict, now);
    let doc = json!({
        "source": name,
        "type": cfg.kind,
        "at": now,
        "request": {"method": req.method, "path": req.path, "body_bytes": req.body.len()},
        "steps": t.steps.iter().map(|(step, v)| json!({"step": step, "result": v})).collect::<Vec<_>>(),
        "answer": {"status": t.status, "body": t.body},
        "enqueued": t.stored,
    });
    if ctx.json {
        ctx.print_json(&doc);
    } else {
        say!(
            ctx,
            "source {name} (type {}): {} {}, {} bytes, at {now}",
            cfg.kind,
            req.method,
            req.path,
            req.body.len()
        );
        for (step, v) in &t.steps {
            say!(ctx, "  {step:<11} {}", render(v));
        }
        say!(ctx, "answer {} {}", t.status, t.body);
    }
    match t.failure {
        None => Ok(()),
        Some(why) => Err(Exit::new(
            EXIT_NOT_FOUND,
            format!("the intake would not enqueue this request: {why}"),
        )),
    }
}

/// What the intake would do, step by step.
struct Trace {
    steps: Vec<(&'static str, Value)>,
    status: u16,
    body: String,
    /// Whether an event would be stored for delivery.
    stored: bool,
    /// Why the run is not a success (the CLI exits non-zero).
    failure: Option<String>,
}

fn trace(
    c: &Config,
    cfg: &SourceConfig,
    src: &dyn Source,
    req: &sources::Request,
    secrets: &dyn SecretSource,
    verdict: Verdict,
    now: f64,
) -> Trace {
    let verified = json!("verified");
    let mut steps: Vec<(&'static str, Value)> = Vec::new();
    let done = |steps, status: u16, body: String, failure: Option<String>| Trace {
        steps,
        status,
        body,
        stored: false,
        failure,
    };
    match verdict {
        Verdict::Unauthorized => {
            steps.push(("signature", json!("not verified: the signature or token does not match the configured secret (or a timestamp is outside the tolerance; try --at)")));
            // A template's recipe says what it reads; name what this request lacks.
            for hint in sources::recipe::explain(&cfg.options, |h| req.header(h), &req.body, now) {
                steps.push(("recipe", json!(hint)));
            }
            done(steps, 401, String::new(), Some("401: not verified".into()))
        }
        Verdict::Undecided(e) => {
            steps.push(("signature", json!(format!("could not decide: {e}"))));
            done(
                steps,
                Said::Unavailable.status(),
                Said::Unavailable.body(),
                Some(format!("503: {e}")),
            )
        }
        Verdict::Answer(r) => {
            steps.push((
                "signature",
                if src.declared().challenge_unauthenticated {
                    json!("not needed: this source answers its handshake before verification")
                } else {
                    verified
                },
            ));
            steps.push((
                "challenge",
                json!(format!(
                    "answered {} (a handshake; nothing is stored)",
                    r.status
                )),
            ));
            let body = String::from_utf8_lossy(&r.body).into_owned();
            done(steps, r.status, body, None)
        }
        Verdict::Ignored(why) => {
            steps.push(("signature", verified));
            steps.push(("challenge", json!("none")));
            steps.push(("ignore", json!(format!("ignored: {why}"))));
            done(steps, Said::Ignored.status(), Said::Ignored.body(), None)
        }
        Verdict::Quarantine { class } => {
            steps.push(("signature", verified));
            // The verdict carries the class only; the same classification again names the
            // error (a field or header name, never request data).
            let why = match sources::flow::accept(src, req, secrets) {
                Err(e) => e.to_string(),
                Ok(_) => format!("plugin error: {class}"),
            };
            steps.push(("classify", json!(format!("failed: {why}"))));
            done(
                steps,
                Said::Quarantined.status(),
                Said::Quarantined.body(),
                Some(format!("quarantined: {why}")),
            )
        }
        Verdict::Accept(a) => {
            steps.push(("signature", verified));
            steps.push(("challenge", json!("none")));
            steps.push(("ignore", json!("not ignored")));
            steps.push(("key", json!(a.key)));
            steps.push(("dedup_id", json!(a.dedup_id)));
            steps.push(("event_type", json!(a.event_type)));
            steps.push(("attrs", json!(a.attrs)));
            steps.push((
                "payload",
                json!(format!("{} bytes", a.payload.to_string().len())),
            ));
            match c.accepted_request(cfg, src, req, a, now) {
                Ok(e) => {
                    route_steps(&mut steps, &e);
                    Trace {
                        steps,
                        status: Said::Queued.status(),
                        // The source's declared answer to a stored delivery, if any.
                        body: src
                            .declared()
                            .accepted_reply
                            .clone()
                            .unwrap_or_else(|| Said::Queued.body()),
                        stored: true,
                        failure: None,
                    }
                }
                Err(why) => {
                    steps.push(("route", json!(format!("{why}; the intake quarantines it"))));
                    done(
                        steps,
                        Said::Quarantined.status(),
                        Said::Quarantined.body(),
                        Some(format!("quarantined: {why}")),
                    )
                }
            }
        }
    }
}

fn route_steps(steps: &mut Vec<(&'static str, Value)>, e: &EnqueueRequest) {
    let copy = |c: &Copy| {
        json!({
            "route": c.route,
            "destination": c.destination,
            "window": {"quiet_s": c.window.quiet_s, "max_s": c.window.max_s,
                       "max_events": c.window.max_events, "max_bytes": c.window.max_bytes},
        })
    };
    steps.push(("route", copy(&e.primary)));
    for t in &e.tees {
        steps.push(("tee", copy(t)));
    }
    let kept: Value = serde_json::from_str(&e.headers).unwrap_or(Value::Null);
    let names: Vec<&String> = kept
        .as_object()
        .map(|o| o.keys().collect())
        .unwrap_or_default();
    steps.push(("headers", json!(names)));
}

/// One step's result as a line of text.
fn render(v: &Value) -> String {
    match v {
        Value::String(s) if s.is_empty() => "(none)".into(),
        Value::String(s) => s.clone(),
        Value::Null => "(none)".into(),
        Value::Object(o) if o.is_empty() => "(none)".into(),
        Value::Array(a) if a.is_empty() => "(none)".into(),
        Value::Object(o) if o.contains_key("route") => {
            let w = &o["window"];
            format!(
                "{} -> {} (window quiet_s {} max_s {} max_events {} max_bytes {})",
                o["route"].as_str().unwrap_or(""),
                o["destination"].as_str().unwrap_or(""),
                w["quiet_s"],
                w["max_s"],
                w["max_events"],
                w["max_bytes"]
            )
        }
        Value::Object(o) => o
            .iter()
            .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or(&v.to_string())))
            .collect::<Vec<_>>()
            .join(" "),
        Value::Array(a) => a
            .iter()
            .map(|v| v.as_str().unwrap_or("").to_string())
            .collect::<Vec<_>>()
            .join(", "),
        other => other.to_string(),
    }
}
