//! google.gmail: a Gmail push (`{emailAddress, historyId}` in the Pub/Sub message) becomes
//! one `mail` item per message added since the stored history id, plus an item for each
//! output a matching mail rule names; a `scheduling` item carries the owner's free windows
//! from the free/busy API over the configured horizon. With a hooks program (the `hooks`
//! setting, spec 14.3.6), `classify` is called for each message before the rules, with
//! `{"message": {id, threadId, from, subject, date, snippet}, "account": <owner>}`; an
//! answer `{"output": ..., "values": {...}}` is the message's first match (rule
//! `hooks/classify`), `null` leaves the message to the rules alone.
//!
//! API shapes (Gmail API v1 REST reference): users.history.list (`startHistoryId`,
//! `historyTypes=messageAdded`, `labelId`, `history[].id`, `history[].messagesAdded[].message
//! .id`, `historyId`, `nextPageToken`; a 404 for a startHistoryId too old to answer, per the
//! "Synchronize clients" guide), users.messages.get (`format=metadata` with
//! `metadataHeaders`, or `format=full` when the `body` setting asks: `payload.headers`,
//! `payload.parts[].body.data` base64url), users.getProfile (`historyId`).
//!
//! State: `history_id`. The first push sets it silently (no old mail is announced); a 404
//! resynchronises to the profile's current history id, also without announcing. A push
//! whose history id is not beyond the stored one needs no call; an event `{"sweep": true}`
//! (the daily sweep, `hookspool enqueue`) always pages from the stored id.

use std::collections::BTreeSet;

use base64::Engine as _;
use serde_json::{Map, Value, json};

use crate::processor::contract::Batch;
use crate::processor::mailrules::{self, Message, Rules};
use crate::processor::providers::google::{self, GMAIL_API, Google};
use crate::processor::{Context, Item, ProcessorError};

const STATE_HISTORY: &str = "history_id";
const SECRET: &str = "cred_owner";
const LABEL_DEFAULT: &str = "INBOX";
const HORIZON_DAYS_DEFAULT: i64 = 7;
const MIN_WINDOW_MINUTES_DEFAULT: i64 = 30;
const SCHEDULING: &str = "scheduling";
/// Messages fetched per batch at most; the rest wait for the next push (whole history
/// records only, so the stored history id never splits one).
pub const MESSAGES_PER_BATCH_MAX: usize = 500;
/// A message body (only with `body = true`) is cut to this many characters.
pub const BODY_CHARS_MAX: usize = 16 * 1024;
const HORIZON_DAYS_MAX: i64 = 60;

