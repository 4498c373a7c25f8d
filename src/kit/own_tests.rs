//! The kit's tests row (spec 14.3.5: "the bobbin's own, network blocked"). A bobbin's own
//! tests are the executables directly in its `tests/` directory, in any language (the
//! Rust build's counterpart of the spec's `test_<vendor>_<product>.py`): the kit runs each
//! under the script sandbox with the network blocked (an empty network namespace), the
//! bobbin's directory readable and nothing else of the checkout, a private TMPDIR, the
//! working directory the bobbin's, HOOKSPOOL_BOBBIN and HOOKSPOOL_BOBBIN_DIR set, and
//! [`OWN_TEST_TIMEOUT_S`] each. Exit 0 passes; anything else is a finding with the exit and
//! the last lines of its stderr.
//!
//! Must not: run a file that is not executable (it is named instead), or give a test the
//! network.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::bobbins::Finding;
use crate::sandbox::{self, ExitStatus, Policy};

/// The directory in a bobbin that holds its own tests.
pub const OWN_TESTS_DIR: &str = "tests";
/// How long one of a bobbin's own tests may run.
pub const OWN_TEST_TIMEOUT_S: u64 = 60;
/// How much of a failing test's stderr the finding quotes.
const STDERR_QUOTED_BYTES: usize = 400;

/// The relative paths of a bobbin's own tests (files directly in `tests/`), from the
/// kit's list of the bobbin's files.
pub fn own_tests(files: &[String]) -> Vec<&str> {
    let prefix = format!("{OWN_TESTS_DIR}/");
    files
        .iter()
        .filter_map(|f| f.strip_prefix(&prefix).map(|rest| (f, rest)))
        .filter(|(_, rest)| !rest.contains('/'))
        .map(|(f, _)| f.as_str())
        .collect()
}

/// Runs each test; the findings of those that are not executable or did not exit 0.
pub fn run(dir: &Path, bobbin: &str, tests: &[&str]) -> Vec<Finding> {
    use std::os::unix::fs::PermissionsExt;
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(_) => {
            return vec![Finding::new(
                OWN_TESTS_DIR,
                0,
                "the async runtime cannot start",
            )];
        }
    };
    let mut out = Vec::new();
    for rel in tests {
        let path = dir.join(rel);
        let executable =
            std::fs::metadata(&path).is_ok_and(|m| m.permissions().mode() & 0o111 != 0);
        if !executable {
            out.push(Finding::new(*rel, 0, format!("not executable; a bobbin's own tests are executables in {OWN_TESTS_DIR}/ (chmod +x {rel}, with a #! line)")));
            continue;
        }
        let mut p = Policy::new(
            vec![path.to_string_lossy().into_owned()],
            Instant::now() + Duration::from_secs(OWN_TEST_TIMEOUT_S),
        );
        p.cwd = Some(dir.to_path_buf());
        p.read_paths = vec![dir.to_path_buf()];
        p.network = false;
        p.env = vec![
            ("HOOKSPOOL_BOBBIN".into(), bobbin.to_string()),
            (
                "HOOKSPOOL_BOBBIN_DIR".into(),
                dir.to_string_lossy().into_owned(),
            ),
        ];
        match rt.block_on(sandbox::run(p)) {
            Err(e) => out.push(Finding::new(
                *rel,
                0,
                format!("could not be run under the sandbox: {e}"),
            )),
            Ok(r) if r.timed_out => out.push(Finding::new(
                *rel,
                0,
                format!("still running after {OWN_TEST_TIMEOUT_S} s; make it finish sooner"),
            )),
            Ok(r) if r.status == ExitStatus::Code(0) => {}
            Ok(r) => {
                let tail = String::from_utf8_lossy(&r.stderr_tail);
                let start = tail.len().saturating_sub(STDERR_QUOTED_BYTES);
                let start = (start..=tail.len())
                    .find(|i| tail.is_char_boundary(*i))
                    .unwrap_or(tail.len());
                let status = match r.status {
                    ExitStatus::Code(c) => format!("exited {c}"),
                    ExitStatus::Signal(s) => format!("was killed by signal {s}"),
                };
                out.push(Finding::new(
                    *rel,
                    0,
                    format!(
                        "{status} (the network is blocked while it runs); its stderr ends: {}",
                        tail[start..].trim()
                    ),
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_tests_are_the_files_directly_in_tests() {
        let files: Vec<String> = [
            "README.md",
            "tests/check.sh",
            "tests/data/x.json",
            "tests2/y",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(own_tests(&files), ["tests/check.sh"]);
    }
}
