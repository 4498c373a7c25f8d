//! The intake's group in a handful of statements (issue 32's throughput): the join rule of
//! every request of a group is worked out in memory from the group's open batches, locked
//! once, and written back with one statement per table instead of three per event. The
//! per-request path (`enqueue::place`) stays the reference and the fallback: a group with a
//! request this path does not plan (a quarantine, a dedup id already stored or repeated in
//! the group) goes there whole, and so does a group that loses a race to another writer (a
//! unique violation on the group's open batch or on a dedup id, a deadlock), after its
//! transaction, which holds nothing else yet, is rolled back.
//!
//! What is the same as the per-request path, request by request in the group's order: the
//! join rule (join the open batch, seal it first when the event would overflow its bytes,
//! seal at the size bounds), the batch's figures (`count`, `bytes`, `last_at` the greatest
//! `now`, `first_event_id` its first event), tee copies once per destination, the content
//! hash of a sealed batch (its stored events, then the group's, in id order), ids in the
//! order the requests are placed (the events' and the new batches' identity sequences are
//! drawn from in that order), a dedup row per request that carries an id.
//!
//! Statements per group: lock the open batches of the group's (route, key)s; read whether
//! any dedup id is stored (when a request carries one); draw the ids; read the stored
//! events of an open batch the group seals (when one does); update the open batches it
//! joined; insert the new batches, the events, the dedup rows.
//!
//! Must not: decide on a batch it has not locked, or keep anything when a statement failed
//! (the caller rolls the transaction back and runs the group on the per-request path).

use std::collections::HashMap;

use super::super::StoreError;
use super::super::content::{CanonicalEvent, content_hash};
use super::super::enqueue::{Copy, EnqueueOutcome, EnqueueRequest, event_size, raw_is_payload};
use super::enqueue::{Placed, Tx, fail};

/// The group's open batches, locked in id order (two writers lock shared batches in the
/// same order, so they wait for each other instead of deadlocking).
const LOCK_OPEN_SQL: &str = "SELECT id, route, key, count, bytes, max_events, max_bytes
     FROM batches
     WHERE state = 'open' AND (route, key) IN (SELECT * FROM unnest($1::text[], $2::text[]))
     ORDER BY id FOR UPDATE";

const DEDUP_STORED_SQL: &str = "SELECT 1 FROM dedup
     WHERE (source, dedup_id) IN (SELECT * FROM unnest($1::text[], $2::text[])) LIMIT 1";

const DRAW_IDS_SQL: &str = "SELECT
     ARRAY(SELECT nextval('events_id_seq') FROM generate_series(1, $1::bigint)),
     ARRAY(SELECT nextval('batches_id_seq') FROM generate_series(1, $2::bigint))";

const STORED_EVENTS_SQL: &str = "SELECT batch_id, id, event_type, received_at, dedup_id, payload
     FROM events WHERE batch_id = ANY($1::bigint[]) AND excluded_at IS NULL
     ORDER BY batch_id, id";

/// The open batches the group joined: their new figures (absolute: the rows are locked),
/// sealed when `content_hash` is given. Their events changed, so `open_hash` is no longer
/// known.
const UPDATE_OPEN_SQL: &str = "UPDATE batches b
     SET count = u.count, bytes = u.bytes, last_at = greatest(b.last_at, u.last_at),
         open_hash = NULL,
         first_event_id = coalesce(b.first_event_id, u.first_event_id),
         state = CASE WHEN u.content_hash IS NULL THEN b.state ELSE 'sealed' END,
         sealed_at = coalesce(u.sealed_at, b.sealed_at),
         content_hash = coalesce(u.content_hash, b.content_hash)
     FROM unnest($1::bigint[], $2::bigint[], $3::bigint[], $4::float8[], $5::bigint[],
                 $6::float8[], $7::text[])
          AS u(id, count, bytes, last_at, first_event_id, sealed_at, content_hash)
     WHERE b.id = u.id AND b.state = 'open'";

