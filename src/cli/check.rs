//! `hookspool check [--explain-sandbox <destination>]` and `hookspool reload` (spec 15, 16).
//!
//! check = the config loaded strictly (unknown keys are errors) plus everything the spec
//! asks check to look at beyond the file itself: every source builds; every secret
//! reference resolves, with its file mode (group/other access is a warning) and env
//! references noted as not rotating; no auth header in keep_headers; every route's and
//! tee's destination exists and each destination type's own `problems()`; quiet_s <= max_s
//! (warning); max_bytes <= 0.75 x the destination's max_body_bytes and source
//! max_body_bytes <= route max_bytes; the dedup window against retention (the config's own
//! warning); Hermes subscriptions for every hermes destination a route feeds; the alert
//! command; and PRAGMA quick_check on the database. Exit 2 when anything is an error. Every
//! finding names the file, the key, and what to write instead.
//!
//! reload = check, then touch the config file so the intake and the dispatcher (which watch
//! its mtime) reload together.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use clap::Args;
use serde::Serialize;
use serde_json::json;

use super::{Ctx, EXIT_CONFIG, Exit};
use crate::config::{self, Config, DestinationConfig, SecretRef, SecretRefs, SourceConfig};
use crate::destinations::script::{ScriptConfig, ScriptDestination};
use crate::destinations::{HermesConfig, HttpConfig, hermes};
use crate::sources;
use crate::store::{self, Role, Store};

/// A batch must fit the destination's body limit with room for the document's envelope
/// (spec 5, 15): max_bytes <= 0.75 x destination.max_body_bytes.
pub const MAX_BYTES_BODY_SHARE: f64 = 0.75;
/// Secret files should be readable by their owner only.
const SECRET_MODE_OTHERS_MASK: u32 = 0o077;

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Print the sandbox a script destination's runs get, and nothing else.
    #[arg(long, value_name = "DESTINATION")]
    pub explain_sandbox: Option<String>,
    /// Run small scripts through the script sandbox on this host and print, probe by probe,
    /// whether each restriction holds (the spool home denied, no capabilities, ...).
    #[arg(long)]
    pub sandbox_selftest: bool,
}

/// One finding: where, and what to do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub key: String,
    pub message: String,
}

/// Everything check found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    pub file: String,
    pub errors: Vec<Finding>,
    pub warnings: Vec<Finding>,
    pub notes: Vec<Finding>,
}

impl Report {
    fn error(&mut self, key: impl Into<String>, message: impl Into<String>) {
        self.errors.push(Finding {
            key: key.into(),
            message: message.into(),
        });
    }
    fn warn(&mut self, key: impl Into<String>, message: impl Into<String>) {
        self.warnings.push(Finding {
            key: key.into(),
            message: message.into(),
        });
    }
    fn note(&mut self, key: impl Into<String>, message: impl Into<String>) {
        self.notes.push(Finding {
            key: key.into(),
            message: message.into(),
        });
    }
}

pub fn check(ctx: &Ctx, a: CheckArgs) -> Result<(), Exit> {
    if let Some(name) = a.explain_sandbox {
        return explain(ctx, &name);
    }
    if a.sandbox_selftest {
        return super::selftest::run(ctx);
    }
    let report = run_checks(ctx);
    print_report(ctx, &report);
    if report.errors.is_empty() {
        Ok(())
    } else {
        Err(Exit::new(
            EXIT_CONFIG,
            format!(
                "check found {} error(s) in {}",
                report.errors.len(),
                report.file
            ),
        ))
    }
}

pub fn reload(ctx: &Ctx) -> Result<(), Exit> {
    let report = run_checks(ctx);
    if !report.errors.is_empty() {
        print_report(ctx, &report);
        return Err(Exit::new(
            EXIT_CONFIG,
            format!(
                "not reloaded: check found {} error(s) in {}; the running processes keep their config",
                report.errors.len(),
                report.file
            ),
        ));
    }
    let (path, _) = ctx.inputs.config_path();
    let f = std::fs::File::options()
        .append(true)
        .open(&path)
        .map_err(|e| {
            Exit::new(
                EXIT_CONFIG,
                format!(
                    "{}: {e}; there is no config file to reload (the defaults are in use)",
                    path.display()
                ),
            )
        })?;
    f.set_modified(std::time::SystemTime::now())?;
    if ctx.json {
        ctx.print_json(&json!({"reloaded": path, "warnings": report.warnings}));
    } else {
        for w in &report.warnings {
            say!(ctx, "warning: {}: {}: {}", report.file, w.key, w.message);
        }
        say!(
            ctx,
            "{} checked and touched: the intake and the dispatcher reload it within seconds",
            path.display()
        );
    }
    Ok(())
}

