//! Issue 31, first slice: the read-only management API through the real `hookspool admin`
//! on 127.0.0.1, over a real SQLite spool: the Host and token gates, every endpoint, the
//! batch filters, keyset pages that neither skip nor repeat a batch while batches are
//! inserted, payloads only on request, no CORS, and no token in the log. The actions: each
//! works through the same `ops` functions as the CLI and leaves an audit row saying
//! `admin-token`; a POST without the token (401) or without the CSRF header (403) changes
//! nothing; a wrong state is 409; a bulk replay's dry run counts and changes nothing. The
//! CLI's new filters (`list --since/--until`, `replay --dead --until --dry-run`) agree.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

use super::intake::{Resp, read_response};
use super::{bin, capture_stderr, open, request, wait_until, window};

pub(super) const TOKEN: &str = "ADMINTOKENSENTINEL-0123456789abcdef";

/// `hookspool admin` on 127.0.0.1:0, the port read from its start line.
pub(super) struct AdminProc {
    pub(super) child: Child,
    pub(super) addr: SocketAddr,
    pub(super) stderr: Arc<Mutex<Vec<u8>>>,
}

impl AdminProc {
    pub(super) fn start(home: &Path, token_file: &Path) -> AdminProc {
        AdminProc::start_with_env(home, token_file, &[])
    }

    /// `start` with these variables in its environment (the test seams).
    pub(super) fn start_with_env(
        home: &Path,
        token_file: &Path,
        env: &[(&str, &str)],
    ) -> AdminProc {
        let mut child = Command::new(bin())
            .arg("--home")
            .arg(home)
            .args(["admin", "--listen", "127.0.0.1:0", "--token-file"])
            .arg(token_file)
            .envs(env.iter().copied())
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

    pub(super) fn log(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().unwrap()).to_string()
    }

