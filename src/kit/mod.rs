//! The conformance kit behind `hookspool bobbin check <dir>` (spec 14.3.5, 14.3.8): one
//! scorecard row per check, each pass, fail, warn (advisory; fails under `--strict`) or skip
//! with the reason, and every problem as `file:line: what to write instead`.
//!
//! Rows: name, manifest, provider, files, todos, core-only, docs, captures, source-kit,
//! processor, tests, provider-links, scope. core-only: the vendor directory holds only
//! product directories and no link leads out of the bobbin; provider-links (advisory, only
//! with `--online`) fetches each provider page, HEAD then GET, 10 s, redirects followed. docs loads each document's config table through the config loader
//! (`config::parse_with_catalog`: the real expansion and the checks of what it expands
//! to); source-kit runs every capture through the kit instance's real source at the
//! capture's own time ([`source_kit`]); processor runs each accepted capture's batch
//! through the bobbin's processor against the kit's stub answers
//! ([`processor_kit`]); tests runs the bobbin's own tests, the executables in its
//! `tests/`, under the sandbox with the network blocked ([`own_tests`]), and skips
//! when there are none. scope compares a git checkout with `--base REF` through
//! `sandbox::run_trusted` (an operator command, never a payload).
//!
//! Owns: judging one bobbin directory. Must not: print (the CLI renders the [`Scorecard`]),
//! resolve or print a secret, or write into the directory.

pub mod capture;
pub mod own_tests;
pub mod poll_kit;
mod processor_kit;
pub mod scaffold;
pub mod scaffold_poll;
pub mod scan;
pub mod signer;
mod source_kit;

use std::path::{Path, PathBuf};
use std::time::Duration;

use self::capture::{Capture, KIT_FILE, KitFile, Verdict};
use crate::bobbins::Finding;
use crate::bobbins::catalog::{Catalog, Entry, MANIFEST_FILE, Origin, check_layout};
use crate::bobbins::embedded;
use crate::bobbins::expand::expand_config;
use crate::bobbins::frontmatter::Frontmatter;
use crate::bobbins::locate::Locator;
use crate::bobbins::manifest::{Manifest, OutputKey};
use crate::bobbins::name::{BobbinName, is_instance_name};
use crate::bobbins::provider::{ProviderKey, ProviderNeeds};

/// The documents every bobbin ships (14.3.1).
pub const DOCUMENTS: [&str; 3] = ["README.md", "SETUP.md", "AGENTS.md"];
pub const CAPTURES_DIR: &str = "captures";
/// The home used when the kit expands an instance (never created or read).
pub const KIT_HOME: &str = "/var/lib/hookspool";
/// Where the kit pretends an instance's secrets live when it expands kit.toml (references
/// only; nothing is read).
pub const KIT_SECRET_DIR: &str = "/run/hookspool-kit";
/// The bound on one `git` call of the scope row.
pub const GIT_TIMEOUT_S: u64 = 20;
/// The most `git` output the scope row reads.
pub const GIT_OUTPUT_BYTES_MAX: usize = 1 << 20;
/// The largest file the kit reads.
pub const KIT_FILE_BYTES_MAX: u64 = 4 << 20;

/// The scorecard's rows, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Row {
    Name,
    Manifest,
    Provider,
    Files,
    Todos,
    CoreOnly,
    Docs,
    Captures,
    SourceKit,
    Processor,
    Tests,
    ProviderLinks,
    Scope,
}

