//! The soak (issue 17): the real `hookspool intake` and `hookspool dispatch` as separate
//! processes on a spool home that lives on its own size-limited tmpfs, a load client
//! recording every acked id, a receiver flapping between 200, 500, refused and too slow,
//! SIGKILLs of either service at random moments, full-disk episodes, then a bounded drain
//! and the checks of `verdict`. Not part of `cargo test`: run it with
//! `cargo build --release --bin hookspool --example soak && target/release/examples/soak`
//! (see tests/soak/README.md). Every random choice comes from `--seed`, which it prints.
//!
//! Needs root: it re-executes itself under `unshare --mount` (a private mount namespace) and
//! mounts the tmpfs there, so the mount vanishes with the soak and nothing on the host
//! changes. `--hosts 2` (`hosts`) runs it across hosts on a PostgreSQL spool instead, in
//! network namespaces, without the tmpfs.

mod disk;
mod hosts;
mod load;
mod receiver;
mod report;
mod services;
mod setup;
mod spool;
mod verdict;
mod weather;

/// Hosts in network namespaces, shared with the multi-host test (`--hosts 2`).
#[path = "../support/netns.rs"]
mod netns;
/// The throwaway PostgreSQL cluster of the tests (`--hosts 2`).
#[path = "../support/pg.rs"]
mod pg;

use std::collections::HashSet;
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use clap::Parser;
use rand::rngs::Xoshiro256PlusPlus;
use rand::{RngExt, SeedableRng};

use receiver::Receiver;
use services::Service;

/// Set in the re-executed soak, inside its private mount namespace.
const NAMESPACE_ENV: &str = "HOOKSPOOL_SOAK_NAMESPACE";
/// How long the orchestrator sleeps between looks at everything.
const TICK: Duration = Duration::from_millis(100);
/// A sender gives up on one event after this long (then it is not acked, carries no promise).
const GIVE_UP: Duration = Duration::from_secs(40);

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Parser, Debug)]
#[command(
    name = "soak",
    about = "hookspool soak: load, flapping receiver, SIGKILLs, a full disk; then checks"
)]
struct Args {
    /// How long the load, kills, flaps and disk episodes go on (then the drain).
    #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Seed of every random choice (printed; replay a run with it).
    #[arg(long)]
    seed: Option<u64>,
    /// Requests per second, at most, over all keys.
    #[arg(long, default_value_t = 40.0)]
    rate: f64,
    /// Mean time between SIGKILLs (of the intake, the dispatcher, or both).
    #[arg(long, default_value = "20s", value_parser = humantime::parse_duration)]
    kill_every: Duration,
    /// How long each full-disk episode keeps the spool's filesystem full.
    #[arg(long, default_value = "20s", value_parser = humantime::parse_duration)]
    disk_episode: Duration,
    /// One full-disk episode per this much of the run (at least one).
    #[arg(long, default_value = "20m", value_parser = humantime::parse_duration)]
    disk_every: Duration,
    /// Size of the spool's tmpfs in MiB (default: from the duration and rate).
    #[arg(long)]
    fs_mib: Option<u64>,
    /// Bound on the drain at the end (receiver answering 200).
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    drain_timeout: Duration,
    /// Plant a fault: delete one acked event row from the spool a quarter into the run. The
    /// run must then fail (lost 1).
    #[arg(long)]
    plant_loss: bool,
    /// Also fail when a service exited on its own.
    #[arg(long)]
    fail_on_exit: bool,
    /// Keep the work directory (logs, acks.jsonl, deliveries.jsonl) even when the run passes.
    #[arg(long)]
    keep: bool,
    /// The hookspool binary (default: $HOOKSPOOL_BIN, else target/<profile>/hookspool).
    #[arg(long)]
    bin: Option<PathBuf>,
    /// 1: the intake and the dispatcher on one SQLite spool (with full-disk episodes). 2:
    /// two intake hosts and two dispatcher hosts (active and standby) in network namespaces
    /// on one PostgreSQL spool on a database host (issue 33; no disk episodes).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=2))]
    hosts: u8,
}

pub fn main() -> i32 {
    let args = Args::parse();
    let seed = args.seed.unwrap_or_else(|| rand::random::<u64>() >> 12);
    if std::env::var_os(NAMESPACE_ENV).is_none() {
        return reexec(&args, seed);
    }
    match run(&args, seed) {
        Ok(true) => 0,
        Ok(false) => 1,
        Err(e) => {
            eprintln!("soak: cannot run: {e}");
            2
        }
    }
}

