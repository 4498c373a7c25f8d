//! The sandbox: the only module that starts child processes.
//!
//! Owns: turning a declarative [`Policy`] into a running, confined child (new session,
//! no_new_privs, inherited fds closed, rlimits, every capability dropped, a Landlock ruleset,
//! a seccomp deny list, an optional empty network namespace), feeding it stdin, collecting
//! capped stdout and a short stderr tail, and killing its whole process group at the
//! deadline. [`explain`] prints the same policy for `hookspool check --explain-sandbox`.
//!
//! Must not: log a child's output or environment values (the stderr tail is handed back to
//! the caller and never logged here), read the store, or decide what an exit code means
//! (that is the caller's vocabulary, e.g. `destinations::script`).
//!
//! Invariant: `Command::new` appears nowhere else in the crate (a tidy test scans `src/`).
//! [`run_trusted`] is the one unconfined door: operator-configured commands (alerts.argv)
//! and operator tools (journalctl for `hookspool logs`), never anything fed a payload.
//! [`run_nested`] is for a process that is itself a sandbox child (the processor runtime's
//! exec processor): its confinement is the one it inherits.
//!
//! How the work is split so that the child stays async-signal-safe:
//! * `plan` (parent, before fork): validates the policy, resolves every path, computes the
//!   Landlock grants (system trees minus the denied paths), opens the ruleset fd, compiles
//!   the seccomp BPF, counts the uid's tasks for RLIMIT_NPROC, builds the environment.
//! * `child` (between fork and exec): only raw syscalls on memory prepared by the parent;
//!   no allocation, no locks, no `caps`/`landlock` crate calls that could allocate.
//! * `run` (parent, tokio): spawns, pumps the pipes, enforces the deadline, reaps.
//!
//! [`run`] is async (tokio) and may be awaited from any tokio runtime; its blocking parts are
//! the policy planning (a few dozen `open(O_PATH)` and one `/proc` scan, about a millisecond)
//! and `fork`+`exec` inside `spawn`, which is what tokio's own `Command` does as well.

mod child;
mod env;
mod explain;
mod nested;
mod paths;
mod plan;
mod policy;
mod probe;
mod run;
mod seccomp;
mod trusted;

#[cfg(test)]
mod tests;

pub use env::{EnvFileError, parse_env_file};
pub use explain::explain;
pub use nested::{NestedOutput, NestedRun, run_nested};
pub use policy::{
    DEFAULT_DENY_PATHS, Limits, OPEN_FILES_DEFAULT, PROCESSES_DEFAULT, Policy, RunAs,
    STDOUT_CAP_BYTES_DEFAULT,
};
pub use probe::{describe as describe_enforcement, probe};
pub use run::run;
pub use trusted::{TrustedOutput, run_trusted};

use std::time::Duration;

/// How the child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    /// Exited with this code.
    Code(i32),
    /// Killed by this signal (SIGKILL after a deadline, SIGSYS, SIGXCPU, ...).
    Signal(i32),
}

impl ExitStatus {
    pub fn success(self) -> bool {
        self == ExitStatus::Code(0)
    }
}

/// What one run produced. `stderr_tail` is for the caller to keep (e.g. in a detail field);
/// it may hold secrets a script printed, so nothing here ever logs it.
#[derive(Debug, Clone)]
pub struct RunResult {
    pub status: ExitStatus,
    /// At most `Policy::stdout_cap_bytes` bytes. When `stdout_overflow` is set the child was
    /// killed as soon as it passed the cap, and this is only the head: never use it as if it
    /// were the whole output.
    pub stdout: Vec<u8>,
    pub stdout_overflow: bool,
    /// The last `Policy::stderr_tail_bytes` bytes of stderr.
    pub stderr_tail: Vec<u8>,
    /// The deadline passed and the process group was killed.
    pub timed_out: bool,
    /// From spawn to the leader's exit.
    pub duration: Duration,
    pub enforcement: Enforcement,
}

/// Landlock as enforced on this kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LandlockLevel {
    /// Every access right of the ABI this module targets (`paths::LANDLOCK_ABI_TARGET`).
    Full { abi: i32 },
    /// An older ABI: some rights (truncate, ioctl, network, scoping) are not controlled.
    Partial { abi: i32 },
    /// The kernel has no Landlock (not built, or not enabled at boot).
    None,
}

/// How `network = false` was isolated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetIsolation {
    /// `network = true`: the host's network namespace.
    Shared,
    /// A new network namespace (the parent has CAP_SYS_ADMIN).
    NewNetns,
    /// A new user namespace holding a new network namespace (unprivileged parent).
    UserAndNetns,
}

/// What the sandbox enforced for one run; also what `explain` predicts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Enforcement {
    pub landlock: LandlockLevel,
    pub seccomp: bool,
    /// Effective, permitted, inheritable, ambient and bounding sets emptied.
    pub caps_dropped: bool,
    pub no_new_privs: bool,
    pub net: NetIsolation,
    /// Landlock limits TCP connect to `Policy::tcp_connect_ports` (ABI 4 and later).
    pub tcp_ports_limited: bool,
    /// RLIMIT_NPROC binds: the kernel never applies it to uid 0, whatever the capabilities.
    pub nproc_enforced: bool,
}

impl Enforcement {
    /// True when landlock and seccomp both hold: what `required = true` insists on.
    pub fn complete(&self) -> bool {
        self.seccomp && !matches!(self.landlock, LandlockLevel::None)
    }
}

/// Why the sandbox did not run a child, or lost track of it.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// The policy itself is wrong (operator configuration).
    #[error("invalid sandbox policy: {0}")]
    Policy(String),
    /// `required = true` and the kernel lacks a layer.
    #[error("sandbox required but {missing} is not available on this kernel")]
    Unavailable { missing: &'static str },
    /// Preparing the sandbox in the parent failed (tmp dir, pipes, ruleset).
    #[error("sandbox setup failed: {what}: {source}")]
    Setup {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// The child could not start: `stage` is the pre-exec step that failed, or "exec" when
    /// execve itself failed (ENOENT, EACCES, ENOEXEC).
    #[error("child could not start at {stage}: {source}")]
    Spawn {
        stage: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// Waiting for or reading from the child failed.
    #[error("child i/o failed: {0}")]
    Io(#[source] std::io::Error),
}

impl SandboxError {
    /// Whether the program itself could not be executed (missing, not executable, or not
    /// readable under the sandbox), as opposed to the sandbox failing around it.
    pub fn is_exec_failure(&self) -> bool {
        matches!(self, SandboxError::Spawn { stage: "exec", .. })
    }
}
