//! Named crash points for tests (RUST-ADAPTATION: "named failpoints compiled in under a
//! cargo feature"). With the `failpoints` feature on and `HOOKSPOOL_FAILPOINT=<name>` in the
//! environment, reaching `<name>` prints `FAILPOINT <name>` on stderr and then either stops
//! the process dead (`HOOKSPOOL_FAILPOINT_ACTION=kill`, the default: SIGKILL to itself) or
//! waits forever (`pause`) so a test can deliver the SIGKILL itself. Without the feature
//! every failpoint compiles to nothing. This module must not do anything else.

/// Stop here if the environment names this failpoint.
#[inline]
pub fn hit(name: &str) {
    #[cfg(feature = "failpoints")]
    {
        if std::env::var_os("HOOKSPOOL_FAILPOINT").is_some_and(|v| v == name) {
            trigger(name);
        }
    }
    #[cfg(not(feature = "failpoints"))]
    {
        let _ = name;
    }
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
