//! The GitHub repository-webhook source (spec section 14.1's example, made real).
//!
//! Owns: `X-Hub-Signature-256` verification (`sha256=` + hex HMAC-SHA256 of the raw body),
//! `ping` as an ignore case (it is signed and verified like any event, then acked, spec
//! section 10), dedup on `X-GitHub-Delivery`, and the coalesce key `<repo>:<class>` where the
//! class folds CI events into `ci` and pull-request events into `pr` so one push's burst of
//! checks becomes one batch. Must not: answer anything before verify (GitHub has no
//! handshake) or fall back to the legacy SHA-1 header (weaker, and every hook sends both).
//!
//! A hook whose content type is `form` sends `application/x-www-form-urlencoded` with the
//! JSON in the `payload` field: the payload is read from there (the signature still covers
//! the raw form bytes).
//!
//! GitHub does not retry a failed delivery (`sender_retries = false`): the spec's sweep
//! redelivers, and quarantine (never a 5xx) protects what arrives.

use std::collections::BTreeMap;

use serde_json::Value;

use super::body;
use super::opts::Opts;
use super::verify::{self, MacAlg};
use super::{
    Declared, Request, SecretSource, Source, SourceConfigError, SourceError, default_payload,
    names, need_candidates,
};

pub const SIGNATURE_HEADER: &str = "X-Hub-Signature-256";
pub const EVENT_HEADER: &str = "X-GitHub-Event";
pub const DELIVERY_HEADER: &str = "X-GitHub-Delivery";
pub const SECRET: &str = "secret";
/// The form field holding the JSON of a `form` hook.
pub const FORM_FIELD: &str = "payload";

/// Events that belong to a CI run of a commit.
const CI_EVENTS: &[&str] = &[
    "check_suite",
    "check_run",
    "workflow_run",
    "workflow_job",
    "status",
];

pub struct GitHub {
    declared: Declared,
}

impl GitHub {
    pub fn build(name: &str, o: Opts<'_>) -> Result<Self, SourceConfigError> {
        o.finish()?;
        Ok(GitHub {
            declared: Declared {
                secrets: &[SECRET],
                // The legacy SHA-1 header is derived from the same secret: never stored either.
                auth_headers: names(&[SIGNATURE_HEADER, "X-Hub-Signature"]),
                keep_headers: names(&[EVENT_HEADER, DELIVERY_HEADER]),
                span: "burst",
                ..Declared::builtin(name, "github")
            },
        })
    }
}

/// `ci`, `pr`, or the event name itself.
pub fn classify(event: &str, payload: &Value) -> String {
    if CI_EVENTS.contains(&event) {
        return "ci".to_string();
    }
    if event.starts_with("pull_request") {
        return "pr".to_string();
    }
    // A comment on a pull request arrives as issue_comment with issue.pull_request set.
    if event == "issue_comment"
        && payload
            .pointer("/issue/pull_request")
            .is_some_and(|v| !v.is_null())
    {
        return "pr".to_string();
    }
    event.to_string()
}

/// The repository's full name; org-level events without a repository fall back to the
/// organization login so they still group sensibly.
fn repo(payload: &Value) -> Result<String, SourceError> {
    payload
        .pointer("/repository/full_name")
        .and_then(Value::as_str)
        .or_else(|| {
            payload
                .pointer("/organization/login")
                .and_then(Value::as_str)
        })
        .map(str::to_string)
        .ok_or(SourceError::MissingField {
            field: "repository.full_name".to_string(),
        })
}

fn event(req: &Request) -> Result<&str, SourceError> {
    req.header(EVENT_HEADER)
        .filter(|e| !e.is_empty())
        .ok_or(SourceError::MissingHeader {
            header: EVENT_HEADER.to_string(),
        })
}

impl Source for GitHub {
    fn declared(&self) -> &Declared {
        &self.declared
    }

    fn payload_is_body(&self, req: &Request) -> bool {
        !body::is_form(req) && super::body_is_payload(req)
    }

    fn verify(&self, req: &Request, secrets: &dyn SecretSource) -> Result<bool, SourceError> {
        let Some(presented) = req.header(SIGNATURE_HEADER) else {
            return Ok(false);
        };
        let candidates = need_candidates(secrets, SECRET)?;
        Ok(verify::hmac_prefixed(
            presented,
            "sha256=",
            &candidates,
            MacAlg::Sha256,
            &[&req.body],
        ))
    }

    fn ignore(&self, req: &Request) -> Result<Option<String>, SourceError> {
        Ok((req.header(EVENT_HEADER) == Some("ping")).then(|| "ping".to_string()))
    }

    fn payload(&self, req: &Request) -> Result<Value, SourceError> {
        if body::is_form(req) {
            body::form_json_field(&req.body, FORM_FIELD)
        } else {
            default_payload(req)
        }
    }

    fn key(&self, payload: &Value, req: &Request) -> Result<String, SourceError> {
        Ok(format!(
            "{}:{}",
            repo(payload)?,
            classify(event(req)?, payload)
        ))
    }

    fn dedup_id(&self, _payload: &Value, req: &Request) -> Result<Option<String>, SourceError> {
        Ok(req
            .header(DELIVERY_HEADER)
            .filter(|d| !d.is_empty())
            .map(str::to_string))
    }

    fn event_type(&self, _payload: &Value, req: &Request) -> Result<String, SourceError> {
        Ok(event(req)?.to_string())
    }

    fn attrs(
        &self,
        payload: &Value,
        req: &Request,
    ) -> Result<BTreeMap<String, String>, SourceError> {
        let event = event(req)?;
        Ok(BTreeMap::from([
            ("repo".to_string(), repo(payload)?),
            ("class".to_string(), classify(event, payload)),
            ("event_type".to_string(), event.to_string()),
        ]))
    }
}
