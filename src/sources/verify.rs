//! Verification primitives: the only place in hookspool that compares secret-derived bytes.
//!
//! Owns: HMAC computation (through the `hmac`/`sha2`/`sha1` crates), the signature schemes
//! named in spec section 10 (`hmac_hex`, `hmac_b64`, `hmac_prefixed`, `timestamped` in its
//! `t=…,v1=…` and `v0:ts:body` (Zoom, Slack) forms, `standard_webhooks`, `static_token`, and
//! ES256 JWT checks through `jsonwebtoken`), the schemes the bobbins added (`twilio_form`,
//! `twilio_json`, `ed25519` through aws-lc-rs, `standard_webhooks_v1a`), the two-sided
//! timestamp tolerance and its configurable bounds, and [`ct_eq`].
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
use sha2::{Digest as _, Sha256, Sha512};
use subtle::ConstantTimeEq as _;

/// Default replay window of every timestamped scheme, both directions (spec section 10).
pub const TOLERANCE_S_DEFAULT: u64 = 300;
/// Narrowest configurable window: below it, ordinary clock skew and proxy latency refuse
/// genuine deliveries.
pub const TOLERANCE_S_MIN: u64 = 30;
/// Widest configurable window: beyond an hour a captured request stays replayable for so
/// long that the timestamp no longer guards against replay.
pub const TOLERANCE_S_MAX: u64 = 3_600;

/// Longest timestamp header we parse: a Unix time has 10 digits in seconds and 13 in
/// milliseconds (a recipe's `timestamp_unit = "ms"`) until 2286; well inside an i64.
const TIMESTAMP_DIGITS_MAX: usize = 15;

/// Longest compact JWT we hand to the decoder; Plaid's are a few hundred bytes. Bounding it
/// keeps an unauthenticated request from making us base64-decode megabytes.
pub const JWT_BYTES_MAX: usize = 8 * 1024;

