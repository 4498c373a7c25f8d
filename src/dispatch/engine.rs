//! The dispatcher's engine (spec 2, 5, 6): one tick records finished workers' results,
//! seals ready batches, recovers expired leases no live worker holds, claims heads of
//! groups through the destination gates (the breaker, `max_inflight`, the request rate) and
//! spawns one worker per claim; every heartbeat_s it writes the heartbeat (with what only
//! its memory knows: in-flight counts, rate-limited waits) and starts an alert pass, every
//! 60 s the maintenance tick, and an hourly retention pass a budget of steps per tick.
//!
//! Workers only do I/O; every store write (claim, mark, destination state) happens here on
//! the engine, so the dispatcher has one writer. Time is `now_eff = max(wall, the latest
//! now_eff this process used, meta.last_tick_at)`: a backwards clock step makes time stand
//! still, always. A finished worker's result is kept until the transaction that records it
//! commits: a busy database delays it (retried with backoff), never drops it.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::breaker::{self, Effect, Gate};
use super::rate::Limiter;
use super::registry::{Built, Registry, Target};
use super::retry::Backoff;
use super::verdict::{self, Facts, Rule, Verdict};
use super::{document, emits};
use crate::clock::SharedClock;
use crate::config::Config;
use crate::destinations::script::ScriptDelivery;
use crate::destinations::{Delivery, Idempotency, Klass, Outcome, OutcomeKind, UnwrapEvent};
use crate::failpoint;
use crate::observe::issues::{self, DeliveryReason};
use crate::observe::prom::Histograms;
use crate::store::{
    BatchRow, CandidatePrefix, Claim, ClaimRequest, ClaimedReads, Decision, DestinationRow,
    FastGate, Mark, MarkResult, PrunePass, Recorded, Redue, Store, StoreError,
};
use crate::vocab::{AttemptOutcome, BreakerState};

pub use super::verdict::POISON_STRIKES;

mod record;

/// Workers abort this long before their lease ends (spec 6.2).
pub const DEADLINE_MARGIN_S: f64 = 5.0;
/// Candidates read per tick; the query returns only group heads, oldest first.
pub const CANDIDATES_PER_TICK_MAX: usize = 256;
/// Candidates read first per free slot (at least `CANDIDATES_FIRST_MIN`): a tick usually
/// has a few slots free, and when these heads fill them through open gates the longer list
/// would change nothing (`Engine::fills_open_gates`).
const CANDIDATES_PER_FREE_SLOT: usize = 4;
const CANDIDATES_FIRST_MIN: usize = 16;
/// The loop never wakes sooner than this for a destination's next token: a rate limit's
/// wake-up is never a busy loop, whatever float rounding says about the token.
pub const RATE_WAKE_MIN_S: f64 = 0.001;
/// A counted failure streak this long on one batch opens a delivery issue (spec 11.4).
pub const COUNTED_STREAK_ISSUE: i64 = 3;
/// How long `Engine::gather_results` waits at most for more results before a tick: two
/// ticks of the runtime's timer, which fires on whole milliseconds (so 2 - 3 ms).
pub const GATHER_MAX: Duration = Duration::from_millis(2);
/// Attempts in flight for longer than this (s) are not waited for by `gather_results`.
pub const GATHER_RECENT_S: f64 = 0.1;
/// The maintenance tick (silent sources, free space, alerts) runs this often (spec 2).
pub const MAINTENANCE_EVERY_S: f64 = 60.0;
/// A retention pass starts this often (spec 8).
pub const RETENTION_EVERY_S: f64 = 3600.0;
/// Expired leases are looked for this often, not at every tick: a lease lasts the
/// destination's timeout and more, and this process's own workers end their attempts at
/// their deadlines, so a lease no live worker holds waits at most this much longer to be
/// recovered. On PostgreSQL the look is a round trip on each tick's path to a request.
pub const LEASE_CHECK_EVERY_S: f64 = 1.0;
/// A tick spends at most this long on retention steps, and the next burst waits
/// `PRUNE_GAP_MS` (the store's pacing, which lets a waiting intake in): deliveries never
/// wait behind a whole pass, nor the intake behind back-to-back steps.
pub const RETENTION_TICK_BUDGET_MS: u64 = crate::store::PRUNE_BURST_MS;
/// After a busy or full database, recording is retried after this long, doubling up to
/// `BUSY_RETRY_S_MAX` (each try has already waited the connection's busy timeout).
pub const BUSY_RETRY_S_MIN: f64 = 0.1;
pub const BUSY_RETRY_S_MAX: f64 = 5.0;

/// What phase 1 of `claim_ready` chose: the picks, the destinations whose row the gate
/// changed (open -> half_open), whether every gate it met was open, and the batches each
/// destination's request rate held (no attempt, no move: they stay due, heads of their keys).
struct Choice {
    picks: Vec<Pick>,
    rows_changed: Vec<String>,
    all_open: bool,
    held: HashMap<String, std::collections::BTreeSet<i64>>,
}

/// A batch chosen through the gates, before its claim.
struct Pick {
    batch_id: i64,
    destination: String,
    built: Arc<Built>,
    probe: bool,
    lease_until: f64,
    idempotency: Idempotency,
}

/// The probes a claim started, by destination (the batch and its lease), and the
/// destinations whose rows it changed (`Engine::start_claims`).
type Probes<'a> = (&'a mut HashMap<String, (i64, f64)>, &'a mut Vec<String>);

/// One finished worker.
pub struct Done {
    pub batch_id: i64,
    pub outcome: Outcome,
    pub duration: Duration,
}

#[derive(Debug, Clone)]
struct InFlight {
    claim: Claim,
    /// The batch as read right after its claim committed: leased to this claim, it changes
    /// only by this attempt's mark (or, once expired, by a recovery that fences the mark),
    /// so recording the result needs no second read.
    batch: BatchRow,
    destination: String,
    started_at: f64,
    probe: bool,
    /// The destination runs a script (its transport issues are `script_exit`).
    script: bool,
}

/// What one tick did (for tests, logs and the watchdog).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct TickReport {
    pub now_eff: f64,
    pub sealed: usize,
    pub recovered: usize,
    pub claimed: Vec<i64>,
    /// Results recorded at the start of the tick.
    pub recorded: usize,
    /// Retention transactions this tick ran, and whether the pass goes on next tick.
    pub retention_steps: usize,
    pub retention_running: bool,
    /// The tick did nothing: a refused write put ticks in a backoff that has not ended.
    pub deferred: bool,
}

/// A weather refusal (a busy or full spool) is logged at warn level at most this often;
/// the others of an episode are counted (`busy_retries` in the heartbeat) and logged at
/// debug level, so a long full-disk episode does not fill the journal as well.
pub const WEATHER_LOG_EVERY_S: f64 = 30.0;

/// Retries after a busy or full spool (weather, `StoreError::is_weather`), and how many
/// there were.
#[derive(Debug)]
struct Busy {
    /// When recording the unrecorded results may be tried again.
    retry_at: Option<Instant>,
    delay: Backoff,
    /// When a tick may try its writes again after one was refused (the whole tick backs
    /// off, so a full disk costs one refused write per backoff step, not one per poll).
    tick_at: Option<Instant>,
    tick_delay: Backoff,
    total: u64,
    /// When the last warn-level weather line was written, per deferred step.
    logged_at: HashMap<String, Instant>,
}

