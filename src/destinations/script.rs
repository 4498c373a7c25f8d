//! The `script` destination (spec 6.6, 14.2): run the configured argv in the sandbox with the
//! batch document on stdin and HOOKSPOOL_BATCH_ID / HOOKSPOOL_DELIVERY_ID (and
//! HOOKSPOOL_STATE_DIR when configured) in the environment, then map how it ended to an
//! [`Outcome`] and parse its `{"enqueue": {...}}` emit lines.
//!
//! Mapping: exit 0 → ok with emits; exit 65 → dead/permanent; a processor's exit 78 →
//! retry/config ([`EXIT_PROCESSOR_CONFIG`]); a processor's exit 75 → retry/transport
//! ([`EXIT_PROCESSOR_RETRY`]); any other exit or a signal →
//! retry/batch; cannot start (ENOENT, EACCES, ...) or the deadline → retry/transport; stdout
//! over 1 MiB → retry/batch (never truncated: a cut tail would silently lose emits); an emit
//! line that is not valid → retry/batch with reason [`BAD_EMIT_REASON`], which the
//! dispatcher turns permanent on the second time ([`is_bad_emit`]).
//!
//! A bobbin instance's processor destination (`processor = "<i>"`, written by the config's
//! bobbin expansion, spec 14.3.3 step 2) replaces argv: the program is the running hookspool
//! binary, `[<current exe>, "processor", "<i>"]`, with the expansion's [`PROCESSOR_ENV`]
//! (the only `HOOKSPOOL_*` names a config may carry, and only here). Before it starts, the
//! bobbin's directory (`HOOKSPOOL_BOBBIN_DIR`) is made to exist (a built-in's copy under the
//! home is materialised from the binary) and the code its manifest runs or loads is checked
//! against 14.3.6's owner and mode rules (`bobbins::catalog::check_code`; a failure is the
//! config class, "bobbin code unsafe"); the sandbox grants read+execute on that directory
//! and read on the files of the secrets in `HOOKSPOOL_SECRET_REFS`, nothing else of the
//! home or of /etc/hookspool; its network is what the expansion's `sandbox.network` says.
//! The binary is found at the path it runs from even after a package upgrade replaced the
//! file ([`installed_exe`]); in `failpoints` builds only, the dispatcher's
//! HOOKSPOOL_TEST_PROVIDER_BASE is passed on (the tests' stub provider API).
//!
//! Must not: spawn anything except through `crate::sandbox`, touch the store, or put script
//! output or environment values into a log record or a `reason` (reasons are fixed phrases
//! and codes; the stderr tail goes to `detail` only, which is stored and never logged).
//! Idempotency is per batch and max_inflight is 1 (the config module's defaults).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::Value;

use super::outcome::{DETAIL_CHARS_MAX, Klass, Outcome, OutcomeKind};
use crate::sandbox::{self, ExitStatus, Limits, Policy, RunResult, SandboxError};

/// A script destination's `timeout_s` when the config leaves it out.
pub const SCRIPT_TIMEOUT_S_DEFAULT: f64 = crate::limits::SCRIPT_TIMEOUT_S_DEFAULT as f64;
/// Stdout beyond this fails the attempt (spec 14.2).
pub const SCRIPT_STDOUT_BYTES_MAX: usize = 1024 * 1024;
/// A processor's Permanent (spec 6.6): dead-letter at once.
pub const EXIT_PERMANENT: i32 = 65;
/// A processor's Config (EX_CONFIG): the operator must act on its credential or grant (a
/// missing scope, a revoked refresh token). The config class of spec 6.5, as a
/// destination's 401/403 is: retried uncounted at the backoff cap, a config:delivery issue,
/// due again at once after a successful reload. Only for a processor destination: any
/// other script's 78 is an ordinary retried exit, as spec 6.6 says.
pub const EXIT_PROCESSOR_CONFIG: i32 = 78;
/// A processor's Retryable (EX_TEMPFAIL): its provider is down or busy, or the network
/// failed (spec 14.3.4). That is weather, not a bad batch (issue 28): the transport class,
/// uncounted, so it never exhausts max_attempts and it feeds the breaker, whose probes
/// resume the instance once the provider is back. A processor's poison batch is still found
/// by the strike rule. Only for a processor destination: any other script's 75 is an
/// ordinary counted exit, as spec 6.6 says.
pub const EXIT_PROCESSOR_RETRY: i32 = 75;
/// The setting of a bobbin that supports hooks (spec 14.3.6): the path of its hooks program,
/// which the sandbox lets the processor read (`processor::hooks` loads it).
pub const HOOKS_SETTING: &str = "hooks";
/// The test builds' provider base (`processor::http`), passed through to a processor.
pub const TEST_PROVIDER_BASE_ENV: &str = "HOOKSPOOL_TEST_PROVIDER_BASE";
/// The reason of an attempt failed by an invalid emit line; see [`is_bad_emit`].
pub const BAD_EMIT_REASON: &str = "bad emit";
/// Mode of a state_dir hookspool creates: the script's own files.
const STATE_DIR_MODE: u32 = 0o700;
/// The subcommand of the hookspool binary that runs a bobbin's processor (spec 14.3.4).
pub const PROCESSOR_SUBCOMMAND: &str = "processor";
/// The environment a processor destination carries from its expansion (spec 14.3.3 steps
/// 3-6): every one is required, and these are the only `HOOKSPOOL_*` names a config's `env`
/// may hold, only with `processor`.
pub const PROCESSOR_ENV: &[&str] = &[
    "HOOKSPOOL_BOBBIN",
    "HOOKSPOOL_BOBBIN_INSTANCE",
    "HOOKSPOOL_BOBBIN_DIR",
    "HOOKSPOOL_SETTINGS",
    "HOOKSPOOL_DELTA_ROUTES",
    "HOOKSPOOL_SECRET_REFS",
];

fn default_timeout_s() -> f64 {
    SCRIPT_TIMEOUT_S_DEFAULT
}

fn default_true() -> bool {
    true
}

