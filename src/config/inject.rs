//! Events injected by hand or by a script rather than received over HTTP: `hookspool
//! enqueue` (a sweep, an operator) and a script destination's `{"enqueue": ...}` emits. One
//! function validates them like the intake does (a JSON object within the source's
//! max_body_bytes, a key of at most 512 bytes) and routes them through [`Config::route`],
//! the intake's own decision, with the source type's default action and span, so
//! `enqueue --source github` reaches `hermes:github` in github's burst window. An injected
//! event's attrs are its `event_type`, when its source exposes the event type as an attr
//! at the intake (every built-in; a template source only with `attrs.event_type`), so
//! route matches decide alike for both (`SourceConfig::event_type_is_attr`). A
//! source that is not configured may still be named when the event names its destination (a
//! sweep's own source); it then gets the [coalesce] window. An event that names its
//! destination, configured source or not, goes through the route `<source>><destination>`
//! (`route::injected_route`), a batch group of its own.

use std::collections::BTreeMap;

use super::route::injected_route;
use super::{Config, Resolved, RouteQuery};
use crate::store::{Copy, EnqueueRequest, KEY_BYTES_MAX};

/// One injected event.
#[derive(Debug, Clone)]
pub struct Injected<'a> {
    pub source: &'a str,
    pub key: &'a str,
    pub event_type: &'a str,
    pub dedup_id: Option<&'a str>,
    /// Overrides the source's routes: the event goes here, through `<source>><destination>`.
    pub destination: Option<&'a str>,
    /// The payload as JSON text (what the destination receives).
    pub payload: &'a str,
    /// The original bytes, kept when the source stores raw bodies.
    pub raw: Option<&'a [u8]>,
    pub now: f64,
}

/// Why an injected event was refused; each says what to do instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InjectError {
    #[error(
        "source {0:?} is not configured; name a destination, or add [sources.{0}] to the config"
    )]
    UnknownSource(String),
    #[error(
        "no destination for source {0}: name one, set sources.{0}.action, or add a [[routes]] entry"
    )]
    NoDestination(String),
    #[error("the key is {0} bytes; keys are at most 512 bytes")]
    KeyTooLong(usize),
    #[error("the payload must be a JSON object")]
    NotAnObject,
    #[error("the payload is over the source's max_body_bytes ({0})")]
    TooLarge(i64),
}

impl InjectError {
    /// Whether the fix is in the config (exit 2 for the CLI) rather than in the event.
    pub fn is_config(&self) -> bool {
        matches!(
            self,
            InjectError::UnknownSource(_) | InjectError::NoDestination(_)
        )
    }
}

/// The attrs an injected event matches routes with: its event type, when it has one.
pub fn injected_attrs(event_type: &str) -> BTreeMap<String, String> {
    match event_type {
        "" => BTreeMap::new(),
        t => BTreeMap::from([("event_type".to_string(), t.to_string())]),
    }
}

impl Config {
    /// The largest payload an injected event for `source` may carry.
    pub fn injected_body_max(&self, source: &str) -> i64 {
        match self.sources.get(source) {
            Some(s) => s.max_body_bytes,
            None => self.intake.max_body_bytes.min(self.coalesce.max_bytes),
        }
    }

    /// Validate and route one injected event.
    pub fn injected_request(&self, i: &Injected<'_>) -> Result<EnqueueRequest, InjectError> {
        if i.key.len() > KEY_BYTES_MAX {
            return Err(InjectError::KeyTooLong(i.key.len()));
        }
        let is_object =
            serde_json::from_str::<serde_json::Value>(i.payload).is_ok_and(|v| v.is_object());
        if !is_object {
            return Err(InjectError::NotAnObject);
        }
        let max = self.injected_body_max(i.source);
        if i.payload.len() as i64 > max {
            return Err(InjectError::TooLarge(max));
        }
        let src = self.sources.get(i.source);
        let resolved = match (src, i.destination) {
            (Some(s), destination) => {
                let attrs = if s.event_type_is_attr() {
                    injected_attrs(i.event_type)
                } else {
                    BTreeMap::new()
                };
                self.route(&RouteQuery {
                    source: s,
                    attrs: &attrs,
                    event_action: None,
                    destination,
                })
                .ok_or_else(|| InjectError::NoDestination(i.source.to_string()))?
            }
            (None, Some(d)) => Resolved {
                primary: Copy {
                    route: injected_route(i.source, d),
                    destination: d.to_string(),
                    window: self.coalesce,
                },
                tees: vec![],
            },
            (None, None) => return Err(InjectError::UnknownSource(i.source.to_string())),
        };
        let store_raw = src.map_or(self.store_raw, |s| s.store_raw);
        Ok(EnqueueRequest {
            source: i.source.to_string(),
            key: i.key.to_string(),
            event_type: i.event_type.to_string(),
            dedup_id: i.dedup_id.map(str::to_string),
            dedup_window_s: src.map_or(super::DEDUP_WINDOW_S_DEFAULT, |s| s.dedup_window_s),
            raw: i.raw.filter(|_| store_raw).map(<[u8]>::to_vec),
            payload: Some(i.payload.to_string()),
            headers: "{}".into(),
            primary: resolved.primary,
            tees: resolved.tees,
            quarantine: None,
            now: i.now,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{PathInputs, parse};

    fn injected<'a>(source: &'a str, key: &'a str, destination: Option<&'a str>) -> Injected<'a> {
        Injected {
            source,
            key,
            event_type: "mail",
            dedup_id: None,
            destination,
            payload: "{}",
            raw: None,
            now: 1.0,
        }
    }

    /// Regression: an emit naming a destination took the source's route, so keyed like the
    /// source's events it joined the source's open batch (and went back to its processor).
    #[test]
    fn emit_route_collision_a_named_destination_is_a_route_of_its_own() {
        let text = "[sources.gh]\ntype = \"github\"\naction = \"hermes:gh\"\n[[routes]]\nname = \"sweep\"\nsource = \"gh\"\nmatch = { event_type = \"never\" }\ndestination = \"hermes:sweep\"\n";
        let (c, _) = parse(text, None, &PathInputs::default(), true).unwrap();
        let own = c.injected_request(&injected("gh", "k", None)).unwrap();
        let named = c
            .injected_request(&injected("gh", "k", Some("hermes:mail")))
            .unwrap();
        assert_eq!(own.primary.route, "gh");
        assert_eq!(named.primary.route, "gh>hermes:mail");
        assert_eq!(named.primary.destination, "hermes:mail");
        // An unconfigured source's name may be a configured route's ("sweep" here).
        let sweep = c
            .injected_request(&injected("sweep", "k", Some("http:x")))
            .unwrap();
        assert_eq!(sweep.primary.route, "sweep>http:x");
        // No configured route can take that name.
        let bad = "[sources.gh]\ntype = \"github\"\n[[routes]]\nname = \"gh>hermes:mail\"\nsource = \"gh\"\ndestination = \"hermes:mail\"\n";
        let errors = parse(bad, None, &PathInputs::default(), true).unwrap_err();
        assert!(
            errors
                .iter()
                .any(|p| p.to_string().contains("routes[0].name")),
            "{errors:?}"
        );
    }
}
