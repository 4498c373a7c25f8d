//! Intake benchmarks (issues 3 and 13). Run through `bench/intake.sh`, or
//! `cargo run --release --example bench_intake -- <mode> [--smoke]` with mode one of:
//!
//! * `wrk [seconds]`: the real `hookspool intake` on a temporary home with one HMAC template
//!   source, loaded by wrk with signed 1 KiB JSON webhooks (one key, the body signed once:
//!   HMAC over a fixed body is what a sender computes) three times: 64 connections with group
//!   commit (`intake.group_events_max = 256`, the default), 64 connections with a group of 1
//!   (one transaction and one fdatasync per request), and one connection pausing 10 ms
//!   between requests. Per run: committed requests/s (events in spool.db over the duration),
//!   wrk's p50/p99, non-2xx answers, peak RSS (VmHWM), and CPU per committed event of the
//!   writer thread and of the whole process (from /proc, so the figure holds however busy
//!   the machine is). Every 2xx must be in the spool: fewer events than 2xx answers fails.
//!   Group commit and the group of 1 alternate twice (`seconds` split between the rounds)
//!   with a one-second disk probe between runs; ratios use the fastest probe. The mean rate
//!   and the worst p50/p99 of the rounds are printed.
//! * `sweep [seconds]`: the group-commit run with several `intake.group_events_max` and
//!   `intake.group_wait_ms` values, for tuning their defaults (two of them with --smoke).
//! * `coalesce [events] [keys]`: the real `hookspool run`, a source with a 1 s quiet window,
//!   and an http destination that is a receiver in this process. `events` signed webhooks
//!   (default 20 000) over `keys` keys (default 200) are sent by 32 concurrent senders, each
//!   key's events in order by one sender; every document must arrive, at most 2 per key,
//!   holding each key's events exactly once and in order. Prints events/s from the first
//!   send to the last document.
//! * `pair [seconds] [rounds]` (issue 36): committed webhooks/s of two binaries and the HTTP
//!   ceiling, alternated in one run: `$HOOKSPOOL_BASE_BIN` (the binary to compare with,
//!   built by `bench/run.sh`: f42c35e or `$BENCH_BASE_REV`), `$HOOKSPOOL_BIN` (this build;
//!   with `BENCH_PIPELINED=1` it runs with `intake.pipelined_sync = true`) and `bench_ceiling` (a bare
//!   hyper server that reads the body, checks the same HMAC and answers 200), each with the
//!   group-commit run's wrk (64 connections, the same script and body), `rounds` times
//!   (default 3; the order of the two binaries swaps every round). Prints each run, the
//!   per-round ratios, and figures: the means of committed/s for both, the ceiling's 2xx/s,
//!   process CPU us per event, this build's worst p99 and peak RSS.
//! * `pg [seconds] [rounds]` (issue 32): the group-commit run (64 connections, the same
//!   body) on a SQLite spool and on a PostgreSQL spool (`[spool] backend = "postgres"`, a
//!   fresh database of one throwaway cluster per run, tests/support/pg.rs: Unix socket,
//!   fsync and synchronous_commit on), alternated `rounds` times (default 2; the order swaps
//!   every round). Prints committed req/s of both and their ratio, CPU per committed event
//!   of the hookspool process on each, and of the PostgreSQL server processes (the
//!   postmaster and its children, /proc). With `BENCH_PERF_OUT` the first PostgreSQL run's
//!   intake is recorded with perf. `BENCH_PG_SETUP_SQL` (an experiment, not a figure) is
//!   SQL run on each PostgreSQL database after its migration, before the intake starts.
//! * `all`: both.
//!
//! wrk, the intake and (for `coalesce`) the senders and the receiver share the machine's
//! cores; the CPU-per-event figures are the ones to compare across machines.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{
    BoxError, destination_toml, figure, free_port, peak_rss_mib, receiver, sign, smoke_flag,
    source_toml, spawn_hookspool, stop, thread_cpu_s, wait_served, write_secrets,
};

/// Connections of the loaded runs (issue 13's p99 target is at 64).
const CONNECTIONS: usize = 64;
/// wrk threads for the loaded runs: one per core of the 2-core machines we measure on.
const WRK_THREADS: usize = 2;
/// The body wrk sends.
const BODY_BYTES: usize = 1024;
const SECONDS_DEFAULT: f64 = 10.0;
const SECONDS_SMOKE: f64 = 1.0;
/// The writer thread's name as /proc shows it (15 bytes of "hookspool-writer").
const WRITER_THREAD: &str = "hookspool-write";
/// (group_events_max, group_wait_ms) pairs of `sweep`.
const SWEEP: [(usize, f64); 7] = [
    (16, 0.0),
    (64, 0.0),
    (256, 0.0),
    (1024, 0.0),
    (256, 0.5),
    (256, 1.0),
    (256, 2.0),
];
/// Alternations of group commit and the group of 1 in `wrk` (one in smoke runs).
const ROUNDS: usize = 2;
/// Shorter runs than this are not split into rounds.
const ROUND_S_MIN: f64 = 3.0;
/// Seconds per run and rounds of `pair`.
const PAIR_SECONDS: f64 = 8.0;
const PAIR_ROUNDS: usize = 3;
/// Seconds per run and rounds of `pg`.
const PG_SECONDS: f64 = 8.0;
const PG_ROUNDS: usize = 2;
/// Round trips timed by `pg` before its runs.
const PG_ROUND_TRIPS: usize = 5000;
/// Concurrent senders of the coalescing run.
const SENDERS: usize = 32;
const SENDERS_SMOKE: usize = 8;
/// The coalescing run's quiet window (issue 13).
const QUIET_S: f64 = 1.0;
/// How long after the last send the coalescing run waits for its documents.
const COALESCE_TAIL_S_MAX: u64 = 60;

