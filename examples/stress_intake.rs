//! Bounded stress commands for the intake's hostile-sender faults (issue 17). Run through
//! `tests/stress/intake.sh`, or `cargo run --release --example stress_intake -- <mode>`
//! with mode one of:
//!
//! * `slow-bodies [conns] [body_bytes] [gap_ms]`: `conns` connections (default 2 000) each send a
//!   request head with `Content-Length: body_bytes` (default 97) and then the body one byte
//!   every `gap_ms` (default `SLOW_BODY_BYTE_MS`), all but the last byte; the intake's RSS is sampled while every
//!   body is held, then the last bytes go out (a wrong signature: 401, nothing is stored) and
//!   the connections close; RSS is sampled again after `SETTLE_S` and `SETTLE_LONG_S`. Prints the RSS before,
//!   held (and per body byte held) and after, and the answers. Fails when the RSS at
//!   `SETTLE_LONG_S` is more than `RSS_AFTER_MB_OVER_BASE_MAX` over the baseline.
//! * `idle-flood [idle] [slow] [seconds]`: `idle` connections (default 5 000) that send
//!   nothing and `slow` connections (default 500) that trickle a body, each reopened
//!   `FLOOD_RECONNECT_MS` after the intake closes it (an attacker keeping them open), then
//!   for `seconds` (default 15, so the flood meets the head and body deadlines) normal
//!   signed requests from `NORMAL_WORKERS` workers, each on a new connection (so each needs
//!   an accept), `NORMAL_PAUSE_MS` apart, timed from connect to the end of the answer. Prints p50, p99
//!   and max, the answers, how often the flood was closed by the intake, and the intake's
//!   open descriptors. Fails when p99 is not under `P99_MS_MAX` or a request failed.
//! * `body-starve [big] [small] [small_bytes] [seconds]` (issue 28): `big` connections
//!   (default 100) declare the largest body the source takes (`STARVE_MAX_BODY_BYTES`, 768 KiB)
//!   and `small` (default 800) declare `small_bytes` (default 1 000), each sending
//!   `STARVE_CHUNK_BYTES` every `STARVE_GAP_MS` and reopened `FLOOD_RECONNECT_MS` after the intake cuts it,
//!   together far more than the budget of unverified bodies (64 MiB). Meanwhile, for
//!   `seconds` (default 20), `NORMAL_WORKERS` workers send signed requests on new connections
//!   and one more sends them one after another. Prints the signed requests' answers, the
//!   share answered 2xx, p50/p99/max, how the flood was cut (by reason, from /metrics) and
//!   the intake's peak RSS. Fails when under `STARVE_OK_SHARE_MIN` were 2xx, p99 is not
//!   under `P99_MS_MAX`, or the peak RSS passes `STARVE_RSS_MB_MAX`. `body-starve 0 3000
//!   30000` spreads the same attack over many connections.
//! * `two-intakes [seconds] [conns]`: one intake alone, then two intakes on one spool, each fed by
//!   `conns` (default `LOAD_CONNS_PER_INTAKE`) keep-alive connections sending signed requests for `seconds`
//!   (default 10). Prints req/s and p50/p99 per intake and the split (slower / faster).
//!   Fails when the split is under `SPLIT_MIN`, or the two-intake p99 is over
//!   `TWO_INTAKE_P99_MS_MAX` or its p99.9 over `TWO_INTAKE_P999_MS_MAX`.
//!
//! Everything runs on 127.0.0.1 against the real release binary (next to this example, or
//! $HOOKSPOOL_BIN), socket-activated the way systemd starts it (LISTEN_FDS with a listener
//! whose backlog is SOMAXCONN, as the socket unit's default), on a real SQLite file in a
//! temporary home. Every phase has a time bound; the command stops by itself.

