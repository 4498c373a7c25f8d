//! A throwaway PostgreSQL cluster for the tests and the benchmarks (issue 32): made with the
//! host's PostgreSQL binaries (`initdb`, `pg_ctl`, Debian's /usr/lib/postgresql/<version>/bin,
//! or the directory `HOOKSPOOL_PG_BIN` names) in a temp dir of its own, listening on a Unix
//! socket in that dir only (`listen_addresses = ''`), so clusters of parallel tests share no
//! port and no server. It runs with the durability the spool promises (`fsync = on`,
//! `synchronous_commit = on`, `full_page_writes = on`) and password authentication (SCRAM),
//! so a URL with a wrong password is refused as on a real host.
//!
//! Cleanup: `Drop` stops the server (`pg_ctl stop -m immediate`) and removes the dir. A
//! test process killed with SIGKILL runs no `Drop`, so each cluster also has a guard: a
//! small shell started with the read end of a pipe whose write end only this process holds
//! (std opens pipes close-on-exec, so no other child inherits it). When this process ends,
//! however it ends, the pipe reaches end-of-file, and the guard sends the postmaster SIGQUIT
//! (PostgreSQL's immediate shutdown) and removes the dir.
//!
//! `start_with_tls` adds a TCP listener on 127.0.0.1 (a port the kernel reported free)
//! with `ssl = on`, for the TLS tests only.
//!
//! `start_in_netns` runs every PostgreSQL binary through `ip netns exec <ns>` (the multi-host
//! test's database host, issue 33), so the server listens on TCP port 5432 at an address of
//! that namespace, admits SCRAM logins from one subnet, and sends TCP keepalives soon enough
//! (idle 2 s, then 2 probes 1 s apart) that a host cut off loses its session within seconds.
//! Its Unix socket stays in the cluster's dir, reachable from any namespace.
//!
//! Root: `initdb` and `postgres` refuse to run as root. When this process is root, every
//! PostgreSQL binary runs as the unprivileged `postgres` account the PostgreSQL package
//! creates (through `runuser`), and the cluster's dir is given to that account; the test
//! itself, as root, reaches the socket. Otherwise they run as the current user.
//!
//! Included by path from the integration tests (`tests/it`), the library's unit tests and
//! the benchmark examples, like `skip.rs`. Must not: install anything, print `SKIPPED`
//! (a caller that gets `Err` from [`Cluster::start`] passes the reason to `skip_or_fail`),
//! or speak SQL (databases are made with `createdb`).

#![allow(dead_code)]

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The environment variable that names a PostgreSQL bin directory to use instead of the
/// newest /usr/lib/postgresql/<version>/bin.
pub const PG_BIN_ENV: &str = "HOOKSPOOL_PG_BIN";

/// Lines appended to every throwaway cluster's postgresql.conf, for an investigation by hand
/// (`HOOKSPOOL_PG_CONF="log_statement = 'all'"` to see a benchmark's statements in the
/// cluster's server.log).
pub const PG_CONF_ENV: &str = "HOOKSPOOL_PG_CONF";
/// The account PostgreSQL's binaries run as when the test runs as root (Debian's package
/// creates it).
pub const PG_ACCOUNT: &str = "postgres";
/// The superuser every cluster is made with, and its database.
pub const PG_USER: &str = "hookspool";
/// How long a start or a stop may take before the harness gives up.
pub const PG_START_S_MAX: u64 = 60;

