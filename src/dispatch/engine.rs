//! The dispatcher's engine (spec 2, 5, 6): one tick seals ready batches, recovers expired
//! leases no live worker holds, then claims heads of groups through the destination gates,
//! and spawns one worker per claim. Workers only do I/O; every store write (claim, mark,
//! destination state) happens here on the engine, so the dispatcher has one writer. Time is
//! `now_eff = max(wall, meta.last_tick_at)`: a backwards clock step makes time stand still.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::breaker::{self, Effect, Gate};
use super::registry::{Built, Registry, Target};
use super::{document, emits, retry};
use crate::clock::SharedClock;
use crate::config::Config;
use crate::destinations::script::{ScriptDelivery, is_bad_emit};
use crate::destinations::{Delivery, Idempotency, Klass, Outcome, OutcomeKind, UnwrapEvent};
use crate::store::{
    AttemptReport, Claim, ClaimRequest, DestinationRow, Mark, MarkResult, Store, StoreError,
};

/// A batch is poison on the failure that completes this many strikes (spec 4.2).
pub const POISON_STRIKES: i64 = 5;
/// Workers abort this long before their lease ends (spec 6.2).
pub const DEADLINE_MARGIN_S: f64 = 5.0;
/// Candidates read per tick; the query returns only group heads, oldest first.
pub const CANDIDATES_PER_TICK_MAX: usize = 256;
/// A counted failure streak this long on one batch opens a delivery issue (spec 11.4).
pub const COUNTED_STREAK_ISSUE: i64 = 3;
/// Retention runs at most this often (spec 8).
pub const RETENTION_EVERY_S: f64 = 3600.0;

/// A batch chosen through the gates, before its claim.
struct Pick {
    batch_id: i64,
    destination: String,
    built: Arc<Built>,
    probe: bool,
    lease_until: f64,
    idempotency: Idempotency,
}

/// An outcome turned into its mark, waiting for the group's transaction.
struct Prepared {
    destination: String,
    attempt_n: i64,
    batch: crate::store::BatchRow,
    outcome: Outcome,
    report: AttemptReport,
    klass_name: &'static str,
    effect: Effect,
}

/// One finished worker.
pub struct Done {
    pub batch_id: i64,
    pub outcome: Outcome,
    pub duration: Duration,
}

struct InFlight {
    claim: Claim,
    destination: String,
    started_at: f64,
    probe: bool,
    attempt_n: i64,
}

/// What one tick did (for tests, logs and the watchdog).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct TickReport {
    pub now_eff: f64,
    pub sealed: usize,
    pub recovered: usize,
    pub claimed: Vec<i64>,
}

pub struct Engine {
    cfg: Arc<Config>,
    registry: Registry,
    store: Store,
    clock: SharedClock,
    owner_prefix: String,
    instance_id: String,
    live: HashMap<i64, InFlight>,
    inflight: HashMap<String, usize>,
    tx: mpsc::UnboundedSender<Done>,
    rx: mpsc::UnboundedReceiver<Done>,
    last_tick_at: f64,
    last_heartbeat: f64,
    last_retention: f64,
    jitter_state: u64,
    alerter: crate::observe::alerts::Alerter,
}

fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "localhost".into())
}

