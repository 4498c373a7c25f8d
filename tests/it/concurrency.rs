//! Four writer processes x 1 000 enqueues into shared groups (spec 18): no batch exceeds
//! max_events / max_bytes, per-key order equals commit order, nothing lost or duplicated.

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
    let db = dir.path().join("spool.db");
    drop(open(&db));
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
    let s = open(&db);
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
