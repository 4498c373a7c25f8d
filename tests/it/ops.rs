//! Every operator command in-process (`cli::run_with` on a Cli parsed from argv) against a
//! seeded spool, with the clock frozen so text output with relative times is stable.
//! Snapshots are exact; `spool_bytes` / `disk_free_bytes` (filesystem facts) are masked.

use std::path::PathBuf;

use hookspool::cli::{Cli, Exit, run_with};
use hookspool::clock::ManualClock;

use super::Advance;
use hookspool::observe::logging::SharedBuf;
use hookspool::store::{AttemptReport, Mark, Quarantine, Store};
use hookspool::vocab::Klass;

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
secret = { file = "{home}/audit.secret" }
"#;

/// The http destination's secret, as `hookspool secret new` makes them.
pub const AUDIT_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

pub struct Env {
    pub _dir: tempfile::TempDir,
    pub home: PathBuf,
    pub clock: ManualClock,
}

impl Env {
    pub fn new(config: &str) -> Env {
        let dir = tempfile::tempdir().expect("tempdir");
        let home = dir.path().join("home");
        use std::os::unix::fs::PermissionsExt;
        std::fs::create_dir_all(&home).expect("home");
        // A spool home is private (0700); check warns about any other mode.
        std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        let env = Env {
            _dir: dir,
            home,
            clock: ManualClock::new(T0),
        };
        env.write_config(config);
        let secret = env.home.join("hooks.secret");
        std::fs::write(&secret, "s3cret\n").expect("secret");
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let audit = env.home.join("audit.secret");
        std::fs::write(&audit, format!("{AUDIT_SECRET}\n")).expect("secret");
        std::fs::set_permissions(&audit, std::fs::Permissions::from_mode(0o600)).expect("chmod");
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
        .claim(
            batch,
            "test",
            now + 60.0,
            now,
            false,
            hookspool::store::DeliveryId::per_attempt("d"),
        )
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
        s.enqueue(&req(
            "k1",
            &format!("{{\"id\":\"k1\",\"n\":{i}}}"),
            T0 - 3700.0,
            imm,
        ))
        .unwrap();
    }
    s.seal_ready(T0 - 3700.0).unwrap();
    mark(
        &mut s,
        1,
        T0 - 3600.0,
        Mark::Delivered {
            result: None,
            emits: vec![],
        },
        Some(200),
        None,
    );
    for i in 0..2 {
        s.enqueue(&req(
            "k2",
            &format!("{{\"id\":\"k2\",\"n\":{i}}}"),
            T0 - 700.0,
            imm,
        ))
        .unwrap();
    }
    s.seal_ready(T0 - 700.0).unwrap();
    mark(
        &mut s,
        2,
        T0 - 600.0,
        Mark::Dead {
            klass: Klass::Permanent,
        },
        Some(422),
        Some("http 422"),
    );
    s.enqueue(&req(
        "k3",
        "{\"id\":\"k3\"}",
        T0 - 30.0,
        window(60.0, 600.0, 500, 786_432),
    ))
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
schema 12  dispatcher NOT alive (last heartbeat 44s ago)
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
            "schema": 12,
            // No standbys: an SQLite spool has one dispatcher (dispatch.lock).
            "dispatcher": {"alive": false, "heartbeat_age_s": 44.0, "pid": 4242, "standbys": 0},
            "spool": {"last_enqueue_age_s": 60.0, "writable_checked_age_s": 0.0},
            "batches": {"open": 1, "sealed": 0, "leased": 0, "retry": 0, "delivered": 1,
                        "dead": 1, "dropped": 0, "quarantined": 1},
            "oldest_pending_age_s": 70.0,
            "destinations": {"http:audit": {"state": "closed", "inflight": null,
                                            "oldest_pending_age_s": 70.0}},
            "sources": {"hooks": {"last_event_age_s": 60.0}},
            "polls": {},
            "sandbox": null,
            "issues_open": 1,
            "spool_bytes": "<fs>",
            "disk_free_bytes": "<fs>",
            // PostgreSQL's connected processes; an SQLite spool has none to list.
            "processes": [],
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
    assert_eq!(
        v["degraded"],
        serde_json::json!(["dead_batches", "quarantined"])
    );
    assert_eq!(hookspool::observe::status::http_status(&v), 200);
}

