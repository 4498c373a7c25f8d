//! Several hosts on one PostgreSQL spool, with real network separation (issue 33): network
//! namespaces (tests/support/netns.rs) `hs-<pid>-pg`, `-i1`, `-i2`, `-d1` and `-d2`, each with a veth pair into a
//! bridge of the root namespace and an address of its own in one 10.213.x.0/24 block. The
//! database host runs PostgreSQL on TCP; two intake hosts and two dispatcher hosts run the
//! real binary (`ip netns exec <ns> hookspool --home <home> intake|dispatch`), each with its
//! own home and config; the receiver and the load client run in the root namespace on the
//! bridge's address.
//!
//! Two client threads round-robin signed webhooks over both intakes (ids n = 0.., key
//! n % 8), retry each until a 2xx (a connection error or a 503 is retried), send each
//! acknowledged id once more to the other intake (a provider retrying a lost answer: it must
//! be a duplicate, never a 5xx) and record every answer. Under that load, in one run:
//!
//! 1. SIGKILL the active dispatcher: the standby takes over; the time from the kill to the
//!    first delivery after it is printed (target under 5 s). The killed one is started
//!    again (as systemd would) and waits as a standby.
//! 2. Cut the active dispatcher host's link (`ip link set <veth> down`) for
//!    `HOOKSPOOL_MULTIHOST_CUT_S` seconds (30 by default), then bring it back: the standby
//!    takes over once PostgreSQL's keepalives ended the cut one's session; the cut one
//!    stops (non-zero, "another dispatcher took the spool's dispatcher lock") and is
//!    started again as a standby; no batch is delivered with two different contents.
//! 3. SIGKILL one intake: the client sees only connection errors for it, the other keeps
//!    acknowledging, and no 5xx ever follows a 2xx. It is started again.
//! 4. Stop PostgreSQL (`-m immediate`) for 3 s and start it again: both intakes answer 503
//!    with Retry-After meanwhile and resume; the dispatchers reconnect (one that finds the
//!    other active stops and is started again as a standby).
//!
//! After each, with the load paused: every acknowledged id delivered (read from the batch
//! documents' events), 0 lost, each key's ids first arriving in the order they were
//! acknowledged, no batch delivered with two contents, no id in two batches (dedup across
//! intakes), every batch delivered (none left leased or waiting) and the spool's invariants
//! hold. The figures are printed; any loss or broken rule panics at the end with all
//! findings. Needs root and `ip` (else the one skip rule) and PostgreSQL.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hookspool::store::{BatchFilter, Role, Store};
use nix::sys::signal::Signal;

use super::daemon::{Daemon, Spec};
use super::intake::Resp;
use super::netns::Net;
use super::pg::Cluster;
use super::receiver::Receiver;

const KEYS: u64 = 8;
const INTAKE_PORT: u16 = 8080;
/// Takeover target: the kill to the first delivery after it.
const TAKEOVER_S_MAX: f64 = 5.0;
/// How long the active dispatcher's host is cut off in scenario 2.
const CUT_S_ENV: &str = "HOOKSPOOL_MULTIHOST_CUT_S";
const CUT_S_DEFAULT: u64 = 30;
/// How long PostgreSQL stays down in scenario 4.
const PG_DOWN_S: u64 = 3;
/// Every host but the receiver's (the root namespace), with its last address byte.
const HOSTS: [(&str, u8); 5] = [("pg", 1), ("i1", 2), ("i2", 3), ("d1", 4), ("d2", 5)];

/// One host's service: `ip netns exec <ns> hookspool --home <home> <command>`, through a
/// wrapper script that execs (so the pid is the service's).
struct Host {
    name: &'static str,
    command: &'static str,
    home: tempfile::TempDir,
    wrapper: PathBuf,
    proc: Option<Daemon>,
    /// Earlier processes' logs and exits (for the report).
    past: Vec<String>,
}

impl Host {
    fn new(net: &Net, scripts: &Path, name: &'static str, command: &'static str) -> Host {
        let wrapper = scripts.join(format!("in-{name}.sh"));
        super::executable(
            &wrapper,
            &format!(
                "#!/bin/sh\nexec ip netns exec {} {} \"$@\"\n",
                net.ns(name),
                super::bin().display()
            ),
        );
        Host {
            name,
            command,
            home: tempfile::tempdir().unwrap(),
            wrapper,
            proc: None,
            past: Vec::new(),
        }
    }

    fn start(&mut self) {
        assert!(self.proc.is_none(), "{} runs already", self.name);
        let spec = Spec::new(self.home.path(), &[self.command]).program(&self.wrapper);
        self.proc = Some(Daemon::start(spec));
    }

    fn p(&mut self) -> &mut Daemon {
        self.proc.as_mut().expect("running")
    }

    fn log(&self) -> String {
        self.proc.as_ref().map(|p| p.log()).unwrap_or_default()
    }

    fn running(&mut self) -> bool {
        match &mut self.proc {
            Some(p) => p.child.try_wait().unwrap().is_none(),
            None => false,
        }
    }

    /// An active dispatcher: running, and it said "dispatcher ready" (a standby says so only
    /// once it took the lock).
    fn active(&mut self) -> bool {
        self.running() && self.log().contains("dispatcher ready")
    }

    /// The process has exited (or was killed): its status and log move to `past`.
    fn reap(&mut self, within: Duration) -> std::process::ExitStatus {
        let mut p = self.proc.take().expect("running");
        let st = p.wait_exit(within);
        self.past.push(format!("{st:?}\n{}", p.log()));
        st
    }

    fn kill(&mut self) {
        self.p().signal(Signal::SIGKILL);
        self.reap(Duration::from_secs(10));
    }

    /// Started (again): wait until it is up, as a standby or as the active one (when no
    /// other dispatcher is).
    fn wait_up(&mut self) {
        let name = self.name;
        let p = self.p();
        let up = p.logged(Duration::from_secs(30), |l| {
            l.contains("standby:") || l.contains("dispatcher ready")
        });
        p.assert_running("after its start");
        assert!(up, "{name} never came up:\n{}", p.log());
    }

