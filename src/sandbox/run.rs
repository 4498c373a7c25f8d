//! Spawning the child and supervising it to the end: stdin, capped stdout, stderr tail, the
//! deadline and the process-group kill.
//!
//! Owns the only `Command::new` of the crate. Must not interpret exit codes or log output.
//!
//! Lifetime rules:
//! * At the deadline the group gets SIGTERM, then after `KILL_GRACE_MS` SIGKILL, so a
//!   grandchild that ignores SIGTERM dies too (seccomp keeps it from leaving the group).
//! * When the leader exits, whatever is left of its group is killed at once: nothing a child
//!   starts outlives the run (a script that wants a daemon is misusing the hook).
//! * Past the stdout cap the group is killed: the output is already unusable.
//! * If this future is dropped mid-run, `GroupKill` kills the group and tokio's
//!   `kill_on_drop` reaps the leader.
//!
//! The group is signalled by the leader's pid. Once the leader is reaped and the group is
//! empty that number could in principle be reused; the only signal sent after the reap is
//! the straggler sweep, microseconds later, and Linux allocates pids sequentially up to
//! pid_max, so hitting an unrelated new group there is not a practical risk.

use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::child::{STAGE_EXEC, STAGES};
use super::plan::{self, Prepared};
use super::{ExitStatus, Policy, RunResult, SandboxError};

/// Between SIGTERM and SIGKILL at the deadline.
pub const KILL_GRACE_MS: u64 = 1000;
/// How long pipes are still read after the group got SIGKILL (or the leader exited) before
/// giving up on an fd some escaped process keeps open.
const PIPE_DRAIN_MS: u64 = 2000;
const READ_CHUNK_BYTES: usize = 16 * 1024;

struct GroupKill {
    pgid: Option<Pid>,
}

impl GroupKill {
    fn signal(&self, signal: Signal) {
        if let Some(pgid) = self.pgid {
            // ESRCH (nobody left) is the expected outcome of a late sweep.
            let _ = killpg(pgid, signal);
        }
    }
}

