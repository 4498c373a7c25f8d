//! Exit codes (spec 16), in one place: 0 ok, 1 not found or nothing to do, 2 a usage, config
//! or schema error, 3 a lock held or an address in use (another instance is running). Every
//! error type a command can end with maps here, and `main` exits with [`Exit::code`].
//!
//! Must not: print (main prints the message once) or decide anything but the code.

use crate::config::ConfigError;
use crate::dispatch::DispatchError;
use crate::intake::IntakeError;
use crate::store::StoreError;

pub const EXIT_OK: i32 = 0;
pub const EXIT_NOT_FOUND: i32 = 1;
pub const EXIT_CONFIG: i32 = 2;
/// A command line clap or a command refuses: the same code as a config error (clap's own).
pub const EXIT_USAGE: i32 = 2;
pub const EXIT_LOCKED: i32 = 3;

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

    /// A command line that cannot be run as written.
    pub fn usage(message: impl Into<String>) -> Exit {
        Exit::new(EXIT_USAGE, message)
    }

    /// clap's refusal (exit 2), or its help and version output (exit 0).
    pub fn from_clap(e: &clap::Error) -> i32 {
        if e.use_stderr() { EXIT_USAGE } else { EXIT_OK }
    }
}

fn store_code(e: &StoreError) -> i32 {
    match e {
        StoreError::SchemaTooOld { .. }
        | StoreError::SchemaTooNew { .. }
        | StoreError::Corrupt(_)
        | StoreError::Pg { .. } => EXIT_CONFIG,
        StoreError::Locked(_) => EXIT_LOCKED,
        _ => EXIT_NOT_FOUND,
    }
}

impl From<StoreError> for Exit {
    fn from(e: StoreError) -> Exit {
        Exit::new(store_code(&e), e.to_string())
    }
}

impl From<crate::ops::OpError> for Exit {
    fn from(e: crate::ops::OpError) -> Exit {
        match e {
            crate::ops::OpError::Store(s) => s.into(),
            crate::ops::OpError::Config(m) => Exit::new(EXIT_CONFIG, m),
            crate::ops::OpError::Refused(m) => Exit::new(EXIT_NOT_FOUND, m),
        }
    }
}

impl From<ConfigError> for Exit {
    fn from(e: ConfigError) -> Exit {
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

impl From<DispatchError> for Exit {
    fn from(e: DispatchError) -> Exit {
        match e {
            DispatchError::Locked(_) => Exit::new(EXIT_LOCKED, e.to_string()),
            DispatchError::SandboxRequired { .. } => Exit::new(EXIT_CONFIG, e.to_string()),
            DispatchError::Config(c) => c.into(),
            DispatchError::Store(s) => s.into(),
            other => Exit::new(EXIT_NOT_FOUND, other.to_string()),
        }
    }
}

impl From<IntakeError> for Exit {
    fn from(e: IntakeError) -> Exit {
        let code = match &e {
            IntakeError::Config(_) | IntakeError::Source { .. } => EXIT_CONFIG,
            IntakeError::Store(s) => store_code(s),
            IntakeError::Bind { in_use: true, .. } => EXIT_LOCKED,
            IntakeError::Bind { in_use: false, .. } => EXIT_CONFIG,
            IntakeError::Listen(_) | IntakeError::Io { .. } => EXIT_NOT_FOUND,
        };
        Exit::new(code, e.to_string())
    }
}
