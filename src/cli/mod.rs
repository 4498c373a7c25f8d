//! The command line (spec 16): clap types, one file per command family, text and `--json`
//! rendering; `exit` is the one place that maps errors to exit codes (0 ok, 1 not found or
//! nothing to do, 2 usage, config or schema error, 3 lock held or address in use).

/// `say!(ctx, "fmt", args)`: one line of command output (see `Ctx::say`).
macro_rules! say {
    ($ctx:expr, $($t:tt)*) => {
        $ctx.say(format!($($t)*))
    };
}

mod admin;
mod bobbin;
mod check;
mod data;
mod enqueue;
mod exit;
mod generate;
mod inspect;
mod issues;
mod migrate;
mod operate;
mod processor;
mod run;
mod run_admin;
mod secret;
mod selftest;
mod service;
mod source;
mod spool;
mod status;

use std::cell::RefCell;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};

use crate::clock::{Clock, SystemClock};
use crate::config::{self, Config, PathInputs};
use crate::store::{self, Role, Store};
pub use exit::{EXIT_CONFIG, EXIT_LOCKED, EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE, Exit};

/// The version `--version` prints: the package's, and for a test build what it is (set by
/// build.rs from `HOOKSPOOL_TEST_BUILD` at compile time).
pub const VERSION: &str = env!("HOOKSPOOL_VERSION");

#[derive(Debug, Parser)]
#[command(
    name = "hookspool",
    version = VERSION,
    about = "A durable, coalescing webhook intake for one host"
)]
pub struct Cli {
    /// The spool home (overrides HOOKSPOOL_HOME and spool.home).
    #[arg(long, global = true, value_name = "DIR")]
    pub home: Option<PathBuf>,
    /// The config file (overrides HOOKSPOOL_CONFIG; default <home>/config.toml).
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Print JSON instead of text.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Intake and dispatcher in one process (development and tiny hosts).
    Run,
    /// The HTTP intake service.
    Intake,
    /// The dispatcher service.
    Dispatch,
    /// The management API (read-only /api/v1) on a loopback address.
    Admin(admin::AdminArgs),
    /// Spool an event by hand (a sweep, a test), with the intake's validation.
    Enqueue(enqueue::EnqueueArgs),
    /// Batches, newest first, without payloads.
    List(inspect::ListArgs),
    /// One batch, with its events and attempts on request.
    Show(inspect::ShowArgs),
    /// Apply pending schema migrations (takes dispatch.lock).
    Migrate(migrate::MigrateArgs),
    /// Health of the spool, dispatcher, destinations and sources (the /healthz document).
    Status,
    /// Dead batches -> retry, due now; a quarantine batch is reclassified instead.
    Replay(operate::ReplayArgs),
    /// A retry batch -> due now (skip the backoff).
    Retry(operate::RetryArgs),
    /// Cut a sealed, retry or dead batch into smaller batches of the same group.
    Split(operate::SplitArgs),
    /// Leave events out of a batch's document (they stay stored and listed).
    Exclude(operate::ExcludeArgs),
    /// Discard batches (never automatic; audited).
    Drop(operate::DropArgs),
    /// Stop deliveries to a destination (events keep spooling).
    Pause(operate::PauseArgs),
    /// Let a paused destination deliver again.
    Resume(operate::ResumeArgs),
    /// Grouped failures: list, ack, resolve, ignore.
    Issues(issues::IssuesArgs),
    /// Work with a source offline.
    Source(source::SourceArgs),
    /// Bobbins: list, show, and the conformance kit (check).
    Bobbin(bobbin::BobbinArgs),
    /// Make an http destination's signing secret.
    Secret(secret::SecretArgs),
    /// Validate the config, secrets, routes, destinations and the database.
    Check(check::CheckArgs),
    /// Check, then touch the config so the intake and dispatcher reload together.
    Reload,
    /// Run retention now.
    Prune(data::PruneArgs),
    /// Batches, events and attempts as JSON lines (backup, forensics).
    Export(data::ExportArgs),
    /// Move the spool between SQLite and PostgreSQL (copy, verified; services stopped).
    Spool(spool::SpoolArgs),
    /// Print the /metrics text: the intake's page (its counters and the dispatcher's gauges)
    /// when the intake answers, else the gauges and where the counters are served.
    Metrics,
    /// The journal records of one batch (runs journalctl BATCH=<id>).
    Logs(status::LogsArgs),
    /// Run a bobbin instance's processor on one batch (the dispatcher starts it).
    Processor(processor::ProcessorArgs),
    /// Write the man pages or shell completions (used by the packages).
    #[command(hide = true)]
    Generate(generate::GenerateArgs),
}

