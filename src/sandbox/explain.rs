//! `hookspool check --explain-sandbox`: the effective policy in words.
//!
//! Owns the rendering only; it reuses `paths::grants` and `plan::predict`, so what it prints
//! is what `run` would enforce on this kernel. Must not create the tmp dir or spawn anything,
//! and prints variable names only, never their values.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

use super::env::INHERITED_VARS;
use super::{LandlockLevel, NetIsolation, Policy, paths, plan, seccomp};

/// The effective sandbox for `policy`, human-readable, one fact per line.
pub fn explain(policy: &Policy) -> String {
    let mut s = String::new();
    // Writing to a String cannot fail; the results are ignored for that reason.
    let _ = render(policy, &mut s);
    s
}

fn render(policy: &Policy, s: &mut String) -> std::fmt::Result {
    if let Err(e) = policy.validate() {
        writeln!(s, "INVALID: {e}")?;
    }
    let e = plan::predict(policy);
    writeln!(s, "program: {}", policy.argv.join(" "))?;
    match &policy.cwd {
        Some(cwd) => writeln!(s, "cwd: {}", cwd.display())?,
        None => writeln!(s, "cwd: the private tmp dir")?,
    }
    match policy.run_as {
        Some(r) => writeln!(s, "user: uid {} gid {}", r.uid, r.gid)?,
        None => writeln!(s, "user: the dispatcher's")?,
    }
    let mut names: Vec<&str> = INHERITED_VARS.to_vec();
    names.push("TMPDIR");
    names.extend(policy.env.iter().map(|(n, _)| n.as_str()));
    names.sort_unstable();
    names.dedup();
    writeln!(
        s,
        "environment: {} (values not shown; PATH, HOME, LANG from the dispatcher, TMPDIR the private tmp dir)",
        names.join(", ")
    )?;

    match paths::grants(policy, None) {
        Ok(grants) => {
            for g in &grants.summary {
                let mut line = format!("{}: {}", g.rights.label(), g.path.display());
                if g.missing {
                    line.push_str(" (missing, not granted)");
                } else if g.denied {
                    line.push_str(" (denied, not granted)");
                } else if !g.except.is_empty() {
                    let except: Vec<String> =
                        g.except.iter().map(|p| p.display().to_string()).collect();
                    let _ = write!(line, " (except {})", except.join(", "));
                }
                writeln!(s, "{line}")?;
            }
            writeln!(
                s,
                "read+write: a private tmp dir per run, removed afterwards"
            )?;
            let denied: Vec<String> = grants
                .denied
                .iter()
                .map(|p| p.display().to_string())
                .collect();
            writeln!(s, "no access: {}", denied.join(", "))?;
        }
        Err(err) => writeln!(s, "INVALID: {err}")?,
    }

    match e.net {
        NetIsolation::Shared => match &policy.tcp_connect_ports {
            Some(ports) if e.tcp_ports_limited => {
                writeln!(s, "network: on, TCP connect only to ports {ports:?}")?
            }
            Some(ports) => writeln!(
                s,
                "network: on; TCP port limit {ports:?} NOT enforced (Landlock ABI below 4)"
            )?,
            None => writeln!(s, "network: on")?,
        },
        NetIsolation::NewNetns => {
            writeln!(s, "network: off (new network namespace, no interfaces)")?
        }
        NetIsolation::UserAndNetns => writeln!(
            s,
            "network: off (new user and network namespace, no interfaces)"
        )?,
    }
    let left = policy.deadline.saturating_duration_since(Instant::now());
    writeln!(
        s,
        "limits: open files {}, processes {} beyond the uid's own{}, cpu {} s, core 0",
        policy.limits.open_files,
        policy.limits.processes,
        if e.nproc_enforced {
            ""
        } else {
            " (NOT enforced: the kernel exempts uid 0)"
        },
        policy.limits.cpu_s.unwrap_or(left.as_secs() + 1),
    )?;
    writeln!(
        s,
        "stdout: at most {} bytes (more fails the run); stderr: last {} bytes kept, never logged",
        policy.stdout_cap_bytes, policy.stderr_tail_bytes
    )?;
    writeln!(
        s,
        "deadline: {:.1} s from now; then SIGTERM to the process group, SIGKILL after 1 s",
        left.as_secs_f64()
    )?;
    let landlock = match e.landlock {
        LandlockLevel::Full { abi } => format!("enforced (kernel ABI {abi}, all rights of ABI 6)"),
        LandlockLevel::Partial { abi } => format!("partial (kernel ABI {abi} < 6)"),
        LandlockLevel::None => "NOT available on this kernel".into(),
    };
    writeln!(s, "landlock: {landlock}")?;
    if e.seccomp {
        writeln!(
            s,
            "seccomp: denies with EPERM: {}",
            seccomp::denied_names().join(", ")
        )?;
    } else {
        writeln!(s, "seccomp: NOT available on this kernel")?;
    }
    writeln!(
        s,
        "capabilities: {}; no_new_privs: on; session: own (setsid); inherited fds: closed",
        if e.caps_dropped {
            "all dropped"
        } else {
            "bounding set kept (no_new_privs blocks regaining)"
        }
    )?;
    writeln!(
        s,
        "required: {}{}",
        policy.required,
        if policy.required && !e.complete() {
            " (WILL REFUSE TO RUN on this kernel)"
        } else {
            ""
        }
    )?;
    if let Some(program) = policy.argv.first()
        && Path::new(program).is_relative()
    {
        writeln!(s, "note: argv[0] is relative to the cwd")?;
    }
    Ok(())
}
