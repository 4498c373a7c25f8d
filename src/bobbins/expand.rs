//! Instance expansion (spec 14.3.3): one `[bobbins.<i>]` table becomes the ordinary raw
//! tables every other part of hookspool already understands.
//!
//! Owns: [`expand_instance`] and [`expand_config`], pure functions (no file, clock or
//! environment is read: the catalogue was loaded before, and the home is given), and the
//! eight rules, each one function below named after it:
//!
//! 1. `sources.<i>`: the bobbin's source (`type = "<builtin>"` with its `config` settings,
//!    or `type = "template"` with the fixed table and the template-key settings), the
//!    instance's secrets, the window/expect/dedup/body overrides, and `action`.
//! 2. With a processor, `destinations."script:<i>"` with `processor = "<i>"`, `timeout_s`,
//!    `state_dir` (when the processor keeps state), `max_inflight = 1` and an `env` table of:
//! 3. `HOOKSPOOL_BOBBIN`, `HOOKSPOOL_BOBBIN_INSTANCE`, `HOOKSPOOL_BOBBIN_DIR`;
//! 4. `HOOKSPOOL_SETTINGS` (JSON, defaults applied);
//! 5. `HOOKSPOOL_DELTA_ROUTES` (JSON of the outputs);
//! 6. `HOOKSPOOL_SECRET_REFS` (JSON of the references of `processor = true` secrets, never
//!    a value; an `{ env = ... }` reference is refused for them).
//! 7. Routes: none with a processor (and a file route that would bypass it is refused);
//!    without one and with named outputs, one `<i>-<event_type>` route per output, matching
//!    `event_type`, and `"*"` as the source's action.
//! 8. Collisions with the file's own tables and every instance-level mistake are errors.
//!
//! A poll bobbin (14.4) expands by [`rule_poll_source`] instead of rule 1: `sources.<i>`
//! with `type = "poll"`, `every_s`, `jitter_s` (the manifest's, or the instance's within
//! the same bounds), `span = "immediate"`, `action = "script:<i>"` and the secrets; then
//! rules 2-6 exactly as for a processor bobbin (the poller is its processor). The window,
//! expect and body keys are refused on its instance: a poll has no sender and no window.
//!
//! Every [`ExpandError`] names the config key and what to write instead.
//!
//! Must not: validate what the expanded tables' owners validate (the config loader checks
//! the expanded source, destination and routes as it checks hand-written ones, and the
//! template source checks its keys), or print or resolve a secret.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use toml::{Table, Value};

use super::catalog::{Catalog, Entry};
use super::manifest::{Manifest, OutputKey, SourceImpl};
use super::name::{BobbinName, is_instance_name};
use super::template_keys::{self, is_unset};
use crate::secret::SecretRefs;

/// The keys a `[bobbins.<i>]` table may have.
pub const INSTANCE_KEYS: &[&str] = &[
    "bobbin",
    "secrets",
    "settings",
    "outputs",
    "expect",
    "span",
    "quiet_s",
    "max_s",
    "max_events",
    "max_bytes",
    "expect_every_s",
    "dedup_window_s",
    "max_body_bytes",
    "timeout_s",
    "state_dir",
    "every_s",
    "jitter_s",
];

/// Overrides copied into `[sources.<i>]` as written (the config loader validates them).
const SOURCE_OVERRIDES: &[&str] = &[
    "quiet_s",
    "max_s",
    "max_events",
    "max_bytes",
    "dedup_window_s",
    "max_body_bytes",
];

/// Keys only an instance of a processor (or poll) bobbin takes.
const PROCESSOR_ONLY: &[&str] = &["timeout_s", "state_dir"];

/// Keys only an instance of a poll bobbin takes (14.4).
const POLL_ONLY: &[&str] = &["every_s", "jitter_s"];

/// Instance keys a poll bobbin refuses: a poll has no sender and no window (14.4).
const POLL_REFUSED: &[&str] = &[
    "expect",
    "span",
    "quiet_s",
    "max_s",
    "max_events",
    "max_bytes",
    "expect_every_s",
    "dedup_window_s",
    "max_body_bytes",
];

/// The source type of a poll instance's expanded source (the intake loads no plugin for it).
pub const POLL_KIND: &str = "poll";

/// A processor destination runs one batch at a time (its state lock, 14.3.2).
pub const PROCESSOR_MAX_INFLIGHT: i64 = 1;

/// Below the home: default processor state directories, `<home>/bobbins/<i>`.
pub const STATE_DIR: &str = "bobbins";

/// One instance mistake: the config key, and what to write instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpandError {
    pub key: String,
    pub message: String,
}

impl fmt::Display for ExpandError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.key, self.message)
    }
}

impl std::error::Error for ExpandError {}

/// What one instance becomes.
#[derive(Debug, Clone, PartialEq)]
pub struct Expansion {
    pub instance: String,
    pub bobbin: BobbinName,
    /// `[sources.<i>]`.
    pub source: Table,
    /// `[destinations."script:<i>"]`, for a processor bobbin.
    pub destination: Option<Table>,
    /// A poll bobbin's instance (14.4).
    pub poll: bool,
    /// `[[routes]]` entries, in output order, to go before the file's own routes.
    pub routes: Vec<Table>,
    /// The names of the instance's settings (given or default), any of which may be a key
    /// of the source.
    pub settings_in_source: Vec<String>,
}

impl Expansion {
    /// `script:<i>`, the destination name of a processor instance.
    pub fn script_name(instance: &str) -> String {
        format!("script:{instance}")
    }
}

