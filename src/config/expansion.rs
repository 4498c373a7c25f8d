//! The bobbin step of config loading (spec 14.3.3): between [`super::parse_raw`] and
//! [`super::validate_raw`], the `[bobbins.<i>]` tables of the file become ordinary
//! `[sources.<i>]`, `[destinations."script:<i>"]` and `[[routes]]` tables, so that every
//! path that builds a config (start, check, the intake's and the dispatcher's reloads)
//! expands, and everything after this step sees only ordinary tables.
//!
//! Owns: loading the catalogue on every load (built-ins, then `spool.bobbin_path`: a
//! bobbin edited under a path root is picked up by the next load), turning its problems and
//! the expansion's into config [`Problem`]s keyed by what the operator wrote
//! (`bobbins.<i>.<key>`), re-reading the expanded root into [`RawConfig`], and the rule that
//! a script destination's `processor` key and a source's `type = "poll"` come only from an
//! expansion.
//!
//! Must not: expand anything itself (that is [`crate::bobbins::expand`], a pure function),
//! or judge what the expanded tables' owners judge (the sources, destinations and routes
//! are validated by the rest of the loader exactly as hand-written ones).

use std::path::PathBuf;

use toml::{Table, Value};

use super::raw::{RawConfig, RawSpool};
use super::{PathInputs, Problem, problem};
use crate::bobbins::{Catalog, Instances, expand_config};

/// The catalogue a config's bobbins come from: the built-ins, then each
/// `spool.bobbin_path` root, read now (nothing is cached between loads). A config with
/// neither instances nor a bobbin path needs none, and reads none.
pub(super) fn catalog_for(raw: &RawConfig) -> Catalog {
    let path = bobbin_path(&raw.spool);
    if raw.bobbins.is_empty() && path.is_empty() {
        return Catalog::default();
    }
    Catalog::load(&path)
}

/// `spool.bobbin_path`, `~/` expanded.
pub(super) fn bobbin_path(spool: &RawSpool) -> Vec<PathBuf> {
    spool
        .bobbin_path
        .clone()
        .unwrap_or_default()
        .iter()
        .map(|p| super::expand_home(p))
        .collect()
}

/// The catalogue's own problems (a private bobbin that breaks a rule of 14.3.1 or 14.3.6),
/// as errors at `spool.bobbin_path`.
pub(super) fn catalog_problems(catalog: &Catalog) -> Vec<Problem> {
    catalog
        .problems()
        .iter()
        .map(|f| problem("spool.bobbin_path", f.to_string()))
        .collect()
}

/// Expands the file's `[bobbins.*]`: the raw config to validate, its unknown keys by path,
/// and where each expanded table came from. Without `[bobbins]` the raw config is returned
/// as parsed.
pub(super) fn expand(
    text: &str,
    raw: RawConfig,
    unknown: Vec<String>,
    inputs: &PathInputs,
    catalog: &Catalog,
) -> Result<(RawConfig, Vec<String>, Instances), Vec<Problem>> {
    if raw.bobbins.is_empty() {
        let mut errors = processor_only_from_expansion(&raw, &Instances::default());
        errors.extend(poll_only_from_expansion(&raw, &Instances::default()));
        return if errors.is_empty() {
            Ok((raw, unknown, Instances::default()))
        } else {
            Err(errors)
        };
    }
    // parse_raw read this text already, so it is valid TOML.
    let root: Table = toml::from_str(text).map_err(|e| vec![super::syntax::problem(text, &e)])?;
    let home = super::resolve_home(inputs, &raw.spool);
    let expanded = expand_config(&root, catalog, &home).map_err(|errors| {
        errors
            .into_iter()
            .map(|e| problem(e.key, e.message))
            .collect::<Vec<_>>()
    })?;
    let mut unknown = Vec::new();
    let raw: Result<RawConfig, _> =
        serde_ignored::deserialize(Value::Table(expanded.root), |path| {
            unknown.push(path.to_string())
        });
    match raw {
        Ok(raw) => {
            let mut errors = processor_only_from_expansion(&raw, &expanded.instances);
            errors.extend(poll_only_from_expansion(&raw, &expanded.instances));
            if errors.is_empty() {
                Ok((raw, unknown, expanded.instances))
            } else {
                Err(errors)
            }
        }
        Err(e) => {
            // The instance keys were type-checked by the expansion; what is left is a
            // file table's shape, which parse_raw reported with its line already.
            Err(vec![problem(
                "bobbins",
                format!(
                    "the expanded tables do not read as a config ({}); check the [bobbins.*] tables with hookspool bobbin expand",
                    first_line_unquoted(&e.to_string())
                ),
            )])
        }
    }
}

/// A problem the loader found in an expanded table, at the key the operator wrote (and a
/// fix for a template key given as a setting written as one: `write settings.header = ...`).
pub(super) fn at_instance_key(instances: &Instances, p: Problem) -> Problem {
    let key = instances.config_key(&p.key);
    let message = match key.split_once(".settings.") {
        Some((_, setting)) if !p.key.contains(".settings.") => p.message.replace(
            &format!("write {setting} ="),
            &format!("write settings.{setting} ="),
        ),
        _ => p.message,
    };
    Problem { key, message }
}

/// `processor = "<i>"` replaces a script's argv only in the destination an instance of a
/// processor bobbin expands to (`script:<i>`), which carries the runtime's environment
/// (14.3.3 steps 2-6); a hand-written one would start the runtime with none of it.
fn processor_only_from_expansion(raw: &RawConfig, instances: &Instances) -> Vec<Problem> {
    let mut out = Vec::new();
    for (name, d) in &raw.destinations {
        let Some(p) = d.options.get("processor") else {
            continue;
        };
        let expanded = name.strip_prefix("script:").is_some_and(|i| {
            instances.get(i).is_some_and(|o| o.processor) && p.as_str() == Some(i)
        });
        if !expanded {
            out.push(problem(
                format!("destinations.\"{name}\".processor"),
                "processor is written by a [bobbins.<instance>] expansion, never by hand; configure the bobbin as [bobbins.<instance>] with bobbin = \"<vendor>.<product>\", or give this script argv = [\"/path/to/program\"]",
            ));
        }
    }
    out
}

/// `type = "poll"` only in the source a poll bobbin's instance expands to (spec 14.4): the
/// clock's ticks are the only events such a source has, and its script destination carries
/// the poller's environment, which a hand-written table would not.
fn poll_only_from_expansion(raw: &RawConfig, instances: &Instances) -> Vec<Problem> {
    raw.sources
        .iter()
        .filter(|(_, s)| s.kind.as_deref() == Some(super::poll::POLL_KIND))
        .filter(|(name, _)| !instances.get(name).is_some_and(|o| o.poll))
        .map(|(name, _)| {
            problem(
                format!("sources.{name}.type"),
                "type = \"poll\" is written by a poll bobbin's [bobbins.<instance>] expansion, never by hand; configure [bobbins.<instance>] with a poll bobbin (bobbin = \"hookspool.feed\", \"google.tasks\", ...), or give this source a webhook type",
            )
        })
        .collect()
}

/// The first line of a deserializer message without its quoted parts (a value could be a
/// token).
fn first_line_unquoted(message: &str) -> String {
    let line = message.lines().next().unwrap_or("");
    let mut out = String::new();
    let mut quoted = false;
    for c in line.chars() {
        match c {
            '"' | '`' => quoted = !quoted,
            _ if !quoted => out.push(c),
            _ => {}
        }
    }
    out.trim().to_string()
}