impl Engine {
    pub fn new(cfg: Arc<Config>, store: Store, clock: SharedClock) -> Result<Engine, StoreError> {
        let instance_id = store.instance_id()?;
        let last_tick_at = store
            .meta("last_tick_at")?
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        let (tx, rx) = mpsc::unbounded_channel();
        let seed = (clock.now().to_bits() ^ u64::from(std::process::id())) | 1;
        Ok(Engine {
            registry: Registry::build(&cfg),
            cfg,
            store,
            clock,
            owner_prefix: format!("{}:{}", hostname(), std::process::id()),
            instance_id,
            live: HashMap::new(),
            inflight: HashMap::new(),
            tx,
            rx,
            last_tick_at,
            last_heartbeat: f64::NEG_INFINITY,
            last_retention: f64::NEG_INFINITY,
            jitter_state: seed,
            alerter: crate::observe::alerts::Alerter::new(),
        })
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn config(&self) -> &Arc<Config> {
        &self.cfg
    }

    /// Startup: every leased row belongs to a dead process (we hold dispatch.lock).
    pub fn startup(&mut self) -> Result<usize, StoreError> {
        let now = self.now_eff();
        let n = self.store.recover_all_leases(now)?.len();
        self.store
            .set_meta("dispatcher_pid", &std::process::id().to_string())?;
        self.heartbeat(now)?;
        Ok(n)
    }

    /// Apply a new config (after a successful reload): rebuild destinations and make every
    /// config-class retry due now (spec 6.5).
    pub fn reload(&mut self, cfg: Arc<Config>) -> Result<usize, StoreError> {
        self.registry = Registry::build(&cfg);
        self.cfg = cfg;
        let now = self.now_eff();
        self.store.redue_config_retries(now)
    }

    /// now_eff = max(wall clock, last_tick_at) (spec 2).
    pub fn now_eff(&self) -> f64 {
        self.clock.now().max(self.last_tick_at)
    }

    fn jitter01(&mut self) -> f64 {
        // xorshift64: jitter needs spread, not cryptographic quality.
        let mut x = self.jitter_state;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.jitter_state = x;
        (x >> 11) as f64 / (1u64 << 53) as f64
    }

    fn heartbeat(&mut self, now: f64) -> Result<(), StoreError> {
        self.last_tick_at = self.last_tick_at.max(now);
        self.store
            .set_meta("dispatcher_heartbeat_at", &self.clock.now().to_string())?;
        self.store
            .set_meta("last_tick_at", &self.last_tick_at.to_string())?;
        self.last_heartbeat = now;
        Ok(())
    }

    /// The maintenance tick (spec 11.4): silent sources, the free-space limit, and one alert
    /// pass off the main loop.
    fn maintenance(&mut self, now: f64) -> Result<(), StoreError> {
        use crate::observe::issues;
        issues::check_sources(&mut self.store, &self.cfg, now)?;
        issues::check_disk(&mut self.store, &self.cfg, now)?;
        if let Some(Err(e)) = self
            .alerter
            .tick(&self.cfg.db, &self.cfg.alerts, &self.clock)
        {
            tracing::warn!(component = "dispatch", reason = %e, "alert pass failed");
        }
        Ok(())
    }

    /// Wait for a running alert pass (shutdown).
    pub fn finish_alerts(&mut self) {
        if let Some(Err(e)) = self.alerter.finish() {
            tracing::warn!(component = "dispatch", reason = %e, "alert pass failed");
        }
    }

    /// Record what the script sandbox enforces (meta `sandbox`, shown by status) and raise or
    /// resolve the `config:sandbox` issue.
    pub fn record_sandbox(&mut self, text: &str, complete: bool) -> Result<(), StoreError> {
        let now = self.now_eff();
        self.store.set_meta(
            "sandbox",
            &serde_json::json!({"complete": complete, "enforced": text}).to_string(),
        )?;
        if complete {
            crate::observe::issues::resolve(&mut self.store, "config:sandbox", now)?;
        } else {
            crate::observe::issues::open_or_bump(
                &mut self.store,
                "config:sandbox",
                "config",
                None,
                None,
                None,
                Some(text),
                now,
            )?;
        }
        Ok(())
    }

    /// Record a config reload's result as the config:file issue.
    pub fn config_reload_issue(&mut self, result: Result<(), &str>) -> Result<(), StoreError> {
        let now = self.now_eff();
        crate::observe::issues::config_reload(&mut self.store, result, now)?;
        Ok(())
    }

    /// Number of attempts in flight.
    pub fn inflight(&self) -> usize {
        self.live.len()
    }

    /// In-flight counts per destination (for status).
    pub fn inflight_by_destination(&self) -> &HashMap<String, usize> {
        &self.inflight
    }

    /// Apply every finished worker's result without waiting.
    pub fn apply_finished(&mut self) -> Result<usize, StoreError> {
        let mut dones = Vec::new();
        while let Ok(done) = self.rx.try_recv() {
            dones.push(done);
        }
        let n = dones.len();
        self.finish_many(dones)?;
        Ok(n)
    }

    /// Wait for the next finished worker (for the run loop's select) and apply it.
    pub async fn next_finished(&mut self) -> Option<Done> {
        self.rx.recv().await
    }

    /// Wait until no worker is in flight, applying results, or until `bound` passes.
    pub async fn drain(&mut self, bound: Duration) -> Result<bool, StoreError> {
        let until = Instant::now() + bound;
        while !self.live.is_empty() {
            let left = until.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, self.rx.recv()).await {
                Ok(Some(done)) => {
                    let mut dones = vec![done];
                    while let Ok(more) = self.rx.try_recv() {
                        dones.push(more);
                    }
                    self.finish_many(dones)?;
                }
                _ => return Ok(false),
            }
        }
        Ok(true)
    }

