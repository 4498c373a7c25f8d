//! google.calendar: a watch-channel push becomes one `changed` item per event created,
//! changed or cancelled since the stored sync token.
//!
//! API shapes (Calendar API v3 reference, events.list and the "Synchronize resources
//! efficiently" guide): `syncToken`, `pageToken`, `items[]` (`id`, `status` with
//! `cancelled` for deletions, `summary`, `start`, `end`, `updated`), `nextPageToken`, and
//! `nextSyncToken` on the last page; 410 Gone when the sync token is invalidated, after
//! which a full sync establishes a new token.
//!
//! With a hooks program (the `hooks` setting, spec 14.3.6), `travel` is called for each
//! changed event that is not cancelled, with `{"event": <the item's fields>, "day_events":
//! [the batch's other changed events starting the same day]}`; an object answer is the
//! travel block the deployment proposes for it, carried as the item's `travel`.
//!
//! State: `sync_token`. The first push and a 410 run a full sync that sets the baseline
//! without announcing anything; a channel's `sync` message is acknowledged with no call.

use serde_json::{Map, Value};

use crate::processor::contract::Batch;
use crate::processor::providers::google::{self, CALENDAR_API, Google};
use crate::processor::{Context, Item, ProcessorError};

const STATE_SYNC: &str = "sync_token";
const SECRET: &str = "cred_owner";
const PAGE_SIZE: &str = "250";
const ITEM_FIELDS: &[&str] = &["id", "status", "summary", "start", "end", "updated"];

pub async fn process(batch: &Batch, ctx: &mut Context) -> Result<Vec<Item>, ProcessorError> {
    if google::only_sync_pings(&batch.events) {
        ctx.log("calendar: channel sync message acknowledged");
        return Ok(Vec::new());
    }
    let calendar = ctx.required_str("owner")?.to_string();
    let url = google::url(CALENDAR_API, &["calendars", &calendar, "events"])?;
    let stored = ctx.state_str(STATE_SYNC);
    let mut g = Google::new(ctx, SECRET)?;
    let Some(token) = stored else {
        let token = full_sync(&mut g, ctx, &url).await?;
        ctx.save_state(STATE_SYNC, Value::from(token));
        ctx.log("calendar: first push; sync baseline set without announcing");
        return Ok(Vec::new());
    };
    let mut items = Vec::new();
    let query = [("syncToken", token.as_str()), ("maxResults", PAGE_SIZE)];
    let last = g
        .pages(ctx, &url, &query, |page| {
            for event in page
                .get("items")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                items.push(changed(event));
            }
            Ok(())
        })
        .await;
    let last = match last {
        Ok(last) => last,
        Err(f) if f.status() == Some(410) => {
            let token = full_sync(&mut g, ctx, &url).await?;
            ctx.save_state(STATE_SYNC, Value::from(token));
            ctx.log("calendar: sync token expired (410); full resync without announcing");
            return Ok(Vec::new());
        }
        Err(f) => return Err(f.into()),
    };
    travel(ctx, &mut items)?;
    ctx.save_state(STATE_SYNC, Value::from(next_sync_token(&last)?));
    ctx.log(&format!("calendar: {} changed event(s)", items.len()));
    Ok(items)
}

/// The `travel` hook (spec 14.3.6) for each changed event that is not cancelled: the
/// deployment's travel block, when it proposes one, as the item's `travel`.
fn travel(ctx: &Context, items: &mut [Item]) -> Result<(), ProcessorError> {
    if !ctx.has_hooks() {
        return Ok(());
    }
    let days: Vec<Option<String>> = items.iter().map(start_day).collect();
    for n in 0..items.len() {
        if items[n].get("status").and_then(Value::as_str) == Some("cancelled") {
            continue;
        }
        let day_events: Vec<&Item> = items
            .iter()
            .enumerate()
            .filter(|(m, _)| *m != n && days[*m].is_some() && days[*m] == days[n])
            .map(|(_, i)| i)
            .collect();
        let args = serde_json::json!({"event": items[n], "day_events": day_events});
        if let Some(block) = ctx.hook("travel", args)? {
            items[n].insert("travel".into(), Value::Object(block));
        }
    }
    Ok(())
}

/// The day an item starts: `start.date`, or the date part of `start.dateTime`.
fn start_day(item: &Item) -> Option<String> {
    let start = item.get("start")?;
    start
        .get("date")
        .or_else(|| start.get("dateTime"))
        .and_then(Value::as_str)
        .and_then(|s| s.get(..10))
        .map(str::to_string)
}

/// Lists every page without a sync token and returns the last page's `nextSyncToken`.
async fn full_sync(g: &mut Google, ctx: &mut Context, url: &str) -> Result<String, ProcessorError> {
    let last = g
        .pages(ctx, url, &[("maxResults", PAGE_SIZE)], |_| Ok(()))
        .await?;
    next_sync_token(&last)
}

fn next_sync_token(last: &Value) -> Result<String, ProcessorError> {
    last.get("nextSyncToken")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
        .map(str::to_string)
        .ok_or_else(|| ProcessorError::retryable("calendar list ended without nextSyncToken"))
}

fn changed(event: &Value) -> Item {
    let mut i = Map::new();
    i.insert("event_type".into(), Value::from("changed"));
    for f in ITEM_FIELDS {
        i.insert((*f).into(), event.get(*f).cloned().unwrap_or(Value::Null));
    }
    i
}