pub async fn process(batch: &Batch, ctx: &mut Context) -> Result<Vec<Item>, ProcessorError> {
    let owner = ctx.required_str("owner")?.to_string();
    let (pushed, foreign) = pushed_history(&batch.events, &owner);
    if foreign > 0 {
        ctx.log(&format!(
            "gmail: {foreign} push(es) for another mailbox than the owner's skipped"
        ));
    }
    let stored = ctx.load_state(STATE_HISTORY).and_then(history_of);
    let mut google = Google::new(ctx, SECRET)?;
    let Some(stored) = stored else {
        let base = match pushed {
            Some(h) => h,
            None => profile_history(&mut google, ctx).await?,
        };
        ctx.save_state(STATE_HISTORY, Value::from(base.to_string()));
        ctx.log("gmail: first push; history baseline set without announcing old mail");
        return Ok(Vec::new());
    };
    // A sweep (`{"sweep": true}`, enqueued by the daily job of SETUP.md) always looks.
    let sweep = batch
        .events
        .iter()
        .any(|e| e.get("sweep").and_then(Value::as_bool) == Some(true));
    match pushed {
        None if !sweep => {
            ctx.log("gmail: no push for the owner's mailbox in this batch");
            return Ok(Vec::new());
        }
        Some(p) if p <= stored && !sweep => {
            ctx.log("gmail: push history id already processed");
            return Ok(Vec::new());
        }
        _ => {}
    }
    let label = ctx
        .setting_str("label")
        .unwrap_or(LABEL_DEFAULT)
        .to_string();
    let start = stored.to_string();
    let query = [
        ("startHistoryId", start.as_str()),
        ("historyTypes", "messageAdded"),
        ("labelId", label.as_str()),
        ("maxResults", "500"),
    ];
    let mut added = Added::default();
    let url = format!("{GMAIL_API}/users/me/history");
    let last = match google
        .pages(ctx, &url, &query, |page| added.page(page))
        .await
    {
        Ok(last) => last,
        Err(f) if f.status() == Some(404) => {
            let now = profile_history(&mut google, ctx).await?;
            ctx.save_state(STATE_HISTORY, Value::from(now.to_string()));
            ctx.log("gmail: stored history id too old (404); resynchronised without announcing");
            return Ok(Vec::new());
        }
        Err(f) => return Err(f.into()),
    };
    let current = last
        .get("historyId")
        .and_then(history_of)
        .ok_or_else(|| ProcessorError::retryable("gmail history answer has no historyId"))?;
    // The answer's historyId is the mailbox's current one, never behind a push it caused.
    let next = added.truncated_at.unwrap_or(current).max(stored);
    let rules = load_rules(ctx)?;
    let mut items = Vec::new();
    let mut free: Option<Value> = None;
    let mut gone = 0usize;
    for id in &added.ids {
        let Some(msg) = fetch(&mut google, ctx, id).await? else {
            gone += 1;
            continue;
        };
        let mail = MailFacts::of(&msg);
        // The deployment's hooks program first (spec 14.3.6), then the rules.
        let hooked = ctx.hook(
            "classify",
            json!({"message": mail.summary(), "account": owner}),
        )?;
        let mut matches: Vec<mailrules::Match> =
            hooked.map(hook_match).transpose()?.into_iter().collect();
        matches.extend(rules.matches(&mail.message()));
        let mut mail_item = mail.item();
        mail_item.insert(
            "rules".into(),
            Value::Array(
                matches
                    .iter()
                    .map(|m| json!({"rule": m.rule, "values": m.values}))
                    .collect(),
            ),
        );
        if ctx.setting_bool("body") == Some(true) {
            mail_item.insert("body".into(), Value::from(plain_body(&msg)));
        }
        items.push(mail_item);
        for m in matches
            .iter()
            .filter(|m| m.output.as_deref().is_some_and(|o| o != "mail"))
        {
            let output = m.output.clone().unwrap_or_default();
            let mut item = Map::new();
            item.insert("event_type".into(), Value::from(output.clone()));
            item.insert("message".into(), mail.summary());
            item.insert("rule".into(), Value::from(m.rule.clone()));
            item.insert("values".into(), json!(m.values));
            if output == SCHEDULING {
                if free.is_none() {
                    free = Some(free_windows(&mut google, ctx, &owner).await?);
                }
                if let Some(Value::Object(f)) = &free {
                    item.extend(f.clone());
                }
            }
            items.push(item);
        }
    }
    ctx.save_state(STATE_HISTORY, Value::from(next.to_string()));
    ctx.log(&format!(
        "gmail: {} new message(s), {} item(s), {gone} gone before they could be read{}",
        added.ids.len(),
        items.len(),
        if added.truncated_at.is_some() {
            "; more wait for the next push"
        } else {
            ""
        }
    ));
    Ok(items)
}

/// The answer of the `classify` hook as a rule match named `hooks/classify`: `output` (an
/// event type, optional) and `values` (names to strings, optional).
fn hook_match(answer: Map<String, Value>) -> Result<mailrules::Match, ProcessorError> {
    let bad = || {
        ProcessorError::permanent(
            "hooks classify answer: write {\"output\": \"<event type>\", \"values\": {\"name\": \"text\"}}",
        )
    };
    let output = match answer.get("output") {
        None | Some(Value::Null) => None,
        Some(Value::String(o)) if o.is_empty() => None,
        Some(Value::String(o)) => Some(o.clone()),
        Some(_) => return Err(bad()),
    };
    let values = match answer.get("values") {
        None | Some(Value::Null) => Default::default(),
        Some(Value::Object(v)) => v
            .iter()
            .map(|(k, v)| {
                v.as_str()
                    .map(|s| (k.clone(), s.to_string()))
                    .ok_or_else(bad)
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(bad()),
    };
    Ok(mailrules::Match {
        rule: "hooks/classify".into(),
        output,
        values,
    })
}

/// A history id from a string (`"1234"`, how Gmail writes them) or a number.
fn history_of(v: &Value) -> Option<u64> {
    match v {
        Value::String(s) => s.parse().ok(),
        Value::Number(n) => n.as_u64(),
        _ => None,
    }
}

/// The newest history id among the owner's pushes, and how many pushes were for another
/// mailbox. The push's `message.data` is base64 JSON `{emailAddress, historyId}`.
fn pushed_history(events: &[Value], owner: &str) -> (Option<u64>, usize) {
    let b64 = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
    );
    let mut newest = None;
    let mut foreign = 0;
    for e in events {
        let data = e
            .pointer("/message/data")
            .and_then(Value::as_str)
            .and_then(|d| b64.decode(d).ok())
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok());
        let Some(data) = data else { continue };
        let mailbox = data
            .get("emailAddress")
            .and_then(Value::as_str)
            .unwrap_or("");
        if !mailbox.eq_ignore_ascii_case(owner) {
            foreign += 1;
            continue;
        }
        if let Some(h) = data.get("historyId").and_then(history_of) {
            newest = Some(newest.map_or(h, |n: u64| n.max(h)));
        }
    }
    (newest, foreign)
}