impl Command {
    /// The component name a command logs as (observe::logging::init).
    pub fn component(&self) -> &'static str {
        match self {
            Command::Run => "run",
            Command::Intake => "intake",
            Command::Dispatch => "dispatch",
            Command::Admin(_) => "admin",
            Command::Processor(_) => "processor",
            _ => "cli",
        }
    }
}

/// What every command gets: the parsed globals, the config, the clock, and where its
/// output goes (stdout, or a buffer in tests).
pub struct Ctx {
    pub json: bool,
    pub inputs: PathInputs,
    pub clock: Box<dyn Clock>,
    out: RefCell<Box<dyn Write>>,
}

impl Ctx {
    /// The config, with unknown keys as warnings (printed to stderr once).
    pub fn config(&self) -> Result<Config, Exit> {
        self.config_from(&self.inputs)
    }

    /// The config found through other path inputs (`run` picks its own default home).
    pub fn config_from(&self, inputs: &PathInputs) -> Result<Config, Exit> {
        let (c, warnings) = config::load(inputs, false)?;
        for w in warnings {
            eprintln!("warning: {w}");
        }
        Ok(c)
    }

    /// The config for a command that only reads the spool (status, metrics, list, show,
    /// issues): a config with errors is reported on stderr and the spool is read anyway,
    /// found through the flags, the environment and the file's own [spool] table, so an
    /// operator can look at what is spooled while the config is being fixed.
    pub fn config_for_reading(&self) -> Result<Config, Exit> {
        match config::load(&self.inputs, false) {
            Ok((c, warnings)) => {
                for w in warnings {
                    eprintln!("warning: {w}");
                }
                Ok(c)
            }
            Err(e) => {
                let c = config::fallback(&self.inputs);
                eprintln!(
                    "warning: {}
warning: showing the spool at {} without that config (sources, routes and destinations unknown); run hookspool check after fixing it",
                    Exit::from(e).message,
                    c.db.display()
                );
                Ok(c)
            }
        }
    }

    /// Open the spool for a command that reads it or changes operator state in it (every
    /// command but the services, `migrate`, `enqueue` and the sandbox self-test). A spool
    /// that does not exist is refused, saying where it was looked for: creating one would
    /// answer from an empty spool beside the real one (issue 29). A home that group or
    /// others can enter is warned about.
    pub fn store(&self, c: &Config) -> Result<Store, Exit> {
        if c.backend != config::backend::Backend::Sqlite {
            return Ok(c.open_spool(
                Role::Reader,
                Duration::from_secs(store::DEFAULT_BUSY_TIMEOUT_S),
            )?);
        }
        // Only a spool known to be absent: one this user may not look at (a 0700 home of
        // the service user) is opened, and the open says why it fails.
        if matches!(c.db.try_exists(), Ok(false)) {
            return Err(missing_spool(&self.inputs, c));
        }
        if let Some(w) = open_home_warning(&c.home) {
            eprintln!("warning: {w}");
        }
        self.store_creating(c)
    }

    /// Open the spool, creating the home and the spool when they do not exist yet (for
    /// `enqueue`, which spools an event wherever it is told, and the sandbox self-test).
    pub fn store_creating(&self, c: &Config) -> Result<Store, Exit> {
        if c.backend != config::backend::Backend::Sqlite {
            // As an SQLite file that does not exist yet is made: a PostgreSQL database that
            // holds no schema at all is given one; an older schema is still refused.
            let busy = Duration::from_secs(store::DEFAULT_BUSY_TIMEOUT_S);
            return match c.open_spool(Role::Reader, busy) {
                Err(store::StoreError::SchemaTooOld { found: 0, .. }) => {
                    Ok(c.open_spool(Role::Migrator, busy)?)
                }
                other => Ok(other?),
            };
        }
        store::ensure_home(&c.home)?;
        refuse_foreign_spool_as_root(&c.home)?;
        Ok(Store::open(
            &c.db,
            Role::Reader,
            Duration::from_secs(store::DEFAULT_BUSY_TIMEOUT_S),
        )?)
    }

