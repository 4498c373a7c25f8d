//! The template source: any signed or tokened JSON POST, configured in TOML without code
//! (spec sections 14.1 and 14.3.2a).
//!
//! Owns: the template keys and their validation at build time (every refusal says what to
//! write), and the mapping of each `scheme` onto a `verify` primitive. Values taken from the
//! request use the selector language documented in [`super::select`].
//!
//! | key | type | meaning |
//! | --- | --- | --- |
//! | `scheme` | string, required unless `recipe` | one of [`SCHEMES`] |
//! | `recipe` | table | instead of `scheme` (and of `header`, `prefix`, `param`, `tolerance_s`): the sender's signing recipe, keys in [`recipe`](super::recipe); `callback_url` is required when it signs `url` and refused otherwise |
//! | `header` | string | where the signature or token is (required by every scheme but `standard-webhooks`; `static-token` takes `header` or `param`) |
//! | `prefix` | string | text before the signature/token in `header` (`"sha256="`, `"Bearer "`) |
//! | `param` | string | query parameter holding the token (`static-token` only) |
//! | `callback_url` | string | the URL the signature covers (`hmac-sha1-base64-url`, `hmac-sha1-base64-url-form` and `hmac-sha1-base64-url-json` only, required there) |
//! | `tolerance_s` | integer | the two-sided replay window of a timestamped scheme (`timestamped`, `standard-webhooks`), seconds, 30 to 3600, default 300 |
//! | `head_handshake` | bool | answer `HEAD` with an empty 200 before verification (a constant; no secret read) |
//! | `handshake` | table | a handshake the sender makes, keys in [`handshake`](super::handshake): `kind = "echo"` (a challenge in the signed body, answered after verification), `"ping"` (a fixed answer after verification) or `"query"` (a GET with the challenge in the query; with `token`, only when the verify token equals the secret `verify_token`); a handshake never enqueues |
//! | `key` | string or list, required | coalesce key; list items are joined with `:` |
//! | `dedup` | string | dedup id (missing value = no dedup) |
//! | `ignore` | string or list | ignore rules, `selector=value` / `selector!=value` |
//! | `event_type` | string | event type (missing value = `""`) |
//! | `attrs` | table of strings | route-match attributes (missing value = attribute left out) |
//! | `body` | string | how the payload is read: `"json"` (default; `"form"` for `hmac-sha1-base64-url-form`, the only format it takes), `"form"` (a flat `application/x-www-form-urlencoded` body as an object of strings; a repeated name becomes an array) or `"form-json:<field>"` (the form field holding the JSON payload); the signature always covers the raw body, or for `hmac-sha1-base64-url-form` the decoded parameters the payload is made of |
//! | `sender_retries` | bool | does the sender retry a non-2xx (default false: assume not until shown) |
//! | `accepted_reply` | string (JSON) | the body answered with 200 once a delivery is stored, instead of `{"status":"queued"}` (Discord's deferred interaction response `{"type":5}`); a constant |
//!
//! Schemes (the secret is always named `secret`):
//!
//! * `hmac-sha256-hex`: `header` = [`prefix`] hex HMAC-SHA256(secret, body)  (GitHub, Kaneo)
//! * `hmac-sha256-base64`: `header` = [`prefix`] base64 HMAC-SHA256(secret, body)
//! * `hmac-sha1-base64-url`: `header` = base64 HMAC-SHA1(secret, body + callback_url)  (Trello)
//! * `hmac-sha1-base64-url-form`: `header` = base64 HMAC-SHA1(secret, callback_url + every
//!   form parameter's name and value, sorted by name)  (Twilio); the body is a form and the
//!   payload its parameters, one member each. Twilio signs the decoded parameters, not the
//!   raw bytes, so what the signature covers is exactly what the payload holds (except the
//!   order of a repeated name's values, which it sorts)
//! * `hmac-sha1-base64-url-json`: Twilio's JSON-body webhooks: the request's query carries
//!   `bodySHA256=<hex SHA-256 of the body>` and `header` = base64 HMAC-SHA1(secret,
//!   callback_url + `?`/`&` + `bodySHA256=<hex>`); both must hold (`verify::twilio_json`).
//!   For both Twilio schemes a signature over callback_url with its default port written
//!   out (`:443`) or its port left out holds too, as twilio-python accepts
//! * `standard-webhooks`: `webhook-id`/`webhook-timestamp`/`webhook-signature`, ±`tolerance_s`;
//!   a `whsec_` or raw secret checks `v1` entries, a `whpk_` one (the sender's Ed25519 public
//!   key) `v1a` entries; a `whpk_` value is never used as an HMAC key
//! * `timestamped`: `header` = `t=<unix s>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>`, ±`tolerance_s`
//! * `static-token`: the secret itself, in `header` (after `prefix`) or in query `param`
//!
//! `hmac-sha256-hex`, `hmac-sha256-base64`, `hmac-sha1-base64-url` and `timestamped` are
//! presets of the recipe ([`recipe::preset`]): built as their scheme (so their refusals are
//! unchanged), then checked by the recipe they stand for. The others keep their own checks.
//!
//! Must not: accept an option its scheme would ignore (a silently unused `prefix` hides a
//! misconfiguration), select from the query string, or give a default action (config names
//! the destination; `action` returns `None`).

