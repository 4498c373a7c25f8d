//! The connection cap (issue 17): at most [`CONNECTIONS_MAX`] connections (fewer when the
//! descriptor limit is lower), shared by every listener. At the cap the idlest connection is
//! closed to admit the new one, so connections that send nothing can never lock senders out;
//! only while every connection is working on a whole request does a new one wait.
//!
//! "Idlest" is chosen the way an OS pages out (the CLOCK algorithm): connections queue in
//! the order they were admitted; at the cap the front one is closed unless it is working on
//! a request or has read a byte since the cap last looked at it, in which case it goes to
//! the back with a second chance. A connection that sends nothing is closed the first time it
//! comes up, the oldest first; a busy keep-alive connection from the proxy keeps its place.
//! Each admission costs O(1) amortised, so the accept loop keeps pace with a flood that
//! reconnects as fast as it is closed (a scan of every connection per accept did not).
//!
//! Also here: the stream type, which notes each byte read, and waits for the first byte of
//! a connection before hyper allocates its buffers (an idle connection then costs a task and
//! a socket, not two 8 KiB buffers).
//!
//! Must not: read request bytes (hyper does) or decide anything about a request.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;

/// Connections served at once. At the cap the idlest one is closed to admit a new one;
/// only when every connection is working on a whole request does a new one wait (in the
/// kernel's backlog) for the first to finish. A connection that has sent nothing costs a
/// task and a socket (about 1.2 KB of RSS, measured with 3 000), one that has sent bytes
/// about 10 KB plus its buffered head (at most `CONNECTION_BUFFER_BYTES_MAX`), so a full cap
/// is at most ~10 MB idle or ~210 MB of slow heads. Above the cap a flood that reconnects as
/// fast as it is closed makes every accept close a connection, and normal requests then
/// queue behind the flood in the backlog; the cap is high enough that the proxy's own
/// connections and a 5 500-connection flood fit without that churn (issue 17's figures).
pub const CONNECTIONS_MAX: usize = 8192;
/// Descriptors kept for everything that is not a connection (the spool, its WAL and shm,
/// the listeners, the journal, Plaid key fetches) when the descriptor limit lowers the cap.
pub const FDS_RESERVED: u64 = 64;
/// Connections closed at the cap or at the head deadline are logged as counts, at most once
/// per this (an idle flood would otherwise write a line per connection).
pub const CLOSE_LOG_S_MIN: u64 = 10;

/// Raise the soft RLIMIT_NOFILE to the hard limit (systemd's default soft limit is 1024,
/// below the connection cap) and return the soft limit now in force, `None` if unknown.
pub fn raise_nofile() -> Option<u64> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).ok()?;
    if soft >= hard {
        return Some(soft);
    }
    match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
        Ok(()) => Some(hard),
        Err(e) => {
            tracing::warn!(
                component = "intake",
                reason = %e,
                "could not raise the descriptor limit from {soft} to {hard}"
            );
            Some(soft)
        }
    }
}

/// The connection cap for a descriptor limit: [`CONNECTIONS_MAX`], or fewer when the limit
/// leaves less room after [`FDS_RESERVED`].
pub fn cap_for(nofile: Option<u64>) -> usize {
    let room = nofile.map_or(CONNECTIONS_MAX as u64, |n| n.saturating_sub(FDS_RESERVED));
    (room.min(CONNECTIONS_MAX as u64) as usize).max(1)
}

/// One connection as the cap sees it.
struct ConnState {
    /// Bumped on every read that returned bytes: the cap's "used since I last looked".
    reads: AtomicU64,
    /// Requests whose body is whole and not yet answered: such a connection is working and
    /// never closed by the cap.
    working: AtomicUsize,
    /// The connection has ended (its queue entry is dropped when the cap next meets it).
    gone: AtomicBool,
    /// Closes the connection (the cap chose it).
    evict: Notify,
    /// The cap's "a slot may have opened" signal.
    freed: Arc<Notify>,
}

/// A connection's activity, which the handler marks while it works on a whole request.
#[derive(Clone)]
pub struct Activity(Arc<ConnState>);

