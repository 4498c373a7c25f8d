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
pub(crate) mod tests {
    use super::*;
    use crate::sources::kit::{KIT_NOW, Kit};
    use crate::sources::{Declared, SourceError};
    use serde_json::Value;

    /// A source that verifies like the kit's template source, then panics in `key` (or in
    /// `verify` when `in_verify`). Test-only: production builds cannot configure it.
    pub struct Panicky {
        pub inner: std::sync::Arc<dyn Source>,
        pub in_verify: bool,
    }

    impl Source for Panicky {
        fn declared(&self) -> &Declared {
            self.inner.declared()
        }
        fn verify(&self, req: &Request, secrets: &dyn SecretSource) -> Result<bool, SourceError> {
            if self.in_verify {
                panic!("deliberate test panic in verify");
            }
            self.inner.verify(req, secrets)
        }
        fn key(&self, _payload: &Value, _req: &Request) -> Result<String, SourceError> {
            panic!("deliberate test panic in key");
        }
    }

    #[test]
    fn a_panic_after_verify_quarantines_and_one_before_does_not() {
        let kit = Kit::template(
            "tpl",
            "scheme = \"hmac-sha256-hex\"\nheader = \"X-Signature\"\nkey = \"payload.id\"",
            b"s3cret",
        )
        .unwrap();
        let body = kit.sample_body.clone();
        let after = Panicky {
            inner: kit.source.clone(),
            in_verify: false,
        };
        let g = evaluate_guarded(&after, &kit.signed(&body, KIT_NOW), &kit.secrets);
        assert!(
            matches!(
                g,
                Guarded::Verdict(Verdict::Quarantine { class: PANIC_CLASS })
            ),
            "{g:?}"
        );
        // Unsigned: verify says no before the panic could happen.
        let g = evaluate_guarded(&after, &kit.unsigned(&body, KIT_NOW), &kit.secrets);
        assert!(
            matches!(g, Guarded::Verdict(Verdict::Unauthorized)),
            "{g:?}"
        );
        let before = Panicky {
            inner: kit.source.clone(),
            in_verify: true,
        };
        let g = evaluate_guarded(&before, &kit.signed(&body, KIT_NOW), &kit.secrets);
        assert!(matches!(g, Guarded::PanicUnverified), "{g:?}");
    }
}
