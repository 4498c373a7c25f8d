//! `soak --hosts 2` (issue 33): the soak across hosts on one PostgreSQL spool. Network
//! namespaces as the multi-host test makes them (tests/support/netns.rs): a database host
//! running a throwaway PostgreSQL cluster on TCP (tests/support/pg.rs), two intake hosts and
//! two dispatcher hosts running the real binary (`ip netns exec <ns> hookspool --home <home>
//! intake|dispatch`, each host its own home and config, one active dispatcher and one
//! standby on the spool's advisory lock); the flapping receiver and the load client in the
//! root namespace on the bridge's address, the load round-robin over both intakes.
//!
//! The weather is the one-host soak's without the full disk (the spool is PostgreSQL's, on
//! no tmpfs of ours): the receiver flaps, and about every `--kill-every` one service is
//! SIGKILLed (an intake, either dispatcher, or the active one) and started again 0.2 to 3 s
//! later. Then the same drain, the same checker (`verdict`) and the same report, with each
//! host's figures, the kills by kind and the standbys' takeovers.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rand::rngs::Xoshiro256PlusPlus;
use rand::{RngExt, SeedableRng};

use super::netns::Net;
use super::pg::Cluster;
use super::receiver::Receiver;
use super::services::Service;
use super::{Args, BoxError, GIVE_UP, TICK, load, lock, report, services, setup, spool, verdict};

/// Every host with the last byte of its address; the receiver and the client sit on the
/// bridge (.254) in the root namespace.
const HOSTS: [(&str, u8); 5] = [("pg", 1), ("i1", 2), ("i2", 3), ("d1", 4), ("d2", 5)];
/// The services: (host, command).
const SERVICES: [(&str, &str); 4] = [
    ("i1", "intake"),
    ("i2", "intake"),
    ("d1", "dispatch"),
    ("d2", "dispatch"),
];
/// Each intake's port on its host's address.
const INTAKE_PORT: u16 = 8080;

