//! A bobbin setting's type (spec 14.3.2) and the one rule a default or an instance's value
//! is checked by; shared by the manifest and the template keys.

/// A setting's type (14.3.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettingType {
    String,
    Int,
    Bool,
    List,
    Path,
    Table,
}

impl SettingType {
    pub const ALL: [SettingType; 6] = [
        SettingType::String,
        SettingType::Int,
        SettingType::Bool,
        SettingType::List,
        SettingType::Path,
        SettingType::Table,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            SettingType::String => "string",
            SettingType::Int => "int",
            SettingType::Bool => "bool",
            SettingType::List => "list",
            SettingType::Path => "path",
            SettingType::Table => "table",
        }
    }

    pub(super) fn parse(s: &str) -> Option<SettingType> {
        SettingType::ALL.into_iter().find(|t| t.as_str() == s)
    }

    /// The one type rule for a default and for an instance's value; `Err` says what to
    /// write. A path is absolute, or "" (unset).
    pub fn check(self, v: &toml::Value) -> Result<(), String> {
        let ok = match (self, v) {
            (SettingType::String, toml::Value::String(_))
            | (SettingType::Int, toml::Value::Integer(_))
            | (SettingType::Bool, toml::Value::Boolean(_))
            | (SettingType::List, toml::Value::Array(_))
            | (SettingType::Table, toml::Value::Table(_)) => true,
            (SettingType::Path, toml::Value::String(s)) => {
                if !s.is_empty() && !s.starts_with('/') {
                    return Err(format!(
                        "a path setting is absolute; write \"/{}\" or \"\" for unset",
                        s.trim_start_matches("./")
                    ));
                }
                true
            }
            _ => false,
        };
        if ok {
            Ok(())
        } else {
            Err(format!(
                "must be of type {}; write e.g. {}",
                self.as_str(),
                self.example()
            ))
        }
    }

    pub(super) fn example(self) -> &'static str {
        match self {
            SettingType::String => "\"text\"",
            SettingType::Int => "60",
            SettingType::Bool => "true",
            SettingType::List => "[\"a\", \"b\"]",
            SettingType::Path => "\"/etc/hookspool/hooks.py\"",
            SettingType::Table => "{ name = \"value\" }",
        }
    }
}
