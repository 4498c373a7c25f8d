//! The intake's nudge to the dispatcher (RUST-ADAPTATION "Performance design"): after a
//! commit the intake wakes the dispatcher so an immediate route is delivered in
//! milliseconds instead of at the next poll. Between processes it is a one-byte datagram on
//! `<home>/dispatch.sock`; under `hookspool run` it is an in-process `Notify`. A lost nudge
//! costs at most one poll interval, so sending never blocks and never fails the caller.

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::Notify;

/// The socket's name inside the spool home.
pub const SOCKET_NAME: &str = "dispatch.sock";

pub fn socket_path(home: &Path) -> PathBuf {
    home.join(SOCKET_NAME)
}

/// Something that can wake the dispatcher.
pub trait Waker: Send + Sync {
    fn wake(&self);
}

/// Wakes a dispatcher in another process.
#[derive(Debug)]
pub struct DatagramWaker {
    path: PathBuf,
    sock: Option<UnixDatagram>,
}

impl DatagramWaker {
    pub fn new(home: &Path) -> DatagramWaker {
        let sock = UnixDatagram::unbound().ok();
        if let Some(s) = &sock {
            // Never block the intake on a full or absent receiver.
            let _ = s.set_nonblocking(true);
        }
        DatagramWaker {
            path: socket_path(home),
            sock,
        }
    }
}

impl Waker for DatagramWaker {
    fn wake(&self) {
        if let Some(s) = &self.sock {
            // A missing dispatcher or a full queue just means the next poll finds the work.
            let _ = s.send_to(&[1u8], &self.path);
        }
    }
}

/// Wakes a dispatcher in this process (`hookspool run`).
#[derive(Debug, Clone, Default)]
pub struct NotifyWaker(pub Arc<Notify>);

impl Waker for NotifyWaker {
    fn wake(&self) {
        self.0.notify_one();
    }
}

/// The dispatcher's side: bind `<home>/dispatch.sock` (replacing a stale one; the caller
/// holds dispatch.lock, so no live dispatcher owns it) and forward datagrams to `notify`.
pub fn listen(home: &Path, notify: Arc<Notify>) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let path = socket_path(home);
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let std_sock = UnixDatagram::bind(&path)?;
    std_sock.set_nonblocking(true)?;
    let sock = tokio::net::UnixDatagram::from_std(std_sock)?;
    Ok(tokio::spawn(async move {
        let mut buf = [0u8; 16];
        loop {
            match sock.recv(&mut buf).await {
                Ok(_) => notify.notify_one(),
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(100)).await,
            }
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_datagram_wakes_the_listener() {
        let dir = tempfile::tempdir().unwrap();
        let notify = Arc::new(Notify::new());
        let _h = listen(dir.path(), notify.clone()).unwrap();
        let w = DatagramWaker::new(dir.path());
        let waited = tokio::time::timeout(std::time::Duration::from_secs(5), async {
            loop {
                w.wake();
                tokio::select! {
                    _ = notify.notified() => return,
                    _ = tokio::time::sleep(std::time::Duration::from_millis(20)) => {}
                }
            }
        })
        .await;
        assert!(waited.is_ok(), "the nudge arrived");
    }

    #[test]
    fn waking_nobody_is_harmless() {
        let dir = tempfile::tempdir().unwrap();
        DatagramWaker::new(dir.path()).wake();
    }
}