use std::collections::BTreeMap;

use serde_json::Value;

use super::body::BodyFormat;
use super::handshake::{Handshake, VERIFY_TOKEN};
use super::jwks::{JwksCache, JwksFetcher};
use super::opts::{Opts, invalid, is_header_name};
use super::recipe::{self, Recipe};
use super::select::{Expr, Rule};
use super::verify::{self, MacAlg, TOLERANCE_S_DEFAULT, TimestampedForm};
use super::{
    Declared, Request, Response, SecretSource, Source, SourceConfigError, SourceError,
    need_candidates, standard_webhooks, trello,
};
use std::sync::Arc;

pub const SECRET: &str = "secret";

pub const SCHEMES: &[&str] = &[
    "hmac-sha256-hex",
    "hmac-sha256-base64",
    "hmac-sha1-base64-url",
    "hmac-sha1-base64-url-form",
    "hmac-sha1-base64-url-json",
    "standard-webhooks",
    "timestamped",
    "static-token",
];

/// Where a template's credential is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scheme {
    HmacSha256Hex {
        header: String,
        prefix: String,
    },
    HmacSha256Base64 {
        header: String,
        prefix: String,
    },
    HmacSha1Base64Url {
        header: String,
        callback_url: String,
    },
    HmacSha1Base64UrlForm {
        header: String,
        callback_url: String,
    },
    /// Twilio's JSON-body variant: `bodySHA256` in the query, the signature over the URL.
    HmacSha1Base64UrlJson {
        header: String,
        callback_url: String,
    },
    StandardWebhooks {
        tolerance_s: u64,
    },
    Timestamped {
        header: String,
        tolerance_s: u64,
    },
    TokenHeader {
        header: String,
        prefix: String,
    },
    TokenParam {
        param: String,
    },
    /// A signing recipe: the `recipe` table, or a named scheme that is a preset of one
    /// ([`recipe::preset`]).
    Recipe(Box<Recipe>),
}

pub struct Template {
    declared: Declared,
    scheme: Scheme,
    body: BodyFormat,
    key: Vec<Expr>,
    dedup: Option<Expr>,
    ignore: Vec<Rule>,
    event_type: Option<Expr>,
    attrs: Vec<(String, Expr)>,
    handshake: Option<Handshake>,
    head_handshake: bool,
    /// Where a recipe with `jwks_url` gets its keys: the process-wide cache and the
    /// installed fetcher, unless a test gave its own ([`Template::with_jwks`]).
    jwks_cache: Arc<JwksCache>,
    jwks_fetcher: Option<Arc<dyn JwksFetcher>>,
}

const KEY_EXAMPLE: &str =
    "\"payload.id\" or [\"payload.repository.full_name\", \"header.X-Event\"]";

impl Template {
    pub fn build(name: &str, mut o: Opts<'_>) -> Result<Self, SourceConfigError> {
        let recipe_table = match o.table("recipe") {
            Some(toml::Value::Table(t)) => Some(t.clone()),
            Some(_) => {
                return Err(invalid(
                    "recipe",
                    "must be a table; write recipe = { algorithm = \"hmac-sha256\", signed = [\"body\"], header = \"X-Signature\", encoding = \"hex\" }".to_string(),
                ));
            }
            None => None,
        };
        if let Some(t) = recipe_table {
            return Self::build_recipe(name, &t, o);
        }
        let scheme_name = o.string("scheme", "\"hmac-sha256-hex\"")?.ok_or_else(|| {
            invalid(
                "scheme",
                format!(
                    "required; write scheme = \"hmac-sha256-hex\" (one of: {}) or describe the sender with recipe = {{ ... }}",
                    SCHEMES.join(", ")
                ),
            )
        })?;
        let header = o.string("header", "\"X-Signature\"")?;
        let prefix = o.string("prefix", "\"sha256=\"")?;
        let param = o.string("param", "\"token\"")?;
        let has_callback = o
            .string("callback_url", "\"https://hooks.example.org/hooks/x\"")?
            .is_some();
        let tolerance_s = o.tolerance_s()?;
        let scheme = scheme_from(
            &scheme_name,
            SchemeKeys {
                header,
                prefix,
                param,
                has_callback,
                tolerance_s,
            },
            &mut o,
        )?;
        let scheme = expand_preset(&scheme_name, scheme);
        Self::finish_build(name, &scheme_name, scheme, o)
    }

