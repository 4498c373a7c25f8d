//! The `hermes` destination against a scripted gateway: URL and profile, headers, every
//! answer Hermes gives, the fresh secret per attempt, and `check_route`.

use std::path::Path;

use super::receiver::{Receiver, Reply};
use super::verify::{hub_verify, sw_verify};
use super::{INSTANCE, delivery};
use crate::destinations::hermes::check_route;
use crate::destinations::outcome::{Klass, OutcomeKind};
use crate::destinations::{HermesConfig, HermesDestination, TlsRoots};

pub const ROUTE: &str = "github-ci";
const DOC: &str = r#"{"source": "github", "batch_id": 42, "events": []}"#;

pub fn write_subs(path: &Path, json: &str) {
    // Write then rename, as Hermes does, so a reader never sees half a file.
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, json).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

pub fn subs_with_secret(secret: &str) -> String {
    serde_json::json!({ ROUTE: { "secret": secret, "prompt": "x", "events": [], "deliver": "log" } }).to_string()
}

pub struct Gw {
    pub rx: Receiver,
    pub dir: tempfile::TempDir,
}

impl Gw {
    pub async fn start(subs: &str) -> Gw {
        let dir = tempfile::tempdir().unwrap();
        write_subs(&dir.path().join("subs.json"), subs);
        Gw {
            rx: Receiver::start(vec![]).await,
            dir,
        }
    }

    pub fn cfg(&self) -> HermesConfig {
        HermesConfig {
            base_url: self.rx.base(),
            subscriptions_path: self.dir.path().join("subs.json"),
            ..HermesConfig::default()
        }
    }

    pub fn dest(&self, cfg: HermesConfig) -> HermesDestination {
        HermesDestination::new(ROUTE, cfg, TlsRoots::Platform).unwrap()
    }

    pub fn rewrite(&self, subs: &str) {
        write_subs(&self.dir.path().join("subs.json"), subs);
    }
}

#[tokio::test]
async fn url_headers_and_signatures() {
    let secret = "route-secret-1";
    let gw = Gw::start(&subs_with_secret(secret)).await;
    gw.rx.push(Reply::json(
        202,
        r#"{"status":"accepted","route":"github-ci"}"#,
    ));
    let dest = gw.dest(gw.cfg());
    let mut d = delivery(DOC);
    d.source_event_header = Some("X-GitHub-Event".into());
    let o = dest.deliver(&d).await;
    assert_eq!(o.kind, OutcomeKind::Ok, "{o:?}");
    assert_eq!(o.reason, "hermes accepted");
    assert_eq!(o.notice, None);
    let r = &gw.rx.requests()[0];
    assert_eq!(r.path, "/webhooks/github-ci");
    assert_eq!(r.body, DOC.as_bytes());
    let id = format!("hs_{INSTANCE}_42_900");
    assert_eq!(r.header("webhook-id"), Some(id.as_str()), "per-attempt id");
    assert_eq!(
        r.header("x-request-id"),
        Some(id.as_str()),
        "released gateways read X-Request-ID"
    );
    sw_verify(secret, r).unwrap();
    hub_verify(secret.as_bytes(), r).unwrap();
    assert_eq!(r.header("x-hookspool-batch"), Some("42"));
    assert_eq!(r.header("x-hookspool-attempt"), Some("3"));
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(
        r.header("x-github-event"),
        Some("workflow_run"),
        "the source's event_header is the fallback"
    );
}

#[tokio::test]
async fn whsec_route_secret_and_legacy_signature_off() {
    let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let gw = Gw::start(&subs_with_secret(secret)).await;
    let dest = gw.dest(HermesConfig {
        legacy_signature: false,
        event_header: Some("X-Custom-Event".into()),
        ..gw.cfg()
    });
    let mut d = delivery(DOC);
    // The destination's own header wins over the source's; a reserved fallback is ignored.
    d.source_event_header = Some("X-GitHub-Event".into());
    assert_eq!(dest.deliver(&d).await.kind, OutcomeKind::Ok);
    let r = &gw.rx.requests()[0];
    sw_verify(secret, r).unwrap();
    assert_eq!(r.header("x-hub-signature-256"), None);
    assert_eq!(r.header("x-custom-event"), Some("workflow_run"));
    assert_eq!(r.header("x-github-event"), None);

    let dest = gw.dest(gw.cfg());
    d.source_event_header = Some("webhook-id".into());
    assert_eq!(dest.deliver(&d).await.kind, OutcomeKind::Ok);
    let r = &gw.rx.requests()[1];
    assert_eq!(
        r.count("webhook-id"),
        1,
        "a reserved fallback name is left out"
    );
    // Legacy signature: HMAC with the secret string as given (not whsec-decoded).
    hub_verify(secret.as_bytes(), r).unwrap();
}

