//! The PostgreSQL spool (issue 32): a connection, its schema and migrations
//! (`migrations/postgres/`), the advisory lock that is dispatch.lock's analogue, and the
//! reads `spool copy` needs. Like the rest of `store`, the only place that speaks SQL to it.
//! Must not: put the connection URL, or anything derived from its password, in an error,
//! a log line or a Debug output; errors name the target as `user@host:port/db` only.
//!
//! # How the store runs on PostgreSQL
//!
//! `Store::open_pg` wraps this session in `db::PgConn`, and every module of the store runs
//! its own statements through `db::Connection` (rewritten once for PostgreSQL, see `db`), so
//! callers (intake, dispatcher, observe, admin, CLI) never learn the backend. What differs:
//!
//! 1. Writers. SQLite has one writer at a time; PostgreSQL's sessions run at once. Every
//!    write transaction but the intake's takes one transaction advisory lock
//!    (`PG_WRITE_LOCK_KEY`, taken where SQLite's `BEGIN IMMEDIATE` would), so the
//!    dispatcher, the CLI and the admin API decide on rows nobody else changes until they
//!    commit, as on SQLite. The dispatcher's recorder (`Store::become_recorder`) takes
//!    none: it records successes beside the tick's claims, and locks what it decides on
//!    instead (a mark its batch, `FOR UPDATE`; `record_results` its destination rows, which
//!    every writer of a destination row locks on PostgreSQL, `destination_for_update`).
//!    The intake's enqueue (`enqueue` here) takes no write lock, so
//!    intakes write at once: the join rule is the unique partial index `batches_open_group`
//!    (a writer that loses the race to open a group's batch runs its request again and
//!    joins the winner's), a join locks the open batch (`FOR UPDATE`), and a seal locks it
//!    first too, so a batch's content_hash covers every event it will ever hold.
//! 2. Durability. `synchronous_commit = on` (checked at connect): COMMIT returns after the
//!    server's WAL flush, and the intake answers after COMMIT returned. Its group commit is
//!    unchanged: one transaction, one COMMIT per group of requests.
//! 3. Weather. A session that cannot be made or was lost is `PgUnreachable` (the intake
//!    answers 503 with Retry-After, the dispatcher waits) and is made again at the next
//!    statement outside a transaction (`PgConn::revive`); a server that is starting or
//!    shutting down counts as unreachable; a lock wait past the busy timeout
//!    (`lock_timeout`) and serialisation failures or deadlocks are `Busy`; disk full is
//!    `Full`.
//! 4. Read transactions (`begin_reads`) are REPEATABLE READ snapshots, as SQLite's are.
//!
//! Left for the several-hosts issue (33): the dispatcher's session lock for a hot standby,
//! `LISTEN/NOTIFY` wake-ups across hosts (on one host the intake's datagram still wakes the
//! dispatcher), heartbeats in the spool.

pub(super) mod client;
mod enqueue;
mod grouped;
mod migrate;
mod tls;

pub use enqueue::PG_RACE_RETRIES_MAX;
pub use migrate::{
    PG_DISPATCH_LOCK_KEY, PG_MIGRATIONS, PG_SCHEMA_VERSION, PG_WRITE_LOCK_KEY, ServerSession,
};

use super::{Result, Role, StoreError};

/// One connection to a PostgreSQL spool.
pub struct PgStore {
    pub(super) client: client::Client,
    /// `user@host:port/db`, for messages: never the password.
    target: String,
    /// Statements prepared on this connection (`pg::enqueue`).
    stmts: enqueue::Statements,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("target", &self.target)
            .finish()
    }
}

/// The channel an intake's commit notifies (`NOTIFY`, sent inside the enqueue transaction,
/// so it is delivered at COMMIT and never for a rolled-back group) and dispatchers `LISTEN`
/// on: the wake-up across hosts that the datagram on the home's socket is on one host.
pub const PG_WAKE_CHANNEL: &str = "hookspool_wake";

/// How often the wake listener looks at its stop flag, and waits before connecting again.
const WAKE_LISTEN_TICK_S: u64 = 1;