/// Run again inside a private mount namespace (`unshare --mount`), with the seed fixed.
fn reexec(args: &Args, seed: u64) -> i32 {
    if !nix::unistd::geteuid().is_root() {
        eprintln!(
            "soak: needs root: the spool home is a size-limited tmpfs mounted in a private mount namespace (the full-disk episode)"
        );
        return 2;
    }
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("soak: cannot find my own executable: {e}");
            return 2;
        }
    };
    let mut a: Vec<OsString> = std::env::args_os().skip(1).collect();
    if args.seed.is_none() {
        a.push("--seed".into());
        a.push(seed.to_string().into());
    }
    let err = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "--"])
        .arg(exe)
        .args(a)
        .env(NAMESPACE_ENV, "1")
        .exec();
    eprintln!("soak: unshare --mount: {err}");
    2
}

fn binary(args: &Args) -> Result<PathBuf, BoxError> {
    let p = match (&args.bin, std::env::var_os("HOOKSPOOL_BIN")) {
        (Some(b), _) => b.clone(),
        (None, Some(b)) => PathBuf::from(b),
        // target/<profile>/examples/soak -> target/<profile>/hookspool
        (None, None) => std::env::current_exe()?
            .parent()
            .and_then(Path::parent)
            .map(|d| d.join("hookspool"))
            .ok_or("no target directory")?,
    };
    if !p.is_file() {
        return Err(format!(
            "{} is missing: build it first (cargo build --release --bin hookspool)",
            p.display()
        )
        .into());
    }
    Ok(p)
}

fn free_port() -> Result<u16, BoxError> {
    loop {
        let p = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        // Never the product's default port.
        if p != 8650 {
            return Ok(p);
        }
    }
}