#[test]
fn metrics_snapshot_is_valid_prometheus_text() {
    // The intake listens where nothing is (a socket path in the test's own home), so
    // `metrics` prints the gauges from the tables, after one line that says where the
    // intake's counters are served: never another process's page on a shared port.
    let env = Env::new(&format!(
        "[intake]\nlisten = \"unix:{{home}}/no-intake.sock\"\n{CONFIG}"
    ));
    seed(&env);
    let out = env.ok(&["metrics"]);
    let (note, gauges) = out.split_once('\n').expect("a note, then the gauges");
    assert!(
        note.starts_with("# the intake's counters (")
            && note.contains("/no-intake.sock; it did not answer ("),
        "{note}"
    );
    assert_eq!(
        without_fs_facts(gauges),
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
# HELP hookspool_destination_max_attempts_per_second The destination's request rate limit (max_per_s); absent when it has none.
# TYPE hookspool_destination_max_attempts_per_second gauge
# HELP hookspool_destination_burst Requests the destination's rate limit lets start back to back (burst); absent when it has none.
# TYPE hookspool_destination_burst gauge
# HELP hookspool_destination_rate_limited_total Times a batch began to wait for its destination's rate limit (this dispatcher's run).
# TYPE hookspool_destination_rate_limited_total counter
# HELP hookspool_destination_rate_limited_seconds_total Seconds batches waited for their destination's rate limit, summed over batches (this dispatcher's run).
# TYPE hookspool_destination_rate_limited_seconds_total counter
# HELP hookspool_destination_oldest_pending_age_seconds Age of the destination's oldest batch not yet delivered; 0 when none.
# TYPE hookspool_destination_oldest_pending_age_seconds gauge
hookspool_destination_oldest_pending_age_seconds{destination=\"http:audit\"} 30
# HELP hookspool_issues_open Issues open or acked.
# TYPE hookspool_issues_open gauge
hookspool_issues_open 0
# HELP hookspool_spool_bytes Size of the spool: the SQLite database with its WAL and shared-memory files, or the PostgreSQL database (pg_database_size).
# TYPE hookspool_spool_bytes gauge
# HELP hookspool_disk_free_bytes Free bytes on the filesystem holding the SQLite spool; absent on PostgreSQL (the server's disk).
# TYPE hookspool_disk_free_bytes gauge
# HELP hookspool_dispatcher_heartbeat_age_seconds Seconds since the dispatcher's last heartbeat; absent when it never ran.
# TYPE hookspool_dispatcher_heartbeat_age_seconds gauge
# HELP hookspool_spool_process On PostgreSQL: each hookspool process connected to the spool (1), by role, host and pid; active=\"true\" marks the active dispatcher.
# TYPE hookspool_spool_process gauge
# HELP hookspool_source_last_event_age_seconds Seconds since the source's last accepted event.
# TYPE hookspool_source_last_event_age_seconds gauge
hookspool_source_last_event_age_seconds{source=\"hooks\"} 20
# HELP hookspool_source_expect_every_seconds The source's liveness expectation (expect_every_s); absent when it has none.
# TYPE hookspool_source_expect_every_seconds gauge
# HELP hookspool_attempt_duration_seconds Duration of delivery attempts finished by the live dispatcher, by destination and outcome.
# TYPE hookspool_attempt_duration_seconds histogram
# HELP hookspool_receive_to_delivered_seconds Time from a batch's first received event to its delivery, by route (the live dispatcher's deliveries).
# TYPE hookspool_receive_to_delivered_seconds histogram
# HELP hookspool_trace_spans_dropped_total Trace spans dropped: the export queue was full, or the collector did not take them.
# TYPE hookspool_trace_spans_dropped_total counter"
    );
    assert!(
        out.contains("\nhookspool_spool_bytes ") && out.contains("\nhookspool_disk_free_bytes ")
    );
    super::observe::promtool_check(&out);
}

fn batch_state(env: &Env, id: i64) -> (String, Option<String>) {
    let b = env.store().batch(id).unwrap();
    (b.state.to_string(), b.result)
}

#[test]
fn replay_round_trip_with_out_of_order_warning_and_issue_resolution() {
    let env = Env::new(CONFIG);
    seed(&env);
    // A newer batch of batch 2's group delivered meanwhile: replaying 2 is out of order.
    {
        let mut s = env.store();
        let mut r = request(
            "hooks",
            "k2",
            "{\"id\":\"k2\",\"n\":9}",
            T0 - 100.0,
            window(0.0, 0.0, 500, 786_432),
        );
        r.source = "hooks".into();
        r.primary.destination = "http:audit".into();
        s.enqueue(&r).unwrap();
        s.seal_ready(T0 - 100.0).unwrap();
        mark(
            &mut s,
            5,
            T0 - 90.0,
            Mark::Delivered {
                result: None,
                emits: vec![],
            },
            Some(200),
            None,
        );
        hookspool::observe::issues::delivery_failed(
            &mut s,
            "http:audit",
            None,
            hookspool::observe::issues::DeliveryReason::Permanent,
            Some(2),
            Some("http 422"),
            T0 - 600.0,
        )
        .unwrap();
    }
    assert_eq!(
        env.ok(&["replay", "2"]),
        "\
batch 2: replayed
  warning: 1 newer batch(es) of group (route hooks, key k2) were already delivered; the destination gets this one out of order
"
    );
    let b = env.store().batch(2).unwrap();
    assert_eq!(
        (b.state.as_str(), b.attempts, b.next_attempt_at),
        ("retry", 0, Some(T0))
    );
    let issue = env
        .store()
        .issue_by_fingerprint("delivery:http:audit:permanent")
        .unwrap()
        .unwrap();
    assert_eq!(
        issue.state.as_str(),
        "resolved",
        "no dead batch left for the destination"
    );
    // Wrong state: exit 1, named.
    let (code, msg, out) = env.fails(&["replay", "1"]);
    assert_eq!(code, 1);
    assert_eq!(msg, "1 of 1 batches could not be replayed");
    assert_eq!(
        out,
        "batch 1: not replayed: batch 1 is delivered: replay takes only a dead batch\n"
    );
    // --dead with filters, JSON.
    let (code, msg, _) = env.fails(&["replay", "--dead", "--destination", "http:audit"]);
    assert_eq!(
        (code, msg.as_str()),
        (1, "no dead batches match; nothing to replay")
    );
    let (code, _, _) = env.fails(&["replay"]);
    assert_eq!(code, 1);
    // retry: due now.
    {
        let mut s = env.store();
        s.claim(
            2,
            "t",
            T0 + 60.0,
            T0,
            false,
            hookspool::store::DeliveryId::per_attempt(""),
        )
        .unwrap()
        .unwrap();
    }
    let (code, msg, _) = env.fails(&["retry", "2"]);
    assert_eq!(
        (code, msg.as_str()),
        (
            1,
            "batch 2 is leased: retry takes only a batch in state retry (waiting out its backoff); a dead batch is sent again with hookspool replay"
        )
    );
}

#[test]
fn quarantine_replay_reclassifies_through_the_fixed_source() {
    let env = Env::new(CONFIG);
    seed(&env);
    hookspool::observe::issues::quarantined(
        &mut env.store(),
        "hooks",
        4,
        "MissingField",
        T0 - 20.0,
    )
    .unwrap();
    // Still broken: nothing changes, the reason is named.
    let (code, msg, out) = env.fails(&["replay", "4"]);
    assert_eq!(code, 1, "{msg}");
    assert_eq!(
        out,
        "batch 4: not replayed: event 7 still fails classification (missing field payload.id); fix the source and replay again\n"
    );
    assert_eq!(batch_state(&env, 4), ("dead".into(), None));
    // Fixed: the key comes from a field the body has.
    env.write_config(&CONFIG.replace("key = \"payload.id\"", "key = \"payload.name\""));
    let v: serde_json::Value = serde_json::from_str(&env.ok(&["--json", "replay", "4"])).unwrap();
    assert_eq!(
        v,
        serde_json::json!({"replay": [{"batch": 4, "ok": true,
            "note": "reclassified: 1 event(s) queued, 0 ignored",
            "reclassified": [{"status": "queued", "copies": [{"event": 8, "batch": 5, "route": "hooks"}]}]}]})
    );
    assert_eq!(
        batch_state(&env, 4),
        ("delivered".into(), Some("reclassified".into()))
    );
    let b = env.store().batch(5).unwrap();
    assert_eq!(
        (b.key.as_str(), b.destination.as_str(), b.state.as_str()),
        ("n1", "http:audit", "open")
    );
    let ev = env.store().events(5, true).unwrap();
    assert_eq!(ev[0].payload.as_deref(), Some("{\"name\":\"n1\"}"));
    let issue = env
        .store()
        .issue_by_fingerprint("config:plugin:hooks")
        .unwrap()
        .unwrap();
    assert_eq!(issue.state.as_str(), "resolved");
    assert!(env.store().check_invariants().unwrap().is_empty());
}

#[test]
fn split_exclude_drop_round_trips_and_yes_guards() {
    let env = Env::new(CONFIG);
    seed(&env);
    let hash_before = env.store().batch(2).unwrap().content_hash;
    // exclude refuses without --yes and changes nothing.
    let (code, msg, _) = env.fails(&["exclude", "2", "4"]);
    assert_eq!(
        (code, msg.as_str()),
        (
            2,
            "exclude cannot be undone; nothing was changed. Run it again with --yes"
        )
    );
    assert_eq!(env.store().batch(2).unwrap().count, 2);
    assert_eq!(
        env.ok(&["exclude", "2", "4", "--yes"]),
        "batch 2: excluded event(s) 4; 1 event(s), 17 bytes remain\n  replay it with: hookspool replay 2\n"
    );
    let b = env.store().batch(2).unwrap();
    assert_ne!(b.content_hash, hash_before, "the hash follows the document");
    let shown = env.ok(&["show", "2", "--events"]);
    assert!(
        shown.ends_with(
            "\
EVENT  TYPE  BYTES  DEDUP ID  RECEIVED
4      t     17     -         12m ago   excluded
5      t     17     -         12m ago
"
        ),
        "{shown}"
    );
    // Excluding the last one is refused (drop is the tool for that).
    let (code, msg, _) = env.fails(&["exclude", "2", "5", "--yes"]);
    assert_eq!(code, 1);
    assert!(
        msg.contains("use `hookspool drop 2 --yes` instead"),
        "{msg}"
    );
    // split the three-event... batch 1 is delivered: refused; make a dead 3-event batch.
    let (code, msg, _) = env.fails(&["split", "1", "--max-events", "1"]);
    assert_eq!(
        (code, msg.as_str()),
        (
            1,
            "batch 1 is delivered: split takes only a sealed, retry or dead batch (not a quarantine)"
        )
    );
    {
        let mut s = env.store();
        let w = window(0.0, 0.0, 500, 786_432);
        for i in 0..3 {
            let mut r = request(
                "hooks",
                "k9",
                &format!("{{\"id\":\"k9\",\"n\":{i}}}"),
                T0 - 10.0,
                w,
            );
            r.source = "hooks".into();
            r.primary.destination = "http:audit".into();
            s.enqueue(&r).unwrap();
        }
        s.seal_ready(T0 - 10.0).unwrap();
        mark(
            &mut s,
            5,
            T0 - 5.0,
            Mark::Dead {
                klass: Klass::Permanent,
            },
            Some(413),
            Some("http 413"),
        );
    }
    assert_eq!(
        env.ok(&["split", "5", "--max-events", "2"]),
        "batch 5 split into 6, 7 (sealed, due now); the original is dropped with result split\n"
    );
    assert_eq!(
        batch_state(&env, 5),
        ("dropped".into(), Some("split".into()))
    );
    let (p1, p2) = (env.store().batch(6).unwrap(), env.store().batch(7).unwrap());
    assert_eq!((p1.count, p2.count, p1.state.as_str()), (2, 1, "sealed"));
    let v: serde_json::Value =
        serde_json::from_str(&env.ok(&["--json", "split", "6", "--at", "9"])).unwrap();
    assert_eq!(v, serde_json::json!({"batch": 6, "into": [8, 9]}));
    assert!(
        Cli::try_parse_from_args(&["hookspool", "split", "6"]).is_err(),
        "split needs one of --max-events, --max-bytes, --at"
    );
    assert!(env.store().check_invariants().unwrap().is_empty());
    // drop: --yes required; then dropped with an audit trail; the issue clears.
    let (code, _, _) = env.fails(&["drop", "2"]);
    assert_eq!(code, 2, "a missing --yes is a usage error");
    assert_eq!(batch_state(&env, 2).0, "dead");
    assert_eq!(
        env.ok(&["drop", "2", "4", "--yes"]),
        "batch 2: dropped\nbatch 4: dropped\n"
    );
    let (code, msg, out) = env.fails(&["drop", "1", "--yes"]);
    assert_eq!(
        (code, msg.as_str()),
        (1, "1 of 1 batches could not be dropped")
    );
    assert_eq!(
        out,
        "batch 1: not dropped: batch 1 is delivered: drop takes only an open, sealed, retry or dead batch\n"
    );
    assert!(env.store().check_invariants().unwrap().is_empty());
}

#[test]
fn pause_resume_and_issue_commands() {
    let env = Env::new(CONFIG);
    seed(&env);
    let (code, msg, _) = env.fails(&["pause", "http:nope"]);
    assert_eq!(code, 1);
    assert!(
        msg.starts_with("destination http:nope is not configured"),
        "{msg}"
    );
    assert!(
        env.ok(&["pause", "http:audit"])
            .starts_with("http:audit paused by ")
    );
    assert_eq!(
        env.store()
            .destination("http:audit")
            .unwrap()
            .state
            .as_str(),
        "paused"
    );
    assert_eq!(
        env.ok(&["resume", "http:audit"]),
        "http:audit resumed (closed)\n"
    );
    assert_eq!(
        env.store()
            .destination("http:audit")
            .unwrap()
            .state
            .as_str(),
        "closed"
    );

    let mut s = env.store();
    use hookspool::observe::issues;
    issues::delivery_failed(
        &mut s,
        "http:audit",
        Some("hooks"),
        issues::DeliveryReason::Permanent,
        Some(2),
        Some("http 422"),
        T0 - 600.0,
    )
    .unwrap();
    issues::quarantined(&mut s, "hooks", 4, "MissingField", T0 - 20.0).unwrap();
    issues::delivery_failed(
        &mut s,
        "http:audit",
        Some("hooks"),
        issues::DeliveryReason::Permanent,
        Some(2),
        Some("http 422"),
        T0 - 10.0,
    )
    .unwrap();
    drop(s);
    assert_eq!(
        env.ok(&["issues"]),
        "\
ID  STATE  KIND      FINGERPRINT                    COUNT  FIRST    LAST     BATCH  ALERTED  LAST ERROR
2   open   delivery  delivery:http:audit:permanent  2      10m ago  10s ago  2      no       http 422
3   open   config    config:plugin:hooks            1      20s ago  20s ago  4      no       plugin error: MissingField
"
    );
    assert_eq!(
        env.ok(&["issues", "ack", "2"]),
        "issue 2 acked: delivery:http:audit:permanent\n"
    );
    assert_eq!(
        env.ok(&["issues", "ignore", "3"]),
        "issue 3 ignored: config:plugin:hooks\n"
    );
    assert_eq!(
        env.ok(&["issues", "list"]),
        "\
ID  STATE  KIND      FINGERPRINT                    COUNT  FIRST    LAST     BATCH  ALERTED  LAST ERROR
2   acked  delivery  delivery:http:audit:permanent  2      10m ago  10s ago  2      no       http 422
"
    );
    let v: serde_json::Value =
        serde_json::from_str(&env.ok(&["--json", "issues", "--all"])).unwrap();
    assert_eq!(
        v.as_array().unwrap().len(),
        3,
        "the pause issue (1) is resolved"
    );
    let plugin = v
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["fingerprint"] == "config:plugin:hooks");
    assert_eq!(plugin.unwrap()["state"], "ignored");
    let v: serde_json::Value =
        serde_json::from_str(&env.ok(&["--json", "issues", "resolve", "2"])).unwrap();
    assert_eq!(v["state"], "resolved");
    assert_eq!(env.ok(&["issues"]), "no open issues\n");
    let (code, msg, _) = env.fails(&["issues", "ack", "9"]);
    assert_eq!((code, msg.as_str()), (1, "issue 9 not found"));
}

fn signed_capture(secret: &[u8], body: &str) -> String {
    use hmac::{Hmac, KeyInit, Mac};
    let mut m = <Hmac<sha2::Sha256> as KeyInit>::new_from_slice(secret).unwrap();
    m.update(body.as_bytes());
    let sig = hex::encode(m.finalize().into_bytes());
    format!(
        "POST /hooks/hooks HTTP/1.1\nContent-Type: application/json\nX-Signature: sha256={sig}\nContent-Length: {}\n\n{body}",
        body.len()
    )
}

#[test]
fn source_test_replays_a_capture_offline() {
    let env = Env::new(CONFIG);
    let cap = env.home.join("req.http");
    std::fs::write(&cap, signed_capture(b"s3cret", "{\"id\":\"abc\",\"x\":1}")).unwrap();
    let capture = cap.display().to_string();
    assert_eq!(
        env.ok(&["source", "test", "hooks", "--request", &capture]),
        "\
source hooks (type template): POST /hooks/hooks, 18 bytes, at 1800000000
  signature   verified
  challenge   none
  ignore      not ignored
  key         abc
  dedup_id    (none)
  event_type  (none)
  attrs       (none)
  payload     18 bytes
  route       hooks -> http:audit (window quiet_s 0.0 max_s 0.0 max_events 500 max_bytes 786432)
  headers     (none)
answer 200 {\"status\":\"queued\"}
"
    );
    std::fs::write(&cap, signed_capture(b"wrong", "{\"id\":\"abc\"}")).unwrap();
    let (code, msg, out) = env.fails(&["source", "test", "hooks", "--request", &capture]);
    assert_eq!(
        (code, msg.as_str()),
        (
            1,
            "the intake would not enqueue this request: 401: not verified"
        )
    );
    assert!(out.contains("\n  signature   not verified"), "{out}");
    assert!(out.ends_with("\nanswer 401 \n"), "{out}");
    // A MissingField quarantine names the field, and the exact answer is the intake's.
    std::fs::write(&cap, signed_capture(b"s3cret", "{\"other\":1}")).unwrap();
    let (r, out) = env.run(&["--json", "source", "test", "hooks", "--request", &capture]);
    assert_eq!(r.unwrap_err().code, 1, "a quarantine is not a success");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        v["answer"],
        serde_json::json!({"status": 202, "body": "{\"status\":\"quarantined\"}"})
    );
    assert_eq!(
        v["steps"][1],
        serde_json::json!({"step": "classify", "result": "failed: missing field payload.id"})
    );
    assert!(
        std::fs::metadata(env.db()).is_err(),
        "nothing stored: no database was even created"
    );
    let (code, _, _) = env.fails(&["source", "test", "nope", "--request", &capture]);
    assert_eq!(code, 2);
}

#[test]
fn export_prune_and_logs() {
    let env = Env::new(CONFIG);
    seed(&env);
    let out = env.ok(&["export"]);
    let records: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).expect("jsonl"))
        .collect();
    let kinds: Vec<&str> = records
        .iter()
        .map(|r| r["record"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "batch", "event", "event", "event", "attempt", "batch", "event", "event", "attempt",
            "batch", "event", "batch", "event"
        ]
    );
    assert_eq!(records[1]["payload"], "{\"id\":\"k1\",\"n\":0}");
    assert_eq!(records[12]["raw_base64"], "eyJuYW1lIjoibjEifQ==");
    assert_eq!(records[12]["headers"]["X-Delivery"], "abc");
    let dead = env.ok(&["export", "--state", "dead"]);
    assert_eq!(
        dead.lines()
            .filter(|l| l.contains("\"record\":\"batch\""))
            .count(),
        2
    );
    let recent = env.ok(&["export", "--since", "35s"]);
    let ids: Vec<i64> = recent
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|r| r["record"] == "batch")
        .map(|r| r["id"].as_i64().unwrap())
        .collect();
    assert_eq!(ids, vec![3, 4]);
    let (code, msg, _) = env.fails(&["export", "--since", "yesterday-ish"]);
    assert_eq!(code, 2, "a usage error");
    assert!(
        msg.starts_with("--since \"yesterday-ish\": write Unix seconds"),
        "{msg}"
    );
    // prune: eight days on, the delivered batch goes; dead and quarantine stay.
    env.clock.advance(8.0 * 86_400.0);
    assert_eq!(
        env.ok(&["prune"]),
        "pruned 1 batches, 3 events, 0 attempts, 0 dedup rows, 0 issues, 0 idempotency keys, 0 rejection hours\n"
    );
    let v: serde_json::Value =
        serde_json::from_str(&env.ok(&["--json", "prune", "--vacuum"])).unwrap();
    assert_eq!(v["vacuum"], true);
    assert_eq!(batch_state(&env, 2).0, "dead");
    // logs: the command to run by hand, or run it.
    assert_eq!(
        env.ok(&["logs", "2", "--print"]),
        "journalctl BATCH=2 --no-pager -o short-iso\n"
    );
    assert_eq!(
        env.ok(&["--json", "logs", "2", "--print"]),
        "{\n  \"command\": [\n    \"journalctl\",\n    \"BATCH=2\",\n    \"--no-pager\",\n    \"-o\",\n    \"json\"\n  ]\n}\n"
    );
    let (r, out) = env.run(&["logs", "2"]);
    assert!(
        out.starts_with("$ journalctl BATCH=2 --no-pager -o short-iso\n"),
        "{out}"
    );
    if let Err(e) = r {
        assert!(
            e.message.contains("run it by hand: journalctl BATCH=2"),
            "{}",
            e.message
        );
    }
}

