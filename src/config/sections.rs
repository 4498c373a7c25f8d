//! The file's fixed tables, one function each: the raw table in, its validated type out,
//! every default a named `*_DEFAULT` constant with its unit last. `validate` (mod.rs)
//! calls these in order and then builds what depends on several tables (sources, routes,
//! destinations).
//!
//! Must not: read the host or resolve a secret; a problem names the key and what to write.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::raw::{self, ListenSpec, RawWindow};
use super::{
    Alerts, Breaker, DEFAULT_LISTEN, Dispatch, Hermes, Intake, MAX_BODY_BYTES_DEFAULT,
    MAX_BYTES_DEFAULT, MAX_EVENTS_DEFAULT, Problem, RetentionDays, SPAN_PRESETS, Span,
    check_listen, expand_home, pos_f, pos_i, problem, window_fields,
};
use crate::store::Window;

pub const INTAKE_BUSY_TIMEOUT_S_DEFAULT: f64 = 10.0;
pub const INTAKE_THREADS_DEFAULT: i64 = 4;
/// Group commit defaults (RUST-ADAPTATION "Performance design"): at most this many requests
/// in one transaction, and how long the writer waits to fill a group.
pub const GROUP_EVENTS_MAX_DEFAULT: i64 = 256;
pub const GROUP_WAIT_MS_DEFAULT: f64 = 0.0;

pub const DISPATCH_PARALLEL_DEFAULT: i64 = 4;
pub const DISPATCH_POLL_S_DEFAULT: f64 = 1.0;
pub const DISPATCH_HEARTBEAT_S_DEFAULT: f64 = 10.0;
pub const LEASE_GRACE_S_DEFAULT: f64 = 60.0;
pub const MAX_ATTEMPTS_DEFAULT: i64 = 64;
pub const BACKOFF_BASE_S_DEFAULT: f64 = 15.0;
pub const BACKOFF_CAP_S_DEFAULT: f64 = 300.0;
/// How long a destination may answer only throttles before a delivery issue opens.
pub const THROTTLE_ALERT_S_DEFAULT: f64 = 900.0;
pub const BREAKER_TRIP_AFTER_DEFAULT: i64 = 3;
pub const BREAKER_COOLDOWN_INITIAL_S_DEFAULT: f64 = 30.0;
pub const BREAKER_COOLDOWN_MAX_S_DEFAULT: f64 = 600.0;

pub const RETENTION_DELIVERED_DAYS_DEFAULT: f64 = 7.0;
pub const RETENTION_ATTEMPTS_DAYS_DEFAULT: f64 = 30.0;
pub const RETENTION_DROPPED_DAYS_DEFAULT: f64 = 7.0;
pub const RETENTION_ISSUES_DAYS_DEFAULT: f64 = 90.0;

pub const ALERTS_ARGV_DEFAULT: [&str; 3] = ["logger", "-t", "hookspool"];
pub const ALERTS_RATE_LIMIT_S_DEFAULT: f64 = 1800.0;
pub const ALERTS_TIMEOUT_S_DEFAULT: f64 = 60.0;

pub use crate::destinations::hermes::{
    HERMES_BASE_URL_DEFAULT, HERMES_SUBSCRIPTIONS_PATH_DEFAULT, HERMES_TIMEOUT_S_DEFAULT,
};

/// Free space the intake keeps on the spool's filesystem before it answers 507 (512 MiB).
pub const MIN_FREE_BYTES_DEFAULT: i64 = 536_870_912;
/// The spool file under the home when neither the environment nor `[spool] db` names one.
pub const SPOOL_DB_DEFAULT: &str = "spool.db";

/// `[spool] db`: relative to the home unless absolute; `HOOKSPOOL_DB` wins over the file.
pub fn spool_db(
    env_db: Option<&PathBuf>,
    spool: &raw::RawSpool,
    home: &std::path::Path,
) -> PathBuf {
    let rel = env_db
        .cloned()
        .or_else(|| spool.db.as_deref().map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(SPOOL_DB_DEFAULT));
    if rel.is_absolute() {
        rel
    } else {
        home.join(rel)
    }
}

