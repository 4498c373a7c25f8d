//! Dispatcher benchmarks (issues 5 and 13). Run through `bench/dispatch.sh`, or
//! `cargo run --release --example bench_dispatch -- <mode> [--smoke]` with mode one of:
//!
//! * `throughput [batches]`: a spool pre-filled through the store API with `batches` sealed
//!   batches over as many keys (default 5 000), drained by the real `hookspool dispatch`
//!   binary (`SLOTS` = 16: dispatch.parallel and the http destination's max_inflight) into
//!   a hyper receiver in this process. Deliveries/s is counted from the first claim (min
//!   attempts.started_at) to the last mark (max attempts.finished_at). Also times one
//!   `Store::candidates(256)` over the sealed backlog.
//! * `slots [batches] [slots]`: `throughput` with `slots` requests in flight (default 64)
//!   instead of 16, for the record: a delivery's slot is held from the tick that claims it
//!   to the tick that records it, so with a fast receiver the slots, not the work, bound the
//!   rate (each drain prints the mean claim -> mark time and the request's share of it).
//! * `backlog [batches] [keys] [seconds]`: the same with a backlog on few keys (default
//!   60 000 batches over 50 keys), drained for at most `seconds` (default 20), twice,
//!   between three `throughput` drains: issue 13's "backlog shape does not matter" is this
//!   rate against that of the 1-per-key drains beside it.
//! * `latency [n]`: the real `hookspool run` with an immediate source whose http destination
//!   is the receiver in this process; `n` signed webhooks (default 50) sent one at a time,
//!   each timed from just before the send to its 2xx and to the document's arrival at the
//!   receiver (one process, one monotonic clock). Prints p50/p99 of both.
//! * `tick [delivered] [open]`: a spool with `delivered` delivered batches (default
//!   1 000 000, each with one event and one attempt) and `open` open batches whose windows
//!   are not ready (default 10 000); times `Engine::tick()` with nothing ready, and each store
//!   call the tick makes, and prints the query plans.
//! * `rate [batches] [max_per_s] [burst]`: `throughput` against a destination with a request
//!   rate (issue 35; default 200 batches over 10 keys at max_per_s = 50, burst = 1): the
//!   achieved start rate after the burst, (batches - burst) / (last start - first start)
//!   from the attempt rows, against max_per_s (the ratio, at most 1 and close to it), and
//!   the most starts in any one second against max_per_s + burst.
//! * `pg [batches] [rounds]` (issue 32): `throughput` on a SQLite spool and on a PostgreSQL
//!   spool (`[spool] backend = "postgres"`, a fresh database of one throwaway cluster per
//!   drain, tests/support/pg.rs), alternated `rounds` times (default 2): deliveries/s of both
//!   and their ratio, the dispatcher's CPU per delivery on each, and that of the PostgreSQL
//!   server processes (the postmaster and its children, /proc) over the PostgreSQL drains.
//! * `pg_backlog [batches] [keys]` (issue 32): `Store::candidates(256)` over a backlog of
//!   60 000 sealed batches on 50 keys (by default) pre-filled through the store API, on
//!   PostgreSQL and, in the same run, on SQLite.
//! * `pg_tick [delivered] [open]` (issue 32): `tick` on a PostgreSQL spool; the delivered
//!   history bulk-written with `INSERT ... SELECT generate_series` into the documented
//!   schema (migrations/postgres/), then `VACUUM ANALYZE` (what autovacuum does on its own
//!   after that many inserts).
//! * `pair [batches] [rounds]` (issue 36): `throughput` by the binary at $HOOKSPOOL_BASE_BIN
//!   and by this build, alternated `rounds` times (default 3, the order swapped every
//!   round): deliveries/s of both and their ratio, CPU per delivery and KiB written per
//!   delivery of each. The spool is pre-filled by this build's store, so the base binary
//!   must read this schema (`bench/run.sh` builds it from $BENCH_DISPATCH_BASE_REV).
//! * `pg_latency [n]` (issue 33): `latency` on a PostgreSQL spool (a fresh database of a
//!   throwaway cluster) through two processes, `hookspool intake` and `hookspool dispatch`,
//!   each with a home of its own as on two hosts: the intake's commit reaches the dispatcher
//!   through PostgreSQL's NOTIFY only, the tick's poll being the backstop. `homes` 1 puts
//!   both on one home instead (the intake's datagram wakes the dispatcher as well), for a
//!   comparison. Prints the same figures, `pg_` prefixed.
//! * `all`: each in turn (not the PostgreSQL modes, not `pair`).
//!
//! `--smoke` shrinks every count so that each mode runs in a second or two and still prints
//! every figure. The delivered rows of `tick` are written with SQL in one transaction
//! straight into the documented schema (migrations/0001_v2.sql): a million store
//! transitions (enqueue, seal, claim, mark: four fsynced transactions each) would take
//! hours. The open and sealed batches, which the dispatcher actually reads, are made through
//! the store API. The binary is found next to this example or at $HOOKSPOOL_BIN.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use hookspool::config::Config;
use hookspool::dispatch::Engine;
use hookspool::store::{EnqueueOutcome, EnqueueRequest, Role, Store, TICK_QUERIES};

use common::{
    BoxError, SLOTS, counts, destination_toml, destination_toml_slots, figure, free_port, load,
    mean, now_unix, pct, receiver, sign, smoke_flag, source_toml, spawn_hookspool, stats_ms, stop,
    wait_served, write_secrets,
};

/// Enqueues per store transaction when pre-filling.
const PREFILL_GROUP: usize = 500;
/// Delivered batches per key in the tick spool (1M over 10k keys = 100 per group).
const DELIVERED_PER_KEY: i64 = 100;
/// `Store::candidates` calls timed per backlog.
const CANDIDATE_CALLS: usize = 20;
/// The limit the dispatcher's tick asks `candidates` for.
const CANDIDATES_LIMIT: usize = 256;
/// A full drain of `throughput` must finish within this.
const DRAIN_S_MAX: f64 = 300.0;
/// The slots of `slots` (`throughput` has `SLOTS`).
const WIDE_SLOTS: usize = 64;
/// Warm-up webhooks of `latency`, not counted.
const LATENCY_WARMUP: usize = 3;
/// The burst of `rate` unless given, and its keys.
const RATE_BURST: u32 = 1;
const RATE_KEYS: usize = 10;
/// Rounds of `pg` (SQLite and PostgreSQL drains alternated).
const PG_ROUNDS: usize = 2;

/// The counts of one run of every mode, full or smoke.
struct Sizes {
    batches: usize,
    backlog_batches: usize,
    backlog_keys: usize,
    backlog_s: f64,
    latency_n: usize,
    delivered: i64,
    open: usize,
    ticks: usize,
    rate_batches: usize,
    rate_per_s: f64,
}

const FULL: Sizes = Sizes {
    batches: 5000,
    backlog_batches: 60_000,
    backlog_keys: 50,
    backlog_s: 20.0,
    latency_n: 50,
    delivered: 1_000_000,
    open: 10_000,
    ticks: 2000,
    rate_batches: 200,
    rate_per_s: 50.0,
};

const SMOKE: Sizes = Sizes {
    batches: 200,
    backlog_batches: 600,
    backlog_keys: 5,
    backlog_s: 2.0,
    latency_n: 5,
    delivered: 20_000,
    open: 200,
    ticks: 200,
    rate_batches: 30,
    rate_per_s: 20.0,
};

