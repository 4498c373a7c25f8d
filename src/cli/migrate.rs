//! `hookspool migrate [--dry-run]` (spec 17): applies pending migrations under
//! dispatch.lock, so it cannot run beside a live dispatcher (exit 3 then).

use std::time::Duration;

use clap::Args;

use super::{Ctx, Exit};
use crate::store::{self, Role, SCHEMA_VERSION, Store};

#[derive(Debug, Args)]
pub struct MigrateArgs {
    /// Only list the migrations that would run.
    #[arg(long)]
    pub dry_run: bool,
}

pub fn run(ctx: &Ctx, a: MigrateArgs) -> Result<(), Exit> {
    let c = ctx.config()?;
    if let Some(url) = super::pg_url(&c)? {
        return run_postgres(ctx, &url, a.dry_run);
    }
    store::ensure_home(&c.home)?;
    super::refuse_foreign_spool_as_root(&c.home)?;
    // The same lock the dispatcher holds, so migrate cannot run beside it (exit 3).
    let _lock = crate::dispatch::lock(&c.home)?;
    // Open without migrating first so a dry run changes nothing: a Reader refuses an old
    // schema, so read the version through a raw open.
    let pending = {
        let s = Store::open_unmigrated(&c.db, Duration::from_secs(store::DEFAULT_BUSY_TIMEOUT_S))?;
        let mut s = s;
        s.migrate(true)?
    };
    if a.dry_run {
        if ctx.json {
            ctx.print_json(&serde_json::json!({
                "target": SCHEMA_VERSION,
                "pending": pending.iter().map(|(v, n)| serde_json::json!({"version": v, "name": n})).collect::<Vec<_>>(),
            }));
        } else if pending.is_empty() {
            say!(ctx, "schema is at {SCHEMA_VERSION}; nothing to migrate");
        } else {
            for (v, n) in &pending {
                say!(ctx, "would apply {v:04} {n}");
            }
        }
        return Ok(());
    }
    let s = Store::open(
        &c.db,
        Role::Migrator,
        Duration::from_secs(store::DEFAULT_BUSY_TIMEOUT_S),
    )?;
    s.quick_check()?;
    if ctx.json {
        ctx.print_json(&serde_json::json!({
            "schema": SCHEMA_VERSION,
            "applied": pending.iter().map(|(v, n)| serde_json::json!({"version": v, "name": n})).collect::<Vec<_>>(),
        }));
    } else if pending.is_empty() {
        say!(ctx, "schema is at {SCHEMA_VERSION}; nothing to migrate");
    } else {
        for (v, n) in &pending {
            say!(ctx, "applied {v:04} {n}");
        }
    }
    Ok(())
}

/// `migrate` on a PostgreSQL spool: under the spool's advisory lock (which a dispatcher on
/// it holds, so exit 3 beside one), the migrations of `migrations/postgres/`.
fn run_postgres(ctx: &Ctx, url: &str, dry_run: bool) -> Result<(), Exit> {
    let mut s = store::pg::PgStore::connect(url)?;
    s.dispatch_lock()?;
    let target = store::pg::PG_SCHEMA_VERSION;
    let pending = s.migrate(dry_run)?;
    let verb = if dry_run { "would apply" } else { "applied" };
    if ctx.json {
        let list: Vec<serde_json::Value> = pending
            .iter()
            .map(|(v, n)| serde_json::json!({"version": v, "name": n}))
            .collect();
        let key = if dry_run { "pending" } else { "applied" };
        ctx.print_json(&serde_json::json!({
            "backend": "postgres",
            "target": s.target(),
            "schema": target,
            key: list,
        }));
    } else if pending.is_empty() {
        say!(
            ctx,
            "PostgreSQL schema at {} is at {target}; nothing to migrate",
            s.target()
        );
    } else {
        for (v, n) in &pending {
            say!(ctx, "{verb} {v:04} {n} on {}", s.target());
        }
    }
    Ok(())
}
