//! Landlock: which file hierarchies a child may use, and the ruleset fd that enforces it.
//!
//! Owns the grant computation (system trees minus denied paths), the kernel ABI probe and the
//! ruleset construction. Runs in the parent only: every `open(O_PATH)` happens before fork,
//! the child merely calls `landlock_restrict_self` on the fd built here.
//!
//! What a script gets, and why:
//! * read+execute: /usr, /bin, /sbin, /lib, /lib32, /lib64, /libx32 (interpreters and shared
//!   libraries) and /etc (ld.so.cache, passwd, nsswitch, resolv.conf, TLS roots, localtime),
//!   minus `DEFAULT_DENY_PATHS` and the policy's deny paths. /opt and /home are not granted:
//!   what lives there is site-specific and may hold other services' secrets; a script that
//!   needs them lists them in `read_paths`.
//! * read: /proc. Landlock's ptrace scoping already keeps `/proc/<pid>/environ`, `mem`, `fd`
//!   and `root` of every process outside the child's domain (the dispatcher included) closed;
//!   what stays readable is what an unprivileged process can see anyway.
//! * /dev/null read+write, /dev/zero /dev/random /dev/urandom read.
//! * read+execute, explicitly: argv[0]'s directory, the directory of any later argv element
//!   that names an existing file (the interpreter case `python3 /opt/scripts/x.py`), the cwd
//!   and the policy's `read_paths`.
//! * read+write: the policy's `write_paths` (state_dir) and the private per-run tmp dir.
//!
//! Denied paths are subtracted: a granted tree that contains one is replaced by its children
//! that do not (symlinks among them are skipped, never followed, so a link in /etc cannot
//! widen a grant). Implicit system grants inside a denied path are dropped; explicit ones
//! (a state_dir under the spool home) are kept, which is the only way into the home.

use std::collections::BTreeSet;
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};

use landlock::{
    ABI, Access, AccessFs, AccessNet, BitFlags, NetPort, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreatedAttr, Scope,
};

use super::policy::DEFAULT_DENY_PATHS;
use super::{LandlockLevel, Policy, SandboxError};

/// The ABI whose rights this module requests and was tested against (Linux 6.12): file
/// truncate and ioctl control, TCP port rules, signal and abstract-socket scoping. Newer
/// kernels enforce exactly this set; older ones get the subset they know (reported Partial).
pub(crate) const LANDLOCK_ABI_TARGET: ABI = ABI::V6;
const LANDLOCK_ABI_TARGET_NUM: i32 = 6;

const SYSTEM_EXEC_TREES: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc",
];
const SYSTEM_READ_TREES: &[&str] = &["/proc", "/dev/zero", "/dev/random", "/dev/urandom"];
const DEVICES_READ_WRITE: &[&str] = &["/dev/null"];

/// What a grant allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Rights {
    ReadExec,
    Read,
    Device,
    ReadWrite,
}

impl Rights {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Rights::ReadExec => "read+execute",
            Rights::Read => "read",
            Rights::Device => "read+write (device)",
            Rights::ReadWrite => "read+write",
        }
    }

    fn access(self) -> BitFlags<AccessFs> {
        let abi = LANDLOCK_ABI_TARGET;
        match self {
            Rights::ReadExec => AccessFs::Execute | AccessFs::ReadFile | AccessFs::ReadDir,
            Rights::Read => AccessFs::ReadFile | AccessFs::ReadDir,
            Rights::Device => {
                AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::Truncate | AccessFs::IoctlDev
            }
            Rights::ReadWrite => AccessFs::from_all(abi),
        }
    }
}

/// One requested grant and what became of it (for `explain`).
#[derive(Debug, Clone)]
pub(crate) struct GrantSummary {
    pub path: PathBuf,
    pub rights: Rights,
    /// Denied paths carved out of it.
    pub except: Vec<PathBuf>,
    pub missing: bool,
    /// Entirely inside or equal to a denied path, so nothing was granted.
    pub denied: bool,
}

/// The rules to install, one per hierarchy, and the per-request summary.
#[derive(Debug, Default)]
pub(crate) struct Grants {
    pub rules: Vec<(PathBuf, Rights)>,
    pub summary: Vec<GrantSummary>,
    pub denied: Vec<PathBuf>,
}