const INSERT_BATCHES_SQL: &str = "INSERT INTO batches (id, route, source, destination, key, state,
         finished, first_at, last_at, quiet_s, max_s, max_events, max_bytes, count, bytes,
         first_event_id, sealed_at, content_hash, open_hash)
     SELECT id, route, source, destination, key, state, 0, first_at, last_at, quiet_s, max_s,
            max_events, max_bytes, count, bytes, first_event_id, sealed_at, content_hash,
            open_hash
     FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[],
                 $7::float8[], $8::float8[], $9::float8[], $10::float8[], $11::bigint[],
                 $12::bigint[], $13::bigint[], $14::bigint[], $15::bigint[], $16::float8[],
                 $17::text[], $18::text[])
          AS u(id, route, source, destination, key, state, first_at, last_at, quiet_s, max_s,
               max_events, max_bytes, count, bytes, first_event_id, sealed_at, content_hash,
               open_hash)";

const INSERT_EVENTS_SQL: &str = "INSERT INTO events (id, source, route, batch_id, event_type,
         dedup_id, received_at, payload, raw, raw_is_payload, headers, size)
     SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::bigint[], $5::text[],
                          $6::text[], $7::float8[], $8::text[], $9::bytea[], $10::bigint[],
                          $11::text[], $12::bigint[])";

const INSERT_DEDUP_SQL: &str = "INSERT INTO dedup (source, dedup_id, event_id, seen_at, dup_count)
     SELECT source, dedup_id, event_id, seen_at, 0
     FROM unnest($1::text[], $2::text[], $3::bigint[], $4::float8[])
          AS u(source, dedup_id, event_id, seen_at)";

/// A batch the group writes to: an open one it locked (`last_at` starts below any time, so
/// the update keeps the stored one unless an event joined), or one it opens.
struct Planned<'r> {
    /// The stored id of a locked open batch; a new batch's id is drawn later.
    stored: Option<i64>,
    route: &'r str,
    key: &'r str,
    /// A new batch's source, destination and window (a stored one keeps its own).
    source: &'r str,
    destination: &'r str,
    quiet_s: f64,
    max_s: f64,
    max_events: i64,
    max_bytes: i64,
    first_at: f64,
    last_at: f64,
    count: i64,
    bytes: i64,
    /// The group's events in this batch (indexes into `events`).
    events: Vec<usize>,
    sealed_at: Option<f64>,
}

/// An event the group inserts: request `req`, in batch `batch` (an index into the plan).
struct PlannedEvent<'r> {
    req: usize,
    route: &'r str,
    batch: usize,
    size: i64,
}

/// The copies of a request: the primary, then each tee to another destination.
fn copies_of(r: &EnqueueRequest) -> Vec<&Copy> {
    let mut out: Vec<&Copy> = Vec::with_capacity(1 + r.tees.len());
    for c in std::iter::once(&r.primary).chain(r.tees.iter()) {
        if !out.iter().any(|o| o.destination == c.destination) {
            out.push(c);
        }
    }
    out
}

