//! The soak's checker: what was acknowledged, stored and delivered, compared. Pure (no I/O,
//! no clock), so its own tests can plant each kind of fault and see it fail.
//!
//! Definitions (spec section 12's guarantees, read from the receiver's side):
//! * acked: an event the intake answered 2xx; only those carry a promise.
//! * delivered: an acked event inside a document the receiver answered 200 to, on every
//!   route the event was routed to (its source's route and each tee route).
//! * lost: an acked (route, event) never delivered. Must be 0.
//! * duplicate: a document for a (route, batch) already answered 200 with the same
//!   content_hash (at-least-once: expected after a SIGKILL between the 200 and the mark, or
//!   an answer slower than the destination's timeout).
//! * conflict: one batch seen with two different content_hashes (a sealed batch is frozen).
//! * in two batches: one event delivered inside two different batches of one route (dedup
//!   should have made the retry of an unanswered request a duplicate answer, not a copy).
//! * order violation: for one (route, key), an acked event delivered for the first time after
//!   an acked event the sender sent later (the sender waits for each ack before the next
//!   event of a key, so commit order is send order). Events that were never acked carry no
//!   order promise and are left out. An event delivered under another key, or with another
//!   key or sequence number than it was sent with, counts as a violation too.
//! * over bound: a document with more events than its route's max_events, or more event
//!   bytes than its max_bytes, or whose `count` disagrees with its events.

use std::collections::{BTreeMap, HashMap, HashSet};

/// One route as the soak configured it: what feeds it and its bounds.
#[derive(Clone, Debug)]
pub struct RouteBound {
    pub route: String,
    pub source: String,
    pub max_events: usize,
    pub max_bytes: usize,
}

/// An event the intake answered 2xx to.
#[derive(Clone, Debug)]
pub struct Acked {
    pub id: String,
    pub source: String,
    pub key: String,
    pub seq: u64,
    /// When the 2xx arrived, seconds from the start of the run.
    pub at_s: f64,
}

/// How the receiver answered a document.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// 200 in time: the dispatcher may have recorded it delivered.
    Ok,
    /// 500, a bad signature, or an answer slower than the destination timeout.
    Refused,
}

/// One document the receiver read.
#[derive(Clone, Debug)]
pub struct Doc {
    pub route: String,
    pub key: String,
    pub batch_id: i64,
    pub content_hash: String,
    pub count: i64,
    pub events: Vec<DocEvent>,
    pub answer: Answer,
}

#[derive(Clone, Debug)]
pub struct DocEvent {
    pub id: String,
    pub key: String,
    pub seq: u64,
    /// Bytes of the event as the sender sent it (what the spool's `size` counts).
    pub size: usize,
}

/// Everything the checks compare.
pub struct Facts<'a> {
    pub routes: &'a [RouteBound],
    pub acked: &'a [Acked],
    /// Documents in the order the receiver read them.
    pub docs: &'a [Doc],
    /// (source, dedup id) of every event the spool holds (primary copies).
    pub stored: &'a HashSet<(String, String)>,
}

#[derive(Debug, Default)]
pub struct Verdict {
    pub acked: usize,
    pub stored: usize,
    pub stored_unacked: usize,
    pub acked_not_stored: Vec<String>,
    /// Acked events delivered on every route they were routed to.
    pub delivered: usize,
    pub docs_ok: usize,
    pub docs_refused: usize,
    pub duplicates: usize,
    pub conflicts: Vec<i64>,
    pub in_two_batches: Vec<String>,
    /// (route, event id) acked and never delivered.
    pub lost: Vec<(String, String)>,
    /// (route, key) -> violations.
    pub order_violations: BTreeMap<(String, String), usize>,
    /// (route, batch id, events, bytes).
    pub over_bound: Vec<(String, i64, usize, usize)>,
    pub unknown_routes: BTreeMap<String, usize>,
}

