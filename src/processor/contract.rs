//! The env contract between the dispatcher and the runtime (spec 14.3.3 steps 2-6) and the
//! batch document on stdin (spec 6.4), parsed once into types.
//!
//! The bobbins expansion sets HOOKSPOOL_BOBBIN, HOOKSPOOL_BOBBIN_INSTANCE,
//! HOOKSPOOL_BOBBIN_DIR, HOOKSPOOL_SETTINGS (a JSON object, defaults applied),
//! HOOKSPOOL_DELTA_ROUTES (the instance's outputs: event type -> destination) and
//! HOOKSPOOL_SECRET_REFS (secret name -> reference, never a value); the script destination
//! adds HOOKSPOOL_BATCH_ID, HOOKSPOOL_DELIVERY_ID and, with state, HOOKSPOOL_STATE_DIR.
//!
//! Must not: echo a variable's value in an error (names only), or resolve a secret here.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::{Map, Value};

use super::ProcessorError;
use crate::secret::SecretRefs;

pub const ENV_BOBBIN: &str = "HOOKSPOOL_BOBBIN";
pub const ENV_INSTANCE: &str = "HOOKSPOOL_BOBBIN_INSTANCE";
pub const ENV_BOBBIN_DIR: &str = "HOOKSPOOL_BOBBIN_DIR";
pub const ENV_SETTINGS: &str = "HOOKSPOOL_SETTINGS";
pub const ENV_DELTA_ROUTES: &str = "HOOKSPOOL_DELTA_ROUTES";
pub const ENV_SECRET_REFS: &str = "HOOKSPOOL_SECRET_REFS";
pub const ENV_BATCH_ID: &str = "HOOKSPOOL_BATCH_ID";
pub const ENV_DELIVERY_ID: &str = "HOOKSPOOL_DELIVERY_ID";
pub const ENV_STATE_DIR: &str = "HOOKSPOOL_STATE_DIR";

/// Everything the environment says about this run.
#[derive(Debug, Clone)]
pub struct Contract {
    pub bobbin: String,
    pub instance: String,
    pub bobbin_dir: PathBuf,
    pub settings: Map<String, Value>,
    /// Output event type -> destination (`hermes:mail`). A type not here is dropped.
    pub routes: BTreeMap<String, String>,
    /// Secret name -> its reference, for the secrets the manifest marks `processor = true`.
    pub secret_refs: BTreeMap<String, SecretRefs>,
    pub batch_id: i64,
    pub delivery_id: String,
    pub state_dir: Option<PathBuf>,
}

fn missing(name: &'static str) -> ProcessorError {
    ProcessorError::permanent(format!("processor environment: {name} is not set"))
}

fn invalid(name: &'static str, what: &'static str) -> ProcessorError {
    ProcessorError::permanent(format!("processor environment: {name} is not {what}"))
}

impl Contract {
    /// Reads the contract through `var` (the process environment in production, a map in
    /// tests).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Contract, ProcessorError> {
        let need = |name: &'static str| var(name).filter(|v| !v.is_empty()).ok_or(missing(name));
        let json = |name: &'static str| -> Result<Value, ProcessorError> {
            match var(name).filter(|v| !v.is_empty()) {
                None => Ok(Value::Object(Map::new())),
                Some(text) => serde_json::from_str(&text).map_err(|_| invalid(name, "valid JSON")),
            }
        };
        let Value::Object(settings) = json(ENV_SETTINGS)? else {
            return Err(invalid(ENV_SETTINGS, "a JSON object"));
        };
        let routes: BTreeMap<String, String> = serde_json::from_value(json(ENV_DELTA_ROUTES)?)
            .map_err(|_| invalid(ENV_DELTA_ROUTES, "an object of strings"))?;
        let secret_refs: BTreeMap<String, SecretRefs> =
            serde_json::from_value(json(ENV_SECRET_REFS)?)
                .map_err(|_| invalid(ENV_SECRET_REFS, "an object of secret references"))?;
        let batch_id = need(ENV_BATCH_ID)?
            .parse::<i64>()
            .map_err(|_| invalid(ENV_BATCH_ID, "an integer"))?;
        let bobbin_dir = PathBuf::from(need(ENV_BOBBIN_DIR)?);
        if !bobbin_dir.is_absolute() {
            return Err(invalid(ENV_BOBBIN_DIR, "an absolute path"));
        }
        let state_dir = var(ENV_STATE_DIR)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from);
        if state_dir.as_ref().is_some_and(|d| !d.is_absolute()) {
            return Err(invalid(ENV_STATE_DIR, "an absolute path"));
        }
        Ok(Contract {
            bobbin: need(ENV_BOBBIN)?,
            instance: need(ENV_INSTANCE)?,
            bobbin_dir,
            settings,
            routes,
            secret_refs,
            batch_id,
            delivery_id: need(ENV_DELIVERY_ID)?,
            state_dir,
        })
    }

    /// The real process environment.
    pub fn from_env() -> Result<Contract, ProcessorError> {
        Contract::from_vars(|name| std::env::var(name).ok())
    }
}

