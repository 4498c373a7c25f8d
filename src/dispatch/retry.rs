//! Retry arithmetic (spec 6.5), pure: backoff after the n-th failure is
//! min(cap, base * 2^(n-1)) plus 0-25 % jitter; Retry-After overrides it when larger, capped
//! at one hour. The caller supplies the jitter draw so tests are exact.

/// Jitter is uniform in [0, JITTER_FRACTION_MAX) of the backoff.
pub const JITTER_FRACTION_MAX: f64 = 0.25;
/// Retry-After is honoured up to this many seconds (the destinations' parser caps it too).
pub use crate::destinations::retry_after::RETRY_AFTER_S_MAX;

/// A delay that doubles after each refusal, up to a cap, and starts over after a success:
/// the one rule behind the dispatcher's busy retries (of a tick, of its results, of its
/// start), a restarted half's wait under `hookspool run`, and a breaker's cooldown
/// ([`doubled`]). A batch's own backoff is its n-th step in closed form ([`backoff_s`]),
/// because the spool keeps the attempt count, not the delay.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    initial_s: f64,
    cap_s: f64,
    delay_s: f64,
}

impl Backoff {
    pub const fn new(initial_s: f64, cap_s: f64) -> Backoff {
        Backoff {
            initial_s,
            cap_s,
            delay_s: initial_s,
        }
    }

    /// The delay to wait now.
    pub fn delay_s(&self) -> f64 {
        self.delay_s
    }

    /// After another refusal: the next delay is twice this one, up to the cap.
    pub fn grow(&mut self) {
        self.delay_s = doubled(self.delay_s, self.cap_s);
    }

    /// After a success: the next refusal waits the initial delay again.
    pub fn reset(&mut self) {
        self.delay_s = self.initial_s;
    }

    /// A cap that depends on why the caller waits (`hookspool run`'s halves).
    pub fn set_cap_s(&mut self, cap_s: f64) {
        self.cap_s = cap_s;
    }
}

/// `delay_s` doubled, up to `cap_s`.
pub fn doubled(delay_s: f64, cap_s: f64) -> f64 {
    (delay_s * 2.0).min(cap_s)
}

/// The delay before the next try after the `n`-th failure (n >= 1), with `jitter01` drawn
/// uniformly from [0, 1).
pub fn backoff_s(n: i64, base_s: f64, cap_s: f64, jitter01: f64) -> f64 {
    let n = n.max(1);
    // 2^(n-1) overflows f64's useful range long before n reaches i64::MAX; the cap wins.
    let exp = ((n - 1).min(62)) as i32;
    let raw = (base_s * 2f64.powi(exp)).min(cap_s);
    raw + raw * JITTER_FRACTION_MAX * jitter01.clamp(0.0, 1.0)
}

/// A throttle's delay: Retry-After (capped) when given and larger than the backoff.
pub fn throttle_delay_s(retry_after_s: Option<f64>, backoff: f64) -> f64 {
    match retry_after_s {
        Some(r) if r.is_finite() && r > 0.0 => r.min(RETRY_AFTER_S_MAX).max(backoff),
        _ => backoff,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_doubles_from_base_to_cap() {
        let s: Vec<f64> = (1..=7).map(|n| backoff_s(n, 15.0, 300.0, 0.0)).collect();
        assert_eq!(s, vec![15.0, 30.0, 60.0, 120.0, 240.0, 300.0, 300.0]);
        assert_eq!(backoff_s(0, 15.0, 300.0, 0.0), 15.0);
        assert_eq!(backoff_s(1000, 15.0, 300.0, 0.0), 300.0);
    }

    /// The stepping type and the closed form are one rule: n steps of a Backoff from the
    /// base give the n-th failure's backoff without jitter; a reset starts over.
    #[test]
    fn a_backoff_steps_as_the_closed_form_and_resets() {
        let mut b = Backoff::new(15.0, 300.0);
        for n in 1..=8 {
            assert_eq!(b.delay_s(), backoff_s(n, 15.0, 300.0, 0.0), "step {n}");
            b.grow();
        }
        b.reset();
        assert_eq!(b.delay_s(), 15.0);
        b.set_cap_s(20.0);
        b.grow();
        assert_eq!(b.delay_s(), 20.0);
    }

    #[test]
    fn jitter_adds_up_to_a_quarter() {
        assert_eq!(backoff_s(2, 15.0, 300.0, 0.5), 30.0 + 3.75);
        assert!(backoff_s(6, 15.0, 300.0, 0.999) < 375.0);
    }

    #[test]
    fn retry_after_overrides_when_larger_and_is_capped() {
        assert_eq!(throttle_delay_s(Some(120.0), 15.0), 120.0);
        assert_eq!(throttle_delay_s(Some(5.0), 15.0), 15.0);
        assert_eq!(throttle_delay_s(Some(86_400.0), 15.0), 3600.0);
        assert_eq!(throttle_delay_s(None, 15.0), 15.0);
    }
}
