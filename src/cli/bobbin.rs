//! `hookspool bobbin list | show | expand | new | check` (spec 14.3.5): the bobbins found
//! (built-in, then each `spool.bobbin_path` directory), one bobbin's manifest, what the
//! config's instances expand to, a new bobbin's scaffold, and the conformance scorecard of
//! one directory (text, Markdown or JSON).
//!
//! The config file is read only for `spool.bobbin_path` and which instances use which
//! bobbin, from its raw TOML, so these commands work before a config is complete. Nothing
//! here prints a secret's value: manifests hold none, and kit test values are never shown.
//! `bobbin expand` shows what the config's instances expand to (the loader's own
//! expansion), with HOOKSPOOL_SECRET_REFS by name only.

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::{Args, Subcommand, ValueEnum};
use serde_json::json;

use super::{Ctx, EXIT_CONFIG, EXIT_NOT_FOUND, EXIT_USAGE, Exit};
use crate::bobbins::catalog::{Catalog, Entry};
use crate::bobbins::manifest::{Body, OutputKey, SourceImpl};
use crate::bobbins::{Finding, embedded, expand_config, expand_instance};
use crate::kit::{self, KitOptions, Row, Scorecard, Status};
use crate::processor::mailrules::{self, PackSummary};

#[derive(Debug, Args)]
pub struct BobbinArgs {
    #[command(subcommand)]
    pub action: BobbinAction,
}

#[derive(Debug, Subcommand)]
pub enum BobbinAction {
    /// The bobbins found: built-in, then each spool.bobbin_path directory.
    List {
        /// The catalogue as a Markdown table (bobbins/README.md holds its output).
        #[arg(long)]
        markdown: bool,
    },
    /// One bobbin's provider, secrets, settings, outputs and source.
    Show {
        /// <vendor>.<product>, e.g. github.repo
        name: String,
    },
    /// The tables the config's [bobbins.*] instances expand to (secret references as
    /// references, HOOKSPOOL_SECRET_REFS by name only).
    Expand {
        /// One instance (default: every one).
        instance: Option<String>,
    },
    /// Write a new bobbin shaped like hookspool.webhook, its settings frozen into a fixed
    /// template, with signed captures and documents to fill in (the TODO placeholders);
    /// with --processor, also an exec processor that makes its items; with --poll, a poll
    /// bobbin whose exec poller watches one document.
    New {
        /// <vendor>.<product>, e.g. acme.widgets
        name: String,
        /// The root to write <vendor>/<product>/ under.
        #[arg(long, value_name = "D", default_value = ".")]
        dir: PathBuf,
        /// A poll bobbin (spec 14.4) for a service that cannot push: `[poll]` with an exec
        /// poller (poll.py) and poll captures, in place of `[source]`.
        #[arg(long, conflicts_with_all = ["set", "processor", "code"])]
        poll: bool,
        /// Also an exec processor (processor.py, any language would do) run on each
        /// delivered batch; its items are the bobbin's outputs.
        #[arg(long)]
        processor: bool,
        /// A source written as code instead of the template. This build has none (a
        /// bobbin's source is the template, or a source compiled into hookspool); the
        /// command says what to do instead.
        #[arg(long)]
        code: bool,
        /// A template key's value over the scheme's example (TOML, or a bare string; an
        /// empty value removes the key), e.g. --set header=X-Acme-Signature.
        #[arg(long = "set", value_name = "NAME=VALUE")]
        set: Vec<String>,
    },
    /// Run the conformance kit on one bobbin directory and print its scorecard.
    Check {
        /// The bobbin's directory, <root>/<vendor>/<product>.
        dir: PathBuf,
        /// text, md or json.
        #[arg(long, value_enum, default_value_t = Report::Text)]
        report: Report,
        /// Advisory rows that do not pass fail the run too.
        #[arg(long)]
        strict: bool,
        /// Compare the checkout with this git ref for the scope row.
        #[arg(long, value_name = "REF")]
        base: Option<String>,
        /// Fetch each provider page for the advisory provider-links row (HEAD, then GET;
        /// 10 s; redirects followed).
        #[arg(long)]
        online: bool,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Report {
    Text,
    Md,
    Json,
}

pub fn run(ctx: &Ctx, a: BobbinArgs) -> Result<(), Exit> {
    let found = Found::read(ctx);
    match a.action {
        BobbinAction::List { markdown } => list(ctx, &found, markdown),
        BobbinAction::Show { name } => show(ctx, &found, &name),
        BobbinAction::Expand { instance } => expand(ctx, &found, instance.as_deref()),
        BobbinAction::New {
            name,
            dir,
            poll,
            processor,
            code,
            set,
        } => {
            if code {
                return Err(Exit::new(EXIT_USAGE, CODE_ADVICE));
            }
            new(ctx, &name, &dir, poll, processor, &set)
        }
        BobbinAction::Check {
            dir,
            report,
            strict,
            base,
            online,
        } => check(
            ctx,
            &found,
            &dir,
            report,
            strict,
            KitOptions { base, online },
        ),
    }
}

/// The catalogue and which instances use each bobbin, from the config file's raw TOML.
struct Found {
    catalog: Catalog,
    instances: BTreeMap<String, Vec<String>>,
    /// The config file's root table (empty when it is absent or not TOML).
    root: toml::Table,
}

impl Found {
    fn read(ctx: &Ctx) -> Found {
        let (path, _) = ctx.inputs.config_path();
        let raw: Option<toml::Table> = std::fs::read_to_string(&path)
            .ok()
            .and_then(|t| match toml::from_str(&t) {
                Ok(v) => Some(v),
                Err(_) => {
                    eprintln!(
                        "warning: {} is not valid TOML; listing the built-in bobbins only (hookspool check shows the error)",
                        path.display()
                    );
                    None
                }
            });
        let raw = raw.unwrap_or_default();
        let bobbin_path: Vec<PathBuf> = raw
            .get("spool")
            .and_then(|s| s.get("bobbin_path"))
            .and_then(|p| p.as_array())
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str())
                    .map(PathBuf::from)
                    .collect()
            })
            .unwrap_or_default();
        let mut instances: BTreeMap<String, Vec<String>> = BTreeMap::new();
        if let Some(b) = raw.get("bobbins").and_then(|b| b.as_table()) {
            for (instance, t) in b {
                if let Some(name) = t.get("bobbin").and_then(|v| v.as_str()) {
                    instances
                        .entry(name.to_string())
                        .or_default()
                        .push(instance.clone());
                }
            }
        }
        let catalog = Catalog::load(&bobbin_path);
        for p in catalog.problems() {
            eprintln!("warning: {p}");
        }
        Found {
            catalog,
            instances,
            root: raw,
        }
    }
}

