//! Script emits (spec 6.6): `{"enqueue": {...}}` objects validated like the intake's input
//! and turned into enqueue requests that the store commits in the same fenced transaction
//! as the mark. An emit names `source` and `key`, carries a `payload` object, and may set
//! `event_type`, `dedup_id` and `destination` (without one, the source's routes decide).

use std::collections::BTreeMap;

use serde_json::Value;

use crate::config::{self, Config};
use crate::store::{Copy, EnqueueRequest, KEY_BYTES_MAX};

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
    let bad = |why: &str| EmitError {
        index,
        why: why.to_string(),
    };
    let str_field = |k: &str| e.get(k).and_then(Value::as_str).map(str::to_string);
    let source = str_field("source").ok_or_else(|| bad("source is required (a string)"))?;
    let key = str_field("key").ok_or_else(|| bad("key is required (a string)"))?;
    if key.len() > KEY_BYTES_MAX {
        return Err(bad("key is over 512 bytes"));
    }
    let payload = e
        .get("payload")
        .filter(|p| p.is_object())
        .ok_or_else(|| bad("payload must be a JSON object"))?;
    let event_type = str_field("event_type").unwrap_or_default();
    let dedup_id = str_field("dedup_id");
    let text = payload.to_string();
    let src = cfg.sources.get(&source);
    let max_body = src
        .map(|s| s.max_body_bytes)
        .unwrap_or(cfg.intake.max_body_bytes);
    if text.len() as i64 > max_body {
        return Err(bad("payload is over the source's max_body_bytes"));
    }
    let resolved = match (str_field("destination"), src) {
        (Some(d), s) => {
            let window = match s {
                Some(s) => config::resolve_window(&cfg.spans, &cfg.coalesce, s, None),
                None => cfg.coalesce,
            };
            config::Resolved {
                primary: Copy {
                    route: source.clone(),
                    destination: d,
                    window,
                },
                tees: vec![],
            }
        }
        (None, Some(s)) => {
            let attrs = BTreeMap::from([("event_type".to_string(), event_type.clone())]);
            cfg.resolve_routes(s, &attrs, None, None).ok_or_else(|| {
                bad("no destination: set destination, or give the source an action or route")
            })?
        }
        (None, None) => return Err(bad("unknown source and no destination")),
    };
    Ok(EnqueueRequest {
        source,
        key,
        event_type,
        dedup_id,
        dedup_window_s: src
            .map(|s| s.dedup_window_s)
            .unwrap_or(config::DEDUP_WINDOW_S_DEFAULT),
        raw: None,
        payload: Some(text),
        headers: "{}".into(),
        primary: resolved.primary,
        tees: resolved.tees,
        quarantine: None,
        now,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cfg() -> Config {
        config::parse(
            "[sources.s]\naction = \"http-x\"\n",
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
        assert_eq!(r[0].primary.route, "other");
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
                "unknown source",
            ),
        ] {
            let err = to_requests(&c, &[e], 1.0).unwrap_err();
            assert!(err.why.contains(why), "{err}");
        }
    }
}
