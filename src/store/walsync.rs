//! The WAL's sync, taken out of COMMIT: the intake's pipelined group commit
//! (`intake::writer` says how it is used; this file says why it is sound on SQLite).
//!
//! `Store::defer_commit_sync` sets `PRAGMA synchronous = NORMAL` on one connection and
//! returns a [`WalSync`]: a descriptor of its own on that connection's `-wal` file, whose
//! `sync` is one `fdatasync`. The caller then owns durability: a transaction of that
//! connection is durable only once a `WalSync::sync` that began after its COMMIT returned
//! has succeeded.
//!
//! What SQLite still syncs itself at NORMAL, from the bundled source (3.54.1, `pager.c`
//! `sqlite3PagerSetFlags` and `wal.c`; the documentation of `PRAGMA synchronous` says the
//! same: "in WAL mode when synchronous is NORMAL, the WAL file is synchronized before each
//! checkpoint and the database file is synchronized after each completed checkpoint and the
//! WAL file header is synchronized when a WAL file begins to be reused after a checkpoint"):
//! `walSyncFlags` keeps the checkpoint's flags (`CKPT_SYNC_FLAGS` = SQLITE_SYNC_NORMAL) and
//! drops the commit's (`WAL_SYNC_FLAGS` = 0). So `sqlite3WalFrames` no longer syncs after
//! a commit frame (and pads nothing: padding only comes with that sync, and the unix VFS
//! declares powersafe overwrite anyway), but it still syncs the WAL header when it writes
//! one (frame 0: a new WAL, or a WAL restarted after a complete checkpoint, before any frame
//! of the new generation), and `walCheckpoint` still syncs the WAL before copying frames
//! into the database file and the database file before it records them as backfilled.
//!
//! Why a sync on another descriptor covers SQLite's writes, and keeps covering them:
//! - `fdatasync` flushes the file (the inode), whichever descriptor names it; the size
//!   change of a growing WAL is part of what it flushes.
//! - The file is the same inode for the connection's life. SQLite deletes a WAL only when
//!   the last connection closes, after taking an EXCLUSIVE lock on the database file
//!   (`sqlite3WalClose`), and a connection in WAL mode keeps its SHARED lock on the database
//!   file until it closes (`pager_unlock` leaves it in WAL mode): while this connection is
//!   open nobody can delete the WAL, and a `wal_checkpoint(TRUNCATE)` truncates it in place.
//!   `defer_commit_sync` checks at the start that the file it opened is the file SQLite
//!   holds open (every descriptor of this process on that path is the same inode), and
//!   `sync` checks after each flush that the inode still has a name (a WAL unlinked under
//!   us fails the sync instead of acknowledging writes to a file recovery will not read).
//! - A restart after a checkpoint overwrites old frames from the start of the file. It
//!   happens only when every frame is backfilled (`walRestartLog`: `nBackfill == mxFrame`),
//!   and a checkpoint sets `nBackfill` only after syncing the WAL and then the database
//!   file; so frames overwritten by a restart were durable in the database file before the
//!   overwrite, whoever ran the checkpoint (every other connection on the spool keeps
//!   synchronous = FULL, whose checkpoints sync the same way). The new header (new salts)
//!   is synced before the first frame of the new generation is written, so after a cut the
//!   old frames fail the salt check and recovery reads only the new generation, which
//!   holds only transactions committed after the restart.
//! - The first frame of a WAL file follows its header's sync by SQLite, and the unix VFS
//!   syncs the directory at the first sync of a WAL it opened (`UNIXFILE_DIRSYNC`), so the
//!   file's name is durable before any frame that `sync` will be asked to cover.
//!
//! What is left to the caller (the intake's writer): answer a group only after a sync that
//! started after its COMMIT returned; after a failed sync, answer nothing of that group or
//! of any later one with success (a failed `fdatasync` may have dropped pages of earlier
//! frames, on which every later commit frame's checksum chain depends), and stop.
//! The power-loss harness (tests/powerloss, tests/it/powerloss.rs) checks all of this on
//! the real binary: `fdatasync` on this descriptor is recorded like SQLite's own syncs.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::{Result, Store, StoreError, io_err};

/// A descriptor of a connection's `-wal` file and the flush that makes its writes durable.
/// `Send`: the intake's syncer thread calls `sync` while the writer thread writes.
#[derive(Debug)]
pub struct WalSync {
    file: std::fs::File,
    path: PathBuf,
}

