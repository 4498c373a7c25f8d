//! Issue 29, the operator's side, through the real binary: both halves of `hookspool run`
//! apply a saved config within the same second; the dispatcher logs a reload's warnings too;
//! `metrics` shows the intake's gauges; the text of `status` shows the poll table;
//! `bobbin show` lists the rule packs.

use std::time::{Duration, Instant};

use super::intake::{raw, request};
use super::receiver::Receiver;
use super::run_e2e::{RunProc, reserved_port};
use super::wiring::run_config;

/// How many lines of `log` hold all of `words`.
fn lines_with(log: &str, words: &[&str]) -> usize {
    log.lines()
        .filter(|l| words.iter().all(|w| l.contains(w)))
        .count()
}

fn reloads(run: &RunProc, half: &str) -> usize {
    lines_with(&run.log(), &["config reloaded", half])
}

/// Issue 29: on a save, the intake picked the new config up to 5 s after the dispatcher (its
/// mtime poll ran every 5 s, the dispatcher's every second), and events sent in between
/// followed the old routes. Both halves watch the file the same way now: at each of three
/// saves (at different phases of any poll), both log the reload within a second or so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saved_config_is_applied_by_both_halves_within_the_same_second() {
    let rx = Receiver::start().await;
    let home = tempfile::tempdir().unwrap();
    let h = home.path().to_path_buf();
    let port = reserved_port();
    let config = run_config(&h, port, &rx.url(), "");
    std::fs::write(h.join("config.toml"), &config).unwrap();
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut run = RunProc::start(&h, addr, &[]);
    wait_for(&run, "dispatcher ready", Duration::from_secs(30));
    let within = Duration::from_millis(1500);
    for round in 0..3 {
        let (intake0, dispatch0) = (reloads(&run, "intake"), reloads(&run, "dispatch"));
        std::fs::write(h.join("config.toml"), format!("{config}\n# save {round}\n")).unwrap();
        let saved = Instant::now();
        let (mut intake_at, mut dispatch_at) = (None, None);
        while saved.elapsed() < Duration::from_secs(8)
            && (intake_at.is_none() || dispatch_at.is_none())
        {
            if intake_at.is_none() && reloads(&run, "intake") > intake0 {
                intake_at = Some(saved.elapsed());
            }
            if dispatch_at.is_none() && reloads(&run, "dispatch") > dispatch0 {
                dispatch_at = Some(saved.elapsed());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let (Some(i), Some(d)) = (intake_at, dispatch_at) else {
            panic!(
                "save {round}: intake {intake_at:?}, dispatcher {dispatch_at:?}; log:\n{}",
                run.log()
            );
        };
        assert!(
            i < within && d < within,
            "save {round}: the intake applied it after {i:?}, the dispatcher after {d:?}; both must within {within:?}"
        );
        // The next save lands at another phase of any periodic check.
        std::thread::sleep(Duration::from_millis(700 + 400 * round));
    }
    run.sigterm();
    assert!(run.wait_exit(Duration::from_secs(30)).success());
}

fn wait_for(run: &RunProc, line: &str, within: Duration) {
    let deadline = Instant::now() + within;
    while !run.log().contains(line) {
        assert!(
            Instant::now() < deadline,
            "no {line:?} in the log:\n{}",
            run.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Issue 29: a reload's config warnings (an unknown key, left out) were logged by the intake
/// only; the dispatcher, which applies the same file, said nothing about them. Under `run`
/// (and as `hookspool dispatch`) the dispatcher logs each one at its reload too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dispatcher_logs_the_warnings_of_a_reload() {
    let rx = Receiver::start().await;
    let home = tempfile::tempdir().unwrap();
    let h = home.path().to_path_buf();
    let port = reserved_port();
    let config = run_config(&h, port, &rx.url(), "");
    std::fs::write(h.join("config.toml"), &config).unwrap();
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut run = RunProc::start(&h, addr, &[]);
    wait_for(&run, "dispatcher ready", Duration::from_secs(30));
    let with_typo = config.replace("[limits]\n", "[limits]\nmin_free_byts = 1\n");
    assert_ne!(with_typo, config);
    std::fs::write(h.join("config.toml"), &with_typo).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let warned = |half: &str| {
        lines_with(
            &run.log(),
            &["config warning", "limits.min_free_byts", half],
        )
    };
    while (warned("intake") == 0 || warned("dispatch") == 0) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(warned("intake"), 1, "the intake warns; log:\n{}", run.log());
    assert_eq!(
        warned("dispatch"),
        1,
        "the dispatcher warns too; log:\n{}",
        run.log()
    );
    run.sigterm();
    assert!(run.wait_exit(Duration::from_secs(30)).success());
}

/// `hookspool --home <home> <args>` (none of the path variables of the environment): its
/// stdout, which must be a success.
fn hs(home: &std::path::Path, args: &[&str]) -> String {
    let out = std::process::Command::new(super::bin())
        .arg("--home")
        .arg(home)
        .args(args)
        .env_remove("HOOKSPOOL_CONFIG")
        .env_remove("HOOKSPOOL_HOME")
        .env_remove("HOOKSPOOL_DB")
        .env_remove("HOOKSPOOL_FAILPOINT")
        .env_remove("XDG_STATE_HOME")
        .output()
        .expect("run hookspool");
    assert!(
        out.status.success(),
        "hookspool {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

/// Issue 29: `hookspool metrics` printed the dispatcher's gauges only; the intake's own
/// counters (events received, requests rejected, ...) live in the intake process and were
/// nowhere in it. With the intake reachable at its configured address, `metrics` prints
/// the intake's whole /metrics page (its counters and the gauges); without it, the gauges
/// and a line saying where the intake's counters are served and why they are missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_shows_the_intakes_counters_when_the_intake_answers_and_says_where_they_are_when_not()
 {
    let rx = Receiver::start().await;
    let home = tempfile::tempdir().unwrap();
    let h = home.path().to_path_buf();
    let port = reserved_port();
    std::fs::write(h.join("config.toml"), run_config(&h, port, &rx.url(), "")).unwrap();
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut run = RunProc::start(&h, addr, &[]);
    let r = run.post("s", b"wiring-source-secret", br#"{"topic":"a"}"#, &[]);
    assert_eq!(r.status, 200, "{r:?}");

    let text = hs(&h, &["metrics"]);
    assert!(
        text.contains("hookspool_events_received_total{source=\"s\"} 1"),
        "the intake's counter:\n{text}"
    );
    assert!(
        text.contains("# TYPE hookspool_batches gauge"),
        "the gauges:\n{text}"
    );
    assert!(
        text.contains(&format!("127.0.0.1:{port}")),
        "says where it came from:\n{text}"
    );

    run.sigterm();
    assert!(run.wait_exit(Duration::from_secs(30)).success());
    let text = hs(&h, &["metrics"]);
    assert!(
        text.contains("# TYPE hookspool_batches gauge"),
        "the gauges:\n{text}"
    );
    assert!(!text.contains("hookspool_events_received_total{"), "{text}");
    assert!(
        text.contains(&format!("/metrics on 127.0.0.1:{port}")) && text.contains("did not answer"),
        "says where the intake's counters are:\n{text}"
    );
}

/// A home with a poll bobbin instance (hookspool.feed, every 900 s by its manifest) and a
/// migrated spool.
fn poll_home() -> tempfile::TempDir {
    let home = tempfile::tempdir().unwrap();
    std::fs::write(
        home.path().join("config.toml"),
        r#"
[bobbins.feed]
bobbin = "hookspool.feed"
settings = { url = "https://feeds.example.org/atom.xml" }
outputs = { entry = "hermes:feed" }
"#,
    )
    .unwrap();
    hs(home.path(), &["migrate"]);
    home
}

/// Issue 29: `status --json` has a `polls` table (each poll instance's period, next tick,
/// last tick, delivery, pending and skipped ticks, staleness); the text form showed none of
/// it. It shows a POLL table now, with the same figures.
#[test]
fn the_text_of_status_shows_the_polls_table_the_json_has() {
    let home = poll_home();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let mut store = super::open(&home.path().join("spool.db"));
    assert!(store.poll_schedule_new("feed", now + 600.0, now).unwrap());
    drop(store);
    let json: serde_json::Value =
        serde_json::from_str(&hs(home.path(), &["--json", "status"])).unwrap();
    let feed = &json["polls"]["feed"];
    assert_eq!(feed["every_s"], 900.0, "{json}");
    let text = hs(home.path(), &["status"]);
    let mut lines = text.lines().skip_while(|l| !l.starts_with("POLL"));
    let header = lines
        .next()
        .unwrap_or_else(|| panic!("no POLL table:\n{text}"));
    for column in [
        "EVERY",
        "NEXT TICK",
        "LAST TICK",
        "DELIVERED",
        "PENDING",
        "TICKS SKIPPED",
        "STATE",
    ] {
        assert!(header.contains(column), "{column} in {header:?}");
    }
    let row = lines
        .find(|l| l.starts_with("feed "))
        .unwrap_or_else(|| panic!("no feed row under POLL:\n{text}"));
    assert!(row.contains("900s"), "{row}");
    assert!(
        row.contains("in 10m") || row.contains("in 9m"),
        "next tick in about 10 minutes: {row}"
    );
    assert!(row.contains("never"), "no tick yet: {row}");
    assert!(row.contains("ok"), "{row}");
}

/// Issue 29 (spec 14.3.5: `bobbin show` lists "the rule packs the bobbin ships
/// (rule-packs/*.toml: name, status, rules)"): it printed the packs' names alone. Each pack
/// now shows its status and description and each rule with the output it emits, in the text
/// and in --json. The figures are bobbins/google/gmail/rule-packs/scheduling.toml's.
#[test]
fn bobbin_show_lists_each_rule_packs_name_status_and_rules() {
    let home = tempfile::tempdir().unwrap();
    let text = hs(home.path(), &["bobbin", "show", "google.gmail"]);
    let at = text
        .find("rule packs:")
        .unwrap_or_else(|| panic!("no rule packs:\n{text}"));
    let packs = &text[at..];
    assert!(packs.contains("scheduling (stable)"), "{packs}");
    for rule in ["availability", "meeting-request", "calendar-invite"] {
        assert!(
            packs.contains(&format!("{rule} -> scheduling")),
            "{rule} in:\n{packs}"
        );
    }
    let json: serde_json::Value = serde_json::from_str(&hs(
        home.path(),
        &["--json", "bobbin", "show", "google.gmail"],
    ))
    .unwrap();
    let pack = &json["rule_packs"][0];
    assert_eq!(pack["name"], "scheduling", "{json}");
    assert_eq!(pack["status"], "stable", "{json}");
    assert_eq!(pack["rules"][0]["name"], "availability", "{json}");
    assert_eq!(pack["rules"][0]["output"], "scheduling", "{json}");
}

/// Issue 29: when the store refused a verified request (a bug of ours), the intake stored it
/// as a quarantine event (class StoreRefused), but answered and logged that quarantine with
/// the labels of the request it replaced: not a quarantine, of no class ("plugin error: "),
/// which a debug build's assertion caught as a panic and a release build logged blank. The
/// fallback is labelled as what it is: 202 quarantined, logged with its class, counted as
/// quarantined, and the quarantine batch is in the spool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_refused_fallback_is_labelled_as_its_quarantine() {
    let rx = Receiver::start().await;
    let home = tempfile::tempdir().unwrap();
    let h = home.path().to_path_buf();
    let port = reserved_port();
    std::fs::write(h.join("config.toml"), run_config(&h, port, &rx.url(), "")).unwrap();
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut run = RunProc::start(
        &h,
        addr,
        &[
            ("HOOKSPOOL_FAILPOINT", "enqueue.refused"),
            ("HOOKSPOOL_FAILPOINT_ACTION", "error"),
        ],
    );
    let r = run.post("s", b"wiring-source-secret", br#"{"topic":"a"}"#, &[]);
    assert_eq!(r.status, 202, "{r:?}; log:\n{}", run.log());
    assert!(
        String::from_utf8_lossy(&r.body).contains("quarantined"),
        "{r:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while lines_with(&run.log(), &["quarantined", "status=202"]) == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let log = run.log();
    let line = log
        .lines()
        .find(|l| l.contains("quarantined") && l.contains("status=202"))
        .unwrap_or_else(|| panic!("no quarantine line:\n{log}"));
    assert!(line.contains("StoreRefused"), "{line}");
    assert!(
        !line.contains("plugin error"),
        "not a plugin's error: {line}"
    );
    let list = hs(&h, &["--json", "list", "--destination", "quarantine"]);
    assert!(list.contains("StoreRefused"), "{list}");
    assert!(
        !list.contains("plugin error"),
        "not a plugin's error: {list}"
    );
    let metrics = hs(&h, &["metrics"]);
    assert!(
        metrics.contains("hookspool_events_quarantined_total{source=\"s\"} 1"),
        "{metrics}"
    );
    run.sigterm();
    assert!(run.wait_exit(Duration::from_secs(30)).success());
}

/// Issue 29: Twilio's JSON-body webhooks (`?bodySHA256=`) could not be set up: the check
/// (`verify::twilio_json`) existed, but no scheme, bobbin or template reached it. The
/// template scheme `hmac-sha1-base64-url-json` does, here through the hookspool.webhook
/// bobbin (every template key a setting) under `hookspool run`, with twilio-python's
/// published vector: tests/unit/test_request_validator.py of twilio/twilio-python (commit
/// 30368b08ba580a6c18202ab20bfc68d59559ebd7), test_validation_of_body_succeeds: token
/// "12345" (setUp), the URL `self.uri` = "https://mycompany.com/myapp.php?foo=1&bar=2" with
/// "&bodySHA256=" + `self.bodyHash`, the body `self.body`, the signature
/// "a9nBmqA0ju/hNViExpshrM61xv4=" (also tests/vectors/twilio/vectors.json, TW-JSON). And
/// the port: configured with ":443" written out, the same signature holds, as
/// twilio-python's validate accepts it (test_validation_adds_port_on_https's rule).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twilio_json_body_webhooks_are_accepted_through_a_bobbin_with_the_reference_vector() {
    const TOKEN: &str = "12345"; // setUp: token = "12345"
    const BODY: &str = r#"{"property": "value", "boolean": true}"#; // self.body
    const BODY_SHA256: &str = "0a1ff7634d9ab3b95db5c9a2dfe9416e41502b283a80c7cf19632632f96e6620"; // self.bodyHash
    const SIGNATURE: &str = "a9nBmqA0ju/hNViExpshrM61xv4="; // test_validation_of_body_succeeds
    let rx = Receiver::start().await;
    let home = tempfile::tempdir().unwrap();
    let h = home.path().to_path_buf();
    let port = reserved_port();
    std::fs::write(h.join("twilio.token"), TOKEN).unwrap();
    let config = |callback_url: &str| {
        format!(
            r#"
[intake]
listen = "127.0.0.1:{port}"
[limits]
min_free_bytes = 0
[alerts]
dry = true
[bobbins.tw]
bobbin = "hookspool.webhook"
secrets.secret = {{ file = "{home}/twilio.token" }}
settings = {{ scheme = "hmac-sha1-base64-url-json", header = "X-Twilio-Signature", callback_url = "{callback_url}", key = ["payload.property"] }}
outputs = {{ "*" = "http-recv" }}
[destinations.http-recv]
type = "http"
url = "{url}"
allow_insecure = true
allow_private = ["127.0.0.1/32"]
secret = {{ file = "{home}/dest.secret" }}
"#,
            home = h.display(),
            url = rx.url()
        )
    };
    std::fs::write(
        h.join("dest.secret"),
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
    )
    .unwrap();
    std::fs::write(
        h.join("config.toml"),
        config("https://mycompany.com/myapp.php?foo=1&bar=2"),
    )
    .unwrap();
    let check = std::process::Command::new(super::bin())
        .arg("--home")
        .arg(&h)
        .arg("check")
        .env_remove("HOOKSPOOL_CONFIG")
        .env_remove("HOOKSPOOL_HOME")
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "check: {}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut run = RunProc::start(&h, addr, &[]);
    let post = |sig: &str, body: &str| {
        raw(
            addr,
            &request(
                "POST",
                &format!("/hooks/tw?foo=1&bar=2&bodySHA256={BODY_SHA256}"),
                &[
                    ("Content-Type", "application/json"),
                    ("X-Twilio-Signature", sig),
                ],
                body.as_bytes(),
            ),
        )
    };
    let r = post(SIGNATURE, BODY);
    assert_eq!(r.status, 200, "{r:?}; log:\n{}", run.log());
    assert_eq!(post("AAAAAAAAAAAAAAAAAAAAAAAAAAA=", BODY).status, 401);
    assert_eq!(
        post(SIGNATURE, &BODY.replace("value", "valuf")).status,
        401,
        "the body must match its bodySHA256"
    );
    // The callback URL with its default port written out: the same signature holds.
    std::fs::write(
        h.join("config.toml"),
        config("https://mycompany.com:443/myapp.php?foo=1&bar=2"),
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while reloads(&run, "intake") == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let r = post(SIGNATURE, BODY);
    assert_eq!(r.status, 200, "with :443: {r:?}; log:\n{}", run.log());
    run.sigterm();
    assert!(run.wait_exit(Duration::from_secs(30)).success());
}
