//! The single writer thread: group commit (RUST-ADAPTATION "Performance design"), pipelined
//! with the WAL's sync.
//!
//! Owns: the intake's one read-write `Store` connection. Async handlers send classified
//! requests over a channel; the thread takes whatever has queued up (at most
//! `intake.group_events_max` requests, waiting at most `intake.group_wait_ms` to fill a
//! group), commits them with `Store::enqueue_many` (ONE transaction; a request that fails
//! leaves nothing behind and the others are kept), and hands the group's answers to the
//! syncer thread. It also answers the watchdog's health probe, /healthz and /metrics store
//! reads between groups, so a wedged writer shows up as missing WATCHDOG=1 pings and a 503
//! /healthz, and records a config reload's result in the config:file issue.
//!
//! Rejection counts (issue 31): the handlers count requests answered without storing them
//! in `metrics::Unstored`; every group transaction takes what is there with it
//! (`Store::enqueue_group`), and when no group has committed them for
//! `REJECTIONS_FLUSH_S` the writer stores them in a small transaction of their own. So a
//! flood of bad signatures costs at most one write every `REJECTIONS_FLUSH_S`, never one
//! per request; a crash loses at most that long of counts (they are figures, not events).
//!
//! Pipelined commit (issue 36; `intake.pipelined_sync = true`, off by default: on a
//! CPU-bound 2-core host it committed 0.81 - 0.92x of the serial group commit, smaller
//! groups costing more CPU per event than the overlap saved; bench/README.md). Off, COMMIT
//! syncs (synchronous = FULL) and the answers follow it on this thread. On, the connection
//! runs at `synchronous = NORMAL`
//! (`Store::defer_commit_sync`; `store::walsync` says what SQLite still syncs itself and
//! why a sync on our own descriptor of the WAL covers its writes): a COMMIT writes the
//! group's frames and returns without a sync. The syncer thread takes every group whose
//! COMMIT has returned, calls `fdatasync` on the WAL, and only when that returns Ok sends
//! their answers; meanwhile the writer runs the next group's statements and COMMIT. A group
//! handed over after the syncer took its batch waits for the next sync, so every answer
//! follows a sync that STARTED after its COMMIT returned, and that sync covers all of the
//! group's frames and every frame before them (the WAL is one file; recovery reads frames in
//! order up to the last valid commit frame). The order of events on the WAL:
//! - WAL restart after a checkpoint: the autocheckpoint runs inside a COMMIT (on this
//!   thread) and syncs the WAL before copying, then the database file before marking frames
//!   backfilled; the next COMMIT may then restart the WAL from its start, overwriting only
//!   frames already durable in the database file, after writing and syncing (SQLite itself,
//!   still at NORMAL) a header with new salts. A group committed into the new generation is
//!   answered after our sync as any other.
//! - The WAL is the same inode for the connection's life (this connection stays open and
//!   holds its SHARED lock; checked at the start and after every sync).
//! - A failed sync (or a failed sync of the writer's own writes): nothing of the groups
//!   waiting for it, and nothing committed later, is ever answered with success (a failed
//!   `fdatasync` may have dropped pages that later commit frames depend on). Every such
//!   request is answered `Failed` (503), the writer commits nothing more, and
//!   `WriterHandle::failed` resolves so the intake stops and is restarted (systemd, or
//!   `run`'s supervisor) on a fresh connection that recovers the WAL from the disk.
//! - The dispatcher is woken right after the COMMIT, before the sync: it may read and claim
//!   an event that is not yet durable, but its claim's COMMIT (synchronous = FULL on its own
//!   connection) syncs the same WAL, frames in order, so nothing it records or delivers
//!   outlives the event it came from; a delivery of an event lost to a power cut before its
//!   2xx is a duplicate for the sender's retry, which at-least-once allows.
//!
//! If the WAL's descriptor cannot be opened and checked, the connection stays at
//! `synchronous = FULL` and answers go out right after COMMIT, as before the pipeline.
//!
//! Invariants: a success reply is sent only after the COMMIT that holds its event returned
//! and, pipelined, after a sync of the WAL that began after that COMMIT returned (so no 2xx precedes its event's durability); a failed
//! COMMIT answers every request of its group with the error (nothing of that group was
//! kept); after a failed sync no reply is a success; the dispatcher is woken after a COMMIT
//! that queued something. Must not: log a payload, a header value or a key.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, oneshot};

use super::disk::DiskGuard;
use super::metrics::Unstored;
use crate::clock::SharedClock;
use crate::store::{EnqueueOutcome, EnqueueRequest, Store, StoreError, WalSync};
use crate::wake::Waker;

/// A failed COMMIT this recent still counts against health (`health`'s /healthz).
pub const RECENT_FAILURE_S: f64 = 30.0;