    /// One tick (spec 5, 6.2, 6.3).
    pub fn tick(&mut self) -> Result<TickReport, StoreError> {
        self.apply_finished()?;
        let now = self.now_eff();
        let mut rep = TickReport {
            now_eff: now,
            ..Default::default()
        };
        rep.sealed = self.store.seal_ready(now)?.len();
        let live: Vec<String> = self
            .live
            .values()
            .map(|f| f.claim.lease_owner.clone())
            .collect();
        rep.recovered = self.store.recover_expired_leases(now, &live)?.len();
        rep.claimed = self.claim_ready(now)?;
        if now - self.last_heartbeat >= self.cfg.dispatch.heartbeat_s {
            self.heartbeat(now)?;
            self.maintenance(now)?;
        }
        if now - self.last_retention >= RETENTION_EVERY_S {
            let pruned = self.store.prune(now, &self.cfg.retention())?;
            self.last_retention = now;
            tracing::debug!(
                component = "dispatch",
                batches = pruned.batches,
                "retention pass"
            );
        }
        Ok(rep)
    }

    fn claim_ready(&mut self, now: f64) -> Result<Vec<i64>, StoreError> {
        let parallel = self.cfg.dispatch.parallel.max(1) as usize;
        if self.live.len() >= parallel {
            return Ok(vec![]);
        }
        let candidates = self.store.candidates(now, CANDIDATES_PER_TICK_MAX)?;
        let mut gates: HashMap<String, (DestinationRow, Gate, bool)> = HashMap::new();
        // Candidates per destination, for the probe's rotation rule.
        let mut by_dest: HashMap<String, Vec<i64>> = HashMap::new();
        for c in &candidates {
            by_dest
                .entry(c.destination.clone())
                .or_default()
                .push(c.batch_id);
        }
        // Phase 1: choose through the gates, counting the chosen as in flight.
        let mut picks: Vec<Pick> = Vec::new();
        let mut rows_changed: Vec<String> = Vec::new();
        for c in candidates {
            if self.live.len() + picks.len() >= parallel {
                break;
            }
            if !gates.contains_key(&c.destination) {
                let mut row = self.store.destination(&c.destination)?;
                let before = row.state.clone();
                let g = breaker::gate(&mut row, now);
                if row.state != before {
                    rows_changed.push(c.destination.clone());
                }
                gates.insert(c.destination.clone(), (row, g, false));
            }
            let built = self.registry.get(&c.destination);
            let Some((row, gate, probed)) = gates.get_mut(&c.destination) else {
                continue;
            };
            let probe = match *gate {
                Gate::Closed => continue,
                Gate::Probe => {
                    if *probed {
                        continue;
                    }
                    // Rotate: never the last probe's batch when another is due.
                    let list = &by_dest[&c.destination];
                    let pick = list
                        .iter()
                        .copied()
                        .find(|b| Some(*b) != row.last_probe_batch_id)
                        .unwrap_or(list[0]);
                    if pick != c.batch_id {
                        continue;
                    }
                    *probed = true;
                    true
                }
                Gate::Open => {
                    if self.inflight.get(&c.destination).copied().unwrap_or(0) >= built.max_inflight
                    {
                        continue;
                    }
                    false
                }
            };
            *self.inflight.entry(c.destination.clone()).or_insert(0) += 1;
            let lease_until = now + built.timeout_s + self.cfg.dispatch.lease_grace_s;
            let idempotency = built.idempotency();
            picks.push(Pick {
                batch_id: c.batch_id,
                destination: c.destination,
                built,
                probe,
                lease_until,
                idempotency,
            });
        }
        if picks.is_empty() {
            for name in rows_changed {
                if let Some((row, _, _)) = gates.get(&name) {
                    self.store.save_destination(row)?;
                }
            }
            return Ok(vec![]);
        }
        // Phase 2: every claim of this tick in one transaction.
        let inst = self.instance_id.clone();
        let reqs: Vec<ClaimRequest<'_>> = picks
            .iter()
            .map(|p| {
                let (inst, batch, idempotency) = (inst.clone(), p.batch_id, p.idempotency);
                ClaimRequest {
                    batch_id: p.batch_id,
                    lease_until: p.lease_until,
                    probe: p.probe,
                    delivery_id: Box::new(move |attempt_id| {
                        idempotency.id_for(&inst, batch, attempt_id)
                    }),
                }
            })
            .collect();
        let results = self.store.claim_many(&self.owner_prefix, now, &reqs)?;
        drop(reqs);
        // Phase 3: spawn the won claims; give back the slots of lost ones.
        let mut claimed = Vec::new();
        for (p, won) in picks.into_iter().zip(results) {
            let Some(claim) = won else {
                if let Some(n) = self.inflight.get_mut(&p.destination) {
                    *n = n.saturating_sub(1);
                }
                continue;
            };
            if p.probe
                && let Some((row, _, _)) = gates.get_mut(&p.destination)
            {
                row.probe_until = Some(p.lease_until);
                row.last_probe_batch_id = Some(p.batch_id);
                rows_changed.push(p.destination.clone());
            }
            claimed.push(p.batch_id);
            let id = p
                .idempotency
                .id_for(&self.instance_id, p.batch_id, claim.attempt_id);
            self.spawn(claim, p.built, p.destination, now, p.probe, id)?;
        }
        rows_changed.sort();
        rows_changed.dedup();
        for name in rows_changed {
            if let Some((row, _, _)) = gates.get(&name) {
                self.store.save_destination(row)?;
            }
        }
        Ok(claimed)
    }

