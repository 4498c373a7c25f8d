//! The conformance kit's rows for a poll bobbin (spec 14.4 "Tooling"): its captures are
//! `captures/poll-<name>.json`, never requests, and its poller runs once per capture with
//! stub HTTP.
//!
//! A poll capture is `{"description": "...", "now": <unix s, optional>, "items": [...]
//! (optional), "http": [{"status": 200, "text": "...", "headers": {...}}, ...]}`: the stub's
//! answers in order, whose text and headers answer `get_text` (and, parsed as JSON, the JSON
//! methods and the OAuth token refresh) and whose `status = 304` is the not-modified answer.
//!
//! The captures are one instance's successive polls, in name order (`poll-1-first.json`,
//! `poll-2-changed.json`), sharing one state directory as a deployment's ticks do. For each
//! [`run`] expands the kit instance (`captures/kit.toml`) with the real expansion, runs the
//! real runtime (`processor::run_for_kit`: lock, journal, staged state, emits) in this
//! process with that stub, and checks: it
//! succeeds; every stdout line is an emit; the emits' event types are declared outputs and
//! match `items` when given (each given field equal); a second run of the same batch id
//! replays the journal (the same stdout, no request) when the poller keeps state; a
//! provider outage (every answer 503) exits 75, a refused credential (403) exits 78 (a
//! processor config failure: the operator fixes the credential) and a refused request
//! (400) exits 65.
//! Test secrets are written to files in the temporary home, which is removed afterwards.
//!
//! Must not: reach the network (the stub answers everything) or write into the bobbin.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;

use super::capture::{KIT_FILE, KitFile};
use crate::bobbins::Finding;
use crate::bobbins::catalog::Catalog;
use crate::bobbins::expand::{Expansion, expand_config};
use crate::bobbins::manifest::Manifest;
use crate::processor::http::{Http, StubAnswer};
use crate::processor::{
    Contract, EXIT_PERMANENT, EXIT_PROCESSOR_CONFIG, EXIT_RETRY, ProcessorError,
};

/// A poll capture's file name: `captures/poll-<name>.json`.
pub const POLL_CAPTURE_PREFIX: &str = "captures/poll-";
pub const POLL_CAPTURE_SUFFIX: &str = ".json";
/// A poll capture larger than this is not a capture.
const POLL_CAPTURE_BYTES_MAX: usize = 4 * 1024 * 1024;
/// How many stub answers the outage and refusal runs give (enough for a token refresh, one
/// retry and a page).
const FAILING_ANSWERS: usize = 4;

/// One parsed poll capture.
#[derive(Debug, Clone)]
pub struct PollCapture {
    pub file: String,
    pub now: Option<f64>,
    pub items: Option<Vec<Value>>,
    pub http: Vec<StubAnswer>,
}

/// Whether `file` is a poll capture's path.
pub fn is_poll_capture(file: &str) -> bool {
    file.starts_with(POLL_CAPTURE_PREFIX) && file.ends_with(POLL_CAPTURE_SUFFIX)
}

