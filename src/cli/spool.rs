//! `hookspool spool copy --to <target>` (issue 32): the configured spool, SQLite or
//! PostgreSQL, copied whole into an empty spool of the other backend and verified there
//! (`store::copy`). The target is `sqlite:PATH` or `postgres:FILE`, a file holding the libpq
//! URL: a URL on the command line would show its password to `ps` and the shell's history,
//! so it is refused. Both spools are locked as their dispatchers lock them (dispatch.lock of
//! the SQLite spool's home, the PostgreSQL advisory lock), so a copy never runs beside a
//! dispatcher (exit 3); an intake still writing is caught by the copy's second read of the
//! source.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};

use super::{Ctx, Exit};
use crate::config::backend::Backend;
use crate::secret::SecretRef;
use crate::store::pg::PgStore;
use crate::store::{self, CopyReport, Role, Store};

#[derive(Debug, Args)]
pub struct SpoolArgs {
    #[command(subcommand)]
    pub command: SpoolCommand,
}

#[derive(Debug, Subcommand)]
pub enum SpoolCommand {
    /// Copy the whole spool into an empty spool of the other backend, and verify it (the
    /// services stopped).
    Copy(CopyArgs),
}

#[derive(Debug, Args)]
pub struct CopyArgs {
    /// sqlite:PATH (a new SQLite spool file) or postgres:FILE (a file holding the libpq URL
    /// of an empty, or new, PostgreSQL database).
    #[arg(long, value_name = "TARGET")]
    pub to: String,
}

enum Target {
    Sqlite(PathBuf),
    Postgres(PathBuf),
}

fn parse_target(to: &str) -> Result<Target, Exit> {
    if to.starts_with("postgresql://") || to.starts_with("postgres://") {
        return Err(Exit::usage(
            "a URL on the command line shows its password to ps and the shell's history: write it to a file only you can read (mode 0600) and pass --to postgres:FILE",
        ));
    }
    if let Some(p) = to.strip_prefix("sqlite:").filter(|p| !p.is_empty()) {
        return Ok(Target::Sqlite(absolute(p)?));
    }
    if let Some(p) = to.strip_prefix("postgres:").filter(|p| !p.is_empty()) {
        return Ok(Target::Postgres(absolute(p)?));
    }
    Err(Exit::usage(format!(
        "--to {to:?} names no spool; write --to sqlite:/var/lib/hookspool/spool.db or --to postgres:/etc/hookspool/secrets/pg-url"
    )))
}

fn absolute(p: &str) -> Result<PathBuf, Exit> {
    std::path::absolute(p).map_err(|e| Exit::usage(format!("{p}: {e}")))
}

pub fn run(ctx: &Ctx, a: SpoolArgs) -> Result<(), Exit> {
    match a.command {
        SpoolCommand::Copy(c) => copy(ctx, c),
    }
}

