//! hookspool.feed: any Atom or RSS feed at the `url` setting, polled with a conditional
//! GET (If-None-Match from the last ETag, If-Modified-Since from the last Last-Modified),
//! parsed by core's bounded parser ([`crate::processor::feeds`]), one `entry` item per entry
//! not seen before.
//!
//! State: `etag` and `last_modified` (the validators of the last 200), and `seen`, the
//! entries already announced as short hashes of their key (Atom id / RSS guid, else the
//! link, else title and summary), newest first. Bound: every entry the current feed holds
//! (at most `FEED_ENTRIES_MAX`) is always kept, and older ones up to [`SEEN_MAX`] in all,
//! so neither a restart (the set is durable state) nor a feed that reorders, drops and
//! re-adds its current entries announces one twice; only an entry that left the feed and
//! came back after more than [`SEEN_MAX`] newer distinct entries could be. The first poll
//! of an instance records the entries it finds without announcing them, unless
//! `announce_existing = true`.

use std::collections::HashSet;

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::processor::feeds::{self, FEED_ENTRIES_MAX, FeedEntry, FeedError};
use crate::processor::http::{HttpErrorKind, TextRequest};
use crate::processor::{Batch, Context, Item, ProcessorError};

/// The most entry hashes kept: twice the most entries a feed may hold.
pub const SEEN_MAX: usize = 2 * FEED_ENTRIES_MAX;
/// The hex characters of a kept hash (64 bits: collisions are negligible at this size).
const SEEN_HASH_HEX: usize = 16;
/// The item's output.
pub const EVENT_TYPE: &str = "entry";
/// How long one fetch may take, within the request cap.
const FETCH_TIMEOUT_S: f64 = 30.0;

const STATE_ETAG: &str = "etag";
const STATE_LAST_MODIFIED: &str = "last_modified";
const STATE_SEEN: &str = "seen";

pub async fn poll(_batch: &Batch, ctx: &mut Context) -> Result<Vec<Item>, ProcessorError> {
    let url = ctx.required_str("url")?.to_string();
    if !url.starts_with("https://") {
        return Err(ProcessorError::permanent(
            "setting url must be an https URL",
        ));
    }
    let first = ctx.load_state(STATE_SEEN).is_none();
    let etag = state_str(ctx, STATE_ETAG);
    let last_modified = state_str(ctx, STATE_LAST_MODIFIED);
    let mut headers: Vec<(&str, &str)> = Vec::new();
    if let Some(e) = etag.as_deref() {
        headers.push(("if-none-match", e));
    }
    if let Some(m) = last_modified.as_deref() {
        headers.push(("if-modified-since", m));
    }
    let answer = ctx
        .http()
        .get_text(
            &url,
            &TextRequest {
                headers: &headers,
                timeout_s: Some(FETCH_TIMEOUT_S),
                ..Default::default()
            },
        )
        .await
        .map_err(|e| match e.kind {
            // A feed that is too large stays too large: an operator's matter, not a retry.
            HttpErrorKind::TooLarge => ProcessorError::permanent(format!(
                "feed refused: larger than {} bytes",
                crate::processor::http::RESPONSE_BYTES_MAX
            )),
            _ => e.into_error(),
        })?;
    if answer.status == 304 {
        ctx.log("feed: not modified (304)");
        return Ok(Vec::new());
    }
    let feed = feeds::parse_feed(&answer.text).map_err(refused)?;
    let seen_before = seen(ctx);
    let known: HashSet<&str> = seen_before.iter().map(String::as_str).collect();
    let keyed: Vec<(String, &FeedEntry)> = feed.entries.iter().map(|e| (hash(e), e)).collect();
    let announce = !first || ctx.setting_bool("announce_existing") == Some(true);
    let mut items = Vec::new();
    let mut fresh = HashSet::new();
    // Feeds list the newest first; items go out oldest first.
    for (h, e) in keyed.iter().rev() {
        if known.contains(h.as_str()) || !fresh.insert(h.as_str()) {
            continue;
        }
        if announce {
            items.push(item(e, &feed.title));
        }
    }
    ctx.save_state(STATE_SEEN, Value::from(next_seen(&keyed, &seen_before)));
    for (key, header) in [(STATE_ETAG, "etag"), (STATE_LAST_MODIFIED, "last-modified")] {
        match answer.headers.get(header) {
            Some(v) => ctx.save_state(key, Value::from(v.clone())),
            None => ctx.save_state(key, Value::Null),
        }
    }
    ctx.log(&format!(
        "feed: {} entries, {} new{}",
        feed.entries.len(),
        fresh.len(),
        if announce {
            ""
        } else {
            " (first poll: recorded, not announced)"
        }
    ));
    Ok(items)
}

