//! The dashboard (issue 31): server-rendered pages from minijinja templates (autoescaped:
//! every value from the spool is escaped by the engine), a stylesheet and a small script
//! served by the binary itself, SVG charts drawn from numbers computed here. Pages:
//! overview (`/`), batches with bookmarkable filters (`/batches?...`, the API's filters),
//! batch detail (`/batches/<id>`; payloads only behind an explicit link), dead letters
//! (`/dead`, replay a selection), destinations, sources, issues, polls. The script opens the
//! live stream and re-renders the page when something happens; actions POST with the
//! page's CSRF token after a confirmation.
//!
//! Signing in: `/?token=<token>` once sets the session cookie (HttpOnly, SameSite=Strict)
//! and redirects to `/`, so the token leaves the address bar. The cookie holds a digest of
//! the token, not the token; it authenticates reads, and an action only with the session's
//! CSRF token (another digest) in `X-Hookspool-CSRF`, which only a page served to the
//! cookie's holder carries.
//!
//! Must not: show a secret, a header value, an error text (a script's error can quote what
//! it was fed), or a payload unless `payload=1` was clicked; load anything from elsewhere.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use minijinja::{Environment, State};
use serde_json::{Value, json};
use sha2::Digest;

use super::Admin;
use super::api::{self, BACKLOG_HOURS_DEFAULT, BACKLOG_POINTS, PAGE_DEFAULT};
use crate::store::{BatchFilter, Store, StoreError};
use crate::vocab::BatchState;

/// The session cookie's name.
pub const COOKIE: &str = "hookspool_admin";
/// Recent batches the overview lists.
pub const RECENT_BATCHES_MAX: usize = 25;
/// Open issues the overview lists.
pub const OPEN_ISSUES_MAX: usize = 50;
/// The overview's intake chart: buckets of this many seconds over the last hour.
pub const INTAKE_BUCKET_S: f64 = 300.0;
pub const INTAKE_BUCKETS: usize = 12;

/// The stylesheet and the script, served at /static/app.css and /static/app.js.
pub const APP_CSS: &str = include_str!("static/app.css");
pub const APP_JS: &str = include_str!("static/app.js");

/// The cookie's value for `token`: a digest, so the cookie jar never holds the token.
pub fn cookie_value(token: &str) -> String {
    digest(b"hookspool admin session\0", token)
}

/// The session's CSRF token for `token`: what the pages carry and an action from a
/// cookie-authenticated browser must send as `X-Hookspool-CSRF`.
pub fn csrf_value(token: &str) -> String {
    digest(b"hookspool admin csrf\0", token)
}

fn digest(label: &[u8], token: &str) -> String {
    let mut h = sha2::Sha256::new();
    h.update(label);
    h.update(token.as_bytes());
    hex::encode(h.finalize())
}

/// The session cookie's value in a Cookie header, if any.
pub fn cookie_in(header: Option<&str>) -> Option<&str> {
    header?
        .split(';')
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| v)
}

/// A duration in seconds as an operator reads it: 42 s, 7 min, 3 h, 2 d.
pub fn human_age(s: f64) -> String {
    let s = s.max(0.0);
    if s < 120.0 {
        format!("{s:.0} s")
    } else if s < 7200.0 {
        format!("{:.0} min", s / 60.0)
    } else if s < 172_800.0 {
        format!("{:.0} h", s / 3600.0)
    } else {
        format!("{:.0} d", s / 86_400.0)
    }
}

/// The template's `ago(t)`: the age of Unix time `t` at the page's `now`.
fn ago(state: &State, t: Option<f64>) -> String {
    let now = state
        .lookup("now")
        .and_then(|v| f64::try_from(v).ok())
        .unwrap_or(0.0);
    t.map_or_else(|| "-".into(), |t| human_age(now - t))
}

fn env() -> &'static Environment<'static> {
    static ENV: OnceLock<Environment<'static>> = OnceLock::new();
    ENV.get_or_init(|| {
        let mut e = Environment::new();
        for (name, text) in [
            ("base.html", include_str!("templates/base.html")),
            ("overview.html", include_str!("templates/overview.html")),
            ("batches.html", include_str!("templates/batches.html")),
            ("batch_rows.html", include_str!("templates/batch_rows.html")),
            ("batch.html", include_str!("templates/batch.html")),
            ("dead.html", include_str!("templates/dead.html")),
            ("issue_rows.html", include_str!("templates/issue_rows.html")),
            ("issues.html", include_str!("templates/issues.html")),
            ("table.html", include_str!("templates/table.html")),
        ] {
            // The templates are the binary's own; a broken one fails its test.
            if let Err(err) = e.add_template(name, text) {
                tracing::error!(component = "admin", reason = %err, "template {name} does not parse");
            }
        }
        e.add_function("ago", ago);
        e
    })
}

