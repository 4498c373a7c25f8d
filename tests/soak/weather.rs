//! The bad day, one tick at a time: the receiver's flaps, SIGKILLs of the services at random
//! moments (and their restarts), full-disk episodes, and the services that exit on their
//! own. Every choice comes from the seeded streams given to [`Weather::new`].

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rand::rngs::Xoshiro256PlusPlus;
use rand::{RngExt, SeedableRng};

use super::disk::{self, Filler};
use super::receiver::{Mode, Receiver};
use super::report::DiskLog;
use super::services::{self, Service};

/// Extra time a disk episode counts for after the space is back: the intake's free-space
/// guard trusts one statvfs answer for 5 s (src/intake/disk.rs).
const DISK_GRACE_S: f64 = 6.0;
/// No SIGKILL this long before an episode (nor during it and its grace), so a service that
/// dies there died by itself.
const QUIET_BEFORE_EPISODE_S: f64 = 3.0;
/// How often a full filesystem is topped up (the spool may free pages meanwhile).
const TOPUP: Duration = Duration::from_secs(1);

/// One full-disk episode, in seconds from the start of the run.
#[derive(Clone, Copy, Debug)]
pub struct Episode {
    pub start_s: f64,
    pub end_s: f64,
}

pub struct Plan {
    pub duration: Duration,
    pub kill_every: Duration,
    pub disk_every: Duration,
    pub disk_episode: Duration,
    /// Whether there are full-disk episodes (not with `--hosts`: the spool is PostgreSQL's).
    pub disk: bool,
}

