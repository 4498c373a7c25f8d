//! The `hermes` destination (spec 14.2): POST the document to a Hermes Agent gateway at
//! `<base_url>/webhooks/<route>` or `<base_url>/p/<profile>/webhooks/<route>`, signed with the
//! route's secret read fresh from `subscriptions_path` on every attempt (rotation without a
//! restart). Per-attempt delivery ids; per-event with `unwrap = true` (spec 6.4, 6.4.1).
//!
//! Compatibility with released gateways: `X-Request-ID` equals the webhook-id (they read
//! their delivery id from it), `X-Hub-Signature-256` is kept (older ones verify only that),
//! the body is always a JSON object. Answers: 202 accepted/coalesced, 200
//! duplicate/ignored/delivered, 401 bad signature, 403 disabled route, 404 unknown route,
//! 413 over its body limit, 429 its per-route rate limit (no Retry-After).
//!
//! Must not: touch the store, cache the secret, follow redirects, or put a secret or a body
//! in a log or an outcome.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderName};
use serde::Deserialize;

use super::http::{add_value, common_problems};
use super::outcome::{self, Klass, Outcome, OutcomeKind};
use super::subscriptions::{self, RouteEntry};

use super::wire::{self, Answer, BuildError, Signing, TlsRoots, UnwrapProgress};
use super::{Delivery, Idempotency, event_delivery_id};

pub const HERMES_BASE_URL_DEFAULT: &str = "http://127.0.0.1:8644";
pub const HERMES_SUBSCRIPTIONS_PATH_DEFAULT: &str = "~/.hermes/webhook_subscriptions.json";
pub const HERMES_TIMEOUT_S_DEFAULT: f64 = 30.0;
/// Hermes' own default webhook `max_body_bytes` (1 MiB).
pub const HERMES_MAX_BODY_BYTES_DEFAULT: u64 = 1024 * 1024;

/// The `[hermes]` table merged with a `[destinations."hermes:<route>"]` override. Unknown-key
/// detection belongs to the config module's raw tables.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct HermesConfig {
    #[serde(default = "default_base_url")]
    pub base_url: String,
    #[serde(default = "default_subscriptions_path")]
    pub subscriptions_path: PathBuf,
    /// Forces `/p/<profile>/`; without it the route's own `profile` in the file decides.
    #[serde(default)]
    pub profile: Option<String>,
    #[serde(default = "default_timeout_s")]
    pub timeout_s: f64,
    #[serde(default = "default_max_body_bytes")]
    pub max_body_bytes: u64,
    /// Also send `X-Hub-Signature-256` (older gateways verify only that).
    #[serde(default = "default_true")]
    pub legacy_signature: bool,
    /// Addresses in the ranges the egress policy refuses that this gateway may be at: by
    /// default 127.0.0.1 and ::1 only (the gateway listens on loopback).
    #[serde(default = "crate::egress::loopback_only")]
    pub allow_private: crate::egress::Allow,
    #[serde(default)]
    pub unwrap: bool,
    /// Header carrying the event type; without it the feeding source's `event_header`
    /// (`Delivery::source_event_header`) is used.
    #[serde(default)]
    pub event_header: Option<String>,
    /// Header carrying each event's dedup id (unwrap mode only).
    #[serde(default)]
    pub dedup_header: Option<String>,
}

fn default_base_url() -> String {
    HERMES_BASE_URL_DEFAULT.into()
}
fn default_subscriptions_path() -> PathBuf {
    PathBuf::from(HERMES_SUBSCRIPTIONS_PATH_DEFAULT)
}
fn default_timeout_s() -> f64 {
    HERMES_TIMEOUT_S_DEFAULT
}
fn default_max_body_bytes() -> u64 {
    HERMES_MAX_BODY_BYTES_DEFAULT
}
fn default_true() -> bool {
    true
}

