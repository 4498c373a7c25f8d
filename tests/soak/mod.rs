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
//! changes.

mod disk;
mod load;
mod receiver;
mod report;
mod services;
mod setup;
mod spool;
mod verdict;

use std::collections::{BTreeMap, HashSet};
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use rand::rngs::Xoshiro256PlusPlus;
use rand::{RngExt, SeedableRng};

use receiver::{Mode, Receiver};
use services::Service;

/// Set in the re-executed soak, inside its private mount namespace.
const NAMESPACE_ENV: &str = "HOOKSPOOL_SOAK_NAMESPACE";
/// Extra time a disk episode counts for after the space is back: the intake's free-space
/// guard trusts one statvfs answer for 5 s (src/intake/disk.rs).
const DISK_GRACE: Duration = Duration::from_secs(6);
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

fn mib(b: u64) -> f64 {
    b as f64 / (1u64 << 20) as f64
}

/// One full-disk episode: when it starts and ends, counted from the start of the run.
#[derive(Clone, Copy, Debug)]
struct Episode {
    start_s: f64,
    end_s: f64,
}

fn episodes(args: &Args, rng: &mut Xoshiro256PlusPlus) -> Vec<Episode> {
    let total = args.duration.as_secs_f64();
    let n = ((total / args.disk_every.as_secs_f64()).round() as usize).max(1);
    let slot = total / n as f64;
    let len = args.disk_episode.as_secs_f64().min(slot / 3.0);
    (0..n)
        .map(|i| {
            let start_s = i as f64 * slot + slot * rng.random_range(0.35..0.55);
            Episode {
                start_s,
                end_s: start_s + len,
            }
        })
        .collect()
}

