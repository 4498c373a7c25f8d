//! `hookspool check [--explain-sandbox <destination>]` and `hookspool reload` (spec 15, 16).
//!
//! check = `config::parse` strictly (unknown keys are errors; every rule of the file itself
//! is that one validation, which the services run too at start and on reload), then what
//! the host holds for the config, as far as it validated when it has errors (every error of
//! a file in one run): every secret a source reads is referenced and resolves,
//! with its file mode (group/other access is a warning) and env references noted as not
//! rotating; an http destination's secret is a Standard Webhooks secret; Hermes
//! subscriptions for every hermes destination fed (named, a source type's default action,
//! or a bobbin processor's output: `Config::feeds`), `legacy_signature = false` warned, and a note where a document can exceed the
//! gateway's prompt cut; script programs and env files; the alert command; and PRAGMA
//! quick_check and the store's invariant checker on the database. For a `[bobbins.<i>]`
//! instance: its processor's state directory is private (0700, the service user's), the
//! code its processor or poller runs or loads is not group/other-writable and is root's or
//! the service user's, with each directory up to the bobbin root (14.3.6), its
//! processor's secrets resolve; a finding in an expanded table is reported at the instance key that made it. Exit 2
//! when anything is an error. Every finding names the file, the key, and what to write
//! instead.
//!
//! reload = check, then touch the config file so the intake and the dispatcher (which watch
//! its mtime) reload together.
//!
//! Must not: repeat a rule of the file (those live in `config`) or change anything but the
//! config file's mtime.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use clap::Args;
use serde::Serialize;
use serde_json::json;

use super::{Ctx, EXIT_CONFIG, Exit};
use crate::config::{
    self, Config, DestinationConfig, DestinationKind, DestinationSpec, SecretRef, SecretRefs,
    SourceConfig,
};
use crate::destinations::script::ScriptDestination;
use crate::destinations::{hermes, sign};
use crate::sources;
use crate::store::{self, Role, Store};

/// The gateway cuts an agent prompt at this many characters (the released Hermes gateway's
/// prompt limit); a larger document reaches the agent truncated.
pub const HERMES_PROMPT_CHARS_MAX: i64 = 4_000;
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
    let loaded = config::load_all(&ctx.inputs, true);
    for p in loaded.errors {
        r.error(p.key, p.message);
    }
    for w in loaded.warnings {
        r.warn(w.key, w.message);
    }
    // A config with errors is checked on as far as it validated (the tables with an error
    // are left out of it), so one run reports every error of the file, as a compiler does.
    let Some(c) = loaded.config else {
        return r;
    };
    check_config(&c, &mut r);
    check_instances(&c, &mut r);
    at_instance_keys(&c, &mut r);
    check_database(&c, &mut r);
    r
}

/// A finding about an expanded table is reported at the `[bobbins.<i>]` key that made it.
fn at_instance_keys(c: &Config, r: &mut Report) {
    for f in r
        .errors
        .iter_mut()
        .chain(r.warnings.iter_mut())
        .chain(r.notes.iter_mut())
    {
        f.key = c.bobbins.config_key(&f.key);
    }
}

/// What the host holds for each bobbin instance (spec 14.3.3): that a processor's state
/// directory is private: it keeps OAuth tokens in clear text, so mode 0700 and owned by the
/// user hookspool runs as; and that every file its processor or poller runs or loads, with
/// each directory up to the bobbin's root, is one only root or that user can change (14.3.6).
fn check_instances(c: &Config, r: &mut Report) {
    for (instance, o) in c.bobbins.iter() {
        if !o.processor {
            continue;
        }
        let key = format!("bobbins.{instance}");
        let script = c
            .destinations
            .get(&crate::bobbins::Expansion::script_name(instance))
            .map(|d| &d.spec);
        if let Some(DestinationSpec::Script(s)) = script {
            if let Some(dir) = &s.state_dir {
                check_state_dir(&format!("{key}.state_dir"), dir, &c.home, r);
            }
            // The code the dispatcher will run or load for the instance (14.3.6); a
            // built-in's copy under the home does not exist before its first batch.
            if let Some(dir) = s.env.get("HOOKSPOOL_BOBBIN_DIR") {
                for problem in crate::bobbins::catalog::check_run_dir_code(Path::new(dir)) {
                    r.error(&key, problem);
                }
            }
            // A deployment's hooks program (14.3.6): the same rules, up to /.
            if let Some(hooks) = s.processor_hooks()
                && let Err(why) = crate::bobbins::catalog::check_hooks(&hooks)
            {
                r.error(
                    format!("{key}.settings.hooks"),
                    format!("{why}; the dispatcher refuses to run the processor until it is fixed"),
                );
            }
        }
    }
}

