//! The routes of `/api/v1` and the two gates every request passes first: the Host header
//! (a loopback host, or the request is refused 403 `host_refused`) and the token (401
//! `unauthorized` without it; a socket caller needs none, and a GET may carry the
//! dashboard's session cookie instead). A GET reads here (GET / is the dashboard's overview,
//! `super::page`, and `/?token=` signs in); a POST is an action (`super::act`, which adds
//! the CSRF rule). Answers are JSON; an error is `{"error": word, "message":
//! sentence}` with its status. Each query runs on the blocking pool against the service's
//! one reader connection.
//!
//! Must not: send a CORS header, echo a header value or a query string into a log line, or
//! return a payload unless `payload=1` asks for it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{
    AUTHORIZATION, CACHE_CONTROL, CONTENT_TYPE, COOKIE, HOST, HeaderValue, LOCATION, SET_COOKIE,
};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{Value, json};

use super::{Admin, Caller};
use crate::store::{BatchFilter, ScanBudget, Store, StoreError};
use crate::vocab::BatchState;

/// A page of batches: the default and the most one request may ask for.
pub const PAGE_DEFAULT: usize = 100;
pub const PAGE_MAX: usize = 500;
/// How long one page of batches may read the spool (issue 31: a page of 100 within 50 ms
/// p99 on a million batches). A filter no index answers (a JSON path, a search, a key
/// prefix, a rare source) costs a scan in id order; one that has not filled the page by
/// then answers what it found and where it stopped (`scanned_to`, and `next_before` there),
/// and the client reads on from there.
pub const PAGE_SCAN_MS: u64 = 25;
/// ...and the most batches it examines, whatever the time.
pub const PAGE_SCAN_ROWS_MAX: i64 = 2_000_000;

/// The budget of one page of batches. Under the `failpoints` feature,
/// `HOOKSPOOL_TEST_ADMIN_SCAN_ROWS` replaces it with that many rows and no time bound, so
/// a test through the real binary sees pages stop on a small spool, the same way each time.
pub fn page_budget() -> ScanBudget {
    #[cfg(feature = "failpoints")]
    if let Some(n) = std::env::var("HOOKSPOOL_TEST_ADMIN_SCAN_ROWS")
        .ok()
        .and_then(|v| v.parse::<i64>().ok())
    {
        return ScanBudget {
            rows_max: n.max(1),
            time_max: None,
        };
    }
    ScanBudget {
        rows_max: PAGE_SCAN_ROWS_MAX,
        time_max: Some(Duration::from_millis(PAGE_SCAN_MS)),
    }
}
/// Issues listed at most.
pub const ISSUES_MAX: usize = 500;

pub type Answer = Response<Full<Bytes>>;

pub(super) fn answer(status: u16, body: &Value) -> Answer {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let h = r.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    r
}

pub(super) fn error(status: u16, word: &str, message: impl Into<String>) -> Answer {
    answer(status, &json!({"error": word, "message": message.into()}))
}

/// The host part of a Host header value (`127.0.0.1:8651`, `[::1]:8651`, `localhost`).
fn host_name(value: &str) -> &str {
    if let Some(rest) = value.strip_prefix('[') {
        return rest.split(']').next().unwrap_or("");
    }
    value.split(':').next().unwrap_or("")
}

/// Whether a Host header names this machine's loopback (anything else is a name a
/// rebinding DNS answer could have pointed at 127.0.0.1).
pub fn host_allowed(value: Option<&str>) -> bool {
    let Some(v) = value else { return false };
    let name = host_name(v.trim());
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|a| a.is_loopback())
}

/// Whether `given` is the service's token (an empty token is never one), in constant time.
fn is_token(admin: &Admin, given: &str) -> bool {
    !admin.token.is_empty()
        && crate::sources::verify::ct_eq(given.trim().as_bytes(), admin.token.as_bytes())
}

