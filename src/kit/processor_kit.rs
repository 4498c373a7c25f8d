//! The kit's processor row (spec 14.3.5): every capture of `captures/` that the kit
//! instance's source accepts becomes a one-event batch, run through the bobbin's processor
//! by the runtime itself (`processor::run_contract`, the steps `hookspool processor` takes)
//! with the environment the instance's expansion gives its script destination, against a
//! stub provider API on 127.0.0.1:0 that answers from `captures/kit.toml`'s `[stub]`
//! (`capture::Stub`). Each run must exit 0, print nothing but emit lines, return only item
//! types the manifest declares as outputs, and (with state) replay its journal on a second
//! run of the same batch id without a request to the stub; each `[[stub.fail]]` run must
//! exit with its `exit` code and print nothing. A request no answer matches, or a kit secret
//! in the processor's log, is a finding too.
//!
//! Every declared output is mapped for the kit's runs (so no item is dropped as unmapped
//! before it is checked), and the runs start from `[stub] state` in a throwaway state
//! directory; the test secrets are written to throwaway files the references point at.
//! An exec processor runs through `sandbox::run_nested` as under the dispatcher, here
//! outside a sandbox, with a cleared environment (spec 14.3.5, "Running it on someone else's
//! code": a maintainer runs the kit on pull request code in a throwaway environment).
//!
//! Must not: read or write outside the bobbin directory and its own temporary directory,
//! reach any address but its own stub, or put a secret value in a finding.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};

use super::capture::{KIT_FILE, KitFile, StubAnswer};
use super::source_kit::{AcceptedCapture, accepted_captures};
use super::{CAPTURES_DIR, KIT_HOME};
use crate::bobbins::Finding;
use crate::bobbins::catalog::Catalog;
use crate::config::DestinationSpec;
use crate::observe::logging::SharedBuf;
use crate::processor::http::Endpoints;
use crate::processor::{Contract, ProcessorError, Report, contract, exit_code, run_contract};

mod stub;

use stub::StubServer;

/// The first kit batch's id; failure runs count on from [`FAIL_BATCH_ID_BASE`].
const BATCH_ID_BASE: i64 = 1;
const FAIL_BATCH_ID_BASE: i64 = 1000;
/// A kit secret at least this long is looked for in the processor's log (shorter test
/// values, such as `{}`, would match by chance).
const SECRET_LOGGED_CHARS_MIN: usize = 8;

