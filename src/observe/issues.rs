//! Issues (spec 11.4): fingerprints, kinds, and the open / auto-resolve rules. The state
//! machine itself (open -> acked -> resolved, ignored; reopen clears alerted_at) is in
//! `store::issues`; this module decides *which* fingerprint opens or resolves *when*.
//!
//! Every function takes the caller's `&mut Store` and `now`, is one short transaction, and
//! logs one line when an issue opens, reopens or resolves (ids and names only). Alerts are
//! not sent here: `observe::alerts` picks up open issues that have not alerted.
//!
//! Must not: change delivery state, or put a body, a secret or a raw error text into
//! `last_error` (callers pass the scrubbed `Outcome::reason` / `last_error`).

use crate::config::Config;
use crate::store::{IssueChange, NewIssue, Store, StoreError};

/// The reason classes of a delivery issue (spec 11.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryReason {
    /// Connection refused, DNS, TLS: the destination cannot be reached.
    Unreachable,
    Http5xx,
    Timeout,
    /// A script exited non-zero (not 65/75 semantics: those are classes).
    ScriptExit,
    /// A counted failure on a non-script destination.
    Batch,
    /// A batch went dead at max_attempts.
    Exhausted,
    Permanent,
    Poison,
    /// Hermes answered ignored/coalesced: only an operator resolves it.
    Ignored,
    /// Only throttles (429, 503 with Retry-After) for longer than dispatch.throttle_alert_s.
    Throttled,
    /// An operator paused the destination (spec 4.2); resolved by `hookspool resume`.
    Paused,
}

impl DeliveryReason {
    pub const ALL: [DeliveryReason; 11] = [
        DeliveryReason::Unreachable,
        DeliveryReason::Http5xx,
        DeliveryReason::Timeout,
        DeliveryReason::ScriptExit,
        DeliveryReason::Batch,
        DeliveryReason::Exhausted,
        DeliveryReason::Permanent,
        DeliveryReason::Poison,
        DeliveryReason::Ignored,
        DeliveryReason::Throttled,
        DeliveryReason::Paused,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryReason::Unreachable => "unreachable",
            DeliveryReason::Http5xx => "http_5xx",
            DeliveryReason::Timeout => "timeout",
            DeliveryReason::ScriptExit => "script_exit",
            DeliveryReason::Batch => "batch",
            DeliveryReason::Exhausted => "exhausted",
            DeliveryReason::Permanent => "permanent",
            DeliveryReason::Poison => "poison",
            DeliveryReason::Ignored => "ignored",
            DeliveryReason::Throttled => "throttled",
            DeliveryReason::Paused => "paused",
        }
    }

    /// Resolved by the next successful attempt on the destination (spec 11.4); the others
    /// wait for their dead batches to be replayed or dropped, or (ignored) for an operator.
    pub fn resolves_on_success(self) -> bool {
        match self {
            DeliveryReason::Unreachable
            | DeliveryReason::Http5xx
            | DeliveryReason::Timeout
            | DeliveryReason::ScriptExit
            | DeliveryReason::Batch
            | DeliveryReason::Throttled => true,
            DeliveryReason::Exhausted
            | DeliveryReason::Permanent
            | DeliveryReason::Poison
            | DeliveryReason::Ignored
            | DeliveryReason::Paused => false,
        }
    }

    /// Resolved once the destination has no dead batch left.
    pub fn resolves_when_dead_cleared(self) -> bool {
        match self {
            DeliveryReason::Exhausted | DeliveryReason::Permanent | DeliveryReason::Poison => true,
            DeliveryReason::Unreachable
            | DeliveryReason::Http5xx
            | DeliveryReason::Timeout
            | DeliveryReason::ScriptExit
            | DeliveryReason::Batch
            | DeliveryReason::Ignored
            | DeliveryReason::Throttled
            | DeliveryReason::Paused => false,
        }
    }
}

pub fn delivery_fingerprint(destination: &str, reason: DeliveryReason) -> String {
    format!("delivery:{destination}:{}", reason.as_str())
}

