//! Google: what google.gmail, google.calendar and google.drive share. The API base URLs,
//! the OAuth token endpoint, an authorised client that refreshes once on a 401, paging
//! (`pageToken` / `nextPageToken`, the same on every Google REST list), Google's error body
//! (a 403 or 429 whose reason says "rate limit" is Retryable, any other 403 Permanent), and
//! free/busy with the free windows it leaves.
//!
//! Shapes follow Google's public REST references: the error body of "Resolve errors"
//! (developers.google.com/workspace/gmail/api/guides/handle-errors: `error.code`,
//! `error.errors[].reason`, `error.status`), the token endpoint of "Using OAuth 2.0 for Web
//! Server Applications" (refresh-token grant), and freeBusy.query of the Calendar v3
//! reference (`calendars.<id>.busy[].start/end`).
//!
//! Must not: log a URL (a calendar id is an address), a body or a token.

use std::time::{Duration, UNIX_EPOCH};

use serde_json::{Value, json};

use crate::processor::ProcessorError;
use crate::processor::context::Context;
use crate::processor::http::{Body, HttpError, HttpErrorKind};
use crate::processor::oauth::{OAuth, TokenEndpoint};
use crate::processor::pace::Pacer;

pub const GMAIL_API: &str = "https://gmail.googleapis.com/gmail/v1";
pub const CALENDAR_API: &str = "https://www.googleapis.com/calendar/v3";
pub const DRIVE_API: &str = "https://www.googleapis.com/drive/v3";

/// Google's OAuth 2 token endpoint, and the older URIs a downloaded credential may name.
pub static TOKEN_ENDPOINT: TokenEndpoint = TokenEndpoint {
    default_uri: "https://oauth2.googleapis.com/token",
    allowed_uris: &[
        "https://oauth2.googleapis.com/token",
        "https://accounts.google.com/o/oauth2/token",
        "https://www.googleapis.com/oauth2/v4/token",
    ],
};

/// Requests a second to Google APIs from one processor run: well under the per-user quotas
/// (Gmail's 250 units/s with messages.get at 5 units; Calendar's and Drive's per-user
/// per-minute limits).
pub const REQUESTS_PER_S: f64 = 20.0;
/// A list longer than this many pages is refused rather than paged forever.
pub const PAGES_MAX: usize = 1000;
/// Free windows returned at most.
pub const FREE_WINDOWS_MAX: usize = 50;

/// Error reasons (`error.errors[].reason`, or `error.details[].reason`) that mean "slow
/// down", whatever the status (Google answers some of them with 403).
const RATE_LIMIT_REASONS: &[&str] = &[
    "rateLimitExceeded",
    "userRateLimitExceeded",
    "dailyLimitExceeded",
    "quotaExceeded",
    "RATE_LIMIT_EXCEEDED",
    "RESOURCE_EXHAUSTED",
];

/// A failed call: the API's answer (whose status a caller may give its own meaning), or a
/// failure already classified (the token endpoint, a secret).
#[derive(Debug)]
pub enum Fail {
    Api(HttpError),
    Other(ProcessorError),
}

impl Fail {
    pub fn status(&self) -> Option<u16> {
        match self {
            Fail::Api(e) if e.kind == HttpErrorKind::Status => e.status,
            _ => None,
        }
    }

    /// The Google error reasons of the answer (`badRequest`, `notFound`, ...).
    pub fn reasons(&self) -> Vec<String> {
        match self {
            Fail::Api(e) => e.body_json().map(|b| reasons(&b)).unwrap_or_default(),
            Fail::Other(_) => Vec::new(),
        }
    }

    /// Whether a 400 names this parameter as the bad one (`error.errors[].location`).
    pub fn bad_parameter(&self, name: &str) -> bool {
        let Fail::Api(e) = self else { return false };
        self.status() == Some(400)
            && e.body_json().is_some_and(|b| {
                b.pointer("/error/errors")
                    .and_then(Value::as_array)
                    .is_some_and(|errs| {
                        errs.iter()
                            .any(|x| x.get("location").and_then(Value::as_str) == Some(name))
                    })
            })
    }
}

impl From<ProcessorError> for Fail {
    fn from(e: ProcessorError) -> Fail {
        Fail::Other(e)
    }
}

impl From<Fail> for ProcessorError {
    fn from(f: Fail) -> ProcessorError {
        match f {
            Fail::Other(e) => e,
            Fail::Api(e) => classify(e),
        }
    }
}

fn reasons(body: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for list in ["/error/errors", "/error/details"] {
        if let Some(items) = body.pointer(list).and_then(Value::as_array) {
            out.extend(
                items
                    .iter()
                    .filter_map(|i| i.get("reason").and_then(Value::as_str))
                    .map(str::to_string),
            );
        }
    }
    if let Some(s) = body.pointer("/error/status").and_then(Value::as_str) {
        out.push(s.to_string());
    }
    out
}

