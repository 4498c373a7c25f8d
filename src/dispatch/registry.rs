//! Destinations built from config, once per config load: each name maps to a ready client
//! (http, hermes) or script runner, or to the reason it cannot be used (which the
//! dispatcher reports as a `config` outcome, never a panic). `hermes:<route>` without a
//! table is an implicit hermes destination with the [hermes] defaults (spec 14.2).
//!
//! Must not: interpret a destination table: `config::destination` parsed each one into the
//! typed `DestinationSpec` that `check` and the sandbox self-test use too.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::config::{Config, DestinationConfig, DestinationSpec, HttpSpec, RateLimit};
use crate::destinations::script::ScriptDestination;
use crate::destinations::{HermesDestination, HttpDestination, TlsRoots};

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
    /// The request rate (`dispatch::rate`); `None`: no limit.
    pub rate: Option<RateLimit>,
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
    hermes: Option<crate::config::Hermes>,
}

/// Secret candidates for an http destination, read at each attempt: `secret` first, then
/// `secret_previous` (rotation).
fn http_secrets(spec: &HttpSpec) -> Arc<dyn crate::secret::SecretSource + Send + Sync> {
    Arc::new(crate::secret::SigningSecrets::new(
        &spec.secret,
        spec.secret_previous.as_ref(),
    ))
}

/// The ready client for a parsed destination (the one parse is `config::destination`).
fn build_one(d: &DestinationConfig) -> Target {
    let broken = |e: &dyn std::fmt::Display| Target::Broken(format!("destination {}: {e}", d.name));
    match &d.spec {
        DestinationSpec::Http(h) => {
            match HttpDestination::new(h.http.clone(), http_secrets(h), TlsRoots::default()) {
                Ok(h) => Target::Http(h),
                Err(e) => broken(&e),
            }
        }
        DestinationSpec::Hermes(h) => {
            let route = d.hermes_route().unwrap_or(&d.name);
            match HermesDestination::new(route, h.clone(), TlsRoots::default()) {
                Ok(h) => Target::Hermes(h),
                Err(e) => broken(&e),
            }
        }
        DestinationSpec::Script(s) => {
            Target::Script(ScriptDestination::new(d.name.clone(), s.clone()))
        }
    }
}

fn built(d: &DestinationConfig) -> Arc<Built> {
    Arc::new(Built {
        name: d.name.clone(),
        max_inflight: d.max_inflight.max(1) as usize,
        rate: d.rate,
        timeout_s: d.timeout_s,
        target: build_one(d),
    })
}

impl Registry {
    pub fn build(cfg: &Config) -> Registry {
        Registry {
            built: cfg
                .destinations
                .values()
                .map(|d| (d.name.clone(), built(d)))
                .collect(),
            hermes: Some(cfg.hermes.clone()),
        }
    }

    /// The destination named `name`, building an implicit hermes destination on first use
    /// (from the same parse as a configured one, `config::destination::implicit_hermes`).
    pub fn get(&mut self, name: &str) -> Arc<Built> {
        if let Some(b) = self.built.get(name) {
            return b.clone();
        }
        let implicit = self
            .hermes
            .as_ref()
            .and_then(|h| crate::config::destination::implicit_hermes(h, name));
        let b = match implicit {
            Some(d) => built(&d),
            None => Arc::new(Built {
                name: name.to_string(),
                max_inflight: 1,
                rate: None,
                timeout_s: crate::config::destination::HTTP_TIMEOUT_S_DEFAULT,
                target: Target::Broken(format!(
                    "unknown destination {name}: add [destinations.\"{name}\"] to the config"
                )),
            }),
        };
        self.built.insert(name.to_string(), b.clone());
        b
    }
}
