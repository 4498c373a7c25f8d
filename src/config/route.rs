//! Where an event goes (spec 5, 14.1): the one decision of route, window and tee copies
//! that the intake, `hookspool source test`, quarantine replay, `hookspool enqueue` and
//! script emits all call ([`Config::route`]), the per-field window inheritance
//! ([`Config::window`]), and the config rules that keep every decision possible: the tee
//! rules, the reserved `quarantine` name, and the bounds between a route's window and the
//! destination it feeds.
//!
//! Must not: read a file, a secret or the clock, or know what a source's attrs mean.

use std::collections::BTreeMap;

use super::destination::{self, DestinationConfig, QUARANTINE};
use super::{Config, Problem, RouteConfig, SourceConfig, Span, TEE_ROUTES_MAX, problem};
use crate::sources::{Accepted, Request, Source};
use crate::store::{Copy, EnqueueRequest, KEY_BYTES_MAX, Window};

/// A batch must fit the destination's body limit with room for the document's envelope
/// (spec 5, 15): max_bytes <= 0.75 x destination.max_body_bytes.
pub const MAX_BYTES_BODY_SHARE: f64 = 0.75;

/// Where a classified event goes: the primary copy and its tee copies.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    pub primary: Copy,
    pub tees: Vec<Copy>,
}

/// What the decision needs to know about one event.
#[derive(Debug, Clone, Copy)]
pub struct RouteQuery<'a> {
    pub source: &'a SourceConfig,
    /// The source's attrs for the event, exactly as the source produced them.
    pub attrs: &'a BTreeMap<String, String>,
    /// The destination the source named for this event (`Source::action`); `None` for an
    /// injected event, which then gets the source type's default.
    pub event_action: Option<&'a str>,
    /// A destination named by the caller (`enqueue --destination`, an emit's
    /// `destination`): the route [`injected_route`] names, no tee copies.
    pub destination: Option<&'a str>,
}

/// What separates the source from the destination in [`injected_route`]'s name; a
/// configured route name may not contain it (and a source name cannot), so that name is
/// never one a configured route, a source's implicit route or another destination uses.
pub const INJECTED_ROUTE_SEPARATOR: char = '>';

/// The route of an injected event that names its destination: `<source>><destination>`
/// (`gmail>hermes:mail`). Its batches are a group of their own. Were it the source's own
/// route, the store's join rule (one open batch per (route, key), whatever its destination)
/// would append an emit keyed like the source's events to the source's open batch, and a
/// processor's items would go back into the processor instead of to its outputs.
pub fn injected_route(source: &str, destination: &str) -> String {
    format!("{source}{INJECTED_ROUTE_SEPARATOR}{destination}")
}

impl SourceConfig {
    /// The destination of the implicit route when the event names none: config's `action`,
    /// else the source type's default (`hermes:github` for github).
    pub fn default_action(&self) -> Option<&str> {
        self.action.as_deref().or(self.type_action.as_deref())
    }

    /// The span preset: the configured one, else the source type's own.
    pub fn span_name(&self) -> &str {
        self.span.as_deref().unwrap_or(&self.type_span)
    }
}

impl Config {
    /// Per-field window inheritance: route -> source -> span preset (the source's, else its
    /// type's) -> [coalesce] (spec 5).
    pub fn window(&self, source: &SourceConfig, route: Option<&RouteConfig>) -> Window {
        window_of(&self.spans, &self.coalesce, source, route)
    }

