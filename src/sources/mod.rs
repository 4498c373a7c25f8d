//! Sources: who may send us a webhook, how we know it is them, and what the event is.
//!
//! Owns: the [`Request`]/[`Response`] values the intake hands over, the [`Source`] trait and
//! its static facts in one [`Declared`] value (spec section 14.1; the calls in the intake's
//! order: verify → challenge → ignore → payload → key, dedup_id, event_type, attrs), the
//! verification primitives ([`verify`], the only home of secret comparisons), how a body
//! becomes a payload ([`body`]: JSON or a form), the template source ([`template`], with its
//! selector language in [`select`]; schemes for hex/base64 HMACs, Trello's and Twilio's
//! URL-signing SHA-1, Standard Webhooks v1 and v1a, `t=,v1=` and static tokens, each
//! timestamped one with `tolerance_s`), one file per built-in source (github, zoom, trello,
//! plaid, gmail, calendar, kaneo, slack, standard-webhooks), the source kit ([`kit`])
//! that signs test requests for the intake tests, and [`flow::evaluate`], the call order
//! itself as one pure function (the intake and `hookspool source test` share it).
//!
//! Must not: do I/O of any kind (no sockets, files, database, clock or environment; the one
//! network need, fetching verification keys, goes through an injected fetcher:
//! [`plaid::JwkFetcher`] for Plaid's, [`jwks::JwksFetcher`] for a JWK Set URL), cache
//! secret values (every call asks the [`SecretSource`] again, so file rotation takes effect
//! at once), or put a secret, a body, a header value or a query string into an error message
//! or `Debug` output (the sentinel tests in `kit` enforce it).
//!
//! Invariants:
//! * Only `verify.rs` compares secret-derived bytes, and only through `verify::ct_eq`
//!   (tests/tidy.rs).
//! * A source's `auth_headers` never appear in its default `keep_headers` (tested for every
//!   built-in; the config module refuses them from a configured `keep_headers`).
//! * A challenge answered before verification (`challenge_unauthenticated`) is a constant
//!   that reads no secret (the kit's matrix proves it with a refusing `SecretSource`).
//! * A source reads every secret in `Declared::secrets`; `Declared::secrets_needed` says
//!   whether all must be configured or any one (Standard Webhooks' `secret` and
//!   `public_key`), and such a source treats a name that is not configured as absent.
//!
//! Notes for the intake:
//! * `verify` returning `Err` means "could not decide" (a secret that cannot be read, Plaid's
//!   key service or a JWK Set URL unreachable with no usable cached key): never a 2xx. Plaid retries, so 503 keeps the event; the error
//!   class names the problem for a config issue.
//! * For a `challenge_unauthenticated` source call `challenge` BEFORE `verify`, with a
//!   `SecretSource` that refuses every access, and stop if it answers; for every other source
//!   call it only after `verify` returned `Ok(true)`.
//! * Any `Err` after `verify` quarantines with `last_error = "plugin error: <class>"` where
//!   `<class>` is [`SourceError::class`]; the Display text carries no request data either.
//! * Query strings are never logged (Gmail's push token lives there), and neither is
//!   `Request`'s content: its `Debug` prints sizes and header names only.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

/// The presets of spec 5 (quiet_s, max_s).
pub const SPAN_PRESETS: &[(&str, f64, f64)] = &[
    ("burst", 120.0, 600.0),
    ("mail", 30.0, 120.0),
    ("calendar", 45.0, 180.0),
    ("sync", 60.0, 300.0),
    ("meeting", 60.0, 900.0),
    ("immediate", 0.0, 0.0),
];

pub mod body;
pub mod calendar;
pub mod flow;
pub mod github;
pub mod gmail;
pub mod handshake;
pub mod jwks;
pub mod kaneo;
pub mod opts;
pub mod plaid;
pub mod recipe;
pub mod select;
pub mod slack;
pub mod standard_webhooks;
pub mod template;
pub mod trello;
pub mod verify;
pub mod zoom;

#[cfg(test)]
#[path = "kat_tests.rs"]
mod kat;
#[cfg(test)]
mod schemes_tests;

pub use flow::{Accepted, Verdict, evaluate, parse_capture};
pub use plaid::{FetchError, JwkFetcher, PlaidJwk};

/// Default dedup window of a source (spec section 7); Plaid overrides it.
pub const DEDUP_WINDOW_S_DEFAULT: u64 = 86_400;

