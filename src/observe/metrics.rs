//! /metrics and `hookspool metrics` (spec 11.2): the dispatcher's figures as gauges computed
//! from the tables at scrape time, in Prometheus text exposition format (version 0.0.4).
//!
//! Counters computed from pruned tables would not be monotonic, so everything read from the
//! tables is a gauge over the retention window (attempts: `retention.attempts_days`,
//! delivered batches: `retention.delivered_days`). The intake's per-process counters are
//! the intake's; it appends them to [`render_gauges`]'s text. The dispatcher's own counters (rate-limited
//! waits) come from what it publishes with its heartbeat, while it is alive. Nothing is
//! persisted for metrics.
//!
//! Must not: write to the store, or put anything but names and numbers in a label.

use crate::config::Config;
use crate::store::{Store, StoreError};
use crate::vocab::{BatchState, BreakerState};

use super::prom::{Family, Histograms};

const DAY_S: f64 = 86_400.0;

/// The numeric encoding of hookspool_destination_state (spec 11.2).
pub fn destination_state_value(state: BreakerState) -> f64 {
    match state {
        BreakerState::Closed => 0.0,
        BreakerState::HalfOpen => 1.0,
        BreakerState::Open => 2.0,
        BreakerState::Paused => 3.0,
    }
}

/// Every dispatcher gauge of spec 11.2, with HELP and TYPE lines.
pub fn render_gauges(store: &Store, cfg: &Config, now: f64) -> Result<String, StoreError> {
    let attempts_since = now - cfg.retention.attempts_days * DAY_S;
    let delivered_since = now - cfg.retention.delivered_days * DAY_S;
    let mut families = Vec::new();

    let mut f = Family::gauge(
        "hookspool_attempts_30d",
        "Delivery attempts started within retention.attempts_days, by destination, outcome and class.",
    );
    for a in store.attempt_counts_since(attempts_since)? {
        f.add(
            vec![
                ("destination", a.destination),
                ("outcome", a.outcome),
                ("klass", a.klass),
            ],
            a.count as f64,
        );
    }
    families.push(f);

    let mut f = Family::gauge(
        "hookspool_batches_delivered_7d",
        "Batches delivered within retention.delivered_days, by destination.",
    );
    for (d, n) in store.delivered_since(delivered_since)? {
        f.add(vec![("destination", d)], n as f64);
    }
    families.push(f);

    let durations = store.attempt_durations_since(attempts_since)?;
    let mut sum = Family::gauge(
        "hookspool_attempt_duration_seconds_sum_30d",
        "Total duration of finished attempts within retention.attempts_days, by destination.",
    );
    let mut count = Family::gauge(
        "hookspool_attempt_duration_seconds_count_30d",
        "Finished attempts with a duration within retention.attempts_days, by destination.",
    );
    for d in durations {
        sum.add(vec![("destination", d.destination.clone())], d.sum_s);
        count.add(vec![("destination", d.destination)], d.count as f64);
    }
    families.push(sum);
    families.push(count);

    let quarantined = store.quarantined_count()?;
    let mut f = Family::gauge(
        "hookspool_batches",
        "Batches by state (dead excludes quarantine batches, counted as quarantined).",
    );
    for (state, n) in store.batch_counts()? {
        let n = if state == BatchState::Dead {
            n - quarantined
        } else {
            n
        };
        f.add(vec![("state", state.to_string())], n as f64);
    }
    f.add(vec![("state", "quarantined".into())], quarantined as f64);
    families.push(f);

    let oldest = store.oldest_pending()?;
    let mut f = Family::gauge(
        "hookspool_oldest_pending_age_seconds",
        "Age of the oldest batch not yet delivered (open, sealed, retry or leased); 0 when none.",
    );
    let min = oldest.iter().map(|(_, t)| *t).fold(f64::INFINITY, f64::min);
    f.add(vec![], if min.is_finite() { now - min } else { 0.0 });
    families.push(f);

    let rows = store.destinations()?;
    let mut names: std::collections::BTreeSet<String> = cfg.destinations.keys().cloned().collect();
    names.extend(rows.iter().map(|r| r.name.clone()));
    names.extend(store.batch_destinations()?);
    let mut f = Family::gauge(
        "hookspool_destination_state",
        "Destination gate: 0 closed, 1 half_open, 2 open, 3 paused.",
    );
    for name in &names {
        let state = rows
            .iter()
            .find(|r| &r.name == name)
            .map_or(BreakerState::Closed, |r| r.state);
        f.add(
            vec![("destination", name.clone())],
            destination_state_value(state),
        );
    }
    families.push(f);

    // The request rate (issue 35): the limits in config, and the live dispatcher's counts
    // of batches held by them.
    let mut per_s = Family::gauge(
        "hookspool_destination_max_attempts_per_second",
        "The destination's request rate limit (max_per_s); absent when it has none.",
    );
    let mut burst = Family::gauge(
        "hookspool_destination_burst",
        "Requests the destination's rate limit lets start back to back (burst); absent when it has none.",
    );
    for d in cfg.destinations.values() {
        if let Some(r) = d.rate {
            per_s.add(vec![("destination", d.name.clone())], r.max_per_s);
            burst.add(vec![("destination", d.name.clone())], f64::from(r.burst));
        }
    }
    families.push(per_s);
    families.push(burst);
    let alive = super::status::dispatcher_alive(store, now)?;
    let published = super::status::dispatcher_published(store, alive)?;
    let mut waits = Family::counter(
        "hookspool_destination_rate_limited_total",
        "Times a batch began to wait for its destination's rate limit (this dispatcher's run).",
    );
    let mut wait_s = Family::counter(
        "hookspool_destination_rate_limited_seconds_total",
        "Seconds batches waited for their destination's rate limit, summed over batches (this dispatcher's run).",
    );
    if let Some(m) = published["rate_limited"].as_object() {
        for (name, v) in m {
            waits.add(
                vec![("destination", name.clone())],
                v["waits"].as_f64().unwrap_or(0.0),
            );
            wait_s.add(
                vec![("destination", name.clone())],
                v["wait_s"].as_f64().unwrap_or(0.0),
            );
        }
    }
    families.push(waits);
    families.push(wait_s);

    let mut f = Family::gauge(
        "hookspool_destination_oldest_pending_age_seconds",
        "Age of the destination's oldest batch not yet delivered; 0 when none.",
    );
    for name in &names {
        let age = oldest
            .iter()
            .find(|(d, _)| d == name)
            .map(|(_, t)| now - t)
            .unwrap_or(0.0);
        f.add(vec![("destination", name.clone())], age);
    }
    families.push(f);

    let mut f = Family::gauge("hookspool_issues_open", "Issues open or acked.");
    f.add(vec![], store.issues_open_count()? as f64);
    families.push(f);

    let mut f = Family::gauge(
        "hookspool_spool_bytes",
        "Size of the spool: the SQLite database with its WAL and shared-memory files, or the PostgreSQL database (pg_database_size).",
    );
    let bytes = match store.database_bytes()? {
        Some(n) => n,
        None => super::status::spool_bytes(&cfg.db),
    };
    f.add(vec![], bytes as f64);
    families.push(f);

    let mut f = Family::gauge(
        "hookspool_disk_free_bytes",
        "Free bytes on the filesystem holding the SQLite spool; absent on PostgreSQL (the server's disk).",
    );
    if !store.is_postgres()
        && let Some(free) = crate::sys::fs::spool_free_bytes(&cfg.db)
    {
        f.add(vec![], free as f64);
    }
    families.push(f);

    let mut f = Family::gauge(
        "hookspool_dispatcher_heartbeat_age_seconds",
        "Seconds since the dispatcher's last heartbeat; absent when it never ran.",
    );
    if let Some(t) = store.meta_time("dispatcher_heartbeat_at")? {
        f.add(vec![], now - t);
    }
    families.push(f);

    let mut f = Family::gauge(
        "hookspool_spool_process",
        "On PostgreSQL: each hookspool process connected to the spool (1), by role, host and pid; active=\"true\" marks the active dispatcher.",
    );
    for p in store.sessions()? {
        f.add(
            vec![
                ("role", p.role.clone()),
                ("host", p.host.clone()),
                ("pid", p.pid.to_string()),
                ("active", p.active.to_string()),
            ],
            1.0,
        );
    }
    families.push(f);

    let mut f = Family::gauge(
        "hookspool_source_last_event_age_seconds",
        "Seconds since the source's last accepted event.",
    );
    for (source, t) in store.source_last_events()? {
        f.add(vec![("source", source)], now - t);
    }
    families.push(f);

    // The liveness expectation beside the age, so an alerting rule can compare the two per
    // source (the packages' rules file does).
    let mut f = Family::gauge(
        "hookspool_source_expect_every_seconds",
        "The source's liveness expectation (expect_every_s); absent when it has none.",
    );
    for (name, s) in &cfg.sources {
        if s.expect_every_s > 0.0 {
            f.add(vec![("source", name.clone())], s.expect_every_s);
        }
    }
    families.push(f);

    // The live dispatcher's histograms (issue 35), published with its heartbeat: counters
    // of its run, which Prometheus takes a restart's reset for.
    let hist = |key: &str, names: &[&str]| -> Histograms {
        serde_json::from_value(published[key].clone()).unwrap_or_else(|_| Histograms::new(names))
    };
    families.push(Family::histogram(
        "hookspool_attempt_duration_seconds",
        "Duration of delivery attempts finished by the live dispatcher, by destination and outcome.",
        &hist("attempt_duration", &["destination", "outcome"]),
    ));
    families.push(Family::histogram(
        "hookspool_receive_to_delivered_seconds",
        "Time from a batch's first received event to its delivery, by route (the live dispatcher's deliveries).",
        &hist("receive_to_delivered", &["route"]),
    ));

    // Spans dropped (issue 35): this process's when it traces (the intake's page; `run`
    // is one process for both halves), and the live dispatcher's from its publication
    // when it is another process.
    let mut f = Family::counter(
        "hookspool_trace_spans_dropped_total",
        "Trace spans dropped: the export queue was full, or the collector did not take them.",
    );
    let mut add = |process: &str, (full, export): (f64, f64)| {
        f.add(
            vec![("process", process.into()), ("reason", "queue_full".into())],
            full,
        );
        f.add(
            vec![
                ("process", process.into()),
                ("reason", "export_failed".into()),
            ],
            export,
        );
    };
    let own_pid = u64::from(std::process::id());
    if crate::telemetry::enabled() {
        let (full, export) = crate::telemetry::dropped_total();
        let same = published["pid"].as_u64() == Some(own_pid);
        add(
            if same { "run" } else { "intake" },
            (full as f64, export as f64),
        );
    }
    if published["pid"].as_u64().is_some_and(|p| p != own_pid)
        && let Some(d) = published["spans_dropped"].as_array()
    {
        let n = |i: usize| d.get(i).and_then(|v| v.as_f64()).unwrap_or(0.0);
        add("dispatch", (n(0), n(1)));
    }
    families.push(f);

    Ok(super::prom::render(&families))
}
