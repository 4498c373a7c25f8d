//! The exec processor of a private bobbin (`[processor] exec = "<file in the bobbin>"`): an
//! executable in any language. It gets one JSON document on stdin,
//! `{"batch": <the batch document>, "instance": ..., "bobbin": ..., "settings": {...},
//! "state": {...}}`, and answers with one JSON document on stdout,
//! `{"items": [{"event_type": ..., ...}], "state": {"name": value, ...}}` (`state` holds the
//! writes; a null deletes the name; both keys optional). Exit 0 is success, 65 Permanent,
//! 78 Config (the operator must act on a credential or grant), anything else (75 by
//! convention) Retryable. Its stdout is the runtime's to parse, so
//! nothing it prints reaches the dispatcher; its stderr tail is passed on to the runtime's
//! stderr (the attempt's detail, stored and never logged).
//!
//! The environment: PATH, HOME, LANG (and TMPDIR when set) plus HOOKSPOOL_BOBBIN,
//! HOOKSPOOL_BOBBIN_INSTANCE, HOOKSPOOL_BOBBIN_DIR, HOOKSPOOL_BATCH_ID and
//! HOOKSPOOL_SECRET_REFS (references, so it reads its own file secrets). Not
//! HOOKSPOOL_STATE_DIR: state goes through the runtime's journal.
//!
//! An exec poller (spec 14.4) speaks the same protocol with one more answer: it may ask the
//! runtime for a GET instead of making it, `{"get": {"url": "https://...", "headers":
//! {...}}}`; the runtime makes it with `ctx.http.get_text` (its timeout, size cap, status
//! mapping; a 304 is an answer) and runs the program again with every answer so far in
//! `"http": [{"status": ..., "text": ..., "headers": {...}}, ...]` (see
//! `super::runtime::exec_poll`). So an exec poller needs no network of its own, and the
//! conformance kit's stub HTTP answers it exactly as it answers a built-in.
//!
//! Started through `sandbox::run_nested` (the runtime is already a sandboxed child).

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use serde_json::{Map, Value, json};

use super::contract::{self, Batch, Contract};
use super::{Item, ProcessorError};
use crate::destinations::script::{EXIT_PERMANENT, EXIT_PROCESSOR_CONFIG};
use crate::sandbox::{self, ExitStatus, NestedRun};

/// The exec processor's answer may be this large (items become emits capped at 1 MiB).
const EXEC_STDOUT_BYTES_MAX: usize = 4 * 1024 * 1024;
const EXEC_STDERR_TAIL_BYTES: usize = 2048;

pub struct Answer {
    pub items: Vec<Item>,
    pub writes: Map<String, Value>,
    /// An exec poller's request for a GET (`{"url": ..., "headers": {...}}`).
    pub get: Option<Value>,
}

pub fn run(
    program: &Path,
    c: &Contract,
    batch: &Batch,
    state: &Map<String, Value>,
    timeout: Duration,
) -> Result<Answer, ProcessorError> {
    run_with(program, c, batch, state, timeout, None)
}