/// The processor row's problems. `outputs` are the event types the manifest declares.
pub(super) fn check(
    texts: &[(String, String)],
    outputs: &[String],
    stateful: bool,
    catalog: &Catalog,
) -> Vec<Finding> {
    let file = format!("{CAPTURES_DIR}/{KIT_FILE}");
    let Some(Ok(kit)) = texts
        .iter()
        .find(|(f, _)| *f == file)
        .map(|(_, t)| KitFile::parse(&file, t))
    else {
        return vec![Finding::new(
            &file,
            0,
            "missing or invalid; the processor row runs the accepted captures through the processor with this file's instance, [secrets] and [stub] answers",
        )];
    };
    let accepted = match accepted_captures(texts, &kit, catalog) {
        Ok(a) if a.is_empty() => {
            return vec![Finding::new(
                CAPTURES_DIR,
                0,
                "no capture the kit instance's source accepts; the processor row needs one to run the processor on",
            )];
        }
        Ok(a) => a,
        Err(why) => {
            return why
                .into_iter()
                .map(|w| Finding::new(&file, 0, format!("the kit instance does not build: {w}")))
                .collect();
        }
    };
    let tmp = match Scratch::new() {
        Ok(t) => t,
        Err(e) => {
            return vec![Finding::new(
                &file,
                0,
                format!(
                    "the kit's temporary directory cannot be made ({}); set TMPDIR to a writable directory",
                    e.kind()
                ),
            )];
        }
    };
    let base = match expanded_env(&kit, outputs, catalog, &tmp) {
        Ok(env) => env,
        Err(why) => return vec![Finding::new(&file, 0, why)],
    };
    let server = match StubServer::start(kit.stub.answer.clone()) {
        Ok(s) => s,
        Err(e) => {
            return vec![Finding::new(
                &file,
                0,
                format!("the kit's stub server cannot start ({})", e.kind()),
            )];
        }
    };
    let kr = KitRun {
        kit: &kit,
        base,
        stateful,
        tmp: &tmp,
        server: &server,
    };
    let logs = SharedBuf::default();
    let mut problems = Vec::new();
    let mut emitted = 0;
    tracing::subscriber::with_default(subscriber(&logs), || {
        for (i, cap) in accepted.iter().enumerate() {
            let (p, n) = kr.clean_run(cap, BATCH_ID_BASE + i as i64);
            problems.extend(p);
            emitted += n;
        }
        for (k, fail) in kit.stub.fail.iter().enumerate() {
            problems.extend(kr.fail_run(&accepted[0], k, fail.exit, &fail.answer));
        }
    });
    if emitted == 0 && problems.is_empty() && !outputs.is_empty() {
        problems.push(Finding::new(&file, 0, "no run of the accepted captures produced an item, so nothing was checked; give [stub] a state and answers under which the processor has something to report"));
    }
    for seen in server.unanswered() {
        problems.push(Finding::new(&file, 0, format!("the processor asked {} {}{} and no [[stub.answer]] matches; add one with method = {:?}, host = {:?}, path = {:?}", seen.method, seen.host, seen.path, seen.method, seen.host, seen.path)));
    }
    problems.extend(secrets_logged(&kit, &logs.text(), &file));
    problems
}

/// What every run of one kit shares.
struct KitRun<'a> {
    kit: &'a KitFile,
    /// The script destination's environment as the expansion writes it, with the kit's
    /// secret files and every declared output mapped.
    base: BTreeMap<String, String>,
    stateful: bool,
    tmp: &'a Scratch,
    server: &'a StubServer,
}

