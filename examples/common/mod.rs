//! What the benchmark examples share: the binary under test, a real HTTP receiver, signed
//! requests, percentiles, and the `FIGURE` lines `bench/run.sh` turns into its table.
//!
//! Every benchmark prints human lines as it goes and, for each figure it measured, one
//! machine line `FIGURE <name> <value>` (the value a plain number in the unit its name
//! ends with). `bench/run.sh` collects those lines; nothing parses the human ones.

#![allow(dead_code)] // each example uses a different part of this module

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

use hookspool::config::{self, Config, PathInputs};
use hookspool::sources::verify::{MacAlg, mac_hex};

/// The tests' throwaway PostgreSQL cluster (tests/support/pg.rs), for the benchmarks'
/// PostgreSQL rows.
#[path = "../../tests/support/pg.rs"]
pub mod pg;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The secret the benchmark sources verify with (HMAC-SHA256 over the body).
pub const SOURCE_SECRET: &str = "bench-source-secret";
/// How long a started `hookspool` may take to serve /healthz.
pub const READY_S_MAX: u64 = 30;

/// Print one figure for `bench/run.sh` (see the module comment).
pub fn figure(name: &str, value: f64) {
    println!("FIGURE {name} {value}");
}

/// `--smoke` anywhere in the arguments: tiny counts, a few seconds, every figure printed.
/// Returns the remaining arguments.
pub fn smoke_flag() -> (bool, Vec<String>) {
    let mut smoke = false;
    let rest = std::env::args()
        .skip(1)
        .filter(|a| {
            let s = a == "--smoke";
            smoke |= s;
            !s
        })
        .collect();
    (smoke, rest)
}

/// The `hookspool` binary under test: $HOOKSPOOL_BIN, else the one built beside this
/// example (target/<profile>/examples/<name> -> target/<profile>/hookspool).
pub fn binary() -> Result<PathBuf, BoxError> {
    if let Some(p) = std::env::var_os("HOOKSPOOL_BIN") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe()?;
    exe.parent()
        .and_then(Path::parent)
        .map(|d| d.join("hookspool"))
        .ok_or_else(|| "no target directory above this example".into())
}

/// Start `hookspool <command>` on `home`, its stderr in `<home>/<command>.log`.
pub fn spawn_hookspool(home: &Path, command: &str) -> Result<Child, BoxError> {
    spawn_binary(&binary()?, home, command)
}

/// `spawn_hookspool` with a given binary (`bench_intake pair`: today's and this build's).
pub fn spawn_binary(bin: &Path, home: &Path, command: &str) -> Result<Child, BoxError> {
    let log = std::fs::File::create(home.join(format!("{command}.log")))?;
    Ok(Command::new(bin)
        .arg("--home")
        .arg(home)
        .arg(command)
        .env_remove("HOOKSPOOL_CONFIG")
        .env_remove("NOTIFY_SOCKET")
        .env_remove("JOURNAL_STREAM")
        .env("HOOKSPOOL_LOG_LEVEL", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()?)
}

/// SIGTERM and wait: the process's own shutdown path.
pub fn stop(mut child: Child) -> Result<std::process::ExitStatus, BoxError> {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )?;
    Ok(child.wait()?)
}

