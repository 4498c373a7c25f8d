//! The poll clock (spec 14.4) with the manual clock and a real SQLite file: each of its
//! three rules, a day-long stop, a dead tick batch, a reload that shortens every_s, and
//! writes only when something is new, due, too far out or delivered. The driver is the one
//! the dispatcher's tick calls (`dispatch::polls::pass`); deliveries and dead letters go
//! through the store's own claim and mark, as the dispatcher records them. SIGKILL at the
//! failpoint between the enqueue and the `next_at` update runs the real binary.

use std::path::Path;
use std::time::{Duration, Instant};

use hookspool::clock::{Clock, ManualClock};
use hookspool::config::{self, Config, PathInputs};
use hookspool::dispatch::polls::{PollPass, pass};
use hookspool::store::{AttemptReport, BatchFilter, BatchRow, Mark, PollRow, Store};
use hookspool::vocab::{BatchState, Klass};

use super::{Advance, bin, killed, open};

const T0: f64 = 1_800_000_000.0;

fn feed_config(home: &Path, extra: &str) -> Config {
    let text = format!(
        r#"
[spool]
home = "{}"
[bobbins.feed]
bobbin = "hookspool.feed"
settings = {{ url = "https://feeds.example.org/atom.xml" }}
outputs = {{ entry = "hermes:feed" }}
{extra}
"#,
        home.display()
    );
    let inputs = PathInputs {
        home_flag: Some(home.into()),
        ..Default::default()
    };
    config::parse(&text, None, &inputs, true)
        .unwrap_or_else(|e| panic!("{e:?}"))
        .0
}

struct H {
    _dir: tempfile::TempDir,
    cfg: Config,
    clock: ManualClock,
    store: Store,
}

fn harness(extra: &str) -> H {
    let dir = tempfile::tempdir().unwrap();
    let cfg = feed_config(dir.path(), extra);
    let store = open(&cfg.db);
    H {
        _dir: dir,
        cfg,
        clock: ManualClock::new(T0),
        store,
    }
}

impl H {
    fn pass(&mut self) -> PollPass {
        let now = self.clock.now();
        pass(&mut self.store, &self.cfg, now, &mut rand::random::<f64>).unwrap()
    }

    fn row(&self) -> PollRow {
        let rows = self.store.polls().unwrap();
        assert_eq!(rows.len(), 1, "{rows:?}");
        rows[0].clone()
    }

    fn batches(&self) -> Vec<BatchRow> {
        self.store
            .list_batches(&BatchFilter {
                source: Some("feed".into()),
                limit: 100,
                ..Default::default()
            })
            .unwrap()
    }

    /// The dispatcher's path for one attempt: seal, claim, mark.
    fn finish(&mut self, batch: i64, mark: Mark) {
        let now = self.clock.now();
        self.store.seal_ready(now).unwrap();
        let claim = self
            .store
            .claim(
                batch,
                "test:1",
                now + 60.0,
                now,
                false,
                hookspool::store::DeliveryId::per_attempt(""),
            )
            .unwrap()
            .expect("claimed");
        self.store
            .mark(&AttemptReport {
                batch_id: batch,
                attempt_id: claim.attempt_id,
                lease_owner: claim.lease_owner.clone(),
                now,
                status: Some(0),
                error: None,
                duration_ms: 5,
                delivery_id: None,
                events_delivered: None,
                failed_event_id: None,
                mark,
            })
            .unwrap();
    }

    fn deliver(&mut self, batch: i64) {
        self.finish(
            batch,
            Mark::Delivered {
                result: None,
                emits: vec![],
            },
        );
    }

    fn kill(&mut self, batch: i64) {
        self.finish(
            batch,
            Mark::Dead {
                klass: Klass::Permanent,
            },
        );
    }

    /// Schedule (rule 1, jitter 0: due at once) and fire the first tick; its batch.
    fn first_tick(&mut self) -> i64 {
        let p = self.pass();
        assert_eq!(p.scheduled, ["feed"]);
        let p = self.pass();
        assert_eq!(p.ticked.len(), 1, "{p:?}");
        p.ticked[0].1
    }
}