/// A config root after expansion, and where each expanded table came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Expanded {
    /// The root with `[bobbins]` removed and the expansions merged in.
    pub root: Table,
    pub instances: Instances,
}

/// The instances a config expanded, so a problem the config loader finds in an expanded
/// table is reported at the instance key the operator wrote ([`Instances::config_key`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Instances {
    by_name: BTreeMap<String, InstanceOrigin>,
    /// The instance each generated route belongs to, in `[[routes]]` order (they come first).
    generated_routes: Vec<String>,
}

/// One expanded instance.
#[derive(Debug, Clone, PartialEq)]
pub struct InstanceOrigin {
    pub bobbin: BobbinName,
    /// The bobbin has a processor (or a poller): `destinations."script:<i>"` is the
    /// expansion's.
    pub processor: bool,
    /// A poll bobbin (14.4): `sources.<i>` is a `type = "poll"` source.
    pub poll: bool,
    /// The instance's settings (a source key of that name came from one, or would have:
    /// an unset template key is left out of the source).
    pub source_settings: Vec<String>,
}

impl Instances {
    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    /// Every expanded instance, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &InstanceOrigin)> {
        self.by_name.iter()
    }

    pub fn get(&self, instance: &str) -> Option<&InstanceOrigin> {
        self.by_name.get(instance)
    }

    /// The key the operator wrote for a key of an expanded table: `sources.<i>.quiet_s` ->
    /// `bobbins.<i>.quiet_s`, `sources.<i>.header` (from a setting) ->
    /// `bobbins.<i>.settings.header`, `sources.<i>.action` -> `bobbins.<i>.outputs`, a key
    /// the bobbin itself fixed -> `bobbins.<i>.bobbin`, `destinations."script:<i>".timeout_s`
    /// -> `bobbins.<i>.timeout_s`, a generated route -> `bobbins.<i>.outputs`, and the file's
    /// own `routes[j]` renumbered past the generated ones. Any other key is returned as is.
    pub fn config_key(&self, key: &str) -> String {
        if let Some(rest) = key.strip_prefix("sources.") {
            let (name, tail) = split_first(rest);
            if let Some(o) = self.by_name.get(name) {
                return o.source_key(name, tail);
            }
        }
        if let Some(rest) = key.strip_prefix("destinations.\"script:")
            && let Some((name, tail)) = rest.split_once('"')
            && self.by_name.get(name).is_some_and(|o| o.processor)
        {
            let tail = tail.strip_prefix('.').unwrap_or("");
            let first = tail.split('.').next().unwrap_or("");
            return if PROCESSOR_ONLY.contains(&first) {
                format!("bobbins.{name}.{tail}")
            } else {
                format!("bobbins.{name}")
            };
        }
        if let Some(rest) = key.strip_prefix("routes[")
            && let Some((index, tail)) = rest.split_once(']')
            && let Ok(j) = index.parse::<usize>()
        {
            let n = self.generated_routes.len();
            return match self.generated_routes.get(j) {
                Some(instance) => format!("bobbins.{instance}.outputs"),
                None => format!("routes[{}]{tail}", j - n),
            };
        }
        key.to_string()
    }
}

impl InstanceOrigin {
    fn source_key(&self, instance: &str, tail: &str) -> String {
        let prefix = format!("bobbins.{instance}");
        let (first, _) = split_first(tail);
        if tail.is_empty() {
            prefix
        } else if first == "secrets"
            || first == "span"
            || POLL_ONLY.contains(&first)
            || first == "expect_every_s"
            || SOURCE_OVERRIDES.contains(&first)
        {
            format!("{prefix}.{tail}")
        } else if first == "action" {
            format!("{prefix}.outputs")
        } else if self.source_settings.iter().any(|s| s == first) {
            format!("{prefix}.settings.{tail}")
        } else {
            format!("{prefix}.bobbin")
        }
    }
}

/// `a.b.c` -> (`a`, `b.c`).
fn split_first(key: &str) -> (&str, &str) {
    key.split_once('.').unwrap_or((key, ""))
}

