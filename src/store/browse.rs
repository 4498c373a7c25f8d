//! Reads for the management API (issue 31) beyond the CLI's: events by dedup id, the spans
//! a backlog series is drawn from, per-source counts, per-destination latency and last
//! error. Nothing here writes; each query is indexed (dedup's key, events_source,
//! dedup_seen, attempts_started, batches_retention and batches_heads) or bounded by a
//! window the caller gives, so an open dashboard stays cheap on a large spool.

use super::query::EventRow;
use super::{Result, Store};

/// The most attempt durations one destination's percentiles are computed from.
pub const LATENCY_SAMPLE_MAX: i64 = 50_000;

/// One batch's life for the backlog series: its destination, when its first event came,
/// and when it finished (delivered, dropped, or its last attempt for a dead one; `None`
/// while unfinished).
#[derive(Debug, Clone, PartialEq)]
pub struct BacklogSpan {
    pub destination: String,
    pub first_at: f64,
    pub done_at: Option<f64>,
}

/// A destination's most recent failed attempt.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct LastError {
    pub at: f64,
    pub batch_id: i64,
    pub klass: Option<String>,
    pub status: Option<i64>,
    pub error: Option<String>,
}

impl Store {
    /// The event a source recorded under `dedup_id` (within the source's dedup window,
    /// while the dedup row lasts), with its batch; no payload.
    pub fn event_by_dedup(&self, source: &str, dedup_id: &str) -> Result<Option<EventRow>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT e.id, e.batch_id, e.source, e.route, e.event_type, e.dedup_id, e.received_at,
                    e.size, e.excluded_at
             FROM dedup d JOIN events e ON e.id = d.event_id
             WHERE d.source = ?1 AND d.dedup_id = ?2",
        )?;
        let mut rows = stmt.query_map([source, dedup_id], |r| EventRow::from_row(r, false))?;
        Ok(rows.next().transpose()?)
    }

    /// How many duplicates of `dedup_id` the source answered (0 when unknown).
    pub fn dedup_repeats(&self, source: &str, dedup_id: &str) -> Result<i64> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT dup_count FROM dedup WHERE source = ?1 AND dedup_id = ?2")?;
        let mut rows = stmt.query_map([source, dedup_id], |r| r.get::<_, i64>(0))?;
        Ok(rows.next().transpose()?.unwrap_or(0))
    }

    /// Every batch that was unfinished at some moment at or after `from`, quarantine
    /// excluded: the unfinished ones, and those delivered, dropped or dead since.
    pub fn backlog_spans(&self, from: f64) -> Result<Vec<BacklogSpan>> {
        let mut stmt = self.conn.prepare(
            "SELECT destination, first_at, NULL FROM batches
                 WHERE finished = 0 AND destination != 'quarantine'
             UNION ALL
             SELECT destination, first_at, delivered_at FROM batches
                 WHERE state = 'delivered' AND delivered_at >= ?1 AND destination != 'quarantine'
             UNION ALL
             SELECT destination, first_at, dropped_at FROM batches
                 WHERE state = 'dropped' AND dropped_at >= ?1 AND destination != 'quarantine'
             UNION ALL
             SELECT b.destination, b.first_at,
                    (SELECT max(coalesce(a.finished_at, a.started_at)) FROM attempts a
                     WHERE a.batch_id = b.id) AS died
                 FROM batches b
                 WHERE b.state = 'dead' AND b.destination != 'quarantine'
                   AND coalesce(died, b.first_at) >= ?1",
        )?;
        let rows = stmt
            .query_map([from], |r| {
                Ok(BacklogSpan {
                    destination: r.get(0)?,
                    first_at: r.get(1)?,
                    done_at: r.get(2)?,
                })
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    /// Events a source committed at or after `since` (each once: duplicates are not
    /// events).
    pub fn source_events_since(&self, source: &str, since: f64) -> Result<i64> {
        Ok(self.conn.query_row(
            "SELECT count(*) FROM events WHERE source = ?1 AND received_at >= ?2",
            rusqlite::params![source, since],
            |r| r.get(0),
        )?)
    }

    /// A source's committed events in `buckets` windows of `step_s` from `from`.
    pub fn source_events_per_bucket(
        &self,
        source: &str,
        from: f64,
        step_s: f64,
        buckets: usize,
    ) -> Result<Vec<i64>> {
        let mut out = vec![0; buckets];
        let mut stmt = self.conn.prepare_cached(
            "SELECT CAST((received_at - ?2) / ?3 AS INTEGER), count(*) FROM events
             WHERE source = ?1 AND received_at >= ?2 GROUP BY 1",
        )?;
        let rows = stmt.query_map(rusqlite::params![source, from, step_s], |r| {
            Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?))
        })?;
        for row in rows {
            let (i, n) = row?;
            if let Some(slot) = usize::try_from(i).ok().and_then(|i| out.get_mut(i)) {
                *slot += n;
            }
        }
        Ok(out)
    }

    /// Duplicates a source answered for ids first seen at or after `since`.
    pub fn source_duplicates_since(&self, source: &str, since: f64) -> Result<i64> {
        Ok(self.conn.query_row(
            "SELECT coalesce(sum(dup_count), 0) FROM dedup WHERE source = ?1 AND seen_at >= ?2",
            rusqlite::params![source, since],
            |r| r.get(0),
        )?)
    }

    /// Durations (ms) of a destination's finished attempts started at or after `since`,
    /// ascending: the newest `LATENCY_SAMPLE_MAX` of them.
    pub fn attempt_latencies_since(&self, destination: &str, since: f64) -> Result<Vec<i64>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT duration_ms FROM (
                 SELECT duration_ms FROM attempts
                 WHERE started_at >= ?2 AND destination = ?1 AND duration_ms IS NOT NULL
                 ORDER BY started_at DESC LIMIT ?3)
             ORDER BY duration_ms",
        )?;
        let rows = stmt
            .query_map(
                rusqlite::params![destination, since, LATENCY_SAMPLE_MAX],
                |r| r.get(0),
            )?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    /// A destination's most recent failed attempt started at or after `since`.
    pub fn last_error_since(&self, destination: &str, since: f64) -> Result<Option<LastError>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT coalesce(finished_at, started_at), batch_id, klass, status, error
             FROM attempts
             WHERE started_at >= ?2 AND destination = ?1 AND outcome IS NOT NULL AND outcome != 'ok'
             ORDER BY started_at DESC LIMIT 1",
        )?;
        let mut rows = stmt.query_map(rusqlite::params![destination, since], |r| {
            Ok(LastError {
                at: r.get(0)?,
                batch_id: r.get(1)?,
                klass: r.get(2)?,
                status: r.get(3)?,
                error: r.get(4)?,
            })
        })?;
        Ok(rows.next().transpose()?)
    }
}