impl Default for HermesConfig {
    fn default() -> HermesConfig {
        HermesConfig {
            base_url: default_base_url(),
            subscriptions_path: default_subscriptions_path(),
            profile: None,
            timeout_s: HERMES_TIMEOUT_S_DEFAULT,
            max_body_bytes: HERMES_MAX_BODY_BYTES_DEFAULT,
            legacy_signature: true,
            allow_private: crate::egress::loopback_only(),
            unwrap: false,
            event_header: None,
            dedup_header: None,
        }
    }
}

impl HermesConfig {
    /// Problems with the config alone, for `hookspool check`. See [`check_route`] for the
    /// subscriptions file.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        match reqwest::Url::parse(&self.base_url) {
            Ok(u) if matches!(u.scheme(), "http" | "https") && !u.cannot_be_a_base() => {
                if u.query().is_some() {
                    out.push("hermes base_url must not carry a query string".into());
                }
            }
            _ => out.push(
                "hermes base_url is not an http(s) URL: write base_url = \"http://127.0.0.1:8644\""
                    .into(),
            ),
        }
        if let Some(p) = &self.profile
            && !valid_segment(p)
        {
            out.push(format!(
                "hermes profile {p:?} is not a profile name: use letters, digits, '-', '_' or '.'"
            ));
        }
        out.extend(common_problems(
            self.timeout_s,
            self.max_body_bytes,
            self.event_header.as_deref(),
            self.dedup_header.as_deref(),
        ));
        if self.dedup_header.is_some() && !self.unwrap {
            out.push(
                "dedup_header only applies with unwrap = true: remove it or set unwrap = true"
                    .into(),
            );
        }
        out
    }
}

/// `check` for one hermes route: the config, then the subscriptions file as the gateway will
/// see it (spec 5, 15): the route exists, has a secret, is enabled, and, unless hookspool
/// unwraps, sets neither `events` nor `coalesce`.
pub fn check_route(cfg: &HermesConfig, route: &str) -> Vec<String> {
    let mut out = cfg.problems();
    if !valid_segment(route) {
        out.push(format!(
            "hermes route {route:?} is not a route name: use letters, digits, '-', '_' or '.'"
        ));
        return out;
    }
    match subscriptions::read_blocking(&expand_home(&cfg.subscriptions_path), route) {
        Err(e) => out.push(e.to_string()),
        Ok(entry) => {
            if entry.secret.is_none() {
                out.push(no_secret_text(route));
            }
            if !entry.enabled {
                out.push(format!(
                    "hermes route {route:?} is disabled (enabled: false): enable it, or stop \
                     routing to hermes:{route}"
                ));
            }
            if !cfg.unwrap && entry.events {
                out.push(format!(
                    "hermes route {route:?} sets events: a hookspool document carries many event \
                     types, so remove events from the route (route per type in hookspool), or set \
                     unwrap = true"
                ));
            }
            if !cfg.unwrap && entry.coalesce {
                out.push(format!(
                    "hermes route {route:?} sets coalesce: hookspool already coalesces (Hermes keeps \
                     only the last event), so remove coalesce from the route, or set unwrap = true"
                ));
            }
        }
    }
    out
}

fn no_secret_text(route: &str) -> String {
    format!(
        "hermes route {route:?} has no secret in the subscriptions file: hookspool signs with the \
         route's own secret; set one (hermes webhook subscribe {route} --secret ...)"
    )
}