/// Why a page could not be drawn.
#[derive(Debug, thiserror::Error)]
pub enum PageError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("template: {0}")]
    Template(#[from] minijinja::Error),
}

impl PageError {
    pub fn is_weather(&self) -> bool {
        matches!(self, PageError::Store(e) if e.is_weather())
    }
}

/// The navigation, with the current page marked.
fn nav(page: &str) -> Vec<Value> {
    [
        ("overview", "/", "Overview"),
        ("batches", "/batches", "Batches"),
        ("dead", "/dead", "Dead letters"),
        ("destinations", "/destinations", "Destinations"),
        ("sources", "/sources", "Sources"),
        ("issues", "/issues", "Issues"),
        ("polls", "/polls", "Polls"),
    ]
    .iter()
    .map(|(id, href, label)| json!({"href": href, "label": label, "here": *id == page}))
    .collect()
}

fn render(
    name: &str,
    page: &str,
    api_path: &str,
    csrf: &str,
    now: f64,
    data: Value,
) -> Result<String, PageError> {
    let t = env().get_template(name)?;
    let mut data = data;
    if let Some(o) = data.as_object_mut() {
        o.insert("nav".into(), json!(nav(page)));
        o.insert("page".into(), json!(page));
        o.insert("api".into(), json!(api_path));
        o.insert("csrf".into(), json!(csrf));
        o.insert("now".into(), json!(now));
    }
    Ok(t.render(minijinja::value::Serde(&data))?)
}

/// A table cell: text, optionally a link, code, or a class.
fn cell(text: impl ToString) -> Value {
    json!({"text": text.to_string()})
}

fn code(text: impl ToString) -> Value {
    json!({"text": text.to_string(), "code": true})
}

fn link(text: impl ToString, href: String) -> Value {
    json!({"text": text.to_string(), "href": href})
}

