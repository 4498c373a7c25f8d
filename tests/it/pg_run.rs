//! `hookspool run` on a PostgreSQL spool under load (issue 32): a sender that retries every
//! webhook until it is acknowledged, as providers do, while the test SIGKILLs the process
//! and then stops PostgreSQL (`pg_ctl stop -m immediate`) for a few seconds and starts it
//! again. While the database is down the intake answers 503 with Retry-After and stays up;
//! the dispatcher waits and both reconnect on their own. In the end every acknowledged
//! event is delivered, each key's events in the order they were acknowledged, every batch
//! delivered again (after the kill) with the same content, and nothing is left leased.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use super::TestSpool;
use super::intake::Resp;
use super::receiver::Receiver;
use super::run_e2e::{RunProc, free_port};

const SECRET: &str = "pg-run-source-secret";
const EVENTS: usize = 600;
const KEYS: usize = 10;

/// The config of the PostgreSQL load tests (this one and multihost): the HMAC source `load`
/// (keyed by topic, deduplicated by id, 0.2 s quiet, at most 20 events) to the http
/// destination `recv` at `url`, which may be in `private` (a CIDR); `intake` is the
/// `[intake]` table's lines, `tail` the sections after those (the `[spool]` section).
pub(super) fn write_load_config(
    home: &std::path::Path,
    intake: &str,
    url: &str,
    private: &str,
    tail: &str,
) {
    std::fs::write(home.join("source.secret"), SECRET).unwrap();
    std::fs::write(home.join("dest.secret"), "pg-run-destination-secret").unwrap();
    let text = format!(
        r#"
[intake]
{intake}

[limits]
min_free_bytes = 0

[dispatch]
poll_s = 0.5
parallel = 4

[sources.load]
type = "template"
scheme = "hmac-sha256-hex"
header = "X-Signature"
prefix = "sha256="
key = "payload.topic"
dedup = "payload.id"
quiet_s = 0.2
max_s = 1
max_events = 20
action = "recv"
secrets.secret = {{ file = "{home}/source.secret" }}

[destinations.recv]
type = "http"
url = "{url}"
allow_insecure = true
allow_private = ["{private}"]
timeout_s = 10
secret = {{ file = "{home}/dest.secret" }}
{tail}"#,
        home = home.display()
    );
    std::fs::write(home.join("config.toml"), text).unwrap();
}

/// A home for `hookspool run` on `spool` with the load config into `rx`, and the address
/// its intake will listen on.
fn load_home(spool: &TestSpool, rx: &Receiver) -> (tempfile::TempDir, SocketAddr) {
    let home = tempfile::tempdir().unwrap();
    let port = free_port();
    write_load_config(
        home.path(),
        &format!("listen = \"127.0.0.1:{port}\""),
        &rx.url(),
        "127.0.0.1/32",
        &spool.section,
    );
    (home, format!("127.0.0.1:{port}").parse().unwrap())
}

/// One POST signed for this test's source, or `None` when no answer came.
pub(super) fn try_post(addr: SocketAddr, body: &[u8]) -> Option<Resp> {
    super::intake::try_post_signed(addr, "/hooks/load", SECRET.as_bytes(), body)
}

