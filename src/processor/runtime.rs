//! One batch, start to finish: read the contract, the document and the manifest; with
//! state, take the lock, roll pending journals forward, replay this batch's journal if it
//! has one (no processor call), otherwise run the processor, journal its emits and staged
//! state, apply the state, print the emits. Failpoints `processor.after_journal`,
//! `processor.after_apply` and `processor.after_emits` let tests SIGKILL each step.
//!
//! Exit codes are the caller's (`cli::processor`): 0 when this returns Ok, 65 for
//! Permanent, 78 for Config, 75 for Retryable, 70 for Bug.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};

use super::builtin::Builtin;
use super::context::{Context, Parts, RuntimeState};
use super::contract::{Batch, Contract};
use super::http::{Endpoints, Http};
use super::journal::{self, Journal};
use super::manifest::{self, Kind, ProcessorManifest};
use super::state::StateDir;
use super::{Failure, Item, ProcessorError, emit, exec};
use crate::clock::{Clock, SystemClock};
use crate::failpoint;

/// A processor's Permanent: the dispatcher dead-letters the batch at once (spec 6.6).
pub const EXIT_PERMANENT: i32 = crate::destinations::script::EXIT_PERMANENT;
/// A processor's Retryable (EX_TEMPFAIL): the dispatcher retries the batch, uncounted, as
/// the transport class (see `destinations::script::EXIT_PROCESSOR_RETRY`).
pub const EXIT_RETRY: i32 = crate::destinations::script::EXIT_PROCESSOR_RETRY;
/// A processor's Config (EX_CONFIG): the dispatcher's config class (see `error`).
pub const EXIT_PROCESSOR_CONFIG: i32 = crate::destinations::script::EXIT_PROCESSOR_CONFIG;
/// A processor's Bug (EX_SOFTWARE): any exit the dispatcher does not name is the batch
/// class, counted, so a bug that fails one batch every time takes it dead at max_attempts
/// instead of retrying it forever as a provider outage would be.
pub const EXIT_BUG: i32 = 70;
/// An exec child's deadline is the manifest's timeout less this, at least one second.
const EXEC_TIMEOUT_MARGIN_S: f64 = 5.0;

/// The exit code of a failed run: 65 Permanent, 78 Config, 75 Retryable, 70 Bug (0 is Ok).
pub fn exit_code(e: &ProcessorError) -> i32 {
    match e.failure {
        Failure::Permanent => EXIT_PERMANENT,
        Failure::Config => EXIT_PROCESSOR_CONFIG,
        Failure::Retryable => EXIT_RETRY,
        Failure::Bug => EXIT_BUG,
    }
}

/// What a finished run did, beyond the emits it printed (the kit's processor row reads it).
#[derive(Debug, Default)]
pub struct Report {
    /// Event type -> items dropped because the manifest does not declare it as an output.
    pub undeclared: BTreeMap<String, usize>,
    /// The batch's journal was replayed: the processor was not called.
    pub replayed: bool,
}

/// Runs `hookspool processor <instance>` on the document `stdin`, printing emit lines to
/// `out`.
pub fn run(instance: &str, stdin: &[u8], out: &mut dyn Write) -> Result<(), ProcessorError> {
    let contract = Contract::from_env()?;
    run_contract(instance, &contract, stdin, Endpoints::from_env()?, out).map(|_| ())
}

/// [`run`] with the contract and the provider endpoints given: the kit runs a bobbin's
/// processor in process against its stub answers this way, through the same steps.
pub fn run_contract(
    instance: &str,
    contract: &Contract,
    stdin: &[u8],
    endpoints: Endpoints,
    out: &mut dyn Write,
) -> Result<Report, ProcessorError> {
    if contract.instance != instance {
        return Err(ProcessorError::permanent(
            "the instance argument does not match HOOKSPOOL_BOBBIN_INSTANCE",
        ));
    }
    let batch = Batch::parse(stdin)?;
    if batch.id != contract.batch_id {
        return Err(ProcessorError::permanent(
            "the document's batch_id does not match HOOKSPOOL_BATCH_ID",
        ));
    }
    let manifest = manifest::read(&contract.bobbin_dir)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|_| ProcessorError::retryable("the async runtime cannot start"))?;
    let parts = Run {
        c: contract,
        batch: &batch,
        m: &manifest,
        http: Http::new(endpoints)?,
        clock: Arc::new(SystemClock),
    };
    rt.block_on(run_batch(&parts, out))
}