/// What `bobbin expand` shows for HOOKSPOOL_SECRET_REFS: the secret names, each with this
/// in place of its reference (the env value is JSON, name -> reference).
pub const SECRET_REF_SHOWN: &str = "<reference>";

/// `bobbin expand [<i>]` (spec 14.3.3): each instance's `[sources.<i>]`,
/// `[destinations."script:<i>"]` and generated `[[routes]]`, exactly as the config loader
/// sees them, except that HOOKSPOOL_SECRET_REFS names its secrets only. Secret references
/// stay references (a file path, an env name): no secret is read, so none can be printed.
fn expand(ctx: &Ctx, found: &Found, only: Option<&str>) -> Result<(), Exit> {
    let (path, _) = ctx.inputs.config_path();
    let file = path.display().to_string();
    let Some(bobbins) = found.root.get("bobbins").and_then(|b| b.as_table()) else {
        return Err(Exit::new(
            EXIT_NOT_FOUND,
            format!(
                "{file}: no [bobbins.<instance>] tables; add one, e.g. [bobbins.github] with bobbin = \"github.repo\""
            ),
        ));
    };
    if let Some(i) = only
        && !bobbins.contains_key(i)
    {
        return Err(Exit::new(
            EXIT_NOT_FOUND,
            format!(
                "{file}: no [bobbins.{i}]; the instances are {}",
                bobbins.keys().cloned().collect::<Vec<_>>().join(", ")
            ),
        ));
    }
    let home = crate::config::fallback(&ctx.inputs).home;
    if let Err(errors) = expand_config(&found.root, &found.catalog, &home) {
        for e in &errors {
            eprintln!("error: {file}: {e}");
        }
        return Err(Exit::new(
            EXIT_CONFIG,
            format!(
                "{file}: {} instance error(s); nothing expanded",
                errors.len()
            ),
        ));
    }
    let mut shown = toml::Table::new();
    let mut json_rows = serde_json::Map::new();
    let mut text = String::new();
    for (instance, table) in bobbins {
        if only.is_some_and(|i| i != instance) {
            continue;
        }
        let e = expand_instance(instance, table, &found.catalog, &found.root, &home).map_err(
            |errors| {
                Exit::new(
                    EXIT_CONFIG,
                    errors
                        .iter()
                        .map(|e| format!("{file}: {e}"))
                        .collect::<Vec<_>>()
                        .join("; "),
                )
            },
        )?;
        let tables = expansion_tables(e);
        text.push_str(&format!(
            "# [bobbins.{instance}] (bobbin = \"{}\") expands to:\n{}\n",
            table.get("bobbin").and_then(|b| b.as_str()).unwrap_or(""),
            toml::to_string(&tables).unwrap_or_default()
        ));
        json_rows.insert(
            instance.clone(),
            serde_json::to_value(&tables).unwrap_or_default(),
        );
        shown.insert(instance.clone(), toml::Value::Table(tables));
    }
    if ctx.json {
        ctx.print_json(&serde_json::Value::Object(json_rows));
    } else {
        ctx.say(text.trim_end());
    }
    Ok(())
}

