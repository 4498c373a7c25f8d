//! The intake's counters (spec 11.2), per process and in memory (reset on restart, which
//! Prometheus' rate() handles), and their Prometheus text rendering for GET /metrics.
//!
//! Counting rules: `events_received` counts verified requests that reached the spool
//! (queued, duplicate, replayed or quarantined); `events_duplicate` and
//! `events_quarantined` count those outcomes again on their own; `requests_rejected` counts
//! every request answered without storing it, by reason. Only configured source names are
//! ever labels (an unknown path is a 404 and counted under no source), so an attacker
//! cannot grow the label set.
//!
//! The request-duration histogram (`hookspool_intake_request_duration_seconds`) covers
//! requests to a configured source, by source and the HTTP status answered.
//!
//! Rejections are also kept for the spool (issue 31: the dashboard's "rejections by
//! reason", read by the admin service, another process): [`Unstored`] holds the counts per
//! (hour, source, reason) that the writer has not yet written, and the writer takes them
//! into its next group transaction or a flush of their own.
//!
//! Must not: persist anything or read the store (the batch gauges are handed in; the writer
//! stores what [`Unstored`] hands it), or render text itself (`observe::prom` does).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use crate::observe::prom::{Family, Histograms};
use crate::store::{RejectionCount, rejection_hour};

/// Why a request was answered without being stored (the `reason` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Rejection {
    Unverified,
    TooLarge,
    Chunked,
    NoLength,
    SpoolFull,
    Busy,
    Ignored,
    /// Verification could not decide (a secret unreadable, a key service down).
    Undecided,
    /// A handshake answered instead of enqueueing.
    Challenge,
    /// The store failed in a way that is neither busy nor full.
    StoreError,
    /// The spool's database (PostgreSQL) could not be reached.
    Unreachable,
    /// The bytes every unverified body holds together were at their budget.
    BodyBudget,
    /// The body did not arrive within its deadline.
    SlowBody,
    /// The connection broke before the body was whole.
    BrokenBody,
    /// After its grace, the body's rate could not finish it within its deadline.
    BodyRate,
    /// The slowest holder of a full budget, cut so that a new body could be read.
    BodyEvicted,
}

impl Rejection {
    pub const ALL: [Rejection; 16] = [
        Rejection::Unverified,
        Rejection::TooLarge,
        Rejection::Chunked,
        Rejection::NoLength,
        Rejection::SpoolFull,
        Rejection::Busy,
        Rejection::Ignored,
        Rejection::Undecided,
        Rejection::Challenge,
        Rejection::StoreError,
        Rejection::Unreachable,
        Rejection::BodyBudget,
        Rejection::SlowBody,
        Rejection::BrokenBody,
        Rejection::BodyRate,
        Rejection::BodyEvicted,
    ];

    /// The reason a label names.
    pub fn from_label(label: &str) -> Option<Rejection> {
        Rejection::ALL.into_iter().find(|r| r.label() == label)
    }

    pub fn label(self) -> &'static str {
        match self {
            Rejection::Unverified => "unverified",
            Rejection::TooLarge => "too_large",
            Rejection::Chunked => "chunked",
            Rejection::NoLength => "no_length",
            Rejection::SpoolFull => "spool_full",
            Rejection::Busy => "busy",
            Rejection::Ignored => "ignored",
            Rejection::Undecided => "undecided",
            Rejection::Challenge => "challenge",
            Rejection::StoreError => "store_error",
            Rejection::Unreachable => "spool_unreachable",
            Rejection::BodyBudget => "body_budget",
            Rejection::SlowBody => "slow_body",
            Rejection::BrokenBody => "broken_body",
            Rejection::BodyRate => "body_rate",
            Rejection::BodyEvicted => "body_evicted",
        }
    }
}

#[derive(Debug, Default, Clone)]
struct PerSource {
    received: u64,
    duplicate: u64,
    quarantined: u64,
    rejected: BTreeMap<Rejection, u64>,
}

