//! `hookspool status` and GET /healthz (spec 11.1): one JSON document, the same for both,
//! and the 200/503 decision.
//!
//! Owns: [`collect`] / [`collect_with`] (the document), [`http_status`], and
//! [`prove_writable`] (the writability proof: the last enqueue when it is recent, else one
//! tiny meta write at most every `WRITABLE_PROOF_S`, so a scrape never forces an fsync by
//! itself). Must not change delivery state; the only write is the proof.
//!
//! `ok` is false (503) when the spool is unwritable or a hard limit is active (free space
//! below `limits.min_free_bytes`, `spool_full` when hardly any space is left at all, or a
//! limit the intake reports through [`Probe`]).
//! `degraded` lists soft problems with `ok` still true: `dead_batches`, `quarantined`,
//! `breaker_open:<destination>`, `source_silent:<source>`, `poll_stale:<instance>`,
//! `dispatcher_heartbeat` (older than `HEARTBEAT_STALE_S`, or never seen).
//!
//! On PostgreSQL, `spool_bytes` is the database's size (`pg_database_size`) and
//! `disk_free_bytes` is null: this host's free space says nothing about the database's, and
//! neither `disk_free_below_min` nor a statvfs `spool_full` applies (a write the server
//! refuses for space is `spool_full` through the probe). `processes` lists every hookspool
//! process connected to the spool, a dispatcher's with `state` "active" or "standby", and
//! `dispatcher.standbys` counts the standbys (0 on SQLite).
//!
//! A destination with a request rate (`max_per_s`) has a `rate` object: the limit, and
//! `waits` / `wait_s`, how many times and for how long its batches waited for it in the
//! live dispatcher (null when none is alive).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde_json::{Map, Value, json};

use crate::config::Config;
use crate::store::{Store, StoreError};
use crate::vocab::{BatchState, BreakerState};

/// A heartbeat older than this marks the dispatcher not alive (spec 11.1).
pub const HEARTBEAT_STALE_S: f64 = 30.0;
/// The writability proof is at most this old (spec 11.1).
pub const WRITABLE_PROOF_S: f64 = 30.0;
/// Less free space than this on the spool's filesystem is a full spool (`spool_full`), what
/// ever `limits.min_free_bytes` says: hardly a commit fits, and while nothing can be
/// written this is how `status` (and /healthz) can tell, since the dispatcher's heartbeat
/// and the `spool:full` issue are writes too.
pub const SPOOL_FULL_FREE_BYTES_MAX: u64 = 64 * 1024;

/// What the caller knows that the tables do not.
#[derive(Debug, Clone, Default)]
pub struct Probe {
    /// The writability proof failed: why (no body, no secret).
    pub unwritable: Option<String>,
    /// Hard limits the intake has engaged (e.g. `spool_full`, `busy`).
    pub limits: Vec<String>,
    /// In-flight attempts per destination, when the caller is the dispatcher.
    pub inflight: Option<BTreeMap<String, i64>>,
}

/// What only the dispatcher's memory holds (in-flight counts, busy retries, rate-limited
/// waits), published with its heartbeat; `Null` unless the dispatcher is `alive`.
pub fn dispatcher_published(store: &Store, alive: bool) -> Result<Value, StoreError> {
    Ok(store
        .meta("dispatcher_published")?
        .filter(|_| alive)
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null))
}

/// Whether the dispatcher's heartbeat is recent enough for it to count as alive.
pub fn dispatcher_alive(store: &Store, now: f64) -> Result<bool, StoreError> {
    Ok(store
        .meta_time("dispatcher_heartbeat_at")?
        .is_some_and(|t| age(now, t) <= HEARTBEAT_STALE_S))
}

/// Prove the spool writable without an fsync per scrape: a recent enqueue or a recent proof
/// is enough; otherwise write `meta.writable_checked_at`.
pub fn prove_writable(store: &mut Store, now: f64) -> Result<(), StoreError> {
    let recent = |t: Option<f64>| t.is_some_and(|t| now - t < WRITABLE_PROOF_S && t <= now);
    if recent(store.meta_time("last_enqueue_at")?)
        || recent(store.meta_time("writable_checked_at")?)
    {
        return Ok(());
    }
    store.touch_writable(now)
}

/// The status document with nothing but the tables and the filesystem (the CLI's view).
pub fn collect(store: &Store, cfg: &Config, now: f64) -> Result<Value, StoreError> {
    collect_with(store, cfg, now, &Probe::default())
}