    fn spawn(
        &mut self,
        claim: Claim,
        built: Arc<Built>,
        destination: String,
        now: f64,
        probe: bool,
        delivery_id: String,
    ) -> Result<(), StoreError> {
        let batch = self.store.batch(claim.batch_id)?;
        let frozen = self.store.frozen_events(claim.batch_id)?;
        let body = document::render(&batch, &frozen, &delivery_id, claim.attempt_n);
        let left_s = (claim.lease_until - DEADLINE_MARGIN_S - now).max(0.0);
        let deadline = Instant::now() + Duration::from_secs_f64(left_s);
        let delivery = Delivery {
            batch_id: claim.batch_id,
            attempt_n: claim.attempt_n,
            attempt_id: claim.attempt_id,
            instance_id: self.instance_id.clone(),
            route: batch.route.clone(),
            body,
            event_type: frozen.last().map(|e| e.event_type.clone()),
            source_event_header: self
                .cfg
                .sources
                .get(&batch.source)
                .and_then(|s| s.event_header.clone()),
            events: frozen
                .iter()
                .map(|e| UnwrapEvent {
                    id: e.id,
                    event_type: e.event_type.clone(),
                    dedup_id: e.dedup_id.clone(),
                    payload: e.payload.clone().unwrap_or_default().into_bytes(),
                })
                .collect(),
            deadline,
        };
        let home = self.cfg.home.clone();
        let tx = self.tx.clone();
        let batch_id = claim.batch_id;
        tracing::info!(
            component = "dispatch",
            batch = batch_id,
            destination = %destination,
            attempt = claim.attempt_n,
            route = %batch.route,
            source = %batch.source,
            "attempt started"
        );
        self.live.insert(
            batch_id,
            InFlight {
                attempt_n: claim.attempt_n,
                claim,
                destination,
                started_at: now,
                probe,
            },
        );
        tokio::spawn(async move {
            let started = Instant::now();
            let outcome = match &built.target {
                Target::Http(h) => h.deliver(&delivery).await,
                Target::Hermes(h) => h.deliver(&delivery).await,
                Target::Script(s) => {
                    s.deliver(&ScriptDelivery {
                        batch_id: delivery.batch_id,
                        delivery_id,
                        body: delivery.body.clone(),
                        deadline: delivery.deadline,
                        spool_home: home,
                    })
                    .await
                }
                Target::Broken(why) => {
                    Outcome::retry(Klass::Config, None, "destination misconfigured")
                        .with_detail(why)
                }
            };
            // The engine may have stopped; its restart recovers the lease.
            let _ = tx.send(Done {
                batch_id,
                outcome,
                duration: started.elapsed(),
            });
        });
        Ok(())
    }

