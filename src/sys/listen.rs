//! Socket activation: the listening sockets systemd passed us (LISTEN_FDS, LISTEN_PID,
//! LISTEN_FDNAMES, read through sd-notify's `listen_fds_with_names`, which also checks that
//! LISTEN_PID is this process).
//!
//! Owns: turning each inherited fd into a std TCP or Unix stream listener, once per process.
//! Must not: bind anything itself (the intake binds `intake.listen` when nothing was
//! inherited), or run after threads exist that might read the environment concurrently: call
//! [`take_inherited`] before the tokio runtime starts (CRATES.md: listenfd does not read the
//! names, so sd-notify's reader is used).

use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};

/// An inherited listening socket, with the name systemd gave it (FileDescriptorName=).
#[derive(Debug)]
pub struct InheritedSocket {
    pub name: String,
    pub listener: StdListener,
}

/// A listening stream socket, TCP or Unix.
#[derive(Debug)]
pub enum StdListener {
    Tcp(std::net::TcpListener),
    Unix(std::os::unix::net::UnixListener),
}

impl StdListener {
    /// `127.0.0.1:8650` or `unix:/run/hookspool/intake.sock`, for STATUS= and logs.
    pub fn describe(&self) -> String {
        match self {
            StdListener::Tcp(l) => l
                .local_addr()
                .map(|a| a.to_string())
                .unwrap_or_else(|_| "tcp:?".into()),
            StdListener::Unix(l) => match l
                .local_addr()
                .ok()
                .and_then(|a| a.as_pathname().map(|p| format!("unix:{}", p.display())))
            {
                Some(s) => s,
                None => "unix:(unnamed)".into(),
            },
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    #[error("LISTEN_FDS / LISTEN_FDNAMES are malformed: {0}")]
    Env(std::io::Error),
    #[error("inherited sockets were already taken by this process")]
    AlreadyTaken,
    #[error("inherited fd {fd} ({name}) is neither a TCP nor a Unix stream socket")]
    NotAStreamSocket { fd: i32, name: String },
}

static TAKEN: AtomicBool = AtomicBool::new(false);

/// The sockets systemd passed to this process; empty when it was not socket-activated.
/// Takes ownership of the fds, so it may succeed only once per process.
pub fn take_inherited() -> Result<Vec<InheritedSocket>, ListenError> {
    let fds: Vec<(i32, String)> = sd_notify::listen_fds_with_names()
        .map_err(ListenError::Env)?
        .collect();
    if fds.is_empty() {
        return Ok(Vec::new());
    }
    if TAKEN.swap(true, Ordering::SeqCst) {
        return Err(ListenError::AlreadyTaken);
    }
    let mut out = Vec::with_capacity(fds.len());
    for (fd, name) in fds {
        // SAFETY: sd-notify validated LISTEN_PID == getpid() and that these fds are in the
        // SD_LISTEN_FDS_START range systemd passed us; TAKEN ensures we own each fd once.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        out.push(InheritedSocket {
            listener: classify(fd, &name, owned)?,
            name,
        });
    }
    Ok(out)
}

/// A TCP socket has an inet address; anything else must be a Unix socket. A socket of
/// the wrong type (datagram) fails at accept time with a logged error rather than here.
fn classify(fd: i32, name: &str, owned: OwnedFd) -> Result<StdListener, ListenError> {
    let tcp = std::net::TcpListener::from(owned);
    if tcp.local_addr().is_ok() {
        return Ok(StdListener::Tcp(tcp));
    }
    let unix = std::os::unix::net::UnixListener::from(OwnedFd::from(tcp));
    if unix.local_addr().is_ok() {
        return Ok(StdListener::Unix(unix));
    }
    Err(ListenError::NotAStreamSocket {
        fd,
        name: name.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcp_and_unix_sockets_are_told_apart() {
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&tcp);
        assert!(matches!(
            classify(fd, "t", OwnedFd::from(tcp)).unwrap(),
            StdListener::Tcp(_)
        ));
        let dir = tempfile::tempdir().unwrap();
        let unix = std::os::unix::net::UnixListener::bind(dir.path().join("s")).unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&unix);
        let l = classify(fd, "u", OwnedFd::from(unix)).unwrap();
        assert!(matches!(l, StdListener::Unix(_)));
        assert!(l.describe().starts_with("unix:/"), "{}", l.describe());
    }

    #[test]
    fn nothing_inherited_outside_systemd() {
        // The test process has no LISTEN_PID naming itself.
        if std::env::var_os("LISTEN_PID").is_none() {
            assert!(take_inherited().unwrap().is_empty());
        }
    }
}
