//! Verification primitives: the only place in hookspool that compares secret-derived bytes.
//!
//! Owns: HMAC computation (through the `hmac`/`sha2`/`sha1` crates), the signature schemes
//! named in spec section 10 (`hmac_hex`, `hmac_b64`, `hmac_prefixed`, `timestamped` in its
//! `t=…,v1=…` and Zoom `v0:ts:body` forms, `standard_webhooks`, `static_token`, and ES256 JWT
//! checks through `jsonwebtoken`), the two-sided timestamp tolerance, and [`ct_eq`].
//!
//! Must not: read secrets itself (callers pass the candidates a `SecretSource` gave them),
//! cache anything, log, or return anything but a yes/no (or verified claims). Every
//! comparison of a signature, token or digest goes through [`ct_eq`]; the tidy test in
//! tests/tidy.rs fails the build's tests if another comparison appears.
//!
//! Invariant: a scheme answers `true` only if at least one candidate secret produced a
//! matching value. Every candidate is tried (rotation: the old and the new secret are both
//! valid for a while), and no early exit reveals which candidate matched.

use base64::Engine as _;
use base64::alphabet;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use hmac::{Hmac, KeyInit, Mac as _};
use jsonwebtoken as jwt;
use sha1::Sha1;
use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq as _;

/// Default replay window of every timestamped scheme, both directions (spec section 10).
pub const TOLERANCE_S_DEFAULT: u64 = 300;

/// Longest timestamp header we parse; a Unix time in seconds has 10 digits until 2286.
const TIMESTAMP_DIGITS_MAX: usize = 12;

/// Longest compact JWT we hand to the decoder; Plaid's are a few hundred bytes. Bounding it
/// keeps an unauthenticated request from making us base64-decode megabytes.
pub const JWT_BYTES_MAX: usize = 8 * 1024;

/// The hash under an HMAC scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MacAlg {
    Sha256,
    Sha1,
}

/// Where the timestamp and signature live in a timestamped scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimestampedForm {
    /// One header `t=<unix s>,v1=<hex>[,v1=<hex>…]`; signed content `<t>.<body>`
    /// (the Stripe-style form many senders copy).
    TV1,
    /// Zoom: signature header `v0=<hex>`, a separate timestamp header; signed content
    /// `v0:<ts>:<body>`.
    ZoomV0,
}

/// The one constant-time comparison. Lengths are public (every scheme has a fixed output
/// length), so a length mismatch may return early; equal-length inputs are compared in time
/// independent of their contents.
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    a.ct_eq(b).into()
}

/// HMAC over the concatenation of `parts`. Used by the schemes below and by the source kit to
/// sign test requests. HMAC accepts keys of any length, so `new_from_slice` cannot fail; we
/// still map the impossible error to an empty tag (which matches nothing) rather than panic.
pub fn mac(alg: MacAlg, key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    match alg {
        MacAlg::Sha256 => match <Hmac<Sha256> as KeyInit>::new_from_slice(key) {
            Ok(mut m) => {
                for p in parts {
                    m.update(p);
                }
                m.finalize().into_bytes().to_vec()
            }
            Err(_) => Vec::new(),
        },
        MacAlg::Sha1 => match <Hmac<Sha1> as KeyInit>::new_from_slice(key) {
            Ok(mut m) => {
                for p in parts {
                    m.update(p);
                }
                m.finalize().into_bytes().to_vec()
            }
            Err(_) => Vec::new(),
        },
    }
}

/// Lowercase hex HMAC, e.g. Zoom's `encryptedToken` answer.
pub fn mac_hex(alg: MacAlg, key: &[u8], parts: &[&[u8]]) -> String {
    hex::encode(mac(alg, key, parts))
}

/// Lowercase hex SHA-256 of `data` (dedup ids, Plaid's `request_body_sha256`).
pub fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

/// True when any usable candidate's MAC equals `expected`. Empty candidates are skipped: an
/// empty key would make the "secret" public.
fn any_candidate(candidates: &[Vec<u8>], expected: &[u8], alg: MacAlg, parts: &[&[u8]]) -> bool {
    if expected.is_empty() {
        return false;
    }
    let mut ok = false;
    for key in candidates.iter().filter(|k| !k.is_empty()) {
        // `|` rather than `||`: every candidate is computed whichever one matches.
        ok |= ct_eq(&mac(alg, key, parts), expected);
    }
    ok
}

