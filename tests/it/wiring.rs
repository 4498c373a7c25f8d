//! Issue 11's wiring, through the real binary: what `hookspool dispatch` and `hookspool run`
//! do at start and while they run, read back with the CLI (`status`, `issues`) and the
//! intake's /healthz. The sandbox probe and its `sandbox.required` refusal, config:file
//! from a broken reload, real per-destination in-flight numbers, a database held busy
//! while a result waits to be recorded, and the issue an operator pause opens.

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::daemon::{Daemon, Spec};
use super::receiver::{Answer, Receiver};
use super::run_e2e::{RunProc, free_port};
use super::{bin, open, wait_until};

/// The simulated degraded kernel (the probe's test seam, compiled in with `failpoints`).
const DEGRADE: (&str, &str) = ("HOOKSPOOL_TEST_SANDBOX_DEGRADE", "landlock,seccomp");

fn hs(home: &Path) -> Command {
    let mut c = Command::new(bin());
    c.arg("--home")
        .arg(home)
        .env_remove("HOOKSPOOL_CONFIG")
        .env_remove("HOOKSPOOL_HOME")
        .env_remove("HOOKSPOOL_FAILPOINT")
        .env_remove("HOOKSPOOL_TEST_SANDBOX_DEGRADE")
        .env_remove("HOOKSPOOL_TEST_BUSY_TIMEOUT_MS")
        .env_remove("HOOKSPOOL_LOG")
        .env_remove("NOTIFY_SOCKET")
        .env_remove("WATCHDOG_USEC")
        .env_remove("LISTEN_FDS")
        .env_remove("LISTEN_PID");
    c
}

/// A CLI command's JSON output (it must succeed).
fn json(home: &Path, extra: &[&str], args: &[&str]) -> Value {
    let out = hs(home)
        .args(extra)
        .arg("--json")
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "hookspool {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

fn issue<'a>(issues: &'a Value, fingerprint: &str) -> Option<&'a Value> {
    issues
        .as_array()?
        .iter()
        .find(|i| i["fingerprint"] == fingerprint)
}

/// `hookspool dispatch` on the [`Daemon`] wrapper.
struct Dispatcher(Daemon);

impl std::ops::Deref for Dispatcher {
    type Target = Daemon;
    fn deref(&self) -> &Daemon {
        &self.0
    }
}

impl std::ops::DerefMut for Dispatcher {
    fn deref_mut(&mut self) -> &mut Daemon {
        &mut self.0
    }
}

impl Dispatcher {
    fn start(home: &Path, env: &[(&str, &str)]) -> Dispatcher {
        let mut spec = Spec::new(home, &["dispatch"]);
        for (k, v) in env {
            spec = spec.env(k, v);
        }
        Dispatcher(Daemon::start(spec))
    }

    fn wait_ready(&mut self) {
        self.0.wait_log("dispatcher ready", Duration::from_secs(30));
    }

    fn stop(self) -> std::process::ExitStatus {
        self.0.stop()
    }
}

fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    let p = dir.join(name);
    super::executable(&p, &format!("#!/bin/sh\n{body}"));
    p
}

/// `h`'s config: the template source `s` sends every event to the script destination
/// `script:<name>`, which runs `program` with its state in `h/state`; `dispatch` holds the
/// `[dispatch]` table's keys.
fn script_config(h: &Path, name: &str, program: &Path, dispatch: &str) {
    std::fs::write(
        h.join("config.toml"),
        format!(
            r#"
[dispatch]
{dispatch}
[sources.s]
type = "template"
scheme = "hmac-sha256-hex"
header = "X-Signature"
key = "payload.k"
action = "script:{name}"
[destinations."script:{name}"]
argv = ["{}"]
state_dir = "{}/state"
timeout_s = 30
"#,
            program.display(),
            h.display()
        ),
    )
    .unwrap();
}

fn enqueue(home: &Path, key: &str, payload: &str) {
    let mut c = hs(home)
        .args(["enqueue", "--source", "s", "--key", key])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    c.stdin
        .take()
        .unwrap()
        .write_all(payload.as_bytes())
        .unwrap();
    assert!(c.wait().unwrap().success());
}

