//! Reading a source's own options out of its `[sources.<name>]` table.
//!
//! Owns: typed access to option values with refusals that say what to write, and the
//! unknown-key check. Must not: know any source's meaning of a key (each source validates
//! its own values) or see the common keys (the config module strips those first).

use super::{SourceConfigError, verify};

/// The options of one source being built. Each `take_*` marks a key as known; [`Opts::finish`]
/// refuses whatever is left, naming the key and the keys the type accepts.
pub struct Opts<'a> {
    kind: &'a str,
    table: &'a toml::Table,
    known: Vec<&'static str>,
}

/// A key's value as either one string or a list of strings (`key`, `ignore`).
pub type StrOrList = Vec<String>;

impl<'a> Opts<'a> {
    pub fn new(kind: &'a str, table: &'a toml::Table) -> Self {
        Opts {
            kind,
            table,
            known: Vec::new(),
        }
    }

    pub fn kind(&self) -> &str {
        self.kind
    }

    fn get(&mut self, key: &'static str) -> Option<&'a toml::Value> {
        self.known.push(key);
        self.table.get(key)
    }

    /// A key's value as written (a table such as a template's `recipe`, read by its owner).
    pub fn table(&mut self, key: &'static str) -> Option<&'a toml::Value> {
        self.get(key)
    }

    /// An optional string; `example` is shown in the refusal (`key = "X-Signature"`).
    pub fn string(
        &mut self,
        key: &'static str,
        example: &str,
    ) -> Result<Option<String>, SourceConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(toml::Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(invalid(
                key,
                format!("must be a string; write {key} = {example}"),
            )),
        }
    }

    pub fn boolean(&mut self, key: &'static str) -> Result<Option<bool>, SourceConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(toml::Value::Boolean(b)) => Ok(Some(*b)),
            Some(_) => Err(invalid(
                key,
                format!("must be true or false; write {key} = true"),
            )),
        }
    }

    /// An optional integer within `min..=max`; the refusal names the bounds and `example`.
    pub fn integer(
        &mut self,
        key: &'static str,
        min: u64,
        max: u64,
        example: u64,
    ) -> Result<Option<u64>, SourceConfigError> {
        let refuse = || {
            invalid(
                key,
                format!("must be a whole number from {min} to {max}; write {key} = {example}"),
            )
        };
        match self.get(key) {
            None => Ok(None),
            Some(toml::Value::Integer(i)) => u64::try_from(*i)
                .ok()
                .filter(|v| (min..=max).contains(v))
                .map(Some)
                .ok_or_else(refuse),
            Some(_) => Err(refuse()),
        }
    }

    /// The `tolerance_s` key of a timestamped scheme: the two-sided replay window in seconds,
    /// within `verify::TOLERANCE_S_MIN..=TOLERANCE_S_MAX` (the caller applies the default).
    pub fn tolerance_s(&mut self) -> Result<Option<u64>, SourceConfigError> {
        self.integer(
            "tolerance_s",
            verify::TOLERANCE_S_MIN,
            verify::TOLERANCE_S_MAX,
            verify::TOLERANCE_S_DEFAULT,
        )
    }

    /// A string or a list of strings (a single string becomes a one-item list).
    pub fn string_or_list(
        &mut self,
        key: &'static str,
        example: &str,
    ) -> Result<Option<StrOrList>, SourceConfigError> {
        let refuse = || {
            invalid(
                key,
                format!("must be a string or a list of strings; write {key} = {example}"),
            )
        };
        match self.get(key) {
            None => Ok(None),
            Some(toml::Value::String(s)) => Ok(Some(vec![s.clone()])),
            Some(toml::Value::Array(items)) => items
                .iter()
                .map(|v| v.as_str().map(str::to_string).ok_or_else(refuse))
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(_) => Err(refuse()),
        }
    }

    /// A table of strings (`attrs`).
    pub fn string_table(
        &mut self,
        key: &'static str,
        example: &str,
    ) -> Result<Option<Vec<(String, String)>>, SourceConfigError> {
        let refuse = || {
            invalid(
                key,
                format!("must be a table of strings; write {key} = {example}"),
            )
        };
        match self.get(key) {
            None => Ok(None),
            Some(toml::Value::Table(t)) => t
                .iter()
                .map(|(k, v)| {
                    v.as_str()
                        .map(|s| (k.clone(), s.to_string()))
                        .ok_or_else(refuse)
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(_) => Err(refuse()),
        }
    }

    /// Refuses any key no `take` asked for.
    pub fn finish(self) -> Result<(), SourceConfigError> {
        let mut accepted: Vec<&str> = self.known.clone();
        accepted.sort_unstable();
        accepted.dedup();
        for key in self.table.keys() {
            if !self.known.iter().any(|k| k == key) {
                return Err(SourceConfigError::UnknownKey {
                    kind: self.kind.to_string(),
                    key: key.clone(),
                    accepted: if accepted.is_empty() {
                        "none".to_string()
                    } else {
                        accepted.join(", ")
                    },
                });
            }
        }
        Ok(())
    }
}

pub fn invalid(key: &str, message: String) -> SourceConfigError {
    SourceConfigError::Invalid {
        key: key.to_string(),
        message,
    }
}

/// An HTTP header name: an RFC 9110 token.
pub fn is_header_name(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}
