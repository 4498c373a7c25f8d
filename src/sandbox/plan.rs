//! Turning a `Policy` into what the child needs, in the parent, before fork.
//!
//! Owns the kernel probes (Landlock ABI, seccomp, capabilities), the private tmp dir, the
//! RLIMIT_NPROC arithmetic and the `Enforcement` prediction. Must not fork or exec.

use std::os::fd::OwnedFd;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use caps::{CapSet, Capability};
use nix::libc;
use nix::sys::resource::{Resource, getrlimit};

use super::child::{ChildPlan, IdMaps, Rlimit};
use super::{Enforcement, LandlockLevel, NetIsolation, Policy, SandboxError, env, paths, seccomp};

/// Seconds of CPU allowed beyond the wall-clock budget before SIGXCPU (the deadline kill is
/// the real bound; this one catches a busy loop that somehow outlives it).
const CPU_SLACK_S: u64 = 1;
/// The hard CPU limit sits this far above the soft one: SIGXCPU first, then SIGKILL.
const CPU_HARD_EXTRA_S: u64 = 1;
/// Upper bound for the fcntl loop on kernels without close_range.
const FD_SCAN_MAX: u64 = 65_536;
/// Mode of the private tmp dir: owner only.
const TMP_DIR_MODE: u32 = 0o700;

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// The per-run private tmp dir; removed when dropped.
#[derive(Debug)]
pub(crate) struct TmpDir {
    pub path: PathBuf,
}

impl Drop for TmpDir {
    fn drop(&mut self) {
        if let Err(error) = std::fs::remove_dir_all(&self.path) {
            // The path is ours (not script output), so it is safe to log.
            tracing::warn!(path = %self.path.display(), %error, "sandbox tmp dir not removed");
        }
    }
}

/// What the sandbox would enforce for this policy on this kernel (no side effects).
pub(crate) fn predict(policy: &Policy) -> Enforcement {
    let abi = paths::kernel_abi();
    let target_uid = policy
        .run_as
        .map(|r| r.uid)
        .unwrap_or_else(|| nix::unistd::getuid().as_raw());
    let can_setpcap = has_cap(Capability::CAP_SETPCAP);
    let net = if policy.network {
        NetIsolation::Shared
    } else if has_cap(Capability::CAP_SYS_ADMIN) {
        NetIsolation::NewNetns
    } else {
        NetIsolation::UserAndNetns
    };
    let bounding_empty = caps::read(None, CapSet::Bounding).is_ok_and(|s| s.is_empty());
    Enforcement {
        landlock: paths::level(abi),
        seccomp: seccomp::available(),
        caps_dropped: can_setpcap || bounding_empty || net == NetIsolation::UserAndNetns,
        no_new_privs: true,
        net,
        tcp_ports_limited: policy.network && policy.tcp_connect_ports.is_some() && abi >= 4,
        nproc_enforced: target_uid != 0,
    }
}

fn has_cap(cap: Capability) -> bool {
    caps::has_cap(None, CapSet::Effective, cap).unwrap_or(false)
}

/// Everything `run` needs to spawn.
pub(crate) struct Prepared {
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    pub child: ChildPlan,
    pub stage_read: OwnedFd,
    pub enforcement: Enforcement,
    /// Dropped after the run (removes the dir).
    pub tmp: TmpDir,
}

