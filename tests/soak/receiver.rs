//! The flapping receiver: one hyper server on 127.0.0.1 (the bridge's address with
//! `--hosts`) that every http destination of the soak points at, whose behaviour the orchestrator switches between answering 200,
//! answering 500, refusing connections (its listener closed and every open connection
//! dropped) and answering too slowly (past the destination's timeout_s).
//!
//! It checks each delivery's Standard Webhooks signature with its own HMAC (not the
//! product's signer) and records every document it reads, with how it answered, for the
//! checker (`verdict`) and in `deliveries.jsonl` for a post-mortem.

use std::collections::HashMap;
use std::convert::Infallible;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use hmac::{Hmac, KeyInit, Mac};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use sha2::Sha256;
use tokio::sync::watch;

use super::verdict::{Answer, Doc, DocEvent};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    Ok,
    Fail500,
    Refuse,
    Slow,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Ok => "200",
            Mode::Fail500 => "500",
            Mode::Refuse => "refused",
            Mode::Slow => "slow",
        }
    }
}

/// What the receiver counted.
#[derive(Default)]
pub struct Counters {
    pub requests: AtomicU64,
    pub answered_200: AtomicU64,
    pub answered_500: AtomicU64,
    pub answered_slow: AtomicU64,
    pub bad_signatures: AtomicU64,
    pub unreadable: AtomicU64,
    pub refused_phases: AtomicU64,
}

struct Shared {
    key: Vec<u8>,
    slow: Duration,
    started: Instant,
    docs: Mutex<Vec<Doc>>,
    log: Mutex<std::io::BufWriter<std::fs::File>>,
    /// Event sizes as the sender sent them, by dedup id (the spool's `size`).
    sizes: Arc<Mutex<HashMap<String, usize>>>,
    counters: Counters,
}

pub struct Receiver {
    pub port: u16,
    mode: watch::Sender<Mode>,
    shared: Arc<Shared>,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl Receiver {
    /// Bind `ip`:0 and serve on the runtime of the caller. `secret` is the destination's
    /// `whsec_` secret; `slow` how long a slow answer takes.
    pub async fn start(
        ip: std::net::IpAddr,
        secret: &str,
        slow: Duration,
        started: Instant,
        log: std::fs::File,
        sizes: Arc<Mutex<HashMap<String, usize>>>,
    ) -> Result<Receiver, BoxError> {
        let b64 = secret
            .trim()
            .strip_prefix("whsec_")
            .ok_or("the destination secret is not a whsec_ secret")?;
        let key = STANDARD.decode(b64)?;
        let listener = tokio::net::TcpListener::bind((ip, 0)).await?;
        let port = listener.local_addr()?.port();
        let (mode, rx) = watch::channel(Mode::Ok);
        let shared = Arc::new(Shared {
            key,
            slow,
            started,
            docs: Mutex::new(Vec::new()),
            log: Mutex::new(std::io::BufWriter::new(log)),
            sizes,
            counters: Counters::default(),
        });
        tokio::spawn(accept_loop(listener, ip, port, rx, shared.clone()));
        Ok(Receiver { port, mode, shared })
    }

    pub fn set_mode(&self, m: Mode) {
        if m == Mode::Refuse && *self.mode.borrow() != Mode::Refuse {
            self.shared
                .counters
                .refused_phases
                .fetch_add(1, Ordering::Relaxed);
        }
        self.mode.send_replace(m);
    }

    pub fn counters(&self) -> &Counters {
        &self.shared.counters
    }

    /// Every document read so far, in order.
    pub fn docs(&self) -> Vec<Doc> {
        lock(&self.shared.docs).clone()
    }

    pub fn flush_log(&self) {
        // The log is for a post-mortem; the checker reads the documents in memory.
        let _ = lock(&self.shared.log).flush();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

async fn accept_loop(
    first: tokio::net::TcpListener,
    ip: std::net::IpAddr,
    port: u16,
    mut rx: watch::Receiver<Mode>,
    shared: Arc<Shared>,
) {
    let mut listener = Some(first);
    loop {
        let l = match listener.take() {
            Some(l) => l,
            None => {
                // Refusing: no listener until the mode changes, then bind the same port again.
                while *rx.borrow_and_update() == Mode::Refuse {
                    if rx.changed().await.is_err() {
                        return;
                    }
                }
                match tokio::net::TcpListener::bind((ip, port)).await {
                    Ok(l) => l,
                    Err(e) => {
                        eprintln!("soak receiver: rebinding {ip}:{port}: {e}; retrying");
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        continue;
                    }
                }
            }
        };
        loop {
            tokio::select! {
                a = l.accept() => {
                    let Ok((stream, _)) = a else { continue };
                    let _ = stream.set_nodelay(true);
                    tokio::spawn(connection(stream, rx.clone(), shared.clone()));
                }
                c = rx.changed() => {
                    if c.is_err() {
                        return;
                    }
                    if *rx.borrow_and_update() == Mode::Refuse {
                        break;
                    }
                }
            }
        }
        // Dropping `l` closes the listening socket: new connections are refused.
    }
}

async fn connection(
    stream: tokio::net::TcpStream,
    mut rx: watch::Receiver<Mode>,
    shared: Arc<Shared>,
) {
    let modes = rx.clone();
    let svc = service_fn(move |req: Request<Incoming>| {
        let shared = shared.clone();
        let modes = modes.clone();
        async move { Ok::<_, Infallible>(handle(req, modes, shared).await) }
    });
    let conn =
        hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc);
    // A refusing receiver drops every open connection too, so the dispatcher's pooled
    // connections fail as a fresh connect would.
    tokio::select! {
        _ = conn => {}
        _ = async {
            loop {
                if *rx.borrow_and_update() == Mode::Refuse {
                    return;
                }
                if rx.changed().await.is_err() {
                    return;
                }
            }
        } => {}
    }
}

fn answer(status: u16) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::new()));
    *r.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::OK);
    r
}

