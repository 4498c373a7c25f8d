//! Known-answer and third-party-material tests (test-only).
//!
//! Owns: the vectors in `tests/vectors` run through the real sources with the clock set to
//! each vector's time (never a widened tolerance), the octokit payload examples through the
//! github source, the generated-key Plaid tests (a P-256 key made here, its JWK served by a
//! real HTTP server on 127.0.0.1:0 and by a stub), and the Trello generated-secret test.
//! Must not: reach the network beyond loopback.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Value, json};

use super::body::FORM_MEDIA_TYPE;
use super::plaid::{FetchError, JwkFetcher, KeyCache, Plaid, PlaidJwk, StaticJwkFetcher};
use super::verify::{self, MacAlg, TOLERANCE_S_DEFAULT};
use super::{Request, Source, Verdict, build, evaluate};
use crate::kit::signer::{Kit, MapSecrets, plaid_jws};

/// The third-party vectors the repository carries (tests/vectors, each folder with its
/// SOURCE.md).
fn vectors_dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/vectors"))
}

fn read(rel: &str) -> String {
    let p = vectors_dir().join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn read_json(rel: &str) -> Value {
    serde_json::from_str(&read(rel)).expect("vector json")
}

/// A captured `.http` file as a request.
fn parse_http(text: &str, now: f64) -> Request {
    super::flow::parse_capture(text, now).expect("capture parses")
}

fn secrets(name: &str, value: &str) -> MapSecrets {
    MapSecrets::new().with(name, value.as_bytes())
}

// ---------------------------------------------------------------- Standard Webhooks

#[test]
fn standard_webhooks_sw_a() {
    let v = read_json("standard-webhooks/vectors.json");
    let sw = &v["vectors"][0];
    assert_eq!(sw["id"], "SW-A");
    let ts = sw["timestamp"].as_i64().expect("ts");
    let secret = sw["secret"].as_str().expect("secret");
    let body = sw["payload"].as_str().expect("payload");
    let sig = sw["expected_signature"].as_str().expect("sig");
    let id = sw["msg_id"].as_str().expect("id");
    let req = |sig: &str, now: f64| {
        Request::new("POST", "/webhook", now)
            .with_header("webhook-id", id)
            .with_header("webhook-timestamp", &ts.to_string())
            .with_header("webhook-signature", sig)
            .with_body(body)
    };
    let tpl: toml::Table = "scheme = \"standard-webhooks\"\nkey = \"all\""
        .parse()
        .expect("toml");
    let sources: [Arc<dyn Source>; 2] = [
        build("sw", "standard-webhooks", &toml::Table::new()).expect("sw"),
        build("tpl", "template", &tpl).expect("tpl"),
    ];
    let now = ts as f64;
    for s in &sources {
        assert!(
            s.verify(&req(sig, now), &secrets("secret", secret))
                .expect("verify"),
            "{}",
            s.declared().kind
        );
        // The .http capture carries the same request.
        let cap = parse_http(&read("standard-webhooks/SW-A.http"), now);
        assert!(s.verify(&cap, &secrets("secret", secret)).expect("verify"));
        // Negative vectors.
        let wrong = v["negative_vectors"][0]["signature"].as_str().expect("neg");
        assert!(
            !s.verify(&req(wrong, now), &secrets("secret", secret))
                .expect("verify")
        );
        let others: Vec<&str> = v["negative_vectors"][1]["signatures"]
            .as_array()
            .expect("list")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert!(
            !s.verify(&req(&others.join(" "), now), &secrets("secret", secret))
                .expect("verify")
        );
        // Several signatures: a valid one after unrelated ones still verifies.
        let multi = format!("{} {sig}", others.join(" "));
        assert!(
            s.verify(&req(&multi, now), &secrets("secret", secret))
                .expect("verify")
        );
        // Rotation: the right secret as the second candidate.
        let rot = MapSecrets::new()
            .with("secret", b"whsec_AAAAAAAAAAAAAAAAAAAAAAAA")
            .with("secret", secret.as_bytes());
        assert!(s.verify(&req(sig, now), &rot).expect("verify"));
        // Stale and future by one second past the window.
        let tol = TOLERANCE_S_DEFAULT as f64;
        assert!(
            !s.verify(&req(sig, now + tol + 1.0), &secrets("secret", secret))
                .expect("verify")
        );
        assert!(
            !s.verify(&req(sig, now - tol - 1.0), &secrets("secret", secret))
                .expect("verify")
        );
        assert!(
            s.verify(&req(sig, now + tol), &secrets("secret", secret))
                .expect("verify")
        );
    }
    // The whsec_ value base64-decodes to the HMAC key; the raw-key form of the same key works.
    let raw = verify::standard_webhooks_key(secret.as_bytes()).expect("key");
    let cand = vec![raw];
    let ts_s = ts.to_string();
    assert!(verify::standard_webhooks(
        id,
        &ts_s,
        sig,
        &cand,
        body.as_bytes(),
        now,
        TOLERANCE_S_DEFAULT
    ));
    // Unpadded secrets (library test_signature_verification_with_unpadded_secret).
    for unpadded in [
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaS",
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSwBr",
    ] {
        assert!(
            verify::standard_webhooks_key(unpadded.as_bytes()).is_some(),
            "{unpadded}"
        );
    }
}

// ---------------------------------------------------------------- GitHub

#[test]
fn github_docs_hello_world() {
    let v = read_json("github/vectors.json");
    let gh = &v["vectors"][0];
    let secret = gh["secret"].as_str().expect("secret");
    let s = build("github", "github", &toml::Table::new()).expect("github");
    let cap = parse_http(&read("github/docs-hello-world.http"), 0.0);
    assert_eq!(cap.body, gh["body"].as_str().expect("body").as_bytes());
    assert_eq!(cap.header("X-Hub-Signature-256"), gh["expected"].as_str());
    assert!(s.verify(&cap, &secrets("secret", secret)).expect("verify"));
    // The capture is a ping: verified, then ignored (spec section 10), not answered.
    assert_eq!(s.ignore(&cap).expect("ignore").as_deref(), Some("ping"));
    assert_eq!(
        s.challenge(&cap, &secrets("secret", secret))
            .expect("challenge"),
        None
    );
    // The same check through the template's hex scheme.
    let tpl: toml::Table =
        "scheme = \"hmac-sha256-hex\"\nheader = \"X-Hub-Signature-256\"\nprefix = \"sha256=\"\nkey = \"all\"".parse().expect("toml");
    let t = build("tpl", "template", &tpl).expect("tpl");
    assert!(t.verify(&cap, &secrets("secret", secret)).expect("verify"));
    // Negative vectors: altered digit, non-hex, wrong secret.
    for neg in v["negative_vectors"].as_array().expect("negs") {
        let mut r = cap.clone();
        let secret_used = neg["secret"].as_str().unwrap_or(secret);
        if let Some(h) = neg["header"].as_str() {
            r.remove_header("X-Hub-Signature-256");
            r = r.with_header("X-Hub-Signature-256", h);
        }
        assert!(
            !s.verify(&r, &secrets("secret", secret_used))
                .expect("verify"),
            "{neg}"
        );
        assert!(
            !t.verify(&r, &secrets("secret", secret_used))
                .expect("verify"),
            "{neg}"
        );
    }
}

#[test]
fn octokit_payload_examples() {
    let dir = vectors_dir().join("github/payload-examples");
    let kit = Kit::builtin("github", b"octokit-secret").expect("kit");
    let s = &kit.source;
    let mut seen = 0;
    let mut entries: Vec<_> = std::fs::read_dir(&dir)
        .expect("payload dir")
        .map(|e| e.expect("entry").path())
        .collect();
    entries.sort();
    for path in entries {
        let file = path
            .file_name()
            .and_then(|f| f.to_str())
            .expect("name")
            .to_string();
        if !file.ends_with(".payload.json") {
            continue;
        }
        seen += 1;
        let event = file.split('.').next().expect("event");
        let body = std::fs::read(&path).expect("read payload");
        let delivery = format!("delivery-{file}");
        let mut k = Kit::builtin("github", b"octokit-secret").expect("kit");
        k.extra_headers = vec![
            ("X-GitHub-Event".into(), event.into()),
            ("X-GitHub-Delivery".into(), delivery.clone()),
        ];
        let req = k.signed(&body, 0.0);
        assert!(s.verify(&req, &kit.secrets).expect("verify"), "{file}");
        if event == "ping" {
            assert_eq!(
                s.ignore(&req).expect("ignore").as_deref(),
                Some("ping"),
                "{file}"
            );
            continue;
        }
        assert_eq!(s.ignore(&req).expect("ignore"), None, "{file}");
        let payload = s.payload(&req).expect("payload");
        let repo = payload["repository"]["full_name"]
            .as_str()
            .expect("repo")
            .to_string();
        let class = match event {
            "check_suite" | "workflow_run" => "ci",
            "pull_request" => "pr",
            other => other,
        };
        assert_eq!(
            s.key(&payload, &req).expect("key"),
            format!("{repo}:{class}"),
            "{file}"
        );
        assert_eq!(
            s.event_type(&payload, &req).expect("event_type"),
            event,
            "{file}"
        );
        assert_eq!(
            s.dedup_id(&payload, &req).expect("dedup"),
            Some(delivery),
            "{file}"
        );
        let attrs = s.attrs(&payload, &req).expect("attrs");
        assert_eq!(attrs.get("repo"), Some(&repo), "{file}");
        assert_eq!(
            attrs.get("class").map(String::as_str),
            Some(class),
            "{file}"
        );
        assert_eq!(s.declared().action.as_deref(), Some("hermes:github"));
        // The same delivery from a hook whose content type is `form`: GitHub sends the JSON
        // url-encoded in the `payload` field and signs those form bytes.
        let wire = form_urlencoded::Serializer::new(String::new())
            .append_pair("payload", std::str::from_utf8(&body).expect("utf-8 json"))
            .finish();
        let mut form_req = k.signed(wire.as_bytes(), 0.0);
        form_req.remove_header("Content-Type");
        form_req = form_req.with_header("Content-Type", FORM_MEDIA_TYPE);
        let Verdict::Accept(as_form) = evaluate(s.as_ref(), &form_req, &kit.secrets) else {
            panic!("{file}: the form delivery is not accepted");
        };
        let Verdict::Accept(as_json) = evaluate(s.as_ref(), &req, &kit.secrets) else {
            panic!("{file}: the JSON delivery is not accepted");
        };
        assert_eq!(
            as_form, as_json,
            "{file}: form and JSON deliveries classify alike"
        );
    }
    assert!(
        seen >= 10,
        "only {seen} payload examples in {}",
        dir.display()
    );
}

/// A real form-encoded GitHub delivery (a `ping`, recorded byte for byte with GitHub's
/// SHA-1 signature; see tests/vectors/github/SOURCE.md). Regression: such bodies were
/// quarantined (BadPayload) even when the signature verified.
#[test]
fn github_form_encoded_delivery_is_classified_from_its_payload_field() {
    const HOOK_SECRET: &str = "whatever";
    let cap = parse_http(&read("github/form-ping.http"), 0.0);
    // The bytes are GitHub's: its own signature over them checks out.
    let sha1 = cap.header("X-Hub-Signature").expect("sha1 header");
    assert!(verify::hmac_prefixed(
        sha1,
        "sha1=",
        &[HOOK_SECRET.as_bytes().to_vec()],
        MacAlg::Sha1,
        &[&cap.body]
    ));
    // GitHub sends X-Hub-Signature-256 over the same bytes with the same secret.
    let sha256 = format!(
        "sha256={}",
        verify::mac_hex(MacAlg::Sha256, HOOK_SECRET.as_bytes(), &[&cap.body])
    );
    let signed = cap.clone().with_header("X-Hub-Signature-256", &sha256);
    let s = build("github", "github", &toml::Table::new()).expect("github");
    let keys = secrets("secret", HOOK_SECRET);
    assert!(matches!(
        evaluate(s.as_ref(), &signed, &keys),
        Verdict::Ignored(ref r) if r == "ping"
    ));
    // The same delivery under an event that is not ignored reaches classification, which
    // reads the JSON from the form's `payload` field.
    let mut push = signed.clone();
    push.remove_header("X-GitHub-Event");
    let push = push.with_header("X-GitHub-Event", "push");
    let Verdict::Accept(a) = evaluate(s.as_ref(), &push, &keys) else {
        panic!("a verified form delivery is accepted, not quarantined");
    };
    assert_eq!(a.key, "meejah/AutobahnPython:push");
    assert_eq!(a.payload["zen"], "Approachable is better than simple.");
    assert_eq!(a.payload["hook"]["config"]["content_type"], "form");
    assert_eq!(
        a.dedup_id.as_deref(),
        Some("0f1c7e00-b6d9-11e8-9e6c-0d5e6f9a1b2c")
    );
    // Tampered form bytes are refused before any decoding.
    let mut tampered = push.clone();
    tampered.body[10] ^= 1;
    assert!(matches!(
        evaluate(s.as_ref(), &tampered, &keys),
        Verdict::Unauthorized
    ));
    // A form body without Content-Type says nothing about being a form: it is not JSON.
    let mut untyped = push.clone();
    untyped.remove_header("Content-Type");
    assert!(matches!(
        evaluate(s.as_ref(), &untyped, &keys),
        Verdict::Quarantine {
            class: "BadPayload"
        }
    ));
}

/// Slack's published signing example is a slash command: a flat form. Its bytes are
/// checked against Slack's own signature, then read by a template with `body = "form"`.
#[test]
fn slack_slash_command_form_through_the_template() {
    let v = read_json("slack/vectors.json");
    let sv = &v["vectors"][0];
    let cap = parse_http(&read("slack/slash-command.http"), 0.0);
    assert_eq!(cap.body, sv["body"].as_str().expect("body").as_bytes());
    let ts = sv["timestamp"].as_i64().expect("ts");
    assert!(verify::timestamped(
        verify::TimestampedForm::ZoomV0,
        cap.header("X-Slack-Signature").expect("signature"),
        cap.header("X-Slack-Request-Timestamp"),
        &[sv["signing_secret"]
            .as_str()
            .expect("secret")
            .as_bytes()
            .to_vec()],
        &cap.body,
        ts as f64,
        TOLERANCE_S_DEFAULT,
    ));
    let kit = Kit::template(
        "slack",
        "scheme = \"hmac-sha256-hex\"\nheader = \"X-Signature\"\nbody = \"form\"\n\
         key = [\"payload.team_id\", \"payload.channel_id\"]\n\
         dedup = \"payload.trigger_id\"\nevent_type = \"payload.command\"\n\
         attrs = { user = \"payload.user_name\" }",
        b"tpl-secret",
    )
    .expect("template");
    let mut req = kit.signed(&cap.body, ts as f64);
    req.remove_header("Content-Type");
    req = req.with_header("Content-Type", FORM_MEDIA_TYPE);
    let Verdict::Accept(a) = evaluate(kit.source.as_ref(), &req, &kit.secrets) else {
        panic!("a verified slash command is accepted");
    };
    assert_eq!(a.key, "T1DC2JH3J:G8PSS9T3V");
    assert_eq!(a.event_type, "/webhook-collect");
    assert_eq!(
        a.dedup_id.as_deref(),
        Some("398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c")
    );
    assert_eq!(a.attrs.get("user").map(String::as_str), Some("roadrunner"));
    let fields = a.payload.as_object().expect("an object");
    assert_eq!(fields.len(), 11, "every form field: {fields:?}");
    assert_eq!(fields["text"], "");
    assert_eq!(
        fields["response_url"],
        "https://hooks.slack.com/commands/T1DC2JH3J/397700885554/96rGlfmibIGlgcZRskXaIFfN"
    );
    // The default body format reads JSON: the same form is quarantined, as before.
    let json_kit = Kit::template(
        "slack-json",
        "scheme = \"hmac-sha256-hex\"\nheader = \"X-Signature\"\nkey = \"payload.team_id\"",
        b"tpl-secret",
    )
    .expect("template");
    assert!(matches!(
        evaluate(
            json_kit.source.as_ref(),
            &json_kit.signed(&cap.body, ts as f64),
            &json_kit.secrets
        ),
        Verdict::Quarantine {
            class: "BadPayload"
        }
    ));
}

/// `body = "form-json:payload"` reads a GitHub-style form through the template.
#[test]
fn template_form_json_reads_the_named_field() {
    let cap = parse_http(&read("github/form-ping.http"), 0.0);
    let kit = Kit::template(
        "gh-form",
        "scheme = \"hmac-sha256-hex\"\nheader = \"X-Hub-Signature-256\"\nprefix = \"sha256=\"\n\
         body = \"form-json:payload\"\nkey = \"payload.repository.full_name\"\n\
         ignore = \"payload.zen!=Approachable is better than simple.\"",
        b"tpl-secret",
    )
    .expect("template");
    let req = kit.signed(&cap.body, 0.0);
    let Verdict::Accept(a) = evaluate(kit.source.as_ref(), &req, &kit.secrets) else {
        panic!("accepted");
    };
    assert_eq!(a.key, "meejah/AutobahnPython");
    assert_eq!(a.payload["hook_id"], 50271743);
    // A form without the field is a source error after verify: quarantined, class named.
    let other = kit.signed(b"zen=hi", 0.0);
    assert!(matches!(
        evaluate(kit.source.as_ref(), &other, &kit.secrets),
        Verdict::Quarantine {
            class: "MissingField"
        }
    ));
}

#[test]
fn github_classes() {
    use super::github::classify;
    let pr_comment = json!({"issue": {"pull_request": {"url": "u"}}});
    let issue_comment = json!({"issue": {}});
    assert_eq!(classify("issue_comment", &pr_comment), "pr");
    assert_eq!(classify("issue_comment", &issue_comment), "issue_comment");
    for e in [
        "check_suite",
        "check_run",
        "workflow_run",
        "workflow_job",
        "status",
    ] {
        assert_eq!(classify(e, &json!({})), "ci");
    }
    for e in [
        "pull_request",
        "pull_request_review",
        "pull_request_review_comment",
    ] {
        assert_eq!(classify(e, &json!({})), "pr");
    }
    assert_eq!(classify("push", &json!({})), "push");
}

// ---------------------------------------------------------------- Zoom

#[test]
fn zoom_url_validation_vector() {
    let v = read_json("zoom/vectors.json");
    let z = &v["vectors"][0];
    let secret = z["secret_token"].as_str().expect("secret");
    let body = read("zoom/url_validation.request.json");
    let body =
        serde_json::to_vec(&serde_json::from_str::<Value>(&body).expect("json")).expect("ser");
    // Zoom's event_ts is milliseconds; the signature timestamp is its second.
    let ts = 1_654_503_849_i64;
    let kit = Kit::builtin("zoom", secret.as_bytes()).expect("kit");
    let s = &kit.source;
    let req = kit.request(&body, ts as f64, ts as f64);
    assert!(s.verify(&req, &kit.secrets).expect("verify"));
    let answer = s
        .challenge(&req, &kit.secrets)
        .expect("challenge")
        .expect("answered");
    let got: Value = serde_json::from_slice(&answer.body).expect("answer json");
    assert_eq!(got, z["expected_response"]);
    // Bad signature: refused by verify, so challenge is never reached (spec section 10).
    assert!(
        !s.verify(&kit.wrong_secret(&body, ts as f64), &kit.secrets)
            .expect("verify")
    );
    // The unsigned capture is refused.
    let cap = parse_http(&read("zoom/url_validation.http"), ts as f64);
    assert!(!s.verify(&cap, &kit.secrets).expect("verify"));
    // Stale and future v0 timestamps.
    let tol = TOLERANCE_S_DEFAULT as f64;
    assert!(
        !s.verify(
            &kit.request(&body, ts as f64, ts as f64 + tol + 1.0),
            &kit.secrets
        )
        .expect("verify")
    );
    assert!(
        !s.verify(
            &kit.request(&body, ts as f64, ts as f64 - tol - 1.0),
            &kit.secrets
        )
        .expect("verify")
    );
}

#[test]
fn zoom_challenge_uses_the_candidate_that_signed() {
    let kit = Kit::builtin("zoom", b"old-secret").expect("kit");
    let req = kit.handshake(true, 1000.0).expect("handshake");
    let rot = MapSecrets::new()
        .with("webhook_secret", b"new-secret")
        .with("webhook_secret", b"old-secret");
    assert!(kit.source.verify(&req, &rot).expect("verify"));
    let got: Value = serde_json::from_slice(
        &kit.source
            .challenge(&req, &rot)
            .expect("challenge")
            .expect("answer")
            .body,
    )
    .expect("json");
    let want = verify::mac_hex(MacAlg::Sha256, b"old-secret", &[b"kitPlainToken123"]);
    assert_eq!(got["encryptedToken"].as_str(), Some(want.as_str()));
}

// ---------------------------------------------------------------- Trello

#[test]
fn trello_generated_secret_and_recomputed_value() {
    let v = read_json("trello/vectors.json");
    assert_eq!(
        v["vectors"].as_array().map(Vec::len),
        Some(0),
        "a published vector appeared: use it"
    );
    let mut opts = toml::Table::new();
    opts.insert("callback_url".into(), "https://example.com/webhooks".into());
    let s = build("trello", "trello", &opts).expect("trello");
    let body = br#"{"hello":"world"}"#;
    let req = |sig: &str| {
        Request::new("POST", "/", 0.0)
            .with_header("X-Trello-Webhook", sig)
            .with_body(body.to_vec())
    };
    // vectors.json's local recomputation for secret "secret"; the README's value is a
    // broken placeholder and must fail.
    assert!(
        s.verify(
            &req("FwPAcuGe9EP/+SbXFWjnEVTa0zw="),
            &secrets("secret", "secret")
        )
        .expect("verify")
    );
    assert!(
        !s.verify(
            &req("LeCJzA5aHiwh4zcxLhY25TJSNg="),
            &secrets("secret", "secret")
        )
        .expect("verify")
    );
    // A generated secret signed independently of the kit.
    let generated: Vec<u8> = (0u8..32)
        .map(|i| i.wrapping_mul(37).wrapping_add(11))
        .collect();
    let tag = verify::mac(
        MacAlg::Sha1,
        &generated,
        &[body, b"https://example.com/webhooks"],
    );
    let sig = base64::engine::general_purpose::STANDARD.encode(tag);
    let gen_secrets = MapSecrets::new().with("secret", &generated);
    assert!(s.verify(&req(&sig), &gen_secrets).expect("verify"));
    // The URL is part of what is signed: another callback URL refuses the same request.
    let mut other = toml::Table::new();
    other.insert(
        "callback_url".into(),
        "https://example.com/webhooks/".into(),
    );
    let s2 = build("trello", "trello", &other).expect("trello");
    assert!(!s2.verify(&req(&sig), &gen_secrets).expect("verify"));
}

// ---------------------------------------------------------------- Google

#[test]
fn pubsub_push_bodies_through_gmail() {
    let s = build("gmail", "gmail", &toml::Table::new()).expect("gmail");
    for (file, id) in [
        (
            "google-pubsub/push-body.current-docs.json",
            "2070443601311540",
        ),
        ("google-pubsub/push-body.legacy-docs.json", "136969346945"),
    ] {
        let body = read(file);
        let req = Request::new("POST", "/hooks/gmail", 0.0)
            .with_query("token", "tok-123")
            .with_body(body);
        assert!(
            s.verify(&req, &secrets("push_token", "tok-123"))
                .expect("verify")
        );
        assert!(
            !s.verify(&req, &secrets("push_token", "tok-124"))
                .expect("verify")
        );
        let p = s.payload(&req).expect("payload");
        assert_eq!(s.dedup_id(&p, &req).expect("dedup").as_deref(), Some(id));
        // The docs' data is not a Gmail notification: the key falls back to the subscription.
        assert_eq!(
            s.key(&p, &req).expect("key"),
            "projects/myproject/subscriptions/mysubscription"
        );
    }
    let cap = parse_http(&read("google-pubsub/push.http"), 0.0);
    assert!(
        !s.verify(&cap, &secrets("push_token", "tok-123"))
            .expect("verify"),
        "no token in the URL"
    );
}

#[test]
fn calendar_capture() {
    let s = build("calendar", "calendar", &toml::Table::new()).expect("calendar");
    let req = parse_http(&read("google-calendar/events-exists.http"), 0.0);
    assert!(
        s.verify(&req, &secrets("channel_token", "398348u3tu83ut8uu38"))
            .expect("verify")
    );
    assert!(
        !s.verify(&req, &secrets("channel_token", "398348u3tu83ut8uu3"))
            .expect("verify")
    );
    assert_eq!(s.ignore(&req).expect("ignore"), None);
    let p = s.payload(&req).expect("payload");
    assert_eq!(
        s.key(&p, &req).expect("key"),
        "4ba78bf0-6a47-11e2-bcfd-0800200c9a66"
    );
    assert_eq!(
        s.dedup_id(&p, &req).expect("dedup").as_deref(),
        Some("4ba78bf0-6a47-11e2-bcfd-0800200c9a66:10")
    );
    assert_eq!(s.event_type(&p, &req).expect("event_type"), "exists");
    let mut sync = req.clone();
    sync.remove_header("X-Goog-Resource-State");
    let sync = sync.with_header("X-Goog-Resource-State", "sync");
    assert_eq!(s.ignore(&sync).expect("ignore").as_deref(), Some("sync"));
}

// ---------------------------------------------------------------- Plaid

/// A P-256 key made in the test; returns (PKCS#8 DER, JWK x, JWK y).
fn generated_p256() -> (Vec<u8>, String, String) {
    use aws_lc_rs::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair};
    let pair = EcdsaKeyPair::generate(&ECDSA_P256_SHA256_FIXED_SIGNING).expect("generate");
    let der = pair.to_pkcs8v1().expect("pkcs8").as_ref().to_vec();
    let point = pair.public_key().as_ref().to_vec(); // 0x04 || x || y
    assert_eq!(point.len(), 65);
    (
        der,
        URL_SAFE_NO_PAD.encode(&point[1..33]),
        URL_SAFE_NO_PAD.encode(&point[33..]),
    )
}

