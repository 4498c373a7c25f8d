//! A destination's config, parsed once (spec 14.2): `[destinations.<name>]` tables and the
//! implicit `hermes:<route>` destinations become a typed [`DestinationSpec`] that
//! `hookspool check`, the dispatcher's registry and the sandbox self-test all take as it is.
//!
//! Owns: the keys each destination type accepts, the merge of `[hermes]` into a hermes
//! destination, the http secret references, and every problem the table alone can show
//! (the types' own `problems()`). Must not: read a secret, the subscriptions file or any
//! other file (check does that), or build a client (the registry does).

use super::raw::RawDestination;
use super::{Hermes, Problem, SecretRefs, problem};
use crate::destinations::script::ScriptConfig;
use crate::destinations::{HermesConfig, HttpConfig};

/// The reserved destination name: a quarantine batch's, never delivered (spec 9, 14.2).
pub const QUARANTINE: &str = "quarantine";

/// Keys each destination type accepts besides the common ones (type, max_inflight,
/// max_per_s, burst, timeout_s, max_body_bytes).
pub const HTTP_KEYS: &[&str] = &[
    "url",
    "secret",
    "secret_previous",
    "headers",
    "allow_insecure",
    "allow_private",
    "unwrap",
    "event_header",
    "dedup_header",
];
pub const HERMES_KEYS: &[&str] = &[
    "profile",
    "base_url",
    "subscriptions_path",
    "legacy_signature",
    "allow_private",
    "unwrap",
    "event_header",
    "dedup_header",
];
pub const SCRIPT_KEYS: &[&str] = &[
    "argv",
    "processor",
    "cwd",
    "env_file",
    "env",
    "state_dir",
    "sandbox",
];

/// Per-type defaults (spec 14.2).
pub const HTTP_MAX_INFLIGHT_DEFAULT: i64 = 4;
pub const HERMES_MAX_INFLIGHT_DEFAULT: i64 = 2;
pub const SCRIPT_MAX_INFLIGHT_DEFAULT: i64 = 1;
pub use crate::destinations::http::HTTP_TIMEOUT_S_DEFAULT;
pub use crate::destinations::script::SCRIPT_TIMEOUT_S_DEFAULT;
/// Bounds of a destination's request rate (issue 35): more than this many starts a second,
/// or a burst above it, is no limit a receiver needs from a single dispatcher.
pub const MAX_PER_S_MAX: f64 = 100_000.0;
pub const BURST_MAX: i64 = 100_000;

/// A destination's request rate (`max_per_s`, `burst`): at most `burst` attempts start back
/// to back, then at most `max_per_s` a second (a token bucket in the dispatcher,
/// `dispatch::rate`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    /// > 0 and <= [`MAX_PER_S_MAX`].
    pub max_per_s: f64,
    /// >= 1 and <= [`BURST_MAX`].
    pub burst: u32,
}

impl RateLimit {
    /// `burst` when absent: one second's worth of tokens, at least one.
    pub fn default_burst(max_per_s: f64) -> u32 {
        // max_per_s <= MAX_PER_S_MAX, so the ceiling fits a u32.
        max_per_s.ceil().clamp(1.0, MAX_PER_S_MAX) as u32
    }
}

/// The destination types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DestinationKind {
    Http,
    Hermes,
    Script,
}

impl DestinationKind {
    pub fn as_str(self) -> &'static str {
        match self {
            DestinationKind::Http => "http",
            DestinationKind::Hermes => "hermes",
            DestinationKind::Script => "script",
        }
    }

    fn parse(s: &str) -> Option<DestinationKind> {
        match s {
            "http" => Some(DestinationKind::Http),
            "hermes" => Some(DestinationKind::Hermes),
            "script" => Some(DestinationKind::Script),
            _ => None,
        }
    }

    /// The type a name implies: `hermes:<route>`, `script:<name>`.
    pub fn implied_by(name: &str) -> Option<DestinationKind> {
        if name.starts_with("hermes:") {
            Some(DestinationKind::Hermes)
        } else if name.starts_with("script:") {
            Some(DestinationKind::Script)
        } else {
            None
        }
    }

    fn keys(self) -> &'static [&'static str] {
        match self {
            DestinationKind::Http => HTTP_KEYS,
            DestinationKind::Hermes => HERMES_KEYS,
            DestinationKind::Script => SCRIPT_KEYS,
        }
    }
}

