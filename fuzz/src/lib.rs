//! Shared pieces of the fuzz targets: how a fuzz input becomes a request, and the secret the
//! source kits sign with.
//!
//! Owns: the input layout of the `source_flow` target and the credential splice that lets
//! the fuzzer reach classification (it controls every header and byte of the body, the kit
//! supplies a valid signature over that body). Must not: depend on the instrumented fuzzer,
//! so `cargo test` in this directory checks these helpers without honggfuzz.

use hookspool::kit::signer::Kit;
use hookspool::sources::{Request, parse_capture};

/// The secret every kit signs with. A verdict, error or quarantine class that prints it is
/// a leak (the sources' "no secret in any error or Debug output" invariant).
pub const FUZZ_SECRET: &[u8] = b"fuzz-SENTINEL-5e1f0c93";

/// Splits a raw input at the first blank line: the head is a capture's request line and
/// headers (read by `parse_capture`, as `hookspool source test` reads a `.http` file), the
/// rest is the body, byte for byte (the intake's bodies are bytes, not text).
pub fn head_and_body(data: &[u8]) -> (&[u8], &[u8]) {
    for (sep, at) in [(&b"\r\n\r\n"[..], 4), (&b"\n\n"[..], 2)] {
        if let Some(i) = data.windows(sep.len()).position(|w| w == sep) {
            return (&data[..i], &data[i + at..]);
        }
    }
    (data, &[])
}

/// The request a fuzz input stands for: the capture's method, path, query and headers, and
/// the raw body. `None` when the head is not a capture at all (no request line).
pub fn request_from(head: &[u8], body: &[u8], now: f64) -> Option<Request> {
    let text = String::from_utf8_lossy(head);
    let mut r = parse_capture(&text, now).ok()?;
    r.body = body.to_vec();
    Some(r)
}

/// How a `source_flow` input treats credentials (the low two bits of its flags byte).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Credentials {
    /// As the fuzzer wrote them: arbitrary signature headers and tokens.
    AsIs,
    /// Replaced by the kit's valid credential over this body, signed at `now + skew`.
    Signed,
    /// Every credential removed: must be refused.
    Stripped,
    /// Replaced by a credential made with a secret the source does not hold.
    WrongSecret,
}

/// The decoded control bytes of a `source_flow` input.
#[derive(Debug, Clone, Copy)]
pub struct FlowControl {
    pub kit: usize,
    pub credentials: Credentials,
    /// HEAD instead of POST (the intake evaluates HEAD only for unauthenticated handshakes).
    pub head: bool,
    /// Credential headers go before the fuzzed headers instead of after them.
    pub credentials_first: bool,
    /// Seconds between signing and receipt (negative: signed in the future).
    pub skew_s: i16,
}

/// Bytes of control before the capture in a `source_flow` input.
pub const FLOW_CONTROL_BYTES: usize = 4;

impl FlowControl {
    pub fn decode(data: &[u8], kits: usize) -> Option<(FlowControl, &[u8])> {
        if data.len() < FLOW_CONTROL_BYTES || kits == 0 {
            return None;
        }
        let flags = data[1];
        let credentials = match flags & 3 {
            0 => Credentials::AsIs,
            1 => Credentials::Signed,
            2 => Credentials::Stripped,
            _ => Credentials::WrongSecret,
        };
        Some((
            FlowControl {
                kit: data[0] as usize % kits,
                credentials,
                head: flags & 4 != 0,
                credentials_first: flags & 8 != 0,
                skew_s: i16::from_le_bytes([data[2], data[3]]),
            },
            &data[FLOW_CONTROL_BYTES..],
        ))
    }

    /// The inverse of `decode`, for writing seeds.
    pub fn encode(&self) -> [u8; FLOW_CONTROL_BYTES] {
        let creds = match self.credentials {
            Credentials::AsIs => 0,
            Credentials::Signed => 1,
            Credentials::Stripped => 2,
            Credentials::WrongSecret => 3,
        };
        let flags = creds | (self.head as u8) << 2 | (self.credentials_first as u8) << 3;
        let skew = self.skew_s.to_le_bytes();
        [self.kit as u8, flags, skew[0], skew[1]]
    }
}

/// Name and value pairs (headers or query parameters).
type Pairs = Vec<(String, String)>;

/// The headers and query parameters a kit's signer adds to a request: what the kit's request
/// has beyond Content-Type and the kit's fixed headers.
fn credentials_of(kit: &Kit, signed: &Request) -> (Pairs, Pairs) {
    let fixed = |name: &str| {
        name.eq_ignore_ascii_case("content-type")
            || kit
                .extra_headers
                .iter()
                .any(|(k, _)| k.eq_ignore_ascii_case(name))
    };
    let headers = signed
        .headers
        .iter()
        .filter(|(k, _)| !fixed(k))
        .cloned()
        .collect();
    (headers, signed.query.clone())
}

