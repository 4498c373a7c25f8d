//! `hookspool status`, `hookspool metrics` and `hookspool logs` (spec 11, 16): the
//! operator's read-only views of health. The documents come from `observe`; this file only
//! renders them.

use std::time::Duration;

use clap::Args;
use serde_json::{Value, json};

use super::{Ctx, EXIT_NOT_FOUND, Exit, relative, table};
use crate::observe::{metrics, status as obs};
use crate::sandbox::{self, ExitStatus};

/// journalctl output `hookspool logs` keeps (the rest is cut with a note).
const LOGS_OUTPUT_BYTES_MAX: usize = 16 * 1024 * 1024;
/// journalctl gets this long before it is killed.
const LOGS_TIMEOUT_S: u64 = 60;

#[derive(Debug, Args)]
pub struct LogsArgs {
    pub batch: i64,
    /// Only print the journalctl command (to run by hand, or on another host).
    #[arg(long)]
    pub print: bool,
}

pub fn status(ctx: &Ctx) -> Result<(), Exit> {
    let c = ctx.config_for_reading()?;
    let mut store = ctx.store(&c)?;
    let now = ctx.clock.now();
    let mut probe = obs::Probe::default();
    if let Err(e) = obs::prove_writable(&mut store, now) {
        probe.unwritable = Some(e.to_string());
    }
    let doc = obs::collect_with(&store, &c, now, &probe)?;
    if ctx.json {
        ctx.print_json(&doc);
    } else {
        render_status(ctx, &doc, now);
    }
    Ok(())
}

/// A destination's request rate: `5/s burst 1 (12 waited 3.4s)`, the waits when a live
/// dispatcher published them; `-` without a limit.
fn rate_text(v: &Value) -> String {
    let Some(per_s) = v["max_per_s"].as_f64() else {
        return "-".into();
    };
    let mut text = format!("{per_s}/s burst {}", v["burst"]);
    if let (Some(n), Some(s)) = (v["waits"].as_u64(), v["wait_s"].as_f64()) {
        text.push_str(&format!(" ({n} waited {s}s)"));
    }
    text
}

fn age_text(now: f64, v: &Value) -> String {
    v.as_f64()
        .map(|a| relative(now, now - a))
        .unwrap_or_else(|| "-".into())
}

fn bytes_text(v: &Value) -> String {
    let Some(b) = v.as_f64() else {
        return "-".into();
    };
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut x = b;
    let mut unit = 0;
    while x >= 1024.0 && unit + 1 < UNITS.len() {
        x /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{b:.0} B")
    } else {
        format!("{x:.1} {}", UNITS[unit])
    }
}

