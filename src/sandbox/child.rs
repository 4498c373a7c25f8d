//! What runs in the child between fork and exec (`pre_exec`).
//!
//! Owns the order of the confinement steps. Must not allocate, lock, log or call into crates
//! that might: after fork only this thread exists, and another thread of the dispatcher may
//! have held the allocator's lock at fork time. Everything used here (rlimit values, the
//! ruleset fd, the BPF programs, the stage pipe) was prepared by `plan` in the parent; the
//! steps are raw syscalls through `nix::libc` (or nix wrappers that are thin syscalls), and
//! errors are `io::Error::last_os_error()`/`from_raw_os_error`, which do not allocate.
//!
//! Order (the issue's, with two steps it leaves unplaced put where they must go):
//!  1. setsid: own session and process group, so the deadline kills the whole group.
//!  2. PR_SET_NO_NEW_PRIVS: exec can never gain privileges (setuid bits, file caps).
//!  3. close inherited fds: `close_range(3, MAX, CLOSE_RANGE_CLOEXEC)` marks every fd above 2
//!     close-on-exec instead of closing it now, because std's exec-error pipe, the stage pipe
//!     and the ruleset fd are still needed until exec. The effect at exec is the same: the
//!     program starts with exactly fds 0-2. Kernels before 5.11 get an fcntl loop.
//!  4. rlimits: NOFILE, NPROC, CORE 0, CPU.
//!  5. network namespace (`network = false`): needs CAP_SYS_ADMIN, so before the drop; an
//!     unprivileged dispatcher gets a user namespace around it, in which the child maps its
//!     own uid and gid to themselves ([`IdMaps`]), so it still sees itself as the service
//!     user (unmapped, getuid() would answer the overflow uid, "nobody").
//!  6. capabilities, part one: securebits locked (NOROOT: exec as uid 0 regains nothing),
//!     ambient cleared, bounding set emptied. These need CAP_SETPCAP, so they precede...
//!  7. the uid switch (`run_as`), which needs CAP_SETUID/CAP_SETGID, and then
//!  8. capabilities, part two: effective, permitted and inheritable set to empty.
//!  9. landlock_restrict_self on the ruleset built in the parent.
//! 10. the seccomp programs (last, so the steps above may still use unshare/setsid).
//!
//! Each step first writes its number to the stage pipe; when spawn fails, the parent reads
//! the last number and names the failed step.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use nix::libc;
use nix::sys::resource::{Resource, setrlimit};
use seccompiler::BpfProgram;

use super::{NetIsolation, RunAs};

/// Step names, indexed by the byte written to the stage pipe.
pub(crate) const STAGES: &[&str] = &[
    "setsid",
    "no_new_privs",
    "close_fds",
    "rlimits",
    "netns",
    "capabilities",
    "run_as",
    "capabilities",
    "landlock",
    "seccomp",
    "exec",
];
const STAGE_SETSID: u8 = 0;
const STAGE_NNP: u8 = 1;
const STAGE_FDS: u8 = 2;
const STAGE_RLIMITS: u8 = 3;
const STAGE_NETNS: u8 = 4;
const STAGE_CAPS_BOUNDING: u8 = 5;
const STAGE_RUN_AS: u8 = 6;
const STAGE_CAPS_SETS: u8 = 7;
const STAGE_LANDLOCK: u8 = 8;
const STAGE_SECCOMP: u8 = 9;
/// Written last: a spawn error after it is execve's own (ENOENT, EACCES, ENOEXEC).
pub(crate) const STAGE_EXEC: u8 = 10;

const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
const PR_SET_SECUREBITS: libc::c_int = 28;
const SECBIT_NOROOT: libc::c_ulong = 1 << 0;
const SECBIT_NOROOT_LOCKED: libc::c_ulong = 1 << 1;
const SECBIT_KEEP_CAPS_LOCKED: libc::c_ulong = 1 << 5;
const SECBIT_NO_CAP_AMBIENT_RAISE: libc::c_ulong = 1 << 6;
const SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED: libc::c_ulong = 1 << 7;
const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// Soft and hard limits for one resource.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rlimit {
    pub soft: u64,
    pub hard: u64,
}

