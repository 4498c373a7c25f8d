//! A sender hookspool has no code or bobbin for, built from one `[bobbins.<name>]` table with
//! `bobbin = "hookspool.webhook"` and a `recipe` setting (issue 34): Coinify, from its
//! documentation's signature example (tests/vectors/coinify), through the real intake. Also
//! the recipes of two built-in bobbins whose timestamp is in the JSON body: Mailgun's (the
//! signature too) and Linear's (`webhookTimestamp`, covered by the body's signature).

use super::intake::{Running, SECRET, config, events, raw, request, start_in};

const VECTORS: &str = include_str!("../vectors/coinify/vectors.json");

const BOBBIN: &str = r#"
[bobbins.coinify]
bobbin = "hookspool.webhook"
secrets.secret = { file = "{home}/coinify" }
settings = { recipe = { algorithm = "hmac-sha256", signed = ["body"], header = "X-Coinify-Webhook-Signature", encoding = "hex" }, key = ["payload.examplePayload"] }
outputs = { "*" = "http-main" }
"#;

fn start(secret: &str) -> Running {
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    std::fs::write(h.join("secret"), SECRET).unwrap();
    std::fs::write(h.join("coinify"), secret).unwrap();
    let extra = BOBBIN.replace("{home}", &h.display().to_string());
    std::fs::write(h.join("config.toml"), config(h, &extra)).unwrap();
    start_in(home)
}

#[test]
fn coinify_from_a_bobbins_table_and_a_recipe_verifies_its_docs_example() {
    let v: serde_json::Value = serde_json::from_str(VECTORS).unwrap();
    let v = &v["vectors"][0];
    let (secret, body, sig) = (
        v["secret"].as_str().unwrap(),
        v["body"].as_str().unwrap().as_bytes(),
        v["signature"].as_str().unwrap(),
    );
    let i = start(secret);
    let send = |sig: &str, body: &[u8]| {
        raw(
            i.addr,
            &request(
                "POST",
                "/hooks/coinify",
                &[
                    ("Content-Type", "application/json"),
                    ("X-Coinify-Webhook-Signature", sig),
                ],
                body,
            ),
        )
    };
    let mut tampered = body.to_vec();
    let last = tampered.len() - 2; // the `e` of `true`
    tampered[last] ^= 0x01;
    let r = send(sig, &tampered);
    assert_eq!(r.status, 401, "{r:?}");
    let r = send(&sig.to_uppercase().replace('B', "C"), body);
    assert_eq!(r.status, 401, "{r:?}");
    assert!(events(&i.db()).is_empty());
    let r = send(sig, body);
    assert_eq!(r.status, 200, "{r:?}");
    let stored = events(&i.db());
    assert_eq!(stored.len(), 1, "{stored:?}");
    assert!(
        stored[0]
            .2
            .as_deref()
            .is_some_and(|p| p.contains("examplePayload")),
        "{stored:?}"
    );
}

#[test]
fn coinify_with_another_secret_refuses_the_docs_example() {
    let v: serde_json::Value = serde_json::from_str(VECTORS).unwrap();
    let v = &v["vectors"][0];
    let i = start("not-my-shared-secret");
    let r = raw(
        i.addr,
        &request(
            "POST",
            "/hooks/coinify",
            &[
                ("Content-Type", "application/json"),
                (
                    "X-Coinify-Webhook-Signature",
                    v["signature"].as_str().unwrap(),
                ),
            ],
            v["body"].as_str().unwrap().as_bytes(),
        ),
    );
    assert_eq!(r.status, 401, "{r:?}");
    assert!(events(&i.db()).is_empty());
}

