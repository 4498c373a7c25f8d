//! OpenTelemetry traces (issue 35), off unless `[telemetry] otlp_endpoint` names a
//! collector: OTLP over HTTP (protobuf), one span per intake request (continuing the
//! sender's W3C `traceparent` when it sends a valid one), per batch and per delivery attempt.
//! The intake stores its span's `traceparent` with each event, so the dispatcher's batch and
//! attempt spans join the same trace, and each delivery carries its attempt's `traceparent`.
//!
//! Never blocking: a finished span goes into a bounded queue with `try_send`; when the queue
//! is full the span is dropped and counted ([`dropped_total`], `/metrics`). One thread of its
//! own drains the queue in batches and exports them with a deadline per export, so a slow or
//! absent collector delays only that thread, and spans it could not deliver are counted too.
//!
//! Attributes are names and numbers only (batch id, source, route, destination, outcome,
//! status): never a body, a header value, a URL or a secret.
//!
//! Must not: take a lock or do I/O on the caller's thread, or read config (callers pass the
//! settings).

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::time::{Duration, Instant, SystemTime};

use opentelemetry::trace::{
    Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt as _, TraceFlags, TraceId,
    TraceState, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider, SpanData, SpanExporter as _};

/// The default bound of the span queue.
pub const QUEUE_SPANS_DEFAULT: usize = 2048;
/// At most this many spans in one export request.
const EXPORT_BATCH_MAX: usize = 512;
/// A batch is exported at the latest this long after its first span.
const EXPORT_EVERY: Duration = Duration::from_secs(1);
/// One export request's deadline.
pub const EXPORT_TIMEOUT_S: u64 = 5;

static DROPPED_FULL: AtomicU64 = AtomicU64::new(0);
static DROPPED_EXPORT: AtomicU64 = AtomicU64::new(0);
static TRACER: OnceLock<(SdkTracerProvider, SdkTracer)> = OnceLock::new();

/// Spans dropped so far by this process: (queue full, export failed).
pub fn dropped_total() -> (u64, u64) {
    (
        DROPPED_FULL.load(Ordering::Relaxed),
        DROPPED_EXPORT.load(Ordering::Relaxed),
    )
}

/// Whether traces are on in this process.
pub fn enabled() -> bool {
    TRACER.get().is_some()
}

/// Turn traces on for this process, exporting to `endpoint` (`http://host:4318`; the
/// `/v1/traces` path is added), with at most `queue` spans waiting. A second call is a
/// no-op (the settings are read at start).
pub fn init(endpoint: &str, queue: usize) -> Result<(), String> {
    if TRACER.get().is_some() {
        return Ok(());
    }
    use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
    let client = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(EXPORT_TIMEOUT_S))
        .build()
        .map_err(|e| format!("telemetry: http client: {}", e.without_url()))?;
    let url = format!("{}/v1/traces", endpoint.trim_end_matches('/'));
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(Collector(client))
        .with_endpoint(url)
        .with_timeout(Duration::from_secs(EXPORT_TIMEOUT_S))
        .build()
        .map_err(|e| format!("telemetry: exporter: {e}"))?;
    let (tx, rx) = std::sync::mpsc::sync_channel(queue.max(1));
    std::thread::Builder::new()
        .name("hookspool-otlp".into())
        .spawn(move || export_loop(rx, exporter))
        .map_err(|e| format!("telemetry: export thread: {e}"))?;
    let provider = SdkTracerProvider::builder()
        .with_span_processor(Queue { tx })
        .with_id_generator(Ids::default())
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name("hookspool")
                .build(),
        )
        .build();
    let tracer = provider.tracer("hookspool");
    let _ = TRACER.set((provider, tracer));
    Ok(())
}