/// One batch for the poll kit (spec 14.4 "Tooling"): the same steps as [`run`] with a given
/// contract, HTTP client (the kit's stub) and clock, on the caller's runtime.
pub async fn run_for_kit(
    contract: &Contract,
    stdin: &[u8],
    http: &Http,
    clock: Arc<dyn Clock>,
    out: &mut dyn Write,
) -> Result<Report, ProcessorError> {
    let batch = Batch::parse(stdin)?;
    let manifest = manifest::read(&contract.bobbin_dir)?;
    let parts = Run {
        c: contract,
        batch: &batch,
        m: &manifest,
        http: http.clone(),
        clock,
    };
    run_batch(&parts, out).await
}

/// One run's inputs.
struct Run<'a> {
    c: &'a Contract,
    batch: &'a Batch,
    m: &'a ProcessorManifest,
    http: Http,
    clock: Arc<dyn Clock>,
}

fn log(c: &Contract, line: &str) {
    tracing::info!(batch = c.batch_id, source = %c.instance, "{line}");
}

async fn run_batch(r: &Run<'_>, out: &mut dyn Write) -> Result<Report, ProcessorError> {
    let (c, batch, m) = (r.c, r.batch, r.m);
    let clock = r.clock.clone();
    let mut report = Report::default();
    if !m.state {
        // No state, no journal (spec 14.3.4): a retry calls the processor again, and the
        // stable dedup ids are the only duplicate guard.
        let (items, writes) = invoke(r, Map::new(), None, clock).await?;
        if !writes.is_empty() {
            log(
                c,
                "state writes ignored: the bobbin's manifest has state = false",
            );
        }
        let built = build(c, m, batch, &items, &mut report)?;
        print(out, &built)?;
        return Ok(report);
    }
    let dir = c.state_dir.as_deref().ok_or_else(|| {
        ProcessorError::permanent("the bobbin keeps state but HOOKSPOOL_STATE_DIR is not set")
    })?;
    let mut st = StateDir::open(dir)?;
    roll_forward(&mut st, c)?;
    if let Some(j) = journal::find(dir, batch.id)? {
        log(
            c,
            &format!(
                "replaying the batch's journal: {} emit(s), no provider call",
                j.emits.len()
            ),
        );
        print(out, &j.emits)?;
        report.replayed = true;
        return Ok(report);
    }
    let now = clock.now();
    let (items, writes) = invoke(r, st.values().clone(), Some(dir), clock).await?;
    let emits = build(c, m, batch, &items, &mut report)?;
    let j = Journal {
        batch_id: batch.id,
        seq: st.applied_seq() + 1,
        created_at: now,
        emits,
        writes,
    };
    journal::write(dir, &j)?;
    failpoint::hit("processor.after_journal");
    st.apply(j.seq, &j.writes)?;
    failpoint::hit("processor.after_apply");
    print(out, &j.emits)?;
    failpoint::hit("processor.after_emits");
    // Housekeeping, not durability: a journal that cannot be pruned now is pruned by a
    // later run, and failing a batch whose emits are already printed would only replay it.
    match journal::prune(dir, st.applied_seq(), now) {
        Ok(0) => {}
        Ok(n) => log(c, &format!("pruned {n} old journal(s)")),
        Err(e) => {
            tracing::warn!(batch = c.batch_id, source = %c.instance, reason = %e.reason, "journal prune failed")
        }
    }
    Ok(report)
}

/// Applies every journal written but not applied (a run killed between its journal and its
/// apply), oldest first, so no batch ever reads state older than a journal that exists.
fn roll_forward(st: &mut StateDir, c: &Contract) -> Result<(), ProcessorError> {
    for j in journal::pending(st.dir(), st.applied_seq())? {
        st.apply(j.seq, &j.writes)?;
        log(
            c,
            &format!("applied the pending journal of batch {}", j.batch_id),
        );
    }
    Ok(())
}

/// Items to emits; the unmapped ones dropped with one log line per batch (and a second one
/// naming the event types the manifest does not even declare: a processor bug).
fn build(
    c: &Contract,
    m: &ProcessorManifest,
    batch: &Batch,
    items: &[Item],
    report: &mut Report,
) -> Result<Vec<Value>, ProcessorError> {
    let built = emit::build(&c.instance, batch.id, &batch.key, &c.routes, items)?;
    let (declared, undeclared): (BTreeMap<_, _>, BTreeMap<_, _>) = built
        .dropped
        .into_iter()
        .partition(|(t, _)| m.outputs.contains(t));
    if !declared.is_empty() {
        log(
            c,
            &format!(
                "dropped item(s) of event types the instance does not map: {}",
                emit::describe(&declared)
            ),
        );
    }
    if !undeclared.is_empty() {
        tracing::warn!(
            batch = c.batch_id,
            source = %c.instance,
            "dropped item(s) of event types the manifest does not declare as outputs: {}",
            emit::describe(&undeclared)
        );
    }
    report.undeclared = undeclared;
    Ok(built.emits)
}