fn print_report(ctx: &Ctx, r: &Report) {
    if ctx.json {
        ctx.print_json(&json!({
            "ok": r.errors.is_empty(),
            "file": r.file,
            "errors": r.errors,
            "warnings": r.warnings,
            "notes": r.notes,
        }));
        return;
    }
    for (label, list) in [
        ("error", &r.errors),
        ("warning", &r.warnings),
        ("note", &r.notes),
    ] {
        for f in list {
            say!(ctx, "{label}: {}: {}: {}", r.file, f.key, f.message);
        }
    }
    if r.errors.is_empty() {
        say!(
            ctx,
            "{}: ok ({} warning(s), {} note(s))",
            r.file,
            r.warnings.len(),
            r.notes.len()
        );
    }
}

/// All checks; never fails itself (every problem becomes a finding).
pub fn run_checks(ctx: &Ctx) -> Report {
    let (path, explicit) = ctx.inputs.config_path();
    let mut r = Report {
        file: if explicit || path.exists() {
            path.display().to_string()
        } else {
            format!("{} (absent: defaults)", path.display())
        },
        ..Report::default()
    };
    let c = match config::load(&ctx.inputs, true) {
        Ok((c, warnings)) => {
            for w in warnings {
                r.warn(w.key, w.message);
            }
            c
        }
        Err(e) => {
            for p in e.problems {
                r.error(p.key, p.message);
            }
            return r;
        }
    };
    check_config(&c, &mut r);
    check_database(&c, &mut r);
    r
}

/// The checks that need the validated config but not the database.
pub fn check_config(c: &Config, r: &mut Report) {
    let mut fed: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, s) in &c.sources {
        check_source(c, name, s, r, &mut fed);
    }
    // check_source recorded every route of every source (a route of an unknown source is
    // already a config error) and each source's action.
    let names: BTreeSet<&String> = c.destinations.keys().chain(fed.keys()).collect();
    for name in names {
        check_destination(c, name, c.destinations.get(name), fed.get(name), r);
    }
    if let Some(program) = c.alerts.argv.first()
        && which(program).is_none()
    {
        r.warn(
            "alerts.argv",
            format!("{program:?} is not found (no such file, or not in PATH): alerts will fail until it exists; write argv = [\"/usr/bin/logger\", \"-t\", \"hookspool\"] or your chat sender's path"),
        );
    }
}

