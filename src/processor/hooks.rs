//! A deployment's hooks module (spec 14.3.6): how a deployment changes what a built-in
//! bobbin does without editing it. A bobbin that supports hooks declares `[settings.hooks]`
//! of type path; the instance's value names an executable (any language, the Rust
//! adaptation's form of a module loaded by path) that the processor calls at the points the
//! bobbin documents (google.gmail: `classify` before its own mail rules; google.calendar:
//! `travel` for each changed event).
//!
//! One call is one run of the program: `{"hook": <name>, "args": {...}, "instance": ...,
//! "settings": {...}}` on stdin, one JSON object (the hook's answer) or `null` / nothing
//! (no opinion: the bobbin goes on as without hooks) on stdout. Exit 0 is an answer, 65
//! Permanent, 78 Config, anything else Retryable; a program that cannot be started is a
//! Config failure (the operator fixes the path or the file). Started through
//! `sandbox::run_nested`, as an exec processor is.
//!
//! Who checks the file: `hookspool check` and the script destination before every start
//! hold it to 14.3.6's owner and mode rules (`bobbins::catalog::check_hooks`); the
//! sandbox lets the processor read and execute that one file.
//!
//! Must not: log the answer or the arguments (they carry mail subjects and event titles).

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Map, Value, json};

use super::ProcessorError;
use crate::destinations::script::{EXIT_PERMANENT, EXIT_PROCESSOR_CONFIG};
use crate::sandbox::{self, ExitStatus, NestedRun};

/// The setting that names the hooks program.
pub const HOOKS_SETTING: &str = crate::destinations::script::HOOKS_SETTING;
/// One hook call may take this long.
pub const HOOK_TIMEOUT_S: u64 = 30;
/// A hook's answer may be this large.
const HOOK_STDOUT_BYTES_MAX: usize = 1024 * 1024;
const HOOK_STDERR_TAIL_BYTES: usize = 2048;

/// The instance's hooks program, when its `hooks` setting names one.
#[derive(Debug, Clone)]
pub struct Hooks {
    program: PathBuf,
}

impl Hooks {
    /// From the instance's settings: `hooks` unset or "" is no hooks.
    pub fn from_settings(settings: &Map<String, Value>) -> Option<Hooks> {
        settings
            .get(HOOKS_SETTING)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(|p| Hooks {
                program: PathBuf::from(p),
            })
    }

    /// Runs hook `name` with `args`; the answer object, or `None` for no opinion.
    pub fn call(
        &self,
        name: &str,
        args: Value,
        instance: &str,
        batch_id: i64,
        settings: &Map<String, Value>,
        cwd: PathBuf,
    ) -> Result<Option<Map<String, Value>>, ProcessorError> {
        let input = json!({
            "hook": name,
            "args": args,
            "instance": instance,
            "settings": settings,
        });
        let out = sandbox::run_nested(NestedRun {
            program: self.program.clone(),
            cwd,
            env: vec![
                (
                    super::contract::ENV_INSTANCE.to_string(),
                    instance.to_string(),
                ),
                (
                    super::contract::ENV_BATCH_ID.to_string(),
                    batch_id.to_string(),
                ),
            ],
            // Serialising a Value cannot fail.
            stdin: serde_json::to_vec(&input).unwrap_or_default(),
            stdout_cap_bytes: HOOK_STDOUT_BYTES_MAX,
            stderr_tail_bytes: HOOK_STDERR_TAIL_BYTES,
            timeout: Duration::from_secs(HOOK_TIMEOUT_S),
        })
        .map_err(|e| {
            if e.is_exec_failure() {
                ProcessorError::config(
                    "hooks program cannot be started (missing or not executable); fix settings.hooks",
                )
            } else {
                ProcessorError::retryable("hooks program could not be run")
            }
        })?;
        if out.timed_out {
            return Err(ProcessorError::retryable("hooks program timed out"));
        }
        if out.stdout_overflow {
            return Err(ProcessorError::retryable("hooks program answer over 1 MiB"));
        }
        match out.status {
            ExitStatus::Code(0) => {}
            ExitStatus::Code(EXIT_PERMANENT) => {
                return Err(ProcessorError::permanent(
                    "hooks program failed permanently (exit 65)",
                ));
            }
            ExitStatus::Code(EXIT_PROCESSOR_CONFIG) => {
                return Err(ProcessorError::config(
                    "hooks program needs the operator (exit 78)",
                ));
            }
            ExitStatus::Code(code) => {
                return Err(ProcessorError::retryable(format!(
                    "hooks program exit {code}"
                )));
            }
            ExitStatus::Signal(sig) => {
                return Err(ProcessorError::retryable(format!(
                    "hooks program killed by signal {sig}"
                )));
            }
        }
        parse_answer(&out.stdout)
    }
}

fn parse_answer(stdout: &[u8]) -> Result<Option<Map<String, Value>>, ProcessorError> {
    let bad = || ProcessorError::permanent("hooks program answer is not one JSON object or null");
    let text = std::str::from_utf8(stdout).map_err(|_| bad())?;
    if text.trim().is_empty() {
        return Ok(None);
    }
    match serde_json::from_str(text).map_err(|_| bad())? {
        Value::Null => Ok(None),
        Value::Object(o) => Ok(Some(o)),
        _ => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_an_object_or_no_opinion() {
        assert!(parse_answer(b"").unwrap().is_none());
        assert!(parse_answer(b"null\n").unwrap().is_none());
        assert_eq!(
            parse_answer(br#"{"output":"x"}"#).unwrap().unwrap().len(),
            1
        );
        for bad in [&b"[1]"[..], b"hello", b"\"x\""] {
            assert!(parse_answer(bad).is_err());
        }
        let mut s = Map::new();
        assert!(Hooks::from_settings(&s).is_none());
        s.insert(HOOKS_SETTING.into(), Value::from(""));
        assert!(Hooks::from_settings(&s).is_none());
        s.insert(
            HOOKS_SETTING.into(),
            Value::from("/etc/hookspool/hooks/gmail"),
        );
        assert!(Hooks::from_settings(&s).is_some());
    }
}