    pub fn print_json(&self, v: &serde_json::Value) {
        self.say(serde_json::to_string_pretty(v).unwrap_or_default());
    }

    /// Print one line of output. A closed stdout (a pipe to `head`) ends the output, not
    /// the command, so write errors are dropped here.
    pub fn say(&self, line: impl AsRef<str>) {
        let mut out = self.out.borrow_mut();
        let _ = writeln!(out, "{}", line.as_ref());
    }

    /// Write bytes as they are (export's JSON lines).
    pub fn write_raw(&self, bytes: &[u8]) -> Result<(), Exit> {
        self.out.borrow_mut().write_all(bytes)?;
        Ok(())
    }

    /// Open the spool for a command that changes operator state (the same connection
    /// settings; named for what the caller does with it).
    pub fn store_mut(&self, c: &Config) -> Result<Store, Exit> {
        self.store(c)
    }
}

/// The PostgreSQL URL of the config's `spool.url`, read now (`None` for an SQLite spool).
/// An error names the reference, never what it holds.
pub fn pg_url(c: &Config) -> Result<Option<String>, Exit> {
    let config::backend::Backend::Postgres { url } = &c.backend else {
        return Ok(None);
    };
    read_url(url, "spool.url").map(Some)
}

/// A URL held by a secret reference, for `spool.url` or `spool copy --to postgres:FILE`.
pub fn read_url(r: &crate::secret::SecretRef, key: &str) -> Result<String, Exit> {
    let bytes = r
        .resolve()
        .map_err(|e| Exit::new(EXIT_CONFIG, format!("{key}: {e}")))?;
    String::from_utf8(bytes).map_err(|_| {
        Exit::new(
            EXIT_CONFIG,
            format!(
                "{key}: {} is not UTF-8 text; write the libpq URL in it (postgresql://...)",
                r.describe()
            ),
        )
    })
}

/// The quick start's home (`hookspool run` in a directory, with no XDG_STATE_HOME), as the
/// operator would type it.
const QUICK_START_HOME: &str = "./hookspool-home";

/// "no spool at X": where the home came from, what was looked at, and the quick start's
/// home when one is beside the working directory (or `run`'s home under XDG_STATE_HOME
/// holds a spool).
fn missing_spool(inputs: &PathInputs, c: &Config) -> Exit {
    let from = if inputs.home_flag.is_some() {
        "--home".to_string()
    } else if inputs.env_home.is_some() {
        "HOOKSPOOL_HOME".to_string()
    } else if c.home != std::path::Path::new(config::DEFAULT_HOME) {
        match &c.file {
            Some(f) => format!("spool.home in {}", f.display()),
            None => "spool.home".to_string(),
        }
    } else {
        "the default: no --home, HOOKSPOOL_HOME or spool.home".to_string()
    };
    let (config_path, _) = inputs.config_path();
    let config_seen = if c.file.is_some() {
        format!("config {}", config_path.display())
    } else {
        format!("no config file at {}", config_path.display())
    };
    let db_from = if inputs.env_db.is_some() {
        ", the database named by HOOKSPOOL_DB"
    } else {
        ""
    };
    let mut message = format!(
        "no spool at {} (home {} from {from}{db_from}; {config_seen}); nothing was created. Point --home or HOOKSPOOL_HOME at the spool the services or `hookspool run` use (`hookspool migrate` makes an empty one)",
        c.db.display(),
        c.home.display()
    );
    let quick = std::path::Path::new(QUICK_START_HOME);
    let run_home = run::default_run_home();
    if quick.is_dir() && std::path::absolute(quick).ok().as_deref() != Some(c.home.as_path()) {
        message.push_str(&format!("; did you mean --home {QUICK_START_HOME}?"));
    } else if run_home != c.home && run_home.join("spool.db").is_file() {
        // `run`'s home under XDG_STATE_HOME holds a spool.
        message.push_str(&format!("; did you mean --home {}?", run_home.display()));
    }
    Exit::new(EXIT_CONFIG, message)
}

