//! Mail rules (spec 14.3.7, "recognising mail by sender and subject, pulling named values out
//! of it, loading rule packs"): pure functions on rule tables. A rule has a `name`, an
//! optional `output` (an event type the bobbin emits for a match; without one the rule only
//! tags the `mail` item), and one or more patterns (`from`, `to`, `subject`: regular
//! expressions, all of which must match). Named groups (`(?P<code>\d+)`) become the match's
//! named values. Ready-made rule packs are data files, `rule-packs/<name>.toml` in the
//! bobbin's directory (`name`, `status`, `description`, `[[rules]]`); an instance adds its
//! own rules as a `rules` table setting (rule name -> rule).
//!
//! Must not: log a message's addresses, subject or a matched value.

use std::collections::BTreeMap;
use std::path::Path;

use regex::{Regex, RegexBuilder};
use serde::Deserialize;
use serde_json::{Map, Value};

use super::ProcessorError;

pub const RULE_PACK_DIR: &str = "rule-packs";
/// The compiled size of one pattern at most (the regex crate's own bound, made explicit).
const PATTERN_BYTES_MAX: usize = 1024 * 1024;
pub const RULE_PACK_BYTES_MAX: u64 = 256 * 1024;
/// Rules at most, packs and instance rules together.
pub const RULES_MAX: usize = 500;
/// A named value longer than this is cut (values go into items, not whole bodies).
const VALUE_CHARS_MAX: usize = 500;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    output: Option<String>,
    #[serde(default)]
    from: Option<String>,
    #[serde(default)]
    to: Option<String>,
    #[serde(default)]
    subject: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPack {
    name: String,
    // `status` and `description` are for `hookspool bobbin show` ([`summarise_pack`]);
    // matching ignores them.
    #[serde(default)]
    status: Option<String>,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    rules: Vec<RawRule>,
}

/// One compiled rule.
#[derive(Debug)]
pub struct Rule {
    pub name: String,
    pub output: Option<String>,
    from: Option<Regex>,
    to: Option<Regex>,
    subject: Option<Regex>,
}

/// The headers a rule looks at.
#[derive(Debug, Clone, Copy)]
pub struct Message<'a> {
    pub from: &'a str,
    pub to: &'a str,
    pub subject: &'a str,
}

/// A rule that matched, with its named values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Match {
    pub rule: String,
    pub output: Option<String>,
    pub values: BTreeMap<String, String>,
}

#[derive(Debug, Default)]
pub struct Rules(Vec<Rule>);

fn bad(what: String) -> ProcessorError {
    ProcessorError::permanent(what)
}

fn compile(
    rule: &str,
    field: &str,
    pattern: &Option<String>,
) -> Result<Option<Regex>, ProcessorError> {
    let Some(p) = pattern.as_deref().filter(|p| !p.is_empty()) else {
        return Ok(None);
    };
    RegexBuilder::new(p)
        .size_limit(PATTERN_BYTES_MAX)
        .build()
        .map(Some)
        .map_err(|_| {
            bad(format!(
                "mail rule {rule}: {field} is not a valid regular expression"
            ))
        })
}

fn rule(name: String, raw: RawRule) -> Result<Rule, ProcessorError> {
    let r = Rule {
        from: compile(&name, "from", &raw.from)?,
        to: compile(&name, "to", &raw.to)?,
        subject: compile(&name, "subject", &raw.subject)?,
        output: raw.output.filter(|o| !o.is_empty()),
        name,
    };
    if r.from.is_none() && r.to.is_none() && r.subject.is_none() {
        return Err(bad(format!(
            "mail rule {}: needs at least one of from, to, subject",
            r.name
        )));
    }
    Ok(r)
}

