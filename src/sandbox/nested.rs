//! Running a program from inside a sandboxed child: the processor runtime's exec processor
//! (spec 14.3.4). The runtime itself is the script destination's child, so it already runs
//! under the script's Landlock domain, seccomp filter, empty capability sets, rlimits,
//! no_new_privs and (with `network = false`) empty network namespace; all of those are
//! inherited across fork and exec and cannot be undone by the grandchild. What this adds: a
//! cleared environment (PATH, HOME and LANG kept, plus the caller's variables), stdin,
//! capped stdout, a stderr tail, no inherited fds beyond 0-2 (std's CLOEXEC), and a deadline
//! after which the child is killed.
//!
//! Why not [`run`](super::run): its child step starts with setsid, which the sandbox's own
//! seccomp filter denies to the runtime (EPERM), and it would stack a second identical
//! ruleset for nothing. Without setsid the deadline kills the child by pid; anything the
//! child left behind is in the runtime's process group, which the script destination kills
//! when the runtime exits.
//!
//! Must not: log the child's output or environment (the caller decides what to keep).

use std::io::{Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::env::INHERITED_VARS;
use super::{ExitStatus, SandboxError};

const POLL_INTERVAL_MS: u64 = 10;
const READ_CHUNK_BYTES: usize = 16 * 1024;

/// What to run.
#[derive(Debug, Clone)]
pub struct NestedRun {
    /// An absolute path; no PATH search.
    pub program: PathBuf,
    pub cwd: PathBuf,
    pub env: Vec<(String, String)>,
    pub stdin: Vec<u8>,
    pub stdout_cap_bytes: usize,
    pub stderr_tail_bytes: usize,
    pub timeout: Duration,
}

/// How it ended.
#[derive(Debug, Clone)]
pub struct NestedOutput {
    pub status: ExitStatus,
    /// At most the cap; with `stdout_overflow` the child was killed at the cap.
    pub stdout: Vec<u8>,
    pub stdout_overflow: bool,
    pub stderr_tail: Vec<u8>,
    pub timed_out: bool,
}

/// Runs `r` to completion (blocking). See the module docs for what confines it.
pub fn run_nested(r: NestedRun) -> Result<NestedOutput, SandboxError> {
    if !r.program.is_absolute() {
        return Err(SandboxError::Policy(
            "program must be an absolute path".into(),
        ));
    }
    let mut cmd = Command::new(&r.program);
    cmd.env_clear()
        .current_dir(&r.cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for name in INHERITED_VARS {
        if let Some(v) = std::env::var_os(name) {
            cmd.env(name, v);
        }
    }
    cmd.envs(r.env.iter().map(|(k, v)| (k, v)));
    // SAFETY: prctl(PR_SET_NO_NEW_PRIVS) is one async-signal-safe syscall with no pointers.
    unsafe {
        cmd.pre_exec(|| {
            if nix::libc::prctl(nix::libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|source| SandboxError::Spawn {
        stage: "exec",
        source,
    })?;
    let (Some(mut stdin), Some(mut stdout), Some(mut stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        let _ = child.kill();
        let _ = child.wait();
        return Err(SandboxError::Io(std::io::Error::other(
            "child pipes missing",
        )));
    };
    let input = r.stdin;
    // A child that never reads stdin gets EPIPE on its side; that is its business.
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let cap = r.stdout_cap_bytes;
    let overflowed = Arc::new(AtomicBool::new(false));
    let flag = overflowed.clone();
    let out_reader = std::thread::spawn(move || {
        let mut kept = Vec::new();
        let mut chunk = vec![0u8; READ_CHUNK_BYTES];
        loop {
            match stdout.read(&mut chunk) {
                Ok(0) | Err(_) => return (kept, false),
                Ok(n) if kept.len() + n > cap => {
                    let room = cap - kept.len();
                    kept.extend_from_slice(&chunk[..room]);
                    flag.store(true, Ordering::SeqCst);
                    return (kept, true);
                }
                Ok(n) => kept.extend_from_slice(&chunk[..n]),
            }
        }
    });
    let tail_max = r.stderr_tail_bytes;
    let err_reader = std::thread::spawn(move || {
        let mut tail: Vec<u8> = Vec::new();
        let mut chunk = vec![0u8; READ_CHUNK_BYTES];
        while let Ok(n) = stderr.read(&mut chunk) {
            if n == 0 {
                break;
            }
            tail.extend_from_slice(&chunk[..n]);
            if tail.len() > tail_max {
                tail.drain(..tail.len() - tail_max);
            }
        }
        tail
    });
    let deadline = Instant::now() + r.timeout;
    let mut timed_out = false;
    let status = loop {
        if overflowed.load(Ordering::SeqCst) {
            // Past the cap the output is unusable: the child goes now.
            let _ = child.kill();
        }
        match child.try_wait().map_err(SandboxError::Io)? {
            Some(s) => break s,
            None if Instant::now() >= deadline => {
                timed_out = true;
                // ESRCH (already gone) is the outcome we want.
                let _ = child.kill();
                break child.wait().map_err(SandboxError::Io)?;
            }
            None => std::thread::sleep(Duration::from_millis(POLL_INTERVAL_MS)),
        }
    };
    let _ = writer.join();
    let (stdout, stdout_overflow) = out_reader.join().unwrap_or_default();
    let stderr_tail = err_reader.join().unwrap_or_default();
    let status = match (status.code(), status.signal()) {
        (Some(c), _) => ExitStatus::Code(c),
        (None, Some(s)) => ExitStatus::Signal(s),
        (None, None) => ExitStatus::Signal(0),
    };
    Ok(NestedOutput {
        status,
        stdout,
        stdout_overflow,
        stderr_tail,
        timed_out,
    })
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn run(script: &str, timeout_ms: u64, cap: usize) -> NestedOutput {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.sh");
        std::fs::write(&path, script).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        run_nested(NestedRun {
            program: path,
            cwd: dir.path().to_path_buf(),
            env: vec![("ONLY_THIS".into(), "yes".into())],
            stdin: b"input-line\n".to_vec(),
            stdout_cap_bytes: cap,
            stderr_tail_bytes: 8,
            timeout: Duration::from_millis(timeout_ms),
        })
        .unwrap()
    }

    #[test]
    fn stdin_env_stdout_and_the_stderr_tail() {
        // cargo sets CARGO_MANIFEST_DIR for this test process; the child must see only PATH,
        // HOME, LANG and the caller's variables.
        assert!(std::env::var_os("CARGO_MANIFEST_DIR").is_some());
        let out = run(
            "#!/bin/sh\nread line\necho \"$line $ONLY_THIS ${CARGO_MANIFEST_DIR:-unset}\"\necho 0123456789abcdef >&2\nexit 3\n",
            5000,
            1024,
        );
        assert_eq!(out.status, ExitStatus::Code(3));
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "input-line yes unset\n"
        );
        assert_eq!(out.stderr_tail, b"9abcdef\n", "the last 8 bytes");
        assert!(!out.timed_out && !out.stdout_overflow);
    }

    #[test]
    fn the_deadline_and_the_stdout_cap_kill_the_child() {
        let start = Instant::now();
        let out = run("#!/bin/sh\nexec sleep 30\n", 200, 1024);
        assert!(out.timed_out);
        assert_eq!(out.status, ExitStatus::Signal(9));
        assert!(start.elapsed() < Duration::from_secs(5));
        let out = run(
            "#!/bin/sh\nwhile :; do echo xxxxxxxxxxxxxxxx; done\n",
            5000,
            100,
        );
        assert!(out.stdout_overflow);
        assert_eq!(out.stdout.len(), 100);
    }

    #[test]
    fn a_missing_program_is_an_exec_failure() {
        let e = run_nested(NestedRun {
            program: PathBuf::from("/nonexistent/processor"),
            cwd: std::env::temp_dir(),
            env: Vec::new(),
            stdin: Vec::new(),
            stdout_cap_bytes: 10,
            stderr_tail_bytes: 10,
            timeout: Duration::from_secs(1),
        })
        .unwrap_err();
        assert!(e.is_exec_failure());
    }
}