impl Drop for GroupKill {
    fn drop(&mut self) {
        self.signal(Signal::SIGKILL);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Running,
    /// SIGTERM sent at the deadline; SIGKILL follows at the timer.
    Terminating,
    /// SIGKILL sent or the leader exited: drain the pipes until the timer, then stop.
    Draining,
}

/// Runs `policy` to completion. Async (tokio); callable from any tokio runtime.
pub async fn run(policy: Policy) -> Result<RunResult, SandboxError> {
    let Prepared {
        env,
        cwd,
        child,
        stage_read,
        enforcement,
        tmp,
    } = plan::prepare(&policy)?;

    let mut command = tokio::process::Command::new(&policy.argv[0]);
    command
        .args(&policy.argv[1..])
        .env_clear()
        .envs(env)
        .current_dir(&cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    // SAFETY: `apply` is async-signal-safe (see child.rs): raw syscalls on data prepared
    // before fork, no allocation, no locks.
    unsafe {
        command.pre_exec(move || child.apply());
    }
    let spawned = command.spawn();
    let started = Instant::now();
    // Closes the parent's copies of the ruleset fd and the stage pipe's write end.
    drop(command);
    let mut handle = match spawned {
        Ok(handle) => handle,
        Err(source) => {
            return Err(SandboxError::Spawn {
                stage: failed_stage(stage_read),
                source,
            });
        }
    };
    let group = GroupKill {
        pgid: handle
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .map(Pid::from_raw),
    };

    let (Some(mut stdin), Some(mut stdout), Some(mut stderr)) = (
        handle.stdin.take(),
        handle.stdout.take(),
        handle.stderr.take(),
    ) else {
        return Err(SandboxError::Io(std::io::Error::other(
            "child pipes missing",
        )));
    };
    let input = policy.stdin.clone();
    // A child that never reads stdin gets EPIPE here; that is its business, not an error.
    let writer = tokio::spawn(async move {
        let _ = stdin.write_all(&input).await;
    });

    let cap = policy.stdout_cap_bytes;
    let tail_max = policy.stderr_tail_bytes;
    let mut out = Vec::new();
    let mut overflow = false;
    let mut err_tail: Vec<u8> = Vec::new();
    let mut out_open = true;
    let mut err_open = true;
    let mut exit: Option<std::process::ExitStatus> = None;
    let mut duration = Duration::ZERO;
    let mut timed_out = false;
    let mut phase = Phase::Running;
    let mut timer = policy.deadline;
    let mut out_buf = vec![0u8; READ_CHUNK_BYTES];
    let mut err_buf = vec![0u8; READ_CHUNK_BYTES];

    while exit.is_none() || out_open || err_open {
        tokio::select! {
            status = handle.wait(), if exit.is_none() => {
                let status = status.map_err(SandboxError::Io)?;
                duration = started.elapsed();
                exit = Some(status);
                group.signal(Signal::SIGKILL);
                if phase != Phase::Draining {
                    phase = Phase::Draining;
                    timer = timer.min(Instant::now() + Duration::from_millis(PIPE_DRAIN_MS));
                }
            }
            read = stdout.read(&mut out_buf), if out_open => match read {
                Ok(0) | Err(_) => out_open = false,
                Ok(n) => {
                    let room = cap.saturating_sub(out.len());
                    out.extend_from_slice(&out_buf[..n.min(room)]);
                    if n > room {
                        overflow = true;
                        out_open = false;
                        group.signal(Signal::SIGKILL);
                        if phase != Phase::Draining {
                            phase = Phase::Draining;
                            timer = Instant::now() + Duration::from_millis(PIPE_DRAIN_MS);
                        }
                    }
                }
            },
            read = stderr.read(&mut err_buf), if err_open => match read {
                Ok(0) | Err(_) => err_open = false,
                Ok(n) => {
                    err_tail.extend_from_slice(&err_buf[..n]);
                    if err_tail.len() > tail_max {
                        err_tail.drain(..err_tail.len() - tail_max);
                    }
                }
            },
            _ = tokio::time::sleep_until(timer.into()) => match phase {
                Phase::Running => {
                    timed_out = true;
                    group.signal(Signal::SIGTERM);
                    phase = Phase::Terminating;
                    timer = Instant::now() + Duration::from_millis(KILL_GRACE_MS);
                }
                Phase::Terminating => {
                    group.signal(Signal::SIGKILL);
                    phase = Phase::Draining;
                    timer = Instant::now() + Duration::from_millis(PIPE_DRAIN_MS);
                }
                Phase::Draining => {
                    // An fd held open by something outside the group: stop reading. The
                    // leader has been SIGKILLed, so `wait` below returns promptly.
                    out_open = false;
                    err_open = false;
                    timer = Instant::now() + Duration::from_secs(3600);
                }
            },
        }
    }
    writer.abort();
    drop(group);
    drop(tmp);

    let status = exit.map_or(ExitStatus::Signal(Signal::SIGKILL as i32), |s| {
        match (s.code(), s.signal()) {
            (Some(code), _) => ExitStatus::Code(code),
            (None, Some(signal)) => ExitStatus::Signal(signal),
            (None, None) => ExitStatus::Signal(0),
        }
    });
    Ok(RunResult {
        status,
        stdout: out,
        stdout_overflow: overflow,
        stderr_tail: err_tail,
        timed_out,
        duration,
        enforcement,
    })
}

/// Names the pre-exec step that failed from the last byte the child wrote.
fn failed_stage(stage_read: std::os::fd::OwnedFd) -> &'static str {
    let mut file = std::fs::File::from(stage_read);
    let mut bytes = Vec::new();
    // Non-blocking: everything the child wrote is there, since spawn returned after it died.
    let _ = file.read_to_end(&mut bytes);
    match bytes.last() {
        None => "fork",
        Some(&STAGE_EXEC) => "exec",
        Some(&n) => STAGES.get(usize::from(n)).copied().unwrap_or("unknown"),
    }
}
