//! A sender hookspool has no code or bobbin for, built from one `[bobbins.<name>]` table with
//! `bobbin = "hookspool.webhook"` and a `recipe` setting (issue 34): Coinify, from its
//! documentation's signature example (tests/vectors/coinify), through the real intake.

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