/// Writability is proven by a successful commit this recent, else by a tiny write at most
/// this often (spec 11.1).
pub const WRITABLE_PROOF_S: f64 = 30.0;
/// Rejection counts wait at most this long for a group transaction to take them before the
/// writer stores them on their own.
pub const REJECTIONS_FLUSH_S: u64 = 5;

/// How often the writer looks at the dispatcher's heartbeat on PostgreSQL (between groups,
/// and when idle: the idle wait is as long).
pub const DISPATCHER_CHECK_S: u64 = REJECTIONS_FLUSH_S;

/// Why a write did not happen. Carries no request data.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WriteError {
    /// SQLITE_BUSY past intake.busy_timeout_s.
    #[error("database is busy")]
    Busy,
    /// SQLITE_FULL or ENOSPC.
    #[error("no space left for the spool")]
    Full,
    /// The spool's PostgreSQL server cannot be reached now (down, restarting, cut off):
    /// weather, the store connects again on its own.
    #[error("the spool's database cannot be reached")]
    Unreachable,
    /// The writer's own check before the group: free space is under the request's
    /// `limits.min_free_bytes` (nothing was written).
    #[error("free space is under limits.min_free_bytes")]
    LowSpace,
    /// The store refused this one request (its savepoint was rolled back, the rest of the
    /// group committed): the handler quarantines it instead.
    #[error("refused by the store: {0}")]
    Invalid(String),
    /// Any other store failure; the message is the store's, which never holds request data.
    #[error("store failure: {0}")]
    Failed(String),
    /// The writer has stopped (shutdown).
    #[error("the writer has stopped")]
    Gone,
}

impl From<StoreError> for WriteError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Busy => WriteError::Busy,
            StoreError::Full => WriteError::Full,
            StoreError::PgUnreachable { .. } => WriteError::Unreachable,
            StoreError::Invalid(m) => WriteError::Invalid(m),
            other => WriteError::Failed(other.to_string()),
        }
    }
}

pub type WriteResult = Result<EnqueueOutcome, WriteError>;

/// What the writer knows for /healthz and /metrics.
#[derive(Debug, Clone, Default)]
pub struct HealthFacts {
    /// Batch counts per state (the /metrics fallback when the gauges cannot be computed).
    pub batches: Vec<(String, i64)>,
    /// Whether the spool took the last write we know of, and when that was proven.
    pub writable: bool,
    pub writable_checked_at: Option<f64>,
    /// The last failed COMMIT (or writability probe) and why, if any.
    pub last_failure: Option<(f64, WriteError)>,
    /// A store read failed; the figures above are partial.
    pub read_error: Option<String>,
    /// The spec 11.1 status document (the same one `hookspool status` prints), when asked.
    pub status: Option<serde_json::Value>,
    /// The dispatcher gauges of spec 11.2, computed from the tables, when asked.
    pub gauges: Option<String>,
}

/// What /healthz or /metrics wants the writer to compute from the tables.
#[derive(Clone)]
pub struct HealthAsk {
    pub snapshot: Arc<super::Snapshot>,
    /// Free space is under limits.min_free_bytes (known to the async side).
    pub disk_low: bool,
    pub status: bool,
    pub gauges: bool,
}

enum Job {
    Enqueue {
        req: Box<EnqueueRequest>,
        /// `limits.min_free_bytes` of the snapshot that served the request (0: no check).
        min_free_bytes: i64,
        reply: oneshot::Sender<WriteResult>,
    },
    Probe {
        reply: oneshot::Sender<()>,
    },
    Health {
        ask: Option<HealthAsk>,
        reply: oneshot::Sender<HealthFacts>,
    },
    /// A config reload's result, for the config:file issue (spec 12, 15).
    ConfigLoaded {
        problems: Option<String>,
        reply: oneshot::Sender<Result<(), WriteError>>,
    },
    Stop,
}

/// The `spool:<limit>` a group commit refused as busy opens.
const BUSY_LIMIT: &str = "busy";

/// One queued request: the request, its `min_free_bytes`, and where its answer goes.
type Pending = (Box<EnqueueRequest>, i64, oneshot::Sender<WriteResult>);

/// The bounds of one group.
#[derive(Debug, Clone, Copy)]
pub struct GroupBounds {
    pub events_max: usize,
    pub wait: Duration,
    /// `intake.pipelined_sync`: COMMIT does not sync, the syncer thread does (module doc).
    pub pipelined: bool,
}

/// Group commits that succeeded and the requests they stored, since the writer started
/// (/metrics: their ratio is the mean group size, what group commit buys on this disk).
#[derive(Debug, Default)]
pub struct GroupTotals {
    commits: AtomicU64,
    requests: AtomicU64,
}

impl GroupTotals {
    /// (commits, requests stored by them).
    pub fn get(&self) -> (u64, u64) {
        (
            self.commits.load(Ordering::Relaxed),
            self.requests.load(Ordering::Relaxed),
        )
    }