/// Listen for intakes' commits on `url` (`PG_WAKE_CHANNEL`) on a thread of its own and call
/// `wake` for each, until `stop` is set. A lost connection is made again every second; a
/// notification missed meanwhile delays a delivery to the next poll, never loses it.
pub fn wake_listener(
    url: String,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    wake: impl Fn() + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    use std::sync::atomic::Ordering;
    std::thread::Builder::new()
        .name("hookspool-pg-wake".into())
        .spawn(move || {
            let tick = std::time::Duration::from_secs(WAKE_LISTEN_TICK_S);
            let mut logged = false;
            while !stop.load(Ordering::SeqCst) {
                let mut s = match PgStore::connect(&url) {
                    Ok(s) => s,
                    Err(e) => {
                        if !logged {
                            tracing::warn!(component = "dispatch", reason = %e, "cannot listen for wake-ups yet; polling meanwhile");
                            logged = true;
                        }
                        std::thread::sleep(tick);
                        continue;
                    }
                };
                if let Err(e) = s.client.batch_execute(&format!("LISTEN {PG_WAKE_CHANNEL}")) {
                    tracing::warn!(component = "dispatch", reason = %s.err(&e), "LISTEN failed; polling meanwhile");
                    std::thread::sleep(tick);
                    continue;
                }
                logged = false;
                while !stop.load(Ordering::SeqCst) {
                    let got = {
                        let first = s.client.next_notification(tick);
                        if let Ok(Some(_)) = first {
                            // One wake-up covers every commit before it: drop those already
                            // here without waiting for more.
                            while let Ok(Some(_)) =
                                s.client.next_notification(std::time::Duration::ZERO)
                            {}
                        }
                        first.map(|got| got.is_some())
                    };
                    match got {
                        Ok(true) => wake(),
                        Ok(false) if s.client.is_closed() => break,
                        Ok(false) => {}
                        Err(_) => break,
                    }
                }
            }
        })
}

/// The `SET` of a session's lock timeout (`PgStore::set_lock_timeout`).
pub(super) fn lock_timeout_sql(d: std::time::Duration) -> String {
    format!("SET lock_timeout = {}", d.as_millis().max(1))
}

/// What this process's sessions call themselves (`application_name`), set once by the
/// service at its start (`name_sessions`): `hookspool <role> <host>:<pid>`, which
/// `Store::sessions` reads back from pg_stat_activity for `status`.
static SESSION_ROLE: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Name this process's PostgreSQL sessions by its role (`intake`, `dispatch`, `run`,
/// `admin`); the CLI's are `cli`. The first call wins.
pub fn name_sessions(role: &str) {
    let _ = SESSION_ROLE.set(role.to_string());
}

/// The prefix of every hookspool session's `application_name`.
pub const SESSION_PREFIX: &str = "hookspool ";

fn application_name() -> String {
    let role = SESSION_ROLE.get().map_or("cli", String::as_str);
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "localhost".into());
    let mut name = format!("{SESSION_PREFIX}{role} {host}:{}", std::process::id());
    // PostgreSQL keeps 63 bytes of it.
    while name.len() > 63 {
        name.remove(SESSION_PREFIX.len() + role.len() + 1);
    }
    name
}

/// How long a connection attempt may take before it is reported as unreachable.
pub const PG_CONNECT_TIMEOUT_S: u64 = 10;

/// A session over TCP sends keepalives after this many seconds without traffic
/// (`keepalives_idle`; the driver's default is two hours), then every
/// `PG_KEEPALIVE_INTERVAL_S`, at most `PG_KEEPALIVE_RETRIES` of them; what it sent, probes
/// included, may go unanswered for `PG_TCP_USER_TIMEOUT_S` at most (on Linux that timeout,
/// once set, decides when the session ends: about 15 s after the last answer). A session whose
/// link was cut while it waited for an answer (a statement sent and acknowledged, its
/// answer lost) otherwise waited for hours: an active dispatcher cut off from its database
/// then never learnt that a standby had taken over (the multi-host test found it still
/// running 90 s after its link came back). A URL that sets any of these keeps its value.
pub const PG_KEEPALIVE_IDLE_S: u64 = 5;
pub const PG_KEEPALIVE_INTERVAL_S: u64 = 2;
pub const PG_KEEPALIVE_RETRIES: u32 = 3;
pub const PG_TCP_USER_TIMEOUT_S: u64 = 15;