    /// A template whose sender is described by a `recipe` table.
    fn build_recipe(
        name: &str,
        table: &toml::Table,
        mut o: Opts<'_>,
    ) -> Result<Self, SourceConfigError> {
        for (key, why) in [
            ("scheme", "a recipe replaces scheme; remove scheme"),
            (
                "header",
                "write it inside the recipe: recipe = { header = \"X-Signature\", ... }",
            ),
            (
                "prefix",
                "write it inside the recipe: recipe = { prefix = \"sha256=\", ... }",
            ),
            (
                "tolerance_s",
                "write it inside the recipe: recipe = { tolerance_s = 300, ... }",
            ),
            (
                "param",
                "a recipe verifies a signature, not a token in the query; remove it",
            ),
        ] {
            if o.table(key).is_some() {
                return Err(invalid(key, format!("not used with recipe; {why}")));
            }
        }
        let mut r = recipe::Recipe::parse(table)?;
        let example = "\"https://hooks.example.org/hooks/x\"";
        match (r.signs_url(), o.string("callback_url", example)?) {
            (true, Some(u)) if u.starts_with("https://") || u.starts_with("http://") => {
                r.callback_url = Some(u)
            }
            (true, Some(_)) => {
                return Err(invalid(
                    "callback_url",
                    format!(
                        "must be the full URL the sender calls, exactly as registered there; write callback_url = {example}"
                    ),
                ));
            }
            (true, None) => {
                return Err(invalid(
                    "callback_url",
                    format!(
                        "the URL is signed (\"url\" in recipe.signed): set callback_url to the public URL the sender calls, exactly as registered there; write callback_url = {example}"
                    ),
                ));
            }
            (false, Some(_)) => {
                return Err(invalid(
                    "callback_url",
                    "not used: the recipe does not sign the URL; remove it or add \"url\" to recipe.signed".to_string(),
                ));
            }
            (false, None) => {}
        }
        Self::finish_build(name, "recipe", Scheme::Recipe(Box::new(r)), o)
    }

