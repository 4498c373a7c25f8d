//! End to end through the real binary: `hookspool --home <tmp> run` (intake and dispatcher in
//! one process) on a config this test writes, delivering to the real local receiver of
//! `receiver.rs`. A signed webhook in -> 200 queued -> the batch document at the receiver with
//! a webhook-signature checked independently here; coalescing within the quiet window; an
//! immediate route delivered within milliseconds of the 2xx (the intake nudges the
//! dispatcher); SIGTERM -> exit 0. `RunProc` is shared with the other tests of `hookspool run`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::Engine as _;
use hmac::{KeyInit, Mac};
use hookspool::sources::verify::{MacAlg, mac_hex};

use super::bin;
use super::daemon::{Daemon, Spec};
use super::intake::{Resp, raw, request};
use super::receiver::{Receiver, Recorded};

/// A free 127.0.0.1 port: bind :0, read it, close. Another process could take it before the
/// binary binds it; the start would then fail loudly, never silently. For a port a
/// [`RunProc`] will serve, [`reserved_port`] has no such race.
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// Listening sockets bound by the tests, by port, until a [`RunProc`] takes one.
static RESERVED: Mutex<BTreeMap<u16, std::net::TcpListener>> = Mutex::new(BTreeMap::new());

/// A 127.0.0.1 port for the intake of a [`RunProc`], already listening: the test binds it
/// and keeps it, and `RunProc::start` hands the socket to the binary the way systemd does
/// (LISTEN_FDS), so no other process can take the port in between. A reserved port must be
/// started by a `RunProc` (another binary binding it would find it in use).
pub fn reserved_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    RESERVED.lock().unwrap().insert(port, l);
    port
}

/// `hookspool --home <home> run` on the [`Daemon`] wrapper, serving `addr` (the inherited
/// socket of a [`reserved_port`], else the address its config names).
pub struct RunProc {
    pub daemon: Daemon,
    pub addr: SocketAddr,
}

impl std::ops::Deref for RunProc {
    type Target = Daemon;
    fn deref(&self) -> &Daemon {
        &self.daemon
    }
}

impl std::ops::DerefMut for RunProc {
    fn deref_mut(&mut self) -> &mut Daemon {
        &mut self.daemon
    }
}

impl RunProc {
    /// Start on `home`, which already holds config.toml listening on `addr`.
    pub fn start(home: &Path, addr: SocketAddr, env: &[(&str, &str)]) -> RunProc {
        RunProc::start_program(&bin(), home, addr, env)
    }

    /// [`RunProc::start`] with the binary at `program` (a copy, for the upgrade test).
    pub fn start_program(
        program: &Path,
        home: &Path,
        addr: SocketAddr,
        env: &[(&str, &str)],
    ) -> RunProc {
        let mut spec = Spec::new(home, &["run"]).program(program);
        for (k, v) in env {
            spec = spec.env(k, v);
        }
        if let Some(l) = RESERVED.lock().unwrap().remove(&addr.port()) {
            spec = spec.socket(l, "http");
        }
        let daemon = Daemon::start(spec);
        daemon.wait_serving(addr);
        RunProc { daemon, addr }
    }

    /// POST `body` to /hooks/<source>`query` signed with `secret` (hmac-sha256-hex,
    /// `X-Signature: sha256=<hex>`), plus `extra` headers.
    pub fn post(
        &self,
        source_and_query: &str,
        secret: &[u8],
        body: &[u8],
        extra: &[(&str, &str)],
    ) -> Resp {
        let sig = format!("sha256={}", mac_hex(MacAlg::Sha256, secret, &[body]));
        let mut h: Vec<(&str, &str)> =
            vec![("X-Signature", &sig), ("Content-Type", "application/json")];
        h.extend_from_slice(extra);
        raw(
            self.addr,
            &request("POST", &format!("/hooks/{source_and_query}"), &h, body),
        )
    }
}

const SOURCE_SECRET: &str = "e2e-source-secret";
const DEST_SECRET: &str = "e2e-destination-secret";
/// Polls are slow on purpose: an immediate batch delivered well inside one poll interval
/// was woken by the intake's nudge, not found by the poll.
const POLL_S: f64 = 5.0;