    fn add(&self, requests: u64) {
        self.commits.fetch_add(1, Ordering::Relaxed);
        self.requests.fetch_add(requests, Ordering::Relaxed);
    }
}

/// The async side's handle. Cloning is cheap.
#[derive(Clone)]
pub struct WriterHandle {
    tx: Sender<Job>,
    totals: Arc<GroupTotals>,
    durability: Arc<Durability>,
}

impl WriterHandle {
    /// Queue a request; resolves after the COMMIT that holds it (or its failure). The
    /// writer refuses it with `LowSpace`, before its group, when the spool's filesystem has
    /// less than `min_free_bytes` free (0 disables the check).
    pub async fn enqueue(&self, req: EnqueueRequest, min_free_bytes: i64) -> WriteResult {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Job::Enqueue {
                req: Box::new(req),
                min_free_bytes,
                reply,
            })
            .map_err(|_| WriteError::Gone)?;
        rx.await.unwrap_or(Err(WriteError::Gone))
    }

    /// Resolves when the writer has come round to answer: proof that it is not wedged.
    pub async fn probe(&self) -> bool {
        let (reply, rx) = oneshot::channel();
        if self.tx.send(Job::Probe { reply }).is_err() {
            return false;
        }
        rx.await.is_ok()
    }

    pub async fn health(&self) -> Option<HealthFacts> {
        self.health_with(None).await
    }

    /// Health facts plus, as asked, the status document and the table-derived gauges.
    pub async fn health_with(&self, ask: Option<HealthAsk>) -> Option<HealthFacts> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(Job::Health { ask, reply }).ok()?;
        rx.await.ok()
    }

    /// Record a config reload's result: `Some(problems)` opens (or counts) config:file,
    /// `None` resolves it. Resolves after the write (or its failure).
    pub async fn config_loaded(&self, problems: Option<String>) -> Result<(), WriteError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Job::ConfigLoaded { problems, reply })
            .map_err(|_| WriteError::Gone)?;
        rx.await.unwrap_or(Err(WriteError::Gone))
    }

    /// The group commits so far (read without asking the thread).
    pub fn group_totals(&self) -> (u64, u64) {
        self.totals.get()
    }

    /// Resolves when the WAL's sync has failed: the writer answers every request 503 from
    /// then on and the intake must stop (it is restarted on a fresh connection). Returns
    /// what failed.
    pub async fn failed(&self) -> String {
        loop {
            let notified = self.durability.fatal.notified();
            if let Some(e) = self.durability.failure() {
                return e.to_string();
            }
            notified.await;
        }
    }

    /// Ask the thread to finish what is queued and stop.
    pub fn stop(&self) {
        // A writer that is already gone needs no stop.
        let _ = self.tx.send(Job::Stop);
    }
}

/// Start the writer thread on `store`.
pub fn spawn(
    store: Store,
    heartbeat_s: f64,
    bounds: GroupBounds,
    disk: DiskGuard,
    waker: Arc<dyn Waker>,
    clock: SharedClock,
    rejections: Arc<Unstored>,
) -> std::io::Result<(WriterHandle, std::thread::JoinHandle<()>)> {
    let (tx, rx) = mpsc::channel();
    // A `spool:busy` an earlier intake opened and did not live to resolve (SIGKILL, a
    // crash) is this writer's: its first commit resolves it. (`spool:full` is the
    // dispatcher's to resolve after its alert pass, whoever opened it.)
    let inherited = store
        .issue_is_open(&format!("spool:{BUSY_LIMIT}"))
        .unwrap_or(false)
        .then_some(BUSY_LIMIT);
    let totals = Arc::new(GroupTotals::default());
    let durability = Arc::new(Durability::default());
    let mut store = store;
    let wal = match bounds.pipelined.then(|| store.defer_commit_sync()) {
        None => None,
        Some(Ok(wal)) => Some(Arc::new(wal)),
        Some(Err(e)) => {
            tracing::warn!(
                component = "intake",
                reason = %e,
                "the WAL's own sync is not available: every COMMIT syncs (synchronous=FULL), answers follow it"
            );
            None
        }
    };
    let pipelined = wal.is_some();
    // Only a PostgreSQL spool has dispatchers elsewhere for the intake to notice missing:
    // on SQLite the dispatcher is a unit of this host, restarted by systemd's watchdog.
    let dispatcher = store.is_postgres().then(|| DispatcherWatch {
        heartbeat_s,
        checked_at: Instant::now(),
    });
    let syncer = match &wal {
        Some(wal) => {
            let (d, wal) = (durability.clone(), wal.clone());
            let delay = fault::ack_before_sync();
            Some(
                std::thread::Builder::new()
                    .name("hookspool-sync".into())
                    .spawn(move || run_syncer(&d, &wal, delay))?,
            )
        }
        None => None,
    };
    let mut w = Writer {
        store,
        wal,
        syncer,
        durability: durability.clone(),
        ack_before_sync: fault::ack_before_sync().is_some(),
        rx,
        totals: totals.clone(),
        bounds: GroupBounds {
            events_max: bounds.events_max.max(1),
            wait: bounds.wait,
            pipelined,
        },
        disk,
        waker,
        clock,
        last_commit_ok_at: None,
        last_touch: None,
        last_failure: None,
        engaged_limit: inherited,
        fault: fault::Injector::from_env(),
        rejections,
        rejections_stored_at: Instant::now(),
        dispatcher,
    };
    let thread = std::thread::Builder::new()
        .name("hookspool-writer".into())
        .spawn(move || w.run())?;
    Ok((
        WriterHandle {
            tx,
            totals,
            durability,
        },
        thread,
    ))
}

