//! The config file watcher both halves reload by (issue 29: the intake applied a save up to
//! 5 s after the dispatcher, and events sent in between followed the old routes).
//!
//! inotify on the file's directory reports a save within milliseconds, whichever way the
//! editor writes it: in place (IN_CLOSE_WRITE, once the writer has closed the file, never
//! half-written), by a rename over it (IN_MOVED_TO), touch(1) (IN_ATTRIB), or `hookspool
//! reload`, which sets the mtime through a descriptor open for writing (IN_CLOSE_WRITE).
//! IN_MODIFY is not watched: it comes with every write(2) of a save still under way. The directory is watched, not the file, because a rename replaces the inode
//! a watch on the file would follow. The file's mtime, compared every [`FALLBACK_POLL_S`],
//! stays as the fallback for what inotify does not see: a file reached through a symlink
//! into another directory, a deletion, a filesystem without inotify (NFS), an instance
//! limit reached (`fs.inotify.max_user_instances`).
//!
//! Must not: read or parse the config (the caller reloads), or miss a save: `changed` is
//! cancel-safe (its only await points are a readiness wait and a timer tick), so a caller
//! may select on it beside other work.

use std::ffi::OsString;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// How often the file's mtime is compared when inotify says nothing.
pub const FALLBACK_POLL_S: u64 = 1;

/// The inotify instance as tokio's reactor takes it.
struct Fd(Inotify);

impl AsRawFd for Fd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

/// Watches one config file; see the module doc.
pub struct ConfigWatch {
    path: PathBuf,
    /// The file's name in its directory, as inotify events name it.
    name: Option<OsString>,
    inotify: Option<AsyncFd<Fd>>,
    /// The mtime the last change (or the start) left, for the fallback.
    seen: Option<SystemTime>,
    poll: tokio::time::Interval,
}

fn mtime(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

impl ConfigWatch {
    /// Begin watching `path`. Create it before loading the file, so a save during the
    /// load is reported. Must be called within a tokio runtime.
    pub fn new(path: &Path, fallback_poll: Duration) -> ConfigWatch {
        let inotify = match watch_dir(path) {
            Ok(fd) => Some(fd),
            Err(e) => {
                tracing::warn!(
                    reason = %e,
                    "cannot watch the config file's directory with inotify; a save is noticed by its mtime, compared every {} s",
                    fallback_poll.as_secs_f64()
                );
                None
            }
        };
        let mut poll = tokio::time::interval(fallback_poll);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first tick of an interval is immediate; the baseline is read now instead.
        poll.reset();
        ConfigWatch {
            path: path.to_path_buf(),
            name: path.file_name().map(OsString::from),
            inotify,
            seen: mtime(path),
            poll,
        }
    }

    /// Resolves when the file may have changed since the last call: inotify named it, or
    /// its mtime differs from the last one seen.
    pub async fn changed(&mut self) {
        loop {
            let (inotify, poll, name) = (&self.inotify, &mut self.poll, &self.name);
            let outcome = tokio::select! {
                ready = async {
                    match inotify {
                        Some(fd) => fd.readable().await,
                        None => std::future::pending().await,
                    }
                } => match ready {
                    Ok(mut guard) => match guard.get_inner().0.read_events() {
                        Ok(events) => Ok(events.iter().any(|e| {
                            e.mask.contains(AddWatchFlags::IN_Q_OVERFLOW)
                                || e.name.is_some() && e.name == *name
                        })),
                        Err(nix::errno::Errno::EAGAIN) => {
                            guard.clear_ready();
                            Ok(false)
                        }
                        Err(e) => Err(e.to_string()),
                    },
                    Err(e) => Err(e.to_string()),
                },
                _ = poll.tick() => Ok(mtime(&self.path) != self.seen),
            };
            match outcome {
                Ok(true) => {
                    self.seen = mtime(&self.path);
                    return;
                }
                Ok(false) => {}
                Err(why) => self.give_up_inotify(&why),
            }
        }
    }

    /// A reload asked for another way (SIGHUP) reads the file as it is now: its mtime is
    /// the one seen.
    pub fn mark_seen(&mut self) {
        self.seen = mtime(&self.path);
    }

    fn give_up_inotify(&mut self, why: &str) {
        tracing::warn!(
            reason = why,
            "reading inotify events failed; a save is noticed by the config file's mtime from now on"
        );
        self.inotify = None;
    }
}

fn watch_dir(path: &Path) -> std::io::Result<AsyncFd<Fd>> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)?;
    inotify.add_watch(
        dir,
        AddWatchFlags::IN_CLOSE_WRITE | AddWatchFlags::IN_MOVED_TO | AddWatchFlags::IN_ATTRIB,
    )?;
    // SAFETY: `Fd` owns the inotify descriptor (an OwnedFd inside `Inotify`), which stays
    // open until the AsyncFd that owns `Fd` is dropped, and `as_raw_fd` always returns it.
    unsafe { AsyncFd::register_with_interest(Fd(inotify), Interest::READABLE) }
        .map_err(std::io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LONG: Duration = Duration::from_secs(3600);
    const SOON: Duration = Duration::from_millis(500);

    /// With the fallback an hour away, only inotify can report these saves in time.
    #[tokio::test]
    async fn inotify_reports_a_save_in_place_a_rename_and_a_touch() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("config.toml");
        std::fs::write(&path, "# one\n").expect("write");
        let mut w = ConfigWatch::new(&path, LONG);
        assert!(w.inotify.is_some(), "inotify watches the directory");
        // Nothing changed: nothing to report.
        assert!(
            tokio::time::timeout(Duration::from_millis(100), w.changed())
                .await
                .is_err()
        );

        std::fs::write(&path, "# two\n").expect("write");
        tokio::time::timeout(SOON, w.changed())
            .await
            .expect("in place");

        let tmp = dir.path().join(".config.toml.swp");
        std::fs::write(&tmp, "# three\n").expect("write");
        std::fs::rename(&tmp, &path).expect("rename");
        tokio::time::timeout(SOON, w.changed())
            .await
            .expect("renamed over");

        // touch(1): both times, through a read-only descriptor (IN_ATTRIB).
        let f = std::fs::File::open(&path).expect("open");
        let later = SystemTime::now() + Duration::from_secs(5);
        f.set_times(
            std::fs::FileTimes::new()
                .set_accessed(later)
                .set_modified(later),
        )
        .expect("set times");
        drop(f);
        tokio::time::timeout(SOON, w.changed())
            .await
            .expect("touched");

        // `hookspool reload`: a new mtime through a descriptor open for writing
        // (IN_CLOSE_WRITE when it closes; the mtime alone is an IN_MODIFY, not watched).
        let f = std::fs::File::options()
            .write(true)
            .open(&path)
            .expect("open");
        f.set_modified(later + Duration::from_secs(5))
            .expect("set mtime");
        drop(f);
        tokio::time::timeout(SOON, w.changed())
            .await
            .expect("reload's touch");
        // Another file in the directory is not the config.
        std::fs::write(dir.path().join("other.toml"), "x").expect("write");
        assert!(
            tokio::time::timeout(Duration::from_millis(100), w.changed())
                .await
                .is_err()
        );
    }

    #[tokio::test]
    async fn the_mtime_fallback_reports_a_change_inotify_cannot_see() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("config.toml");
        std::fs::write(&path, "# one\n").expect("write");
        let mut w = ConfigWatch::new(&path, Duration::from_millis(50));
        w.inotify = None;
        std::fs::remove_file(&path).expect("remove");
        tokio::time::timeout(SOON, w.changed())
            .await
            .expect("deletion seen by mtime");
    }
}