/// The hash under an HMAC scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MacAlg {
    Sha256,
    Sha1,
    /// HMAC-SHA512 (recipes only; no named scheme uses it).
    Sha512,
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
        MacAlg::Sha512 => match <Hmac<Sha512> as KeyInit>::new_from_slice(key) {
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
/// base64, else raw bytes). `None` for a malformed `whsec_` value, which then matches nothing,
/// and for a `whpk_` value: that is a v1a public key, published by the sender, and used as an
/// HMAC key it would let anyone who read it sign v1 entries.
pub fn standard_webhooks_key(secret: &[u8]) -> Option<Vec<u8>> {
    if secret.starts_with(STANDARD_WEBHOOKS_PUBLIC_KEY_PREFIX) {
        return None;
    }
    match secret.strip_prefix(b"whsec_") {
        Some(b64) => std::str::from_utf8(b64).ok().and_then(decode_b64),
        None => Some(secret.to_vec()),
    }
}

/// How a Standard Webhooks v1a public key is serialised (`whpk_<base64>`).
pub const STANDARD_WEBHOOKS_PUBLIC_KEY_PREFIX: &[u8] = b"whpk_";

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

/// The key a recipe's compact JWS is checked with.
pub enum JwsKey<'a> {
    /// HS256: the shared secret's bytes.
    Hs256(&'a [u8]),
    /// ES256: an X.509 SubjectPublicKeyInfo (DER) or an uncompressed SEC1 point.
    Es256(&'a [u8]),
    /// RS256: an RSA public key as a JWK's `n` and `e` (base64url, unpadded).
    Rs256 { n: &'a str, e: &'a str },
}

/// The `kid` of a compact JWS whose header names `alg`, checked before any key is looked
/// up (three parts, at most [`JWT_BYTES_MAX`], a header that parses, exactly that
/// algorithm, a kid of printable ASCII up to 128 bytes). A request failing this never
/// causes a key fetch.
pub fn jws_kid(jws: &str, alg: jwt::Algorithm) -> Option<String> {
    if jws.is_empty() || jws.len() > JWT_BYTES_MAX || jws.split('.').count() != 3 {
        return None;
    }
    let header = jwt::decode_header(jws).ok()?;
    if header.alg != alg {
        return None;
    }
    header
        .kid
        .filter(|k| !k.is_empty() && k.len() <= 128 && k.bytes().all(|b| b.is_ascii_graphic()))
}

/// The RSA public key of a JWK (`{"kty":"RSA","n":..,"e":..}`) as its `n` and `e`, when
/// it is one that may verify RS256 (`alg` absent or RS256, `use` absent or `sig`).
pub fn jwk_rsa(jwk: &serde_json::Value) -> Option<(String, String)> {
    if jwk.get("kty")?.as_str()? != "RSA" {
        return None;
    }
    if jwk.get("alg").is_some_and(|a| a.as_str() != Some("RS256"))
        || jwk.get("use").is_some_and(|u| u.as_str() != Some("sig"))
    {
        return None;
    }
    let part = |k: &str| {
        jwk.get(k)
            .and_then(|v| v.as_str())
            .map(|v| v.trim_end_matches('=').to_string())
            .filter(|v| !v.is_empty())
    };
    Some((part("n")?, part("e")?))
}

/// Verifies a compact JWS through jsonwebtoken with exactly the algorithm `key` is for (a
/// header naming another, `none` included, is refused before any key use) and returns its
/// claims. Time claims are not checked here: the caller applies the request's clock.
pub fn jws_claims(jws: &str, key: &JwsKey<'_>) -> Option<serde_json::Value> {
    use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
    if jws.is_empty() || jws.len() > JWT_BYTES_MAX || jws.split('.').count() != 3 {
        return None;
    }
    let alg = match key {
        JwsKey::Hs256(_) => jwt::Algorithm::HS256,
        JwsKey::Es256(_) => jwt::Algorithm::ES256,
        JwsKey::Rs256 { .. } => jwt::Algorithm::RS256,
    };
    if jwt::decode_header(jws).ok()?.alg != alg {
        return None;
    }
    let decoding = match key {
        JwsKey::Hs256(secret) if !secret.is_empty() => {
            jwt::DecodingKey::from_secret(secret).ok()?
        }
        JwsKey::Hs256(_) => return None,
        JwsKey::Es256(k) if k.len() == 65 && k[0] == 0x04 => jwt::DecodingKey::from_ec_components(
            &URL_SAFE_NO_PAD.encode(&k[1..33]),
            &URL_SAFE_NO_PAD.encode(&k[33..]),
        )
        .ok()?,
        JwsKey::Es256(der) => {
            let pem = format!(
                "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n",
                STANDARD.encode(der)
            );
            jwt::DecodingKey::from_ec_pem(pem.as_bytes()).ok()?
        }
        JwsKey::Rs256 { n, e } => jwt::DecodingKey::from_rsa_components(n, e).ok()?,
    };
    let mut validation = jwt::Validation::new(alg);
    validation.required_spec_claims.clear();
    validation.validate_exp = false;
    validation.validate_nbf = false;
    validation.validate_aud = false;
    jwt::decode::<serde_json::Value>(jws, &decoding, &validation)
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

/// Standard-alphabet base64, padding optional (signatures and keys the senders write).
pub fn decode_b64(s: &str) -> Option<Vec<u8>> {
    LENIENT_B64.decode(s.trim()).ok()
}

// ------------------------------------------------------------------------------------------
// Schemes added for the bobbins (issue 14). Appended here, after the primitives above, which
// they reuse; placed before the test module only because clippy refuses items after it.
//
// Already covered above, reused by name rather than copied:
// * Slack `v0` (`X-Slack-Signature: v0=<hex>` over `v0:<ts>:<body>`, timestamp in
//   `X-Slack-Request-Timestamp`) is exactly [`TimestampedForm::ZoomV0`] through [`timestamped`].
// * Stripe (`Stripe-Signature: t=<ts>,v1=<hex>[,v0=…]` over `<t>.<body>`) is
//   [`TimestampedForm::TV1`]; its libraries' default tolerance is our 300 s.
// * Shopify (`X-Shopify-Hmac-Sha256`: base64 HMAC-SHA256 of the body) is [`hmac_b64`].
// * GitLab (`X-Gitlab-Token`: the shared token itself) is [`static_token`].
// ------------------------------------------------------------------------------------------

/// Length of an Ed25519 public key (RFC 8032 section 5.1.5).
pub const ED25519_PUBLIC_KEY_BYTES: usize = 32;

/// The query parameter that carries the body's SHA-256 in Twilio's JSON-body variant.
pub const TWILIO_BODY_SHA256_PARAM: &str = "bodySHA256";

/// The content Twilio signs for a form POST: the full URL it requested, then every POST
/// parameter's name immediately followed by its value, in order of name (a repeated name in
/// order of value, as the reference library sorts a multi-dict). Parameters are the
/// `application/x-www-form-urlencoded` body decoded (`+` is a space, `%XX` a byte).
pub fn twilio_signed_content(url: &str, form_body: &[u8]) -> Vec<u8> {
    let mut params: Vec<(String, String)> = form_urlencoded::parse(form_body)
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    params.sort();
    let mut content = url.as_bytes().to_vec();
    for (name, value) in &params {
        content.extend_from_slice(name.as_bytes());
        content.extend_from_slice(value.as_bytes());
    }
    content
}

/// The URLs a Twilio signature may cover for one configured URL, as twilio-python's
/// `RequestValidator.validate` tries them ("sig generation on back end is inconsistent"):
/// the URL with its port removed, and the URL with the scheme's default port added when it
/// has none (`:443` for https, `:80` for http). The URL as configured is always one of
/// them. Text edits only: a URL parser would normalise what Twilio signed byte for byte.
pub fn twilio_url_variants(url: &str) -> Vec<String> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return vec![url.to_string()];
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    // The port is what follows the last ':' after the host, an IPv6 literal's brackets
    // and any user info excluded.
    let host_start = authority.rfind('@').map_or(0, |i| i + 1);
    let host_and_port = &authority[host_start..];
    let port_at = host_and_port
        .rfind(':')
        .filter(|&i| !host_and_port[i..].contains(']'))
        .filter(|&i| {
            let p = &host_and_port[i + 1..];
            !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit())
        });
    let head = &authority[..host_start];
    let (with, without) = match port_at {
        Some(i) => (host_and_port.to_string(), host_and_port[..i].to_string()),
        None => {
            let default_port = match scheme.to_ascii_lowercase().as_str() {
                "https" => Some("443"),
                "http" => Some("80"),
                _ => None,
            };
            let with = match default_port {
                Some(p) => format!("{host_and_port}:{p}"),
                None => host_and_port.to_string(),
            };
            (with, host_and_port.to_string())
        }
    };
    let mut out = vec![
        format!("{scheme}://{head}{without}{tail}"),
        format!("{scheme}://{head}{with}{tail}"),
    ];
    out.dedup();
    out
}

/// Whether `presented` is Twilio's signature over any of [`twilio_url_variants`] of
/// `url`, each followed by `after` (the form's sorted parameters, or nothing). Every
/// variant is checked (no early exit), each through [`ct_eq`].
fn twilio_signed(presented: &str, candidates: &[Vec<u8>], url: &str, after: &[u8]) -> bool {
    twilio_url_variants(url).iter().fold(false, |ok, u| {
        ok | hmac_b64(presented, candidates, MacAlg::Sha1, &[u.as_bytes(), after])
    })
}

/// Twilio's `X-Twilio-Signature` on a form POST (Messaging and Voice webhooks): base64
/// HMAC-SHA1, keyed with the account's Auth Token, over [`twilio_signed_content`]. `url` is
/// the URL exactly as configured at Twilio (scheme, host, port if any, path and query): the
/// reverse proxy rewrites what we see, so the caller takes it from configuration, never from
/// the request; a signature over it with its default port written out (or its port left
/// out) holds too, as twilio-python accepts ([`twilio_url_variants`]). No timestamp:
/// Twilio's scheme has none, so dedup on `MessageSid` is the only replay guard.
pub fn twilio_form(presented: &str, candidates: &[Vec<u8>], url: &str, form_body: &[u8]) -> bool {
    let content = twilio_signed_content("", form_body);
    twilio_signed(presented, candidates, url, &content)
}

/// The URL Twilio requested for a JSON body: the configured URL with the request's
/// `bodySHA256` appended as Twilio appends it (`?` or `&`, then
/// `bodySHA256=<hex>`). `None` unless the request's query holds exactly one.
pub fn twilio_json_url(callback_url: &str, query: &[(String, String)]) -> Option<String> {
    let claimed: Vec<&str> = query
        .iter()
        .filter(|(k, _)| k == TWILIO_BODY_SHA256_PARAM)
        .map(|(_, v)| v.as_str())
        .collect();
    let [claimed] = claimed.as_slice() else {
        return None;
    };
    // Hex only: anything else could not match a SHA-256 and must not shape the URL.
    if claimed.is_empty() || !claimed.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let sep = if callback_url.contains('?') { '&' } else { '?' };
    Some(format!(
        "{callback_url}{sep}{TWILIO_BODY_SHA256_PARAM}={claimed}"
    ))
}

/// Twilio's JSON-body variant: the URL Twilio requested carries
/// `bodySHA256=<hex SHA-256 of the raw body>` and the signature covers that URL alone (no
/// parameters). `url` is the configured URL with the request's query string, as Twilio sent
/// it ([`twilio_json_url`]); as for a form, the URL's default-port variants hold too. Both
/// the body hash and the signature must hold; the hash is public data, the signature is
/// compared through [`ct_eq`] like every other.
pub fn twilio_json(presented: &str, candidates: &[Vec<u8>], url: &str, body: &[u8]) -> bool {
    let Some((_, query)) = url.split_once('?') else {
        return false;
    };
    let claimed: Vec<String> = form_urlencoded::parse(query.as_bytes())
        .filter(|(k, _)| k.as_ref() == TWILIO_BODY_SHA256_PARAM)
        .map(|(_, v)| v.into_owned())
        .collect();
    // Exactly one claim: two would leave open which one the sender meant.
    let [claimed] = claimed.as_slice() else {
        return false;
    };
    let body_ok = sha256_hex_matches(body, claimed);
    let signed_ok = twilio_signed(presented, candidates, url, b"");
    body_ok & signed_ok
}

/// One Ed25519 signature check (RFC 8032, through aws-lc-rs; never our own arithmetic). A key
/// or signature of the wrong length is refused by the library, which answers false.
pub fn ed25519(public_key: &[u8], message: &[u8], signature: &[u8]) -> bool {
    aws_lc_rs::signature::UnparsedPublicKey::new(&aws_lc_rs::signature::ED25519, public_key)
        .verify(message, signature)
        .is_ok()
}

/// One ECDSA P-256 / SHA-256 signature check through aws-lc-rs (never our own arithmetic).
/// `public_key` is an X.509 SubjectPublicKeyInfo (DER) or an uncompressed SEC1 point
/// (`04 || x || y`); `signature` is ASN.1 DER, or the fixed 64-byte `r || s` a JWS uses (a
/// 64-byte value is tried both ways: each is a valid proof by the key). Anything malformed
/// is refused by the library, which answers false.
pub fn ecdsa_p256(public_key: &[u8], message: &[u8], signature: &[u8]) -> bool {
    use aws_lc_rs::signature::{
        ECDSA_P256_SHA256_ASN1, ECDSA_P256_SHA256_FIXED, UnparsedPublicKey,
    };
    let der = UnparsedPublicKey::new(&ECDSA_P256_SHA256_ASN1, public_key)
        .verify(message, signature)
        .is_ok();
    let fixed = signature.len() == 64
        && UnparsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, public_key)
            .verify(message, signature)
            .is_ok();
    der | fixed
}