/// `[destinations."script:<name>"]`: the type-specific keys plus `timeout_s`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptConfig {
    /// The program and its arguments; empty for a processor destination.
    #[serde(default)]
    pub argv: Vec<String>,
    /// A bobbin instance whose processor runtime this destination runs, in place of argv.
    #[serde(default)]
    pub processor: Option<String>,
    #[serde(default)]
    pub cwd: Option<PathBuf>,
    /// `NAME=VALUE` lines read at every attempt (rotation without a restart).
    #[serde(default)]
    pub env_file: Option<PathBuf>,
    /// Merged over the env file; names `^[A-Z][A-Z0-9_]*$`, never `HOOKSPOOL_*` (except
    /// [`PROCESSOR_ENV`] with `processor`).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default = "default_timeout_s")]
    pub timeout_s: f64,
    /// Created (0700) when missing; passed as HOOKSPOOL_STATE_DIR and writable in the sandbox.
    #[serde(default)]
    pub state_dir: Option<PathBuf>,
    #[serde(default)]
    pub sandbox: SandboxConfig,
}

/// The per-destination `sandbox` table. The defaults are the safe ones.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxConfig {
    /// Extra read+execute paths (e.g. a virtualenv under /opt).
    #[serde(default)]
    pub read_paths: Vec<PathBuf>,
    /// Extra read+write paths besides state_dir.
    #[serde(default)]
    pub write_paths: Vec<PathBuf>,
    /// `false` runs the script in an empty network namespace.
    #[serde(default = "default_true")]
    pub network: bool,
    /// With network on and Landlock ABI 4+: TCP connect only to these ports.
    #[serde(default)]
    pub tcp_connect_ports: Option<Vec<u16>>,
    /// Refuse to run (config retry) when landlock or seccomp is unavailable.
    #[serde(default)]
    pub required: bool,
    #[serde(default)]
    pub limits: LimitsConfig,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        SandboxConfig {
            read_paths: Vec::new(),
            write_paths: Vec::new(),
            network: true,
            tcp_connect_ports: None,
            required: false,
            limits: LimitsConfig::default(),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    pub open_files: Option<u64>,
    /// Tasks beyond what the script's uid already runs (see `sandbox::Limits`).
    pub processes: Option<u64>,
    /// CPU seconds; default derived from the timeout.
    pub cpu_s: Option<u64>,
}

impl ScriptConfig {
    /// Builds the config from the config module's type-specific table and `timeout_s`.
    pub fn from_options(options: &toml::Table, timeout_s: f64) -> Result<ScriptConfig, String> {
        let mut table = options.clone();
        table.insert("timeout_s".into(), toml::Value::Float(timeout_s));
        toml::Value::Table(table)
            .try_into()
            .map_err(|e: toml::de::Error| e.message().to_string())
    }

    /// Problems for `hookspool check`, one sentence each.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        match (&self.processor, self.argv.first()) {
            (Some(_), Some(_)) => out.push(
                "processor replaces argv (the runtime is hookspool's own binary); remove argv"
                    .into(),
            ),
            (Some(i), None) => {
                for name in PROCESSOR_ENV {
                    if !self.env.contains_key(*name) {
                        out.push(format!("the processor of {i} needs env {name}, which the [bobbins.{i}] expansion writes; configure the instance as [bobbins.{i}]"));
                    }
                }
            }
            (None, None) => {
                out.push("argv is empty: write argv = [\"/path/to/script\", ...]".into())
            }
            (None, Some(p)) if !Path::new(p).is_absolute() => out.push(format!(
                "argv[0] {p:?} must be an absolute path (no PATH search)"
            )),
            (None, Some(_)) => {}
        }
        if !(self.timeout_s.is_finite() && self.timeout_s > 0.0) {
            out.push("timeout_s must be a positive number of seconds".into());
        }
        for name in self.env.keys() {
            if !valid_env_name(name) {
                out.push(format!("env name {name:?} must match ^[A-Z][A-Z0-9_]*$"));
            } else if !self.env_name_allowed(name) {
                out.push(format!(
                    "env name {name:?}: HOOKSPOOL_* variables are set by hookspool"
                ));
            }
        }
        let absolute = |p: &PathBuf| p.is_absolute();
        if self.state_dir.as_ref().is_some_and(|p| !absolute(p)) {
            out.push("state_dir must be an absolute path".into());
        }
        if self.cwd.as_ref().is_some_and(|p| !absolute(p)) {
            out.push("cwd must be an absolute path".into());
        }
        let sb = &self.sandbox;
        if sb
            .read_paths
            .iter()
            .chain(&sb.write_paths)
            .any(|p| !absolute(p))
        {
            out.push("sandbox read_paths and write_paths must be absolute".into());
        }
        out
    }
}

impl ScriptConfig {
    /// A name the config's `env` may carry: not `HOOKSPOOL_*`, except a processor's
    /// [`PROCESSOR_ENV`].
    fn env_name_allowed(&self, name: &str) -> bool {
        !name.starts_with("HOOKSPOOL_")
            || (self.processor.is_some() && PROCESSOR_ENV.contains(&name))
    }

    /// The program to start: argv, or for a processor the hookspool binary with
    /// `processor <instance>` ([`installed_exe`]).
    fn program(&self) -> std::io::Result<Vec<String>> {
        let Some(instance) = &self.processor else {
            return Ok(self.argv.clone());
        };
        let exe = installed_exe(&std::env::current_exe()?, |p| p.is_file())?;
        Ok(vec![
            exe.to_string_lossy().into_owned(),
            PROCESSOR_SUBCOMMAND.to_string(),
            instance.clone(),
        ])
    }

    /// A processor's outputs as the expansion wrote them (`HOOKSPOOL_DELTA_ROUTES`): event
    /// type (or `*`) -> the destination its items are emitted to. Empty for any other
    /// script.
    pub fn processor_outputs(&self) -> BTreeMap<String, String> {
        if self.processor.is_none() {
            return BTreeMap::new();
        }
        self.env
            .get("HOOKSPOOL_DELTA_ROUTES")
            .and_then(|j| serde_json::from_str(j).ok())
            .unwrap_or_default()
    }