    /// Record `done` and every other worker that has finished meanwhile, in one transaction
    /// (the mark, fenced; the breaker; the backoff; spec 6.5).
    pub fn finish_with_pending(&mut self, done: Done) -> Result<(), StoreError> {
        let mut dones = vec![done];
        while let Ok(more) = self.rx.try_recv() {
            dones.push(more);
        }
        self.finish_many(dones)
    }

    /// Record finished workers' outcomes: every mark and the destination rows they changed
    /// in one transaction (one fsync per loop turn, not three per delivery), then issues
    /// and log lines.
    pub fn finish_many(&mut self, dones: Vec<Done>) -> Result<(), StoreError> {
        let now = self.now_eff();
        let mut rows: HashMap<String, (DestinationRow, bool)> = HashMap::new();
        let mut prepared = Vec::with_capacity(dones.len());
        for done in dones {
            if let Some(p) = self.prepare(done, &mut rows, now)? {
                prepared.push(p);
            }
        }
        if prepared.is_empty() {
            return Ok(());
        }
        let reports: Vec<AttemptReport> = prepared.iter().map(|p| p.report.clone()).collect();
        let changed: Vec<DestinationRow> = rows
            .into_values()
            .filter(|(_, c)| *c)
            .map(|(r, _)| r)
            .collect();
        let results = self.store.mark_many(&reports, &changed)?;
        for (p, result) in prepared.into_iter().zip(results) {
            let applied = match result {
                Ok(a) => a,
                Err(e) => {
                    // The store refused this report alone (its savepoint rolled back): the
                    // batch stays leased and lease recovery retries it.
                    tracing::error!(component = "dispatch", batch = p.batch.id, reason = %e, "could not record an attempt");
                    continue;
                }
            };
            self.after_mark(p, applied, now)?;
        }
        Ok(())
    }

