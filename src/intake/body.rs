//! The body of one request before its signature is checked (spec 9's body cap, issue 17):
//! read into ONE buffer of exactly its Content-Length, allocated once, under a deadline, and
//! only after the bytes it may hold were reserved from a process-wide budget for every
//! unverified body together.
//!
//! Why one buffer: hyper hands the body over as frames that share its read buffer. A sender
//! that writes a few bytes at a time makes every frame a slice pinning a whole read-buffer
//! allocation, and collecting the frames (`BodyExt::collect`) kept all of them: ~4.3 KB of
//! RSS per body byte, 955 MB still held after 2 000 such connections closed (issue 17).
//! Copying each frame into the one buffer and dropping it at once lets hyper reuse its read
//! buffer, so a connection holds its read buffer plus at most Content-Length bytes.
//!
//! Must not: look at the bytes (no source code runs before the body is whole), or hold a
//! reservation past verification (the handler drops it once the verdict is in).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use http_body_util::BodyExt;
use hyper::body::Incoming;

/// The bytes all bodies not yet verified may hold together. Sized for a burst of
/// full-size bodies (64 at the default 1 MiB `max_body_bytes`) while bounding what
/// unauthenticated senders can pin; past it a new body is answered 503 with
/// [`RETRY_AFTER_BODY_BUDGET_S`] before it is read.
pub const UNVERIFIED_BODIES_BYTES_MAX: u64 = 64 * 1024 * 1024;
/// Retry-After on the 503 for a full budget: the budget drains within one body deadline.
pub const RETRY_AFTER_BODY_BUDGET_S: u64 = 10;

/// The bytes reserved by unverified bodies (one per process: every listener shares it).
#[derive(Debug)]
pub struct Budget {
    held_bytes: AtomicU64,
    max_bytes: u64,
}

impl Budget {
    pub fn new(max_bytes: u64) -> Self {
        Budget {
            held_bytes: AtomicU64::new(0),
            max_bytes,
        }
    }

    /// Reserve `bytes` for one body, or `None` when that would pass the budget. A body of
    /// zero bytes always fits, and so does any body when nothing else is held: a source
    /// configured with a `max_body_bytes` above the budget is served one body at a time, so
    /// what is held never passes the larger of the budget and one body.
    pub fn reserve(&self, bytes: u64) -> Option<Reservation<'_>> {
        let mut held = self.held_bytes.load(Ordering::Relaxed);
        loop {
            let next = held.checked_add(bytes)?;
            if next > self.max_bytes && held > 0 && bytes > 0 {
                return None;
            }
            match self.held_bytes.compare_exchange_weak(
                held,
                next,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    return Some(Reservation {
                        budget: self,
                        bytes,
                    });
                }
                Err(now) => held = now,
            }
        }
    }

    /// The bytes reserved right now.
    pub fn held_bytes(&self) -> u64 {
        self.held_bytes.load(Ordering::Relaxed)
    }
}

/// Bytes of the budget one body holds; given back when dropped.
#[derive(Debug)]
pub struct Reservation<'a> {
    budget: &'a Budget,
    bytes: u64,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        let before = self
            .budget
            .held_bytes
            .fetch_sub(self.bytes, Ordering::AcqRel);
        // A reservation only gives back what it took.
        debug_assert!(before >= self.bytes, "the body budget went below zero");
    }
}

/// Why a body could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadError {
    /// More bytes than Content-Length said (hyper's length decoder already refuses this;
    /// checked again so the buffer can never grow).
    TooLong,
    /// The deadline passed before the last byte.
    Deadline,
    /// The connection broke or closed before the last byte.
    Broken,
}

/// Read exactly `declared` bytes into one buffer allocated once, within `deadline`.
pub async fn read(
    body: Incoming,
    declared: usize,
    deadline: Duration,
) -> Result<Vec<u8>, ReadError> {
    match tokio::time::timeout(deadline, read_into(body, declared)).await {
        Ok(r) => r,
        Err(_) => Err(ReadError::Deadline),
    }
}

async fn read_into(mut body: Incoming, declared: usize) -> Result<Vec<u8>, ReadError> {
    let mut buf = Vec::with_capacity(declared);
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|_| ReadError::Broken)?;
        // Trailers are not part of an HTTP/1 Content-Length body; nothing else arrives.
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if data.len() > declared - buf.len() {
            return Err(ReadError::TooLong);
        }
        buf.extend_from_slice(&data);
        // `data` drops here: hyper's read buffer is free again for the next bytes.
    }
    if buf.len() != declared {
        return Err(ReadError::Broken);
    }
    debug_assert_eq!(buf.capacity(), declared, "the body buffer never grew");
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_refuses_past_its_bound_and_frees_on_drop() {
        let b = Budget::new(100);
        let r1 = b.reserve(60).expect("fits");
        assert!(b.reserve(41).is_none(), "60 + 41 > 100");
        let r2 = b.reserve(40).expect("60 + 40 fits exactly");
        assert_eq!(b.held_bytes(), 100);
        assert!(b.reserve(1).is_none());
        assert!(b.reserve(0).is_some(), "an empty body always fits");
        drop(r1);
        assert_eq!(b.held_bytes(), 40);
        assert!(b.reserve(60).is_some());
        drop(r2);
        assert_eq!(b.held_bytes(), 0);
    }

    #[test]
    fn a_body_larger_than_the_whole_budget_fits_only_alone() {
        let b = Budget::new(10);
        let big = b.reserve(11).expect("nothing else is held");
        assert!(b.reserve(1).is_none());
        assert!(b.reserve(11).is_none());
        drop(big);
        let small = b.reserve(1).expect("fits");
        assert!(
            b.reserve(11).is_none(),
            "1 + 11 > 10 while another body is held"
        );
        drop(small);
        assert_eq!(b.held_bytes(), 0);
    }
}
