//! The body of one request before its signature is checked (spec 9's body cap, issues 17 and
//! 28): read into ONE buffer of exactly its Content-Length, allocated once, under a deadline
//! and a minimum rate, and only after the bytes it may hold were reserved from a
//! process-wide budget for every unverified body together.
//!
//! Why one buffer: hyper hands the body over as frames that share its read buffer. A sender
//! that writes a few bytes at a time makes every frame a slice pinning a whole read-buffer
//! allocation, and collecting the frames (`BodyExt::collect`) kept all of them: ~4.3 KB of
//! RSS per body byte, 955 MB still held after 2 000 such connections closed (issue 17).
//! Copying each frame into the one buffer and dropping it at once lets hyper reuse its read
//! buffer, so a connection holds its read buffer plus at most Content-Length bytes.
//!
//! Why the budget is fair (issue 28): unauthenticated senders that declare large bodies and
//! trickle them kept the whole budget reserved, and signed webhooks got 503. Two rules take
//! a reservation from a body that is not arriving at a useful rate:
//! - the rate: after [`BODY_RATE_GRACE_MS`], a body whose average rate so far would not
//!   finish it within `BODY_READ_S_MAX` is cut (408, reason `body_rate`), checked every
//!   [`BODY_RATE_CHECK_MS`];
//! - eviction: when a new body does not fit, the slowest holders (those that at their
//!   average rate so far would finish last; see `slower`) that have held their reservation
//!   for at least [`EVICT_AGE_MIN_MS`] and are still reading are cut, as few as make room
//!   and at most [`EVICT_PER_BODY_MAX`] (503 + Retry-After, reason `body_evicted`) and its bytes go to the
//!   new body, as the connection cap closes the idlest connection. A new body is refused
//!   (503 `body_budget`) only when that cannot make room: too few holders are old enough
//!   and still reading.
//!
//! Must not: look at the bytes (no source code runs before the body is whole), hold a
//! reservation past verification (the handler drops it once the verdict is in), or count a
//! reservation's bytes twice (whoever releases it first, the eviction or the drop, gives
//! them back; the other does nothing).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use hyper::body::Incoming;
use tokio::sync::Notify;

/// The bytes all bodies not yet verified may hold together. Sized for a burst of
/// full-size bodies (64 at the default 1 MiB `max_body_bytes`) while bounding what
/// unauthenticated senders can pin; past it the slowest holder is cut, or, when none can be,
/// a new body is answered 503 with [`RETRY_AFTER_BODY_BUDGET_S`] before it is read.
pub const UNVERIFIED_BODIES_BYTES_MAX: u64 = 64 * 1024 * 1024;
/// Retry-After on the 503 for a full budget and for an evicted body: the budget drains
/// within one body deadline.
pub const RETRY_AFTER_BODY_BUDGET_S: u64 = 10;
/// A body is not judged by its rate before this: a sender gets time to start.
pub const BODY_RATE_GRACE_MS: u64 = 1000;
/// How often a body's rate is judged after the grace.
pub const BODY_RATE_CHECK_MS: u64 = 250;
/// At most this many holders are cut to admit one body: a large body facing only small
/// starving holders is refused (503) rather than cutting hundreds of connections, which
/// would let each starving sender's reconnect cost the intake hundreds of cuts.
pub const EVICT_PER_BODY_MAX: usize = 4;
/// How many of the slowest holders one ranking keeps, and how long it is used before the
/// holders are ranked again.
pub const EVICT_RANKED_MAX: usize = 64;
pub const EVICT_RANK_MS: u64 = 25;
/// A holder younger than this has no rate to judge and is never evicted (a body behind the
/// reverse proxy arrives within a millisecond of its head; this only keeps a full budget
/// from cutting the body it admitted a moment ago).
pub const EVICT_AGE_MIN_MS: u64 = 50;

/// The bytes reserved by unverified bodies (one per process: every listener shares it).
#[derive(Debug)]
pub struct Budget {
    held_bytes: AtomicU64,
    max_bytes: u64,
    holders: Mutex<Holders>,
    next_id: AtomicU64,
    evicted: AtomicU64,
}

/// One reservation's progress, shared by its reader and the budget.
#[derive(Debug)]
struct Holder {
    bytes: u64,
    started: Instant,
    received: AtomicU64,
    /// Set by whoever gave the bytes back first (an eviction or the drop).
    released: AtomicBool,
    /// Woken when the holder is evicted; a permit waits if the reader is not listening yet.
    cut: Notify,
}