fn main() -> Result<(), BoxError> {
    let (smoke, args) = smoke_flag();
    let z = if smoke { SMOKE } else { FULL };
    let mode = args.first().map(String::as_str).unwrap_or("all");
    let num = |i: usize, d: f64| -> f64 { args.get(i).and_then(|v| v.parse().ok()).unwrap_or(d) };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    match mode {
        "throughput" => rt.block_on(throughput(num(1, z.batches as f64) as usize))?,
        "slots" => rt.block_on(slots(
            num(1, z.batches as f64) as usize,
            num(2, WIDE_SLOTS as f64) as usize,
        ))?,
        "backlog" => rt.block_on(backlog(
            num(1, z.backlog_batches as f64) as usize,
            num(2, z.backlog_keys as f64) as usize,
            num(3, z.backlog_s),
            z.batches,
        ))?,
        "latency" => rt.block_on(latency(
            num(1, z.latency_n as f64) as usize,
            Duration::from_secs_f64(num(2, 0.0) / 1e3),
        ))?,
        "pg_latency" => rt.block_on(pg_latency(
            num(1, z.latency_n as f64) as usize,
            num(2, 2.0) as usize,
            Duration::from_secs_f64(num(3, 0.0) / 1e3),
        ))?,
        "rate" => rt.block_on(rate(
            num(1, z.rate_batches as f64) as usize,
            num(2, z.rate_per_s),
            num(3, RATE_BURST as f64) as u32,
        ))?,
        "tick" => tick(
            num(1, z.delivered as f64) as i64,
            num(2, z.open as f64) as usize,
            z.ticks,
            None,
        )?,
        "pg" => rt.block_on(pg(
            num(1, z.batches as f64) as usize,
            num(2, if smoke { 1.0 } else { PG_ROUNDS as f64 }) as usize,
        ))?,
        "pair" => rt.block_on(pair(
            num(1, z.batches as f64) as usize,
            num(2, if smoke { 1.0 } else { PAIR_ROUNDS as f64 }) as usize,
        ))?,
        "pg_backlog" => rt.block_on(pg_backlog(
            num(1, z.backlog_batches as f64) as usize,
            num(2, z.backlog_keys as f64) as usize,
        ))?,
        "pg_tick" => {
            let cluster = common::pg::Cluster::start()?;
            tick(
                num(1, z.delivered as f64) as i64,
                num(2, z.open as f64) as usize,
                z.ticks,
                Some(&cluster),
            )?;
            cluster.stop()?;
        }
        "all" => {
            rt.block_on(throughput(z.batches))?;
            rt.block_on(slots(z.batches, WIDE_SLOTS))?;
            rt.block_on(backlog(
                z.backlog_batches,
                z.backlog_keys,
                z.backlog_s,
                z.batches,
            ))?;
            rt.block_on(latency(z.latency_n, Duration::ZERO))?;
            rt.block_on(rate(z.rate_batches, z.rate_per_s, RATE_BURST))?;
            tick(z.delivered, z.open, z.ticks, None)?;
        }
        other => {
            eprintln!(
                "unknown mode {other:?}: throughput [n] | slots [n] [slots] | backlog [n] [keys] [s] | latency [n] | rate [n] [max_per_s] [burst] | tick [delivered] [open] | pg [n] [rounds] | pair [n] [rounds] | pg_backlog [n] [keys] | pg_tick [delivered] [open] | pg_latency [n] [homes] | all"
            );
            std::process::exit(2);
        }
    }
    Ok(())
}

/// An enqueue request for source `source`, routed by the config as the intake would.
fn request(cfg: &Config, source: &str, key: &str, payload: &str, now: f64) -> EnqueueRequest {
    let s = &cfg.sources[source];
    let attrs = BTreeMap::new();
    let r = cfg
        .route(&hookspool::config::RouteQuery {
            source: s,
            attrs: &attrs,
            event_action: None,
            destination: None,
        })
        .expect("the source has a route");
    EnqueueRequest {
        source: source.into(),
        key: key.into(),
        event_type: "bench".into(),
        dedup_id: None,
        dedup_window_s: 86_400.0,
        payload: Some(payload.into()),
        raw: None,
        headers: "{}".into(),
        primary: r.primary,
        tees: r.tees,
        quarantine: None,
        now,
    }
}

async fn throughput(n: usize) -> Result<(), BoxError> {
    println!("== throughput: {n} sealed batches over {n} keys, real `hookspool dispatch`");
    let d = drain_all(n, SLOTS).await?;
    figure("dispatch_deliveries_per_s", d.rate);
    figure("dispatch_fdatasync_per_s", d.disk_per_s);
    figure("dispatch_candidates_ms", d.candidates_p50_ms);
    figure("dispatch_cpu_us_per_delivery", d.process_us);
    figure("dispatch_kib_per_delivery", d.kib);
    Ok(())
}

/// Rounds of `pair` (each: one drain by each binary).
const PAIR_ROUNDS: usize = 3;

/// The binary `drain` runs instead of this build's (`pair`'s base drains). A static, not a
/// thread-local: the drain's task may move between the runtime's threads.
static DRAIN_BIN: std::sync::Mutex<Option<std::path::PathBuf>> = std::sync::Mutex::new(None);

/// Issue 36: this build's dispatcher against the base binary's, alternated in one run.
async fn pair(n: usize, rounds: usize) -> Result<(), BoxError> {
    let base = std::path::PathBuf::from(
        std::env::var_os("HOOKSPOOL_BASE_BIN").ok_or("pair needs HOOKSPOOL_BASE_BIN")?,
    );
    println!(
        "== pair: {n} sealed batches over {n} keys, the base binary {} against this build, {rounds} rounds",
        base.display()
    );
    let (mut b, mut t) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        for base_first in [round % 2 == 0, round % 2 != 0] {
            let which = if base_first { "base" } else { "this build" };
            println!("-- round {round}, {which}");
            *DRAIN_BIN.lock().unwrap() = base_first.then(|| base.clone());
            let d = drain_all(n, SLOTS).await;
            *DRAIN_BIN.lock().unwrap() = None;
            let d = d?;
            if base_first { b.push(d) } else { t.push(d) }
        }
        let (x, y) = (&b[round], &t[round]);
        println!("round {round}: this build / base {:.2}x", y.rate / x.rate);
    }
    let m = |v: &[Drain], f: fn(&Drain) -> f64| mean(&v.iter().map(f).collect::<Vec<_>>());
    let (rb, rt) = (m(&b, |d| d.rate), m(&t, |d| d.rate));
    println!(
        "this build {rt:.0} deliveries/s against the base's {rb:.0} = {:.3}x",
        rt / rb
    );
    figure("dispatch_pair_base_deliveries_per_s", rb);
    figure("dispatch_pair_new_deliveries_per_s", rt);
    figure(
        "dispatch_pair_base_cpu_us_per_delivery",
        m(&b, |d| d.process_us),
    );
    figure(
        "dispatch_pair_new_cpu_us_per_delivery",
        m(&t, |d| d.process_us),
    );
    figure("dispatch_pair_base_kib_per_delivery", m(&b, |d| d.kib));
    figure("dispatch_pair_new_kib_per_delivery", m(&t, |d| d.kib));
    Ok(())
}

async fn slots(n: usize, slots: usize) -> Result<(), BoxError> {
    println!("== slots: {n} sealed batches over {n} keys, {slots} requests in flight");
    let d = drain_all(n, slots).await?;
    figure("slots_deliveries_per_s", d.rate);
    figure("slots_fdatasync_per_s", d.disk_per_s);
    figure("slots_cpu_us_per_delivery", d.process_us);
    Ok(())
}

