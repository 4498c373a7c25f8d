//! The source kit: correctly (and deliberately wrongly) signed requests for every source.
//!
//! Owns: a [`Kit`] per built-in source (and the v1a-only standard-webhooks configuration)
//! and per template scheme (and its `tolerance_s` and v1a variants), each able to make a
//! signed, unsigned, wrong-secret, tampered, stale, future-dated and handshake request for a
//! body and a clock (v1a signed with an Ed25519 key derived from the kit's secret, through
//! aws-lc-rs); the flags that say which cases apply (`body_signed`, `has_timestamp`,
//! `handshake`); in-memory [`SecretSource`]s ([`MapSecrets`], and [`RefusingSecrets`] that
//! records any access); and [`all_kits`], the ONE list the matrix runs over. It is public
//! because `hookspool bobbin check` and the intake tests reuse it.
//!
//! Must not: be trusted by production code. The Plaid kit key below is published in this
//! file; only the kit's own stub fetcher ever serves it. Must not do I/O.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};

use crate::sources::body::FORM_MEDIA_TYPE;
use crate::sources::plaid::{KeyCache, Plaid, PlaidJwk, StaticJwkFetcher};
use crate::sources::verify::{self, MacAlg, TOLERANCE_S_DEFAULT};

use crate::sources::{KINDS, Request, SecretError, SecretSource, Source, SourceConfigError, build};

/// A fixed clock for kit requests (2023-11-14), far from any real delivery.
pub const KIT_NOW: f64 = 1_700_000_000.0;
/// How far outside the tolerance the stale and future cases are signed.
pub const KIT_SKEW_MARGIN_S: f64 = 60.0;
/// The Plaid kit key's kid and its public half; the private half is `KIT_PLAID_PKCS8_B64`.
pub const KIT_PLAID_KID: &str = "hookspool-kit-key-1";
pub const KIT_PLAID_X: &str = "KUbDEehlr0LyZawHtCRBjhG9B5-imBFvluoW88ZRh38";
pub const KIT_PLAID_Y: &str = "HSKNfVVhOiD5rMQyRBbN8vHEcxhHySB0rCDsfeNYIAs";
/// PKCS#8 DER (base64) of a P-256 key made for the kit with openssl. Public on purpose.
const KIT_PLAID_PKCS8_B64: &str = "MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgXljkFVeEHrlEtWDeOglDLMcVzZ+hEG929iJ2dS/IIDShRANCAAQpRsMR6GWvQvJlrAe0JEGOEb0Hn6KYEW+W6hbzxlGHfx0ijX1VYTog+azEMkQWzfLxxHMYR8kgdKwg7H3jWCAL";

/// A source's handshake, as far as the kit is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handshake {
    None,
    /// Signed like any request, answered only after verify (Zoom url_validation).
    Signed,
    /// No signature; a constant answer before verify (Trello HEAD, template head_handshake).
    Unauthenticated,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KitFlags {
    /// The credential covers the body (false for static tokens): tampering must fail.
    pub body_signed: bool,
    /// The scheme carries a timestamp: stale and future requests must fail.
    pub has_timestamp: bool,
    pub handshake: Handshake,
    /// The sample body yields a dedup id.
    pub dedups: bool,
}

/// Secrets held in memory. `Debug` shows names and counts only.
#[derive(Clone, Default)]
pub struct MapSecrets {
    values: BTreeMap<String, Vec<Vec<u8>>>,
}

impl MapSecrets {
    pub fn new() -> Self {
        MapSecrets::default()
    }

    /// Adds a candidate for `name` (call twice for a rotation; newest first).
    pub fn with(mut self, name: &str, value: &[u8]) -> Self {
        self.values
            .entry(name.to_string())
            .or_default()
            .push(value.to_vec());
        self
    }
}

impl SecretSource for MapSecrets {
    fn candidates(&self, name: &str) -> Result<Vec<Vec<u8>>, SecretError> {
        self.values
            .get(name)
            .cloned()
            .ok_or_else(|| SecretError::NotConfigured {
                name: name.to_string(),
            })
    }
}

impl fmt::Debug for MapSecrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.values.iter().map(|(k, v)| (k, v.len())))
            .finish()
    }
}

/// How the kit puts a credential on a request.
#[derive(Clone)]
enum Signer {
    Hex {
        header: String,
        prefix: String,
    },
    B64 {
        header: String,
        prefix: String,
    },
    Sha1Url {
        header: String,
        url: String,
    },
    /// Twilio: base64 HMAC-SHA1 over the URL and the sorted form parameters.
    Sha1UrlForm {
        header: String,
        url: String,
    },
    /// Twilio's JSON bodies: `bodySHA256` in the query, base64 HMAC-SHA1 over the URL with it.
    Sha1UrlJson {
        header: String,
        url: String,
    },
    StandardWebhooks,
    /// Standard Webhooks v1a: Ed25519 with the kit key derived from the kit's secret.
    StandardWebhooksV1a,
    Tv1 {
        header: String,
    },
    /// `v0=<hex>` over `v0:<ts>:<body>`, the timestamp in its own header (Zoom, Slack).
    V0 {
        signature: &'static str,
        timestamp: &'static str,
    },
    TokenHeader {
        header: String,
        prefix: String,
    },
    TokenParam {
        param: String,
    },
    Plaid,
}

