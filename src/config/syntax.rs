//! Where a TOML or shape error is in the config file, said without quoting it: the line,
//! the column and the key path in effect there. The parser's own rendering quotes the
//! offending line (and a type error quotes the value), and a token on that line would
//! reach the journal; this module never returns text from the file except key names.
//!
//! Must not: return any part of a value, or any line of the file.

use super::Problem;

/// A problem for a `toml` error in `text`.
pub(super) fn problem(text: &str, e: &toml::de::Error) -> Problem {
    let at = e.span().map(|s| s.start).unwrap_or(0).min(text.len());
    let before = &text[..at];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    let path = key_path(text, line);
    let what = first_line_unquoted(e.message());
    super::problem(
        if path.is_empty() {
            "(file)".to_string()
        } else {
            path
        },
        format!(
            "line {line}, column {column}: {what}; fix the TOML there (the line is not shown: it may hold a secret)"
        ),
    )
}

/// The table header in effect at `line` joined with the key written on that line, when
/// both are plain key names.
fn key_path(text: &str, line: usize) -> String {
    let mut table = String::new();
    let mut key = String::new();
    for (i, l) in text.lines().enumerate().take(line) {
        let t = l.trim();
        if let Some(h) = t.strip_prefix('[') {
            let h = h.trim_start_matches('[');
            if let Some(end) = h.find(']') {
                let name = h[..end].trim();
                table = if is_key_text(name) {
                    name.to_string()
                } else {
                    String::new()
                };
            }
            key.clear();
            continue;
        }
        if i + 1 == line
            && let Some((k, _)) = t.split_once('=')
        {
            let k = k.trim();
            if is_key_text(k) {
                key = k.to_string();
            }
        }
    }
    match (table.is_empty(), key.is_empty()) {
        (true, _) => key,
        (false, true) => table,
        (false, false) => format!("{table}.{key}"),
    }
}

/// Bare or quoted key names joined by dots: nothing a value could hide in.
fn is_key_text(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 200
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '"' | ':' | ' '))
}

/// The parser's message without anything it quotes from the file (a type error names the
/// value it found). Grammar tokens in backticks (`]`, `=`) are kept: short punctuation
/// cannot carry a secret.
fn first_line_unquoted(message: &str) -> String {
    let first = message.lines().next().unwrap_or("invalid TOML");
    let mut out = String::new();
    let mut quoted: Option<(char, String)> = None;
    for c in first.chars() {
        match &mut quoted {
            Some((q, inner)) if c == *q => {
                let token = *q == '`'
                    && inner.chars().count() <= 3
                    && !inner.chars().any(char::is_alphanumeric);
                if token {
                    out.push('`');
                    out.push_str(inner);
                    out.push('`');
                } else {
                    out.push('…');
                }
                quoted = None;
            }
            Some((_, inner)) => inner.push(c),
            None if c == '"' || c == '`' || c == '\'' => quoted = Some((c, String::new())),
            None => out.push(c),
        }
    }
    if quoted.is_some() {
        out.push('…');
    }
    out.trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::super::parse_raw;

    #[test]
    fn a_syntax_error_names_line_column_and_key_but_never_the_text() {
        let text = "[spool]\nhome = \"/x\"\n\n[destinations.audit]\ntype = \"http\"\ntoken = [ \"s3cr3t-sentinel\"\n";
        let e = parse_raw(text).expect_err("a syntax error");
        let msg = e[0].to_string();
        assert!(msg.contains("line "), "{msg}");
        assert!(msg.contains("column "), "{msg}");
        assert_eq!(e[0].key, "destinations.audit.token", "{msg}");
        assert!(!msg.contains("s3cr3t-sentinel"), "{msg}");
        assert!(!msg.contains("token = ["), "{msg}");
    }

    #[test]
    fn a_type_error_never_quotes_the_value() {
        let text = "[dispatch]\nparallel = \"s3cr3t-sentinel\"\n";
        let e = parse_raw(text).expect_err("a type error");
        let msg = e[0].to_string();
        assert!(!msg.contains("s3cr3t-sentinel"), "{msg}");
        assert!(msg.contains("line 2"), "{msg}");
        assert_eq!(e[0].key, "dispatch.parallel", "{msg}");
    }
}
