//! Four writer processes x 1 000 enqueues into shared groups (spec 18): no batch exceeds
//! max_events / max_bytes, per-key order equals commit order, nothing lost or duplicated;
//! and the same with a live `hookspool dispatch` delivering to a real receiver while they
//! write (with the gate closed for the first half): every event delivered once, in batches
//! delivered once each, per-key order kept, keys in parallel, a second dispatcher exits 3.

use std::collections::{BTreeMap, BTreeSet};

use hookspool::store::BatchFilter;
use serde_json::json;

use super::{child, open};

const WRITERS: i64 = 4;
const PER_WRITER: i64 = 1000;
const MAX_EVENTS: i64 = 7;
const MAX_BYTES: i64 = 100;

#[test]
fn four_writer_processes_share_groups_without_loss_or_overflow() {
    let dir = tempfile::tempdir().unwrap();
    four_writers(dir.path(), &super::TestSpool::sqlite());
}

/// The same four writer processes on one PostgreSQL spool: the join rule and the size
/// seals hold under writers that really run at once (row locks, not one writer lock).
#[test]
fn four_writer_processes_share_groups_without_loss_or_overflow_on_postgres() {
    let dir = tempfile::tempdir().unwrap();
    let Some(spool) = super::TestSpool::postgres(dir.path()) else {
        return;
    };
    four_writers(dir.path(), &spool);
}

