//! The selector language: how configuration names a value taken from a request.
//!
//! Owns: parsing (at config load, with refusals that say what to write) and evaluation of
//! selectors, value templates and ignore rules. Used by the template source and by the
//! built-ins' optional overrides. Must not: read query strings (tokens live there and values
//! end up in keys, attrs and logs) or secrets.
//!
//! # The language
//!
//! A **selector** names one value:
//!
//! | selector | value |
//! | --- | --- |
//! | `payload.a.b.0.c` | a JSON path into the payload: object members by name, array items by index (`0`, `1`, …) |
//! | `header.X-GitHub-Event` | a request header, name matched case-insensitively |
//! | `body_sha256` | lowercase hex SHA-256 of the raw body (dedup for senders without an id) |
//!
//! A JSON string is used as is; a number or boolean as its JSON text; `null` or an absent
//! member counts as missing; an object or array is an error (`NotScalar`). Path segments are
//! split at `.`, so a member whose name contains a dot cannot be reached.
//!
//! A **value** (the `key`, `dedup`, `event_type` and `attrs` keys) is one of:
//!
//! * a bare selector: `payload.repository.full_name`, `header.X-GitHub-Event`;
//! * text with selectors in braces: `"{payload.repository.full_name}:{header.X-GitHub-Event}"`,
//!   where `{{` and `}}` stand for literal braces;
//! * a plain word without dots or braces: literal text (`key = "all"` puts every event of the
//!   source into one group).
//!
//! A brace-less value with a dot that is not a selector (`repository.full_name`) is refused
//! with the selector to write instead, so a forgotten `payload.` never becomes a constant.
//!
//! What a missing value does depends on the key: in `key` it is an error (the request is
//! quarantined, since grouping it anywhere would be a guess); in `dedup` it means "no dedup
//! id"; in `event_type` it gives `""`; in `attrs` the attribute is left out.
//!
//! An **ignore rule** is `<selector>=<text>` (ignore when the value equals the text) or
//! `<selector>!=<text>` (ignore when it differs, including when it is missing), e.g.
//! `header.X-GitHub-Event=ping`. The rule's own text is the ignore reason.

use super::opts::{invalid, is_header_name};
use super::{Request, SourceConfigError, SourceError, verify};
use serde_json::Value;

/// One value source in a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selector {
    Payload(Vec<String>),
    Header(String),
    BodySha256,
}

impl Selector {
    /// Parses a bare selector (no braces). `key` names the config key for messages.
    pub fn parse(key: &str, raw: &str) -> Result<Selector, SourceConfigError> {
        let raw = raw.trim();
        if raw == "body_sha256" {
            return Ok(Selector::BodySha256);
        }
        if let Some(path) = raw.strip_prefix("payload.") {
            let segments: Vec<String> = path.split('.').map(str::to_string).collect();
            if let Some(bad) = segments.iter().find(|s| !is_segment(s)) {
                return Err(invalid(
                    key,
                    format!(
                        "\"{raw}\" has an empty or invalid path segment \"{bad}\"; write dot-separated member names or indexes, e.g. \"payload.repository.full_name\" or \"payload.events.0.id\""
                    ),
                ));
            }
            return Ok(Selector::Payload(segments));
        }
        if raw == "payload" {
            return Err(invalid(key, "\"payload\" names the whole body; write \"payload.<field>\" for one field, e.g. \"payload.id\"".to_string()));
        }
        if let Some(name) = raw.strip_prefix("header.") {
            if !is_header_name(name) {
                return Err(invalid(
                    key,
                    format!("\"{raw}\" is not a header name; write e.g. \"header.X-Event-Type\""),
                ));
            }
            return Ok(Selector::Header(name.to_string()));
        }
        if raw.starts_with("query.") {
            return Err(invalid(
                key,
                format!(
                    "\"{raw}\": query parameters cannot be selected (they carry tokens and are never logged); write a payload. or header. selector"
                ),
            ));
        }
        Err(invalid(
            key,
            format!(
                "\"{raw}\" is not a selector; write \"payload.{raw}\" (a JSON path into the body), \"header.<Name>\" (a request header) or \"body_sha256\""
            ),
        ))
    }

    /// The value, `None` when missing or null.
    pub fn eval(&self, payload: &Value, req: &Request) -> Result<Option<String>, SourceError> {
        match self {
            Selector::BodySha256 => Ok(Some(verify::sha256_hex(&req.body))),
            Selector::Header(name) => Ok(req.header(name).map(str::to_string)),
            Selector::Payload(path) => {
                let mut v = payload;
                for seg in path {
                    let next = match v {
                        Value::Object(m) => m.get(seg.as_str()),
                        Value::Array(items) => seg.parse::<usize>().ok().and_then(|i| items.get(i)),
                        _ => None,
                    };
                    match next {
                        Some(n) => v = n,
                        None => return Ok(None),
                    }
                }
                scalar(v, || self.text())
            }
        }
    }