/// A free loopback port (bound, read, released; the child binds it right after).
pub fn free_port() -> Result<u16, BoxError> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Wait until `base`/healthz answers at all.
pub async fn wait_served(client: &reqwest::Client, base: &str) -> Result<(), BoxError> {
    let ready_by = Instant::now() + Duration::from_secs(READY_S_MAX);
    while client.get(format!("{base}/healthz")).send().await.is_err() {
        if Instant::now() > ready_by {
            return Err(format!("hookspool never served {base}").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// The value of the signature header the benchmark sources check.
pub fn sign(body: &[u8]) -> String {
    format!(
        "sha256={}",
        mac_hex(MacAlg::Sha256, SOURCE_SECRET.as_bytes(), &[body])
    )
}

/// Write the source secret and an http destination secret (Standard Webhooks: `whsec_` and
/// base64 of 32 random bytes) into `home`.
pub fn write_secrets(home: &Path) -> std::io::Result<()> {
    use base64::Engine as _;
    std::fs::write(home.join("source.secret"), SOURCE_SECRET)?;
    let key: [u8; 32] = rand::random();
    std::fs::write(
        home.join("dest.secret"),
        format!(
            "whsec_{}",
            base64::engine::general_purpose::STANDARD.encode(key)
        ),
    )
}

/// A template source signed with `SOURCE_SECRET`, keyed by `payload.topic`; `extra` lines
/// (a span, a window, `dedup = "payload.id"`) go inside its table.
pub fn source_toml(name: &str, home: &Path, extra: &str) -> String {
    format!(
        r#"
[sources.{name}]
type = "template"
scheme = "hmac-sha256-hex"
header = "X-Signature"
prefix = "sha256="
key = "payload.topic"
action = "http-recv"
secrets.secret = {{ file = "{home}/source.secret" }}
{extra}
"#,
        home = home.display()
    )
}

/// The dispatcher's slots in every benchmark: `dispatch.parallel` and the destination's
/// `max_inflight`.
pub const SLOTS: usize = 16;

/// The http destination every benchmark delivers to, with [`SLOTS`] requests in flight.
pub fn destination_toml(url: &str, home: &Path) -> String {
    destination_toml_slots(url, home, SLOTS)
}

/// The http destination with `slots` requests in flight.
pub fn destination_toml_slots(url: &str, home: &Path, slots: usize) -> String {
    format!(
        r#"
[destinations.http-recv]
type = "http"
url = "{url}"
allow_insecure = true
allow_private = ["127.0.0.1/32"]
max_inflight = {slots}
timeout_s = 10
secret = {{ file = "{home}/dest.secret" }}
"#,
        home = home.display()
    )
}

/// The validated config of `home`, as the binary would load it.
pub fn load(home: &Path) -> Result<Config, BoxError> {
    let inputs = PathInputs {
        home_flag: Some(home.to_path_buf()),
        ..Default::default()
    };
    config::load(&inputs, false)
        .map(|(c, _)| c)
        .map_err(|e| format!("{e}").into())
}

pub fn now_unix() -> f64 {
    hookspool::clock::Clock::now(&*hookspool::clock::system())
}

/// A receiver answering 200 to everything, on a real loopback socket; every arrival goes to
/// `arrivals` with its time.
pub struct Receiver {
    pub addr: SocketAddr,
    pub count: Arc<AtomicUsize>,
}

pub type Arrival = (Instant, Vec<u8>);

pub async fn receiver(
    arrivals: Option<tokio::sync::mpsc::UnboundedSender<Arrival>>,
) -> Result<Receiver, BoxError> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let count = Arc::new(AtomicUsize::new(0));
    let c = count.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            let c = c.clone();
            let arrivals = arrivals.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<Incoming>| {
                    let c = c.clone();
                    let arrivals = arrivals.clone();
                    async move {
                        let body = req
                            .into_body()
                            .collect()
                            .await
                            .map(|b| b.to_bytes().to_vec())
                            .unwrap_or_default();
                        let at = Instant::now();
                        c.fetch_add(1, Ordering::SeqCst);
                        if let Some(tx) = &arrivals {
                            let _ = tx.send((at, body));
                        }
                        Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    Ok(Receiver { addr, count })
}

/// Nearest-rank percentile of sorted values.
pub fn pct(sorted: &[f64], p: f64) -> f64 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

/// The arithmetic mean.
pub fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

/// Sort `v` and describe it in milliseconds.
pub fn stats_ms(v: &mut [f64]) -> String {
    v.sort_by(f64::total_cmp);
    let mean = mean(v);
    format!(
        "mean {mean:.3} ms   p50 {:.3} ms   p99 {:.3} ms   max {:.3} ms",
        pct(v, 50.0),
        pct(v, 99.0),
        v[v.len() - 1]
    )
}

/// Batch counts per state, read through the store.
pub fn counts(store: &hookspool::store::Store) -> Result<BTreeMap<String, i64>, BoxError> {
    Ok(store
        .batch_counts()?
        .into_iter()
        .map(|(s, n)| (s.to_string(), n))
        .collect())
}

/// Peak resident memory (VmHWM) of a process, in MiB.
pub fn peak_rss_mib(pid: u32) -> Result<f64, BoxError> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .ok_or("no VmHWM in /proc status")?;
    Ok(kib / 1024.0)
}

/// CPU seconds (user + system) used so far by each thread of `pid`, by thread name.
pub fn thread_cpu_s(pid: u32) -> Result<BTreeMap<String, f64>, BoxError> {
    // Clock ticks per second of /proc's utime and stime; 100 on every Linux we ship to.
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)?.unwrap_or(100) as f64;
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let Ok(stat) = std::fs::read_to_string(entry?.path().join("stat")) else {
            continue; // the thread ended meanwhile
        };
        // "tid (comm) state ppid ...": comm may hold spaces, so split at the last ')'.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let name = stat[open + 1..close].to_string();
        let fields: Vec<&str> = stat[close + 2..].split_whitespace().collect();
        // utime and stime are fields 14 and 15 of stat(5), 12 and 13 after "state".
        let cpu = match (fields.get(11), fields.get(12)) {
            (Some(u), Some(s)) => (u.parse::<f64>()? + s.parse::<f64>()?) / ticks,
            _ => continue,
        };
        *out.entry(name).or_insert(0.0) += cpu;
    }
    Ok(out)
}

/// CPU seconds (user + system) a PostgreSQL cluster's server processes have used so far:
/// the postmaster (`Cluster::pid`) and every process it started (backends, checkpointer,
/// WAL writer, autovacuum), from /proc/<pid>/stat. A child that has ended and been reaped
/// is in the postmaster's cutime/cstime, so a backend whose connection closed meanwhile is
/// still counted; take the difference of two readings.
pub fn pg_server_cpu_s(postmaster: i32) -> Result<f64, BoxError> {
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)?.unwrap_or(100) as f64;
    let mut total = 0.0;
    for entry in std::fs::read_dir("/proc")? {
        let entry = entry?;
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue; // ended meanwhile
        };
        let Some(close) = stat.rfind(')') else {
            continue;
        };
        // After "(comm) ": state, ppid, ... utime, stime, cutime, cstime (fields 14-17).
        let f: Vec<&str> = stat[close + 2..].split_whitespace().collect();
        let ppid: i32 = f.get(1).and_then(|v| v.parse().ok()).unwrap_or(0);
        if pid != postmaster && ppid != postmaster {
            continue;
        }
        let field = |i: usize| -> f64 { f.get(i).and_then(|v| v.parse().ok()).unwrap_or(0.0) };
        total += (field(11) + field(12) + field(13) + field(14)) / ticks;
    }
    Ok(total)
}