/// `check` on a config; the output with the home path masked.
fn check(env: &Env, config: &str) -> (i32, String) {
    env.write_config(config);
    let (r, out) = env.run(&["check"]);
    let code = r.err().map(|e| e.code).unwrap_or(0);
    (code, out.replace(&env.home.display().to_string(), "{home}"))
}

#[test]
fn check_finds_each_class_of_misconfiguration() {
    let env = Env::new(CONFIG);
    let file = "{home}/config.toml";
    let (code, out) = check(&env, CONFIG);
    assert_eq!(
        (code, out.as_str()),
        (
            0,
            format!("{file}: ok (0 warning(s), 0 note(s))\n").as_str()
        )
    );

    // Each case: a config edit and the exact finding it must produce.
    let cases: Vec<(String, i32, &str)> = vec![
        (
            CONFIG.replace("[alerts]", "[alerts]\ncolour = \"red\""),
            2,
            "error: {file}: alerts.colour: unknown key; remove it or check its spelling against the documented keys of [alerts]",
        ),
        (
            CONFIG.replace("{home}/hooks.secret", "{home}/missing.secret"),
            2,
            "error: {file}: sources.hooks.secrets.secret: secret file {home}/missing.secret cannot be read: entity not found; create it (mode 0600, owned by the hookspool user) or fix the reference",
        ),
        (
            CONFIG.replace(
                "secrets.secret = { file = \"{home}/hooks.secret\" }",
                "secrets.secret = { env = \"HOME\" }",
            ),
            0,
            "note: {file}: sources.hooks.secrets.secret: env HOME is read from the process environment, which does not change under a running process: a rotation needs a restart; a { file = \"...\" } reference rotates without one",
        ),
        (
            CONFIG.replace(
                "secrets.secret = ",
                "secrets.token = { env = \"HOME\" }\nsecrets.secret = ",
            ),
            0,
            "warning: {file}: sources.hooks.secrets.token: the template source does not read a secret named token; remove it (it reads: secret)",
        ),
        (
            CONFIG.replace("action = ", "keep_headers = [\"x-signature\"]\naction = "),
            2,
            "error: {file}: sources.hooks.keep_headers: x-signature is an authentication header of this source and is never stored; remove it from keep_headers",
        ),
        (
            format!(
                "{CONFIG}\n[[routes]]\nname = \"hooks-ci\"\nsource = \"hooks\"\nmatch = {{ event_type = \"ci\" }}\ndestination = \"http:ci\"\n"
            ),
            2,
            "error: {file}: routes[0]: delivers to http:ci, which is not configured; add [destinations.\"http:ci\"] with type = \"http\" and url = \"https://...\" (or name a hermes:<route> / script:<name> destination)",
        ),
        (
            CONFIG.replace(
                "https://example.invalid/audit",
                "http://example.invalid/audit",
            ),
            2,
            "error: {file}: destinations.\"http:audit\": url uses http://: write an https:// URL, or set allow_insecure = true (payloads and signatures then cross the network in clear)",
        ),
        (
            format!(
                "{CONFIG}\n[[routes]]\nname = \"hooks-slow\"\nsource = \"hooks\"\ndestination = \"http:audit\"\nquiet_s = 900\nmax_s = 60\n"
            ),
            0,
            "warning: {file}: routes[0]: quiet_s 900 > max_s 60: max_s closes the batch first, so the quiet window never fires; raise max_s (e.g. max_s = 4500) or lower quiet_s",
        ),
        (
            CONFIG.replace("url = ", "max_body_bytes = 524288\nurl = "),
            2,
            "error: {file}: sources.hooks.max_bytes: 786432 is over 0.75 x the max_body_bytes 524288 of http:audit: a full batch would be refused (413); write max_bytes = 393216 or raise the destination's max_body_bytes",
        ),
        (
            format!(
                "{CONFIG}\n[[routes]]\nname = \"hooks-small\"\nsource = \"hooks\"\ndestination = \"http:audit\"\nmax_bytes = 1000\n"
            ),
            2,
            "error: {file}: routes[0].max_bytes: 1000 is below sources.hooks.max_body_bytes 786432: one event could overflow a batch; write max_bytes = 786432 or lower the source's max_body_bytes",
        ),
        (
            CONFIG.replace("action = ", "dedup_window_s = 1209600\naction = "),
            0,
            "warning: {file}: sources.hooks.dedup_window_s: longer than retention.delivered_days: a duplicate after the batch is pruned is still caught, but `show` can no longer display the original",
        ),
        (
            CONFIG.replace(
                "argv = [\"/bin/true\"]",
                "argv = [\"hookspool-no-such-sender\"]",
            ),
            0,
            "warning: {file}: alerts.argv: \"hookspool-no-such-sender\" is not found (no such file, or not in PATH): alerts will fail until it exists; write argv = [\"/usr/bin/logger\", \"-t\", \"hookspool\"] or your chat sender's path",
        ),
        (
            format!("{CONFIG}\n[destinations.\"script:x\"]\nargv = [\"{{home}}/nope.sh\"]\n"),
            2,
            "error: {file}: destinations.\"script:x\".argv: {home}/nope.sh does not exist or is not executable; install it or fix argv[0]",
        ),
        (
            format!(
                "[hermes]\nsubscriptions_path = \"{{home}}/subs.json\"\n{}",
                CONFIG
                    .replace("http:audit\"\n", "hermes:ci\"\n")
                    .replace("action = \"http:audit\"", "action = \"hermes:ci\"")
            ),
            2,
            "error: {file}: destinations.\"hermes:ci\": hermes route \"ci\" sets events: a hookspool document carries many event types, so remove events from the route (route per type in hookspool), or set unwrap = true",
        ),
        (
            // The README's old `openssl rand -hex 32`: a standard receiver would decode it
            // into another key, so every delivery would fail its verification.
            CONFIG.replace("{home}/audit.secret", "{home}/hooks.secret"),
            2,
            "error: {file}: destinations.\"http:audit\".secret: not a Standard Webhooks secret: a standard receiver base64-decodes every secret, so it must be whsec_ followed by the base64 of at least 24 random bytes; make one with `hookspool secret new <file>` and point the reference at it (give the receiver the same whsec_ value)",
        ),
        (
            format!(
                "[hermes]\nsubscriptions_path = \"{{home}}/subs.json\"\nlegacy_signature = false\n{}",
                CONFIG.replace("action = \"http:audit\"", "action = \"hermes:ok\"")
            ),
            0,
            "warning: {file}: destinations.\"hermes:ok\".legacy_signature: false: only webhook-signature is sent, and released Hermes gateways verify only X-Hub-Signature-256, so every delivery would be answered 401; remove legacy_signature (it defaults to true) unless your gateway verifies Standard Webhooks signatures",
        ),
        (
            format!(
                "[hermes]\nsubscriptions_path = \"{{home}}/subs.json\"\n{}",
                CONFIG.replace("action = \"http:audit\"", "action = \"hermes:ok\"")
            ),
            0,
            "note: {file}: sources.hooks: max_bytes 786432 lets a document to hermes:ok exceed 4000 characters, where the gateway cuts an agent prompt: the agent may see only the start of a large batch; lower max_bytes or max_events, or have the route's prompt read only the summary",
        ),
        (
            // github's type action reaches hermes:github: its subscription entry is checked.
            format!(
                "[hermes]\nsubscriptions_path = \"{{home}}/subs.json\"\n{CONFIG}\n[sources.github]\nsecrets.secret = {{ file = \"{{home}}/hooks.secret\" }}\n"
            ),
            2,
            "error: {file}: destinations.\"hermes:github\": route \"github\" is not in the hermes subscriptions file: create it with `hermes webhook subscribe github` or fix the destination name",
        ),
    ];
    std::fs::write(
        env.home.join("subs.json"),
        "{\"ci\": {\"secret\": \"x\", \"events\": [\"push\"], \"enabled\": true}, \"ok\": {\"secret\": \"x\", \"enabled\": true}}",
    )
    .unwrap();
    for (config, want_code, want) in cases {
        let (code, out) = check(&env, &config);
        let want = want.replace("{file}", file);
        assert!(
            out.lines().any(|l| l == want),
            "expected the line\n{want}\nin\n{out}"
        );
        assert_eq!(code, want_code, "{out}");
    }

    // Mode: a group-readable secret is a warning.
    use std::os::unix::fs::PermissionsExt;
    let secret = env.home.join("hooks.secret");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (code, out) = check(&env, CONFIG);
    assert_eq!(code, 0);
    assert!(out.contains(&format!(
        "warning: {file}: sources.hooks.secrets.secret: {{home}}/hooks.secret has mode 0644: group or others can read it; run chmod 600 {{home}}/hooks.secret"
    )), "{out}");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();

    // JSON form of an error report.
    env.write_config(&CONFIG.replace("[alerts]", "[alerts]\ncolour = \"red\""));
    let (r, out) = env.run(&["--json", "check"]);
    assert_eq!(r.unwrap_err().code, 2);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["ok"], false);
    assert_eq!(v["errors"][0]["key"], "alerts.colour");

    // quick_check: a database that is not one.
    env.write_config(CONFIG);
    std::fs::write(env.db(), b"this is not a database, it is a text file of some length...................................................................").unwrap();
    let (code, out) = check(&env, CONFIG);
    assert_eq!(code, 2, "{out}");
    assert!(
        out.starts_with(&format!("error: {file}: spool.db ({{home}}/spool.db): ")),
        "{out}"
    );
}

