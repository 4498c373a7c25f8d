//! Issue 7's sentinel check over a whole end-to-end run of the real `hookspool run`
//! (HOOKSPOOL_LOG=json, every level): one marker planted in the source secret, the
//! destination secret, the destination URL's query string and a static destination header,
//! payload fields, an extra request header, the request query string, a User-Agent, an
//! unknown source's path, and the receiver's failure answers (header and body). The run
//! goes through a delivery, a transport failure then success, a permanent failure (dead), a
//! duplicate, a quarantine and a 401. Afterwards the marker must be absent from every log
//! line and from every column of every table, except where the spec stores request data on
//! purpose: events.payload, events.raw, and events.headers of a quarantined event (spec 3:
//! "for a quarantined event, every request header except the source's auth_headers").
//!
//! The marker is never put in payload.topic (the coalesce key, stored in batches.key) or
//! payload.id (the dedup id, stored in events.dedup_id and dedup.dedup_id): those are
//! extracted and stored by design.
//!
//! Alerts: `run_opens_issues_and_alerts` proves the run itself opens issues and runs
//! alerts.argv; the sentinel test also opens issues through the `observe::issues` API with
//! the run's real error texts and runs one real alert pass (alerts.argv, a script that logs
//! nothing) and one dry pass, capturing their log lines, and scans the alert texts, the
//! audit rows and the logs too.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hookspool::observe::{alerts, issues};
use hookspool::store::BatchFilter;

use super::receiver::{Answer, Receiver};
use super::run_e2e::{RunProc, reserved_port};

/// Every planted value starts with this.
const MARK: &str = "SNTL-q7x";

fn s(what: &str) -> String {
    format!("{MARK}-{what}")
}

struct Run {
    home: tempfile::TempDir,
    /// The alert script's record of the texts it was given.
    alert_file: std::path::PathBuf,
    log: String,
    rx: Receiver,
}

fn write_config(home: &Path, port: u16, url: &str, alert_script: &Path) {
    std::fs::write(home.join("source.secret"), s("source-secret")).unwrap();
    std::fs::write(home.join("dest.secret"), s("dest-secret")).unwrap();
    let text = format!(
        r#"
[intake]
listen = "127.0.0.1:{port}"

[limits]
min_free_bytes = 0

[dispatch]
poll_s = 0.1
heartbeat_s = 0.2
backoff_base_s = 0.2
backoff_cap_s = 1

[alerts]
argv = ["{script}"]
rate_limit_s = 0

[sources.sn]
type = "template"
scheme = "hmac-sha256-hex"
header = "X-Signature"
prefix = "sha256="
key = "payload.topic"
dedup = "payload.id"
span = "immediate"
action = "http-recv"
secrets.secret = {{ file = "{home}/source.secret" }}

[destinations.http-recv]
type = "http"
url = "{url}?token={query}"
allow_insecure = true
allow_private = ["127.0.0.1/32"]
timeout_s = 5
headers = {{ "X-Api-Key" = "{header}" }}
secret = {{ file = "{home}/dest.secret" }}
"#,
        script = alert_script.display(),
        home = home.display(),
        query = s("dest-url-query"),
        header = s("dest-static-header"),
    );
    std::fs::write(home.join("config.toml"), text).unwrap();
}