/// Open (or count, or reopen) the issue `fingerprint`. The general entry point; the helpers
/// below cover each rule of spec 11.4.
#[allow(clippy::too_many_arguments)]
pub fn open_or_bump(
    store: &mut Store,
    fingerprint: &str,
    kind: &str,
    destination: Option<&str>,
    route: Option<&str>,
    sample_batch_id: Option<i64>,
    last_error: Option<&str>,
    now: f64,
) -> Result<IssueChange, StoreError> {
    let change = store.issue_open_or_bump(
        &NewIssue {
            fingerprint: fingerprint.to_string(),
            kind: kind.to_string(),
            destination: destination.map(str::to_string),
            route: route.map(str::to_string),
            sample_batch_id,
            last_error: last_error.map(str::to_string),
        },
        now,
    )?;
    match change {
        IssueChange::Opened(id) | IssueChange::Reopened(id) => tracing::warn!(
            destination,
            route,
            batch = sample_batch_id,
            reason = kind,
            "issue {id} {}: {fingerprint}",
            if matches!(change, IssueChange::Opened(_)) {
                "opened"
            } else {
                "reopened"
            }
        ),
        IssueChange::Bumped(_) | IssueChange::Ignored(_) => {}
    }
    Ok(change)
}

/// Resolve `fingerprint` if it is open or acked.
pub fn resolve(store: &mut Store, fingerprint: &str, now: f64) -> Result<bool, StoreError> {
    let done = store.issue_resolve(fingerprint, now)?;
    if done {
        tracing::info!("issue resolved: {fingerprint}");
    }
    Ok(done)
}

/// A delivery failure that opens an issue: a batch going dead, a breaker trip, a counted
/// failure streak >= 3, a Hermes ignored answer. The dispatcher picks the reason class.
pub fn delivery_failed(
    store: &mut Store,
    destination: &str,
    route: Option<&str>,
    reason: DeliveryReason,
    batch_id: Option<i64>,
    last_error: Option<&str>,
    now: f64,
) -> Result<IssueChange, StoreError> {
    open_or_bump(
        store,
        &delivery_fingerprint(destination, reason),
        "delivery",
        Some(destination),
        route,
        batch_id,
        last_error,
        now,
    )
}

/// A config-class outcome (401/403/404, an unreadable secret): `config:delivery:<dest>`.
pub fn delivery_config_failed(
    store: &mut Store,
    destination: &str,
    route: Option<&str>,
    batch_id: Option<i64>,
    last_error: Option<&str>,
    now: f64,
) -> Result<IssueChange, StoreError> {
    open_or_bump(
        store,
        &format!("config:delivery:{destination}"),
        "config",
        Some(destination),
        route,
        batch_id,
        last_error,
        now,
    )
}

/// A successful attempt on `destination`: resolves its transient delivery issues and its
/// config:delivery issue. Returns the fingerprints resolved.
pub fn attempt_succeeded(
    store: &mut Store,
    destination: &str,
    now: f64,
) -> Result<Vec<String>, StoreError> {
    let mut done = Vec::new();
    let candidates = DeliveryReason::ALL
        .iter()
        .filter(|r| r.resolves_on_success())
        .map(|r| delivery_fingerprint(destination, *r))
        .chain(std::iter::once(format!("config:delivery:{destination}")));
    for fp in candidates {
        if resolve(store, &fp, now)? {
            done.push(fp);
        }
    }
    Ok(done)
}

/// An operator paused `destination` (spec 4.2: "operator pauses open/update a delivery
/// issue"): `delivery:<destination>:paused`, naming who paused it and why.
pub fn destination_paused(
    store: &mut Store,
    destination: &str,
    by: &str,
    reason: Option<&str>,
    now: f64,
) -> Result<IssueChange, StoreError> {
    let text = match reason {
        Some(r) => format!("paused by {by}: {r}; hookspool resume {destination} delivers again"),
        None => format!("paused by {by}; hookspool resume {destination} delivers again"),
    };
    delivery_failed(
        store,
        destination,
        None,
        DeliveryReason::Paused,
        None,
        Some(&text),
        now,
    )
}