    /// The selector as written (config text; safe for messages).
    pub fn text(&self) -> String {
        match self {
            Selector::BodySha256 => "body_sha256".to_string(),
            Selector::Header(h) => format!("header.{h}"),
            Selector::Payload(p) => format!("payload.{}", p.join(".")),
        }
    }

    pub fn uses_payload(&self) -> bool {
        matches!(self, Selector::Payload(_))
    }
}

/// A JSON scalar as text; `None` for null.
pub fn scalar(v: &Value, field: impl FnOnce() -> String) -> Result<Option<String>, SourceError> {
    match v {
        Value::Null => Ok(None),
        Value::String(s) => Ok(Some(s.clone())),
        Value::Number(n) => Ok(Some(n.to_string())),
        Value::Bool(b) => Ok(Some(b.to_string())),
        Value::Array(_) | Value::Object(_) => Err(SourceError::NotScalar { field: field() }),
    }
}

fn is_segment(s: &str) -> bool {
    !s.is_empty()
        && !s
            .chars()
            .any(|c| c.is_whitespace() || c == '{' || c == '}' || c == '=')
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Lit(String),
    Sel(Selector),
}

/// A value: literal text and selectors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expr {
    pieces: Vec<Piece>,
}

impl Expr {
    pub fn parse(key: &str, raw: &str) -> Result<Expr, SourceConfigError> {
        if raw.trim().is_empty() {
            return Err(invalid(
                key,
                "is empty; write a selector such as \"payload.id\" or leave the key out"
                    .to_string(),
            ));
        }
        if !raw.contains('{') && !raw.contains('}') {
            let bare = raw.trim();
            let looks_selector = bare.starts_with("payload")
                || bare.starts_with("header.")
                || bare.starts_with("query.")
                || bare == "body_sha256"
                || bare.contains('.');
            return if looks_selector {
                Ok(Expr {
                    pieces: vec![Piece::Sel(Selector::parse(key, bare)?)],
                })
            } else {
                Ok(Expr {
                    pieces: vec![Piece::Lit(raw.to_string())],
                })
            };
        }
        let mut pieces = Vec::new();
        let mut lit = String::new();
        let mut chars = raw.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '{' if chars.peek() == Some(&'{') => {
                    chars.next();
                    lit.push('{');
                }
                '}' if chars.peek() == Some(&'}') => {
                    chars.next();
                    lit.push('}');
                }
                '{' => {
                    let mut inner = String::new();
                    let mut closed = false;
                    for c in chars.by_ref() {
                        if c == '}' {
                            closed = true;
                            break;
                        }
                        inner.push(c);
                    }
                    if !closed {
                        return Err(invalid(
                            key,
                            format!(
                                "\"{raw}\" has a \"{{\" without \"}}\"; write \"{{payload.id}}\", or \"{{{{\" for a literal brace"
                            ),
                        ));
                    }
                    if !lit.is_empty() {
                        pieces.push(Piece::Lit(std::mem::take(&mut lit)));
                    }
                    pieces.push(Piece::Sel(Selector::parse(key, &inner)?));
                }
                '}' => {
                    return Err(invalid(
                        key,
                        format!(
                            "\"{raw}\" has a \"}}\" without \"{{\"; write \"}}}}\" for a literal brace"
                        ),
                    ));
                }
                c => lit.push(c),
            }
        }
        if !lit.is_empty() {
            pieces.push(Piece::Lit(lit));
        }
        Ok(Expr { pieces })
    }

    /// The rendered value; `Ok(None)` when any selector is missing.
    pub fn eval(&self, payload: &Value, req: &Request) -> Result<Option<String>, SourceError> {
        let mut out = String::new();
        for p in &self.pieces {
            match p {
                Piece::Lit(s) => out.push_str(s),
                Piece::Sel(sel) => match sel.eval(payload, req)? {
                    Some(v) => out.push_str(&v),
                    None => return Ok(None),
                },
            }
        }
        Ok(Some(out))
    }

    /// Like `eval`, but a missing value is an error naming the first missing selector.
    pub fn eval_required(&self, payload: &Value, req: &Request) -> Result<String, SourceError> {
        let mut out = String::new();
        for p in &self.pieces {
            match p {
                Piece::Lit(s) => out.push_str(s),
                Piece::Sel(sel) => match sel.eval(payload, req)? {
                    Some(v) => out.push_str(&v),
                    None => return Err(SourceError::MissingField { field: sel.text() }),
                },
            }
        }
        Ok(out)
    }

    pub fn uses_payload(&self) -> bool {
        self.pieces
            .iter()
            .any(|p| matches!(p, Piece::Sel(s) if s.uses_payload()))
    }

    /// Header names this value reads (the template keeps them by default).
    pub fn headers(&self) -> Vec<String> {
        self.pieces
            .iter()
            .filter_map(|p| match p {
                Piece::Sel(Selector::Header(h)) => Some(h.clone()),
                _ => None,
            })
            .collect()
    }
}

