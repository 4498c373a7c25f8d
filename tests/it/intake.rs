//! The intake on a real socket (127.0.0.1:0) and a real SQLite file, run in-process through
//! the public `intake::serve` API: every row of spec 9's table and every answer, group
//! commit, /healthz and /metrics. Real-binary tests (socket activation, sd_notify, kill -9,
//! log sentinels, ENOSPC, schema) are in `intake_proc.rs`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hookspool::config::PathInputs;
use hookspool::intake::{IntakeError, IntakeOptions, serve};
use hookspool::sources::verify::{MacAlg, mac_hex};
use hookspool::store::{AttemptReport, BatchFilter, Mark, Store};
use hookspool::vocab::Klass;
use hookspool::wake::Waker;

use super::open;

pub const SECRET: &str = "intake-test-secret";

/// A config with one HMAC template source `tpl` (plus a tee), `{home}` and `{extra}`
/// substituted.
pub fn config(home: &Path, extra: &str) -> String {
    format!(
        r#"
[intake]
listen = ["127.0.0.1:0"]
busy_timeout_s = 0.3
{extra}

[sources.tpl]
type = "template"
scheme = "hmac-sha256-hex"
header = "X-Signature"
prefix = "sha256="
key = "payload.repo"
dedup = "header.X-Delivery-Id"
ignore = ["header.X-Event=ping"]
event_type = "header.X-Event"
keep_headers = ["X-Event"]
action = "http-main"
span = "immediate"
max_body_bytes = 4096
secrets.secret = {{ file = "{home}/secret" }}

[[routes]]
name = "audit"
source = "tpl"
tee = true
destination = "http-audit"

[sources.zoom]
secrets.webhook_secret = {{ file = "{home}/secret" }}
action = "http-main"

[destinations.http-main]
type = "http"
url = "https://main.invalid/hook"
secret = {{ file = "/nonexistent/hookspool-test-secret" }}

[destinations.http-audit]
type = "http"
url = "https://audit.invalid/hook"
secret = {{ file = "/nonexistent/hookspool-test-secret" }}
"#,
        home = home.display()
    )
}

/// Counts dispatcher wake-ups.
#[derive(Default)]
pub struct CountingWaker(pub AtomicUsize);

impl Waker for CountingWaker {
    fn wake(&self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// An intake served in-process on its own runtime thread.
pub struct Running {
    pub addr: SocketAddr,
    pub home: tempfile::TempDir,
    pub wakes: Arc<CountingWaker>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<(), IntakeError>>>,
}

impl Running {
    pub fn db(&self) -> PathBuf {
        self.home.path().join("spool.db")
    }

    /// Stop and wait; the result of `serve`.
    pub fn stop(mut self) -> Result<(), IntakeError> {
        self.stop_inner()
    }

    fn stop_inner(&mut self) -> Result<(), IntakeError> {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        match self.thread.take() {
            Some(t) => t.join().expect("serve thread"),
            None => Ok(()),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.stop_inner();
    }
}

pub fn start(extra: &str) -> Running {
    let home = tempfile::tempdir().unwrap();
    std::fs::write(home.path().join("secret"), SECRET).unwrap();
    std::fs::write(home.path().join("config.toml"), config(home.path(), extra)).unwrap();
    start_in(home)
}

pub fn start_in(home: tempfile::TempDir) -> Running {
    let wakes = Arc::new(CountingWaker::default());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let inputs = PathInputs {
        home_flag: Some(home.path().to_path_buf()),
        ..PathInputs::default()
    };
    let waker: Arc<dyn Waker> = wakes.clone();
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let (on_ready, addrs) = tokio::sync::oneshot::channel();
            let mut opts = IntakeOptions::new(inputs, waker, async move {
                let _ = stop_rx.await;
            });
            opts.notify = false;
            opts.reload_on_sighup = false;
            opts.on_ready = Some(on_ready);
            let ready_tx2 = ready_tx.clone();
            tokio::spawn(async move {
                if let Ok(a) = addrs.await {
                    let _ = ready_tx2.send(Ok(a));
                }
            });
            let r = serve(opts).await;
            if let Err(e) = &r {
                let _ = ready_tx.send(Err(e.to_string()));
            }
            r
        })
    });
    let addrs = ready_rx
        .recv_timeout(Duration::from_secs(20))
        .expect("intake ready")
        .expect("intake started");
    Running {
        addr: addrs[0].parse().unwrap(),
        home,
        wakes,
        stop: Some(stop_tx),
        thread: Some(thread),
    }
}