/// The driver's keepalive idle time when the URL sets none.
const DRIVER_KEEPALIVES_IDLE: std::time::Duration = std::time::Duration::from_secs(2 * 60 * 60);

/// `PG_KEEPALIVE_*` and `PG_TCP_USER_TIMEOUT_S` on `config`, where its URL set nothing.
/// Unix-socket sessions ignore them.
pub(super) fn session_keepalives(config: &mut tokio_postgres::Config) {
    use std::time::Duration;
    if config.get_keepalives_idle() == DRIVER_KEEPALIVES_IDLE {
        config.keepalives_idle(Duration::from_secs(PG_KEEPALIVE_IDLE_S));
    }
    if config.get_keepalives_interval().is_none() {
        config.keepalives_interval(Duration::from_secs(PG_KEEPALIVE_INTERVAL_S));
    }
    if config.get_keepalives_retries().is_none() {
        config.keepalives_retries(PG_KEEPALIVE_RETRIES);
    }
    if config.get_tcp_user_timeout().is_none() {
        config.tcp_user_timeout(Duration::from_secs(PG_TCP_USER_TIMEOUT_S));
    }
}

/// A parsed URL: the driver's config, the TLS it asks for, and what messages may say.
pub(super) struct Target {
    pub config: tokio_postgres::Config,
    pub tls: tls::Tls,
    pub describe: String,
    /// The password, to scrub from any error text the driver gives (it never puts it
    /// there; this makes sure).
    pub password: Option<String>,
}

impl Target {
    /// Parse a libpq URL (`postgresql://` or `postgres://`). `sslmode` and `sslrootcert`
    /// are read here (the driver knows `disable`, `prefer` and `require` only).
    pub fn parse(url: &str) -> Result<Target> {
        let url = url.trim();
        if !(url.starts_with("postgresql://") || url.starts_with("postgres://")) {
            return Err(StoreError::Invalid(
                "the PostgreSQL URL does not start with postgresql://; write a libpq URL such as postgresql://hookspool:PASSWORD@db.internal:5432/hookspool?sslmode=verify-full"
                    .into(),
            ));
        }
        let (base, query) = match url.split_once('?') {
            Some((b, q)) => (b, q),
            None => (url, ""),
        };
        let mut kept: Vec<&str> = Vec::new();
        let mut mode: Option<String> = None;
        let mut root: Option<String> = None;
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let v = form_urlencoded::parse(format!("v={v}").as_bytes())
                .next()
                .map(|(_, v)| v.into_owned())
                .unwrap_or_default();
            match k {
                "sslmode" => mode = Some(v),
                "sslrootcert" => root = Some(v),
                _ => kept.push(pair),
            }
        }
        let tls = tls::Tls::from_params(mode.as_deref(), root.as_deref())?;
        let driver_mode = match tls {
            tls::Tls::Off => "disable",
            tls::Tls::Encrypt | tls::Tls::Verify { .. } => "require",
        };
        kept.push(match driver_mode {
            "disable" => "sslmode=disable",
            _ => "sslmode=require",
        });
        let rebuilt = format!("{base}?{}", kept.join("&"));
        let config: tokio_postgres::Config = rebuilt.parse().map_err(|e: tokio_postgres::Error| {
            StoreError::Invalid(format!(
                "the PostgreSQL URL cannot be read ({}); write a libpq URL such as postgresql://hookspool:PASSWORD@db.internal:5432/hookspool",
                scrub(&e.to_string(), None, url)
            ))
        })?;
        let password = config
            .get_password()
            .map(|p| String::from_utf8_lossy(p).into_owned());
        let describe = describe(&config);
        Ok(Target {
            config,
            tls,
            describe,
            password,
        })
    }
}

/// `user@host:port/db` (a socket directory as the host), never the password.
fn describe(c: &tokio_postgres::Config) -> String {
    use tokio_postgres::config::Host;
    let user = c.get_user().unwrap_or("(user)");
    let hosts: Vec<String> = c
        .get_hosts()
        .iter()
        .map(|h| match h {
            Host::Tcp(h) => h.clone(),
            Host::Unix(p) => p.display().to_string(),
        })
        .collect();
    let host = if hosts.is_empty() {
        "localhost".to_string()
    } else {
        hosts.join(",")
    };
    let port = c.get_ports().first().copied().unwrap_or(5432);
    let db = c.get_dbname().unwrap_or(user);
    format!("{user}@{host}:{port}/{db}")
}