/// A Google reason is an identifier; anything else is not put into a reason.
fn safe_token(s: &str) -> bool {
    !s.is_empty() && s.len() <= 40 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Google's answers mapped: a rate-limit reason is Retryable even on a 403; any other 403 is
/// Permanent (a missing scope, an API not enabled, no access to the calendar: a person's
/// fix, and a retry cannot succeed), named with its reason; the rest as `ctx.http` maps it.
pub fn classify(e: HttpError) -> ProcessorError {
    let found = e.body_json().map(|b| reasons(&b)).unwrap_or_default();
    let status = e.status.unwrap_or(0);
    if let Some(r) = found
        .iter()
        .find(|r| RATE_LIMIT_REASONS.contains(&r.as_str()))
    {
        return ProcessorError::retryable(format!("Google API rate limit ({status} {r})"))
            .with_retry_after(e.retry_after_s);
    }
    if e.kind == HttpErrorKind::Status && status == 403 {
        let why = found
            .iter()
            .find(|r| safe_token(r))
            .map_or("forbidden", String::as_str);
        return ProcessorError::permanent(format!(
            "Google API refused access (403 {why}): check the credential's scopes and that the API is enabled"
        ));
    }
    e.into_error()
}

/// An authorised, paced Google client for one credential.
pub struct Google {
    oauth: OAuth,
    pacer: Pacer,
}

enum Call<'a> {
    Get(&'a [(&'a str, &'a str)]),
    PostJson(&'a Value),
}

impl Google {
    pub fn new(ctx: &Context, secret: &str) -> Result<Google, ProcessorError> {
        Ok(Google {
            oauth: ctx.oauth(secret, &TOKEN_ENDPOINT)?,
            pacer: ctx.pace(REQUESTS_PER_S),
        })
    }

    async fn call(&mut self, ctx: &mut Context, url: &str, call: Call<'_>) -> Result<Value, Fail> {
        let mut refreshed = false;
        loop {
            let token = self.oauth.bearer(ctx).await?;
            self.pacer.wait().await;
            let answer = match &call {
                Call::Get(q) => ctx.http().get_json(url, q, Some(&token)).await,
                Call::PostJson(b) => ctx.http().post(url, Some(&token), Body::Json(b)).await,
            };
            match answer {
                Ok(v) => return Ok(v),
                // One 401: the cached token was revoked or expired early. Refresh once.
                Err(e) if e.status == Some(401) && !refreshed => {
                    refreshed = true;
                    self.oauth.invalidate(ctx)?;
                }
                Err(e) => return Err(Fail::Api(e)),
            }
        }
    }

    pub async fn get(
        &mut self,
        ctx: &mut Context,
        url: &str,
        query: &[(&str, &str)],
    ) -> Result<Value, Fail> {
        self.call(ctx, url, Call::Get(query)).await
    }

    pub async fn post_json(
        &mut self,
        ctx: &mut Context,
        url: &str,
        body: &Value,
    ) -> Result<Value, Fail> {
        self.call(ctx, url, Call::PostJson(body)).await
    }

    /// Pages through a Google list: `each` sees every page in order, the next request
    /// carries `pageToken` = the previous `nextPageToken` (replacing any `pageToken` in
    /// `query`), and the last page is returned (it holds `nextSyncToken`,
    /// `newStartPageToken` or `historyId`).
    pub async fn pages(
        &mut self,
        ctx: &mut Context,
        url: &str,
        query: &[(&str, &str)],
        mut each: impl FnMut(&Value) -> Result<(), ProcessorError>,
    ) -> Result<Value, Fail> {
        let mut next: Option<String> = None;
        for _ in 0..PAGES_MAX {
            let mut q: Vec<(&str, &str)> = query.to_vec();
            if let Some(token) = &next {
                q.retain(|(k, _)| *k != "pageToken");
                q.push(("pageToken", token));
            }
            let page = self.get(ctx, url, &q).await?;
            each(&page)?;
            match page.get("nextPageToken").and_then(Value::as_str) {
                Some(t) if !t.is_empty() => next = Some(t.to_string()),
                _ => return Ok(page),
            }
        }
        Err(Fail::Other(ProcessorError::permanent(format!(
            "Google list longer than {PAGES_MAX} pages"
        ))))
    }

    /// Busy intervals (Unix seconds) of one calendar between two times (freeBusy.query).
    pub async fn busy(
        &mut self,
        ctx: &mut Context,
        calendar_id: &str,
        from: f64,
        to: f64,
    ) -> Result<Vec<(f64, f64)>, Fail> {
        let body = json!({
            "timeMin": rfc3339(from),
            "timeMax": rfc3339(to),
            "items": [{"id": calendar_id}],
        });
        let answer = self
            .post_json(ctx, &format!("{CALENDAR_API}/freeBusy"), &body)
            .await?;
        let cal = answer
            .get("calendars")
            .and_then(|c| c.get(calendar_id))
            .ok_or_else(|| ProcessorError::retryable("free/busy answer has no calendar"))?;
        if cal
            .get("errors")
            .and_then(Value::as_array)
            .is_some_and(|e| !e.is_empty())
        {
            return Err(Fail::Other(ProcessorError::permanent(
                "free/busy: the owner's calendar is not readable with this credential",
            )));
        }
        let mut busy = Vec::new();
        for b in cal
            .get("busy")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let time = |k: &str| b.get(k).and_then(Value::as_str).and_then(parse_rfc3339);
            if let (Some(s), Some(e)) = (time("start"), time("end")) {
                busy.push((s, e));
            }
        }
        Ok(busy)
    }
}

/// The gaps of at least `min_len_s` between busy intervals inside `[from, to]`, at most
/// [`FREE_WINDOWS_MAX`]. Pure.
pub fn free_windows(
    mut busy: Vec<(f64, f64)>,
    from: f64,
    to: f64,
    min_len_s: f64,
) -> Vec<(f64, f64)> {
    busy.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut out = Vec::new();
    let mut cursor = from;
    for (start, end) in busy {
        if start - cursor >= min_len_s {
            out.push((cursor, start.min(to)));
        }
        cursor = cursor.max(end);
        if cursor >= to {
            break;
        }
    }
    if to - cursor >= min_len_s {
        out.push((cursor, to));
    }
    out.retain(|(s, e)| e - s >= min_len_s);
    out.truncate(FREE_WINDOWS_MAX);
    out
}

/// Whether every event of a watch-channel batch (Calendar and Drive push, the payload the
/// calendar source builds from the X-Goog-* headers) is the `sync` message a new channel
/// sends first: it is acknowledged, and there is nothing to fetch.
pub fn only_sync_pings(events: &[Value]) -> bool {
    !events.is_empty()
        && events
            .iter()
            .all(|e| e.get("resource_state").and_then(Value::as_str) == Some("sync"))
}

/// `base` with path segments appended, each percent-encoded (a calendar id is an address).
pub fn url(base: &str, segments: &[&str]) -> Result<String, ProcessorError> {
    let mut u =
        reqwest::Url::parse(base).map_err(|_| ProcessorError::bug("Google base URL invalid"))?;
    u.path_segments_mut()
        .map_err(|_| ProcessorError::bug("Google base URL cannot take a path"))?
        .extend(segments);
    Ok(u.to_string())
}

/// `2026-05-01T09:00:00Z`.
pub fn rfc3339(t: f64) -> String {
    let t = UNIX_EPOCH + Duration::from_secs(t.max(0.0) as u64);
    humantime::format_rfc3339_seconds(t).to_string()
}

/// Unix seconds of a UTC RFC 3339 time (what freeBusy answers without a timeZone).
pub fn parse_rfc3339(s: &str) -> Option<f64> {
    let t = humantime::parse_rfc3339(s)
        .or_else(|_| humantime::parse_rfc3339_weak(s))
        .ok()?;
    t.duration_since(UNIX_EPOCH).ok().map(|d| d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_windows_are_the_long_enough_gaps() {
        let busy = vec![(200.0, 300.0), (100.0, 150.0), (280.0, 400.0)];
        assert_eq!(
            free_windows(busy, 0.0, 1000.0, 60.0),
            vec![(0.0, 100.0), (400.0, 1000.0)],
            "150..200 is too short; overlapping busy merges"
        );
        assert_eq!(free_windows(vec![(0.0, 2000.0)], 0.0, 1000.0, 1.0), vec![]);
    }

    #[test]
    fn segments_are_encoded_and_sync_pings_recognised() {
        assert_eq!(
            url(CALENDAR_API, &["calendars", "a b@example.com", "events"]).unwrap(),
            "https://www.googleapis.com/calendar/v3/calendars/a%20b@example.com/events"
        );
        let sync = json!({"resource_state": "sync"});
        let exists = json!({"resource_state": "exists"});
        assert!(only_sync_pings(std::slice::from_ref(&sync)));
        assert!(!only_sync_pings(&[sync, exists]));
        assert!(!only_sync_pings(&[]));
    }

    #[test]
    fn times_round_trip() {
        assert_eq!(rfc3339(1_777_626_000.0), "2026-05-01T09:00:00Z");
        assert_eq!(parse_rfc3339("2026-05-01T09:00:00Z"), Some(1_777_626_000.0));
    }

    #[test]
    fn a_rate_limit_403_is_retryable_and_another_403_permanent() {
        use crate::processor::Failure::*;
        // The shapes of Google's "Resolve errors" page.
        let e = |status: u16, body: &str| {
            crate::processor::http::test_support::status_error(status, body)
        };
        let rate = r#"{"error":{"code":403,"errors":[{"domain":"usageLimits","reason":"userRateLimitExceeded","message":"User Rate Limit Exceeded"}],"message":"User Rate Limit Exceeded"}}"#;
        assert_eq!(classify(e(403, rate)).failure, Retryable);
        let scope = r#"{"error":{"code":403,"errors":[{"domain":"global","reason":"insufficientPermissions","message":"SENTINEL"}],"message":"SENTINEL"}}"#;
        let p = classify(e(403, scope));
        assert_eq!(p.failure, Permanent);
        assert!(p.reason.contains("insufficientPermissions") && !p.reason.contains("SENTINEL"));
        assert_eq!(classify(e(429, "{}")).failure, Retryable);
        assert_eq!(classify(e(500, "not json")).failure, Retryable);
    }
}