use std::io::Write as _;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hookspool::sources::verify::{MacAlg, mac_hex};
use nix::libc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const SECRET: &str = "stress-intake-secret";
/// The listener's backlog: systemd's socket units default to SOMAXCONN (4096).
const BACKLOG: i32 = 4096;
/// Gap between the bytes of a slow body.
const SLOW_BODY_BYTE_MS: u64 = 60;
/// Gap between the bytes a flood's slow connection sends.
const FLOOD_SLOW_BYTE_MS: u64 = 1000;
/// Body length a flood's slow connection declares.
const FLOOD_SLOW_BODY_BYTES: usize = 97;
/// A flood connection closed by the intake is reopened after this.
const FLOOD_RECONNECT_MS: u64 = 5;
/// How long the flood gets to open its connections before the measurement.
const FLOOD_RAMP_S_MAX: u64 = 30;
/// Normal requests in flight at once during the flood.
const NORMAL_WORKERS: usize = 4;
/// One normal request's bound (a request past it counts as failed).
const REQUEST_S_MAX: u64 = 10;
/// Each normal worker pauses this long between its requests (senders, not a load test).
const NORMAL_PAUSE_MS: u64 = 10;
/// The latency target of issue 17 for normal requests during the flood.
const P99_MS_MAX: f64 = 50.0;
/// Wait after the slow bodies close (or the flood stops) before the first RSS sample...
const SETTLE_S: u64 = 5;
/// ...and before the second: an allocator that returns memory on a timer (jemalloc's
/// 10 s dirty decay) gets a fair chance.
const SETTLE_LONG_S: u64 = 15;
/// The RSS after the slow bodies close may exceed the baseline by this much.
const RSS_AFTER_MB_OVER_BASE_MAX: f64 = 16.0;
/// `body-starve`: the largest body a source takes by default (the intake's 1 MiB cap, lowered to
/// the batch max_bytes), what a starving sender declares.
const STARVE_MAX_BODY_BYTES: usize = 768 * 1024;
/// `body-starve`: each starving connection sends this many bytes...
const STARVE_CHUNK_BYTES: usize = 8;
/// ...this often.
const STARVE_GAP_MS: u64 = 500;
/// `body-starve`: the share of signed requests that must be answered 2xx.
const STARVE_OK_SHARE_MIN: f64 = 0.99;
/// `body-starve`: the intake's peak RSS bound: the 64 MiB budget, the baseline, and what
/// 3 000 open connections hold besides their bodies (hyper's buffers, the tasks).
const STARVE_RSS_MB_MAX: f64 = 256.0;
/// Keep-alive connections per intake in `two-intakes`.
const LOAD_CONNS_PER_INTAKE: usize = 8;
/// The split of `two-intakes` (slower req/s / faster req/s) must be at least this.
const SPLIT_MIN: f64 = 0.5;
/// The p99 of either intake in `two-intakes` must be at most this...
const TWO_INTAKE_P99_MS_MAX: f64 = 50.0;
/// ...and its p99.9 at most this (SQLite's default busy handler sleeps 100 ms a try).
const TWO_INTAKE_P999_MS_MAX: f64 = 150.0;
/// How long an intake gets to start answering /healthz.
const START_S_MAX: u64 = 20;

fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mode = args.first().map(String::as_str).unwrap_or("");
    let num =
        |i: usize, d: usize| -> usize { args.get(i).and_then(|v| v.parse().ok()).unwrap_or(d) };
    raise_nofile();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let ok = match mode {
        "slow-bodies" => rt.block_on(slow_bodies(
            num(1, 2000),
            num(2, 97),
            num(3, SLOW_BODY_BYTE_MS as usize) as u64,
        ))?,
        "idle-flood" => rt.block_on(idle_flood(num(1, 5000), num(2, 500), num(3, 15) as u64))?,
        "body-starve" => rt.block_on(body_starve(
            num(1, 100),
            num(2, 800),
            num(3, 1000),
            num(4, 20) as u64,
        ))?,
        "two-intakes" => rt.block_on(two_intakes(
            num(1, 10) as u64,
            num(2, LOAD_CONNS_PER_INTAKE),
        ))?,
        _ => {
            eprintln!(
                "usage: stress_intake slow-bodies [conns] [body_bytes] [gap_ms] | idle-flood [idle] [slow] [seconds] | body-starve [big] [small] [small_bytes] [seconds] | two-intakes [seconds] [conns]"
            );
            std::process::exit(2);
        }
    };
    println!("verdict: {}", if ok { "PASS" } else { "FAIL" });
    std::process::exit(if ok { 0 } else { 1 });
}

/// This client holds thousands of sockets too.
fn raise_nofile() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((_, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    }
}