#[tokio::test]
async fn a_401_says_which_signature_headers_were_sent() {
    let gw = Gw::start(&subs_with_secret("route-secret")).await;
    gw.rx
        .push(Reply::json(401, r#"{"error":"Invalid signature"}"#));
    let dest = gw.dest(HermesConfig {
        legacy_signature: false,
        ..gw.cfg()
    });
    let o = dest.deliver(&delivery(DOC)).await;
    assert_eq!(
        o.reason,
        "hermes rejected the signature (sent webhook-signature only; legacy_signature = false)"
    );
    assert!(
        o.detail.contains("verify only X-Hub-Signature-256"),
        "{o:?}"
    );
    assert_eq!(gw.rx.requests()[0].header("x-hub-signature-256"), None);
}

#[tokio::test]
async fn profile_from_config_or_from_the_route() {
    let subs = serde_json::json!({
        ROUTE: { "secret": "s", "profile": "work" },
        "plain": { "secret": "s", "profile": "default" },
    })
    .to_string();
    let gw = Gw::start(&subs).await;
    assert_eq!(
        gw.dest(gw.cfg()).deliver(&delivery(DOC)).await.kind,
        OutcomeKind::Ok
    );
    let forced = gw.dest(HermesConfig {
        profile: Some("ops".into()),
        ..gw.cfg()
    });
    assert_eq!(forced.deliver(&delivery(DOC)).await.kind, OutcomeKind::Ok);
    let plain = HermesDestination::new("plain", gw.cfg(), TlsRoots::Platform).unwrap();
    assert_eq!(plain.deliver(&delivery(DOC)).await.kind, OutcomeKind::Ok);
    let paths: Vec<String> = gw.rx.requests().into_iter().map(|r| r.path).collect();
    assert_eq!(
        paths,
        [
            "/p/work/webhooks/github-ci",
            "/p/ops/webhooks/github-ci",
            "/webhooks/plain"
        ]
    );
}

#[tokio::test]
async fn base_url_with_a_path_prefix() {
    let gw = Gw::start(&subs_with_secret("s")).await;
    let dest = gw.dest(HermesConfig {
        base_url: format!("{}/gateway/", gw.rx.base()),
        ..gw.cfg()
    });
    assert_eq!(dest.deliver(&delivery(DOC)).await.kind, OutcomeKind::Ok);
    assert_eq!(gw.rx.requests()[0].path, "/gateway/webhooks/github-ci");
}

#[tokio::test]
async fn every_hermes_answer_maps() {
    let gw = Gw::start(&subs_with_secret("s")).await;
    let dest = gw.dest(gw.cfg());
    use Klass::*;
    use OutcomeKind::*;
    type Row = (
        Reply,
        OutcomeKind,
        Option<Klass>,
        &'static str,
        Option<&'static str>,
    );
    let rows: Vec<Row> = vec![
        (
            Reply::json(202, r#"{"status":"accepted"}"#),
            Ok,
            None,
            "hermes accepted",
            None,
        ),
        (
            Reply::json(202, r#"{"status":"coalesced"}"#),
            Ok,
            None,
            "hermes coalesced",
            Some("coalesced:"),
        ),
        (
            Reply::json(200, r#"{"status":"duplicate","delivery_id":"x"}"#),
            Ok,
            None,
            "hermes duplicate",
            None,
        ),
        (
            Reply::json(200, r#"{"status":"ignored","event":"push"}"#),
            Ok,
            None,
            "hermes ignored",
            Some("ignored:"),
        ),
        (
            Reply::json(200, r#"{"status":"delivered"}"#),
            Ok,
            None,
            "hermes delivered",
            None,
        ),
        (Reply::json(200, "not json"), Ok, None, "hermes 2xx", None),
        (
            Reply::json(401, r#"{"error":"Invalid signature"}"#),
            Retry,
            Some(Config),
            "hermes rejected the signature (sent webhook-signature and X-Hub-Signature-256)",
            None,
        ),
        (
            Reply::json(403, r#"{"error":"Route disabled: github-ci"}"#),
            Retry,
            Some(Config),
            "hermes route disabled",
            None,
        ),
        (
            Reply::json(404, r#"{"error":"Unknown route: github-ci"}"#),
            Retry,
            Some(Config),
            "hermes unknown route",
            None,
        ),
        (
            Reply::json(413, r#"{"error":"Payload too large"}"#),
            Dead,
            Some(Permanent),
            "hermes body too large",
            None,
        ),
        (
            Reply::json(429, r#"{"error":"Rate limit exceeded"}"#),
            Retry,
            Some(Throttle),
            "http 429",
            None,
        ),
        (
            Reply::json(400, r#"{"error":"Cannot parse body"}"#),
            Dead,
            Some(Permanent),
            "http 400",
            None,
        ),
        (
            Reply::status(302).header("location", "/x"),
            Retry,
            Some(Config),
            "http 302: redirect not followed",
            None,
        ),
        (
            Reply::status(301),
            Retry,
            Some(Config),
            "http 301: redirect not followed",
            None,
        ),
        (
            Reply::json(500, "{}"),
            Retry,
            Some(Transport),
            "http 500",
            None,
        ),
        (
            Reply::json(502, "{}"),
            Retry,
            Some(Transport),
            "http 502",
            None,
        ),
        (
            Reply::json(503, "{}"),
            Retry,
            Some(Transport),
            "http 503",
            None,
        ),
        (
            Reply::json(409, "{}"),
            Retry,
            Some(Config),
            "http 409",
            None,
        ),
    ];
    for (reply, kind, klass, reason, notice) in rows {
        let status = reply.status;
        gw.rx.push(reply);
        let o = dest.deliver(&delivery(DOC)).await;
        assert_eq!(
            (o.kind, o.klass, o.reason.as_str()),
            (kind, klass, reason),
            "{status}: {o:?}"
        );
        assert_eq!(o.status, Some(i64::from(status)));
        match notice {
            None => assert_eq!(o.notice, None, "{status}"),
            Some(prefix) => assert!(o.notice.as_deref().unwrap().starts_with(prefix), "{o:?}"),
        }
        if status == 429 {
            assert_eq!(
                o.retry_after_s, None,
                "Hermes' rate limit has no Retry-After: backoff"
            );
        }
    }
    gw.rx
        .push(Reply::json(429, "{}").header("retry-after", "45"));
    assert_eq!(dest.deliver(&delivery(DOC)).await.retry_after_s, Some(45.0));
    // Pointed details for the operator.
    gw.rx.push(Reply::json(404, "{}"));
    assert!(
        dest.deliver(&delivery(DOC))
            .await
            .detail
            .contains("hermes webhook subscribe github-ci")
    );
}

#[tokio::test]
async fn secret_is_read_fresh_on_every_attempt() {
    let gw = Gw::start(&subs_with_secret("before-rotation")).await;
    let dest = gw.dest(gw.cfg());
    assert_eq!(dest.deliver(&delivery(DOC)).await.kind, OutcomeKind::Ok);
    gw.rewrite(&subs_with_secret("after-rotation"));
    let mut d2 = delivery(DOC);
    d2.attempt_id = 901;
    assert_eq!(dest.deliver(&d2).await.kind, OutcomeKind::Ok);
    let reqs = gw.rx.requests();
    sw_verify("before-rotation", &reqs[0]).unwrap();
    sw_verify("after-rotation", &reqs[1]).unwrap();
    assert!(sw_verify("before-rotation", &reqs[1]).is_err());
    hub_verify(b"after-rotation", &reqs[1]).unwrap();
    assert_ne!(
        reqs[0].header("webhook-id"),
        reqs[1].header("webhook-id"),
        "per-attempt ids"
    );
}

#[tokio::test]
async fn unreadable_file_or_missing_secret_is_config_and_sends_nothing() {
    let gw = Gw::start(&subs_with_secret("s")).await;
    let cases = [
        ("missing file", None),
        ("not json", Some("{oops")),
        ("no such route", Some(r#"{"other": {"secret": "s"}}"#)),
        ("no secret", Some(r#"{"github-ci": {"prompt": "x"}}"#)),
        ("empty secret", Some(r#"{"github-ci": {"secret": ""}}"#)),
    ];
    for (what, content) in cases {
        let path = gw.dir.path().join("subs.json");
        match content {
            None => std::fs::remove_file(&path).unwrap(),
            Some(c) => write_subs(&path, c),
        }
        let o = gw.dest(gw.cfg()).deliver(&delivery(DOC)).await;
        assert_eq!(
            (o.kind, o.klass),
            (OutcomeKind::Retry, Some(Klass::Config)),
            "{what}: {o:?}"
        );
        assert!(!o.detail.is_empty(), "{what}");
    }
    assert!(gw.rx.requests().is_empty());
}

#[tokio::test]
async fn body_must_be_a_json_object() {
    let gw = Gw::start(&subs_with_secret("s")).await;
    let dest = gw.dest(gw.cfg());
    for body in ["[1, 2]", "\"text\"", "{\"a\": ", ""] {
        let o = dest.deliver(&delivery(body)).await;
        assert_eq!(
            (o.kind, o.klass),
            (OutcomeKind::Dead, Some(Klass::Permanent)),
            "{body:?}"
        );
    }
    let big = format!("{{\"pad\": \"{}\"}}", "x".repeat(2 * 1024 * 1024));
    let o = dest.deliver(&delivery(&big)).await;
    assert_eq!(o.reason, "body exceeds max_body_bytes");
    assert!(gw.rx.requests().is_empty());
}

#[tokio::test]
async fn gateway_down_is_transport() {
    let gw = Gw::start(&subs_with_secret("s")).await;
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}", l.local_addr().unwrap());
    drop(l);
    let dest = gw.dest(HermesConfig {
        base_url: dead,
        timeout_s: 2.0,
        ..gw.cfg()
    });
    let o = dest.deliver(&delivery(DOC)).await;
    assert_eq!(o.klass, Some(Klass::Transport), "{o:?}");
}

#[test]
fn check_route_reads_the_subscriptions_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("subs.json");
    let cfg = HermesConfig {
        subscriptions_path: path.clone(),
        ..HermesConfig::default()
    };
    write_subs(&path, &subs_with_secret("s"));
    assert!(
        check_route(&cfg, ROUTE).is_empty(),
        "{:?}",
        check_route(&cfg, ROUTE)
    );

    write_subs(
        &path,
        r#"{"github-ci": {"secret": "s", "events": ["push"], "coalesce": true}}"#,
    );
    let p = check_route(&cfg, ROUTE);
    assert_eq!(p.len(), 2, "{p:?}");
    assert!(p[0].contains("sets events") && p[1].contains("sets coalesce"));
    let unwrap_cfg = HermesConfig {
        unwrap: true,
        ..cfg.clone()
    };
    assert!(
        check_route(&unwrap_cfg, ROUTE).is_empty(),
        "unwrap routes may filter and coalesce"
    );

    write_subs(&path, r#"{"github-ci": {"enabled": false}}"#);
    let p = check_route(&cfg, ROUTE);
    assert!(
        p.iter().any(|m| m.contains("no secret")) && p.iter().any(|m| m.contains("disabled")),
        "{p:?}"
    );

    assert!(check_route(&cfg, "other")[0].contains("hermes webhook subscribe other"));
    std::fs::remove_file(&path).unwrap();
    assert!(check_route(&cfg, ROUTE)[0].contains("unreadable"));
    assert!(!check_route(&cfg, "../etc").is_empty());

    let bad = HermesConfig {
        base_url: "ftp://x".into(),
        event_header: Some("Content-Type".into()),
        dedup_header: Some("X-Dedup".into()),
        ..HermesConfig::default()
    };
    assert_eq!(bad.problems().len(), 3, "{:?}", bad.problems());
}
