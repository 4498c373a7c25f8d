//! Under `hookspool run`, no failure of one half ends the other (issue 17), through the
//! real binary: a dispatcher half that stops on an error is started again after a backoff
//! while the intake keeps answering senders; an intake half that stops is started again
//! while the dispatcher, never restarted, keeps delivering. The failures are the
//! `dispatch.tick_fails` and `run.intake_stops` failpoints with
//! `HOOKSPOOL_FAILPOINT_ACTION=error` (once per process).

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use hookspool::sources::verify::{MacAlg, mac_hex};

use super::fulldisk::Svc;
use super::intake::{raw, request};
use super::receiver::Receiver;
use super::run_e2e::free_port;
use super::{bin, wait_until};

const SOURCE_SECRET: &[u8] = b"wiring-source-secret";

fn post(addr: SocketAddr, topic: &str) -> u16 {
    let body = format!(r#"{{"topic":"{topic}"}}"#);
    let sig = format!(
        "sha256={}",
        mac_hex(MacAlg::Sha256, SOURCE_SECRET, &[body.as_bytes()])
    );
    let h = [
        ("X-Signature", sig.as_str()),
        ("Content-Type", "application/json"),
    ];
    raw(addr, &request("POST", "/hooks/s", &h, body.as_bytes())).status
}

fn delivered(rx: &Receiver, topic: &str) -> usize {
    rx.requests()
        .iter()
        .filter(|r| r.json()["events"][0]["topic"] == topic)
        .count()
}

fn start(rx: &Receiver, home: &Path, failpoint: &str) -> (Svc, SocketAddr) {
    let port = free_port();
    std::fs::write(
        home.join("config.toml"),
        super::wiring::run_config(home, port, &rx.url(), ""),
    )
    .unwrap();
    let svc = Svc::start(
        home,
        "run",
        &[
            ("HOOKSPOOL_FAILPOINT", failpoint),
            ("HOOKSPOOL_FAILPOINT_ACTION", "error"),
        ],
    );
    (svc, format!("127.0.0.1:{port}").parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_run_a_failed_dispatcher_half_restarts_while_the_intake_keeps_serving() {
    let rx = Receiver::start().await;
    let home = tempfile::tempdir().unwrap();
    let (mut run, addr) = start(&rx, home.path(), "dispatch.tick_fails");
    tokio::task::block_in_place(|| {
        run.wait_log("the dispatcher half stopped", Duration::from_secs(30));
        // The dispatcher is down for its backoff (1 s); the intake answers meanwhile.
        let status = post(addr, "during");
        assert_eq!(status, 200, "the intake kept serving:\n{}", run.log());
        run.assert_running("after the dispatcher half failed");
        wait_until(
            "delivery by the restarted dispatcher",
            Duration::from_secs(20),
            || delivered(&rx, "during") == 1,
        );
    });
    let log = run.log();
    assert!(
        log.contains("failpoint dispatch.tick_fails")
            && log.contains("the intake keeps serving; starting it again in 1 s"),
        "the failure and the restart are logged:\n{log}"
    );
    assert_eq!(
        log.matches("dispatcher ready").count(),
        2,
        "started once more:\n{log}"
    );
    assert_eq!(
        log.matches("intake: ready").count(),
        1,
        "the intake was never restarted:\n{log}"
    );
    assert!(run.stop().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_run_a_failed_intake_half_restarts_while_the_dispatcher_keeps_delivering() {
    let rx = Receiver::start().await;
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let (mut run, addr) = start(&rx, h, "run.intake_stops");
    tokio::task::block_in_place(|| {
        run.wait_log("the intake half stopped", Duration::from_secs(30));
        // The intake is down for its backoff; an event spooled by hand is still delivered.
        let mut c = Command::new(bin())
            .arg("--home")
            .arg(h)
            .args(["enqueue", "--source", "s", "--key", "by-hand"])
            .env_remove("HOOKSPOOL_CONFIG")
            .env_remove("HOOKSPOOL_HOME")
            .env_remove("HOOKSPOOL_FAILPOINT")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        c.stdin
            .take()
            .unwrap()
            .write_all(br#"{"topic":"by-hand"}"#)
            .unwrap();
        let out = c.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        wait_until("the dispatcher delivers", Duration::from_secs(20), || {
            delivered(&rx, "by-hand") == 1
        });
        run.assert_running("after the intake half failed");
        // The intake comes back on its own.
        wait_until("the intake serves again", Duration::from_secs(20), || {
            std::net::TcpStream::connect(addr).is_ok()
        });
        assert_eq!(post(addr, "after"), 200);
        wait_until(
            "delivery after the restart",
            Duration::from_secs(20),
            || delivered(&rx, "after") == 1,
        );
    });
    let log = run.log();
    assert!(
        log.contains("the dispatcher keeps delivering; starting it again in 1 s"),
        "logged:\n{log}"
    );
    assert_eq!(
        log.matches("intake: ready").count(),
        2,
        "started once more:\n{log}"
    );
    assert_eq!(
        log.matches("dispatcher ready").count(),
        1,
        "the dispatcher was never restarted:\n{log}"
    );
    assert!(run.stop().success());
}
