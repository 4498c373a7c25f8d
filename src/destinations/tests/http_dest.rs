//! The `http` destination on the wire: headers, rotation, the status table, redirects,
//! https enforcement, transport failures and the total deadline.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::receiver::{Receiver, Reply, Stall, stalling};
use super::verify::{hub_verify, now_unix, sw_verify};
use super::{delivery, http_dest, insecure};
use crate::destinations::outcome::{Klass, OutcomeKind, RETRY_AFTER_S_MAX};
use crate::destinations::{HttpConfig, HttpDestination, TlsRoots, USER_AGENT};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const DOC: &str = r#"{"source": "github", "batch_id": 42, "events": [{"a": 1}]}"#;

#[tokio::test]
async fn document_and_every_header_verified_independently() {
    let rx = Receiver::start(vec![Reply::status(204)]).await;
    let mut cfg = insecure(&rx.url("/hooks/in?token=abc"));
    cfg.headers.insert("X-Env".into(), "prod".into());
    cfg.event_header = Some("X-GitHub-Event".into());
    let dest = http_dest(cfg, &[SECRET]);
    let o = dest.deliver(&delivery(DOC)).await;
    assert_eq!(o.kind, OutcomeKind::Ok, "{o:?}");
    assert_eq!(o.status, Some(204));

    let reqs = rx.requests();
    assert_eq!(reqs.len(), 1);
    let r = &reqs[0];
    assert_eq!(r.method, "POST");
    assert_eq!(r.path, "/hooks/in");
    assert_eq!(r.query.as_deref(), Some("token=abc"));
    assert_eq!(
        r.body,
        DOC.as_bytes(),
        "the document goes out byte for byte"
    );
    assert_eq!(r.header("webhook-id"), Some("hs_inst7_42"));
    let ts: i64 = r.header("webhook-timestamp").unwrap().parse().unwrap();
    assert!((now_unix() - ts).abs() <= 5);
    sw_verify(SECRET, r).unwrap();
    assert_eq!(r.header("webhook-signature").unwrap().split(' ').count(), 1);
    hub_verify(SECRET.as_bytes(), r).unwrap();
    assert_eq!(r.header("x-hookspool-batch"), Some("42"));
    assert_eq!(r.header("x-hookspool-attempt"), Some("3"));
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.header("user-agent"), Some(USER_AGENT));
    assert!(USER_AGENT.starts_with("hookspool/"));
    assert_eq!(r.header("x-env"), Some("prod"));
    assert_eq!(r.header("x-github-event"), Some("workflow_run"));
    assert_eq!(
        r.header("x-request-id"),
        None,
        "only hermes gets X-Request-ID"
    );
    // A wrong secret does not verify: the check above means something.
    assert!(sw_verify("whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", r).is_err());
}

#[tokio::test]
async fn rotation_signs_with_every_candidate_and_hub_with_the_current() {
    let rx = Receiver::start(vec![]).await;
    let (current, previous) = ("whsec_Y3VycmVudC1zZWNyZXQtb2YtMjQtYnl0ZXMh", SECRET);
    let dest = http_dest(insecure(&rx.url("/")), &[current, previous]);
    assert_eq!(dest.deliver(&delivery(DOC)).await.kind, OutcomeKind::Ok);
    let r = &rx.requests()[0];
    let sigs: Vec<&str> = r.header("webhook-signature").unwrap().split(' ').collect();
    assert_eq!(sigs.len(), 2);
    assert!(sigs.iter().all(|s| s.starts_with("v1,")));
    // Each secret alone verifies (a receiver on either side of the rotation accepts).
    sw_verify(current, r).unwrap();
    sw_verify(previous, r).unwrap();
    hub_verify(current.as_bytes(), r).unwrap();
    assert!(hub_verify(previous.as_bytes(), r).is_err());
}

