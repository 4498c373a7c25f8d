//! The integration-test binary: real SQLite files, the real `hookspool` binary, real
//! processes killed with SIGKILL. Helpers live here; each area has its own module.

mod admin;
mod admin_browser;
mod admin_live;
mod admin_openapi;
mod admin_reads;
mod admin_run;
mod admin_socket;
mod bobbin_captures;
mod bobbins;
mod bobbins_code;
mod bobbins_run;
mod check_bobbins;
mod child;
mod cli;
mod cli_truth;
mod concurrency;
mod crash;
mod crash_dispatch;
mod daemon;
mod dispatch;
mod dispatch_bin;
mod egress;
mod fulldisk;
mod handshakes;
mod hostile;
mod intake;
mod intake_oidc;
mod intake_proc;
mod multihost;
mod observe;
mod ops;
mod ops_truth;
mod packaging;
mod pg_copy;
mod pg_failover;
mod pg_harness;
mod pg_run;
mod pg_spool;
mod pg_tls;
mod polls;
mod polls_feed;
mod powerloss;
mod processor;
mod processor_google;
mod processor_kit;
mod processor_run;
mod processor_stub;
mod receiver;
mod recipe_bobbin;
mod routing;
mod run_e2e;
mod run_halves;
mod sandbox_userns;
mod sentinel;
mod source_kit;
mod source_test_plaid;
mod standard_webhooks;
mod traces;
mod vectors_sdk;
mod wiring;

/// The one skip rule (tests/support/skip.rs), shared by every module here.
#[path = "../support/skip.rs"]
pub mod skip;

/// The throwaway PostgreSQL cluster (tests/support/pg.rs).
#[path = "../support/pg.rs"]
pub mod pg;

/// Hosts in network namespaces (tests/support/netns.rs).
#[path = "../support/netns.rs"]
pub mod netns;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use hookspool::store::{Copy, EnqueueRequest, Role, Store, Window};

/// The built binary under test.
pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_hookspool"))
}

/// The spool a test of the real binary runs on: the home's SQLite file, or a database of a
/// throwaway PostgreSQL cluster (kept alive by this value) named by a URL file the config
/// points at.
pub struct TestSpool {
    /// What the config needs for this spool (empty for SQLite).
    pub section: String,
    url: Option<String>,
    pub cluster: Option<pg::Cluster>,
}

impl TestSpool {
    pub fn sqlite() -> TestSpool {
        TestSpool {
            section: String::new(),
            url: None,
            cluster: None,
        }
    }

    /// A fresh PostgreSQL spool, its URL in a 0600 file under `dir`; `None` after the one
    /// skip rule when PostgreSQL is not here.
    pub fn postgres(dir: &Path) -> Option<TestSpool> {
        let cluster = pg_harness::cluster()?;
        let url = cluster.database("spool");
        let file = dir.join("pg-url");
        std::fs::write(&file, format!("{url}\n")).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        Some(TestSpool {
            section: format!(
                "\n[spool]\nbackend = \"postgres\"\nurl = {{ file = \"{}\" }}\n",
                file.display()
            ),
            url: Some(url),
            cluster: Some(cluster),
        })
    }

    /// How to name this spool to a child process (`open_spec`): the SQLite file of `home`,
    /// or the URL.
    pub fn spec(&self, home: &Path) -> PathBuf {
        match &self.url {
            Some(url) => PathBuf::from(url),
            None => home.join("spool.db"),
        }
    }

    /// A connection to the spool of `home`.
    pub fn open(&self, home: &Path) -> Store {
        match &self.url {
            Some(url) => Store::open_pg(url, Role::Migrator, Duration::from_secs(30))
                .expect("open the PostgreSQL spool"),
            None => open(&home.join("spool.db")),
        }
    }
}

/// A database of its own in this test process's shared PostgreSQL cluster (started once;
/// its guard stops it when the process ends), as a URL; `None` after the one skip rule.
pub fn shared_pg_url() -> Option<String> {
    static CLUSTER: std::sync::OnceLock<Result<pg::Cluster, String>> = std::sync::OnceLock::new();
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    match CLUSTER.get_or_init(pg::Cluster::start) {
        Ok(c) => {
            let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Some(c.database(&format!("shared_{n}")))
        }
        Err(why) => {
            skip::skip_or_fail(why);
            None
        }
    }
}

/// A spool by what a child process is told: a path, or a PostgreSQL URL
/// (`TestSpool::spec`).
pub fn open_spec(spec: &Path) -> Store {
    match spec.to_str().filter(|s| s.starts_with("postgres")) {
        Some(url) => Store::open_pg(url, Role::Migrator, Duration::from_secs(30))
            .expect("open the PostgreSQL spool"),
        None => open(spec),
    }
}

pub fn open(db: &Path) -> Store {
    Store::open(db, Role::Migrator, Duration::from_secs(30)).expect("open store")
}