struct Chaos {
    rng: Xoshiro256PlusPlus,
    next_kill_s: f64,
    kills: Vec<(f64, &'static str)>,
}

impl Chaos {
    fn schedule(&mut self, now_s: f64, every: Duration) {
        self.next_kill_s = now_s + every.as_secs_f64() * self.rng.random_range(0.5..1.5);
    }
}

fn run(args: &Args, seed: u64) -> Result<bool, BoxError> {
    let bin = binary(args)?;
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
        &secrets.receiver,
        Duration::from_secs_f64(setup::DESTINATION_TIMEOUT_S + 1.5),
        started,
        std::fs::File::create(work.path().join("deliveries.jsonl"))?,
        sizes.clone(),
    ))?;
    setup::config(&bin, &home_dir, intake_port, rx.port)?;
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
    wait_ready(&rt, intake_port, Duration::from_secs(30))?;

    let disk_on = Arc::new(AtomicBool::new(false));
    let load = {
        let _g = rt.enter();
        load::Load::start(
            load::LoadConfig {
                url: format!("http://127.0.0.1:{intake_port}"),
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

    let episodes = episodes(args, &mut root_rng);
    for e in &episodes {
        println!(
            "soak: full-disk episode planned at t={:.0}s for {:.0}s",
            e.start_s,
            e.end_s - e.start_s
        );
    }
    let mut chaos = Chaos {
        rng: Xoshiro256PlusPlus::seed_from_u64(root_rng.random()),
        next_kill_s: 0.0,
        kills: Vec::new(),
    };
    chaos.schedule(0.0, args.kill_every);
    let mut flap_rng = Xoshiro256PlusPlus::seed_from_u64(root_rng.random());
    let mut next_flap_s = 0.0;
    let mut mode_time: BTreeMap<&'static str, f64> = BTreeMap::new();
    let mut mode = Mode::Ok;
    let mut mode_since = 0.0;
    let mut filler = disk::Filler::new(fs_dir.join("filler"));
    let mut disk_logs: Vec<report::DiskLog> = Vec::new();
    let mut episode_i = 0usize;
    let mut in_episode = false;
    let mut grace_until_s = 0.0;
    let mut last_topup = Instant::now();
    let plant_at_s = args.duration.as_secs_f64() * 0.25;
    let mut planted: Option<String> = None;
    let mut plant_tried = false;
    let db = home_dir.join("spool.db");
    let progress_every = (args.duration.as_secs_f64() / 12.0).max(15.0);
    let mut next_progress = progress_every;
    let total_s = args.duration.as_secs_f64();

    let mut said: HashSet<(&'static str, String, bool)> = HashSet::new();
    while t() < total_s {
        let now = t();
        let disk_window = in_episode || now < grace_until_s;
        for s in [&mut intake, &mut dispatch] {
            if let Some(e) = s.poll(now, disk_window) {
                // The first exit of a kind is a line; a crash loop is summed up at the end.
                let kind = (s.name, e.status.clone(), e.during_disk);
                if said.insert(kind) {
                    println!(
                        "soak: FINDING: {} exited on its own at t={:.1}s ({}){}; restarted {} s later, as Restart= would (repeats are counted in the result)",
                        s.name,
                        e.at_s,
                        e.status,
                        if e.during_disk {
                            " during a full-disk episode"
                        } else {
                            ""
                        },
                        services::RESTART_DELAY.as_secs()
                    );
                }
            }
        }
        // The receiver flaps.
        if now >= next_flap_s {
            *mode_time.entry(mode.name()).or_insert(0.0) += now - mode_since;
            mode = match flap_rng.random_range(0..10) {
                0..=3 => Mode::Ok,
                4 | 5 => Mode::Fail500,
                6 | 7 => Mode::Refuse,
                _ => Mode::Slow,
            };
            mode_since = now;
            rx.set_mode(mode);
            next_flap_s = now + flap_rng.random_range(1.0..8.0);
        }
        // Full-disk episodes.
        if let Some(e) = episodes.get(episode_i) {
            if !in_episode && now >= e.start_s {
                in_episode = true;
                disk_on.store(true, Ordering::SeqCst);
                let free = disk::free_bytes(&fs_dir);
                let added = filler.fill()?;
                last_topup = Instant::now();
                println!(
                    "soak: t={now:.1}s disk episode {}: filled {:.1} MiB ({:.1} MiB were free, {} bytes free now)",
                    episode_i + 1,
                    mib(added),
                    mib(free),
                    disk::free_bytes(&fs_dir)
                );
                disk_logs.push(report::DiskLog {
                    filled_bytes: added,
                    free_before: free,
                    full_at_s: t(),
                    freed_at_s: None,
                });
            } else if in_episode && now >= e.end_s {
                filler.free()?;
                if let Some(d) = disk_logs.last_mut() {
                    d.freed_at_s = Some(t());
                }
                in_episode = false;
                grace_until_s = now + DISK_GRACE.as_secs_f64();
                episode_i += 1;
                println!(
                    "soak: t={now:.1}s disk episode ends: {:.1} MiB free again",
                    mib(disk::free_bytes(&fs_dir))
                );
            } else if in_episode && last_topup.elapsed() >= Duration::from_secs(1) {
                filler.fill()?;
                last_topup = Instant::now();
            }
        }
        if !(in_episode || now < grace_until_s) {
            disk_on.store(false, Ordering::SeqCst);
        }
        // The planted fault, with the dispatcher down so the event is not delivered first.
        if args.plant_loss && !plant_tried && now >= plant_at_s && !disk_window {
            dispatch.sigkill();
            let acked: HashSet<String> = lock(&load.acked).iter().map(|a| a.id.clone()).collect();
            let until = Instant::now() + Duration::from_secs(10);
            while planted.is_none() && Instant::now() < until {
                planted = spool::plant_loss(&db, &acked)?;
                if planted.is_none() {
                    std::thread::sleep(Duration::from_millis(300));
                }
            }
            plant_tried = true;
            match &planted {
                Some(id) => println!(
                    "soak: t={:.1}s PLANTED FAULT: deleted acked event {id} from the spool",
                    t()
                ),
                None => println!(
                    "soak: could not plant the fault (no acked event in an open batch of two)"
                ),
            }
            dispatch.restart_after(Duration::from_millis(200));
        }
        // SIGKILL at random moments, but not around a disk episode, so a service that dies
        // there died by itself.
        let near_episode = episodes
            .get(episode_i)
            .is_some_and(|e| now >= e.start_s - 3.0)
            || disk_window;
        if now >= chaos.next_kill_s && !near_episode {
            let which = chaos.rng.random_range(0..10);
            let delay = Duration::from_secs_f64(chaos.rng.random_range(0.2..3.0));
            // 40 % the intake, 40 % the dispatcher, 20 % both.
            if !(4..8).contains(&which) {
                intake.sigkill();
                intake.restart_after(delay);
                chaos.kills.push((now, "intake"));
            }
            if which >= 4 {
                dispatch.sigkill();
                dispatch.restart_after(delay);
                chaos.kills.push((now, "dispatch"));
            }
            chaos.schedule(now, args.kill_every);
        }
        if now >= next_progress {
            next_progress += progress_every;
            let tl = &load.tally;
            println!(
                "soak: t={now:.0}s acked {} sent {} | receiver {} docs, 200 to {} | kills {} | mode {}",
                lock(&load.acked).len(),
                tl.sent.load(Ordering::Relaxed),
                rx.counters().requests.load(Ordering::Relaxed),
                rx.counters().answered_200.load(Ordering::Relaxed),
                chaos.kills.len(),
                mode.name()
            );
        }
        std::thread::sleep(TICK);
    }
    *mode_time.entry(mode.name()).or_insert(0.0) += t() - mode_since;
    if in_episode {
        filler.free()?;
        if let Some(d) = disk_logs.last_mut() {
            d.freed_at_s = Some(t());
        }
    }
    disk_on.store(false, Ordering::SeqCst);

    // The end: senders stop, the receiver answers 200, both services run, the spool drains.
    println!(
        "soak: t={:.0}s load stops; draining with the receiver answering 200",
        t()
    );
    let tally = load.tally.clone();
    let acked_log = load.acked.clone();
    let late_senders = {
        // Keep reaping and restarting the services while the senders finish.
        let h = rt.spawn(load.stop(GIVE_UP + Duration::from_secs(10)));
        while !h.is_finished() {
            intake.poll(t(), false);
            dispatch.poll(t(), false);
            std::thread::sleep(TICK);
        }
        rt.block_on(h)?
    };
    rx.set_mode(Mode::Ok);
    let drain_started = Instant::now();
    let mut drained = false;
    let mut last_unfinished = -1;
    while drain_started.elapsed() < args.drain_timeout {
        for s in [&mut intake, &mut dispatch] {
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
        let n = spool::open_ro(&db)
            .and_then(|c| spool::unfinished(&c))
            .unwrap_or(-1);
        last_unfinished = n;
        if n == 0 {
            drained = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let drain_s = drain_started.elapsed().as_secs_f64();
    // Let the last answers land before the services stop.
    std::thread::sleep(Duration::from_millis(500));
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
        mode_time_s: &mode_time,
        drained,
        drain_s,
        drain_timeout: args.drain_timeout,
        unfinished: last_unfinished,
        states: &states,
        dead: &dead,
        issues: &issues,
        intake: &intake,
        dispatch: &dispatch,
        soak_rss_kib: services::vm_hwm_kib(std::process::id()).unwrap_or(0),
        kills: &chaos.kills,
        disks: &disk_logs,
        fs_mib,
        fs_used,
        min_free_bytes: setup::MIN_FREE_BYTES,
        stops: (intake_stop, dispatch_stop),
        check: check.err().map(|e| e.to_string()),
        late_senders,
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

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn wait_ready(rt: &tokio::runtime::Runtime, port: u16, within: Duration) -> Result<(), BoxError> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()?;
    let until = Instant::now() + within;
    rt.block_on(async {
        while client
            .get(format!("http://127.0.0.1:{port}/healthz"))
            .send()
            .await
            .is_err()
        {
            if Instant::now() > until {
                return Err::<(), BoxError>("the intake never answered /healthz".into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    })
}