fn main() -> Result<(), BoxError> {
    let (smoke, args) = smoke_flag();
    let mode = args.first().map(String::as_str).unwrap_or("all");
    let num = |i: usize, d: f64| -> f64 { args.get(i).and_then(|v| v.parse().ok()).unwrap_or(d) };
    let seconds = if smoke {
        SECONDS_SMOKE
    } else {
        SECONDS_DEFAULT
    };
    let (events, keys) = if smoke {
        (400.0, 20.0)
    } else {
        (20_000.0, 200.0)
    };
    let senders = if smoke { SENDERS_SMOKE } else { SENDERS };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    match mode {
        "wrk" => rt.block_on(wrk_runs(num(1, seconds)))?,
        "coalesce" => rt.block_on(coalesce(
            num(1, events) as usize,
            num(2, keys) as usize,
            senders,
        ))?,
        "sweep" => rt.block_on(sweep(
            num(1, seconds),
            if smoke { &SWEEP[..2] } else { &SWEEP },
        ))?,
        "pg" => rt.block_on(pg(
            num(1, if smoke { SECONDS_SMOKE } else { PG_SECONDS }),
            num(2, if smoke { 1.0 } else { PG_ROUNDS as f64 }) as usize,
        ))?,
        "pair" => rt.block_on(pair(
            num(1, if smoke { SECONDS_SMOKE } else { PAIR_SECONDS }),
            num(2, if smoke { 1.0 } else { PAIR_ROUNDS as f64 }) as usize,
        ))?,
        "all" => {
            rt.block_on(wrk_runs(seconds))?;
            rt.block_on(coalesce(events as usize, keys as usize, senders))?;
        }
        other => {
            eprintln!(
                "unknown mode {other:?}: wrk [seconds] | sweep [seconds] | pair [seconds] [rounds] | pg [seconds] [rounds] | coalesce [events] [keys] | all"
            );
            std::process::exit(2);
        }
    }
    Ok(())
}

/// One wrk run's figures.
struct WrkRun {
    committed_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    rss_mib: f64,
    writer_us_per_event: f64,
    process_us_per_event: f64,
    /// Requests per successful group commit, from the intake's own /metrics counters.
    requests_per_commit: f64,
    busy_timeout_s: f64,
    /// PostgreSQL's server processes' CPU us per committed event (0 on SQLite).
    server_us_per_event: f64,
}

