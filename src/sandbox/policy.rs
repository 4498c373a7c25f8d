//! The declarative sandbox policy: what a child may read, write, reach and consume.
//!
//! Owns the `Policy` type, its defaults and its validation. Must not touch the filesystem or
//! the kernel; resolving paths and probing support is `plan`'s job.

use std::path::PathBuf;
use std::time::Instant;

use super::SandboxError;

/// Stdout beyond this fails the run as overflow (spec 6.6: 1 MiB, never truncated silently).
pub const STDOUT_CAP_BYTES_DEFAULT: usize = 1024 * 1024;
/// How much of stderr is kept (the tail), for the caller's detail field; never logged here.
pub const STDERR_TAIL_BYTES_DEFAULT: usize = 2048;
/// RLIMIT_NOFILE for the child.
pub const OPEN_FILES_DEFAULT: u64 = 256;
/// New tasks (processes and threads) a child may start beyond what its uid already runs.
pub const PROCESSES_DEFAULT: u64 = 64;

/// Paths no child may read even though they sit inside a granted system tree: root-readable
/// credentials that uid 0 keeps reading after its capabilities are gone (it owns them), and
/// hookspool's own secret directory from the spec's examples.
pub const DEFAULT_DENY_PATHS: &[&str] = &[
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/sudoers",
    "/etc/sudoers.d",
    "/etc/ssh",
    "/etc/ssl/private",
    "/etc/hookspool",
];

/// Run the child as another user (needs the dispatcher to be root). This is what makes
/// RLIMIT_NPROC bind when the dispatcher is root: the kernel exempts uid 0 from it entirely.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunAs {
    pub uid: u32,
    pub gid: u32,
}

/// Resource limits. `processes` is added to the number of tasks the child's real uid already
/// runs when the child starts, because RLIMIT_NPROC counts every task of the uid (the
/// dispatcher's own threads included when the child runs as the dispatcher's user).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub open_files: u64,
    pub processes: u64,
    /// RLIMIT_CPU; `None` derives it from the deadline (whole seconds left, plus one).
    pub cpu_s: Option<u64>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            open_files: OPEN_FILES_DEFAULT,
            processes: PROCESSES_DEFAULT,
            cpu_s: None,
        }
    }
}

/// Everything the sandbox needs to start one child.
#[derive(Debug, Clone)]
pub struct Policy {
    /// argv[0] is a path (absolute, or relative to `cwd`); no `PATH` search is done.
    pub argv: Vec<String>,
    /// Working directory; `None` means the private per-run tmp dir.
    pub cwd: Option<PathBuf>,
    /// Extra variables in order (the env file's, then the config's, then HOOKSPOOL_*); later
    /// entries override earlier ones. PATH, HOME and LANG come from the parent and TMPDIR
    /// points at the private tmp dir; nothing else of the parent's environment is passed.
    pub env: Vec<(String, String)>,
    pub stdin: Vec<u8>,
    pub stdout_cap_bytes: usize,
    pub stderr_tail_bytes: usize,
    pub deadline: Instant,
    /// Read and execute (scripts' interpreters and libraries live in such trees).
    pub read_paths: Vec<PathBuf>,
    /// Read and write (the script's state_dir, extra configured paths). The private tmp dir
    /// is added by the sandbox itself.
    pub write_paths: Vec<PathBuf>,
    /// Never granted, even when inside a granted tree (the spool home). A write path inside
    /// a deny path stays granted (a state_dir under the home); one containing it is refused.
    pub deny_paths: Vec<PathBuf>,
    /// Where the private per-run tmp dir is created; `None` is `std::env::temp_dir()`.
    pub tmp_parent: Option<PathBuf>,
    pub network: bool,
    /// With `network = true` and Landlock ABI 4+, TCP connect only to these ports.
    pub tcp_connect_ports: Option<Vec<u16>>,
    pub limits: Limits,
    pub run_as: Option<RunAs>,
    /// Refuse to run when landlock or seccomp is unavailable instead of degrading.
    pub required: bool,
}

impl Policy {
    /// A policy with safe defaults: no extra paths, network on, default limits.
    pub fn new(argv: Vec<String>, deadline: Instant) -> Policy {
        Policy {
            argv,
            cwd: None,
            env: Vec::new(),
            stdin: Vec::new(),
            stdout_cap_bytes: STDOUT_CAP_BYTES_DEFAULT,
            stderr_tail_bytes: STDERR_TAIL_BYTES_DEFAULT,
            deadline,
            read_paths: Vec::new(),
            write_paths: Vec::new(),
            deny_paths: Vec::new(),
            tmp_parent: None,
            network: true,
            tcp_connect_ports: None,
            limits: Limits::default(),
            run_as: None,
            required: false,
        }
    }

    /// Checks that need no filesystem access.
    pub(crate) fn validate(&self) -> Result<(), SandboxError> {
        let program = match self.argv.first() {
            Some(p) if !p.is_empty() => p,
            _ => return Err(SandboxError::Policy("argv is empty".into())),
        };
        if self.argv.iter().any(|a| a.contains('\0')) {
            return Err(SandboxError::Policy("argv holds a NUL byte".into()));
        }
        if !program.contains('/') {
            return Err(SandboxError::Policy(
                "argv[0] must be a path (no PATH search is done)".into(),
            ));
        }
        for (name, value) in &self.env {
            if name.is_empty() || name.contains('=') || name.contains('\0') {
                return Err(SandboxError::Policy(
                    "environment variable name is empty or holds '=' or NUL".into(),
                ));
            }
            if value.contains('\0') {
                return Err(SandboxError::Policy(format!(
                    "environment variable {name} holds a NUL byte"
                )));
            }
        }
        if self.limits.open_files < 3 {
            return Err(SandboxError::Policy("limits.open_files is below 3".into()));
        }
        if self.limits.processes == 0 {
            return Err(SandboxError::Policy("limits.processes is 0".into()));
        }
        if self.run_as.is_some() && !nix::unistd::geteuid().is_root() {
            return Err(SandboxError::Policy(
                "run_as needs a root dispatcher".into(),
            ));
        }
        Ok(())
    }
}