/// Puts the credentials of `template` (a kit request over the same body) onto `r`: every
/// fuzzed header or parameter of the same name goes, so the kit's value is the one a source
/// reads.
pub fn splice_credentials(kit: &Kit, r: &mut Request, template: &Request, first: bool) {
    let (headers, query) = credentials_of(kit, template);
    r.headers
        .retain(|(k, _)| !headers.iter().any(|(h, _)| h.eq_ignore_ascii_case(k)));
    r.query.retain(|(k, _)| !query.iter().any(|(q, _)| q == k));
    if first {
        let mut h = headers;
        h.append(&mut r.headers);
        r.headers = h;
        let mut q = query;
        q.append(&mut r.query);
        r.query = q;
    } else {
        r.headers.extend(headers);
        r.query.extend(query);
    }
}

/// Removes every credential the kit's source reads: its auth headers and the token parameter.
pub fn strip_credentials(kit: &Kit, r: &mut Request, now: f64) {
    let template = kit.signed(&r.body, now);
    let (headers, query) = credentials_of(kit, &template);
    for h in &kit.source.declared().auth_headers {
        r.remove_header(h);
    }
    for (h, _) in &headers {
        r.remove_header(h);
    }
    r.query.retain(|(k, _)| !query.iter().any(|(q, _)| q == k));
}

/// Whether `haystack` contains `needle` (byte strings).
pub fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

/// Whether a `Debug` rendering shows a float that is not finite (`NaN`, `inf`, `-inf`) as a
/// field value, as opposed to inside a quoted string.
pub fn debug_has_non_finite(debug: &str) -> bool {
    let b = debug.as_bytes();
    let mut in_string = false;
    let mut escaped = false;
    for i in 0..b.len() {
        let c = b[i];
        if in_string {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        if c == b'"' {
            in_string = true;
            continue;
        }
        let starts_value = i == 0 || matches!(b[i - 1], b' ' | b'(' | b'[' | b'-');
        if starts_value {
            for word in [&b"NaN"[..], b"inf"] {
                let end = i + word.len();
                if b[i..].starts_with(word)
                    && (end == b.len() || matches!(b[end], b',' | b')' | b']' | b' '))
                {
                    return true;
                }
            }
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use hookspool::kit::signer::{KIT_NOW, all_kits};

    #[test]
    fn control_round_trips() {
        let c = FlowControl {
            kit: 7,
            credentials: Credentials::WrongSecret,
            head: true,
            credentials_first: false,
            skew_s: -301,
        };
        let mut data = c.encode().to_vec();
        data.extend_from_slice(b"POST / HTTP/1.1\n\n{}");
        let (d, rest) = FlowControl::decode(&data, 20).expect("decodes");
        assert_eq!(
            (d.kit, d.credentials, d.head, d.credentials_first, d.skew_s),
            (7, Credentials::WrongSecret, true, false, -301)
        );
        assert_eq!(rest, b"POST / HTTP/1.1\n\n{}");
    }

    #[test]
    fn head_and_body_keep_body_bytes() {
        assert_eq!(
            head_and_body(b"A\r\nB: c\r\n\r\n\xff\n\n"),
            (&b"A\r\nB: c"[..], &b"\xff\n\n"[..])
        );
        assert_eq!(head_and_body(b"A\n\nxyz"), (&b"A"[..], &b"xyz"[..]));
        assert_eq!(head_and_body(b"A"), (&b"A"[..], &b""[..]));
    }

    #[test]
    fn splicing_the_kit_credential_verifies_and_stripping_refuses() {
        for kit in all_kits(FUZZ_SECRET).expect("kits") {
            let body = kit.sample_body.clone();
            let mut r = kit.unsigned(&body, KIT_NOW);
            r.headers.push(("X-Noise".into(), "1".into()));
            let signed = kit.signed(&body, KIT_NOW);
            splice_credentials(&kit, &mut r, &signed, true);
            let v = hookspool::sources::evaluate(kit.source.as_ref(), &r, &kit.secrets);
            assert!(
                matches!(v, hookspool::sources::Verdict::Accept(_)),
                "{}: {v:?}",
                kit.label
            );
            strip_credentials(&kit, &mut r, KIT_NOW);
            let v = hookspool::sources::evaluate(kit.source.as_ref(), &r, &kit.secrets);
            assert!(
                matches!(v, hookspool::sources::Verdict::Unauthorized),
                "{}: {v:?}",
                kit.label
            );
        }
    }

    #[test]
    fn non_finite_floats_are_seen_outside_strings_only() {
        assert!(debug_has_non_finite("Span { quiet_s: NaN, max_s: 1.0 }"));
        assert!(debug_has_non_finite("Some(inf)"));
        assert!(debug_has_non_finite("x: -inf }"));
        assert!(!debug_has_non_finite("name: \"inf\", info: 1.0"));
        assert!(!debug_has_non_finite("name: \"a \\\" NaN\""));
        assert!(debug_has_non_finite("NaN"));
        assert!(!debug_has_non_finite("x: In"));
    }
}

pub mod seeds;
pub mod targets;
