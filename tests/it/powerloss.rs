//! Power loss: a cut at any point after the last fsync loses nothing that was acknowledged
//! and leaves a spool that opens and passes `PRAGMA integrity_check`.
//!
//! The real `hookspool intake` runs on a temp home under an LD_PRELOAD shim
//! (tests/powerloss/shim.c, compiled here with the machine's cc) that logs every write,
//! truncate, sync, creation, unlink and rename of the spool's files with their bytes. A load
//! client posts signed events and appends an ACK record to the same log on every 2xx, so
//! the log orders acknowledgements against finished syncs. The intake is then killed with
//! SIGKILL mid-load, by the shim itself while it holds its mutex (a byte on a FIFO), so no
//! write is on disk and not yet in the log when the process dies. The replayer (tests/powerloss/replay.rs) rebuilds, for many cut points,
//! the files a disk could hold (everything synced before the cut, plus none, all, or seeded
//! random subsets of the writes after each file's last sync, torn at sector boundaries);
//! each state is opened with rusqlite (integrity_check, every acknowledged id present) and a
//! sample of them with the real binary (`hookspool export`).
//!
//! Two planted faults prove the harness can fail: a replay that drops one synced WAL write,
//! and a run whose fsyncs are skipped (the shim's POWERLOSS_SKIP_SYNC, a build that acks
//! before its data is on disk). Both must be reported as loss.
//!
//! Knobs (environment): POWERLOSS_REQUESTS (events to send), POWERLOSS_CUTS (cut points
//! checked), POWERLOSS_RANDOM (random variants per cut), POWERLOSS_SEED.

#[path = "../powerloss/replay.rs"]
mod replay;

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hookspool::sources::verify::{MacAlg, mac_hex};
use replay::{Fault, Pending, Run};

const SECRET: &str = "powerloss-test-secret";
/// Load client threads: enough that the writer commits one group while the syncer syncs
/// the one before.
const CLIENTS: usize = 8;
/// Keys the events are spread over, so batches are joined as well as opened.
const KEYS: usize = 5;
/// The real binary opens every Nth state (rusqlite opens every one).
const BINARY_EVERY: usize = 10;

fn knob(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Compiles the shim, or says why it cannot (SKIPPED, or a failure under HOOKSPOOL_NO_SKIP).
fn shim(out: &Path) -> Option<PathBuf> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/powerloss/shim.c");
    let so = out.join("powerloss-shim.so");
    let built = Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-o"])
        .arg(&so)
        .arg(&src)
        .args(["-ldl", "-lpthread"])
        .output();
    let why = match built {
        Ok(o) if o.status.success() => return Some(so),
        Ok(o) => format!("cc failed: {}", String::from_utf8_lossy(&o.stderr)),
        Err(e) => format!("no C compiler (cc): {e}"),
    };
    super::skip::skip_or_fail(&format!("power-loss test: the shim cannot be built: {why}"));
    None
}

fn config(home: &Path, closed: u16, pipelined: bool) -> String {
    format!(
        r#"
[intake]
listen = ["127.0.0.1:0"]
pipelined_sync = {pipelined}

[limits]
min_free_bytes = 0

[sources.pl]
type = "template"
scheme = "hmac-sha256-hex"
header = "X-Signature"
prefix = "sha256="
key = "payload.k"
dedup = "payload.id"
action = "http-sink"
secrets.secret = {{ file = "{home}/secret" }}

# Nothing listens there: under `run` every delivery fails and retries, so the dispatcher
# writes claims, attempts and marks beside the intake's enqueues, and nothing is pruned.
[destinations.http-sink]
type = "http"
url = "http://127.0.0.1:{closed}/hook"
allow_insecure = true
allow_private = ["127.0.0.1/32"]
secret = {{ file = "{home}/secret" }}
"#,
        home = home.display()
    )
}

/// A loopback port nothing listens on (bound, then released).
fn closed_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap()
}

/// The intake under the shim, socket-activated on a listener of its own.
struct Intake {
    child: Child,
    addr: SocketAddr,
    /// The shim's kill FIFO (POWERLOSS_KILL_FIFO).
    kill_fifo: PathBuf,
}