/// A route or profile name that is safe as one URL path segment.
fn valid_segment(s: &str) -> bool {
    !s.is_empty()
        && s != "."
        && s != ".."
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// `~/x` → `$HOME/x`, the way Hermes and the spec's example write the path.
fn expand_home(p: &Path) -> PathBuf {
    match (p.strip_prefix("~"), std::env::var_os("HOME")) {
        (Ok(rest), Some(home)) => PathBuf::from(home).join(rest),
        _ => p.to_path_buf(),
    }
}

/// A validated hermes destination for one Hermes route; share it (`Arc`) between workers.
#[derive(Debug)]
pub struct HermesDestination {
    route: String,
    cfg: HermesConfig,
    base: reqwest::Url,
    subscriptions_path: PathBuf,
    timeout: Duration,
    client: wire::Client,
    event_header: Option<HeaderName>,
    dedup_header: Option<HeaderName>,
}

impl HermesDestination {
    /// `route` is the Hermes route (the `<route>` of `hermes:<route>`).
    pub fn new(
        route: impl Into<String>,
        cfg: HermesConfig,
        roots: TlsRoots,
    ) -> Result<HermesDestination, BuildError> {
        let route = route.into();
        let mut problems = cfg.problems();
        if !valid_segment(&route) {
            problems.push(format!("hermes route {route:?} is not a route name"));
        }
        if !problems.is_empty() {
            return Err(BuildError::Invalid(problems.join("; ")));
        }
        let base = reqwest::Url::parse(&cfg.base_url)
            .map_err(|_| BuildError::Url("hermes base_url".into()))?;
        let timeout = Duration::try_from_secs_f64(cfg.timeout_s)
            .map_err(|_| BuildError::Invalid("timeout_s".into()))?;
        let event_header = cfg
            .event_header
            .as_deref()
            .map(|h| wire::parse_header_name("event_header", h))
            .transpose()?;
        let dedup_header = cfg
            .dedup_header
            .as_deref()
            .map(|h| wire::parse_header_name("dedup_header", h))
            .transpose()?;
        // The gateway usually listens on loopback over plain http (its default), so https is
        // not forced here; TLS, when used, is verified like everywhere else.
        let policy = crate::egress::Policy::new(cfg.allow_private.clone());
        let client = wire::build_client(
            false,
            &roots,
            &policy,
            Arc::new(crate::egress::SystemLookup),
        )?;
        Ok(HermesDestination {
            subscriptions_path: expand_home(&cfg.subscriptions_path),
            route,
            cfg,
            base,
            timeout,
            client,
            event_header,
            dedup_header,
        })
    }

    pub fn route(&self) -> &str {
        &self.route
    }

    pub fn config(&self) -> &HermesConfig {
        &self.cfg
    }

    pub fn idempotency(&self) -> Idempotency {
        if self.cfg.unwrap {
            Idempotency::PerEvent
        } else {
            Idempotency::PerAttempt
        }
    }

    /// The document's `delivery_id` (spec 6.4). Pure.
    pub fn delivery_id(&self, d: &Delivery) -> String {
        self.idempotency().delivery_id(d)
    }

    /// The URL for this route, under `/p/<profile>/` when a profile applies.
    pub fn url(&self, profile: Option<&str>) -> Option<reqwest::Url> {
        let mut u = self.base.clone();
        {
            let mut segs = u.path_segments_mut().ok()?;
            segs.pop_if_empty();
            if let Some(p) = profile {
                segs.push("p").push(p);
            }
            segs.push("webhooks").push(&self.route);
        }
        Some(u)
    }

    /// One attempt. The route's secret and profile are read from the subscriptions file now.
    pub async fn deliver(&self, d: &Delivery) -> Outcome {
        let started = std::time::Instant::now();
        let outcome = match subscriptions::read(&self.subscriptions_path, &self.route).await {
            Err(e) => Outcome::retry(Klass::Config, None, "hermes subscriptions unreadable")
                .with_detail(&e.to_string()),
            Ok(entry) => self.deliver_with(d, &entry).await,
        };
        tracing::debug!(
            batch_id = d.batch_id,
            attempt = d.attempt_n,
            hermes_route = %self.route,
            status = outcome.status,
            reason = %outcome.reason,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "hermes attempt finished"
        );
        outcome
    }

    async fn deliver_with(&self, d: &Delivery, entry: &RouteEntry) -> Outcome {
        let Some(secret) = entry.secret.as_deref() else {
            return Outcome::retry(Klass::Config, None, "hermes route secret missing")
                .with_detail(&no_secret_text(&self.route));
        };
        let profile = self.cfg.profile.as_deref().or(entry.profile.as_deref());
        if let Some(p) = profile
            && !valid_segment(p)
        {
            return Outcome::retry(Klass::Config, None, "hermes profile invalid").with_detail(
                "the route's profile in the subscriptions file is not a profile name",
            );
        }
        let Some(url) = self.url(profile) else {
            return Outcome::retry(Klass::Config, None, "hermes base_url cannot take a path");
        };
        let v1 = [secret.as_bytes().to_vec()];
        let signing = Signing {
            v1: &v1,
            hub: self.cfg.legacy_signature.then_some(secret.as_bytes()),
            request_id: true,
        };
        let fallback;
        let event_header = match &self.event_header {
            Some(h) => Some(h),
            None => {
                // The source's header, when it is one hookspool may set; else none.
                fallback = d
                    .source_event_header
                    .as_deref()
                    .filter(|h| wire::header_name_problem("event_header", h).is_none())
                    .and_then(|h| HeaderName::from_bytes(h.as_bytes()).ok());
                fallback.as_ref()
            }
        };
        let ctx = Attempt {
            dest: self,
            d,
            url: &url,
            signing: &signing,
            profile,
        };
        if self.cfg.unwrap {
            let mut progress = UnwrapProgress::default();
            for ev in &d.events {
                let id = event_delivery_id(&d.instance_id, d.batch_id, ev.id);
                let mut h = HeaderMap::new();
                add_value(&mut h, event_header, Some(ev.event_type.as_str()));
                add_value(&mut h, self.dedup_header.as_ref(), ev.dedup_id.as_deref());
                let o = ctx.post_one(&id, &ev.payload, h, true).await;
                if o.kind != OutcomeKind::Ok {
                    return progress.failed(ev.id, o);
                }
                progress.accepted(&o);
            }
            progress.finish()
        } else {
            let id = self.delivery_id(d);
            let mut h = HeaderMap::new();
            add_value(&mut h, event_header, d.event_type.as_deref());
            ctx.post_one(&id, &d.body, h, false).await
        }
    }
}

struct Attempt<'a> {
    dest: &'a HermesDestination,
    d: &'a Delivery,
    url: &'a reqwest::Url,
    signing: &'a Signing<'a>,
    profile: Option<&'a str>,
}