/// The identity maps a child writes into the user namespace it creates
/// (`NetIsolation::UserAndNetns`): its own uid and gid, each mapped to itself. Formatted in
/// the parent, so the child only opens and writes. An unprivileged process may write exactly
/// this (user_namespaces(7)), the gid map only after `setgroups` is denied.
pub(crate) struct IdMaps {
    uid_map: Vec<u8>,
    gid_map: Vec<u8>,
}

impl IdMaps {
    /// This process's effective uid and gid, each mapped to itself.
    pub(crate) fn own() -> IdMaps {
        let uid = nix::unistd::geteuid().as_raw();
        let gid = nix::unistd::getegid().as_raw();
        IdMaps {
            uid_map: format!("{uid} {uid} 1\n").into_bytes(),
            gid_map: format!("{gid} {gid} 1\n").into_bytes(),
        }
    }

    /// In the child, right after `unshare(CLONE_NEWUSER)`.
    fn write(&self) -> io::Result<()> {
        write_proc_file(c"/proc/self/setgroups", b"deny")?;
        write_proc_file(c"/proc/self/uid_map", &self.uid_map)?;
        write_proc_file(c"/proc/self/gid_map", &self.gid_map)
    }
}

/// One write of `data` to a /proc file, with raw syscalls (no allocation).
fn write_proc_file(path: &std::ffi::CStr, data: &[u8]) -> io::Result<()> {
    // SAFETY: a NUL-terminated static path and integer flags.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `data` is a live slice of `data.len()` bytes; `fd` was opened above.
    let n = unsafe { libc::write(fd, data.as_ptr().cast(), data.len()) };
    let result = if n < 0 {
        Err(io::Error::last_os_error())
    } else if n as usize != data.len() {
        Err(io::Error::from_raw_os_error(libc::EIO))
    } else {
        Ok(())
    };
    // SAFETY: closes the fd opened above, once.
    unsafe { libc::close(fd) };
    result
}

/// Everything the child needs, built in the parent.
pub(crate) struct ChildPlan {
    pub nofile: Rlimit,
    pub nproc: Rlimit,
    pub cpu: Rlimit,
    pub net: NetIsolation,
    /// Written into the new user namespace (present exactly with `UserAndNetns`).
    pub id_maps: Option<IdMaps>,
    pub run_as: Option<RunAs>,
    /// Highest capability number the kernel knows (`/proc/sys/kernel/cap_last_cap`).
    pub cap_last: u32,
    pub landlock_fd: Option<OwnedFd>,
    pub seccomp: Vec<BpfProgram>,
    pub stage_fd: OwnedFd,
    /// Upper bound for the fcntl fallback when close_range is missing.
    pub fd_scan_max: libc::c_int,
}

fn check(rc: libc::c_long) -> io::Result<()> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn errno(e: nix::Error) -> io::Error {
    io::Error::from_raw_os_error(e as i32)
}

impl ChildPlan {
    fn stage(&self, stage: u8) {
        // A failed write only loses the diagnostic, never the confinement.
        // SAFETY: writes one byte from a live stack variable to an fd we own.
        unsafe {
            libc::write(self.stage_fd.as_raw_fd(), (&stage as *const u8).cast(), 1);
        }
    }

