//! The manifest, `bobbin.toml` (spec 14.3.2, 14.3.2a, with room for 14.3.4 and 14.4).
//!
//! Owns: [`Manifest`], parsed from the text and validated into types that cannot be invalid,
//! with every rule of 14.3.2: unknown keys (by path), the name, exactly one of `builtin`/
//! `template` (`module` refused with the Rust build's advice), a span that is a preset,
//! settings with a type of string|int|bool|list|path|table, defaults of that type (and of
//! the setting's constraints: `format`, `min`/`max`, `pattern`, issue 29), a
//! default for every non-required setting, `[provider]` values that are strings, output keys
//! that are event-type tokens or `"*"`; and 14.3.2a's template-settings rules. Every problem
//! carries the line it is about and says what to write instead.
//!
//! `[processor]` takes `exec = "<file in the bobbin>"` (an executable the processor runtime
//! runs) or `builtin = "<name>"` (a Rust processor compiled in), and `loads = [...]`, the
//! other files of the bobbin its code reads or runs (held to the same owner and mode rules
//! as the executable, [`Manifest::code_files`]). `[poll]` (14.4) takes the
//! same choice for its poller, with `every_s` (at least [`POLL_EVERY_S_MIN`]), `jitter_s`
//! (0 to [`POLL_JITTER_S_MAX`], by default a tenth of `every_s` capped there), `timeout_s`
//! and `state` (default true), and refuses `[source]` or `[processor]` beside it.
//!
//! Must not: read files or know where the bobbin lives (the catalogue checks the directory;
//! the kit checks that an `exec` file exists).

use std::collections::BTreeMap;

use super::locate::Locator;
use super::name::BobbinName;
use super::provider::Provider;
use super::template_keys::{self, SETTINGS_FORM_REQUIRED};

/// A processor's or poll's default time limit (spec 14.3.2).
pub const PROCESSOR_TIMEOUT_S_DEFAULT: u64 = crate::limits::SCRIPT_TIMEOUT_S_DEFAULT;
/// The longest a processor or one poll may run.
pub const PROCESSOR_TIMEOUT_S_MAX: u64 = 3_600;
/// The shortest poll interval (14.4).
pub const POLL_EVERY_S_MIN: u64 = 60;
/// The longest poll jitter (14.4), also the cap of its default.
pub const POLL_JITTER_S_MAX: u64 = 300;
/// The longest event-type token, in bytes.
pub const EVENT_TYPE_BYTES_MAX: usize = 64;

pub use super::setting_type::SettingType;

#[derive(Debug, Clone, PartialEq)]
pub struct SecretSpec {
    pub description: String,
    /// The processor needs it too (14.3.4); the source gets it regardless.
    pub processor: bool,
    /// Default true: an instance must give it.
    pub required: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SettingSpec {
    pub description: String,
    pub ty: SettingType,
    pub required: bool,
    /// Present on every non-required setting, of type `ty`.
    pub default: Option<toml::Value>,
    /// What the code needs of the value beyond its type (`format`, `min`/`max`,
    /// `pattern`); the expansion refuses a value that breaks one, on every load.
    pub constraints: Constraints,
}

impl SettingSpec {
    /// The type and the constraints, for an instance's value (and a default): `Err` says
    /// what to write. An empty string of a setting that is not required means unset, and
    /// meets every constraint.
    pub fn check(&self, v: &toml::Value) -> Result<(), String> {
        self.ty.check(v)?;
        if !self.required && v.as_str() == Some("") {
            return Ok(());
        }
        self.constraints.check(v)
    }
}

/// A string setting's `format` (issue 29): what the processor or poller refuses otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `https-url`: an `https://` address.
    HttpsUrl,
    /// `url`: an `http://` or `https://` address.
    Url,
}

impl Format {
    pub const ALL: [Format; 2] = [Format::HttpsUrl, Format::Url];

    pub fn as_str(self) -> &'static str {
        match self {
            Format::HttpsUrl => "https-url",
            Format::Url => "url",
        }
    }

    /// The scheme, then an address without white space: what the code that fetches or
    /// signs it checks (a documentation placeholder such as `https://<PUBLIC_HOST>/x` is
    /// not refused here; the sender or the fetch is where a wrong host shows).
    fn check(self, s: &str) -> Result<(), String> {
        let schemes: &[&str] = match self {
            Format::HttpsUrl => &["https://"],
            Format::Url => &["https://", "http://"],
        };
        let ok = schemes.iter().any(|p| {
            s.strip_prefix(p)
                .is_some_and(|rest| !rest.is_empty() && !rest.starts_with('/'))
        }) && !s.chars().any(char::is_whitespace);
        if ok {
            return Ok(());
        }
        Err(match self {
            Format::HttpsUrl => format!(
                "{s:?} is not an https URL; write the https:// address, e.g. \"https://example.org/feed.xml\""
            ),
            Format::Url => format!(
                "{s:?} is not an http(s) URL; write the full address, e.g. \"https://example.org/hooks/x\""
            ),
        })
    }
}

/// The longest `pattern` a manifest may give, in bytes, and the size its compiled form may
/// take (the regex crate's size limit).
pub const SETTING_PATTERN_BYTES_MAX: usize = 512;
const SETTING_PATTERN_COMPILED_BYTES_MAX: usize = 256 * 1024;