/// Expands every `[bobbins.*]` of a raw config root table: returns the root with
/// `[bobbins]` removed and the expansions merged in (sources and destinations added, the
/// generated routes before the file's own), and where each came from. All instances'
/// errors are returned together.
pub fn expand_config(
    root: &Table,
    catalog: &Catalog,
    home: &Path,
) -> Result<Expanded, Vec<ExpandError>> {
    let Some(bobbins) = root.get("bobbins") else {
        return Ok(Expanded {
            root: root.clone(),
            instances: Instances::default(),
        });
    };
    let Some(bobbins) = bobbins.as_table() else {
        return Err(vec![err(
            "bobbins",
            "must be a table of instances; write [bobbins.<instance>] with bobbin = \"<vendor>.<product>\"",
        )]);
    };
    let mut errors = Vec::new();
    let mut expansions = Vec::new();
    for (instance, table) in bobbins {
        match expand_instance(instance, table, catalog, root, home) {
            Ok(e) => expansions.push(e),
            Err(mut e) => errors.append(&mut e),
        }
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    let mut out = root.clone();
    out.remove("bobbins");
    let mut sources = table_or_empty(root, "sources");
    let mut destinations = table_or_empty(root, "destinations");
    let mut routes: Vec<Value> = Vec::new();
    let mut instances = Instances::default();
    for e in expansions {
        let source_settings = e.settings_in_source.clone();
        instances.by_name.insert(
            e.instance.clone(),
            InstanceOrigin {
                bobbin: e.bobbin.clone(),
                processor: e.destination.is_some(),
                poll: e.poll,
                source_settings,
            },
        );
        if let Some(d) = e.destination {
            destinations.insert(Expansion::script_name(&e.instance), Value::Table(d));
        }
        instances
            .generated_routes
            .extend(e.routes.iter().map(|_| e.instance.clone()));
        routes.extend(e.routes.into_iter().map(Value::Table));
        sources.insert(e.instance, Value::Table(e.source));
    }
    if let Some(Value::Array(own)) = root.get("routes") {
        routes.extend(own.iter().cloned());
    }
    if !sources.is_empty() {
        out.insert("sources".into(), Value::Table(sources));
    }
    if !destinations.is_empty() {
        out.insert("destinations".into(), Value::Table(destinations));
    }
    if !routes.is_empty() {
        out.insert("routes".into(), Value::Array(routes));
    }
    Ok(Expanded {
        root: out,
        instances,
    })
}

/// Expands one instance. `rest` is the raw config root (for collisions, the file's routes
/// and destinations, and the other instances); `home` is the resolved spool home.
pub fn expand_instance(
    instance: &str,
    value: &Value,
    catalog: &Catalog,
    rest: &Table,
    home: &Path,
) -> Result<Expansion, Vec<ExpandError>> {
    let prefix = format!("bobbins.{instance}");
    let Some(table) = value.as_table() else {
        return Err(vec![err(
            &prefix,
            format!(
                "must be a table; write [bobbins.{instance}] with bobbin = \"<vendor>.<product>\""
            ),
        )]);
    };
    let entry = resolve_bobbin(instance, table, catalog)?;
    let m = &entry.manifest;
    let mut errors = Vec::new();
    if !is_instance_name(instance) {
        errors.push(err(&prefix, format!("an instance name is a plain identifier (a-z, 0-9, - and _), also its URL /hooks/<instance>; write e.g. [bobbins.{}]", m.name.product())));
    }
    rule_unknown_keys(&prefix, table, m, &mut errors);
    rule_override_types(&prefix, table, &mut errors);
    let secrets = rule_secrets(&prefix, table, m, &mut errors);
    let settings = rule_settings(&prefix, table, m, &mut errors);
    let outputs = rule_outputs(&prefix, table, m, &mut errors);
    let mut source = if m.is_poll() {
        rule_poll_source(&prefix, table, m, &secrets, &mut errors)
    } else {
        rule_1_source(
            &prefix,
            instance,
            table,
            m,
            &settings,
            &secrets,
            &mut errors,
        )
    };
    rule_secrets_any_one(&prefix, instance, m, &source, &secrets, &mut errors);
    let mut routes = Vec::new();
    let mut destination = None;
    if m.runner().is_some() {
        source.insert(
            "action".into(),
            Value::String(Expansion::script_name(instance)),
        );
        destination = Some(rule_2_destination(
            &prefix,
            instance,
            table,
            entry,
            &settings,
            &secrets,
            &outputs,
            rest,
            catalog,
            home,
            &mut errors,
        ));
        rule_7_no_bypass(instance, rest, &mut errors);
    } else {
        let (action, r) = rule_7_routes(&prefix, instance, m, &outputs, &source, &mut errors);
        if let Some(a) = action {
            source.insert("action".into(), Value::String(a));
        }
        routes = r;
    }
    rule_8_collisions(instance, rest, &routes, destination.is_some(), &mut errors);
    if errors.is_empty() {
        Ok(Expansion {
            instance: instance.to_string(),
            bobbin: m.name.clone(),
            source,
            destination,
            poll: m.is_poll(),
            routes,
            settings_in_source: settings.keys().cloned().collect(),
        })
    } else {
        Err(errors)
    }
}

fn err(key: &str, message: impl Into<String>) -> ExpandError {
    ExpandError {
        key: key.to_string(),
        message: message.into(),
    }
}

fn table_or_empty(root: &Table, key: &str) -> Table {
    root.get(key)
        .and_then(Value::as_table)
        .cloned()
        .unwrap_or_default()
}

/// `bobbin`: required, a known `<vendor>.<product>`; a dotted header is named as such.
fn resolve_bobbin<'c>(
    instance: &str,
    table: &Table,
    catalog: &'c Catalog,
) -> Result<&'c Entry, Vec<ExpandError>> {
    let key = format!("bobbins.{instance}.bobbin");
    let Some(value) = table.get("bobbin") else {
        // [bobbins.google.gmail] reads as bobbins.google = { gmail = { ... } }.
        if !table.is_empty()
            && table
                .iter()
                .all(|(k, v)| v.is_table() && !INSTANCE_KEYS.contains(&k.as_str()))
        {
            let product = table.keys().next().cloned().unwrap_or_default();
            return Err(vec![err(
                &format!("bobbins.{instance}"),
                format!(
                    "[bobbins.{instance}.{product}] is a dotted header, which TOML reads as a nested table; write the instance plainly: [bobbins.{product}] with bobbin = \"{instance}.{product}\""
                ),
            )]);
        }
        return Err(vec![err(
            &key,
            format!("required{}", did_you_mean(instance, catalog)),
        )]);
    };
    let Some(text) = value.as_str() else {
        return Err(vec![err(
            &key,
            "must be a string; write bobbin = \"<vendor>.<product>\"",
        )]);
    };
    let name = BobbinName::parse(text).map_err(|e| vec![err(&key, e.to_string())])?;
    catalog.get(&name.to_string()).ok_or_else(|| {
        let known: Vec<String> = catalog.entries().iter().map(|e| e.manifest.name.to_string()).collect();
        vec![err(
            &key,
            format!(
                "no bobbin {name} is installed; write one of {} (hookspool bobbin list shows them), or add its directory to spool.bobbin_path",
                if known.is_empty() { "none are installed".into() } else { known.join(", ") }
            ),
        )]
    })
}