#[test]
fn poll_clock_rule_1_new_instance_starts_within_its_jitter_and_writes_once() {
    let mut h = harness("jitter_s = 300\n");
    let p = h.pass();
    assert_eq!(
        (p.scheduled.as_slice(), p.writes()),
        (&["feed".to_string()][..], 1)
    );
    let r = h.row();
    assert!((T0..=T0 + 300.0).contains(&r.next_at), "{r:?}");
    assert_eq!((r.created_at, r.last_tick_at, r.skipped), (T0, None, 0));
    assert!(h.batches().is_empty(), "scheduling enqueues nothing");
    // Not new, not due, not too far out: the next pass takes no write transaction.
    assert_eq!(h.pass().writes(), 0);
    assert_eq!(h.row(), r);
}

#[test]
fn poll_clock_rule_3_due_instance_gets_one_tick_with_next_at_in_the_same_transaction() {
    let mut h = harness("jitter_s = 0\n");
    let batch = h.first_tick();
    let r = h.row();
    assert_eq!(
        (r.last_tick_at, r.last_batch_id, r.next_at, r.pending),
        (Some(T0), Some(batch), T0 + 900.0, true)
    );
    let b = h.store.batch(batch).unwrap();
    assert_eq!(
        (b.route.as_str(), b.key.as_str(), b.destination.as_str()),
        ("feed", "poll", "script:feed")
    );
    // An immediate window.
    assert_eq!((b.quiet_s, b.max_s), (0.0, 0.0));
    let events = h.store.events(batch, true).unwrap();
    assert_eq!(events.len(), 1);
    let e = &events[0];
    assert_eq!(e.event_type, "poll");
    assert_eq!(
        e.dedup_id.as_deref(),
        Some(format!("poll:feed:{T0}").as_str())
    );
    let payload: serde_json::Value = serde_json::from_str(e.payload.as_deref().unwrap()).unwrap();
    assert_eq!(
        payload,
        serde_json::json!({"tick": T0 as i64, "instance": "feed"})
    );
    // Not due again until next_at.
    h.clock.advance(899.0);
    assert_eq!(h.pass().writes(), 0);
    assert_eq!(h.batches().len(), 1);
}

#[test]
fn poll_clock_a_day_long_stop_yields_one_tick_never_a_burst() {
    let mut h = harness("jitter_s = 0\n");
    let first = h.first_tick();
    h.deliver(first);
    // The dispatcher was stopped for a day: 96 windows of 900 s passed.
    h.clock.advance(86_400.0);
    let p = h.pass();
    assert_eq!(p.ticked.len(), 1, "{p:?}");
    assert_eq!(
        p.delivered,
        ["feed"],
        "the first tick's delivery is recorded on the way"
    );
    let now = h.clock.now();
    assert_eq!(
        h.row().next_at,
        now + 900.0,
        "counted from now, not from the missed window"
    );
    for _ in 0..5 {
        assert!(h.pass().ticked.is_empty());
    }
    assert_eq!(h.batches().len(), 2, "one tick for the whole day");
}

#[test]
fn poll_clock_rule_2_dead_tick_batch_gets_no_new_ticks_until_replay_or_drop() {
    let mut h = harness("jitter_s = 0\n");
    let first = h.first_tick();
    h.kill(first);
    for n in 1..=3 {
        h.clock.advance(900.0);
        let p = h.pass();
        assert_eq!((p.ticked.len(), p.skipped.len()), (0, 1), "{p:?}");
        let r = h.row();
        assert_eq!((r.skipped, r.last_batch_id), (n, Some(first)));
        assert_eq!(r.next_at, h.clock.now() + 900.0, "only next_at moves");
    }
    assert_eq!(h.batches().len(), 1, "no tick while the last one is dead");
    // The operator's replay: the batch is on its way again, so still no new tick...
    h.store.replay(&[first], h.clock.now()).unwrap()[0]
        .as_ref()
        .unwrap();
    h.clock.advance(900.0);
    assert_eq!(h.pass().skipped.len(), 1);
    // ...until it is delivered.
    h.deliver(first);
    h.clock.advance(900.0);
    let p = h.pass();
    assert_eq!(p.ticked.len(), 1, "{p:?}");
    let second = p.ticked[0].1;
    // Dead again, then dropped by the operator: the next window ticks.
    h.kill(second);
    h.clock.advance(900.0);
    assert_eq!(h.pass().skipped.len(), 1);
    h.store.drop_batches(&[second], h.clock.now()).unwrap()[0]
        .as_ref()
        .unwrap();
    h.clock.advance(900.0);
    let p = h.pass();
    assert_eq!(
        p.ticked.len(),
        1,
        "a dropped tick no longer holds the clock: {p:?}"
    );
    assert_eq!(h.row().skipped, 5);
}