async fn profile_history(google: &mut Google, ctx: &mut Context) -> Result<u64, ProcessorError> {
    let p = google
        .get(ctx, &format!("{GMAIL_API}/users/me/profile"), &[])
        .await?;
    p.get("historyId")
        .and_then(history_of)
        .ok_or_else(|| ProcessorError::retryable("gmail profile answer has no historyId"))
}

/// Message ids added, in history order, each once.
#[derive(Default)]
struct Added {
    ids: Vec<String>,
    seen: BTreeSet<String>,
    /// The id of the last whole history record kept when the batch bound was reached.
    truncated_at: Option<u64>,
}

impl Added {
    fn page(&mut self, page: &Value) -> Result<(), ProcessorError> {
        for record in page
            .get("history")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if self.truncated_at.is_some() {
                return Ok(());
            }
            let added = record.get("messagesAdded").and_then(Value::as_array);
            for m in added.into_iter().flatten() {
                if let Some(id) = m.pointer("/message/id").and_then(Value::as_str)
                    && self.seen.insert(id.to_string())
                {
                    self.ids.push(id.to_string());
                }
            }
            if self.ids.len() >= MESSAGES_PER_BATCH_MAX {
                self.truncated_at = record.get("id").and_then(history_of);
            }
        }
        Ok(())
    }
}

/// users.messages.get; `None` when the message is gone (404: deleted since the history).
async fn fetch(
    google: &mut Google,
    ctx: &mut Context,
    id: &str,
) -> Result<Option<Value>, ProcessorError> {
    let full = ctx.setting_bool("body") == Some(true);
    let url = google::url(GMAIL_API, &["users", "me", "messages", id])?;
    let query: &[(&str, &str)] = if full {
        &[("format", "full")]
    } else {
        &[
            ("format", "metadata"),
            ("metadataHeaders", "From"),
            ("metadataHeaders", "To"),
            ("metadataHeaders", "Subject"),
            ("metadataHeaders", "Date"),
        ]
    };
    match google.get(ctx, &url, query).await {
        Ok(m) => Ok(Some(m)),
        Err(f) if f.status() == Some(404) => Ok(None),
        Err(f) => Err(f.into()),
    }
}

/// The facts of one message the items carry.
struct MailFacts {
    id: Value,
    thread_id: Value,
    label_ids: Value,
    snippet: Value,
    internal_date: Value,
    from: String,
    to: String,
    subject: String,
    date: String,
}

impl MailFacts {
    fn of(msg: &Value) -> MailFacts {
        let header = |name: &str| {
            msg.pointer("/payload/headers")
                .and_then(Value::as_array)
                .and_then(|hs| {
                    hs.iter().find(|h| {
                        h.get("name")
                            .and_then(Value::as_str)
                            .is_some_and(|n| n.eq_ignore_ascii_case(name))
                    })
                })
                .and_then(|h| h.get("value").and_then(Value::as_str))
                .unwrap_or_default()
                .to_string()
        };
        let field = |k: &str| msg.get(k).cloned().unwrap_or(Value::Null);
        MailFacts {
            id: field("id"),
            thread_id: field("threadId"),
            label_ids: field("labelIds"),
            snippet: field("snippet"),
            internal_date: field("internalDate"),
            from: header("From"),
            to: header("To"),
            subject: header("Subject"),
            date: header("Date"),
        }
    }

    fn message(&self) -> Message<'_> {
        Message {
            from: &self.from,
            to: &self.to,
            subject: &self.subject,
        }
    }

    fn item(&self) -> Item {
        let mut i = Map::new();
        i.insert("event_type".into(), Value::from("mail"));
        i.insert("id".into(), self.id.clone());
        i.insert("threadId".into(), self.thread_id.clone());
        i.insert("labelIds".into(), self.label_ids.clone());
        i.insert("from".into(), Value::from(self.from.clone()));
        i.insert("to".into(), Value::from(self.to.clone()));
        i.insert("subject".into(), Value::from(self.subject.clone()));
        i.insert("date".into(), Value::from(self.date.clone()));
        i.insert("internalDate".into(), self.internal_date.clone());
        i.insert("snippet".into(), self.snippet.clone());
        i
    }

    fn summary(&self) -> Value {
        json!({
            "id": self.id,
            "threadId": self.thread_id,
            "from": self.from,
            "subject": self.subject,
            "date": self.date,
            "snippet": self.snippet,
        })
    }
}

