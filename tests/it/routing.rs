//! One routing decision for every path an event can take (issue 12): the same GitHub push
//! goes through the real intake (socket-activated `hookspool intake`), quarantine replay,
//! `hookspool source test` and `hookspool enqueue`, and each lands on the same route,
//! destination, window and tee copies: github's own default action (`hermes:github`) in
//! github's own burst span (120/600), plus the tee.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use hookspool::store::BatchFilter;

use super::intake::{raw, request};
use super::intake_proc::Proc;
use super::{bin, open};

const SECRET: &str = "routing-test-secret";
const AUDIT_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// The github source as the template would verify it (same signature header and scheme),
/// but with a key the body lacks: the intake quarantines every request.
const BROKEN: &str = r#"
[sources.gh]
type = "template"
scheme = "hmac-sha256-hex"
header = "X-Hub-Signature-256"
prefix = "sha256="
key = "payload.not_there"
action = "hermes:github"
"#;

/// The built-in github source: no action and no span in config, so its type's decide.
const FIXED: &str = "\n[sources.gh]\ntype = \"github\"\n";

fn config(home: &Path, source: &str) -> String {
    format!(
        r#"
[limits]
min_free_bytes = 0
{source}secrets.secret = {{ file = "{home}/secret" }}

[[routes]]
name = "gh-audit"
source = "gh"
tee = true
destination = "http-audit"

[destinations.http-audit]
type = "http"
url = "https://audit.invalid/hook"
secret = {{ file = "{home}/audit.secret" }}
"#,
        home = home.display()
    )
}

fn push_body(repo: &str) -> String {
    format!(r#"{{"ref":"refs/heads/main","repository":{{"full_name":"{repo}"}}}}"#)
}

fn signature(body: &str) -> String {
    use hmac::{Hmac, KeyInit, Mac};
    let mut m = <Hmac<sha2::Sha256> as KeyInit>::new_from_slice(SECRET.as_bytes()).unwrap();
    m.update(body.as_bytes());
    format!("sha256={}", hex::encode(m.finalize().into_bytes()))
}

fn github_headers<'a>(sig: &'a str, delivery: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        ("X-Hub-Signature-256", sig),
        ("X-GitHub-Event", "push"),
        ("X-GitHub-Delivery", delivery),
        ("Content-Type", "application/json"),
    ]
}

fn post_push(p: &Proc, repo: &str, delivery: &str) -> u16 {
    let body = push_body(repo);
    let sig = signature(&body);
    raw(
        p.tcp,
        &request(
            "POST",
            "/hooks/gh",
            &github_headers(&sig, delivery),
            body.as_bytes(),
        ),
    )
    .status
}

fn hs(home: &Path, args: &[&str], stdin: &str) -> std::process::Output {
    use std::io::Write;
    let mut c = Command::new(bin())
        .arg("--home")
        .arg(home)
        .args(args)
        .env_remove("HOOKSPOOL_CONFIG")
        .env_remove("HOOKSPOOL_HOME")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    c.wait_with_output().unwrap()
}

/// Route, destination and window of one copy.
type Placement = (String, String, String);

fn placement(route: &str, destination: &str, w: [f64; 4]) -> Placement {
    (
        route.to_string(),
        destination.to_string(),
        format!(
            "quiet_s {} max_s {} max_events {} max_bytes {}",
            w[0], w[1], w[2], w[3]
        ),
    )
}

/// Every copy the spool holds for events of `key`.
fn placements(db: &Path, key: &str) -> BTreeSet<Placement> {
    open(db)
        .list_batches(&BatchFilter {
            limit: 1000,
            ..BatchFilter::default()
        })
        .unwrap()
        .into_iter()
        .filter(|b| b.key == key && b.destination != "quarantine")
        .map(|b| {
            placement(
                &b.route,
                &b.destination,
                [b.quiet_s, b.max_s, b.max_events as f64, b.max_bytes as f64],
            )
        })
        .collect()
}