    fn last_lines(&self, n: usize) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

fn write_config(h: &Host, net: &Net, rx_url: &str, url_file: &Path) {
    super::pg_run::write_load_config(
        h.home.path(),
        &format!(
            "listen = \"{}:{INTAKE_PORT}\"\nallow_remote = true",
            net.addr(h.name)
        ),
        rx_url,
        &net.cidr(),
        &format!(
            "\n[alerts]\ndry = true\n\n[spool]\nbackend = \"postgres\"\nurl = {{ file = \"{}\" }}\n",
            url_file.display()
        ),
    );
}

/// One answer (or none) the client got.
#[derive(Clone, Debug)]
struct Try {
    n: u64,
    intake: usize,
    at: Instant,
    /// None: a connection error (refused, reset, timed out, no answer).
    status: Option<u16>,
    retry_after: bool,
    /// The resend of an acknowledged id.
    resend: bool,
}

impl Try {
    fn brief(&self) -> String {
        format!(
            "id {} to i{}: {:?}{}",
            self.n,
            self.intake + 1,
            self.status,
            if self.resend { " (resend)" } else { "" }
        )
    }
}

fn briefs<'a>(tries: impl IntoIterator<Item = &'a Try>) -> Vec<String> {
    tries.into_iter().take(10).map(Try::brief).collect()
}

#[derive(Default)]
struct Load {
    /// Acknowledged ids, in the order of their acknowledgement.
    acked: Vec<u64>,
    tries: Vec<Try>,
    /// Ids the client gave up on (no 2xx within 120 s).
    gave_up: Vec<u64>,
}

struct Client {
    load: Arc<Mutex<Load>>,
    pause: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    idle: Arc<AtomicUsize>,
    acked_n: Arc<AtomicUsize>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

const THREADS: u64 = 2;

impl Client {
    fn start(intakes: [SocketAddr; 2]) -> Client {
        let mut c = Client {
            load: Arc::default(),
            pause: Arc::default(),
            stop: Arc::default(),
            idle: Arc::default(),
            acked_n: Arc::default(),
            threads: Vec::new(),
        };
        for t in 0..THREADS {
            let (load, pause, stop, idle, acked_n) = (
                c.load.clone(),
                c.pause.clone(),
                c.stop.clone(),
                c.idle.clone(),
                c.acked_n.clone(),
            );
            c.threads.push(std::thread::spawn(move || {
                // Thread t sends the ids n with n % THREADS == t: keys are split between the
                // threads, so each key's ids are sent (and acknowledged) one after another.
                let mut n = t;
                while !stop.load(Ordering::SeqCst) {
                    if pause.load(Ordering::SeqCst) {
                        idle.fetch_add(1, Ordering::SeqCst);
                        while pause.load(Ordering::SeqCst) && !stop.load(Ordering::SeqCst) {
                            std::thread::sleep(Duration::from_millis(10));
                        }
                        idle.fetch_sub(1, Ordering::SeqCst);
                        continue;
                    }
                    let body = format!(r#"{{"id":"e{n}","topic":"k{}","n":{n}}}"#, n % KEYS);
                    let first = ((n / THREADS) % 2) as usize;
                    let record = |intake: usize, r: &Option<Resp>, resend: bool| {
                        load.lock().unwrap().tries.push(Try {
                            n,
                            intake,
                            at: Instant::now(),
                            status: r.as_ref().map(|r| r.status),
                            retry_after: r
                                .as_ref()
                                .is_some_and(|r| r.header("retry-after").is_some()),
                            resend,
                        });
                    };
                    let until = Instant::now() + Duration::from_secs(120);
                    let mut a = 0usize;
                    let acked = loop {
                        let intake = (first + a) % 2;
                        a += 1;
                        let r = super::pg_run::try_post(intakes[intake], body.as_bytes());
                        record(intake, &r, false);
                        if r.as_ref().is_some_and(|r| (200..300).contains(&r.status)) {
                            let mut l = load.lock().unwrap();
                            l.acked.push(n);
                            acked_n.fetch_add(1, Ordering::SeqCst);
                            break Some(intake);
                        }
                        if Instant::now() > until {
                            load.lock().unwrap().gave_up.push(n);
                            break None;
                        }
                        std::thread::sleep(Duration::from_millis(50));
                    };
                    // Once more to the other intake, as a provider that lost the answer:
                    // a duplicate, answered 2xx (a 503 or no answer is retried, for 20 s).
                    if let Some(i) = acked {
                        let until = Instant::now() + Duration::from_secs(20);
                        let mut a = 1usize;
                        loop {
                            let intake = (i + a) % 2;
                            a += 1;
                            let r = super::pg_run::try_post(intakes[intake], body.as_bytes());
                            record(intake, &r, true);
                            let retry = match &r {
                                None => true,
                                Some(r) => r.status == 503,
                            };
                            if !retry || Instant::now() > until {
                                break;
                            }
                            std::thread::sleep(Duration::from_millis(50));
                        }
                    }
                    n += THREADS;
                    std::thread::sleep(Duration::from_millis(5));
                }
            }));
        }
        c
    }

    /// Pause after the ids in flight are acknowledged (or given up on).
    fn pause(&self) {
        self.pause.store(true, Ordering::SeqCst);
        let ok = super::eventually(Duration::from_secs(150), || {
            self.idle.load(Ordering::SeqCst) == THREADS as usize
        });
        assert!(ok, "the load client did not pause");
    }

    fn resume(&self) {
        self.pause.store(false, Ordering::SeqCst);
    }

    fn acked_n(&self) -> usize {
        self.acked_n.load(Ordering::SeqCst)
    }

    fn tries_since(&self, since: Instant) -> Vec<Try> {
        self.load
            .lock()
            .unwrap()
            .tries
            .iter()
            .filter(|t| t.at >= since)
            .cloned()
            .collect()
    }

    fn finish(mut self) -> Load {
        self.stop_threads();
        std::mem::take(&mut *self.load.lock().unwrap())
    }

    fn stop_threads(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            t.join().expect("a load client thread");
        }
    }
}

impl Drop for Client {
    /// A failing run stops its client too (each thread ends after the id it is on).
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// What the receiver got, read incrementally.
#[derive(Default)]
struct Delivered {
    next: usize,
    /// Each id's first arrival, in the order of first arrival.
    first: BTreeMap<u64, Instant>,
    order: Vec<u64>,
    /// Each batch's events as first delivered.
    contents: BTreeMap<i64, serde_json::Value>,
    /// The batches each id was delivered in.
    batches_of: BTreeMap<u64, BTreeSet<i64>>,
    docs: usize,
    /// Batches delivered with two different contents.
    two_contents: BTreeSet<i64>,
    last_at: Option<Instant>,
}

impl Delivered {
    fn update(&mut self, rx: &Receiver) {
        let reqs = rx.requests();
        for r in &reqs[self.next.min(reqs.len())..] {
            let doc = r.json();
            self.docs += 1;
            self.last_at = Some(r.at);
            let batch = doc["batch_id"].as_i64().unwrap_or(-1);
            let events = doc["events"].clone();
            match self.contents.get(&batch) {
                Some(before) if *before != events => {
                    self.two_contents.insert(batch);
                }
                Some(_) => {}
                None => {
                    self.contents.insert(batch, events.clone());
                }
            }
            for e in events.as_array().cloned().unwrap_or_default() {
                let Some(n) = e["n"].as_u64() else { continue };
                self.batches_of.entry(n).or_default().insert(batch);
                if let std::collections::btree_map::Entry::Vacant(e) = self.first.entry(n) {
                    e.insert(r.at);
                    self.order.push(n);
                }
            }
        }
        self.next = reqs.len();
    }

