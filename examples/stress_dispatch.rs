//! A bounded stress command for the dispatcher's recovery from a flapping receiver (issue
//! 28, "a key stays stuck after a flap"). Run through `tests/stress/dispatch.sh`, or
//! `cargo run --release --example stress_dispatch -- flap [keys] [flap_s] [phase_s]`:
//!
//! The real `hookspool run` (the dispatcher's defaults: breaker, backoff, max_inflight;
//! an immediate source keyed by `payload.topic`) delivers to a receiver on 127.0.0.1 that
//! flaps for `flap_s` seconds (default 120) through four phases of `phase_s` each (default
//! 6): every request answered 500; answered 200; refused (the listener closed, open
//! connections cut before an answer); hanging (no answer within the destination's
//! `timeout_s`, `TIMEOUT_S`). Meanwhile `keys` senders (default 50) each post one signed
//! webhook per `SEND_GAP_MS` for their key, one at a time, so each key's events are
//! committed in the order of their numbers. Then the receiver is healthy and the senders
//! stop.
//!
//! It watches the destination's breaker in the spool and prints when it closed after the
//! flap, how long the backlog took to drain after that (every acknowledged event received
//! in a document answered 200), and whether each key's events were accepted in order.
//! Fails when an acknowledged event is missing after `DRAIN_S_MAX`, a key's events were
//! accepted out of order, or the drain ended more than `GRACE_S` after the breaker closed.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

use common::{
    BoxError, figure, free_port, load, sign, source_toml, spawn_hookspool, stop, wait_served,
    write_secrets,
};
use hookspool::store::{Role, Store};

/// The destination's deadline per request; a hanging phase outlasts it.
const TIMEOUT_S: u64 = 10;
/// Each sender's pause between two of its webhooks.
const SEND_GAP_MS: u64 = 1000;
/// The drain must end within this long after the breaker closed (issue 28: "the cooldown
/// plus a few seconds").
const GRACE_S: f64 = 10.0;
/// How long the command waits for the backlog after the flap before it gives up.
const DRAIN_S_MAX: u64 = 600;
/// How often the breaker's state is read from the spool.
const WATCH_MS: u64 = 100;

/// What the receiver does with a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Mode {
    Fail = 0,
    Accept = 1,
    Refuse = 2,
    Hang = 3,
}

impl Mode {
    const FLAP: [Mode; 4] = [Mode::Fail, Mode::Accept, Mode::Refuse, Mode::Hang];

    fn from_u8(v: u8) -> Mode {
        match v {
            0 => Mode::Fail,
            1 => Mode::Accept,
            2 => Mode::Refuse,
            _ => Mode::Hang,
        }
    }
}

/// The flapping receiver: the mode, and for each key the event numbers it accepted, in the
/// order of the documents it answered 200.
#[derive(Clone)]
struct Receiver {
    addr: SocketAddr,
    mode: Arc<AtomicU8>,
    accepted: Arc<Mutex<BTreeMap<String, Vec<i64>>>>,
    listener: Arc<Mutex<Option<tokio::task::JoinHandle<()>>>>,
}

impl Receiver {
    async fn start() -> Result<Receiver, BoxError> {
        let probe = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = probe.local_addr()?;
        drop(probe);
        let r = Receiver {
            addr,
            mode: Arc::new(AtomicU8::new(Mode::Accept as u8)),
            accepted: Arc::default(),
            listener: Arc::default(),
        };
        r.listen()?;
        Ok(r)
    }

    fn mode(&self) -> Mode {
        Mode::from_u8(self.mode.load(Ordering::SeqCst))
    }

    /// Switch modes: refusing closes the listener (connects are refused), leaving it binds
    /// the same address again.
    fn set(&self, m: Mode) -> Result<(), BoxError> {
        let was = Mode::from_u8(self.mode.swap(m as u8, Ordering::SeqCst));
        match (was == Mode::Refuse, m == Mode::Refuse) {
            (false, true) => {
                if let Some(task) = self.listener.lock().unwrap().take() {
                    task.abort();
                }
            }
            (true, false) => self.listen()?,
            _ => {}
        }
        Ok(())
    }

