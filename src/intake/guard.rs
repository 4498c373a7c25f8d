//! Source code runs behind a guard: [`evaluate_guarded`] runs `sources::flow::evaluate`
//! under `catch_unwind` and tells a panic before verification (never stored: the request is
//! unverified, so the answer is 503 "could not decide") from one after it (spec 9: quarantine
//! and 202, like any other source error after verify).
//!
//! Must not: change the call order (that is `flow::evaluate`'s), or put the panic's message
//! anywhere (it may quote the body); only the fact of a panic and the source's name are kept.

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::Value;

use crate::sources::{
    Request, Response, SecretSource, Source, SourceError, Verdict, flow::evaluate,
};

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
    let watched = Watched {
        inner: source,
        verified: AtomicBool::new(false),
    };
    match catch_unwind(AssertUnwindSafe(|| evaluate(&watched, req, secrets))) {
        Ok(v) => Guarded::Verdict(v),
        Err(_) if watched.verified.load(Ordering::SeqCst) => {
            Guarded::Verdict(Verdict::Quarantine { class: PANIC_CLASS })
        }
        Err(_) => Guarded::PanicUnverified,
    }
}

/// Delegates every call and remembers whether `verify` said yes.
struct Watched<'a> {
    inner: &'a dyn Source,
    verified: AtomicBool,
}

impl Source for Watched<'_> {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
    fn secrets(&self) -> &[&str] {
        self.inner.secrets()
    }
    fn auth_headers(&self) -> &[String] {
        self.inner.auth_headers()
    }
    fn keep_headers(&self) -> &[String] {
        self.inner.keep_headers()
    }
    fn span(&self) -> &str {
        self.inner.span()
    }
    fn sender_retries(&self) -> bool {
        self.inner.sender_retries()
    }
    fn challenge_unauthenticated(&self) -> bool {
        self.inner.challenge_unauthenticated()
    }
    fn expect_every_s(&self) -> Option<u64> {
        self.inner.expect_every_s()
    }
    fn verify(&self, req: &Request, secrets: &dyn SecretSource) -> Result<bool, SourceError> {
        let r = self.inner.verify(req, secrets);
        if matches!(r, Ok(true)) {
            self.verified.store(true, Ordering::SeqCst);
        }
        r
    }
    fn challenge(
        &self,
        req: &Request,
        secrets: &dyn SecretSource,
    ) -> Result<Option<Response>, SourceError> {
        self.inner.challenge(req, secrets)
    }
    fn ignore(&self, req: &Request) -> Result<Option<String>, SourceError> {
        self.inner.ignore(req)
    }
    fn payload(&self, req: &Request) -> Result<Value, SourceError> {
        self.inner.payload(req)
    }
    fn key(&self, payload: &Value, req: &Request) -> Result<String, SourceError> {
        self.inner.key(payload, req)
    }
    fn dedup_id(&self, payload: &Value, req: &Request) -> Result<Option<String>, SourceError> {
        self.inner.dedup_id(payload, req)
    }
    fn event_type(&self, payload: &Value, req: &Request) -> Result<String, SourceError> {
        self.inner.event_type(payload, req)
    }
    fn attrs(
        &self,
        payload: &Value,
        req: &Request,
    ) -> Result<BTreeMap<String, String>, SourceError> {
        self.inner.attrs(payload, req)
    }
    fn action(&self, payload: &Value, req: &Request) -> Option<String> {
        self.inner.action(payload, req)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::sources::kit::{KIT_NOW, Kit};

    /// A source that verifies like the kit's template source, then panics in `key` (or in
    /// `verify` when `in_verify`). Test-only: production builds cannot configure it.
    pub struct Panicky {
        pub inner: std::sync::Arc<dyn Source>,
        pub in_verify: bool,
    }

    impl Source for Panicky {
        fn name(&self) -> &str {
            self.inner.name()
        }
        fn kind(&self) -> &'static str {
            self.inner.kind()
        }
        fn secrets(&self) -> &[&str] {
            self.inner.secrets()
        }
        fn auth_headers(&self) -> &[String] {
            self.inner.auth_headers()
        }
        fn keep_headers(&self) -> &[String] {
            self.inner.keep_headers()
        }
        fn span(&self) -> &str {
            self.inner.span()
        }
        fn sender_retries(&self) -> bool {
            false
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
        fn action(&self, payload: &Value, req: &Request) -> Option<String> {
            self.inner.action(payload, req)
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