impl Row {
    pub const ALL: [Row; 13] = [
        Row::Name,
        Row::Manifest,
        Row::Provider,
        Row::Files,
        Row::Todos,
        Row::CoreOnly,
        Row::Docs,
        Row::Captures,
        Row::SourceKit,
        Row::Processor,
        Row::Tests,
        Row::ProviderLinks,
        Row::Scope,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Row::Name => "name",
            Row::Manifest => "manifest",
            Row::Provider => "provider",
            Row::Files => "files",
            Row::Todos => "todos",
            Row::CoreOnly => "core-only",
            Row::Docs => "docs",
            Row::Captures => "captures",
            Row::SourceKit => "source-kit",
            Row::Processor => "processor",
            Row::Tests => "tests",
            Row::ProviderLinks => "provider-links",
            Row::Scope => "scope",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Pass,
    Fail,
    /// Advisory: reported, fails only under `--strict`.
    Warn,
    Skip,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RowResult {
    pub row: Row,
    pub status: Status,
    /// Why a row was skipped, or an advisory row's verdict (`bobbin-only`).
    pub note: Option<String>,
    pub problems: Vec<Finding>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Scorecard {
    pub bobbin: String,
    pub dir: String,
    pub rows: Vec<RowResult>,
}

impl Scorecard {
    /// The run passes: no row failed (and under `strict`, none warned).
    pub fn passed(&self, strict: bool) -> bool {
        self.rows.iter().all(|r| match r.status {
            Status::Fail => false,
            Status::Warn => !strict,
            Status::Pass | Status::Skip => true,
        })
    }

    pub fn row(&self, row: Row) -> Option<&RowResult> {
        self.rows.iter().find(|r| r.row == row)
    }
}

/// What the caller asks of the kit.
#[derive(Debug, Clone, Default)]
pub struct KitOptions {
    /// `--base REF`: the scope row compares the checkout with it.
    pub base: Option<String>,
    /// `--online`: the advisory provider-links row fetches each provider page.
    pub online: bool,
}

/// The files of a bobbin directory, read once.
struct Dir {
    path: PathBuf,
    /// Relative path -> text (files that are not UTF-8 or too large are absent).
    texts: Vec<(String, String)>,
    /// Relative paths of every regular file.
    files: Vec<String>,
}

impl Dir {
    fn read(path: &Path) -> Dir {
        let mut files = Vec::new();
        walk(path, path, &mut files);
        files.sort();
        let texts = files
            .iter()
            .filter(|f| {
                std::fs::metadata(path.join(f)).is_ok_and(|m| m.len() <= KIT_FILE_BYTES_MAX)
            })
            .filter_map(|f| {
                std::fs::read_to_string(path.join(f))
                    .ok()
                    .map(|t| (f.clone(), t))
            })
            .collect();
        Dir {
            path: path.to_path_buf(),
            texts,
            files,
        }
    }

    fn text(&self, rel: &str) -> Option<&str> {
        self.texts
            .iter()
            .find(|(f, _)| f == rel)
            .map(|(_, t)| t.as_str())
    }
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.filter_map(Result::ok) {
        let p = e.path();
        let Ok(kind) = e.file_type() else { continue };
        if e.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        if kind.is_dir() {
            walk(root, &p, out);
        } else if kind.is_file()
            && let Ok(rel) = p.strip_prefix(root)
        {
            out.push(rel.to_string_lossy().into_owned());
        }
    }
}

/// Runs every row on the bobbin in `dir`. `catalog` holds the other bobbins (for shadowing
/// and for expanding the documents' config tables).
pub fn check(dir: &Path, catalog: &Catalog, opts: &KitOptions) -> Scorecard {
    let d = Dir::read(dir);
    let canonical = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let (vendor_dir, product_dir) = last_two(&canonical);
    let manifest_text = d.text(MANIFEST_FILE);
    let parsed = manifest_text.map(Manifest::parse);
    let manifest = parsed.as_ref().and_then(|p| p.as_ref().ok());
    let bobbin = manifest
        .map(|m| m.name.to_string())
        .or_else(|| {
            BobbinName::from_dirs(&vendor_dir, &product_dir)
                .ok()
                .map(|n| n.to_string())
        })
        .unwrap_or_else(|| format!("{vendor_dir}.{product_dir}"));
    let mut rows = Vec::new();
    rows.push(row_name(&d, &canonical, &vendor_dir, &product_dir, catalog));
    rows.push(match &parsed {
        None => fail(Row::Manifest, vec![Finding::new(MANIFEST_FILE, 0, "missing; write the manifest (name, version, summary, [provider], [source], [secrets.*], [settings.*], [outputs.*])")]),
        Some(Err(problems)) => fail(Row::Manifest, problems.iter().map(|p| Finding::new(MANIFEST_FILE, p.line, p.message.clone())).collect()),
        Some(Ok(_)) => pass(Row::Manifest),
    });
    let entry = manifest.map(|m| Entry {
        manifest: m.clone(),
        origin: Origin::Path(
            canonical
                .parent()
                .and_then(Path::parent)
                .unwrap_or(&canonical)
                .to_path_buf(),
        ),
        vendor_dir: vendor_dir.clone(),
        product_dir: product_dir.clone(),
        installed: None,
    });
    let with_this = entry
        .as_ref()
        .map(|e| catalog.clone().with_entry(e.clone()));
    match (manifest, with_this.as_ref()) {
        (Some(m), Some(cat)) => {
            rows.push(row_provider(&d, m));
            rows.push(row_files(&d, m));
            rows.push(row_todos(&d));
            rows.push(row_core_only(&canonical));
            rows.push(row_docs(&d, m, cat));
            rows.push(row_captures(&d, m, cat));
        }
        _ => {
            for r in [
                Row::Provider,
                Row::Files,
                Row::Todos,
                Row::Docs,
                Row::Captures,
            ] {
                rows.push(if r == Row::Todos {
                    row_todos(&d)
                } else {
                    skip(r, "the manifest does not parse yet")
                });
                if r == Row::Todos {
                    rows.push(row_core_only(&canonical));
                }
            }
        }
    }
    rows.push(match (manifest, with_this.as_ref()) {
        (Some(m), Some(_)) if m.is_poll() => skip(
            Row::SourceKit,
            "a poll bobbin has no source and no request captures (spec 14.4)",
        ),
        (Some(_), Some(cat)) => row_source_kit(&d, cat),
        _ => skip(Row::SourceKit, "the manifest does not parse yet"),
    });
    rows.push(match (manifest, with_this.as_ref()) {
        (Some(m), Some(cat)) if m.is_poll() => {
            verdict(Row::Processor, self::poll_kit::run(dir, &d.texts, m, cat))
        }
        (Some(m), Some(cat)) => match m.processor() {
            None => skip(Row::Processor, "no [processor]"),
            Some(p) => row_processor(&d, m, p.state, cat),
        },
        _ => skip(Row::Processor, "the manifest does not parse yet"),
    });
    let own = self::own_tests::own_tests(&d.files);
    rows.push(if own.is_empty() {
        skip(
            Row::Tests,
            "no tests/ directory: a bobbin's own tests are executables in tests/, which the kit runs with the network blocked",
        )
    } else {
        verdict(
            Row::Tests,
            self::own_tests::run(&d.path, &bobbin, &own),
        )
    });
    rows.push(match manifest {
        Some(m) => row_provider_links(m, opts.online),
        None => skip(Row::ProviderLinks, "the manifest does not parse yet"),
    });
    rows.push(row_scope(&canonical, &vendor_dir, &product_dir, opts));
    Scorecard {
        bobbin,
        dir: dir.display().to_string(),
        rows,
    }
}

fn last_two(p: &Path) -> (String, String) {
    let mut it = p
        .components()
        .rev()
        .map(|c| c.as_os_str().to_string_lossy().into_owned());
    let product = it.next().unwrap_or_default();
    let vendor = it.next().unwrap_or_default();
    (vendor, product)
}

fn pass(row: Row) -> RowResult {
    RowResult {
        row,
        status: Status::Pass,
        note: None,
        problems: Vec::new(),
    }
}

fn skip(row: Row, why: &str) -> RowResult {
    RowResult {
        row,
        status: Status::Skip,
        note: Some(why.to_string()),
        problems: Vec::new(),
    }
}

fn fail(row: Row, problems: Vec<Finding>) -> RowResult {
    RowResult {
        row,
        status: Status::Fail,
        note: None,
        problems,
    }
}

fn verdict(row: Row, problems: Vec<Finding>) -> RowResult {
    if problems.is_empty() {
        pass(row)
    } else {
        fail(row, problems)
    }
}

/// The directory is in a shipped root: this build's `bobbins/`, the installed copy, or the
/// `bobbins/` of a hookspool checkout (a `Cargo.toml` beside it for package "hookspool"), so
/// CI can check a branch's bobbins with a binary built from another tree.
fn is_shipped(canonical: &Path) -> bool {
    let Some(root) = canonical.parent().and_then(Path::parent) else {
        return false;
    };
    let roots = [
        PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/bobbins")),
        PathBuf::from(embedded::INSTALLED_ROOT),
    ];
    if roots
        .iter()
        .any(|r| std::fs::canonicalize(r).is_ok_and(|r| r == root))
    {
        return true;
    }
    root.file_name().is_some_and(|n| n == "bobbins")
        && root
            .parent()
            .and_then(|checkout| std::fs::read_to_string(checkout.join("Cargo.toml")).ok())
            .and_then(|t| toml::from_str::<toml::Table>(&t).ok())
            .is_some_and(|t| {
                t.get("package")
                    .and_then(|p| p.get("name"))
                    .and_then(|n| n.as_str())
                    == Some(env!("CARGO_PKG_NAME"))
            })
}

fn row_name(
    d: &Dir,
    canonical: &Path,
    vendor_dir: &str,
    product_dir: &str,
    catalog: &Catalog,
) -> RowResult {
    let text = d.text(MANIFEST_FILE).unwrap_or_default();
    let line = Locator::new(text).line(&["name"]);
    let written = toml::from_str::<toml::Table>(text)
        .ok()
        .and_then(|t| t.get("name").and_then(|v| v.as_str()).map(str::to_string));
    let Some(written) = written else {
        return fail(
            Row::Name,
            vec![Finding::new(
                MANIFEST_FILE,
                line,
                format!(
                    "name = \"<vendor>.<product>\" is required; for this directory write name = \"{}.{}\"",
                    vendor_dir.replace('_', "-"),
                    product_dir.replace('_', "-")
                ),
            )],
        );
    };
    let name = match BobbinName::parse(&written) {
        Ok(n) => n,
        Err(e) => {
            return fail(
                Row::Name,
                vec![Finding::new(MANIFEST_FILE, line, format!("name: {e}"))],
            );
        }
    };
    let shipped = is_shipped(canonical);
    let existing = catalog
        .get(&name.to_string())
        .filter(|e| e.origin == Origin::BuiltIn && !shipped)
        .map(|e| e.origin.clone());
    match check_layout(&name, vendor_dir, product_dir, shipped, existing.as_ref()) {
        Ok(()) => pass(Row::Name),
        Err(why) => fail(Row::Name, vec![Finding::new(MANIFEST_FILE, line, why)]),
    }
}

fn needs(m: &Manifest) -> ProviderNeeds {
    ProviderNeeds {
        poll: m.is_poll(),
        has_secret: !m.secrets.is_empty(),
    }
}

/// The frontmatter every document repeats: bobbin, provider, and the docs page.
fn expected_frontmatter(m: &Manifest) -> Vec<(&'static str, String)> {
    let page = if m.is_poll() {
        ProviderKey::ApiDocs
    } else {
        ProviderKey::WebhookDocs
    };
    vec![
        ("bobbin", m.name.to_string()),
        ("provider", m.provider.display()),
        (
            page.as_str(),
            m.provider.get(page).unwrap_or_default().to_string(),
        ),
    ]
}

fn row_provider(d: &Dir, m: &Manifest) -> RowResult {
    let text = d.text(MANIFEST_FILE).unwrap_or_default();
    let loc = Locator::new(text);
    let audit = m.provider.audit(needs(m));
    let placeholder = audit.len() == 1 && audit[0].1.contains("placeholders");
    let mut problems: Vec<Finding> = audit
        .into_iter()
        .map(|(k, msg)| {
            Finding::new(
                MANIFEST_FILE,
                loc.line(&["provider", k.as_str()]),
                format!("provider.{}: {msg}", k.as_str()),
            )
        })
        .collect();
    if placeholder {
        // One message for a scaffold: the frontmatter repeats the same placeholders.
        return fail(Row::Provider, problems);
    }
    let expected = expected_frontmatter(m);
    for doc in DOCUMENTS {
        let Some(t) = d.text(doc) else { continue };
        match Frontmatter::parse(t) {
            Err(e) => problems.push(Finding::new(doc, e.line, e.message)),
            Ok(f) => problems.extend(
                f.compare(&expected, doc == "AGENTS.md")
                    .into_iter()
                    .map(|(n, msg)| Finding::new(doc, n, msg)),
            ),
        }
    }
    verdict(Row::Provider, problems)
}

fn row_files(d: &Dir, m: &Manifest) -> RowResult {
    use std::os::unix::fs::PermissionsExt;
    let mut problems = Vec::new();
    for doc in DOCUMENTS {
        if !d.files.iter().any(|f| f == doc) {
            let what = match doc {
                "README.md" => {
                    "what it does, how it works, settings, outputs, limits, and where each capture came from"
                }
                "SETUP.md" => {
                    "the setup for a person: provider-side steps, secrets, the config table, verify, rollback"
                }
                _ => "the setup for an agent: Needs from the human, then numbered steps",
            };
            problems.push(Finding::new(
                doc,
                0,
                format!("missing; write {doc} ({what}), opening with the frontmatter"),
            ));
        }
    }
    let kit = format!("{CAPTURES_DIR}/{KIT_FILE}");
    if !d.files.contains(&kit) {
        problems.push(Finding::new(&kit, 0, "missing; write instance = \"<name>\", [bobbin] (the instance table without secrets) and [secrets] (test values)"));
    }
    if !m.is_poll()
        && !d
            .files
            .iter()
            .any(|f| f.starts_with(&format!("{CAPTURES_DIR}/")) && f.ends_with(".http"))
    {
        problems.push(Finding::new(
            CAPTURES_DIR,
            0,
            "no captures; add captures/<name>.http, an accepted and a rejected delivery",
        ));
    }
    let loc = Locator::new(d.text(MANIFEST_FILE).unwrap_or_default());
    for (key, file) in m.code_files() {
        // `processor.exec`, `poll.loads[1]`: the table and the key, for the line.
        let (table, field) = key.split_once('.').unwrap_or((key.as_str(), ""));
        let field = field.split('[').next().unwrap_or(field);
        let line = loc.line(&[table, field]);
        let exec = field == "exec";
        match std::fs::metadata(d.path.join(file)) {
            Ok(meta) if meta.is_file() && (!exec || meta.permissions().mode() & 0o111 != 0) => {}
            Ok(meta) if meta.is_file() => problems.push(Finding::new(
                MANIFEST_FILE,
                line,
                format!("{file} is not executable; run chmod +x {file}"),
            )),
            _ => problems.push(Finding::new(
                MANIFEST_FILE,
                line,
                format!(
                    "{key} names {file}, which is not a file in this bobbin; add it or fix the name"
                ),
            )),
        }
    }
    verdict(Row::Files, problems)
}

/// The source kit over every capture, through the kit instance's real source
/// ([`source_kit`]).
fn row_source_kit(d: &Dir, catalog: &Catalog) -> RowResult {
    let (problems, checked) = self::source_kit::check(&d.texts, catalog);
    if problems.is_empty() && checked == 0 {
        return fail(
            Row::SourceKit,
            vec![Finding::new(
                CAPTURES_DIR,
                0,
                "no capture beside captures/kit.toml; add the accepted and rejected .http captures",
            )],
        );
    }
    verdict(Row::SourceKit, problems)
}

/// Each accepted capture's batch through the processor against the kit's stub answers
/// ([`processor_kit`]).
fn row_processor(d: &Dir, m: &Manifest, stateful: bool, catalog: &Catalog) -> RowResult {
    let outputs: Vec<String> = m
        .outputs
        .keys()
        .filter(|k| **k != OutputKey::All)
        .map(|k| k.as_str().to_string())
        .collect();
    verdict(
        Row::Processor,
        self::processor_kit::check(&d.texts, &outputs, stateful, catalog),
    )
}

fn row_todos(d: &Dir) -> RowResult {
    let mut problems = Vec::new();
    for (file, text) in &d.texts {
        for (i, line) in text.lines().enumerate() {
            if line.contains("TODO") {
                problems.push(Finding::new(file, i + 1, "a TODO placeholder; fill it in"));
            }
        }
    }
    verdict(Row::Todos, problems)
}

/// `word` appears in `text` as a whole word (not inside a longer identifier).
fn mentions(text: &str, word: &str) -> bool {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices(word).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + word.len()..].chars().next();
        before.is_none_or(|c| !ident(c)) && after.is_none_or(|c| !ident(c))
    })
}