/// A source type's dedup window when config sets none (spec 7): Plaid dedups by body hash,
/// so its window is short; every other type uses the default.
pub fn default_dedup_window_s(kind: &str) -> u64 {
    match kind {
        "plaid" => plaid::DEDUP_WINDOW_S,
        _ => DEDUP_WINDOW_S_DEFAULT,
    }
}

/// Every `type` value `build` accepts, in the order `check` lists them.
pub const KINDS: &[&str] = &[
    "github",
    "zoom",
    "trello",
    "plaid",
    "gmail",
    "calendar",
    "kaneo",
    "slack",
    "standard-webhooks",
    "template",
];

/// One inbound HTTP request, as the intake read it (body already capped).
#[derive(Clone, Default)]
pub struct Request {
    pub method: String,
    /// Path without the query string.
    pub path: String,
    /// Decoded query parameters in order. Never logged: tokens live here.
    pub query: Vec<(String, String)>,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// X-Hookspool-Route, set by the reverse proxy.
    pub route_hint: Option<String>,
    pub remote_addr: String,
    /// Unix seconds from the intake's clock; every time check uses this, never the system
    /// clock, so tests drive it.
    pub now: f64,
}

impl Request {
    /// A request with no headers, query or body; use the `with_*` methods to fill it.
    pub fn new(method: &str, path: &str, now: f64) -> Self {
        Request {
            method: method.to_string(),
            path: path.to_string(),
            now,
            ..Request::default()
        }
    }

    pub fn with_header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }

    pub fn with_query(mut self, name: &str, value: &str) -> Self {
        self.query.push((name.to_string(), value.to_string()));
        self
    }

    pub fn with_body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.body = body.into();
        self
    }

    /// First header with this name, compared ASCII case-insensitively (HTTP header names are).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// First query parameter with this exact name.
    pub fn query_param(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k.as_str() == name)
            .map(|(_, v)| v.as_str())
    }

    /// Drops every header with this name (the kit uses it to build unsigned requests).
    pub fn remove_header(&mut self, name: &str) {
        self.headers.retain(|(k, _)| !k.eq_ignore_ascii_case(name));
    }

    /// The body parsed as JSON. Recomputed on each call: sources call it once per request
    /// through `payload`, and keeping `Request` a plain value matters more than the copy.
    pub fn json(&self) -> Result<serde_json::Value, SourceError> {
        serde_json::from_slice(&self.body).map_err(|_| SourceError::BadPayload)
    }
}

/// Only sizes and names: the body, query values and header values may hold secrets.
impl fmt::Debug for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let header_names: Vec<&str> = self.headers.iter().map(|(k, _)| k.as_str()).collect();
        f.debug_struct("Request")
            .field("method", &self.method)
            .field("path", &self.path)
            .field("query_params", &self.query.len())
            .field("headers", &header_names)
            .field("body_bytes", &self.body.len())
            .field("route_hint", &self.route_hint)
            .field("remote_addr", &self.remote_addr)
            .field("now", &self.now)
            .finish()
    }
}

/// A handshake answer (`challenge`), sent instead of enqueueing.
#[derive(Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    /// An empty 200 (Trello's HEAD handshake).
    pub fn empty_ok() -> Self {
        Response {
            status: 200,
            headers: Vec::new(),
            body: Vec::new(),
        }
    }

    /// A 200 with a JSON body.
    pub fn json(value: &serde_json::Value) -> Self {
        Response {
            status: 200,
            headers: vec![("Content-Type".to_string(), "application/json".to_string())],
            body: value.to_string().into_bytes(),
        }
    }
}

/// The body may be derived from a secret (Zoom's encryptedToken): print its size only.
impl fmt::Debug for Response {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Response")
            .field("status", &self.status)
            .field(
                "headers",
                &self
                    .headers
                    .iter()
                    .map(|(k, _)| k.as_str())
                    .collect::<Vec<_>>(),
            )
            .field("body_bytes", &self.body.len())
            .finish()
    }
}

/// The one secret seam and its error live on the bottom floor (`crate::secret`); sources
/// name them from here as they always have.
pub use crate::secret::{SecretError, SecretSource};

