//! The PostgreSQL spool through the real binary (issue 32): `check` says in one line what is
//! wrong (no schema, a wrong password, no server, a newer schema) without the password,
//! `migrate` applies `migrations/postgres/` under the advisory lock, the schema is SQLite's
//! with its invariants as constraints, and the CLI reads and writes the PostgreSQL spool.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use super::bin;
use super::pg::Cluster;
use super::pg_harness::cluster;

/// A password no message may ever show.
pub const SENTINEL: &str = "SENTINEL-pw-5f3a9c";

/// A home whose config names a PostgreSQL spool through a URL file holding `url`.
pub fn pg_home(dir: &Path, url: &str) -> PathBuf {
    let home = dir.join("home");
    std::fs::create_dir_all(&home).unwrap();
    let url_file = dir.join("pg-url");
    std::fs::write(&url_file, format!("{url}\n")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&url_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::write(
        home.join("config.toml"),
        format!(
            "[spool]\nbackend = \"postgres\"\nurl = {{ file = \"{}\" }}\n",
            url_file.display()
        ),
    )
    .unwrap();
    home
}

pub fn hs(home: &Path, args: &[&str]) -> Output {
    Command::new(bin())
        .arg("--home")
        .arg(home)
        .args(args)
        .env_remove("HOOKSPOOL_CONFIG")
        .env_remove("HOOKSPOOL_DB")
        .output()
        .unwrap()
}

pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn client(pg: &Cluster, db: &str) -> postgres::Client {
    postgres::Client::connect(&pg.url(db), postgres::NoTls).unwrap()
}

#[test]
fn check_and_migrate_on_postgres_say_what_is_wrong_in_one_line_and_never_the_password() {
    let Some(pg) = cluster() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let url = pg.database("spool");
    let home = pg_home(tmp.path(), &url);

    // An empty database: not migrated.
    let o = hs(&home, &["check"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("not migrated"), "{}", text(&o));

    // migrate --dry-run changes nothing; migrate applies; again there is nothing to do.
    let o = hs(&home, &["migrate", "--dry-run"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("would apply 0001 0001_schema"),
        "{}",
        text(&o)
    );
    assert_eq!(hs(&home, &["check"]).status.code(), Some(2));
    let o = hs(&home, &["migrate"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("applied 0001 0001_schema"),
        "{}",
        text(&o)
    );
    assert!(!text(&o).contains(pg.password()), "{}", text(&o));
    let o = hs(&home, &["migrate"]);
    assert!(text(&o).contains("nothing to migrate"), "{}", text(&o));
    let o = hs(&home, &["check"]);
    assert!(o.status.success(), "{}", text(&o));

    // A wrong password: the target is named, the password is not.
    let bad = pg_home(
        &tmp.path().join("bad"),
        &pg.url_with_password("spool", SENTINEL),
    );
    let o = hs(&bad, &["check"]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(2), "{t}");
    assert!(t.contains("password authentication failed"), "{t}");
    assert!(
        t.contains(&format!("hookspool@{}:5432/spool", pg.dir().display())),
        "{t}"
    );
    assert!(!t.contains(SENTINEL), "{t}");
    let o = hs(&bad, &["migrate"]);
    assert!(!o.status.success());
    assert!(!text(&o).contains(SENTINEL), "{}", text(&o));

    // No server there: weather, a warning naming the target; still no password.
    let gone = tmp.path().join("no-server");
    std::fs::create_dir_all(&gone).unwrap();
    let nowhere = format!(
        "postgresql://hookspool:{SENTINEL}@/spool?host={}",
        gone.display()
    );
    let far = pg_home(&tmp.path().join("far"), &nowhere);
    let o = hs(&far, &["check"]);
    let t = text(&o);
    assert!(t.contains("cannot reach PostgreSQL at hookspool@"), "{t}");
    assert!(!t.contains(SENTINEL), "{t}");

    // A URL written inline in the config is refused without being echoed.
    std::fs::write(
        home.join("config.toml"),
        format!(
            "[spool]\nbackend = \"postgres\"\nurl = \"{}\"\n",
            pg.url_with_password("spool", SENTINEL)
        ),
    )
    .unwrap();
    let o = hs(&home, &["check"]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(2), "{t}");
    assert!(
        t.contains("spool.url") && t.contains("url = { file ="),
        "{t}"
    );
    assert!(!t.contains(SENTINEL), "{t}");

    // A schema newer than this binary: refused by check and by migrate, nothing changed.
    let home = pg_home(&tmp.path().join("newer"), &url);
    client(&pg, "spool")
        .execute(
            "UPDATE meta SET value = '99' WHERE key = 'schema_version'",
            &[],
        )
        .unwrap();
    for args in [&["check"][..], &["migrate"][..]] {
        let o = hs(&home, args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        assert!(
            text(&o).contains(&format!(
                "schema 99 is newer than schema {}",
                hookspool::store::pg::PG_SCHEMA_VERSION
            )),
            "{}",
            text(&o)
        );
    }
    let v: String = client(&pg, "spool")
        .query_one("SELECT value FROM meta WHERE key = 'schema_version'", &[])
        .unwrap()
        .get(0);
    assert_eq!(v, "99");
}

#[test]
fn migrate_waits_for_no_one_and_the_cli_reads_the_postgres_spool() {
    let Some(pg) = cluster() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let url = pg.database("spool");
    let home = pg_home(tmp.path(), &url);
    // Another session holds the spool's advisory lock (a dispatcher would): exit 3.
    let mut holder = client(&pg, "spool");
    let key = hookspool::store::pg::PG_DISPATCH_LOCK_KEY;
    let got: bool = holder
        .query_one("SELECT pg_try_advisory_lock($1)", &[&key])
        .unwrap()
        .get(0);
    assert!(got);
    let o = hs(&home, &["migrate"]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    assert!(text(&o).contains("advisory lock"), "{}", text(&o));
    drop(holder);
    assert!(hs(&home, &["migrate"]).status.success());

    // The CLI answers from the PostgreSQL spool (the services' runs are pg_run's and
    // run_e2e's): an event enqueued there is listed and counted.
    let mut c = std::process::Command::new(super::bin())
        .arg("--home")
        .arg(&home)
        .args([
            "enqueue",
            "--source",
            "cli",
            "--key",
            "k1",
            "--destination",
            "http:x",
        ])
        .env_remove("HOOKSPOOL_CONFIG")
        .env_remove("HOOKSPOOL_HOME")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    c.stdin.take().unwrap().write_all(br#"{"n":1}"#).unwrap();
    let o = c.wait_with_output().unwrap();
    assert!(o.status.success(), "enqueue: {}", text(&o));
    let o = hs(&home, &["list"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("k1"),
        "list shows the batch: {}",
        text(&o)
    );
    let o = hs(&home, &["status"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains(&format!(
            "schema {}",
            hookspool::store::pg::PG_SCHEMA_VERSION
        )),
        "{}",
        text(&o)
    );
    // The URL in the file holds the cluster's password; no answer shows it.
    assert!(
        std::fs::read_to_string(tmp.path().join("pg-url"))
            .unwrap()
            .contains(pg.password())
    );
    for args in [&["list"][..], &["status"][..], &["check"][..]] {
        assert!(
            !text(&hs(&home, args)).contains(pg.password()),
            "{args:?} shows no password"
        );
    }
    // Nothing made an SQLite spool beside the configured one.
    assert!(!home.join("spool.db").exists());
}

/// The PostgreSQL schema is SQLite's latest: the same tables and columns, each of the
/// matching type, and the invariants SQLite keeps by code are constraints here.
#[test]
fn the_postgres_schema_is_the_sqlite_one_with_its_invariants_as_constraints() {
    let Some(pg) = cluster() else { return };
    let url = pg.database("spool");
    let mut s =
        hookspool::store::pg::PgStore::open(&url, hookspool::store::Role::Migrator).unwrap();
    assert_eq!(
        s.schema_version().unwrap(),
        hookspool::store::pg::PG_SCHEMA_VERSION
    );
    assert_eq!(s.instance_id().unwrap().len(), 16);
    drop(s);

    let tmp = tempfile::tempdir().unwrap();
    drop(super::open(&tmp.path().join("s.db")));
    let lite = rusqlite::Connection::open(tmp.path().join("s.db")).unwrap();
    let tables: Vec<String> = lite
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    let mut c = client(&pg, "spool");
    let pg_tables: Vec<String> = c
        .query(
            "SELECT table_name::text FROM information_schema.tables
             WHERE table_schema = 'public' ORDER BY table_name COLLATE \"C\"",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(pg_tables, tables);
    for t in &tables {
        let lite_cols: Vec<(String, String)> = lite
            .prepare(&format!(
                "SELECT name, type FROM pragma_table_info('{t}') ORDER BY name"
            ))
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        let pg_cols: Vec<(String, String)> = c
            .query(
                "SELECT column_name::text, data_type::text FROM information_schema.columns
                 WHERE table_name = $1 ORDER BY column_name COLLATE \"C\"",
                &[t],
            )
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        let want: Vec<(String, String)> = lite_cols
            .into_iter()
            .map(|(n, ty)| {
                let pg_ty = match ty.as_str() {
                    "INTEGER" => "bigint",
                    "REAL" => "double precision",
                    "TEXT" => "text",
                    "BLOB" => "bytea",
                    other => panic!("{t}.{n}: SQLite type {other}"),
                };
                (n, pg_ty.to_string())
            })
            .collect();
        assert_eq!(pg_cols, want, "table {t}");
    }
    // The same indexes by name (the ones each backend makes for a primary key or a UNIQUE
    // column aside): a query served by an index on one is served on the other.
    let lite_indexes: Vec<String> = lite
        .prepare(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL ORDER BY name",
        )
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    let pg_indexes: Vec<String> = c
        .query(
            "SELECT indexname::text FROM pg_indexes WHERE schemaname = 'public'
               AND indexname NOT LIKE '%\\_pkey' AND indexname NOT LIKE '%\\_key'
             ORDER BY indexname COLLATE \"C\"",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(lite_indexes.contains(&"batches_terminal".to_string()));
    assert_eq!(pg_indexes, lite_indexes);

    // The invariants as constraints.
    let batch = "INSERT INTO batches (route, source, destination, key, state, finished, first_at,
                     last_at, quiet_s, max_s, max_events, max_bytes, lease_owner, lease_until)
                 VALUES ('r', 's', 'd', $1, $2, $3, 1, 1, 0, 0, 1, 1, $4, $5)";
    let refused =
        |c: &mut postgres::Client, args: &[&(dyn postgres::types::ToSql + Sync)], what: &str| {
            let e = c
                .execute(batch, args)
                .err()
                .unwrap_or_else(|| panic!("{what} was accepted"));
            let why = format!("{e:?}");
            assert!(why.contains("violates"), "{what}: {why}");
        };
    let none: Option<String> = None;
    let no_f: Option<f64> = None;
    c.execute(batch, &[&"k", &"open", &0i64, &none, &no_f])
        .unwrap();
    refused(
        &mut c,
        &[&"k", &"open", &0i64, &none, &no_f],
        "a second open batch in a group",
    );
    c.execute(batch, &[&"k2", &"open", &0i64, &none, &no_f])
        .unwrap();
    c.execute(batch, &[&"k", &"sealed", &0i64, &none, &no_f])
        .unwrap();
    refused(
        &mut c,
        &[&"k", &"gone", &0i64, &none, &no_f],
        "an unknown state",
    );
    refused(
        &mut c,
        &[&"k", &"delivered", &0i64, &none, &no_f],
        "delivered but unfinished",
    );
    refused(
        &mut c,
        &[&"k", &"sealed", &1i64, &none, &no_f],
        "sealed but finished",
    );
    refused(
        &mut c,
        &[&"k", &"leased", &0i64, &none, &no_f],
        "leased without a fence",
    );
    c.execute(
        batch,
        &[
            &"k",
            &"leased",
            &0i64,
            &Some("w:1".to_string()),
            &Some(9.0f64),
        ],
    )
    .unwrap();
    let e = c
        .execute(
            "UPDATE batches SET state = 'dead' WHERE state = 'sealed'",
            &[],
        )
        .expect_err("a state change that forgets finished is refused");
    assert!(format!("{e:?}").contains("violates"), "{e:?}");
}
