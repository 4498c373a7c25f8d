//! Named crash points for tests (RUST-ADAPTATION: "named failpoints compiled in under a
//! cargo feature"). With the `failpoints` feature on and `HOOKSPOOL_FAILPOINT=<name>` in the
//! environment, reaching `<name>` prints `FAILPOINT <name>` on stderr and then either stops
//! the process dead (`HOOKSPOOL_FAILPOINT_ACTION=kill`, the default: SIGKILL to itself) or
//! waits forever (`pause`) so a test can deliver the SIGKILL itself. With `error`, the
//! points that ask [`error_once`] fail with an error of their own instead, once per process
//! (so whatever restarts them sees them pass). Without the feature every failpoint compiles
//! to nothing. This module must not do anything else.
//!
//! The names: `enqueue.after_copy`, `enqueue.before_commit`, `enqueue.after_commit`,
//! `seal.before_commit`, `claim.after_attempt`, `claim.before_commit`, `mark.before_commit`,
//! `mark.after_emits`, `prune.before_commit`, `prune.between_steps` (a retention pass with
//! a transaction committed and more to come), `deliver.after_claim` (claims committed, no
//! request made), `deliver.after_response` (an http or hermes destination has answered,
//! nothing recorded), `deliver.after_script_exit` (a script has exited, its emits not
//! recorded), `processor.after_journal`, `processor.after_apply`, `processor.after_emits`;
//! as errors, `dispatch.tick_fails` (the dispatcher stops on a bug-class error after its
//! first tick), `tick.commit_busy` (the commit of a tick's transaction that holds results
//! is refused as busy), `run.intake_stops` (under `run`, the intake half stops with an error
//! once it has served), `enqueue.refused` (the store refuses a request that is not a
//! quarantine, as invalid: the intake's StoreRefused fallback) and `intake.wal_sync_fails`
//! (the intake's own fdatasync of the WAL fails with EIO).

/// Stop here if the environment names this failpoint.
#[inline]
pub fn hit(name: &str) {
    #[cfg(feature = "failpoints")]
    {
        if std::env::var_os("HOOKSPOOL_FAILPOINT").is_some_and(|v| v == name) && !as_error() {
            trigger(name);
        }
    }
    #[cfg(not(feature = "failpoints"))]
    {
        let _ = name;
    }
}

/// Whether the caller should fail here with an error of its own: the environment names this
/// failpoint with `HOOKSPOOL_FAILPOINT_ACTION=error`. True once per process.
#[inline]
pub fn error_once(name: &str) -> bool {
    #[cfg(feature = "failpoints")]
    {
        use std::sync::atomic::{AtomicBool, Ordering};
        static FIRED: AtomicBool = AtomicBool::new(false);
        if std::env::var_os("HOOKSPOOL_FAILPOINT").is_some_and(|v| v == name)
            && as_error()
            && !FIRED.swap(true, Ordering::SeqCst)
        {
            eprintln!("FAILPOINT {name}");
            return true;
        }
        false
    }
    #[cfg(not(feature = "failpoints"))]
    {
        let _ = name;
        false
    }
}

#[cfg(feature = "failpoints")]
fn as_error() -> bool {
    std::env::var("HOOKSPOOL_FAILPOINT_ACTION").is_ok_and(|a| a == "error")
}

#[cfg(feature = "failpoints")]
fn trigger(name: &str) {
    use std::io::Write;
    let mut err = std::io::stderr();
    // Best effort: the marker is for the test harness; nothing depends on it being written.
    let _ = writeln!(err, "FAILPOINT {name}");
    let _ = err.flush();
    let pause = std::env::var("HOOKSPOOL_FAILPOINT_ACTION").is_ok_and(|a| a == "pause");
    if !pause {
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    }
    loop {
        std::thread::sleep(std::time::Duration::from_secs(3600));
    }
}
