//! In-crate intake tests that need what the config cannot express: a source that panics
//! (the test-only `guard::tests::Panicky`, never reachable from a config file).

use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::guard::tests::Panicky;
use super::snapshot::Snapshot;
use super::{IntakeOptions, serve_snapshot};
use crate::config::{self, PathInputs};
use crate::sources::verify::{MacAlg, mac_hex};
use crate::store::{BatchFilter, Role, Store};

const SECRET: &str = "panic-test-secret";

async fn post(addr: &str, body: &[u8], signed: bool) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut req = format!(
        "POST /hooks/tpl HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if signed {
        let sig = mac_hex(MacAlg::Sha256, SECRET.as_bytes(), &[body]);
        req.push_str(&format!("X-Signature: {sig}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    s.write_all(body).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    let text = String::from_utf8_lossy(&out).to_string();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_source_is_quarantined_after_verify_and_503_before() {
    let home = tempfile::tempdir().unwrap();
    std::fs::write(home.path().join("secret"), SECRET).unwrap();
    let text = format!(
        r#"
[intake]
listen = "127.0.0.1:0"
[limits]
min_free_bytes = 0
[sources.tpl]
type = "template"
scheme = "hmac-sha256-hex"
header = "X-Signature"
key = "payload.id"
action = "http-main"
secrets.secret = {{ file = "{}/secret" }}
[destinations.http-main]
type = "http"
url = "https://main.invalid/"
secret = {{ file = "/nonexistent/hookspool-test-secret" }}
"#,
        home.path().display()
    );
    let inputs = PathInputs {
        home_flag: Some(home.path().to_path_buf()),
        ..PathInputs::default()
    };
    let (c, _) = config::parse(&text, None, &inputs, false).unwrap();
    let mut snap = Snapshot::from_config(c).unwrap();
    let served = snap.sources.get_mut("tpl").unwrap();
    let inner = served.source.clone();
    served.source = Arc::new(Panicky {
        inner,
        in_verify: false,
    });

    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let mut opts = IntakeOptions::new(
        inputs,
        Arc::new(crate::wake::NotifyWaker::default()),
        async move {
            let _ = stop_rx.await;
        },
    );
    opts.notify = false;
    opts.reload_on_sighup = false;
    opts.install_plaid_fetcher = false;
    opts.on_ready = Some(ready_tx);
    let server = tokio::spawn(serve_snapshot(snap, opts));
    let addr = ready_rx.await.unwrap().remove(0);

    let body = br#"{"id":"evt-1","secretish":"PANIC-BODY"}"#;
    let (status, text) = post(&addr, body, true).await;
    assert_eq!(status, 202, "{text}");
    assert!(text.contains(r#"{"status":"quarantined"}"#), "{text}");
    // Unsigned: 401 before the source could panic; nothing stored.
    assert_eq!(post(&addr, body, false).await.0, 401);

    let store = Store::open(
        &home.path().join("spool.db"),
        Role::Reader,
        std::time::Duration::from_secs(5),
    )
    .unwrap();
    let batches = store
        .list_batches(&BatchFilter {
            limit: 10,
            ..Default::default()
        })
        .unwrap();
    assert_eq!(batches.len(), 1);
    assert_eq!(
        batches[0].last_error.as_deref(),
        Some("plugin error: Panic")
    );
    let stored = store.quarantined_requests(batches[0].id).unwrap();
    assert_eq!(stored[0].raw.as_deref(), Some(body.as_slice()));
    let headers = stored[0].headers.to_ascii_lowercase();
    assert!(!headers.contains("x-signature"), "{headers}");
    stop_tx.send(()).unwrap();
    server.await.unwrap().unwrap();
}