/// An http destination: the wire config and its secret references (resolved per attempt).
#[derive(Debug, Clone, PartialEq)]
pub struct HttpSpec {
    pub http: HttpConfig,
    pub secret: SecretRefs,
    pub secret_previous: Option<SecretRefs>,
}

/// What a destination is, typed.
#[derive(Debug, Clone, PartialEq)]
pub enum DestinationSpec {
    Http(HttpSpec),
    /// `[hermes]` merged with the table's overrides; the Hermes route is the name's tail.
    Hermes(HermesConfig),
    Script(ScriptConfig),
}

#[derive(Debug, Clone, PartialEq)]
pub struct DestinationConfig {
    pub name: String,
    pub max_inflight: i64,
    /// The request rate; `None`: no limit (the default).
    pub rate: Option<RateLimit>,
    pub timeout_s: f64,
    pub spec: DestinationSpec,
}

impl DestinationConfig {
    pub fn kind(&self) -> DestinationKind {
        match self.spec {
            DestinationSpec::Http(_) => DestinationKind::Http,
            DestinationSpec::Hermes(_) => DestinationKind::Hermes,
            DestinationSpec::Script(_) => DestinationKind::Script,
        }
    }

    /// What one request body may weigh at the receiver; `None` for a script (stdin has no
    /// such limit).
    pub fn max_body_bytes(&self) -> Option<u64> {
        match &self.spec {
            DestinationSpec::Http(h) => Some(h.http.max_body_bytes),
            DestinationSpec::Hermes(h) => Some(h.max_body_bytes),
            DestinationSpec::Script(_) => None,
        }
    }

    /// One request per event (spec 6.4.1): the body bound applies per event, not to the
    /// document.
    pub fn unwrap(&self) -> bool {
        match &self.spec {
            DestinationSpec::Http(h) => h.http.unwrap,
            DestinationSpec::Hermes(h) => h.unwrap,
            DestinationSpec::Script(_) => false,
        }
    }

    /// The Hermes route of a hermes destination.
    pub fn hermes_route(&self) -> Option<&str> {
        match self.spec {
            DestinationSpec::Hermes(_) => {
                Some(self.name.strip_prefix("hermes:").unwrap_or(&self.name))
            }
            _ => None,
        }
    }
}

/// `[hermes]` as a hermes destination's base.
pub fn hermes_base(h: &Hermes) -> HermesConfig {
    HermesConfig {
        base_url: h.base_url.clone(),
        subscriptions_path: h.subscriptions_path.clone(),
        timeout_s: h.timeout_s,
        max_body_bytes: h.max_body_bytes.max(0) as u64,
        legacy_signature: h.legacy_signature,
        ..HermesConfig::default()
    }
}

/// `hermes:<route>` without a table: the `[hermes]` defaults (spec 14.2).
pub fn implicit_hermes(h: &Hermes, name: &str) -> Option<DestinationConfig> {
    name.strip_prefix("hermes:")?;
    Some(DestinationConfig {
        name: name.to_string(),
        max_inflight: HERMES_MAX_INFLIGHT_DEFAULT,
        rate: None,
        timeout_s: h.timeout_s,
        spec: DestinationSpec::Hermes(hermes_base(h)),
    })
}