/// `n` batches over `n` keys, every one delivered within `DRAIN_S_MAX`.
async fn drain_all(n: usize, slots: usize) -> Result<Drain, BoxError> {
    drain_all_on(n, slots, None).await
}

/// `drain_all` on SQLite or, with `pg`, on a fresh database of that cluster.
async fn drain_all_on(
    n: usize,
    slots: usize,
    pg: Option<&common::pg::Cluster>,
) -> Result<Drain, BoxError> {
    let d = drain(n, n, DRAIN_S_MAX, slots, "", pg).await?;
    if d.delivered < n {
        return Err(format!(
            "only {} of {n} delivered within {DRAIN_S_MAX} s",
            d.delivered
        )
        .into());
    }
    Ok(d)
}

/// Issue 13 compares this rate with one batch per key "in the same run". A 1-per-key drain
/// of 5 000 lasts under a second, and this machine's speed moves by a third within minutes
/// (the 2026-12-03 runs: the same binary's backlog ratio 1.07x in one run, 0.746x in the
/// next, each drain a minute from the one it was divided by). So the backlog is drained
/// twice, between three 1-per-key drains of `reference` batches, and each backlog drain is
/// divided by the mean of the two beside it; the figure is the mean of both backlog drains
/// over the mean of their neighbours (the middle one counted twice).
async fn backlog(n: usize, keys: usize, seconds: f64, reference: usize) -> Result<(), BoxError> {
    println!(
        "== backlog on few keys: {n} sealed batches over {keys} keys, real `hookspool dispatch` for at most {seconds} s, twice, between three drains of {reference} batches over {reference} keys"
    );
    let mut refs = vec![drain_all(reference, SLOTS).await?.rate];
    let mut drains = Vec::new();
    for _ in 0..2 {
        drains.push(drain(n, keys, seconds, SLOTS, "", None).await?);
        refs.push(drain_all(reference, SLOTS).await?.rate);
    }
    let mut beside = Vec::new();
    for (i, d) in drains.iter().enumerate() {
        let around = (refs[i] + refs[i + 1]) / 2.0;
        beside.push(around);
        println!(
            "backlog drain {}: {:.0} deliveries/s against {:.0} and {:.0} beside it (1 per key) = {:.3}x",
            i + 1,
            d.rate,
            refs[i],
            refs[i + 1],
            d.rate / around
        );
    }
    let of_drains = |f: fn(&Drain) -> f64| mean(&drains.iter().map(f).collect::<Vec<_>>());
    let rate = of_drains(|d| d.rate);
    let reference_rate = mean(&beside);
    println!(
        "backlog: {rate:.0} deliveries/s against {reference_rate:.0} beside it = {:.3}x",
        rate / reference_rate
    );
    figure("backlog_deliveries_per_s", rate);
    figure("backlog_reference_deliveries_per_s", reference_rate);
    // The slower of the two candidate queries (the stricter figure).
    figure(
        "backlog_candidates_ms",
        drains
            .iter()
            .map(|d| d.candidates_p50_ms)
            .fold(0.0, f64::max),
    );
    figure("backlog_cpu_us_per_delivery", of_drains(|d| d.process_us));
    figure("backlog_kib_per_delivery", of_drains(|d| d.kib));
    Ok(())
}

/// What one drain measured.
struct Drain {
    delivered: usize,
    rate: f64,
    /// Every attempt's start (attempts.started_at), in order.
    starts: Vec<f64>,
    /// The dispatcher process's CPU (user + system) per delivered batch.
    process_us: f64,
    /// The PostgreSQL server processes' CPU per delivered batch over the drain (0 on SQLite).
    server_us: f64,
    /// The KiB the dispatcher wrote to the disk per delivered batch.
    kib: f64,
    /// The faster disk probe around the drain (`common::DiskAround`).
    disk_per_s: f64,
    candidates_p50_ms: f64,
}