fn write_config(home: &Path, port: u16, url: &str, spool: &str) {
    std::fs::write(home.join("source.secret"), SOURCE_SECRET).unwrap();
    std::fs::write(home.join("dest.secret"), DEST_SECRET).unwrap();
    let source = |name: &str, quiet: f64, max: f64| {
        format!(
            r#"
[sources.{name}]
type = "template"
scheme = "hmac-sha256-hex"
header = "X-Signature"
prefix = "sha256="
key = "payload.topic"
dedup = "payload.id"
quiet_s = {quiet}
max_s = {max}
action = "http-recv"
secrets.secret = {{ file = "{home}/source.secret" }}
"#,
            home = home.display()
        )
    };
    let text = format!(
        r#"
[intake]
listen = "127.0.0.1:{port}"

[limits]
min_free_bytes = 0

[dispatch]
poll_s = {POLL_S}
parallel = 4
{coalesced}{immediate}
[destinations.http-recv]
type = "http"
url = "{url}"
allow_insecure = true
allow_private = ["127.0.0.1/32"]
timeout_s = 10
secret = {{ file = "{home}/dest.secret" }}
{spool}"#,
        coalesced = source("coalesced", 2.0, 30.0),
        immediate = source("immediate", 0.0, 0.0),
        home = home.display()
    );
    std::fs::write(home.join("config.toml"), text).unwrap();
}

/// Standard Webhooks v1, computed here without the crate's signing code: base64 of
/// HMAC-SHA256(secret, "<webhook-id>.<webhook-timestamp>.<body>"), the raw secret as key.
fn assert_signed(r: &Recorded) {
    let id = r.header("webhook-id").expect("webhook-id");
    let ts = r.header("webhook-timestamp").expect("webhook-timestamp");
    let sig = r.header("webhook-signature").expect("webhook-signature");
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(DEST_SECRET.as_bytes()).unwrap();
    mac.update(format!("{id}.{ts}.").as_bytes());
    mac.update(&r.body);
    let want = format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
    );
    assert!(
        sig.split(' ').any(|s| s == want),
        "webhook-signature {sig:?} does not verify (want {want})"
    );
    let ts: i64 = ts.parse().expect("numeric webhook-timestamp");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    assert!((now - ts).abs() < 60, "webhook-timestamp {ts} is now-ish");
}

/// Requests whose document is for `source`.
fn docs_for(rx: &Receiver, source: &str) -> Vec<Recorded> {
    rx.requests()
        .into_iter()
        .filter(|r| r.json()["source"] == source)
        .collect()
}