struct Writer {
    store: Store,
    /// The WAL's sync when COMMIT does not sync (the pipeline); None: COMMIT syncs.
    wal: Option<Arc<WalSync>>,
    /// The thread that syncs the WAL and sends the answers of committed groups.
    syncer: Option<std::thread::JoinHandle<()>>,
    durability: Arc<Durability>,
    /// The planted fault (failpoints builds only): answer right after COMMIT.
    ack_before_sync: bool,
    rx: Receiver<Job>,
    totals: Arc<GroupTotals>,
    bounds: GroupBounds,
    /// The spool's filesystem, read before every group (`refuse_low_space`).
    disk: DiskGuard,
    waker: Arc<dyn Waker>,
    clock: SharedClock,
    last_commit_ok_at: Option<f64>,
    last_touch: Option<(f64, bool)>,
    last_failure: Option<(f64, WriteError)>,
    /// The spool limit issue this writer opened and has not yet seen cleared.
    engaged_limit: Option<&'static str>,
    fault: fault::Injector,
    /// The handlers' rejection counts not yet in the spool.
    rejections: Arc<Unstored>,
    /// When counts were last written (or found empty).
    rejections_stored_at: Instant,
    /// The dispatcher's heartbeat, watched on PostgreSQL (`watch_dispatcher`).
    dispatcher: Option<DispatcherWatch>,
}

/// The writer's look at the spool's dispatcher heartbeat (issue 33).
struct DispatcherWatch {
    /// `dispatch.heartbeat_s` of the config the intake started with.
    heartbeat_s: f64,
    checked_at: Instant,
}

impl Writer {
    fn run(&mut self) {
        self.run_groups();
        // Every group handed over is synced and answered before the thread ends.
        self.durability.stop();
        if let Some(t) = self.syncer.take()
            && t.join().is_err()
        {
            tracing::error!(component = "intake", "the WAL's sync thread panicked");
        }
    }