/// `hookspool resume`: the pause issue resolves.
pub fn destination_resumed(
    store: &mut Store,
    destination: &str,
    now: f64,
) -> Result<bool, StoreError> {
    resolve(
        store,
        &delivery_fingerprint(destination, DeliveryReason::Paused),
        now,
    )
}

/// After dead batches were replayed or dropped: when `destination` has none left, its
/// exhausted / permanent / poison issues resolve.
pub fn dead_batches_cleared(
    store: &mut Store,
    destination: &str,
    now: f64,
) -> Result<Vec<String>, StoreError> {
    let mut done = Vec::new();
    if store.dead_count(destination)? > 0 {
        return Ok(done);
    }
    for r in DeliveryReason::ALL
        .iter()
        .filter(|r| r.resolves_when_dead_cleared())
    {
        let fp = delivery_fingerprint(destination, *r);
        if resolve(store, &fp, now)? {
            done.push(fp);
        }
    }
    Ok(done)
}

/// The intake quarantined a request of `source` (spec 9): `config:plugin:<source>`.
pub fn quarantined(
    store: &mut Store,
    source: &str,
    batch_id: i64,
    error_class: &str,
    now: f64,
) -> Result<IssueChange, StoreError> {
    open_or_bump(
        store,
        &format!("config:plugin:{source}"),
        "config",
        None,
        Some(source),
        Some(batch_id),
        Some(&format!("plugin error: {error_class}")),
        now,
    )
}

/// After quarantine batches were reclassified or dropped: resolves config:plugin:<source>
/// when none of its quarantine batches is left.
pub fn quarantine_cleared(store: &mut Store, source: &str, now: f64) -> Result<bool, StoreError> {
    if store.quarantined_count_for(source)? > 0 {
        return Ok(false);
    }
    resolve(store, &format!("config:plugin:{source}"), now)
}

/// A config reload: `Err(text)` opens config:file (text = the problems, which name keys,
/// never values); `Ok` resolves it.
pub fn config_reload(
    store: &mut Store,
    outcome: Result<(), &str>,
    now: f64,
) -> Result<(), StoreError> {
    match outcome {
        Ok(()) => {
            resolve(store, "config:file", now)?;
        }
        Err(text) => {
            open_or_bump(
                store,
                "config:file",
                "config",
                None,
                None,
                None,
                Some(text),
                now,
            )?;
        }
    }
    Ok(())
}

/// Where the config's secret files are (issue 28): `config:secrets` opens while a secret
/// file is readable by group or others, or a reference links outside the config's secret
/// directories (`found` = (key, advice), paths and modes only), and resolves when none is.
pub fn secret_exposure(
    store: &mut Store,
    found: &[(String, String)],
    now: f64,
) -> Result<(), StoreError> {
    if found.is_empty() {
        resolve(store, "config:secrets", now)?;
        return Ok(());
    }
    let text: Vec<String> = found.iter().map(|(k, m)| format!("{k}: {m}")).collect();
    open_or_bump(
        store,
        "config:secrets",
        "config",
        None,
        None,
        None,
        Some(&text.join("; ")),
        now,
    )?;
    Ok(())
}

/// A backpressure limit engaged or cleared (spec 9): `spool:<limit>`, e.g.
/// `spool:min_free_bytes` or `spool:full`. The intake calls it when a limit changes state.
pub fn spool_limit(
    store: &mut Store,
    limit: &str,
    engaged: bool,
    detail: Option<&str>,
    now: f64,
) -> Result<(), StoreError> {
    let fp = format!("spool:{limit}");
    if engaged {
        open_or_bump(store, &fp, "spool", None, None, None, detail, now)?;
    } else {
        resolve(store, &fp, now)?;
    }
    Ok(())
}

