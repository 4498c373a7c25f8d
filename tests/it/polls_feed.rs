//! hookspool.feed end to end through `hookspool run` (spec 14.4, issue 16 "Prove it"): a
//! real feed server on 127.0.0.1:0 (`processor_stub`, reached through the failpoints-only
//! HOOKSPOOL_TEST_PROVIDER_BASE), a real receiver for the entries, a real SQLite file. The
//! dispatcher's time moves through the failpoints-only HOOKSPOOL_TEST_CLOCK_OFFSET_FILE, so
//! the instance keeps the product's own every_s = 60 and no test-only period exists.
//!
//! New entries arrive once (a reordered feed and a restart announce nothing again), a 304
//! emits nothing, a malicious feed (entity expansion, 100 MB, deep nesting) is refused as a
//! permanent failure while the service carries on, and a feed that stays down opens
//! `poll:feed:stale`, which the next delivered tick resolves.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hookspool::store::{BatchFilter, Store};
use hookspool::vocab::{AttemptOutcome, BatchState, Klass};

use super::open;
use super::processor_stub::{Req, Resp, Stub};
use super::receiver::{Answer, Receiver};
use super::run_e2e::{RunProc, reserved_port};

const DEST_SECRET: &str = "whsec_c2VjcmV0LWZvci10ZXN0cw==";

/// What the feed server answers.
#[derive(Clone)]
enum Mode {
    /// An Atom feed of these entry ids, with this ETag (a matching If-None-Match is a 304).
    Feed(Vec<&'static str>, &'static str),
    Body(Arc<String>),
    Down,
}

fn atom(ids: &[&str]) -> String {
    let entries: String = ids
        .iter()
        .map(|id| {
            format!(
                "<entry><id>urn:test:{id}</id><title>Entry {id}</title><link href=\"https://feeds.example.org/{id}\"/><updated>2026-05-01T09:00:00Z</updated></entry>"
            )
        })
        .collect();
    format!(
        "<?xml version=\"1.0\" encoding=\"utf-8\"?><feed xmlns=\"http://www.w3.org/2005/Atom\"><title>Test feed</title>{entries}</feed>"
    )
}

fn answer(mode: &Mode, r: &Req) -> Resp {
    match mode {
        Mode::Feed(ids, etag) => {
            if r.header("if-none-match") == Some(etag) {
                return Resp {
                    status: 304,
                    headers: vec![("etag".into(), (*etag).into())],
                    body: String::new(),
                };
            }
            Resp {
                status: 200,
                headers: vec![
                    ("content-type".into(), "application/atom+xml".into()),
                    ("etag".into(), (*etag).into()),
                ],
                body: atom(ids),
            }
        }
        Mode::Body(b) => Resp {
            status: 200,
            headers: vec![("content-type".into(), "application/rss+xml".into())],
            body: b.to_string(),
        },
        Mode::Down => Resp {
            status: 503,
            headers: vec![],
            body: String::new(),
        },
    }
}

struct Feed {
    stub: Stub,
    mode: Arc<Mutex<Mode>>,
}

impl Feed {
    fn start() -> Feed {
        let mode = Arc::new(Mutex::new(Mode::Feed(vec!["a", "b"], "\"v1\"")));
        let m = mode.clone();
        let stub = Stub::start(move |r| answer(&m.lock().unwrap(), r));
        Feed { stub, mode }
    }

    fn set(&self, m: Mode) {
        *self.mode.lock().unwrap() = m;
    }
}

struct World {
    _dir: tempfile::TempDir,
    home: std::path::PathBuf,
    addr: SocketAddr,
    feed: Feed,
    rx: Receiver,
    offset: f64,
}

impl World {
    fn env(&self) -> Vec<(String, String)> {
        vec![
            (
                "HOOKSPOOL_TEST_PROVIDER_BASE".into(),
                self.feed.stub.base.clone(),
            ),
            (
                "HOOKSPOOL_TEST_CLOCK_OFFSET_FILE".into(),
                self.home.join("offset").display().to_string(),
            ),
        ]
    }