fn check_source(
    c: &Config,
    name: &str,
    s: &SourceConfig,
    r: &mut Report,
    fed: &mut BTreeMap<String, Vec<String>>,
) {
    let key = format!("sources.{name}");
    let src = match sources::build(name, &s.kind, &s.options) {
        Ok(src) => src,
        Err(e) => {
            r.error(&key, e.to_string());
            return;
        }
    };
    // Secrets: every one the source reads is configured and resolvable (for a source that
    // needs any one of them, at least one); none extra.
    let wanted: BTreeSet<&str> = src.declared().secrets.iter().copied().collect();
    let any_one = src.declared().secrets_needed == sources::SecretsNeeded::AnyOne;
    for w in &wanted {
        match s.secrets.get(*w) {
            Some(refs) => check_refs(&format!("{key}.secrets.{w}"), refs, r),
            None if any_one => {}
            None => r.error(
                format!("{key}.secrets.{w}"),
                format!("the {} source needs secret {w}; write secrets.{w} = {{ file = \"/etc/hookspool/secrets/{name}\" }}", s.kind),
            ),
        }
    }
    if any_one && !wanted.iter().any(|w| s.secrets.contains_key(*w)) {
        let names = src.declared().secrets;
        r.error(
            format!("{key}.secrets"),
            format!(
                "the {} source needs at least one of the secrets {}; write secrets.{} = {{ file = \"/etc/hookspool/secrets/{name}\" }}",
                s.kind,
                names.join(", "),
                names.first().copied().unwrap_or("secret")
            ),
        );
    }
    for extra in s.secrets.keys() {
        if !wanted.contains(extra.as_str()) {
            r.warn(
                format!("{key}.secrets.{extra}"),
                format!(
                    "the {} source does not read a secret named {extra}; remove it (it reads: {})",
                    s.kind,
                    wanted.iter().copied().collect::<Vec<_>>().join(", ")
                ),
            );
        }
    }
    // auth_headers never stored (spec 10).
    for h in &s.keep_headers {
        if src
            .declared()
            .auth_headers
            .iter()
            .any(|a| a.eq_ignore_ascii_case(h))
        {
            r.error(
                format!("{key}.keep_headers"),
                format!("{h} is an authentication header of this source and is never stored; remove it from keep_headers"),
            );
        }
    }
    // Windows and bounds for the implicit route and every route of this source.
    let span = Some(src.declared().span);
    let routes: Vec<(String, Option<&config::RouteConfig>, Option<String>)> =
        std::iter::once((key.clone(), None, s.action.clone()))
            .chain(
                c.routes
                    .iter()
                    .enumerate()
                    .filter(|(_, rt)| rt.source == name)
                    .map(|(i, rt)| {
                        (
                            format!("routes[{i}]"),
                            Some(rt),
                            rt.destination.clone().or_else(|| s.action.clone()),
                        )
                    }),
            )
            .collect();
    let has_destination = s.action.is_some()
        || c.routes
            .iter()
            .any(|rt| rt.source == name && !rt.tee && rt.destination.is_some());
    if !has_destination {
        r.warn(
            &key,
            format!("no action and no route with a destination: unless the {} type names one per event, its events are quarantined; write action = \"hermes:{name}\" or add a [[routes]] entry", s.kind),
        );
    }
    for (rkey, route, destination) in routes {
        let w = config::resolve_window_with_span(&c.spans, &c.coalesce, s, route, span);
        if w.max_s > 0.0 && w.quiet_s > w.max_s && route.is_some() {
            r.warn(
                &rkey,
                format!("quiet_s {} > max_s {}: the quiet window never closes a batch before max_s; lower quiet_s or raise max_s", w.quiet_s, w.max_s),
            );
        }
        if route.is_some() && s.max_body_bytes > w.max_bytes {
            r.error(
                format!("{rkey}.max_bytes"),
                format!("{} is below sources.{name}.max_body_bytes {}: one event could overflow a batch; write max_bytes = {} or lower the source's max_body_bytes", w.max_bytes, s.max_body_bytes, s.max_body_bytes),
            );
        }
        let Some(d) = destination else {
            continue;
        };
        fed.entry(d.clone()).or_default().push(rkey.clone());
        if let Some(body) = destination_body_bytes(c, &d) {
            let limit = (body as f64 * MAX_BYTES_BODY_SHARE).floor() as i64;
            if w.max_bytes > limit {
                r.error(
                    format!("{rkey}.max_bytes"),
                    format!("{} is over 0.75 x the max_body_bytes {body} of {d}: a full batch would be refused (413); write max_bytes = {limit} or raise the destination's max_body_bytes", w.max_bytes),
                );
            }
        }
    }
}

/// The body limit a destination accepts: its own, or [hermes]'s for hermes; none for a
/// script (stdin has no limit of this kind).
fn destination_body_bytes(c: &Config, name: &str) -> Option<i64> {
    match c.destinations.get(name) {
        Some(d) if d.kind == "script" => None,
        Some(d) => d.max_body_bytes,
        None if name.starts_with("hermes:") => Some(c.hermes.max_body_bytes),
        None => None,
    }
}

fn check_refs(key: &str, refs: &SecretRefs, r: &mut Report) {
    for (i, one) in refs.refs().into_iter().enumerate() {
        let k = if matches!(refs, SecretRefs::Many(_)) {
            format!("{key}[{i}]")
        } else {
            key.to_string()
        };
        check_ref(&k, one, r);
    }
}

