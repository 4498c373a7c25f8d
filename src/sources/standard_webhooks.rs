//! The generic Standard Webhooks source (standardwebhooks.com v1, symmetric).
//!
//! Owns: verification of `webhook-id`, `webhook-timestamp` and `webhook-signature`
//! (HMAC-SHA256 over `id.timestamp.body`, base64, several space-separated signatures, a
//! `whsec_` base64 or raw secret, two-sided 300 s window), dedup on `webhook-id` (the spec
//! makes it the idempotency key), event type from the payload's `type`, and optional `key`
//! and `event_type` selectors (see `select`) for senders whose grouping is known.
//!
//! Must not: accept the asymmetric `v1a` signatures (no public-key config exists yet; they
//! are skipped, so a sender that only sends `v1a` is refused, not trusted).

use std::collections::BTreeMap;

use serde_json::Value;

use super::opts::Opts;
use super::select::Expr;
use super::verify::{self, TOLERANCE_S_DEFAULT};
use super::{
    Declared, Request, SecretSource, Source, SourceConfigError, SourceError, names, need_candidates,
};

pub const ID_HEADER: &str = "webhook-id";
pub const TIMESTAMP_HEADER: &str = "webhook-timestamp";
pub const SIGNATURE_HEADER: &str = "webhook-signature";
pub const SECRET: &str = "secret";

pub struct StandardWebhooks {
    declared: Declared,
    key: Option<Expr>,
    event_type: Option<Expr>,
}

impl StandardWebhooks {
    pub fn build(name: &str, mut o: Opts<'_>) -> Result<Self, SourceConfigError> {
        let key = o
            .string("key", "\"payload.data.id\"")?
            .map(|k| Expr::parse("key", &k))
            .transpose()?;
        let event_type = o
            .string("event_type", "\"payload.type\"")?
            .map(|k| Expr::parse("event_type", &k))
            .transpose()?;
        o.finish()?;
        Ok(StandardWebhooks {
            declared: Declared {
                secrets: &[SECRET],
                auth_headers: names(&[SIGNATURE_HEADER]),
                keep_headers: names(&[ID_HEADER, TIMESTAMP_HEADER]),
                // A generic sender's burst pattern is unknown: the default span `immediate`
                // delivers at once unless config says more.
                // The Standard Webhooks spec asks senders to retry with backoff.
                sender_retries: true,
                ..Declared::builtin(name, "standard-webhooks")
            },
            key,
            event_type,
        })
    }
}

/// The scheme as a whole, shared with the template source.
pub(crate) fn verifies(req: &Request, candidates: &[Vec<u8>]) -> bool {
    let (Some(id), Some(ts), Some(sig)) = (
        req.header(ID_HEADER),
        req.header(TIMESTAMP_HEADER),
        req.header(SIGNATURE_HEADER),
    ) else {
        return false;
    };
    verify::standard_webhooks(
        id,
        ts,
        sig,
        candidates,
        &req.body,
        req.now,
        TOLERANCE_S_DEFAULT,
    )
}

impl Source for StandardWebhooks {
    fn declared(&self) -> &Declared {
        &self.declared
    }
    fn verify(&self, req: &Request, secrets: &dyn SecretSource) -> Result<bool, SourceError> {
        if req.header(SIGNATURE_HEADER).is_none() {
            return Ok(false);
        }
        Ok(verifies(req, &need_candidates(secrets, SECRET)?))
    }

    fn key(&self, payload: &Value, req: &Request) -> Result<String, SourceError> {
        match &self.key {
            Some(k) => k.eval_required(payload, req),
            // Without a key every event of the source shares one group.
            None => Ok(self.declared.name.clone()),
        }
    }

    fn dedup_id(&self, _payload: &Value, req: &Request) -> Result<Option<String>, SourceError> {
        Ok(req
            .header(ID_HEADER)
            .filter(|s| !s.is_empty())
            .map(str::to_string))
    }

    fn event_type(&self, payload: &Value, req: &Request) -> Result<String, SourceError> {
        match &self.event_type {
            Some(e) => Ok(e.eval(payload, req)?.unwrap_or_default()),
            None => Ok(payload
                .get("type")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()),
        }
    }

    fn attrs(
        &self,
        payload: &Value,
        req: &Request,
    ) -> Result<BTreeMap<String, String>, SourceError> {
        Ok(BTreeMap::from([(
            "event_type".to_string(),
            self.event_type(payload, req)?,
        )]))
    }
}
