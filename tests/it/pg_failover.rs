//! One active dispatcher and a hot standby on one PostgreSQL spool (issue 33's core): two
//! `hookspool dispatch` processes with homes of their own share the spool; the second finds
//! the spool's dispatcher lock held and waits as a standby, delivering nothing. SIGKILL the
//! active one while events keep coming: its session ends, the standby takes the lock,
//! recovers the dead one's leases at once and delivers. The time from the kill to the
//! first delivery by the new one is printed; every event is delivered, in order per key,
//! and nothing is left leased.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
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

fn enqueue(home: &Path, key: &str, n: u64) {
    let mut c = Command::new(bin())
        .arg("--home")
        .arg(home)
        .args(["enqueue", "--source", "s", "--key", key])
        .env_remove("HOOKSPOOL_CONFIG")
        .env_remove("HOOKSPOOL_HOME")
        .env_remove("HOOKSPOOL_FAILPOINT")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin
        .take()
        .unwrap()
        .write_all(format!(r#"{{"topic":"{key}","n":{n}}}"#).as_bytes())
        .unwrap();
    let o = c.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_dispatcher_takes_over_when_the_active_one_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let Some(spool) = tokio::task::block_in_place(|| TestSpool::postgres(dir.path())) else {
        return;
    };
    let rx = Receiver::start().await;
    let (a_home, b_home) = (home_for(&rx, &spool), home_for(&rx, &spool));
    let (a, b) = (a_home.path(), b_home.path());
    drop(tokio::task::block_in_place(|| spool.open(a)));

    let mut active = Svc::start(a, "dispatch", &[]);
    tokio::task::block_in_place(|| active.wait_log("dispatcher ready", Duration::from_secs(30)));
    let mut standby = Svc::start(b, "dispatch", &[]);
    tokio::task::block_in_place(|| standby.wait_log("standby:", Duration::from_secs(30)));
    assert!(
        !standby.log().contains("dispatcher ready"),
        "a standby does not dispatch:\n{}",
        standby.log()
    );

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
    assert!(standby.stop().success());
}
