//! Issue 31: the management API's remaining reads through the real `hookspool admin`, over
//! a real SQLite spool seeded at the present time: the batch filters by event type, dedup
//! id, a JSON path of the payload and free search; events by dedup id; destinations
//! (breaker, backlog, latency percentiles, last error); sources and bobbins (events,
//! duplicates, quarantined); polls; the backlog series; and `hookspool list --search`,
//! which agrees with the API.

use std::path::Path;
use std::process::Command;

use hookspool::store::{AttemptReport, EnqueueOutcome, Mark};
use hookspool::vocab::Klass;
use serde_json::Value;

use super::admin::{AdminProc, home_with_token, ids};
use super::{bin, open, request, window};

fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Three batches, first events 3000, 2000 and 1000 s ago: `a` (source test, http:r0,
/// order.paid, evt_A, sent twice) delivered in 120 ms; `b` (test, http:r0, order.failed,
/// evt_B) dead after a 500 in 300 ms; `c` (source other, http:r1, customer, evt_C, a JSON string
/// body) still open. A poll instance `tick` is scheduled.
pub(super) struct Seeded {
    pub(super) a: i64,
    pub(super) b: i64,
    pub(super) c: i64,
    pub(super) t0: f64,
}

pub(super) fn seed(db: &Path) -> Seeded {
    let t0 = now();
    let mut st = open(db);
    let w = window(0.0, 0.0, 100, 1 << 20);
    let mut put = |source: &str, route: &str, key: &str, ty: &str, dedup: &str, body: &str, t| {
        let mut r = request(route, key, body, t, w);
        r.source = source.into();
        r.event_type = ty.into();
        r.dedup_id = Some(dedup.into());
        match st.enqueue(&r).unwrap() {
            EnqueueOutcome::Queued { copies } => Some(copies[0].1),
            EnqueueOutcome::Duplicate { .. } => None,
            other => panic!("{other:?}"),
        }
    };
    let paid = r#"{"status":"paid","amount":42,"ok":true,"data":{"id":"x1"}}"#;
    let a = put(
        "test",
        "r0",
        "order-1",
        "order.paid",
        "evt_A",
        paid,
        t0 - 3000.0,
    )
    .unwrap();
    assert!(
        put(
            "test",
            "r0",
            "order-1",
            "order.paid",
            "evt_A",
            paid,
            t0 - 2990.0
        )
        .is_none()
    );
    let b = put(
        "test",
        "r0",
        "order-2",
        "order.failed",
        "evt_B",
        r#"{"status":"failed","amount":7}"#,
        t0 - 2000.0,
    )
    .unwrap();
    let c = put(
        "other",
        "r1",
        "cust-9",
        "customer",
        "evt_C",
        r#""name=x&v=1""#,
        t0 - 1000.0,
    )
    .unwrap();
    st.seal_ready(t0 - 1990.0).unwrap();
    for (id, at, ms, mark, status) in [
        (
            a,
            t0 - 1900.0,
            120,
            Mark::Delivered {
                result: None,
                emits: vec![],
            },
            200,
        ),
        (
            b,
            t0 - 1800.0,
            300,
            Mark::Dead {
                klass: Klass::Permanent,
            },
            500,
        ),
    ] {
        let claim = st
            .claim(
                id,
                "test",
                at + 60.0,
                at,
                false,
                hookspool::store::DeliveryId::per_attempt("d"),
            )
            .unwrap()
            .unwrap();
        st.mark(&AttemptReport {
            batch_id: id,
            attempt_id: claim.attempt_id,
            lease_owner: claim.lease_owner,
            now: at + ms as f64 / 1000.0,
            status: Some(status),
            error: (status != 200).then(|| format!("http {status}")),
            duration_ms: ms,
            delivery_id: None,
            events_delivered: None,
            failed_event_id: None,
            mark,
        })
        .unwrap();
    }
    st.poll_schedule_new("tick", t0 + 60.0, t0).unwrap();
    // The intake's rejection counts: this hour's, and one two days old (outside the day).
    let hour = hookspool::store::rejection_hour(t0);
    let count = |hour, reason: &str, count| hookspool::store::RejectionCount {
        hour,
        source: "test".into(),
        reason: reason.into(),
        count,
    };
    st.add_rejections(&[
        count(hour, "unverified", 2),
        count(hour, "too_large", 1),
        count(hour - 48 * 3600, "unverified", 5),
    ])
    .unwrap();
    Seeded { a, b, c, t0 }
}

fn find<'a>(v: &'a Value, list: &str, name: &str) -> &'a Value {
    v[list]
        .as_array()
        .unwrap_or_else(|| panic!("{list}: {v}"))
        .iter()
        .find(|d| d["name"] == name)
        .unwrap_or_else(|| panic!("{name} in {v}"))
}