#[tokio::test]
async fn per_batch_id_is_identical_on_every_attempt() {
    let rx = Receiver::start(vec![Reply::status(500), Reply::status(200)]).await;
    let dest = http_dest(insecure(&rx.url("/")), &[SECRET]);
    let first = dest.deliver(&delivery(DOC)).await;
    assert_eq!(first.klass, Some(Klass::Transport));
    let mut d2 = delivery(DOC);
    d2.attempt_n = 4;
    d2.attempt_id = 901;
    assert_eq!(dest.deliver(&d2).await.kind, OutcomeKind::Ok);
    let reqs = rx.requests();
    assert_eq!(reqs[0].header("webhook-id"), reqs[1].header("webhook-id"));
    assert_eq!(reqs[1].header("x-hookspool-attempt"), Some("4"));
}

/// Expected class of one status on each destination type.
fn expect(status: u16) -> (OutcomeKind, Option<Klass>) {
    use Klass::*;
    use OutcomeKind::*;
    match status {
        200 | 201 | 202 | 204 => (Ok, None),
        301 | 302 | 303 | 307 | 308 => (Dead, Some(Permanent)),
        408 | 500 | 501 | 502 | 503 | 504 | 599 => (Retry, Some(Transport)),
        429 => (Retry, Some(Throttle)),
        400 | 413 | 415 | 422 => (Dead, Some(Permanent)),
        _ => (Retry, Some(Config)),
    }
}

pub const STATUS_ROWS: &[u16] = &[
    200, 201, 202, 204, 301, 302, 303, 307, 308, 400, 401, 403, 404, 405, 408, 409, 410, 411, 413,
    415, 418, 422, 429, 451, 500, 501, 502, 503, 504, 599,
];

#[tokio::test]
async fn every_status_row_maps_as_spec_6_5() {
    let rx = Receiver::start(vec![]).await;
    let dest = http_dest(insecure(&rx.url("/")), &[SECRET]);
    for &status in STATUS_ROWS {
        let mut reply = Reply::status(status);
        if (300..400).contains(&status) {
            reply = reply.header("location", "/elsewhere");
        }
        rx.push(reply);
        let o = dest.deliver(&delivery(DOC)).await;
        assert_eq!((o.kind, o.klass), expect(status), "status {status}: {o:?}");
        assert_eq!(o.status, Some(i64::from(status)));
        assert_eq!(o.retry_after_s, None, "status {status}");
    }
    assert_eq!(
        rx.requests().len(),
        STATUS_ROWS.len(),
        "no retries, no redirects followed"
    );
}

#[tokio::test]
async fn retry_after_seconds_date_and_cap() {
    let rx = Receiver::start(vec![]).await;
    let dest = http_dest(insecure(&rx.url("/")), &[SECRET]);
    let in_10_min = httpdate(now_unix() + 600);
    let cases: Vec<(u16, Option<String>, Klass, Option<f64>)> = vec![
        (429, Some("120".into()), Klass::Throttle, Some(120.0)),
        (
            429,
            Some("86400".into()),
            Klass::Throttle,
            Some(RETRY_AFTER_S_MAX),
        ),
        (429, Some("not a date".into()), Klass::Throttle, None),
        (429, None, Klass::Throttle, None),
        (503, Some("30".into()), Klass::Throttle, Some(30.0)),
        (
            503,
            Some(httpdate(now_unix() + 86_400)),
            Klass::Throttle,
            Some(RETRY_AFTER_S_MAX),
        ),
        (503, Some("junk".into()), Klass::Transport, None),
        (503, None, Klass::Transport, None),
        // Retry-After on other statuses is not a throttle.
        (500, Some("30".into()), Klass::Transport, None),
    ];
    for (status, ra, klass, after) in cases {
        let mut r = Reply::status(status);
        if let Some(v) = &ra {
            r = r.header("retry-after", v);
        }
        rx.push(r);
        let o = dest.deliver(&delivery(DOC)).await;
        assert_eq!(o.klass, Some(klass), "{status} {ra:?}");
        assert_eq!(o.retry_after_s, after, "{status} {ra:?}");
    }
    rx.push(Reply::status(429).header("retry-after", &in_10_min));
    let o = dest.deliver(&delivery(DOC)).await;
    let after = o.retry_after_s.unwrap();
    assert!((595.0..=601.0).contains(&after), "{after}");
}