pub fn run(args: &Args, seed: u64, bin: &Path) -> Result<bool, BoxError> {
    if args.plant_loss {
        return Err("--plant-loss deletes a row of the SQLite spool: not with --hosts".into());
    }
    println!("soak: seed {seed} (replay with --seed {seed})");
    let mut root_rng = Xoshiro256PlusPlus::seed_from_u64(seed);
    let work = tempfile::Builder::new()
        .prefix("hookspool-soak.")
        .tempdir()?;
    let logs = work.path().join("logs");
    std::fs::create_dir_all(&logs)?;
    let net = Net::setup(&HOSTS).map_err(|e| format!("cannot make network namespaces: {e}"))?;
    let cluster = Cluster::start_in_netns(&net.ns("pg"), &net.addr("pg"), &net.cidr())?;
    cluster.database("spool");
    let url = cluster.tcp_url(&net.addr("pg"), "spool", "sslmode=disable");
    let url_file = work.path().join("pg-url");
    write_private(&url_file, &format!("{url}\n"))?;

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let started = Instant::now();
    let t = || started.elapsed().as_secs_f64();

    // One set of secrets every host reads; the receiver checks signatures with its own.
    let shared = private_dir(&work.path().join("shared"))?;
    let secrets = setup::secrets(bin, &shared, seed)?;
    let sizes = Arc::new(std::sync::Mutex::new(std::collections::HashMap::new()));
    let rx = rt.block_on(Receiver::start(
        net.bridge_addr().parse()?,
        &secrets.receiver,
        Duration::from_secs_f64(setup::DESTINATION_TIMEOUT_S + 1.5),
        started,
        std::fs::File::create(work.path().join("deliveries.jsonl"))?,
        sizes.clone(),
    ))?;
    let spool_section = format!(
        "\n[spool]\nbackend = \"postgres\"\nurl = {{ file = \"{}\" }}\n",
        url_file.display()
    );
    let mut homes = Vec::new();
    let mut svcs = Vec::new();
    for (host, command) in SERVICES {
        let home = private_dir(&work.path().join(format!("home-{host}")))?;
        setup::config(
            bin,
            &home,
            &setup::Place {
                secrets_home: shared.clone(),
                listen: format!("{}:{INTAKE_PORT}", net.addr(host)),
                receiver: format!("{}:{}", net.bridge_addr(), rx.port),
                receiver_net: net.cidr(),
                spool: spool_section.clone(),
            },
        )?;
        svcs.push(Service::on_host(
            host,
            command,
            Some(net.ns(host)),
            bin,
            &home,
            &logs,
        ));
        homes.push(home);
    }
    let intake_urls: Vec<String> = SERVICES
        .iter()
        .filter(|(_, c)| *c == "intake")
        .map(|(h, _)| format!("http://{}:{INTAKE_PORT}", net.addr(h)))
        .collect();
    println!(
        "soak: --hosts 2: work dir {}, namespaces on {} (PostgreSQL {}:5432; intakes {}; dispatchers d1 {}, d2 {}), receiver {}:{}",
        work.path().display(),
        net.cidr(),
        net.addr("pg"),
        intake_urls.join(" "),
        net.addr("d1"),
        net.addr("d2"),
        net.bridge_addr(),
        rx.port
    );
    println!(
        "soak: {} load at most {} req/s over {} keys round-robin over both intakes, SIGKILL about every {}, binary {}",
        humantime::format_duration(args.duration),
        args.rate,
        secrets.sources.iter().map(|s| s.keys.len()).sum::<usize>(),
        humantime::format_duration(args.kill_every),
        bin.display()
    );
    // d1 first, so it is the active one at the start and d2 the standby.
    svcs[2].start(t())?;
    wait_logged(&svcs[2], "dispatcher ready", Duration::from_secs(30))?;
    svcs[3].start(t())?;
    svcs[0].start(t())?;
    svcs[1].start(t())?;
    for u in &intake_urls {
        super::wait_ready(&rt, u, Duration::from_secs(30))?;
    }

    let disk_on = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = {
        let _g = rt.enter();
        load::Load::start(
            load::LoadConfig {
                urls: intake_urls.clone(),
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
    let mut weather = super::weather::Weather::new(
        &super::weather::Plan {
            duration: args.duration,
            kill_every: args.kill_every,
            disk_every: args.disk_every,
            disk_episode: args.disk_episode,
            disk: false,
        },
        &mut root_rng,
        work.path(),
        disk_on,
    );
    let progress_every = (args.duration.as_secs_f64() / 12.0).max(15.0);
    let mut next_progress = progress_every;
    let total_s = args.duration.as_secs_f64();
    while t() < total_s {
        let now = t();
        weather.tick(now, &mut svcs.iter_mut().collect::<Vec<_>>(), &rx)?;
        if now >= next_progress {
            next_progress += progress_every;
            println!(
                "soak: t={now:.0}s acked {} sent {} | receiver {} docs, 200 to {} | kills {} | mode {} | active dispatcher {}",
                lock(&load.acked).len(),
                load.tally.sent.load(Ordering::Relaxed),
                rx.counters().requests.load(Ordering::Relaxed),
                rx.counters().answered_200.load(Ordering::Relaxed),
                weather.kills.len(),
                weather.mode.name(),
                active(&svcs)
            );
        }
        std::thread::sleep(TICK);
    }

    let tally = load.tally.clone();
    let acked_log = load.acked.clone();
    let end = super::drain(
        &rt,
        load,
        &mut svcs.iter_mut().collect::<Vec<_>>(),
        &mut weather,
        &rx,
        &t,
        args.drain_timeout,
        &mut || {
            spool::pg::connect(&url)
                .and_then(|mut c| spool::pg::unfinished(&mut c))
                .unwrap_or(-1)
        },
    )?;
    let active_at_end = active(&svcs);
    let stops: Vec<(&'static str, Option<String>)> =
        svcs.iter_mut().map(|s| (s.name, s.stop())).collect();
    rx.flush_log();
    // On d1's home: every home's config names the same spool.
    let check = setup::hookspool(bin, &homes[2], &["check"]);

    let mut conn = spool::pg::connect(&url)?;
    let stored = spool::pg::stored(&mut conn)?;
    let states = spool::pg::states(&mut conn)?;
    let issues = spool::pg::issues(&mut conn)?;
    let dead = spool::pg::dead(&mut conn)?;
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
    let kinds = |k: &str| weather.kill_kinds.iter().filter(|x| x.1 == k).count();
    let extra = vec![
        format!(
            "kills by kind    an intake {}, a dispatcher (either) {}, the active dispatcher {}",
            kinds("intake"),
            kinds("dispatcher"),
            kinds("active dispatcher")
        ),
        format!(
            "takeovers        d1 took the dispatcher lock as a standby {} times, d2 {} times; active at the end: {active_at_end}",
            svcs[2].takeovers(),
            svcs[3].takeovers()
        ),
    ];
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
        services: svcs.iter().collect(),
        soak_rss_kib: services::vm_hwm_kib(std::process::id()).unwrap_or(0),
        kills: &weather.kills,
        disks: &weather.disks,
        fs_mib: 0,
        fs_used: None,
        min_free_bytes: setup::MIN_FREE_BYTES,
        stops,
        check: check.err().map(|e| e.to_string()),
        late_senders: end.late_senders,
        extra,
    };
    report.print();
    let failures = report.failures(args.fail_on_exit);
    let keep = args.keep || !failures.is_empty();
    let work_path = work.path().to_path_buf();
    if keep {
        // The database goes with the cluster; its dump stays for a post-mortem.
        if let Err(e) = dump(&cluster, &work_path.join("spool.sql")) {
            eprintln!("soak: keeping the spool: {e}");
        }
        let _ = work.keep();
    }
    drop(rx);
    drop(cluster);
    drop(net);
    if failures.is_empty() {
        println!("soak: PASS (seed {seed}, --hosts 2)");
    } else {
        println!(
            "soak: FAIL (seed {seed}, --hosts 2): {}",
            failures.join("; ")
        );
    }
    if keep {
        println!(
            "soak: kept {} (logs/ of every host, acks.jsonl, deliveries.jsonl, spool.sql, each host's config)",
            work_path.display()
        );
    }
    Ok(failures.is_empty())
}

/// The dispatcher holding the lock now, by host name.
fn active(svcs: &[Service]) -> &'static str {
    svcs.iter()
        .find(|s| s.active())
        .map(|s| s.name)
        .unwrap_or("none")
}

fn wait_logged(s: &Service, what: &str, within: Duration) -> Result<(), BoxError> {
    let until = Instant::now() + within;
    while !s.logged_since_start(what) {
        if Instant::now() > until {
            return Err(format!("{} did not log {what:?} within {within:?}", s.name).into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

fn private_dir(p: &Path) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().mode(0o700).create(p)?;
    Ok(p.to_path_buf())
}

fn write_private(path: &Path, value: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(value.as_bytes())
}

/// `pg_dump` of the spool database into `to` (a failing run's post-mortem).
fn dump(cluster: &Cluster, to: &Path) -> Result<(), BoxError> {
    let bin = super::pg::bin_dir()?;
    let out = std::process::Command::new(bin.join("pg_dump"))
        .arg(cluster.url("spool"))
        .output()?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned().into());
    }
    std::fs::write(to, out.stdout)?;
    Ok(())
}
