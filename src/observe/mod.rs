//! Observability (spec 11): status and /healthz, metrics, issues, alerts and logging.
//!
//! Owns: the status document and its 200/503 decision ([`status`]), the scrape-time gauges
//! ([`metrics`]), the one Prometheus renderer with the histograms ([`prom`]), the issue rules of spec 11.4 ([`issues`]), sending alerts off the caller's
//! thread ([`alerts`]), and the process's tracing subscriber with the journald field
//! convention ([`logging`]).
//!
//! Must not: change delivery state (batches, attempts, destinations). It reads the store
//! and writes only issues, alerts, two meta keys (`writable_checked_at`,
//! `source:<name>:expect_since`) and audit rows for dry-run alerts. All SQL is in
//! `store::{issues, stats}`.
//!
//! # API for the dispatcher (call from the main loop; each is one short transaction)
//!
//! | when | call |
//! | --- | --- |
//! | process start | `observe::logging::init("dispatch")` (main.rs does it for every command) |
//! | a batch goes dead (exhausted / permanent / poison), a breaker trips (unreachable / http_5xx / timeout / script_exit), a counted streak >= 3 (batch), Hermes answers ignored/coalesced (ignored), only throttles for longer than dispatch.throttle_alert_s (throttled) | `issues::delivery_failed(&mut store, dest, Some(route), DeliveryReason::X, Some(batch_id), Some(&outcome.reason), now)` |
//! | a config-class outcome (401/403/404, unreadable secret or env file) | `issues::delivery_config_failed(&mut store, dest, Some(route), Some(batch_id), Some(&outcome.reason), now)` |
//! | every successful attempt (after the mark) | `issues::attempt_succeeded(&mut store, dest, now)` |
//! | a config reload, validated or refused | `issues::config_reload(&mut store, Ok(()) / Err(&problems_text), now)` |
//! | maintenance tick (every 60 s) | `issues::check_sources(&mut store, &cfg, now)`, `issues::check_disk(&mut store, &cfg, now)` |
//! | every heartbeat (`dispatch.heartbeat_s`), and at the start | `issues::dispatcher_active(&mut store, now)` (resolves `spool:no_active_dispatcher`) |
//! | a standby's poll, while the heartbeat is older than `issues::DISPATCHER_INACTIVE_HEARTBEATS` heartbeats | `issues::check_dispatcher_heartbeat(&mut store, heartbeat_s, now)` (opens `spool:no_active_dispatcher` when stale and not open), and while stale `alerter.tick` at most once a heartbeat (`dispatch::standby`) |
//! | every heartbeat (`dispatch.heartbeat_s`) | `alerter.tick(&cfg.db, &cfg.alerts, &clock)` with one `alerts::Alerter` kept for the process's life (the pass runs on its own thread and connection) |
//! | start and every good reload | `issues::secret_exposure(&mut store, &config::secret_exposures(&cfg), now)` (`config:secrets`) |
//! | the sandbox probe at start | the `config:sandbox` issue through `issues::open_or_bump` / `issues::resolve` |
//! | a poll instance's staleness changes | `issues::poll_stale(&mut store, instance, stale, now)` |
//! | shutdown | `alerter.finish()` (waits at most `alerts.timeout_s`) |
//!
//! The dispatcher also writes `meta.dispatcher_heartbeat_at`, `meta.dispatcher_pid` and,
//! with each heartbeat, `meta.dispatcher_published` (its in-flight counts per destination,
//! busy-database retries, rate-limit waits and its histograms, JSON), which status reads while the dispatcher is alive;
//! `status::Probe::inflight` overrides the counts for a status served by the dispatcher
//! itself.
//!
//! # API for the CLI
//!
//! | when | call |
//! | --- | --- |
//! | `hookspool pause` / `resume` | `issues::destination_paused(&mut store, dest, by, reason, now)` / `issues::destination_resumed(&mut store, dest, now)` |
//!
//! # API for the intake
//!
//! | when | call |
//! | --- | --- |
//! | process start | `observe::logging::init("intake")` |
//! | a request is quarantined | `issues::quarantined(&mut store, source, batch_id, class, now)` |
//! | a config reload, validated or refused (through the writer) | `issues::config_reload(&mut store, Ok(()) / Err(&problems_text), now)` |
//! | on PostgreSQL, every `writer::DISPATCHER_CHECK_S` | `issues::check_dispatcher_heartbeat(&mut store, heartbeat_s, now)` |
//! | a backpressure limit engages / clears (`min_free_bytes`, `full`, `busy`) | `issues::spool_limit(&mut store, limit, engaged, Some(detail), now)` |
//! | GET /healthz | `status::prove_writable(&mut store, now)` (an `Err` becomes `Probe::unwritable`), then `status::collect_with(&store, &cfg, now, &probe)` and `status::http_status(&doc)` |
//! | GET /metrics | `metrics::render_gauges(&store, &cfg, now)` followed by the intake's own counters |
//! | each stored copy | one `tracing::info!(source, route, batch, event, bytes, tee, "queued")` |
//!
//! The CLI's replay and drop call `issues::dead_batches_cleared` and
//! `issues::quarantine_cleared`, so the dispatcher need not.

pub mod alerts;
pub mod issues;
pub mod logging;
pub mod metrics;
pub mod prom;
pub mod status;

#[cfg(test)]
mod tests;
