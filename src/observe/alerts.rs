//! Alerts (spec 11.4): one alert per issue (re)opening, sent by running `alerts.argv` with
//! the text as its last argument, off the caller's thread.
//!
//! Rules kept here:
//! * An issue alerts once per opening: `alerted_at` is set only when the command exits 0, so
//!   a chat sender that is down loses nothing; a failed kind waits
//!   `ALERT_RETRY_AFTER_FAILURE_S` before the next try.
//! * The rate limit (`alerts.rate_limit_s`, default 1 per 30 min per kind) is persisted in
//!   the `alerts` table. Issues held back by it stay unalerted and are counted in
//!   `alerts.suppressed`; when the window opens they go out together in one alert.
//! * `alerts.dry = true` or `HOOKSPOOL_ALERT_DRY=1` records instead of sending: alerted_at
//!   is set and the text is kept in the audit trail (`Store::dry_alerts`).
//!
//! The command is the operator's own (see `sandbox::run_trusted` for why it is not
//! confined). Must not: log the alert text or the command's output.

use std::collections::BTreeMap;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::clock::{Clock, SharedClock};
use crate::config::Alerts;
use crate::sandbox::{self, ExitStatus};
use crate::store::{self, IssueRow, Role, Store, StoreError};

/// After a failed alert command, the kind waits this long before trying again.
pub const ALERT_RETRY_AFTER_FAILURE_S: f64 = 60.0;
/// Output of the alert command kept (and discarded): it is never logged.
const ALERT_STDOUT_BYTES_MAX: usize = 4096;
/// Issues named one by one in a single alert text; the rest are counted.
const ALERT_ISSUES_LISTED_MAX: usize = 5;
/// The environment switch for dry runs (spec 11.4).
pub const ALERT_DRY_ENV: &str = "HOOKSPOOL_ALERT_DRY";

/// What one pass did.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct AlertReport {
    /// Issue ids whose alert went out (or was recorded, when dry).
    pub sent: Vec<i64>,
    /// Kinds whose command failed, with the exit status or spawn error.
    pub failed: Vec<(String, String)>,
    /// Kinds held back by the rate limit, with how many issues wait.
    pub suppressed: Vec<(String, i64)>,
    pub dry: bool,
}

/// Whether alerts are recorded instead of sent.
pub fn is_dry(cfg: &Alerts) -> bool {
    cfg.dry || std::env::var(ALERT_DRY_ENV).is_ok_and(|v| v == "1")
}

/// The text sent for a kind's due issues: the first in full, the rest by fingerprint.
pub fn alert_text(issues: &[IssueRow], suppressed_before: i64) -> String {
    let mut text = String::new();
    for (i, issue) in issues.iter().take(ALERT_ISSUES_LISTED_MAX).enumerate() {
        if i > 0 {
            text.push('\n');
        }
        text.push_str(&format!(
            "hookspool {} issue #{}: {}",
            issue.kind, issue.id, issue.fingerprint
        ));
        if let Some(e) = &issue.last_error {
            text.push_str(&format!(" ({e})"));
        }
        if issue.count > 1 {
            text.push_str(&format!(", seen {} times", issue.count));
        }
        text.push_str(&advice(issue));
    }
    if issues.len() > ALERT_ISSUES_LISTED_MAX {
        text.push_str(&format!(
            "\n...and {} more: hookspool issues",
            issues.len() - ALERT_ISSUES_LISTED_MAX
        ));
    }
    if suppressed_before > 0 {
        text.push_str(&format!(
            "\n({suppressed_before} held back by the rate limit are included)"
        ));
    }
    text
}

fn advice(issue: &IssueRow) -> String {
    let batch = issue.sample_batch_id;
    let fp = issue.fingerprint.as_str();
    match (issue.kind.as_str(), batch) {
        ("delivery", Some(b)) if fp.ends_with(":permanent") || fp.ends_with(":poison") => {
            format!(
                "; see hookspool show {b} --attempts, then split/exclude and hookspool replay {b}"
            )
        }
        ("delivery", Some(b)) if fp.ends_with(":exhausted") => {
            format!("; see hookspool show {b} --attempts, then hookspool replay {b}")
        }
        ("delivery", Some(b)) => format!("; see hookspool show {b} --attempts"),
        ("config", Some(b)) if fp.starts_with("config:plugin:") => {
            format!("; fix the source, then hookspool replay {b}")
        }
        ("config", _) => "; run hookspool check".into(),
        ("spool", _) if fp == super::issues::NO_ACTIVE_DISPATCHER => {
            "; hookspool status lists the dispatchers: stop a hung active one and a standby takes over, or start one".into()
        }
        ("spool", _) => "; free disk space on the spool's filesystem".into(),
        ("source_silent", _) => "; check the sender's webhook and the sweep".into(),
        _ => String::new(),
    }
}

