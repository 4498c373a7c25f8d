//! Issue 31, first slice: the read-only management API through the real `hookspool admin`
//! on 127.0.0.1, over a real SQLite spool: the Host and token gates, every endpoint, the
//! batch filters, keyset pages that neither skip nor repeat a batch while batches are
//! inserted, payloads only on request, no CORS, and no token in the log.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

use super::intake::{Resp, read_response};
use super::{bin, capture_stderr, open, request, wait_until, window};

const TOKEN: &str = "ADMINTOKENSENTINEL-0123456789abcdef";

/// `hookspool admin` on 127.0.0.1:0, the port read from its start line.
struct AdminProc {
    child: Child,
    addr: SocketAddr,
    stderr: Arc<Mutex<Vec<u8>>>,
}

impl AdminProc {
    fn start(home: &Path, token_file: &Path) -> AdminProc {
        let mut child = Command::new(bin())
            .arg("--home")
            .arg(home)
            .args(["admin", "--listen", "127.0.0.1:0", "--token-file"])
            .arg(token_file)
            .env_remove("HOOKSPOOL_CONFIG")
            .env_remove("HOOKSPOOL_HOME")
            .env_remove("HOOKSPOOL_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = capture_stderr(&mut child);
        let mut addr = None;
        wait_until("the admin API serves", Duration::from_secs(20), || {
            let log = String::from_utf8_lossy(&stderr.lock().unwrap()).to_string();
            addr = log
                .split("admin API on http://")
                .nth(1)
                .and_then(|rest| rest.split('/').next())
                .and_then(|a| a.parse().ok());
            addr.is_some()
        });
        AdminProc {
            child,
            addr: addr.unwrap(),
            stderr,
        }
    }

    fn log(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().unwrap()).to_string()
    }