fn binary() -> PathBuf {
    if let Some(p) = std::env::var_os("HOOKSPOOL_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("current exe");
    // target/<profile>/examples/stress_intake -> target/<profile>/hookspool
    exe.parent()
        .and_then(Path::parent)
        .map(|d| d.join("hookspool"))
        .expect("target directory")
}

fn write_config(home: &Path) -> Result<(), BoxError> {
    write_config_with(home, 65536)
}

fn write_config_with(home: &Path, max_body_bytes: usize) -> Result<(), BoxError> {
    std::fs::write(home.join("secret"), SECRET)?;
    std::fs::write(
        home.join("config.toml"),
        format!(
            r#"
[intake]
listen = ["127.0.0.1:0"]

[limits]
min_free_bytes = 0

[sources.tpl]
type = "template"
scheme = "hmac-sha256-hex"
header = "X-Signature"
prefix = "sha256="
key = "payload.repo"
dedup = "header.X-Delivery-Id"
event_type = "header.X-Event"
action = "http-main"
span = "immediate"
max_body_bytes = {max_body_bytes}
secrets.secret = {{ file = "{home}/secret" }}

[destinations.http-main]
type = "http"
url = "https://main.invalid/hook"
secret = {{ file = "{home}/secret" }}
"#,
            home = home.display()
        ),
    )?;
    Ok(())
}

/// One real `hookspool intake`, socket-activated on its own listener.
struct Intake {
    child: Child,
    addr: SocketAddr,
}

impl Intake {
    fn start(home: &Path, log_name: &str) -> Result<Intake, BoxError> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        // A second listen() on Linux only changes the backlog.
        // SAFETY: a plain syscall on a socket we own.
        if unsafe { libc::listen(listener.as_raw_fd(), BACKLOG) } != 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        let addr = listener.local_addr()?;
        let fd = listener.as_raw_fd();
        let log = std::fs::File::create(home.join(log_name))?;
        let mut cmd = Command::new("/bin/sh");
        // $$ is the shell's pid, which exec keeps: LISTEN_PID names the intake itself.
        cmd.arg("-c")
            .arg("LISTEN_PID=$$; export LISTEN_PID; exec \"$0\" \"$@\"")
            .arg(binary())
            .arg("--home")
            .arg(home)
            .arg("intake")
            .env("LISTEN_FDS", "1")
            .env("LISTEN_FDNAMES", "http")
            .env_remove("HOOKSPOOL_CONFIG")
            .env_remove("HOOKSPOOL_HOME")
            .env_remove("NOTIFY_SOCKET")
            .env_remove("WATCHDOG_USEC")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log));
        // SAFETY: only dup2 between fork and exec (async-signal-safe).
        unsafe {
            cmd.pre_exec(move || {
                if libc::dup2(fd, 3) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn()?;
        drop(listener);
        let intake = Intake { child, addr };
        let deadline = Instant::now() + Duration::from_secs(START_S_MAX);
        while Instant::now() < deadline {
            if healthz_ok(addr) {
                return Ok(intake);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(format!("the intake did not serve within {START_S_MAX} s").into())
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Intake {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A blocking GET /healthz (the intake is starting; no runtime is needed).
fn healthz_ok(addr: SocketAddr) -> bool {
    use std::io::Read;
    let Ok(mut s) = std::net::TcpStream::connect(addr) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let mut buf = [0u8; 16];
    s.write_all(&get("/healthz")).is_ok()
        && s.read(&mut buf).is_ok()
        && buf.starts_with(b"HTTP/1.1 200")
}

/// A field of /proc/<pid>/status in MB (VmRSS, VmHWM).
fn status_mb(pid: u32, field: &str) -> f64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    text.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map(|kb| kb / 1024.0)
        .unwrap_or(f64::NAN)
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

fn sign(body: &[u8]) -> String {
    format!(
        "sha256={}",
        mac_hex(MacAlg::Sha256, SECRET.as_bytes(), &[body])
    )
}

fn head(path: &str, headers: &[(&str, &str)], len: usize, close: bool) -> Vec<u8> {
    let mut r = format!("POST {path} HTTP/1.1\r\nHost: hooks.test\r\nContent-Length: {len}\r\n");
    if close {
        r.push_str("Connection: close\r\n");
    }
    for (k, v) in headers {
        r.push_str(&format!("{k}: {v}\r\n"));
    }
    r.push_str("\r\n");
    r.into_bytes()
}

fn get(path: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: hooks.test\r\n\r\n").into_bytes()
}

/// A signed request for /hooks/tpl; `n` makes the delivery id and the key.
fn signed(n: u64, close: bool) -> Vec<u8> {
    let body = format!(
        r#"{{"repo":"r{}","n":{n},"pad":"{}"}}"#,
        n % 64,
        "x".repeat(200)
    );
    let sig = sign(body.as_bytes());
    let id = format!("d-{n}-{}", std::process::id());
    let mut out = head(
        "/hooks/tpl",
        &[
            ("X-Signature", &sig),
            ("X-Delivery-Id", &id),
            ("X-Event", "push"),
            ("Content-Type", "application/json"),
        ],
        body.len(),
        close,
    );
    out.extend_from_slice(body.as_bytes());
    out
}

/// Write a request and read one answer (head and Content-Length body): (status, bytes).
async fn exchange(s: &mut TcpStream, req: &[u8]) -> std::io::Result<(u16, usize)> {
    s.write_all(req).await?;
    read_answer(s).await
}

async fn read_answer(s: &mut TcpStream) -> std::io::Result<(u16, usize)> {
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 2048];
    loop {
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let text = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
        let status: u16 = text
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let len: usize = text
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        if buf.len() >= end + 4 + len {
            return Ok((status, buf.len()));
        }
    }
}

fn percentile(sorted_ms: &[f64], p: f64) -> f64 {
    if sorted_ms.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted_ms.len() as f64 - 1.0) * p).round() as usize;
    sorted_ms[i.min(sorted_ms.len() - 1)]
}

fn tally(statuses: &[u16]) -> String {
    let mut counts = std::collections::BTreeMap::new();
    for s in statuses {
        *counts.entry(*s).or_insert(0usize) += 1;
    }
    counts
        .iter()
        .map(|(s, n)| match s {
            0 => format!("failed={n}"),
            s => format!("{s}={n}"),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Send a few signed requests so the baseline RSS includes a warm intake.
async fn warm(addr: SocketAddr) -> Result<(), BoxError> {
    for n in 0..20 {
        let mut s = TcpStream::connect(addr).await?;
        exchange(&mut s, &signed(1_000_000 + n, true)).await?;
    }
    Ok(())
}

async fn slow_bodies(conns: usize, body_bytes: usize, gap_ms: u64) -> Result<bool, BoxError> {
    let home = tempfile::tempdir()?;
    write_config(home.path())?;
    let intake = Intake::start(home.path(), "intake.log")?;
    let pid = intake.pid();
    warm(intake.addr).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let base = status_mb(pid, "VmRSS");
    println!(
        "slow-bodies: {conns} connections, Content-Length {body_bytes}, one byte every {gap_ms} ms; intake pid {pid}, RSS before {base:.1} MB"
    );
    let started = Instant::now();
    // Everyone holds all but the last byte, then the main task samples, then all finish.
    let held = Arc::new(tokio::sync::Barrier::new(conns + 1));
    let finish = Arc::new(tokio::sync::Barrier::new(conns + 1));
    let mut tasks = Vec::with_capacity(conns);
    for c in 0..conns {
        let (held, finish, addr) = (held.clone(), finish.clone(), intake.addr);
        tasks.push(tokio::spawn(async move {
            let mut status = 0u16;
            let mut stream = TcpStream::connect(addr).await.ok();
            let id = format!("slow-{c}");
            // A wrong signature: the body is never verified, nothing is stored.
            let h = head(
                "/hooks/tpl",
                &[("X-Signature", "sha256=00"), ("X-Delivery-Id", &id)],
                body_bytes,
                true,
            );
            if let Some(s) = stream.as_mut()
                && s.write_all(&h).await.is_err()
            {
                stream = None;
            }
            for _ in 0..body_bytes.saturating_sub(1) {
                tokio::time::sleep(Duration::from_millis(gap_ms)).await;
                if let Some(s) = stream.as_mut()
                    && s.write_all(b"x").await.is_err()
                {
                    stream = None;
                }
            }
            held.wait().await;
            finish.wait().await;
            if let Some(s) = stream.as_mut()
                && s.write_all(b"x").await.is_ok()
                && let Ok(Ok((st, _))) =
                    tokio::time::timeout(Duration::from_secs(REQUEST_S_MAX), read_answer(s)).await
            {
                status = st;
            }
            status
        }));
    }
    held.wait().await;
    let held_rss = status_mb(pid, "VmRSS");
    let held_s = started.elapsed().as_secs_f64();
    finish.wait().await;
    let mut statuses = Vec::with_capacity(conns);
    for t in tasks {
        statuses.push(t.await.unwrap_or(0));
    }
    tokio::time::sleep(Duration::from_secs(SETTLE_S)).await;
    let after = status_mb(pid, "VmRSS");
    tokio::time::sleep(Duration::from_secs(SETTLE_LONG_S - SETTLE_S)).await;
    let after_long = status_mb(pid, "VmRSS");
    let hwm = status_mb(pid, "VmHWM");
    let body_held = (conns * body_bytes.saturating_sub(1)) as f64;
    println!(
        "slow-bodies: after {held_s:.1} s every body held: RSS {held_rss:.1} MB (+{:.2} KB per body byte held); peak (VmHWM) {hwm:.1} MB",
        (held_rss - base) * 1024.0 / body_held
    );
    println!("slow-bodies: answers: {}", tally(&statuses));
    println!(
        "slow-bodies: RSS after the connections closed: {after:.1} MB at {SETTLE_S} s ({:+.1} MB over the baseline), {after_long:.1} MB at {SETTLE_LONG_S} s ({:+.1} MB; bound {RSS_AFTER_MB_OVER_BASE_MAX} MB)",
        after - base,
        after_long - base
    );
    Ok(after_long - base <= RSS_AFTER_MB_OVER_BASE_MAX)
}

/// Counters of the flood.
#[derive(Default)]
struct Flood {
    open: AtomicUsize,
    opened: AtomicU64,
    closed_by_intake: AtomicU64,
    connect_failed: AtomicU64,
}

async fn flood_idle(addr: SocketAddr, f: Arc<Flood>, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Relaxed) {
        match TcpStream::connect(addr).await {
            Ok(mut s) => {
                f.opened.fetch_add(1, Ordering::Relaxed);
                f.open.fetch_add(1, Ordering::Relaxed);
                let mut b = [0u8; 64];
                loop {
                    tokio::select! {
                        r = s.read(&mut b) => {
                            if !matches!(r, Ok(n) if n > 0) {
                                f.closed_by_intake.fetch_add(1, Ordering::Relaxed);
                                break;
                            }
                        }
                        _ = tokio::time::sleep(Duration::from_millis(200)) => {
                            if stop.load(Ordering::Relaxed) { break; }
                        }
                    }
                }
                f.open.fetch_sub(1, Ordering::Relaxed);
            }
            Err(_) => {
                f.connect_failed.fetch_add(1, Ordering::Relaxed);
            }
        }
        tokio::time::sleep(Duration::from_millis(FLOOD_RECONNECT_MS)).await;
    }
}

async fn flood_slow(addr: SocketAddr, f: Arc<Flood>, stop: Arc<AtomicBool>) {
    flood_trickle(addr, FLOOD_SLOW_BODY_BYTES, 1, FLOOD_SLOW_BYTE_MS, f, stop).await
}

/// One normal request: (ms to the end of the answer, status (0: failed), s into the run it
/// started, ms to connect).
type Sample = (f64, u16, f64, f64);

/// Signed requests on new connections, `NORMAL_PAUSE_MS` apart, for `seconds`.
async fn normal_sender(
    addr: SocketAddr,
    next: Arc<AtomicU64>,
    measured: Instant,
    seconds: u64,
) -> Vec<Sample> {
    let mut out = Vec::new();
    while measured.elapsed() < Duration::from_secs(seconds) {
        let n = next.fetch_add(1, Ordering::Relaxed);
        let t = Instant::now();
        let r = tokio::time::timeout(Duration::from_secs(REQUEST_S_MAX), async {
            let mut s = TcpStream::connect(addr).await?;
            let connected = t.elapsed();
            exchange(&mut s, &signed(n, true))
                .await
                .map(|r| (r, connected))
        })
        .await;
        let (status, connect_ms) = match r {
            Ok(Ok(((st, _), c))) => (st, c.as_secs_f64() * 1000.0),
            _ => (0, f64::NAN),
        };
        let at_s = t.duration_since(measured).as_secs_f64();
        out.push((t.elapsed().as_secs_f64() * 1000.0, status, at_s, connect_ms));
        tokio::time::sleep(Duration::from_millis(NORMAL_PAUSE_MS)).await;
    }
    out
}

async fn idle_flood(idle: usize, slow: usize, seconds: u64) -> Result<bool, BoxError> {
    let home = tempfile::tempdir()?;
    write_config(home.path())?;
    let intake = Intake::start(home.path(), "intake.log")?;
    let (pid, addr) = (intake.pid(), intake.addr);
    warm(addr).await?;
    let base = status_mb(pid, "VmRSS");
    let flood = Arc::new(Flood::default());
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for i in 0..idle + slow {
        let (f, s) = (flood.clone(), stop.clone());
        tasks.push(match i < idle {
            true => tokio::spawn(flood_idle(addr, f, s)),
            false => tokio::spawn(flood_slow(addr, f, s)),
        });
        if i % 256 == 255 {
            // Let the accepts keep up with the ramp.
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let ramp = Instant::now();
    while flood.open.load(Ordering::Relaxed) < idle + slow
        && ramp.elapsed() < Duration::from_secs(FLOOD_RAMP_S_MAX)
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "idle-flood: {idle} idle + {slow} slow connections; {} open after {:.1} s; intake holds {} descriptors, RSS {:.1} MB (before {base:.1} MB)",
        flood.open.load(Ordering::Relaxed),
        ramp.elapsed().as_secs_f64(),
        open_fds(pid),
        status_mb(pid, "VmRSS"),
    );
    let closed_before = flood.closed_by_intake.load(Ordering::Relaxed);
    let measured = Instant::now();
    // The normal senders run on their own thread and runtime: the flood's thousands of
    // tasks must not delay them in this process, only in the intake.
    let results = std::thread::spawn(move || -> std::io::Result<Vec<Sample>> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(async move {
            let next = Arc::new(AtomicU64::new(0));
            let mut workers = Vec::new();
            for _ in 0..NORMAL_WORKERS {
                workers.push(tokio::spawn(normal_sender(
                    addr,
                    next.clone(),
                    measured,
                    seconds,
                )));
            }
            let mut results = Vec::new();
            for w in workers {
                results.extend(w.await.unwrap_or_default());
            }
            Ok(results)
        })
    })
    .join()
    .map_err(|_| "the normal senders' thread panicked")??;
    let secs = measured.elapsed().as_secs_f64();
    let during_open = flood.open.load(Ordering::Relaxed);
    let fds = open_fds(pid);
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.abort();
    }
    let mut ms: Vec<f64> = results.iter().map(|r| r.0).collect();
    ms.sort_by(f64::total_cmp);
    let statuses: Vec<u16> = results.iter().map(|r| r.1).collect();
    let (p50, p99) = (percentile(&ms, 0.5), percentile(&ms, 0.99));
    println!(
        "idle-flood: {} normal signed requests in {secs:.1} s ({NORMAL_WORKERS} at a time, a new connection each): p50 {p50:.1} ms, p99 {p99:.1} ms, max {:.1} ms; answers: {}",
        ms.len(),
        ms.last().copied().unwrap_or(f64::NAN),
        tally(&statuses)
    );
    println!(
        "idle-flood: during the measurement the intake closed {} flood connections ({} reopened in all, {} connects failed); {during_open} flood connections open at the end, intake descriptors {fds}, RSS {:.1} MB",
        flood.closed_by_intake.load(Ordering::Relaxed) - closed_before,
        flood.opened.load(Ordering::Relaxed),
        flood.connect_failed.load(Ordering::Relaxed),
        status_mb(pid, "VmRSS"),
    );
    tokio::time::sleep(Duration::from_secs(SETTLE_S)).await;
    let after = status_mb(pid, "VmRSS");
    tokio::time::sleep(Duration::from_secs(SETTLE_LONG_S - SETTLE_S)).await;
    let after_long = status_mb(pid, "VmRSS");
    println!(
        "idle-flood: RSS after the flood stopped: {after:.1} MB at {SETTLE_S} s ({:+.1} MB over the baseline), {after_long:.1} MB at {SETTLE_LONG_S} s ({:+.1} MB)",
        after - base,
        after_long - base
    );
    let mut slowest = results.clone();
    slowest.sort_by(|a, b| b.0.total_cmp(&a.0));
    println!(
        "idle-flood: the slowest (ms total / ms to connect @ s into the run): {}",
        slowest
            .iter()
            .take(8)
            .map(|r| format!("{:.0}/{:.0}@{:.2}", r.0, r.3, r.2))
            .collect::<Vec<_>>()
            .join(" ")
    );
    let all_ok = statuses.iter().all(|s| *s == 200);
    println!("idle-flood: p99 bound {P99_MS_MAX} ms; every request answered 200: {all_ok}");
    Ok(p99 < P99_MS_MAX && all_ok)
}

/// A body that never ends: declare `declared` bytes, send `chunk` bytes every `gap_ms`,
/// never the last one; reopen `FLOOD_RECONNECT_MS` after the intake ends it (an answer or a
/// close). The idle flood's slow connections and the starving senders.
async fn flood_trickle(
    addr: SocketAddr,
    declared: usize,
    chunk: usize,
    gap_ms: u64,
    f: Arc<Flood>,
    stop: Arc<AtomicBool>,
) {
    let bytes = vec![b'x'; chunk];
    while !stop.load(Ordering::Relaxed) {
        match TcpStream::connect(addr).await {
            Ok(mut s) => {
                f.opened.fetch_add(1, Ordering::Relaxed);
                f.open.fetch_add(1, Ordering::Relaxed);
                let h = head(
                    "/hooks/tpl",
                    &[("X-Signature", "sha256=00")],
                    declared,
                    true,
                );
                let mut alive = s.write_all(&h).await.is_ok();
                let mut sent = 0;
                let mut b = [0u8; 256];
                while alive && !stop.load(Ordering::Relaxed) {
                    if sent + chunk < declared {
                        alive = s.write_all(&bytes).await.is_ok();
                        sent += chunk;
                    }
                    tokio::select! {
                        // An answer or a close: either way the intake ended it.
                        r = s.read(&mut b) => {
                            let _ = r;
                            alive = false;
                        }
                        _ = tokio::time::sleep(Duration::from_millis(gap_ms)) => {}
                    }
                }
                if !stop.load(Ordering::Relaxed) {
                    f.closed_by_intake.fetch_add(1, Ordering::Relaxed);
                }
                f.open.fetch_sub(1, Ordering::Relaxed);
            }
            Err(_) => {
                f.connect_failed.fetch_add(1, Ordering::Relaxed);
            }
        }
        tokio::time::sleep(Duration::from_millis(FLOOD_RECONNECT_MS)).await;
    }
}

/// GET /metrics, the lines that start with `prefix`.
async fn metric_lines(addr: SocketAddr, prefix: &str) -> Vec<String> {
    let Ok(mut s) = TcpStream::connect(addr).await else {
        return Vec::new();
    };
    if s.write_all(&get("/metrics")).await.is_err() {
        return Vec::new();
    }
    let mut text = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(REQUEST_S_MAX), async {
        let mut chunk = [0u8; 8192];
        loop {
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    text.extend_from_slice(&chunk[..n]);
                    if String::from_utf8_lossy(&text)
                        .contains("hookspool_intake_unverified_bodies_evicted_total")
                    {
                        break;
                    }
                }
            }
        }
    })
    .await;
    String::from_utf8_lossy(&text)
        .lines()
        .filter(|l| l.starts_with(prefix))
        .map(str::to_string)
        .collect()
}

async fn body_starve(
    big: usize,
    small: usize,
    small_bytes: usize,
    seconds: u64,
) -> Result<bool, BoxError> {
    let home = tempfile::tempdir()?;
    write_config_with(home.path(), STARVE_MAX_BODY_BYTES)?;
    let intake = Intake::start(home.path(), "intake.log")?;
    let (pid, addr) = (intake.pid(), intake.addr);
    warm(addr).await?;
    let base = status_mb(pid, "VmRSS");
    let flood = Arc::new(Flood::default());
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for i in 0..big + small {
        let declared = if i < big {
            STARVE_MAX_BODY_BYTES
        } else {
            small_bytes
        };
        tasks.push(tokio::spawn(flood_trickle(
            addr,
            declared,
            STARVE_CHUNK_BYTES,
            STARVE_GAP_MS,
            flood.clone(),
            stop.clone(),
        )));
        if i % 256 == 255 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    // The flood gets a few seconds to fill the budget and settle into its reconnect cycle.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let demand_mb = (big * STARVE_MAX_BODY_BYTES + small * small_bytes) as f64 / 1048576.0;
    println!(
        "body-starve: {big} connections declaring {STARVE_MAX_BODY_BYTES} bytes + {small} declaring {small_bytes}, {STARVE_CHUNK_BYTES} bytes every {STARVE_GAP_MS} ms, reopened when cut ({demand_mb:.0} MiB declared against the 64 MiB budget); {} open, RSS {:.1} MB (before {base:.1} MB)",
        flood.open.load(Ordering::Relaxed),
        status_mb(pid, "VmRSS"),
    );
    let closed_before = flood.closed_by_intake.load(Ordering::Relaxed);
    let measured = Instant::now();
    let results = std::thread::spawn(move || -> std::io::Result<(Vec<Sample>, Vec<Sample>)> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(async move {
            let next = Arc::new(AtomicU64::new(0));
            let mut workers = Vec::new();
            for _ in 0..=NORMAL_WORKERS {
                workers.push(tokio::spawn(normal_sender(
                    addr,
                    next.clone(),
                    measured,
                    seconds,
                )));
            }
            let mut concurrent = Vec::new();
            let mut sequential = Vec::new();
            for (n, w) in workers.into_iter().enumerate() {
                let r = w.await.unwrap_or_default();
                match n < NORMAL_WORKERS {
                    true => concurrent.extend(r),
                    false => sequential.extend(r),
                }
            }
            Ok((concurrent, sequential))
        })
    })
    .join()
    .map_err(|_| "the signed senders' thread panicked")??;
    let cut = flood.closed_by_intake.load(Ordering::Relaxed) - closed_before;
    let held = metric_lines(addr, "hookspool_intake_unverified_body").await;
    let reasons = metric_lines(addr, "hookspool_requests_rejected_total").await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.abort();
    }
    let hwm = status_mb(pid, "VmHWM");
    let mut ok = true;
    for (label, r) in [
        (format!("{NORMAL_WORKERS} concurrent senders"), &results.0),
        ("one sequential sender".to_string(), &results.1),
    ] {
        let mut ms: Vec<f64> = r.iter().map(|s| s.0).collect();
        ms.sort_by(f64::total_cmp);
        let statuses: Vec<u16> = r.iter().map(|s| s.1).collect();
        let good = statuses.iter().filter(|s| (200..300).contains(*s)).count();
        let share = good as f64 / statuses.len().max(1) as f64;
        let p99 = percentile(&ms, 0.99);
        println!(
            "body-starve: {label}: {} signed requests, {:.2} % 2xx; p50 {:.1} ms, p99 {p99:.1} ms, max {:.1} ms; answers: {}",
            statuses.len(),
            share * 100.0,
            percentile(&ms, 0.5),
            ms.last().copied().unwrap_or(f64::NAN),
            tally(&statuses)
        );
        ok &= share >= STARVE_OK_SHARE_MIN && p99 < P99_MS_MAX && !statuses.is_empty();
    }
    println!(
        "body-starve: in {:.1} s the intake cut {cut} starving connections; {}",
        measured.elapsed().as_secs_f64(),
        held.join(", ")
    );
    println!("body-starve: rejections: {}", reasons.join(", "));
    println!(
        "body-starve: peak RSS (VmHWM) {hwm:.1} MB (bound {STARVE_RSS_MB_MAX} MB); bounds: >= {:.0} % 2xx and p99 < {P99_MS_MAX} ms for each sender",
        STARVE_OK_SHARE_MIN * 100.0
    );
    Ok(ok && hwm <= STARVE_RSS_MB_MAX)
}

