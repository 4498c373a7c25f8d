//! The child side of multi-process tests: the parent re-runs this test binary with
//! `--ignored --exact child::child_entry` and the operation in the environment, so a real
//! separate process does real store work and can be killed at a failpoint.

use hookspool::store::{AttemptReport, Mark};

use super::{request, window};

#[test]
#[ignore = "entry point for child processes spawned by the crash and concurrency tests"]
fn child_entry() {
    let Ok(op) = std::env::var("HOOKSPOOL_TEST_CHILD_OP") else {
        return;
    };
    let db = std::path::PathBuf::from(std::env::var("HOOKSPOOL_TEST_DB").expect("db"));
    let args: serde_json::Value =
        serde_json::from_str(&std::env::var("HOOKSPOOL_TEST_ARGS").expect("args")).expect("json");
    let mut s = super::open_spec(&db);
    match op.as_str() {
        "seal" => {
            s.seal_ready(args["now"].as_f64().unwrap()).unwrap();
        }
        "claim" => {
            s.claim(
                args["batch"].as_i64().unwrap(),
                "child:1",
                9e9,
                1.0,
                false,
                hookspool::store::DeliveryId::per_attempt(""),
            )
            .unwrap();
        }
        "mark_with_emits" => {
            let emit = request(
                "emitted",
                "e",
                r#"{"emit":1}"#,
                2.0,
                window(0.0, 0.0, 10, 10_000),
            );
            let rep = AttemptReport {
                batch_id: args["batch"].as_i64().unwrap(),
                attempt_id: args["attempt"].as_i64().unwrap(),
                lease_owner: args["owner"].as_str().unwrap().to_string(),
                now: 2.0,
                status: Some(0),
                error: None,
                duration_ms: 1,
                delivery_id: None,
                events_delivered: None,
                failed_event_id: None,
                mark: Mark::Delivered {
                    result: None,
                    emits: vec![emit.clone(), emit],
                },
            };
            s.mark(&rep).unwrap();
        }
        "writer" => {
            // One process of the concurrency test: `n` enqueues, each its own transaction.
            let w = args["writer"].as_i64().unwrap();
            let n = args["n"].as_i64().unwrap();
            let keys = args["keys"].as_i64().unwrap();
            let win = window(
                0.0,
                0.0,
                args["max_events"].as_i64().unwrap(),
                args["max_bytes"].as_i64().unwrap(),
            );
            for i in 0..n {
                let payload = format!(r#"{{"w":{w},"i":{i}}}"#);
                let r = request(
                    "shared",
                    &format!("k{}", i % keys),
                    &payload,
                    1.0 + i as f64,
                    win,
                );
                // Busy is an answer a sender retries (PostgreSQL: a race lost 16 times).
                let mut tries = 0;
                loop {
                    match s.enqueue(&r) {
                        Err(hookspool::store::StoreError::Busy) if tries < 50 => tries += 1,
                        other => {
                            other.unwrap();
                            break;
                        }
                    }
                }
            }
        }
        other => panic!("unknown child op {other}"),
    }
}