    /// `method path` with the Host and Authorization given (None leaves one out).
    pub(super) fn call(
        &self,
        method: &str,
        path: &str,
        host: Option<&str>,
        token: Option<&str>,
    ) -> Resp {
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

    /// A POST with a JSON body: the token and the CSRF header when given.
    pub(super) fn post_with(
        &self,
        path: &str,
        body: &str,
        token: Option<&str>,
        csrf: Option<&str>,
    ) -> Resp {
        let mut head = format!(
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n",
            self.addr.port()
        );
        if let Some(t) = token {
            head.push_str(&format!("Authorization: Bearer {t}\r\n"));
        }
        if let Some(c) = csrf {
            head.push_str(&format!("X-Hookspool-CSRF: {c}\r\n"));
        }
        head.push_str(&format!(
            "Content-Type: application/json\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
            body.len()
        ));
        let mut s = TcpStream::connect(self.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
        s.write_all(head.as_bytes()).unwrap();
        let _ = s.write_all(body.as_bytes());
        read_response(&mut s)
    }

    /// An authorized action: (status, JSON).
    pub(super) fn post(&self, path: &str, body: &str) -> (u16, Value) {
        let r = self.post_with(path, body, Some(TOKEN), Some("1"));
        let v = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
        (r.status, v)
    }

    /// An authorized GET: (status, JSON).
    pub(super) fn get(&self, path: &str) -> (u16, Value) {
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

pub(super) fn home_with_token() -> (tempfile::TempDir, std::path::PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let home = tempfile::tempdir().unwrap();
    std::fs::write(home.path().join("config.toml"), "").unwrap();
    let token = home.path().join("admin.token");
    std::fs::write(&token, format!("{TOKEN}\n")).unwrap();
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
    (home, token)
}

pub(super) fn ids(v: &Value) -> Vec<i64> {
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
    // A writer inserts batches the whole time the pages are read. The first page waits for
    // its first insert: the pages can all be read before the writer's first transaction,
    // which left nothing inserted and failed `inserted > 0` now and then.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let written = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let writer = {
        let (db, stop, written) = (db.clone(), stop.clone(), written.clone());
        std::thread::spawn(move || {
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && n < 400 {
                seed(&db, 10_000 + n, 5);
                n += 5;
                written.store(n, std::sync::atomic::Ordering::Relaxed);
            }
            n
        })
    };
    wait_until("the writer's first insert", Duration::from_secs(20), || {
        written.load(std::sync::atomic::Ordering::Relaxed) > 0
    });
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

/// A filter read batch by batch (a key prefix, a JSON path) stops on its scan budget:
/// the page holds what it found, `scanned_to` and `next_before` say where it stopped, and
/// the pages read on from there hold every match exactly once, newest first. The dashboard
/// says so and links on. The budget is the test seam's 20 rows (the real one is 25 ms).
#[test]
fn a_page_that_stops_on_its_scan_budget_says_where_and_the_pages_after_it_miss_nothing() {
    let (home, token) = home_with_token();
    let db = home.path().join("spool.db");
    let seeded = seed(&db, 0, 230);
    let a = AdminProc::start_with_env(
        home.path(),
        &token,
        &[("HOOKSPOOL_TEST_ADMIN_SCAN_ROWS", "20")],
    );
    let newest_first = |keep: &dyn Fn(usize) -> bool| -> Vec<i64> {
        let mut w: Vec<i64> = seeded
            .iter()
            .enumerate()
            .filter(|(i, _)| keep(*i))
            .map(|(_, id)| *id)
            .collect();
        w.sort_unstable_by(|a, b| b.cmp(a));
        w
    };
    for (query, want) in [
        ("key_prefix=k1-", newest_first(&|i| i % 4 == 1)),
        ("json_path=%24.n&json_value=17", newest_first(&|i| i == 17)),
    ] {
        let (mut seen, mut next, mut stops, mut pages) = (Vec::new(), None::<i64>, 0, 0);
        loop {
            let path = match next {
                None => format!("/api/v1/batches?{query}"),
                Some(b) => format!("/api/v1/batches?{query}&before={b}"),
            };
            let (s, v) = a.get(&path);
            assert_eq!(s, 200, "{v}");
            let got = ids(&v);
            if let Some(at) = v["scanned_to"].as_i64() {
                stops += 1;
                assert_eq!(v["next_before"].as_i64(), Some(at), "{v}");
                assert!(got.len() < 100 && got.iter().all(|id| *id >= at), "{v}");
            }
            seen.extend(got);
            pages += 1;
            assert!(pages < 100, "{query}: pages end");
            match v["next_before"].as_i64() {
                Some(b) => next = Some(b),
                None => break,
            }
        }
        assert_eq!(seen, want, "{query}: every match once, newest first");
        // 230 batches, 20 examined per page: the scan stopped on each page but the last.
        assert!(stops >= 10, "{query}: {stops} pages stopped on the budget");
    }
    // The dashboard's page says where it stopped and links on from there.
    let host = format!("127.0.0.1:{}", a.addr.port());
    let r = a.call("GET", "/batches?key_prefix=k1-", Some(&host), Some(TOKEN));
    let html = String::from_utf8_lossy(&r.body).to_string();
    assert_eq!(r.status, 200, "{html}");
    let top = *seeded.iter().max().unwrap();
    let at = top + 1 - 20;
    assert!(
        html.contains(&format!("Scanned to batch {at}, more below")),
        "{html}"
    );
    assert!(
        html.contains(&format!("before={at}")),
        "the next link starts where the scan stopped: {html}"
    );
    // Without the seam a page of this spool is whole: no stop.
    drop(a);
    let a = AdminProc::start(home.path(), &token);
    let (s, v) = a.get("/api/v1/batches?key_prefix=k1-&limit=500");
    assert_eq!(s, 200, "{v}");
    assert_eq!(ids(&v), newest_first(&|i| i % 4 == 1));
    assert_eq!(v["scanned_to"], Value::Null);
    assert_eq!(v["next_before"], Value::Null);
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

/// A spool for the actions: dead batches 1-4 (routes r0, r1, r0, r1; first events at 1000 +
/// i; one event each), then sealed batches 5 and 6 of three events each (route r2, first
/// event at 1010 and 1011). Returns the ids.
pub(super) fn seed_dead(db: &Path) -> (Vec<i64>, i64, i64) {
    use hookspool::store::{AttemptReport, Mark};
    let mut st = open(db);
    let w = window(0.0, 0.0, 100, 1 << 20);
    let mut first = |route: &str, key: &str, t: f64| -> i64 {
        match st
            .enqueue(&request(route, key, &format!(r#"{{"k":"{key}"}}"#), t, w))
            .unwrap()
        {
            hookspool::store::EnqueueOutcome::Queued { copies } => copies[0].1,
            other => panic!("{other:?}"),
        }
    };
    let dead: Vec<i64> = (0..4)
        .map(|i| first(&format!("r{}", i % 2), &format!("d{i}"), 1000.0 + i as f64))
        .collect();
    let split = first("r2", "m", 1010.0);
    let exclude = first("r2", "x", 1011.0);
    for _ in 0..2 {
        first("r2", "m", 1010.0);
        first("r2", "x", 1011.0);
    }
    st.seal_ready(2000.0).unwrap();
    for id in &dead {
        let claim = st
            .claim(
                *id,
                "test",
                2060.0,
                2000.0,
                false,
                hookspool::store::DeliveryId::per_attempt("d"),
            )
            .unwrap()
            .unwrap();
        st.mark(&AttemptReport {
            batch_id: *id,
            attempt_id: claim.attempt_id,
            lease_owner: claim.lease_owner,
            now: 2000.5,
            status: Some(422),
            error: Some("http 422".into()),
            duration_ms: 5,
            delivery_id: None,
            events_delivered: None,
            failed_event_id: None,
            mark: Mark::Dead {
                klass: hookspool::vocab::Klass::Permanent,
            },
        })
        .unwrap();
    }
    (dead, split, exclude)
}

/// The spool's audit rows: (action, batch, target, detail).
pub(super) fn audit_rows(db: &Path) -> Vec<(String, Option<i64>, Option<String>, Value)> {
    let c = rusqlite::Connection::open(db).unwrap();
    let mut stmt = c
        .prepare("SELECT action, batch_id, target, detail FROM audit ORDER BY id")
        .unwrap();
    stmt.query_map([], |r| {
        let d: String = r.get(3)?;
        Ok((
            r.get(0)?,
            r.get(1)?,
            r.get(2)?,
            serde_json::from_str(&d).unwrap_or(Value::Null),
        ))
    })
    .unwrap()
    .collect::<Result<_, _>>()
    .unwrap()
}

fn state_of(a: &AdminProc, id: i64) -> String {
    let (s, v) = a.get(&format!("/api/v1/batches/{id}"));
    assert_eq!(s, 200, "{v}");
    v["batch"]["state"].as_str().unwrap().to_string()
}

#[test]
fn an_action_without_the_token_or_the_csrf_header_is_refused_and_changes_nothing() {
    let (home, token) = home_with_token();
    let db = home.path().join("spool.db");
    let (dead, _, _) = seed_dead(&db);
    let a = AdminProc::start(home.path(), &token);
    let path = format!("/api/v1/batches/{}/replay", dead[0]);

    let r = a.post_with(&path, "{}", None, Some("1"));
    assert_eq!(r.status, 401, "{}", String::from_utf8_lossy(&r.body));
    let r = a.post_with(&path, "{}", Some("wrong-token-0123456789"), Some("1"));
    assert_eq!(r.status, 401);
    // A form post from another origin can send neither the header nor the token; with the
    // token but no header (or a wrong value) it is still refused.
    for csrf in [None, Some("0")] {
        let r = a.post_with(&path, "{}", Some(TOKEN), csrf);
        assert_eq!(r.status, 403, "{}", String::from_utf8_lossy(&r.body));
        let v: Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(v["error"], "csrf_required", "{v}");
        assert!(
            v["message"]
                .as_str()
                .unwrap()
                .contains("X-Hookspool-CSRF: 1"),
            "{v}"
        );
    }
    let r = a.post_with(
        "/api/v1/destinations/http:r0/pause",
        "{}",
        Some(TOKEN),
        None,
    );
    assert_eq!(r.status, 403);
    assert_eq!(state_of(&a, dead[0]), "dead", "nothing changed");
    let (_, v) = a.get("/api/v1/status");
    assert!(
        !v.to_string().contains("\"paused\""),
        "no destination paused: {v}"
    );
    assert!(audit_rows(&db).is_empty(), "no audit row: nothing happened");
    // A GET never acts; a POST to a read is not an action.
    assert_eq!(a.get(&path).0, 404);
    assert_eq!(a.post("/api/v1/status", "{}").0, 405);
}

#[test]
fn each_action_works_through_the_api_and_is_audited_as_admin_token() {
    let (home, token) = home_with_token();
    let db = home.path().join("spool.db");
    let (dead, split, exclude) = seed_dead(&db);
    let a = AdminProc::start(home.path(), &token);

    // The bulk replay's dry run: counts, names, changes nothing.
    let (s, v) = a.post(
        "/api/v1/replay",
        r#"{"state": "dead", "destination": "http:r0", "dry_run": true}"#,
    );
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["count"], 2, "{v}");
    assert_eq!(v["batches"], serde_json::json!([dead[0], dead[2]]));
    let (_, v) = a.post(
        "/api/v1/replay",
        r#"{"state": "dead", "since": 1001, "until": 1003, "dry_run": true}"#,
    );
    assert_eq!(v["batches"], serde_json::json!([dead[1], dead[2]]), "{v}");
    assert!(dead.iter().all(|id| state_of(&a, *id) == "dead"));
    assert!(audit_rows(&db).is_empty(), "a dry run writes nothing");
    // A filter must say dead; ids and a filter together are refused.
    let (s, v) = a.post("/api/v1/replay", r#"{"destination": "http:r0"}"#);
    assert_eq!((s, v["error"].as_str()), (400, Some("bad_request")), "{v}");
    let (s, _) = a.post("/api/v1/replay", r#"{"batches": [1], "state": "dead"}"#);
    assert_eq!(s, 400);

    // Replay one batch; a second time it is in the wrong state.
    let one = format!("/api/v1/batches/{}/replay", dead[0]);
    let (s, v) = a.post(&one, "");
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["replay"][0]["ok"], true, "{v}");
    assert_eq!(state_of(&a, dead[0]), "retry");
    let (s, v) = a.post(&one, "{}");
    assert_eq!((s, v["error"].as_str()), (409, Some("wrong_state")), "{v}");
    // Retry takes the replayed (retry) batch, not a dead one.
    let (s, v) = a.post(&format!("/api/v1/batches/{}/retry", dead[0]), "{}");
    assert_eq!(s, 200, "{v}");
    let (s, _) = a.post(&format!("/api/v1/batches/{}/retry", dead[1]), "{}");
    assert_eq!(s, 409);
    assert_eq!(a.post("/api/v1/batches/999999/replay", "{}").0, 404);

    // The bulk replay: the dead batches the filter matches.
    let (s, v) = a.post(
        "/api/v1/replay",
        r#"{"state": "dead", "destination": "http:r1", "until": 1002}"#,
    );
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["count"], 1, "{v}");
    assert_eq!(state_of(&a, dead[1]), "retry");
    assert_eq!(state_of(&a, dead[3]), "dead", "outside the filter");
    // Replay by ids.
    let (s, v) = a.post(
        "/api/v1/replay",
        &format!(r#"{{"batches": [{}]}}"#, dead[3]),
    );
    assert_eq!(
        (s, v["replay"][0]["ok"].as_bool()),
        (200, Some(true)),
        "{v}"
    );

    // Split: a bad body says what to send; then three parts.
    let path = format!("/api/v1/batches/{split}/split");
    let (s, v) = a.post(&path, r#"{"max_events": 0}"#);
    assert_eq!(s, 400, "{v}");
    assert!(v["message"].as_str().unwrap().contains("max_events"), "{v}");
    let (s, v) = a.post(&path, r#"{"maxevents": 1}"#);
    assert_eq!(s, 400, "unknown field refused: {v}");
    let (s, v) = a.post(&path, "not json");
    assert_eq!(s, 400, "{v}");
    let (s, v) = a.post(&path, r#"{"max_events": 1}"#);
    assert_eq!(s, 200, "{v}");
    let parts: Vec<i64> = v["into"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_i64().unwrap())
        .collect();
    assert_eq!(parts.len(), 3, "{v}");
    assert_eq!(state_of(&a, split), "dropped");
    assert_eq!(a.post(&path, r#"{"max_events": 1}"#).0, 409, "split twice");

    // Exclude one event of the other three-event batch.
    let (_, b) = a.get(&format!("/api/v1/batches/{exclude}"));
    let ev = b["events"][0]["id"].as_i64().unwrap();
    let path = format!("/api/v1/batches/{exclude}/exclude");
    assert_eq!(a.post(&path, r#"{"events": []}"#).0, 400);
    let (s, v) = a.post(&path, &format!(r#"{{"events": [{ev}]}}"#));
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["count"], 2, "{v}");

    // Drop one part; dropping it again is the wrong state.
    let path = format!("/api/v1/batches/{}/drop", parts[0]);
    let (s, v) = a.post(&path, "{}");
    assert_eq!((s, v["drop"][0]["ok"].as_bool()), (200, Some(true)), "{v}");
    assert_eq!(state_of(&a, parts[0]), "dropped");
    assert_eq!(a.post(&path, "{}").0, 409);

    // Pause and resume; the pause's issue is acked, then resolved; an unknown destination
    // is not found.
    let (s, v) = a.post(
        "/api/v1/destinations/http:r2/pause",
        r#"{"reason": "maintenance"}"#,
    );
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["by"], "admin-token");
    assert_eq!(
        a.post("/api/v1/destinations/http:nowhere/pause", "{}").0,
        404
    );
    let (_, v) = a.get("/api/v1/issues");
    let row = v["issues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["fingerprint"].as_str().unwrap().contains("paused"))
        .unwrap_or_else(|| panic!("the pause's issue: {v}"))
        .clone();
    let issue = row["id"].as_i64().unwrap();
    let fingerprint = row["fingerprint"].as_str().unwrap().to_string();
    let (s, v) = a.post(&format!("/api/v1/issues/{issue}/ack"), "");
    assert_eq!((s, v["state"].as_str()), (200, Some("acked")), "{v}");
    let (s, v) = a.post(&format!("/api/v1/issues/{issue}/ack"), "");
    assert_eq!(s, 409, "only an open issue is acked: {v}");
    let (s, v) = a.post(&format!("/api/v1/issues/{issue}/resolve"), "");
    assert_eq!((s, v["state"].as_str()), (200, Some("resolved")), "{v}");
    // An issue is also named by its fingerprint (percent-encoded or not).
    let (s, v) = a.post(
        &format!("/api/v1/issues/{}/ignore", fingerprint.replace(':', "%3A")),
        "",
    );
    assert_eq!((s, v["state"].as_str()), (200, Some("ignored")), "{v}");
    assert_eq!(v["id"], issue);
    assert_eq!(a.post("/api/v1/issues/no:such:issue/ignore", "").0, 404);
    let (s, v) = a.post("/api/v1/destinations/http:r2/resume", "");
    assert_eq!((s, v["state"].as_str()), (200, Some("closed")), "{v}");

    // A body over the cap is refused.
    let big = format!(r#"{{"events": [1]}}{}"#, " ".repeat(64 * 1024));
    assert_eq!(
        a.post(&format!("/api/v1/batches/{exclude}/exclude"), &big)
            .0,
        413
    );

    // The audit rows: every action, by admin-token.
    let rows = audit_rows(&db);
    let actions: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
    for want in [
        "replay",
        "retry",
        "split",
        "exclude",
        "drop",
        "pause",
        "issue_acked",
        "issue_resolved",
        "issue_ignored",
        "resume",
    ] {
        assert!(actions.contains(&want), "{want} audited: {actions:?}");
    }
    assert_eq!(
        rows.iter().filter(|r| r.0 == "replay").count(),
        3,
        "one, the filter's one, the id's one: {rows:?}"
    );
    assert!(
        rows.iter().all(|r| r.3["by"] == "admin-token"),
        "who: {rows:?}"
    );
    assert!(rows.iter().any(|r| r.0 == "replay" && r.1 == Some(dead[0])));
    assert!(
        rows.iter()
            .any(|r| r.0 == "pause" && r.2.as_deref() == Some("http:r2"))
    );
    // And the journal.
    let log = a.log();
    assert!(
        log.contains(&format!("action by admin-token: replay batch {}", dead[0])),
        "{log}"
    );
    assert!(
        log.contains("action by admin-token: pause http:r2"),
        "{log}"
    );
    assert!(!log.contains("maintenance"), "no body in the log");
    assert!(!log.contains("ADMINTOKENSENTINEL"));
}

#[test]
fn the_cli_lists_and_dry_runs_by_time_window_as_the_api_does() {
    let (home, _token) = home_with_token();
    let db = home.path().join("spool.db");
    let (dead, _, _) = seed_dead(&db);
    let run = |args: &[&str]| {
        let o = Command::new(bin())
            .arg("--home")
            .arg(home.path())
            .args(args)
            .env_remove("HOOKSPOOL_CONFIG")
            .env_remove("HOOKSPOOL_HOME")
            .output()
            .unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stdout).to_string(),
            String::from_utf8_lossy(&o.stderr).to_string(),
        )
    };
    let (code, out, err) = run(&["--json", "list", "--since", "1001", "--until", "1003"]);
    assert_eq!(code, Some(0), "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    let mut listed: Vec<i64> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["id"].as_i64().unwrap())
        .collect();
    listed.sort_unstable();
    assert_eq!(listed, vec![dead[1], dead[2]]);

    let (code, out, err) = run(&[
        "--json",
        "replay",
        "--dead",
        "--since",
        "1001",
        "--until",
        "1003",
        "--dry-run",
    ]);
    assert_eq!(code, Some(0), "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["count"], 2, "{v}");
    assert_eq!(v["batches"], serde_json::json!([dead[1], dead[2]]));
    let (code, out, _) = run(&["replay", "--dead", "--until", "1002", "--dry-run"]);
    assert_eq!(code, Some(0));
    assert!(
        out.contains(&format!(
            "2 dead batch(es) would be replayed: {}, {}",
            dead[0], dead[1]
        )),
        "{out}"
    );
    assert!(audit_rows(&db).is_empty(), "a dry run changes nothing");
    let (code, _, err) = run(&["replay", "--dead", "--until", "tomorrowish"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--until"), "{err}");
    // The real thing replays exactly those.
    let (code, _, err) = run(&["replay", "--dead", "--until", "1002"]);
    assert_eq!(code, Some(0), "{err}");
    let rows = audit_rows(&db);
    let replayed: Vec<Option<i64>> = rows.iter().map(|r| r.1).collect();
    assert_eq!(replayed, vec![Some(dead[0]), Some(dead[1])]);
    assert!(
        rows.iter().all(|r| r.3.get("by").is_none()),
        "the CLI's rows as before"
    );
}

/// A GET of `path` with the Host and the extra header lines given.
fn get_raw(a: &AdminProc, path: &str, extra: &str) -> Resp {
    let head = format!(
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n{extra}Connection: close\r\n\r\n",
        a.addr.port()
    );
    let mut s = TcpStream::connect(a.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    s.write_all(head.as_bytes()).unwrap();
    read_response(&mut s)
}

#[test]
fn the_dashboard_signs_in_once_by_query_then_by_cookie_and_shows_no_payload() {
    let (home, token) = home_with_token();
    let db = home.path().join("spool.db");
    let seeded = seed(&db, 0, 6);
    let (dead, _, _) = seed_dead(&db);
    let a = AdminProc::start(home.path(), &token);

    // No token, a wrong one, a foreign Host: refused.
    assert_eq!(get_raw(&a, "/", "").status, 401);
    assert_eq!(
        get_raw(&a, "/?token=wrong-token-0123456789", "").status,
        401
    );
    assert_eq!(
        a.call(
            "GET",
            &format!("/?token={TOKEN}"),
            Some("evil.example"),
            None
        )
        .status,
        403
    );
    // The token once: a cookie (HttpOnly, SameSite=Strict, not the token) and a redirect
    // to / without the query.
    let r = get_raw(&a, &format!("/?token={TOKEN}"), "");
    assert_eq!(r.status, 303, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.header("location"), Some("/"));
    let set = r.header("set-cookie").unwrap().to_string();
    assert!(
        set.contains("HttpOnly") && set.contains("SameSite=Strict"),
        "{set}"
    );
    assert!(!set.contains("ADMINTOKENSENTINEL"), "{set}");
    let cookie = format!("Cookie: {}\r\n", set.split(';').next().unwrap());

    // The cookie authenticates the page and the JSON reads; an action only with the
    // session's CSRF token, which the page carries.
    let r = get_raw(&a, "/", &cookie);
    assert_eq!(r.status, 200);
    assert!(r.header("content-type").unwrap().starts_with("text/html"));
    let csp = r.header("content-security-policy").unwrap().to_string();
    for rule in [
        "default-src 'none'",
        "script-src 'self'",
        "connect-src 'self'",
        "frame-ancestors 'none'",
    ] {
        assert!(csp.contains(rule), "{rule}: {csp}");
    }
    assert!(!csp.contains("unsafe"), "no inline script or style: {csp}");
    let page = String::from_utf8_lossy(&r.body).to_string();
    for id in seeded.iter().chain(&dead) {
        assert!(page.contains(&format!("journalctl BATCH={id}")), "{id}");
        assert!(page.contains(&format!("hookspool replay {id}")), "{id}");
    }
    for want in [
        "Backlog",
        "http:r0",
        "http:r1",
        "Open issues",
        "Recent batches",
        "dead",
    ] {
        assert!(page.contains(want), "{want}:\n{page}");
    }
    assert!(!page.contains("PAYLOADSENTINEL"), "no payload:\n{page}");
    assert!(!page.contains("ADMINTOKENSENTINEL"), "no token");
    assert!(
        !page.contains("<script>") && page.contains("<script src=\"/static/app.js\""),
        "the service's own script only, nothing inline"
    );
    assert!(
        !page.contains("http://") && !page.contains("https://"),
        "nothing from elsewhere"
    );
    assert_eq!(get_raw(&a, "/api/v1/status", &cookie).status, 200);
    let csrf = page
        .split("name=\"hookspool-csrf\" content=\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .expect("the page's CSRF token")
        .to_string();
    assert_eq!(csrf.len(), 64, "{csrf}");
    let post = |cookie: &str, csrf: &str| {
        let head = format!(
            "POST /api/v1/batches/{}/replay HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n{cookie}X-Hookspool-CSRF: {csrf}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            dead[0],
            a.addr.port()
        );
        let mut s = TcpStream::connect(a.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
        s.write_all(head.as_bytes()).unwrap();
        read_response(&mut s).status
    };
    assert_eq!(
        post(&cookie, "1"),
        401,
        "a cookie with the plain 1 never acts"
    );
    assert_eq!(post("", &csrf), 401, "the CSRF token without the cookie");
    assert!(audit_rows(&db).is_empty());
    assert_eq!(
        post(&cookie, &csrf),
        200,
        "the cookie with the page's CSRF token"
    );
    assert_eq!(audit_rows(&db).len(), 1);
    let log = a.log();
    assert!(!log.contains("ADMINTOKENSENTINEL"), "{log}");
}