fn jwk(kid: &str, x: &str, y: &str) -> PlaidJwk {
    PlaidJwk {
        kid: kid.into(),
        alg: "ES256".into(),
        kty: "EC".into(),
        crv: "P-256".into(),
        x: x.into(),
        y: y.into(),
        created_at: None,
        expired_at: None,
    }
}

fn plaid_secrets() -> MapSecrets {
    MapSecrets::new()
        .with("client_id", b"client-1")
        .with("secret", b"plaid-secret-1")
}

fn plaid_req(jws: &str, body: &[u8], now: f64) -> Request {
    Request::new("POST", "/hooks/plaid", now)
        .with_header("Plaid-Verification", jws)
        .with_body(body.to_vec())
}

#[test]
fn plaid_generated_key_stub_fetcher() {
    let (der, x, y) = generated_p256();
    let fetcher = Arc::new(StaticJwkFetcher::new(vec![jwk("kid-1", &x, &y)]));
    let s = Plaid::with_parts(
        "plaid",
        "sandbox",
        Arc::new(KeyCache::new()),
        Some(fetcher.clone()),
    );
    let body = b"{\n  \"webhook_type\": \"TRANSACTIONS\",\n  \"item_id\": \"i1\"\n}";
    let now = 1_700_000_000.0;
    let jws = plaid_jws(&der, "kid-1", body, now as i64).expect("sign");
    assert!(
        s.verify(&plaid_req(&jws, body, now), &plaid_secrets())
            .expect("verify")
    );
    assert_eq!(fetcher.calls(), 1);
    // Known key: cached, no second fetch.
    assert!(
        s.verify(&plaid_req(&jws, body, now + 1.0), &plaid_secrets())
            .expect("verify")
    );
    assert_eq!(fetcher.calls(), 1);
    // Tampered body (even whitespace: Plaid's hash is whitespace-sensitive), stale, future.
    let mut spaced = body.to_vec();
    spaced.push(b'\n');
    assert!(
        !s.verify(&plaid_req(&jws, &spaced, now), &plaid_secrets())
            .expect("verify")
    );
    let tol = TOLERANCE_S_DEFAULT as f64;
    assert!(
        !s.verify(&plaid_req(&jws, body, now + tol + 1.0), &plaid_secrets())
            .expect("verify")
    );
    assert!(
        !s.verify(&plaid_req(&jws, body, now - tol - 1.0), &plaid_secrets())
            .expect("verify")
    );
    // Another key claiming the same kid: signature refused.
    let (other_der, _, _) = generated_p256();
    let forged = plaid_jws(&other_der, "kid-1", body, now as i64).expect("sign");
    assert!(
        !s.verify(&plaid_req(&forged, body, now), &plaid_secrets())
            .expect("verify")
    );
    assert_eq!(fetcher.calls(), 1);
    // Classification.
    let req = plaid_req(&jws, body, now);
    let p = s.payload(&req).expect("payload");
    assert_eq!(s.key(&p, &req).expect("key"), "item:i1");
    assert_eq!(
        s.dedup_id(&p, &req).expect("dedup"),
        Some(verify::sha256_hex(body))
    );
    assert_eq!(super::default_dedup_window_s("plaid"), 600);
}