/// A setting's constraints beyond its type (`[settings.<name>]` `format`, `min`, `max`,
/// `pattern`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Constraints {
    /// A string's form.
    pub format: Option<Format>,
    /// An int's least and greatest value, inclusive.
    pub min: Option<i64>,
    pub max: Option<i64>,
    /// A regular expression a string (or each string of a list) matches in full.
    pub pattern: Option<String>,
}

impl Constraints {
    pub fn is_empty(&self) -> bool {
        *self == Constraints::default()
    }

    /// `pattern` anchored at both ends, compiled with a size limit.
    fn regex(pattern: &str) -> Result<regex::Regex, String> {
        regex::RegexBuilder::new(&format!("^(?:{pattern})$"))
            .size_limit(SETTING_PATTERN_COMPILED_BYTES_MAX)
            .build()
            .map_err(|_| format!("{pattern:?} is not a regular expression this build can use; write e.g. pattern = \"[a-z0-9-]+\""))
    }

    /// Whether `v` meets every constraint; `Err` says what the value must be.
    pub fn check(&self, v: &toml::Value) -> Result<(), String> {
        if let (Some(f), Some(s)) = (self.format, v.as_str()) {
            f.check(s)?;
        }
        if let Some(i) = v.as_integer() {
            let below = self.min.is_some_and(|m| i < m);
            let above = self.max.is_some_and(|m| i > m);
            if below || above {
                return Err(match (self.min, self.max) {
                    (Some(lo), Some(hi)) => {
                        format!("{i} is out of range; write a whole number from {lo} to {hi}")
                    }
                    (Some(lo), None) => {
                        format!("{i} is too small; write a whole number of at least {lo}")
                    }
                    (None, Some(hi)) => {
                        format!("{i} is too large; write a whole number of at most {hi}")
                    }
                    // below or above needs a bound; said anyway rather than assumed.
                    (None, None) => format!("{i} is out of range"),
                });
            }
        }
        if let Some(p) = &self.pattern {
            let re = Constraints::regex(p)?;
            let strings: Vec<&str> = match v {
                toml::Value::String(s) => vec![s.as_str()],
                toml::Value::Array(a) => a.iter().filter_map(toml::Value::as_str).collect(),
                _ => Vec::new(),
            };
            if let Some(bad) = strings.into_iter().find(|s| !re.is_match(s)) {
                return Err(format!(
                    "{bad:?} does not match the pattern {p:?} the bobbin's code needs; write a value that does"
                ));
            }
        }
        Ok(())
    }
}

/// An `[outputs.<key>]` key.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum OutputKey {
    /// `"*"`: every accepted event.
    All,
    Event(String),
}

impl OutputKey {
    pub fn parse(s: &str) -> Option<OutputKey> {
        if s == "*" {
            Some(OutputKey::All)
        } else if is_event_type_token(s) {
            Some(OutputKey::Event(s.to_string()))
        } else {
            None
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            OutputKey::All => "*",
            OutputKey::Event(e) => e,
        }
    }
}

/// An event-type token: what providers name their events (`push`, `pull_request`,
/// `meeting.started`, `invoice.paid`, `updateCard`, `agent-mail`): ASCII letters, digits,
/// `.`, `_`, `-`, `:`, starting with a letter or digit, at most [`EVENT_TYPE_BYTES_MAX`].
pub fn is_event_type_token(s: &str) -> bool {
    s.len() <= EVENT_TYPE_BYTES_MAX
        && s.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ':'))
}