/// What happened to a stored request, for counting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored {
    Queued,
    Duplicate,
    Replayed,
    Quarantined,
}

/// Rejections counted and not yet in the spool, per (hour, source, reason). Its keys are
/// bounded: configured source names only, the fixed reasons, and the hours since the last
/// write that succeeded.
#[derive(Debug, Default)]
pub struct Unstored {
    counts: Mutex<BTreeMap<(i64, String, Rejection), i64>>,
}

impl Unstored {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<(i64, String, Rejection), i64>> {
        // Plain integers; a poisoned lock cannot leave them inconsistent.
        self.counts.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn add(&self, hour: i64, source: &str, why: Rejection) {
        *self
            .lock()
            .entry((hour, source.to_string(), why))
            .or_default() += 1;
    }

    /// Everything counted since the last take, for the writer to store.
    pub fn take(&self) -> Vec<RejectionCount> {
        std::mem::take(&mut *self.lock())
            .into_iter()
            .map(|((hour, source, why), count)| RejectionCount {
                hour,
                source,
                reason: why.label().to_string(),
                count,
            })
            .collect()
    }

    /// Counts a write did not store, back for the next one.
    pub fn restore(&self, counts: Vec<RejectionCount>) {
        let mut m = self.lock();
        for c in counts {
            if let Some(why) = Rejection::from_label(&c.reason) {
                *m.entry((c.hour, c.source, why)).or_default() += c.count;
            }
        }
    }
}

#[derive(Debug)]
pub struct Metrics {
    by_source: Mutex<BTreeMap<String, PerSource>>,
    /// Request duration by source and answer (issue 35).
    durations: Mutex<Histograms>,
    /// The rejections the writer has yet to store.
    unstored: Arc<Unstored>,
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new(Arc::default())
    }
}

impl Metrics {
    /// Counters whose rejections are also handed to `unstored` (the writer's).
    pub fn new(unstored: Arc<Unstored>) -> Metrics {
        Metrics {
            by_source: Mutex::default(),
            durations: Mutex::new(Histograms::new(&["source", "answer"])),
            unstored,
        }
    }

    fn with<F: FnOnce(&mut PerSource)>(&self, source: &str, f: F) {
        // Counters are plain integers; a poisoned lock cannot leave them inconsistent.
        let mut m = self.by_source.lock().unwrap_or_else(|p| p.into_inner());
        match m.get_mut(source) {
            Some(p) => f(p),
            None => f(m.entry(source.to_string()).or_default()),
        }
    }

    pub fn stored(&self, source: &str, what: Stored) {
        self.with(source, |p| {
            p.received += 1;
            match what {
                Stored::Duplicate => p.duplicate += 1,
                Stored::Quarantined => p.quarantined += 1,
                Stored::Queued | Stored::Replayed => {}
            }
        });
    }

    /// A request to `source` answered at `now` without being stored.
    pub fn rejected(&self, source: &str, why: Rejection, now: f64) {
        self.with(source, |p| *p.rejected.entry(why).or_default() += 1);
        self.unstored.add(rejection_hour(now), source, why);
    }

    /// One request to a configured source answered with `status` after `seconds`.
    pub fn answered(&self, source: &str, status: u16, seconds: f64) {
        let mut h = self.durations.lock().unwrap_or_else(|p| p.into_inner());
        h.observe(&[source, &status.to_string()], seconds);
    }