/// ` (did you mean bobbin = "google.gmail"?)` for an instance named after a bobbin's
/// product or vendor (`gmail`, `github-ci`), else advice to look the name up.
fn did_you_mean(instance: &str, catalog: &Catalog) -> String {
    let fits = |part: &str| {
        instance == part
            || instance.starts_with(&format!("{part}-"))
            || instance.starts_with(&format!("{part}_"))
    };
    let by_product: Vec<String> = catalog
        .entries()
        .iter()
        .filter(|e| fits(e.manifest.name.product()))
        .map(|e| e.manifest.name.to_string())
        .collect();
    let candidates = if by_product.is_empty() {
        catalog
            .entries()
            .iter()
            .filter(|e| fits(e.manifest.name.vendor()))
            .map(|e| e.manifest.name.to_string())
            .collect()
    } else {
        by_product
    };
    match candidates.as_slice() {
        [one] => format!(" (did you mean bobbin = \"{one}\"?)"),
        [] => "; write bobbin = \"<vendor>.<product>\" (hookspool bobbin list shows the bobbins)"
            .into(),
        many => format!(
            "; write bobbin = one of {}",
            many.iter()
                .map(|n| format!("\"{n}\""))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// Rule 8 (instance keys): unknown keys, and processor-only keys on other bobbins.
fn rule_unknown_keys(prefix: &str, table: &Table, m: &Manifest, errors: &mut Vec<ExpandError>) {
    for k in table.keys() {
        if !INSTANCE_KEYS.contains(&k.as_str()) {
            errors.push(err(
                &format!("{prefix}.{k}"),
                format!(
                    "unknown instance key; remove it (the keys: {})",
                    INSTANCE_KEYS.join(", ")
                ),
            ));
        } else if PROCESSOR_ONLY.contains(&k.as_str()) && m.runner().is_none() {
            errors.push(err(
                &format!("{prefix}.{k}"),
                format!(
                    "{} has no processor, so {k} does not apply; remove it",
                    m.name
                ),
            ));
        } else if POLL_ONLY.contains(&k.as_str()) && !m.is_poll() {
            errors.push(err(
                &format!("{prefix}.{k}"),
                format!(
                    "{} receives webhooks and is not polled, so {k} does not apply; remove it",
                    m.name
                ),
            ));
        } else if POLL_REFUSED.contains(&k.as_str()) && m.is_poll() {
            errors.push(err(
                &format!("{prefix}.{k}"),
                format!(
                    "{} is a poll bobbin: a poll has no sender and no window, so {k} does not apply; remove it (every_s and jitter_s set the schedule)",
                    m.name
                ),
            ));
        }
    }
}

/// Rule 8 (instance keys): the overrides copied into `[sources.<i>]` and the processor's
/// destination have the types those tables take, so a mistake is named at the instance key
/// (the loader would otherwise meet it in a table the operator never wrote).
fn rule_override_types(prefix: &str, table: &Table, errors: &mut Vec<ExpandError>) {
    for (k, v) in table {
        let (ok, example) = match k.as_str() {
            "quiet_s" | "max_s" | "expect_every_s" | "dedup_window_s" | "timeout_s" => {
                (v.is_integer() || v.is_float(), "60")
            }
            "every_s" => (v.is_integer(), "900"),
            "jitter_s" => (v.is_integer(), "90"),
            "max_events" | "max_bytes" | "max_body_bytes" => (v.is_integer(), "500"),
            "span" => (v.is_str(), "\"burst\""),
            "state_dir" => (v.is_str(), "\"/var/lib/hookspool/bobbins/<instance>\""),
            _ => continue,
        };
        if !ok {
            errors.push(err(
                &format!("{prefix}.{k}"),
                format!("has the wrong type; write e.g. {k} = {example}"),
            ));
        }
    }
}

/// Rule 8 (secrets) for a source that needs any one of its secrets (Standard Webhooks: a
/// `whsec_` secret for v1, a `whpk_` key for v1a, [`crate::sources::SecretsNeeded`]): the
/// manifest marks each optional, and the instance must still give one. `hookspool check`
/// says the same of a hand-written source, so the two agree.
fn rule_secrets_any_one(
    prefix: &str,
    instance: &str,
    m: &Manifest,
    source: &Table,
    secrets: &Table,
    errors: &mut Vec<ExpandError>,
) {
    let Some(SourceImpl::Builtin(kind)) = m.source().map(|s| &s.imp) else {
        return;
    };
    let mut options = source.clone();
    for k in ["type", "secrets", "span", "action", "expect_every_s"]
        .iter()
        .chain(SOURCE_OVERRIDES)
    {
        options.remove(*k);
    }
    // A source that does not build is the config loader's to report, at its own key.
    let Ok(built) = crate::sources::build(instance, kind, &options) else {
        return;
    };
    let d = built.declared();
    if d.secrets_needed == crate::sources::SecretsNeeded::AnyOne
        && !d.secrets.iter().any(|s| secrets.contains_key(*s))
    {
        let first = d.secrets.first().copied().unwrap_or("secret");
        errors.push(err(&format!("{prefix}.secrets"), format!("{} needs at least one of the secrets {}; write secrets.{first} = {{ file = \"/etc/hookspool/secrets/{instance}_{first}\" }}", m.name, d.secrets.join(", "))));
    }
}

/// Rule 8 (secrets) and rule 6's refusal: declared names only, every required one given,
/// each a reference, none of a processor secret from the dispatcher's environment.
fn rule_secrets(prefix: &str, table: &Table, m: &Manifest, errors: &mut Vec<ExpandError>) -> Table {
    let given = match table.get("secrets") {
        None => Table::new(),
        Some(Value::Table(t)) => t.clone(),
        Some(_) => {
            errors.push(err(&format!("{prefix}.secrets"), "must be a table; write secrets.<name> = { file = \"/etc/hookspool/secrets/<name>\" }"));
            Table::new()
        }
    };
    for (name, v) in &given {
        let key = format!("{prefix}.secrets.{name}");
        let Some(spec) = m.secrets.get(name) else {
            errors.push(err(
                &key,
                format!(
                    "{} has no secret {name}; remove it (its secrets: {})",
                    m.name,
                    names(m.secrets.keys().map(String::as_str))
                ),
            ));
            continue;
        };
        match v.clone().try_into::<SecretRefs>() {
            Err(_) => errors.push(err(&key, "not a secret reference; write { file = \"/etc/hookspool/secrets/<name>\" }, { env = \"NAME\" } or { env_file = \"...\", key = \"NAME\" }")),
            Ok(refs) => {
                let from_env = refs.refs().iter().any(|r| matches!(r, crate::secret::SecretRef::Env { .. }));
                if spec.processor && from_env {
                    errors.push(err(&key, "the processor needs this secret and does not inherit the dispatcher's environment; write { file = \"...\" } or { env_file = \"...\", key = \"NAME\" }"));
                }
            }
        }
    }
    for (name, spec) in &m.secrets {
        if spec.required && !given.contains_key(name) {
            errors.push(err(&format!("{prefix}.secrets.{name}"), format!("required ({}); write secrets.{name} = {{ file = \"/etc/hookspool/secrets/{}_{name}\" }}", spec.description, prefix.trim_start_matches("bobbins."))));
        }
    }
    given
}

/// Rule 8 (settings) and rule 4's values: declared names, the declared type and the
/// manifest's constraints on the value (`format`, `min`/`max`, `pattern`: what the processor
/// or poller would refuse at every run), every required one given; returns every setting
/// with defaults applied.
fn rule_settings(
    prefix: &str,
    table: &Table,
    m: &Manifest,
    errors: &mut Vec<ExpandError>,
) -> BTreeMap<String, Value> {
    let given = match table.get("settings") {
        None => Table::new(),
        Some(Value::Table(t)) => t.clone(),
        Some(_) => {
            errors.push(err(
                &format!("{prefix}.settings"),
                "must be a table; write settings = { <name> = <value> }",
            ));
            Table::new()
        }
    };
    let mut out = BTreeMap::new();
    for (name, v) in &given {
        let key = format!("{prefix}.settings.{name}");
        match m.settings.get(name) {
            None => errors.push(err(
                &key,
                format!(
                    "{} has no setting {name}; remove it (its settings: {})",
                    m.name,
                    names(m.settings.keys().map(String::as_str))
                ),
            )),
            Some(spec) => match spec.check(v) {
                Err(why) => errors.push(err(&key, why)),
                Ok(()) => {
                    out.insert(name.clone(), v.clone());
                }
            },
        }
    }
    for (name, spec) in &m.settings {
        if out.contains_key(name) || given.contains_key(name) {
            continue;
        }
        match &spec.default {
            Some(d) if !spec.required => {
                out.insert(name.clone(), d.clone());
            }
            _ => errors.push(err(
                &format!("{prefix}.settings.{name}"),
                format!(
                    "required ({}); write settings.{name} = {}",
                    spec.description,
                    example_value(spec.ty)
                ),
            )),
        }
    }
    out
}

fn example_value(ty: super::manifest::SettingType) -> &'static str {
    use super::manifest::SettingType as T;
    match ty {
        T::String => "\"...\"",
        T::Int => "60",
        T::Bool => "true",
        T::List => "[\"...\"]",
        T::Path => "\"/etc/hookspool/...\"",
        T::Table => "{ name = \"value\" }",
    }
}

/// Rule 8 (outputs): event-type tokens or "*" the manifest declares (a "settings"
/// bobbin's instance may name any token), each mapped to a destination name.
fn rule_outputs(
    prefix: &str,
    table: &Table,
    m: &Manifest,
    errors: &mut Vec<ExpandError>,
) -> BTreeMap<OutputKey, String> {
    let mut out = BTreeMap::new();
    let given = match table.get("outputs") {
        None => return out,
        Some(Value::Table(t)) => t,
        Some(_) => {
            errors.push(err(
                &format!("{prefix}.outputs"),
                "must be a table; write outputs = { \"*\" = \"hermes:<route>\" }",
            ));
            return out;
        }
    };
    for (k, v) in given {
        let key = format!("{prefix}.outputs.{k}");
        let Some(output) = OutputKey::parse(k) else {
            errors.push(err(&key, "not an event-type token or \"*\"; write e.g. outputs = { \"*\" = \"hermes:<route>\" }"));
            continue;
        };
        if !m.outputs.contains_key(&output) && !m.is_settings_template() {
            errors.push(err(
                &key,
                format!(
                    "{} has no output {k}; remove it (its outputs: {})",
                    m.name,
                    names(m.outputs.keys().map(OutputKey::as_str))
                ),
            ));
            continue;
        }
        match v.as_str() {
            Some("quarantine") => errors.push(err(&key, "quarantine is reserved and never delivers; name a real destination, e.g. \"hermes:<route>\"")),
            Some(d) if !d.trim().is_empty() => {
                out.insert(output, d.to_string());
            }
            _ => errors.push(err(&key, "must name a destination; write e.g. \"hermes:<route>\" or a [destinations.<name>]")),
        }
    }
    out
}

/// Rule 1: `[sources.<i>]`.
fn rule_1_source(
    prefix: &str,
    instance: &str,
    table: &Table,
    m: &Manifest,
    settings: &BTreeMap<String, Value>,
    secrets: &Table,
    errors: &mut Vec<ExpandError>,
) -> Table {
    let mut s = Table::new();
    let Some(spec) = m.source() else { return s };
    match &spec.imp {
        SourceImpl::Builtin(kind) => {
            s.insert("type".into(), Value::String((*kind).into()));
            for c in &spec.config {
                if let Some(v) = settings.get(c).filter(|v| !is_unset(v)) {
                    s.insert(c.clone(), v.clone());
                }
            }
        }
        SourceImpl::Fixed(_) | SourceImpl::Settings => {
            s.insert("type".into(), Value::String("template".into()));
            if let SourceImpl::Fixed(fixed) = &spec.imp {
                for (k, v) in fixed {
                    s.insert(k.clone(), v.clone());
                }
            }
            for (name, v) in settings {
                if template_keys::template_key(name).is_some()
                    && !template_keys::is_unset_template_value(name, v)
                {
                    s.insert(name.clone(), v.clone());
                }
            }
            if let Some(r) = spec.sender_retries
                && !s.contains_key("sender_retries")
            {
                s.insert("sender_retries".into(), Value::Boolean(r));
            }
        }
    }
    if !secrets.is_empty() {
        s.insert("secrets".into(), Value::Table(secrets.clone()));
    }
    match (table.get("span"), &spec.span) {
        (Some(v), _) => {
            s.insert("span".into(), v.clone());
        }
        (None, Some(span)) => {
            s.insert("span".into(), Value::String(span.clone()));
        }
        (None, None) => {}
    }
    for k in SOURCE_OVERRIDES {
        if let Some(v) = table.get(*k) {
            s.insert((*k).into(), v.clone());
        }
    }
    rule_1_expect(prefix, instance, table, m, &mut s, errors);
    s
}

/// Rule 1 (liveness): an explicit `expect_every_s` wins; `expect = true` applies the
/// manifest's.
fn rule_1_expect(
    prefix: &str,
    instance: &str,
    table: &Table,
    m: &Manifest,
    s: &mut Table,
    errors: &mut Vec<ExpandError>,
) {
    let expect = match table.get("expect") {
        None => false,
        Some(Value::Boolean(b)) => *b,
        Some(_) => {
            errors.push(err(
                &format!("{prefix}.expect"),
                "must be true or false; write expect = true to apply the bobbin's expect_every_s",
            ));
            false
        }
    };
    if let Some(v) = table.get("expect_every_s") {
        s.insert("expect_every_s".into(), v.clone());
    } else if expect {
        match m.source().and_then(|s| s.expect_every_s) {
            Some(e) => {
                s.insert("expect_every_s".into(), Value::Integer(e as i64));
            }
            None => errors.push(err(&format!("{prefix}.expect"), format!("{} recommends no expect_every_s; write expect_every_s = <seconds> in [bobbins.{instance}] instead", m.name))),
        }
    }
}

/// 14.4's `sources.<i>` for a poll bobbin: `type = "poll"`, the schedule (the manifest's
/// `every_s` and `jitter_s`, each overridable by the instance within the manifest's bounds),
/// an immediate span and the secrets; the action is rule 2's `script:<i>`.
fn rule_poll_source(
    prefix: &str,
    table: &Table,
    m: &Manifest,
    secrets: &Table,
    errors: &mut Vec<ExpandError>,
) -> Table {
    use super::manifest::{POLL_EVERY_S_MIN, POLL_JITTER_S_MAX, default_jitter_s};
    let mut s = Table::new();
    let super::manifest::Body::Poll(p) = &m.body else {
        return s;
    };
    let bounded = |key: &str, lo: u64, hi: u64, errors: &mut Vec<ExpandError>| -> Option<u64> {
        let v = table.get(key)?.as_integer()?;
        if v < lo as i64 || v > hi as i64 {
            let hi_text = if hi == u32::MAX as u64 {
                "".to_string()
            } else {
                format!(" to {hi}")
            };
            errors.push(err(
                &format!("{prefix}.{key}"),
                format!(
                    "a whole number of seconds from {lo}{hi_text}; write e.g. {key} = {}",
                    if key == "every_s" {
                        p.every_s
                    } else {
                        p.jitter_s
                    }
                ),
            ));
            return None;
        }
        Some(v as u64)
    };
    let every_s =
        bounded("every_s", POLL_EVERY_S_MIN, u32::MAX as u64, errors).unwrap_or(p.every_s);
    // An instance that changes every_s but not jitter_s gets the default jitter of its own
    // period unless the manifest fixed one.
    let jitter_s =
        bounded("jitter_s", 0, POLL_JITTER_S_MAX, errors).unwrap_or(if !p.jitter_given {
            default_jitter_s(every_s)
        } else {
            p.jitter_s
        });
    s.insert("type".into(), Value::String(POLL_KIND.into()));
    s.insert("every_s".into(), Value::Integer(every_s as i64));
    s.insert("jitter_s".into(), Value::Integer(jitter_s as i64));
    s.insert("span".into(), Value::String("immediate".into()));
    if !secrets.is_empty() {
        s.insert("secrets".into(), Value::Table(secrets.clone()));
    }
    s
}

/// Rules 2-6: the processor's (or poller's) script destination.
#[allow(clippy::too_many_arguments)]
fn rule_2_destination(
    prefix: &str,
    instance: &str,
    table: &Table,
    entry: &Entry,
    settings: &BTreeMap<String, Value>,
    secrets: &Table,
    outputs: &BTreeMap<OutputKey, String>,
    rest: &Table,
    catalog: &Catalog,
    home: &Path,
    errors: &mut Vec<ExpandError>,
) -> Table {
    let m = &entry.manifest;
    let Some(p) = m.runner() else {
        return Table::new();
    };
    let mut d = Table::new();
    d.insert("processor".into(), Value::String(instance.into()));
    d.insert(
        "timeout_s".into(),
        table
            .get("timeout_s")
            .cloned()
            .unwrap_or(Value::Integer(p.timeout_s as i64)),
    );
    d.insert(
        "max_inflight".into(),
        Value::Integer(PROCESSOR_MAX_INFLIGHT),
    );
    match (table.get("state_dir"), p.state) {
        (Some(v), true) => match v.as_str() {
            Some(dir) if dir.starts_with('/') => {
                d.insert("state_dir".into(), v.clone());
            }
            _ => errors.push(err(&format!("{prefix}.state_dir"), format!("an absolute directory, private to the service user (mode 0700); write state_dir = \"{}\"", home.join(STATE_DIR).join(instance).display()))),
        },
        (Some(_), false) => errors.push(err(&format!("{prefix}.state_dir"), format!("{}'s processor keeps no state; remove state_dir", m.name))),
        (None, true) => {
            d.insert("state_dir".into(), Value::String(home.join(STATE_DIR).join(instance).display().to_string()));
        }
        (None, false) => {}
    }
    let json = |v: serde_json::Value| Value::String(v.to_string());
    let mut env = Table::new();
    // Rule 3.
    env.insert("HOOKSPOOL_BOBBIN".into(), Value::String(m.name.to_string()));
    env.insert(
        "HOOKSPOOL_BOBBIN_INSTANCE".into(),
        Value::String(instance.into()),
    );
    env.insert(
        "HOOKSPOOL_BOBBIN_DIR".into(),
        Value::String(entry.run_dir(home).display().to_string()),
    );
    // Rule 4.
    let settings_json: serde_json::Map<String, serde_json::Value> = settings
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                serde_json::to_value(v).unwrap_or(serde_json::Value::Null),
            )
        })
        .collect();
    env.insert(
        "HOOKSPOOL_SETTINGS".into(),
        json(serde_json::Value::Object(settings_json)),
    );
    // Rule 5.
    let routes_json: serde_json::Map<String, serde_json::Value> = outputs
        .iter()
        .map(|(k, v)| (k.as_str().to_string(), serde_json::Value::String(v.clone())))
        .collect();
    env.insert(
        "HOOKSPOOL_DELTA_ROUTES".into(),
        json(serde_json::Value::Object(routes_json)),
    );
    // Rule 6.
    let refs_json: serde_json::Map<String, serde_json::Value> = secrets
        .iter()
        .filter(|(name, _)| m.secrets.get(*name).is_some_and(|s| s.processor))
        .map(|(k, v)| {
            (
                k.clone(),
                serde_json::to_value(v).unwrap_or(serde_json::Value::Null),
            )
        })
        .collect();
    env.insert(
        "HOOKSPOOL_SECRET_REFS".into(),
        json(serde_json::Value::Object(refs_json)),
    );
    d.insert("env".into(), Value::Table(env));
    // The processor reaches the network only when it calls the provider's API, which the
    // manifest says by naming that API's reference ([provider] api_docs, 14.3.2).
    let mut sandbox = Table::new();
    sandbox.insert("network".into(), Value::Boolean(processor_calls_api(m)));
    d.insert("sandbox".into(), Value::Table(sandbox));
    for (k, dest) in outputs {
        if !destination_exists(dest, rest, catalog) {
            errors.push(err(&format!("{prefix}.outputs.{}", k.as_str()), format!("no destination {dest:?}; write \"hermes:<route>\", add [destinations.\"{dest}\"], or name another processor instance's script:<instance>")));
        }
    }
    d
}

