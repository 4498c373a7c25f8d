//! Line numbers for findings in a TOML file: every kit problem is `file:line: what to write
//! instead`, and serde's typed values carry no positions, so this module maps a key path
//! (`["settings", "owner", "default"]`) back to the line that wrote it.
//!
//! Owns: [`Locator`], a small scan of `[table]` headers and `key =` lines (dotted and quoted
//! keys included). It is a lookup for messages, never a parser: the text was parsed by
//! `toml` first, so a key path that is not found falls back to its nearest table, then to
//! line 1.

/// Where each key path of one TOML text was written.
pub struct Locator {
    /// (full key path, 1-based line), in file order.
    entries: Vec<(Vec<String>, usize)>,
}

impl Locator {
    pub fn new(text: &str) -> Locator {
        let mut entries = Vec::new();
        let mut table: Vec<String> = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.trim();
            let n = i + 1;
            if line.starts_with('#') || line.is_empty() {
                continue;
            }
            if let Some(rest) = line.strip_prefix('[') {
                let inner = rest.trim_start_matches('[');
                let end = inner.find(']').unwrap_or(inner.len());
                table = split_key(&inner[..end]);
                entries.push((table.clone(), n));
                continue;
            }
            if let Some(eq) = key_end(line) {
                let mut path = table.clone();
                path.extend(split_key(&line[..eq]));
                entries.push((path, n));
            }
        }
        Locator { entries }
    }

    /// The line of `path`, else of its longest written prefix, else 1.
    pub fn line(&self, path: &[&str]) -> usize {
        for len in (1..=path.len()).rev() {
            let want = &path[..len];
            if let Some((_, n)) = self
                .entries
                .iter()
                .find(|(p, _)| p.len() == want.len() && p.iter().zip(want).all(|(a, b)| a == b))
            {
                return *n;
            }
        }
        1
    }
}

/// The byte offset of the `=` that ends a key on this line, outside quotes.
fn key_end(line: &str) -> Option<usize> {
    let mut quote: Option<char> = None;
    for (i, c) in line.char_indices() {
        match (quote, c) {
            (None, '"' | '\'') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            (None, '=') => return Some(i),
            _ => {}
        }
    }
    None
}

/// `a."b.c" . d` -> ["a", "b.c", "d"].
fn split_key(text: &str) -> Vec<String> {
    let mut parts = Vec::new();
    let mut cur = String::new();
    let mut quote: Option<char> = None;
    for c in text.chars() {
        match (quote, c) {
            (None, '"' | '\'') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            (None, '.') => parts.push(std::mem::take(&mut cur).trim().to_string()),
            (None, c) if c.is_whitespace() => {}
            (_, c) => cur.push(c),
        }
    }
    parts.push(cur.trim().to_string());
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locates_headers_keys_and_dotted_keys() {
        let text = "name = \"a.b\"\n\n[settings.owner]\ntype = \"string\"\n[outputs.\"*\"]\ndescription = \"x\"\n[source]\ntemplate.scheme = \"y\"\n";
        let l = Locator::new(text);
        assert_eq!(l.line(&["name"]), 1);
        assert_eq!(l.line(&["settings", "owner"]), 3);
        assert_eq!(l.line(&["settings", "owner", "type"]), 4);
        assert_eq!(l.line(&["settings", "owner", "default"]), 3);
        assert_eq!(l.line(&["outputs", "*", "description"]), 6);
        assert_eq!(l.line(&["source", "template", "scheme"]), 8);
        assert_eq!(l.line(&["nowhere"]), 1);
    }
}