    fn prepare(
        &mut self,
        done: Done,
        rows: &mut HashMap<String, (DestinationRow, bool)>,
        now: f64,
    ) -> Result<Option<Prepared>, StoreError> {
        let Some(f) = self.live.remove(&done.batch_id) else {
            return Ok(None);
        };
        if let Some(n) = self.inflight.get_mut(&f.destination) {
            *n = n.saturating_sub(1);
        }
        if !rows.contains_key(&f.destination) {
            let row = self.store.destination(&f.destination)?;
            rows.insert(f.destination.clone(), (row, false));
        }
        let Some((row, changed)) = rows.get_mut(&f.destination) else {
            return Ok(None);
        };
        let before = row.clone();
        let batch = self.store.batch(done.batch_id)?;
        let o = &done.outcome;
        let cfg = self.cfg.dispatch.clone();
        let mut effect = Effect::None;
        let mut error = (!o.detail.is_empty())
            .then(|| o.detail.clone())
            .or_else(|| (o.kind != OutcomeKind::Ok).then(|| o.reason.clone()));
        let (mark, klass_name): (Mark, &str) = match (o.kind, o.klass) {
            (OutcomeKind::Ok, _) => match emits::to_requests(&self.cfg, &o.emits, now) {
                Ok(reqs) => {
                    effect = breaker::on_success(row, now);
                    (
                        Mark::Delivered {
                            result: o.notice.clone(),
                            emits: reqs,
                        },
                        "ok",
                    )
                }
                Err(e) => {
                    error = Some(format!("bad emit: {e}"));
                    self.batch_failure(&batch, true, now)
                }
            },
            (OutcomeKind::Retry, Some(Klass::Transport)) => {
                let strikes = if row.state == "closed" {
                    self.store
                        .poison_strikes(batch.id, &f.destination, f.started_at)?
                } else {
                    0
                };
                if strikes >= POISON_STRIKES {
                    row.consecutive_failures = 0;
                    (
                        Mark::Dead {
                            klass: Klass::Poison.as_str().into(),
                        },
                        "poison",
                    )
                } else {
                    effect = breaker::on_transport_failure(
                        row,
                        &cfg.breaker,
                        f.started_at,
                        f.probe,
                        now,
                        &o.reason,
                    );
                    let n = row.consecutive_failures.max(1);
                    let next = now
                        + retry::backoff_s(
                            n,
                            cfg.backoff_base_s,
                            cfg.backoff_cap_s,
                            self.jitter01(),
                        );
                    (
                        Mark::Retry {
                            klass: "transport".into(),
                            next_attempt_at: next,
                            counted: false,
                        },
                        "transport",
                    )
                }
            }
            (OutcomeKind::Retry, Some(Klass::Throttle)) => {
                let n = row.consecutive_failures.max(1);
                let backoff =
                    retry::backoff_s(n, cfg.backoff_base_s, cfg.backoff_cap_s, self.jitter01());
                let delay = retry::throttle_delay_s(o.retry_after_s, backoff);
                if let Some(ra) = o.retry_after_s {
                    row.retry_after_until = Some(now + ra.min(retry::RETRY_AFTER_S_MAX));
                }
                (
                    Mark::Retry {
                        klass: "throttle".into(),
                        next_attempt_at: now + delay,
                        counted: false,
                    },
                    "throttle",
                )
            }
            (OutcomeKind::Retry, Some(Klass::Config)) => (
                Mark::Retry {
                    klass: "config".into(),
                    next_attempt_at: now + cfg.backoff_cap_s,
                    counted: false,
                },
                "config",
            ),
            (OutcomeKind::Retry, _) => self.batch_failure(&batch, is_bad_emit(o), now),
            (OutcomeKind::Dead, k) => {
                let k = k.unwrap_or(Klass::Permanent);
                (
                    Mark::Dead {
                        klass: k.as_str().into(),
                    },
                    k.as_str(),
                )
            }
        };
        let report = AttemptReport {
            batch_id: batch.id,
            attempt_id: f.claim.attempt_id,
            lease_owner: f.claim.lease_owner.clone(),
            now,
            status: o.status,
            error: error.map(|e| e.chars().take(500).collect()),
            duration_ms: done.duration.as_millis() as i64,
            delivery_id: None,
            events_delivered: o.events_delivered,
            failed_event_id: o.failed_event_id,
            mark,
        };
        *changed |= *row != before;
        Ok(Some(Prepared {
            destination: f.destination,
            attempt_n: f.attempt_n,
            batch,
            outcome: done.outcome,
            report,
            klass_name,
            effect,
        }))
    }

    fn after_mark(&mut self, p: Prepared, applied: MarkResult, now: f64) -> Result<(), StoreError> {
        let o = &p.outcome;
        if applied == MarkResult::Applied {
            self.record_issues(
                &p.destination,
                &p.batch,
                o,
                &p.report.mark,
                p.klass_name,
                p.effect,
                now,
            )?;
        }
        let outcome_word = match (&applied, &p.report.mark) {
            (MarkResult::Discarded, _) => "discarded",
            (_, Mark::Delivered { .. }) => "ok",
            (_, Mark::Retry { .. }) => "retry",
            (_, Mark::Dead { .. }) => "dead",
        };
        tracing::info!(
            component = "dispatch",
            batch = p.batch.id,
            destination = %p.destination,
            attempt = p.attempt_n,
            status = o.status.unwrap_or(0),
            duration_ms = p.report.duration_ms,
            reason = %o.reason,
            klass = p.klass_name,
            outcome = outcome_word,
            "attempt finished"
        );
        if matches!(p.effect, Effect::Tripped | Effect::Retripped) {
            tracing::warn!(component = "dispatch", destination = %p.destination, reason = %o.reason, "breaker open");
        }
        Ok(())
    }

