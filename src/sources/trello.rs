//! The Trello webhook source.
//!
//! Owns: `X-Trello-Webhook` verification (base64 HMAC-SHA1 over the raw body followed by the
//! callback URL exactly as registered), the HEAD handshake Trello sends when a webhook is
//! created, dedup on the action id, and the key per watched model (board, card, …).
//!
//! The HEAD handshake carries no signature and no body and wants an empty 200, so it is the
//! one constant, unauthenticated answer in hookspool (`challenge_unauthenticated = true`):
//! `challenge` must never read a secret, and answers nothing but HEAD. Must not: derive the
//! callback URL from the request (the proxy rewrites paths; the signed URL is configuration).

use std::collections::BTreeMap;

use serde_json::Value;

use super::opts::{Opts, invalid};
use super::verify::{self, MacAlg};
use super::{
    Declared, Request, Response, SecretSource, Source, SourceConfigError, SourceError, names,
    need_candidates,
};

pub const SIGNATURE_HEADER: &str = "X-Trello-Webhook";
pub const SECRET: &str = "secret";

pub struct Trello {
    declared: Declared,
    callback_url: String,
}

impl Trello {
    pub fn build(name: &str, mut o: Opts<'_>) -> Result<Self, SourceConfigError> {
        let callback_url = callback_url(&mut o, "hmac-sha1-base64-url")?;
        o.finish()?;
        Ok(Trello {
            declared: Declared {
                secrets: &[SECRET],
                auth_headers: names(&[SIGNATURE_HEADER]),
                span: "mail",
                sender_retries: true,
                challenge_unauthenticated: true,
                ..Declared::builtin(name, "trello")
            },
            callback_url,
        })
    }
}

/// The required `callback_url` option (shared with the template's Trello-style scheme).
pub(crate) fn callback_url(o: &mut Opts<'_>, what: &str) -> Result<String, SourceConfigError> {
    let example = "\"https://hooks.example.org/hooks/trello\"";
    match o.string("callback_url", example)? {
        Some(u) if u.starts_with("https://") || u.starts_with("http://") => Ok(u),
        Some(_) => Err(invalid(
            "callback_url",
            format!(
                "must be the full URL registered with the sender; write callback_url = {example}"
            ),
        )),
        None => Err(invalid(
            "callback_url",
            format!(
                "required by {what} (the signature covers the URL exactly as registered); write callback_url = {example}"
            ),
        )),
    }
}

/// Trello's check shared with the template source.
pub(crate) fn verifies(
    req: &Request,
    header: &str,
    callback_url: &str,
    candidates: &[Vec<u8>],
) -> bool {
    match req.header(header) {
        Some(presented) => verify::hmac_b64(
            presented,
            candidates,
            MacAlg::Sha1,
            &[&req.body, callback_url.as_bytes()],
        ),
        None => false,
    }
}

/// The HEAD handshake answer: a constant, reading nothing.
pub(crate) fn head_answer(req: &Request) -> Option<Response> {
    req.method
        .eq_ignore_ascii_case("HEAD")
        .then(Response::empty_ok)
}

fn model_id(payload: &Value) -> Option<String> {
    payload
        .pointer("/model/id")
        .or_else(|| payload.pointer("/action/data/board/id"))
        .and_then(Value::as_str)
        .map(str::to_string)
}

fn action_type(payload: &Value) -> String {
    payload
        .pointer("/action/type")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

impl Source for Trello {
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
        Ok(verifies(
            req,
            SIGNATURE_HEADER,
            &self.callback_url,
            &need_candidates(secrets, SECRET)?,
        ))
    }

    fn challenge(
        &self,
        req: &Request,
        _secrets: &dyn SecretSource,
    ) -> Result<Option<Response>, SourceError> {
        Ok(head_answer(req))
    }

    fn key(&self, payload: &Value, _req: &Request) -> Result<String, SourceError> {
        model_id(payload).ok_or(SourceError::MissingField {
            field: "model.id".to_string(),
        })
    }

    fn dedup_id(&self, payload: &Value, _req: &Request) -> Result<Option<String>, SourceError> {
        Ok(payload
            .pointer("/action/id")
            .and_then(Value::as_str)
            .map(str::to_string))
    }

    fn event_type(&self, payload: &Value, _req: &Request) -> Result<String, SourceError> {
        Ok(action_type(payload))
    }

    fn attrs(
        &self,
        payload: &Value,
        _req: &Request,
    ) -> Result<BTreeMap<String, String>, SourceError> {
        let mut a = BTreeMap::from([("event_type".to_string(), action_type(payload))]);
        if let Some(m) = model_id(payload) {
            a.insert("model".to_string(), m);
        }
        Ok(a)
    }
}