/// Pre-fill `n` sealed batches of one event over `keys` keys (key i % keys, so each key's
/// batches are FIFO in enqueue order), time the candidate query over them, then run the real
/// dispatcher with `slots` requests in flight until all are delivered or `seconds_max` has
/// passed. `dest_extra` is more keys of the destination's table (e.g. its rate limit).
/// With `pg`, the spool is a fresh database of that cluster (`[spool] backend = "postgres"`).
async fn drain(
    n: usize,
    keys: usize,
    seconds_max: f64,
    slots: usize,
    dest_extra: &str,
    pg: Option<&common::pg::Cluster>,
) -> Result<Drain, BoxError> {
    let rx = receiver(None).await?;
    let dir = tempfile::tempdir()?;
    let home = dir.path();
    write_secrets(home)?;
    let (pg_url, spool_section) = match pg {
        Some(c) => {
            let db = format!("drain_{}", DRAINS.fetch_add(1, Ordering::SeqCst));
            let (url, section) = tokio::task::block_in_place(|| common::pg_spool(c, &db, home))?;
            (Some(url), section)
        }
        None => (None, String::new()),
    };
    std::fs::write(
        home.join("config.toml"),
        format!(
            "[dispatch]\nparallel = {slots}\n{}{}{dest_extra}\n{spool_section}",
            source_toml("bench", home, "span = \"immediate\""),
            destination_toml_slots(&format!("http://{}/hook", rx.addr), home, slots)
        ),
    )?;
    let cfg = load(home)?;
    let mut store = open_spool(&cfg, pg_url.as_deref())?;
    let t = Instant::now();
    let now = now_unix();
    prefill(&cfg, &mut store, n, keys, now)?;
    println!(
        "pre-filled {n} sealed batches in {:.2} s (store API, {PREFILL_GROUP} per transaction{}): {:?}",
        t.elapsed().as_secs_f64(),
        if pg.is_some() { ", PostgreSQL" } else { "" },
        counts(&store)?
    );
    let mut cands = time_candidates(&store, now, keys)?;
    println!(
        "store.candidates(limit {CANDIDATES_LIMIT}) over {n} sealed batches on {keys} keys: {}",
        stats_ms(&mut cands)
    );
    let bin = DRAIN_BIN.lock().unwrap().clone();
    if bin.is_some() && pg.is_none() {
        as_schema_11(&cfg.db)?;
    }
    let before = common::fdatasync_per_s(common::PROBE_S)?;
    let server = || -> Result<f64, BoxError> {
        match pg {
            Some(c) => common::pg_server_cpu_s(c.pid().ok_or("the cluster has no postmaster.pid")?),
            None => Ok(0.0),
        }
    };
    let server_before = server()?;
    let started = Instant::now();
    let child = match bin {
        Some(bin) => common::spawn_binary(&bin, home, "dispatch")?,
        None => spawn_hookspool(home, "dispatch")?,
    };
    let profiler = common::Profiler::start(child.id())?;
    let deadline = started + Duration::from_secs_f64(seconds_max);
    // The receiver's count first: the store is read (a query PostgreSQL's CPU would count)
    // only once every request has arrived, to see the last marks committed.
    loop {
        if Instant::now() > deadline {
            break;
        }
        if rx.count.load(Ordering::SeqCst) >= n && counts(&store)?["delivered"] as usize >= n {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let ran = started.elapsed();
    profiler.finish()?;
    // The dispatcher's CPU over the whole run (start, drain, idle ticks while this loop
    // noticed the end), read before it is stopped: the figure that holds across minutes.
    let cpu = common::thread_cpu_s(child.id())?;
    let written = common::write_bytes(child.id())?;
    let status = stop(child)?;
    let server_s = server()? - server_before;
    let disk = common::DiskAround {
        before,
        after: common::fdatasync_per_s(common::PROBE_S)?,
    };
    let c = counts(&store)?;
    drop(store);
    // Measurement only: read the attempt rows' own timestamps (written by the dispatcher).
    let mut reader = Reader::open(&cfg, pg_url.as_deref())?;
    let r = reader.row(
        "SELECT CAST(min(started_at) AS DOUBLE PRECISION), CAST(max(finished_at) AS DOUBLE PRECISION),
                CAST(count(*) AS DOUBLE PRECISION),
                CAST(sum(CASE WHEN outcome = 'ok' THEN 1 ELSE 0 END) AS DOUBLE PRECISION)
         FROM attempts",
    )?;
    let (first, last, attempts, ok) = (r[0], r[1], r[2] as i64, r[3] as i64);
    let fifo_ok = reader.row(FIFO_SQL)?[0] == 0.0;
    let starts = reader.column("SELECT started_at FROM attempts ORDER BY started_at")?;
    // Where a slot's time goes: from the claim's tick to the mark's tick (the lease a
    // delivery holds), of which the worker's request is `duration_ms` (whole milliseconds,
    // truncated: its mean is a lower bound, that plus 1 an upper one, so the share under
    // 1 ms is printed too); the rest is waiting for the engine (the spawn after the
    // claim's commit, the tick that records the result).
    let r = reader.row(
        "SELECT CAST(avg(finished_at - started_at) * 1e3 AS DOUBLE PRECISION),
                CAST(avg(duration_ms) AS DOUBLE PRECISION),
                CAST(avg(CASE WHEN duration_ms = 0 THEN 1.0 ELSE 0.0 END) AS DOUBLE PRECISION)
         FROM attempts WHERE outcome = 'ok'",
    )?;
    let (lease_ms, request_ms, under_1ms) = (r[0], r[1], r[2]);
    let delivered = c["delivered"] as usize;
    let span = last - first;
    let rate = ok as f64 / span;
    println!(
        "delivered {delivered} of {n} ({attempts} attempts, {ok} ok; receiver saw {} requests), FIFO per key: {}, dispatcher exit {status}",
        rx.count.load(Ordering::SeqCst),
        if fifo_ok { "yes" } else { "NO" }
    );
    println!(
        "first claim -> last mark: {span:.3} s = {rate:.0} deliveries/s; process start -> {}: {:.3} s = {:.0}/s",
        if delivered >= n { "drained" } else { "stopped" },
        ran.as_secs_f64(),
        delivered as f64 / ran.as_secs_f64()
    );
    let cpu_us = |f: &dyn Fn(&str) -> bool| -> f64 {
        cpu.iter()
            .filter(|(k, _)| f(k))
            .map(|(_, v)| v)
            .sum::<f64>()
            * 1e6
            / delivered.max(1) as f64
    };
    let process_us = cpu_us(&|_| true);
    let engine_us = cpu_us(&|k| k == "hookspool");
    let server_us = server_s * 1e6 / delivered.max(1) as f64;
    println!(
        "dispatcher CPU per delivery: process {process_us:.1} us, engine thread {engine_us:.1} us{} (/proc, 10 ms ticks)",
        if pg.is_some() {
            format!("; PostgreSQL server processes {server_us:.1} us")
        } else {
            String::new()
        }
    );
    let kib = written as f64 / 1024.0 / delivered.max(1) as f64;
    println!(
        "dispatcher writes to disk per delivery: {kib:.1} KiB (/proc write_bytes: WAL frames and checkpoints, start included{})",
        if pg.is_some() {
            "; on PostgreSQL the server writes, not the dispatcher"
        } else {
            ""
        }
    );
    println!(
        "per delivery: claim -> mark {lease_ms:.2} ms, of which the request {request_ms:.2} - {:.2} ms ({:.0} % under 1 ms)",
        request_ms + 1.0,
        under_1ms * 100.0
    );
    println!("{}", disk.describe());
    // The blocking client's drop blocks on its own runtime: off this one.
    tokio::task::block_in_place(|| drop(reader));
    if !fifo_ok {
        return Err("a key's batches were delivered out of order".into());
    }
    Ok(Drain {
        delivered,
        rate,
        starts,
        process_us,
        server_us,
        kib,
        disk_per_s: disk.max(),
        candidates_p50_ms: pct(&cands, 50.0),
    })
}

/// PostgreSQL databases made by `drain` so far (each drain gets its own).
static DRAINS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The spool of `cfg`: its SQLite file, or the PostgreSQL database at `pg_url`.
fn open_spool(cfg: &Config, pg_url: Option<&str>) -> Result<Store, BoxError> {
    let timeout = Duration::from_secs(30);
    Ok(match pg_url {
        Some(url) => tokio::task::block_in_place(|| Store::open_pg(url, Role::Migrator, timeout))?,
        None => Store::open(&cfg.db, Role::Migrator, timeout)?,
    })
}

/// The pair's base (`bench/run.sh`'s $BENCH_DISPATCH_BASE_REV, 0f801d1) reads SQLite schema
/// 11 and refuses a newer one; this build's store pre-fills at schema 12, which only added
/// `batches.open_hash` (an open batch's hash as its intake knew it, which SQLite's seal
/// never reads). The pre-filled spool is handed to the base as the schema-11 spool it would
/// be: the column dropped and both version marks set back. A later schema needs a base that
/// reads it instead.
fn as_schema_11(db: &std::path::Path) -> Result<(), BoxError> {
    if hookspool::store::SCHEMA_VERSION != 12 {
        return Err(format!(
            "the pair's base reads schema 11 and this build writes {}: move BENCH_DISPATCH_BASE_REV to a revision that reads it",
            hookspool::store::SCHEMA_VERSION
        )
        .into());
    }
    let conn = rusqlite::Connection::open(db)?;
    conn.execute_batch(
        "ALTER TABLE batches DROP COLUMN open_hash;
         UPDATE meta SET value = '11' WHERE key = 'schema_version';
         PRAGMA user_version = 11;",
    )?;
    Ok(())
}

/// `n` sealed batches of one event over `keys` keys (key i % keys, so each key's batches
/// are FIFO in enqueue order), through the store API, `PREFILL_GROUP` per transaction.
fn prefill(
    cfg: &Config,
    store: &mut Store,
    n: usize,
    keys: usize,
    now: f64,
) -> Result<(), BoxError> {
    let payload = r#"{"id":"x","topic":"k","pad":"0123456789abcdef0123456789abcdef"}"#;
    let reqs: Vec<EnqueueRequest> = (0..n)
        .map(|i| {
            let mut r = request(cfg, "bench", &format!("key-{}", i % keys), payload, now);
            // A batch of one event, sealed at enqueue: the backlog a receiver's outage leaves.
            r.primary.window.max_events = 1;
            r
        })
        .collect();
    for group in reqs.chunks(PREFILL_GROUP) {
        for r in store.enqueue_many(group)? {
            match r? {
                EnqueueOutcome::Queued { .. } => {}
                o => return Err(format!("pre-fill: {o:?}").into()),
            }
        }
    }
    Ok(())
}

/// `CANDIDATE_CALLS` timed `Store::candidates(CANDIDATES_LIMIT)`, in ms; each must give one
/// head per key (up to the limit).
fn time_candidates(store: &Store, now: f64, keys: usize) -> Result<Vec<f64>, BoxError> {
    let mut cands = Vec::with_capacity(CANDIDATE_CALLS);
    for _ in 0..CANDIDATE_CALLS {
        let t = Instant::now();
        let c = store.candidates(now, CANDIDATES_LIMIT)?;
        cands.push(t.elapsed().as_secs_f64() * 1e3);
        if c.len() != CANDIDATES_LIMIT.min(keys) {
            return Err(format!("candidates gave {} heads for {keys} keys", c.len()).into());
        }
    }
    Ok(cands)
}

/// A later batch of a key delivered before an earlier one (0 when FIFO per key held).
const FIFO_SQL: &str = "SELECT CAST(count(*) AS DOUBLE PRECISION) FROM batches a JOIN batches b
           ON a.key = b.key AND a.route = b.route AND a.id < b.id
         WHERE a.state = 'delivered' AND b.state = 'delivered' AND b.delivered_at < a.delivered_at";

/// A plain connection to a drained spool for the measurement's own queries (written once
/// for both backends: every column a double precision).
enum Reader {
    Lite(rusqlite::Connection),
    Pg(postgres::Client),
}

impl Reader {
    fn open(cfg: &Config, pg_url: Option<&str>) -> Result<Reader, BoxError> {
        Ok(match pg_url {
            Some(url) => Reader::Pg(tokio::task::block_in_place(|| {
                let mut c = common::pg_client(url)?;
                // The drain changed every row since the dispatcher's start analyzed them
                // (all sealed then): without fresh statistics FIFO_SQL's self-join was
                // planned as a nested loop over every pair, minutes on 40 000 batches.
                c.batch_execute("ANALYZE batches, attempts")?;
                Ok::<_, BoxError>(c)
            })?),
            None => Reader::Lite(rusqlite::Connection::open(&cfg.db)?),
        })
    }

    /// Every row's first column.
    fn column(&mut self, sql: &str) -> Result<Vec<f64>, BoxError> {
        Ok(match self {
            Reader::Lite(c) => c
                .prepare(sql)?
                .query_map([], |r| r.get(0))?
                .collect::<Result<_, _>>()?,
            Reader::Pg(c) => tokio::task::block_in_place(|| c.query(sql, &[]))?
                .iter()
                .map(|r| r.get(0))
                .collect(),
        })
    }

    /// The one row's columns (NULL read as NaN).
    fn row(&mut self, sql: &str) -> Result<Vec<f64>, BoxError> {
        Ok(match self {
            Reader::Lite(c) => c.query_row(sql, [], |r| {
                (0..r.as_ref().column_count())
                    .map(|i| r.get::<_, Option<f64>>(i).map(|v| v.unwrap_or(f64::NAN)))
                    .collect::<Result<Vec<f64>, _>>()
            })?,
            Reader::Pg(c) => {
                let r = tokio::task::block_in_place(|| c.query_one(sql, &[]))?;
                (0..r.len())
                    .map(|i| r.get::<_, Option<f64>>(i).unwrap_or(f64::NAN))
                    .collect()
            }
        })
    }
}

/// Deliveries/s on PostgreSQL against SQLite, alternated (see the module doc).
async fn pg(n: usize, rounds: usize) -> Result<(), BoxError> {
    // A host without PostgreSQL cannot print these figures: bench/run.sh then fails on the
    // missing rows, as for any other figure.
    let cluster = tokio::task::block_in_place(common::pg::Cluster::start)?;
    println!(
        "== dispatcher on PostgreSQL against SQLite: {n} sealed batches over {n} keys, real `hookspool dispatch`, {rounds} rounds; cluster {} (postmaster {:?})",
        cluster.dir().display(),
        cluster.pid()
    );
    let (mut lite, mut on_pg) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        for on in if round % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        } {
            println!(
                "-- round {round}, {}",
                if on { "PostgreSQL" } else { "SQLite" }
            );
            if on {
                on_pg.push(drain_all_on(n, SLOTS, Some(&cluster)).await?);
            } else {
                lite.push(drain_all_on(n, SLOTS, None).await?);
            }
        }
        println!(
            "round {round}: PostgreSQL / SQLite {:.2}x",
            on_pg[round].rate / lite[round].rate
        );
    }
    let of = |v: &[Drain], f: fn(&Drain) -> f64| mean(&v.iter().map(f).collect::<Vec<_>>());
    let (p, l) = (of(&on_pg, |d| d.rate), of(&lite, |d| d.rate));
    println!(
        "PostgreSQL {p:.0} deliveries/s against SQLite {l:.0} = {:.3}x",
        p / l
    );
    figure("pg_dispatch_deliveries_per_s", p);
    figure("pg_dispatch_sqlite_deliveries_per_s", l);
    figure(
        "pg_dispatch_cpu_us_per_delivery",
        of(&on_pg, |d| d.process_us),
    );
    figure(
        "pg_dispatch_server_us_per_delivery",
        of(&on_pg, |d| d.server_us),
    );
    figure(
        "pg_dispatch_sqlite_cpu_us_per_delivery",
        of(&lite, |d| d.process_us),
    );
    figure(
        "pg_dispatch_candidates_ms",
        of(&on_pg, |d| d.candidates_p50_ms),
    );
    tokio::task::block_in_place(|| cluster.stop())?;
    Ok(())
}

