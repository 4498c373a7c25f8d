//! The Gmail push source: Cloud Pub/Sub push deliveries for watched mailboxes.
//!
//! Owns: the shared token in the push endpoint's query string (`?token=…`, parameter name
//! configurable with `param`), compared in constant time against every candidate; dedup on
//! `message.messageId`; the key per mailbox, read from the base64 `message.data` Gmail puts
//! there (`{"emailAddress": …, "historyId": …}`).
//!
//! Must not: log or echo the query string (the token lives there; the intake never logs
//! query strings), or treat the token as covering the body (it does not: the kit marks this
//! source `body_signed = false`). Pub/Sub's messageId is per push, not per mailbox change, so
//! a retry after a lost ack can be a second event; the processor reconciles (spec section 7).
//!
//! With `audience` set (the recommended mode), the push must also carry the OIDC ID token an
//! authenticated Pub/Sub push subscription sends (`Authorization: Bearer <JWT>`): RS256,
//! its signature checked against Google's published keys (`jwks_url`, default
//! [`GOOGLE_CERTS_URL`], fetched through the guarded cache in [`super::jwks`], so this
//! source then runs on the intake's blocking pool), `iss` accounts.google.com or
//! https://accounts.google.com, `aud` the configured audience, `exp` not passed and `iat`
//! not in the future (60 s of skew), and with `service_account` set, `email` that account
//! with `email_verified` true. The query token is checked first, so a request without it
//! never reaches the key host. Like the query token, the ID token covers no body.

use std::collections::BTreeMap;

use base64::Engine as _;
use serde_json::Value;

use std::sync::Arc;

use super::jwks::{GOOGLE_CERTS_URL, JwksCache, JwksFetcher};
use super::opts::{Opts, invalid};
use super::recipe::Recipe;
use super::verify;
use super::{
    Declared, Request, SecretSource, Source, SourceConfigError, SourceError, names, need_candidates,
};

pub const SECRET: &str = "push_token";
pub const PARAM_DEFAULT: &str = "token";

/// The issuers of Google's ID tokens.
pub const GOOGLE_ISSUERS: &[&str] = &["accounts.google.com", "https://accounts.google.com"];

pub struct Gmail {
    declared: Declared,
    param: String,
    /// The OIDC check (`audience` set): a `jws-rs256` recipe on `Authorization`.
    oidc: Option<Box<Recipe>>,
    jwks_cache: Arc<JwksCache>,
    jwks_fetcher: Option<Arc<dyn JwksFetcher>>,
}

impl Gmail {
    pub fn build(name: &str, mut o: Opts<'_>) -> Result<Self, SourceConfigError> {
        let param = o
            .string("param", "\"token\"")?
            .unwrap_or_else(|| PARAM_DEFAULT.to_string());
        if param.is_empty()
            || !param
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            return Err(invalid(
                "param",
                "must be a query parameter name; write param = \"token\"".to_string(),
            ));
        }
        let audience = o.string("audience", "\"https://hooks.example.org/hooks/gmail\"")?;
        let service_account = o.string(
            "service_account",
            "\"push@my-project.iam.gserviceaccount.com\"",
        )?;
        let jwks_url = o.string("jwks_url", "\"https://www.googleapis.com/oauth2/v3/certs\"")?;
        let allow = match o.table("jwks_allow_private") {
            None => Vec::new(),
            Some(toml::Value::Array(a)) if a.iter().all(|v| v.as_str().is_some()) => a
                .iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect(),
            Some(_) => {
                return Err(invalid(
                    "jwks_allow_private",
                    "must be a list of address blocks; write jwks_allow_private = [\"127.0.0.1/32\"]".to_string(),
                ));
            }
        };
        let oidc = match audience {
            None => {
                for (key, given) in [
                    ("service_account", service_account.is_some()),
                    ("jwks_url", jwks_url.is_some()),
                    ("jwks_allow_private", !allow.is_empty()),
                ] {
                    if given {
                        return Err(invalid(
                            key,
                            "only used with the OIDC check; set audience = \"<the audience of the push subscription>\" or remove it".to_string(),
                        ));
                    }
                }
                None
            }
            Some(aud) if aud.trim().is_empty() || aud.len() > 2048 => {
                return Err(invalid(
                    "audience",
                    "must be the audience the push subscription's token carries; write audience = \"https://hooks.example.org/hooks/gmail\"".to_string(),
                ));
            }
            Some(aud) => {
                if let Some(sa) = &service_account
                    && (!sa.contains('@') || sa.len() > 320)
                {
                    return Err(invalid(
                        "service_account",
                        "must be the service account's email; write service_account = \"push@my-project.iam.gserviceaccount.com\"".to_string(),
                    ));
                }
                let url = jwks_url.unwrap_or_else(|| GOOGLE_CERTS_URL.to_string());
                // Named as this source's keys in the error, not the recipe's.
                super::jwks::parse_url("jwks_url", &url, "jwks_allow_private", allow.clone())?;
                let mut t = toml::Table::new();
                t.insert("algorithm".into(), "jws-rs256".into());
                t.insert("header".into(), "Authorization".into());
                t.insert("prefix".into(), "Bearer ".into());
                t.insert("audience".into(), aud.into());
                t.insert(
                    "issuer".into(),
                    toml::Value::Array(GOOGLE_ISSUERS.iter().map(|i| (*i).into()).collect()),
                );
                if let Some(sa) = service_account {
                    t.insert("email".into(), sa.into());
                }
                t.insert("jwks_url".into(), url.into());
                if !allow.is_empty() {
                    t.insert(
                        "jwks_allow_private".into(),
                        toml::Value::Array(allow.into_iter().map(Into::into).collect()),
                    );
                }
                Some(Box::new(Recipe::parse(&t)?))
            }
        };
        o.finish()?;
        Ok(Gmail {
            declared: Declared {
                secrets: &[SECRET],
                // Pub/Sub's OIDC bearer token: never stored.
                auth_headers: names(&["Authorization"]),
                span: "mail",
                sender_retries: true,
                fetches_keys: oidc.is_some(),
                ..Declared::builtin(name, "gmail")
            },
            param,
            oidc,
            jwks_cache: JwksCache::shared(),
            jwks_fetcher: None,
        })
    }

    /// The same source with its own JWK Set cache and fetcher (tests).
    pub fn with_jwks(mut self, cache: Arc<JwksCache>, fetcher: Arc<dyn JwksFetcher>) -> Self {
        self.jwks_cache = cache;
        self.jwks_fetcher = Some(fetcher);
        self
    }
}