impl Attempt<'_> {
    async fn post_one(&self, id: &str, body: &[u8], extra: HeaderMap, unwrap: bool) -> Outcome {
        let max = self.dest.cfg.max_body_bytes;
        if body.len() as u64 > max {
            return Outcome::dead(Klass::Permanent, None, "body exceeds max_body_bytes")
                .with_detail(&format!(
                    "{} bytes > hermes max_body_bytes {max}: split the batch or lower the route's \
                     max_bytes",
                    body.len()
                ));
        }
        if !is_json_object(body) {
            return Outcome::dead(Klass::Permanent, None, "body is not a JSON object")
                .with_detail("Hermes accepts only a JSON object body; this payload is not one");
        }
        let headers = match wire::signed_headers(self.signing, id, self.d, body, &extra) {
            Ok(h) => h,
            Err(e) => return e.into_outcome(),
        };
        match wire::post(
            &self.dest.client,
            self.url,
            headers,
            body.to_vec(),
            self.dest.timeout,
            self.d.deadline,
        )
        .await
        {
            Answer::Failed(o) => o,
            Answer::Http {
                status,
                retry_after,
                body,
            } => answer_outcome(
                &self.dest.route,
                self.profile,
                Sent::of(self.signing),
                status,
                retry_after.as_deref(),
                &body,
                unwrap,
            ),
        }
    }
}

/// Whether `body` is one JSON object (the only body Hermes accepts as JSON).
fn is_json_object(body: &[u8]) -> bool {
    let first = body.iter().find(|b| !b.is_ascii_whitespace());
    first == Some(&b'{') && serde_json::from_slice::<serde::de::IgnoredAny>(body).is_ok()
}

