//! The Kaneo source (self-hosted project management; its "generic webhook" integration).
//!
//! Scheme, chosen from Kaneo's sender (apps/api/src/plugins/generic-webhook/client.ts):
//! `X-Kaneo-Signature: <lowercase hex HMAC-SHA256(secret, raw body)>`, no timestamp, no
//! delivery id. That makes it replayable like GitHub's scheme; dedup limits the damage to
//! nothing inside the window when the payload carries an id (`id` or `eventId`, which newer
//! senders may add; today's body has none, so dedup is off and the processor must be
//! idempotent). The body is `{event, timestamp, project{id,…}, task{id,…}, actor, data}`;
//! events group per project.
//!
//! Must not: accept an unsigned delivery (Kaneo only signs when a secret is set: configure
//! one), or assume Kaneo retries (it does not; spec section 9's table).

use std::collections::BTreeMap;

use serde_json::Value;

use super::opts::Opts;
use super::verify::{self, MacAlg};
use super::{
    Declared, Request, SecretSource, Source, SourceConfigError, SourceError, names, need_candidates,
};

pub const SIGNATURE_HEADER: &str = "X-Kaneo-Signature";
pub const SECRET: &str = "secret";

pub struct Kaneo {
    declared: Declared,
}

impl Kaneo {
    pub fn build(name: &str, o: Opts<'_>) -> Result<Self, SourceConfigError> {
        o.finish()?;
        Ok(Kaneo {
            declared: Declared {
                secrets: &[SECRET],
                auth_headers: names(&[SIGNATURE_HEADER]),
                span: "mail",
                ..Declared::builtin(name, "kaneo")
            },
        })
    }
}

fn event(payload: &Value) -> String {
    payload
        .get("event")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

fn project(payload: &Value) -> Option<String> {
    payload
        .pointer("/project/id")
        .and_then(Value::as_str)
        .map(str::to_string)
}

impl Source for Kaneo {
    fn declared(&self) -> &Declared {
        &self.declared
    }

    fn payload_is_body(&self, req: &Request) -> bool {
        super::body_is_payload(req)
    }

    fn verify(&self, req: &Request, secrets: &dyn SecretSource) -> Result<bool, SourceError> {
        let Some(presented) = req.header(SIGNATURE_HEADER) else {
            return Ok(false);
        };
        Ok(verify::hmac_hex(
            presented,
            &need_candidates(secrets, SECRET)?,
            MacAlg::Sha256,
            &[&req.body],
        ))
    }

    fn key(&self, payload: &Value, _req: &Request) -> Result<String, SourceError> {
        project(payload).ok_or(SourceError::MissingField {
            field: "project.id".to_string(),
        })
    }

    fn dedup_id(&self, payload: &Value, _req: &Request) -> Result<Option<String>, SourceError> {
        Ok(["id", "eventId", "event_id"]
            .iter()
            .find_map(|k| match payload.get(k)? {
                Value::String(s) if !s.is_empty() => Some(s.clone()),
                Value::Number(n) => Some(n.to_string()),
                _ => None,
            }))
    }

    fn event_type(&self, payload: &Value, _req: &Request) -> Result<String, SourceError> {
        Ok(event(payload))
    }

    fn attrs(
        &self,
        payload: &Value,
        _req: &Request,
    ) -> Result<BTreeMap<String, String>, SourceError> {
        let mut a = BTreeMap::from([("event_type".to_string(), event(payload))]);
        if let Some(p) = project(payload) {
            a.insert("project".to_string(), p);
        }
        Ok(a)
    }
}