/// The batch as the document describes it (spec 6.4): the stored payloads oldest first.
#[derive(Debug, Clone)]
pub struct Batch {
    pub id: i64,
    pub delivery_id: String,
    pub source: String,
    pub key: String,
    pub events: Vec<Value>,
    /// Each event's type, parallel to `events` (empty when the document has no meta).
    pub event_types: Vec<String>,
    /// The whole document, for an exec processor.
    pub doc: Value,
}

impl Batch {
    /// Parses the document the script destination writes to stdin.
    pub fn parse(stdin: &[u8]) -> Result<Batch, ProcessorError> {
        let bad = |what: &'static str| {
            ProcessorError::permanent(format!("batch document on stdin: {what}"))
        };
        let doc: Value = serde_json::from_slice(stdin).map_err(|_| bad("not JSON"))?;
        let text = |k: &str| doc.get(k).and_then(Value::as_str).map(str::to_string);
        let id = doc
            .get("batch_id")
            .and_then(Value::as_i64)
            .ok_or(bad("no batch_id"))?;
        let events = doc
            .get("events")
            .and_then(Value::as_array)
            .cloned()
            .ok_or(bad("no events array"))?;
        let event_types = doc
            .get("event_meta")
            .and_then(Value::as_array)
            .map(|m| {
                m.iter()
                    .map(|e| {
                        e.get("event_type")
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_string()
                    })
                    .collect()
            })
            .unwrap_or_default();
        Ok(Batch {
            id,
            delivery_id: text("delivery_id").unwrap_or_default(),
            source: text("source").unwrap_or_default(),
            key: text("key").ok_or(bad("no key"))?,
            events,
            event_types,
            doc,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    const BASE: &[(&str, &str)] = &[
        (ENV_BOBBIN, "google.gmail"),
        (ENV_INSTANCE, "gmail"),
        (ENV_BOBBIN_DIR, "/b/google/gmail"),
        (ENV_SETTINGS, r#"{"owner":"o@example.com"}"#),
        (ENV_DELTA_ROUTES, r#"{"mail":"hermes:mail"}"#),
        (
            ENV_SECRET_REFS,
            r#"{"cred_owner":{"file":"/s/cred.json"},"k":{"env_file":"/s/e","key":"K"}}"#,
        ),
        (ENV_BATCH_ID, "42"),
        (ENV_DELIVERY_ID, "hs_x_42"),
    ];

    #[test]
    fn the_env_contract_parses_into_types() {
        let c = Contract::from_vars(vars(BASE)).unwrap();
        assert_eq!(c.batch_id, 42);
        assert_eq!(c.routes["mail"], "hermes:mail");
        assert_eq!(c.settings["owner"], "o@example.com");
        assert_eq!(c.secret_refs.len(), 2);
        assert!(c.state_dir.is_none());
    }

    #[test]
    fn a_missing_or_invalid_variable_is_permanent_and_named_without_its_value() {
        let mut v: Vec<(&str, &str)> = BASE.to_vec();
        v.retain(|(k, _)| *k != ENV_BATCH_ID);
        let e = Contract::from_vars(vars(&v)).unwrap_err();
        assert_eq!(e.failure, super::super::Failure::Permanent);
        assert!(e.reason.contains(ENV_BATCH_ID), "{e}");
        let mut v: Vec<(&str, &str)> = BASE.to_vec();
        v.retain(|(k, _)| *k != ENV_SETTINGS);
        v.push((ENV_SETTINGS, "SENTINEL-not-json"));
        let e = Contract::from_vars(vars(&v)).unwrap_err();
        assert!(e.reason.contains(ENV_SETTINGS) && !e.reason.contains("SENTINEL"));
    }

    #[test]
    fn the_document_parses() {
        let b = Batch::parse(
            br#"{"batch_id":7,"key":"k","source":"s","delivery_id":"d","events":[{"a":1}],
                "event_meta":[{"id":1,"event_type":"push"}]}"#,
        )
        .unwrap();
        assert_eq!((b.id, b.key.as_str(), b.events.len()), (7, "k", 1));
        assert_eq!(b.event_types, ["push"]);
        assert!(Batch::parse(b"{}").is_err());
    }
}
