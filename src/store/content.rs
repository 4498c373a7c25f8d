//! content_hash: SHA-256 over the canonical JSON of a batch's frozen part, `events` and
//! `event_meta` with excluded events omitted (spec 3, 6.4). Canonical means compact JSON
//! with object keys sorted, so the hash depends on the stored facts only, never on how a
//! payload's keys happened to be ordered on the wire. Pure: no SQL here.

use serde_json::{Value, json};
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

/// A stored payload that is not JSON text. The intake, `enqueue` and processors' emits
/// store JSON only, so the spool was changed under hookspool: the batch cannot be hashed or
/// delivered as it is, and saying so beats delivering `null` in the event's place.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error(
    "event {event_id}'s stored payload is not JSON; inspect it with `hookspool show`, then exclude the event or drop the batch"
)]
pub struct UnreadablePayload {
    pub event_id: i64,
}

impl CanonicalEvent {
    /// The payload as the document carries it; `None` (a quarantined request) is JSON null.
    pub fn payload_value(&self) -> Result<Value, UnreadablePayload> {
        match self.payload.as_deref() {
            None => Ok(Value::Null),
            Some(p) => serde_json::from_str(p).map_err(|_| UnreadablePayload { event_id: self.id }),
        }
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

/// `sha256:<hex>` over `{"event_meta":[...],"events":[...]}` in canonical form. The
/// canonical text is streamed into the hash as it is written: sealing a batch of hundreds
/// of events builds no second copy of them (issue 13's profile of the intake's writer).
pub fn content_hash(events: &[CanonicalEvent]) -> Result<String, UnreadablePayload> {
    let mut out = HashWriter(Sha256::new());
    write_document(&mut out, events)?;
    Ok(format!("sha256:{}", hex::encode(out.0.finalize())))
}

/// The document's own keys, already in sorted order ("event_meta" < "events").
fn write_document(
    out: &mut HashWriter,
    events: &[CanonicalEvent],
) -> Result<(), UnreadablePayload> {
    out.raw(b"{\"event_meta\":[");
    for (i, e) in events.iter().enumerate() {
        if i > 0 {
            out.raw(b",");
        }
        write_canonical(out, &e.meta_value());
    }
    out.raw(b"],\"events\":[");
    for (i, e) in events.iter().enumerate() {
        if i > 0 {
            out.raw(b",");
        }
        write_canonical(out, &e.payload_value()?);
    }
    out.raw(b"]}");
    Ok(())
}

/// Compact JSON with every object's keys sorted, at any depth. serde_json keeps insertion
/// order when a dependency turns on `preserve_order`, so the order is imposed here and never
/// taken from the map type.
fn write_canonical(out: &mut HashWriter, v: &Value) {
    match v {
        Value::Object(m) => {
            let mut entries: Vec<(&String, &Value)> = m.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.raw(b"{");
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.raw(b",");
                }
                out.json(k);
                out.raw(b":");
                write_canonical(out, v);
            }
            out.raw(b"}");
        }
        Value::Array(a) => {
            out.raw(b"[");
            for (i, v) in a.iter().enumerate() {
                if i > 0 {
                    out.raw(b",");
                }
                write_canonical(out, v);
            }
            out.raw(b"]");
        }
        scalar => out.json(scalar),
    }
}

/// Feeds canonical text into SHA-256.
struct HashWriter(Sha256);

impl HashWriter {
    fn raw(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    /// A string or scalar in serde_json's compact form.
    fn json<T: serde::Serialize + ?Sized>(&mut self, v: &T) {
        // Writing a string or a JSON scalar into a sink that never fails cannot fail.
        let _ = serde_json::to_writer(&mut *self, v);
    }
}

impl std::io::Write for HashWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
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

    /// The canonical form as first written (sort every object into a new Value, serialise to
    /// a String, hash it): the streamed hash must give exactly these bytes, since stored
    /// content hashes are compared with recomputed ones.
    fn reference_hash(events: &[CanonicalEvent]) -> String {
        fn canonical(v: Value) -> Value {
            match v {
                Value::Object(m) => {
                    let mut entries: Vec<(String, Value)> = m.into_iter().collect();
                    entries.sort_by(|a, b| a.0.cmp(&b.0));
                    let mut out = serde_json::Map::new();
                    for (k, v) in entries {
                        out.insert(k, canonical(v));
                    }
                    Value::Object(out)
                }
                Value::Array(a) => Value::Array(a.into_iter().map(canonical).collect()),
                other => other,
            }
        }
        let doc = json!({
            "events": events.iter().map(|e| e.payload_value().unwrap()).collect::<Vec<_>>(),
            "event_meta": events.iter().map(CanonicalEvent::meta_value).collect::<Vec<_>>(),
        });
        let text = serde_json::to_string(&canonical(doc)).expect("serialise");
        format!("sha256:{}", hex::encode(Sha256::digest(text.as_bytes())))
    }

    #[test]
    fn streamed_hash_equals_the_reference_form() {
        let payloads = [
            r#"{"z":[{"b":1,"a":[true,null,{"d":"\u00e9\"\n","c":-0.5}]}],"a":"\ud83d\ude00"}"#,
            r#"[3,2,1e300,-17,"x"]"#,
            r#""just a string""#,
            r#"12.25"#,
            "[\"not an object\"]",
            "{}",
        ];
        let mut events: Vec<CanonicalEvent> = payloads
            .iter()
            .enumerate()
            .map(|(i, p)| ev(i as i64 + 1, p))
            .collect();
        events[1].dedup_id = None;
        events[2].payload = None;
        events[3].received_at = f64::NAN;
        events[4].event_type = "t\u{7f}\"q".into();
        for n in 0..=events.len() {
            assert_eq!(
                content_hash(&events[..n]).unwrap(),
                reference_hash(&events[..n]),
                "{n} events"
            );
        }
    }

    #[test]
    fn key_order_and_whitespace_do_not_change_the_hash() {
        let a = content_hash(&[ev(1, r#"{"a":1,"b":{"y":2,"x":1}}"#)]).unwrap();
        let b = content_hash(&[ev(1, r#"{ "b": {"x":1, "y":2}, "a": 1 }"#)]).unwrap();
        assert_eq!(a, b);
        assert!(a.starts_with("sha256:") && a.len() == 7 + 64);
    }

    #[test]
    fn any_fact_changes_the_hash() {
        let base = content_hash(&[ev(1, r#"{"a":1}"#), ev(2, r#"{"a":2}"#)]).unwrap();
        assert_ne!(base, content_hash(&[ev(1, r#"{"a":1}"#)]).unwrap());
        assert_ne!(
            base,
            content_hash(&[ev(2, r#"{"a":2}"#), ev(1, r#"{"a":1}"#)]).unwrap()
        );
        let mut e = ev(2, r#"{"a":2}"#);
        e.event_type = "other".into();
        assert_ne!(base, content_hash(&[ev(1, r#"{"a":1}"#), e]).unwrap());
        assert_ne!(
            base,
            content_hash(&[ev(1, r#"{"a":1}"#), ev(2, r#"{"a":3}"#)]).unwrap()
        );
    }
}