/// IMF-fixdate for a unix time (test-side, independent of the parser).
fn httpdate(t: i64) -> String {
    let days = t.div_euclid(86_400);
    let secs = t.rem_euclid(86_400);
    // civil_from_days (Hinnant).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let wd = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"][days.rem_euclid(7) as usize];
    let mon = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ][(m - 1) as usize];
    format!(
        "{wd}, {d:02} {mon} {y} {:02}:{:02}:{:02} GMT",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

#[tokio::test]
async fn redirect_is_never_followed_and_is_permanent() {
    let rx = Receiver::start(vec![]).await;
    let target = rx.url("/moved-here");
    rx.push(Reply::status(307).header("location", &target));
    let dest = http_dest(insecure(&rx.url("/old")), &[SECRET]);
    let o = dest.deliver(&delivery(DOC)).await;
    assert_eq!(
        (o.kind, o.klass),
        (OutcomeKind::Dead, Some(Klass::Permanent))
    );
    assert!(o.reason.contains("redirect"));
    let reqs = rx.requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0].path, "/old");
}

#[tokio::test]
async fn https_required_unless_allow_insecure() {
    let cfg = HttpConfig::new("http://127.0.0.1:9/x");
    let problems = cfg.problems();
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].contains("allow_insecure = true"),
        "{problems:?}"
    );
    assert!(
        HttpDestination::new(
            cfg,
            Arc::new(super::StaticSecrets(vec![])),
            TlsRoots::Platform
        )
        .is_err()
    );
    assert!(insecure("http://127.0.0.1:9/x").problems().is_empty());
    assert!(
        HttpConfig::new("https://example.invalid/x")
            .problems()
            .is_empty()
    );
    assert!(
        !HttpConfig::new("ftp://example.invalid/x")
            .problems()
            .is_empty()
    );
    assert!(!HttpConfig::new("not a url").problems().is_empty());
}

#[test]
fn check_refuses_headers_hookspool_sets() {
    let mut cfg = HttpConfig::new("https://example.invalid/x");
    cfg.unwrap = true;
    cfg.event_header = Some("webhook-id".into());
    cfg.dedup_header = Some("X-Hub-Signature-256".into());
    cfg.headers.insert("User-Agent".into(), "x".into());
    cfg.headers.insert("X-Ok".into(), "bad\nvalue".into());
    cfg.timeout_s = 0.0;
    cfg.max_body_bytes = 0;
    let p = cfg.problems();
    assert_eq!(p.len(), 6, "{p:#?}");
    assert!(
        p.iter()
            .any(|m| m.contains("event_header") && m.contains("hookspool sets itself"))
    );
    assert!(
        p.iter()
            .any(|m| m.contains("dedup_header") && m.contains("hookspool sets itself"))
    );
    assert!(p.iter().any(|m| m.contains("headers.User-Agent")));
    assert!(p.iter().any(|m| m.contains("headers.X-Ok")));
    assert!(p.iter().any(|m| m.contains("timeout_s")));
    assert!(p.iter().any(|m| m.contains("max_body_bytes")));

    let mut same = HttpConfig::new("https://example.invalid/x");
    same.unwrap = true;
    same.event_header = Some("X-A".into());
    same.dedup_header = Some("x-a".into());
    assert_eq!(same.problems().len(), 1);
    let mut dedup_no_unwrap = HttpConfig::new("https://example.invalid/x");
    dedup_no_unwrap.dedup_header = Some("X-GitHub-Delivery".into());
    assert!(dedup_no_unwrap.problems()[0].contains("unwrap = true"));
}

#[tokio::test]
async fn refused_connection_is_transport() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    let dest = http_dest(insecure(&format!("http://{addr}/")), &[SECRET]);
    let o = dest.deliver(&delivery(DOC)).await;
    assert_eq!(
        (o.kind, o.klass),
        (OutcomeKind::Retry, Some(Klass::Transport)),
        "{o:?}"
    );
    assert_eq!(o.reason, "connection refused");
}

