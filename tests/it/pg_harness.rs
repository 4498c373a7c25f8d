//! The throwaway PostgreSQL cluster of tests/support/pg.rs (issue 32): it runs with the
//! spool's durability settings on a Unix socket of its own, refuses a wrong password, lets
//! two clusters run side by side, comes back from `restart -m immediate`, and leaves nothing
//! behind, after Drop and after its process was killed with SIGKILL.

use std::time::Duration;

use super::eventually;
use super::pg::Cluster;

/// A started cluster, or `None` after the one skip rule (no PostgreSQL here).
pub fn cluster() -> Option<Cluster> {
    match Cluster::start() {
        Ok(c) => Some(c),
        Err(why) => {
            super::skip::skip_or_fail(&why);
            None
        }
    }
}

/// Whether `pid` is a running process (a zombie, exited but not yet reaped by whoever
/// adopted it, is not).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| !rest.starts_with('Z')))
        .unwrap_or(false)
}

fn show(c: &mut postgres::Client, setting: &str) -> String {
    c.query_one(&format!("SHOW {setting}"), &[]).unwrap().get(0)
}

#[test]
fn a_cluster_runs_durable_on_its_own_socket_and_is_gone_after_drop() {
    let Some(pg) = cluster() else { return };
    let dir = pg.dir().to_path_buf();
    let pid = pg.pid().expect("postmaster.pid");
    assert!(
        dir.join(".s.PGSQL.5432").exists(),
        "the socket is in the cluster's dir"
    );
    let mut c = postgres::Client::connect(&pg.url("hookspool"), postgres::NoTls)
        .unwrap_or_else(|e| panic!("connect: {e}\n{}", pg.log()));
    assert_eq!(show(&mut c, "fsync"), "on");
    assert_eq!(show(&mut c, "synchronous_commit"), "on");
    assert_eq!(show(&mut c, "full_page_writes"), "on");
    assert_eq!(show(&mut c, "listen_addresses"), "", "no TCP listener");
    // A wrong password is refused: the cluster checks passwords as a real host does.
    let err =
        postgres::Client::connect(&pg.url_with_password("hookspool", "wrong"), postgres::NoTls)
            .err()
            .expect("a wrong password is refused");
    let why = format!("{err:?}");
    assert!(why.contains("password authentication failed"), "{why}");
    // A database of its own per caller.
    let url = pg.database("other");
    let mut o = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let db: String = o
        .query_one("SELECT current_database()", &[])
        .unwrap()
        .get(0);
    assert_eq!(db, "other");
    drop((c, o));
    drop(pg);
    assert!(!dir.exists(), "{} removed", dir.display());
    assert!(
        eventually(Duration::from_secs(10), || !alive(pid)),
        "postmaster {pid} stopped"
    );
}

#[test]
fn two_clusters_run_side_by_side_and_a_restart_immediate_comes_back() {
    let Some(a) = cluster() else { return };
    let Some(b) = cluster() else { return };
    assert_ne!(a.dir(), b.dir());
    let mut ca = postgres::Client::connect(&a.url("hookspool"), postgres::NoTls).unwrap();
    let mut cb = postgres::Client::connect(&b.url("hookspool"), postgres::NoTls).unwrap();
    ca.batch_execute("CREATE TABLE t (x int); INSERT INTO t VALUES (1)")
        .unwrap();
    // b is another server: it has no table t.
    assert!(cb.query_one("SELECT count(*) FROM t", &[]).is_err());
    let before = a.pid().unwrap();
    a.restart_immediate();
    assert!(
        ca.query_one("SELECT 1", &[]).is_err(),
        "the old connection was cut"
    );
    assert_ne!(a.pid().unwrap(), before, "a new postmaster");
    let mut ca = postgres::Client::connect(&a.url("hookspool"), postgres::NoTls).unwrap();
    let n: i64 = ca.query_one("SELECT count(*) FROM t", &[]).unwrap().get(0);
    assert_eq!(n, 1, "the committed row survived the immediate restart");
    a.stop().unwrap();
}

#[test]
#[ignore = "entry point for the child process of the SIGKILL cleanup test"]
fn child_holds_a_cluster() {
    let Ok(out) = std::env::var("HOOKSPOOL_TEST_PG_OUT") else {
        return;
    };
    let pg = Cluster::start().expect("the parent checked PostgreSQL is here");
    let pid = pg.pid().unwrap();
    std::fs::write(&out, format!("{}\n{pid}\n", pg.dir().display())).unwrap();
    std::thread::sleep(Duration::from_secs(300));
}

#[test]
fn a_cluster_whose_process_was_killed_is_stopped_and_removed() {
    if let Err(why) = super::pg::bin_dir() {
        super::skip::skip_or_fail(&why);
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("cluster");
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "pg_harness::child_holds_a_cluster",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("HOOKSPOOL_TEST_PG_OUT", &out)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    assert!(
        eventually(Duration::from_secs(120), || std::fs::read_to_string(&out)
            .is_ok_and(|s| s.lines().count() == 2)),
        "the child started its cluster"
    );
    let text = std::fs::read_to_string(&out).unwrap();
    let mut lines = text.lines();
    let dir = std::path::PathBuf::from(lines.next().unwrap());
    let pid: i32 = lines.next().unwrap().parse().unwrap();
    assert!(dir.exists() && alive(pid));
    child.kill().unwrap(); // SIGKILL: no Drop runs in the child
    child.wait().unwrap();
    assert!(
        eventually(Duration::from_secs(30), || !dir.exists() && !alive(pid)),
        "the guard stopped postmaster {pid} and removed {}",
        dir.display()
    );
}