/// `[intake]`.
pub fn intake(errors: &mut Vec<Problem>, raw: &raw::RawIntake) -> Intake {
    let listen = match raw.listen.clone() {
        None => vec![DEFAULT_LISTEN.to_string()],
        Some(ListenSpec::One(s)) => vec![s],
        Some(ListenSpec::Many(v)) => v,
    };
    let allow_remote = raw.allow_remote.unwrap_or(false);
    for (i, l) in listen.iter().enumerate() {
        if let Err(msg) = check_listen(l, allow_remote) {
            errors.push(problem(format!("intake.listen[{i}]"), msg));
        }
    }
    Intake {
        listen,
        max_body_bytes: pos_i(
            errors,
            "intake.max_body_bytes",
            raw.max_body_bytes,
            MAX_BODY_BYTES_DEFAULT,
            1,
        ),
        busy_timeout_s: pos_f(
            errors,
            "intake.busy_timeout_s",
            raw.busy_timeout_s,
            INTAKE_BUSY_TIMEOUT_S_DEFAULT,
            0.0,
        ),
        threads: raw
            .threads
            .map(|t| pos_i(errors, "intake.threads", Some(t), INTAKE_THREADS_DEFAULT, 1) as usize),
        allow_remote,
        group_events_max: pos_i(
            errors,
            "intake.group_events_max",
            raw.group_events_max,
            GROUP_EVENTS_MAX_DEFAULT,
            1,
        ),
        group_wait_ms: pos_f(
            errors,
            "intake.group_wait_ms",
            raw.group_wait_ms,
            GROUP_WAIT_MS_DEFAULT,
            0.0,
        ),
        pipelined_sync: raw.pipelined_sync.unwrap_or(false),
    }
}

/// `[dispatch]` and `[dispatch.breaker]`.
pub fn dispatch(errors: &mut Vec<Problem>, raw: &raw::RawDispatch) -> Dispatch {
    let rb = raw.breaker.clone().unwrap_or_default();
    let f = |errors: &mut Vec<Problem>, key: &str, v, d| pos_f(errors, key, v, d, 0.0);
    Dispatch {
        parallel: pos_i(
            errors,
            "dispatch.parallel",
            raw.parallel,
            DISPATCH_PARALLEL_DEFAULT,
            1,
        ),
        poll_s: pos_f(
            errors,
            "dispatch.poll_s",
            raw.poll_s,
            DISPATCH_POLL_S_DEFAULT,
            0.01,
        ),
        heartbeat_s: pos_f(
            errors,
            "dispatch.heartbeat_s",
            raw.heartbeat_s,
            DISPATCH_HEARTBEAT_S_DEFAULT,
            0.1,
        ),
        lease_grace_s: f(
            errors,
            "dispatch.lease_grace_s",
            raw.lease_grace_s,
            LEASE_GRACE_S_DEFAULT,
        ),
        max_attempts: pos_i(
            errors,
            "dispatch.max_attempts",
            raw.max_attempts,
            MAX_ATTEMPTS_DEFAULT,
            1,
        ),
        backoff_base_s: f(
            errors,
            "dispatch.backoff_base_s",
            raw.backoff_base_s,
            BACKOFF_BASE_S_DEFAULT,
        ),
        backoff_cap_s: f(
            errors,
            "dispatch.backoff_cap_s",
            raw.backoff_cap_s,
            BACKOFF_CAP_S_DEFAULT,
        ),
        throttle_alert_s: f(
            errors,
            "dispatch.throttle_alert_s",
            raw.throttle_alert_s,
            THROTTLE_ALERT_S_DEFAULT,
        ),
        breaker: Breaker {
            trip_after: pos_i(
                errors,
                "dispatch.breaker.trip_after",
                rb.trip_after,
                BREAKER_TRIP_AFTER_DEFAULT,
                1,
            ),
            cooldown_initial_s: f(
                errors,
                "dispatch.breaker.cooldown_initial_s",
                rb.cooldown_initial_s,
                BREAKER_COOLDOWN_INITIAL_S_DEFAULT,
            ),
            cooldown_max_s: f(
                errors,
                "dispatch.breaker.cooldown_max_s",
                rb.cooldown_max_s,
                BREAKER_COOLDOWN_MAX_S_DEFAULT,
            ),
        },
    }
}

/// `[coalesce]`: the window every route takes unless its source or span says otherwise.
pub fn coalesce(errors: &mut Vec<Problem>, raw: &RawWindow) -> Window {
    let w = window_fields(errors, "coalesce", raw);
    Window {
        quiet_s: w.quiet_s.unwrap_or(0.0),
        max_s: w.max_s.unwrap_or(0.0),
        max_events: w.max_events.unwrap_or(MAX_EVENTS_DEFAULT),
        max_bytes: w.max_bytes.unwrap_or(MAX_BYTES_DEFAULT),
    }
}

