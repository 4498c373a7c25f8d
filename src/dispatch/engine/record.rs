//! Recording finished workers' results (spec 6.2, 6.5, 11.4): the facts each verdict needs,
//! one `store::record_results` transaction that runs `verdict::decide` for every result
//! against the destination row as the transaction reads it, then the in-memory state, the
//! issues and the log line of each. Part of the engine (it owns the engine's state); must
//! not write anything but through the store's recording transaction and the issue calls.

use super::*;

/// The transport reason class of a delivery issue (spec 11.4).
fn transport_reason(script: bool, o: &Outcome) -> DeliveryReason {
    if script {
        DeliveryReason::ScriptExit
    } else if o.status.is_some_and(|s| (500..600).contains(&s)) {
        DeliveryReason::Http5xx
    } else if o.timed_out {
        DeliveryReason::Timeout
    } else {
        DeliveryReason::Unreachable
    }
}

/// One result written by `Engine::record_phase`, whose issues and log line wait for the
/// commit of the transaction that holds it.
pub(super) struct Pending {
    /// Its result's index in the `dones` it was recorded from.
    done: usize,
    /// Its attempt, with the batch as read at the claim (`InFlight::batch`).
    f: InFlight,
    rec: Recorded,
    v: Option<Verdict>,
}

/// One result to record, with the facts its verdict needs that are read before the
/// recording transaction.
struct Item<'d> {
    index: usize,
    done: &'d Done,
    f: InFlight,
    emits: Result<Vec<crate::store::EnqueueRequest>, String>,
    strikes: i64,
    throttles: i64,
    previous_bad_emit: bool,
    jitter01: f64,
}