/// 200 when `ok`, else 503.
pub fn http_status(status: &Value) -> u16 {
    if status["ok"].as_bool() == Some(true) {
        200
    } else {
        503
    }
}

/// Ages are reported to a tenth of a second.
fn age(now: f64, t: f64) -> f64 {
    ((now - t) * 10.0).round() / 10.0
}

/// What is wrong, as the document's `degraded` list says it: `hard` problems make the
/// document not `ok` (503), the others are reported with a 200.
#[derive(Default)]
struct Problems {
    hard: Vec<String>,
    degraded: Vec<String>,
}

/// The dispatcher as its heartbeat shows it: whether it is alive and what it published.
struct Dispatcher {
    alive: bool,
    heartbeat_age: Option<f64>,
    pid: Option<i64>,
    published: Value,
}

/// The status document: one section per part of the spool, each from its own function.
pub fn collect_with(
    store: &Store,
    cfg: &Config,
    now: f64,
    probe: &Probe,
) -> Result<Value, StoreError> {
    let mut problems = Problems::default();
    let d = dispatcher(store, now, &mut problems)?;
    let batches = batches(store, &mut problems)?;
    let (destinations, oldest_all) = destinations(store, cfg, now, probe, &d, &mut problems)?;
    let sources = sources(store, cfg, now, &mut problems)?;
    let polls = polls(store, cfg, now, &mut problems)?;
    let disk_free = host(store, cfg, probe, &mut problems);
    // What the dispatcher found the script sandbox can enforce (meta `sandbox`, written at
    // its start); a degraded sandbox is a soft problem.
    let sandbox: Value = store
        .meta("sandbox")?
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null);
    if sandbox["complete"] == json!(false) {
        problems.degraded.push("sandbox_degraded".into());
    }
    let sessions = store.sessions()?;
    // On PostgreSQL, dispatchers connected and waiting for the lock (0 on SQLite, where a
    // second dispatcher finds dispatch.lock taken and stops).
    let standbys = sessions
        .iter()
        .filter(|s| dispatcher_role(&s.role) && !s.active)
        .count();
    let mut dispatcher = json!({
        "alive": d.alive,
        "heartbeat_age_s": d.heartbeat_age,
        "pid": d.pid,
        "standbys": standbys,
    });
    // Busy-database retries of the live dispatcher (spec 12), when it has published them.
    if let Some(n) = d.published["busy_retries"].as_u64() {
        dispatcher["busy_retries"] = json!(n);
    }
    let ok = problems.hard.is_empty();
    let mut all = problems.hard;
    all.extend(problems.degraded);

    Ok(json!({
        "ok": ok,
        "degraded": all,
        "schema": store.schema_version()?,
        "dispatcher": dispatcher,
        "spool": {
            "last_enqueue_age_s": store.meta_time("last_enqueue_at")?.map(|t| age(now, t)),
            // A successful enqueue proves writability as well as the tiny probe write does.
            "writable_checked_age_s": match (store.meta_time("last_enqueue_at")?, store.meta_time("writable_checked_at")?) {
                (Some(a), Some(b)) => Some(age(now, a.max(b))),
                (a, b) => a.or(b).map(|t| age(now, t)),
            },
        },
        "batches": batches,
        "oldest_pending_age_s": oldest_all.map(|t| age(now, t)),
        "destinations": destinations,
        "sources": sources,
        "polls": polls,
        "issues_open": store.issues_open_count()?,
        "sandbox": sandbox,
        "spool_bytes": match store.database_bytes()? {
            Some(n) => n,
            None => spool_bytes(&cfg.db),
        },
        "disk_free_bytes": disk_free,
        // On PostgreSQL: every hookspool process connected to the spool, from any host. A
        // dispatcher's `state` is "active" (it holds the dispatcher lock) or "standby"; null
        // for the other roles. `active_dispatcher` says the same as a bool (kept for
        // readers from before `state`).
        "processes": sessions.iter().map(|s| json!({
            "role": s.role,
            "host": s.host,
            "pid": s.pid,
            "state": dispatcher_role(&s.role).then_some(if s.active { "active" } else { "standby" }),
            "active_dispatcher": s.active,
            "connected_s": s.age_s,
        })).collect::<Vec<_>>(),
    }))
}

