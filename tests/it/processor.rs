//! The processor runtime through the real binary, `hookspool processor <instance>`, run
//! exactly as the script destination runs it: the env contract of spec 14.3.3 and the batch
//! document on stdin. SIGKILL at each failpoint (after the journal write, after the state
//! apply, after printing the emits), then the retry of the same batch: the same items once,
//! no second processor call, the state where one clean run leaves it. Exec processors in sh
//! and python3; a stateless bobbin; exit codes 65 and 75; nothing but emits on stdout.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::{Value, json};

use super::{bin, killed};

/// One bobbin instance with its directories and the env contract it gets.
pub struct Instance {
    pub tmp: tempfile::TempDir,
    pub bobbin_dir: PathBuf,
    pub state_dir: PathBuf,
    pub name: String,
    pub bobbin: String,
    pub settings: Value,
    pub routes: Value,
    pub secret_refs: Value,
    pub env: Vec<(String, String)>,
}

impl Instance {
    /// An instance of a bobbin whose directory is `bobbin_dir` (a repo bobbin, or one the
    /// test writes under `tmp`).
    pub fn new(name: &str, bobbin: &str, bobbin_dir: Option<&Path>) -> Instance {
        let tmp = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(tmp.path()).unwrap();
        let bobbin_dir = bobbin_dir.map_or_else(|| root.join("bobbin"), Path::to_path_buf);
        std::fs::create_dir_all(&bobbin_dir).unwrap();
        Instance {
            state_dir: root.join("state"),
            tmp,
            bobbin_dir,
            name: name.into(),
            bobbin: bobbin.into(),
            settings: json!({}),
            routes: json!({}),
            secret_refs: json!({}),
            env: Vec::new(),
        }
    }

    pub fn root(&self) -> PathBuf {
        std::fs::canonicalize(self.tmp.path()).unwrap()
    }