/// Whether the request carries the token, or (for a read) the dashboard's session cookie.
fn authorized(admin: &Admin, req: &Request<Incoming>) -> bool {
    let given = req
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if admin.token.is_empty() {
        return false;
    }
    if is_token(admin, given) {
        return true;
    }
    let cookie = super::page::cookie_in(req.headers().get(COOKIE).and_then(|v| v.to_str().ok()))
        .is_some_and(|c| {
            crate::sources::verify::ct_eq(
                c.as_bytes(),
                super::page::cookie_value(&admin.token).as_bytes(),
            )
        });
    // The cookie authorizes a read; an action only with the session's CSRF token, which
    // only a page served to the cookie's holder carries (not the plain `1`).
    match *req.method() {
        Method::GET => cookie,
        Method::POST => {
            cookie
                && req
                    .headers()
                    .get(super::act::CSRF_HEADER)
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|v| {
                        crate::sources::verify::ct_eq(
                            v.as_bytes(),
                            super::page::csrf_value(&admin.token).as_bytes(),
                        )
                    })
        }
        _ => false,
    }
}

/// The dashboard's stylesheet and script (public: they hold no data), or None.
fn static_asset(path: &str) -> Option<Answer> {
    let (body, kind) = match path {
        "/static/app.css" => (super::page::APP_CSS, "text/css; charset=utf-8"),
        "/static/app.js" => (super::page::APP_JS, "text/javascript; charset=utf-8"),
        _ => return None,
    };
    let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    let h = r.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static(kind));
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    Some(r)
}

/// An HTML answer with the headers that keep a browser from running, framing or leaking
/// anything: only the service's own script and stylesheet, nothing from elsewhere, no
/// inline script, no referrer.
fn html(status: u16, body: String) -> Answer {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let h = r.headers_mut();
    h.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        "content-security-policy",
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
        ),
    );
    h.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    h.insert("x-frame-options", HeaderValue::from_static("DENY"));
    r
}

/// GET /?token=<token>: the token checked, the session cookie set, and a redirect to `/`
/// so the token leaves the address bar and the history.
fn sign_in(admin: &Admin, caller: Caller, given: &str) -> Answer {
    let ok = caller != Caller::Token || is_token(admin, given);
    if !ok {
        tracing::info!(
            component = "admin",
            status = 401,
            reason = "unauthorized",
            "refused"
        );
        return html(
            401,
            "<!doctype html><title>hookspool</title><p>That token is not this service's. Open the address with <code>?token=</code> that <code>hookspool run</code> printed.</p>".into(),
        );
    }
    let mut r = html(303, String::new());
    let h = r.headers_mut();
    h.insert(LOCATION, HeaderValue::from_static("/"));
    if caller == Caller::Token
        && let Ok(v) = HeaderValue::from_str(&format!(
            "{}={}; Path=/; HttpOnly; SameSite=Strict",
            super::page::COOKIE,
            super::page::cookie_value(&admin.token)
        ))
    {
        h.insert(SET_COOKIE, v);
    }
    r
}