/// The candidate query over a backlog on few keys, on PostgreSQL and on SQLite in the same
/// run (no drain: the query is the figure).
async fn pg_backlog(n: usize, keys: usize) -> Result<(), BoxError> {
    let cluster = tokio::task::block_in_place(common::pg::Cluster::start)?;
    println!(
        "== candidate query on PostgreSQL against SQLite: {n} sealed batches over {keys} keys, limit {CANDIDATES_LIMIT}"
    );
    let mut p50 = Vec::new();
    let mut analyzed = f64::NAN;
    for on in [true, false] {
        let dir = tempfile::tempdir()?;
        let home = dir.path();
        write_secrets(home)?;
        let (pg_url, section) = if on {
            let (url, section) =
                tokio::task::block_in_place(|| common::pg_spool(&cluster, "backlog", home))?;
            (Some(url), section)
        } else {
            (None, String::new())
        };
        std::fs::write(
            home.join("config.toml"),
            format!(
                "[dispatch]\nparallel = {SLOTS}\n{}{}{section}",
                source_toml("bench", home, "span = \"immediate\""),
                destination_toml("http://127.0.0.1:9/hook", home)
            ),
        )?;
        let cfg = load(home)?;
        let mut store = open_spool(&cfg, pg_url.as_deref())?;
        let now = now_unix();
        let t = Instant::now();
        tokio::task::block_in_place(|| prefill(&cfg, &mut store, n, keys, now))?;
        let name = if on { "PostgreSQL" } else { "SQLite" };
        println!(
            "{name}: pre-filled {n} sealed batches over {keys} keys in {:.1} s (store API)",
            t.elapsed().as_secs_f64()
        );
        let mut cands = tokio::task::block_in_place(|| time_candidates(&store, now, keys))?;
        println!(
            "{name}: store.candidates(limit {CANDIDATES_LIMIT}): {}",
            stats_ms(&mut cands)
        );
        p50.push(pct(&cands, 50.0));
        if let Some(url) = &pg_url {
            // For the record: the same after ANALYZE (autovacuum's, once it has run on the
            // table); the figure above is what the store meets before that.
            tokio::task::block_in_place(|| -> Result<(), BoxError> {
                let mut c = common::pg_client(url)?;
                c.batch_execute("ANALYZE batches")?;
                Ok(())
            })?;
            let mut cands = tokio::task::block_in_place(|| time_candidates(&store, now, keys))?;
            println!(
                "{name}, after ANALYZE batches: store.candidates(limit {CANDIDATES_LIMIT}): {}",
                stats_ms(&mut cands)
            );
            analyzed = pct(&cands, 50.0);
        }
    }
    figure("pg_backlog_candidates_ms", p50[0]);
    figure("pg_backlog_analyzed_candidates_ms", analyzed);
    figure("pg_backlog_sqlite_candidates_ms", p50[1]);
    tokio::task::block_in_place(|| cluster.stop())?;
    Ok(())
}