/// The ```toml blocks of a document that hold a `[bobbins.` table: (first line, text).
fn config_blocks(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut current: Option<(usize, String)> = None;
    for (i, line) in text.lines().enumerate() {
        let t = line.trim();
        match &mut current {
            None if t.starts_with("```toml") => current = Some((i + 2, String::new())),
            Some(_) if t.starts_with("```") => {
                let (n, body) = current.take().unwrap_or_default();
                if body.contains("[bobbins.") {
                    out.push((n, body));
                }
            }
            Some((_, body)) => {
                body.push_str(line);
                body.push('\n');
            }
            None => {}
        }
    }
    out
}

fn row_docs(d: &Dir, m: &Manifest, catalog: &Catalog) -> RowResult {
    let mut problems = Vec::new();
    for doc in ["SETUP.md", "AGENTS.md"] {
        let Some(text) = d.text(doc) else {
            problems.push(Finding::new(doc, 0, "missing; the setup is described for a person (SETUP.md) and for an agent (AGENTS.md)"));
            continue;
        };
        for name in m.secrets.keys() {
            if !mentions(text, &format!("secrets.{name}")) {
                problems.push(Finding::new(doc, 0, format!("the secret {name} is not shown; say where to create it and write secrets.{name} = {{ file = \"...\" }} in the config table")));
            }
        }
        for (name, spec) in &m.settings {
            if spec.required && !mentions(text, name) {
                problems.push(Finding::new(doc, 0, format!("the required setting {name} is not mentioned; say how to find its value and set it in the config table")));
            }
        }
        let blocks = config_blocks(text);
        if blocks.is_empty() {
            problems.push(Finding::new(doc, 0, format!("show the config table in a ```toml block: [bobbins.<instance>] with bobbin = \"{}\"", m.name)));
        }
        for (line, block) in blocks {
            match toml::from_str::<toml::Table>(&block) {
                Err(e) => problems.push(Finding::new(
                    doc,
                    line,
                    format!(
                        "the config table is not valid TOML ({}); fix the block",
                        e.message()
                    ),
                )),
                Ok(_) => {
                    for e in load_config_block(&block, catalog) {
                        problems.push(Finding::new(
                            doc,
                            line,
                            format!("the config table does not expand: {e}"),
                        ));
                    }
                }
            }
        }
        if doc == "AGENTS.md" {
            if !text
                .lines()
                .any(|l| l.to_ascii_lowercase().contains("needs from the human"))
            {
                problems.push(Finding::new(doc, 0, "add a \"Needs from the human\" list (accounts, consents, values only a person can give, steps that spend money or change a shared account) before the steps"));
            }
            let numbered = text.lines().filter(|l| {
                let t = l.trim_start();
                let digits = t.chars().take_while(char::is_ascii_digit).count();
                digits > 0 && t[digits..].starts_with(". ")
            });
            if numbered.count() < 2 {
                problems.push(Finding::new(doc, 0, "write the procedure as numbered steps (1. ..., 2. ...), each with its goal, the command, what to check and what to do if the check fails"));
            }
        }
    }
    verdict(Row::Docs, problems)
}