pub struct Weather {
    kill_every: Duration,
    kill_rng: Xoshiro256PlusPlus,
    next_kill_s: f64,
    /// (when, which service) of every SIGKILL.
    pub kills: Vec<(f64, &'static str)>,
    /// (when, which kind: intake, dispatcher, active dispatcher) of every `--hosts` SIGKILL.
    pub kill_kinds: Vec<(f64, &'static str)>,
    flap_rng: Xoshiro256PlusPlus,
    next_flap_s: f64,
    pub mode: Mode,
    mode_since_s: f64,
    /// Seconds the receiver spent in each mode.
    pub mode_time_s: BTreeMap<&'static str, f64>,
    pub episodes: Vec<Episode>,
    next_episode: usize,
    in_episode: bool,
    grace_until_s: f64,
    last_topup: Instant,
    filler: Filler,
    fs_dir: std::path::PathBuf,
    /// Raised while a disk episode (and its grace) is on; the load client reads it.
    pub disk_on: Arc<AtomicBool>,
    pub disks: Vec<DiskLog>,
    said: HashSet<(&'static str, String, bool)>,
}

impl Weather {
    /// `disk_on` is raised while a disk episode (and its grace) is on.
    pub fn new(
        plan: &Plan,
        rng: &mut Xoshiro256PlusPlus,
        fs_dir: &Path,
        disk_on: Arc<AtomicBool>,
    ) -> Weather {
        let total = plan.duration.as_secs_f64();
        let n = if plan.disk {
            ((total / plan.disk_every.as_secs_f64()).round() as usize).max(1)
        } else {
            0
        };
        let slot = total / n.max(1) as f64;
        let len = plan.disk_episode.as_secs_f64().min(slot / 3.0);
        let episodes = (0..n)
            .map(|i| {
                let start_s = i as f64 * slot + slot * rng.random_range(0.35..0.55);
                Episode {
                    start_s,
                    end_s: start_s + len,
                }
            })
            .collect();
        let mut kill_rng = Xoshiro256PlusPlus::seed_from_u64(rng.random());
        let next_kill_s = plan.kill_every.as_secs_f64() * kill_rng.random_range(0.5..1.5);
        Weather {
            kill_every: plan.kill_every,
            kill_rng,
            next_kill_s,
            kills: Vec::new(),
            kill_kinds: Vec::new(),
            flap_rng: Xoshiro256PlusPlus::seed_from_u64(rng.random()),
            next_flap_s: 0.0,
            mode: Mode::Ok,
            mode_since_s: 0.0,
            mode_time_s: BTreeMap::new(),
            episodes,
            next_episode: 0,
            in_episode: false,
            grace_until_s: 0.0,
            last_topup: Instant::now(),
            filler: Filler::new(fs_dir.join("filler")),
            fs_dir: fs_dir.to_path_buf(),
            disk_on,
            disks: Vec::new(),
            said: HashSet::new(),
        }
    }

    /// Whether a disk episode or its grace is on.
    pub fn disk_window(&self, now_s: f64) -> bool {
        self.in_episode || now_s < self.grace_until_s
    }

    /// One look at everything. `services` are the one host's intake and dispatcher, in that
    /// order, or (`--hosts`) every host's service.
    pub fn tick(
        &mut self,
        now_s: f64,
        services: &mut [&mut Service],
        rx: &Receiver,
    ) -> std::io::Result<()> {
        let disk_window = self.disk_window(now_s);
        for s in services.iter_mut() {
            if let Some(e) = s.poll(now_s, disk_window) {
                // The first exit of a kind is a line; a crash loop is summed up at the end.
                if self.said.insert((s.name, e.status.clone(), e.during_disk)) {
                    println!(
                        "soak: FINDING: {} exited on its own at t={:.1}s ({}){}; restarted {} s later, as Restart= would (repeats are counted in the result)",
                        s.name,
                        e.at_s,
                        e.status,
                        if e.during_disk {
                            " during a full-disk episode"
                        } else {
                            ""
                        },
                        services::RESTART_DELAY.as_secs()
                    );
                }
            }
        }
        if now_s >= self.next_flap_s {
            self.flap(now_s, rx);
        }
        self.disk(now_s)?;
        let quiet = self.disk_window(now_s)
            || self
                .episodes
                .get(self.next_episode)
                .is_some_and(|e| now_s >= e.start_s - QUIET_BEFORE_EPISODE_S);
        if now_s >= self.next_kill_s && !quiet {
            match services {
                [intake, dispatch] => self.kill(now_s, intake, dispatch),
                hosts => self.kill_on_hosts(now_s, hosts),
            }
        }
        Ok(())
    }

    fn flap(&mut self, now_s: f64, rx: &Receiver) {
        *self.mode_time_s.entry(self.mode.name()).or_insert(0.0) += now_s - self.mode_since_s;
        self.mode = match self.flap_rng.random_range(0..10) {
            0..=3 => Mode::Ok,
            4 | 5 => Mode::Fail500,
            6 | 7 => Mode::Refuse,
            _ => Mode::Slow,
        };
        self.mode_since_s = now_s;
        rx.set_mode(self.mode);
        self.next_flap_s = now_s + self.flap_rng.random_range(1.0..8.0);
    }

    fn disk(&mut self, now_s: f64) -> std::io::Result<()> {
        if let Some(e) = self.episodes.get(self.next_episode).copied() {
            if !self.in_episode && now_s >= e.start_s {
                self.in_episode = true;
                self.disk_on.store(true, Ordering::SeqCst);
                let free = disk::free_bytes(&self.fs_dir);
                let added = self.filler.fill()?;
                self.last_topup = Instant::now();
                println!(
                    "soak: t={now_s:.1}s disk episode {}: filled {:.1} MiB ({:.1} MiB were free, {} bytes free now)",
                    self.next_episode + 1,
                    mib(added),
                    mib(free),
                    disk::free_bytes(&self.fs_dir)
                );
                self.disks.push(DiskLog {
                    filled_bytes: added,
                    free_before: free,
                    full_at_s: now_s,
                    freed_at_s: None,
                });
            } else if self.in_episode && now_s >= e.end_s {
                self.free(now_s)?;
                self.next_episode += 1;
                println!(
                    "soak: t={now_s:.1}s disk episode ends: {:.1} MiB free again",
                    mib(disk::free_bytes(&self.fs_dir))
                );
            } else if self.in_episode && self.last_topup.elapsed() >= TOPUP {
                self.filler.fill()?;
                self.last_topup = Instant::now();
            }
        }
        if !self.disk_window(now_s) {
            self.disk_on.store(false, Ordering::SeqCst);
        }
        Ok(())
    }

    fn free(&mut self, now_s: f64) -> std::io::Result<()> {
        self.filler.free()?;
        if let Some(d) = self.disks.last_mut() {
            d.freed_at_s = Some(now_s);
        }
        self.in_episode = false;
        self.grace_until_s = now_s + DISK_GRACE_S;
        Ok(())
    }

    fn kill(&mut self, now_s: f64, intake: &mut Service, dispatch: &mut Service) {
        let which = self.kill_rng.random_range(0..10);
        let delay = Duration::from_secs_f64(self.kill_rng.random_range(0.2..3.0));
        // 40 % the intake, 40 % the dispatcher, 20 % both.
        if !(4..8).contains(&which) {
            intake.sigkill();
            intake.restart_after(delay);
            self.kills.push((now_s, "intake"));
        }
        if which >= 4 {
            dispatch.sigkill();
            dispatch.restart_after(delay);
            self.kills.push((now_s, "dispatch"));
        }
        self.next_kill_s =
            now_s + self.kill_every.as_secs_f64() * self.kill_rng.random_range(0.5..1.5);
    }

    /// `--hosts`: SIGKILL one service: 30 % an intake, 30 % a dispatcher (either, the
    /// standby as likely as the active one), 40 % the active dispatcher (a random dispatcher
    /// when none is active); restarted 0.2 to 3 s later.
    fn kill_on_hosts(&mut self, now_s: f64, hosts: &mut [&mut Service]) {
        let which = self.kill_rng.random_range(0..10);
        let delay = Duration::from_secs_f64(self.kill_rng.random_range(0.2..3.0));
        let pick = self.kill_rng.random_range(0..1000usize);
        let of = |command: &str, hosts: &[&mut Service]| -> Vec<usize> {
            (0..hosts.len())
                .filter(|&i| hosts[i].command == command)
                .collect()
        };
        let intakes = of("intake", hosts);
        let dispatchers = of("dispatch", hosts);
        let active: Vec<usize> = dispatchers
            .iter()
            .copied()
            .filter(|&i| hosts[i].active())
            .collect();
        let (victim, what) = match which {
            0..=2 => (intakes.get(pick % intakes.len().max(1)), "intake"),
            3..=5 => (
                dispatchers.get(pick % dispatchers.len().max(1)),
                "dispatcher",
            ),
            _ if !active.is_empty() => (active.first(), "active dispatcher"),
            _ => (
                dispatchers.get(pick % dispatchers.len().max(1)),
                "dispatcher",
            ),
        };
        if let Some(&i) = victim {
            let s = &mut hosts[i];
            // Only a running service is killed; one restarting already counts as down.
            if s.running() {
                s.sigkill();
                s.restart_after(delay);
                self.kills.push((now_s, s.name));
                self.kill_kinds.push((now_s, what));
            }
        }
        self.next_kill_s =
            now_s + self.kill_every.as_secs_f64() * self.kill_rng.random_range(0.5..1.5);
    }

    /// The end of the bad day: the receiver answers 200 from now on and the disk has room.
    pub fn calm(&mut self, now_s: f64, rx: &Receiver) -> std::io::Result<()> {
        *self.mode_time_s.entry(self.mode.name()).or_insert(0.0) += now_s - self.mode_since_s;
        self.mode = Mode::Ok;
        self.mode_since_s = now_s;
        rx.set_mode(Mode::Ok);
        if self.in_episode {
            self.free(now_s)?;
        }
        self.disk_on.store(false, Ordering::SeqCst);
        Ok(())
    }
}

fn mib(b: u64) -> f64 {
    b as f64 / (1u64 << 20) as f64
}