/// Issue 35: a backlog drained against a destination's request rate. A full bucket lets
/// `burst` start at once, then one a token: the achieved rate is that of the starts after
/// the burst, from the attempt rows' own times (the dispatcher's clock).
async fn rate(n: usize, max_per_s: f64, burst: u32) -> Result<(), BoxError> {
    println!(
        "== rate: {n} sealed batches over {RATE_KEYS} keys, real `hookspool dispatch`, max_per_s = {max_per_s}, burst = {burst}"
    );
    let expected_s = n.saturating_sub(burst as usize) as f64 / max_per_s;
    let d = drain(
        n,
        RATE_KEYS,
        expected_s * 2.0 + 30.0,
        SLOTS,
        &format!("max_per_s = {max_per_s}\nburst = {burst}"),
        None,
    )
    .await?;
    if d.delivered < n || d.starts.len() != n {
        return Err(format!(
            "{} of {n} delivered ({} attempts)",
            d.delivered,
            d.starts.len()
        )
        .into());
    }
    let span = d.starts[n - 1] - d.starts[burst as usize - 1];
    let achieved = (n - burst as usize) as f64 / span;
    let busiest = (0..n)
        .map(|i| {
            d.starts[i..]
                .iter()
                .take_while(|t| **t < d.starts[i] + 1.0)
                .count()
        })
        .max()
        .unwrap_or(0);
    println!(
        "achieved {achieved:.2} starts/s after the burst against max_per_s = {max_per_s} = {:.3}x; busiest second {busiest} starts against max_per_s + burst = {}",
        achieved / max_per_s,
        max_per_s + f64::from(burst)
    );
    figure("rate_deliveries_per_s", achieved);
    figure("rate_ratio_to_max_per_s", achieved / max_per_s);
    figure("rate_busiest_second_starts", busiest as f64);
    if busiest as f64 > max_per_s.ceil() + f64::from(burst) {
        return Err(format!("{busiest} starts in one second: the limit was exceeded").into());
    }
    Ok(())
}

async fn latency(n: usize, gap: Duration) -> Result<(), BoxError> {
    println!(
        "== latency: {n} signed webhooks one at a time through `hookspool run` (immediate){}",
        gap_said(gap)
    );
    let (tx, arrivals) = tokio::sync::mpsc::unbounded_channel();
    let rx = receiver(Some(tx)).await?;
    let dir = tempfile::tempdir()?;
    let home = dir.path();
    write_secrets(home)?;
    let port = free_port()?;
    std::fs::write(
        home.join("config.toml"),
        latency_config(home, port, &rx, ""),
    )?;
    let child = spawn_hookspool(home, "run")?;
    let measured = latency_run(n, port, arrivals, gap).await;
    let status = stop(child)?;
    let (mut e2e, mut acks) = measured?;
    println!("send -> receive: {}", stats_ms(&mut e2e));
    println!(
        "send -> 2xx (the intake's commit): {}   ({LATENCY_WARMUP} warm-up requests not counted; run exit {status})",
        stats_ms(&mut acks)
    );
    figure("latency_receive_p50_ms", pct(&e2e, 50.0));
    figure("latency_receive_p99_ms", pct(&e2e, 99.0));
    figure("latency_ack_p50_ms", pct(&acks, 50.0));
    Ok(())
}

/// `latency` on a PostgreSQL spool (issue 33): a fresh database of a throwaway cluster, the
/// real `hookspool intake` and `hookspool dispatch` as two processes on it, each with a home
/// of its own (as on two hosts: the intake's commit wakes the dispatcher through NOTIFY
/// only, the tick's poll being the backstop), the same body, the same one-at-a-time load.
async fn pg_latency(n: usize, homes: usize, gap: Duration) -> Result<(), BoxError> {
    let cluster = tokio::task::block_in_place(common::pg::Cluster::start)?;
    println!(
        "== latency on PostgreSQL: {n} signed webhooks one at a time through `hookspool intake` + `hookspool dispatch` (immediate), {}{}, cluster {}",
        if homes == 1 {
            "one home (the intake's datagram wakes the dispatcher too)"
        } else {
            "a home each (NOTIFY is the only wake-up)"
        },
        gap_said(gap),
        cluster.dir().display()
    );
    let (tx, arrivals) = tokio::sync::mpsc::unbounded_channel();
    let rx = receiver(Some(tx)).await?;
    let dir = tempfile::tempdir()?;
    // A home each, as on two hosts: the intake's datagram to `<home>/dispatch.sock` finds no
    // dispatcher, so NOTIFY is its only way to wake one. With `homes` 1 (for a comparison),
    // both on one home: the datagram wakes the dispatcher too, as on one host.
    let home_d = dir.path().join("dispatch");
    let home_i = if homes == 1 {
        home_d.clone()
    } else {
        dir.path().join("intake")
    };
    let port = free_port()?;
    let (_, spool_section) = {
        std::fs::create_dir(&home_d)?;
        tokio::task::block_in_place(|| common::pg_spool(&cluster, "latency", &home_d))?
    };
    if homes != 1 {
        std::fs::create_dir(&home_i)?;
        std::fs::copy(home_d.join("pg-url"), home_i.join("pg-url"))?;
    }
    let distinct: &[&std::path::PathBuf] = if homes == 1 {
        &[&home_d]
    } else {
        &[&home_i, &home_d]
    };
    for home in distinct {
        write_secrets(home)?;
        std::fs::write(
            home.join("config.toml"),
            latency_config(
                home,
                port,
                &rx,
                &spool_section.replace(
                    &home_d.join("pg-url").display().to_string(),
                    &home.join("pg-url").display().to_string(),
                ),
            ),
        )?;
    }
    // The schema first, by `hookspool migrate` of the binary measured (`HOOKSPOOL_BIN`, so
    // an older build can be measured on its own schema): neither service migrates a spool
    // the other may be using.
    let migrated = std::process::Command::new(common::binary()?)
        .arg("--home")
        .arg(&home_d)
        .arg("migrate")
        .env_remove("HOOKSPOOL_CONFIG")
        .output()?;
    if !migrated.status.success() {
        return Err(format!(
            "hookspool migrate: {}: {}",
            migrated.status,
            String::from_utf8_lossy(&migrated.stderr)
        )
        .into());
    }
    let dispatch = spawn_hookspool(&home_d, "dispatch")?;
    let intake = match spawn_hookspool(&home_i, "intake") {
        Ok(c) => c,
        Err(e) => {
            stop(dispatch)?;
            return Err(e);
        }
    };
    let measured = latency_run(n, port, arrivals, gap).await;
    let intake_status = stop(intake)?;
    let dispatch_status = stop(dispatch)?;
    let (mut e2e, mut acks) = match measured {
        Ok(m) => m,
        Err(e) => {
            for (home, log) in [(&home_i, "intake.log"), (&home_d, "dispatch.log")] {
                let text = std::fs::read_to_string(home.join(log)).unwrap_or_default();
                eprintln!("--- {log}:\n{text}");
            }
            return Err(e);
        }
    };
    println!("send -> receive: {}", stats_ms(&mut e2e));
    println!(
        "send -> 2xx (the intake's commit): {}   ({LATENCY_WARMUP} warm-up requests not counted; intake {intake_status}, dispatch {dispatch_status})",
        stats_ms(&mut acks)
    );
    figure("pg_latency_receive_p50_ms", pct(&e2e, 50.0));
    figure("pg_latency_receive_p99_ms", pct(&e2e, 99.0));
    figure("pg_latency_ack_p50_ms", pct(&acks, 50.0));
    tokio::task::block_in_place(|| cluster.stop())?;
    Ok(())
}

