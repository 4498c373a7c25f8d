//! `hookspool bobbin new <vendor>.<product>` (spec 14.3.2a "The scaffold", 14.3.5): a new
//! bobbin shaped like `hookspool.webhook`, with its settings frozen into a fixed `[source]
//! template` table.
//!
//! Owns: [`scaffold`], which turns a name and `--set NAME=VALUE` pairs into the files to
//! write: the example values of the chosen scheme (the settings of `hookspool.webhook`'s
//! `captures/schemes/<scheme>/kit.toml`, compiled into the binary) with each `--set` over
//! them (a value is TOML, or a bare string; an empty value removes the key), checked by the
//! template source before anything is returned; a value only the deployment knows
//! (`callback_url`, which a URL scheme's signature covers) kept as a required setting whose
//! example lives in the kit instance; an accepted and a rejected capture signed for the
//! scheme with the source kit (`kit::signer`), their `# expect:` lines read from the
//! source's own verdict; `captures/kit.toml`; and README.md, SETUP.md and AGENTS.md whose
//! `[provider]`-derived frontmatter and prose carry TODO placeholders (the kit's provider row
//! reports them as one problem, the todos row line by line). With `--processor`
//! ([`scaffold_with`]), also an exec processor ([`PROCESSOR_EXECUTABLE`], the protocol of
//! `processor::exec`) that turns each event of a batch into one `item`, the `[processor]`
//! table that runs it, and `item` as the bobbin's output in place of `"*"`.
//!
//! Must not: write files (the CLI does, after this succeeded), or read anything but the
//! embedded bobbins.

use std::collections::BTreeMap;

use toml::{Table, Value};

use crate::bobbins::embedded;
use crate::bobbins::name::BobbinName;
use crate::bobbins::template_keys::{self, TEMPLATE_KEYS};
use crate::kit::signer::{KIT_NOW, Kit};
use crate::sources::{self, Request, Verdict};

/// The scheme of a scaffold without `--set scheme=...`.
pub const DEFAULT_SCHEME: &str = "hmac-sha256-hex";
/// The template keys only the deployment knows: kept as required settings, not frozen.
const DEPLOYMENT_KEYS: &[&str] = &["callback_url"];
/// The host of the example instance's URL (a reserved example host, never a real one).
const EXAMPLE_HOST: &str = "hooks.example.org";
/// What the placeholders say; the kit's provider and todos rows look for it.
const TODO: &str = "TODO";
/// The exec processor's file in a `--processor` scaffold (written executable).
pub const PROCESSOR_EXECUTABLE: &str = "processor.py";
/// The event type a `--processor` scaffold's processor emits: its one output.
const PROCESSOR_OUTPUT: &str = "item";

/// A `--set` or scheme mistake, named by the key it concerns.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {message}")]
pub struct ScaffoldError {
    pub key: String,
    pub message: String,
}

fn err(key: &str, message: impl Into<String>) -> ScaffoldError {
    ScaffoldError {
        key: key.to_string(),
        message: message.into(),
    }
}

/// A new bobbin may not take core's `hookspool.` namespace (14.3.1); both scaffolds ask.
pub(super) fn refuse_reserved(name: &BobbinName) -> Result<(), ScaffoldError> {
    if !name.is_reserved() {
        return Ok(());
    }
    Err(err(
        &name.to_string(),
        format!(
            "the {} namespace is reserved for the bobbins shipped with hookspool; name it after the service's vendor, e.g. acme.{}",
            crate::bobbins::name::RESERVED_VENDOR,
            name.product()
        ),
    ))
}

/// A mistake in one `--set` (or in the scheme a `--set` chose).
fn set_err(key: &str, message: impl Into<String>) -> ScaffoldError {
    err(&format!("--set {key}"), message)
}