impl Intake {
    fn start(
        home: &Path,
        shim: &Path,
        log: &Path,
        skip_sync: bool,
        command: &str,
        env: &[(&str, &str)],
    ) -> Intake {
        let stderr = home.parent().unwrap().join("intake.stderr");
        let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = tcp.local_addr().unwrap();
        let fd = tcp.as_raw_fd();
        let kill_fifo = home.parent().unwrap().join("kill.fifo");
        nix::unistd::mkfifo(&kill_fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let mut cmd = Command::new("/bin/sh");
        // $$ is the shell's pid, which exec keeps: LISTEN_PID names the intake itself.
        cmd.arg("-c")
            .arg("LISTEN_PID=$$; export LISTEN_PID; exec \"$0\" \"$@\"")
            .arg(super::bin())
            .arg("--home")
            .arg(home)
            .arg(command)
            .env("LISTEN_FDS", "1")
            .env("LISTEN_FDNAMES", "http")
            .env("LD_PRELOAD", shim)
            .env("POWERLOSS_LOG", log)
            .env("POWERLOSS_DIR", home)
            .env("POWERLOSS_KILL_FIFO", &kill_fifo)
            .env("POWERLOSS_SKIP_SYNC", if skip_sync { "1" } else { "0" })
            .env_remove("HOOKSPOOL_CONFIG")
            .env_remove("HOOKSPOOL_HOME")
            .env_remove("NOTIFY_SOCKET")
            .env_remove("WATCHDOG_USEC")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr).unwrap());
        // SAFETY: only dup2/close between fork and exec (async-signal-safe).
        unsafe {
            cmd.pre_exec(move || {
                use nix::libc;
                if libc::dup2(fd, 100) < 0 || libc::dup2(100, 3) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::close(100);
                Ok(())
            });
        }
        let child = cmd.spawn().expect("spawn hookspool intake");
        drop(tcp);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(resp) = exchange(
                addr,
                b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
            ) && resp.starts_with(b"HTTP/1.1")
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the intake never served: {}",
                std::fs::read_to_string(&stderr).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Intake {
            child,
            addr,
            kill_fifo,
        }
    }

    /// SIGKILL through the shim, which dies holding its mutex: a SIGKILL from here could
    /// land between a write and its log record, and the log would then miss a write the
    /// disk holds.
    fn kill(mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut fifo = loop {
            // Non-blocking: ENXIO while the shim's thread has not opened its end yet.
            match std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(nix::libc::O_NONBLOCK)
                .open(&self.kill_fifo)
            {
                Ok(f) => break f,
                Err(e) if Instant::now() < deadline => {
                    assert_eq!(e.raw_os_error(), Some(nix::libc::ENXIO), "{e}");
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => panic!("the shim never opened its kill FIFO: {e}"),
            }
        };
        fifo.write_all(b"k").unwrap();
        let status = self.child.wait().unwrap();
        assert!(
            super::killed(&status),
            "the intake was not killed: {status:?}"
        );
    }
}

fn exchange(addr: SocketAddr, req: &[u8]) -> Option<Vec<u8>> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    s.write_all(req).ok()?;
    let mut b = Vec::new();
    let _ = s.read_to_end(&mut b);
    Some(b)
}

