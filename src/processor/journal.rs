//! The journal (spec 6.6): one file per batch under `<state_dir>/journal/`, named
//! `<seq>-<batch id>.json`, holding the emits and the staged state writes of one processor
//! run. It is written atomically before any of its writes are applied; `seq` orders journals
//! so that the state's `applied_seq` says which are applied.
//!
//! Pruning: after each fresh run, applied journals older than [`JOURNAL_RETAIN_S`] are
//! deleted, always keeping the newest [`JOURNALS_KEPT_MIN`]. Seven days is the spool's
//! default retention of delivered batches (spec 8): a batch older than that has been pruned
//! from the spool, so nothing retries it. The one exception is a dead batch replayed by hand
//! later; its retry then runs the processor again from the current state.
//!
//! Must not: log an emit or a state value.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::ProcessorError;
use super::state::{atomic_write, create_dir, read_json};

pub const JOURNAL_DIR: &str = "journal";
/// Applied journals younger than this are kept.
pub const JOURNAL_RETAIN_S: f64 = 7.0 * 86_400.0;
/// The newest journals kept whatever their age.
pub const JOURNALS_KEPT_MIN: usize = 32;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Journal {
    pub batch_id: i64,
    pub seq: u64,
    pub created_at: f64,
    /// The inner `enqueue` objects, in print order.
    pub emits: Vec<Value>,
    /// Staged state: name -> value, null deletes.
    pub writes: Map<String, Value>,
}

/// One journal file's name, parsed.
struct Entry {
    seq: u64,
    batch_id: i64,
    path: PathBuf,
}

fn file_name(seq: u64, batch_id: i64) -> String {
    format!("{seq:020}-{batch_id}.json")
}

fn entries(state_dir: &Path) -> Result<Vec<Entry>, ProcessorError> {
    let dir = state_dir.join(JOURNAL_DIR);
    let read = match std::fs::read_dir(&dir) {
        Ok(r) => r,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(ProcessorError::state_io("listing the journal", &e)),
    };
    let mut out = Vec::new();
    for entry in read {
        let entry = entry.map_err(|e| ProcessorError::state_io("listing the journal", &e))?;
        let name = entry.file_name();
        let Some(stem) = name.to_str().and_then(|n| n.strip_suffix(".json")) else {
            continue;
        };
        let Some((seq, id)) = stem.split_once('-') else {
            continue;
        };
        if let (Ok(seq), Ok(batch_id)) = (seq.parse(), id.parse()) {
            out.push(Entry {
                seq,
                batch_id,
                path: entry.path(),
            });
        }
    }
    out.sort_by_key(|e| e.seq);
    Ok(out)
}

fn load(e: &Entry) -> Result<Journal, ProcessorError> {
    let j: Journal = read_json(&e.path)?.ok_or(ProcessorError::bug(
        "journal: a listed journal file disappeared",
    ))?;
    if j.seq != e.seq || j.batch_id != e.batch_id {
        return Err(ProcessorError::bug(
            "journal: a file's name and content disagree",
        ));
    }
    Ok(j)
}

/// The journal of `batch_id`, if one was written.
pub fn find(state_dir: &Path, batch_id: i64) -> Result<Option<Journal>, ProcessorError> {
    match entries(state_dir)?
        .iter()
        .rev()
        .find(|e| e.batch_id == batch_id)
    {
        Some(e) => load(e).map(Some),
        None => Ok(None),
    }
}

/// Journals not yet applied (seq above `applied_seq`), oldest first.
pub fn pending(state_dir: &Path, applied_seq: u64) -> Result<Vec<Journal>, ProcessorError> {
    entries(state_dir)?
        .iter()
        .filter(|e| e.seq > applied_seq)
        .map(load)
        .collect()
}

/// Writes the journal durably (the caller applies its writes only after this returns).
pub fn write(state_dir: &Path, j: &Journal) -> Result<(), ProcessorError> {
    let dir = state_dir.join(JOURNAL_DIR);
    create_dir(&dir)?;
    // Serialising JSON values cannot fail.
    let bytes = serde_json::to_vec(j).unwrap_or_default();
    atomic_write(&dir, &file_name(j.seq, j.batch_id), &bytes)
        .map_err(|e| ProcessorError::state_io("writing the journal", &e))
}

/// Deletes applied journals past the retention rule; returns how many.
pub fn prune(state_dir: &Path, applied_seq: u64, now: f64) -> Result<usize, ProcessorError> {
    let all = entries(state_dir)?;
    let keep_from = all.len().saturating_sub(JOURNALS_KEPT_MIN);
    let mut removed = 0;
    for e in &all[..keep_from] {
        if e.seq > applied_seq {
            continue;
        }
        let old = std::fs::metadata(&e.path)
            .ok()
            .and_then(|m| m.modified().ok())
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .is_some_and(|t| t.as_secs_f64() + JOURNAL_RETAIN_S < now);
        if old {
            std::fs::remove_file(&e.path)
                .map_err(|err| ProcessorError::state_io("pruning the journal", &err))?;
            removed += 1;
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn j(seq: u64, batch_id: i64) -> Journal {
        Journal {
            batch_id,
            seq,
            created_at: 1.0,
            emits: vec![serde_json::json!({"source": "s", "key": "k"})],
            writes: Map::new(),
        }
    }

    #[test]
    fn journals_are_found_by_batch_and_pending_by_seq() {
        let tmp = tempfile::tempdir().unwrap();
        write(tmp.path(), &j(1, 40)).unwrap();
        write(tmp.path(), &j(2, 41)).unwrap();
        assert_eq!(find(tmp.path(), 41).unwrap(), Some(j(2, 41)));
        assert_eq!(find(tmp.path(), 9).unwrap(), None);
        let p = pending(tmp.path(), 1).unwrap();
        assert_eq!(p, vec![j(2, 41)]);
        assert!(pending(tmp.path(), 2).unwrap().is_empty());
    }

    #[test]
    fn prune_keeps_the_newest_and_the_unapplied() {
        let tmp = tempfile::tempdir().unwrap();
        let n = JOURNALS_KEPT_MIN as u64 + 5;
        for seq in 1..=n {
            write(tmp.path(), &j(seq, seq as i64)).unwrap();
        }
        let now_s = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert_eq!(prune(tmp.path(), n, now_s).unwrap(), 0, "young ones stay");
        let later = now_s + JOURNAL_RETAIN_S + 10.0;
        // Applied through seq 3 only: seqs 4 and 5 are pending and stay.
        assert_eq!(prune(tmp.path(), 3, later).unwrap(), 3);
        assert_eq!(prune(tmp.path(), n, later).unwrap(), 2);
        assert_eq!(entries(tmp.path()).unwrap().len(), JOURNALS_KEPT_MIN);
        assert!(find(tmp.path(), n as i64).unwrap().is_some());
    }
}