/// A parsed HTTP response.
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

/// Write raw bytes, read the answer to EOF (requests say Connection: close). A write the
/// server cut short (it answered early and closed) is not an error.
/// One POST to `path` signed with `secret` (hmac-sha256-hex, `X-Signature: sha256=<hex>`),
/// or `None` when no answer came (refused, reset, timed out, cut short): for load clients
/// that retry while a service is killed or its database is down.
pub fn try_post_signed(addr: SocketAddr, path: &str, secret: &[u8], body: &[u8]) -> Option<Resp> {
    let sig = format!("sha256={}", mac_hex(MacAlg::Sha256, secret, &[body]));
    let bytes = request(
        "POST",
        path,
        &[("X-Signature", &sig), ("Content-Type", "application/json")],
        body,
    );
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(15))).ok()?;
    s.write_all(&bytes).ok()?;
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    if buf.is_empty() {
        return None;
    }
    std::panic::catch_unwind(|| read_response(&mut &buf[..])).ok()
}

pub fn raw(addr: SocketAddr, bytes: &[u8]) -> Resp {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let _ = s.write_all(bytes);
    read_response(&mut s)
}

pub fn read_response(s: &mut impl Read) -> Resp {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        match s.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(_) => break,
        }
        if let Some(r) = parse(&buf) {
            return r;
        }
    }
    parse(&buf).unwrap_or_else(|| panic!("no HTTP response in {:?}", String::from_utf8_lossy(&buf)))
}

/// A complete response in `buf` (head plus Content-Length bytes), if there is one.
fn parse(buf: &[u8]) -> Option<Resp> {
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&buf[..end]).to_string();
    let mut lines = head.split("\r\n");
    let status: u16 = lines.next()?.split_whitespace().nth(1)?.parse().ok()?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let len: usize = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let body = buf.get(end + 4..end + 4 + len)?.to_vec();
    Some(Resp {
        status,
        headers,
        body,
    })
}

pub fn sign(body: &[u8]) -> String {
    format!(
        "sha256={}",
        mac_hex(MacAlg::Sha256, SECRET.as_bytes(), &[body])
    )
}

/// A request with Content-Length, Connection: close and the given headers.
pub fn request(method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut r = format!(
        "{method} {path} HTTP/1.1\r\nHost: hooks.test\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        r.push_str(&format!("{k}: {v}\r\n"));
    }
    r.push_str("\r\n");
    let mut out = r.into_bytes();
    out.extend_from_slice(body);
    out
}

/// A signed POST to /hooks/tpl.
pub fn post_signed(addr: SocketAddr, body: &[u8], delivery: &str, event: &str) -> Resp {
    let sig = sign(body);
    raw(
        addr,
        &request(
            "POST",
            "/hooks/tpl",
            &[
                ("X-Signature", &sig),
                ("X-Delivery-Id", delivery),
                ("X-Event", event),
                ("Content-Type", "application/json"),
            ],
            body,
        ),
    )
}

pub fn get(addr: SocketAddr, path: &str) -> Resp {
    raw(addr, &request("GET", path, &[], b""))
}

/// Every stored event: (batch destination, batch state, payload, raw, headers).
pub fn events(db: &Path) -> Vec<(String, String, Option<String>, String)> {
    let s = open(db);
    let mut out = Vec::new();
    for b in s
        .list_batches(&BatchFilter {
            limit: 1_000_000,
            ..Default::default()
        })
        .unwrap()
    {
        for e in s.events(b.id, true).unwrap() {
            out.push((
                b.destination.clone(),
                b.state.to_string(),
                e.payload,
                b.route.clone(),
            ));
        }
    }
    out
}

