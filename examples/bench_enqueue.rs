//! The store's own cost per event, without HTTP: what the intake's writer thread spends in
//! `Store::enqueue_many` for each request, measured as this thread's CPU time
//! (CLOCK_THREAD_CPUTIME_ID), so the figure hardly moves with what else the machine runs.
//!
//! `cargo run --release --example bench_enqueue -- [events] [--smoke]`
//!
//! `events` requests (default 50 000) shaped like the intake's (a 1 KiB JSON payload on one
//! key, so batches seal at max_events = 500 and their content hash is computed, a kept
//! header, the default window) are enqueued in groups of 64 (what 64 connections give the
//! writer) and then, a tenth as many, in groups of 1, each group one transaction with
//! synchronous=FULL on a real file in $TMPDIR. Prints CPU us per event and events/s.
//!
//! Then the same requests through the PostgreSQL spool's enqueue (`PgStore::enqueue_many`,
//! issue 32) on a throwaway cluster (tests/support/pg.rs: a Unix socket, fsync and
//! synchronous_commit on), in the same run: the `pg_` figures. The CPU figure there is this
//! client thread's only; the server's is not in it.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use hookspool::store::pg::PgStore;
use hookspool::store::{EnqueueOutcome, EnqueueRequest, Role, Store};

use common::{BoxError, destination_toml, figure, load, now_unix, smoke_flag, source_toml};

/// Requests per transaction in the grouped run: the 64 connections of the wrk run.
const GROUP: usize = 64;
const EVENTS_DEFAULT: usize = 50_000;
const EVENTS_SMOKE: usize = 2_000;
const BODY_BYTES: usize = 1024;

fn main() -> Result<(), BoxError> {
    let (smoke, args) = smoke_flag();
    let default = if smoke { EVENTS_SMOKE } else { EVENTS_DEFAULT };
    let events: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(default);
    let dir = tempfile::tempdir()?;
    let home = dir.path();
    common::write_secrets(home)?;
    std::fs::write(
        home.join("config.toml"),
        format!(
            "{}{}",
            source_toml("bench", home, ""),
            destination_toml("http://127.0.0.1:9/hook", home)
        ),
    )?;
    let cfg = load(home)?;
    let mut store = Store::open(&cfg.db, Role::Migrator, Duration::from_secs(30))?;
    let route = cfg
        .route(&hookspool::config::RouteQuery {
            source: &cfg.sources["bench"],
            attrs: &BTreeMap::new(),
            event_action: None,
            destination: None,
        })
        .ok_or("the source has no route")?;
    let prefix = r#"{"topic":"octo/bench","action":"synchronize","pad":""#;
    let payload = format!("{prefix}{}\"}}", "x".repeat(BODY_BYTES - prefix.len() - 2));
    let request = |now: f64| EnqueueRequest {
        source: "bench".into(),
        key: "octo/bench".into(),
        event_type: "synchronize".into(),
        dedup_id: None,
        dedup_window_s: 86_400.0,
        payload: Some(payload.clone()),
        raw: None,
        headers: r#"{"user-agent":"bench"}"#.into(),
        primary: route.primary.clone(),
        tees: route.tees.clone(),
        quarantine: None,
        now,
    };
    println!(
        "== store enqueue: {events} requests of {BODY_BYTES} B in groups of {GROUP}, then {} in groups of 1, on {}",
        events / 10,
        cfg.db.display()
    );
    let grouped = run(&mut store, events, GROUP, &request)?;
    let single = run(&mut store, events / 10, 1, &request)?;
    figure("enqueue_cpu_us_per_event", grouped.0);
    figure("enqueue_per_s", grouped.1);
    figure("enqueue_group1_cpu_us_per_event", single.0);
    figure("enqueue_group1_per_s", single.1);

    // The same on PostgreSQL. A host without it cannot print these figures: bench/run.sh
    // then fails on the missing rows, as for any other figure.
    let cluster = common::pg::Cluster::start()?;
    let url = cluster.database("bench");
    let mut pg = PgStore::open(&url, Role::Migrator)?;
    println!("== the same on PostgreSQL, {}", pg.target());
    let grouped = run_on(&mut |r| Ok(pg.enqueue_many(r)?), events, GROUP, &request)?;
    let single = run_on(&mut |r| Ok(pg.enqueue_many(r)?), events / 10, 1, &request)?;
    figure("pg_enqueue_cpu_us_per_event", grouped.0);
    figure("pg_enqueue_per_s", grouped.1);
    figure("pg_enqueue_group1_per_s", single.1);
    drop(pg);
    cluster.stop()?;
    Ok(())
}

type Outcomes = Vec<hookspool::store::Result<EnqueueOutcome>>;

fn run(
    store: &mut Store,
    n: usize,
    group: usize,
    request: &dyn Fn(f64) -> EnqueueRequest,
) -> Result<(f64, f64), BoxError> {
    run_on(&mut |r| Ok(store.enqueue_many(r)?), n, group, request)
}

/// Enqueue `n` requests `group` per transaction; returns (CPU us per event, events/s).
fn run_on(
    enqueue_many: &mut dyn FnMut(&[EnqueueRequest]) -> Result<Outcomes, BoxError>,
    n: usize,
    group: usize,
    request: &dyn Fn(f64) -> EnqueueRequest,
) -> Result<(f64, f64), BoxError> {
    let (mut cpu, mut done) = (0.0, 0usize);
    let mut commits = Vec::with_capacity(n / group + 1);
    let wall = Instant::now();
    while done < n {
        let k = group.min(n - done);
        let now = now_unix();
        let reqs: Vec<EnqueueRequest> = (0..k).map(|_| request(now)).collect();
        let t = thread_cpu_s();
        let w = Instant::now();
        let results = enqueue_many(&reqs)?;
        commits.push(w.elapsed().as_secs_f64() * 1e3);
        cpu += thread_cpu_s() - t;
        for r in results {
            match r? {
                EnqueueOutcome::Queued { .. } => {}
                o => return Err(format!("unexpected {o:?}").into()),
            }
        }
        done += k;
    }
    let secs = wall.elapsed().as_secs_f64();
    let per_event_us = cpu * 1e6 / n as f64;
    println!(
        "groups of {group:>3}: {n} events in {secs:.2} s = {:.0}/s; enqueue_many CPU {per_event_us:.1} us per event; one group's transaction: {}",
        n as f64 / secs,
        common::stats_ms(&mut commits)
    );
    Ok((per_event_us, n as f64 / secs))
}

/// CPU seconds this thread has used.
fn thread_cpu_s() -> f64 {
    let mut ts = nix::libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into the valid, exclusively borrowed `ts`;
    // CLOCK_THREAD_CPUTIME_ID exists on every Linux.
    unsafe { nix::libc::clock_gettime(nix::libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}