/// The full-disk episode as this dispatcher has seen it, and the `spool:full` issue
/// (spec 9, 11.4) that follows it. Writing the issue may fail for the very lack of space
/// it reports; it is then written by the first write that succeeds. Until then the
/// state lives here, the log says it, and `status` and /healthz show the condition from
/// the filesystem itself (`spool_full`, `observe::status`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum DiskState {
    /// The last write the dispatcher tried committed (or none has been refused).
    Writable,
    /// A write was refused for lack of space at `since` (now_eff); `recorded`: the
    /// `spool:full` issue is open in the spool.
    Full { since: f64, recorded: bool },
    /// Writes commit again since `opened_at`; `spool:full` is resolved once an alert pass
    /// that started after that has finished, so the episode still alerts.
    Clearing { opened_at: f64 },
}

/// The `spool:<limit>` name of a full spool: the intake's writer opens the same one when a
/// group commit fails for lack of space, so one condition is one issue whoever sees it.
pub const SPOOL_FULL_LIMIT: &str = "full";

/// How long the tick's own session records results after the recorder's session was
/// refused by weather (`Engine::recordable_beside`).
pub const RECORDER_REST_S: f64 = 30.0;

pub struct Engine {
    cfg: Arc<Config>,
    registry: Registry,
    store: Store,
    clock: SharedClock,
    owner_prefix: String,
    instance_id: String,
    live: HashMap<i64, InFlight>,
    inflight: HashMap<String, usize>,
    /// Each rate-limited destination's token bucket and wait figures (`dispatch::rate`).
    rates: HashMap<String, Limiter>,
    /// When (now_eff) the next token of a destination holding batches is due: the loop
    /// wakes then, so a backlog drains at the limit, not at the poll interval.
    rate_wake_at: Option<f64>,
    tx: mpsc::UnboundedSender<Done>,
    rx: mpsc::UnboundedReceiver<Done>,
    /// Results received from workers and not yet committed.
    unrecorded: Vec<Done>,
    /// The workers themselves: dropped with the engine, so a dispatcher that stops (under
    /// `hookspool run` it is restarted in the same process) leaves no attempt running
    /// whose result nobody could record.
    workers: tokio::task::JoinSet<()>,
    busy: Busy,
    /// Whether a weather refusal was noted during the current tick.
    refused_in_tick: bool,
    disk: DiskState,
    /// The latest now_eff this process has used (f64 bits): the clock guard's floor.
    floor: AtomicU64,
    last_heartbeat: f64,
    last_maintenance: f64,
    last_lease_check: f64,
    last_retention: f64,
    retention: Option<PrunePass>,
    /// The next retention burst, after the gap that leaves the lock to other writers.
    retention_next: Instant,
    /// A reload's "config retries due now" still to be written (the database was busy).
    redue_pending: bool,
    /// Since when each destination has answered only throttles; `None` once this process
    /// has seen it answer otherwise since. A destination this process has not heard from
    /// yet is absent: its first throttle reads the time from the spool
    /// (`Store::throttled_since`), so a restart does not start the count again.
    throttled_since: HashMap<String, Option<f64>>,
    /// Destinations whose resolvable issues a success of this process has resolved, with
    /// no issue opened for them since: a later success would find nothing to resolve, so
    /// it skips the reads (one per fingerprint). Only this process opens those issues (the
    /// dispatcher's flock makes it the only one), always in `after_record`, which takes
    /// the destination out of the set first; a restart starts with it empty.
    resolved: std::collections::HashSet<String>,
    /// Whether the current tick's transaction has committed (`commit_tick_txn`).
    tick_txn_committed: bool,
    jitter_state: u64,
    alerter: crate::observe::alerts::Alerter,
    /// When (now_eff) the running alert pass started, and when the last finished one did:
    /// `spool:full` resolves only after a pass that started with it open has finished.
    alert_started: Option<f64>,
    alert_finished_from: Option<f64>,
    /// This run's histograms (issue 35), published with the heartbeat for /metrics:
    /// attempt duration by destination and outcome, receive-to-delivered by route.
    attempt_duration: Histograms,
    receive_to_delivered: Histograms,
    /// A second session of a PostgreSQL spool that records results while `store` seals
    /// and claims (`Engine::set_recorder`); `None` on SQLite.
    recorder: Option<Store>,
    /// The lease owners of the results being recorded beside the tick's claims: out of
    /// `live` (their slots are free), yet no lease to recover.
    recording: Vec<String>,
    /// Destinations a success recorded beside the claims proved healthy whose retries the
    /// spool was too busy to make due after the claims' commit: the next tick does
    /// (`redue`).
    recovered_pending: Vec<String>,
    /// After the recorder was refused by weather, the tick's own session records until
    /// then (`RECORDER_REST_S`): the recorder's session may be the one in trouble.
    recorder_rests_until: Option<Instant>,
    /// Results were recorded beside the last tick's claims, which could not see them, and
    /// slots are free: a group's next batch, blocked by its head until that head's mark
    /// committed, is claimed by a tick that follows at once (`next_wait`).
    tick_again: bool,
    /// The destinations whose rows the last tick that had candidates read for its gates
    /// (`choose`): the next tick reads them with its seal (`Store::read_ahead_for_claims`).
    /// Each once.
    gates_read: Vec<String>,
    /// Each destination's row as `choose` read it last, for the gates of a wake-up's tick on
    /// PostgreSQL that claims without reading them (`fast_gates`): the store claims for a
    /// destination only if its row still reads so.
    gate_rows: HashMap<String, DestinationRow>,
    /// The last claim took every head there was through open gates (`claim_ready`), or the
    /// last fast claim left none (`fast_tick`): only then does a tick claim without reading
    /// its gates first.
    fast_next: bool,
    /// The open attempt spans by batch, with the intake span they descend from (issue 35).
    spans: HashMap<
        i64,
        (
            crate::telemetry::Span,
            Option<opentelemetry::trace::SpanContext>,
        ),
    >,
}

fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "localhost".into())
}

