//! Retention benchmark (issue 11). Run through `bench/retention.sh`, or
//! `cargo run --release --example bench_retention -- [batches] [events_per_batch]
//! [payload_bytes]` (default 2 000 batches of 500 events of 1 KiB: 1 000 000 event rows,
//! every one past retention.delivered_days).
//!
//! Three copies of the same spool, each pruned while a second connection plays the intake
//! (one tiny BEGIN IMMEDIATE write every 5 ms, the way group commits arrive) and records
//! the longest time one of its writes waited for the lock (the intake answers 503 after
//! intake.busy_timeout_s, 10 s):
//!
//! * before: what retention did before issue 11, replayed here as SQL: 1 000 delivered
//!   batches with all their events per transaction (up to 500 000 rows);
//! * `PrunePass`: `Store::prune_step` to the end of the pass in the rhythm of
//!   `Store::prune` (bursts of `PRUNE_BURST_MS`, then `PRUNE_GAP_MS` with the lock free),
//!   every transaction (at most `PRUNE_ROWS_MAX` rows) timed from BEGIN IMMEDIATE to the
//!   end of its COMMIT's fsync (so any wait for the lock and a slow disk count too), the
//!   closing checkpoint apart;
//! * `Engine::tick()`: the dispatcher's own ticks on the real engine while its pass runs
//!   (at most `RETENTION_TICK_BUDGET_MS` of steps per tick, then the gap), paced as its
//!   loop paces them (`Engine::next_wait`): the longest tick.
//!
//! The rows are bulk-written with SQL in one transaction straight into the documented
//! schema (migrations/0001_v2.sql), as `bench_dispatch` does: a million store transitions
//! would take hours.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use hookspool::config::{self, PathInputs};
use hookspool::dispatch::Engine;
use hookspool::dispatch::engine::RETENTION_TICK_BUDGET_MS;
use hookspool::store::{PRUNE_BURST_MS, PRUNE_GAP_MS, PRUNE_ROWS_MAX, Role, Store};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const DAY_S: f64 = 86_400.0;
/// The old retention's batches per transaction.
const OLD_BATCHES_PER_TRANSACTION: i64 = 1000;
/// The intake-like writer writes this often.
const WRITER_EVERY_MS: u64 = 5;

fn main() -> Result<(), BoxError> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    // `--smoke` (bench/run.sh --smoke): tiny counts, so CI proves the figures print.
    let smoke = args.first().is_some_and(|a| a == "--smoke");
    if smoke {
        args.remove(0);
    }
    let num = |i: usize, d: i64| -> i64 { args.get(i).and_then(|v| v.parse().ok()).unwrap_or(d) };
    let batches = num(0, if smoke { 40 } else { 2000 });
    let per_batch = num(1, if smoke { 50 } else { 500 });
    let payload_bytes = num(2, 1024);
    println!(
        "hookspool retention benchmark: {batches} delivered batches x {per_batch} events of {payload_bytes} bytes = {} event rows past retention, {} cores",
        batches * per_batch,
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );

    let old = tempfile::tempdir()?;
    let steps = tempfile::tempdir()?;
    let ticks = tempfile::tempdir()?;
    for dir in [old.path(), steps.path(), ticks.path()] {
        let t = Instant::now();
        build_spool(dir, batches, per_batch, payload_bytes)?;
        println!(
            "built a spool of {:.0} MiB in {:.1} s",
            std::fs::metadata(dir.join("spool.db"))?.len() as f64 / (1024.0 * 1024.0),
            t.elapsed().as_secs_f64()
        );
    }

    let (lock_old, wait_old, total_old) = old_retention(old.path())?;
    println!(
        "before (1 000 batches per transaction): longest transaction {:>9.1} ms, intake's longest wait {:>9.1} ms, pass {:.1} s",
        lock_old * 1e3,
        wait_old * 1e3,
        total_old
    );
    let (lock_new, checkpoint, wait_new, total_new, transactions) = pass_steps(steps.path())?;
    println!(
        "PrunePass (<= {PRUNE_ROWS_MAX} rows per transaction): longest transaction {:>9.1} ms, intake's longest wait {:>9.1} ms, pass {:.1} s in {transactions} transactions + a closing checkpoint of {:.1} ms",
        lock_new * 1e3,
        wait_new * 1e3,
        total_new,
        checkpoint * 1e3
    );
    let (tick_max, wait_ticks, total_ticks, n_ticks) = engine_ticks(ticks.path())?;
    println!(
        "Engine::tick() during the pass: longest tick {:>9.1} ms (retention budget {RETENTION_TICK_BUDGET_MS} ms), intake's longest wait {:>9.1} ms, pass {:.1} s over {n_ticks} ticks",
        tick_max * 1e3,
        wait_ticks * 1e3,
        total_ticks
    );
    println!(
        "ratio before/after: longest transaction {:.0}x, intake's longest wait {:.0}x",
        lock_old / lock_new.max(1e-9),
        wait_old / wait_new.max(1e-9)
    );
    // For bench/run.sh: the pass's longest write lock (its transactions and the engine's
    // ticks, whichever held it longer) and the intake's longest wait beside it.
    println!(
        "FIGURE retention_write_lock_ms {}",
        lock_new.max(tick_max) * 1e3
    );
    println!(
        "FIGURE retention_intake_wait_ms {}",
        wait_new.max(wait_ticks) * 1e3
    );
    Ok(())
}

