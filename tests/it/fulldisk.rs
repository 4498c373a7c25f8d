//! A full disk is weather (issue 17), through the real binary on a real full filesystem: a
//! 16 MiB tmpfs as the spool home, filled to its last byte. `hookspool run`, and
//! `hookspool intake` beside `hookspool dispatch`, keep running through the episode: a
//! signed request during it is answered 503, a result that finished during it stays in
//! memory and is recorded once space returns (delivered once, not again), `spool:full`
//! is recorded by the first write that succeeds, alerts, and resolves; a start on a full
//! disk (no `-shm` file can be created) waits for space instead of exiting. Needs root
//! for the mount (`skip_or_fail` otherwise).

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hookspool::sources::verify::{MacAlg, mac_hex};
use hookspool::store::BatchFilter;
use serde_json::Value;

use super::daemon::{Daemon, Spec};
use super::intake::{Resp, raw, request};
use super::receiver::{Answer, Receiver};
use super::run_e2e::free_port;
use super::skip::skip_or_fail;
use super::{bin, open, wait_until};

/// The tmpfs's size: small enough to fill in milliseconds.
const TMPFS_SIZE: &str = "16m";
/// What the dispatcher logs once when a full-disk episode begins.
const FULL_LOG: &str = "the spool's filesystem is full";
/// The signing secret `wiring::run_config` writes for its source.
const SOURCE_SECRET: &[u8] = b"wiring-source-secret";

