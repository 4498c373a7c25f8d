//! A template source's declared handshakes (`handshake = { ... }`, issue 34 item 2) through
//! the real intake on a socket: each kind with a good and a bad signature or verify token,
//! and none of them enqueues, while an ordinary verified delivery to the same source does.

use aws_lc_rs::signature::{Ed25519KeyPair, KeyPair as _};
use hookspool::sources::verify::{MacAlg, mac_hex};

use super::intake::{Running, SECRET, config, events, raw, request, start_in};

const VERIFY_TOKEN: &str = "meta-verify-token-for-tests";

/// RFC 8032 section 7.1, TEST 1: the secret key (seed); its public key is the vector's.
const RFC8032_TEST1_SEED: &str = "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60";
const RFC8032_TEST1_PUBLIC: &str =
    "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a";

/// The handshake sources; `{home}` is replaced by the spool home.
const SOURCES: &str = r#"
[sources.slackish]
type = "template"
recipe = { algorithm = "hmac-sha256", signed = ["body"], header = "X-Sig", encoding = "hex" }
handshake = { kind = "echo", when = "payload.type=url_verification", field = "payload.challenge", reply = "json:challenge" }
key = "payload.team"
action = "http-main"
span = "immediate"
secrets.secret = { file = "{home}/secret" }

[sources.discordish]
type = "template"
recipe = { algorithm = "ed25519", key = "hex", signed = ["timestamp", "body"], header = "X-Signature-Ed25519", timestamp = "header:X-Signature-Timestamp", encoding = "hex" }
handshake = { kind = "ping", when = "payload.type=1", reply = '{"type":1}' }
accepted_reply = '{"type":5}'
key = "payload.application_id"
dedup = "payload.id"
action = "http-main"
span = "immediate"
secrets.secret = { file = "{home}/ed25519.pub" }

[sources.metaish]
type = "template"
recipe = { algorithm = "hmac-sha256", signed = ["body"], header = "X-Hub-Signature-256", prefix = "sha256=", encoding = "hex" }
handshake = { kind = "query", challenge = "hub.challenge", token = "hub.verify_token" }
key = "payload.object"
action = "http-main"
span = "immediate"
secrets.secret = { file = "{home}/secret" }
secrets.verify_token = { file = "{home}/verify_token" }

[sources.oktaish]
type = "template"
scheme = "static-token"
header = "Authorization"
handshake = { kind = "header", challenge = "X-Okta-Verification-Challenge", reply = "json:verification" }
key = "payload.source"
action = "http-main"
span = "immediate"
secrets.secret = { file = "{home}/secret" }

[sources.graphish]
type = "template"
recipe = { algorithm = "hmac-sha256", signed = ["body"], header = "X-Sig", encoding = "hex" }
handshake = { kind = "query", challenge = "validationToken" }
key = "payload.id"
action = "http-main"
span = "immediate"
secrets.secret = { file = "{home}/secret" }
"#;

fn start() -> Running {
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    std::fs::write(h.join("secret"), SECRET).unwrap();
    std::fs::write(h.join("verify_token"), VERIFY_TOKEN).unwrap();
    std::fs::write(h.join("ed25519.pub"), RFC8032_TEST1_PUBLIC).unwrap();
    let extra = SOURCES.replace("{home}", &h.display().to_string());
    std::fs::write(h.join("config.toml"), config(h, &extra)).unwrap();
    start_in(home)
}

fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn hmac(secret: &str, body: &[u8]) -> String {
    mac_hex(MacAlg::Sha256, secret.as_bytes(), &[body])
}

fn post(i: &Running, path: &str, headers: &[(&str, &str)], body: &[u8]) -> super::intake::Resp {
    let mut h = vec![("Content-Type", "application/json")];
    h.extend_from_slice(headers);
    raw(i.addr, &request("POST", path, &h, body))
}

#[test]
fn an_echo_handshake_is_answered_only_when_signed_and_never_enqueues() {
    let i = start();
    let body = br#"{"type":"url_verification","challenge":"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P","token":"x"}"#;
    let r = post(
        &i,
        "/hooks/slackish",
        &[("X-Sig", &hmac(SECRET, body))],
        body,
    );
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(
        r.json()["challenge"],
        "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"
    );
    let r = post(
        &i,
        "/hooks/slackish",
        &[("X-Sig", &hmac("other", body))],
        body,
    );
    assert_eq!(r.status, 401, "{r:?}");
    assert!(r.body.is_empty() || !String::from_utf8_lossy(&r.body).contains("3eZbrw1"));
    assert!(events(&i.db()).is_empty(), "a handshake never enqueues");
    // An ordinary delivery to the same source is verified and stored.
    let event = br#"{"type":"event_callback","team":"T1"}"#;
    let r = post(
        &i,
        "/hooks/slackish",
        &[("X-Sig", &hmac(SECRET, event))],
        event,
    );
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(events(&i.db()).len(), 1);
}

