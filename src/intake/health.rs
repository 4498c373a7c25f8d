//! GET /healthz (spec 11.1, as far as the intake can know it) and GET /metrics (spec 11.2).
//!
//! /healthz is 200 with `ok: true` when no hard problem holds, listing soft problems under
//! `degraded` (dead batches, a stale or absent dispatcher heartbeat, a recent SQLITE_BUSY,
//! an unexpected schema), and 503 with `ok: false` while a hard one does (free space under
//! limits.min_free_bytes, a failed write or writability probe, ENOSPC in the last
//! [`RECENT_FAILURE_S`], a writer that does not answer within [`WRITER_ANSWER_S_MAX`]).
//! Writability comes from the writer: proven by a commit in the last 30 s, otherwise by one
//! tiny write at most every 30 s, so a scrape never forces an fsync by itself.
//!
//! Must not: write anything itself or read the store outside the writer thread.

use std::time::Duration;

use serde_json::{Value, json};

use super::Shared;
use super::answer::{self, Answer};
use super::writer::{HealthAsk, HealthFacts, WriteError};
use crate::store::SCHEMA_VERSION;

/// How long /healthz and /metrics wait for the writer before calling it unresponsive.
pub const WRITER_ANSWER_S_MAX: u64 = 5;
/// A dispatcher heartbeat older than this is "degraded" (spec 11.1).
pub const HEARTBEAT_STALE_S: f64 = 30.0;
/// A failed COMMIT this recent still counts against health.
pub const RECENT_FAILURE_S: f64 = 30.0;

async fn facts(shared: &Shared, status: bool, gauges: bool) -> Option<HealthFacts> {
    let snapshot = shared.snapshot();
    let disk_low = shared.disk.low(snapshot.config.min_free_bytes);
    let ask = HealthAsk {
        snapshot,
        disk_low,
        status,
        gauges,
    };
    tokio::time::timeout(
        Duration::from_secs(WRITER_ANSWER_S_MAX),
        shared.writer.health_with(Some(ask)),
    )
    .await
    .ok()
    .flatten()
}

/// /healthz serves the same document as `hookspool status` (spec 11.1), computed by the
/// observe module from the tables plus what only the intake knows (free space, a recent
/// ENOSPC, writability); without the writer's answer it falls back to the intake's own
/// minimal report, which is 503.
pub async fn healthz(shared: &Shared) -> Answer {
    let f = facts(shared, true, false).await;
    if let Some(doc) = f.as_ref().and_then(|f| f.status.clone()) {
        return answer::json(crate::observe::status::http_status(&doc), &doc);
    }
    let (status, body) = report(shared, f.as_ref());
    answer::json(status, &body)
}

/// The /healthz document and its status code.
pub fn report(shared: &Shared, f: Option<&HealthFacts>) -> (u16, Value) {
    let now = shared.clock.now();
    let snap = shared.snapshot();
    let min_free = snap.config.min_free_bytes;
    let free = shared.disk.free_bytes();
    let mut hard: Vec<String> = Vec::new();
    let mut soft: Vec<String> = Vec::new();
    if shared.disk.low(min_free) {
        hard.push("backpressure: free space under limits.min_free_bytes".into());
    }
    let Some(f) = f else {
        hard.push("writer: not answering".into());
        let body = json!({"ok": false, "degraded": hard, "disk_free_bytes": free});
        return (503, body);
    };
    if let Some(e) = &f.read_error {
        hard.push(format!("store: {e}"));
    }
    if !f.writable {
        hard.push("spool: not writable".into());
    }
    if let Some((at, e)) = &f.last_failure
        && now - at <= RECENT_FAILURE_S
    {
        match e {
            WriteError::Full => hard.push("backpressure: spool full (ENOSPC)".into()),
            WriteError::Busy => soft.push("backpressure: database busy".into()),
            other => soft.push(format!("store: {other}")),
        }
    }
    if f.schema != SCHEMA_VERSION {
        soft.push(format!(
            "schema: database {} vs this hookspool {}",
            f.schema, SCHEMA_VERSION
        ));
    }
    let dead = f
        .batches
        .iter()
        .find(|(s, _)| s == "dead")
        .map(|(_, n)| *n)
        .unwrap_or(0);
    if dead > 0 {
        soft.push(format!("batches: {dead} dead"));
    }
    let heartbeat_age = f.dispatcher_heartbeat_at.map(|t| (now - t).max(0.0));
    let alive = heartbeat_age.is_some_and(|a| a <= HEARTBEAT_STALE_S);
    if !alive {
        soft.push(match heartbeat_age {
            Some(a) => format!("dispatcher: heartbeat {a:.0}s old"),
            None => "dispatcher: no heartbeat".into(),
        });
    }
    let batches: serde_json::Map<String, Value> = f
        .batches
        .iter()
        .map(|(s, n)| (s.clone(), json!(n)))
        .collect();
    let ok = hard.is_empty();
    let degraded: Vec<String> = hard.into_iter().chain(soft).collect();
    let body = json!({
        "ok": ok,
        "degraded": degraded,
        "schema": f.schema,
        "dispatcher": {"alive": alive, "heartbeat_age_s": heartbeat_age, "pid": f.dispatcher_pid},
        "spool": {
            "last_enqueue_age_s": f.last_enqueue_at.map(|t| (now - t).max(0.0)),
            "writable_checked_age_s": f.writable_checked_at.map(|t| (now - t).max(0.0)),
        },
        "batches": batches,
        "sources": snap.sources.keys().collect::<Vec<_>>(),
        "disk_free_bytes": free,
    });
    (if ok { 200 } else { 503 }, body)
}

/// /metrics: the intake's own counters, then the dispatcher gauges computed from the tables
/// at scrape time (spec 11.2). The gauges include hookspool_batches, so the intake's own
/// copy of that family is left out when they are present.
pub async fn metrics(shared: &Shared) -> Answer {
    let f = facts(shared, false, true).await;
    let gauges = f.as_ref().and_then(|f| f.gauges.clone());
    let mut text = match &gauges {
        Some(_) => shared.metrics.render(None),
        None => shared
            .metrics
            .render(f.as_ref().map(|f| f.batches.as_slice())),
    };
    if let Some(g) = gauges {
        text.push_str(&g);
    }
    answer::text(200, "text/plain; version=0.0.4", text)
}