/// One request: the gates, then the route. A socket caller passed the file's mode and
/// group, so it needs no token; the Host rule holds for every caller.
pub async fn handle(admin: Arc<Admin>, caller: Caller, req: Request<Incoming>) -> Answer {
    if let Some(refused) = host_gate(&req) {
        return refused;
    }
    if req.method() == Method::GET
        && let Some(asset) = static_asset(req.uri().path())
    {
        return asset;
    }
    let dashboard = req.method() == Method::GET && !req.uri().path().starts_with("/api/");
    if dashboard
        && req.uri().path() == "/"
        && let Some(given) = req.uri().query().and_then(|q| {
            form_urlencoded::parse(q.as_bytes())
                .find(|(k, _)| k == "token")
                .map(|(_, v)| v.into_owned())
        })
    {
        return sign_in(&admin, caller, &given);
    }
    if caller == Caller::Token && !authorized(&admin, &req) {
        if dashboard {
            tracing::info!(
                component = "admin",
                status = 401,
                reason = "unauthorized",
                "refused"
            );
            return html(
                401,
                "<!doctype html><title>hookspool</title><p>Sign in: open this address with <code>?token=&lt;the admin token&gt;</code> (as <code>hookspool run</code> prints it).</p>".into(),
            );
        }
        return unauthorized();
    }
    if dashboard {
        let path = req.uri().path().to_string();
        let query: BTreeMap<String, String> = req
            .uri()
            .query()
            .map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
            .unwrap_or_default();
        let csrf = match caller {
            Caller::Token => super::page::csrf_value(&admin.token),
            Caller::Uid(_) => "1".to_string(),
        };
        let admin2 = admin.clone();
        let page = tokio::task::spawn_blocking(move || {
            let store = admin2.store.lock().unwrap_or_else(|e| e.into_inner());
            super::page::page(&admin2, &store, &path, &query, &csrf)
        })
        .await;
        return match page {
            Ok(Ok(Some(body))) => html(200, body),
            Ok(Ok(None)) => html(
                404,
                "<!doctype html><title>hookspool</title><p>No such page. <a href=\"/\">The overview</a>.</p>".into(),
            ),
            Ok(Err(e)) if e.is_weather() => html(
                503,
                "<!doctype html><title>hookspool</title><p>The spool is busy; refresh in a moment.</p>".into(),
            ),
            Ok(Err(e)) => {
                tracing::error!(component = "admin", reason = %e, "page failed");
                html(
                    500,
                    "<!doctype html><title>hookspool</title><p>The page failed; see the service's log.</p>".into(),
                )
            }
            Err(_) => html(500, "<!doctype html><title>hookspool</title><p>The page panicked; see the service's log.</p>".into()),
        };
    }
    let path = req.uri().path().to_string();
    let parts: Vec<&str> = path.trim_end_matches('/').split('/').skip(1).collect();
    if req.method() == Method::POST {
        return match super::act::route(&parts) {
            Some(Ok(action)) => super::act::handle(admin, caller, action, req).await,
            Some(Err(why)) => error(400, "bad_request", why),
            None => error(
                405,
                "method_not_allowed",
                "POST is for the actions only: /api/v1/batches/<id>/{replay,retry,drop,split,exclude}, /api/v1/replay, /api/v1/enqueue, /api/v1/destinations/<name>/{pause,resume}, /api/v1/issues/<id>/{ack,resolve,ignore}",
            ),
        };
    }
    if req.method() != Method::GET {
        return error(
            405,
            "method_not_allowed",
            "use GET to read, POST (with X-Hookspool-CSRF: 1) to act",
        );
    }
    let query: BTreeMap<String, String> = req
        .uri()
        .query()
        .map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
        .unwrap_or_default();
    let route = match parts.as_slice() {
        ["api", "v1", "status"] => Route::Status,
        ["api", "v1", "batches"] => match batch_filter(&query) {
            Ok(f) => Route::Batches(Box::new(f)),
            Err(why) => return error(400, "bad_request", why),
        },
        ["api", "v1", "batches", id] => match id.parse::<i64>() {
            Ok(id) => Route::Batch(id, query.get("payload").is_some_and(|v| v == "1")),
            Err(_) => return error(400, "bad_request", format!("{id:?} is not a batch id")),
        },
        ["api", "v1", "issues"] => Route::Issues(query.get("all").is_some_and(|v| v == "1")),
        ["api", "v1", "events"] => match query.get("dedup_id").filter(|v| !v.is_empty()) {
            Some(d) => Route::EventsByDedup(d.clone(), query.get("source").cloned()),
            None => {
                return error(
                    400,
                    "bad_request",
                    "name the event: /api/v1/events?dedup_id=<the provider's id>[&source=<source>]",
                );
            }
        },
        ["api", "v1", "openapi.json"] => Route::OpenApi,
        ["api", "v1", "destinations"] => Route::Destinations,
        ["api", "v1", "sources"] => Route::Sources,
        ["api", "v1", "polls"] => Route::Polls,
        ["api", "v1", "rejections"] => match query.get("hours").map(|h| h.parse::<u32>()) {
            None => Route::Rejections(REJECTION_HOURS_DEFAULT),
            Some(Ok(h)) if (1..=REJECTION_HOURS_MAX).contains(&h) => Route::Rejections(h),
            Some(_) => {
                return error(
                    400,
                    "bad_request",
                    format!("hours must be 1 to {REJECTION_HOURS_MAX}"),
                );
            }
        },
        ["api", "v1", "backlog"] => match query.get("hours").map(|h| h.parse::<u32>()) {
            None => Route::Backlog(BACKLOG_HOURS_DEFAULT),
            Some(Ok(h)) if (1..=BACKLOG_HOURS_MAX).contains(&h) => Route::Backlog(h),
            Some(_) => {
                return error(
                    400,
                    "bad_request",
                    format!("hours must be 1 to {BACKLOG_HOURS_MAX}"),
                );
            }
        },
        _ => {
            return error(
                404,
                "not_found",
                "no such endpoint; see /api/v1/openapi.json",
            );
        }
    };
    let admin2 = admin.clone();
    let result = tokio::task::spawn_blocking(move || {
        // The lock guards one connection; a poisoned one is still a whole connection.
        let store = admin2.store.lock().unwrap_or_else(|e| e.into_inner());
        route.run(&admin2, &store)
    })
    .await;
    match result {
        Ok(Ok(v)) => answer(200, &v),
        Ok(Err(StoreError::NotFound(what))) => error(404, "not_found", format!("no {what}")),
        Ok(Err(e)) if e.is_weather() => {
            let mut r = error(503, "busy", "the spool is busy; try again");
            r.headers_mut()
                .insert("retry-after", HeaderValue::from_static("1"));
            r
        }
        Ok(Err(e)) => {
            tracing::error!(component = "admin", reason = %e, "query failed");
            error(
                500,
                "store_error",
                "the query failed; see the service's log",
            )
        }
        Err(_) => error(500, "panic", "the query panicked; see the service's log"),
    }
}