/// An error text with the password and the URL taken out, whatever produced it.
fn scrub(text: &str, password: Option<&str>, url: &str) -> String {
    let mut t = text.replace(url, "(the URL)");
    if let Some(p) = password.filter(|p| !p.is_empty()) {
        t = t.replace(p, "(the password)");
    }
    t
}

/// The oldest server the store's statements run on (`server_version_num`): PostgreSQL 12
/// (`WITH ... AS MATERIALIZED`, `plan_cache_mode`).
const PG_VERSION_MIN: i32 = 120_000;

/// Why a session with this `synchronous_commit` on a server of this version
/// (`server_version_num`, and as the server spells it) is refused, if it is.
fn server_refused(sync: &str, version: i32, version_text: &str) -> std::result::Result<(), String> {
    if version < PG_VERSION_MIN {
        return Err(format!(
            "the server is PostgreSQL {version_text}; hookspool needs PostgreSQL 12 or newer (its statements use MATERIALIZED and plan_cache_mode): upgrade the server"
        ));
    }
    if sync == "off" {
        return Err(format!(
            "synchronous_commit is {sync}: an acknowledged webhook could be lost with the database host; set synchronous_commit = on (ALTER ROLE ... SET synchronous_commit = on)"
        ));
    }
    Ok(())
}

impl PgStore {
    /// Connect and check the session: PostgreSQL 12 or newer, and `synchronous_commit`
    /// must be on (the intake answers 2xx only after COMMIT returned, which that setting
    /// makes mean "on disk"). Touches no schema.
    pub fn connect(url: &str) -> Result<PgStore> {
        let mut target = Target::parse(url)?;
        target
            .config
            .connect_timeout(std::time::Duration::from_secs(PG_CONNECT_TIMEOUT_S))
            .application_name(application_name());
        session_keepalives(&mut target.config);
        // The session's own runtime, which drives it while a statement runs (the store is
        // synchronous: one session per thread).
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| StoreError::PgUnreachable {
                target: target.describe.clone(),
                reason: format!("cannot start the session's runtime: {e}"),
            })?;
        let client = match &target.tls {
            tls::Tls::Off => client::Client::connect(rt, &target.config, tokio_postgres::NoTls),
            t => client::Client::connect(rt, &target.config, t.connector()?),
        }
        .map_err(|e| connect_error(&target, &e, url))?;
        let mut store = PgStore {
            client,
            target: target.describe,
            stmts: Default::default(),
        };
        let row = store
            .client
            .query_one(
                "SELECT current_setting('synchronous_commit'),
                        current_setting('server_version_num')::integer,
                        current_setting('server_version')",
                &[],
            )
            .map_err(|e| store.err(&e))?;
        if let Err(reason) = server_refused(
            &row.get::<_, String>(0),
            row.get(1),
            &row.get::<_, String>(2),
        ) {
            return Err(StoreError::Pg {
                target: store.target.clone(),
                reason,
            });
        }
        Ok(store)
    }

    /// Connect and check the schema as `Store::open` does on SQLite: a migrator applies
    /// pending migrations (under the advisory lock); a reader refuses an older schema (an
    /// empty database included: nothing creates the schema but `migrate` and the
    /// dispatcher) and both refuse a newer one.
    pub fn open(url: &str, role: Role) -> Result<PgStore> {
        let mut s = PgStore::connect(url)?;
        let version = s.schema_version()?;
        if version > PG_SCHEMA_VERSION {
            return Err(StoreError::SchemaTooNew {
                found: version,
                known: PG_SCHEMA_VERSION,
            });
        }
        if role == Role::Migrator {
            s.migrate(false)?;
        } else if version < PG_SCHEMA_VERSION {
            return Err(StoreError::SchemaTooOld {
                found: version,
                known: PG_SCHEMA_VERSION,
            });
        }
        Ok(s)
    }

    /// How long a statement may wait for a lock another session holds before it fails
    /// (`Busy`, SQLSTATE 55P03).
    pub fn set_lock_timeout(&mut self, d: std::time::Duration) -> Result<()> {
        self.client
            .batch_execute(&lock_timeout_sql(d))
            .map_err(|e| self.err(&e))
    }

    /// `user@host:port/db`.
    pub fn target(&self) -> &str {
        &self.target
    }

    /// A driver error on this connection as a `StoreError`.
    pub(super) fn err(&self, e: &tokio_postgres::Error) -> StoreError {
        pg_error(&self.target, e)
    }

    /// Whether this session runs over TLS, as the server sees it (`pg_stat_ssl`).
    pub fn session_tls(&mut self) -> Result<bool> {
        let row = self
            .client
            .query_opt(
                "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
                &[],
            )
            .map_err(|e| self.err(&e))?;
        Ok(row.is_some_and(|r| r.get::<_, bool>(0)))
    }

    /// A read of a `meta` value.
    pub fn meta(&mut self, key: &str) -> Result<Option<String>> {
        let row = self
            .client
            .query_opt("SELECT value FROM meta WHERE key = $1", &[&key])
            .map_err(|e| self.err(&e))?;
        Ok(row.and_then(|r| r.get(0)))
    }

    /// A `meta` value read as seconds (as `Store::meta_time`).
    pub fn meta_time(&mut self, key: &str) -> Result<Option<f64>> {
        Ok(self.meta(key)?.and_then(|v| v.trim().parse::<f64>().ok()))
    }

    /// How many batches are in each state (as `Store::batch_counts`, every state listed).
    pub fn batch_counts(&mut self) -> Result<Vec<(crate::vocab::BatchState, i64)>> {
        use crate::vocab::BatchState;
        let rows = self
            .client
            .query("SELECT state, count(*) FROM batches GROUP BY state", &[])
            .map_err(|e| self.err(&e))?;
        let mut out: Vec<(BatchState, i64)> = BatchState::ALL.iter().map(|s| (*s, 0)).collect();
        for r in rows {
            let state: String = r.get(0);
            let n: i64 = r.get(1);
            let s = BatchState::parse(&state)
                .ok_or_else(|| StoreError::Corrupt(format!("a batch has state {state:?}")))?;
            if let Some(e) = out.iter_mut().find(|(k, _)| *k == s) {
                e.1 = n;
            }
        }
        Ok(out)
    }

    /// The instance id minted once per spool (as on SQLite).
    pub fn instance_id(&mut self) -> Result<String> {
        self.meta("instance_id")?
            .ok_or_else(|| StoreError::Corrupt("meta.instance_id is missing".into()))
    }
}