    fn finish_build(
        name: &str,
        scheme_name: &str,
        scheme: Scheme,
        mut o: Opts<'_>,
    ) -> Result<Self, SourceConfigError> {
        let head_handshake = o.boolean("head_handshake")?.unwrap_or(false);
        let handshake = match o.table("handshake") {
            None => None,
            Some(toml::Value::Table(t)) => Some(Handshake::parse(t)?),
            Some(_) => {
                return Err(invalid(
                    "handshake",
                    "must be a table; write handshake = { kind = \"echo\", when = \"payload.type=url_verification\", field = \"payload.challenge\", reply = \"text\" }".to_string(),
                ));
            }
        };
        if head_handshake && handshake.as_ref().is_some_and(|h| !h.unauthenticated()) {
            return Err(invalid(
                "head_handshake",
                "answers before verification, and this source's handshake is answered after it; remove head_handshake (a sender probes with HEAD or with a handshake, not both)".to_string(),
            ));
        }
        let body = o
            .string("body", "\"form\"")?
            .map(|b| BodyFormat::parse("body", &b))
            .transpose()?;
        let body = match (&scheme, body) {
            // Twilio signs the form's parameters: the payload must be those parameters.
            (Scheme::HmacSha1Base64UrlForm { .. }, None | Some(BodyFormat::Form)) => {
                BodyFormat::Form
            }
            (Scheme::HmacSha1Base64UrlForm { .. }, Some(_)) => {
                return Err(invalid(
                    "body",
                    format!(
                        "scheme {scheme_name} signs the form's parameters, so the payload is those parameters; remove body or write body = \"form\""
                    ),
                ));
            }
            (_, b) => b.unwrap_or_default(),
        };
        let key = o
            .string_or_list("key", KEY_EXAMPLE)?
            .filter(|k| !k.is_empty())
            .ok_or_else(|| invalid("key", format!("required; write key = {KEY_EXAMPLE}")))?
            .iter()
            .map(|k| Expr::parse("key", k))
            .collect::<Result<Vec<_>, _>>()?;
        let dedup = o
            .string("dedup", "\"header.X-Delivery-Id\"")?
            .map(|d| Expr::parse("dedup", &d))
            .transpose()?;
        let ignore = o
            .string_or_list("ignore", "[\"header.X-Event=ping\"]")?
            .unwrap_or_default()
            .iter()
            .map(|r| Rule::parse("ignore", r))
            .collect::<Result<Vec<_>, _>>()?;
        let event_type = o
            .string("event_type", "\"header.X-Event\"")?
            .map(|e| Expr::parse("event_type", &e))
            .transpose()?;
        let mut attrs = Vec::new();
        for (attr, value) in o
            .string_table("attrs", "{ event_type = \"header.X-Event\" }")?
            .unwrap_or_default()
        {
            if attr.is_empty()
                || !attr
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
            {
                return Err(invalid(
                    "attrs",
                    format!(
                        "\"{attr}\" is not an attribute name; write letters, digits, _ or -, e.g. attrs = {{ event_type = \"header.X-Event\" }}"
                    ),
                ));
            }
            attrs.push((attr.clone(), Expr::parse(&format!("attrs.{attr}"), &value)?));
        }
        let sender_retries = o.boolean("sender_retries")?.unwrap_or(false);
        let accepted_reply = match o.string("accepted_reply", "'{\"type\":5}'")? {
            None => None,
            Some(r) if serde_json::from_str::<Value>(&r).is_ok() => Some(r),
            Some(_) => {
                return Err(invalid(
                    "accepted_reply",
                    "must be JSON text (the body the sender expects once a delivery is stored); write accepted_reply = '{\"type\":5}'".to_string(),
                ));
            }
        };
        o.finish()?;

        let auth_headers: Vec<String> = match &scheme {
            Scheme::HmacSha256Hex { header, .. }
            | Scheme::HmacSha256Base64 { header, .. }
            | Scheme::HmacSha1Base64Url { header, .. }
            | Scheme::HmacSha1Base64UrlForm { header, .. }
            | Scheme::HmacSha1Base64UrlJson { header, .. }
            | Scheme::Timestamped { header, .. }
            | Scheme::TokenHeader { header, .. } => vec![header.clone()],
            Scheme::StandardWebhooks { .. } => {
                vec![standard_webhooks::SIGNATURE_HEADER.to_string()]
            }
            Scheme::TokenParam { .. } => Vec::new(),
            Scheme::Recipe(r) => r.auth_headers(),
        };
        // Keep what the configuration reads from headers, so a replay or quarantine
        // reclassification sees the same values; never an auth header.
        let mut keep_headers: Vec<String> = key
            .iter()
            .chain(dedup.iter())
            .chain(event_type.iter())
            .chain(attrs.iter().map(|(_, e)| e))
            .flat_map(Expr::headers)
            .chain(ignore.iter().filter_map(Rule::header))
            .collect();
        if matches!(scheme, Scheme::StandardWebhooks { .. }) {
            keep_headers.push(standard_webhooks::ID_HEADER.to_string());
            keep_headers.push(standard_webhooks::TIMESTAMP_HEADER.to_string());
        }
        if let Scheme::Recipe(r) = &scheme {
            keep_headers.extend(r.signed_headers());
        }
        keep_headers.retain(|h| !auth_headers.iter().any(|a| a.eq_ignore_ascii_case(h)));
        keep_headers.sort_by_key(|h| h.to_ascii_lowercase());
        keep_headers.dedup_by(|a, b| a.eq_ignore_ascii_case(b));

        Ok(Template {
            declared: Declared {
                secrets: match (
                    handshake.as_ref().and_then(Handshake::secret).is_some(),
                    matches!(&scheme, Scheme::Recipe(r) if r.jwks().is_some()),
                ) {
                    (true, false) => &[SECRET, VERIFY_TOKEN],
                    (false, false) => &[SECRET],
                    // Keys from a JWK Set URL: no secret of ours is read.
                    (true, true) => &[VERIFY_TOKEN],
                    (false, true) => &[],
                },
                auth_headers,
                keep_headers,
                sender_retries,
                challenge_unauthenticated: head_handshake
                    || handshake.as_ref().is_some_and(Handshake::unauthenticated),
                get_handshake: handshake.as_ref().is_some_and(Handshake::is_get),
                accepted_reply,
                fetches_keys: matches!(&scheme, Scheme::Recipe(r) if r.jwks().is_some()),
                auth_fields: match &scheme {
                    Scheme::Recipe(r) => r.sig_field.iter().cloned().collect(),
                    _ => Vec::new(),
                },
                action: None,
                ..Declared::builtin(name, "template")
            },
            scheme,
            body,
            key,
            dedup,
            ignore,
            event_type,
            attrs,
            handshake,
            head_handshake,
            jwks_cache: JwksCache::shared(),
            jwks_fetcher: None,
        })
    }

    /// The same source with its own JWK Set cache and fetcher (tests, the kit).
    pub fn with_jwks(mut self, cache: Arc<JwksCache>, fetcher: Arc<dyn JwksFetcher>) -> Self {
        self.jwks_cache = cache;
        self.jwks_fetcher = Some(fetcher);
        self
    }

    pub fn scheme(&self) -> &Scheme {
        &self.scheme
    }
}

/// The keys whose meaning depends on the scheme, as the table gave them.
struct SchemeKeys {
    header: Option<String>,
    prefix: Option<String>,
    param: Option<String>,
    has_callback: bool,
    tolerance_s: Option<u64>,
}

