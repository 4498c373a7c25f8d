//! What the intake serves right now: the validated config and one built [`Source`] per
//! `[sources.<name>]`, as one immutable value swapped whole on reload.
//!
//! Owns: loading (config, then `sources::build` for every source) and the comparison that
//! says which settings a reload cannot change (listeners, the writer's knobs).
//! Must not: touch the store or the network, or keep secret values (sources read secrets
//! through [`super::secrets::ConfigSecrets`] at use time).

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::config::{self, Config, PathInputs, SourceConfig};
use crate::sources::{self, Source};

use super::IntakeError;

/// One source as served: its config and the built source.
pub struct Served {
    pub config: SourceConfig,
    pub source: Arc<dyn Source>,
}

/// The config and the sources built from it.
pub struct Snapshot {
    pub config: Config,
    pub sources: BTreeMap<String, Served>,
}

impl Snapshot {
    /// Load the config (unknown keys are warnings at runtime) and build every source. Any
    /// source that does not build makes the whole snapshot an error, naming the source.
    pub fn load(inputs: &PathInputs) -> Result<Snapshot, IntakeError> {
        let (config, warnings) = config::load(inputs, false).map_err(IntakeError::Config)?;
        for w in &warnings {
            tracing::warn!(component = "intake", reason = %w, "config warning");
        }
        Snapshot::from_config(config)
    }

    pub fn from_config(config: Config) -> Result<Snapshot, IntakeError> {
        let mut built = BTreeMap::new();
        // A poll source (spec 14.4) has no plugin, so /hooks/<i> answers 404 for it.
        for (name, sc) in config.sources.iter().filter(|(_, sc)| !sc.is_poll()) {
            let source = sources::build(name, &sc.kind, &sc.options).map_err(|error| {
                IntakeError::Source {
                    source_name: name.clone(),
                    error,
                }
            })?;
            built.insert(
                name.clone(),
                Served {
                    config: sc.clone(),
                    source,
                },
            );
        }
        Ok(Snapshot {
            config,
            sources: built,
        })
    }

    /// Settings a reload does not apply (they need a restart), by key, when they changed.
    pub fn restart_only_changes(&self, next: &Snapshot) -> Vec<&'static str> {
        let (a, b) = (&self.config, &next.config);
        let mut out = Vec::new();
        if a.intake.listen != b.intake.listen {
            out.push("intake.listen");
        }
        if a.db != b.db {
            out.push("spool.db");
        }
        if a.intake.busy_timeout_s != b.intake.busy_timeout_s {
            out.push("intake.busy_timeout_s");
        }
        if a.intake.group_events_max != b.intake.group_events_max {
            out.push("intake.group_events_max");
        }
        if a.intake.threads != b.intake.threads {
            out.push("intake.threads");
        }
        if a.intake.group_wait_ms != b.intake.group_wait_ms {
            out.push("intake.group_wait_ms");
        }
        out
    }

    /// STATUS= text: what is served where.
    pub fn status_line(&self, listeners: &[String]) -> String {
        format!(
            "serving {} source(s) ({}) on {}",
            self.sources.len(),
            self.sources.keys().cloned().collect::<Vec<_>>().join(", "),
            listeners.join(", ")
        )
    }
}
