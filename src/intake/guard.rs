//! Source code runs behind a guard: [`evaluate_guarded`] runs `sources::flow::evaluate`'s
//! two halves, each under `catch_unwind`, and so tells a panic before verification (never
//! stored: the request is unverified, so the answer is 503 "could not decide") from one after
//! it (spec 9: quarantine and 202, like any other source error after verify).
//!
//! Must not: change the call order (that is `flow`'s: `authenticate` then `classify`), or put
//! the panic's message anywhere (it may quote the body); only the fact of a panic is kept.

use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::sources::flow::{authenticate, classify};
use crate::sources::{Request, SecretSource, Source, Verdict};

/// The error class a panic after verification is quarantined with.
pub const PANIC_CLASS: &str = "Panic";

/// What the guard saw.
#[derive(Debug)]
pub enum Guarded {
    Verdict(Verdict),
    /// A panic before verification finished: nothing is known about the request.
    PanicUnverified,
}

/// Runs the source on the request; never unwinds.
pub fn evaluate_guarded(source: &dyn Source, req: &Request, secrets: &dyn SecretSource) -> Guarded {
    match catch_unwind(AssertUnwindSafe(|| authenticate(source, req, secrets))) {
        Ok(Some(stop)) => return Guarded::Verdict(stop),
        Ok(None) => {}
        Err(_) => return Guarded::PanicUnverified,
    }
    match catch_unwind(AssertUnwindSafe(|| classify(source, req, secrets))) {
        Ok(v) => Guarded::Verdict(v),
        Err(_) => Guarded::Verdict(Verdict::Quarantine { class: PANIC_CLASS }),
    }
}

#[cfg(test)]
#[path = "guard_tests.rs"]
pub(crate) mod tests;
