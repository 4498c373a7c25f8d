//! The two services as separate processes of the real binary: `hookspool intake` and
//! `hookspool dispatch`, started, SIGKILLed, restarted and finally stopped with SIGTERM by
//! the orchestrator. A process that exits on its own is recorded (with the tail of its log)
//! and restarted a second later, as systemd's Restart= would.
//!
//! Children get SIGKILL from the kernel if the soak dies (PR_SET_PDEATHSIG), so no run
//! leaves a service behind. They are spawned from the main thread only: the death signal
//! follows the thread that forked.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// How long a service that exited on its own stays down before it is started again.
pub const RESTART_DELAY: Duration = Duration::from_secs(1);
/// How long SIGTERM may take before SIGKILL.
pub const STOP_BOUND: Duration = Duration::from_secs(30);
const LOG_TAIL_BYTES: u64 = 1500;

/// A service that exited without being killed by the soak.
#[derive(Clone, Debug)]
pub struct SelfExit {
    pub at_s: f64,
    pub status: String,
    pub during_disk: bool,
    pub log_tail: String,
}

pub struct Service {
    /// The host's name (`--hosts`) or the command's.
    pub name: &'static str,
    /// `intake` or `dispatch`.
    pub command: &'static str,
    /// The network namespace it runs in (`ip netns exec`), with `--hosts`.
    netns: Option<String>,
    bin: PathBuf,
    home: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    restart_at: Option<Instant>,
    pub starts: u32,
    pub kills: u32,
    pub exits: Vec<SelfExit>,
    /// The largest VmHWM (peak resident set) of any incarnation, KiB.
    pub peak_rss_kib: u64,
    /// CPU time (user + system, clock ticks) of the finished incarnations, and the last
    /// sample of the running one.
    cpu_ticks_done: u64,
    cpu_ticks_now: u64,
    log_start: u64,
}

impl Service {
    pub fn new(name: &'static str, bin: &Path, home: &Path, log_dir: &Path) -> Service {
        Service::on_host(name, name, None, bin, home, log_dir)
    }

    /// `command` on host `name`: in network namespace `netns` when given (`ip netns exec`,
    /// which execs the binary, so the pid is the service's).
    pub fn on_host(
        name: &'static str,
        command: &'static str,
        netns: Option<String>,
        bin: &Path,
        home: &Path,
        log_dir: &Path,
    ) -> Service {
        Service {
            name,
            command,
            netns,
            bin: bin.to_path_buf(),
            home: home.to_path_buf(),
            log: log_dir.join(format!("{name}.log")),
            child: None,
            restart_at: None,
            starts: 0,
            kills: 0,
            exits: Vec::new(),
            peak_rss_kib: 0,
            cpu_ticks_done: 0,
            cpu_ticks_now: 0,
            log_start: 0,
        }
    }