    fn run_groups(&mut self) {
        let mut group: Vec<Pending> = Vec::new();
        let mut others: Vec<Job> = Vec::new();
        let flush = Duration::from_secs(REJECTIONS_FLUSH_S);
        loop {
            let first = match self.rx.recv_timeout(flush) {
                Ok(job) => job,
                Err(RecvTimeoutError::Timeout) => {
                    self.store_rejections(false);
                    self.watch_dispatcher();
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => {
                    self.store_rejections(true);
                    return; // every handle dropped
                }
            };
            let mut stop = false;
            self.sort(first, &mut group, &mut others, &mut stop);
            // Take what is already queued, then (when configured) wait a little for more.
            let deadline = Instant::now() + self.bounds.wait;
            while !stop && group.len() < self.bounds.events_max {
                let next = match self.rx.try_recv() {
                    Ok(j) => Some(j),
                    Err(TryRecvError::Disconnected) => None,
                    Err(TryRecvError::Empty) => {
                        let left = deadline.saturating_duration_since(Instant::now());
                        if group.is_empty() || left.is_zero() {
                            None
                        } else {
                            match self.rx.recv_timeout(left) {
                                Ok(j) => Some(j),
                                Err(RecvTimeoutError::Timeout)
                                | Err(RecvTimeoutError::Disconnected) => None,
                            }
                        }
                    }
                };
                match next {
                    Some(j) => self.sort(j, &mut group, &mut others, &mut stop),
                    None => break,
                }
            }
            if !group.is_empty() {
                self.commit(std::mem::take(&mut group));
            }
            for job in others.drain(..) {
                self.answer(job);
            }
            // Between groups, and when only other jobs (health, probes) come in.
            self.store_rejections(false);
            self.watch_dispatcher();
            if stop {
                // Finish whatever was queued before the stop, then end.
                while let Ok(job) = self.rx.try_recv() {
                    match job {
                        Job::Enqueue {
                            req,
                            min_free_bytes,
                            reply,
                        } => self.commit(vec![(req, min_free_bytes, reply)]),
                        other => self.answer(other),
                    }
                }
                self.store_rejections(true);
                return;
            }
        }
    }

    fn sort(&self, job: Job, group: &mut Vec<Pending>, others: &mut Vec<Job>, stop: &mut bool) {
        match job {
            Job::Enqueue {
                req,
                min_free_bytes,
                reply,
            } => group.push((req, min_free_bytes, reply)),
            Job::Stop => *stop = true,
            other => others.push(other),
        }
    }

    /// The free-space check of spec 9, read now for this group:
    /// a request is answered `LowSpace` when the space left, less what the requests before
    /// it in the group hold, is under its `min_free_bytes`. The rest go on to the commit.
    fn refuse_low_space(&mut self, group: Vec<Pending>) -> Vec<Pending> {
        if group.iter().all(|(_, min, _)| *min <= 0) {
            return group;
        }
        let Some(free) = self.disk.free_bytes_now() else {
            return group; // statvfs failed: the write itself reports ENOSPC
        };
        let mut left = free;
        let mut keep = Vec::with_capacity(group.len());
        let mut refused = 0usize;
        for (req, min, reply) in group {
            if min > 0 && left < min as u64 {
                refused += 1;
                let _ = reply.send(Err(WriteError::LowSpace));
                continue;
            }
            left = left.saturating_sub(request_bytes(&req));
            keep.push((req, min, reply));
        }
        if refused > 0 {
            // The dispatcher's maintenance tick opens and resolves spool:min_free_bytes; the
            // writer only refuses, and writes nothing on a filling disk.
            tracing::warn!(
                component = "intake",
                "free space on the spool's filesystem is {free} bytes, under limits.min_free_bytes: {refused} request(s) of this group answered 503"
            );
        }
        keep
    }

    fn commit(&mut self, group: Vec<Pending>) {
        if let Some(e) = self.durability.failure() {
            // The WAL's sync failed: nothing more is written or acknowledged.
            for (_, _, reply) in group {
                let _ = reply.send(Err(e.clone()));
            }
            return;
        }
        let group = self.refuse_low_space(group);
        if group.is_empty() {
            return;
        }
        let (reqs, replies): (Vec<EnqueueRequest>, Vec<_>) =
            group.into_iter().map(|(r, _, tx)| (*r, tx)).unzip();
        let rejections = self.rejections.take();
        let result = match self.fault.check() {
            Some(e) => Err(e),
            None => self.store.enqueue_group(&reqs, &rejections),
        };
        let now = self.clock.now();
        match result {
            Ok(outcomes) => {
                self.rejections_stored_at = Instant::now();
                self.last_commit_ok_at = Some(now);
                self.totals
                    .add(outcomes.iter().filter(|o| o.is_ok()).count() as u64);
                // Wake first: the dispatcher can start while the answers go out.
                if outcomes.iter().any(|o| {
                    matches!(
                        o,
                        Ok(EnqueueOutcome::Queued { .. }) | Ok(EnqueueOutcome::Replayed { .. })
                    )
                }) {
                    self.waker.wake();
                }
                let mut quarantined = Vec::new();
                let mut answers = Vec::with_capacity(replies.len());
                for ((outcome, reply), req) in outcomes.into_iter().zip(replies).zip(&reqs) {
                    if let (Ok(EnqueueOutcome::Quarantined { batch_id, .. }), Some(q)) =
                        (&outcome, &req.quarantine)
                    {
                        quarantined.push((req.source.clone(), *batch_id, q.error_class.clone()));
                    }
                    answers.push((reply, outcome.map_err(WriteError::from)));
                }
                self.answer_after_sync(answers);
                // Issues after the answers are handed over, so no sender waits on them
                // (spec 11.4); the syncer's next sync covers them too.
                let wrote = !quarantined.is_empty() || self.engaged_limit.is_some();
                self.after_commit(quarantined, now);
                if wrote {
                    self.durability.ask_sync();
                }
            }
            Err(e) => {
                self.rejections.restore(rejections);
                let e = WriteError::from(e);
                tracing::warn!(
                    component = "intake",
                    reason = %e,
                    "group commit failed; every request in it is answered 503"
                );
                self.last_failure = Some((now, e.clone()));
                self.limit_changed(&e, true, now);
                for reply in replies {
                    let _ = reply.send(Err(e.clone()));
                }
            }
        }
    }

    /// Store the rejection counts no group has taken, in a transaction of their own: when
    /// `REJECTIONS_FLUSH_S` has passed since the last write that held them, or at the end
    /// (`last`). Counts a write could not store (a busy or full spool) wait for the next.
    fn store_rejections(&mut self, last: bool) {
        if !last && self.rejections_stored_at.elapsed() < Duration::from_secs(REJECTIONS_FLUSH_S) {
            return;
        }
        self.rejections_stored_at = Instant::now();
        if self.durability.failure().is_some() {
            return; // the WAL's sync failed: nothing more is written
        }
        let counts = self.rejections.take();
        if counts.is_empty() {
            return;
        }
        let stored = match self.fault.check() {
            Some(e) => Err(e),
            None => self.store.add_rejections(&counts),
        };
        match stored {
            // Pipelined, COMMIT did not sync: the syncer's next sync covers these.
            Ok(()) => self.durability.ask_sync(),
            Err(e) => {
                self.rejections.restore(counts);
                tracing::warn!(
                    component = "intake",
                    reason = %WriteError::from(e),
                    "the rejection counts were not stored; they wait for the next write"
                );
            }
        }
    }

    /// On PostgreSQL, every `DISPATCHER_CHECK_S`: when no dispatcher has written its
    /// heartbeat for `issues::DISPATCHER_INACTIVE_HEARTBEATS` heartbeats (every dispatch
    /// host is down, or the active one hangs), open `spool:no_active_dispatcher` unless it
    /// is open (`issues::check_dispatcher_heartbeat`); the next active dispatcher's
    /// heartbeat resolves it. Best effort, as the other issues the writer opens: a failed
    /// read or write is logged and tried at the next check.
    fn watch_dispatcher(&mut self) {
        let Some(w) = self.dispatcher.as_mut() else {
            return;
        };
        if w.checked_at.elapsed() < Duration::from_secs(DISPATCHER_CHECK_S) {
            return;
        }
        w.checked_at = Instant::now();
        if self.durability.failure().is_some() {
            return; // the WAL's sync failed: nothing more is written
        }
        let now = self.clock.now();
        if let Err(e) =
            crate::observe::issues::check_dispatcher_heartbeat(&mut self.store, w.heartbeat_s, now)
        {
            tracing::warn!(
                component = "intake",
                reason = %WriteError::from(e),
                "could not check the dispatcher's heartbeat"
            );
        }
    }

    /// Send a committed group's answers: after the syncer's next sync (the pipeline), or now
    /// when COMMIT itself synced. A handler that stopped waiting (client gone) needs no
    /// answer; its event is committed either way.
    fn answer_after_sync(&mut self, answers: Vec<Answer>) {
        if self.wal.is_none() || self.ack_before_sync {
            // COMMIT synced (no pipeline), or the planted fault: answer now. The fault still
            // asks for the sync, which comes late (`fault::ack_before_sync`).
            if self.ack_before_sync {
                self.durability.ask_sync();
            }
            send_all(answers);
            return;
        }
        self.durability.hand_over(answers);
    }

    /// Make a write of the writer's own durable before anything relies on it (the
    /// writability proof, a config reload's issue). A failed sync fails the writer as the
    /// syncer's would.
    fn sync_own_write(&mut self) -> Result<(), WriteError> {
        let Some(wal) = &self.wal else {
            return Ok(()); // COMMIT synced
        };
        match wal.sync() {
            Ok(()) => Ok(()),
            Err(e) => Err(self.durability.fail(&e)),
        }
    }

    /// Open the config:plugin issue per quarantined request, and clear a spool limit that a
    /// successful commit proves gone. An issue that cannot be written is logged, never
    /// allowed to fail the intake: the events are already committed and answered.
    fn after_commit(&mut self, quarantined: Vec<(String, i64, String)>, now: f64) {
        for (source, batch_id, class) in quarantined {
            if let Err(e) =
                crate::observe::issues::quarantined(&mut self.store, &source, batch_id, &class, now)
            {
                tracing::warn!(component = "intake", source = %source, reason = %e, "could not open the quarantine issue");
            }
        }
        if let Some(limit) = self.engaged_limit.take()
            && let Err(e) =
                crate::observe::issues::spool_limit(&mut self.store, limit, false, None, now)
        {
            tracing::warn!(component = "intake", reason = %e, "could not resolve the spool issue");
            self.engaged_limit = Some(limit);
        }
    }

    /// A failed commit engages a spool limit issue (spec 11.4: spool:<limit>); best effort,
    /// since the database may be the very thing that is full.
    fn limit_changed(&mut self, e: &WriteError, engaged: bool, now: f64) {
        let limit = match e {
            WriteError::Full => "full",
            WriteError::Busy => BUSY_LIMIT,
            _ => return,
        };
        if crate::observe::issues::spool_limit(
            &mut self.store,
            limit,
            engaged,
            Some("a commit failed"),
            now,
        )
        .is_ok()
        {
            self.engaged_limit = Some(limit);
        }
    }

    fn answer(&mut self, job: Job) {
        match job {
            Job::Probe { reply } => {
                let _ = reply.send(());
            }
            Job::Health { ask, reply } => {
                let mut facts = self.health();
                if let Some(ask) = ask {
                    self.observe(&ask, &mut facts);
                }
                let _ = reply.send(facts);
            }
            Job::ConfigLoaded { problems, reply } => {
                let now = self.clock.now();
                let r = match self.durability.failure() {
                    Some(e) => Err(e),
                    None => crate::observe::issues::config_reload(
                        &mut self.store,
                        problems.as_deref().map_or(Ok(()), Err),
                        now,
                    )
                    .map_err(WriteError::from)
                    .and_then(|()| self.sync_own_write()),
                };
                let _ = reply.send(r);
            }
            Job::Enqueue {
                req,
                min_free_bytes,
                reply,
            } => self.commit(vec![(req, min_free_bytes, reply)]),
            Job::Stop => {}
        }
    }

    /// The observe module's view, computed here because only this thread reads the store.
    fn observe(&mut self, ask: &HealthAsk, f: &mut HealthFacts) {
        let now = self.clock.now();
        let cfg = &ask.snapshot.config;
        if ask.status {
            let mut probe = crate::observe::status::Probe::default();
            if !f.writable {
                probe.unwritable = Some("the spool did not take the last write".into());
            }
            if ask.disk_low {
                probe.limits.push("min_free_bytes".into());
            }
            if let Some((at, WriteError::Full)) = &f.last_failure
                && now - at <= RECENT_FAILURE_S
            {
                probe.limits.push("spool_full".into());
            }
            match crate::observe::status::collect_with(&self.store, cfg, now, &probe) {
                Ok(doc) => f.status = Some(doc),
                Err(e) => f.read_error = Some(e.to_string()),
            }
        }
        if ask.gauges {
            match crate::observe::metrics::render_gauges(&self.store, cfg, now) {
                Ok(text) => f.gauges = Some(text),
                Err(e) => f.read_error = Some(e.to_string()),
            }
        }
    }

    fn health(&mut self) -> HealthFacts {
        let now = self.clock.now();
        let mut f = HealthFacts::default();
        match self.store.batch_counts() {
            Ok(b) => f.batches = b.into_iter().map(|(s, n)| (s.to_string(), n)).collect(),
            Err(e) => f.read_error = Some(e.to_string()),
        }
        // Writability: a recent commit proves it; otherwise one tiny write, at most every
        // WRITABLE_PROOF_S, so scrapes never force an fsync each.
        match self.last_commit_ok_at {
            Some(t) if now - t <= WRITABLE_PROOF_S => {
                f.writable = true;
                f.writable_checked_at = Some(t);
            }
            _ => {
                let due = self
                    .last_touch
                    .is_none_or(|(t, _)| now - t > WRITABLE_PROOF_S || now < t);
                if due {
                    let r = match (self.durability.failure(), self.fault.check()) {
                        (Some(e), _) => Err(e),
                        (None, Some(e)) => Err(WriteError::from(e)),
                        (None, None) => self
                            .store
                            .touch_writable(now)
                            .map_err(|e| WriteError::from(clone_kind(&e)))
                            .and_then(|()| self.sync_own_write()),
                    };
                    if let Err(e) = &r {
                        self.last_failure = Some((now, e.clone()));
                    }
                    self.last_touch = Some((now, r.is_ok()));
                }
                let (t, ok) = self.last_touch.unwrap_or((now, false));
                f.writable = ok;
                f.writable_checked_at = Some(t);
            }
        }
        if let Some(e) = self.durability.failure() {
            f.writable = false;
            f.last_failure = Some((now, e));
        } else {
            f.last_failure = self.last_failure.clone();
        }
        f
    }
}

/// One request's answer, waiting for the sync that makes its group durable.
type Answer = (oneshot::Sender<WriteResult>, WriteResult);

fn send_all(answers: Vec<Answer>) {
    for (reply, result) in answers {
        // A handler that stopped waiting (client gone) needs no answer.
        let _ = reply.send(result);
    }
}

/// What the writer hands the syncer, and the syncer's verdict.
#[derive(Default)]
struct Durability {
    queue: Mutex<SyncQueue>,
    ready: Condvar,
    /// Notified once, when a sync fails.
    fatal: Notify,
}

#[derive(Default)]
struct SyncQueue {
    /// Answers of groups whose COMMIT has returned, oldest first.
    waiting: Vec<Answer>,
    /// A sync is wanted with nothing to answer (writes of the writer's own, issues).
    dirty: bool,
    stop: bool,
    /// The first failed sync: from then on nothing is answered with success.
    failed: Option<WriteError>,
}

impl Durability {
    fn lock(&self) -> MutexGuard<'_, SyncQueue> {
        // A panic while holding the lock leaves plain data behind; keep going with it.
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn failure(&self) -> Option<WriteError> {
        self.lock().failed.clone()
    }