/// What the sender saw.
#[derive(Default)]
struct Seen {
    /// Acknowledged ids, in order.
    acked: Vec<u64>,
    /// Statuses other than 200, with whether a Retry-After came along.
    refusals: Vec<(u16, bool)>,
    /// Answers while PostgreSQL was down.
    while_down: Vec<u16>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_on_postgres_survives_sigkill_and_a_database_restart_under_load() {
    let dir = tempfile::tempdir().unwrap();
    let Some(spool) = tokio::task::block_in_place(|| TestSpool::postgres(dir.path())) else {
        return;
    };
    let rx = Receiver::start().await;
    let (home, addr) = load_home(&spool, &rx);
    let mut p = tokio::task::block_in_place(|| RunProc::start(home.path(), addr, &[]));

    let seen = Arc::new(Mutex::new(Seen::default()));
    let down = Arc::new(AtomicBool::new(false));
    let acked_n = Arc::new(AtomicUsize::new(0));
    let sender = {
        let (seen, down, acked_n) = (seen.clone(), down.clone(), acked_n.clone());
        std::thread::spawn(move || {
            for n in 0..EVENTS as u64 {
                let body = format!(r#"{{"id":"e{n}","topic":"k{}","n":{n}}}"#, n % KEYS as u64);
                let deadline = Instant::now() + Duration::from_secs(120);
                loop {
                    assert!(Instant::now() < deadline, "event {n} never acknowledged");
                    let r = try_post(addr, body.as_bytes());
                    let mut s = seen.lock().unwrap();
                    if let Some(r) = &r {
                        if down.load(Ordering::SeqCst) {
                            s.while_down.push(r.status);
                        }
                        if r.status == 200 {
                            s.acked.push(n);
                            acked_n.fetch_add(1, Ordering::SeqCst);
                            break;
                        }
                        s.refusals
                            .push((r.status, r.header("retry-after").is_some()));
                    }
                    drop(s);
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        })
    };
    let wait_acked = |n: usize| {
        let until = Instant::now() + Duration::from_secs(120);
        while acked_n.load(Ordering::SeqCst) < n {
            assert!(Instant::now() < until, "stuck below {n} acknowledged");
            std::thread::sleep(Duration::from_millis(10));
        }
    };

    // 1. SIGKILL the whole process mid-load and start it again.
    tokio::task::block_in_place(|| wait_acked(EVENTS / 4));
    p.signal(Signal::SIGKILL);
    tokio::task::block_in_place(|| p.wait_exit(Duration::from_secs(10)));
    let killed_log = p.log();
    let mut p = tokio::task::block_in_place(|| RunProc::start(home.path(), addr, &[]));

    // 2. PostgreSQL stops (immediate: no checkpoint, as a crash) for 3 s, then starts.
    tokio::task::block_in_place(|| wait_acked(EVENTS / 2));
    let cluster = spool.cluster.as_ref().expect("a PostgreSQL spool");
    down.store(true, Ordering::SeqCst);
    tokio::task::block_in_place(|| {
        cluster.stop_immediate();
        std::thread::sleep(Duration::from_secs(3));
    });
    down.store(false, Ordering::SeqCst);
    tokio::task::block_in_place(|| cluster.start_again());

    tokio::task::block_in_place(|| sender.join().expect("the sender"));
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    assert_eq!(seen.acked.len(), EVENTS, "every event acknowledged once");

    // While PostgreSQL was down: 503 with Retry-After, nothing else but success before it
    // stopped answering.
    let refused_down: Vec<u16> = seen
        .while_down
        .iter()
        .copied()
        .filter(|s| *s != 200)
        .collect();
    assert!(
        refused_down.contains(&503),
        "the intake answered 503 while the database was down: {:?}; log:\n{}",
        seen.while_down,
        p.log()
    );
    for (status, retry_after) in &seen.refusals {
        assert_eq!(*status, 503, "only 503 refuses: {:?}", seen.refusals);
        assert!(
            retry_after,
            "a 503 carries Retry-After: {:?}; log:\n{}",
            seen.refusals,
            p.log()
        );
    }
    p.assert_running("after the database came back");

    // Every acknowledged id delivered, in order per key, each batch with one content.
    let all: BTreeSet<u64> = seen.acked.iter().copied().collect();
    let delivered = || -> BTreeSet<u64> {
        rx.requests()
            .iter()
            .flat_map(|r| {
                r.json()["events"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
                    .into_iter()
                    .filter_map(|e| e["n"].as_u64())
            })
            .collect()
    };
    let complete = tokio::task::block_in_place(|| {
        super::eventually(Duration::from_secs(60), || delivered().is_superset(&all))
    });
    let missing: Vec<u64> = all.difference(&delivered()).copied().collect();
    if !complete {
        // What the spool holds for the keys that did not arrive.
        let s = spool.open(home.path());
        let keys: BTreeSet<u64> = missing.iter().map(|n| n % KEYS as u64).collect();
        for k in keys {
            for b in s
                .list_batches(&hookspool::store::BatchFilter {
                    key_prefix: Some(format!("k{k}")),
                    limit: 1000,
                    ..Default::default()
                })
                .unwrap()
            {
                eprintln!(
                    "k{k}: batch {} {} count {} first_at {} lease {:?} attempts {} last_error {:?}",
                    b.id,
                    b.state.as_str(),
                    b.count,
                    b.first_at,
                    b.lease_owner,
                    b.attempts,
                    b.last_error
                );
            }
        }
    }
    assert!(
        complete,
        "{} acknowledged events never delivered: {missing:?}; log:\n{}",
        missing.len(),
        p.log()
    );
    let docs = rx.requests();
    let mut first_seen: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    let mut counted: BTreeSet<u64> = BTreeSet::new();
    let mut content: BTreeMap<i64, serde_json::Value> = BTreeMap::new();
    for d in &docs {
        let doc = d.json();
        let batch = doc["batch_id"].as_i64().expect("batch_id");
        let events = doc["events"].clone();
        if let Some(before) = content.insert(batch, events.clone()) {
            assert_eq!(before, events, "batch {batch} delivered with two contents");
        }
        for e in events.as_array().unwrap() {
            let n = e["n"].as_u64().unwrap();
            if counted.insert(n) {
                first_seen.entry(n % KEYS as u64).or_default().push(n);
            }
        }
    }
    for (key, order) in &first_seen {
        let mut acked_order: Vec<u64> = seen
            .acked
            .iter()
            .copied()
            .filter(|n| n % KEYS as u64 == *key)
            .collect();
        acked_order.retain(|n| counted.contains(n));
        assert_eq!(order, &acked_order, "key k{key}: delivered out of order");
    }
    let redelivered = docs.len() - content.len();

    // Nothing left leased or waiting.
    let states = || -> BTreeMap<String, usize> {
        let mut m = BTreeMap::new();
        for b in spool
            .open(home.path())
            .list_batches(&hookspool::store::BatchFilter {
                limit: 100_000,
                ..Default::default()
            })
            .unwrap()
        {
            *m.entry(b.state.as_str().to_string()).or_default() += 1;
        }
        m
    };
    let settled = tokio::task::block_in_place(|| {
        super::eventually(Duration::from_secs(30), || {
            states().keys().all(|s| s == "delivered")
        })
    });
    assert!(
        settled,
        "batches not delivered: {:?}; log:\n{}",
        states(),
        p.log()
    );
    let s = spool.open(home.path());
    assert_eq!(s.check_invariants().unwrap(), Vec::<String>::new());
    eprintln!(
        "pg run: {EVENTS} acknowledged, {} delivered in {} batches ({} documents, {redelivered} again after the kill), {} refusals (503 while down: {}), 0 lost",
        counted.len(),
        content.len(),
        docs.len(),
        seen.refusals.len(),
        refused_down.iter().filter(|s| **s == 503).count()
    );
    assert!(
        killed_log.contains("ready"),
        "the first process was serving before the kill"
    );
    p.sigterm();
    let st = tokio::task::block_in_place(|| p.wait_exit(Duration::from_secs(20)));
    assert!(st.success(), "{st:?}\n{}", p.log());
}

/// `hookspool --home <home> run` with stderr captured until `want` is in it, then SIGTERM;
/// the log.
fn run_until(home: &std::path::Path, port: u16, want: &str) -> String {
    let mut child = std::process::Command::new(super::bin())
        .arg("--home")
        .arg(home)
        .arg("run")
        .env_remove("HOOKSPOOL_CONFIG")
        .env_remove("HOOKSPOOL_HOME")
        .env_remove("HOOKSPOOL_FAILPOINT")
        .env_remove("NOTIFY_SOCKET")
        .env_remove("LISTEN_FDS")
        .env_remove("LISTEN_PID")
        .env_remove("JOURNAL_STREAM")
        .env("HOOKSPOOL_PORT", port.to_string())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let log = super::capture_stderr(&mut child);
    let text = || String::from_utf8_lossy(&log.lock().unwrap()).into_owned();
    let seen = super::eventually(Duration::from_secs(30), || text().contains(want));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        Signal::SIGTERM,
    )
    .unwrap();
    let _ = child.wait();
    let log = text();
    assert!(seen, "expected {want:?} in\n{log}");
    log
}

/// The quick start `hookspool run` prints is true on the backend it runs on: on the
/// starter config it names the SQLite file; with `[spool] backend = "postgres"` added it
/// names the database (user@host:port/db, no password) and no spool.db, and the inspect
/// command it prints reads that spool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_run_banner_on_postgres_names_the_database() {
    let dir = tempfile::tempdir().unwrap();
    let Some(spool) = tokio::task::block_in_place(|| TestSpool::postgres(dir.path())) else {
        return;
    };
    let home = std::fs::canonicalize(dir.path()).unwrap().join("hs");
    let port = free_port();
    // The first start writes the starter (SQLite).
    let log = tokio::task::block_in_place(|| run_until(&home, port, "dispatcher ready"));
    let db = home.join("spool.db");
    assert!(
        log.contains(&format!("The spool is the SQLite file {}.", db.display())),
        "{log}"
    );
    // The same home on PostgreSQL.
    let cfg = home.join("config.toml");
    let text = std::fs::read_to_string(&cfg).unwrap() + &spool.section;
    std::fs::write(&cfg, text).unwrap();
    std::fs::remove_file(&db).unwrap();
    let log = tokio::task::block_in_place(|| run_until(&home, port, "dispatcher ready"));
    let banner: String = log
        .lines()
        .take_while(|l| !l.starts_with("Inspect with"))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        banner.contains("The spool is the PostgreSQL database ")
            && banner.contains(
                "/spool (spool.url). The host whose dispatcher is active writes the outbox"
            ),
        "{banner}"
    );
    assert!(
        !banner.contains("spool.db") && !banner.contains("SQLite"),
        "{banner}"
    );
    eprintln!("the banner on PostgreSQL:\n{banner}");
    assert!(!db.exists(), "nothing made a spool.db");
    let inspect = log
        .lines()
        .find_map(|l| l.strip_prefix("Inspect with: "))
        .and_then(|l| l.split("   ").next())
        .expect("the inspect command")
        .to_string();
    let words: Vec<&str> = inspect.split(' ').collect();
    let out = std::process::Command::new(words[0])
        .args(&words[1..])
        .env_remove("HOOKSPOOL_CONFIG")
        .env_remove("HOOKSPOOL_HOME")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{inspect}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The active dispatcher of a fresh PostgreSQL spool plans its ticks on indexes
/// (`Store::plan_ticks_on_indexes`): the plans its session caches at its first ticks, while
/// `batches` has not been analyzed, were sequential scans of the whole table (five in each
/// seal's find, one in the FIFO walk, one in each claim) until an analysis made it plan
/// again. `hookspool run` on a fresh spool delivers 60 webhooks on an immediate route, one at
/// a time, and stops; the server's count of sequential scans of `batches` (flushed by each
/// session as it ends) then stays below one per webhook: every tick (at least one per
/// webhook, and one each poll) made several before (1 094 for these 60 webhooks; 22 with
/// the plans on indexes, those of the start).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dispatcher_of_a_fresh_postgres_spool_plans_its_ticks_on_indexes() {
    const N: u64 = 60;
    let dir = tempfile::tempdir().unwrap();
    let Some(spool) = tokio::task::block_in_place(|| TestSpool::postgres(dir.path())) else {
        return;
    };
    let rx = Receiver::start().await;
    let (home, addr) = load_home(&spool, &rx);
    // Immediate: each webhook is sealed and claimed by the tick its commit wakes.
    let cfg = home.path().join("config.toml");
    let text = std::fs::read_to_string(&cfg).unwrap();
    assert!(text.contains("quiet_s = 0.2\nmax_s = 1\n"), "{text}");
    std::fs::write(
        &cfg,
        text.replace("quiet_s = 0.2\nmax_s = 1\n", "quiet_s = 0\nmax_s = 0\n"),
    )
    .unwrap();
    let mut p = tokio::task::block_in_place(|| RunProc::start(home.path(), addr, &[]));
    for n in 0..N {
        let body = format!(r#"{{"id":"e{n}","topic":"k{n}","n":{n}}}"#);
        let r = tokio::task::block_in_place(|| try_post(addr, body.as_bytes()));
        assert_eq!(r.map(|r| r.status), Some(200), "webhook {n}");
        // One at a time, each delivered before the next: a wake-up tick for each.
        rx.wait_for(n as usize + 1, Duration::from_secs(20)).await;
    }
    p.signal(Signal::SIGTERM);
    let status = tokio::task::block_in_place(|| p.wait_exit(Duration::from_secs(20)));
    assert!(status.success(), "run stopped: {status}\n{}", p.log());
    let url = spool.url.clone().expect("a PostgreSQL spool");
    let (seq, idx) = tokio::task::block_in_place(|| {
        let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        let r = c
            .query_one(
                "SELECT seq_scan, coalesce(idx_scan, 0) FROM pg_stat_user_tables
                 WHERE relname = 'batches'",
                &[],
            )
            .unwrap();
        (r.get::<_, i64>(0), r.get::<_, i64>(1))
    });
    eprintln!("batches after {N} webhooks: {seq} sequential scans, {idx} index scans");
    assert!(
        idx > N as i64,
        "the sessions' statistics reached the server: {idx} index scans"
    );
    assert!(
        seq < N as i64,
        "{seq} sequential scans of batches for {N} webhooks (each tick made several when its plans were made on a fresh spool)"
    );
}