fn status_of(r: &Resp) -> String {
    r.json()["status"].as_str().unwrap_or_default().to_string()
}

#[test]
fn signed_request_is_queued_with_its_tee_copy_after_commit() {
    let i = start("");
    let body = br#"{"repo":"octo/one","n":1}"#;
    let r = post_signed(i.addr, body, "d-1", "push");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(status_of(&r), "queued");
    assert_eq!(r.header("content-type"), Some("application/json"));
    // The 2xx came after COMMIT: the rows are there the moment we look.
    let ev = events(&i.db());
    let dests: Vec<&str> = ev.iter().map(|e| e.0.as_str()).collect();
    assert!(
        dests.contains(&"http-main") && dests.contains(&"http-audit"),
        "{ev:?}"
    );
    assert_eq!(ev.len(), 2);
    assert!(
        i.wakes.0.load(Ordering::SeqCst) >= 1,
        "the dispatcher was woken"
    );
    // Kept headers only, never the signature.
    let s = open(&i.db());
    let b = s
        .list_batches(&BatchFilter {
            limit: 10,
            ..Default::default()
        })
        .unwrap();
    let e = s.events(b[0].id, true).unwrap();
    assert_eq!(e[0].event_type, "push");
    assert_eq!(e[0].dedup_id.as_deref(), Some("d-1"));
}

/// The payload is the body's own text, not the body parsed and encoded again (issue 13: no
/// per-request re-encoding), and the raw body, being the same bytes, is stored once: the
/// row's raw is NULL with raw_is_payload = 1, and the store hands back the original bytes.
#[test]
fn a_json_body_is_stored_as_received_and_only_once() {
    let i = start("");
    let body = b"{\"repo\": \"octo/verbatim\",\n  \"a\": [1, 2.50, {\"z\": null}] }";
    let r = post_signed(i.addr, body, "d-verbatim", "push");
    assert_eq!((r.status, status_of(&r)), (200, "queued".into()), "{r:?}");
    let ev = events(&i.db());
    assert_eq!(ev.len(), 2, "{ev:?}");
    for e in &ev {
        assert_eq!(e.2.as_deref().map(str::as_bytes), Some(&body[..]), "{e:?}");
    }
    let conn = rusqlite::Connection::open(i.db()).unwrap();
    let rows: Vec<(Option<Vec<u8>>, i64, i64)> = conn
        .prepare("SELECT raw, raw_is_payload, size FROM events ORDER BY id")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(rows, vec![(None, 1, body.len() as i64); 2]);
    let mut raws = Vec::new();
    open(&i.db())
        .export(&Default::default(), &mut |v| {
            if v["record"] == "event" {
                raws.push(v["raw_base64"].as_str().unwrap_or_default().to_string());
            }
        })
        .unwrap();
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(body);
    assert_eq!(raws, vec![b64.clone(), b64]);
}

#[test]
fn duplicate_and_replayed_answers() {
    let i = start("");
    let body = br#"{"repo":"octo/dup"}"#;
    assert_eq!(
        status_of(&post_signed(i.addr, body, "d-dup", "push")),
        "queued"
    );
    let r = post_signed(i.addr, body, "d-dup", "push");
    assert_eq!((r.status, status_of(&r)), (200, "duplicate".into()));

    // Kill the primary batch (dead, permanent), then the same delivery replays it.
    let mut s = open(&i.db());
    s.seal_ready(9e9).unwrap();
    let batch = s
        .list_batches(&BatchFilter {
            destination: Some("http-main".into()),
            limit: 10,
            ..Default::default()
        })
        .unwrap()[0]
        .id;
    let claim = s
        .claim(
            batch,
            "t",
            9e9 + 60.0,
            9e9,
            false,
            hookspool::store::DeliveryId::per_attempt(""),
        )
        .unwrap()
        .expect("claimed");
    s.mark(&AttemptReport {
        batch_id: batch,
        attempt_id: claim.attempt_id,
        lease_owner: claim.lease_owner.clone(),
        now: 9e9,
        status: Some(422),
        error: None,
        duration_ms: 1,
        delivery_id: None,
        events_delivered: None,
        failed_event_id: None,
        mark: Mark::Dead {
            klass: Klass::Permanent,
        },
    })
    .unwrap();
    assert_eq!(s.batch(batch).unwrap().state.as_str(), "dead");
    drop(s);
    let r = post_signed(i.addr, body, "d-dup", "push");
    assert_eq!((r.status, status_of(&r)), (200, "replayed".into()));
}