impl WalSync {
    /// `fdatasync` of the WAL: every write SQLite finished on it before this call began is
    /// durable when it returns Ok. An error means nothing written since the last good sync
    /// can be trusted to be on disk.
    pub fn sync(&self) -> Result<()> {
        self.file
            .sync_data()
            .map_err(|e| io_err(format!("fdatasync of {}", self.path.display()), e))?;
        let meta = self
            .file
            .metadata()
            .map_err(|e| io_err(format!("fstat of {}", self.path.display()), e))?;
        if meta.nlink() == 0 {
            return Err(StoreError::Io {
                context: format!("syncing {}", self.path.display()),
                source: std::io::Error::other("the WAL file was unlinked while open"),
            });
        }
        Ok(())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Store {
    /// Turn off SQLite's sync at COMMIT on this connection (`synchronous = NORMAL`; the
    /// header and checkpoint syncs stay, see the module doc) and hand back the WAL's sync.
    /// On an error the connection is left at `synchronous = FULL`, as it was.
    pub fn defer_commit_sync(&mut self) -> Result<WalSync> {
        if self.conn.is_pg() {
            return Err(StoreError::Invalid(
                "intake.pipelined_sync is SQLite's: a PostgreSQL spool's COMMIT returns after the server's WAL flush".into(),
            ));
        }
        if !self.conn.is_autocommit() {
            return Err(StoreError::Invalid(
                "the commit sync cannot change inside a transaction".into(),
            ));
        }
        // The connection has read the database (Store::open reads the schema version), so
        // its WAL is open and exists.
        let mut wal = self.path.clone().into_os_string();
        wal.push("-wal");
        let path = PathBuf::from(wal);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| io_err(format!("opening {}", path.display()), e))?;
        same_file_as_sqlite(&file, &path)?;
        self.conn.execute_batch("PRAGMA synchronous=NORMAL;")?;
        Ok(WalSync { file, path })
    }

    /// The connection's `PRAGMA synchronous` (0 off, 1 normal, 2 full, 3 extra).
    pub fn synchronous(&self) -> Result<i64> {
        if self.conn.is_pg() {
            // synchronous_commit = on, checked at connect: COMMIT waits for the WAL flush.
            return Ok(2);
        }
        Ok(self
            .conn
            .query_row("PRAGMA synchronous", (), |r| r.get(0))?)
    }
}

/// Every other descriptor this process holds on `path` (SQLite's) is the inode `file` is,
/// and there is at least one: the file we will sync is the file SQLite writes.
fn same_file_as_sqlite(file: &std::fs::File, path: &Path) -> Result<()> {
    let ours = file
        .metadata()
        .map_err(|e| io_err(format!("fstat of {}", path.display()), e))?;
    let canonical = path
        .canonicalize()
        .map_err(|e| io_err(format!("resolving {}", path.display()), e))?;
    let fds = std::fs::read_dir("/proc/self/fd")
        .map_err(|e| io_err("listing /proc/self/fd".into(), e))?;
    let mut others = 0usize;
    for entry in fds.flatten() {
        let link = entry.path();
        let Ok(target) = std::fs::read_link(&link) else {
            continue; // closed since the listing
        };
        if target != canonical {
            continue;
        }
        let Ok(meta) = std::fs::metadata(&link) else {
            continue;
        };
        if meta.dev() != ours.dev() || meta.ino() != ours.ino() {
            return Err(StoreError::Io {
                context: format!("checking {}", path.display()),
                source: std::io::Error::other("SQLite holds another file open under this name"),
            });
        }
        others += 1;
    }
    // Ours is among them; SQLite's makes two.
    if others < 2 {
        return Err(StoreError::Io {
            context: format!("checking {}", path.display()),
            source: std::io::Error::other("SQLite does not hold the WAL open"),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::testutil::temp_sqlite_store as temp_store; // the WAL is SQLite's

    #[test]
    fn the_commit_sync_moves_to_a_descriptor_of_the_file_sqlite_writes() {
        let (_dir, mut store) = temp_store();
        assert_eq!(store.synchronous().expect("pragma"), 2, "FULL by default");
        let wal = store.defer_commit_sync().expect("the WAL's sync");
        assert_eq!(
            store.synchronous().expect("pragma"),
            1,
            "NORMAL: no sync at COMMIT"
        );
        let before = std::fs::metadata(wal.path()).expect("wal").len();
        store.set_meta("k", &"v".repeat(10_000)).expect("a write");
        // The write went to the file our descriptor names.
        let ours = wal.file.metadata().expect("fstat");
        assert!(
            ours.len() > before,
            "the COMMIT's frames are in the file we sync"
        );
        wal.sync().expect("fdatasync");
        store
            .conn
            .execute_batch("PRAGMA synchronous=FULL;")
            .expect("back to FULL");
        assert_eq!(store.synchronous().expect("pragma"), 2);
    }

    #[test]
    fn a_wal_unlinked_under_the_sync_fails_it() {
        let (_dir, mut store) = temp_store();
        let wal = store.defer_commit_sync().expect("the WAL's sync");
        wal.sync().expect("fdatasync while the WAL has its name");
        std::fs::remove_file(wal.path()).expect("unlink the WAL");
        let e = wal
            .sync()
            .expect_err("a sync of an unlinked WAL covers nothing recovery reads");
        assert!(e.to_string().contains("unlinked"), "{e}");
    }

    #[test]
    fn a_file_sqlite_does_not_hold_open_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("spool.db-wal");
        std::fs::write(&path, b"").expect("a file");
        let file = std::fs::File::open(&path).expect("open");
        let e = same_file_as_sqlite(&file, &path).expect_err("nobody else holds it");
        assert!(e.to_string().contains("does not hold"), "{e}");
    }
}