/// The network rule of a processor's sandbox: on when the manifest names the provider's
/// API reference (`[provider] api_docs`, required exactly when the processor calls that
/// API), off otherwise.
pub fn processor_calls_api(m: &Manifest) -> bool {
    m.provider
        .get(super::provider::ProviderKey::ApiDocs)
        .is_some_and(|u| !u.trim().is_empty())
}

/// A processor output's destination exists: an implicit `hermes:<route>`, a
/// `[destinations.*]` table of the file, or another processor instance's `script:<j>`.
fn destination_exists(dest: &str, rest: &Table, catalog: &Catalog) -> bool {
    if dest.strip_prefix("hermes:").is_some_and(|r| !r.is_empty()) {
        return true;
    }
    if rest
        .get("destinations")
        .and_then(Value::as_table)
        .is_some_and(|d| d.contains_key(dest))
    {
        return true;
    }
    let Some(j) = dest.strip_prefix("script:") else {
        return false;
    };
    rest.get("bobbins")
        .and_then(Value::as_table)
        .and_then(|b| b.get(j))
        .and_then(|t| t.get("bobbin"))
        .and_then(Value::as_str)
        .and_then(|n| catalog.get(n))
        .is_some_and(|e| e.manifest.processor().is_some())
}

/// Rule 7 with a processor: a non-tee file route on the instance must go through it.
fn rule_7_no_bypass(instance: &str, rest: &Table, errors: &mut Vec<ExpandError>) {
    let script = Expansion::script_name(instance);
    for (i, r) in file_routes(rest).iter().enumerate() {
        let on_instance = r.get("source").and_then(Value::as_str) == Some(instance);
        let tee = r.get("tee").and_then(Value::as_bool).unwrap_or(false);
        let dest = r.get("destination").and_then(Value::as_str);
        if on_instance && !tee && dest != Some(script.as_str()) {
            errors.push(err(&format!("routes[{i}].destination"), format!("source {instance} is a processor bobbin instance: a route to another destination would bypass its processor; write destination = \"{script}\", make it tee = true, or map the output in [bobbins.{instance}] outputs")));
        }
    }
}

