//! Destinations built from config, once per config load: each name maps to a ready client
//! (http, hermes) or script runner, or to the reason it cannot be used (which the
//! dispatcher reports as a `config` outcome, never a panic). `hermes:<route>` without a
//! table is an implicit hermes destination with the [hermes] defaults (spec 14.2).

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::config::{Config, DestinationConfig, SecretRefs};
use crate::destinations::script::{ScriptConfig, ScriptDestination};
use crate::destinations::{HermesConfig, HermesDestination, HttpConfig, HttpDestination, TlsRoots};

pub enum Target {
    Http(HttpDestination),
    Hermes(HermesDestination),
    Script(ScriptDestination),
    /// Configured but unusable: the text says why (safe to log).
    Broken(String),
}

pub struct Built {
    pub name: String,
    pub max_inflight: usize,
    pub timeout_s: f64,
    pub target: Target,
}

impl Built {
    /// How this destination names its deliveries (spec 6.4), as its type decides.
    pub fn idempotency(&self) -> crate::destinations::Idempotency {
        match &self.target {
            Target::Http(h) => h.idempotency(),
            Target::Hermes(h) => h.idempotency(),
            Target::Script(_) | Target::Broken(_) => crate::destinations::Idempotency::PerBatch,
        }
    }
}

#[derive(Default)]
pub struct Registry {
    built: BTreeMap<String, Arc<Built>>,
    hermes: Option<HermesConfig>,
}

fn hermes_base(cfg: &Config) -> HermesConfig {
    HermesConfig {
        base_url: cfg.hermes.base_url.clone(),
        subscriptions_path: cfg.hermes.subscriptions_path.clone(),
        timeout_s: cfg.hermes.timeout_s,
        max_body_bytes: cfg.hermes.max_body_bytes as u64,
        legacy_signature: cfg.hermes.legacy_signature,
        ..HermesConfig::default()
    }
}

/// Secret candidates for an http destination, read at each attempt: `secret` first, then
/// `secret_previous` (rotation).
fn http_secrets(
    d: &DestinationConfig,
) -> Result<Arc<dyn crate::destinations::SecretSource>, String> {
    let parse = |key: &str| -> Result<Option<SecretRefs>, String> {
        match d.options.get(key) {
            None => Ok(None),
            Some(v) => v
                .clone()
                .try_into()
                .map(Some)
                .map_err(|_| format!("{key} must be {{ file = \"...\" }}, {{ env = \"...\" }} or {{ env_file = \"...\", key = \"...\" }}")),
        }
    };
    let current = parse("secret")?
        .ok_or_else(|| "an http destination needs secret = { file = \"...\" }".to_string())?;
    let previous = parse("secret_previous")?;
    Ok(Arc::new(move || -> Result<Vec<Vec<u8>>, String> {
        let mut out = Vec::new();
        for r in current
            .refs()
            .into_iter()
            .chain(previous.iter().flat_map(|p| p.refs()))
        {
            out.push(r.resolve().map_err(|e| e.to_string())?);
        }
        Ok(out)
    }))
}

fn build_one(cfg: &Config, d: &DestinationConfig) -> Target {
    let mut options = d.options.clone();
    match d.kind.as_str() {
        "http" => {
            options.remove("secret");
            options.remove("secret_previous");
            options.insert("timeout_s".into(), toml::Value::Float(d.timeout_s));
            if let Some(b) = d.max_body_bytes {
                options.insert("max_body_bytes".into(), toml::Value::Integer(b));
            }
            let hc: HttpConfig = match toml::Value::Table(options).try_into() {
                Ok(c) => c,
                Err(e) => {
                    return Target::Broken(format!("destination {}: {}", d.name, e.message()));
                }
            };
            let secrets = match http_secrets(d) {
                Ok(s) => s,
                Err(e) => return Target::Broken(format!("destination {}: {e}", d.name)),
            };
            match HttpDestination::new(hc, secrets, TlsRoots::default()) {
                Ok(h) => Target::Http(h),
                Err(e) => Target::Broken(format!("destination {}: {e}", d.name)),
            }
        }
        "hermes" => {
            let mut hc = hermes_base(cfg);
            hc.timeout_s = d.timeout_s;
            if let Some(b) = d.max_body_bytes {
                hc.max_body_bytes = b as u64;
            }
            let get_str = |k: &str| options.get(k).and_then(|v| v.as_str()).map(str::to_string);
            if let Some(v) = get_str("base_url") {
                hc.base_url = v;
            }
            if let Some(v) = get_str("subscriptions_path") {
                hc.subscriptions_path = v.into();
            }
            hc.profile = get_str("profile");
            hc.event_header = get_str("event_header");
            hc.dedup_header = get_str("dedup_header");
            if let Some(b) = options.get("unwrap").and_then(|v| v.as_bool()) {
                hc.unwrap = b;
            }
            if let Some(b) = options.get("legacy_signature").and_then(|v| v.as_bool()) {
                hc.legacy_signature = b;
            }
            let route = d.name.strip_prefix("hermes:").unwrap_or(&d.name);
            match HermesDestination::new(route, hc, TlsRoots::default()) {
                Ok(h) => Target::Hermes(h),
                Err(e) => Target::Broken(format!("destination {}: {e}", d.name)),
            }
        }
        "script" => match ScriptConfig::from_options(&options, d.timeout_s) {
            Ok(sc) => {
                let problems = sc.problems();
                if problems.is_empty() {
                    Target::Script(ScriptDestination::new(d.name.clone(), sc))
                } else {
                    Target::Broken(format!("destination {}: {}", d.name, problems.join("; ")))
                }
            }
            Err(e) => Target::Broken(format!("destination {}: {e}", d.name)),
        },
        other => Target::Broken(format!("destination {}: unknown type {other}", d.name)),
    }
}

impl Registry {
    pub fn build(cfg: &Config) -> Registry {
        let built = cfg
            .destinations
            .values()
            .map(|d| {
                (
                    d.name.clone(),
                    Arc::new(Built {
                        name: d.name.clone(),
                        max_inflight: d.max_inflight.max(1) as usize,
                        timeout_s: d.timeout_s,
                        target: build_one(cfg, d),
                    }),
                )
            })
            .collect();
        Registry {
            built,
            hermes: Some(hermes_base(cfg)),
        }
    }

    /// The destination named `name`, building an implicit hermes destination on first use.
    pub fn get(&mut self, name: &str) -> Arc<Built> {
        if let Some(b) = self.built.get(name) {
            return b.clone();
        }
        let target = match (name.strip_prefix("hermes:"), &self.hermes) {
            (Some(route), Some(hc)) => {
                match HermesDestination::new(route, hc.clone(), TlsRoots::default()) {
                    Ok(h) => Target::Hermes(h),
                    Err(e) => Target::Broken(format!("destination {name}: {e}")),
                }
            }
            _ => Target::Broken(format!(
                "unknown destination {name}: add [destinations.\"{name}\"] to the config"
            )),
        };
        let timeout_s = self.hermes.as_ref().map(|h| h.timeout_s).unwrap_or(30.0);
        let b = Arc::new(Built {
            name: name.to_string(),
            max_inflight: if name.starts_with("hermes:") { 2 } else { 1 },
            timeout_s,
            target,
        });
        self.built.insert(name.to_string(), b.clone());
        b
    }
}