fn refused(e: FeedError) -> ProcessorError {
    ProcessorError::permanent(format!("feed refused: {e}"))
}

fn state_str(ctx: &Context, name: &str) -> Option<String> {
    ctx.state_str(name).filter(|s| !s.is_empty())
}

fn seen(ctx: &Context) -> Vec<String> {
    ctx.state_strings(STATE_SEEN)
}

/// The current feed's entries first (always kept), then the older ones, newest first, up
/// to [`SEEN_MAX`].
fn next_seen(current: &[(String, &FeedEntry)], before: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(SEEN_MAX);
    let mut have = HashSet::new();
    for h in current.iter().map(|(h, _)| h).chain(before.iter()) {
        if out.len() >= SEEN_MAX {
            break;
        }
        if have.insert(h.clone()) {
            out.push(h.clone());
        }
    }
    out
}

/// The entry's identity: its id, else its link, else its title and summary.
fn hash(e: &FeedEntry) -> String {
    let key = if !e.id.is_empty() {
        format!("id\n{}", e.id)
    } else if !e.link.is_empty() {
        format!("link\n{}", e.link)
    } else {
        format!("text\n{}\n{}", e.title, e.summary)
    };
    let digest = Sha256::digest(key.as_bytes());
    hex::encode(digest)[..SEEN_HASH_HEX].to_string()
}

/// One `entry` item. Its emit goes to the `<instance>><destination>` route, so it never
/// joins the instance's own tick group.
fn item(e: &FeedEntry, feed_title: &str) -> Item {
    let mut m = Map::new();
    m.insert("event_type".into(), Value::from(EVENT_TYPE));
    for (k, v) in [
        ("id", &e.id),
        ("title", &e.title),
        ("link", &e.link),
        ("published", &e.published),
        ("updated", &e.updated),
        ("summary", &e.summary),
    ] {
        m.insert(k.into(), Value::from(v.as_str()));
    }
    m.insert("feed".into(), Value::from(feed_title));
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: &str) -> FeedEntry {
        FeedEntry {
            id: id.into(),
            ..Default::default()
        }
    }

    #[test]
    fn feed_seen_set_keeps_every_current_entry_and_is_bounded() {
        let current: Vec<FeedEntry> = (0..FEED_ENTRIES_MAX)
            .map(|i| entry(&format!("c{i}")))
            .collect();
        let keyed: Vec<(String, &FeedEntry)> = current.iter().map(|e| (hash(e), e)).collect();
        let old: Vec<String> = (0..5000).map(|i| format!("{i:016x}")).collect();
        let next = next_seen(&keyed, &old);
        assert_eq!(next.len(), SEEN_MAX);
        for (h, _) in &keyed {
            assert!(next.contains(h), "a current entry was dropped");
        }
        // The newest of the older ones come next.
        assert_eq!(next[FEED_ENTRIES_MAX], old[0]);
    }

    #[test]
    fn feed_entry_identity_falls_back_from_id_to_link_to_text() {
        let a = FeedEntry {
            link: "https://x/1".into(),
            title: "t".into(),
            ..Default::default()
        };
        let b = FeedEntry {
            title: "other".into(),
            ..a.clone()
        };
        assert_eq!(hash(&a), hash(&b), "same link, same entry");
        let c = FeedEntry {
            id: "urn:1".into(),
            ..a.clone()
        };
        assert_ne!(hash(&a), hash(&c));
        assert_eq!(hash(&c).len(), SEEN_HASH_HEX);
    }
}
