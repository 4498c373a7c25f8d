//! Free space on the spool's filesystem (spec 9's first backpressure row): statvfs of the
//! database's directory. The writer reads it uncached before every commit group
//! (`free_bytes_now`: one syscall per group, so a disk filling fast cannot be overrun);
//! /healthz and /metrics read it cached for [`FREE_CACHE_S`].
//!
//! On a PostgreSQL spool the guard is off ([`DiskGuard::off`]): the intake keeps nothing of
//! the spool on this host, so this host's free space says nothing about whether a webhook
//! can be stored, and refusing one for it would turn away what the database would take. The
//! database's own disk is the server's: a full one fails the COMMIT (`StoreError::Full`),
//! answered 503 with `spool:full`, as ENOSPC is on SQLite.
//!
//! Must not: write anything or decide the answer (the writer compares the figure with
//! `limits.min_free_bytes` from the snapshot the request was served by).

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long one statvfs answer is trusted.
pub const FREE_CACHE_S: u64 = 5;

pub struct DiskGuard {
    /// The directory holding spool.db; `None` when the spool is not on this host.
    dir: Option<PathBuf>,
    cache: Mutex<Option<(Instant, Option<u64>)>>,
}

impl DiskGuard {
    /// `dir` is the directory holding spool.db.
    pub fn new(dir: PathBuf) -> Self {
        DiskGuard {
            dir: Some(dir),
            cache: Mutex::new(None),
        }
    }

    /// For a spool on another host (PostgreSQL): no figure, so no limit.
    pub fn off() -> Self {
        DiskGuard {
            dir: None,
            cache: Mutex::new(None),
        }
    }

    /// Bytes available to us on the spool's filesystem; `None` when statvfs fails (then no
    /// limit is applied: the write itself reports ENOSPC if space is really gone).
    pub fn free_bytes(&self) -> Option<u64> {
        let now = Instant::now();
        // The cache holds plain values; a poisoned lock cannot leave it inconsistent.
        let mut c = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((at, v)) = *c
            && now.duration_since(at) < Duration::from_secs(FREE_CACHE_S)
        {
            return v;
        }
        let v = self.free_bytes_now();
        *c = Some((now, v));
        v
    }

    /// The same figure read now, bypassing the cache (one statvfs).
    pub fn free_bytes_now(&self) -> Option<u64> {
        crate::sys::fs::free_bytes(self.dir.as_deref()?)
    }

    /// Whether free space is under `min_free_bytes` (0 disables the check).
    pub fn low(&self, min_free_bytes: i64) -> bool {
        if min_free_bytes <= 0 {
            return false;
        }
        self.free_bytes()
            .is_some_and(|free| free < min_free_bytes as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_space_is_read_and_compared() {
        let dir = tempfile::tempdir().unwrap();
        let g = DiskGuard::new(dir.path().to_path_buf());
        assert!(g.free_bytes().is_some_and(|b| b > 0));
        assert!(!g.low(0));
        assert!(g.low(i64::MAX));
        assert!(!g.low(1));
        assert!(g.free_bytes_now().is_some_and(|b| b > 0));
        let off = DiskGuard::off();
        assert_eq!(off.free_bytes(), None);
        assert!(!off.low(i64::MAX));
    }
}
