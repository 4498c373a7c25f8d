//! The soak's result: every figure of the run printed in one block, and the list of reasons
//! it fails (empty when it passes).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::load::Tally;
use super::receiver::Counters;
use super::services::{SelfExit, Service};
use super::verdict::{Acked, Verdict};

/// What one full-disk episode did to the filesystem.
pub struct DiskLog {
    pub filled_bytes: u64,
    pub free_before: u64,
    /// When the filler filled the filesystem and when it was removed (run seconds).
    pub full_at_s: f64,
    pub freed_at_s: Option<f64>,
}

pub struct Report<'a> {
    pub seed: u64,
    pub duration: Duration,
    pub give_up: Duration,
    pub verdict: &'a Verdict,
    pub acked: &'a [Acked],
    pub tally: &'a Tally,
    pub receiver: &'a Counters,
    pub mode_time_s: &'a BTreeMap<&'static str, f64>,
    pub drained: bool,
    pub drain_s: f64,
    pub drain_timeout: Duration,
    pub unfinished: i64,
    pub states: &'a BTreeMap<String, i64>,
    /// (id, route, last_class, last_error)
    pub dead: &'a [(i64, String, String, String)],
    /// (kind, fingerprint, state)
    pub issues: &'a [(String, String, String)],
    /// Every service: the intake and the dispatcher, or every host's (`--hosts`).
    pub services: Vec<&'a Service>,
    pub soak_rss_kib: u64,
    pub kills: &'a [(f64, &'static str)],
    pub disks: &'a [DiskLog],
    pub fs_mib: u64,
    /// Bytes used on the spool's tmpfs at the end (none with `--hosts`).
    pub fs_used: Option<u64>,
    pub min_free_bytes: u64,
    /// How each service's SIGTERM at the end went (None: it was not running).
    pub stops: Vec<(&'static str, Option<String>)>,
    /// Lines of figures of one mode (`--hosts`: takeovers, kills by kind).
    pub extra: Vec<String>,
    /// `hookspool check` at the end: None when it passed, else what it said.
    pub check: Option<String>,
    pub late_senders: usize,
}

