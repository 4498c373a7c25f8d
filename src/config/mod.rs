//! Configuration (spec 15): the TOML file parsed into raw serde structs (`raw`), then
//! validated into a `Config` with every default filled ([`parse`] = [`parse_raw`] then
//! [`validate_raw`], so a later step on the raw tables, such as bobbin expansion, slots in
//! between). This is the one validation: `check` runs it strictly (unknown keys are
//! errors), the services at start and on every reload without (unknown keys are warnings
//! and are left out); whatever else it refuses, it refuses for all three. Every problem says
//! what to write instead and never quotes a value. Secrets stay references (`secret`);
//! values are resolved at use time.
//!
//! Owns path precedence, span presets, the source types' declared span and default action
//! (each source is built once here), the typed destination specs (`destination`), and the
//! one routing decision with its rules (`route`). Must not: do I/O beyond reading the
//! config file, resolve a secret, or open the spool.

pub mod backend;
pub mod destination;
mod expansion;
pub mod headers;
pub mod inject;
pub mod poll;
pub mod raw;
pub mod reference;
pub mod route;
mod sections;
mod syntax;

use std::collections::BTreeMap;
use std::path::PathBuf;

pub use crate::secret::{RefError, SecretRef, SecretRefs};
pub use crate::sources::SPAN_PRESETS;
use crate::store::Window;
pub use destination::{
    DestinationConfig, DestinationKind, DestinationSpec, HttpSpec, QUARANTINE, RateLimit,
};
pub use inject::{InjectError, Injected};
use raw::{RawConfig, RawRoute, RawSource, RawWindow};
pub use route::{Resolved, RouteQuery};
pub use sections::{GROUP_EVENTS_MAX_DEFAULT, GROUP_WAIT_MS_DEFAULT, THROTTLE_ALERT_S_DEFAULT};

/// The default spool home on a host (spec 2).
pub const DEFAULT_HOME: &str = "/var/lib/hookspool";
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8650";
/// A batch is bounded at 768 KiB by default (spec 5).
pub const MAX_BYTES_DEFAULT: i64 = 786_432;
pub const MAX_EVENTS_DEFAULT: i64 = 500;
pub const MAX_BODY_BYTES_DEFAULT: i64 = 1_048_576;
pub const DEDUP_WINDOW_S_DEFAULT: f64 = 86_400.0;
/// The tee limit (spec 14.1).
pub const TEE_ROUTES_MAX: usize = crate::store::TEE_COPIES_MAX;

/// One problem found in the config: where, and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The key path, e.g. `sources.github.span`.
    pub key: String,
    pub message: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.key, self.message)
    }
}

fn problem(key: impl Into<String>, message: impl Into<String>) -> Problem {
    Problem {
        key: key.into(),
        message: message.into(),
    }
}

