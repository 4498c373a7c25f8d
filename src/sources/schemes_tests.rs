//! Known-answer tests for the schemes the bobbins need (test-only): Slack `v0`, Stripe
//! `t=,v1=`, Shopify base64 HMAC, GitLab's token, Twilio's URL + form parameters (and its
//! JSON-body variant), Ed25519 (RFC 8032) and Standard Webhooks `v1a`.
//!
//! Owns: the vectors under `tests/vectors/{slack,twilio,stripe,shopify,gitlab,rfc8032,
//! standard-webhooks-v1a}/` (each folder's SOURCE.md says where they came from; the
//! CONSTRUCTED ones were computed with an implementation independent of ours), run through
//! the `verify` primitives with the clock set to each vector's own time, never a widened
//! tolerance. Every timestamped scheme is checked on both sides of its window.
//! Must not: read anything outside the checkout, or reach the network.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::Value;

use super::verify::{self, MacAlg, TOLERANCE_S_DEFAULT, TimestampedForm};

fn vectors(json: &str) -> Value {
    serde_json::from_str(json).expect("vector file is JSON")
}

fn text<'a>(v: &'a Value, field: &str) -> &'a str {
    v[field]
        .as_str()
        .unwrap_or_else(|| panic!("vector field {field}"))
}

fn keys(list: &[&str]) -> Vec<Vec<u8>> {
    list.iter().map(|s| s.as_bytes().to_vec()).collect()
}

/// The same bytes with one byte changed (the last, or the only one).
fn flip_last(data: &[u8]) -> Vec<u8> {
    let mut out = data.to_vec();
    if let Some(b) = out.last_mut() {
        *b ^= 0x01;
    }
    out
}

// ---------------------------------------------------------------- Slack v0

const SLACK: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/vectors/slack/vectors.json"
));

fn slack_verifies(header: &str, ts: &str, candidates: &[Vec<u8>], body: &[u8], now: f64) -> bool {
    // Slack's scheme is Zoom's v0 form with other header names: one primitive for both.
    verify::timestamped(
        TimestampedForm::ZoomV0,
        header,
        Some(ts),
        candidates,
        body,
        now,
        TOLERANCE_S_DEFAULT,
    )
}

#[test]
fn slack_docs_vector_verifies_inside_its_window_only() {
    let v = &vectors(SLACK)["vectors"][0];
    let secret = keys(&[text(v, "signing_secret")]);
    let ts_owned = v["timestamp"].as_i64().expect("timestamp").to_string();
    let ts = ts_owned.as_str();
    let body = text(v, "body").as_bytes();
    let header = text(v, "expected_signature");
    let at: f64 = ts.parse().expect("timestamp");
    let window = TOLERANCE_S_DEFAULT as f64;

    assert!(slack_verifies(header, ts, &secret, body, at));
    assert!(slack_verifies(header, ts, &secret, body, at + window));
    assert!(slack_verifies(header, ts, &secret, body, at - window));
    // Stale and future-dated (the request claims a time past our clock) are both refused.
    assert!(!slack_verifies(
        header,
        ts,
        &secret,
        body,
        at + window + 1.0
    ));
    assert!(!slack_verifies(
        header,
        ts,
        &secret,
        body,
        at - window - 1.0
    ));
    // Tampered body, wrong secret, another timestamp, the hex without its v0= marker.
    assert!(!slack_verifies(header, ts, &secret, &flip_last(body), at));
    assert!(!slack_verifies(header, ts, &keys(&["other"]), body, at));
    assert!(!slack_verifies(header, "1531420619", &secret, body, at));
    let bare = header.trim_start_matches("v0=");
    assert!(!slack_verifies(bare, ts, &secret, body, at));
    // Rotation: the old secret first, the right one second.
    assert!(slack_verifies(
        header,
        ts,
        &keys(&["old-secret", text(v, "signing_secret")]),
        body,
        at
    ));
}

// ---------------------------------------------------------------- Stripe t=,v1=