/// Whether a server error means "not now" rather than "no": the server is starting, shutting
/// down, in recovery, or out of connection slots. Weather, as a refused connection is.
fn server_not_now(e: &tokio_postgres::Error) -> bool {
    use tokio_postgres::error::SqlState;
    e.as_db_error().is_some_and(|db| {
        let c = db.code();
        *c == SqlState::CANNOT_CONNECT_NOW
            || *c == SqlState::ADMIN_SHUTDOWN
            || *c == SqlState::CRASH_SHUTDOWN
            || *c == SqlState::TOO_MANY_CONNECTIONS
            || *c == SqlState::READ_ONLY_SQL_TRANSACTION
    })
}

fn connect_error(t: &Target, e: &tokio_postgres::Error, url: &str) -> StoreError {
    let reason = scrub(&source_chain(e), t.password.as_deref(), url);
    if e.as_db_error().is_some() && !server_not_now(e) {
        StoreError::Pg {
            target: t.describe.clone(),
            reason,
        }
    } else {
        StoreError::PgUnreachable {
            target: t.describe.clone(),
            reason,
        }
    }
}

/// The error and its causes, as one line.
fn source_chain(e: &tokio_postgres::Error) -> String {
    let mut out = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        let s = c.to_string();
        if !out.contains(&s) {
            out.push_str(": ");
            out.push_str(&s);
        }
        cause = c.source();
    }
    out
}