fn check_ref(key: &str, one: &SecretRef, r: &mut Report) {
    if let Err(e) = one.resolve() {
        r.error(
            key,
            format!("{e}; create it (mode 0600, owned by the hookspool user) or fix the reference"),
        );
        return;
    }
    match one {
        SecretRef::Env { env } => r.note(
            key,
            format!("env {env} is read from the process environment, which does not change under a running process: a rotation needs a restart; a {{ file = \"...\" }} reference rotates without one"),
        ),
        SecretRef::File { file } => check_mode(key, file, r),
        SecretRef::EnvFile { env_file, .. } => check_mode(key, env_file, r),
    }
}

fn check_mode(key: &str, path: &Path, r: &mut Report) {
    if let Ok(m) = std::fs::metadata(path) {
        let mode = m.permissions().mode() & 0o777;
        if mode & SECRET_MODE_OTHERS_MASK != 0 {
            r.warn(
                key,
                format!(
                    "{} has mode {mode:04o}: group or others can read it; run chmod 600 {}",
                    path.display(),
                    path.display()
                ),
            );
        }
    }
}

fn check_destination(
    c: &Config,
    name: &str,
    d: Option<&DestinationConfig>,
    fed_by: Option<&Vec<String>>,
    r: &mut Report,
) {
    let key = format!("destinations.\"{name}\"");
    let Some(d) = d else {
        if let Some(route) = name.strip_prefix("hermes:") {
            let cfg = hermes_config(c, None);
            match cfg {
                Ok(cfg) => {
                    for p in hermes::check_route(&cfg, route) {
                        r.error(&key, p);
                    }
                }
                Err(e) => r.error(&key, e),
            }
        } else {
            let by = fed_by.map(|v| v.join(", ")).unwrap_or_default();
            r.error(
                &key,
                format!("not configured, but {by} deliver(s) to it; add [destinations.\"{name}\"] with type = \"http\" and url = \"https://...\" (or name it hermes:<route> / script:<name>)"),
            );
        }
        return;
    };
    match d.kind.as_str() {
        "http" => {
            let mut t = d.options.clone();
            t.remove("secret");
            t.remove("secret_previous");
            t.insert("timeout_s".into(), toml::Value::Float(d.timeout_s));
            if let Some(b) = d.max_body_bytes {
                t.insert("max_body_bytes".into(), toml::Value::Integer(b.max(0)));
            }
            match toml::Value::Table(t).try_into::<HttpConfig>() {
                Ok(h) => {
                    for p in h.problems() {
                        r.error(&key, p);
                    }
                }
                Err(e) => r.error(&key, e.message().to_string()),
            }
            for s in ["secret", "secret_previous"] {
                if let Some(v) = d.options.get(s) {
                    match v.clone().try_into::<SecretRefs>() {
                        Ok(refs) => check_refs(&format!("{key}.{s}"), &refs, r),
                        Err(_) => r.error(
                            format!("{key}.{s}"),
                            "not a secret reference; write { file = \"/etc/hookspool/secrets/...\" }, { env = \"NAME\" } or { env_file = \"...\", key = \"NAME\" }",
                        ),
                    }
                }
            }
        }
        "hermes" => match hermes_config(c, Some(d)) {
            Ok(cfg) => {
                let route = name.strip_prefix("hermes:").unwrap_or(name);
                let problems = if fed_by.is_some() {
                    hermes::check_route(&cfg, route)
                } else {
                    cfg.problems()
                };
                for p in problems {
                    r.error(&key, p);
                }
            }
            Err(e) => r.error(&key, e),
        },
        "script" => match ScriptConfig::from_options(&d.options, d.timeout_s) {
            Ok(s) => {
                for p in s.problems() {
                    r.error(&key, p);
                }
                if let Some(p) = s.argv.first()
                    && Path::new(p).is_absolute()
                    && !is_executable(Path::new(p))
                {
                    r.error(
                        format!("{key}.argv"),
                        format!(
                            "{p} does not exist or is not executable; install it or fix argv[0]"
                        ),
                    );
                }
                if let Some(f) = &s.env_file {
                    if std::fs::metadata(f).is_err() {
                        r.error(
                            format!("{key}.env_file"),
                            format!(
                                "{} cannot be read; create it (mode 0600) or remove env_file",
                                f.display()
                            ),
                        );
                    } else {
                        check_mode(&format!("{key}.env_file"), f, r);
                    }
                }
            }
            Err(e) => r.error(&key, e),
        },
        _ => {}
    }
    if fed_by.is_none() && !name.starts_with("script:") {
        r.note(&key, "no route or source action delivers to it");
    }
}