    /// A committed group's answers, to be sent after the next sync that starts from now.
    fn hand_over(&self, answers: Vec<Answer>) {
        let mut q = self.lock();
        if let Some(e) = q.failed.clone() {
            drop(q);
            send_all(
                answers
                    .into_iter()
                    .map(|(r, _)| (r, Err(e.clone())))
                    .collect(),
            );
            return;
        }
        q.waiting.extend(answers);
        drop(q);
        self.ready.notify_one();
    }

    fn ask_sync(&self) {
        self.lock().dirty = true;
        self.ready.notify_one();
    }

    fn stop(&self) {
        self.lock().stop = true;
        self.ready.notify_one();
    }

    /// Record a failed sync: every answer still waiting becomes the failure, and the intake
    /// is told to stop. Returns the failure.
    fn fail(&self, e: &StoreError) -> WriteError {
        let err = WriteError::Failed(format!("the WAL's sync failed: {e}"));
        let mut q = self.lock();
        if q.failed.is_none() {
            tracing::error!(
                component = "intake",
                reason = %e,
                "the WAL's fdatasync failed: nothing committed since the last good sync is acknowledged; the intake stops"
            );
            q.failed = Some(err.clone());
        }
        let waiting = std::mem::take(&mut q.waiting);
        drop(q);
        send_all(
            waiting
                .into_iter()
                .map(|(r, _)| (r, Err(err.clone())))
                .collect(),
        );
        self.fatal.notify_one();
        err
    }
}

/// The syncer thread: take every answer handed over so far, sync the WAL, send them.
/// Ends when the writer stops (after answering what it was handed) or after a failed sync
/// (later hand-overs are answered with the failure by `hand_over`).
fn run_syncer(d: &Durability, wal: &WalSync, delay: Option<Duration>) {
    loop {
        let batch = {
            let mut q = d.lock();
            while q.waiting.is_empty() && !q.dirty && !q.stop {
                q = d.ready.wait(q).unwrap_or_else(|p| p.into_inner());
            }
            if q.waiting.is_empty() && !q.dirty {
                return; // stopped, nothing left
            }
            q.dirty = false;
            std::mem::take(&mut q.waiting)
        };
        if let Some(delay) = delay {
            std::thread::sleep(delay);
        }
        let synced = if crate::failpoint::error_once("intake.wal_sync_fails") {
            Err(StoreError::Io {
                context: format!("fdatasync of {}", wal.path().display()),
                source: std::io::Error::from_raw_os_error(nix::libc::EIO),
            })
        } else {
            wal.sync()
        };
        match synced {
            Ok(()) => send_all(batch),
            Err(e) => {
                let err = d.fail(&e);
                send_all(
                    batch
                        .into_iter()
                        .map(|(r, _)| (r, Err(err.clone())))
                        .collect(),
                );
                return;
            }
        }
    }
}

/// A StoreError's kind without its payload (StoreError is not Clone).
/// What one request may take on disk, counted against the free space left in its group:
/// its bytes twice (the table's page and the WAL's copy of it) and a page of overhead.
fn request_bytes(req: &EnqueueRequest) -> u64 {
    let body = req.payload.as_ref().map_or(0, String::len) + req.raw.as_ref().map_or(0, Vec::len);
    (2 * (body + req.headers.len()) + REQUEST_PAGE_BYTES) as u64
}

/// The page overhead `request_bytes` adds for each request (SQLite's default page size).
const REQUEST_PAGE_BYTES: usize = 4096;

fn clone_kind(e: &StoreError) -> StoreError {
    match e {
        StoreError::Busy => StoreError::Busy,
        StoreError::Full => StoreError::Full,
        other => StoreError::Invalid(other.to_string()),
    }
}

/// The ENOSPC seam (Litestream's habit: a way to inject a full disk in tests). Compiled in
/// only with the `failpoints` feature: while the file named by `HOOKSPOOL_INJECT_FULL`
/// exists, every group commit and writability probe fails with `StoreError::Full` before
/// SQLite is touched, exactly as a real ENOSPC reaches the writer.
mod fault {
    use crate::store::StoreError;

    /// The planted fault of the power-loss harness (`failpoints` builds only): with
    /// `HOOKSPOOL_TEST_ACK_BEFORE_SYNC_MS=<ms>` the writer answers right after COMMIT, and
    /// the syncer waits that long before each sync (a slow disk), so answers go out before
    /// the sync that covers them: the harness must report lost acknowledged events.
    pub fn ack_before_sync() -> Option<std::time::Duration> {
        #[cfg(feature = "failpoints")]
        if let Some(ms) = std::env::var("HOOKSPOOL_TEST_ACK_BEFORE_SYNC_MS")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
        {
            return Some(std::time::Duration::from_millis(ms));
        }
        None
    }

    pub struct Injector {
        #[cfg(feature = "failpoints")]
        path: Option<std::path::PathBuf>,
    }

    impl Injector {
        pub fn from_env() -> Self {
            Injector {
                #[cfg(feature = "failpoints")]
                path: std::env::var_os("HOOKSPOOL_INJECT_FULL").map(std::path::PathBuf::from),
            }
        }

        pub fn check(&self) -> Option<StoreError> {
            #[cfg(feature = "failpoints")]
            if let Some(p) = &self.path
                && p.exists()
            {
                return Some(StoreError::Full);
            }
            None
        }
    }
}