fn copy(ctx: &Ctx, a: CopyArgs) -> Result<(), Exit> {
    let target = parse_target(&a.to)?;
    let c = ctx.config()?;
    let busy = Duration::from_secs(store::DEFAULT_BUSY_TIMEOUT_S);
    let (from, to, report) = match (&c.backend, target) {
        (Backend::Sqlite, Target::Postgres(file)) => {
            // The dispatcher's lock of this spool's home, then the open the intake makes.
            let _lock = crate::dispatch::lock(&c.home)?;
            let mut src = ctx.store(&c)?;
            let url = super::read_url(&SecretRef::File { file }, "--to postgres:FILE")?;
            let mut dst = PgStore::connect(&url)?;
            dst.dispatch_lock()?;
            dst.migrate(false)?;
            let report = src.copy_to_pg(&mut dst)?;
            (
                format!("the SQLite spool {}", c.db.display()),
                format!("the PostgreSQL spool {}", dst.target()),
                report,
            )
        }
        (Backend::Postgres { .. }, Target::Sqlite(path)) => {
            let url = super::pg_url(&c)?
                .ok_or_else(|| Exit::usage("the configured spool is not PostgreSQL"))?;
            let mut src = PgStore::connect(&url)?;
            src.dispatch_lock()?;
            check_current(&mut src)?;
            let home = path
                .parent()
                .map(PathBuf::from)
                .ok_or_else(|| Exit::usage(format!("{} has no directory", path.display())))?;
            store::ensure_home(&home)?;
            let _lock = crate::dispatch::lock(&home)?;
            let mut dst = Store::open(&path, Role::Migrator, busy)?;
            let report = src.copy_to_sqlite(&mut dst)?;
            (
                format!("the PostgreSQL spool {}", src.target()),
                format!("the SQLite spool {}", path.display()),
                report,
            )
        }
        (Backend::Sqlite, Target::Sqlite(_)) => {
            return Err(Exit::usage(
                "the configured spool is SQLite already: copy it to PostgreSQL with --to postgres:FILE (an SQLite spool is backed up with hookspool export)",
            ));
        }
        (Backend::Postgres { .. }, Target::Postgres(_)) => {
            return Err(Exit::usage(
                "the configured spool is PostgreSQL already: copy it to SQLite with --to sqlite:PATH (PostgreSQL to PostgreSQL is pg_dump's work)",
            ));
        }
    };
    print(ctx, &from, &to, &report);
    Ok(())
}

/// A PostgreSQL source at exactly this binary's schema (what the copy's columns are).
fn check_current(s: &mut PgStore) -> Result<(), Exit> {
    let found = s.schema_version()?;
    let known = store::pg::PG_SCHEMA_VERSION;
    if found > known {
        return Err(store::StoreError::SchemaTooNew { found, known }.into());
    }
    if found < known {
        return Err(store::StoreError::SchemaTooOld { found, known }.into());
    }
    Ok(())
}

fn print(ctx: &Ctx, from: &str, to: &str, r: &CopyReport) {
    if ctx.json {
        ctx.print_json(&serde_json::json!({
            "from": from,
            "to": to,
            "tables": r.tables.iter().map(|(t, n)| serde_json::json!({"table": t, "rows": n})).collect::<Vec<_>>(),
            "hashes_recomputed": r.hashes_recomputed,
            "hashes_equal_to_stored": r.hashes_equal_to_stored,
            "dedup_rows": r.rows("dedup"),
        }));
        return;
    }
    say!(
        ctx,
        "copied {from} into {to}, and verified it before committing:"
    );
    let rows: Vec<String> = r.tables.iter().map(|(t, n)| format!("{t} {n}")).collect();
    say!(
        ctx,
        "  rows: {} (each table equal to the source's in rows and content)",
        rows.join(", ")
    );
    say!(
        ctx,
        "  content_hash: {} batches recomputed from the copied events, each equal to the source's ({} equal to the stored hash)",
        r.hashes_recomputed,
        r.hashes_equal_to_stored
    );
    say!(
        ctx,
        "  dedup: {} rows (the dedup window came along)",
        r.rows("dedup")
    );
    say!(
        ctx,
        "next: point [spool] at the new spool (backend and url, or db), then start the services"
    );
}

#[cfg(test)]
mod tests {
    use super::super::EXIT_USAGE;
    use super::*;

    #[test]
    fn a_target_is_sqlite_path_or_postgres_file_and_never_a_url() {
        assert!(
            matches!(parse_target("sqlite:/a/s.db"), Ok(Target::Sqlite(p)) if p == std::path::Path::new("/a/s.db"))
        );
        assert!(matches!(
            parse_target("postgres:/etc/pg-url"),
            Ok(Target::Postgres(_))
        ));
        for bad in [
            "postgresql://u:SECRETPW@h/db",
            "mysql:/x",
            "sqlite:",
            "/a/s.db",
        ] {
            let e = parse_target(bad).err().expect(bad);
            assert_eq!(e.code, EXIT_USAGE);
            assert!(!e.message.contains("SECRETPW"), "{}", e.message);
            assert!(e.message.contains("postgres:"), "{}", e.message);
        }
    }
}