#[test]
fn plaid_alg_and_structure_checked_before_any_fetch() {
    let fetcher = Arc::new(StaticJwkFetcher::new(Vec::new()));
    let s = Plaid::with_parts(
        "plaid",
        "sandbox",
        Arc::new(KeyCache::new()),
        Some(fetcher.clone()),
    );
    let enc = |v: &Value| URL_SAFE_NO_PAD.encode(v.to_string());
    let claims = enc(&json!({"iat": 1, "request_body_sha256": "00"}));
    let cases = [
        format!(
            "{}.{claims}.c2ln",
            enc(&json!({"alg": "HS256", "kid": "k"}))
        ),
        format!("{}.{claims}.", enc(&json!({"alg": "none", "kid": "k"}))),
        format!("{}.{claims}.c2ln", enc(&json!({"alg": "ES256"}))), // no kid
        format!("{}.{claims}", enc(&json!({"alg": "ES256", "kid": "k"}))), // two parts
        "garbage".to_string(),
        format!(
            "{}.{claims}.c2ln",
            enc(&json!({"alg": "ES256", "kid": "k".repeat(500)}))
        ),
    ];
    for c in &cases {
        assert!(
            !s.verify(&plaid_req(c, b"{}", 10.0), &plaid_secrets())
                .expect("verify"),
            "{c}"
        );
    }
    assert_eq!(
        fetcher.calls(),
        0,
        "a refused structure or alg reached the key fetch"
    );
}