    pub fn running(&self) -> bool {
        self.child.is_some()
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn start(&mut self, t_s: f64) -> std::io::Result<()> {
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        writeln!(log, "=== soak: start {} at t={t_s:.1}s", self.starts + 1)?;
        self.log_start = log.seek(SeekFrom::End(0))?;
        let mut c = match &self.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(&self.bin);
                c
            }
            None => Command::new(&self.bin),
        };
        c.arg("--home")
            .arg(&self.home)
            .arg(self.command)
            .env_remove("HOOKSPOOL_CONFIG")
            .env_remove("HOOKSPOOL_HOME")
            .env_remove("HOOKSPOOL_FAILPOINT")
            .env_remove("NOTIFY_SOCKET")
            .env_remove("JOURNAL_STREAM")
            .env_remove("LISTEN_FDS")
            .env_remove("LISTEN_PID")
            .env_remove("LISTEN_FDNAMES")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
        unsafe {
            c.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)
            });
        }
        self.child = Some(c.spawn()?);
        self.starts += 1;
        self.restart_at = None;
        Ok(())
    }

    /// SIGKILL now (recording the peak RSS first) and wait for it.
    pub fn sigkill(&mut self) {
        self.sample_rss();
        if let Some(mut c) = self.child.take() {
            let _ = kill(Pid::from_raw(c.id() as i32), Signal::SIGKILL);
            let _ = c.wait();
            self.kills += 1;
            self.ended();
        }
    }

    /// Reap an exit the soak did not cause, and restart when its delay has passed.
    /// Returns the exit when one was just seen.
    pub fn poll(&mut self, t_s: f64, during_disk: bool) -> Option<SelfExit> {
        let mut seen = None;
        if let Some(c) = self.child.as_mut() {
            match c.try_wait() {
                Ok(Some(status)) => {
                    self.child = None;
                    self.ended();
                    let e = SelfExit {
                        at_s: t_s,
                        status: describe(status),
                        during_disk,
                        log_tail: self.log_tail(),
                    };
                    self.exits.push(e.clone());
                    self.restart_at = Some(Instant::now() + RESTART_DELAY);
                    seen = Some(e);
                }
                Ok(None) => self.sample_rss(),
                Err(_) => {}
            }
        }
        if self.child.is_none()
            && self.restart_at.is_some_and(|at| Instant::now() >= at)
            && let Err(e) = self.start(t_s)
        {
            eprintln!("soak: restarting {}: {e}", self.name);
        }
        seen
    }

    /// Start again at a later poll (after a SIGKILL: the orchestrator picks the delay).
    pub fn restart_after(&mut self, d: Duration) {
        self.restart_at = Some(Instant::now() + d);
    }

    /// SIGTERM and wait (SIGKILL after [`STOP_BOUND`]); the exit status as text.
    pub fn stop(&mut self) -> Option<String> {
        self.sample_rss();
        let mut c = self.child.take()?;
        self.ended();
        let _ = kill(Pid::from_raw(c.id() as i32), Signal::SIGTERM);
        let until = Instant::now() + STOP_BOUND;
        loop {
            if let Ok(Some(st)) = c.try_wait() {
                return Some(describe(st));
            }
            if Instant::now() >= until {
                let _ = c.kill();
                let st = c.wait().ok()?;
                return Some(format!("{} (SIGKILL after {STOP_BOUND:?})", describe(st)));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Peak RSS and CPU time so far (sampled every tick, and just before a kill).
    pub fn sample_rss(&mut self) {
        if let Some(pid) = self.pid() {
            if let Some(kib) = vm_hwm_kib(pid) {
                self.peak_rss_kib = self.peak_rss_kib.max(kib);
            }
            if let Some(t) = cpu_ticks(pid) {
                self.cpu_ticks_now = t;
            }
        }
    }

    /// CPU seconds of every incarnation together (up to the last sample of each).
    pub fn cpu_s(&self) -> f64 {
        let tck = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
            .ok()
            .flatten()
            .unwrap_or(100)
            .max(1);
        (self.cpu_ticks_done + self.cpu_ticks_now) as f64 / tck as f64
    }

    fn ended(&mut self) {
        self.cpu_ticks_done += self.cpu_ticks_now;
        self.cpu_ticks_now = 0;
    }

    /// A dispatcher that holds the spool's dispatcher lock: running, and its log since this
    /// start says "dispatcher ready" (a standby says so only once it took the lock).
    pub fn active(&self) -> bool {
        self.command == "dispatch"
            && self.running()
            && self.log_since_start().contains("dispatcher ready")
    }

    /// How many times this service took the dispatcher lock as a standby (every incarnation).
    pub fn takeovers(&self) -> usize {
        std::fs::read_to_string(&self.log)
            .map(|l| {
                l.matches("active: took the spool's dispatcher lock")
                    .count()
            })
            .unwrap_or(0)
    }

    /// Whether this incarnation's log holds `what`.
    pub fn logged_since_start(&self, what: &str) -> bool {
        self.log_since_start().contains(what)
    }

    fn log_since_start(&self) -> String {
        let Ok(mut f) = File::open(&self.log) else {
            return String::new();
        };
        let mut s = String::new();
        if f.seek(SeekFrom::Start(self.log_start)).is_ok() {
            let _ = f.read_to_string(&mut s);
        }
        s
    }

    fn log_tail(&self) -> String {
        let Ok(mut f) = File::open(&self.log) else {
            return String::new();
        };
        let end = f.seek(SeekFrom::End(0)).unwrap_or(0);
        let from = end.saturating_sub(LOG_TAIL_BYTES).max(self.log_start);
        let mut s = String::new();
        if f.seek(SeekFrom::Start(from)).is_ok() {
            let _ = f.read_to_string(&mut s);
        }
        s
    }
}

fn describe(st: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (st.code(), st.signal()) {
        (Some(c), _) => format!("exit {c}"),
        (None, Some(s)) => format!("signal {s}"),
        _ => format!("{st}"),
    }
}

/// Peak resident set of a process (VmHWM in /proc/<pid>/status), KiB.
pub fn vm_hwm_kib(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// utime + stime of a process (/proc/<pid>/stat fields 14 and 15), clock ticks.
fn cpu_ticks(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces; the fields after its ')' do not.
    let rest = s.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state): utime is field 14, stime field 15.
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some(utime + stime)
}