/// A document's config block through the config loader itself (`config::parse`, with the
/// expansion and every check of the expanded tables; nothing on the host is read), home
/// [`KIT_HOME`]. Returns its problems.
fn load_config_block(block: &str, catalog: &Catalog) -> Vec<String> {
    let inputs = crate::config::PathInputs {
        home_flag: Some(KIT_HOME.into()),
        ..Default::default()
    };
    match crate::config::parse_with_catalog(block, None, &inputs, false, catalog) {
        Ok(_) => Vec::new(),
        Err(problems) => problems.iter().map(|p| p.to_string()).collect(),
    }
}

fn row_captures(d: &Dir, m: &Manifest, catalog: &Catalog) -> RowResult {
    if m.is_poll() {
        let mut problems = self::poll_kit::captures(&d.texts);
        for (file, text) in d.texts.iter().filter(|(f, _)| f.starts_with("captures/")) {
            scan_lines(file, text, &mut problems);
        }
        return verdict(Row::Captures, problems);
    }
    let mut problems = Vec::new();
    let mut warnings = Vec::new();
    let mut verdicts = Vec::new();
    let prefix = format!("{CAPTURES_DIR}/");
    for (file, text) in d.texts.iter().filter(|(f, _)| f.starts_with(&prefix)) {
        if file.ends_with(".http") {
            match Capture::parse(file, text) {
                Err(found) => problems.extend(found),
                Ok(c) => {
                    if !file[prefix.len()..].contains('/') {
                        verdicts.push(c.verdict());
                    }
                    if c.source.as_deref().is_none_or(str::is_empty) {
                        warnings.push(Finding::new(file, 1, "say where the capture came from; add # source: <the provider's docs page or test vector, and what was redacted>"));
                    }
                    if let Err(e) = crate::sources::parse_capture(&c.request, 0.0) {
                        problems.push(Finding::new(file, c.request_line, e.to_string()));
                    }
                }
            }
        }
        scan_lines(file, text, &mut problems);
    }
    for (want, example) in [
        (Verdict::Accepted, "accepted"),
        (Verdict::Unauthorized, "unauthorized"),
    ] {
        if !verdicts.contains(&Some(want)) {
            problems.push(Finding::new(
                CAPTURES_DIR,
                0,
                format!(
                    "no capture says # expect: verdict = \"{example}\"; add a {} delivery",
                    if want == Verdict::Accepted {
                        "real, verified"
                    } else {
                        "wrongly signed (rejected)"
                    }
                ),
            ));
        }
    }
    let kit = format!("{CAPTURES_DIR}/{KIT_FILE}");
    if let Some(text) = d.text(&kit) {
        match KitFile::parse(&kit, text) {
            Err(f) => problems.push(f),
            Ok(k) => problems.extend(check_kit_file(&kit, text, &k, m, catalog)),
        }
    }
    if problems.is_empty() && !warnings.is_empty() {
        return RowResult {
            row: Row::Captures,
            status: Status::Warn,
            note: None,
            problems: warnings,
        };
    }
    problems.extend(warnings);
    verdict(Row::Captures, problems)
}