#[test]
fn plaid_unknown_kids_are_guarded() {
    let (der, x, y) = generated_p256();
    let fetcher = Arc::new(StaticJwkFetcher::new(vec![jwk("real", &x, &y)]));
    let cache = Arc::new(KeyCache::new());
    let s = Plaid::with_parts("plaid", "production", cache.clone(), Some(fetcher.clone()));
    let body = b"{}";
    let t0 = 1_700_000_000.0;
    let sign = |kid: &str, at: f64| plaid_jws(&der, kid, body, at as i64).expect("sign");
    // An unknown kid: one fetch, then negative-cached.
    assert!(
        !s.verify(
            &plaid_req(&sign("random-1", t0), body, t0),
            &plaid_secrets()
        )
        .expect("verify")
    );
    assert_eq!(fetcher.calls(), 1);
    assert!(
        !s.verify(
            &plaid_req(&sign("random-1", t0), body, t0 + 100.0),
            &plaid_secrets()
        )
        .expect("verify")
    );
    assert_eq!(fetcher.calls(), 1, "negative cache");
    // Another unknown kid within the minute: no fetch (one per minute per environment).
    assert!(
        !s.verify(
            &plaid_req(&sign("random-2", t0 + 30.0), body, t0 + 30.0),
            &plaid_secrets()
        )
        .expect("verify")
    );
    assert_eq!(fetcher.calls(), 1, "rate limit");
    // Another environment has its own budget (same cache).
    let sandbox = Plaid::with_parts("plaid-sb", "sandbox", cache.clone(), Some(fetcher.clone()));
    assert!(
        !sandbox
            .verify(
                &plaid_req(&sign("random-3", t0 + 30.0), body, t0 + 30.0),
                &plaid_secrets()
            )
            .expect("verify")
    );
    assert_eq!(fetcher.calls(), 2);
    // After the minute, the real key can be fetched.
    let t1 = t0 + 61.0;
    assert!(
        s.verify(&plaid_req(&sign("real", t1), body, t1), &plaid_secrets())
            .expect("verify")
    );
    assert_eq!(fetcher.calls(), 3);
    // After ten minutes the negative entry lapses and the kid may be asked about again.
    let t2 = t0 + 601.0;
    assert!(
        !s.verify(
            &plaid_req(&sign("random-1", t2), body, t2),
            &plaid_secrets()
        )
        .expect("verify")
    );
    assert_eq!(fetcher.calls(), 4);
}