/// A home with a config and a spool of `batches` delivered batches of `per_batch` events
/// of about `payload_bytes` each, each batch with one attempt, all delivered nine days ago.
fn build_spool(
    home: &Path,
    batches: i64,
    per_batch: i64,
    payload_bytes: i64,
) -> Result<(), BoxError> {
    std::fs::write(home.join("source.secret"), "bench-retention-secret")?;
    std::fs::write(
        home.join("config.toml"),
        format!(
            r#"[limits]
min_free_bytes = 0
[sources.bench]
scheme = "hmac-sha256-hex"
header = "X-Signature"
action = "script:none"
key = "payload.id"
secrets.secret = {{ file = "{home}/source.secret" }}
[destinations."script:none"]
argv = ["/bin/true"]
"#,
            home = home.display()
        ),
    )?;
    // The schema, as the dispatcher would create it.
    drop(Store::open(
        &home.join("spool.db"),
        Role::Migrator,
        Duration::from_secs(30),
    )?);
    let mut conn = rusqlite::Connection::open(home.join("spool.db"))?;
    conn.pragma_update(None, "synchronous", "OFF")?;
    let tx = conn.transaction()?;
    let at = now_unix() - 9.0 * DAY_S;
    tx.execute(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1)
         INSERT INTO batches (id, route, source, destination, key, state, first_at, last_at,
             quiet_s, max_s, max_events, max_bytes, count, bytes, sealed_at, content_hash,
             attempts, delivered_at)
         SELECT i, 'bench', 'bench', 'script:none', 'key-' || i, 'delivered', ?2, ?2, 0, 0,
             ?3, 1048576, ?3, ?3 * ?4, ?2, 'sha256:' || hex(randomblob(32)), 1, ?2 + i * 0.001
         FROM n",
        rusqlite::params![batches, at, per_batch, payload_bytes],
    )?;
    tx.execute(
        "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < ?1 - 1)
         INSERT INTO events (source, route, batch_id, event_type, received_at, payload,
             headers, size)
         SELECT 'bench', 'bench', b.id, 'bench', b.first_at,
             '{\"id\":\"' || b.id || '-' || n.i || '\",\"pad\":\"' || hex(randomblob(?2 / 2)) || '\"}',
             '{}', ?2
         FROM batches b, n ORDER BY b.id, n.i",
        [per_batch, payload_bytes],
    )?;
    tx.execute(
        "INSERT INTO attempts (batch_id, n, destination, started_at, finished_at, outcome,
             status, duration_ms, counted, delivery_id)
         SELECT id, 1, 'script:none', delivered_at, delivered_at, 'ok', 0, 3, 1, 'hs_' || id
         FROM batches",
        [],
    )?;
    tx.execute(
        "INSERT INTO meta (key, value) VALUES ('bench_events', ?1)",
        [(batches * per_batch).to_string()],
    )?;
    tx.commit()?;
    Ok(())
}

fn now_unix() -> f64 {
    hookspool::clock::Clock::now(&hookspool::clock::SystemClock)
}

/// A second connection writing one tiny row every `WRITER_EVERY_MS` until stopped; returns
/// the longest time one write waited for the lock.
fn intake_like_writer(
    db: &Path,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Result<f64, String>> {
    let db = db.to_path_buf();
    std::thread::spawn(move || {
        let conn = rusqlite::Connection::open(&db).map_err(|e| e.to_string())?;
        conn.busy_timeout(Duration::from_secs(60))
            .map_err(|e| e.to_string())?;
        let mut longest = 0f64;
        let mut n = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let t = Instant::now();
            conn.execute_batch(&format!(
                "BEGIN IMMEDIATE; INSERT INTO meta (key, value) VALUES ('bench_writer', '{n}')
                 ON CONFLICT(key) DO UPDATE SET value = excluded.value; COMMIT;"
            ))
            .map_err(|e| e.to_string())?;
            longest = longest.max(t.elapsed().as_secs_f64());
            n += 1;
            std::thread::sleep(Duration::from_millis(WRITER_EVERY_MS));
        }
        Ok(longest)
    })
}

