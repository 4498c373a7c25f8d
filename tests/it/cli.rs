//! The CLI on a real spool: enqueue, list, show and migrate through the built binary.

use std::io::Write;
use std::process::{Command, Stdio};

use super::bin;

fn hs(home: &std::path::Path, args: &[&str], stdin: &str) -> std::process::Output {
    let mut c = Command::new(bin())
        .arg("--home")
        .arg(home)
        .args(args)
        .env_remove("HOOKSPOOL_CONFIG")
        .env_remove("HOOKSPOOL_HOME")
        .env_remove("HOOKSPOOL_FAILPOINT")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    c.wait_with_output().unwrap()
}

#[test]
fn enqueue_list_show_round_trip_with_json_and_exit_codes() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let out = hs(
        &home,
        &[
            "--json",
            "enqueue",
            "--source",
            "sweep",
            "--key",
            "k",
            "--destination",
            "http:x",
            "--dedup-id",
            "d1",
        ],
        r#"{"a":1}"#,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["status"], "queued");
    let batch = v["copies"][0]["batch"].as_i64().unwrap();
    let out = hs(
        &home,
        &[
            "--json",
            "enqueue",
            "--source",
            "sweep",
            "--key",
            "k",
            "--destination",
            "http:x",
            "--dedup-id",
            "d1",
        ],
        r#"{"a":1}"#,
    );
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["status"],
        "duplicate"
    );
    let out = hs(&home, &["--json", "list"], "");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v[0]["id"].as_i64(), Some(batch));
    assert_eq!(v[0]["count"], 1);
    let out = hs(
        &home,
        &["--json", "show", &batch.to_string(), "--events"],
        "",
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["events"][0]["dedup_id"], "d1");
    assert!(
        v["events"][0].get("payload").is_none(),
        "no payload unless asked"
    );
    let out = hs(&home, &["show", "999"], "");
    assert_eq!(out.status.code(), Some(1), "not found is exit 1");
    let out = hs(&home, &["enqueue", "--source", "nope", "--key", "k"], "{}");
    assert_eq!(
        out.status.code(),
        Some(2),
        "unconfigured source is a config error"
    );
    let out = hs(
        &home,
        &[
            "enqueue",
            "--source",
            "s",
            "--key",
            "k",
            "--destination",
            "d",
        ],
        "[1,2]",
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("must be a JSON object"));
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&home).unwrap().permissions().mode() & 0o777,
        0o700
    );
    assert_eq!(
        std::fs::metadata(home.join("spool.db"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o600
    );
}

#[test]
fn migrate_is_refused_while_dispatch_lock_is_held_and_old_schemas_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();
    let out = hs(home, &["migrate", "--dry-run"], "");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(home.join("dispatch.lock"))
        .unwrap();
    lock.lock().unwrap();
    let out = hs(home, &["migrate"], "");
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop(lock);
    // An older schema: readers exit 2 and say to migrate; migrate fixes it.
    {
        let db = home.join("spool.db");
        let _ = std::fs::remove_file(&db);
        let mut s =
            hookspool::store::Store::open_unmigrated(&db, std::time::Duration::from_secs(5))
                .unwrap();
        s.migrate_to(1).unwrap();
    }
    let out = hs(home, &["list"], "");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("hookspool migrate"));
    let out = hs(home, &["migrate"], "");
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("applied 0002 0002_unwrap"));
    assert!(hs(home, &["list"], "").status.success());
}

#[test]
fn sandbox_selftest_passes_every_probe_on_this_host() {
    let dir = tempfile::tempdir().unwrap();
    let out = hs(dir.path(), &["check", "--sandbox-selftest"], "");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("11 passed, 0 failed"), "{text}");
    assert!(text.contains("PASS reading the database fails"), "{text}");
    assert!(!dir.path().join("selftest-intruder").exists());
}
