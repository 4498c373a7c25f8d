//! `hookspool spool copy` (issue 32): a spool with a batch in every state, dead and
//! quarantined batches, tee copies, an excluded event, a dedup row, an operator's pause and
//! its audit, copied SQLite -> PostgreSQL -> SQLite through the real binary, gives the same
//! `export`, with the figures printed; a copy refuses a non-empty target, a running
//! dispatcher's lock and a URL on the command line, and never shows the password.

use std::path::{Path, PathBuf};

use hookspool::store::{AttemptReport, Copy, Mark, Quarantine, RejectionCount, Store};
use hookspool::vocab::Klass;

use super::pg_harness::cluster;
use super::pg_spool::{SENTINEL, hs, pg_home, text};
use super::{open, request, window};

const T0: f64 = 1_700_000_000.0;

fn claim(s: &mut Store, batch: i64, now: f64) -> (i64, String) {
    let c = s
        .claim(
            batch,
            "w",
            now + 60.0,
            now,
            false,
            hookspool::store::DeliveryId::per_attempt("msg_"),
        )
        .unwrap()
        .expect("claimed");
    (c.attempt_id, c.lease_owner)
}

fn mark(s: &mut Store, batch: i64, now: f64, m: Mark) {
    let (attempt_id, lease_owner) = claim(s, batch, now);
    let rep = AttemptReport {
        batch_id: batch,
        attempt_id,
        lease_owner,
        now: now + 1.0,
        status: Some(500),
        error: Some("upstream said no".into()),
        duration_ms: 12,
        delivery_id: Some(format!("msg_{attempt_id}")),
        events_delivered: None,
        failed_event_id: None,
        mark: m,
    };
    s.mark(&rep).unwrap();
}

/// The first batch id the outcome names.
fn batch_of(o: &hookspool::store::EnqueueOutcome) -> i64 {
    use hookspool::store::EnqueueOutcome as O;
    match o {
        O::Queued { copies } => copies[0].1,
        O::Quarantined { batch_id, .. } | O::Replayed { batch_id } => *batch_id,
        O::Duplicate { .. } => panic!("duplicate"),
    }
}