/// One source with everything needed to make requests for it.
pub struct Kit {
    pub label: String,
    pub source: Arc<dyn Source>,
    pub secrets: MapSecrets,
    pub flags: KitFlags,
    /// Headers every kit request carries (event names, delivery ids, channel ids).
    pub extra_headers: Vec<(String, String)>,
    pub sample_body: Vec<u8>,
    /// The source's options as a `[sources.<name>]` table would carry them (minus `type` and
    /// `secrets`), so a harness can configure the same source through config.
    pub options: toml::Table,
    /// The Content-Type of the kit's requests with a body (JSON, or a form for Twilio).
    pub content_type: &'static str,
    /// The source's replay window (its `tolerance_s`, else the default): the stale and
    /// future-dated requests are signed just outside it.
    pub tolerance_s: u64,
    signer: Signer,
    secret: Vec<u8>,
}

/// Media type of the kit's JSON bodies.
const JSON_MEDIA_TYPE: &str = "application/json";

/// The Ed25519 key pair the kit signs v1a with: its seed is SHA-256 of the kit's secret, so
/// each secret (and a "wrong" one) is its own key. `None` never happens for a 32-byte seed.
fn kit_ed25519(secret: &[u8]) -> Option<aws_lc_rs::signature::Ed25519KeyPair> {
    let seed = hex::decode(verify::sha256_hex(secret)).ok()?;
    aws_lc_rs::signature::Ed25519KeyPair::from_seed_unchecked(&seed).ok()
}

/// The `whpk_` public key the kit's v1a signatures verify with, for `secret`.
pub fn kit_v1a_public_key(secret: &[u8]) -> String {
    use aws_lc_rs::signature::KeyPair as _;
    match kit_ed25519(secret) {
        Some(k) => format!("whpk_{}", STANDARD.encode(k.public_key().as_ref())),
        None => String::new(),
    }
}

/// The kit's Plaid key as Plaid's key endpoint would return it.
pub fn kit_plaid_jwk() -> PlaidJwk {
    PlaidJwk {
        kid: KIT_PLAID_KID.to_string(),
        alg: "ES256".to_string(),
        kty: "EC".to_string(),
        crv: "P-256".to_string(),
        x: KIT_PLAID_X.to_string(),
        y: KIT_PLAID_Y.to_string(),
        created_at: Some(1_600_000_000),
        expired_at: None,
    }
}

/// A Plaid-Verification value: ES256 JWS over `{iat, request_body_sha256}` with `kid`.
/// `None` only if the key bytes are not a P-256 PKCS#8 key.
pub fn plaid_jws(pkcs8_der: &[u8], kid: &str, body: &[u8], iat: i64) -> Option<String> {
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
    header.kid = Some(kid.to_string());
    let claims = json!({"iat": iat, "request_body_sha256": verify::sha256_hex(body)});
    jsonwebtoken::encode(
        &header,
        &claims,
        &jsonwebtoken::EncodingKey::from_ec_der(pkcs8_der),
    )
    .ok()
}

fn kit_pkcs8() -> Vec<u8> {
    // A constant that decodes (checked by the matrix); an empty key would only make every
    // Plaid kit request unsigned, never a false success.
    STANDARD.decode(KIT_PLAID_PKCS8_B64).unwrap_or_default()
}

fn flags(body_signed: bool, has_timestamp: bool, handshake: Handshake, dedups: bool) -> KitFlags {
    KitFlags {
        body_signed,
        has_timestamp,
        handshake,
        dedups,
    }
}

fn hdrs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The `challenge` of the Slack kit's url_verification handshake.
pub const KIT_SLACK_CHALLENGE: &str = "kitSlackChallenge123";

/// The Trello-style callback URL the kits sign.
pub const KIT_CALLBACK_URL: &str = "https://hooks.example.org/hooks/trello";