/// Rule 7 without a processor: the source's action and the generated routes.
fn rule_7_routes(
    prefix: &str,
    instance: &str,
    m: &Manifest,
    outputs: &BTreeMap<OutputKey, String>,
    source: &Table,
    errors: &mut Vec<ExpandError>,
) -> (Option<String>, Vec<Table>) {
    let key = format!("{prefix}.outputs");
    let named: Vec<(&String, &String)> = outputs
        .iter()
        .filter_map(|(k, d)| match k {
            OutputKey::Event(e) => Some((e, d)),
            OutputKey::All => None,
        })
        .collect();
    let Some(all) = outputs.get(&OutputKey::All) else {
        let only = m.outputs.keys().next().filter(|_| m.outputs.len() == 1);
        return match (named.as_slice(), only) {
            ([(e, d)], Some(OutputKey::Event(declared))) if *e == declared => {
                (Some((*d).clone()), Vec::new())
            }
            ([], _) => {
                errors.push(err(
                    &key,
                    format!(
                        "map where events go; write outputs = {{ \"*\" = \"hermes:{instance}\" }}"
                    ),
                ));
                (None, Vec::new())
            }
            _ => {
                errors.push(err(&key, format!("with more than one output, \"*\" must be mapped too, so no event reaches a route without an action; add \"*\" = \"hermes:{instance}\"")));
                (None, Vec::new())
            }
        };
    };
    let mut routes = Vec::new();
    if !named.is_empty() {
        rule_7_attrs(prefix, m, source, errors);
    }
    for (event, dest) in named {
        let mut r = Table::new();
        r.insert("name".into(), Value::String(format!("{instance}-{event}")));
        r.insert("source".into(), Value::String(instance.into()));
        let mut matcher = Table::new();
        matcher.insert("event_type".into(), Value::String(event.clone()));
        r.insert("match".into(), Value::Table(matcher));
        r.insert("destination".into(), Value::String(dest.clone()));
        routes.push(r);
    }
    (Some(all.clone()), routes)
}