/// Validates the scheme-dependent keys together, so each refusal can say what the chosen
/// scheme needs.
fn scheme_from(
    scheme: &str,
    keys: SchemeKeys,
    o: &mut Opts<'_>,
) -> Result<Scheme, SourceConfigError> {
    let SchemeKeys {
        header,
        prefix,
        param,
        has_callback,
        tolerance_s,
    } = keys;
    let need_header = |example: &str| -> Result<String, SourceConfigError> {
        match &header {
            Some(h) if is_header_name(h) => Ok(h.clone()),
            Some(h) => Err(invalid(
                "header",
                format!("\"{h}\" is not a header name; write header = \"{example}\""),
            )),
            None => Err(invalid(
                "header",
                format!("required by scheme {scheme}; write header = \"{example}\""),
            )),
        }
    };
    let refuse = |key: &str, why: &str| {
        Err(invalid(
            key,
            format!("not used by scheme {scheme}; remove it ({why})"),
        ))
    };
    if param.is_some() && !matches!(scheme, "static-token") {
        return refuse("param", "only static-token reads a query parameter");
    }
    if has_callback
        && !matches!(
            scheme,
            "hmac-sha1-base64-url" | "hmac-sha1-base64-url-form" | "hmac-sha1-base64-url-json"
        )
    {
        return refuse(
            "callback_url",
            "only hmac-sha1-base64-url, hmac-sha1-base64-url-form and hmac-sha1-base64-url-json sign the URL",
        );
    }
    if tolerance_s.is_some() && !matches!(scheme, "timestamped" | "standard-webhooks") {
        return refuse(
            "tolerance_s",
            "only timestamped and standard-webhooks carry a timestamp",
        );
    }
    let tolerance_s = tolerance_s.unwrap_or(TOLERANCE_S_DEFAULT);
    match scheme {
        "hmac-sha256-hex" => Ok(Scheme::HmacSha256Hex { header: need_header("X-Signature")?, prefix: prefix.unwrap_or_default() }),
        "hmac-sha256-base64" => {
            Ok(Scheme::HmacSha256Base64 { header: need_header("X-Signature")?, prefix: prefix.unwrap_or_default() })
        }
        "hmac-sha1-base64-url" => {
            if prefix.is_some() {
                return refuse("prefix", "the header holds the bare base64 value");
            }
            let header = need_header("X-Trello-Webhook")?;
            // Re-read through the shared helper for its required-key message.
            let callback_url = trello::callback_url(o, "scheme hmac-sha1-base64-url")?;
            Ok(Scheme::HmacSha1Base64Url { header, callback_url })
        }
        "hmac-sha1-base64-url-form" => {
            if prefix.is_some() {
                return refuse("prefix", "the header holds the bare base64 value");
            }
            let header = need_header("X-Twilio-Signature")?;
            let callback_url = trello::callback_url(o, "scheme hmac-sha1-base64-url-form")?;
            Ok(Scheme::HmacSha1Base64UrlForm { header, callback_url })
        }
        "hmac-sha1-base64-url-json" => {
            if prefix.is_some() {
                return refuse("prefix", "the header holds the bare base64 value");
            }
            let header = need_header("X-Twilio-Signature")?;
            let callback_url = trello::callback_url(o, "scheme hmac-sha1-base64-url-json")?;
            if callback_url.contains(verify::TWILIO_BODY_SHA256_PARAM) {
                return Err(invalid(
                    "callback_url",
                    "Twilio adds bodySHA256 to each request; write the URL as configured at Twilio, without it".to_string(),
                ));
            }
            Ok(Scheme::HmacSha1Base64UrlJson { header, callback_url })
        }
        "standard-webhooks" => {
            if header.is_some() {
                return refuse("header", "it reads webhook-id, webhook-timestamp and webhook-signature");
            }
            if prefix.is_some() {
                return refuse("prefix", "webhook-signature has its own v1, marker");
            }
            Ok(Scheme::StandardWebhooks { tolerance_s })
        }
        "timestamped" => {
            if prefix.is_some() {
                return refuse("prefix", "the header is t=<ts>,v1=<hex>");
            }
            Ok(Scheme::Timestamped { header: need_header("X-Signature")?, tolerance_s })
        }
        "static-token" => match (&header, param) {
            (Some(_), Some(_)) => Err(invalid(
                "param",
                "static-token reads the token from header or from param, not both; remove one".to_string(),
            )),
            (None, Some(p)) => {
                if prefix.is_some() {
                    return refuse("prefix", "a query parameter holds the bare token");
                }
                if p.is_empty() || !p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') {
                    return Err(invalid("param", "must be a query parameter name; write param = \"token\"".to_string()));
                }
                Ok(Scheme::TokenParam { param: p })
            }
            (_, None) => match &header {
                Some(_) => Ok(Scheme::TokenHeader { header: need_header("X-Token")?, prefix: prefix.unwrap_or_default() }),
                None => Err(invalid(
                    "header",
                    "required by scheme static-token (or param); write header = \"X-Token\" or param = \"token\"".to_string(),
                )),
            },
        },
        other => Err(invalid("scheme", format!("\"{other}\" is not a scheme; write one of: {}", SCHEMES.join(", ")))),
    }
}

