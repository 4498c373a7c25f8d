//! The one wrapper around the real binary run as a service, for every test that starts one
//! (`hookspool run`, `intake`, `dispatch`): `hookspool --home <home> <command...>` with the
//! caller's environment cleaned of everything hookspool reads, listening sockets the test
//! bound itself handed over the way systemd hands them (LISTEN_FDS and LISTEN_FDNAMES on
//! fds 3.., LISTEN_PID set by the shell that execs the binary in its place), stderr
//! captured, waits for a log line or an exit, signals, and SIGKILL when dropped.
//! `RunProc`, the intake tests' `Proc` and `Intake`, `Svc` and the wiring dispatcher are thin
//! layers over it.

use std::ffi::OsString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

/// Everything in the environment hookspool reads that a test must set explicitly.
const CLEANED_ENV: &[&str] = &[
    "HOOKSPOOL_CONFIG",
    "HOOKSPOOL_HOME",
    "HOOKSPOOL_FAILPOINT",
    "HOOKSPOOL_LOG",
    "HOOKSPOOL_LOG_LEVEL",
    "HOOKSPOOL_TEST_SANDBOX_DEGRADE",
    "HOOKSPOOL_TEST_BUSY_TIMEOUT_MS",
    "NOTIFY_SOCKET",
    "WATCHDOG_USEC",
    "JOURNAL_STREAM",
    "LISTEN_FDS",
    "LISTEN_PID",
    "LISTEN_FDNAMES",
];

/// The first fd systemd passes (SD_LISTEN_FDS_START), and where the sockets are staged in
/// the child before they move there, so no socket is overwritten by another's dup2.
const LISTEN_FDS_START: i32 = 3;
const STAGING_FD: i32 = 100;

/// What to start; [`Daemon::start`] spawns it.
pub struct Spec {
    program: PathBuf,
    what: String,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    sockets: Vec<(OwnedFd, String)>,
    shell_prefix: String,
}

impl Spec {
    /// `hookspool --home <home> <args...>` with the binary under test.
    pub fn new(home: &Path, args: &[&str]) -> Spec {
        let mut all: Vec<OsString> = vec!["--home".into(), home.into()];
        all.extend(args.iter().map(OsString::from));
        Spec {
            program: super::bin(),
            what: format!("hookspool {}", args.join(" ")),
            args: all,
            env: Vec::new(),
            sockets: Vec::new(),
            shell_prefix: String::new(),
        }
    }

    /// Another binary (a copy, for the upgrade test).
    pub fn program(mut self, program: &Path) -> Spec {
        self.program = program.to_path_buf();
        self
    }

    pub fn env(mut self, k: impl Into<OsString>, v: impl Into<OsString>) -> Spec {
        self.env.push((k.into(), v.into()));
        self
    }

    /// A listening socket the service inherits, under `name` (LISTEN_FDNAMES).
    pub fn socket(mut self, fd: impl Into<OwnedFd>, name: &str) -> Spec {
        self.sockets.push((fd.into(), name.to_string()));
        self
    }

    /// Shell run just before the exec (`ulimit -n 64;`).
    pub fn shell_prefix(mut self, text: &str) -> Spec {
        self.shell_prefix = text.to_string();
        self
    }
}

/// A running service; SIGKILLed and reaped when dropped.
pub struct Daemon {
    pub child: Child,
    what: String,
    stderr: Arc<Mutex<Vec<u8>>>,
}