/// A processor's state directory: absent (created 0700 at the first batch; outside the home
/// it must be writable under the unit's ReadWritePaths), or a directory of mode 0700 owned
/// by the user hookspool runs as.
fn check_state_dir(key: &str, dir: &Path, home: &Path, r: &mut Report) {
    use std::os::unix::fs::MetadataExt;
    let shown = dir.display();
    let Ok(m) = std::fs::symlink_metadata(dir) else {
        if !dir.starts_with(home) {
            r.note(key, format!("{shown} does not exist yet: it is created (mode 0700) at the first batch; outside the spool home, list it in the dispatcher unit's ReadWritePaths"));
        }
        return;
    };
    if !m.is_dir() {
        r.error(
            key,
            format!("{shown} is not a directory (a file or a symlink); remove it, or write state_dir = \"<a private directory>\""),
        );
        return;
    }
    let mode = m.permissions().mode() & 0o777;
    if mode & SECRET_MODE_OTHERS_MASK != 0 {
        r.error(
            key,
            format!("{shown} has mode {mode:04o}: the processor keeps OAuth tokens there in clear text; run chmod 700 {shown}"),
        );
    }
    let euid = nix::unistd::geteuid().as_raw();
    if m.uid() != euid {
        r.error(
            key,
            format!("{shown} is owned by uid {}, not by the user hookspool runs as (uid {euid}); run chown {euid} {shown}", m.uid()),
        );
    }
}

/// The checks that need the validated config but not the database: what the host holds
/// for it (secret files and their values, the gateway's subscriptions file, the programs a
/// script or the alerts run). The config's own rules were decided by `config::parse`.
pub fn check_config(c: &Config, r: &mut Report) {
    let mut fed: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, s) in &c.sources {
        // A bobbin instance's source also holds its processor's secrets (spec 14.3.2: "the
        // source gets it regardless"); the expansion refused any other name already.
        check_source_secrets(name, s, c.bobbins.get(name).is_none(), r);
        for f in c.feeds(s) {
            if let Some(d) = f.destination {
                fed.entry(d).or_default().push(f.key);
            }
        }
    }
    let names: BTreeSet<&String> = c.destinations.keys().chain(fed.keys()).collect();
    for name in names {
        if let Some(d) = c.destination(name) {
            check_destination(c, &d, fed.get(name), r);
        }
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
        // Their mode and where a link takes them: config::load's warnings (issue 28), which
        // the services log at start and on reload too.
        SecretRef::File { .. } | SecretRef::EnvFile { .. } => {}
    }
}