/// Hex-encoded HMAC (upper or lower case) over `parts`, e.g. Kaneo's `X-Kaneo-Signature`.
pub fn hmac_hex(presented: &str, candidates: &[Vec<u8>], alg: MacAlg, parts: &[&[u8]]) -> bool {
    match hex::decode(presented.trim()) {
        Ok(tag) => any_candidate(candidates, &tag, alg, parts),
        Err(_) => false,
    }
}

/// Base64-encoded HMAC over `parts` (standard alphabet, padding optional), e.g. Trello's
/// `X-Trello-Webhook` over body + callback URL.
pub fn hmac_b64(presented: &str, candidates: &[Vec<u8>], alg: MacAlg, parts: &[&[u8]]) -> bool {
    match decode_b64(presented.trim()) {
        Some(tag) => any_candidate(candidates, &tag, alg, parts),
        None => false,
    }
}

/// `prefix` then hex HMAC, e.g. GitHub's `sha256=<hex>`. The prefix is a format marker, not
/// secret material, so it is matched exactly before anything is decoded.
pub fn hmac_prefixed(
    presented: &str,
    prefix: &str,
    candidates: &[Vec<u8>],
    alg: MacAlg,
    parts: &[&[u8]],
) -> bool {
    match presented.trim().strip_prefix(prefix) {
        Some(rest) => hmac_hex(rest, candidates, alg, parts),
        None => false,
    }
}

/// Two-sided replay window: `|now - ts| <= tolerance_s`. Future-dated requests are refused too
/// (spec section 10), so a captured request cannot be pre-dated into a long life.
pub fn within_tolerance(ts: i64, now: f64, tolerance_s: u64) -> bool {
    let skew_s = (now - ts as f64).abs();
    skew_s.is_finite() && skew_s <= tolerance_s as f64
}

/// Parses a Unix-seconds timestamp header: ASCII digits only, bounded length.
pub fn parse_unix_s(raw: &str) -> Option<i64> {
    let raw = raw.trim();
    if raw.is_empty()
        || raw.len() > TIMESTAMP_DIGITS_MAX
        || !raw.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    raw.parse().ok()
}

/// Timestamped HMAC-SHA256 schemes.
///
/// * `TimestampedForm::TV1`: `signature_header` is `t=<ts>,v1=<hex>[,v1=<hex>]`;
///   `timestamp_header` is ignored (pass `None`).
/// * `TimestampedForm::ZoomV0`: `signature_header` is `v0=<hex>`, `timestamp_header` holds
///   the Unix seconds.
///
/// The timestamp is checked before any MAC is computed (cheap refusal of stale replays).
pub fn timestamped(
    form: TimestampedForm,
    signature_header: &str,
    timestamp_header: Option<&str>,
    candidates: &[Vec<u8>],
    body: &[u8],
    now: f64,
    tolerance_s: u64,
) -> bool {
    match form {
        TimestampedForm::TV1 => {
            let mut ts_raw = None;
            let mut tags = Vec::new();
            for item in signature_header.split(',') {
                let Some((k, v)) = item.trim().split_once('=') else {
                    return false;
                };
                match k.trim() {
                    "t" if ts_raw.is_none() => ts_raw = Some(v.trim()),
                    "t" => return false, // two timestamps: ambiguous, refuse
                    "v1" => tags.push(v.trim()),
                    _ => {} // other scheme versions (v0, …) are not ours to check
                }
            }
            let Some(ts_raw) = ts_raw else { return false };
            let Some(ts) = parse_unix_s(ts_raw) else {
                return false;
            };
            if !within_tolerance(ts, now, tolerance_s) {
                return false;
            }
            let mut ok = false;
            for tag in tags {
                ok |= hmac_hex(
                    tag,
                    candidates,
                    MacAlg::Sha256,
                    &[ts_raw.as_bytes(), b".", body],
                );
            }
            ok
        }
        TimestampedForm::ZoomV0 => {
            let Some(ts_raw) = timestamp_header.map(str::trim) else {
                return false;
            };
            let Some(ts) = parse_unix_s(ts_raw) else {
                return false;
            };
            if !within_tolerance(ts, now, tolerance_s) {
                return false;
            }
            hmac_prefixed(
                signature_header,
                "v0=",
                candidates,
                MacAlg::Sha256,
                &[b"v0:", ts_raw.as_bytes(), b":", body],
            )
        }
    }
}

