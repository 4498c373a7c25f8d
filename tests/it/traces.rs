//! OpenTelemetry traces through the real binary (issue 35): an OTLP/HTTP collector in the
//! test (a hyper server on 127.0.0.1:0 decoding each export with the opentelemetry-proto
//! definitions) receives, for one signed webhook sent with a `traceparent`, the intake span
//! (continuing the sender's trace, its parent the sender's span), the attempt span (its
//! parent the batch span) and the batch span (its parent the intake span), with the batch
//! id, source, route, destination and outcome; the delivery carries the attempt's
//! `traceparent`; no export holds the payload's sentinel, a secret or a header value. With
//! the collector answering nothing and a queue of 4, spans are dropped and counted in
//! /metrics while the intake answers as before (its latencies with and without a dead
//! collector are printed, same run).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;

use super::intake::{get, raw, request};
use super::receiver::Receiver;
use super::run_e2e::{RunProc, free_port};

const SOURCE_SECRET: &str = "traces-source-SECRET-sentinel";
const DEST_SECRET: &str = "whsec_dHJhY2VzLWRlc3QtU0VDUkVULXNlbnRpbmVs";
const SENTINEL: &str = "PAYLOAD-SENTINEL-4242";
const SENDER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const SENDER_SPAN: &str = "00f067aa0ba902b7";

/// The collector: every export body, raw, and its spans decoded.
#[derive(Clone, Default)]
struct Collector {
    raw: Arc<Mutex<Vec<Vec<u8>>>>,
    spans: Arc<Mutex<Vec<Span>>>,
}

impl Collector {
    async fn start() -> (SocketAddr, Collector) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let c = Collector::default();
        let cc = c.clone();
        tokio::spawn(async move {
            while let Ok((s, _)) = l.accept().await {
                let cc = cc.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req: Request<Incoming>| {
                        let cc = cc.clone();
                        async move {
                            let path = req.uri().path().to_string();
                            let body = req.into_body().collect().await.unwrap().to_bytes();
                            assert_eq!(path, "/v1/traces");
                            let decoded = ExportTraceServiceRequest::decode(body.as_ref())
                                .expect("an OTLP protobuf export");
                            cc.raw.lock().unwrap().push(body.to_vec());
                            for rs in decoded.resource_spans {
                                for ss in rs.scope_spans {
                                    cc.spans.lock().unwrap().extend(ss.spans);
                                }
                            }
                            Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(s), svc)
                        .await;
                });
            }
        });
        (addr, c)
    }

    fn named(&self, name: &str) -> Vec<Span> {
        self.spans
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.name == name)
            .cloned()
            .collect()
    }
}