/// The newest PostgreSQL bin directory holding `initdb`, `pg_ctl` and `createdb`, or why
/// there is none.
pub fn bin_dir() -> Result<PathBuf, String> {
    let has_all = |d: &Path| {
        ["initdb", "pg_ctl", "createdb", "postgres"]
            .iter()
            .all(|b| d.join(b).is_file())
    };
    if let Some(d) = std::env::var_os(PG_BIN_ENV) {
        let d = PathBuf::from(d);
        return if has_all(&d) {
            Ok(d)
        } else {
            Err(format!(
                "{PG_BIN_ENV}={} holds no initdb, pg_ctl, createdb and postgres",
                d.display()
            ))
        };
    }
    let root = Path::new("/usr/lib/postgresql");
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir(root)
        .map_err(|_| {
            format!(
                "no PostgreSQL here ({} is absent): install the postgresql package",
                root.display()
            )
        })?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let v: u32 = e.file_name().to_str()?.parse().ok()?;
            Some((v, e.path().join("bin")))
        })
        .filter(|(_, d)| has_all(d))
        .collect();
    versions.sort();
    versions.pop().map(|(_, d)| d).ok_or_else(|| {
        format!(
            "no initdb under {}: install the postgresql package",
            root.display()
        )
    })
}

/// One running cluster; stopped and removed on drop.
pub struct Cluster {
    bin: PathBuf,
    /// The cluster's own dir: `data/`, the socket, the log, the password file.
    dir: PathBuf,
    password: String,
    /// Whether the binaries run as [`PG_ACCOUNT`] (this process is root).
    as_account: bool,
    /// The write end of the guard's pipe: dropped when this process ends.
    guard: Option<std::process::ChildStdin>,
    guard_child: Option<std::process::Child>,
    stopped: bool,
    /// The port: 5432 on the socket alone (each cluster's socket is in its own dir), a free
    /// one on 127.0.0.1 with TLS.
    port: u16,
    /// The network namespace every binary runs in (`start_in_netns`).
    netns: Option<String>,
}

/// Where a cluster in a network namespace listens (`Cluster::start_in_netns`).
struct InNetns {
    ns: String,
    listen: String,
    hba_net: String,
}

/// A certificate and key (PEM) the server presents on its TLS listener.
pub struct ServerTls {
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster").field("dir", &self.dir).finish()
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { nix::libc::geteuid() == 0 }
}

impl Cluster {
    /// initdb, configure and start a cluster. `Err` says why it cannot run here (no
    /// PostgreSQL, no `postgres` account as root): pass it to `skip_or_fail`. A cluster that
    /// was made but then failed to start panics with its log, since that is a bug to see.
    pub fn start() -> Result<Cluster, String> {
        Cluster::start_with(None, None)
    }

    /// A cluster whose binaries run in network namespace `ns` (which must exist, `ip`
    /// being there and this process root), listening on TCP `listen:5432` (an address of
    /// that namespace) with SCRAM logins admitted from `hba_net` (a CIDR block), and the
    /// server's TCP keepalives at idle 2 s, interval 1 s, count 2. Its socket stays as well.
    pub fn start_in_netns(ns: &str, listen: &str, hba_net: &str) -> Result<Cluster, String> {
        Cluster::start_with(
            None,
            Some(InNetns {
                ns: ns.to_string(),
                listen: listen.to_string(),
                hba_net: hba_net.to_string(),
            }),
        )
    }

    /// A cluster that also listens on 127.0.0.1 (a port free when it was picked) with
    /// `ssl = on` and the given certificate, for the TLS tests; its socket stays as well.
    pub fn start_with_tls(tls: ServerTls) -> Result<Cluster, String> {
        Cluster::start_with(Some(tls), None)
    }