impl Activity {
    /// Mark the connection working until the guard drops.
    pub fn working(&self) -> Working {
        self.0.working.fetch_add(1, Ordering::AcqRel);
        Working(self.0.clone())
    }

    fn touch(&self) {
        self.0.reads.fetch_add(1, Ordering::Relaxed);
    }

    /// Resolves when the cap chose this connection to close.
    pub async fn evicted(&self) {
        self.0.evict.notified().await;
    }
}

/// See [`Activity::working`].
pub struct Working(Arc<ConnState>);

impl Drop for Working {
    fn drop(&mut self) {
        self.0.working.fetch_sub(1, Ordering::AcqRel);
        // An idle connection can be closed for a new one again.
        self.0.freed.notify_one();
    }
}

/// A queued connection and what the cap saw when it last looked.
struct Entry {
    state: Arc<ConnState>,
    reads_seen: u64,
}

struct Queue {
    entries: VecDeque<Entry>,
    /// Connections admitted and not ended.
    live: usize,
    /// The most `live` has been since [`Connections::take_peak`] last ran.
    peak: usize,
}

/// Every live connection of the process, and the cap.
pub struct Connections {
    cap: usize,
    queue: Mutex<Queue>,
    freed: Arc<Notify>,
    closes: CloseLog,
}

impl Connections {
    pub fn new(cap: usize) -> Arc<Self> {
        Arc::new(Connections {
            cap: cap.max(1),
            queue: Mutex::new(Queue {
                entries: VecDeque::new(),
                live: 0,
                peak: 0,
            }),
            freed: Arc::new(Notify::new()),
            closes: CloseLog::default(),
        })
    }

    pub fn cap(&self) -> usize {
        self.cap
    }

    /// Connections counted against the cap right now.
    pub fn live(&self) -> usize {
        self.lock().live
    }

    /// (the most connections since the last call, connections now); the peak starts over.
    pub fn take_peak(&self) -> (usize, usize) {
        let mut q = self.lock();
        let peak = q.peak;
        q.peak = q.live;
        (peak, q.live)
    }

    /// Connections closed at the cap, and for want of a request head in time, since start.
    pub fn closed_totals(&self) -> (u64, u64) {
        (
            self.closes.evicted_total.load(Ordering::Relaxed),
            self.closes.head_timeouts_total.load(Ordering::Relaxed),
        )
    }

    /// Count a connection closed for want of a whole request head in time.
    pub fn head_timed_out(&self) {
        self.closes.note(Close::HeadTimeout, self.cap);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        // The queue holds plain entries; a poisoned lock cannot leave it half-changed.
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A slot for a new connection: a free one, else the idlest connection's (closed now);
    /// waits only while every connection is working on a request.
    pub async fn admit(self: &Arc<Self>) -> Admitted {
        loop {
            if let Some(a) = self.try_admit() {
                return a;
            }
            // notify_one keeps a permit, so a slot freed since try_admit is not missed.
            self.freed.notified().await;
        }
    }

    fn try_admit(self: &Arc<Self>) -> Option<Admitted> {
        let mut q = self.lock();
        if q.live >= self.cap {
            let victim = Self::idlest(&mut q)?;
            victim.gone.store(true, Ordering::Release);
            victim.evict.notify_one();
            q.live -= 1;
            self.closes.note(Close::Evicted, self.cap);
        }
        // Entries of ended connections wait for the cap to meet them; below the cap it may
        // not, so drop them whenever they outnumber the live ones (amortised O(1)).
        if q.entries.len() > 2 * q.live + 64 {
            q.entries.retain(|e| !e.state.gone.load(Ordering::Acquire));
        }
        let state = Arc::new(ConnState {
            reads: AtomicU64::new(0),
            working: AtomicUsize::new(0),
            gone: AtomicBool::new(false),
            evict: Notify::new(),
            freed: self.freed.clone(),
        });
        q.entries.push_back(Entry {
            state: state.clone(),
            reads_seen: 0,
        });
        q.live += 1;
        q.peak = q.peak.max(q.live);
        Some(Admitted {
            conns: self.clone(),
            activity: Activity(state),
        })
    }

    /// The CLOCK hand: the first connection from the front that is not working and read
    /// nothing since the hand last passed it. At most two passes over the live entries (the
    /// first may only clear second chances); `None` when every one is working.
    fn idlest(q: &mut Queue) -> Option<Arc<ConnState>> {
        let mut budget = 2 * q.entries.len();
        while budget > 0 {
            budget -= 1;
            let mut e = q.entries.pop_front()?;
            if e.state.gone.load(Ordering::Acquire) {
                continue;
            }
            let reads = e.state.reads.load(Ordering::Relaxed);
            let working = e.state.working.load(Ordering::Acquire) > 0;
            if !working && reads == e.reads_seen {
                return Some(e.state);
            }
            e.reads_seen = reads;
            q.entries.push_back(e);
        }
        None
    }
}

/// A connection's place under the cap; dropping it gives the slot back.
pub struct Admitted {
    conns: Arc<Connections>,
    activity: Activity,
}

impl Admitted {
    pub fn activity(&self) -> &Activity {
        &self.activity
    }

