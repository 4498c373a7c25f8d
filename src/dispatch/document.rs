//! The delivered document (spec 6.4): identical for Hermes, scripts and HTTP. `events` and
//! `event_meta` are the frozen part that content_hash covers; delivery_id and attempt change
//! per attempt by design. `summary` is a plain count line, never an interpretation.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::store::{BatchRow, CanonicalEvent, UnreadablePayload};

/// Render the document for one attempt; a payload the spool cannot read back fails it.
pub fn render(
    b: &BatchRow,
    events: &[CanonicalEvent],
    delivery_id: &str,
    attempt: i64,
) -> Result<Vec<u8>, UnreadablePayload> {
    let payloads = events
        .iter()
        .map(CanonicalEvent::payload_value)
        .collect::<Result<Vec<Value>, _>>()?;
    let mut types: BTreeMap<&str, i64> = BTreeMap::new();
    for e in events {
        *types.entry(e.event_type.as_str()).or_insert(0) += 1;
    }
    let event_type = events.last().map(|e| e.event_type.as_str()).unwrap_or("");
    let doc = json!({
        "source": b.source,
        "route": b.route,
        "key": b.key,
        "batch_id": b.id,
        "delivery_id": delivery_id,
        "attempt": attempt,
        "count": events.len(),
        "first_at": b.first_at,
        "last_at": b.last_at,
        "event_type": event_type,
        "event_types": types,
        "summary": summary(&b.source, &b.key, events.len(), &types),
        "content_hash": b.content_hash,
        "events": payloads,
        "event_meta": events.iter().map(CanonicalEvent::meta_value).collect::<Vec<Value>>(),
    });
    // Serialising a Value cannot fail.
    Ok(serde_json::to_vec(&doc).unwrap_or_default())
}

fn summary(source: &str, key: &str, n: usize, types: &BTreeMap<&str, i64>) -> String {
    let parts: Vec<String> = types
        .iter()
        .map(|(t, c)| {
            if t.is_empty() {
                format!("untyped x{c}")
            } else {
                format!("{t} x{c}")
            }
        })
        .collect();
    format!("{n} {source} event(s) for {key} ({})", parts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn document_has_every_field_and_counts_types() {
        let b = BatchRow {
            id: 123,
            route: "github-ci".into(),
            source: "github".into(),
            destination: "hermes:github-ci".into(),
            key: "owner/repo:ci".into(),
            state: crate::vocab::BatchState::Leased,
            first_at: 1.5,
            last_at: 2.5,
            quiet_s: 0.0,
            max_s: 0.0,
            max_events: 500,
            max_bytes: 1000,
            not_before: None,
            count: 3,
            bytes: 30,
            sealed_at: Some(3.0),
            content_hash: Some("sha256:ab".into()),
            attempts: 0,
            next_attempt_at: None,
            lease_until: None,
            lease_owner: None,
            last_error: None,
            last_class: None,
            delivered_at: None,
            result: None,
            dropped_at: None,
        };
        let ev = |id, t: &str, p: &str| CanonicalEvent {
            id,
            event_type: t.into(),
            received_at: 1.0,
            dedup_id: None,
            payload: Some(p.into()),
        };
        let events = vec![
            ev(1, "check_suite", r#"{"a":1}"#),
            ev(2, "check_suite", "{}"),
            ev(3, "workflow_run", "{}"),
        ];
        let doc: Value =
            serde_json::from_slice(&render(&b, &events, "hs_x_123", 2).unwrap()).unwrap();
        assert_eq!(doc["event_type"], "workflow_run");
        assert_eq!(
            doc["event_types"],
            json!({"check_suite": 2, "workflow_run": 1})
        );
        assert_eq!(
            doc["summary"],
            "3 github event(s) for owner/repo:ci (check_suite x2, workflow_run x1)"
        );
        assert_eq!(doc["count"], 3);
        assert_eq!(doc["attempt"], 2);
        assert_eq!(doc["events"][0], json!({"a": 1}));
        assert_eq!(doc["event_meta"][2]["id"], 3);
        assert_eq!(doc["content_hash"], "sha256:ab");
    }
}