/// Per-intake load figures.
struct Load {
    ok: usize,
    other: usize,
    p50: f64,
    p99: f64,
    p999: f64,
    max: f64,
    rate: f64,
}

async fn load(addr: SocketAddr, seconds: u64, conns: usize, seed: u64) -> Load {
    let until = Instant::now() + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for c in 0..conns {
        tasks.push(tokio::spawn(async move {
            let mut out: Vec<(f64, u16)> = Vec::new();
            let mut n = seed + (c as u64) * 10_000_000;
            let mut stream: Option<TcpStream> = None;
            while Instant::now() < until {
                let t = Instant::now();
                if stream.is_none() {
                    stream = TcpStream::connect(addr).await.ok();
                }
                let status = match stream.as_mut() {
                    Some(s) => match tokio::time::timeout(
                        Duration::from_secs(REQUEST_S_MAX),
                        exchange(s, &signed(n, false)),
                    )
                    .await
                    {
                        Ok(Ok((st, _))) => st,
                        _ => 0,
                    },
                    None => 0,
                };
                if status == 0 {
                    stream = None;
                }
                n += 1;
                out.push((t.elapsed().as_secs_f64() * 1000.0, status));
            }
            out
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap_or_default());
    }
    let mut ms: Vec<f64> = all.iter().map(|r| r.0).collect();
    ms.sort_by(f64::total_cmp);
    let ok = all.iter().filter(|r| r.1 == 200).count();
    Load {
        ok,
        other: all.len() - ok,
        p50: percentile(&ms, 0.5),
        p99: percentile(&ms, 0.99),
        p999: percentile(&ms, 0.999),
        max: ms.last().copied().unwrap_or(f64::NAN),
        rate: ok as f64 / seconds as f64,
    }
}

fn print_load(label: &str, l: &Load) {
    println!(
        "two-intakes: {label}: {:.0} req/s (200: {}, other: {}), p50 {:.1} ms, p99 {:.1} ms, p99.9 {:.1} ms, max {:.1} ms",
        l.rate, l.ok, l.other, l.p50, l.p99, l.p999, l.max
    );
}

async fn two_intakes(seconds: u64, conns: usize) -> Result<bool, BoxError> {
    println!("two-intakes: {conns} keep-alive connections per intake, {seconds} s per phase");
    let home = tempfile::tempdir()?;
    write_config(home.path())?;
    {
        let one = Intake::start(home.path(), "alone.log")?;
        let alone = load(one.addr, seconds, conns, 0).await;
        print_load("one intake alone", &alone);
    }
    let home = tempfile::tempdir()?;
    write_config(home.path())?;
    let a = Intake::start(home.path(), "a.log")?;
    let b = Intake::start(home.path(), "b.log")?;
    let (la, lb) = tokio::join!(
        load(a.addr, seconds, conns, 100_000_000_000),
        load(b.addr, seconds, conns, 200_000_000_000)
    );
    print_load("intake A of two on one spool", &la);
    print_load("intake B of two on one spool", &lb);
    let (lo, hi) = (la.rate.min(lb.rate), la.rate.max(lb.rate));
    let split = if hi > 0.0 { lo / hi } else { 0.0 };
    let p99 = la.p99.max(lb.p99);
    let p999 = la.p999.max(lb.p999);
    println!(
        "two-intakes: split {lo:.0} vs {hi:.0} req/s = {split:.2} (bound >= {SPLIT_MIN}); worst p99 {p99:.1} ms (bound <= {TWO_INTAKE_P99_MS_MAX} ms), worst p99.9 {p999:.1} ms (bound <= {TWO_INTAKE_P999_MS_MAX} ms); together {:.0} req/s",
        la.rate + lb.rate
    );
    let _ = std::io::stdout().flush();
    Ok(split >= SPLIT_MIN && p99 <= TWO_INTAKE_P99_MS_MAX && p999 <= TWO_INTAKE_P999_MS_MAX)
}