/// The retention of before issue 11: 1 000 delivered batches, with all their events, per
/// transaction. Returns (longest transaction, intake's longest wait, total) in seconds.
fn old_retention(home: &Path) -> Result<(f64, f64, f64), BoxError> {
    let db = home.join("spool.db");
    let stop = Arc::new(AtomicBool::new(false));
    let writer = intake_like_writer(&db, stop.clone());
    let mut conn = rusqlite::Connection::open(&db)?;
    conn.busy_timeout(Duration::from_secs(60))?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    let cutoff = now_unix() - 7.0 * DAY_S;
    let started = Instant::now();
    let mut longest = 0f64;
    loop {
        let t = Instant::now();
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let ids: Vec<i64> = {
            let mut stmt = tx.prepare(
                "SELECT id FROM batches WHERE state = 'delivered' AND delivered_at < ?1 LIMIT ?2",
            )?;
            stmt.query_map(
                rusqlite::params![cutoff, OLD_BATCHES_PER_TRANSACTION],
                |r| r.get(0),
            )?
            .collect::<Result<_, _>>()?
        };
        if ids.is_empty() {
            break;
        }
        for id in &ids {
            tx.execute("DELETE FROM events WHERE batch_id = ?1", [id])?;
            tx.execute("DELETE FROM batches WHERE id = ?1", [id])?;
        }
        tx.commit()?;
        longest = longest.max(t.elapsed().as_secs_f64());
    }
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
    let total = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let wait = writer.join().map_err(|_| "writer panicked")??;
    Ok((longest, wait, total))
}

/// The new pass stepped on the store with every step timed. Returns (longest transaction,
/// the closing checkpoint, intake's longest wait, total, transactions).
fn pass_steps(home: &Path) -> Result<(f64, f64, f64, f64, usize), BoxError> {
    let cfg = load(home)?;
    let stop = Arc::new(AtomicBool::new(false));
    let writer = intake_like_writer(&cfg.db, stop.clone());
    let mut store = Store::open(&cfg.db, Role::Migrator, Duration::from_secs(30))?;
    let mut pass = hookspool::store::PrunePass::new(now_unix(), &cfg.retention());
    let (mut longest, mut steps) = (0f64, 0usize);
    let started = Instant::now();
    // The rhythm of `Store::prune`: bursts of steps, the lock free between them.
    let checkpoint = 'pass: loop {
        let burst = Instant::now() + Duration::from_millis(PRUNE_BURST_MS);
        while Instant::now() < burst {
            let t = Instant::now();
            let done = store.prune_step(&mut pass)?;
            // The last step is the closing checkpoint, reported apart.
            if done {
                break 'pass t.elapsed().as_secs_f64();
            }
            longest = longest.max(t.elapsed().as_secs_f64());
            steps += 1;
        }
        std::thread::sleep(Duration::from_millis(PRUNE_GAP_MS));
    };
    let total = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let wait = writer.join().map_err(|_| "writer panicked")??;
    assert_eq!(
        pass.report.events,
        count_pruned_events(home)?,
        "every event pruned"
    );
    Ok((longest, checkpoint, wait, total, steps))
}

/// Events the bench wrote that are gone now (the spool had nothing else).
fn count_pruned_events(home: &Path) -> Result<i64, BoxError> {
    let conn = rusqlite::Connection::open(home.join("spool.db"))?;
    let left: i64 = conn.query_row("SELECT count(*) FROM events", [], |r| r.get(0))?;
    let written: i64 = conn
        .query_row(
            "SELECT value FROM meta WHERE key = 'bench_events'",
            [],
            |r| r.get::<_, String>(0),
        )?
        .parse()?;
    Ok(written - left)
}

fn load(home: &Path) -> Result<hookspool::config::Config, BoxError> {
    let inputs = PathInputs {
        home_flag: Some(home.to_path_buf()),
        ..Default::default()
    };
    let (cfg, _) = config::load(&inputs, false).map_err(|e| e.to_string())?;
    Ok(cfg)
}

/// The dispatcher's own ticks on the real engine until its first retention pass is done.
/// Returns (longest tick, intake's longest wait, total, ticks).
fn engine_ticks(home: &Path) -> Result<(f64, f64, f64, usize), BoxError> {
    let cfg = load(home)?;
    let stop = Arc::new(AtomicBool::new(false));
    let writer = intake_like_writer(&cfg.db, stop.clone());
    let store = Store::open(&cfg.db, Role::Migrator, Duration::from_secs(30))?;
    let mut engine = Engine::new(Arc::new(cfg), store, hookspool::clock::system())?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let _guard = rt.enter();
    let (mut longest, mut ticks) = (0f64, 0usize);
    let started = Instant::now();
    // The dispatcher loop's rhythm: a tick, then sleep until it has something to do.
    let poll = Duration::from_secs_f64(engine.config().dispatch.poll_s);
    loop {
        let t = Instant::now();
        let rep = engine.tick()?;
        longest = longest.max(t.elapsed().as_secs_f64());
        ticks += 1;
        if !rep.retention_running {
            break;
        }
        std::thread::sleep(engine.next_wait(poll));
    }
    let total = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let wait = writer.join().map_err(|_| "writer panicked")??;
    Ok((longest, wait, total, ticks))
}