    /// The one routing decision (spec 14.1). The first non-tee route of the source whose
    /// match is a subset of the attrs wins and its destination overrides the actions;
    /// otherwise the implicit route `<source>` goes to config's `action`, else the event's
    /// action, else the type's default. Every matching tee route adds a copy, in file order,
    /// at most [`TEE_ROUTES_MAX`], skipping a destination that already has one. `None` when
    /// nothing names a destination (the intake quarantines such an event). A destination the
    /// caller names goes through [`injected_route`] in the source's window, without tees.
    pub fn route(&self, q: &RouteQuery<'_>) -> Option<Resolved> {
        let source = q.source;
        if let Some(d) = q.destination {
            return Some(Resolved {
                primary: Copy {
                    route: injected_route(&source.name, d),
                    destination: d.to_string(),
                    window: self.window(source, None),
                },
                tees: Vec::new(),
            });
        }
        let matches = |r: &RouteConfig| {
            r.source == source.name && r.match_.iter().all(|(k, v)| q.attrs.get(k) == Some(v))
        };
        let action = source
            .action
            .as_deref()
            .or(q.event_action)
            .or(source.type_action.as_deref());
        let primary = match self.routes.iter().find(|r| !r.tee && matches(r)) {
            Some(r) => Copy {
                route: r.name.clone(),
                destination: r.destination.as_deref().or(action)?.to_string(),
                window: self.window(source, Some(r)),
            },
            None => Copy {
                route: source.name.clone(),
                destination: action?.to_string(),
                window: self.window(source, None),
            },
        };
        let mut tees: Vec<Copy> = Vec::new();
        for r in self.routes.iter().filter(|r| r.tee && matches(r)) {
            let Some(d) = r.destination.as_deref() else {
                continue;
            };
            let taken = d == primary.destination || tees.iter().any(|t| t.destination == d);
            if taken || tees.len() == TEE_ROUTES_MAX {
                continue;
            }
            tees.push(Copy {
                route: r.name.clone(),
                destination: d.to_string(),
                window: self.window(source, Some(r)),
            });
        }
        Some(Resolved { primary, tees })
    }

    /// Every (key, route, destination) a source can deliver through: its implicit route and
    /// each of its routes, with the destination each would use when the event names none;
    /// and, when its action is a bobbin processor, each destination the processor's outputs
    /// are emitted to (issue 29: outputs are feeds), through `<source>><destination>` in the
    /// source's window ([`Config::route`] with a named destination).
    pub fn feeds<'a>(&'a self, source: &'a SourceConfig) -> Vec<Feed<'a>> {
        let action = source.default_action();
        let outputs = action
            .and_then(|a| self.destinations.get(a))
            .map(|d| match &d.spec {
                super::DestinationSpec::Script(s) => s.processor_outputs(),
                _ => BTreeMap::new(),
            })
            .unwrap_or_default();
        std::iter::once(Feed {
            key: format!("sources.{}", source.name),
            route: None,
            destination: action.map(str::to_string),
            output: None,
        })
        .chain(
            self.routes
                .iter()
                .enumerate()
                .filter(|(_, r)| r.source == source.name)
                .map(|(i, r)| Feed {
                    key: format!("routes[{i}]"),
                    route: Some(r),
                    destination: r.destination.clone().or(action.map(str::to_string)),
                    output: None,
                }),
        )
        .chain(
            first_output_per_destination(outputs).map(|(event_type, d)| Feed {
                key: format!("sources.{}", source.name),
                route: None,
                destination: Some(d),
                output: Some(event_type),
            }),
        )
        .collect()
    }

    /// A destination by name: its table, or the implicit `hermes:<route>`.
    pub fn destination(&self, name: &str) -> Option<DestinationConfig> {
        self.destinations
            .get(name)
            .cloned()
            .or_else(|| destination::implicit_hermes(&self.hermes, name))
    }
}

/// One (event type, destination) per destination: every output to one destination is
/// emitted through the same `<source>><destination>` route in the same window, so it is
/// one feed.
fn first_output_per_destination(
    outputs: BTreeMap<String, String>,
) -> impl Iterator<Item = (String, String)> {
    let mut seen = std::collections::BTreeSet::new();
    outputs
        .into_iter()
        .filter(move |(_, d)| seen.insert(d.clone()))
}

/// [`Config::window`] before the `Config` exists (validation uses it).
pub(super) fn window_of(
    spans: &BTreeMap<String, Span>,
    c: &Window,
    source: &SourceConfig,
    route: Option<&RouteConfig>,
) -> Window {
    let span = spans.get(source.span_name());
    let rw = route.map(|r| r.window).unwrap_or_default();
    let sw = source.window;
    Window {
        quiet_s: rw
            .quiet_s
            .or(sw.quiet_s)
            .or(span.map(|s| s.quiet_s))
            .unwrap_or(c.quiet_s),
        max_s: rw
            .max_s
            .or(sw.max_s)
            .or(span.map(|s| s.max_s))
            .unwrap_or(c.max_s),
        max_events: rw.max_events.or(sw.max_events).unwrap_or(c.max_events),
        max_bytes: rw.max_bytes.or(sw.max_bytes).unwrap_or(c.max_bytes),
    }
}