    pub fn conns(&self) -> &Connections {
        &self.conns
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        // Already uncounted when the cap closed this connection for a newer one.
        if !self.activity.0.gone.swap(true, Ordering::AcqRel) {
            self.conns.lock().live -= 1;
        }
        self.conns.freed.notify_one();
    }
}

#[derive(Debug, Clone, Copy)]
enum Close {
    /// Closed at the cap to admit a new connection.
    Evicted,
    /// No whole request head in time.
    HeadTimeout,
}

/// Counts of connection closes, logged at most every [`CLOSE_LOG_S_MIN`].
#[derive(Default)]
struct CloseLog {
    evicted: AtomicU64,
    head_timeouts: AtomicU64,
    evicted_total: AtomicU64,
    head_timeouts_total: AtomicU64,
    last: Mutex<Option<Instant>>,
}

impl CloseLog {
    fn note(&self, why: Close, cap: usize) {
        let (since_log, total) = match why {
            Close::Evicted => (&self.evicted, &self.evicted_total),
            Close::HeadTimeout => (&self.head_timeouts, &self.head_timeouts_total),
        };
        since_log.fetch_add(1, Ordering::Relaxed);
        total.fetch_add(1, Ordering::Relaxed);
        // try_lock: never wait here (this runs under the cap's lock too).
        let Ok(mut last) = self.last.try_lock() else {
            return;
        };
        if last.is_some_and(|t| t.elapsed() < Duration::from_secs(CLOSE_LOG_S_MIN)) {
            return;
        }
        *last = Some(Instant::now());
        let evicted = self.evicted.swap(0, Ordering::Relaxed);
        let head_timeouts = self.head_timeouts.swap(0, Ordering::Relaxed);
        tracing::info!(
            component = "intake",
            reason = "connections without a request",
            "closed {evicted} idlest connections at the cap of {cap} and {head_timeouts} with no request head in time (no status: the peer sees its connection close)"
        );
    }
}

/// An accepted socket of either listener kind, noting each read that returned bytes.
pub struct Stream {
    inner: Inner,
    activity: Option<Activity>,
}

enum Inner {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}

impl Stream {
    pub fn tcp(s: tokio::net::TcpStream) -> Self {
        Stream {
            inner: Inner::Tcp(s),
            activity: None,
        }
    }

    pub fn unix(s: tokio::net::UnixStream) -> Self {
        Stream {
            inner: Inner::Unix(s),
            activity: None,
        }
    }

    /// Note reads on `activity` from now on.
    pub fn track(&mut self, activity: Activity) {
        self.activity = Some(activity);
    }