/// The files of a new bobbin, relative to its `<vendor>/<product>/` directory.
pub fn scaffold(
    name: &BobbinName,
    sets: &[(String, String)],
) -> Result<Vec<(String, Vec<u8>)>, ScaffoldError> {
    scaffold_with(name, sets, false)
}

/// [`scaffold`], with an exec processor when `processor` (`bobbin new --processor`).
pub fn scaffold_with(
    name: &BobbinName,
    sets: &[(String, String)],
    processor: bool,
) -> Result<Vec<(String, Vec<u8>)>, ScaffoldError> {
    refuse_reserved(name)?;
    let instance = name.product().to_string();
    let scheme = match sets.iter().rev().find(|(k, _)| k == "scheme") {
        Some((_, v)) => parse_value(v)
            .as_ref()
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| set_err("scheme", format!("write one of {}", schemes().join(", "))))?,
        None => DEFAULT_SCHEME.to_string(),
    };
    let example = scheme_example(&scheme)?;
    let mut values = example.settings;
    if let Some(Value::String(url)) = values.get_mut("callback_url") {
        *url = format!("https://{EXAMPLE_HOST}/hooks/{instance}");
    }
    for (k, v) in sets {
        if template_keys::template_key(k).is_none() {
            return Err(set_err(
                k,
                format!(
                    "not a template key; write one of {}",
                    TEMPLATE_KEYS
                        .iter()
                        .map(|t| t.name)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
        match parse_value(v) {
            None => {
                values.remove(k);
            }
            Some(value) => {
                values.insert(k.clone(), value);
            }
        }
    }
    // The template source's own checks, before anything is written.
    sources::build(&instance, "template", &values).map_err(|e| match e {
        sources::SourceConfigError::Invalid { key, message } => set_err(&key, message),
        other => set_err("scheme", other.to_string()),
    })?;
    let (fixed, deployment): (Table, Table) = values
        .into_iter()
        .partition(|(k, _)| !DEPLOYMENT_KEYS.contains(&k.as_str()));
    // A Standard Webhooks (or Stripe-style) secret has a format the scheme decodes: keep
    // the example's; any other is a made-up value named after the bobbin.
    let secret = if example.secret.starts_with("wh") {
        example.secret
    } else {
        format!("{}-{}-test-secret", name.vendor(), name.product())
    };
    let options = toml::to_string(&merged(&fixed, &deployment)).unwrap_or_default();
    let kit = Kit::template(&instance, &options, secret.as_bytes())
        .map_err(|e| set_err("scheme", e.to_string()))?;
    let body = example_body(&kit, &fixed);
    let headers = example_headers(&fixed);
    let with_headers = |mut r: Request| {
        for (k, v) in &headers {
            r = r.with_header(k, v);
        }
        r
    };
    let accepted = with_headers(kit.signed(&body, KIT_NOW));
    let rejected = with_headers(kit.wrong_secret(&body, KIT_NOW));
    let timestamped = kit.flags.has_timestamp;
    let s = Scaffold {
        name,
        instance: &instance,
        scheme: &scheme,
        fixed: &fixed,
        deployment: &deployment,
        processor,
    };
    let mut files = vec![
        ("bobbin.toml".into(), s.manifest().into_bytes()),
        (
            "captures/accepted.http".into(),
            capture(&accepted, &kit, timestamped, true).into_bytes(),
        ),
        (
            "captures/rejected.http".into(),
            capture(&rejected, &kit, timestamped, false).into_bytes(),
        ),
        ("captures/kit.toml".into(), s.kit_file(&secret).into_bytes()),
        ("README.md".into(), s.readme().into_bytes()),
        ("SETUP.md".into(), s.setup().into_bytes()),
        ("AGENTS.md".into(), s.agents().into_bytes()),
    ];
    if processor {
        files.push((PROCESSOR_EXECUTABLE.into(), PROCESSOR.as_bytes().to_vec()));
    }
    Ok(files)
}

/// A `--set` value: TOML, else a bare string; empty removes the key (`None`).
fn parse_value(text: &str) -> Option<Value> {
    if text.is_empty() {
        return None;
    }
    let v = toml::from_str::<Table>(&format!("v = {text}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| Value::String(text.to_string()));
    (!template_keys::is_unset(&v)).then_some(v)
}

/// The schemes `hookspool.webhook` has an example for.
fn schemes() -> Vec<String> {
    let prefix = "hookspool/webhook/captures/schemes/";
    let mut out: Vec<String> = embedded::FILES
        .iter()
        .filter_map(|(p, _)| p.strip_prefix(prefix)?.strip_suffix("/kit.toml"))
        .filter(|s| crate::sources::template::SCHEMES.contains(s))
        .map(str::to_string)
        .collect();
    out.sort();
    out
}

struct Example {
    settings: Table,
    secret: String,
}

/// The example settings and test secret of a scheme: `hookspool.webhook`'s kit for it.
fn scheme_example(scheme: &str) -> Result<Example, ScaffoldError> {
    let rel = format!("hookspool/webhook/captures/schemes/{scheme}/kit.toml");
    let text = embedded::file(&rel)
        .map(String::from_utf8_lossy)
        .ok_or_else(|| set_err("scheme", format!("{scheme:?} is not a scheme hookspool.webhook has an example for; write one of {}", schemes().join(", "))))?;
    let kit = super::capture::KitFile::parse(&rel, &text).map_err(|f| {
        set_err(
            "scheme",
            format!("the embedded example does not parse ({f}); a build bug"),
        )
    })?;
    let settings = kit
        .bobbin
        .get("settings")
        .and_then(Value::as_table)
        .cloned()
        .unwrap_or_default();
    let secret = kit.secrets.get("secret").cloned().unwrap_or_default();
    Ok(Example { settings, secret })
}

fn merged(a: &Table, b: &Table) -> Table {
    let mut t = a.clone();
    t.extend(b.clone());
    t
}

/// The selectors of the frozen table (key, dedup, event_type, attrs), as (where, name).
fn selectors(fixed: &Table) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut one = |v: &Value| {
        if let Some(s) = v.as_str()
            && let Some((kind, path)) = s.split_once('.')
        {
            out.push((kind.to_string(), path.to_string()));
        }
    };
    for k in ["key", "dedup", "event_type"] {
        match fixed.get(k) {
            Some(Value::Array(a)) => a.iter().for_each(&mut one),
            Some(v) => one(v),
            None => {}
        }
    }
    if let Some(Value::Table(attrs)) = fixed.get("attrs") {
        attrs.values().for_each(&mut one);
    }
    out
}

/// The example value of a selected field: `example.created` for the event type, else
/// `example-<field>`.
fn example_value(fixed: &Table, kind: &str, path: &str) -> String {
    let is_event =
        fixed.get("event_type").and_then(Value::as_str) == Some(&format!("{kind}.{path}"));
    if is_event {
        "example.created".into()
    } else {
        format!("example-{}", path.replace('.', "-").to_ascii_lowercase())
    }
}

/// A body every payload selector finds a value in: JSON, or a form for a form scheme.
fn example_body(kit: &Kit, fixed: &Table) -> Vec<u8> {
    let fields: Vec<(String, String)> = selectors(fixed)
        .into_iter()
        .filter(|(kind, _)| kind == "payload")
        .map(|(kind, path)| {
            let v = example_value(fixed, &kind, &path);
            (path, v)
        })
        .collect();
    if kit.content_type != "application/json" {
        // The form scheme (hmac-sha1-base64-url-form): the signature covers its parameters.
        let mut pairs: Vec<String> = fields
            .iter()
            .map(|(k, v)| format!("{}={}", form_escape(k), form_escape(v)))
            .collect();
        pairs.push("Body=example".into());
        return pairs.join("&").into_bytes();
    }
    let mut doc = serde_json::Map::new();
    for (path, v) in fields {
        insert_path(&mut doc, &path, v);
    }
    serde_json::Value::Object(doc).to_string().into_bytes()
}

fn insert_path(doc: &mut serde_json::Map<String, serde_json::Value>, path: &str, v: String) {
    let mut parts = path.split('.').peekable();
    let mut cur = doc;
    while let Some(p) = parts.next() {
        if parts.peek().is_none() {
            cur.insert(p.to_string(), serde_json::Value::String(v));
            return;
        }
        let next = cur
            .entry(p.to_string())
            .or_insert_with(|| serde_json::Value::Object(serde_json::Map::new()));
        if !next.is_object() {
            *next = serde_json::Value::Object(serde_json::Map::new());
        }
        match next {
            serde_json::Value::Object(m) => cur = m,
            _ => return,
        }
    }
}

fn form_escape(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            b' ' => "+".into(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Headers the selectors read (`header.X-Name`), with example values.
fn example_headers(fixed: &Table) -> Vec<(String, String)> {
    selectors(fixed)
        .into_iter()
        .filter(|(kind, _)| kind == "header")
        .map(|(kind, name)| {
            let v = example_value(fixed, &kind, &name);
            (name, v)
        })
        .collect()
}

/// A capture file for `req`: directives read from the source's verdict, then the request.
fn capture(req: &Request, kit: &Kit, timestamped: bool, accepted: bool) -> String {
    let mut out = String::from(
        "# source: constructed by `hookspool bobbin new` for the example instance: the example body, signed with the test secret in captures/kit.toml; replace it with a real delivery from the provider's documentation (redacted) and say where it came from\n",
    );
    if timestamped {
        out.push_str(&format!("# at: {}\n", KIT_NOW as i64));
    }
    match sources::evaluate(kit.source.as_ref(), req, &kit.secrets) {
        Verdict::Accept(a) if accepted => {
            out.push_str("# expect: verdict = \"accepted\"\n# expect: status = 200\n");
            out.push_str(&format!("# expect: key = {}\n", quoted(&a.key)));
            out.push_str(&format!(
                "# expect: event_type = {}\n",
                quoted(&a.event_type)
            ));
            if let Some(d) = &a.dedup_id {
                out.push_str(&format!("# expect: dedup_id = {}\n", quoted(d)));
            }
            for (k, v) in &a.attrs {
                out.push_str(&format!("# expect: attrs.{k} = {}\n", quoted(v)));
            }
        }
        _ => out.push_str("# expect: verdict = \"unauthorized\"\n# expect: status = 401\n"),
    }
    let mut target = req.path.clone();
    if !req.query.is_empty() {
        let q: Vec<String> = req
            .query
            .iter()
            .map(|(k, v)| format!("{}={}", form_escape(k), form_escape(v)))
            .collect();
        target = format!("{target}?{}", q.join("&"));
    }
    out.push_str(&format!(
        "{} {target} HTTP/1.1\nHost: {EXAMPLE_HOST}\n",
        req.method
    ));
    for (k, v) in &req.headers {
        out.push_str(&format!("{k}: {v}\n"));
    }
    out.push_str(&format!("Content-Length: {}\n\n", req.body.len()));
    out.push_str(&String::from_utf8_lossy(&req.body));
    out
}

fn quoted(s: &str) -> String {
    Value::String(s.to_string()).to_string()
}

/// What the documents and the manifest are written from.
struct Scaffold<'a> {
    name: &'a BobbinName,
    instance: &'a str,
    scheme: &'a str,
    fixed: &'a Table,
    deployment: &'a Table,
    /// An exec processor makes the bobbin's items (`--processor`).
    processor: bool,
}

impl Scaffold<'_> {
    fn manifest(&self) -> String {
        let template = inline(self.fixed);
        let mut out = format!(
            r#"name = "{name}"
version = "1"
summary = "{TODO}: what the provider's webhooks tell, in one line"

[provider]
vendor = "{TODO}"
product = "{TODO}"
homepage = "https://{TODO}"
webhook_docs = "https://{TODO}"
signature_docs = "https://{TODO}"

[source]
template = {template}
span = "immediate"
proxy = "pass the body byte for byte (the signature covers it)"

[secrets.secret]
description = "the signing secret or shared token the provider shows for the webhook"
"#,
            name = self.name
        );
        for k in self.deployment.keys() {
            out.push_str(&format!(
                "\n[settings.{k}]\ndescription = \"{}\"\ntype = \"string\"\nrequired = true\n",
                deployment_description(k)
            ));
        }
        if self.processor {
            out.push_str(&format!(
                "\n# The exec processor: each delivered batch goes to it on stdin; its items are the\n# bobbin's outputs (see {PROCESSOR_EXECUTABLE}).\n[processor]\nexec = \"{PROCESSOR_EXECUTABLE}\"\ntimeout_s = 60\nstate = false\n\n[outputs.{PROCESSOR_OUTPUT}]\ndescription = \"{TODO}: what one item tells (the processor makes one per event)\"\n"
            ));
        } else {
            out.push_str("\n[outputs.\"*\"]\ndescription = \"every accepted delivery\"\n");
        }
        out
    }

    /// The instance's `outputs` table: every delivery, or the processor's items.
    fn outputs(&self) -> String {
        if self.processor {
            format!("{{ {PROCESSOR_OUTPUT} = \"hermes:{}\" }}", self.instance)
        } else {
            format!("{{ \"*\" = \"hermes:{}\" }}", self.instance)
        }
    }

    fn settings_inline(&self) -> String {
        if self.deployment.is_empty() {
            String::new()
        } else {
            format!("settings = {}\n", inline(self.deployment))
        }
    }

    fn kit_file(&self, secret: &str) -> String {
        format!(
            "instance = \"{i}\"\n\n[bobbin]\nbobbin = \"{n}\"\n{settings}outputs = {outputs}\n\n[secrets]\n# A made-up test value (the example captures are signed with it), never a real secret.\nsecret = {secret}\n",
            i = self.instance,
            n = self.name,
            settings = self.settings_inline(),
            outputs = self.outputs(),
            secret = quoted(secret),
        )
    }

    fn frontmatter(&self) -> String {
        format!(
            "---\nbobbin: {}\nprovider: {TODO} {TODO}\nwebhook_docs: https://{TODO}\n---\n",
            self.name
        )
    }

    /// The `[bobbins.<instance>]` table the documents show.
    fn config_table(&self) -> String {
        // The example values load as they are; the comment says what to write instead.
        let settings = if self.deployment.is_empty() {
            String::new()
        } else {
            let mut shown = self.deployment.clone();
            if let Some(Value::String(url)) = shown.get_mut("callback_url") {
                *url = format!("https://{EXAMPLE_HOST}/hooks/{}", self.instance);
            }
            format!(
                "# settings: {}; write your own values\nsettings = {}\n",
                self.required_settings_note(),
                inline(&shown)
            )
        };
        format!(
            "```toml\n[bobbins.{i}]\nbobbin = \"{n}\"\nsecrets.secret = {{ file = \"/etc/hookspool/secrets/{i}_secret\" }}\n{settings}outputs = {outputs}\n```\n",
            i = self.instance,
            n = self.name,
            outputs = self.outputs(),
        )
    }

    fn required_settings_note(&self) -> String {
        self.deployment
            .keys()
            .map(|k| format!("`{k}` ({})", deployment_description(k)))
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn readme(&self) -> String {
        let settings = if self.deployment.is_empty() {
            "None: every template key is fixed in bobbin.toml.".to_string()
        } else {
            format!("Required: {}.", self.required_settings_note())
        };
        let (processing, outputs) = if self.processor {
            (
                format!(
                    " Each delivered batch then goes to\n`{PROCESSOR_EXECUTABLE}`, an exec processor run by the processor runtime in the dispatcher's\nsandbox: the batch document on stdin, one JSON answer on stdout, one `{PROCESSOR_OUTPUT}` per event."
                ),
                format!("- `{PROCESSOR_OUTPUT}`: one per event, made by `{PROCESSOR_EXECUTABLE}`."),
            )
        } else {
            (
                String::new(),
                "- `\"*\"`: every accepted delivery.".to_string(),
            )
        };
        format!(
            "{fm}\n# {n}\n\n{TODO}: what this bobbin receives from the provider, in a sentence or two.\n\n## How it works\n\nThe template source verifies each delivery with the `{scheme}` scheme and the secret\n`secret`; its fixed template table in bobbin.toml says which header carries the signature\nand which fields are the coalescing key, the delivery id and the event type.{processing}\n\n## Settings\n\n{settings}\n\n## Outputs\n\n{outputs}\n\n## Limits\n\n{TODO}: what the provider does not send, and whether it retries a failed delivery.\n\n## Captures\n\n- `captures/accepted.http` and `captures/rejected.http`: constructed by `hookspool bobbin new`\n  for the example instance; {TODO}: replace them with real deliveries from the provider's\n  documentation (redacted) and say where each came from.\n",
            fm = self.frontmatter(),
            n = self.name,
            scheme = self.scheme,
        )
    }

    fn setup(&self) -> String {
        let settings = if self.deployment.is_empty() {
            String::new()
        } else {
            format!(
                "   Set {} in the table below.\n",
                self.required_settings_note()
            )
        };
        format!(
            "{fm}# Setting up {n}\n\n1. {TODO}: at the provider, create a webhook to `https://<your host>/hooks/{i}` and copy its\n   signing secret to `/etc/hookspool/secrets/{i}_secret` (mode 0600, owned by hookspool):\n   that file is `secrets.secret`.\n{settings}2. Add to /etc/hookspool/config.toml:\n\n{table}\n3. Run `hookspool check`, then `systemctl reload hookspool-intake`.\n4. Send a test delivery from the provider and check `hookspool list --source {i}`.\n5. To roll back, remove the table and reload again.\n",
            fm = self.frontmatter(),
            n = self.name,
            i = self.instance,
            table = self.config_table(),
        )
    }

    fn agents(&self) -> String {
        let settings = if self.deployment.is_empty() {
            String::new()
        } else {
            format!("- The values of {}.\n", self.required_settings_note())
        };
        format!(
            "{fm}# {n}: setup for an agent\n\n## Needs from the human\n\n- {TODO}: access to the provider's webhook settings (a person creates the webhook).\n- The signing secret, written by the person to `/etc/hookspool/secrets/{i}_secret`\n  (`secrets.secret`); never read or print it.\n{settings}\n## Steps\n\n1. (outward) Goal: the provider sends to `https://<HOST>/hooks/{i}`. Ask the human to\n   create the webhook; check that the secret file exists; if not, stop and ask.\n2. Goal: hookspool knows the instance. Add this table to `<CONFIG>`:\n\n{table}\n   Check: `hookspool check` exits 0; if not, fix the key it names.\n3. Goal: deliveries arrive. Run `systemctl reload hookspool-intake`, have a test delivery\n   sent, and check `hookspool list --source {i}`; if nothing arrives, check the proxy and\n   `hookspool source test {i} --request <CAPTURE>`.\n",
            fm = self.frontmatter(),
            n = self.name,
            i = self.instance,
            table = self.config_table(),
        )
    }
}

/// The exec processor of a `--processor` scaffold (the protocol is `processor::exec`'s).
const PROCESSOR: &str = r#"#!/usr/bin/env python3
"""The exec processor of a bobbin written by `hookspool bobbin new --processor`.

The processor runtime runs it once per delivered batch, in the dispatcher's sandbox (no
network, no spool, no other secrets). It reads one JSON document on stdin ({"batch": the
batch document, with "events" the payloads oldest first; "instance", "bobbin", "settings",
"state"}) and prints one JSON document on stdout: {"items": [{"event_type": "item", ...}],
"state": {"name": value}} (state holds the writes, a null deletes a name; both optional).
Nothing else may reach stdout; write the reason for a failure to stderr. Exit 0 when done,
65 when this batch can never succeed, 78 when the operator must act (a credential, a
grant), anything else (75) to have the batch retried.

Each event becomes one "item" here. Make an item what its consumer needs, not the whole
event, and declare each event_type you emit under [outputs] in bobbin.toml.
"""
import json
import sys

doc = json.load(sys.stdin)
items = []
for event in doc["batch"]["events"]:
    items.append({"event_type": "item", "event": event})
json.dump({"items": items}, sys.stdout)
"#;

fn deployment_description(key: &str) -> &'static str {
    match key {
        "callback_url" => "the URL the signature covers, exactly as registered with the provider",
        _ => "a value only the deployment knows",
    }
}

/// A table as one inline TOML table, keys in order.
fn inline(t: &Table) -> String {
    let parts: BTreeMap<&String, String> = t.iter().map(|(k, v)| (k, inline_value(v))).collect();
    format!(
        "{{ {} }}",
        parts
            .iter()
            .map(|(k, v)| format!("{k} = {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

fn inline_value(v: &Value) -> String {
    match v {
        Value::Table(t) => inline(t),
        Value::Array(a) => format!(
            "[{}]",
            a.iter().map(inline_value).collect::<Vec<_>>().join(", ")
        ),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scaffold_value_is_toml_or_a_bare_string() {
        assert_eq!(
            parse_value("[\"a\", \"b\"]"),
            Some(Value::Array(vec!["a".into(), "b".into()]))
        );
        assert_eq!(parse_value("true"), Some(Value::Boolean(true)));
        assert_eq!(
            parse_value("X-Acme-Signature"),
            Some("X-Acme-Signature".into())
        );
        assert_eq!(parse_value("sha256="), Some("sha256=".into()));
    }

    #[test]
    fn scaffold_empty_value_removes_the_key() {
        assert_eq!(parse_value(""), None);
        assert_eq!(parse_value("[]"), None);
        let name = BobbinName::parse("acme.widgets").unwrap();
        let files = scaffold(&name, &[("dedup".into(), String::new())]).unwrap();
        let manifest = String::from_utf8(files[0].1.clone()).unwrap();
        assert!(!manifest.contains("dedup"), "{manifest}");
    }

    #[test]
    fn scaffold_checks_every_value_with_the_template_source_first() {
        let name = BobbinName::parse("acme.widgets").unwrap();
        let e = scaffold(
            &name,
            &[
                ("scheme".into(), "static-token".into()),
                ("header".into(), String::new()),
            ],
        )
        .unwrap_err();
        assert!(e.to_string().starts_with("--set "), "{e}");
        let e = scaffold(&name, &[("owner".into(), "x".into())]).unwrap_err();
        assert_eq!(e.key, "--set owner");
    }

    #[test]
    fn scaffold_captures_verify_with_the_kit_secret() {
        let name = BobbinName::parse("acme.widgets").unwrap();
        for scheme in schemes() {
            let files = scaffold(&name, &[("scheme".into(), scheme.clone())]).unwrap();
            let get = |p: &str| {
                String::from_utf8(files.iter().find(|(f, _)| f == p).unwrap().1.clone()).unwrap()
            };
            assert!(
                get("captures/accepted.http").contains("# expect: verdict = \"accepted\""),
                "{scheme}"
            );
            assert!(
                get("captures/rejected.http").contains("# expect: verdict = \"unauthorized\""),
                "{scheme}"
            );
        }
    }
}
