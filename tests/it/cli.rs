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

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A template source whose events go to `action`, with its secret in the home.
fn source_config(home: &std::path::Path, action: &str) -> String {
    std::fs::write(home.join("s.secret"), "s3cret").unwrap();
    format!(
        "[sources.s]\nscheme = \"hmac-sha256-hex\"\nheader = \"X-Signature\"\nprefix = \"sha256=\"\nkey = \"payload.k\"\nsecrets.secret = {{ file = \"{}/s.secret\" }}\n{action}",
        home.display()
    )
}

#[test]
fn read_only_commands_work_with_a_broken_config_and_say_so_without_quoting_it() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let out = hs(
        &home,
        &[
            "enqueue",
            "--source",
            "sweep",
            "--key",
            "k",
            "--destination",
            "http:x",
        ],
        "{}",
    );
    assert!(out.status.success(), "{}", stderr(&out));
    // A syntax error on a line that holds a token.
    std::fs::write(
        home.join("config.toml"),
        "[dispatch]\npoll_s = 1\n\n[destinations.d]\ntoken = [\"SENTINEL-TOKEN-42\"\n",
    )
    .unwrap();
    for args in [&["status"][..], &["list"], &["show", "1"], &["issues"]] {
        let out = hs(&home, args, "");
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(err.contains("without that config"), "{args:?}: {err}");
        assert!(
            err.contains("destinations.d.token: line 5, column"),
            "{err}"
        );
        assert!(!err.contains("SENTINEL-TOKEN-42"), "{err}");
    }
    let out = hs(&home, &["--json", "list"], "");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v[0]["destination"], "http:x",
        "the spool is read all the same"
    );
    // check and the services still refuse it.
    let out = hs(&home, &["check"], "");
    assert_eq!(out.status.code(), Some(2));
    assert!(!String::from_utf8_lossy(&out.stdout).contains("SENTINEL-TOKEN-42"));
}