    /// Issues for one applied outcome (spec 11.4): dead batches, breaker trips, counted
    /// streaks, config outcomes and Hermes notices open or bump one; a success resolves the
    /// destination's transient ones.
    #[allow(clippy::too_many_arguments)]
    fn record_issues(
        &mut self,
        destination: &str,
        batch: &crate::store::BatchRow,
        o: &Outcome,
        mark: &Mark,
        klass_name: &str,
        effect: Effect,
        now: f64,
    ) -> Result<(), StoreError> {
        use crate::observe::issues::{self, DeliveryReason as R};
        let store = &mut self.store;
        let route = Some(batch.route.as_str());
        let reason = Some(o.reason.as_str());
        let transport_reason = || {
            if destination.starts_with("script:") {
                R::ScriptExit
            } else if o.status.is_some_and(|s| (500..600).contains(&s)) {
                R::Http5xx
            } else if o.reason.contains("timeout") || o.reason.contains("deadline") {
                R::Timeout
            } else {
                R::Unreachable
            }
        };
        match mark {
            Mark::Delivered { .. } => {
                issues::attempt_succeeded(store, destination, now)?;
                if o.notice.is_some() {
                    issues::delivery_failed(
                        store,
                        destination,
                        route,
                        R::Ignored,
                        Some(batch.id),
                        o.notice.as_deref(),
                        now,
                    )?;
                }
            }
            Mark::Dead { .. } => {
                let r = match klass_name {
                    "poison" => R::Poison,
                    "exhausted" => R::Exhausted,
                    _ => R::Permanent,
                };
                issues::delivery_failed(store, destination, route, r, Some(batch.id), reason, now)?;
            }
            Mark::Retry { klass, counted, .. } => {
                if matches!(effect, Effect::Tripped | Effect::Retripped) {
                    issues::delivery_failed(
                        store,
                        destination,
                        route,
                        transport_reason(),
                        Some(batch.id),
                        reason,
                        now,
                    )?;
                } else if klass == "config" {
                    issues::delivery_config_failed(
                        store,
                        destination,
                        route,
                        Some(batch.id),
                        reason,
                        now,
                    )?;
                } else if *counted && batch.attempts + 1 >= COUNTED_STREAK_ISSUE {
                    let r = if destination.starts_with("script:") {
                        R::ScriptExit
                    } else {
                        R::Batch
                    };
                    issues::delivery_failed(
                        store,
                        destination,
                        route,
                        r,
                        Some(batch.id),
                        reason,
                        now,
                    )?;
                }
            }
        }
        Ok(())
    }

    /// A counted (batch-class) failure: retry with backoff on the attempt count, dead at
    /// max_attempts; a bad emit twice in a row is permanent (spec 6.6, 14.2).
    fn batch_failure(
        &mut self,
        batch: &crate::store::BatchRow,
        bad_emit: bool,
        now: f64,
    ) -> (Mark, &'static str) {
        let cfg = &self.cfg.dispatch;
        if bad_emit
            && batch
                .last_error
                .as_deref()
                .is_some_and(|e| e.starts_with("bad emit"))
        {
            return (
                Mark::Dead {
                    klass: "permanent".into(),
                },
                "permanent",
            );
        }
        let n = batch.attempts + 1;
        if n >= cfg.max_attempts {
            return (
                Mark::Dead {
                    klass: "batch".into(),
                },
                "exhausted",
            );
        }
        let (base, cap) = (cfg.backoff_base_s, cfg.backoff_cap_s);
        let next = now + retry::backoff_s(n, base, cap, self.jitter01());
        (
            Mark::Retry {
                klass: "batch".into(),
                next_attempt_at: next,
                counted: true,
            },
            "batch",
        )
    }
}