/// One expansion as the tables a config file would hold, HOOKSPOOL_SECRET_REFS by name.
fn expansion_tables(e: crate::bobbins::Expansion) -> toml::Table {
    let mut out = toml::Table::new();
    let mut sources = toml::Table::new();
    sources.insert(e.instance.clone(), toml::Value::Table(e.source));
    out.insert("sources".into(), toml::Value::Table(sources));
    if let Some(mut d) = e.destination {
        if let Some(toml::Value::Table(env)) = d.get_mut("env")
            && let Some(toml::Value::String(refs)) = env.get_mut("HOOKSPOOL_SECRET_REFS")
        {
            *refs = secret_ref_names(refs);
        }
        let mut destinations = toml::Table::new();
        destinations.insert(
            crate::bobbins::Expansion::script_name(&e.instance),
            toml::Value::Table(d),
        );
        out.insert("destinations".into(), toml::Value::Table(destinations));
    }
    if !e.routes.is_empty() {
        out.insert(
            "routes".into(),
            toml::Value::Array(e.routes.into_iter().map(toml::Value::Table).collect()),
        );
    }
    out
}

/// `{"cred":{"file":"..."}}` -> `{"cred":"<reference>"}`: the names, never the references.
fn secret_ref_names(json: &str) -> String {
    let names: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(json)
            .unwrap_or_default()
            .keys()
            .map(|k| (k.clone(), json!(SECRET_REF_SHOWN)))
            .collect();
    serde_json::Value::Object(names).to_string()
}

/// `bobbin new --code` (spec 14.3.5: "a source.py instead of the template"): the Rust
/// build has no source modules (RUST-ADAPTATION: a source is built in, or the template;
/// `module = ...` is refused by check), so it says what covers the need instead.
const CODE_ADVICE: &str = "--code: this build runs no source code of a bobbin's own (a source is the template source, or one compiled into hookspool); describe the sender's signature with --set (scheme, header, prefix, key, dedup, event_type, attrs: hookspool bobbin new <vendor>.<product> --set scheme=hmac-sha256-hex ...), and add --processor for code that runs on each delivered batch (an executable in any language, in the dispatcher's sandbox); a sender no scheme covers needs a built-in source (src/sources/)";

