//! The `http` destination (spec 14.2): POST the document (or, with `unwrap = true`, each
//! event's stored payload) to a configured URL with Standard Webhooks headers and
//! `X-Hub-Signature-256`. Per-batch delivery ids (per-event in unwrap mode).
//!
//! Owns its `reqwest::Client` (built once, so connections are reused) and the `check`
//! validation of its config. Must not: touch the store, follow redirects, speak plain http
//! without `allow_insecure = true`, or put the URL, a secret or a body in a log or an outcome.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde::Deserialize;

use super::outcome::{self, Klass, Outcome, OutcomeKind};
use super::wire::{self, Answer, BuildError, Signing, TlsRoots, UnwrapProgress};
use super::{Delivery, Idempotency, event_delivery_id};

/// Default total time for one request (DNS, connect, TLS, body).
pub const HTTP_TIMEOUT_S_DEFAULT: f64 = 30.0;
/// Default cap on one request body (spec 14.2: 1 MiB).
pub const HTTP_MAX_BODY_BYTES_DEFAULT: u64 = 1024 * 1024;
/// No single request may be allowed longer than this (the lease would be absurd).
pub const TIMEOUT_S_MAX: f64 = 3600.0;

/// An `[destinations.<name>]` table of `type = "http"`, minus what the config module owns
/// (`type`, the `secret` reference, `max_inflight`). Unknown-key detection belongs to the
/// config module's raw table, so this struct does not deny them.
#[derive(Clone, PartialEq, Deserialize)]
pub struct HttpConfig {
    pub url: String,
    /// Extra static headers (names hookspool sets are refused).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    #[serde(default)]
    pub allow_insecure: bool,
    /// Addresses in the ranges the egress policy refuses that this destination may reach
    /// (`true`: all of them); none by default.
    #[serde(default)]
    pub allow_private: crate::egress::Allow,
    #[serde(default = "default_timeout_s")]
    pub timeout_s: f64,
    #[serde(default = "default_max_body_bytes")]
    pub max_body_bytes: u64,
    #[serde(default)]
    pub unwrap: bool,
    /// Header carrying the event type (the event's in unwrap mode, the document's
    /// `event_type` otherwise).
    #[serde(default)]
    pub event_header: Option<String>,
    /// Header carrying each event's dedup id (unwrap mode only).
    #[serde(default)]
    pub dedup_header: Option<String>,
}

fn default_timeout_s() -> f64 {
    HTTP_TIMEOUT_S_DEFAULT
}

impl std::fmt::Debug for HttpConfig {
    /// The URL's query string and the static header values may be credentials: shown
    /// redacted, so a config dump in a log is safe.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let url = match reqwest::Url::parse(&self.url) {
            Ok(mut u) => {
                if u.query().is_some() {
                    u.set_query(Some("<redacted>"));
                }
                let _ = u.set_password(None);
                u.to_string()
            }
            Err(_) => "<invalid url>".to_string(),
        };
        f.debug_struct("HttpConfig")
            .field("url", &url)
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .field("allow_insecure", &self.allow_insecure)
            .field("timeout_s", &self.timeout_s)
            .field("max_body_bytes", &self.max_body_bytes)
            .field("unwrap", &self.unwrap)
            .field("event_header", &self.event_header)
            .field("dedup_header", &self.dedup_header)
            .finish()
    }
}

fn default_max_body_bytes() -> u64 {
    HTTP_MAX_BODY_BYTES_DEFAULT
}

impl HttpConfig {
    pub fn new(url: impl Into<String>) -> HttpConfig {
        HttpConfig {
            url: url.into(),
            headers: BTreeMap::new(),
            allow_insecure: false,
            timeout_s: HTTP_TIMEOUT_S_DEFAULT,
            max_body_bytes: HTTP_MAX_BODY_BYTES_DEFAULT,
            allow_private: crate::egress::Allow::None,
            unwrap: false,
            event_header: None,
            dedup_header: None,
        }
    }