/// Mailgun signs inside the JSON body (`signature.{timestamp,token,signature}`, HMAC-SHA256 of
/// timestamp + token): the `mailgun.webhooks` bobbin's recipe through `hookspool source test`
/// with the vector of tests/vectors/mailgun at its own time (verified), 3600 s later (the edge
/// of the window: verified), 3601 s later or earlier (refused, with the `--at` to try), one
/// byte of the signature or of the signed token changed (refused), and event data changed,
/// which the signature does not cover (verified: the token is the dedup id that stops a
/// replay from being stored twice).
#[test]
fn mailgun_bobbin_signature_in_the_body_through_source_test_at() {
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    std::fs::write(h.join("mailgun-key"), "webhook-signing-key").unwrap();
    let mut perms = std::fs::metadata(h.join("mailgun-key"))
        .unwrap()
        .permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o600);
    std::fs::set_permissions(h.join("mailgun-key"), perms).unwrap();
    std::fs::write(
        h.join("config.toml"),
        format!(
            "[bobbins.mailgun]\nbobbin = \"mailgun.webhooks\"\nsecrets.secret = {{ file = \"{}/mailgun-key\" }}\noutputs = {{ \"*\" = \"hermes:mailgun\" }}\n",
            h.display()
        ),
    )
    .unwrap();
    let vector = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/vectors/mailgun/delivered.http"
    ))
    .unwrap();
    let run = |capture: &str, at: i64| {
        let file = h.join(format!("capture-{at}.http"));
        std::fs::write(&file, capture).unwrap();
        let out = std::process::Command::new(super::bin())
            .arg("--home")
            .arg(h)
            .args(["source", "test", "mailgun", "--request"])
            .arg(&file)
            .args(["--at", &at.to_string()])
            .env_remove("HOOKSPOOL_CONFIG")
            .env_remove("HOOKSPOOL_HOME")
            .output()
            .unwrap();
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    const AT: i64 = 123456789;
    let (ok, text) = run(&vector, AT);
    assert!(ok && text.contains("signature   verified"), "{text}");
    assert!(
        text.contains("dedup_id    token") && text.contains("event_type  delivered"),
        "{text}"
    );
    let (ok, text) = run(&vector, AT + 3600);
    assert!(ok, "the edge of the window: {text}");
    for at in [AT + 3601, AT - 3601] {
        let (ok, text) = run(&vector, at);
        assert!(!ok && text.contains("401"), "{at}: {text}");
        assert!(
            text.contains("outside 3600 s") && text.contains("--at 123456789"),
            "{text}"
        );
    }
    let sig = "3ce8f010058ab80b8345d3513acc9027d34a00190ae8e4b4161e7636f68321f8";
    assert!(vector.contains(sig));
    for (what, tampered) in [
        (
            "signature",
            vector.replace(sig, &format!("{}9", &sig[..63])),
        ),
        (
            "token",
            vector.replace("\"token\":\"token\"", "\"token\":\"tokem\""),
        ),
    ] {
        assert_ne!(tampered, vector, "{what}");
        let (ok, text) = run(&tampered, AT);
        assert!(!ok && text.contains("not verified"), "{what}: {text}");
    }
    // Event data is not covered by Mailgun's signature: it verifies, and dedups on the token.
    let other = vector.replace("\"event\":\"delivered\"", "\"event\":\"failed!!!\"");
    assert_ne!(other, vector);
    let (ok, text) = run(&other, AT);
    assert!(ok && text.contains("dedup_id    token"), "{text}");
}

/// The `linear.webhooks` bobbin's capture (tests/vectors/linear's vector) through `hookspool
/// source test --at`: Linear's body field `webhookTimestamp` (milliseconds, 1676056940508) is
/// checked within 60 s both ways, as @linear/sdk checks it. Verified at its own time and 60 s
/// either side; refused 61 s later and 61 s earlier, with the window and the `--at` to try.
#[test]
fn linear_bobbin_body_timestamp_through_source_test_at() {
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let v: serde_json::Value =
        serde_json::from_str(include_str!("../vectors/linear/vectors.json")).unwrap();
    let secret = v["vectors"][0]["secret"].as_str().unwrap();
    std::fs::write(h.join("linear-secret"), secret).unwrap();
    let mut perms = std::fs::metadata(h.join("linear-secret"))
        .unwrap()
        .permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o600);
    std::fs::set_permissions(h.join("linear-secret"), perms).unwrap();
    std::fs::write(
        h.join("config.toml"),
        format!(
            "[bobbins.linear]\nbobbin = \"linear.webhooks\"\nsecrets.secret = {{ file = \"{}/linear-secret\" }}\noutputs = {{ \"*\" = \"hermes:linear\" }}\n",
            h.display()
        ),
    )
    .unwrap();
    // The bobbin's capture without its `# ` lines (source test reads a bare request).
    let capture = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/bobbins/linear/webhooks/captures/issue-create.http"
    ))
    .unwrap();
    let request = &capture[capture.find("POST /hooks/linear").unwrap()..];
    assert!(request.contains(v["vectors"][0]["signature"].as_str().unwrap()));
    assert!(request.contains("\"webhookTimestamp\":1676056940508"));
    let file = h.join("issue-create.http");
    std::fs::write(&file, request).unwrap();
    let run = |at: &str| {
        let out = std::process::Command::new(super::bin())
            .arg("--home")
            .arg(h)
            .args(["source", "test", "linear", "--request"])
            .arg(&file)
            .args(["--at", at])
            .env_remove("HOOKSPOOL_CONFIG")
            .env_remove("HOOKSPOOL_HOME")
            .output()
            .unwrap();
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    // 1676056940.508 is the vector's own time; 60 s either side is the edge of the window.
    for at in [
        "1676056940.508",
        "1676056940",
        "1676057000.508",
        "1676056880.508",
    ] {
        let (ok, text) = run(at);
        assert!(ok && text.contains("signature   verified"), "{at}: {text}");
        assert!(
            text.contains("dedup_id    234d1a4e-b617-4388-90fe-adc3633d6b72"),
            "{text}"
        );
    }
    for at in ["1676057001.508", "1676056879.508"] {
        let (ok, text) = run(at);
        assert!(!ok && text.contains("401"), "{at}: {text}");
        assert!(
            text.contains("the timestamp 1676056940508 is outside 60 s of now")
                && text.contains("--at 1676056940"),
            "{at}: {text}"
        );
    }
}

