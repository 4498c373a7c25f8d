//! Issues open, alert once, resolve and reopen (spec 11.4) with a real alert command that
//! fails and then succeeds; the persisted rate limit; dry runs; source_silent; and the
//! sentinel check over everything observe logs.

use std::path::Path;

use super::alerts::{self, Alerter};
use super::issues::{self, DeliveryReason};
use super::logging::{self, Sink};
use crate::clock::{Clock, ManualClock, SharedClock};
use crate::config::{self, Alerts, PathInputs};
use crate::store::IssueChange;
use crate::store::testutil::temp_store;

const T0: f64 = 1_800_000_000.0;
const SENTINEL: &str = "SENTINEL-7f3a9c";

/// An alert command that fails on its first run and succeeds afterwards, appending each
/// text it was given (its last argument) to `sent.txt` and counting runs in `runs`.
fn flaky_alert_script(dir: &Path) -> Vec<String> {
    let script = dir.join("alert.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nd={}\necho run >> \"$d/runs\"\nif [ ! -e \"$d/armed\" ]; then touch \"$d/armed\"; exit 1; fi\nfor last; do :; done\nprintf '%s\\n---\\n' \"$last\" >> \"$d/sent.txt\"\n",
            dir.display()
        ),
    )
    .expect("write script");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    vec![script.display().to_string(), "--to".into(), "ops".into()]
}

fn runs(dir: &Path) -> usize {
    std::fs::read_to_string(dir.join("runs"))
        .map(|t| t.lines().count())
        .unwrap_or(0)
}

fn sent(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("sent.txt")).unwrap_or_default()
}

fn alerts_cfg(argv: Vec<String>) -> Alerts {
    Alerts {
        argv,
        dry: false,
        rate_limit_s: 1800.0,
        timeout_s: 10.0,
    }
}

#[test]
fn issue_states_follow_spec_11_4() {
    let (_d, mut s) = temp_store();
    let fp = issues::delivery_fingerprint("http:audit", DeliveryReason::Timeout);
    assert_eq!(fp, "delivery:http:audit:timeout");
    let open = |s: &mut crate::store::Store, t: f64| {
        issues::delivery_failed(
            s,
            "http:audit",
            Some("hooks"),
            DeliveryReason::Timeout,
            Some(7),
            Some("timeout"),
            t,
        )
        .expect("open")
    };
    let id = match open(&mut s, T0) {
        IssueChange::Opened(id) => id,
        other => panic!("{other:?}"),
    };
    assert_eq!(open(&mut s, T0 + 1.0), IssueChange::Bumped(id));
    s.alert_sent("delivery", &[id], T0 + 2.0, None)
        .expect("alerted");
    // Acked: still counted, still no new alert.
    assert_eq!(
        s.issue_set_state(id, "acked", T0 + 3.0).unwrap().state,
        "acked"
    );
    assert_eq!(open(&mut s, T0 + 4.0), IssueChange::Bumped(id));
    let row = s.issue(id).unwrap();
    assert_eq!((row.state.as_str(), row.count), ("acked", 3));
    assert_eq!(row.alerted_at, Some(T0 + 2.0));
    assert!(s.issues_unalerted().unwrap().is_empty());
    // A success auto-resolves the transient class; the next failure reopens and alerts.
    assert_eq!(
        issues::attempt_succeeded(&mut s, "http:audit", T0 + 5.0).unwrap(),
        vec![fp.clone()]
    );
    assert_eq!(s.issue(id).unwrap().state.as_str(), "resolved");
    assert_eq!(open(&mut s, T0 + 6.0), IssueChange::Reopened(id));
    let row = s.issue(id).unwrap();
    assert_eq!((row.state.as_str(), row.alerted_at), ("open", None));
    assert_eq!(s.issues_unalerted().unwrap().len(), 1);
    // Ignored never alerts or reopens.
    s.issue_set_state(id, "ignored", T0 + 7.0).unwrap();
    assert_eq!(open(&mut s, T0 + 8.0), IssueChange::Ignored(id));
    assert!(!issues::resolve(&mut s, &fp, T0 + 9.0).unwrap());
    let row = s.issue(id).unwrap();
    assert_eq!((row.state.as_str(), row.count), ("ignored", 5));
    assert!(s.issues_unalerted().unwrap().is_empty());
    assert!(
        s.issue_set_state(id, "acked", T0).is_err(),
        "only open can be acked"
    );
    // Permanent waits for its dead batches, not for a success.
    issues::delivery_failed(
        &mut s,
        "http:audit",
        None,
        DeliveryReason::Permanent,
        Some(9),
        Some("http 422"),
        T0,
    )
    .unwrap();
    assert!(
        issues::attempt_succeeded(&mut s, "http:audit", T0 + 1.0)
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        issues::dead_batches_cleared(&mut s, "http:audit", T0 + 2.0).unwrap(),
        vec!["delivery:http:audit:permanent".to_string()]
    );
    assert_eq!(s.issues_open_count().unwrap(), 0);
}