impl KitRun<'_> {
    /// One accepted capture's batch: exit 0, emits only, declared types, then the replay.
    /// Also returns how many emits it printed.
    fn clean_run(&self, cap: &AcceptedCapture, id: i64) -> (Vec<Finding>, usize) {
        let at = |m: String| Finding::new(&cap.file, cap.request_line, m);
        let state_dir = self.tmp.path.join(format!("state-{id}"));
        if let Err(e) = self.seed(&state_dir) {
            return (
                vec![at(format!("the kit's [stub] state cannot be written: {e}"))],
                0,
            );
        }
        let doc = document(&self.kit.instance, id, cap);
        let first = self.run(id, &state_dir, &doc);
        let (out, report) = match first {
            Ok(done) => done,
            Err(e) => {
                return (
                    vec![at(format!(
                        "the processor exited {} on this capture's batch with the kit's stub answers ({}); add the [[stub.answer]] it needs or fix the processor",
                        exit_code(&e),
                        e.reason
                    ))],
                    0,
                );
            }
        };
        let emitted = out.split(|b| *b == b'\n').filter(|l| !l.is_empty()).count();
        let mut problems = Vec::new();
        if let Err(why) = emits_only(&out) {
            problems.push(at(why));
        }
        if !report.undeclared.is_empty() {
            let types: Vec<&str> = report.undeclared.keys().map(String::as_str).collect();
            problems.push(at(format!("the processor returned items of event types the manifest does not declare ({}); add [outputs.<type>] for each, or fix the processor", types.join(", "))));
        }
        if !self.stateful {
            return (problems, emitted);
        }
        let asked = self.server.requests();
        match self.run(id, &state_dir, &doc) {
            Ok((again, r)) => {
                if !r.replayed || self.server.requests() != asked {
                    problems.push(at("a second run of the same batch id called the processor (or the provider) again; with state = true the journal must replay it".to_string()));
                }
                if again != out {
                    problems.push(at("a second run of the same batch id printed other emits than the first; the journal must replay them".to_string()));
                }
            }
            Err(e) => problems.push(at(format!(
                "a second run of the same batch id exited {} ({}); the journal must replay it",
                exit_code(&e),
                e.reason
            ))),
        }
        (problems, emitted)
    }

    /// One `[[stub.fail]]`: its answer first, once, and the exit code it names.
    fn fail_run(
        &self,
        cap: &AcceptedCapture,
        k: usize,
        exit: i32,
        answer: &StubAnswer,
    ) -> Vec<Finding> {
        let file = format!("{CAPTURES_DIR}/{KIT_FILE}");
        let at = |m: String| Finding::new(&file, 0, format!("[[stub.fail]] {}: {m}", k + 1));
        let id = FAIL_BATCH_ID_BASE + k as i64;
        let state_dir = self.tmp.path.join(format!("state-{id}"));
        if let Err(e) = self.seed(&state_dir) {
            return vec![at(format!("the kit's [stub] state cannot be written: {e}"))];
        }
        let used = self.server.push_first(answer.clone());
        let doc = document(&self.kit.instance, id, cap);
        let mut problems = Vec::new();
        match self.run(id, &state_dir, &doc) {
            Ok(_) => problems.push(at(format!(
                "the processor exited 0; this answer must make it exit {exit}"
            ))),
            Err(e) if exit_code(&e) != exit => problems.push(at(format!(
                "the processor exited {} ({}); this answer must make it exit {exit}",
                exit_code(&e),
                e.reason
            ))),
            Err(_) => {}
        }
        if !self.server.was_used(used) {
            self.server.forget(used);
            problems.push(at(format!(
                "the processor never asked {} {}; the failure run tested nothing",
                answer.method, answer.path
            )));
        }
        problems
    }

    fn seed(&self, dir: &Path) -> Result<(), ProcessorError> {
        let values: Map<String, Value> = serde_json::to_value(&self.kit.stub.state)
            .ok()
            .and_then(|v| v.as_object().cloned())
            .unwrap_or_default();
        crate::processor::seed_state(dir, &values)
    }

    /// The runtime on one document, its stdout captured.
    fn run(
        &self,
        id: i64,
        state_dir: &Path,
        doc: &Value,
    ) -> Result<(Vec<u8>, Report), ProcessorError> {
        let mut env = self.base.clone();
        env.insert(contract::ENV_BATCH_ID.into(), id.to_string());
        env.insert(contract::ENV_DELIVERY_ID.into(), format!("hs_kit_{id}"));
        env.insert(
            contract::ENV_STATE_DIR.into(),
            state_dir.to_string_lossy().into_owned(),
        );
        let c = Contract::from_vars(|n| env.get(n).cloned())?;
        let endpoints = Endpoints::stub(&self.server.base)?;
        let stdin = serde_json::to_vec(doc).unwrap_or_default();
        let mut out = Vec::new();
        let report = run_contract(&self.kit.instance, &c, &stdin, endpoints, &mut out)?;
        Ok((out, report))
    }
}

/// The environment the instance's expansion writes for its script destination, with the
/// kit's secrets as files under `tmp` and every declared output mapped.
fn expanded_env(
    kit: &KitFile,
    outputs: &[String],
    catalog: &Catalog,
    tmp: &Scratch,
) -> Result<BTreeMap<String, String>, String> {
    let secrets = tmp.path.join("secrets");
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&secrets)
        .map_err(|e| format!("the kit's secret directory cannot be made ({})", e.kind()))?;
    for (name, value) in &kit.secrets {
        write_private(&secrets.join(name), value.as_bytes())
            .map_err(|e| format!("the kit's secret {name} cannot be written ({})", e.kind()))?;
    }
    let root = kit.config_root(|n| secrets.join(n).to_string_lossy().into_owned());
    let text = toml::to_string(&root).map_err(|e| e.to_string())?;
    let inputs = crate::config::PathInputs {
        home_flag: Some(KIT_HOME.into()),
        ..Default::default()
    };
    let (config, _) = crate::config::parse_with_catalog(&text, None, &inputs, false, catalog)
        .map_err(|ps| {
            let all: Vec<String> = ps.iter().map(|p| p.to_string()).collect();
            format!("the kit instance does not build: {}", all.join("; "))
        })?;
    let name = format!("script:{}", kit.instance);
    let Some(DestinationSpec::Script(script)) = config.destinations.get(&name).map(|d| &d.spec)
    else {
        return Err(format!(
            "the kit instance has no {name} destination after expansion"
        ));
    };
    let mut env = script.env.clone();
    let routes: Map<String, Value> = outputs
        .iter()
        .map(|t| (t.clone(), Value::String(format!("hermes:kit-{t}"))))
        .collect();
    env.insert(
        contract::ENV_DELTA_ROUTES.into(),
        Value::Object(routes).to_string(),
    );
    Ok(env)
}