fn scan_lines(file: &str, text: &str, problems: &mut Vec<Finding>) {
    for (i, line) in text.lines().enumerate() {
        if let Some(why) = scan::secret_looking(line) {
            problems.push(Finding::new(file, i + 1, why));
        }
        if let Some(why) = scan::personal_data(line) {
            problems.push(Finding::new(file, i + 1, why));
        }
    }
}

/// kit.toml: its instance, its bobbin table (which must expand), and its test secrets.
fn check_kit_file(
    file: &str,
    text: &str,
    k: &KitFile,
    m: &Manifest,
    catalog: &Catalog,
) -> Vec<Finding> {
    let loc = Locator::new(text);
    let mut out = Vec::new();
    if !is_instance_name(&k.instance) {
        out.push(Finding::new(
            file,
            loc.line(&["instance"]),
            format!(
                "instance is a plain identifier; write instance = \"{}\"",
                m.name.product()
            ),
        ));
    }
    if k.bobbin.get("bobbin").and_then(|v| v.as_str()) != Some(m.name.to_string().as_str()) {
        out.push(Finding::new(
            file,
            loc.line(&["bobbin", "bobbin"]),
            format!(
                "[bobbin] is this bobbin's instance; write bobbin = \"{}\"",
                m.name
            ),
        ));
    }
    if k.bobbin.contains_key("secrets") {
        out.push(Finding::new(
            file,
            loc.line(&["bobbin", "secrets"]),
            "test secrets go in [secrets] as values, not in [bobbin]; move them",
        ));
    }
    for name in k.secrets.keys() {
        if !m.secrets.contains_key(name) {
            out.push(Finding::new(
                file,
                loc.line(&["secrets", name]),
                format!("{} declares no secret {name}; remove it", m.name),
            ));
        }
    }
    for (name, spec) in &m.secrets {
        if spec.required && !k.secrets.contains_key(name) {
            out.push(Finding::new(file, loc.line(&["secrets"]), format!("the required secret {name} needs a test value; write {name} = \"<a made-up test key or the provider's published test vector>\"")));
        }
    }
    if !out.is_empty() {
        return out;
    }
    let root = k.config_root(|n| format!("{KIT_SECRET_DIR}/{n}"));
    if let Err(errors) = expand_config(&root, catalog, Path::new(KIT_HOME)) {
        for e in errors {
            out.push(Finding::new(
                file,
                loc.line(&["bobbin"]),
                format!("the kit instance does not expand: {e}"),
            ));
        }
    }
    out
}

