//! The real `hookspool intake` binary: socket activation with a TCP and a Unix socket passed
//! by the test (LISTEN_FDS/LISTEN_PID/LISTEN_FDNAMES), sd_notify to a test datagram socket
//! (READY=1, WATCHDOG=1, RELOADING=1 + READY=1 on SIGHUP, STOPPING=1 on SIGTERM, exit 0),
//! kill -9 under load, sentinels that must never reach the log, ENOSPC through the writer's
//! injection seam, and the schema refusal (exit 2).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::os::unix::net::{UnixDatagram, UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::daemon::{Daemon, Spec};
use super::intake::{SECRET, config, events, post_signed, read_response, request, sign};
use super::{bin, killed};

/// The real binary on the [`Daemon`] wrapper, socket-activated with one TCP and one Unix
/// listener.
pub(super) struct Proc {
    daemon: Daemon,
    pub(super) tcp: SocketAddr,
    unix: PathBuf,
    pub(super) home: tempfile::TempDir,
}

impl std::ops::Deref for Proc {
    type Target = Daemon;
    fn deref(&self) -> &Daemon {
        &self.daemon
    }
}

impl std::ops::DerefMut for Proc {
    fn deref_mut(&mut self) -> &mut Daemon {
        &mut self.daemon
    }
}

impl Proc {
    fn start(extra_config: &str, env: &[(&str, String)]) -> Proc {
        let home = tempfile::tempdir().unwrap();
        std::fs::write(home.path().join("secret"), SECRET).unwrap();
        std::fs::write(
            home.path().join("config.toml"),
            config(
                home.path(),
                &format!("[limits]\nmin_free_bytes = 0\n{extra_config}"),
            ),
        )
        .unwrap();
        Proc::start_in(home, env)
    }

    pub(super) fn start_in(home: tempfile::TempDir, env: &[(&str, String)]) -> Proc {
        let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
        let unix_path = home.path().join("intake.sock");
        let unix = UnixListener::bind(&unix_path).unwrap();
        let addr = tcp.local_addr().unwrap();
        let mut spec = Spec::new(home.path(), &["intake"])
            .socket(tcp, "http")
            .socket(unix, "unix");
        for (k, v) in env {
            spec = spec.env(k, v);
        }
        Proc {
            daemon: Daemon::start(spec),
            tcp: addr,
            unix: unix_path,
            home,
        }
    }

    pub(super) fn db(&self) -> PathBuf {
        self.home.path().join("spool.db")
    }

    /// Wait until the intake answers /healthz on TCP.
    pub(super) fn wait_serving(&self) {
        self.daemon.wait_serving(self.tcp);
    }
}

/// Datagrams received on a NOTIFY_SOCKET, in order.
struct Notifications {
    sock: UnixDatagram,
    seen: Vec<String>,
}

impl Notifications {
    fn bind(dir: &Path) -> (Notifications, PathBuf) {
        let path = dir.join("notify.sock");
        let sock = UnixDatagram::bind(&path).unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        (
            Notifications {
                sock,
                seen: Vec::new(),
            },
            path,
        )
    }

    /// Wait until a datagram containing `needle` arrives after the ones already seen.
    fn wait_for(&mut self, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(15);
        let mut buf = [0u8; 4096];
        while Instant::now() < deadline {
            if let Ok(n) = self.sock.recv(&mut buf) {
                let msg = String::from_utf8_lossy(&buf[..n]).to_string();
                self.seen.push(msg.clone());
                if msg.contains(needle) {
                    return msg;
                }
            }
        }
        panic!("no {needle} among {:?}", self.seen);
    }
}

fn unix_request(path: &Path, bytes: &[u8]) -> super::intake::Resp {
    let mut s = UnixStream::connect(path).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(bytes).unwrap();
    read_response(&mut s)
}