fn run(args: &Args, seed: u64) -> Result<bool, BoxError> {
    let bin = binary(args)?;
    if args.hosts == 2 {
        return hosts::run(args, seed, &bin);
    }
    println!("soak: seed {seed} (replay with --seed {seed})");
    let mut root_rng = Xoshiro256PlusPlus::seed_from_u64(seed);
    let work = tempfile::Builder::new()
        .prefix("hookspool-soak.")
        .tempdir()?;
    let fs_dir = work.path().join("fs");
    let logs = work.path().join("logs");
    std::fs::create_dir_all(&fs_dir)?;
    std::fs::create_dir_all(&logs)?;
    let fs_mib = args.fs_mib.unwrap_or_else(|| {
        // About 3 KiB of spool per request (tee copies, headers, indexes), plus room.
        64 + (args.rate * args.duration.as_secs_f64() * 3.0 / 1024.0) as u64
    });
    disk::mount_tmpfs(&fs_dir, fs_mib << 20)?;
    let home_dir = fs_dir.join("home");
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new().mode(0o700).create(&home_dir)?;
    }
    let intake_port = free_port()?;

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let started = Instant::now();
    let t = || started.elapsed().as_secs_f64();

    // The receiver checks signatures with the secret `hookspool secret new` makes, and its
    // port goes into the config: secrets, then the receiver, then the config.
    let secrets = setup::secrets(&bin, &home_dir, seed)?;
    let sizes = Arc::new(std::sync::Mutex::new(std::collections::HashMap::new()));
    let rx = rt.block_on(Receiver::start(
        std::net::Ipv4Addr::LOCALHOST.into(),
        &secrets.receiver,
        Duration::from_secs_f64(setup::DESTINATION_TIMEOUT_S + 1.5),
        started,
        std::fs::File::create(work.path().join("deliveries.jsonl"))?,
        sizes.clone(),
    ))?;
    setup::config(
        &bin,
        &home_dir,
        &setup::Place::local(&home_dir, intake_port, rx.port),
    )?;
    println!(
        "soak: work dir {} (spool home on a {fs_mib} MiB tmpfs), intake 127.0.0.1:{intake_port}, receiver 127.0.0.1:{}",
        work.path().display(),
        rx.port
    );
    println!(
        "soak: {} load at most {} req/s over {} keys, SIGKILL about every {}, binary {}",
        humantime::format_duration(args.duration),
        args.rate,
        secrets.sources.iter().map(|s| s.keys.len()).sum::<usize>(),
        humantime::format_duration(args.kill_every),
        bin.display()
    );

    let mut intake = Service::new("intake", &bin, &home_dir, &logs);
    let mut dispatch = Service::new("dispatch", &bin, &home_dir, &logs);
    dispatch.start(t())?;
    intake.start(t())?;
    wait_ready(
        &rt,
        &format!("http://127.0.0.1:{intake_port}"),
        Duration::from_secs(30),
    )?;

    let disk_on = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = {
        let _g = rt.enter();
        load::Load::start(
            load::LoadConfig {
                urls: vec![format!("http://127.0.0.1:{intake_port}")],
                rate_per_s: args.rate,
                burst_max: 20,
                pause_max: Duration::from_secs(4),
                give_up: GIVE_UP,
                request_timeout: Duration::from_secs(10),
            },
            &secrets.sources,
            sizes.clone(),
            root_rng.random(),
            started,
            std::fs::File::create(work.path().join("acks.jsonl"))?,
            disk_on.clone(),
        )?
    };
    // After the load's seed: the draws keep the order a seed was printed with.
    let mut weather = weather::Weather::new(
        &weather::Plan {
            duration: args.duration,
            kill_every: args.kill_every,
            disk_every: args.disk_every,
            disk_episode: args.disk_episode,
            disk: true,
        },
        &mut root_rng,
        &fs_dir,
        disk_on,
    );

    for e in &weather.episodes {
        println!(
            "soak: full-disk episode planned at t={:.0}s for {:.0}s",
            e.start_s,
            e.end_s - e.start_s
        );
    }
    let plant_at_s = args.duration.as_secs_f64() * 0.25;
    let mut planted: Option<String> = None;
    let mut plant_tried = false;
    let db = home_dir.join("spool.db");
    let progress_every = (args.duration.as_secs_f64() / 12.0).max(15.0);
    let mut next_progress = progress_every;
    let total_s = args.duration.as_secs_f64();
    while t() < total_s {
        let now = t();
        weather.tick(now, &mut [&mut intake, &mut dispatch], &rx)?;
        // The planted fault, with the dispatcher down so the event is not delivered first.
        if args.plant_loss && !plant_tried && now >= plant_at_s && !weather.disk_window(now) {
            plant_tried = true;
            planted = plant(&db, &load, &mut dispatch)?;
            match &planted {
                Some(id) => println!(
                    "soak: t={:.1}s PLANTED FAULT: deleted acked event {id} from the spool",
                    t()
                ),
                None => println!(
                    "soak: could not plant the fault (no acked event in an open batch of two)"
                ),
            }
        }
        if now >= next_progress {
            next_progress += progress_every;
            println!(
                "soak: t={now:.0}s acked {} sent {} | receiver {} docs, 200 to {} | kills {} | mode {}",
                lock(&load.acked).len(),
                load.tally.sent.load(Ordering::Relaxed),
                rx.counters().requests.load(Ordering::Relaxed),
                rx.counters().answered_200.load(Ordering::Relaxed),
                weather.kills.len(),
                weather.mode.name()
            );
        }
        std::thread::sleep(TICK);
    }

    // The end: senders stop, the receiver answers 200, both services run, the spool drains.
    let tally = load.tally.clone();
    let acked_log = load.acked.clone();
    let end = drain(
        &rt,
        load,
        &mut [&mut intake, &mut dispatch],
        &mut weather,
        &rx,
        &t,
        args.drain_timeout,
        &mut || {
            spool::open_ro(&db)
                .and_then(|c| spool::unfinished(&c))
                .unwrap_or(-1)
        },
    )?;
    let intake_stop = intake.stop();
    let dispatch_stop = dispatch.stop();
    rx.flush_log();
    let check = setup::hookspool(&bin, &home_dir, &["check"]);

    // Figures.
    let conn = spool::open_ro(&db)?;
    let stored = spool::stored(&conn)?;
    let states = spool::states(&conn)?;
    let issues = spool::issues(&conn)?;
    let dead = spool::dead(&conn)?;
    let fs_used = disk::used_bytes(&fs_dir);
    drop(conn);
    let acked = lock(&acked_log).clone();
    let docs = rx.docs();
    let bounds = setup::bounds();
    let v = verdict::check(&verdict::Facts {
        routes: &bounds,
        acked: &acked,
        docs: &docs,
        stored: &stored,
    });

    let report = report::Report {
        seed,
        duration: args.duration,
        give_up: GIVE_UP,
        verdict: &v,
        acked: &acked,
        tally: &tally,
        receiver: rx.counters(),
        mode_time_s: &weather.mode_time_s,
        drained: end.drained,
        drain_s: end.drain_s,
        drain_timeout: args.drain_timeout,
        unfinished: end.unfinished,
        states: &states,
        dead: &dead,
        issues: &issues,
        services: vec![&intake, &dispatch],
        soak_rss_kib: services::vm_hwm_kib(std::process::id()).unwrap_or(0),
        kills: &weather.kills,
        disks: &weather.disks,
        fs_mib,
        fs_used: Some(fs_used),
        min_free_bytes: setup::MIN_FREE_BYTES,
        stops: vec![("intake", intake_stop), ("dispatch", dispatch_stop)],
        extra: Vec::new(),
        check: check.err().map(|e| e.to_string()),
        late_senders: end.late_senders,
    };
    report.print();
    let mut failures = report.failures(args.fail_on_exit);
    if args.plant_loss && planted.is_none() {
        failures.push("the planted fault could not be planted".into());
    }
    let keep = args.keep || !failures.is_empty();
    let work_path = work.path().to_path_buf();
    if keep {
        // The spool itself, for a post-mortem (the services are stopped).
        for f in ["spool.db", "spool.db-wal", "spool.db-shm", "config.toml"] {
            let from = home_dir.join(f);
            if from.exists()
                && let Err(e) = std::fs::copy(&from, work_path.join(f))
            {
                eprintln!("soak: keeping {f}: {e}");
            }
        }
    }
    // The tmpfs goes; the mount point is then an empty directory the work directory's
    // removal can take.
    if let Err(e) = disk::unmount(&fs_dir) {
        eprintln!("soak: {e}");
    }
    if keep {
        let _ = work.keep();
    }
    if failures.is_empty() {
        println!("soak: PASS (seed {seed})");
    } else {
        println!("soak: FAIL (seed {seed}): {}", failures.join("; "));
    }
    if keep {
        println!(
            "soak: kept {} (logs/, acks.jsonl, deliveries.jsonl, a copy of the spool and its config)",
            work_path.display()
        );
    }
    Ok(failures.is_empty())
}