impl Holder {
    /// Still reading and old enough to have a rate.
    fn evictable(&self, now: Instant) -> bool {
        !self.released.load(Ordering::Acquire)
            && self.received.load(Ordering::Relaxed) < self.bytes
            && now.saturating_duration_since(self.started)
                >= Duration::from_millis(EVICT_AGE_MIN_MS)
    }

    /// What decides who is cut first: (bytes received, bytes declared, age in microseconds).
    fn progress(&self, now: Instant) -> Progress {
        Progress {
            received: u128::from(self.received.load(Ordering::Relaxed)),
            declared: u128::from(self.bytes),
            age_us: now
                .saturating_duration_since(self.started)
                .as_micros()
                .max(1),
        }
    }
}

/// Every holder, and the slowest of them ranked a moment ago.
#[derive(Debug, Default)]
struct Holders {
    map: HashMap<u64, Arc<Holder>>,
    /// At most [`EVICT_RANKED_MAX`] evictable holders, the slowest first, as they were at
    /// `ranked_at`: a full budget under a flood is met by thousands of new bodies a second,
    /// and ranking every holder for each of them was most of the intake's CPU (issue 28).
    ranked: std::collections::VecDeque<Arc<Holder>>,
    ranked_at: Option<Instant>,
}

impl Holders {
    /// Rank the evictable holders at `now`, keeping the slowest [`EVICT_RANKED_MAX`].
    fn rank(&mut self, now: Instant) {
        let mut all: Vec<(Progress, &Arc<Holder>)> = self
            .map
            .values()
            .filter(|h| h.evictable(now))
            .map(|h| (h.progress(now), h))
            .collect();
        let order = |a: &(Progress, &Arc<Holder>), b: &(Progress, &Arc<Holder>)| match (
            slower(a.0, b.0),
            slower(b.0, a.0),
        ) {
            (true, _) => std::cmp::Ordering::Less,
            (_, true) => std::cmp::Ordering::Greater,
            _ => std::cmp::Ordering::Equal,
        };
        if all.len() > EVICT_RANKED_MAX {
            all.select_nth_unstable_by(EVICT_RANKED_MAX - 1, order);
            all.truncate(EVICT_RANKED_MAX);
        }
        all.sort_unstable_by(order);
        self.ranked = all.into_iter().map(|(_, h)| h.clone()).collect();
        self.ranked_at = Some(now);
    }

    /// The first still-evictable ranked holders that make room for `bytes`, at most
    /// [`EVICT_PER_BODY_MAX`], taken out of the ranking; None (the ranking left as it was
    /// but for holders no longer evictable) when they would not make room.
    fn pick(&mut self, bytes: u64, held: u64, max: u64, now: Instant) -> Option<Vec<Arc<Holder>>> {
        self.ranked.retain(|h| h.evictable(now));
        let fits = |freed: u64| {
            let left = held.saturating_sub(freed);
            left == 0 || left.saturating_add(bytes) <= max
        };
        let mut freed = 0u64;
        let mut take = 0;
        while !fits(freed) && take < self.ranked.len().min(EVICT_PER_BODY_MAX) {
            freed += self.ranked[take].bytes;
            take += 1;
        }
        if take == 0 || !fits(freed) {
            return None;
        }
        Some(self.ranked.drain(..take).collect())
    }
}

/// A holder's progress at one instant.
#[derive(Debug, Clone, Copy)]
struct Progress {
    received: u128,
    declared: u128,
    age_us: u128,
}

/// Whether holder `a` is a better victim than `b`: at its average rate so far it would
/// finish later (age x declared / received, a body with nothing received never); on a tie,
/// the older, then the larger. So the bodies least likely ever to finish go first, and of
/// two starving senders the one pinning more of the budget: cutting one 768 KiB trickle
/// makes room that would otherwise cost hundreds of small ones.
fn slower(a: Progress, b: Progress) -> bool {
    // a.finish > b.finish, cross-multiplied: a.age * a.declared * b.received >
    // b.age * b.declared * a.received (at most 1e7 us x 1e9 bytes x 1e9 bytes < 2^128).
    let lhs = a.age_us * a.declared * b.received;
    let rhs = b.age_us * b.declared * a.received;
    match lhs.cmp(&rhs) {
        std::cmp::Ordering::Greater => true,
        std::cmp::Ordering::Less => false,
        std::cmp::Ordering::Equal => (a.age_us, a.declared) > (b.age_us, b.declared),
    }
}

impl Budget {
    pub fn new(max_bytes: u64) -> Self {
        Budget {
            held_bytes: AtomicU64::new(0),
            max_bytes,
            holders: Mutex::new(Holders::default()),
            next_id: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
        }
    }