/// The mode bits of a spool home that let group or others in (spec: home 0700).
const HOME_MODE_OTHERS_MASK: u32 = 0o077;

/// A warning when group or others can enter the spool home: it holds the payloads, the
/// config and often the secrets.
pub fn open_home_warning(home: &std::path::Path) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(home).ok()?.permissions().mode() & 0o777;
    (mode & HOME_MODE_OTHERS_MASK != 0).then(|| {
        format!(
            "the spool home {} has mode {mode:04o}: group or others can enter it; run chmod 700 {}",
            home.display(),
            home.display()
        )
    })
}

/// Root opening a spool that belongs to the service user would leave root-owned WAL and
/// shared-memory files behind, which the service then cannot open. Refuse, saying how to
/// run the command instead.
pub fn refuse_foreign_spool_as_root(home: &std::path::Path) -> Result<(), Exit> {
    use std::os::unix::fs::MetadataExt;
    if !nix::unistd::geteuid().is_root() {
        return Ok(());
    }
    let Ok(meta) = std::fs::metadata(home) else {
        return Ok(());
    };
    if meta.uid() == 0 {
        return Ok(());
    }
    let user = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(meta.uid()))
        .ok()
        .flatten()
        .map(|u| u.name)
        .unwrap_or_else(|| meta.uid().to_string());
    Err(Exit::new(
        EXIT_CONFIG,
        format!(
            "the spool {} belongs to user {user}; run this as that user (sudo -u {user} hookspool ...) so no root-owned files are left in it",
            home.display()
        ),
    ))
}

/// Run one parsed command line on the system clock, printing to stdout.
pub fn run(cli: Cli) -> Result<(), Exit> {
    run_with(cli, Box::new(SystemClock), Box::new(std::io::stdout()))
}

/// Run one parsed command line with the given clock and output (tests freeze the clock and
/// capture the output).
pub fn run_with(cli: Cli, clock: Box<dyn Clock>, out: Box<dyn Write>) -> Result<(), Exit> {
    if cli.json {
        refuse_json(&cli.command)?;
    }
    let ctx = Ctx {
        json: cli.json,
        inputs: absolute_inputs(PathInputs::from_env(cli.home.clone(), cli.config.clone()))?,
        clock,
        out: RefCell::new(out),
    };
    match cli.command {
        Command::Dispatch => service::dispatch(&ctx),
        Command::Admin(a) => admin::run(&ctx, a),
        Command::Intake => Ok(crate::intake::run_blocking(ctx.inputs.clone())?),
        Command::Run => run::run(&ctx),
        Command::Enqueue(a) => enqueue::run(&ctx, a),
        Command::List(a) => inspect::list(&ctx, a),
        Command::Show(a) => inspect::show(&ctx, a),
        Command::Migrate(a) => migrate::run(&ctx, a),
        Command::Status => status::status(&ctx),
        Command::Replay(a) => operate::replay(&ctx, a),
        Command::Retry(a) => operate::retry(&ctx, a),
        Command::Split(a) => operate::split(&ctx, a),
        Command::Exclude(a) => operate::exclude(&ctx, a),
        Command::Drop(a) => operate::drop(&ctx, a),
        Command::Pause(a) => operate::pause(&ctx, a),
        Command::Resume(a) => operate::resume(&ctx, a),
        Command::Issues(a) => issues::run(&ctx, a),
        Command::Source(a) => source::run(&ctx, a),
        Command::Bobbin(a) => bobbin::run(&ctx, a),
        Command::Secret(a) => secret::run(&ctx, a),
        Command::Check(a) => check::check(&ctx, a),
        Command::Reload => check::reload(&ctx),
        Command::Prune(a) => data::prune(&ctx, a),
        Command::Export(a) => data::export(&ctx, a),
        Command::Spool(a) => spool::run(&ctx, a),
        Command::Metrics => status::metrics(&ctx),
        Command::Logs(a) => status::logs(&ctx, a),
        Command::Processor(a) => processor::run(&ctx, a),
        Command::Generate(a) => generate::run(a),
    }
}