/// Parses a poll capture; a problem names the file and what to write instead.
pub fn parse(file: &str, text: &str) -> Result<PollCapture, Finding> {
    let bad = |m: &str| {
        Finding::new(
            file,
            1,
            format!(
                "{m}; a poll capture is {{\"description\": \"...\", \"now\": <unix s, optional>, \"items\": [...] (optional), \"http\": [{{\"status\": 200, \"text\": \"...\", \"headers\": {{}}}}]}}"
            ),
        )
    };
    if text.len() > POLL_CAPTURE_BYTES_MAX {
        return Err(bad("larger than 4 MiB"));
    }
    let doc: Value = serde_json::from_str(text).map_err(|_| bad("not JSON"))?;
    let Some(o) = doc.as_object() else {
        return Err(bad("not a JSON object"));
    };
    for k in o.keys() {
        if !["description", "now", "items", "http"].contains(&k.as_str()) {
            return Err(bad(&format!("unknown key {k:?}")));
        }
    }
    if o.get("description")
        .and_then(Value::as_str)
        .is_none_or(|d| d.trim().is_empty())
    {
        return Err(bad("say what the capture shows in description"));
    }
    let now = match o.get("now") {
        None => None,
        Some(v) => Some(v.as_f64().ok_or_else(|| bad("now must be a number"))?),
    };
    let items = match o.get("items") {
        None => None,
        Some(Value::Array(a)) if a.iter().all(Value::is_object) => Some(a.clone()),
        Some(_) => return Err(bad("items must be an array of objects")),
    };
    let mut http = Vec::new();
    for a in o
        .get("http")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("http must be an array of stub answers"))?
    {
        let status =
            a.get("status")
                .and_then(Value::as_u64)
                .filter(|s| (100..600).contains(s))
                .ok_or_else(|| bad("each answer needs a status (100-599)"))? as u16;
        let text = match a.get("text") {
            None => String::new(),
            Some(Value::String(t)) => t.clone(),
            Some(_) => return Err(bad("an answer's text must be a string")),
        };
        let mut headers = BTreeMap::new();
        match a.get("headers") {
            None => {}
            Some(Value::Object(h)) => {
                for (k, v) in h {
                    let v = v.as_str().ok_or_else(|| bad("header values are strings"))?;
                    headers.insert(k.to_ascii_lowercase(), v.to_string());
                }
            }
            Some(_) => return Err(bad("an answer's headers must be an object")),
        }
        http.push(StubAnswer {
            status,
            text,
            headers,
        });
    }
    Ok(PollCapture {
        file: file.to_string(),
        now,
        items,
        http,
    })
}

/// The captures row's findings for a poll bobbin: no request captures, at least one poll
/// capture, each of which parses.
pub fn captures(texts: &[(String, String)]) -> Vec<Finding> {
    let mut out = Vec::new();
    let mut found = 0;
    for (file, text) in texts {
        if file.starts_with("captures/") && file.ends_with(".http") {
            out.push(Finding::new(file, 1, "a poll bobbin has no URL and takes no requests; remove the request capture and describe a poll in captures/poll-<name>.json"));
        }
        if is_poll_capture(file) {
            found += 1;
            if let Err(f) = parse(file, text) {
                out.push(f);
            }
        }
    }
    if found == 0 {
        out.push(Finding::new("captures", 0, "no poll capture; add captures/poll-<name>.json with the stub answers of one poll (a 200 and a 304)"));
    }
    out
}