/// systemd may signal a service the moment it says READY=1 (`systemctl reload` or `stop`
/// issued as the start returns). The handlers are installed before READY=1, so a SIGHUP
/// right after it is a reload and a SIGTERM a clean stop, never the signal's default action
/// (which ends the process at once). Each is sent as soon as READY=1 arrives, several
/// times over, since the window it guards was only the time to the first poll of a task.
#[test]
fn a_reload_or_a_stop_right_after_ready_is_handled_not_fatal() {
    for round in 0..4 {
        let notify_dir = tempfile::tempdir().unwrap();
        let (mut notes, notify_path) = Notifications::bind(notify_dir.path());
        let mut p = Proc::start("", &[("NOTIFY_SOCKET", notify_path.display().to_string())]);
        notes.wait_for("READY=1");
        p.signal(nix::sys::signal::Signal::SIGHUP);
        notes.wait_for("RELOADING=1");
        notes.wait_for("READY=1");
        p.assert_running(&format!(
            "round {round}: after a SIGHUP right after READY=1"
        ));
        p.wait_serving();
        p.sigterm();
        let st = p.wait_exit(Duration::from_secs(30));
        assert!(
            st.success(),
            "round {round}: a SIGTERM after the reload: {st:?}\n{}",
            p.log()
        );

        let notify_dir = tempfile::tempdir().unwrap();
        let (mut notes, notify_path) = Notifications::bind(notify_dir.path());
        let mut p = Proc::start("", &[("NOTIFY_SOCKET", notify_path.display().to_string())]);
        notes.wait_for("READY=1");
        p.sigterm();
        let st = p.wait_exit(Duration::from_secs(30));
        assert!(
            st.success(),
            "round {round}: a SIGTERM right after READY=1: {st:?}\n{}",
            p.log()
        );
        assert!(
            p.log().contains("stopped"),
            "round {round}: no clean stop logged:\n{}",
            p.log()
        );
    }
}

#[test]
fn socket_activated_on_tcp_and_unix_with_the_sd_notify_lifecycle() {
    let notify_dir = tempfile::tempdir().unwrap();
    let (mut notes, notify_path) = Notifications::bind(notify_dir.path());
    let mut p = Proc::start(
        "",
        &[
            ("NOTIFY_SOCKET", notify_path.display().to_string()),
            ("WATCHDOG_USEC", "200000".into()),
        ],
    );
    let ready = notes.wait_for("READY=1");
    assert!(ready.contains("STATUS=serving"), "{ready}");
    assert!(ready.contains("tpl"), "STATUS says what it serves: {ready}");
    notes.wait_for("WATCHDOG=1");

    // Both inherited sockets serve.
    let body = br#"{"repo":"octo/sa"}"#;
    let r = post_signed(p.tcp, body, "sa-1", "push");
    assert_eq!(r.status, 200, "{r:?}");
    let sig = sign(body);
    let r = unix_request(
        &p.unix,
        &request(
            "POST",
            "/hooks/tpl",
            &[("X-Signature", &sig), ("X-Delivery-Id", "sa-2")],
            body,
        ),
    );
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(
        events(&p.db()).len(),
        4,
        "two requests, each with its tee copy"
    );

    // SIGHUP: RELOADING=1 with MONOTONIC_USEC, then READY=1; a new source is served.
    let extra = "\n[sources.tpl2]\ntype = \"template\"\nscheme = \"hmac-sha256-hex\"\nheader = \"X-Signature\"\nprefix = \"sha256=\"\nkey = \"payload.repo\"\naction = \"http-main\"\n";
    let cfg = p.home.path().join("config.toml");
    let mut text = std::fs::read_to_string(&cfg).unwrap();
    text.push_str(&format!(
        "{extra}secrets.secret = {{ file = \"{}/secret\" }}\n",
        p.home.path().display()
    ));
    std::fs::write(&cfg, &text).unwrap();
    p.signal(nix::sys::signal::Signal::SIGHUP);
    let reloading = notes.wait_for("RELOADING=1");
    assert!(reloading.contains("MONOTONIC_USEC="), "{reloading}");
    notes.wait_for("READY=1");
    let sig = sign(body);
    let r = super::intake::raw(
        p.tcp,
        &request("POST", "/hooks/tpl2", &[("X-Signature", &sig)], body),
    );
    assert_eq!(r.status, 200, "{r:?}");

    // A broken config keeps the old one serving, and says why.
    std::fs::write(&cfg, format!("{text}\n[sources.broken]\ntype = \"nope\"\n")).unwrap();
    p.signal(nix::sys::signal::Signal::SIGHUP);
    notes.wait_for("RELOADING=1");
    notes.wait_for("READY=1");
    assert_eq!(post_signed(p.tcp, body, "sa-3", "push").status, 200);
    // The first change may have been reloaded twice (the file watcher, then SIGHUP), so the
    // notifications above can be that second pair: wait for the failure's own line.
    super::eventually(Duration::from_secs(10), || {
        p.log().contains("config reload failed")
    });
    assert!(p.log().contains("config reload failed"), "{}", p.log());
    assert_eq!(post_signed(p.tcp, body, "sa-4", "push").status, 200);

    // SIGTERM: STOPPING=1, exit 0.
    p.signal(nix::sys::signal::Signal::SIGTERM);
    notes.wait_for("STOPPING=1");
    let status = p.wait_exit(Duration::from_secs(15));
    assert!(status.success(), "{status:?}\n{}", p.log());
}

