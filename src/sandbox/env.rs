//! The child's environment (spec section 10): PATH, HOME and LANG from the parent, TMPDIR
//! for the private tmp dir, then the policy's variables. Also the env-file parser.
//!
//! Must not: pass anything else of the parent's environment, or log a value.

use std::collections::BTreeMap;
use std::path::Path;

/// The only variables taken from the dispatcher's own environment.
pub const INHERITED_VARS: &[&str] = &["PATH", "HOME", "LANG"];
/// Used when the dispatcher itself has no PATH (systemd always sets one).
const PATH_FALLBACK: &str = "/usr/local/bin:/usr/bin:/bin";

/// The full environment for the child, in a stable order, later sources winning.
pub(crate) fn compose(extra: &[(String, String)], tmp_dir: &Path) -> Vec<(String, String)> {
    let mut vars: BTreeMap<String, String> = BTreeMap::new();
    for name in INHERITED_VARS {
        if let Ok(value) = std::env::var(name) {
            vars.insert((*name).to_string(), value);
        }
    }
    vars.entry("PATH".into())
        .or_insert_with(|| PATH_FALLBACK.into());
    // TMPDIR is the sandbox's own path, not the parent's: without it mktemp and Python's
    // tempfile would try /tmp, which the child cannot write.
    vars.insert("TMPDIR".into(), tmp_dir.to_string_lossy().into_owned());
    for (name, value) in extra {
        vars.insert(name.clone(), value.clone());
    }
    vars.into_iter().collect()
}

/// Why an env file was refused. Carries line numbers, never contents.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvFileError {
    #[error("env file line {0}: expected NAME=VALUE")]
    Syntax(usize),
    #[error("env file line {0}: variable name must match ^[A-Za-z_][A-Za-z0-9_]*$")]
    Name(usize),
    #[error("env file line {0}: unterminated quote")]
    Quote(usize),
}

/// Parses `NAME=VALUE` lines: blank lines and `#` comments skipped, an optional `export `
/// prefix, values optionally in single quotes (literal) or double quotes (with `\"`, `\\`,
/// `\n` escapes). No variable expansion: the file is data, not a shell script.
pub fn parse_env_file(text: &str) -> Result<Vec<(String, String)>, EnvFileError> {
    let mut out = Vec::new();
    for (index, raw) in text.lines().enumerate() {
        let line_no = index + 1;
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let line = line.strip_prefix("export ").unwrap_or(line).trim_start();
        let Some((name, value)) = line.split_once('=') else {
            return Err(EnvFileError::Syntax(line_no));
        };
        let name = name.trim_end();
        let valid_name = !name.is_empty()
            && name
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid_name {
            return Err(EnvFileError::Name(line_no));
        }
        out.push((name.to_string(), unquote(value.trim(), line_no)?));
    }
    Ok(out)
}

fn unquote(value: &str, line_no: usize) -> Result<String, EnvFileError> {
    if let Some(rest) = value.strip_prefix('\'') {
        return rest
            .strip_suffix('\'')
            .map(str::to_string)
            .ok_or(EnvFileError::Quote(line_no));
    }
    let Some(rest) = value.strip_prefix('"') else {
        return Ok(value.to_string());
    };
    let mut out = String::with_capacity(rest.len());
    let mut chars = rest.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                return if chars.as_str().trim().is_empty() {
                    Ok(out)
                } else {
                    Err(EnvFileError::Syntax(line_no))
                };
            }
            '\\' => match chars.next() {
                Some('n') => out.push('\n'),
                Some(other) => out.push(other),
                None => return Err(EnvFileError::Quote(line_no)),
            },
            other => out.push(other),
        }
    }
    Err(EnvFileError::Quote(line_no))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_file_forms() {
        let text = "# comment\n\nA=1\nexport B = two words \nC='x \"y\"'\nD=\"a\\\"b\\nc\"\nE=\n";
        let vars = parse_env_file(text).unwrap();
        assert_eq!(
            vars,
            vec![
                ("A".into(), "1".into()),
                ("B".into(), "two words".into()),
                ("C".into(), "x \"y\"".into()),
                ("D".into(), "a\"b\nc".into()),
                ("E".into(), "".into()),
            ]
        );
    }

    #[test]
    fn env_file_errors_name_the_line_only() {
        assert_eq!(
            parse_env_file("A=1\nnovalue\n"),
            Err(EnvFileError::Syntax(2))
        );
        assert_eq!(parse_env_file("1A=x"), Err(EnvFileError::Name(1)));
        assert_eq!(parse_env_file("A='secret"), Err(EnvFileError::Quote(1)));
        let err = parse_env_file("A=\"secret").unwrap_err().to_string();
        assert!(!err.contains("secret"));
    }

    #[test]
    fn compose_keeps_only_the_allowed_parent_vars() {
        let env = compose(
            &[
                ("HOOKSPOOL_BATCH_ID".into(), "7".into()),
                ("PATH".into(), "/x".into()),
            ],
            Path::new("/tmp/t"),
        );
        let names: Vec<&str> = env.iter().map(|(n, _)| n.as_str()).collect();
        for name in &names {
            assert!(
                ["PATH", "HOME", "LANG", "TMPDIR", "HOOKSPOOL_BATCH_ID"].contains(name),
                "{name}"
            );
        }
        assert!(env.contains(&("PATH".into(), "/x".into())));
        assert!(env.contains(&("TMPDIR".into(), "/tmp/t".into())));
    }
}
