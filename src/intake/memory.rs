//! Giving memory back after a flood (issue 17): glibc malloc keeps what thousands of
//! connections freed in its per-thread arenas, so RSS stayed ~38 MB over the baseline after
//! 2 000 slow bodies closed. After the connection count falls well below its recent peak,
//! `malloc_trim(0)` returns the free pages of every arena to the kernel.
//!
//! Chosen by measurement (`tests/stress/intake.sh allocators`, RSS over the baseline 15 s
//! after 2 000 slow bodies closed / after a 5 500-connection flood stopped): glibc as is
//! +38 / +27 MB, glibc with this trim +2.7 / +11 MB, mimalloc +51 / +38 MB (and a 25 MB
//! baseline instead of 14), jemalloc (tikv-jemallocator, default decay) +39 / +23 MB.
//!
//! Must not: trim on every request (it takes each arena's lock), or exist off glibc (other
//! libcs get a no-op).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::conns::Connections;

/// How often the connection count is compared with its peak.
pub const TRIM_CHECK_S: u64 = 5;
/// A trim follows a fall of at least this many connections from the peak since the last
/// trim (and to at most half of it): after a flood, not after ordinary traffic.
pub const TRIM_CONNECTIONS_DROP_MIN: usize = 256;

/// Watch the connection count until shutdown; trim after each flood subsides.
pub async fn run(conns: Arc<Connections>, mut shutdown: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = super::stopping(&mut shutdown) => return,
            _ = tokio::time::sleep(Duration::from_secs(TRIM_CHECK_S)) => {}
        }
        let (peak, live) = conns.take_peak();
        if should_trim(peak, live) {
            let released = trim();
            tracing::debug!(
                component = "intake",
                reason = "connections fell",
                "connections fell from {peak} to {live}: freed memory returned to the kernel ({released})"
            );
        }
    }
}

/// A flood has subsided: the count fell by at least the minimum and to at most half.
fn should_trim(peak: usize, live: usize) -> bool {
    peak.saturating_sub(live) >= TRIM_CONNECTIONS_DROP_MIN && live <= peak / 2
}

/// Return free arena pages to the kernel; true when glibc released some.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn trim() -> bool {
    // SAFETY: malloc_trim only walks glibc's own arenas under their locks; it has no
    // preconditions on the caller.
    unsafe { nix::libc::malloc_trim(0) == 1 }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim() -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::should_trim;

    #[test]
    fn only_a_subsided_flood_is_trimmed() {
        assert!(should_trim(2000, 0));
        assert!(should_trim(600, 300));
        assert!(!should_trim(600, 301), "not down to half");
        assert!(!should_trim(200, 0), "ordinary traffic, not a flood");
        assert!(!should_trim(0, 0));
        assert!(!should_trim(5000, 4000));
    }
}