const STRIPE: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/vectors/stripe/vectors.json"
));

fn stripe_verifies(header: &str, candidates: &[Vec<u8>], body: &[u8], now: f64) -> bool {
    verify::timestamped(
        TimestampedForm::TV1,
        header,
        None,
        candidates,
        body,
        now,
        TOLERANCE_S_DEFAULT,
    )
}

#[test]
fn stripe_constructed_vector_and_its_window() {
    let v = vectors(STRIPE);
    let t = v["timestamp"].as_i64().expect("timestamp");
    let at = t as f64;
    let body = text(&v, "body").as_bytes();
    let current = keys(&[text(&v, "secret")]);
    let previous = keys(&[text(&v, "previous_secret")]);
    let header = format!("t={t},v1={}", text(&v, "v1"));
    let window = TOLERANCE_S_DEFAULT as f64;

    assert!(stripe_verifies(&header, &current, body, at));
    assert!(stripe_verifies(&header, &current, body, at + window));
    assert!(!stripe_verifies(&header, &current, body, at + window + 1.0));
    assert!(!stripe_verifies(&header, &current, body, at - window - 1.0));
    assert!(!stripe_verifies(&header, &current, &flip_last(body), at));
    assert!(!stripe_verifies(&header, &previous, body, at));
    // During a secret roll Stripe sends one v1 per secret, and test mode adds a v0.
    let rolled = format!(
        "t={t},v1={},v1={},v0=6ffbb59b2300aae63f272406069a9788598b792a944a07aba816edb039989a39",
        text(&v, "v1_previous"),
        text(&v, "v1")
    );
    assert!(stripe_verifies(&rolled, &previous, body, at));
    assert!(stripe_verifies(&rolled, &current, body, at));
    // A v0 alone is not ours to trust, and the timestamp is part of what is signed.
    let only_v0 = format!("t={t},v0={}", text(&v, "v1"));
    assert!(!stripe_verifies(&only_v0, &current, body, at));
    let moved = format!("t={},v1={}", t + 1, text(&v, "v1"));
    assert!(!stripe_verifies(&moved, &current, body, at));
}

// ---------------------------------------------------------------- Shopify

const SHOPIFY: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/vectors/shopify/vectors.json"
));

#[test]
fn shopify_constructed_vector() {
    let v = vectors(SHOPIFY);
    let body = text(&v, "body").as_bytes();
    let secret = keys(&[text(&v, "secret")]);
    let presented = text(&v, "hmac_b64");
    let ok = |p: &str, k: &[Vec<u8>], b: &[u8]| verify::hmac_b64(p, k, MacAlg::Sha256, &[b]);
    assert!(ok(presented, &secret, body));
    assert!(!ok(presented, &secret, &flip_last(body)));
    assert!(!ok(presented, &keys(&["another-client-secret"]), body));
    // The hex form of the same MAC is not Shopify's encoding.
    let hex_form = hex::encode(STANDARD.decode(presented).expect("b64"));
    assert!(!ok(&hex_form, &secret, body));
}

// ---------------------------------------------------------------- GitLab

const GITLAB: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/vectors/gitlab/vectors.json"
));

#[test]
fn gitlab_token_is_exact() {
    let v = vectors(GITLAB);
    let configured = keys(&[text(&v, "token")]);
    assert!(verify::static_token(text(&v, "token"), &configured));
    for near in v["refused"].as_array().expect("refused") {
        let near = near.as_str().expect("string");
        assert!(!verify::static_token(near, &configured), "{near:?}");
    }
}

// ---------------------------------------------------------------- Twilio

const TWILIO: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/vectors/twilio/vectors.json"
));

/// The vector's parameters as the form body Twilio would POST.
fn form_body(params: &Value) -> Vec<u8> {
    let mut s = form_urlencoded::Serializer::new(String::new());
    for pair in params.as_array().expect("params") {
        s.append_pair(
            pair[0].as_str().expect("name"),
            pair[1].as_str().expect("value"),
        );
    }
    s.finish().into_bytes()
}

