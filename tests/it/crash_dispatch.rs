//! Crash tests of the dispatcher (spec 12, 18): the real `hookspool dispatch` is killed with
//! SIGKILL at the failpoints of delivery and retention, restarted, and what spec 12's table
//! promises is checked. A claim committed and no request made: delivered once after the
//! restart, the lost attempt uncounted. The destination's 2xx before the mark: delivered
//! again, the same events, hash and webhook-id (at least once). A script that exited, its
//! emits not recorded: it runs again and its emits are committed once, with the mark. A
//! retention pass between two of its transactions (and inside one): no batch is left
//! delivered with events missing, dead batches are untouched, and the next run finishes it.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use hookspool::store::{AttemptReport, BatchFilter, Mark, Store};
use hookspool::vocab::Klass;

use super::fulldisk::Svc;
use super::receiver::Receiver;
use super::{bin, killed, open, request, window};

/// `hookspool enqueue --source s --key <key>` of `payload` on `home` (wiring's run config),
/// which must succeed.
pub(super) fn enqueue(home: &Path, key: &str, payload: &str) {
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
        .write_all(payload.as_bytes())
        .unwrap();
    let o = c.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// `hookspool dispatch` killed at `failpoint`: it must die there, by SIGKILL.
fn dispatch_killed_at(home: &Path, failpoint: &str) {
    let mut d = Svc::start(home, "dispatch", &[("HOOKSPOOL_FAILPOINT", failpoint)]);
    let st = d.wait_exit(Duration::from_secs(30));
    assert!(killed(&st), "{failpoint}: {st:?}\n{}", d.log());
    assert!(
        d.log().contains(&format!("FAILPOINT {failpoint}")),
        "{}",
        d.log()
    );
}

fn wait_delivered(home: &Path, batch: i64) {
    wait_delivered_in(home, &super::TestSpool::sqlite(), batch);
}

fn wait_delivered_in(home: &Path, spool: &super::TestSpool, batch: i64) {
    let until = std::time::Instant::now() + Duration::from_secs(30);
    while spool.open(home).batch(batch).unwrap().state.as_str() != "delivered" {
        assert!(
            std::time::Instant::now() < until,
            "batch {batch} not delivered"
        );
        std::thread::sleep(Duration::from_millis(25));
    }
}

fn http_home(rx: &Receiver, spool: &super::TestSpool) -> tempfile::TempDir {
    let home = tempfile::tempdir().unwrap();
    let port = super::run_e2e::free_port();
    std::fs::write(
        home.path().join("config.toml"),
        super::wiring::run_config(home.path(), port, &rx.url(), "") + &spool.section,
    )
    .unwrap();
    home
}

/// Each test body on SQLite and, as `<name>_on_postgres`, on a PostgreSQL spool.
macro_rules! on_both {
    ($($name:ident / $pg:ident),+ $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            $name::body(&super::TestSpool::sqlite()).await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $pg() {
            let dir = tempfile::tempdir().unwrap();
            let Some(spool) = tokio::task::block_in_place(|| super::TestSpool::postgres(dir.path()))
            else {
                return;
            };
            $name::body(&spool).await;
        }
    )+};
}

on_both!(
    dispatcher_killed_after_its_claim_before_the_request_delivers_once_after_restart_uncounted
        / dispatcher_killed_after_its_claim_before_the_request_delivers_once_after_restart_uncounted_on_postgres,
    dispatcher_killed_after_the_destinations_2xx_before_the_mark_delivers_the_same_batch_again
        / dispatcher_killed_after_the_destinations_2xx_before_the_mark_delivers_the_same_batch_again_on_postgres,
);

mod dispatcher_killed_after_its_claim_before_the_request_delivers_once_after_restart_uncounted {
    use super::*;

    pub async fn body(spool: &crate::TestSpool) {
        let rx = Receiver::start().await;
        let home = http_home(&rx, spool);
        let h = home.path();
        tokio::task::block_in_place(|| {
            enqueue(h, "k", r#"{"topic":"claimed"}"#);
            dispatch_killed_at(h, "deliver.after_claim");
        });
        assert!(rx.requests().is_empty(), "no request was made");
        let s = spool.open(h);
        let b = s.batch(1).unwrap();
        assert_eq!(b.state.as_str(), "leased", "the claim was committed");
        let a = s.attempts(1).unwrap();
        assert_eq!(
            (a.len(), a[0].outcome),
            (1, None),
            "its attempt open: {a:?}"
        );
        drop(s);

        let d = Svc::start(h, "dispatch", &[]);
        tokio::task::block_in_place(|| wait_delivered_in(h, spool, 1));
        assert!(d.stop().success());
        assert_eq!(rx.requests().len(), 1, "delivered once after the restart");
        let s = spool.open(h);
        let a = s.attempts(1).unwrap();
        assert_eq!(a.len(), 2, "{a:?}");
        assert_eq!(a[0].outcome.map(|o| o.as_str()), Some("retry"));
        assert_eq!(a[0].error.as_deref(), Some("lease expired"));
        assert!(!a[0].counted, "the lost attempt is not counted");
        assert_eq!(a[1].outcome.map(|o| o.as_str()), Some("ok"));
        assert_eq!(s.batch(1).unwrap().attempts, 1, "only the delivery counts");
        assert_eq!(s.check_invariants().unwrap(), Vec::<String>::new());
    }
}

mod dispatcher_killed_after_the_destinations_2xx_before_the_mark_delivers_the_same_batch_again {
    use super::*;

