//! The request rate per destination (issue 35): a token bucket the engine consults beside
//! `max_inflight` before it claims, and the record of how long batches waited for it.
//!
//! Owns: the bucket arithmetic ([`Bucket`]) and the per-destination wait figures
//! ([`Limiter`]), both on the engine's clock (`now_eff` seconds, which never goes
//! backwards). A token is taken only when an attempt starts (a claim that won), so a batch
//! held by the limit is no attempt and costs nothing. Must not: read the clock, the store or
//! the config itself (the engine passes `now` and the destination's [`RateLimit`]).

use std::collections::BTreeSet;

use crate::config::RateLimit;

/// Float slack when counting whole tokens, so a token due at `t` is whole at `t`: unix
/// seconds in an f64 are exact to about 2.4e-7 s today, so `(now - at) * max_per_s` can
/// fall short of a whole token by that much times the rate. A shortfall beyond the slack
/// only delays the start by one `RATE_WAKE_MIN_S` wake-up.
const TOKEN_EPSILON: f64 = 1e-6;

/// A token bucket: `burst` tokens at most, refilled at `max_per_s` tokens a second; each
/// attempt start takes one. It starts full.
#[derive(Debug, Clone, PartialEq)]
pub struct Bucket {
    limit: RateLimit,
    tokens: f64,
    /// When `tokens` was last brought up to date.
    at: f64,
}

impl Bucket {
    pub fn new(limit: RateLimit, now: f64) -> Bucket {
        assert!(
            limit.max_per_s > 0.0 && limit.max_per_s.is_finite() && limit.burst >= 1,
            "config validated the rate limit: {limit:?}"
        );
        Bucket {
            limit,
            tokens: f64::from(limit.burst),
            at: now,
        }
    }

    fn refill(&mut self, now: f64) {
        // now_eff never goes backwards; a smaller `now` is only ever the same tick's.
        if now > self.at {
            let burst = f64::from(self.limit.burst);
            self.tokens = (self.tokens + (now - self.at) * self.limit.max_per_s).min(burst);
            self.at = now;
        }
    }

    /// A changed limit (a config reload): the tokens saved so far stay, up to the new burst.
    pub fn set_limit(&mut self, limit: RateLimit, now: f64) {
        if limit == self.limit {
            return;
        }
        self.refill(now);
        *self = Bucket {
            tokens: self.tokens.min(f64::from(limit.burst)),
            ..Bucket::new(limit, now)
        };
    }

    /// Whole tokens available at `now`: how many attempts may start now.
    pub fn available(&mut self, now: f64) -> u32 {
        self.refill(now);
        // tokens <= burst, a u32: the cast cannot truncate.
        (self.tokens + TOKEN_EPSILON).floor() as u32
    }

    /// An attempt started: take a token. False (and nothing taken) when none was available,
    /// which the engine never asks for (it starts at most `available` attempts).
    pub fn take(&mut self, now: f64) -> bool {
        if self.available(now) == 0 {
            return false;
        }
        self.tokens = (self.tokens - 1.0).max(0.0);
        true
    }

    /// When the next whole token is due: `now` when one is available.
    pub fn next_at(&mut self, now: f64) -> f64 {
        self.refill(now);
        if self.tokens + TOKEN_EPSILON >= 1.0 {
            now
        } else {
            now + (1.0 - self.tokens) / self.limit.max_per_s
        }
    }
}

/// One destination's bucket and how long its batches waited for it. The wait figures are
/// counters of this process (they start at 0 with the dispatcher, as Prometheus counters
/// may); the dispatcher publishes them with its heartbeat for `status` and /metrics.
#[derive(Debug, Clone, Default)]
pub struct Limiter {
    /// `None` once a reload removed the limit (the counters stay).
    bucket: Option<Bucket>,
    /// The batches the last accounted tick held by the limit, and that tick's time.
    held: BTreeSet<i64>,
    held_at: f64,
    /// Times a batch began to wait for the limit (held by a tick that had not held it).
    pub waits_total: u64,
    /// Seconds batches spent waiting for the limit, summed over batches: each tick that
    /// held a batch adds the time to the next accounted tick.
    pub wait_s_total: f64,
}

impl Limiter {
    /// The bucket for `limit` (made, or changed after a reload), or none without a limit.
    pub fn bucket(&mut self, limit: Option<RateLimit>, now: f64) -> Option<&mut Bucket> {
        match (limit, &mut self.bucket) {
            (None, b) => *b = None,
            (Some(l), Some(b)) => b.set_limit(l, now),
            (Some(l), b @ None) => *b = Some(Bucket::new(l, now)),
        }
        self.bucket.as_mut()
    }

    /// The bucket as it is, for the wake-up time (no change of limit).
    pub fn current(&mut self) -> Option<&mut Bucket> {
        self.bucket.as_mut()
    }

    /// A tick chose its claims and held `held` by this destination's limit: the batches the
    /// previous accounted tick held waited from then until now, and a batch held now that
    /// was not then begins a wait.
    pub fn account(&mut self, held: BTreeSet<i64>, now: f64) {
        if !self.held.is_empty() && now > self.held_at {
            self.wait_s_total += self.held.len() as f64 * (now - self.held_at);
        }
        self.waits_total += held.difference(&self.held).count() as u64;
        self.held = held;
        self.held_at = now;
    }

