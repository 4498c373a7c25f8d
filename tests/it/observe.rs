//! Observability against real tools: promtool from Debian's prometheus package checks the
//! metrics text (a test without it says `SKIPPED`, see tests/support/skip.rs; nothing here
//! installs packages), and the journald path is exercised for real: a child process in its own
//! mount namespace finds a journal socket (a datagram socket this test binds) at
//! /run/systemd/journal/socket, so tracing-journald sends to it exactly what it would send
//! to journald, and the test parses the native protocol.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::net::UnixDatagram;
use std::process::{Command, Stdio};
use std::time::Duration;

use super::skip::skip_or_fail;

/// Where Debian's prometheus package puts promtool (.ci/run installs it).
const PROMTOOL: &str = "/usr/bin/promtool";
const UNSHARE: &str = "/usr/bin/unshare";

fn nix_is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// The value of one series (a metric name with its labels, as it is written) in a /metrics
/// page; `None` when no line holds it. The value must follow the series after one space,
/// so `hookspool_intake_connections` never reads `hookspool_intake_connections_max`.
pub fn series(text: &str, series: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// The histogram bounds, as the product's `observe::prom::BUCKETS_S`.
pub use hookspool::observe::prom::BUCKETS_S;

/// `promtool check metrics` over the text; panics with promtool's findings.
pub fn promtool_check(text: &str) {
    if !std::path::Path::new(PROMTOOL).exists() {
        skip_or_fail(&format!(
            "promtool check metrics: {PROMTOOL} is absent (Debian package prometheus)"
        ));
        return;
    }
    let mut child = Command::new(PROMTOOL)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn promtool");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("write metrics");
    let out = child.wait_with_output().expect("promtool");
    assert!(
        out.status.success(),
        "promtool check metrics failed:\n{}{}\n--- text ---\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Parse sd-journal native datagrams: `KEY=value\n` or `KEY\n<u64 le len><bytes>\n`.
fn parse_native(mut b: &[u8]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    while !b.is_empty() {
        let nl = b.iter().position(|c| *c == b'\n').expect("newline");
        let line = &b[..nl];
        if let Some(eq) = line.iter().position(|c| *c == b'=') {
            out.insert(
                String::from_utf8_lossy(&line[..eq]).into_owned(),
                String::from_utf8_lossy(&line[eq + 1..]).into_owned(),
            );
            b = &b[nl + 1..];
        } else {
            let key = String::from_utf8_lossy(line).into_owned();
            let rest = &b[nl + 1..];
            let len = u64::from_le_bytes(rest[..8].try_into().expect("len")) as usize;
            let value = String::from_utf8_lossy(&rest[8..8 + len]).into_owned();
            out.insert(key, value);
            b = &rest[8 + len + 1..];
        }
    }
    out
}

#[test]
#[ignore = "entry point for the journald child process spawned by journald_records_carry_the_fields"]
fn journald_child() {
    if std::env::var_os("HOOKSPOOL_TEST_JOURNALD_CHILD").is_none() {
        return;
    }
    let sink = hookspool::observe::logging::init("dispatch");
    assert_eq!(sink, hookspool::observe::logging::Sink::Journald);
    tracing::info!(
        source = "github",
        route = "github-ci",
        batch = 12_i64,
        event = 40_i64,
        destination = "hermes:github-ci",
        attempt = 2_i64,
        status = 200_i64,
        bytes = 1234_i64,
        duration_ms = 15_i64,
        reason = "ok",
        tee = false,
        "delivered"
    );
    tracing::warn!(batch = 13_i64, "attempt failed");
}

#[test]
fn journald_records_carry_the_fields() {
    if !std::path::Path::new(UNSHARE).exists() {
        skip_or_fail(&format!(
            "journald test: {UNSHARE} is absent (Debian package util-linux)"
        ));
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let sock = UnixDatagram::bind(dir.path().join("socket")).expect("bind");
    sock.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let exe = std::env::current_exe().expect("exe");
    let script = format!(
        "mount -t tmpfs none /run && mkdir -p /run/systemd/journal && mount --bind '{}' /run/systemd/journal && exec '{}' --ignored --exact observe::journald_child --nocapture --test-threads=1",
        dir.path().display(),
        exe.display()
    );
    // A private mount namespace: root makes one directly; anyone else inside a user
    // namespace where they are root (where the kernel allows unprivileged ones).
    let mut args = vec!["--mount", "--propagation", "private"];
    if !nix_is_root() {
        args.splice(0..0, ["--user", "--map-root-user"]);
    }
    let out = Command::new(UNSHARE)
        .args(&args)
        .args(["sh", "-c", &script])
        .env("HOOKSPOOL_TEST_JOURNALD_CHILD", "1")
        .env_remove("JOURNAL_STREAM")
        .output()
        .expect("spawn child");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let refused = stderr
        .lines()
        .any(|l| l.starts_with("unshare:") || l.starts_with("mount:"));
    if !out.status.success() && refused {
        skip_or_fail(&format!(
            "journald test: no private mount namespace here ({})",
            stderr.trim()
        ));
        return;
    }
    assert!(
        out.status.success(),
        "child failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let mut records = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    while records.len() < 2 {
        let n = sock.recv(&mut buf).expect("a journal datagram");
        if n > 0 {
            records.push(parse_native(&buf[..n]));
        }
    }
    let a = &records[0];
    for (k, v) in [
        ("MESSAGE", "delivered"),
        ("PRIORITY", "6"),
        ("SYSLOG_IDENTIFIER", "hookspool"),
        ("COMPONENT", "dispatch"),
        ("SOURCE", "github"),
        ("ROUTE", "github-ci"),
        ("BATCH", "12"),
        ("EVENT", "40"),
        ("DESTINATION", "hermes:github-ci"),
        ("ATTEMPT", "2"),
        ("STATUS", "200"),
        ("BYTES", "1234"),
        ("DURATION_MS", "15"),
        ("REASON", "ok"),
        ("TEE", "false"),
    ] {
        assert_eq!(a.get(k).map(String::as_str), Some(v), "{k} in {a:?}");
    }
    assert!(
        !a.keys().any(|k| k.starts_with("F_")),
        "no field prefix: {a:?}"
    );
    let b = &records[1];
    assert_eq!(b.get("PRIORITY").map(String::as_str), Some("4"));
    assert_eq!(b.get("BATCH").map(String::as_str), Some("13"));
    assert!(b.get("SOURCE").is_none(), "only fields present: {b:?}");
}