#[test]
fn plaid_without_fetcher_or_secrets_is_an_error_not_a_pass() {
    let (der, _, _) = generated_p256();
    let s = Plaid::with_parts("plaid", "development", Arc::new(KeyCache::new()), None);
    let jws = plaid_jws(&der, "kid-x", b"{}", 5).expect("sign");
    // No fetcher installed in this process's tests: KeyFetch, which the intake answers non-2xx.
    let err = s
        .verify(&plaid_req(&jws, b"{}", 5.0), &plaid_secrets())
        .expect_err("no fetcher");
    assert_eq!(err.class(), "KeyFetch");
    let fetcher = Arc::new(StaticJwkFetcher::new(Vec::new()));
    let s = Plaid::with_parts(
        "plaid",
        "development",
        Arc::new(KeyCache::new()),
        Some(fetcher),
    );
    let err = s
        .verify(&plaid_req(&jws, b"{}", 5.0), &MapSecrets::new())
        .expect_err("no secrets");
    assert_eq!(err.class(), "SecretError");
    assert!(!err.to_string().contains("plaid-secret"));
}

#[test]
fn plaid_docs_jwk_parses() {
    let v = read_json("plaid/docs-webhook_verification_key-get.response.json");
    let k: PlaidJwk = serde_json::from_value(v["key"].clone()).expect("jwk");
    assert_eq!(k.kid, "bfbd5111-8e33-4643-8ced-b2e642a72f3c");
    assert!(jsonwebtoken::DecodingKey::from_ec_components(&k.x, &k.y).is_ok());
    let header = read_json("plaid/docs-jwt-header.json");
    assert_eq!(header["alg"], "ES256");
}

