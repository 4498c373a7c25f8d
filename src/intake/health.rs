//! GET /healthz (spec 11.1) and GET /metrics (spec 11.2), both computed by the observe
//! module inside the writer thread. /healthz is the `hookspool status` document: 200 when
//! no hard problem holds (soft ones listed under `degraded`), 503 while one does; the
//! intake adds what only it knows as hard limits (free space under limits.min_free_bytes,
//! ENOSPC in the last [`RECENT_FAILURE_S`](super::writer::RECENT_FAILURE_S), a failed writability proof), and a writer that
//! does not answer within [`WRITER_ANSWER_S_MAX`] is itself a 503.
//! Writability comes from the writer: proven by a commit in the last 30 s, otherwise by one
//! tiny write at most every 30 s, so a scrape never forces an fsync by itself.
//!
//! Must not: write anything itself or read the store outside the writer thread.

use std::time::Duration;

use serde_json::json;

use super::Shared;
use super::answer::{self, Answer};
use super::writer::{HealthAsk, HealthFacts};

/// How long /healthz and /metrics wait for the writer before calling it unresponsive.
pub const WRITER_ANSWER_S_MAX: u64 = 5;

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
/// observe module in the writer thread from the tables plus what only the intake knows
/// (free space, a recent ENOSPC, writability). When the writer does not answer, or cannot
/// read the store, that is itself the answer: 503 with the reason.
pub async fn healthz(shared: &Shared) -> Answer {
    let f = facts(shared, true, false).await;
    if let Some(doc) = f.as_ref().and_then(|f| f.status.clone()) {
        return answer::json(crate::observe::status::http_status(&doc), &doc);
    }
    let reason = match f.and_then(|f| f.read_error) {
        Some(e) => format!("store: {e}"),
        None => "writer: not answering".to_string(),
    };
    let free = shared.disk.free_bytes();
    answer::json(
        503,
        &json!({"ok": false, "degraded": [reason], "disk_free_bytes": free}),
    )
}

/// /metrics: the intake's own counters, then the dispatcher gauges computed from the tables
/// at scrape time (spec 11.2). The gauges include hookspool_batches, so the intake's own
/// copy of that family is left out when they are present. Every family is rendered by
/// `observe::prom`.
pub async fn metrics(shared: &Shared) -> Answer {
    use crate::observe::prom;
    let f = facts(shared, false, true).await;
    let gauges = f.as_ref().and_then(|f| f.gauges.clone());
    let mut families = match &gauges {
        Some(_) => shared.metrics.families(None),
        None => shared
            .metrics
            .families(f.as_ref().map(|f| f.batches.as_slice())),
    };
    families.extend(limits(shared));
    families.extend(groups(shared));
    let mut text = prom::render(&families);
    if let Some(g) = gauges {
        text.push_str(&g);
    }
    answer::text(200, "text/plain; version=0.0.4", text)
}

/// The writer's group commits: requests per commit is the mean group size, how many
/// requests one fsync of the WAL carried (issue 13).
fn groups(shared: &Shared) -> Vec<crate::observe::prom::Family> {
    use crate::observe::prom::Family;
    let (commits, requests) = shared.writer.group_totals();
    vec![
        Family::counter(
            "hookspool_intake_group_commits_total",
            "Group commits of the intake's writer that succeeded.",
        )
        .with(commits as f64),
        Family::counter(
            "hookspool_intake_group_requests_total",
            "Requests stored by those group commits.",
        )
        .with(requests as f64),
    ]
}

/// The hostile-sender bounds (issue 17): connections under the cap, the bytes unverified
/// bodies hold, and connections closed at the cap or for a late request head.
fn limits(shared: &Shared) -> Vec<crate::observe::prom::Family> {
    use crate::observe::prom::Family;
    let (evicted, head_timeouts) = shared.conns.closed_totals();
    let mut closed = Family::counter(
        "hookspool_intake_connections_closed_total",
        "Connections closed without a request: the idlest at the cap, or no request head in time.",
    );
    closed.add(vec![("reason", "evicted".into())], evicted as f64);
    closed.add(
        vec![("reason", "head_timeout".into())],
        head_timeouts as f64,
    );
    vec![
        Family::gauge(
            "hookspool_intake_connections",
            "Connections open under the cap.",
        )
        .with(shared.conns.live() as f64),
        Family::gauge("hookspool_intake_connections_max", "The connection cap.")
            .with(shared.conns.cap() as f64),
        Family::gauge(
            "hookspool_intake_unverified_body_bytes",
            "Bytes reserved by bodies not yet verified.",
        )
        .with(shared.bodies.held_bytes() as f64),
        Family::counter(
            "hookspool_intake_unverified_bodies_evicted_total",
            "Unverified bodies cut, the slowest first, to make room in a full budget.",
        )
        .with(shared.bodies.evicted_total() as f64),
        closed,
    ]
}