#[test]
fn every_read_endpoint_and_filter_answers_from_the_spool() {
    let (home, token) = home_with_token();
    let db = home.path().join("spool.db");
    let s = seed(&db);
    let api = AdminProc::start(home.path(), &token);
    let get = |p: &str| {
        let (st, v) = api.get(p);
        assert_eq!(st, 200, "{p}: {v}");
        v
    };

    // The batch filters.
    for (query, want) in [
        ("event_type=order.paid", vec![s.a]),
        ("dedup_id=evt_B", vec![s.b]),
        ("json_path=$.status&json_value=paid", vec![s.a]),
        ("json_path=$.amount&json_value=7", vec![s.b]),
        ("json_path=$.ok&json_value=true", vec![s.a]),
        ("json_path=$.data.id&json_value=x1", vec![s.a]),
        ("json_path=$.status&json_value=nope", vec![]),
        ("search=evt_C", vec![s.c]),
        ("search=order-", vec![s.b, s.a]),
        ("search=customer", vec![s.c]),
        ("search=order&state=dead", vec![s.b]),
    ] {
        assert_eq!(
            ids(&get(&format!("/api/v1/batches?{query}"))),
            want,
            "{query}"
        );
    }
    for bad in [
        "json_path=status&json_value=paid",
        "json_path=$.a'b&json_value=1",
        "json_path=$.status",
        "json_value=paid",
    ] {
        let (st, v) = api.get(&format!("/api/v1/batches?{bad}"));
        assert_eq!(
            (st, v["error"].as_str()),
            (400, Some("bad_request")),
            "{bad}: {v}"
        );
    }

    // Events by dedup id: the event, its batch and the duplicates answered.
    let v = get("/api/v1/events?dedup_id=evt_A");
    let e = &v["events"].as_array().unwrap();
    assert_eq!(e.len(), 1, "{v}");
    assert_eq!(e[0]["event"]["batch_id"], s.a);
    assert_eq!(e[0]["batch"]["state"], "delivered");
    assert_eq!(e[0]["duplicates"], 1);
    assert!(e[0]["event"].get("payload").is_none(), "{v}");
    let v = get("/api/v1/events?dedup_id=evt_A&source=other");
    assert_eq!(v["events"], serde_json::json!([]));
    assert_eq!(api.get("/api/v1/events").0, 400);

    // Destinations: breaker, backlog, latency over the last hour, the last error.
    let v = get("/api/v1/destinations");
    let r0 = find(&v, "destinations", "http:r0");
    assert_eq!(r0["breaker"]["state"], "closed", "{r0}");
    assert_eq!(r0["pending"], 0);
    assert_eq!(r0["dead"], 1);
    assert_eq!(r0["latency_ms"]["count"], 2, "{r0}");
    assert_eq!(r0["latency_ms"]["p50"], 120);
    assert_eq!(r0["latency_ms"]["p99"], 300);
    assert_eq!(r0["last_error"]["status"], 500, "{r0}");
    assert_eq!(r0["last_error"]["batch_id"], s.b);
    let r1 = find(&v, "destinations", "http:r1");
    assert_eq!(r1["pending"], 1);
    assert_eq!(r1["latency_ms"]["count"], 0);
    assert!(r1["last_error"].is_null());

    // Sources: committed events (a duplicate is not one), duplicates, last event.
    let v = get("/api/v1/sources");
    let t = find(&v, "sources", "test");
    assert_eq!(
        (t["events"].as_i64(), t["duplicates"].as_i64()),
        (Some(2), Some(1)),
        "{t}"
    );
    // The rejections the intake stored, over the day (the two-day-old hour left out).
    assert_eq!(t["rejected"], 3, "{t}");
    assert_eq!(
        t["rejected_by_reason"],
        serde_json::json!({"too_large": 1, "unverified": 2}),
        "{t}"
    );
    let o = find(&v, "sources", "other");
    assert_eq!(o["events"], 1, "{o}");
    assert_eq!(o["rejected"], 0, "{o}");
    assert!(v["bobbins"].is_array());
    let v = get("/api/v1/rejections");
    assert_eq!(
        (v["hours"].as_i64(), v["total"].as_i64()),
        (Some(24), Some(3)),
        "{v}"
    );
    assert_eq!(v["by_reason"]["unverified"], 2, "{v}");
    let v = get("/api/v1/rejections?hours=72");
    assert_eq!(v["total"], 8, "{v}");
    assert_eq!(
        v["by_source"],
        serde_json::json!([{"source": "test", "reason": "too_large", "count": 1},
            {"source": "test", "reason": "unverified", "count": 7}]),
        "{v}"
    );
    assert_eq!(api.get("/api/v1/rejections?hours=0").0, 400);
    assert_eq!(api.get("/api/v1/rejections?hours=9999").0, 400);

    // Polls.
    let v = get("/api/v1/polls");
    assert_eq!(v["polls"][0]["instance"], "tick", "{v}");

    // The backlog series over the last hour: http:r0 held a (from 3000 s ago to 1900 s
    // ago) and b (from 2000 s ago until it died 1800 s ago); http:r1 holds c since 1000 s
    // ago.
    let v = get("/api/v1/backlog?hours=1");
    let at = |d: &str, t: f64| -> (i64, Option<f64>) {
        let pts = v["destinations"][d]
            .as_array()
            .unwrap_or_else(|| panic!("{d}: {v}"));
        let p = pts
            .iter()
            .min_by(|x, y| {
                let dx = (x["at"].as_f64().unwrap() - t).abs();
                let dy = (y["at"].as_f64().unwrap() - t).abs();
                dx.total_cmp(&dy)
            })
            .unwrap();
        (p["pending"].as_i64().unwrap(), p["oldest_age_s"].as_f64())
    };
    assert_eq!(at("http:r0", s.t0 - 3500.0).0, 0);
    let (n, age) = at("http:r0", s.t0 - 1950.0);
    assert_eq!(n, 2, "{v}");
    assert!(
        age.is_some_and(|a| (1000.0..1100.0).contains(&a)),
        "{age:?}"
    );
    assert_eq!(at("http:r0", s.t0).0, 0);
    let (n, age) = at("http:r1", s.t0);
    assert_eq!(n, 1);
    assert!(age.is_some_and(|a| a >= 1000.0), "{age:?}");
    assert_eq!(api.get("/api/v1/backlog?hours=0").0, 400);
    drop(api);

    // The CLI's --search agrees with the API's.
    let o = Command::new(bin())
        .arg("--home")
        .arg(home.path())
        .args(["--json", "list", "--search", "order-"])
        .env_remove("HOOKSPOOL_CONFIG")
        .env_remove("HOOKSPOOL_HOME")
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let listed: Vec<i64> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["id"].as_i64().unwrap())
        .collect();
    assert_eq!(listed, vec![s.b, s.a]);
}
