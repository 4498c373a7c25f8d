//! Every capture of every built-in bobbin, checked against the source its manifest names.
//!
//! Owns: reading `bobbins/<vendor>/<product>/` (bobbin.toml, captures/*.http with their
//! `# expect:` and `# at:` lines, captures/kit.toml, and hookspool.webhook's
//! captures/schemes/<scheme>/ kits), building the source the manifest names from the kit's
//! settings and secrets, and checking each capture at its own time: accepted ones are
//! accepted with the expected key, event type, dedup id and attrs, a challenge answers what
//! the capture expects, rejected ones are refused, a one-byte-tampered copy of every accepted
//! capture is refused, and a timestamped capture is refused just outside its window on both
//! sides.
//!
//! Until the bobbins' own kit (src/bobbins/) runs captures through the intake, this is what
//! proves them: every capture goes through the real source its manifest names
//! (`sources::build`, then `sources::evaluate`), and a manifest naming a source type or a
//! template scheme hookspool does not build fails here.
//! Must not: read anything outside the checkout.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use hookspool::sources::kit::MapSecrets;
use hookspool::sources::plaid::{KeyCache, Plaid, PlaidJwk, StaticJwkFetcher};
use hookspool::sources::verify::TOLERANCE_S_DEFAULT;
use hookspool::sources::{self, Request, Source, Verdict, template};
use serde_json::Value as Json;

/// Template keys (spec 14.3.2a): the settings that become template keys.
const TEMPLATE_KEYS: &[&str] = &[
    "scheme",
    "header",
    "prefix",
    "param",
    "callback_url",
    "head_handshake",
    "key",
    "dedup",
    "ignore",
    "event_type",
    "attrs",
    "sender_retries",
];

/// How far outside the window the stale and future-dated copies are evaluated.
const SKEW_MARGIN_S: f64 = 60.0;

/// The clock for a capture without `# at:` (the source kit's fixed time).
const KIT_NOW: f64 = 1_700_000_000.0;

fn bobbins_root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/bobbins"))
}

/// Every bobbin directory (`<vendor>/<product>/` holding a bobbin.toml), sorted.
fn bobbin_dirs() -> Vec<PathBuf> {
    let mut out = Vec::new();
    for vendor in sorted_dirs(&bobbins_root()) {
        for product in sorted_dirs(&vendor) {
            if product.join("bobbin.toml").is_file() {
                out.push(product);
            }
        }
    }
    out
}

fn sorted_dirs(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.is_dir())
        .collect();
    v.sort();
    v
}

fn read_toml(path: &Path) -> toml::Table {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.parse()
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// One `.http` capture: its directives and the request text after them, byte for byte.
struct Capture {
    path: PathBuf,
    expect: BTreeMap<String, toml::Value>,
    at: Option<f64>,
    source: Option<String>,
    request: String,
}

fn read_capture(path: &Path) -> Capture {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut expect = BTreeMap::new();
    let (mut at, mut source) = (None, None);
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let Some(directive) = line.strip_prefix('#') else {
            break;
        };
        offset += line.len();
        let directive = directive.trim();
        if let Some(rest) = directive.strip_prefix("expect:") {
            let (name, value) = rest
                .split_once('=')
                .unwrap_or_else(|| panic!("{}: expect without =", path.display()));
            let parsed: toml::Table = format!("v = {}", value.trim())
                .parse()
                .unwrap_or_else(|e| panic!("{}: expect value: {e}", path.display()));
            expect.insert(name.trim().to_string(), parsed["v"].clone());
        } else if let Some(rest) = directive.strip_prefix("at:") {
            at = Some(
                rest.trim()
                    .parse::<f64>()
                    .unwrap_or_else(|e| panic!("{}: at: {e}", path.display())),
            );
        } else if let Some(rest) = directive.strip_prefix("source:") {
            source = Some(rest.trim().to_string());
        }
    }
    Capture {
        path: path.to_path_buf(),
        expect,
        at,
        source,
        request: text[offset..].to_string(),
    }
}

impl Capture {
    fn now(&self) -> f64 {
        self.at.unwrap_or(KIT_NOW)
    }
    fn request(&self, now: f64) -> Request {
        sources::parse_capture(&self.request, now)
            .unwrap_or_else(|e| panic!("{}: {e}", self.path.display()))
    }
    fn expect_str(&self, name: &str) -> Option<&str> {
        self.expect.get(name).and_then(toml::Value::as_str)
    }
    fn name(&self) -> String {
        self.path.display().to_string()
    }
}

/// A kit: captures/kit.toml and the captures beside it.
struct Kit {
    instance: String,
    bobbin: toml::Table,
    secrets: toml::Table,
    stub: toml::Table,
    captures: Vec<Capture>,
}