/// The live stream's path.
pub const STREAM_PATH: &str = "/api/v1/events/stream";
/// How often the stream reads the spool for what happened, and sends a comment line when
/// nothing did (so a proxy keeps the connection).
pub const STREAM_POLL_MS: u64 = 1_000;
pub const STREAM_KEEPALIVE_S: u64 = 15;

/// A response body fed by a channel: each message is one SSE frame.
pub struct ChannelBody(tokio::sync::mpsc::Receiver<Bytes>);

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|m| m.map(|b| Ok(hyper::body::Frame::data(b))))
    }
}

/// Any answer of the service: a whole one, or the live stream.
pub type Body = http_body_util::combinators::UnsyncBoxBody<Bytes, std::convert::Infallible>;

/// One request, the live stream included: GET /api/v1/events/stream passes the same gates
/// as every read, then answers `text/event-stream`, each event a JSON object with its
/// `type` (event_queued, batch_sealed, attempt_finished, issue_opened) and an `id:` that
/// Last-Event-ID resumes from. The source is the spool, read every `STREAM_POLL_MS` on
/// the reader connection (the intake and the dispatcher are other processes: no in-process
/// bus reaches them all).
pub async fn serve(admin: Arc<Admin>, caller: Caller, req: Request<Incoming>) -> Response<Body> {
    use http_body_util::BodyExt;
    if req.method() == Method::GET && req.uri().path() == STREAM_PATH {
        if let Some(refusal) = gate(&admin, caller, &req) {
            return refusal.map(|b| b.boxed_unsync());
        }
        return stream(admin, &req).map(|b| b.boxed_unsync());
    }
    handle(admin, caller, req).await.map(|b| b.boxed_unsync())
}

/// The Host and credential gates of a JSON endpoint: the refusal, or None to go on.
fn gate(admin: &Admin, caller: Caller, req: &Request<Incoming>) -> Option<Answer> {
    if let Some(refused) = host_gate(req) {
        return Some(refused);
    }
    (caller == Caller::Token && !authorized(admin, req)).then(unauthorized)
}

/// 403 `host_refused` unless the Host header names a loopback host.
fn host_gate(req: &Request<Incoming>) -> Option<Answer> {
    let host = req.headers().get(HOST).and_then(|v| v.to_str().ok());
    if host_allowed(host) {
        return None;
    }
    tracing::info!(
        component = "admin",
        status = 403,
        reason = "host_refused",
        "refused"
    );
    Some(error(
        403,
        "host_refused",
        "the Host header must name a loopback host (127.0.0.1, [::1] or localhost); behind a proxy, have it send Host: 127.0.0.1",
    ))
}

/// 401 `unauthorized`: the token is missing or wrong.
fn unauthorized() -> Answer {
    tracing::info!(
        component = "admin",
        status = 401,
        reason = "unauthorized",
        "refused"
    );
    error(
        401,
        "unauthorized",
        "send the admin token as Authorization: Bearer <token>",
    )
}

