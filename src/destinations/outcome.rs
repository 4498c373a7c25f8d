//! The result of one delivery attempt, as every destination type reports it (spec 6.5, 14.2).
//!
//! Destinations produce an `Outcome`; the dispatcher turns it into a state transition. This
//! file owns only the vocabulary and the HTTP status mapping shared by hermes and http; it
//! must not touch the store or read the clock.

use serde::{Deserialize, Serialize};

/// What the attempt means for the batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutcomeKind {
    Ok,
    Retry,
    Dead,
}

/// Why an attempt failed (spec 6.5): the shared vocabulary (`crate::vocab`).
pub use crate::vocab::Klass;

/// One attempt's result. `reason` is safe for logs and alerts (ids, codes, fixed phrases);
/// `detail` goes to `last_error` (scrubbed, at most 500 chars) and is never logged.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub kind: OutcomeKind,
    pub klass: Option<Klass>,
    /// HTTP status or process exit code.
    pub status: Option<i64>,
    pub reason: String,
    pub detail: String,
    pub retry_after_s: Option<f64>,
    /// Parsed `{"enqueue": {...}}` objects from a script's stdout (the inner objects).
    pub emits: Vec<serde_json::Value>,
    /// Opens an issue without changing the outcome (e.g. Hermes answered `ignored`).
    pub notice: Option<String>,
    pub events_delivered: Option<i64>,
    pub failed_event_id: Option<i64>,
    /// A transport failure because time ran out (the destination's timeout_s or the worker
    /// deadline): the delivery issue's `timeout` reason class (spec 11.4).
    pub timed_out: bool,
}

/// The longest `detail` kept (spec 14.2).
pub const DETAIL_CHARS_MAX: usize = 500;
pub use super::retry_after::RETRY_AFTER_S_MAX;

impl Outcome {
    pub fn ok(status: Option<i64>) -> Outcome {
        Outcome {
            kind: OutcomeKind::Ok,
            klass: None,
            status,
            reason: "ok".into(),
            detail: String::new(),
            retry_after_s: None,
            emits: Vec::new(),
            notice: None,
            events_delivered: None,
            failed_event_id: None,
            timed_out: false,
        }
    }

    pub fn retry(klass: Klass, status: Option<i64>, reason: impl Into<String>) -> Outcome {
        Outcome {
            kind: OutcomeKind::Retry,
            klass: Some(klass),
            ..Outcome::ok(status)
        }
        .with_reason(reason)
    }

    pub fn dead(klass: Klass, status: Option<i64>, reason: impl Into<String>) -> Outcome {
        Outcome {
            kind: OutcomeKind::Dead,
            klass: Some(klass),
            ..Outcome::ok(status)
        }
        .with_reason(reason)
    }

    pub fn with_reason(mut self, reason: impl Into<String>) -> Outcome {
        self.reason = reason.into();
        self
    }

    /// Mark a transport failure as time running out (see `timed_out`).
    pub fn timed_out(mut self) -> Outcome {
        self.timed_out = true;
        self
    }

    /// Attach a detail, truncated on a char boundary to `DETAIL_CHARS_MAX`.
    pub fn with_detail(mut self, detail: &str) -> Outcome {
        self.detail = detail.chars().take(DETAIL_CHARS_MAX).collect();
        self
    }
}

/// The HTTP status mapping shared by `http` and `hermes` (spec 6.5, 14.2): 2xx ok; 408 and
/// 5xx transport, except 503 with a usable Retry-After, which is throttle like every 429
/// (Retry-After in seconds or as an HTTP-date, capped at `RETRY_AFTER_S_MAX`, else the
/// dispatcher's backoff); 400/413/415/422 permanent; every other 4xx config. A redirect is
/// never followed: `redirect_klass` says what it means (`Permanent` on http, as Standard
/// Webhooks says; `Config` on hermes, where the base URL is wrong, not the document).
pub fn from_http_status(
    status: u16,
    retry_after: Option<&str>,
    now_unix_s: f64,
    redirect_klass: Klass,
) -> Outcome {
    let code = Some(i64::from(status));
    match status {
        200..=299 => Outcome::ok(code),
        300..=399 => {
            let reason = format!("http {status}: redirect not followed");
            let detail = "the receiver answered with a redirect; hookspool never follows \
                          redirects: point the destination at the final URL";
            match redirect_klass {
                Klass::Config => Outcome::retry(Klass::Config, code, reason),
                _ => Outcome::dead(Klass::Permanent, code, reason),
            }
            .with_detail(detail)
        }
        408 => Outcome::retry(Klass::Transport, code, "http 408"),
        429 => {
            let after = retry_after.and_then(|v| super::retry_after::parse(v, now_unix_s));
            Outcome {
                retry_after_s: after,
                ..Outcome::retry(Klass::Throttle, code, "http 429")
            }
        }
        503 => match retry_after.and_then(|v| super::retry_after::parse(v, now_unix_s)) {
            Some(after) => Outcome {
                retry_after_s: Some(after),
                ..Outcome::retry(Klass::Throttle, code, "http 503")
            },
            None => Outcome::retry(Klass::Transport, code, "http 503"),
        },
        400 | 413 | 415 | 422 => Outcome::dead(Klass::Permanent, code, format!("http {status}"))
            .with_detail(
                "the receiver rejected the document itself; split or exclude, then replay",
            ),
        401 | 403 | 404 | 405 | 410 => {
            Outcome::retry(Klass::Config, code, format!("http {status}"))
                .with_detail(config_detail(status))
        }
        400..=499 => Outcome::retry(Klass::Config, code, format!("http {status}")).with_detail(
            "a 4xx that hookspool does not name: it needs a person, retried at the backoff cap",
        ),
        // 5xx and anything outside the defined ranges (1xx as a final answer, >= 600) is the
        // receiver failing, not the document.
        _ => Outcome::retry(Klass::Transport, code, format!("http {status}")),
    }
}

fn config_detail(status: u16) -> &'static str {
    match status {
        401 => "the receiver refused the signature or credentials: check the secret",
        403 => {
            "the receiver forbids this delivery: check the secret and the receiver's access rules"
        }
        404 => "the receiver does not know this URL: check the destination url",
        405 => "the receiver does not accept POST at this URL: check the destination url",
        _ => "the receiver says this URL is gone: check the destination url",
    }
}