/// A blocking fetcher speaking HTTP/1.1 to a base URL, as the intake's reqwest one will
/// (POST /webhook_verification_key/get with client_id, secret, key_id).
struct BlockingHttpFetcher {
    addr: std::net::SocketAddr,
}

impl JwkFetcher for BlockingHttpFetcher {
    fn fetch(
        &self,
        _env: &str,
        kid: &str,
        client_id: &[u8],
        secret: &[u8],
    ) -> Result<Option<PlaidJwk>, FetchError> {
        let transport = |e: std::io::Error| FetchError::Transport {
            reason: e.kind().to_string(),
        };
        let body = json!({
            "client_id": String::from_utf8_lossy(client_id),
            "secret": String::from_utf8_lossy(secret),
            "key_id": kid,
        })
        .to_string();
        let mut conn = TcpStream::connect(self.addr).map_err(transport)?;
        write!(
            conn,
            "POST /webhook_verification_key/get HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.addr,
            body.len()
        )
        .map_err(transport)?;
        let mut resp = String::new();
        conn.read_to_string(&mut resp).map_err(transport)?;
        let (head, payload) = resp.split_once("\r\n\r\n").ok_or(FetchError::BadResponse)?;
        let status: u16 = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or(FetchError::BadResponse)?;
        match status {
            200 => {
                let v: Value =
                    serde_json::from_str(payload).map_err(|_| FetchError::BadResponse)?;
                serde_json::from_value(v["key"].clone())
                    .map(Some)
                    .map_err(|_| FetchError::BadResponse)
            }
            400 | 404 => Ok(None), // Plaid: INVALID_WEBHOOK_VERIFICATION_KEY_ID
            other => Err(FetchError::Status { status: other }),
        }
    }
}

/// Serves `key` for its kid, 400 for others, on 127.0.0.1:0, for `requests` connections.
fn serve_jwk(
    key: PlaidJwk,
    requests: usize,
) -> (std::net::SocketAddr, std::thread::JoinHandle<Vec<Value>>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let handle = std::thread::spawn(move || {
        let mut seen = Vec::new();
        for _ in 0..requests {
            let (stream, _) = listener.accept().expect("accept");
            let mut reader = BufReader::new(stream.try_clone().expect("clone"));
            let mut len = 0usize;
            loop {
                let mut line = String::new();
                reader.read_line(&mut line).expect("line");
                if line == "\r\n" || line.is_empty() {
                    break;
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    len = v.trim().parse().expect("len");
                }
            }
            let mut body = vec![0; len];
            reader.read_exact(&mut body).expect("body");
            let req: Value = serde_json::from_slice(&body).expect("json");
            let (status, answer) = if req["key_id"].as_str() == Some(key.kid.as_str()) {
                ("200 OK", json!({"key": key, "request_id": "req1"}))
            } else {
                (
                    "400 Bad Request",
                    json!({"error_code": "INVALID_WEBHOOK_VERIFICATION_KEY_ID"}),
                )
            };
            seen.push(req);
            let answer = answer.to_string();
            let mut stream = stream;
            write!(stream, "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}", answer.len())
                .expect("write");
        }
        seen
    });
    (addr, handle)
}

#[test]
fn plaid_jwk_from_a_local_http_server() {
    let (der, x, y) = generated_p256();
    let (addr, server) = serve_jwk(jwk("served-kid", &x, &y), 2);
    let fetcher = Arc::new(BlockingHttpFetcher { addr });
    let s = Plaid::with_parts("plaid", "sandbox", Arc::new(KeyCache::new()), Some(fetcher));
    let body = b"{\n  \"webhook_type\": \"ITEM\",\n  \"webhook_code\": \"ERROR\"\n}";
    let now = 1_700_000_000.0;
    let jws = plaid_jws(&der, "served-kid", body, now as i64).expect("sign");
    assert!(
        s.verify(&plaid_req(&jws, body, now), &plaid_secrets())
            .expect("verify")
    );
    // An unknown kid a minute later: the server says 400, the kid is negative-cached.
    let later = now + 61.0;
    let unknown = plaid_jws(&der, "unknown-kid", body, later as i64).expect("sign");
    assert!(
        !s.verify(&plaid_req(&unknown, body, later), &plaid_secrets())
            .expect("verify")
    );
    assert!(
        !s.verify(&plaid_req(&unknown, body, later + 200.0), &plaid_secrets())
            .expect("verify")
    );
    let seen = server.join().expect("server");
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0]["client_id"], "client-1");
    assert_eq!(seen[0]["key_id"], "served-kid");
    let p = s.payload(&plaid_req(&jws, body, now)).expect("payload");
    assert_eq!(
        s.event_type(&p, &plaid_req(&jws, body, now))
            .expect("event_type"),
        "ITEM.ERROR"
    );
}