    /// Resolves when a byte (or the peer's close) has arrived, without reading it and
    /// without a buffer. (`readable()` alone is not enough: a freshly registered socket can
    /// report read readiness with nothing to read.)
    pub async fn first_byte(&self) -> std::io::Result<()> {
        use std::os::fd::AsRawFd;
        loop {
            let peeked = match &self.inner {
                Inner::Tcp(s) => {
                    s.readable().await?;
                    s.try_io(tokio::io::Interest::READABLE, || peek(s.as_raw_fd()))
                }
                Inner::Unix(s) => {
                    s.readable().await?;
                    s.try_io(tokio::io::Interest::READABLE, || peek(s.as_raw_fd()))
                }
            };
            match peeked {
                Ok(()) => return Ok(()),
                // try_io cleared the stale readiness; wait for the real one.
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

/// Peek at one byte of a non-blocking socket: `Ok` when a byte or the peer's close is
/// there, `WouldBlock` when nothing is.
fn peek(fd: std::os::fd::RawFd) -> std::io::Result<()> {
    use nix::libc;
    let mut byte = 0u8;
    // SAFETY: `fd` is a socket this process owns for the duration of the call, and the
    // buffer is one valid, writable byte.
    let n = unsafe {
        libc::recv(
            fd,
            (&mut byte as *mut u8).cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    match n {
        n if n >= 0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = match &mut self.inner {
            Inner::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Inner::Unix(s) => Pin::new(s).poll_read(cx, buf),
        };
        if matches!(r, Poll::Ready(Ok(())))
            && buf.filled().len() > before
            && let Some(a) = &self.activity
        {
            a.touch();
        }
        r
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match &mut self.inner {
            Inner::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Inner::Unix(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match &mut self.inner {
            Inner::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Inner::Unix(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match &self.inner {
            Inner::Tcp(s) => s.is_write_vectored(),
            Inner::Unix(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match &mut self.inner {
            Inner::Tcp(s) => Pin::new(s).poll_flush(cx),
            Inner::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match &mut self.inner {
            Inner::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Inner::Unix(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reads(a: &Admitted) {
        a.activity.touch();
    }

    #[tokio::test]
    async fn at_the_cap_the_connection_that_sent_nothing_longest_is_closed() {
        let c = Connections::new(3);
        let a = c.admit().await;
        let b = c.admit().await;
        let d = c.admit().await;
        assert_eq!(c.live(), 3);
        reads(&a);
        let _working = b.activity.working();
        // a read since the hand last looked (a second chance), b is working: d goes.
        let e = c.admit().await;
        assert!(d.activity.0.gone.load(Ordering::Acquire));
        assert!(!a.activity.0.gone.load(Ordering::Acquire));
        assert!(!b.activity.0.gone.load(Ordering::Acquire));
        assert_eq!(c.live(), 3);
        // a used its second chance and read nothing since: it goes next, b still works.
        let _f = c.admit().await;
        assert!(a.activity.0.gone.load(Ordering::Acquire));
        assert!(!b.activity.0.gone.load(Ordering::Acquire));
        assert!(!e.activity.0.gone.load(Ordering::Acquire));
        assert_eq!(c.closed_totals().0, 2);
        drop(d);
        assert_eq!(c.live(), 3, "an evicted connection is not uncounted twice");
    }

    #[tokio::test]
    async fn when_every_connection_works_a_new_one_waits_for_a_slot() {
        let c = Connections::new(1);
        let a = c.admit().await;
        let w = a.activity.working();
        assert!(c.try_admit().is_none());
        let waiter = {
            let c = c.clone();
            tokio::spawn(async move { c.admit().await })
        };
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(w);
        let b = waiter.await.unwrap();
        assert!(
            a.activity.0.gone.load(Ordering::Acquire),
            "a was idle again: closed for b"
        );
        assert_eq!(c.live(), 1);
        drop(b);
        assert_eq!(c.live(), 0);
    }

    #[tokio::test]
    async fn ended_connections_do_not_pile_up_below_the_cap() {
        let c = Connections::new(1000);
        for _ in 0..10_000 {
            drop(c.admit().await);
        }
        assert_eq!(c.live(), 0);
        assert!(c.lock().entries.len() <= 64 + 1);
    }

    #[test]
    fn the_cap_follows_the_descriptor_limit() {
        assert_eq!(cap_for(None), CONNECTIONS_MAX);
        assert_eq!(cap_for(Some(1 << 20)), CONNECTIONS_MAX);
        assert_eq!(cap_for(Some(1024)), 1024 - FDS_RESERVED as usize);
        assert_eq!(cap_for(Some(10)), 1);
    }
}
