//! The processor's failure vocabulary: every failure is Retryable (exit 75: the dispatcher
//! retries the batch as the transport class: uncounted, feeding the breaker), Config (exit 78: the operator must act on the credential or its
//! grant; the dispatcher's config class, spec 6.5: retried uncounted at the backoff cap, a
//! `config:delivery:script:<i>` issue, due again at once after a successful reload, so
//! nothing needs a replay), Permanent (exit 65: the batch goes dead at once with an issue,
//! for a person to fix and replay) or a Bug (exit 70, logged as a bug: the dispatcher's batch
//! class, counted, so a batch a bug keeps failing goes dead at max_attempts). The reason is a short
//! fixed phrase, safe for logs and the attempt row: never a body, a secret, a token or a
//! query string; at most ids, counts, status codes and setting or secret names.

use std::borrow::Cow;

/// Which way a failure goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// Transient: the provider is busy or down, the network failed, a file is briefly
    /// unreadable. The batch is retried with backoff.
    Retryable,
    /// Needs the operator, and the batch is fine: a refused or revoked credential, a missing
    /// scope, an API not enabled. Like a destination's 401/403 (spec 6.5's config class):
    /// the batches wait in order until the fix, then flow without a replay.
    Config,
    /// Needs a person, and retrying this batch as it is cannot help: a broken contract or
    /// setting, a request the provider rejects.
    Permanent,
    /// Our own invariant broke (a corrupt journal, an impossible state). Retried, so that a
    /// fixed binary picks the batch up, and logged as a bug.
    Bug,
}

/// A processor failure with its fixed-phrase reason.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{reason}")]
pub struct ProcessorError {
    pub failure: Failure,
    pub reason: Cow<'static, str>,
    /// A provider's Retry-After, as a hint for how long the retry should wait.
    pub retry_after_s: Option<f64>,
}

impl ProcessorError {
    pub fn retryable(reason: impl Into<Cow<'static, str>>) -> ProcessorError {
        ProcessorError {
            failure: Failure::Retryable,
            reason: reason.into(),
            retry_after_s: None,
        }
    }

    pub fn permanent(reason: impl Into<Cow<'static, str>>) -> ProcessorError {
        ProcessorError {
            failure: Failure::Permanent,
            reason: reason.into(),
            retry_after_s: None,
        }
    }

    pub fn config(reason: impl Into<Cow<'static, str>>) -> ProcessorError {
        ProcessorError {
            failure: Failure::Config,
            reason: reason.into(),
            retry_after_s: None,
        }
    }

    pub fn bug(reason: impl Into<Cow<'static, str>>) -> ProcessorError {
        ProcessorError {
            failure: Failure::Bug,
            reason: reason.into(),
            retry_after_s: None,
        }
    }

    pub fn with_retry_after(mut self, s: Option<f64>) -> ProcessorError {
        self.retry_after_s = s;
        self
    }

    /// An I/O failure on the state directory: the disk is full, or a permission is wrong.
    /// Retryable: the operator's fix (space, ReadWritePaths) needs no replay.
    pub fn state_io(what: &'static str, e: &std::io::Error) -> ProcessorError {
        ProcessorError::retryable(format!("state directory: {what} failed ({})", e.kind()))
    }
}