    /// Runs every step in order. Called only in the forked child.
    ///
    /// # Safety
    /// Must run between fork and exec in a single-threaded child; it changes process-wide
    /// state irreversibly (session, credentials, filters).
    pub(crate) unsafe fn apply(&self) -> io::Result<()> {
        self.stage(STAGE_SETSID);
        nix::unistd::setsid().map_err(errno)?;

        self.stage(STAGE_NNP);
        // SAFETY: prctl with integer arguments only.
        check(unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) }.into())?;

        self.stage(STAGE_FDS);
        self.cloexec_inherited_fds()?;

        self.stage(STAGE_RLIMITS);
        setrlimit(Resource::RLIMIT_NOFILE, self.nofile.soft, self.nofile.hard).map_err(errno)?;
        setrlimit(Resource::RLIMIT_NPROC, self.nproc.soft, self.nproc.hard).map_err(errno)?;
        setrlimit(Resource::RLIMIT_CORE, 0, 0).map_err(errno)?;
        setrlimit(Resource::RLIMIT_CPU, self.cpu.soft, self.cpu.hard).map_err(errno)?;

        self.stage(STAGE_NETNS);
        let flags = match self.net {
            NetIsolation::Shared => 0,
            NetIsolation::NewNetns => libc::CLONE_NEWNET,
            NetIsolation::UserAndNetns => libc::CLONE_NEWUSER | libc::CLONE_NEWNET,
        };
        if flags != 0 {
            // SAFETY: unshare takes flags only; the child is single-threaded as it requires.
            check(unsafe { libc::unshare(flags) }.into())?;
        }
        if let Some(maps) = &self.id_maps {
            maps.write()?;
        }

        self.stage(STAGE_CAPS_BOUNDING);
        self.drop_bounding_and_ambient()?;

        self.stage(STAGE_RUN_AS);
        if let Some(run_as) = self.run_as {
            let uid = nix::unistd::Uid::from_raw(run_as.uid);
            let gid = nix::unistd::Gid::from_raw(run_as.gid);
            nix::unistd::setgroups(&[]).map_err(errno)?;
            nix::unistd::setresgid(gid, gid, gid).map_err(errno)?;
            nix::unistd::setresuid(uid, uid, uid).map_err(errno)?;
        }

        self.stage(STAGE_CAPS_SETS);
        let header = CapHeader {
            version: LINUX_CAPABILITY_VERSION_3,
            pid: 0,
        };
        let data = [CapData {
            effective: 0,
            permitted: 0,
            inheritable: 0,
        }; 2];
        // SAFETY: both pointers refer to live, correctly laid out (repr(C)) stack values;
        // version 3 takes two data elements.
        check(unsafe { libc::syscall(libc::SYS_capset, &header, data.as_ptr()) })?;

        self.stage(STAGE_LANDLOCK);
        if let Some(fd) = &self.landlock_fd {
            // SAFETY: integer arguments; the fd is a Landlock ruleset built by the parent.
            check(unsafe {
                libc::syscall(libc::SYS_landlock_restrict_self, fd.as_raw_fd(), 0u32)
            })?;
        }

        self.stage(STAGE_SECCOMP);
        for program in &self.seccomp {
            // apply_filter builds a sock_fprog on the stack and makes two syscalls (prctl
            // NO_NEW_PRIVS, seccomp); it does not allocate on success, and on failure we
            // read errno before anything else can change it.
            if seccompiler::apply_filter(program).is_err() {
                return Err(io::Error::last_os_error());
            }
        }

        self.stage(STAGE_EXEC);
        Ok(())
    }

    fn cloexec_inherited_fds(&self) -> io::Result<()> {
        // SAFETY: integer arguments only.
        let rc =
            unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, CLOSE_RANGE_CLOEXEC) };
        if rc == 0 {
            return Ok(());
        }
        for fd in 3..self.fd_scan_max {
            // EBADF for fds that are not open is expected and ignored.
            // SAFETY: fcntl on an integer fd with an integer argument.
            unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
        }
        Ok(())
    }

    fn drop_bounding_and_ambient(&self) -> io::Result<()> {
        // Without CAP_SETPCAP (an unprivileged dispatcher outside a user namespace) securebits
        // and the bounding set cannot change; no_new_privs already stops exec from gaining
        // anything, and `plan` reports the bounding set as kept.
        // SAFETY: prctl with integer arguments only, here and below.
        unsafe {
            libc::prctl(
                PR_SET_SECUREBITS,
                SECBIT_NOROOT
                    | SECBIT_NOROOT_LOCKED
                    | SECBIT_KEEP_CAPS_LOCKED
                    | SECBIT_NO_CAP_AMBIENT_RAISE
                    | SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED,
                0,
                0,
                0,
            )
        };
        // EINVAL on kernels before 4.3 (no ambient set): nothing to clear.
        unsafe {
            libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_CLEAR_ALL,
                0,
                0,
                0,
            )
        };
        for cap in 0..=self.cap_last {
            let rc = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
            if rc < 0 {
                let err = io::Error::last_os_error();
                let still_held =
                    unsafe { libc::prctl(libc::PR_CAPBSET_READ, cap as libc::c_ulong, 0, 0, 0) };
                if err.raw_os_error() != Some(libc::EPERM) || still_held < 0 {
                    return Err(err);
                }
            }
        }
        Ok(())
    }
}