/// A failure inside a source. Display text and `class()` name the failure and at most a
/// configured field or header name, never request data or secrets.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("body is not valid JSON")]
    BadPayload,
    /// A form body that is not UTF-8, or a JSON field sent more than once.
    #[error("body is not a usable form (UTF-8 pairs, the JSON field sent once)")]
    BadForm,
    #[error("missing field {field}")]
    MissingField { field: String },
    #[error("field {field} is not a string, number or boolean")]
    NotScalar { field: String },
    #[error("missing header {header}")]
    MissingHeader { header: String },
    #[error("handshake request is malformed")]
    BadChallenge,
    #[error(transparent)]
    Secret(#[from] SecretError),
    #[error("verification key fetch failed: {0}")]
    KeyFetch(#[from] FetchError),
}

impl SourceError {
    /// Short class name for `last_error = "plugin error: <class>"`.
    pub fn class(&self) -> &'static str {
        match self {
            SourceError::BadPayload => "BadPayload",
            SourceError::BadForm => "BadForm",
            SourceError::MissingField { .. } => "MissingField",
            SourceError::NotScalar { .. } => "NotScalar",
            SourceError::MissingHeader { .. } => "MissingHeader",
            SourceError::BadChallenge => "BadChallenge",
            SourceError::Secret(_) => "SecretError",
            SourceError::KeyFetch(_) => "KeyFetch",
        }
    }
}

/// A refused `[sources.<name>]` option. Every message says what to write instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SourceConfigError {
    #[error("type: unknown source type \"{kind}\"; write one of: {accepted}")]
    UnknownKind { kind: String, accepted: String },
    #[error("{key}: not a key of type \"{kind}\"; remove it (the keys it accepts: {accepted})")]
    UnknownKey {
        kind: String,
        key: String,
        accepted: String,
    },
    #[error("{key}: {message}")]
    Invalid { key: String, message: String },
}

/// Which of a source's declared secrets a configuration must set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecretsNeeded {
    /// Every one of them (the usual case).
    All,
    /// At least one; the source uses whichever are set and treats a name that is not
    /// configured as absent (Standard Webhooks: `secret` checks v1 signatures, `public_key`
    /// v1a ones, and a sender may use either or both).
    AnyOne,
}

/// What a source declares about itself (spec 14.1's module-level names): fixed when it is
/// built, the same for every request, read by config, `check`, the intake and the kit
/// through [`Source::declared`]. Carries names only, never a secret value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Declared {
    /// The configured source name (`[sources.<name>]`).
    pub name: String,
    /// The `type` it was built from (one of [`KINDS`]).
    pub kind: &'static str,
    /// Secret names it reads from the `SecretSource`.
    pub secrets: &'static [&'static str],
    /// Which of `secrets` a configuration must set.
    pub secrets_needed: SecretsNeeded,
    /// Signature, token and authorization headers: never stored, refused from keep_headers.
    pub auth_headers: Vec<String>,
    /// Fields of the JSON body (dot paths) that hold the credential, for a sender that signs
    /// inside the body (Mailgun's `signature.signature`): what the kit changes to prove a
    /// tampered credential is refused.
    pub auth_fields: Vec<String>,
    /// Headers stored with each event by default.
    pub keep_headers: Vec<String>,
    /// Default coalesce preset name.
    pub span: &'static str,
    /// Whether the sender retries a non-2xx (spec section 9's table).
    pub sender_retries: bool,
    /// True only when `challenge` answers a constant before verification (Trello HEAD).
    pub challenge_unauthenticated: bool,
    /// The sender's handshake is a GET (a template `handshake` of kind `query`): the intake
    /// lets GET through to this source, which answers it or refuses it; never enqueued.
    pub get_handshake: bool,
    /// The JSON body answered, with 200, once a delivery is stored (queued, duplicate or
    /// replayed) instead of `{"status":"queued"}`: for a sender that reads the answer
    /// (Discord's deferred interaction response, `{"type":5}`). A constant; never derived
    /// from the request or a secret.
    pub accepted_reply: Option<String>,
    /// Liveness expectation (seconds) the source recommends; `None` for none.
    pub expect_every_s: Option<u64>,
    /// Verification may fetch keys over the network (Plaid's key service, a JWK Set URL):
    /// the intake runs such a source on its blocking pool.
    pub fetches_keys: bool,
    /// Default destination (`hermes:<type>` for the built-ins); `None` when config must name
    /// one (the template source). Spec 14.1 allows a per-event callable; no source needs one,
    /// so it is a declared fact.
    pub action: Option<String>,
}

