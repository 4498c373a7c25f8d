//! The actions of `/api/v1` (issue 31): POST only, through `crate::ops`, the functions the
//! CLI's `replay`, `retry`, `split`, `exclude`, `drop`, `pause`, `resume` and `issues
//! ack|resolve|ignore` call (and enqueue, as `hookspool enqueue` does, with an optional
//! Idempotency-Key whose first answer the store keeps in the same transaction), on the
//! service's action connection, whose actor is set to the request's caller (`admin-token`,
//! or `uid:<n>` on the Unix socket) so each audit row says who.
//!
//! Past the Host and token gates, an action also needs the CSRF header
//! (`X-Hookspool-CSRF: 1`): an HTML form from another origin cannot send a header, and a
//! script that tries is stopped by the browser's preflight, which this service never
//! answers with CORS. A body is JSON (an object; unknown fields refused), at most
//! `ACTION_BODY_MAX` bytes. A wrong state is 409; a refusal says what to send instead.
//! Every action is written to the journal (component "admin") as well as the audit rows.
//!
//! Must not: act on a GET, log a body, or take any path around `crate::ops`.

use std::sync::Arc;

use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::header::HeaderValue;
use hyper::{HeaderMap, Request};
use serde::Deserialize;
use serde_json::json;

use super::api::{Answer, answer, error};
use super::{Admin, Caller};
use crate::ops::{self, DeadFilter, OpError};
use crate::store::{SplitSpec, Store, StoreError};

/// The largest action body taken (an exclude of many event ids fits).
pub const ACTION_BODY_MAX: usize = 64 * 1024;
/// The header every action must carry; its value must be `1`.
pub const CSRF_HEADER: &str = "x-hookspool-csrf";
/// Who acts, in the audit rows and the journal, for a request with the TCP token.
pub const TOKEN_ACTOR: &str = "admin-token";
/// The most batch ids one replay names.
pub const REPLAY_IDS_MAX: usize = 10_000;