/// Parse one `[destinations.<name>]` table. Unknown keys go to `unknown` (errors in check,
/// warnings at runtime: the caller decides) and are left out; every other problem is an
/// error. `None` when the table cannot be used at all.
pub fn parse(
    errors: &mut Vec<Problem>,
    unknown: &mut Vec<Problem>,
    hermes: &Hermes,
    name: &str,
    d: &RawDestination,
) -> Option<DestinationConfig> {
    let prefix = format!("destinations.\"{name}\"");
    if name == QUARANTINE {
        errors.push(problem(
            &prefix,
            "quarantine is reserved for quarantined requests and never delivers; name the destination otherwise",
        ));
        return None;
    }
    let implied = DestinationKind::implied_by(name);
    let kind = match (d.kind.as_deref(), implied) {
        (Some(k), Some(i)) if k != i.as_str() => {
            errors.push(problem(
                format!("{prefix}.type"),
                format!(
                    "the name says {} but type = {k:?}; remove type or rename the destination",
                    i.as_str()
                ),
            ));
            return None;
        }
        (Some(k), _) => match DestinationKind::parse(k) {
            Some(k) => k,
            None => {
                errors.push(problem(
                    format!("{prefix}.type"),
                    format!(
                        "unknown destination type {k:?}; write \"http\", \"hermes\" or \"script\""
                    ),
                ));
                return None;
            }
        },
        (None, Some(i)) => i,
        (None, None) => {
            errors.push(problem(
                format!("{prefix}.type"),
                "write type = \"http\" (or name the destination hermes:<route> / script:<name>)",
            ));
            return None;
        }
    };
    let mut options = d.options.clone();
    options.retain(|key, _| {
        let known = kind.keys().contains(&key);
        if !known {
            unknown.push(problem(
                format!("{prefix}.{key}"),
                format!(
                    "not a key of a {} destination; remove it or use one of: {}",
                    kind.as_str(),
                    kind.keys().join(", ")
                ),
            ));
        }
        known
    });
    let (inflight, timeout) = match kind {
        DestinationKind::Http => (HTTP_MAX_INFLIGHT_DEFAULT, HTTP_TIMEOUT_S_DEFAULT),
        DestinationKind::Hermes => (HERMES_MAX_INFLIGHT_DEFAULT, hermes.timeout_s),
        DestinationKind::Script => (SCRIPT_MAX_INFLIGHT_DEFAULT, SCRIPT_TIMEOUT_S_DEFAULT),
    };
    let max_inflight = super::pos_i(
        errors,
        &format!("{prefix}.max_inflight"),
        d.max_inflight,
        inflight,
        1,
    );
    let rate = rate(errors, &prefix, d.max_per_s, d.burst);
    let timeout_s = super::pos_f(
        errors,
        &format!("{prefix}.timeout_s"),
        d.timeout_s,
        timeout,
        0.1,
    );
    if let Some(b) = d.max_body_bytes
        && b < 1
    {
        errors.push(problem(
            format!("{prefix}.max_body_bytes"),
            "must be an integer >= 1 (the receiver's body limit in bytes)",
        ));
        return None;
    }
    let body = d.max_body_bytes.map(|b| b as u64);
    if kind == DestinationKind::Script && body.is_some() {
        // A script reads its document on stdin: there is no receiver limit to respect.
        unknown.push(problem(
            format!("{prefix}.max_body_bytes"),
            "a script destination has no body limit (it reads the document on stdin); remove max_body_bytes",
        ));
    }
    let mut fail = |key: &str, message: String| errors.push(problem(key, message));
    let spec = match kind {
        DestinationKind::Http => http(&prefix, options, timeout_s, body, &mut fail)?,
        DestinationKind::Hermes => {
            // [hermes] first, then the table's own keys over it.
            let mut merged = toml::Table::new();
            merged.insert("base_url".into(), hermes.base_url.clone().into());
            merged.insert(
                "subscriptions_path".into(),
                hermes.subscriptions_path.display().to_string().into(),
            );
            merged.insert("timeout_s".into(), toml::Value::Float(timeout_s));
            let b = body.unwrap_or(hermes.max_body_bytes.max(0) as u64);
            merged.insert("max_body_bytes".into(), toml::Value::Integer(b as i64));
            merged.insert(
                "legacy_signature".into(),
                toml::Value::Boolean(hermes.legacy_signature),
            );
            merged.extend(options);
            match toml::Value::Table(merged).try_into::<HermesConfig>() {
                Ok(h) => {
                    for p in h.problems() {
                        fail(&prefix, p);
                    }
                    DestinationSpec::Hermes(h)
                }
                Err(e) => {
                    fail(&prefix, e.message().to_string());
                    return None;
                }
            }
        }
        DestinationKind::Script => {
            if !options.contains_key("argv") && !options.contains_key("processor") {
                fail(
                    &format!("{prefix}.argv"),
                    "a script destination needs argv = [\"/path/to/script\", ...]".into(),
                );
                return None;
            }
            match ScriptConfig::from_options(&options, timeout_s) {
                Ok(s) => {
                    for p in s.problems() {
                        fail(&prefix, p);
                    }
                    DestinationSpec::Script(s)
                }
                Err(e) => {
                    fail(&prefix, e);
                    return None;
                }
            }
        }
    };
    Some(DestinationConfig {
        name: name.to_string(),
        max_inflight,
        rate,
        timeout_s,
        spec,
    })
}

