//! One HTTP request, in spec 9's exact order: routing (POST /hooks/<source>, GET /healthz,
//! GET /metrics) → Content-Length required, chunked 411 → body cap 413 on Content-Length →
//! its Content-Length reserved from the budget every unverified body shares (the slowest
//! holder cut to make room, 503 + Retry-After when none can be) → the body read into one
//! buffer of exactly that length within `BODY_READ_S_MAX` at a rate that can finish by then
//! (408 past either; `body`) → verify (401, empty body, one log line) →
//! challenge → ignore (200 ignored) → payload, key, dedup_id, event_type, attrs → route
//! resolution with tees → the writer's free-space check (503 + Retry-After) and group COMMIT →
//! 200 queued / duplicate / replayed or 202 quarantined.
//!
//! Invariants: no source code runs before the body is capped; a verified request is never
//! answered 5xx by our own code (source errors and panics after verify are quarantined; the
//! only 5xx is 503 when the spool cannot take the write or verification could not decide);
//! a 2xx for a stored request is sent only after the writer reports its COMMIT.
//! Must not: log a body, a secret, a header value or a query string (Pub/Sub tokens live
//! there); X-Forwarded-For is read only from a loopback peer and only for the log line.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::body::Incoming;
use hyper::header::{CONTENT_LENGTH, TRANSFER_ENCODING};
use hyper::{Method, Request};

use super::Shared;
use super::answer::{self, Answer, Said};
use super::body::{self, ReadError};
use super::conns::Activity;
use super::guard::{Guarded, evaluate_guarded};
use super::health;
use super::metrics::{Rejection, Stored};
use super::snapshot::{Served, Snapshot};
use super::writer::WriteError;
use crate::secret::ConfigSecrets;
use crate::sources::{self, Verdict};
use crate::store::{Copy, EnqueueOutcome, EnqueueRequest, Quarantine};

/// The route hint header of spec 14.1. hookspool does not take it: routes are chosen by
/// `[[routes]]` matches on the source's attrs, the same for the intake, `source test`,
/// replay and `enqueue`, and a hint only the intake saw would split that decision.
pub const ROUTE_HINT_HEADER: &str = "x-hookspool-route";
/// The longest a client may take to send a (capped) body once its head is in. The reverse
/// proxy buffers the whole body before it opens the upstream request (proxy_request_buffering
/// on) and sends it over loopback in one burst, so a real request needs microseconds; only a
/// sender that bypasses the proxy, or a proxy with buffering off, gets near this. 10 s is
/// 100 KB/s for a default 1 MiB body, and bounds how long a slow body holds its budget.
pub const BODY_READ_S_MAX: u64 = 10;

/// Who is on the other end of the connection.
#[derive(Debug, Clone)]
pub enum Peer {
    Tcp(std::net::SocketAddr),
    Unix,
}

impl Peer {
    /// Loopback TCP or a Unix socket: the reverse proxy (or a local tool).
    pub fn is_local(&self) -> bool {
        match self {
            Peer::Tcp(a) => a.ip().is_loopback(),
            Peer::Unix => true,
        }
    }

    fn addr(&self) -> String {
        match self {
            Peer::Tcp(a) => a.ip().to_string(),
            Peer::Unix => "unix".to_string(),
        }
    }
}

