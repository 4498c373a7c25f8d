//! The one way a test says it cannot run here (a tool, root or a kernel feature it needs is
//! missing): [`skip_or_fail`]. It prints `SKIPPED: <why>` straight to stderr, past the test
//! harness's output capture, so a passing run still shows what did not run; the test then
//! returns. With `HOOKSPOOL_NO_SKIP=1` (CI sets it) a skip is a failure instead, so a green CI
//! run proves that nothing was skipped.
//!
//! Included by path from the library's unit tests and from the integration tests, so both
//! share one rule. Must not: install anything, or decide what a test needs (the test does).

/// Set to `1` to turn every skip into a failure.
pub const NO_SKIP_ENV: &str = "HOOKSPOOL_NO_SKIP";

/// Reports that the calling test cannot run here; panics under `HOOKSPOOL_NO_SKIP=1`.
pub fn skip_or_fail(why: &str) {
    if std::env::var_os(NO_SKIP_ENV).is_some_and(|v| v == "1") {
        panic!("{NO_SKIP_ENV}=1, and this test would be skipped: {why}");
    }
    use std::io::Write as _;
    // Written to the process's stderr directly: libtest captures only print!/eprint!.
    let _ = writeln!(std::io::stderr(), "SKIPPED: {why}");
}