/// An ignore rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    sel: Selector,
    negate: bool,
    value: String,
    text: String,
}

impl Rule {
    pub fn parse(key: &str, raw: &str) -> Result<Rule, SourceConfigError> {
        let (lhs, value, negate) = if let Some((l, v)) = raw.split_once("!=") {
            (l, v, true)
        } else if let Some((l, v)) = raw.split_once('=') {
            (l, v, false)
        } else {
            return Err(invalid(
                key,
                format!(
                    "\"{raw}\" is not a rule; write \"<selector>=<value>\" or \"<selector>!=<value>\", e.g. \"header.X-GitHub-Event=ping\""
                ),
            ));
        };
        let sel = Selector::parse(key, lhs.trim())?;
        Ok(Rule {
            sel,
            negate,
            value: value.trim().to_string(),
            text: raw.trim().to_string(),
        })
    }

    /// `Some(reason)` when the rule fires.
    pub fn check(&self, payload: &Value, req: &Request) -> Result<Option<String>, SourceError> {
        let v = self.sel.eval(payload, req)?;
        let equal = v.as_deref() == Some(self.value.as_str());
        Ok((equal != self.negate).then(|| self.text.clone()))
    }

    pub fn uses_payload(&self) -> bool {
        self.sel.uses_payload()
    }

    pub fn header(&self) -> Option<String> {
        match &self.sel {
            Selector::Header(h) => Some(h.clone()),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn req() -> Request {
        Request::new("POST", "/", 0.0)
            .with_header("X-GitHub-Event", "push")
            .with_body("{}")
    }

    #[test]
    fn templates_render() {
        let p = json!({"repository": {"full_name": "o/r"}, "list": [{"id": 7}], "b": true});
        let e = Expr::parse(
            "key",
            "{payload.repository.full_name}:{header.x-github-event}",
        )
        .unwrap();
        assert_eq!(e.eval(&p, &req()).unwrap().as_deref(), Some("o/r:push"));
        let e = Expr::parse("key", "payload.list.0.id").unwrap();
        assert_eq!(e.eval(&p, &req()).unwrap().as_deref(), Some("7"));
        let e = Expr::parse("key", "{{x}}-{payload.b}").unwrap();
        assert_eq!(e.eval(&p, &req()).unwrap().as_deref(), Some("{x}-true"));
        let e = Expr::parse("key", "all").unwrap();
        assert_eq!(e.eval(&p, &req()).unwrap().as_deref(), Some("all"));
        let e = Expr::parse("key", "payload.missing").unwrap();
        assert_eq!(e.eval(&p, &req()).unwrap(), None);
        assert_eq!(
            e.eval_required(&p, &req()).unwrap_err().class(),
            "MissingField"
        );
        let e = Expr::parse("key", "payload.repository").unwrap();
        assert_eq!(e.eval(&p, &req()).unwrap_err().class(), "NotScalar");
    }

    #[test]
    fn refusals_say_what_to_write() {
        let cases = [
            ("repository.full_name", "payload.repository.full_name"),
            ("{payload.a", "{payload.id}"),
            ("a}", "}}"),
            ("payload..x", "payload.repository.full_name"),
            ("header.Bad Name", "header.X-Event-Type"),
            ("query.token", "never logged"),
            ("{repo}", "payload.repo"),
            ("payload", "payload.<field>"),
        ];
        for (raw, hint) in cases {
            let msg = Expr::parse("key", raw).unwrap_err().to_string();
            assert!(
                msg.starts_with("key: ") && msg.contains(hint),
                "{raw}: {msg}"
            );
        }
    }

    #[test]
    fn rules() {
        let p = json!({});
        let r = Rule::parse("ignore", "header.X-GitHub-Event=push").unwrap();
        assert_eq!(
            r.check(&p, &req()).unwrap().as_deref(),
            Some("header.X-GitHub-Event=push")
        );
        let r = Rule::parse("ignore", "header.X-GitHub-Event!=push").unwrap();
        assert_eq!(r.check(&p, &req()).unwrap(), None);
        let r = Rule::parse("ignore", "header.X-Missing!=x").unwrap();
        assert!(r.check(&p, &req()).unwrap().is_some());
        assert!(
            Rule::parse("ignore", "header.X")
                .unwrap_err()
                .to_string()
                .contains("<selector>=<value>")
        );
    }
}