    /// Problems for `hookspool check`, each saying what to write. Empty when valid.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        match reqwest::Url::parse(&self.url) {
            Err(_) => out
                .push("url is not an absolute URL: write url = \"https://host/path\"".to_string()),
            Ok(u) => match u.scheme() {
                "https" => {}
                "http" if self.allow_insecure => {}
                "http" => out.push(
                    "url uses http://: write an https:// URL, or set allow_insecure = true \
                     (payloads and signatures then cross the network in clear)"
                        .to_string(),
                ),
                _ => out.push(
                    "url must start with https:// (or http:// with allow_insecure = true)".into(),
                ),
            },
        }
        if let Ok(u) = reqwest::Url::parse(&self.url)
            && (!u.username().is_empty() || u.password().is_some())
        {
            out.push("url carries credentials: put them in headers or use the secret".into());
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
        for (name, value) in &self.headers {
            if let Some(p) = wire::header_name_problem(&format!("headers.{name}"), name) {
                out.push(p);
            }
            if HeaderValue::from_str(value).is_err() {
                out.push(format!(
                    "headers.{name} has a value that cannot be sent: use visible ASCII only"
                ));
            }
        }
        out
    }
}

/// Checks shared by `http` and `hermes`.
pub(crate) fn common_problems(
    timeout_s: f64,
    max_body_bytes: u64,
    event_header: Option<&str>,
    dedup_header: Option<&str>,
) -> Vec<String> {
    let mut out = Vec::new();
    if !(timeout_s.is_finite() && timeout_s > 0.0 && timeout_s <= TIMEOUT_S_MAX) {
        out.push(format!(
            "timeout_s must be a number of seconds in (0, {TIMEOUT_S_MAX}]"
        ));
    }
    if max_body_bytes == 0 {
        out.push("max_body_bytes must be at least 1 (the receiver's body limit)".into());
    }
    if let Some(h) = event_header
        && let Some(p) = wire::header_name_problem("event_header", h)
    {
        out.push(p);
    }
    if let Some(h) = dedup_header
        && let Some(p) = wire::header_name_problem("dedup_header", h)
    {
        out.push(p);
    }
    if let (Some(a), Some(b)) = (event_header, dedup_header)
        && a.eq_ignore_ascii_case(b)
    {
        out.push(
            "event_header and dedup_header name the same header: give them different names".into(),
        );
    }
    out
}

/// Where an http destination's secret candidates come from, asked once per attempt so a file
/// reference picks up a rotation without a restart (spec 10): the one [`SecretSource`] seam
/// (`secret::SigningSecrets` in the dispatcher). Current secret first, then previous ones.
pub use crate::secret::{SecretSource, StaticSecrets};

/// The name a destination asks its secret by (its config key).
const SECRET_NAME: &str = "secret";

/// A validated `http` destination; cheap to share (`Arc`) between workers.
pub struct HttpDestination {
    cfg: HttpConfig,
    url: reqwest::Url,
    timeout: Duration,
    client: wire::Client,
    extra: HeaderMap,
    event_header: Option<HeaderName>,
    dedup_header: Option<HeaderName>,
    secrets: Arc<dyn SecretSource + Send + Sync>,
}