/// A tmpfs mounted on a fresh directory, unmounted when dropped (also when a test fails).
pub struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    /// `None` (after `skip_or_fail`) where this process may not mount.
    pub fn mount() -> Option<Tmpfs> {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o"])
            .arg(format!("size={TMPFS_SIZE},mode=0700"))
            .arg("tmpfs")
            .arg(dir.path())
            .output();
        match out {
            Ok(o) if o.status.success() => Some(Tmpfs { dir }),
            Ok(o) => {
                skip_or_fail(&format!(
                    "a full filesystem needs a tmpfs mount (root): {}",
                    String::from_utf8_lossy(&o.stderr).trim()
                ));
                None
            }
            Err(e) => {
                skip_or_fail(&format!("a full filesystem needs mount(8): {e}"));
                None
            }
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    fn filler(&self) -> PathBuf {
        self.path().join("filler")
    }

    /// Fill the filesystem to its last byte (big writes, then small ones, until ENOSPC).
    pub fn fill(&self) {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.filler())
            .unwrap();
        for chunk in [1 << 20, 64 << 10, 4 << 10, 512, 1] {
            let buf = vec![0u8; chunk];
            loop {
                match f.write(&buf) {
                    Ok(n) if n == buf.len() => {}
                    Ok(_) => break,
                    Err(e) if e.raw_os_error() == Some(nix::libc::ENOSPC) => break,
                    Err(e) => panic!("filling the tmpfs: {e}"),
                }
            }
        }
        let st = nix::sys::statvfs::statvfs(self.path()).unwrap();
        assert_eq!(st.blocks_available(), 0, "the filesystem is full");
    }

    /// Give the space back.
    pub fn free(&self) {
        std::fs::remove_file(self.filler()).unwrap();
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazily, so a process of a failed test still holding a file cannot keep it.
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// `hookspool --home <home> <command>` on the [`Daemon`] wrapper.
pub struct Svc(Daemon);

impl std::ops::Deref for Svc {
    type Target = Daemon;
    fn deref(&self) -> &Daemon {
        &self.0
    }
}

impl std::ops::DerefMut for Svc {
    fn deref_mut(&mut self) -> &mut Daemon {
        &mut self.0
    }
}

impl Svc {
    pub fn start(home: &Path, command: &'static str, env: &[(&str, &str)]) -> Svc {
        let mut spec = Spec::new(home, &[command]);
        for (k, v) in env {
            spec = spec.env(k, v);
        }
        Svc(Daemon::start(spec))
    }

    /// SIGTERM, then the exit status.
    pub fn stop(self) -> std::process::ExitStatus {
        self.0.stop()
    }
}

/// A request signed for `wiring::run_config`'s source, or `None` when nothing listens.
fn post(addr: SocketAddr, body: &str) -> Option<Resp> {
    std::net::TcpStream::connect(addr).ok()?;
    let sig = format!(
        "sha256={}",
        mac_hex(MacAlg::Sha256, SOURCE_SECRET, &[body.as_bytes()])
    );
    let h = [
        ("X-Signature", sig.as_str()),
        ("Content-Type", "application/json"),
    ];
    Some(raw(addr, &request("POST", "/hooks/s", &h, body.as_bytes())))
}

/// Wait until something serves `addr` (after a start, or a start that waited for space).
fn wait_serving(addr: SocketAddr, svc: &mut Svc, within: Duration) {
    let until = Instant::now() + within;
    while std::net::TcpStream::connect(addr).is_err() {
        svc.assert_running("before serving");
        assert!(Instant::now() < until, "never served:\n{}", svc.log());
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// Documents the receiver has been sent for batches whose events carry `topic`.
fn delivered(rx: &Receiver, topic: &str) -> Vec<Value> {
    rx.requests()
        .iter()
        .map(|r| r.json())
        .filter(|d| d["events"][0]["topic"] == topic)
        .collect()
}

/// The `spool:full` issue as stored (any state), with whether a dry alert named it.
fn spool_full_issue(home: &Path) -> (Option<String>, bool) {
    let s = open(&home.join("spool.db"));
    let state = s
        .issue_by_fingerprint("spool:full")
        .unwrap()
        .map(|i| i.state);
    let alerted = s
        .dry_alerts()
        .unwrap()
        .iter()
        .any(|(_, _, text)| text.contains("spool:full"));
    (state, alerted)
}

/// The full-disk episode every test walks: `before` delivered, `held` finishing (at the
/// receiver) while the disk is full, `refused` answered 503 during the episode; after
/// space returns `held` is recorded without being delivered again, `refused` is taken on
/// its second try, and `spool:full` was recorded, alerted and is resolved.
async fn episode(
    fs: &Tmpfs,
    rx: &Receiver,
    addr: SocketAddr,
    svc: &mut Svc,
    round: &str,
) -> (Instant, Instant) {
    let home = fs.path();
    let topic = |t: &str| format!("{round}-{t}");
    let body = |t: &str| format!(r#"{{"topic":"{}"}}"#, topic(t));
    let r = tokio::task::block_in_place(|| post(addr, &body("before"))).expect("serving");
    assert_eq!(r.status, 200, "{:?}", r.json());
    let before = topic("before");
    tokio::task::block_in_place(|| {
        wait_until("the first delivery", Duration::from_secs(20), || {
            delivered(rx, &before).len() == 1
        })
    });
    // The next delivery is answered only after the disk has filled.
    let held = topic("held");
    let held_seen = held.clone();
    rx.set_rule(move |r| {
        (r.json()["events"][0]["topic"] == held_seen.as_str())
            .then(|| Answer::status(200).delay(Duration::from_millis(1500)))
    });
    let r = tokio::task::block_in_place(|| post(addr, &body("held"))).expect("serving");
    assert_eq!(r.status, 200);
    tokio::task::block_in_place(|| {
        wait_until(
            "the held delivery to arrive",
            Duration::from_secs(20),
            || delivered(rx, &held).len() == 1,
        )
    });
    let full_logged = svc.log().matches(FULL_LOG).count();
    fs.fill();
    let filled_at = Instant::now();
    let r = tokio::task::block_in_place(|| post(addr, &body("refused"))).expect("serving");
    assert_eq!(r.status, 503, "a full disk refuses: {:?}", r.json());
    // The held result comes back (1.5 s) and cannot be recorded; the dispatcher keeps
    // running through several of its backoff steps.
    tokio::task::block_in_place(|| {
        std::thread::sleep(Duration::from_secs(3));
        svc.assert_running("during the full-disk episode");
    });
    assert_eq!(
        open(&home.join("spool.db"))
            .list_batches(&BatchFilter {
                limit: 1000,
                ..Default::default()
            })
            .unwrap()
            .iter()
            .filter(|b| b.state.as_str() == "leased")
            .count(),
        1,
        "the held result is not recorded yet"
    );
    fs.free();
    let freed_at = Instant::now();
    let held_batch = delivered(rx, &held)[0]["batch_id"].as_i64().unwrap();
    tokio::task::block_in_place(|| {
        wait_until("the held result recorded", Duration::from_secs(20), || {
            open(&home.join("spool.db"))
                .batch(held_batch)
                .unwrap()
                .state
                .as_str()
                == "delivered"
        });
    });
    assert_eq!(
        delivered(rx, &held).len(),
        1,
        "kept in memory and recorded: not delivered again"
    );
    let refused = topic("refused");
    let r = tokio::task::block_in_place(|| post(addr, &body("refused"))).expect("serving");
    assert_eq!(r.status, 200, "space is back: {:?}", r.json());
    tokio::task::block_in_place(|| {
        wait_until(
            "delivery after the episode",
            Duration::from_secs(20),
            || delivered(rx, &refused).len() == 1,
        );
        wait_until("spool:full resolved", Duration::from_secs(20), || {
            spool_full_issue(home).0.as_deref() == Some("resolved")
        });
    });
    assert!(
        spool_full_issue(home).1,
        "the episode alerted (dry) before it resolved"
    );
    svc.assert_running("after the episode");
    assert_eq!(
        svc.log().matches(FULL_LOG).count(),
        full_logged + 1,
        "the episode was logged once:\n{}",
        svc.log()
    );
    let s = open(&home.join("spool.db"));
    assert_eq!(s.check_invariants().unwrap(), Vec::<String>::new());
    (filled_at, freed_at)
}

/// WATCHDOG=1 datagrams a service sends to a NOTIFY_SOCKET this collects, with when.
pub struct Watchdog {
    path: PathBuf,
    seen: Arc<Mutex<Vec<Instant>>>,
    _dir: tempfile::TempDir,
}

impl Watchdog {
    pub fn bind() -> Watchdog {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let sock = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
        let seen: Arc<Mutex<Vec<Instant>>> = Arc::default();
        let sink = seen.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = sock.recv(&mut buf) {
                if String::from_utf8_lossy(&buf[..n]).contains("WATCHDOG=1") {
                    sink.lock().unwrap().push(Instant::now());
                }
            }
        });
        Watchdog {
            path,
            seen,
            _dir: dir,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn pings_between(&self, from: Instant, to: Instant) -> usize {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|t| **t > from && **t < to)
            .count()
    }
}

/// The config `run` and the two services use, on a fresh tmpfs home.
fn home_on_tmpfs(fs: &Tmpfs, rx: &Receiver) -> (PathBuf, SocketAddr) {
    let home = fs.path().to_path_buf();
    let port = free_port();
    std::fs::write(
        home.join("config.toml"),
        super::wiring::run_config(&home, port, &rx.url(), ""),
    )
    .unwrap();
    (home, format!("127.0.0.1:{port}").parse().unwrap())
}

/// After a start that waited for space: the wait was an episode too, recorded by the
/// first write that succeeded, then resolved.
fn wait_start_episode_resolved(home: &Path) {
    wait_until("spool:full resolved", Duration::from_secs(20), || {
        let s = open(&home.join("spool.db"));
        s.issue_by_fingerprint("spool:full")
            .unwrap()
            .is_some_and(|i| i.state == "resolved")
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hookspool_run_survives_a_full_disk_and_resumes_when_space_returns() {
    let Some(fs) = Tmpfs::mount() else {
        return;
    };
    let rx = Receiver::start().await;
    let (home, addr) = home_on_tmpfs(&fs, &rx);
    let mut run = Svc::start(&home, "run", &[]);
    tokio::task::block_in_place(|| wait_serving(addr, &mut run, Duration::from_secs(30)));
    episode(&fs, &rx, addr, &mut run, "one").await;
    episode(&fs, &rx, addr, &mut run, "two").await;
    assert!(run.stop().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hookspool_run_started_on_a_full_disk_waits_for_space_then_serves_and_delivers() {
    let Some(fs) = Tmpfs::mount() else {
        return;
    };
    let rx = Receiver::start().await;
    let (home, addr) = home_on_tmpfs(&fs, &rx);
    // A first run creates the spool; its clean stop removes the `-shm` file, which no
    // connection can create again while there is no space.
    let mut run = Svc::start(&home, "run", &[]);
    tokio::task::block_in_place(|| wait_serving(addr, &mut run, Duration::from_secs(30)));
    assert!(run.stop().success());
    // SQLite removes it at a close that finds no other connection; `run`'s two halves close
    // theirs at about the same moment, and then each may see the other and leave it. With
    // no connection open it is only a cache SQLite rebuilds from the WAL, so the test
    // removes it: the start below is the one on a full disk with no `-shm` to reuse.
    let shm = home.join("spool.db-shm");
    if shm.exists() {
        std::fs::remove_file(&shm).unwrap();
    }
    fs.fill();
    let mut run = Svc::start(&home, "run", &[]);
    tokio::task::block_in_place(|| {
        std::thread::sleep(Duration::from_secs(3));
        run.assert_running("started on a full disk");
        // The dispatcher half waits to open the spool, and the intake half for it.
        run.wait_log(
            "opening and checking the spool deferred; retrying until the spool takes it",
            Duration::from_secs(20),
        );
    });
    fs.free();
    tokio::task::block_in_place(|| {
        run.wait_log("dispatcher ready", Duration::from_secs(20));
        wait_serving(addr, &mut run, Duration::from_secs(20));
        wait_start_episode_resolved(&home);
    });
    episode(&fs, &rx, addr, &mut run, "after").await;
    assert!(run.stop().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hookspool_dispatch_survives_a_full_disk_and_resumes_when_space_returns() {
    let Some(fs) = Tmpfs::mount() else {
        return;
    };
    let rx = Receiver::start().await;
    let (home, addr) = home_on_tmpfs(&fs, &rx);
    let watchdog = Watchdog::bind();
    let notify = watchdog.path.to_str().unwrap().to_string();
    let mut dispatch = Svc::start(&home, "dispatch", &[("NOTIFY_SOCKET", &notify)]);
    tokio::task::block_in_place(|| dispatch.wait_log("dispatcher ready", Duration::from_secs(30)));
    let mut intake = Svc::start(&home, "intake", &[]);
    tokio::task::block_in_place(|| wait_serving(addr, &mut intake, Duration::from_secs(30)));
    let (filled, freed) = episode(&fs, &rx, addr, &mut dispatch, "one").await;
    intake.assert_running("after the episode");
    // A full spool that still answers reads is weather, not a wedge: the watchdog is fed
    // while the result waits (a restart could not make space, and would lose the result).
    assert!(
        watchdog.pings_between(filled + Duration::from_millis(500), freed) > 0,
        "WATCHDOG=1 during the episode"
    );
    assert!(intake.stop().success());
    assert!(dispatch.stop().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hookspool_dispatch_started_on_a_full_disk_waits_for_space_instead_of_exiting() {
    let Some(fs) = Tmpfs::mount() else {
        return;
    };
    let rx = Receiver::start().await;
    let (home, addr) = home_on_tmpfs(&fs, &rx);
    let mut dispatch = Svc::start(&home, "dispatch", &[]);
    tokio::task::block_in_place(|| dispatch.wait_log("dispatcher ready", Duration::from_secs(30)));
    assert!(dispatch.stop().success());
    assert!(
        !home.join("spool.db-shm").exists(),
        "the last connection removed the -shm file"
    );
    // The first connection on a full disk cannot create the `-shm` file
    // (SQLITE_IOERR_SHMSIZE): that was exit 1.
    fs.fill();
    let mut dispatch = Svc::start(&home, "dispatch", &[]);
    tokio::task::block_in_place(|| {
        std::thread::sleep(Duration::from_secs(3));
        dispatch.assert_running("started on a full disk");
        dispatch.wait_log(
            "opening and checking the spool deferred",
            Duration::from_secs(20),
        );
    });
    fs.free();
    tokio::task::block_in_place(|| {
        dispatch.wait_log("dispatcher ready", Duration::from_secs(20));
        wait_start_episode_resolved(&home);
    });
    let mut intake = Svc::start(&home, "intake", &[]);
    tokio::task::block_in_place(|| wait_serving(addr, &mut intake, Duration::from_secs(30)));
    episode(&fs, &rx, addr, &mut dispatch, "after").await;
    assert!(intake.stop().success());
    assert!(dispatch.stop().success());
}

/// Leave about `left` bytes free on the tmpfs (one filler file written to size).
fn fill_leaving(fs: &Tmpfs, left: u64) {
    let st = nix::sys::statvfs::statvfs(fs.path()).unwrap();
    let free = st.blocks_available() * st.fragment_size();
    let f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(fs.filler())
        .unwrap();
    let mut w = std::io::BufWriter::new(f);
    let chunk = vec![0u8; 64 << 10];
    let mut todo = free.saturating_sub(left);
    while todo > 0 {
        let n = todo.min(chunk.len() as u64) as usize;
        w.write_all(&chunk[..n]).unwrap();
        todo -= n as u64;
    }
    w.flush().unwrap();
}

/// Issue 17: the free-space guard caches statvfs for 5 s, so a disk that fills faster was
/// overrun; and a write that failed for space answered 503 without Retry-After. The
/// writer reads free space for every commit group: right after the disk drops under
/// `limits.min_free_bytes` (a figure cached 5 s ago would still say there is room) the next
/// request is 503 with Retry-After, and once space is back it is taken at once. With the
/// guard off (`min_free_bytes = 0`) a write that fails on the full disk says Retry-After too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_writer_checks_free_space_for_each_group_and_a_full_write_says_retry_after() {
    let Some(fs) = Tmpfs::mount() else {
        return;
    };
    let rx = Receiver::start().await;
    let (home, addr) = home_on_tmpfs(&fs, &rx);
    let cfg = home.join("config.toml");
    let guarded = std::fs::read_to_string(&cfg).unwrap().replace(
        "min_free_bytes = 0",
        &format!("min_free_bytes = {}", 4 << 20),
    );
    std::fs::write(&cfg, &guarded).unwrap();
    let mut intake = Svc::start(&home, "intake", &[]);
    tokio::task::block_in_place(|| {
        wait_serving(addr, &mut intake, Duration::from_secs(30));
        // Plenty of room: taken, and the handler's cache now holds that figure for 5 s.
        let r = post(addr, r#"{"topic":"room"}"#).expect("serving");
        assert_eq!(r.status, 200, "{:?}", r.json());
        fill_leaving(&fs, 1 << 20);
        let t = Instant::now();
        let r = post(addr, r#"{"topic":"low"}"#).expect("serving");
        assert!(
            t.elapsed() < Duration::from_secs(4),
            "within the handler's cache interval"
        );
        assert_eq!(r.status, 503, "1 MiB free, 4 MiB required: {:?}", r.json());
        assert_eq!(r.json()["status"], "spool_full", "{:?}", r.json());
        assert_eq!(r.header("retry-after"), Some("60"));
        fs.free();
        let r = post(addr, r#"{"topic":"back"}"#).expect("serving");
        assert_eq!(r.status, 200, "space is back: {:?}", r.json());

        // The guard off: the write itself fails on the full disk, and says when to retry.
        let unguarded = guarded.replace(
            &format!("min_free_bytes = {}", 4 << 20),
            "min_free_bytes = 0",
        );
        std::fs::write(&cfg, &unguarded).unwrap();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(intake.child.id() as i32),
            nix::sys::signal::Signal::SIGHUP,
        )
        .unwrap();
        intake.wait_log("config reloaded", Duration::from_secs(10));
        fs.fill();
        let r = post(addr, r#"{"topic":"full"}"#).expect("serving");
        assert_eq!(r.status, 503, "a full disk: {:?}", r.json());
        assert_eq!(r.header("retry-after"), Some("60"), "{:?}", r.headers);
        fs.free();
        wait_until(
            "a write after space returns",
            Duration::from_secs(10),
            || post(addr, r#"{"topic":"after"}"#).is_some_and(|r| r.status == 200),
        );
        intake.assert_running("after the episode");
    });
    let s = open(&home.join("spool.db"));
    let topics: Vec<String> = s
        .list_batches(&BatchFilter {
            limit: 100,
            ..Default::default()
        })
        .unwrap()
        .iter()
        .map(|b| b.key.clone())
        .collect();
    for t in ["room", "back", "after"] {
        assert!(topics.iter().any(|k| k == t), "{t} was kept: {topics:?}");
    }
    for t in ["low", "full"] {
        assert!(
            !topics.iter().any(|k| k == t),
            "{t} was refused, not kept: {topics:?}"
        );
    }
    assert!(intake.stop().success());
}

/// Every unit's ExecStartPre is `hookspool check`: on a full disk where the spool's `-shm`
/// cannot be created (the services stopped cleanly, so SQLite removed it) check said
/// "no space left" as an error and exited 2, so neither service could start to wait the
/// episode out. It is weather: a warning, exit 0, and the config is still checked.
#[test]
fn check_on_a_full_disk_warns_and_lets_the_services_start() {
    let Some(fs) = Tmpfs::mount() else {
        return;
    };
    let home = fs.path().to_path_buf();
    std::fs::write(
        home.join("config.toml"),
        super::wiring::run_config(&home, free_port(), "http://127.0.0.1:9/", ""),
    )
    .unwrap();
    // check reads the destination's secret too: a real Standard Webhooks one.
    std::fs::write(
        home.join("dest.secret"),
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
    )
    .unwrap();
    drop(open(&home.join("spool.db")));
    assert!(
        !home.join("spool.db-shm").exists(),
        "a clean close removes the -shm"
    );
    fs.fill();
    let out = Command::new(bin())
        .arg("--home")
        .arg(&home)
        .arg("check")
        .env_remove("HOOKSPOOL_CONFIG")
        .env_remove("HOOKSPOOL_HOME")
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains("warning") && text.contains("no space left"),
        "the full disk is named as a warning: {text}"
    );
    fs.free();
}

/// A dispatcher SIGKILLed during or after a full-disk episode took its episode state with
/// it, and the `spool:full` it had recorded stayed open for good (the soak found it). The
/// next dispatcher adopts an open `spool:full`: once its writes commit and an alert pass
/// has run, it is resolved.
#[test]
fn a_spool_full_left_open_by_a_killed_dispatcher_is_resolved_by_the_next() {
    let rx_home = tempfile::tempdir().unwrap();
    let home = rx_home.path().to_path_buf();
    std::fs::write(
        home.join("config.toml"),
        super::wiring::run_config(&home, free_port(), "http://127.0.0.1:9/", ""),
    )
    .unwrap();
    {
        // What the killed dispatcher left: the issue open, nothing else.
        let mut s = open(&home.join("spool.db"));
        hookspool::observe::issues::spool_limit(&mut s, "full", true, Some("a test"), 1.0).unwrap();
        assert_eq!(spool_full_issue(&home).0.as_deref(), Some("open"));
    }
    let mut dispatch = Svc::start(&home, "dispatch", &[]);
    dispatch.wait_log("dispatcher ready", Duration::from_secs(30));
    wait_until("spool:full resolved", Duration::from_secs(20), || {
        spool_full_issue(&home).0.as_deref() == Some("resolved")
    });
    dispatch.assert_running("after resolving");
    assert!(dispatch.stop().success());
}