/// A named scheme that is a preset of the recipe becomes that recipe, so both are checked
/// by one code path; the others keep their own checks (see [`recipe::preset`]).
fn expand_preset(scheme_name: &str, scheme: Scheme) -> Scheme {
    let (header, prefix, callback_url, tolerance_s) = match &scheme {
        Scheme::HmacSha256Hex { header, prefix } | Scheme::HmacSha256Base64 { header, prefix } => {
            (header.as_str(), prefix.as_str(), None, TOLERANCE_S_DEFAULT)
        }
        Scheme::HmacSha1Base64Url {
            header,
            callback_url,
        } => (
            header.as_str(),
            "",
            Some(callback_url.as_str()),
            TOLERANCE_S_DEFAULT,
        ),
        Scheme::Timestamped {
            header,
            tolerance_s,
        } => (header.as_str(), "", None, *tolerance_s),
        _ => return scheme,
    };
    match recipe::preset(scheme_name, header, prefix, callback_url, tolerance_s) {
        Some(r) => Scheme::Recipe(Box::new(r)),
        None => scheme,
    }
}

impl Source for Template {
    fn declared(&self) -> &Declared {
        &self.declared
    }
    fn verify(&self, req: &Request, secrets: &dyn SecretSource) -> Result<bool, SourceError> {
        // A GET handshake with a verify token carries no signature: the token is its
        // credential, compared with the secret `verify_token`.
        if let Some(h) = &self.handshake
            && let Some(ok) = h.token_verifies(req, || need_candidates(secrets, VERIFY_TOKEN))?
        {
            return Ok(ok);
        }
        // Look for the credential before reading the secret: an unsigned probe costs nothing.
        let presented = match &self.scheme {
            Scheme::HmacSha256Hex { header, .. }
            | Scheme::HmacSha256Base64 { header, .. }
            | Scheme::HmacSha1Base64Url { header, .. }
            | Scheme::HmacSha1Base64UrlForm { header, .. }
            | Scheme::HmacSha1Base64UrlJson { header, .. }
            | Scheme::Timestamped { header, .. }
            | Scheme::TokenHeader { header, .. } => req.header(header),
            Scheme::StandardWebhooks { .. } => req.header(standard_webhooks::SIGNATURE_HEADER),
            Scheme::TokenParam { param } => req.query_param(param),
            // A signature in a body field: the recipe finds it (or refuses) itself.
            Scheme::Recipe(r) if r.sig_field.is_some() => Some(""),
            Scheme::Recipe(r) => req.header(&r.header),
        };
        let Some(presented) = presented else {
            return Ok(false);
        };
        if let Scheme::Recipe(r) = &self.scheme
            && r.jwks().is_some()
        {
            return r.verifies_by_jwks(req, &self.jwks_cache, self.jwks_fetcher.clone());
        }
        let c = need_candidates(secrets, SECRET)?;
        let body: &[u8] = &req.body;
        Ok(match &self.scheme {
            Scheme::HmacSha256Hex { prefix, .. } => {
                verify::hmac_prefixed(presented, prefix, &c, MacAlg::Sha256, &[body])
            }
            Scheme::HmacSha256Base64 { prefix, .. } => {
                match presented.trim().strip_prefix(prefix.as_str()) {
                    Some(rest) => verify::hmac_b64(rest, &c, MacAlg::Sha256, &[body]),
                    None => false,
                }
            }
            Scheme::HmacSha1Base64Url {
                header,
                callback_url,
            } => trello::verifies(req, header, callback_url, &c),
            Scheme::HmacSha1Base64UrlForm { callback_url, .. } => {
                verify::twilio_form(presented, &c, callback_url, body)
            }
            Scheme::HmacSha1Base64UrlJson { callback_url, .. } => {
                match verify::twilio_json_url(callback_url, &req.query) {
                    Some(url) => verify::twilio_json(presented, &c, &url, body),
                    None => false,
                }
            }
            // One secret for both versions: a `whpk_` value checks v1a entries and is never
            // an HMAC key; any other value checks v1 entries and is never a public key.
            Scheme::StandardWebhooks { tolerance_s } => {
                standard_webhooks::verifies(req, &c, &c, *tolerance_s)
            }
            Scheme::Timestamped { tolerance_s, .. } => verify::timestamped(
                TimestampedForm::TV1,
                presented,
                None,
                &c,
                body,
                req.now,
                *tolerance_s,
            ),
            Scheme::TokenHeader { prefix, .. } => match presented.strip_prefix(prefix.as_str()) {
                Some(rest) => verify::static_token(rest, &c),
                None => false,
            },
            Scheme::TokenParam { .. } => verify::static_token(presented, &c),
            Scheme::Recipe(r) => r.verifies(&req.method, |h| req.header(h), body, req.now, &c),
        })
    }

