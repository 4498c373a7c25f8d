//! The Slack source: the Events API, slash commands and interactivity of one Slack app.
//!
//! Owns: Slack's `v0` request signing (`X-Slack-Signature: v0=<hex HMAC-SHA256(signing
//! secret, "v0:<X-Slack-Request-Timestamp>:<body>")>`, two-sided 300 s window; the Zoom `v0`
//! form of `verify::timestamped` under Slack's header names), the Events API
//! `url_verification` handshake (answered `{"challenge": ...}`), and the three body shapes
//! Slack sends to a request URL:
//!
//! | shape | body | key | event_type | dedup id |
//! | --- | --- | --- | --- | --- |
//! | Events API callback | JSON envelope | `<team_id>[:<channel>]` | the inner `event.type` (the envelope's `type` when it is not `event_callback`, e.g. `app_rate_limited`) | `event_id` |
//! | slash command | form | `<team_id>:<channel_id>` | `slash_command` | `trigger_id` |
//! | interactivity | form, `payload=<JSON>` | `<team.id>[:<channel.id>]` | the payload's `type` (`block_actions`, `view_submission`, ...) | `trigger_id` |
//!
//! The channel of an event is `event.channel` (a string, or an object with `id`),
//! `event.item.channel` (reactions, pins) or `event.channel_id` (files); an event without one
//! is keyed by its team alone. `attrs` carry `event_type`, `team`, `channel` when there is
//! one, and a slash command's `command`. A retried event (`X-Slack-Retry-Num`, kept with
//! `X-Slack-Retry-Reason`) is the same event again: its `event_id` makes it a duplicate. A
//! verified `ssl_check=1` form (Slack probing a slash command's URL) is acknowledged and
//! ignored. The deprecated verification `token` field is dropped from the payload of every
//! shape, so no document delivers it.
//!
//! Must not: answer `url_verification` before verification (spec 10: `challenge` runs only
//! after `verify`, and checks the signature again itself, so even called out of order it
//! answers nothing unsigned), read the deprecated verification `token` field as a credential
//! (the signature is), or derive anything from the body before the signature held.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::body::{self, form_json_field, form_object};
use super::opts::Opts;
use super::verify::{self, TOLERANCE_S_DEFAULT, TimestampedForm};
use super::{
    Declared, Request, Response, SecretSource, Source, SourceConfigError, SourceError, names,
    need_candidates,
};

pub const SIGNATURE_HEADER: &str = "X-Slack-Signature";
pub const TIMESTAMP_HEADER: &str = "X-Slack-Request-Timestamp";
pub const RETRY_NUM_HEADER: &str = "X-Slack-Retry-Num";
pub const RETRY_REASON_HEADER: &str = "X-Slack-Retry-Reason";
pub const SECRET: &str = "signing_secret";
/// The Events API handshake's envelope type.
pub const URL_VERIFICATION: &str = "url_verification";
/// The event type of every slash command.
pub const SLASH_COMMAND: &str = "slash_command";
/// The form field that carries an interactivity payload.
pub const INTERACTIVITY_FIELD: &str = "payload";

/// Slack's deprecated verification token, a field of every body shape: a credential of the
/// app, never delivered (issue 29). The signature is what verifies a request.
pub const VERIFICATION_TOKEN_FIELD: &str = "token";

/// Longest `challenge` we echo; Slack's are about 50 characters. Bounds the answer.
pub const CHALLENGE_BYTES_MAX: usize = 256;

pub struct Slack {
    declared: Declared,
}

impl Slack {
    pub fn build(name: &str, o: Opts<'_>) -> Result<Self, SourceConfigError> {
        o.finish()?;
        Ok(Slack {
            declared: Declared {
                secrets: &[SECRET],
                auth_headers: names(&[SIGNATURE_HEADER]),
                keep_headers: names(&[TIMESTAMP_HEADER, RETRY_NUM_HEADER, RETRY_REASON_HEADER]),
                span: "mail",
                // The Events API retries three times when the answer is not a 2xx within
                // 3 s; slash commands and interactivity are not retried.
                sender_retries: true,
                ..Declared::builtin(name, "slack")
            },
        })
    }
}