/// The first text/plain part of a `format=full` message, base64url-decoded and cut to
/// [`BODY_CHARS_MAX`].
fn plain_body(msg: &Value) -> String {
    fn find(part: &Value) -> Option<&str> {
        if part.get("mimeType").and_then(Value::as_str) == Some("text/plain")
            && let Some(d) = part.pointer("/body/data").and_then(Value::as_str)
        {
            return Some(d);
        }
        part.get("parts")
            .and_then(Value::as_array)?
            .iter()
            .find_map(find)
    }
    let b64 = base64::engine::GeneralPurpose::new(
        &base64::alphabet::URL_SAFE,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
    );
    msg.get("payload")
        .and_then(find)
        .and_then(|d| b64.decode(d).ok())
        .map(|b| {
            String::from_utf8_lossy(&b)
                .chars()
                .take(BODY_CHARS_MAX)
                .collect()
        })
        .unwrap_or_default()
}

fn load_rules(ctx: &Context) -> Result<Rules, ProcessorError> {
    let packs: Vec<String> = match ctx.settings().get("rule_packs") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| {
                v.as_str().map(str::to_string).ok_or_else(|| {
                    ProcessorError::permanent("setting rule_packs must be a list of pack names")
                })
            })
            .collect::<Result<_, _>>()?,
        Some(_) => {
            return Err(ProcessorError::permanent(
                "setting rule_packs must be a list of pack names",
            ));
        }
    };
    let own = match ctx.settings().get("rules") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(o)) => o.clone(),
        Some(_) => return Err(ProcessorError::permanent("setting rules must be a table")),
    };
    mailrules::load(ctx.bobbin_dir(), &packs, &own)
}

/// `{"tz", "horizon": {from, to}, "free_windows": [{start, end}]}` for the owner's primary
/// calendar over the horizon, windows of at least the minimum length.
async fn free_windows(
    google: &mut Google,
    ctx: &mut Context,
    owner: &str,
) -> Result<Value, ProcessorError> {
    let days = ctx
        .setting_i64("horizon_days")
        .unwrap_or(HORIZON_DAYS_DEFAULT)
        .clamp(1, HORIZON_DAYS_MAX);
    let min_minutes = ctx
        .setting_i64("min_window_minutes")
        .unwrap_or(MIN_WINDOW_MINUTES_DEFAULT)
        .max(1);
    let from = ctx.now().floor();
    let to = from + days as f64 * 86_400.0;
    let busy = google.busy(ctx, owner, from, to).await?;
    let windows = google::free_windows(busy, from, to, min_minutes as f64 * 60.0);
    Ok(json!({
        "tz": ctx.setting_str("tz").unwrap_or("UTC"),
        "horizon": {"from": google::rfc3339(from), "to": google::rfc3339(to)},
        "free_windows": windows
            .iter()
            .map(|(s, e)| json!({"start": google::rfc3339(*s), "end": google::rfc3339(*e)}))
            .collect::<Vec<_>>(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_push_history_is_the_newest_of_the_owners() {
        use base64::engine::general_purpose::STANDARD;
        let push = |mailbox: &str, h: &str| {
            let data = STANDARD.encode(format!(
                r#"{{"emailAddress":"{mailbox}","historyId":"{h}"}}"#
            ));
            json!({"message": {"data": data, "messageId": "1"}})
        };
        let (h, foreign) = pushed_history(
            &[
                push("o@example.com", "10"),
                push("O@example.com", "12"),
                push("x@example.com", "99"),
            ],
            "o@example.com",
        );
        assert_eq!((h, foreign), (Some(12), 1));
    }

    #[test]
    fn history_records_are_cut_only_between_records() {
        let mut a = Added::default();
        let ids: Vec<Value> = (0..MESSAGES_PER_BATCH_MAX - 1)
            .map(|i| json!({"message": {"id": format!("m{i}")}}))
            .collect();
        let page = json!({"history": [
            {"id": "100", "messagesAdded": ids},
            {"id": "101", "messagesAdded": [{"message": {"id": "a"}}, {"message": {"id": "b"}}]},
            {"id": "102", "messagesAdded": [{"message": {"id": "c"}}]},
        ]});
        a.page(&page).unwrap();
        assert_eq!(a.truncated_at, Some(101));
        assert_eq!(
            a.ids.len(),
            MESSAGES_PER_BATCH_MAX + 1,
            "record 101 kept whole"
        );
    }

    #[test]
    fn the_plain_body_is_found_in_nested_parts() {
        use base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let msg = json!({"payload": {"mimeType": "multipart/alternative", "parts": [
            {"mimeType": "text/html", "body": {"data": URL_SAFE_NO_PAD.encode("<p>x</p>")}},
            {"mimeType": "text/plain", "body": {"data": URL_SAFE_NO_PAD.encode("hello?")}},
        ]}});
        assert_eq!(plain_body(&msg), "hello?");
    }
}
