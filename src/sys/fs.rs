//! The one atomic file write: a temporary file beside the target, written and fsynced,
//! renamed over the target, then the directory fsynced so the rename itself survives a
//! power cut (Litestream's pattern). The processors' state and journal files and the
//! embedded bobbins written under the spool home all go through it. And the one reading of
//! free space (`free_bytes`, `spool_free_bytes`), for the intake's backpressure, status,
//! /metrics and the disk issue.
//!
//! Must not: write anywhere but `dir`; leave a temporary file behind on success.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Bytes available to an unprivileged writer on the filesystem holding `dir` (statvfs);
/// `None` when statvfs fails (the directory is gone).
pub fn free_bytes(dir: &Path) -> Option<u64> {
    nix::sys::statvfs::statvfs(dir)
        .ok()
        .map(|s| s.blocks_available().saturating_mul(s.fragment_size()))
}

/// [`free_bytes`] of the directory holding the spool database `db`.
pub fn spool_free_bytes(db: &Path) -> Option<u64> {
    free_bytes(db.parent().filter(|p| !p.as_os_str().is_empty())?)
}

/// Writes `bytes` to `dir/name` with permissions `mode`, atomically and durably. The
/// temporary name carries the process id, so two processes writing the same file never
/// share one.
pub fn atomic_write(dir: &Path, name: &str, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&tmp)?;
        f.write_all(bytes)?;
        // `mode` at create is masked by the umask; the file gets exactly `mode`.
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, dir.join(name))?;
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_the_file_with_its_mode_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), b"old").unwrap();
        atomic_write(dir.path(), "f", b"new", 0o600).unwrap();
        assert_eq!(std::fs::read(dir.path().join("f")).unwrap(), b"new");
        let mode = std::fs::metadata(dir.path().join("f"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("f")]);
    }
}