fn post(addr: SocketAddr, body: &[u8]) -> Option<Vec<u8>> {
    let sig = format!(
        "sha256={}",
        mac_hex(MacAlg::Sha256, SECRET.as_bytes(), &[body])
    );
    let mut req = format!(
        "POST /hooks/pl HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Type: application/json\r\nX-Signature: {sig}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    req.extend_from_slice(body);
    exchange(addr, &req)
}

/// Runs the load and SIGKILLs the intake once `requests` events are acknowledged (the clients
/// keep sending, so the kill lands mid-request). Returns the acknowledged ids.
fn load(intake: Intake, log: &Path, requests: usize) -> usize {
    let acked = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let addr = intake.addr;
    let clients: Vec<_> = (0..CLIENTS)
        .map(|t| {
            let (acked, stop) = (acked.clone(), stop.clone());
            let mut ack_log = std::fs::OpenOptions::new()
                .append(true)
                .open(log)
                .expect("the shim created the log");
            std::thread::spawn(move || {
                let mut n = 0usize;
                while !stop.load(Ordering::SeqCst) {
                    n += 1;
                    let id = format!("ev-{t}-{n}");
                    // Bodies from a few hundred bytes to past one page, so some events take
                    // overflow pages.
                    let pad = "x".repeat((n * 797 + t * 131) % 6000);
                    let body = format!(r#"{{"id":"{id}","k":"key{}","pad":"{pad}"}}"#, n % KEYS);
                    let Some(resp) = post(addr, body.as_bytes()) else {
                        break;
                    };
                    if resp.starts_with(b"HTTP/1.1 2") {
                        // One write() per record on an O_APPEND file: whole, and after the
                        // sync that made the event durable.
                        ack_log
                            .write_all(&replay::ack_record(&id))
                            .expect("append an ACK record");
                        acked.fetch_add(1, Ordering::SeqCst);
                    } else if resp.is_empty() {
                        break;
                    }
                }
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    while acked.load(Ordering::SeqCst) < requests && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    intake.kill();
    stop.store(true, Ordering::SeqCst);
    for c in clients {
        c.join().unwrap();
    }
    acked.load(Ordering::SeqCst)
}

/// One run of the intake under the shim: its home, the log and the acknowledged count.
struct Recorded {
    _dir: tempfile::TempDir,
    home: PathBuf,
    run: Run,
    acked: usize,
}

/// `command` is `intake` (the intake alone) or `run` (intake and dispatcher in one process,
/// two writers on the spool).
fn record(
    requests: usize,
    skip_sync: bool,
    command: &str,
    pipelined: bool,
    env: &[(&str, &str)],
) -> Option<Recorded> {
    let dir = tempfile::tempdir().unwrap();
    let so = shim(dir.path())?;
    let home = dir.path().join("home");
    std::fs::create_dir(&home).unwrap();
    let home = home.canonicalize().unwrap();
    std::fs::write(home.join("secret"), SECRET).unwrap();
    std::fs::write(
        home.join("config.toml"),
        config(&home, closed_port(), pipelined),
    )
    .unwrap();
    let log = dir.path().join("ops.log");
    let intake = Intake::start(&home, &so, &log, skip_sync, command, env);
    let acked = load(intake, &log, requests);
    let bytes = std::fs::read(&log).unwrap();
    let run = replay::parse(&bytes).unwrap_or_else(|e| panic!("the op log: {e}"));
    Some(Recorded {
        home,
        run,
        acked,
        _dir: dir,
    })
}

/// What one state showed: the problems found (empty when it is sound).
fn check_state(
    files: &std::collections::BTreeMap<String, Vec<u8>>,
    acked: &[&str],
    with_binary: bool,
) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    for (name, content) in files {
        std::fs::write(dir.path().join(name), content).unwrap();
    }
    let db = dir.path().join("spool.db");
    let mut problems = Vec::new();
    if !db.exists() {
        if !acked.is_empty() {
            problems.push(format!("no spool.db, {} acknowledged", acked.len()));
        }
        return problems;
    }
    let stored: HashSet<String> = match rusqlite::Connection::open(&db) {
        Ok(conn) => {
            match conn.query_row("PRAGMA integrity_check", [], |r| r.get::<_, String>(0)) {
                Ok(ok) if ok == "ok" => {}
                Ok(other) => problems.push(format!("integrity_check: {other}")),
                Err(e) => problems.push(format!("integrity_check failed: {e}")),
            }
            let ids = conn
                .prepare("SELECT dedup_id FROM events WHERE dedup_id IS NOT NULL")
                .and_then(|mut s| {
                    s.query_map([], |r| r.get::<_, String>(0))?
                        .collect::<Result<HashSet<String>, _>>()
                });
            match ids {
                Ok(ids) => ids,
                // Before the schema exists there are no events; that is only a loss if
                // something was acknowledged.
                Err(e) => {
                    if !acked.is_empty() {
                        problems.push(format!("events unreadable: {e}"));
                    }
                    HashSet::new()
                }
            }
        }
        Err(e) => {
            problems.push(format!("does not open: {e}"));
            HashSet::new()
        }
    };
    let missing: Vec<&&str> = acked.iter().filter(|id| !stored.contains(**id)).collect();
    if !missing.is_empty() {
        problems.push(format!(
            "{} acknowledged events lost, e.g. {:?}",
            missing.len(),
            &missing[..missing.len().min(3)]
        ));
    }
    if with_binary && problems.is_empty() && !acked.is_empty() {
        let out = Command::new(super::bin())
            .arg("--home")
            .arg(dir.path())
            .arg("export")
            .env_remove("HOOKSPOOL_CONFIG")
            .env_remove("HOOKSPOOL_HOME")
            .output()
            .unwrap();
        if !out.status.success() {
            problems.push(format!(
                "hookspool export: {:?}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        } else {
            let mut exported = HashSet::new();
            for line in out.stdout.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
                match serde_json::from_slice::<serde_json::Value>(line) {
                    Ok(v) => dedup_ids(&v, &mut exported),
                    Err(e) => problems.push(format!("hookspool export: a line is not JSON: {e}")),
                }
            }
            if let Some(id) = acked.iter().find(|id| !exported.contains(**id)) {
                problems.push(format!("hookspool export does not list {id}"));
            }
        }
    }
    problems
}

/// Every string value of a `dedup_id` member, at any depth.
fn dedup_ids(v: &serde_json::Value, out: &mut HashSet<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                match (k.as_str(), x) {
                    ("dedup_id", serde_json::Value::String(s)) => {
                        out.insert(s.clone());
                    }
                    _ => dedup_ids(x, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|x| dedup_ids(x, out)),
        _ => {}
    }
}

/// Up to `n` cuts spread evenly over the candidates, always with the last one.
fn spread(candidates: &[usize], n: usize) -> Vec<usize> {
    if candidates.len() <= n || n < 2 {
        return candidates.to_vec();
    }
    let mut out: Vec<usize> = (0..n)
        .map(|i| candidates[i * (candidates.len() - 1) / (n - 1)])
        .collect();
    out.dedup();
    out
}

/// Summary of a sweep over cut points.
#[derive(Default, Debug)]
struct Sweep {
    cuts: usize,
    states: usize,
    torn_writes: usize,
    states_with_torn: usize,
    binary_opens: usize,
    /// Seconds spent building states and checking them.
    build_s: f64,
    check_s: f64,
    failures: Vec<String>,
}

fn sweep(r: &Recorded, cuts: &[usize], randoms: u64, seed: u64, fault: Fault) -> Sweep {
    let mut s = Sweep {
        cuts: cuts.len(),
        ..Sweep::default()
    };
    let binary_every = knob("POWERLOSS_BINARY_EVERY", BINARY_EVERY).max(1);
    for (ci, &cut) in cuts.iter().enumerate() {
        let acked = r.run.acked_before(cut);
        let mut variants = vec![Pending::None, Pending::All];
        variants.extend((0..randoms).map(|k| Pending::Random(seed ^ ((cut as u64) << 16) ^ k)));
        for pending in variants {
            let t = Instant::now();
            let state = r.run.state_at(cut, &pending, fault);
            s.build_s += t.elapsed().as_secs_f64();
            if fault != Fault::None && !state.fault_planted {
                continue;
            }
            let with_binary = s.states.is_multiple_of(binary_every);
            s.binary_opens += usize::from(with_binary && !acked.is_empty());
            s.states += 1;
            s.torn_writes += state.torn;
            s.states_with_torn += usize::from(state.torn > 0);
            let t = Instant::now();
            let problems = check_state(&state.files, &acked, with_binary);
            s.check_s += t.elapsed().as_secs_f64();
            for p in problems {
                s.failures.push(format!(
                    "cut {ci} (op {cut} of {}), {pending:?}: {p}",
                    r.run.evs.len()
                ));
            }
        }
    }
    s
}

fn seed() -> u64 {
    knob("POWERLOSS_SEED", 0x5eed_0017) as u64
}

/// `pipelined`: `intake.pipelined_sync` (COMMIT does not sync; the intake fdatasyncs the
/// WAL on its own descriptor and answers after that).
fn power_cuts(command: &str, pipelined: bool, requests: usize, cuts_max: usize, randoms: u64) {
    let Some(r) = record(requests, false, command, pipelined, &[]) else {
        return;
    };
    // Pipelined, the intake syncs the WAL itself (fdatasync, after COMMIT): the recorder
    // must see those syncs, or the sweep would test SQLite's syncs alone.
    let data_syncs = r.run.data_syncs_of("spool.db-wal");
    assert_eq!(
        data_syncs > 0,
        pipelined,
        "fdatasyncs of the WAL recorded: {}",
        r.run.summary()
    );
    assert!(
        r.acked >= requests,
        "only {} of {requests} acknowledged",
        r.acked
    );

    // The shim saw everything: the log replayed in full is the files on disk after SIGKILL.
    let full = r.run.state_at(r.run.evs.len(), &Pending::All, Fault::None);
    for (name, content) in &full.files {
        let disk = std::fs::read(r.home.join(name)).unwrap();
        let first = disk.iter().zip(content.iter()).position(|(a, b)| a != b);
        assert!(
            disk == *content,
            "{name}: the replayed log differs from the file on disk ({} bytes on disk, {} \
             replayed, first difference at {first:?})",
            disk.len(),
            content.len()
        );
    }
    assert!(full.files.contains_key("spool.db") && full.files.contains_key("spool.db-wal"));

    let candidates = r.run.candidate_cuts();
    let cuts = spread(&candidates, cuts_max);
    let syncs = r
        .run
        .evs
        .iter()
        .filter(|e| matches!(e, replay::Ev::FileSync { .. } | replay::Ev::DirSync))
        .count();
    let started = Instant::now();
    let s = sweep(&r, &cuts, randoms, seed(), Fault::None);
    eprintln!(
        "power loss: `hookspool {command}`, pipelined_sync = {pipelined}: {}",
        r.run.summary()
    );
    eprintln!(
        "power loss: {} ops, {syncs} syncs ({data_syncs} the intake's fdatasync of the WAL), {} acks; {} candidate cuts, {} cut points, {} states ({} with torn writes, {} torn writes), {} opened by the binary; seed {:#x}; {} failures; checked in {:.1} s ({:.1} s building states, {:.1} s opening them)",
        r.run.evs.len(),
        r.run.acks().len(),
        candidates.len(),
        s.cuts,
        s.states,
        s.states_with_torn,
        s.torn_writes,
        s.binary_opens,
        seed(),
        s.failures.len(),
        started.elapsed().as_secs_f64(),
        s.build_s,
        s.check_s
    );
    assert!(s.states_with_torn > 0, "no state had a torn write");
    assert!(
        s.failures.is_empty(),
        "power loss lost acknowledged events or corrupted the spool:\n{}",
        s.failures.join("\n")
    );
}

#[test]
fn a_power_cut_after_any_sync_loses_no_acknowledged_event() {
    power_cuts(
        "run",
        true,
        knob("POWERLOSS_REQUESTS", 400),
        knob("POWERLOSS_CUTS", 100),
        knob("POWERLOSS_RANDOM", 2) as u64,
    );
}

#[test]
#[ignore = "minutes: .ci/run runs it, bounded by POWERLOSS_CUTS; `intake` and `run`, with and without pipelined_sync"]
fn a_power_cut_after_any_sync_loses_no_acknowledged_event_long() {
    for (command, pipelined) in [
        ("intake", true),
        ("run", true),
        ("intake", false),
        ("run", false),
    ] {
        power_cuts(
            command,
            pipelined,
            knob("POWERLOSS_REQUESTS", 2000),
            knob("POWERLOSS_CUTS", 600),
            knob("POWERLOSS_RANDOM", 4) as u64,
        );
    }
}

#[test]
fn the_power_loss_harness_reports_planted_faults() {
    // A replay that drops one synced WAL write loses what that write committed.
    let Some(r) = record(60, false, "intake", true, &[]) else {
        return;
    };
    let after_acks: Vec<usize> = r.run.acks().iter().map(|(i, _)| i + 1).collect();
    let cuts = spread(&after_acks, 20);
    let s = sweep(&r, &cuts, 0, seed(), Fault::DropLastSyncedWalWrite);
    assert!(s.states > 0, "the fault was never planted");
    assert!(
        !s.failures.is_empty(),
        "dropping a synced WAL write went unnoticed in {} states",
        s.states
    );
    eprintln!(
        "planted fault (one synced WAL write dropped): {} of {} states reported",
        s.failures.len(),
        s.states
    );

    // A build that answers right after COMMIT, before the sync that covers the group
    // (the writer's planted fault: the syncer then syncs 20 ms late), loses events that it
    // acknowledged: the sweep over the cuts right after its acks must say so.
    let Some(r) = record(
        60,
        false,
        "intake",
        true,
        &[("HOOKSPOOL_TEST_ACK_BEFORE_SYNC_MS", "20")],
    ) else {
        return;
    };
    let after_acks: Vec<usize> = r.run.acks().iter().map(|(i, _)| i + 1).collect();
    let s = sweep(&r, &spread(&after_acks, 20), 1, seed(), Fault::None);
    assert!(
        s.failures.iter().any(|f| f.contains("lost")),
        "acknowledging before the covering sync went unnoticed in {} states",
        s.states
    );
    eprintln!(
        "planted fault (acknowledged before the covering fdatasync): {} of {} states reported, e.g. {}",
        s.failures.len(),
        s.states,
        s.failures[0]
    );

    // A build whose syncs do nothing (it acks before its data is on disk) loses events.
    let Some(r) = record(60, true, "intake", true, &[]) else {
        return;
    };
    let end = r.run.evs.len();
    let state = r.run.state_at(end, &Pending::None, Fault::None);
    let problems = check_state(&state.files, &r.run.acked_before(end), false);
    assert!(
        problems
            .iter()
            .any(|p| p.contains("lost") || p.contains("no spool.db")),
        "skipped fsyncs went unnoticed: {problems:?}"
    );
    eprintln!("planted fault (fsync skipped): {problems:?}");
}