    fn start_with(tls: Option<ServerTls>, net: Option<InNetns>) -> Result<Cluster, String> {
        let bin = bin_dir()?;
        let as_account = is_root();
        let (uid, gid) = if as_account {
            let u = nix::unistd::User::from_name(PG_ACCOUNT)
                .ok()
                .flatten()
                .ok_or_else(|| format!("running as root, and there is no {PG_ACCOUNT} account to run PostgreSQL as: install the postgresql package"))?;
            (Some(u.uid), Some(u.gid))
        } else {
            (None, None)
        };
        // Under the system temp dir, which the account can reach (a test's own tempdir is
        // 0700 root's); short, so the socket path stays under the 107 bytes a sun_path holds.
        let dir = tempfile::Builder::new()
            .prefix("hookspool-pg.")
            .tempdir_in(std::env::temp_dir())
            .map_err(|e| format!("cannot make a temp dir for PostgreSQL: {e}"))?
            .keep();
        if let (Some(u), Some(g)) = (uid, gid) {
            nix::unistd::chown(&dir, Some(u), Some(g)).expect("give the cluster dir to postgres");
        }
        let password = format!("pw{:016x}", rand_u64());
        let mut c = Cluster {
            bin,
            dir,
            password,
            as_account,
            guard: None,
            guard_child: None,
            stopped: false,
            port: 5432,
            netns: net.as_ref().map(|n| n.ns.clone()),
        };
        c.start_guard();
        c.init();
        if let Some(t) = tls {
            c.port = free_port();
            c.serve_tls(&t);
        }
        if let Some(n) = &net {
            c.serve_tcp(n);
        }
        c.pg_ctl_start();
        let port = c.port.to_string();
        c.run(
            "createdb",
            &[
                "-h",
                &c.socket_dir_str(),
                "-p",
                &port,
                "-U",
                PG_USER,
                PG_USER,
            ],
            true,
        )
        .unwrap_or_else(|e| panic!("createdb {PG_USER}: {e}"));
        Ok(c)
    }

    /// The guard that stops and removes the cluster when this process ends without Drop.
    fn start_guard(&mut self) {
        let d = self.dir.display().to_string();
        let script = format!(
            "read _; pid=$(head -n1 '{d}/data/postmaster.pid' 2>/dev/null); \
             if [ -n \"$pid\" ]; then kill -QUIT \"$pid\" 2>/dev/null; i=0; \
             while kill -0 \"$pid\" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done; fi; \
             rm -rf '{d}'"
        );
        let mut child = Command::new("/bin/sh")
            .args(["-c", &script])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the cluster's guard");
        self.guard = child.stdin.take();
        self.guard_child = Some(child);
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// The directory holding the socket (`.s.PGSQL.5432`).
    pub fn socket_dir(&self) -> &Path {
        &self.dir
    }

    fn socket_dir_str(&self) -> String {
        self.dir.display().to_string()
    }

    /// The cluster's own dir, which `Drop` removes.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn password(&self) -> &str {
        &self.password
    }