/// [`run`] with the answers to an exec poller's earlier requests (`"http"` in its input).
pub fn run_with(
    program: &Path,
    c: &Contract,
    batch: &Batch,
    state: &Map<String, Value>,
    timeout: Duration,
    http: Option<&[Value]>,
) -> Result<Answer, ProcessorError> {
    let mut input = json!({
        "batch": batch.doc,
        "instance": c.instance,
        "bobbin": c.bobbin,
        "settings": c.settings,
        "state": state,
    });
    if let Some(h) = http {
        input["http"] = Value::Array(h.to_vec());
    }
    let mut env = vec![
        (contract::ENV_BOBBIN.to_string(), c.bobbin.clone()),
        (contract::ENV_INSTANCE.to_string(), c.instance.clone()),
        (
            contract::ENV_BOBBIN_DIR.to_string(),
            c.bobbin_dir.to_string_lossy().into_owned(),
        ),
        (contract::ENV_BATCH_ID.to_string(), c.batch_id.to_string()),
        (
            contract::ENV_SECRET_REFS.to_string(),
            serde_json::to_string(&c.secret_refs).unwrap_or_default(),
        ),
    ];
    if let Ok(tmp) = std::env::var("TMPDIR") {
        env.push(("TMPDIR".into(), tmp));
    }
    let out = sandbox::run_nested(NestedRun {
        program: program.to_path_buf(),
        cwd: c.bobbin_dir.clone(),
        env,
        // Serialising a Value cannot fail.
        stdin: serde_json::to_vec(&input).unwrap_or_default(),
        stdout_cap_bytes: EXEC_STDOUT_BYTES_MAX,
        stderr_tail_bytes: EXEC_STDERR_TAIL_BYTES,
        timeout,
    })
    .map_err(|e| {
        if e.is_exec_failure() {
            ProcessorError::permanent(
                "exec processor cannot be started (missing or not executable)",
            )
        } else {
            ProcessorError::retryable("exec processor could not be run")
        }
    })?;
    if !out.stderr_tail.is_empty() {
        let mut err = std::io::stderr();
        // Best effort: the tail is a diagnostic for the attempt's detail.
        let _ = err.write_all(&out.stderr_tail);
        let _ = err.write_all(b"\n");
    }
    if out.timed_out {
        return Err(ProcessorError::retryable("exec processor timed out"));
    }
    if out.stdout_overflow {
        return Err(ProcessorError::retryable(
            "exec processor answer over 4 MiB",
        ));
    }
    match out.status {
        ExitStatus::Code(0) => {}
        ExitStatus::Code(EXIT_PERMANENT) => {
            return Err(ProcessorError::permanent(
                "exec processor failed permanently (exit 65)",
            ));
        }
        ExitStatus::Code(EXIT_PROCESSOR_CONFIG) => {
            return Err(ProcessorError::config(
                "exec processor needs the operator (exit 78)",
            ));
        }
        ExitStatus::Code(code) => {
            return Err(ProcessorError::retryable(format!(
                "exec processor exit {code}"
            )));
        }
        ExitStatus::Signal(sig) => {
            return Err(ProcessorError::retryable(format!(
                "exec processor killed by signal {sig}"
            )));
        }
    }
    parse_answer(&out.stdout)
}

fn parse_answer(stdout: &[u8]) -> Result<Answer, ProcessorError> {
    let bad = |what: &'static str| ProcessorError::bug(format!("exec processor answer: {what}"));
    let text = std::str::from_utf8(stdout).map_err(|_| bad("not UTF-8"))?;
    if text.trim().is_empty() {
        return Ok(Answer {
            items: Vec::new(),
            writes: Map::new(),
            get: None,
        });
    }
    let Value::Object(mut doc) =
        serde_json::from_str(text).map_err(|_| bad("not one JSON object"))?
    else {
        return Err(bad("not a JSON object"));
    };
    let items = match doc.remove("items") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a
            .into_iter()
            .map(|i| match i {
                Value::Object(o) => Ok(o),
                _ => Err(bad("an item is not an object")),
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(bad("items is not an array")),
    };
    let writes = match doc.remove("state") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(o)) => o,
        Some(_) => return Err(bad("state is not an object")),
    };
    let get = match doc.remove("get") {
        None | Some(Value::Null) => None,
        Some(g @ Value::Object(_)) => Some(g),
        Some(_) => return Err(bad("get is not an object")),
    };
    Ok(Answer { items, writes, get })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_parse_and_bad_ones_say_why() {
        let a = parse_answer(br#"{"items":[{"event_type":"x"}],"state":{"n":1}}"#).unwrap();
        assert_eq!((a.items.len(), a.writes.len()), (1, 1));
        assert!(parse_answer(b"").unwrap().items.is_empty());
        for bad in [&b"[1]"[..], b"{\"items\":[1]}", b"hello", b"{\"state\":[]}"] {
            assert!(parse_answer(bad).is_err());
        }
    }
}