/// One way a source's events reach a destination.
#[derive(Debug, Clone)]
pub struct Feed<'a> {
    /// The config key to name in a problem (`sources.github`, `routes[2]`).
    pub key: String,
    pub route: Option<&'a RouteConfig>,
    pub destination: Option<String>,
    /// A processor's output (its event type, or `*`) emitted to `destination`, in the
    /// source's window; `None` for the source's own routes.
    pub output: Option<String>,
}

/// Two route matches can select one event unless some key requires different values.
fn can_overlap(a: &BTreeMap<String, String>, b: &BTreeMap<String, String>) -> bool {
    a.iter().all(|(k, v)| b.get(k).is_none_or(|w| w == v))
}

/// The tee rules (spec 14.1): at most 8 per source; never to the source's action (config's
/// or the type's) or a non-tee route's destination on the same source; never to an earlier
/// tee's destination when the two matches can overlap.
pub(super) fn check_tees(c: &Config, errors: &mut Vec<Problem>) {
    for (src, s) in &c.sources {
        let indexed: Vec<(usize, &RouteConfig)> = c
            .routes
            .iter()
            .enumerate()
            .filter(|(_, r)| &r.source == src)
            .collect();
        let tees: Vec<&(usize, &RouteConfig)> = indexed.iter().filter(|(_, r)| r.tee).collect();
        if tees.len() > TEE_ROUTES_MAX {
            errors.push(problem(
                format!("sources.{src}"),
                format!(
                    "{} tee routes; at most {TEE_ROUTES_MAX} per source: merge some or give them their own source",
                    tees.len()
                ),
            ));
        }
        let primaries: Vec<&str> = indexed
            .iter()
            .filter(|(_, r)| !r.tee)
            .filter_map(|(_, r)| r.destination.as_deref())
            .chain(s.default_action())
            .collect();
        for (n, (i, t)) in tees.iter().enumerate() {
            let Some(d) = t.destination.as_deref() else {
                continue;
            };
            if primaries.contains(&d) {
                errors.push(problem(
                    format!("routes[{i}].destination"),
                    format!("{d} already receives the events of source {src} (its action or a route's destination); a tee must go to a destination of its own"),
                ));
                continue;
            }
            let earlier = tees[..n].iter().find(|(_, e)| {
                e.destination.as_deref() == Some(d) && can_overlap(&e.match_, &t.match_)
            });
            if let Some((j, _)) = earlier {
                errors.push(problem(
                    format!("routes[{i}].destination"),
                    format!("routes[{j}] already tees to {d} and its match can select the same events; make the matches disjoint or merge the two routes"),
                ));
            }
        }
    }
}

/// What each route (and each bobbin processor's output) feeds and whether it fits (spec 5,
/// 6.4.1, 15): every fed destination
/// exists and is not `quarantine`; a window whose quiet_s exceeds max_s is warned; a
/// document fits 0.75 x the destination's body limit; an unwrap destination takes each
/// event (the source's max_body_bytes) and warns on a coalescing window; a source that
/// no route and no action sends anywhere is warned.
pub(super) fn check_feeds(c: &Config, errors: &mut Vec<Problem>, warnings: &mut Vec<Problem>) {
    for (name, s) in &c.sources {
        let feeds = c.feeds(s);
        let reaches = feeds
            .iter()
            .any(|f| f.destination.is_some() && f.route.is_none_or(|r| !r.tee));
        if !reaches {
            warnings.push(problem(
                format!("sources.{name}"),
                format!("no action and no route with a destination: the {} type names none, so its events are quarantined; write action = \"hermes:{name}\" or add a [[routes]] entry", s.kind),
            ));
        }
        for f in &feeds {
            let w = c.window(s, f.route);
            // An output's window is the source's own, warned about at its implicit route.
            if w.quiet_s > w.max_s && f.output.is_none() {
                warnings.push(problem(
                    &f.key,
                    format!("quiet_s {} > max_s {}: max_s closes the batch first, so the quiet window never fires; raise max_s (e.g. max_s = {}) or lower quiet_s", w.quiet_s, w.max_s, (w.quiet_s * 5.0).max(60.0)),
                ));
            }
            if f.route.is_some() && s.max_body_bytes > w.max_bytes {
                errors.push(problem(
                    format!("{}.max_bytes", f.key),
                    format!("{} is below sources.{name}.max_body_bytes {}: one event could overflow a batch; write max_bytes = {} or lower the source's max_body_bytes", w.max_bytes, s.max_body_bytes, s.max_body_bytes),
                ));
            }
            let Some(dname) = f.destination.as_deref() else {
                continue;
            };
            if dname == QUARANTINE {
                // Refused where it is written (the route's destination or the action).
                continue;
            }
            let Some(d) = c.destination(dname) else {
                if !c.destinations.contains_key(dname) {
                    errors.push(problem(
                        &f.key,
                        format!("delivers to {dname}, which is not configured; add [destinations.\"{dname}\"] with type = \"http\" and url = \"https://...\" (or name a hermes:<route> / script:<name> destination)"),
                    ));
                }
                continue;
            };
            let Some(body) = d.max_body_bytes() else {
                continue;
            };
            if d.unwrap() {
                if s.max_body_bytes as u64 > body {
                    errors.push(problem(
                        format!("sources.{name}.max_body_bytes"),
                        format!("{} is over the max_body_bytes {body} of {dname}, which unwraps (one request per event): an event could be refused (413); lower the source's max_body_bytes or raise the destination's", s.max_body_bytes),
                    ));
                }
                if w.quiet_s > 0.0 || w.max_s > 0.0 {
                    warnings.push(problem(
                        &f.key,
                        format!("{dname} unwraps (one request per event) but this route coalesces (quiet_s {}, max_s {}): its events are held, then sent as a burst; write span = \"immediate\" on the source, or quiet_s = 0 and max_s = 0 on the route", w.quiet_s, w.max_s),
                    ));
                }
                continue;
            }
            let limit = (body as f64 * MAX_BYTES_BODY_SHARE).floor() as i64;
            if w.max_bytes > limit {
                errors.push(problem(
                    format!("{}.max_bytes", f.key),
                    format!("{} is over 0.75 x the max_body_bytes {body} of {dname}: a full batch would be refused (413); write max_bytes = {limit} or raise the destination's max_body_bytes", w.max_bytes),
                ));
            }
        }
    }
}

