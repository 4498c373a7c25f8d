//! The YAML frontmatter that README.md, SETUP.md and AGENTS.md open with (spec 14.3.2),
//! repeating the manifest exactly:
//!
//! ```text
//! ---
//! bobbin: google.gmail
//! provider: Google Gmail
//! webhook_docs: https://developers.google.com/workspace/gmail/api/guides/push
//! ---
//! ```
//!
//! Owns: a strict subset of YAML, read and checked here rather than through a YAML crate:
//! the first line is `---`, then one `key: value` per line (a plain scalar, or one in double
//! quotes without escapes), then `---`. Anything else (nesting, lists, comments, multi-line
//! values) is refused with the line to write, because the documents are compared with the
//! manifest value for value and a richer reader would accept spellings the rule does not
//! mean. AGENTS.md may add keys of the agents.md convention; the other two may not.
//!
//! Must not: read files (the kit hands it the text).

/// One document's frontmatter: (key, value, 1-based line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frontmatter {
    pub entries: Vec<(String, String, usize)>,
}

/// Why the frontmatter could not be read; carries the line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrontmatterError {
    pub line: usize,
    pub message: String,
}

impl Frontmatter {
    pub fn parse(text: &str) -> Result<Frontmatter, FrontmatterError> {
        let mut lines = text.lines().enumerate();
        match lines.next() {
            Some((_, "---")) => {}
            _ => {
                return Err(FrontmatterError {
                    line: 1,
                    message: "the document must open with frontmatter: a line \"---\", then \"bobbin: <vendor>.<product>\", \"provider: <vendor> <product>\", the docs page, and \"---\"".into(),
                });
            }
        }
        let mut entries: Vec<(String, String, usize)> = Vec::new();
        for (i, line) in lines {
            let n = i + 1;
            if line == "---" {
                return Ok(Frontmatter { entries });
            }
            let Some((key, value)) = line.split_once(": ") else {
                return Err(FrontmatterError {
                    line: n,
                    message: "write one \"key: value\" per line (a colon and one space), or \"---\" to close the frontmatter".into(),
                });
            };
            let key_ok = !key.is_empty()
                && key.bytes().all(|b| {
                    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-'
                });
            if !key_ok {
                return Err(FrontmatterError {
                    line: n,
                    message: format!(
                        "{key:?} is not a plain lowercase key; write e.g. \"bobbin: ...\""
                    ),
                });
            }
            let value = unquote(value).ok_or_else(|| FrontmatterError {
                line: n,
                message:
                    "write the value plain or in double quotes, on one line, with no '#' comment"
                        .into(),
            })?;
            if entries.iter().any(|(k, _, _)| k == key) {
                return Err(FrontmatterError {
                    line: n,
                    message: format!("{key} is given twice; keep one"),
                });
            }
            entries.push((key.to_string(), value, n));
        }
        Err(FrontmatterError {
            line: text.lines().count().max(1),
            message: "the frontmatter is not closed; add a line \"---\" after its last key".into(),
        })
    }

    pub fn get(&self, key: &str) -> Option<(&str, usize)> {
        self.entries
            .iter()
            .find(|(k, _, _)| k == key)
            .map(|(_, v, n)| (v.as_str(), *n))
    }

    /// Compares with the keys and values it must repeat; `extra_allowed` is AGENTS.md's
    /// licence to add keys. Returns (line, what to write) for each difference.
    pub fn compare(
        &self,
        expected: &[(&str, String)],
        extra_allowed: bool,
    ) -> Vec<(usize, String)> {
        let mut out = Vec::new();
        let close = self.entries.last().map(|e| e.2 + 1).unwrap_or(2);
        for (key, want) in expected {
            match self.get(key) {
                None => out.push((close, format!("add \"{key}: {want}\" to the frontmatter"))),
                Some((got, n)) if got != want => out.push((
                    n,
                    format!("{key} must repeat the manifest exactly; write \"{key}: {want}\""),
                )),
                Some(_) => {}
            }
        }
        if !extra_allowed {
            for (k, _, n) in &self.entries {
                if !expected.iter().any(|(e, _)| e == k) {
                    out.push((
                        *n,
                        format!(
                            "{k} is not a frontmatter key of this document; remove it (only AGENTS.md may add keys)"
                        ),
                    ));
                }
            }
        }
        out
    }
}

fn unquote(v: &str) -> Option<String> {
    let v = v.trim_end();
    if let Some(inner) = v.strip_prefix('"') {
        let inner = inner.strip_suffix('"')?;
        if inner.contains('"') || inner.contains('\\') {
            return None;
        }
        return Some(inner.to_string());
    }
    if v.is_empty() || v.contains(" #") || v.starts_with(['\'', '[', '{', '|', '>', '&', '*', '!'])
    {
        return None;
    }
    Some(v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "---\nbobbin: google.gmail\nprovider: Google Gmail\nwebhook_docs: https://developers.google.com/workspace/gmail/api/guides/push\n---\n# Gmail\n";

    fn expected() -> Vec<(&'static str, String)> {
        vec![
            ("bobbin", "google.gmail".into()),
            ("provider", "Google Gmail".into()),
            (
                "webhook_docs",
                "https://developers.google.com/workspace/gmail/api/guides/push".into(),
            ),
        ]
    }

    #[test]
    fn frontmatter_repeats_the_manifest() {
        let f = Frontmatter::parse(DOC).expect("parse");
        assert_eq!(f.get("provider"), Some(("Google Gmail", 3)));
        assert_eq!(f.compare(&expected(), false), vec![]);
        let quoted = DOC.replace("provider: Google Gmail", "provider: \"Google Gmail\"");
        assert_eq!(
            Frontmatter::parse(&quoted)
                .unwrap()
                .compare(&expected(), false),
            vec![]
        );
    }

    #[test]
    fn frontmatter_differences_name_the_line() {
        let f = Frontmatter::parse(&DOC.replace("Google Gmail", "Gmail")).unwrap();
        let d = f.compare(&expected(), false);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].0, 3);
        assert!(d[0].1.contains("provider: Google Gmail"));
        let extra = DOC.replace("---\n#", "owner: me\n---\n#");
        let f = Frontmatter::parse(&extra).unwrap();
        assert_eq!(f.compare(&expected(), false).len(), 1);
        assert_eq!(f.compare(&expected(), true), vec![]);
    }

    #[test]
    fn frontmatter_strict_subset() {
        assert_eq!(Frontmatter::parse("# Gmail\n").unwrap_err().line, 1);
        assert_eq!(
            Frontmatter::parse("---\nbobbin google\n---\n")
                .unwrap_err()
                .line,
            2
        );
        assert_eq!(
            Frontmatter::parse("---\nbobbin: [a, b]\n---\n")
                .unwrap_err()
                .line,
            2
        );
        assert_eq!(
            Frontmatter::parse("---\nbobbin: a # c\n---\n")
                .unwrap_err()
                .line,
            2
        );
        assert_eq!(
            Frontmatter::parse("---\nbobbin: a\nbobbin: b\n---\n")
                .unwrap_err()
                .line,
            3
        );
        assert!(
            Frontmatter::parse("---\nbobbin: a\n")
                .unwrap_err()
                .message
                .contains("not closed")
        );
    }
}
