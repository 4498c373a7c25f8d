//! Issue 31: enqueue with an Idempotency-Key (spoold's "durable curl") and the live stream,
//! through the real `hookspool admin` over a real spool. The same key with the same body is
//! answered the original answer and enqueues nothing; the same key with another body is 409
//! and enqueues nothing; each enqueue is audited; the body never reaches the log or the
//! audit rows. The stream reports an event queued
//! through the API, a batch sealed, an attempt finished and an issue opened by other
//! writers of the spool, and a client resuming with Last-Event-ID is not sent again what it
//! had.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use hookspool::store::{AttemptReport, Mark, NewIssue};
use serde_json::Value;

use super::admin::{AdminProc, TOKEN, audit_rows, home_with_token};
use super::intake::{Resp, raw};
use super::open;

/// POST /api/v1/enqueue with the token, the CSRF header when `csrf`, and the key if any.
fn enqueue(a: &AdminProc, key: Option<&str>, body: &str, csrf: bool) -> Resp {
    let mut head = format!(
        "POST /api/v1/enqueue HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n"
    );
    if csrf {
        head.push_str("X-Hookspool-CSRF: 1\r\n");
    }
    if let Some(k) = key {
        head.push_str(&format!("Idempotency-Key: {k}\r\n"));
    }
    head.push_str(&format!(
        "Content-Type: application/json\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    ));
    raw(a.addr, head.as_bytes())
}

fn events_in(db: &std::path::Path) -> i64 {
    let c = rusqlite::Connection::open(db).unwrap();
    c.query_row("SELECT count(*) FROM events", [], |r| r.get(0))
        .unwrap()
}

#[test]
fn enqueue_with_an_idempotency_key_answers_a_repeat_and_refuses_a_reuse() {
    let (home, token) = home_with_token();
    let db = home.path().join("spool.db");
    drop(open(&db));
    let a = AdminProc::start(home.path(), &token);
    let body = r#"{"source":"app","key":"job-7","destination":"http:x","event_type":"done","payload":{"run":7,"note":"IDEMBODYSENTINEL"}}"#;

    let first = enqueue(&a, Some("build-2026-12-05"), body, true);
    assert_eq!(
        first.status,
        200,
        "{}",
        String::from_utf8_lossy(&first.body)
    );
    let v = first.json();
    assert_eq!(v["status"], "queued", "{v}");
    let batch = v["copies"][0]["batch"].as_i64().expect("a batch");
    assert_eq!(events_in(&db), 1);
    assert!(first.header("idempotent-replayed").is_none());

    // The same key and body: the original answer, nothing new.
    let again = enqueue(&a, Some("build-2026-12-05"), body, true);
    assert_eq!(again.status, 200);
    assert_eq!(again.json(), v, "the original answer");
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(events_in(&db), 1, "a repeat enqueues nothing");

    // The same key for other content: 409, nothing new.
    let other = body.replace("\"run\":7", "\"run\":8");
    let clash = enqueue(&a, Some("build-2026-12-05"), &other, true);
    assert_eq!(
        clash.status,
        409,
        "{}",
        String::from_utf8_lossy(&clash.body)
    );
    assert_eq!(clash.json()["error"], "idempotency_conflict");
    assert_eq!(events_in(&db), 1);

    // Another key is another request; no key at all enqueues each time.
    let fresh = enqueue(&a, Some("build-2026-12-06"), &other, true);
    assert_eq!(fresh.status, 200);
    assert_ne!(fresh.json()["copies"][0]["event"], v["copies"][0]["event"]);
    assert_eq!(enqueue(&a, None, body, true).status, 200);
    assert_eq!(enqueue(&a, None, body, true).status, 200);
    assert_eq!(events_in(&db), 4);

    // The gates and refusals, each changing nothing.
    assert_eq!(enqueue(&a, Some("k-csrf"), body, false).status, 403);
    let not_object = body.replace(r#"{"run":7,"note":"IDEMBODYSENTINEL"}"#, "[1,2]");
    assert_eq!(enqueue(&a, Some("k-array"), &not_object, true).status, 400);
    let no_dest = body.replace(r#""destination":"http:x","#, "");
    let r = enqueue(&a, Some("k-nodest"), &no_dest, true);
    assert_eq!(
        (r.status, r.json()["error"].as_str()),
        (409, Some("config"))
    );
    let long = "k".repeat(300);
    assert_eq!(enqueue(&a, Some(&long), body, true).status, 400);
    assert_eq!(events_in(&db), 4);
    // A refused key was not kept: it works once the request is right.
    assert_eq!(enqueue(&a, Some("k-array"), body, true).status, 200);

    let (s, b) = a.get(&format!("/api/v1/batches/{batch}"));
    assert_eq!(s, 200, "{b}");
    // Each enqueue that happened is audited in the spool (who, which batch), a repeat or a
    // refusal is not, and no row holds the body or the key.
    let rows = audit_rows(&db);
    let enq: Vec<_> = rows.iter().filter(|r| r.0 == "enqueue").collect();
    assert_eq!(enq.len(), 5, "{rows:?}");
    assert!(
        enq.iter()
            .all(|r| r.3["by"] == "admin-token" && r.2.as_deref() == Some("app")),
        "{rows:?}"
    );
    assert_eq!(enq[0].1, Some(batch));
    let text = format!("{rows:?}");
    assert!(
        !text.contains("IDEMBODYSENTINEL") && !text.contains("build-2026"),
        "{text}"
    );
    let log = a.log();
    assert!(log.contains("enqueue to source app (idempotent)"), "{log}");
    assert!(
        !log.contains("IDEMBODYSENTINEL"),
        "no body in the log:\n{log}"
    );
    assert!(
        !log.contains("build-2026-12-05"),
        "no key in the log:\n{log}"
    );
}

/// The stream's bytes so far, read until `want` shows up (or the deadline).
fn read_until(s: &mut TcpStream, seen: &mut String, want: &str, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    let mut buf = [0u8; 4096];
    while !seen.contains(want) {
        if Instant::now() > deadline {
            return false;
        }
        s.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        match s.read(&mut buf) {
            Ok(0) => return false,
            Ok(n) => seen.push_str(&String::from_utf8_lossy(&buf[..n])),
            Err(_) => {}
        }
    }
    true
}

fn open_stream(a: &AdminProc, last_id: Option<&str>) -> (TcpStream, String) {
    let mut s = TcpStream::connect(a.addr).unwrap();
    let mut head = format!(
        "GET /api/v1/events/stream HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\nAccept: text/event-stream\r\n"
    );
    if let Some(id) = last_id {
        head.push_str(&format!("Last-Event-ID: {id}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).unwrap();
    let mut seen = String::new();
    assert!(
        read_until(&mut s, &mut seen, ": open", Duration::from_secs(10)),
        "{seen}"
    );
    assert!(seen.starts_with("HTTP/1.1 200"), "{seen}");
    assert!(
        seen.to_ascii_lowercase()
            .contains("content-type: text/event-stream"),
        "{seen}"
    );
    (s, seen)
}

/// The data lines of the frames seen, as JSON, with each frame's id.
fn frames(seen: &str) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    let mut id = String::new();
    for line in seen.lines() {
        if let Some(i) = line.strip_prefix("id: ") {
            id = i.trim().to_string();
        } else if let Some(d) = line.strip_prefix("data: ")
            && let Ok(v) = serde_json::from_str::<Value>(d.trim())
        {
            out.push((id.clone(), v));
        }
    }
    out
}

#[test]
fn the_live_stream_tells_what_happens_and_resumes_where_it_was() {
    let (home, token) = home_with_token();
    let db = home.path().join("spool.db");
    drop(open(&db));
    let a = AdminProc::start(home.path(), &token);

    // Without the token: refused like every read.
    let r = raw(
        a.addr,
        b"GET /api/v1/events/stream HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 401);

    let (mut s, mut seen) = open_stream(&a, None);
    let body = r#"{"source":"app","key":"k","destination":"http:x","event_type":"order.paid","payload":{"n":1}}"#;
    let v = enqueue(&a, None, body, true).json();
    let batch = v["copies"][0]["batch"].as_i64().unwrap();
    assert!(
        read_until(
            &mut s,
            &mut seen,
            "\"event_queued\"",
            Duration::from_secs(10)
        ),
        "{seen}"
    );

    // Another writer of the spool (the dispatcher's steps, done here directly).
    let mut st = open(&db);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    st.seal_ready(now + 100.0).unwrap();
    assert!(
        read_until(
            &mut s,
            &mut seen,
            "\"batch_sealed\"",
            Duration::from_secs(10)
        ),
        "{seen}"
    );
    let claim = st
        .claim(
            batch,
            "test",
            now + 160.0,
            now + 100.0,
            false,
            hookspool::store::DeliveryId::per_attempt("d"),
        )
        .unwrap()
        .unwrap();
    st.mark(&AttemptReport {
        batch_id: batch,
        attempt_id: claim.attempt_id,
        lease_owner: claim.lease_owner,
        now: now + 100.2,
        status: Some(503),
        error: Some("http 503".into()),
        duration_ms: 200,
        delivery_id: None,
        events_delivered: None,
        failed_event_id: None,
        mark: Mark::Retry {
            klass: hookspool::vocab::Klass::Transport,
            next_attempt_at: now + 200.0,
        },
    })
    .unwrap();
    assert!(
        read_until(
            &mut s,
            &mut seen,
            "\"attempt_finished\"",
            Duration::from_secs(10)
        ),
        "{seen}"
    );
    st.issue_open_or_bump(
        &NewIssue {
            fingerprint: "delivery:http:x:transport".into(),
            kind: "delivery".into(),
            destination: Some("http:x".into()),
            route: None,
            sample_batch_id: Some(batch),
            last_error: None,
        },
        now,
    )
    .unwrap();
    assert!(
        read_until(
            &mut s,
            &mut seen,
            "\"issue_opened\"",
            Duration::from_secs(10)
        ),
        "{seen}"
    );
    drop(s);

    let got = frames(&seen);
    let kinds: Vec<&str> = got.iter().filter_map(|(_, v)| v["type"].as_str()).collect();
    assert_eq!(
        kinds,
        [
            "event_queued",
            "batch_sealed",
            "attempt_finished",
            "issue_opened"
        ],
        "{seen}"
    );
    let (_, q) = &got[0];
    assert_eq!(
        (q["batch"].as_i64(), q["source"].as_str()),
        (Some(batch), Some("app"))
    );
    assert_eq!(q["event_type"], "order.paid");
    assert!(
        q.get("payload").is_none() && !seen.contains("\"n\":1"),
        "no payload: {seen}"
    );
    let (_, at) = &got[2];
    assert_eq!(
        (at["status"].as_i64(), at["outcome"].as_str()),
        (Some(503), Some("retry")),
        "{at}"
    );

    // Resuming from the last id: nothing old again; the next new event comes.
    let last = got.last().unwrap().0.clone();
    let (mut s2, mut seen2) = open_stream(&a, Some(&last));
    enqueue(&a, None, &body.replace("\"n\":1", "\"n\":2"), true);
    assert!(
        read_until(
            &mut s2,
            &mut seen2,
            "\"event_queued\"",
            Duration::from_secs(10)
        ),
        "{seen2}"
    );
    let again = frames(&seen2);
    assert!(
        again.iter().all(|(_, v)| v["type"] != "issue_opened"
            && !(v["type"] == "event_queued" && v["event"] == got[0].1["event"])),
        "{seen2}"
    );
}