#[test]
fn reload_touches_only_a_good_config_and_explain_sandbox_prints_the_policy() {
    let env = Env::new(CONFIG);
    let cfg = env.home.join("config.toml");
    let old = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
    let set_old = || {
        std::fs::File::options()
            .append(true)
            .open(&cfg)
            .unwrap()
            .set_modified(old)
            .unwrap();
    };
    env.write_config(&CONFIG.replace("[alerts]", "[alerts]\ncolour = \"red\""));
    set_old();
    let (r, _) = env.run(&["reload"]);
    let e = r.unwrap_err();
    assert_eq!(e.code, 2);
    assert!(
        e.message
            .starts_with("not reloaded: check found 1 error(s)"),
        "{}",
        e.message
    );
    assert_eq!(std::fs::metadata(&cfg).unwrap().modified().unwrap(), old);
    env.write_config(CONFIG);
    set_old();
    let out = env.ok(&["reload"]);
    assert!(
        out.ends_with(
            "checked and touched: the intake and the dispatcher reload it within seconds\n"
        ),
        "{out}"
    );
    assert!(std::fs::metadata(&cfg).unwrap().modified().unwrap() > old);

    env.write_config(&format!(
        "{CONFIG}\n[destinations.\"script:x\"]\nargv = [\"/bin/cat\"]\ntimeout_s = 5\n"
    ));
    let out = env.ok(&["check", "--explain-sandbox", "script:x"]);
    assert!(out.starts_with("destination: script:x\n"), "{out}");
    let (code, msg, _) = env.fails(&["check", "--explain-sandbox", "http:audit"]);
    assert_eq!(
        (code, msg.as_str()),
        (
            2,
            "http:audit is a http destination; only script destinations run in the sandbox"
        )
    );
}