/// The config of `latency` and `pg_latency`: an immediate source into the receiver.
fn latency_config(home: &std::path::Path, port: u16, rx: &common::Receiver, spool: &str) -> String {
    format!(
        "[intake]\nlisten = \"127.0.0.1:{port}\"\n[limits]\nmin_free_bytes = 0\n{}{}{spool}",
        source_toml(
            "bench",
            home,
            "dedup = \"payload.id\"\nspan = \"immediate\""
        ),
        destination_toml(&format!("http://{}/hook", rx.addr), home)
    )
}

/// Send `LATENCY_WARMUP + n` webhooks one at a time to the intake on `port`, each timed from
/// just before the send to its 2xx and to the document's arrival at the receiver: the
/// counted ones' (send -> receive, send -> 2xx) in ms.
async fn latency_run(
    n: usize,
    port: u16,
    mut arrivals: tokio::sync::mpsc::UnboundedReceiver<common::Arrival>,
    gap: Duration,
) -> Result<(Vec<f64>, Vec<f64>), BoxError> {
    let client = reqwest::Client::builder().build()?;
    let base = format!("http://127.0.0.1:{port}");
    wait_served(&client, &base).await?;
    let mut e2e = Vec::new();
    let mut acks = Vec::new();
    for i in 0..LATENCY_WARMUP + n {
        let body = format!(r#"{{"id":"lat-{i}","topic":"t-{i}","n":{i}}}"#);
        let sig = sign(body.as_bytes());
        let sent = Instant::now();
        let r = client
            .post(format!("{base}/hooks/bench"))
            .header("X-Signature", sig)
            .header("Content-Type", "application/json")
            .body(body)
            .send()
            .await?;
        let acked = Instant::now();
        if r.status() != 200 {
            return Err(format!("intake answered {}", r.status()).into());
        }
        let (at, _doc) = tokio::time::timeout(Duration::from_secs(10), arrivals.recv())
            .await?
            .ok_or("receiver stopped")?;
        if i >= LATENCY_WARMUP {
            e2e.push(at.saturating_duration_since(sent).as_secs_f64() * 1e3);
            acks.push(acked.saturating_duration_since(sent).as_secs_f64() * 1e3);
        }
        if !gap.is_zero() {
            tokio::time::sleep(gap).await;
        }
    }
    Ok((e2e, acks))
}

/// How the latency modes space their webhooks, for their headings.
fn gap_said(gap: Duration) -> String {
    if gap.is_zero() {
        ", each sent when the one before arrived".into()
    } else {
        format!(
            ", each sent {:.0} ms after the one before arrived (the dispatcher idle by then)",
            gap.as_secs_f64() * 1e3
        )
    }
}

fn tick(
    delivered: i64,
    open: usize,
    iters: usize,
    pg: Option<&common::pg::Cluster>,
) -> Result<(), BoxError> {
    let on = if pg.is_some() { " on PostgreSQL" } else { "" };
    println!(
        "== tick{on}: {delivered} delivered batches (with events and attempts) + {open} open batches, nothing ready"
    );
    let dir = tempfile::tempdir()?;
    let home = dir.path();
    write_secrets(home)?;
    let (pg_url, section) = match pg {
        Some(c) => {
            let (url, section) = common::pg_spool(c, "tick", home)?;
            (Some(url), section)
        }
        None => (None, String::new()),
    };
    std::fs::write(
        home.join("config.toml"),
        format!(
            "[dispatch]\nparallel = {SLOTS}\n{}{}{section}",
            source_toml("bench", home, "quiet_s = 3600\nmax_s = 7200"),
            destination_toml("http://127.0.0.1:9/hook", home)
        ),
    )?;
    let cfg = load(home)?;
    let mut store = open_spool(&cfg, pg_url.as_deref())?;
    let now = now_unix();
    let keys = (delivered / DELIVERED_PER_KEY).max(open as i64).max(1);

    // Delivered history, bulk-written in one transaction (see the module comment).
    let t = Instant::now();
    if let Some(url) = &pg_url {
        pg_bulk_history(url, delivered, keys, now)?;
    } else {
        let mut conn = rusqlite::Connection::open(&cfg.db)?;
        conn.pragma_update(None, "synchronous", "OFF")?;
        let tx = conn.transaction()?;
        let old = now - 3.0 * 86_400.0;
        tx.execute(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1)
             INSERT INTO batches (id, route, source, destination, key, state, first_at, last_at,
                 quiet_s, max_s, max_events, max_bytes, count, bytes, sealed_at, content_hash,
                 attempts, delivered_at)
             SELECT i, 'bench', 'bench', 'http-recv', 'key-' || (i % ?2), 'delivered',
                 ?3 + i * 0.1, ?3 + i * 0.1, 3600, 7200, 500, 1048576, 1, 60, ?3 + i * 0.1 + 1,
                 'sha256:' || hex(randomblob(32)), 0, ?3 + i * 0.1 + 2
             FROM n",
            rusqlite::params![delivered, keys, old],
        )?;
        tx.execute(
            "INSERT INTO events (id, source, route, batch_id, event_type, received_at, payload,
                 headers, size)
             SELECT id, 'bench', 'bench', id, 'bench', first_at,
                 '{\"id\":\"' || id || '\",\"topic\":\"' || key || '\",\"pad\":\"0123456789\"}',
                 '{}', 60
             FROM batches",
            [],
        )?;
        tx.execute(
            "INSERT INTO attempts (batch_id, n, destination, started_at, finished_at, outcome,
                 status, duration_ms, delivery_id)
             SELECT id, 1, 'http-recv', sealed_at, delivered_at, 'ok', 200, 3, 'hs_bench_' || id
             FROM batches",
            [],
        )?;
        tx.commit()?;
        // No ANALYZE: the store never runs it, so the planner sees what a real spool shows.
    }
    println!(
        "bulk-wrote {delivered} delivered batches + events + attempts over {keys} keys in {:.1} s (SQL, one transaction)",
        t.elapsed().as_secs_f64()
    );

    // Open batches through the store API: one per key, windows far from ready.
    let t = Instant::now();
    let reqs: Vec<EnqueueRequest> = (0..open)
        .map(|i| {
            let mut r = request(
                &cfg,
                "bench",
                &format!("key-{}", i as i64 % keys),
                r#"{"id":"o","topic":"k"}"#,
                now,
            );
            r.primary.window.quiet_s = 3600.0;
            r.primary.window.max_s = 7200.0;
            r
        })
        .collect();
    for group in reqs.chunks(PREFILL_GROUP) {
        for r in store.enqueue_many(group)? {
            r?;
        }
    }
    let size_mib = match &pg_url {
        Some(url) => {
            let size: i64 = common::pg_client(url)?
                .query_one("SELECT pg_database_size(current_database())", &[])?
                .get(0);
            size as f64
        }
        None => std::fs::metadata(&cfg.db)?.len() as f64,
    } / (1024.0 * 1024.0);
    println!(
        "enqueued {open} open batches in {:.1} s (store API); spool {size_mib:.0} MiB; counts {:?}",
        t.elapsed().as_secs_f64(),
        counts(&store)?
    );

    // Query plans, for the record.
    if let Some(url) = &pg_url {
        pg_plans(url, now)?;
    } else {
        let conn = rusqlite::Connection::open(&cfg.db)?;
        for (name, sql) in TICK_QUERIES {
            let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}"))?;
            let n = stmt.parameter_count();
            let params: Vec<f64> = (0..n).map(|i| if i == 1 { 256.0 } else { now }).collect();
            let rows: Vec<String> = stmt
                .query_map(rusqlite::params_from_iter(params.iter()), |r| {
                    r.get::<_, String>(3)
                })?
                .collect::<Result<_, _>>()?;
            println!("plan {name}: {}", rows.join(" | "));
        }
    }

    // The store calls one by one, then whole ticks.
    let mut seal = Vec::with_capacity(iters);
    let mut recover = Vec::with_capacity(iters);
    let mut cands = Vec::with_capacity(iters);
    for _ in 0..iters {
        let now = now_unix();
        let t = Instant::now();
        let s = store.seal_ready(now)?;
        seal.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        let r = store.recover_expired_leases(now, &[])?;
        recover.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        let c = store.candidates(now, 256)?;
        cands.push(t.elapsed().as_secs_f64() * 1e3);
        if !(s.is_empty() && r.is_empty() && c.is_empty()) {
            return Err("something was ready; the bench wants an idle spool".into());
        }
    }
    println!("store.seal_ready            {}", stats_ms(&mut seal));
    println!("store.recover_expired_leases {}", stats_ms(&mut recover));
    println!("store.candidates            {}", stats_ms(&mut cands));

    let mut engine = Engine::new(Arc::new(cfg), store, hookspool::clock::system())?;
    let t = Instant::now();
    engine.tick()?;
    println!(
        "first tick (includes the hourly retention pass over the backlog): {:.1} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
    let mut ticks = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        let rep = engine.tick()?;
        ticks.push(t.elapsed().as_secs_f64() * 1e3);
        if rep.sealed + rep.recovered + rep.claimed.len() > 0 {
            return Err(format!("a tick did work: {rep:?}").into());
        }
    }
    println!("Engine::tick() x{iters}       {}", stats_ms(&mut ticks));
    let prefix = if pg.is_some() { "pg_" } else { "" };
    figure(&format!("{prefix}tick_mean_ms"), mean(&ticks));
    figure(&format!("{prefix}tick_p99_ms"), pct(&ticks, 99.0));
    if let Some(url) = &pg_url {
        figure("pg_tick_seal_ready_p99_ms", pct(&seal, 99.0));
        figure("pg_tick_candidates_p99_ms", pct(&cands, 99.0));
        // For the record: the same ticks after ANALYZE of batches now that the open batches
        // are in it (autovacuum's, once it has run on the table). The figures above are
        // what the store meets before that: the bulk history was analyzed, the 10 000 open
        // batches the store wrote since were not.
        common::pg_client(url)?.batch_execute("ANALYZE batches")?;
        pg_plans(url, now)?;
        let mut ticks = Vec::with_capacity(iters);
        for _ in 0..iters {
            let t = Instant::now();
            let rep = engine.tick()?;
            ticks.push(t.elapsed().as_secs_f64() * 1e3);
            if rep.sealed + rep.recovered + rep.claimed.len() > 0 {
                return Err(format!("a tick did work: {rep:?}").into());
            }
        }
        println!(
            "after ANALYZE batches: Engine::tick() x{iters} {}",
            stats_ms(&mut ticks)
        );
        figure("pg_tick_analyzed_p99_ms", pct(&ticks, 99.0));
    }
    Ok(())
}