fn pack_name_ok(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name.len() <= 64
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

/// What `hookspool bobbin show` lists of a rule pack (spec 14.3.5: name, status, rules).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PackSummary {
    pub name: String,
    pub status: Option<String>,
    pub description: Option<String>,
    pub rules: Vec<RuleSummary>,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RuleSummary {
    /// As a match names it, without the pack's prefix.
    pub name: String,
    /// The output a match emits; `None`: the rule only tags the mail item.
    pub output: Option<String>,
    /// The headers its patterns read (from, to, subject).
    pub fields: Vec<&'static str>,
}

/// The pack `rule-packs/<stem>.toml` holds, `text`, as `bobbin show` lists it: read as
/// [`load_pack`] reads it (unknown keys refused, the name field the file's stem, a rule's
/// name defaulting to `<pack>-<n>`), its patterns not compiled.
pub fn summarise_pack(stem: &str, text: &str) -> Result<PackSummary, String> {
    let pack: RawPack =
        toml::from_str(text).map_err(|e| format!("not a valid pack: {}", e.message()))?;
    if pack.name != stem {
        return Err(format!(
            "its name field says {:?}, its file {stem}.toml",
            pack.name
        ));
    }
    let rules = pack
        .rules
        .into_iter()
        .enumerate()
        .map(|(i, r)| RuleSummary {
            name: r
                .name
                .clone()
                .unwrap_or_else(|| format!("{stem}-{}", i + 1)),
            output: r.output.clone().filter(|o| !o.is_empty()),
            fields: [("from", &r.from), ("to", &r.to), ("subject", &r.subject)]
                .into_iter()
                .filter(|(_, p)| p.as_deref().is_some_and(|p| !p.is_empty()))
                .map(|(f, _)| f)
                .collect(),
        })
        .collect();
    Ok(PackSummary {
        name: pack.name,
        status: pack.status,
        description: pack.description,
        rules,
    })
}

/// Reads `rule-packs/<name>.toml` from the bobbin's directory.
pub fn load_pack(bobbin_dir: &Path, name: &str) -> Result<Vec<Rule>, ProcessorError> {
    if !pack_name_ok(name) {
        return Err(bad(format!(
            "rule pack {name:?} is not a pack name (a-z, 0-9, -)"
        )));
    }
    let path = bobbin_dir.join(RULE_PACK_DIR).join(format!("{name}.toml"));
    let too_big = std::fs::metadata(&path).map(|m| m.len() > RULE_PACK_BYTES_MAX);
    if !matches!(too_big, Ok(false)) {
        return Err(bad(format!(
            "rule pack {name} is not in the bobbin (or too large)"
        )));
    }
    let text = std::fs::read_to_string(&path)
        .map_err(|_| bad(format!("rule pack {name} cannot be read")))?;
    let pack: RawPack =
        toml::from_str(&text).map_err(|_| bad(format!("rule pack {name} is not a valid pack")))?;
    if pack.name != name {
        return Err(bad(format!(
            "rule pack {name}: its name field says otherwise"
        )));
    }
    pack.rules
        .into_iter()
        .enumerate()
        .map(|(i, raw)| {
            let n = raw
                .name
                .clone()
                .unwrap_or_else(|| format!("{name}-{}", i + 1));
            rule(format!("{name}/{n}"), raw)
        })
        .collect()
}

/// The rules of the listed packs (in order), then the instance's own (`rules` setting).
pub fn load(
    bobbin_dir: &Path,
    packs: &[String],
    own: &Map<String, Value>,
) -> Result<Rules, ProcessorError> {
    let mut rules = Vec::new();
    for p in packs {
        rules.extend(load_pack(bobbin_dir, p)?);
    }
    for (name, table) in own {
        let raw: RawRule = serde_json::from_value(table.clone())
            .map_err(|_| bad(format!("mail rule {name}: unknown key or wrong type")))?;
        rules.push(rule(name.clone(), raw)?);
    }
    if rules.len() > RULES_MAX {
        return Err(bad(format!("more than {RULES_MAX} mail rules")));
    }
    Ok(Rules(rules))
}

fn captures(re: &Option<Regex>, text: &str, values: &mut BTreeMap<String, String>) -> bool {
    let Some(re) = re else { return true };
    let Some(caps) = re.captures(text) else {
        return false;
    };
    for name in re.capture_names().flatten() {
        if let Some(m) = caps.name(name) {
            values.insert(
                name.to_string(),
                m.as_str().chars().take(VALUE_CHARS_MAX).collect(),
            );
        }
    }
    true
}

impl Rules {
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Every rule that matches, in rule order.
    pub fn matches(&self, m: &Message<'_>) -> Vec<Match> {
        let mut out = Vec::new();
        for r in &self.0 {
            let mut values = BTreeMap::new();
            let all = captures(&r.from, m.from, &mut values)
                && captures(&r.to, m.to, &mut values)
                && captures(&r.subject, m.subject, &mut values);
            if all {
                out.push(Match {
                    rule: r.name.clone(),
                    output: r.output.clone(),
                    values,
                });
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_match_on_every_pattern_and_pull_named_values() {
        let own: Map<String, Value> = serde_json::from_str(
            r#"{"invoice": {"from": "(?i)billing@(?P<vendor>[a-z]+)\\.example", "subject": "Invoice (?P<number>\\d+)", "output": "invoice"},
                "vip": {"from": "boss@"}}"#,
        )
        .unwrap();
        let rules = load(Path::new("/nonexistent"), &[], &own).unwrap();
        let m = rules.matches(&Message {
            from: "Billing@acme.example",
            to: "me@example.com",
            subject: "Invoice 4711 due",
        });
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].rule, "invoice");
        assert_eq!(m[0].output.as_deref(), Some("invoice"));
        assert_eq!(m[0].values["vendor"], "acme");
        assert_eq!(m[0].values["number"], "4711");
        let none = rules.matches(&Message {
            from: "billing@acme.example",
            to: "",
            subject: "Receipt",
        });
        assert!(none.is_empty(), "every pattern must match");
    }

    #[test]
    fn the_shipped_scheduling_pack_loads_and_matches() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("bobbins/google/gmail");
        let rules = load(&dir, &["scheduling".into()], &Map::new()).unwrap();
        assert!(!rules.is_empty());
        let m = rules.matches(&Message {
            from: "Ann <ann@example.com>",
            to: "owner@example.com",
            subject: "Are you free for a call next week?",
        });
        assert!(
            m.iter().any(|x| x.output.as_deref() == Some("scheduling")),
            "{m:?}"
        );
        let m = rules.matches(&Message {
            from: "news@example.com",
            to: "owner@example.com",
            subject: "Weekly digest",
        });
        assert!(m.iter().all(|x| x.output.as_deref() != Some("scheduling")));
    }

    #[test]
    fn bad_rules_and_packs_are_permanent_and_named() {
        let own: Map<String, Value> = serde_json::from_str(r#"{"x": {"subject": "("}}"#).unwrap();
        let e = load(Path::new("/n"), &[], &own).unwrap_err();
        assert!(e.reason.contains("mail rule x"), "{e}");
        let own: Map<String, Value> = serde_json::from_str(r#"{"y": {"output": "o"}}"#).unwrap();
        assert!(
            load(Path::new("/n"), &[], &own).is_err(),
            "a rule needs a pattern"
        );
        assert!(load(Path::new("/n"), &["../etc".into()], &Map::new()).is_err());
        assert!(load(Path::new("/n"), &["missing".into()], &Map::new()).is_err());
    }

    #[test]
    fn a_pack_summary_reads_what_load_pack_reads_and_refuses_what_it_refuses() {
        let text = "name = \"p\"\nstatus = \"beta\"\n[[rules]]\noutput = \"o\"\nfrom = \"x\"\nsubject = \"y\"\n[[rules]]\nname = \"tag\"\nto = \"z\"\n";
        let p = summarise_pack("p", text).expect("a pack");
        assert_eq!(p.status.as_deref(), Some("beta"));
        assert_eq!(
            p.rules[0].name, "p-1",
            "a rule's default name, as load_pack names it"
        );
        assert_eq!(p.rules[0].output.as_deref(), Some("o"));
        assert_eq!(p.rules[0].fields, ["from", "subject"]);
        assert_eq!(p.rules[1].output, None);
        assert!(
            summarise_pack("q", text)
                .unwrap_err()
                .contains("name field")
        );
        assert!(summarise_pack("p", "name = \"p\"\nextra = 1\n").is_err());
    }
}