#[tokio::test]
async fn reset_connection_is_transport() {
    // Accept, read, then close without answering.
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let task = tokio::spawn(async move {
        loop {
            let (mut s, _) = l.accept().await.unwrap();
            let mut buf = [0u8; 4096];
            let _ = tokio::io::AsyncReadExt::read(&mut s, &mut buf).await;
            drop(s);
        }
    });
    let dest = http_dest(insecure(&format!("http://{addr}/")), &[SECRET]);
    let o = dest.deliver(&delivery(DOC)).await;
    assert_eq!(o.klass, Some(Klass::Transport), "{o:?}");
    assert!(
        ["connection closed", "connection reset"].contains(&o.reason.as_str()),
        "{o:?}"
    );
    task.abort();
}

#[tokio::test]
async fn dns_failure_is_transport() {
    let mut cfg = HttpConfig::new("https://hookspool-test.invalid/x");
    cfg.timeout_s = 5.0;
    let dest = http_dest(cfg, &[SECRET]);
    let o = dest.deliver(&delivery(DOC)).await;
    assert_eq!(o.klass, Some(Klass::Transport), "{o:?}");
    // "timeout" only where the resolver itself hangs.
    assert!(["dns", "timeout"].contains(&o.reason.as_str()), "{o:?}");
}

/// The slack allowed past a deadline before the attempt must have returned.
const DEADLINE_SLACK: Duration = Duration::from_millis(1000);

#[tokio::test]
async fn silent_receiver_ends_at_the_worker_deadline() {
    let (addr, task) = stalling(Stall::Silent).await;
    let dest = http_dest(insecure(&format!("http://{addr}/")), &[SECRET]);
    let mut d = delivery(DOC);
    let budget = Duration::from_millis(700);
    let start = Instant::now();
    d.deadline = start + budget;
    let o = dest.deliver(&d).await;
    let took = start.elapsed();
    assert_eq!(
        (o.klass, o.reason.as_str()),
        (Some(Klass::Transport), "deadline"),
        "{o:?}"
    );
    assert!(took >= budget && took < budget + DEADLINE_SLACK, "{took:?}");
    task.abort();
}

#[tokio::test]
async fn dripping_receivers_end_at_timeout_s() {
    for mode in [Stall::DripBody, Stall::DripHead] {
        let (addr, task) = stalling(mode).await;
        let mut cfg = insecure(&format!("http://{addr}/"));
        cfg.timeout_s = 0.6;
        let dest = http_dest(cfg, &[SECRET]);
        let start = Instant::now();
        let o = dest.deliver(&delivery(DOC)).await;
        let took = start.elapsed();
        assert_eq!(
            (o.klass, o.reason.as_str()),
            (Some(Klass::Transport), "timeout"),
            "{mode:?} {o:?}"
        );
        assert!(
            took < Duration::from_millis(600) + DEADLINE_SLACK,
            "{mode:?} {took:?}"
        );
        task.abort();
    }
}

#[tokio::test]
async fn past_deadline_sends_nothing() {
    let rx = Receiver::start(vec![]).await;
    let dest = http_dest(insecure(&rx.url("/")), &[SECRET]);
    let mut d = delivery(DOC);
    d.deadline = Instant::now();
    let o = dest.deliver(&d).await;
    assert_eq!(
        (o.klass, o.reason.as_str()),
        (Some(Klass::Transport), "deadline")
    );
    assert!(rx.requests().is_empty());
}

#[tokio::test]
async fn oversized_document_is_permanent_and_not_sent() {
    let rx = Receiver::start(vec![]).await;
    let mut cfg = insecure(&rx.url("/"));
    cfg.max_body_bytes = 10;
    let dest = http_dest(cfg, &[SECRET]);
    let o = dest.deliver(&delivery(DOC)).await;
    assert_eq!(
        (o.kind, o.klass),
        (OutcomeKind::Dead, Some(Klass::Permanent))
    );
    assert!(rx.requests().is_empty());
}

const FIRST: &str = "whsec_Zmlyc3QtZmlyc3QtZmlyc3QtZmlyc3QtIQ==";
const SECOND: &str = "whsec_c2Vjb25kLXNlY29uZC1zZWNvbmQtc2Vjb25kIQ==";