#[test]
fn one_decision_routes_the_same_push_alike_through_intake_replay_source_test_and_enqueue() {
    let home = tempfile::tempdir().unwrap();
    let h = home.path().to_path_buf();
    std::fs::write(h.join("secret"), SECRET).unwrap();
    std::fs::write(h.join("audit.secret"), AUDIT_SECRET).unwrap();
    let cfg = h.join("config.toml");
    std::fs::write(&cfg, config(&h, BROKEN)).unwrap();
    let p = Proc::start_in(home, &[]);
    p.wait_serving();

    // Quarantined under the broken source; kept for replay.
    assert_eq!(post_push(&p, "o/replayed", "d-q"), 202, "{}", p.log());

    // The fixed config: the intake reloads on SIGHUP.
    std::fs::write(&cfg, config(&h, FIXED)).unwrap();
    p.signal(nix::sys::signal::Signal::SIGHUP);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !p.log().contains("config reloaded") {
        assert!(Instant::now() < deadline, "no reload; log:\n{}", p.log());
        std::thread::sleep(Duration::from_millis(50));
    }

    // 1. The intake.
    assert_eq!(post_push(&p, "o/intake", "d-i"), 200, "{}", p.log());

    // 2. Quarantine replay through the fixed source.
    let q = open(&p.db())
        .list_batches(&BatchFilter {
            destination: Some("quarantine".into()),
            limit: 10,
            ..BatchFilter::default()
        })
        .unwrap();
    assert_eq!(q.len(), 1);
    let out = hs(&h, &["replay", &q[0].id.to_string()], "");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // 3. `hookspool enqueue`, with github's key shape.
    let out = hs(
        &h,
        &[
            "enqueue",
            "--source",
            "gh",
            "--key",
            "o/enqueued:push",
            "--event-type",
            "push",
        ],
        &push_body("o/enqueued"),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let want: BTreeSet<Placement> = [
        placement("gh", "hermes:github", [120.0, 600.0, 500.0, 786_432.0]),
        placement("gh-audit", "http-audit", [120.0, 600.0, 500.0, 786_432.0]),
    ]
    .into();
    for key in ["o/intake:push", "o/replayed:push", "o/enqueued:push"] {
        assert_eq!(placements(&p.db(), key), want, "{key}");
    }

    // 4. `hookspool source test` says the same, offline.
    let body = push_body("o/tested");
    let sig = signature(&body);
    let mut capture = String::from("POST /hooks/gh HTTP/1.1\n");
    for (k, v) in github_headers(&sig, "d-t") {
        capture.push_str(&format!("{k}: {v}\n"));
    }
    capture.push_str(&format!("\n{body}"));
    std::fs::write(h.join("push.http"), capture).unwrap();
    let out = hs(
        &h,
        &[
            "--json",
            "source",
            "test",
            "gh",
            "--request",
            &h.join("push.http").display().to_string(),
        ],
        "",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let tested: BTreeSet<Placement> = v["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["step"] == "route" || s["step"] == "tee")
        .map(|s| {
            let r = &s["result"];
            let w = &r["window"];
            let f = |k: &str| w[k].as_f64().unwrap();
            placement(
                r["route"].as_str().unwrap(),
                r["destination"].as_str().unwrap(),
                [f("quiet_s"), f("max_s"), f("max_events"), f("max_bytes")],
            )
        })
        .collect();
    assert_eq!(tested, want);
    assert_eq!(
        v["answer"],
        serde_json::json!({"status": 200, "body": "{\"status\":\"queued\"}"}),
        "the intake answered 200 queued"
    );
}

/// A source-level `event_header` reaches the hermes destination as its fallback header
/// (spec 6.4.1), through the real `hookspool run` and a real gateway stand-in that answers
/// as Hermes does; and an `X-Hookspool-Route` hint is refused with one log line.
#[test]
fn a_source_event_header_is_the_hermes_fallback_and_a_route_hint_is_refused_aloud() {
    use super::receiver::{Answer, Receiver};
    use super::run_e2e::{RunProc, reserved_port};
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(home.join("secret"), SECRET).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let gw = rt.block_on(Receiver::start());
    gw.set_default(Answer {
        body: r#"{"status":"accepted"}"#.into(),
        ..Answer::status(202).header("content-type", "application/json")
    });
    std::fs::write(
        home.join("subs.json"),
        r#"{"github": {"secret": "gw-route-secret", "enabled": true}}"#,
    )
    .unwrap();
    let port = reserved_port();
    let base = gw.url().trim_end_matches("/hook").to_string();
    std::fs::write(
        home.join("config.toml"),
        format!(
            r#"
[intake]
listen = "127.0.0.1:{port}"
[limits]
min_free_bytes = 0
[dispatch]
poll_s = 0.2
[alerts]
argv = ["/bin/true"]
[hermes]
base_url = "{base}"
subscriptions_path = "{home}/subs.json"
[sources.gh]
type = "github"
span = "immediate"
event_header = "X-GitHub-Event"
secrets.secret = {{ file = "{home}/secret" }}
"#,
            home = home.display()
        ),
    )
    .unwrap();
    let check = hs(&home, &["check"], "");
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stdout)
    );
    let mut run = RunProc::start(&home, format!("127.0.0.1:{port}").parse().unwrap(), &[]);
    let body = push_body("o/r");
    let sig = signature(&body);
    let mut headers = github_headers(&sig, "d-1");
    headers.push(("X-Hookspool-Route", "elsewhere"));
    let r = raw(
        run.addr,
        &request("POST", "/hooks/gh", &headers, body.as_bytes()),
    );
    assert_eq!(r.status, 200, "{}", run.log());
    let got = rt.block_on(gw.wait_for(1, Duration::from_secs(20)));
    assert_eq!(got.len(), 1, "{}", run.log());
    assert_eq!(
        got[0].path, "/webhooks/github",
        "github's own default action"
    );
    assert_eq!(got[0].header("x-github-event"), Some("push"));
    assert!(
        run.log().contains("X-Hookspool-Route is not supported"),
        "{}",
        run.log()
    );
    run.sigterm();
    assert!(run.wait_exit(Duration::from_secs(20)).success());
}

/// Two template sources reading the event type from a header, one without `attrs` (its
/// events carry no `event_type` attr at the intake) and one with `attrs.event_type`; a
/// route matches `event_type = "push"` for each. Before, `hookspool enqueue --event-type
/// push` always matched it, so an injected event took `t-push` while the same event at
/// the intake took the source's action.
#[test]
fn an_injected_event_matches_routes_with_the_attrs_its_source_gives_at_the_intake() {
    let home = tempfile::tempdir().unwrap();
    let h = home.path().to_path_buf();
    std::fs::write(h.join("secret"), SECRET).unwrap();
    std::fs::write(h.join("audit.secret"), AUDIT_SECRET).unwrap();
    let source = |name: &str, attrs: &str| {
        format!(
            r#"
[sources.{name}]
type = "template"
scheme = "hmac-sha256-hex"
header = "X-Hub-Signature-256"
prefix = "sha256="
key = "payload.repository.full_name"
event_type = "header.X-GitHub-Event"
{attrs}action = "http-main"
secrets.secret = {{ file = "{home}/secret" }}

[[routes]]
name = "{name}-push"
source = "{name}"
match = {{ event_type = "push" }}
destination = "http-push"
"#,
            home = h.display()
        )
    };
    let config = format!(
        r#"
[limits]
min_free_bytes = 0
{plain}{attrs}
[destinations.http-main]
type = "http"
url = "https://main.invalid/hook"
secret = {{ file = "{home}/audit.secret" }}

[destinations.http-push]
type = "http"
url = "https://push.invalid/hook"
secret = {{ file = "{home}/audit.secret" }}
"#,
        plain = source("plain", ""),
        attrs = source(
            "typed",
            "attrs = { event_type = \"header.X-GitHub-Event\" }\n"
        ),
        home = h.display()
    );
    std::fs::write(h.join("config.toml"), config).unwrap();
    let p = Proc::start_in(home, &[]);
    p.wait_serving();
    for (src, want) in [("plain", "http-main"), ("typed", "http-push")] {
        // The intake.
        let repo = format!("o/{src}-intake");
        let body = push_body(&repo);
        let sig = signature(&body);
        let r = raw(
            p.tcp,
            &request(
                "POST",
                &format!("/hooks/{src}"),
                &github_headers(&sig, &format!("d-{src}")),
                body.as_bytes(),
            ),
        );
        assert_eq!(r.status, 200, "{}", p.log());
        // `hookspool enqueue` of the same event.
        let enq = format!("o/{src}-enqueued");
        let out = hs(
            &h,
            &[
                "enqueue",
                "--source",
                src,
                "--key",
                &enq,
                "--event-type",
                "push",
            ],
            &push_body(&enq),
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let at_intake: Vec<String> = placements(&p.db(), &repo)
            .into_iter()
            .map(|(_, d, _)| d)
            .collect();
        let injected: Vec<String> = placements(&p.db(), &enq)
            .into_iter()
            .map(|(_, d, _)| d)
            .collect();
        assert_eq!(at_intake, [want], "{src} at the intake");
        assert_eq!(
            injected, at_intake,
            "{src}: enqueue decides as the intake does"
        );
    }
}