fn n(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

fn mib(b: u64) -> f64 {
    b as f64 / (1u64 << 20) as f64
}

impl Report<'_> {
    pub fn print(&self) {
        let (v, t, c) = (self.verdict, self.tally, self.receiver);
        println!();
        println!(
            "soak: RESULT (seed {}, {} of load)",
            self.seed,
            humantime::format_duration(self.duration)
        );
        println!(
            "  sent             {} requests ({} answered 200, {} of them 'duplicate'; {} other 2xx; {} events abandoned after {} s of retries)",
            n(&t.sent),
            n(&t.ok_200),
            n(&t.duplicate_answers),
            n(&t.ok_other_2xx),
            n(&t.abandoned),
            self.give_up.as_secs()
        );
        println!("  acked            {}", v.acked);
        println!(
            "  stored           {} ({} stored but never acked)",
            v.stored, v.stored_unacked
        );
        println!(
            "  delivered        {} acked events, on every route they were routed to ({} documents answered 200, {} answered 500/slow/refused)",
            v.delivered, v.docs_ok, v.docs_refused
        );
        println!(
            "  duplicates       {} (a batch's same content delivered again)",
            v.duplicates
        );
        println!("  lost             {}", v.lost.len());
        for (route, id) in v.lost.iter().take(10) {
            println!("                   lost {id} on route {route}");
        }
        if !v.acked_not_stored.is_empty() {
            println!(
                "  acked, not in the spool {}: {:?}",
                v.acked_not_stored.len(),
                &v.acked_not_stored[..v.acked_not_stored.len().min(10)]
            );
        }
        let order: usize = v.order_violations.values().sum();
        println!("  order violations {order} (per route and key)");
        for ((route, key), n) in &v.order_violations {
            println!("                   {n} on route {route} key {key}");
        }
        println!("  over bound       {}", v.over_bound.len());
        for (route, b, n, bytes) in v.over_bound.iter().take(10) {
            println!("                   batch {b} on {route}: {n} events, {bytes} bytes");
        }
        if !v.conflicts.is_empty() || !v.in_two_batches.is_empty() {
            println!(
                "  batches with two content_hashes {:?}; events in two batches {:?}",
                v.conflicts, v.in_two_batches
            );
        }
        println!(
            "  drained          {} in {:.1} s; batches by state {:?}{}",
            if self.drained { "yes" } else { "NO" },
            self.drain_s,
            self.states,
            if self.drained {
                String::new()
            } else {
                format!(" ({} unfinished)", self.unfinished)
            }
        );
        for (id, route, class, err) in self.dead.iter().take(10) {
            println!("                   dead batch {id} on {route}: {class} {err}");
        }
        let each = |f: &dyn Fn(&Service) -> String| {
            self.services
                .iter()
                .map(|s| format!("{} {}", s.name, f(s)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        println!(
            "  peak RSS         {}, soak {:.1} MiB",
            each(&|s| format!(
                "{:.1} MiB ({} starts)",
                s.peak_rss_kib as f64 / 1024.0,
                s.starts
            )),
            self.soak_rss_kib as f64 / 1024.0
        );
        println!(
            "  CPU              {} (user + system, all incarnations)",
            each(&|s| format!("{:.1} s", s.cpu_s()))
        );
        println!(
            "  SIGKILLs         {}",
            each(&|s| format!("{}", self.kills.iter().filter(|k| k.1 == s.name).count()))
        );
        for l in &self.extra {
            println!("  {l}");
        }
        for (i, d) in self.disks.iter().enumerate() {
            println!(
                "  disk episode {}   filled {:.1} MiB, {:.1} MiB had been free (tmpfs {} MiB, limits.min_free_bytes {} MiB)",
                i + 1,
                mib(d.filled_bytes),
                mib(d.free_before),
                self.fs_mib,
                self.min_free_bytes >> 20
            );
            let freed = d.freed_at_s.unwrap_or(f64::INFINITY);
            let during = self
                .acked
                .iter()
                .filter(|a| a.at_s >= d.full_at_s && a.at_s < freed)
                .count();
            let first_after = self
                .acked
                .iter()
                .map(|a| a.at_s)
                .filter(|&at| at >= freed)
                .fold(f64::INFINITY, f64::min);
            println!(
                "                   full from t={:.1}s to t={freed:.1}s: {during} events acked while full; first 2xx after the space came back {}",
                d.full_at_s,
                if first_after.is_finite() {
                    format!("{:.1} s later", first_after - freed)
                } else {
                    "never".into()
                }
            );
        }
        let windows: &[(&str, usize)] = if self.disks.is_empty() {
            &[("intake answers      ", 0)]
        } else {
            &[("during disk episodes", 1), ("outside them        ", 0)]
        };
        for &(label, i) in windows {
            println!(
                "  {label}: 503 with Retry-After {}, 503 without {}, refused {}, timeouts {}, other errors {}",
                n(&t.s503_retry_after[i]),
                n(&t.s503_bare[i]),
                n(&t.refused[i]),
                n(&t.timeouts[i]),
                n(&t.other_errors[i])
            );
        }
        let other = t
            .other_status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if !other.is_empty() {
            println!("  other intake statuses {other:?}");
        }
        println!(
            "  receiver         {} requests: 200 {}, 500 {}, slow {}, bad signatures {}, unreadable {}; refusing phases {}; seconds per mode {:?}",
            n(&c.requests),
            n(&c.answered_200),
            n(&c.answered_500),
            n(&c.answered_slow),
            n(&c.bad_signatures),
            n(&c.unreadable),
            n(&c.refused_phases),
            self.mode_time_s
                .iter()
                .map(|(k, v)| (*k, v.round() as i64))
                .collect::<BTreeMap<_, _>>()
        );
        if let Some(used) = self.fs_used {
            println!("  spool fs used    {:.1} MiB at the end", mib(used));
        }
        let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
        for (k, _, s) in self.issues {
            *kinds.entry(format!("{k}/{s}")).or_insert(0) += 1;
        }
        println!("  issues           {kinds:?}");
        let exits = self.exits();
        println!("  exited on their own: {}", exits.len());
        for (what, times) in group_exits(&exits) {
            println!("                   {what}: {times}");
        }
        println!(
            "  stops (SIGTERM)  {}",
            self.stops
                .iter()
                .map(|(name, st)| format!("{name} {}", st.as_deref().unwrap_or("not running")))
                .collect::<Vec<_>>()
                .join(", ")
        );
        match &self.check {
            None => println!("  hookspool check  ok"),
            Some(e) => println!("  hookspool check  FAILED: {e}"),
        }
        if self.late_senders > 0 {
            println!("  senders still busy at the end: {}", self.late_senders);
        }
    }

    fn exits(&self) -> Vec<(&'static str, &SelfExit)> {
        self.services
            .iter()
            .flat_map(|s| s.exits.iter().map(move |e| (s.name, e)))
            .collect()
    }

    /// Why the run fails, beyond the verdict's own reasons.
    pub fn failures(&self, fail_on_exit: bool) -> Vec<String> {
        let mut f = self.verdict.failures();
        if !self.drained {
            f.push(format!(
                "not drained within {}",
                humantime::format_duration(self.drain_timeout)
            ));
        }
        let bad = n(&self.receiver.bad_signatures);
        if bad > 0 {
            f.push(format!("{bad} deliveries with a bad signature"));
        }
        if self.check.is_some() {
            f.push("hookspool check fails on the spool at the end".into());
        }
        let exits = self.exits().len();
        if fail_on_exit && exits > 0 {
            f.push(format!("{exits} service exit(s) on their own"));
        }
        f
    }
}

/// Exits with the same service, status, disk flag and last log line, as one line each:
/// a crash loop is one finding, not a hundred.
fn group_exits(exits: &[(&'static str, &SelfExit)]) -> Vec<(String, String)> {
    let mut groups: Vec<(String, Vec<f64>)> = Vec::new();
    for (name, e) in exits {
        let last = e
            .log_tail
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        let what = format!(
            "{name} {}{}; last log line: {last}",
            e.status,
            if e.during_disk {
                " during a full-disk episode"
            } else {
                ""
            }
        );
        match groups.iter_mut().find(|(w, _)| *w == what) {
            Some((_, at)) => at.push(e.at_s),
            None => groups.push((what, vec![e.at_s])),
        }
    }
    groups
        .into_iter()
        .map(|(what, at)| {
            let times = match at.as_slice() {
                [one] => format!("once, at t={one:.1}s"),
                [first, .., last] => {
                    format!("{} times, t={first:.1}s to t={last:.1}s", at.len())
                }
                [] => String::new(),
            };
            (what, times)
        })
        .collect()
}
