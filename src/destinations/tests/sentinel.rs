//! No secret, body or query string in any log record or outcome text: a sentinel is planted
//! in each, every path is driven (ok, each failure class, unwrap, hermes, a broken
//! subscriptions file) with a capturing subscriber at TRACE, and nothing may contain it.

use std::io::Write;
use std::sync::{Arc, Mutex};

use super::hermes_dest::{Gw, ROUTE, write_subs};
use super::receiver::{Receiver, Reply};
use super::{delivery, event, http_dest, insecure};
use crate::destinations::Outcome;

const SENTINEL: &str = "SENTINEL7f3c9e";

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn texts(o: &Outcome) -> String {
    format!("{}|{}|{:?}|{o:?}", o.reason, o.detail, o.notice)
}

#[tokio::test(flavor = "current_thread")]
async fn sentinel_never_reaches_logs_or_outcomes() {
    let cap = Capture::default();
    let c2 = cap.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || c2.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let mut seen = Vec::new();

    let body = format!(r#"{{"payload": "{SENTINEL}"}}"#);
    let echo = format!(r#"{{"error": "{SENTINEL}", "status": "{SENTINEL}"}}"#);
    let rx = Receiver::start(vec![]).await;
    let secret = format!("whsec_{SENTINEL}");
    let mut cfg = insecure(&rx.url(&format!("/h?token={SENTINEL}")));
    cfg.headers.insert("X-Api-Key".into(), SENTINEL.into());
    let http = http_dest(cfg, &[&secret, SENTINEL]);
    for status in [200, 302, 400, 401, 404, 429, 500, 503] {
        rx.push(Reply::json(status, &echo).header("location", &format!("/{SENTINEL}")));
        seen.push(http.deliver(&delivery(&body)).await);
    }
    // whsec_ with a non-base64 rest: the secret-unusable path.
    let bad_secret = http_dest(insecure(&rx.url("/")), &[&format!("whsec_{SENTINEL}!!")]);
    seen.push(bad_secret.deliver(&delivery(&body)).await);
    // Transport failures with the sentinel in the URL.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}/x?token={SENTINEL}", l.local_addr().unwrap());
    drop(l);
    seen.push(
        http_dest(insecure(&dead), &[GOOD_SECRET])
            .deliver(&delivery(&body))
            .await,
    );
    // Unwrap with sentinel payloads and dedup ids, failing midway.
    let mut ucfg = insecure(&rx.url(&format!("/u?k={SENTINEL}")));
    ucfg.unwrap = true;
    ucfg.dedup_header = Some("X-Dedup".into());
    let unwrap = http_dest(ucfg, &[GOOD_SECRET]);
    let mut d = delivery(&body);
    d.events = vec![
        event(1, SENTINEL, Some(SENTINEL), &body),
        event(2, SENTINEL, Some(SENTINEL), &body),
    ];
    rx.push(Reply::status(200));
    rx.push(Reply::json(422, &echo));
    seen.push(unwrap.deliver(&d).await);

    // Hermes: the secret in the file, answers echoing it, then a broken file.
    let gw = Gw::start(&serde_json::json!({ ROUTE: { "secret": SENTINEL } }).to_string()).await;
    let hermes = gw.dest(gw.cfg());
    for status in [202, 401, 403, 404, 413, 429, 500] {
        gw.rx.push(Reply::json(status, &echo));
        seen.push(hermes.deliver(&delivery(&body)).await);
    }
    write_subs(
        &gw.dir.path().join("subs.json"),
        &format!(r#"{{"{ROUTE}": {{"secret": "{SENTINEL}" "#),
    );
    seen.push(hermes.deliver(&delivery(&body)).await);
    let problems = crate::destinations::hermes::check_route(&gw.cfg(), ROUTE);

    assert!(seen.len() > 15);
    for o in &seen {
        assert!(!texts(o).contains(SENTINEL), "outcome leaks: {o:?}");
    }
    assert!(!problems.join("\n").contains(SENTINEL), "{problems:?}");
    let logs = String::from_utf8(cap.0.lock().unwrap().clone()).unwrap();
    assert!(
        !logs.is_empty(),
        "the capture saw the destinations' records"
    );
    assert!(
        !logs.contains(SENTINEL),
        "a log record leaks the sentinel:\n{logs}"
    );
    assert!(format!("{http:?}").find(SENTINEL).is_none());
}

/// A valid Standard Webhooks secret for the paths that must reach the wire.
const GOOD_SECRET: &str = "whsec_dW53cmFwLXNlY3JldC11bndyYXAtc2VjcmV0IQ==";