    /// A processor's hooks program (spec 14.3.6): the `hooks` setting in
    /// `HOOKSPOOL_SETTINGS`, when the instance gives one.
    pub fn processor_hooks(&self) -> Option<PathBuf> {
        self.processor.as_ref()?;
        let settings: serde_json::Map<String, Value> = self
            .env
            .get("HOOKSPOOL_SETTINGS")
            .and_then(|j| serde_json::from_str(j).ok())?;
        settings
            .get(HOOKS_SETTING)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(PathBuf::from)
    }

    /// What a processor reads besides the system trees: its bobbin's directory, its hooks
    /// program, and the files behind the secrets it was given (`HOOKSPOOL_SECRET_REFS`),
    /// nothing else.
    fn processor_read_paths(&self) -> Vec<PathBuf> {
        if self.processor.is_none() {
            return Vec::new();
        }
        let mut out: Vec<PathBuf> = self
            .env
            .get("HOOKSPOOL_BOBBIN_DIR")
            .map(PathBuf::from)
            .into_iter()
            .chain(self.processor_hooks())
            .collect();
        let refs: BTreeMap<String, crate::secret::SecretRefs> = self
            .env
            .get("HOOKSPOOL_SECRET_REFS")
            .and_then(|j| serde_json::from_str(j).ok())
            .unwrap_or_default();
        for r in refs.values().flat_map(|r| r.refs()) {
            match r {
                crate::secret::SecretRef::File { file } => out.push(file.clone()),
                crate::secret::SecretRef::EnvFile { env_file, .. } => out.push(env_file.clone()),
                // Refused for a processor secret by the expansion: the child does not
                // inherit the dispatcher's environment.
                crate::secret::SecretRef::Env { .. } => {}
            }
        }
        out
    }
}

/// What Linux appends to `/proc/self/exe` once the running binary's file is unlinked.
const DELETED_SUFFIX: &str = " (deleted)";

/// The binary a processor runs: the running one, found at the path it was started from.
/// A package upgrade replaces that file (dpkg renames the new one over it), after which
/// `current_exe()` reads `<path> (deleted)`, a name nothing can start; the file now at
/// `<path>` is then the installed hookspool, the one the dispatcher runs after its restart,
/// so that is what the processor runs until then. `/proc/self/exe` is not used instead: the
/// sandbox grants read+execute on argv[0]'s directory, which would be the dispatcher's own
/// /proc entry, and not on the binary's real directory outside the system trees.
fn installed_exe(exe: &Path, exists: impl Fn(&Path) -> bool) -> std::io::Result<PathBuf> {
    if exists(exe) {
        return Ok(exe.to_path_buf());
    }
    let text = exe.to_string_lossy();
    if let Some(stripped) = text.strip_suffix(DELETED_SUFFIX)
        && exists(Path::new(stripped))
    {
        return Ok(PathBuf::from(stripped));
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::NotFound,
        format!("{text} was removed and nothing is installed in its place; restart the dispatcher"),
    ))
}

/// The stub provider's base URL, passed to a processor in `failpoints` builds only (the
/// script environment is minimal, and production builds have no such seam): see
/// `processor::http`.
#[cfg(feature = "failpoints")]
fn test_provider_base() -> Option<(String, String)> {
    let name = TEST_PROVIDER_BASE_ENV;
    std::env::var(name)
        .ok()
        .filter(|v| !v.is_empty())
        .map(|v| (name.to_string(), v))
}

#[cfg(not(feature = "failpoints"))]
fn test_provider_base() -> Option<(String, String)> {
    None
}

fn valid_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_uppercase())
        && chars.all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
}

/// One attempt's input, built by the dispatcher.
#[derive(Debug, Clone)]
pub struct ScriptDelivery {
    pub batch_id: i64,
    pub delivery_id: String,
    /// The rendered document, fed on stdin.
    pub body: Vec<u8>,
    /// The worker deadline (lease_until - 5 s).
    pub deadline: Instant,
    /// Denied to the script (database, WAL, config, secrets), except its state_dir.
    pub spool_home: PathBuf,
}

/// A configured `script:<name>` destination.
#[derive(Debug, Clone)]
pub struct ScriptDestination {
    name: String,
    cfg: ScriptConfig,
}

