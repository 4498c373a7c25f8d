//! The delivered document (spec 6.4): identical for Hermes, scripts and HTTP. `events` and
//! `event_meta` are the frozen part that content_hash covers; delivery_id and attempt change
//! per attempt by design. `summary` is a plain count line, never an interpretation.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::store::{BatchRow, CanonicalEvent, UnreadablePayload};

/// Render the document for one attempt; a payload the spool cannot read back fails it.
///
/// The document is written straight into the body, its keys in the sorted order serde_json's
/// map gives them (the bytes are those of a `serde_json::json!` object of the same fields,
/// which the tests compare): building that object first copied every field and event type
/// into a tree of its own on every attempt (issue 36's profile). Each payload is still read
/// into a `Value` and written back, so a payload's keys come out sorted and compact as before.
pub fn render(
    b: &BatchRow,
    events: &[CanonicalEvent],
    delivery_id: &str,
    attempt: i64,
) -> Result<Vec<u8>, UnreadablePayload> {
    let mut types: BTreeMap<&str, i64> = BTreeMap::new();
    for e in events {
        *types.entry(e.event_type.as_str()).or_insert(0) += 1;
    }
    let event_type = events.last().map(|e| e.event_type.as_str()).unwrap_or("");
    let payload_bytes: usize = events
        .iter()
        .map(|e| e.payload.as_ref().map_or(4, String::len))
        .sum();
    let mut out = Vec::with_capacity(payload_bytes + 384 + 128 * events.len());
    out.extend_from_slice(b"{\"attempt\":");
    put(&mut out, &attempt);
    out.extend_from_slice(b",\"batch_id\":");
    put(&mut out, &b.id);
    out.extend_from_slice(b",\"content_hash\":");
    put(&mut out, &b.content_hash);
    out.extend_from_slice(b",\"count\":");
    put(&mut out, &events.len());
    out.extend_from_slice(b",\"delivery_id\":");
    put(&mut out, delivery_id);
    out.extend_from_slice(b",\"event_meta\":[");
    for (i, e) in events.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        put(&mut out, &Meta::of(e));
    }
    out.extend_from_slice(b"],\"event_type\":");
    put(&mut out, event_type);
    out.extend_from_slice(b",\"event_types\":");
    put(&mut out, &types);
    out.extend_from_slice(b",\"events\":[");
    for (i, e) in events.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        put(&mut out, &e.payload_value()?);
    }
    out.extend_from_slice(b"],\"first_at\":");
    put(&mut out, &b.first_at);
    out.extend_from_slice(b",\"key\":");
    put(&mut out, &b.key);
    out.extend_from_slice(b",\"last_at\":");
    put(&mut out, &b.last_at);
    out.extend_from_slice(b",\"route\":");
    put(&mut out, &b.route);
    out.extend_from_slice(b",\"source\":");
    put(&mut out, &b.source);
    out.extend_from_slice(b",\"summary\":");
    put(&mut out, &summary(&b.source, &b.key, events.len(), &types));
    out.push(b'}');
    Ok(out)
}

/// One value in serde_json's compact form. Writing into a `Vec` cannot fail, nor can these
/// values (strings, numbers, maps with string keys, `Value`s).
fn put<T: Serialize + ?Sized>(out: &mut Vec<u8>, v: &T) {
    let _ = serde_json::to_writer(&mut *out, v);
}

/// An event's `event_meta` entry (`CanonicalEvent::meta_value`), its keys in sorted order;
/// a non-finite `received_at` is written as `null`, as `Value` has it.
#[derive(Serialize)]
struct Meta<'a> {
    dedup_id: &'a Option<String>,
    event_type: &'a str,
    id: i64,
    received_at: f64,
}

impl<'a> Meta<'a> {
    fn of(e: &'a CanonicalEvent) -> Meta<'a> {
        Meta {
            dedup_id: &e.dedup_id,
            event_type: &e.event_type,
            id: e.id,
            received_at: e.received_at,
        }
    }
}

fn summary(source: &str, key: &str, n: usize, types: &BTreeMap<&str, i64>) -> String {
    let mut s = format!("{n} {source} event(s) for {key} (");
    for (i, (t, c)) in types.iter().enumerate() {
        if i > 0 {
            s.push_str(", ");
        }
        let t = if t.is_empty() { "untyped" } else { t };
        let _ = write!(s, "{t} x{c}");
    }
    s.push(')');
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    /// The document as it was first rendered: a `json!` object serialised whole. `render`
    /// writes the same bytes.
    fn reference(
        b: &BatchRow,
        events: &[CanonicalEvent],
        delivery_id: &str,
        attempt: i64,
    ) -> Vec<u8> {
        let payloads = events
            .iter()
            .map(|e| e.payload_value().unwrap())
            .collect::<Vec<Value>>();
        let mut types: BTreeMap<&str, i64> = BTreeMap::new();
        for e in events {
            *types.entry(e.event_type.as_str()).or_insert(0) += 1;
        }
        let event_type = events.last().map(|e| e.event_type.as_str()).unwrap_or("");
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
        let summary = format!(
            "{} {} event(s) for {} ({})",
            events.len(),
            b.source,
            b.key,
            parts.join(", ")
        );
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
            "summary": summary,
            "content_hash": b.content_hash,
            "events": payloads,
            "event_meta": events.iter().map(CanonicalEvent::meta_value).collect::<Vec<Value>>(),
        });
        serde_json::to_vec(&doc).unwrap()
    }

    #[test]
    fn render_writes_the_bytes_of_the_json_object() {
        let mut b = batch();
        let ev = |id, t: &str, p: Option<&str>| CanonicalEvent {
            id,
            event_type: t.into(),
            received_at: 1700000000.25 + id as f64,
            dedup_id: (id % 2 == 0).then(|| format!("d\"{id}\u{e9}")),
            payload: p.map(Into::into),
        };
        let mut events = vec![
            ev(
                1,
                "push",
                Some(
                    r#"{"z":[{"b":1,"a":[true,null,{"d":"\u00e9\"\n","c":-0.5}]}],"a":"\ud83d\ude00"}"#,
                ),
            ),
            ev(2, "", Some(r#"[3,2,1e300,-17,"x"]"#)),
            ev(3, "t\u{7f}\"q", None),
            ev(4, "push", Some("12.25")),
            ev(5, "z\u{e9}", Some(" { \"k\" : 2.0 } ")),
        ];
        events[3].received_at = f64::NAN;
        for n in 0..=events.len() {
            let got = render(&b, &events[..n], "hs_x_123", n as i64).unwrap();
            assert_eq!(
                String::from_utf8(got).unwrap(),
                String::from_utf8(reference(&b, &events[..n], "hs_x_123", n as i64)).unwrap(),
                "{n} events"
            );
        }
        b.content_hash = None;
        b.first_at = f64::INFINITY;
        b.key = "k\u{1}\\/\"".into();
        b.source = "s\u{2028}".into();
        assert_eq!(
            render(&b, &events, "hs_\"_1", -1).unwrap(),
            reference(&b, &events, "hs_\"_1", -1)
        );
        events[2].payload = Some("{not json".into());
        assert_eq!(
            render(&b, &events, "hs_x_123", 1),
            Err(UnreadablePayload { event_id: 3 })
        );
    }

    fn batch() -> BatchRow {
        BatchRow {
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
        }
    }

    #[test]
    fn document_has_every_field_and_counts_types() {
        let b = batch();
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