#[tokio::test]
async fn secrets_are_asked_per_attempt_and_failures_are_config() {
    let rx = Receiver::start(vec![]).await;
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let c = calls.clone();
    let source = move || {
        let n = c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        match n {
            0 => Ok(vec![FIRST.as_bytes().to_vec()]),
            1 => Ok(vec![SECOND.as_bytes().to_vec()]),
            2 => Ok(vec![]),
            3 => Ok(vec![b"whsec_@@@".to_vec()]),
            _ => Err(crate::secret::SecretError::Unreadable {
                name: "secret".into(),
                reason: "permission denied".into(),
            }),
        }
    };
    /// A secret source whose answers the test scripts, per call.
    struct Scripted<F>(F);
    impl<F> crate::secret::SecretSource for Scripted<F>
    where
        F: Fn() -> Result<Vec<Vec<u8>>, crate::secret::SecretError>,
    {
        fn candidates(&self, _name: &str) -> Result<Vec<Vec<u8>>, crate::secret::SecretError> {
            (self.0)()
        }
    }
    let dest = HttpDestination::new(
        insecure(&rx.url("/")),
        Arc::new(Scripted(source)),
        TlsRoots::Platform,
    )
    .unwrap();
    assert_eq!(dest.deliver(&delivery(DOC)).await.kind, OutcomeKind::Ok);
    assert_eq!(dest.deliver(&delivery(DOC)).await.kind, OutcomeKind::Ok);
    let reqs = rx.requests();
    sw_verify(FIRST, &reqs[0]).unwrap();
    sw_verify(SECOND, &reqs[1]).unwrap();
    for _ in 0..3 {
        let o = dest.deliver(&delivery(DOC)).await;
        assert_eq!(
            (o.kind, o.klass),
            (OutcomeKind::Retry, Some(Klass::Config)),
            "{o:?}"
        );
    }
    assert_eq!(rx.requests().len(), 2);
}

#[tokio::test]
async fn one_client_reuses_its_connection() {
    let rx = Receiver::start(vec![]).await;
    let dest = http_dest(insecure(&rx.url("/")), &[SECRET]);
    for _ in 0..3 {
        assert_eq!(dest.deliver(&delivery(DOC)).await.kind, OutcomeKind::Ok);
    }
    assert_eq!(rx.requests().len(), 3);
    assert_eq!(
        rx.connections(),
        1,
        "the client is built once and pools its connection"
    );
    // Shareable across workers.
    let dest = Arc::new(dest);
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let dest = dest.clone();
        tasks.push(tokio::spawn(async move {
            dest.deliver(&delivery(DOC)).await.kind
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), OutcomeKind::Ok);
    }
    assert_eq!(rx.requests().len(), 7);
}

#[test]
fn config_debug_redacts_query_and_header_values() {
    let mut cfg = HttpConfig::new("https://user:pw@example.invalid/h?token=hunter2");
    cfg.headers.insert("X-Api-Key".into(), "hunter2".into());
    let shown = format!("{cfg:?}");
    assert!(
        !shown.contains("hunter2") && !shown.contains("pw@"),
        "{shown}"
    );
    assert!(
        shown.contains("X-Api-Key") && shown.contains("example.invalid"),
        "{shown}"
    );
}

#[test]
fn configs_deserialize_with_spec_defaults() {
    let h: HttpConfig = serde_json::from_str(r#"{"url": "https://example.invalid/h"}"#).unwrap();
    assert_eq!(h, HttpConfig::new("https://example.invalid/h"));
    assert_eq!(
        (h.timeout_s, h.max_body_bytes, h.allow_insecure, h.unwrap),
        (30.0, 1 << 20, false, false)
    );
    let m: crate::destinations::HermesConfig = serde_json::from_str("{}").unwrap();
    assert_eq!(m, crate::destinations::HermesConfig::default());
    assert_eq!(m.base_url, "http://127.0.0.1:8644");
    assert!(m.legacy_signature && m.max_body_bytes == 1 << 20 && m.timeout_s == 30.0);
}