/// Where a live feed has read up to: the last event id, the last issue id, the newest
/// sealed_at and finished_at it reported (with the ids reported at exactly that moment).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FeedCursor {
    pub event_id: i64,
    pub issue_id: i64,
    pub sealed_at: f64,
    pub sealed_ids: Vec<i64>,
    pub finished_at: f64,
    pub finished_ids: Vec<i64>,
}

impl FeedCursor {
    /// A compact text form for an SSE `id:` (a reconnecting client sends it back as
    /// Last-Event-ID): `event_issue_sealed_finished`. The ids reported at exactly the two
    /// moments are not in it, so a resumed stream may repeat those, never skip one.
    pub fn to_id(&self) -> String {
        format!(
            "{}_{}_{}_{}",
            self.event_id, self.issue_id, self.sealed_at, self.finished_at
        )
    }

    pub fn parse_id(s: &str) -> Option<FeedCursor> {
        let p: Vec<&str> = s.trim().split('_').collect();
        let [e, i, sealed, finished] = p.as_slice() else {
            return None;
        };
        let (sealed_at, finished_at) = (sealed.parse::<f64>().ok()?, finished.parse::<f64>().ok()?);
        if !sealed_at.is_finite() || !finished_at.is_finite() {
            return None;
        }
        Some(FeedCursor {
            event_id: e.parse().ok()?,
            issue_id: i.parse().ok()?,
            sealed_at,
            sealed_ids: Vec::new(),
            finished_at,
            finished_ids: Vec::new(),
        })
    }
}

/// One thing that happened, for the live stream.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum FeedItem {
    EventQueued {
        event: i64,
        batch: i64,
        source: String,
        route: String,
        event_type: String,
        at: f64,
    },
    BatchSealed {
        batch: i64,
        destination: String,
        count: i64,
        at: f64,
    },
    AttemptFinished {
        attempt: i64,
        batch: i64,
        destination: String,
        outcome: Option<String>,
        klass: Option<String>,
        status: Option<i64>,
        duration_ms: Option<i64>,
        at: f64,
    },
    IssueOpened {
        issue: i64,
        fingerprint: String,
        kind: String,
        at: f64,
    },
}