fn render_status(ctx: &Ctx, d: &Value, now: f64) {
    let degraded: Vec<&str> = d["degraded"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let head = if d["ok"].as_bool() == Some(true) {
        "ok"
    } else {
        "NOT OK"
    };
    if degraded.is_empty() {
        say!(ctx, "{head}");
    } else {
        say!(ctx, "{head} (degraded: {})", degraded.join(", "));
    }
    let disp = &d["dispatcher"];
    let dispatcher = match (disp["alive"].as_bool(), disp["heartbeat_age_s"].as_f64()) {
        (Some(true), _) => format!(
            "dispatcher alive (pid {}, heartbeat {})",
            disp["pid"],
            age_text(now, &disp["heartbeat_age_s"])
        ),
        (_, Some(_)) => format!(
            "dispatcher NOT alive (last heartbeat {})",
            age_text(now, &disp["heartbeat_age_s"])
        ),
        _ => "dispatcher never ran (no heartbeat)".into(),
    };
    say!(ctx, "schema {}  {dispatcher}", d["schema"]);
    // A PostgreSQL spool's processes, from any host (none on SQLite).
    if let Some(ps) = d["processes"].as_array().filter(|p| !p.is_empty()) {
        let list: Vec<String> = ps
            .iter()
            .map(|p| {
                let role = match (p["role"].as_str(), p["state"].as_str()) {
                    (Some(r), Some("active")) => format!("{r}, active dispatcher"),
                    (Some(r), Some(state)) => format!("{r}, {state}"),
                    (Some(r), None) => r.to_string(),
                    _ => "?".into(),
                };
                format!(
                    "{}:{} ({role}, connected {})",
                    p["host"].as_str().unwrap_or("?"),
                    p["pid"],
                    age_text(now, &p["connected_s"])
                )
            })
            .collect();
        say!(ctx, "processes  {}", list.join("  "));
    }
    say!(
        ctx,
        "spool {}  disk free {}  last enqueue {}",
        bytes_text(&d["spool_bytes"]),
        bytes_text(&d["disk_free_bytes"]),
        age_text(now, &d["spool"]["last_enqueue_age_s"])
    );
    let b = &d["batches"];
    say!(
        ctx,
        "batches  open {}  sealed {}  leased {}  retry {}  delivered {}  dead {}  dropped {}  quarantined {}",
        b["open"],
        b["sealed"],
        b["leased"],
        b["retry"],
        b["delivered"],
        b["dead"],
        b["dropped"],
        b["quarantined"]
    );
    say!(
        ctx,
        "oldest pending {}  issues open {}",
        age_text(now, &d["oldest_pending_age_s"]),
        d["issues_open"]
    );
    if let Some(dests) = d["destinations"].as_object()
        && !dests.is_empty()
    {
        // The RATE column only when a destination has a request rate (issue 35).
        let rated = dests.values().any(|v| v["rate"].is_object());
        let rows: Vec<Vec<String>> = dests
            .iter()
            .map(|(name, v)| {
                let mut row = vec![
                    name.clone(),
                    v["state"].as_str().unwrap_or("-").to_string(),
                    v["inflight"]
                        .as_i64()
                        .map(|n| n.to_string())
                        .unwrap_or_else(|| "-".into()),
                ];
                if rated {
                    row.push(rate_text(&v["rate"]));
                }
                row.push(age_text(now, &v["oldest_pending_age_s"]));
                row.push(v["last_error"].as_str().unwrap_or("").to_string());
                row
            })
            .collect();
        let mut head = vec!["DESTINATION", "STATE", "INFLIGHT"];
        if rated {
            head.push("RATE (WAITED)");
        }
        head.extend(["OLDEST PENDING", "LAST ERROR"]);
        ctx.say("");
        ctx.say(table(&head, &rows));
    }
    if let Some(sources) = d["sources"].as_object()
        && !sources.is_empty()
    {
        let rows: Vec<Vec<String>> = sources
            .iter()
            .map(|(name, v)| {
                vec![
                    name.clone(),
                    age_text(now, &v["last_event_age_s"]),
                    v["expected_every_s"]
                        .as_f64()
                        .map(|s| format!("{s}s"))
                        .unwrap_or_else(|| "-".into()),
                    match v["silent"].as_bool() {
                        Some(true) => "SILENT".into(),
                        Some(false) => "ok".into(),
                        None => "-".into(),
                    },
                ]
            })
            .collect();
        ctx.say("");
        ctx.say(table(
            &["SOURCE", "LAST EVENT", "EXPECTED EVERY", "LIVENESS"],
            &rows,
        ));
    }
    render_polls(ctx, d, now);
}

/// The poll clock of each poll instance (spec 14.4), as the JSON's `polls` has it (issue
/// 29: the text form left it out).
fn render_polls(ctx: &Ctx, d: &Value, now: f64) {
    let Some(polls) = d["polls"].as_object().filter(|p| !p.is_empty()) else {
        return;
    };
    let at = |v: &Value| {
        v.as_f64()
            .map(|t| relative(now, t))
            .unwrap_or_else(|| "never".into())
    };
    let rows: Vec<Vec<String>> = polls
        .iter()
        .map(|(name, p)| {
            vec![
                name.clone(),
                p["every_s"]
                    .as_f64()
                    .map(|s| format!("{s}s"))
                    .unwrap_or_else(|| "- (not configured)".into()),
                at(&p["next_at"]),
                at(&p["last_tick_at"]),
                at(&p["delivered_at"]),
                match p["pending"].as_bool() {
                    Some(true) => "yes".into(),
                    _ => "no".into(),
                },
                p["skipped"].to_string(),
                if p["stale"].as_bool() == Some(true) {
                    "STALE".into()
                } else {
                    "ok".into()
                },
            ]
        })
        .collect();
    ctx.say("");
    ctx.say(table(
        &[
            "POLL",
            "EVERY",
            "NEXT TICK",
            "LAST TICK",
            "DELIVERED",
            "PENDING",
            "TICKS SKIPPED",
            "STATE",
        ],
        &rows,
    ));
}

/// How long `metrics` waits for the intake's /metrics (connect, then the whole answer).
const INTAKE_METRICS_TIMEOUT_S: u64 = 2;
/// The most of the intake's /metrics page `metrics` reads.
const INTAKE_METRICS_BYTES_MAX: u64 = 16 * 1024 * 1024;

/// The intake's counters are per process (spec 11.2), so `metrics` asks the intake for its
/// /metrics page (the counters and the gauges together) at its configured addresses; when
/// none answers it prints the gauges from the tables and says where the counters are
/// served (issue 29: it printed the gauges alone, with no word of the rest).
pub fn metrics(ctx: &Ctx) -> Result<(), Exit> {
    let c = ctx.config_for_reading()?;
    let store = ctx.store(&c)?;
    let (text, from, missing) = match intake_metrics(&c.intake.listen) {
        Ok((addr, page)) => (
            format!(
                "# from the intake's GET /metrics on {addr}: its counters and the gauges\n{page}"
            ),
            Some(addr),
            None,
        ),
        Err(why) => {
            let note = format!(
                "# the intake's counters (hookspool_events_received_total, hookspool_requests_rejected_total, ...) are served by GET /metrics on {}; it did not answer ({why}), so these are the gauges alone\n",
                c.intake.listen.join(", ")
            );
            let gauges = metrics::render_gauges(&store, &c, ctx.clock.now())?;
            (format!("{note}{gauges}"), None, Some(why))
        }
    };
    if ctx.json {
        ctx.print_json(&json!({ "text": text, "intake": from, "intake_error": missing }));
    } else {
        ctx.write_raw(text.as_bytes())?;
    }
    Ok(())
}

/// GET /metrics from the first of `listen` that answers 200: (the address, the page).
fn intake_metrics(listen: &[String]) -> Result<(String, String), String> {
    use std::io::{Read, Write};
    let timeout = Duration::from_secs(INTAKE_METRICS_TIMEOUT_S);
    let request = b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    let mut why = Vec::new();
    for addr in listen {
        let answer = (|| -> std::io::Result<Vec<u8>> {
            let mut conn: Box<dyn ReadWrite> = match addr.strip_prefix("unix:") {
                Some(path) => {
                    let s = std::os::unix::net::UnixStream::connect(path)?;
                    s.set_read_timeout(Some(timeout))?;
                    s.set_write_timeout(Some(timeout))?;
                    Box::new(s)
                }
                None => {
                    let target = addr.replace("localhost:", "127.0.0.1:");
                    let sa: std::net::SocketAddr = target
                        .parse()
                        .map_err(|_| std::io::Error::other("not an address"))?;
                    let s = std::net::TcpStream::connect_timeout(&sa, timeout)?;
                    s.set_read_timeout(Some(timeout))?;
                    s.set_write_timeout(Some(timeout))?;
                    Box::new(s)
                }
            };
            conn.write_all(request)?;
            let mut out = Vec::new();
            conn.take(INTAKE_METRICS_BYTES_MAX).read_to_end(&mut out)?;
            Ok(out)
        })();
        match answer {
            Ok(bytes) => {
                let text = String::from_utf8_lossy(&bytes);
                let Some((head, body)) = text.split_once("\r\n\r\n") else {
                    why.push(format!("{addr}: not an HTTP answer"));
                    continue;
                };
                let status = head.lines().next().unwrap_or("");
                if status.split_whitespace().nth(1) != Some("200") {
                    why.push(format!("{addr}: {status}"));
                    continue;
                }
                return Ok((addr.clone(), body.to_string()));
            }
            Err(e) => why.push(format!("{addr}: {e}")),
        }
    }
    Err(why.join("; "))
}

trait ReadWrite: std::io::Read + std::io::Write {}
impl<T: std::io::Read + std::io::Write> ReadWrite for T {}

/// Runs journalctl itself (through the sandbox module's trusted-command door: it is the
/// operator's own tool on the operator's terminal), and always shows the command so it can
/// be run by hand on a host where this binary cannot reach the journal.
pub fn logs(ctx: &Ctx, a: LogsArgs) -> Result<(), Exit> {
    let mut argv: Vec<String> = vec![
        "journalctl".into(),
        format!("BATCH={}", a.batch),
        "--no-pager".into(),
    ];
    if ctx.json {
        argv.extend(["-o".into(), "json".into()]);
    } else {
        argv.extend(["-o".into(), "short-iso".into()]);
    }
    let by_hand = argv.join(" ");
    if a.print {
        if ctx.json {
            ctx.print_json(&json!({ "command": argv }));
        } else {
            ctx.say(&by_hand);
        }
        return Ok(());
    }
    if !ctx.json {
        say!(ctx, "$ {by_hand}");
    }
    let out = sandbox::run_trusted(
        &argv,
        Duration::from_secs(LOGS_TIMEOUT_S),
        LOGS_OUTPUT_BYTES_MAX,
        true,
    )
    .map_err(|e| {
        let why = if e.is_exec_failure() {
            "journalctl is not installed here".to_string()
        } else {
            format!("could not run journalctl ({e})")
        };
        Exit::new(
            EXIT_NOT_FOUND,
            format!("{why}; on the systemd host run: {by_hand}"),
        )
    })?;
    ctx.write_raw(&out.stdout)?;
    if out.stdout_overflow {
        say!(
            ctx,
            "(output cut at {LOGS_OUTPUT_BYTES_MAX} bytes; run the command by hand for the rest)"
        );
    }
    match out.status {
        ExitStatus::Code(0) => Ok(()),
        other => Err(Exit::new(
            EXIT_NOT_FOUND,
            format!("journalctl ended with {other:?}; run it by hand: {by_hand}"),
        )),
    }
}
