//! An independent Standard Webhooks (v1) and X-Hub-Signature-256 verifier, written from the
//! spec text (vectors/standard-webhooks) without the crate's signer, so a bug in `sign` cannot
//! hide itself.

use base64::Engine as _;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use super::receiver::Recorded;

/// Reference libraries' tolerance, both directions.
pub const TOLERANCE_S: i64 = 300;

fn mac(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(key).unwrap();
    m.update(data);
    m.finalize().into_bytes().to_vec()
}

/// The key as the reference libraries derive it: strip `whsec_`, add back missing `=` padding,
/// base64-decode; anything without the prefix is the raw bytes.
fn key_of(secret: &str) -> Vec<u8> {
    match secret.strip_prefix("whsec_") {
        Some(b64) => {
            let mut s = b64.to_string();
            while s.len() % 4 != 0 {
                s.push('=');
            }
            // Python's b64decode tolerates non-zero trailing bits; so does this.
            let lenient = base64::engine::GeneralPurpose::new(
                &base64::alphabet::STANDARD,
                base64::engine::GeneralPurposeConfig::new().with_decode_allow_trailing_bits(true),
            );
            lenient.decode(s).unwrap()
        }
        None => secret.as_bytes().to_vec(),
    }
}

/// Verify `webhook-id`, `webhook-timestamp` and `webhook-signature` over `body` at `now`.
pub fn sw_verify_parts(
    secret: &str,
    id: &str,
    ts: &str,
    sigs: &str,
    body: &[u8],
    now: i64,
) -> Result<(), String> {
    if id.is_empty() || ts.is_empty() || sigs.is_empty() {
        return Err("missing header".into());
    }
    let t: i64 = ts
        .parse()
        .map_err(|_| "timestamp not an integer".to_string())?;
    if (now - t).abs() > TOLERANCE_S {
        return Err("timestamp outside tolerance".into());
    }
    let mut content = format!("{id}.{ts}.").into_bytes();
    content.extend_from_slice(body);
    let expected = base64::engine::general_purpose::STANDARD.encode(mac(&key_of(secret), &content));
    let ok = sigs.split(' ').any(|part| match part.split_once(',') {
        Some(("v1", sig)) => sig == expected,
        _ => false,
    });
    if ok {
        Ok(())
    } else {
        Err("no matching v1 signature".into())
    }
}

pub fn now_unix() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// Verify a recorded request with `secret` against the wall clock.
pub fn sw_verify(secret: &str, r: &Recorded) -> Result<(), String> {
    sw_verify_parts(
        secret,
        r.header("webhook-id").unwrap_or(""),
        r.header("webhook-timestamp").unwrap_or(""),
        r.header("webhook-signature").unwrap_or(""),
        &r.body,
        now_unix(),
    )
}

/// `X-Hub-Signature-256: sha256=<hex HMAC(secret, body)>` with the raw secret bytes.
pub fn hub_verify(secret: &[u8], r: &Recorded) -> Result<(), String> {
    let expected = format!("sha256={}", hex::encode(mac(secret, &r.body)));
    match r.header("x-hub-signature-256") {
        Some(v) if v == expected => Ok(()),
        Some(_) => Err("x-hub-signature-256 mismatch".into()),
        None => Err("x-hub-signature-256 missing".into()),
    }
}