/// Routes match attrs: a template source that gets event-type routes must expose
/// `attrs.event_type`, the same selector as its `event_type` (14.3.2a). Built-in sources
/// always do.
fn rule_7_attrs(prefix: &str, m: &Manifest, source: &Table, errors: &mut Vec<ExpandError>) {
    let Some(spec) = m.source() else { return };
    if matches!(spec.imp, SourceImpl::Builtin(_)) {
        return;
    }
    let event_type = source.get("event_type").and_then(Value::as_str);
    let attr = source
        .get("attrs")
        .and_then(Value::as_table)
        .and_then(|a| a.get("event_type"))
        .and_then(Value::as_str);
    let want = event_type.unwrap_or("<the event_type selector>");
    let key = if m.is_settings_template() {
        format!("{prefix}.settings.attrs")
    } else {
        format!("{prefix}.outputs")
    };
    match (event_type, attr) {
        (_, None) => errors.push(err(&key, format!("event-type outputs become routes that match attrs.event_type, which this source does not set; write settings.attrs = {{ event_type = \"{want}\" }} (and settings.event_type)"))),
        (None, Some(_)) => errors.push(err(&format!("{prefix}.settings.event_type"), format!("attrs.event_type is set but event_type is not; write settings.event_type = {:?}", attr.unwrap_or_default()))),
        (Some(e), Some(a)) if e != a => errors.push(err(&key, format!("attrs.event_type must be the event_type selector, or the routes match other events than their names say; write attrs = {{ event_type = \"{e}\" }}"))),
        _ => {}
    }
}