fn attr(s: &Span, key: &str) -> Option<String> {
    s.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref()?.value.as_ref())
        .map(|v| match v {
            Value::StringValue(s) => s.clone(),
            Value::IntValue(i) => i.to_string(),
            other => format!("{other:?}"),
        })
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn write_config(home: &std::path::Path, port: u16, rx: &str, telemetry: &str) {
    std::fs::write(home.join("source.secret"), SOURCE_SECRET).unwrap();
    std::fs::write(home.join("dest.secret"), DEST_SECRET).unwrap();
    std::fs::write(
        home.join("config.toml"),
        format!(
            r#"
[intake]
listen = "127.0.0.1:{port}"
[limits]
min_free_bytes = 0
[dispatch]
poll_s = 0.2
heartbeat_s = 0.2
{telemetry}
[sources.hooks]
type = "template"
scheme = "hmac-sha256-hex"
header = "X-Signature"
prefix = "sha256="
key = "payload.topic"
quiet_s = 0
max_s = 0
keep_headers = ["x-custom"]
action = "recv"
secrets.secret = {{ file = "{home}/source.secret" }}
[destinations.recv]
type = "http"
url = "{rx}"
allow_insecure = true
allow_private = ["127.0.0.1/32"]
secret = {{ file = "{home}/dest.secret" }}
"#,
            home = home.display()
        ),
    )
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_webhook_is_one_trace_from_the_sender_to_the_delivery() {
    let (collector_addr, collector) = Collector::start().await;
    let rx = Receiver::start().await;
    let home = tempfile::tempdir().unwrap();
    let port = free_port();
    write_config(
        home.path(),
        port,
        &rx.url(),
        &format!("[telemetry]\notlp_endpoint = \"http://{collector_addr}\""),
    );
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let p = tokio::task::block_in_place(|| RunProc::start(home.path(), addr, &[]));
    let body = format!(r#"{{"topic":"t","note":"{SENTINEL}"}}"#);
    let sender = format!("00-{SENDER_TRACE}-{SENDER_SPAN}-01");
    let r = tokio::task::block_in_place(|| {
        p.post(
            "hooks",
            SOURCE_SECRET.as_bytes(),
            body.as_bytes(),
            &[("traceparent", &sender), ("X-Custom", "HEADER-SENTINEL-77")],
        )
    });
    assert_eq!(r.status, 200);
    let got = rx.wait_for(1, Duration::from_secs(20)).await;
    assert_eq!(got.len(), 1);
    let delivered_tp = got[0]
        .header("traceparent")
        .expect("a traceparent on the delivery")
        .to_string();
    assert!(
        delivered_tp.starts_with(&format!("00-{SENDER_TRACE}-")),
        "{delivered_tp}"
    );

    let until = Instant::now() + Duration::from_secs(20);
    while Instant::now() < until
        && (collector.named("hookspool.intake").is_empty()
            || collector.named("hookspool.attempt").is_empty()
            || collector.named("hookspool.batch").is_empty())
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let intake = collector.named("hookspool.intake");
    let attempt = collector.named("hookspool.attempt");
    let batch = collector.named("hookspool.batch");
    assert_eq!(
        (intake.len(), attempt.len(), batch.len()),
        (1, 1, 1),
        "{:#?}",
        collector.spans.lock().unwrap()
    );
    let (intake, attempt, batch) = (&intake[0], &attempt[0], &batch[0]);
    for s in [intake, attempt, batch] {
        assert_eq!(
            hex(&s.trace_id),
            SENDER_TRACE,
            "{} continues the sender's trace",
            s.name
        );
    }
    assert_eq!(
        hex(&intake.parent_span_id),
        SENDER_SPAN,
        "the intake span's parent is the sender's"
    );
    assert_eq!(
        batch.parent_span_id, intake.span_id,
        "the batch span's parent is the intake span"
    );
    assert_eq!(
        attempt.parent_span_id, batch.span_id,
        "the attempt span's parent is the batch span"
    );
    assert_eq!(
        delivered_tp,
        format!("00-{SENDER_TRACE}-{}-01", hex(&attempt.span_id)),
        "the delivery carries the attempt span"
    );
    let batch_id = attr(attempt, "hookspool.batch_id").expect("batch id");
    assert_eq!(
        attr(intake, "hookspool.batch_id").as_deref(),
        Some(batch_id.as_str())
    );
    assert_eq!(
        attr(batch, "hookspool.batch_id").as_deref(),
        Some(batch_id.as_str())
    );
    assert_eq!(attr(intake, "hookspool.source").as_deref(), Some("hooks"));
    assert_eq!(
        attr(intake, "http.response.status_code").as_deref(),
        Some("200")
    );
    for s in [attempt, batch] {
        assert_eq!(attr(s, "hookspool.source").as_deref(), Some("hooks"));
        assert_eq!(attr(s, "hookspool.route").as_deref(), Some("hooks"));
        assert_eq!(attr(s, "hookspool.destination").as_deref(), Some("recv"));
        assert_eq!(attr(s, "hookspool.outcome").as_deref(), Some("ok"));
    }
    // Nothing from the payload, the headers or the secrets in any export.
    let raw = collector.raw.lock().unwrap().concat();
    let text = String::from_utf8_lossy(&raw);
    for planted in [
        SENTINEL,
        "HEADER-SENTINEL-77",
        SOURCE_SECRET,
        DEST_SECRET,
        "dHJhY2VzLWRlc3Qt",
    ] {
        assert!(!text.contains(planted), "{planted} reached the collector");
    }
    drop(p);
}

/// The collector accepts connections and never answers; the span queue holds 4. The intake
/// keeps answering, spans are dropped and counted on /metrics; the request latencies with a
/// dead collector and without traces are printed side by side (same run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_collector_drops_spans_and_counts_them_and_never_blocks_the_intake() {
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_addr = dead.local_addr().unwrap();
    let held = Arc::new(Mutex::new(Vec::new()));
    let h = held.clone();
    std::thread::spawn(move || {
        for s in dead.incoming().flatten() {
            h.lock().unwrap().push(s);
        }
    });
    let rx = Receiver::start().await;
    let mut figures = Vec::new();
    let mut dropped = 0;
    for (label, telemetry) in [
        ("no traces", String::new()),
        (
            "dead collector",
            format!("[telemetry]\notlp_endpoint = \"http://{dead_addr}\"\nqueue_spans = 4"),
        ),
    ] {
        let home = tempfile::tempdir().unwrap();
        let port = free_port();
        write_config(home.path(), port, &rx.url(), &telemetry);
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let p = tokio::task::block_in_place(|| RunProc::start(home.path(), addr, &[]));
        let mut lat = Vec::new();
        let mut took = Duration::ZERO;
        tokio::task::block_in_place(|| {
            // One request first, then a pause past the export interval: the export thread
            // is then stuck on the dead collector, and the queue of 4 fills.
            let r = p.post(
                "hooks",
                SOURCE_SECRET.as_bytes(),
                br#"{"topic":"first"}"#,
                &[],
            );
            assert_eq!(r.status, 200);
            std::thread::sleep(Duration::from_millis(1500));
            let all = Instant::now();
            for i in 0..200 {
                let body = format!(r#"{{"topic":"t{}","n":{i}}}"#, i % 10);
                let t = Instant::now();
                let r = p.post("hooks", SOURCE_SECRET.as_bytes(), body.as_bytes(), &[]);
                lat.push(t.elapsed());
                assert_eq!(r.status, 200, "{label}");
            }
            took = all.elapsed();
        });
        lat.sort();
        let p50 = lat[lat.len() / 2];
        let p99 = lat[lat.len() * 99 / 100];
        figures.push((label, p50, p99, 200.0 / took.as_secs_f64()));
        if !telemetry.is_empty() {
            let page = get(addr, "/metrics");
            let text = String::from_utf8_lossy(&page.body).to_string();
            dropped = super::observe::series(
                &text,
                "hookspool_trace_spans_dropped_total{process=\"run\",reason=\"queue_full\"}",
            )
            .or_else(|| {
                super::observe::series(
                    &text,
                    "hookspool_trace_spans_dropped_total{process=\"intake\",reason=\"queue_full\"}",
                )
            })
            .unwrap_or(0);
            super::observe::promtool_check(&text);
            let _ = raw(addr, &request("GET", "/healthz", &[], b""));
        }
        drop(p);
    }
    for (label, p50, p99, rate) in &figures {
        println!(
            "intake, {label}: p50 {p50:?} p99 {p99:?}, {rate:.0} requests/s (200 signed requests, one client)"
        );
    }
    println!(
        "p99 ratio dead collector / no traces: {:.2}",
        figures[1].2.as_secs_f64() / figures[0].2.as_secs_f64()
    );
    println!(
        "throughput ratio dead collector / no traces: {:.2}",
        figures[1].3 / figures[0].3
    );
    assert!(
        dropped >= 190,
        "at least the 200 intake spans past a queue of 4, less what the export thread took: {dropped}"
    );
}
