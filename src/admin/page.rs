//! The dashboard's first page (issue 31): GET / renders an overview as server-side HTML
//! with inline CSS, no JavaScript and nothing fetched from elsewhere: the status line, the
//! backlog per destination (how many, the oldest's age, the breaker, in flight), open
//! issues, and the recent batches with the `journalctl BATCH=<id>` and `hookspool replay
//! <id>` lines to copy.
//!
//! Signing in: `/?token=<token>` once sets the session cookie (HttpOnly, SameSite=Strict)
//! and redirects to `/`, so the token leaves the address bar; the cookie then authenticates
//! reads (GET) only, never an action. The cookie holds a digest of the token, not the token.
//!
//! Must not: show a secret, a payload, a header value or an error text (a script's error
//! can quote what it was fed); every value from the spool goes through [`esc`].

use std::fmt::Write as _;

use serde_json::Value;
use sha2::Digest;

use super::Admin;
use crate::store::{BatchFilter, Store, StoreError};

/// The session cookie's name.
pub const COOKIE: &str = "hookspool_admin";
/// Recent batches the overview lists.
pub const RECENT_BATCHES_MAX: usize = 25;
/// Open issues the overview lists.
pub const OPEN_ISSUES_MAX: usize = 50;

/// HTML-escape text for an element's content or a quoted attribute.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The cookie's value for `token`: a digest, so the cookie jar never holds the token.
pub fn cookie_value(token: &str) -> String {
    let mut h = sha2::Sha256::new();
    h.update(b"hookspool admin session\0");
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
fn ago(s: f64) -> String {
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

const STYLE: &str = "body{font:15px/1.4 system-ui,sans-serif;margin:0 auto;max-width:72rem;padding:1rem;color:#1d2430;background:#f7f8fa}\
h1{font-size:1.4rem;margin:.2rem 0 1rem}h2{font-size:1.1rem;margin:1.5rem 0 .5rem}\
table{border-collapse:collapse;width:100%;background:#fff;font-size:14px}\
th,td{text-align:left;padding:.35rem .5rem;border-bottom:1px solid #e3e6eb;vertical-align:top}\
th{background:#eef1f5;font-weight:600}code{font-size:13px;background:#f0f2f5;padding:0 .2rem;border-radius:3px;user-select:all}\
.ok{color:#0a7d32;font-weight:600}.bad{color:#b3261e;font-weight:600}.warn{color:#9a6200;font-weight:600}\
.muted{color:#68707d}.wrap{overflow-x:auto}@media(max-width:40rem){td,th{padding:.3rem}}";

/// The overview's data, read on one reader connection.
pub fn overview(admin: &Admin, store: &Store) -> Result<String, StoreError> {
    let now = admin.clock.now();
    let status = crate::observe::status::collect(store, &admin.cfg, now)?;
    let pending = store.pending_by_destination()?;
    let issues = store.issues(&["open", "acked"], OPEN_ISSUES_MAX)?;
    let batches = store.list_batches(&BatchFilter {
        limit: RECENT_BATCHES_MAX,
        ..BatchFilter::default()
    })?;
    let mut h = String::new();
    let _ = write!(
        h,
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width,initial-scale=1\"><title>hookspool</title><style>{STYLE}</style></head><body>"
    );
    let ok = status["ok"].as_bool().unwrap_or(false);
    let degraded: Vec<String> = status["degraded"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).map(esc).collect())
        .unwrap_or_default();
    let _ = write!(
        h,
        "<h1>hookspool <span class=\"{}\">{}</span></h1><p class=\"muted\">{}dispatcher {}; open issues {}. Refresh to update.</p>",
        if ok { "ok" } else { "bad" },
        if ok { "ok" } else { "not ok" },
        if degraded.is_empty() {
            String::new()
        } else {
            format!("degraded: {}; ", degraded.join(", "))
        },
        if status["dispatcher"]["alive"].as_bool() == Some(true) {
            "alive"
        } else {
            "not alive"
        },
        status["issues_open"].as_i64().unwrap_or(0)
    );

    h.push_str("<h2>Backlog</h2><div class=\"wrap\"><table><tr><th>destination</th><th>breaker</th><th>pending</th><th>oldest</th><th>in flight</th></tr>");
    let empty = serde_json::Map::new();
    let dests = status["destinations"].as_object().unwrap_or(&empty);
    for (name, d) in dests {
        let (n, oldest) = pending
            .iter()
            .find(|(p, _, _)| p == name)
            .map_or((0, None), |(_, n, t)| (*n, Some(now - t)));
        let state = d["state"].as_str().unwrap_or("closed");
        let class = match state {
            "closed" => "ok",
            "paused" => "warn",
            _ => "bad",
        };
        let _ = write!(
            h,
            "<tr><td><code>{}</code></td><td class=\"{class}\">{}</td><td>{n}</td><td>{}</td><td>{}</td></tr>",
            esc(name),
            esc(state),
            oldest.map(ago).unwrap_or_else(|| "-".into()),
            d["inflight"]
                .as_i64()
                .map_or_else(|| "-".to_string(), |i| i.to_string()),
        );
    }
    if dests.is_empty() {
        h.push_str("<tr><td colspan=\"5\" class=\"muted\">no destinations yet</td></tr>");
    }
    h.push_str("</table></div>");

    h.push_str("<h2>Open issues</h2><div class=\"wrap\"><table><tr><th>issue</th><th>state</th><th>count</th><th>last seen</th><th>to act</th></tr>");
    for i in &issues {
        let _ = write!(
            h,
            "<tr><td><code>{}</code></td><td>{}</td><td>{}</td><td>{} ago</td><td><code>hookspool issues ack {}</code></td></tr>",
            esc(&i.fingerprint),
            esc(&i.state),
            i.count,
            ago(now - i.last_at),
            i.id
        );
    }
    if issues.is_empty() {
        h.push_str("<tr><td colspan=\"5\" class=\"muted\">none</td></tr>");
    }
    h.push_str("</table></div>");

    h.push_str("<h2>Recent batches</h2><div class=\"wrap\"><table><tr><th>batch</th><th>state</th><th>route</th><th>destination</th><th>events</th><th>first event</th><th>to look and replay</th></tr>");
    for b in &batches {
        let state = b.state.to_string();
        let class = match state.as_str() {
            "delivered" => "ok",
            "dead" => "bad",
            "retry" => "warn",
            _ => "muted",
        };
        let _ = write!(
            h,
            "<tr><td>{id}</td><td class=\"{class}\">{}</td><td>{}</td><td><code>{}</code></td><td>{}</td><td>{} ago</td><td><code>journalctl BATCH={id}</code><br><code>hookspool replay {id}</code></td></tr>",
            esc(&state),
            esc(&b.route),
            esc(&b.destination),
            b.count,
            ago(now - b.first_at),
            id = b.id,
        );
    }
    if batches.is_empty() {
        h.push_str("<tr><td colspan=\"7\" class=\"muted\">no batches yet</td></tr>");
    }
    h.push_str("</table></div><p class=\"muted\">The JSON API: <code>/api/v1/status</code>, <code>/api/v1/batches</code>, <code>/api/v1/issues</code>.</p></body></html>");
    Ok(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_escaper_leaves_no_markup_and_the_cookie_is_not_the_token() {
        assert_eq!(
            esc(r#"<script>alert("x")</script> & 'y'"#),
            "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &#39;y&#39;"
        );
        assert_eq!(esc("http:r0 ünïcode"), "http:r0 ünïcode");
        let c = cookie_value("TOKEN-0123456789abcdef");
        assert_eq!(c.len(), 64);
        assert!(!c.contains("TOKEN"));
        assert_ne!(c, cookie_value("TOKEN-0123456789abcdeg"));
        assert_eq!(
            cookie_in(Some("a=1; hookspool_admin=abc; b=2")),
            Some("abc")
        );
        assert_eq!(cookie_in(Some("hookspool_adminx=abc")), None);
        assert_eq!(cookie_in(None), None);
        assert_eq!(ago(30.0), "30 s");
        assert_eq!(ago(600.0), "10 min");
    }
}