/// The most items of each kind one feed read returns (the next read goes on from there).
pub const FEED_READ_MAX: i64 = 500;
/// How far back before the cursor an attempt may have started and still be reported as it
/// finishes (an attempt longer than this is reported only if its start is in the window).
pub const FEED_ATTEMPT_LOOKBACK_S: f64 = 3_600.0;

impl Store {
    /// A feed cursor at the spool's present: what happened before it is not reported.
    pub fn feed_now(&self, now: f64) -> Result<FeedCursor> {
        let (e, i): (i64, i64) = self.conn.query_row(
            "SELECT (SELECT coalesce(max(id), 0) FROM events),
                    (SELECT coalesce(max(id), 0) FROM issues)",
            (),
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        Ok(FeedCursor {
            event_id: e,
            issue_id: i,
            sealed_at: now,
            sealed_ids: Vec::new(),
            finished_at: now,
            finished_ids: Vec::new(),
        })
    }

    /// What happened after `cur`, in kind order (events, seals, attempts, issues), and the
    /// cursor after it. Seals are found among unfinished batches (a batch sealed and
    /// finished between two reads shows as its attempt only).
    pub fn feed_since(&self, cur: &FeedCursor) -> Result<(Vec<FeedItem>, FeedCursor)> {
        let mut next = cur.clone();
        let mut out = Vec::new();
        let mut stmt = self.conn.prepare_cached(
            "SELECT id, batch_id, source, route, event_type, received_at FROM events
             WHERE id > ?1 ORDER BY id LIMIT ?2",
        )?;
        let rows = stmt.query_map(rusqlite::params![cur.event_id, FEED_READ_MAX], |r| {
            Ok(FeedItem::EventQueued {
                event: r.get(0)?,
                batch: r.get(1)?,
                source: r.get(2)?,
                route: r.get(3)?,
                event_type: r.get(4)?,
                at: r.get(5)?,
            })
        })?;
        for item in rows {
            let item = item?;
            if let FeedItem::EventQueued { event, .. } = &item {
                next.event_id = *event;
            }
            out.push(item);
        }
        let mut stmt = self.conn.prepare_cached(
            "SELECT id, destination, count, sealed_at FROM batches
             WHERE finished = 0 AND sealed_at >= ?1 ORDER BY sealed_at, id LIMIT ?2",
        )?;
        let rows = stmt.query_map(rusqlite::params![cur.sealed_at, FEED_READ_MAX], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, String>(1)?,
                r.get(2)?,
                r.get::<_, f64>(3)?,
            ))
        })?;
        for row in rows {
            let (id, destination, count, at) = row?;
            if at == cur.sealed_at && cur.sealed_ids.contains(&id) {
                continue;
            }
            if at > next.sealed_at {
                next.sealed_at = at;
                next.sealed_ids.clear();
            }
            next.sealed_ids.push(id);
            out.push(FeedItem::BatchSealed {
                batch: id,
                destination,
                count,
                at,
            });
        }
        let mut stmt = self.conn.prepare_cached(
            "SELECT id, batch_id, destination, outcome, klass, status, duration_ms, finished_at
             FROM attempts
             WHERE started_at >= ?1 - ?3 AND finished_at IS NOT NULL AND finished_at >= ?1
             ORDER BY finished_at, id LIMIT ?2",
        )?;
        let rows = stmt.query_map(
            rusqlite::params![cur.finished_at, FEED_READ_MAX, FEED_ATTEMPT_LOOKBACK_S],
            |r| {
                Ok(FeedItem::AttemptFinished {
                    attempt: r.get(0)?,
                    batch: r.get(1)?,
                    destination: r.get(2)?,
                    outcome: r.get(3)?,
                    klass: r.get(4)?,
                    status: r.get(5)?,
                    duration_ms: r.get(6)?,
                    at: r.get(7)?,
                })
            },
        )?;
        for item in rows {
            let item = item?;
            if let FeedItem::AttemptFinished { attempt, at, .. } = &item {
                if *at == cur.finished_at && cur.finished_ids.contains(attempt) {
                    continue;
                }
                if *at > next.finished_at {
                    next.finished_at = *at;
                    next.finished_ids.clear();
                }
                next.finished_ids.push(*attempt);
            }
            out.push(item);
        }
        let mut stmt = self.conn.prepare_cached(
            "SELECT id, fingerprint, kind, first_at FROM issues WHERE id > ?1 ORDER BY id LIMIT ?2",
        )?;
        let rows = stmt.query_map(rusqlite::params![cur.issue_id, FEED_READ_MAX], |r| {
            Ok(FeedItem::IssueOpened {
                issue: r.get(0)?,
                fingerprint: r.get(1)?,
                kind: r.get(2)?,
                at: r.get(3)?,
            })
        })?;
        for item in rows {
            let item = item?;
            if let FeedItem::IssueOpened { issue, .. } = &item {
                next.issue_id = *issue;
            }
            out.push(item);
        }
        Ok((out, next))
    }
}