pub fn request(route: &str, key: &str, payload: &str, now: f64, w: Window) -> EnqueueRequest {
    EnqueueRequest {
        source: "test".into(),
        key: key.into(),
        event_type: "t".into(),
        dedup_id: None,
        dedup_window_s: 86_400.0,
        payload: Some(payload.into()),
        raw: None,
        headers: "{}".into(),
        primary: Copy {
            route: route.into(),
            destination: format!("http:{route}"),
            window: w,
        },
        tees: vec![],
        quarantine: None,
        now,
    }
}

pub fn window(quiet_s: f64, max_s: f64, max_events: i64, max_bytes: i64) -> Window {
    Window {
        quiet_s,
        max_s,
        max_events,
        max_bytes,
    }
}

/// Run this test binary as a child process that performs one store operation (see
/// `child.rs`), with the given failpoint armed.
pub fn child(
    op: &str,
    db: &Path,
    args: &serde_json::Value,
    failpoint: Option<&str>,
) -> std::process::Output {
    let mut cmd = Command::new(std::env::current_exe().expect("current exe"));
    cmd.args([
        "--ignored",
        "--exact",
        "child::child_entry",
        "--nocapture",
        "--test-threads=1",
    ])
    .env("HOOKSPOOL_TEST_CHILD_OP", op)
    .env("HOOKSPOOL_TEST_DB", db)
    .env("HOOKSPOOL_TEST_ARGS", args.to_string());
    match failpoint {
        Some(f) => cmd.env("HOOKSPOOL_FAILPOINT", f),
        None => cmd.env_remove("HOOKSPOOL_FAILPOINT"),
    };
    cmd.output().expect("spawn child")
}

/// Collect a child's stderr in the background (its log lines, for sentinel and readiness
/// checks), so the pipe never fills and blocks it.
pub fn capture_stderr(
    child: &mut std::process::Child,
) -> std::sync::Arc<std::sync::Mutex<Vec<u8>>> {
    use std::io::Read;
    let captured = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let Some(mut pipe) = child.stderr.take() else {
        return captured;
    };
    let sink = captured.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 8192];
        while let Ok(n) = pipe.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock().unwrap().extend_from_slice(&buf[..n]);
        }
    });
    captured
}

/// Polls `f` every 25 ms until it holds or `within` has passed; whether it held.
pub fn eventually(within: std::time::Duration, mut f: impl FnMut() -> bool) -> bool {
    let until = std::time::Instant::now() + within;
    loop {
        if f() {
            return true;
        }
        if std::time::Instant::now() >= until {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
}

/// An executable file at `path` holding `text` (a script with its own `#!` line).
pub fn executable(path: &std::path::Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A config whose one source runs `emit.sh`, written in `scripts`: the script notes each
/// run in its state_dir and emits one follow-up event. The script lives outside the spool
/// home: the sandbox denies scripts the home (database, config, secrets) except their own
/// state_dir.
pub fn emit_script_config(home: &std::path::Path, scripts: &std::path::Path) -> String {
    let script = scripts.join("emit.sh");
    executable(
        &script,
        "#!/bin/sh\ncat > /dev/null\necho \"ran $HOOKSPOOL_BATCH_ID\" >> \"$HOOKSPOOL_STATE_DIR/runs\"\necho '{\"enqueue\": {\"source\": \"followup\", \"key\": \"f\", \"payload\": {\"from\": 1}, \"destination\": \"http-nowhere\"}}'\n",
    );
    script_source_config(home, "emit", &script)
}

/// A config whose one source (`s`, a static token in X-Token, key `k`) runs the script
/// destination `script:<name>` at `script`, its state_dir `<home>/state`, polled every 50 ms.
/// It ends inside the destination's table, so a caller may append more of its keys.
pub fn script_source_config(
    home: &std::path::Path,
    name: &str,
    script: &std::path::Path,
) -> String {
    format!(
        r#"
[dispatch]
poll_s = 0.05
[sources.s]
scheme = "static-token"
header = "X-Token"
key = "k"
action = "script:{name}"
[destinations."script:{name}"]
argv = ["{}"]
state_dir = "{}/state"
timeout_s = 20
"#,
        script.display(),
        home.display()
    )
}

/// [`eventually`], or a panic naming `what`.
pub fn wait_until(what: &str, within: std::time::Duration, f: impl FnMut() -> bool) {
    assert!(eventually(within, f), "timed out waiting for {what}");
}

/// After the child has exited: wait (at most a second) until its captured stderr stops
/// growing, so the reader thread has taken the last lines before a test reads them.
pub fn settle_stderr(captured: &std::sync::Mutex<Vec<u8>>) {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(1);
    let mut len = captured.lock().unwrap().len();
    while std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(50));
        let now = captured.lock().unwrap().len();
        if now == len {
            return;
        }
        len = now;
    }
}

/// Moves a manual clock forward by `dt` seconds (the library keeps no such method: the
/// product never needs one).
pub trait Advance {
    fn advance(&self, dt: f64);
}

impl Advance for hookspool::clock::ManualClock {
    fn advance(&self, dt: f64) {
        use hookspool::clock::Clock;
        self.set(self.now() + dt);
    }
}

/// Whether a process ended by SIGKILL.
pub fn killed(status: &std::process::ExitStatus) -> bool {
    use std::os::unix::process::ExitStatusExt;
    status.signal() == Some(9)
}
