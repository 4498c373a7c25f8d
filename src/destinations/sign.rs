//! Outbound signatures (spec 6.4): Standard Webhooks v1 (`webhook-signature`) and the legacy
//! GitHub-style `X-Hub-Signature-256`. Pure functions over bytes: no I/O, no clock, and no
//! error or debug output ever contains a secret or a body.

use base64::Engine as _;
use base64::alphabet;
use base64::engine::DecodePaddingMode;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, STANDARD};
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// The prefix Standard Webhooks puts before a base64-encoded signing key.
pub const WHSEC_PREFIX: &[u8] = b"whsec_";

/// Standard Webhooks keys are 24 to 64 random bytes; hookspool refuses shorter ones.
pub const STANDARD_SECRET_BYTES_MIN: usize = 24;

/// How the reference libraries read a `whsec_` key: padding optional and non-zero trailing
/// bits tolerated (Python's base64 accepts both; the vector file's padding cases rely on it).
const WHSEC_BASE64: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new()
        .with_decode_padding_mode(DecodePaddingMode::Indifferent)
        .with_decode_allow_trailing_bits(true),
);

/// Why a secret cannot sign. The messages name the problem, never the secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignError {
    #[error("no secret configured")]
    NoSecret,
    #[error("secret is empty")]
    EmptySecret,
    #[error(
        "secret starts with whsec_ but the rest is not valid base64: write the whsec_ value \
         exactly as issued, or a raw secret without the prefix"
    )]
    BadWhsec,
    #[error(
        "not a Standard Webhooks secret: a standard receiver base64-decodes every secret, so \
         it must be whsec_ followed by the base64 of at least 24 random bytes"
    )]
    NotWhsec,
    #[error("the whsec_ secret decodes to {bytes} bytes; Standard Webhooks keys are at least 24")]
    TooShort { bytes: usize },
}

/// An http destination's secret (spec 6.4, 10): `whsec_` + base64 of at least
/// [`STANDARD_SECRET_BYTES_MIN`] bytes, exactly what a Standard Webhooks receiver decodes.
/// Returns the key. A trailing newline (a secret file written by an editor) is not part of it.
pub fn standard_secret(secret: &[u8]) -> Result<Vec<u8>, SignError> {
    if !secret.starts_with(WHSEC_PREFIX) {
        return Err(SignError::NotWhsec);
    }
    let key = signing_key(secret)?;
    if key.len() < STANDARD_SECRET_BYTES_MIN {
        return Err(SignError::TooShort { bytes: key.len() });
    }
    Ok(key)
}

/// A new Standard Webhooks secret: `whsec_` + base64 of 32 random bytes from the OS.
pub fn new_standard_secret() -> String {
    let key: [u8; 32] = rand::random();
    format!("whsec_{}", STANDARD.encode(key))
}

/// The HMAC key for a Standard Webhooks signature: `whsec_<base64>` is decoded (leniently, as
/// the reference libraries do), anything else is used as raw bytes.
pub fn signing_key(secret: &[u8]) -> Result<Vec<u8>, SignError> {
    if secret.is_empty() {
        return Err(SignError::EmptySecret);
    }
    match secret.strip_prefix(WHSEC_PREFIX) {
        Some(b64) => match WHSEC_BASE64.decode(b64) {
            Ok(key) if !key.is_empty() => Ok(key),
            _ => Err(SignError::BadWhsec),
        },
        None => Ok(secret.to_vec()),
    }
}

fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    // HMAC takes keys of any length (RFC 2104 hashes a long key first), so new_from_slice
    // cannot fail for Hmac<Sha256>.
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key)
        .expect("HMAC-SHA256 accepts keys of any length");
    for p in parts {
        mac.update(p);
    }
    mac.finalize().into_bytes().into()
}

/// `v1,` and 44 characters of base64 (32 bytes).
const V1_ENTRY_LEN: usize = 3 + 44;

/// Append one `v1,<base64>` entry: HMAC-SHA256(key, "<msg_id>.<timestamp>.<body>").
fn push_v1(out: &mut String, key: &[u8], msg_id: &str, ts: &[u8], body: &[u8]) {
    let mac = hmac_sha256(key, &[msg_id.as_bytes(), b".", ts, b".", body]);
    out.push_str("v1,");
    STANDARD.encode_string(mac, out);
}

/// The `webhook-signature` value for every candidate secret, current first, space-separated
/// (several during a rotation, spec 6.4). Written into one string: this runs on every
/// request.
pub fn webhook_signature(
    secrets: &[Vec<u8>],
    msg_id: &str,
    timestamp: i64,
    body: &[u8],
) -> Result<String, SignError> {
    if secrets.is_empty() {
        return Err(SignError::NoSecret);
    }
    let ts = timestamp.to_string();
    let mut out = String::with_capacity(secrets.len() * (V1_ENTRY_LEN + 1));
    for (i, s) in secrets.iter().enumerate() {
        let key = signing_key(s)?;
        if i > 0 {
            out.push(' ');
        }
        push_v1(&mut out, &key, msg_id, ts.as_bytes(), body);
    }
    Ok(out)
}

/// `sha256=<hex HMAC-SHA256(secret, body)>` with the secret's raw bytes (a whsec_ secret is
/// not decoded here: GitHub-style receivers, Hermes included, HMAC with the string as given).
pub fn hub_signature_256(secret: &[u8], body: &[u8]) -> String {
    let mut hex = [0u8; 64];
    // 32 bytes always fit 64 hex digits.
    let _ = hex::encode_to_slice(hmac_sha256(secret, &[body]), &mut hex);
    let mut out = String::with_capacity(7 + 64);
    out.push_str("sha256=");
    out.extend(hex.iter().map(|b| char::from(*b)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_whsec_secrets_of_24_bytes_are_standard() {
        let made = new_standard_secret();
        assert_eq!(standard_secret(made.as_bytes()).map(|k| k.len()), Ok(32));
        assert_ne!(made, new_standard_secret(), "each secret is new");
        // `openssl rand -hex 32`, as the README used to say: a standard receiver would
        // base64-decode it into a different key.
        let hex = "3f".repeat(32);
        assert_eq!(standard_secret(hex.as_bytes()), Err(SignError::NotWhsec));
        assert_eq!(
            standard_secret(b"whsec_AAECAw=="),
            Err(SignError::TooShort { bytes: 4 })
        );
        assert_eq!(standard_secret(b"whsec_!!!"), Err(SignError::BadWhsec));
    }

    #[test]
    fn whsec_and_raw_keys() {
        assert_eq!(signing_key(b"whsec_AAEC").as_deref(), Ok(&[0u8, 1, 2][..]));
        assert_eq!(
            signing_key(b"whsec_AAECAw==").as_deref(),
            Ok(&[0u8, 1, 2, 3][..])
        );
        assert_eq!(signing_key(b"plain").as_deref(), Ok(&b"plain"[..]));
        assert_eq!(signing_key(b"whsec_!!!"), Err(SignError::BadWhsec));
        assert_eq!(signing_key(b"whsec_"), Err(SignError::BadWhsec));
        assert_eq!(signing_key(b""), Err(SignError::EmptySecret));
        assert_eq!(
            webhook_signature(&[], "i", 1, b""),
            Err(SignError::NoSecret)
        );
    }

    #[test]
    fn github_docs_vector() {
        // docs.github.com "Validating webhook deliveries": secret "It's a Secret to Everybody",
        // payload "Hello, World!".
        assert_eq!(
            hub_signature_256(b"It's a Secret to Everybody", b"Hello, World!"),
            "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
        );
    }
}