/// Rule 8 (collisions): an explicit table or route the expansion would write.
fn rule_8_collisions(
    instance: &str,
    rest: &Table,
    routes: &[Table],
    has_destination: bool,
    errors: &mut Vec<ExpandError>,
) {
    if rest
        .get("sources")
        .and_then(Value::as_table)
        .is_some_and(|s| s.contains_key(instance))
    {
        errors.push(err(&format!("sources.{instance}"), format!("[bobbins.{instance}] already defines this source; remove [sources.{instance}] or rename the instance")));
    }
    let script = Expansion::script_name(instance);
    if has_destination
        && rest
            .get("destinations")
            .and_then(Value::as_table)
            .is_some_and(|d| d.contains_key(&script))
    {
        errors.push(err(&format!("destinations.\"{script}\""), format!("[bobbins.{instance}] already defines this destination for its processor; remove the table (set timeout_s or state_dir in [bobbins.{instance}] instead)")));
    }
    let own = file_routes(rest);
    for r in routes {
        let Some(name) = r.get("name").and_then(Value::as_str) else {
            continue;
        };
        if let Some(i) = own
            .iter()
            .position(|o| o.get("name").and_then(Value::as_str) == Some(name))
        {
            errors.push(err(&format!("routes[{i}].name"), format!("{name} is the route [bobbins.{instance}] generates for that output; rename this route or drop the output from the instance")));
        }
    }
}

fn file_routes(rest: &Table) -> Vec<&Table> {
    rest.get("routes")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_table).collect())
        .unwrap_or_default()
}

fn names<'a>(it: impl Iterator<Item = &'a str>) -> String {
    let v: Vec<&str> = it.collect();
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}
