//! The panic guard's tests, and `Panicky`, the test-only source the intake's tests reuse.
use super::*;
use crate::kit::signer::{KIT_NOW, Kit};
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