/// `tick`'s delivered history on PostgreSQL: the SQLite version's rows, written with
/// `generate_series` in one transaction (synchronous_commit off for it alone), the identity
/// sequences moved past the ids written, then `VACUUM ANALYZE` (autovacuum's work after
/// that many inserts, done now so the ticks do not race it).
fn pg_bulk_history(url: &str, delivered: i64, keys: i64, now: f64) -> Result<(), BoxError> {
    let mut c = common::pg_client(url)?;
    let old = now - 3.0 * 86_400.0;
    let mut tx = c.transaction()?;
    tx.batch_execute("SET LOCAL synchronous_commit = off")?;
    tx.execute(
        "INSERT INTO batches (id, route, source, destination, key, state, first_at, last_at,
             quiet_s, max_s, max_events, max_bytes, count, bytes, sealed_at, content_hash,
             attempts, delivered_at, first_event_id, finished)
         SELECT i, 'bench', 'bench', 'http-recv', 'key-' || (i % $2), 'delivered',
             old + i * 0.1, old + i * 0.1, 3600, 7200, 500, 1048576, 1, 60, old + i * 0.1 + 1,
             'sha256:' || md5(i::text) || md5((-i)::text), 0, old + i * 0.1 + 2, i, 1
         FROM generate_series(1::bigint, $1) AS i, CAST($3 AS double precision) AS old",
        &[&delivered, &keys, &old],
    )?;
    tx.execute(
        "INSERT INTO events (id, source, route, batch_id, event_type, received_at, payload,
             headers, size)
         SELECT id, 'bench', 'bench', id, 'bench', first_at,
             '{\"id\":\"' || id || '\",\"topic\":\"' || key || '\",\"pad\":\"0123456789\"}',
             '{}', 60
         FROM batches",
        &[],
    )?;
    tx.execute(
        "INSERT INTO attempts (batch_id, n, destination, started_at, finished_at, outcome,
             status, duration_ms, delivery_id)
         SELECT id, 1, 'http-recv', sealed_at, delivered_at, 'ok', 200, 3, 'hs_bench_' || id
         FROM batches",
        &[],
    )?;
    for table in ["batches", "events", "attempts"] {
        tx.batch_execute(&format!(
            "SELECT setval(pg_get_serial_sequence('{table}', 'id'), (SELECT max(id) FROM {table}))"
        ))?;
    }
    tx.commit()?;
    c.batch_execute("VACUUM ANALYZE batches, events, attempts")?;
    Ok(())
}

/// The tick's queries' plans on PostgreSQL, for the record: SQLite's text with the index
/// hints dropped and the parameters as literals (what `store::db::to_pg` does with them,
/// then the values the SQLite plans are shown with).
fn pg_plans(url: &str, now: f64) -> Result<(), BoxError> {
    let mut c = common::pg_client(url)?;
    for (name, sql) in TICK_QUERIES {
        let mut text = String::new();
        let mut words = sql.split_whitespace().peekable();
        while let Some(w) = words.next() {
            if w == "INDEXED" {
                words.next(); // BY
                words.next(); // the index
                continue;
            }
            text.push_str(w);
            text.push(' ');
        }
        // The head walks take (route, key); the others a time and limits.
        let heads = name.starts_with("head_next");
        for i in (1..=9).rev() {
            let value = match (heads, i) {
                (true, 1) => "'bench'".to_string(),
                (true, _) => "'key-0'".to_string(),
                (false, 2) => "256".to_string(),
                (false, 3) => "512".to_string(),
                (false, _) => format!("{now}"),
            };
            text = text.replace(&format!("?{i}"), &value);
        }
        let rows = c.query(&format!("EXPLAIN {text}"), &[])?;
        let plan: Vec<String> = rows
            .iter()
            .map(|r| r.get::<_, String>(0).trim().to_string())
            .collect();
        println!("plan {name}: {}", plan.join(" | "));
    }
    Ok(())
}
