//! Poll sources in config (spec 14.4): `[sources.<i>]` with `type = "poll"`, which only a
//! poll bobbin's expansion writes. Such a source has no URL and no plugin: it is the route
//! and the schedule of the dispatcher's durable clock (`dispatch::polls`), and its events are
//! the clock's ticks.
//!
//! Owns: [`PollSchedule`], the keys a poll source may have ([`POLL_SOURCE_KEYS`]) and their
//! bounds, and the refusal of `every_s`/`jitter_s` on any other source. The "only from an
//! expansion" rule is `expansion::poll_only_from_expansion`.
//!
//! Must not: build a source plugin for it (the intake serves none, so `/hooks/<i>` is 404).

use super::raw::RawSource;
use super::{Problem, problem};
use crate::bobbins::manifest::{POLL_EVERY_S_MIN, POLL_JITTER_S_MAX};

/// The source type a poll bobbin's expansion writes.
pub const POLL_KIND: &str = crate::bobbins::expand::POLL_KIND;

/// The only span a poll source has: a tick is delivered at once.
pub const POLL_SPAN: &str = "immediate";

/// The keys a poll source may have; anything else is refused with this list.
pub const POLL_SOURCE_KEYS: &[&str] = &["type", "every_s", "jitter_s", "span", "action", "secrets"];

/// When a poll instance is due: every `every_s`, plus up to `jitter_s` at random.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PollSchedule {
    pub every_s: f64,
    pub jitter_s: f64,
}

/// The schedule of a `type = "poll"` source, with every key it must not have reported.
pub(super) fn schedule(errors: &mut Vec<Problem>, name: &str, s: &RawSource) -> PollSchedule {
    let prefix = format!("sources.{name}");
    let mut extra: Vec<&str> = Vec::new();
    for (present, key) in [
        (s.quiet_s.is_some(), "quiet_s"),
        (s.max_s.is_some(), "max_s"),
        (s.max_events.is_some(), "max_events"),
        (s.max_bytes.is_some(), "max_bytes"),
        (s.expect_every_s.is_some(), "expect_every_s"),
        (s.dedup_window_s.is_some(), "dedup_window_s"),
        (s.max_body_bytes.is_some(), "max_body_bytes"),
        (s.keep_headers.is_some(), "keep_headers"),
        (s.store_raw.is_some(), "store_raw"),
        (s.event_header.is_some(), "event_header"),
    ] {
        if present {
            extra.push(key);
        }
    }
    extra.extend(s.options.keys().map(String::as_str));
    for k in extra {
        errors.push(problem(
            format!("{prefix}.{k}"),
            format!(
                "a poll source has no sender and no window, so {k} does not apply; remove it (a poll source's keys: {})",
                POLL_SOURCE_KEYS.join(", ")
            ),
        ));
    }
    if let Some(span) = &s.span
        && span != POLL_SPAN
    {
        errors.push(problem(
            format!("{prefix}.span"),
            format!("a tick is delivered at once; write span = \"{POLL_SPAN}\" or remove it"),
        ));
    }
    let every_s = bounded(
        errors,
        &prefix,
        "every_s",
        s.every_s,
        POLL_EVERY_S_MIN,
        None,
    );
    let jitter_s = match s.jitter_s {
        None => crate::bobbins::manifest::default_jitter_s(every_s.unwrap_or(POLL_EVERY_S_MIN)),
        Some(_) => bounded(
            errors,
            &prefix,
            "jitter_s",
            s.jitter_s,
            0,
            Some(POLL_JITTER_S_MAX),
        )
        .unwrap_or(0),
    };
    if s.every_s.is_none() {
        errors.push(problem(
            format!("{prefix}.every_s"),
            format!(
                "required for a poll source; write every_s = 900 (at least {POLL_EVERY_S_MIN})"
            ),
        ));
    }
    PollSchedule {
        every_s: every_s.unwrap_or(POLL_EVERY_S_MIN) as f64,
        jitter_s: jitter_s as f64,
    }
}

fn bounded(
    errors: &mut Vec<Problem>,
    prefix: &str,
    key: &str,
    v: Option<i64>,
    lo: u64,
    hi: Option<u64>,
) -> Option<u64> {
    let v = v?;
    let fits = v >= lo as i64 && hi.is_none_or(|h| v <= h as i64);
    if fits {
        return Some(v as u64);
    }
    let range = match hi {
        Some(h) => format!("from {lo} to {h}"),
        None => format!("of at least {lo}"),
    };
    errors.push(problem(
        format!("{prefix}.{key}"),
        format!(
            "a whole number of seconds {range}; write e.g. {key} = {}",
            lo.max(90)
        ),
    ));
    None
}

/// `every_s` or `jitter_s` on a source that is not a poll source.
pub(super) fn refuse_schedule_keys(errors: &mut Vec<Problem>, name: &str, s: &RawSource) {
    for (present, key) in [
        (s.every_s.is_some(), "every_s"),
        (s.jitter_s.is_some(), "jitter_s"),
    ] {
        if present {
            errors.push(problem(
                format!("sources.{name}.{key}"),
                "only a poll source (a poll bobbin's instance) has a schedule; remove it",
            ));
        }
    }
}