/// Place a group of validated requests (`valid[i]` says whether request `i` passed
/// `validate`). `Ok(None)`: the group has a request this path does not plan, nothing was
/// written. `Err(Failure::Race)`: another writer got in the way; the caller rolls back
/// and runs the group per request.
pub(super) fn place_group(
    tx: &mut Tx<'_, '_>,
    target: &str,
    reqs: &[EnqueueRequest],
    valid: &[bool],
) -> Placed<Option<Vec<EnqueueOutcome>>> {
    let f = |e| fail(target, e);
    let placing = || reqs.iter().zip(valid).filter(|(_, v)| **v).map(|(r, _)| r);
    if placing().any(|r| r.quarantine.is_some()) {
        return Ok(None);
    }
    // Dedup: a stored id (a duplicate, a replay, a repointing) or one repeated in the group
    // is the per-request path's to decide.
    let (dedup_sources, dedup_ids): (Vec<&str>, Vec<&str>) = placing()
        .filter_map(|r| r.dedup_id.as_deref().map(|d| (r.source.as_str(), d)))
        .unzip();
    if !dedup_ids.is_empty() {
        let mut seen = std::collections::HashSet::with_capacity(dedup_ids.len());
        if !dedup_sources
            .iter()
            .zip(&dedup_ids)
            .all(|pair| seen.insert(pair))
        {
            return Ok(None);
        }
        if tx
            .query_opt(DEDUP_STORED_SQL, &[&dedup_sources, &dedup_ids])
            .map_err(f)?
            .is_some()
        {
            return Ok(None);
        }
    }

    // Lock the open batches of every (route, key) the group writes to.
    let mut routes: Vec<&str> = Vec::new();
    let mut keys: Vec<&str> = Vec::new();
    for r in placing() {
        for c in copies_of(r) {
            if !routes
                .iter()
                .zip(&keys)
                .any(|(ro, k)| *ro == c.route && *k == r.key)
            {
                routes.push(&c.route);
                keys.push(&r.key);
            }
        }
    }
    let mut plan: Vec<Planned<'_>> = Vec::new();
    let mut open: HashMap<(&str, &str), usize> = HashMap::new();
    for row in tx.query(LOCK_OPEN_SQL, &[&routes, &keys]).map_err(f)? {
        let route: String = row.get(1);
        let key: String = row.get(2);
        // Borrow the group's own strings, so the plan does not own the rows'.
        let Some(i) = routes
            .iter()
            .zip(&keys)
            .position(|(ro, k)| *ro == route && *k == key)
        else {
            continue;
        };
        open.insert((routes[i], keys[i]), plan.len());
        plan.push(Planned {
            stored: Some(row.get(0)),
            route: routes[i],
            key: keys[i],
            source: "",
            destination: "",
            quiet_s: 0.0,
            max_s: 0.0,
            max_events: row.get(5),
            max_bytes: row.get(6),
            first_at: 0.0,
            last_at: f64::MIN,
            count: row.get(3),
            bytes: row.get(4),
            events: Vec::new(),
            sealed_at: None,
        });
    }

    // The join rule, request by request, copy by copy, in memory.
    let mut events: Vec<PlannedEvent<'_>> = Vec::new();
    let mut placed: Vec<Option<Vec<usize>>> = Vec::with_capacity(reqs.len());
    for (ri, r) in reqs.iter().enumerate() {
        if !valid[ri] {
            placed.push(None);
            continue;
        }
        let size = event_size(r);
        let mut mine = Vec::new();
        for c in copies_of(r) {
            let slot = (c.route.as_str(), r.key.as_str());
            if let Some(&b) = open.get(&slot) {
                let batch = &mut plan[b];
                if batch.bytes + size > batch.max_bytes && batch.count >= 1 {
                    batch.sealed_at = Some(r.now);
                    open.remove(&slot);
                }
            }
            let b = match open.get(&slot) {
                Some(&b) => b,
                None => {
                    let w = c.window;
                    plan.push(Planned {
                        stored: None,
                        route: &c.route,
                        key: &r.key,
                        source: &r.source,
                        destination: &c.destination,
                        quiet_s: w.quiet_s,
                        max_s: w.max_s,
                        max_events: w.max_events,
                        max_bytes: w.max_bytes,
                        first_at: r.now,
                        last_at: r.now,
                        count: 0,
                        bytes: 0,
                        events: Vec::new(),
                        sealed_at: None,
                    });
                    open.insert(slot, plan.len() - 1);
                    plan.len() - 1
                }
            };
            let batch = &mut plan[b];
            batch.count += 1;
            batch.bytes += size;
            batch.last_at = batch.last_at.max(r.now);
            batch.events.push(events.len());
            mine.push(events.len());
            events.push(PlannedEvent {
                req: ri,
                route: &c.route,
                batch: b,
                size,
            });
            if batch.count >= batch.max_events || batch.bytes >= batch.max_bytes {
                batch.sealed_at = Some(r.now);
                open.remove(&slot);
            }
        }
        placed.push(Some(mine));
    }

    // Ids, drawn in placing order: the events' in one go, the new batches' in one go.
    let new_batches: Vec<usize> = (0..plan.len())
        .filter(|&b| plan[b].stored.is_none())
        .collect();
    let (event_ids, new_ids): (Vec<i64>, Vec<i64>) = {
        let row = tx
            .query_one(
                DRAW_IDS_SQL,
                &[&(events.len() as i64), &(new_batches.len() as i64)],
            )
            .map_err(f)?;
        (row.get(0), row.get(1))
    };
    if event_ids.len() != events.len() || new_ids.len() != new_batches.len() {
        return Err(StoreError::Corrupt("drawing ids returned a short list".into()).into());
    }
    let mut batch_ids: Vec<i64> = plan.iter().map(|p| p.stored.unwrap_or(0)).collect();
    for (b, id) in new_batches.iter().zip(&new_ids) {
        batch_ids[*b] = *id;
    }
    let canonical = |e: usize| {
        let r = &reqs[events[e].req];
        CanonicalEvent {
            id: event_ids[e],
            event_type: r.event_type.clone(),
            received_at: r.now,
            dedup_id: r.dedup_id.clone(),
            payload: r.payload.clone(),
        }
    };

    // The content hash of each batch the group seals: a stored batch's stored events first.
    let sealed_stored: Vec<i64> = plan
        .iter()
        .filter(|p| p.stored.is_some() && p.sealed_at.is_some())
        .map(|p| p.stored.unwrap_or(0))
        .collect();
    let mut stored_events: HashMap<i64, Vec<CanonicalEvent>> = HashMap::new();
    if !sealed_stored.is_empty() {
        for row in tx.query(STORED_EVENTS_SQL, &[&sealed_stored]).map_err(f)? {
            stored_events
                .entry(row.get(0))
                .or_default()
                .push(CanonicalEvent {
                    id: row.get(1),
                    event_type: row.get(2),
                    received_at: row.get(3),
                    dedup_id: row.get(4),
                    payload: row.get(5),
                });
        }
    }
    // The content hash of each batch the group seals, and the `open_hash` of each batch it
    // opens and leaves open on an immediate route (ready at once: the dispatcher's seal
    // takes that hash instead of reading the events back). A batch with a window will
    // likely take more events first, so its hash is left to its seal.
    let mut hashes: Vec<Option<String>> = vec![None; plan.len()];
    let mut open_hashes: Vec<Option<String>> = vec![None; plan.len()];
    for (b, p) in plan.iter().enumerate() {
        let slot = if p.sealed_at.is_some() {
            &mut hashes[b]
        } else if p.stored.is_none() && p.quiet_s + p.max_s <= 0.0 {
            &mut open_hashes[b]
        } else {
            continue;
        };
        let mut all = p
            .stored
            .and_then(|id| stored_events.remove(&id))
            .unwrap_or_default();
        all.extend(p.events.iter().map(|&e| canonical(e)));
        let hash = content_hash(&all)
            .map_err(|e| StoreError::Corrupt(format!("batch {}: {e}", batch_ids[b])))?;
        *slot = Some(hash);
    }
    let first_event = |p: &Planned<'_>| p.events.first().map(|&e| event_ids[e]);

    // The locked open batches the group joined (sealed or not), before the new batches: a
    // group that seals a stored batch and opens the next one for its (route, key) must not
    // have two open batches of it at any statement's end.
    let joined: Vec<usize> = (0..plan.len())
        .filter(|&b| {
            plan[b].stored.is_some() && (!plan[b].events.is_empty() || plan[b].sealed_at.is_some())
        })
        .collect();
    if !joined.is_empty() {
        let ids: Vec<i64> = joined.iter().map(|&b| batch_ids[b]).collect();
        let counts: Vec<i64> = joined.iter().map(|&b| plan[b].count).collect();
        let bytes: Vec<i64> = joined.iter().map(|&b| plan[b].bytes).collect();
        let last: Vec<f64> = joined.iter().map(|&b| plan[b].last_at).collect();
        let firsts: Vec<Option<i64>> = joined.iter().map(|&b| first_event(&plan[b])).collect();
        let sealed: Vec<Option<f64>> = joined.iter().map(|&b| plan[b].sealed_at).collect();
        let hs: Vec<Option<&str>> = joined.iter().map(|&b| hashes[b].as_deref()).collect();
        let n = tx
            .execute(
                UPDATE_OPEN_SQL,
                &[&ids, &counts, &bytes, &last, &firsts, &sealed, &hs],
            )
            .map_err(f)?;
        if n != joined.len() as u64 {
            return Err(StoreError::Corrupt(format!(
                "{} of {} locked open batches stopped being open while the group joined them",
                joined.len() as u64 - n,
                joined.len()
            ))
            .into());
        }
    }
    if !new_batches.is_empty() {
        let new = || new_batches.iter().map(|&b| &plan[b]);
        let routes: Vec<&str> = new().map(|p| p.route).collect();
        let sources: Vec<&str> = new().map(|p| p.source).collect();
        let destinations: Vec<&str> = new().map(|p| p.destination).collect();
        let keys: Vec<&str> = new().map(|p| p.key).collect();
        let states: Vec<&str> = new()
            .map(|p| {
                if p.sealed_at.is_some() {
                    "sealed"
                } else {
                    "open"
                }
            })
            .collect();
        let num = |g: fn(&Planned<'_>) -> f64| -> Vec<f64> { new().map(g).collect() };
        let int = |g: fn(&Planned<'_>) -> i64| -> Vec<i64> { new().map(g).collect() };
        let first_at = num(|p| p.first_at);
        let last_at = num(|p| p.last_at);
        let quiet = num(|p| p.quiet_s);
        let max_s = num(|p| p.max_s);
        let max_events = int(|p| p.max_events);
        let max_bytes = int(|p| p.max_bytes);
        let counts = int(|p| p.count);
        let bytes = int(|p| p.bytes);
        let firsts: Vec<Option<i64>> = new_batches.iter().map(|&b| first_event(&plan[b])).collect();
        let sealed: Vec<Option<f64>> = new_batches.iter().map(|&b| plan[b].sealed_at).collect();
        let hs: Vec<Option<&str>> = new_batches.iter().map(|&b| hashes[b].as_deref()).collect();
        let open_hs: Vec<Option<&str>> = new_batches
            .iter()
            .map(|&b| open_hashes[b].as_deref())
            .collect();
        tx.execute(
            INSERT_BATCHES_SQL,
            &[
                &new_ids,
                &routes,
                &sources,
                &destinations,
                &keys,
                &states,
                &first_at,
                &last_at,
                &quiet,
                &max_s,
                &max_events,
                &max_bytes,
                &counts,
                &bytes,
                &firsts,
                &sealed,
                &hs,
                &open_hs,
            ],
        )
        .map_err(f)?;
    }
    if !events.is_empty() {
        let req = |e: &PlannedEvent<'_>| &reqs[e.req];
        let sources: Vec<&str> = events.iter().map(|e| req(e).source.as_str()).collect();
        let routes: Vec<&str> = events.iter().map(|e| e.route).collect();
        let batches: Vec<i64> = events.iter().map(|e| batch_ids[e.batch]).collect();
        let types: Vec<&str> = events.iter().map(|e| req(e).event_type.as_str()).collect();
        let dedups: Vec<Option<&str>> = events.iter().map(|e| req(e).dedup_id.as_deref()).collect();
        let received: Vec<f64> = events.iter().map(|e| req(e).now).collect();
        let payloads: Vec<Option<&str>> =
            events.iter().map(|e| req(e).payload.as_deref()).collect();
        let same: Vec<bool> = events.iter().map(|e| raw_is_payload(req(e))).collect();
        let raws: Vec<Option<&[u8]>> = events
            .iter()
            .zip(&same)
            .map(|(e, same)| if *same { None } else { req(e).raw.as_deref() })
            .collect();
        let same: Vec<i64> = same.into_iter().map(i64::from).collect();
        let headers: Vec<&str> = events.iter().map(|e| req(e).headers.as_str()).collect();
        let sizes: Vec<i64> = events.iter().map(|e| e.size).collect();
        tx.execute(
            INSERT_EVENTS_SQL,
            &[
                &event_ids, &sources, &routes, &batches, &types, &dedups, &received, &payloads,
                &raws, &same, &headers, &sizes,
            ],
        )
        .map_err(f)?;
        crate::failpoint::hit("enqueue.after_copy");
    }
    if !dedup_ids.is_empty() {
        let mut event_of = Vec::with_capacity(dedup_ids.len());
        let mut seen_at = Vec::with_capacity(dedup_ids.len());
        for (ri, r) in reqs.iter().enumerate() {
            if let (Some(mine), Some(_)) = (&placed[ri], &r.dedup_id) {
                event_of.push(event_ids[mine[0]]);
                seen_at.push(r.now);
            }
        }
        tx.execute(
            INSERT_DEDUP_SQL,
            &[&dedup_sources, &dedup_ids, &event_of, &seen_at],
        )
        .map_err(f)?;
    }
    #[cfg(test)]
    tests::PLANNED.with(|c| c.set(c.get() + 1));
    Ok(Some(
        placed
            .into_iter()
            .flatten()
            .map(|mine| EnqueueOutcome::Queued {
                copies: mine
                    .into_iter()
                    .map(|e| {
                        (
                            event_ids[e],
                            batch_ids[events[e].batch],
                            events[e].route.to_string(),
                        )
                    })
                    .collect(),
            })
            .collect(),
    ))
}

#[cfg(test)]
mod tests {
    use super::super::super::enqueue::Quarantine;
    use super::super::super::tests::{req, window};
    use super::super::super::testutil::{temp_sqlite_store, temp_store, with_backend};
    use super::super::super::{ExportFilter, Store};
    use super::*;

    thread_local! {
        /// Groups `place_group` planned (did not hand to the per-request path) on this thread.
        pub(super) static PLANNED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

    /// xorshift64*, so a seed replays exactly.
    struct Rng(u64);
    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n.max(1)
        }
    }

    /// A random request: two routes, four keys, windows that seal after a few events or a
    /// few hundred bytes (different from request to request, so a stored batch's own bounds
    /// must win), tees (one to the primary's destination, which is no copy), dedup ids from
    /// a small pool (repeated in a group, stored by an earlier group), raw bodies that are
    /// and are not the payload, quarantines and refusals.
    fn random_request(rng: &mut Rng, i: u64, now: f64) -> EnqueueRequest {
        let route = ["r1", "r2"][rng.below(2) as usize];
        let key = format!("k{}", rng.below(4));
        let pad = "x".repeat(rng.below(160) as usize);
        let payload = format!("{{\"i\":{i},\"pad\":\"{pad}\"}}");
        let mut r = req(route, &key, &payload, now);
        r.primary.window = window(
            10.0,
            60.0,
            2 + rng.below(6) as i64,
            200 + rng.below(600) as i64,
        );
        match rng.below(10) {
            0..=2 => {
                let mut tee = r.primary.clone();
                tee.route = "t".into();
                tee.destination = "http:t".into();
                tee.window = window(5.0, 30.0, 3, 100_000);
                r.tees.push(tee);
            }
            3 => r.tees.push(r.primary.clone()),
            _ => {}
        }
        if rng.below(10) < 4 {
            r.dedup_id = Some(format!("d{}", rng.below(3000)));
        }
        match rng.below(10) {
            0 => r.raw = Some(payload.as_bytes().to_vec()),
            1 => r.raw = Some(b"raw bytes, not the payload".to_vec()),
            _ => {}
        }
        match rng.below(80) {
            0 => {
                r.payload = None;
                r.raw = Some(b"{broken".to_vec());
                r.quarantine = Some(Quarantine {
                    error_class: "BadPayload".into(),
                });
            }
            1 => r.payload = Some("not json".into()),
            _ => {}
        }
        r
    }

    fn export(s: &Store) -> Vec<serde_json::Value> {
        let mut out = Vec::new();
        s.export(&ExportFilter::default(), &mut |v| out.push(v))
            .expect("export");
        out
    }

    fn dedup_rows(s: &Store) -> Vec<(String, String, i64, f64, i64)> {
        let mut stmt = s
            .conn
            .prepare(
                "SELECT source, dedup_id, event_id, seen_at, dup_count FROM dedup
                 ORDER BY source, dedup_id",
            )
            .unwrap();
        stmt.query_map((), |r: &crate::store::db::Row<'_>| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
                r.get::<_, f64>(3)?,
                r.get::<_, i64>(4)?,
            ))
        })
        .unwrap()
        .collect::<std::result::Result<_, _>>()
        .unwrap()
    }

    /// The group path on PostgreSQL gives exactly what SQLite's request-by-request path
    /// gives for the same groups: every answer, the export (batches with their figures,
    /// seals and content hashes, events with their ids and batches) and the dedup rows.
    fn groups_match_sqlite_request_by_request() {
        let (_d, mut pg) = temp_store();
        assert!(pg.conn.is_pg());
        let (_l, mut lite) = temp_sqlite_store();
        let mut rng = Rng(0x5eed_6a0c);
        let mut i = 0;
        let planned_before = PLANNED.with(|c| c.get());
        for g in 0..200 {
            let now = 1_000.0 + g as f64 * 0.5;
            let reqs: Vec<EnqueueRequest> = (0..1 + rng.below(24))
                .map(|_| {
                    i += 1;
                    let at = now + rng.below(3) as f64 * 0.1;
                    random_request(&mut rng, i, at)
                })
                .collect();
            let on_pg = pg.enqueue_many(&reqs).expect("PostgreSQL group");
            let on_lite = lite.enqueue_many(&reqs).expect("SQLite group");
            assert_eq!(format!("{on_pg:?}"), format!("{on_lite:?}"), "group {g}");
        }
        // Both paths ran: most groups planned, some handed on (a quarantine, a dedup id
        // stored or repeated).
        let planned = PLANNED.with(|c| c.get()) - planned_before;
        assert!(
            (100..190).contains(&planned),
            "{planned} of 200 groups planned"
        );
        let (a, b) = (export(&pg), export(&lite));
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(x, y);
        }
        assert!(
            a.iter().filter(|r| r["record"] == "batch").count() > 100,
            "too few batches to say much"
        );
        assert_eq!(dedup_rows(&pg), dedup_rows(&lite));
    }

    /// An operator's enqueue (the store's shared path, under the write lock) and an
    /// intake's group (this path, no write lock) open the same new groups at the same time:
    /// whichever loses the race to open a group's batch joins the winner's, and neither
    /// fails (the shared path used to fail with the unique violation).
    fn operator_and_intake_open_the_same_groups() {
        let (dir, mut intake) = temp_store();
        let mut operator =
            super::super::super::testutil::reopen(&dir, &intake, std::time::Duration::from_secs(5));
        const KEYS: usize = 300;
        let t = std::thread::spawn(move || {
            for k in 0..KEYS {
                let r = req("r", &format!("k{k}"), "{\"by\":\"operator\"}", 10.0);
                operator
                    .enqueue_idempotent(&r, None)
                    .expect("operator enqueue");
            }
        });
        for k in 0..KEYS {
            let r = req("r", &format!("k{k}"), "{\"by\":\"intake\"}", 10.0);
            let out = intake.enqueue_many(&[r]).expect("intake group");
            assert!(out[0].is_ok(), "{out:?}");
        }
        t.join().expect("operator thread");
        let rows: Vec<(String, i64)> = intake
            .conn
            .prepare("SELECT key, count FROM batches ORDER BY key")
            .unwrap()
            .query_map((), |r: &crate::store::db::Row<'_>| {
                Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?))
            })
            .unwrap()
            .collect::<std::result::Result<_, _>>()
            .unwrap();
        assert_eq!(rows.len(), KEYS, "one batch per group");
        assert!(rows.iter().all(|(_, n)| *n == 2), "{rows:?}");
    }

    #[test]
    fn operator_and_intake_open_the_same_groups_on_postgres() {
        with_backend(true, operator_and_intake_open_the_same_groups);
    }

    #[test]
    fn groups_on_postgres_match_sqlite_request_by_request() {
        with_backend(true, groups_match_sqlite_request_by_request);
    }
}
