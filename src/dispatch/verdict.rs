//! What one finished attempt means (spec 4.2, 6.5, 6.6), pure: the outcome a destination
//! reported, with the facts the store holds about the batch, becomes the mark to record,
//! the breaker change on the destination row, and the rule that decided it (which the
//! engine turns into issues and log lines). The table of spec 6.5 is read here once:
//!
//! | outcome | class     | batch                         | counted | breaker  |
//! | ok      |           | delivered                     | yes     | success  |
//! | retry   | transport | backoff on the destination    | no      | failure  |
//! | retry   | throttle  | Retry-After, else backoff on the batch's own throttles | no | neutral |
//! | retry   | batch     | backoff on the counted attempts; dead at max_attempts | yes | neutral |
//! | retry   | config    | at the backoff cap            | no      | neutral  |
//! | dead    | permanent | dead (a bad emit twice too)   | no      | neutral  |
//! | dead    | poison    | the strike rule of spec 4.2   | no      | closes   |
//!
//! The engine calls [`decide`] inside the transaction that records the result, with the
//! destination row as that transaction reads it. Must not: do I/O or read the clock.

use super::breaker::{self, Effect};
use super::retry;
use crate::config::Dispatch;
use crate::destinations::script::is_bad_emit;
use crate::destinations::{Outcome, OutcomeKind};
use crate::store::{
    AttemptReport, BAD_EMIT_STATUS, BatchRow, DestinationRow, EnqueueRequest, Mark,
};
use crate::vocab::{BreakerState, Klass};

/// A batch is poison on the failure that completes this many strikes (spec 4.2).
pub const POISON_STRIKES: i64 = 5;
/// Stored error texts (last_error, attempts.error) are cut to this many chars.
pub const ERROR_CHARS_MAX: usize = 500;

/// Which rule of the table decided an attempt (for issues and the log's `klass` field).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    Delivered,
    Transport,
    Throttle,
    Config,
    /// A counted batch-class failure (a bad emit included).
    Batch,
    /// Dead at max_attempts counted attempts.
    Exhausted,
    Permanent,
    Poison,
}

impl Rule {
    pub fn as_str(self) -> &'static str {
        match self {
            Rule::Delivered => "ok",
            Rule::Transport => "transport",
            Rule::Throttle => "throttle",
            Rule::Config => "config",
            Rule::Batch => "batch",
            Rule::Exhausted => "exhausted",
            Rule::Permanent => "permanent",
            Rule::Poison => "poison",
        }
    }
}

/// Everything [`decide`] reads about one finished attempt. The store facts are read before
/// the recording transaction; they concern the leased batch alone, which nothing else
/// writes while this process holds its lease.
pub struct Facts<'a> {
    pub outcome: &'a Outcome,
    pub batch: &'a BatchRow,
    pub attempt_id: i64,
    pub lease_owner: &'a str,
    pub started_at: f64,
    pub probe: bool,
    pub duration_ms: i64,
    /// The script's emits validated into requests, or why one was refused.
    pub emits: Result<Vec<EnqueueRequest>, String>,
    /// Poison strikes this failure would complete (transport failures only).
    pub strikes: i64,
    /// This batch's throttles in a row before this attempt.
    pub throttles: i64,
    /// This batch's previous attempt was a bad emit.
    pub previous_bad_emit: bool,
    /// A uniform draw from [0, 1) for the backoff's jitter.
    pub jitter01: f64,
    pub now: f64,
}

/// The decision for one attempt.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub report: AttemptReport,
    pub rule: Rule,
    pub effect: Effect,
}