fn read_kit(dir: &Path) -> Kit {
    let t = read_toml(&dir.join("kit.toml"));
    let table = |k: &str| {
        t.get(k)
            .and_then(toml::Value::as_table)
            .cloned()
            .unwrap_or_default()
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("captures dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().and_then(|e| e.to_str()) == Some("http"))
        .collect();
    files.sort();
    Kit {
        instance: t["instance"]
            .as_str()
            .expect("kit.toml: instance")
            .to_string(),
        bobbin: table("bobbin"),
        secrets: table("secrets"),
        stub: table("stub"),
        captures: files.iter().map(|p| read_capture(p)).collect(),
    }
}

/// The kits of a bobbin: captures/, and for hookspool.webhook each captures/schemes/<s>/.
fn kits(bobbin_dir: &Path) -> Vec<Kit> {
    let captures = bobbin_dir.join("captures");
    let mut out = vec![read_kit(&captures)];
    let schemes = captures.join("schemes");
    if schemes.is_dir() {
        out.extend(sorted_dirs(&schemes).iter().map(|d| read_kit(d)));
    }
    out
}

/// An empty setting value means "unset" (spec 14.3.2a).
fn is_empty(v: &toml::Value) -> bool {
    match v {
        toml::Value::String(s) => s.is_empty(),
        toml::Value::Array(a) => a.is_empty(),
        toml::Value::Table(t) => t.is_empty(),
        _ => false,
    }
}

/// The instance's value of each declared setting, else the default; empty ones left out.
fn settings(manifest: &toml::Table, kit: &Kit) -> toml::Table {
    let given = kit
        .bobbin
        .get("settings")
        .and_then(toml::Value::as_table)
        .cloned()
        .unwrap_or_default();
    let declared = manifest
        .get("settings")
        .and_then(toml::Value::as_table)
        .cloned()
        .unwrap_or_default();
    for name in given.keys() {
        assert!(
            declared.contains_key(name),
            "kit sets undeclared setting {name}"
        );
    }
    let mut out = toml::Table::new();
    for (name, decl) in &declared {
        let decl = decl.as_table().expect("settings table");
        let value = given.get(name).or_else(|| decl.get("default"));
        match value {
            Some(v) if !is_empty(v) => {
                out.insert(name.clone(), v.clone());
            }
            Some(_) => {}
            None => panic!("setting {name} is required and the kit does not set it"),
        }
    }
    out
}

/// How a capture is checked: the source the manifest's [source] names, built from the kit's
/// settings, and where its credential travels when it is a shared token.
struct Plan {
    source: Arc<dyn Source>,
    token: Option<Credential>,
}

/// Where a shared token (which does not cover the body) travels, for the tamper check.
#[derive(Clone)]
enum Credential {
    Header(String),
    Query(String),
}

/// The plan, and the built-in kind or template scheme it checks.
fn plan(name: &str, manifest: &toml::Table, kit: &Kit) -> (Plan, String) {
    let source = manifest["source"].as_table().expect("[source]");
    let settings = settings(manifest, kit);
    let instance = kit.instance.as_str();
    if let Some(kind) = source.get("builtin").and_then(toml::Value::as_str) {
        let mut options = toml::Table::new();
        for key in source
            .get("config")
            .and_then(toml::Value::as_array)
            .into_iter()
            .flatten()
        {
            let key = key.as_str().expect("config entry");
            if let Some(v) = settings.get(key) {
                options.insert(key.to_string(), v.clone());
            }
        }
        assert!(
            sources::KINDS.contains(&kind),
            "{name}: builtin = {kind:?} is not a source type hookspool builds ({:?})",
            sources::KINDS
        );
        let built: Arc<dyn Source> = if kind == "plaid" {
            // The key service is the kit's stub: a fetcher that serves the kit.toml key.
            let jwk: PlaidJwk = toml::Value::Table(
                kit.stub["webhook_verification_key"]
                    .as_table()
                    .expect("[stub.webhook_verification_key]")
                    .clone(),
            )
            .try_into()
            .expect("stub key is a JWK");
            let env = options
                .get("env")
                .and_then(toml::Value::as_str)
                .unwrap_or("production");
            Arc::new(Plaid::with_parts(
                instance,
                env,
                Arc::new(KeyCache::new()),
                Some(Arc::new(StaticJwkFetcher::new(vec![jwk]))),
            ))
        } else {
            sources::build(instance, kind, &options).unwrap_or_else(|e| panic!("{name}: {e}"))
        };
        let token = match kind {
            "gmail" => Some(Credential::Query(
                options
                    .get("param")
                    .and_then(toml::Value::as_str)
                    .unwrap_or("token")
                    .to_string(),
            )),
            "calendar" => Some(Credential::Header("X-Goog-Channel-Token".into())),
            _ => None,
        };
        let plan = Plan {
            source: built,
            token,
        };
        return (plan, kind.to_string());
    }
    let mut options = match source.get("template") {
        Some(toml::Value::Table(t)) => t.clone(),
        Some(toml::Value::String(s)) if s == "settings" => toml::Table::new(),
        other => panic!("{name}: [source] has neither builtin nor template: {other:?}"),
    };
    for (k, v) in &settings {
        if TEMPLATE_KEYS.contains(&k.as_str()) {
            assert!(
                !options.contains_key(k),
                "{name}: setting {k} overrides the fixed template"
            );
            options.insert(k.clone(), v.clone());
        }
    }
    let scheme = options["scheme"].as_str().expect("scheme").to_string();
    assert!(
        template::SCHEMES.contains(&scheme.as_str()),
        "{name}: scheme = {scheme:?} is not a template scheme ({:?})",
        template::SCHEMES
    );
    let token = (scheme == "static-token").then(|| {
        match options.get("header").and_then(toml::Value::as_str) {
            Some(h) => Credential::Header(h.to_string()),
            None => Credential::Query(options["param"].as_str().expect("param").into()),
        }
    });
    let built =
        sources::build(instance, "template", &options).unwrap_or_else(|e| panic!("{name}: {e}"));
    let plan = Plan {
        source: built,
        token,
    };
    (plan, scheme)
}

fn secrets(kit: &Kit) -> MapSecrets {
    let mut m = MapSecrets::new();
    for (name, v) in &kit.secrets {
        m = m.with(name, v.as_str().expect("secret is a string").as_bytes());
    }
    m
}

fn run(plan: &Plan, kit: &Kit, req: &Request) -> Verdict {
    sources::evaluate(plan.source.as_ref(), req, &secrets(kit))
}

fn refused(v: &Verdict) -> bool {
    matches!(v, Verdict::Unauthorized)
}

/// The status the intake answers for a verdict.
fn status_of(v: &Verdict) -> u16 {
    match v {
        Verdict::Accept(_) | Verdict::Ignored(_) => 200,
        Verdict::Unauthorized => 401,
        Verdict::Quarantine { .. } => 202,
        Verdict::Answer(r) => r.status,
        Verdict::Undecided(_) => 503,
    }
}

/// Checks every one of a capture's `# expect:` lines against its verdict.
fn check_expectations(cap: &Capture, v: &Verdict) {
    let name = cap.name();
    let verdict = cap
        .expect_str("verdict")
        .unwrap_or_else(|| panic!("{name}: no expect: verdict"));
    let matches_verdict = match verdict {
        "accepted" => matches!(v, Verdict::Accept(_)),
        "unauthorized" => matches!(v, Verdict::Unauthorized),
        "ignored" => matches!(v, Verdict::Ignored(_)),
        "challenge" => matches!(v, Verdict::Answer(_)),
        "quarantined" => matches!(v, Verdict::Quarantine { .. }),
        other => panic!("{name}: verdict {other} is not checked here"),
    };
    assert!(matches_verdict, "{name}: expected {verdict}, got {v:?}");
    if let Some(status) = cap.expect.get("status") {
        let want = status.as_integer().expect("status is an integer");
        assert_eq!(i64::from(status_of(v)), want, "{name}: status");
    }
    for (k, want) in &cap.expect {
        let want_s = want.as_str();
        match (k.as_str(), v) {
            ("verdict" | "status", _) => {}
            ("key", Verdict::Accept(a)) => assert_eq!(Some(a.key.as_str()), want_s, "{name}: key"),
            ("event_type", Verdict::Accept(a)) => {
                assert_eq!(Some(a.event_type.as_str()), want_s, "{name}: event_type")
            }
            ("dedup_id", Verdict::Accept(a)) => {
                assert_eq!(a.dedup_id.as_deref(), want_s, "{name}: dedup_id")
            }
            (attr, Verdict::Accept(a)) if attr.starts_with("attrs.") => assert_eq!(
                a.attrs.get(&attr["attrs.".len()..]).map(String::as_str),
                want_s,
                "{name}: {attr}"
            ),
            (body, Verdict::Answer(r)) if body.starts_with("body.") => {
                let doc: Json = serde_json::from_slice(&r.body).expect("answer is JSON");
                let pointer = format!("/{}", body["body.".len()..].replace('.', "/"));
                let got = doc.pointer(&pointer).cloned();
                let want_json: Json = serde_json::to_value(want).expect("toml value as json");
                assert_eq!(got, Some(want_json), "{name}: {body}");
            }
            (other, _) => panic!("{name}: expect {other} does not apply to {v:?}"),
        }
    }
}

/// A copy of the request with one byte changed where the credential covers it: the body for
/// a signature, the token itself for a shared token (which does not cover the body).
fn tampered(plan: &Plan, req: &Request) -> Request {
    let mut r = req.clone();
    let token = plan.token.clone();
    let flip = |s: &str| {
        let mut b = s.as_bytes().to_vec();
        if let Some(last) = b.last_mut() {
            *last ^= 0x01;
        }
        String::from_utf8(b).expect("ascii stays utf-8")
    };
    match token {
        Some(Credential::Header(h)) => {
            let v = flip(r.header(&h).expect("token header"));
            r.remove_header(&h);
            r = r.with_header(&h, &v);
        }
        Some(Credential::Query(p)) => {
            for (k, v) in r.query.iter_mut() {
                if *k == p {
                    *v = flip(v);
                }
            }
        }
        None => {
            assert!(!r.body.is_empty(), "a signed capture with an empty body");
            let mid = r.body.len() / 2;
            r.body[mid] ^= 0x01;
        }
    }
    r
}

/// Whether a scheme carries a timestamp (refused just outside ±300 s, both sides).
fn timestamped(kind_or_scheme: &str) -> bool {
    matches!(
        kind_or_scheme,
        "zoom" | "plaid" | "standard-webhooks" | "slack" | "timestamped"
    )
}

#[test]
fn every_bobbin_capture_holds_against_its_source() {
    let dirs = bobbin_dirs();
    assert!(dirs.len() >= 15, "found {} bobbins", dirs.len());
    let mut checked = 0;
    for dir in &dirs {
        let manifest = read_toml(&dir.join("bobbin.toml"));
        let name = manifest["name"].as_str().expect("name").to_string();
        let rel = dir.strip_prefix(bobbins_root()).expect("under bobbins/");
        assert_eq!(
            rel.to_string_lossy().replace('/', "."),
            name,
            "the directory is <vendor>/<product>"
        );
        let (mut accepted, mut unauthorized) = (0, 0);
        for kit in kits(dir) {
            assert_eq!(
                kit.bobbin.get("bobbin").and_then(toml::Value::as_str),
                Some(name.as_str()),
                "{name}: kit.toml [bobbin] bobbin"
            );
            let (plan, scheme) = plan(&name, &manifest, &kit);
            assert!(!kit.captures.is_empty(), "{name}: a kit without captures");
            for cap in &kit.captures {
                let cname = cap.name();
                assert!(cap.source.is_some(), "{cname}: no # source: line");
                let req = cap.request(cap.now());
                assert_eq!(
                    req.path,
                    format!("/hooks/{}", kit.instance),
                    "{cname}: path"
                );
                let tail = cap
                    .request
                    .split_once("\n\n")
                    .map(|(_, b)| b.len())
                    .unwrap_or(0);
                if let Some(cl) = req.header("Content-Length") {
                    assert_eq!(
                        cl.parse::<usize>().ok(),
                        Some(tail),
                        "{cname}: Content-Length"
                    );
                }
                let outcome = run(&plan, &kit, &req);
                check_expectations(cap, &outcome);
                let verdict = cap.expect_str("verdict").unwrap_or_default();
                let signed_answer = verdict == "challenge" && req.method != "HEAD";
                if verdict == "accepted" || signed_answer {
                    let t = tampered(&plan, &req);
                    assert!(
                        refused(&run(&plan, &kit, &t)),
                        "{cname}: tampered copy passed"
                    );
                    if timestamped(&scheme) {
                        // A capture's time may be a few seconds after its signed time; the
                        // exact boundaries are the known-answer tests' (src/sources/kat*).
                        let w = TOLERANCE_S_DEFAULT as f64 + SKEW_MARGIN_S;
                        for now in [cap.now() + w, cap.now() - w] {
                            let late = cap.request(now);
                            assert!(
                                refused(&run(&plan, &kit, &late)),
                                "{cname}: accepted at {now} (outside the window)"
                            );
                        }
                    }
                }
                accepted += usize::from(verdict == "accepted");
                unauthorized += usize::from(verdict == "unauthorized");
                checked += 1;
            }
        }
        assert!(accepted >= 1, "{name}: no accepted capture");
        assert!(unauthorized >= 1, "{name}: no unauthorized capture");
    }
    assert!(checked >= 50, "only {checked} captures");
}

/// The YAML frontmatter a document opens with (spec 14.3.2), as (key, value) lines.
fn frontmatter(text: &str) -> Vec<(String, String)> {
    let Some(rest) = text.strip_prefix("---\n") else {
        return Vec::new();
    };
    let Some((head, _)) = rest.split_once("\n---\n") else {
        return Vec::new();
    };
    head.lines()
        .filter_map(|l| l.split_once(": "))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A provider page: https on a public host, not an example/test host, an IP or a placeholder.
fn provider_url_ok(url: &str) -> bool {
    let Some(rest) = url.strip_prefix("https://") else {
        return false;
    };
    let host = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let reserved = [
        ".example",
        ".test",
        ".invalid",
        ".localhost",
        "example.com",
        "example.org",
        "example.net",
    ];
    !host.is_empty()
        && host.contains('.')
        && !host
            .split('.')
            .all(|p| p.bytes().all(|b| b.is_ascii_digit()))
        && !reserved
            .iter()
            .any(|r| host.ends_with(r) || host == &r[1..])
        && !url.contains("TODO")
        && !url.contains('<')
        && !url.contains("...")
}

#[test]
fn every_bobbin_documents_itself() {
    for dir in bobbin_dirs() {
        let manifest = read_toml(&dir.join("bobbin.toml"));
        let name = manifest["name"].as_str().expect("name");
        let provider = manifest["provider"].as_table().expect("[provider]");
        let field = |k: &str| provider.get(k).and_then(toml::Value::as_str);
        for k in ["homepage", "webhook_docs", "signature_docs", "api_docs"] {
            if let Some(url) = field(k) {
                assert!(provider_url_ok(url), "{name}: provider.{k} = {url}");
            }
        }
        assert!(field("signature_docs").is_some(), "{name}: signature_docs");
        if manifest.get("processor").is_some() {
            assert!(
                field("api_docs").is_some(),
                "{name}: a processor needs api_docs"
            );
        }
        let want = vec![
            ("bobbin".to_string(), name.to_string()),
            (
                "provider".to_string(),
                format!(
                    "{} {}",
                    field("vendor").expect("vendor"),
                    field("product").expect("product")
                ),
            ),
            (
                "webhook_docs".to_string(),
                field("webhook_docs").expect("webhook_docs").to_string(),
            ),
        ];
        let instance = read_kit(&dir.join("captures")).instance;
        let secrets: Vec<String> = manifest
            .get("secrets")
            .and_then(toml::Value::as_table)
            .map(|t| t.keys().cloned().collect())
            .unwrap_or_default();
        let required: Vec<String> = manifest
            .get("settings")
            .and_then(toml::Value::as_table)
            .map(|t| {
                t.iter()
                    .filter(|(_, v)| v.get("required").and_then(toml::Value::as_bool) == Some(true))
                    .map(|(k, _)| k.clone())
                    .collect()
            })
            .unwrap_or_default();
        for doc in ["README.md", "SETUP.md", "AGENTS.md"] {
            let path = dir.join(doc);
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert_eq!(frontmatter(&text), want, "{}: frontmatter", path.display());
            if doc == "README.md" {
                assert!(
                    text.contains("## Captures"),
                    "{}: no Captures section",
                    path.display()
                );
                continue;
            }
            assert!(
                text.contains(&format!("[bobbins.{instance}]")),
                "{}: no [bobbins.{instance}] table",
                path.display()
            );
            for s in secrets.iter().chain(&required) {
                assert!(
                    text.contains(&format!("`{s}`"))
                        || text.contains(&format!("{s} ="))
                        || text.contains(&format!("secrets.{s}")),
                    "{}: {s} not mentioned",
                    path.display()
                );
            }
            if doc == "AGENTS.md" {
                assert!(
                    text.contains("## Needs from the human"),
                    "{}",
                    path.display()
                );
                assert!(
                    text.contains("\n1. **"),
                    "{}: no numbered steps",
                    path.display()
                );
                assert!(
                    text.contains("(outward)"),
                    "{}: no outward step",
                    path.display()
                );
            }
        }
    }
}

#[test]
fn provider_url_rule_refuses_what_spec_14_3_2_refuses() {
    assert!(provider_url_ok("https://docs.github.com/en/webhooks"));
    for bad in [
        "http://docs.github.com/en/webhooks",
        "https://example.com/webhooks",
        "https://docs.example.org/x",
        "https://hooks.test/x",
        "https://192.0.2.1/docs",
        "https://localhost/docs",
        "https://TODO/docs",
        "https://<vendor>.com/docs",
    ] {
        assert!(!provider_url_ok(bad), "{bad}");
    }
}