    /// The first arrival after `t`.
    fn first_after(&self, rx: &Receiver, t: Instant) -> Option<Instant> {
        rx.requests().iter().map(|r| r.at).find(|at| *at > t)
    }
}

/// The whole run's state. Fields drop in order: the services (SIGKILL), then PostgreSQL,
/// then the namespaces they ran in.
struct Run {
    hosts: Vec<Host>,
    delivered: Delivered,
    findings: Vec<String>,
    /// Acknowledged ids already reported missing (not waited for again).
    reported_missing: BTreeSet<u64>,
    figures: Vec<String>,
    rx: Receiver,
    /// The spool's URL over the bridge, from the root namespace.
    url: String,
    cluster: Cluster,
    net: Net,
}

impl Run {
    fn host(&mut self, name: &str) -> &mut Host {
        self.hosts.iter_mut().find(|h| h.name == name).unwrap()
    }

    fn dispatchers(&mut self) -> Vec<&mut Host> {
        self.hosts
            .iter_mut()
            .filter(|h| h.command == "dispatch")
            .collect()
    }

    fn active_dispatcher(&mut self) -> Option<&'static str> {
        let names: Vec<&'static str> = self
            .dispatchers()
            .into_iter()
            .filter_map(|h| h.active().then_some(h.name))
            .collect();
        assert!(names.len() <= 1, "two active dispatchers: {names:?}");
        names.first().copied()
    }

    fn intake_addr(&self, name: &str) -> SocketAddr {
        format!("{}:{INTAKE_PORT}", self.net.addr(name))
            .parse()
            .unwrap()
    }

    fn open(&self) -> Store {
        Store::open_pg(&self.url, Role::Migrator, Duration::from_secs(30))
            .expect("open the PostgreSQL spool over the bridge")
    }

    fn states(&self) -> BTreeMap<String, usize> {
        let mut m = BTreeMap::new();
        for b in self
            .open()
            .list_batches(&BatchFilter {
                limit: 1_000_000,
                ..Default::default()
            })
            .unwrap()
        {
            *m.entry(b.state.as_str().to_string()).or_default() += 1;
        }
        m
    }

    fn logs(&self) -> String {
        let mut out = String::new();
        for h in &self.hosts {
            out.push_str(&format!(
                "--- {} ({}), last lines:\n{}\n",
                h.name,
                h.command,
                h.last_lines(15)
            ));
        }
        out
    }

    /// The spool's batches the receiver never got a document for: their rows, attempts and
    /// what every dispatcher (this process and the ones before) logged about them.
    fn unseen_batches(&self) -> String {
        let store = self.open();
        let mut out = String::new();
        let all = store
            .list_batches(&BatchFilter {
                limit: 1_000_000,
                ..Default::default()
            })
            .unwrap();
        for b in all
            .iter()
            .filter(|b| !self.delivered.contents.contains_key(&b.id))
        {
            let events = store.events(b.id, false).map(|e| e.len()).unwrap_or(0);
            out.push_str(&format!(
                "batch {} key {} state {} ({events} events), never at the receiver; attempts:\n",
                b.id,
                b.key,
                b.state.as_str()
            ));
            for a in store.attempts(b.id).unwrap_or_default() {
                out.push_str(&format!("  {a:?}\n"));
            }
            let needle = format!("batch={} ", b.id);
            for h in self.hosts.iter().filter(|h| h.command == "dispatch") {
                for (i, log) in h
                    .past
                    .iter()
                    .cloned()
                    .chain(std::iter::once(h.log()))
                    .enumerate()
                {
                    for l in log.lines().filter(|l| l.contains(&needle)) {
                        out.push_str(&format!("  {} (process {i}): {l}\n", h.name));
                    }
                }
            }
        }
        out
    }

    fn finding(&mut self, what: String) {
        eprintln!("multihost FINDING: {what}");
        self.findings.push(what);
    }