async fn handle(
    req: Request<Incoming>,
    modes: watch::Receiver<Mode>,
    shared: Arc<Shared>,
) -> Response<Full<Bytes>> {
    let c = &shared.counters;
    c.requests.fetch_add(1, Ordering::Relaxed);
    let header = |n: &str| {
        req.headers()
            .get(n)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    let (id, ts, sig) = (
        header("webhook-id"),
        header("webhook-timestamp"),
        header("webhook-signature"),
    );
    let Ok(body) = req.into_body().collect().await.map(|b| b.to_bytes()) else {
        c.unreadable.fetch_add(1, Ordering::Relaxed);
        return answer(400);
    };
    // The mode when the document has arrived decides the answer.
    let mode = *modes.borrow();
    if !signature_ok(&shared.key, &id, &ts, &body, &sig) {
        c.bad_signatures.fetch_add(1, Ordering::Relaxed);
        record(&shared, &body, Answer::Refused, "bad-signature");
        return answer(401);
    }
    match mode {
        Mode::Ok => {
            if !record(&shared, &body, Answer::Ok, "200") {
                c.unreadable.fetch_add(1, Ordering::Relaxed);
                return answer(400);
            }
            c.answered_200.fetch_add(1, Ordering::Relaxed);
            answer(200)
        }
        // A connection accepted just before the listener closed is answered like a failure.
        Mode::Fail500 | Mode::Refuse => {
            record(&shared, &body, Answer::Refused, "500");
            c.answered_500.fetch_add(1, Ordering::Relaxed);
            answer(500)
        }
        Mode::Slow => {
            record(&shared, &body, Answer::Refused, "slow");
            c.answered_slow.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(shared.slow).await;
            answer(200)
        }
    }
}

/// Standard Webhooks v1: base64(HMAC-SHA256(key, "<id>.<ts>.<body>")), any of the
/// space-separated entries.
fn signature_ok(key: &[u8], id: &str, ts: &str, body: &[u8], header: &str) -> bool {
    let Ok(mut mac) = <Hmac<Sha256> as KeyInit>::new_from_slice(key) else {
        return false;
    };
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(ts.as_bytes());
    mac.update(b".");
    mac.update(body);
    let want = STANDARD.encode(mac.finalize().into_bytes());
    !id.is_empty()
        && header
            .split(' ')
            .filter_map(|e| e.strip_prefix("v1,"))
            .any(|s| s == want)
}

/// Parse a document and keep it; false when it is not one.
fn record(shared: &Shared, body: &[u8], answer: Answer, how: &str) -> bool {
    let Some(doc) = parse(body, answer, &lock(&shared.sizes)) else {
        return false;
    };
    let at = shared.started.elapsed().as_secs_f64();
    let line = serde_json::json!({
        "at_s": (at * 1000.0).round() / 1000.0,
        "answer": how,
        "route": doc.route,
        "key": doc.key,
        "batch_id": doc.batch_id,
        "content_hash": doc.content_hash,
        "count": doc.count,
        "events": doc.events.iter().map(|e| e.id.as_str()).collect::<Vec<_>>(),
    });
    {
        let mut log = lock(&shared.log);
        // Best effort: the record that matters is in memory.
        let _ = writeln!(log, "{line}");
    }
    lock(&shared.docs).push(doc);
    true
}

fn parse(body: &[u8], answer: Answer, sizes: &HashMap<String, usize>) -> Option<Doc> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let s = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
    let payloads = v.get("events")?.as_array()?;
    let meta = v.get("event_meta")?.as_array()?;
    let mut events = Vec::with_capacity(payloads.len());
    for (i, p) in payloads.iter().enumerate() {
        let id = p
            .get("id")
            .and_then(Value::as_str)
            .or_else(|| meta.get(i)?.get("dedup_id")?.as_str())
            .unwrap_or("")
            .to_string();
        let size = sizes
            .get(&id)
            .copied()
            .unwrap_or_else(|| serde_json::to_vec(p).map(|b| b.len()).unwrap_or(0));
        events.push(DocEvent {
            key: p.get("k").and_then(Value::as_str).unwrap_or("").to_string(),
            seq: p.get("seq").and_then(Value::as_u64).unwrap_or(0),
            size,
            id,
        });
    }
    Some(Doc {
        route: s("route")?,
        key: s("key")?,
        batch_id: v.get("batch_id")?.as_i64()?,
        content_hash: s("content_hash").unwrap_or_default(),
        count: v.get("count").and_then(Value::as_i64).unwrap_or(-1),
        events,
        answer,
    })
}