impl Verdict {
    /// Why the run fails; empty when it passes.
    pub fn failures(&self) -> Vec<String> {
        let mut f = Vec::new();
        if !self.lost.is_empty() {
            f.push(format!("lost {} acked event(s)", self.lost.len()));
        }
        if !self.acked_not_stored.is_empty() {
            f.push(format!(
                "{} acked event(s) are not in the spool",
                self.acked_not_stored.len()
            ));
        }
        let order: usize = self.order_violations.values().sum();
        if order > 0 {
            f.push(format!("{order} order violation(s)"));
        }
        if !self.over_bound.is_empty() {
            f.push(format!(
                "{} batch(es) over their bounds",
                self.over_bound.len()
            ));
        }
        if !self.conflicts.is_empty() {
            f.push(format!(
                "{} batch(es) delivered with two content_hashes",
                self.conflicts.len()
            ));
        }
        if !self.in_two_batches.is_empty() {
            f.push(format!(
                "{} event(s) delivered in two batches",
                self.in_two_batches.len()
            ));
        }
        if !self.unknown_routes.is_empty() {
            f.push(format!(
                "documents for routes the soak did not configure: {:?}",
                self.unknown_routes
            ));
        }
        f
    }
}

pub fn check(facts: &Facts<'_>) -> Verdict {
    let mut v = Verdict {
        acked: facts.acked.len(),
        stored: facts.stored.len(),
        ..Default::default()
    };
    let bounds: HashMap<&str, &RouteBound> =
        facts.routes.iter().map(|r| (r.route.as_str(), r)).collect();
    // id -> (key, seq) as sent.
    let acked_ids: HashMap<&str, (&str, u64)> = facts
        .acked
        .iter()
        .map(|a| (a.id.as_str(), (a.key.as_str(), a.seq)))
        .collect();
    let acked_pairs: HashSet<(&str, &str)> = facts
        .acked
        .iter()
        .map(|a| (a.source.as_str(), a.id.as_str()))
        .collect();
    v.stored_unacked = facts
        .stored
        .iter()
        .filter(|(s, id)| !acked_pairs.contains(&(s.as_str(), id.as_str())))
        .count();
    for a in facts.acked {
        if !facts.stored.contains(&(a.source.clone(), a.id.clone())) {
            v.acked_not_stored.push(a.id.clone());
        }
    }

    // (route, batch) -> content_hash of its first sighting, and whether it was answered 200.
    let mut hashes: HashMap<(&str, i64), &str> = HashMap::new();
    let mut ok_batches: HashSet<(&str, i64)> = HashSet::new();
    // (route, event id) -> the batch it was first delivered in.
    let mut delivered: HashMap<(&str, &str), i64> = HashMap::new();
    // (route, key) -> the highest acked seq delivered so far.
    let mut high: HashMap<(&str, &str), u64> = HashMap::new();
    let mut over: HashSet<(&str, i64)> = HashSet::new();
    let mut conflicts: HashSet<i64> = HashSet::new();
    let mut twice: HashSet<&str> = HashSet::new();
    for d in facts.docs {
        let Some(b) = bounds.get(d.route.as_str()) else {
            *v.unknown_routes.entry(d.route.clone()).or_insert(0) += 1;
            continue;
        };
        let batch = (d.route.as_str(), d.batch_id);
        match hashes.get(&batch) {
            Some(h) if *h != d.content_hash => {
                conflicts.insert(d.batch_id);
            }
            Some(_) => {}
            None => {
                hashes.insert(batch, &d.content_hash);
            }
        }
        let bytes: usize = d.events.iter().map(|e| e.size).sum();
        let bad_count = usize::try_from(d.count).ok() != Some(d.events.len());
        if (d.events.len() > b.max_events || bytes > b.max_bytes || bad_count) && over.insert(batch)
        {
            v.over_bound
                .push((d.route.clone(), d.batch_id, d.events.len(), bytes));
        }
        if d.answer != Answer::Ok {
            v.docs_refused += 1;
            continue;
        }
        v.docs_ok += 1;
        if !ok_batches.insert(batch) {
            v.duplicates += 1;
            continue;
        }
        for e in &d.events {
            match delivered.get(&(d.route.as_str(), e.id.as_str())) {
                Some(first) if *first != d.batch_id => {
                    if twice.insert(e.id.as_str()) {
                        v.in_two_batches.push(e.id.clone());
                    }
                    continue;
                }
                Some(_) => continue,
                None => {
                    delivered.insert((d.route.as_str(), e.id.as_str()), d.batch_id);
                }
            }
            if e.key != d.key {
                *v.order_violations
                    .entry((d.route.clone(), d.key.clone()))
                    .or_insert(0) += 1;
                continue;
            }
            let Some(&(key, seq)) = acked_ids.get(e.id.as_str()) else {
                continue;
            };
            if key != e.key || seq != e.seq {
                // Delivered, but not as it was sent.
                *v.order_violations
                    .entry((d.route.clone(), d.key.clone()))
                    .or_insert(0) += 1;
                continue;
            }
            let h = high.entry((d.route.as_str(), d.key.as_str())).or_insert(0);
            if e.seq <= *h {
                *v.order_violations
                    .entry((d.route.clone(), d.key.clone()))
                    .or_insert(0) += 1;
            } else {
                *h = e.seq;
            }
        }
    }
    v.conflicts = conflicts.into_iter().collect();
    v.conflicts.sort_unstable();

    for a in facts.acked {
        let mut all = true;
        for r in facts.routes.iter().filter(|r| r.source == a.source) {
            if !delivered.contains_key(&(r.route.as_str(), a.id.as_str())) {
                v.lost.push((r.route.clone(), a.id.clone()));
                all = false;
            }
        }
        if all {
            v.delivered += 1;
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routes() -> Vec<RouteBound> {
        vec![
            RouteBound {
                route: "a".into(),
                source: "a".into(),
                max_events: 3,
                max_bytes: 100,
            },
            RouteBound {
                route: "a-tee".into(),
                source: "a".into(),
                max_events: 10,
                max_bytes: 1000,
            },
        ]
    }

    fn acked(n: u64) -> Vec<Acked> {
        (1..=n)
            .map(|seq| Acked {
                id: format!("e{seq}"),
                source: "a".into(),
                key: "k".into(),
                seq,
                at_s: seq as f64,
            })
            .collect()
    }

    fn doc(route: &str, batch_id: i64, seqs: &[u64]) -> Doc {
        Doc {
            route: route.into(),
            key: "k".into(),
            batch_id,
            content_hash: format!("sha256:{batch_id}"),
            count: seqs.len() as i64,
            events: seqs
                .iter()
                .map(|&seq| DocEvent {
                    id: format!("e{seq}"),
                    key: "k".into(),
                    seq,
                    size: 10,
                })
                .collect(),
            answer: Answer::Ok,
        }
    }

    fn stored(n: u64) -> HashSet<(String, String)> {
        (1..=n).map(|s| ("a".into(), format!("e{s}"))).collect()
    }

    fn run(acked: &[Acked], docs: &[Doc], stored: &HashSet<(String, String)>) -> Verdict {
        check(&Facts {
            routes: &routes(),
            acked,
            docs,
            stored,
        })
    }

    fn clean() -> Vec<Doc> {
        vec![
            doc("a", 1, &[1, 2]),
            doc("a-tee", 2, &[1, 2, 3, 4]),
            doc("a", 3, &[3, 4]),
        ]
    }

    #[test]
    fn a_clean_run_passes_with_redeliveries_counted_as_duplicates() {
        let mut docs = clean();
        docs.insert(1, doc("a", 1, &[1, 2]));
        let mut refused = doc("a", 3, &[3, 4]);
        refused.answer = Answer::Refused;
        docs.insert(2, refused);
        let v = run(&acked(4), &docs, &stored(4));
        assert!(v.failures().is_empty(), "{:?}", v.failures());
        assert_eq!((v.acked, v.delivered, v.duplicates), (4, 4, 1));
        assert_eq!((v.docs_ok, v.docs_refused), (4, 1));
    }

    #[test]
    fn an_acked_event_missing_from_one_route_is_lost() {
        let mut docs = clean();
        docs[1] = doc("a-tee", 2, &[1, 2, 4]);
        let v = run(&acked(4), &docs, &stored(4));
        assert_eq!(v.lost, vec![("a-tee".to_string(), "e3".to_string())]);
        assert_eq!(v.delivered, 3);
        assert!(!v.failures().is_empty());
    }

    #[test]
    fn an_event_only_in_a_refused_document_is_lost() {
        let mut docs = clean();
        docs[2].answer = Answer::Refused;
        let v = run(&acked(4), &docs, &stored(4));
        assert_eq!(v.lost.len(), 2);
    }

    #[test]
    fn an_acked_event_missing_from_the_spool_fails() {
        let s: HashSet<_> = stored(4).into_iter().filter(|(_, i)| i != "e2").collect();
        let v = run(&acked(4), &clean(), &s);
        assert_eq!(v.acked_not_stored, vec!["e2".to_string()]);
        assert!(!v.failures().is_empty());
    }

    #[test]
    fn a_later_event_delivered_first_is_an_order_violation() {
        let docs = vec![
            doc("a", 1, &[2, 1]),
            doc("a-tee", 2, &[1, 2, 3, 4]),
            doc("a", 3, &[3, 4]),
        ];
        let v = run(&acked(4), &docs, &stored(4));
        assert_eq!(v.order_violations.values().sum::<usize>(), 1);
        assert!(v.lost.is_empty());
        assert!(!v.failures().is_empty());
    }

    #[test]
    fn unacked_events_carry_no_order_promise() {
        // e5 was stored but never acked (the intake died before answering); it lands late.
        let late = vec![
            doc("a", 1, &[1, 2, 3]),
            doc("a", 2, &[4]),
            doc("a", 3, &[5]),
            doc("a-tee", 4, &[1, 2, 3, 5, 4]),
        ];
        let mut a = acked(5);
        a.retain(|e| e.seq != 5);
        let v = run(&a, &late, &stored(5));
        assert!(v.failures().is_empty(), "{:?}", v.failures());
        assert_eq!(v.stored_unacked, 1);
    }

    #[test]
    fn batches_over_events_bytes_or_count_are_caught() {
        let mut docs = vec![doc("a", 1, &[1, 2, 3, 4])];
        let v = run(&acked(4), &docs, &stored(4));
        assert_eq!(v.over_bound.len(), 1, "max_events");
        docs = vec![doc("a", 1, &[1, 2])];
        docs[0].events[0].size = 95;
        assert_eq!(
            run(&acked(2), &docs, &stored(2)).over_bound.len(),
            1,
            "max_bytes"
        );
        docs = vec![doc("a", 1, &[1, 2])];
        docs[0].count = 3;
        assert_eq!(
            run(&acked(2), &docs, &stored(2)).over_bound.len(),
            1,
            "count"
        );
    }

    #[test]
    fn one_batch_with_two_hashes_is_a_conflict() {
        let mut docs = clean();
        let mut other = doc("a", 1, &[1, 2]);
        other.content_hash = "sha256:other".into();
        docs.push(other);
        let v = run(&acked(4), &docs, &stored(4));
        assert_eq!(v.conflicts, vec![1]);
        assert!(!v.failures().is_empty());
    }

    #[test]
    fn one_event_in_two_batches_fails() {
        let mut docs = clean();
        docs.push(doc("a", 9, &[4]));
        let v = run(&acked(4), &docs, &stored(4));
        assert_eq!(v.in_two_batches, vec!["e4".to_string()]);
        assert!(!v.failures().is_empty());
    }
}