impl ScriptDestination {
    pub fn new(name: impl Into<String>, cfg: ScriptConfig) -> ScriptDestination {
        ScriptDestination {
            name: name.into(),
            cfg,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn config(&self) -> &ScriptConfig {
        &self.cfg
    }

    /// The policy without per-attempt values (no env file read, no state_dir created).
    fn base_policy(&self, argv: Vec<String>, spool_home: &Path, deadline: Instant) -> Policy {
        let sb = &self.cfg.sandbox;
        let mut p = Policy::new(argv, deadline);
        p.cwd = self.cfg.cwd.clone();
        p.stdout_cap_bytes = SCRIPT_STDOUT_BYTES_MAX;
        p.read_paths = sb.read_paths.clone();
        p.read_paths.extend(self.cfg.processor_read_paths());
        p.write_paths = self
            .cfg
            .state_dir
            .iter()
            .chain(&sb.write_paths)
            .cloned()
            .collect();
        p.deny_paths = vec![spool_home.to_path_buf()];
        p.network = sb.network;
        p.tcp_connect_ports = sb.tcp_connect_ports.clone();
        p.required = sb.required;
        let d = Limits::default();
        p.limits = Limits {
            open_files: sb.limits.open_files.unwrap_or(d.open_files),
            processes: sb.limits.processes.unwrap_or(d.processes),
            cpu_s: sb.limits.cpu_s,
        };
        p
    }

    /// `hookspool check --explain-sandbox script:<name>`.
    pub fn explain(&self, spool_home: &Path) -> String {
        let deadline = Instant::now() + timeout(self.cfg.timeout_s);
        let argv = self.cfg.program().unwrap_or_else(|_| self.cfg.argv.clone());
        let mut p = self.base_policy(argv, spool_home, deadline);
        p.env = self
            .cfg
            .env
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .chain(
                ["HOOKSPOOL_BATCH_ID", "HOOKSPOOL_DELIVERY_ID"]
                    .iter()
                    .map(|n| ((*n).to_string(), String::new())),
            )
            .collect();
        let mut text = format!("destination: {}\n", self.name);
        if let Some(file) = &self.cfg.env_file {
            text.push_str(&format!(
                "env file: {} (its variables are added at each attempt)\n",
                file.display()
            ));
        }
        text.push_str(&sandbox::explain(&p));
        text
    }

    /// One attempt. Never outlives `d.deadline` (the sandbox kills the process group).
    pub async fn deliver(&self, d: &ScriptDelivery) -> Outcome {
        let deadline = d.deadline.min(Instant::now() + timeout(self.cfg.timeout_s));
        let argv = match self.cfg.program() {
            Ok(argv) => argv,
            Err(e) => {
                return Outcome::retry(Klass::Transport, None, "cannot start script")
                    .with_detail(&format!("the running binary's path: {e}"));
            }
        };
        if let Err(outcome) = self.prepare_bobbin_dir(&d.spool_home).await {
            return outcome;
        }
        let mut policy = self.base_policy(argv, &d.spool_home, deadline);
        policy.stdin = d.body.clone();
        match self.attempt_env(d).await {
            Ok(env) => policy.env = env,
            Err(outcome) => return outcome,
        }
        match sandbox::run(policy).await {
            Ok(result) if self.cfg.processor.is_some() => processor_outcome_of(&result),
            Ok(result) => outcome_of(&result),
            Err(e) => outcome_of_error(&e),
        }
    }

    /// A processor's bobbin directory exists before the runtime starts in it: a built-in's
    /// copy under the home is written from the binary when it is the one the expansion
    /// chose (`bobbins::embedded::ensure_run_dir`); and the files its processor or poller
    /// runs or loads pass 14.3.6's owner and mode rules (`bobbins::catalog::check_code`).
    async fn prepare_bobbin_dir(&self, spool_home: &Path) -> Result<(), Outcome> {
        if self.cfg.processor.is_none() {
            return Ok(());
        }
        let (Some(bobbin), Some(dir)) = (
            self.cfg.env.get("HOOKSPOOL_BOBBIN").cloned(),
            self.cfg.env.get("HOOKSPOOL_BOBBIN_DIR").map(PathBuf::from),
        ) else {
            return Err(Outcome::retry(
                Klass::Config,
                None,
                "processor env incomplete",
            ));
        };
        let home = spool_home.to_path_buf();
        let shown = dir.display().to_string();
        let hooks = self.cfg.processor_hooks();
        let done = tokio::task::spawn_blocking(move || {
            crate::bobbins::embedded::ensure_run_dir(&bobbin, &dir, &home).map(|()| {
                let mut unsafe_code = crate::bobbins::catalog::check_run_dir_code(&dir);
                if let Some(h) = hooks
                    && let Err(why) = crate::bobbins::catalog::check_hooks(&h)
                {
                    unsafe_code.push(format!("settings.hooks: {why}"));
                }
                unsafe_code
            })
        })
        .await;
        match done {
            Ok(Ok(unsafe_code)) if unsafe_code.is_empty() => Ok(()),
            // 14.3.6: code others could have changed is never run, whatever check said
            // when the config was loaded; the operator fixes the file, then it runs.
            Ok(Ok(unsafe_code)) => Err(Outcome::retry(Klass::Config, None, "bobbin code unsafe")
                .with_detail(&unsafe_code.join("; "))),
            Ok(Err(e)) => Err(
                Outcome::retry(Klass::Config, None, "bobbin directory unusable")
                    .with_detail(&format!("{shown}: {e}")),
            ),
            Err(e) => Err(
                Outcome::retry(Klass::Transport, None, "bobbin directory unusable")
                    .with_detail(&e.to_string()),
            ),
        }
    }

    /// The env file's variables, the config's, then the HOOKSPOOL_* ones; creates state_dir.
    async fn attempt_env(&self, d: &ScriptDelivery) -> Result<Vec<(String, String)>, Outcome> {
        let mut env = Vec::new();
        if let Some(file) = &self.cfg.env_file {
            let text = tokio::fs::read_to_string(file).await.map_err(|e| {
                Outcome::retry(Klass::Config, None, "script env file unreadable")
                    .with_detail(&format!("{}: {e}", file.display()))
            })?;
            let vars = sandbox::parse_env_file(&text).map_err(|e| {
                Outcome::retry(Klass::Config, None, "script env file invalid")
                    .with_detail(&format!("{}: {e}", file.display()))
            })?;
            env.extend(vars);
        }
        for (name, value) in &self.cfg.env {
            if !valid_env_name(name) || !self.cfg.env_name_allowed(name) {
                return Err(
                    Outcome::retry(Klass::Config, None, "script env name invalid")
                        .with_detail(name),
                );
            }
            env.push((name.clone(), value.clone()));
        }
        if self.cfg.processor.is_some() {
            env.extend(test_provider_base());
        }
        env.push(("HOOKSPOOL_BATCH_ID".into(), d.batch_id.to_string()));
        env.push(("HOOKSPOOL_DELIVERY_ID".into(), d.delivery_id.clone()));
        // Test seam, `failpoints` builds only (packaged builds are built without it): the
        // dispatcher's loopback HOOKSPOOL_TEST_PROVIDER_BASE reaches a processor, so a test
        // under `hookspool run` can answer its provider calls (processor::http).
        #[cfg(feature = "failpoints")]
        if self.cfg.processor.is_some()
            && let Ok(base) = std::env::var(TEST_PROVIDER_BASE_ENV)
        {
            env.push((TEST_PROVIDER_BASE_ENV.into(), base));
        }
        if let Some(dir) = &self.cfg.state_dir {
            create_state_dir(dir).await.map_err(|e| {
                Outcome::retry(Klass::Config, None, "script state_dir unusable")
                    .with_detail(&format!("{}: {e}", dir.display()))
            })?;
            env.push((
                "HOOKSPOOL_STATE_DIR".into(),
                dir.to_string_lossy().into_owned(),
            ));
        }
        Ok(env)
    }
}

fn timeout(timeout_s: f64) -> Duration {
    Duration::try_from_secs_f64(timeout_s)
        .unwrap_or(Duration::from_secs_f64(SCRIPT_TIMEOUT_S_DEFAULT))
}

async fn create_state_dir(dir: &Path) -> std::io::Result<()> {
    if tokio::fs::metadata(dir).await.is_ok_and(|m| m.is_dir()) {
        return Ok(());
    }
    let mut builder = tokio::fs::DirBuilder::new();
    builder.recursive(true).mode(STATE_DIR_MODE);
    builder.create(dir).await
}

/// How a finished run maps to an outcome. Pure.
pub fn outcome_of(r: &RunResult) -> Outcome {
    if r.timed_out {
        return Outcome::retry(Klass::Transport, None, "script timeout").timed_out();
    }
    if r.stdout_overflow {
        return Outcome::retry(Klass::Batch, None, "stdout over 1 MiB");
    }
    match r.status {
        ExitStatus::Code(0) => match parse_emits(&r.stdout) {
            Ok(emits) => Outcome {
                emits,
                ..Outcome::ok(Some(0))
            },
            Err(bad) => Outcome::retry(Klass::Batch, Some(0), BAD_EMIT_REASON)
                .with_detail(&format!("{BAD_EMIT_REASON}: {bad}")),
        },
        ExitStatus::Code(EXIT_PERMANENT) => Outcome::dead(
            Klass::Permanent,
            Some(i64::from(EXIT_PERMANENT)),
            "script exit 65",
        )
        .with_detail(&stderr_detail(&r.stderr_tail)),
        ExitStatus::Code(code) => Outcome::retry(
            Klass::Batch,
            Some(i64::from(code)),
            format!("script exit {code}"),
        )
        .with_detail(&stderr_detail(&r.stderr_tail)),
        ExitStatus::Signal(signal) => Outcome::retry(
            Klass::Batch,
            None,
            format!("script killed by signal {signal}"),
        )
        .with_detail(&stderr_detail(&r.stderr_tail)),
    }
}

/// How a processor's run maps: as [`outcome_of`], except that exit 78 is the config class
/// and exit 75 ([`EXIT_PROCESSOR_RETRY`]) the transport class.
pub fn processor_outcome_of(r: &RunResult) -> Outcome {
    if r.timed_out || r.stdout_overflow {
        return outcome_of(r);
    }
    match r.status {
        ExitStatus::Code(EXIT_PROCESSOR_CONFIG) => Outcome::retry(
            Klass::Config,
            Some(i64::from(EXIT_PROCESSOR_CONFIG)),
            "processor exit 78: its credential or grant needs the operator",
        )
        .with_detail(&stderr_detail(&r.stderr_tail)),
        ExitStatus::Code(EXIT_PROCESSOR_RETRY) => Outcome::retry(
            Klass::Transport,
            Some(i64::from(EXIT_PROCESSOR_RETRY)),
            "processor exit 75: its provider or network failed",
        )
        .with_detail(&stderr_detail(&r.stderr_tail)),
        _ => outcome_of(r),
    }
}

/// The stderr tail for `detail` (stored, never logged): its last `DETAIL_CHARS_MAX` chars.
fn stderr_detail(tail: &[u8]) -> String {
    let text = String::from_utf8_lossy(tail);
    let text = text.trim_end();
    let skip = text.chars().count().saturating_sub(DETAIL_CHARS_MAX);
    text.chars().skip(skip).collect()
}

/// How a sandbox failure maps to an outcome. Pure.
pub fn outcome_of_error(e: &SandboxError) -> Outcome {
    match e {
        SandboxError::Spawn { stage, source } => {
            Outcome::retry(Klass::Transport, None, "cannot start script")
                .with_detail(&format!("{stage}: {source}"))
        }
        SandboxError::Policy(msg) => {
            Outcome::retry(Klass::Config, None, "script sandbox policy invalid").with_detail(msg)
        }
        SandboxError::Unavailable { missing } => {
            Outcome::retry(Klass::Config, None, "sandbox required but unavailable")
                .with_detail(missing)
        }
        SandboxError::Setup { .. } => {
            Outcome::retry(Klass::Transport, None, "sandbox setup failed")
                .with_detail(&e.to_string())
        }
        SandboxError::Io(_) => {
            Outcome::retry(Klass::Transport, None, "script i/o failed").with_detail(&e.to_string())
        }
    }
}

/// Whether the attempt failed on an emit line (the dispatcher's "twice, then permanent").
pub fn is_bad_emit(o: &Outcome) -> bool {
    o.kind == OutcomeKind::Retry && o.klass == Some(Klass::Batch) && o.reason == BAD_EMIT_REASON
}

/// Why an emit line was refused. Names the line and the rule, never the content.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("stdout line {line}: {what}")]
pub struct BadEmit {
    pub line: usize,
    pub what: &'static str,
}

const EMIT_KEYS_REQUIRED: &[&str] = &["source", "key"];
const EMIT_KEYS_OPTIONAL_STRING: &[&str] = &["event_type", "dedup_id", "destination"];

/// Whether a line opens as `{"enqueue"` with any spacing or quoting (`{ 'enqueue'`,
/// `{enqueue`): such a line is an emit and must be valid. `{"enqueued"` is not.
fn opens_as_emit(line: &[u8]) -> bool {
    let rest = line.trim_ascii_start();
    let Some(rest) = rest.strip_prefix(b"{") else {
        return false;
    };
    let rest = rest.trim_ascii_start();
    let rest = match rest.first() {
        Some(b'"' | b'\'' | b'`') => &rest[1..],
        _ => rest,
    };
    let Some(after) = rest.strip_prefix(b"enqueue") else {
        return false;
    };
    !after
        .first()
        .is_some_and(|b| b.is_ascii_alphanumeric() || *b == b'_')
}

/// Parses every emit line of a script's stdout (other lines are ignored) into the inner
/// `enqueue` objects, or the first line that breaks the rules.
pub fn parse_emits(stdout: &[u8]) -> Result<Vec<Value>, BadEmit> {
    let mut emits = Vec::new();
    for (index, line) in stdout.split(|b| *b == b'\n').enumerate() {
        if !opens_as_emit(line) {
            continue;
        }
        let bad = |what| BadEmit {
            line: index + 1,
            what,
        };
        let text = std::str::from_utf8(line).map_err(|_| bad("not UTF-8"))?;
        let value: Value = serde_json::from_str(text).map_err(|_| bad("not valid JSON"))?;
        let Value::Object(mut outer) = value else {
            return Err(bad("not a JSON object"));
        };
        let inner = outer.remove("enqueue").ok_or(bad("no \"enqueue\" key"))?;
        if !outer.is_empty() {
            return Err(bad("keys beside \"enqueue\""));
        }
        let Value::Object(fields) = &inner else {
            return Err(bad("\"enqueue\" is not an object"));
        };
        for key in fields.keys() {
            let known = EMIT_KEYS_REQUIRED.contains(&key.as_str())
                || EMIT_KEYS_OPTIONAL_STRING.contains(&key.as_str())
                || key == "payload";
            if !known {
                return Err(bad("unknown key in \"enqueue\""));
            }
        }
        for key in EMIT_KEYS_REQUIRED {
            match fields.get(*key) {
                Some(Value::String(s)) if !s.is_empty() => {}
                _ => return Err(bad("source and key must be non-empty strings")),
            }
        }
        for key in EMIT_KEYS_OPTIONAL_STRING {
            match fields.get(*key) {
                None | Some(Value::Null) => {}
                Some(Value::String(s)) if !s.is_empty() => {}
                _ => return Err(bad("event_type, dedup_id and destination must be strings")),
            }
        }
        match fields.get("payload") {
            None | Some(Value::Object(_)) => {}
            Some(_) => return Err(bad("payload must be an object")),
        }
        emits.push(inner);
    }
    Ok(emits)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    struct Env {
        _root: tempfile::TempDir,
        base: PathBuf,
        home: PathBuf,
    }

    fn env() -> Env {
        let root = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(root.path()).unwrap();
        let home = base.join("home");
        std::fs::create_dir_all(home.join("secrets")).unwrap();
        std::fs::write(home.join("spool.db"), b"db").unwrap();
        Env {
            _root: root,
            base,
            home,
        }
    }

    impl Env {
        fn script(&self, body: &str) -> String {
            let dir = self.base.join("scripts");
            std::fs::create_dir_all(&dir).unwrap();
            let n = std::fs::read_dir(&dir).unwrap().count();
            let path = dir.join(format!("s{n}.sh"));
            std::fs::write(&path, body).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
            path.to_string_lossy().into_owned()
        }

        fn delivery(&self) -> ScriptDelivery {
            ScriptDelivery {
                batch_id: 42,
                delivery_id: "hs_inst_42".into(),
                body: br#"{"batch_id":42,"events":[]}"#.to_vec(),
                deadline: Instant::now() + Duration::from_secs(20),
                spool_home: self.home.clone(),
            }
        }
    }

    fn cfg(argv: Vec<String>) -> ScriptConfig {
        ScriptConfig {
            argv,
            processor: None,
            cwd: None,
            env_file: None,
            env: BTreeMap::new(),
            timeout_s: 20.0,
            state_dir: None,
            sandbox: SandboxConfig::default(),
        }
    }

    async fn deliver_sh(e: &Env, body: &str, tweak: impl FnOnce(&mut ScriptConfig)) -> Outcome {
        let mut c = cfg(vec![e.script(body)]);
        tweak(&mut c);
        ScriptDestination::new("script:test", c)
            .deliver(&e.delivery())
            .await
    }

    /// Regression: after a package upgrade `current_exe()` reads "<path> (deleted)" and
    /// every processor spawn failed until the dispatcher restarted.
    #[test]
    fn processor_spawn_after_upgrade_runs_the_binary_installed_at_the_path() {
        let installed = |p: &Path| p == Path::new("/usr/bin/hookspool");
        assert_eq!(
            installed_exe(Path::new("/usr/bin/hookspool"), installed).unwrap(),
            Path::new("/usr/bin/hookspool")
        );
        assert_eq!(
            installed_exe(Path::new("/usr/bin/hookspool (deleted)"), installed).unwrap(),
            Path::new("/usr/bin/hookspool"),
            "the upgraded file at the same path"
        );
        let e = installed_exe(Path::new("/usr/bin/hookspool (deleted)"), |_| false).unwrap_err();
        assert!(e.to_string().contains("restart the dispatcher"), "{e}");
        assert!(installed_exe(Path::new("/opt/x/hookspool"), installed).is_err());
    }

    #[test]
    fn config_from_toml_defaults_and_unknown_keys() {
        let t: toml::Table = toml::from_str(
            r#"
argv = ["/usr/bin/python3", "/opt/scripts/refresh.py"]
cwd = "/opt/scripts"
env_file = "/etc/hookspool/refresh.env"
state_dir = "/var/lib/hookspool/scripts/gcal"
env = { REGION = "eu" }
[sandbox]
network = false
read_paths = ["/opt/venv"]
limits = { processes = 8 }
"#,
        )
        .unwrap();
        let c = ScriptConfig::from_options(&t, 300.0).unwrap();
        assert_eq!(c.timeout_s, 300.0);
        assert!(!c.sandbox.network);
        assert!(!c.sandbox.required);
        assert_eq!(c.sandbox.limits.processes, Some(8));
        assert!(c.problems().is_empty(), "{:?}", c.problems());

        let mut bad = t.clone();
        bad.insert("argvv".into(), toml::Value::Boolean(true));
        assert!(ScriptConfig::from_options(&bad, 300.0).is_err());
        let bad: toml::Table =
            toml::from_str("argv = [\"/x\"]\n[sandbox]\nnetwrok = false\n").unwrap();
        assert!(ScriptConfig::from_options(&bad, 300.0).is_err());

        let mut c = c;
        c.env.insert("HOOKSPOOL_BATCH_ID".into(), "1".into());
        c.env.insert("lower".into(), "1".into());
        c.argv = vec!["relative.sh".into()];
        assert_eq!(c.problems().len(), 3, "{:?}", c.problems());
    }

    #[test]
    fn emit_lines_are_detected_with_any_spacing_or_quoting() {
        for line in [
            &br#"{"enqueue": {}}"#[..],
            br#"  {  "enqueue":1}"#,
            br#"{'enqueue': {}}"#,
            br#"{enqueue: {}}"#,
            br#"{"enqueue"}"#,
        ] {
            assert!(opens_as_emit(line), "{}", String::from_utf8_lossy(line));
        }
        for line in [
            &br#"{"enqueued": 1}"#[..],
            b"enqueue",
            br#"["enqueue"]"#,
            b"log {\"enqueue\"",
        ] {
            assert!(!opens_as_emit(line), "{}", String::from_utf8_lossy(line));
        }
    }

    #[test]
    fn emits_are_validated_and_other_lines_ignored() {
        let out = b"starting\n{\"enqueue\": {\"source\": \"s\", \"key\": \"k\", \"payload\": {\"a\": 1}, \"event_type\": \"t\", \"dedup_id\": \"d\", \"destination\": \"hermes:x\"}}\n\xff not utf8 but not an emit\n{\"enqueued\": true}\n{\"enqueue\":{\"source\":\"s\",\"key\":\"k2\"}}\r\n";
        let emits = parse_emits(out).unwrap();
        assert_eq!(emits.len(), 2);
        assert_eq!(emits[0]["payload"]["a"], 1);
        assert_eq!(emits[1]["key"], "k2");

        let cases: &[(&[u8], &str)] = &[
            (
                b"{'enqueue': {'source': 's', 'key': 'k'}}",
                "not valid JSON",
            ),
            (
                b"{\"enqueue\": {\"source\": \"\xff\", \"key\": \"k\"}}",
                "not UTF-8",
            ),
            (
                br#"{"enqueue": {"source": "s"}}"#,
                "source and key must be non-empty strings",
            ),
            (
                br#"{"enqueue": {"source": "s", "key": 5}}"#,
                "source and key must be non-empty strings",
            ),
            (
                br#"{"enqueue": {"source": "s", "key": "k", "payload": [1]}}"#,
                "payload must be an object",
            ),
            (
                br#"{"enqueue": {"source": "s", "key": "k", "colour": "red"}}"#,
                "unknown key in \"enqueue\"",
            ),
            (
                br#"{"enqueue": {"source": "s", "key": "k"}, "more": 1}"#,
                "keys beside \"enqueue\"",
            ),
            (br#"{"enqueue": "s"}"#, "\"enqueue\" is not an object"),
            (
                br#"{"enqueue": {"source": "s", "key": "k", "event_type": 3}}"#,
                "event_type, dedup_id and destination must be strings",
            ),
        ];
        for (line, what) in cases {
            let mut out = b"ok line\n".to_vec();
            out.extend_from_slice(line);
            let err = parse_emits(&out).unwrap_err();
            assert_eq!(
                err,
                BadEmit { line: 2, what },
                "{}",
                String::from_utf8_lossy(line)
            );
        }
    }

    #[tokio::test]
    async fn stdin_env_and_state_dir_reach_the_script_and_emits_come_back() {
        let e = env();
        let state = e.base.join("state/demo");
        let env_file = e.base.join("demo.env");
        std::fs::write(&env_file, "FROM_FILE=file\nOVERRIDDEN=file\n").unwrap();
        let o = deliver_sh(
            &e,
            r#"#!/bin/sh
cat > "$HOOKSPOOL_STATE_DIR/doc.json"
/usr/bin/env | sort > "$HOOKSPOOL_STATE_DIR/env.txt"
echo "not an emit"
echo '{"enqueue": {"source": "demo", "key": "k1", "payload": {"n": 1}}}'
echo '{ "enqueue" : {"source": "demo", "key": "k2", "destination": "hermes:x"}}'
exit 0
"#,
            |c| {
                c.state_dir = Some(state.clone());
                c.env_file = Some(env_file.clone());
                c.env.insert("OVERRIDDEN".into(), "config".into());
            },
        )
        .await;
        assert_eq!(o.kind, OutcomeKind::Ok, "{o:?}");
        assert_eq!(o.status, Some(0));
        assert_eq!(o.emits.len(), 2);
        assert_eq!(o.emits[1]["destination"], "hermes:x");
        assert_eq!(
            std::fs::read(state.join("doc.json")).unwrap(),
            br#"{"batch_id":42,"events":[]}"#
        );
        let env_txt = std::fs::read_to_string(state.join("env.txt")).unwrap();
        for line in [
            "HOOKSPOOL_BATCH_ID=42",
            "HOOKSPOOL_DELIVERY_ID=hs_inst_42",
            &format!("HOOKSPOOL_STATE_DIR={}", state.display()),
            "FROM_FILE=file",
            "OVERRIDDEN=config",
        ] {
            assert!(
                env_txt.lines().any(|l| l == line),
                "{line} missing in {env_txt}"
            );
        }
        let mode = std::fs::metadata(&state).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, STATE_DIR_MODE);
    }

    #[tokio::test]
    async fn exit_codes_map_to_outcomes_and_stderr_stays_out_of_reasons() {
        let e = env();
        let o = deliver_sh(&e, "#!/bin/sh\necho SENTINEL-STDERR >&2\nexit 65\n", |_| {}).await;
        assert_eq!(
            (o.kind, o.klass, o.status),
            (OutcomeKind::Dead, Some(Klass::Permanent), Some(65))
        );
        assert_eq!(o.reason, "script exit 65");
        assert!(o.detail.contains("SENTINEL-STDERR"), "kept for last_error");

        let o = deliver_sh(&e, "#!/bin/sh\necho SENTINEL-STDERR >&2\nexit 75\n", |_| {}).await;
        assert_eq!(
            (o.kind, o.klass, o.status),
            (OutcomeKind::Retry, Some(Klass::Batch), Some(75))
        );
        assert_eq!(o.reason, "script exit 75");

        let o = deliver_sh(
            &e,
            "#!/bin/sh\necho '{\"enqueue\": {\"source\": \"s\", \"key\": \"k\"}}'\nexit 1\n",
            |_| {},
        )
        .await;
        assert_eq!(o.klass, Some(Klass::Batch));
        assert!(o.emits.is_empty(), "emits only count on exit 0");

        let o = deliver_sh(&e, "#!/bin/sh\nkill -KILL $$\n", |_| {}).await;
        assert_eq!((o.kind, o.klass), (OutcomeKind::Retry, Some(Klass::Batch)));
        assert_eq!(o.reason, "script killed by signal 9");

        let o = deliver_sh(&e, "#!/bin/sh\nexit 0\n", |_| {}).await;
        assert_eq!(o.kind, OutcomeKind::Ok);
        assert!(o.emits.is_empty(), "a successful no-op");
    }

    #[tokio::test]
    async fn a_bad_emit_fails_the_attempt_as_bad_emit() {
        let e = env();
        let o = deliver_sh(
            &e,
            "#!/bin/sh\necho '{\"enqueue\": {\"source\": \"s\", \"key\": \"k\"}}'\necho \"{'enqueue': {'source': 's'}}\"\n",
            |_| {},
        )
        .await;
        assert!(is_bad_emit(&o), "{o:?}");
        assert_eq!(o.reason, BAD_EMIT_REASON);
        assert!(
            o.detail.starts_with("bad emit: stdout line 2"),
            "{}",
            o.detail
        );
        assert!(o.emits.is_empty(), "none of the batch's emits are kept");
        assert!(!is_bad_emit(&Outcome::retry(
            Klass::Batch,
            Some(3),
            "script exit 3"
        )));

        let o = deliver_sh(
            &e,
            "#!/bin/sh\nprintf '{\"enqueue\": {\"source\": \"\\377\", \"key\": \"k\"}}\\n'\n",
            |_| {},
        )
        .await;
        assert!(is_bad_emit(&o), "{o:?}");
        assert!(o.detail.contains("not UTF-8"), "{}", o.detail);
    }

    #[tokio::test]
    async fn cannot_start_timeout_and_overflow() {
        let e = env();
        let c = cfg(vec![
            e.base.join("missing.sh").to_string_lossy().into_owned(),
        ]);
        let o = ScriptDestination::new("script:m", c)
            .deliver(&e.delivery())
            .await;
        assert_eq!(
            (o.kind, o.klass),
            (OutcomeKind::Retry, Some(Klass::Transport))
        );
        assert_eq!(o.reason, "cannot start script");

        let path = e.script("#!/bin/sh\necho hi\n");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let o = ScriptDestination::new("script:x", cfg(vec![path]))
            .deliver(&e.delivery())
            .await;
        assert_eq!(o.reason, "cannot start script");
        assert_eq!(o.klass, Some(Klass::Transport));

        let started = Instant::now();
        let o = deliver_sh(&e, "#!/bin/sh\nsleep 30\n", |c| c.timeout_s = 0.5).await;
        assert_eq!(
            (o.kind, o.klass),
            (OutcomeKind::Retry, Some(Klass::Transport))
        );
        assert_eq!(o.reason, "script timeout");
        assert!(o.timed_out, "time ran out: the timeout reason class");
        assert!(started.elapsed() < Duration::from_secs(6));

        // The worker deadline wins over a longer timeout_s.
        let mut d = e.delivery();
        d.deadline = Instant::now() + Duration::from_millis(500);
        let c = cfg(vec![e.script("#!/bin/sh\nsleep 30\n")]);
        let o = ScriptDestination::new("script:d", c).deliver(&d).await;
        assert_eq!(o.reason, "script timeout");

        let o = deliver_sh(&e, "#!/bin/sh\nhead -c 1048577 /dev/zero\n", |_| {}).await;
        assert_eq!((o.kind, o.klass), (OutcomeKind::Retry, Some(Klass::Batch)));
        assert_eq!(o.reason, "stdout over 1 MiB");
        let o = deliver_sh(&e, "#!/bin/sh\nhead -c 1048576 /dev/zero\n", |_| {}).await;
        assert_eq!(o.kind, OutcomeKind::Ok, "exactly 1 MiB is allowed");
    }

    #[tokio::test]
    async fn config_problems_are_config_retries() {
        let e = env();
        let o = deliver_sh(&e, "#!/bin/sh\nexit 0\n", |c| {
            c.env_file = Some(PathBuf::from("/nonexistent/hookspool.env"))
        })
        .await;
        assert_eq!((o.kind, o.klass), (OutcomeKind::Retry, Some(Klass::Config)));
        assert_eq!(o.reason, "script env file unreadable");

        let o = deliver_sh(&e, "#!/bin/sh\nexit 0\n", |c| {
            c.env.insert("HOOKSPOOL_BATCH_ID".into(), "spoof".into());
        })
        .await;
        assert_eq!(o.klass, Some(Klass::Config));

        let home = e.home.clone();
        let o = deliver_sh(&e, "#!/bin/sh\nexit 0\n", |c| {
            c.sandbox.write_paths = vec![home.parent().unwrap().to_path_buf()];
        })
        .await;
        assert_eq!(o.klass, Some(Klass::Config));
        assert_eq!(o.reason, "script sandbox policy invalid");
    }

    #[tokio::test]
    async fn the_script_cannot_read_the_spool_home() {
        let e = env();
        let o = deliver_sh(
            &e,
            "#!/bin/sh\ncat \"$SPOOL/spool.db\" >/dev/null 2>&1 && exit 1\necho x > \"$SPOOL/evil\" 2>/dev/null && exit 2\nexit 0\n",
            |c| {
                c.env.insert("SPOOL".into(), e.home.to_string_lossy().into_owned());
            },
        )
        .await;
        assert_eq!(o.kind, OutcomeKind::Ok, "{o:?}");
        assert!(!e.home.join("evil").exists());
    }

    #[test]
    fn explain_names_the_destination_and_the_env_file_but_no_values() {
        let e = env();
        let mut c = cfg(vec!["/bin/true".into()]);
        c.env_file = Some(PathBuf::from("/etc/hookspool/x.env"));
        c.env.insert("TOKENISH".into(), "SENTINEL-VALUE".into());
        let text = ScriptDestination::new("script:x", c).explain(&e.home);
        assert!(text.starts_with("destination: script:x\n"));
        assert!(text.contains("TOKENISH") && text.contains("HOOKSPOOL_BATCH_ID"));
        assert!(!text.contains("SENTINEL-VALUE"));
        assert!(text.contains(&e.home.display().to_string()));
    }
}