// ---------------------------------------------------------------- Template schemes (issue 14)

fn template(options: &str) -> Arc<dyn Source> {
    build("tpl", "template", &options.parse().expect("toml")).expect("template builds")
}

fn accepted(v: Verdict) -> super::Accepted {
    match v {
        Verdict::Accept(a) => a,
        other => panic!("expected accepted, got {other:?}"),
    }
}

/// Twilio's reference vectors (tests/vectors/twilio) through the template's
/// `hmac-sha1-base64-url-form` scheme: accepted with the form's parameters as the payload,
/// refused for another URL, another token, or one parameter changed.
#[test]
fn twilio_vectors_through_the_form_scheme() {
    let v = read_json("twilio/vectors.json");
    let token = v["auth_token"].as_str().expect("token");
    let mut form = form_urlencoded::Serializer::new(String::new());
    for pair in v["params"].as_array().expect("params") {
        form.append_pair(pair[0].as_str().expect("k"), pair[1].as_str().expect("v"));
    }
    let body = form.finish();
    let request = |sig: &str, body: &str| {
        Request::new("POST", "/hooks/tpl", 0.0)
            .with_header("Content-Type", FORM_MEDIA_TYPE)
            .with_header("X-Twilio-Signature", sig)
            .with_body(body.to_string())
    };
    let configured = |url: &str| {
        template(&format!(
            "scheme = \"hmac-sha1-base64-url-form\"\nheader = \"X-Twilio-Signature\"\n\
             callback_url = \"{url}\"\nkey = [\"payload.To\", \"payload.From\"]\n\
             dedup = \"payload.CallSid\"\nattrs = {{ digits = \"payload.Digits\" }}"
        ))
    };
    for case in v["form"].as_array().expect("form cases") {
        let s = configured(case["url"].as_str().expect("url"));
        let sig = case["signature"].as_str().expect("sig");
        let a = accepted(evaluate(
            s.as_ref(),
            &request(sig, &body),
            &secrets("secret", token),
        ));
        assert_eq!(a.key, "+18005551212:+14158675309", "{}", case["id"]);
        assert_eq!(a.dedup_id.as_deref(), Some("CA1234567890ABCDE"));
        assert_eq!(a.attrs["digits"], "1234");
        assert_eq!(a.payload["Caller"], "+14158675309");
        assert_eq!(a.payload.as_object().map(|m| m.len()), Some(5));
        for (why, req, secret) in [
            ("another token", request(sig, &body), "54321"),
            (
                "a parameter changed",
                request(sig, &body.replace("1234", "1235")),
                token,
            ),
            (
                "a parameter added",
                request(sig, &format!("{body}&NumMedia=0")),
                token,
            ),
        ] {
            assert!(
                matches!(
                    evaluate(s.as_ref(), &req, &secrets("secret", secret)),
                    Verdict::Unauthorized
                ),
                "{}: {why}",
                case["id"]
            );
        }
    }
    // Issue 29: as twilio-python's validate (test_validation_adds_port_on_https), the :443
    // variant's signature holds for the port-less URL; a signature over another port does
    // not (TW-PORT-1234's is over http://...:1234).
    let plain = configured(v["url"].as_str().expect("url"));
    let port_sig = v["form"][1]["signature"].as_str().expect("sig");
    accepted(evaluate(
        plain.as_ref(),
        &request(port_sig, &body),
        &secrets("secret", token),
    ));
    let other_port = v["form"][3]["signature"].as_str().expect("sig");
    assert!(matches!(
        evaluate(
            plain.as_ref(),
            &request(other_port, &body),
            &secrets("secret", token)
        ),
        Verdict::Unauthorized
    ));
    // A repeated name (Twilio's duplicate vector): signed in value order, kept as an array.
    let dup = &v["duplicate"];
    let s = template(&format!(
        "scheme = \"hmac-sha1-base64-url-form\"\nheader = \"X-Twilio-Signature\"\n\
         callback_url = \"{}\"\nkey = \"payload.Sid\"",
        dup["url"].as_str().expect("url")
    ));
    let req = request(
        dup["signature"].as_str().expect("sig"),
        dup["form_body"].as_str().expect("body"),
    );
    let a = accepted(evaluate(s.as_ref(), &req, &secrets("secret", token)));
    assert_eq!(a.key, "CA123");
    assert_eq!(a.payload["Digits"], json!(["5678", "1234"]));
}

/// Issue 29: Twilio's JSON-body webhooks through the template's `hmac-sha1-base64-url-json`
/// scheme, with twilio-python's test_validation_of_body_succeeds vector (TW-JSON: the URL
/// `self.uri` + `&bodySHA256=<self.bodyHash>`, the body `self.body`, the signature
/// `a9nBmqA0ju/hNViExpshrM61xv4=`; tests/vectors/twilio/SOURCE.md). The configured
/// callback_url is the URL without bodySHA256; the request carries it in its query.
#[test]
fn twilio_json_vector_through_the_json_scheme() {
    let v = read_json("twilio/vectors.json");
    let token = v["auth_token"].as_str().expect("token");
    let j = &v["json"];
    let body = j["body"].as_str().expect("body");
    let hash = j["body_sha256"].as_str().expect("hash");
    let sig = j["signature"].as_str().expect("sig");
    let request = |sig: &str, body: &str, hash: &str| {
        Request::new("POST", "/hooks/tpl", 0.0)
            .with_query("foo", "1")
            .with_query("bar", "2")
            .with_query("bodySHA256", hash)
            .with_header("Content-Type", "application/json")
            .with_header("X-Twilio-Signature", sig)
            .with_body(body.to_string())
    };
    let configured = |url: &str| {
        template(&format!(
            "scheme = \"hmac-sha1-base64-url-json\"\nheader = \"X-Twilio-Signature\"\n\
             callback_url = \"{url}\"\nkey = \"payload.property\""
        ))
    };
    let s = configured(v["url"].as_str().expect("url"));
    let a = accepted(evaluate(
        s.as_ref(),
        &request(sig, body, hash),
        &secrets("secret", token),
    ));
    assert_eq!(a.key, "value");
    assert_eq!(a.payload["boolean"], json!(true));
    // The same URL configured with its default port written out takes it too.
    let with_port = configured("https://mycompany.com:443/myapp.php?foo=1&bar=2");
    accepted(evaluate(
        with_port.as_ref(),
        &request(sig, body, hash),
        &secrets("secret", token),
    ));
    let tampered = body.replace("value", "valuf");
    for (why, req, secret) in [
        ("another token", request(sig, body, hash), "54321"),
        ("a changed body", request(sig, &tampered, hash), token),
        (
            "the changed body's own hash",
            request(
                sig,
                &tampered,
                &super::verify::sha256_hex(tampered.as_bytes()),
            ),
            token,
        ),
        (
            "no bodySHA256",
            {
                let mut r = request(sig, body, hash);
                r.query.retain(|(k, _)| k != "bodySHA256");
                r
            },
            token,
        ),
    ] {
        assert!(
            matches!(
                evaluate(s.as_ref(), &req, &secrets("secret", secret)),
                Verdict::Unauthorized
            ),
            "{why}"
        );
    }
    // bodySHA256 belongs to each request, not to the configured URL.
    let refused = build(
        "tpl",
        "template",
        &format!(
            "scheme = \"hmac-sha1-base64-url-json\"\nheader = \"X-Twilio-Signature\"\ncallback_url = \"https://h.example/x?bodySHA256={hash}\"\nkey = \"payload.property\""
        )
        .parse()
        .expect("toml"),
    );
    assert!(refused.is_err());
}