fn message_id(payload: &Value) -> Option<String> {
    let m = payload.get("message")?;
    m.get("messageId")
        .or_else(|| m.get("message_id"))
        .and_then(Value::as_str)
        .map(str::to_string)
}

/// `message.data` as bytes. Pub/Sub's push format documents standard base64, Gmail's push
/// guide documents base64url; senders differ, so both alphabets are read, padding or not.
/// Neither alphabet's extra characters (`+/` or `-_`) mean anything in the other, so reading
/// both never turns one sender's value into a different one's.
fn message_data(data: &str) -> Option<Vec<u8>> {
    use base64::engine::DecodePaddingMode;
    use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
    const CONFIG: GeneralPurposeConfig =
        GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent);
    const STANDARD: GeneralPurpose = GeneralPurpose::new(&base64::alphabet::STANDARD, CONFIG);
    const URL_SAFE: GeneralPurpose = GeneralPurpose::new(&base64::alphabet::URL_SAFE, CONFIG);
    let data = data.trim();
    STANDARD
        .decode(data)
        .or_else(|_| URL_SAFE.decode(data))
        .ok()
}

/// The mailbox from message.data, when it decodes.
fn mailbox(payload: &Value) -> Option<String> {
    let data = payload.pointer("/message/data").and_then(Value::as_str)?;
    let raw = message_data(data)?;
    let inner: Value = serde_json::from_slice(&raw).ok()?;
    inner
        .get("emailAddress")
        .and_then(Value::as_str)
        .map(str::to_string)
}

impl Source for Gmail {
    fn declared(&self) -> &Declared {
        &self.declared
    }

    fn payload_is_body(&self, req: &Request) -> bool {
        super::body_is_payload(req)
    }

    fn verify(&self, req: &Request, secrets: &dyn SecretSource) -> Result<bool, SourceError> {
        let Some(presented) = req.query_param(&self.param) else {
            return Ok(false);
        };
        if !verify::static_token(presented, &need_candidates(secrets, SECRET)?) {
            return Ok(false);
        }
        match &self.oidc {
            None => Ok(true),
            Some(r) => r.verifies_by_jwks(req, &self.jwks_cache, self.jwks_fetcher.clone()),
        }
    }

    fn key(&self, payload: &Value, _req: &Request) -> Result<String, SourceError> {
        mailbox(payload)
            .or_else(|| {
                payload
                    .get("subscription")
                    .and_then(Value::as_str)
                    .map(str::to_string)
            })
            .ok_or(SourceError::MissingField {
                field: "message.data.emailAddress".to_string(),
            })
    }

    fn dedup_id(&self, payload: &Value, _req: &Request) -> Result<Option<String>, SourceError> {
        Ok(message_id(payload))
    }

    fn event_type(&self, _payload: &Value, _req: &Request) -> Result<String, SourceError> {
        Ok("push".to_string())
    }

    fn attrs(
        &self,
        payload: &Value,
        _req: &Request,
    ) -> Result<BTreeMap<String, String>, SourceError> {
        let mut a = BTreeMap::from([("event_type".to_string(), "push".to_string())]);
        if let Some(s) = payload.get("subscription").and_then(Value::as_str) {
            a.insert("subscription".to_string(), s.to_string());
        }
        Ok(a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Regression: Gmail documents `message.data` as base64url, and a value holding `-` or
    /// `_` was read as standard base64 only, so the mailbox key fell back to the
    /// subscription name.
    #[test]
    fn message_data_in_base64url_is_read_like_standard_base64() {
        // Chosen so its encodings differ: standard has `+` and `/`, base64url `-` and `_`.
        let inner = br#"{"emailAddress":"a~~?>@example.org","historyId":"9"}"#;
        let std = base64::engine::general_purpose::STANDARD.encode(inner);
        let url = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(inner);
        assert!(std.contains('+') || std.contains('/'), "{std}");
        assert!(url.contains('-') || url.contains('_'), "{url}");
        for data in [std.as_str(), url.as_str(), std.trim_end_matches('=')] {
            let payload = json!({"message": {"data": data, "messageId": "1"},
                                 "subscription": "projects/p/subscriptions/s"});
            assert_eq!(
                mailbox(&payload).as_deref(),
                Some("a~~?>@example.org"),
                "{data}"
            );
        }
        // Neither alphabet: no mailbox (the key falls back to the subscription).
        let payload = json!({"message": {"data": "not base64!"}, "subscription": "s"});
        assert_eq!(mailbox(&payload), None);
    }
}