/// A driver error after the connection was made. A lost connection is weather; a full
/// disk is `Full`; a serialisation failure or deadlock is `Busy`; the rest keeps its text.
pub(super) fn pg_error(target: &str, e: &tokio_postgres::Error) -> StoreError {
    use tokio_postgres::error::SqlState;
    if server_not_now(e) {
        return StoreError::PgUnreachable {
            target: target.to_string(),
            reason: source_chain(e),
        };
    }
    if let Some(db) = e.as_db_error() {
        let code = db.code();
        if *code == SqlState::DISK_FULL {
            return StoreError::Full;
        }
        if *code == SqlState::T_R_SERIALIZATION_FAILURE
            || *code == SqlState::T_R_DEADLOCK_DETECTED
            || *code == SqlState::LOCK_NOT_AVAILABLE
        {
            return StoreError::Busy;
        }
        return StoreError::Pg {
            target: target.to_string(),
            reason: source_chain(e),
        };
    }
    if e.is_closed() || std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>()) {
        return StoreError::PgUnreachable {
            target: target.to_string(),
            reason: source_chain(e),
        };
    }
    StoreError::Pg {
        target: target.to_string(),
        reason: source_chain(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `connect` checks the server before anything else: a session with
    /// `synchronous_commit = off` is refused with what to write instead, one with it on is
    /// taken.
    #[test]
    fn connect_refuses_synchronous_commit_off_and_says_what_to_set() {
        let Some((cluster, mut store)) = crate::store::testutil::temp_pg() else {
            return;
        };
        let url = cluster.url("spool");
        store
            .client
            .batch_execute("ALTER ROLE CURRENT_USER SET synchronous_commit = off")
            .unwrap();
        let refused = PgStore::connect(&url).expect_err("refused");
        let text = refused.to_string();
        assert!(
            text.contains("synchronous_commit is off")
                && text.contains("ALTER ROLE ... SET synchronous_commit = on"),
            "{text}"
        );
        store
            .client
            .batch_execute("ALTER ROLE CURRENT_USER RESET synchronous_commit")
            .unwrap();
        PgStore::connect(&url).expect("taken");
    }

    /// Every session over TCP gets short keepalives and a TCP user timeout unless its URL
    /// sets them (the behaviour they bound, a session on a cut link, is the multi-host
    /// test's `a_session_waiting_for_an_answer_on_a_cut_link_ends_within_seconds`).
    #[test]
    fn sessions_get_short_keepalives_unless_the_url_sets_them() {
        use std::time::Duration;
        let mut plain = Target::parse("postgresql://u:p@db.example:5432/spool")
            .unwrap()
            .config;
        session_keepalives(&mut plain);
        assert!(plain.get_keepalives());
        assert_eq!(
            plain.get_keepalives_idle(),
            Duration::from_secs(PG_KEEPALIVE_IDLE_S)
        );
        assert_eq!(
            plain.get_keepalives_interval(),
            Some(Duration::from_secs(PG_KEEPALIVE_INTERVAL_S))
        );
        assert_eq!(plain.get_keepalives_retries(), Some(PG_KEEPALIVE_RETRIES));
        assert_eq!(
            plain.get_tcp_user_timeout(),
            Some(&Duration::from_secs(PG_TCP_USER_TIMEOUT_S))
        );
        let mut own = Target::parse(
            "postgresql://u:p@db.example:5432/spool?keepalives_idle=60&keepalives_interval=7&keepalives_retries=9&tcp_user_timeout=90",
        )
        .unwrap()
        .config;
        session_keepalives(&mut own);
        assert_eq!(own.get_keepalives_idle(), Duration::from_secs(60));
        assert_eq!(own.get_keepalives_interval(), Some(Duration::from_secs(7)));
        assert_eq!(own.get_keepalives_retries(), Some(9));
        assert_eq!(own.get_tcp_user_timeout(), Some(&Duration::from_secs(90)));
    }

    /// A server older than PostgreSQL 12 is refused with its version and what to do; the
    /// version is checked first (the only server the tests can start is Debian's, so this
    /// is the rule alone).
    #[test]
    fn an_older_server_is_refused_by_its_version() {
        let old = server_refused("on", 110_022, "11.22").expect_err("refused");
        assert!(
            old.contains("PostgreSQL 11.22") && old.contains("PostgreSQL 12 or newer"),
            "{old}"
        );
        assert!(server_refused("off", 110_022, "11.22").is_err_and(|e| e.contains("11.22")));
        assert_eq!(server_refused("on", 120_000, "12.0"), Ok(()));
        assert_eq!(server_refused("local", 150_010, "15.10"), Ok(()));
        assert!(
            server_refused("off", 150_010, "15.10")
                .is_err_and(|e| e.contains("synchronous_commit is off"))
        );
    }
}
