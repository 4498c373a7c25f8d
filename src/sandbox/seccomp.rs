//! The seccomp deny list (x86_64 and aarch64), compiled to BPF in the parent.
//!
//! Owns which system calls a child may not make. Must not install anything itself: the child
//! installs the programs built here as its last step before exec.
//!
//! Denied calls fail with EPERM rather than killing the process (SIGSYS): a script that
//! probes for a feature (e.g. a runtime checking for io_uring or keyctl) degrades instead of
//! dying with a signal that reads like a crash, and the denial is still absolute. Two
//! programs are installed because `clone3` must fail with ENOSYS, not EPERM: its flags live
//! in memory a filter cannot inspect, and glibc falls back to `clone` (whose namespace flags
//! are filtered) only on ENOSYS.
//!
//! Beyond the list: `setsid` and `setpgid` (a child that left the process group would
//! survive the deadline's group kill), the new mount API (`fsopen`, `fsmount`, `move_mount`,
//! `open_tree`, `fspick`, `fsconfig`, `mount_setattr`: `mount` by another name), `clone` with
//! any namespace flag (`unshare` by another name) and io_uring (a large kernel surface whose
//! operations bypass per-syscall filtering).

use std::collections::BTreeMap;

use nix::libc;
use seccompiler::{
    BackendError, BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition,
    SeccompFilter, SeccompRule, TargetArch,
};

/// Calls denied outright.
const DENIED_SYSCALLS: &[(i64, &str)] = &[
    (libc::SYS_ptrace, "ptrace"),
    (libc::SYS_process_vm_readv, "process_vm_readv"),
    (libc::SYS_process_vm_writev, "process_vm_writev"),
    (libc::SYS_mount, "mount"),
    (libc::SYS_umount2, "umount2"),
    (libc::SYS_pivot_root, "pivot_root"),
    (libc::SYS_fsopen, "fsopen"),
    (libc::SYS_fsconfig, "fsconfig"),
    (libc::SYS_fsmount, "fsmount"),
    (libc::SYS_fspick, "fspick"),
    (libc::SYS_move_mount, "move_mount"),
    (libc::SYS_open_tree, "open_tree"),
    (libc::SYS_mount_setattr, "mount_setattr"),
    (libc::SYS_kexec_load, "kexec_load"),
    (libc::SYS_kexec_file_load, "kexec_file_load"),
    (libc::SYS_init_module, "init_module"),
    (libc::SYS_finit_module, "finit_module"),
    (libc::SYS_delete_module, "delete_module"),
    (libc::SYS_bpf, "bpf"),
    (libc::SYS_perf_event_open, "perf_event_open"),
    (libc::SYS_reboot, "reboot"),
    (libc::SYS_swapon, "swapon"),
    (libc::SYS_swapoff, "swapoff"),
    (libc::SYS_keyctl, "keyctl"),
    (libc::SYS_add_key, "add_key"),
    (libc::SYS_request_key, "request_key"),
    (libc::SYS_userfaultfd, "userfaultfd"),
    (libc::SYS_open_by_handle_at, "open_by_handle_at"),
    (libc::SYS_setns, "setns"),
    (libc::SYS_unshare, "unshare"),
    (libc::SYS_setsid, "setsid"),
    (libc::SYS_setpgid, "setpgid"),
    (libc::SYS_io_uring_setup, "io_uring_setup"),
    (libc::SYS_io_uring_enter, "io_uring_enter"),
    (libc::SYS_io_uring_register, "io_uring_register"),
];

/// `clone` flags that create namespaces.
const NAMESPACE_FLAGS: &[u64] = &[
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWCGROUP as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
];

/// `personality(0xffffffff)` only queries and `personality(PER_LINUX)` is the default.
const PERSONALITY_QUERY: u64 = 0xffff_ffff;
const PER_LINUX: u64 = 0;

/// Names of everything denied, for `explain`.
pub(crate) fn denied_names() -> Vec<&'static str> {
    let mut names: Vec<&'static str> = DENIED_SYSCALLS.iter().map(|(_, n)| *n).collect();
    names.extend([
        "personality (changes)",
        "clone (namespace flags)",
        "clone3 (ENOSYS)",
    ]);
    names
}

fn target_arch() -> Option<TargetArch> {
    if cfg!(target_arch = "x86_64") {
        Some(TargetArch::x86_64)
    } else if cfg!(target_arch = "aarch64") {
        Some(TargetArch::aarch64)
    } else {
        None
    }
}

/// Whether this kernel has seccomp filtering (`PR_GET_SECCOMP` answers EINVAL without it)
/// and this build knows the architecture.
pub(crate) fn available() -> bool {
    // SAFETY: PR_GET_SECCOMP takes no pointer arguments.
    let rc = unsafe { libc::prctl(libc::PR_GET_SECCOMP, 0, 0, 0, 0) };
    rc >= 0 && target_arch().is_some()
}

fn cond(
    op: SeccompCmpOp,
    len: SeccompCmpArgLen,
    value: u64,
) -> Result<SeccompCondition, BackendError> {
    SeccompCondition::new(0, len, op, value)
}

/// The programs to install in order. Empty when the architecture is unknown.
pub(crate) fn programs() -> seccompiler::Result<Vec<BpfProgram>> {
    let Some(arch) = target_arch() else {
        return Ok(Vec::new());
    };
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = DENIED_SYSCALLS
        .iter()
        .map(|(nr, _)| (*nr, Vec::new()))
        .collect();
    let clone_rules = NAMESPACE_FLAGS
        .iter()
        .map(|flag| {
            SeccompRule::new(vec![cond(
                SeccompCmpOp::MaskedEq(*flag),
                SeccompCmpArgLen::Qword,
                *flag,
            )?])
        })
        .collect::<Result<Vec<_>, BackendError>>()?;
    rules.insert(libc::SYS_clone, clone_rules);
    rules.insert(
        libc::SYS_personality,
        vec![SeccompRule::new(vec![
            cond(SeccompCmpOp::Ne, SeccompCmpArgLen::Dword, PERSONALITY_QUERY)?,
            cond(SeccompCmpOp::Ne, SeccompCmpArgLen::Dword, PER_LINUX)?,
        ])?],
    );
    let eperm = u32::try_from(libc::EPERM).unwrap_or(1);
    let deny: BpfProgram = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(eperm),
        arch,
    )?
    .try_into()?;

    let enosys = u32::try_from(libc::ENOSYS).unwrap_or(38);
    let clone3: BpfProgram = SeccompFilter::new(
        [(libc::SYS_clone3, Vec::new())].into_iter().collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(enosys),
        arch,
    )?
    .try_into()?;
    Ok(vec![deny, clone3])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_compile_for_this_arch() {
        let progs = programs().unwrap();
        assert_eq!(progs.len(), 2);
        assert!(
            progs
                .iter()
                .all(|p| !p.is_empty() && p.len() < u16::MAX as usize)
        );
    }
}
