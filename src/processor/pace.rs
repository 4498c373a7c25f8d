//! `ctx.pace(per_s)` (spec 14.3.7): a provider's request-rate rule. A processor calls
//! `wait()` before each request and core does the sleeping, so no bobbin loops or sleeps.

use std::time::{Duration, Instant};

/// Rates above this are treated as "no pacing" (a request a millisecond is not a rule).
const PER_S_MAX: f64 = 1000.0;

#[derive(Debug)]
pub struct Pacer {
    interval: Duration,
    next: Option<Instant>,
}

impl Pacer {
    /// At most `per_s` requests a second; a non-positive or non-finite rate never waits.
    pub fn new(per_s: f64) -> Pacer {
        let interval = if per_s.is_finite() && per_s > 0.0 && per_s < PER_S_MAX {
            Duration::from_secs_f64(1.0 / per_s)
        } else {
            Duration::ZERO
        };
        Pacer {
            interval,
            next: None,
        }
    }

    /// Waits until the next request is allowed, then books the slot after it.
    pub async fn wait(&mut self) {
        let now = Instant::now();
        if let Some(next) = self.next.filter(|n| *n > now) {
            tokio::time::sleep_until(next.into()).await;
        }
        self.next = Some(Instant::now().max(self.next.unwrap_or(now)) + self.interval);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn requests_are_spaced_by_the_rate() {
        let mut p = Pacer::new(20.0);
        let start = Instant::now();
        for _ in 0..4 {
            p.wait().await;
        }
        // Three gaps of 50 ms after the first request.
        assert!(
            start.elapsed() >= Duration::from_millis(140),
            "{:?}",
            start.elapsed()
        );
        let mut free = Pacer::new(0.0);
        let start = Instant::now();
        for _ in 0..100 {
            free.wait().await;
        }
        assert!(start.elapsed() < Duration::from_millis(50));
    }
}
