//! `hookspool bobbin new <vendor>.<product> --poll` (spec 14.4, 14.3.5): a new poll bobbin,
//! for a service that cannot push. Its poller is an exec poller (`poll.py`, Python 3, any
//! language would do) that watches one document at the `url` setting: it asks the runtime
//! for a conditional GET (If-None-Match / If-Modified-Since from the last answer, kept in
//! state), and announces one `changed` item whenever the document's content differs from
//! the last one it saw. Its captures are the kit's stub answers: a 200 that announces, then
//! a 304 that announces nothing. The documents and `[provider]` carry TODO placeholders the
//! kit reports, as `scaffold`'s do.
//!
//! Must not: write files (the CLI does, after this succeeded), or read anything.

use super::scaffold::ScaffoldError;
use crate::bobbins::name::BobbinName;

/// The poller's file in the new bobbin (written executable).
pub const POLL_EXECUTABLE: &str = "poll.py";
/// What the placeholders say; the kit's provider and todos rows look for it.
const TODO: &str = "TODO";
/// The example instance's document (a reserved example host, never a real one).
const EXAMPLE_URL: &str = "https://status.example.org/api/status.json";
/// The scaffold's period (the smallest a poll bobbin may have is 60 s).
const EVERY_S: u32 = 300;

/// The files of a new poll bobbin, relative to its `<vendor>/<product>/` directory.
pub fn scaffold_poll(name: &BobbinName) -> Result<Vec<(String, Vec<u8>)>, ScaffoldError> {
    super::scaffold::refuse_reserved(name)?;
    let i = name.product();
    Ok(vec![
        ("bobbin.toml".into(), manifest(name).into_bytes()),
        (POLL_EXECUTABLE.into(), POLLER.as_bytes().to_vec()),
        ("captures/kit.toml".into(), kit_file(name, i).into_bytes()),
        (
            "captures/poll-1-changed.json".into(),
            CAPTURE_CHANGED.as_bytes().to_vec(),
        ),
        (
            "captures/poll-2-not-modified.json".into(),
            CAPTURE_NOT_MODIFIED.as_bytes().to_vec(),
        ),
        ("README.md".into(), readme(name).into_bytes()),
        ("SETUP.md".into(), setup(name, i).into_bytes()),
        ("AGENTS.md".into(), agents(name, i).into_bytes()),
    ])
}

fn manifest(name: &BobbinName) -> String {
    format!(
        r#"name = "{name}"
version = "1"
summary = "{TODO}: what the provider's document tells when it changes, in one line"

# Polled: the provider offers no push (say why in no_push_note, and link where its
# documentation says so).
[provider]
vendor = "{TODO}"
product = "{TODO}"
homepage = "https://{TODO}"
api_docs = "https://{TODO}"
no_push_note = "{TODO}: why this service cannot push a change (no webhooks in its API)"
no_push_docs = "https://{TODO}"

# The exec poller: it asks the runtime for a conditional GET of `url` and announces a
# `changed` item when the document differs from the last one seen (its state).
[poll]
exec = "{POLL_EXECUTABLE}"
every_s = {EVERY_S}
timeout_s = 60
state = true

[settings.url]
description = "the https URL of the document to watch"
type = "string"
required = true

[outputs.changed]
description = "the document changed: its URL, the SHA-256 of its new content, its ETag and Last-Modified, and the text when it is at most 64 KiB"
"#
    )
}

fn kit_file(name: &BobbinName, i: &str) -> String {
    format!(
        "# The kit's instance: a document at an example host (the kit never fetches it: the poll\n# captures are its stub answers).\ninstance = \"{i}\"\n\n[bobbin]\nbobbin = \"{name}\"\nsettings = {{ url = \"{EXAMPLE_URL}\" }}\noutputs = {{ changed = \"hermes:{i}\" }}\n"
    )
}

fn frontmatter(name: &BobbinName) -> String {
    format!("---\nbobbin: {name}\nprovider: {TODO} {TODO}\napi_docs: https://{TODO}\n---\n")
}

fn config_table(name: &BobbinName, i: &str) -> String {
    format!(
        "```toml\n[bobbins.{i}]\nbobbin = \"{name}\"\nsettings = {{ url = \"{EXAMPLE_URL}\" }}\noutputs = {{ changed = \"hermes:{i}\" }}\n# every_s = {EVERY_S}    # optional, at least 60\n```\n"
    )
}

fn readme(name: &BobbinName) -> String {
    format!(
        "{fm}\n# {name}\n\n{TODO}: what this bobbin watches at the provider, in a sentence or two.\n\n## How it works\n\nThe provider cannot push, so the dispatcher's poll clock enqueues one tick every `every_s`\n(with jitter); the tick runs `{POLL_EXECUTABLE}`, an exec poller. It asks the runtime for a\nconditional GET of `url` (If-None-Match and If-Modified-Since from the last answer, kept in\nits state), and announces a `changed` item when the document's SHA-256 differs from the last\none seen. A 304 announces nothing. The runtime makes the request (its timeout, size cap and\nstatus mapping: an outage is retried, a refused credential holds the ticks as a config\nissue), so the poller has no network of its own.\n\n## Settings\n\nRequired: `url`, the https URL of the document to watch.\n\n## Outputs\n\n- `changed`: the document changed.\n\n## Limits\n\n{TODO}: how often the provider allows polling, and what a change the poller cannot see looks like.\n\n## Captures\n\n- `captures/poll-1-changed.json` and `captures/poll-2-not-modified.json`: constructed by\n  `hookspool bobbin new --poll`; {TODO}: replace them with real answers from the provider's\n  documentation (redacted) and say where each came from.\n",
        fm = frontmatter(name),
    )
}

