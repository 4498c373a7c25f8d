//! google.tasks: the Google Tasks API has no push (no watch method, no webhook), so the
//! task list at the `tasklist` setting is polled for tasks changed since the last poll,
//! through the shared Google OAuth and paging core (`providers::google`).
//!
//! API shape (Tasks API v1 reference, tasks.list): GET
//! `https://tasks.googleapis.com/tasks/v1/lists/{tasklist}/tasks` with `updatedMin`
//! (RFC 3339, inclusive), `showCompleted`, `showDeleted`, `showHidden`, `maxResults` and
//! `pageToken`; the answer has `items[]` (`id`, `title`, `status`, `due`, `completed`,
//! `updated`, `deleted`, `hidden`, `parent`) and `nextPageToken`.
//!
//! State: `updated_min`, the newest `updated` seen (the next poll's `updatedMin`), and
//! `boundary`, the `id@updated` pairs at exactly that time, which the inclusive bound
//! returns again and are not announced twice. The first poll asks for the tasks changed
//! since the poll's own time (which proves the credential and the list), sets the cursor
//! and announces nothing (the list's history is not news).

use std::collections::HashSet;

use serde_json::{Map, Value};

use crate::processor::providers::google::{self, Google};
use crate::processor::{Batch, Context, Item, ProcessorError};

/// The Tasks API's root (Tasks API v1 reference).
pub const TASKS_API: &str = "https://tasks.googleapis.com/tasks/v1";
const SECRET: &str = "cred_owner";
const STATE_UPDATED_MIN: &str = "updated_min";
const STATE_BOUNDARY: &str = "boundary";
/// The item's output.
pub const EVENT_TYPE: &str = "changed";
/// The page size asked for (the API's maximum is 100).
const PAGE_SIZE: &str = "100";
/// The task fields an item carries (never `notes`, which is free text of the owner's).
const TASK_FIELDS: &[&str] = &[
    "id",
    "title",
    "status",
    "due",
    "completed",
    "updated",
    "deleted",
    "hidden",
    "parent",
];

pub async fn poll(_batch: &Batch, ctx: &mut Context) -> Result<Vec<Item>, ProcessorError> {
    let list = ctx
        .setting_str("tasklist")
        .unwrap_or("@default")
        .to_string();
    let stored = ctx.state_str(STATE_UPDATED_MIN);
    let first = stored.is_none();
    let since = stored.unwrap_or_else(|| google::rfc3339(ctx.now()));
    let boundary: HashSet<String> = ctx.state_strings(STATE_BOUNDARY).into_iter().collect();
    let url = google::url(TASKS_API, &["lists", &list, "tasks"])?;
    let query = [
        ("updatedMin", since.as_str()),
        ("showCompleted", "true"),
        ("showDeleted", "true"),
        ("showHidden", "true"),
        ("maxResults", PAGE_SIZE),
    ];
    let mut g = Google::new(ctx, SECRET)?;
    let mut tasks: Vec<Value> = Vec::new();
    g.pages(ctx, &url, &query, |page| {
        tasks.extend(
            page.get("items")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .cloned(),
        );
        Ok(())
    })
    .await?;
    let mut newest = since.clone();
    let mut newest_t = google::parse_rfc3339(&since).unwrap_or(f64::NEG_INFINITY);
    let mut items = Vec::new();
    let mut at_newest: Vec<String> = Vec::new();
    for t in &tasks {
        let id = t.get("id").and_then(Value::as_str).unwrap_or_default();
        let updated = t.get("updated").and_then(Value::as_str).unwrap_or_default();
        let mark = format!("{id}@{updated}");
        let Some(u) = google::parse_rfc3339(updated) else {
            continue;
        };
        if u > newest_t {
            newest_t = u;
            newest = updated.to_string();
            at_newest.clear();
        }
        if u == newest_t {
            at_newest.push(mark.clone());
        }
        if first || boundary.contains(&mark) {
            continue;
        }
        items.push(item(t));
    }
    if newest == since {
        // Nothing newer: the boundary grows by what came back at the same instant.
        at_newest.extend(boundary);
    }
    at_newest.sort();
    at_newest.dedup();
    ctx.save_state(STATE_UPDATED_MIN, Value::from(newest));
    ctx.save_state(STATE_BOUNDARY, Value::from(at_newest));
    ctx.log(&format!(
        "tasks: {} changed{}",
        items.len(),
        if first {
            " (first poll: cursor set without announcing)"
        } else {
            ""
        }
    ));
    Ok(items)
}

/// One `changed` item. Its emit goes to the `<instance>><destination>` route, so it never
/// joins the instance's own tick group.
fn item(t: &Value) -> Item {
    let mut m = Map::new();
    m.insert("event_type".into(), Value::from(EVENT_TYPE));
    for k in TASK_FIELDS {
        if let Some(v) = t.get(*k) {
            m.insert((*k).into(), v.clone());
        }
    }
    m
}