/// `[spans]`: the presets, each overridable, plus the file's own.
pub fn spans(
    errors: &mut Vec<Problem>,
    raw: &BTreeMap<String, raw::RawSpan>,
) -> BTreeMap<String, Span> {
    let mut spans: BTreeMap<String, Span> = SPAN_PRESETS
        .iter()
        .map(|(n, q, m)| {
            (
                n.to_string(),
                Span {
                    quiet_s: *q,
                    max_s: *m,
                },
            )
        })
        .collect();
    for (name, s) in raw {
        let base = spans.get(name).cloned();
        let quiet_s = s.quiet_s.or(base.as_ref().map(|b| b.quiet_s));
        let max_s = s.max_s.or(base.as_ref().map(|b| b.max_s));
        match (quiet_s, max_s) {
            (Some(q), Some(m)) if q >= 0.0 && m >= 0.0 => {
                spans.insert(name.clone(), Span { quiet_s: q, max_s: m });
            }
            _ => errors.push(problem(
                format!("spans.{name}"),
                format!("a span needs quiet_s and max_s >= 0; write {name} = {{ quiet_s = 30, max_s = 120 }}"),
            )),
        }
    }
    spans
}

/// `[retention]`.
pub fn retention(errors: &mut Vec<Problem>, raw: &raw::RawRetention) -> RetentionDays {
    let days = |errors: &mut Vec<Problem>, key: &str, v, d| pos_f(errors, key, v, d, 0.0);
    RetentionDays {
        delivered_days: days(
            errors,
            "retention.delivered_days",
            raw.delivered_days,
            RETENTION_DELIVERED_DAYS_DEFAULT,
        ),
        attempts_days: days(
            errors,
            "retention.attempts_days",
            raw.attempts_days,
            RETENTION_ATTEMPTS_DAYS_DEFAULT,
        ),
        dropped_days: days(
            errors,
            "retention.dropped_days",
            raw.dropped_days,
            RETENTION_DROPPED_DAYS_DEFAULT,
        ),
        issues_days: days(
            errors,
            "retention.issues_days",
            raw.issues_days,
            RETENTION_ISSUES_DAYS_DEFAULT,
        ),
    }
}

/// `[alerts]`.
pub fn alerts(errors: &mut Vec<Problem>, raw: &raw::RawAlerts) -> Alerts {
    let alerts = Alerts {
        argv: raw
            .argv
            .clone()
            .unwrap_or_else(|| ALERTS_ARGV_DEFAULT.map(String::from).to_vec()),
        dry: raw.dry.unwrap_or(false),
        rate_limit_s: pos_f(
            errors,
            "alerts.rate_limit_s",
            raw.rate_limit_s,
            ALERTS_RATE_LIMIT_S_DEFAULT,
            0.0,
        ),
        timeout_s: pos_f(
            errors,
            "alerts.timeout_s",
            raw.timeout_s,
            ALERTS_TIMEOUT_S_DEFAULT,
            0.0,
        ),
    };
    if alerts.argv.is_empty() {
        errors.push(problem(
            "alerts.argv",
            "needs a command; write argv = [\"logger\", \"-t\", \"hookspool\"]",
        ));
    }
    alerts
}

/// `[hermes]`: where the agent gateway listens and what its destinations default to.
pub fn hermes(errors: &mut Vec<Problem>, raw: &raw::RawHermes) -> Hermes {
    Hermes {
        base_url: raw
            .base_url
            .clone()
            .unwrap_or_else(|| HERMES_BASE_URL_DEFAULT.into()),
        subscriptions_path: expand_home(
            raw.subscriptions_path
                .as_deref()
                .unwrap_or(HERMES_SUBSCRIPTIONS_PATH_DEFAULT),
        ),
        timeout_s: pos_f(
            errors,
            "hermes.timeout_s",
            raw.timeout_s,
            HERMES_TIMEOUT_S_DEFAULT,
            0.0,
        ),
        max_body_bytes: pos_i(
            errors,
            "hermes.max_body_bytes",
            raw.max_body_bytes,
            MAX_BODY_BYTES_DEFAULT,
            1,
        ),
        legacy_signature: raw.legacy_signature.unwrap_or(true),
    }
}

/// `[limits]`: the free space the intake keeps.
pub fn min_free_bytes(errors: &mut Vec<Problem>, raw: &raw::RawLimits) -> i64 {
    pos_i(
        errors,
        "limits.min_free_bytes",
        raw.min_free_bytes,
        MIN_FREE_BYTES_DEFAULT,
        0,
    )
}