/// core-only (14.3.7): what a bobbin runs is its own files and core's runtime, nothing
/// else. Its vendor directory holds only product directories (no code or file shared by
/// the vendor's bobbins: what they need in common goes to core), and no link inside the
/// bobbin leads out of it (to core's files or another bobbin's).
fn row_core_only(canonical: &Path) -> RowResult {
    let mut problems = Vec::new();
    if let Some(vendor) = canonical.parent()
        && let Ok(rd) = std::fs::read_dir(vendor)
    {
        let mut names: Vec<(String, bool)> = rd
            .filter_map(Result::ok)
            .map(|e| {
                let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
                (e.file_name().to_string_lossy().into_owned(), is_dir)
            })
            .filter(|(n, is_dir)| !is_dir && !n.starts_with('.'))
            .collect();
        names.sort();
        for (name, _) in names {
            problems.push(Finding::new(
                format!("../{name}"),
                0,
                "the vendor directory holds only its products' directories, no code or file of its own; move it into a bobbin's directory, or propose what the vendor's bobbins share to core",
            ));
        }
    }
    let mut links = Vec::new();
    walk_links(canonical, canonical, &mut links);
    links.sort();
    for rel in links {
        let target = std::fs::canonicalize(canonical.join(&rel));
        let inside = target.as_ref().is_ok_and(|t| t.starts_with(canonical));
        if !inside {
            let to = target
                .map(|t| t.display().to_string())
                .unwrap_or_else(|_| "nowhere (a dangling link)".to_string());
            problems.push(Finding::new(
                rel,
                0,
                format!("a symlink to {to}, outside the bobbin: a bobbin runs only its own files; copy what it needs into the bobbin, or propose it to core"),
            ));
        }
    }
    verdict(Row::CoreOnly, problems)
}

