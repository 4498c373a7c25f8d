//! What the intake serves right now: the validated config and one built [`Source`] per
//! `[sources.<name>]`, as one immutable value swapped whole on reload.
//!
//! Owns: loading (config, then `sources::build` for every source) and the comparison that
//! says which settings a reload cannot change (listeners, the writer's knobs).
//! Must not: touch the store or the network, or keep secret values (sources read secrets
//! through [`crate::secret::ConfigSecrets`] at use time).

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
        restart_only(&self.config, &next.config)
            .into_iter()
            .filter_map(|(key, changed)| changed.then_some(key))
            .collect()
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

/// The settings a reload does not apply, each with whether it differs between `a` and `b`
/// (the configuration reference marks each of them "restart").
pub fn restart_only(a: &Config, b: &Config) -> [(&'static str, bool); 6] {
    [
        ("intake.listen", a.intake.listen != b.intake.listen),
        ("spool.db", a.db != b.db),
        (
            "intake.busy_timeout_s",
            a.intake.busy_timeout_s != b.intake.busy_timeout_s,
        ),
        (
            "intake.group_events_max",
            a.intake.group_events_max != b.intake.group_events_max,
        ),
        ("intake.threads", a.intake.threads != b.intake.threads),
        (
            "intake.group_wait_ms",
            a.intake.group_wait_ms != b.intake.group_wait_ms,
        ),
    ]
}
