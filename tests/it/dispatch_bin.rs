//! The real `hookspool dispatch` binary: a script destination's emits are atomic with the
//! mark under SIGKILL between them, a second dispatcher exits 3, SIGTERM stops cleanly.

use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hookspool::store::BatchFilter;

use super::{bin, killed, open, wait_until};

fn hs(home: &std::path::Path) -> Command {
    let mut c = Command::new(bin());
    c.arg("--home")
        .arg(home)
        .env_remove("HOOKSPOOL_CONFIG")
        .env_remove("HOOKSPOOL_HOME")
        .env_remove("HOOKSPOOL_FAILPOINT")
        .env_remove("NOTIFY_SOCKET");
    c
}

fn spawn_dispatch(home: &std::path::Path, failpoint: Option<&str>) -> Child {
    let mut c = hs(home);
    c.arg("dispatch")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(f) = failpoint {
        c.env("HOOKSPOOL_FAILPOINT", f);
    }
    c.spawn().unwrap()
}

#[test]
fn script_emits_survive_sigkill_between_emits_and_mark_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let scripts = tempfile::tempdir().unwrap();
    let home = dir.path();
    std::fs::write(
        home.join("config.toml"),
        super::emit_script_config(home, scripts.path()),
    )
    .unwrap();
    let mut c = hs(home)
        .args(["enqueue", "--source", "s", "--key", "k"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(br#"{"n":1}"#).unwrap();
    assert!(c.wait().unwrap().success());

    let mut d = spawn_dispatch(home, Some("mark.after_emits"));
    let started = Instant::now();
    let status = loop {
        if let Some(st) = d.try_wait().unwrap() {
            break st;
        }
        if started.elapsed() > Duration::from_secs(30) {
            let _ = d.kill();
            let out = d.wait_with_output().unwrap();
            panic!(
                "the dispatcher never reached the failpoint: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        killed(&status),
        "the dispatcher died at the failpoint: {status:?}"
    );
    let db = home.join("spool.db");
    {
        let s = open(&db);
        let b = &s
            .list_batches(&BatchFilter {
                source: Some("s".into()),
                limit: 10,
                ..Default::default()
            })
            .unwrap()[0];
        assert_eq!(b.state.as_str(), "leased", "the mark was not committed");
        let f = s
            .list_batches(&BatchFilter {
                source: Some("followup".into()),
                limit: 10,
                ..Default::default()
            })
            .unwrap();
        assert!(f.is_empty(), "nor were the emits");
    }
    // A second dispatcher while one runs exits 3.
    let mut d = spawn_dispatch(home, None);
    let db2 = db.clone();
    wait_until("delivery after restart", Duration::from_secs(30), || {
        let s = open(&db2);
        s.list_batches(&BatchFilter {
            source: Some("s".into()),
            limit: 10,
            ..Default::default()
        })
        .unwrap()[0]
            .state
            .as_str()
            == "delivered"
    });
    let second = hs(home)
        .arg("dispatch")
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert_eq!(
        second.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&second.stderr)
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(d.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let st = d.wait().unwrap();
    assert!(st.success(), "SIGTERM stops cleanly: {st:?}");
    let s = open(&db);
    let f = s
        .list_batches(&BatchFilter {
            source: Some("followup".into()),
            limit: 10,
            ..Default::default()
        })
        .unwrap();
    let emitted: i64 = f.iter().map(|b| b.count).sum();
    assert_eq!(
        emitted, 1,
        "the script ran twice, its emits were committed once"
    );
    let runs = std::fs::read_to_string(home.join("state/runs")).unwrap();
    assert_eq!(
        runs.lines().count(),
        2,
        "at-least-once: the script ran again after the crash"
    );
}

/// Issue 28's note "a destination that stays throttled (429 without end) opens no issue",
/// through the real binary: a receiver that answers only 429 (with and without
/// Retry-After) opens `delivery:<dest>:throttled` once it has done so for
/// dispatch.throttle_alert_s, not before, and the first success resolves it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_destination_throttled_past_throttle_alert_s_opens_an_issue_and_the_first_success_resolves_it()
 {
    const THROTTLE_ALERT_S: f64 = 2.0;
    let rx = super::receiver::Receiver::start().await;
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().to_path_buf();
    std::fs::write(home.join("secret"), "whsec_c2VjcmV0LWZvci10ZXN0cw==").unwrap();
    std::fs::write(
        home.join("config.toml"),
        format!(
            r#"
[dispatch]
poll_s = 0.05
backoff_base_s = 0.2
backoff_cap_s = 0.4
throttle_alert_s = {THROTTLE_ALERT_S}
[sources.s]
scheme = "static-token"
header = "X-Token"
key = "k"
action = "http-recv"
[destinations.http-recv]
type = "http"
url = "{}"
allow_insecure = true
secret = {{ file = "{}/secret" }}
"#,
            rx.url(),
            home.display()
        ),
    )
    .unwrap();
    rx.set_default(super::receiver::Answer::status(429).header("Retry-After", "1"));
    let mut c = hs(&home)
        .args(["enqueue", "--source", "s", "--key", "k"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(br#"{"n":1}"#).unwrap();
    assert!(c.wait().unwrap().success());
    let mut d = spawn_dispatch(&home, None);
    let db = home.join("spool.db");
    let issue = |db: &std::path::Path| {
        open(db)
            .issue_by_fingerprint("delivery:http-recv:throttled")
            .unwrap()
    };
    tokio::task::block_in_place(|| {
        wait_until("a throttle", Duration::from_secs(30), || {
            !rx.requests().is_empty()
        });
        // Without Retry-After from the second answer on: the batch's own backoff.
        rx.set_default(super::receiver::Answer::status(429));
        wait_until("the throttled issue", Duration::from_secs(30), || {
            issue(&db).is_some_and(|i| i.state == "open")
        });
    });
    let s = open(&db);
    let b = s
        .list_batches(&BatchFilter {
            source: Some("s".into()),
            limit: 10,
            ..Default::default()
        })
        .unwrap()
        .remove(0);
    let attempts = s.attempts(b.id).unwrap();
    let first = attempts[0].finished_at.unwrap();
    let opened = issue(&db).unwrap();
    assert!(
        opened.first_at - first >= THROTTLE_ALERT_S,
        "opened {} s after the first throttle",
        opened.first_at - first
    );
    assert!(
        attempts
            .iter()
            .filter(|a| a.finished_at.is_some())
            .all(|a| a.klass.map(|k| k.as_str()) == Some("throttle")),
        "{attempts:?}"
    );
    assert_eq!(b.attempts, 0, "throttles are not counted");
    // The first success resolves it.
    rx.set_default(super::receiver::Answer::status(200));
    tokio::task::block_in_place(|| {
        wait_until(
            "the throttled issue resolved",
            Duration::from_secs(30),
            || issue(&db).is_some_and(|i| i.state == "resolved"),
        );
    });
    assert_eq!(open(&db).batch(b.id).unwrap().state.as_str(), "delivered");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(d.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(d.wait().unwrap().success());
}
