//! The Google Calendar push source (watch channels).
//!
//! Owns: the channel token (`X-Goog-Channel-Token`, set at watch time and echoed verbatim)
//! compared in constant time; the `sync` message every new channel sends first, ignored;
//! dedup on channel id + `X-Goog-Message-Number` (numbers are per channel); and a payload
//! built from the headers, since Google sends an empty body.
//!
//! Must not: read the body (it is empty and not covered by anything), or keep the token
//! header. The token is a shared value, not a signature: `body_signed = false` in the kit.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::opts::Opts;
use super::verify;
use super::{
    Declared, Request, SecretSource, Source, SourceConfigError, SourceError, names, need_candidates,
};

pub const TOKEN_HEADER: &str = "X-Goog-Channel-Token";
pub const CHANNEL_HEADER: &str = "X-Goog-Channel-ID";
pub const NUMBER_HEADER: &str = "X-Goog-Message-Number";
pub const STATE_HEADER: &str = "X-Goog-Resource-State";
pub const SECRET: &str = "channel_token";

/// Headers that make up the payload, with their payload member names.
const PAYLOAD_HEADERS: &[(&str, &str)] = &[
    (CHANNEL_HEADER, "channel_id"),
    ("X-Goog-Channel-Expiration", "channel_expiration"),
    (NUMBER_HEADER, "message_number"),
    ("X-Goog-Resource-ID", "resource_id"),
    (STATE_HEADER, "resource_state"),
    ("X-Goog-Resource-URI", "resource_uri"),
    ("X-Goog-Changed", "changed"),
];

pub struct Calendar {
    declared: Declared,
}

impl Calendar {
    pub fn build(name: &str, o: Opts<'_>) -> Result<Self, SourceConfigError> {
        o.finish()?;
        Ok(Calendar {
            declared: Declared {
                secrets: &[SECRET],
                auth_headers: names(&[TOKEN_HEADER]),
                keep_headers: names(&[
                    CHANNEL_HEADER,
                    NUMBER_HEADER,
                    STATE_HEADER,
                    "X-Goog-Resource-ID",
                ]),
                span: "calendar",
                sender_retries: true,
                ..Declared::builtin(name, "calendar")
            },
        })
    }
}

fn field<'a>(payload: &'a Value, name: &str) -> Option<&'a str> {
    payload
        .get(name)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

impl Source for Calendar {
    fn declared(&self) -> &Declared {
        &self.declared
    }
    fn verify(&self, req: &Request, secrets: &dyn SecretSource) -> Result<bool, SourceError> {
        let Some(presented) = req.header(TOKEN_HEADER) else {
            return Ok(false);
        };
        Ok(verify::static_token(
            presented,
            &need_candidates(secrets, SECRET)?,
        ))
    }

    fn ignore(&self, req: &Request) -> Result<Option<String>, SourceError> {
        Ok((req.header(STATE_HEADER) == Some("sync")).then(|| "sync".to_string()))
    }

    fn payload(&self, req: &Request) -> Result<Value, SourceError> {
        let mut m = Map::new();
        for (header, member) in PAYLOAD_HEADERS {
            if let Some(v) = req.header(header) {
                m.insert(member.to_string(), Value::String(v.to_string()));
            }
        }
        Ok(Value::Object(m))
    }

    fn key(&self, payload: &Value, _req: &Request) -> Result<String, SourceError> {
        field(payload, "channel_id")
            .map(str::to_string)
            .ok_or(SourceError::MissingHeader {
                header: CHANNEL_HEADER.to_string(),
            })
    }

    fn dedup_id(&self, payload: &Value, _req: &Request) -> Result<Option<String>, SourceError> {
        Ok(
            match (
                field(payload, "channel_id"),
                field(payload, "message_number"),
            ) {
                (Some(c), Some(n)) => Some(format!("{c}:{n}")),
                _ => None,
            },
        )
    }

    fn event_type(&self, payload: &Value, _req: &Request) -> Result<String, SourceError> {
        Ok(field(payload, "resource_state")
            .unwrap_or_default()
            .to_string())
    }

    fn attrs(
        &self,
        payload: &Value,
        _req: &Request,
    ) -> Result<BTreeMap<String, String>, SourceError> {
        let mut a = BTreeMap::from([(
            "event_type".to_string(),
            field(payload, "resource_state")
                .unwrap_or_default()
                .to_string(),
        )]);
        if let Some(c) = field(payload, "channel_id") {
            a.insert("channel".to_string(), c.to_string());
        }
        Ok(a)
    }
}