    fn challenge(
        &self,
        req: &Request,
        secrets: &dyn SecretSource,
    ) -> Result<Option<Response>, SourceError> {
        if self.declared.challenge_unauthenticated {
            // Before verification, with secrets that refuse: HEAD's empty 200, or a query
            // handshake's echo of the sender's own text.
            if self.head_handshake
                && let Some(answer) = trello::head_answer(req)
            {
                return Ok(Some(answer));
            }
            return match &self.handshake {
                Some(h) if h.unauthenticated() && h.matches(req, &Value::Null)? => {
                    h.answer(req, &Value::Null).map(Some)
                }
                _ => Ok(None),
            };
        }
        let Some(h) = &self.handshake else {
            return Ok(None);
        };
        let payload = if h.uses_payload() {
            match self.body.payload(req) {
                Ok(p) => p,
                // Not a handshake; `payload` quarantines it next.
                Err(_) => return Ok(None),
            }
        } else {
            Value::Null
        };
        if !h.matches(req, &payload)? {
            // The intake lets a GET through only for the handshake: any other GET is
            // refused, never stored.
            if h.is_get() && req.method.eq_ignore_ascii_case("GET") {
                return Ok(Some(Handshake::refused()));
            }
            return Ok(None);
        }
        // Runs after verify; checked again so that no answer ever leaves for an unverified
        // request, whoever calls this.
        if !self.verify(req, secrets)? {
            return Err(SourceError::BadChallenge);
        }
        // A verified handshake is answered, or refused with a 400: never quarantined, since
        // a handshake is never stored.
        Ok(Some(
            h.answer(req, &payload)
                .unwrap_or_else(|_| Handshake::refused()),
        ))
    }

    fn ignore(&self, req: &Request) -> Result<Option<String>, SourceError> {
        if self.ignore.is_empty() {
            return Ok(None);
        }
        let payload = if self.ignore.iter().any(Rule::uses_payload) {
            self.body.payload(req)?
        } else {
            Value::Null
        };
        for rule in &self.ignore {
            if let Some(reason) = rule.check(&payload, req)? {
                return Ok(Some(reason));
            }
        }
        Ok(None)
    }

    fn payload(&self, req: &Request) -> Result<Value, SourceError> {
        self.body.payload(req)
    }

    fn payload_is_body(&self, req: &Request) -> bool {
        self.body.payload_is_body(req)
    }

    fn key(&self, payload: &Value, req: &Request) -> Result<String, SourceError> {
        let parts = self
            .key
            .iter()
            .map(|k| k.eval_required(payload, req))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(parts.join(":"))
    }

    fn dedup_id(&self, payload: &Value, req: &Request) -> Result<Option<String>, SourceError> {
        match &self.dedup {
            Some(d) => Ok(d.eval(payload, req)?.filter(|s| !s.is_empty())),
            None => Ok(None),
        }
    }

    fn event_type(&self, payload: &Value, req: &Request) -> Result<String, SourceError> {
        match &self.event_type {
            Some(e) => Ok(e.eval(payload, req)?.unwrap_or_default()),
            None => Ok(String::new()),
        }
    }