    pub fn write_bobbin_file(&self, name: &str, text: &str, mode: u32) {
        let p = self.bobbin_dir.join(name);
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    /// A file secret under the instance's directory; returns its reference.
    pub fn secret_file(&mut self, name: &str, value: &str) -> PathBuf {
        let p = self.root().join(format!("secret-{name}"));
        std::fs::write(&p, value).unwrap();
        self.secret_refs[name] = json!({ "file": p });
        p
    }

    /// Runs the processor on one batch; `failpoint` arms a SIGKILL.
    pub fn run(
        &self,
        batch_id: i64,
        key: &str,
        events: &[Value],
        failpoint: Option<&str>,
    ) -> Output {
        let doc = document(&self.name, batch_id, key, events);
        let mut cmd = Command::new(bin());
        cmd.args(["processor", &self.name])
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", self.root())
            .env("HOOKSPOOL_BOBBIN", &self.bobbin)
            .env("HOOKSPOOL_BOBBIN_INSTANCE", &self.name)
            .env("HOOKSPOOL_BOBBIN_DIR", &self.bobbin_dir)
            .env("HOOKSPOOL_SETTINGS", self.settings.to_string())
            .env("HOOKSPOOL_DELTA_ROUTES", self.routes.to_string())
            .env("HOOKSPOOL_SECRET_REFS", self.secret_refs.to_string())
            .env("HOOKSPOOL_BATCH_ID", batch_id.to_string())
            .env("HOOKSPOOL_DELIVERY_ID", format!("hs_test_{batch_id}"))
            .env("HOOKSPOOL_STATE_DIR", &self.state_dir)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(f) = failpoint {
            cmd.env("HOOKSPOOL_FAILPOINT", f);
        }
        let mut child = cmd.spawn().expect("spawn hookspool processor");
        {
            use std::io::Write;
            let mut stdin = child.stdin.take().unwrap();
            stdin.write_all(&serde_json::to_vec(&doc).unwrap()).unwrap();
        }
        child.wait_with_output().unwrap()
    }

    /// The applied state values (state.json), or null before any.
    pub fn state(&self) -> Value {
        std::fs::read(self.state_dir.join("state.json"))
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .map_or(Value::Null, |v| v["values"].clone())
    }
}

/// The batch document as the dispatcher renders it (spec 6.4).
pub fn document(source: &str, batch_id: i64, key: &str, events: &[Value]) -> Value {
    json!({
        "source": source,
        "route": source,
        "key": key,
        "batch_id": batch_id,
        "delivery_id": format!("hs_test_{batch_id}"),
        "attempt": 1,
        "count": events.len(),
        "first_at": 1.0,
        "last_at": 2.0,
        "event_type": "push",
        "event_types": {"push": events.len()},
        "summary": "test",
        "content_hash": "sha256:test",
        "events": events,
        "event_meta": (0..events.len())
            .map(|i| json!({"id": i + 1, "event_type": "push", "received_at": 1.0, "dedup_id": null}))
            .collect::<Vec<_>>(),
    })
}

/// The emits of a run, asserting that every stdout line is an emit the script destination
/// accepts (nothing else ever reaches stdout).
pub fn emits(out: &Output) -> Vec<Value> {
    for line in out.stdout.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        assert!(
            line.starts_with(b"{\"enqueue\":"),
            "a stdout line that is not an emit: {}",
            String::from_utf8_lossy(line)
        );
    }
    hookspool::destinations::script::parse_emits(&out.stdout).expect("valid emits")
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

pub fn code(out: &Output) -> Option<i32> {
    out.status.code()
}

/// An sh exec processor that counts its calls in `calls.log` (in the bobbin directory, its
/// working directory) and answers differently on every call, so a retry that called it again
/// would show: call n returns items n-a, n-b and n-c (c of an event type the instance does
/// not map) and saves cursor = n. It also prints to stderr, which must not reach stdout.
const COUNTING_SH: &str = r#"#!/bin/sh
cat > /dev/null
echo call >> calls.log
n=$(wc -l < calls.log | tr -d ' ')
echo "counting processor: call $n" >&2
printf '{"items":[{"event_type":"changed","n":"%s-a"},{"event_type":"changed","n":"%s-b","key":"k2"},{"event_type":"unmapped","n":"%s-c"}],"state":{"cursor":%s}}' "$n" "$n" "$n" "$n"
"#;

fn counting_instance(state: bool) -> Instance {
    let mut i = Instance::new("things", "acme.things", None);
    i.write_bobbin_file(
        "bobbin.toml",
        &format!(
            r#"name = "acme.things"
version = "1"
summary = "Acme things: a made-up service for the processor runtime's tests"

[provider]
vendor = "Acme"
product = "Things"
homepage = "https://www.acme-widgets.com/"
webhook_docs = "https://developer.acme-widgets.com/webhooks"
signature_docs = "https://developer.acme-widgets.com/webhooks/signatures"

[source]
template = {{ scheme = "hmac-sha256-hex", header = "X-Thing-Signature", key = "payload.id" }}

[secrets.secret]
description = "the signing secret"

[processor]
exec = "processor.sh"
state = {state}
timeout_s = 30

[outputs.changed]
description = "x"

[outputs.unmapped]
description = "y"
"#
        ),
        0o644,
    );
    i.write_bobbin_file("processor.sh", COUNTING_SH, 0o755);
    i.routes = json!({"changed": "hermes:things"});
    i
}

fn calls(i: &Instance) -> usize {
    std::fs::read_to_string(i.bobbin_dir.join("calls.log"))
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

#[test]
fn processor_clean_run_emits_mapped_items_journals_and_replays() {
    let i = counting_instance(true);
    let out = i.run(7, "batch-key", &[json!({"x": 1})], None);
    assert_eq!(code(&out), Some(0), "{}", stderr(&out));
    let e = emits(&out);
    assert_eq!(e.len(), 2, "the unmapped item is dropped");
    assert_eq!(e[0]["source"], "things");
    assert_eq!(e[0]["destination"], "hermes:things");
    assert_eq!(e[0]["event_type"], "changed");
    assert_eq!(
        e[0]["key"], "batch-key",
        "the batch key without an item key"
    );
    assert_eq!(e[1]["key"], "k2", "the item's own key");
    assert_eq!(e[0]["dedup_id"], "things:7:0");
    assert_eq!(e[1]["dedup_id"], "things:7:1");
    assert_eq!(e[0]["payload"]["n"], "1-a");
    let err = stderr(&out);
    assert_eq!(
        err.matches("dropped item(s) of event types the instance does not map: unmapped x1")
            .count(),
        1,
        "one log line per batch: {err}"
    );
    assert!(
        err.contains("counting processor: call 1"),
        "the child's stderr is passed on"
    );
    assert_eq!(i.state(), json!({"cursor": 1}));
    // The same batch again: the journal is replayed, the processor is not called.
    let again = i.run(7, "batch-key", &[json!({"x": 1})], None);
    assert_eq!(code(&again), Some(0));
    assert_eq!(emits(&again), e);
    assert_eq!(calls(&i), 1);
    assert!(stderr(&again).contains("replaying the batch's journal"));
    // The next batch reads the advanced state and gets the next call.
    let next = i.run(8, "batch-key", &[json!({"x": 2})], None);
    assert_eq!(emits(&next)[0]["payload"]["n"], "2-a");
    assert_eq!(i.state(), json!({"cursor": 2}));
}

fn killed_then_retried(failpoint: &str) {
    let clean = counting_instance(true);
    let clean_out = clean.run(11, "k", &[json!({})], None);
    let clean_emits = emits(&clean_out);

    let i = counting_instance(true);
    let out = i.run(11, "k", &[json!({})], Some(failpoint));
    assert!(killed(&out.status), "{failpoint}: {}", stderr(&out));
    assert!(stderr(&out).contains(&format!("FAILPOINT {failpoint}")));
    let retry = i.run(11, "k", &[json!({})], None);
    assert_eq!(code(&retry), Some(0), "{failpoint}: {}", stderr(&retry));
    assert_eq!(
        emits(&retry),
        clean_emits,
        "{failpoint}: the same items, once"
    );
    assert_eq!(
        calls(&i),
        1,
        "{failpoint}: the retry did not call the processor"
    );
    assert_eq!(
        i.state(),
        clean.state(),
        "{failpoint}: the state of one clean run"
    );
    // And a later batch continues from there, exactly as after the clean run.
    let next = i.run(12, "k", &[json!({})], None);
    let clean_next = clean.run(12, "k", &[json!({})], None);
    assert_eq!(emits(&next), emits(&clean_next));
    assert_eq!(i.state(), clean.state());
}

#[test]
fn processor_sigkill_after_the_journal_write_replays_on_retry() {
    killed_then_retried("processor.after_journal");
}

#[test]
fn processor_sigkill_after_the_state_apply_replays_on_retry() {
    killed_then_retried("processor.after_apply");
}

#[test]
fn processor_sigkill_after_printing_the_emits_replays_on_retry() {
    killed_then_retried("processor.after_emits");
}

#[test]
fn processor_journal_not_yet_applied_is_rolled_forward_before_the_next_batch() {
    // Batch 21 is killed after its journal; batch 22 (another group) runs before 21's retry:
    // it must see 21's state, and 21's retry must not move the state back.
    let i = counting_instance(true);
    assert!(killed(
        &i.run(21, "k", &[json!({})], Some("processor.after_journal"))
            .status
    ));
    assert_eq!(i.state(), Value::Null, "not applied yet");
    let b22 = i.run(22, "other", &[json!({})], None);
    assert_eq!(code(&b22), Some(0));
    assert_eq!(emits(&b22)[0]["payload"]["n"], "2-a");
    assert_eq!(i.state(), json!({"cursor": 2}));
    let b21 = i.run(21, "k", &[json!({})], None);
    assert_eq!(emits(&b21)[0]["payload"]["n"], "1-a");
    assert_eq!(i.state(), json!({"cursor": 2}), "state never moves back");
    assert_eq!(calls(&i), 2);
}

#[test]
fn processor_without_state_has_no_journal_and_calls_again() {
    let i = counting_instance(false);
    let a = i.run(5, "k", &[json!({})], None);
    assert_eq!(code(&a), Some(0), "{}", stderr(&a));
    let b = i.run(5, "k", &[json!({})], None);
    assert_eq!(calls(&i), 2, "no journal: the retry calls the processor");
    let (ea, eb) = (emits(&a), emits(&b));
    assert_eq!(
        ea[0]["dedup_id"], eb[0]["dedup_id"],
        "the stable dedup id guards it"
    );
    assert!(!i.state_dir.exists(), "no state directory is touched");
    assert!(stderr(&a).contains("state writes ignored"));
}

#[test]
fn processor_exec_exit_codes_map_to_65_78_75_and_70_with_a_fixed_reason() {
    for (script, want, reason) in [
        (
            "#!/bin/sh\ncat >/dev/null\necho SENTINEL-child-detail >&2\nexit 65\n",
            65,
            "exec processor failed permanently",
        ),
        (
            "#!/bin/sh\ncat >/dev/null\nexit 78\n",
            78,
            "exec processor needs the operator",
        ),
        (
            "#!/bin/sh\ncat >/dev/null\nexit 75\n",
            75,
            "exec processor exit 75",
        ),
        (
            "#!/bin/sh\ncat >/dev/null\nexit 3\n",
            75,
            "exec processor exit 3",
        ),
        // An answer that is not the contract's is the processor's bug: 70, the batch class
        // (counted), not a provider outage retried forever.
        (
            "#!/bin/sh\ncat >/dev/null\necho hello from the processor\n",
            70,
            "exec processor answer",
        ),
        (
            "#!/bin/sh\ncat >/dev/null\nkill -9 $$\n",
            75,
            "killed by signal 9",
        ),
    ] {
        let mut i = counting_instance(true);
        i.write_bobbin_file("processor.sh", script, 0o755);
        i.routes = json!({"changed": "hermes:x"});
        let out = i.run(3, "k", &[json!({})], None);
        assert_eq!(code(&out), Some(want), "{script}: {}", stderr(&out));
        assert!(
            out.stdout.is_empty(),
            "nothing but emits on stdout: {script}"
        );
        let err = stderr(&out);
        assert!(
            err.contains("hookspool: processor") && err.contains(reason),
            "{err}"
        );
        assert!(
            !i.state_dir.join("journal").exists()
                || std::fs::read_dir(i.state_dir.join("journal"))
                    .unwrap()
                    .count()
                    == 0
        );
    }
    // A missing executable is the bobbin's to fix.
    let i = counting_instance(true);
    std::fs::remove_file(i.bobbin_dir.join("processor.sh")).unwrap();
    let out = i.run(3, "k", &[json!({})], None);
    assert_eq!(code(&out), Some(65), "{}", stderr(&out));
    assert!(stderr(&out).contains("cannot be started"));
}

#[test]
fn processor_refuses_a_broken_contract_with_65_naming_the_variable() {
    let mut i = counting_instance(true);
    i.env
        .push(("HOOKSPOOL_DELTA_ROUTES".into(), "SENTINEL-{not json".into()));
    let out = i.run(3, "k", &[json!({})], None);
    assert_eq!(code(&out), Some(65));
    let err = stderr(&out);
    assert!(
        err.contains("HOOKSPOOL_DELTA_ROUTES") && !err.contains("SENTINEL"),
        "{err}"
    );
    // The instance argument and the contract must agree.
    let mut i2 = counting_instance(true);
    i2.env
        .push(("HOOKSPOOL_BOBBIN_INSTANCE".into(), "someone-else".into()));
    let out = i2.run(3, "k", &[json!({})], None);
    assert_eq!(code(&out), Some(65));
    assert!(stderr(&out).contains("does not match"));
    assert_eq!(calls(&i2), 0, "refused before the processor runs");
}

/// A python3 exec processor: reads settings, state and the batch from stdin, emits an item
/// per event beyond its cursor and saves the cursor.
const PYTHON: &str = r#"#!/usr/bin/env python3
import json, sys
doc = json.load(sys.stdin)
print("python processor: %d event(s)" % len(doc["batch"]["events"]), file=sys.stderr)
cursor = doc["state"].get("cursor", 0)
step = doc["settings"]["step"]
items = []
for ev in doc["batch"]["events"]:
    if ev["n"] > cursor:
        items.append({"event_type": "changed", "n": ev["n"] * step, "instance": doc["instance"]})
        cursor = max(cursor, ev["n"])
json.dump({"items": items, "state": {"cursor": cursor, "seen_batch": doc["batch"]["batch_id"]}}, sys.stdout)
"#;

#[test]
fn processor_python3_exec_gets_batch_settings_and_state_and_returns_items_and_writes() {
    let has_python = Command::new("python3")
        .arg("-c")
        .arg("pass")
        .status()
        .is_ok_and(|s| s.success());
    if !has_python {
        super::skip::skip_or_fail("python3 is not installed");
        return;
    }
    let mut i = counting_instance(true);
    i.write_bobbin_file("processor.sh", PYTHON, 0o755);
    i.settings = json!({"step": 10});
    let out = i.run(30, "k", &[json!({"n": 1}), json!({"n": 2})], None);
    assert_eq!(code(&out), Some(0), "{}", stderr(&out));
    let e = emits(&out);
    let ns: Vec<&Value> = e.iter().map(|x| &x["payload"]["n"]).collect();
    assert_eq!(ns, [&json!(10), &json!(20)]);
    assert_eq!(e[0]["payload"]["instance"], "things");
    assert_eq!(i.state(), json!({"cursor": 2, "seen_batch": 30}));
    let out = i.run(31, "k", &[json!({"n": 2}), json!({"n": 3})], None);
    let e = emits(&out);
    assert_eq!(e.len(), 1, "the cursor came from state");
    assert_eq!(e[0]["payload"]["n"], 30);
}