async fn wait_docs(rx: &Receiver, source: &str, n: usize, within: Duration) -> Vec<Recorded> {
    let until = Instant::now() + within;
    loop {
        let d = docs_for(rx, source);
        if d.len() >= n || Instant::now() >= until {
            return d;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_delivers_signed_coalesced_and_immediate_batches_and_stops_on_sigterm() {
    let home = tempfile::tempdir().unwrap();
    e2e(home, super::TestSpool::sqlite()).await;
}

/// The same, on a PostgreSQL spool (issue 32).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_delivers_signed_coalesced_and_immediate_batches_and_stops_on_sigterm_on_postgres() {
    let home = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let Some(spool) = tokio::task::block_in_place(|| super::TestSpool::postgres(dir.path())) else {
        return;
    };
    e2e(home, spool).await;
}

async fn e2e(home: tempfile::TempDir, spool: super::TestSpool) {
    let rx = Receiver::start().await;
    let port = reserved_port();
    write_config(home.path(), port, &rx.url(), &spool.section);
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut p = tokio::task::block_in_place(|| RunProc::start(home.path(), addr, &[]));
    let secret = SOURCE_SECRET.as_bytes();

    // (a) + (c): one signed webhook to the immediate source; the document arrives signed,
    // within a fraction of the poll interval.
    let body = br#"{"id":"imm-1","topic":"now","n":1}"#;
    let (r, acked_at) = tokio::task::block_in_place(|| {
        let r = p.post("immediate", secret, body, &[]);
        (r, Instant::now())
    });
    assert_eq!(r.status, 200, "{:?} {}", r.json(), p.log());
    assert_eq!(r.json()["status"], "queued", "{:?}", r.json());
    let got = wait_docs(&rx, "immediate", 1, Duration::from_secs(10)).await;
    assert_eq!(got.len(), 1, "one document; log:\n{}", p.log());
    let latency = got[0].at.saturating_duration_since(acked_at);
    eprintln!(
        "immediate route: delivered {:.1} ms after the 2xx (poll_s = {POLL_S})",
        latency.as_secs_f64() * 1e3
    );
    assert!(
        latency < Duration::from_secs(2),
        "an immediate batch is delivered on the intake's nudge, not at the next poll: {latency:?}"
    );
    let doc = got[0].json();
    assert_eq!(got[0].path, "/hook");
    assert_eq!(doc["count"], 1);
    assert_eq!(doc["key"], "now");
    assert_eq!(
        doc["events"],
        serde_json::json!([{"id":"imm-1","topic":"now","n":1}])
    );
    assert_signed(&got[0]);
    assert_eq!(
        got[0].header("x-hookspool-batch"),
        Some(doc["batch_id"].to_string().as_str())
    );
    assert_eq!(got[0].header("webhook-id"), doc["delivery_id"].as_str());

    // A few more, one at a time, so one lucky poll cannot explain the figure.
    let mut worst = latency;
    for n in 2..=5 {
        let body = format!(r#"{{"id":"imm-{n}","topic":"now","n":{n}}}"#);
        let (r, acked_at) = tokio::task::block_in_place(|| {
            let r = p.post("immediate", secret, body.as_bytes(), &[]);
            (r, Instant::now())
        });
        assert_eq!(r.status, 200);
        let got = wait_docs(&rx, "immediate", n, Duration::from_secs(10)).await;
        assert_eq!(got.len(), n, "log:\n{}", p.log());
        assert_eq!(got[n - 1].json()["events"][0]["n"], n);
        worst = worst.max(got[n - 1].at.saturating_duration_since(acked_at));
    }
    eprintln!(
        "immediate route: worst of 5 = {:.1} ms after the 2xx",
        worst.as_secs_f64() * 1e3
    );
    assert!(worst < Duration::from_secs(2), "{worst:?}");

    // (b) coalescing: 10 events for one key inside the 2 s quiet window -> one document with
    // count 10 and every event in the order sent.
    let sent: Vec<serde_json::Value> = (1..=10)
        .map(|i| serde_json::json!({"id": format!("co-{i}"), "topic": "burst", "i": i}))
        .collect();
    let started = Instant::now();
    tokio::task::block_in_place(|| {
        for ev in &sent {
            let r = p.post("coalesced", secret, ev.to_string().as_bytes(), &[]);
            assert_eq!(r.status, 200, "{:?}", r.json());
        }
    });
    let sending = started.elapsed();
    assert!(
        sending < Duration::from_secs(2),
        "the 10 events must land inside one quiet window; sending took {sending:?}"
    );
    // quiet_s (2) + one poll (5) + slack.
    let docs = wait_docs(&rx, "coalesced", 1, Duration::from_secs(20)).await;
    assert_eq!(docs.len(), 1, "log:\n{}", p.log());
    // Nothing more can come once the spool holds exactly one batch for the source and it is
    // delivered (no open, sealed or retrying one that a later tick could send): asked of the
    // spool, not proved by waiting. The document arrives before its mark is recorded, so
    // wait for the mark.
    let states_of = || {
        spool
            .open(home.path())
            .list_batches(&hookspool::store::BatchFilter {
                source: Some("coalesced".into()),
                limit: 100,
                ..Default::default()
            })
            .unwrap()
            .iter()
            .map(|b| b.state.as_str().to_string())
            .collect::<Vec<_>>()
    };
    let recorded = tokio::task::block_in_place(|| {
        super::eventually(Duration::from_secs(10), || {
            states_of().iter().all(|s| s != "leased")
        })
    });
    assert!(recorded, "the mark was never recorded; log:\n{}", p.log());
    assert_eq!(states_of(), vec!["delivered"], "one burst, one batch");
    let docs = docs_for(&rx, "coalesced");
    assert_eq!(docs.len(), 1, "one burst, one document");
    let doc = docs[0].json();
    assert_eq!(doc["count"], 10);
    assert_eq!(doc["key"], "burst");
    assert_eq!(doc["events"], serde_json::Value::Array(sent));
    assert_signed(&docs[0]);
    let waited = docs[0].at.saturating_duration_since(started);
    assert!(
        waited >= Duration::from_secs(2),
        "a coalesced batch waits out its quiet window: {waited:?}"
    );

    // (d) SIGTERM -> exit 0.
    p.sigterm();
    let st = tokio::task::block_in_place(|| p.wait_exit(Duration::from_secs(20)));
    assert!(st.success(), "{st:?}\n{}", p.log());
    let s = spool.open(home.path());
    assert_eq!(s.check_invariants().unwrap(), Vec::<String>::new());
    if spool.cluster.is_some() {
        assert!(
            !home.path().join("spool.db").exists(),
            "nothing was spooled beside the configured PostgreSQL spool"
        );
    }
}

/// Socket activation through the real binary, as the tests' [`reserved_port`] relies on: a
/// listening socket passed as LISTEN_FDS is served, and the configured `listen` is not
/// bound (the configured Unix socket never appears).
#[test]
fn run_serves_the_socket_it_inherits_instead_of_its_configured_listen() {
    let home = tempfile::tempdir().unwrap();
    let configured = home.path().join("configured.sock");
    std::fs::write(
        home.path().join("config.toml"),
        format!(
            "[intake]\nlisten = \"unix:{}\"\n[admin]\nlisten = \"\"\n",
            configured.display()
        ),
    )
    .unwrap();
    let port = reserved_port();
    let p = RunProc::start(home.path(), ([127, 0, 0, 1], port).into(), &[]);
    let r = raw(p.addr, &request("GET", "/healthz", &[], b""));
    assert!(r.status == 200 || r.status == 503, "{}", r.status);
    assert!(!configured.exists(), "the configured listen was bound too");
}
