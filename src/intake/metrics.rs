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
//! Must not: persist anything or read the store (the batch gauges are handed in).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

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

#[derive(Debug, Default)]
pub struct Metrics {
    by_source: Mutex<BTreeMap<String, PerSource>>,
}

impl Metrics {
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

    pub fn rejected(&self, source: &str, why: Rejection) {
        self.with(source, |p| *p.rejected.entry(why).or_default() += 1);
    }

    /// Prometheus text format. `batches` is (state, count) from the store, when readable.
    pub fn render(&self, batches: Option<&[(String, i64)]>) -> String {
        let m = self
            .by_source
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let mut out = String::new();
        let mut family = |name: &str, help: &str, kind: &str, rows: Vec<(String, u64)>| {
            // Writing to a String cannot fail.
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for (labels, v) in rows {
                let _ = writeln!(out, "{name}{{{labels}}} {v}");
            }
        };
        let per = |f: &dyn Fn(&PerSource) -> u64| -> Vec<(String, u64)> {
            m.iter()
                .map(|(s, p)| (format!("source=\"{}\"", escape(s)), f(p)))
                .collect()
        };
        family(
            "hookspool_events_received_total",
            "Verified requests stored (queued, duplicate, replayed or quarantined).",
            "counter",
            per(&|p| p.received),
        );
        family(
            "hookspool_events_duplicate_total",
            "Verified requests that were dedup hits.",
            "counter",
            per(&|p| p.duplicate),
        );
        family(
            "hookspool_events_quarantined_total",
            "Verified requests quarantined after a source error.",
            "counter",
            per(&|p| p.quarantined),
        );
        let rejected = m
            .iter()
            .flat_map(|(s, p)| {
                p.rejected.iter().map(move |(r, n)| {
                    (
                        format!("source=\"{}\",reason=\"{}\"", escape(s), r.label()),
                        *n,
                    )
                })
            })
            .collect();
        family(
            "hookspool_requests_rejected_total",
            "Requests answered without storing them, by reason.",
            "counter",
            rejected,
        );
        if let Some(b) = batches {
            family(
                "hookspool_batches",
                "Batches in the spool by state.",
                "gauge",
                b.iter()
                    .map(|(s, n)| (format!("state=\"{}\"", escape(s)), (*n).max(0) as u64))
                    .collect(),
            );
        }
        out
    }
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_prometheus_text() {
        let m = Metrics::default();
        m.stored("gh", Stored::Queued);
        m.stored("gh", Stored::Duplicate);
        m.rejected("gh", Rejection::Unverified);
        m.rejected("gh", Rejection::Unverified);
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
    }
}
