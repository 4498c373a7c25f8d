//! Logging (spec 11.3; RUST-ADAPTATION "journald fields"): one `tracing` subscriber per
//! process, chosen once by [`init`].
//!
//! * Under systemd (JOURNAL_STREAM set, or the journal socket present for a service
//!   component) records go to journald natively through tracing-journald, with
//!   `with_field_prefix(None)` so the code's lowercase fields arrive as the journal fields
//!   COMPONENT, SOURCE, ROUTE, BATCH, EVENT, DESTINATION, ATTEMPT, STATUS, BYTES,
//!   DURATION_MS, REASON, TEE (tracing-journald upper-cases field names and sends only the
//!   fields an event has), plus PRIORITY (error 3, warn 4, info 6, debug 7) and
//!   SYSLOG_IDENTIFIER=hookspool. The process's component is a custom COMPONENT field; code
//!   logs a `component` field only where one process hosts two (`hookspool run`).
//! * Otherwise text lines on stderr, or with HOOKSPOOL_LOG=json one JSON object per line
//!   with the fixed fields ts, level, component, msg and those of [`LOG_FIELDS`] present.
//!
//! The convention for every log call in the crate: use the field names of [`LOG_FIELDS`]
//! (`batch = id`, `destination = %name`, ...) and never a body, header value, secret or
//! query string, at any level. There is no level that prints bodies.
//!
//! HOOKSPOOL_LOG_LEVEL takes an EnvFilter directive (default `info`; `warn` for the CLI).

use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::Context;
use tracing_subscriber::prelude::*;
use tracing_subscriber::registry::LookupSpan;

/// The structured fields of spec 11.3, in the order text output prints them.
pub const LOG_FIELDS: [&str; 12] = [
    "component",
    "source",
    "route",
    "batch",
    "event",
    "destination",
    "attempt",
    "status",
    "bytes",
    "duration_ms",
    "reason",
    "tee",
];
/// journald's native socket (sd-journal protocol).
pub const JOURNAL_SOCKET: &str = "/run/systemd/journal/socket";
pub const SYSLOG_IDENTIFIER: &str = "hookspool";
pub const LOG_FORMAT_ENV: &str = "HOOKSPOOL_LOG";
pub const LOG_LEVEL_ENV: &str = "HOOKSPOOL_LOG_LEVEL";

/// Where records went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sink {
    Journald,
    Json,
    Text,
}

/// Whether records should go to journald: a service's stdout/stderr is the journal
/// (JOURNAL_STREAM), or, for the services only, the journal socket exists. An operator's
/// interactive CLI keeps its warnings on the terminal.
pub fn under_systemd(component: &str) -> bool {
    std::env::var_os("JOURNAL_STREAM").is_some_and(|v| !v.is_empty())
        || (component != "cli" && Path::new(JOURNAL_SOCKET).exists())
}

/// Install the process's subscriber. Safe to call twice (the second call changes nothing).
pub fn init(component: &'static str) -> Sink {
    let default = if component == "cli" { "warn" } else { "info" };
    let filter = || {
        tracing_subscriber::EnvFilter::try_from_env(LOG_LEVEL_ENV)
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default))
    };
    if under_systemd(component)
        && let Ok(layer) = journald_layer(component)
    {
        let _ = tracing_subscriber::registry()
            .with(layer.with_filter(filter()))
            .try_init();
        return Sink::Journald;
    }
    // tracing-journald's layer() fails when the socket is absent: fall back to stderr.
    let json = std::env::var(LOG_FORMAT_ENV).is_ok_and(|v| v.eq_ignore_ascii_case("json"));
    let sink = if json { Sink::Json } else { Sink::Text };
    let layer = LineLayer::new(component, sink, Box::new(std::io::stderr()));
    let _ = tracing_subscriber::registry()
        .with(layer.with_filter(filter()))
        .try_init();
    sink
}

/// The journald layer as [`init`] configures it.
pub fn journald_layer(component: &str) -> std::io::Result<tracing_journald::Layer> {
    let mut priorities = tracing_journald::PriorityMappings::new();
    priorities.info = tracing_journald::Priority::Informational;
    priorities.debug = tracing_journald::Priority::Debug;
    Ok(tracing_journald::layer()?
        .with_field_prefix(None)
        .with_syslog_identifier(SYSLOG_IDENTIFIER.to_string())
        .with_priority_mappings(priorities)
        .with_custom_fields([("COMPONENT", component)]))
}

/// Fields collected from an event and its spans, in arrival order.
#[derive(Debug, Default, Clone)]
struct Fields {
    message: Option<String>,
    pairs: Vec<(String, Value)>,
}

impl Fields {
    fn put(&mut self, name: &str, v: Value) {
        if name == "message" {
            self.message = Some(match v {
                Value::String(s) => s,
                other => other.to_string(),
            });
            return;
        }
        match self.pairs.iter_mut().find(|(k, _)| k == name) {
            Some(slot) => slot.1 = v,
            None => self.pairs.push((name.to_string(), v)),
        }
    }
}

impl Visit for Fields {
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field.name(), Value::from(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field.name(), Value::from(value));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field.name(), Value::from(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field.name(), Value::from(value));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field.name(), Value::from(value));
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.put(field.name(), Value::from(format!("{value:?}")));
    }
}

/// Text or JSON lines to a writer (stderr in production, a buffer in tests).
pub struct LineLayer {
    component: &'static str,
    sink: Sink,
    out: Mutex<Box<dyn Write + Send>>,
}

