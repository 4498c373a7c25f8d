//! Dispatcher tests (spec 4, 5, 6, 12) with a manual clock, a real spool (each test on a SQLite
//! file and, as `<name>::postgres`, on a PostgreSQL database; three that edit SQLite rows
//! directly run on SQLite only) and a real
//! local HTTP receiver whose answers each test scripts.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use hmac::{KeyInit, Mac};
use hookspool::clock::ManualClock;

use super::Advance;
use hookspool::config::{self, PathInputs};
use hookspool::dispatch::Engine;
use hookspool::store::{BatchFilter, BatchRow, Store};

use super::receiver::{Answer, Receiver};

const T0: f64 = 1_800_000_000.0;

tokio::task_local! {
    /// The PostgreSQL spool's URL while a test body runs as `<name>::postgres`.
    static PG_URL: String;
}

/// The `postgres` test of body `$name` (in the module `both_backends` and `postgres_only`
/// make for it): the harness puts its spool on a database of the process's shared
/// PostgreSQL cluster.
macro_rules! on_postgres {
    ($name:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn postgres() {
            let Some(url) = tokio::task::block_in_place(super::super::shared_pg_url) else {
                return;
            };
            super::PG_URL.scope(url, super::$name()).await;
        }
    };
}

/// Test bodies run as `<name>::sqlite` and `<name>::postgres` (issue 32).
macro_rules! both_backends {
    ($($name:ident),+ $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                super::$name().await;
            }
            on_postgres!($name);
        }
    )+};
}

/// Test bodies that only PostgreSQL can run, as `<name>::postgres` (each says why).
macro_rules! postgres_only {
    ($($name:ident),+ $(,)?) => {$(
        mod $name {
            on_postgres!($name);
        }
    )+};
}

/// The spool section of a harness's config, and how to open its spool.
fn spool_of(dir: &std::path::Path) -> (String, Option<String>) {
    match PG_URL.try_with(|u| u.clone()) {
        Ok(url) => {
            let file = dir.join("pg-url");
            std::fs::write(&file, &url).unwrap();
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
            (
                format!(
                    "\n[spool]\nbackend = \"postgres\"\nurl = {{ file = \"{}\" }}\n",
                    file.display()
                ),
                Some(url),
            )
        }
        Err(_) => (String::new(), None),
    }
}

/// A connection to the harness's spool, whichever backend.
fn open_cfg(cfg: &hookspool::config::Config) -> Store {
    cfg.open_spool(hookspool::store::Role::Migrator, Duration::from_secs(30))
        .expect("open the spool")
}
/// The engine as `hookspool dispatch` makes it: on PostgreSQL with a second session that
/// records results beside the tick's claims (`Engine::set_recorder`).
fn engine_of(cfg: Arc<hookspool::config::Config>, store: Store, clock: &ManualClock) -> Engine {
    let recorder = store.is_postgres().then(|| open_cfg(&cfg));
    let mut engine = Engine::new(cfg, store, Arc::new(clock.clone())).unwrap();
    if let Some(rec) = recorder {
        assert!(engine.set_recorder(rec));
    }
    engine
}
const SECRET: &str = "whsec_c2VjcmV0LWZvci10ZXN0cw==";

struct H {
    dir: tempfile::TempDir,
    clock: ManualClock,
    engine: Engine,
    intake: Store,
    rx: Receiver,
}

fn config_text(dir: &std::path::Path, url: &str, extra: &str) -> String {
    format!(
        r#"
[dispatch]
parallel = 8
[sources.s]
scheme = "static-token"
header = "X-Token"
key = "k"
action = "http-recv"
[destinations.http-recv]
type = "http"
url = "{url}"
allow_insecure = true
allow_private = ["127.0.0.1/32"]
timeout_s = 5
max_inflight = 4
secret = {{ file = "{}/secret" }}
{extra}
"#,
        dir.display()
    )
}

async fn harness(extra: &str) -> H {
    harness_with(extra, |t| t).await
}

/// The harness on a config text that `edit` changes first (for keys of tables the base
/// text already opens, such as `[dispatch]` or `[sources.s]`).
async fn harness_with(extra: &str, edit: impl FnOnce(String) -> String) -> H {
    harness_from(|dir, url| edit(config_text(dir, url, extra))).await
}

/// The harness on the config text `make` writes for the home and the receiver's URL.
async fn harness_from(make: impl FnOnce(&std::path::Path, &str) -> String) -> H {
    let rx = Receiver::start().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("secret"), SECRET).unwrap();
    let (section, _) = spool_of(dir.path());
    let text = make(dir.path(), &rx.url()) + &section;
    let inputs = PathInputs {
        home_flag: Some(dir.path().into()),
        ..Default::default()
    };
    let (cfg, _) = config::parse(&text, None, &inputs, true).unwrap_or_else(|e| panic!("{e:?}"));
    let clock = ManualClock::new(T0);
    let store = open_cfg(&cfg);
    let intake = open_cfg(&cfg);
    let engine = engine_of(Arc::new(cfg), store, &clock);
    H {
        dir,
        clock,
        engine,
        intake,
        rx,
    }
}

impl H {
    fn enqueue(&mut self, key: &str, payload: &str) -> i64 {
        self.enqueue_to(key, payload, None)
    }

    /// `enqueue`, to `destination` instead of the route's own when given (same route).
    fn enqueue_to(&mut self, key: &str, payload: &str, destination: Option<&str>) -> i64 {
        let cfg = self.engine.config().clone();
        let s = &cfg.sources["s"];
        let attrs = BTreeMap::new();
        let r = cfg
            .route(&hookspool::config::RouteQuery {
                source: s,
                attrs: &attrs,
                event_action: None,
                destination: None,
            })
            .unwrap();
        let mut primary = r.primary;
        if let Some(d) = destination {
            primary.destination = d.into();
        }
        let req = hookspool::store::EnqueueRequest {
            source: "s".into(),
            key: key.into(),
            event_type: "t".into(),
            dedup_id: None,
            dedup_window_s: 86_400.0,
            payload: Some(payload.into()),
            raw: None,
            headers: "{}".into(),
            primary,
            tees: r.tees,
            quarantine: None,
            now: self.clock.now_f(),
        };
        match self.intake.enqueue(&req).unwrap() {
            hookspool::store::EnqueueOutcome::Queued { copies } => copies[0].1,
            o => panic!("{o:?}"),
        }
    }

    /// The next `n` finished workers' results, kept by the engine for its next tick (not
    /// recorded yet), each within 20 s.
    async fn results(&mut self, n: usize) {
        for _ in 0..n {
            let done = tokio::time::timeout(Duration::from_secs(20), self.engine.next_finished())
                .await
                .expect("a result within 20 s")
                .expect("a result");
            self.engine.accept(done);
        }
    }

    /// One tick, then wait for every attempt it started.
    async fn step(&mut self) -> Vec<i64> {
        let rep = self.engine.tick().unwrap();
        assert!(
            self.engine.drain(Duration::from_secs(20)).await.unwrap(),
            "workers finished"
        );
        rep.claimed
    }

    fn batch(&self, id: i64) -> BatchRow {
        self.intake.batch(id).unwrap()
    }

    fn due_in(&self, id: i64) -> f64 {
        self.batch(id).next_attempt_at.unwrap() - self.clock.now_f()
    }
}

trait NowF {
    fn now_f(&self) -> f64;
}
impl NowF for ManualClock {
    fn now_f(&self) -> f64 {
        hookspool::clock::Clock::now(self)
    }
}

fn sign(secret: &str, id: &str, ts: &str, body: &[u8]) -> String {
    let key = base64::engine::general_purpose::STANDARD
        .decode(secret.trim_start_matches("whsec_"))
        .unwrap();
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&key).unwrap();
    mac.update(format!("{id}.{ts}.").as_bytes());
    mac.update(body);
    base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
}