impl Daemon {
    pub fn start(spec: Spec) -> Daemon {
        let through_shell = !spec.sockets.is_empty() || !spec.shell_prefix.is_empty();
        let mut cmd = if through_shell {
            // $$ is the shell's pid, which exec keeps: LISTEN_PID names the service itself.
            let mut c = Command::new("/bin/sh");
            c.arg("-c")
                .arg(format!(
                    "{} LISTEN_PID=$$; export LISTEN_PID; exec \"$0\" \"$@\"",
                    spec.shell_prefix
                ))
                .arg(&spec.program);
            c
        } else {
            Command::new(&spec.program)
        };
        cmd.args(&spec.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for k in CLEANED_ENV {
            cmd.env_remove(k);
        }
        for (k, v) in &spec.env {
            cmd.env(k, v);
        }
        if !spec.sockets.is_empty() {
            let names: Vec<&str> = spec.sockets.iter().map(|(_, n)| n.as_str()).collect();
            cmd.env("LISTEN_FDS", spec.sockets.len().to_string())
                .env("LISTEN_FDNAMES", names.join(":"));
            let fds: Vec<i32> = spec.sockets.iter().map(|(fd, _)| fd.as_raw_fd()).collect();
            // SAFETY: only dup2 and close run between fork and exec, both
            // async-signal-safe; the fds stay open in this process until the spawn returned.
            // Staging every socket at a high number first keeps one socket's final place
            // (3, 4, ...) from being another's source, and gives each a copy without
            // close-on-exec.
            unsafe {
                cmd.pre_exec(move || {
                    use nix::libc;
                    for (i, fd) in fds.iter().enumerate() {
                        if libc::dup2(*fd, STAGING_FD + i as i32) < 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                    }
                    for i in 0..fds.len() as i32 {
                        if libc::dup2(STAGING_FD + i, LISTEN_FDS_START + i) < 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                        libc::close(STAGING_FD + i);
                    }
                    Ok(())
                });
            }
        }
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", spec.what));
        let stderr = super::capture_stderr(&mut child);
        // The child holds the sockets now; the test's copies close here, so a stopped
        // service refuses connections as a real one does.
        drop(spec.sockets);
        Daemon {
            child,
            what: spec.what,
            stderr,
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn log(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().unwrap()).to_string()
    }

    /// Whether a log line matching `f` arrives within `within` (a line written just before
    /// an answer may reach the stderr reader just after it).
    pub fn logged(&self, within: Duration, f: impl Fn(&str) -> bool) -> bool {
        super::eventually(within, || self.log().lines().any(&f))
    }

    /// Panics (with the log) if the process has exited.
    pub fn assert_running(&mut self, when: &str) {
        if let Some(st) = self.child.try_wait().unwrap() {
            panic!("{} exited {when} ({st:?}):\n{}", self.what, self.log());
        }
    }

    pub fn wait_log(&mut self, needle: &str, within: Duration) {
        self.wait_log_n(needle, 1, within);
    }

    /// Wait until `needle` has been logged `n` times in all; the process must stay up.
    pub fn wait_log_n(&mut self, needle: &str, n: usize, within: Duration) {
        let until = Instant::now() + within;
        while self.log().matches(needle).count() < n {
            self.assert_running(&format!("before logging {needle:?}"));
            assert!(
                Instant::now() < until,
                "{} never logged {needle:?}:\n{}",
                self.what,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// Wait until the service answers `GET /healthz` on `addr` with any HTTP status.
    pub fn wait_serving(&self, addr: std::net::SocketAddr) {
        use std::io::{Read, Write};
        let serving = super::eventually(Duration::from_secs(30), || {
            let Ok(mut s) = std::net::TcpStream::connect(addr) else {
                return false;
            };
            let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
            let get = super::intake::request("GET", "/healthz", &[], b"");
            let mut b = Vec::new();
            s.write_all(&get).is_ok() && s.read_to_end(&mut b).is_ok() && b.starts_with(b"HTTP/1.1")
        });
        assert!(
            serving,
            "{} never served {addr}:\n{}",
            self.what,
            self.log()
        );
    }

    pub fn signal(&self, sig: Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), sig).unwrap();
    }

    pub fn sigterm(&self) {
        self.signal(Signal::SIGTERM);
    }

    /// The exit status, once the process has exited within `within`.
    pub fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        let until = Instant::now() + within;
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                super::settle_stderr(&self.stderr);
                return st;
            }
            assert!(
                Instant::now() < until,
                "{} did not exit:\n{}",
                self.what,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM, then the exit status.
    pub fn stop(mut self) -> ExitStatus {
        self.sigterm();
        self.wait_exit(Duration::from_secs(30))
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
