//! What this kernel lets the sandbox enforce, found by running `/bin/true` under the default
//! policy once. The dispatcher calls it at start so a degraded sandbox (no landlock, no
//! seccomp) is logged once, shown by status and raised as a config issue (issue: scripts
//! still run, but with less isolation than the operator may expect).

use std::time::{Duration, Instant};

use super::{Enforcement, LandlockLevel, Policy, SandboxError};

/// How long the probe may take.
pub const PROBE_S_MAX: u64 = 10;

pub async fn probe() -> Result<Enforcement, SandboxError> {
    let policy = Policy::new(
        vec!["/bin/true".to_string()],
        Instant::now() + Duration::from_secs(PROBE_S_MAX),
    );
    Ok(super::run(policy).await?.enforcement)
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