/// The kernel's Landlock ABI, or 0 when Landlock is absent or disabled.
pub(crate) fn kernel_abi() -> i32 {
    const LANDLOCK_CREATE_RULESET_VERSION: nix::libc::c_uint = 1;
    // SAFETY: the version query reads no memory (NULL attr, size 0) and returns an integer.
    let v = unsafe {
        nix::libc::syscall(
            nix::libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    i32::try_from(v).unwrap_or(0).max(0)
}

pub(crate) fn level(abi: i32) -> LandlockLevel {
    match abi {
        a if a <= 0 => LandlockLevel::None,
        a if a >= LANDLOCK_ABI_TARGET_NUM => LandlockLevel::Full { abi: a },
        a => LandlockLevel::Partial { abi: a },
    }
}

/// Lexical normalisation for paths that do not exist (so `..` cannot dodge a deny).
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

fn resolve(path: &Path) -> Option<PathBuf> {
    std::fs::canonicalize(path).ok()
}

/// Computes every grant for `policy`. `tmp_dir` is the private dir when it exists already.
pub(crate) fn grants(policy: &Policy, tmp_dir: Option<&Path>) -> Result<Grants, SandboxError> {
    let denied: Vec<PathBuf> = DEFAULT_DENY_PATHS
        .iter()
        .map(PathBuf::from)
        .chain(policy.deny_paths.iter().cloned())
        .map(|p| resolve(&p).unwrap_or_else(|| normalize(&p)))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let mut out = Grants {
        denied: denied.clone(),
        ..Grants::default()
    };

    let cwd_base = policy
        .cwd
        .clone()
        .or_else(|| tmp_dir.map(Path::to_path_buf));
    let mut explicit_exec: Vec<PathBuf> = Vec::new();
    if let Some(program) = policy.argv.first() {
        let program = Path::new(program);
        let program = match (&cwd_base, program.is_absolute()) {
            (Some(base), false) => base.join(program),
            _ => program.to_path_buf(),
        };
        if let Some(dir) = program.parent() {
            explicit_exec.push(dir.to_path_buf());
        }
    }
    for arg in policy.argv.iter().skip(1) {
        let p = Path::new(arg);
        if p.is_absolute()
            && p.is_file()
            && let Some(dir) = p.parent()
        {
            explicit_exec.push(dir.to_path_buf());
        }
    }
    if let Some(cwd) = &policy.cwd {
        explicit_exec.push(cwd.clone());
    }
    explicit_exec.extend(policy.read_paths.iter().cloned());

    for tree in SYSTEM_EXEC_TREES {
        add(&mut out, Path::new(tree), Rights::ReadExec, true, &denied)?;
    }
    for tree in SYSTEM_READ_TREES {
        add(&mut out, Path::new(tree), Rights::Read, true, &denied)?;
    }
    for dev in DEVICES_READ_WRITE {
        add(&mut out, Path::new(dev), Rights::Device, true, &denied)?;
    }
    let mut seen = BTreeSet::new();
    for path in explicit_exec {
        if seen.insert(path.clone()) {
            add(&mut out, &path, Rights::ReadExec, false, &denied)?;
        }
    }
    for path in policy
        .write_paths
        .iter()
        .map(PathBuf::as_path)
        .chain(tmp_dir)
    {
        add(&mut out, path, Rights::ReadWrite, false, &denied)?;
    }
    Ok(out)
}

fn add(
    out: &mut Grants,
    requested: &Path,
    rights: Rights,
    implicit: bool,
    denied: &[PathBuf],
) -> Result<(), SandboxError> {
    let mut summary = GrantSummary {
        path: requested.to_path_buf(),
        rights,
        except: Vec::new(),
        missing: false,
        denied: false,
    };
    let Some(path) = resolve(requested) else {
        summary.missing = true;
        if !implicit {
            out.summary.push(summary);
        }
        return Ok(());
    };
    if rights == Rights::ReadWrite && denied.iter().any(|d| d.starts_with(&path)) {
        return Err(SandboxError::Policy(format!(
            "write path {} contains a denied path",
            requested.display()
        )));
    }
    let inside_denied = denied.iter().any(|d| path.starts_with(d));
    if denied.contains(&path) || (implicit && inside_denied) {
        summary.denied = true;
        out.summary.push(summary);
        return Ok(());
    }
    subtract(&path, rights, denied, &mut out.rules, &mut summary.except);
    out.summary.push(summary);
    Ok(())
}

/// Grants `path` whole, or, when a denied path lies strictly inside it, each child that is
/// neither denied nor a symlink, recursing toward the denied path.
fn subtract(
    path: &Path,
    rights: Rights,
    denied: &[PathBuf],
    rules: &mut Vec<(PathBuf, Rights)>,
    except: &mut Vec<PathBuf>,
) {
    if denied.iter().any(|d| d == path) {
        except.push(path.to_path_buf());
        return;
    }
    if !denied.iter().any(|d| d.starts_with(path)) {
        rules.push((path.to_path_buf(), rights));
        return;
    }
    let Ok(entries) = std::fs::read_dir(path) else {
        return;
    };
    for entry in entries.flatten() {
        let child = entry.path();
        match std::fs::symlink_metadata(&child) {
            Ok(meta) if !meta.file_type().is_symlink() => {
                subtract(&child, rights, denied, rules, except)
            }
            _ => {}
        }
    }
}

/// Builds the ruleset in the parent. `None` when the kernel has no Landlock.
pub(crate) fn ruleset(
    grants: &Grants,
    tcp_ports: Option<&[u16]>,
) -> Result<Option<OwnedFd>, SandboxError> {
    let setup = |what: &'static str| {
        move |e: landlock::RulesetError| SandboxError::Setup {
            what,
            source: std::io::Error::other(e.to_string()),
        }
    };
    let abi = LANDLOCK_ABI_TARGET;
    let mut ruleset = Ruleset::default()
        .handle_access(AccessFs::from_all(abi))
        .map_err(setup("landlock handle fs"))?;
    if tcp_ports.is_some() {
        ruleset = ruleset
            .handle_access(AccessNet::ConnectTcp)
            .map_err(setup("landlock handle net"))?;
    }
    let mut created = ruleset
        .scope(Scope::from_all(abi))
        .map_err(setup("landlock scope"))?
        .create()
        .map_err(setup("landlock create"))?;
    for (path, rights) in &grants.rules {
        // A path that vanished since `grants` ran is skipped: it cannot be used either.
        let Ok(fd) = PathFd::new(path) else { continue };
        let access = if path.is_dir() {
            rights.access()
        } else {
            rights.access() & AccessFs::from_file(abi)
        };
        created = created
            .add_rule(PathBeneath::new(fd, access))
            .map_err(setup("landlock path rule"))?;
    }
    for port in tcp_ports.unwrap_or_default() {
        created = created
            .add_rule(NetPort::new(*port, AccessNet::ConnectTcp))
            .map_err(setup("landlock port rule"))?;
    }
    Ok(created.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_denied_dir_inside_etc_is_carved_out_and_symlinks_are_not_followed() {
        let root = tempfile::tempdir().unwrap();
        let tree = root.path().join("tree");
        std::fs::create_dir_all(tree.join("secret/deeper")).unwrap();
        std::fs::create_dir_all(tree.join("public")).unwrap();
        std::fs::write(tree.join("file"), b"x").unwrap();
        std::os::unix::fs::symlink("/", tree.join("escape")).unwrap();
        let tree = std::fs::canonicalize(&tree).unwrap();
        let denied = vec![tree.join("secret")];
        let mut rules = Vec::new();
        let mut except = Vec::new();
        subtract(&tree, Rights::ReadExec, &denied, &mut rules, &mut except);
        let paths: BTreeSet<PathBuf> = rules.into_iter().map(|(p, _)| p).collect();
        assert_eq!(
            paths,
            [tree.join("file"), tree.join("public")]
                .into_iter()
                .collect()
        );
        assert_eq!(except, vec![tree.join("secret")]);
    }

    #[test]
    fn a_write_path_containing_the_home_is_refused_one_inside_is_kept() {
        let root = tempfile::tempdir().unwrap();
        let home = root.path().join("home");
        let state = home.join("scripts/demo");
        std::fs::create_dir_all(&state).unwrap();
        let mut policy = Policy::new(vec!["/bin/true".into()], std::time::Instant::now());
        policy.deny_paths = vec![home.clone()];
        policy.write_paths = vec![state.clone()];
        let g = grants(&policy, None).unwrap();
        let state = std::fs::canonicalize(&state).unwrap();
        assert!(g.rules.contains(&(state, Rights::ReadWrite)));
        policy.write_paths = vec![root.path().to_path_buf()];
        assert!(matches!(
            grants(&policy, None),
            Err(SandboxError::Policy(_))
        ));
    }

    #[test]
    fn etc_shadow_is_never_granted() {
        let policy = Policy::new(vec!["/bin/true".into()], std::time::Instant::now());
        let g = grants(&policy, None).unwrap();
        assert!(!g.rules.iter().any(|(p, _)| p == Path::new("/etc")));
        assert!(!g.rules.iter().any(|(p, _)| p.starts_with("/etc/shadow")));
        assert!(g.rules.iter().any(|(p, _)| p == Path::new("/etc/passwd")));
    }
}