impl Engine {
    pub fn new(cfg: Arc<Config>, store: Store, clock: SharedClock) -> Result<Engine, StoreError> {
        // Its session seals, walks and claims: on indexes (`Store::plan_ticks_on_indexes`).
        store.plan_ticks_on_indexes();
        let instance_id = store.instance_id()?;
        let last_tick_at = store
            .meta("last_tick_at")?
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0f64);
        // A `spool:full` left open by an earlier process (killed during or after its
        // episode, so its DiskState went with it) is this one's to resolve: start as if an
        // episode were clearing, so the first alert pass after a committed tick resolves it;
        // a disk still full puts it back to Full at the first refused write.
        let inherited_full = store.issue_is_open(&format!("spool:{SPOOL_FULL_LIMIT}"))?;
        let disk = if inherited_full {
            DiskState::Clearing {
                opened_at: clock.now(),
            }
        } else {
            DiskState::Writable
        };
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
            rates: HashMap::new(),
            rate_wake_at: None,
            tx,
            rx,
            unrecorded: Vec::new(),
            workers: tokio::task::JoinSet::new(),
            busy: Busy {
                retry_at: None,
                delay: Backoff::new(BUSY_RETRY_S_MIN, BUSY_RETRY_S_MAX),
                tick_at: None,
                tick_delay: Backoff::new(BUSY_RETRY_S_MIN, BUSY_RETRY_S_MAX),
                total: 0,
                logged_at: HashMap::new(),
            },
            refused_in_tick: false,
            disk,
            floor: AtomicU64::new(last_tick_at.to_bits()),
            last_heartbeat: f64::NEG_INFINITY,
            last_maintenance: f64::NEG_INFINITY,
            last_lease_check: f64::NEG_INFINITY,
            last_retention: f64::NEG_INFINITY,
            retention: None,
            retention_next: Instant::now(),
            redue_pending: false,
            throttled_since: HashMap::new(),
            resolved: Default::default(),
            tick_txn_committed: false,
            jitter_state: seed,
            alerter: crate::observe::alerts::Alerter::new(),
            alert_started: None,
            alert_finished_from: None,
            attempt_duration: Histograms::new(&["destination", "outcome"]),
            receive_to_delivered: Histograms::new(&["route"]),
            recorder: None,
            recording: Vec::new(),
            recovered_pending: Vec::new(),
            recorder_rests_until: None,
            tick_again: false,
            gates_read: Vec::new(),
            gate_rows: HashMap::new(),
            fast_next: false,
            spans: HashMap::new(),
        })
    }

    /// Record results on `recorder`, a second session of a PostgreSQL spool, which it makes
    /// the recorder (`Store::become_recorder`), while the tick's own session seals and
    /// claims (`record_beside_claims`). `false` on SQLite: nothing is kept, the tick's
    /// session records as before.
    pub fn set_recorder(&mut self, recorder: Store) -> bool {
        let taken = recorder.become_recorder();
        if taken {
            self.recorder = Some(recorder);
        }
        taken
    }

    /// Requests in flight at most (`dispatch.parallel`).
    fn parallel(&self) -> usize {
        self.cfg.dispatch.parallel.max(1) as usize
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

    /// Apply a new config (after a successful reload): rebuild destinations, make every
    /// config-class retry due now (spec 6.5) and resolve config:file (spec 15). Returns how
    /// many retries were made due; a busy database leaves that for the next tick.
    pub fn reload(&mut self, cfg: Arc<Config>) -> Result<usize, StoreError> {
        self.registry = Registry::build(&cfg);
        self.cfg = cfg;
        // Destinations the new config dropped are read no more.
        self.gates_read.clear();
        self.gate_rows.clear();
        // A changed request rate applies from now: tokens saved under the old one stay (up
        // to the new burst), the time from here on refills at the new rate.
        let now = self.now_eff();
        for (name, limiter) in &mut self.rates {
            limiter.bucket(self.registry.get(name).rate, now);
        }
        self.redue_pending = true;
        let n = self.redue()?;
        self.config_reload_issue(Ok(()))?;
        self.secrets_issue()?;
        Ok(n)
    }

    /// Open or resolve `config:secrets` for the config in force (at start and on reload;
    /// the warnings themselves are logged where the config is loaded).
    pub fn secrets_issue(&mut self) -> Result<(), StoreError> {
        let now = self.now_eff();
        let found = crate::config::secret_exposures(&self.cfg);
        issues::secret_exposure(&mut self.store, &found, now)
    }

    fn redue(&mut self) -> Result<usize, StoreError> {
        let now = self.now_eff();
        let mut n = 0;
        while let Some(name) = self.recovered_pending.last() {
            n += self.store.redue_retries(Redue::Recovered(name), now)?;
            self.recovered_pending.pop();
        }
        if !self.redue_pending {
            return Ok(n);
        }
        n += self.store.redue_retries(Redue::Config, now)?;
        self.redue_pending = false;
        Ok(n)
    }

    /// now_eff = max(wall clock, every now_eff before it in this process, last_tick_at as
    /// persisted by the previous run) (spec 2): time never goes backwards.
    pub fn now_eff(&self) -> f64 {
        let floor = f64::from_bits(self.floor.load(Ordering::Relaxed));
        let now = self.clock.now().max(floor);
        self.floor.store(now.to_bits(), Ordering::Relaxed);
        now
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

    /// The heartbeat row, with the clock guard and the in-memory figures `status` shows.
    fn heartbeat(&mut self, now: f64) -> Result<(), StoreError> {
        let inflight: serde_json::Map<String, serde_json::Value> = self
            .inflight
            .iter()
            .map(|(d, n)| (d.clone(), serde_json::json!(n)))
            .collect();
        // Counters of this process: Prometheus takes their reset at a restart for one.
        let rate_limited: serde_json::Map<String, serde_json::Value> = self
            .rates
            .iter()
            .map(|(d, l)| {
                (
                    d.clone(),
                    serde_json::json!({"waits": l.waits_total, "wait_s": l.wait_s_total}),
                )
            })
            .collect();
        let published = serde_json::json!({
            "inflight": inflight,
            "busy_retries": self.busy.total,
            "rate_limited": rate_limited,
            "attempt_duration": self.attempt_duration,
            "spans_dropped": crate::telemetry::dropped_total(),
            "pid": std::process::id(),
            "receive_to_delivered": self.receive_to_delivered,
        });
        self.store
            .heartbeat(self.clock.now(), now, &published.to_string())?;
        self.last_heartbeat = now;
        // A dispatcher is active again (a standby noticed none was): one read when not open.
        issues::dispatcher_active(&mut self.store, now)?;
        Ok(())
    }

    /// The maintenance tick (spec 2, 11.4): silent sources and the free-space limit.
    fn maintenance(&mut self, now: f64) -> Result<(), StoreError> {
        issues::check_sources(&mut self.store, &self.cfg, now)?;
        issues::check_disk(&mut self.store, &self.cfg, now)?;
        issues::check_polls(&mut self.store, &self.cfg, now)?;
        self.last_maintenance = now;
        Ok(())
    }

    /// One alert pass off the main loop (spec 11.4), with each heartbeat: an issue opened
    /// by anyone (this engine, the intake, the CLI) alerts within a heartbeat, not a
    /// maintenance period. A pass still running is left to finish.
    fn alert_pass(&mut self, now: f64) {
        if self.alerter.running() {
            return;
        }
        if let Some(t) = self.alert_started.take() {
            self.alert_finished_from = Some(t);
        }
        let at = match self.cfg.spool_at() {
            Ok(at) => at,
            Err(e) => {
                tracing::warn!(component = "dispatch", reason = %e, "alert pass not started");
                return;
            }
        };
        if let Some(Err(e)) = self.alerter.tick(&at, &self.cfg.alerts, &self.clock) {
            tracing::warn!(component = "dispatch", reason = %e, "alert pass failed");
        }
        if self.alerter.running() {
            self.alert_started = Some(now);
        }
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
            issues::resolve(&mut self.store, "config:sandbox", now)?;
        } else {
            issues::open_or_bump(
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

    /// Record a config load's result as the config:file issue (spec 12, 15): a failure
    /// opens it (the text names keys, never values), a success resolves it.
    pub fn config_reload_issue(&mut self, result: Result<(), &str>) -> Result<(), StoreError> {
        let now = self.now_eff();
        issues::config_reload(&mut self.store, result, now)
    }

    /// Number of attempts in flight.
    pub fn inflight(&self) -> usize {
        self.live.len()
    }

    /// Results are waiting for a database that stays busy: no progress is possible, so the
    /// watchdog is not fed (spec "Watchdog pings are a health proof").
    pub fn stalled(&self) -> bool {
        !self.unrecorded.is_empty() && self.busy.retry_at.is_some()
    }

    /// Finished results held in memory, not yet recorded.
    pub fn unrecorded(&self) -> usize {
        self.unrecorded.len()
    }

    /// Busy or full database retries so far.
    pub fn busy_retries(&self) -> u64 {
        self.busy.total
    }

    /// Whether the watchdog may be fed after this turn of the loop. Pings are a health
    /// proof: a tick completed with no result waiting on a busy spool. A full spool is
    /// weather rather than a wedge: while it still answers reads the loop is alive and
    /// waiting for space, which a restart by the watchdog could not create, and the
    /// restart would throw away the results held in memory (the batches delivered again).
    /// So a full spool feeds the watchdog while a read succeeds; a busy one does not. A
    /// PostgreSQL spool that cannot be reached is weather of the same kind: the tick came
    /// back with that answer (a connection attempt gives up within
    /// `PG_CONNECT_TIMEOUT_S`, a statement on a cut link within the keepalives' timeout),
    /// and a restart could not bring the server back; it would also cost an active
    /// dispatcher the means to end its own lost session when the link returns (a new
    /// process cannot tell that session is its own), leaving no dispatcher active.
    pub fn progress_possible(&self, ticked: Result<&TickReport, &StoreError>) -> bool {
        if matches!(self.disk, DiskState::Full { .. }) {
            return self.store.instance_id().is_ok();
        }
        match ticked {
            Ok(rep) => !rep.deferred && !self.stalled(),
            Err(StoreError::PgUnreachable { .. }) => true,
            Err(_) => false,
        }
    }

    /// How long the loop may sleep before it has something to do: `poll`, or less when a
    /// busy retry of unrecorded results or the next retention burst is due sooner; never
    /// less than the end of a tick backoff.
    pub fn next_wait(&self, poll: Duration) -> Duration {
        let now = Instant::now();
        let mut wait = poll;
        if let Some(at) = self.busy.tick_at {
            // Ticks back off after a refused write: nothing is due before the backoff ends.
            return wait.max(at.saturating_duration_since(now));
        }
        if self.tick_again {
            return Duration::ZERO;
        }
        if let Some(at) = self.busy.retry_at
            && !self.unrecorded.is_empty()
        {
            wait = wait.min(at.saturating_duration_since(now));
        }
        if self.retention.is_some() {
            wait = wait.min(self.retention_next.saturating_duration_since(now));
        }
        if let Some(at) = self.rate_wake_at {
            // On the engine's clock: the next token of a destination that holds batches.
            let s = (at - self.now_eff()).max(RATE_WAKE_MIN_S);
            wait = wait.min(Duration::from_secs_f64(s));
        }
        wait
    }

    /// Count and log one busy or full spool (weather) while doing `what`: at warn level
    /// once per [`WEATHER_LOG_EVERY_S`] for each `what`, at debug level otherwise. A full one starts (or
    /// continues) the full-disk episode.
    pub fn note_busy(&mut self, e: &StoreError, what: &str) {
        self.busy.total += 1;
        self.refused_in_tick = true;
        if e.is_full() {
            self.full_seen();
        }
        let loud = self
            .busy
            .logged_at
            .get(what)
            .is_none_or(|at| at.elapsed() >= Duration::from_secs_f64(WEATHER_LOG_EVERY_S));
        if loud {
            self.busy.logged_at.insert(what.to_string(), Instant::now());
            tracing::warn!(
                component = "dispatch",
                reason = %e,
                "{what} deferred; retrying ({} busy retries so far, {} results waiting)",
                self.busy.total,
                self.unrecorded.len()
            );
        } else {
            tracing::debug!(
                component = "dispatch",
                reason = %e,
                "{what} deferred; retrying ({} busy retries so far, {} results waiting)",
                self.busy.total,
                self.unrecorded.len()
            );
        }
    }

    /// A write was refused for lack of space: the episode begins (logged once) or goes on.
    fn full_seen(&mut self) {
        let now = self.now_eff();
        self.disk = match self.disk {
            DiskState::Writable => {
                tracing::warn!(
                    component = "dispatch",
                    "the spool's filesystem is full: nothing is claimed, finished results stay in memory ({} now, {} attempts in flight) and every write is retried with a backoff until space returns; issue spool:{SPOOL_FULL_LIMIT}",
                    self.unrecorded.len(),
                    self.live.len()
                );
                DiskState::Full {
                    since: now,
                    recorded: false,
                }
            }
            DiskState::Full { since, recorded } => DiskState::Full { since, recorded },
            DiskState::Clearing { .. } => DiskState::Full {
                since: now,
                recorded: true,
            },
        };
    }

    /// The start waited for space from `since`: the episode goes on until a tick's writes
    /// commit, and its issue is recorded by the first of them.
    pub fn full_at_start(&mut self, since: f64) {
        if self.disk == DiskState::Writable {
            self.disk = DiskState::Full {
                since,
                recorded: false,
            };
        }
    }

    /// While the spool is full, the first write of every tick is a tiny one: the
    /// `spool:full` issue until it is recorded, then the writability proof. A refusal ends
    /// the tick before any bigger write is tried.
    fn disk_probe(&mut self, now: f64) -> Result<(), StoreError> {
        let DiskState::Full { since, recorded } = self.disk else {
            return Ok(());
        };
        if recorded {
            return self.store.touch_writable(now);
        }
        let detail = format!(
            "the spool's filesystem has had no space for writes since {since:.0} (unix s): the intake answers 503, the dispatcher holds its results and claims nothing"
        );
        issues::spool_limit(&mut self.store, SPOOL_FULL_LIMIT, true, Some(&detail), now)?;
        self.disk = DiskState::Full {
            since,
            recorded: true,
        };
        Ok(())
    }

    /// A tick whose writes all committed: its backoff ends, and a full-disk episode moves
    /// on (its issue is recorded by now: the probe wrote it). `spool:full` resolves once an
    /// alert pass that started after the episode ended has finished (a heartbeat or two).
    fn tick_committed(&mut self, now: f64) -> Result<(), StoreError> {
        self.busy.tick_at = None;
        self.busy.tick_delay.reset();
        match self.disk {
            DiskState::Writable => {}
            DiskState::Full { since, .. } => {
                tracing::info!(
                    component = "dispatch",
                    "the spool takes writes again after {:.1} s full; delivery resumes",
                    now - since
                );
                self.busy.logged_at.clear();
                self.disk = DiskState::Clearing { opened_at: now };
            }
            DiskState::Clearing { opened_at } => {
                if self.alert_finished_from.is_some_and(|t| t >= opened_at) {
                    issues::spool_limit(&mut self.store, SPOOL_FULL_LIMIT, false, None, now)?;
                    self.disk = DiskState::Writable;
                }
            }
        }
        Ok(())
    }

    /// A tick refused by weather: the next one waits, doubling up to `BUSY_RETRY_S_MAX`.
    fn defer_ticks(&mut self, e: &StoreError) {
        // The tick's transaction holds the results too: say so when some are waiting.
        let what = if self.unrecorded.is_empty() {
            "tick"
        } else {
            "recording results"
        };
        self.note_busy(e, what);
        self.busy.tick_at =
            Some(Instant::now() + Duration::from_secs_f64(self.busy.tick_delay.delay_s()));
        self.busy.tick_delay.grow();
    }

    /// Wait for the next finished worker (for the run loop's select).
    pub async fn next_finished(&mut self) -> Option<Done> {
        self.rx.recv().await
    }

    /// Keep a finished worker's result for the next recording.
    pub fn accept(&mut self, done: Done) {
        self.unrecorded.push(done);
    }

    /// Before the tick a finished worker calls for, on PostgreSQL (with a recorder): until
    /// every attempt in flight has finished, wait up to `GATHER_MAX` for more results. A
    /// tick's statements and commits, and the recorder's, cost the same for one result as
    /// for sixteen; under load a tick for each lone result paid them about twice per
    /// delivery. Waiting for half of those in flight for 1 ms made `pg 20000 1` 14 % faster,
    /// waiting for all of them for 2 ms 6 % more in pairs as built (a third fewer ticks,
    /// bench/README.md).
    /// Only attempts started in the last `GATHER_RECENT_S` count as in flight: a slow
    /// destination's (or a probe's) long attempts do not hold up the others' results. A
    /// lone attempt's result is recorded at once (it is all of them); nothing waits while
    /// a busy spool's backoff keeps the tick from recording, nor on SQLite, whose tick costs
    /// little (there a wait of 1 ms for half cost 12 %).
    pub async fn gather_results(&mut self) {
        if self.recorder.is_none() {
            return;
        }
        let now = Instant::now();
        if [self.busy.retry_at, self.busy.tick_at]
            .iter()
            .flatten()
            .any(|at| *at > now)
        {
            return;
        }
        let since = self.now_eff() - GATHER_RECENT_S;
        let recent = self.live.values().filter(|f| f.started_at >= since).count();
        let until = now + GATHER_MAX;
        while self.unrecorded.len() < recent {
            match tokio::time::timeout_at(until.into(), self.rx.recv()).await {
                Ok(Some(done)) => self.unrecorded.push(done),
                _ => return,
            }
        }
    }

    /// Record every result that has finished, in one transaction. A busy or full database
    /// keeps them all for a retry after a backoff (`Ok(0)`); only an error that is a bug
    /// (the spool refused a mark without emits) is returned.
    pub fn record_finished(&mut self) -> Result<usize, StoreError> {
        let dones = self.take_recordable();
        if dones.is_empty() {
            return Ok(0);
        }
        match self.record(&dones) {
            Ok(n) => {
                self.recording_backoff_ends();
                Ok(n)
            }
            Err(e) if e.is_weather() => {
                self.recording_refused(dones, &e);
                Ok(0)
            }
            Err(e) => Err(e),
        }
    }

    /// Every finished worker's result, unless a busy spool's backoff for recording them has
    /// not ended (then none: they stay in `unrecorded`).
    fn take_recordable(&mut self) -> Vec<Done> {
        while let Ok(done) = self.rx.try_recv() {
            self.unrecorded.push(done);
        }
        if self.busy.retry_at.is_some_and(|at| Instant::now() < at) {
            return Vec::new();
        }
        std::mem::take(&mut self.unrecorded)
    }

    /// Results were recorded: a busy spool's backoff for them is over.
    fn recording_backoff_ends(&mut self) {
        self.busy.retry_at = None;
        self.busy.delay.reset();
    }

    /// Wait until no worker is in flight, recording results, or until `bound` passes.
    pub async fn drain(&mut self, bound: Duration) -> Result<bool, StoreError> {
        let until = Instant::now() + bound;
        loop {
            self.record_finished()?;
            if self.live.is_empty() {
                return Ok(true);
            }
            let now = Instant::now();
            if now >= until {
                return Ok(false);
            }
            let wake = match self.busy.retry_at {
                Some(at) if !self.unrecorded.is_empty() => until.min(at.max(now)),
                _ => until,
            };
            if let Ok(Some(done)) = tokio::time::timeout_at(wake.into(), self.rx.recv()).await {
                self.unrecorded.push(done);
            }
        }
    }

    /// One tick (spec 5, 6.2, 6.3). Weather (a busy or full spool, `is_weather`) ends the
    /// tick early with that error and puts the ticks in a backoff, logged and counted;
    /// nothing is lost, a later tick carries on (ticks during the backoff are `deferred`).
    /// Any other error is returned for the caller to stop on.
    pub fn tick(&mut self) -> Result<TickReport, StoreError> {
        while self.workers.try_join_next().is_some() {}
        if self.busy.tick_at.is_some_and(|at| Instant::now() < at) {
            return Ok(TickReport {
                now_eff: self.now_eff(),
                deferred: true,
                ..Default::default()
            });
        }
        self.refused_in_tick = false;
        self.tick_again = false;
        match self.tick_writes() {
            Ok(rep) if self.refused_in_tick => Ok(rep),
            Ok(rep) => {
                if let Err(e) = self.tick_committed(rep.now_eff) {
                    if !e.is_weather() {
                        return Err(e);
                    }
                    self.defer_ticks(&e);
                }
                Ok(rep)
            }
            Err(e) if e.is_weather() => {
                self.defer_ticks(&e);
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    fn tick_writes(&mut self) -> Result<TickReport, StoreError> {
        self.disk_probe(self.now_eff())?;
        self.redue()?;
        let now = self.now_eff();
        let mut rep = TickReport {
            now_eff: now,
            ..Default::default()
        };
        super::polls::pass(&mut self.store, &self.cfg, now, &mut rand::random::<f64>)?;
        let dones = self.take_recordable();
        if self.recordable_beside(&dones) {
            self.record_beside_claims(dones, now, &mut rep)?;
        } else {
            self.record_and_claim(dones, now, &mut rep)?;
        }
        if now - self.last_maintenance >= MAINTENANCE_EVERY_S {
            self.maintenance(now)?;
        }
        if now - self.last_heartbeat >= self.cfg.dispatch.heartbeat_s {
            self.heartbeat(now)?;
            self.alert_pass(now);
        }
        rep.retention_steps = self.retention_steps(now)?;
        rep.retention_running = self.retention.is_some();
        Ok(rep)
    }

    /// Record `dones` and seal, recover and claim, all in the tick's one transaction.
    fn record_and_claim(
        &mut self,
        dones: Vec<Done>,
        now: f64,
        rep: &mut TickReport,
    ) -> Result<(), StoreError> {
        // Finished workers' results, sealing, lease recovery and the claims share one
        // transaction: one commit (one fsync) per tick, a batch the intake committed is
        // sealed and claimed in it, and a mark shares its pages with the claim of its
        // group's next batch. `claim_ready` (or `fast_tick`) commits it before any request
        // is made; a tick that claims nothing commits it here. Until it has committed, the results' issues
        // and log lines wait; if it does not, the results are kept to be recorded again.
        if let Err(e) = self.store.begin_tick() {
            self.unrecorded.extend(dones);
            return Err(e);
        }
        self.tick_txn_committed = false;
        let pending = match self.record_phase(&dones) {
            Ok(p) => p,
            Err(e) => {
                self.store.abandon_tick();
                self.unrecorded.extend(dones);
                return Err(e);
            }
        };
        rep.recorded = pending.len();
        let claimed = self
            .seal_recover_claim(now, rep, pending.is_empty())
            .and_then(|()| {
                if !pending.is_empty() && failpoint::error_once("tick.commit_busy") {
                    return Err(StoreError::Busy);
                }
                self.commit_tick_txn()
            });
        if self.tick_txn_committed {
            if !dones.is_empty() {
                self.recording_backoff_ends();
            }
            self.finish_recorded(&dones, pending)?;
        } else {
            self.store.abandon_tick();
            self.unrecord(pending);
            self.unrecorded.extend(dones);
        }
        claimed
    }

    /// Commit the tick's transaction unless this tick has (`claim_ready` or `fast_tick` may
    /// have), and note
    /// that it did: the results recorded in it are then durable.
    fn commit_tick_txn(&mut self) -> Result<(), StoreError> {
        if self.tick_txn_committed {
            return Ok(());
        }
        // An error when SQLite rolled the transaction back itself (`Store::commit_tick`).
        self.store.commit_tick()?;
        self.tick_txn_committed = true;
        Ok(())
    }

    /// Seal, recover expired leases when due, and claim, in the tick's transaction. On
    /// PostgreSQL, when the transaction holds nothing else (`alone`: no results recorded in
    /// it, no lease check due) and gates are known open (`fast_gates`), the seal and the
    /// claims of the walk's first heads go with the COMMIT in one round trip
    /// (`fast_tick`).
    fn seal_recover_claim(
        &mut self,
        now: f64,
        rep: &mut TickReport,
        alone: bool,
    ) -> Result<(), StoreError> {
        // `now` never goes back in one process (`now_eff`).
        let recover = now - self.last_lease_check >= LEASE_CHECK_EVERY_S;
        if alone
            && !recover
            && let Some(gates) = self.fast_gates(now)
        {
            return self.fast_tick(now, &gates, rep);
        }
        if !recover && self.live.len() < self.parallel() {
            // On PostgreSQL the claims' reads go with the seal's: when it seals nothing
            // they are the reads `claim_ready` makes, without round trips of their own.
            self.store
                .read_ahead_for_claims(now, self.candidates_first(), &self.gates_read)?;
        }
        rep.sealed = self.store.seal_ready(now)?.len();
        if recover {
            let live: Vec<String> = self
                .live
                .values()
                .map(|f| f.claim.lease_owner.clone())
                .chain(self.recording.iter().cloned())
                .collect();
            rep.recovered = self.store.recover_expired_leases(now, &live)?.len();
            self.last_lease_check = now;
        }
        rep.claimed = self.claim_ready(now)?;
        Ok(())
    }

    /// The gates a wake-up's tick may claim for without reading them (`Store::
    /// seal_and_claim_fast`), on PostgreSQL with a slot free, after a claim that left no
    /// head behind (`fast_next`): each destination whose row, as `choose` read it last
    /// (since the last reload), opens its gate now, with what `choose` would let it start
    /// (its free slots, its rate's tokens). `None` when there is none (the tick reads its
    /// gates as before).
    fn fast_gates(&mut self, now: f64) -> Option<Vec<FastGate>> {
        if !self.store.is_postgres() || !self.fast_next || self.live.len() >= self.parallel() {
            return None;
        }
        let free = self.parallel() - self.live.len();
        let id_prefix = crate::destinations::batch_delivery_id_prefix(&self.instance_id);
        let mut gates = Vec::new();
        let names: Vec<String> = self.gate_rows.keys().cloned().collect();
        for name in names {
            let mut row = self.gate_rows[&name].clone();
            let retry_after_until = row.retry_after_until;
            if breaker::gate(&mut row, now) != Gate::Open {
                continue;
            }
            let built = self.registry.get(&name);
            let slots = built
                .max_inflight
                .saturating_sub(self.inflight.get(&name).copied().unwrap_or(0));
            let tokens = self.tokens(&name, &built, now).unwrap_or(free);
            let cap = slots.min(tokens).min(free);
            if cap == 0 {
                continue;
            }
            gates.push(FastGate {
                destination: name,
                cap: cap as i64,
                lease_until: now + built.timeout_s + self.cfg.dispatch.lease_grace_s,
                id_prefix: id_prefix.clone(),
                per_attempt: built.idempotency() == Idempotency::PerAttempt,
                retry_after_until,
            });
        }
        (!gates.is_empty()).then_some(gates)
    }

    /// A wake-up's tick in one round trip (`Store::seal_and_claim_fast`): the seal, the
    /// claims of the walk's first heads for `gates` and the COMMIT; then the claims start.
    /// What it leaves (ready batches whose events must be hashed, heads it did not claim)
    /// a tick without it does, in a transaction of its own.
    fn fast_tick(
        &mut self,
        now: f64,
        gates: &[FastGate],
        rep: &mut TickReport,
    ) -> Result<(), StoreError> {
        let free = self.parallel() - self.live.len();
        let first = self.candidates_first();
        let fast = self
            .store
            .seal_and_claim_fast(now, first, gates, free, &self.owner_prefix);
        // Committed, or nothing of it was (rolled back, or still open for the caller to
        // roll back).
        self.tick_txn_committed = fast.is_ok();
        let fast = fast?;
        self.fast_next = !fast.more;
        rep.sealed = fast.sealed.len();
        let mut picks = Vec::with_capacity(fast.claims.len());
        let mut results = Vec::with_capacity(fast.claims.len());
        for (claim, destination) in fast.claims {
            *self.inflight.entry(destination.clone()).or_insert(0) += 1;
            let built = self.registry.get(&destination);
            picks.push(Pick {
                batch_id: claim.batch_id,
                idempotency: built.idempotency(),
                destination,
                built,
                probe: false,
                lease_until: claim.lease_until,
            });
            results.push(Some(claim));
        }
        let mut claimed = self.start_claims(picks, results, fast.read, now, None)?;
        if fast.reseal || (fast.more && self.live.len() < self.parallel()) {
            self.store.begin_tick()?;
            self.tick_txn_committed = false;
            if fast.reseal {
                rep.sealed += self.store.seal_ready(now)?.len();
            }
            claimed.extend(self.claim_ready(now)?);
        } else {
            // Nothing held: every head the walk found was claimed.
            self.rate_held(HashMap::new(), now);
        }
        rep.claimed = claimed;
        Ok(())
    }

    /// Start a retention pass when one is due, and run its steps for at most
    /// `RETENTION_TICK_BUDGET_MS`. Returns how many steps ran.
    fn retention_steps(&mut self, now: f64) -> Result<usize, StoreError> {
        if self.retention.is_none() && now - self.last_retention >= RETENTION_EVERY_S {
            self.retention = Some(PrunePass::new(now, &self.cfg.retention()));
            self.last_retention = now;
        }
        let Some(pass) = self.retention.as_mut() else {
            return Ok(0);
        };
        if Instant::now() < self.retention_next {
            return Ok(0);
        }
        let until = Instant::now() + Duration::from_millis(RETENTION_TICK_BUDGET_MS);
        self.retention_next = until + Duration::from_millis(crate::store::PRUNE_GAP_MS);
        let mut steps = 0;
        loop {
            steps += 1;
            if self.store.prune_step(pass)? {
                tracing::info!(
                    component = "dispatch",
                    "retention pass done: {} batches, {} events, {} attempts in {} transactions",
                    pass.report.batches,
                    pass.report.events,
                    pass.report.attempts,
                    pass.transactions
                );
                self.retention = None;
                return Ok(steps);
            }
            if Instant::now() >= until {
                return Ok(steps);
            }
        }
    }

    /// Phase 1 of `claim_ready`: the candidates chosen through their destinations' gates,
    /// in candidate order, up to `parallel` in flight; each pick is counted in `inflight`
    /// (`release_slot` gives it back).
    fn choose(
        &mut self,
        candidates: Vec<crate::store::Candidate>,
        parallel: usize,
        now: f64,
    ) -> Result<Choice, StoreError> {
        // The gate per destination, from the row as read now; a row the gate changes
        // (open -> half_open) is written back by `update_destination`, which reads it again.
        let mut gates: HashMap<String, (DestinationRow, Gate, bool)> = HashMap::new();
        // Candidates per destination, for the probe's rotation rule.
        let mut by_dest: HashMap<String, Vec<i64>> = HashMap::new();
        for c in &candidates {
            by_dest
                .entry(c.destination.clone())
                .or_default()
                .push(c.batch_id);
        }
        let mut picks: Vec<Pick> = Vec::new();
        let mut rows_changed: Vec<String> = Vec::new();
        let mut all_open = true;
        let mut held: HashMap<String, std::collections::BTreeSet<i64>> = HashMap::new();
        for c in candidates {
            if self.live.len() + picks.len() >= parallel {
                break;
            }
            if !gates.contains_key(&c.destination) {
                let mut row = self.store.destination(&c.destination)?;
                self.gate_rows.insert(c.destination.clone(), row.clone());
                if !self.gates_read.contains(&c.destination) {
                    self.gates_read.push(c.destination.clone());
                }
                let before = row.state;
                let g = breaker::gate(&mut row, now);
                if row.state != before {
                    rows_changed.push(c.destination.clone());
                }
                all_open &= g == Gate::Open;
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
                    // A probe is a request too: it waits for a token like any other.
                    if !self.rate_admits(&c.destination, &built, &picks, now) {
                        held.entry(c.destination.clone())
                            .or_default()
                            .insert(c.batch_id);
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
                    if !self.rate_admits(&c.destination, &built, &picks, now) {
                        held.entry(c.destination.clone())
                            .or_default()
                            .insert(c.batch_id);
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
        Ok(Choice {
            picks,
            rows_changed,
            all_open,
            held,
        })
    }

    /// Whether `destination`'s request rate lets one more attempt start now, beside the
    /// `picks` this choice already made (their tokens are taken when they start).
    fn rate_admits(&mut self, destination: &str, built: &Built, picks: &[Pick], now: f64) -> bool {
        let Some(tokens) = self.tokens(destination, built, now) else {
            return true;
        };
        let picked = picks
            .iter()
            .filter(|p| p.destination == destination)
            .count();
        tokens > picked
    }

    /// The attempts `destination`'s request rate lets start now (`None`: no limit).
    fn tokens(&mut self, destination: &str, built: &Built, now: f64) -> Option<usize> {
        if built.rate.is_none() && !self.rates.contains_key(destination) {
            return None;
        }
        let limiter = self.rates.entry(destination.to_string()).or_default();
        Some(limiter.bucket(built.rate, now)?.available(now) as usize)
    }

    /// After a choice: account each rate-limited destination's held batches (how long they
    /// waited), and note when the next token of one that holds batches is due.
    fn rate_held(&mut self, mut held: HashMap<String, std::collections::BTreeSet<i64>>, now: f64) {
        let mut wake: Option<f64> = None;
        for (name, limiter) in &mut self.rates {
            limiter.account(held.remove(name).unwrap_or_default(), now);
            if limiter.holding()
                && let Some(b) = limiter.current()
            {
                let at = b.next_at(now);
                wake = Some(wake.map_or(at, |w| w.min(at)));
            }
        }
        debug_assert!(held.is_empty(), "a held batch has a limiter: {held:?}");
        self.rate_wake_at = wake;
    }

    /// How many candidates `claim_ready` reads first (see there).
    fn candidates_first(&self) -> usize {
        let free = self.parallel().saturating_sub(self.live.len());
        (free * CANDIDATES_PER_FREE_SLOT).clamp(CANDIDATES_FIRST_MIN, CANDIDATES_PER_TICK_MAX)
    }

    fn claim_ready(&mut self, now: f64) -> Result<Vec<i64>, StoreError> {
        let parallel = self.parallel();
        if self.live.len() >= parallel {
            // No slot: a finished worker wakes the loop, not a token (the held batches'
            // wait goes on and is accounted by the next choice).
            self.rate_wake_at = None;
            return Ok(vec![]);
        }
        // The heads for the free slots first: the FIFO walk alone (`candidate_prefix`), the
        // start of the full list. When they might not fill the slots (more heads may follow
        // them), or a gate that is not open is among them (a probe rotates over all its
        // destination's heads), the slots counted for them go back and the full list is
        // chosen from instead: the short list is the start of the long one, so either way
        // the picks are those of the full list. On a backlog of few keys the walk finds
        // enough heads for the free slots among the first rows, and the tick skips the
        // group-by-group walk.
        let free = parallel - self.live.len();
        let first = self.candidates_first();
        // The rows this tick's gates read are the next tick's to read ahead; a tick that
        // reads none (no candidate: the tick that records a result, an idle one) keeps the
        // last tick's, so the tick a wake-up starts next still finds them read.
        let gates_before = std::mem::take(&mut self.gates_read);
        let CandidatePrefix {
            heads: short,
            exact,
        } = self.store.candidate_prefix(now, first)?;
        let more = !exact || (short.len() == first && first < CANDIDATES_PER_TICK_MAX);
        let mut offered = short.len();
        let mut choice = self.choose(short, parallel, now)?;
        if more && (choice.picks.len() < free || !choice.all_open) {
            for p in &choice.picks {
                self.release_slot(&p.destination);
            }
            let all = self.store.candidates(now, CANDIDATES_PER_TICK_MAX)?;
            offered = all.len();
            choice = self.choose(all, parallel, now)?;
        }
        // Every head there is was picked through open gates: the next wake-up may claim
        // without reading its gates first (`fast_gates`). Not while a head waits for a
        // gate, a slot or a token: that tick would claim nothing and read them anyway.
        self.fast_next = exact && choice.all_open && choice.picks.len() == offered;
        if self.gates_read.is_empty() {
            self.gates_read = gates_before;
        }
        let Choice {
            picks,
            mut rows_changed,
            held,
            ..
        } = choice;
        let mut claimed = Vec::new();
        let mut probes: HashMap<String, (i64, f64)> = HashMap::new();
        if !picks.is_empty() {
            // Phase 2: every claim of this tick in one transaction.
            let reqs: Vec<ClaimRequest> = picks
                .iter()
                .map(|p| ClaimRequest {
                    batch_id: p.batch_id,
                    lease_until: p.lease_until,
                    probe: p.probe,
                    delivery_id: p.idempotency.claim_id(&self.instance_id, p.batch_id),
                })
                .collect();
            // The tick's transaction (the seals before these claims too) commits here,
            // before any request.
            // On PostgreSQL the claims' statement and the COMMIT go in one write.
            let claimed_now = self
                .store
                .claim_many_and_commit_tick(&self.owner_prefix, now, &reqs);
            self.tick_txn_committed = claimed_now.is_ok();
            let crate::store::ClaimedMany {
                claims: results,
                read: fetched,
            } = match claimed_now {
                Ok(r) => r,
                Err(e) => {
                    // Nothing was claimed: give every slot back.
                    for p in &picks {
                        self.release_slot(&p.destination);
                    }
                    return Err(e);
                }
            };
            drop(reqs);
            claimed = self.start_claims(
                picks,
                results,
                fetched,
                now,
                Some((&mut probes, &mut rows_changed)),
            )?;
        }
        // After the starts took their tokens: the wake-up is for the next one.
        self.rate_held(held, now);
        rows_changed.sort();
        rows_changed.dedup();
        for name in rows_changed {
            let probe = probes.get(&name).copied();
            // Read again inside the writing transaction, so a pause committed since the
            // gate read is kept: the gate rule runs on the row as it is now.
            self.store.update_destination(&name, |fresh| {
                breaker::gate(fresh, now);
                if let Some((batch, lease_until)) = probe
                    && fresh.state == BreakerState::HalfOpen
                {
                    fresh.probe_until = Some(lease_until);
                    fresh.last_probe_batch_id = Some(batch);
                }
            })?;
        }
        Ok(claimed)
    }

    /// Phase 3 of a claim (`claim_ready`, `fast_tick`), the claims committed: start the won
    /// claims of `picks` (`results` follows them; `fetched` holds the batches the claims'
    /// statement read), noting each probe in `probes` (its destination's row to write, with
    /// the batch and its lease). Returns the batches started.
    fn start_claims(
        &mut self,
        picks: Vec<Pick>,
        results: Vec<Option<Claim>>,
        mut fetched: ClaimedReads,
        now: f64,
        mut probes: Option<Probes<'_>>,
    ) -> Result<Vec<i64>, StoreError> {
        if picks.is_empty() {
            return Ok(Vec::new());
        }
        // The claims are committed and no request is made yet (spec 12: a crash here is
        // recovered at the next start as an uncounted retry).
        failpoint::hit("deliver.after_claim");
        let mut claimed = Vec::new();
        // Phase 3: spawn the won claims; give back the slots of lost ones. A spawn
        // that fails (its reads) gives back its slot and those of the claims after
        // it; their leases are no live worker's, so a tick recovers them on expiry.
        let mut spawn_failed: Option<StoreError> = None;
        // The spawns' reads (each batch and its events) share one read transaction. If
        // it cannot be opened, each read takes its own, as it would anyway. Not on
        // PostgreSQL, where its BEGIN and COMMIT are two round trips more on every
        // delivery's path and it guards nothing: each claimed batch is leased to this
        // process (its row changes only by its mark) and its events are frozen.
        let reads = if self.store.is_postgres() {
            None
        } else {
            self.store.begin_reads().ok().flatten()
        };
        // Every won claim's batch and events: on PostgreSQL the claim's statement
        // returned them; on SQLite two statements read them all. If that read fails,
        // each spawn reads its own, as it did, and fails there.
        let unread: Vec<i64> = results
            .iter()
            .flatten()
            .map(|c| c.batch_id)
            .filter(|id| !fetched.contains_key(id))
            .collect();
        if !unread.is_empty() {
            fetched.extend(self.store.claimed_batches(&unread).unwrap_or_default());
        }
        for (p, won) in picks.into_iter().zip(results) {
            let Some(claim) = won else {
                self.release_slot(&p.destination);
                continue;
            };
            if spawn_failed.is_some() {
                self.release_slot(&p.destination);
                continue;
            }
            if p.probe
                && let Some((probes, rows_changed)) = probes.as_mut()
            {
                probes.insert(p.destination.clone(), (p.batch_id, p.lease_until));
                rows_changed.push(p.destination.clone());
            }
            let id = p
                .idempotency
                .id_for(&self.instance_id, p.batch_id, claim.attempt_id);
            let destination = p.destination.clone();
            // The attempt starts: its token is taken (`choose` picked no more than the
            // bucket held).
            if let Some(b) = self.rates.get_mut(&destination).and_then(|l| l.current()) {
                let took = b.take(now);
                debug_assert!(took, "{destination}: a pick without a token");
            }
            let read = fetched.remove(&claim.batch_id);
            match self.spawn(claim, read, p.built, p.destination, now, p.probe, id) {
                Ok(()) => claimed.push(p.batch_id),
                Err(e) => {
                    self.release_slot(&destination);
                    spawn_failed = Some(e);
                }
            }
        }
        if let Some(scope) = reads {
            self.store.end_reads(scope);
        }
        if let Some(e) = spawn_failed {
            return Err(e);
        }
        Ok(claimed)
    }

    fn release_slot(&mut self, destination: &str) {
        if let Some(n) = self.inflight.get_mut(destination) {
            *n = n.saturating_sub(1);
        }
    }

    /// A finished worker's result is being recorded: it leaves `live` and gives back its
    /// slot (`back_in_flight` undoes it when the recording does not commit).
    fn out_of_flight(&mut self, f: &InFlight) {
        self.live.remove(&f.claim.batch_id);
        self.release_slot(&f.destination);
    }

    /// A worker whose result was not recorded is live again with its slot.
    fn back_in_flight(&mut self, f: InFlight) {
        *self.inflight.entry(f.destination.clone()).or_insert(0) += 1;
        self.live.insert(f.claim.batch_id, f);
    }

    #[allow(clippy::too_many_arguments)]
    fn spawn(
        &mut self,
        claim: Claim,
        read: Option<(BatchRow, Vec<crate::store::CanonicalEvent>)>,
        built: Arc<Built>,
        destination: String,
        now: f64,
        probe: bool,
        delivery_id: String,
    ) -> Result<(), StoreError> {
        let (batch, frozen) = match read {
            Some(read) => read,
            None => (
                self.store.batch(claim.batch_id)?,
                self.store.frozen_events(claim.batch_id)?,
            ),
        };
        let left_s = (claim.lease_until - DEADLINE_MARGIN_S - now).max(0.0);
        let deadline = Instant::now() + Duration::from_secs_f64(left_s);
        let (attempt_n, attempt_id) = (claim.attempt_n, claim.attempt_id);
        let instance_id = self.instance_id.clone();
        let source_event_header = self
            .cfg
            .sources
            .get(&batch.source)
            .and_then(|s| s.event_header.clone());
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
        let script = matches!(built.target, Target::Script(_));
        // The attempt span (issue 35), a child of the batch span under the intake's span
        // when the batch's first event carries one; its traceparent goes on the request.
        let traceparent = if crate::telemetry::enabled() {
            let intake = self
                .store
                .batch_traceparent(batch_id)?
                .and_then(|t| crate::telemetry::parse_traceparent(&t));
            let parent = intake
                .as_ref()
                .map(|i| crate::telemetry::batch_context(i, batch_id));
            let span = crate::telemetry::start(
                "hookspool.attempt",
                opentelemetry::trace::SpanKind::Client,
                parent.as_ref(),
            );
            span.map(|mut s| {
                s.set("hookspool.batch_id", batch_id);
                s.set("hookspool.attempt", attempt_n);
                s.set("hookspool.route", batch.route.clone());
                s.set("hookspool.source", batch.source.clone());
                s.set("hookspool.destination", destination.clone());
                let tp = s.traceparent();
                self.spans.insert(batch_id, (s, intake));
                tp
            })
        } else {
            None
        };
        self.live.insert(
            batch_id,
            InFlight {
                claim,
                batch: batch.clone(),
                destination,
                started_at: now,
                probe,
                script,
            },
        );
        self.workers.spawn(async move {
            // The worker renders its document, on the runtime's threads: the engine thread
            // is what every slot waits for (its ticks record each result and refill each
            // slot), so it only reads what the claim needs. The events' payloads are moved
            // into the delivery, not copied.
            let body = match document::render(&batch, &frozen, &delivery_id, attempt_n) {
                Ok(body) => body,
                Err(unreadable) => {
                    // Never `null` in the event's place: the batch goes dead, loudly, and
                    // the operator excludes the event or drops the batch (issue 30).
                    tracing::error!(
                        component = "dispatch",
                        batch = batch_id,
                        event = unreadable.event_id,
                        "attempt failed: a stored payload is not JSON"
                    );
                    let _ = tx.send(Done {
                        batch_id,
                        outcome: Outcome::dead(Klass::Permanent, None, "stored payload unreadable")
                            .with_detail(&unreadable.to_string()),
                        duration: Duration::ZERO,
                    });
                    return;
                }
            };
            let delivery = Delivery {
                batch_id,
                attempt_n,
                attempt_id,
                instance_id,
                body,
                route: batch.route,
                event_type: frozen.last().map(|e| e.event_type.clone()),
                source_event_header,
                events: frozen
                    .into_iter()
                    .map(|e| UnwrapEvent {
                        id: e.id,
                        event_type: e.event_type,
                        dedup_id: e.dedup_id,
                        payload: e.payload.unwrap_or_default().into_bytes(),
                    })
                    .collect(),
                deadline,
                traceparent,
            };
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
            // The destination has answered (or the script exited) and nothing is recorded
            // yet (spec 12: a crash here delivers the batch again, at least once).
            match &built.target {
                Target::Script(_) => failpoint::hit("deliver.after_script_exit"),
                _ => failpoint::hit("deliver.after_response"),
            }
            // The engine may have stopped; its restart recovers the lease.
            let _ = tx.send(Done {
                batch_id,
                outcome,
                duration: started.elapsed(),
            });
        });
        Ok(())
    }
}