/// `max_per_s` and `burst`: absent is no limit; a wrong value is an error that names the key
/// and says what to write (and the table is still parsed, so every problem is reported).
fn rate(
    errors: &mut Vec<Problem>,
    prefix: &str,
    max_per_s: Option<f64>,
    burst: Option<i64>,
) -> Option<RateLimit> {
    let Some(max_per_s) = max_per_s else {
        if burst.is_some() {
            errors.push(problem(
                format!("{prefix}.burst"),
                "burst shapes a rate limit, and this destination has none; write max_per_s = <requests a second> beside it, or remove burst",
            ));
        }
        return None;
    };
    if !(max_per_s > 0.0 && max_per_s <= MAX_PER_S_MAX) {
        errors.push(problem(
            format!("{prefix}.max_per_s"),
            format!(
                "must be a number of requests a second > 0 and <= {MAX_PER_S_MAX}; write e.g. max_per_s = 5 (0.5 is one request every 2 s), or remove it for no limit"
            ),
        ));
        return None;
    }
    let default = RateLimit::default_burst(max_per_s);
    let burst = match burst {
        None => default,
        Some(b) if (1..=BURST_MAX).contains(&b) => b as u32,
        Some(_) => {
            errors.push(problem(
                format!("{prefix}.burst"),
                format!(
                    "must be a whole number of requests >= 1 and <= {BURST_MAX} (how many may start back to back); write e.g. burst = {default}, or remove it for that default"
                ),
            ));
            return None;
        }
    };
    Some(RateLimit { max_per_s, burst })
}

fn http(
    prefix: &str,
    mut options: toml::Table,
    timeout_s: f64,
    body: Option<u64>,
    fail: &mut impl FnMut(&str, String),
) -> Option<DestinationSpec> {
    let refs = |options: &mut toml::Table, key: &str, fail: &mut dyn FnMut(&str, String)| {
        let v = options.remove(key)?;
        match v.try_into::<SecretRefs>() {
            Ok(r) => Some(r),
            Err(_) => {
                fail(
                    &format!("{prefix}.{key}"),
                    "not a secret reference; write { file = \"/etc/hookspool/secrets/<name>\" } (make one with `hookspool secret new <file>`), { env = \"NAME\" } or { env_file = \"...\", key = \"NAME\" }".into(),
                );
                None
            }
        }
    };
    let had_secret = options.contains_key("secret");
    let secret = refs(&mut options, "secret", fail);
    let secret_previous = refs(&mut options, "secret_previous", fail);
    if !options.contains_key("url") {
        fail(
            &format!("{prefix}.url"),
            "an http destination needs url = \"https://...\"".into(),
        );
        return None;
    }
    options.insert("timeout_s".into(), toml::Value::Float(timeout_s));
    if let Some(b) = body {
        options.insert("max_body_bytes".into(), toml::Value::Integer(b as i64));
    }
    let http = match toml::Value::Table(options).try_into::<HttpConfig>() {
        Ok(h) => h,
        Err(e) => {
            fail(prefix, e.message().to_string());
            return None;
        }
    };
    for p in http.problems() {
        fail(prefix, p);
    }
    let Some(secret) = secret else {
        if !had_secret {
            fail(
                &format!("{prefix}.secret"),
                "an http destination signs every delivery (Standard Webhooks); make a secret with `hookspool secret new /etc/hookspool/secrets/<name>` and write secret = { file = \"/etc/hookspool/secrets/<name>\" }".into(),
            );
        }
        return None;
    };
    Some(DestinationSpec::Http(HttpSpec {
        http,
        secret,
        secret_previous,
    }))
}