    /// Reserve `bytes` for one body, cutting the slowest holders while it does not fit, or
    /// `None` when it does not fit and nothing can be cut. A body of zero bytes always fits,
    /// and so does any body when nothing else is held: a source configured with a
    /// `max_body_bytes` above the budget is served one body at a time, so what is held never
    /// passes the larger of the budget and one body.
    pub fn reserve(&self, bytes: u64) -> Option<Reservation<'_>> {
        self.reserve_at(bytes, Instant::now())
    }

    fn reserve_at(&self, bytes: u64, now: Instant) -> Option<Reservation<'_>> {
        while !self.try_add(bytes)? {
            if !self.evict_for(bytes, now) {
                return None;
            }
        }
        let holder = (bytes > 0).then(|| {
            let h = Arc::new(Holder {
                bytes,
                started: now,
                received: AtomicU64::new(0),
                released: AtomicBool::new(false),
                cut: Notify::new(),
            });
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            self.lock().map.insert(id, h.clone());
            (id, h)
        });
        Some(Reservation {
            budget: self,
            holder,
        })
    }

    /// Add `bytes` when they fit: Some(true) added, Some(false) full, None overflow.
    fn try_add(&self, bytes: u64) -> Option<bool> {
        let mut held = self.held_bytes.load(Ordering::Relaxed);
        loop {
            let next = held.checked_add(bytes)?;
            if next > self.max_bytes && held > 0 && bytes > 0 {
                return Some(false);
            }
            match self.held_bytes.compare_exchange_weak(
                held,
                next,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Some(true),
                Err(now) => held = now,
            }
        }
    }

    /// Cut the slowest evictable holders, as few as make room for `bytes` and at most
    /// [`EVICT_PER_BODY_MAX`], and take their bytes back; false (and nobody cut) when even
    /// those would not make room.
    fn evict_for(&self, bytes: u64, now: Instant) -> bool {
        let mut holders = self.lock();
        let fresh = holders.ranked_at.is_some_and(|at| {
            now.saturating_duration_since(at) < Duration::from_millis(EVICT_RANK_MS)
        });
        if !fresh {
            holders.rank(now);
        }
        let mut victims = holders.pick(bytes, self.held_bytes(), self.max_bytes, now);
        if victims.is_none() && fresh {
            // The ranking may be stale: holders that were too young may be old enough now.
            holders.rank(now);
            victims = holders.pick(bytes, self.held_bytes(), self.max_bytes, now);
        }
        let Some(victims) = victims else {
            return false;
        };
        for victim in victims {
            if !victim.released.swap(true, Ordering::AcqRel) {
                self.held_bytes.fetch_sub(victim.bytes, Ordering::AcqRel);
                self.evicted.fetch_add(1, Ordering::Relaxed);
            }
            victim.cut.notify_one();
        }
        true
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Holders> {
        // The lock only holds Arcs; a poisoned one still holds whole values.
        self.holders.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The bytes reserved right now.
    pub fn held_bytes(&self) -> u64 {
        self.held_bytes.load(Ordering::Relaxed)
    }

    /// Bodies cut to admit another since the start.
    pub fn evicted_total(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }
}

/// Bytes of the budget one body holds; given back when dropped (or when evicted).
#[derive(Debug)]
pub struct Reservation<'a> {
    budget: &'a Budget,
    /// None for an empty body, which holds nothing.
    holder: Option<(u64, Arc<Holder>)>,
}

impl Reservation<'_> {
    fn received(&self, n: usize) {
        if let Some((_, h)) = &self.holder {
            h.received.fetch_add(n as u64, Ordering::Relaxed);
        }
    }

    /// Resolves when the budget cut this body to admit another.
    async fn evicted(&self) {
        match &self.holder {
            Some((_, h)) => h.cut.notified().await,
            None => std::future::pending().await,
        }
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        let Some((id, h)) = self.holder.take() else {
            return;
        };
        self.budget.lock().map.remove(&id);
        if !h.released.swap(true, Ordering::AcqRel) {
            let before = self.budget.held_bytes.fetch_sub(h.bytes, Ordering::AcqRel);
            // A reservation only gives back what it took.
            debug_assert!(before >= h.bytes, "the body budget went below zero");
        }
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
    /// After the grace, the average rate so far would not finish the body by the deadline.
    TooSlow,
    /// The budget cut this body to admit another.
    Evicted,
    /// The connection broke or closed before the last byte.
    Broken,
}

/// Whether a body that has `received` of `declared` bytes after `elapsed` is too slow: past
/// the grace, its average rate would not bring all of it within `deadline`.
fn too_slow(received: u64, declared: u64, elapsed: Duration, deadline: Duration) -> bool {
    if elapsed < Duration::from_millis(BODY_RATE_GRACE_MS) {
        return false;
    }
    // received / elapsed < declared / deadline, cross-multiplied in microseconds.
    u128::from(received) * deadline.as_micros() < u128::from(declared) * elapsed.as_micros()
}