/// The live stream: a task reads the spool and feeds the body until the client leaves.
fn stream(admin: Arc<Admin>, req: &Request<Incoming>) -> Response<ChannelBody> {
    let resume = req
        .headers()
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(crate::store::FeedCursor::parse_id);
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(16);
    tokio::spawn(async move {
        let mut cursor = resume;
        let mut quiet = std::time::Instant::now();
        // The first frame says the stream is open (EventSource's onopen needs bytes).
        if tx
            .send(Bytes::from_static(b"retry: 2000\n: open\n\n"))
            .await
            .is_err()
        {
            return;
        }
        loop {
            let a = admin.clone();
            let cur = cursor.clone();
            let read = tokio::task::spawn_blocking(move || {
                let store = a.store.lock().unwrap_or_else(|e| e.into_inner());
                let cur = match cur {
                    Some(c) => c,
                    None => store.feed_now(a.clock.now())?,
                };
                store.feed_since(&cur)
            })
            .await;
            let mut frames = String::new();
            match read {
                Ok(Ok((items, next))) => {
                    let id = next.to_id();
                    for item in &items {
                        frames.push_str(&format!(
                            "id: {id}\ndata: {}\n\n",
                            serde_json::to_string(item).unwrap_or_default()
                        ));
                    }
                    cursor = Some(next);
                }
                Ok(Err(e)) if e.is_weather() => {}
                Ok(Err(e)) => {
                    tracing::warn!(component = "admin", reason = %e, "the live stream's read failed");
                }
                Err(_) => return,
            }
            if frames.is_empty() && quiet.elapsed() >= Duration::from_secs(STREAM_KEEPALIVE_S) {
                frames.push_str(": keep-alive\n\n");
            }
            if !frames.is_empty() {
                quiet = std::time::Instant::now();
                if tx.send(Bytes::from(frames)).await.is_err() {
                    return;
                }
            }
            tokio::select! {
                _ = tx.closed() => return,
                _ = tokio::time::sleep(Duration::from_millis(STREAM_POLL_MS)) => {}
            }
        }
    });
    let mut r = Response::new(ChannelBody(rx));
    let h = r.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    r
}

enum Route {
    Status,
    Batches(Box<BatchFilter>),
    Batch(i64, bool),
    Issues(bool),
    EventsByDedup(String, Option<String>),
    Destinations,
    Sources,
    Polls,
    Backlog(u32),
    Rejections(u32),
    OpenApi,
}

impl Route {
    fn run(self, admin: &Admin, store: &Store) -> Result<Value, StoreError> {
        let now = admin.clock.now();
        match self {
            Route::Status => crate::observe::status::collect(store, &admin.cfg, now),
            Route::Batches(f) => {
                let page = store.list_batches_page(&f, page_budget())?;
                Ok(
                    json!({"batches": page.rows, "next_before": page.next_before,
                    "scanned_to": page.scanned_to}),
                )
            }
            Route::Batch(id, payload) => {
                let batch = store.batch(id)?;
                let events = store.events(id, payload)?;
                let attempts = store.attempts(id)?;
                Ok(json!({
                    "batch": batch,
                    "events": events,
                    "attempts": attempts,
                    "journalctl": format!("journalctl BATCH={id}"),
                    "replay": format!("hookspool replay {id}"),
                }))
            }
            Route::Issues(all) => {
                let states: &[&str] = if all {
                    &["open", "acked", "resolved", "ignored"]
                } else {
                    &["open", "acked"]
                };
                Ok(json!({"issues": store.issues(states, ISSUES_MAX)?}))
            }
            Route::EventsByDedup(dedup, source) => {
                let sources = match source {
                    Some(s) => vec![s],
                    None => known_sources(admin, store)?,
                };
                let mut events = Vec::new();
                for s in sources {
                    if let Some(e) = store.event_by_dedup(&s, &dedup)? {
                        let batch = store.batch(e.batch_id)?;
                        let repeats = store.dedup_repeats(&s, &dedup)?;
                        events.push(json!({
                            "event": e,
                            "batch": {"id": batch.id, "state": batch.state,
                                "destination": batch.destination, "route": batch.route},
                            "duplicates": repeats,
                        }));
                    }
                }
                Ok(json!({"dedup_id": dedup, "events": events}))
            }
            Route::Destinations => destinations(admin, store, now),
            Route::Sources => sources(admin, store, now),
            Route::Polls => Ok(json!({"polls": store.polls()?})),
            Route::Rejections(hours) => rejections(store, now, hours),
            Route::OpenApi => Ok(super::openapi::document()),
            Route::Backlog(hours) => {
                let from = now - f64::from(hours) * 3600.0;
                let spans = store.backlog_spans(from)?;
                let series = crate::store::backlog_series(&spans, from, now, BACKLOG_POINTS);
                let series: serde_json::Map<String, Value> = series
                    .into_iter()
                    .map(|(d, points)| {
                        let pts: Vec<Value> = points
                            .into_iter()
                            .map(|(t, n, age)| json!({"at": t, "pending": n, "oldest_age_s": age}))
                            .collect();
                        (d, Value::Array(pts))
                    })
                    .collect();
                Ok(
                    json!({"from": from, "to": now, "points": BACKLOG_POINTS, "destinations": series}),
                )
            }
        }
    }
}