#[test]
fn a_ping_is_answered_pong_only_when_signed_and_never_enqueues() {
    let i = start();
    let key =
        Ed25519KeyPair::from_seed_unchecked(&hex::decode(RFC8032_TEST1_SEED).unwrap()).unwrap();
    assert_eq!(hex::encode(key.public_key().as_ref()), RFC8032_TEST1_PUBLIC);
    let ts = now_s().to_string();
    let sign = |body: &[u8]| {
        let mut m = ts.as_bytes().to_vec();
        m.extend_from_slice(body);
        hex::encode(key.sign(&m).as_ref())
    };
    let ping = br#"{"application_id":"1","id":"2","token":"t","type":1,"version":1}"#;
    let good = sign(ping);
    let send = |sig: &str, body: &[u8]| {
        post(
            &i,
            "/hooks/discordish",
            &[
                ("X-Signature-Ed25519", sig),
                ("X-Signature-Timestamp", ts.as_str()),
            ],
            body,
        )
    };
    let r = send(&good, ping);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.json(), serde_json::json!({"type": 1}));
    // Discord checks that a wrongly signed PING is refused.
    let mut bad = good.clone().into_bytes();
    bad[0] = if bad[0] == b'0' { b'1' } else { b'0' };
    let r = send(std::str::from_utf8(&bad).unwrap(), ping);
    assert_eq!(r.status, 401, "{r:?}");
    assert!(events(&i.db()).is_empty(), "a ping never enqueues");
    let command = br#"{"application_id":"1","id":"3","token":"t","type":2,"version":1}"#;
    let r = send(&sign(command), command);
    assert_eq!(r.status, 200, "{r:?}");
    // Stored, and answered with the source's declared deferred response.
    assert_eq!(r.json(), serde_json::json!({"type": 5}));
    assert_eq!(events(&i.db()).len(), 1);
    // The same interaction again is a duplicate: the same answer, nothing more stored.
    let r = send(&sign(command), command);
    assert_eq!(r.json(), serde_json::json!({"type": 5}));
    assert_eq!(events(&i.db()).len(), 1);
}

#[test]
fn a_query_handshake_with_a_verify_token_compares_it_and_never_enqueues() {
    let i = start();
    let get = |query: &str| {
        raw(
            i.addr,
            &request("GET", &format!("/hooks/metaish?{query}"), &[], b""),
        )
    };
    let r = get(&format!(
        "hub.mode=subscribe&hub.challenge=1158201444&hub.verify_token={VERIFY_TOKEN}"
    ));
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body, b"1158201444");
    assert!(
        r.header("Content-Type")
            .is_some_and(|c| c.starts_with("text/plain"))
    );
    for query in [
        "hub.mode=subscribe&hub.challenge=1158201444&hub.verify_token=wrong",
        "hub.mode=subscribe&hub.challenge=1158201444",
        "hub.mode=subscribe&hub.verify_token=meta-verify-token-for-tests",
    ] {
        let r = get(query);
        assert_eq!(r.status, 401, "{query}: {r:?}");
        assert!(!String::from_utf8_lossy(&r.body).contains("1158201444"));
    }
    // A challenge with a control character is refused even with the right token.
    let r = get(&format!(
        "hub.challenge=12%0D%0A34&hub.verify_token={VERIFY_TOKEN}"
    ));
    assert_eq!(r.status, 400, "{r:?}");
    assert!(events(&i.db()).is_empty(), "a handshake never enqueues");
    // Events are signed with the app secret, not the verify token.
    let body = br#"{"object":"whatsapp_business_account","entry":[]}"#;
    let sig = format!("sha256={}", hmac(SECRET, body));
    let r = post(&i, "/hooks/metaish", &[("X-Hub-Signature-256", &sig)], body);
    assert_eq!(r.status, 200, "{r:?}");
    let sig = format!("sha256={}", hmac(VERIFY_TOKEN, body));
    let r = post(&i, "/hooks/metaish", &[("X-Hub-Signature-256", &sig)], body);
    assert_eq!(r.status, 401, "{r:?}");
    assert_eq!(events(&i.db()).len(), 1);
}

#[test]
fn a_query_handshake_without_a_token_echoes_before_verification_and_never_enqueues() {
    let i = start();
    // Microsoft Graph's validation request: its token, decoded, back as text/plain.
    let r = raw(
        i.addr,
        &request(
            "POST",
            "/hooks/graphish?validationToken=Validation%3a+Testing+client+application+reachability",
            &[],
            b"",
        ),
    );
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(
        r.body,
        b"Validation: Testing client application reachability"
    );
    assert_eq!(r.header("X-Content-Type-Options"), Some("nosniff"));
    let r = raw(
        i.addr,
        &request("POST", "/hooks/graphish?validationToken=a%0Ab", &[], b""),
    );
    assert_ne!(r.status, 200, "{r:?}");
    // A body without a valid signature is still refused.
    let body = br#"{"id":"n1"}"#;
    let r = post(
        &i,
        "/hooks/graphish",
        &[("X-Sig", &hmac("other", body))],
        body,
    );
    assert_eq!(r.status, 401, "{r:?}");
    assert!(events(&i.db()).is_empty(), "a handshake never enqueues");
}

#[test]
fn a_header_challenge_is_answered_only_with_the_token_and_never_enqueues() {
    let i = start();
    let get =
        |headers: &[(&str, &str)]| raw(i.addr, &request("GET", "/hooks/oktaish", headers, b""));
    let challenge = (
        "X-Okta-Verification-Challenge",
        "mvFj0aNxMtcnWxUkD8Kxw6UW5MZzmLMV3PBHxmpv",
    );
    let r = get(&[("Authorization", SECRET), challenge]);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(
        r.json(),
        serde_json::json!({"verification": "mvFj0aNxMtcnWxUkD8Kxw6UW5MZzmLMV3PBHxmpv"})
    );
    let r = get(&[("Authorization", "not-the-token"), challenge]);
    assert_eq!(r.status, 401, "{r:?}");
    let r = get(&[challenge]);
    assert_eq!(r.status, 401, "{r:?}");
    // An authenticated GET that is not the handshake is refused, not stored.
    let r = get(&[("Authorization", SECRET)]);
    assert_eq!(r.status, 400, "{r:?}");
    assert!(events(&i.db()).is_empty(), "a handshake never enqueues");
    let body = br#"{"eventType":"com.okta.event_hook","source":"https://example.okta.com/api/v1/eventHooks/who1"}"#;
    let r = post(&i, "/hooks/oktaish", &[("Authorization", SECRET)], body);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(events(&i.db()).len(), 1);
}