    /// Whether the last accounted tick held a batch (then the engine wakes for the next
    /// token).
    pub fn holding(&self) -> bool {
        !self.held.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{Clock, ManualClock};

    fn limit(max_per_s: f64, burst: u32) -> RateLimit {
        RateLimit { max_per_s, burst }
    }

    /// Starts the bucket allows over `seconds` of the test clock when something asks every
    /// `step` seconds and starts whatever it may.
    fn starts(b: &mut Bucket, clock: &ManualClock, seconds: f64, step: f64) -> Vec<f64> {
        let end = clock.now() + seconds;
        let mut out = Vec::new();
        while clock.now() < end {
            let now = clock.now();
            while b.available(now) > 0 {
                assert!(b.take(now));
                out.push(now);
            }
            clock.advance(step);
        }
        out
    }

    #[test]
    fn a_full_bucket_starts_burst_then_max_per_s() {
        let clock = ManualClock::new(1000.0);
        let mut b = Bucket::new(limit(5.0, 1), clock.now());
        let s = starts(&mut b, &clock, 10.0, 0.01);
        // One at once (the burst), then one every 0.2 s: 1 + 5 x 10 less the last edge.
        assert!((50..=51).contains(&s.len()), "{} starts", s.len());
        for w in s.windows(2) {
            assert!(w[1] - w[0] >= 0.2 - 1e-6, "spaced by 1/max_per_s: {w:?}");
        }
        // Any one-second window holds at most max_per_s + burst.
        for (i, t) in s.iter().enumerate() {
            let n = s[i..].iter().take_while(|u| **u < t + 1.0).count();
            assert!(n <= 6, "{n} starts in the second from {t}");
        }
    }

    #[test]
    fn burst_tokens_are_saved_while_idle_and_capped() {
        let clock = ManualClock::new(0.0);
        let mut b = Bucket::new(limit(2.0, 4), clock.now());
        assert_eq!(b.available(0.0), 4);
        for _ in 0..4 {
            assert!(b.take(0.0));
        }
        assert!(!b.take(0.0), "empty: nothing is taken");
        assert_eq!(b.available(0.0), 0);
        assert_eq!(b.next_at(0.0), 0.5, "the next token in 1/max_per_s");
        assert_eq!(b.available(0.49), 0);
        assert_eq!(b.available(0.5), 1);
        // Idle for an hour: never more than burst.
        assert_eq!(b.available(3600.0), 4);
        assert_eq!(b.next_at(3600.0), 3600.0);
    }

    #[test]
    fn a_fractional_rate_waits_seconds_per_token() {
        let mut b = Bucket::new(limit(0.5, 1), 10.0);
        assert!(b.take(10.0));
        assert_eq!(b.next_at(10.0), 12.0);
        assert_eq!(b.available(11.999), 0);
        assert!(b.take(12.0));
    }

    #[test]
    fn a_changed_limit_keeps_the_saved_tokens_up_to_the_new_burst() {
        let mut b = Bucket::new(limit(10.0, 10), 0.0);
        assert_eq!(b.available(0.0), 10);
        b.set_limit(limit(1.0, 2), 0.0);
        assert_eq!(b.available(0.0), 2, "capped at the new burst");
        assert!(b.take(0.0) && b.take(0.0));
        assert_eq!(b.next_at(0.0), 1.0, "the new rate");
        // The same limit again changes nothing.
        b.set_limit(limit(1.0, 2), 0.5);
        assert_eq!(b.next_at(0.5), 1.0);
    }

    #[test]
    fn a_time_that_stands_still_refills_nothing() {
        let mut b = Bucket::new(limit(100.0, 1), 50.0);
        assert!(b.take(50.0));
        assert_eq!(b.available(50.0), 0);
        assert_eq!(b.available(49.0), 0, "an earlier now changes nothing");
    }

    #[test]
    fn waits_are_counted_once_per_batch_and_timed_per_tick() {
        let mut l = Limiter::default();
        let set = |ids: &[i64]| ids.iter().copied().collect::<BTreeSet<i64>>();
        l.account(set(&[1, 2]), 100.0);
        assert_eq!((l.waits_total, l.wait_s_total), (2, 0.0));
        assert!(l.holding());
        // Batch 1 started; 2 still waits, 3 begins to.
        l.account(set(&[2, 3]), 100.5);
        assert_eq!((l.waits_total, l.wait_s_total), (3, 1.0));
        // Nothing held any more: 2 and 3 waited another 0.25 s each.
        l.account(set(&[]), 100.75);
        assert_eq!((l.waits_total, l.wait_s_total), (3, 1.5));
        assert!(!l.holding());
        l.account(set(&[]), 200.0);
        assert_eq!(l.wait_s_total, 1.5, "no batch held, no time counted");
    }

    #[test]
    fn a_reload_that_removes_the_limit_drops_the_bucket_and_keeps_the_counters() {
        let mut l = Limiter::default();
        assert!(l.bucket(Some(limit(1.0, 1)), 0.0).is_some());
        l.account([7].into_iter().collect(), 0.0);
        assert!(l.bucket(None, 1.0).is_none());
        assert!(l.current().is_none());
        assert_eq!(l.waits_total, 1);
        let b = l.bucket(Some(limit(4.0, 2)), 2.0).unwrap();
        assert_eq!(b.available(2.0), 2, "a new bucket starts full");
        assert!(b.take(2.0) && b.take(2.0));
        assert_eq!(b.next_at(2.0), 2.25, "at the new rate");
    }
}
