//! The one place time is read. Everything that needs "now" takes a `Clock` (or a `now`
//! argument computed from one), so tests drive time with `ManualClock` instead of sleeping.
//! This module must not touch the store: the dispatcher's clock guard (`now_eff`, spec 2)
//! combines a `Clock` reading with `meta.last_tick_at` in the dispatcher.

use std::sync::Arc;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

/// A source of wall-clock time in Unix seconds.
pub trait Clock: Send + Sync {
    fn now(&self) -> f64;
}

/// The system's wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> f64 {
        // A clock before 1970 is a broken host, not an error we can recover from; reading it
        // as 0 keeps time standing still (the clock guard) rather than panicking.
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0)
    }
}

/// A clock that moves only when told to. Cloning shares the same time.
#[derive(Debug, Clone)]
pub struct ManualClock {
    now: Arc<Mutex<f64>>,
}

impl ManualClock {
    pub fn new(start: f64) -> ManualClock {
        ManualClock {
            now: Arc::new(Mutex::new(start)),
        }
    }

    pub fn set(&self, t: f64) {
        *self.lock() = t;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, f64> {
        // A poisoned lock only means a test thread panicked while holding it; the f64
        // inside is still a valid time.
        self.now.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Clock for ManualClock {
    fn now(&self) -> f64 {
        *self.lock()
    }
}

/// The shared handle every long-lived component holds.
pub type SharedClock = Arc<dyn Clock>;

/// The wall clock the services run on. In a build with the `failpoints` test feature only,
/// `HOOKSPOOL_TEST_CLOCK_OFFSET_FILE` names a file holding seconds added to it, read at
/// every reading ([`OffsetFileClock`]), so a test can send a provider's timestamped capture
/// to the real binary at the capture's own time (a real capture cannot be re-signed).
pub fn system() -> SharedClock {
    #[cfg(feature = "failpoints")]
    if let Some(file) = std::env::var_os(TEST_CLOCK_OFFSET_FILE_ENV).filter(|v| !v.is_empty()) {
        return Arc::new(OffsetFileClock { file: file.into() });
    }
    Arc::new(SystemClock)
}

/// The test clock's environment variable (honoured only with the `failpoints` feature).
pub const TEST_CLOCK_OFFSET_FILE_ENV: &str = "HOOKSPOOL_TEST_CLOCK_OFFSET_FILE";

/// The wall clock plus the offset (seconds, a decimal number) in a file; a missing or
/// unreadable file is an offset of 0. Built only with the `failpoints` test feature.
#[cfg(feature = "failpoints")]
#[derive(Debug, Clone)]
pub struct OffsetFileClock {
    file: std::path::PathBuf,
}

#[cfg(feature = "failpoints")]
impl Clock for OffsetFileClock {
    fn now(&self) -> f64 {
        let offset = std::fs::read_to_string(&self.file)
            .ok()
            .and_then(|t| t.trim().parse::<f64>().ok())
            .filter(|o| o.is_finite())
            .unwrap_or(0.0);
        SystemClock.now() + offset
    }
}

/// Unit tests move a manual clock by a step; integration tests have their own helper.
#[cfg(test)]
mod test_support {
    impl super::ManualClock {
        pub fn advance(&self, dt: f64) {
            *self.lock() += dt;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_told() {
        let c = ManualClock::new(100.0);
        let shared = c.clone();
        assert_eq!(c.now(), 100.0);
        c.advance(5.5);
        assert_eq!(shared.now(), 105.5);
        c.set(50.0);
        assert_eq!(shared.now(), 50.0);
    }

    #[test]
    fn system_clock_is_after_2020() {
        assert!(SystemClock.now() > 1_577_836_800.0);
    }
}