/// Why a verified, classified event cannot be enqueued (the intake quarantines it with this
/// class; replay and `source test` report it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Unroutable {
    #[error("no destination: set the source's action or add a [[routes]] entry that matches")]
    NoRoute,
    #[error("the key is over 512 bytes")]
    KeyTooLong,
}

impl Unroutable {
    /// The quarantine class (`last_error = "plugin error: <class>"`).
    pub fn class(self) -> &'static str {
        match self {
            Unroutable::NoRoute => "NoRoute",
            Unroutable::KeyTooLong => "KeyTooLong",
        }
    }
}

impl Config {
    /// The enqueue request for an event `source` accepted: the one place that turns a
    /// classification into what is stored, for the intake, quarantine replay and `source
    /// test`. Headers kept are the source type's and the configured ones, never an auth
    /// header or a credential (spec 10, issue 17).
    pub fn accepted_request(
        &self,
        sc: &SourceConfig,
        src: &dyn Source,
        req: &Request,
        a: Accepted,
        now: f64,
    ) -> Result<EnqueueRequest, Unroutable> {
        if a.key.len() > KEY_BYTES_MAX {
            return Err(Unroutable::KeyTooLong);
        }
        let resolved = self
            .route(&RouteQuery {
                source: sc,
                attrs: &a.attrs,
                event_action: a.action.as_deref(),
                destination: None,
            })
            .ok_or(Unroutable::NoRoute)?;
        Ok(EnqueueRequest {
            source: sc.name.clone(),
            key: a.key,
            event_type: a.event_type,
            dedup_id: a.dedup_id,
            dedup_window_s: sc.dedup_window_s,
            payload: Some(payload_text(src, req, &a.payload)),
            raw: sc.store_raw.then(|| req.body.clone()),
            headers: kept_headers(sc, src, req),
            primary: resolved.primary,
            tees: resolved.tees,
            quarantine: None,
            now,
        })
    }
}

/// The payload as stored: the body's own text when the source's payload is the body (no
/// second encoding, and a kept raw body is then stored once), else the payload encoded.
fn payload_text(src: &dyn Source, req: &Request, payload: &serde_json::Value) -> String {
    match std::str::from_utf8(&req.body) {
        Ok(text) if src.payload_is_body(req) => text.to_string(),
        _ => payload.to_string(),
    }
}

/// The source type's keep_headers plus the configured ones, never an auth header or a
/// credential (`headers`), as a JSON object of the values the request carries.
pub fn kept_headers(sc: &SourceConfig, src: &dyn Source, req: &Request) -> String {
    super::headers::kept_headers(&sc.keep_headers, src, req)
}