/// The value at fraction `q` (0 to 1) of `sorted` (ascending), nearest rank.
pub fn percentile(sorted: &[i64], q: f64) -> Option<i64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// The backlog series from `spans`: at each of `points` moments from `from` to `to`, per
/// destination, how many batches were unfinished and the oldest one's age. One sweep per
/// destination over its spans' starts and ends in time order (n log n), not a pass over
/// every span for every point.
pub fn backlog_series(
    spans: &[BacklogSpan],
    from: f64,
    to: f64,
    points: usize,
) -> std::collections::BTreeMap<String, Vec<(f64, i64, Option<f64>)>> {
    use std::collections::BTreeMap;
    let points = points.max(2);
    let step = (to - from) / (points - 1) as f64;
    let mut by_dest: BTreeMap<&str, Vec<&BacklogSpan>> = BTreeMap::new();
    // A span that ends before it starts (a clock step) was never pending.
    for s in spans
        .iter()
        .filter(|s| s.done_at.is_none_or(|d| d >= s.first_at))
    {
        by_dest.entry(s.destination.as_str()).or_default().push(s);
    }
    let mut out = BTreeMap::new();
    for (dest, spans) in by_dest {
        // Starts (first_at) and ends (done_at) in time order; at a point t a span counts
        // when first_at <= t < done_at.
        let mut starts: Vec<f64> = spans.iter().map(|s| s.first_at).collect();
        starts.sort_by(f64::total_cmp);
        let mut ends: Vec<(f64, f64)> = spans
            .iter()
            .filter_map(|s| s.done_at.map(|d| (d, s.first_at)))
            .collect();
        ends.sort_by(|a, b| a.0.total_cmp(&b.0));
        // The active spans' first_at values, as ordered keys with their counts.
        let mut active: BTreeMap<u64, i64> = BTreeMap::new();
        let key = |f: f64| -> u64 {
            // Order-preserving bits of a finite f64.
            let b = f.to_bits();
            if b >> 63 == 1 { !b } else { b | (1 << 63) }
        };
        let (mut si, mut ei, mut n) = (0usize, 0usize, 0i64);
        let mut series = Vec::with_capacity(points);
        for i in 0..points {
            let t = from + step * i as f64;
            while si < starts.len() && starts[si] <= t {
                *active.entry(key(starts[si])).or_insert(0) += 1;
                n += 1;
                si += 1;
            }
            while ei < ends.len() && ends[ei].0 <= t {
                let k = key(ends[ei].1);
                if let Some(c) = active.get_mut(&k) {
                    *c -= 1;
                    n -= 1;
                    if *c == 0 {
                        active.remove(&k);
                    }
                }
                ei += 1;
            }
            let oldest = active.keys().next().map(|k| {
                let b = if k >> 63 == 1 { k & !(1 << 63) } else { !k };
                f64::from_bits(b)
            });
            series.push((t, n, oldest.map(|o| ((t - o) * 10.0).round() / 10.0)));
        }
        out.insert(dest.to_string(), series);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_and_the_series_count_what_was_pending_then() {
        assert_eq!(percentile(&[], 0.5), None);
        let v: Vec<i64> = (1..=100).collect();
        assert_eq!(percentile(&v, 0.5), Some(50));
        assert_eq!(percentile(&v, 0.99), Some(99));
        assert_eq!(percentile(&v, 1.0), Some(100));
        assert_eq!(percentile(&[7], 0.99), Some(7));
        let span = |d: &str, a: f64, b: Option<f64>| BacklogSpan {
            destination: d.into(),
            first_at: a,
            done_at: b,
        };
        let s = backlog_series(
            &[
                span("a", 0.0, Some(50.0)),
                span("a", 40.0, None),
                span("b", 90.0, Some(95.0)),
            ],
            0.0,
            100.0,
            3,
        );
        assert_eq!(
            s["a"],
            vec![
                (0.0, 1, Some(0.0)),
                (50.0, 1, Some(10.0)),
                (100.0, 1, Some(60.0))
            ]
        );
        assert_eq!(
            s["b"],
            vec![(0.0, 0, None), (50.0, 0, None), (100.0, 0, None)]
        );
    }
}