fn url_part(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// The page at `path` (None: not a page), for a caller whose actions carry `csrf`.
pub fn page(
    admin: &Admin,
    store: &Store,
    path: &str,
    query: &BTreeMap<String, String>,
    csrf: &str,
) -> Result<Option<String>, PageError> {
    let now = admin.clock.now();
    let parts: Vec<&str> = path.trim_end_matches('/').split('/').skip(1).collect();
    Ok(Some(match parts.as_slice() {
        [] | [""] => overview(admin, store, csrf, now)?,
        ["batches"] => batches(store, query, csrf, now)?,
        ["batches", id] => match id.parse::<i64>() {
            Ok(id) => match batch(
                store,
                id,
                query.get("payload").is_some_and(|v| v == "1"),
                csrf,
                now,
            ) {
                Err(PageError::Store(StoreError::NotFound(_))) => return Ok(None),
                other => other?,
            },
            Err(_) => return Ok(None),
        },
        ["dead"] => dead(store, query, csrf, now)?,
        ["destinations"] => destinations(admin, store, csrf, now)?,
        ["sources"] => sources(admin, store, csrf, now)?,
        ["issues"] => {
            let all = query.get("all").is_some_and(|v| v == "1");
            let states: &[&str] = if all {
                &["open", "acked", "resolved", "ignored"]
            } else {
                &["open", "acked"]
            };
            let issues = store.issues(states, api::ISSUES_MAX)?;
            render(
                "issues.html",
                "issues",
                "/api/v1/issues",
                csrf,
                now,
                json!({"issues": issues}),
            )?
        }
        ["polls"] => polls(store, csrf, now)?,
        _ => return Ok(None),
    }))
}

fn overview(admin: &Admin, store: &Store, csrf: &str, now: f64) -> Result<String, PageError> {
    let status = crate::observe::status::collect(store, &admin.cfg, now)?;
    let pending = store.pending_by_destination()?;
    let issues = store.issues(&["open", "acked"], OPEN_ISSUES_MAX)?;
    let batches = store.list_batches(&BatchFilter {
        limit: RECENT_BATCHES_MAX,
        ..BatchFilter::default()
    })?;
    // The backlog sparkline per destination.
    let hours = BACKLOG_HOURS_DEFAULT;
    let from = now - f64::from(hours) * 3600.0;
    let series =
        crate::store::backlog_series(&store.backlog_spans(from)?, from, now, BACKLOG_POINTS);
    let empty = serde_json::Map::new();
    let mut dests = Vec::new();
    for (name, d) in status["destinations"].as_object().unwrap_or(&empty) {
        let (n, oldest) = pending
            .iter()
            .find(|(p, _, _)| p == name)
            .map_or((0, None), |(_, n, t)| (*n, Some(now - t)));
        let state = d["state"].as_str().unwrap_or("closed");
        let points = series.get(name).cloned().unwrap_or_default();
        let top = points.iter().map(|p| p.1).max().unwrap_or(0).max(1) as f64;
        let step = 120.0 / (points.len().max(2) - 1) as f64;
        let spark: Vec<String> = points
            .iter()
            .enumerate()
            .map(|(i, p)| {
                format!(
                    "{:.1},{:.1}",
                    i as f64 * step,
                    23.0 - 22.0 * p.1 as f64 / top
                )
            })
            .collect();
        dests.push(json!({
            "name": name, "state": state,
            "class": match state { "closed" => "ok", "paused" => "warn", _ => "bad" },
            "pending": n, "oldest": oldest.map(human_age).unwrap_or_else(|| "-".into()),
            "inflight": d["inflight"].as_i64().map_or_else(|| "-".to_string(), |i| i.to_string()),
            "spark": spark.join(" "),
        }));
    }
    // Intake over the last hour, per 5 minutes, every source.
    let from = now - INTAKE_BUCKET_S * INTAKE_BUCKETS as f64;
    let mut buckets = [0i64; INTAKE_BUCKETS];
    let mut duplicates = 0;
    for s in api::known_sources(admin, store)? {
        for (b, n) in buckets.iter_mut().zip(store.source_events_per_bucket(
            &s,
            from,
            INTAKE_BUCKET_S,
            INTAKE_BUCKETS,
        )?) {
            *b += n;
        }
        duplicates += store.source_duplicates_since(&s, from)?;
    }
    let top = buckets.iter().copied().max().unwrap_or(0).max(1) as f64;
    let w = 10.0;
    let bars: Vec<Value> = buckets
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let h = 38.0 * *n as f64 / top;
            json!({"x": i as f64 * w + 1.0, "y": 40.0 - h, "w": w - 2.0, "h": h,
                "label": format!("{n} events, {} to {} ago", human_age(now - (from + i as f64 * INTAKE_BUCKET_S)), human_age(now - (from + (i + 1) as f64 * INTAKE_BUCKET_S)))})
        })
        .collect();
    // The intake's rejections over the last day, by reason, largest first.
    let rejections = api::rejections(store, now, api::REJECTION_HOURS_DEFAULT)?;
    let mut by_reason: Vec<(String, i64)> = rejections["by_reason"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(r, n)| (r.clone(), n.as_i64().unwrap_or(0)))
                .collect()
        })
        .unwrap_or_default();
    by_reason.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let disk = status["disk_free_bytes"].as_u64().map_or_else(
        || "unknown".to_string(),
        |b| format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64),
    );
    render(
        "overview.html",
        "overview",
        "/api/v1/status",
        csrf,
        now,
        json!({
            "status": status, "destinations": dests, "issues": issues, "batches": batches,
            "backlog_hours": hours, "disk_free": disk,
            "rejections": {"hours": api::REJECTION_HOURS_DEFAULT, "total": rejections["total"],
                "by_reason": by_reason},
            "intake": {"total": buckets.iter().sum::<i64>(), "bars": bars,
                "width": w * INTAKE_BUCKETS as f64, "duplicates": duplicates},
        }),
    )
}

/// The batches page: the API's filter from the same query string (so the address is the
/// bookmark), a page of rows, and the link to the next page.
fn batches(
    store: &Store,
    query: &BTreeMap<String, String>,
    csrf: &str,
    now: f64,
) -> Result<String, PageError> {
    let states: Vec<&str> = BatchState::ALL.iter().map(|s| s.as_str()).collect();
    let (rows, next, scanned_to, error) = match api::batch_filter(query) {
        Ok(f) => {
            let page = store.list_batches_page(&f, api::page_budget())?;
            let next = page.next_before.map(|before| {
                let mut q: Vec<(String, String)> = query
                    .iter()
                    .filter(|(k, v)| k.as_str() != "before" && !v.is_empty())
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                q.push(("before".into(), before.to_string()));
                format!(
                    "/batches?{}",
                    form_urlencoded::Serializer::new(String::new())
                        .extend_pairs(q)
                        .finish()
                )
            });
            (page.rows, next, page.scanned_to, None)
        }
        Err(why) => (Vec::new(), None, None, Some(why)),
    };
    // The same listing on the command line (the filters `list` has).
    let mut cli = String::new();
    for k in ["state", "source", "destination", "since", "until", "search"] {
        if let Some(v) = query.get(k).filter(|v| !v.is_empty()) {
            cli.push_str(&format!(" --{k} '{}'", v.replace('\'', "'\\''")));
        }
    }
    render(
        "batches.html",
        "batches",
        "/api/v1/batches",
        csrf,
        now,
        json!({"batches": rows, "next": next, "scanned_to": scanned_to, "error": error, "f": query,
            "states": states, "cli": cli}),
    )
}