/// Standard Webhooks v1 (symmetric): HMAC-SHA256 over `id.timestamp.body`, base64, in a
/// space-separated `webhook-signature` list of `v1,<b64>` entries (other versions such as
/// `v1a` are skipped). A candidate starting with `whsec_` is base64-decoded (padding
/// optional, as the reference libraries accept); any other candidate is used as raw bytes.
pub fn standard_webhooks(
    msg_id: &str,
    timestamp: &str,
    signature_header: &str,
    candidates: &[Vec<u8>],
    body: &[u8],
    now: f64,
    tolerance_s: u64,
) -> bool {
    let Some(ts) = parse_unix_s(timestamp) else {
        return false;
    };
    if msg_id.is_empty() || !within_tolerance(ts, now, tolerance_s) {
        return false;
    }
    let keys: Vec<Vec<u8>> = candidates
        .iter()
        .filter_map(|c| standard_webhooks_key(c))
        .collect();
    let parts: [&[u8]; 5] = [
        msg_id.as_bytes(),
        b".",
        timestamp.trim().as_bytes(),
        b".",
        body,
    ];
    let mut ok = false;
    for entry in signature_header.split(' ').filter(|e| !e.is_empty()) {
        let Some((version, tag_b64)) = entry.split_once(',') else {
            continue;
        };
        if version != "v1" {
            continue;
        }
        if let Some(tag) = decode_b64(tag_b64) {
            ok |= any_candidate(&keys, &tag, MacAlg::Sha256, &parts);
        }
    }
    ok
}

/// The HMAC key a Standard Webhooks secret stands for (spec section 6.4: `whsec_` prefix →
/// base64, else raw bytes). `None` for a malformed `whsec_` value, which then matches nothing.
pub fn standard_webhooks_key(secret: &[u8]) -> Option<Vec<u8>> {
    match secret.strip_prefix(b"whsec_") {
        Some(b64) => std::str::from_utf8(b64).ok().and_then(decode_b64),
        None => Some(secret.to_vec()),
    }
}

/// A shared token presented as-is (a header or a query parameter). Compared against every
/// candidate in constant time; an empty token or candidate never matches.
pub fn static_token(presented: &str, candidates: &[Vec<u8>]) -> bool {
    if presented.is_empty() {
        return false;
    }
    let mut ok = false;
    for c in candidates.iter().filter(|c| !c.is_empty()) {
        ok |= ct_eq(presented.as_bytes(), c);
    }
    ok
}

/// True when `claimed_hex` is the hex SHA-256 of `body` (case-insensitive), in constant time.
/// Plaid's `request_body_sha256` claim.
pub fn sha256_hex_matches(body: &[u8], claimed_hex: &str) -> bool {
    let computed = Sha256::digest(body);
    match hex::decode(claimed_hex.trim()) {
        Ok(claimed) => ct_eq(&computed, &claimed),
        Err(_) => false,
    }
}

/// Structure and algorithm check of a compact JWS before any key is looked up: three
/// base64url parts, a header that parses, `alg == ES256`, and a `kid`. Returns the kid.
/// This runs before any network access so a request with another alg (`none`, `HS256`, …)
/// or garbage never causes a key fetch (spec section 10).
pub fn jwt_es256_kid(jws: &str) -> Option<String> {
    if jws.is_empty() || jws.len() > JWT_BYTES_MAX || jws.split('.').count() != 3 {
        return None;
    }
    let header = jwt::decode_header(jws).ok()?;
    if header.alg != jwt::Algorithm::ES256 {
        return None;
    }
    header.kid.filter(|k| !k.is_empty())
}

/// Verifies an ES256 compact JWS with the P-256 public key (`x`, `y`: base64url, as in a JWK)
/// and returns its claims. Time claims are not checked here: the caller applies its own
/// two-sided window to the claim it trusts (Plaid: `iat`), using the request's clock.
pub fn jwt_es256(jws: &str, x: &str, y: &str) -> Option<serde_json::Value> {
    jwt_es256_kid(jws)?;
    let key = jwt::DecodingKey::from_ec_components(x, y).ok()?;
    let mut validation = jwt::Validation::new(jwt::Algorithm::ES256);
    validation.required_spec_claims.clear();
    validation.validate_exp = false;
    validation.validate_nbf = false;
    validation.validate_aud = false;
    jwt::decode::<serde_json::Value>(jws, &key, &validation)
        .ok()
        .map(|data| data.claims)
}