#[test]
fn twilio_signed_content_is_url_then_sorted_name_value_pairs() {
    let content = verify::twilio_signed_content(
        "https://mycompany.com/myapp.php?foo=1&bar=2",
        b"To=%2B18005551212&CallSid=CA1&Digits=5678&Digits=1234&Body=Hello+there",
    );
    assert_eq!(
        String::from_utf8(content).expect("utf8"),
        "https://mycompany.com/myapp.php?foo=1&bar=2BodyHello thereCallSidCA1Digits1234Digits5678To+18005551212"
    );
}

#[test]
fn twilio_reference_vectors() {
    let v = vectors(TWILIO);
    let token = keys(&[text(&v, "auth_token")]);
    let body = form_body(&v["params"]);
    for case in v["form"].as_array().expect("form") {
        let url = text(case, "url");
        let presented = text(case, "signature");
        assert!(
            verify::twilio_form(presented, &token, url, &body),
            "{}",
            case["id"]
        );
        assert!(!verify::twilio_form(
            presented,
            &keys(&["54321"]),
            url,
            &body
        ));
        assert!(!verify::twilio_form(
            presented,
            &token,
            url,
            &flip_last(&body)
        ));
    }
    // The port-less URL's signature holds for the URL configured with :443 (the port left
    // out is one of the URLs twilio-python tries); a signature over another port does not.
    let plain = text(&v["form"][0], "signature");
    let with_port = text(&v["form"][1], "url");
    assert!(verify::twilio_form(plain, &token, with_port, &body));
    let port_1234 = text(&v["form"][3], "signature");
    assert!(!verify::twilio_form(
        port_1234,
        &token,
        text(&v, "url"),
        &body
    ));
    // One parameter more or one fewer is another request.
    let mut extra = body.clone();
    extra.extend_from_slice(b"&NumMedia=0");
    assert!(!verify::twilio_form(plain, &token, text(&v, "url"), &extra));

    let dup = &v["duplicate"];
    assert!(verify::twilio_form(
        text(dup, "signature"),
        &token,
        text(dup, "url"),
        text(dup, "form_body").as_bytes()
    ));
    // Repeated names are ordered by value, not by their order in the body.
    assert!(verify::twilio_form(
        text(dup, "signature"),
        &token,
        text(dup, "url"),
        b"Digits=1234&Sid=CA123&Digits=5678&SidAccount=AC123"
    ));
}

/// Issue 29: twilio-python's `RequestValidator.validate` accepts a signature over the
/// configured URL with its port left out or its scheme's default port added; hookspool
/// refused TW-VAL-ADDS-443 (a signature over `https://mycompany.com:443/...` for the
/// port-less URL). Each case is a `validate` call of twilio/twilio-python
/// tests/unit/test_request_validator.py (commit 30368b08ba580a6c18202ab20bfc68d59559ebd7),
/// named in its `test` field; tests/vectors/twilio/SOURCE.md says how each was copied.
#[test]
fn twilio_accepts_what_the_reference_validator_accepts_across_ports() {
    let v = vectors(TWILIO);
    let token = keys(&[text(&v, "auth_token")]);
    let body = form_body(&v["params"]);
    let cases = v["validate"].as_array().expect("validate");
    assert_eq!(cases.len(), 4);
    for case in cases {
        let (id, url, sig) = (text(case, "id"), text(case, "url"), text(case, "signature"));
        assert!(verify::twilio_form(sig, &token, url, &body), "{id}");
        assert!(
            verify::twilio_url_variants(url)
                .iter()
                .any(|u| u == text(case, "signed_url")),
            "{id}: the signed URL is one of the variants"
        );
        assert!(
            !verify::twilio_form(sig, &keys(&["54321"]), url, &body),
            "{id}"
        );
    }
    // Only the default port is added: a URL without a port does not take a signature over
    // :1234 (TW-PORT-1234's, for the http URL without its port).
    let http_plain = "http://mycompany.com/myapp.php?foo=1&bar=2";
    assert!(!verify::twilio_form(
        text(&v["form"][3], "signature"),
        &token,
        http_plain,
        &body
    ));
}