/// The whole scenario; returns after SIGTERM and a clean exit.
async fn scenario() -> Run {
    let rx = Receiver::start().await;
    // The first attempt of the "retry" key fails with a 500 whose header and body carry the
    // marker; the "perm" key is refused for good (400, dead). Everything else is 200.
    let fail_once = Arc::new(Mutex::new(true));
    let (sb, sh) = (s("receiver-500-body"), s("receiver-500-header"));
    let (pb, ph) = (s("receiver-400-body"), s("receiver-400-header"));
    rx.set_rule(move |r| match r.json()["key"].as_str() {
        Some("retry") if std::mem::take(&mut *fail_once.lock().unwrap()) => Some(Answer {
            status: 500,
            headers: vec![("X-Resp".into(), sh.clone())],
            body: sb.clone(),
            delay: Duration::ZERO,
        }),
        Some("perm") => Some(Answer {
            status: 400,
            headers: vec![("X-Resp".into(), ph.clone())],
            body: pb.clone(),
            delay: Duration::ZERO,
        }),
        _ => None,
    });
    let home = tempfile::tempdir().unwrap();
    // The alert script lives outside the home and logs nothing; it records its last
    // argument (the alert text) so the test can read what would have been sent.
    let alert_file = home.path().join("alerts-sent.txt");
    let script = home.path().join("alert.sh");
    super::executable(
        &script,
        &format!(
            "#!/bin/sh\nfor a in \"$@\"; do last=$a; done\nprintf '%s\\n' \"$last\" >> '{}'\nexit 0\n",
            alert_file.display()
        ),
    );
    let port = reserved_port();
    write_config(home.path(), port, &rx.url(), &script);
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut p = tokio::task::block_in_place(|| {
        RunProc::start(
            home.path(),
            addr,
            &[("HOOKSPOOL_LOG", "json"), ("HOOKSPOOL_LOG_LEVEL", "trace")],
        )
    });
    let secret = s("source-secret");
    let secret = secret.as_bytes();
    let query = format!("sn?token={}&sig={}", s("query-token"), s("query-sig"));
    let (xh, ua) = (s("request-header"), s("user-agent"));
    let extra: Vec<(&str, &str)> = vec![("X-Extra", &xh), ("User-Agent", &ua)];
    let body = |id: &str, topic: &str| {
        serde_json::json!({
            "id": id,
            "topic": topic,
            "text": s("payload-text"),
            "nested": {"deep": [s("payload-nested")]},
        })
        .to_string()
    };
    tokio::task::block_in_place(|| {
        let ok = body("ev-ok", "fine");
        let r = p.post(&query, secret, ok.as_bytes(), &extra);
        assert_eq!(
            (r.status, r.json()["status"].clone()),
            (200, "queued".into())
        );
        let r = p.post(&query, secret, ok.as_bytes(), &extra);
        assert_eq!(r.json()["status"], "duplicate", "{:?}", r.json());
        let r = p.post(&query, secret, body("ev-retry", "retry").as_bytes(), &extra);
        assert_eq!(r.status, 200);
        let r = p.post(&query, secret, body("ev-perm", "perm").as_bytes(), &extra);
        assert_eq!(r.status, 200);
        // No "topic": the key selector fails after verification -> quarantine, 202.
        let q = serde_json::json!({"id": "ev-q", "text": s("payload-quarantined")}).to_string();
        let r = p.post(&query, secret, q.as_bytes(), &extra);
        assert_eq!(r.status, 202, "{:?}", r.json());
        assert_eq!(r.json()["status"], "quarantined");
        // A bad signature (signed with the wrong secret): 401, nothing stored.
        let r = p.post(
            &query,
            b"wrong-secret",
            body("ev-401", "fine").as_bytes(),
            &extra,
        );
        assert_eq!(r.status, 401);
        // An unknown source named by the marker.
        let r = p.post(&s("unknown-source"), secret, b"{}", &extra);
        assert!(r.status == 404 || r.status == 401, "{}", r.status);
    });
    // 4 attempts: ok, retry's 500 then 200, perm's 400.
    let got = rx.wait_for(4, Duration::from_secs(20)).await;
    assert_eq!(got.len(), 4, "log:\n{}", p.log());
    for r in &got {
        assert_eq!(
            r.header("x-api-key"),
            Some(s("dest-static-header").as_str()),
            "the static header was sent"
        );
        assert!(r.header("webhook-signature").is_some());
    }
    // Let the marks land (the 4th answer's mark follows its response).
    let db = home.path().join("spool.db");
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let st = super::open(&db);
        let all = st
            .list_batches(&BatchFilter {
                limit: 100,
                ..Default::default()
            })
            .unwrap();
        let state = |k: &str| all.iter().find(|b| b.key == k).map(|b| b.state);
        if state("fine").map(|s| s.as_str()) == Some("delivered")
            && state("retry").map(|s| s.as_str()) == Some("delivered")
            && state("perm").map(|s| s.as_str()) == Some("dead")
        {
            assert_eq!(state("quarantine").map(|s| s.as_str()), Some("dead"));
            break;
        }
        assert!(
            Instant::now() < until,
            "batches: {all:?}\nlog:\n{}",
            p.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Anything periodic (the heartbeat's alert pass, issue checks) runs with the heartbeat:
    // wait until the dispatcher has written three more, read from the spool, instead of
    // sleeping for a guess of how long that takes.
    let beat = |db: &Path| {
        super::open(db)
            .meta_time("dispatcher_heartbeat_at")
            .unwrap()
            .unwrap_or(0.0)
    };
    let until = Instant::now() + Duration::from_secs(10);
    let mut beats = 0;
    let mut last = beat(&db);
    while beats < 3 {
        assert!(Instant::now() < until, "no heartbeat; log:\n{}", p.log());
        tokio::time::sleep(Duration::from_millis(20)).await;
        let now = beat(&db);
        if now > last {
            beats += 1;
            last = now;
        }
    }
    p.sigterm();
    let st = tokio::task::block_in_place(|| p.wait_exit(Duration::from_secs(20)));
    assert!(st.success(), "{st:?}\n{}", p.log());
    let log = p.log();
    Run {
        home,
        alert_file,
        log,
        rx,
    }
}

/// Every (table.column, rowid) holding the marker, outside the allowed places.
fn db_hits(db: &Path) -> Vec<String> {
    let conn =
        rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    let tables: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(
        [
            "batches",
            "events",
            "attempts",
            "destinations",
            "issues",
            "audit",
            "meta"
        ]
        .iter()
        .all(|t| tables.iter().any(|x| x == t)),
        "the scan sees the schema: {tables:?}"
    );
    let quarantined_events: Vec<i64> = conn
        .prepare(
            "SELECT e.id FROM events e JOIN batches b ON b.id = e.batch_id
             WHERE b.destination = 'quarantine'",
        )
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let mut hits = Vec::new();
    let mut scanned = 0usize;
    for t in &tables {
        let cols: Vec<String> = conn
            .prepare(&format!("PRAGMA table_info(\"{t}\")"))
            .unwrap()
            .query_map([], |r| r.get(1))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        for c in cols {
            if t == "events" && (c == "payload" || c == "raw") {
                continue;
            }
            // Every table of the schema has a rowid (none is WITHOUT ROWID).
            let sql = format!("SELECT rowid, \"{c}\" FROM \"{t}\"");
            let mut stmt = conn.prepare(&sql).unwrap();
            let rows = stmt
                .query_map([], |r| {
                    let id: i64 = r.get(0)?;
                    let v: rusqlite::types::Value = r.get(1)?;
                    Ok((id, v))
                })
                .unwrap();
            for row in rows {
                let (id, v) = row.unwrap();
                scanned += 1;
                let bytes: Vec<u8> = match v {
                    rusqlite::types::Value::Text(s) => s.into_bytes(),
                    rusqlite::types::Value::Blob(b) => b,
                    _ => continue,
                };
                if !bytes.windows(MARK.len()).any(|w| w == MARK.as_bytes()) {
                    continue;
                }
                if t == "events" && c == "headers" && quarantined_events.contains(&id) {
                    continue;
                }
                hits.push(format!(
                    "{t}.{c} rowid {id}: {}",
                    String::from_utf8_lossy(&bytes)
                ));
            }
        }
    }
    assert!(scanned > 50, "the scan read the data ({scanned} values)");
    hits
}

/// Lines of `text` holding the marker.
fn log_hits(text: &str) -> Vec<&str> {
    text.lines().filter(|l| l.contains(MARK)).collect()
}

/// A tracing writer into a shared buffer, for the alert passes run in this process.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_never_reaches_a_log_line_or_the_database_outside_payload_and_raw() {
    let run = scenario().await;
    let db = run.home.path().join("spool.db");

    // The log was captured, is JSON, and covers every path the run took.
    let lines: Vec<serde_json::Value> = run
        .log
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    assert!(
        lines.len() >= 10 && lines.len() * 10 >= run.log.lines().count() * 9,
        "HOOKSPOOL_LOG=json gives JSON lines:\n{}",
        run.log
    );
    for needle in ["queued", "attempt finished", "dispatcher ready"] {
        assert!(
            run.log.contains(needle),
            "the log has {needle:?}:\n{}",
            run.log
        );
    }
    let hits = log_hits(&run.log);
    assert!(
        hits.is_empty(),
        "the marker reached the log:\n{}",
        hits.join("\n")
    );

    // The marker is where the spec stores it (so the scan below would see a leak)...
    {
        let conn = rusqlite::Connection::open(&db).unwrap();
        let in_payload: i64 = conn
            .query_row(
                "SELECT count(*) FROM events WHERE instr(payload, ?1) > 0",
                [MARK],
                |r| r.get(0),
            )
            .unwrap();
        assert!(in_payload >= 3, "payloads hold the marker: {in_payload}");
        // The intake's failure path really stored a failed attempt and a dead batch.
        let retried: i64 = conn
            .query_row(
                "SELECT count(*) FROM attempts WHERE outcome = 'retry' AND status = 500",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(retried, 1);
    }
    // ...and nowhere else.
    let hits = db_hits(&db);
    assert!(
        hits.is_empty(),
        "the marker is in the database:\n{}",
        hits.join("\n")
    );

    // Alerts. Open issues the way the dispatcher and intake are documented to
    // (observe/mod.rs), with the run's real stored error texts, then one real pass through
    // alerts.argv and one dry pass, with this process's log captured.
    let cfg = {
        let inputs = hookspool::config::PathInputs {
            home_flag: Some(run.home.path().to_path_buf()),
            ..Default::default()
        };
        hookspool::config::load(&inputs, true).unwrap().0
    };
    let mut store = super::open(&db);
    let now = hookspool::clock::Clock::now(&*hookspool::clock::system());
    let batches = store
        .list_batches(&BatchFilter {
            limit: 100,
            ..Default::default()
        })
        .unwrap();
    let by_key = |k: &str| batches.iter().find(|b| b.key == k).unwrap().clone();
    let (retry, perm, quar) = (by_key("retry"), by_key("perm"), by_key("quarantine"));
    let failed = store
        .attempts(retry.id)
        .unwrap()
        .into_iter()
        .find(|a| a.status == Some(500))
        .unwrap();
    issues::delivery_failed(
        &mut store,
        "http-recv",
        Some(&retry.route),
        issues::DeliveryReason::Http5xx,
        Some(retry.id),
        failed.error.as_deref(),
        now,
    )
    .unwrap();
    issues::delivery_failed(
        &mut store,
        "http-recv",
        Some(&perm.route),
        issues::DeliveryReason::Permanent,
        Some(perm.id),
        perm.last_error.as_deref(),
        now,
    )
    .unwrap();
    let captured = Captured::default();
    let sub = tracing_subscriber::fmt()
        .json()
        .with_max_level(tracing::Level::TRACE)
        .with_writer({
            let c = captured.clone();
            move || c.clone()
        })
        .finish();
    let report = tracing::subscriber::with_default(sub, || {
        alerts::run_due_blocking(&mut store, &cfg.alerts, false, &*hookspool::clock::system())
    })
    .unwrap();
    // The run's own dispatcher may already have alerted these kinds (rate limit per kind).
    assert!(report.failed.is_empty(), "{report:?}");
    issues::quarantined(
        &mut store,
        "sn",
        quar.id,
        quar.last_error
            .as_deref()
            .and_then(|e| e.strip_prefix("plugin error: "))
            .unwrap_or("unknown"),
        now,
    )
    .unwrap();
    let sub = tracing_subscriber::fmt()
        .json()
        .with_max_level(tracing::Level::TRACE)
        .with_writer({
            let c = captured.clone();
            move || c.clone()
        })
        .finish();
    // A kind nothing has alerted yet, so the dry pass has one to record.
    issues::spool_limit(&mut store, "busy", true, failed.error.as_deref(), now).unwrap();
    let report = tracing::subscriber::with_default(sub, || {
        alerts::run_due_blocking(&mut store, &cfg.alerts, true, &*hookspool::clock::system())
    })
    .unwrap();
    assert!(
        !report.sent.is_empty() && report.failed.is_empty(),
        "{report:?}"
    );
    drop(store);
    let alert_log = String::from_utf8_lossy(&captured.0.lock().unwrap()).to_string();
    assert!(alert_log.contains("alert recorded (dry)"), "{alert_log}");
    let hits = log_hits(&alert_log);
    assert!(
        hits.is_empty(),
        "the marker reached an alert log line:\n{}",
        hits.join("\n")
    );
    let sent = std::fs::read_to_string(&run.alert_file).expect("the alert command ran");
    assert!(sent.contains("http-recv"), "{sent}");
    assert!(
        !sent.contains(MARK),
        "the marker reached an alert text:\n{sent}"
    );
    let hits = db_hits(&db);
    assert!(
        hits.is_empty(),
        "after the alerts, the marker is in the database:\n{}",
        hits.join("\n")
    );
    drop(run.rx);
}

/// Issue 7 / spec 11.4 wiring: under `hookspool run`, a dead batch and a quarantine open
/// issues and alerts.argv runs once for them, with no help from the test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_opens_issues_and_alerts() {
    let run = scenario().await;
    let conn = rusqlite::Connection::open(run.home.path().join("spool.db")).unwrap();
    let fps: Vec<String> = conn
        .prepare("SELECT fingerprint FROM issues WHERE alerted_at IS NOT NULL")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(
        fps.iter().any(|f| f.contains("http-recv")) && fps.iter().any(|f| f == "config:plugin:sn"),
        "alerted issues: {fps:?}"
    );
    let sent = std::fs::read_to_string(&run.alert_file).expect("the alert command ran");
    assert!(!sent.contains(MARK), "{sent}");
}
