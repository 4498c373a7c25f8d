//! Dispatcher benchmarks (issue 5). Run through `bench/dispatch.sh`, or
//! `cargo run --release --example bench_dispatch -- <mode>` with mode one of:
//!
//! * `throughput [batches]`: a spool pre-filled through the store API with `batches`
//!   immediate batches over as many keys (default 5 000), drained by the real
//!   `hookspool dispatch` binary (dispatch.parallel = 16, the http destination's
//!   max_inflight = 16) into a hyper receiver in this process. Deliveries/s is counted from
//!   the first claim (min attempts.started_at) to the last mark (max attempts.finished_at).
//! * `latency [n]`: the real `hookspool run` with an immediate source whose http destination
//!   is the receiver in this process; `n` signed webhooks (default 20) sent one at a time,
//!   each timed from just before the send to the document's arrival at the receiver (one
//!   process, one monotonic clock). Prints p50/p99.
//! * `tick [delivered] [open]`: a spool with `delivered` delivered batches (default
//!   1 000 000, each with one event and one attempt) and `open` open batches whose windows
//!   are not ready (default 10 000); times `Engine::tick()` with nothing ready, and each store
//!   call the tick makes, and prints the query plans.
//! * `all`: the three in turn.
//!
//! The delivered rows of `tick` are written with SQL in one transaction straight into the
//! documented schema (migrations/0001_v2.sql): a million store transitions (enqueue, seal,
//! claim, mark: four fsynced transactions each) would take hours. The open batches, which
//! the tick actually reads, are made through the store API. The binary is found next to this
//! example (target/release/hookspool) or at $HOOKSPOOL_BIN.

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
use hookspool::dispatch::Engine;
use hookspool::sources::verify::{MacAlg, mac_hex};
use hookspool::store::{EnqueueOutcome, EnqueueRequest, Role, Store, TICK_QUERIES};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Targets from issue 5, printed beside each figure.
const TARGET_DELIVERIES_PER_S: f64 = 2000.0;
const TARGET_P50_MS: f64 = 5.0;
const TARGET_TICK_MS: f64 = 5.0;
/// Enqueues per store transaction when pre-filling.
const PREFILL_GROUP: usize = 500;
/// Delivered batches per key in the tick spool (1M over 10k keys = 100 per group).
const DELIVERED_PER_KEY: i64 = 100;

fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mode = args.first().map(String::as_str).unwrap_or("all");
    let num = |i: usize, d: i64| -> i64 { args.get(i).and_then(|v| v.parse().ok()).unwrap_or(d) };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    match mode {
        "throughput" => rt.block_on(throughput(num(1, 5000) as usize))?,
        "latency" => rt.block_on(latency(num(1, 20) as usize))?,
        "tick" => tick(num(1, 1_000_000), num(2, 10_000) as usize)?,
        "all" => {
            rt.block_on(throughput(5000))?;
            rt.block_on(latency(20))?;
            tick(1_000_000, 10_000)?;
        }
        other => {
            eprintln!(
                "unknown mode {other:?}: throughput [n] | latency [n] | tick [delivered] [open] | all"
            );
            std::process::exit(2);
        }
    }
    Ok(())
}