/// The hyper service function.
pub async fn handle(
    shared: Arc<Shared>,
    peer: Peer,
    activity: Activity,
    req: Request<Incoming>,
) -> Result<Answer, Infallible> {
    let path = req.uri().path().to_string();
    let answer = match path.as_str() {
        "/healthz" => match *req.method() {
            Method::GET | Method::HEAD => health::healthz(&shared).await,
            _ => answer::method_not_allowed("GET"),
        },
        "/metrics" => match *req.method() {
            Method::GET | Method::HEAD => health::metrics(&shared).await,
            _ => answer::method_not_allowed("GET"),
        },
        p => match p.strip_prefix("/hooks/") {
            Some(name) if !name.is_empty() && !name.contains('/') => {
                let snap = shared.snapshot();
                match snap.sources.contains_key(name) {
                    true => {
                        let started = Instant::now();
                        let span = intake_span(&req);
                        let trace = Arc::new(Trace {
                            traceparent: span.as_ref().map(|s| s.traceparent()),
                            batches: std::sync::Mutex::new(Vec::new()),
                        });
                        let a = TRACE
                            .scope(
                                trace.clone(),
                                hook(&shared, snap.clone(), name, peer, &activity, req),
                            )
                            .await;
                        let status = a.status().as_u16();
                        shared
                            .metrics
                            .answered(name, status, started.elapsed().as_secs_f64());
                        if let Some(mut span) = span {
                            span.set("hookspool.source", name.to_string());
                            span.set("http.response.status_code", i64::from(status));
                            let batches =
                                trace.batches.lock().map(|b| b.clone()).unwrap_or_default();
                            if let Some(first) = batches.first() {
                                span.set("hookspool.batch_id", *first);
                            }
                            if !batches.is_empty() {
                                span.set(
                                    "hookspool.batch_ids",
                                    opentelemetry::Value::Array(batches.into()),
                                );
                            }
                            if status >= 500 {
                                span.error("answered 5xx");
                            }
                            span.end();
                        }
                        a
                    }
                    false => answer::status_json(404, "unknown_source"),
                }
            }
            _ => answer::status_json(404, "not_found"),
        },
    };
    Ok(answer)
}

/// The trace of one request (issue 35): its intake span's traceparent, stored with each
/// event so the dispatcher's spans join the trace, and the batches it went into.
struct Trace {
    traceparent: Option<String>,
    batches: std::sync::Mutex<Vec<i64>>,
}

tokio::task_local! {
    static TRACE: Arc<Trace>;
}

/// The header key the intake span's traceparent is stored under in an event's stored
/// headers (a name no HTTP header uses, so a kept `traceparent` of the sender's stays its
/// own); read by `store::Store::batch_traceparent`.
pub const TRACE_HEADER_KEY: &str = crate::store::TRACEPARENT_KEY;

/// The intake span of a request to a source, continuing the sender's `traceparent` when
/// it is valid; `None` when traces are off.
fn intake_span(req: &Request<Incoming>) -> Option<crate::telemetry::Span> {
    if !crate::telemetry::enabled() {
        return None;
    }
    let parent = req
        .headers()
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .and_then(crate::telemetry::parse_traceparent);
    crate::telemetry::start(
        "hookspool.intake",
        opentelemetry::trace::SpanKind::Server,
        parent.as_ref(),
    )
}

/// `req`'s stored headers with the request's traceparent added, when traces are on.
fn with_trace(mut req: EnqueueRequest) -> EnqueueRequest {
    let Ok(Some(tp)) = TRACE.try_with(|t| t.traceparent.clone()) else {
        return req;
    };
    if let Ok(serde_json::Value::Object(mut m)) = serde_json::from_str(&req.headers) {
        m.insert(TRACE_HEADER_KEY.into(), serde_json::Value::String(tp));
        req.headers = serde_json::Value::Object(m).to_string();
    }
    req
}

/// Everything the log lines of one request share.
struct Ctx<'a> {
    shared: &'a Shared,
    source: &'a str,
    remote: String,
    started: Instant,
}

impl Ctx<'_> {
    fn reject(&self, why: Rejection, status: u16, bytes: usize) {
        self.shared
            .metrics
            .rejected(self.source, why, self.shared.clock.now());
        tracing::info!(
            component = "intake",
            source = self.source,
            remote = %self.remote,
            status,
            bytes,
            reason = why.label(),
            duration_ms = self.ms(),
            "rejected"
        );
    }

    fn ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }
}