#[test]
fn unknown_keys_in_sources_and_destinations_are_warnings_at_runtime_and_errors_in_check() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let text = format!(
        "{}\n[destinations.d]\ntype = \"http\"\nurl = \"https://d.invalid/\"\nsecret = {{ file = \"/nonexistent\" }}\ntimeout = 3\n",
        source_config(&home, "action = \"d\"\nkeep_header = [\"X-A\"]\n")
    );
    std::fs::write(home.join("config.toml"), text).unwrap();
    assert!(hs(&home, &["migrate"], "").status.success());
    let out = hs(&home, &["list"], "");
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("warning: destinations.\"d\".timeout: not a key"),
        "{err}"
    );
    assert!(
        err.contains("warning: sources.s.keep_header: not a key"),
        "{err}"
    );
    assert!(
        !err.contains("without that config"),
        "the config is in use: {err}"
    );
    let out = hs(&home, &["check"], "");
    assert_eq!(out.status.code(), Some(2));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("error: ") && text.contains("destinations.\"d\".timeout"),
        "{text}"
    );
    // The dispatcher starts on it.
    let mut d = std::process::Command::new(super::bin())
        .arg("--home")
        .arg(&home)
        .arg("dispatch")
        .env_remove("HOOKSPOOL_CONFIG")
        .env_remove("HOOKSPOOL_HOME")
        .env_remove("NOTIFY_SOCKET")
        .env_remove("JOURNAL_STREAM")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let log = super::capture_stderr(&mut d);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !String::from_utf8_lossy(&log.lock().unwrap()).contains("dispatcher ready") {
        assert!(
            d.try_wait().unwrap().is_none(),
            "dispatch exited: {}",
            String::from_utf8_lossy(&log.lock().unwrap())
        );
        assert!(std::time::Instant::now() < deadline);
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(d.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(d.wait().unwrap().success());
}

#[test]
fn exit_codes_usage_2_busy_port_3_and_json_refused_where_it_means_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let out = hs(&home, &["list", "--no-such-flag"], "");
    assert_eq!(out.status.code(), Some(2), "clap's usage error");
    let out = hs(&home, &["list", "--since", "whenever"], "");
    assert_eq!(
        out.status.code(),
        Some(2),
        "our usage error: {}",
        stderr(&out)
    );
    assert_eq!(hs(&home, &["--help"], "").status.code(), Some(0));
    // Port 0, so a build that took --json for a service could never bind a real port.
    std::fs::write(
        home.join("config.toml"),
        "[intake]\nlisten = \"127.0.0.1:0\"\n",
    )
    .unwrap();
    for args in [
        &["--json", "intake"][..],
        &["--json", "dispatch"],
        &["--json", "run"],
    ] {
        // A build that took --json here would start serving: bounded, then killed.
        let mut c = std::process::Command::new(super::bin())
            .arg("--home")
            .arg(&home)
            .args(args)
            .env_remove("NOTIFY_SOCKET")
            .env_remove("JOURNAL_STREAM")
            .env_remove("LISTEN_FDS")
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while c.try_wait().unwrap().is_none() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let _ = c.kill();
        let out = c.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?} must be refused");
        assert!(
            stderr(&out).contains("HOOKSPOOL_LOG=json"),
            "{}",
            stderr(&out)
        );
    }
    let out = hs(&home, &["--json", "export"], "");
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("export always writes JSON lines"));
    // A second intake on a port that is taken: "already running", 3.
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = held.local_addr().unwrap().port();
    std::fs::write(
        home.join("config.toml"),
        format!("[intake]\nlisten = \"127.0.0.1:{port}\"\n"),
    )
    .unwrap();
    let out = std::process::Command::new(super::bin())
        .arg("--home")
        .arg(&home)
        .arg("intake")
        .env_remove("LISTEN_FDS")
        .env_remove("NOTIFY_SOCKET")
        .env_remove("JOURNAL_STREAM")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("cannot listen on"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn source_test_exits_non_zero_without_a_destination_and_takes_at() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    // Standard Webhooks: timestamped, so a capture verifies only at its own time.
    let key = [7u8; 24];
    use base64::Engine as _;
    let whsec = format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode(key)
    );
    std::fs::write(home.join("sw.secret"), &whsec).unwrap();
    let body = r#"{"type":"invoice.paid","id":"evt_1"}"#;
    let (id, ts) = ("msg_1", 1_700_000_000i64);
    use hmac::{KeyInit, Mac};
    let mut m = hmac::Hmac::<sha2::Sha256>::new_from_slice(&key).unwrap();
    m.update(format!("{id}.{ts}.{body}").as_bytes());
    let sig = base64::engine::general_purpose::STANDARD.encode(m.finalize().into_bytes());
    std::fs::write(
        home.join("cap.http"),
        format!("POST /hooks/sw HTTP/1.1\nwebhook-id: {id}\nwebhook-timestamp: {ts}\nwebhook-signature: v1,{sig}\n\n{body}"),
    )
    .unwrap();
    let cfg = |extra: &str| {
        format!(
            "[sources.sw]\ntype = \"standard-webhooks\"\nsecrets.secret = {{ file = \"{}/sw.secret\" }}\n{extra}",
            home.display()
        )
    };
    let cap = home.join("cap.http").display().to_string();
    std::fs::write(home.join("config.toml"), cfg("")).unwrap();
    let now = hs(&home, &["source", "test", "sw", "--request", &cap], "");
    assert_eq!(now.status.code(), Some(1), "stale today");
    assert!(String::from_utf8_lossy(&now.stdout).contains("not verified"));
    let at = hs(
        &home,
        &[
            "source",
            "test",
            "sw",
            "--request",
            &cap,
            "--at",
            "1700000010",
        ],
        "",
    );
    assert!(at.status.success(), "{}", stderr(&at));
    let text = String::from_utf8_lossy(&at.stdout);
    assert!(
        text.contains("route       sw -> hermes:standard-webhooks"),
        "{text}"
    );
    assert!(
        text.contains("answer 200 {\"status\":\"queued\"}"),
        "{text}"
    );
    // A template source with no action and no route: accepted, but the intake would
    // quarantine it for want of a destination.
    std::fs::write(home.join("config.toml"), source_config(&home, "")).unwrap();
    std::fs::write(home.join("t.http"), {
        let b = r#"{"k":"a"}"#;
        let mut m = hmac::Hmac::<sha2::Sha256>::new_from_slice(b"s3cret").unwrap();
        m.update(b.as_bytes());
        format!(
            "POST /hooks/s HTTP/1.1\nX-Signature: sha256={}\n\n{b}",
            hex::encode(m.finalize().into_bytes())
        )
    })
    .unwrap();
    let out = hs(
        &home,
        &[
            "source",
            "test",
            "s",
            "--request",
            &home.join("t.http").display().to_string(),
        ],
        "",
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("answer 202 {\"status\":\"quarantined\"}"),
        "{text}"
    );
    assert!(
        stderr(&out).contains("quarantined: no destination"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn run_refuses_to_start_on_a_config_that_check_rejects() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    // A destination URL with credentials in it: check's error, and the services' too.
    std::fs::write(
        home.join("config.toml"),
        format!(
            "[intake]\nlisten = \"127.0.0.1:0\"\n{}\n[destinations.d]\ntype = \"http\"\nurl = \"https://user:pw@d.invalid/\"\nsecret = {{ file = \"/nonexistent\" }}\n",
            source_config(&home, "action = \"d\"\n")
        ),
    )
    .unwrap();
    let check = hs(&home, &["check"], "");
    assert_eq!(check.status.code(), Some(2));
    let mut c = std::process::Command::new(super::bin())
        .arg("--home")
        .arg(&home)
        .arg("run")
        .env_remove("NOTIFY_SOCKET")
        .env_remove("JOURNAL_STREAM")
        .env_remove("LISTEN_FDS")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while c.try_wait().unwrap().is_none() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let _ = c.kill();
    let out = c.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("destinations.\"d\": url carries credentials"),
        "{}",
        stderr(&out)
    );
}