#[test]
fn ignored_is_200_and_not_stored() {
    let i = start("");
    let r = post_signed(i.addr, br#"{"zen":"x"}"#, "d-ping", "ping");
    assert_eq!((r.status, status_of(&r)), (200, "ignored".into()));
    assert!(events(&i.db()).is_empty());
}

#[test]
fn unverified_is_401_with_an_empty_body() {
    let i = start("");
    let body = br#"{"repo":"octo/x"}"#;
    for headers in [
        vec![("X-Event", "push")],
        vec![("X-Event", "push"), ("X-Signature", "sha256=00")],
    ] {
        let r = raw(i.addr, &request("POST", "/hooks/tpl", &headers, body));
        assert_eq!(r.status, 401, "{r:?}");
        assert!(r.body.is_empty());
    }
    // Tampered: signed for another body.
    let sig = sign(b"{}");
    let r = raw(
        i.addr,
        &request("POST", "/hooks/tpl", &[("X-Signature", &sig)], body),
    );
    assert_eq!(r.status, 401);
    assert!(events(&i.db()).is_empty());
}

#[test]
fn chunked_and_missing_length_are_411() {
    let i = start("");
    let chunked = b"POST /hooks/tpl HTTP/1.1\r\nHost: x\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n";
    assert_eq!(raw(i.addr, chunked).status, 411);
    let no_len = b"POST /hooks/tpl HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    assert_eq!(raw(i.addr, no_len).status, 411);
}

#[test]
fn oversized_bodies_are_413_before_any_source_code() {
    let i = start("");
    // Honest Content-Length over the source's max_body_bytes (4096).
    let big = vec![b'a'; 5000];
    let r = raw(i.addr, &request("POST", "/hooks/tpl", &[], &big));
    assert_eq!(r.status, 413);
    // A Content-Length that claims 50 MiB with only 1 KiB sent: answered at once, without
    // waiting for (or reading) the rest.
    let mut s = TcpStream::connect(i.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let started = Instant::now();
    s.write_all(b"POST /hooks/tpl HTTP/1.1\r\nHost: x\r\nContent-Length: 52428800\r\n\r\n")
        .unwrap();
    s.write_all(&[b'a'; 1024]).unwrap();
    let r = read_response(&mut s);
    assert_eq!(r.status, 413);
    assert!(started.elapsed() < Duration::from_secs(3));
    assert_eq!(r.header("connection"), Some("close"));
    // A Content-Length that lies low: only that many bytes are the body (the signature over
    // the whole thing fails on them), the surplus is never read as body.
    let body = vec![b'{'; 8000];
    let sig = sign(&body);
    let mut req = format!(
        "POST /hooks/tpl HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Signature: {sig}\r\nContent-Length: 100\r\n\r\n"
    )
    .into_bytes();
    req.extend_from_slice(&body);
    let r = raw(i.addr, &req);
    assert_eq!(r.status, 401, "{r:?}");
    assert!(events(&i.db()).is_empty());
}

#[test]
fn unknown_source_is_404_and_wrong_method_is_405() {
    let i = start("");
    assert_eq!(
        raw(i.addr, &request("POST", "/hooks/nope", &[], b"{}")).status,
        404
    );
    assert_eq!(
        raw(i.addr, &request("POST", "/elsewhere", &[], b"{}")).status,
        404
    );
    let r = get(i.addr, "/hooks/tpl");
    assert_eq!(r.status, 405);
    assert_eq!(r.header("allow"), Some("POST"));
    assert_eq!(
        raw(i.addr, &request("POST", "/healthz", &[], b"")).status,
        405
    );
}

#[test]
fn a_source_error_after_verify_is_quarantined_with_the_raw_request_minus_auth_headers() {
    let i = start("");
    // The key selector payload.repo is missing: the template source fails after verify.
    let body = br#"{"no_repo":"QUARANTINE-BODY"}"#;
    let r = post_signed(i.addr, body, "d-q", "push");
    assert_eq!(
        (r.status, status_of(&r)),
        (202, "quarantined".into()),
        "{r:?}"
    );
    let s = open(&i.db());
    let b = &s
        .list_batches(&BatchFilter {
            limit: 10,
            ..Default::default()
        })
        .unwrap()[0];
    assert_eq!(
        (b.state.as_str(), b.destination.as_str()),
        ("dead", "quarantine")
    );
    assert_eq!(b.last_class.map(|k| k.as_str()), Some("quarantine"));
    assert!(
        b.last_error
            .as_deref()
            .unwrap_or("")
            .starts_with("plugin error: ")
    );
    let stored = s.quarantined_requests(b.id).unwrap();
    assert_eq!(stored[0].raw.as_deref(), Some(body.as_slice()));
    let headers = stored[0].headers.to_ascii_lowercase();
    assert!(headers.contains("x-delivery-id"), "{headers}");
    assert!(
        !headers.contains("x-signature"),
        "auth header stored: {headers}"
    );
}

#[test]
fn verification_that_cannot_decide_is_503_never_2xx() {
    let i = start("");
    std::fs::remove_file(i.home.path().join("secret")).unwrap();
    let r = post_signed(i.addr, br#"{"repo":"a"}"#, "d-u", "push");
    assert_eq!(r.status, 503, "{r:?}");
    assert!(events(&i.db()).is_empty());
}

#[test]
fn low_free_space_is_503_with_retry_after_and_healthz_says_so() {
    let i = start("[limits]\nmin_free_bytes = 9000000000000000000");
    let r = post_signed(i.addr, br#"{"repo":"a"}"#, "d-s", "push");
    assert_eq!(r.status, 503);
    assert_eq!(r.header("retry-after"), Some("60"));
    assert!(events(&i.db()).is_empty());
    let h = get(i.addr, "/healthz");
    assert_eq!(h.status, 503);
    let j = h.json();
    assert_eq!(j["ok"], false);
    assert!(j["degraded"].to_string().contains("min_free_bytes"), "{j}");
}

#[test]
fn a_busy_database_is_503_and_the_next_request_succeeds() {
    let i = start("");
    // Let the intake create the schema first.
    assert_eq!(
        post_signed(i.addr, br#"{"repo":"a"}"#, "d-b0", "push").status,
        200
    );
    let holder = rusqlite::Connection::open(i.db()).unwrap();
    holder.execute_batch("BEGIN IMMEDIATE").unwrap();
    let started = Instant::now();
    let r = post_signed(i.addr, br#"{"repo":"a"}"#, "d-b1", "push");
    assert_eq!(r.status, 503, "{r:?}");
    assert_eq!(status_of(&r), "busy");
    assert!(
        started.elapsed() >= Duration::from_millis(250),
        "waited busy_timeout_s"
    );
    holder.execute_batch("ROLLBACK").unwrap();
    assert_eq!(
        post_signed(i.addr, br#"{"repo":"a"}"#, "d-b1", "push").status,
        200
    );
    let m = get(i.addr, "/metrics");
    let text = String::from_utf8_lossy(&m.body);
    assert!(
        text.contains(r#"hookspool_requests_rejected_total{source="tpl",reason="busy"} 1"#),
        "{text}"
    );
}

#[test]
fn a_signed_handshake_is_answered_after_verify_and_a_forged_one_is_401() {
    let i = start("");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let body = format!(
        r#"{{"event":"endpoint.url_validation","event_ts":{},"payload":{{"plainToken":"abc123"}}}}"#,
        now * 1000
    );
    let sig = |secret: &[u8]| {
        format!(
            "v0={}",
            mac_hex(
                MacAlg::Sha256,
                secret,
                &[b"v0:", now.to_string().as_bytes(), b":", body.as_bytes()]
            )
        )
    };
    let ts = now.to_string();
    let good = sig(SECRET.as_bytes());
    let r = raw(
        i.addr,
        &request(
            "POST",
            "/hooks/zoom",
            &[("x-zm-request-timestamp", &ts), ("x-zm-signature", &good)],
            body.as_bytes(),
        ),
    );
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.json()["plainToken"], "abc123");
    let bad = sig(b"not-the-secret");
    let r = raw(
        i.addr,
        &request(
            "POST",
            "/hooks/zoom",
            &[("x-zm-request-timestamp", &ts), ("x-zm-signature", &bad)],
            body.as_bytes(),
        ),
    );
    assert_eq!(r.status, 401);
    assert!(events(&i.db()).is_empty(), "handshakes never enqueue");
}

#[test]
fn group_commit_answers_every_concurrent_request_after_its_commit() {
    let i = start("");
    let addr = i.addr;
    let threads: Vec<_> = (0..8)
        .map(|t| {
            std::thread::spawn(move || {
                let mut acked = Vec::new();
                for n in 0..40 {
                    let body = format!(r#"{{"repo":"octo/g{}","t":{t},"n":{n}}}"#, n % 3);
                    let r = post_signed(addr, body.as_bytes(), &format!("g-{t}-{n}"), "push");
                    assert_eq!(r.status, 200, "{r:?}");
                    acked.push(body);
                }
                acked
            })
        })
        .collect();
    let acked: Vec<String> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    let ev = events(&i.db());
    for body in &acked {
        let n = ev
            .iter()
            .filter(|e| {
                e.2.as_deref().is_some_and(|p| {
                    serde_json::from_str::<serde_json::Value>(p).ok()
                        == serde_json::from_str::<serde_json::Value>(body).ok()
                })
            })
            .count();
        assert_eq!(n, 2, "{body}: primary and tee");
    }
    assert_eq!(
        open(&i.db()).check_invariants().unwrap(),
        Vec::<String>::new()
    );
    // /metrics counts each stored request once (a tee is a copy, not a request), in one of
    // the commits that held them.
    let m = get(i.addr, "/metrics");
    let text = String::from_utf8_lossy(&m.body).to_string();
    let value = |name| {
        super::observe::series(&text, name).unwrap_or_else(|| panic!("no {name} in\n{text}"))
    };
    assert_eq!(
        value("hookspool_intake_group_requests_total"),
        acked.len() as u64,
        "{text}"
    );
    let commits = value("hookspool_intake_group_commits_total");
    assert!(
        (1..=acked.len() as u64).contains(&commits),
        "{commits} commits"
    );
}

#[test]
fn healthz_and_metrics_report_what_the_intake_knows() {
    let i = start("");
    assert_eq!(
        post_signed(i.addr, br#"{"repo":"m"}"#, "d-m", "push").status,
        200
    );
    let _ = raw(i.addr, &request("POST", "/hooks/tpl", &[], b"{}"));
    let h = get(i.addr, "/healthz");
    assert_eq!(h.status, 200, "{h:?}");
    let j = h.json();
    assert_eq!(j["ok"], true);
    assert_eq!(j["schema"], hookspool::store::SCHEMA_VERSION);
    assert_eq!(j["dispatcher"]["alive"], false);
    assert!(j["degraded"].to_string().contains("dispatcher"), "{j}");
    assert_eq!(
        j["batches"]["open"].as_i64().unwrap() + j["batches"]["sealed"].as_i64().unwrap(),
        2
    );
    assert!(j["spool"]["writable_checked_age_s"].as_f64().unwrap() < 30.0);
    let m = get(i.addr, "/metrics");
    assert_eq!(m.status, 200);
    let text = String::from_utf8_lossy(&m.body);
    for line in [
        r#"hookspool_events_received_total{source="tpl"} 1"#,
        r#"hookspool_requests_rejected_total{source="tpl",reason="unverified"} 1"#,
        "# TYPE hookspool_batches gauge",
        // The unverified request never reached the writer.
        "\nhookspool_intake_group_commits_total 1\n",
        "\nhookspool_intake_group_requests_total 1\n",
    ] {
        assert!(text.contains(line), "{line} in\n{text}");
    }
}

#[test]
fn shutdown_returns_ok() {
    let i = start("");
    assert_eq!(
        post_signed(i.addr, br#"{"repo":"s"}"#, "d-s", "push").status,
        200
    );
    assert!(i.stop().is_ok());
}

#[test]
fn a_bad_config_refuses_to_start_with_a_config_error() {
    let home = tempfile::tempdir().unwrap();
    std::fs::write(
        home.path().join("config.toml"),
        "[sources.bad]\ntype = \"template\"\nscheme = \"rot13\"\n",
    )
    .unwrap();
    let inputs = PathInputs {
        home_flag: Some(home.path().to_path_buf()),
        ..PathInputs::default()
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let r = rt.block_on(serve(IntakeOptions::new(
        inputs,
        Arc::new(CountingWaker::default()),
        async {},
    )));
    let e = r.expect_err("refused");
    assert_eq!(hookspool::cli::Exit::from(e).code, 2);
}

#[allow(dead_code)]
fn _store_type_is_used(_: Store) {}

/// The whole /metrics page (the intake's counters and the table gauges together) is valid
/// Prometheus text exposition, checked by promtool.
#[test]
fn the_metrics_page_passes_promtool() {
    let i = start("");
    let t0 = std::time::Instant::now();
    assert_eq!(
        post_signed(i.addr, br#"{"repo":"p"}"#, "d-p", "push").status,
        200
    );
    let client_s = t0.elapsed().as_secs_f64();
    let unsigned = raw(i.addr, &request("POST", "/hooks/tpl", &[], b"{}")).status;
    assert_ne!(unsigned, 200);
    let _ = raw(i.addr, &request("POST", "/hooks/nosuch", &[], b"{}"));
    let m = get(i.addr, "/metrics");
    assert_eq!(m.status, 200);
    let text = String::from_utf8_lossy(&m.body).to_string();
    assert!(text.contains("hookspool_events_received_total"), "{text}");
    // The request-duration histogram (issue 35): one signed 200 and one refused request of
    // the configured source, each within what the client measured; an unknown source is
    // no label.
    let h = "hookspool_intake_request_duration_seconds";
    let ok = "source=\"tpl\",answer=\"200\"";
    assert_eq!(
        super::observe::series(&text, &format!("{h}_count{{{ok}}}")),
        Some(1),
        "{text}"
    );
    assert_eq!(
        super::observe::series(
            &text,
            &format!("{h}_count{{source=\"tpl\",answer=\"{unsigned}\"}}")
        ),
        Some(1),
        "{text}"
    );
    assert_eq!(
        super::observe::series(&text, &format!("{h}_bucket{{{ok},le=\"+Inf\"}}")),
        Some(1)
    );
    let sum: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{h}_sum{{{ok}}} ")))
        .and_then(|v| v.parse().ok())
        .expect("a sum");
    assert!(
        sum > 0.0 && sum <= client_s,
        "{sum} s within the client's {client_s} s"
    );
    let first_bucket_holding_it = super::observe::BUCKETS_S
        .iter()
        .find(|b| sum <= **b)
        .expect("under 60 s");
    assert_eq!(
        super::observe::series(
            &text,
            &format!("{h}_bucket{{{ok},le=\"{first_bucket_holding_it}\"}}")
        ),
        Some(1),
        "{text}"
    );
    assert!(!text.contains("source=\"nosuch\""), "{text}");
    assert!(
        text.contains("hookspool_dispatcher_heartbeat_age_seconds"),
        "gauges present: {text}"
    );
    super::observe::promtool_check(&text);
}
