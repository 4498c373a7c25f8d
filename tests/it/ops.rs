//! Every operator command in-process (`cli::run_with` on a Cli parsed from argv) against a
//! seeded spool, with the clock frozen so text output with relative times is stable.
//! Snapshots are exact; `spool_bytes` / `disk_free_bytes` (filesystem facts) are masked.

use std::path::PathBuf;

use hookspool::cli::{Cli, Exit, run_with};
use hookspool::clock::ManualClock;
use hookspool::observe::logging::SharedBuf;
use hookspool::store::{AttemptReport, Mark, Quarantine, Store};

use super::{open, request, window};

pub const T0: f64 = 1_800_000_000.0;

pub const CONFIG: &str = r#"
[alerts]
argv = ["/bin/true"]

[sources.hooks]
scheme = "hmac-sha256-hex"
header = "X-Signature"
prefix = "sha256="
key = "payload.id"
secrets.secret = { file = "{home}/hooks.secret" }
action = "http:audit"

[destinations."http:audit"]
type = "http"
url = "https://example.invalid/audit"
"#;

pub struct Env {
    pub _dir: tempfile::TempDir,
    pub home: PathBuf,
    pub clock: ManualClock,
}

impl Env {
    pub fn new(config: &str) -> Env {
        let dir = tempfile::tempdir().expect("tempdir");
        let home = dir.path().join("home");
        std::fs::create_dir_all(&home).expect("home");
        let env = Env {
            _dir: dir,
            home,
            clock: ManualClock::new(T0),
        };
        env.write_config(config);
        let secret = env.home.join("hooks.secret");
        std::fs::write(&secret, "s3cret\n").expect("secret");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        env
    }

    pub fn write_config(&self, config: &str) {
        let text = config.replace("{home}", &self.home.display().to_string());
        std::fs::write(self.home.join("config.toml"), text).expect("config");
    }

    pub fn db(&self) -> PathBuf {
        self.home.join("spool.db")
    }

    pub fn store(&self) -> Store {
        open(&self.db())
    }

    /// Run `hookspool --home <home> <args>`; the exit (Ok or the Exit) and the output.
    pub fn run(&self, args: &[&str]) -> (Result<(), Exit>, String) {
        let home = self.home.display().to_string();
        let mut argv = vec!["hookspool", "--home", home.as_str()];
        argv.extend_from_slice(args);
        let cli = match Cli::try_parse_from_args(&argv) {
            Ok(c) => c,
            Err(e) => panic!("{argv:?} does not parse: {e}"),
        };
        let buf = SharedBuf::default();
        let r = run_with(cli, Box::new(self.clock.clone()), Box::new(buf.clone()));
        (r, buf.text())
    }

    /// Run and expect success; the output.
    pub fn ok(&self, args: &[&str]) -> String {
        match self.run(args) {
            (Ok(()), out) => out,
            (Err(e), out) => panic!("{args:?} failed ({}): {}\n{out}", e.code, e.message),
        }
    }

    /// Run and expect failure; (code, message, output).
    pub fn fails(&self, args: &[&str]) -> (i32, String, String) {
        match self.run(args) {
            (Ok(()), out) => panic!("{args:?} succeeded:\n{out}"),
            (Err(e), out) => (e.code, e.message, out),
        }
    }
}

/// A Cli from argv without clap's process exit.
trait ParseArgs: Sized {
    fn try_parse_from_args(argv: &[&str]) -> Result<Self, clap::Error>;
}

impl ParseArgs for Cli {
    fn try_parse_from_args(argv: &[&str]) -> Result<Cli, clap::Error> {
        use clap::Parser;
        Cli::try_parse_from(argv)
    }
}

fn mark(s: &mut Store, batch: i64, now: f64, m: Mark, status: Option<i64>, err: Option<&str>) {
    let claim = s
        .claim(batch, "test", now + 60.0, now, false, &|a| format!("d{a}"))
        .expect("claim")
        .expect("won");
    s.mark(&AttemptReport {
        batch_id: batch,
        attempt_id: claim.attempt_id,
        lease_owner: claim.lease_owner,
        now: now + 0.25,
        status,
        error: err.map(str::to_string),
        duration_ms: 250,
        delivery_id: None,
        events_delivered: None,
        failed_event_id: None,
        mark: m,
    })
    .expect("mark");
}

