//! The spool's own filesystem: a size-limited tmpfs mounted (in the soak's private mount
//! namespace) for the spool home, and the filler that makes it full during a disk episode.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Mount a tmpfs of `size_bytes` at `dir` with mount(8). The soak runs in its own mount
/// namespace (see `mod.rs`), so the mount disappears with the soak's last process.
pub fn mount_tmpfs(dir: &Path, size_bytes: u64) -> std::io::Result<()> {
    let st = Command::new("mount")
        .args(["-t", "tmpfs", "-o"])
        .arg(format!("size={size_bytes},mode=0700"))
        .arg("hookspool-soak")
        .arg(dir)
        .status()?;
    if st.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(format!("mount -t tmpfs: {st}")))
    }
}

pub fn unmount(dir: &Path) -> std::io::Result<()> {
    let st = Command::new("umount").arg(dir).status()?;
    if st.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(format!(
            "umount {}: {st}",
            dir.display()
        )))
    }
}

/// Bytes available on the filesystem holding `dir`.
pub fn free_bytes(dir: &Path) -> u64 {
    nix::sys::statvfs::statvfs(dir)
        .map(|s| s.blocks_available().saturating_mul(s.fragment_size()))
        .unwrap_or(0)
}

/// Bytes in use on the filesystem holding `dir`.
pub fn used_bytes(dir: &Path) -> u64 {
    nix::sys::statvfs::statvfs(dir)
        .map(|s| (s.blocks().saturating_sub(s.blocks_free())).saturating_mul(s.fragment_size()))
        .unwrap_or(0)
}

/// One file that takes every free byte of the filesystem, topped up while the episode lasts
/// (the spool may free pages, e.g. when a WAL checkpoint lets SQLite reuse its file).
pub struct Filler {
    path: PathBuf,
    file: Option<File>,
    pub bytes: u64,
}

impl Filler {
    pub fn new(path: PathBuf) -> Filler {
        Filler {
            path,
            file: None,
            bytes: 0,
        }
    }

    /// Write until the filesystem refuses (ENOSPC); the bytes this call added.
    pub fn fill(&mut self) -> std::io::Result<u64> {
        if self.file.is_none() {
            self.file = Some(
                OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&self.path)?,
            );
        }
        let Some(f) = self.file.as_mut() else {
            return Ok(0);
        };
        let mut added = 0u64;
        for chunk in [1 << 20, 1 << 12, 1 << 9] {
            let buf = vec![0u8; chunk];
            loop {
                match f.write(&buf) {
                    Ok(0) => break,
                    Ok(n) => added += n as u64,
                    Err(e) if e.raw_os_error() == Some(nix::libc::ENOSPC) => break,
                    Err(e) => return Err(e),
                }
            }
        }
        self.bytes += added;
        Ok(added)
    }

    /// Give the space back.
    pub fn free(&mut self) -> std::io::Result<()> {
        self.file = None;
        self.bytes = 0;
        match std::fs::remove_file(&self.path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}