/// The process roles that run a dispatcher (`hookspool dispatch`, and `run`'s half).
fn dispatcher_role(role: &str) -> bool {
    matches!(role, "dispatch" | "run")
}

fn dispatcher(store: &Store, now: f64, problems: &mut Problems) -> Result<Dispatcher, StoreError> {
    let heartbeat = store.meta_time("dispatcher_heartbeat_at")?;
    let pid: Option<i64> = store
        .meta("dispatcher_pid")?
        .and_then(|p| p.trim().parse().ok());
    let heartbeat_age = heartbeat.map(|t| age(now, t));
    let alive = heartbeat_age.is_some_and(|a| a <= HEARTBEAT_STALE_S);
    if !alive {
        problems.degraded.push("dispatcher_heartbeat".into());
    }
    Ok(Dispatcher {
        alive,
        heartbeat_age,
        pid,
        published: dispatcher_published(store, alive)?,
    })
}

/// Batches per state; the quarantine's dead ones counted apart.
fn batches(store: &Store, problems: &mut Problems) -> Result<Map<String, Value>, StoreError> {
    let counts = store.batch_counts()?;
    let quarantined = store.quarantined_count()?;
    let mut batches = Map::new();
    for (state, n) in &counts {
        let n = if *state == BatchState::Dead {
            n - quarantined
        } else {
            *n
        };
        if *state == BatchState::Dead && n > 0 {
            problems.degraded.push("dead_batches".into());
        }
        batches.insert(state.to_string(), json!(n));
    }
    batches.insert("quarantined".into(), json!(quarantined));
    if quarantined > 0 {
        problems.degraded.push("quarantined".into());
    }
    Ok(batches)
}

/// Every destination the config or the spool names: its gate, in-flight count, oldest
/// pending batch and rate limit; and the oldest pending batch of all.
fn destinations(
    store: &Store,
    cfg: &Config,
    now: f64,
    probe: &Probe,
    dispatcher: &Dispatcher,
    problems: &mut Problems,
) -> Result<(Map<String, Value>, Option<f64>), StoreError> {
    let published = &dispatcher.published;
    let alive = dispatcher.alive;
    // Unknown (null) when no dispatcher is alive to publish them.
    let inflight_of = |name: &str| -> Option<i64> {
        match &probe.inflight {
            Some(m) => Some(m.get(name).copied().unwrap_or(0)),
            None if alive => Some(published["inflight"][name].as_i64().unwrap_or(0)),
            None => None,
        }
    };
    let oldest = store.oldest_pending()?;
    let oldest_all = oldest
        .iter()
        .map(|(_, t)| *t)
        .fold(None, |m: Option<f64>, t| Some(m.map_or(t, |m| m.min(t))));
    let oldest_by: BTreeMap<&str, f64> = oldest.iter().map(|(d, t)| (d.as_str(), *t)).collect();

    let rows = store.destinations()?;
    let mut names: BTreeSet<String> = cfg.destinations.keys().cloned().collect();
    names.extend(rows.iter().map(|r| r.name.clone()));
    names.extend(store.batch_destinations()?);
    let mut destinations = Map::new();
    for name in names {
        let row = rows.iter().find(|r| r.name == name);
        let state = row.map_or(BreakerState::Closed, |r| r.state);
        let mut d = Map::new();
        d.insert("state".into(), json!(state));
        d.insert("inflight".into(), json!(inflight_of(&name)));
        d.insert(
            "oldest_pending_age_s".into(),
            json!(oldest_by.get(name.as_str()).map(|t| age(now, *t))),
        );
        if let Some(r) = row {
            match state {
                BreakerState::Open | BreakerState::HalfOpen => {
                    d.insert("opened_at".into(), json!(r.opened_at));
                    d.insert("cooldown_s".into(), json!(r.cooldown_s));
                }
                BreakerState::Paused => {
                    d.insert("paused_at".into(), json!(r.paused_at));
                    d.insert("paused_by".into(), json!(r.paused_by));
                }
                BreakerState::Closed => {}
            }
            if state != BreakerState::Closed
                && let Some(e) = &r.last_error
            {
                d.insert("last_error".into(), json!(e));
            }
        }
        // The request rate, when the destination has one: the limit, and how many times
        // and how long batches waited for it (the live dispatcher's counters).
        if let Some(r) = cfg.destinations.get(&name).and_then(|d| d.rate) {
            let waited = &published["rate_limited"][name.as_str()];
            let wait_s = waited["wait_s"].as_f64().map(|s| (s * 10.0).round() / 10.0);
            d.insert(
                "rate".into(),
                json!({
                    "max_per_s": r.max_per_s,
                    "burst": r.burst,
                    "waits": if alive { Some(waited["waits"].as_u64().unwrap_or(0)) } else { None },
                    "wait_s": if alive { Some(wait_s.unwrap_or(0.0)) } else { None },
                }),
            );
        }
        if state == BreakerState::Open {
            problems.degraded.push(format!("breaker_open:{name}"));
        }
        destinations.insert(name, Value::Object(d));
    }
    Ok((destinations, oldest_all))
}

