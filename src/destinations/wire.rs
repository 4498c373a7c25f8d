//! The HTTP machinery shared by `http` and `hermes`: the client (built once per destination),
//! the signed header set, one bounded POST, transport-error classification, the header-name
//! rules `check` applies, and unwrap mode's bookkeeping.
//!
//! Every client is built by `egress::client_builder` (the egress policy: refused ranges
//! after resolution, the destination's `allow_private`, no proxy from the environment);
//! [`post`] checks an IP-literal URL against the same policy before sending, and a refused
//! address is a `config` outcome whose reason names the rule.
//!
//! Must not: follow redirects, retry on its own, log or return a body, a secret, a header
//! value or a URL (a URL can carry a token in its query string).

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};

use super::outcome::{Klass, Outcome};
use super::sign::{self, SignError};
use super::{Delivery, USER_AGENT};

/// The most response body read (for Hermes' `{"status": ...}` and connection reuse); the rest
/// is dropped with the connection.
pub const RESPONSE_BYTES_MAX: usize = 64 * 1024;
/// Idle pooled connections are closed after this long.
const POOL_IDLE_S: u64 = 90;
/// A header value hookspool puts on the wire from data (event type, dedup id) is left out
/// when longer than this.
pub const HEADER_VALUE_BYTES_MAX: usize = 1024;

/// Headers hookspool sets itself or that belong to the HTTP framing; config may not name
/// them for `headers`, `event_header` or `dedup_header`.
pub const RESERVED_HEADERS: &[&str] = &[
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
    "x-hub-signature-256",
    "x-hookspool-batch",
    "x-hookspool-attempt",
    "x-request-id",
    "traceparent",
    "content-type",
    "content-length",
    "content-encoding",
    "user-agent",
    "host",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "upgrade",
    "expect",
];

/// Which roots verify a receiver's certificate.
#[derive(Debug, Clone, Default)]
pub enum TlsRoots {
    /// The host's trust store (rustls-platform-verifier).
    #[default]
    Platform,
    /// Only the certificates of this PEM bundle (a private CA).
    Only(Vec<u8>),
    /// The host's trust store plus this PEM bundle.
    Merge(Vec<u8>),
}

/// A destination that cannot be built. Messages never contain a secret or a URL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    #[error("url: {0}")]
    Url(String),
    #[error("header: {0}")]
    Header(String),
    #[error("tls roots: {0}")]
    Tls(String),
    #[error("http client: {0}")]
    Client(String),
    #[error("invalid config: {0}")]
    Invalid(String),
}

/// A destination's client with the egress policy it was built with (its resolver checks
/// names; [`post`] checks an IP-literal host).
#[derive(Clone, Debug)]
pub(crate) struct Client {
    http: reqwest::Client,
    policy: crate::egress::Policy,
}

pub(crate) fn build_client(
    https_only: bool,
    roots: &TlsRoots,
    policy: &crate::egress::Policy,
    lookup: std::sync::Arc<dyn crate::egress::Lookup>,
) -> Result<Client, BuildError> {
    let mut b = crate::egress::client_builder(policy, lookup)
        .user_agent(USER_AGENT)
        .pool_idle_timeout(Duration::from_secs(POOL_IDLE_S))
        .https_only(https_only);
    let pem = |bundle: &[u8]| {
        reqwest::Certificate::from_pem_bundle(bundle)
            .map_err(|_| BuildError::Tls("not a PEM certificate bundle".into()))
    };
    let pem = |bundle: &[u8]| match pem(bundle) {
        Ok(certs) if !certs.is_empty() => Ok(certs),
        Ok(_) => Err(BuildError::Tls(
            "the PEM bundle holds no certificate".into(),
        )),
        Err(e) => Err(e),
    };
    match roots {
        TlsRoots::Platform => {}
        TlsRoots::Only(bundle) => b = b.tls_certs_only(pem(bundle)?),
        TlsRoots::Merge(bundle) => b = b.tls_certs_merge(pem(bundle)?),
    }
    let http = b
        .build()
        .map_err(|e| BuildError::Client(e.without_url().to_string()))?;
    Ok(Client {
        http,
        policy: policy.clone(),
    })
}

/// The `config` outcome of an address the egress policy refused: the reason names the rule
/// (so the issue does), the detail the address and the key that would admit it.
pub(crate) fn refused_outcome(r: &crate::egress::Refused) -> Outcome {
    Outcome::retry(
        Klass::Config,
        None,
        format!("egress refused: {}", r.rule.as_str()),
    )
    .with_detail(&r.to_string())
}