/// The export thread: batches of up to [`EXPORT_BATCH_MAX`] spans, at least every
/// [`EXPORT_EVERY`], each export bounded by [`EXPORT_TIMEOUT_S`].
fn export_loop(rx: Receiver<SpanData>, exporter: opentelemetry_otlp::SpanExporter) {
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return;
    };
    let mut batch = Vec::new();
    let mut since: Option<Instant> = None;
    loop {
        let wait = since.map_or(EXPORT_EVERY, |t| EXPORT_EVERY.saturating_sub(t.elapsed()));
        let closed = match rx.recv_timeout(wait) {
            Ok(s) => {
                since.get_or_insert_with(Instant::now);
                batch.push(s);
                false
            }
            Err(RecvTimeoutError::Timeout) => false,
            Err(RecvTimeoutError::Disconnected) => true,
        };
        let due = since.is_some_and(|t| t.elapsed() >= EXPORT_EVERY);
        if !batch.is_empty() && (closed || due || batch.len() >= EXPORT_BATCH_MAX) {
            let n = batch.len() as u64;
            let spans = std::mem::take(&mut batch);
            since = None;
            let r = rt.block_on(async {
                tokio::time::timeout(
                    Duration::from_secs(EXPORT_TIMEOUT_S + 1),
                    exporter.export(spans),
                )
                .await
            });
            if !matches!(r, Ok(Ok(()))) {
                DROPPED_EXPORT.fetch_add(n, Ordering::Relaxed);
            }
        }
        if closed {
            return;
        }
    }
}

/// The span processor: hands each finished span to the export thread without waiting.
#[derive(Debug)]
struct Queue {
    tx: SyncSender<SpanData>,
}

impl opentelemetry_sdk::trace::SpanProcessor for Queue {
    fn on_start(&self, _span: &mut opentelemetry_sdk::trace::Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        match self.tx.try_send(span) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                DROPPED_FULL.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}

/// The exporter's HTTP client: reqwest without proxies or redirects, with a deadline.
#[derive(Debug)]
struct Collector(reqwest::Client);

impl opentelemetry_http::HttpClient for Collector {
    fn send_bytes<'a, 'b>(
        &'a self,
        request: opentelemetry_http::Request<opentelemetry_http::Bytes>,
    ) -> std::pin::Pin<
        Box<
            dyn std::future::Future<
                    Output = Result<
                        opentelemetry_http::Response<opentelemetry_http::Bytes>,
                        opentelemetry_http::HttpError,
                    >,
                > + Send
                + 'b,
        >,
    >
    where
        'a: 'b,
        Self: 'b,
    {
        Box::pin(async move {
            let req = reqwest::Request::try_from(request)?;
            let resp = self.0.execute(req).await?;
            let status = resp.status();
            let body = resp.bytes().await?;
            let mut out = opentelemetry_http::Response::new(body);
            *out.status_mut() = status;
            Ok(out)
        })
    }
}

/// A W3C `traceparent` value's span context (remote, as a parent), if it is valid.
pub fn parse_traceparent(v: &str) -> Option<SpanContext> {
    let mut parts = v.trim().split('-');
    let (version, trace, span, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if version.len() != 2
        || version == "ff"
        || trace.len() != 32
        || span.len() != 16
        || flags.len() != 2
    {
        return None;
    }
    if version == "00" && parts.next().is_some() {
        return None;
    }
    let trace_id = TraceId::from_hex(trace).ok()?;
    let span_id = SpanId::from_hex(span).ok()?;
    let flags = u8::from_str_radix(flags, 16).ok()?;
    let sc = SpanContext::new(
        trace_id,
        span_id,
        TraceFlags::new(flags & 1),
        true,
        TraceState::default(),
    );
    sc.is_valid().then_some(sc)
}

/// The W3C `traceparent` value of a span context.
pub fn traceparent(sc: &SpanContext) -> String {
    format!(
        "00-{}-{}-{:02x}",
        sc.trace_id(),
        sc.span_id(),
        sc.trace_flags().to_u8()
    )
}

/// The batch span's id, derived from its trace and the batch id, so attempts (in any
/// process, before the batch span is written at its end) can name it as their parent.
pub fn batch_span_id(trace: TraceId, batch_id: i64) -> SpanId {
    use sha2::Digest as _;
    let mut h = sha2::Sha256::new();
    h.update(trace.to_bytes());
    h.update(batch_id.to_be_bytes());
    let d = h.finalize();
    let mut b = [0u8; 8];
    b.copy_from_slice(&d[..8]);
    if b == [0; 8] {
        b[7] = 1;
    }
    SpanId::from_bytes(b)
}

/// The batch span's context under the intake span `intake` (a parent for attempts).
pub fn batch_context(intake: &SpanContext, batch_id: i64) -> SpanContext {
    SpanContext::new(
        intake.trace_id(),
        batch_span_id(intake.trace_id(), batch_id),
        intake.trace_flags(),
        true,
        TraceState::default(),
    )
}

/// A started span; ends (and is queued) when [`Span::end`] is called or it is dropped.
pub struct Span {
    inner: opentelemetry_sdk::trace::Span,
}

impl std::fmt::Debug for Span {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Span").finish_non_exhaustive()
    }
}

impl Span {
    pub fn context(&self) -> SpanContext {
        self.inner.span_context().clone()
    }