impl Declared {
    /// A built-in type's facts before its own: delivered to `hermes:<kind>` by default, no
    /// secrets or headers yet, span `immediate`, a sender that does not retry, no
    /// unauthenticated handshake and no liveness expectation.
    pub fn builtin(name: &str, kind: &'static str) -> Self {
        Declared {
            name: name.to_string(),
            kind,
            secrets: &[],
            secrets_needed: SecretsNeeded::All,
            auth_headers: Vec::new(),
            auth_fields: Vec::new(),
            keep_headers: Vec::new(),
            span: "immediate",
            sender_retries: false,
            challenge_unauthenticated: false,
            get_handshake: false,
            accepted_reply: None,
            expect_every_s: None,
            fetches_keys: false,
            action: Some(format!("hermes:{kind}")),
        }
    }
}

/// What a source is and does. See the module doc for the call order and the error rules.
pub trait Source: Send + Sync {
    /// The source's declared facts (name, type, secrets, headers, span, ...).
    fn declared(&self) -> &Declared;

    fn verify(&self, req: &Request, secrets: &dyn SecretSource) -> Result<bool, SourceError>;
    /// `Some` answers the request and stops; handshakes never enqueue.
    fn challenge(
        &self,
        _req: &Request,
        _secrets: &dyn SecretSource,
    ) -> Result<Option<Response>, SourceError> {
        Ok(None)
    }
    /// `Some(reason)`: acknowledge without enqueueing.
    fn ignore(&self, _req: &Request) -> Result<Option<String>, SourceError> {
        Ok(None)
    }
    /// Default: the body as JSON, `{}` for an empty body.
    fn payload(&self, req: &Request) -> Result<serde_json::Value, SourceError> {
        default_payload(req)
    }
    /// Whether `payload(req)`, when it succeeds, is the body itself, parsed. Then the intake
    /// stores the body's own text as the payload instead of encoding the parsed value
    /// again, and a kept raw body, the same bytes, is stored once. Every reader parses the
    /// payload, so a document holds the same JSON either way. Default: no, the safe answer
    /// for a source whose payload is built from the request; a source that keeps the
    /// default `payload` says yes with `body_is_payload(req)`.
    fn payload_is_body(&self, _req: &Request) -> bool {
        false
    }
    fn key(&self, payload: &serde_json::Value, req: &Request) -> Result<String, SourceError>;
    fn dedup_id(
        &self,
        _payload: &serde_json::Value,
        _req: &Request,
    ) -> Result<Option<String>, SourceError> {
        Ok(None)
    }
    fn event_type(
        &self,
        _payload: &serde_json::Value,
        _req: &Request,
    ) -> Result<String, SourceError> {
        Ok(String::new())
    }
    fn attrs(
        &self,
        _payload: &serde_json::Value,
        _req: &Request,
    ) -> Result<BTreeMap<String, String>, SourceError> {
        Ok(BTreeMap::new())
    }
}

/// Whether `default_payload(req)` is the body itself: it is, unless the body is empty (then
/// the payload is `{}`).
pub fn body_is_payload(req: &Request) -> bool {
    !req.body.is_empty()
}

/// The body as JSON, or `{}` when there is no body.
pub fn default_payload(req: &Request) -> Result<serde_json::Value, SourceError> {
    if req.body.is_empty() {
        Ok(serde_json::Value::Object(serde_json::Map::new()))
    } else {
        req.json()
    }
}

/// All candidates of a secret, refusing an empty set so a misconfiguration is an error with
/// the secret's name rather than a silent stream of 401s.
pub(crate) fn need_candidates(
    secrets: &dyn SecretSource,
    name: &str,
) -> Result<Vec<Vec<u8>>, SourceError> {
    let c = secrets.candidates(name)?;
    if c.iter().all(|v| v.is_empty()) {
        return Err(SecretError::Empty {
            name: name.to_string(),
        }
        .into());
    }
    Ok(c)
}