impl Kit {
    /// The kit for a built-in source type, signing with `secret`.
    pub fn builtin(kind: &str, secret: &[u8]) -> Result<Kit, SourceConfigError> {
        let mut opts = toml::Table::new();
        if kind == "trello" {
            opts.insert("callback_url".into(), KIT_CALLBACK_URL.into());
        }
        let (source, signer, flags, extra, body, secrets): (Arc<dyn Source>, _, _, _, Value, _) =
            match kind {
                "github" => (
                    build(kind, kind, &opts)?,
                    Signer::Hex {
                        header: "X-Hub-Signature-256".into(),
                        prefix: "sha256=".into(),
                    },
                    flags(true, false, Handshake::None, true),
                    hdrs(&[
                        ("X-GitHub-Event", "push"),
                        ("X-GitHub-Delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958"),
                    ]),
                    json!({"ref": "refs/heads/main", "repository": {"full_name": "octo/kit"}}),
                    MapSecrets::new().with("secret", secret),
                ),
                "zoom" => (
                    build(kind, kind, &opts)?,
                    Signer::V0 {
                        signature: "x-zm-signature",
                        timestamp: "x-zm-request-timestamp",
                    },
                    flags(true, true, Handshake::Signed, true),
                    Vec::new(),
                    json!({"event": "meeting.started", "event_ts": 1_700_000_000_123_i64,
                       "payload": {"account_id": "acc1", "object": {"id": "85012345678", "uuid": "u1"}}}),
                    MapSecrets::new().with("webhook_secret", secret),
                ),
                "trello" => (
                    build(kind, kind, &opts)?,
                    Signer::Sha1Url {
                        header: "X-Trello-Webhook".into(),
                        url: KIT_CALLBACK_URL.into(),
                    },
                    flags(true, false, Handshake::Unauthenticated, true),
                    Vec::new(),
                    json!({"action": {"id": "act1", "type": "updateCard", "data": {"board": {"id": "board1"}}},
                       "model": {"id": "board1"}}),
                    MapSecrets::new().with("secret", secret),
                ),
                "plaid" => {
                    let fetcher = Arc::new(StaticJwkFetcher::new(vec![kit_plaid_jwk()]));
                    (
                        Arc::new(Plaid::with_parts(
                            kind,
                            "sandbox",
                            Arc::new(KeyCache::new()),
                            Some(fetcher),
                        )) as Arc<dyn Source>,
                        Signer::Plaid,
                        flags(true, true, Handshake::None, true),
                        Vec::new(),
                        json!({"environment": "sandbox", "item_id": "item1",
                           "webhook_code": "SYNC_UPDATES_AVAILABLE", "webhook_type": "TRANSACTIONS"}),
                        MapSecrets::new()
                            .with("client_id", secret)
                            .with("secret", secret),
                    )
                }
                "gmail" => (
                    build(kind, kind, &opts)?,
                    Signer::TokenParam {
                        param: "token".into(),
                    },
                    flags(false, false, Handshake::None, true),
                    Vec::new(),
                    json!({"message": {"data": STANDARD.encode(br#"{"emailAddress":"kit@example.org","historyId":"42"}"#),
                                   "messageId": "2070443601311540", "publishTime": "2021-02-26T19:13:55.749Z"},
                       "subscription": "projects/kit/subscriptions/gmail"}),
                    MapSecrets::new().with("push_token", secret),
                ),
                "calendar" => (
                    build(kind, kind, &opts)?,
                    Signer::TokenHeader {
                        header: "X-Goog-Channel-Token".into(),
                        prefix: String::new(),
                    },
                    flags(false, false, Handshake::None, true),
                    hdrs(&[
                        ("X-Goog-Channel-ID", "4ba78bf0-6a47-11e2-bcfd-0800200c9a66"),
                        ("X-Goog-Message-Number", "10"),
                        ("X-Goog-Resource-ID", "ret08u3rv24htgh289g"),
                        ("X-Goog-Resource-State", "exists"),
                    ]),
                    Value::Null,
                    MapSecrets::new().with("channel_token", secret),
                ),
                "kaneo" => (
                    build(kind, kind, &opts)?,
                    Signer::Hex {
                        header: "X-Kaneo-Signature".into(),
                        prefix: String::new(),
                    },
                    flags(true, false, Handshake::None, false),
                    Vec::new(),
                    json!({"event": "task.created", "project": {"id": "proj1", "name": "Kit"},
                       "task": {"id": "task1", "title": "t"}, "actor": {"id": "u1"}, "data": {}}),
                    MapSecrets::new().with("secret", secret),
                ),
                "slack" => (
                    build(kind, kind, &opts)?,
                    Signer::V0 {
                        signature: crate::sources::slack::SIGNATURE_HEADER,
                        timestamp: crate::sources::slack::TIMESTAMP_HEADER,
                    },
                    flags(true, true, Handshake::Signed, true),
                    Vec::new(),
                    json!({"token": "kit", "team_id": "T0KIT", "api_app_id": "A0KIT", "type": "event_callback",
                       "event_id": "Ev0KIT", "event_time": 1_700_000_000,
                       "event": {"type": "app_mention", "channel": "C0KIT", "user": "U0KIT", "text": "hi", "ts": "1700000000.000100"}}),
                    MapSecrets::new().with(crate::sources::slack::SECRET, secret),
                ),
                "standard-webhooks" => (
                    build(kind, kind, &opts)?,
                    Signer::StandardWebhooks,
                    flags(true, true, Handshake::None, true),
                    Vec::new(),
                    json!({"type": "invoice.paid", "data": {"id": "inv1"}}),
                    MapSecrets::new().with("secret", secret),
                ),
                other => {
                    return Err(SourceConfigError::UnknownKind {
                        kind: other.to_string(),
                        accepted: KINDS
                            .iter()
                            .filter(|k| **k != "template")
                            .copied()
                            .collect::<Vec<_>>()
                            .join(", "),
                    });
                }
            };
        let sample_body = if body.is_null() {
            Vec::new()
        } else {
            body.to_string().into_bytes()
        };
        let mut options = opts;
        if kind == "plaid" {
            // The kit's Plaid source is a sandbox one; its key comes from the kit's fetcher.
            options.insert("env".into(), "sandbox".into());
        }
        Ok(Kit {
            label: kind.to_string(),
            source,
            secrets,
            flags,
            extra_headers: extra,
            sample_body,
            options,
            content_type: JSON_MEDIA_TYPE,
            tolerance_s: TOLERANCE_S_DEFAULT,
            signer,
            secret: secret.to_vec(),
        })
    }

    /// The built-in standard-webhooks source configured with `public_key` only (v1a), its
    /// requests signed with the kit's Ed25519 key for `secret`.
    pub fn standard_webhooks_v1a(secret: &[u8]) -> Result<Kit, SourceConfigError> {
        let mut kit = Kit::builtin("standard-webhooks", secret)?;
        kit.label = "standard-webhooks-v1a".to_string();
        kit.source = build(&kit.label, "standard-webhooks", &toml::Table::new())?;
        kit.secrets = MapSecrets::new().with(
            crate::sources::standard_webhooks::PUBLIC_KEY,
            kit_v1a_public_key(secret).as_bytes(),
        );
        kit.signer = Signer::StandardWebhooksV1a;
        Ok(kit)
    }

    /// The kit for a template source given its `[sources.<name>]` table (TOML text).
    pub fn template(label: &str, options: &str, secret: &[u8]) -> Result<Kit, SourceConfigError> {
        let table: toml::Table = options.parse().map_err(|_| SourceConfigError::Invalid {
            key: "template".to_string(),
            message: "the kit's options are not TOML; write key = \"value\" lines".to_string(),
        })?;
        let source = build(label, "template", &table)?;
        let s = |k: &str| {
            table
                .get(k)
                .and_then(toml::Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        let scheme = s("scheme");
        let (signer, body_signed, has_timestamp) = match scheme.as_str() {
            "hmac-sha256-hex" => (
                Signer::Hex {
                    header: s("header"),
                    prefix: s("prefix"),
                },
                true,
                false,
            ),
            "hmac-sha256-base64" => (
                Signer::B64 {
                    header: s("header"),
                    prefix: s("prefix"),
                },
                true,
                false,
            ),
            "hmac-sha1-base64-url" => (
                Signer::Sha1Url {
                    header: s("header"),
                    url: s("callback_url"),
                },
                true,
                false,
            ),
            "hmac-sha1-base64-url-form" => (
                Signer::Sha1UrlForm {
                    header: s("header"),
                    url: s("callback_url"),
                },
                true,
                false,
            ),
            "hmac-sha1-base64-url-json" => (
                Signer::Sha1UrlJson {
                    header: s("header"),
                    url: s("callback_url"),
                },
                true,
                false,
            ),
            "standard-webhooks" => (Signer::StandardWebhooks, true, true),
            "timestamped" => (
                Signer::Tv1 {
                    header: s("header"),
                },
                true,
                true,
            ),
            _ if table.contains_key("param") => {
                (Signer::TokenParam { param: s("param") }, false, false)
            }
            _ => (
                Signer::TokenHeader {
                    header: s("header"),
                    prefix: s("prefix"),
                },
                false,
                false,
            ),
        };
        let handshake = if source.declared().challenge_unauthenticated {
            Handshake::Unauthenticated
        } else {
            Handshake::None
        };
        let form = matches!(signer, Signer::Sha1UrlForm { .. });
        let tolerance_s = table
            .get("tolerance_s")
            .and_then(toml::Value::as_integer)
            .and_then(|t| u64::try_from(t).ok())
            .unwrap_or(TOLERANCE_S_DEFAULT);
        let sample_body = if form {
            // A Twilio-style message: the parameters a form scheme's selectors read.
            b"MessageSid=SMkit0001&SmsStatus=received&To=%2B15005550006&From=%2B12025550143&Body=kit+message".to_vec()
        } else {
            json!({"id": "evt_1", "type": "thing.happened", "repository": {"full_name": "octo/kit"}})
                .to_string()
                .into_bytes()
        };
        Ok(Kit {
            label: label.to_string(),
            flags: flags(
                body_signed,
                has_timestamp,
                handshake,
                table.contains_key("dedup"),
            ),
            source,
            secrets: MapSecrets::new().with("secret", secret),
            extra_headers: hdrs(&[("X-Event", "thing.happened"), ("X-Delivery-Id", "dlv-1")]),
            sample_body,
            options: table,
            content_type: if form {
                FORM_MEDIA_TYPE
            } else {
                JSON_MEDIA_TYPE
            },
            tolerance_s,
            signer,
            secret: secret.to_vec(),
        })
    }

    /// A template kit with the standard-webhooks scheme whose one secret is the kit's
    /// `whpk_` public key: its requests are signed v1a only.
    pub fn template_v1a(
        label: &str,
        options: &str,
        secret: &[u8],
    ) -> Result<Kit, SourceConfigError> {
        let mut kit = Kit::template(label, options, secret)?;
        if !matches!(kit.signer, Signer::StandardWebhooks) {
            return Err(SourceConfigError::Invalid {
                key: "scheme".to_string(),
                message: "a v1a kit signs Standard Webhooks; write scheme = \"standard-webhooks\""
                    .to_string(),
            });
        }
        kit.secrets = MapSecrets::new().with("secret", kit_v1a_public_key(secret).as_bytes());
        kit.signer = Signer::StandardWebhooksV1a;
        Ok(kit)
    }

    fn base(&self, method: &str, body: &[u8], now: f64) -> Request {
        let mut r =
            Request::new(method, &format!("/hooks/{}", self.label), now).with_body(body.to_vec());
        r.remote_addr = "127.0.0.1".to_string();
        if !body.is_empty() {
            r = r.with_header("Content-Type", self.content_type);
        }
        for (k, v) in &self.extra_headers {
            r = r.with_header(k, v);
        }
        r
    }

    fn sign_with(&self, mut r: Request, secret: &[u8], signed_at: f64) -> Request {
        let ts = (signed_at as i64).to_string();
        let body = r.body.clone();
        match &self.signer {
            Signer::Hex { header, prefix } => {
                let v = format!(
                    "{prefix}{}",
                    verify::mac_hex(MacAlg::Sha256, secret, &[&body])
                );
                r.with_header(header, &v)
            }
            Signer::B64 { header, prefix } => {
                let v = format!(
                    "{prefix}{}",
                    STANDARD.encode(verify::mac(MacAlg::Sha256, secret, &[&body]))
                );
                r.with_header(header, &v)
            }
            Signer::Sha1Url { header, url } => {
                let v =
                    STANDARD.encode(verify::mac(MacAlg::Sha1, secret, &[&body, url.as_bytes()]));
                r.with_header(header, &v)
            }
            Signer::Sha1UrlForm { header, url } => {
                let content = verify::twilio_signed_content(url, &body);
                let v = STANDARD.encode(verify::mac(MacAlg::Sha1, secret, &[&content]));
                r.with_header(header, &v)
            }
            Signer::Sha1UrlJson { header, url } => {
                let hash = verify::sha256_hex(&body);
                let query = [(verify::TWILIO_BODY_SHA256_PARAM.to_string(), hash.clone())];
                let signed = verify::twilio_json_url(url, &query).unwrap_or_default();
                let v = STANDARD.encode(verify::mac(MacAlg::Sha1, secret, &[signed.as_bytes()]));
                r.with_query(verify::TWILIO_BODY_SHA256_PARAM, &hash)
                    .with_header(header, &v)
            }
            Signer::StandardWebhooksV1a => {
                let id = format!("msg_{}", &verify::sha256_hex(&body)[..16]);
                let mut message = format!("{id}.{ts}.").into_bytes();
                message.extend_from_slice(&body);
                let v = match kit_ed25519(secret) {
                    Some(k) => format!("v1a,{}", STANDARD.encode(k.sign(&message).as_ref())),
                    None => String::new(),
                };
                r.with_header("webhook-id", &id)
                    .with_header("webhook-timestamp", &ts)
                    .with_header("webhook-signature", &v)
            }
            Signer::StandardWebhooks => {
                let id = format!("msg_{}", &verify::sha256_hex(&body)[..16]);
                let key = verify::standard_webhooks_key(secret).unwrap_or_default();
                let tag = verify::mac(
                    MacAlg::Sha256,
                    &key,
                    &[id.as_bytes(), b".", ts.as_bytes(), b".", &body],
                );
                let v = format!("v1,{}", STANDARD.encode(tag));
                r.with_header("webhook-id", &id)
                    .with_header("webhook-timestamp", &ts)
                    .with_header("webhook-signature", &v)
            }
            Signer::Tv1 { header } => {
                let v = verify::mac_hex(MacAlg::Sha256, secret, &[ts.as_bytes(), b".", &body]);
                r.with_header(header, &format!("t={ts},v1={v}"))
            }
            Signer::V0 {
                signature,
                timestamp,
            } => {
                let v = verify::mac_hex(
                    MacAlg::Sha256,
                    secret,
                    &[b"v0:", ts.as_bytes(), b":", &body],
                );
                r.with_header(timestamp, &ts)
                    .with_header(signature, &format!("v0={v}"))
            }
            Signer::TokenHeader { header, prefix } => {
                let v = format!("{prefix}{}", String::from_utf8_lossy(secret));
                r.with_header(header, &v)
            }
            Signer::TokenParam { param } => {
                let v = String::from_utf8_lossy(secret).into_owned();
                r.query.push((param.clone(), v));
                r
            }
            Signer::Plaid => {
                // The secret plays no part: Plaid signs with its key, which the kit holds.
                let _ = secret;
                match plaid_jws(&kit_pkcs8(), KIT_PLAID_KID, &body, signed_at as i64) {
                    Some(jws) => r.with_header("Plaid-Verification", &jws),
                    None => r,
                }
            }
        }
    }

    /// A request signed at `signed_at`, received at `now`.
    pub fn request(&self, body: &[u8], signed_at: f64, now: f64) -> Request {
        self.sign_with(self.base("POST", body, now), &self.secret, signed_at)
    }

    pub fn signed(&self, body: &[u8], now: f64) -> Request {
        self.request(body, now, now)
    }

    /// The same request without any credential (auth headers and token parameter gone).
    pub fn unsigned(&self, body: &[u8], now: f64) -> Request {
        let mut r = self.signed(body, now);
        for h in &self.source.declared().auth_headers {
            r.remove_header(h);
        }
        if let Signer::TokenParam { param } = &self.signer {
            r.query.retain(|(k, _)| k != param);
        }
        r
    }

    /// Signed with a secret the source does not hold (Plaid: a signature over other claims).
    pub fn wrong_secret(&self, body: &[u8], now: f64) -> Request {
        if let Signer::Plaid = self.signer {
            let mut r = self.signed(body, now);
            let other = plaid_jws(&kit_pkcs8(), KIT_PLAID_KID, b"other body", now as i64)
                .unwrap_or_default();
            let forged = match (r.header("Plaid-Verification"), other.rsplit_once('.')) {
                (Some(mine), Some((_, other_sig))) => mine
                    .rsplit_once('.')
                    .map(|(msg, _)| format!("{msg}.{other_sig}"))
                    .unwrap_or_default(),
                _ => String::new(),
            };
            r.remove_header("Plaid-Verification");
            return r.with_header("Plaid-Verification", &forged);
        }
        let mut wrong = self.secret.clone();
        wrong.extend_from_slice(b"-not-the-secret");
        self.sign_with(self.base("POST", body, now), &wrong, now)
    }

    /// Signed, then one byte of body added.
    pub fn tampered(&self, body: &[u8], now: f64) -> Request {
        let mut r = self.signed(body, now);
        r.body.push(b' ');
        r
    }

    pub fn stale(&self, body: &[u8], now: f64) -> Request {
        self.request(body, now - self.tolerance_s as f64 - KIT_SKEW_MARGIN_S, now)
    }

    pub fn future(&self, body: &[u8], now: f64) -> Request {
        self.request(body, now + self.tolerance_s as f64 + KIT_SKEW_MARGIN_S, now)
    }

    /// The handshake request: for a signed handshake, with a good or a bad signature; for an
    /// unauthenticated one the flag does not matter (it carries no signature).
    pub fn handshake(&self, good_signature: bool, now: f64) -> Option<Request> {
        match self.flags.handshake {
            Handshake::None => None,
            Handshake::Unauthenticated => Some(self.base("HEAD", b"", now)),
            Handshake::Signed => {
                let body = match self.source.declared().kind {
                    "slack" => json!({"token": "kit", "challenge": KIT_SLACK_CHALLENGE,
                                      "type": "url_verification"}),
                    _ => {
                        json!({"event": "endpoint.url_validation", "event_ts": (now as i64) * 1000,
                                "payload": {"plainToken": "kitPlainToken123"}})
                    }
                }
                .to_string()
                .into_bytes();
                Some(if good_signature {
                    self.signed(&body, now)
                } else {
                    self.wrong_secret(&body, now)
                })
            }
        }
    }
}

/// The template configurations the kit covers: one per scheme, plus the query-token and
/// HEAD-handshake variants.
pub const TEMPLATE_KITS: &[(&str, &str)] = &[
    (
        "tpl-hex",
        r#"scheme = "hmac-sha256-hex"
header = "X-Signature"
prefix = "sha256="
key = ["payload.repository.full_name", "header.X-Event"]
dedup = "header.X-Delivery-Id"
ignore = ["header.X-Event=ping"]
event_type = "header.X-Event"
attrs = { event_type = "header.X-Event", repo = "payload.repository.full_name" }"#,
    ),
    (
        "tpl-b64",
        "scheme = \"hmac-sha256-base64\"\nheader = \"X-Signature\"\nkey = \"payload.id\"\ndedup = \"payload.id\"",
    ),
    (
        "tpl-sha1-url",
        "scheme = \"hmac-sha1-base64-url\"\nheader = \"X-Trello-Webhook\"\ncallback_url = \"https://hooks.example.org/hooks/tpl\"\nhead_handshake = true\nkey = \"payload.id\"\ndedup = \"payload.id\"",
    ),
    (
        "tpl-sha1-url-form",
        r#"scheme = "hmac-sha1-base64-url-form"
header = "X-Twilio-Signature"
callback_url = "https://hooks.example.org/hooks/tpl-sha1-url-form?kit=1"
key = ["payload.To", "payload.From"]
dedup = "payload.MessageSid"
event_type = "payload.SmsStatus"
attrs = { event_type = "payload.SmsStatus" }"#,
    ),
    (
        "tpl-sha1-url-json",
        r#"scheme = "hmac-sha1-base64-url-json"
header = "X-Twilio-Signature"
callback_url = "https://hooks.example.org/hooks/tpl-sha1-url-json?kit=1"
key = "payload.id"
dedup = "payload.id"
event_type = "payload.type"
attrs = { event_type = "payload.type" }"#,
    ),
    (
        "tpl-sw",
        "scheme = \"standard-webhooks\"\nkey = \"{payload.type}:{payload.id}\"\ndedup = \"header.webhook-id\"\nevent_type = \"payload.type\"",
    ),
    (
        "tpl-tv1",
        "scheme = \"timestamped\"\nheader = \"X-Timestamped-Signature\"\nkey = \"all\"\ndedup = \"body_sha256\"",
    ),
    (
        "tpl-tv1-wide",
        "scheme = \"timestamped\"\nheader = \"X-Timestamped-Signature\"\ntolerance_s = 900\nkey = \"all\"\ndedup = \"body_sha256\"",
    ),
    (
        "tpl-token-header",
        "scheme = \"static-token\"\nheader = \"Authorization\"\nprefix = \"Bearer \"\nkey = \"payload.id\"\ndedup = \"payload.id\"",
    ),
    (
        "tpl-token-param",
        "scheme = \"static-token\"\nparam = \"token\"\nkey = \"payload.id\"\ndedup = \"payload.id\"\nsender_retries = true",
    ),
];

/// Template kits whose one secret is a `whpk_` public key (Standard Webhooks v1a).
pub const TEMPLATE_V1A_KITS: &[(&str, &str)] = &[(
    "tpl-sw-v1a",
    "scheme = \"standard-webhooks\"\nkey = \"payload.id\"\ndedup = \"header.webhook-id\"\nevent_type = \"payload.type\"",
)];

/// THE list: every built-in type (and the v1a-only standard-webhooks configuration) and
/// every template kit. A new source joins the matrix by being added here (and a test fails
/// while a `KINDS` entry has no kit).
pub fn all_kits(secret: &[u8]) -> Result<Vec<Kit>, SourceConfigError> {
    let mut kits = Vec::new();
    for kind in KINDS.iter().filter(|k| **k != "template") {
        kits.push(Kit::builtin(kind, secret)?);
    }
    kits.push(Kit::standard_webhooks_v1a(secret)?);
    for (label, options) in TEMPLATE_KITS {
        kits.push(Kit::template(label, options, secret)?);
    }
    for (label, options) in TEMPLATE_V1A_KITS {
        kits.push(Kit::template_v1a(label, options, secret)?);
    }
    Ok(kits)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::SourceError;
    use crate::sources::flow::RefusingSecrets;

    const SENTINEL: &str = "SENTINEL-7f3a9c";

    fn secret() -> Vec<u8> {
        format!("kit-secret-{SENTINEL}").into_bytes()
    }

    fn sentinel_body(kit: &Kit) -> Vec<u8> {
        let mut v: Value = serde_json::from_slice(&kit.sample_body).unwrap_or_else(|_| json!({}));
        if let Value::Object(m) = &mut v {
            m.insert("note".into(), Value::String(format!("body-{SENTINEL}")));
        }
        v.to_string().into_bytes()
    }

    /// key, dedup id, event type, attrs.
    type Classified = (String, Option<String>, String, BTreeMap<String, String>);

    /// Runs the post-verify calls the way the intake does.
    fn classify(kit: &Kit, req: &Request) -> Result<Classified, SourceError> {
        let s = &kit.source;
        let p = s.payload(req)?;
        Ok((
            s.key(&p, req)?,
            s.dedup_id(&p, req)?,
            s.event_type(&p, req)?,
            s.attrs(&p, req)?,
        ))
    }

    #[test]
    fn every_kind_has_a_kit() {
        let kits = all_kits(&secret()).expect("kits build");
        for kind in KINDS {
            assert!(
                kits.iter().any(|k| k.source.declared().kind == *kind),
                "no kit for {kind}"
            );
        }
        assert!(!kit_pkcs8().is_empty());
    }

    #[test]
    fn matrix() {
        let now = KIT_NOW;
        for kit in all_kits(&secret()).expect("kits build") {
            let l = kit.label.as_str();
            let s = &kit.source;
            let body = kit.sample_body.clone();
            let ok = |r: &Request| {
                s.verify(r, &kit.secrets)
                    .unwrap_or_else(|e| panic!("{l}: verify error {e}"))
            };

            // signed -> verified, classified, not ignored, not a handshake
            let signed = kit.signed(&body, now);
            assert!(ok(&signed), "{l}: signed request refused");
            assert_eq!(s.ignore(&signed).expect("ignore"), None, "{l}");
            if !s.declared().challenge_unauthenticated {
                assert_eq!(
                    s.challenge(&signed, &kit.secrets).expect("challenge"),
                    None,
                    "{l}"
                );
            }
            let (key, dedup, _event, attrs) =
                classify(&kit, &signed).unwrap_or_else(|e| panic!("{l}: {e}"));
            assert!(!key.is_empty(), "{l}: empty key");
            assert_eq!(dedup.is_some(), kit.flags.dedups, "{l}: dedup presence");
            if s.declared().kind != "template" {
                assert!(
                    attrs.contains_key("event_type"),
                    "{l}: built-ins expose event_type in attrs"
                );
                assert!(
                    s.declared().action.clone().is_some(),
                    "{l}: built-ins have an action"
                );
            }

            // duplicate -> same dedup id
            let again = kit.signed(&body, now);
            assert_eq!(
                classify(&kit, &again).expect("classify").1,
                dedup,
                "{l}: duplicate"
            );

            // rotation: the signing secret as the second candidate still verifies
            let rotated = {
                let mut m = MapSecrets::new();
                // Every secret the kit holds (an AnyOne source's kit may hold one of them).
                for name in s.declared().secrets {
                    let Ok(values) = kit.secrets.candidates(name) else {
                        assert_eq!(
                            s.declared().secrets_needed,
                            crate::sources::SecretsNeeded::AnyOne,
                            "{l}: the kit holds every secret its source needs"
                        );
                        continue;
                    };
                    m = m.with(name, b"newer-secret");
                    for v in values {
                        m = m.with(name, &v);
                    }
                }
                m
            };
            assert!(
                s.verify(&signed, &rotated).expect("verify"),
                "{l}: rotation"
            );

            // unsigned, wrong secret -> refused
            assert!(!ok(&kit.unsigned(&body, now)), "{l}: unsigned accepted");
            assert!(
                !ok(&kit.wrong_secret(&body, now)),
                "{l}: wrong secret accepted"
            );
            // tampered -> refused where the body is signed
            if kit.flags.body_signed {
                assert!(!ok(&kit.tampered(&body, now)), "{l}: tampered accepted");
            }
            // stale and future -> refused; the window's edges are accepted
            if kit.flags.has_timestamp {
                assert!(!ok(&kit.stale(&body, now)), "{l}: stale accepted");
                assert!(!ok(&kit.future(&body, now)), "{l}: future accepted");
                let tol = kit.tolerance_s as f64;
                assert!(
                    ok(&kit.request(&body, now - tol, now)),
                    "{l}: edge (past) refused"
                );
                assert!(
                    ok(&kit.request(&body, now + tol, now)),
                    "{l}: edge (future) refused"
                );
            }

            // handshakes
            assert_eq!(
                s.declared().challenge_unauthenticated,
                kit.flags.handshake == Handshake::Unauthenticated,
                "{l}"
            );
            match kit.flags.handshake {
                Handshake::None => {}
                Handshake::Signed => {
                    let good = kit.handshake(true, now).expect("handshake");
                    assert!(ok(&good), "{l}: good handshake refused");
                    let answer = s
                        .challenge(&good, &kit.secrets)
                        .expect("challenge")
                        .expect("answered");
                    assert_eq!(answer.status, 200);
                    let bad = kit.handshake(false, now).expect("handshake");
                    assert!(
                        !ok(&bad),
                        "{l}: bad-signature handshake verified (would be answered)"
                    );
                    // Even called out of order, no answer is derived for a bad signature.
                    let answered = matches!(s.challenge(&bad, &kit.secrets), Ok(Some(_)));
                    assert!(!answered, "{l}: bad-signature handshake answered");
                }
                Handshake::Unauthenticated => {
                    let head = kit.handshake(true, now).expect("handshake");
                    let refusing = RefusingSecrets::new();
                    let answer = s
                        .challenge(&head, &refusing)
                        .expect("challenge")
                        .expect("answered");
                    assert_eq!(answer, crate::sources::Response::empty_ok(), "{l}");
                    assert!(
                        !refusing.touched(),
                        "{l}: unauthenticated handshake read a secret"
                    );
                    // A normal POST is not answered, and reads no secret either.
                    assert_eq!(
                        s.challenge(&signed, &refusing).expect("challenge"),
                        None,
                        "{l}"
                    );
                    assert!(!refusing.touched(), "{l}");
                    assert!(!ok(&head), "{l}: HEAD verified");
                }
            }

            // auth headers are never kept
            for a in &s.declared().auth_headers {
                assert!(
                    !s.declared()
                        .keep_headers
                        .iter()
                        .any(|k| k.eq_ignore_ascii_case(a)),
                    "{l}: keeps {a}"
                );
            }
        }
    }

    #[test]
    fn no_sentinel_in_any_debug_or_error() {
        let now = KIT_NOW;
        let mut seen = Vec::new();
        for kit in all_kits(&secret()).expect("kits build") {
            let s = &kit.source;
            let body = sentinel_body(&kit);
            let reqs = [
                kit.signed(&body, now),
                kit.unsigned(&body, now),
                kit.wrong_secret(&body, now),
                kit.tampered(&body, now),
                kit.stale(&body, now),
            ];
            for r in &reqs {
                seen.push(format!("{r:?}"));
                if let Err(e) = s.verify(r, &kit.secrets) {
                    seen.push(format!("{e} {e:?}"));
                }
            }
            seen.push(format!("{:?}", kit.secrets));
            // Missing secrets: the error names the secret, not a value.
            if let Err(e) = s.verify(&reqs[0], &MapSecrets::new()) {
                assert_eq!(e.class(), "SecretError");
                seen.push(format!("{e} {e:?}"));
            }
            // A body that is not JSON, and JSON without the fields the key needs.
            let mut bad = kit.signed(format!("not json {SENTINEL}").as_bytes(), now);
            seen.push(format!("{bad:?}"));
            if let Err(e) = classify(&kit, &bad) {
                seen.push(format!("{e} {e:?} {}", e.class()));
            }
            bad.body = json!({"unrelated": SENTINEL}).to_string().into_bytes();
            if let Err(e) = classify(&kit, &bad) {
                seen.push(format!("{e} {e:?} {}", e.class()));
            }
            bad.body = json!({"repository": {"full_name": {"x": SENTINEL}}, "id": [SENTINEL]})
                .to_string()
                .into_bytes();
            if let Err(e) = classify(&kit, &bad) {
                seen.push(format!("{e} {e:?} {}", e.class()));
            }
            if let Some(h) = kit.handshake(true, now)
                && let Ok(Some(resp)) = s.challenge(&h, &kit.secrets)
            {
                seen.push(format!("{resp:?}"));
            }
        }
        assert!(seen.len() > 50);
        for line in &seen {
            assert!(!line.contains(SENTINEL), "sentinel leaked: {line}");
        }
    }

    #[test]
    fn zoom_handshake_answer_is_hmac_of_plain_token() {
        let kit = Kit::builtin("zoom", b"zoom-secret").expect("kit");
        let req = kit.handshake(true, KIT_NOW).expect("handshake");
        let resp = kit
            .source
            .challenge(&req, &kit.secrets)
            .expect("challenge")
            .expect("answered");
        let v: Value = serde_json::from_slice(&resp.body).expect("json");
        let want = verify::mac_hex(MacAlg::Sha256, b"zoom-secret", &[b"kitPlainToken123"]);
        assert_eq!(v["plainToken"], "kitPlainToken123");
        assert_eq!(v["encryptedToken"].as_str(), Some(want.as_str()));
    }
}