#[test]
fn poll_clock_undelivered_states_open_sealed_leased_retry_all_skip() {
    let mut h = harness("jitter_s = 0\n");
    let first = h.first_tick();
    // Open (just enqueued).
    h.clock.advance(900.0);
    assert_eq!(h.pass().skipped.len(), 1);
    // Sealed.
    h.store.seal_ready(h.clock.now()).unwrap();
    assert_eq!(h.store.batch(first).unwrap().state, BatchState::Sealed);
    h.clock.advance(900.0);
    assert_eq!(h.pass().skipped.len(), 1);
    // Retry.
    let next = h.clock.now() + 30.0;
    h.finish(
        first,
        Mark::Retry {
            klass: Klass::Transport,
            next_attempt_at: next,
        },
    );
    assert_eq!(h.store.batch(first).unwrap().state, BatchState::Retry);
    h.clock.advance(900.0);
    assert_eq!(h.pass().skipped.len(), 1);
    // Leased.
    let now = h.clock.now();
    h.store
        .claim(
            first,
            "test:2",
            now + 600.0,
            now,
            false,
            hookspool::store::DeliveryId::per_attempt(""),
        )
        .unwrap()
        .expect("claimed");
    h.clock.advance(900.0);
    assert_eq!(h.pass().skipped.len(), 1);
    assert_eq!(h.batches().len(), 1);
    assert_eq!(h.row().skipped, 4);
}

#[test]
fn poll_clock_a_reload_that_shortens_every_s_pulls_next_at_in() {
    let mut h = harness("every_s = 86400\njitter_s = 0\n");
    let first = h.first_tick();
    assert_eq!(h.row().next_at, T0 + 86_400.0);
    h.deliver(first);
    // The reload: every_s 86400 -> 900.
    h.cfg = feed_config(h._dir.path(), "every_s = 900\njitter_s = 0\n");
    h.clock.advance(10.0);
    let p = h.pass();
    assert_eq!(p.rescheduled, ["feed"], "{p:?}");
    assert_eq!(
        h.row().next_at,
        T0 + 900.0,
        "as if 900 s had been the period since the tick"
    );
    // In bounds now: no more writes until due.
    assert_eq!(h.pass().writes(), 0);
    h.clock.set(T0 + 900.0);
    assert_eq!(h.pass().ticked.len(), 1);
    // A longer period is not "too far out": the next time stands until it comes.
    h.cfg = feed_config(h._dir.path(), "every_s = 3600\njitter_s = 0\n");
    h.clock.advance(1.0);
    assert_eq!(h.pass().writes(), 0);
}

#[test]
fn poll_clock_records_the_delivered_tick_once() {
    let mut h = harness("jitter_s = 0\n");
    let first = h.first_tick();
    h.clock.advance(5.0);
    h.deliver(first);
    let delivered_at = h.store.batch(first).unwrap().delivered_at;
    h.clock.advance(1.0);
    let p = h.pass();
    assert_eq!(
        (p.delivered.as_slice(), p.writes()),
        (&["feed".to_string()][..], 1)
    );
    let r = h.row();
    assert_eq!(
        (r.delivered_at, r.delivered_tick_at, r.pending),
        (delivered_at, Some(T0), false)
    );
    assert_eq!(h.pass().writes(), 0, "recorded once");
}

#[test]
fn poll_clock_no_poll_sources_reads_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let inputs = PathInputs {
        home_flag: Some(dir.path().into()),
        ..Default::default()
    };
    let (cfg, _) = config::parse(
        "[sources.s]\nscheme = \"static-token\"\nheader = \"X-T\"\nkey = \"k\"\naction = \"hermes:s\"\n",
        None,
        &inputs,
        true,
    )
    .unwrap();
    let mut store = open(&cfg.db);
    let p = pass(&mut store, &cfg, T0, &mut || 0.5).unwrap();
    assert_eq!(p, PollPass::default());
    assert!(store.polls().unwrap().is_empty());
}

/// `hookspool dispatch` on a home whose config has one poll instance due at once.
fn dispatch_child(home: &Path, failpoint: Option<&str>) -> std::process::Child {
    let mut cmd = std::process::Command::new(bin());
    cmd.args(["--home", &home.display().to_string(), "dispatch"])
        .env("HOOKSPOOL_LOG", "json")
        .env_remove("HOOKSPOOL_FAILPOINT")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    if let Some(f) = failpoint {
        cmd.env("HOOKSPOOL_FAILPOINT", f);
    }
    cmd.spawn().unwrap()
}