/// The batch document of one accepted capture, as the dispatcher renders it (spec 6.4).
fn document(instance: &str, id: i64, cap: &AcceptedCapture) -> Value {
    let e = &cap.event;
    json!({
        "source": instance,
        "route": instance,
        "key": e.key,
        "batch_id": id,
        "delivery_id": format!("hs_kit_{id}"),
        "attempt": 1,
        "count": 1,
        "first_at": crate::kit::signer::KIT_NOW,
        "last_at": crate::kit::signer::KIT_NOW,
        "event_type": e.event_type,
        "event_types": { e.event_type.clone(): 1 },
        "summary": format!("1 {instance} event(s) for {} ({} x1)", e.key, e.event_type),
        "content_hash": "sha256:kit",
        "events": [e.payload],
        "event_meta": [{"id": 1, "event_type": e.event_type, "received_at": crate::kit::signer::KIT_NOW, "dedup_id": e.dedup_id}],
    })
}

/// Every stdout line is an emit the script destination accepts.
fn emits_only(out: &[u8]) -> Result<(), String> {
    for line in out.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        if !line.starts_with(b"{\"enqueue\":") {
            return Err("the processor printed a line that is not an emit; nothing but {\"enqueue\": ...} lines may reach stdout".into());
        }
    }
    crate::destinations::script::parse_emits(out)
        .map(|_| ())
        .map_err(|e| format!("the processor printed an emit the script destination refuses ({e})"))
}

/// A kit secret value in the processor's log lines (names the secret, never the value).
fn secrets_logged(kit: &KitFile, log: &str, file: &str) -> Vec<Finding> {
    kit.secrets
        .iter()
        .filter(|(_, v)| v.chars().count() >= SECRET_LOGGED_CHARS_MIN && log.contains(v.as_str()))
        .map(|(name, _)| Finding::new(file, 0, format!("the processor's log carries the value of secret {name}; log ids and counts, never a secret")))
        .collect()
}

fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(bytes)
}

/// The kit's own temporary directory (state directories, secret files), removed on drop.
struct Scratch {
    path: PathBuf,
}

impl Scratch {
    fn new() -> std::io::Result<Scratch> {
        let path = std::env::temp_dir().join(format!(
            "hookspool-kit-{}-{:016x}",
            std::process::id(),
            rand::random::<u64>()
        ));
        std::fs::DirBuilder::new().mode(0o700).create(&path)?;
        Ok(Scratch { path })
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // Best effort: a leftover directory under the temporary directory holds only the
        // kit's made-up test values.
        if let Err(e) = std::fs::remove_dir_all(&self.path) {
            tracing::debug!("kit scratch directory not removed ({})", e.kind());
        }
    }
}

/// The processor's log lines during the kit's runs, kept to look for secrets: logging's
/// in-memory writer under a plain fmt subscriber.
fn subscriber(sink: &SharedBuf) -> impl tracing::Subscriber + Send + Sync + 'static {
    let sink = sink.clone();
    tracing_subscriber::fmt()
        .with_ansi(false)
        .with_max_level(tracing::Level::DEBUG)
        .with_writer(move || sink.clone())
        .finish()
}