/// Why `name` cannot be used as a configured header name, as advice; `None` when it can.
pub fn header_name_problem(key: &str, name: &str) -> Option<String> {
    if HeaderName::from_bytes(name.as_bytes()).is_err() {
        return Some(format!(
            "{key} = {name:?} is not a valid HTTP header name: use letters, digits and '-'"
        ));
    }
    if RESERVED_HEADERS.contains(&name.to_ascii_lowercase().as_str()) {
        return Some(format!(
            "{key} = {name:?} names a header hookspool sets itself: choose another name \
             (e.g. X-GitHub-Event)"
        ));
    }
    None
}

pub(crate) fn parse_header_name(key: &str, name: &str) -> Result<HeaderName, BuildError> {
    if let Some(p) = header_name_problem(key, name) {
        return Err(BuildError::Header(p));
    }
    HeaderName::from_bytes(name.as_bytes()).map_err(|_| BuildError::Header(key.into()))
}

/// A data-derived header value, or `None` when it cannot go on the wire as is (spec 6.4.1):
/// visible ASCII and spaces only, not empty, at most `HEADER_VALUE_BYTES_MAX` bytes.
pub fn wire_value(v: &str) -> Option<HeaderValue> {
    let v = v.trim_matches(' ');
    if v.is_empty()
        || v.len() > HEADER_VALUE_BYTES_MAX
        || !v.bytes().all(|b| (0x20..0x7f).contains(&b))
    {
        return None;
    }
    HeaderValue::from_str(v).ok()
}

pub(crate) fn unix_now_s() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// The secrets one request is signed with.
pub(crate) struct Signing<'a> {
    /// Standard Webhooks candidates, current first.
    pub v1: &'a [Vec<u8>],
    /// `X-Hub-Signature-256` secret (raw bytes), when sent.
    pub hub: Option<&'a [u8]>,
    /// Also send `X-Request-ID` = webhook-id (Hermes' released gateways read it).
    pub request_id: bool,
}

/// Why the header set of a request could not be built.
#[derive(Debug)]
pub(crate) enum HeaderError {
    Sign(SignError),
    /// Every value we set is ASCII we produced (digits, base64, hex), except the id, whose
    /// instance part comes from the spool.
    NotHeaderValue,
}

impl HeaderError {
    /// A `config` outcome whose texts name the problem, never the secret.
    pub(crate) fn into_outcome(self) -> Outcome {
        match self {
            HeaderError::Sign(e) => {
                Outcome::retry(Klass::Config, None, "secret unusable").with_detail(&e.to_string())
            }
            HeaderError::NotHeaderValue => {
                Outcome::retry(Klass::Config, None, "delivery id is not a header value")
            }
        }
    }
}

/// The names [`signed_headers`] sets, parsed once (a `&str` name is parsed on every insert).
const WEBHOOK_ID: HeaderName = HeaderName::from_static("webhook-id");
const WEBHOOK_TIMESTAMP: HeaderName = HeaderName::from_static("webhook-timestamp");
const WEBHOOK_SIGNATURE: HeaderName = HeaderName::from_static("webhook-signature");
const X_HUB_SIGNATURE_256: HeaderName = HeaderName::from_static("x-hub-signature-256");
const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
const X_HOOKSPOOL_BATCH: HeaderName = HeaderName::from_static("x-hookspool-batch");
const X_HOOKSPOOL_ATTEMPT: HeaderName = HeaderName::from_static("x-hookspool-attempt");
/// How many headers [`signed_headers`] and its callers add beside the configured ones (the
/// map is sized once).
const SIGNED_HEADERS_MAX: usize = 12;