    fn start(&self) -> RunProc {
        let env = self.env();
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        RunProc::start(&self.home, self.addr, &env)
    }

    /// Moves the services' clock forward.
    fn advance(&mut self, dt: f64) {
        self.offset += dt;
        std::fs::write(self.home.join("offset"), self.offset.to_string()).unwrap();
    }

    fn store(&self) -> Store {
        open(&self.home.join("spool.db"))
    }

    /// Waits until the poll row's delivered tick is newer than `after`; returns it.
    fn wait_delivered_tick(&self, after: Option<f64>, p: &RunProc) -> f64 {
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            let t = self
                .store()
                .polls()
                .unwrap()
                .first()
                .and_then(|r| r.delivered_tick_at);
            if let Some(t) = t
                && after.is_none_or(|a| t > a)
            {
                return t;
            }
            assert!(
                Instant::now() < until,
                "no delivered tick after {after:?}:\n{}",
                p.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The poll's next tick (one period on), delivered.
    fn next_tick(&mut self, last: f64, p: &RunProc) -> f64 {
        self.advance(61.0);
        self.wait_delivered_tick(Some(last), p)
    }

    fn entries(&self) -> Vec<String> {
        self.rx
            .requests()
            .iter()
            .flat_map(|r| {
                let doc = r.json();
                doc["events"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
                    .into_iter()
                    .map(|e| e["id"].as_str().unwrap_or_default().to_string())
            })
            .collect()
    }

    /// Waits for the last tick batch to go dead; returns it and its last error.
    fn wait_dead_tick(&self, p: &RunProc) -> (i64, String) {
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            let s = self.store();
            if let Some(id) = s.polls().unwrap()[0].last_batch_id {
                let b = s.batch(id).unwrap();
                if b.state == BatchState::Dead {
                    return (id, b.last_error.unwrap_or_default());
                }
            }
            assert!(
                Instant::now() < until,
                "the tick never went dead:\n{}",
                p.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn config(home: &Path, port: u16, url: &str) -> String {
    let d = home.join("receiver.secret");
    std::fs::write(&d, DEST_SECRET).unwrap();
    format!(
        r#"[intake]
listen = "127.0.0.1:{port}"

[limits]
min_free_bytes = 0

[dispatch]
poll_s = 0.1
backoff_base_s = 1
backoff_cap_s = 5

[bobbins.feed]
bobbin = "hookspool.feed"
settings = {{ url = "https://feeds.example.org/atom.xml" }}
outputs = {{ entry = "receiver" }}
every_s = 60
jitter_s = 0

[destinations.receiver]
type = "http"
url = "{url}"
allow_insecure = true
allow_private = ["127.0.0.1/32"]
secret = {{ file = "{d}" }}
"#,
        d = d.display()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poll_feed_end_to_end_through_hookspool_run() {
    let rx = Receiver::start().await;
    rx.set_default(Answer::status(200));
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().to_path_buf();
    let port = reserved_port();
    std::fs::write(home.join("config.toml"), config(&home, port, &rx.url())).unwrap();
    let mut w = World {
        _dir: dir,
        home,
        addr: SocketAddr::from(([127, 0, 0, 1], port)),
        feed: Feed::start(),
        rx,
        offset: 0.0,
    };
    w.advance(0.0);
    let mut p = w.start();

    // /hooks/feed is no URL: a poll source has no plugin.
    let r = p.post("feed", b"", b"{}", &[]);
    assert_eq!(r.status, 404, "{r:?}");

    // The first poll records a and b without announcing them.
    let mut t = w.wait_delivered_tick(None, &p);
    assert!(w.entries().is_empty(), "{:?}", w.entries());
    // `hookspool status` (at the services' time: the same clock offset) and /healthz show
    // the instance's clock.
    let mut cli = std::process::Command::new(super::bin());
    cli.arg("--home").arg(&w.home).args(["--json", "status"]);
    for (k, v) in w.env() {
        cli.env(k, v);
    }
    let out = cli.output().unwrap();
    let status: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    let healthz = super::intake::get(w.addr, "/healthz").json();
    for (what, doc) in [("status", &status), ("/healthz", &healthz)] {
        let f = &doc["polls"]["feed"];
        assert_eq!(f["every_s"], 60.0, "{what}: {doc}");
        // The same instant (JSON's shortest float form may differ in the last digit).
        assert!(
            f["delivered_tick_at"]
                .as_f64()
                .is_some_and(|d| (d - t).abs() < 1e-3),
            "{what}: {doc}"
        );
        // At most that instant, to the same tolerance: the last tick is often the delivered
        // one, and serde_json's float parse may land one unit in the last place above it.
        assert!(
            f["last_tick_at"].as_f64().is_some_and(|l| l <= t + 1e-3),
            "{what}: {doc}"
        );
        let next_in = f["next_in_s"].as_f64().unwrap_or(-1.0);
        assert!(next_in > 0.0 && next_in <= 60.0, "{what}: {doc}");
        assert!(
            f["next_at"].as_f64().is_some_and(|n| n > t),
            "{what}: {doc}"
        );
        assert!(
            f["delivered_age_s"].as_f64().is_some_and(|a| a >= 0.0),
            "{what}: {doc}"
        );
        assert_eq!(f["pending"], false, "{what}: {doc}");
        assert_eq!(f["skipped"], 0, "{what}: {doc}");
        assert_eq!(f["stale"], false, "{what}: {doc}");
    }

    // A new entry arrives once.
    w.feed.set(Mode::Feed(vec!["c", "a", "b"], "\"v2\""));
    t = w.next_tick(t, &p);
    w.rx.wait_for(1, Duration::from_secs(30)).await;
    assert_eq!(w.entries(), ["urn:test:c"]);

    // Unchanged: the conditional GET gets a 304, and nothing is emitted.
    t = w.next_tick(t, &p);
    let last = w.feed.stub.requests().last().cloned().unwrap();
    assert_eq!(last.header("if-none-match"), Some("\"v2\""));
    // A feed that reorders its entries announces nothing again.
    w.feed.set(Mode::Feed(vec!["b", "c", "a"], "\"v3\""));
    t = w.next_tick(t, &p);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        w.entries(),
        ["urn:test:c"],
        "a 304 or a reorder emitted something"
    );

    // After a restart only the new entry arrives.
    p.sigterm();
    assert!(p.wait_exit(Duration::from_secs(30)).success());
    let mut p = w.start();
    w.feed.set(Mode::Feed(vec!["d", "b", "c", "a"], "\"v4\""));
    w.next_tick(t, &p);
    w.rx.wait_for(2, Duration::from_secs(30)).await;
    assert_eq!(w.entries(), ["urn:test:c", "urn:test:d"]);

    // Malicious feeds are refused without harm: each tick goes dead at once with the
    // parser's (or the size cap's) reason, and the service carries on.
    let bomb = format!(
        "<?xml version=\"1.0\"?><!DOCTYPE lolz [<!ENTITY lol \"lol\">{}]><rss><channel><item><title>&lol9;</title></item></channel></rss>",
        (1..10)
            .map(|i| format!(
                "<!ENTITY lol{i} \"{}\">",
                format!(
                    "&lol{};",
                    if i == 1 {
                        String::new()
                    } else {
                        (i - 1).to_string()
                    }
                )
                .repeat(10)
            ))
            .collect::<String>()
    );
    let deep = format!("<rss><channel>{}</channel></rss>", "<x>".repeat(50_000));
    let huge = format!(
        "<rss><channel><title>{}</title></channel></rss>",
        "a".repeat(100 * 1024 * 1024)
    );
    for (body, reason) in [
        (bomb, "DOCTYPE"),
        (huge, "larger than"),
        (deep, "deeper than"),
    ] {
        w.feed.set(Mode::Body(Arc::new(body)));
        w.advance(61.0);
        let started = Instant::now();
        let (id, error) = w.wait_dead_tick(&p);
        assert!(error.contains(reason), "{reason}: {error}");
        assert!(
            started.elapsed() < Duration::from_secs(45),
            "{reason}: refused too slowly"
        );
        assert!(p.child.try_wait().unwrap().is_none(), "hookspool run died");
        // The dead tick holds the clock until the operator drops it.
        let s = w.store();
        s.batch(id).unwrap();
        let out = std::process::Command::new(super::bin())
            .args([
                "--home",
                &w.home.display().to_string(),
                "drop",
                &id.to_string(),
                "--yes",
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert_eq!(w.entries().len(), 2, "a refused feed emitted something");

    // A feed that stays down: the ticks retry and then wait; after 3 x every_s without a
    // delivered tick, maintenance opens poll:feed:stale.
    w.feed.set(Mode::Down);
    let before = w.store().polls().unwrap()[0].delivered_tick_at;
    for _ in 0..4 {
        w.advance(61.0);
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    let until = Instant::now() + Duration::from_secs(60);
    let stale = loop {
        if let Some(i) = w.store().issue_by_fingerprint("poll:feed:stale").unwrap()
            && i.state == "open"
        {
            break i;
        }
        assert!(
            Instant::now() < until,
            "poll:feed:stale never opened:\n{}",
            p.log()
        );
        w.advance(61.0);
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(stale.kind, "source_silent");
    assert_eq!(w.store().polls().unwrap()[0].delivered_tick_at, before);
    // The status document at the services' time (the CLI reads the wall clock).
    let inputs = hookspool::config::PathInputs {
        home_flag: Some(w.home.clone()),
        ..Default::default()
    };
    let (cfg, _) = hookspool::config::load(&inputs, false).unwrap();
    let now = hookspool::clock::Clock::now(&hookspool::clock::SystemClock) + w.offset;
    let doc = hookspool::observe::status::collect(&w.store(), &cfg, now).unwrap();
    assert_eq!(doc["polls"]["feed"]["stale"], true, "{doc}");
    assert_eq!(doc["polls"]["feed"]["every_s"], 60.0, "{doc}");
    assert!(
        doc["degraded"]
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d == "poll_stale:feed"),
        "{doc}"
    );

    // Back up: the retried tick is delivered and the next maintenance resolves the issue.
    w.feed
        .set(Mode::Feed(vec!["e", "d", "b", "c", "a"], "\"v5\""));
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        w.advance(61.0);
        tokio::time::sleep(Duration::from_millis(500)).await;
        let resolved = w
            .store()
            .issue_by_fingerprint("poll:feed:stale")
            .unwrap()
            .is_some_and(|i| i.state == "resolved");
        if resolved {
            break;
        }
        assert!(
            Instant::now() < until,
            "poll:feed:stale never resolved:\n{}",
            p.log()
        );
    }
    w.rx.wait_for(3, Duration::from_secs(30)).await;
    assert_eq!(w.entries(), ["urn:test:c", "urn:test:d", "urn:test:e"]);
    let ticks = w
        .store()
        .list_batches(&BatchFilter {
            source: Some("feed".into()),
            limit: 1000,
            ..Default::default()
        })
        .unwrap();
    assert!(
        ticks
            .iter()
            .all(|b| b.key == "poll" || b.key.starts_with("entry:")),
        "{ticks:?}"
    );
    p.sigterm();
    p.wait_exit(Duration::from_secs(30));
}

/// Issue 28, "a poll instance dies after a provider outage": a provider down for longer
/// than max_attempts attempts (3 here) no longer kills the tick batch. The poller's retry
/// exit (75) is weather, not a bad batch: the transport class, uncounted, feeding the
/// breaker. The tick waits, and once the provider is back it is delivered and the poll goes
/// on by itself (a dead tick held the poll clock until an operator replayed it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poll_instance_dies_after_a_provider_outage_regression_it_resumes_by_itself() {
    const FAILED_ATTEMPTS_MIN: usize = 6;
    let rx = Receiver::start().await;
    rx.set_default(Answer::status(200));
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().to_path_buf();
    let port = reserved_port();
    let text =
        config(&home, port, &rx.url()).replace("[dispatch]\n", "[dispatch]\nmax_attempts = 3\n");
    std::fs::write(home.join("config.toml"), text).unwrap();
    let mut w = World {
        _dir: dir,
        home,
        addr: SocketAddr::from(([127, 0, 0, 1], port)),
        feed: Feed::start(),
        rx,
        offset: 0.0,
    };
    w.advance(0.0);
    let mut p = w.start();
    let t = w.wait_delivered_tick(None, &p);

    // The provider goes down for more than twice max_attempts attempts of one tick.
    w.feed.set(Mode::Down);
    let until = Instant::now() + Duration::from_secs(90);
    let tick = loop {
        w.advance(61.0);
        std::thread::sleep(Duration::from_millis(300));
        let s = w.store();
        let row = s.polls().unwrap().remove(0);
        let Some(id) = row.last_batch_id.filter(|_| row.last_tick_at > Some(t)) else {
            continue;
        };
        let b = s.batch(id).unwrap();
        let attempts = s.attempts(id).unwrap();
        assert_ne!(
            b.state,
            BatchState::Dead,
            "the tick went dead after {} attempts: {attempts:?}\n{}",
            attempts.len(),
            p.log()
        );
        let failed = attempts
            .iter()
            .filter(|a| a.outcome == Some(AttemptOutcome::Retry))
            .count();
        if failed >= FAILED_ATTEMPTS_MIN {
            assert_eq!(b.attempts, 0, "a provider outage is never counted");
            assert_eq!(b.last_class, Some(Klass::Transport), "{attempts:?}");
            assert!(
                attempts.iter().any(|a| a.probe),
                "the outage tripped the breaker: {attempts:?}"
            );
            break id;
        }
        assert!(
            Instant::now() < until,
            "{failed} failed attempts so far:\n{}",
            p.log()
        );
    };

    // Back up: the waiting tick is delivered, and the poll goes on by itself.
    w.feed.set(Mode::Feed(vec!["c", "a", "b"], "\"v2\""));
    let until = Instant::now() + Duration::from_secs(90);
    let back = loop {
        w.advance(61.0);
        std::thread::sleep(Duration::from_millis(300));
        if let Some(d) = w.store().polls().unwrap()[0].delivered_tick_at
            && d > t
        {
            break d;
        }
        assert!(
            Instant::now() < until,
            "the tick was never delivered after the outage:\n{}",
            p.log()
        );
    };
    assert_eq!(w.store().batch(tick).unwrap().state, BatchState::Delivered);
    w.rx.wait_for(1, Duration::from_secs(30)).await;
    assert_eq!(w.entries(), ["urn:test:c"]);
    w.feed.set(Mode::Feed(vec!["d", "c", "a", "b"], "\"v3\""));
    w.next_tick(back, &p);
    w.rx.wait_for(2, Duration::from_secs(30)).await;
    assert_eq!(w.entries(), ["urn:test:c", "urn:test:d"]);
    let dead = w
        .store()
        .list_batches(&BatchFilter {
            state: Some("dead".into()),
            limit: 10,
            ..Default::default()
        })
        .unwrap();
    assert!(dead.is_empty(), "{dead:?}");
    p.sigterm();
    assert!(p.wait_exit(Duration::from_secs(30)).success());
}
