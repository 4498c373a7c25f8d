//! The egress policy through the real binary (issue 35), with real name resolution: each
//! test runs `hookspool` in a private mount namespace of its own whose /etc/hosts (a file
//! the test writes, bind-mounted over the host's) names the receivers. Needs root and
//! unshare(1); without them the test says SKIPPED (a failure under HOOKSPOOL_NO_SKIP=1).
//!
//! Shown: `check` warns on a destination that resolves into a refused range (naming the
//! rule) and not on one its allow-list admits; the dispatcher delivers to the admitted one,
//! refuses the other as a `config` outcome with an issue naming the rule while the listener
//! that name points at sees nothing; an answer that changes between `check` and the connect
//! is judged at the connect; proxy variables in the environment are ignored (the proxy's
//! listener sees nothing).

use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::{bin, open, wait_until};

const UNSHARE: &str = "/usr/bin/unshare";

/// `hookspool <args>` in a new mount namespace whose /etc/hosts is `hosts`.
fn in_ns(hosts: &Path, home: &Path) -> Command {
    let mut c = Command::new(UNSHARE);
    c.args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(r#"mount --bind "$0" /etc/hosts && exec "$@""#)
        .arg(hosts)
        .arg(bin())
        .arg("--home")
        .arg(home)
        .env_remove("HOOKSPOOL_CONFIG")
        .env_remove("HOOKSPOOL_HOME")
        .env_remove("HOOKSPOOL_FAILPOINT")
        .env_remove("NOTIFY_SOCKET");
    c
}

fn can_run() -> bool {
    let ok = nix::unistd::geteuid().is_root() && Path::new(UNSHARE).exists();
    if !ok {
        super::skip::skip_or_fail("egress namespace test: needs root and /usr/bin/unshare");
    }
    ok
}

/// A listener that counts the connections it accepts (and answers none).
fn counting(addr: &str) -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let l = TcpListener::bind(addr).unwrap();
    let a = l.local_addr().unwrap();
    let n = Arc::new(AtomicUsize::new(0));
    let n2 = n.clone();
    std::thread::spawn(move || {
        for s in l.incoming() {
            n2.fetch_add(1, Ordering::SeqCst);
            drop(s);
        }
    });
    (a, n)
}

fn write_config(home: &Path, rx: std::net::SocketAddr, sneaky_port: u16) {
    std::fs::write(
        home.join("secret"),
        "whsec_ZWdyZXNzLWJpbmFyeS10ZXN0LXNlY3JldCE=",
    )
    .unwrap();
    std::fs::write(
        home.join("config.toml"),
        format!(
            r#"[intake]
listen = "unix:{home}/no-intake.sock"
[limits]
min_free_bytes = 0
[dispatch]
poll_s = 0.1
heartbeat_s = 0.2
[destinations."http:admitted"]
type = "http"
url = "http://admitted.test:{port}/ok"
allow_insecure = true
allow_private = ["127.0.0.1/32"]
secret = {{ file = "{home}/secret" }}
[destinations."http:sneaky"]
type = "http"
url = "http://sneaky.test:{sneaky_port}/in"
allow_insecure = true
secret = {{ file = "{home}/secret" }}
"#,
            home = home.display(),
            port = rx.port(),
        ),
    )
    .unwrap();
}