/// The full header set of one request (spec 6.4), plus the caller's extra headers.
pub(crate) fn signed_headers(
    signing: &Signing<'_>,
    msg_id: &str,
    d: &Delivery,
    body: &[u8],
    extra: &HeaderMap,
) -> Result<HeaderMap, HeaderError> {
    // The signatures are ASCII we produced (base64, hex): their strings become the values
    // without a copy, checked as `from_str` checks.
    let owned = |s: String| {
        HeaderValue::from_maybe_shared(bytes::Bytes::from(s))
            .map_err(|_| HeaderError::NotHeaderValue)
    };
    // Whole seconds, as Standard Webhooks specifies.
    let ts = unix_now_s() as i64;
    let mut h = HeaderMap::with_capacity(extra.len() + SIGNED_HEADERS_MAX);
    for (k, v) in extra {
        h.append(k.clone(), v.clone());
    }
    let id = HeaderValue::from_str(msg_id).map_err(|_| HeaderError::NotHeaderValue)?;
    let sig = sign::webhook_signature(signing.v1, msg_id, ts, body).map_err(HeaderError::Sign)?;
    h.insert(WEBHOOK_ID, id.clone());
    h.insert(WEBHOOK_TIMESTAMP, HeaderValue::from(ts));
    h.insert(WEBHOOK_SIGNATURE, owned(sig)?);
    if let Some(secret) = signing.hub {
        h.insert(
            X_HUB_SIGNATURE_256,
            owned(sign::hub_signature_256(secret, body))?,
        );
    }
    if signing.request_id {
        h.insert(X_REQUEST_ID, id);
    }
    if let Some(tp) = d
        .traceparent
        .as_deref()
        .and_then(|t| HeaderValue::from_str(t).ok())
    {
        h.insert(TRACEPARENT, tp);
    }
    h.insert(X_HOOKSPOOL_BATCH, HeaderValue::from(d.batch_id));
    h.insert(X_HOOKSPOOL_ATTEMPT, HeaderValue::from(d.attempt_n));
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    Ok(h)
}

/// A receiver's answer, or the outcome of not getting one.
pub(crate) enum Answer {
    Http {
        status: u16,
        retry_after: Option<String>,
        /// At most `RESPONSE_BYTES_MAX` bytes; only parsed, never logged or stored.
        body: Vec<u8>,
    },
    Failed(Outcome),
}

/// POST once, bounded in total (DNS, connect, TLS, request and response body) by
/// min(now + timeout, worker_deadline). An expiry is `transport` with reason `timeout` (the
/// destination's timeout_s) or `deadline` (the worker deadline).
pub(crate) async fn post(
    client: &Client,
    url: &reqwest::Url,
    headers: HeaderMap,
    body: Vec<u8>,
    timeout: Duration,
    worker_deadline: Instant,
) -> Answer {
    if let Err(r) = client.policy.admit_url(url) {
        return Answer::Failed(refused_outcome(&r));
    }
    let now = Instant::now();
    if worker_deadline <= now {
        return Answer::Failed(Outcome::retry(Klass::Transport, None, "deadline").timed_out());
    }
    let by_timeout = now.checked_add(timeout).unwrap_or(worker_deadline);
    let (until, reason) = if worker_deadline <= by_timeout {
        (worker_deadline, "deadline")
    } else {
        (by_timeout, "timeout")
    };
    let exchange = async {
        let mut resp = client
            .http
            .post(url.clone())
            .headers(headers)
            .body(body)
            .send()
            .await?;
        let status = resp.status().as_u16();
        let retry_after = resp
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let mut buf = Vec::new();
        // A body that breaks after the status line still carries the receiver's decision,
        // so a read error keeps the status; only the deadline below can override it.
        while let Ok(Some(chunk)) = resp.chunk().await {
            let room = RESPONSE_BYTES_MAX - buf.len();
            buf.extend_from_slice(&chunk[..chunk.len().min(room)]);
            if buf.len() >= RESPONSE_BYTES_MAX {
                break;
            }
        }
        Ok::<_, reqwest::Error>(Answer::Http {
            status,
            retry_after,
            body: buf,
        })
    };
    match tokio::time::timeout_at(until.into(), exchange).await {
        Err(_) => Answer::Failed(
            Outcome::retry(Klass::Transport, None, reason)
                .timed_out()
                .with_detail(&format!(
                    "no complete answer within {} ms",
                    timeout_ms(now, until)
                )),
        ),
        Ok(Ok(answer)) => answer,
        Ok(Err(e)) => Answer::Failed(classify_error(e, url)),
    }
}

fn timeout_ms(from: Instant, until: Instant) -> u128 {
    until.saturating_duration_since(from).as_millis()
}

