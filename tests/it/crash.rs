//! Crash tests (spec 12, 18): the real process is killed with SIGKILL at named failpoints
//! inside enqueue, seal, claim and mark-with-emits. After reopening, every acknowledged
//! event is present, nothing is half-written, and the store's invariants hold.

use std::io::Write;
use std::process::{Command, Stdio};

use hookspool::store::{BatchFilter, Store};
use serde_json::json;

use super::{bin, child, killed, open_spec, request, window};

const CONFIG: &str = r#"
[sources.s]
scheme = "static-token"
header = "X-Token"
key = "k"
action = "http-main"

[[routes]]
name = "audit"
source = "s"
tee = true
destination = "http-audit"

[destinations.http-main]
type = "http"
url = "https://main.invalid/hook"
secret = { file = "/nonexistent/hookspool-test-secret" }

[destinations.http-audit]
type = "http"
url = "https://audit.invalid/hook"
secret = { file = "/nonexistent/hookspool-test-secret" }
"#;

fn enqueue(home: &std::path::Path, payload: &str, failpoint: Option<&str>) -> std::process::Output {
    let mut cmd = Command::new(bin());
    cmd.arg("--home")
        .arg(home)
        .args([
            "enqueue",
            "--source",
            "s",
            "--key",
            "k",
            "--event-type",
            "t",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env_remove("HOOKSPOOL_CONFIG")
        .env_remove("HOOKSPOOL_HOME");
    if let Some(f) = failpoint {
        cmd.env("HOOKSPOOL_FAILPOINT", f);
    }
    let mut c = cmd.spawn().expect("spawn hookspool");
    c.stdin
        .take()
        .unwrap()
        .write_all(payload.as_bytes())
        .unwrap();
    c.wait_with_output().unwrap()
}

/// Every stored payload, with how many copies of it exist.
fn payload_copies(s: &Store) -> std::collections::BTreeMap<String, usize> {
    let mut out = std::collections::BTreeMap::new();
    for b in s
        .list_batches(&BatchFilter {
            limit: 100_000,
            ..Default::default()
        })
        .unwrap()
    {
        for e in s.events(b.id, true).unwrap() {
            *out.entry(e.payload.unwrap_or_default()).or_insert(0) += 1;
        }
    }
    out
}

#[test]
fn enqueue_killed_at_each_failpoint_keeps_every_acknowledged_event_and_no_half_request() {
    let dir = tempfile::tempdir().unwrap();
    enqueue_killed_on(dir.path(), &super::TestSpool::sqlite());
}

/// The same with `hookspool enqueue` on a PostgreSQL spool.
#[test]
fn enqueue_killed_at_each_failpoint_keeps_every_acknowledged_event_and_no_half_request_on_postgres()
{
    let dir = tempfile::tempdir().unwrap();
    let pg = tempfile::tempdir().unwrap();
    let Some(spool) = super::TestSpool::postgres(pg.path()) else {
        return;
    };
    enqueue_killed_on(dir.path(), &spool);
}

fn enqueue_killed_on(home: &std::path::Path, spool: &super::TestSpool) {
    std::fs::write(
        home.join("config.toml"),
        format!("{CONFIG}{}", spool.section),
    )
    .unwrap();
    let mut acknowledged = Vec::new();
    for i in 0..10 {
        let p = format!(r#"{{"ack":{i}}}"#);
        let out = enqueue(home, &p, None);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        acknowledged.push(p);
    }
    let cases = [
        ("enqueue.after_copy", false), // the primary copy is placed, the tee is not yet
        ("enqueue.before_commit", false),
        ("enqueue.after_commit", true), // committed but never acknowledged: may be kept
    ];
    for (fp, may_exist) in cases {
        let p = format!(r#"{{"killed_at":"{fp}"}}"#);
        let out = enqueue(home, &p, Some(fp));
        assert!(
            killed(&out.status),
            "{fp}: {:?} {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(String::from_utf8_lossy(&out.stderr).contains(&format!("FAILPOINT {fp}")));
        let s = spool.open(home);
        let copies = payload_copies(&s);
        let n = copies.get(&p).copied().unwrap_or(0);
        assert!(
            n == 0 || (may_exist && n == 2),
            "{fp}: {n} copies (all or none)"
        );
        assert_eq!(s.check_invariants().unwrap(), Vec::<String>::new(), "{fp}");
    }
    let s = spool.open(home);
    let copies = payload_copies(&s);
    for p in &acknowledged {
        assert_eq!(
            copies.get(p),
            Some(&2),
            "acknowledged {p} is present with its tee copy"
        );
    }
    // The spool still takes writes after every crash.
    assert!(enqueue(home, r#"{"after":1}"#, None).status.success());
}

#[test]
fn seal_killed_before_commit_leaves_every_batch_open() {
    let dir = tempfile::tempdir().unwrap();
    seal_killed_before_commit_leaves_every_batch_open_on(&dir.path().join("spool.db"));
}

/// The same on a PostgreSQL spool.
#[test]
fn seal_killed_before_commit_leaves_every_batch_open_on_postgres() {
    let dir = tempfile::tempdir().unwrap();
    let Some(spool) = super::TestSpool::postgres(dir.path()) else {
        return;
    };
    seal_killed_before_commit_leaves_every_batch_open_on(&spool.spec(dir.path()));
}

fn seal_killed_before_commit_leaves_every_batch_open_on(db: &std::path::Path) {
    let mut s = open_spec(db);
    for i in 0..9 {
        s.enqueue(&request(
            "r",
            &format!("k{}", i % 3),
            r#"{"x":1}"#,
            1.0,
            window(5.0, 60.0, 100, 10_000),
        ))
        .unwrap();
    }
    drop(s);
    let out = child(
        "seal",
        db,
        &json!({"now": 100.0}),
        Some("seal.before_commit"),
    );
    assert!(killed(&out.status), "{:?}", out.status);
    let s = open_spec(db);
    let open_batches = s
        .list_batches(&BatchFilter {
            state: Some("open".into()),
            limit: 100,
            ..Default::default()
        })
        .unwrap();
    assert_eq!(open_batches.len(), 3, "nothing half-sealed");
    assert_eq!(s.check_invariants().unwrap(), Vec::<String>::new());
    drop(s);
    let out = child("seal", db, &json!({"now": 100.0}), None);
    assert!(out.status.success());
    let s = open_spec(db);
    let sealed = s
        .list_batches(&BatchFilter {
            state: Some("sealed".into()),
            limit: 100,
            ..Default::default()
        })
        .unwrap();
    assert_eq!(sealed.len(), 3);
    assert!(sealed.iter().all(|b| b.content_hash.is_some()));
}

#[test]
fn claim_killed_mid_transaction_leaves_no_lease_and_no_attempt() {
    let dir = tempfile::tempdir().unwrap();
    claim_killed_mid_transaction_leaves_no_lease_and_no_attempt_on(&dir.path().join("spool.db"));
}

/// The same on a PostgreSQL spool.
#[test]
fn claim_killed_mid_transaction_leaves_no_lease_and_no_attempt_on_postgres() {
    let dir = tempfile::tempdir().unwrap();
    let Some(spool) = super::TestSpool::postgres(dir.path()) else {
        return;
    };
    claim_killed_mid_transaction_leaves_no_lease_and_no_attempt_on(&spool.spec(dir.path()));
}

fn claim_killed_mid_transaction_leaves_no_lease_and_no_attempt_on(db: &std::path::Path) {
    let mut s = open_spec(db);
    s.enqueue(&request("r", "k", "{}", 1.0, window(0.0, 0.0, 1, 10_000)))
        .unwrap();
    let b = s.candidates(1.0, 1).unwrap()[0].batch_id;
    drop(s);
    for fp in ["claim.after_attempt", "claim.before_commit"] {
        let out = child("claim", db, &json!({"batch": b}), Some(fp));
        assert!(killed(&out.status), "{fp}");
        let s = open_spec(db);
        assert_eq!(s.batch(b).unwrap().state.as_str(), "sealed", "{fp}");
        assert!(
            s.attempts(b).unwrap().is_empty(),
            "{fp}: the attempt row rolled back with the claim"
        );
    }
    let out = child("claim", db, &json!({"batch": b}), None);
    assert!(out.status.success());
    let s = open_spec(db);
    assert_eq!(s.batch(b).unwrap().state.as_str(), "leased");
    assert_eq!(s.attempts(b).unwrap()[0].n, 1);
}

#[test]
fn mark_with_emits_killed_between_emits_and_commit_applies_neither() {
    let dir = tempfile::tempdir().unwrap();
    mark_with_emits_killed_between_emits_and_commit_applies_neither_on(
        &dir.path().join("spool.db"),
    );
}

/// The same on a PostgreSQL spool.
#[test]
fn mark_with_emits_killed_between_emits_and_commit_applies_neither_on_postgres() {
    let dir = tempfile::tempdir().unwrap();
    let Some(spool) = super::TestSpool::postgres(dir.path()) else {
        return;
    };
    mark_with_emits_killed_between_emits_and_commit_applies_neither_on(&spool.spec(dir.path()));
}

fn mark_with_emits_killed_between_emits_and_commit_applies_neither_on(db: &std::path::Path) {
    let mut s = open_spec(db);
    s.enqueue(&request("r", "k", "{}", 1.0, window(0.0, 0.0, 1, 10_000)))
        .unwrap();
    let b = s.candidates(1.0, 1).unwrap()[0].batch_id;
    let c = s
        .claim(
            b,
            "parent:1",
            9e9,
            1.0,
            false,
            hookspool::store::DeliveryId::per_attempt(""),
        )
        .unwrap()
        .unwrap();
    drop(s);
    let args = json!({"batch": b, "attempt": c.attempt_id, "owner": c.lease_owner});
    let out = child("mark_with_emits", db, &args, Some("mark.after_emits"));
    assert!(killed(&out.status));
    let emitted = |s: &Store| {
        s.list_batches(&BatchFilter {
            limit: 100,
            ..Default::default()
        })
        .unwrap()
        .iter()
        .filter(|b| b.route == "emitted")
        .map(|b| b.count)
        .sum::<i64>()
    };
    let s = open_spec(db);
    assert_eq!(
        s.batch(b).unwrap().state.as_str(),
        "leased",
        "the mark did not happen"
    );
    assert_eq!(emitted(&s), 0, "and neither did the emits");
    drop(s);
    let out = child("mark_with_emits", db, &args, None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = open_spec(db);
    assert_eq!(s.batch(b).unwrap().state.as_str(), "delivered");
    assert_eq!(emitted(&s), 2, "both emits committed with the mark");
    assert_eq!(s.check_invariants().unwrap(), Vec::<String>::new());
}