impl LineLayer {
    pub fn new(component: &'static str, sink: Sink, out: Box<dyn Write + Send>) -> LineLayer {
        LineLayer {
            component,
            sink,
            out: Mutex::new(out),
        }
    }

    /// The line for one event (without the newline).
    fn line(&self, level: &Level, fields: &Fields, ts: &str) -> String {
        let component = fields
            .pairs
            .iter()
            .find(|(k, _)| k == "component")
            .and_then(|(_, v)| v.as_str().map(str::to_string))
            .unwrap_or_else(|| self.component.to_string());
        let msg = fields.message.clone().unwrap_or_default();
        let rest = fields.pairs.iter().filter(|(k, _)| k != "component");
        match self.sink {
            Sink::Json => {
                let mut m = Map::new();
                m.insert("ts".into(), Value::from(ts));
                m.insert(
                    "level".into(),
                    Value::from(level.as_str().to_ascii_lowercase()),
                );
                m.insert("component".into(), Value::from(component));
                m.insert("msg".into(), Value::from(msg));
                for (k, v) in rest {
                    m.insert(k.clone(), v.clone());
                }
                Value::Object(m).to_string()
            }
            Sink::Text | Sink::Journald => {
                let mut line = format!("{ts} {:<5} {component}: {msg}", level.as_str());
                let mut ordered: Vec<&(String, Value)> = rest.collect();
                ordered.sort_by_key(|(k, _)| {
                    LOG_FIELDS
                        .iter()
                        .position(|f| f == k)
                        .unwrap_or(LOG_FIELDS.len())
                });
                for (k, v) in ordered {
                    match v {
                        Value::String(s) => line.push_str(&format!(" {k}={s}")),
                        other => line.push_str(&format!(" {k}={other}")),
                    }
                }
                line
            }
        }
    }
}

impl<S> Layer<S> for LineLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        ctx: Context<'_, S>,
    ) {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(fields);
        }
    }

    fn on_record(
        &self,
        id: &tracing::span::Id,
        values: &tracing::span::Record<'_>,
        ctx: Context<'_, S>,
    ) {
        if let Some(span) = ctx.span(id)
            && let Some(fields) = span.extensions_mut().get_mut::<Fields>()
        {
            values.record(fields);
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        if let Some(scope) = ctx.event_scope(event) {
            for span in scope.from_root() {
                if let Some(f) = span.extensions().get::<Fields>() {
                    for (k, v) in &f.pairs {
                        fields.put(k, v.clone());
                    }
                }
            }
        }
        event.record(&mut fields);
        let ts = humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string();
        let line = self.line(event.metadata().level(), &fields, &ts);
        // A poisoned lock means another thread panicked mid-write; the writer is still usable.
        let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        // Logging must never take the process down: a failed write to stderr is dropped.
        let _ = writeln!(out, "{line}");
    }
}

/// A cloneable in-memory writer: what tests capture log lines with, and the kit the
/// processor's log lines it scans for secrets.
#[derive(Clone, Default)]
pub struct SharedBuf(pub Arc<Mutex<Vec<u8>>>);

impl SharedBuf {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|p| p.into_inner())).into_owned()
    }
}

impl Write for SharedBuf {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Run `f` with a thread-local subscriber that writes `sink` lines into the returned buffer
/// (tests: the JSON/text format, and the sentinel checks over everything logged).
pub fn capture<T>(component: &'static str, sink: Sink, f: impl FnOnce() -> T) -> (T, String) {
    let buf = SharedBuf::default();
    let layer = LineLayer::new(component, sink, Box::new(buf.clone()));
    let subscriber = tracing_subscriber::registry().with(layer);
    let out = tracing::subscriber::with_default(subscriber, f);
    (out, buf.text())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_lines_carry_the_fixed_fields_present() {
        let ((), text) = capture("dispatch", Sink::Json, || {
            tracing::info!(
                source = "github",
                route = "github-ci",
                batch = 12_i64,
                event = 40_i64,
                destination = "hermes:github-ci",
                attempt = 2_i64,
                status = 200_i64,
                bytes = 1234_i64,
                duration_ms = 15_i64,
                reason = "ok",
                tee = false,
                "delivered"
            );
            let span = tracing::info_span!("batch", batch = 7_i64);
            let _g = span.enter();
            tracing::warn!(component = "intake", "queued");
        });
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
            .collect();
        assert_eq!(lines.len(), 2, "{text}");
        let a = &lines[0];
        assert_eq!(a["level"], "info");
        assert_eq!(a["component"], "dispatch");
        assert_eq!(a["msg"], "delivered");
        assert_eq!(a["batch"], 12);
        assert_eq!(a["event"], 40);
        assert_eq!(a["destination"], "hermes:github-ci");
        assert_eq!(a["duration_ms"], 15);
        assert_eq!(a["tee"], false);
        assert!(a["ts"].as_str().is_some_and(|t| t.ends_with('Z')), "{a}");
        let b = &lines[1];
        assert_eq!(b["component"], "intake", "an event's component wins");
        assert_eq!(b["batch"], 7, "span fields are carried");
        assert_eq!(b["level"], "warn");
        assert!(b.get("source").is_none(), "only present fields");
    }

    #[test]
    fn text_lines_order_the_fields() {
        let ((), text) = capture("intake", Sink::Text, || {
            tracing::info!(tee = true, batch = 3_i64, source = "zoom", "queued");
        });
        let line = text.trim_end();
        assert!(
            line.ends_with("INFO  intake: queued source=zoom batch=3 tee=true"),
            "{line}"
        );
    }
}