/// `bobbin new <vendor>.<product>` (spec 14.3.2a, 14.3.5): the scaffold's files under
/// `<dir>/<vendor>/<product>/`, written only when every `--set` passed the template
/// source's checks and the directory does not exist yet.
fn new(
    ctx: &Ctx,
    name: &str,
    dir: &std::path::Path,
    poll: bool,
    processor: bool,
    sets: &[String],
) -> Result<(), Exit> {
    let bobbin = crate::bobbins::BobbinName::parse(name).map_err(|e| {
        Exit::new(
            EXIT_USAGE,
            format!("{name}: {e}; write <vendor>.<product>, e.g. acme.widgets"),
        )
    })?;
    let pairs = sets
        .iter()
        .map(|s| {
            s.split_once('=')
                .map(|(k, v)| (k.trim().to_string(), v.to_string()))
                .ok_or_else(|| {
                    Exit::new(
                        EXIT_USAGE,
                        format!("--set {s}: write NAME=VALUE, e.g. --set header=X-Acme-Signature"),
                    )
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let (files, executables) = if poll {
        let files = crate::kit::scaffold_poll::scaffold_poll(&bobbin)
            .map_err(|e| Exit::new(EXIT_CONFIG, e.to_string()))?;
        (files, vec![crate::kit::scaffold_poll::POLL_EXECUTABLE])
    } else {
        let files = crate::kit::scaffold::scaffold_with(&bobbin, &pairs, processor)
            .map_err(|e| Exit::new(EXIT_CONFIG, e.to_string()))?;
        let executables = if processor {
            vec![crate::kit::scaffold::PROCESSOR_EXECUTABLE]
        } else {
            Vec::new()
        };
        (files, executables)
    };
    let target = dir.join(bobbin.rel_dir());
    if target.exists() {
        return Err(Exit::new(
            EXIT_CONFIG,
            format!(
                "{} exists already; remove it or give another --dir (nothing was written)",
                target.display()
            ),
        ));
    }
    let borrowed: Vec<(&str, &[u8])> = files
        .iter()
        .map(|(p, b)| (p.as_str(), b.as_slice()))
        .collect();
    embedded::write_files(&target, &borrowed, &executables)
        .map_err(|e| Exit::new(EXIT_CONFIG, format!("writing {}: {e}", target.display())))?;
    if ctx.json {
        ctx.print_json(&json!({
            "bobbin": bobbin.to_string(),
            "dir": target,
            "files": files.iter().map(|(p, _)| p).collect::<Vec<_>>(),
        }));
        return Ok(());
    }
    say!(ctx, "wrote {} in {}:", bobbin, target.display());
    for (p, _) in &files {
        say!(ctx, "  {p}");
    }
    say!(
        ctx,
        "Next: fill in the TODO placeholders ([provider] in bobbin.toml and the same in the three documents' frontmatter), replace the example captures with real deliveries, then run\n  hookspool bobbin check {}",
        target.display()
    );
    Ok(())
}

/// What the catalogue says of a built-in source type (a `builtin = "<kind>"` bobbin):
/// verification, handshake, dedup id. Whether the sender retries is the source's own
/// `Declared::sender_retries` (a test holds this table to the sources).
const BUILTIN_FACTS: &[(&str, &str, &str, &str)] = &[
    (
        "github",
        "HMAC-SHA256 hex (X-Hub-Signature-256)",
        "none (ping ignored)",
        "X-GitHub-Delivery",
    ),
    (
        "calendar",
        "channel token (X-Goog-Channel-Token)",
        "sync message ignored",
        "channel id + X-Goog-Message-Number",
    ),
    (
        "gmail",
        "token in the push URL's query; with audience, an RS256 OIDC token (Authorization) against Google's keys",
        "none",
        "Pub/Sub messageId",
    ),
    (
        "standard-webhooks",
        "Standard Webhooks v1 HMAC-SHA256 / v1a Ed25519, 300 s",
        "none",
        "webhook-id",
    ),
    (
        "plaid",
        "ES256 JWT (Plaid-Verification), keys fetched by kid",
        "none",
        "body SHA-256",
    ),
    (
        "slack",
        "HMAC-SHA256 over v0:ts:body, 300 s",
        "url_verification echo (signed)",
        "event_id / trigger_id",
    ),
    (
        "zoom",
        "HMAC-SHA256 over v0:ts:body, 300 s",
        "endpoint.url_validation (signed)",
        "event_ts + object id",
    ),
];

/// The catalogue's facts of one bobbin: verification, handshake, whether the sender
/// retries, dedup id.
pub fn catalogue_facts(e: &Entry) -> [String; 4] {
    let dash = || "-".to_string();
    let Some(src) = e.manifest.source() else {
        return ["none (polled)".into(), dash(), "- (polled)".into(), dash()];
    };
    let yes_no = |b: bool| if b { "yes" } else { "no" }.to_string();
    match &src.imp {
        SourceImpl::Builtin(kind) => {
            let (v, h, d) = BUILTIN_FACTS
                .iter()
                .find(|f| f.0 == *kind)
                .map(|f| (f.1, f.2, f.3))
                .unwrap_or(("built in", "-", "-"));
            let retries = crate::kit::signer::Kit::builtin(kind, b"catalogue")
                .ok()
                .and_then(|k| crate::sources::build("catalogue", kind, &k.options).ok())
                .map(|s| s.declared().sender_retries);
            [
                v.to_string(),
                h.to_string(),
                retries.map(yes_no).unwrap_or_else(dash),
                d.to_string(),
            ]
        }
        SourceImpl::Settings => [
            "any (settings: scheme or recipe)".into(),
            "settings".into(),
            "settings".into(),
            "settings".into(),
        ],
        SourceImpl::Fixed(t) => {
            let text = |k: &str| t.get(k).and_then(|v| v.as_str()).map(str::to_string);
            let verification = match t.get("recipe").and_then(|v| v.as_table()) {
                Some(r) => {
                    let get = |k: &str| r.get(k).and_then(|v| v.as_str()).unwrap_or("?");
                    // Where the signature is: a header, or a field of the JSON body.
                    let at = match r.get("field").and_then(|v| v.as_str()) {
                        Some(f) => format!("body field {f}"),
                        None => get("header").to_string(),
                    };
                    let mut v = match r.get("encoding").and_then(|v| v.as_str()) {
                        Some(enc) => format!("{} {enc} ({at})", get("algorithm")),
                        None => format!("{} ({at})", get("algorithm")),
                    };
                    if r.contains_key("timestamp") {
                        let tol = r
                            .get("tolerance_s")
                            .and_then(|v| v.as_integer())
                            .unwrap_or(300);
                        v.push_str(&format!(", timestamp {tol} s"));
                    }
                    if r.get("signed")
                        .and_then(|s| s.as_array())
                        .is_some_and(|a| a.iter().any(|p| p.as_str() == Some("url")))
                    {
                        v.push_str(", URL signed");
                    }
                    v
                }
                None => match (text("scheme"), text("header")) {
                    (Some(s), Some(h)) => format!("{s} ({h})"),
                    (Some(s), None) => s,
                    _ => "-".into(),
                },
            };
            let handshake = match t.get("handshake").and_then(|v| v.as_table()) {
                Some(h) => match (
                    h.get("kind").and_then(|v| v.as_str()),
                    h.contains_key("token"),
                ) {
                    (Some("echo"), _) => "challenge echo (signed)".to_string(),
                    (Some("ping"), _) => "ping answered (signed)".to_string(),
                    (Some("query"), true) => "GET challenge + verify token".to_string(),
                    (Some("query"), false) => "challenge in the query".to_string(),
                    (Some("header"), _) => "GET header challenge (verified)".to_string(),
                    _ => dash(),
                },
                None if t.get("head_handshake").and_then(|v| v.as_bool()) == Some(true) => {
                    "HEAD 200".to_string()
                }
                None => "none".to_string(),
            };
            let retries = t
                .get("sender_retries")
                .and_then(|v| v.as_bool())
                .or(src.sender_retries)
                .unwrap_or(false);
            [
                verification,
                handshake,
                yes_no(retries),
                text("dedup").unwrap_or_else(|| "none".to_string()),
            ]
        }
    }
}

/// `bobbin list --markdown`: the catalogue table of bobbins/README.md.
pub fn markdown_catalogue(catalog: &Catalog) -> String {
    let mut out = String::from(
        "| bobbin | version | summary | verification | handshake | sender retries | dedup id |\n| --- | --- | --- | --- | --- | --- | --- |\n",
    );
    for e in catalog.entries() {
        let name = &e.manifest.name;
        let cell = match e.origin {
            crate::bobbins::Origin::BuiltIn => {
                format!("[{name}]({}/{}/)", e.vendor_dir, e.product_dir)
            }
            _ => name.to_string(),
        };
        let [v, h, r, d] = catalogue_facts(e);
        out.push_str(&format!(
            "| {cell} | {} | {} | {} | {} | {} | {} |\n",
            md_cell(&e.manifest.version),
            md_cell(&e.manifest.summary),
            md_cell(&v),
            md_cell(&h),
            md_cell(&r),
            md_cell(&d)
        ));
    }
    out
}

fn md_cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

fn list(ctx: &Ctx, found: &Found, markdown: bool) -> Result<(), Exit> {
    let entries = found.catalog.entries();
    if markdown {
        ctx.say(markdown_catalogue(&found.catalog).trim_end());
        return Ok(());
    }
    let uses = |e: &Entry| {
        found
            .instances
            .get(&e.manifest.name.to_string())
            .cloned()
            .unwrap_or_default()
    };
    if ctx.json {
        let rows: Vec<_> = entries
            .iter()
            .map(|e| {
                json!({
                    "name": e.manifest.name.to_string(),
                    "version": e.manifest.version,
                    "origin": e.origin.label(),
                    "summary": e.manifest.summary,
                    "instances": uses(e),
                })
            })
            .collect();
        ctx.print_json(&json!(rows));
        return Ok(());
    }
    if entries.is_empty() {
        ctx.say("no bobbins found (none are built in, and spool.bobbin_path names no bobbin)");
        return Ok(());
    }
    let rows: Vec<Vec<String>> = entries
        .iter()
        .map(|e| {
            vec![
                e.manifest.name.to_string(),
                e.manifest.version.clone(),
                e.origin.label(),
                e.manifest.summary.clone(),
                uses(e).join(", "),
            ]
        })
        .collect();
    ctx.say(super::table(
        &["NAME", "VERSION", "ORIGIN", "SUMMARY", "INSTANCES"],
        &rows,
    ));
    Ok(())
}

/// The rule packs a bobbin ships (`rule-packs/*.toml`), by name.
/// The rule packs a bobbin ships (`rule-packs/<name>.toml`), each read as the processor
/// reads it: (the file's stem, the pack or why it is not one).
fn rule_packs(e: &Entry) -> Vec<(String, Result<PackSummary, String>)> {
    use crate::processor::mailrules::{RULE_PACK_BYTES_MAX, RULE_PACK_DIR};
    let files: Vec<(String, Result<String, String>)> = match &e.origin {
        crate::bobbins::Origin::BuiltIn => embedded::files_of(&e.vendor_dir, &e.product_dir)
            .into_iter()
            .map(|(rel, bytes)| {
                (
                    rel.to_string(),
                    String::from_utf8(bytes.to_vec()).map_err(|_| "not UTF-8".to_string()),
                )
            })
            .collect(),
        crate::bobbins::Origin::Path(root) => {
            let dir = root
                .join(&e.vendor_dir)
                .join(&e.product_dir)
                .join(RULE_PACK_DIR);
            std::fs::read_dir(dir)
                .map(|rd| {
                    rd.filter_map(Result::ok)
                        .map(|f| {
                            let text = match f.metadata() {
                                Ok(m) if m.len() > RULE_PACK_BYTES_MAX => {
                                    Err(format!("larger than {RULE_PACK_BYTES_MAX} bytes"))
                                }
                                _ => std::fs::read_to_string(f.path()).map_err(|e| e.to_string()),
                            };
                            (
                                format!("{RULE_PACK_DIR}/{}", f.file_name().to_string_lossy()),
                                text,
                            )
                        })
                        .collect()
                })
                .unwrap_or_default()
        }
    };
    let mut packs: Vec<(String, Result<PackSummary, String>)> = files
        .into_iter()
        .filter_map(|(rel, text)| {
            let stem = rel
                .strip_prefix(RULE_PACK_DIR)?
                .strip_prefix('/')?
                .strip_suffix(".toml")
                .filter(|n| !n.contains('/'))?
                .to_string();
            let pack = text.and_then(|t| mailrules::summarise_pack(&stem, &t));
            Some((stem, pack))
        })
        .collect();
    packs.sort_by(|a, b| a.0.cmp(&b.0));
    packs
}

fn show(ctx: &Ctx, found: &Found, name: &str) -> Result<(), Exit> {
    let Some(e) = found.catalog.get(name) else {
        let known: Vec<String> = found
            .catalog
            .entries()
            .iter()
            .map(|e| e.manifest.name.to_string())
            .collect();
        return Err(Exit::new(
            EXIT_NOT_FOUND,
            format!(
                "no bobbin {name}; hookspool bobbin list shows the bobbins found ({})",
                if known.is_empty() {
                    "none".into()
                } else {
                    known.join(", ")
                }
            ),
        ));
    };
    let m = &e.manifest;
    let source = m.source();
    let source_text = match source.map(|s| &s.imp) {
        Some(SourceImpl::Builtin(k)) => format!("built-in {k}"),
        Some(SourceImpl::Fixed(_)) => "template (fixed table)".into(),
        Some(SourceImpl::Settings) => "template (every key from settings)".into(),
        None => "none (a poll bobbin)".into(),
    };
    let processor = match &m.body {
        Body::Push {
            processor: Some(p), ..
        } => Some(format!(
            "{} (timeout {} s, {})",
            match &p.imp {
                crate::bobbins::manifest::ProcessorImpl::Exec(f) => format!("exec {f}"),
                crate::bobbins::manifest::ProcessorImpl::Builtin(b) => format!("built-in {b}"),
            },
            p.timeout_s,
            if p.state { "keeps state" } else { "stateless" }
        )),
        Body::Push {
            processor: None, ..
        } => None,
        Body::Poll(p) => Some(match &p.imp {
            crate::bobbins::manifest::ProcessorImpl::Exec(e) => {
                format!(
                    "poll exec {e} every {} s (jitter {} s)",
                    p.every_s, p.jitter_s
                )
            }
            crate::bobbins::manifest::ProcessorImpl::Builtin(b) => {
                format!(
                    "poll builtin {b} every {} s (jitter {} s)",
                    p.every_s, p.jitter_s
                )
            }
        }),
    };
    let packs = rule_packs(e);
    if ctx.json {
        let provider: serde_json::Map<String, serde_json::Value> = m
            .provider
            .entries()
            .map(|(k, v)| (k.as_str().to_string(), json!(v)))
            .collect();
        let secrets: serde_json::Map<String, serde_json::Value> = m
            .secrets
            .iter()
            .map(|(k, s)| (k.clone(), json!({"description": s.description, "required": s.required, "processor": s.processor})))
            .collect();
        let settings: serde_json::Map<String, serde_json::Value> = m
            .settings
            .iter()
            .map(|(k, s)| (k.clone(), json!({"description": s.description, "type": s.ty.as_str(), "required": s.required, "default": s.default})))
            .collect();
        let outputs: serde_json::Map<String, serde_json::Value> = m
            .outputs
            .iter()
            .map(|(k, d)| (k.as_str().to_string(), json!(d)))
            .collect();
        ctx.print_json(&json!({
            "name": m.name.to_string(),
            "version": m.version,
            "summary": m.summary,
            "origin": e.origin.label(),
            "provider": provider,
            "source": source_text,
            "span": source.and_then(|s| s.span.clone()),
            "sender_retries": source.and_then(|s| s.sender_retries),
            "expect_every_s": source.and_then(|s| s.expect_every_s),
            "proxy": source.and_then(|s| s.proxy.clone()),
            "processor": processor,
            "secrets": secrets,
            "settings": settings,
            "outputs": outputs,
            "rule_packs": packs
                .iter()
                .map(|(stem, p)| match p {
                    Ok(p) => json!(p),
                    Err(why) => json!({ "name": stem, "error": why }),
                })
                .collect::<Vec<_>>(),
        }));
        return Ok(());
    }
    say!(
        ctx,
        "{} (version {}, {})",
        m.name,
        m.version,
        e.origin.label()
    );
    say!(ctx, "  {}", m.summary);
    say!(ctx, "provider: {}", m.provider.display());
    for (k, v) in m.provider.entries() {
        if k.is_url() {
            say!(ctx, "  {}: {v}", k.as_str());
        }
    }
    say!(ctx, "source: {source_text}");
    if let Some(s) = source {
        say!(
            ctx,
            "  span: {}",
            s.span.as_deref().unwrap_or("(the source's own)")
        );
        say!(
            ctx,
            "  sender_retries: {}",
            s.sender_retries
                .map(|b| b.to_string())
                .unwrap_or_else(|| "(the source's own)".into())
        );
        if let Some(x) = s.expect_every_s {
            say!(ctx, "  expect_every_s: {x} (applied with expect = true)");
        }
        if let Some(p) = &s.proxy {
            say!(ctx, "  proxy: {p}");
        }
    }
    if let Some(p) = processor {
        say!(ctx, "processor: {p}");
    }
    say!(ctx, "secrets:");
    for (k, s) in &m.secrets {
        let mut flags = vec![if s.required { "required" } else { "optional" }];
        if s.processor {
            flags.push("processor");
        }
        say!(ctx, "  {k} ({}): {}", flags.join(", "), s.description);
    }
    say!(ctx, "settings:");
    for (k, s) in &m.settings {
        let default = match (&s.default, s.required) {
            (_, true) => "required".to_string(),
            (Some(d), false) => format!("default {d}"),
            (None, false) => "no default".to_string(),
        };
        say!(
            ctx,
            "  {k} ({}, {default}): {}",
            s.ty.as_str(),
            s.description
        );
    }
    say!(ctx, "outputs:");
    for (k, d) in &m.outputs {
        let shown = match k {
            OutputKey::All => "\"*\"".to_string(),
            OutputKey::Event(e) => e.clone(),
        };
        say!(ctx, "  {shown}: {d}");
    }
    if !packs.is_empty() {
        say!(ctx, "rule packs:");
    }
    for (stem, pack) in &packs {
        let p = match pack {
            Ok(p) => p,
            Err(why) => {
                say!(ctx, "  {stem}: NOT A PACK ({why})");
                continue;
            }
        };
        let status = p.status.as_deref().unwrap_or("no status");
        match &p.description {
            Some(d) => say!(ctx, "  {} ({status}): {d}", p.name),
            None => say!(ctx, "  {} ({status})", p.name),
        }
        for r in &p.rules {
            let emits = match &r.output {
                Some(o) => format!("-> {o}"),
                None => "(tags the mail item only)".to_string(),
            };
            say!(ctx, "    {} {emits}  [{}]", r.name, r.fields.join(", "));
        }
    }
    Ok(())
}

fn check(
    ctx: &Ctx,
    found: &Found,
    dir: &std::path::Path,
    report: Report,
    strict: bool,
    opts: KitOptions,
) -> Result<(), Exit> {
    if !dir.is_dir() {
        return Err(Exit::new(
            EXIT_NOT_FOUND,
            format!(
                "{} is not a directory; give a bobbin's directory, e.g. bobbins/github/repo",
                dir.display()
            ),
        ));
    }
    let card = kit::check(dir, &found.catalog, &opts);
    let passed = card.passed(strict);
    match report {
        Report::Json => ctx.print_json(&json!({
            "bobbin": card.bobbin,
            "dir": card.dir,
            "passed": passed,
            "strict": strict,
            "rows": card.rows,
        })),
        Report::Md => ctx.say(render_md(&card, passed).trim_end()),
        Report::Text => ctx.say(render_text(&card, passed).trim_end()),
    }
    if passed {
        Ok(())
    } else {
        let failed: Vec<&str> = card
            .rows
            .iter()
            .filter(|r| r.status == Status::Fail || (strict && r.status == Status::Warn))
            .map(|r| r.row.as_str())
            .collect();
        Err(Exit::new(
            EXIT_CONFIG,
            format!(
                "bobbin check {}: failed: {}",
                card.bobbin,
                failed.join(", ")
            ),
        ))
    }
}

fn status_word(s: &Status) -> &'static str {
    match s {
        Status::Pass => "pass",
        Status::Fail => "fail",
        Status::Warn => "warn",
        Status::Skip => "skip",
    }
}

fn row_line(r: &kit::RowResult) -> String {
    match &r.note {
        Some(n) => format!("{}: {n}", status_word(&r.status)),
        None => status_word(&r.status).to_string(),
    }
}

fn render_text(card: &Scorecard, passed: bool) -> String {
    let mut out = format!("bobbin check {} ({})\n", card.bobbin, card.dir);
    let width = Row::ALL.iter().map(|r| r.as_str().len()).max().unwrap_or(0);
    for r in &card.rows {
        out.push_str(&format!("  {:<width$}  {}\n", r.row.as_str(), row_line(r)));
        for p in &r.problems {
            out.push_str(&format!("    {}\n", p));
        }
    }
    out.push_str(if passed {
        "result: pass\n"
    } else {
        "result: fail\n"
    });
    out
}

fn render_md(card: &Scorecard, passed: bool) -> String {
    let mut out = format!(
        "### bobbin check `{}`: {}\n\n| check | result | problems |\n| --- | --- | --- |\n",
        card.bobbin,
        if passed { "pass" } else { "fail" }
    );
    for r in &card.rows {
        out.push_str(&format!(
            "| {} | {} | {} |\n",
            r.row.as_str(),
            md_cell(&row_line(r)),
            r.problems.len()
        ));
    }
    let problems: Vec<&Finding> = card.rows.iter().flat_map(|r| r.problems.iter()).collect();
    if !problems.is_empty() {
        out.push_str("\nProblems:\n\n");
        for p in problems {
            out.push_str(&format!(
                "- `{}`\n",
                md_cell(&p.to_string()).replace('`', "'")
            ));
        }
    }
    out
}

#[cfg(test)]
mod catalogue_tests {
    use super::*;

    /// Every built-in bobbin on a built-in source type has its row of facts, and the
    /// catalogue's retries column is that source's own declaration.
    #[test]
    fn every_builtin_source_kind_has_catalogue_facts() {
        let catalog = Catalog::builtin();
        let mut seen = 0;
        for e in catalog.entries() {
            let Some(SourceImpl::Builtin(kind)) = e.manifest.source().map(|s| &s.imp) else {
                continue;
            };
            seen += 1;
            assert!(
                BUILTIN_FACTS.iter().any(|f| f.0 == *kind),
                "{kind} has no BUILTIN_FACTS row"
            );
            let [_, _, retries, _] = catalogue_facts(e);
            assert!(retries == "yes" || retries == "no", "{kind}: {retries}");
        }
        assert!(seen >= 5, "{seen}");
        let facts =
            |name: &str| catalogue_facts(catalog.get(name).unwrap_or_else(|| panic!("{name}")));
        assert_eq!(facts("github.repo")[2], "no");
        assert_eq!(facts("slack.events")[2], "yes");
        let sg = facts("sendgrid.events");
        assert!(sg[0].starts_with("ecdsa-p256 base64"), "{sg:?}");
        assert_eq!(sg[3], "body_sha256");
        assert_eq!(facts("atlassian.trello")[1], "HEAD 200");
    }
}
