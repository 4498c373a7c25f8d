//! Unit tests for every store transition (spec 4-9), on a real SQLite file.

use super::testutil::temp_store;
use super::*;
use crate::vocab::{AttemptOutcome, BatchState, Klass};

pub(crate) fn window(quiet_s: f64, max_s: f64, max_events: i64, max_bytes: i64) -> Window {
    Window {
        quiet_s,
        max_s,
        max_events,
        max_bytes,
    }
}

pub(crate) fn req(route: &str, key: &str, payload: &str, now: f64) -> EnqueueRequest {
    EnqueueRequest {
        source: "src".into(),
        key: key.into(),
        event_type: "t".into(),
        dedup_id: None,
        dedup_window_s: 86_400.0,
        payload: Some(payload.into()),
        raw: None,
        headers: "{}".into(),
        primary: Copy {
            route: route.into(),
            destination: format!("http:{route}"),
            window: window(10.0, 60.0, 500, 786_432),
        },
        tees: vec![],
        quarantine: None,
        now,
    }
}

impl Store {
    /// The dedup row for (source, dedup_id): (event_id, seen_at, dup_count).
    fn dedup_row(&self, source: &str, dedup_id: &str) -> Result<Option<(i64, f64, i64)>> {
        use rusqlite::OptionalExtension;
        Ok(self
            .conn
            .query_row(
                "SELECT event_id, seen_at, dup_count FROM dedup WHERE source = ?1 AND dedup_id = ?2",
                [source, dedup_id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()?)
    }
}

fn queued(o: &EnqueueOutcome) -> (i64, i64) {
    match o {
        EnqueueOutcome::Queued { copies } => (copies[0].0, copies[0].1),
        other => panic!("expected queued, got {other:?}"),
    }
}

fn claim(store: &mut Store, batch: i64, now: f64) -> Claim {
    store
        .claim(
            batch,
            "host:1",
            now + 90.0,
            now,
            false,
            DeliveryId::per_attempt("d"),
        )
        .unwrap()
        .expect("claim won")
}

fn report(c: &Claim, now: f64, mark: Mark) -> AttemptReport {
    AttemptReport {
        batch_id: c.batch_id,
        attempt_id: c.attempt_id,
        lease_owner: c.lease_owner.clone(),
        now,
        status: Some(200),
        error: None,
        duration_ms: 3,
        delivery_id: None,
        events_delivered: None,
        failed_event_id: None,
        mark,
    }
}

fn events_join_the_open_batch_of_their_group_in_commit_order() {
    let (_d, mut s) = temp_store();
    let (e1, b1) = queued(&s.enqueue(&req("r", "k", r#"{"n":1}"#, 100.0)).unwrap());
    let (e2, b2) = queued(&s.enqueue(&req("r", "k", r#"{"n":2}"#, 101.0)).unwrap());
    let (_, b3) = queued(&s.enqueue(&req("r", "other", r#"{"n":3}"#, 102.0)).unwrap());
    assert_eq!(b1, b2);
    assert_ne!(b1, b3);
    assert!(e2 > e1);
    let b = s.batch(b1).unwrap();
    assert_eq!(
        (b.state.as_str(), b.count, b.first_at, b.last_at),
        ("open", 2, 100.0, 101.0)
    );
    assert_eq!(b.bytes, 14);
    let ev = s.events(b1, false).unwrap();
    assert_eq!(ev.iter().map(|e| e.id).collect::<Vec<_>>(), vec![e1, e2]);
}

fn max_events_seals_in_the_enqueue_transaction() {
    let (_d, mut s) = temp_store();
    let mut r = req("r", "k", "{}", 100.0);
    r.primary.window.max_events = 2;
    let (_, b1) = queued(&s.enqueue(&r).unwrap());
    let (_, b2) = queued(&s.enqueue(&r).unwrap());
    assert_eq!(b1, b2);
    let b = s.batch(b1).unwrap();
    assert_eq!(b.state.as_str(), "sealed");
    assert!(b.content_hash.is_some());
    assert_eq!(b.sealed_at, Some(100.0));
    let (_, b3) = queued(&s.enqueue(&r).unwrap());
    assert_ne!(b3, b1, "a sealed batch never receives events");
}

fn max_bytes_pre_join_seal_keeps_the_bound() {
    let (_d, mut s) = temp_store();
    let mut r = req("r", "k", r#"{"pad":"xxxxxxxxxx"}"#, 100.0); // 20 bytes
    r.primary.window.max_bytes = 50;
    let (_, b1) = queued(&s.enqueue(&r).unwrap());
    let (_, b1b) = queued(&s.enqueue(&r).unwrap());
    assert_eq!(b1, b1b);
    assert_eq!(s.batch(b1).unwrap().state.as_str(), "open");
    // 40 + 20 > 50: the open batch is sealed first, the event opens a new one.
    let (_, b2) = queued(&s.enqueue(&r).unwrap());
    assert_ne!(b1, b2);
    assert_eq!(s.batch(b1).unwrap().state.as_str(), "sealed");
    assert_eq!(s.batch(b1).unwrap().bytes, 40);
    // Reaching max_bytes exactly seals in the same transaction.
    let mut exact = req("r", "k2", r#"{"pad":"xxxxxxxxxx"}"#, 100.0);
    exact.primary.window.max_bytes = 20;
    let (_, b3) = queued(&s.enqueue(&exact).unwrap());
    assert_eq!(s.batch(b3).unwrap().state.as_str(), "sealed");
}

fn readiness_truth_table() {
    // (quiet_s, max_s, first_at, last_at, now, ready)
    let rows: &[(f64, f64, f64, f64, f64, bool)] = &[
        (0.0, 0.0, 100.0, 100.0, 100.0, true),    // immediate
        (0.0, 0.0, 100.0, 100.0, 99.0, true),     // immediate even if the clock trails
        (10.0, 60.0, 100.0, 105.0, 114.0, false), // burst still going
        (10.0, 60.0, 100.0, 105.0, 115.0, true),  // went quiet
        (10.0, 60.0, 100.0, 155.0, 160.0, true),  // went on too long
        (10.0, 60.0, 100.0, 155.0, 159.9, false),
        (30.0, 20.0, 100.0, 100.0, 120.0, true), // max_s wins when quiet_s > max_s
        (30.0, 0.0, 100.0, 100.0, 100.0, true),  // max_s = 0 means no wait at all
    ];
    for (i, &(quiet, max, first, last, now, ready)) in rows.iter().enumerate() {
        let (_d, mut s) = temp_store();
        let mut r = req("r", "k", "{}", first);
        r.primary.window.quiet_s = quiet;
        r.primary.window.max_s = max;
        let (_, b) = queued(&s.enqueue(&r).unwrap());
        if last > first {
            r.now = last;
            s.enqueue(&r).unwrap();
        }
        let sealed = s.seal_ready(now).unwrap();
        assert_eq!(sealed.contains(&b), ready, "row {i}");
        assert_eq!(
            s.batch(b).unwrap().state.as_str() == "sealed",
            ready,
            "row {i}"
        );
    }
}

fn content_hash_is_stable_across_attempts_and_recomputed_by_exclude_and_split() {
    let (_d, mut s) = temp_store();
    for n in 0..4 {
        s.enqueue(&req("r", "k", &format!(r#"{{"n":{n}}}"#), 100.0))
            .unwrap();
    }
    let sealed = s.seal_ready(200.0).unwrap();
    let b = sealed[0];
    let h0 = s.batch(b).unwrap().content_hash.unwrap();
    let c = claim(&mut s, b, 200.0);
    s.mark(&report(
        &c,
        201.0,
        Mark::Retry {
            klass: Klass::Transport,
            next_attempt_at: 201.0,
        },
    ))
    .unwrap();
    let c2 = claim(&mut s, b, 202.0);
    assert_eq!(c2.attempt_n, 2);
    assert_eq!(
        s.batch(b).unwrap().content_hash.unwrap(),
        h0,
        "same hash on every attempt"
    );
    s.mark(&report(
        &c2,
        203.0,
        Mark::Dead {
            klass: Klass::Permanent,
        },
    ))
    .unwrap();
    let events = s.events(b, false).unwrap();
    s.exclude(b, &[events[1].id], 204.0).unwrap();
    let after = s.batch(b).unwrap();
    assert_ne!(after.content_hash.clone().unwrap(), h0);
    assert_eq!(after.count, 3);
    assert!(
        s.events(b, false).unwrap()[1].excluded_at.is_some(),
        "excluded event stays stored"
    );
    let parts = s.split(b, SplitSpec::MaxEvents(2), 205.0).unwrap();
    assert_eq!(parts.len(), 2);
    let (p1, p2) = (s.batch(parts[0]).unwrap(), s.batch(parts[1]).unwrap());
    assert_eq!((p1.count, p2.count), (2, 1));
    assert_ne!(p1.content_hash, p2.content_hash);
    assert_eq!(p1.state.as_str(), "sealed");
    assert_eq!(p1.not_before, Some(205.0));
    let orig = s.batch(b).unwrap();
    assert_eq!(
        (orig.state.as_str(), orig.result.as_deref()),
        ("dropped", Some("split"))
    );
    // The parts are the head of the group, in order.
    let cands = s.candidates(206.0, 10).unwrap();
    assert_eq!(
        cands.iter().map(|c| c.batch_id).collect::<Vec<_>>(),
        vec![parts[0]]
    );
}

fn split_at_an_event_and_by_bytes() {
    let (_d, mut s) = temp_store();
    for n in 0..5 {
        s.enqueue(&req("r", "k", &format!(r#"{{"n":{n}}}"#), 100.0))
            .unwrap();
    }
    let b = s.seal_ready(200.0).unwrap()[0];
    let ev = s.events(b, false).unwrap();
    let parts = s.split(b, SplitSpec::At(ev[3].id), 201.0).unwrap();
    assert_eq!(s.batch(parts[0]).unwrap().count, 3);
    assert_eq!(s.batch(parts[1]).unwrap().count, 2);
    let parts2 = s.split(parts[0], SplitSpec::MaxBytes(14), 202.0).unwrap();
    assert_eq!(parts2.len(), 2, "7-byte events, 14 bytes a part");
    let err = s
        .split(parts[1], SplitSpec::MaxEvents(10), 203.0)
        .unwrap_err();
    assert!(err.to_string().contains("one part"), "{err}");
    let open = queued(&s.enqueue(&req("r", "z", "{}", 300.0)).unwrap()).1;
    assert!(matches!(
        s.split(open, SplitSpec::MaxEvents(1), 301.0),
        Err(StoreError::WrongState { .. })
    ));
}

fn candidates_are_fifo_per_group_and_parallel_across_groups() {
    let (_d, mut s) = temp_store();
    let mut r = req("r", "a", "{}", 100.0);
    r.primary.window.max_events = 1;
    let (_, a1) = queued(&s.enqueue(&r).unwrap());
    r.now = 101.0;
    let (_, a2) = queued(&s.enqueue(&r).unwrap());
    let mut rb = req("r", "b", "{}", 102.0);
    rb.primary.window.max_events = 1;
    let (_, b1) = queued(&s.enqueue(&rb).unwrap());
    let c: Vec<i64> = s
        .candidates(110.0, 10)
        .unwrap()
        .iter()
        .map(|c| c.batch_id)
        .collect();
    assert_eq!(c, vec![a1, b1], "one head per group, oldest first");
    let cl = claim(&mut s, a1, 110.0);
    let c: Vec<i64> = s
        .candidates(110.0, 10)
        .unwrap()
        .iter()
        .map(|c| c.batch_id)
        .collect();
    assert_eq!(c, vec![b1], "a leased head blocks its group");
    s.mark(&report(
        &cl,
        111.0,
        Mark::Retry {
            klass: Klass::Batch,
            next_attempt_at: 130.0,
        },
    ))
    .unwrap();
    let c: Vec<i64> = s
        .candidates(120.0, 10)
        .unwrap()
        .iter()
        .map(|c| c.batch_id)
        .collect();
    assert_eq!(c, vec![b1], "a head backing off blocks its group");
    assert_eq!(s.batch(a1).unwrap().attempts, 1, "batch class is counted");
    let c: Vec<i64> = s
        .candidates(130.0, 10)
        .unwrap()
        .iter()
        .map(|c| c.batch_id)
        .collect();
    assert_eq!(c, vec![a1, b1]);
    let cl = claim(&mut s, a1, 130.0);
    s.mark(&report(
        &cl,
        131.0,
        Mark::Dead {
            klass: Klass::Permanent,
        },
    ))
    .unwrap();
    let c: Vec<i64> = s
        .candidates(131.0, 10)
        .unwrap()
        .iter()
        .map(|c| c.batch_id)
        .collect();
    assert_eq!(c, vec![a2, b1], "a dead batch leaves the queue");
    // An open head yields nothing for its group.
    let (_, open) = queued(&s.enqueue(&req("r", "c", "{}", 90.0)).unwrap());
    let c: Vec<i64> = s
        .candidates(131.0, 10)
        .unwrap()
        .iter()
        .map(|c| c.batch_id)
        .collect();
    assert!(!c.contains(&open));
}

/// A backlog on few keys: the FIFO walk's first rows hold fewer heads than asked for, so
/// the heads are found group by group (`HEAD_NEXT_KEY_SQL`); the answer is the same as the
/// exhaustive walk's, cut to the limit, with every per-group rule kept (a head committed
/// first but stamped later, a head backing off, an open head).
fn candidates_on_a_deep_backlog_of_few_keys_are_each_groups_head_oldest_first() {
    let (_d, mut s) = temp_store();
    let sealed_on = |route: &str, key: &str, now: f64| {
        let mut r = req(route, key, "{}", now);
        r.primary.window.max_events = 1;
        r
    };
    let sealed = |key: &str, now: f64| sealed_on("r", key, now);
    // Key z: six batches older than every other group's: the walk's first rows.
    let mut z = Vec::new();
    for i in 0..6 {
        z.push(queued(&s.enqueue(&sealed("z", 10.0 + i as f64)).unwrap()).1);
    }
    let mut heads = std::collections::HashMap::new();
    for i in 0..6 {
        for (k, key) in ["a", "b", "c"].iter().enumerate() {
            let (_, b) = queued(&s.enqueue(&sealed(key, 100.0 + (i * 3 + k) as f64)).unwrap());
            heads.entry(*key).or_insert(b);
        }
    }
    // Key d: its first batch was committed first but stamped later (a concurrent writer's
    // earlier `now`): the head is the first committed, not the first stamped.
    let (_, d1) = queued(&s.enqueue(&sealed("d", 200.0)).unwrap());
    let (_, d2) = queued(&s.enqueue(&sealed("d", 50.0)).unwrap());
    // Groups on the routes before and after "r" (the walk steps from route to route), each
    // with a batch behind its head.
    let (_, q1) = queued(&s.enqueue(&sealed_on("q", "a", 150.0)).unwrap());
    let (_, s1) = queued(&s.enqueue(&sealed_on("s", "a", 151.0)).unwrap());
    let (_, q2) = queued(&s.enqueue(&sealed_on("q", "a", 152.0)).unwrap());
    let (_, s2) = queued(&s.enqueue(&sealed_on("s", "a", 153.0)).unwrap());
    // Key e: its head backs off until 1000, which blocks the group.
    let (_, e1) = queued(&s.enqueue(&sealed("e", 60.0)).unwrap());
    let (_, e2) = queued(&s.enqueue(&sealed("e", 61.0)).unwrap());
    let cl = claim(&mut s, e1, 300.0);
    s.mark(&report(
        &cl,
        301.0,
        Mark::Retry {
            klass: Klass::Batch,
            next_attempt_at: 1000.0,
        },
    ))
    .unwrap();
    // Key o: an open batch, the group's head, is never a candidate.
    let (_, o_open) = queued(&s.enqueue(&req("r", "o", "{}", 5.0)).unwrap());
    let want = vec![z[0], heads["a"], heads["b"], heads["c"], q1, s1, d1];
    let ids = |v: Vec<Candidate>| v.into_iter().map(|c| c.batch_id).collect::<Vec<_>>();
    // Limit 100 walks every claimable row: the answer of the FIFO walk alone.
    assert_eq!(ids(s.candidates(500.0, 100).unwrap()), want);
    for limit in 1..=want.len() {
        assert_eq!(
            ids(s.candidates(500.0, limit).unwrap()),
            want[..limit].to_vec(),
            "limit {limit}: the walk of {} rows sees key z alone",
            limit * CANDIDATE_WALK_PER_LIMIT
        );
    }
    // After a group-by-group answer the next call starts there: the same answer.
    let all = ids(s.candidates(500.0, 100).unwrap());
    assert_eq!(all, want);
    for blocked in [d2, e1, e2, o_open, q2, s2] {
        assert!(!all.contains(&blocked), "batch {blocked} is not a head");
    }
    // The backoff ends: e's head joins, in its first_at order.
    let late = ids(s.candidates(1000.0, 2).unwrap());
    assert_eq!(late, vec![z[0], e1]);
    // The FIFO walk alone is the start of that answer at every limit, and exact only when
    // it is all of it.
    for limit in 1..=want.len() + 1 {
        let full = ids(s.candidates(500.0, limit).unwrap());
        let prefix = s.candidate_prefix(500.0, limit).unwrap();
        let heads = ids(prefix.heads);
        assert_eq!(heads, full[..heads.len()].to_vec(), "limit {limit}");
        assert_eq!(prefix.exact, heads == full, "limit {limit}: {heads:?}");
    }
    // Its 4 rows at limit 2 are z's: one head, and not the whole answer.
    let short = s.candidate_prefix(500.0, 2).unwrap();
    assert_eq!((ids(short.heads), short.exact), (vec![z[0]], false));
    let whole = s.candidate_prefix(500.0, 100).unwrap();
    assert_eq!((ids(whole.heads), whole.exact), (want.clone(), true));
}

fn claim_is_won_once_and_marks_are_fenced() {
    let (_d, mut s) = temp_store();
    let mut r = req("r", "k", "{}", 100.0);
    r.primary.window.max_events = 1;
    let (_, b) = queued(&s.enqueue(&r).unwrap());
    let c = claim(&mut s, b, 100.0);
    assert_eq!(c.lease_owner, format!("host:1:{}", c.attempt_id));
    assert!(
        s.claim(
            b,
            "host:2",
            200.0,
            100.0,
            false,
            DeliveryId::per_attempt("")
        )
        .unwrap()
        .is_none()
    );
    // Lease expires and is recovered; the late mark is discarded.
    let rec = s.recover_expired_leases(300.0, &[]).unwrap();
    assert_eq!(rec.len(), 1);
    let b_row = s.batch(b).unwrap();
    assert_eq!(
        (b_row.state.as_str(), b_row.last_error.as_deref()),
        ("retry", Some("lease expired"))
    );
    assert_eq!(b_row.attempts, 0, "recovery is uncounted");
    // The worker reports late, with an emit: the fence holds. Its own attempt row records
    // the late result as discarded; the batch row, the spool and the destination stay
    // exactly as recovery left them.
    let spool_before = s.batch_counts().unwrap();
    let r = s
        .mark(&report(
            &c,
            301.0,
            Mark::Delivered {
                result: None,
                emits: vec![req("r2", "emitted", "{}", 301.0)],
            },
        ))
        .unwrap();
    assert_eq!(r, MarkResult::Discarded);
    assert_eq!(s.batch(b).unwrap(), b_row, "the batch row is untouched");
    assert_eq!(
        s.batch_counts().unwrap(),
        spool_before,
        "the emit was not applied"
    );
    let att = s.attempts(b).unwrap();
    assert_eq!(att.len(), 1);
    assert_eq!(
        (
            att[0].outcome.map(|o| o.as_str()),
            att[0].status,
            att[0].finished_at,
            att[0].counted
        ),
        (Some("discarded"), Some(200), Some(301.0), false),
        "only its own attempt row changed, from recovery's retry to discarded"
    );
    // A second owner delivers.
    let c2 = claim(&mut s, b, 302.0);
    assert_eq!(
        s.mark(&report(
            &c2,
            303.0,
            Mark::Delivered {
                result: Some("ok".into()),
                emits: vec![]
            }
        ))
        .unwrap(),
        MarkResult::Applied
    );
    let row = s.batch(b).unwrap();
    assert_eq!(
        (row.state.as_str(), row.delivered_at),
        ("delivered", Some(303.0))
    );
    assert_eq!(
        s.attempts(b).unwrap()[1].delivery_id.as_deref(),
        Some(format!("d{}", c2.attempt_id).as_str())
    );
}

fn recovery_never_touches_a_live_workers_lease() {
    let (_d, mut s) = temp_store();
    let mut r = req("r", "k", "{}", 100.0);
    r.primary.window.max_events = 1;
    let (_, b) = queued(&s.enqueue(&r).unwrap());
    let c = claim(&mut s, b, 100.0);
    assert!(
        s.recover_expired_leases(1000.0, std::slice::from_ref(&c.lease_owner))
            .unwrap()
            .is_empty()
    );
    assert!(
        s.recover_expired_leases(150.0, &[]).unwrap().is_empty(),
        "not yet expired"
    );
    assert_eq!(
        s.recover_all_leases(150.0).unwrap().len(),
        1,
        "startup recovers everything"
    );
    assert_eq!(s.batch(b).unwrap().state.as_str(), "retry");
}

fn emits_are_committed_with_the_mark() {
    let (_d, mut s) = temp_store();
    let mut r = req("r", "k", "{}", 100.0);
    r.primary.window.max_events = 1;
    let (_, b) = queued(&s.enqueue(&r).unwrap());
    let c = claim(&mut s, b, 100.0);
    let emit = req("hermes-route", "e1", r#"{"emitted":true}"#, 101.0);
    s.mark(&report(
        &c,
        101.0,
        Mark::Delivered {
            result: None,
            emits: vec![emit.clone()],
        },
    ))
    .unwrap();
    let emitted = s
        .list_batches(&BatchFilter {
            source: Some("src".into()),
            limit: 10,
            ..Default::default()
        })
        .unwrap();
    assert!(emitted.iter().any(|b| b.route == "hermes-route"));
    // A bad emit aborts the whole mark: the batch stays leased, nothing emitted.
    let (_, b2) = queued(&s.enqueue(&r).unwrap());
    let c2 = claim(&mut s, b2, 102.0);
    let mut bad = emit.clone();
    bad.payload = Some("not json".into());
    assert!(
        s.mark(&report(
            &c2,
            103.0,
            Mark::Delivered {
                result: None,
                emits: vec![bad]
            }
        ))
        .is_err()
    );
    assert_eq!(s.batch(b2).unwrap().state.as_str(), "leased");
}

fn dedup_duplicate_dead_replay_and_dropped_repoint() {
    let (_d, mut s) = temp_store();
    let mut r = req("r", "k", "{}", 100.0);
    r.primary.window.max_events = 1;
    r.dedup_id = Some("D1".into());
    let (e1, b1) = queued(&s.enqueue(&r).unwrap());
    assert_eq!(
        s.enqueue(&r).unwrap(),
        EnqueueOutcome::Duplicate { event_id: e1 }
    );
    assert_eq!(s.dedup_row("src", "D1").unwrap().unwrap().2, 1);
    // Dead batch: the hit replays it.
    let c = claim(&mut s, b1, 100.0);
    s.mark(&report(
        &c,
        101.0,
        Mark::Dead {
            klass: Klass::Permanent,
        },
    ))
    .unwrap();
    assert_eq!(
        s.enqueue(&r).unwrap(),
        EnqueueOutcome::Replayed { batch_id: b1 }
    );
    let row = s.batch(b1).unwrap();
    assert_eq!((row.state.as_str(), row.attempts), ("retry", 0));
    // Dropped batch: enqueued anew and the row re-pointed.
    s.drop_batches(&[b1], 102.0)
        .unwrap()
        .pop()
        .unwrap()
        .unwrap();
    let (e2, b2) = queued(&s.enqueue(&r).unwrap());
    assert_ne!(b2, b1);
    assert_eq!(s.dedup_row("src", "D1").unwrap().unwrap().0, e2);
    // Outside the window the id is free again.
    r.now = 100.0 + 86_400.0 + 1.0 + 1.0;
    assert!(matches!(
        s.enqueue(&r).unwrap(),
        EnqueueOutcome::Queued { .. }
    ));
}

fn tee_copies_are_placed_in_one_transaction_primary_first() {
    let (_d, mut s) = temp_store();
    let mut r = req("main", "k", "{}", 100.0);
    r.dedup_id = Some("x".into());
    r.tees = vec![
        Copy {
            route: "audit".into(),
            destination: "http:audit".into(),
            window: window(0.0, 0.0, 500, 1000),
        },
        Copy {
            route: "dup".into(),
            destination: "http:main".into(),
            window: window(0.0, 0.0, 500, 1000),
        },
    ];
    let EnqueueOutcome::Queued { copies } = s.enqueue(&r).unwrap() else {
        panic!()
    };
    assert_eq!(
        copies.len(),
        2,
        "a tee to a destination that already has a copy is skipped"
    );
    assert_eq!(copies[0].2, "main");
    assert_eq!(copies[1].2, "audit");
    assert_eq!(
        s.dedup_row("src", "x").unwrap().unwrap().0,
        copies[0].0,
        "dedup points at the primary"
    );
    assert!(
        matches!(s.enqueue(&r).unwrap(), EnqueueOutcome::Duplicate { .. }),
        "a duplicate makes no copies"
    );
    let nine = vec![r.tees[0].clone(); 9];
    r.tees = nine;
    r.dedup_id = None;
    assert!(matches!(s.enqueue(&r), Err(StoreError::Invalid(_))));
}

fn group_commit_isolates_each_request_in_its_savepoint() {
    let (_d, mut s) = temp_store();
    let good = req("r", "k", "{}", 100.0);
    let mut bad = req("r", "k", "{}", 100.0);
    bad.key = "x".repeat(KEY_BYTES_MAX + 1);
    let out = s.enqueue_many(&[good.clone(), bad, good]).unwrap();
    assert!(out[0].is_ok() && out[1].is_err() && out[2].is_ok());
    let b = s
        .list_batches(&BatchFilter {
            limit: 10,
            ..Default::default()
        })
        .unwrap();
    assert_eq!(b.len(), 1);
    assert_eq!(b[0].count, 2);
}

/// The dispatcher's read transaction after a tick's commit: reads see what was committed,
/// `end_reads` ends it so the next tick can begin, and inside an open transaction there is
/// nothing to open or end.
fn a_read_scope_ends_so_the_next_write_can_begin() {
    let (_d, mut s) = temp_store();
    let mut r = req("r", "k", "{}", 100.0);
    r.primary.window.max_events = 1;
    let batch = queued(&s.enqueue(&r).unwrap()).1;
    let scope = s.begin_reads().unwrap().expect("opened");
    assert!(s.in_transaction());
    assert_eq!(s.batch(batch).unwrap().state, BatchState::Sealed);
    assert_eq!(s.frozen_events(batch).unwrap().len(), 1);
    s.end_reads(scope);
    assert!(!s.in_transaction());
    s.begin_tick().unwrap();
    assert!(
        s.begin_reads().unwrap().is_none(),
        "a tick's transaction is left alone"
    );
    s.commit_tick().unwrap();
    claim(&mut s, batch, 110.0);
}

/// A claim of each of `batches`, leased until 200, a probe where `probe` says so.
fn claim_requests(batches: &[i64], probe: impl Fn(i64) -> bool) -> Vec<ClaimRequest> {
    batches
        .iter()
        .map(|&batch_id| ClaimRequest {
            batch_id,
            lease_until: 200.0,
            probe: probe(batch_id),
            delivery_id: DeliveryId::per_attempt("d"),
        })
        .collect()
}

/// A tick's claims are made under one savepoint. A claim lost after its attempt row was
/// written (here a temp trigger reopens the batch once that row is in) must still undo its
/// own writes alone, as a savepoint per claim did: the other claims are kept, the lost
/// batch keeps its state, and no attempt row of it is left.
#[test]
fn a_claim_lost_after_writing_leaves_nothing_and_the_rest_of_its_group_is_kept() {
    let (_d, mut s) = crate::store::testutil::temp_sqlite_store(); // a trigger plants the failure (SQLite's)
    let mut batches = Vec::new();
    for key in ["a", "b", "c"] {
        let mut r = req("r", key, "{}", 100.0);
        r.primary.window.max_events = 1;
        batches.push(queued(&s.enqueue(&r).unwrap()).1);
    }
    let lost = batches[1];
    s.conn
        .execute_batch(&format!(
            "CREATE TEMP TRIGGER steal AFTER INSERT ON attempts WHEN NEW.batch_id = {lost}
             BEGIN UPDATE batches SET state = 'open' WHERE id = NEW.batch_id; END;"
        ))
        .unwrap();
    let reqs = claim_requests(&batches, |_| false);
    let out = s.claim_many("host:1", 110.0, &reqs).unwrap().claims;
    let won: Vec<bool> = out.iter().map(Option::is_some).collect();
    assert_eq!(won, [true, false, true], "{out:?}");
    assert_eq!(s.batch(lost).unwrap().state, BatchState::Sealed);
    assert!(s.attempts(lost).unwrap().is_empty());
    for b in [batches[0], batches[2]] {
        assert_eq!(s.batch(b).unwrap().state, BatchState::Leased);
        assert_eq!(s.attempts(b).unwrap().len(), 1);
    }
}

/// On PostgreSQL a tick's claims are one statement (`claim_all_pg`): a batch that is not
/// claimable is refused, one whose lease is not written (a trigger skips its update, as a
/// lost claim's would be undone on SQLite) gets no attempt row, a batch asked for twice is
/// claimed once, and the others are leased with one attempt row each (its delivery id made
/// from the attempt's id, or the batch's one id), their reads returned with the claims
/// exactly as `claimed_batches` reads them after the commit.
#[test]
fn a_postgresql_claim_whose_lease_is_not_written_leaves_nothing_and_the_rest_is_kept() {
    crate::store::testutil::with_backend(true, pg_claims_whose_lease_is_not_written);
}

fn pg_claims_whose_lease_is_not_written() {
    let (_d, mut s) = temp_store();
    assert!(s.is_postgres());
    let mut batches = Vec::new();
    for key in ["a", "b", "c", "d"] {
        let mut r = req("r", key, r#"{"k":1}"#, 100.0);
        r.primary.window.max_events = 1;
        batches.push(queued(&s.enqueue(&r).unwrap()).1);
    }
    // Not claimable: already leased.
    let taken = claim(&mut s, batches[3], 100.0);
    let lost = batches[1];
    s.conn
        .execute_batch(&format!(
            "CREATE FUNCTION skip_row() RETURNS trigger LANGUAGE plpgsql AS
                 $$ BEGIN RETURN NULL; END $$;
             CREATE TRIGGER steal BEFORE UPDATE ON batches FOR EACH ROW
                 WHEN (NEW.id = {lost} AND NEW.state = 'leased') EXECUTE FUNCTION skip_row();"
        ))
        .unwrap();
    // The first batch asked for twice: claimed once, by the first request.
    let mut asked = batches.clone();
    asked.push(batches[0]);
    let mut reqs = claim_requests(&asked, |b| b == batches[2]);
    // One id for every attempt of this batch; the others' ids are made from their attempts'.
    reqs[2].delivery_id = DeliveryId::Batch("fixed".into());
    let out = s.claim_many("host:1", 110.0, &reqs).unwrap();
    let won: Vec<bool> = out.claims.iter().map(Option::is_some).collect();
    assert_eq!(won, [true, false, true, false, false], "{out:?}");
    assert_eq!(s.batch(lost).unwrap().state, BatchState::Sealed);
    assert!(s.attempts(lost).unwrap().is_empty());
    assert_eq!(
        s.attempts(batches[3]).unwrap().len(),
        1,
        "only its own claim's"
    );
    assert_eq!(
        s.batch(batches[3]).unwrap().lease_owner,
        Some(taken.lease_owner)
    );
    let mut read_ids: Vec<i64> = out.read.keys().copied().collect();
    read_ids.sort();
    assert_eq!(read_ids, vec![batches[0], batches[2]]);
    let after = s.claimed_batches(&read_ids).unwrap();
    for c in out.claims.iter().flatten() {
        let b = s.batch(c.batch_id).unwrap();
        assert_eq!(b.state, BatchState::Leased);
        assert_eq!(b.lease_owner.as_deref(), Some(c.lease_owner.as_str()));
        assert_eq!(c.lease_owner, format!("host:1:{}", c.attempt_id));
        let attempts = s.attempts(c.batch_id).unwrap();
        assert_eq!(attempts.len(), 1);
        let a = &attempts[0];
        assert_eq!(
            (
                a.id,
                a.n,
                a.started_at,
                a.delivery_id.clone(),
                a.probe,
                a.counted
            ),
            (
                c.attempt_id,
                c.attempt_n,
                110.0,
                Some(if c.batch_id == batches[2] {
                    "fixed".to_string()
                } else {
                    format!("d{}", c.attempt_id)
                }),
                c.batch_id == batches[2],
                false
            )
        );
        assert_eq!(out.read[&c.batch_id], after[&c.batch_id]);
        assert_eq!(out.read[&c.batch_id].1.len(), 1, "its one event");
    }
}

#[test]
fn a_request_that_fails_after_writing_leaves_nothing_and_the_rest_of_its_group_is_kept() {
    let (_d, mut s) = crate::store::testutil::temp_sqlite_store(); // a trigger plants the failure (SQLite's)
    // A tee to route "boom" fails when its batch is inserted: after the request's primary
    // copy (event and batch) has been written. Only a per-request undo removes that copy.
    s.conn
        .execute_batch(
            "CREATE TEMP TRIGGER boom BEFORE INSERT ON batches WHEN NEW.route = 'boom'
             BEGIN SELECT RAISE(ABORT, 'boom'); END;",
        )
        .unwrap();
    let good = req("r", "k", r#"{"n":1}"#, 100.0);
    let mut bad = req("r", "k", r#"{"n":2}"#, 100.0);
    bad.tees.push(Copy {
        route: "boom".into(),
        destination: "http:boom".into(),
        window: bad.primary.window,
    });
    let mut invalid = req("r", "k", "{}", 100.0);
    invalid.key = "x".repeat(KEY_BYTES_MAX + 1);
    let mut later = good.clone();
    later.payload = Some(r#"{"n":3}"#.into());
    let out = s.enqueue_many(&[good, bad, invalid, later]).unwrap();
    assert!(
        out[0].is_ok() && out[1].is_err() && out[2].is_err() && out[3].is_ok(),
        "{out:?}"
    );
    let b = s
        .list_batches(&BatchFilter {
            limit: 10,
            ..Default::default()
        })
        .unwrap();
    assert_eq!(b.len(), 1, "{b:?}");
    assert_eq!(b[0].count, 2);
    let payloads: Vec<String> = s
        .conn
        .prepare("SELECT payload FROM events ORDER BY id")
        .unwrap()
        .query_map((), |r| r.get(0))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    assert_eq!(payloads, [r#"{"n":1}"#, r#"{"n":3}"#]);
    assert_eq!(s.meta("last_enqueue_at").unwrap().as_deref(), Some("100"));
}

fn quarantine_stores_the_raw_request_and_replay_reclassifies() {
    let (_d, mut s) = temp_store();
    let mut q = req("ignored", "ignored", "{}", 100.0);
    q.payload = None;
    q.raw = Some(b"{\"broken\": true}".to_vec());
    q.headers = r#"{"X-Event":"push"}"#.into();
    q.quarantine = Some(Quarantine {
        error_class: "KeyMissing".into(),
    });
    let EnqueueOutcome::Quarantined { batch_id, .. } = s.enqueue(&q).unwrap() else {
        panic!()
    };
    let b = s.batch(batch_id).unwrap();
    assert_eq!(
        (b.state.as_str(), b.destination.as_str(), b.key.as_str()),
        ("dead", "quarantine", "quarantine")
    );
    assert_eq!(b.last_class.map(|k| k.as_str()), Some("quarantine"));
    assert_eq!(b.last_error.as_deref(), Some("plugin error: KeyMissing"));
    assert!(s.is_quarantine(batch_id).unwrap());
    assert!(matches!(
        s.replay(&[batch_id], 101.0).unwrap()[0],
        Err(StoreError::WrongState { .. })
    ));
    let stored = s.quarantined_requests(batch_id).unwrap();
    assert_eq!(stored[0].raw.as_deref(), Some(&b"{\"broken\": true}"[..]));
    let fixed = req("r", "k", r#"{"broken":true}"#, 102.0);
    s.reclassify_quarantine(batch_id, &[fixed], 102.0).unwrap();
    let b = s.batch(batch_id).unwrap();
    assert_eq!(
        (b.state.as_str(), b.result.as_deref()),
        ("delivered", Some("reclassified"))
    );
}

fn operator_retry_drop_pause_resume_and_redue() {
    let (_d, mut s) = temp_store();
    let mut r = req("r", "k", "{}", 100.0);
    r.primary.window.max_events = 1;
    let (_, b) = queued(&s.enqueue(&r).unwrap());
    let c = claim(&mut s, b, 100.0);
    s.mark(&report(
        &c,
        101.0,
        Mark::Retry {
            klass: Klass::Config,
            next_attempt_at: 400.0,
        },
    ))
    .unwrap();
    assert_eq!(s.redue_retries(Redue::Config, 102.0).unwrap(), 1);
    assert_eq!(s.batch(b).unwrap().next_attempt_at, Some(102.0));
    s.retry_now(b, 103.0).unwrap();
    assert!(matches!(
        s.retry_now(999, 103.0),
        Err(StoreError::NotFound(_))
    ));
    s.pause("http:r", "operator", Some("maintenance"), 104.0)
        .unwrap();
    let d = s.destination("http:r").unwrap();
    assert_eq!(
        (d.state.as_str(), d.paused_by.as_deref()),
        ("paused", Some("operator"))
    );
    s.resume("http:r", 105.0).unwrap();
    assert_eq!(s.destination("http:r").unwrap().state.as_str(), "closed");
    s.drop_batches(&[b], 106.0).unwrap().pop().unwrap().unwrap();
    assert!(
        s.drop_batches(&[b], 107.0).unwrap()[0].is_err(),
        "dropped is final"
    );
    let n: i64 = s
        .conn
        .query_row("SELECT count(*) FROM audit", (), |r| r.get(0))
        .unwrap();
    assert_eq!(n, 4, "retry, pause, resume and drop are audited");
}

fn retention_prunes_what_aged_out_and_never_dead() {
    let (_d, mut s) = temp_store();
    let day = 86_400.0;
    let mut r = req("r", "k", "{}", 0.0);
    r.primary.window.max_events = 1;
    r.dedup_id = Some("a".into());
    let (_, delivered) = queued(&s.enqueue(&r).unwrap());
    let c = claim(&mut s, delivered, 0.0);
    s.mark(&report(
        &c,
        1.0,
        Mark::Delivered {
            result: None,
            emits: vec![],
        },
    ))
    .unwrap();
    r.dedup_id = None;
    let (_, dead) = queued(&s.enqueue(&r).unwrap());
    let c = claim(&mut s, dead, 2.0);
    s.mark(&report(
        &c,
        3.0,
        Mark::Dead {
            klass: Klass::Permanent,
        },
    ))
    .unwrap();
    let rep = s.prune(8.0 * day, &Retention::default()).unwrap();
    assert_eq!((rep.batches, rep.events, rep.dedup), (1, 1, 1));
    assert_eq!(rep.attempts, 0, "attempts live 30 days");
    assert!(matches!(s.batch(delivered), Err(StoreError::NotFound(_))));
    assert_eq!(s.batch(dead).unwrap().state.as_str(), "dead");
    let rep = s.prune(31.0 * day, &Retention::default()).unwrap();
    assert_eq!(rep.attempts, 2);
    assert_eq!(
        s.batch(dead).unwrap().state.as_str(),
        "dead",
        "dead is never pruned"
    );
}

/// Deliver batch `b` at `at` through a claim and a mark.
fn deliver(s: &mut Store, b: i64, at: f64) {
    let c = claim(s, b, at);
    s.mark(&report(
        &c,
        at,
        Mark::Delivered {
            result: None,
            emits: vec![],
        },
    ))
    .unwrap();
}

fn retention_bounds_every_transaction_by_rows_even_for_one_batch_larger_than_a_transaction() {
    let (_d, mut s) = temp_store();
    let day = 86_400.0;
    // One delivered batch of 2 500 events (more than one transaction may delete), thirty of
    // 100 events, and a dead one of 100 that must survive.
    let big_n = 2_500;
    let mut r = req("big", "k", "{}", 0.0);
    r.primary.window.max_events = big_n;
    let mut big = 0;
    for _ in 0..big_n {
        big = queued(&s.enqueue(&r).unwrap()).1;
    }
    assert_eq!(s.batch(big).unwrap().state.as_str(), "sealed");
    deliver(&mut s, big, 1.0);
    let mut small = vec![];
    for k in 0..30 {
        let mut r = req("small", &format!("k{k}"), "{}", 2.0);
        r.primary.window.max_events = 100;
        let mut b = 0;
        for _ in 0..100 {
            b = queued(&s.enqueue(&r).unwrap()).1;
        }
        deliver(&mut s, b, 3.0);
        small.push(b);
    }
    let mut r = req("dead", "k", "{}", 4.0);
    r.primary.window.max_events = 100;
    let mut dead = 0;
    for _ in 0..100 {
        dead = queued(&s.enqueue(&r).unwrap()).1;
    }
    let c = claim(&mut s, dead, 5.0);
    s.mark(&report(
        &c,
        5.0,
        Mark::Dead {
            klass: Klass::Permanent,
        },
    ))
    .unwrap();

    let mut pass = PrunePass::new(8.0 * day, &Retention::default());
    let mut steps = 0;
    let mut big_seen_half_pruned = false;
    while !s.prune_step(&mut pass).unwrap() {
        steps += 1;
        if s.batch(big).is_ok() && s.events(big, false).unwrap().len() < big_n as usize {
            big_seen_half_pruned = true;
        }
        assert!(steps < 100, "the pass ends");
    }
    let rows = (big_n + 1) + 30 * 101;
    assert_eq!(
        (pass.report.batches, pass.report.events),
        (31, big_n + 3_000),
        "everything delivered is gone"
    );
    assert!(
        pass.rows_in_one_transaction_max <= PRUNE_ROWS_MAX,
        "no transaction deleted more than {PRUNE_ROWS_MAX} rows: {}",
        pass.rows_in_one_transaction_max
    );
    assert!(
        pass.transactions >= rows / PRUNE_ROWS_MAX,
        "{} transactions for {rows} rows",
        pass.transactions
    );
    assert!(big_seen_half_pruned, "the big batch spanned transactions");
    assert!(matches!(s.batch(big), Err(StoreError::NotFound(_))));
    assert!(small.iter().all(|b| s.batch(*b).is_err()));
    assert_eq!(
        s.batch(dead).unwrap().state.as_str(),
        "dead",
        "dead is never pruned"
    );
    assert_eq!(s.events(dead, false).unwrap().len(), 100);
    // `prune` is the same pass run to its end: nothing is left for a second one.
    assert_eq!(
        s.prune(8.0 * day, &Retention::default()).unwrap(),
        PruneReport::default()
    );
}

fn results_decide_on_the_destination_row_inside_their_transaction_and_a_discarded_one_keeps_it() {
    let (d, mut s) = temp_store();
    let mut other = crate::store::testutil::reopen(&d, &s, std::time::Duration::from_millis(100));
    let mut r = req("r", "k", "{}", 100.0);
    r.primary.window.max_events = 1;
    let (_, b) = queued(&s.enqueue(&r).unwrap());
    let c = claim(&mut s, b, 100.0);
    other.pause("http:r", "operator", None, 101.0).unwrap();
    let recorded = s
        .record_results(&["http:r"], |_, row, refused| {
            assert_eq!(refused, None);
            assert_eq!(
                row.state,
                crate::vocab::BreakerState::Paused,
                "the row as this transaction reads it"
            );
            assert!(
                matches!(other.resume("http:r", 102.0), Err(StoreError::Busy)),
                "nobody changes the row while the result decides on it"
            );
            row.consecutive_failures += 1;
            report(
                &c,
                103.0,
                Mark::Retry {
                    klass: Klass::Transport,
                    next_attempt_at: 200.0,
                },
            )
            .into()
        })
        .unwrap();
    assert_eq!(recorded[0].result, MarkResult::Applied);
    let row = s.destination("http:r").unwrap();
    assert_eq!(
        (row.state.as_str(), row.consecutive_failures),
        ("paused", 1),
        "the pause is kept, the result's change applied"
    );
    // A result whose lease was lost: its change to the row is dropped.
    let c2 = claim(&mut s, b, 250.0);
    s.recover_all_leases(251.0).unwrap();
    let recorded = s
        .record_results(&["http:r"], |_, row, _| {
            row.consecutive_failures += 10;
            row.retry_after_until = Some(999.0);
            report(
                &c2,
                252.0,
                Mark::Retry {
                    klass: Klass::Throttle,
                    next_attempt_at: 300.0,
                },
            )
            .into()
        })
        .unwrap();
    assert_eq!(recorded[0].result, MarkResult::Discarded);
    assert_eq!(
        s.destination("http:r").unwrap(),
        row,
        "a discarded result changes nothing"
    );
}

/// Issue 28: a result that proves its destination healthy (`Decision::recovered`, a
/// success that closed the breaker) makes that destination's transport- and throttle-class
/// retries due in its own transaction, and nothing else: not its config or batch retries
/// (a reload and the backoff own those), not another destination's. A discarded result
/// makes nothing due.
fn a_recovered_destination_makes_its_transport_and_throttle_retries_due_and_nothing_else() {
    let (_d, mut s) = temp_store();
    let retry = |s: &mut Store, route: &str, key: &str, klass: Klass| -> i64 {
        let mut r = req(route, key, "{}", 100.0);
        r.primary.window.max_events = 1;
        let (_, b) = queued(&s.enqueue(&r).unwrap());
        let c = claim(s, b, 100.0);
        let mark = Mark::Retry {
            klass,
            next_attempt_at: 900.0,
        };
        assert_eq!(
            s.mark(&report(&c, 101.0, mark)).unwrap(),
            MarkResult::Applied
        );
        b
    };
    let transport = retry(&mut s, "r", "a", Klass::Transport);
    let throttle = retry(&mut s, "r", "b", Klass::Throttle);
    let config = retry(&mut s, "r", "c", Klass::Config);
    let batch = retry(&mut s, "r", "d", Klass::Batch);
    let elsewhere = retry(&mut s, "other", "a", Klass::Transport);
    // A discarded result asks for it and changes nothing.
    let mut r = req("r", "probe", "{}", 100.0);
    r.primary.window.max_events = 1;
    let (_, probe) = queued(&s.enqueue(&r).unwrap());
    let lost = claim(&mut s, probe, 100.0);
    s.recover_all_leases(102.0).unwrap();
    let recorded = s
        .record_results(&["http:r"], |_, _, _| Decision {
            report: report(
                &lost,
                103.0,
                Mark::Delivered {
                    result: None,
                    emits: vec![],
                },
            ),
            recovered: true,
        })
        .unwrap();
    assert_eq!(
        (recorded[0].result, recorded[0].redue),
        (MarkResult::Discarded, 0)
    );
    let due = |s: &Store, b: i64| s.batch(b).unwrap().next_attempt_at;
    assert_eq!(due(&s, transport), Some(900.0));
    // The probe that closes the breaker.
    let c = claim(&mut s, probe, 104.0);
    let recorded = s
        .record_results(&["http:r"], |_, _, _| Decision {
            report: report(
                &c,
                105.0,
                Mark::Delivered {
                    result: None,
                    emits: vec![],
                },
            ),
            recovered: true,
        })
        .unwrap();
    assert_eq!(
        (recorded[0].result, recorded[0].redue),
        (MarkResult::Applied, 2)
    );
    assert_eq!(
        [transport, throttle, config, batch, elsewhere].map(|b| due(&s, b)),
        [
            Some(105.0),
            Some(105.0),
            Some(900.0),
            Some(900.0),
            Some(900.0)
        ]
    );
    assert_eq!(s.batch(probe).unwrap().state, BatchState::Delivered);
}

/// `throttled_since` reads a batch's run of throttles back from the spool (a restarted
/// dispatcher goes on counting dispatch.throttle_alert_s): the start of its oldest
/// throttled attempt in the run, or the destination's last success when that came later;
/// any other answer ends the run.
fn throttled_since_is_the_start_of_the_batchs_throttle_run_bounded_by_the_last_success() {
    let (_d, mut s) = temp_store();
    let mut r = req("r", "k", "{}", 100.0);
    r.primary.window.max_events = 1;
    let (_, b) = queued(&s.enqueue(&r).unwrap());
    let attempt = |s: &mut Store, at: f64, klass: Klass| {
        let c = claim(s, b, at);
        let mark = Mark::Retry {
            klass,
            next_attempt_at: at + 1.0,
        };
        s.mark(&report(&c, at + 1.0, mark)).unwrap();
    };
    assert_eq!(s.throttled_since(b, "http:r", 150.0).unwrap(), None);
    attempt(&mut s, 100.0, Klass::Transport);
    assert_eq!(s.throttled_since(b, "http:r", 150.0).unwrap(), None);
    attempt(&mut s, 200.0, Klass::Throttle);
    attempt(&mut s, 300.0, Klass::Throttle);
    assert_eq!(s.throttled_since(b, "http:r", 400.0).unwrap(), Some(200.0));
    assert_eq!(
        s.throttled_since(b, "http:r", 250.0).unwrap(),
        Some(200.0),
        "only the attempts before the one being recorded"
    );
    s.update_destination("http:r", |d| d.last_ok_at = Some(250.0))
        .unwrap();
    assert_eq!(s.throttled_since(b, "http:r", 400.0).unwrap(), Some(250.0));
}

/// The statements of `s`'s connection that SQLite has prepared again since they were first
/// prepared, with how often (`SQLITE_STMTSTATUS_REPREPARE`), read through `sqlite3_next_stmt`.
fn reprepared(s: &Store) -> Vec<(String, i32)> {
    use rusqlite::ffi;
    let mut out = Vec::new();
    // SAFETY: the handle is this connection's, used on this thread while `s` is borrowed;
    // the statements listed are the cache's, alive until the connection closes, and only
    // read (their SQL text and a counter).
    unsafe {
        let db = s.conn.lite().unwrap().handle();
        let mut stmt = ffi::sqlite3_next_stmt(db, std::ptr::null_mut());
        while !stmt.is_null() {
            let n = ffi::sqlite3_stmt_status(stmt, ffi::SQLITE_STMTSTATUS_REPREPARE, 0);
            if n > 0 {
                let sql = std::ffi::CStr::from_ptr(ffi::sqlite3_sql(stmt));
                out.push((sql.to_string_lossy().into_owned(), n));
            }
            stmt = ffi::sqlite3_next_stmt(db, stmt);
        }
    }
    out
}

/// A cached statement is prepared once. A bound value the planner looked at (a `LIMIT ?`,
/// an `x = ?` it weighed as maybe 0 or 1) makes SQLite expire the statement whenever its
/// bindings are cleared, which rusqlite does each time the statement goes back to the
/// cache: then every use parses and plans again (12 % of the dispatcher's CPU before).
#[test]
fn hot_statements_are_never_prepared_again() {
    let (_d, mut s) = crate::store::testutil::temp_sqlite_store(); // SQLite's statement cache
    let mut t = 100.0;
    // A backlog on two keys (the group-by-group candidate walk) and one batch per key (the
    // FIFO walk), enqueued in groups as the intake's writer does.
    for i in 0..48 {
        let key = if i < 40 {
            format!("few{}", i % 2)
        } else {
            format!("k{i}")
        };
        let mut r = req("r", &key, "{}", t);
        r.primary.window.max_events = 1;
        let mut open = req("r", &format!("open{}", i % 3), "{}", t);
        open.primary.window = window(50.0, 500.0, 100, 1 << 20);
        for o in s.enqueue_many(&[r, open]).unwrap() {
            o.unwrap();
        }
        t += 0.01;
    }
    let mut warm = Vec::new();
    for round in 0..20 {
        if round == 2 {
            // Statements the migration's schema change expired are prepared again once.
            warm = reprepared(&s);
        }
        let now = 200.0 + f64::from(round);
        s.seal_ready(now).unwrap();
        s.recover_expired_leases(now, &[]).unwrap();
        let cands = s.candidates(now, 16).unwrap();
        assert!(!cands.is_empty(), "round {round} finds work");
        let reqs: Vec<ClaimRequest> = cands
            .iter()
            .map(|c| ClaimRequest {
                batch_id: c.batch_id,
                lease_until: now + 90.0,
                probe: false,
                delivery_id: DeliveryId::per_attempt("d"),
            })
            .collect();
        let claims: Vec<Claim> = s
            .claim_many("host:1", now, &reqs)
            .unwrap()
            .claims
            .into_iter()
            .flatten()
            .collect();
        drop(reqs);
        for (n, c) in claims.iter().enumerate() {
            assert!(!s.frozen_events(c.batch_id).unwrap().is_empty());
            s.poison_strikes(c.batch_id, "d", now).unwrap();
            s.consecutive_throttles(c.batch_id, now).unwrap();
            s.previous_was_bad_emit(c.batch_id, now).unwrap();
            let mark = if n % 3 == 0 {
                Mark::Retry {
                    klass: Klass::Transport,
                    next_attempt_at: now + 0.5,
                }
            } else {
                Mark::Delivered {
                    result: None,
                    emits: Vec::new(),
                }
            };
            s.mark(&report(c, now + 0.1, mark)).unwrap();
        }
    }
    assert_eq!(reprepared(&s), warm);
}

/// Schema 5 keeps a delivery's state changes out of the indexes that enqueue and sealing
/// use (they hold open batches only); each of those queries must still be planned on its
/// index, not on a scan of every batch in a state.
#[test]
fn enqueue_seal_and_redue_are_planned_on_their_partial_indexes() {
    let (_d, s) = crate::store::testutil::temp_sqlite_store(); // SQLite's query plans
    let plan = |sql: &str| -> String {
        let mut stmt = s
            .conn
            .lite()
            .unwrap()
            .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
            .unwrap();
        let nulls = vec![rusqlite::types::Null; stmt.parameter_count()];
        let rows = stmt
            .query_map(rusqlite::params_from_iter(nulls), |r| r.get::<_, String>(3))
            .unwrap()
            .collect::<rusqlite::Result<Vec<_>>>()
            .unwrap();
        rows.join(" | ")
    };
    let cases: [(&str, &[&str]); 3] = [
        (
            delivery::SEAL_READY_SQL,
            &["batches_immediate", "batches_quiet_due", "batches_max_due"],
        ),
        (enqueue::OPEN_BATCH_SQL, &["batches_open_group"]),
        (delivery::REDUE_SQL, &["batches_due"]),
    ];
    for (sql, indexes) in cases {
        let p = plan(sql);
        for index in indexes {
            assert!(p.contains(&format!("INDEX {index} ")), "{sql}\n-> {p}");
        }
    }
}

/// A raw body identical to the payload is written once (schema 6): raw NULL and
/// raw_is_payload = 1, and export and quarantine replay read the payload's bytes as the raw
/// body. A raw body that differs is kept as it came.
fn a_raw_body_identical_to_the_payload_is_stored_once_and_read_back_whole() {
    let (_d, mut store) = temp_store();
    let body = "{\"b\": 1,\n \"a\": [true]}";
    let mut same = req("r", "k1", body, 1.0);
    same.raw = Some(body.as_bytes().to_vec());
    let mut differs = req("r", "k2", "{\"a\":[true],\"b\":1}", 1.0);
    differs.raw = Some(body.as_bytes().to_vec());
    let mut quarantined = req("r", "k3", body, 1.0);
    quarantined.payload = None;
    quarantined.raw = Some(body.as_bytes().to_vec());
    quarantined.quarantine = Some(Quarantine {
        error_class: "BadPayload".into(),
    });
    let (same_event, _) = queued(&store.enqueue(&same).unwrap());
    let (differs_event, _) = queued(&store.enqueue(&differs).unwrap());
    let q_batch = match store.enqueue(&quarantined).unwrap() {
        EnqueueOutcome::Quarantined { batch_id, .. } => batch_id,
        other => panic!("expected quarantined, got {other:?}"),
    };
    let stored = |id: i64| -> (Option<Vec<u8>>, i64, i64) {
        store
            .conn
            .query_row(
                "SELECT raw, raw_is_payload, size FROM events WHERE id = ?1",
                [id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .unwrap()
    };
    let n = body.len() as i64;
    assert_eq!(stored(same_event), (None, 1, n));
    assert_eq!(
        stored(differs_event),
        (Some(body.as_bytes().to_vec()), 0, n)
    );
    let mut raws = Vec::new();
    store
        .export(&ExportFilter::default(), &mut |v| {
            if v["record"] == "event" {
                raws.push(v["raw_base64"].as_str().map(str::to_string));
            }
        })
        .unwrap();
    use base64::Engine as _;
    let b64 = Some(base64::engine::general_purpose::STANDARD.encode(body));
    assert_eq!(raws, vec![b64.clone(), b64.clone(), b64]);
    let replayed = store.quarantined_requests(q_batch).unwrap();
    assert_eq!(replayed[0].raw.as_deref(), Some(body.as_bytes()));
}

/// Issue 31: an enqueue's Idempotency-Key answers a repeat for `IDEMPOTENCY_KEEP_S`; the
/// retention pass then forgets it (and nothing else in meta), so the key works again.
fn retention_forgets_idempotency_keys_after_their_week() {
    let (_d, mut s) = temp_store();
    let day = 86_400.0;
    let first = s
        .enqueue_idempotent(&req("r", "k", "{}", 10.0), Some(("key-1", "fp")))
        .unwrap();
    assert!(matches!(first, Idempotent::Fresh(_)));
    let mut later = req("r", "k2", "{}", 5.0 * day);
    assert!(matches!(
        s.enqueue_idempotent(&later, Some(("key-1", "fp"))).unwrap(),
        Idempotent::Repeat(_)
    ));
    let rep = s.prune(6.0 * day, &Retention::default()).unwrap();
    assert_eq!(rep.idempotency_keys, 0, "a key younger than a week stays");
    let rep = s.prune(7.0 * day + 11.0, &Retention::default()).unwrap();
    assert_eq!(rep.idempotency_keys, 1);
    assert!(
        s.meta("instance_id").unwrap().is_some(),
        "other meta rows stay"
    );
    later.now = 7.0 * day + 12.0;
    assert!(matches!(
        s.enqueue_idempotent(&later, Some(("key-1", "other")))
            .unwrap(),
        Idempotent::Fresh(_)
    ));
}

/// A mark counts its attempt as spec 6.5 says, from the attempt row's probe flag: a probe's
/// success counts nothing, a batch-class failure of a plain attempt counts on the batch and
/// on its attempt row, a transport failure does not; a mark for an attempt the batch never
/// had is refused with nothing written.
fn marks_count_by_class_and_never_a_probe() {
    let (_d, mut s) = temp_store();
    let mut r = req("r", "k", "{}", 100.0);
    r.primary.window.max_events = 1;
    let (_, b) = queued(&s.enqueue(&r).unwrap());
    let probe = s
        .claim(
            b,
            "host:1",
            190.0,
            100.0,
            true,
            DeliveryId::per_attempt("d"),
        )
        .unwrap()
        .expect("claim won");
    let batch_class = Mark::Retry {
        klass: Klass::Batch,
        next_attempt_at: 101.0,
    };
    assert_eq!(
        s.mark(&report(&probe, 100.5, batch_class.clone())).unwrap(),
        MarkResult::Applied
    );
    let row = s.batch(b).unwrap();
    assert_eq!(
        (row.state.as_str(), row.attempts, row.next_attempt_at),
        ("retry", 0, Some(101.0)),
        "a probe never counts"
    );
    let plain = claim(&mut s, b, 102.0);
    assert_eq!(
        s.mark(&report(&plain, 102.5, batch_class)).unwrap(),
        MarkResult::Applied
    );
    assert_eq!(
        s.batch(b).unwrap().attempts,
        1,
        "a batch-class failure counts"
    );
    let transport = claim(&mut s, b, 103.0);
    let retry = Mark::Retry {
        klass: Klass::Transport,
        next_attempt_at: 104.0,
    };
    s.mark(&report(&transport, 103.5, retry)).unwrap();
    let delivered = claim(&mut s, b, 105.0);
    let mut ghost = report(
        &delivered,
        105.5,
        Mark::Dead {
            klass: Klass::Permanent,
        },
    );
    ghost.attempt_id = transport.attempt_id + 1000;
    assert!(matches!(s.mark(&ghost), Err(StoreError::NotFound(_))));
    assert_eq!(
        s.batch(b).unwrap().state.as_str(),
        "leased",
        "nothing was written"
    );
    let done = Mark::Delivered {
        result: Some("ok".into()),
        emits: vec![],
    };
    s.mark(&report(&delivered, 106.0, done)).unwrap();
    let row = s.batch(b).unwrap();
    assert_eq!(
        (
            row.state.as_str(),
            row.attempts,
            row.result.as_deref(),
            row.lease_owner
        ),
        ("delivered", 2, Some("ok"), None)
    );
    let counted: Vec<(bool, bool, Option<AttemptOutcome>)> = s
        .attempts(b)
        .unwrap()
        .into_iter()
        .map(|a| (a.probe, a.counted, a.outcome))
        .collect();
    assert_eq!(
        counted,
        vec![
            (true, false, Some(AttemptOutcome::Retry)),
            (false, true, Some(AttemptOutcome::Retry)),
            (false, false, Some(AttemptOutcome::Retry)),
            (false, true, Some(AttemptOutcome::Ok)),
        ]
    );
}

/// Several results of one destination, set up: a transport retry waiting on it (its id
/// first), then one sealed batch per key, each claimed at 100 (`probe`'s as a probe) and
/// `lost`'s lease ending at 120, recovered at 140 so that its result comes too late.
fn results_scene(
    s: &mut Store,
    keys: &[&str],
    lost: &str,
    probe: Option<&str>,
) -> (i64, Vec<i64>, Vec<Claim>) {
    let batch = |s: &mut Store, key: &str| {
        let mut r = req("r", key, "{}", 90.0);
        r.primary.window.max_events = 1;
        queued(&s.enqueue(&r).unwrap()).1
    };
    let waiting = batch(s, "waiting");
    let w = claim(s, waiting, 90.0);
    let transport = Mark::Retry {
        klass: Klass::Transport,
        next_attempt_at: 1000.0,
    };
    s.mark(&report(&w, 91.0, transport)).unwrap();
    let ids: Vec<i64> = keys.iter().map(|k| batch(s, k)).collect();
    let claims: Vec<Claim> = ids
        .iter()
        .zip(keys)
        .map(|(&id, &key)| {
            let until = if key == lost { 120.0 } else { 190.0 };
            s.claim(
                id,
                "host:1",
                until,
                100.0,
                Some(key) == probe,
                DeliveryId::per_attempt("d"),
            )
            .unwrap()
            .expect("claim won")
        })
        .collect();
    assert_eq!(s.recover_expired_leases(140.0, &[]).unwrap().len(), 1);
    (waiting, ids, claims)
}

/// Several results in one `record_results` call are recorded as one by one would record
/// them, whatever the backend groups into one statement (PostgreSQL marks runs of results
/// without emits together): each is decided on the row as the results before it left it, a
/// discarded one keeps neither its mark nor its row change, a recovered destination's
/// waiting retries are made due before the next result is marked (so a retry marked after
/// it keeps its own time), and an emit is enqueued with its mark.
fn several_results_in_one_call_are_recorded_as_one_by_one() {
    let (_d, mut s) = temp_store();
    let transport = |at: f64| Mark::Retry {
        klass: Klass::Transport,
        next_attempt_at: at,
    };
    let keys = ["a", "b", "f", "c", "d", "h", "e", "i"];
    // e's lease ends early and is recovered: its result comes too late.
    let (waiting, ids, claims) = results_scene(&mut s, &keys, "e", None);
    let delivered = || Mark::Delivered {
        result: None,
        emits: vec![],
    };
    let marks = [
        delivered(),
        delivered(),
        delivered(),
        transport(900.0),
        Mark::Dead {
            klass: Klass::Permanent,
        },
        Mark::Delivered {
            result: Some("with an emit".into()),
            emits: vec![req("r2", "emitted", "{}", 150.0)],
        },
        delivered(),
        delivered(),
    ];
    let mut seen = [0i64; 8];
    let names = ["http:r"; 8];
    let recorded = s
        .record_results(&names, |i, row, refused| {
            assert_eq!(refused, None);
            row.consecutive_failures += 1;
            seen[i] = row.consecutive_failures;
            Decision {
                report: report(&claims[i], 150.0, marks[i].clone()),
                recovered: keys[i] == "f",
            }
        })
        .unwrap();
    let results: Vec<(MarkResult, usize)> = recorded.iter().map(|r| (r.result, r.redue)).collect();
    use MarkResult::{Applied, Discarded};
    assert_eq!(
        results,
        vec![
            (Applied, 0),
            (Applied, 0),
            (Applied, 1),
            (Applied, 0),
            (Applied, 0),
            (Applied, 0),
            (Discarded, 0),
            (Applied, 0)
        ]
    );
    assert_eq!(
        seen,
        [1, 2, 3, 4, 5, 6, 7, 7],
        "each on the row the ones before left"
    );
    assert_eq!(s.destination("http:r").unwrap().consecutive_failures, 7);
    let w = s.batch(waiting).unwrap();
    assert_eq!(
        (w.state, w.next_attempt_at),
        (BatchState::Retry, Some(150.0))
    );
    let c = s.batch(ids[3]).unwrap();
    assert_eq!(
        (c.state, c.next_attempt_at),
        (BatchState::Retry, Some(900.0))
    );
    let states: Vec<(BatchState, i64)> = ids
        .iter()
        .map(|&id| {
            let b = s.batch(id).unwrap();
            (b.state, b.attempts)
        })
        .collect();
    assert_eq!(
        states,
        vec![
            (BatchState::Delivered, 1),
            (BatchState::Delivered, 1),
            (BatchState::Delivered, 1),
            (BatchState::Retry, 0),
            (BatchState::Dead, 0),
            (BatchState::Delivered, 1),
            (BatchState::Retry, 0),
            (BatchState::Delivered, 1),
        ]
    );
    assert_eq!(
        s.batch(ids[5]).unwrap().result.as_deref(),
        Some("with an emit")
    );
    let late = s.attempts(ids[6]).unwrap();
    assert_eq!(late[0].outcome, Some(AttemptOutcome::Discarded));
    // Every batch but the emit's is past open and sealed: the emit made one batch.
    let after = s.batch_counts().unwrap();
    let waiting_to_claim: i64 = after
        .iter()
        .filter(|(st, _)| matches!(st, BatchState::Open | BatchState::Sealed))
        .map(|(_, n)| n)
        .sum();
    assert_eq!(waiting_to_claim, 1, "{after:?}");
}

/// On PostgreSQL `record_results` writes several results without emits in one statement
/// when every one applies, and when one does not it rolls that statement back and records
/// them one by one (as it does at once when one recovers its destination): either way each
/// batch, attempt and destination row ends as recording each result alone leaves it (a
/// delivered result with its details, a probe, retries of two classes, a dead batch, a
/// recovered destination's waiting retry, a result that comes after its lease was lost).
fn results_written_at_once_are_written_as_one_by_one() {
    let keys = ["a", "b", "c", "d", "e", "f", "g"];
    let scene = |s: &mut Store| results_scene(s, &keys, "g", Some("c"));
    let reports = |claims: &[Claim]| -> Vec<AttemptReport> {
        let marks = [
            Mark::Delivered {
                result: Some("answer".into()),
                emits: vec![],
            },
            Mark::Dead {
                klass: Klass::Batch,
            },
            Mark::Retry {
                klass: Klass::Batch,
                next_attempt_at: 400.0,
            },
            Mark::Dead {
                klass: Klass::Permanent,
            },
            Mark::Retry {
                klass: Klass::Throttle,
                next_attempt_at: 500.0,
            },
            Mark::Delivered {
                result: None,
                emits: vec![],
            },
            Mark::Delivered {
                result: None,
                emits: vec![],
            },
        ];
        claims
            .iter()
            .zip(marks)
            .enumerate()
            .map(|(i, (c, mark))| AttemptReport {
                status: Some(200 + i as i64),
                error: (i != 2).then(|| format!("error {i}")),
                duration_ms: 10 + i as i64,
                delivery_id: (i == 0).then(|| "given".to_string()),
                events_delivered: Some(i as i64),
                failed_event_id: (i == 3).then_some(7),
                ..report(c, 150.0 + i as f64, mark)
            })
            .collect()
    };
    let decide = |reps: &[AttemptReport], i: usize, row: &mut DestinationRow| {
        row.consecutive_failures += 1;
        row.last_ok_at = Some(150.0 + i as f64);
        Decision {
            report: reps[i].clone(),
            recovered: i == 4,
        }
    };
    let before = super::marks::MARKED_AT_ONCE.with(|n| n.get());
    // Together: three in one call (at once on PostgreSQL); two where the second recovers
    // the destination (one by one, no statement sent); two where the second's lease was
    // lost (sent at once, rolled back, then one by one).
    let (d1, mut together) = temp_store();
    let (waiting, ids, claims) = scene(&mut together);
    let reps = reports(&claims);
    let mut results = Vec::new();
    for range in [0..3, 3..5, 5..7] {
        let names = vec!["http:r"; range.len()];
        let first = range.start;
        let recorded = together
            .record_results(&names, |i, row, _| decide(&reps, first + i, row))
            .unwrap();
        results.extend(recorded.into_iter().map(|r| (r.result, r.redue)));
    }
    let after = super::marks::MARKED_AT_ONCE.with(|n| n.get());
    let pg = usize::from(together.is_postgres());
    assert_eq!(
        (after.0 - before.0, after.1 - before.1),
        (2 * pg, pg),
        "PostgreSQL sends the first and the last call's statement and keeps the first's"
    );
    // Alone: one call per result.
    let (d2, mut alone) = temp_store();
    let (_, ids_alone, claims_alone) = scene(&mut alone);
    assert_eq!(ids, ids_alone);
    let reps_alone = reports(&claims_alone);
    let mut results_alone = Vec::new();
    for i in 0..7 {
        let recorded = alone
            .record_results(&["http:r"], |_, row, _| decide(&reps_alone, i, row))
            .unwrap();
        results_alone.extend(recorded.into_iter().map(|r| (r.result, r.redue)));
    }
    use MarkResult::{Applied, Discarded};
    assert_eq!(
        results,
        vec![
            (Applied, 0),
            (Applied, 0),
            (Applied, 0),
            (Applied, 0),
            (Applied, 2),
            (Applied, 0),
            (Discarded, 0)
        ]
    );
    assert_eq!(results, results_alone);
    for &id in ids.iter().chain([&waiting]) {
        assert_eq!(together.batch(id).unwrap(), alone.batch(id).unwrap());
        assert_eq!(together.attempts(id).unwrap(), alone.attempts(id).unwrap());
    }
    assert_eq!(
        together.destination("http:r").unwrap(),
        alone.destination("http:r").unwrap()
    );
    let first = together.batch(ids[0]).unwrap();
    assert_eq!(
        (
            first.state,
            first.result.as_deref(),
            first.attempts,
            first.last_error
        ),
        (BatchState::Delivered, Some("answer"), 1, None)
    );
    let dead = together.batch(ids[1]).unwrap();
    assert_eq!(
        (dead.state, dead.attempts, dead.last_error.as_deref()),
        (BatchState::Dead, 1, Some("error 1"))
    );
    let probe = together.attempts(ids[2]).unwrap();
    assert_eq!((probe[0].probe, probe[0].counted), (true, false));
    assert_eq!(
        together.batch(waiting).unwrap().next_attempt_at,
        Some(154.0),
        "the recovered destination's retry is due"
    );
    drop((d1, d2));
}

crate::store::testutil::both_backends!(
    several_results_in_one_call_are_recorded_as_one_by_one,
    results_written_at_once_are_written_as_one_by_one,
    marks_count_by_class_and_never_a_probe,
    events_join_the_open_batch_of_their_group_in_commit_order,
    max_events_seals_in_the_enqueue_transaction,
    max_bytes_pre_join_seal_keeps_the_bound,
    readiness_truth_table,
    content_hash_is_stable_across_attempts_and_recomputed_by_exclude_and_split,
    split_at_an_event_and_by_bytes,
    candidates_are_fifo_per_group_and_parallel_across_groups,
    candidates_on_a_deep_backlog_of_few_keys_are_each_groups_head_oldest_first,
    claim_is_won_once_and_marks_are_fenced,
    recovery_never_touches_a_live_workers_lease,
    emits_are_committed_with_the_mark,
    dedup_duplicate_dead_replay_and_dropped_repoint,
    tee_copies_are_placed_in_one_transaction_primary_first,
    group_commit_isolates_each_request_in_its_savepoint,
    a_read_scope_ends_so_the_next_write_can_begin,
    quarantine_stores_the_raw_request_and_replay_reclassifies,
    operator_retry_drop_pause_resume_and_redue,
    retention_prunes_what_aged_out_and_never_dead,
    retention_bounds_every_transaction_by_rows_even_for_one_batch_larger_than_a_transaction,
    results_decide_on_the_destination_row_inside_their_transaction_and_a_discarded_one_keeps_it,
    a_recovered_destination_makes_its_transport_and_throttle_retries_due_and_nothing_else,
    throttled_since_is_the_start_of_the_batchs_throttle_run_bounded_by_the_last_success,
    a_raw_body_identical_to_the_payload_is_stored_once_and_read_back_whole,
    retention_forgets_idempotency_keys_after_their_week,
    a_ticks_claims_commit_with_it_and_its_reads_see_its_seal,
);

/// A dispatcher tick as the engine runs it: its claims' reads asked ahead
/// (`read_ahead_for_claims`), a seal, the walk, the gate's row, then the claims and the
/// tick's commit together (`claim_many_and_commit_tick`; on PostgreSQL the reads go with
/// the seal's statements and the COMMIT with the claims'). The walk sees the batch the tick
/// itself sealed (what was read ahead before the seal is read again), the claims and the
/// seal are committed together (another session sees them), and the next tick begins.
fn a_ticks_claims_commit_with_it_and_its_reads_see_its_seal() {
    let (d, mut s) = temp_store();
    let mut sealed = req("r", "a", "{}", 100.0);
    sealed.primary.window.max_events = 1;
    let a = queued(&s.enqueue(&sealed).unwrap()).1;
    let mut ready = req("r", "b", "{}", 100.0);
    ready.primary.window = window(0.0, 0.0, 500, 786_432);
    let b = queued(&s.enqueue(&ready).unwrap()).1;
    assert_eq!(s.batch(b).unwrap().state, BatchState::Open);
    s.begin_tick().unwrap();
    s.read_ahead_for_claims(110.0, 16, &["http:r".to_string()])
        .unwrap();
    assert_eq!(s.seal_ready(110.0).unwrap(), vec![b]);
    let prefix = s.candidate_prefix(110.0, 16).unwrap();
    let heads: Vec<i64> = prefix.heads.iter().map(|c| c.batch_id).collect();
    assert_eq!(heads, vec![a, b], "the walk sees the batch the tick sealed");
    assert_eq!(s.destination("http:r").unwrap().name, "http:r");
    let out = s
        .claim_many_and_commit_tick("host:1", 110.0, &claim_requests(&[a, b], |_| false))
        .unwrap();
    assert!(out.claims.iter().all(Option::is_some), "{out:?}");
    assert!(!s.in_transaction(), "the tick's transaction is committed");
    let other = crate::store::testutil::reopen(&d, &s, std::time::Duration::from_secs(5));
    for id in [a, b] {
        let row = other.batch(id).unwrap();
        assert_eq!(row.state, BatchState::Leased, "batch {id}");
        assert!(row.content_hash.is_some(), "batch {id}");
    }
    // With nothing asked ahead and nothing to seal, the next tick reads as before.
    s.begin_tick().unwrap();
    s.read_ahead_for_claims(120.0, 16, &["http:r".to_string()])
        .unwrap();
    assert!(s.seal_ready(120.0).unwrap().is_empty());
    assert!(s.candidate_prefix(120.0, 16).unwrap().heads.is_empty());
    s.commit_tick().unwrap();
    assert!(!s.in_transaction());
}

/// A session of a migrated PostgreSQL spool on a cluster of its own (kept alive by the
/// returned `Cluster`), or `None` after the one skip rule.
fn pg_session() -> Option<(crate::store::test_pg::Cluster, Store)> {
    let (cluster, _migrated) = super::testutil::temp_pg()?;
    let s = session_of(&cluster);
    Some((cluster, s))
}

/// Another session of `pg_session`'s spool.
fn session_of(cluster: &crate::store::test_pg::Cluster) -> Store {
    let busy = std::time::Duration::from_secs(5);
    Store::open_pg(&cluster.url("spool"), Role::Reader, busy).unwrap()
}

/// `pg_session` and another session of its spool, after `setup` (statements without
/// parameters) ran on the first.
fn two_pg_sessions(setup: &str) -> Option<(crate::store::test_pg::Cluster, Store, Store)> {
    let (cluster, s) = pg_session()?;
    let other = session_of(&cluster);
    s.conn.execute_batch(setup).unwrap();
    Some((cluster, s, other))
}

/// A read sent ahead (`Connection::read_ahead`) goes after the next statement and answers
/// the same read later without a round trip: what another session commits in between is
/// not in its answer (a read sent then would see it). Each statement that runs before it is
/// used sends it again after itself, so its answer is never older than the last statement
/// (this session's own insert is in it). COMMIT forgets it.
#[test]
fn a_read_sent_ahead_answers_without_a_round_trip_as_of_the_last_statement() {
    let Some((_cluster, s, other)) =
        two_pg_sessions("CREATE TABLE ahead (n bigint); INSERT INTO ahead VALUES (1)")
    else {
        return;
    };
    let count = |st: &Store| -> i64 {
        st.conn
            .query_row("SELECT count(*) FROM ahead", (), |r| r.get(0))
            .unwrap()
    };
    let insert = |st: &Store, n: i64| {
        st.conn
            .execute("INSERT INTO ahead VALUES (?1)", [n])
            .unwrap();
    };
    s.conn.execute("BEGIN", ()).unwrap();
    assert!(
        s.conn
            .read_ahead("SELECT count(*) FROM ahead", vec![], "", "")
            .unwrap()
    );
    let one: i64 = s.conn.query_row("SELECT 1", (), |r| r.get(0)).unwrap();
    assert_eq!(one, 1);
    insert(&other, 2);
    assert_eq!(count(&s), 1, "answered by the read that went with SELECT 1");
    assert_eq!(count(&s), 2, "read now: the other session's row is in");
    // A statement before it is used sends it again: its answer is as of that statement.
    s.conn
        .read_ahead("SELECT count(*) FROM ahead", vec![], "", "")
        .unwrap();
    let _: i64 = s.conn.query_row("SELECT 1", (), |r| r.get(0)).unwrap();
    insert(&s, 3);
    insert(&other, 4);
    assert_eq!(count(&s), 3, "as of this session's insert, not of SELECT 1");
    assert_eq!(count(&s), 4);
    // COMMIT forgets it; outside a transaction nothing is sent ahead.
    s.conn
        .read_ahead("SELECT count(*) FROM ahead", vec![], "", "")
        .unwrap();
    s.conn.execute("COMMIT", ()).unwrap();
    insert(&other, 5);
    assert_eq!(count(&s), 5);
    assert!(
        !s.conn
            .read_ahead("SELECT count(*) FROM ahead", vec![], "", "")
            .unwrap()
    );
}

/// A COMMIT sent with the next statement (`Connection::commit_with_next`) commits the
/// transaction with it, or rolls it back when that statement fails; either way the
/// transaction is over and the session's next statements run as usual.
#[test]
fn a_commit_sent_with_a_statement_commits_or_rolls_back_with_it() {
    let Some((_cluster, s, other)) =
        two_pg_sessions("CREATE TABLE committed (n bigint, small integer)")
    else {
        return;
    };
    let rows = |st: &Store| -> Vec<i64> {
        let mut stmt = st
            .conn
            .prepare("SELECT n FROM committed ORDER BY n")
            .unwrap();
        stmt.query_map((), |r| r.get(0))
            .unwrap()
            .collect::<rusqlite::Result<Vec<i64>>>()
            .unwrap()
    };
    // A transaction with `n` written, its COMMIT asked to go with the next statement.
    let open_with = |n: i64| {
        s.conn.execute("BEGIN", ()).unwrap();
        s.conn
            .execute("INSERT INTO committed VALUES (?1)", [n])
            .unwrap();
        s.conn.commit_with_next(true);
    };
    open_with(1);
    s.conn
        .execute("INSERT INTO committed VALUES (2)", ())
        .unwrap();
    assert!(s.conn.is_autocommit());
    assert_eq!(rows(&other), vec![1, 2], "committed with the second insert");
    open_with(3);
    let failed = s
        .conn
        .query_row("SELECT 1 / (n - n) FROM committed LIMIT 1", (), |r| {
            r.get::<_, i64>(0)
        });
    assert!(failed.is_err());
    assert!(s.conn.is_autocommit());
    assert_eq!(
        rows(&other),
        vec![1, 2],
        "rolled back with the failed statement"
    );
    assert_eq!(rows(&s), vec![1, 2], "the session goes on");
    // `n` written in the open transaction, which that did not commit, then rolled back.
    let write_then_roll_back = |n: i64| {
        s.conn
            .execute("INSERT INTO committed VALUES (?1)", [n])
            .unwrap();
        assert!(!s.conn.is_autocommit(), "{n} committed nothing");
        s.conn.execute("ROLLBACK", ()).unwrap();
        assert_eq!(rows(&other), vec![1, 2]);
    };
    // Asked for outside a transaction, or taken back before a statement: nothing commits.
    assert!(!s.conn.commit_with_next(true));
    open_with(4);
    assert!(s.conn.commit_with_next(false), "it was pending");
    write_then_roll_back(5);
    // A statement refused before it is sent (a value its column cannot hold) takes no
    // COMMIT with it: the transaction is still open, and rolls back.
    open_with(6);
    let refused = s
        .conn
        .execute("INSERT INTO committed VALUES (7, ?1)", [1i64 << 40]);
    assert!(refused.is_err());
    assert!(!s.conn.is_autocommit(), "the transaction is still open");
    s.conn.execute("ROLLBACK", ()).unwrap();
    assert_eq!(rows(&other), vec![1, 2], "6 was not committed");
    // A ROLLBACK drops a COMMIT no statement took: the next transaction is not committed
    // by its first statement.
    open_with(8);
    s.conn.execute("ROLLBACK", ()).unwrap();
    s.conn.execute("BEGIN", ()).unwrap();
    write_then_roll_back(9);
}

/// The recorder's session settings (`become_recorder`) are the session's: a first
/// transaction that rolls back does not take them with it.
#[test]
fn the_recorders_session_settings_outlive_a_rolled_back_first_transaction() {
    let Some((_cluster, s)) = pg_session() else {
        return;
    };
    assert!(s.become_recorder());
    s.conn.execute("BEGIN", ()).unwrap();
    let one: i64 = s.conn.query_row("SELECT 1", (), |r| r.get(0)).unwrap();
    assert_eq!(one, 1);
    s.conn.execute("ROLLBACK", ()).unwrap();
    let settings: (String, String) = s
        .conn
        .query_row(
            "SELECT current_setting('enable_seqscan'), current_setting('enable_hashjoin')",
            (),
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(settings, ("off".to_string(), "off".to_string()));
}

/// The intake writer's session plans on indexes (`Store::plan_on_indexes`), and so does the
/// session made again after its session was lost, which has its lock timeout again too;
/// another session of the spool does not plan on indexes.
#[test]
fn the_intake_writers_session_plans_on_indexes_also_after_it_was_made_again() {
    let Some((cluster, _migrated)) = super::testutil::temp_pg() else {
        return;
    };
    // temp_pg's database, migrated.
    let url = cluster.url("spool");
    let busy = std::time::Duration::from_secs(5);
    let writer = Store::open_pg(&url, Role::Reader, busy).unwrap();
    let other = Store::open_pg(&url, Role::Reader, busy).unwrap();
    let seqscan = |s: &Store| -> rusqlite::Result<(String, i64)> {
        s.conn.query_row(
            "SELECT current_setting('enable_seqscan'), pg_backend_pid()",
            (),
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
    };
    assert_eq!(seqscan(&writer).unwrap().0, "on");
    writer.plan_on_indexes();
    let (setting, pid) = seqscan(&writer).unwrap();
    assert_eq!(setting, "off");
    assert_eq!(seqscan(&other).unwrap().0, "on");
    // The server ends the writer's session (as a restart would); the store makes another.
    let ended: bool = other
        .conn
        .query_row("SELECT pg_terminate_backend(?1)", [pid], |r| r.get(0))
        .unwrap();
    assert!(ended);
    let mut again = None;
    for _ in 0..50 {
        if let Ok(got) = seqscan(&writer) {
            again = Some(got);
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let (setting, new_pid) = again.expect("the writer's session was made again");
    assert_ne!(new_pid, pid);
    assert_eq!(setting, "off");
    // Its lock timeout (the busy timeout) came back with it too.
    let lock_timeout: String = writer
        .conn
        .query_row("SELECT current_setting('lock_timeout')", (), |r| r.get(0))
        .unwrap();
    assert_eq!(lock_timeout, "5s");
}

/// PostgreSQL schema 5: an attempt's mark (an UPDATE of columns no index holds) is a
/// heap-only update even among attempt rows written one after the other, because the
/// table's pages are filled to 70 % only; on pages filled whole it would add an entry to
/// each of the table's indexes. The transaction's own statistics say which it was.
#[test]
fn a_mark_of_an_attempt_among_many_is_a_heap_only_update() {
    let Some((_cluster, s)) = pg_session() else {
        return;
    };
    s.conn
        .execute_batch(
            "INSERT INTO attempts (batch_id, n, destination, started_at)
             SELECT g, 1, 'http:r', 100 FROM generate_series(1, 2000) g",
        )
        .unwrap();
    s.conn.execute("BEGIN", ()).unwrap();
    let changed = s
        .conn
        .execute(
            "UPDATE attempts SET finished_at = 101, outcome = 'ok', status = 200, duration_ms = 3
             WHERE batch_id = 1000",
            (),
        )
        .unwrap();
    assert_eq!(changed, 1);
    let (updated, hot): (i64, i64) = s
        .conn
        .query_row(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables
             WHERE relname = 'attempts'",
            (),
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    s.conn.execute("COMMIT", ()).unwrap();
    assert_eq!((updated, hot), (1, 1), "the mark's update is heap-only");
}

/// Another session of `cluster`'s spool in the middle of an intake's join of open batch
/// `b`, as both enqueue paths do it in one transaction (lock the open batch, insert the
/// event, count it and forget its `open_hash`), not committed.
fn intake_joining(cluster: &crate::store::test_pg::Cluster, b: i64) -> Store {
    let intake = session_of(cluster);
    intake
        .conn
        .execute_batch(&format!(
            "BEGIN;
             SELECT id FROM batches WHERE id = {b} AND state = 'open' FOR UPDATE;
             INSERT INTO events (source, route, batch_id, received_at, payload, size)
                 VALUES ('test', 'r', {b}, 101, '{{\"n\":2}}', 7);
             UPDATE batches SET count = count + 1, bytes = bytes + 7, last_at = 101,
                                open_hash = NULL
                 WHERE id = {b};"
        ))
        .unwrap();
    intake
}

/// Wait until a session of `cluster`'s spool waits for a lock (the statement under test
/// has started and waits for the intake's), asked from a session of its own: a
/// transaction reads pg_stat_activity once.
fn until_a_session_waits_for_a_lock(cluster: &crate::store::test_pg::Cluster) {
    let watcher = session_of(cluster);
    for _ in 0..200 {
        let waiting: i64 = watcher
            .conn
            .query_row(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE wait_event_type = 'Lock' AND datname = current_database()",
                (),
                |r| r.get(0),
            )
            .unwrap();
        if waiting > 0 {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    panic!("no session waited for the intake's lock within 10 s");
}

/// The open batch of one event `{"n":1}` on an immediate route (route r, key k, at 100):
/// the intake stored its `open_hash`.
fn one_immediate_event(s: &mut Store) -> i64 {
    let mut first = req("r", "k", "{\"n\":1}", 100.0);
    first.primary.window = window(0.0, 0.0, 500, 786_432);
    queued(&s.enqueue(&first).unwrap()).1
}

/// PostgreSQL schema 6: a seal whose lock waits for an intake joining the batch hashes the
/// event that intake commits. The seal runs while the intake's join is open, waits for the
/// lock, and must read the batch's events as of then (a join as of the statement's start
/// missed the late event, and the stored hash covered one event of two). Schema 7: the
/// batch was opened on an immediate route with its `open_hash`, which the join sets back to
/// NULL; the seal must see the row as its lock found it (with the snapshot's `open_hash` it
/// stored the hash of the first event alone). SQLite has one writer at a time, so the seal
/// cannot start inside an intake's transaction there.
#[test]
fn a_seal_that_waits_for_a_joining_intake_hashes_the_event_it_committed() {
    let Some((cluster, mut s)) = pg_session() else {
        return;
    };
    let b = one_immediate_event(&mut s);
    let intake = intake_joining(&cluster, b);
    let seal = std::thread::spawn(move || {
        let sealed = s.seal_ready(102.0).unwrap();
        (s, sealed)
    });
    until_a_session_waits_for_a_lock(&cluster);
    assert!(!seal.is_finished(), "the seal waits for the intake's lock");
    intake.conn.execute_batch("COMMIT").unwrap();
    let (s, sealed) = seal.join().unwrap();
    assert_eq!(sealed, vec![b]);
    let row = s.batch(b).unwrap();
    assert_eq!(row.state, BatchState::Sealed);
    let events = super::delivery::canonical_events(&s.conn, b).unwrap();
    assert_eq!(events.len(), 2, "both events are the batch's");
    assert_eq!(
        row.content_hash.as_deref(),
        Some(super::delivery::hash_tx(&s.conn, b).unwrap().as_str()),
        "the stored hash covers both events"
    );
}

/// PostgreSQL schema 7: the intake that opens a batch of an immediate route stores the hash
/// of its events (`open_hash`), and the seal stores that hash without reading the events
/// back; a join or an exclude forgets it, and a batch with a window never gets one.
#[test]
fn an_immediate_batch_is_sealed_with_the_hash_its_intake_stored() {
    let Some((_cluster, mut s)) = pg_session() else {
        return;
    };
    let open_hash = |s: &Store, b: i64| -> Option<String> {
        s.conn
            .query_row("SELECT open_hash FROM batches WHERE id = ?1", [b], |r| {
                r.get(0)
            })
            .unwrap()
    };
    let immediate = |key: &str, payload: &str, now: f64| {
        let mut r = req("r", key, payload, now);
        r.primary.window = window(0.0, 0.0, 500, 786_432);
        r
    };
    // One event: its hash, as a seal would compute it from the stored event.
    let alone = queued(&s.enqueue(&immediate("alone", "{\"n\":1}", 100.0)).unwrap()).1;
    let stored = open_hash(&s, alone).expect("the intake stored the batch's hash");
    assert_eq!(stored, super::delivery::hash_tx(&s.conn, alone).unwrap());
    // Two in one group: both are the intake's, so it knows their hash too.
    let pair = s
        .enqueue_many(&[
            immediate("pair", "{\"n\":1}", 100.0),
            immediate("pair", "{\"n\":2}", 100.0),
        ])
        .unwrap();
    let pair_b = queued(pair[0].as_ref().unwrap()).1;
    assert_eq!(queued(pair[1].as_ref().unwrap()).1, pair_b, "one batch");
    assert_eq!(
        open_hash(&s, pair_b).as_deref(),
        Some(super::delivery::hash_tx(&s.conn, pair_b).unwrap().as_str())
    );
    // A join in a later group forgets it.
    let joined = queued(&s.enqueue(&immediate("joined", "{\"n\":1}", 100.0)).unwrap()).1;
    assert!(open_hash(&s, joined).is_some());
    let again = queued(&s.enqueue(&immediate("joined", "{\"n\":2}", 100.5)).unwrap()).1;
    assert_eq!(again, joined, "the second event joined the open batch");
    assert_eq!(open_hash(&s, joined), None, "a join forgets the hash");
    // A batch with a window gets none.
    let windowed = queued(&s.enqueue(&req("r", "windowed", "{}", 100.0)).unwrap()).1;
    assert_eq!(open_hash(&s, windowed), None);
    // An exclude forgets it (planted on a batch of two, since excluding the only event of
    // a batch is refused).
    s.conn
        .execute(
            "UPDATE batches SET open_hash = 'sha256:planted' WHERE id = ?1",
            [pair_b],
        )
        .unwrap();
    let first_of_pair = queued(pair[0].as_ref().unwrap()).0;
    s.exclude(pair_b, &[first_of_pair], 100.8).unwrap();
    assert_eq!(open_hash(&s, pair_b), None, "an exclude forgets the hash");
    // The seal takes the stored hash as it is: planted on `alone`, it is what the seal
    // stores (so the seal did not read and hash the events); the others are hashed.
    s.conn
        .execute(
            "UPDATE batches SET open_hash = 'sha256:planted' WHERE id = ?1",
            [alone],
        )
        .unwrap();
    assert_eq!(
        s.check_invariants().unwrap(),
        vec![format!(
            "batch {alone}: open_hash does not match its events"
        )]
    );
    let mut sealed = s.seal_ready(101.0).unwrap();
    sealed.sort_unstable();
    assert_eq!(sealed, vec![alone, pair_b, joined]);
    assert_eq!(
        s.batch(alone).unwrap().content_hash.as_deref(),
        Some("sha256:planted")
    );
    for b in [pair_b, joined] {
        assert_eq!(
            s.batch(b).unwrap().content_hash.as_deref(),
            Some(super::delivery::hash_tx(&s.conn, b).unwrap().as_str()),
            "batch {b}: hashed from its events"
        );
    }
    assert_eq!(s.batch(windowed).unwrap().state, BatchState::Open);
    // The planted hash is what the invariant check reports, and only it.
    let bad = s.check_invariants().unwrap();
    assert_eq!(
        bad,
        vec![format!(
            "batch {alone}: content_hash does not match its events"
        )]
    );
}

/// PostgreSQL schema 7's trigger: a writer that does not know `open_hash` (a binary older
/// than the schema, still running on another host during an upgrade) joins an immediate
/// batch as it always did, writing count, bytes and last_at but not open_hash; the hash is
/// forgotten all the same, and the seal hashes both events (with the stale hash it stored
/// the first event's alone).
#[test]
fn a_join_by_a_writer_that_does_not_know_open_hash_forgets_it_too() {
    let Some((_cluster, mut s)) = pg_session() else {
        return;
    };
    let b = one_immediate_event(&mut s);
    let known = |s: &Store| -> bool {
        s.conn
            .query_row(
                "SELECT open_hash IS NOT NULL FROM batches WHERE id = ?1",
                [b],
                |r| r.get(0),
            )
            .unwrap()
    };
    assert!(known(&s), "the intake stored the hash");
    s.conn
        .execute_batch(&format!(
            "BEGIN;
             INSERT INTO events (source, route, batch_id, received_at, payload, size)
                 VALUES ('test', 'r', {b}, 100.5, '{{\"n\":2}}', 7);
             UPDATE batches SET count = count + 1, bytes = bytes + 7, last_at = 100.5
                 WHERE id = {b} AND state = 'open';
             COMMIT;"
        ))
        .unwrap();
    assert!(!known(&s), "the join forgot the hash");
    assert_eq!(s.seal_ready(101.0).unwrap(), vec![b]);
    assert_eq!(
        s.batch(b).unwrap().content_hash.as_deref(),
        Some(super::delivery::hash_tx(&s.conn, b).unwrap().as_str()),
        "the stored hash covers both events"
    );
}

/// An exclude from an open batch that an intake is joining recounts the batch after the
/// intake's commit: its count and bytes are those of the events left, the intake's among
/// them (recounted as of the statement's start they were not: count 1 of 2). SQLite: one
/// writer at a time, as above.
#[test]
fn an_exclude_beside_a_joining_intake_counts_the_event_it_committed() {
    let Some((cluster, mut s)) = pg_session() else {
        return;
    };
    let (gone, b) = queued(&s.enqueue(&req("r", "k", "{\"n\":0}", 100.0)).unwrap());
    let kept = queued(&s.enqueue(&req("r", "k", "{\"n\":1}", 100.5)).unwrap());
    assert_eq!(kept.1, b, "one open batch");
    let intake = intake_joining(&cluster, b);
    let exclude = std::thread::spawn(move || {
        s.exclude(b, &[gone], 102.0).unwrap();
        s
    });
    until_a_session_waits_for_a_lock(&cluster);
    assert!(
        !exclude.is_finished(),
        "the exclude waits for the intake's lock"
    );
    intake.conn.execute_batch("COMMIT").unwrap();
    let s = exclude.join().unwrap();
    let row = s.batch(b).unwrap();
    let (count, bytes): (i64, i64) = s
        .conn
        .query_row(
            "SELECT count(*), sum(size) FROM events WHERE batch_id = ?1 AND excluded_at IS NULL",
            [b],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(count, 2, "the kept event and the intake's");
    assert_eq!((row.count, row.bytes), (count, bytes));
}

/// The intake writer's session keeps one plan per prepared statement (`plan_on_indexes`):
/// PostgreSQL planned a group's dedup lookup and its draw of ids again at every group
/// (custom plans), which cost more than running them. Shown by the session's own prepared
/// statements after groups of one request each with a dedup id.
#[test]
fn the_intake_writers_session_plans_the_dedup_lookup_and_the_id_draw_once() {
    let Some((_cluster, mut writer)) = pg_session() else {
        return;
    };
    writer.plan_on_indexes();
    for i in 0..8 {
        let mut r = req("r", &format!("k{i}"), "{}", 100.0 + f64::from(i));
        r.dedup_id = Some(format!("d{i}"));
        let out = writer.enqueue_many(&[r]).unwrap();
        assert!(out[0].as_ref().unwrap().is_new());
    }
    let plans = |needle: &str| -> (i64, i64) {
        writer
            .conn
            .query_row(
                "SELECT generic_plans, custom_plans FROM pg_prepared_statements
                 WHERE statement LIKE '%' || ?1 || '%'",
                [needle],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap()
    };
    for needle in ["FROM dedup", "nextval('events_id_seq')"] {
        let (generic, custom) = plans(needle);
        assert_eq!(custom, 0, "{needle}: planned once, not at every group");
        assert!(generic >= 8, "{needle}: {generic} runs of its one plan");
    }
}

/// A wake-up's tick on PostgreSQL in one round trip (`seal_and_claim_fast`): the seal's find
/// seals what its intake hashed, then the walk's first heads are claimed for the gates the
/// dispatcher passes, as `choose` would claim them, and the transaction commits. It stops
/// at the first head it may not claim (its destination has no gate, its cap is used, or
/// its row no longer reads as the dispatcher read it) and says so (`more`); it never claims
/// a batch behind its group's head; a ready batch it could not seal is left open (`reseal`).
#[test]
fn a_fast_tick_seals_and_claims_the_heads_its_gates_allow_and_no_more() {
    use crate::destinations::{Idempotency, batch_delivery_id_prefix};
    let Some((_cluster, mut s)) = pg_session() else {
        return;
    };
    let immediate = |route: &str, key: &str, now: f64| {
        let mut r = req(route, key, "{\"n\":1}", now);
        r.primary.window = window(0.0, 0.0, 500, 786_432);
        r
    };
    let gate = |destination: &str, cap: i64, per_attempt: bool, retry_after_until| FastGate {
        destination: destination.into(),
        cap,
        lease_until: 500.0,
        id_prefix: batch_delivery_id_prefix("inst"),
        per_attempt,
        retry_after_until,
    };
    let fast = |s: &mut Store, now: f64, gates: &[FastGate]| {
        s.begin_tick().unwrap();
        let t = s.seal_and_claim_fast(now, 16, gates, 4, "own").unwrap();
        assert!(!s.in_transaction(), "the COMMIT went with it");
        t
    };
    let claimed = |t: &FastTick| -> Vec<i64> { t.claims.iter().map(|(c, _)| c.batch_id).collect() };

    // One immediate batch, its gate open: sealed with its intake's hash and claimed.
    let a1 = queued(&s.enqueue(&immediate("a", "k1", 100.0)).unwrap()).1;
    let t = fast(&mut s, 101.0, &[gate("http:a", 4, false, None)]);
    assert_eq!(t.sealed, vec![a1]);
    assert!(!t.reseal && !t.more, "{t:?}");
    let (c, destination) = &t.claims[0];
    assert_eq!(
        (c.batch_id, destination.as_str(), c.attempt_n),
        (a1, "http:a", 1)
    );
    assert_eq!(c.lease_owner, format!("own:{}", c.attempt_id));
    assert_eq!(c.lease_until, 500.0);
    assert_eq!(t.read[&a1].1.len(), 1, "the batch's event read with it");
    let row = s.batch(a1).unwrap();
    assert_eq!(row.state, BatchState::Leased);
    assert_eq!(
        row.content_hash.as_deref(),
        Some(super::delivery::hash_tx(&s.conn, a1).unwrap().as_str())
    );
    let attempts = s.attempts(a1).unwrap();
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0].id, c.attempt_id);
    assert_eq!(
        attempts[0].delivery_id.as_deref(),
        Some(
            Idempotency::PerBatch
                .id_for("inst", a1, c.attempt_id)
                .as_str()
        )
    );

    // Three heads, a's gate with room for one: the first only; b's head after a's second
    // is not claimed either (`choose` claims in the walk's order).
    let a2 = queued(&s.enqueue(&immediate("a", "k2", 110.0)).unwrap()).1;
    let a3 = queued(&s.enqueue(&immediate("a", "k3", 111.0)).unwrap()).1;
    let b1 = queued(&s.enqueue(&immediate("b", "k4", 112.0)).unwrap()).1;
    let t = fast(
        &mut s,
        113.0,
        &[
            gate("http:a", 1, false, None),
            gate("http:b", 4, false, None),
        ],
    );
    assert_eq!(t.sealed, vec![a2, a3, b1]);
    assert_eq!(claimed(&t), vec![a2]);
    assert!(t.more, "heads are left");
    // A destination without a gate ends it at its first head.
    let t = fast(&mut s, 114.0, &[gate("http:b", 4, false, None)]);
    assert!(claimed(&t).is_empty() && t.more, "{t:?}");
    // Room for both: a's ids per attempt.
    let t = fast(
        &mut s,
        115.0,
        &[
            gate("http:a", 4, true, None),
            gate("http:b", 4, false, None),
        ],
    );
    assert_eq!(claimed(&t), vec![a3, b1]);
    assert!(!t.more, "{t:?}");
    let (c3, _) = &t.claims[0];
    assert_eq!(
        s.attempts(a3).unwrap()[0].delivery_id.as_deref(),
        Some(
            Idempotency::PerAttempt
                .id_for("inst", a3, c3.attempt_id)
                .as_str()
        )
    );

    // A gate read before the row changed: paused since, nothing is claimed.
    let a4 = queued(&s.enqueue(&immediate("a", "k5", 120.0)).unwrap()).1;
    s.update_destination("http:a", |r| r.state = crate::vocab::BreakerState::Paused)
        .unwrap();
    let t = fast(&mut s, 121.0, &[gate("http:a", 4, false, None)]);
    assert_eq!(t.sealed, vec![a4]);
    assert!(claimed(&t).is_empty() && t.more, "{t:?}");
    assert_eq!(s.batch(a4).unwrap().state, BatchState::Sealed);
    // Closed again with a Retry-After that has passed: a gate read with another one does
    // not claim; one read with this one does.
    s.update_destination("http:a", |r| {
        r.state = crate::vocab::BreakerState::Closed;
        r.retry_after_until = Some(90.0);
    })
    .unwrap();
    let t = fast(&mut s, 122.0, &[gate("http:a", 4, false, None)]);
    assert!(claimed(&t).is_empty(), "{t:?}");
    let t = fast(&mut s, 123.0, &[gate("http:a", 4, false, Some(90.0))]);
    assert_eq!(claimed(&t), vec![a4]);

    // A batch behind its group's leased head is no head: not claimed, and nothing more.
    let behind = queued(&s.enqueue(&immediate("a", "k1", 130.0)).unwrap()).1;
    assert_ne!(behind, a1);
    let t = fast(&mut s, 131.0, &[gate("http:a", 4, false, Some(90.0))]);
    assert_eq!(t.sealed, vec![behind]);
    assert!(claimed(&t).is_empty() && !t.more, "{t:?}");
    assert_eq!(s.batch(behind).unwrap().state, BatchState::Sealed);

    // A ready batch with a window (its events not hashed by its intake) is left open.
    let windowed = queued(&s.enqueue(&req("w", "k", "{}", 140.0)).unwrap()).1;
    let t = fast(&mut s, 1000.0, &[gate("http:a", 4, false, Some(90.0))]);
    assert!(t.reseal && t.sealed.is_empty(), "{t:?}");
    assert_eq!(s.batch(windowed).unwrap().state, BatchState::Open);
    assert_eq!(s.seal_ready(1000.0).unwrap(), vec![windowed]);
}

/// `seal_and_claim_fast` claims nothing while a ready batch it could not seal (its events
/// must be hashed) is still open: sealed by the seal after it, that batch may be older than
/// the heads, and `choose` gives it the first slot. It claims no more heads than slots are
/// free, and says there may be more when its walk is not known to hold every head.
#[test]
fn a_fast_tick_leaves_a_slot_to_an_older_unsealed_batch_and_keeps_to_its_limits() {
    use crate::destinations::batch_delivery_id_prefix;
    let Some((_cluster, mut s)) = pg_session() else {
        return;
    };
    let immediate = |key: &str, now: f64| {
        let mut r = req("a", key, "{\"n\":1}", now);
        r.primary.window = window(0.0, 0.0, 500, 786_432);
        r
    };
    let gate = FastGate {
        destination: "http:a".into(),
        cap: 4,
        lease_until: 500.0,
        id_prefix: batch_delivery_id_prefix("inst"),
        per_attempt: false,
        retry_after_until: None,
    };
    let fast = |s: &mut Store, now: f64, limit: usize, free: usize| {
        s.begin_tick().unwrap();
        let t = s
            .seal_and_claim_fast(now, limit, std::slice::from_ref(&gate), free, "own")
            .unwrap();
        assert!(!s.in_transaction());
        t
    };
    let claimed = |t: &FastTick| -> Vec<i64> { t.claims.iter().map(|(c, _)| c.batch_id).collect() };

    // An older batch with a window (ready at 200), a younger immediate one: none claimed.
    let older = queued(&s.enqueue(&req("a", "w", "{}", 100.0)).unwrap()).1;
    let younger = queued(&s.enqueue(&immediate("y", 150.0)).unwrap()).1;
    let t = fast(&mut s, 200.0, 16, 4);
    assert_eq!(t.sealed, vec![younger]);
    assert!(t.reseal && t.more && claimed(&t).is_empty(), "{t:?}");
    // The seal after it, then the walk: the older first, as `choose` takes them.
    assert_eq!(s.seal_ready(200.0).unwrap(), vec![older]);
    let heads: Vec<i64> = s
        .candidates(200.0, 16)
        .unwrap()
        .iter()
        .map(|c| c.batch_id)
        .collect();
    assert_eq!(heads, vec![older, younger]);
    // With nothing left unsealed, one slot free: the older only.
    let t = fast(&mut s, 201.0, 16, 1);
    assert_eq!(claimed(&t), vec![older]);
    assert!(t.more, "{t:?}");

    // Four batches of one group, older than `younger`: a walk of 2 x 2 rows finds one head
    // among them and cannot tell it saw every head (more).
    let g: Vec<i64> = (0..4)
        .map(|i| {
            let b = queued(&s.enqueue(&immediate("g", 50.0 + i as f64)).unwrap()).1;
            s.seal_ready(60.0).unwrap();
            b
        })
        .collect();
    let t = fast(&mut s, 310.0, 2, 4);
    assert_eq!(claimed(&t), vec![g[0]], "the oldest head");
    assert!(t.more, "the walk was not exact: {t:?}");
}