/// A config that could not be used.
#[derive(Debug, thiserror::Error)]
#[error("{}: {}", file.display(), problems.iter().map(|p| p.to_string()).collect::<Vec<_>>().join("; "))]
pub struct ConfigError {
    pub file: PathBuf,
    pub problems: Vec<Problem>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Span {
    pub quiet_s: f64,
    pub max_s: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Intake {
    pub listen: Vec<String>,
    pub max_body_bytes: i64,
    pub busy_timeout_s: f64,
    /// Worker threads of the intake's runtime; `None`: one per CPU (tokio's default).
    pub threads: Option<usize>,
    pub allow_remote: bool,
    pub group_events_max: i64,
    pub group_wait_ms: f64,
    /// The writer's COMMIT does not sync; a second thread fdatasyncs the WAL and answers
    /// (issue 36, `intake::writer`). Off by default: slower on a CPU-bound host.
    pub pipelined_sync: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Breaker {
    pub trip_after: i64,
    pub cooldown_initial_s: f64,
    pub cooldown_max_s: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Dispatch {
    pub parallel: i64,
    pub poll_s: f64,
    pub heartbeat_s: f64,
    pub lease_grace_s: f64,
    pub max_attempts: i64,
    pub backoff_base_s: f64,
    pub backoff_cap_s: f64,
    /// A destination that has answered only throttles for this long opens a delivery issue.
    pub throttle_alert_s: f64,
    pub breaker: Breaker,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RetentionDays {
    pub delivered_days: f64,
    pub attempts_days: f64,
    pub dropped_days: f64,
    pub issues_days: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Alerts {
    pub argv: Vec<String>,
    pub dry: bool,
    pub rate_limit_s: f64,
    pub timeout_s: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Hermes {
    pub base_url: String,
    pub subscriptions_path: PathBuf,
    pub timeout_s: f64,
    pub max_body_bytes: i64,
    pub legacy_signature: bool,
}

/// The admin API's default address under `hookspool run` (the intake's is 8650).
pub const ADMIN_LISTEN_DEFAULT: &str = "127.0.0.1:8651";

/// The management API `hookspool run` serves in-process (issue 31); read at start only.
#[derive(Debug, Clone, PartialEq)]
pub struct Admin {
    /// The loopback address (`localhost:` already written as 127.0.0.1); `None`: off
    /// (`listen = ""`).
    pub listen: Option<std::net::SocketAddr>,
    /// Where the token is read; `None`: `run` generates one at start and prints it.
    pub token: Option<SecretRef>,
    /// A Unix socket to serve too (created mode 0660; its callers need no token and act
    /// as their uid); `None`: none.
    pub socket: Option<PathBuf>,
}

/// A source as configured. The source type's own keys stay in `options`.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceConfig {
    pub name: String,
    pub kind: String,
    pub secrets: BTreeMap<String, SecretRefs>,
    pub span: Option<String>,
    pub window: RawWindowFields,
    pub expect_every_s: f64,
    pub dedup_window_s: f64,
    pub max_body_bytes: i64,
    pub action: Option<String>,
    pub keep_headers: Vec<String>,
    pub store_raw: bool,
    /// The header a hermes destination without its own `event_header` sends the event type
    /// in (spec 6.4.1).
    pub event_header: Option<String>,
    /// The source type's own span preset (`burst` for github), used when `span` is unset.
    pub type_span: String,
    /// The source type's default destination (`hermes:github`), used when neither config's
    /// `action` nor the event names one.
    pub type_action: Option<String>,
    /// The type's own keys, as `sources::build` takes them (unknown ones already removed).
    pub options: toml::Table,
    /// A poll source's schedule (`type = "poll"`, spec 14.4): no plugin, no URL.
    pub poll: Option<poll::PollSchedule>,
}

impl SourceConfig {
    /// A poll source (spec 14.4): the intake serves no plugin for it.
    pub fn is_poll(&self) -> bool {
        self.poll.is_some()
    }

    /// Whether route matches see an `event_type` attr on this source's events, as the
    /// intake gives them: every built-in source sets one; the template source only what its
    /// `attrs` table declares. An injected event (`enqueue`, an emit) matches routes with
    /// the same attrs, so it takes the route the same event would take at the intake.
    pub fn event_type_is_attr(&self) -> bool {
        self.kind != "template"
            || self
                .options
                .get("attrs")
                .and_then(toml::Value::as_table)
                .is_some_and(|t| t.contains_key("event_type"))
    }
}

/// Window fields a route or source may set; `None` inherits.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct RawWindowFields {
    pub quiet_s: Option<f64>,
    pub max_s: Option<f64>,
    pub max_events: Option<i64>,
    pub max_bytes: Option<i64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RouteConfig {
    pub name: String,
    pub source: String,
    pub match_: BTreeMap<String, String>,
    pub destination: Option<String>,
    pub tee: bool,
    pub window: RawWindowFields,
}

/// The validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The file it came from, if any.
    pub file: Option<PathBuf>,
    pub home: PathBuf,
    pub db: PathBuf,
    /// `[spool] backend` and `url`: SQLite at `db` (the default) or PostgreSQL.
    pub backend: backend::Backend,
    pub store_raw: bool,
    pub bobbin_path: Vec<PathBuf>,
    pub intake: Intake,
    pub dispatch: Dispatch,
    pub coalesce: Window,
    pub min_free_bytes: i64,
    pub retention: RetentionDays,
    pub alerts: Alerts,
    pub hermes: Hermes,
    pub admin: Admin,
    pub telemetry: Telemetry,
    pub spans: BTreeMap<String, Span>,
    pub sources: BTreeMap<String, SourceConfig>,
    pub routes: Vec<RouteConfig>,
    pub destinations: BTreeMap<String, DestinationConfig>,
    /// The `[bobbins.*]` instances the file's sources, processor destinations and generated
    /// routes were expanded from (spec 14.3.3).
    pub bobbins: crate::bobbins::Instances,
}

/// Where the paths come from: CLI flags, then the environment (spec 15 precedence).
#[derive(Debug, Clone, Default)]
pub struct PathInputs {
    pub home_flag: Option<PathBuf>,
    pub config_flag: Option<PathBuf>,
    pub env_home: Option<PathBuf>,
    pub env_config: Option<PathBuf>,
    pub env_db: Option<PathBuf>,
}

impl PathInputs {
    pub fn from_env(home_flag: Option<PathBuf>, config_flag: Option<PathBuf>) -> PathInputs {
        let env = |k: &str| {
            std::env::var_os(k)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        PathInputs {
            home_flag,
            config_flag,
            env_home: env("HOOKSPOOL_HOME"),
            env_config: env("HOOKSPOOL_CONFIG"),
            env_db: env("HOOKSPOOL_DB"),
        }
    }

    /// The config file: flag, then HOOKSPOOL_CONFIG, then `<home>/config.toml` where home is
    /// the flag, HOOKSPOOL_HOME or the default. The bool says whether it was named
    /// explicitly (then it must exist).
    pub fn config_path(&self) -> (PathBuf, bool) {
        if let Some(p) = self.config_flag.as_ref().or(self.env_config.as_ref()) {
            return (p.clone(), true);
        }
        let home = self
            .home_flag
            .clone()
            .or_else(|| self.env_home.clone())
            .unwrap_or_else(|| PathBuf::from(DEFAULT_HOME));
        (home.join("config.toml"), false)
    }
}

/// Everything one validation of a file found, errors included: `check` reports every
/// error of a file in one run, so it also checks what the host holds for the parts of a
/// config with errors that did validate (issue 29).
#[derive(Debug, Clone, Default)]
pub struct Loaded {
    /// The config as far as it validated: every table with an error left out or at its
    /// default. `None` when the file could not be read, parsed or expanded.
    pub config: Option<Config>,
    /// The errors; the config is usable only when there are none.
    pub errors: Vec<Problem>,
    /// Unknown keys at runtime, and advice (`check` prints them).
    pub warnings: Vec<Problem>,
}

/// Load and validate the config. With `strict`, unknown keys are errors (`check`);
/// otherwise they are warnings. A config file that is absent and was not named explicitly
/// yields the defaults.
pub fn load(inputs: &PathInputs, strict: bool) -> Result<(Config, Vec<Problem>), ConfigError> {
    let (path, _) = inputs.config_path();
    let loaded = load_all(inputs, strict);
    match loaded.config {
        Some(config) if loaded.errors.is_empty() => Ok((config, loaded.warnings)),
        _ => Err(ConfigError {
            file: path,
            problems: loaded.errors,
        }),
    }
}

/// [`load`], keeping the config as far as it validated beside its errors.
pub fn load_all(inputs: &PathInputs, strict: bool) -> Loaded {
    let (path, explicit) = inputs.config_path();
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => Some(t),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !explicit => None,
        Err(e) => {
            return Loaded {
                errors: vec![problem(
                    "(file)",
                    format!(
                        "cannot read the config file: {e}; create it or point --config / HOOKSPOOL_CONFIG at an existing file"
                    ),
                )],
                ..Loaded::default()
            };
        }
    };
    let file = text.as_ref().map(|_| path.clone());
    let mut loaded = parse_all(text.as_deref().unwrap_or(""), file, inputs, strict);
    // What the host holds for the secrets: warned about by check, at start and on every
    // reload of both services (issue 28).
    if let Some(c) = &loaded.config {
        let found = secret_exposures(c);
        loaded
            .warnings
            .extend(found.into_iter().map(|(k, m)| problem(k, m)));
    }
    loaded
}

/// What is wrong with where the config's secret files are ([`secret::exposures`]).
pub fn secret_exposures(c: &Config) -> Vec<(String, String)> {
    crate::secret::exposures(&secret_files(c))
}

/// Every file a secret of the config is read from, by its config key: the sources' (and so
/// the bobbin instances') secrets, the http destinations' secret and secret_previous, and
/// the script destinations' env_file.
pub fn secret_files(c: &Config) -> Vec<(String, PathBuf)> {
    fn add(out: &mut Vec<(String, PathBuf)>, key: String, refs: &SecretRefs) {
        let many = matches!(refs, SecretRefs::Many(_));
        for (i, r) in refs.refs().into_iter().enumerate() {
            let k = if many {
                format!("{key}[{i}]")
            } else {
                key.clone()
            };
            match r {
                SecretRef::File { file } => out.push((k, file.clone())),
                SecretRef::EnvFile { env_file, .. } => out.push((k, env_file.clone())),
                SecretRef::Env { .. } => {}
            }
        }
    }
    let mut out = Vec::new();
    if let backend::Backend::Postgres { url } = &c.backend {
        add(&mut out, "spool.url".into(), &SecretRefs::One(url.clone()));
    }
    for (name, s) in &c.sources {
        for (k, refs) in &s.secrets {
            add(&mut out, format!("sources.{name}.secrets.{k}"), refs);
        }
    }
    for (name, d) in &c.destinations {
        let key = format!("destinations.\"{name}\"");
        match &d.spec {
            DestinationSpec::Http(h) => {
                add(&mut out, format!("{key}.secret"), &h.secret);
                if let Some(p) = &h.secret_previous {
                    add(&mut out, format!("{key}.secret_previous"), p);
                }
            }
            DestinationSpec::Script(sc) => {
                if let Some(f) = &sc.env_file {
                    out.push((format!("{key}.env_file"), f.clone()));
                }
            }
            DestinationSpec::Hermes(_) => {}
        }
    }
    out
}

/// The paths alone, for a command that reads the spool while the config has errors: the
/// file's [spool] table when the file parses that far, with the flags and environment over
/// it as always; every other setting is its default.
pub fn fallback(inputs: &PathInputs) -> Config {
    let (path, _) = inputs.config_path();
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    let spool = parse_raw(&text).map(|(r, _)| r.spool).unwrap_or_default();
    let raw = RawConfig {
        spool,
        ..RawConfig::default()
    };
    let (mut e, mut w, mut u) = (Vec::new(), Vec::new(), Vec::new());
    validate(raw, Some(path), inputs, &mut e, &mut w, &mut u)
}

/// Parse and validate config text: text -> [`RawConfig`] -> [`Config`]. Returns the config
/// and its warnings, or every error. This is the one validation: `check` calls it with
/// `strict` (unknown keys are errors), the services at start and on every reload without
/// (unknown keys are warnings); whatever else it refuses, it refuses for all of them.
///
/// The `[bobbins.*]` instances are expanded between the two steps, from the catalogue read
/// now (the built-ins, then each `spool.bobbin_path` root), so an edited bobbin takes effect
/// at the next load; a private bobbin that breaks a rule is an error at
/// `spool.bobbin_path`, and a problem in an expanded table is reported at the instance key
/// that produced it (`bobbins.<i>.<key>`).
pub fn parse(
    text: &str,
    file: Option<PathBuf>,
    inputs: &PathInputs,
    strict: bool,
) -> Result<(Config, Vec<Problem>), Vec<Problem>> {
    let loaded = parse_all(text, file, inputs, strict);
    match loaded.config {
        Some(config) if loaded.errors.is_empty() => Ok((config, loaded.warnings)),
        _ => Err(loaded.errors),
    }
}

/// [`parse`], keeping the config as far as it validated beside its errors.
fn parse_all(text: &str, file: Option<PathBuf>, inputs: &PathInputs, strict: bool) -> Loaded {
    let (raw, unknown) = match parse_raw(text) {
        Ok(parsed) => parsed,
        Err(errors) => {
            return Loaded {
                errors,
                ..Loaded::default()
            };
        }
    };
    let catalog = expansion::catalog_for(&raw);
    let problems = expansion::catalog_problems(&catalog);
    let mut loaded = parse_with_catalog_all(text, raw, unknown, file, inputs, strict, &catalog);
    loaded.errors.extend(problems);
    loaded
}

/// [`parse`] with a given catalogue, whose own problems are the caller's to report (the
/// conformance kit expands a bobbin directory that is not installed).
pub fn parse_with_catalog(
    text: &str,
    file: Option<PathBuf>,
    inputs: &PathInputs,
    strict: bool,
    catalog: &crate::bobbins::Catalog,
) -> Result<(Config, Vec<Problem>), Vec<Problem>> {
    let (raw, unknown) = parse_raw(text)?;
    let loaded = parse_with_catalog_all(text, raw, unknown, file, inputs, strict, catalog);
    match loaded.config {
        Some(config) if loaded.errors.is_empty() => Ok((config, loaded.warnings)),
        _ => Err(loaded.errors),
    }
}

fn parse_with_catalog_all(
    text: &str,
    raw: RawConfig,
    unknown: Vec<String>,
    file: Option<PathBuf>,
    inputs: &PathInputs,
    strict: bool,
    catalog: &crate::bobbins::Catalog,
) -> Loaded {
    let (raw, unknown, instances) = match expansion::expand(text, raw, unknown, inputs, catalog) {
        Ok(expanded) => expanded,
        Err(errors) => {
            return Loaded {
                errors,
                ..Loaded::default()
            };
        }
    };
    let at = |ps: Vec<Problem>| -> Vec<Problem> {
        ps.into_iter()
            .map(|p| expansion::at_instance_key(&instances, p))
            .collect()
    };
    let (mut config, errors, warnings) = validate_raw_all(raw, unknown, file, inputs, strict);
    let (errors, warnings) = (at(errors), at(warnings));
    config.bobbins = instances;
    Loaded {
        config: Some(config),
        errors,
        warnings,
    }
}

/// Text -> raw: TOML syntax and the shape of every known key. Unknown keys are returned by
/// path. An error names the line, the column and the key path, never the line's text (a
/// value on it could be a token).
pub fn parse_raw(text: &str) -> Result<(RawConfig, Vec<String>), Vec<Problem>> {
    let mut unknown = Vec::new();
    let de = toml::Deserializer::parse(text).map_err(|e| vec![syntax::problem(text, &e)])?;
    let raw: RawConfig = serde_ignored::deserialize(de, |path| unknown.push(path.to_string()))
        .map_err(|e| vec![syntax::problem(text, &e)])?;
    Ok((raw, unknown))
}

/// Raw -> validated [`Config`] (the step a bobbin expansion of the raw tables precedes).
pub fn validate_raw(
    raw: RawConfig,
    unknown: Vec<String>,
    file: Option<PathBuf>,
    inputs: &PathInputs,
    strict: bool,
) -> Result<(Config, Vec<Problem>), Vec<Problem>> {
    let (config, errors, warnings) = validate_raw_all(raw, unknown, file, inputs, strict);
    if errors.is_empty() {
        Ok((config, warnings))
    } else {
        Err(errors)
    }
}

/// [`validate_raw`]: the config as far as it validated, its errors and its warnings.
fn validate_raw_all(
    raw: RawConfig,
    unknown: Vec<String>,
    file: Option<PathBuf>,
    inputs: &PathInputs,
    strict: bool,
) -> (Config, Vec<Problem>, Vec<Problem>) {
    let mut errors = Vec::new();
    let mut warnings = Vec::new();
    let mut unknown: Vec<Problem> = unknown
        .into_iter()
        .map(|key| {
            let table = key.split('.').next().unwrap_or("").to_string();
            problem(
                key,
                format!(
                    "unknown key; remove it or check its spelling against the documented keys of [{table}]"
                ),
            )
        })
        .collect();
    let config = validate(raw, file, inputs, &mut errors, &mut warnings, &mut unknown);
    if strict {
        errors.extend(unknown);
    } else {
        warnings.extend(unknown);
    }
    (config, errors, warnings)
}

fn pos_f(errors: &mut Vec<Problem>, key: &str, v: Option<f64>, default: f64, min: f64) -> f64 {
    let v = v.unwrap_or(default);
    if v.is_nan() || v < min || !v.is_finite() {
        errors.push(problem(
            key,
            format!("must be a number >= {min}; write e.g. {key} = {default}"),
        ));
        return default;
    }
    v
}

fn pos_i(errors: &mut Vec<Problem>, key: &str, v: Option<i64>, default: i64, min: i64) -> i64 {
    let v = v.unwrap_or(default);
    if v < min {
        errors.push(problem(
            key,
            format!("must be an integer >= {min}; write e.g. {key} = {default}"),
        ));
        return default;
    }
    v
}

fn window_fields(errors: &mut Vec<Problem>, prefix: &str, w: &RawWindow) -> RawWindowFields {
    let mut check_f = |name: &str, v: Option<f64>| {
        if let Some(x) = v
            && (x.is_nan() || x < 0.0 || !x.is_finite())
        {
            errors.push(problem(
                format!("{prefix}.{name}"),
                "must be a number of seconds >= 0",
            ));
            return None;
        }
        v
    };
    let quiet_s = check_f("quiet_s", w.quiet_s);
    let max_s = check_f("max_s", w.max_s);
    let mut check_i = |name: &str, v: Option<i64>| {
        if let Some(x) = v
            && x < 1
        {
            errors.push(problem(
                format!("{prefix}.{name}"),
                "must be an integer >= 1",
            ));
            return None;
        }
        v
    };
    RawWindowFields {
        quiet_s,
        max_s,
        max_events: check_i("max_events", w.max_events),
        max_bytes: check_i("max_bytes", w.max_bytes),
    }
}

fn expand_home(p: &str) -> PathBuf {
    if let Some(rest) = p.strip_prefix("~/")
        && let Some(home) = std::env::var_os("HOME")
    {
        return PathBuf::from(home).join(rest);
    }
    PathBuf::from(p)
}

/// The spool home: flag -> env -> config -> default (spec 15).
fn resolve_home(inputs: &PathInputs, spool: &raw::RawSpool) -> PathBuf {
    inputs
        .home_flag
        .clone()
        .or_else(|| inputs.env_home.clone())
        .or_else(|| spool.home.as_deref().map(expand_home))
        .unwrap_or_else(|| PathBuf::from(DEFAULT_HOME))
}

fn validate(
    raw: RawConfig,
    file: Option<PathBuf>,
    inputs: &PathInputs,
    errors: &mut Vec<Problem>,
    warnings: &mut Vec<Problem>,
    unknown: &mut Vec<Problem>,
) -> Config {
    let home = resolve_home(inputs, &raw.spool);
    let db = sections::spool_db(inputs.env_db.as_ref(), &raw.spool, &home);
    let backend = backend::backend(errors, raw.spool.backend.as_deref(), raw.spool.url.as_ref());
    let intake = sections::intake(errors, &raw.intake);
    let dispatch = sections::dispatch(errors, &raw.dispatch);
    let coalesce = sections::coalesce(errors, &raw.coalesce);
    let spans = sections::spans(errors, &raw.spans);
    let retention = sections::retention(errors, &raw.retention);
    let alerts = sections::alerts(errors, &raw.alerts);
    let hermes = sections::hermes(errors, &raw.hermes);
    let admin = admin(errors, &raw.admin);
    let telemetry = telemetry(errors, &raw.telemetry);
    let store_raw = raw.spool.store_raw.unwrap_or(true);
    let mut sources = raw
        .sources
        .iter()
        .map(|(name, s)| {
            let mut sc = source(errors, &spans, name, s, store_raw, intake.max_body_bytes);
            if !sc.is_poll() {
                build_source(&mut sc, errors, unknown);
            }
            (name.clone(), sc)
        })
        .collect::<BTreeMap<_, _>>();
    let routes = routes(errors, &raw.routes, &sources);
    let destinations = raw
        .destinations
        .iter()
        .filter_map(|(name, d)| {
            destination::parse(errors, unknown, &hermes, name, d).map(|d| (name.clone(), d))
        })
        .collect();
    let min_free_bytes = sections::min_free_bytes(errors, &raw.limits);
    let bobbin_path = expansion::bobbin_path(&raw.spool);
    // A source that does not set max_body_bytes takes the smaller of the intake's cap and
    // its batch max_bytes, so the defaults (1 MiB body, 768 KiB batch) never contradict each
    // other; only an explicit value above max_bytes is an error (spec 5, 15).
    for s in sources.values_mut() {
        let w = route::window_of(&spans, &coalesce, s, None);
        if raw.sources[&s.name].max_body_bytes.is_none() {
            s.max_body_bytes = s.max_body_bytes.min(w.max_bytes);
        } else if s.max_body_bytes > w.max_bytes {
            errors.push(problem(
                format!("sources.{}.max_body_bytes", s.name),
                format!("{} exceeds the batch max_bytes {} (one event could overflow the document); lower max_body_bytes or raise max_bytes", s.max_body_bytes, w.max_bytes),
            ));
        }
        if s.dedup_window_s > retention.delivered_days * 86_400.0 {
            warnings.push(problem(
                format!("sources.{}.dedup_window_s", s.name),
                "longer than retention.delivered_days: a duplicate after the batch is pruned is still caught, but `show` can no longer display the original",
            ));
        }
    }
    let config = Config {
        file,
        home,
        db,
        backend,
        store_raw,
        bobbin_path,
        intake,
        dispatch,
        coalesce,
        min_free_bytes,
        retention,
        alerts,
        hermes,
        admin,
        telemetry,
        spans,
        sources,
        routes,
        destinations,
        bobbins: crate::bobbins::Instances::default(),
    };
    route::check_tees(&config, errors);
    route::check_feeds(&config, errors, warnings);
    config
}

/// Build the source once, as the intake will: its own keys are checked by its type (an
/// unknown one goes to `unknown` and is left out), and its type's span and default action
/// are recorded. An auth header or a credential header is never kept. (Its secrets are the environment's: `check`
/// resolves them, the intake reads them per request.)
fn build_source(sc: &mut SourceConfig, errors: &mut Vec<Problem>, unknown: &mut Vec<Problem>) {
    use crate::sources::SourceConfigError as E;
    let prefix = format!("sources.{}", sc.name);
    let built = loop {
        match crate::sources::build(&sc.name, &sc.kind, &sc.options) {
            Ok(src) => break src,
            Err(E::UnknownKey {
                kind,
                key,
                accepted,
            }) if sc.options.contains_key(&key) => {
                unknown.push(problem(
                    format!("{prefix}.{key}"),
                    format!(
                        "not a key of type \"{kind}\"; remove it (the keys it accepts: {accepted})"
                    ),
                ));
                sc.options.remove(&key);
            }
            // Already reported by `source` (the type is checked there).
            Err(E::UnknownKind { .. }) => return,
            Err(E::Invalid { key, message }) => {
                errors.push(problem(format!("{prefix}.{key}"), message));
                return;
            }
            Err(e) => {
                errors.push(problem(&prefix, e.to_string()));
                return;
            }
        }
    };
    sc.type_span = built.declared().span.to_string();
    sc.type_action = built.declared().action.clone();
    for h in &sc.keep_headers {
        if let Some(why) = headers::refused_keep_header(built.as_ref(), h) {
            errors.push(problem(format!("{prefix}.keep_headers"), why));
        }
    }
    // A template keeps the headers its selectors read; a credential among them would be
    // stored as the key, dedup id or attrs (and is dropped from the kept headers).
    for h in &built.declared().keep_headers {
        if headers::is_credential_header(h) {
            errors.push(problem(&prefix, headers::refused_selector_header(h)));
        }
    }
}

/// `127.0.0.1:PORT`, `[::1]:PORT`, `localhost:PORT` or `unix:/path`; anything else only
/// with `intake.allow_remote = true` (spec 10: the reverse proxy owns the network).
pub fn check_listen(l: &str, allow_remote: bool) -> Result<(), String> {
    if let Some(path) = l.strip_prefix("unix:") {
        if !path.starts_with('/') {
            return Err(format!(
                "unix socket path must be absolute; write listen = \"unix:/run/hookspool/intake.sock\" (got {l:?})"
            ));
        }
        return Ok(());
    }
    let addr: std::net::SocketAddr = l
        .replace("localhost:", "127.0.0.1:")
        .parse()
        .map_err(|_| format!("{l:?} is not an address; write listen = \"127.0.0.1:8650\" or \"unix:/run/hookspool/intake.sock\""))?;
    if !addr.ip().is_loopback() && !allow_remote {
        return Err(format!(
            "{l} is not a loopback address; hookspool belongs behind a reverse proxy on 127.0.0.1 — write listen = \"127.0.0.1:{}\", or set intake.allow_remote = true if you really mean it",
            addr.port()
        ));
    }
    Ok(())
}

/// Traces (issue 35), read at start only: `None` is off.
#[derive(Debug, Clone, PartialEq)]
pub struct Telemetry {
    /// The collector's OTLP/HTTP base (`http://127.0.0.1:4318`); spans go to
    /// `<otlp_endpoint>/v1/traces`.
    pub otlp_endpoint: Option<String>,
    /// Finished spans waiting for export at most; more are dropped and counted.
    pub queue_spans: usize,
}

/// The largest span queue `[telemetry] queue_spans` may ask for.
pub const QUEUE_SPANS_MAX: i64 = 1_000_000;

/// The `[telemetry]` table: `otlp_endpoint` an http(s) URL or "" (off, the default);
/// `queue_spans` 1 to [`QUEUE_SPANS_MAX`].
fn telemetry(errors: &mut Vec<Problem>, raw: &raw::RawTelemetry) -> Telemetry {
    let otlp_endpoint = match raw.otlp_endpoint.as_deref().map(str::trim) {
        None | Some("") => None,
        Some(e) => match url::Url::parse(e) {
            Ok(u)
                if matches!(u.scheme(), "http" | "https")
                    && u.host().is_some()
                    && u.query().is_none() =>
            {
                Some(e.to_string())
            }
            _ => {
                errors.push(problem(
                    "telemetry.otlp_endpoint",
                    "must be the collector's OTLP/HTTP address, e.g. otlp_endpoint = \"http://127.0.0.1:4318\" (spans go to /v1/traces under it), or \"\" for no traces",
                ));
                None
            }
        },
    };
    let queue_spans = match raw.queue_spans {
        None => crate::telemetry::QUEUE_SPANS_DEFAULT,
        Some(n) if (1..=QUEUE_SPANS_MAX).contains(&n) => n as usize,
        Some(_) => {
            errors.push(problem(
                "telemetry.queue_spans",
                format!("must be a whole number of spans from 1 to {QUEUE_SPANS_MAX}; write e.g. queue_spans = {}", crate::telemetry::QUEUE_SPANS_DEFAULT),
            ));
            crate::telemetry::QUEUE_SPANS_DEFAULT
        }
    };
    Telemetry {
        otlp_endpoint,
        queue_spans,
    }
}

/// The `[admin]` table: `listen` a loopback address or "" (off); `token` a secret
/// reference, resolved when the API starts; `socket` an absolute path.
fn admin(errors: &mut Vec<Problem>, raw: &raw::RawAdmin) -> Admin {
    let text = raw.listen.as_deref().unwrap_or(ADMIN_LISTEN_DEFAULT).trim();
    let listen = if text.is_empty() {
        None
    } else {
        match check_admin_listen(text) {
            Ok(a) => Some(a),
            Err(msg) => {
                errors.push(problem("admin.listen", msg));
                None
            }
        }
    };
    let socket = match raw.socket.as_deref().map(str::trim) {
        None | Some("") => None,
        Some(p) if p.starts_with('/') => Some(PathBuf::from(p)),
        Some(_) => {
            errors.push(problem(
                "admin.socket",
                "must be an absolute path; write socket = \"/run/hookspool/admin.sock\", or leave it out for no socket",
            ));
            None
        }
    };
    Admin {
        listen,
        token: raw.token.clone(),
        socket,
    }
}

/// An admin address: `127.0.0.1:PORT`, `[::1]:PORT` or `localhost:PORT` (port 0 picks a
/// free one). Never a wider address: the admin API has no proxy in front of it here.
pub fn check_admin_listen(l: &str) -> Result<std::net::SocketAddr, String> {
    let addr: std::net::SocketAddr = l
        .replace("localhost:", "127.0.0.1:")
        .parse()
        .map_err(|_| format!("{l:?} is not an address; write listen = \"{ADMIN_LISTEN_DEFAULT}\", or listen = \"\" to turn the admin API off"))?;
    if !addr.ip().is_loopback() {
        return Err(format!(
            "{l} is not a loopback address; the admin API listens on 127.0.0.1 or [::1] only (publish it behind a proxy with its own authentication): write listen = \"127.0.0.1:{}\", or \"\" to turn it off",
            addr.port()
        ));
    }
    Ok(addr)
}

fn source(
    errors: &mut Vec<Problem>,
    spans: &BTreeMap<String, Span>,
    name: &str,
    s: &RawSource,
    store_raw: bool,
    intake_max_body: i64,
) -> SourceConfig {
    let prefix = format!("sources.{name}");
    if !is_identifier(name) {
        errors.push(problem(
            &prefix,
            "source names are identifiers ([a-z0-9_-]); the URL is /hooks/<name>",
        ));
    }
    let poll = if s.kind.as_deref() == Some(poll::POLL_KIND) {
        Some(poll::schedule(errors, name, s))
    } else {
        poll::refuse_schedule_keys(errors, name, s);
        None
    };
    // A source named after a built-in type is that type unless it says otherwise.
    let kind = s.kind.clone().unwrap_or_else(|| {
        if crate::sources::KINDS.contains(&name) {
            name.to_string()
        } else {
            "template".to_string()
        }
    });
    if poll.is_none() && !crate::sources::KINDS.contains(&kind.as_str()) {
        errors.push(problem(
            format!("{prefix}.type"),
            format!(
                "unknown source type {kind:?}; write one of {}",
                crate::sources::KINDS.join(", ")
            ),
        ));
    }
    let type_dedup_window_s = crate::sources::default_dedup_window_s(&kind) as f64;
    if s.options.contains_key("module") {
        errors.push(problem(
            format!("{prefix}.module"),
            "code plugins are not supported in this build; use a built-in type (type = \"github\") or the template source (scheme, header, key, ...)",
        ));
    }
    if let Some(span) = &s.span
        && !spans.contains_key(span)
    {
        errors.push(problem(
            format!("{prefix}.span"),
            format!(
                "no span preset {span:?}; write one of {} or add it under [spans]",
                spans.keys().cloned().collect::<Vec<_>>().join(", ")
            ),
        ));
    }
    let keep_headers = s.keep_headers.clone().unwrap_or_default();
    if s.action.as_deref() == Some(QUARANTINE) {
        errors.push(problem(
            format!("{prefix}.action"),
            "quarantine is reserved for quarantined requests and never delivers; name a real destination",
        ));
    }
    if let Some(h) = &s.event_header
        && let Some(p) = crate::destinations::header_name_problem("event_header", h)
    {
        errors.push(problem(format!("{prefix}.event_header"), p));
    }
    let w = RawWindow {
        quiet_s: s.quiet_s,
        max_s: s.max_s,
        max_events: s.max_events,
        max_bytes: s.max_bytes,
    };
    SourceConfig {
        name: name.to_string(),
        kind,
        secrets: s.secrets.clone(),
        span: s.span.clone(),
        window: window_fields(errors, &prefix, &w),
        expect_every_s: pos_f(
            errors,
            &format!("{prefix}.expect_every_s"),
            s.expect_every_s,
            0.0,
            0.0,
        ),
        dedup_window_s: pos_f(
            errors,
            &format!("{prefix}.dedup_window_s"),
            s.dedup_window_s,
            // The type's own window (Plaid's bodies carry no id: 600 s) unless config sets one.
            type_dedup_window_s,
            0.0,
        ),
        max_body_bytes: pos_i(
            errors,
            &format!("{prefix}.max_body_bytes"),
            s.max_body_bytes,
            intake_max_body,
            1,
        ),
        action: s.action.clone(),
        keep_headers,
        store_raw: s.store_raw.unwrap_or(store_raw),
        event_header: s.event_header.clone(),
        // Filled in by `build_source` from the built type.
        type_span: "immediate".to_string(),
        type_action: None,
        // A poll source's stray keys were reported by `poll::schedule`.
        options: if poll.is_some() {
            toml::Table::new()
        } else {
            s.options.clone()
        },
        poll,
    }
}

fn is_identifier(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

fn routes(
    errors: &mut Vec<Problem>,
    raw: &[RawRoute],
    sources: &BTreeMap<String, SourceConfig>,
) -> Vec<RouteConfig> {
    let mut out: Vec<RouteConfig> = Vec::new();
    for (i, r) in raw.iter().enumerate() {
        let prefix = format!("routes[{i}]");
        let Some(name) = r.name.clone() else {
            errors.push(problem(
                format!("{prefix}.name"),
                "every route needs a name; write name = \"<source>-<purpose>\"",
            ));
            continue;
        };
        let Some(source) = r.source.clone() else {
            errors.push(problem(
                format!("{prefix}.source"),
                format!("route {name} needs a source; write source = \"<a [sources.*] name>\""),
            ));
            continue;
        };
        if !sources.contains_key(&source) {
            errors.push(problem(
                format!("{prefix}.source"),
                format!("no source {source:?}; add [sources.{source}] or fix the name"),
            ));
        }
        if name.contains(route::INJECTED_ROUTE_SEPARATOR) {
            errors.push(problem(
                format!("{prefix}.name"),
                format!("route name {name:?} contains '{}', which names the routes of injected events (<source>><destination>); use letters, digits, '-' and '_'", route::INJECTED_ROUTE_SEPARATOR),
            ));
        }
        if out.iter().any(|o| o.name == name) || sources.contains_key(&name) && source != name {
            errors.push(problem(format!("{prefix}.name"), format!("route name {name:?} is taken (by another route or a source's implicit route); choose another")));
        }
        if r.tee && r.destination.is_none() {
            errors.push(problem(
                format!("{prefix}.destination"),
                "a tee route needs its own destination; write destination = \"http:audit\"",
            ));
        }
        if let Some(d) = &r.destination
            && d == QUARANTINE
        {
            errors.push(problem(
                format!("{prefix}.destination"),
                "quarantine is reserved and never delivers; name a real destination",
            ));
        }
        let w = RawWindow {
            quiet_s: r.quiet_s,
            max_s: r.max_s,
            max_events: r.max_events,
            max_bytes: r.max_bytes,
        };
        out.push(RouteConfig {
            name,
            source,
            match_: r.match_.clone(),
            destination: r.destination.clone(),
            tee: r.tee,
            window: window_fields(errors, &prefix, &w),
        });
    }
    out
}

impl Config {
    /// Retention settings for the store, with each source's dedup window.
    pub fn retention(&self) -> crate::store::Retention {
        crate::store::Retention {
            delivered_days: self.retention.delivered_days,
            attempts_days: self.retention.attempts_days,
            dropped_days: self.retention.dropped_days,
            issues_days: self.retention.issues_days,
            dedup_windows: self
                .sources
                .values()
                .map(|s| (s.name.clone(), s.dedup_window_s))
                .collect(),
            default_dedup_window_s: DEDUP_WINDOW_S_DEFAULT,
        }
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod expansion_tests;
