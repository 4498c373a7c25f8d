//! The command line (spec 16): clap types, one file per command family, text and `--json`
//! rendering, and the one place that maps errors to exit codes (0 ok, 1 not found or
//! nothing to do, 2 config or schema error, 3 lock held). anyhow is allowed here and in
//! main only.

mod enqueue;
mod inspect;
mod migrate;

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};

use crate::clock::{Clock, SystemClock};
use crate::config::{self, Config, PathInputs};
use crate::store::{self, Role, Store, StoreError};

#[derive(Debug, Parser)]
#[command(
    name = "hookspool",
    version,
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
    /// Spool an event by hand (a sweep, a test), with the intake's validation.
    Enqueue(enqueue::EnqueueArgs),
    /// Batches, newest first, without payloads.
    List(inspect::ListArgs),
    /// One batch, with its events and attempts on request.
    Show(inspect::ShowArgs),
    /// Apply pending schema migrations (takes dispatch.lock).
    Migrate(migrate::MigrateArgs),
}

/// A command's failure: the exit code and what to tell the operator.
#[derive(Debug)]
pub struct Exit {
    pub code: i32,
    pub message: String,
}

impl Exit {
    pub fn new(code: i32, message: impl Into<String>) -> Exit {
        Exit {
            code,
            message: message.into(),
        }
    }
}

pub const EXIT_NOT_FOUND: i32 = 1;
pub const EXIT_CONFIG: i32 = 2;
pub const EXIT_LOCKED: i32 = 3;

impl From<StoreError> for Exit {
    fn from(e: StoreError) -> Exit {
        let code = match &e {
            StoreError::SchemaTooOld { .. }
            | StoreError::SchemaTooNew { .. }
            | StoreError::Corrupt(_) => EXIT_CONFIG,
            StoreError::NotFound(_) | StoreError::WrongState { .. } | StoreError::Invalid(_) => {
                EXIT_NOT_FOUND
            }
            _ => EXIT_NOT_FOUND,
        };
        Exit::new(code, e.to_string())
    }
}

impl From<config::ConfigError> for Exit {
    fn from(e: config::ConfigError) -> Exit {
        let mut msg = format!("config {} has errors:", e.file.display());
        for p in &e.problems {
            msg.push_str(&format!("\n  {p}"));
        }
        Exit::new(EXIT_CONFIG, msg)
    }
}

impl From<std::io::Error> for Exit {
    fn from(e: std::io::Error) -> Exit {
        Exit::new(EXIT_NOT_FOUND, e.to_string())
    }
}

/// What every command gets: the parsed globals, the config, and the clock.
pub struct Ctx {
    pub json: bool,
    pub inputs: PathInputs,
    pub clock: Box<dyn Clock>,
}

impl Ctx {
    /// The config, with unknown keys as warnings (printed to stderr once).
    pub fn config(&self) -> Result<Config, Exit> {
        let (c, warnings) = config::load(&self.inputs, false)?;
        for w in warnings {
            eprintln!("warning: {w}");
        }
        Ok(c)
    }

    /// Open the spool for a command that does not migrate.
    pub fn store(&self, c: &Config) -> Result<Store, Exit> {
        store::ensure_home(&c.home)?;
        Ok(Store::open(
            &c.db,
            Role::Reader,
            Duration::from_secs(store::DEFAULT_BUSY_TIMEOUT_S),
        )?)
    }

    pub fn print_json(&self, v: &serde_json::Value) {
        println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
    }
}

/// Run one parsed command line.
pub fn run(cli: Cli) -> Result<(), Exit> {
    let ctx = Ctx {
        json: cli.json,
        inputs: PathInputs::from_env(cli.home.clone(), cli.config.clone()),
        clock: Box::new(SystemClock),
    };
    match cli.command {
        Command::Intake => crate::intake::run_blocking(ctx.inputs.clone())
            .map_err(|e| Exit::new(e.exit_code(), e.to_string())),
        Command::Run | Command::Dispatch => Err(Exit::new(
            EXIT_NOT_FOUND,
            "the intake and the dispatcher are not built yet in this version; `hookspool enqueue`, `list`, `show` and `migrate` work on the spool today",
        )),
        Command::Enqueue(a) => enqueue::run(&ctx, a),
        Command::List(a) => inspect::list(&ctx, a),
        Command::Show(a) => inspect::show(&ctx, a),
        Command::Migrate(a) => migrate::run(&ctx, a),
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