/// The `hookspool` binary under test.
fn binary() -> PathBuf {
    if let Some(p) = std::env::var_os("HOOKSPOOL_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("current exe");
    // target/<profile>/examples/bench_dispatch -> target/<profile>/hookspool
    exe.parent()
        .and_then(Path::parent)
        .map(|d| d.join("hookspool"))
        .expect("target directory")
}

/// A receiver answering 200 to everything; every arrival goes to `arrivals` with its time.
struct Receiver {
    addr: SocketAddr,
    count: Arc<AtomicUsize>,
}

async fn receiver(
    arrivals: Option<tokio::sync::mpsc::UnboundedSender<(Instant, Vec<u8>)>>,
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

fn source_toml(name: &str, home: &Path) -> String {
    format!(
        r#"
[sources.{name}]
type = "template"
scheme = "hmac-sha256-hex"
header = "X-Signature"
prefix = "sha256="
key = "payload.topic"
dedup = "payload.id"
span = "immediate"
action = "http-recv"
secrets.secret = {{ file = "{home}/source.secret" }}
"#,
        home = home.display()
    )
}

fn destination_toml(url: &str, home: &Path) -> String {
    format!(
        r#"
[destinations.http-recv]
type = "http"
url = "{url}"
allow_insecure = true
max_inflight = 16
timeout_s = 10
secret = {{ file = "{home}/dest.secret" }}
"#,
        home = home.display()
    )
}

fn write_secrets(home: &Path) -> std::io::Result<()> {
    std::fs::write(home.join("source.secret"), "bench-source-secret")?;
    std::fs::write(home.join("dest.secret"), "bench-destination-secret")
}

fn load(home: &Path) -> Result<Config, BoxError> {
    let inputs = PathInputs {
        home_flag: Some(home.to_path_buf()),
        ..Default::default()
    };
    config::load(&inputs, false)
        .map(|(c, _)| c)
        .map_err(|e| format!("{e}").into())
}

/// An enqueue request for source `source`, routed by the config as the intake would.
fn request(cfg: &Config, source: &str, key: &str, payload: &str, now: f64) -> EnqueueRequest {
    let s = &cfg.sources[source];
    let attrs = BTreeMap::new();
    let r = cfg
        .route(&config::RouteQuery {
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

fn now_unix() -> f64 {
    hookspool::clock::Clock::now(&*hookspool::clock::system())
}

fn counts(store: &Store) -> Result<BTreeMap<String, i64>, BoxError> {
    Ok(store
        .batch_counts()?
        .into_iter()
        .map(|(s, n)| (s.to_string(), n))
        .collect())
}

fn stop(mut child: Child) -> Result<std::process::ExitStatus, BoxError> {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )?;
    Ok(child.wait()?)
}

async fn throughput(n: usize) -> Result<(), BoxError> {
    println!("== throughput: {n} immediate batches over {n} keys, real `hookspool dispatch`");
    let rx = receiver(None).await?;
    let dir = tempfile::tempdir()?;
    let home = dir.path();
    write_secrets(home)?;
    std::fs::write(
        home.join("config.toml"),
        format!(
            "[dispatch]\nparallel = 16\n{}{}",
            source_toml("bench", home),
            destination_toml(&format!("http://{}/hook", rx.addr), home)
        ),
    )?;
    let cfg = load(home)?;
    let mut store = Store::open(&cfg.db, Role::Migrator, Duration::from_secs(30))?;
    let t = Instant::now();
    let now = now_unix();
    let payload = r#"{"id":"x","topic":"k","pad":"0123456789abcdef0123456789abcdef"}"#;
    let reqs: Vec<EnqueueRequest> = (0..n)
        .map(|i| request(&cfg, "bench", &format!("key-{i}"), payload, now))
        .collect();
    for group in reqs.chunks(PREFILL_GROUP) {
        for r in store.enqueue_many(group)? {
            match r? {
                EnqueueOutcome::Queued { .. } => {}
                o => return Err(format!("pre-fill: {o:?}").into()),
            }
        }
    }
    println!(
        "pre-filled {n} open immediate batches in {:.2} s (store API, {PREFILL_GROUP} per transaction)",
        t.elapsed().as_secs_f64()
    );
    // Seal them now (the dispatcher's first tick would) to time the candidate query over a
    // ready backlog: every tick of the drain runs it.
    let sealed = store.seal_ready(now)?.len();
    let mut cands = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        let c = store.candidates(now, 256)?;
        cands.push(t.elapsed().as_secs_f64() * 1e3);
        assert_eq!(c.len(), 256.min(n));
    }
    println!(
        "store.candidates(limit 256) over {sealed} sealed batches: {}",
        stats_ms(cands)
    );
    let log = std::fs::File::create(home.join("dispatch.log"))?;
    let started = Instant::now();
    let child = Command::new(binary())
        .arg("--home")
        .arg(home)
        .arg("dispatch")
        .env_remove("HOOKSPOOL_CONFIG")
        .env_remove("NOTIFY_SOCKET")
        .env_remove("JOURNAL_STREAM")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()?;
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let c = counts(&store)?;
        if c["delivered"] as usize >= n {
            break;
        }
        if Instant::now() > deadline {
            let _ = stop(child);
            return Err(format!("not drained within 300 s: {c:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let drained = started.elapsed();
    let status = stop(child)?;
    let c = counts(&store)?;
    drop(store);
    // Measurement only: read the attempt rows' own timestamps (written by the dispatcher).
    let conn = rusqlite::Connection::open(&cfg.db)?;
    let (first, last, attempts, ok): (f64, f64, i64, i64) = conn.query_row(
        "SELECT min(started_at), max(finished_at), count(*), sum(outcome = 'ok') FROM attempts",
        [],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
    )?;
    let span = last - first;
    let rate = n as f64 / span;
    println!(
        "delivered {} batches ({attempts} attempts, {ok} ok; receiver saw {} requests), dispatcher exit {status}",
        c["delivered"],
        rx.count.load(Ordering::SeqCst)
    );
    println!(
        "first claim -> last mark: {span:.3} s = {rate:.0} deliveries/s   (target >= {TARGET_DELIVERIES_PER_S:.0}: {})",
        verdict(rate >= TARGET_DELIVERIES_PER_S)
    );
    println!(
        "process start -> all delivered (startup, quick_check, recovery included): {:.3} s = {:.0}/s",
        drained.as_secs_f64(),
        n as f64 / drained.as_secs_f64()
    );
    Ok(())
}

fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "MISSED" }
}

/// Nearest-rank percentile of sorted values.
fn pct(sorted: &[f64], p: f64) -> f64 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

async fn latency(n: usize) -> Result<(), BoxError> {
    println!("== latency: {n} signed webhooks one at a time through `hookspool run` (immediate)");
    let (tx, mut arrivals) = tokio::sync::mpsc::unbounded_channel();
    let rx = receiver(Some(tx)).await?;
    let dir = tempfile::tempdir()?;
    let home = dir.path();
    write_secrets(home)?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    std::fs::write(
        home.join("config.toml"),
        format!(
            "[intake]\nlisten = \"127.0.0.1:{port}\"\n[limits]\nmin_free_bytes = 0\n{}{}",
            source_toml("bench", home),
            destination_toml(&format!("http://{}/hook", rx.addr), home)
        ),
    )?;
    let log = std::fs::File::create(home.join("run.log"))?;
    let child = Command::new(binary())
        .arg("--home")
        .arg(home)
        .arg("run")
        .env_remove("HOOKSPOOL_CONFIG")
        .env_remove("NOTIFY_SOCKET")
        .env_remove("JOURNAL_STREAM")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()?;
    let client = reqwest::Client::builder().build()?;
    let base = format!("http://127.0.0.1:{port}");
    let ready_by = Instant::now() + Duration::from_secs(30);
    while client.get(format!("{base}/healthz")).send().await.is_err() {
        if Instant::now() > ready_by {
            let _ = stop(child);
            return Err("hookspool run never served".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let warmup = 3;
    let mut e2e = Vec::new();
    let mut acks = Vec::new();
    for i in 0..warmup + n {
        let body = format!(r#"{{"id":"lat-{i}","topic":"t-{i}","n":{i}}}"#);
        let sig = format!(
            "sha256={}",
            mac_hex(MacAlg::Sha256, b"bench-source-secret", &[body.as_bytes()])
        );
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
            let _ = stop(child);
            return Err(format!("intake answered {}", r.status()).into());
        }
        let (at, _doc) = tokio::time::timeout(Duration::from_secs(10), arrivals.recv())
            .await?
            .ok_or("receiver stopped")?;
        if i >= warmup {
            e2e.push(at.saturating_duration_since(sent).as_secs_f64() * 1e3);
            acks.push(acked.saturating_duration_since(sent).as_secs_f64() * 1e3);
        }
    }
    let status = stop(child)?;
    e2e.sort_by(f64::total_cmp);
    acks.sort_by(f64::total_cmp);
    println!(
        "send -> receive: p50 {:.2} ms   p99 {:.2} ms   min {:.2} ms   max {:.2} ms   (target p50 < {TARGET_P50_MS} ms: {})",
        pct(&e2e, 50.0),
        pct(&e2e, 99.0),
        e2e[0],
        e2e[e2e.len() - 1],
        verdict(pct(&e2e, 50.0) < TARGET_P50_MS)
    );
    println!(
        "send -> 2xx (the intake's commit): p50 {:.2} ms   p99 {:.2} ms   ({warmup} warm-up requests not counted; run exit {status})",
        pct(&acks, 50.0),
        pct(&acks, 99.0)
    );
    Ok(())
}

fn stats_ms(mut v: Vec<f64>) -> String {
    v.sort_by(f64::total_cmp);
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    format!(
        "mean {mean:.3} ms   p50 {:.3} ms   p99 {:.3} ms   max {:.3} ms",
        pct(&v, 50.0),
        pct(&v, 99.0),
        v[v.len() - 1]
    )
}

fn tick(delivered: i64, open: usize) -> Result<(), BoxError> {
    println!(
        "== tick: {delivered} delivered batches (with events and attempts) + {open} open batches, nothing ready"
    );
    let dir = tempfile::tempdir()?;
    let home = dir.path();
    write_secrets(home)?;
    std::fs::write(
        home.join("config.toml"),
        format!(
            "[dispatch]\nparallel = 16\n{}\nquiet_s = 3600\nmax_s = 7200\n{}",
            source_toml("bench", home).replace("span = \"immediate\"\n", ""),
            destination_toml("http://127.0.0.1:9/hook", home)
        ),
    )?;
    let cfg = load(home)?;
    let mut store = Store::open(&cfg.db, Role::Migrator, Duration::from_secs(30))?;
    let now = now_unix();
    let keys = (delivered / DELIVERED_PER_KEY).max(open as i64).max(1);

    // Delivered history, bulk-written in one transaction (see the module comment).
    let t = Instant::now();
    {
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
    println!(
        "enqueued {open} open batches in {:.1} s (store API); spool file {:.0} MiB; counts {:?}",
        t.elapsed().as_secs_f64(),
        std::fs::metadata(&cfg.db)?.len() as f64 / (1024.0 * 1024.0),
        counts(&store)?
    );

    // Query plans, for the record.
    {
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
    let iters = 2000;
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
    println!("store.seal_ready            {}", stats_ms(seal));
    println!("store.recover_expired_leases {}", stats_ms(recover));
    println!("store.candidates            {}", stats_ms(cands));

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
    let mut sorted = ticks.clone();
    sorted.sort_by(f64::total_cmp);
    println!(
        "Engine::tick() x{iters}       {}   (target < {TARGET_TICK_MS} ms: {})",
        stats_ms(ticks),
        verdict(pct(&sorted, 99.0) < TARGET_TICK_MS)
    );
    Ok(())
}