/// What the end of a run found: the senders still busy when the load stopped, whether the
/// spool drained and in how long, and how many batches were unfinished at the last look.
struct Drain {
    late_senders: usize,
    drained: bool,
    drain_s: f64,
    unfinished: i64,
}

/// The end of a soak, in either mode: the senders stop (the services are reaped and
/// restarted meanwhile), the receiver answers 200, every service runs again, and the spool
/// drains within `timeout` (`unfinished` counts its unfinished batches, -1 when it cannot
/// be read). Then the last answers get half a second to land before the services stop.
#[allow(clippy::too_many_arguments)]
fn drain(
    rt: &tokio::runtime::Runtime,
    load: load::Load,
    svcs: &mut [&mut Service],
    weather: &mut weather::Weather,
    rx: &Receiver,
    t: &dyn Fn() -> f64,
    timeout: Duration,
    unfinished: &mut dyn FnMut() -> i64,
) -> Result<Drain, BoxError> {
    println!(
        "soak: t={:.0}s load stops; draining with the receiver answering 200",
        t()
    );
    let late_senders = {
        // Keep reaping and restarting the services while the senders finish.
        let h = rt.spawn(load.stop(GIVE_UP + Duration::from_secs(10)));
        while !h.is_finished() {
            for s in svcs.iter_mut() {
                s.poll(t(), false);
            }
            std::thread::sleep(TICK);
        }
        rt.block_on(h)?
    };
    weather.calm(t(), rx)?;
    let started = Instant::now();
    let mut end = Drain {
        late_senders,
        drained: false,
        drain_s: 0.0,
        unfinished: -1,
    };
    while started.elapsed() < timeout {
        for s in svcs.iter_mut() {
            if !s.running() {
                s.restart_after(Duration::ZERO);
            }
            if let Some(e) = s.poll(t(), false) {
                println!(
                    "soak: FINDING: {} exited on its own while draining ({})",
                    s.name, e.status
                );
            }
        }
        end.unfinished = unfinished();
        if end.unfinished == 0 {
            end.drained = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    end.drain_s = started.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_millis(500));
    Ok(end)
}

/// Kill the dispatcher, delete one acked event from the spool, start the dispatcher again.
fn plant(db: &Path, load: &load::Load, dispatch: &mut Service) -> Result<Option<String>, BoxError> {
    dispatch.sigkill();
    let acked: HashSet<String> = lock(&load.acked).iter().map(|a| a.id.clone()).collect();
    let until = Instant::now() + Duration::from_secs(10);
    let mut planted = None;
    while planted.is_none() && Instant::now() < until {
        planted = spool::plant_loss(db, &acked)?;
        if planted.is_none() {
            std::thread::sleep(Duration::from_millis(300));
        }
    }
    dispatch.restart_after(Duration::from_millis(200));
    Ok(planted)
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn wait_ready(rt: &tokio::runtime::Runtime, base: &str, within: Duration) -> Result<(), BoxError> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()?;
    let until = Instant::now() + within;
    rt.block_on(async {
        while client.get(format!("{base}/healthz")).send().await.is_err() {
            if Instant::now() > until {
                return Err::<(), BoxError>(format!("{base} never answered /healthz").into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    })
}