async fn wrk_runs(seconds: f64) -> Result<(), BoxError> {
    if Command::new("wrk").arg("--version").output().is_err() {
        return Err("wrk is not installed (bench/intake.sh installs it with apt-get)".into());
    }
    println!(
        "== intake under wrk: {seconds} s per run, {BODY_BYTES} B signed JSON, {} cores shared by wrk and the intake",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let dir = tempfile::tempdir()?;
    let lua = write_lua(dir.path())?;
    // Group commit and the group of 1 alternate, ROUNDS times, with a disk probe between
    // runs, so both see the same disk: it moves by 10x within a minute on a shared machine.
    let rounds = if seconds >= 2.0 * ROUND_S_MIN {
        ROUNDS
    } else {
        1
    };
    let per_run = seconds / rounds as f64;
    let mut g = Vec::new();
    let mut one = Vec::new();
    let mut probes = vec![common::fdatasync_per_s(common::PROBE_S)?];
    for round in 0..rounds {
        let name = format!("group-commit-{round}");
        let s = spec(&name, 256, &lua.0, CONNECTIONS, round == 0);
        g.push(wrk_run(dir.path(), s, per_run).await?);
        probes.push(common::fdatasync_per_s(common::PROBE_S)?);
        let name = format!("group-of-1-{round}");
        let s = spec(&name, 1, &lua.0, CONNECTIONS, false);
        one.push(wrk_run(dir.path(), s, per_run).await?);
        probes.push(common::fdatasync_per_s(common::PROBE_S)?);
    }
    let disk = probes.iter().cloned().fold(0.0, f64::max);
    let low = probes.iter().cloned().fold(f64::INFINITY, f64::min);
    let mean = |v: &[WrkRun], f: fn(&WrkRun) -> f64| v.iter().map(f).sum::<f64>() / v.len() as f64;
    let worst = |v: &[WrkRun], f: fn(&WrkRun) -> f64| v.iter().map(f).fold(0.0, f64::max);
    println!(
        "disk fdatasync/s between the runs: {}; ratios use the fastest",
        probes
            .iter()
            .map(|p| format!("{p:.0}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    figure("intake_fdatasync_per_s", disk);
    figure("intake_fdatasync_min_per_s", low);
    figure("intake_committed_per_s", mean(&g, |r| r.committed_per_s));
    figure("intake_p50_ms", worst(&g, |r| r.p50_ms));
    figure("intake_p99_ms", worst(&g, |r| r.p99_ms));
    figure("intake_peak_rss_mib", worst(&g, |r| r.rss_mib));
    figure(
        "intake_writer_us_per_event",
        mean(&g, |r| r.writer_us_per_event),
    );
    figure(
        "intake_process_us_per_event",
        mean(&g, |r| r.process_us_per_event),
    );
    figure(
        "intake_requests_per_commit",
        mean(&g, |r| r.requests_per_commit),
    );
    let one = WrkRun {
        committed_per_s: mean(&one, |r| r.committed_per_s),
        p99_ms: worst(&one, |r| r.p99_ms),
        ..one.swap_remove(0)
    };
    figure("intake_group1_committed_per_s", one.committed_per_s);
    figure("intake_group1_p99_ms", one.p99_ms);
    let slow = wrk_run(
        dir.path(),
        spec("100-per-s", 256, &lua.1, 1, false),
        seconds,
    )
    .await?;
    figure("intake_100_per_s_p50_ms", slow.p50_ms);
    // The bound a retention pass's write lock is compared with (issue 13): the default
    // config's, as loaded by the binary.
    figure("intake_busy_timeout_ms", slow.busy_timeout_s * 1e3);
    Ok(())
}

/// The writer's group bounds against each other at 64 connections: what the defaults of
/// `intake.group_events_max` and `intake.group_wait_ms` are chosen from.
async fn sweep(seconds: f64, pairs: &[(usize, f64)]) -> Result<(), BoxError> {
    println!("== group bounds sweep: {seconds} s per run, {CONNECTIONS} connections");
    let dir = tempfile::tempdir()?;
    let lua = write_lua(dir.path())?;
    for &(group, wait_ms) in pairs {
        let name = format!("group-{group}-wait-{wait_ms}ms");
        let spec = Spec {
            name: &name,
            group,
            wait_ms,
            lua: &lua.0,
            conns: CONNECTIONS,
            profile: false,
            bin: None,
            pipelined: false,
            pg: None,
        };
        wrk_run(dir.path(), spec, seconds).await?;
    }
    Ok(())
}

/// Today's binary, this build and the HTTP ceiling, alternated (see the module doc).
async fn pair(seconds: f64, rounds: usize) -> Result<(), BoxError> {
    if Command::new("wrk").arg("--version").output().is_err() {
        return Err("wrk is not installed (bench/intake.sh installs it with apt-get)".into());
    }
    let base_bin = std::path::PathBuf::from(std::env::var_os("HOOKSPOOL_BASE_BIN").ok_or(
        "pair needs HOOKSPOOL_BASE_BIN: the binary to compare with (bench/run.sh builds main's)",
    )?);
    let new_bin = common::binary()?;
    // BENCH_PIPELINED=1: this build runs with `intake.pipelined_sync = true` (off by default).
    let pipelined = std::env::var_os("BENCH_PIPELINED").is_some_and(|v| v == "1");
    let ceiling_bin = std::env::current_exe()?
        .parent()
        .map(|d| d.join("bench_ceiling"))
        .ok_or("no directory above this example")?;
    println!(
        "== pair: {} (base) against {} (this build{}) and the HTTP ceiling, {seconds} s per run, {rounds} rounds, {CONNECTIONS} connections",
        base_bin.display(),
        new_bin.display(),
        if pipelined {
            ", intake.pipelined_sync = true"
        } else {
            ""
        }
    );
    let dir = tempfile::tempdir()?;
    let lua = write_lua(dir.path())?;
    let (mut base, mut new, mut ceiling) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let order: [(&str, &Path); 2] = if round % 2 == 0 {
            [("base", &base_bin), ("new", &new_bin)]
        } else {
            [("new", &new_bin), ("base", &base_bin)]
        };
        for (which, bin) in order {
            let name = format!("{which}-{round}");
            let mut s = spec(&name, 256, &lua.0, CONNECTIONS, false);
            s.bin = Some(bin);
            s.pipelined = which == "new" && pipelined;
            let run = wrk_run(dir.path(), s, seconds).await?;
            if which == "base" {
                base.push(run);
            } else {
                new.push(run);
            }
        }
        ceiling.push(ceiling_run(&ceiling_bin, &lua.0, seconds, round).await?);
        let (b, n) = (&base[round], &new[round]);
        println!(
            "round {round}: this build / today {:.2}x, this build / ceiling {:.2}x",
            n.committed_per_s / b.committed_per_s,
            n.committed_per_s / ceiling[round].0
        );
    }
    let mean = |v: &[WrkRun], f: fn(&WrkRun) -> f64| v.iter().map(f).sum::<f64>() / v.len() as f64;
    let worst = |v: &[WrkRun], f: fn(&WrkRun) -> f64| v.iter().map(f).fold(0.0, f64::max);
    let ceiling_per_s = ceiling.iter().map(|c| c.0).sum::<f64>() / ceiling.len() as f64;
    figure(
        "pair_base_committed_per_s",
        mean(&base, |r| r.committed_per_s),
    );
    figure(
        "pair_new_committed_per_s",
        mean(&new, |r| r.committed_per_s),
    );
    figure("pair_ceiling_per_s", ceiling_per_s);
    figure(
        "pair_ceiling_us_per_request",
        ceiling.iter().map(|c| c.1).sum::<f64>() / ceiling.len() as f64,
    );
    figure(
        "pair_base_process_us_per_event",
        mean(&base, |r| r.process_us_per_event),
    );
    figure(
        "pair_new_process_us_per_event",
        mean(&new, |r| r.process_us_per_event),
    );
    figure(
        "pair_base_writer_us_per_event",
        mean(&base, |r| r.writer_us_per_event),
    );
    figure(
        "pair_new_writer_us_per_event",
        mean(&new, |r| r.writer_us_per_event),
    );
    figure("pair_base_p99_ms", worst(&base, |r| r.p99_ms));
    figure("pair_new_p99_ms", worst(&new, |r| r.p99_ms));
    figure("pair_new_peak_rss_mib", worst(&new, |r| r.rss_mib));
    figure(
        "pair_new_requests_per_commit",
        mean(&new, |r| r.requests_per_commit),
    );
    Ok(())
}

/// The group-commit run on SQLite and on PostgreSQL, alternated (see the module doc).
async fn pg(seconds: f64, rounds: usize) -> Result<(), BoxError> {
    if Command::new("wrk").arg("--version").output().is_err() {
        return Err("wrk is not installed (bench/intake.sh installs it with apt-get)".into());
    }
    // A host without PostgreSQL cannot print these figures: bench/run.sh then fails on the
    // missing rows, as for any other figure.
    let cluster = tokio::task::block_in_place(common::pg::Cluster::start)?;
    println!(
        "== intake on PostgreSQL against SQLite: {seconds} s per run, {rounds} rounds, {CONNECTIONS} connections, group commit; cluster {} (postmaster {:?})",
        cluster.dir().display(),
        cluster.pid()
    );
    // One round trip to this server, through a blocking client as the store's session is one
    // (tokio-postgres on a runtime of its own): what a statement costs before the server
    // does anything.
    let round_trip_us = tokio::task::block_in_place(|| -> Result<f64, BoxError> {
        let mut c = common::pg_client(&cluster.database("roundtrip"))?;
        let stmt = c.prepare("SELECT 1")?;
        for _ in 0..PG_ROUND_TRIPS / 10 {
            c.query_one(&stmt, &[])?;
        }
        let t = Instant::now();
        for _ in 0..PG_ROUND_TRIPS {
            c.query_one(&stmt, &[])?;
        }
        Ok(t.elapsed().as_secs_f64() * 1e6 / PG_ROUND_TRIPS as f64)
    })?;
    println!(
        "one round trip (a prepared SELECT 1, rust-postgres' blocking client, Unix socket): {round_trip_us:.1} us; a planned group (store::pg::grouped) makes about 8 in sequence whatever its size (BEGIN and NOTIFY ride with its statements), so groups of 32 cost one writer {:.1} us per event in round trips before the server does any work",
        8.0 * round_trip_us / 32.0
    );
    figure("pg_round_trip_us", round_trip_us);
    let dir = tempfile::tempdir()?;
    let lua = write_lua(dir.path())?;
    let (mut lite, mut on_pg) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        for which in if round % 2 == 0 {
            ["sqlite", "pg"]
        } else {
            ["pg", "sqlite"]
        } {
            let name = format!("{which}-{round}");
            let mut s = spec(&name, 256, &lua.0, CONNECTIONS, which == "pg" && round == 0);
            if which == "pg" {
                s.pg = Some(&cluster);
                on_pg.push(wrk_run(dir.path(), s, seconds).await?);
            } else {
                lite.push(wrk_run(dir.path(), s, seconds).await?);
            }
        }
        println!(
            "round {round}: PostgreSQL / SQLite {:.2}x",
            on_pg[round].committed_per_s / lite[round].committed_per_s
        );
    }
    let mean = |v: &[WrkRun], f: fn(&WrkRun) -> f64| v.iter().map(f).sum::<f64>() / v.len() as f64;
    let worst = |v: &[WrkRun], f: fn(&WrkRun) -> f64| v.iter().map(f).fold(0.0, f64::max);
    let (p, l) = (
        mean(&on_pg, |r| r.committed_per_s),
        mean(&lite, |r| r.committed_per_s),
    );
    println!(
        "PostgreSQL {p:.0} committed req/s against SQLite {l:.0} = {:.3}x",
        p / l
    );
    figure("pg_intake_committed_per_s", p);
    figure("pg_intake_sqlite_committed_per_s", l);
    figure(
        "pg_intake_process_us_per_event",
        mean(&on_pg, |r| r.process_us_per_event),
    );
    figure(
        "pg_intake_writer_us_per_event",
        mean(&on_pg, |r| r.writer_us_per_event),
    );
    figure(
        "pg_intake_server_us_per_event",
        mean(&on_pg, |r| r.server_us_per_event),
    );
    figure(
        "pg_intake_sqlite_process_us_per_event",
        mean(&lite, |r| r.process_us_per_event),
    );
    figure("pg_intake_p99_ms", worst(&on_pg, |r| r.p99_ms));
    figure("pg_intake_sqlite_p99_ms", worst(&lite, |r| r.p99_ms));
    figure(
        "pg_intake_requests_per_commit",
        mean(&on_pg, |r| r.requests_per_commit),
    );
    tokio::task::block_in_place(|| cluster.stop())?;
    Ok(())
}

/// wrk against the ceiling server: (2xx answers/s, the server's CPU us per answer).
async fn ceiling_run(
    bin: &Path,
    lua: &str,
    seconds: f64,
    round: usize,
) -> Result<(f64, f64), BoxError> {
    let port = free_port()?;
    let mut child = Command::new(bin)
        .arg(port.to_string())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .spawn()?;
    let deadline = Instant::now() + Duration::from_secs(common::READY_S_MAX);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            let _ = child.kill();
            return Err("the ceiling server never listened".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let pid = child.id();
    let before = thread_cpu_s(pid)?;
    let url = format!("http://127.0.0.1:{port}/hooks/bench");
    let lua = lua.to_string();
    let out = tokio::task::spawn_blocking(move || {
        Command::new("wrk")
            .arg(format!("-t{WRK_THREADS}"))
            .arg(format!("-c{CONNECTIONS}"))
            .arg(format!("-d{}s", seconds.max(1.0).round()))
            .arg("--latency")
            .arg("-s")
            .arg(lua)
            .arg(url)
            .output()
    })
    .await??;
    let after = thread_cpu_s(pid)?;
    let _ = child.kill();
    let _ = child.wait();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let report = WrkReport::parse(&text)?;
    let ok = (report.requests - report.non_2xx).max(0);
    if report.non_2xx > 0 {
        return Err(format!(
            "the ceiling server refused {} requests: the signature check differs",
            report.non_2xx
        )
        .into());
    }
    let cpu: f64 = after.values().sum::<f64>() - before.values().sum::<f64>();
    let per_s = ok as f64 / report.seconds;
    let us = cpu * 1e6 / (ok.max(1) as f64);
    println!(
        "ceiling-{round:<5} answered {per_s:>7.0} req/s   p50 {:>7.2} ms   p99 {:>7.2} ms   CPU/request: process {us:.1} us",
        report.p50_ms, report.p99_ms
    );
    Ok((per_s, us))
}

/// Two wrk scripts: as fast as possible, and with a 10 ms pause between requests.
fn write_lua(dir: &Path) -> Result<(String, String), BoxError> {
    let prefix = r#"{"topic":"octo/bench","action":"synchronize","pad":""#;
    let body = format!("{prefix}{}\"}}", "x".repeat(BODY_BYTES - prefix.len() - 2));
    let script = format!(
        "wrk.method = \"POST\"\nwrk.body = '{body}'\nwrk.headers[\"Content-Type\"] = \"application/json\"\nwrk.headers[\"X-Signature\"] = \"{}\"\n",
        sign(body.as_bytes())
    );
    let fast = dir.join("post.lua");
    let slow = dir.join("slow.lua");
    std::fs::write(&fast, &script)?;
    std::fs::write(&slow, format!("{script}function delay() return 10 end\n"))?;
    Ok((fast.display().to_string(), slow.display().to_string()))
}

/// What one wrk run loads the intake with.
struct Spec<'a> {
    name: &'a str,
    /// `intake.group_events_max` and `intake.group_wait_ms`.
    group: usize,
    wait_ms: f64,
    lua: &'a str,
    conns: usize,
    /// Record the intake with perf (see `common::Profiler`) through the middle of the run.
    profile: bool,
    /// The binary to run (`common::binary()` when None).
    bin: Option<&'a Path>,
    /// `intake.pipelined_sync = true` (pair's runs of this build with `BENCH_PIPELINED=1`).
    pipelined: bool,
    /// Run on a fresh database of this PostgreSQL cluster instead of the home's SQLite file.
    pg: Option<&'a common::pg::Cluster>,
}

/// A run with the default linger (`intake.group_wait_ms = 0`).
fn spec<'a>(name: &'a str, group: usize, lua: &'a str, conns: usize, profile: bool) -> Spec<'a> {
    Spec {
        name,
        group,
        wait_ms: 0.0,
        lua,
        conns,
        profile,
        bin: None,
        pipelined: false,
        pg: None,
    }
}

/// The intake runs store and never deliver: their route's destination only has to be valid
/// config for every binary `pair` compares, including those from before the egress policy's
/// `allow_private` (an address in TEST-NET-1, which the policy does not refuse).
fn unused_destination_toml(home: &Path) -> String {
    format!(
        "\n[destinations.http-recv]\ntype = \"http\"\nurl = \"http://192.0.2.1:9/hook\"\nallow_insecure = true\ntimeout_s = 10\nsecret = {{ file = \"{}/dest.secret\" }}\n",
        home.display()
    )
}

/// One wrk run on a fresh home.
async fn wrk_run(work: &Path, spec: Spec<'_>, seconds: f64) -> Result<WrkRun, BoxError> {
    let Spec {
        name,
        group,
        wait_ms,
        lua,
        conns,
        profile,
        bin,
        pipelined,
        pg,
    } = spec;
    let home = work.join(name);
    std::fs::create_dir(&home)?;
    write_secrets(&home)?;
    let port = free_port()?;
    // On PostgreSQL: a fresh database (named after the run) and the config's [spool].
    let (pg_url, spool_section) = match pg {
        Some(c) => {
            let db = name.replace('-', "_");
            let (url, section) = tokio::task::block_in_place(|| -> Result<_, BoxError> {
                let (url, section) = common::pg_spool(c, &db, &home)?;
                // The intake refuses a database at schema 0 (on SQLite it initialises a new
                // file itself): migrate it first, as `hookspool migrate` would.
                hookspool::store::Store::open_pg(
                    &url,
                    hookspool::store::Role::Migrator,
                    Duration::from_secs(30),
                )?;
                // An experiment, never in bench/run.sh: SQL run on each PostgreSQL database
                // after its migration (e.g. dropping an index to see what it costs).
                if let Some(sql) = std::env::var_os("BENCH_PG_SETUP_SQL") {
                    let sql = sql.to_string_lossy();
                    println!("{name}: BENCH_PG_SETUP_SQL: {sql}");
                    common::pg_client(&url)?.batch_execute(&sql)?;
                }
                Ok((url, section))
            })?;
            (Some(url), section)
        }
        None => (None, String::new()),
    };
    std::fs::write(
        home.join("config.toml"),
        format!(
            "[intake]\nlisten = \"127.0.0.1:{port}\"\ngroup_events_max = {group}\ngroup_wait_ms = {wait_ms}\n{}[limits]\nmin_free_bytes = 0\n{}{}{spool_section}",
            if pipelined {
                "pipelined_sync = true\n"
            } else {
                ""
            },
            source_toml("bench", &home, ""),
            unused_destination_toml(&home)
        ),
    )?;
    let busy_timeout_s = common::load(&home)?.intake.busy_timeout_s;
    let child = match bin {
        Some(bin) => common::spawn_binary(bin, &home, "intake")?,
        None => spawn_hookspool(&home, "intake")?,
    };
    let pid = child.id();
    let base = format!("http://127.0.0.1:{port}");
    if let Err(e) = wait_served(&reqwest::Client::new(), &base).await {
        stop(child)?;
        let log = std::fs::read_to_string(home.join("intake.log")).unwrap_or_default();
        return Err(format!("{e}; its log:\n{log}").into());
    }
    let before = thread_cpu_s(pid)?;
    let server = |c: Option<&common::pg::Cluster>| -> Result<f64, BoxError> {
        match c {
            Some(c) => common::pg_server_cpu_s(c.pid().ok_or("the cluster has no postmaster.pid")?),
            None => Ok(0.0),
        }
    };
    let server_before = server(pg)?;
    let threads = if conns == 1 { 1 } else { WRK_THREADS };
    let wrk = tokio::task::spawn_blocking({
        let (lua, url) = (lua.to_string(), format!("{base}/hooks/bench"));
        move || {
            Command::new("wrk")
                .arg(format!("-t{threads}"))
                .arg(format!("-c{conns}"))
                .arg(format!("-d{}s", seconds.max(1.0).round()))
                .arg("--latency")
                .arg("-s")
                .arg(lua)
                .arg(url)
                .output()
        }
    });
    if profile {
        // The middle of the run: past the ramp-up, before wrk stops.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let p = common::Profiler::start(pid)?;
        tokio::time::sleep(Duration::from_secs_f64((seconds - 2.0).max(0.5))).await;
        p.finish()?;
    }
    let out = wrk.await??;
    let after = thread_cpu_s(pid)?;
    let server_after = server(pg)?;
    let requests_per_commit = requests_per_commit(&base).await?;
    let rss_mib = peak_rss_mib(pid)?;
    let status = stop(child)?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        return Err(format!("wrk failed: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    let report = WrkReport::parse(&text)?;
    let events: i64 = match &pg_url {
        Some(url) => tokio::task::block_in_place(|| -> Result<i64, BoxError> {
            let mut c = common::pg_client(url)?;
            let events: i64 = c.query_one("SELECT count(*) FROM events", &[])?.get(0);
            // What the server did for them (its statistics; the intake's session flushed
            // its counters when it ended): commits, and how the per-event UPDATE of the
            // open batch was written (a HOT update adds no index entries).
            let r = c.query_one(
                "SELECT (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()),
                        n_tup_ins, n_tup_upd, n_tup_hot_upd, n_dead_tup
                 FROM pg_stat_user_tables WHERE relname = 'batches'",
                &[],
            )?;
            let (commits, ins, upd, hot, dead): (i64, i64, i64, i64, i64) =
                (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4));
            println!(
                "{name}: PostgreSQL statistics: {commits} commits in the database; batches: {ins} inserted, {upd} updated ({hot} HOT), {dead} dead row versions"
            );
            Ok(events)
        })?,
        None => rusqlite::Connection::open_with_flags(
            home.join("spool.db"),
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
        )?
        .query_row("SELECT count(*) FROM events", [], |r| r.get(0))?,
    };
    let acked = report.requests - report.non_2xx;
    if events < acked {
        return Err(format!(
            "{name}: {acked} requests answered 2xx but only {events} events are in the spool"
        )
        .into());
    }
    let cpu = |m: &BTreeMap<String, f64>, f: &dyn Fn(&str) -> bool| -> f64 {
        m.iter().filter(|(k, _)| f(k)).map(|(_, v)| v).sum()
    };
    let writer = cpu(&after, &|k| k == WRITER_THREAD) - cpu(&before, &|k| k == WRITER_THREAD);
    let process = cpu(&after, &|_| true) - cpu(&before, &|_| true);
    let per_event = |s: f64| s * 1e6 / (events.max(1) as f64);
    let run = WrkRun {
        committed_per_s: events as f64 / report.seconds,
        p50_ms: report.p50_ms,
        p99_ms: report.p99_ms,
        rss_mib,
        writer_us_per_event: per_event(writer),
        process_us_per_event: per_event(process),
        requests_per_commit,
        busy_timeout_s,
        server_us_per_event: per_event(server_after - server_before),
    };
    println!(
        "{name:<13} committed {:>7.0} req/s   p50 {:>7.2} ms   p99 {:>7.2} ms   non-2xx {}   timeouts {}   peak RSS {:.1} MiB   CPU/event: writer {:.1} us, process {:.1} us{}   requests/commit {:.1}   (exit {status})",
        run.committed_per_s,
        run.p50_ms,
        run.p99_ms,
        report.non_2xx,
        report.timeouts,
        run.rss_mib,
        run.writer_us_per_event,
        run.process_us_per_event,
        if pg.is_some() {
            format!(", PostgreSQL server {:.1} us", run.server_us_per_event)
        } else {
            String::new()
        },
        run.requests_per_commit
    );
    Ok(run)
}

/// `hookspool_intake_group_requests_total / hookspool_intake_group_commits_total` from the
/// intake's /metrics: the mean group size over the run.
async fn requests_per_commit(base: &str) -> Result<f64, BoxError> {
    let text = reqwest::get(format!("{base}/metrics"))
        .await?
        .text()
        .await?;
    let value = |name: &str| -> Result<f64, BoxError> {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| format!("no {name} in the intake's /metrics").into())
    };
    Ok(value("hookspool_intake_group_requests_total")?
        / value("hookspool_intake_group_commits_total")?.max(1.0))
}

/// What bench runs read from wrk's `--latency` report.
struct WrkReport {
    requests: i64,
    seconds: f64,
    non_2xx: i64,
    timeouts: i64,
    p50_ms: f64,
    p99_ms: f64,
}

impl WrkReport {
    fn parse(text: &str) -> Result<WrkReport, BoxError> {
        let mut r = WrkReport {
            requests: -1,
            seconds: 0.0,
            non_2xx: 0,
            timeouts: 0,
            p50_ms: f64::NAN,
            p99_ms: f64::NAN,
        };
        for line in text.lines() {
            let w: Vec<&str> = line.split_whitespace().collect();
            match w.as_slice() {
                ["50%", v] => r.p50_ms = duration_ms(v)?,
                ["99%", v] => r.p99_ms = duration_ms(v)?,
                [n, "requests", "in", d, ..] => {
                    r.requests = n.parse()?;
                    r.seconds = duration_ms(d.trim_end_matches(','))? / 1e3;
                }
                ["Non-2xx", "or", "3xx", "responses:", n] => r.non_2xx = n.parse()?,
                ["Socket", "errors:", rest @ ..] => {
                    if let Some(i) = rest.iter().position(|x| *x == "timeout") {
                        r.timeouts = rest.get(i + 1).ok_or("socket errors")?.parse()?;
                    }
                }
                _ => {}
            }
        }
        if r.requests < 0 || r.seconds <= 0.0 || r.p50_ms.is_nan() || r.p99_ms.is_nan() {
            return Err(format!("could not read wrk's report:\n{text}").into());
        }
        Ok(r)
    }
}

/// wrk's durations: "812.00us", "3.92ms", "1.02s", "2.00m".
fn duration_ms(v: &str) -> Result<f64, BoxError> {
    let (num, scale) = if let Some(n) = v.strip_suffix("us") {
        (n, 1e-3)
    } else if let Some(n) = v.strip_suffix("ms") {
        (n, 1.0)
    } else if let Some(n) = v.strip_suffix('s') {
        (n, 1e3)
    } else if let Some(n) = v.strip_suffix('m') {
        (n, 60e3)
    } else {
        return Err(format!("not a wrk duration: {v}").into());
    };
    Ok(num.parse::<f64>()? * scale)
}

async fn coalesce(events: usize, keys: usize, senders: usize) -> Result<(), BoxError> {
    let per_key = events / keys;
    let events = per_key * keys;
    println!(
        "== coalescing: {events} signed webhooks over {keys} keys ({per_key} each, in order per key), quiet window {QUIET_S} s, {senders} senders, through `hookspool run`"
    );
    let (tx, mut arrivals) = tokio::sync::mpsc::unbounded_channel();
    let rx = receiver(Some(tx)).await?;
    let dir = tempfile::tempdir()?;
    let home = dir.path();
    write_secrets(home)?;
    let port = free_port()?;
    std::fs::write(
        home.join("config.toml"),
        format!(
            "[intake]\nlisten = \"127.0.0.1:{port}\"\n[limits]\nmin_free_bytes = 0\n[dispatch]\nparallel = {}\n{}{}",
            common::SLOTS,
            source_toml(
                "bench",
                home,
                &format!("dedup = \"payload.id\"\nquiet_s = {QUIET_S}\nmax_s = 600")
            ),
            destination_toml(&format!("http://{}/hook", rx.addr), home)
        ),
    )?;
    let child = spawn_hookspool(home, "run")?;
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(senders)
        .build()?;
    let base = format!("http://127.0.0.1:{port}");
    if let Err(e) = wait_served(&client, &base).await {
        stop(child)?;
        return Err(e);
    }
    let url = Arc::new(format!("{base}/hooks/bench"));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for s in 0..senders {
        let (client, url) = (client.clone(), url.clone());
        tasks.push(tokio::spawn(async move {
            let mine: Vec<usize> = (s..keys).step_by(senders).collect();
            for seq in 0..per_key {
                for &k in &mine {
                    let body = format!(
                        r#"{{"id":"k{k}-{seq}","topic":"key-{k}","seq":{seq},"pad":"0123456789abcdef0123456789abcdef"}}"#
                    );
                    let r = client
                        .post(url.as_str())
                        .header("X-Signature", sign(body.as_bytes()))
                        .header("Content-Type", "application/json")
                        .body(body)
                        .send()
                        .await?;
                    if !r.status().is_success() {
                        return Err::<(), BoxError>(
                            format!("intake answered {}", r.status()).into(),
                        );
                    }
                }
            }
            Ok(())
        }));
    }
    let mut send_error = None;
    for t in tasks {
        if let Err(e) = t.await? {
            send_error.get_or_insert(e);
        }
    }
    let sent = started.elapsed();
    if let Some(e) = send_error {
        stop(child)?;
        return Err(e);
    }
    // Collect documents until every event has arrived.
    let mut seqs: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    let (mut docs, mut got, mut last) = (0usize, 0usize, started);
    let deadline = Instant::now() + Duration::from_secs(COALESCE_TAIL_S_MAX);
    while got < events {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(Some((at, body))) = tokio::time::timeout(left, arrivals.recv()).await else {
            stop(child)?;
            return Err(
                format!("only {got} of {events} events arrived in {docs} documents").into(),
            );
        };
        let doc: serde_json::Value = serde_json::from_slice(&body)?;
        let key = doc["key"]
            .as_str()
            .ok_or("document without a key")?
            .to_string();
        let list = doc["events"].as_array().ok_or("document without events")?;
        let seq_of = |e: &serde_json::Value| e["seq"].as_i64().ok_or("event without seq");
        let mine = seqs.entry(key).or_default();
        for e in list {
            mine.push(seq_of(e)?);
        }
        docs += 1;
        got += list.len();
        last = at;
    }
    let status = stop(child)?;
    let expected: Vec<i64> = (0..per_key as i64).collect();
    let in_order = seqs.len() == keys && seqs.values().all(|s| *s == expected);
    let span = last.saturating_duration_since(started).as_secs_f64();
    println!(
        "sent {events} in {:.2} s ({:.0}/s, every answer 2xx); {docs} documents for {} keys (at most {}), every event once and in order: {}; run exit {status}",
        sent.as_secs_f64(),
        events as f64 / sent.as_secs_f64(),
        seqs.len(),
        2 * keys,
        if in_order { "yes" } else { "NO" }
    );
    println!(
        "first send -> last document: {span:.2} s = {:.0} events/s end to end (quiet window {QUIET_S} s and the receiver included; receiver saw {} requests)",
        events as f64 / span,
        rx.count.load(std::sync::atomic::Ordering::SeqCst)
    );
    figure("coalesce_documents", docs as f64);
    figure("coalesce_documents_max", (2 * keys) as f64);
    figure("coalesce_in_order", if in_order { 1.0 } else { 0.0 });
    figure("coalesce_events_per_s", events as f64 / span);
    Ok(())
}