/// Standard Webhooks v1a (tests/vectors/standard-webhooks-v1a) through the template: the one
/// secret is the sender's `whpk_` key; the other key's signature, a tampered body and a
/// request outside the window on either side are refused with 401; the v1 vector SW-A still
/// passes with its `whsec_` secret, and a `whpk_` secret never verifies a v1 entry.
#[test]
fn standard_webhooks_v1a_vectors_through_the_template() {
    let v = read_json("standard-webhooks-v1a/vectors.json");
    let ts = v["timestamp"].as_i64().expect("ts");
    let req = |sig: &str, body: &str, now: f64| {
        Request::new("POST", "/hooks/tpl", now)
            .with_header("webhook-id", v["msg_id"].as_str().expect("id"))
            .with_header("webhook-timestamp", &ts.to_string())
            .with_header("webhook-signature", sig)
            .with_body(body.to_string())
    };
    let body = v["body"].as_str().expect("body");
    let sig1 = v["sig1"].as_str().expect("sig1");
    let sig2 = v["sig2"].as_str().expect("sig2");
    let key1 = secrets("secret", v["public_key"].as_str().expect("key"));
    let s = template(
        "scheme = \"standard-webhooks\"\nkey = \"payload.test\"\ndedup = \"header.webhook-id\"",
    );
    let at = ts as f64;
    let a = accepted(evaluate(s.as_ref(), &req(sig1, body, at), &key1));
    assert_eq!(a.key, "2432232314");
    assert_eq!(a.dedup_id.as_deref(), Some("msg_p5jXN8AQM9LWM0D4loKWxJek"));
    // Both entries in one header: the one signed by the configured key carries it.
    let both = format!("{sig2} {sig1}");
    assert!(matches!(
        evaluate(s.as_ref(), &req(&both, body, at), &key1),
        Verdict::Accept(_)
    ));
    for (why, r) in [
        ("the other key's signature", req(sig2, body, at)),
        ("a tampered body", req(sig1, &body.replace('2', "3"), at)),
        ("stale", req(sig1, body, at + 301.0)),
        ("future-dated", req(sig1, body, at - 301.0)),
    ] {
        assert!(
            matches!(evaluate(s.as_ref(), &r, &key1), Verdict::Unauthorized),
            "{why}"
        );
    }
    assert!(matches!(
        evaluate(s.as_ref(), &req(sig1, body, at + 300.0), &key1),
        Verdict::Accept(_)
    ));
    assert!(matches!(
        evaluate(s.as_ref(), &req(sig1, body, at - 300.0), &key1),
        Verdict::Accept(_)
    ));

    let sw = read_json("standard-webhooks/vectors.json");
    let sw = &sw["vectors"][0];
    let sw_req = Request::new("POST", "/hooks/tpl", sw["timestamp"].as_f64().expect("ts"))
        .with_header("webhook-id", sw["msg_id"].as_str().expect("id"))
        .with_header(
            "webhook-timestamp",
            &sw["timestamp"].as_i64().expect("ts").to_string(),
        )
        .with_header(
            "webhook-signature",
            sw["expected_signature"].as_str().expect("sig"),
        )
        .with_body(sw["payload"].as_str().expect("payload").to_string());
    let s = template("scheme = \"standard-webhooks\"\nkey = \"payload.test\"");
    let v1 = secrets("secret", sw["secret"].as_str().expect("secret"));
    assert!(matches!(
        evaluate(s.as_ref(), &sw_req, &v1),
        Verdict::Accept(_)
    ));
    assert!(matches!(
        evaluate(s.as_ref(), &sw_req, &key1),
        Verdict::Unauthorized
    ));
}

/// The template's `tolerance_s` on the Stripe vector (tests/vectors/stripe): the default
/// window refuses the vector 400 s after its time on either side, `tolerance_s = 600`
/// accepts it there and refuses it at 601 s, both sides.
#[test]
fn template_tolerance_s_sets_the_window_on_both_sides() {
    let v = read_json("stripe/vectors.json");
    let ts = v["timestamp"].as_i64().expect("ts");
    let header = format!("t={ts},v1={}", v["v1"].as_str().expect("v1"));
    let secret = secrets("secret", v["secret"].as_str().expect("secret"));
    let req = |now: f64| {
        Request::new("POST", "/hooks/tpl", now)
            .with_header("Stripe-Signature", &header)
            .with_body(v["body"].as_str().expect("body").to_string())
    };
    let base =
        "scheme = \"timestamped\"\nheader = \"Stripe-Signature\"\nkey = \"payload.data.object.id\"";
    let default = template(base);
    let wide = template(&format!("{base}\ntolerance_s = 600"));
    let at = ts as f64;
    for (now, default_ok, wide_ok) in [
        (at, true, true),
        (at + 300.0, true, true),
        (at - 300.0, true, true),
        (at + 400.0, false, true),
        (at - 400.0, false, true),
        (at + 601.0, false, false),
        (at - 601.0, false, false),
    ] {
        let d = evaluate(default.as_ref(), &req(now), &secret);
        let w = evaluate(wide.as_ref(), &req(now), &secret);
        assert_eq!(
            matches!(d, Verdict::Accept(_)),
            default_ok,
            "default at {now}: {d:?}"
        );
        assert_eq!(
            matches!(w, Verdict::Accept(_)),
            wide_ok,
            "600 s at {now}: {w:?}"
        );
    }
}