/// Builds the source `name` of type `kind` from its `[sources.<name>]` table, common keys
/// already removed by the config module.
pub fn build(
    name: &str,
    kind: &str,
    options: &toml::Table,
) -> Result<Arc<dyn Source>, SourceConfigError> {
    let o = opts::Opts::new(kind, options);
    let source: Arc<dyn Source> = match kind {
        "github" => Arc::new(github::GitHub::build(name, o)?),
        "zoom" => Arc::new(zoom::Zoom::build(name, o)?),
        "trello" => Arc::new(trello::Trello::build(name, o)?),
        "plaid" => Arc::new(plaid::Plaid::build(name, o)?),
        "gmail" => Arc::new(gmail::Gmail::build(name, o)?),
        "calendar" => Arc::new(calendar::Calendar::build(name, o)?),
        "kaneo" => Arc::new(kaneo::Kaneo::build(name, o)?),
        "slack" => Arc::new(slack::Slack::build(name, o)?),
        "standard-webhooks" => Arc::new(standard_webhooks::StandardWebhooks::build(name, o)?),
        "template" => Arc::new(template::Template::build(name, o)?),
        other => {
            return Err(SourceConfigError::UnknownKind {
                kind: other.to_string(),
                accepted: KINDS.join(", "),
            });
        }
    };
    Ok(source)
}

/// Header-name list helper for the built-ins.
pub(crate) fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_kind_names_the_kinds() {
        let err = build("x", "stripe", &toml::Table::new())
            .err()
            .expect("refused");
        let msg = err.to_string();
        assert!(
            msg.contains("stripe") && msg.contains("slack") && msg.contains("template"),
            "{msg}"
        );
    }

    #[test]
    fn every_kind_builds_and_keeps_no_auth_header() {
        for kind in KINDS {
            let mut t = toml::Table::new();
            match *kind {
                "trello" => {
                    t.insert(
                        "callback_url".into(),
                        "https://example.org/hooks/trello".into(),
                    );
                }
                "template" => {
                    t.insert("scheme".into(), "hmac-sha256-hex".into());
                    t.insert("header".into(), "X-Signature".into());
                    t.insert("key".into(), "payload.id".into());
                }
                _ => {}
            }
            let s = build("n", kind, &t).unwrap_or_else(|e| panic!("{kind}: {e}"));
            assert_eq!(s.declared().kind, *kind);
            payload_is_body_only_when_it_is(kind, s.as_ref());
            for a in &s.declared().auth_headers {
                assert!(
                    !s.declared()
                        .keep_headers
                        .iter()
                        .any(|k| k.eq_ignore_ascii_case(a)),
                    "{kind} keeps auth header {a}"
                );
            }
            // Unknown keys are refused by name.
            let mut bad = t.clone();
            bad.insert("colour".into(), "red".into());
            let msg = build("n", kind, &bad)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(
                msg.contains("colour") && msg.contains("remove it"),
                "{kind}: {msg}"
            );
        }
    }

    /// `payload_is_body` says yes only where `payload` is the body parsed (the intake then
    /// stores the body's text as the payload), and every built-in whose payload is the JSON
    /// body says yes.
    fn payload_is_body_only_when_it_is(kind: &str, s: &dyn Source) {
        let json = Request::new("POST", "/hooks/n", 1.0)
            .with_header("Content-Type", "application/json")
            .with_body("{ \"z\": {\"b\": 1, \"a\": [true, null]},\n  \"id\": \"x\" }");
        let form = Request::new("POST", "/hooks/n", 1.0)
            .with_header("Content-Type", "application/x-www-form-urlencoded")
            .with_body("payload=%7B%22id%22%3A%22x%22%7D&b=1");
        let empty = Request::new("POST", "/hooks/n", 1.0);
        for (shape, req) in [("json", &json), ("form", &form), ("empty", &empty)] {
            // A payload that fails quarantines the request; the question is never asked.
            if let (true, Ok(p)) = (s.payload_is_body(req), s.payload(req)) {
                let parsed = serde_json::from_slice::<serde_json::Value>(&req.body).ok();
                assert_eq!(Some(p), parsed, "{kind} {shape}");
            }
        }
        let expected = kind != "calendar";
        assert_eq!(s.payload_is_body(&json), expected, "{kind}: a JSON body");
    }

    #[test]
    fn request_debug_hides_values() {
        let r = Request::new("POST", "/hooks/x", 1.0)
            .with_header("X-Token", "hunter2-header")
            .with_query("token", "hunter2-query")
            .with_body("hunter2-body");
        let d = format!("{r:?}");
        assert!(!d.contains("hunter2"), "{d}");
        assert!(d.contains("X-Token"));
    }
}