/// The poller row: every capture through the real runtime with stub HTTP.
pub fn run(
    dir: &Path,
    texts: &[(String, String)],
    m: &Manifest,
    catalog: &Catalog,
) -> Vec<Finding> {
    let kit_path = format!("captures/{KIT_FILE}");
    let Some(kit_text) = texts.iter().find(|(f, _)| *f == kit_path).map(|(_, t)| t) else {
        return vec![Finding::new(
            &kit_path,
            0,
            "missing; the poller runs as the kit instance: write instance = \"<name>\" and [bobbin]",
        )];
    };
    let kit = match KitFile::parse(&kit_path, kit_text) {
        Ok(k) => k,
        Err(f) => return vec![f],
    };
    let mut captures: Vec<PollCapture> = texts
        .iter()
        .filter(|(f, _)| is_poll_capture(f))
        .filter_map(|(f, t)| parse(f, t).ok())
        .collect();
    captures.sort_by(|a, b| a.file.cmp(&b.file));
    if captures.is_empty() {
        return vec![Finding::new(
            "captures",
            0,
            "no poll capture to run; add captures/poll-<name>.json",
        )];
    }
    let home = match TempHome::new() {
        Ok(h) => h,
        Err(e) => {
            return vec![Finding::new(
                &kit_path,
                0,
                format!("the kit's temporary home cannot be made ({e}); check TMPDIR"),
            )];
        }
    };
    let env = match instance_env(&kit, catalog, &home.0) {
        Ok(e) => e,
        Err(why) => return vec![Finding::new(&kit_path, 0, why)],
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(_) => return vec![Finding::new(&kit_path, 0, "the async runtime cannot start")],
    };
    let mut out = Vec::new();
    for (n, c) in captures.iter().enumerate() {
        let state = home.0.join("state");
        let run = |batch_id: i64,
                   answers: Vec<StubAnswer>|
         -> (
            Result<crate::processor::Report, ProcessorError>,
            String,
            usize,
        ) {
            let contract = match contract(&env, dir, &state, batch_id) {
                Ok(c) => c,
                Err(e) => return (Err(e), String::new(), 0),
            };
            let http = match Http::stubbed(answers) {
                Ok(h) => h,
                Err(e) => return (Err(e), String::new(), 0),
            };
            let clock: Arc<dyn crate::clock::Clock> = match c.now {
                Some(t) => Arc::new(crate::clock::ManualClock::new(t)),
                None => Arc::new(crate::clock::SystemClock),
            };
            let mut stdout = Vec::new();
            let doc = tick_document(batch_id, &kit.instance, c.now.unwrap_or(0.0));
            let r = rt.block_on(crate::processor::run_for_kit(
                &contract,
                &doc,
                &http,
                clock,
                &mut stdout,
            ));
            (
                r,
                String::from_utf8_lossy(&stdout).into_owned(),
                http.stub_requests().len(),
            )
        };
        let batch_id = 1 + n as i64;
        let (first, stdout, _) = run(batch_id, c.http.clone());
        let report = match first {
            Ok(r) => r,
            Err(e) => {
                out.push(Finding::new(&c.file, 1, format!("the poller failed on this capture (exit {}: {}); fix the poller or the stub answers", crate::processor::exit_code(&e), e.reason)));
                continue;
            }
        };
        if !report.undeclared.is_empty() {
            let types: Vec<&str> = report.undeclared.keys().map(String::as_str).collect();
            out.push(Finding::new(&c.file, 1, format!("the poller returned items of event types the manifest does not declare ({}); add [outputs.<type>] for each, or fix the poller", types.join(", "))));
        }
        out.extend(check_stdout(&c.file, &stdout, m, c.items.as_deref()));
        if m.runner().is_some_and(|r| r.state) {
            let (again, replayed, requests) = run(batch_id, Vec::new());
            if again.is_err() || replayed != stdout || requests != 0 {
                out.push(Finding::new(&c.file, 1, "a second run of the same batch did not replay its journal (it failed, printed other emits, or called the provider again); keep state only through ctx.save_state"));
            }
        }
        for (status, want, what) in [
            (503u16, EXIT_RETRY, "a provider outage (503)"),
            (403, EXIT_PROCESSOR_CONFIG, "a refused credential (403)"),
            (400, EXIT_PERMANENT, "a request the provider refuses (400)"),
        ] {
            let answers = vec![
                StubAnswer {
                    status,
                    text: String::new(),
                    headers: BTreeMap::new()
                };
                FAILING_ANSWERS
            ];
            let (r, printed, _) = run(1000 * batch_id + i64::from(status), answers);
            let code = r.as_ref().err().map_or(0, crate::processor::exit_code);
            if code != want || !printed.is_empty() {
                out.push(Finding::new(&c.file, 1, format!("{what} must exit {want} with nothing on stdout, and it exited {code}; return ctx.http's errors as they come: it maps an outage to Retryable, a refused credential to Config and a refused request to Permanent")));
            }
        }
    }
    out
}