/// The sandbox part of a config: one script destination (outside the home, which the
/// sandbox denies scripts), `required` as given.
fn sandbox_config(home: &Path, scripts: &Path, required: bool) -> String {
    let noop = script(scripts, "noop.sh", "cat >/dev/null\n");
    std::fs::write(home.join("source.secret"), "wiring-source-secret").unwrap();
    format!(
        r#"
[dispatch]
poll_s = 0.05
heartbeat_s = 0.2
[sources.s]
type = "template"
scheme = "hmac-sha256-hex"
header = "X-Signature"
prefix = "sha256="
key = "payload.topic"
action = "script:noop"
secrets.secret = {{ file = "{}/source.secret" }}
[destinations."script:noop"]
argv = ["{}"]
[destinations."script:noop".sandbox]
required = {required}
"#,
        home.display(),
        noop.display()
    )
}

#[test]
fn the_dispatcher_probes_the_sandbox_at_start_and_a_degraded_kernel_shows_in_status_and_issues() {
    let home = tempfile::tempdir().unwrap();
    let scripts = tempfile::tempdir().unwrap();
    let h = home.path();
    std::fs::write(
        h.join("config.toml"),
        sandbox_config(h, scripts.path(), false),
    )
    .unwrap();

    let mut d = Dispatcher::start(h, &[DEGRADE]);
    d.wait_ready();
    let status = json(h, &[], &["status"]);
    assert_eq!(status["sandbox"]["complete"], false, "{status}");
    let enforced = status["sandbox"]["enforced"].as_str().unwrap();
    assert!(
        enforced.contains("no landlock") && enforced.contains("no seccomp"),
        "{enforced}"
    );
    assert!(
        status["degraded"].to_string().contains("sandbox_degraded"),
        "{status}"
    );
    let issues = json(h, &[], &["issues"]);
    let i = issue(&issues, "config:sandbox").expect("config:sandbox opened");
    assert_eq!(i["state"], "open");
    assert!(
        d.log().contains("script sandbox degraded"),
        "logged once at start:\n{}",
        d.log()
    );
    assert!(d.stop().success());

    // `hookspool run` probes too: on this kernel's real sandbox the issue resolves.
    let port = free_port();
    let mut cfg = sandbox_config(h, scripts.path(), false);
    cfg.push_str(&format!(
        "[intake]\nlisten = \"127.0.0.1:{port}\"\n[limits]\nmin_free_bytes = 0\n"
    ));
    std::fs::write(h.join("config.toml"), cfg).unwrap();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut run = RunProc::start(h, addr, &[]);
    wait_until("the probe's record", Duration::from_secs(20), || {
        json(h, &[], &["status"])["sandbox"]["complete"] != false
    });
    let status = json(h, &[], &["status"]);
    if status["sandbox"]["complete"] != true {
        super::skip::skip_or_fail(&format!(
            "this kernel does not enforce landlock and seccomp ({}); the resolve half needs it",
            status["sandbox"]["enforced"]
        ));
        assert!(
            std::env::var("HOOKSPOOL_NO_SKIP").is_err(),
            "HOOKSPOOL_NO_SKIP is set"
        );
        return;
    }
    assert!(
        !status["degraded"].to_string().contains("sandbox"),
        "{status}"
    );
    let issues = json(h, &[], &["issues", "--all"]);
    assert_eq!(
        issue(&issues, "config:sandbox").unwrap()["state"],
        "resolved"
    );
    run.sigterm();
    assert!(run.wait_exit(Duration::from_secs(30)).success());
}