pub(crate) fn prepare(policy: &Policy) -> Result<Prepared, SandboxError> {
    policy.validate()?;
    let enforcement = predict(policy);
    if policy.required {
        if matches!(enforcement.landlock, LandlockLevel::None) {
            return Err(SandboxError::Unavailable {
                missing: "landlock",
            });
        }
        if !enforcement.seccomp {
            return Err(SandboxError::Unavailable { missing: "seccomp" });
        }
    }

    let tmp = make_tmp_dir(policy)?;
    let grants = paths::grants(policy, Some(&tmp.path))?;
    let landlock_fd = if matches!(enforcement.landlock, LandlockLevel::None) {
        None
    } else {
        let ports = if policy.network {
            policy.tcp_connect_ports.as_deref()
        } else {
            None
        };
        paths::ruleset(&grants, ports)?
    };
    let seccomp = if enforcement.seccomp {
        seccomp::programs().map_err(|e| SandboxError::Setup {
            what: "seccomp compile",
            source: std::io::Error::other(e.to_string()),
        })?
    } else {
        Vec::new()
    };

    let target_uid = policy
        .run_as
        .map(|r| r.uid)
        .unwrap_or_else(|| nix::unistd::getuid().as_raw());
    let nproc = uid_task_count(target_uid).saturating_add(policy.limits.processes);
    let cpu_s = policy.limits.cpu_s.unwrap_or_else(|| {
        let left = policy.deadline.saturating_duration_since(Instant::now());
        left.as_secs() + u64::from(left.subsec_nanos() > 0) + CPU_SLACK_S
    });
    let fd_scan_max = getrlimit(Resource::RLIMIT_NOFILE)
        .map(|(soft, _)| soft.min(FD_SCAN_MAX))
        .unwrap_or(FD_SCAN_MAX);

    let (stage_read, stage_write) = nix::unistd::pipe2(
        nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK,
    )
    .map_err(|e| SandboxError::Setup {
        what: "stage pipe",
        source: std::io::Error::from_raw_os_error(e as i32),
    })?;

    let child = ChildPlan {
        nofile: Rlimit {
            soft: policy.limits.open_files,
            hard: policy.limits.open_files,
        },
        nproc: Rlimit {
            soft: nproc,
            hard: nproc,
        },
        cpu: Rlimit {
            soft: cpu_s.max(1),
            hard: cpu_s.max(1) + CPU_HARD_EXTRA_S,
        },
        net: enforcement.net,
        id_maps: (enforcement.net == NetIsolation::UserAndNetns).then(IdMaps::own),
        run_as: policy.run_as,
        cap_last: cap_last(),
        landlock_fd,
        seccomp,
        stage_fd: stage_write,
        fd_scan_max: libc::c_int::try_from(fd_scan_max).unwrap_or(libc::c_int::MAX),
    };
    Ok(Prepared {
        env: env::compose(&policy.env, &tmp.path),
        cwd: policy.cwd.clone().unwrap_or_else(|| tmp.path.clone()),
        child,
        stage_read,
        enforcement,
        tmp,
    })
}

fn make_tmp_dir(policy: &Policy) -> Result<TmpDir, SandboxError> {
    let parent = policy.tmp_parent.clone().unwrap_or_else(std::env::temp_dir);
    let name = format!(
        "hookspool-run-{}-{}",
        std::process::id(),
        TMP_COUNTER.fetch_add(1, Ordering::Relaxed)
    );
    let path = parent.join(name);
    let setup = |what| move |source| SandboxError::Setup { what, source };
    std::fs::DirBuilder::new()
        .mode(TMP_DIR_MODE)
        .create(&path)
        .map_err(setup("create private tmp dir"))?;
    let tmp = TmpDir { path };
    // The umask may have narrowed the mode; make it exact.
    std::fs::set_permissions(&tmp.path, std::fs::Permissions::from_mode(TMP_DIR_MODE))
        .map_err(setup("chmod private tmp dir"))?;
    if let Some(run_as) = policy.run_as {
        std::os::unix::fs::chown(&tmp.path, Some(run_as.uid), Some(run_as.gid))
            .map_err(setup("chown private tmp dir"))?;
    }
    Ok(tmp)
}

fn cap_last() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| {
            caps::all()
                .iter()
                .map(|c| u32::from(c.index()))
                .max()
                .unwrap_or(63)
        })
}

/// Tasks (threads included) whose real uid is `uid`, as RLIMIT_NPROC counts them. Falls back
/// to this process's own thread count when /proc cannot be read (hidepid, ProtectProc).
pub(crate) fn uid_task_count(uid: u32) -> u64 {
    let own = || threads_of(Path::new("/proc/self/status")).map_or(1, |(_, t)| t);
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return own();
    };
    let mut total = 0u64;
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        if let Some((real_uid, threads)) = threads_of(&entry.path().join("status"))
            && real_uid == uid
        {
            total += threads;
        }
    }
    // We always count ourselves when the uid is ours; zero means /proc hides us.
    if total == 0 && uid == nix::unistd::getuid().as_raw() {
        own()
    } else {
        total
    }
}

fn threads_of(status: &Path) -> Option<(u32, u64)> {
    let text = std::fs::read_to_string(status).ok()?;
    let mut uid = None;
    let mut threads = None;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("Uid:") {
            uid = rest.split_whitespace().next().and_then(|v| v.parse().ok());
        } else if let Some(rest) = line.strip_prefix("Threads:") {
            threads = rest.trim().parse().ok();
        }
    }
    Some((uid?, threads?))
}
