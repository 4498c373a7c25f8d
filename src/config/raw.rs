//! The config file as written (spec 15): serde structs with every field optional, so that
//! defaults are filled in one place (`super::validate`). Unknown keys are collected by
//! serde_ignored with their full path; source- and destination-type-specific keys are kept
//! in `options` tables and checked by their owners.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::secret::SecretRefs;

#[derive(Debug, Default, Deserialize)]
pub struct RawConfig {
    #[serde(default)]
    pub spool: RawSpool,
    #[serde(default)]
    pub intake: RawIntake,
    #[serde(default)]
    pub dispatch: RawDispatch,
    #[serde(default)]
    pub coalesce: RawWindow,
    #[serde(default)]
    pub limits: RawLimits,
    #[serde(default)]
    pub retention: RawRetention,
    #[serde(default)]
    pub alerts: RawAlerts,
    #[serde(default)]
    pub hermes: RawHermes,
    #[serde(default)]
    pub admin: RawAdmin,
    #[serde(default)]
    pub telemetry: RawTelemetry,
    #[serde(default)]
    pub spans: BTreeMap<String, RawSpan>,
    #[serde(default)]
    pub sources: BTreeMap<String, RawSource>,
    #[serde(default)]
    pub routes: Vec<RawRoute>,
    #[serde(default)]
    pub destinations: BTreeMap<String, RawDestination>,
    #[serde(default)]
    pub bobbins: BTreeMap<String, toml::Table>,
}

#[derive(Debug, Default, Deserialize)]
pub struct RawSpool {
    pub home: Option<String>,
    pub db: Option<String>,
    pub backend: Option<String>,
    /// Kept as TOML so a URL written inline (it may hold a password) is refused without
    /// being parsed into, or echoed by, any error (`super::backend`).
    pub url: Option<toml::Value>,
    pub store_raw: Option<bool>,
    pub bobbin_path: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
pub struct RawIntake {
    pub listen: Option<ListenSpec>,
    pub max_body_bytes: Option<i64>,
    pub busy_timeout_s: Option<f64>,
    pub threads: Option<i64>,
    pub allow_remote: Option<bool>,
    pub group_events_max: Option<i64>,
    pub group_wait_ms: Option<f64>,
    pub pipelined_sync: Option<bool>,
}

/// One address or several (`listen = ["127.0.0.1:8650", "unix:/run/hookspool/intake.sock"]`).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum ListenSpec {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Default, Deserialize)]
pub struct RawDispatch {
    pub parallel: Option<i64>,
    pub poll_s: Option<f64>,
    pub heartbeat_s: Option<f64>,
    pub lease_grace_s: Option<f64>,
    pub max_attempts: Option<i64>,
    pub backoff_base_s: Option<f64>,
    pub backoff_cap_s: Option<f64>,
    pub throttle_alert_s: Option<f64>,
    pub breaker: Option<RawBreaker>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct RawBreaker {
    pub trip_after: Option<i64>,
    pub cooldown_initial_s: Option<f64>,
    pub cooldown_max_s: Option<f64>,
}

#[derive(Debug, Default, Clone, Deserialize)]
pub struct RawWindow {
    pub quiet_s: Option<f64>,
    pub max_s: Option<f64>,
    pub max_events: Option<i64>,
    pub max_bytes: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
pub struct RawLimits {
    pub min_free_bytes: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
pub struct RawRetention {
    pub delivered_days: Option<f64>,
    pub attempts_days: Option<f64>,
    pub dropped_days: Option<f64>,
    pub issues_days: Option<f64>,
}

#[derive(Debug, Default, Deserialize)]
pub struct RawAlerts {
    pub argv: Option<Vec<String>>,
    pub dry: Option<bool>,
    pub rate_limit_s: Option<f64>,
    pub timeout_s: Option<f64>,
}

#[derive(Debug, Default, Deserialize)]
pub struct RawHermes {
    pub base_url: Option<String>,
    pub subscriptions_path: Option<String>,
    pub timeout_s: Option<f64>,
    pub max_body_bytes: Option<i64>,
    pub legacy_signature: Option<bool>,
}

/// OpenTelemetry traces (issue 35): off unless `otlp_endpoint` names a collector.
#[derive(Debug, Default, Deserialize)]
pub struct RawTelemetry {
    pub otlp_endpoint: Option<String>,
    pub queue_spans: Option<i64>,
}

/// The management API `hookspool run` serves in-process (issue 31).
#[derive(Debug, Default, Deserialize)]
pub struct RawAdmin {
    /// A loopback address; "" turns it off.
    pub listen: Option<String>,
    /// A secret reference; none: `run` generates a token at start.
    pub token: Option<crate::secret::SecretRef>,
    /// An absolute path for a Unix socket (mode 0660, no token); none or "": no socket.
    pub socket: Option<String>,
}

#[derive(Debug, Default, Clone, Deserialize)]
pub struct RawSpan {
    pub quiet_s: Option<f64>,
    pub max_s: Option<f64>,
}

#[derive(Debug, Default, Clone, Deserialize)]
pub struct RawSource {
    #[serde(rename = "type")]
    pub kind: Option<String>,
    #[serde(default)]
    pub secrets: BTreeMap<String, SecretRefs>,
    pub span: Option<String>,
    pub quiet_s: Option<f64>,
    pub max_s: Option<f64>,
    pub max_events: Option<i64>,
    pub max_bytes: Option<i64>,
    pub expect_every_s: Option<f64>,
    pub dedup_window_s: Option<f64>,
    pub max_body_bytes: Option<i64>,
    pub action: Option<String>,
    pub keep_headers: Option<Vec<String>>,
    pub store_raw: Option<bool>,
    /// The header a hermes destination without its own falls back to (spec 6.4.1).
    pub event_header: Option<String>,
    /// A poll source's schedule (spec 14.4; `type = "poll"` only).
    pub every_s: Option<i64>,
    pub jitter_s: Option<i64>,
    /// Everything else belongs to the source type (template keys, trello's callback_url,
    /// plaid's env, ...) and is checked by `sources::build`.
    #[serde(flatten)]
    pub options: toml::Table,
}

#[derive(Debug, Default, Clone, Deserialize)]
pub struct RawRoute {
    pub name: Option<String>,
    pub source: Option<String>,
    #[serde(rename = "match", default)]
    pub match_: BTreeMap<String, String>,
    pub destination: Option<String>,
    #[serde(default)]
    pub tee: bool,
    pub quiet_s: Option<f64>,
    pub max_s: Option<f64>,
    pub max_events: Option<i64>,
    pub max_bytes: Option<i64>,
}

#[derive(Debug, Default, Clone, Deserialize)]
pub struct RawDestination {
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub max_inflight: Option<i64>,
    /// The request rate (issue 35): a number > 0; `burst` a whole number >= 1.
    pub max_per_s: Option<f64>,
    pub burst: Option<i64>,
    pub timeout_s: Option<f64>,
    pub max_body_bytes: Option<i64>,
    /// Type-specific keys (url, secret, argv, ...), checked per type.
    #[serde(flatten)]
    pub options: toml::Table,
}