/// A spool holding every batch state and every kind of row, built through the store's API.
fn build(db: &Path) {
    let mut s = open(db);
    let now = T0;
    let immediate = window(0.0, 0.0, 10, 100_000);
    let slow = window(1000.0, 5000.0, 10, 100_000);
    // open
    s.enqueue(&request("r-open", "k", r#"{"n":1}"#, now, slow))
        .unwrap();
    // a tee: the same event in a second route's batch; with a dedup id, sent twice
    let mut teed = request(
        "r-main",
        "k",
        r#"{"n":2,"nested":{"b":1,"a":[1,2]}}"#,
        now,
        immediate,
    );
    teed.dedup_id = Some("evt-1".into());
    teed.tees = vec![Copy {
        route: "r-tee".into(),
        destination: "http:r-tee".into(),
        window: immediate,
    }];
    teed.raw = Some(b"raw body \x00\xff bytes".to_vec());
    let main_batch = batch_of(&s.enqueue(&teed).unwrap());
    let again = s.enqueue(&teed).unwrap();
    assert!(!again.is_new(), "a duplicate");
    // quarantine
    let mut q = request("r-q", "k", r#"{"n":3}"#, now, immediate);
    q.payload = None;
    q.raw = Some(b"not json".to_vec());
    q.quarantine = Some(Quarantine {
        error_class: "BadKey".into(),
    });
    s.enqueue(&q).unwrap();
    // two events in one batch, one of them excluded later
    let mut two = Vec::new();
    for n in 0..2 {
        let r = request(
            "r-excl",
            "k",
            &format!(r#"{{"n":{n}}}"#),
            now,
            window(0.0, 0.0, 2, 100_000),
        );
        two.push(r);
    }
    let excl_batch = batch_of(&s.enqueue_many(&two).unwrap()[0].as_ref().unwrap().clone());
    // one batch each for delivered, retry, dead, leased, sealed, dropped
    let mut ids = Vec::new();
    for (i, route) in [
        "r-ok", "r-retry", "r-dead", "r-leased", "r-sealed", "r-drop",
    ]
    .iter()
    .enumerate()
    {
        let r = request(
            route,
            "k",
            &format!(r#"{{"i":{i},"s":"é 😀"}}"#),
            now,
            immediate,
        );
        ids.push(batch_of(&s.enqueue(&r).unwrap()));
    }
    s.seal_ready(now + 1.0).unwrap();
    // the excluded event: after sealing, so the hash is recomputed over the rest
    let events = s.frozen_events(excl_batch).unwrap();
    assert_eq!(events.len(), 2);
    s.exclude(excl_batch, &[events[0].id], now + 2.0).unwrap();
    mark(
        &mut s,
        ids[0],
        now + 3.0,
        Mark::Delivered {
            result: Some("{\"ok\":true}".into()),
            emits: vec![],
        },
    );
    mark(
        &mut s,
        ids[1],
        now + 3.0,
        Mark::Retry {
            klass: Klass::Transport,
            next_attempt_at: now + 600.0,
        },
    );
    mark(
        &mut s,
        ids[2],
        now + 3.0,
        Mark::Dead {
            klass: Klass::Permanent,
        },
    );
    claim(&mut s, ids[3], now + 3.0);
    s.drop_batches(&[ids[5]], now + 4.0).unwrap();
    s.pause("http:r-sealed", "operator", Some("maintenance"), now + 5.0)
        .unwrap();
    // the intake's rejection counts of two hours
    let hour = hookspool::store::rejection_hour(now);
    s.add_rejections(&[
        RejectionCount {
            hour: hour - 3600,
            source: "gh".into(),
            reason: "unverified".into(),
            count: 3,
        },
        RejectionCount {
            hour,
            source: "gh".into(),
            reason: "too_large".into(),
            count: 1,
        },
    ])
    .unwrap();
    mark(
        &mut s,
        main_batch,
        now + 6.0,
        Mark::Delivered {
            result: None,
            emits: vec![],
        },
    );
    let states: Vec<String> = s
        .list_batches(&hookspool::store::BatchFilter {
            limit: 100,
            ..Default::default()
        })
        .unwrap()
        .iter()
        .map(|b| b.state.as_str().to_string())
        .collect();
    for want in [
        "open",
        "sealed",
        "leased",
        "retry",
        "delivered",
        "dead",
        "dropped",
    ] {
        assert!(states.iter().any(|s| s == want), "{want} in {states:?}");
    }
    assert!(s.check_invariants().unwrap().is_empty());
}

fn export(home: &Path) -> String {
    let o = hs(home, &["export"]);
    assert!(o.status.success(), "{}", text(&o));
    String::from_utf8(o.stdout).unwrap()
}

fn sqlite_home(dir: &Path) -> PathBuf {
    let home = dir.to_path_buf();
    std::fs::create_dir_all(&home).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::write(home.join("config.toml"), "").unwrap();
    home
}

#[test]
fn a_spool_copied_sqlite_to_postgres_and_back_gives_the_same_export() {
    let Some(pg) = cluster() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let a = sqlite_home(&tmp.path().join("a"));
    build(&a.join("spool.db"));
    let before = export(&a);
    assert!(before.lines().count() > 20, "{before}");

    // SQLite -> PostgreSQL
    let url = pg.database("spool");
    let pgh = pg_home(&tmp.path().join("p"), &url);
    let url_file = tmp.path().join("p").join("pg-url");
    let to = format!("postgres:{}", url_file.display());
    let o = hs(&a, &["spool", "copy", "--to", &to]);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("verified it before committing"), "{t}");
    assert!(t.contains("batches 11") && t.contains("dedup 1"), "{t}");
    assert!(t.contains("rejections 2"), "{t}");
    assert!(t.contains("content_hash: 9 batches recomputed"), "{t}");
    assert!(!t.contains(pg.password()), "{t}");
    let o = hs(&pgh, &["check"]);
    assert!(o.status.success(), "{}", text(&o));

    // A second copy into the same, now full, database is refused and writes nothing.
    let o = hs(&a, &["spool", "copy", "--to", &to]);
    assert!(!o.status.success());
    assert!(text(&o).contains("is not an empty spool"), "{}", text(&o));

    // PostgreSQL -> SQLite, with the figures as JSON.
    let b = sqlite_home(&tmp.path().join("b"));
    let back = format!("sqlite:{}", b.join("spool.db").display());
    let o = hs(&pgh, &["--json", "spool", "copy", "--to", &back]);
    assert!(o.status.success(), "{}", text(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["dedup_rows"], 1);
    assert_eq!(j["hashes_recomputed"], 9);
    assert_eq!(j["hashes_equal_to_stored"], 9);
    let after = export(&b);
    assert_eq!(after, before, "the same export after the round trip");

    // The instance id (in every webhook-id) came along, and the copy's ids go on from the
    // source's: the next batch gets a new id on both.
    let sa = open(&a.join("spool.db"));
    let sb = open(&b.join("spool.db"));
    assert_eq!(sa.instance_id().unwrap(), sb.instance_id().unwrap());
    assert_eq!(
        sb.rejections_since(0.0).unwrap(),
        vec![
            ("gh".to_string(), "too_large".to_string(), 1),
            ("gh".to_string(), "unverified".to_string(), 3)
        ],
        "the rejection counts came back"
    );
    let o = hs(&b, &["check"]);
    assert!(o.status.success(), "{}", text(&o));
    // PostgreSQL's identities were moved past the copied ids.
    let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let next: i64 = c
        .query_one(
            "INSERT INTO audit (at, action) VALUES (1, 'x') RETURNING id",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(
        next > 3,
        "a new audit row after the 3 copied ones gets id {next}"
    );
}

#[test]
fn a_copy_refuses_a_running_dispatcher_a_url_argument_and_never_shows_the_password() {
    let Some(pg) = cluster() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let a = sqlite_home(&tmp.path().join("a"));
    build(&a.join("spool.db"));
    let url = pg.database("spool");
    let _ = pg_home(&tmp.path().join("p"), &url);
    let to = format!("postgres:{}", tmp.path().join("p").join("pg-url").display());

    // A URL on the command line is refused without being echoed.
    let o = hs(
        &a,
        &[
            "spool",
            "copy",
            "--to",
            &pg.url_with_password("spool", SENTINEL),
        ],
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(!text(&o).contains(SENTINEL), "{}", text(&o));

    // A wrong password in the URL file: refused, the password nowhere.
    let bad = pg_home(
        &tmp.path().join("bad"),
        &pg.url_with_password("spool", SENTINEL),
    );
    let _ = bad;
    let bad_to = format!(
        "postgres:{}",
        tmp.path().join("bad").join("pg-url").display()
    );
    let o = hs(&a, &["spool", "copy", "--to", &bad_to]);
    assert!(!o.status.success());
    assert!(
        text(&o).contains("password authentication failed"),
        "{}",
        text(&o)
    );
    assert!(!text(&o).contains(SENTINEL), "{}", text(&o));

    // The dispatcher's lock held: exit 3, nothing written.
    let lock = hookspool::dispatch::lock(&a).unwrap();
    let o = hs(&a, &["spool", "copy", "--to", &to]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    drop(lock);
    let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let schema: bool = c
        .query_one("SELECT to_regclass('batches') IS NOT NULL", &[])
        .unwrap()
        .get(0);
    assert!(!schema, "nothing was written while the lock was held");
    assert!(hs(&a, &["spool", "copy", "--to", &to]).status.success());
}