#[test]
fn twilio_url_variants_edit_only_the_port() {
    let v = |u: &str| verify::twilio_url_variants(u);
    assert_eq!(
        v("https://h.example/p?x=1"),
        ["https://h.example/p?x=1", "https://h.example:443/p?x=1"]
    );
    assert_eq!(
        v("https://h.example:8443/p"),
        ["https://h.example/p", "https://h.example:8443/p"]
    );
    assert_eq!(
        v("http://h.example"),
        ["http://h.example", "http://h.example:80"]
    );
    assert_eq!(
        v("https://[2001:db8::1]/p"),
        ["https://[2001:db8::1]/p", "https://[2001:db8::1]:443/p"]
    );
    assert_eq!(
        v("https://u:pw@h.example:443/p"),
        ["https://u:pw@h.example/p", "https://u:pw@h.example:443/p"]
    );
    // A colon in the path or query is not a port.
    assert_eq!(
        v("https://h.example/a:1?t=2:3"),
        [
            "https://h.example/a:1?t=2:3",
            "https://h.example:443/a:1?t=2:3"
        ]
    );
}

#[test]
fn twilio_json_url_appends_the_requests_body_hash_to_the_configured_url() {
    let q = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    assert_eq!(
        verify::twilio_json_url(
            "https://h/p?foo=1",
            &q(&[("foo", "1"), ("bodySHA256", "ab12")])
        )
        .as_deref(),
        Some("https://h/p?foo=1&bodySHA256=ab12")
    );
    assert_eq!(
        verify::twilio_json_url("https://h/p", &q(&[("bodySHA256", "ab12")])).as_deref(),
        Some("https://h/p?bodySHA256=ab12")
    );
    assert_eq!(verify::twilio_json_url("https://h/p", &q(&[])), None);
    assert_eq!(
        verify::twilio_json_url(
            "https://h/p",
            &q(&[("bodySHA256", "a"), ("bodySHA256", "b")])
        ),
        None,
        "two claims"
    );
    assert_eq!(
        verify::twilio_json_url("https://h/p", &q(&[("bodySHA256", "ab&x=1")])),
        None,
        "not hex"
    );
}

#[test]
fn twilio_json_body_variant() {
    let v = vectors(TWILIO);
    let token = keys(&[text(&v, "auth_token")]);
    let j = &v["json"];
    let url = text(j, "url");
    let body = text(j, "body").as_bytes();
    let presented = text(j, "signature");
    assert_eq!(verify::sha256_hex(body), text(j, "body_sha256"));
    assert!(verify::twilio_json(presented, &token, url, body));
    // The signature covers the URL, the URL carries the body's hash: a changed body fails.
    assert!(!verify::twilio_json(
        presented,
        &token,
        url,
        &flip_last(body)
    ));
    assert!(!verify::twilio_json(
        presented,
        &keys(&["54321"]),
        url,
        body
    ));
    let no_hash = text(&v, "url");
    assert!(!verify::twilio_json(presented, &token, no_hash, body));
    let twice = format!("{url}&bodySHA256={}", text(j, "body_sha256"));
    assert!(!verify::twilio_json(presented, &token, &twice, body));
}

// ---------------------------------------------------------------- Ed25519 and v1a

const RFC8032: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/vectors/rfc8032/vectors.json"
));

fn unhex(v: &Value, field: &str) -> Vec<u8> {
    hex::decode(text(v, field)).expect("hex")
}