/// The relative paths of every symlink below `dir` (hidden entries included).
fn walk_links(root: &Path, dir: &Path, out: &mut Vec<String>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.filter_map(Result::ok) {
        let p = e.path();
        let Ok(kind) = e.file_type() else { continue };
        if kind.is_symlink() {
            if let Ok(rel) = p.strip_prefix(root) {
                out.push(rel.to_string_lossy().into_owned());
            }
        } else if kind.is_dir() {
            walk_links(root, &p, out);
        }
    }
}

/// The advisory provider-links row (14.3.2): with `--online`, each provider page answers
/// 2xx or 3xx to a HEAD, else to a GET (10 s each, redirects followed). A page that does not
/// is a warning, never a failure: a documentation site being down blocks nothing.
fn row_provider_links(m: &Manifest, online: bool) -> RowResult {
    if !online {
        return skip(
            Row::ProviderLinks,
            "advisory; give --online to fetch each provider page (HEAD, then GET)",
        );
    }
    let pages: Vec<(ProviderKey, String)> = m
        .provider
        .entries()
        .filter(|(k, _)| k.is_url())
        .map(|(k, v)| (k, v.to_string()))
        .collect();
    let problems = match fetch_pages(&pages) {
        Ok(p) => p,
        Err(why) => vec![Finding::new(MANIFEST_FILE, 0, why)],
    };
    RowResult {
        row: Row::ProviderLinks,
        status: if problems.is_empty() {
            Status::Pass
        } else {
            Status::Warn
        },
        note: None,
        problems,
    }
}

/// How long one provider page may take, per request.
pub const PROVIDER_LINK_S_MAX: u64 = 10;
/// Redirects a provider page may take.
pub const PROVIDER_LINK_REDIRECTS_MAX: usize = 10;

