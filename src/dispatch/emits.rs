//! Script emits (spec 6.6): `{"enqueue": {...}}` objects validated like the intake's input
//! and turned into enqueue requests that the store commits in the same fenced transaction
//! as the mark. An emit names `source` and `key`, carries a `payload` object, and may set
//! `event_type`, `dedup_id` and `destination` (without one, the source's routes decide);
//! validation and routing are `Config::injected_request`, shared with `hookspool enqueue`.

use serde_json::Value;

use crate::config::{Config, Injected};
use crate::store::EnqueueRequest;

/// Why an emit was refused (the dispatcher's "bad emit"; twice on one batch is permanent).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("emit {index}: {why}")]
pub struct EmitError {
    pub index: usize,
    pub why: String,
}

pub fn to_requests(
    cfg: &Config,
    emits: &[Value],
    now: f64,
) -> Result<Vec<EnqueueRequest>, EmitError> {
    emits
        .iter()
        .enumerate()
        .map(|(i, e)| one(cfg, i, e, now))
        .collect()
}

fn one(cfg: &Config, index: usize, e: &Value, now: f64) -> Result<EnqueueRequest, EmitError> {
    let bad = |why: String| EmitError { index, why };
    let str_field = |k: &str| e.get(k).and_then(Value::as_str);
    let source = str_field("source").ok_or_else(|| bad("source is required (a string)".into()))?;
    let key = str_field("key").ok_or_else(|| bad("key is required (a string)".into()))?;
    let payload = e
        .get("payload")
        .filter(|p| p.is_object())
        .ok_or_else(|| bad("payload must be a JSON object".into()))?
        .to_string();
    cfg.injected_request(&Injected {
        source,
        key,
        event_type: str_field("event_type").unwrap_or_default(),
        dedup_id: str_field("dedup_id"),
        destination: str_field("destination"),
        payload: &payload,
        raw: None,
        now,
    })
    .map_err(|e| bad(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cfg() -> Config {
        crate::config::parse(
            "[sources.s]\nscheme = \"static-token\"\nheader = \"X-Token\"\nkey = \"k\"\naction = \"http-x\"\n\
             [destinations.http-x]\ntype = \"http\"\nurl = \"https://x.invalid/\"\nsecret = { file = \"/nonexistent\" }\n",
            None,
            &Default::default(),
            false,
        )
        .unwrap()
        .0
    }

    #[test]
    fn emits_become_requests_with_routes() {
        let c = cfg();
        let r = to_requests(
            &c,
            &[json!({"source": "s", "key": "k", "payload": {"a": 1}, "event_type": "t"})],
            5.0,
        )
        .unwrap();
        assert_eq!(r[0].primary.destination, "http-x");
        assert_eq!(r[0].payload.as_deref(), Some(r#"{"a":1}"#));
        let r = to_requests(
            &c,
            &[json!({"source": "other", "key": "k", "payload": {}, "destination": "hermes:x"})],
            5.0,
        )
        .unwrap();
        assert_eq!(r[0].primary.route, "other>hermes:x");
    }

    #[test]
    fn invalid_emits_say_why() {
        let c = cfg();
        for (e, why) in [
            (json!({"key": "k", "payload": {}}), "source is required"),
            (json!({"source": "s", "payload": {}}), "key is required"),
            (
                json!({"source": "s", "key": "k", "payload": [1]}),
                "payload must be",
            ),
            (
                json!({"source": "nope", "key": "k", "payload": {}}),
                "source \"nope\" is not configured",
            ),
        ] {
            let err = to_requests(&c, &[e], 1.0).unwrap_err();
            assert!(err.why.contains(why), "{err}");
        }
    }
}
