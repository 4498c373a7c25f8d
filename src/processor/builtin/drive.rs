//! google.drive: a watch-channel push becomes one `changed` item per file change since the
//! stored page token.
//!
//! API shapes (Drive API v3 reference, changes.list and changes.getStartPageToken, and the
//! "Retrieve changes" guide): `pageToken`, `includeRemoved`, `fields`, `changes[]`
//! (`changeType`, `removed`, `fileId`, `file.name`, `file.mimeType`, `file.modifiedTime`,
//! `file.trashed`), `nextPageToken` and, on the last page, `newStartPageToken`;
//! getStartPageToken answers `{startPageToken}`. A token the API rejects (400 naming
//! `pageToken`, 404 or 410) is discarded and a new start token taken, without announcing.
//!
//! State: `page_token`; the first push takes the start page token silently.

use serde_json::{Map, Value};

use crate::processor::contract::Batch;
use crate::processor::providers::google::{self, DRIVE_API, Fail, Google};
use crate::processor::{Context, Item, ProcessorError};

const STATE_TOKEN: &str = "page_token";
const SECRET: &str = "cred_owner";
/// Drive v3 returns only a few file fields unless asked; these are what the items carry.
const FIELDS: &str = "nextPageToken,newStartPageToken,changes(changeType,removed,fileId,time,file(id,name,mimeType,modifiedTime,trashed))";

pub async fn process(batch: &Batch, ctx: &mut Context) -> Result<Vec<Item>, ProcessorError> {
    if google::only_sync_pings(&batch.events) {
        ctx.log("drive: channel sync message acknowledged");
        return Ok(Vec::new());
    }
    let stored = ctx.state_str(STATE_TOKEN);
    let mut g = Google::new(ctx, SECRET)?;
    let Some(token) = stored else {
        let token = start_token(&mut g, ctx).await?;
        ctx.save_state(STATE_TOKEN, Value::from(token));
        ctx.log("drive: first push; start page token set without announcing");
        return Ok(Vec::new());
    };
    let mut items = Vec::new();
    let query = [
        ("pageToken", token.as_str()),
        ("pageSize", "100"),
        ("includeRemoved", "true"),
        ("fields", FIELDS),
    ];
    let url = format!("{DRIVE_API}/changes");
    let last = g
        .pages(ctx, &url, &query, |page| {
            for c in page
                .get("changes")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                // A shared drive's own change (changeType "drive") is not a file change.
                if c.get("changeType")
                    .and_then(Value::as_str)
                    .unwrap_or("file")
                    == "file"
                {
                    items.push(changed(c));
                }
            }
            Ok(())
        })
        .await;
    let last = match last {
        Ok(last) => last,
        Err(f) if token_rejected(&f) => {
            let token = start_token(&mut g, ctx).await?;
            ctx.save_state(STATE_TOKEN, Value::from(token));
            ctx.log("drive: page token rejected; new start page token taken without announcing");
            return Ok(Vec::new());
        }
        Err(f) => return Err(f.into()),
    };
    let next = last
        .get("newStartPageToken")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| {
            ProcessorError::retryable("drive changes ended without newStartPageToken")
        })?;
    ctx.save_state(STATE_TOKEN, Value::from(next));
    ctx.log(&format!("drive: {} changed file(s)", items.len()));
    Ok(items)
}

fn token_rejected(f: &Fail) -> bool {
    matches!(f.status(), Some(404 | 410)) || f.bad_parameter("pageToken")
}

async fn start_token(g: &mut Google, ctx: &mut Context) -> Result<String, ProcessorError> {
    let a = g
        .get(ctx, &format!("{DRIVE_API}/changes/startPageToken"), &[])
        .await?;
    a.get("startPageToken")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
        .map(str::to_string)
        .ok_or_else(|| ProcessorError::retryable("drive startPageToken answer has no token"))
}

fn changed(c: &Value) -> Item {
    let file = |k: &str| {
        c.get("file")
            .and_then(|f| f.get(k))
            .cloned()
            .unwrap_or(Value::Null)
    };
    let mut i = Map::new();
    i.insert("event_type".into(), Value::from("changed"));
    i.insert(
        "fileId".into(),
        c.get("fileId").cloned().unwrap_or(Value::Null),
    );
    i.insert("name".into(), file("name"));
    i.insert("mimeType".into(), file("mimeType"));
    i.insert("modifiedTime".into(), file("modifiedTime"));
    i.insert(
        "removed".into(),
        c.get("removed").cloned().unwrap_or(Value::Bool(false)),
    );
    i.insert("trashed".into(), file("trashed"));
    i
}