/// The seeded spool:
/// 1  delivered, key k1, 3 events (delivered an hour ago)
/// 2  dead (permanent, 422), key k2, 2 events
/// 3  open, key k3, 1 event, 30 s old
/// 4  quarantine of source hooks (a body without `id`)
pub fn seed(env: &Env) {
    let mut s = env.store();
    let imm = window(0.0, 0.0, 500, 786_432);
    let req = |key: &str, payload: &str, t: f64, w| {
        let mut r = request("hooks", key, payload, t, w);
        r.source = "hooks".into();
        r.primary.destination = "http:audit".into();
        r
    };
    for i in 0..3 {
        s.enqueue(&req("k1", &format!("{{\"id\":\"k1\",\"n\":{i}}}"), T0 - 3700.0, imm))
            .unwrap();
    }
    s.seal_ready(T0 - 3700.0).unwrap();
    mark(&mut s, 1, T0 - 3600.0, Mark::Delivered { result: None, emits: vec![] }, Some(200), None);
    for i in 0..2 {
        s.enqueue(&req("k2", &format!("{{\"id\":\"k2\",\"n\":{i}}}"), T0 - 700.0, imm))
            .unwrap();
    }
    s.seal_ready(T0 - 700.0).unwrap();
    mark(
        &mut s,
        2,
        T0 - 600.0,
        Mark::Dead { klass: "permanent".into() },
        Some(422),
        Some("http 422"),
    );
    s.enqueue(&req("k3", "{\"id\":\"k3\"}", T0 - 30.0, window(60.0, 600.0, 500, 786_432)))
        .unwrap();
    let mut q = req("quarantine", "{}", T0 - 20.0, imm);
    q.payload = None;
    q.raw = Some(b"{\"name\":\"n1\"}".to_vec());
    q.headers = "{\"Content-Type\":\"application/json\",\"X-Delivery\":\"abc\"}".into();
    q.quarantine = Some(Quarantine {
        error_class: "MissingField".into(),
    });
    s.enqueue(&q).unwrap();
}

