//! Trusted operator commands: run a program the operator configured or asked for, without
//! confinement, with a deadline.
//!
//! Three callers, all acting for the operator rather than on delivered data:
//! * `alerts.argv` (spec 11.4): the deployment's chat sender. It needs what the operator's
//!   own shell has: a PATH search (the spec's default is `["logger", "-t", "hookspool"]`),
//!   the network, and its own credentials, which may live under `/etc/hookspool`, a path
//!   every sandboxed script is denied. Its only input from the spool is the alert text,
//!   built from ids, names and scrubbed errors.
//! * `hookspool logs <batch>`: `journalctl BATCH=<id>`, run from the operator's terminal.
//! * `hookspool bobbin check --base <ref>`: `git` on the operator's own checkout (the scope
//!   row), run from a terminal or CI.
//!
//! Script destinations never come here: they run payloads and always go through [`run`].
//!
//! Owns: spawning the command in its own process group (so a deadline kills every process
//! it started), reading at most `stdout_cap_bytes` of stdout, and the deadline. Must not:
//! log the command's output or its arguments (an alert text is operator-visible but belongs
//! in the chat, not in the journal twice), or be used for anything that handles payloads.
//!
//! [`run`]: super::run

use std::io::Read;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use super::{ExitStatus, SandboxError};

/// How often the child is polled for its exit.
const POLL_INTERVAL_MS: u64 = 20;

/// What a trusted command did.
#[derive(Debug, Clone)]
pub struct TrustedOutput {
    pub status: ExitStatus,
    /// At most the cap; `stdout_overflow` says the rest was discarded (the command ran on).
    pub stdout: Vec<u8>,
    pub stdout_overflow: bool,
    /// The deadline passed and the process group was killed.
    pub timed_out: bool,
}

/// Run `argv` (argv[0] is searched in PATH) with stdin closed, the caller's environment,
/// stdout captured up to `stdout_cap_bytes` and stderr either inherited (a terminal
/// command) or discarded (a background alert). Blocks until the command ends or `timeout`
/// passes; then the whole group is killed.
pub fn run_trusted(
    argv: &[String],
    timeout: Duration,
    stdout_cap_bytes: usize,
    inherit_stderr: bool,
) -> Result<TrustedOutput, SandboxError> {
    let Some(program) = argv.first().filter(|p| !p.is_empty()) else {
        return Err(SandboxError::Policy("argv is empty".into()));
    };
    let mut child = Command::new(program)
        .args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(if inherit_stderr {
            Stdio::inherit()
        } else {
            Stdio::null()
        })
        .process_group(0)
        .spawn()
        .map_err(|source| SandboxError::Spawn {
            stage: "exec",
            source,
        })?;
    let pgid = Pid::from_raw(child.id() as i32);
    // Reading stdout on a thread keeps a chatty command from blocking on a full pipe while
    // this thread watches the deadline.
    let reader = child.stdout.take().map(|mut out| {
        std::thread::spawn(move || {
            let mut kept = Vec::new();
            let mut overflow = false;
            let mut chunk = [0u8; 8192];
            loop {
                match out.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        let room = stdout_cap_bytes.saturating_sub(kept.len());
                        kept.extend_from_slice(&chunk[..n.min(room)]);
                        overflow |= n > room;
                    }
                }
            }
            (kept, overflow)
        })
    });
    let deadline = Instant::now() + timeout;
    let mut timed_out = false;
    let status = loop {
        match child.try_wait().map_err(SandboxError::Io)? {
            Some(s) => break s,
            None if Instant::now() >= deadline => {
                timed_out = true;
                // ESRCH means the group is already gone, which is what we want.
                let _ = killpg(pgid, Signal::SIGKILL);
                break child.wait().map_err(SandboxError::Io)?;
            }
            None => std::thread::sleep(Duration::from_millis(POLL_INTERVAL_MS)),
        }
    };
    // Whatever the leader left behind in its group goes with it.
    let _ = killpg(pgid, Signal::SIGKILL);
    let (stdout, stdout_overflow) = reader.and_then(|r| r.join().ok()).unwrap_or_default();
    let status = match (status.code(), status.signal()) {
        (Some(c), _) => ExitStatus::Code(c),
        (None, Some(s)) => ExitStatus::Signal(s),
        (None, None) => ExitStatus::Signal(0),
    };
    Ok(TrustedOutput {
        status,
        stdout,
        stdout_overflow,
        timed_out,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn runs_with_path_search_and_reports_the_code() {
        let out = run_trusted(
            &argv(&["sh", "-c", "printf hi; exit 3"]),
            Duration::from_secs(10),
            1024,
            false,
        )
        .expect("run");
        assert_eq!(out.status, ExitStatus::Code(3));
        assert_eq!(out.stdout, b"hi");
        assert!(!out.timed_out);
    }

    #[test]
    fn deadline_kills_the_group() {
        let start = Instant::now();
        let out = run_trusted(
            &argv(&["sh", "-c", "sleep 30 & sleep 30"]),
            Duration::from_millis(300),
            1024,
            false,
        )
        .expect("run");
        assert!(out.timed_out);
        assert_eq!(out.status, ExitStatus::Signal(9));
        assert!(start.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn stdout_is_capped_and_missing_programs_are_spawn_errors() {
        let out = run_trusted(
            &argv(&["sh", "-c", "head -c 5000 /dev/zero"]),
            Duration::from_secs(10),
            100,
            false,
        )
        .expect("run");
        assert_eq!(out.stdout.len(), 100);
        assert!(out.stdout_overflow);
        let e = run_trusted(
            &argv(&["/nonexistent/hookspool-alert"]),
            Duration::from_secs(1),
            10,
            false,
        )
        .unwrap_err();
        assert!(e.is_exec_failure(), "{e}");
    }
}