#[test]
fn ed25519_rfc8032_vectors() {
    for v in vectors(RFC8032)["vectors"].as_array().expect("vectors") {
        let key = unhex(v, "public_key");
        let msg = unhex(v, "message");
        let sig = unhex(v, "signature");
        assert!(verify::ed25519(&key, &msg, &sig), "{}", v["id"]);
        let mut longer = msg.clone();
        longer.push(0);
        assert!(!verify::ed25519(&key, &longer, &sig), "{}", v["id"]);
        assert!(
            !verify::ed25519(&key, &msg, &flip_last(&sig)),
            "{}",
            v["id"]
        );
        assert!(!verify::ed25519(&key[..31], &msg, &sig), "{}", v["id"]);
        assert!(!verify::ed25519(&key, &msg, &sig[..63]), "{}", v["id"]);
    }
    // TEST 1's signature under TEST 2's key.
    let all = vectors(RFC8032);
    let (one, two) = (&all["vectors"][0], &all["vectors"][1]);
    assert!(!verify::ed25519(
        &unhex(two, "public_key"),
        &unhex(one, "message"),
        &unhex(one, "signature")
    ));
}

const V1A: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/vectors/standard-webhooks-v1a/vectors.json"
));

#[test]
fn standard_webhooks_v1a_constructed_vectors() {
    let v = vectors(V1A);
    let id = text(&v, "msg_id");
    let ts_i = v["timestamp"].as_i64().expect("timestamp");
    let ts = ts_i.to_string();
    let at = ts_i as f64;
    let body = text(&v, "body").as_bytes();
    let pk1 = keys(&[text(&v, "public_key")]);
    let pk2 = keys(&[text(&v, "public_key2")]);
    let both = keys(&[text(&v, "public_key2"), text(&v, "public_key")]);
    let sig1 = text(&v, "sig1");
    let window = TOLERANCE_S_DEFAULT;
    let check = |header: &str, k: &[Vec<u8>], b: &[u8], now: f64| {
        verify::standard_webhooks_v1a(id, &ts, header, k, b, now, window)
    };

    assert!(check(sig1, &pk1, body, at));
    assert!(check(text(&v, "sig2"), &pk2, body, at));
    // Rotation: every configured key is tried; another key alone refuses.
    assert!(check(sig1, &both, body, at));
    assert!(!check(sig1, &pk2, body, at));
    // A v1 entry beside it is skipped, not a reason to refuse; a v1 entry alone is not v1a.
    let mixed = format!("v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE= {sig1}");
    assert!(check(&mixed, &pk1, body, at));
    let as_v1 = sig1.replacen("v1a,", "v1,", 1);
    assert!(!check(&as_v1, &pk1, body, at));
    // Both sides of the window, and the tampered body.
    let w = window as f64;
    assert!(check(sig1, &pk1, body, at + w));
    assert!(!check(sig1, &pk1, body, at + w + 1.0));
    assert!(!check(sig1, &pk1, body, at - w - 1.0));
    assert!(!check(sig1, &pk1, &flip_last(body), at));
    // The id and the timestamp are signed too.
    assert!(!verify::standard_webhooks_v1a(
        "msg_other",
        &ts,
        sig1,
        &pk1,
        body,
        at,
        window
    ));
    let later = (ts_i + 1).to_string();
    assert!(!verify::standard_webhooks_v1a(
        id,
        &later,
        sig1,
        &pk1,
        body,
        at + 1.0,
        window
    ));
    // A v1 secret (whsec_ or raw) is never read as a public key, even 32 raw bytes of one.
    let raw_key = STANDARD
        .decode(text(&v, "public_key").trim_start_matches("whpk_"))
        .expect("b64");
    assert!(!check(sig1, &[raw_key], body, at));
    let whsec = format!(
        "whsec_{}",
        text(&v, "public_key").trim_start_matches("whpk_")
    );
    assert!(!check(sig1, &keys(&[&whsec]), body, at));
    assert_eq!(
        verify::standard_webhooks_public_key(b"whpk_c2hvcnQ="),
        None,
        "a whpk_ value that is not 32 bytes"
    );
    // And the symmetric v1 check does not accept a v1a entry as its own.
    assert!(!verify::standard_webhooks(
        id,
        &ts,
        sig1,
        &keys(&["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]),
        body,
        at,
        window
    ));
}