#[test]
fn sandbox_required_refuses_to_start_dispatch_and_run_on_a_degraded_kernel() {
    let home = tempfile::tempdir().unwrap();
    let scripts = tempfile::tempdir().unwrap();
    let h = home.path();
    let port = free_port();
    let mut cfg = sandbox_config(h, scripts.path(), true);
    cfg.push_str(&format!(
        "[intake]\nlisten = \"127.0.0.1:{port}\"\n[limits]\nmin_free_bytes = 0\n"
    ));
    std::fs::write(h.join("config.toml"), cfg).unwrap();
    for cmd in ["dispatch", "run"] {
        let out: Output = hs(h)
            .arg(cmd)
            .env(DEGRADE.0, DEGRADE.1)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{cmd}: {err}");
        assert!(
            err.contains("script:noop") && err.contains("sandbox.required"),
            "{cmd} names the destination and the key: {err}"
        );
    }
    // Not degraded: the same config starts.
    let mut d = Dispatcher::start(h, &[]);
    d.wait_ready();
    assert!(d.stop().success());
}

/// A template source signed like run_e2e's, and an http destination at `url`.
pub(super) fn run_config(home: &Path, port: u16, url: &str, dest_extra: &str) -> String {
    std::fs::write(home.join("source.secret"), "wiring-source-secret").unwrap();
    std::fs::write(home.join("dest.secret"), "wiring-destination-secret").unwrap();
    format!(
        r#"
[intake]
listen = "127.0.0.1:{port}"
[limits]
min_free_bytes = 0
[dispatch]
poll_s = 0.05
heartbeat_s = 0.2
parallel = 4
[alerts]
dry = true
[sources.s]
type = "template"
scheme = "hmac-sha256-hex"
header = "X-Signature"
prefix = "sha256="
key = "payload.topic"
quiet_s = 0
max_s = 0
action = "http-recv"
secrets.secret = {{ file = "{home}/source.secret" }}
[destinations.http-recv]
type = "http"
url = "{url}"
allow_insecure = true
allow_private = ["127.0.0.1/32"]
timeout_s = 20
secret = {{ file = "{home}/dest.secret" }}
{dest_extra}
"#,
        home = home.display()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_config_under_run_opens_config_file_alerts_once_and_a_good_reload_resolves_it() {
    let rx = Receiver::start().await;
    let home = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let h = home.path().to_path_buf();
    let port = free_port();
    let good = run_config(&h, port, &rx.url(), "");
    std::fs::write(h.join("config.toml"), &good).unwrap();
    // The CLI reads the issues through a copy of the good config while the home's is broken.
    let copy = elsewhere.path().join("good.toml");
    std::fs::write(&copy, &good).unwrap();
    let with_copy = ["--config", copy.to_str().unwrap()];
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut run = RunProc::start(&h, addr, &[]);

    std::fs::write(h.join("config.toml"), "[dispatch]\nparallel = 0\n").unwrap();
    // Both halves see the save (sys::watch): both record the failure in the one
    // config:file issue, which alerts once.
    let mut last = Value::Null;
    wait_until(
        "config:file opened by both halves",
        Duration::from_secs(30),
        || {
            let issues = json(&h, &with_copy, &["issues"]);
            last = issue(&issues, "config:file")
                .cloned()
                .unwrap_or(Value::Null);
            last["state"] == "open"
                && last["count"].as_i64() >= Some(2)
                && !last["alerted_at"].is_null()
        },
    );
    let text = last["last_error"].as_str().unwrap();
    assert!(text.contains("dispatch.parallel"), "names the key: {text}");
    let alerts = |h: &Path| -> usize {
        open(&h.join("spool.db"))
            .dry_alerts()
            .unwrap()
            .iter()
            .filter(|(_, _, t)| t.contains("config:file"))
            .count()
    };
    assert_eq!(alerts(&h), 1, "one alert for the opening");
    assert!(
        run.log().contains("config reload failed"),
        "logged:\n{}",
        run.log()
    );

    std::fs::write(h.join("config.toml"), &good).unwrap();
    wait_until("config:file resolved", Duration::from_secs(30), || {
        let issues = json(&h, &[], &["issues", "--all"]);
        issue(&issues, "config:file").is_some_and(|i| i["state"] == "resolved")
    });
    assert_eq!(alerts(&h), 1, "a resolve sends nothing");
    run.sigterm();
    assert!(run.wait_exit(Duration::from_secs(30)).success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_and_healthz_show_the_dispatchers_real_inflight_numbers() {
    let rx = Receiver::start().await;
    // Every delivery is held for 4 s: two at a time are in flight (max_inflight = 2).
    rx.set_default(Answer::status(200).delay(Duration::from_secs(4)));
    let home = tempfile::tempdir().unwrap();
    let h = home.path().to_path_buf();
    let port = free_port();
    std::fs::write(
        h.join("config.toml"),
        run_config(&h, port, &rx.url(), "max_inflight = 2"),
    )
    .unwrap();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut run = RunProc::start(&h, addr, &[]);
    for topic in ["a", "b", "c"] {
        let body = format!(r#"{{"topic":"{topic}"}}"#);
        let r = run.post("s", b"wiring-source-secret", body.as_bytes(), &[]);
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    }
    let inflight = |doc: &Value| doc["destinations"]["http-recv"]["inflight"].as_i64();
    wait_until("status shows 2 in flight", Duration::from_secs(20), || {
        inflight(&json(&h, &[], &["status"])) == Some(2)
    });
    let hz = super::intake::get(addr, "/healthz");
    let doc: Value = serde_json::from_slice(&hz.body).unwrap();
    assert_eq!(inflight(&doc), Some(2), "/healthz: {doc}");
    // All three delivered: nothing in flight.
    wait_until("all delivered", Duration::from_secs(30), || {
        rx.requests().len() == 3 && inflight(&json(&h, &[], &["status"])) == Some(0)
    });
    run.sigterm();
    assert!(run.wait_exit(Duration::from_secs(30)).success());
}

#[test]
fn a_database_held_busy_while_a_result_waits_never_stops_the_dispatcher_nor_drops_the_result() {
    let home = tempfile::tempdir().unwrap();
    let scripts = tempfile::tempdir().unwrap();
    let h = home.path();
    // The script signals that it runs, then finishes while the test holds the write lock.
    let slow = script(
        scripts.path(),
        "slow.sh",
        "cat >/dev/null\necho run >> \"$HOOKSPOOL_STATE_DIR/runs\"\nsleep 1\n",
    );
    script_config(h, "slow", &slow, "poll_s = 0.05\nheartbeat_s = 0.2");
    enqueue(h, "k", r#"{"n":1}"#);
    // Recording gives up on the lock after 200 ms instead of 30 s (failpoints only). The
    // watchdog pings go to a socket of the test's.
    let watchdog = super::fulldisk::Watchdog::bind();
    let notify = watchdog.path().display().to_string();
    let mut d = Dispatcher::start(
        h,
        &[
            ("HOOKSPOOL_TEST_BUSY_TIMEOUT_MS", "200"),
            ("NOTIFY_SOCKET", &notify),
        ],
    );
    d.wait_ready();
    let runs = h.join("state/runs");
    wait_until("the script runs", Duration::from_secs(20), || runs.exists());
    // Another process holds the write lock for 3 s, past the script's exit.
    let conn = rusqlite::Connection::open(h.join("spool.db")).unwrap();
    conn.busy_timeout(Duration::from_secs(10)).unwrap();
    conn.execute_batch("BEGIN IMMEDIATE").unwrap();
    let held_at = Instant::now();
    std::thread::sleep(Duration::from_secs(3));
    let during = open(&h.join("spool.db")).batch(1).unwrap();
    conn.execute_batch("COMMIT").unwrap();
    let released_at = Instant::now();
    drop(conn);
    // Pings are a health proof: none while the result waits on the busy spool (the script
    // ends 1 s into the hold), and they come back once the spool takes it.
    assert_eq!(
        watchdog.pings_between(held_at + Duration::from_millis(1600), released_at),
        0,
        "the watchdog was fed while no progress was possible:\n{}",
        d.log()
    );
    wait_until("the watchdog fed again", Duration::from_secs(10), || {
        watchdog.pings_between(released_at, Instant::now()) > 0
    });
    assert_eq!(during.state.as_str(), "leased", "not recorded while held");
    assert!(
        d.child.try_wait().unwrap().is_none(),
        "the dispatcher kept running:\n{}",
        d.log()
    );
    wait_until("the result recorded", Duration::from_secs(20), || {
        open(&h.join("spool.db")).batch(1).unwrap().state.as_str() == "delivered"
    });
    let s = open(&h.join("spool.db"));
    let attempts = s.attempts(1).unwrap();
    assert_eq!(
        attempts.len(),
        1,
        "delivered by the first attempt: {attempts:?}"
    );
    assert_eq!(attempts[0].outcome.map(|o| o.as_str()), Some("ok"));
    assert_eq!(
        std::fs::read_to_string(&runs).unwrap().lines().count(),
        1,
        "the script ran once: the result was kept, not redelivered"
    );
    let log = d.log();
    assert!(
        log.contains("recording results deferred") && log.contains("database is busy"),
        "logged and counted:\n{log}"
    );
    // Counted in the published heartbeat, which `status` shows.
    wait_until("busy_retries in status", Duration::from_secs(10), || {
        json(h, &[], &["status"])["dispatcher"]["busy_retries"]
            .as_u64()
            .is_some_and(|n| n > 0)
    });
    assert!(d.stop().success());
}

/// The results a tick records are in the tick's transaction with its claims: when its
/// commit is refused, they are kept in memory and recorded by a later tick, never lost to a
/// lease expiry (which would run the script again).
#[test]
fn a_refused_tick_commit_keeps_its_results_for_the_next_tick() {
    let home = tempfile::tempdir().unwrap();
    let scripts = tempfile::tempdir().unwrap();
    let h = home.path();
    let once = script(
        scripts.path(),
        "once.sh",
        "cat >/dev/null\necho run >> \"$HOOKSPOOL_STATE_DIR/runs\"\n",
    );
    script_config(h, "once", &once, "poll_s = 0.05");
    enqueue(h, "k", r#"{"n":1}"#);
    let mut d = Dispatcher::start(
        h,
        &[
            ("HOOKSPOOL_FAILPOINT", "tick.commit_busy"),
            ("HOOKSPOOL_FAILPOINT_ACTION", "error"),
        ],
    );
    d.wait_ready();
    wait_until("the result recorded", Duration::from_secs(20), || {
        open(&h.join("spool.db")).batch(1).unwrap().state.as_str() == "delivered"
    });
    let log = d.log();
    assert!(
        log.contains("FAILPOINT tick.commit_busy") && log.contains("recording results deferred"),
        "the first commit with the result was refused:\n{log}"
    );
    let attempts = open(&h.join("spool.db")).attempts(1).unwrap();
    assert_eq!(attempts.len(), 1, "one attempt: {attempts:?}");
    assert_eq!(attempts[0].outcome.map(|o| o.as_str()), Some("ok"));
    let runs = std::fs::read_to_string(h.join("state/runs")).unwrap();
    assert_eq!(runs.lines().count(), 1, "the script ran once");
    assert!(d.stop().success());
}

#[test]
fn hookspool_pause_opens_a_delivery_issue_and_resume_resolves_it() {
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    std::fs::write(h.join("dest.secret"), "s").unwrap();
    std::fs::write(
        h.join("config.toml"),
        format!(
            r#"
[sources.s]
type = "template"
scheme = "hmac-sha256-hex"
header = "X-Signature"
key = "payload.k"
action = "http:x"
[destinations."http:x"]
type = "http"
url = "http://127.0.0.1:9/"
allow_insecure = true
allow_private = ["127.0.0.1/32"]
secret = {{ file = "{}/dest.secret" }}
"#,
            h.display()
        ),
    )
    .unwrap();
    // A pause is recorded in a spool that exists (issue 29: no command but the services,
    // migrate and enqueue creates one).
    assert!(hs(h).arg("migrate").output().unwrap().status.success());
    let out = hs(h)
        .args(["pause", "http:x", "--reason", "receiver upgrade"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let issues = json(h, &[], &["issues"]);
    let i = issue(&issues, "delivery:http:x:paused").expect("the pause opened an issue");
    assert_eq!(
        (i["state"].as_str(), i["kind"].as_str()),
        (Some("open"), Some("delivery"))
    );
    let text = i["last_error"].as_str().unwrap();
    assert!(
        text.contains("receiver upgrade") && text.contains("hookspool resume http:x"),
        "{text}"
    );
    // Named by its fingerprint.
    let acked = json(h, &[], &["issues", "ack", "delivery:http:x:paused"]);
    assert_eq!(acked["state"], "acked");
    let out = hs(h).args(["resume", "http:x"]).output().unwrap();
    assert!(out.status.success());
    let issues = json(h, &[], &["issues", "--all"]);
    assert_eq!(
        issue(&issues, "delivery:http:x:paused").unwrap()["state"],
        "resolved"
    );
}

/// Issue 28: a world-readable secret file and a secret reference that links outside the
/// config's secret directories are logged by both halves at start and on reload, open
/// `config:secrets`, and resolve once mended and reloaded; no secret value is logged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exposed_secret_files_are_logged_by_both_halves_and_open_config_secrets_until_mended() {
    use std::os::unix::fs::{PermissionsExt, symlink};
    let rx = Receiver::start().await;
    let home = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let h = home.path().to_path_buf();
    let port = free_port();
    let text = run_config(&h, port, &rx.url(), "");
    std::fs::write(h.join("config.toml"), &text).unwrap();
    let mode = |p: &Path, m: u32| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m));
    mode(&h.join("source.secret"), 0o644).unwrap();
    // dest.secret becomes a link to a file in another directory (a link to /etc/shadow,
    // in the hostile battery).
    let target = elsewhere.path().join("not-a-secret-dir-file");
    std::fs::write(&target, "wiring-destination-secret").unwrap();
    mode(&target, 0o600).unwrap();
    std::fs::remove_file(h.join("dest.secret")).unwrap();
    symlink(&target, h.join("dest.secret")).unwrap();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let run = RunProc::start(&h, addr, &[]);

    let warned = |log: &str, component: &str, needle: &str| {
        log.lines()
            .any(|l| l.contains(component) && l.contains("config warning") && l.contains(needle))
    };
    for component in ["intake", "dispatch"] {
        wait_until(
            &format!("the {component} half warns about both at start"),
            Duration::from_secs(20),
            || {
                let log = run.log();
                warned(&log, component, "has mode 0644")
                    && warned(&log, component, "is a symlink to")
            },
        );
    }
    let mut last = Value::Null;
    wait_until("config:secrets opens", Duration::from_secs(20), || {
        last = issue(&json(&h, &[], &["issues"]), "config:secrets")
            .cloned()
            .unwrap_or(Value::Null);
        last["state"] == "open"
    });
    let text_of = last["last_error"].as_str().unwrap().to_string();
    assert!(
        text_of.contains("sources.s.secrets.secret"),
        "names the keys: {text_of}"
    );
    assert!(
        text_of.contains("destinations.\"http-recv\".secret"),
        "{text_of}"
    );
    assert!(
        text_of.contains("not-a-secret-dir-file"),
        "says where it points: {text_of}"
    );

    // Mended: owner-only, and the link replaced by the file itself; a save reloads both.
    mode(&h.join("source.secret"), 0o600).unwrap();
    std::fs::remove_file(h.join("dest.secret")).unwrap();
    std::fs::write(h.join("dest.secret"), "wiring-destination-secret").unwrap();
    mode(&h.join("dest.secret"), 0o600).unwrap();
    std::thread::sleep(Duration::from_millis(1100));
    std::fs::write(h.join("config.toml"), format!("{text}\n# saved\n")).unwrap();
    wait_until("config:secrets resolves", Duration::from_secs(20), || {
        issue(&json(&h, &[], &["issues", "--all"]), "config:secrets")
            .is_some_and(|i| i["state"] == "resolved")
    });
    let log = run.log();
    for sentinel in ["wiring-source-secret", "wiring-destination-secret"] {
        assert!(!log.contains(sentinel), "a secret value in the log");
    }
    drop(run);
}