/// The free-space limit checked from the dispatcher's maintenance tick: opens or resolves
/// `spool:min_free_bytes`. Returns whether the limit is engaged. On PostgreSQL never: this
/// host's disk holds nothing of the spool (`intake::disk`), and one left open by an SQLite
/// spool copied into PostgreSQL resolves.
pub fn check_disk(store: &mut Store, cfg: &Config, now: f64) -> Result<bool, StoreError> {
    if store.is_postgres() {
        spool_limit(store, "min_free_bytes", false, None, now)?;
        return Ok(false);
    }
    let Some(free) = crate::sys::fs::spool_free_bytes(&cfg.db) else {
        return Ok(false);
    };
    let engaged = free < cfg.min_free_bytes as u64;
    let detail = format!(
        "{free} bytes free, below limits.min_free_bytes {}",
        cfg.min_free_bytes
    );
    spool_limit(store, "min_free_bytes", engaged, Some(&detail), now)?;
    Ok(engaged)
}

/// The issue that says no dispatcher has been active for a while (issue 33): on a
/// PostgreSQL spool with standbys, the active dispatcher's heartbeat stopped while its
/// session still holds the dispatcher lock (a hung or frozen process, a host that stopped
/// answering before PostgreSQL noticed), so no standby can take over. Kind `spool`: the
/// issues table's kinds are a CHECK in both schemas, and this is the spool's condition.
pub const NO_ACTIVE_DISPATCHER: &str = "spool:no_active_dispatcher";

/// Heartbeats (`dispatch.heartbeat_s`) missed before no dispatcher counts as active: three,
/// so one slow tick is not an outage; at the default 10 s heartbeat this is status's
/// `HEARTBEAT_STALE_S`.
pub const DISPATCHER_INACTIVE_HEARTBEATS: f64 = 3.0;

/// How old the spool's dispatcher heartbeat is when it is older than
/// `DISPATCHER_INACTIVE_HEARTBEATS` heartbeats; `None` while it is fresh, and when no
/// dispatcher has ever written one (nothing was active to go missing). `now` is the
/// reader's clock: hosts' clocks must agree to well within a heartbeat (NTP).
pub fn dispatcher_inactive_for(
    store: &Store,
    heartbeat_s: f64,
    now: f64,
) -> Result<Option<f64>, StoreError> {
    Ok(store
        .meta_time("dispatcher_heartbeat_at")?
        .map(|t| now - t)
        .filter(|age| *age > DISPATCHER_INACTIVE_HEARTBEATS * heartbeat_s))
}

/// Open `spool:no_active_dispatcher`: the heartbeat was seen `age_s` old.
fn no_active_dispatcher(
    store: &mut Store,
    age_s: f64,
    now: f64,
) -> Result<IssueChange, StoreError> {
    open_or_bump(
        store,
        NO_ACTIVE_DISPATCHER,
        "spool",
        None,
        None,
        None,
        Some(&format!("no dispatcher heartbeat for {age_s:.1} s")),
        now,
    )
}

/// What a standby dispatcher and the intake do periodically: when the heartbeat is stale
/// (`dispatcher_inactive_for`) and the issue is not open (never opened, or resolved by a
/// heartbeat since), open it; open, acked or ignored it is left alone, so a long outage
/// costs one read per look, not a write. Returns the heartbeat's age when it is stale.
pub fn check_dispatcher_heartbeat(
    store: &mut Store,
    heartbeat_s: f64,
    now: f64,
) -> Result<Option<f64>, StoreError> {
    let Some(age) = dispatcher_inactive_for(store, heartbeat_s, now)? else {
        return Ok(None);
    };
    let state = store
        .issue_by_fingerprint(NO_ACTIVE_DISPATCHER)?
        .map(|i| i.state);
    if !matches!(state.as_deref(), Some("open" | "acked" | "ignored")) {
        no_active_dispatcher(store, age, now)?;
    }
    Ok(Some(age))
}

/// A dispatcher is active (it took the lock, or it wrote its heartbeat): resolves
/// `spool:no_active_dispatcher`. A read when the issue is not open.
pub fn dispatcher_active(store: &mut Store, now: f64) -> Result<bool, StoreError> {
    resolve(store, NO_ACTIVE_DISPATCHER, now)
}