fn four_writers(home: &std::path::Path, spool: &super::TestSpool) {
    let db = spool.spec(home);
    drop(spool.open(home));
    let handles: Vec<_> = (0..WRITERS)
        .map(|w| {
            let db = db.clone();
            std::thread::spawn(move || {
                child(
                    "writer",
                    &db,
                    &json!({"writer": w, "n": PER_WRITER, "keys": 3, "max_events": MAX_EVENTS, "max_bytes": MAX_BYTES}),
                    None,
                )
            })
        })
        .collect();
    for h in handles {
        let out = h.join().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let s = spool.open(home);
    let batches = s
        .list_batches(&BatchFilter {
            limit: 1_000_000,
            ..Default::default()
        })
        .unwrap();
    let mut seen = BTreeSet::new();
    // Per key: the events in batch order, then event order.
    let mut by_key: BTreeMap<String, Vec<(i64, i64, i64)>> = BTreeMap::new();
    let mut sorted = batches.clone();
    sorted.sort_by_key(|b| b.id);
    for b in &sorted {
        assert!(
            b.count <= MAX_EVENTS,
            "batch {} has {} events",
            b.id,
            b.count
        );
        assert!(b.bytes <= MAX_BYTES, "batch {} has {} bytes", b.id, b.bytes);
        for e in s.events(b.id, true).unwrap() {
            let v: serde_json::Value = serde_json::from_str(&e.payload.unwrap()).unwrap();
            let (w, i) = (v["w"].as_i64().unwrap(), v["i"].as_i64().unwrap());
            assert!(seen.insert((w, i)), "event ({w},{i}) stored twice");
            by_key.entry(b.key.clone()).or_default().push((e.id, w, i));
        }
    }
    assert_eq!(seen.len() as i64, WRITERS * PER_WRITER, "no event lost");
    for (key, events) in by_key {
        for pair in events.windows(2) {
            assert!(
                pair[0].0 < pair[1].0,
                "key {key}: batch order disagrees with commit order"
            );
        }
        for w in 0..WRITERS {
            let mine: Vec<i64> = events.iter().filter(|e| e.1 == w).map(|e| e.2).collect();
            assert!(
                mine.windows(2).all(|p| p[0] < p[1]),
                "key {key}: writer {w}'s events out of order"
            );
        }
    }
    assert_eq!(s.check_invariants().unwrap(), Vec::<String>::new());
}

/// Writers of the test with a live dispatcher: real time, so the dispatcher's windows apply.
const LIVE_PER_WRITER: i64 = 400;
const LIVE_KEYS: i64 = 4;
/// Every delivery is answered after this long, so attempts overlap when they may.
const RECEIVER_DELAY_MS: u64 = 30;

#[test]
#[ignore = "entry point for the writer processes of the live-dispatcher concurrency test"]
fn live_writer_entry() {
    let Ok(db) = std::env::var("HOOKSPOOL_TEST_LIVE_DB") else {
        return;
    };
    let w: i64 = std::env::var("HOOKSPOOL_TEST_LIVE_WRITER")
        .unwrap()
        .parse()
        .unwrap();
    let mut s = open(std::path::Path::new(&db));
    for i in 0..LIVE_PER_WRITER {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let r = super::request(
            "shared",
            &format!("k{}", i % LIVE_KEYS),
            &format!(r#"{{"w":{w},"i":{i}}}"#),
            now,
            super::window(0.05, 0.5, MAX_EVENTS, MAX_BYTES),
        );
        s.enqueue(&r).unwrap();
    }
}

fn live_writer(db: &std::path::Path, w: i64) -> std::process::Child {
    std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "concurrency::live_writer_entry",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("HOOKSPOOL_TEST_LIVE_DB", db)
        .env("HOOKSPOOL_TEST_LIVE_WRITER", w.to_string())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

fn hs(home: &std::path::Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new(super::bin())
        .arg("--home")
        .arg(home)
        .args(args)
        .env_remove("HOOKSPOOL_CONFIG")
        .env_remove("HOOKSPOOL_HOME")
        .env_remove("HOOKSPOOL_FAILPOINT")
        .env_remove("NOTIFY_SOCKET")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap()
}

/// One document at the receiver: when it arrived, its batch, its events as (writer, i).
type Delivery = (std::time::Instant, i64, Vec<(i64, i64)>);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_writers_and_a_live_dispatcher_deliver_every_event_once_in_order_and_in_bounds() {
    use super::receiver::{Answer, Receiver};
    use std::time::{Duration, Instant};
    let started = Instant::now();
    let rx = Receiver::start().await;
    rx.set_default(Answer::status(200).delay(Duration::from_millis(RECEIVER_DELAY_MS)));
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    std::fs::write(h.join("dest.secret"), "concurrency-secret").unwrap();
    std::fs::write(
        h.join("config.toml"),
        format!(
            r#"
[dispatch]
poll_s = 0.05
parallel = 4
[destinations."http:shared"]
type = "http"
url = "{}"
allow_insecure = true
allow_private = ["127.0.0.1/32"]
max_inflight = 4
timeout_s = 10
secret = {{ file = "{}/dest.secret" }}
"#,
            rx.url(),
            h.display()
        ),
    )
    .unwrap();
    let db = h.join("spool.db");
    let mut d = super::fulldisk::Svc::start(h, "dispatch", &[]);
    tokio::task::block_in_place(|| d.wait_log("dispatcher ready", Duration::from_secs(30)));
    // The gate is closed while the first half of the events arrives: batches pile up,
    // sealed by their bounds, and drain once it opens.
    let paused = hs(h, &["pause", "http:shared", "--reason", "concurrency test"]);
    assert!(
        paused.status.success(),
        "{}",
        String::from_utf8_lossy(&paused.stderr)
    );
    let mut writers: Vec<_> = (0..WRITERS).map(|w| live_writer(&db, w)).collect();
    let total = WRITERS * LIVE_PER_WRITER;
    tokio::task::block_in_place(|| {
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            let stored: i64 = open(&db)
                .list_batches(&BatchFilter {
                    limit: 100_000,
                    ..Default::default()
                })
                .unwrap()
                .iter()
                .map(|b| b.count)
                .sum();
            if stored >= total / 2 {
                break;
            }
            assert!(Instant::now() < until, "the writers stalled at {stored}");
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    assert!(
        rx.requests().is_empty(),
        "nothing is delivered through a closed gate"
    );
    // A second dispatcher is refused while this one runs.
    let second = hs(h, &["dispatch"]);
    assert_eq!(
        second.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&second.stderr)
    );
    let resumed = hs(h, &["resume", "http:shared"]);
    assert!(resumed.status.success());
    tokio::task::block_in_place(|| {
        for w in &mut writers {
            assert!(w.wait().unwrap().success());
        }
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            let s = open(&db);
            let pending = s
                .list_batches(&BatchFilter {
                    limit: 100_000,
                    ..Default::default()
                })
                .unwrap()
                .iter()
                .filter(|b| b.state.as_str() != "delivered")
                .count();
            if pending == 0 {
                break;
            }
            assert!(Instant::now() < until, "{pending} batches never delivered");
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    assert!(d.stop().success());

    let s = open(&db);
    let rows = s
        .list_batches(&BatchFilter {
            limit: 100_000,
            ..Default::default()
        })
        .unwrap();
    for b in &rows {
        assert!(
            b.count <= MAX_EVENTS,
            "batch {} has {} events",
            b.id,
            b.count
        );
        assert!(b.bytes <= MAX_BYTES, "batch {} has {} bytes", b.id, b.bytes);
    }
    assert_eq!(s.check_invariants().unwrap(), Vec::<String>::new());
    // What the receiver saw: each batch id once (it always answered 200), every event in
    // exactly one batch.
    let got = rx.requests();
    let mut by_batch: BTreeMap<i64, usize> = BTreeMap::new();
    let mut seen = BTreeSet::new();
    let mut by_key: BTreeMap<String, Vec<Delivery>> = BTreeMap::new();
    for r in &got {
        let doc = r.json();
        let batch = doc["batch_id"].as_i64().unwrap();
        *by_batch.entry(batch).or_default() += 1;
        let events: Vec<(i64, i64)> = doc["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| (e["w"].as_i64().unwrap(), e["i"].as_i64().unwrap()))
            .collect();
        assert!(
            events.len() as i64 <= MAX_EVENTS,
            "a document over max_events"
        );
        for e in &events {
            assert!(seen.insert(*e), "event {e:?} delivered in two batches");
        }
        by_key
            .entry(doc["key"].as_str().unwrap().to_string())
            .or_default()
            .push((r.at, batch, events));
    }
    assert!(
        by_batch.values().all(|n| *n == 1),
        "every batch delivered exactly once"
    );
    assert_eq!(by_batch.len(), rows.len(), "every batch was delivered");
    assert_eq!(seen.len() as i64, total, "every event delivered");
    let delay = Duration::from_millis(RECEIVER_DELAY_MS);
    for (key, mut deliveries) in by_key.clone() {
        deliveries.sort_by_key(|d| d.0);
        for pair in deliveries.windows(2) {
            assert!(pair[0].1 < pair[1].1, "key {key}: batches out of order");
            assert!(
                pair[1].0 >= pair[0].0 + delay,
                "key {key}: two of its batches in flight at once"
            );
        }
        for w in 0..WRITERS {
            let mine: Vec<i64> = deliveries
                .iter()
                .flat_map(|d| d.2.iter())
                .filter(|e| e.0 == w)
                .map(|e| e.1)
                .collect();
            assert!(
                mine.windows(2).all(|p| p[0] < p[1]),
                "key {key}: writer {w}'s events out of order"
            );
        }
    }
    // Parallel across keys: deliveries of different keys overlapped at the receiver.
    let mut all: Vec<(Instant, &String)> = by_key
        .iter()
        .flat_map(|(k, ds)| ds.iter().map(move |d| (d.0, k)))
        .collect();
    all.sort();
    let overlapping = all
        .windows(2)
        .filter(|p| p[0].1 != p[1].1 && p[1].0 < p[0].0 + delay)
        .count();
    assert!(
        overlapping > 0,
        "no two keys were ever delivered at the same time"
    );
    eprintln!(
        "live concurrency: {total} events in {} batches, {overlapping} cross-key overlaps, {:.1} s",
        rows.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "well under 30 s"
    );
}