    pub fn traceparent(&self) -> String {
        traceparent(self.inner.span_context())
    }

    /// Set one attribute (a name or a number, never a value from a request).
    pub fn set(&mut self, key: &'static str, value: impl Into<opentelemetry::Value>) {
        self.inner.set_attribute(KeyValue::new(key, value));
    }

    pub fn error(&mut self, description: &'static str) {
        self.inner.set_status(Status::error(description));
    }

    pub fn end(mut self) {
        self.inner.end();
    }
}

/// Start a span named `name` under `parent` (a new trace without one); `None` when traces
/// are off.
pub fn start(name: &'static str, kind: SpanKind, parent: Option<&SpanContext>) -> Option<Span> {
    start_at(name, kind, parent, None, None)
}

/// [`start`] with a start time and a span id of the caller's (the batch span).
pub fn start_at(
    name: &'static str,
    kind: SpanKind,
    parent: Option<&SpanContext>,
    at: Option<SystemTime>,
    span_id: Option<SpanId>,
) -> Option<Span> {
    let (_, tracer) = TRACER.get()?;
    let cx = match parent {
        Some(p) => Context::new().with_remote_span_context(p.clone()),
        None => Context::new(),
    };
    let mut b = tracer.span_builder(name).with_kind(kind);
    b.start_time = at;
    NEXT_SPAN_ID.with(|n| n.set(span_id));
    let inner = tracer.build_with_context(b, &cx);
    NEXT_SPAN_ID.with(|n| n.set(None));
    Some(Span { inner })
}

thread_local! {
    /// The span id [`Ids`] hands out next, when a caller chose one (the batch span).
    static NEXT_SPAN_ID: std::cell::Cell<Option<SpanId>> = const { std::cell::Cell::new(None) };
}

/// Random ids, except a span id chosen by [`start_at`]'s caller on this thread.
#[derive(Debug, Default)]
struct Ids(opentelemetry_sdk::trace::RandomIdGenerator);

impl opentelemetry_sdk::trace::IdGenerator for Ids {
    fn new_trace_id(&self) -> TraceId {
        self.0.new_trace_id()
    }

    fn new_span_id(&self) -> SpanId {
        NEXT_SPAN_ID
            .with(|n| n.take())
            .unwrap_or_else(|| self.0.new_span_id())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_round_trips_and_rejects_garbage() {
        let v = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let sc = parse_traceparent(v).expect("valid");
        assert_eq!(traceparent(&sc), v);
        assert!(sc.is_remote() && sc.is_sampled());
        for bad in [
            "",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
            "00-zzf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert!(parse_traceparent(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn the_batch_span_id_is_stable_per_trace_and_batch() {
        let t = TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").expect("hex");
        assert_eq!(batch_span_id(t, 7), batch_span_id(t, 7));
        assert_ne!(batch_span_id(t, 7), batch_span_id(t, 8));
        assert_ne!(batch_span_id(t, 7), SpanId::INVALID);
    }
}