/// Every source the config or the spool names: its last event and, with
/// `expect_every_s`, whether it has gone silent.
fn sources(
    store: &Store,
    cfg: &Config,
    now: f64,
    problems: &mut Problems,
) -> Result<Map<String, Value>, StoreError> {
    let last_events: BTreeMap<String, f64> = store.source_last_events()?.into_iter().collect();
    let mut source_names: BTreeSet<String> = cfg.sources.keys().cloned().collect();
    source_names.extend(last_events.keys().cloned());
    let mut sources = Map::new();
    for name in source_names {
        let last = last_events.get(&name).copied();
        let mut s = Map::new();
        s.insert("last_event_age_s".into(), json!(last.map(|t| age(now, t))));
        if let Some(c) = cfg.sources.get(&name)
            && c.expect_every_s > 0.0
        {
            let silent = super::issues::source_is_silent(store, &name, c.expect_every_s, now)?;
            s.insert("expected_every_s".into(), json!(c.expect_every_s));
            s.insert("silent".into(), json!(silent));
            if silent {
                problems.degraded.push(format!("source_silent:{name}"));
            }
        }
        sources.insert(name, Value::Object(s));
    }
    Ok(sources)
}

/// Every poll instance's clock, and whether it is stale.
fn polls(
    store: &Store,
    cfg: &Config,
    now: f64,
    problems: &mut Problems,
) -> Result<Map<String, Value>, StoreError> {
    let mut polls = Map::new();
    for p in store.polls()? {
        let every = cfg
            .sources
            .get(&p.instance)
            .and_then(|s| s.poll)
            .map(|s| s.every_s);
        let stale = every.is_some_and(|e| super::issues::poll_is_stale(&p, e, now));
        if stale {
            problems.degraded.push(format!("poll_stale:{}", p.instance));
        }
        polls.insert(
            p.instance.clone(),
            json!({
                "every_s": every,
                "next_at": p.next_at,
                "next_in_s": age(p.next_at, now),
                "last_tick_at": p.last_tick_at,
                "delivered_at": p.delivered_at,
                "delivered_tick_at": p.delivered_tick_at,
                "delivered_age_s": p.delivered_at.map(|t| age(now, t)),
                "pending": p.pending,
                "skipped": p.skipped,
                "stale": stale,
            }),
        );
    }
    Ok(polls)
}

/// The host's hard limits: free space, a write the probe saw fail, the intake's own limits.
/// Returns the free bytes: of the spool's filesystem on SQLite; none on PostgreSQL, whose
/// disk is the server's (a full one fails writes, which the probe's limits report).
fn host(store: &Store, cfg: &Config, probe: &Probe, problems: &mut Problems) -> Option<u64> {
    let disk_free = (!store.is_postgres())
        .then(|| crate::sys::fs::spool_free_bytes(&cfg.db))
        .flatten();
    if let Some(free) = disk_free
        && free < cfg.min_free_bytes as u64
    {
        problems.hard.push("disk_free_below_min".into());
    }
    if disk_free.is_some_and(|free| free < SPOOL_FULL_FREE_BYTES_MAX) {
        problems.hard.push("spool_full".into());
    }
    if let Some(why) = &probe.unwritable {
        problems.hard.push(format!("spool_unwritable: {why}"));
    }
    for limit in &probe.limits {
        if !problems.hard.contains(limit) {
            problems.hard.push(limit.clone());
        }
    }
    disk_free
}

/// The database file with its WAL and shared-memory files.
pub fn spool_bytes(db: &Path) -> u64 {
    ["", "-wal", "-shm"]
        .iter()
        .filter_map(|suffix| {
            let mut p = db.as_os_str().to_owned();
            p.push(suffix);
            std::fs::metadata(Path::new(&p)).ok().map(|m| m.len())
        })
        .sum()
}