    /// The intake's families. `batches` is (state, count) from the store, when readable.
    pub fn families(&self, batches: Option<&[(String, i64)]>) -> Vec<Family> {
        let m = self
            .by_source
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let per = |name, help, f: &dyn Fn(&PerSource) -> u64| {
            let mut fam = Family::counter(name, help);
            for (s, p) in &m {
                fam.add(vec![("source", s.clone())], f(p) as f64);
            }
            fam
        };
        let mut out = vec![
            per(
                "hookspool_events_received_total",
                "Verified requests stored (queued, duplicate, replayed or quarantined).",
                &|p| p.received,
            ),
            per(
                "hookspool_events_duplicate_total",
                "Verified requests that were dedup hits.",
                &|p| p.duplicate,
            ),
            per(
                "hookspool_events_quarantined_total",
                "Verified requests quarantined after a source error.",
                &|p| p.quarantined,
            ),
        ];
        let mut rejected = Family::counter(
            "hookspool_requests_rejected_total",
            "Requests answered without storing them, by reason.",
        );
        for (s, p) in &m {
            for (r, n) in &p.rejected {
                rejected.add(
                    vec![("source", s.clone()), ("reason", r.label().to_string())],
                    *n as f64,
                );
            }
        }
        out.push(rejected);
        let durations = self
            .durations
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        out.push(Family::histogram(
            "hookspool_intake_request_duration_seconds",
            "Time from a request's head to its answer, by source and HTTP status answered.",
            &durations,
        ));
        if let Some(b) = batches {
            let mut f = Family::gauge("hookspool_batches", "Batches in the spool by state.");
            for (st, n) in b {
                f.add(vec![("state", st.clone())], (*n).max(0) as f64);
            }
            out.push(f);
        }
        out
    }

    /// Prometheus text format of [`Metrics::families`].
    pub fn render(&self, batches: Option<&[(String, i64)]>) -> String {
        crate::observe::prom::render(&self.families(batches))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_prometheus_text() {
        let m = Metrics::default();
        m.stored("gh", Stored::Queued);
        m.stored("gh", Stored::Duplicate);
        m.rejected("gh", Rejection::Unverified, 7_000.0);
        m.rejected("gh", Rejection::Unverified, 7_300.0);
        let text = m.render(Some(&[("open".into(), 3)]));
        assert!(
            text.contains("hookspool_events_received_total{source=\"gh\"} 2"),
            "{text}"
        );
        assert!(text.contains("hookspool_events_duplicate_total{source=\"gh\"} 1"));
        assert!(
            text.contains(
                "hookspool_requests_rejected_total{source=\"gh\",reason=\"unverified\"} 2"
            )
        );
        assert!(text.contains("hookspool_batches{state=\"open\"} 3"));
        assert!(text.contains("# TYPE hookspool_events_received_total counter"));
        m.answered("gh", 200, 0.02);
        let text = m.render(None);
        assert!(
            text.contains("hookspool_intake_request_duration_seconds_bucket{source=\"gh\",answer=\"200\",le=\"0.025\"} 1"),
            "{text}"
        );
        assert!(!text.contains("hookspool_batches"), "{text}");
    }

    /// The writer's share: per hour, source and reason; taken once; a count given back is
    /// taken again with what came since.
    #[test]
    fn unstored_rejections_are_taken_once_by_hour_and_given_back_on_failure() {
        let u = Arc::new(Unstored::default());
        let m = Metrics::new(u.clone());
        m.rejected("gh", Rejection::Unverified, 7_000.0);
        m.rejected("gh", Rejection::Unverified, 7_300.0);
        m.rejected("gh", Rejection::TooLarge, 7_300.0);
        let c = |hour, reason: &str, count| RejectionCount {
            hour,
            source: "gh".into(),
            reason: reason.into(),
            count,
        };
        let taken = u.take();
        assert_eq!(
            taken,
            vec![
                c(3_600, "unverified", 1),
                c(7_200, "unverified", 1),
                c(7_200, "too_large", 1)
            ]
        );
        assert!(u.take().is_empty());
        u.restore(taken);
        m.rejected("gh", Rejection::Unverified, 7_300.0);
        assert_eq!(
            u.take(),
            vec![
                c(3_600, "unverified", 1),
                c(7_200, "unverified", 2),
                c(7_200, "too_large", 1)
            ]
        );
    }
}