/// What an action does, parsed from its path (the body comes later).
pub enum Action {
    Batch(i64, BatchVerb),
    Replay,
    Destination(String, bool),
    Issue(String, &'static str),
    Enqueue,
}

#[derive(Clone, Copy)]
pub enum BatchVerb {
    Replay,
    Retry,
    Drop,
    Split,
    Exclude,
}

/// The action a POST path names, or None (not an action: 405 for a POST).
pub fn route(parts: &[&str]) -> Option<Result<Action, String>> {
    Some(match parts {
        ["api", "v1", "batches", id, verb] => {
            let verb = match *verb {
                "replay" => BatchVerb::Replay,
                "retry" => BatchVerb::Retry,
                "drop" => BatchVerb::Drop,
                "split" => BatchVerb::Split,
                "exclude" => BatchVerb::Exclude,
                _ => return None,
            };
            match id.parse::<i64>() {
                Ok(id) => Ok(Action::Batch(id, verb)),
                Err(_) => Err(format!("{id:?} is not a batch id")),
            }
        }
        ["api", "v1", "replay"] => Ok(Action::Replay),
        ["api", "v1", "enqueue"] => Ok(Action::Enqueue),
        ["api", "v1", "destinations", name, "pause"] => {
            Ok(Action::Destination(name.to_string(), true))
        }
        ["api", "v1", "destinations", name, "resume"] => {
            Ok(Action::Destination(name.to_string(), false))
        }
        ["api", "v1", "issues", id, verb] => {
            let state = match *verb {
                "ack" => "acked",
                "resolve" => "resolved",
                "ignore" => "ignored",
                _ => return None,
            };
            let named = percent_decode(id);
            Ok(Action::Issue(named, state))
        }
        _ => return None,
    })
}

/// A path segment with %XX escapes undone (an issue's fingerprint has `:`).
fn percent_decode(s: &str) -> String {
    form_urlencoded::parse(format!("x={}", s.replace('+', "%2B")).as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default()
}

/// Whether the request carries the CSRF header: `1`, or the dashboard session's CSRF token
/// (`token` is the service's; empty on a socket-only service).
pub fn csrf_ok(headers: &HeaderMap, token: &str) -> bool {
    let Some(v) = headers.get(CSRF_HEADER).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    v == "1"
        || (!token.is_empty()
            && crate::sources::verify::ct_eq(
                v.as_bytes(),
                super::page::csrf_value(token).as_bytes(),
            ))
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Empty {}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SplitBody {
    max_events: Option<i64>,
    max_bytes: Option<i64>,
    at: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExcludeBody {
    events: Vec<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplayBody {
    /// Batch ids (dead or quarantine), or else the filter below.
    batches: Option<Vec<i64>>,
    /// The filter's state: only "dead" is replayed.
    state: Option<String>,
    destination: Option<String>,
    source: Option<String>,
    since: Option<f64>,
    until: Option<f64>,
    #[serde(default)]
    dry_run: bool,
}

/// POST /api/v1/enqueue: what `hookspool enqueue` takes, the payload as a JSON object.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EnqueueBody {
    source: String,
    key: String,
    destination: Option<String>,
    #[serde(default)]
    event_type: String,
    dedup_id: Option<String>,
    payload: serde_json::Value,
}

/// The largest enqueue body taken (the source's max_body_bytes then applies to the payload).
pub const ENQUEUE_BODY_MAX: usize = 2 * 1024 * 1024;
/// The header that makes an enqueue idempotent, and its longest value.
pub const IDEMPOTENCY_HEADER: &str = "idempotency-key";
pub const IDEMPOTENCY_KEY_MAX: usize = 255;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PauseBody {
    reason: Option<String>,
}

/// A parsed action, ready for the store.
enum Job {
    Replay(Vec<i64>, bool),
    ReplayFilter(DeadFilter, bool),
    Retry(i64),
    Drop(i64),
    Split(i64, SplitSpec),
    Exclude(i64, Vec<i64>),
    Pause(String, Option<String>),
    Resume(String),
    Issue(String, &'static str),
    Enqueue(Box<crate::store::EnqueueRequest>, Option<(String, String)>),
}

impl Job {
    /// What it is, for the journal (no body, no reason text).
    fn what(&self) -> String {
        match self {
            Job::Replay(ids, _) if ids.len() == 1 => format!("replay batch {}", ids[0]),
            Job::Replay(ids, _) => format!("replay {} batches", ids.len()),
            Job::ReplayFilter(_, true) => "replay dry run".into(),
            Job::ReplayFilter(_, false) => "replay by filter".into(),
            Job::Retry(id) => format!("retry batch {id}"),
            Job::Drop(id) => format!("drop batch {id}"),
            Job::Split(id, _) => format!("split batch {id}"),
            Job::Exclude(id, e) => format!("exclude {} event(s) of batch {id}", e.len()),
            Job::Pause(d, _) => format!("pause {d}"),
            Job::Resume(d) => format!("resume {d}"),
            Job::Issue(i, s) => format!("issue {i} {s}"),
            Job::Enqueue(r, k) => format!(
                "enqueue to source {}{}",
                r.source,
                if k.is_some() { " (idempotent)" } else { "" }
            ),
        }
    }
}

/// The body as `T`: empty is `{}`; too large, not JSON, or an unknown field is refused.
async fn body<T: for<'de> Deserialize<'de>>(req: Request<Incoming>) -> Result<T, Answer> {
    let bytes = bytes(req, ACTION_BODY_MAX).await?;
    let text: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        &bytes
    };
    serde_json::from_slice(text).map_err(|e| {
        error(
            400,
            "bad_request",
            format!("the body must be a JSON object of this action's fields: {e}"),
        )
    })
}

/// The body's bytes, at most `max`.
async fn bytes(req: Request<Incoming>, max: usize) -> Result<bytes::Bytes, Answer> {
    match Limited::new(req.into_body(), max).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(_) => Err(error(
            413,
            "too_large",
            format!("this action's body is at most {max} bytes of JSON"),
        )),
    }
}

/// POST /api/v1/enqueue: the request through the config's injection rules (as `hookspool
/// enqueue`), with the Idempotency-Key and a digest of the body when the key is sent.
async fn enqueue_job(admin: &Admin, req: Request<Incoming>) -> Result<Job, Answer> {
    let key = match req.headers().get(IDEMPOTENCY_HEADER) {
        None => None,
        Some(v) => match v.to_str() {
            Ok(k) if !k.is_empty() && k.len() <= IDEMPOTENCY_KEY_MAX => Some(k.to_string()),
            _ => {
                return Err(error(
                    400,
                    "bad_request",
                    format!(
                        "Idempotency-Key is 1 to {IDEMPOTENCY_KEY_MAX} visible ASCII characters"
                    ),
                ));
            }
        },
    };
    let raw = bytes(req, ENQUEUE_BODY_MAX).await?;
    let b: EnqueueBody = serde_json::from_slice(&raw).map_err(|e| {
        error(
            400,
            "bad_request",
            format!(
                r#"send {{"source": S, "key": K, "payload": {{...}}}} with optional "destination", "event_type", "dedup_id": {e}"#
            ),
        )
    })?;
    let payload = b.payload.to_string();
    let r = admin
        .cfg
        .injected_request(&crate::config::Injected {
            source: &b.source,
            key: &b.key,
            event_type: &b.event_type,
            dedup_id: b.dedup_id.as_deref(),
            destination: b.destination.as_deref(),
            payload: &payload,
            raw: Some(payload.as_bytes()),
            now: admin.clock.now(),
        })
        .map_err(|e| {
            if e.is_config() {
                error(409, "config", e.to_string())
            } else if matches!(e, crate::config::InjectError::TooLarge(_)) {
                error(413, "too_large", e.to_string())
            } else {
                error(400, "bad_request", e.to_string())
            }
        })?;
    let fingerprint = key.as_ref().map(|_| {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(&raw))
    });
    Ok(Job::Enqueue(Box::new(r), key.zip(fingerprint)))
}

/// Parse the body for `action` into a job (a 4xx answer when it will not do).
async fn job(admin: &Admin, action: Action, req: Request<Incoming>) -> Result<Job, Answer> {
    let bad = |m: String| error(400, "bad_request", m);
    Ok(match action {
        Action::Batch(id, verb) => match verb {
            BatchVerb::Replay => {
                body::<Empty>(req).await?;
                Job::Replay(vec![id], false)
            }
            BatchVerb::Retry => {
                body::<Empty>(req).await?;
                Job::Retry(id)
            }
            BatchVerb::Drop => {
                body::<Empty>(req).await?;
                Job::Drop(id)
            }
            BatchVerb::Split => {
                let b: SplitBody = body(req).await?;
                let spec = ops::split_spec(b.max_events, b.max_bytes, b.at).map_err(|_| {
                    bad(r#"send {"max_events": N}, {"max_bytes": B} (N, B >= 1) or {"at": EVENT_ID}"#.into())
                })?;
                Job::Split(id, spec)
            }
            BatchVerb::Exclude => {
                let b: ExcludeBody = body(req).await?;
                if b.events.is_empty() {
                    return Err(bad(
                        r#"send {"events": [EVENT_ID, ...]}: the events to exclude"#.into(),
                    ));
                }
                Job::Exclude(id, b.events)
            }
        },
        Action::Replay => {
            let b: ReplayBody = body(req).await?;
            let filtered = b.state.is_some()
                || b.destination.is_some()
                || b.source.is_some()
                || b.since.is_some()
                || b.until.is_some();
            match b.batches {
                Some(_) if filtered => {
                    return Err(bad(
                        r#"send {"batches": [ID, ...]} or a filter {"state": "dead", "destination", "source", "since", "until"}, not both"#.into(),
                    ));
                }
                Some(ids) if ids.is_empty() || ids.len() > REPLAY_IDS_MAX => {
                    return Err(bad(format!(
                        "batches names 1 to {REPLAY_IDS_MAX} batch ids"
                    )));
                }
                Some(ids) => Job::Replay(ids, b.dry_run),
                None => {
                    if b.state.as_deref() != Some("dead") {
                        return Err(bad(
                            r#"a bulk replay takes dead batches: send {"state": "dead"} with any of destination, source, since, until (Unix seconds), and "dry_run": true to count first"#.into(),
                        ));
                    }
                    Job::ReplayFilter(
                        DeadFilter {
                            destination: b.destination,
                            source: b.source,
                            since: b.since,
                            until: b.until,
                        },
                        b.dry_run,
                    )
                }
            }
        }
        Action::Destination(name, true) => {
            let b: PauseBody = body(req).await?;
            Job::Pause(name, b.reason)
        }
        Action::Destination(name, false) => {
            body::<Empty>(req).await?;
            Job::Resume(name)
        }
        Action::Issue(named, state) => {
            body::<Empty>(req).await?;
            Job::Issue(named, state)
        }
        Action::Enqueue => enqueue_job(admin, req).await?,
    })
}

/// An action's answer when it did not happen.
fn refused(e: &OpError) -> Answer {
    match e {
        OpError::Store(StoreError::NotFound(what)) => error(404, "not_found", format!("no {what}")),
        OpError::Store(e @ StoreError::WrongState { .. }) => {
            error(409, "wrong_state", e.to_string())
        }
        OpError::Store(StoreError::Invalid(m)) => error(409, "refused", m.clone()),
        OpError::Store(e) if e.is_weather() => {
            let mut r = error(503, "busy", "the spool is busy; try again");
            r.headers_mut()
                .insert("retry-after", HeaderValue::from_static("1"));
            r
        }
        OpError::Store(e) => {
            tracing::error!(component = "admin", reason = %e, "action failed");
            error(
                500,
                "store_error",
                "the action failed; see the service's log",
            )
        }
        OpError::Config(m) => error(409, "config", m.clone()),
        OpError::Refused(m) => error(404, "not_found", m.clone()),
    }
}

/// Run a job on the action connection as `actor`: the answer and its status.
fn run(admin: &Admin, store: &mut Store, job: &Job, actor: &str) -> Answer {
    let now = admin.clock.now();
    let one = |done: Vec<ops::Done>, verb: &str| -> Answer {
        match done.first().map(|d| &d.result) {
            Some(Err(e)) if done.len() == 1 => refused(e),
            _ => answer(
                200,
                &json!({ verb: done.iter().map(ops::Done::row).collect::<Vec<_>>() }),
            ),
        }
    };
    let r = match job {
        Job::Replay(ids, true) => {
            // A dry run of named batches: which of them are dead now.
            let dead: Vec<i64> = ids
                .iter()
                .copied()
                .filter(|id| {
                    store
                        .batch(*id)
                        .is_ok_and(|b| b.state == crate::vocab::BatchState::Dead)
                })
                .collect();
            return answer(
                200,
                &json!({"dry_run": true, "count": dead.len(), "batches": dead}),
            );
        }
        Job::Replay(ids, false) => {
            ops::replay(&admin.cfg, store, ids, now).map(|done| one(done, "replay"))
        }
        Job::ReplayFilter(f, dry) => ops::dead_matching(store, f).and_then(|ids| {
            if *dry {
                return Ok(answer(
                    200,
                    &json!({"dry_run": true, "count": ids.len(), "batches": ids}),
                ));
            }
            let done = ops::replay(&admin.cfg, store, &ids, now)?;
            let ok = done.iter().filter(|d| d.result.is_ok()).count();
            Ok(answer(
                200,
                &json!({
                    "count": ok,
                    "replay": done.iter().map(ops::Done::row).collect::<Vec<_>>(),
                }),
            ))
        }),
        Job::Retry(id) => ops::retry(store, *id, now)
            .map(|()| answer(200, &json!({"retry": [{"batch": id, "ok": true}]}))),
        Job::Drop(id) => ops::drop_batches(store, &[*id], now).map(|done| one(done, "drop")),
        Job::Split(id, spec) => ops::split(store, *id, *spec, now)
            .map(|parts| answer(200, &json!({"batch": id, "into": parts}))),
        Job::Exclude(id, events) => ops::exclude(store, *id, events, now).map(|b| {
            answer(
                200,
                &json!({"batch": id, "excluded": events, "count": b.count,
                    "bytes": b.bytes, "content_hash": b.content_hash}),
            )
        }),
        Job::Pause(d, reason) => ops::pause(&admin.cfg, store, d, actor, reason.as_deref(), now)
            .map(|()| {
                answer(
                    200,
                    &json!({"destination": d, "state": "paused", "by": actor}),
                )
            }),
        Job::Resume(d) => ops::resume(&admin.cfg, store, d, now)
            .map(|()| answer(200, &json!({"destination": d, "state": "closed"}))),
        Job::Issue(named, state) => {
            ops::set_issue(store, named, state, now).map(|row| answer(200, &json!(row)))
        }
        Job::Enqueue(r, key) => store
            .enqueue_idempotent(r, key.as_ref().map(|(k, f)| (k.as_str(), f.as_str())))
            .map(|o| match o {
                crate::store::Idempotent::Fresh(v) => answer(200, &v),
                crate::store::Idempotent::Repeat(v) => {
                    let mut a = answer(200, &v);
                    a.headers_mut()
                        .insert("idempotent-replayed", HeaderValue::from_static("true"));
                    a
                }
                crate::store::Idempotent::Conflict => error(
                    409,
                    "idempotency_conflict",
                    "this Idempotency-Key was used for a different request; nothing was enqueued (use a new key for new content)",
                ),
            })
            .map_err(OpError::Store),
    };
    r.unwrap_or_else(|e| refused(&e))
}

/// One action request past the Host and token gates: the CSRF rule, the body, the store.
pub async fn handle(
    admin: Arc<Admin>,
    caller: Caller,
    action: Action,
    req: Request<Incoming>,
) -> Answer {
    if !csrf_ok(req.headers(), &admin.token) {
        tracing::info!(
            component = "admin",
            status = 403,
            reason = "csrf_required",
            "refused"
        );
        return error(
            403,
            "csrf_required",
            "an action needs the header X-Hookspool-CSRF: 1 (with the token); nothing was changed",
        );
    }
    let job = match job(&admin, action, req).await {
        Ok(j) => j,
        Err(a) => return a,
    };
    let admin2 = admin.clone();
    let result = tokio::task::spawn_blocking(move || {
        // The lock guards one connection; a poisoned one is still a whole connection.
        let mut store = admin2.actions.lock().unwrap_or_else(|e| e.into_inner());
        // The actor is set under the lock, so it is this request's for the whole action.
        let actor = caller.actor();
        store.set_actor(&actor);
        let a = run(&admin2, &mut store, &job, &actor);
        (job.what(), actor, a)
    })
    .await;
    match result {
        Ok((what, actor, a)) => {
            tracing::info!(
                component = "admin",
                status = a.status().as_u16(),
                "action by {actor}: {what}"
            );
            a
        }
        Err(_) => error(500, "panic", "the action panicked; see the service's log"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_action_paths_and_the_csrf_header() {
        let r = |p: &str| {
            let parts: Vec<&str> = p.split('/').skip(1).collect();
            route(&parts)
        };
        assert!(matches!(
            r("/api/v1/batches/7/split"),
            Some(Ok(Action::Batch(7, BatchVerb::Split)))
        ));
        assert!(matches!(r("/api/v1/batches/x/replay"), Some(Err(_))));
        assert!(r("/api/v1/batches/7/explode").is_none());
        assert!(r("/api/v1/batches").is_none());
        assert!(r("/api/v1/status").is_none());
        assert!(matches!(r("/api/v1/replay"), Some(Ok(Action::Replay))));
        match r("/api/v1/issues/delivery%3Ahttp%3Aa%2Bb%3Apaused/ack") {
            Some(Ok(Action::Issue(named, "acked"))) => {
                assert_eq!(named, "delivery:http:a+b:paused")
            }
            _ => panic!("issue by fingerprint"),
        }
        match r("/api/v1/destinations/http:a/pause") {
            Some(Ok(Action::Destination(d, true))) => assert_eq!(d, "http:a"),
            _ => panic!("pause"),
        }
        let mut h = HeaderMap::new();
        assert!(!csrf_ok(&h, "T"));
        h.insert(CSRF_HEADER, HeaderValue::from_static("true"));
        assert!(!csrf_ok(&h, "T"));
        h.insert(CSRF_HEADER, HeaderValue::from_static("1"));
        assert!(csrf_ok(&h, "T"));
        let session = super::super::page::csrf_value("T");
        h.insert(CSRF_HEADER, HeaderValue::from_str(&session).unwrap());
        assert!(csrf_ok(&h, "T"));
        assert!(!csrf_ok(&h, ""), "no session token without a token");
    }
}