/// [hermes] merged with a destination's overrides, as the dispatcher builds it.
fn hermes_config(c: &Config, d: Option<&DestinationConfig>) -> Result<HermesConfig, String> {
    let mut t = toml::Table::new();
    t.insert("base_url".into(), c.hermes.base_url.clone().into());
    t.insert(
        "subscriptions_path".into(),
        c.hermes.subscriptions_path.display().to_string().into(),
    );
    t.insert(
        "timeout_s".into(),
        toml::Value::Float(d.map(|d| d.timeout_s).unwrap_or(c.hermes.timeout_s)),
    );
    t.insert(
        "max_body_bytes".into(),
        toml::Value::Integer(
            d.and_then(|d| d.max_body_bytes)
                .unwrap_or(c.hermes.max_body_bytes)
                .max(0),
        ),
    );
    t.insert(
        "legacy_signature".into(),
        toml::Value::Boolean(c.hermes.legacy_signature),
    );
    if let Some(d) = d {
        for (k, v) in &d.options {
            t.insert(k.clone(), v.clone());
        }
    }
    toml::Value::Table(t)
        .try_into::<HermesConfig>()
        .map_err(|e| e.message().to_string())
}

fn is_executable(p: &Path) -> bool {
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// argv[0] as the alert runner will find it: a path, or a PATH search.
fn which(program: &str) -> Option<PathBuf> {
    if program.contains('/') {
        let p = PathBuf::from(program);
        return is_executable(&p).then_some(p);
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(program))
            .find(|p| is_executable(p))
    })
}

/// Open the database the way the intake does (an older schema is an error) and
/// quick_check it.
fn check_database(c: &Config, r: &mut Report) {
    let key = format!("spool.db ({})", c.db.display());
    if let Err(e) = store::ensure_home(&c.home) {
        r.error(
            &key,
            format!("{e}; create the spool home (mode 0700) or fix spool.home"),
        );
        return;
    }
    match Store::open(
        &c.db,
        Role::Reader,
        std::time::Duration::from_secs(store::DEFAULT_BUSY_TIMEOUT_S),
    ) {
        Ok(s) => {
            if let Err(e) = s.quick_check() {
                r.error(&key, format!("{e}; restore from backup (hookspool export can save what is readable); never start fresh over it"));
            }
        }
        Err(e) => r.error(&key, e.to_string()),
    }
    if let Ok(m) = std::fs::metadata(&c.db) {
        let mode = m.permissions().mode() & 0o777;
        if mode & SECRET_MODE_OTHERS_MASK != 0 {
            r.warn(
                &key,
                format!(
                    "mode {mode:04o}: the spool holds payloads; run chmod 600 {}",
                    c.db.display()
                ),
            );
        }
    }
}

/// `check --explain-sandbox script:<name>`.
fn explain(ctx: &Ctx, name: &str) -> Result<(), Exit> {
    let c = ctx.config()?;
    let d = c.destinations.get(name).ok_or_else(|| {
        Exit::new(
            EXIT_CONFIG,
            format!("no [destinations.\"{name}\"] in the config"),
        )
    })?;
    if d.kind != "script" {
        return Err(Exit::new(
            EXIT_CONFIG,
            format!(
                "{name} is a {} destination; only script destinations run in the sandbox",
                d.kind
            ),
        ));
    }
    let cfg = ScriptConfig::from_options(&d.options, d.timeout_s)
        .map_err(|e| Exit::new(EXIT_CONFIG, format!("destinations.\"{name}\": {e}")))?;
    let text = ScriptDestination::new(name, cfg).explain(&c.home);
    if ctx.json {
        ctx.print_json(&json!({"destination": name, "explain": text}));
    } else {
        ctx.write_raw(text.as_bytes())?;
    }
    Ok(())
}