/// A sentinel in a payload, a stored header, a quarantined body and the source's secret:
/// nothing the operator commands log (through the JSON log format) may contain it.
#[test]
fn operator_commands_never_log_payloads_headers_or_secrets() {
    const SENTINEL: &str = "SENTINEL-c0ffee";
    let env = Env::new(CONFIG);
    std::fs::write(env.home.join("hooks.secret"), SENTINEL).unwrap();
    seed(&env);
    {
        let mut s = env.store();
        let mut r = request(
            "hooks",
            "k7",
            &format!("{{\"id\":\"k7\",\"secret\":\"{SENTINEL}\"}}"),
            T0 - 5.0,
            window(0.0, 0.0, 500, 786_432),
        );
        r.source = "hooks".into();
        r.primary.destination = "http:audit".into();
        r.headers = format!("{{\"X-Note\":\"{SENTINEL}\"}}");
        s.enqueue(&r).unwrap();
        let mut q = r.clone();
        q.payload = None;
        q.raw = Some(format!("{{\"name\":\"{SENTINEL}\"}}").into_bytes());
        q.quarantine = Some(Quarantine {
            error_class: "MissingField".into(),
        });
        s.enqueue(&q).unwrap();
    }
    let cap = env.home.join("req.http");
    std::fs::write(
        &cap,
        signed_capture(
            SENTINEL.as_bytes(),
            &format!("{{\"id\":\"abc\",\"note\":\"{SENTINEL}\"}}"),
        ),
    )
    .unwrap();
    let capture = cap.display().to_string();
    let (outputs, logs) = hookspool::observe::logging::capture(
        "cli",
        hookspool::observe::logging::Sink::Json,
        || {
            let mut outs = Vec::new();
            for args in [
                vec!["status"],
                vec!["metrics"],
                vec!["check"],
                vec!["list"],
                vec!["show", "6", "--events", "--attempts"],
                vec!["replay", "2", "4", "7"],
                vec!["source", "test", "hooks", "--request", capture.as_str()],
                vec!["issues", "--all"],
                vec!["drop", "3", "--yes"],
            ] {
                outs.push(env.run(&args).1);
            }
            env.write_config(&CONFIG.replace("key = \"payload.id\"", "key = \"payload.name\""));
            outs.push(env.run(&["replay", "7"]).1);
            outs
        },
    );
    assert!(!logs.contains(SENTINEL), "{logs}");
    for out in &outputs {
        assert!(
            !out.contains(SENTINEL),
            "command output without --payload: {out}"
        );
    }
    // The reclassified request did reach the store (it is data, not a log).
    assert!(env.ok(&["export"]).contains(SENTINEL));
}

#[test]
fn check_runs_the_spool_invariant_checker() {
    let env = Env::new(CONFIG);
    seed(&env);
    let (code, out) = check(&env, CONFIG);
    assert_eq!(code, 0, "{out}");
    // A batch whose count no longer matches its events (written behind the store's back).
    let c = rusqlite::Connection::open(env.db()).unwrap();
    c.execute("UPDATE batches SET count = count + 5 WHERE id = 1", [])
        .unwrap();
    drop(c);
    let (code, out) = check(&env, CONFIG);
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("batch 1: count differs from its events: a spool invariant is broken"),
        "{out}"
    );
}