#[test]
fn alerts_once_retry_after_failure_and_rate_limit_per_kind() {
    let (dir, mut s) = temp_store();
    let cfg = alerts_cfg(flaky_alert_script(dir.path()));
    let clock = ManualClock::new(T0);
    let a = issues::delivery_failed(
        &mut s,
        "http:audit",
        Some("hooks"),
        DeliveryReason::Unreachable,
        Some(3),
        Some("connection refused"),
        T0,
    )
    .unwrap()
    .id();
    // First run: the command exits 1; nothing is marked alerted.
    let r = alerts::run_due_blocking(&mut s, &cfg, false, &clock).unwrap();
    assert_eq!(
        r.failed,
        vec![("delivery".to_string(), "exit 1".to_string())]
    );
    assert!(r.sent.is_empty());
    assert_eq!(s.issue(a).unwrap().alerted_at, None);
    assert_eq!(runs(dir.path()), 1);
    // Within the retry pause nothing runs.
    clock.set(T0 + 10.0);
    alerts::run_due_blocking(&mut s, &cfg, false, &clock).unwrap();
    assert_eq!(runs(dir.path()), 1);
    // After it, the command succeeds: alerted_at is set, the text was the last argument.
    clock.set(T0 + alerts::ALERT_RETRY_AFTER_FAILURE_S + 1.0);
    let r = alerts::run_due_blocking(&mut s, &cfg, false, &clock).unwrap();
    assert_eq!(r.sent, vec![a]);
    let t_sent = T0 + alerts::ALERT_RETRY_AFTER_FAILURE_S + 1.0;
    assert_eq!(s.issue(a).unwrap().alerted_at, Some(t_sent));
    assert_eq!(
        sent(dir.path()),
        format!(
            "hookspool delivery issue #{a}: delivery:http:audit:unreachable (connection refused); see hookspool show 3 --attempts\n---\n"
        )
    );
    // Once per opening: another pass sends nothing.
    clock.advance(5.0);
    assert!(
        alerts::run_due_blocking(&mut s, &cfg, false, &clock)
            .unwrap()
            .sent
            .is_empty()
    );
    assert_eq!(runs(dir.path()), 2);
    // A second delivery issue inside the window is held back (persisted count) ...
    let b = issues::delivery_failed(
        &mut s,
        "hermes:ci",
        None,
        DeliveryReason::Http5xx,
        Some(4),
        Some("http 502"),
        clock.now(),
    )
    .unwrap()
    .id();
    let r = alerts::run_due_blocking(&mut s, &cfg, false, &clock).unwrap();
    assert_eq!(r.suppressed, vec![("delivery".to_string(), 1)]);
    assert_eq!(s.alert_rate("delivery").unwrap().suppressed, 1);
    assert_eq!(s.alert_rate("delivery").unwrap().last_at, Some(t_sent));
    // ... while another kind is not limited by it.
    let c = issues::spool_limit(&mut s, "min_free_bytes", true, Some("low"), clock.now());
    assert!(c.is_ok());
    let r = alerts::run_due_blocking(&mut s, &cfg, false, &clock).unwrap();
    assert_eq!(r.sent.len(), 1, "{r:?}");
    // When the window opens the held-back issue goes out, saying so.
    clock.set(t_sent + 1800.0);
    let r = alerts::run_due_blocking(&mut s, &cfg, false, &clock).unwrap();
    assert_eq!(r.sent, vec![b]);
    assert!(sent(dir.path()).contains("(1 held back by the rate limit are included)"));
    assert_eq!(s.alert_rate("delivery").unwrap().suppressed, 0);
    // Resolve and reopen: one more alert, after the rate limit.
    issues::attempt_succeeded(&mut s, "http:audit", clock.now()).unwrap();
    clock.advance(60.0);
    issues::delivery_failed(
        &mut s,
        "http:audit",
        None,
        DeliveryReason::Unreachable,
        Some(5),
        Some("connection refused"),
        clock.now(),
    )
    .unwrap();
    assert!(
        alerts::run_due_blocking(&mut s, &cfg, false, &clock)
            .unwrap()
            .sent
            .is_empty()
    );
    clock.advance(1800.0);
    assert_eq!(
        alerts::run_due_blocking(&mut s, &cfg, false, &clock)
            .unwrap()
            .sent,
        vec![a]
    );
}