fn dead(
    store: &Store,
    query: &BTreeMap<String, String>,
    csrf: &str,
    now: f64,
) -> Result<String, PageError> {
    let before = query.get("before").and_then(|b| b.parse::<i64>().ok());
    let page = store.list_batches_page(
        &BatchFilter {
            state: Some("dead".into()),
            before_id: before,
            limit: PAGE_DEFAULT,
            ..BatchFilter::default()
        },
        api::page_budget(),
    )?;
    let next = page.next_before.map(|b| format!("/dead?before={b}"));
    render(
        "dead.html",
        "dead",
        "/api/v1/batches?state=dead",
        csrf,
        now,
        json!({"batches": page.rows, "next": next, "scanned_to": page.scanned_to, "select": true}),
    )
}

fn batch(store: &Store, id: i64, payload: bool, csrf: &str, now: f64) -> Result<String, PageError> {
    let b = store.batch(id)?;
    let events = store.events(id, payload)?;
    let attempts = store.attempts(id)?;
    // The attempt timeline: each attempt a bar from its start, as long as it took, on a
    // scale from the first start to the last end.
    let start = attempts.first().map_or(0.0, |a| a.started_at);
    let end = attempts
        .iter()
        .map(|a| a.finished_at.unwrap_or(now))
        .fold(start, f64::max);
    let span = (end - start).max(1.0);
    let width = 600.0;
    let bars: Vec<Value> = attempts
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let x = 30.0 + (a.started_at - start) / span * (width - 40.0);
            let w = ((a.finished_at.unwrap_or(now) - a.started_at) / span * (width - 40.0)).max(3.0);
            json!({"x": x, "y": i as f64 * 16.0 + 2.0, "w": w, "n": a.n,
                "outcome": a.outcome.map_or("running".to_string(), |o| o.to_string()),
                "label": format!("#{} {} {}", a.n, a.outcome.map_or("running".to_string(), |o| o.to_string()),
                    a.duration_ms.map_or(String::new(), |d| format!("{d} ms")))})
        })
        .collect();
    render(
        "batch.html",
        "batches",
        &format!("/api/v1/batches/{id}"),
        csrf,
        now,
        json!({"b": b, "events": events, "attempts": attempts, "payload": payload,
            "timeline": {"bars": bars, "width": width, "height": attempts.len() as f64 * 16.0 + 4.0}}),
    )
}

fn destinations(admin: &Admin, store: &Store, csrf: &str, now: f64) -> Result<String, PageError> {
    let v = api::destinations(admin, store, now)?;
    let rows: Vec<Vec<Value>> = v["destinations"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|d| {
            let name = d["name"].as_str().unwrap_or("");
            let state = d["breaker"]["state"].as_str().unwrap_or("closed");
            let ms = |k: &str| d["latency_ms"][k].as_i64().map_or("-".to_string(), |v| format!("{v} ms"));
            vec![
                link(name, format!("/batches?destination={}", url_part(name))),
                json!({"text": state, "class": match state { "closed" => "ok", "paused" => "warn", _ => "bad" }}),
                cell(d["pending"].as_i64().unwrap_or(0)),
                cell(d["oldest_pending_at"].as_f64().map_or("-".into(), |t| human_age(now - t))),
                link(d["dead"].as_i64().unwrap_or(0), format!("/batches?state=dead&destination={}", url_part(name))),
                cell(format!("{} / {} / {}", ms("p50"), ms("p90"), ms("p99"))),
                // The class and status only: an error text can quote a response body.
                cell(match &d["last_error"] {
                    Value::Null => "-".to_string(),
                    e => format!(
                        "{} {} ({} ago)",
                        e["klass"].as_str().unwrap_or(""),
                        e["status"].as_i64().map_or(String::new(), |s| s.to_string()),
                        e["at"].as_f64().map_or("-".into(), |t| human_age(now - t))
                    ),
                }),
                code(if state == "paused" { format!("hookspool resume {name}") } else { format!("hookspool pause {name}") }),
            ]
        })
        .collect();
    render(
        "table.html",
        "destinations",
        "/api/v1/destinations",
        csrf,
        now,
        json!({"title": "Destinations", "columns": ["destination", "breaker", "pending", "oldest", "dead", "latency p50 / p90 / p99 (1 h)", "last error (1 d)", "command"], "rows": rows}),
    )
}