    /// Dispatchers that exited are started again, as systemd would (Restart=on-failure):
    /// their exits are noted.
    fn restart_exited_dispatchers(&mut self, when: &str) {
        let mut notes = Vec::new();
        for h in self.dispatchers() {
            if h.proc.is_some() && !h.running() {
                let st = h.reap(Duration::from_secs(5));
                let log = h.past.last().cloned().unwrap_or_default();
                let expected = log.contains("another dispatcher took the spool's dispatcher lock");
                let why = log
                    .lines()
                    .rev()
                    .find(|l| !l.trim().is_empty())
                    .unwrap_or("(nothing logged)")
                    .to_string();
                notes.push((
                    expected,
                    format!("{} exited {when} ({st:?}): {why}", h.name),
                ));
                h.start();
                h.wait_up();
            }
        }
        for (expected, n) in notes {
            eprintln!("multihost: {n}; started again");
            if expected {
                self.figures.push(n);
            } else {
                self.finding(n);
            }
        }
    }

    /// The checks after a scenario, with the load paused.
    fn checkpoint(&mut self, client: &Client, scenario: &str) {
        let began = Instant::now();
        client.pause();
        let acked: BTreeSet<u64> = client.load.lock().unwrap().acked.iter().copied().collect();
        let want: BTreeSet<u64> = acked.difference(&self.reported_missing).copied().collect();
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            self.delivered.update(&self.rx);
            if want.iter().all(|n| self.delivered.first.contains_key(n)) {
                break;
            }
            if Instant::now() > until {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let missing: Vec<u64> = want
            .iter()
            .filter(|n| !self.delivered.first.contains_key(n))
            .copied()
            .collect();
        if !missing.is_empty() {
            let logs = format!("{}\n{}", self.unseen_batches(), self.logs());
            self.finding(format!(
                "{scenario}: {} acknowledged ids not delivered within 60 s: {:?}...\n{logs}",
                missing.len(),
                &missing[..missing.len().min(20)]
            ));
            self.reported_missing.extend(missing.iter().copied());
        }
        // Nothing leased or waiting.
        let mut states = BTreeMap::new();
        let settled = super::eventually(Duration::from_secs(30), || {
            states = self.states();
            states.keys().all(|s| s == "delivered")
        });
        if !settled {
            self.finding(format!(
                "{scenario}: batches not delivered 30 s after the load paused: {states:?}"
            ));
        }
        let d = &self.delivered;
        let mut problems = Vec::new();
        if !d.two_contents.is_empty() {
            problems.push(format!(
                "batches delivered with two different contents: {:?}",
                d.two_contents
            ));
        }
        let in_two: Vec<u64> = d
            .batches_of
            .iter()
            .filter(|(_, b)| b.len() > 1)
            .map(|(n, _)| *n)
            .collect();
        if !in_two.is_empty() {
            problems.push(format!(
                "{} ids delivered in two batches (dedup across intakes): {:?}",
                in_two.len(),
                &in_two[..in_two.len().min(20)]
            ));
        }
        // Each key's ids first arrived in the order they were acknowledged.
        let ack_order = client.load.lock().unwrap().acked.clone();
        for k in 0..KEYS {
            let arrived: Vec<u64> = d.order.iter().copied().filter(|n| n % KEYS == k).collect();
            let arrived_set: BTreeSet<u64> = arrived.iter().copied().collect();
            let acked_k: Vec<u64> = ack_order
                .iter()
                .copied()
                .filter(|n| n % KEYS == k && arrived_set.contains(n))
                .collect();
            let arrived_acked: Vec<u64> = arrived
                .iter()
                .copied()
                .filter(|n| acked.contains(n))
                .collect();
            if arrived_acked != acked_k {
                let at = arrived_acked
                    .iter()
                    .zip(&acked_k)
                    .position(|(a, b)| a != b)
                    .unwrap_or(0);
                problems.push(format!(
                    "key k{k} out of order from position {at}: arrived {:?}, acknowledged {:?}",
                    &arrived_acked[at..(at + 5).min(arrived_acked.len())],
                    &acked_k[at..(at + 5).min(acked_k.len())]
                ));
            }
        }
        let invariants = self.open().check_invariants().unwrap();
        if !invariants.is_empty() {
            problems.push(format!("spool invariants: {invariants:?}"));
        }
        let line = format!(
            "{scenario}: {} acknowledged, {} delivered ids in {} batches ({} documents, {} again), {} lost, states {:?}, checked in {:.1} s",
            acked.len(),
            self.delivered.first.len(),
            self.delivered.contents.len(),
            self.delivered.docs,
            self.delivered.docs - self.delivered.contents.len(),
            acked.intersection(&self.reported_missing).count(),
            states,
            began.elapsed().as_secs_f64()
        );
        eprintln!("multihost: {line}");
        self.figures.push(line);
        for p in problems {
            self.finding(format!("{scenario}: {p}"));
        }
        client.resume();
    }
}

fn wait_acked(client: &Client, more: usize, within: Duration) -> bool {
    let target = client.acked_n() + more;
    super::eventually(within, || client.acked_n() >= target)
}

/// The tests of this file one at a time: `Net` names its namespaces, bridge and links after
/// this process's id, so two of them at once in one test binary would clash.
fn one_net_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static NET: Mutex<()> = Mutex::new(());
    NET.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The namespaces of `hosts` (one of them `pg`) and a cluster on `pg` with an empty database
/// `spool`, this file's tests one at a time (the guard); `None` after the skip rule, which
/// names `test`, when they cannot be made here.
fn hosts_and_database(
    test: &str,
    hosts: &[(&'static str, u8)],
) -> Option<(std::sync::MutexGuard<'static, ()>, Net, Cluster)> {
    let one = one_net_at_a_time();
    if !is_root() {
        super::skip::skip_or_fail(&format!("{test} makes network namespaces: needs root"));
        return None;
    }
    if Command::new("ip").arg("-V").output().is_err() {
        super::skip::skip_or_fail(&format!("{test} needs `ip` (iproute2)"));
        return None;
    }
    let net = match Net::setup(hosts) {
        Ok(n) => n,
        Err(why) => {
            super::skip::skip_or_fail(&format!("cannot make network namespaces: {why}"));
            return None;
        }
    };
    let cluster = match Cluster::start_in_netns(&net.ns("pg"), &net.addr("pg"), &net.cidr()) {
        Ok(c) => c,
        Err(why) => {
            super::skip::skip_or_fail(&why);
            return None;
        }
    };
    cluster.database("spool");
    Some((one, net, cluster))
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

#[test]
fn hosts_die_and_links_break_under_load_and_nothing_is_lost() {
    let cut_s: u64 = std::env::var(CUT_S_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(CUT_S_DEFAULT);
    let started = Instant::now();
    let Some((_one, net, cluster)) = hosts_and_database("the multi-host test", &HOSTS) else {
        return;
    };
    let url = cluster.tcp_url(&net.addr("pg"), "spool", "sslmode=disable");
    let files = tempfile::tempdir().unwrap();
    let url_file = files.path().join("pg-url");
    std::fs::write(&url_file, format!("{url}\n")).unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&url_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let rx = rt.block_on(Receiver::start_on(&net.bridge_addr()));
    let hosts = vec![
        Host::new(&net, files.path(), "i1", "intake"),
        Host::new(&net, files.path(), "i2", "intake"),
        Host::new(&net, files.path(), "d1", "dispatch"),
        Host::new(&net, files.path(), "d2", "dispatch"),
    ];
    for h in &hosts {
        write_config(h, &net, &rx.url(), &url_file);
    }
    let mut run = Run {
        net,
        cluster,
        url,
        rx,
        hosts,
        delivered: Delivered::default(),
        findings: Vec::new(),
        reported_missing: BTreeSet::new(),
        figures: Vec::new(),
    };
    // The schema, applied from the root namespace over the bridge.
    drop(run.open());
    run.host("d1").start();
    run.host("d1")
        .p()
        .wait_log("dispatcher ready", Duration::from_secs(30));
    run.host("d2").start();
    run.host("d2")
        .p()
        .wait_log("standby:", Duration::from_secs(30));
    for name in ["i1", "i2"] {
        let addr = run.intake_addr(name);
        run.host(name).start();
        run.host(name).p().wait_serving(addr);
    }
    eprintln!(
        "multihost: 5 namespaces on 10.213.{}.0/24 up, PostgreSQL at {}:5432, receiver at {}, set up in {:.1} s",
        run.net.x,
        run.net.addr("pg"),
        run.rx.url(),
        started.elapsed().as_secs_f64()
    );
    let client = Client::start([run.intake_addr("i1"), run.intake_addr("i2")]);
    assert!(
        wait_acked(&client, 200, Duration::from_secs(60)),
        "the load does not get through:\n{}",
        run.logs()
    );
    run.checkpoint(&client, "warm-up");

    // 1. SIGKILL the active dispatcher.
    run.restart_exited_dispatchers("before the kill");
    if run.active_dispatcher().is_none() {
        super::eventually(Duration::from_secs(20), || {
            run.active_dispatcher().is_some()
        });
    }
    let victim = run.active_dispatcher().expect("an active dispatcher");
    let other = if victim == "d1" { "d2" } else { "d1" };
    wait_acked(&client, 100, Duration::from_secs(30));
    let killed_at = Instant::now();
    run.host(victim).kill();
    let took = run.host(other).p().logged(Duration::from_secs(30), |l| {
        l.contains("active: took the spool's dispatcher lock")
    });
    let took_at = Instant::now();
    if !took {
        let logs = run.logs();
        run.finding(format!(
            "1: the standby {other} did not take over within 30 s of the SIGKILL of {victim}\n{logs}"
        ));
    }
    let first = super::eventually(Duration::from_secs(30), || {
        run.delivered.first_after(&run.rx, killed_at).is_some()
    });
    match run.delivered.first_after(&run.rx, killed_at) {
        Some(at) if first => {
            let s = at.duration_since(killed_at).as_secs_f64();
            let line = format!(
                "1: SIGKILL of the active dispatcher {victim} -> first delivery after it: {s:.2} s (standby {other} logged its takeover within {:.2} s)",
                took_at.duration_since(killed_at).as_secs_f64()
            );
            eprintln!("multihost: {line}");
            run.figures.push(line);
            if s >= TAKEOVER_S_MAX {
                run.finding(format!(
                    "1: takeover took {s:.2} s (target {TAKEOVER_S_MAX} s)"
                ));
            }
        }
        _ => {
            let logs = run.logs();
            run.finding(format!(
                "1: nothing delivered within 30 s of the SIGKILL\n{logs}"
            ));
        }
    }
    // A dispatcher that died meanwhile is a finding (systemd would start it again).
    run.restart_exited_dispatchers("after the takeover");
    // Started again, as systemd would: a standby now (or the active one, if the other died).
    run.host(victim).start();
    run.host(victim).wait_up();
    run.checkpoint(&client, "1 (SIGKILL of the active dispatcher)");

    // 2. Cut the active dispatcher host's link.
    run.restart_exited_dispatchers("before the cut");
    let cut = match run.active_dispatcher() {
        Some(d) => d,
        None => {
            assert!(
                super::eventually(Duration::from_secs(20), || run
                    .active_dispatcher()
                    .is_some()),
                "no active dispatcher before the cut:\n{}",
                run.logs()
            );
            run.active_dispatcher().unwrap()
        }
    };
    let other = if cut == "d1" { "d2" } else { "d1" };
    wait_acked(&client, 100, Duration::from_secs(30));
    let cut_at = Instant::now();
    run.net.link(cut, false).unwrap();
    let took = run.host(other).p().logged(Duration::from_secs(cut_s), |l| {
        l.contains("active: took the spool's dispatcher lock")
    });
    let took_s = cut_at.elapsed().as_secs_f64();
    if took {
        let first = super::eventually(Duration::from_secs(20), || {
            run.delivered
                .first_after(&run.rx, cut_at + Duration::from_secs_f64(took_s))
                .is_some()
        });
        let first_s = run
            .delivered
            .first_after(&run.rx, cut_at + Duration::from_secs_f64(took_s))
            .filter(|_| first)
            .map(|at| format!("{:.2} s", at.duration_since(cut_at).as_secs_f64()))
            .unwrap_or_else(|| "none within 20 s".into());
        let line = format!(
            "2: link of the active dispatcher {cut} down -> {other} took the lock after {took_s:.2} s, first delivery after it at {first_s}"
        );
        eprintln!("multihost: {line}");
        run.figures.push(line);
    } else {
        // What the database host's TCP says about the cut host's connections (still cut).
        let ss = Command::new("ip")
            .args(["netns", "exec", &run.net.ns("pg"), "ss", "-tnoi", "dst"])
            .arg(run.net.addr(cut))
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_else(|e| format!("ss: {e}"));
        let logs = run.logs();
        run.finding(format!(
            "2: the standby {other} did not take over while {cut}'s link was down ({took_s:.1} s); the database host's sockets to {cut}:\n{ss}\n{logs}"
        ));
    }
    let up_at = cut_at + Duration::from_secs(cut_s);
    std::thread::sleep(up_at.saturating_duration_since(Instant::now()));
    run.net.link(cut, true).unwrap();
    let up_at = Instant::now();
    // The cut one finds the lock taken when it gets through again: it stops (systemd starts
    // it again as a standby); it must not stay active. When no one took over, its session
    // lived through the cut and it carries on as the active one (reported above).
    let settled = took && super::eventually(Duration::from_secs(90), || !run.host(cut).running());
    let cut_running = run.host(cut).running();
    let line = if settled && !cut_running {
        let st = run.host(cut).reap(Duration::from_secs(5));
        let log = run.host(cut).past.last().cloned().unwrap_or_default();
        let why = log.contains("another dispatcher took the spool's dispatcher lock");
        if st.success() || !why {
            run.finding(format!(
                "2: the cut dispatcher {cut} exited {st:?} without saying another dispatcher took the lock:\n{log}"
            ));
        }
        run.host(cut).start();
        run.host(cut).wait_up();
        format!(
            "2: link back after {cut_s} s; the cut dispatcher {cut} stopped {:.1} s later ({st:?}, \"another dispatcher took the spool's dispatcher lock\": {why}) and was started again as a standby",
            up_at.elapsed().as_secs_f64()
        )
    } else if !took {
        let active = run.active_dispatcher();
        format!(
            "2: link back after {cut_s} s; no takeover happened: {cut}'s session outlived the cut, active now: {active:?}"
        )
    } else {
        let log = run.host(cut).log();
        run.finding(format!(
            "2: the cut dispatcher {cut} neither stopped nor became a standby within 90 s of its link coming back:\n{log}"
        ));
        format!("2: link back after {cut_s} s; {cut} still running as before")
    };
    eprintln!("multihost: {line}");
    run.figures.push(line);
    if run.host(cut).active() && run.host(other).active() {
        run.finding("2: both dispatchers active after the cut".into());
    }
    run.restart_exited_dispatchers("after the cut");
    run.checkpoint(&client, "2 (active dispatcher's link cut)");

    // 3. SIGKILL one intake.
    wait_acked(&client, 100, Duration::from_secs(30));
    let killed_at = Instant::now();
    run.host("i1").kill();
    let before = client.acked_n();
    std::thread::sleep(Duration::from_secs(5));
    // A request answered just before the kill may be recorded just after it.
    let window = client.tries_since(killed_at + Duration::from_millis(200));
    let to_dead: Vec<&Try> = window.iter().filter(|t| t.intake == 0).collect();
    let answered_dead: Vec<&&Try> = to_dead.iter().filter(|t| t.status.is_some()).collect();
    let line = format!(
        "3: intake i1 SIGKILLed: {} tries to it in 5 s, all connection errors: {}; {} acknowledged meanwhile (by i2)",
        to_dead.len(),
        answered_dead.is_empty(),
        client.acked_n() - before
    );
    eprintln!("multihost: {line}");
    run.figures.push(line);
    if !answered_dead.is_empty() {
        run.finding(format!(
            "3: the dead intake answered: {:?}",
            briefs(answered_dead.iter().map(|t| **t))
        ));
    }
    if client.acked_n() == before {
        run.finding("3: nothing acknowledged by the other intake for 5 s".into());
    }
    let addr = run.intake_addr("i1");
    run.host("i1").start();
    run.host("i1").p().wait_serving(addr);
    run.checkpoint(&client, "3 (SIGKILL of an intake)");

    // 4. PostgreSQL down (immediate) for a few seconds, then up again.
    wait_acked(&client, 100, Duration::from_secs(30));
    let down_at = Instant::now();
    run.cluster.stop_immediate();
    std::thread::sleep(Duration::from_secs(PG_DOWN_S));
    let up_call = Instant::now();
    run.cluster.start_again();
    let up_at = Instant::now();
    let during: Vec<Try> = client
        .tries_since(down_at)
        .into_iter()
        .filter(|t| t.at <= up_call)
        .collect();
    let acked_before = client.acked_n();
    let resumed = wait_acked(&client, 50, Duration::from_secs(60));
    let resumed_s = up_at.elapsed().as_secs_f64();
    for i in 0..2 {
        let name = ["i1", "i2"][i];
        let mine: Vec<&Try> = during.iter().filter(|t| t.intake == i).collect();
        let with_ra = mine
            .iter()
            .filter(|t| t.status == Some(503) && t.retry_after)
            .count();
        let other: Vec<Option<u16>> = mine
            .iter()
            .filter(|t| !(t.status == Some(503) && t.retry_after))
            .map(|t| t.status)
            .collect();
        let line = format!(
            "4: while PostgreSQL was down ({PG_DOWN_S} s): {name} answered {} tries, {with_ra} with 503 + Retry-After, others {:?}",
            mine.len(),
            other.iter().take(10).collect::<Vec<_>>()
        );
        eprintln!("multihost: {line}");
        run.figures.push(line);
        if with_ra == 0 {
            run.finding(format!(
                "4: {name} never answered 503 with Retry-After while PostgreSQL was down"
            ));
        }
    }
    if resumed {
        let line = format!(
            "4: PostgreSQL up again -> 50 more acknowledged within {resumed_s:.2} s ({} before)",
            acked_before
        );
        eprintln!("multihost: {line}");
        run.figures.push(line);
    } else {
        let logs = run.logs();
        run.finding(format!(
            "4: the intakes did not resume within 60 s of PostgreSQL's start\n{logs}"
        ));
    }
    let delivered_again = super::eventually(Duration::from_secs(30), || {
        run.delivered.first_after(&run.rx, up_at).is_some()
    });
    if !delivered_again {
        let logs = run.logs();
        run.finding(format!(
            "4: nothing delivered within 30 s of PostgreSQL's start\n{logs}"
        ));
    }
    std::thread::sleep(Duration::from_secs(2));
    run.restart_exited_dispatchers("after PostgreSQL's restart");
    if run.active_dispatcher().is_none() {
        let ok = super::eventually(Duration::from_secs(20), || {
            run.active_dispatcher().is_some()
        });
        if !ok {
            run.finding("4: no dispatcher active after PostgreSQL's restart".into());
        }
    }
    run.checkpoint(&client, "4 (PostgreSQL stopped -m immediate and started)");

    let load = client.finish();
    let first_try: Vec<&Try> = load.tries.iter().filter(|t| !t.resend).collect();
    let resends: Vec<&Try> = load.tries.iter().filter(|t| t.resend).collect();
    let bad_5xx: Vec<&Try> = load
        .tries
        .iter()
        .filter(|t| t.status.is_some_and(|s| s >= 500 && s != 503))
        .collect();
    let after_2xx: Vec<&&Try> = resends
        .iter()
        .filter(|t| t.status.is_some_and(|s| s >= 500))
        .collect();
    let not_2xx_resend: Vec<&&Try> = resends
        .iter()
        .filter(|t| {
            t.status
                .is_some_and(|s| !(200..300).contains(&s) && s != 503)
        })
        .collect();
    let line = format!(
        "client: {} acknowledged, {} tries ({} connection errors, {} 503), {} resends of acknowledged ids ({} 5xx after a 2xx, of which {} were 503 while PostgreSQL was down), {} other 5xx, {} given up; whole run {:.0} s (cut {cut_s} s)",
        load.acked.len(),
        first_try.len(),
        first_try.iter().filter(|t| t.status.is_none()).count(),
        first_try.iter().filter(|t| t.status == Some(503)).count(),
        resends.len(),
        after_2xx.len(),
        after_2xx.iter().filter(|t| t.status == Some(503)).count(),
        bad_5xx.len(),
        load.gave_up.len(),
        started.elapsed().as_secs_f64()
    );
    eprintln!("multihost: {line}");
    run.figures.push(line);
    if !bad_5xx.is_empty() {
        run.finding(format!(
            "5xx other than 503: {:?}",
            briefs(bad_5xx.iter().copied())
        ));
    }
    if after_2xx.iter().any(|t| t.status != Some(503)) {
        run.finding(format!(
            "a 5xx other than 503 after a 2xx for the same id: {:?}",
            briefs(
                after_2xx
                    .iter()
                    .filter(|t| t.status != Some(503))
                    .map(|t| **t)
            )
        ));
    }
    if !not_2xx_resend.is_empty() {
        run.finding(format!(
            "a resend of an acknowledged id answered neither 2xx nor 503: {:?}",
            briefs(not_2xx_resend.iter().map(|t| **t))
        ));
    }
    let no_retry_after = load
        .tries
        .iter()
        .filter(|t| t.status == Some(503) && !t.retry_after)
        .count();
    if no_retry_after > 0 {
        run.finding(format!("{no_retry_after} answers 503 without Retry-After"));
    }
    if !load.gave_up.is_empty() {
        run.finding(format!("ids never acknowledged: {:?}", load.gave_up));
    }
    eprintln!("multihost figures:\n  {}", run.figures.join("\n  "));
    if !run.findings.is_empty() {
        // Every service's whole log, for the one reading the findings.
        let path = std::env::temp_dir().join(format!("hookspool-multihost-{}.log", run.net.pid));
        let mut text = String::new();
        for h in &run.hosts {
            for (i, log) in h
                .past
                .iter()
                .cloned()
                .chain(std::iter::once(h.log()))
                .enumerate()
            {
                text.push_str(&format!(
                    "===== {} ({}), process {i}\n{log}\n",
                    h.name, h.command
                ));
            }
        }
        std::fs::write(&path, text).unwrap();
        run.findings
            .push(format!("every service's log: {}", path.display()));
    }
    for h in &mut run.hosts {
        if let Some(p) = h.proc.take() {
            drop(p);
        }
    }
    assert!(
        run.findings.is_empty(),
        "{} findings:\n{}",
        run.findings.len(),
        run.findings.join("\n\n")
    );
}

/// A session over TCP whose link is cut while it waits for an answer ends within seconds,
/// not hours (`store::pg::PG_KEEPALIVE_IDLE_S`, `PG_TCP_USER_TIMEOUT_S`). The multi-host
/// test's step 2 found an active dispatcher cut off this way still running as before 90 s
/// after its link came back: its statement had been sent and acknowledged, the answer was
/// lost with the link, and with the driver's keepalive after two hours nothing on its side
/// ever timed out. Here the write waits for the spool's write lock, which a session over
/// the cluster's Unix socket holds (no link to cut), the database host's link goes down,
/// and the waiting write must fail within `CUT_WAIT_S_MAX`.
#[test]
fn a_session_waiting_for_an_answer_on_a_cut_link_ends_within_seconds() {
    const CUT_WAIT_S_MAX: u64 = 40;
    let Some((_one, net, cluster)) = hosts_and_database("the cut-link test", &[("pg", 1)]) else {
        return;
    };
    let local = cluster.url("spool");
    let url = cluster.tcp_url(&net.addr("pg"), "spool", "sslmode=disable");
    let mut store = Store::open_pg(&url, Role::Migrator, Duration::from_secs(300)).unwrap();
    let mut holder = postgres::Client::connect(&local, postgres::NoTls).unwrap();
    holder
        .execute(
            "SELECT pg_advisory_lock($1)",
            &[&hookspool::store::pg::PG_WRITE_LOCK_KEY],
        )
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let _waiter = std::thread::spawn(move || {
        let r = store.set_meta("cut_link_test", "1");
        let _ = tx.send(r.map_err(|e| e.to_string()));
    });
    std::thread::sleep(Duration::from_secs(1));
    assert!(rx.try_recv().is_err(), "the write waits for the lock");
    net.link("pg", false).unwrap();
    let cut = Instant::now();
    let got = rx.recv_timeout(Duration::from_secs(CUT_WAIT_S_MAX));
    let took = cut.elapsed();
    net.link("pg", true).unwrap();
    holder
        .execute("SELECT pg_advisory_unlock_all()", &[])
        .unwrap();
    // Without the keepalives the waiting thread never ends: it is left behind, not joined.
    let r = got.unwrap_or_else(|_| {
        panic!("the write on the cut link still waited {CUT_WAIT_S_MAX} s after the cut")
    });
    eprintln!(
        "multihost: a write waiting on a cut link ended {:.1} s after the cut: {r:?}",
        took.as_secs_f64()
    );
    assert!(r.is_err(), "the write cannot have committed: {r:?}");
}

/// A dispatcher whose session was lost on its side while the server kept it ends that
/// session itself when it connects again, and takes its lock back
/// (`PgConn::take_dispatch_again`). The server's keepalives are off for this session (its
/// kernel's default: two hours, as on a server left at its defaults), the database host's
/// link is cut until the dispatcher's own timeouts end its side, then comes back: the
/// server still has the old session, holding the dispatcher lock. Before, the dispatcher
/// failed with `Locked` and came back as a standby, and every dispatcher stayed one until
/// the server ended that session itself.
#[test]
fn a_dispatcher_cut_off_ends_its_own_orphaned_session_and_takes_its_lock_back() {
    const CUT_WAIT_S_MAX: u64 = 40;
    let Some((_one, net, cluster)) = hosts_and_database("the orphaned-session test", &[("pg", 1)])
    else {
        return;
    };
    let url = cluster.tcp_url(
        &net.addr("pg"),
        "spool",
        "sslmode=disable&options=-c%20tcp_keepalives_idle%3D0%20-c%20tcp_user_timeout%3D0",
    );
    let mut store = Store::open_pg(&url, Role::Migrator, Duration::from_secs(5)).unwrap();
    assert!(
        store.take_dispatch().unwrap(),
        "the first dispatcher is active"
    );
    let mut watcher = postgres::Client::connect(&cluster.url("spool"), postgres::NoTls).unwrap();
    let holder = |w: &mut postgres::Client| -> Vec<i32> {
        w.query(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1
               AND ((classid::bigint << 32) | objid::bigint) = $1",
            &[&hookspool::store::pg::PG_DISPATCH_LOCK_KEY],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
    };
    let before = holder(&mut watcher);
    assert_eq!(before.len(), 1, "one session holds the lock");

    net.link("pg", false).unwrap();
    let cut = Instant::now();
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let r = store.set_meta("orphan_test", "1");
        let _ = tx.send(r.map_err(|e| e.to_string()));
        store
    });
    let lost = rx.recv_timeout(Duration::from_secs(CUT_WAIT_S_MAX));
    let took = cut.elapsed();
    net.link("pg", true).unwrap();
    let lost =
        lost.unwrap_or_else(|_| panic!("the write still waited {CUT_WAIT_S_MAX} s after the cut"));
    assert!(
        lost.is_err(),
        "the write on the cut link cannot have committed: {lost:?}"
    );
    let mut store = waiter.join().unwrap();
    assert_eq!(
        holder(&mut watcher),
        before,
        "the server still keeps the lost session with the lock"
    );

    // As the dispatcher does, wait while the host cannot be reached yet (its neighbour
    // entry failed during the cut): that is weather.
    let back = Instant::now();
    let again = loop {
        match store.set_meta("orphan_test", "2") {
            Err(hookspool::store::StoreError::PgUnreachable { .. })
                if back.elapsed() < Duration::from_secs(CUT_WAIT_S_MAX) =>
            {
                std::thread::sleep(Duration::from_millis(200));
            }
            other => break other,
        }
    };
    eprintln!(
        "multihost: the write on the cut link failed {:.1} s after the cut; the next one, {:.2} s after the link came back: {again:?}",
        took.as_secs_f64(),
        back.elapsed().as_secs_f64()
    );
    again.expect("the dispatcher takes its lock back from its own lost session");
    let now = holder(&mut watcher);
    assert_eq!(now.len(), 1, "one session holds the lock: {now:?}");
    assert_ne!(now, before, "the dispatcher's new session holds it");
    let old_alive: i64 = watcher
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = $1",
            &[&before[0]],
        )
        .unwrap()
        .get(0);
    assert_eq!(old_alive, 0, "the lost session was ended");
}