/// Which of Slack's request kinds a (verified) request is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// An Events API JSON envelope (`event_callback`, `url_verification`, ...).
    Event,
    /// A slash command: a flat form.
    Command,
    /// An interactivity request: a form whose `payload` field is the JSON.
    Interaction,
}

fn shape(req: &Request) -> Shape {
    if !body::is_form(req) {
        Shape::Event
    } else if form_urlencoded::parse(&req.body).any(|(k, _)| k == INTERACTIVITY_FIELD) {
        Shape::Interaction
    } else {
        Shape::Command
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

/// A string member at `pointer`, when it is a non-empty string.
fn text(payload: &Value, pointer: &str) -> Option<String> {
    payload
        .pointer(pointer)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

fn required(payload: &Value, pointer: &str, field: &str) -> Result<String, SourceError> {
    text(payload, pointer).ok_or_else(|| SourceError::MissingField {
        field: field.to_string(),
    })
}

/// The team a request belongs to.
fn team(shape: Shape, payload: &Value) -> Result<String, SourceError> {
    match shape {
        Shape::Event => text(payload, "/team_id")
            .or_else(|| text(payload, "/context_team_id"))
            .ok_or_else(|| SourceError::MissingField {
                field: "team_id".to_string(),
            }),
        Shape::Command => required(payload, "/team_id", "team_id"),
        // An org-wide app's interaction may carry no workspace team; the user's is it then.
        Shape::Interaction => text(payload, "/team/id")
            .or_else(|| text(payload, "/user/team_id"))
            .ok_or_else(|| SourceError::MissingField {
                field: "team.id".to_string(),
            }),
    }
}

/// The channel a request is about, when it names one.
fn channel(shape: Shape, payload: &Value) -> Result<Option<String>, SourceError> {
    Ok(match shape {
        Shape::Event => [
            "/event/channel",
            "/event/channel/id",
            "/event/item/channel",
            "/event/channel_id",
        ]
        .iter()
        .find_map(|p| text(payload, p)),
        Shape::Command => Some(required(payload, "/channel_id", "channel_id")?),
        Shape::Interaction => {
            text(payload, "/channel/id").or_else(|| text(payload, "/container/channel_id"))
        }
    })
}

fn event_type_of(shape: Shape, payload: &Value) -> Result<String, SourceError> {
    match shape {
        Shape::Event => {
            let outer = required(payload, "/type", "type")?;
            if outer == "event_callback" {
                required(payload, "/event/type", "event.type")
            } else {
                Ok(outer)
            }
        }
        Shape::Command => Ok(SLASH_COMMAND.to_string()),
        Shape::Interaction => required(payload, "/type", "type"),
    }
}

impl Source for Slack {
    fn declared(&self) -> &Declared {
        &self.declared
    }

    fn payload_is_body(&self, req: &Request) -> bool {
        // An envelope with a `token` is stored without it, so it is not the body.
        matches!(shape(req), Shape::Event)
            && super::body_is_payload(req)
            && req
                .json()
                .is_ok_and(|v| v.get(VERIFICATION_TOKEN_FIELD).is_none())
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
        if shape(req) != Shape::Event {
            return Ok(None);
        }
        // A body that is not JSON is not a handshake; `payload` quarantines it next.
        let Ok(payload) = req.json() else {
            return Ok(None);
        };
        if payload.get("type").and_then(Value::as_str) != Some(URL_VERIFICATION) {
            return Ok(None);
        }
        // Runs after verify; checked again so that no answer ever leaves for an unsigned
        // request, whoever calls this.
        if !verifies(req, &need_candidates(secrets, SECRET)?) {
            return Err(SourceError::BadChallenge);
        }
        let challenge = payload
            .get("challenge")
            .and_then(Value::as_str)
            .filter(|c| !c.is_empty() && c.len() <= CHALLENGE_BYTES_MAX)
            .ok_or(SourceError::BadChallenge)?;
        Ok(Some(Response::json(&json!({ "challenge": challenge }))))
    }

    fn ignore(&self, req: &Request) -> Result<Option<String>, SourceError> {
        if shape(req) == Shape::Command
            && form_urlencoded::parse(&req.body).any(|(k, v)| k == "ssl_check" && v == "1")
        {
            return Ok(Some("ssl_check".to_string()));
        }
        Ok(None)
    }

    fn payload(&self, req: &Request) -> Result<Value, SourceError> {
        let mut payload = match shape(req) {
            Shape::Event => req.json(),
            Shape::Command => form_object(&req.body),
            Shape::Interaction => form_json_field(&req.body, INTERACTIVITY_FIELD),
        }?;
        if let Some(fields) = payload.as_object_mut() {
            fields.remove(VERIFICATION_TOKEN_FIELD);
        }
        Ok(payload)
    }

    fn key(&self, payload: &Value, req: &Request) -> Result<String, SourceError> {
        let shape = shape(req);
        let team = team(shape, payload)?;
        Ok(match channel(shape, payload)? {
            Some(c) => format!("{team}:{c}"),
            None => team,
        })
    }

    fn dedup_id(&self, payload: &Value, req: &Request) -> Result<Option<String>, SourceError> {
        Ok(match shape(req) {
            Shape::Event => text(payload, "/event_id"),
            Shape::Command | Shape::Interaction => text(payload, "/trigger_id"),
        })
    }

    fn event_type(&self, payload: &Value, req: &Request) -> Result<String, SourceError> {
        event_type_of(shape(req), payload)
    }

    fn attrs(
        &self,
        payload: &Value,
        req: &Request,
    ) -> Result<BTreeMap<String, String>, SourceError> {
        let shape = shape(req);
        let mut a = BTreeMap::from([
            ("event_type".to_string(), event_type_of(shape, payload)?),
            ("team".to_string(), team(shape, payload)?),
        ]);
        if let Some(c) = channel(shape, payload)? {
            a.insert("channel".to_string(), c);
        }
        if shape == Shape::Command {
            a.insert(
                "command".to_string(),
                required(payload, "/command", "command")?,
            );
        }
        Ok(a)
    }
}

#[cfg(test)]
mod tests {
    use super::super::body::FORM_MEDIA_TYPE;
    use super::super::verify::MacAlg;
    use super::super::{Accepted, Verdict, build, evaluate};
    use super::*;
    use crate::kit::signer::MapSecrets;
    use crate::sources::flow::RefusingSecrets;

    /// tests/vectors/slack (SOURCE.md there): Slack's signing walk-through.
    const VECTORS: &str = include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/vectors/slack/vectors.json"
    ));

    const SECRET_VALUE: &[u8] = b"kit-slack-signing-secret";

    fn slack() -> std::sync::Arc<dyn Source> {
        build("slack", "slack", &toml::Table::new()).expect("builds")
    }

    fn secrets() -> MapSecrets {
        MapSecrets::new().with(SECRET, SECRET_VALUE)
    }

    /// A request signed the way Slack signs, at `ts`, received at `now`.
    fn signed(content_type: &str, body: &str, ts: i64, now: f64) -> Request {
        let ts = ts.to_string();
        let sig = verify::mac_hex(
            MacAlg::Sha256,
            SECRET_VALUE,
            &[b"v0:", ts.as_bytes(), b":", body.as_bytes()],
        );
        Request::new("POST", "/hooks/slack", now)
            .with_header("Content-Type", content_type)
            .with_header(TIMESTAMP_HEADER, &ts)
            .with_header(SIGNATURE_HEADER, &format!("v0={sig}"))
            .with_body(body)
    }

    fn accepted(v: Verdict) -> Accepted {
        match v {
            Verdict::Accept(a) => a,
            other => panic!("expected accepted, got {other:?}"),
        }
    }

    #[test]
    fn slack_docs_vector_verifies_inside_its_window_and_is_a_slash_command() {
        let v: Value = serde_json::from_str(VECTORS).expect("json");
        let v = &v["vectors"][0];
        let ts = v["timestamp"].as_i64().expect("ts");
        let docs_secrets = MapSecrets::new().with(
            SECRET,
            v["signing_secret"].as_str().expect("secret").as_bytes(),
        );
        let req = |now: f64| {
            Request::new("POST", "/hooks/slack", now)
                .with_header("Content-Type", FORM_MEDIA_TYPE)
                .with_header(TIMESTAMP_HEADER, &ts.to_string())
                .with_header(
                    SIGNATURE_HEADER,
                    v["expected_signature"].as_str().expect("sig"),
                )
                .with_body(v["body"].as_str().expect("body"))
        };
        let s = slack();
        let at = ts as f64;
        let a = accepted(evaluate(s.as_ref(), &req(at), &docs_secrets));
        assert_eq!(a.key, "T1DC2JH3J:G8PSS9T3V");
        assert_eq!(a.event_type, SLASH_COMMAND);
        assert_eq!(a.attrs["command"], "/webhook-collect");
        assert_eq!(a.payload["user_name"], "roadrunner");
        // The window's edges hold; one second past them, stale or future-dated, is refused.
        for (now, ok) in [
            (at + 300.0, true),
            (at - 300.0, true),
            (at + 301.0, false),
            (at - 301.0, false),
        ] {
            let verdict = evaluate(s.as_ref(), &req(now), &docs_secrets);
            assert_eq!(matches!(verdict, Verdict::Accept(_)), ok, "at {now}");
            if !ok {
                assert!(matches!(verdict, Verdict::Unauthorized), "at {now}");
            }
        }
    }

    #[test]
    fn url_verification_is_answered_only_after_a_good_signature() {
        let body = r#"{"token":"t","challenge":"c0ffee-challenge","type":"url_verification"}"#;
        let s = slack();
        let good = signed("application/json", body, 1_700_000_000, 1_700_000_000.0);
        let Verdict::Answer(r) = evaluate(s.as_ref(), &good, &secrets()) else {
            panic!("a signed url_verification is answered");
        };
        assert_eq!(r.status, 200);
        let doc: Value = serde_json::from_slice(&r.body).expect("json answer");
        assert_eq!(doc, json!({"challenge": "c0ffee-challenge"}));

        let mut forged = good.clone();
        forged.remove_header(SIGNATURE_HEADER);
        forged = forged.with_header(SIGNATURE_HEADER, &format!("v0={}", "0".repeat(64)));
        assert!(matches!(
            evaluate(s.as_ref(), &forged, &secrets()),
            Verdict::Unauthorized
        ));
        // Even called out of order, an unsigned handshake gets no answer.
        assert!(!matches!(s.challenge(&forged, &secrets()), Ok(Some(_))));
        // And it is not answered before verification: the source does not declare it.
        assert!(!s.declared().challenge_unauthenticated);
        let refusing = RefusingSecrets::new();
        assert!(s.challenge(&good, &refusing).is_err());
    }

    #[test]
    fn event_callbacks_are_keyed_by_team_and_channel_and_deduped_by_event_id() {
        let s = slack();
        let at = 1_700_000_000;
        let mention = r#"{"team_id":"T1","type":"event_callback","event_id":"Ev1","event":{"type":"app_mention","channel":"C1","user":"U1","text":"hi","ts":"1.2"}}"#;
        let a = accepted(evaluate(
            s.as_ref(),
            &signed("application/json", mention, at, at as f64),
            &secrets(),
        ));
        assert_eq!(
            (a.key.as_str(), a.event_type.as_str(), a.dedup_id.as_deref()),
            ("T1:C1", "app_mention", Some("Ev1"))
        );
        assert_eq!(
            a.attrs,
            BTreeMap::from([
                ("event_type".into(), "app_mention".into()),
                ("team".into(), "T1".into()),
                ("channel".into(), "C1".into()),
            ])
        );
        // Reactions name their channel under item; channel_created as an object.
        let reaction = r#"{"team_id":"T1","type":"event_callback","event_id":"Ev2","event":{"type":"reaction_added","item":{"type":"message","channel":"C2","ts":"1.2"}}}"#;
        let created = r#"{"team_id":"T1","type":"event_callback","event_id":"Ev3","event":{"type":"channel_created","channel":{"id":"C3","name":"x"}}}"#;
        let team_only = r#"{"team_id":"T1","type":"event_callback","event_id":"Ev4","event":{"type":"team_join","user":{"id":"U9"}}}"#;
        let limited = r#"{"token":"t","team_id":"T1","minute_rate_limited":1518467820,"api_app_id":"A1","type":"app_rate_limited"}"#;
        for (body, key, event_type) in [
            (reaction, "T1:C2", "reaction_added"),
            (created, "T1:C3", "channel_created"),
            (team_only, "T1", "team_join"),
            (limited, "T1", "app_rate_limited"),
        ] {
            let a = accepted(evaluate(
                s.as_ref(),
                &signed("application/json", body, at, at as f64),
                &secrets(),
            ));
            assert_eq!((a.key.as_str(), a.event_type.as_str()), (key, event_type));
        }
    }

    /// Slack retries an event it got no 2xx for with X-Slack-Retry-Num: the same event_id,
    /// so the spool sees a duplicate rather than a second event.
    #[test]
    fn a_retried_event_keeps_its_event_id_and_the_retry_headers_are_kept() {
        let s = slack();
        let body = r#"{"team_id":"T1","type":"event_callback","event_id":"Ev1","event":{"type":"message","channel":"C1"}}"#;
        let first = signed("application/json", body, 1_700_000_000, 1_700_000_000.0);
        let retry = signed("application/json", body, 1_700_000_060, 1_700_000_060.0)
            .with_header(RETRY_NUM_HEADER, "1")
            .with_header(RETRY_REASON_HEADER, "http_timeout");
        let a = accepted(evaluate(s.as_ref(), &first, &secrets()));
        let b = accepted(evaluate(s.as_ref(), &retry, &secrets()));
        assert_eq!(a.dedup_id, b.dedup_id);
        assert_eq!((a.key, a.event_type), (b.key, b.event_type));
        let keep = &s.declared().keep_headers;
        assert!(keep.iter().any(|h| h == RETRY_NUM_HEADER));
        assert!(keep.iter().any(|h| h == RETRY_REASON_HEADER));
        let auth = &s.declared().auth_headers;
        assert!(!keep.iter().any(|h| auth.contains(h)));
    }

    #[test]
    fn interactivity_reads_the_payload_field() {
        let s = slack();
        let inner = json!({"type": "block_actions", "team": {"id": "T1", "domain": "d"},
            "user": {"id": "U1", "team_id": "T1"}, "channel": {"id": "C1", "name": "n"},
            "trigger_id": "123.456.abc", "actions": [{"action_id": "a1", "type": "button"}]});
        let body: String = form_urlencoded::Serializer::new(String::new())
            .append_pair("payload", &inner.to_string())
            .finish();
        let a = accepted(evaluate(
            s.as_ref(),
            &signed(FORM_MEDIA_TYPE, &body, 1_700_000_000, 1_700_000_000.0),
            &secrets(),
        ));
        assert_eq!(
            (a.key.as_str(), a.event_type.as_str(), a.dedup_id.as_deref()),
            ("T1:C1", "block_actions", Some("123.456.abc"))
        );
        assert_eq!(a.payload, inner);
        // A modal submission names no channel: keyed by the team.
        let view = json!({"type": "view_submission", "team": {"id": "T1"}, "user": {"id": "U1"},
            "trigger_id": "9.9.9", "view": {"id": "V1"}});
        let body: String = form_urlencoded::Serializer::new(String::new())
            .append_pair("payload", &view.to_string())
            .finish();
        let a = accepted(evaluate(
            s.as_ref(),
            &signed(FORM_MEDIA_TYPE, &body, 1_700_000_000, 1_700_000_000.0),
            &secrets(),
        ));
        assert_eq!(
            (a.key.as_str(), a.event_type.as_str()),
            ("T1", "view_submission")
        );
        // A payload field that is not JSON is quarantined, not guessed at.
        let bad = signed(
            FORM_MEDIA_TYPE,
            "payload=nope",
            1_700_000_000,
            1_700_000_000.0,
        );
        assert!(matches!(
            evaluate(s.as_ref(), &bad, &secrets()),
            Verdict::Quarantine {
                class: "BadPayload"
            }
        ));
    }

    #[test]
    fn a_signed_ssl_check_is_ignored_and_an_unsigned_one_refused() {
        let s = slack();
        let body = "ssl_check=1&token=t";
        let good = signed(FORM_MEDIA_TYPE, body, 1_700_000_000, 1_700_000_000.0);
        assert!(matches!(
            evaluate(s.as_ref(), &good, &secrets()),
            Verdict::Ignored(r) if r == "ssl_check"
        ));
        let mut unsigned = good.clone();
        unsigned.remove_header(SIGNATURE_HEADER);
        assert!(matches!(
            evaluate(s.as_ref(), &unsigned, &secrets()),
            Verdict::Unauthorized
        ));
    }

    /// Issue 29: the deprecated verification `token` of a slash command (and of an
    /// interactivity payload and an Events API envelope) reached the agent in the delivered
    /// document.
    #[test]
    fn the_deprecated_verification_token_is_in_no_payload() {
        let v: Value = serde_json::from_str(VECTORS).expect("json");
        let v = &v["vectors"][0];
        let body = v["body"].as_str().expect("body");
        assert!(body.contains("token="), "the vector carries a token");
        let ts = v["timestamp"].as_i64().expect("ts");
        let docs_secrets = MapSecrets::new().with(
            SECRET,
            v["signing_secret"].as_str().expect("secret").as_bytes(),
        );
        let req = Request::new("POST", "/hooks/slack", ts as f64)
            .with_header("Content-Type", FORM_MEDIA_TYPE)
            .with_header(TIMESTAMP_HEADER, &ts.to_string())
            .with_header(
                SIGNATURE_HEADER,
                v["expected_signature"].as_str().expect("sig"),
            )
            .with_body(body);
        let s = slack();
        let a = accepted(evaluate(s.as_ref(), &req, &docs_secrets));
        assert_eq!(a.event_type, SLASH_COMMAND);
        assert_eq!(a.payload.get("token"), None, "{}", a.payload);
        assert_eq!(a.payload["user_name"], "roadrunner");
        assert_eq!(a.payload["command"], "/webhook-collect");

        let inner = json!({"type": "block_actions", "token": "XXYYZZ", "team": {"id": "T1"},
            "channel": {"id": "C1"}, "trigger_id": "1.2.3"});
        let body: String = form_urlencoded::Serializer::new(String::new())
            .append_pair("payload", &inner.to_string())
            .finish();
        let a = accepted(evaluate(
            s.as_ref(),
            &signed(FORM_MEDIA_TYPE, &body, 1_700_000_000, 1_700_000_000.0),
            &secrets(),
        ));
        assert_eq!(a.payload.get("token"), None, "{}", a.payload);
        assert_eq!(a.payload["trigger_id"], "1.2.3");

        // An Events API envelope: stored without it, so not as the body's own text.
        let body = r#"{"token":"XXYYZZ","team_id":"T1","type":"event_callback","event_id":"Ev1","event":{"type":"app_mention","channel":"C1"}}"#;
        let req = signed("application/json", body, 1_700_000_000, 1_700_000_000.0);
        let a = accepted(evaluate(s.as_ref(), &req, &secrets()));
        assert_eq!(a.payload.get("token"), None, "{}", a.payload);
        assert_eq!(a.payload["event_id"], "Ev1");
        assert!(!s.payload_is_body(&req));
        let without = body.replace(r#""token":"XXYYZZ","#, "");
        let req = signed("application/json", &without, 1_700_000_000, 1_700_000_000.0);
        assert!(s.payload_is_body(&req));
    }

    #[test]
    fn a_slash_command_without_its_fields_is_quarantined_by_name() {
        let s = slack();
        let r = signed(
            FORM_MEDIA_TYPE,
            "team_id=T1&command=%2Fx",
            1_700_000_000,
            1_700_000_000.0,
        );
        match evaluate(s.as_ref(), &r, &secrets()) {
            Verdict::Quarantine { class } => assert_eq!(class, "MissingField"),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            s.key(&json!({"team_id": "T1"}), &r)
                .expect_err("no channel")
                .to_string(),
            "missing field channel_id"
        );
    }
}