fn enqueue(db: &Path, route: &str) -> i64 {
    let mut s = open(db);
    let now = hookspool::clock::Clock::now(&hookspool::clock::SystemClock);
    let w = super::window(0.0, 0.0, 1, 1_000_000);
    let req = super::request(route, "k", r#"{"n":1}"#, now, w);
    s.enqueue(&req).unwrap();
    s.list_batches(&hookspool::store::BatchFilter {
        limit: 100,
        ..Default::default()
    })
    .unwrap()
    .into_iter()
    .find(|b| b.route == route)
    .unwrap()
    .id
}

fn check_output(hosts: &Path, home: &Path) -> String {
    let out = in_ns(hosts, home).arg("check").output().unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_resolving_to_loopback_is_refused_unless_admitted_and_proxies_are_ignored() {
    if !can_run() {
        return;
    }
    let rx = super::receiver::Receiver::start().await;
    let (sneaky, sneaky_hits) = counting("127.0.0.1:0");
    let (proxy, proxy_hits) = counting("127.0.0.1:0");
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().to_path_buf();
    let hosts: PathBuf = home.join("hosts");
    std::fs::write(&hosts, "127.0.0.1 localhost admitted.test sneaky.test\n").unwrap();
    write_config(&home, rx.addr, sneaky.port());
    let db = home.join("spool.db");
    let admitted = enqueue(&db, "admitted");
    let refused = enqueue(&db, "sneaky");

    let check = check_output(&hosts, &home);
    assert!(
        check.contains("destinations.\"http:sneaky\".url")
            && check.contains("sneaky.test resolves to 127.0.0.1, a loopback address"),
        "{check}"
    );
    assert!(!check.contains("http:admitted\".url"), "{check}");

    let proxy_url = format!("http://{proxy}");
    let mut d = in_ns(&hosts, &home)
        .arg("dispatch")
        .env("HTTP_PROXY", &proxy_url)
        .env("http_proxy", &proxy_url)
        .env("ALL_PROXY", &proxy_url)
        .env("all_proxy", &proxy_url)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let got = rx.wait_for(1, Duration::from_secs(20)).await;
    assert_eq!(got.len(), 1, "the admitted destination delivered");
    assert_eq!(got[0].path, "/ok");
    let s = open(&db);
    tokio::task::block_in_place(|| {
        wait_until("the refusal recorded", Duration::from_secs(20), || {
            s.batch(refused).unwrap().last_class.is_some()
        })
    });
    let b = s.batch(refused).unwrap();
    assert_eq!(
        b.last_class.map(|k| k.as_str().to_string()).as_deref(),
        Some("config"),
        "{b:?}"
    );
    assert!(
        b.last_error
            .as_deref()
            .unwrap_or("")
            .contains("egress refused (loopback): sneaky.test resolves to 127.0.0.1"),
        "{b:?}"
    );
    // The receiver saw the request before the dispatcher recorded its answer: wait for the
    // mark rather than read the batch at once (it was still leased under load).
    tokio::task::block_in_place(|| {
        wait_until(
            "the admitted batch delivered",
            Duration::from_secs(20),
            || s.batch(admitted).unwrap().state.as_str() == "delivered",
        )
    });
    // The issue is opened just after the result's transaction commits.
    let names_rule = |i: &hookspool::store::IssueRow| {
        i.destination.as_deref() == Some("http:sneaky")
            && i.last_error
                .as_deref()
                .unwrap_or("")
                .contains("egress refused: loopback")
    };
    tokio::task::block_in_place(|| {
        wait_until("an issue naming the rule", Duration::from_secs(20), || {
            s.issues(&[], 100).unwrap().iter().any(names_rule)
        })
    });
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(d.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = d.wait().unwrap();
    let mut err = String::new();
    d.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(status.success(), "{status:?}: {err}");
    assert_eq!(
        sneaky_hits.load(Ordering::SeqCst),
        0,
        "nothing left for the refused address"
    );
    assert_eq!(
        proxy_hits.load(Ordering::SeqCst),
        0,
        "no proxy from the environment"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_that_changes_between_check_and_connect_is_judged_at_the_connect() {
    if !can_run() {
        return;
    }
    let rx = super::receiver::Receiver::start().await;
    let (sneaky, sneaky_hits) = counting("127.0.0.1:0");
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().to_path_buf();
    let hosts = home.join("hosts");
    // At check time sneaky.test is a public (documentation) address: no warning.
    std::fs::write(
        &hosts,
        "127.0.0.1 localhost admitted.test\n203.0.113.9 sneaky.test\n",
    )
    .unwrap();
    write_config(&home, rx.addr, sneaky.port());
    let db = home.join("spool.db");
    let refused = enqueue(&db, "sneaky");
    let check = check_output(&hosts, &home);
    assert!(!check.contains("http:sneaky\".url"), "{check}");
    // Then the name answers loopback (a rebinding DNS would): the dispatcher's connect
    // resolves and judges it, and refuses.
    std::fs::write(&hosts, "127.0.0.1 localhost admitted.test sneaky.test\n").unwrap();
    let mut d = in_ns(&hosts, &home)
        .arg("dispatch")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let s = open(&db);
    tokio::task::block_in_place(|| {
        wait_until("the refusal recorded", Duration::from_secs(20), || {
            s.batch(refused).unwrap().last_class.is_some()
        })
    });
    let b = s.batch(refused).unwrap();
    assert!(
        b.last_error
            .as_deref()
            .unwrap_or("")
            .contains("egress refused (loopback): sneaky.test resolves to 127.0.0.1"),
        "{b:?}"
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(d.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(d.wait().unwrap().success());
    assert_eq!(sneaky_hits.load(Ordering::SeqCst), 0);
    assert!(rx.requests().is_empty());
}
