//! The Zoom webhook source.
//!
//! Owns: the v0 signature (`x-zm-signature: v0=<hex HMAC-SHA256("v0:<ts>:<body>")>` with
//! `x-zm-request-timestamp`, two-sided 300 s window), the `endpoint.url_validation`
//! handshake, dedup on `event_ts` + object id, and the key per meeting object.
//!
//! Must not: answer the url_validation handshake before verify. Its answer is
//! HMAC-SHA256(secret, plainToken) with an attacker-chosen plainToken and the same secret
//! that signs events, so an unauthenticated answer would be a signing oracle (spec section
//! 10). `challenge_unauthenticated` is therefore false and `challenge` runs only after
//! `verify` succeeded; it also signs with the very candidate that verified the request.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::opts::Opts;
use super::verify::{self, MacAlg, TOLERANCE_S_DEFAULT, TimestampedForm};
use super::{
    Declared, Request, Response, SecretSource, Source, SourceConfigError, SourceError, names,
    need_candidates,
};

pub const SIGNATURE_HEADER: &str = "x-zm-signature";
pub const TIMESTAMP_HEADER: &str = "x-zm-request-timestamp";
pub const SECRET: &str = "webhook_secret";
pub const VALIDATION_EVENT: &str = "endpoint.url_validation";

/// Longest plainToken we answer; Zoom's are 22 characters. Bounds the work and the answer.
pub const PLAIN_TOKEN_BYTES_MAX: usize = 256;

pub struct Zoom {
    declared: Declared,
}

impl Zoom {
    pub fn build(name: &str, o: Opts<'_>) -> Result<Self, SourceConfigError> {
        o.finish()?;
        Ok(Zoom {
            declared: Declared {
                secrets: &[SECRET],
                auth_headers: names(&[SIGNATURE_HEADER]),
                keep_headers: names(&[TIMESTAMP_HEADER]),
                span: "meeting",
                sender_retries: true,
                ..Declared::builtin(name, "zoom")
            },
        })
    }
}

fn verifies(req: &Request, candidates: &[Vec<u8>]) -> bool {
    let Some(sig) = req.header(SIGNATURE_HEADER) else {
        return false;
    };
    verify::timestamped(
        TimestampedForm::ZoomV0,
        sig,
        req.header(TIMESTAMP_HEADER),
        candidates,
        &req.body,
        req.now,
        TOLERANCE_S_DEFAULT,
    )
}

fn event_name(payload: &Value) -> Result<String, SourceError> {
    payload
        .get("event")
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or(SourceError::MissingField {
            field: "event".to_string(),
        })
}

/// The meeting (or webinar, recording, …) object's id; Zoom puts it at payload.object.
fn object_id(payload: &Value) -> Option<String> {
    let obj = payload.pointer("/payload/object")?;
    ["id", "uuid"].iter().find_map(|k| match obj.get(k)? {
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    })
}

impl Source for Zoom {
    fn declared(&self) -> &Declared {
        &self.declared
    }

    fn payload_is_body(&self, req: &Request) -> bool {
        super::body_is_payload(req)
    }

    fn verify(&self, req: &Request, secrets: &dyn SecretSource) -> Result<bool, SourceError> {
        if req.header(SIGNATURE_HEADER).is_none() {
            return Ok(false);
        }
        Ok(verifies(req, &need_candidates(secrets, SECRET)?))
    }

    fn challenge(
        &self,
        req: &Request,
        secrets: &dyn SecretSource,
    ) -> Result<Option<Response>, SourceError> {
        let payload = req.json()?;
        if payload.get("event").and_then(Value::as_str) != Some(VALIDATION_EVENT) {
            return Ok(None);
        }
        let plain = payload
            .pointer("/payload/plainToken")
            .and_then(Value::as_str)
            .filter(|p| !p.is_empty() && p.len() <= PLAIN_TOKEN_BYTES_MAX)
            .ok_or(SourceError::BadChallenge)?;
        // Answer with the candidate that signed this request: during a rotation Zoom holds
        // exactly one of them, and only that one yields the answer it expects.
        let candidates = need_candidates(secrets, SECRET)?;
        let Some(key) = candidates
            .iter()
            .find(|k| !k.is_empty() && verifies(req, std::slice::from_ref(*k)))
        else {
            // verify() passed but no single candidate does: the secrets changed in between.
            return Err(SourceError::BadChallenge);
        };
        let encrypted = verify::mac_hex(MacAlg::Sha256, key, &[plain.as_bytes()]);
        Ok(Some(Response::json(
            &json!({"plainToken": plain, "encryptedToken": encrypted}),
        )))
    }

    fn key(&self, payload: &Value, _req: &Request) -> Result<String, SourceError> {
        Ok(match object_id(payload) {
            Some(id) => format!("object:{id}"),
            None => event_name(payload)?,
        })
    }

    fn dedup_id(&self, payload: &Value, _req: &Request) -> Result<Option<String>, SourceError> {
        let Some(ts) = payload.get("event_ts").and_then(|v| {
            super::select::scalar(v, || "event_ts".to_string())
                .ok()
                .flatten()
        }) else {
            return Ok(None);
        };
        // event_ts alone collides across meetings ending in the same millisecond.
        Ok(Some(format!(
            "{ts}:{}",
            object_id(payload).unwrap_or_default()
        )))
    }

    fn event_type(&self, payload: &Value, _req: &Request) -> Result<String, SourceError> {
        event_name(payload)
    }

    fn attrs(
        &self,
        payload: &Value,
        _req: &Request,
    ) -> Result<BTreeMap<String, String>, SourceError> {
        let mut a = BTreeMap::from([("event_type".to_string(), event_name(payload)?)]);
        if let Some(acct) = payload
            .pointer("/payload/account_id")
            .and_then(Value::as_str)
        {
            a.insert("account".to_string(), acct.to_string());
        }
        Ok(a)
    }
}
