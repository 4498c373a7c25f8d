//! Unwrap mode (spec 6.4.1) on both destination types: one request per event in order, the
//! stored bytes as the body, per-event ids, stop at the first failure, a shared deadline.

use std::time::{Duration, Instant};

use super::hermes_dest::{Gw, subs_with_secret};
use super::receiver::{Receiver, Reply};
use super::verify::{hub_verify, sw_verify};
use super::{INSTANCE, delivery, event, http_dest, insecure};
use crate::destinations::outcome::{Klass, OutcomeKind};
use crate::destinations::{Delivery, HermesConfig, HttpConfig};

const SECRET: &str = "whsec_dW53cmFwLXNlY3JldC11bndyYXAtc2VjcmV0IQ==";

fn unwrap_cfg(url: &str) -> HttpConfig {
    HttpConfig {
        unwrap: true,
        event_header: Some("X-GitHub-Event".into()),
        dedup_header: Some("X-GitHub-Delivery".into()),
        ..insecure(url)
    }
}

fn three_events() -> Delivery {
    let mut d = delivery(r#"{"the": "document, never sent in unwrap mode"}"#);
    d.events = vec![
        // Odd spacing and key order: the bytes must go out exactly as stored.
        event(
            11,
            "push",
            Some("guid-11"),
            "{ \"ref\" :\"main\",  \"z\":1 }",
        ),
        event(12, "pull_request", None, r#"{"action":"opened"}"#),
        event(15, "check_run", Some("bad\nvalue"), "{\"n\": 1.50}"),
    ];
    d
}

#[tokio::test]
async fn http_unwrap_sends_each_event_in_order_with_its_own_id() {
    let rx = Receiver::start(vec![]).await;
    let dest = http_dest(unwrap_cfg(&rx.url("/ev")), &[SECRET]);
    let d = three_events();
    let o = dest.deliver(&d).await;
    assert_eq!(o.kind, OutcomeKind::Ok, "{o:?}");
    assert_eq!((o.events_delivered, o.failed_event_id), (Some(3), None));
    let reqs = rx.requests();
    assert_eq!(reqs.len(), 3);
    for (r, ev) in reqs.iter().zip(&d.events) {
        assert_eq!(r.body, ev.payload, "stored bytes, never re-encoded");
        let id = format!("hs_{INSTANCE}_42_{}", ev.id);
        assert_eq!(r.header("webhook-id"), Some(id.as_str()));
        sw_verify(SECRET, r).unwrap();
        hub_verify(SECRET.as_bytes(), r).unwrap();
        assert_eq!(r.header("x-github-event"), Some(ev.event_type.as_str()));
        assert_eq!(r.header("x-hookspool-batch"), Some("42"));
        assert_eq!(r.header("x-hookspool-attempt"), Some("3"));
    }
    assert_eq!(reqs[0].header("x-github-delivery"), Some("guid-11"));
    assert_eq!(
        reqs[1].header("x-github-delivery"),
        None,
        "no dedup id, no header"
    );
    assert_eq!(
        reqs[2].header("x-github-delivery"),
        None,
        "a value that cannot go on the wire is left out"
    );
}

#[tokio::test]
async fn unwrap_stops_at_the_first_failure_and_says_where() {
    let rx = Receiver::start(vec![
        Reply::status(200),
        Reply::status(502),
        Reply::status(200),
    ])
    .await;
    let dest = http_dest(unwrap_cfg(&rx.url("/")), &[SECRET]);
    let o = dest.deliver(&three_events()).await;
    assert_eq!(
        (o.kind, o.klass),
        (OutcomeKind::Retry, Some(Klass::Transport))
    );
    assert_eq!((o.events_delivered, o.failed_event_id), (Some(1), Some(12)));
    assert_eq!(o.status, Some(502));
    assert_eq!(
        o.reason, "http 502",
        "the request's own reason, for the dispatcher"
    );
    assert!(
        o.detail.starts_with("event 12 failed after 1 delivered"),
        "{}",
        o.detail
    );
    assert_eq!(
        rx.requests().len(),
        2,
        "nothing after the failed event is sent"
    );

    // The retry starts again at the first event with the same ids.
    let mut again = three_events();
    again.attempt_n = 4;
    again.attempt_id = 901;
    let o = dest.deliver(&again).await;
    assert_eq!((o.events_delivered, o.failed_event_id), (Some(3), None));
    let reqs = rx.requests();
    assert_eq!(reqs[0].header("webhook-id"), reqs[2].header("webhook-id"));
    assert_eq!(reqs[1].header("webhook-id"), reqs[3].header("webhook-id"));

    // A permanent answer makes the batch dead at that event.
    rx.push(Reply::status(422));
    let o = dest.deliver(&three_events()).await;
    assert_eq!(
        (o.kind, o.klass),
        (OutcomeKind::Dead, Some(Klass::Permanent))
    );
    assert_eq!((o.events_delivered, o.failed_event_id), (Some(0), Some(11)));
}

#[tokio::test]
async fn max_body_bytes_applies_per_event() {
    let rx = Receiver::start(vec![]).await;
    let mut cfg = unwrap_cfg(&rx.url("/"));
    cfg.max_body_bytes = 25;
    let dest = http_dest(cfg, &[SECRET]);
    let mut d = delivery(&"x".repeat(1000)); // the document is over the cap, and irrelevant
    d.events = vec![
        event(1, "a", None, r#"{"small":1}"#),
        event(2, "a", None, r#"{"too":"large for twenty-five bytes"}"#),
    ];
    let o = dest.deliver(&d).await;
    assert_eq!(
        (o.kind, o.klass),
        (OutcomeKind::Dead, Some(Klass::Permanent))
    );
    assert_eq!((o.events_delivered, o.failed_event_id), (Some(1), Some(2)));
    assert_eq!(rx.requests().len(), 1);
}

#[tokio::test]
async fn all_requests_share_the_attempt_deadline() {
    let step = Duration::from_millis(400);
    let rx = Receiver::start((0..5).map(|_| Reply::status(200).after(step)).collect()).await;
    let dest = http_dest(unwrap_cfg(&rx.url("/")), &[SECRET]);
    let mut d = three_events();
    d.events.push(event(16, "x", None, "{}"));
    d.events.push(event(17, "x", None, "{}"));
    let start = Instant::now();
    d.deadline = start + Duration::from_millis(1000);
    let o = dest.deliver(&d).await;
    let took = start.elapsed();
    assert_eq!(
        (o.klass, o.events_delivered, o.failed_event_id),
        (Some(Klass::Transport), Some(2), Some(15)),
        "{o:?}"
    );
    assert_eq!(o.reason, "deadline");
    assert!(took < Duration::from_millis(2000), "{took:?}");
}

#[tokio::test]
async fn hermes_unwrap_ids_notices_and_headers() {
    let gw = Gw::start(&subs_with_secret("route-secret")).await;
    gw.rx.push(Reply::json(202, r#"{"status":"accepted"}"#));
    gw.rx.push(Reply::json(200, r#"{"status":"ignored"}"#));
    gw.rx.push(Reply::json(202, r#"{"status":"coalesced"}"#));
    let dest = gw.dest(HermesConfig {
        unwrap: true,
        dedup_header: Some("X-GitHub-Delivery".into()),
        ..gw.cfg()
    });
    let mut d = three_events();
    d.source_event_header = Some("X-GitHub-Event".into());
    let o = dest.deliver(&d).await;
    assert_eq!(o.kind, OutcomeKind::Ok, "{o:?}");
    assert_eq!(
        o.notice, None,
        "ignored and coalesced are plain ok in unwrap mode"
    );
    assert_eq!((o.events_delivered, o.failed_event_id), (Some(3), None));
    let reqs = gw.rx.requests();
    for (r, ev) in reqs.iter().zip(&d.events) {
        let id = format!("hs_{INSTANCE}_42_{}", ev.id);
        assert_eq!(r.header("webhook-id"), Some(id.as_str()));
        assert_eq!(r.header("x-request-id"), Some(id.as_str()));
        assert_eq!(r.body, ev.payload);
        sw_verify("route-secret", r).unwrap();
        hub_verify(b"route-secret", r).unwrap();
        assert_eq!(r.header("x-github-event"), Some(ev.event_type.as_str()));
    }
    assert_eq!(reqs[0].header("x-github-delivery"), Some("guid-11"));

    // Per-event ids are stable across attempts (unlike document mode's per-attempt ids).
    let mut again = three_events();
    again.attempt_id = 999;
    assert_eq!(dest.deliver(&again).await.kind, OutcomeKind::Ok);
    let reqs = gw.rx.requests();
    assert_eq!(reqs[0].header("webhook-id"), reqs[3].header("webhook-id"));

    // An event that is not a JSON object cannot go to Hermes: permanent, at that event.
    let mut bad = three_events();
    bad.events[1].payload = b"[1,2,3]".to_vec();
    let o = dest.deliver(&bad).await;
    assert_eq!(
        (o.kind, o.klass),
        (OutcomeKind::Dead, Some(Klass::Permanent))
    );
    assert_eq!((o.events_delivered, o.failed_event_id), (Some(1), Some(12)));
}