/// Every secret the source reads is configured and resolvable; none extra.
fn check_source_secrets(name: &str, s: &SourceConfig, warn_extra: bool, r: &mut Report) {
    let key = format!("sources.{name}");
    // The config built this source once already; building is pure.
    let Ok(src) = sources::build(name, &s.kind, &s.options) else {
        return;
    };
    // Every secret the source reads is configured (for a source that needs any one of
    // them, such as Standard Webhooks with a v1 secret or a v1a key, at least one).
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
    for (extra, refs) in &s.secrets {
        if wanted.contains(extra.as_str()) {
            continue;
        }
        if !warn_extra {
            // A processor's secret, read by the processor: it must resolve all the same.
            check_refs(&format!("{key}.secrets.{extra}"), refs, r);
        } else {
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
}

/// A destination whose host resolves into a range the egress policy refuses (issue 35),
/// unless its `allow_private` admits it: each delivery would fail as `config`. A warning,
/// because DNS may answer differently when the dispatcher connects (and the dispatcher
/// checks the address it connects to).
fn check_egress(key: &str, url_key: &str, url: &str, allow: &crate::egress::Allow, r: &mut Report) {
    let Ok(u) = url::Url::parse(url) else {
        return;
    };
    let policy = crate::egress::Policy::new(allow.clone());
    for refused in crate::egress::refused_now(&policy, &u) {
        r.warn(
            format!("{key}.{url_key}"),
            format!("the host is refused by the egress policy ({}): {refused}; until then every delivery fails as config", refused.rule.as_str()),
        );
    }
}

fn check_destination(
    c: &Config,
    d: &DestinationConfig,
    fed_by: Option<&Vec<String>>,
    r: &mut Report,
) {
    let name = d.name.as_str();
    let key = format!("destinations.\"{name}\"");
    match &d.spec {
        DestinationSpec::Http(h) => {
            check_egress(&key, "url", &h.http.url, &h.http.allow_private, r);
            check_refs(&format!("{key}.secret"), &h.secret, r);
            check_standard_secret(&format!("{key}.secret"), &h.secret, r);
            if let Some(p) = &h.secret_previous {
                check_refs(&format!("{key}.secret_previous"), p, r);
                check_standard_secret(&format!("{key}.secret_previous"), p, r);
            }
        }
        DestinationSpec::Hermes(h) => {
            check_egress(&key, "base_url", &h.base_url, &h.allow_private, r);
            let route = d.hermes_route().unwrap_or(name);
            if fed_by.is_some() {
                for p in hermes::check_route(h, route) {
                    r.error(&key, p);
                }
            }
            if !h.legacy_signature {
                r.warn(
                    format!("{key}.legacy_signature"),
                    "false: only webhook-signature is sent, and released Hermes gateways verify only X-Hub-Signature-256, so every delivery would be answered 401; remove legacy_signature (it defaults to true) unless your gateway verifies Standard Webhooks signatures",
                );
            }
            if !h.unwrap {
                for (route_key, w) in fed_windows(c, name) {
                    if w.max_bytes > HERMES_PROMPT_CHARS_MAX {
                        r.note(
                            &route_key,
                            format!("max_bytes {} lets a document to {name} exceed {HERMES_PROMPT_CHARS_MAX} characters, where the gateway cuts an agent prompt: the agent may see only the start of a large batch; lower max_bytes or max_events, or have the route's prompt read only the summary", w.max_bytes),
                        );
                    }
                }
            }
        }
        DestinationSpec::Script(s) => {
            if let Some(p) = s.argv.first()
                && Path::new(p).is_absolute()
                && !is_executable(Path::new(p))
            {
                r.error(
                    format!("{key}.argv"),
                    format!("{p} does not exist or is not executable; install it or fix argv[0]"),
                );
            }
            if let Some(f) = &s.env_file
                && std::fs::metadata(f).is_err()
            {
                r.error(
                    format!("{key}.env_file"),
                    format!(
                        "{} cannot be read; create it (mode 0600) or remove env_file",
                        f.display()
                    ),
                );
            }
        }
    }
    if fed_by.is_none() && d.kind() != DestinationKind::Script {
        r.note(&key, "no route or source action delivers to it");
    }
}

/// The window of every route that feeds `destination`, by its config key.
fn fed_windows(c: &Config, destination: &str) -> Vec<(String, crate::store::Window)> {
    c.sources
        .values()
        .flat_map(|s| {
            c.feeds(s)
                .into_iter()
                .filter(|f| f.destination.as_deref() == Some(destination))
                .map(|f| (f.key.clone(), c.window(s, f.route)))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// An http destination signs with a Standard Webhooks secret (spec 6.4): `whsec_` and the
/// base64 of at least 24 random bytes, as a standard receiver decodes it.
fn check_standard_secret(key: &str, refs: &SecretRefs, r: &mut Report) {
    for one in refs.refs() {
        let Ok(value) = one.resolve() else {
            continue; // check_refs reported it
        };
        if let Err(e) = sign::standard_secret(&value) {
            r.error(
                key,
                format!("{e}; make one with `hookspool secret new <file>` and point the reference at it (give the receiver the same whsec_ value)"),
            );
        }
    }
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
    if c.backend != crate::config::backend::Backend::Sqlite {
        return check_postgres(c, r);
    }
    let key = format!("spool.db ({})", c.db.display());
    if let Err(e) = store::ensure_home(&c.home) {
        r.error(
            &key,
            format!("{e}; create the spool home (mode 0700) or fix spool.home"),
        );
        return;
    }
    if let Some(w) = super::open_home_warning(&c.home) {
        r.warn("spool.home", w);
    }
    match Store::open(
        &c.db,
        Role::Reader,
        std::time::Duration::from_secs(store::DEFAULT_BUSY_TIMEOUT_S),
    ) {
        Ok(s) => {
            if let Err(e) = s.quick_check() {
                r.error(&key, format!("{e}; restore from backup (hookspool export can save what is readable); never start fresh over it"));
                return;
            }
            // The spool's own rules (counts, bytes, one open batch per group, frozen
            // content): a break is a bug to report, with the batch it concerns.
            match s.check_invariants() {
                Ok(broken) => {
                    for b in broken {
                        r.error(&key, format!("{b}: a spool invariant is broken; keep the file, export it (hookspool export) and report it"));
                    }
                }
                Err(e) => r.error(&key, format!("the invariant check could not run: {e}")),
            }
        }
        // A full disk (or a writer holding the lock) is weather, not a config mistake: the
        // services wait it out, so check (every unit's ExecStartPre) must not fail the start.
        Err(e) if e.is_weather() => r.warn(
            &key,
            format!(
                "{e}: the spool cannot be opened now; the services start and wait for it (free space on the spool's filesystem, {})",
                c.home.display()
            ),
        ),
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

/// Connect to the PostgreSQL spool the way the intake will (an older schema, or none, is an
/// error) and say in one line what is wrong: the URL's reference, the connection (its
/// target as user@host:port/db, never the password), or the schema.
fn check_postgres(c: &Config, r: &mut Report) {
    let key = "spool.url";
    let url = match super::pg_url(c) {
        Ok(Some(u)) => u,
        Ok(None) => return,
        Err(e) => return r.error(key, e.message),
    };
    match store::pg::PgStore::open(&url, Role::Reader) {
        Ok(mut s) => {
            let tls = match s.session_tls() {
                Ok(true) => "over TLS",
                Ok(false) => "without TLS",
                Err(_) => "TLS unknown",
            };
            r.note(
                key,
                format!(
                    "PostgreSQL spool at {} ({tls}): schema {}, the one this hookspool knows",
                    s.target(),
                    store::pg::PG_SCHEMA_VERSION
                ),
            )
        }
        Err(store::StoreError::SchemaTooOld { found: 0, .. }) => r.error(
            key,
            "the PostgreSQL database holds no hookspool schema (not migrated): run hookspool migrate, or hookspool spool copy --to postgres:FILE to move an SQLite spool into it",
        ),
        Err(e) if e.is_weather() => r.warn(
            key,
            format!("{e}: the services wait for it; check the server and the URL's host and port"),
        ),
        Err(e) => r.error(key, e.to_string()),
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
    let DestinationSpec::Script(cfg) = &d.spec else {
        return Err(Exit::new(
            EXIT_CONFIG,
            format!(
                "{name} is a {} destination; only script destinations run in the sandbox",
                d.kind().as_str()
            ),
        ));
    };
    let text = ScriptDestination::new(name, cfg.clone()).explain(&c.home);
    if ctx.json {
        ctx.print_json(&json!({"destination": name, "explain": text}));
    } else {
        ctx.write_raw(text.as_bytes())?;
    }
    Ok(())
}