/// The home and the config file as the flags and the environment name them, made absolute
/// against the working directory once, here at the edge: everything derived from the home
/// (the database, a processor's `state_dir`, the sockets) is then absolute too, and a
/// reload reads the same paths the start did (issue 29: `--home ./x` refused every
/// processor instance with "state_dir must be an absolute path"). `HOOKSPOOL_DB` stays as
/// written: a relative one is relative to the home.
fn absolute_inputs(inputs: PathInputs) -> Result<PathInputs, Exit> {
    let absolute = |p: Option<PathBuf>| -> Result<Option<PathBuf>, Exit> {
        p.map(|p| {
            std::path::absolute(&p).map_err(|e| {
                Exit::usage(format!(
                    "{}: cannot make the path absolute ({e}); name it from /",
                    p.display()
                ))
            })
        })
        .transpose()
    };
    Ok(PathInputs {
        home_flag: absolute(inputs.home_flag)?,
        config_flag: absolute(inputs.config_flag)?,
        env_home: absolute(inputs.env_home)?,
        env_config: absolute(inputs.env_config)?,
        env_db: inputs.env_db,
    })
}

/// The global `--json` shapes a command's output; the services and export have none to
/// shape, so they refuse it rather than ignore it.
fn refuse_json(c: &Command) -> Result<(), Exit> {
    match c {
        Command::Run | Command::Intake | Command::Dispatch | Command::Admin(_) => Err(Exit::usage(
            "--json shapes command output, and the services print none: their records go to the journal under systemd, or set HOOKSPOOL_LOG=json for JSON log lines on stderr",
        )),
        Command::Export(_) => Err(Exit::usage(
            "export always writes JSON lines (one object per line); drop --json",
        )),
        _ => Ok(()),
    }
}

/// `--since T`: Unix seconds, an RFC 3339 time (`2026-11-01T00:00:00Z`, or without zone as
/// UTC), or a duration back from now (`90m`, `2h`, `7d`).
pub fn parse_since(text: &str, now: f64) -> Result<f64, Exit> {
    let t = text.trim();
    if let Ok(v) = t.parse::<f64>()
        && v.is_finite()
    {
        return Ok(v);
    }
    if let Ok(d) = humantime::parse_duration(t) {
        return Ok(now - d.as_secs_f64());
    }
    if let Ok(st) = humantime::parse_rfc3339_weak(t)
        && let Ok(d) = st.duration_since(std::time::UNIX_EPOCH)
    {
        return Ok(d.as_secs_f64());
    }
    Err(Exit::usage(format!(
        "--since {text:?}: write Unix seconds, a time like 2026-11-01T00:00:00Z, or a duration back from now like 2h or 7d"
    )))
}

/// Refuse a destructive command that lacks `--yes`.
pub fn require_yes(yes: bool, what: &str) -> Result<(), Exit> {
    if yes {
        Ok(())
    } else {
        Err(Exit::usage(format!(
            "{what} cannot be undone; nothing was changed. Run it again with --yes"
        )))
    }
}

/// "12s ago", "3m ago", "in 5s": human relative time.
pub fn relative(now: f64, t: f64) -> String {
    let d = now - t;
    let (abs, suffix) = if d >= 0.0 { (d, " ago") } else { (-d, "") };
    let text = if abs < 120.0 {
        format!("{:.0}s", abs)
    } else if abs < 7200.0 {
        format!("{:.0}m", abs / 60.0)
    } else if abs < 172_800.0 {
        format!("{:.0}h", abs / 3600.0)
    } else {
        format!("{:.0}d", abs / 86_400.0)
    };
    if d >= 0.0 {
        format!("{text}{suffix}")
    } else {
        format!("in {text}")
    }
}

/// Render rows as an aligned table.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            if i < widths.len() {
                widths[i] = widths[i].max(c.chars().count());
            }
        }
    }
    let line = |cells: Vec<String>| {
        cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{:<w$}", c, w = widths[i]))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    let mut out = line(headers.iter().map(|h| h.to_string()).collect());
    for r in rows {
        out.push('\n');
        out.push_str(&line(r.clone()));
    }
    out
}