    pub async fn body(spool: &crate::TestSpool) {
        let rx = Receiver::start().await;
        let home = http_home(&rx, spool);
        let h = home.path();
        tokio::task::block_in_place(|| {
            enqueue(h, "k", r#"{"topic":"answered","n":1}"#);
            dispatch_killed_at(h, "deliver.after_response");
        });
        assert_eq!(rx.requests().len(), 1, "the receiver answered 200");
        assert_eq!(
            spool.open(h).batch(1).unwrap().state.as_str(),
            "leased",
            "and nothing was recorded"
        );
        let d = Svc::start(h, "dispatch", &[]);
        tokio::task::block_in_place(|| wait_delivered_in(h, spool, 1));
        assert!(d.stop().success());
        let got = rx.requests();
        assert_eq!(got.len(), 2, "at least once: delivered again");
        let (first, second) = (got[0].json(), got[1].json());
        assert_eq!(first["events"], second["events"], "the same events");
        assert_eq!(first["content_hash"], second["content_hash"]);
        assert_eq!(
            got[0].header("webhook-id"),
            got[1].header("webhook-id"),
            "the same webhook-id (per batch for http), so the receiver can dedup"
        );
        assert_eq!(
            (
                got[0].header("x-hookspool-attempt"),
                got[1].header("x-hookspool-attempt")
            ),
            (Some("1"), Some("2"))
        );
        let s = spool.open(h);
        assert_eq!(s.check_invariants().unwrap(), Vec::<String>::new());
    }
}

#[test]
fn dispatcher_killed_after_a_script_exited_before_its_emits_were_recorded_runs_it_again_emits_once()
{
    let home = tempfile::tempdir().unwrap();
    let scripts = tempfile::tempdir().unwrap();
    let h = home.path();
    std::fs::write(
        h.join("config.toml"),
        super::emit_script_config(h, scripts.path()),
    )
    .unwrap();
    enqueue(h, "k", r#"{"n":1}"#);
    dispatch_killed_at(h, "deliver.after_script_exit");
    let runs = || {
        std::fs::read_to_string(h.join("state/runs"))
            .unwrap_or_default()
            .lines()
            .count()
    };
    let emitted = |s: &Store| -> i64 {
        s.list_batches(&BatchFilter {
            source: Some("followup".into()),
            limit: 10,
            ..Default::default()
        })
        .unwrap()
        .iter()
        .map(|b| b.count)
        .sum()
    };
    assert_eq!(runs(), 1, "the script ran and exited");
    {
        let s = open(&h.join("spool.db"));
        assert_eq!(s.batch(1).unwrap().state.as_str(), "leased");
        assert_eq!(emitted(&s), 0, "its emits were not recorded");
    }
    let d = Svc::start(h, "dispatch", &[]);
    wait_delivered(h, 1);
    assert!(d.stop().success());
    assert_eq!(runs(), 2, "at least once: the script ran again");
    let s = open(&h.join("spool.db"));
    assert_eq!(emitted(&s), 1, "its emits committed once, with the mark");
    assert_eq!(s.check_invariants().unwrap(), Vec::<String>::new());
}

const DAY_S: f64 = 86_400.0;
const BIG_EVENTS: i64 = 2500;

fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Enqueue `n` events for `key` (one group commit), sealed by size at the n-th; returns
/// the batch id.
fn batch_of(s: &mut Store, key: &str, n: i64, at: f64) -> i64 {
    let reqs: Vec<_> = (0..n)
        .map(|i| {
            request(
                "r",
                key,
                &format!(r#"{{"i":{i}}}"#),
                at,
                window(60.0, 600.0, n, 10_000_000),
            )
        })
        .collect();
    for r in s.enqueue_many(&reqs).unwrap() {
        r.unwrap();
    }
    let b: Vec<_> = s
        .list_batches(&BatchFilter {
            limit: 1000,
            ..Default::default()
        })
        .unwrap()
        .into_iter()
        .filter(|b| b.key == key)
        .collect();
    assert_eq!((b.len(), b[0].state.as_str()), (1, "sealed"), "{key}");
    b[0].id
}

fn finish(s: &mut Store, batch: i64, at: f64, mark: Mark) {
    let c = s
        .claim(
            batch,
            "setup:1",
            at + 60.0,
            at,
            false,
            hookspool::store::DeliveryId::per_attempt(""),
        )
        .unwrap()
        .unwrap();
    let rep = AttemptReport {
        batch_id: batch,
        attempt_id: c.attempt_id,
        lease_owner: c.lease_owner,
        now: at,
        status: Some(200),
        error: None,
        duration_ms: 1,
        delivery_id: None,
        events_delivered: None,
        failed_event_id: None,
        mark,
    };
    s.mark(&rep).unwrap();
}

fn delivered() -> Mark {
    Mark::Delivered {
        result: None,
        emits: vec![],
    }
}

/// What a crash must never leave: a delivered batch with fewer events than it says, a dead
/// batch touched, a recent delivered batch pruned, or any other broken invariant.
fn assert_nothing_half_pruned(s: &Store, dead: i64, recent: i64, when: &str) {
    assert_eq!(
        s.check_invariants().unwrap(),
        Vec::<String>::new(),
        "{when}"
    );
    for b in s
        .list_batches(&BatchFilter {
            state: Some("delivered".into()),
            limit: 1000,
            ..Default::default()
        })
        .unwrap()
    {
        assert_eq!(
            s.events(b.id, false).unwrap().len() as i64,
            b.count,
            "{when}: delivered batch {} is missing events",
            b.id
        );
    }
    let d = s.batch(dead).unwrap();
    assert_eq!(
        (d.state.as_str(), s.events(dead, false).unwrap().len()),
        ("dead", 100),
        "{when}: dead batches are untouched"
    );
    assert_eq!(
        s.batch(recent).unwrap().state.as_str(),
        "delivered",
        "{when}"
    );
}

#[test]
fn retention_killed_between_and_inside_its_transactions_never_leaves_a_half_pruned_delivered_batch()
{
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    std::fs::write(h.join("config.toml"), "[dispatch]\npoll_s = 0.05\n").unwrap();
    let old = now() - 30.0 * DAY_S;
    let (big, small, dead, recent) = {
        let mut s = open(&h.join("spool.db"));
        // The oldest, too big for one retention transaction (PRUNE_ROWS_MAX rows).
        let big = batch_of(&mut s, "big", BIG_EVENTS, old);
        finish(&mut s, big, old, delivered());
        let small: Vec<i64> = (0..5)
            .map(|k| {
                let b = batch_of(&mut s, &format!("small{k}"), 3, old + 1.0);
                finish(&mut s, b, old + 1.0, delivered());
                b
            })
            .collect();
        let dead = batch_of(&mut s, "dead", 100, old);
        finish(
            &mut s,
            dead,
            old,
            Mark::Dead {
                klass: Klass::Permanent,
            },
        );
        let recent = batch_of(&mut s, "recent", 3, now());
        finish(&mut s, recent, now(), delivered());
        (big, small, dead, recent)
    };
    let left = |s: &Store| s.events(big, false).unwrap().len() as i64;

    // Killed after the first transaction: part of the big batch's events are gone, and
    // the batch is no longer shown as delivered.
    dispatch_killed_at(h, "prune.between_steps");
    let s = open(&h.join("spool.db"));
    let after_one = left(&s);
    assert!(
        after_one > 0 && after_one < BIG_EVENTS,
        "one transaction took part of it: {after_one}"
    );
    let b = s.batch(big).unwrap();
    assert_eq!(
        (b.state.as_str(), b.result.as_deref()),
        ("dropped", Some("pruning")),
        "a batch being pruned is not delivered with events missing"
    );
    assert_nothing_half_pruned(&s, dead, recent, "after the first kill");
    drop(s);

    // Killed again after the next transaction, which goes on with that batch first.
    dispatch_killed_at(h, "prune.between_steps");
    let s = open(&h.join("spool.db"));
    let after_two = left(&s);
    assert!(
        after_two < after_one,
        "the next pass went on with it: {after_two}"
    );
    assert!(
        small.iter().all(|b| s.batch(*b).is_ok()),
        "and before anything else"
    );
    assert_nothing_half_pruned(&s, dead, recent, "after the second kill");
    drop(s);

    // Killed inside a transaction: it rolls back whole.
    dispatch_killed_at(h, "prune.before_commit");
    let s = open(&h.join("spool.db"));
    assert_eq!(left(&s), after_two, "nothing of a rolled-back step");
    assert_nothing_half_pruned(&s, dead, recent, "after a kill inside a step");
    drop(s);

    // A run to the end finishes the pass.
    let mut d = Svc::start(h, "dispatch", &[]);
    d.wait_log("retention pass done", Duration::from_secs(30));
    assert!(d.stop().success());
    let s = open(&h.join("spool.db"));
    assert!(s.batch(big).is_err(), "the big batch is gone");
    assert!(
        small.iter().all(|b| s.batch(*b).is_err()),
        "so are the small ones"
    );
    assert_nothing_half_pruned(&s, dead, recent, "after the pass");
}
