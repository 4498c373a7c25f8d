//! The real `hookspool dispatch` binary: a script destination's emits are atomic with the
//! mark under SIGKILL between them, a second dispatcher exits 3, SIGTERM stops cleanly.

use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hookspool::store::BatchFilter;

use super::{bin, killed, open, wait_until};

fn hs(home: &std::path::Path) -> Command {
    let mut c = Command::new(bin());
    c.arg("--home")
        .arg(home)
        .env_remove("HOOKSPOOL_CONFIG")
        .env_remove("HOOKSPOOL_HOME")
        .env_remove("HOOKSPOOL_FAILPOINT")
        .env_remove("NOTIFY_SOCKET");
    c
}

fn spawn_dispatch(home: &std::path::Path, failpoint: Option<&str>) -> Child {
    let mut c = hs(home);
    c.arg("dispatch")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(f) = failpoint {
        c.env("HOOKSPOOL_FAILPOINT", f);
    }
    c.spawn().unwrap()
}

#[test]
fn script_emits_survive_sigkill_between_emits_and_mark_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let scripts = tempfile::tempdir().unwrap();
    let home = dir.path();
    std::fs::write(
        home.join("config.toml"),
        super::emit_script_config(home, scripts.path()),
    )
    .unwrap();
    let mut c = hs(home)
        .args(["enqueue", "--source", "s", "--key", "k"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(br#"{"n":1}"#).unwrap();
    assert!(c.wait().unwrap().success());

    let mut d = spawn_dispatch(home, Some("mark.after_emits"));
    let started = Instant::now();
    let status = loop {
        if let Some(st) = d.try_wait().unwrap() {
            break st;
        }
        if started.elapsed() > Duration::from_secs(30) {
            let _ = d.kill();
            let out = d.wait_with_output().unwrap();
            panic!(
                "the dispatcher never reached the failpoint: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        killed(&status),
        "the dispatcher died at the failpoint: {status:?}"
    );
    let db = home.join("spool.db");
    {
        let s = open(&db);
        let b = &s
            .list_batches(&BatchFilter {
                source: Some("s".into()),
                limit: 10,
                ..Default::default()
            })
            .unwrap()[0];
        assert_eq!(b.state.as_str(), "leased", "the mark was not committed");
        let f = s
            .list_batches(&BatchFilter {
                source: Some("followup".into()),
                limit: 10,
                ..Default::default()
            })
            .unwrap();
        assert!(f.is_empty(), "nor were the emits");
    }
    // A second dispatcher while one runs exits 3.
    let mut d = spawn_dispatch(home, None);
    let db2 = db.clone();
    wait_until("delivery after restart", Duration::from_secs(30), || {
        let s = open(&db2);
        s.list_batches(&BatchFilter {
            source: Some("s".into()),
            limit: 10,
            ..Default::default()
        })
        .unwrap()[0]
            .state
            .as_str()
            == "delivered"
    });
    let second = hs(home)
        .arg("dispatch")
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert_eq!(
        second.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&second.stderr)
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(d.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let st = d.wait().unwrap();
    assert!(st.success(), "SIGTERM stops cleanly: {st:?}");
    let s = open(&db);
    let f = s
        .list_batches(&BatchFilter {
            source: Some("followup".into()),
            limit: 10,
            ..Default::default()
        })
        .unwrap();
    let emitted: i64 = f.iter().map(|b| b.count).sum();
    assert_eq!(
        emitted, 1,
        "the script ran twice, its emits were committed once"
    );
    let runs = std::fs::read_to_string(home.join("state/runs")).unwrap();
    assert_eq!(
        runs.lines().count(),
        2,
        "at-least-once: the script ran again after the crash"
    );
}

/// Issue 28's note "a destination that stays throttled (429 without end) opens no issue",
/// through the real binary: a receiver that answers only 429 (with and without
/// Retry-After) opens `delivery:<dest>:throttled` once it has done so for
/// dispatch.throttle_alert_s, not before, and the first success resolves it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_destination_throttled_past_throttle_alert_s_opens_an_issue_and_the_first_success_resolves_it()
 {
    const THROTTLE_ALERT_S: f64 = 2.0;
    let rx = super::receiver::Receiver::start().await;
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().to_path_buf();
    std::fs::write(home.join("secret"), "whsec_c2VjcmV0LWZvci10ZXN0cw==").unwrap();
    std::fs::write(
        home.join("config.toml"),
        format!(
            r#"
[dispatch]
poll_s = 0.05
backoff_base_s = 0.2
backoff_cap_s = 0.4
throttle_alert_s = {THROTTLE_ALERT_S}
[sources.s]
scheme = "static-token"
header = "X-Token"
key = "k"
action = "http-recv"
[destinations.http-recv]
type = "http"
url = "{}"
allow_insecure = true
allow_private = ["127.0.0.1/32"]
secret = {{ file = "{}/secret" }}
"#,
            rx.url(),
            home.display()
        ),
    )
    .unwrap();
    rx.set_default(super::receiver::Answer::status(429).header("Retry-After", "1"));
    let mut c = hs(&home)
        .args(["enqueue", "--source", "s", "--key", "k"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(br#"{"n":1}"#).unwrap();
    assert!(c.wait().unwrap().success());
    let mut d = spawn_dispatch(&home, None);
    let db = home.join("spool.db");
    let issue = |db: &std::path::Path| {
        open(db)
            .issue_by_fingerprint("delivery:http-recv:throttled")
            .unwrap()
    };
    tokio::task::block_in_place(|| {
        wait_until("a throttle", Duration::from_secs(30), || {
            !rx.requests().is_empty()
        });
        // Without Retry-After from the second answer on: the batch's own backoff.
        rx.set_default(super::receiver::Answer::status(429));
        wait_until("the throttled issue", Duration::from_secs(30), || {
            issue(&db).is_some_and(|i| i.state == "open")
        });
    });
    let s = open(&db);
    let b = s
        .list_batches(&BatchFilter {
            source: Some("s".into()),
            limit: 10,
            ..Default::default()
        })
        .unwrap()
        .remove(0);
    let attempts = s.attempts(b.id).unwrap();
    // The run of throttles is counted from the first throttled attempt's start, as the
    // dispatcher counts it (under load an attempt's own duration is not negligible).
    let first = attempts[0].started_at;
    let opened = issue(&db).unwrap();
    assert!(
        opened.first_at - first >= THROTTLE_ALERT_S,
        "opened {} s after the first throttle",
        opened.first_at - first
    );
    assert!(
        attempts
            .iter()
            .filter(|a| a.finished_at.is_some())
            .all(|a| a.klass.map(|k| k.as_str()) == Some("throttle")),
        "{attempts:?}"
    );
    assert_eq!(b.attempts, 0, "throttles are not counted");
    // The first success resolves it.
    rx.set_default(super::receiver::Answer::status(200));
    tokio::task::block_in_place(|| {
        wait_until(
            "the throttled issue resolved",
            Duration::from_secs(30),
            || issue(&db).is_some_and(|i| i.state == "resolved"),
        );
    });
    assert_eq!(open(&db).batch(b.id).unwrap().state.as_str(), "delivered");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(d.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(d.wait().unwrap().success());
}

/// Issue 35 through the real binary: `http:limited` (max_per_s = 5, burst = 1) and
/// `http:free` (no limit) each have a backlog of 30 batches on 5 keys when `hookspool
/// dispatch` starts. The receiver sees at most 5 + 1 arrivals for the limited destination in
/// any one-second window, and the whole backlog within a few seconds (the loop wakes for each
/// token: at poll_s = 5 one batch per poll would take minutes), while the free destination
/// has drained before the limited one is a third through; FIFO holds per key, nothing is
/// lost, a held batch is no attempt, and `status` and `metrics` show the limit and the waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limited_destination_drains_at_its_limit_while_another_drains_at_full_speed() {
    const PER_KEY: i64 = 6;
    const KEYS: i64 = 5;
    let rx = super::receiver::Receiver::start().await;
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().to_path_buf();
    std::fs::write(home.join("secret"), "whsec_c2VjcmV0LWZvci10ZXN0cw==").unwrap();
    let dest = |name: &str, limit: &str| {
        format!(
            r#"
[destinations."http:{name}"]
type = "http"
url = "http://{}/{name}"
allow_insecure = true
allow_private = ["127.0.0.1/32"]
secret = {{ file = "{}/secret" }}
{limit}
"#,
            rx.addr,
            home.display()
        )
    };
    std::fs::write(
        home.join("config.toml"),
        format!(
            // The intake listens where nothing is, so `metrics` reads this dispatcher's counters,
            // never another process's page on the shared default port.
            "[intake]\nlisten = \"unix:{}/no-intake.sock\"\n[limits]\nmin_free_bytes = 0\n[dispatch]\npoll_s = 5\nparallel = 8\nheartbeat_s = 0.2\n{}{}",
            home.display(),
            dest("limited", "max_per_s = 5\nburst = 1"),
            dest("free", "")
        ),
    )
    .unwrap();
    let db = home.join("spool.db");
    {
        let mut s = open(&db);
        let now = hookspool::clock::Clock::now(&hookspool::clock::SystemClock);
        for n in 0..PER_KEY {
            for k in 0..KEYS {
                for route in ["limited", "free"] {
                    let payload = format!(r#"{{"k":"{route}-{k}","n":{n}}}"#);
                    let w = super::window(0.0, 0.0, 1, 1_000_000);
                    let req = super::request(route, &format!("k{k}"), &payload, now, w);
                    s.enqueue(&req).unwrap();
                }
            }
        }
    }
    let total = (PER_KEY * KEYS) as usize;
    let mut d = spawn_dispatch(&home, None);
    let got = rx
        .wait_for(2 * total, Duration::from_secs(30))
        .await
        .into_iter()
        .map(|r| (r.path.clone(), r.at, r.json()["events"][0].clone()))
        .collect::<Vec<_>>();
    let of = |path: &str| -> Vec<(Instant, serde_json::Value)> {
        got.iter()
            .filter(|(p, _, _)| p == path)
            .map(|(_, at, e)| (*at, e.clone()))
            .collect()
    };
    let (limited, free) = (of("/limited"), of("/free"));
    assert_eq!(
        (limited.len(), free.len()),
        (total, total),
        "every batch arrived within 30 s"
    );
    // At most max_per_s + burst in any one-second window.
    for (i, (t, _)) in limited.iter().enumerate() {
        let n = limited[i..]
            .iter()
            .take_while(|(u, _)| *u < *t + Duration::from_secs(1))
            .count();
        assert!(n <= 6, "{n} arrivals in the second from arrival {i}");
    }
    let span = limited[total - 1].0 - limited[0].0;
    assert!(
        span >= Duration::from_secs_f64(29.0 / 5.0 - 0.2) && span <= Duration::from_secs(12),
        "30 batches at 5/s after a burst of 1 take about 5.8 s, not a poll each: {span:?}"
    );
    println!(
        "limited: {total} deliveries in {:.2} s = {:.2}/s against max_per_s = 5",
        span.as_secs_f64(),
        (total - 1) as f64 / span.as_secs_f64()
    );
    let free_last = free.iter().map(|(t, _)| *t).max().unwrap();
    assert!(
        free_last < limited[10].0,
        "the free destination drained at full speed, not held behind the limited one"
    );
    // FIFO per key and nothing lost: each key's n in order, each exactly once.
    for (name, list) in [("limited", &limited), ("free", &free)] {
        for k in 0..KEYS {
            let ns: Vec<i64> = list
                .iter()
                .filter(|(_, e)| e["k"] == format!("{name}-{k}"))
                .map(|(_, e)| e["n"].as_i64().unwrap())
                .collect();
            assert_eq!(ns, (0..PER_KEY).collect::<Vec<_>>(), "{name} key k{k}");
        }
    }
    let s = open(&db);
    let all = || {
        s.list_batches(&BatchFilter {
            limit: 1000,
            ..Default::default()
        })
        .unwrap()
    };
    tokio::task::block_in_place(|| {
        wait_until("the last results recorded", Duration::from_secs(10), || {
            all().iter().all(|b| b.state.as_str() != "leased")
        })
    });
    let batches = all();
    assert_eq!(batches.len(), 2 * total);
    for b in &batches {
        assert_eq!(b.state.as_str(), "delivered", "batch {}", b.id);
        assert_eq!(s.attempts(b.id).unwrap().len(), 1, "held is no attempt");
    }
    // status and metrics show the limit and the waits (published with a heartbeat).
    let cli = |args: &[&str]| {
        let out = hs(&home).args(args).output().unwrap();
        assert!(out.status.success(), "{args:?}: {out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let waits = |text: &str| -> f64 {
        text.lines()
            .find(|l| {
                l.starts_with(
                    "hookspool_destination_rate_limited_total{destination=\"http:limited\"}",
                )
            })
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    };
    tokio::task::block_in_place(|| {
        wait_until(
            "the waits in the published counters",
            Duration::from_secs(10),
            || waits(&cli(&["metrics"])) >= 20.0,
        )
    });
    let metrics = cli(&["metrics"]);
    assert!(
        metrics.contains(
            "hookspool_destination_max_attempts_per_second{destination=\"http:limited\"} 5\n"
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains("hookspool_destination_burst{destination=\"http:limited\"} 1\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("# TYPE hookspool_destination_rate_limited_seconds_total counter"),
        "{metrics}"
    );
    assert!(!metrics.contains("max_per_s{destination=\"http:free\"}"));
    super::observe::promtool_check(&metrics);
    let status: serde_json::Value = serde_json::from_str(&cli(&["--json", "status"])).unwrap();
    let rate = &status["destinations"]["http:limited"]["rate"];
    assert_eq!(
        (rate["max_per_s"].as_f64(), rate["burst"].as_u64()),
        (Some(5.0), Some(1))
    );
    assert!(rate["waits"].as_u64().unwrap() >= 20, "{rate}");
    assert!(
        rate["wait_s"].as_f64().unwrap() > 10.0,
        "batch-seconds waited: {rate}"
    );
    assert!(status["destinations"]["http:free"].get("rate").is_none());
    let text = cli(&["status"]);
    assert!(
        text.contains("RATE (WAITED)") && text.contains("5/s burst 1 ("),
        "{text}"
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(d.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(d.wait().unwrap().success());
}

/// Issue 35's reload rules through the real binary: a config whose `max_per_s` is wrong
/// keeps the running dispatcher on the previous config (config:file opens, the old limit
/// still spaces the starts), and a good one with a higher limit applies at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_rate_limit_on_reload_keeps_the_old_one_and_a_good_one_applies() {
    let rx = super::receiver::Receiver::start().await;
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().to_path_buf();
    std::fs::write(home.join("secret"), "whsec_c2VjcmV0LWZvci10ZXN0cw==").unwrap();
    let config = |limit: &str| {
        format!(
            r#"[limits]
min_free_bytes = 0
[dispatch]
poll_s = 0.1
parallel = 8
[destinations."http:limited"]
type = "http"
url = "{}"
allow_insecure = true
allow_private = ["127.0.0.1/32"]
secret = {{ file = "{}/secret" }}
{limit}
"#,
            rx.url(),
            home.display()
        )
    };
    let path = home.join("config.toml");
    std::fs::write(&path, config("max_per_s = 2\nburst = 1")).unwrap();
    let db = home.join("spool.db");
    let enqueue = |from: usize, n: usize| {
        let mut s = open(&db);
        let now = hookspool::clock::Clock::now(&hookspool::clock::SystemClock);
        for i in from..from + n {
            let w = super::window(0.0, 0.0, 1, 1_000_000);
            let req = super::request(
                "limited",
                &format!("k{i}"),
                &format!(r#"{{"i":{i}}}"#),
                now,
                w,
            );
            s.enqueue(&req).unwrap();
        }
    };
    let mut d = spawn_dispatch(&home, None);
    let stderr = super::capture_stderr(&mut d);
    let issue = |db: &std::path::Path| open(db).issue_by_fingerprint("config:file").unwrap();
    tokio::task::block_in_place(|| {
        wait_until(
            "the dispatcher's first heartbeat",
            Duration::from_secs(30),
            || {
                db.exists()
                    && open(&db)
                        .meta_time("dispatcher_heartbeat_at")
                        .unwrap()
                        .is_some()
            },
        );
        std::fs::write(&path, config("max_per_s = 0\nburst = 1")).unwrap();
        wait_until(
            "config:file opened by the bad reload",
            Duration::from_secs(10),
            || issue(&db).is_some_and(|i| i.state == "open"),
        );
    });
    assert!(d.try_wait().unwrap().is_none(), "the dispatcher runs on");
    let text = issue(&db).unwrap().last_error.unwrap_or_default();
    assert!(
        text.contains("max_per_s"),
        "the issue names the key: {text}"
    );
    // The old limit (2/s, burst 1) still spaces the starts.
    enqueue(0, 4);
    let got = rx.wait_for(4, Duration::from_secs(20)).await;
    assert_eq!(got.len(), 4);
    for w in got.windows(2) {
        let gap = w[1].at - w[0].at;
        assert!(
            gap >= Duration::from_millis(400),
            "starts {gap:?} apart at 2/s"
        );
    }
    // A good reload: 1000/s (burst 1000) lets the next 20 go at once.
    std::fs::write(&path, config("max_per_s = 1000")).unwrap();
    tokio::task::block_in_place(|| {
        wait_until(
            "config:file resolved by the good reload",
            Duration::from_secs(10),
            || issue(&db).is_some_and(|i| i.state == "resolved"),
        );
    });
    enqueue(4, 20);
    let got = rx.wait_for(24, Duration::from_secs(20)).await;
    assert_eq!(got.len(), 24);
    let span = got[23].at - got[4].at;
    assert!(
        span < Duration::from_secs(3),
        "20 batches at the new limit, not 10 s at the old one: {span:?}"
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(d.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(d.wait().unwrap().success());
    super::settle_stderr(&stderr);
    let log = String::from_utf8_lossy(&stderr.lock().unwrap()).to_string();
    assert!(log.contains("config reload failed"), "{log}");
}

/// Issue 35's histograms through the real binary: the receiver answers `/d` after 300 ms,
/// 600 ms or 1.5 s (by the key) and measures each answer's time; `hookspool metrics` then
/// shows `hookspool_attempt_duration_seconds{destination, outcome}` whose buckets hold
/// exactly the attempts the receiver measured in each bucket (the delays sit far from the
/// bounds, so the dispatcher's own overhead cannot move one), one 500 in `outcome="retry"`,
/// and `hookspool_receive_to_delivered_seconds{route}` counting the deliveries, each at
/// least as long as from the enqueue to the receiver's arrival. promtool accepts the page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn histograms_hold_what_the_receiver_measured() {
    let rx = super::receiver::Receiver::start().await;
    rx.set_rule(|r| {
        let k = r.json()["events"][0]["k"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let ms = match k.as_str() {
            "fast" => 300,
            "mid" => 600,
            "slow" => 1500,
            _ => return Some(super::receiver::Answer::status(500)),
        };
        Some(super::receiver::Answer::status(200).delay(Duration::from_millis(ms)))
    });
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().to_path_buf();
    std::fs::write(home.join("secret"), "whsec_c2VjcmV0LWZvci10ZXN0cw==").unwrap();
    std::fs::write(
        home.join("config.toml"),
        format!(
            r#"[intake]
listen = "unix:{home}/no-intake.sock"
[limits]
min_free_bytes = 0
[dispatch]
poll_s = 0.1
parallel = 8
heartbeat_s = 0.2
[destinations."http:d"]
type = "http"
url = "http://{addr}/d"
allow_insecure = true
allow_private = ["127.0.0.1/32"]
secret = {{ file = "{home}/secret" }}
"#,
            home = home.display(),
            addr = rx.addr
        ),
    )
    .unwrap();
    let db = home.join("spool.db");
    let keys = ["fast", "fast", "mid", "mid", "mid", "slow", "bad"];
    let enqueued_at;
    {
        let mut s = open(&db);
        enqueued_at = Instant::now();
        let now = hookspool::clock::Clock::now(&hookspool::clock::SystemClock);
        for (i, k) in keys.iter().enumerate() {
            let payload = format!(r#"{{"k":"{k}"}}"#);
            let w = super::window(0.0, 0.0, 1, 1_000_000);
            let req = super::request("d", &format!("{k}{i}"), &payload, now, w);
            s.enqueue(&req).unwrap();
        }
    }
    let mut d = spawn_dispatch(&home, None);
    let got = rx.wait_for(keys.len(), Duration::from_secs(30)).await;
    assert!(got.len() >= keys.len(), "{} arrivals", got.len());
    let metrics = |home: &std::path::Path| {
        let out = hs(home).arg("metrics").output().unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let h = "hookspool_attempt_duration_seconds";
    let ok = "destination=\"http:d\",outcome=\"ok\"";
    let count = |text: &str, labels: &str| {
        super::observe::series(text, &format!("{h}_count{{{labels}}}")).unwrap_or(0)
    };
    tokio::task::block_in_place(|| {
        wait_until("six deliveries published", Duration::from_secs(15), || {
            count(&metrics(&home), ok) == 6
        })
    });
    let text = metrics(&home);
    // What the receiver measured: each answer's delay, by the bucket it falls in.
    let delays = [0.3, 0.3, 0.6, 0.6, 0.6, 1.5];
    for b in super::observe::BUCKETS_S {
        let expect = delays.iter().filter(|d| **d <= b).count() as u64;
        assert_eq!(
            super::observe::series(&text, &format!("{h}_bucket{{{ok},le=\"{b}\"}}")),
            Some(expect),
            "le={b}: {text}"
        );
    }
    let sum: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{h}_sum{{{ok}}} ")))
        .and_then(|v| v.parse().ok())
        .expect("a sum");
    let floor: f64 = delays.iter().sum();
    assert!(
        sum >= floor && sum < floor + 6.0 * 0.2,
        "sum {sum} s against the receiver's {floor} s"
    );
    assert!(
        count(&text, "destination=\"http:d\",outcome=\"retry\"") >= 1,
        "the 500 is a retry: {text}"
    );
    let r2d = "hookspool_receive_to_delivered_seconds";
    assert_eq!(
        super::observe::series(&text, &format!("{r2d}_count{{route=\"d\"}}")),
        Some(6),
        "{text}"
    );
    let r2d_sum: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{r2d}_sum{{route=\"d\"}} ")))
        .and_then(|v| v.parse().ok())
        .expect("a sum");
    let arrivals: f64 = got
        .iter()
        .filter(|r| r.json()["events"][0]["k"] != "bad")
        .map(|r| (r.at - enqueued_at).as_secs_f64())
        .sum();
    assert!(
        r2d_sum >= arrivals + floor - 0.05,
        "receive-to-delivered {r2d_sum} s, at least the arrivals' {arrivals} s plus the answers' {floor} s"
    );
    super::observe::promtool_check(&text);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(d.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(d.wait().unwrap().success());
}