fn expect_since_key(source: &str) -> String {
    format!("source:{source}:expect_since")
}

/// No event for more than `expect_every_s`, counted from the last event, or from when the
/// expectation was first watched (`check_sources`) for a source that never sent one.
pub fn source_is_silent(
    store: &Store,
    source: &str,
    expect_every_s: f64,
    now: f64,
) -> Result<bool, StoreError> {
    if expect_every_s <= 0.0 {
        return Ok(false);
    }
    let last = store.meta_time(&format!("source:{source}:last_event_at"))?;
    let since = store.meta_time(&expect_since_key(source))?;
    let from = match (last, since) {
        (Some(a), Some(b)) => a.max(b),
        (Some(a), None) | (None, Some(a)) => a,
        (None, None) => return Ok(false),
    };
    Ok(now - from > expect_every_s)
}

/// The dispatcher's maintenance tick: for every source with expect_every_s, open
/// `source_silent:<source>` when it is silent and resolve it when an event has arrived.
/// Returns the sources that are silent now.
pub fn check_sources(store: &mut Store, cfg: &Config, now: f64) -> Result<Vec<String>, StoreError> {
    let mut silent = Vec::new();
    for (name, s) in &cfg.sources {
        if s.expect_every_s <= 0.0 {
            continue;
        }
        store.meta_time_init(&expect_since_key(name), now)?;
        let fp = format!("source_silent:{name}");
        if source_is_silent(store, name, s.expect_every_s, now)? {
            let text = format!(
                "no event for more than expect_every_s = {}",
                s.expect_every_s
            );
            open_or_bump(
                store,
                &fp,
                "source_silent",
                None,
                Some(name),
                None,
                Some(&text),
                now,
            )?;
            silent.push(name.clone());
        } else {
            resolve(store, &fp, now)?;
        }
    }
    Ok(silent)
}

/// A poll instance is stale after this many of its periods without a delivered tick
/// (spec 11.4).
pub const POLL_STALE_PERIODS: f64 = 3.0;

/// The stale rule (spec 14.4, 11.4): no delivered tick for more than 3 x every_s, counted
/// from the last delivery or, before the first, from when the instance was first scheduled.
/// `status` and the maintenance tick both decide with this.
pub fn poll_is_stale(row: &crate::store::PollRow, every_s: f64, now: f64) -> bool {
    let since = row.delivered_at.unwrap_or(row.created_at);
    now - since > POLL_STALE_PERIODS * every_s
}

/// The dispatcher's maintenance tick: for every configured poll instance with a row, open
/// `poll:<instance>:stale` when it is stale and resolve it once a tick was delivered since.
/// Returns the instances that are stale now.
pub fn check_polls(store: &mut Store, cfg: &Config, now: f64) -> Result<Vec<String>, StoreError> {
    let mut stale = Vec::new();
    for row in store.polls()? {
        let Some(p) = cfg.sources.get(&row.instance).and_then(|s| s.poll) else {
            continue;
        };
        let is_stale = poll_is_stale(&row, p.every_s, now);
        poll_stale(store, &row.instance, is_stale, now)?;
        if is_stale {
            stale.push(row.instance);
        }
    }
    Ok(stale)
}

/// A poll instance (spec 14.4) with no delivered tick for more than 3 x every_s:
/// `poll:<instance>:stale` (kind source_silent); resolved by the next delivered tick.
pub fn poll_stale(
    store: &mut Store,
    instance: &str,
    stale: bool,
    now: f64,
) -> Result<(), StoreError> {
    let fp = format!("poll:{instance}:stale");
    if stale {
        open_or_bump(
            store,
            &fp,
            "source_silent",
            None,
            Some(instance),
            None,
            Some("no delivered tick for more than 3 x every_s"),
            now,
        )?;
    } else {
        resolve(store, &fp, now)?;
    }
    Ok(())
}