    /// Run one of PostgreSQL's binaries (as the account when root), with the password in
    /// the environment for client programs.
    fn run(&self, program: &str, args: &[&str], client: bool) -> Result<String, String> {
        let exe = self.bin.join(program);
        let mut cmd = match (&self.netns, self.as_account) {
            (Some(ns), true) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, "runuser", "-u", PG_ACCOUNT, "--"])
                    .arg(&exe);
                c
            }
            (Some(ns), false) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(&exe);
                c
            }
            (None, true) => {
                let mut c = Command::new("runuser");
                c.args(["-u", PG_ACCOUNT, "--"]).arg(&exe);
                c
            }
            (None, false) => Command::new(&exe),
        };
        cmd.args(args).current_dir(&self.dir).stdin(Stdio::null());
        if client {
            cmd.env("PGPASSWORD", &self.password);
        }
        let out = cmd.output().map_err(|e| format!("{program}: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!(
                "{program} {}: {}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    fn init(&self) {
        let pwfile = self.dir.join("pwfile");
        {
            let mut f = std::fs::File::create(&pwfile).expect("password file");
            writeln!(f, "{}", self.password).expect("write the password file");
        }
        if self.as_account {
            let u = nix::unistd::User::from_name(PG_ACCOUNT)
                .ok()
                .flatten()
                .expect("account");
            nix::unistd::chown(&pwfile, Some(u.uid), Some(u.gid)).expect("chown pwfile");
        }
        let data = self.data().display().to_string();
        let pw = format!("--pwfile={}", pwfile.display());
        // --no-sync: initdb's own files are not fsynced (a cluster that lives for one test
        // needs no crash safety for its empty catalog); the server itself runs with fsync on.
        self.run(
            "initdb",
            &[
                "-D",
                &data,
                "-U",
                PG_USER,
                &pw,
                "--auth=scram-sha-256",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
                "--no-instructions",
            ],
            false,
        )
        .unwrap_or_else(|e| panic!("initdb: {e}"));
        let conf = format!(
            "\n# hookspool test cluster\nlisten_addresses = ''\nunix_socket_directories = '{}'\n\
             port = 5432\nfsync = on\nsynchronous_commit = on\nfull_page_writes = on\n\
             max_connections = 40\nshared_buffers = 16MB\nlog_min_messages = warning\n",
            self.dir.display()
        );
        // An investigation's extra settings (e.g. `log_statement = 'all'` to count a
        // benchmark's statements), never set by a test or `.ci/run`.
        let extra = std::env::var(PG_CONF_ENV).unwrap_or_default();
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(self.data().join("postgresql.conf"))
            .expect("postgresql.conf");
        f.write_all(conf.as_bytes()).expect("configure the cluster");
        f.write_all(format!("{extra}\n").as_bytes())
            .expect("configure the cluster");
    }

    /// Turn on the TCP listener with TLS: the certificate files given to the account.
    fn serve_tls(&self, t: &ServerTls) {
        use std::os::unix::fs::PermissionsExt;
        for (name, pem) in [("server.crt", &t.cert_pem), ("server.key", &t.key_pem)] {
            let path = self.data().join(name);
            std::fs::write(&path, pem).expect("write the server's TLS files");
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
            if self.as_account {
                let u = nix::unistd::User::from_name(PG_ACCOUNT)
                    .ok()
                    .flatten()
                    .expect("account");
                nix::unistd::chown(&path, Some(u.uid), Some(u.gid)).expect("chown");
            }
        }
        let conf = format!(
            "listen_addresses = '127.0.0.1'\nport = {}\nssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n",
            self.port
        );
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(self.data().join("postgresql.conf"))
            .expect("postgresql.conf");
        f.write_all(conf.as_bytes()).expect("configure TLS");
    }

    /// Turn on the TCP listener in the namespace: its address, the subnet's logins, and
    /// what ends a vanished host's session within seconds: keepalives for an idle
    /// connection, `tcp_user_timeout` for one with unacknowledged data (a cut link).
    fn serve_tcp(&self, n: &InNetns) {
        let conf = format!(
            "listen_addresses = '{}'\ntcp_keepalives_idle = 2\ntcp_keepalives_interval = 1\n\
             tcp_keepalives_count = 2\ntcp_user_timeout = 4000\n",
            n.listen
        );
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(self.data().join("postgresql.conf"))
            .expect("postgresql.conf");
        f.write_all(conf.as_bytes()).expect("configure TCP");
        let mut h = std::fs::OpenOptions::new()
            .append(true)
            .open(self.data().join("pg_hba.conf"))
            .expect("pg_hba.conf");
        writeln!(h, "host all all {} scram-sha-256", n.hba_net).expect("pg_hba.conf");
    }

    /// The TCP port (meaningful for a TLS cluster).
    pub fn port(&self) -> u16 {
        self.port
    }

    fn pg_ctl_start(&self) {
        let data = self.data().display().to_string();
        let log = self.dir.join("server.log").display().to_string();
        let wait = PG_START_S_MAX.to_string();
        if let Err(e) = self.run(
            "pg_ctl",
            &["-D", &data, "-l", &log, "-w", "-t", &wait, "start"],
            false,
        ) {
            panic!("pg_ctl start: {e}\nserver log:\n{}", self.log());
        }
    }

    /// The server's log, for a failing test's message.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }

    /// A libpq URL for database `db` on this cluster's socket, with the password.
    pub fn url(&self, db: &str) -> String {
        self.url_with_password(db, &self.password)
    }

    /// The same URL with another password (to see a refusal and what it says).
    pub fn url_with_password(&self, db: &str, password: &str) -> String {
        format!(
            "postgresql://{PG_USER}:{password}@/{db}?host={}&port={}",
            self.dir.display(),
            self.port
        )
    }

    /// A URL over TCP to `host` (which must resolve to 127.0.0.1), with `params` appended.
    pub fn tcp_url(&self, host: &str, db: &str, params: &str) -> String {
        format!(
            "postgresql://{PG_USER}:{}@{host}:{}/{db}?{params}",
            self.password, self.port
        )
    }

    /// Make a new empty database and return its URL.
    pub fn database(&self, db: &str) -> String {
        let port = self.port.to_string();
        self.run(
            "createdb",
            &["-h", &self.socket_dir_str(), "-p", &port, "-U", PG_USER, db],
            true,
        )
        .unwrap_or_else(|e| panic!("createdb {db}: {e}"));
        self.url(db)
    }

    /// The postmaster's pid, from postmaster.pid.
    pub fn pid(&self) -> Option<i32> {
        std::fs::read_to_string(self.data().join("postmaster.pid"))
            .ok()?
            .lines()
            .next()?
            .trim()
            .parse()
            .ok()
    }

    /// `pg_ctl restart -m immediate`: every connection is cut, nothing is checkpointed,
    /// and the server comes back through crash recovery (issue 32's restart under load).
    pub fn restart_immediate(&self) {
        let data = self.data().display().to_string();
        let log = self.dir.join("server.log").display().to_string();
        let wait = PG_START_S_MAX.to_string();
        if let Err(e) = self.run(
            "pg_ctl",
            &[
                "-D",
                &data,
                "-l",
                &log,
                "-m",
                "immediate",
                "-w",
                "-t",
                &wait,
                "restart",
            ],
            false,
        ) {
            panic!("pg_ctl restart: {e}\nserver log:\n{}", self.log());
        }
    }

    /// Stop the server (immediate) and leave it down until [`Cluster::start_again`].
    pub fn stop_immediate(&self) {
        let data = self.data().display().to_string();
        if let Err(e) = self.run(
            "pg_ctl",
            &["-D", &data, "-m", "immediate", "-w", "stop"],
            false,
        ) {
            panic!("pg_ctl stop: {e}\nserver log:\n{}", self.log());
        }
    }

    pub fn start_again(&self) {
        self.pg_ctl_start();
    }

    /// Stop and remove now (what Drop does), reporting a failure instead of ignoring it.
    pub fn stop(mut self) -> Result<(), String> {
        self.teardown()
    }

    fn teardown(&mut self) -> Result<(), String> {
        if self.stopped {
            return Ok(());
        }
        self.stopped = true;
        let data = self.data().display().to_string();
        let mut result = Ok(());
        if self.data().join("postmaster.pid").exists() {
            result = self
                .run(
                    "pg_ctl",
                    &["-D", &data, "-m", "immediate", "-w", "stop"],
                    false,
                )
                .map(|_| ());
        }
        // The guard finds no postmaster.pid and only removes what is left.
        drop(self.guard.take());
        if let Some(mut g) = self.guard_child.take() {
            let until = Instant::now() + Duration::from_secs(PG_START_S_MAX);
            while Instant::now() < until {
                if let Ok(Some(_)) = g.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        if self.dir.exists() {
            std::fs::remove_dir_all(&self.dir)
                .map_err(|e| format!("removing {}: {e}", self.dir.display()))?;
        }
        result
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            // Drop cannot fail; the guard has removed the dir all the same.
            let _ = writeln!(std::io::stderr(), "stopping the test cluster: {e}");
        }
    }
}

/// A TCP port on 127.0.0.1 that was free a moment ago (the kernel's pick for port 0).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port on 127.0.0.1")
}

fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.write_u32(std::process::id());
    h.finish()
}