/// The backlog series: hours by default and at most, and the points drawn.
pub const BACKLOG_HOURS_DEFAULT: u32 = 6;
pub const BACKLOG_HOURS_MAX: u32 = 48;
pub const BACKLOG_POINTS: usize = 61;
/// The window of the sources' and destinations' counts and latencies.
pub const COUNTS_WINDOW_S: f64 = 86_400.0;
/// The intake's rejection counts: hours by default and at most (what retention keeps).
pub const REJECTION_HOURS_DEFAULT: u32 = 24;
pub const REJECTION_HOURS_MAX: u32 = (crate::store::REJECTIONS_KEEP_S / 3600.0) as u32;

/// The intake's rejections over the last `hours` (the hours that began since the hour
/// `now - hours` falls in), by reason and by (source, reason): what the overview shows.
/// Counted by the intake and stored at its next write (at most
/// `intake::writer::REJECTIONS_FLUSH_S` late).
pub(super) fn rejections(store: &Store, now: f64, hours: u32) -> Result<Value, StoreError> {
    let from = now - f64::from(hours) * 3600.0;
    let rows = store.rejections_since(from)?;
    let mut by_reason: BTreeMap<String, i64> = BTreeMap::new();
    for (_, reason, n) in &rows {
        *by_reason.entry(reason.clone()).or_default() += n;
    }
    let by_source: Vec<Value> = rows
        .iter()
        .map(|(source, reason, n)| json!({"source": source, "reason": reason, "count": n}))
        .collect();
    Ok(json!({
        "hours": hours,
        "from": crate::store::rejection_hour(from) as f64,
        "to": now,
        "total": rows.iter().map(|r| r.2).sum::<i64>(),
        "by_reason": by_reason,
        "by_source": by_source,
    }))
}
pub const LATENCY_WINDOW_S: f64 = 3_600.0;

/// The sources the config names and those the spool has seen, by name.
pub(super) fn known_sources(admin: &Admin, store: &Store) -> Result<Vec<String>, StoreError> {
    let mut names: std::collections::BTreeSet<String> = admin.cfg.sources.keys().cloned().collect();
    names.extend(store.source_last_events()?.into_iter().map(|(s, _)| s));
    Ok(names.into_iter().collect())
}

/// Every destination: its breaker, in flight and backlog (the status document's), its
/// latency percentiles over the last hour and its last failed attempt of the last day.
pub(super) fn destinations(admin: &Admin, store: &Store, now: f64) -> Result<Value, StoreError> {
    let status = crate::observe::status::collect(store, &admin.cfg, now)?;
    let pending = store.pending_by_destination()?;
    let empty = serde_json::Map::new();
    let mut out = Vec::new();
    for (name, d) in status["destinations"].as_object().unwrap_or(&empty) {
        let lat = store.attempt_latencies_since(name, now - LATENCY_WINDOW_S)?;
        let pct = |q| crate::store::percentile(&lat, q);
        let (n, oldest) = pending
            .iter()
            .find(|(p, _, _)| p == name)
            .map_or((0, None), |(_, n, t)| (*n, Some(*t)));
        out.push(json!({
            "name": name,
            "configured": admin.cfg.destinations.contains_key(name),
            "breaker": d,
            "pending": n,
            "oldest_pending_at": oldest,
            "dead": store.dead_count(name)?,
            "latency_ms": {"window_s": LATENCY_WINDOW_S, "count": lat.len(),
                "p50": pct(0.5), "p90": pct(0.9), "p99": pct(0.99)},
            "last_error": store.last_error_since(name, now - COUNTS_WINDOW_S)?,
        }));
    }
    Ok(json!({"destinations": out}))
}

