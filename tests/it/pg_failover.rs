//! One active dispatcher and a hot standby on one PostgreSQL spool (issue 33's core): two
//! `hookspool dispatch` processes with homes of their own share the spool; the second finds
//! the spool's dispatcher lock held and waits as a standby, delivering nothing. SIGKILL the
//! active one while events keep coming: its session ends, the standby takes the lock,
//! recovers the dead one's leases at once and delivers. The time from the kill to the
//! first delivery by the new one is printed; every event is delivered, in order per key,
//! and nothing is left leased.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use super::fulldisk::Svc;
use super::receiver::Receiver;
use super::run_e2e::free_port;
use super::{TestSpool, bin};

/// Takeover target: the kill to the first delivery by the standby.
const TAKEOVER_S_MAX: f64 = 5.0;

fn home_for(rx: &Receiver, spool: &TestSpool) -> tempfile::TempDir {
    let home = tempfile::tempdir().unwrap();
    std::fs::write(
        home.path().join("config.toml"),
        super::wiring::run_config(home.path(), free_port(), &rx.url(), "") + &spool.section,
    )
    .unwrap();
    home
}

/// Event `n` for `key`, through `hookspool enqueue`.
fn enqueue(home: &Path, key: &str, n: u64) {
    super::crash_dispatch::enqueue(home, key, &format!(r#"{{"topic":"{key}","n":{n}}}"#));
}

/// Every `n` delivered so far, with when it first arrived.
fn delivered(rx: &Receiver) -> BTreeMap<u64, Instant> {
    let mut out = BTreeMap::new();
    for r in rx.requests() {
        for e in r.json()["events"].as_array().cloned().unwrap_or_default() {
            if let Some(n) = e["n"].as_u64() {
                out.entry(n).or_insert(r.at);
            }
        }
    }
    out
}

/// Two `hookspool dispatch` processes on one PostgreSQL spool, each in a home of its own:
/// the first active, the second a standby.
struct Pair {
    _dir: tempfile::TempDir,
    spool: TestSpool,
    rx: Receiver,
    homes: (tempfile::TempDir, tempfile::TempDir),
    active: Svc,
    standby: Svc,
}

/// A started `Pair`, or `None` after the one skip rule.
async fn active_and_standby() -> Option<Pair> {
    active_and_standby_with(&[]).await
}

/// `active_and_standby` with `env` set for the standby.
async fn active_and_standby_with(env: &[(&str, &str)]) -> Option<Pair> {
    let dir = tempfile::tempdir().unwrap();
    let spool = tokio::task::block_in_place(|| TestSpool::postgres(dir.path()))?;
    let rx = Receiver::start().await;
    let homes = (home_for(&rx, &spool), home_for(&rx, &spool));
    drop(tokio::task::block_in_place(|| spool.open(homes.0.path())));
    let mut active = Svc::start(homes.0.path(), "dispatch", &[]);
    tokio::task::block_in_place(|| active.wait_log("dispatcher ready", Duration::from_secs(30)));
    let mut standby = Svc::start(homes.1.path(), "dispatch", env);
    tokio::task::block_in_place(|| standby.wait_log("standby:", Duration::from_secs(30)));
    Some(Pair {
        _dir: dir,
        spool,
        rx,
        homes,
        active,
        standby,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_dispatcher_takes_over_when_the_active_one_is_killed() {
    let Some(Pair {
        _dir,
        spool,
        rx,
        homes: (a_home, b_home),
        mut active,
        standby,
    }) = active_and_standby().await
    else {
        return;
    };
    let (a, b) = (a_home.path(), b_home.path());
    assert!(
        !standby.log().contains("dispatcher ready"),
        "a standby does not dispatch:\n{}",
        standby.log()
    );
    // `status` lists both, from the server's sessions: which one is active.
    let status = |home: &Path| -> String {
        let o = Command::new(bin())
            .arg("--home")
            .arg(home)
            .arg("status")
            .env_remove("HOOKSPOOL_CONFIG")
            .env_remove("HOOKSPOOL_HOME")
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let line = |text: &str| -> String {
        text.lines()
            .find(|l| l.starts_with("processes"))
            .unwrap_or_default()
            .to_string()
    };
    let (a_pid, b_pid) = (active.pid(), standby.pid());
    let st = tokio::task::block_in_place(|| line(&status(a)));
    assert!(
        st.contains(&format!(":{a_pid} (dispatch, active dispatcher"))
            && st.contains(&format!(":{b_pid} (dispatch, standby")),
        "{st}"
    );
    // An intake's /healthz (the same document) says which is which, and counts the standby.
    let (i_home, port) = (tempfile::tempdir().unwrap(), free_port());
    std::fs::write(
        i_home.path().join("config.toml"),
        super::wiring::run_config(i_home.path(), port, &rx.url(), "") + &spool.section,
    )
    .unwrap();
    let intake = Svc::start(i_home.path(), "intake", &[]);
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    tokio::task::block_in_place(|| intake.wait_serving(addr));
    let h = tokio::task::block_in_place(|| healthz(addr));
    assert_eq!(h["dispatcher"]["standbys"], 1, "{h:#}");
    let mut want = vec![
        (a_pid, "active".to_string()),
        (b_pid, "standby".to_string()),
    ];
    want.sort();
    assert_eq!(dispatcher_states(&h), want, "{h:#}");

    // Events while A is active.
    let mut sent: Vec<u64> = Vec::new();
    tokio::task::block_in_place(|| {
        for n in 0..20 {
            enqueue(a, &format!("k{}", n % 4), n);
            sent.push(n);
        }
    });
    let all_of = |sent: &[u64]| -> bool {
        let d = delivered(&rx);
        sent.iter().all(|n| d.contains_key(n))
    };
    let ok = tokio::task::block_in_place(|| {
        super::eventually(Duration::from_secs(30), || all_of(&sent))
    });
    assert!(ok, "delivered by the active one; log:\n{}", active.log());
    assert!(
        !standby.log().contains("attempt started"),
        "the standby delivered nothing:\n{}",
        standby.log()
    );

    // Kill A, keep sending: B takes over.
    active.signal(Signal::SIGKILL);
    let killed_at = Instant::now();
    tokio::task::block_in_place(|| {
        active.wait_exit(Duration::from_secs(10));
        for n in 20..60 {
            enqueue(b, &format!("k{}", n % 4), n);
            sent.push(n);
        }
    });
    let ok = tokio::task::block_in_place(|| {
        super::eventually(Duration::from_secs(60), || all_of(&sent))
    });
    assert!(
        ok,
        "delivered after the takeover; log of B:\n{}",
        standby.log()
    );
    assert!(
        standby
            .log()
            .contains("active: took the spool's dispatcher lock"),
        "{}",
        standby.log()
    );
    let d = delivered(&rx);
    let first_after = d
        .values()
        .filter(|t| **t > killed_at)
        .min()
        .copied()
        .expect("deliveries after the kill");
    let takeover = first_after.duration_since(killed_at).as_secs_f64();
    eprintln!(
        "failover: SIGKILL of the active dispatcher to the first delivery by the standby: {takeover:.2} s ({} events, 0 lost)",
        sent.len()
    );
    assert!(
        takeover < TAKEOVER_S_MAX,
        "takeover took {takeover:.2} s; log of B:\n{}",
        standby.log()
    );

    // Order per key: each key's events first arrived in the order they were enqueued.
    let mut per_key: BTreeMap<u64, Vec<(Instant, u64)>> = BTreeMap::new();
    for (n, at) in &d {
        per_key.entry(n % 4).or_default().push((*at, *n));
    }
    for (k, mut v) in per_key {
        v.sort();
        let order: Vec<u64> = v.iter().map(|(_, n)| *n).collect();
        let mut want = order.clone();
        want.sort();
        assert_eq!(order, want, "key k{k}: out of order");
    }
    let everything: BTreeSet<u64> = sent.iter().copied().collect();
    assert_eq!(d.keys().copied().collect::<BTreeSet<_>>(), everything);

    let settled = tokio::task::block_in_place(|| {
        super::eventually(Duration::from_secs(20), || {
            spool
                .open(b)
                .list_batches(&hookspool::store::BatchFilter {
                    limit: 10_000,
                    ..Default::default()
                })
                .unwrap()
                .iter()
                .all(|b| b.state.as_str() == "delivered")
        })
    });
    assert!(
        settled,
        "a batch left undelivered; log of B:\n{}",
        standby.log()
    );
    let s = tokio::task::block_in_place(|| spool.open(b));
    assert_eq!(s.check_invariants().unwrap(), Vec::<String>::new());
    drop(s);
    let st = tokio::task::block_in_place(|| line(&status(b)));
    assert!(
        st.contains(&format!(":{b_pid} (dispatch, active dispatcher"))
            && !st.contains(&format!(":{a_pid} ")),
        "the killed one is gone, the standby is active: {st}"
    );
    eprintln!("status after the takeover: {st}");
    let h = tokio::task::block_in_place(|| healthz(addr));
    assert_eq!(h["dispatcher"]["standbys"], 0, "{h:#}");
    assert_eq!(
        dispatcher_states(&h),
        vec![(b_pid, "active".to_string())],
        "{h:#}"
    );
    assert!(intake.stop().success());
    assert!(standby.stop().success());
}

/// GET /healthz of an intake: the status document.
/// A dispatcher on the home `d`, waited for until it is ready, then an intake on the home
/// `i` serving 127.0.0.1:`port`.
fn dispatcher_then_intake(d: &Path, i: &Path, port: u16) -> (Svc, Svc, std::net::SocketAddr) {
    tokio::task::block_in_place(|| {
        let mut dispatcher = Svc::start(d, "dispatch", &[]);
        dispatcher.wait_log("dispatcher ready", Duration::from_secs(30));
        let intake = Svc::start(i, "intake", &[]);
        let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        intake.wait_serving(addr);
        (dispatcher, intake, addr)
    })
}

fn healthz(addr: std::net::SocketAddr) -> serde_json::Value {
    let r = super::intake::raw(addr, &super::intake::request("GET", "/healthz", &[], b""));
    serde_json::from_slice(&r.body).unwrap()
}

/// The dispatchers of a status document's `processes`: (pid, state), by pid.
fn dispatcher_states(status: &serde_json::Value) -> Vec<(i32, String)> {
    let mut out: Vec<(i32, String)> = status["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["role"] == "dispatch")
        .map(|p| {
            (
                p["pid"].as_i64().unwrap() as i32,
                p["state"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    out.sort();
    out
}

/// An intake in a home of its own (another host, as far as the wake-up datagram goes)
/// wakes the dispatcher through PostgreSQL's NOTIFY: with a 5 s poll, each event arrives
/// well inside a second of its 2xx.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_intake_elsewhere_wakes_the_dispatcher_through_notify() {
    use hookspool::sources::verify::{MacAlg, mac_hex};
    let dir = tempfile::tempdir().unwrap();
    let Some(spool) = tokio::task::block_in_place(|| TestSpool::postgres(dir.path())) else {
        return;
    };
    let rx = Receiver::start().await;
    let slow_poll = |home: &Path, port: u16| {
        let text = super::wiring::run_config(home, port, &rx.url(), "")
            .replace("poll_s = 0.05", "poll_s = 5")
            + &spool.section;
        std::fs::write(home.join("config.toml"), text).unwrap();
    };
    let (i_home, d_home) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let port = free_port();
    slow_poll(i_home.path(), port);
    slow_poll(d_home.path(), free_port());
    drop(tokio::task::block_in_place(|| spool.open(d_home.path())));
    let (d, i, addr) = dispatcher_then_intake(d_home.path(), i_home.path(), port);
    // The first poll after the dispatcher's start has passed: what follows is woken.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut worst = Duration::ZERO;
    for n in 0..5u64 {
        let body = format!(r#"{{"topic":"w{n}","n":{n}}}"#);
        let sig = format!(
            "sha256={}",
            mac_hex(MacAlg::Sha256, b"wiring-source-secret", &[body.as_bytes()])
        );
        let (r, acked) = tokio::task::block_in_place(|| {
            let r = super::intake::raw(
                addr,
                &super::intake::request(
                    "POST",
                    "/hooks/s",
                    &[("X-Signature", &sig), ("Content-Type", "application/json")],
                    body.as_bytes(),
                ),
            );
            (r, Instant::now())
        });
        assert_eq!(r.status, 200, "{}", i.log());
        let until = Instant::now() + Duration::from_secs(10);
        let at = loop {
            if let Some(at) = delivered(&rx).get(&n) {
                break *at;
            }
            assert!(
                Instant::now() < until,
                "event {n} not delivered; dispatcher:\n{}",
                d.log()
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        };
        eprintln!("event {n}: {:?}", at.saturating_duration_since(acked));
        worst = worst.max(at.saturating_duration_since(acked));
    }
    eprintln!(
        "NOTIFY wake-up: worst 2xx -> delivery of 5 = {:.0} ms with poll_s = 5",
        worst.as_secs_f64() * 1e3
    );
    assert!(
        worst < Duration::from_secs(1),
        "woken by NOTIFY, not found by the 5 s poll: {worst:?}"
    );
    // /metrics (the intake's) says which dispatcher is active, from any host.
    let m = tokio::task::block_in_place(|| {
        super::intake::raw(addr, &super::intake::request("GET", "/metrics", &[], b""))
    });
    let text = String::from_utf8_lossy(&m.body).into_owned();
    let want = r#"role="dispatch",host="#;
    let active_line = text
        .lines()
        .find(|l| l.starts_with("hookspool_spool_process{") && l.contains(want))
        .unwrap_or_else(|| panic!("no dispatcher in /metrics:\n{text}"));
    assert!(
        active_line.contains(&format!(r#"pid="{}",active="true"}} 1"#, d.pid())),
        "{active_line}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("hookspool_spool_process{")
                && l.contains(r#"role="intake""#)
                && l.contains(&format!(r#"pid="{}""#, i.pid()))),
        "{text}"
    );
    assert!(i.stop().success());
    assert!(d.stop().success());
}

/// The active dispatcher stops answering (SIGSTOP, as a partitioned host) and PostgreSQL ends
/// its session (`pg_terminate_backend`, as TCP keepalives would): the standby takes over;
/// the old one, resumed and connecting again, finds the lock taken and stops instead of
/// writing as a second active dispatcher (systemd starts it again as a standby).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispatcher_whose_session_ended_finds_the_standby_active_and_stops() {
    let Some(Pair {
        _dir,
        spool,
        rx,
        homes: (_a_home, b_home),
        active: mut old,
        mut standby,
    }) = active_and_standby().await
    else {
        return;
    };
    let b = b_home.path();

    // The old one is frozen (a host that stopped answering) and its session ended: the
    // advisory lock's key is split into two 32-bit halves in pg_locks.
    old.signal(Signal::SIGSTOP);
    let key = hookspool::store::pg::PG_DISPATCH_LOCK_KEY;
    let (hi, lo) = ((key >> 32) as u32, key as u32);
    let ended: i64 = tokio::task::block_in_place(|| {
        let cluster = spool.cluster.as_ref().unwrap();
        let mut c = postgres::Client::connect(&cluster.url("spool"), postgres::NoTls).unwrap();
        c.query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_locks
             WHERE locktype = 'advisory' AND granted
               AND classid = $1::bigint::oid AND objid = $2::bigint::oid",
            &[&i64::from(hi), &i64::from(lo)],
        )
        .unwrap()
        .get(0)
    });
    assert_eq!(ended, 1, "one session held the lock");
    tokio::task::block_in_place(|| {
        standby.wait_log(
            "active: took the spool's dispatcher lock",
            Duration::from_secs(10),
        )
    });
    // It comes back: its session is gone and the lock is the standby's.
    old.signal(Signal::SIGCONT);
    let st = tokio::task::block_in_place(|| old.wait_exit(Duration::from_secs(20)));
    assert!(!st.success(), "the old one stops: {st:?}\n{}", old.log());
    assert!(
        old.log()
            .contains("another dispatcher took the spool's dispatcher lock"),
        "{}",
        old.log()
    );
    // The new active one delivers.
    tokio::task::block_in_place(|| enqueue(b, "k", 1));
    let ok = tokio::task::block_in_place(|| {
        super::eventually(Duration::from_secs(20), || delivered(&rx).contains_key(&1))
    });
    assert!(ok, "{}", standby.log());
    assert!(standby.stop().success());
}

/// Whether any session holds the spool's write lock now (a transaction advisory lock,
/// split into two 32-bit halves in pg_locks as the dispatcher lock is).
fn write_lock_held(spool: &TestSpool) -> bool {
    let key = hookspool::store::pg::PG_WRITE_LOCK_KEY;
    let (hi, lo) = ((key >> 32) as u32, key as u32);
    let cluster = spool.cluster.as_ref().unwrap();
    let mut c = postgres::Client::connect(&cluster.url("spool"), postgres::NoTls).unwrap();
    let n: i64 = c
        .query_one(
            "SELECT count(*) FROM pg_locks
             WHERE locktype = 'advisory' AND granted
               AND classid = $1::bigint::oid AND objid = $2::bigint::oid",
            &[&i64::from(hi), &i64::from(lo)],
        )
        .unwrap()
        .get(0);
    n > 0
}

/// Freeze `svc` outside a write transaction: one frozen inside holds the spool's write lock,
/// and then nobody can write the issue (ARCHITECTURE.md says so); this test is about the
/// heartbeat, so it freezes the process again between its transactions.
fn freeze_between_writes(svc: &mut super::fulldisk::Svc, spool: &TestSpool) {
    for _ in 0..50 {
        svc.signal(Signal::SIGSTOP);
        std::thread::sleep(Duration::from_millis(50));
        if !write_lock_held(spool) {
            return;
        }
        svc.signal(Signal::SIGCONT);
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("the dispatcher held the write lock at every freeze");
}

/// The issue `spool:no_active_dispatcher`'s state, if it was ever opened.
fn no_active_state(spool: &TestSpool, home: &Path) -> Option<String> {
    spool
        .open(home)
        .issue_by_fingerprint(hookspool::observe::issues::NO_ACTIVE_DISPATCHER)
        .unwrap()
        .map(|i| i.state)
}

/// The active dispatcher hangs with its session alive (SIGSTOP): it holds the lock, so no
/// standby can take over, and nothing is delivered. The standby sees the heartbeat stop
/// (three `heartbeat_s` of 0.2 s) and opens `spool:no_active_dispatcher`, and runs the alert
/// pass the frozen one cannot (a dry alert names the issue). SIGCONT: the active one's next
/// heartbeat resolves it. Frozen again, the issue reopens; SIGKILL ends its session, the
/// standby takes the lock and its first heartbeat resolves it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_active_dispatcher_opens_no_active_dispatcher_until_one_is_active() {
    let Some(Pair {
        _dir,
        spool,
        rx: _rx,
        homes: (a_home, b_home),
        mut active,
        mut standby,
    }) = active_and_standby().await
    else {
        return;
    };
    let (a, b) = (a_home.path(), b_home.path());
    let state = |want: &str| {
        tokio::task::block_in_place(|| {
            super::eventually(Duration::from_secs(10), || {
                no_active_state(&spool, b).as_deref() == Some(want)
            })
        })
    };
    // Both alive and heartbeating: no issue.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        tokio::task::block_in_place(|| no_active_state(&spool, a)),
        None,
        "{}",
        standby.log()
    );

    tokio::task::block_in_place(|| freeze_between_writes(&mut active, &spool));
    assert!(state("open"), "opened by the standby:\n{}", standby.log());
    assert!(
        standby.log().contains("spool:no_active_dispatcher"),
        "{}",
        standby.log()
    );
    let alerted = tokio::task::block_in_place(|| {
        super::eventually(Duration::from_secs(10), || {
            spool
                .open(b)
                .dry_alerts()
                .unwrap()
                .iter()
                .any(|(_, _, text)| text.contains("spool:no_active_dispatcher"))
        })
    });
    assert!(alerted, "the standby's alert pass: {}", standby.log());

    active.signal(Signal::SIGCONT);
    assert!(
        state("resolved"),
        "resolved by the resumed one:\n{}",
        active.log()
    );
    assert!(!standby.log().contains("active: took"), "{}", standby.log());

    tokio::task::block_in_place(|| freeze_between_writes(&mut active, &spool));
    assert!(state("open"), "reopened:\n{}", standby.log());
    active.signal(Signal::SIGKILL);
    tokio::task::block_in_place(|| {
        active.wait_exit(Duration::from_secs(10));
        standby.wait_log(
            "active: took the spool's dispatcher lock",
            Duration::from_secs(10),
        )
    });
    assert!(
        state("resolved"),
        "resolved by the new active one:\n{}",
        standby.log()
    );
    assert!(standby.stop().success());
}

/// With no standby to notice, the intake does: the only dispatcher is SIGKILLed, and the
/// intake's writer (it looks every `DISPATCHER_CHECK_S`) opens `spool:no_active_dispatcher`
/// once the heartbeat is three `heartbeat_s` old. A dispatcher started again resolves it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_intake_opens_no_active_dispatcher_when_every_dispatcher_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let Some(spool) = tokio::task::block_in_place(|| TestSpool::postgres(dir.path())) else {
        return;
    };
    let rx = Receiver::start().await;
    let port = free_port();
    let i_home = tempfile::tempdir().unwrap();
    std::fs::write(
        i_home.path().join("config.toml"),
        super::wiring::run_config(i_home.path(), port, &rx.url(), "") + &spool.section,
    )
    .unwrap();
    let d_home = home_for(&rx, &spool);
    let d = d_home.path();
    drop(tokio::task::block_in_place(|| spool.open(d)));
    let (mut first, i, _) = dispatcher_then_intake(d, i_home.path(), port);

    first.signal(Signal::SIGKILL);
    tokio::task::block_in_place(|| first.wait_exit(Duration::from_secs(10)));
    let check_s = hookspool::intake::writer::DISPATCHER_CHECK_S as f64;
    let opened = tokio::task::block_in_place(|| {
        super::eventually(Duration::from_secs_f64(2.0 * check_s + 5.0), || {
            no_active_state(&spool, d).as_deref() == Some("open")
        })
    });
    assert!(opened, "opened by the intake:\n{}", i.log());
    assert!(
        i.log().contains("spool:no_active_dispatcher"),
        "{}",
        i.log()
    );

    let mut second = Svc::start(d, "dispatch", &[]);
    tokio::task::block_in_place(|| second.wait_log("dispatcher ready", Duration::from_secs(30)));
    let resolved = tokio::task::block_in_place(|| {
        super::eventually(Duration::from_secs(10), || {
            no_active_state(&spool, d).as_deref() == Some("resolved")
        })
    });
    assert!(
        resolved,
        "resolved by the new dispatcher:\n{}",
        second.log()
    );
    assert!(second.stop().success());
    assert!(i.stop().success());
}

/// On PostgreSQL this host's disk holds nothing of the spool: with `limits.min_free_bytes`
/// above any disk's size, the intake still stores a webhook (on SQLite it answers 503),
/// the dispatcher opens no `spool:min_free_bytes`, and status (`/healthz`, `status --json`)
/// reports the database's size as `spool_bytes` and no `disk_free_bytes`; /metrics has no
/// `hookspool_disk_free_bytes` sample.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_the_local_disk_limits_nothing_and_status_reports_the_database_size() {
    use hookspool::sources::verify::{MacAlg, mac_hex};
    let dir = tempfile::tempdir().unwrap();
    let Some(spool) = tokio::task::block_in_place(|| TestSpool::postgres(dir.path())) else {
        return;
    };
    let rx = Receiver::start().await;
    let port = free_port();
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    // 1 EiB: more than any disk here has free.
    let text = super::wiring::run_config(h, port, &rx.url(), "")
        .replace("min_free_bytes = 0", "min_free_bytes = 1152921504606846976")
        + &spool.section;
    std::fs::write(h.join("config.toml"), text).unwrap();
    drop(tokio::task::block_in_place(|| spool.open(h)));
    let (d, i, addr) = dispatcher_then_intake(h, h, port);

    let body = r#"{"topic":"disk","n":1}"#;
    let sig = format!(
        "sha256={}",
        mac_hex(MacAlg::Sha256, b"wiring-source-secret", &[body.as_bytes()])
    );
    let r = tokio::task::block_in_place(|| {
        super::intake::raw(
            addr,
            &super::intake::request(
                "POST",
                "/hooks/s",
                &[("X-Signature", &sig), ("Content-Type", "application/json")],
                body.as_bytes(),
            ),
        )
    });
    assert_eq!(r.status, 200, "{}", i.log());
    let ok = tokio::task::block_in_place(|| {
        super::eventually(Duration::from_secs(20), || delivered(&rx).contains_key(&1))
    });
    assert!(ok, "{}", d.log());

    // The database's size, as the server says it.
    let size: i64 = tokio::task::block_in_place(|| {
        let cluster = spool.cluster.as_ref().unwrap();
        let mut c = postgres::Client::connect(&cluster.url("spool"), postgres::NoTls).unwrap();
        c.query_one("SELECT pg_database_size('spool')", &[])
            .unwrap()
            .get(0)
    });
    let near = |v: &serde_json::Value| {
        let n = v.as_f64().unwrap_or(0.0);
        (n - size as f64).abs() < size as f64 * 0.1
    };
    let doc = tokio::task::block_in_place(|| healthz(addr));
    assert_eq!(doc["ok"], true, "{doc:#}");
    assert!(near(&doc["spool_bytes"]), "{size} vs {doc:#}");
    assert_eq!(doc["disk_free_bytes"], serde_json::Value::Null, "{doc:#}");
    let out = tokio::task::block_in_place(|| {
        Command::new(bin())
            .arg("--home")
            .arg(h)
            .args(["--json", "status"])
            .env_remove("HOOKSPOOL_CONFIG")
            .env_remove("HOOKSPOOL_HOME")
            .output()
            .unwrap()
    });
    let st: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(near(&st["spool_bytes"]), "{size} vs {st:#}");
    assert_eq!(st["disk_free_bytes"], serde_json::Value::Null, "{st:#}");
    assert_eq!(st["ok"], true, "{st:#}");
    let m = tokio::task::block_in_place(|| {
        super::intake::raw(addr, &super::intake::request("GET", "/metrics", &[], b""))
    });
    let metrics = String::from_utf8_lossy(&m.body).into_owned();
    assert!(
        !metrics
            .lines()
            .any(|l| l.starts_with("hookspool_disk_free_bytes ")),
        "{metrics}"
    );
    assert_eq!(
        tokio::task::block_in_place(|| spool
            .open(h)
            .issue_by_fingerprint("spool:min_free_bytes")
            .unwrap()),
        None,
        "{}",
        d.log()
    );
    assert!(i.stop().success());
    assert!(d.stop().success());
}

/// A standby feeds systemd's watchdog while it waits (it asks for the lock and checks the
/// active one's heartbeat every `STANDBY_POLL_S`): it sent READY=1 and then no WATCHDOG=1
/// at all, so under the shipped unit (WatchdogSec=30s) systemd restarted every standby
/// each 30 s. Its NOTIFY_SOCKET here is a datagram socket the test reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_dispatcher_feeds_the_watchdog_while_it_waits() {
    let watchdog = super::fulldisk::Watchdog::bind();
    let notify = watchdog.path().to_str().unwrap().to_string();
    // Every part bound, so the spool's cluster lives until the end.
    let Some(Pair {
        _dir,
        spool: _spool,
        rx: _rx,
        homes: _homes,
        mut active,
        standby,
    }) = active_and_standby_with(&[("NOTIFY_SOCKET", &notify)]).await
    else {
        return;
    };
    let from = Instant::now();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let pings = watchdog.pings_between(from, Instant::now());
    assert!(
        !standby.log().contains("dispatcher ready"),
        "still a standby:\n{}",
        standby.log()
    );
    assert!(
        pings >= 3,
        "a standby sent {pings} WATCHDOG=1 in 3 s:\n{}",
        standby.log()
    );
    assert!(standby.stop().success());
    active.assert_running("beside the standby");
    assert!(active.stop().success());
}