pub fn without_fs_facts(text: &str) -> String {
    text.lines()
        .filter(|l| {
            !l.starts_with("hookspool_spool_bytes ")
                && !l.starts_with("hookspool_disk_free_bytes ")
                && !l.starts_with("spool ")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn mask_json(mut v: serde_json::Value) -> serde_json::Value {
    for k in ["spool_bytes", "disk_free_bytes"] {
        if v.get(k).is_some() {
            v[k] = serde_json::json!("<fs>");
        }
    }
    v
}

fn home_masked(env: &Env, text: &str) -> String {
    text.replace(&env.home.display().to_string(), "{home}")
}

#[test]
fn list_show_and_paging_snapshots() {
    let env = Env::new(CONFIG);
    seed(&env);
    assert_eq!(
        env.ok(&["list"]),
        "\
ID  STATE      SOURCE  ROUTE  KEY         DESTINATION  EVENTS  BYTES  FIRST    LAST CLASS
4   dead       hooks   hooks  quarantine  quarantine   1       13     20s ago  quarantine
3   open       hooks   hooks  k3          http:audit   1       11     30s ago
2   dead       hooks   hooks  k2          http:audit   2       34     12m ago  permanent
1   delivered  hooks   hooks  k1          http:audit   3       51     62m ago
"
    );
    assert_eq!(
        env.ok(&["list", "--limit", "2"]),
        "\
ID  STATE  SOURCE  ROUTE  KEY         DESTINATION  EVENTS  BYTES  FIRST    LAST CLASS
4   dead   hooks   hooks  quarantine  quarantine   1       13     20s ago  quarantine
3   open   hooks   hooks  k3          http:audit   1       11     30s ago
(more: --before 3)
"
    );
    let page2: serde_json::Value =
        serde_json::from_str(&env.ok(&["--json", "list", "--limit", "2", "--before", "3"]))
            .unwrap();
    let ids: Vec<i64> = page2
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["id"].as_i64().unwrap())
        .collect();
    assert_eq!(ids, vec![2, 1]);
    assert_eq!(
        env.ok(&["show", "2", "--events", "--attempts"]),
        "\
batch 2  dead
  source hooks  route hooks  key k2
  destination http:audit
  events 2  bytes 34  first 12m ago  last 12m ago
  window quiet_s 0 max_s 0 max_events 500 max_bytes 786432
  sealed 12m ago  content_hash sha256:24504b45098a44fe3085b4ba8af990e22b26292760d0ea56c6e3f19a9ab103c3
  attempts 0 (counted)  next attempt -
  last error [permanent] http 422
  replay with: hookspool replay 2

EVENT  TYPE  BYTES  DEDUP ID  RECEIVED
4      t     17     -         12m ago
5      t     17     -         12m ago

N  STARTED  OUTCOME  CLASS      STATUS  TOOK     ERROR
1  10m ago  dead     permanent  422     250ms    http 422
"
    );
    let v: serde_json::Value =
        serde_json::from_str(&env.ok(&["--json", "show", "2", "--attempts"])).unwrap();
    assert_eq!(v["batch"]["state"], "dead");
    assert_eq!(v["attempts"][0]["status"], 422);
    assert!(v.get("events").is_none());
    let (code, msg, _) = env.fails(&["show", "99"]);
    assert_eq!((code, msg.as_str()), (1, "batch 99 not found"));
}

#[test]
fn status_snapshots_text_and_json() {
    let env = Env::new(CONFIG);
    seed(&env);
    {
        let mut s = env.store();
        s.set_meta("dispatcher_heartbeat_at", &(T0 - 4.0).to_string())
            .unwrap();
        s.set_meta("dispatcher_pid", "4242").unwrap();
        hookspool::observe::issues::delivery_failed(
            &mut s,
            "http:audit",
            Some("hooks"),
            hookspool::observe::issues::DeliveryReason::Permanent,
            Some(2),
            Some("http 422"),
            T0 - 600.0,
        )
        .unwrap();
    }
    env.clock.advance(40.0);
    assert_eq!(
        without_fs_facts(&env.ok(&["status"])),
        "\
ok (degraded: dispatcher_heartbeat, dead_batches, quarantined)
schema 3  dispatcher NOT alive (last heartbeat 44s ago)
batches  open 1  sealed 0  leased 0  retry 0  delivered 1  dead 1  dropped 0  quarantined 1
oldest pending 70s ago  issues open 1

DESTINATION  STATE   INFLIGHT  OLDEST PENDING  LAST ERROR
http:audit   closed  -         70s ago

SOURCE  LAST EVENT  EXPECTED EVERY  LIVENESS
hooks   60s ago     -               -"
    );
    // The status wrote its writability proof (no enqueue in the last 30 s): 0 s old now.
    let v = mask_json(serde_json::from_str(&env.ok(&["--json", "status"])).unwrap());
    assert_eq!(
        v,
        serde_json::json!({
            "ok": true,
            "degraded": ["dispatcher_heartbeat", "dead_batches", "quarantined"],
            "schema": 3,
            "dispatcher": {"alive": false, "heartbeat_age_s": 44.0, "pid": 4242},
            "spool": {"last_enqueue_age_s": 60.0, "writable_checked_age_s": 0.0},
            "batches": {"open": 1, "sealed": 0, "leased": 0, "retry": 0, "delivered": 1,
                        "dead": 1, "dropped": 0, "quarantined": 1},
            "oldest_pending_age_s": 70.0,
            "destinations": {"http:audit": {"state": "closed", "inflight": null,
                                            "oldest_pending_age_s": 70.0}},
            "sources": {"hooks": {"last_event_age_s": 60.0}},
            "polls": {},
            "issues_open": 1,
            "spool_bytes": "<fs>",
            "disk_free_bytes": "<fs>",
        })
    );
    // A paused destination and a live dispatcher.
    env.store()
        .set_meta("dispatcher_heartbeat_at", &(T0 + 35.0).to_string())
        .unwrap();
    env.ok(&["pause", "http:audit", "--reason", "maintenance"]);
    let v: serde_json::Value = serde_json::from_str(&env.ok(&["--json", "status"])).unwrap();
    assert_eq!(v["dispatcher"]["alive"], true);
    assert_eq!(v["destinations"]["http:audit"]["state"], "paused");
    assert_eq!(v["destinations"]["http:audit"]["last_error"], "maintenance");
    assert_eq!(v["degraded"], serde_json::json!(["dead_batches", "quarantined"]));
    assert_eq!(hookspool::observe::status::http_status(&v), 200);
}

#[test]
fn metrics_snapshot_is_valid_prometheus_text() {
    let env = Env::new(CONFIG);
    seed(&env);
    let out = env.ok(&["metrics"]);
    assert_eq!(
        without_fs_facts(&out),
        "\
# HELP hookspool_attempts_30d Delivery attempts started within retention.attempts_days, by destination, outcome and class.
# TYPE hookspool_attempts_30d gauge
hookspool_attempts_30d{destination=\"http:audit\",outcome=\"dead\",klass=\"permanent\"} 1
hookspool_attempts_30d{destination=\"http:audit\",outcome=\"ok\",klass=\"\"} 1
# HELP hookspool_batches_delivered_7d Batches delivered within retention.delivered_days, by destination.
# TYPE hookspool_batches_delivered_7d gauge
hookspool_batches_delivered_7d{destination=\"http:audit\"} 1
# HELP hookspool_attempt_duration_seconds_sum_30d Total duration of finished attempts within retention.attempts_days, by destination.
# TYPE hookspool_attempt_duration_seconds_sum_30d gauge
hookspool_attempt_duration_seconds_sum_30d{destination=\"http:audit\"} 0.5
# HELP hookspool_attempt_duration_seconds_count_30d Finished attempts with a duration within retention.attempts_days, by destination.
# TYPE hookspool_attempt_duration_seconds_count_30d gauge
hookspool_attempt_duration_seconds_count_30d{destination=\"http:audit\"} 2
# HELP hookspool_batches Batches by state (dead excludes quarantine batches, counted as quarantined).
# TYPE hookspool_batches gauge
hookspool_batches{state=\"open\"} 1
hookspool_batches{state=\"sealed\"} 0
hookspool_batches{state=\"leased\"} 0
hookspool_batches{state=\"retry\"} 0
hookspool_batches{state=\"delivered\"} 1
hookspool_batches{state=\"dead\"} 1
hookspool_batches{state=\"dropped\"} 0
hookspool_batches{state=\"quarantined\"} 1
# HELP hookspool_oldest_pending_age_seconds Age of the oldest batch not yet delivered (open, sealed, retry or leased); 0 when none.
# TYPE hookspool_oldest_pending_age_seconds gauge
hookspool_oldest_pending_age_seconds 30
# HELP hookspool_destination_state Destination gate: 0 closed, 1 half_open, 2 open, 3 paused.
# TYPE hookspool_destination_state gauge
hookspool_destination_state{destination=\"http:audit\"} 0
# HELP hookspool_destination_oldest_pending_age_seconds Age of the destination's oldest batch not yet delivered; 0 when none.
# TYPE hookspool_destination_oldest_pending_age_seconds gauge
hookspool_destination_oldest_pending_age_seconds{destination=\"http:audit\"} 30
# HELP hookspool_issues_open Issues open or acked.
# TYPE hookspool_issues_open gauge
hookspool_issues_open 0
# HELP hookspool_spool_bytes Size of the spool database with its WAL and shared-memory files.
# TYPE hookspool_spool_bytes gauge
# HELP hookspool_disk_free_bytes Free bytes on the filesystem holding the spool.
# TYPE hookspool_disk_free_bytes gauge
# HELP hookspool_dispatcher_heartbeat_age_seconds Seconds since the dispatcher's last heartbeat; absent when it never ran.
# TYPE hookspool_dispatcher_heartbeat_age_seconds gauge
# HELP hookspool_source_last_event_age_seconds Seconds since the source's last accepted event.
# TYPE hookspool_source_last_event_age_seconds gauge
hookspool_source_last_event_age_seconds{source=\"hooks\"} 20"
    );
    assert!(out.contains("\nhookspool_spool_bytes ") && out.contains("\nhookspool_disk_free_bytes "));
    super::observe::promtool_check(&out);
}