    /// `method path` with the Host and Authorization given (None leaves one out).
    fn call(&self, method: &str, path: &str, host: Option<&str>, token: Option<&str>) -> Resp {
        let mut head = format!("{method} {path} HTTP/1.1\r\n");
        if let Some(h) = host {
            head.push_str(&format!("Host: {h}\r\n"));
        }
        if let Some(t) = token {
            head.push_str(&format!("Authorization: Bearer {t}\r\n"));
        }
        head.push_str(
            "Origin: http://evil.example\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
        );
        let mut s = TcpStream::connect(self.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
        s.write_all(head.as_bytes()).unwrap();
        read_response(&mut s)
    }

    /// An authorized GET: (status, JSON).
    fn get(&self, path: &str) -> (u16, Value) {
        let host = format!("127.0.0.1:{}", self.addr.port());
        let r = self.call("GET", path, Some(&host), Some(TOKEN));
        let v = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
        (r.status, v)
    }
}

impl Drop for AdminProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A spool with `n` batches: route r<i%3>, key k<i%4>-<i>, first event at 1000 + i.
fn seed(db: &Path, from: usize, n: usize) -> Vec<i64> {
    let mut st = open(db);
    (from..from + n)
        .map(|i| {
            let payload = format!(r#"{{"n":{i},"secret_field":"PAYLOADSENTINEL{i}"}}"#);
            let req = request(
                &format!("r{}", i % 3),
                &format!("k{}-{i}", i % 4),
                &payload,
                1000.0 + i as f64,
                window(0.0, 0.0, 100, 1 << 20),
            );
            match st.enqueue(&req).unwrap() {
                hookspool::store::EnqueueOutcome::Queued { copies } => copies[0].1,
                other => panic!("{other:?}"),
            }
        })
        .collect()
}

fn home_with_token() -> (tempfile::TempDir, std::path::PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let home = tempfile::tempdir().unwrap();
    std::fs::write(home.path().join("config.toml"), "").unwrap();
    let token = home.path().join("admin.token");
    std::fs::write(&token, format!("{TOKEN}\n")).unwrap();
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
    (home, token)
}

fn ids(v: &Value) -> Vec<i64> {
    v["batches"]
        .as_array()
        .unwrap_or_else(|| panic!("batches: {v}"))
        .iter()
        .map(|b| b["id"].as_i64().unwrap())
        .collect()
}

#[test]
fn the_admin_api_refuses_a_foreign_host_and_a_missing_token_and_serves_every_read() {
    let (home, token) = home_with_token();
    let seeded = seed(&home.path().join("spool.db"), 0, 12);
    let a = AdminProc::start(home.path(), &token);
    let host = format!("127.0.0.1:{}", a.addr.port());

    // The gates: a DNS-rebinding name is refused even with the token; no token, a wrong
    // one, or no Host at all are refused; a write is not this version's.
    let r = a.call(
        "GET",
        "/api/v1/status",
        Some("evil.example:8651"),
        Some(TOKEN),
    );
    assert_eq!(r.status, 403, "{}", String::from_utf8_lossy(&r.body));
    assert!(String::from_utf8_lossy(&r.body).contains("host_refused"));
    assert_eq!(
        a.call("GET", "/api/v1/status", Some(&host), None).status,
        401
    );
    assert_eq!(
        a.call(
            "GET",
            "/api/v1/status",
            Some(&host),
            Some("wrong-token-0123456789")
        )
        .status,
        401
    );
    assert_eq!(
        a.call("GET", "/api/v1/status", None, Some(TOKEN)).status,
        403
    );
    assert_eq!(
        a.call("POST", "/api/v1/batches", Some(&host), Some(TOKEN))
            .status,
        405
    );
    let ok = a.call("GET", "/api/v1/status", Some("localhost"), Some(TOKEN));
    assert_eq!(ok.status, 200);
    assert!(
        ok.header("access-control-allow-origin").is_none(),
        "no CORS, ever"
    );

    // Status: the /healthz document.
    let (s, v) = a.get("/api/v1/status");
    assert_eq!(s, 200);
    assert!(v["ok"].is_boolean(), "{v}");

    // Batches: newest first, every filter.
    let (s, v) = a.get("/api/v1/batches");
    assert_eq!(s, 200);
    let mut want = seeded.clone();
    want.sort_unstable_by(|a, b| b.cmp(a));
    assert_eq!(ids(&v), want);
    let (_, v) = a.get("/api/v1/batches?route=r1");
    assert!(!ids(&v).is_empty());
    assert!(
        v["batches"]
            .as_array()
            .unwrap()
            .iter()
            .all(|b| b["route"] == "r1"),
        "{v}"
    );
    let (_, v) = a.get("/api/v1/batches?key_prefix=k2-");
    assert_eq!(ids(&v).len(), 3, "{v}");
    assert!(
        v["batches"]
            .as_array()
            .unwrap()
            .iter()
            .all(|b| b["key"].as_str().unwrap().starts_with("k2-"))
    );
    let (_, v) = a.get("/api/v1/batches?since=1003&until=1006");
    assert_eq!(ids(&v).len(), 3, "first events at 1003, 1004, 1005: {v}");
    let (_, v) = a.get("/api/v1/batches?state=open&source=test&destination=http:r0");
    assert_eq!(ids(&v).len(), 4, "{v}");
    let (s, v) = a.get("/api/v1/batches?state=nonsense");
    assert_eq!((s, v["error"].as_str()), (400, Some("bad_request")), "{v}");
    assert_eq!(a.get("/api/v1/batches?limit=0").0, 400);
    assert_eq!(a.get("/api/v1/batches?since=yesterday").0, 400);

    // One batch: events without payloads unless asked, the commands to copy.
    let id = seeded[5];
    let (s, v) = a.get(&format!("/api/v1/batches/{id}"));
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["batch"]["id"], id);
    assert_eq!(v["events"].as_array().unwrap().len(), 1);
    assert!(
        v["events"][0].get("payload").is_none(),
        "no payload by default: {v}"
    );
    assert_eq!(v["journalctl"], format!("journalctl BATCH={id}"));
    assert_eq!(v["replay"], format!("hookspool replay {id}"));
    let (_, v) = a.get(&format!("/api/v1/batches/{id}?payload=1"));
    assert!(
        v["events"][0]["payload"]
            .as_str()
            .unwrap()
            .contains("PAYLOADSENTINEL5"),
        "{v}"
    );
    assert_eq!(a.get("/api/v1/batches/999999").0, 404);
    assert_eq!(a.get("/api/v1/nothing").0, 404);

    // Issues.
    let (s, v) = a.get("/api/v1/issues?all=1");
    assert_eq!(s, 200);
    assert!(v["issues"].is_array(), "{v}");

    let log = a.log();
    assert!(
        !log.contains("ADMINTOKENSENTINEL"),
        "the token is never logged:\n{log}"
    );
    assert!(
        !log.contains("PAYLOADSENTINEL"),
        "no payload in the log:\n{log}"
    );
}

#[test]
fn keyset_pages_neither_skip_nor_repeat_a_batch_while_batches_are_inserted() {
    let (home, token) = home_with_token();
    let db = home.path().join("spool.db");
    let seeded = seed(&db, 0, 230);
    let a = AdminProc::start(home.path(), &token);
    // A writer inserts batches the whole time the pages are read.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (db, stop) = (db.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && n < 400 {
                seed(&db, 10_000 + n, 5);
                n += 5;
            }
            n
        })
    };
    let mut seen = Vec::new();
    let mut next: Option<i64> = None;
    let mut pages = 0;
    loop {
        let path = match next {
            None => "/api/v1/batches?limit=7&route=r1".to_string(),
            Some(b) => format!("/api/v1/batches?limit=7&route=r1&before={b}"),
        };
        let (s, v) = a.get(&path);
        assert_eq!(s, 200, "{v}");
        seen.extend(ids(&v));
        pages += 1;
        match v["next_before"].as_i64() {
            Some(b) => next = Some(b),
            None => break,
        }
        assert!(pages < 1000, "pages end");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let inserted = writer.join().unwrap();
    assert!(inserted > 0);
    // Every seeded r1 batch exactly once, in descending order.
    let mut sorted = seen.clone();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    sorted.dedup();
    assert_eq!(sorted, seen, "no batch twice, newest first");
    let first = seen.first().copied().unwrap();
    let want: Vec<i64> = {
        let mut w: Vec<i64> = seeded
            .iter()
            .enumerate()
            .filter(|(i, _)| i % 3 == 1)
            .map(|(_, id)| *id)
            .collect();
        w.sort_unstable_by(|a, b| b.cmp(a));
        w
    };
    let old: Vec<i64> = seen
        .iter()
        .copied()
        .filter(|id| *id <= *want.first().unwrap())
        .collect();
    assert_eq!(
        old, want,
        "every r1 batch that existed before the first page, none skipped"
    );
    assert!(first >= want[0]);
}

#[test]
fn the_admin_api_listens_on_loopback_only() {
    let (home, token) = home_with_token();
    seed(&home.path().join("spool.db"), 0, 1);
    let o = Command::new(bin())
        .arg("--home")
        .arg(home.path())
        .args(["admin", "--listen", "0.0.0.0:0", "--token-file"])
        .arg(&token)
        .env_remove("HOOKSPOOL_CONFIG")
        .env_remove("HOOKSPOOL_HOME")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("is not a loopback address"), "{err}");
}