/// The verdicts' inputs of `items` at `now`.
fn facts_of<'a>(items: &'a [Item<'_>], now: f64) -> Vec<Facts<'a>> {
    items
        .iter()
        .map(|i| Facts {
            outcome: &i.done.outcome,
            batch: &i.f.batch,
            attempt_id: i.f.claim.attempt_id,
            lease_owner: &i.f.claim.lease_owner,
            started_at: i.f.started_at,
            probe: i.f.probe,
            duration_ms: i.done.duration.as_millis() as i64,
            emits: i.emits.clone(),
            strikes: i.strikes,
            throttles: i.throttles,
            previous_bad_emit: i.previous_bad_emit,
            jitter01: i.jitter01,
            now,
        })
        .collect()
}

/// What `record_on` recorded: each result as written, its verdict, and the indexes of
/// the results whose success closed the breaker.
type RecordedOn = (Vec<Recorded>, Vec<Option<Verdict>>, Vec<usize>);

/// `store.record_results` for `items`: each result decided by `verdict::decide` against
/// its destination row as the transaction reads it; the verdicts, and the results whose
/// success closed the breaker. With `redue_in_tx` such a success makes the destination's
/// transport and throttle retries due in the same transaction (issue 28); without it
/// (the recorder's, beside claims that may hold those retry batches) the caller does, after
/// the claims' commit.
fn record_on(
    store: &mut Store,
    items: &[Item<'_>],
    now: f64,
    dispatch: &crate::config::Dispatch,
    redue_in_tx: bool,
) -> Result<RecordedOn, StoreError> {
    let names: Vec<&str> = items.iter().map(|i| i.f.destination.as_str()).collect();
    let facts = facts_of(items, now);
    let mut verdicts: Vec<Option<Verdict>> = vec![None; facts.len()];
    let recorded = store.record_results(&names, |i, row, refused| {
        let v = verdict::decide(&facts[i], row, refused, dispatch);
        let decision = Decision {
            report: v.report.clone(),
            recovered: redue_in_tx && v.effect == Effect::Closed,
        };
        verdicts[i] = Some(v);
        decision
    })?;
    // A success that closed the breaker proves the destination healthy: what waited on its
    // transport or throttle backoff is due now (issue 28), as config-class retries are
    // after a good reload. Read from the verdicts written, not from each call of `decide`:
    // the store may ask it more than once for a result (a refused emit, or results it
    // first tried to write at once).
    let closed = verdicts
        .iter()
        .enumerate()
        .filter(|(_, v)| v.as_ref().is_some_and(|v| v.effect == Effect::Closed))
        .map(|(i, _)| i)
        .collect();
    Ok((recorded, verdicts, closed))
}

/// The recorded results of `items`, waiting for their commit (`finish_recorded`).
fn pending_of(
    items: Vec<Item<'_>>,
    recorded: Vec<Recorded>,
    verdicts: Vec<Option<Verdict>>,
) -> Vec<Pending> {
    items
        .into_iter()
        .zip(recorded)
        .zip(verdicts)
        .map(|((item, rec), v)| Pending {
            done: item.index,
            f: item.f,
            rec,
            v,
        })
        .collect()
}

impl Engine {
    /// Record `dones` in one transaction of their own, then their issues and log lines.
    pub(super) fn record(&mut self, dones: &[Done]) -> Result<usize, StoreError> {
        let pending = self.record_phase(dones)?;
        let n = pending.len();
        self.finish_recorded(dones, pending)?;
        Ok(n)
    }

    /// Write `dones`' results: the facts each verdict needs are read first, then the store
    /// runs `verdict::decide` for each inside the transaction against the destination row
    /// as it reads it there (spec 6.2, 6.5). That is the caller's transaction when one is
    /// open (the tick's), else one of its own. Once written, the workers leave `live` and
    /// give back their slots (the tick's claims may use them); nothing else in memory
    /// changes until `finish_recorded`, after the commit. A transaction that does not
    /// commit is undone in memory by `unrecord`.
    pub(super) fn record_phase(&mut self, dones: &[Done]) -> Result<Vec<Pending>, StoreError> {
        let now = self.now_eff();
        let items = self.record_items(dones, now)?;
        if items.is_empty() {
            return Ok(Vec::new());
        }
        let dispatch = self.cfg.dispatch.clone();
        let (recorded, verdicts, _) = record_on(&mut self.store, &items, now, &dispatch, true)?;
        let pending = pending_of(items, recorded, verdicts);
        for p in &pending {
            self.out_of_flight(&p.f);
        }
        Ok(pending)
    }

    /// The facts of each result of `dones` that a worker of this process holds, read
    /// before its recording transaction (a result for a batch no worker holds is logged and
    /// left out).
    fn record_items<'d>(
        &mut self,
        dones: &'d [Done],
        now: f64,
    ) -> Result<Vec<Item<'d>>, StoreError> {
        let mut items = Vec::with_capacity(dones.len());
        for (index, done) in dones.iter().enumerate() {
            let Some(f) = self.live.get(&done.batch_id).cloned() else {
                tracing::error!(
                    component = "dispatch",
                    batch = done.batch_id,
                    "a result for a batch no worker of this process holds; ignored"
                );
                continue;
            };
            let o = &done.outcome;
            let batch = &f.batch;
            let strikes = match (o.kind, o.klass) {
                (OutcomeKind::Retry, Some(Klass::Transport)) => {
                    self.store
                        .poison_strikes(batch.id, &f.destination, f.started_at)?
                }
                _ => 0,
            };
            let throttles = match (o.kind, o.klass) {
                (OutcomeKind::Retry, Some(Klass::Throttle)) => {
                    self.store.consecutive_throttles(batch.id, f.started_at)?
                }
                _ => 0,
            };
            // A first attempt has no attempt before it (one statement less per delivery).
            let previous_bad_emit = f.claim.attempt_n > 1
                && self.store.previous_was_bad_emit(batch.id, f.started_at)?;
            let emits = emits::to_requests(&self.cfg, &o.emits, now).map_err(|e| e.to_string());
            items.push(Item {
                index,
                done,
                f,
                emits,
                strikes,
                throttles,
                previous_bad_emit,
                jitter01: self.jitter01(),
            });
        }
        Ok(items)
    }

    /// Whether `dones` may be recorded by the recorder's session while the tick's own
    /// session seals and claims (`record_beside_claims`): on a PostgreSQL spool, when each
    /// result is a success without emits of an attempt that was not a probe, and the
    /// recorder has not been refused by weather in the last `RECORDER_REST_S` (its session
    /// may be the one in trouble: the tick's own records meanwhile). Such a mark locks its
    /// batch (leased to this process) and its attempt row, and writes the destination row
    /// only as a success does (failures reset, `last_ok_at`, an open or half-open breaker
    /// closed), which leaves the claims' gates at most as closed as the row the claims read;
    /// the retries a closed breaker makes due are made due after the claims' commit.
    /// Failures (the breaker, the poison rule, Retry-After), probes and emits are recorded in
    /// the tick's transaction, before its claims, as on SQLite.
    pub(super) fn recordable_beside(&self, dones: &[Done]) -> bool {
        self.recorder.is_some()
            && self
                .recorder_rests_until
                .is_none_or(|t| Instant::now() >= t)
            && !dones.is_empty()
            && matches!(self.disk, DiskState::Writable)
            && dones.iter().all(|d| {
                d.outcome.kind == OutcomeKind::Ok
                    && d.outcome.emits.is_empty()
                    && self.live.get(&d.batch_id).is_some_and(|f| !f.probe)
            })
    }

    /// Record `dones` (`recordable_beside`) in a transaction of the recorder's session on
    /// a thread of its own, while this session's tick transaction (`record_and_claim`
    /// without results) seals, recovers leases and claims, with the slots the results
    /// free: two sessions at once instead of one after the other, each committing on its
    /// own. A recording refused by weather puts the
    /// workers back in `live` and keeps the results for the recording backoff, as a refused
    /// recording does; the claims already made with their slots stand, so until the
    /// results are recorded `live` (and a destination's in-flight count) may hold more than
    /// `parallel` (those workers have finished: no more requests are in flight).
    pub(super) fn record_beside_claims(
        &mut self,
        dones: Vec<Done>,
        now: f64,
        rep: &mut TickReport,
    ) -> Result<(), StoreError> {
        let items = match self.record_items(&dones, now) {
            Ok(items) => items,
            Err(e) => {
                self.unrecorded.extend(dones);
                return Err(e);
            }
        };
        let Some(mut recorder) = self.recorder.take() else {
            drop(items);
            self.unrecorded.extend(dones);
            return Err(StoreError::Invalid("no recorder session".into()));
        };
        // The slots are free for the claims; the leases stay this process's.
        for item in &items {
            self.out_of_flight(&item.f);
            self.recording.push(item.f.claim.lease_owner.clone());
        }
        let dispatch = self.cfg.dispatch.clone();
        let busy = failpoint::error_once("tick.commit_busy");
        let (recorded, claimed) = std::thread::scope(|s| {
            let recording = s.spawn(|| {
                if busy {
                    return Err(StoreError::Busy);
                }
                record_on(&mut recorder, &items, now, &dispatch, false)
            });
            let claimed = self.record_and_claim(Vec::new(), now, rep);
            (recording.join(), claimed)
        });
        self.recorder = Some(recorder);
        self.recording.clear();
        let recorded = match recorded {
            Ok(r) => r,
            Err(panic) => std::panic::resume_unwind(panic),
        };
        match recorded {
            Ok((mut recs, verdicts, recovered)) => {
                self.recording_backoff_ends();
                // The claims have committed: a closed breaker's retries are due now (in a
                // transaction of this session's, which takes the write lock as the claims'
                // did), or at the next tick if the spool is busy.
                for i in recovered {
                    if recs[i].result != MarkResult::Applied {
                        continue;
                    }
                    let name = items[i].f.destination.clone();
                    match self.store.redue_retries(Redue::Recovered(&name), now) {
                        Ok(n) => recs[i].redue = n,
                        Err(e) if e.is_weather() => self.recovered_pending.push(name),
                        Err(e) => return Err(e),
                    }
                }
                let pending = pending_of(items, recs, verdicts);
                rep.recorded = pending.len();
                // With every slot taken, the next result ticks anyway.
                self.tick_again = self.live.len() < self.parallel();
                self.finish_recorded(&dones, pending)?;
            }
            Err(e) => {
                for item in items {
                    self.back_in_flight(item.f);
                }
                if !e.is_weather() {
                    self.unrecorded.extend(dones);
                    return Err(e);
                }
                self.recorder_rests_until =
                    Some(Instant::now() + Duration::from_secs_f64(RECORDER_REST_S));
                self.recording_refused(dones, &e);
            }
        }
        claimed
    }

    /// Results the spool refused to record for weather: kept for a retry after the
    /// recording backoff, counted and logged.
    pub(super) fn recording_refused(&mut self, dones: Vec<Done>, e: &StoreError) {
        self.unrecorded.extend(dones);
        self.busy.retry_at =
            Some(Instant::now() + Duration::from_secs_f64(self.busy.delay.delay_s()));
        self.busy.delay.grow();
        self.note_busy(e, "recording results");
    }

    /// The results of `record_phase` are committed: their issues and log lines.
    pub(super) fn finish_recorded(
        &mut self,
        dones: &[Done],
        pending: Vec<Pending>,
    ) -> Result<(), StoreError> {
        let now = self.now_eff();
        for p in pending {
            let Some(v) = p.v else {
                continue;
            };
            self.after_record(&dones[p.done], &p.f, &p.f.batch, p.rec, v, now)?;
        }
        Ok(())
    }

    /// The transaction that held `record_phase`'s writes did not commit: the workers are
    /// live again with their slots, and their results wait to be recorded again.
    pub(super) fn unrecord(&mut self, pending: Vec<Pending>) {
        for p in pending {
            self.back_in_flight(p.f);
        }
    }

    /// Issues and the log line for one recorded result. An issue the database is too busy
    /// to take is logged and counted, never allowed to undo the committed result.
    fn after_record(
        &mut self,
        done: &Done,
        f: &InFlight,
        batch: &BatchRow,
        rec: Recorded,
        v: Verdict,
        now: f64,
    ) -> Result<(), StoreError> {
        let o = &done.outcome;
        let outcome = match rec.result {
            MarkResult::Discarded => AttemptOutcome::Discarded,
            MarkResult::Applied => match rec.report.mark {
                Mark::Delivered { .. } => AttemptOutcome::Ok,
                Mark::Retry { .. } => AttemptOutcome::Retry,
                Mark::Dead { .. } => AttemptOutcome::Dead,
            },
        };
        self.attempt_duration.observe(
            &[f.destination.as_str(), outcome.as_str()],
            done.duration.as_secs_f64(),
        );
        if outcome == AttemptOutcome::Ok {
            self.receive_to_delivered
                .observe(&[batch.route.as_str()], (now - batch.first_at).max(0.0));
        }
        self.end_spans(f, batch, o, outcome);
        match rec.result {
            MarkResult::Discarded => tracing::warn!(
                component = "dispatch",
                batch = batch.id,
                destination = %f.destination,
                attempt = f.claim.attempt_n,
                status = o.status.unwrap_or(0),
                reason = %o.reason,
                "result discarded: the worker had lost its lease, so nothing but its attempt row changed"
            ),
            MarkResult::Applied => {
                if let Some(why) = &rec.emits_refused {
                    tracing::warn!(component = "dispatch", batch = batch.id, destination = %f.destination, reason = %why, "the spool refused an emit; recorded as a bad emit");
                }
                tracing::info!(
                    component = "dispatch",
                    batch = batch.id,
                    destination = %f.destination,
                    attempt = f.claim.attempt_n,
                    status = rec.report.status.unwrap_or(0),
                    duration_ms = rec.report.duration_ms,
                    reason = %o.reason,
                    klass = v.rule.as_str(),
                    outcome = outcome.as_str(),
                    "attempt finished"
                );
                match v.effect {
                    Effect::Tripped | Effect::Retripped => {
                        tracing::warn!(component = "dispatch", destination = %f.destination, reason = %o.reason, "breaker open");
                    }
                    Effect::Closed => tracing::info!(
                        component = "dispatch",
                        destination = %f.destination,
                        "breaker closed: {} transport and throttle retries of the destination are due now",
                        rec.redue
                    ),
                    Effect::None => {}
                }
                if let Err(e) = self.record_issues(f, batch, o, &v, now) {
                    if !e.is_weather() {
                        return Err(e);
                    }
                    self.note_busy(&e, "recording an issue");
                }
            }
        }
        Ok(())
    }

    /// The attempt's span ends with its outcome; a final one (delivered, dead) also writes
    /// the batch span, from the batch's first event to now, under the intake's span, with
    /// the id its attempts named as their parent (issue 35).
    fn end_spans(&mut self, f: &InFlight, batch: &BatchRow, o: &Outcome, outcome: AttemptOutcome) {
        let Some((mut span, intake)) = self.spans.remove(&batch.id) else {
            return;
        };
        span.set("hookspool.outcome", outcome.as_str());
        if let Some(s) = o.status {
            span.set("http.response.status_code", s);
        }
        if let Some(k) = o.klass {
            span.set("hookspool.class", k.as_str());
        }
        if outcome != AttemptOutcome::Ok {
            span.error("attempt not delivered");
        }
        span.end();
        let (Some(intake), AttemptOutcome::Ok | AttemptOutcome::Dead) = (intake, outcome) else {
            return;
        };
        let first =
            std::time::UNIX_EPOCH + std::time::Duration::from_secs_f64(batch.first_at.max(0.0));
        if let Some(mut b) = crate::telemetry::start_at(
            "hookspool.batch",
            opentelemetry::trace::SpanKind::Internal,
            Some(&intake),
            Some(first),
            Some(crate::telemetry::batch_span_id(intake.trace_id(), batch.id)),
        ) {
            b.set("hookspool.batch_id", batch.id);
            b.set("hookspool.route", batch.route.clone());
            b.set("hookspool.source", batch.source.clone());
            b.set("hookspool.destination", f.destination.clone());
            b.set("hookspool.outcome", outcome.as_str());
            b.set("hookspool.attempts", f.claim.attempt_n);
            b.end();
        }
    }

    /// Issues for one applied result (spec 11.4): dead batches, breaker trips, counted
    /// streaks, config outcomes, long throttling and Hermes notices open or bump one; a
    /// success resolves the destination's transient ones.
    fn record_issues(
        &mut self,
        f: &InFlight,
        batch: &BatchRow,
        o: &Outcome,
        v: &Verdict,
        now: f64,
    ) -> Result<(), StoreError> {
        let store = &mut self.store;
        let dest = f.destination.as_str();
        let route = Some(batch.route.as_str());
        let reason = Some(o.reason.as_str());
        let failed = |store: &mut Store, r: DeliveryReason| {
            issues::delivery_failed(store, dest, route, r, Some(batch.id), reason, now).map(|_| ())
        };
        if v.rule != Rule::Throttle {
            match self.throttled_since.get_mut(dest) {
                Some(since) => *since = None,
                None => {
                    self.throttled_since.insert(dest.to_string(), None);
                }
            }
        }
        // Any rule but a plain success may open an issue below: the next success resolves.
        if v.rule != Rule::Delivered || o.notice.is_some() {
            self.resolved.remove(dest);
        }
        match v.rule {
            Rule::Delivered => {
                if !self.resolved.contains(dest) {
                    issues::attempt_succeeded(store, dest, now)?;
                    if o.notice.is_none() {
                        self.resolved.insert(dest.to_string());
                    }
                }
                if o.notice.is_some() {
                    issues::delivery_failed(
                        store,
                        dest,
                        route,
                        DeliveryReason::Ignored,
                        Some(batch.id),
                        o.notice.as_deref(),
                        now,
                    )?;
                }
            }
            Rule::Poison => failed(store, DeliveryReason::Poison)?,
            Rule::Exhausted => failed(store, DeliveryReason::Exhausted)?,
            Rule::Permanent => failed(store, DeliveryReason::Permanent)?,
            Rule::Transport => {
                if matches!(v.effect, Effect::Tripped | Effect::Retripped) {
                    failed(store, transport_reason(f.script, o))?;
                }
            }
            Rule::Config => {
                issues::delivery_config_failed(store, dest, route, Some(batch.id), reason, now)?;
            }
            Rule::Batch => {
                let counted = v.report.mark.counted(f.probe);
                if counted && batch.attempts + 1 >= COUNTED_STREAK_ISSUE {
                    let r = if f.script {
                        DeliveryReason::ScriptExit
                    } else {
                        DeliveryReason::Batch
                    };
                    failed(store, r)?;
                }
            }
            Rule::Throttle => {
                let since = match self.throttled_since.get_mut(dest) {
                    Some(Some(since)) => *since,
                    // Another answer ended the last run: this attempt starts a new one.
                    Some(entry @ None) => *entry.insert(f.started_at),
                    // The first answer this process sees: the run may have begun before it
                    // started, and a restart must not start the count again.
                    None => {
                        let since = store
                            .throttled_since(batch.id, dest, f.started_at)?
                            .unwrap_or(f.started_at);
                        self.throttled_since.insert(dest.to_string(), Some(since));
                        since
                    }
                };
                if now - since >= self.cfg.dispatch.throttle_alert_s {
                    let text = format!(
                        "only throttled answers for {:.0} s (dispatch.throttle_alert_s = {}); last: {}",
                        now - since,
                        self.cfg.dispatch.throttle_alert_s,
                        o.reason
                    );
                    issues::delivery_failed(
                        store,
                        dest,
                        route,
                        DeliveryReason::Throttled,
                        Some(batch.id),
                        Some(&text),
                        now,
                    )?;
                }
            }
        }
        Ok(())
    }
}
