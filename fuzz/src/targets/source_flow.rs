//! A request through `sources::flow::evaluate` for every source in the kit's
//! matrix (each built-in type and each template kit), with arbitrary methods, paths, query
//! strings, headers, bodies and signatures.
//!
//! Input: four control bytes (`FlowControl`: which kit, what to do with credentials, HEAD or
//! POST, where the credential headers go, the signing skew), then a capture head (request
//! line and headers, as `parse_capture` reads them), a blank line and the raw body.
//!
//! Beyond "does not panic", it checks what the intake relies on:
//! * a request without credentials, or signed with the wrong secret, is never accepted,
//!   ignored, quarantined or answered (except an unauthenticated handshake's constant);
//! * a request carrying the kit's valid credential over its body, inside the timestamp
//!   tolerance, is verified whatever else it carries (no header or body makes a good
//!   signature fail), and one outside the tolerance is refused;
//! * no verdict prints the secret (unless the fuzzed request itself carried it);
//! * the verdict is the same when evaluated twice (no hidden state in a source).

use std::sync::OnceLock;

use crate::{
    Credentials, FUZZ_SECRET, FlowControl, contains, head_and_body, request_from,
    splice_credentials, strip_credentials,
};
use hookspool::kit::signer::{KIT_NOW, Kit, all_kits};
use hookspool::sources::{Verdict, evaluate};

/// Seconds of slack either side of the tolerance, so the rounding of a timestamp to whole
/// seconds never decides a property.
const TOLERANCE_SLACK_S: i64 = 2;

/// The kit's matrix, built once per process (key parsing is not what is being fuzzed).
fn kits() -> &'static [Kit] {
    static KITS: OnceLock<Vec<Kit>> = OnceLock::new();
    KITS.get_or_init(|| all_kits(FUZZ_SECRET).expect("the kit builds every source"))
}

pub fn check(data: &[u8]) {
    let kits = kits();
    let Some((ctl, rest)) = FlowControl::decode(data, kits.len()) else {
        return;
    };
    let kit = &kits[ctl.kit];
    let source = kit.source.as_ref();
    let (head, body) = head_and_body(rest);
    let Some(mut r) = request_from(head, body, KIT_NOW) else {
        return;
    };
    // The intake evaluates POST, and HEAD only for an unauthenticated handshake.
    let head_handshake = ctl.head && source.declared().challenge_unauthenticated;
    r.method = if head_handshake { "HEAD" } else { "POST" }.to_string();
    let signed_at = KIT_NOW - f64::from(ctl.skew_s);
    match ctl.credentials {
        Credentials::AsIs => {}
        Credentials::Signed => {
            let t = kit.request(&r.body, signed_at, KIT_NOW);
            splice_credentials(kit, &mut r, &t, ctl.credentials_first);
        }
        Credentials::Stripped => strip_credentials(kit, &mut r, KIT_NOW),
        Credentials::WrongSecret => {
            let t = kit.wrong_secret(&r.body, KIT_NOW);
            splice_credentials(kit, &mut r, &t, ctl.credentials_first);
        }
    }

    let verdict = evaluate(source, &r, &kit.secrets);
    let shown = format!("{verdict:?}");
    // The secret in a verdict is a leak unless the sender put it in the request itself.
    assert!(
        contains(data, FUZZ_SECRET) || !contains(shown.as_bytes(), FUZZ_SECRET),
        "{}: a verdict prints the secret",
        kit.label
    );
    assert_eq!(
        shown,
        format!("{:?}", evaluate(source, &r, &kit.secrets)),
        "{}: the same request gave two verdicts",
        kit.label
    );

    let refused = matches!(verdict, Verdict::Unauthorized);
    let constant_answer = head_handshake && matches!(verdict, Verdict::Answer(_));
    match ctl.credentials {
        Credentials::Stripped | Credentials::WrongSecret => assert!(
            refused || constant_answer,
            "{}: {:?} credentials got {shown}",
            kit.label,
            ctl.credentials
        ),
        Credentials::Signed if !head_handshake => {
            let skew = i64::from(ctl.skew_s).abs();
            let tol = kit.tolerance_s as i64;
            if !kit.flags.has_timestamp || skew <= tol - TOLERANCE_SLACK_S {
                assert!(
                    !refused && !matches!(verdict, Verdict::Undecided(_)),
                    "{}: a valid credential (skew {skew} s) got {shown}",
                    kit.label
                );
            } else if skew >= tol + TOLERANCE_SLACK_S {
                assert!(
                    refused,
                    "{}: a credential {skew} s off got {shown}",
                    kit.label
                );
            }
        }
        _ => {}
    }
}