fn sources(admin: &Admin, store: &Store, csrf: &str, now: f64) -> Result<String, PageError> {
    let v = api::sources(admin, store, now)?;
    let rows: Vec<Vec<Value>> = v["sources"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|s| {
            let name = s["name"].as_str().unwrap_or("");
            vec![
                link(name, format!("/batches?source={}", url_part(name))),
                cell(s["kind"].as_str().unwrap_or("-")),
                cell(s["bobbin"].as_str().unwrap_or("-")),
                cell(
                    s["last_event_at"]
                        .as_f64()
                        .map_or("never".into(), |t| format!("{} ago", human_age(now - t))),
                ),
                cell(s["events"].as_i64().unwrap_or(0)),
                cell(s["duplicates"].as_i64().unwrap_or(0)),
                cell(s["quarantined"].as_i64().unwrap_or(0)),
                cell(rejected_cell(&s["rejected_by_reason"])),
            ]
        })
        .collect();
    render(
        "table.html",
        "sources",
        "/api/v1/sources",
        csrf,
        now,
        json!({"title": "Sources and bobbins", "note": "Counts over the last day. Rejected: requests the intake answered without storing them, by reason (stored by the intake within seconds).",
            "columns": ["source", "kind", "bobbin", "last event", "events", "duplicates", "quarantined", "rejected"], "rows": rows}),
    )
}

/// A source's rejections by reason in one cell, largest first: "unverified 3, too_large 1".
fn rejected_cell(by_reason: &Value) -> String {
    let mut v: Vec<(&String, i64)> = by_reason
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(r, n)| (r, n.as_i64().unwrap_or(0)))
                .collect()
        })
        .unwrap_or_default();
    if v.is_empty() {
        return "0".into();
    }
    v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
    v.iter()
        .map(|(r, n)| format!("{r} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn polls(store: &Store, csrf: &str, now: f64) -> Result<String, PageError> {
    let rows: Vec<Vec<Value>> = store
        .polls()?
        .iter()
        .map(|p| {
            vec![
                cell(&p.instance),
                cell(if p.next_at >= now { format!("in {}", human_age(p.next_at - now)) } else { format!("{} late", human_age(now - p.next_at)) }),
                cell(p.last_tick_at.map_or("never".into(), |t| format!("{} ago", human_age(now - t)))),
                match p.last_batch_id {
                    Some(b) => link(b, format!("/batches/{b}")),
                    None => cell("-"),
                },
                json!({"text": if p.pending { "pending" } else { "delivered" }, "class": if p.pending { "warn" } else { "ok" }}),
                cell(p.skipped),
            ]
        })
        .collect();
    render(
        "table.html",
        "polls",
        "/api/v1/polls",
        csrf,
        now,
        json!({"title": "Polls", "columns": ["instance", "next tick", "last tick", "last batch", "last tick's batch", "skipped"], "rows": rows}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_template_parses_escapes_and_the_cookie_is_not_the_token() {
        for name in [
            "overview.html",
            "batches.html",
            "batch.html",
            "dead.html",
            "issues.html",
            "table.html",
        ] {
            assert!(env().get_template(name).is_ok(), "{name}");
        }
        let html = render(
            "table.html",
            "polls",
            "/api/v1/polls",
            "c",
            0.0,
            json!({"title": "<script>alert(1)</script>", "columns": ["a"], "rows": [[cell("\"><img src=x>")]]}),
        )
        .unwrap();
        assert!(!html.contains("<script>alert"), "{html}");
        assert!(!html.contains("<img src=x>"), "{html}");
        assert!(html.contains("&lt;script&gt;"), "{html}");
        let c = cookie_value("TOKEN-0123456789abcdef");
        assert_eq!(c.len(), 64);
        assert!(!c.contains("TOKEN"));
        assert_ne!(c, cookie_value("TOKEN-0123456789abcdeg"));
        assert_ne!(c, csrf_value("TOKEN-0123456789abcdef"));
        assert_eq!(
            cookie_in(Some("a=1; hookspool_admin=abc; b=2")),
            Some("abc")
        );
        assert_eq!(cookie_in(Some("hookspool_adminx=abc")), None);
        assert_eq!(cookie_in(None), None);
        assert_eq!(human_age(30.0), "30 s");
        assert_eq!(human_age(600.0), "10 min");
    }
}
