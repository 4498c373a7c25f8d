//! The processor's state directory (HOOKSPOOL_STATE_DIR): the lock, the applied state, the
//! runtime's own state (OAuth tokens), and the one atomic file write every durable file here
//! goes through.
//!
//! Layout: `state.lock` (flock, held for the whole batch), `state.json` (the values the
//! processor saved plus `applied_seq`, the last journal applied), `runtime.json` (cached
//! access tokens and rotated refresh tokens, keyed by secret name), `journal/` (see
//! `journal`). Files are 0600 and directories 0700: the runtime keeps OAuth tokens here in
//! clear text (spec 14.3.3).
//!
//! Must not: write a file in place (always tmp, fsync, rename, fsync the directory), or log a
//! value it stores.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::ProcessorError;

const LOCK_FILE: &str = "state.lock";
const STATE_FILE: &str = "state.json";
pub const RUNTIME_FILE: &str = "runtime.json";
const FILE_MODE: u32 = 0o600;
const DIR_MODE: u32 = 0o700;
/// A state file larger than this is refused as corrupt rather than read into memory.
const STATE_BYTES_MAX: u64 = 16 * 1024 * 1024;

/// Writes `bytes` to `dir/name` atomically and durably, readable by the owner only.
pub fn atomic_write(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    crate::sys::fs::atomic_write(dir, name, bytes, FILE_MODE)
}

/// Reads a small JSON file; `None` when it does not exist.
pub fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Option<T>, ProcessorError> {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(ProcessorError::state_io("reading a state file", &e)),
    };
    if meta.len() > STATE_BYTES_MAX {
        return Err(ProcessorError::bug(
            "state directory: a state file is too large",
        ));
    }
    let bytes =
        std::fs::read(path).map_err(|e| ProcessorError::state_io("reading a state file", &e))?;
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|_| ProcessorError::bug("state directory: a state file is not valid JSON"))
}

pub fn create_dir(dir: &Path) -> Result<(), ProcessorError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(dir)
        .map_err(|e| ProcessorError::state_io("creating the directory", &e))
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct StateFile {
    /// The seq of the last journal whose writes are in `values`.
    applied_seq: u64,
    values: Map<String, Value>,
}

/// The locked state directory. The lock is released when this is dropped (or the process
/// dies: flock locks go with the file description).
pub struct StateDir {
    dir: PathBuf,
    _lock: Flock<File>,
    file: StateFile,
}

impl StateDir {
    /// Creates the directory if needed, takes the lock (waiting for a previous run that still
    /// holds it) and reads the applied state.
    pub fn open(dir: &Path) -> Result<StateDir, ProcessorError> {
        create_dir(dir)?;
        let lock = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(FILE_MODE)
            .open(dir.join(LOCK_FILE))
            .map_err(|e| ProcessorError::state_io("opening the lock", &e))?;
        let lock = Flock::lock(lock, FlockArg::LockExclusive).map_err(|(_, errno)| {
            ProcessorError::state_io("taking the lock", &std::io::Error::from(errno))
        })?;
        let file = read_json(&dir.join(STATE_FILE))?.unwrap_or_default();
        Ok(StateDir {
            dir: dir.to_path_buf(),
            _lock: lock,
            file,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn values(&self) -> &Map<String, Value> {
        &self.file.values
    }

    pub fn applied_seq(&self) -> u64 {
        self.file.applied_seq
    }

    /// Applies one journal's writes (a null value deletes the name) and records its seq, in
    /// one atomic write of `state.json`.
    pub fn apply(&mut self, seq: u64, writes: &Map<String, Value>) -> Result<(), ProcessorError> {
        if seq <= self.file.applied_seq {
            return Err(ProcessorError::bug(
                "state directory: a journal was applied out of order",
            ));
        }
        let mut next = self.file.clone();
        for (name, value) in writes {
            if value.is_null() {
                next.values.remove(name);
            } else {
                next.values.insert(name.clone(), value.clone());
            }
        }
        next.applied_seq = seq;
        // Serialising a map of JSON values cannot fail.
        let bytes = serde_json::to_vec_pretty(&next).unwrap_or_default();
        atomic_write(&self.dir, STATE_FILE, &bytes)
            .map_err(|e| ProcessorError::state_io("writing state.json", &e))?;
        self.file = next;
        Ok(())
    }
}

/// Starts a state directory with `values`, as earlier batches would have left it: the kit's
/// processor row begins each run from its `[stub] state`. Only an empty directory is seeded.
pub fn seed(dir: &Path, values: &Map<String, Value>) -> Result<(), ProcessorError> {
    let mut st = StateDir::open(dir)?;
    if st.applied_seq() == 0 && !values.is_empty() {
        st.apply(1, values)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn apply_merges_deletes_and_survives_reopening() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("st");
        let mut s = StateDir::open(&dir).unwrap();
        let w: Map<String, Value> =
            serde_json::from_str(r#"{"history_id":"10","gone":1}"#).unwrap();
        s.apply(1, &w).unwrap();
        let w: Map<String, Value> = serde_json::from_str(r#"{"gone":null}"#).unwrap();
        s.apply(2, &w).unwrap();
        assert!(s.apply(2, &Map::new()).is_err(), "never applied twice");
        drop(s);
        let s = StateDir::open(&dir).unwrap();
        assert_eq!(s.applied_seq(), 2);
        assert_eq!(s.values().get("history_id"), Some(&Value::from("10")));
        assert!(!s.values().contains_key("gone"));
        let mode = std::fs::metadata(dir.join(STATE_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(
            std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
            0o700
        );
    }

    #[test]
    fn the_lock_excludes_a_second_holder() {
        let tmp = tempfile::tempdir().unwrap();
        let s = StateDir::open(tmp.path()).unwrap();
        let f = File::open(tmp.path().join(LOCK_FILE)).unwrap();
        assert!(Flock::lock(f, FlockArg::LockExclusiveNonblock).is_err());
        drop(s);
        let f = File::open(tmp.path().join(LOCK_FILE)).unwrap();
        assert!(Flock::lock(f, FlockArg::LockExclusiveNonblock).is_ok());
    }
}