#[test]
fn dry_alerts_record_instead_of_sending() {
    let (dir, mut s) = temp_store();
    let cfg = alerts_cfg(flaky_alert_script(dir.path()));
    let clock = ManualClock::new(T0);
    let id = issues::quarantined(&mut s, "hooks", 12, "MissingField", T0)
        .unwrap()
        .id();
    let r = alerts::run_due_blocking(&mut s, &cfg, true, &clock).unwrap();
    assert_eq!((r.sent.clone(), r.dry), (vec![id], true));
    assert_eq!(runs(dir.path()), 0, "dry never runs the command");
    assert_eq!(s.issue(id).unwrap().alerted_at, Some(T0));
    let recorded = s.dry_alerts().unwrap();
    assert_eq!(
        recorded,
        vec![(
            T0,
            "config".to_string(),
            format!(
                "hookspool config issue #{id}: config:plugin:hooks (plugin error: MissingField); fix the source, then hookspool replay 12"
            )
        )]
    );
    assert!(alerts::is_dry(&Alerts { dry: true, ..cfg }));
}

#[test]
fn alerter_runs_off_the_callers_thread() {
    let (dir, mut s) = temp_store();
    let script = dir.path().join("ok.sh");
    std::fs::write(&script, "#!/bin/sh\nsleep 0.3\nexit 0\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    issues::spool_limit(&mut s, "full", true, Some("ENOSPC"), T0).unwrap();
    let clock: SharedClock = std::sync::Arc::new(ManualClock::new(T0));
    let cfg = alerts_cfg(vec![script.display().to_string()]);
    let mut alerter = Alerter::new();
    let started = std::time::Instant::now();
    assert!(
        alerter
            .tick(
                &crate::store::SpoolAt::File(s.path().to_path_buf()),
                &cfg,
                &clock
            )
            .is_none()
    );
    assert!(
        started.elapsed() < std::time::Duration::from_millis(250),
        "tick must not wait for the command"
    );
    assert!(
        alerter
            .tick(
                &crate::store::SpoolAt::File(s.path().to_path_buf()),
                &cfg,
                &clock
            )
            .is_none(),
        "one pass at a time"
    );
    let report = alerter.finish().expect("a pass ran").expect("no error");
    assert_eq!(report.sent.len(), 1);
    assert!(s.issues_unalerted().unwrap().is_empty());
}

#[test]
fn source_silent_opens_after_expect_every_s_and_resolves_on_the_next_event() {
    let (_d, mut s) = temp_store();
    let text = "[sources.cal]\nscheme = \"static-token\"\nheader = \"X-Token\"\nkey = \"all\"\nexpect_every_s = 3600\naction = \"hermes:x\"\n";
    let (cfg, _) = config::parse(text, None, &PathInputs::default(), true).expect("config");
    // Never seen: watched from the first check.
    assert!(issues::check_sources(&mut s, &cfg, T0).unwrap().is_empty());
    assert_eq!(
        issues::check_sources(&mut s, &cfg, T0 + 3601.0).unwrap(),
        vec!["cal".to_string()]
    );
    let row = s
        .issue_by_fingerprint("source_silent:cal")
        .unwrap()
        .unwrap();
    assert_eq!(
        (row.kind.as_str(), row.state.as_str()),
        ("source_silent", "open")
    );
    // An event arrives (the intake writes last_event_at); the next check resolves.
    s.set_meta("source:cal:last_event_at", &(T0 + 3700.0).to_string())
        .unwrap();
    assert!(
        issues::check_sources(&mut s, &cfg, T0 + 3710.0)
            .unwrap()
            .is_empty()
    );
    let row = s
        .issue_by_fingerprint("source_silent:cal")
        .unwrap()
        .unwrap();
    assert_eq!(row.state.as_str(), "resolved");
}

/// `spool:no_active_dispatcher` (issue 33): opens once the heartbeat is three
/// `heartbeat_s` old (never before one was written), is not bumped while it stays open
/// or acked, resolves with a heartbeat, and opens again when the heartbeat goes stale again.
#[test]
fn no_active_dispatcher_opens_on_a_stale_heartbeat_once_and_again_after_a_heartbeat() {
    let (_d, mut s) = temp_store();
    let fp = issues::NO_ACTIVE_DISPATCHER;
    let check = |s: &mut crate::store::Store, now: f64| {
        issues::check_dispatcher_heartbeat(s, 10.0, now).unwrap()
    };
    // No dispatcher has ever run: nothing went missing.
    assert_eq!(check(&mut s, T0), None);
    s.set_meta("dispatcher_heartbeat_at", &T0.to_string())
        .unwrap();
    assert_eq!(check(&mut s, T0 + 30.0), None);
    assert!(s.issue_by_fingerprint(fp).unwrap().is_none());
    assert_eq!(check(&mut s, T0 + 31.0), Some(31.0));
    let row = s.issue_by_fingerprint(fp).unwrap().unwrap();
    assert_eq!(
        (row.kind.as_str(), row.state.as_str(), row.count),
        ("spool", "open", 1)
    );
    // Still stale, open then acked: one read each, no bump.
    check(&mut s, T0 + 32.0);
    s.issue_set_state(row.id, "acked", T0 + 33.0).unwrap();
    check(&mut s, T0 + 34.0);
    let row = s.issue_by_fingerprint(fp).unwrap().unwrap();
    assert_eq!((row.state.as_str(), row.count), ("acked", 1));
    // A heartbeat: resolved; stale again: open again.
    s.set_meta("dispatcher_heartbeat_at", &(T0 + 40.0).to_string())
        .unwrap();
    assert!(issues::dispatcher_active(&mut s, T0 + 40.0).unwrap());
    assert_eq!(check(&mut s, T0 + 45.0), None);
    assert_eq!(
        s.issue_by_fingerprint(fp).unwrap().unwrap().state,
        "resolved"
    );
    assert_eq!(check(&mut s, T0 + 71.0), Some(31.0));
    assert_eq!(s.issue_by_fingerprint(fp).unwrap().unwrap().state, "open");
}

/// Everything observe logs, with a sentinel in last_error, alert texts, payload-like
/// fields: no line may contain it.
#[test]
fn observe_never_logs_errors_texts_or_payloads() {
    let (dir, mut s) = temp_store();
    let cfg = alerts_cfg(flaky_alert_script(dir.path()));
    let clock = ManualClock::new(T0);
    let ((), logs) = logging::capture("dispatch", Sink::Json, || {
        let err = format!("upstream said {SENTINEL}");
        for reason in DeliveryReason::ALL {
            issues::delivery_failed(&mut s, "http:a", Some("r"), reason, Some(1), Some(&err), T0)
                .unwrap();
        }
        issues::delivery_config_failed(&mut s, "http:a", None, Some(1), Some(&err), T0).unwrap();
        issues::config_reload(&mut s, Err(&err), T0).unwrap();
        issues::spool_limit(&mut s, "busy", true, Some(&err), T0).unwrap();
        issues::quarantined(&mut s, "hooks", 2, "BadPayload", T0).unwrap();
        for _ in 0..2 {
            alerts::run_due_blocking(&mut s, &cfg, false, &clock).unwrap();
            clock.advance(alerts::ALERT_RETRY_AFTER_FAILURE_S + 1.0);
        }
        alerts::run_due_blocking(&mut s, &cfg, true, &clock).unwrap();
        issues::attempt_succeeded(&mut s, "http:a", T0).unwrap();
        issues::config_reload(&mut s, Ok(()), T0).unwrap();
    });
    assert!(
        sent(dir.path()).contains(SENTINEL),
        "the alert text does carry it"
    );
    assert!(logs.lines().count() >= 10, "{logs}");
    assert!(!logs.contains(SENTINEL), "{logs}");
    for line in logs.lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect("json line");
        assert!(v["msg"].is_string() && v["level"].is_string(), "{line}");
    }
}