/// Standard-alphabet base64 that accepts what senders' libraries emit and accept: padding
/// present or not, and non-zero trailing bits (Standard Webhooks' reference libraries take
/// unpadded `whsec_` secrets by appending `==`, which Python decodes leniently).
const LENIENT_B64: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new()
        .with_decode_allow_trailing_bits(true)
        .with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

fn decode_b64(s: &str) -> Option<Vec<u8>> {
    LENIENT_B64.decode(s.trim()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(list: &[&str]) -> Vec<Vec<u8>> {
        list.iter().map(|s| s.as_bytes().to_vec()).collect()
    }

    #[test]
    fn ct_eq_basics() {
        assert!(ct_eq(b"abc", b"abc"));
        assert!(!ct_eq(b"abc", b"abd"));
        assert!(!ct_eq(b"abc", b"ab"));
    }

    #[test]
    fn tolerance_is_two_sided() {
        assert!(within_tolerance(1000, 1300.0, 300));
        assert!(within_tolerance(1000, 700.0, 300));
        assert!(!within_tolerance(1000, 1300.5, 300));
        assert!(!within_tolerance(1000, 699.0, 300));
    }

    #[test]
    fn rotation_tries_every_candidate() {
        let tag = mac_hex(MacAlg::Sha256, b"new", &[b"body"]);
        assert!(hmac_hex(
            &tag,
            &keys(&["old", "new"]),
            MacAlg::Sha256,
            &[b"body"]
        ));
        assert!(hmac_hex(
            &tag,
            &keys(&["new", "old"]),
            MacAlg::Sha256,
            &[b"body"]
        ));
        assert!(!hmac_hex(&tag, &keys(&["old"]), MacAlg::Sha256, &[b"body"]));
    }

    #[test]
    fn empty_secrets_and_tokens_never_match() {
        let tag = mac_hex(MacAlg::Sha256, b"", &[b"body"]);
        assert!(!hmac_hex(&tag, &keys(&[""]), MacAlg::Sha256, &[b"body"]));
        assert!(!static_token("", &keys(&[""])));
        assert!(!static_token("x", &keys(&[""])));
        assert!(static_token("x", &keys(&["y", "x"])));
    }

    #[test]
    fn tv1_form() {
        let sig = mac_hex(MacAlg::Sha256, b"k", &[b"1000.", b"{}"]);
        let header = format!("t=1000,v1=deadbeef,v1={sig}");
        assert!(timestamped(
            TimestampedForm::TV1,
            &header,
            None,
            &keys(&["k"]),
            b"{}",
            1000.0,
            300
        ));
        assert!(!timestamped(
            TimestampedForm::TV1,
            &header,
            None,
            &keys(&["k"]),
            b"{}",
            1301.0,
            300
        ));
        assert!(!timestamped(
            TimestampedForm::TV1,
            &header,
            None,
            &keys(&["k"]),
            b"{}",
            699.0,
            300
        ));
        assert!(!timestamped(
            TimestampedForm::TV1,
            &header,
            None,
            &keys(&["k"]),
            b"{ }",
            1000.0,
            300
        ));
        let twice = format!("t=1000,t=1000,v1={sig}");
        assert!(!timestamped(
            TimestampedForm::TV1,
            &twice,
            None,
            &keys(&["k"]),
            b"{}",
            1000.0,
            300
        ));
    }

    #[test]
    fn jwt_structure_refused_before_keys() {
        assert_eq!(jwt_es256_kid("not-a-jwt"), None);
        assert_eq!(jwt_es256_kid("a.b.c"), None);
        // {"alg":"HS256","kid":"k"} . {} . sig
        let hs = format!(
            "{}.{}.{}",
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .encode(br#"{"alg":"HS256","kid":"k"}"#),
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b"{}"),
            "c2ln"
        );
        assert_eq!(jwt_es256_kid(&hs), None);
    }
}