/// Where a bobbin's source comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum SourceImpl {
    /// `builtin = "<kind>"`: one of `sources::KINDS` other than "template".
    Builtin(&'static str),
    /// `template = { ... }`: a fixed table of template keys.
    Fixed(toml::Table),
    /// `template = "settings"`: every template key from the instance's settings.
    Settings,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SourceSpec {
    pub imp: SourceImpl,
    pub span: Option<String>,
    /// Settings that become keys of a built-in source's own table (`config_keys`).
    pub config: Vec<String>,
    pub sender_retries: Option<bool>,
    pub expect_every_s: Option<u64>,
    pub proxy: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProcessorImpl {
    /// An executable file in the bobbin, relative to its directory.
    Exec(String),
    /// A Rust processor compiled into hookspool (the processors issue names them).
    Builtin(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessorSpec {
    pub imp: ProcessorImpl,
    pub timeout_s: u64,
    /// Keeps state: gets a state_dir.
    pub state: bool,
    /// `loads`: the files in the bobbin its code reads or runs besides the executable
    /// (libraries, data), relative to its directory; held to the same owner and mode rules.
    pub loads: Vec<String>,
}

/// `[poll]` (14.4): a service with no push at all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PollSpec {
    pub every_s: u64,
    pub jitter_s: u64,
    /// `jitter_s` was written (else it is the default, recomputed for an instance that
    /// overrides `every_s`).
    pub jitter_given: bool,
    /// The poller: an executable file in the bobbin, or a poller compiled in.
    pub imp: ProcessorImpl,
    pub timeout_s: u64,
    pub state: bool,
    /// As [`ProcessorSpec::loads`].
    pub loads: Vec<String>,
}

/// The facts of a processor or poller its script destination needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Runner {
    pub timeout_s: u64,
    pub state: bool,
}

/// What the bobbin runs.
#[derive(Debug, Clone, PartialEq)]
pub enum Body {
    Push {
        source: SourceSpec,
        processor: Option<ProcessorSpec>,
    },
    Poll(PollSpec),
}

/// A validated `bobbin.toml`.
#[derive(Debug, Clone, PartialEq)]
pub struct Manifest {
    pub name: BobbinName,
    pub version: String,
    pub summary: String,
    pub provider: Provider,
    pub body: Body,
    pub secrets: BTreeMap<String, SecretSpec>,
    pub settings: BTreeMap<String, SettingSpec>,
    pub outputs: BTreeMap<OutputKey, String>,
}

/// One problem in a manifest: its line, and what to write instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestProblem {
    pub line: usize,
    pub message: String,
}

impl Manifest {
    pub fn source(&self) -> Option<&SourceSpec> {
        match &self.body {
            Body::Push { source, .. } => Some(source),
            Body::Poll(_) => None,
        }
    }

    /// What the instance's script destination runs, a processor or a poller: its time
    /// limit and whether it keeps state.
    pub fn runner(&self) -> Option<Runner> {
        match &self.body {
            Body::Push { processor, .. } => processor.as_ref().map(|p| Runner {
                timeout_s: p.timeout_s,
                state: p.state,
            }),
            Body::Poll(p) => Some(Runner {
                timeout_s: p.timeout_s,
                state: p.state,
            }),
        }
    }

    pub fn processor(&self) -> Option<&ProcessorSpec> {
        match &self.body {
            Body::Push { processor, .. } => processor.as_ref(),
            Body::Poll(_) => None,
        }
    }

    /// Every file the processor or poller runs or loads, with the manifest key that names
    /// it (`processor.exec`, `poll.loads[0]`), relative to the bobbin's directory: what
    /// 14.3.6's owner and mode rules hold (`catalog::check_code`).
    pub fn code_files(&self) -> Vec<(String, &str)> {
        let (table, imp, loads) = match &self.body {
            Body::Push {
                processor: Some(p), ..
            } => ("processor", &p.imp, &p.loads),
            Body::Push { .. } => return Vec::new(),
            Body::Poll(p) => ("poll", &p.imp, &p.loads),
        };
        let exec = match imp {
            ProcessorImpl::Exec(e) => Some((format!("{table}.exec"), e.as_str())),
            ProcessorImpl::Builtin(_) => None,
        };
        exec.into_iter()
            .chain(
                loads
                    .iter()
                    .enumerate()
                    .map(|(i, f)| (format!("{table}.loads[{i}]"), f.as_str())),
            )
            .collect()
    }

    /// The executables the manifest names (processor or poller), relative to its directory.
    pub fn executables(&self) -> Vec<&str> {
        match &self.body {
            Body::Push {
                processor: Some(p), ..
            } => match &p.imp {
                ProcessorImpl::Exec(e) => vec![e.as_str()],
                ProcessorImpl::Builtin(_) => vec![],
            },
            Body::Push { .. } => vec![],
            Body::Poll(p) => match &p.imp {
                ProcessorImpl::Exec(e) => vec![e.as_str()],
                ProcessorImpl::Builtin(_) => vec![],
            },
        }
    }

    pub fn is_poll(&self) -> bool {
        matches!(self.body, Body::Poll(_))
    }

    /// A "settings" template bobbin (hookspool.webhook): instances may map any event type.
    pub fn is_settings_template(&self) -> bool {
        self.source()
            .is_some_and(|s| matches!(s.imp, SourceImpl::Settings))
    }

    /// Parses and validates a manifest's text.
    pub fn parse(text: &str) -> Result<Manifest, Vec<ManifestProblem>> {
        let table: toml::Table = match toml::from_str(text) {
            Ok(t) => t,
            Err(e) => {
                let line = e
                    .span()
                    .map(|s| text[..s.start.min(text.len())].lines().count().max(1))
                    .unwrap_or(1);
                return Err(vec![ManifestProblem {
                    line,
                    message: format!("not valid TOML: {}", e.message()),
                }]);
            }
        };
        let mut r = Reader {
            loc: Locator::new(text),
            problems: Vec::new(),
        };
        let m = r.manifest(&table);
        match m {
            Some(m) if r.problems.is_empty() => Ok(m),
            _ => {
                let mut p = r.problems;
                p.sort_by_key(|p| p.line);
                Err(p)
            }
        }
    }
}

const TOP_KEYS: &[&str] = &[
    "name",
    "version",
    "summary",
    "provider",
    "source",
    "secrets",
    "settings",
    "processor",
    "poll",
    "outputs",
];
const SOURCE_KEYS: &[&str] = &[
    "builtin",
    "template",
    "span",
    "config",
    "sender_retries",
    "expect_every_s",
    "proxy",
];
const SECRET_KEYS: &[&str] = &["description", "processor", "required"];
const SETTING_KEYS: &[&str] = &[
    "description",
    "type",
    "required",
    "default",
    "format",
    "min",
    "max",
    "pattern",
];
const PROCESSOR_KEYS: &[&str] = &["exec", "builtin", "timeout_s", "state", "loads"];
const POLL_KEYS: &[&str] = &[
    "every_s",
    "jitter_s",
    "exec",
    "builtin",
    "timeout_s",
    "state",
    "loads",
];
const OUTPUT_KEYS: &[&str] = &["description"];

const MODULE_SOURCE_ADVICE: &str = "this build has no source modules: write builtin = \"<kind>\" for a source compiled into hookspool, or template = { scheme = ..., key = ... } / template = \"settings\" for the template source";
const MODULE_PROCESSOR_ADVICE: &str = "this build has no processor modules: write exec = \"<an executable file in this bobbin>\" (run by the processor runtime) or builtin = \"<name>\" for a processor compiled into hookspool";

/// Walks the parsed table, collecting problems with their lines.
struct Reader {
    loc: Locator,
    problems: Vec<ManifestProblem>,
}

impl Reader {
    fn problem(&mut self, path: &[&str], message: impl Into<String>) {
        let line = self.loc.line(path);
        self.problems.push(ManifestProblem {
            line,
            message: format!("{}: {}", path.join("."), message.into()),
        });
    }

    fn unknown(&mut self, t: &toml::Table, path: &[&str], allowed: &[&str]) {
        for k in t.keys() {
            if !allowed.contains(&k.as_str()) {
                let mut p = path.to_vec();
                p.push(k);
                let message = match (path, k.as_str()) {
                    (["source"], "module") => MODULE_SOURCE_ADVICE.to_string(),
                    (["processor"] | ["poll"], "module") => MODULE_PROCESSOR_ADVICE.to_string(),
                    _ => format!(
                        "unknown key; remove it (the keys here: {})",
                        allowed.join(", ")
                    ),
                };
                self.problem(&p, message);
            }
        }
    }

    fn string(
        &mut self,
        t: &toml::Table,
        path: &[&str],
        key: &str,
        example: &str,
    ) -> Option<String> {
        let mut p = path.to_vec();
        p.push(key);
        match t.get(key) {
            None => None,
            Some(toml::Value::String(s)) => Some(s.clone()),
            Some(_) => {
                self.problem(&p, format!("must be a string; write {key} = {example}"));
                None
            }
        }
    }

    fn required_string(
        &mut self,
        t: &toml::Table,
        path: &[&str],
        key: &str,
        example: &str,
    ) -> Option<String> {
        let v = self.string(t, path, key, example);
        if v.is_none() && !t.contains_key(key) {
            let mut p = path.to_vec();
            p.push(key);
            self.problem(&p, format!("required; write {key} = {example}"));
        }
        v
    }

    fn boolean(&mut self, t: &toml::Table, path: &[&str], key: &str) -> Option<bool> {
        let mut p = path.to_vec();
        p.push(key);
        match t.get(key) {
            None => None,
            Some(toml::Value::Boolean(b)) => Some(*b),
            Some(_) => {
                self.problem(&p, format!("must be true or false; write {key} = true"));
                None
            }
        }
    }

    /// A whole number in `min..=max`.
    fn int(
        &mut self,
        t: &toml::Table,
        path: &[&str],
        key: &str,
        min: u64,
        max: u64,
    ) -> Option<u64> {
        let mut p = path.to_vec();
        p.push(key);
        match t.get(key) {
            None => None,
            Some(toml::Value::Integer(i)) if *i >= 0 && (min..=max).contains(&(*i as u64)) => {
                Some(*i as u64)
            }
            Some(_) => {
                self.problem(
                    &p,
                    format!(
                        "must be a whole number from {min} to {max}; write {key} = {}",
                        min.max(1)
                    ),
                );
                None
            }
        }
    }

    fn table<'t>(
        &mut self,
        t: &'t toml::Table,
        path: &[&str],
        key: &str,
    ) -> Option<&'t toml::Table> {
        let mut p = path.to_vec();
        p.push(key);
        match t.get(key) {
            None => None,
            Some(toml::Value::Table(t)) => Some(t),
            Some(_) => {
                self.problem(&p, format!("must be a table; write [{}]", p.join(".")));
                None
            }
        }
    }

    fn manifest(&mut self, t: &toml::Table) -> Option<Manifest> {
        self.unknown(t, &[], TOP_KEYS);
        let name_text = self.required_string(t, &[], "name", "\"<vendor>.<product>\"");
        let name = name_text.and_then(|n| match BobbinName::parse(&n) {
            Ok(n) => Some(n),
            Err(e) => {
                self.problem(&["name"], e.to_string());
                None
            }
        });
        let version = self.required_string(t, &[], "version", "\"1\"");
        let summary = self.required_string(
            t,
            &[],
            "summary",
            "\"<one line: what the bobbin receives>\"",
        );
        let provider = match self.table(t, &[], "provider") {
            None => {
                if !t.contains_key("provider") {
                    self.problem(&["provider"], "required; add [provider] with vendor, product, homepage, webhook_docs and signature_docs");
                }
                None
            }
            Some(pt) => match Provider::from_table(pt) {
                Ok(p) => Some(p),
                Err(problems) => {
                    for (k, m) in problems {
                        self.problem(&["provider", &k], m);
                    }
                    None
                }
            },
        };
        let secrets = self.secrets(t);
        let settings = self.settings(t);
        let outputs = self.outputs(t);
        let body = self.body(t, &settings);
        Some(Manifest {
            name: name?,
            version: version?,
            summary: summary?,
            provider: provider?,
            body: body?,
            secrets,
            settings,
            outputs,
        })
    }

    fn secrets(&mut self, t: &toml::Table) -> BTreeMap<String, SecretSpec> {
        let mut out = BTreeMap::new();
        let Some(st) = self.table(t, &[], "secrets") else {
            return out;
        };
        for (name, v) in st {
            let path = ["secrets", name.as_str()];
            if !is_setting_name(name) {
                self.problem(
                    &path,
                    "a secret name is lowercase letters, digits and _; write e.g. [secrets.secret]",
                );
                continue;
            }
            let Some(s) = v.as_table() else {
                self.problem(
                    &path,
                    format!("must be a table; write [secrets.{name}] with description = \"...\""),
                );
                continue;
            };
            self.unknown(s, &path, SECRET_KEYS);
            let description =
                self.required_string(s, &path, "description", "\"<where the sender puts it>\"");
            let processor = self.boolean(s, &path, "processor").unwrap_or(false);
            let required = self.boolean(s, &path, "required").unwrap_or(true);
            if let Some(description) = description {
                out.insert(
                    name.clone(),
                    SecretSpec {
                        description,
                        processor,
                        required,
                    },
                );
            }
        }
        out
    }

    fn settings(&mut self, t: &toml::Table) -> BTreeMap<String, SettingSpec> {
        let mut out = BTreeMap::new();
        let Some(st) = self.table(t, &[], "settings") else {
            return out;
        };
        for (name, v) in st {
            let path = ["settings", name.as_str()];
            if !is_setting_name(name) {
                self.problem(&path, "a setting name is lowercase letters, digits and _; write e.g. [settings.owner]");
                continue;
            }
            let Some(s) = v.as_table() else {
                self.problem(
                    &path,
                    format!("must be a table; write [settings.{name}] with description and type"),
                );
                continue;
            };
            self.unknown(s, &path, SETTING_KEYS);
            let description =
                self.required_string(s, &path, "description", "\"<what it changes>\"");
            let types = SettingType::ALL.map(SettingType::as_str).join("|");
            let ty = match self.string(s, &path, "type", "\"string\"") {
                None => {
                    if !s.contains_key("type") {
                        self.problem(
                            &[path[0], path[1], "type"],
                            format!("required; write type = \"string\" (one of {types})"),
                        );
                    }
                    None
                }
                Some(ty) => match SettingType::parse(&ty) {
                    Some(t) => Some(t),
                    None => {
                        self.problem(
                            &[path[0], path[1], "type"],
                            format!("{ty:?} is not a setting type; write one of {types}"),
                        );
                        None
                    }
                },
            };
            let required = self.boolean(s, &path, "required").unwrap_or(false);
            let default = s.get("default").cloned();
            let Some(ty) = ty else { continue };
            // 14.3.6: a bobbin that supports hooks names them with a path setting.
            if name == "hooks" && ty != SettingType::Path {
                self.problem(
                    &[path[0], path[1], "type"],
                    "the hooks setting names the deployment's hooks program; write type = \"path\" and default = \"\"",
                );
                continue;
            }
            let Some(constraints) = self.constraints(s, name, ty) else {
                continue;
            };
            if let Some(d) = &default
                && let Err(why) = ty.check(d)
            {
                self.problem(&[path[0], path[1], "default"], format!("the default {why}"));
                continue;
            }
            let empty_unset = !required && default.as_ref().and_then(|d| d.as_str()) == Some("");
            if let Some(d) = &default
                && !empty_unset
                && let Err(why) = constraints.check(d)
            {
                self.problem(
                    &[path[0], path[1], "default"],
                    format!("the default: {why}"),
                );
                continue;
            }
            if !required && default.is_none() {
                self.problem(&path, format!("a setting that is not required needs a default; write default = {} (an empty value means unset) or required = true", ty.example()));
                continue;
            }
            if let Some(description) = description {
                out.insert(
                    name.clone(),
                    SettingSpec {
                        description,
                        ty,
                        required,
                        default,
                        constraints,
                    },
                );
            }
        }
        out
    }

    /// A setting's `format`, `min`, `max` and `pattern`, each only on a type it fits.
    fn constraints(&mut self, s: &toml::Table, name: &str, ty: SettingType) -> Option<Constraints> {
        let mut c = Constraints::default();
        let mut ok = true;
        let path = ["settings", name];
        let fits = |key: &str| match key {
            "format" => matches!(ty, SettingType::String),
            "min" | "max" => matches!(ty, SettingType::Int),
            _ => matches!(ty, SettingType::String | SettingType::List),
        };
        for key in ["format", "min", "max", "pattern"] {
            if s.contains_key(key) && !fits(key) {
                let on = match key {
                    "format" => "a string setting",
                    "min" | "max" => "an int setting",
                    _ => "a string or list setting",
                };
                self.problem(
                    &[path[0], path[1], key],
                    format!("{key} applies to {on} only; remove it"),
                );
                ok = false;
            }
        }
        if let Some(f) = self.string(s, &path, "format", "\"https-url\"") {
            match Format::ALL.into_iter().find(|x| x.as_str() == f) {
                Some(x) => c.format = Some(x),
                None => {
                    self.problem(
                        &[path[0], path[1], "format"],
                        format!(
                            "{f:?} is not a format; write one of {}",
                            Format::ALL.map(Format::as_str).join(", ")
                        ),
                    );
                    ok = false;
                }
            }
        }
        for key in ["min", "max"] {
            match s.get(key) {
                None => {}
                Some(toml::Value::Integer(i)) => {
                    if key == "min" {
                        c.min = Some(*i);
                    } else {
                        c.max = Some(*i);
                    }
                }
                Some(_) => {
                    self.problem(
                        &[path[0], path[1], key],
                        format!("must be a whole number; write {key} = 1"),
                    );
                    ok = false;
                }
            }
        }
        if let (Some(lo), Some(hi)) = (c.min, c.max)
            && lo > hi
        {
            self.problem(
                &[path[0], path[1], "min"],
                format!("min {lo} is above max {hi}; swap them"),
            );
            ok = false;
        }
        if let Some(p) = self.string(s, &path, "pattern", "\"[a-z0-9-]+\"") {
            let why = if p.len() > SETTING_PATTERN_BYTES_MAX {
                Some(format!(
                    "longer than {SETTING_PATTERN_BYTES_MAX} bytes; write a shorter pattern"
                ))
            } else {
                Constraints::regex(&p).err()
            };
            match why {
                Some(why) => {
                    self.problem(&[path[0], path[1], "pattern"], why);
                    ok = false;
                }
                None => c.pattern = Some(p),
            }
        }
        ok.then_some(c)
    }

    fn outputs(&mut self, t: &toml::Table) -> BTreeMap<OutputKey, String> {
        let mut out = BTreeMap::new();
        let Some(ot) = self.table(t, &[], "outputs") else {
            self.problem(&["outputs"], "declare at least one output; write [outputs.\"*\"] with description = \"every accepted event\", or one [outputs.<event_type>] per event type");
            return out;
        };
        if ot.is_empty() {
            self.problem(&["outputs"], "declare at least one output; write [outputs.\"*\"] with description = \"every accepted event\"");
        }
        for (k, v) in ot {
            let path = ["outputs", k.as_str()];
            let Some(key) = OutputKey::parse(k) else {
                self.problem(&path, format!("{k:?} is not an event-type token (letters, digits, . _ - :, at most {EVENT_TYPE_BYTES_MAX}) or \"*\"; write e.g. [outputs.push] or [outputs.\"*\"]"));
                continue;
            };
            let Some(o) = v.as_table() else {
                self.problem(
                    &path,
                    format!("must be a table; write [outputs.{k}] with description = \"...\""),
                );
                continue;
            };
            self.unknown(o, &path, OUTPUT_KEYS);
            if let Some(d) =
                self.required_string(o, &path, "description", "\"<what the event means>\"")
            {
                out.insert(key, d);
            }
        }
        out
    }

    fn body(&mut self, t: &toml::Table, settings: &BTreeMap<String, SettingSpec>) -> Option<Body> {
        let source = self.table(t, &[], "source");
        let processor = self.table(t, &[], "processor");
        let poll = self.table(t, &[], "poll");
        if let Some(pt) = poll {
            if source.is_some() || processor.is_some() {
                self.problem(
                    &["poll"],
                    "a poll bobbin has [poll] and no [source] or [processor]; remove one of them",
                );
                return None;
            }
            return self.poll(pt).map(Body::Poll);
        }
        let Some(st) = source else {
            if !t.contains_key("source") {
                self.problem(&["source"], "required; add [source] with builtin = \"<kind>\" or template = { ... } (or [poll] for a service with no push)");
            }
            return None;
        };
        let processor = match processor {
            Some(p) => Some(self.processor(p)?),
            None => None,
        };
        let source = self.source(st, settings, processor.is_some())?;
        Some(Body::Push { source, processor })
    }

    fn source(
        &mut self,
        st: &toml::Table,
        settings: &BTreeMap<String, SettingSpec>,
        has_processor: bool,
    ) -> Option<SourceSpec> {
        let path = ["source"];
        self.unknown(st, &path, SOURCE_KEYS);
        let kinds: Vec<&str> = crate::sources::KINDS
            .iter()
            .copied()
            .filter(|k| *k != "template")
            .collect();
        let imp = match (st.get("builtin"), st.get("template")) {
            (Some(_), Some(_)) => {
                self.problem(&path, "give exactly one of builtin or template; remove one");
                return None;
            }
            (None, None) => {
                if !st.contains_key("module") {
                    self.problem(&path, format!("give exactly one of builtin = \"<kind>\" (one of {}) or template = {{ ... }} / template = \"settings\"", kinds.join(", ")));
                }
                return None;
            }
            (Some(b), None) => {
                let Some(k) = b.as_str().and_then(|b| kinds.iter().find(|k| **k == b)) else {
                    let advice = if b.as_str() == Some("template") {
                        "the template source is not a builtin; write template = { ... } or template = \"settings\"".to_string()
                    } else {
                        format!("not a built-in source; write one of {}", kinds.join(", "))
                    };
                    self.problem(&["source", "builtin"], advice);
                    return None;
                };
                SourceImpl::Builtin(k)
            }
            (None, Some(toml::Value::Table(fixed))) => SourceImpl::Fixed(fixed.clone()),
            (None, Some(toml::Value::String(s))) if s == "settings" => SourceImpl::Settings,
            (None, Some(_)) => {
                self.problem(&["source", "template"], "write template = { scheme = ..., key = ... } (a fixed table) or template = \"settings\"");
                return None;
            }
        };
        let span = self.string(st, &path, "span", "\"burst\"");
        if let Some(s) = &span
            && !crate::sources::SPAN_PRESETS.iter().any(|(p, _, _)| p == s)
        {
            self.problem(
                &["source", "span"],
                format!(
                    "{s:?} is not a span preset; write one of {}",
                    crate::sources::SPAN_PRESETS
                        .iter()
                        .map(|p| p.0)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            );
        }
        let config = match st.get("config") {
            None => Vec::new(),
            Some(toml::Value::Array(a)) if a.iter().all(|v| v.is_str()) => a
                .iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect(),
            Some(_) => {
                self.problem(
                    &["source", "config"],
                    "must be a list of setting names; write config = [\"env\"]",
                );
                Vec::new()
            }
        };
        let sender_retries = self.boolean(st, &path, "sender_retries");
        let expect_every_s = self.int(st, &path, "expect_every_s", 1, u32::MAX as u64);
        let proxy = self.string(st, &path, "proxy", "\"keep the query string\"");
        if proxy.as_deref().is_some_and(|p| p.contains('\n')) {
            self.problem(
                &["source", "proxy"],
                "one line for the reverse-proxy recipe; remove the line breaks",
            );
        }
        self.source_settings(
            &imp,
            &config,
            settings,
            sender_retries.is_some(),
            has_processor,
        );
        Some(SourceSpec {
            imp,
            span,
            config,
            sender_retries,
            expect_every_s,
            proxy,
        })
    }

    /// 14.3.2a, and `config` for built-in sources: every setting reaches the source or the
    /// processor, none overrides a fixed table's key, each template key setting has its type.
    fn source_settings(
        &mut self,
        imp: &SourceImpl,
        config: &[String],
        settings: &BTreeMap<String, SettingSpec>,
        manifest_sender_retries: bool,
        has_processor: bool,
    ) {
        match imp {
            SourceImpl::Builtin(kind) => {
                for c in config {
                    if !settings.contains_key(c) {
                        self.problem(&["source", "config"], format!("{c:?} is not a declared setting; add [settings.{c}] or remove it from config"));
                    }
                }
                if !has_processor {
                    for name in settings.keys().filter(|n| !config.contains(n)) {
                        self.problem(&["settings", name], format!("a bobbin without a processor passes settings only to its source; add \"{name}\" to [source] config (a key of the {kind} source) or remove the setting"));
                    }
                }
            }
            SourceImpl::Fixed(_) | SourceImpl::Settings => {
                if !config.is_empty() {
                    self.problem(&["source", "config"], "a template bobbin's settings named after template keys are already its source's keys; remove config");
                }
                let fixed = match imp {
                    SourceImpl::Fixed(t) => Some(t),
                    _ => None,
                };
                if let Some(t) = fixed {
                    for k in t.keys() {
                        if settings.contains_key(k) {
                            self.problem(&["settings", k], format!("the fixed template already sets {k}; remove the setting (a fixed table's keys are never overridden) or the key from template"));
                        }
                    }
                    if manifest_sender_retries && t.contains_key("sender_retries") {
                        self.problem(
                            &["source", "sender_retries"],
                            "the fixed template already sets sender_retries; say it once",
                        );
                    }
                }
                if manifest_sender_retries && settings.contains_key("sender_retries") {
                    self.problem(
                        &["source", "sender_retries"],
                        "a sender_retries setting already gives the template's value; remove one",
                    );
                }
                for (name, spec) in settings {
                    match template_keys::template_key(name) {
                        Some(key) => {
                            if let Err(why) = template_keys::check_setting_type(key, spec.ty) {
                                self.problem(&["settings", name, "type"], why);
                            }
                        }
                        None if !has_processor => self.problem(&["settings", name], format!("{name} is not a template key, and a template bobbin without a processor would drop it; remove it or name a template key ({})", template_keys::TEMPLATE_KEYS.iter().map(|k| k.name).collect::<Vec<_>>().join(", "))),
                        None => {}
                    }
                }
                if matches!(imp, SourceImpl::Settings) {
                    for k in SETTINGS_FORM_REQUIRED {
                        if !settings.contains_key(*k) {
                            self.problem(&["settings"], format!("a template = \"settings\" bobbin takes every template key from settings; add [settings.{k}] with required = true"));
                        }
                    }
                }
            }
        }
    }

    fn exec(&mut self, t: &toml::Table, path: &[&str]) -> Option<String> {
        let e = self.string(t, path, "exec", "\"processor\"")?;
        if !is_bobbin_file(&e) {
            let mut p = path.to_vec();
            p.push("exec");
            self.problem(
                &p,
                "a file inside this bobbin's directory, relative to it; write exec = \"processor\"",
            );
            return None;
        }
        Some(e)
    }

    /// `loads = ["lib/common.sh", ...]`: files inside the bobbin's directory.
    fn loads(&mut self, t: &toml::Table, table: &str) -> Vec<String> {
        let path = [table, "loads"];
        match t.get("loads") {
            None => Vec::new(),
            Some(toml::Value::Array(a)) => {
                let files: Vec<Option<&str>> = a.iter().map(toml::Value::as_str).collect();
                if files.iter().all(|f| f.is_some_and(is_bobbin_file)) {
                    files.into_iter().flatten().map(str::to_string).collect()
                } else {
                    self.problem(&path, "a list of files inside this bobbin's directory, relative to it; write loads = [\"lib/common.sh\"]");
                    Vec::new()
                }
            }
            Some(_) => {
                self.problem(
                    &path,
                    "must be a list of files in this bobbin; write loads = [\"lib/common.sh\"]",
                );
                Vec::new()
            }
        }
    }

    fn processor(&mut self, pt: &toml::Table) -> Option<ProcessorSpec> {
        let path = ["processor"];
        self.unknown(pt, &path, PROCESSOR_KEYS);
        let imp = self.implementation(pt, "processor")?;
        let timeout_s = self
            .int(pt, &path, "timeout_s", 1, PROCESSOR_TIMEOUT_S_MAX)
            .unwrap_or(PROCESSOR_TIMEOUT_S_DEFAULT);
        let state = self.boolean(pt, &path, "state").unwrap_or(true);
        let loads = self.loads(pt, "processor");
        Some(ProcessorSpec {
            imp,
            timeout_s,
            state,
            loads,
        })
    }

    /// `exec = "<file>"` or `builtin = "<name>"`, exactly one, in `[processor]` or `[poll]`.
    fn implementation(&mut self, pt: &toml::Table, table: &str) -> Option<ProcessorImpl> {
        let path = [table];
        match (pt.contains_key("exec"), pt.get("builtin")) {
            (true, Some(_)) => {
                self.problem(&path, "give exactly one of exec or builtin; remove one");
                None
            }
            (true, None) => Some(ProcessorImpl::Exec(self.exec(pt, &path)?)),
            (false, Some(toml::Value::String(b))) if is_processor_name(b) => {
                Some(ProcessorImpl::Builtin(b.clone()))
            }
            (false, Some(_)) => {
                self.problem(&[table, "builtin"], format!("a built-in {table}'s name: lowercase letters, digits, _, - and . (e.g. the bobbin's own name); write builtin = \"google.gmail\""));
                None
            }
            (false, None) => {
                if !pt.contains_key("module") {
                    self.problem(
                        &path,
                        "give exec = \"<file in this bobbin>\" or builtin = \"<name>\"",
                    );
                }
                None
            }
        }
    }

    fn poll(&mut self, pt: &toml::Table) -> Option<PollSpec> {
        let path = ["poll"];
        self.unknown(pt, &path, POLL_KEYS);
        let every_s = self.int(pt, &path, "every_s", POLL_EVERY_S_MIN, u32::MAX as u64);
        if !pt.contains_key("every_s") {
            self.problem(
                &["poll", "every_s"],
                format!("required; write every_s = 900 (at least {POLL_EVERY_S_MIN})"),
            );
        }
        let jitter_s = self.int(pt, &path, "jitter_s", 0, POLL_JITTER_S_MAX);
        let imp = self.implementation(pt, "poll");
        let timeout_s = self
            .int(pt, &path, "timeout_s", 1, PROCESSOR_TIMEOUT_S_MAX)
            .unwrap_or(PROCESSOR_TIMEOUT_S_DEFAULT);
        let state = self.boolean(pt, &path, "state").unwrap_or(true);
        let loads = self.loads(pt, "poll");
        let every_s = every_s?;
        Some(PollSpec {
            every_s,
            jitter_given: jitter_s.is_some(),
            jitter_s: jitter_s.unwrap_or_else(|| default_jitter_s(every_s)),
            imp: imp?,
            timeout_s,
            state,
            loads,
        })
    }
}