/// HEAD, then GET, each page; one finding per page that answered neither with 2xx/3xx.
fn fetch_pages(pages: &[(ProviderKey, String)]) -> Result<Vec<Finding>, String> {
    let endpoints = crate::processor::http::Endpoints::from_env()
        .map_err(|e| format!("cannot fetch the provider pages: {e}"))?;
    let client = reqwest::Client::builder()
        .user_agent(crate::destinations::USER_AGENT)
        .timeout(Duration::from_secs(PROVIDER_LINK_S_MAX))
        .redirect(reqwest::redirect::Policy::limited(
            PROVIDER_LINK_REDIRECTS_MAX,
        ))
        .no_proxy()
        .build()
        .map_err(|e| format!("cannot build an HTTP client: {e}"))?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start a runtime: {e}"))?;
    let fine = |s: reqwest::StatusCode| s.is_success() || s.is_redirection();
    Ok(rt.block_on(async {
        let mut problems = Vec::new();
        for (key, page) in pages {
            let Ok(url) = endpoints.resolve(page) else {
                problems.push(Finding::new(
                    MANIFEST_FILE,
                    0,
                    format!("provider.{}: {page} is not an https URL; write the page's https address", key.as_str()),
                ));
                continue;
            };
            let head = client.head(url.clone()).send().await;
            if head.as_ref().is_ok_and(|r| fine(r.status())) {
                continue;
            }
            let got = client.get(url).send().await;
            let said = match (&head, &got) {
                (_, Ok(r)) if fine(r.status()) => continue,
                (Ok(h), Ok(g)) => format!("answered {} to HEAD and {} to GET", h.status().as_u16(), g.status().as_u16()),
                (Err(_), Ok(g)) => format!("answered {} to GET (HEAD failed)", g.status().as_u16()),
                (_, Err(e)) if e.is_timeout() => format!("did not answer within {PROVIDER_LINK_S_MAX} s"),
                (_, Err(e)) if e.is_redirect() => format!("redirected more than {PROVIDER_LINK_REDIRECTS_MAX} times"),
                (_, Err(_)) => "could not be reached (DNS, connection or TLS)".to_string(),
            };
            problems.push(Finding::new(
                MANIFEST_FILE,
                0,
                format!("provider.{}: {page} {said}; fix the link, or check it by hand if the site refuses automated requests", key.as_str()),
            ));
        }
        problems
    }))
}

fn row_scope(
    canonical: &Path,
    vendor_dir: &str,
    product_dir: &str,
    opts: &KitOptions,
) -> RowResult {
    let Some(base) = &opts.base else {
        return skip(
            Row::Scope,
            "give --base <git ref> to compare this checkout's changes with a branch",
        );
    };
    let git = |args: &[&str]| -> Result<String, String> {
        let mut argv = vec![
            "git".to_string(),
            "-C".into(),
            canonical.display().to_string(),
        ];
        argv.extend(args.iter().map(|a| a.to_string()));
        let out = crate::sandbox::run_trusted(
            &argv,
            Duration::from_secs(GIT_TIMEOUT_S),
            GIT_OUTPUT_BYTES_MAX,
            false,
        )
        .map_err(|e| format!("git could not run ({e}); install git or leave out --base"))?;
        if !out.status.success() || out.timed_out {
            return Err(format!(
                "git {} failed; check that {} is in a git checkout and {base} is a ref",
                args.join(" "),
                canonical.display()
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let result = (|| -> Result<Vec<String>, String> {
        let top = PathBuf::from(git(&["rev-parse", "--show-toplevel"])?.trim());
        let top = std::fs::canonicalize(&top).unwrap_or(top);
        let rel = canonical
            .strip_prefix(&top)
            .map_err(|_| "the bobbin is not inside its checkout".to_string())?;
        // What this branch changed since it left `base` (committed or not), not what `base`
        // changed since.
        let fork = git(&["merge-base", base.as_str(), "HEAD"])?;
        let changed = git(&["diff", "--name-only", fork.trim()])?;
        let untracked = git(&[
            "ls-files",
            "--others",
            "--exclude-standard",
            "--full-name",
            "--",
            ":/",
        ])?;
        let bobbin_prefix = format!("{}/", rel.display());
        let test_file = format!(
            "tests/bobbins/{}_{}.rs",
            vendor_dir.replace('-', "_"),
            product_dir.replace('-', "_")
        );
        Ok(changed
            .lines()
            .chain(untracked.lines())
            .filter(|f| !f.is_empty() && !f.starts_with(&bobbin_prefix) && *f != test_file)
            .map(str::to_string)
            .collect())
    })();
    match result {
        Err(why) => RowResult {
            row: Row::Scope,
            status: Status::Warn,
            note: None,
            problems: vec![Finding::new(canonical.display().to_string(), 0, why)],
        },
        Ok(outside) if outside.is_empty() => RowResult {
            row: Row::Scope,
            status: Status::Pass,
            note: Some("bobbin-only".into()),
            problems: Vec::new(),
        },
        Ok(outside) => RowResult {
            row: Row::Scope,
            status: Status::Warn,
            note: Some("touches-core".into()),
            problems: outside
                .into_iter()
                .map(|f| {
                    Finding::new(
                        f,
                        0,
                        "outside the bobbin: a change here is reviewed as a core change",
                    )
                })
                .collect(),
        },
    }
}