/// Decide `f` against the destination row `row` (changed in place as the breaker and
/// Retry-After require). `refused` is the store's reason when it refused the emits of the
/// verdict this returned before: the attempt is then a bad emit.
pub fn decide(
    f: &Facts<'_>,
    row: &mut DestinationRow,
    refused: Option<&str>,
    cfg: &Dispatch,
) -> Verdict {
    let o = f.outcome;
    let now = f.now;
    if let Some(why) = refused {
        return bad_emit(f, row, cfg, format!("bad emit refused by the spool: {why}"));
    }
    let (mark, rule, effect) = match o.kind {
        OutcomeKind::Ok => match &f.emits {
            Err(why) => return bad_emit(f, row, cfg, format!("bad emit: {why}")),
            Ok(reqs) => (
                Mark::Delivered {
                    result: o.notice.clone(),
                    emits: reqs.clone(),
                },
                Rule::Delivered,
                breaker::on_success(row, now),
            ),
        },
        OutcomeKind::Retry => match o.klass {
            Some(Klass::Transport) => transport(f, row, cfg),
            Some(Klass::Throttle) => {
                // A throttle is neutral for the breaker, so the destination's failure count
                // never grows: back off on this batch's own throttles in a row instead.
                let backoff = retry::backoff_s(
                    f.throttles + 1,
                    cfg.backoff_base_s,
                    cfg.backoff_cap_s,
                    f.jitter01,
                );
                if let Some(after) = o.retry_after_s {
                    row.retry_after_until = Some(now + after.min(retry::RETRY_AFTER_S_MAX));
                }
                breaker::on_neutral(row, f.probe);
                (
                    Mark::Retry {
                        klass: Klass::Throttle,
                        next_attempt_at: now + retry::throttle_delay_s(o.retry_after_s, backoff),
                    },
                    Rule::Throttle,
                    Effect::None,
                )
            }
            Some(Klass::Config) => {
                breaker::on_neutral(row, f.probe);
                (
                    Mark::Retry {
                        klass: Klass::Config,
                        next_attempt_at: now + cfg.backoff_cap_s,
                    },
                    Rule::Config,
                    Effect::None,
                )
            }
            // A destination that reports a retry outside these classes is treated as a
            // batch failure: counted, so it cannot loop for ever.
            Some(Klass::Batch | Klass::Permanent | Klass::Poison | Klass::Quarantine) | None => {
                if is_bad_emit(o) {
                    // The script's own text already names the line and the rule.
                    return bad_emit(f, row, cfg, o.detail.clone());
                }
                breaker::on_neutral(row, f.probe);
                let (mark, rule) = batch_failure(f, cfg);
                (mark, rule, Effect::None)
            }
        },
        // Every dead outcome a destination reports is permanent: the document itself was
        // refused (poison and exhaustion are the dispatcher's own verdicts).
        OutcomeKind::Dead => {
            breaker::on_neutral(row, f.probe);
            (
                Mark::Dead {
                    klass: Klass::Permanent,
                },
                Rule::Permanent,
                Effect::None,
            )
        }
    };
    let error = match o.kind {
        OutcomeKind::Ok => None,
        OutcomeKind::Retry | OutcomeKind::Dead => Some(if o.detail.is_empty() {
            o.reason.clone()
        } else {
            o.detail.clone()
        }),
    };
    Verdict {
        report: report(f, o.status, error, mark),
        rule,
        effect,
    }
}

/// A transport failure: the poison rule while the breaker is closed, else a breaker
/// failure and a backoff on the destination's consecutive failures.
fn transport(f: &Facts<'_>, row: &mut DestinationRow, cfg: &Dispatch) -> (Mark, Rule, Effect) {
    let closed = match row.state {
        BreakerState::Closed => true,
        BreakerState::Open | BreakerState::HalfOpen | BreakerState::Paused => false,
    };
    if closed && f.strikes >= POISON_STRIKES {
        // The poison batch leaves the queue and does not count against the breaker.
        row.consecutive_failures = 0;
        return (
            Mark::Dead {
                klass: Klass::Poison,
            },
            Rule::Poison,
            Effect::None,
        );
    }
    let effect = breaker::on_transport_failure(
        row,
        &cfg.breaker,
        f.started_at,
        f.probe,
        f.now,
        &f.outcome.reason,
    );
    let n = row.consecutive_failures.max(1);
    let next = f.now + retry::backoff_s(n, cfg.backoff_base_s, cfg.backoff_cap_s, f.jitter01);
    (
        Mark::Retry {
            klass: Klass::Transport,
            next_attempt_at: next,
        },
        Rule::Transport,
        effect,
    )
}

/// A batch-class failure: backoff on the counted attempts, dead (exhausted) on the one
/// that reaches max_attempts. A probe is not counted (spec 4.2), so it never exhausts.
fn batch_failure(f: &Facts<'_>, cfg: &Dispatch) -> (Mark, Rule) {
    let retry_mark = |next_attempt_at| Mark::Retry {
        klass: Klass::Batch,
        next_attempt_at,
    };
    let counted = retry_mark(0.0).counted(f.probe);
    let n = f.batch.attempts + 1;
    if counted && n >= cfg.max_attempts {
        return (
            Mark::Dead {
                klass: Klass::Batch,
            },
            Rule::Exhausted,
        );
    }
    let backoff = retry::backoff_s(n, cfg.backoff_base_s, cfg.backoff_cap_s, f.jitter01);
    (retry_mark(f.now + backoff), Rule::Batch)
}

/// A bad emit (spec 6.5, 6.6): a batch-class failure, permanent when the previous attempt
/// was one too. Recorded with [`BAD_EMIT_STATUS`] so the next attempt can tell.
fn bad_emit(f: &Facts<'_>, row: &mut DestinationRow, cfg: &Dispatch, error: String) -> Verdict {
    breaker::on_neutral(row, f.probe);
    let (mark, rule) = if f.previous_bad_emit {
        (
            Mark::Dead {
                klass: Klass::Permanent,
            },
            Rule::Permanent,
        )
    } else {
        batch_failure(f, cfg)
    };
    Verdict {
        report: report(f, Some(BAD_EMIT_STATUS), Some(error), mark),
        rule,
        effect: Effect::None,
    }
}

fn report(f: &Facts<'_>, status: Option<i64>, error: Option<String>, mark: Mark) -> AttemptReport {
    let o = f.outcome;
    AttemptReport {
        batch_id: f.batch.id,
        attempt_id: f.attempt_id,
        lease_owner: f.lease_owner.to_string(),
        now: f.now,
        status,
        error: error.map(|e| e.chars().take(ERROR_CHARS_MAX).collect()),
        duration_ms: f.duration_ms,
        delivery_id: None,
        events_delivered: o.events_delivered,
        failed_event_id: o.failed_event_id,
        mark,
    }
}