/// Read exactly `declared` bytes into one buffer allocated once, within `deadline`, at a
/// rate that can finish by then, unless the budget cuts `reservation`.
pub async fn read(
    mut body: Incoming,
    reservation: &Reservation<'_>,
    declared: usize,
    deadline: Duration,
) -> Result<Vec<u8>, ReadError> {
    let started = tokio::time::Instant::now();
    let mut next_check = started + Duration::from_millis(BODY_RATE_GRACE_MS);
    let mut buf = Vec::with_capacity(declared);
    let evicted = reservation.evicted();
    tokio::pin!(evicted);
    loop {
        tokio::select! {
            biased;
            _ = &mut evicted => return Err(ReadError::Evicted),
            frame = body.frame() => {
                let Some(frame) = frame else { break };
                let frame = frame.map_err(|_| ReadError::Broken)?;
                // Trailers are not part of an HTTP/1 Content-Length body; nothing else arrives.
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                if data.len() > declared - buf.len() {
                    return Err(ReadError::TooLong);
                }
                buf.extend_from_slice(&data);
                reservation.received(data.len());
                // `data` drops here: hyper's read buffer is free again for the next bytes.
            }
            _ = tokio::time::sleep_until(started + deadline) => return Err(ReadError::Deadline),
            _ = tokio::time::sleep_until(next_check) => {
                if too_slow(buf.len() as u64, declared as u64, started.elapsed(), deadline) {
                    return Err(ReadError::TooSlow);
                }
                next_check += Duration::from_millis(BODY_RATE_CHECK_MS);
            }
        }
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

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn the_budget_refuses_past_its_bound_and_frees_on_drop() {
        let b = Budget::new(100);
        let t = Instant::now();
        // Nothing is old enough to evict: the bound holds as before.
        let r1 = b.reserve_at(60, t).expect("fits");
        assert!(b.reserve_at(41, t).is_none(), "60 + 41 > 100");
        let r2 = b.reserve_at(40, t).expect("60 + 40 fits exactly");
        assert_eq!(b.held_bytes(), 100);
        assert!(b.reserve_at(1, t).is_none());
        assert!(b.reserve_at(0, t).is_some(), "an empty body always fits");
        drop(r1);
        assert_eq!(b.held_bytes(), 40);
        assert!(b.reserve_at(60, t).is_some());
        drop(r2);
        assert_eq!(b.held_bytes(), 0);
        assert_eq!(b.evicted_total(), 0);
    }

    #[test]
    fn a_body_larger_than_the_whole_budget_fits_only_alone() {
        let b = Budget::new(10);
        let t = Instant::now();
        let big = b.reserve_at(11, t).expect("nothing else is held");
        assert!(b.reserve_at(1, t).is_none());
        assert!(b.reserve_at(11, t).is_none());
        drop(big);
        let small = b.reserve_at(1, t).expect("fits");
        assert!(
            b.reserve_at(11, t).is_none(),
            "1 + 11 > 10 while another body is held"
        );
        drop(small);
        assert_eq!(b.held_bytes(), 0);
    }

    #[test]
    fn a_full_budget_cuts_the_slowest_old_enough_holder_for_a_new_body() {
        let b = Budget::new(100);
        let t = Instant::now();
        let fast = b.reserve_at(40, t).unwrap();
        let slow = b.reserve_at(40, t).unwrap();
        let later = t + ms(EVICT_AGE_MIN_MS + 50);
        let young = b.reserve_at(20, later - ms(EVICT_AGE_MIN_MS - 1)).unwrap();
        fast.received(30);
        slow.received(2);
        // 30 bytes needed: the slow one goes (the young one has no rate yet).
        let new = b
            .reserve_at(30, later)
            .expect("the slowest holder made room");
        assert_eq!(b.evicted_total(), 1);
        assert_eq!(b.held_bytes(), 40 + 20 + 30);
        let slow_cut = slow
            .holder
            .as_ref()
            .unwrap()
            .1
            .released
            .load(Ordering::Acquire);
        assert!(slow_cut, "the slow holder was cut");
        // Its drop gives nothing back twice.
        drop(slow);
        assert_eq!(b.held_bytes(), 90);
        // The whole budget for one body: the young holders cannot be cut, so it does not
        // fit, and nobody is cut for nothing.
        assert!(b.reserve_at(100, later).is_none());
        assert_eq!(
            b.held_bytes(),
            90,
            "no holder was cut for a body that cannot fit"
        );
        // Later every holder is old enough: all three go for it.
        let whole = b
            .reserve_at(100, later + ms(EVICT_AGE_MIN_MS))
            .expect("room made");
        assert_eq!(b.held_bytes(), 100);
        assert_eq!(b.evicted_total(), 4);
        drop((fast, new, young, whole));
        assert_eq!(b.held_bytes(), 0);
        // Never more than EVICT_PER_BODY_MAX cut for one body.
        let many: Vec<_> = (0..10).map(|_| b.reserve_at(10, t).unwrap()).collect();
        assert!(
            b.reserve_at(10 * (EVICT_PER_BODY_MAX as u64 + 1), later)
                .is_none()
        );
        assert_eq!(
            b.held_bytes(),
            100,
            "nobody cut for a body that could not fit"
        );
        assert!(
            b.reserve_at(10 * EVICT_PER_BODY_MAX as u64, later)
                .is_some()
        );
        assert_eq!(b.evicted_total(), 4 + EVICT_PER_BODY_MAX as u64);
        drop(many);
    }

    #[test]
    fn of_many_holders_the_slowest_are_cut() {
        let b = Budget::new(100);
        let t = Instant::now();
        let holders: Vec<_> = (0..10).map(|_| b.reserve_at(10, t).unwrap()).collect();
        // Received 9, 8, ..., 0 bytes: the last two are the slowest.
        for (n, h) in holders.iter().enumerate() {
            h.received(9 - n);
        }
        let _new = b
            .reserve_at(20, t + ms(EVICT_AGE_MIN_MS))
            .expect("room made");
        let cut: Vec<usize> = holders
            .iter()
            .enumerate()
            .filter(|(_, h)| {
                h.holder
                    .as_ref()
                    .unwrap()
                    .1
                    .released
                    .load(Ordering::Acquire)
            })
            .map(|(n, _)| n)
            .collect();
        assert_eq!(cut, [8, 9]);
    }

    #[test]
    fn a_whole_body_awaiting_its_verdict_is_never_cut() {
        let b = Budget::new(10);
        let t = Instant::now();
        let whole = b.reserve_at(10, t).unwrap();
        whole.received(10);
        assert!(b.reserve_at(5, t + ms(5_000)).is_none());
        assert_eq!(b.evicted_total(), 0);
        drop(whole);
    }

    #[test]
    fn the_holder_that_would_finish_last_is_cut_first() {
        let p = |received: u128, declared: u128, age_us: u128| Progress {
            received,
            declared,
            age_us,
        };
        assert!(
            slower(p(0, 10, 500), p(0, 10, 300)),
            "nothing yet: the older"
        );
        assert!(!slower(p(0, 10, 300), p(0, 10, 500)));
        assert!(
            slower(p(0, 20, 300), p(0, 10, 300)),
            "nothing yet, as old: the larger"
        );
        assert!(
            slower(p(1, 10, 1000), p(1, 10, 500)),
            "1 byte in 1 ms is slower than in 0.5 ms"
        );
        assert!(!slower(p(10, 100, 1000), p(1, 100, 1000)));
        assert!(
            slower(p(0, 10, 1), p(9, 10, 1_000_000)),
            "nothing received finishes never"
        );
        // The same trickle: 8 bytes of 768 KiB finish far later than 8 bytes of 1 000.
        assert!(slower(p(8, 786_432, 400_000), p(8, 1000, 900_000)));
        // A body nearly whole at a modest rate is kept before a fast-looking starter.
        assert!(slower(p(8, 1_000_000, 100_000), p(900, 1000, 900_000)));
    }

    #[test]
    fn the_rate_rule_cuts_only_bodies_that_cannot_finish_by_the_deadline() {
        let deadline = Duration::from_secs(10);
        let grace = ms(BODY_RATE_GRACE_MS);
        assert!(!too_slow(0, 1000, grace - ms(1), deadline), "the grace");
        assert!(
            too_slow(0, 1000, grace, deadline),
            "nothing after the grace"
        );
        // 8 bytes every half second (the attack): 16 B/s for 1 000 bytes is 62 s.
        assert!(too_slow(16, 1000, grace, deadline));
        // One byte every 60 ms of a 97-byte body finishes in 5.8 s: kept.
        assert!(!too_slow(17, 97, grace, deadline));
        assert!(!too_slow(80, 97, ms(4_800), deadline));
        // Half a body in half the deadline is exactly on time; a little less is not.
        assert!(!too_slow(500, 1000, ms(5_000), deadline));
        assert!(too_slow(499, 1000, ms(5_000), deadline));
    }
}