/// A fresh database on `cluster` for one benchmark run, its URL written into a 0600 file
/// `<home>/pg-url`, and the `[spool]` section a config needs to use it.
pub fn pg_spool(
    cluster: &pg::Cluster,
    db: &str,
    home: &Path,
) -> Result<(String, String), BoxError> {
    use std::os::unix::fs::PermissionsExt;
    let url = cluster.database(db);
    let file = home.join("pg-url");
    std::fs::write(&file, format!("{url}\n"))?;
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600))?;
    let section = format!(
        "\n[spool]\nbackend = \"postgres\"\nurl = {{ file = \"{}\" }}\n",
        file.display()
    );
    Ok((url, section))
}

/// A plain client on a benchmark's PostgreSQL database, for measurement only (counting the
/// rows a run wrote, bulk-writing history): the services under test use the store.
pub fn pg_client(url: &str) -> Result<postgres::Client, BoxError> {
    Ok(postgres::Client::connect(url, postgres::NoTls)?)
}

/// The bytes process `pid` has sent to the storage layer so far (`write_bytes` of
/// /proc/<pid>/io: pages it dirtied in the page cache, counted once each until written back,
/// so a WAL frame is counted once and a socket write not at all).
pub fn write_bytes(pid: u32) -> Result<u64, BoxError> {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io"))?;
    let line = io
        .lines()
        .find_map(|l| l.strip_prefix("write_bytes:"))
        .ok_or("no write_bytes in /proc/<pid>/io")?;
    Ok(line.trim().parse()?)
}