/// The public key bytes [`ecdsa_p256`] takes, from a PEM `PUBLIC KEY` block (the base64
/// between its BEGIN and END lines, decoded; the DER is checked by the library).
pub fn pem_public_key(text: &str) -> Option<Vec<u8>> {
    let (_, rest) = text.split_once("-----BEGIN PUBLIC KEY-----")?;
    let (b64, _) = rest.split_once("-----END PUBLIC KEY-----")?;
    let joined: String = b64.split_whitespace().collect();
    decode_b64(&joined)
}

/// The uncompressed SEC1 point of an EC P-256 JWK (`{"kty":"EC","crv":"P-256","x":..,"y":..}`,
/// x and y base64url of 32 bytes each), which [`ecdsa_p256`] takes as a key.
pub fn jwk_p256_point(jwk: &serde_json::Value) -> Option<Vec<u8>> {
    if jwk.get("kty")?.as_str()? != "EC" || jwk.get("crv")?.as_str()? != "P-256" {
        return None;
    }
    let coord = |k: &str| {
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(jwk.get(k)?.as_str()?.trim_end_matches('='))
            .ok()
            .filter(|c| c.len() == 32)
    };
    let (x, y) = (coord("x")?, coord("y")?);
    let mut point = Vec::with_capacity(65);
    point.push(0x04);
    point.extend_from_slice(&x);
    point.extend_from_slice(&y);
    Some(point)
}