fn write_config(home: &Path) {
    std::fs::write(
        home.join("config.toml"),
        r#"
[dispatch]
poll_s = 0.05
[bobbins.feed]
bobbin = "hookspool.feed"
settings = { url = "https://feeds.example.org/atom.xml" }
outputs = { entry = "hermes:feed" }
jitter_s = 0
"#,
    )
    .unwrap();
}

#[test]
fn poll_clock_sigkill_between_the_enqueue_and_the_next_at_update_commits_neither() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();
    write_config(home);
    let mut child = dispatch_child(home, Some("poll.after_enqueue"));
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "the failpoint was never reached");
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(killed(&status), "{status:?}: {err}");
    assert!(err.contains("FAILPOINT poll.after_enqueue"), "{err}");
    let store = open(&home.join("spool.db"));
    let rows = store.polls().unwrap();
    assert_eq!(rows.len(), 1, "rule 1 committed before the kill: {rows:?}");
    assert_eq!((rows[0].last_tick_at, rows[0].last_batch_id), (None, None));
    let ticks = store
        .list_batches(&BatchFilter {
            source: Some("feed".into()),
            limit: 10,
            ..Default::default()
        })
        .unwrap();
    assert!(
        ticks.is_empty(),
        "the tick died with its next_at update: {ticks:?}"
    );
    let scheduled = rows[0].next_at;
    drop(store);
    // Restarted without the failpoint: the same window ticks once, both written together.
    let mut child = dispatch_child(home, None);
    let store = open(&home.join("spool.db"));
    let deadline = Instant::now() + Duration::from_secs(60);
    let row = loop {
        let r = store.polls().unwrap()[0].clone();
        if r.last_batch_id.is_some() {
            break r;
        }
        assert!(Instant::now() < deadline, "no tick after the restart");
        std::thread::sleep(Duration::from_millis(50));
    };
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    child.wait().unwrap();
    assert_eq!(row.last_tick_at, Some(scheduled));
    let events = store.events(row.last_batch_id.unwrap(), false).unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(
        events[0].dedup_id.as_deref(),
        Some(format!("poll:feed:{scheduled}").as_str())
    );
}

fn bobbin_check(dir: &Path) -> std::process::Output {
    std::process::Command::new(bin())
        .args(["bobbin", "check", &dir.display().to_string()])
        .output()
        .unwrap()
}

#[test]
fn poll_bobbin_check_passes_for_both_built_in_poll_bobbins() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("bobbins");
    for b in ["hookspool/feed", "google/tasks"] {
        let out = bobbin_check(&root.join(b));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{b}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            text.contains("processor       pass"),
            "{b}: the poller ran: {text}"
        );
        assert!(text.contains("source-kit      skip"), "{b}: {text}");
    }
}

#[test]
fn poll_kit_refuses_request_captures_and_wrong_items() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("bobbins/hookspool/feed");
    let dir = tempfile::tempdir().unwrap();
    let b = dir.path().join("hookspool/feed");
    std::fs::create_dir_all(b.join("captures")).unwrap();
    for f in ["bobbin.toml", "README.md", "SETUP.md", "AGENTS.md"] {
        std::fs::copy(src.join(f), b.join(f)).unwrap();
    }
    for f in [
        "kit.toml",
        "poll-1-new-entries.json",
        "poll-2-not-modified.json",
    ] {
        std::fs::copy(src.join("captures").join(f), b.join("captures").join(f)).unwrap();
    }
    let cap = b.join("captures/poll-1-new-entries.json");
    let text = std::fs::read_to_string(&cap).unwrap();
    std::fs::write(&cap, text.replace("\"First post\"", "\"Another post\"")).unwrap();
    std::fs::write(
        b.join("captures/push.http"),
        "POST /hooks/feed HTTP/1.1\n\n{}",
    )
    .unwrap();
    let out = bobbin_check(&b);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains("the poller's items differ from the capture's items"),
        "{text}"
    );
    assert!(
        text.contains("a poll bobbin has no URL and takes no requests"),
        "{text}"
    );
}

#[test]
fn poll_source_test_refuses_a_poll_source() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    std::fs::write(
        dir.path().join("req.http"),
        "POST /hooks/feed HTTP/1.1\n\n{}",
    )
    .unwrap();
    let out = std::process::Command::new(bin())
        .args([
            "--home",
            &dir.path().display().to_string(),
            "source",
            "test",
            "feed",
            "--request",
        ])
        .arg(dir.path().join("req.http"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("feed is a poll source"), "{err}");
}