/// Linear through the real intake, at the wall clock: a body signed with the vector's secret
/// whose `webhookTimestamp` is now is stored; the same signed 61 s in the past or the future,
/// or without the field, is refused 401 and nothing more is stored.
#[test]
fn linear_bobbin_through_the_intake_refuses_a_webhook_timestamp_61_s_off() {
    let v: serde_json::Value =
        serde_json::from_str(include_str!("../vectors/linear/vectors.json")).unwrap();
    let v = &v["vectors"][0];
    let secret = v["secret"].as_str().unwrap();
    let body = v["body"].as_str().unwrap();
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    std::fs::write(h.join("secret"), SECRET).unwrap();
    std::fs::write(h.join("linear"), secret).unwrap();
    let extra = format!(
        "[bobbins.linear]\nbobbin = \"linear.webhooks\"\nsecrets.secret = {{ file = \"{}/linear\" }}\noutputs = {{ \"*\" = \"http-main\" }}\n",
        h.display()
    );
    std::fs::write(h.join("config.toml"), config(h, &extra)).unwrap();
    let i = start_in(home);
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let send = |ts: Option<i64>, delivery: &str| {
        let field = "\"webhookTimestamp\":1676056940508";
        assert!(body.contains(field));
        let b = match ts {
            Some(ts) => body.replace(field, &format!("\"webhookTimestamp\":{ts}")),
            None => body.replace(field, "\"sentAt\":0"),
        };
        let sig = hookspool::sources::verify::mac_hex(
            hookspool::sources::verify::MacAlg::Sha256,
            secret.as_bytes(),
            &[b.as_bytes()],
        );
        raw(
            i.addr,
            &request(
                "POST",
                "/hooks/linear",
                &[
                    ("Content-Type", "application/json"),
                    ("Linear-Signature", &sig),
                    ("Linear-Delivery", delivery),
                ],
                b.as_bytes(),
            ),
        )
    };
    for (ts, delivery) in [
        (Some(now_ms - 61_000), "late"),
        (Some(now_ms + 61_000), "early"),
        (None, "none"),
    ] {
        let r = send(ts, delivery);
        assert_eq!(r.status, 401, "{delivery}: {r:?}");
    }
    assert!(events(&i.db()).is_empty());
    let r = send(Some(now_ms), "now");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(events(&i.db()).len(), 1);
    // The vector's own body, signed in 2023: refused now.
    let r = raw(
        i.addr,
        &request(
            "POST",
            "/hooks/linear",
            &[
                ("Content-Type", "application/json"),
                ("Linear-Signature", v["signature"].as_str().unwrap()),
                ("Linear-Delivery", v["delivery"].as_str().unwrap()),
            ],
            body.as_bytes(),
        ),
    );
    assert_eq!(r.status, 401, "{r:?}");
    assert_eq!(events(&i.db()).len(), 1);
}
