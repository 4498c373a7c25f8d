//! What this kernel lets the sandbox enforce, found by running `/bin/true` under the default
//! policy once. The dispatcher (and `hookspool run`) calls it at start so a degraded sandbox
//! (no landlock, no seccomp) is logged once, shown by status and raised as the
//! `config:sandbox` issue, and a script destination with `sandbox.required = true` stops
//! the start.
//!
//! Test seam: with the `failpoints` feature, `HOOKSPOOL_TEST_SANDBOX_DEGRADE` set to a
//! comma-separated list of `landlock` and `seccomp` makes the probe report them missing, so
//! a test can run the real binary as it would start on a degraded kernel. It changes the
//! report only: the scripts themselves still get everything this kernel enforces.

use std::time::{Duration, Instant};

use super::{Enforcement, LandlockLevel, Policy, SandboxError};

/// How long the probe may take.
pub const PROBE_S_MAX: u64 = 10;

pub async fn probe() -> Result<Enforcement, SandboxError> {
    let policy = Policy::new(
        vec!["/bin/true".to_string()],
        Instant::now() + Duration::from_secs(PROBE_S_MAX),
    );
    let enforced = super::run(policy).await?.enforcement;
    Ok(simulated_degradation(enforced))
}

/// The test seam of the module doc; without the `failpoints` feature, `e` unchanged.
fn simulated_degradation(e: Enforcement) -> Enforcement {
    #[cfg(feature = "failpoints")]
    if let Ok(list) = std::env::var("HOOKSPOOL_TEST_SANDBOX_DEGRADE") {
        let mut e = e;
        for part in list.split(',').map(str::trim) {
            match part {
                "landlock" => e.landlock = LandlockLevel::None,
                "seccomp" => e.seccomp = false,
                _ => {}
            }
        }
        return e;
    }
    e
}

/// A one-line, log-safe description.
pub fn describe(e: &Enforcement) -> String {
    let landlock = match e.landlock {
        LandlockLevel::Full { abi } => format!("landlock full (ABI {abi})"),
        LandlockLevel::Partial { abi } => format!("landlock partial (ABI {abi})"),
        LandlockLevel::None => "no landlock".to_string(),
    };
    let seccomp = if e.seccomp {
        "seccomp on"
    } else {
        "no seccomp"
    };
    let caps = if e.caps_dropped {
        "capabilities dropped"
    } else {
        "capabilities kept"
    };
    format!("{landlock}, {seccomp}, {caps}")
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn the_probe_reports_what_this_kernel_enforces() {
        let e = super::probe().await.expect("probe runs");
        // This machine (and CI) has landlock and seccomp; the description says so.
        assert!(super::describe(&e).contains("seccomp"));
        assert!(e.no_new_privs);
    }
}
