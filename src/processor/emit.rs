//! Items -> `{"enqueue": {...}}` emits (spec 14.3.4), in the shape `destinations::script`
//! parses and `dispatch::emits` validates: `source` = the instance, `key` = the item's `key`
//! or the batch key, `event_type` = the item's, `dedup_id` = `<instance>:<batch id>:<item
//! index>` (stable across retries of the batch), `destination` = the instance's output
//! mapping for the event type, `payload` = the item itself.
//!
//! An item whose event type the instance does not map is dropped (the deployment does not
//! want it, spec 14.3.3 step 8); the caller logs one line per batch with the counts.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use super::{Item, ProcessorError};
use crate::destinations::script::SCRIPT_STDOUT_BYTES_MAX;

/// An event type longer than this is not one a manifest declares.
const EVENT_TYPE_BYTES_MAX: usize = 128;

#[derive(Debug, Default)]
pub struct Built {
    pub emits: Vec<Value>,
    /// Event type -> how many items of it were dropped as unmapped.
    pub dropped: BTreeMap<String, usize>,
}

fn invalid(what: &'static str) -> ProcessorError {
    ProcessorError::bug(format!("processor returned an invalid item: {what}"))
}

pub fn build(
    instance: &str,
    batch_id: i64,
    batch_key: &str,
    routes: &BTreeMap<String, String>,
    items: &[Item],
) -> Result<Built, ProcessorError> {
    let mut out = Built::default();
    let mut bytes = 0usize;
    for (index, item) in items.iter().enumerate() {
        let event_type = match item.get("event_type") {
            Some(Value::String(t)) if !t.is_empty() && t.len() <= EVENT_TYPE_BYTES_MAX => t,
            _ => return Err(invalid("event_type must be a short non-empty string")),
        };
        let key = match item.get("key") {
            None | Some(Value::Null) => batch_key,
            Some(Value::String(k)) if !k.is_empty() => k,
            _ => return Err(invalid("key must be a non-empty string")),
        };
        let Some(destination) = routes.get(event_type) else {
            *out.dropped.entry(event_type.clone()).or_default() += 1;
            continue;
        };
        let emit = json!({
            "source": instance,
            "key": key,
            "event_type": event_type,
            "dedup_id": format!("{instance}:{batch_id}:{index}"),
            "destination": destination,
            "payload": Value::Object(item.clone()),
        });
        bytes += line(&emit).len();
        out.emits.push(emit);
    }
    if bytes > SCRIPT_STDOUT_BYTES_MAX {
        return Err(ProcessorError::permanent(
            "the items exceed the script destination's 1 MiB stdout limit",
        ));
    }
    Ok(out)
}

/// One stdout line for an emit, newline included.
pub fn line(emit: &Value) -> String {
    let mut wrapped = Map::new();
    wrapped.insert("enqueue".into(), emit.clone());
    // Serialising a Value cannot fail.
    let mut s = serde_json::to_string(&Value::Object(wrapped)).unwrap_or_default();
    s.push('\n');
    s
}

/// "mail x2, scheduling x1": the dropped counts for the one log line.
pub fn describe(dropped: &BTreeMap<String, usize>) -> String {
    dropped
        .iter()
        .map(|(t, n)| format!("{t} x{n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::destinations::script::parse_emits;

    fn item(v: Value) -> Item {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn items_become_emits_the_script_destination_accepts() {
        let routes = BTreeMap::from([("mail".to_string(), "hermes:mail".to_string())]);
        let items = [
            item(json!({"event_type": "mail", "id": "m1"})),
            item(json!({"event_type": "scheduling", "id": "m1"})),
            item(json!({"event_type": "mail", "id": "m2", "key": "thread-9"})),
        ];
        let b = build("gmail", 12, "o@example.com", &routes, &items).unwrap();
        assert_eq!(b.dropped, BTreeMap::from([("scheduling".to_string(), 1)]));
        assert_eq!(b.emits.len(), 2);
        assert_eq!(b.emits[0]["key"], "o@example.com");
        assert_eq!(b.emits[0]["dedup_id"], "gmail:12:0");
        assert_eq!(b.emits[1]["key"], "thread-9");
        assert_eq!(
            b.emits[1]["dedup_id"], "gmail:12:2",
            "the index is the item's"
        );
        let stdout: String = b.emits.iter().map(line).collect();
        let parsed = parse_emits(stdout.as_bytes()).unwrap();
        assert_eq!(parsed, b.emits);
        assert_eq!(parsed[1]["payload"]["id"], "m2");
        assert_eq!(describe(&b.dropped), "scheduling x1");
    }

    #[test]
    fn an_item_without_an_event_type_is_a_bug() {
        let e = build("i", 1, "k", &BTreeMap::new(), &[item(json!({"x": 1}))]).unwrap_err();
        assert_eq!(e.failure, super::super::Failure::Bug);
    }
}