    fn listen(&self) -> Result<(), BoxError> {
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.set_reuseaddr(true)?;
        socket.bind(self.addr)?;
        let listener = socket.listen(1024)?;
        let r = self.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let r = r.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req: Request<Incoming>| {
                        let r = r.clone();
                        async move { r.answer(req).await }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        *self.listener.lock().unwrap() = Some(task);
        Ok(())
    }

    /// The answer to one request; an error makes hyper close the connection unanswered.
    async fn answer(&self, req: Request<Incoming>) -> std::io::Result<Response<Full<Bytes>>> {
        let body = req
            .into_body()
            .collect()
            .await
            .map_err(std::io::Error::other)?
            .to_bytes();
        let status = match self.mode() {
            Mode::Refuse => return Err(std::io::Error::other("refused")),
            Mode::Hang => {
                let until = Instant::now() + Duration::from_secs(3 * TIMEOUT_S);
                while self.mode() == Mode::Hang && Instant::now() < until {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                500
            }
            Mode::Fail => 500,
            Mode::Accept => {
                let doc: serde_json::Value = serde_json::from_slice(&body)?;

                let key = doc["key"].as_str().unwrap_or_default().to_string();
                let ns = doc["events"]
                    .as_array()
                    .map(|es| {
                        es.iter()
                            .filter_map(|e| e["n"].as_i64())
                            .collect::<Vec<_>>()
                    })
                    .unwrap_or_default();
                self.accepted
                    .lock()
                    .unwrap()
                    .entry(key)
                    .or_default()
                    .extend(ns);
                200
            }
        };
        let mut resp = Response::new(Full::new(Bytes::new()));
        *resp.status_mut() = hyper::StatusCode::from_u16(status).map_err(std::io::Error::other)?;
        Ok(resp)
    }
}

fn config(home: &Path, port: u16, url: &str) -> String {
    format!(
        "[intake]\nlisten = \"127.0.0.1:{port}\"\n[limits]\nmin_free_bytes = 0\n{}\n[destinations.http-recv]\ntype = \"http\"\nurl = \"{url}\"\nallow_insecure = true\nallow_private = [\"127.0.0.1/32\"]\ntimeout_s = {TIMEOUT_S}\nsecret = {{ file = \"{}/dest.secret\" }}\n",
        source_toml("flap", home, "span = \"immediate\""),
        home.display()
    )
}

/// The breaker state of the destination as the spool holds it.
fn breaker(store: &Store) -> Result<String, BoxError> {
    Ok(store.destination("http-recv")?.state.as_str().to_string())
}

async fn flap(keys: usize, flap_s: u64, phase_s: u64) -> Result<bool, BoxError> {
    println!(
        "== flap: {keys} keys, the receiver flapping for {flap_s} s (500, 200, refused, hanging; {phase_s} s each), then healthy"
    );
    let dir = tempfile::tempdir()?;
    let home = dir.path();
    write_secrets(home)?;
    let rx = Receiver::start().await?;
    let port = free_port()?;
    let url = format!("http://{}/hook", rx.addr);
    std::fs::write(home.join("config.toml"), config(home, port, &url))?;
    let cfg = load(home)?;
    let child = spawn_hookspool(home, "run")?;
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    wait_served(&client, &base).await?;

    let acked: Arc<Mutex<BTreeSet<(String, i64)>>> = Arc::default();
    let refused = Arc::new(AtomicUsize::new(0));
    let sending = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let mut senders = Vec::new();
    for k in 0..keys {
        let (client, base, acked, refused, sending) = (
            client.clone(),
            base.clone(),
            acked.clone(),
            refused.clone(),
            sending.clone(),
        );
        senders.push(tokio::spawn(async move {
            let key = format!("k{k}");
            let mut n = 0i64;
            while sending.load(Ordering::SeqCst) {
                let body = serde_json::json!({"topic": key, "n": n}).to_string();
                let r = client
                    .post(format!("{base}/hooks/flap"))
                    .header("X-Signature", sign(body.as_bytes()))
                    .header("Content-Type", "application/json")
                    .body(body)
                    .timeout(Duration::from_secs(10))
                    .send()
                    .await;
                match r {
                    Ok(r) if r.status().is_success() => {
                        acked.lock().unwrap().insert((key.clone(), n));
                    }
                    _ => {
                        refused.fetch_add(1, Ordering::SeqCst);
                    }
                }
                n += 1;
                tokio::time::sleep(Duration::from_millis(SEND_GAP_MS)).await;
            }
        }));
    }

    let started = Instant::now();
    let mut phase = 0;
    while started.elapsed() < Duration::from_secs(flap_s) {
        rx.set(Mode::FLAP[phase % Mode::FLAP.len()])?;
        phase += 1;
        tokio::time::sleep(Duration::from_secs(phase_s)).await;
    }
    rx.set(Mode::Accept)?;
    let healthy_at = Instant::now();
    sending.store(false, Ordering::SeqCst);
    for s in senders {
        s.await?;
    }
    let store = Store::open(&cfg.db, Role::Reader, Duration::from_secs(30))?;
    let d = store.destination("http-recv")?;
    let cooldown_left_s = match (d.opened_at, d.cooldown_s) {
        (Some(o), Some(c)) if d.state.as_str() == "open" => (o + c - common::now_unix()).max(0.0),
        _ => 0.0,
    };
    println!(
        "flap over: breaker {} (cooldown {:?} s, {cooldown_left_s:.1} s left), {} webhooks acknowledged, {} not",
        d.state.as_str(),
        d.cooldown_s,
        acked.lock().unwrap().len(),
        refused.load(Ordering::SeqCst)
    );

    // Watch the breaker until the backlog has drained.
    let want = acked.lock().unwrap().clone();
    let mut closed_at: Option<Instant> = None;
    let drained_at = loop {
        let state = breaker(&store)?;
        match (state.as_str(), closed_at) {
            ("closed", None) => closed_at = Some(Instant::now()),
            ("closed", Some(_)) => {}
            // Opened again after it closed: the close that counts is the last one.
            (_, Some(_)) => closed_at = None,
            (_, None) => {}
        }
        let got: BTreeSet<(String, i64)> = rx
            .accepted
            .lock()
            .unwrap()
            .iter()
            .flat_map(|(k, ns)| ns.iter().map(move |n| (k.clone(), *n)))
            .collect();
        let missing = want.difference(&got).count();
        if missing == 0 {
            break Some(Instant::now());
        }
        if healthy_at.elapsed() > Duration::from_secs(DRAIN_S_MAX) {
            println!("after {DRAIN_S_MAX} s healthy, {missing} acknowledged events still missing");
            break None;
        }
        tokio::time::sleep(Duration::from_millis(WATCH_MS)).await;
    };
    let status = stop(child)?;

    let accepted = rx.accepted.lock().unwrap().clone();
    let mut out_of_order = Vec::new();
    for (key, ns) in &accepted {
        // A document answered 200 whose answer was lost may come again: first acceptances.
        let mut seen = BTreeSet::new();
        let firsts: Vec<i64> = ns.iter().copied().filter(|n| seen.insert(*n)).collect();
        if firsts.windows(2).any(|w| w[0] > w[1]) {
            out_of_order.push(key.clone());
        }
    }
    let mut pass = status.success() && out_of_order.is_empty();
    if !out_of_order.is_empty() {
        println!("out of order: {out_of_order:?}");
    }
    match (drained_at, closed_at) {
        (Some(end), Some(closed)) => {
            let after_close = end.saturating_duration_since(closed).as_secs_f64();
            let after_healthy = end.duration_since(healthy_at).as_secs_f64();
            println!(
                "drained {after_healthy:.1} s after the receiver was healthy, {after_close:.1} s after the breaker closed (bound {GRACE_S} s)"
            );
            figure("flap_drain_after_healthy_s", after_healthy);
            figure("flap_drain_after_close_s", after_close);
            figure("flap_cooldown_left_s", cooldown_left_s);
            pass &= after_close <= GRACE_S;
        }
        (Some(end), None) => {
            println!(
                "drained {:.1} s after the receiver was healthy, the breaker never seen closed",
                end.duration_since(healthy_at).as_secs_f64()
            );
        }
        (None, _) => pass = false,
    }
    println!(
        "hookspool run exited {status:?}; verdict: {}",
        if pass { "PASS" } else { "FAIL" }
    );
    Ok(pass)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num = |i: usize, default: u64| -> Result<u64, BoxError> {
        Ok(match args.get(i) {
            Some(v) => v.parse()?,
            None => default,
        })
    };
    let pass = match args.first().map(String::as_str) {
        Some("flap") | None => flap(num(1, 50)? as usize, num(2, 120)?, num(3, 6)?).await?,
        Some(other) => {
            eprintln!("usage: stress_dispatch flap [keys] [flap_s] [phase_s] (not {other:?})");
            std::process::exit(2);
        }
    };
    if !pass {
        std::process::exit(1);
    }
    Ok(())
}