/// Issue 34: `source test --at` on a template source whose only description of the sender is
/// the recipe table in tests/vectors/standard-webhooks/recipe.toml, with the Standard
/// Webhooks reference libraries' SW-A vector (tests/vectors/standard-webhooks/SW-A.http):
/// verified at its own time and at the edge of its 300 s window, not verified one second
/// outside it either way, nor with one byte of the body changed.
#[test]
fn source_test_at_verifies_a_published_vector_through_a_recipe_table() {
    let root = env!("CARGO_MANIFEST_DIR");
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(
        home.join("sw.secret"),
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
    )
    .unwrap();
    let recipe = std::fs::read_to_string(format!(
        "{root}/tests/vectors/standard-webhooks/recipe.toml"
    ))
    .unwrap()
    // The file's own `[recipe]` table is this source's.
    .replace("[recipe]", "[sources.sw.recipe]");
    assert!(recipe.contains("[sources.sw.recipe]"));
    std::fs::write(
        home.join("config.toml"),
        format!(
            "[sources.sw]\ntype = \"template\"\nsecrets.secret = {{ file = \"{}/sw.secret\" }}\n{recipe}",
            home.display()
        ),
    )
    .unwrap();
    let capture =
        std::fs::read_to_string(format!("{root}/tests/vectors/standard-webhooks/SW-A.http"))
            .unwrap();
    std::fs::write(home.join("good.http"), &capture).unwrap();
    assert!(capture.ends_with("2432232314}"));
    std::fs::write(
        home.join("tampered.http"),
        capture.replace("2432232314}", "2432232315}"),
    )
    .unwrap();
    let verified = |file: &str, at: &str| {
        let cap = home.join(file).display().to_string();
        let out = hs(
            &home,
            &["source", "test", "sw", "--request", &cap, "--at", at],
            "",
        );
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        // No destination is configured, so even a verified request exits 1 (quarantined).
        assert_eq!(out.status.code(), Some(1), "{text}{}", stderr(&out));
        let ok = text.contains("  signature   verified\n");
        assert!(
            ok || text.contains("  signature   not verified"),
            "{text}{}",
            stderr(&out)
        );
        ok
    };
    for at in ["1614265330", "1614265030", "1614265630"] {
        assert!(verified("good.http", at), "at {at}");
    }
    for at in ["1614265029", "1614265631"] {
        assert!(!verified("good.http", at), "at {at}");
    }
    assert!(!verified("tampered.http", "1614265330"));
    // Outside the window, source test names the timestamp and the --at to try.
    let cap = home.join("good.http").display().to_string();
    let out = hs(&home, &["source", "test", "sw", "--request", &cap], "");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("  recipe      the timestamp 1614265330 is outside 300 s of now: to check a capture, try --at 1614265330"),
        "{text}"
    );
}