/// A file inside the bobbin's directory, relative to it: plain components, no `.`, `..` or
/// leading `/` (an `exec` or a `loads` entry).
pub fn is_bobbin_file(f: &str) -> bool {
    !(f.is_empty()
        || f.starts_with('/')
        || f.split('/').any(|c| c == ".." || c == "." || c.is_empty()))
}

/// A poll's jitter when neither the manifest nor the instance sets one (14.4): a tenth of
/// `every_s`, at most [`POLL_JITTER_S_MAX`].
pub fn default_jitter_s(every_s: u64) -> u64 {
    (every_s / 10).min(POLL_JITTER_S_MAX)
}

/// A built-in processor's name: `^[a-z][a-z0-9_.-]*$`, at most 64 bytes, so the bobbin's
/// own dotted name (`google.gmail`) can name its processor.
pub fn is_processor_name(s: &str) -> bool {
    s.len() <= 64
        && s.chars().next().is_some_and(|c| c.is_ascii_lowercase())
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '_' | '-' | '.'))
}

/// Secret and setting names: `^[a-z][a-z0-9_]*$`, at most 64 bytes.
pub fn is_setting_name(s: &str) -> bool {
    s.len() <= 64
        && s.chars().next().is_some_and(|c| c.is_ascii_lowercase())
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}
