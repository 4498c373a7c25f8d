//! content_hash: SHA-256 over the canonical JSON of a batch's frozen part, `events` and
//! `event_meta` with excluded events omitted (spec 3, 6.4). Canonical means compact JSON
//! with object keys sorted, so the hash depends on the stored facts only, never on how a
//! payload's keys happened to be ordered on the wire. Pure: no SQL here.

use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

/// The frozen facts of one event as the document carries them.
#[derive(Debug, Clone, PartialEq)]
pub struct CanonicalEvent {
    pub id: i64,
    pub event_type: String,
    pub received_at: f64,
    pub dedup_id: Option<String>,
    /// The stored payload text; `None` (a quarantined request) hashes as JSON null.
    pub payload: Option<String>,
}

impl CanonicalEvent {
    pub fn payload_value(&self) -> Value {
        self.payload
            .as_deref()
            .and_then(|p| serde_json::from_str(p).ok())
            .unwrap_or(Value::Null)
    }

    pub fn meta_value(&self) -> Value {
        json!({
            "id": self.id,
            "event_type": self.event_type,
            "received_at": self.received_at,
            "dedup_id": self.dedup_id,
        })
    }
}

/// Recursively sort object keys (serde_json keeps insertion order when a dependency turns
/// on `preserve_order`, so the canonical form must not rely on the map type).
fn canonical(v: Value) -> Value {
    match v {
        Value::Object(m) => {
            let mut entries: Vec<(String, Value)> = m.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            let mut out = Map::new();
            for (k, v) in entries {
                out.insert(k, canonical(v));
            }
            Value::Object(out)
        }
        Value::Array(a) => Value::Array(a.into_iter().map(canonical).collect()),
        other => other,
    }
}

/// `sha256:<hex>` over `{"event_meta":[...],"events":[...]}` in canonical form.
pub fn content_hash(events: &[CanonicalEvent]) -> String {
    let doc = json!({
        "events": events.iter().map(CanonicalEvent::payload_value).collect::<Vec<_>>(),
        "event_meta": events.iter().map(CanonicalEvent::meta_value).collect::<Vec<_>>(),
    });
    let text = canonical_string(doc);
    format!("sha256:{}", hex::encode(Sha256::digest(text.as_bytes())))
}

fn canonical_string(v: Value) -> String {
    // Serialising a Value cannot fail (no non-string keys, no custom Serialize impls).
    serde_json::to_string(&canonical(v)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(id: i64, payload: &str) -> CanonicalEvent {
        CanonicalEvent {
            id,
            event_type: "push".into(),
            received_at: 1700000000.25,
            dedup_id: Some(format!("d{id}")),
            payload: Some(payload.into()),
        }
    }

    #[test]
    fn key_order_and_whitespace_do_not_change_the_hash() {
        let a = content_hash(&[ev(1, r#"{"a":1,"b":{"y":2,"x":1}}"#)]);
        let b = content_hash(&[ev(1, r#"{ "b": {"x":1, "y":2}, "a": 1 }"#)]);
        assert_eq!(a, b);
        assert!(a.starts_with("sha256:") && a.len() == 7 + 64);
    }

    #[test]
    fn any_fact_changes_the_hash() {
        let base = content_hash(&[ev(1, r#"{"a":1}"#), ev(2, r#"{"a":2}"#)]);
        assert_ne!(base, content_hash(&[ev(1, r#"{"a":1}"#)]));
        assert_ne!(
            base,
            content_hash(&[ev(2, r#"{"a":2}"#), ev(1, r#"{"a":1}"#)])
        );
        let mut e = ev(2, r#"{"a":2}"#);
        e.event_type = "other".into();
        assert_ne!(base, content_hash(&[ev(1, r#"{"a":1}"#), e]));
        assert_ne!(
            base,
            content_hash(&[ev(1, r#"{"a":1}"#), ev(2, r#"{"a":3}"#)])
        );
    }
}