    fn attrs(
        &self,
        payload: &Value,
        req: &Request,
    ) -> Result<BTreeMap<String, String>, SourceError> {
        let mut out = BTreeMap::new();
        for (name, expr) in &self.attrs {
            if let Some(v) = expr.eval(payload, req)? {
                out.insert(name.clone(), v);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::super::build;

    fn table(src: &str) -> toml::Table {
        src.parse().expect("toml")
    }

    fn refusal(src: &str) -> String {
        build("t", "template", &table(src))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_else(|| "accepted".into())
    }

    #[test]
    fn refusals_say_what_to_write() {
        let cases = [
            (
                "key = \"payload.id\"",
                "scheme: required; write scheme = \"hmac-sha256-hex\"",
            ),
            (
                "scheme = \"hmac-sha256-hex\"\nkey = \"payload.id\"",
                "header: required by scheme hmac-sha256-hex; write header = \"X-Signature\"",
            ),
            (
                "scheme = \"md5\"\nkey = \"payload.id\"",
                "scheme: \"md5\" is not a scheme; write one of",
            ),
            (
                "scheme = \"hmac-sha256-hex\"\nheader = \"X-S\"",
                "key: required; write key =",
            ),
            (
                "scheme = \"hmac-sha1-base64-url\"\nheader = \"X-Trello-Webhook\"\nkey = \"payload.id\"",
                "callback_url: required by scheme hmac-sha1-base64-url",
            ),
            (
                "scheme = \"standard-webhooks\"\nheader = \"X\"\nkey = \"payload.id\"",
                "header: not used by scheme standard-webhooks; remove it",
            ),
            (
                "scheme = \"hmac-sha256-hex\"\nheader = \"X-S\"\nparam = \"t\"\nkey = \"payload.id\"",
                "param: not used by scheme hmac-sha256-hex",
            ),
            (
                "scheme = \"static-token\"\nkey = \"payload.id\"",
                "write header = \"X-Token\" or param = \"token\"",
            ),
            (
                "scheme = \"static-token\"\nheader = \"X\"\nparam = \"t\"\nkey = \"payload.id\"",
                "not both",
            ),
            (
                "scheme = \"hmac-sha256-hex\"\nheader = \"X-S\"\nkey = \"repository.full_name\"",
                "write \"payload.repository.full_name\"",
            ),
            (
                "scheme = \"hmac-sha256-hex\"\nheader = \"X-S\"\nkey = 3",
                "key: must be a string or a list of strings",
            ),
            (
                "scheme = \"hmac-sha256-hex\"\nheader = \"X-S\"\nkey = \"payload.id\"\nignore = [\"ping\"]",
                "ignore: \"ping\" is not a rule",
            ),
            (
                "scheme = \"hmac-sha256-hex\"\nheader = \"X-S\"\nkey = \"payload.id\"\nhead_handshake = \"yes\"",
                "head_handshake: must be true or false",
            ),
            (
                "scheme = \"hmac-sha256-hex\"\nheader = \"X-S\"\nkey = \"payload.id\"\nattrs = { \"a b\" = \"payload.x\" }",
                "is not an attribute name",
            ),
            (
                "scheme = \"hmac-sha256-hex\"\nheader = \"X-S\"\nkey = \"payload.id\"\ntolerance_s = 900",
                "tolerance_s: not used by scheme hmac-sha256-hex; remove it (only timestamped and standard-webhooks carry a timestamp)",
            ),
            (
                "scheme = \"timestamped\"\nheader = \"X-S\"\nkey = \"payload.id\"\ntolerance_s = 10",
                "tolerance_s: must be a whole number from 30 to 3600; write tolerance_s = 300",
            ),
            (
                "scheme = \"standard-webhooks\"\nkey = \"payload.id\"\ntolerance_s = 7200",
                "tolerance_s: must be a whole number from 30 to 3600; write tolerance_s = 300",
            ),
            (
                "scheme = \"timestamped\"\nheader = \"X-S\"\nkey = \"payload.id\"\ntolerance_s = 1.5",
                "tolerance_s: must be a whole number",
            ),
            (
                "scheme = \"hmac-sha1-base64-url-form\"\nkey = \"payload.To\"\ncallback_url = \"https://hooks.example.org/x\"",
                "header: required by scheme hmac-sha1-base64-url-form; write header = \"X-Twilio-Signature\"",
            ),
            (
                "scheme = \"hmac-sha1-base64-url-form\"\nheader = \"X-Twilio-Signature\"\nkey = \"payload.To\"",
                "callback_url: required by scheme hmac-sha1-base64-url-form",
            ),
            (
                "scheme = \"hmac-sha1-base64-url-form\"\nheader = \"X-Twilio-Signature\"\ncallback_url = \"https://hooks.example.org/x\"\nkey = \"payload.To\"\nbody = \"json\"",
                "body: scheme hmac-sha1-base64-url-form signs the form's parameters, so the payload is those parameters; remove body or write body = \"form\"",
            ),
            (
                "scheme = \"hmac-sha1-base64-url-form\"\nheader = \"X-Twilio-Signature\"\nprefix = \"x\"\ncallback_url = \"https://hooks.example.org/x\"\nkey = \"payload.To\"",
                "prefix: not used by scheme hmac-sha1-base64-url-form; remove it",
            ),
            (
                "scheme = \"hmac-sha256-hex\"\nheader = \"X-S\"\ncallback_url = \"https://hooks.example.org/x\"\nkey = \"payload.id\"",
                "callback_url: not used by scheme hmac-sha256-hex; remove it (only hmac-sha1-base64-url, hmac-sha1-base64-url-form and hmac-sha1-base64-url-json sign the URL)",
            ),
            (
                "scheme = \"hmac-sha1-base64-url-json\"\nheader = \"X-Twilio-Signature\"\nkey = \"payload.id\"",
                "callback_url: required by scheme hmac-sha1-base64-url-json",
            ),
            (
                "scheme = \"hmac-sha1-base64-url-json\"\nheader = \"X-Twilio-Signature\"\ncallback_url = \"https://hooks.example.org/x?bodySHA256=ab\"\nkey = \"payload.id\"",
                "callback_url: Twilio adds bodySHA256 to each request",
            ),
        ];
        for (src, want) in cases {
            let got = refusal(src);
            assert!(got.contains(want), "{src}\n got: {got}\nwant: {want}");
        }
    }

    #[test]
    fn keep_headers_follow_selectors_minus_auth() {
        let s = build(
            "t",
            "template",
            &table(
                "scheme = \"hmac-sha256-hex\"\nheader = \"X-Hub-Signature-256\"\nprefix = \"sha256=\"\n\
                 key = [\"payload.repository.full_name\", \"header.X-GitHub-Event\"]\n\
                 dedup = \"header.X-GitHub-Delivery\"\nevent_type = \"header.X-Hub-Signature-256\"",
            ),
        )
        .expect("builds");
        assert_eq!(
            s.declared().keep_headers,
            [
                "X-GitHub-Delivery".to_string(),
                "X-GitHub-Event".to_string()
            ]
        );
        assert_eq!(
            s.declared().auth_headers,
            ["X-Hub-Signature-256".to_string()]
        );
        assert_eq!(s.declared().action, None);
    }
}