/// Every stdout line is an emit; their event types are declared; the items match.
fn check_stdout(file: &str, stdout: &str, m: &Manifest, items: Option<&[Value]>) -> Vec<Finding> {
    let mut out = Vec::new();
    let mut payloads = Vec::new();
    for line in stdout.lines() {
        let emit = serde_json::from_str::<Value>(line)
            .ok()
            .and_then(|v| v.get("enqueue").cloned());
        let Some(emit) = emit else {
            out.push(Finding::new(file, 1, "the poller's run printed a line that is not an emit; nothing but emits may reach stdout"));
            continue;
        };
        let et = emit["event_type"].as_str().unwrap_or_default().to_string();
        if !m
            .outputs
            .keys()
            .any(|k| k.as_str() == et || k.as_str() == "*")
        {
            out.push(Finding::new(file, 1, format!("the poller emitted {et:?}, which is not a declared output; add [outputs.{et}] or fix the poller")));
        }
        payloads.push(emit["payload"].clone());
    }
    if let Some(want) = items {
        let matches = want.len() == payloads.len()
            && want.iter().zip(&payloads).all(|(w, got)| {
                w.as_object()
                    .is_some_and(|w| w.iter().all(|(k, v)| got.get(k) == Some(v)))
            });
        if !matches {
            out.push(Finding::new(file, 1, format!("the poller's items differ from the capture's items ({} expected, {} emitted; each given field must be equal); fix the poller or the capture", want.len(), payloads.len())));
        }
    }
    out
}

/// The tick batch's document, as the dispatcher delivers it to the script.
fn tick_document(batch_id: i64, instance: &str, now: f64) -> Vec<u8> {
    let tick = serde_json::json!({"tick": now.floor() as i64, "instance": instance});
    serde_json::json!({
        "batch_id": batch_id,
        "delivery_id": format!("kit-{batch_id}"),
        "source": instance,
        "key": crate::dispatch::polls::TICK_KEY,
        "events": [tick],
        "event_meta": [{"event_type": crate::dispatch::polls::TICK_EVENT_TYPE}],
    })
    .to_string()
    .into_bytes()
}

/// The kit instance's expanded script env (secrets written as files in the temporary home).
fn instance_env(
    kit: &KitFile,
    catalog: &Catalog,
    home: &Path,
) -> Result<BTreeMap<String, String>, String> {
    let secret_path = |name: &str| home.join(format!("secret-{name}"));
    for (name, value) in &kit.secrets {
        std::fs::write(secret_path(name), value)
            .map_err(|e| format!("a test secret cannot be written ({e})"))?;
    }
    let root = kit.config_root(|n| secret_path(n).display().to_string());
    let expanded = expand_config(&root, catalog, home).map_err(|e| {
        format!(
            "the kit instance does not expand: {}",
            e.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        )
    })?;
    let env = expanded
        .root
        .get("destinations")
        .and_then(|d| d.get(Expansion::script_name(&kit.instance)))
        .and_then(|d| d.get("env"))
        .and_then(toml::Value::as_table)
        .ok_or("the kit instance expands to no poller destination")?;
    Ok(env
        .iter()
        .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
        .collect())
}

fn contract(
    env: &BTreeMap<String, String>,
    dir: &Path,
    state: &Path,
    batch_id: i64,
) -> Result<Contract, ProcessorError> {
    let dir = std::fs::canonicalize(dir)
        .unwrap_or_else(|_| dir.to_path_buf())
        .display()
        .to_string();
    let state = state.display().to_string();
    let id = batch_id.to_string();
    Contract::from_vars(|name| match name {
        "HOOKSPOOL_BOBBIN_DIR" => Some(dir.clone()),
        "HOOKSPOOL_STATE_DIR" => Some(state.clone()),
        "HOOKSPOOL_BATCH_ID" => Some(id.clone()),
        "HOOKSPOOL_DELIVERY_ID" => Some(format!("kit-{id}")),
        other => env.get(other).cloned(),
    })
}

/// A private temporary directory, removed on drop.
struct TempHome(PathBuf);

impl TempHome {
    fn new() -> std::io::Result<TempHome> {
        use std::os::unix::fs::DirBuilderExt;
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        let p = std::env::temp_dir().join(format!(
            "hookspool-poll-kit-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::DirBuilder::new().mode(0o700).create(&p)?;
        Ok(TempHome(p))
    }
}

impl Drop for TempHome {
    fn drop(&mut self) {
        // Best effort: a leftover directory under TMPDIR holds only test values.
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