/// Hermes' answers (spec 14.2, 6.4.1).
fn answer_outcome(
    route: &str,
    profile: Option<&str>,
    sent: Sent,
    status: u16,
    retry_after: Option<&str>,
    body: &[u8],
    unwrap: bool,
) -> Outcome {
    let code = Some(i64::from(status));
    match status {
        200..=299 => {
            let said = serde_json::from_slice::<serde_json::Value>(body)
                .ok()
                .and_then(|v| v.get("status").and_then(|s| s.as_str()).map(str::to_owned));
            let said = said.as_deref().filter(|s| is_known_status(s));
            let mut o = Outcome::ok(code).with_reason(format!("hermes {}", said.unwrap_or("2xx")));
            if !unwrap && let Some(s @ ("ignored" | "coalesced")) = said {
                o.notice = Some(notice_text(route, s));
            }
            o
        }
        401 => Outcome::retry(Klass::Config, code, sent.rejected_reason()).with_detail(&match sent {
            Sent::Both => format!(
                "Hermes answered 401 for route {route:?} to webhook-signature and X-Hub-Signature-256: \
                 its secret for the route differs from the one in the subscriptions file hookspool read \
                 (a rotation in progress, or the gateway has not reloaded); fix the secret"
            ),
            Sent::StandardOnly => format!(
                "Hermes answered 401 for route {route:?}: hookspool sent webhook-signature only \
                 (legacy_signature = false), and released gateways verify only X-Hub-Signature-256; \
                 remove legacy_signature = false, or fix the secret if this gateway verifies \
                 webhook-signature"
            ),
        }),
        403 => Outcome::retry(Klass::Config, code, "hermes route disabled").with_detail(&format!(
            "Hermes answered 403 for route {route:?}: the route is disabled (enabled: false) or has no \
             secret on the gateway; enable it in the subscriptions file"
        )),
        404 => Outcome::retry(Klass::Config, code, "hermes unknown route").with_detail(&match profile {
            Some(p) => format!(
                "Hermes answered 404 for route {route:?} under profile {p:?}: the gateway does not \
                 know the route or does not serve the profile; create the route or fix the profile"
            ),
            None => format!(
                "Hermes answered 404 for route {route:?}: the gateway does not know the route; \
                 `hermes webhook subscribe {route}` or fix hermes.base_url"
            ),
        }),
        413 => Outcome::dead(Klass::Permanent, code, "hermes body too large").with_detail(
            "Hermes answered 413: the body is over the gateway's max_body_bytes; set hermes.max_body_bytes \
             to the gateway's value so check bounds the route's max_bytes, then split and replay",
        ),
        // 429 without Retry-After is Hermes' per-route rate limit (default 30/min): throttle,
        // retried on the backoff schedule. Redirects mean the base URL is wrong: config.
        _ => outcome::from_http_status(status, retry_after, wire::unix_now_s(), Klass::Config),
    }
}

/// Which signature headers an attempt carried (the 401 reason says, spec 6.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sent {
    Both,
    StandardOnly,
}

impl Sent {
    fn of(signing: &Signing<'_>) -> Sent {
        match signing.hub {
            Some(_) => Sent::Both,
            None => Sent::StandardOnly,
        }
    }

    fn rejected_reason(self) -> &'static str {
        match self {
            Sent::Both => {
                "hermes rejected the signature (sent webhook-signature and X-Hub-Signature-256)"
            }
            Sent::StandardOnly => {
                "hermes rejected the signature (sent webhook-signature only; legacy_signature = false)"
            }
        }
    }
}

fn is_known_status(s: &str) -> bool {
    matches!(
        s,
        "accepted" | "coalesced" | "duplicate" | "ignored" | "delivered"
    )
}

/// The notice text for an ok answer that still needs a person (spec 11.4: issue
/// `delivery:<destination>:ignored`). It starts with the Hermes status word.
fn notice_text(route: &str, status: &str) -> String {
    if status == "ignored" {
        format!(
            "ignored: Hermes answered status=ignored for route {route:?}: its events filter (or a \
             filter or script) dropped the document; remove events from the route"
        )
    } else {
        format!(
            "coalesced: Hermes answered status=coalesced for route {route:?}: its own coalesce \
             keeps only the last document; remove coalesce from the route"
        )
    }
}