async fn a_batch_is_delivered_with_a_verifiable_document() {
    let mut h = harness("").await;
    let b = h.enqueue("k1", r#"{"n":1}"#);
    h.enqueue("k1", r#"{"n":2}"#);
    assert_eq!(h.step().await, vec![b]);
    let reqs = h.rx.requests();
    assert_eq!(reqs.len(), 1);
    let r = &reqs[0];
    let id = r.header("webhook-id").unwrap();
    let ts = r.header("webhook-timestamp").unwrap();
    let sig = r.header("webhook-signature").unwrap();
    assert_eq!(
        sig,
        format!("v1,{}", sign(SECRET, id, ts, &r.body)),
        "independent Standard Webhooks check"
    );
    let inst = h.intake.instance_id().unwrap();
    assert_eq!(id, format!("hs_{inst}_{b}"), "per-batch id for http");
    assert_eq!(r.header("x-hookspool-batch"), Some(b.to_string().as_str()));
    assert_eq!(r.header("x-hookspool-attempt"), Some("1"));
    let doc = r.json();
    assert_eq!(doc["count"], 2);
    assert_eq!(doc["events"], serde_json::json!([{"n": 1}, {"n": 2}]));
    assert_eq!(doc["delivery_id"], id);
    assert_eq!(
        doc["content_hash"],
        serde_json::json!(h.batch(b).content_hash)
    );
    let row = h.batch(b);
    assert_eq!(row.state.as_str(), "delivered");
    let at = h.intake.attempts(b).unwrap();
    assert_eq!(
        (at[0].outcome.map(|o| o.as_str()), at[0].status),
        (Some("ok"), Some(200))
    );
}

async fn transport_failures_back_off_uncounted_and_trip_the_breaker_on_one_key() {
    let mut h = harness("").await;
    h.rx.set_default(Answer::status(502));
    let b = h.enqueue("only", "{}");
    h.step().await;
    let d1 = h.due_in(b);
    assert!((15.0..=18.75).contains(&d1), "first backoff {d1}");
    assert_eq!(h.batch(b).attempts, 0, "transport failures are not counted");
    h.clock.advance(d1);
    h.step().await;
    let d2 = h.due_in(b);
    assert!((30.0..=37.5).contains(&d2), "second backoff {d2}");
    h.clock.advance(d2);
    h.step().await;
    let dest = h.intake.destination("http-recv").unwrap();
    assert_eq!(
        (dest.state.as_str(), dest.cooldown_s),
        ("open", Some(30.0)),
        "one key trips the breaker"
    );
    // While open nothing is claimed, even a due batch: inside the cooldown, the tripped
    // batch is made due by hand and a fresh batch of another key is sealed and due.
    h.clock.set(dest.opened_at.unwrap() + 10.0);
    h.intake.retry_now(b, h.clock.now_f()).unwrap();
    let fresh = h.enqueue("other", "{}");
    let before = h.rx.requests().len();
    assert!(h.step().await.is_empty(), "open breaker claims nothing");
    assert_eq!(h.rx.requests().len(), before, "no request while open");
    assert_eq!(
        h.intake.attempts(b).unwrap().len(),
        3,
        "no attempt row while open"
    );
    assert!(h.intake.attempts(fresh).unwrap().is_empty());
    assert_eq!(h.batch(fresh).state.as_str(), "sealed");
    // After the cooldown: one probe, uncounted; success closes.
    h.clock.set(dest.opened_at.unwrap() + 31.0 + 300.0);
    h.rx.set_default(Answer::status(200));
    assert_eq!(h.step().await, vec![b], "one probe, the oldest due batch");
    assert_eq!(h.step().await, vec![fresh], "closed again: the rest drains");
    let at = h.intake.attempts(b).unwrap();
    let last = at.last().unwrap();
    assert!(last.probe && !last.counted);
    assert_eq!(
        h.intake.destination("http-recv").unwrap().state.as_str(),
        "closed"
    );
    assert_eq!(h.batch(b).state.as_str(), "delivered");
}

async fn status_classes_map_to_counted_uncounted_dead_and_throttle() {
    let mut h = harness("").await;
    // 400: permanent, dead at once.
    h.rx.push(Answer::status(400));
    let b400 = h.enqueue("a", "{}");
    h.step().await;
    assert_eq!(
        (
            h.batch(b400).state.as_str(),
            h.batch(b400).last_class.map(|k| k.as_str())
        ),
        ("dead", Some("permanent"))
    );
    // 401: config, uncounted, at the backoff cap; a reload makes it due at once.
    h.rx.push(Answer::status(401));
    let b401 = h.enqueue("b", "{}");
    h.step().await;
    assert_eq!(h.batch(b401).last_class.map(|k| k.as_str()), Some("config"));
    assert_eq!(h.due_in(b401), 300.0);
    assert_eq!(h.batch(b401).attempts, 0);
    let cfg = h.engine.config().clone();
    assert_eq!(h.engine.reload(cfg).unwrap(), 1);
    assert_eq!(h.due_in(b401), 0.0, "re-dued by a successful reload");
    h.step().await;
    assert_eq!(h.batch(b401).state.as_str(), "delivered");
    // 429 with Retry-After: throttle, uncounted, at Retry-After, and a soft gate.
    h.rx.push(Answer::status(429).header("Retry-After", "120"));
    let b429 = h.enqueue("c", "{}");
    h.step().await;
    assert_eq!(
        h.batch(b429).last_class.map(|k| k.as_str()),
        Some("throttle")
    );
    assert_eq!(h.due_in(b429), 120.0);
    let d = h.intake.destination("http-recv").unwrap();
    assert_eq!(d.retry_after_until, Some(h.clock.now_f() + 120.0));
    assert_eq!(d.state.as_str(), "closed", "429 is neutral for the breaker");
    // 3xx on http: permanent (redirects are never followed).
    h.rx.set_rule(|r| {
        (r.json()["key"] == "d")
            .then(|| Answer::status(302).header("Location", "http://127.0.0.1:1/"))
    });
    h.clock.advance(121.0);
    let b302 = h.enqueue("d", "{}");
    let claimed = h.step().await;
    assert!(claimed.contains(&b302));
    assert_eq!(h.batch(b302).state.as_str(), "dead");
}

async fn pause_holds_everything_and_resume_drains_in_fifo_order() {
    let mut h = harness("").await;
    h.intake
        .pause("http-recv", "test", Some("maintenance"), T0)
        .unwrap();
    let b1 = h.enqueue("k", r#"{"n":1}"#);
    h.engine.tick().unwrap(); // seals b1
    let b2 = h.enqueue("k", r#"{"n":2}"#);
    assert!(h.step().await.is_empty(), "paused: spool only");
    assert!(
        h.intake.attempts(b1).unwrap().is_empty(),
        "no attempt rows while paused"
    );
    h.intake.resume("http-recv", T0).unwrap();
    assert_eq!(h.step().await, vec![b1], "FIFO: the group's head first");
    assert_eq!(h.step().await, vec![b2]);
    let ns: Vec<i64> =
        h.rx.requests()
            .iter()
            .map(|r| r.json()["events"][0]["n"].as_i64().unwrap())
            .collect();
    assert_eq!(ns, vec![1, 2]);
}

/// A tick reads the heads for its free slots first, and the full candidate list when a gate
/// that is not open holds them: a paused destination's backlog ahead of another
/// destination's batch never keeps that batch waiting.
async fn a_closed_destinations_backlog_ahead_never_holds_back_another_destination() {
    let mut h = harness_with("", |t| {
        let table = &t[t.find("[destinations.http-recv]").unwrap()..];
        let other = table.replace("[destinations.http-recv]", "[destinations.other]");
        format!("{t}\n{other}")
    })
    .await;
    h.intake.pause("http-recv", "test", None, T0).unwrap();
    // More heads than a tick with 8 free slots reads first (4 per slot).
    for i in 0..40 {
        h.enqueue(&format!("paused-{i}"), "{}");
    }
    let other = h.enqueue_to("k", r#"{"n":1}"#, Some("other"));
    assert_eq!(h.step().await, vec![other]);
    assert_eq!(h.batch(other).state.as_str(), "delivered");
    assert_eq!(h.rx.requests().len(), 1);
}

async fn a_poison_batch_is_found_by_comparison_and_never_during_a_whole_outage() {
    let mut h = harness("[dispatch.breaker]\ntrip_after = 100\n").await;
    // The receiver crashes on any document that carries the poison key, accepts the rest.
    h.rx.set_rule(|r| (r.json()["key"] == "poison").then(|| Answer::status(500)));
    let p = h.enqueue("poison", "{}");
    h.step().await; // the first failure, alone
    h.clock.advance(1.0);
    let mut failures = 1;
    for round in 0..10 {
        // The destination accepts another batch between two failures of the poison one.
        h.enqueue(&format!("ok{round}"), "{}");
        h.step().await;
        h.clock.advance(h.due_in(p).max(0.0) + 1.0);
        h.step().await;
        let row = h.batch(p);
        if row.state.as_str() == "dead" {
            assert_eq!(row.last_class.map(|k| k.as_str()), Some("poison"));
            break;
        }
        failures += 1;
        h.clock.advance(1.0);
    }
    assert_eq!(
        h.batch(p).state.as_str(),
        "dead",
        "poison after six failures with acceptances between"
    );
    assert_eq!(failures, 5, "the sixth failure completes five strikes");
    let at = h.intake.attempts(p).unwrap();
    assert_eq!(at.len(), 6, "six failures in all: {at:?}");
    assert!(!at.last().unwrap().counted);
    // A whole outage: nothing is accepted in between, so no batch is ever poison.
    let mut h = harness("[dispatch.breaker]\ntrip_after = 100\n").await;
    h.rx.set_default(Answer::status(500));
    let ids: Vec<i64> = (0..3).map(|i| h.enqueue(&format!("k{i}"), "{}")).collect();
    for _ in 0..12 {
        h.step().await;
        let next = ids
            .iter()
            .map(|b| h.batch(*b).next_attempt_at.unwrap())
            .fold(f64::INFINITY, f64::min);
        h.clock.set(next.max(h.clock.now_f()));
    }
    for b in ids {
        assert_eq!(
            h.batch(b).state.as_str(),
            "retry",
            "an outage never kills a batch"
        );
    }
}

async fn probes_rotate_between_due_batches() {
    let mut h = harness("").await;
    h.rx.set_default(Answer::status(503));
    let a = h.enqueue("a", "{}");
    let b = h.enqueue("b", "{}");
    // Trip: three failures across both batches.
    h.step().await;
    for _ in 0..3 {
        h.clock.advance(60.0);
        h.step().await;
    }
    assert_eq!(
        h.intake.destination("http-recv").unwrap().state.as_str(),
        "open"
    );
    let mut probes = vec![];
    for _ in 0..4 {
        let d = h.intake.destination("http-recv").unwrap();
        h.clock
            .set(d.opened_at.unwrap() + d.cooldown_s.unwrap() + 0.5);
        h.clock.advance(400.0); // also past every backoff
        let claimed = h.step().await;
        assert_eq!(claimed.len(), 1, "exactly one probe");
        probes.push(claimed[0]);
    }
    assert!(
        probes.windows(2).all(|w| w[0] != w[1]),
        "rotating: {probes:?}"
    );
    assert!(probes.contains(&a) && probes.contains(&b));
}

/// Issue 28, "a key stays stuck after a flap": a receiver that flaps (500, a success, 502,
/// 503, a 429, 500) leaves a group head in retry with a transport backoff (set from the
/// destination's failure count) longer than the breaker's cooldown, and its key's later
/// batches wait behind it. Once the receiver is healthy, the probe that succeeds and closes
/// the breaker proves it: the destination's transport- and throttle-class retries are due
/// at once, so the whole backlog drains within the cooldown plus a few seconds, every key
/// in FIFO order.
async fn a_key_stays_stuck_after_a_flap_regression_the_closing_probe_makes_the_backlog_due() {
    const KEYS: usize = 6;
    const PER_KEY: i64 = 3;
    const GRACE_S: f64 = 5.0;
    let mut h = harness("").await;
    // The backlog: three sealed batches per key, queued while the destination is paused.
    h.intake.pause("http-recv", "test", None, T0).unwrap();
    let mut ids: Vec<Vec<i64>> = vec![vec![]; KEYS];
    for n in 0..PER_KEY {
        for (k, group) in ids.iter_mut().enumerate() {
            group.push(h.enqueue(&format!("k{k}"), &format!(r#"{{"n":{n}}}"#)));
        }
        assert!(h.step().await.is_empty(), "paused: sealing only");
    }
    h.intake.resume("http-recv", T0).unwrap();
    // The flap: every request of a step gets the same answer; an open breaker is met at the
    // end of its cooldown (one probe), a closed or half-open one a second later.
    for status in [500, 500, 200, 502, 500, 503, 429, 500] {
        h.rx.set_default(Answer::status(status));
        let d = h.intake.destination("http-recv").unwrap();
        let next = match d.state.as_str() {
            "open" => d.opened_at.unwrap() + d.cooldown_s.unwrap(),
            _ => h.clock.now_f() + 1.0,
        };
        h.clock.set(next.max(h.clock.now_f() + 1.0));
        h.step().await;
    }
    let d = h.intake.destination("http-recv").unwrap();
    assert_eq!(
        d.state.as_str(),
        "open",
        "the flap ends with the breaker open"
    );
    // Healthy from now on; the probe goes at the end of the cooldown.
    h.rx.set_default(Answer::status(200));
    let healthy_from = h.rx.requests().len();
    let deadline = d.opened_at.unwrap() + d.cooldown_s.unwrap() + GRACE_S;
    let all: Vec<i64> = ids.iter().flatten().copied().collect();
    let stuck: Vec<BatchRow> = all
        .iter()
        .map(|b| h.batch(*b))
        .filter(|b| b.state.as_str() == "retry" && b.next_attempt_at.unwrap() > deadline)
        .collect();
    assert!(
        stuck
            .iter()
            .any(|b| b.last_class.map(|k| k.as_str()) == Some("transport")),
        "the flap left a transport backoff past the cooldown: {stuck:?}"
    );
    h.clock.set(d.opened_at.unwrap() + d.cooldown_s.unwrap());
    while h.clock.now_f() <= deadline {
        h.step().await;
        if all
            .iter()
            .all(|b| h.batch(*b).state.as_str() == "delivered")
        {
            break;
        }
        h.clock.advance(1.0);
    }
    let left: Vec<(i64, String, String)> = all
        .iter()
        .map(|b| h.batch(*b))
        .filter(|b| b.state.as_str() != "delivered")
        .map(|b| (b.id, b.key, b.state.as_str().to_string()))
        .collect();
    assert!(
        left.is_empty(),
        "not drained within the cooldown plus {GRACE_S} s: {left:?}"
    );
    // FIFO per key: after the recovery each key's batches went out in order, once each.
    let mut sent: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for r in &h.rx.requests()[healthy_from..] {
        let doc = r.json();
        sent.entry(doc["key"].as_str().unwrap().to_string())
            .or_default()
            .push(doc["events"][0]["n"].as_i64().unwrap());
    }
    for (key, ns) in &sent {
        assert!(
            ns.windows(2).all(|w| w[0] < w[1]),
            "key {key} out of order: {ns:?}"
        );
    }
}

async fn clock_backwards_stands_still_even_between_heartbeats_and_forwards_closes_windows() {
    let rx = Receiver::start().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("secret"), SECRET).unwrap();
    let text = config_text(dir.path(), &rx.url(), "")
        .replace("[sources.s]\n", "[sources.s]\nquiet_s = 30\nmax_s = 120\n")
        + &spool_of(dir.path()).0;
    let inputs = PathInputs {
        home_flag: Some(dir.path().into()),
        ..Default::default()
    };
    let (cfg, _) = config::parse(&text, None, &inputs, true).unwrap();
    let clock = ManualClock::new(T0);
    let mut intake = open_cfg(&cfg);
    let mut engine = engine_of(Arc::new(cfg.clone()), open_cfg(&cfg), &clock);
    engine.startup().unwrap();
    let w = hookspool::store::Window {
        quiet_s: 30.0,
        max_s: 120.0,
        max_events: 500,
        max_bytes: 100_000,
    };
    let mut req = super::request("s", "k", "{}", T0, w);
    req.primary.destination = "http-recv".into();
    intake.enqueue(&req).unwrap();
    // The clock steps back an hour: now_eff stays at the last tick, nothing is sealed early
    // and nothing is written with the stepped time.
    clock.set(T0 - 3600.0);
    let rep = engine.tick().unwrap();
    assert_eq!(rep.now_eff, T0);
    assert_eq!(rep.sealed, 0);
    // Forward past the quiet window: the batch seals and is delivered.
    clock.set(T0 + 31.0);
    let rep = engine.tick().unwrap();
    assert_eq!(rep.sealed, 1);
    assert!(engine.drain(Duration::from_secs(10)).await.unwrap());
    assert_eq!(rx.requests().len(), 1);
    // Running for a while, between two heartbeats (heartbeat_s = 10): a step back makes
    // time stand at the latest tick, not at the last heartbeat.
    clock.set(T0 + 35.0);
    assert_eq!(engine.tick().unwrap().now_eff, T0 + 35.0);
    let mut req = super::request("s", "k2", "{}", T0 + 35.0, w);
    req.primary.destination = "http-recv".into();
    intake.enqueue(&req).unwrap();
    clock.set(T0 + 36.0 - 3600.0);
    let rep = engine.tick().unwrap();
    assert_eq!(
        rep.now_eff,
        T0 + 35.0,
        "time never goes backwards in one process"
    );
    assert_eq!(rep.sealed, 0);
    assert_eq!(engine.now_eff(), T0 + 35.0);
    let _ = dir;
}

async fn startup_recovers_leases_and_a_late_mark_is_discarded() {
    let mut h = harness("").await;
    let b = h.enqueue("k", "{}");
    h.engine.tick().unwrap(); // claims and spawns
    // Another process finds the lease expired and recovers it before the worker reports.
    h.intake.recover_all_leases(T0 + 1.0).unwrap();
    assert!(h.engine.drain(Duration::from_secs(10)).await.unwrap());
    let at = h.intake.attempts(b).unwrap();
    assert_eq!(
        at[0].outcome.map(|o| o.as_str()),
        Some("discarded"),
        "the late result is fenced"
    );
    assert_eq!(h.batch(b).state.as_str(), "retry");
    // A new dispatcher's startup recovery: leased rows go to retry, due now, uncounted.
    h.intake
        .claim(
            b,
            "dead-host:1",
            T0 + 100.0,
            T0,
            false,
            hookspool::store::DeliveryId::per_attempt(""),
        )
        .unwrap()
        .unwrap();
    let cfg = h.engine.config().clone();
    let mut fresh = engine_of(cfg.clone(), open_cfg(&cfg), &h.clock);
    assert_eq!(fresh.startup().unwrap(), 1);
    let row = h.batch(b);
    assert_eq!(
        (row.state.as_str(), row.attempts, row.last_error.as_deref()),
        ("retry", 0, Some("lease expired"))
    );
    fresh.tick().unwrap();
    assert!(fresh.drain(Duration::from_secs(10)).await.unwrap());
    assert_eq!(h.batch(b).state.as_str(), "delivered");
    let _ = BatchFilter::default();
}

/// A lease no live worker of this dispatcher holds (a process gone without a restart of
/// this one) is recovered by a tick within `LEASE_CHECK_EVERY_S` of its expiry; the ticks in
/// between do not look for expired leases.
async fn an_expired_lease_is_recovered_within_the_lease_check_interval() {
    let mut h = harness("").await;
    let b = h.enqueue("k", "{}");
    // Sealed once its window has passed, and claimed by another process.
    let t = T0 + 3600.0;
    assert_eq!(h.intake.seal_ready(t).unwrap(), vec![b]);
    h.intake
        .claim(
            b,
            "gone-host:1",
            t + 5.0,
            t,
            false,
            hookspool::store::DeliveryId::per_attempt(""),
        )
        .unwrap()
        .unwrap();
    let every = hookspool::dispatch::LEASE_CHECK_EVERY_S;
    h.clock.set(t + 5.0);
    // Looks (the first tick does), finds the lease not yet expired.
    assert_eq!(h.engine.tick().unwrap().recovered, 0);
    h.clock.set(t + 5.0 + every / 2.0);
    assert_eq!(h.engine.tick().unwrap().recovered, 0, "not looked for yet");
    assert_eq!(h.batch(b).state.as_str(), "leased");
    h.clock.set(t + 5.0 + every);
    let rep = h.engine.tick().unwrap();
    assert_eq!(rep.recovered, 1);
    // Due now, the same tick claimed it again.
    let at = h.intake.attempts(b).unwrap();
    let outcomes: Vec<_> = at.iter().map(|a| (a.outcome, a.error.clone())).collect();
    assert_eq!(
        outcomes,
        vec![
            (
                Some(hookspool::vocab::AttemptOutcome::Retry),
                Some("lease expired".into())
            ),
            (None, None)
        ]
    );
    assert!(h.engine.drain(Duration::from_secs(10)).await.unwrap());
    assert_eq!(h.batch(b).state.as_str(), "delivered");
}

async fn the_worker_deadline_ends_a_stalled_request_before_timeout_s_as_transport() {
    // lease_until = now + timeout_s (5) + lease_grace_s (1); the deadline is 5 s before it,
    // so 1 s after the claim, well before timeout_s would end the request.
    let mut h = harness_with("", |t| {
        t.replace("[dispatch]\n", "[dispatch]\nlease_grace_s = 1\n")
    })
    .await;
    h.rx.push(Answer::status(200).delay(Duration::from_secs(30)));
    let b = h.enqueue("k", "{}");
    let started = std::time::Instant::now();
    h.step().await;
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(4),
        "ended by the 1 s deadline, not by timeout_s (5 s): {took:?}"
    );
    let row = h.batch(b);
    assert_eq!(
        (row.state.as_str(), row.last_class.map(|k| k.as_str())),
        ("retry", Some("transport"))
    );
    let at = &h.intake.attempts(b).unwrap()[0];
    let ms = at.duration_ms.unwrap();
    assert!((900..4000).contains(&ms), "attempt duration {ms} ms");
    assert!(!at.counted);
}

async fn outcomes_open_issues_and_a_success_resolves_the_transient_ones() {
    let mut h = harness("").await;
    let state = |h: &H, fp: &str| h.intake.issue_by_fingerprint(fp).unwrap().map(|i| i.state);
    // A success first: nothing to resolve. The dispatcher then skips the resolving reads on
    // later successes until it opens an issue for the destination itself.
    h.enqueue("first", "{}");
    h.step().await;
    // A permanent failure opens delivery:<dest>:permanent with the batch as its sample.
    h.rx.push(Answer::status(422));
    let b = h.enqueue("a", "{}");
    h.step().await;
    let issue = h
        .intake
        .issue_by_fingerprint("delivery:http-recv:permanent")
        .unwrap()
        .unwrap();
    assert_eq!(
        (issue.state.as_str(), issue.sample_batch_id),
        ("open", Some(b))
    );
    // A 401 opens config:delivery:<dest>.
    h.rx.push(Answer::status(401));
    h.enqueue("b", "{}");
    h.step().await;
    assert_eq!(
        state(&h, "config:delivery:http-recv").as_deref(),
        Some("open")
    );
    // Three transport failures trip the breaker and open delivery:<dest>:http_5xx.
    h.rx.set_default(Answer::status(500));
    let c = h.enqueue("c", "{}");
    for _ in 0..3 {
        h.step().await;
        h.clock.advance(h.due_in(c).max(0.0));
    }
    assert_eq!(
        h.intake.destination("http-recv").unwrap().state.as_str(),
        "open"
    );
    assert_eq!(
        state(&h, "delivery:http-recv:http_5xx").as_deref(),
        Some("open")
    );
    // The probe succeeds: the transient issues resolve; the permanent one waits for replay.
    h.rx.set_default(Answer::status(200));
    let d = h.intake.destination("http-recv").unwrap();
    h.clock.set(d.opened_at.unwrap() + 400.0);
    h.step().await;
    assert_eq!(
        state(&h, "delivery:http-recv:http_5xx").as_deref(),
        Some("resolved")
    );
    assert_eq!(
        state(&h, "config:delivery:http-recv").as_deref(),
        Some("resolved")
    );
    assert_eq!(
        state(&h, "delivery:http-recv:permanent").as_deref(),
        Some("open")
    );
    // After those successes a 401 opens config:delivery again, and the next success, in a
    // later tick, resolves it again.
    // What is still due goes first, so that the 401 is its tick's only attempt.
    for _ in 0..3 {
        if h.step().await.is_empty() {
            break;
        }
    }
    h.rx.push(Answer::status(401));
    let e = h.enqueue("e", "{}");
    assert_eq!(h.step().await, vec![e]);
    assert_eq!(
        state(&h, "config:delivery:http-recv").as_deref(),
        Some("open")
    );
    let f = h.enqueue("f", "{}");
    assert_eq!(h.step().await, vec![f]);
    assert_eq!(
        state(&h, "config:delivery:http-recv").as_deref(),
        Some("resolved")
    );
}

async fn a_degraded_sandbox_is_shown_by_status_and_opens_a_config_issue() {
    let mut h = harness("").await;
    h.engine
        .record_sandbox("no landlock, no seccomp, capabilities kept", false)
        .unwrap();
    let cfg = h.engine.config().clone();
    let doc = hookspool::observe::status::collect(&h.intake, &cfg, T0).unwrap();
    assert!(
        doc["degraded"].to_string().contains("sandbox_degraded"),
        "{doc}"
    );
    assert_eq!(
        doc["sandbox"]["enforced"],
        "no landlock, no seccomp, capabilities kept"
    );
    let issue = h
        .intake
        .issue_by_fingerprint("config:sandbox")
        .unwrap()
        .unwrap();
    assert_eq!(issue.state.as_str(), "open");
    // A later start on a kernel that enforces everything resolves it.
    h.engine
        .record_sandbox(
            "landlock full (ABI 7), seccomp on, capabilities dropped",
            true,
        )
        .unwrap();
    assert_eq!(
        h.intake
            .issue_by_fingerprint("config:sandbox")
            .unwrap()
            .unwrap()
            .state,
        "resolved"
    );
    let doc = hookspool::observe::status::collect(&h.intake, &cfg, T0).unwrap();
    assert!(!doc["degraded"].to_string().contains("sandbox"), "{doc}");
}

async fn a_failing_script_is_counted_every_time_and_dies_at_max_attempts() {
    let rx = Receiver::start().await;
    let dir = tempfile::tempdir().unwrap();
    let scripts = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("secret"), SECRET).unwrap();
    let script = scripts.path().join("fail.sh");
    super::executable(&script, "#!/bin/sh\ncat >/dev/null\nexit 1\n");
    let text = config_text(
        dir.path(),
        &rx.url(),
        &format!(
            "[destinations.\"script:fail\"]\nargv = [\"{}\"]\ntimeout_s = 10\n",
            script.display()
        ),
    )
    .replace("action = \"http-recv\"", "action = \"script:fail\"")
    .replace("[dispatch]\n", "[dispatch]\nmax_attempts = 3\n")
        + &spool_of(dir.path()).0;
    let inputs = PathInputs {
        home_flag: Some(dir.path().into()),
        ..Default::default()
    };
    let (cfg, _) = config::parse(&text, None, &inputs, true).unwrap_or_else(|e| panic!("{e:?}"));
    let clock = ManualClock::new(T0);
    let intake = open_cfg(&cfg);
    let store = open_cfg(&cfg);
    let engine = engine_of(Arc::new(cfg), store, &clock);
    let mut h = H {
        dir,
        clock,
        engine,
        intake,
        rx,
    };
    let b = h.enqueue("k", "{}");
    h.step().await;
    let row = h.batch(b);
    assert_eq!(
        (
            row.state.as_str(),
            row.last_class.map(|k| k.as_str()),
            row.attempts
        ),
        ("retry", Some("batch"), 1),
        "a non-zero exit is counted"
    );
    let d1 = h.due_in(b);
    assert!(
        (15.0..=18.75).contains(&d1),
        "backoff on the attempt count: {d1}"
    );
    assert_eq!(
        h.intake.destination("script:fail").unwrap().state.as_str(),
        "closed",
        "a script that ran is neutral for the breaker"
    );
    h.clock.advance(d1);
    h.step().await;
    assert_eq!(h.batch(b).attempts, 2);
    h.clock.advance(h.due_in(b));
    h.step().await;
    let row = h.batch(b);
    assert_eq!(
        row.state.as_str(),
        "dead",
        "dead at max_attempts counted attempts"
    );
    assert_eq!(
        (row.attempts, row.last_class.map(|k| k.as_str())),
        (3, Some("batch")),
        "the failure that exhausts max_attempts is counted too"
    );
    let at = h.intake.attempts(b).unwrap();
    let rows: Vec<(Option<&str>, bool)> = at
        .iter()
        .map(|a| (a.outcome.map(|o| o.as_str()), a.counted))
        .collect();
    assert_eq!(
        rows,
        vec![
            (Some("retry"), true),
            (Some("retry"), true),
            (Some("dead"), true)
        ],
        "every batch-class attempt is counted"
    );
    let issue = h
        .intake
        .issue_by_fingerprint("delivery:script:fail:exhausted")
        .unwrap()
        .unwrap();
    assert_eq!(issue.sample_batch_id, Some(b));
    drop(scripts);
}

async fn a_discarded_result_changes_nothing_but_its_own_attempt_row() {
    let mut h = harness("").await;
    // Both answers would change the destination row if applied: a 429 with Retry-After sets
    // retry_after_until, a 500 counts a breaker failure.
    h.rx.set_rule(|r| {
        let delayed = |a: Answer| Some(a.delay(Duration::from_millis(500)));
        match r.json()["key"].as_str() {
            Some("throttled") => delayed(Answer::status(429).header("Retry-After", "120")),
            _ => delayed(Answer::status(500)),
        }
    });
    let t = h.enqueue("throttled", "{}");
    let f = h.enqueue("failing", "{}");
    h.engine.tick().unwrap();
    // While both are in flight another process recovers their leases, and an operator
    // pauses the destination.
    h.intake.recover_all_leases(T0 + 1.0).unwrap();
    h.intake
        .pause("http-recv", "operator", Some("maintenance"), T0 + 1.0)
        .unwrap();
    let dest_before = h.intake.destination("http-recv").unwrap();
    let (tb, fb) = (h.batch(t), h.batch(f));
    assert!(h.engine.drain(Duration::from_secs(10)).await.unwrap());
    assert_eq!(
        h.intake.destination("http-recv").unwrap(),
        dest_before,
        "no breaker count, no Retry-After, and the pause kept"
    );
    assert_eq!(h.batch(t), tb, "the batch rows are as recovery left them");
    assert_eq!(h.batch(f), fb);
    for (b, status) in [(t, 429), (f, 500)] {
        let at = h.intake.attempts(b).unwrap();
        assert_eq!(at.len(), 1);
        assert_eq!(
            (
                at[0].outcome.map(|o| o.as_str()),
                at[0].status,
                at[0].counted
            ),
            (Some("discarded"), Some(status), false),
            "its own attempt row records the late result"
        );
    }
}

/// A script destination named `script:emit` running `body`, the source routed to it.
fn script_harness_edit(scripts: &std::path::Path, body: &str) -> impl FnOnce(String) -> String {
    let script = scripts.join("emit.sh");
    super::executable(&script, &format!("#!/bin/sh\ncat >/dev/null\n{body}"));
    let table = format!(
        "[destinations.\"script:emit\"]\nargv = [\"{}\"]\ntimeout_s = 10\n",
        script.display()
    );
    move |t: String| t.replace("action = \"http-recv\"", "action = \"script:emit\"") + &table
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_emit_the_store_refuses_is_a_bad_emit_and_the_second_in_a_row_is_permanent() {
    let scripts = tempfile::tempdir().unwrap();
    let edit = script_harness_edit(
        scripts.path(),
        r#"echo '{"enqueue": {"source": "s", "key": "k2", "dedup_id": "dup-1", "payload": {"n": 1}, "destination": "http-recv"}}'
"#,
    );
    let mut h = harness_with("", edit).await;
    // The one refusal the store makes of an emit that passed validation: its dedup id
    // points at an event of a dead quarantine batch, whose replay the store refuses.
    let mut q = super::request(
        "s",
        "quarantine",
        "{}",
        T0,
        super::window(0.0, 0.0, 1, 1000),
    );
    q.source = "s".into();
    q.payload = None;
    q.raw = Some(b"{}".to_vec());
    q.quarantine = Some(hookspool::store::Quarantine {
        error_class: "Test".into(),
    });
    let hookspool::store::EnqueueOutcome::Quarantined { event_id, .. } =
        h.intake.enqueue(&q).unwrap()
    else {
        panic!("quarantined");
    };
    let db = rusqlite::Connection::open(h.dir.path().join("spool.db")).unwrap();
    db.execute(
        "INSERT INTO dedup (source, dedup_id, event_id, seen_at) VALUES ('s', 'dup-1', ?1, ?2)",
        rusqlite::params![event_id, T0],
    )
    .unwrap();
    let b = h.enqueue("k", "{}");
    h.step().await;
    let row = h.batch(b);
    assert_eq!(
        (
            row.state.as_str(),
            row.last_class.map(|k| k.as_str()),
            row.attempts
        ),
        ("retry", Some("batch"), 1),
        "recorded like every other outcome: a counted batch failure, not a leased batch"
    );
    assert!(
        row.last_error
            .as_deref()
            .is_some_and(|e| e.starts_with("bad emit refused by the spool")),
        "{:?}",
        row.last_error
    );
    let at = h.intake.attempts(b).unwrap();
    assert_eq!(
        (
            at[0].outcome.map(|o| o.as_str()),
            at[0].status,
            at[0].counted
        ),
        (Some("retry"), Some(0), true)
    );
    assert!(
        h.intake
            .list_batches(&BatchFilter {
                source: Some("s".into()),
                limit: 10,
                ..Default::default()
            })
            .unwrap()
            .iter()
            .all(|x| x.key != "k2"),
        "nothing of the emit was kept"
    );
    h.clock.advance(h.due_in(b));
    h.step().await;
    let row = h.batch(b);
    assert_eq!(
        (row.state.as_str(), row.last_class.map(|k| k.as_str())),
        ("dead", Some("permanent")),
        "bad emit twice, then permanent"
    );
    assert!(
        h.intake
            .issue_by_fingerprint("delivery:script:emit:permanent")
            .unwrap()
            .is_some()
    );
}

async fn attempts_are_counted_exactly_as_spec_6_5_says() {
    let mut h = harness("").await;
    // (answer, counted, batch.attempts after it)
    let cases = [
        (Answer::status(200), true, 1),
        (Answer::status(500), false, 0),
        (Answer::status(429), false, 0),
        (Answer::status(401), false, 0),
        (Answer::status(422), false, 0),
    ];
    for (i, (answer, counted, attempts)) in cases.into_iter().enumerate() {
        h.rx.push(answer);
        let b = h.enqueue(&format!("k{i}"), "{}");
        h.step().await;
        let at = h.intake.attempts(b).unwrap();
        assert_eq!(at.len(), 1);
        assert_eq!(
            (at[0].counted, h.batch(b).attempts),
            (counted, attempts),
            "case {i}: {:?}",
            at[0]
        );
        h.clock.advance(1.0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttles_without_retry_after_back_off_on_the_batchs_own_run_and_open_an_issue_past_the_threshold()
 {
    let mut h = harness_with("", |t| {
        t.replace("[dispatch]\n", "[dispatch]\nthrottle_alert_s = 100\n")
    })
    .await;
    h.rx.set_default(Answer::status(429));
    let b = h.enqueue("k", "{}");
    let mut dues = vec![];
    for _ in 0..4 {
        h.step().await;
        let d = h.due_in(b);
        dues.push(d);
        h.clock.advance(d);
    }
    for (n, d) in dues.iter().enumerate() {
        let base = 15.0 * 2f64.powi(n as i32);
        assert!(
            (base..=base * 1.25).contains(d),
            "throttle {} backs off {d}, expected {base}..{}: {dues:?}",
            n + 1,
            base * 1.25
        );
    }
    assert_eq!(h.batch(b).attempts, 0, "throttles are not counted");
    assert_eq!(
        h.intake.destination("http-recv").unwrap().state.as_str(),
        "closed",
        "neutral for the breaker"
    );
    // Throttled since the first answer for longer than 100 s.
    let issue = h
        .intake
        .issue_by_fingerprint("delivery:http-recv:throttled")
        .unwrap()
        .expect("a destination that only throttles opens an issue");
    assert_eq!(issue.state, "open");
    h.rx.set_default(Answer::status(200));
    h.step().await;
    assert_eq!(h.batch(b).state.as_str(), "delivered");
    assert_eq!(
        h.intake
            .issue_by_fingerprint("delivery:http-recv:throttled")
            .unwrap()
            .unwrap()
            .state,
        "resolved"
    );
}

/// Issue 28's note "a destination that stays throttled opens no issue": the time a
/// destination has answered only throttles was kept in the dispatcher's memory alone, so a
/// dispatcher restarted more often than dispatch.throttle_alert_s (a crash, a deploy, the
/// supervisor) never opened the issue. It is now read back from the spool: the batch's run
/// of throttled attempts, since the destination's last success.
async fn a_throttled_destination_opens_its_issue_past_the_threshold_across_a_dispatcher_restart() {
    let mut h = harness_with("", |t| {
        t.replace("[dispatch]\n", "[dispatch]\nthrottle_alert_s = 100\n")
    })
    .await;
    h.rx.set_default(Answer::status(429));
    let issue = |h: &H| {
        h.intake
            .issue_by_fingerprint("delivery:http-recv:throttled")
            .unwrap()
            .map(|i| i.state)
    };
    let b = h.enqueue("k", "{}");
    // Three throttles (backoffs of 15 and 30 s, plus jitter) in the first process.
    for _ in 0..3 {
        h.step().await;
        h.clock.advance(h.due_in(b));
    }
    let at = h.intake.attempts(b).unwrap();
    assert!(at[2].started_at - at[0].started_at < 100.0, "{at:?}");
    assert_eq!(issue(&h), None, "not yet past the threshold");
    // A new dispatcher on the same spool, as after a restart.
    let cfg = h.engine.config().clone();
    let store = open_cfg(&cfg);
    h.engine = engine_of(cfg, store, &h.clock);
    // Its first throttle comes more than 100 s after the first one.
    h.step().await;
    let at = h.intake.attempts(b).unwrap();
    assert_eq!(at.len(), 4);
    assert!(at[3].started_at - at[0].started_at >= 100.0, "{at:?}");
    assert_eq!(issue(&h).as_deref(), Some("open"));
    h.rx.set_default(Answer::status(200));
    h.clock.advance(h.due_in(b));
    h.step().await;
    assert_eq!(issue(&h).as_deref(), Some("resolved"));
}

async fn maintenance_runs_every_60_s_not_every_heartbeat() {
    // A source silent for more than 5 s: only the maintenance tick notices.
    let mut h = harness_with("", |t| {
        t.replace("[sources.s]\n", "[sources.s]\nexpect_every_s = 5\n")
    })
    .await;
    let silent = |h: &H| {
        h.intake
            .issue_by_fingerprint("source_silent:s")
            .unwrap()
            .map(|i| i.state)
    };
    h.step().await; // maintenance at T0: the expectation starts
    h.clock.set(T0 + 10.0); // a heartbeat (heartbeat_s = 10), not a maintenance tick
    h.step().await;
    assert_eq!(silent(&h), None, "no maintenance 10 s after the last");
    h.clock.set(T0 + 59.0);
    h.step().await;
    assert_eq!(silent(&h), None);
    h.clock.set(T0 + 60.0);
    h.step().await;
    assert_eq!(
        silent(&h).as_deref(),
        Some("open"),
        "the 60 s maintenance tick"
    );
}

/// The base config with `[sources.s]` making one batch per event, `http-recv` limited by
/// `limit` (lines of its table) and `other`, the same receiver without a limit.
fn rate_config(dir: &std::path::Path, url: &str, limit: &str) -> String {
    let t = config_text(dir, url, "").replace(
        "action = \"http-recv\"",
        "action = \"http-recv\"\nmax_events = 1",
    );
    let table = &t[t.find("[destinations.http-recv]").unwrap()..];
    let other = table.replace("[destinations.http-recv]", "[destinations.other]");
    format!("{t}{limit}\n{other}")
}

/// Issue 35 on the test clock: a batch held by its destination's request rate stays due
/// (no attempt row, no state change, head of its key), the loop is told to wake when the
/// next token is due, and the backlog starts one batch per token in FIFO order per key,
/// while a destination without a limit is claimed at once. A reload applies a new limit.
async fn a_rate_limited_destination_holds_batches_due_and_starts_one_per_token_fifo_per_key() {
    let mut h = harness_from(|dir, url| rate_config(dir, url, "max_per_s = 2\nburst = 1")).await;
    let a: Vec<i64> = (1..=3)
        .map(|n| h.enqueue("a", &format!(r#"{{"k":"a","n":{n}}}"#)))
        .collect();
    let b1 = h.enqueue("b", r#"{"k":"b","n":1}"#);
    let o: Vec<i64> = (1..=3)
        .map(|n| h.enqueue_to(&format!("o{n}"), r#"{"k":"o"}"#, Some("other")))
        .collect();
    // One token (burst = 1): the oldest head of http-recv, and every batch of `other`.
    let mut first = h.step().await;
    first.sort();
    assert_eq!(first, vec![a[0], o[0], o[1], o[2]]);
    assert_eq!(h.batch(b1).state.as_str(), "sealed", "held: it stays due");
    assert!(
        h.intake.attempts(b1).unwrap().is_empty(),
        "held is no attempt"
    );
    let wait = h.engine.next_wait(Duration::from_secs(60));
    assert!(
        (wait.as_secs_f64() - 0.5).abs() < 1e-6,
        "the loop wakes for the next token (1 / max_per_s), not at poll_s: {wait:?}"
    );
    // The same instant again: no token, nothing starts.
    assert!(h.step().await.is_empty());
    // One token every 0.5 s, oldest head first: a2, a3 (same first_at, older ids), then b1.
    for want in [a[1], a[2], b1] {
        h.clock.advance(0.5);
        assert_eq!(h.step().await, vec![want]);
        assert!(h.step().await.is_empty(), "one token, one start");
    }
    for id in a.iter().chain([&b1]) {
        assert_eq!(h.batch(*id).state.as_str(), "delivered");
        assert_eq!(h.intake.attempts(*id).unwrap().len(), 1, "one attempt each");
    }
    let ns: Vec<i64> =
        h.rx.requests()
            .iter()
            .filter(|r| r.json()["events"][0]["k"] == "a")
            .map(|r| r.json()["events"][0]["n"].as_i64().unwrap())
            .collect();
    assert_eq!(ns, vec![1, 2, 3], "FIFO per key");
    assert_eq!(
        h.engine.next_wait(Duration::from_secs(60)),
        Duration::from_secs(60),
        "nothing held: the poll interval"
    );

    // A reload to a higher limit applies at once: burst = 3 starts three together.
    let c: Vec<i64> = (1..=4)
        .map(|n| h.enqueue(&format!("c{n}"), r#"{"k":"c"}"#))
        .collect();
    let text = rate_config(h.dir.path(), &h.rx.url(), "max_per_s = 3");
    let inputs = PathInputs {
        home_flag: Some(h.dir.path().into()),
        ..Default::default()
    };
    let (cfg, _) = config::parse(&text, None, &inputs, true).unwrap();
    h.engine.reload(Arc::new(cfg)).unwrap();
    h.clock.advance(10.0);
    assert_eq!(h.step().await, c[..3].to_vec(), "ceil(3) tokens saved");
    h.clock.advance(1.0 / 3.0);
    assert_eq!(h.step().await, vec![c[3]]);
}

/// Regression (issue 30): a stored payload that no longer reads as JSON was delivered as
/// `null` in its event's place. A sealed batch with such a payload now goes dead with the
/// event named and nothing is sent; an open one fails its seal (the tick errs and writes
/// nothing) instead of being hashed over a `null`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_stored_payload_fails_loudly_instead_of_becoming_null() {
    let mut h = harness("[coalesce]\nmax_events = 1\n").await;
    let sealed = h.enqueue("k1", r#"{"n":1}"#);
    assert_eq!(
        h.batch(sealed).state.as_str(),
        "sealed",
        "max_events = 1 seals at once"
    );
    let db = rusqlite::Connection::open(h.dir.path().join("spool.db")).unwrap();
    db.execute(
        "UPDATE events SET payload = '{\"n\":1' WHERE batch_id = ?1",
        [sealed],
    )
    .unwrap();
    assert_eq!(h.step().await, vec![sealed]);
    assert!(h.rx.requests().is_empty(), "nothing was sent");
    let row = h.batch(sealed);
    assert_eq!(
        (row.state.as_str(), row.last_class.map(|k| k.as_str())),
        ("dead", Some("permanent"))
    );
    let event_id: i64 = db
        .query_row("SELECT id FROM events WHERE batch_id = ?1", [sealed], |r| {
            r.get(0)
        })
        .unwrap();
    let error = row.last_error.unwrap_or_default();
    assert!(
        error.contains(&format!("event {event_id}'s stored payload is not JSON")),
        "{error}"
    );
}

/// The seal's half of the regression above: an open batch whose payload no longer reads is
/// not hashed over a `null`; the tick fails with the spool's error and the batch stays open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_payload_in_an_open_batch_fails_its_seal_and_writes_nothing() {
    let mut h = harness("").await;
    let open = h.enqueue("k1", r#"{"n":1}"#);
    assert_eq!(h.batch(open).state.as_str(), "open");
    let db = rusqlite::Connection::open(h.dir.path().join("spool.db")).unwrap();
    db.execute(
        "UPDATE events SET payload = 'nope' WHERE batch_id = ?1",
        [open],
    )
    .unwrap();
    let err = h.engine.tick().unwrap_err().to_string();
    assert!(err.contains("stored payload is not JSON"), "{err}");
    let row = h.batch(open);
    assert_eq!((row.state.as_str(), row.content_hash), ("open", None));
    assert!(h.rx.requests().is_empty());
}

/// Under load on PostgreSQL the loop gathers results before it ticks
/// (`Engine::gather_results`): with four attempts in flight, three results in and the
/// fourth held by its receiver, the tick waits for the fourth, and stops after
/// `GATHER_MAX`; a lone attempt's result, or one beside attempts in flight for longer than
/// `GATHER_RECENT_S`, waits for nothing. On SQLite nothing waits.
async fn results_are_gathered_until_all_those_in_flight_are_in_on_postgres() {
    let mut h = harness("").await;
    // The first request the receiver gets is answered after 2 s.
    h.rx.push(Answer::status(200).delay(Duration::from_secs(2)));
    for key in ["ka", "kb", "kc", "kd"] {
        h.enqueue(key, "{}");
    }
    assert_eq!(h.engine.tick().unwrap().claimed.len(), 4);
    // Every request in; the three answered results taken (beyond half: the old rule of
    // waiting for half of those in flight would not wait now).
    h.rx.wait_for(4, Duration::from_secs(20)).await;
    h.results(3).await;
    if h.engine.store().is_postgres() {
        let started = std::time::Instant::now();
        h.engine.gather_results().await;
        let waited = started.elapsed();
        assert!(
            waited >= hookspool::dispatch::engine::GATHER_MAX,
            "it waited for the fourth ({waited:?})"
        );
        assert!(
            waited < Duration::from_secs(1),
            "for GATHER_MAX only ({waited:?})"
        );
    } else {
        let at_once = tokio::time::timeout(Duration::ZERO, h.engine.gather_results()).await;
        assert!(at_once.is_ok(), "SQLite waits for nothing");
    }
    assert_eq!(h.engine.unrecorded(), 3);
    assert_eq!(h.engine.tick().unwrap().recorded, 3);
    h.results(1).await;
    assert_eq!(h.engine.tick().unwrap().recorded, 1);
    h.enqueue("ke", "{}");
    assert_eq!(h.engine.tick().unwrap().claimed.len(), 1);
    h.results(1).await;
    let at_once = tokio::time::timeout(Duration::ZERO, h.engine.gather_results()).await;
    assert!(at_once.is_ok(), "one of one is all: no wait");
    assert_eq!(h.engine.unrecorded(), 1);
    assert_eq!(h.engine.tick().unwrap().recorded, 1);
    // Beside two attempts in flight for longer than GATHER_RECENT_S (their receiver holds
    // them), a result waits for nothing.
    for key in ["kf", "kg"] {
        h.rx.push(Answer::status(200).delay(Duration::from_secs(3)));
        h.enqueue(key, "{}");
    }
    assert_eq!(h.engine.tick().unwrap().claimed.len(), 2);
    h.rx.wait_for(7, Duration::from_secs(20)).await;
    h.clock.advance(1.0);
    h.enqueue("kh", "{}");
    assert_eq!(h.engine.tick().unwrap().claimed.len(), 1);
    h.results(1).await;
    let at_once = tokio::time::timeout(Duration::ZERO, h.engine.gather_results()).await;
    assert!(at_once.is_ok(), "the slow attempts are not waited for");
    h.results(2).await;
    assert_eq!(h.engine.tick().unwrap().recorded, 3);
}

both_backends!(
    results_are_gathered_until_all_those_in_flight_are_in_on_postgres,
    clock_backwards_stands_still_even_between_heartbeats_and_forwards_closes_windows,
    startup_recovers_leases_and_a_late_mark_is_discarded,
    an_expired_lease_is_recovered_within_the_lease_check_interval,
    a_failing_script_is_counted_every_time_and_dies_at_max_attempts,
    a_throttled_destination_opens_its_issue_past_the_threshold_across_a_dispatcher_restart,
    a_batch_is_delivered_with_a_verifiable_document,
    transport_failures_back_off_uncounted_and_trip_the_breaker_on_one_key,
    status_classes_map_to_counted_uncounted_dead_and_throttle,
    pause_holds_everything_and_resume_drains_in_fifo_order,
    a_closed_destinations_backlog_ahead_never_holds_back_another_destination,
    a_poison_batch_is_found_by_comparison_and_never_during_a_whole_outage,
    probes_rotate_between_due_batches,
    a_key_stays_stuck_after_a_flap_regression_the_closing_probe_makes_the_backlog_due,
    the_worker_deadline_ends_a_stalled_request_before_timeout_s_as_transport,
    outcomes_open_issues_and_a_success_resolves_the_transient_ones,
    a_degraded_sandbox_is_shown_by_status_and_opens_a_config_issue,
    a_discarded_result_changes_nothing_but_its_own_attempt_row,
    attempts_are_counted_exactly_as_spec_6_5_says,
    maintenance_runs_every_60_s_not_every_heartbeat,
    a_rate_limited_destination_holds_batches_due_and_starts_one_per_token_fifo_per_key,
);

/// On PostgreSQL a tick's successes are recorded by a second session while the tick's own
/// seals and claims with the slots they free (`Engine::set_recorder`). PostgreSQL only:
/// SQLite has one writer at a time, so its results share the tick's transaction. Shown by
/// holding the destination row from a third session: the recording waits for it (the
/// recorder locks the rows it decides on, taking no spool write lock) and is refused after
/// its lock timeout, while the claims of the same tick go on; the results being recorded are
/// no expired leases to recover; once the row is free, every result is recorded, once.
async fn results_recorded_beside_the_claims() {
    let url = PG_URL.with(|u| u.clone());
    let mut h = harness_with("", |t| t.replace("parallel = 8", "parallel = 2")).await;
    let cfg = h.engine.config().clone();
    let short = cfg
        .open_spool(hookspool::store::Role::Reader, Duration::from_millis(300))
        .unwrap();
    assert!(h.engine.set_recorder(short));
    let (a, b) = (h.enqueue("ka", "{}"), h.enqueue("kb", "{}"));
    assert_eq!(h.engine.tick().unwrap().claimed, vec![a, b]);
    h.results(2).await;
    // Two results and two new batches: the results free both slots for this tick's claims.
    let (c, d) = (h.enqueue("kc", "{}"), h.enqueue("kd", "{}"));
    let rep = h.engine.tick().unwrap();
    assert_eq!((rep.recorded, rep.claimed), (2, vec![c, d]));
    for id in [a, b] {
        assert_eq!(h.batch(id).state.as_str(), "delivered");
    }
    // A group's next batch waits behind its head until the head's mark commits, which the
    // claims beside it may not see: the tick after a recording beside them comes at once,
    // with no wake-up, and claims it.
    h.results(2).await;
    let g = h.enqueue("kg", "{}");
    assert_eq!(h.engine.tick().unwrap().claimed, vec![g]);
    h.results(1).await;
    let g2 = h.enqueue("kg", "{}");
    let mut rep = h.engine.tick().unwrap();
    assert_eq!(rep.recorded, 1);
    assert_eq!(
        h.engine.next_wait(Duration::from_secs(5)),
        Duration::ZERO,
        "the next tick at once"
    );
    if rep.claimed.is_empty() {
        rep = h.engine.tick().unwrap();
    }
    assert_eq!(rep.claimed, vec![g2]);
    h.results(1).await;
    // The destination row held by another session; g2's lease long expired.
    let (e, f) = (h.enqueue("ke", "{}"), h.enqueue("kf", "{}"));
    h.clock.advance(100.0);
    let holder = tokio::task::block_in_place(|| {
        let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        c.batch_execute(
            "BEGIN; INSERT INTO destinations (name) VALUES ('http-recv') ON CONFLICT DO NOTHING;
             SELECT name FROM destinations WHERE name = 'http-recv' FOR UPDATE;",
        )
        .unwrap();
        c
    });
    let rep = h.engine.tick().unwrap();
    assert_eq!(
        (rep.recorded, rep.claimed.clone()),
        (0, vec![e, f]),
        "the recording waits for the row and is refused; the claims do not wait: {rep:?}"
    );
    assert_eq!(
        h.batch(g2).state.as_str(),
        "leased",
        "a result being recorded is no expired lease to recover"
    );
    tokio::task::block_in_place(move || {
        let mut holder = holder;
        holder.batch_execute("ROLLBACK").unwrap();
        drop(holder);
    });
    // The refused result waits out the recording backoff, then the tick's own session
    // records it and the others (the recorder rests after its refusal).
    let until = std::time::Instant::now() + Duration::from_secs(20);
    let all = [a, b, c, d, g, g2, e, f];
    while all
        .iter()
        .any(|id| h.batch(*id).state.as_str() != "delivered")
    {
        assert!(
            std::time::Instant::now() < until,
            "every batch delivered within 20 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        h.engine.tick().unwrap();
    }
    for id in all {
        let at = h.intake.attempts(id).unwrap();
        assert_eq!(at.len(), 1, "batch {id}: one attempt: {at:?}");
        assert_eq!(
            at[0].outcome.map(|o| o.as_str()),
            Some("ok"),
            "batch {id}: {at:?}"
        );
    }
    assert_eq!(h.rx.requests().len(), all.len(), "each batch sent once");
    let row = h.intake.destination("http-recv").unwrap();
    assert_eq!(row.consecutive_failures, 0);
    assert!(row.last_ok_at.is_some());
}

/// On PostgreSQL a success recorded beside the claims that closes an open breaker (an
/// attempt that was in flight when it opened) makes the destination's transport retries due
/// once the claims have committed, not in the recorder's transaction, whose UPDATE of retry
/// batches could wait for the claims' locks; the tick that claims them comes at once.
/// PostgreSQL only, as `results_recorded_beside_the_claims`.
async fn a_success_recorded_beside_the_claims_that_closes_the_breaker_makes_retries_due() {
    let mut h = harness("").await;
    // A transport failure: y waits for its backoff.
    h.rx.set_default(Answer::status(500));
    let y = h.enqueue("ky", "{}");
    assert_eq!(h.step().await, vec![y]);
    let waits = h.due_in(y);
    assert!(waits >= 1.0, "a transport backoff: {waits}");
    // x in flight and answered 200, its result not yet recorded, when the breaker opens.
    h.rx.set_default(Answer::status(200));
    let x = h.enqueue("kx", "{}");
    assert_eq!(h.engine.tick().unwrap().claimed, vec![x]);
    h.results(1).await;
    let now = h.clock.now_f();
    h.intake
        .update_destination("http-recv", |d| {
            d.state = hookspool::vocab::BreakerState::Open;
            d.opened_at = Some(now);
            d.cooldown_s = Some(600.0);
        })
        .unwrap();
    let rep = h.engine.tick().unwrap();
    assert_eq!((rep.recorded, rep.claimed.len()), (1, 0), "{rep:?}");
    assert_eq!(h.batch(x).state.as_str(), "delivered");
    let d = h.intake.destination("http-recv").unwrap();
    assert_eq!(d.state.as_str(), "closed", "x's success closed the breaker");
    assert!(
        h.due_in(y) <= 0.0,
        "y made due once the claims committed: {}",
        h.due_in(y)
    );
    assert_eq!(h.engine.next_wait(Duration::from_secs(5)), Duration::ZERO);
    let rep = h.engine.tick().unwrap();
    assert_eq!(
        rep.claimed,
        vec![y],
        "the closed breaker's retry goes at once: {rep:?}"
    );
}

postgres_only!(
    results_recorded_beside_the_claims,
    a_success_recorded_beside_the_claims_that_closes_the_breaker_makes_retries_due,
);

/// The watchdog's health proof after a tick that came back with weather: an unreachable
/// PostgreSQL feeds it (the loop turned, and a restart could not bring the server back; it
/// would also cost an active dispatcher the means to end its own lost session, so no
/// dispatcher would be active), a busy spool does not (a result may be waiting on it), as
/// before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_postgres_feeds_the_watchdog_and_a_busy_spool_does_not() {
    let h = harness("").await;
    let unreachable = hookspool::store::StoreError::PgUnreachable {
        target: "hookspool@db.internal:5432/hookspool".into(),
        reason: "connection refused".into(),
    };
    assert!(h.engine.progress_possible(Err(&unreachable)));
    assert!(
        !h.engine
            .progress_possible(Err(&hookspool::store::StoreError::Busy))
    );
}