async fn hook(
    shared: &Shared,
    snap: Arc<Snapshot>,
    name: &str,
    peer: Peer,
    activity: &Activity,
    req: Request<Incoming>,
) -> Answer {
    let Some(served) = snap.sources.get(name) else {
        return answer::status_json(404, "unknown_source");
    };
    let source_name = served.config.name.as_str();
    let remote = forwarded_for(&peer, &req).unwrap_or_else(|| peer.addr());
    let ctx = Ctx {
        shared,
        source: source_name,
        remote,
        started: Instant::now(),
    };
    let method = req.method().clone();
    let head_handshake =
        method == Method::HEAD && served.source.declared().challenge_unauthenticated;
    // A source whose handshake is a GET answers it or refuses it; it never enqueues one.
    let get_handshake = method == Method::GET && served.source.declared().get_handshake;
    if method != Method::POST && !head_handshake && !get_handshake {
        return answer::method_not_allowed("POST");
    }

    // Body cap: Content-Length required, chunked refused, then a hard read cap.
    let max = served.config.max_body_bytes.max(0) as u64;
    if req.headers().contains_key(TRANSFER_ENCODING) {
        ctx.reject(Rejection::Chunked, 411, 0);
        return answer::closing(411, "length_required");
    }
    let declared = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let declared = match (declared, method == Method::POST) {
        (Some(n), _) => n,
        (None, false) => 0,
        (None, true) => {
            ctx.reject(Rejection::NoLength, 411, 0);
            return answer::closing(411, "length_required");
        }
    };
    if declared > max {
        ctx.reject(Rejection::TooLarge, 413, declared as usize);
        return answer::closing(413, "too_large");
    }
    // Before a byte of the body is read: its Content-Length out of the budget every
    // unverified body shares, given back once the verdict is in.
    let Some(reservation) = shared.bodies.reserve(declared) else {
        ctx.reject(Rejection::BodyBudget, 503, declared as usize);
        return answer::unavailable_closing("busy", body::RETRY_AFTER_BODY_BUDGET_S);
    };
    let (parts, incoming) = req.into_parts();
    // `declared <= max`, and `max` came from an i64 config value: it fits in usize.
    let read = body::read(
        incoming,
        &reservation,
        declared as usize,
        Duration::from_secs(BODY_READ_S_MAX),
    )
    .await;
    let body = match read {
        Ok(b) => b,
        Err(ReadError::TooLong) => {
            ctx.reject(Rejection::TooLarge, 413, declared as usize + 1);
            return answer::closing(413, "too_large");
        }
        Err(ReadError::Deadline) => {
            ctx.reject(Rejection::SlowBody, 408, declared as usize);
            return answer::closing(408, "request_timeout");
        }
        // Too slow to finish by the deadline: its reservation goes back now, not then.
        Err(ReadError::TooSlow) => {
            ctx.reject(Rejection::BodyRate, 408, declared as usize);
            return answer::closing(408, "too_slow");
        }
        // The slowest holder of a full budget, cut so a new body could be read.
        Err(ReadError::Evicted) => {
            ctx.reject(Rejection::BodyEvicted, 503, declared as usize);
            return answer::unavailable_closing("busy", body::RETRY_AFTER_BODY_BUDGET_S);
        }
        // The client went away or sent garbage; the answer is for the log's sake.
        Err(ReadError::Broken) => {
            ctx.reject(Rejection::BrokenBody, 400, declared as usize);
            return answer::closing(400, "bad_request");
        }
    };
    // The body is whole: from here until the answer the connection is working, not idle,
    // and the cap never closes it (listener).
    let _working = activity.working();
    let bytes = body.len();

    if parts.headers.contains_key(ROUTE_HINT_HEADER) {
        refuse_route_hint(source_name);
    }
    let now = shared.clock.now();
    let sreq = sources::Request {
        method: parts.method.as_str().to_string(),
        path: parts.uri.path().to_string(),
        query: parts.uri.query().map(parse_query).unwrap_or_default(),
        headers: parts
            .headers
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str().to_string(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect(),
        body,
        route_hint: None,
        remote_addr: peer.addr(),
        now,
    };

    let (guarded, sreq) = run_source(&snap, name, sreq).await;
    // Verified or not, the body is no longer an unverified one.
    drop(reservation);
    let verdict = match guarded {
        Guarded::Verdict(v) => v,
        Guarded::PanicUnverified => {
            tracing::error!(
                component = "intake",
                source = source_name,
                reason = "source panicked before verification finished",
                status = 503,
                "source bug"
            );
            ctx.reject(Rejection::Undecided, 503, bytes);
            return answer::unavailable("unavailable", None);
        }
    };
    match verdict {
        Verdict::Unauthorized => {
            // Spec 10: one log line with source, remote address and size; an empty body.
            ctx.reject(Rejection::Unverified, 401, bytes);
            answer::empty(401)
        }
        Verdict::Undecided(e) => {
            tracing::warn!(
                component = "intake",
                source = source_name,
                reason = e.class(),
                status = 503,
                "verification could not decide"
            );
            ctx.reject(Rejection::Undecided, 503, bytes);
            answer::unavailable("unavailable", None)
        }
        Verdict::Answer(resp) => {
            ctx.reject(Rejection::Challenge, resp.status, bytes);
            answer::from_source(resp)
        }
        Verdict::Ignored(reason) => {
            shared
                .metrics
                .rejected(source_name, Rejection::Ignored, shared.clock.now());
            tracing::info!(
                component = "intake",
                source = source_name,
                reason = %reason,
                status = 200,
                bytes,
                duration_ms = ctx.ms(),
                "ignored"
            );
            answer::said(Said::Ignored)
        }
        Verdict::Quarantine { class } => {
            let q = quarantine_request(served, &sreq, class, now);
            store(&ctx, served, &sreq, q, bytes).await
        }
        Verdict::Accept(a) => {
            let q = match snap.config.accepted_request(
                &served.config,
                served.source.as_ref(),
                &sreq,
                a,
                now,
            ) {
                Ok(r) => r,
                Err(why) => quarantine_request(served, &sreq, why.class(), now),
            };
            store(&ctx, served, &sreq, q, bytes).await
        }
    }
}

/// Runs the source behind the panic guard and gives the request back. A verifier that may
/// fetch a key over the network (Plaid's, a JWK Set URL's: `Declared::fetches_keys`; a
/// blocking call) runs on the blocking pool (the
/// request moves there and back: the unverified body is never copied); every other source
/// is pure CPU and runs right here.
async fn run_source(
    snap: &Arc<Snapshot>,
    name: &str,
    sreq: sources::Request,
) -> (Guarded, sources::Request) {
    let Some(served) = snap.sources.get(name) else {
        return (Guarded::PanicUnverified, sreq);
    };
    if !served.source.declared().fetches_keys {
        let secrets = ConfigSecrets::new(&served.config.secrets);
        let g = evaluate_guarded(served.source.as_ref(), &sreq, &secrets);
        return (g, sreq);
    }
    let (snap, name) = (snap.clone(), name.to_string());
    let joined = tokio::task::spawn_blocking(move || {
        let g = snap.sources.get(&name).map(|served| {
            let secrets = ConfigSecrets::new(&served.config.secrets);
            evaluate_guarded(served.source.as_ref(), &sreq, &secrets)
        });
        (g, sreq)
    })
    .await;
    match joined {
        Ok((Some(g), sreq)) => (g, sreq),
        Ok((None, sreq)) => (Guarded::PanicUnverified, sreq),
        // The blocking task cannot panic (the guard catches it), so the join cannot fail;
        // the request went with the task, so answer "could not decide" with an empty one.
        Err(_) => (Guarded::PanicUnverified, sources::Request::default()),
    }
}

/// The raw request (body, headers minus the source's auth headers and every credential)
/// as a quarantine event.
fn quarantine_request(
    served: &Served,
    sreq: &sources::Request,
    class: &str,
    now: f64,
) -> EnqueueRequest {
    let headers = crate::config::headers::quarantined_headers(served.source.as_ref(), sreq);
    let sc = &served.config;
    EnqueueRequest {
        source: sc.name.clone(),
        key: "quarantine".into(),
        event_type: String::new(),
        dedup_id: None,
        dedup_window_s: 0.0,
        payload: None,
        raw: Some(sreq.body.clone()),
        headers,
        primary: Copy {
            route: sc.name.clone(),
            destination: "quarantine".into(),
            window: crate::store::Window {
                quiet_s: 0.0,
                max_s: 0.0,
                max_events: 1,
                max_bytes: sreq.body.len().max(1) as i64,
            },
        },
        tees: Vec::new(),
        quarantine: Some(Quarantine {
            error_class: class.to_string(),
        }),
        now,
    }
}

/// The writer (which checks free space for each group first); answers after COMMIT.
async fn store(
    ctx: &Ctx<'_>,
    served: &Served,
    sreq: &sources::Request,
    req: EnqueueRequest,
    bytes: usize,
) -> Answer {
    let shared = ctx.shared;
    let min_free = shared.snapshot().config.min_free_bytes;
    let mut quarantined = req.quarantine.is_some();
    let mut class = req
        .quarantine
        .as_ref()
        .map(|q| q.error_class.clone())
        .unwrap_or_default();
    let mut result = shared.writer.enqueue(with_trace(req), min_free).await;
    if let Err(WriteError::Invalid(why)) = &result {
        // The store refused a verified request (a bug on our side of the line): keep it
        // as a quarantine event rather than answer 5xx.
        tracing::error!(
            component = "intake",
            source = ctx.source,
            reason = %why,
            "store refused a verified request; quarantining it"
        );
        let q = quarantine_request(served, sreq, Quarantine::STORE_REFUSED, sreq.now);
        // What is stored now is this quarantine, not the request it replaces: the answer,
        // the log line and the counters say so (issue 29: they took the refused request's
        // labels, no quarantine and no class).
        quarantined = true;
        class = Quarantine::STORE_REFUSED.to_string();
        result = shared.writer.enqueue(q, min_free).await;
    }
    match result {
        Ok(outcome) => {
            // A sender that reads the answer (Discord's interactions) gets the source's
            // declared reply once the event is stored; a quarantine keeps its own answer.
            let reply = match (&outcome, &served.source.declared().accepted_reply) {
                (EnqueueOutcome::Quarantined { .. }, _) | (_, None) => None,
                (_, Some(reply)) => Some(reply.clone()),
            };
            let answer = stored(ctx, outcome, quarantined, &class, bytes);
            match reply {
                Some(body) => answer::from_source(sources::Response {
                    status: 200,
                    headers: vec![("Content-Type".to_string(), "application/json".to_string())],
                    body: body.into_bytes(),
                }),
                None => answer,
            }
        }
        Err(WriteError::Busy) => {
            ctx.reject(Rejection::Busy, 503, bytes);
            answer::unavailable("busy", None)
        }
        // The writer logged why (one line per group); the sender retries after a pause.
        Err(WriteError::Unreachable) => {
            ctx.reject(Rejection::Unreachable, 503, bytes);
            answer::unavailable("spool_unreachable", Some(answer::RETRY_AFTER_UNREACHABLE_S))
        }
        // The write failed for space, or the writer's own check before the group found
        // less than min_free_bytes: the same answer as the early check, Retry-After too.
        Err(WriteError::Full) | Err(WriteError::LowSpace) => {
            ctx.reject(Rejection::SpoolFull, 503, bytes);
            answer::unavailable("spool_full", Some(answer::RETRY_AFTER_LOW_SPACE_S))
        }
        Err(e) => {
            tracing::error!(component = "intake", source = ctx.source, reason = %e, "store failure");
            ctx.reject(Rejection::StoreError, 503, bytes);
            answer::unavailable("unavailable", None)
        }
    }
}

fn stored(
    ctx: &Ctx<'_>,
    outcome: EnqueueOutcome,
    quarantined: bool,
    class: &str,
    bytes: usize,
) -> Answer {
    let m = &ctx.shared.metrics;
    let source = ctx.source;
    let ms = ctx.ms();
    match outcome {
        EnqueueOutcome::Queued { copies } => {
            m.stored(source, Stored::Queued);
            let _ = TRACE.try_with(|t| {
                if let Ok(mut b) = t.batches.lock() {
                    b.extend(copies.iter().map(|(_, batch, _)| *batch));
                }
            });
            for (i, (event, batch, route)) in copies.iter().enumerate() {
                tracing::info!(
                    component = "intake",
                    source,
                    route = %route,
                    batch,
                    event,
                    bytes,
                    status = 200,
                    tee = i > 0,
                    duration_ms = ms,
                    "queued"
                );
            }
            answer::said(Said::Queued)
        }
        EnqueueOutcome::Duplicate { event_id } => {
            m.stored(source, Stored::Duplicate);
            tracing::info!(
                component = "intake",
                source,
                event = event_id,
                status = 200,
                bytes,
                duration_ms = ms,
                "duplicate"
            );
            answer::said(Said::Duplicate)
        }
        EnqueueOutcome::Replayed { batch_id } => {
            m.stored(source, Stored::Replayed);
            tracing::info!(
                component = "intake",
                source,
                batch = batch_id,
                status = 200,
                bytes,
                duration_ms = ms,
                "replayed"
            );
            answer::said(Said::Replayed)
        }
        EnqueueOutcome::Quarantined { event_id, batch_id } => {
            debug_assert!(quarantined, "only a quarantine request is quarantined");
            m.stored(source, Stored::Quarantined);
            tracing::warn!(
                component = "intake",
                source,
                batch = batch_id,
                event = event_id,
                status = 202,
                bytes,
                reason = %Quarantine { error_class: class.to_string() }.reason(),
                duration_ms = ms,
                "quarantined"
            );
            answer::said(Said::Quarantined)
        }
    }
}

/// A request carried X-Hookspool-Route: it is not used, and the operator is told once per
/// process (not per request: a proxy that sets it would flood the journal).
fn refuse_route_hint(source: &str) {
    static TOLD: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !TOLD.swap(true, std::sync::atomic::Ordering::Relaxed) {
        tracing::warn!(
            component = "intake",
            source,
            reason = "X-Hookspool-Route is not supported",
            "the route hint header is ignored: routes are chosen by [[routes]] match on the source's attrs; remove the header from the reverse proxy's config"
        );
    }
}

/// The first X-Forwarded-For entry, from a loopback peer only, for logging only.
fn forwarded_for(peer: &Peer, req: &Request<Incoming>) -> Option<String> {
    if !peer.is_local() {
        return None;
    }
    let v = req.headers().get("x-forwarded-for")?.to_str().ok()?;
    let first = v.split(',').next()?.trim();
    // Only an address is logged, never arbitrary header text.
    first
        .parse::<std::net::IpAddr>()
        .ok()
        .map(|ip| ip.to_string())
}

/// `a=1&b=x%20y` into pairs, percent- and plus-decoded (application/x-www-form-urlencoded,
/// by the `form_urlencoded` crate the form bodies use too; an invalid escape stays as sent).
pub fn parse_query(q: &str) -> Vec<(String, String)> {
    form_urlencoded::parse(q.as_bytes()).into_owned().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_decode() {
        assert_eq!(
            parse_query("token=a%2Bb&x=y+z&bad=%zz&end=%4"),
            vec![
                ("token".into(), "a+b".into()),
                ("x".into(), "y z".into()),
                ("bad".into(), "%zz".into()),
                ("end".into(), "%4".into()),
            ]
        );
    }
}