fn print(out: &mut dyn Write, emits: &[Value]) -> Result<(), ProcessorError> {
    let text: String = emits.iter().map(emit::line).collect();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|_| ProcessorError::retryable("stdout closed before the emits were written"))
}

/// Runs the processor (or poller): items and staged writes.
async fn invoke(
    r: &Run<'_>,
    state: Map<String, Value>,
    dir: Option<&Path>,
    clock: Arc<dyn Clock>,
) -> Result<(Vec<Item>, Map<String, Value>), ProcessorError> {
    let timeout = Duration::from_secs_f64((r.m.timeout_s - EXEC_TIMEOUT_MARGIN_S).max(1.0));
    match &r.m.kind {
        Kind::Builtin(b) => builtin(*b, r, state, dir, clock).await,
        Kind::Exec(program) if r.m.poll => {
            exec_poll(program, r.c, r.batch, &state, timeout, &r.http).await
        }
        Kind::Exec(program) => {
            let a = exec::run(program, r.c, r.batch, &state, timeout)?;
            if a.get.is_some() {
                return Err(ProcessorError::bug(
                    "exec processor asked for a GET; only a [poll] exec poller may",
                ));
            }
            Ok((a.items, a.writes))
        }
    }
}
/// The most GETs one exec poller run may ask the runtime for.
pub const EXEC_POLL_REQUESTS_MAX: usize = 16;

/// An exec poller (see `exec`): run it; while it asks for a GET, make it through
/// `ctx.http`'s `get_text` and run it again with every answer so far. Its time limit
/// covers all rounds.
async fn exec_poll(
    program: &Path,
    c: &Contract,
    batch: &Batch,
    state: &Map<String, Value>,
    timeout: Duration,
    http: &Http,
) -> Result<(Vec<Item>, Map<String, Value>), ProcessorError> {
    let deadline = std::time::Instant::now() + timeout;
    let mut answers: Vec<Value> = Vec::new();
    loop {
        let left = deadline
            .checked_duration_since(std::time::Instant::now())
            .ok_or_else(|| ProcessorError::retryable("exec poller timed out"))?;
        let a = exec::run_with(program, c, batch, state, left, Some(&answers))?;
        let Some(get) = a.get else {
            return Ok((a.items, a.writes));
        };
        if answers.len() >= EXEC_POLL_REQUESTS_MAX {
            return Err(ProcessorError::permanent(format!(
                "exec poller asked for more than {EXEC_POLL_REQUESTS_MAX} requests"
            )));
        }
        answers.push(exec_get(&get, http).await?);
    }
}

/// One GET an exec poller asked for, as the `http` entry it gets back.
async fn exec_get(get: &Value, http: &Http) -> Result<Value, ProcessorError> {
    let bad = |what: &'static str| ProcessorError::bug(format!("exec poller's get: {what}"));
    let url = get
        .get("url")
        .and_then(Value::as_str)
        .ok_or(bad("url is not a string"))?;
    if !url.starts_with("https://") {
        return Err(bad("url is not https"));
    }
    let pairs: Vec<(String, String)> = match get.get("headers") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Object(h)) => h
            .iter()
            .map(|(k, v)| {
                v.as_str()
                    .map(|v| (k.clone(), v.to_string()))
                    .ok_or(bad("a header value is not a string"))
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(bad("headers is not an object")),
    };
    let headers: Vec<(&str, &str)> = pairs
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let a = http
        .get_text(
            url,
            &super::http::TextRequest {
                headers: &headers,
                ..Default::default()
            },
        )
        .await
        .map_err(super::http::HttpError::into_error)?;
    Ok(serde_json::json!({"status": a.status, "text": a.text, "headers": a.headers}))
}

async fn builtin(
    b: Builtin,
    r: &Run<'_>,
    state: Map<String, Value>,
    dir: Option<&Path>,
    clock: Arc<dyn Clock>,
) -> Result<(Vec<Item>, Map<String, Value>), ProcessorError> {
    let (c, batch) = (r.c, r.batch);
    let mut ctx = Context::new(Parts {
        instance: c.instance.clone(),
        batch_id: c.batch_id,
        bobbin_dir: c.bobbin_dir.clone(),
        settings: c.settings.clone(),
        secret_refs: c.secret_refs.clone(),
        state,
        runtime: RuntimeState::load(dir)?,
        http: r.http.clone(),
        clock,
    });
    let items = b.process(batch, &mut ctx).await?;
    Ok((items, ctx.into_writes()))
}