impl std::fmt::Debug for HttpDestination {
    // The URL is left out: its query string may hold a token.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpDestination")
            .field("unwrap", &self.cfg.unwrap)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl HttpDestination {
    pub fn new(
        cfg: HttpConfig,
        secrets: Arc<dyn SecretSource + Send + Sync>,
        roots: TlsRoots,
    ) -> Result<HttpDestination, BuildError> {
        Self::with_lookup(cfg, secrets, roots, Arc::new(crate::egress::SystemLookup))
    }

    /// [`HttpDestination::new`] with the name lookup the egress guard resolves through
    /// (tests pass answers of their own).
    pub fn with_lookup(
        cfg: HttpConfig,
        secrets: Arc<dyn SecretSource + Send + Sync>,
        roots: TlsRoots,
        lookup: Arc<dyn crate::egress::Lookup>,
    ) -> Result<HttpDestination, BuildError> {
        let problems = cfg.problems();
        if !problems.is_empty() {
            return Err(BuildError::Invalid(problems.join("; ")));
        }
        let url =
            reqwest::Url::parse(&cfg.url).map_err(|_| BuildError::Url("not absolute".into()))?;
        let timeout = Duration::try_from_secs_f64(cfg.timeout_s)
            .map_err(|_| BuildError::Invalid("timeout_s".into()))?;
        let mut extra = HeaderMap::new();
        for (name, value) in &cfg.headers {
            let n = wire::parse_header_name("headers", name)?;
            let v = HeaderValue::from_str(value)
                .map_err(|_| BuildError::Header(format!("headers.{name}: value")))?;
            extra.insert(n, v);
        }
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
        let policy = crate::egress::Policy::new(cfg.allow_private.clone());
        let client = wire::build_client(!cfg.allow_insecure, &roots, &policy, lookup)?;
        Ok(HttpDestination {
            cfg,
            url,
            timeout,
            client,
            extra,
            event_header,
            dedup_header,
            secrets,
        })
    }

    pub fn config(&self) -> &HttpConfig {
        &self.cfg
    }

    pub fn idempotency(&self) -> Idempotency {
        if self.cfg.unwrap {
            Idempotency::PerEvent
        } else {
            Idempotency::PerBatch
        }
    }

    /// The document's `delivery_id` (spec 6.4). Pure.
    pub fn delivery_id(&self, d: &Delivery) -> String {
        self.idempotency().delivery_id(d)
    }

    /// One attempt, with the secrets asked of the `SecretSource` now.
    pub async fn deliver(&self, d: &Delivery) -> Outcome {
        match self.secrets.candidates(SECRET_NAME) {
            Err(why) => Outcome::retry(Klass::Config, None, "secret unreadable")
                .with_detail(&why.to_string()),
            Ok(s) => self.deliver_with_secrets(d, &s).await,
        }
    }

    /// One attempt signed with `secrets` (current first; every one signs `webhook-signature`,
    /// the current one `X-Hub-Signature-256`).
    pub async fn deliver_with_secrets(&self, d: &Delivery, secrets: &[Vec<u8>]) -> Outcome {
        let Some(current) = secrets.first() else {
            return Outcome::retry(Klass::Config, None, "no secret").with_detail(
                "the http destination has no secret: set secret = { file = \"...\" }",
            );
        };
        let signing = Signing {
            v1: secrets,
            hub: Some(current),
            request_id: false,
        };
        let started = std::time::Instant::now();
        let outcome = if self.cfg.unwrap {
            self.unwrap_all(d, &signing).await
        } else {
            let id = self.delivery_id(d);
            let mut h = HeaderMap::new();
            add_value(&mut h, self.event_header.as_ref(), d.event_type.as_deref());
            self.post_one(d, &signing, &id, &d.body, h).await
        };
        tracing::debug!(
            batch_id = d.batch_id,
            attempt = d.attempt_n,
            status = outcome.status,
            reason = %outcome.reason,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "http attempt finished"
        );
        outcome
    }

    async fn unwrap_all(&self, d: &Delivery, signing: &Signing<'_>) -> Outcome {
        let mut progress = UnwrapProgress::default();
        for ev in &d.events {
            let id = event_delivery_id(&d.instance_id, d.batch_id, ev.id);
            let mut h = HeaderMap::new();
            add_value(
                &mut h,
                self.event_header.as_ref(),
                Some(ev.event_type.as_str()),
            );
            add_value(&mut h, self.dedup_header.as_ref(), ev.dedup_id.as_deref());
            let o = self.post_one(d, signing, &id, &ev.payload, h).await;
            if o.kind != OutcomeKind::Ok {
                return progress.failed(ev.id, o);
            }
            progress.accepted(&o);
        }
        progress.finish()
    }

    async fn post_one(
        &self,
        d: &Delivery,
        signing: &Signing<'_>,
        id: &str,
        body: &[u8],
        mut per_request: HeaderMap,
    ) -> Outcome {
        if body.len() as u64 > self.cfg.max_body_bytes {
            return Outcome::dead(Klass::Permanent, None, "body exceeds max_body_bytes")
                .with_detail(&format!(
                    "{} bytes > max_body_bytes {}: split the batch, or raise max_body_bytes if the \
                     receiver accepts more",
                    body.len(),
                    self.cfg.max_body_bytes
                ));
        }
        let mut headers = match wire::signed_headers(signing, id, d, body, &self.extra) {
            Ok(h) => h,
            Err(e) => return e.into_outcome(),
        };
        for (k, v) in per_request.drain() {
            if let Some(k) = k {
                headers.insert(k, v);
            }
        }
        match wire::post(
            &self.client,
            &self.url,
            headers,
            body.to_vec(),
            self.timeout,
            d.deadline,
        )
        .await
        {
            Answer::Failed(o) => o,
            Answer::Http {
                status,
                retry_after,
                ..
            } => outcome::from_http_status(
                status,
                retry_after.as_deref(),
                wire::unix_now_s(),
                Klass::Permanent,
            ),
        }
    }
}

/// Put a data-derived header on the request when there is a name and the value can go on
/// the wire; otherwise leave it out (spec 6.4.1).
pub(crate) fn add_value(h: &mut HeaderMap, name: Option<&HeaderName>, value: Option<&str>) {
    if let (Some(name), Some(v)) = (name, value.and_then(wire::wire_value)) {
        h.insert(name.clone(), v);
    }
}