/// Every source: its kind, the bobbin instance it came from, its last event, and over the
/// last day the events committed, the duplicates answered and the requests rejected (by
/// reason, as the intake stored them); quarantined requests waiting.
pub(super) fn sources(admin: &Admin, store: &Store, now: f64) -> Result<Value, StoreError> {
    let last: BTreeMap<String, f64> = store.source_last_events()?.into_iter().collect();
    let mut rejected: BTreeMap<String, BTreeMap<String, i64>> = BTreeMap::new();
    for (source, reason, n) in store.rejections_since(now - COUNTS_WINDOW_S)? {
        rejected.entry(source).or_default().insert(reason, n);
    }
    let mut out = Vec::new();
    for name in known_sources(admin, store)? {
        let cfg = admin.cfg.sources.get(&name);
        let since = now - COUNTS_WINDOW_S;
        out.push(json!({
            "name": name,
            "configured": cfg.is_some(),
            "kind": cfg.map(|c| c.kind.clone()),
            "bobbin": admin.cfg.bobbins.get(&name).map(|o| o.bobbin.to_string()),
            "last_event_at": last.get(&name),
            "window_s": COUNTS_WINDOW_S,
            "events": store.source_events_since(&name, since)?,
            "duplicates": store.source_duplicates_since(&name, since)?,
            "quarantined": store.quarantined_count_for(&name)?,
            "rejected": rejected.get(&name).map_or(0, |r| r.values().sum::<i64>()),
            "rejected_by_reason": rejected.get(&name).cloned().unwrap_or_default(),
        }));
    }
    let bobbins: Vec<Value> = admin
        .cfg
        .bobbins
        .iter()
        .map(|(name, o)| json!({"instance": name, "bobbin": o.bobbin.to_string(), "processor": o.processor, "poll": o.poll}))
        .collect();
    Ok(json!({"sources": out, "bobbins": bobbins}))
}

/// The batches filter from a query string: state, source, route, destination, key_prefix,
/// event_type, dedup_id, json_path with json_value, search, since and until (Unix
/// seconds), before (the previous page's `next_before`), limit. A refusal says what to
/// write.
pub(super) fn batch_filter(q: &BTreeMap<String, String>) -> Result<BatchFilter, String> {
    let text = |k: &str| q.get(k).filter(|v| !v.is_empty()).cloned();
    let num = |k: &str| -> Result<Option<f64>, String> {
        text(k)
            .map(|v| v.parse::<f64>())
            .transpose()
            .map_err(|_| format!("{k} must be Unix seconds, e.g. {k}=1764950400"))
    };
    if let Some(s) = text("state")
        && BatchState::parse(&s).is_none()
    {
        return Err(format!(
            "state {s:?} is not a batch state (open, sealed, leased, retry, delivered, dead, dropped)"
        ));
    }
    let before = text("before")
        .map(|v| v.parse::<i64>())
        .transpose()
        .map_err(|_| "before must be a batch id (the previous page's next_before)".to_string())?;
    let limit = match text("limit") {
        None => PAGE_DEFAULT,
        Some(v) => match v.parse::<usize>() {
            Ok(n) if (1..=PAGE_MAX).contains(&n) => n,
            _ => return Err(format!("limit must be 1 to {PAGE_MAX}")),
        },
    };
    let json = match (text("json_path"), q.get("json_value").cloned()) {
        (None, None) => None,
        (Some(p), Some(v)) if crate::store::json_path_ok(&p) => Some((p, v)),
        (Some(p), Some(_)) => {
            return Err(format!(
                "json_path {p:?} is not a JSON path the filter takes: $ then .name or [N] steps, e.g. $.data.object.status"
            ));
        }
        _ => {
            return Err(
                "json_path and json_value go together, e.g. json_path=$.status&json_value=paid"
                    .into(),
            );
        }
    };
    Ok(BatchFilter {
        event_type: text("event_type"),
        dedup_id: text("dedup_id"),
        json,
        search: text("search"),
        state: text("state"),
        source: text("source"),
        destination: text("destination"),
        route: text("route"),
        key_prefix: text("key_prefix"),
        since: num("since")?,
        until: num("until")?,
        before_id: before,
        limit,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_hosts_pass() {
        for ok in [
            "127.0.0.1:8651",
            "127.0.0.1",
            "localhost:1",
            "LOCALHOST",
            "[::1]:8651",
            "127.1.2.3:9",
        ] {
            assert!(host_allowed(Some(ok)), "{ok}");
        }
        for bad in [
            "evil.example:8651",
            "127.0.0.1.evil.example",
            "10.0.0.1",
            "",
            "[::2]:1",
        ] {
            assert!(!host_allowed(Some(bad)), "{bad}");
        }
        assert!(!host_allowed(None));
    }
}