#[test]
fn kill_9_under_load_loses_no_acknowledged_request() {
    kill_9_on(&super::TestSpool::sqlite());
}

/// The same intake on a PostgreSQL spool: SIGKILL under load loses no acknowledged request.
#[test]
fn kill_9_under_load_loses_no_acknowledged_request_on_postgres() {
    let dir = tempfile::tempdir().unwrap();
    let Some(spool) = super::TestSpool::postgres(dir.path()) else {
        return;
    };
    // The schema, as `hookspool migrate` or the dispatcher would make it first.
    drop(spool.open(dir.path()));
    kill_9_on(&spool);
}

fn kill_9_on(spool: &super::TestSpool) {
    let mut p = Proc::start(&spool.section, &[]);
    p.wait_serving();
    let addr = p.tcp;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients: Vec<_> = (0..6)
        .map(|t| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut acked = Vec::new();
                let mut n = 0;
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    n += 1;
                    let body = format!(r#"{{"repo":"octo/k{}","t":{t},"n":{n}}}"#, n % 4);
                    let sig = sign(body.as_bytes());
                    let req = request(
                        "POST",
                        "/hooks/tpl",
                        &[
                            ("X-Signature", &sig),
                            ("X-Delivery-Id", &format!("k-{t}-{n}")),
                        ],
                        body.as_bytes(),
                    );
                    let Ok(mut s) = std::net::TcpStream::connect(addr) else {
                        break;
                    };
                    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                    if s.write_all(&req).is_err() {
                        break;
                    }
                    let mut b = Vec::new();
                    let _ = s.read_to_end(&mut b);
                    if b.starts_with(b"HTTP/1.1 200") {
                        acked.push(body);
                    }
                }
                acked
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    p.signal(nix::sys::signal::Signal::SIGKILL);
    let status = p.wait_exit(Duration::from_secs(10));
    assert!(killed(&status));
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let acked: Vec<String> = clients
        .into_iter()
        .flat_map(|c| c.join().unwrap())
        .collect();
    assert!(
        acked.len() > 50,
        "only {} requests acknowledged",
        acked.len()
    );
    let store = spool.open(p.home.path());
    let mut stored: std::collections::HashSet<serde_json::Value> = Default::default();
    for b in store
        .list_batches(&hookspool::store::BatchFilter {
            limit: 1_000_000,
            ..Default::default()
        })
        .unwrap()
    {
        for e in store.events(b.id, true).unwrap() {
            if let Some(v) = e.payload.and_then(|p| serde_json::from_str(&p).ok()) {
                stored.insert(v);
            }
        }
    }
    let missing: Vec<&String> = acked
        .iter()
        .filter(|b| !stored.contains(&serde_json::from_str::<serde_json::Value>(b).unwrap()))
        .collect();
    assert!(missing.is_empty(), "acknowledged but lost: {missing:?}");
    assert_eq!(store.check_invariants().unwrap(), Vec::<String>::new());
}

#[test]
fn sentinels_in_body_secret_header_and_query_never_reach_the_log() {
    let home = tempfile::tempdir().unwrap();
    let secret = "SENTINEL-SECRET-7f3a";
    std::fs::write(
        home.path().join("config.toml"),
        config(home.path(), "[limits]\nmin_free_bytes = 0\n"),
    )
    .unwrap();
    std::fs::write(home.path().join("secret"), secret).unwrap();
    let mut p = Proc::start_in(home, &[("HOOKSPOOL_LOG_LEVEL", "trace".into())]);
    p.wait_serving();
    let body = br#"{"repo":"SENTINEL-BODY-1","x":"SENTINEL-BODY-2"}"#;
    let sig = format!(
        "sha256={}",
        hookspool::sources::verify::mac_hex(
            hookspool::sources::verify::MacAlg::Sha256,
            secret.as_bytes(),
            &[body]
        )
    );
    let path = "/hooks/tpl?token=SENTINEL-QUERY-9";
    fn h<'a>(extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
        let mut v: Vec<(&str, &str)> = vec![
            ("X-Custom", "SENTINEL-HEADER-3"),
            ("X-Forwarded-For", "SENTINEL-XFF"),
            ("X-Delivery-Id", "SENTINEL-DEDUP-4"),
            ("X-Event", "SENTINEL-EVENT-5"),
        ];
        v.extend_from_slice(extra);
        v
    }
    let send = |req: Vec<u8>| super::intake::raw(p.tcp, &req);
    assert_eq!(
        send(request("POST", path, &h(&[("X-Signature", &sig)]), body)).status,
        200
    );
    assert_eq!(
        send(request("POST", path, &h(&[("X-Signature", &sig)]), body)).status,
        200
    );
    assert_eq!(send(request("POST", path, &h(&[]), body)).status, 401);
    let qbody = br#"{"SENTINEL-NOKEY":"SENTINEL-BODY-6"}"#;
    let qsig = format!(
        "sha256={}",
        hookspool::sources::verify::mac_hex(
            hookspool::sources::verify::MacAlg::Sha256,
            secret.as_bytes(),
            &[qbody]
        )
    );
    assert_eq!(
        send(request("POST", path, &h(&[("X-Signature", &qsig)]), qbody)).status,
        202
    );
    assert_eq!(
        send(request("POST", path, &h(&[]), &[b'S'; 9000])).status,
        413
    );
    let _ = send(request(
        "POST",
        "/hooks/SENTINEL-PATH-SOURCE",
        &h(&[]),
        body,
    ));
    p.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(p.wait_exit(Duration::from_secs(15)).success());
    let log = p.log();
    assert!(log.contains("queued"), "the log is captured: {log}");
    assert!(log.contains("tee=true"), "tee copies are marked: {log}");
    assert!(
        !log.contains("SENTINEL"),
        "a sentinel reached the log:\n{}",
        log.lines()
            .filter(|l| l.contains("SENTINEL"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn enospc_from_the_spool_is_503_and_healthz_degrades() {
    let flag = tempfile::tempdir().unwrap();
    let full = flag.path().join("full");
    let p = Proc::start("", &[("HOOKSPOOL_INJECT_FULL", full.display().to_string())]);
    p.wait_serving();
    assert_eq!(
        post_signed(p.tcp, br#"{"repo":"e"}"#, "e-1", "push").status,
        200
    );
    std::fs::write(&full, "").unwrap();
    let r = post_signed(p.tcp, br#"{"repo":"e"}"#, "e-2", "push");
    assert_eq!(r.status, 503, "{r:?}");
    assert_eq!(r.json()["status"], "spool_full");
    let h = super::intake::raw(p.tcp, &request("GET", "/healthz", &[], b""));
    assert_eq!(h.status, 503, "{h:?}");
    assert!(
        h.json()["degraded"].to_string().contains("spool_full"),
        "{h:?}"
    );
    std::fs::remove_file(&full).unwrap();
    assert_eq!(
        post_signed(p.tcp, br#"{"repo":"e"}"#, "e-2", "push").status,
        200
    );
    assert_eq!(events(&p.db()).len(), 4);
}

#[test]
fn an_older_schema_exits_2_and_says_to_migrate() {
    let home = tempfile::tempdir().unwrap();
    std::fs::write(home.path().join("secret"), SECRET).unwrap();
    std::fs::write(home.path().join("config.toml"), config(home.path(), "")).unwrap();
    {
        let mut s = hookspool::store::Store::open_unmigrated(
            &home.path().join("spool.db"),
            Duration::from_secs(5),
        )
        .unwrap();
        s.migrate_to(1).unwrap();
    }
    let mut p = Proc::start_in(home, &[]);
    let status = p.wait_exit(Duration::from_secs(15));
    assert_eq!(status.code(), Some(2), "{}", p.log());
    assert!(p.log().contains("hookspool migrate"), "{}", p.log());
}

/// `intake.threads` sets the intake runtime's workers (it used to be parsed and ignored).
#[test]
fn intake_threads_sets_the_runtime_workers() {
    let count = |threads: usize| -> usize {
        let home = tempfile::tempdir().unwrap();
        std::fs::write(
            home.path().join("config.toml"),
            format!("[intake]\nlisten = \"127.0.0.1:0\"\nthreads = {threads}\n[limits]\nmin_free_bytes = 0\n"),
        )
        .unwrap();
        let mut child = Command::new(bin())
            .arg("--home")
            .arg(home.path())
            .arg("intake")
            .env_remove("HOOKSPOOL_CONFIG")
            .env_remove("HOOKSPOOL_HOME")
            .env_remove("NOTIFY_SOCKET")
            .env_remove("JOURNAL_STREAM")
            .env_remove("LISTEN_FDS")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let log = super::capture_stderr(&mut child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while !String::from_utf8_lossy(&log.lock().unwrap()).contains("ready") {
            assert!(Instant::now() < deadline, "never ready");
            std::thread::sleep(Duration::from_millis(20));
        }
        let named = std::fs::read_dir(format!("/proc/{}/task", child.id()))
            .unwrap()
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .filter(|c| c.starts_with("hookspool-intak"))
            .count();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        assert!(child.wait().unwrap().success());
        named
    };
    // The runtime's threads are its workers plus its blocking pool (loading the config):
    // the difference is the workers' alone.
    assert_eq!(count(5) - count(2), 3);
}

/// An intake SIGKILLed while `spool:busy` was open (its writer meant to resolve it at the
/// next commit) left it open for good; the next intake's first commit resolves it.
#[test]
fn a_spool_busy_left_open_by_a_killed_intake_is_resolved_by_the_next_commit() {
    let home = tempfile::tempdir().unwrap();
    std::fs::write(home.path().join("secret"), SECRET).unwrap();
    std::fs::write(home.path().join("config.toml"), config(home.path(), "")).unwrap();
    let db = home.path().join("spool.db");
    {
        let mut s = super::open(&db);
        hookspool::observe::issues::spool_limit(&mut s, "busy", true, Some("a test"), 1.0).unwrap();
    }
    let state = |db: &Path| {
        super::open(db)
            .issue_by_fingerprint("spool:busy")
            .unwrap()
            .map(|i| i.state)
    };
    assert_eq!(state(&db).as_deref(), Some("open"));
    let p = Proc::start_in(home, &[]);
    p.wait_serving();
    assert_eq!(
        post_signed(p.tcp, br#"{"repo":"octo/busy"}"#, "busy-1", "push").status,
        200,
        "{}",
        p.log()
    );
    // Resolved right after the answers went out (issues never delay a sender).
    super::eventually(Duration::from_secs(10), || {
        state(&db).as_deref() == Some("resolved")
    });
    assert_eq!(state(&db).as_deref(), Some("resolved"), "{}", p.log());
}

/// Issue 34: a `[sources.gh]` table with `type = "template"` and the signing recipe in
/// tests/vectors/github/recipe.toml, served by the real binary, accepts GitHub's documented
/// example (github/docs "Validating webhook deliveries": secret "It's a Secret to Everybody",
/// body "Hello, World!", tests/vectors/github/vectors.json GH-DOCS) and stores it, and answers
/// 401 to the same request with one byte of the body changed, storing nothing more. The
/// same recipe with `url` signed and no callback_url refuses to start, naming the key.
#[test]
fn a_template_recipe_verifies_githubs_documented_example_through_the_binary() {
    let root = env!("CARGO_MANIFEST_DIR");
    let recipe =
        std::fs::read_to_string(format!("{root}/tests/vectors/github/recipe.toml")).unwrap();
    let home = tempfile::tempdir().unwrap();
    std::fs::write(home.path().join("secret"), SECRET).unwrap();
    std::fs::write(home.path().join("gh-secret"), "It's a Secret to Everybody").unwrap();
    let gh = |home: &Path, recipe: &str| {
        format!(
            "[limits]\nmin_free_bytes = 0\n\n[sources.gh]\ntype = \"template\"\n{recipe}\n\
             body = \"form\"\naction = \"http-main\"\n\
             secrets.secret = {{ file = \"{}/gh-secret\" }}\n",
            home.display()
        )
    };
    std::fs::write(
        home.path().join("config.toml"),
        config(home.path(), &gh(home.path(), &recipe)),
    )
    .unwrap();
    let p = Proc::start_in(home, &[]);
    p.wait_serving();
    let post = |body: &[u8]| {
        super::intake::raw(
            p.tcp,
            &request(
                "POST",
                "/hooks/gh",
                &[
                    ("X-GitHub-Event", "ping"),
                    ("X-GitHub-Delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958"),
                    (
                        "X-Hub-Signature-256",
                        "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17",
                    ),
                ],
                body,
            ),
        )
    };
    let r = post(b"Hello, World!");
    assert_eq!(r.status, 200, "{r:?}\n{}", p.log());
    let stored = events(&p.db());
    assert_eq!(stored.len(), 1, "{stored:?}");
    assert!(
        stored[0]
            .2
            .as_deref()
            .unwrap_or_default()
            .contains("Hello, World!"),
        "{stored:?}"
    );
    let r = post(b"Hello, World?");
    assert_eq!(r.status, 401, "{r:?}");
    assert!(r.body.is_empty());
    assert_eq!(events(&p.db()).len(), 1);
    drop(p);

    // `hookspool check` on a recipe that signs the URL without callback_url names the key
    // and what to write.
    let home = tempfile::tempdir().unwrap();
    std::fs::write(home.path().join("secret"), SECRET).unwrap();
    std::fs::write(home.path().join("gh-secret"), "x").unwrap();
    let url_recipe = recipe.replace("signed = [\"body\"]", "signed = [\"body\", \"url\"]");
    assert_ne!(url_recipe, recipe);
    std::fs::write(
        home.path().join("config.toml"),
        config(home.path(), &gh(home.path(), &url_recipe)),
    )
    .unwrap();
    let out = Command::new(super::bin())
        .arg("--home")
        .arg(home.path())
        .arg("check")
        .env_remove("HOOKSPOOL_CONFIG")
        .env_remove("HOOKSPOOL_HOME")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains("callback_url") && text.contains("the URL is signed"),
        "{text}"
    );
}

/// A failed fdatasync of the WAL (the pipelined commit's own sync): the group waiting for it
/// is answered 503, never 2xx, and the intake stops with a failure so systemd starts a fresh
/// one.
#[test]
fn a_failed_wal_sync_answers_503_and_stops_the_intake() {
    let home = tempfile::tempdir().unwrap();
    std::fs::write(home.path().join("secret"), SECRET).unwrap();
    std::fs::write(
        home.path().join("config.toml"),
        config(
            home.path(),
            "pipelined_sync = true\n[limits]\nmin_free_bytes = 0\n",
        ),
    )
    .unwrap();
    let mut p = Proc::start_in(
        home,
        &[
            ("HOOKSPOOL_FAILPOINT", "intake.wal_sync_fails".to_string()),
            ("HOOKSPOOL_FAILPOINT_ACTION", "error".to_string()),
        ],
    );
    p.wait_serving();
    let r = post_signed(p.tcp, br#"{"repo":"s"}"#, "s-1", "push");
    assert_eq!(r.status, 503, "{r:?}");
    let status = p.wait_exit(Duration::from_secs(30));
    assert!(!status.success(), "{status:?}: {}", p.log());
    assert!(p.log().contains("fdatasync failed"), "{}", p.log());
}