/// The bytes of one probe write: a page, the unit SQLite writes its WAL frames in.
pub const PROBE_WRITE_BYTES: usize = 4096;
/// The preallocated file the probe's overwrites cycle through.
pub const PROBE_FILE_BYTES: usize = 1 << 20;
/// How long a probe beside a benchmark run lasts.
pub const PROBE_S: f64 = 1.0;

/// fdatasync calls per second, each after one 4 KiB write that overwrites a preallocated
/// file in turn (as SQLite's WAL is overwritten from its start once a checkpoint has reset
/// it), in a fresh directory under $TMPDIR: the filesystem of the benchmark spools.
pub fn fdatasync_per_s(seconds: f64) -> Result<f64, BoxError> {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir()?;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(dir.path().join("probe.bin"))?;
    file.write_all_at(&vec![0u8; PROBE_FILE_BYTES], 0)?;
    file.sync_all()?;
    let page = vec![0x5au8; PROBE_WRITE_BYTES];
    let slots = (PROBE_FILE_BYTES / PROBE_WRITE_BYTES) as u64;
    let t = Instant::now();
    let mut n = 0u64;
    while t.elapsed().as_secs_f64() < seconds {
        file.write_all_at(&page, (n % slots) * PROBE_WRITE_BYTES as u64)?;
        file.sync_data()?;
        n += 1;
    }
    Ok(n as f64 / t.elapsed().as_secs_f64())
}

/// The disk's rate around a benchmark run: probes just before and just after it. The disk
/// of a shared machine moves by 10x within a minute, so a ratio is taken against the
/// faster of the two (the stricter ratio), and both are printed.
pub struct DiskAround {
    pub before: f64,
    pub after: f64,
}

impl DiskAround {
    pub fn max(&self) -> f64 {
        self.before.max(self.after)
    }

    pub fn describe(&self) -> String {
        format!(
            "disk fdatasync/s around the run: {:.0} before, {:.0} after",
            self.before, self.after
        )
    }
}

/// Processes this benchmark has recorded (`Profiler`).
static PROFILES: AtomicUsize = AtomicUsize::new(0);

/// `perf record` on a process while a benchmark loads it, when $BENCH_PERF_OUT names the
/// output file (`bench/intake.sh --profile`, `bench/dispatch.sh --profile`). The VMs we
/// measure on have no hardware counters, so it samples the cpu-clock software event, with
/// DWARF call graphs (release builds keep no frame pointers). A benchmark that loads
/// several processes (`bench_dispatch backlog`: five drains) records the first into the
/// file named and each later one into that name with `.2`, `.3`, ... appended.
pub struct Profiler(Option<Child>);

impl Profiler {
    pub fn start(pid: u32) -> Result<Profiler, BoxError> {
        let Some(named) = std::env::var_os("BENCH_PERF_OUT") else {
            return Ok(Profiler(None));
        };
        let mut out = named;
        let earlier = PROFILES.fetch_add(1, Ordering::SeqCst);
        if earlier > 0 {
            out.push(format!(".{}", earlier + 1));
        }
        let child = Command::new("perf")
            .args([
                "record",
                "-e",
                "cpu-clock",
                "-F",
                "999",
                "--call-graph",
                "dwarf,16384",
            ])
            .arg("-p")
            .arg(pid.to_string())
            .arg("-o")
            .arg(&out)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        println!("perf record -p {pid} -> {}", Path::new(&out).display());
        Ok(Profiler(Some(child)))
    }

    /// Stop recording (SIGINT, as at a terminal) and wait for perf to write its file.
    pub fn finish(self) -> Result<(), BoxError> {
        if let Some(mut child) = self.0 {
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGINT,
            )?;
            child.wait()?;
        }
        Ok(())
    }
}
