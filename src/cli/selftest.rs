//! `hookspool check --sandbox-selftest`: prove on this host, as this user and under this
//! unit's hardening, that a script destination's sandbox holds. Each probe is a small shell
//! script run exactly as a script destination runs (same policy: the spool home denied, its
//! state_dir writable, a private tmp) that exits 0 when the restriction held. It prints one
//! PASS/FAIL line per probe and a final count, and fails (exit 1) if any probe failed.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;

use super::{Ctx, EXIT_NOT_FOUND, Exit};
use crate::destinations::script::{SandboxConfig, ScriptConfig, ScriptDelivery, ScriptDestination};
use crate::destinations::{Klass, OutcomeKind};

/// Each probe's time limit.
const PROBE_TIMEOUT_S: f64 = 10.0;

struct Probe {
    name: &'static str,
    script: String,
    network: bool,
    timeout_s: f64,
    /// The probe passes when the run times out (the deadline probe) instead of exiting 0.
    expect_timeout: bool,
}

fn probe(name: &'static str, script: &str) -> Probe {
    Probe {
        name,
        script: script.to_string(),
        network: true,
        timeout_s: PROBE_TIMEOUT_S,
        expect_timeout: false,
    }
}

fn probes(home: &Path, db: &Path, port: u16) -> Vec<Probe> {
    let h = home.display();
    let d = db.display();
    vec![
        probe("state_dir is writable", "echo ok > \"$HOOKSPOOL_STATE_DIR/probe\""),
        probe("private tmp is writable", "echo ok > \"$TMPDIR/probe\""),
        probe("writing the spool home fails", &format!("! echo x > '{h}/selftest-intruder' 2>/dev/null")),
        probe("reading the database fails", &format!("! cat '{d}' > /dev/null 2>&1")),
        probe("listing the spool home fails", &format!("! ls '{h}' > /dev/null 2>&1")),
        probe(
            "only PATH, HOME, LANG, TMPDIR and HOOKSPOOL_* are in the environment",
            "for v in $(env | cut -d= -f1); do case \"$v\" in PATH|HOME|LANG|TMPDIR|PWD|OLDPWD|SHLVL|_|HOOKSPOOL_*) ;; *) echo \"$v\" >&2; exit 1;; esac; done",
        ),
        probe("changing file ownership fails", "echo x > \"$TMPDIR/own\" && ! chown 12345:12345 \"$TMPDIR/own\" 2>/dev/null"),
        probe("mount fails", "mkdir -p \"$TMPDIR/m\" && ! mount -t tmpfs none \"$TMPDIR/m\" 2>/dev/null"),
        probe(
            "ptrace is refused",
            "if [ -x /usr/bin/strace ]; then sleep 30 & p=$!; ! /usr/bin/strace -p $p -e trace=none -o /dev/null 2>/dev/null & s=$!; sleep 1; kill $p 2>/dev/null; wait $s; else python3 -c 'import ctypes,sys; l=ctypes.CDLL(None,use_errno=True); sys.exit(0 if l.ptrace(16, 1, 0, 0) != 0 else 1)'; fi",
        ),
        Probe {
            name: "network = false cannot reach 127.0.0.1",
            script: format!(
                "if command -v python3 >/dev/null; then ! python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), 2)' 2>/dev/null; else ! (exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null; fi"
            ),
            network: false,
            timeout_s: PROBE_TIMEOUT_S,
            expect_timeout: false,
        },
        Probe {
            name: "the deadline kills the whole process group",
            script: "trap '' TERM; (trap '' TERM; sleep 300) & echo $! > \"$HOOKSPOOL_STATE_DIR/grandchild\"; sleep 300".into(),
            network: true,
            timeout_s: 2.0,
            expect_timeout: true,
        },
    ]
}

/// Whether a process exists and is not a zombie (an orphan killed with its group may wait a
/// moment for its new parent to reap it).
fn alive(pid: &str) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .and_then(|rest| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

pub fn run(ctx: &Ctx) -> Result<(), Exit> {
    let c = ctx.config()?;
    // The database must exist for "reading the database fails" to mean anything.
    drop(ctx.store_creating(&c)?);
    let home = std::fs::canonicalize(&c.home)?;
    let state = home.join("sandbox-selftest");
    let _ = std::fs::remove_dir_all(&state);
    std::fs::create_dir_all(&state)?;
    // A listener the network probe must not reach.
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    let rt = super::service::runtime(None)?;
    let mut results = Vec::new();
    for p in probes(&home, &c.db, port) {
        // The typed spec a script destination's table parses into (`config::destination`).
        let cfg = ScriptConfig {
            argv: vec!["/bin/sh".into(), "-c".into(), p.script.clone()],
            processor: None,
            cwd: None,
            env_file: None,
            env: Default::default(),
            timeout_s: p.timeout_s,
            state_dir: Some(state.clone()),
            sandbox: SandboxConfig {
                network: p.network,
                ..SandboxConfig::default()
            },
        };
        let dest = ScriptDestination::new("script:selftest", cfg);
        let started = Instant::now();
        let outcome = rt.block_on(dest.deliver(&ScriptDelivery {
            batch_id: 0,
            delivery_id: "selftest".into(),
            body: b"{}".to_vec(),
            deadline: Instant::now() + Duration::from_secs_f64(p.timeout_s + 5.0),
            spool_home: home.clone(),
        }));
        let mut pass = if p.expect_timeout {
            outcome.kind == OutcomeKind::Retry
                && outcome.klass == Some(Klass::Transport)
                && outcome.timed_out
        } else {
            outcome.kind == OutcomeKind::Ok
        };
        if p.expect_timeout && pass {
            // The grandchild that ignored SIGTERM must be gone too.
            std::thread::sleep(Duration::from_millis(300));
            let pid = std::fs::read_to_string(state.join("grandchild")).unwrap_or_default();
            let pid = pid.trim();
            pass = !pid.is_empty() && !alive(pid);
        }
        results.push((p.name, pass, outcome.reason.clone(), started.elapsed()));
    }
    drop(listener);
    let _ = std::fs::remove_dir_all(&state);
    let passed = results.iter().filter(|r| r.1).count();
    let failed = results.len() - passed;
    if ctx.json {
        ctx.print_json(&json!({
            "passed": passed,
            "failed": failed,
            "probes": results.iter().map(|(n, ok, reason, _)| json!({"probe": n, "pass": ok, "outcome": reason})).collect::<Vec<_>>(),
        }));
    } else {
        for (name, ok, reason, took) in &results {
            let verdict = if *ok { "PASS" } else { "FAIL" };
            ctx.say(format!(
                "{verdict} {name} ({reason}, {} ms)",
                took.as_millis()
            ));
        }
        ctx.say(format!("{passed} passed, {failed} failed"));
    }
    if failed > 0 {
        return Err(Exit::new(
            EXIT_NOT_FOUND,
            format!("{failed} sandbox probe(s) failed"),
        ));
    }
    Ok(())
}