/// One pass, on the calling thread: every open issue that has not alerted, grouped by kind,
/// rate-limited, sent (or recorded when `dry`). `clock` is read again after each command so
/// `alerted_at` is when it succeeded.
pub fn run_due_blocking(
    store: &mut Store,
    cfg: &Alerts,
    dry: bool,
    clock: &dyn Clock,
) -> Result<AlertReport, StoreError> {
    let mut report = AlertReport {
        dry,
        ..AlertReport::default()
    };
    let mut by_kind: BTreeMap<String, Vec<IssueRow>> = BTreeMap::new();
    for issue in store.issues_unalerted()? {
        by_kind.entry(issue.kind.clone()).or_default().push(issue);
    }
    for (kind, issues) in by_kind {
        let now = clock.now();
        let rate = store.alert_rate(&kind)?;
        if let Some(last) = rate.last_at
            && now - last < cfg.rate_limit_s
        {
            store.alert_set_suppressed(&kind, issues.len() as i64)?;
            report.suppressed.push((kind, issues.len() as i64));
            continue;
        }
        if let Some(failed_at) = store.alert_failed_at(&kind)?
            && now - failed_at < ALERT_RETRY_AFTER_FAILURE_S
        {
            continue;
        }
        let ids: Vec<i64> = issues.iter().map(|i| i.id).collect();
        let text = alert_text(&issues, rate.suppressed);
        if dry {
            store.alert_sent(&kind, &ids, now, Some(&text))?;
            tracing::info!(
                reason = kind.as_str(),
                "alert recorded (dry) for issues {ids:?}"
            );
            report.sent.extend(ids);
            continue;
        }
        let mut argv = cfg.argv.clone();
        argv.push(text);
        let timeout = Duration::try_from_secs_f64(cfg.timeout_s).unwrap_or(Duration::ZERO);
        let outcome = sandbox::run_trusted(&argv, timeout, ALERT_STDOUT_BYTES_MAX, false);
        let done = clock.now();
        match outcome {
            Ok(out) if out.status == ExitStatus::Code(0) => {
                store.alert_sent(&kind, &ids, done, None)?;
                tracing::info!(reason = kind.as_str(), "alert sent for issues {ids:?}");
                report.sent.extend(ids);
            }
            Ok(out) => {
                let why = match out.status {
                    _ if out.timed_out => "timed out".to_string(),
                    ExitStatus::Code(c) => format!("exit {c}"),
                    ExitStatus::Signal(s) => format!("signal {s}"),
                };
                store.alert_failed(&kind, done)?;
                tracing::warn!(
                    reason = kind.as_str(),
                    "alert command failed ({why}); issues {ids:?} stay unalerted"
                );
                report.failed.push((kind, why));
            }
            Err(e) => {
                store.alert_failed(&kind, done)?;
                // A command that cannot be executed is the config's mistake: say which key.
                let why = if e.is_exec_failure() {
                    format!(
                        "alerts.argv[0] cannot be executed ({e}); write the full path of an executable"
                    )
                } else {
                    e.to_string()
                };
                tracing::warn!(
                    reason = kind.as_str(),
                    "alert command could not start ({why}); issues {ids:?} stay unalerted"
                );
                report.failed.push((kind, why));
            }
        }
    }
    Ok(report)
}

/// One pass on a new thread with its own connection to `db`: what the dispatcher's tick
/// calls, so a slow chat sender never holds the main loop. Join the handle (or keep it in
/// an [`Alerter`]) to learn the result.
pub fn run_due(
    at: crate::store::SpoolAt,
    cfg: Alerts,
    clock: SharedClock,
) -> std::io::Result<JoinHandle<Result<AlertReport, StoreError>>> {
    std::thread::Builder::new()
        .name("hookspool-alerts".into())
        .spawn(move || {
            let mut store = Store::open_at(
                &at,
                Role::Reader,
                Duration::from_secs(store::DEFAULT_BUSY_TIMEOUT_S),
            )?;
            let dry = is_dry(&cfg);
            run_due_blocking(&mut store, &cfg, dry, clock.as_ref())
        })
}

/// At most one alert pass at a time: the dispatcher keeps one `Alerter` and calls
/// [`Alerter::tick`] from its maintenance tick.
#[derive(Debug, Default)]
pub struct Alerter {
    running: Option<JoinHandle<Result<AlertReport, StoreError>>>,
}

impl Alerter {
    pub fn new() -> Alerter {
        Alerter::default()
    }

    /// Whether a pass is running now.
    pub fn running(&self) -> bool {
        self.running.as_ref().is_some_and(|h| !h.is_finished())
    }

    /// Starts a pass unless one is still running. Returns the previous pass's result once
    /// it has finished (`None` while it runs, or when none ran).
    pub fn tick(
        &mut self,
        at: &crate::store::SpoolAt,
        cfg: &Alerts,
        clock: &SharedClock,
    ) -> Option<Result<AlertReport, String>> {
        if self.running.as_ref().is_some_and(|h| !h.is_finished()) {
            return None;
        }
        let finished = self.running.take().map(|h| match h.join() {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(_) => Err("the alert thread panicked".to_string()),
        });
        match run_due(at.clone(), cfg.clone(), clock.clone()) {
            Ok(h) => self.running = Some(h),
            Err(e) => tracing::warn!("could not start the alert thread: {e}"),
        }
        finished
    }

    /// Waits for the running pass (shutdown, tests).
    pub fn finish(&mut self) -> Option<Result<AlertReport, String>> {
        self.running.take().map(|h| match h.join() {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(_) => Err("the alert thread panicked".to_string()),
        })
    }
}