fn setup(name: &BobbinName, i: &str) -> String {
    format!(
        "{fm}# Setting up {name}\n\nThere is nothing to create at the provider: the poller reads a document.\n\n1. {TODO}: find the document's https URL at the provider, and check it answers: `curl -sI <url>`.\n2. Add to /etc/hookspool/config.toml, setting `url` and mapping the output:\n\n{table}\n3. Run `hookspool check`, then `systemctl reload hookspool-intake` and reload the dispatcher.\n4. After `every_s`, check `hookspool status --json` for `polls.{i}` and `hookspool list --source {i}`.\n5. To roll back, remove the table and reload again; the state under `<home>/bobbins/{i}` can be deleted.\n",
        fm = frontmatter(name),
        table = config_table(name, i),
    )
}

fn agents(name: &BobbinName, i: &str) -> String {
    format!(
        "{fm}# {name}: setup for an agent\n\nThis bobbin changes nothing at the provider, so no step is outward.\n\n## Needs from the human\n\n- {TODO}: the document to watch (its `url`), and where its changes should go.\n\n## Steps\n\n1. Goal: the document's URL. Command: `curl -sI <URL>`. Check: a 200 (or 304) over https. If it fails: ask the human for the right URL.\n2. Goal: the config table. Command: add to `<CONFIG>`:\n\n{table}\n   Check: `hookspool check` exits 0; if not, fix the key it names.\n3. Goal: the first tick delivered. Command: reload both services, wait `every_s`, run `hookspool status --json`. Check: `polls.{i}.delivered_at` is set and `stale` is false. If it fails: `hookspool list --source {i}` and `hookspool show <batch>` give the poller's reason.\n",
        fm = frontmatter(name),
        table = config_table(name, i),
    )
}

/// The exec poller (the protocol is `processor::exec`'s, with `get`).
const POLLER: &str = r#"#!/usr/bin/env python3
"""The exec poller of a bobbin written by `hookspool bobbin new --poll`.

It reads one JSON document on stdin ({"batch", "instance", "bobbin", "settings", "state",
and "http": the answers to the GETs it asked for so far}) and prints one JSON document on
stdout: {"get": {"url", "headers"}} to have the runtime make a GET and run it again, or
{"items": [...], "state": {...}} when it is done. The runtime maps an outage to a retry
and a refused credential to a config issue before this program sees the answer.
"""
import hashlib
import json
import sys

TEXT_BYTES_MAX = 64 * 1024

doc = json.load(sys.stdin)
url = doc["settings"]["url"]
state = doc.get("state") or {}
answers = doc.get("http") or []

if not answers:
    headers = {}
    if state.get("etag"):
        headers["If-None-Match"] = state["etag"]
    if state.get("last_modified"):
        headers["If-Modified-Since"] = state["last_modified"]
    json.dump({"get": {"url": url, "headers": headers}}, sys.stdout)
    sys.exit(0)

answer = answers[-1]
if answer["status"] == 304:
    json.dump({"items": []}, sys.stdout)
    sys.exit(0)

text = answer.get("text") or ""
headers = answer.get("headers") or {}
digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
writes = {
    "etag": headers.get("etag"),
    "last_modified": headers.get("last-modified"),
    "sha256": digest,
}
items = []
if digest != state.get("sha256"):
    item = {
        "event_type": "changed",
        "url": url,
        "sha256": digest,
        "etag": headers.get("etag"),
        "last_modified": headers.get("last-modified"),
    }
    if len(text.encode("utf-8")) <= TEXT_BYTES_MAX:
        item["text"] = text
    items.append(item)
json.dump({"items": items, "state": writes}, sys.stdout)
"#;

const CAPTURE_CHANGED: &str = r#"{
  "description": "a 200 with the document (constructed by hookspool bobbin new --poll): the first content seen, so one changed item",
  "http": [
    {
      "status": 200,
      "text": "{\"status\": \"operational\"}\n",
      "headers": {
        "Content-Type": "application/json",
        "ETag": "\"v1\""
      }
    }
  ],
  "items": [
    {
      "event_type": "changed",
      "etag": "\"v1\"",
      "text": "{\"status\": \"operational\"}\n"
    }
  ]
}
"#;

const CAPTURE_NOT_MODIFIED: &str = r#"{
  "description": "a 304 to the conditional GET: the document has not changed since its ETag; nothing is emitted",
  "http": [
    {
      "status": 304,
      "text": "",
      "headers": {
        "ETag": "\"v1\""
      }
    }
  ],
  "items": []
}
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_poll_scaffold_is_a_poll_manifest_with_its_poller_and_two_captures() {
        let name = BobbinName::parse("acme.status").unwrap();
        let files = scaffold_poll(&name).unwrap();
        let names: Vec<&str> = files.iter().map(|(p, _)| p.as_str()).collect();
        assert!(names.contains(&POLL_EXECUTABLE), "{names:?}");
        assert!(names.contains(&"captures/poll-1-changed.json"), "{names:?}");
        let manifest = String::from_utf8(files[0].1.clone()).unwrap();
        let t: toml::Table = toml::from_str(&manifest).unwrap();
        assert_eq!(t["poll"]["exec"].as_str(), Some(POLL_EXECUTABLE));
        assert!(t.get("source").is_none() && t.get("processor").is_none());
        for (p, bytes) in &files {
            if p.ends_with(".json") {
                serde_json::from_slice::<serde_json::Value>(bytes)
                    .unwrap_or_else(|e| panic!("{p}: {e}"));
            }
        }
        let reserved = BobbinName::parse("hookspool.status").unwrap();
        assert!(scaffold_poll(&reserved).is_err());
    }
}