/// What a failed exchange means (spec 6.5): a certificate the roots do not vouch for is
/// `config`; refused, reset, DNS and everything else on the way is `transport`.
pub(crate) fn classify_error(err: reqwest::Error, url: &reqwest::Url) -> Outcome {
    if let Some(r) = crate::egress::refused_in(&err) {
        return refused_outcome(&r);
    }
    let builder = err.is_builder();
    let connect = err.is_connect();
    let err = err.without_url();
    let mut seen = Seen::default();
    seen.walk(&err, 0);
    let detail = scrub(&seen.msgs.join(": "), url);
    let dns = seen.msgs.iter().any(|m| m.contains("dns error"));
    use std::io::ErrorKind as K;
    // The first specific kind: wrappers add `Other` around the one that matters.
    let io_kind = seen.kinds.iter().copied().find(|k| *k != K::Other);
    let outcome = if builder {
        Outcome::retry(Klass::Config, None, "request could not be built")
    } else if seen.cert {
        Outcome::retry(Klass::Config, None, "tls certificate rejected")
    } else if seen.tls {
        Outcome::retry(Klass::Transport, None, "tls handshake failed")
    } else if dns {
        Outcome::retry(Klass::Transport, None, "dns")
    } else {
        let reason = match io_kind {
            Some(K::ConnectionRefused) => "connection refused",
            Some(K::ConnectionReset | K::ConnectionAborted | K::BrokenPipe | K::UnexpectedEof) => {
                "connection reset"
            }
            Some(K::TimedOut) => "timeout",
            _ if connect => "connect failed",
            // The connection was up and closed before a complete answer.
            _ => "connection closed",
        };
        let o = Outcome::retry(Klass::Transport, None, reason);
        if io_kind == Some(K::TimedOut) {
            o.timed_out()
        } else {
            o
        }
    };
    outcome.with_detail(&detail)
}

/// What a walk down an error chain found.
#[derive(Default)]
struct Seen {
    cert: bool,
    tls: bool,
    kinds: Vec<std::io::ErrorKind>,
    msgs: Vec<String>,
}

/// Error chains are a few levels deep; a bound keeps a cyclic or absurd chain harmless.
const ERROR_CHAIN_DEPTH_MAX: usize = 16;

impl Seen {
    fn walk(&mut self, e: &(dyn std::error::Error + 'static), depth: usize) {
        if depth > ERROR_CHAIN_DEPTH_MAX {
            return;
        }
        if let Some(r) = e.downcast_ref::<rustls::Error>() {
            self.tls = true;
            if matches!(
                r,
                rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented
            ) {
                self.cert = true;
            }
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            self.kinds.push(io.kind());
            // io::Error::source() skips the error it wraps (which may be another io::Error
            // around a rustls::Error); descend into it directly.
            if let Some(inner) = io.get_ref() {
                self.walk(inner, depth + 1);
                return;
            }
        }
        let m = e.to_string();
        if !self.msgs.contains(&m) {
            self.msgs.push(m);
        }
        if let Some(next) = e.source() {
            self.walk(next, depth + 1);
        }
    }
}

/// Error texts come from the client stack, not from us; make sure none carries the URL (whose
/// query string may hold a token).
fn scrub(text: &str, url: &reqwest::Url) -> String {
    let mut out = text.replace(url.as_str(), "<url>");
    if let Some(q) = url.query().filter(|q| !q.is_empty()) {
        out = out.replace(q, "<query>");
    }
    out
}

/// Unwrap mode's bookkeeping (spec 6.4.1): the caller sends one request per event in order
/// and stops at the first failure; this records how far it got. (A plain loop in the caller
/// rather than a closure-taking helper keeps `deliver`'s future `Send`.)
#[derive(Debug, Default)]
pub(crate) struct UnwrapProgress {
    delivered: i64,
    last_status: Option<i64>,
}

impl UnwrapProgress {
    pub(crate) fn accepted(&mut self, o: &Outcome) {
        self.delivered += 1;
        self.last_status = o.status;
    }

    /// The attempt's outcome when event `event_id` failed with `o`. The reason stays the
    /// request's own (the dispatcher classifies on it); the detail says where it stopped.
    pub(crate) fn failed(self, event_id: i64, o: Outcome) -> Outcome {
        let detail = format!(
            "event {event_id} failed after {} delivered: {}",
            self.delivered, o.detail
        );
        Outcome {
            events_delivered: Some(self.delivered),
            failed_event_id: Some(event_id),
            notice: None,
            ..o
        }
        .with_detail(&detail)
    }

    /// The attempt's outcome when every event was accepted.
    pub(crate) fn finish(self) -> Outcome {
        Outcome {
            events_delivered: Some(self.delivered),
            ..Outcome::ok(self.last_status)
        }
        .with_reason(format!("{} event(s) delivered", self.delivered))
    }
}