/// The Ed25519 public key a Standard Webhooks `whpk_<base64>` value stands for. `None` for
/// anything else (a `whsec_` or raw value is a v1 secret, never a public key), including a
/// `whpk_` value that does not decode to 32 bytes.
pub fn standard_webhooks_public_key(value: &[u8]) -> Option<Vec<u8>> {
    let b64 = std::str::from_utf8(value.strip_prefix(STANDARD_WEBHOOKS_PUBLIC_KEY_PREFIX)?).ok()?;
    decode_b64(b64).filter(|k| k.len() == ED25519_PUBLIC_KEY_BYTES)
}

/// Standard Webhooks v1a (asymmetric): Ed25519 over `id.timestamp.body`, base64, as `v1a,<b64>`
/// entries of the space-separated `webhook-signature` list (`v1` and other entries are
/// skipped; [`standard_webhooks`] checks `v1`). `public_keys` are the candidates' `whpk_`
/// values (rotation: every key is tried against every entry); a candidate that is not a
/// `whpk_` key matches nothing. Two-sided timestamp window, checked before any signature.
pub fn standard_webhooks_v1a(
    msg_id: &str,
    timestamp: &str,
    signature_header: &str,
    public_keys: &[Vec<u8>],
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
    let keys: Vec<Vec<u8>> = public_keys
        .iter()
        .filter_map(|k| standard_webhooks_public_key(k))
        .collect();
    if keys.is_empty() {
        return false;
    }
    let mut signed = Vec::with_capacity(msg_id.len() + timestamp.len() + body.len() + 2);
    signed.extend_from_slice(msg_id.as_bytes());
    signed.push(b'.');
    signed.extend_from_slice(timestamp.trim().as_bytes());
    signed.push(b'.');
    signed.extend_from_slice(body);
    let mut ok = false;
    for entry in signature_header.split(' ').filter(|e| !e.is_empty()) {
        let Some(("v1a", sig_b64)) = entry.split_once(',') else {
            continue;
        };
        if let Some(sig) = decode_b64(sig_b64) {
            for key in &keys {
                // `|` rather than `||`: every key is tried whichever one matches.
                ok |= ed25519(key, &signed, &sig);
            }
        }
    }
    ok
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

    /// Regression: a `whpk_` public key configured as a v1 secret was used as raw HMAC key
    /// bytes, so anyone holding the published key could sign v1 entries.
    #[test]
    fn a_standard_webhooks_public_key_is_never_an_hmac_key() {
        let public = b"whpk_gSZ/4wOJvP73Lf56dDNrhRTEQMqk0EZjOBIq9FlsmZI=";
        let forged = mac(MacAlg::Sha256, public, &[b"msg_1.1000.{}"]);
        let header = format!(
            "v1,{}",
            base64::engine::general_purpose::STANDARD.encode(forged)
        );
        assert_eq!(standard_webhooks_key(public), None);
        assert!(!standard_webhooks(
            "msg_1",
            "1000",
            &header,
            &[public.to_vec()],
            b"{}",
            1000.0,
            300
        ));
        // The same bytes under another name are an ordinary raw secret.
        let raw = b"xwhpk_raw";
        let tag = mac(MacAlg::Sha256, raw, &[b"msg_1.1000.{}"]);
        let header = format!(
            "v1,{}",
            base64::engine::general_purpose::STANDARD.encode(tag)
        );
        assert!(standard_webhooks(
            "msg_1",
            "1000",
            &header,
            &[raw.to_vec()],
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
