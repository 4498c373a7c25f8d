//! Template settings (spec 14.3.2a): which settings of a template bobbin are template keys,
//! what type each may have, and how an instance's values become the expanded source's keys.
//!
//! Owns: [`TEMPLATE_KEYS`] (the template source's keys, each with the setting types allowed
//! for it), the manifest rules of the section (a setting of a key the fixed table already
//! sets, a template key setting of the wrong type, a setting a processor-less bobbin would
//! drop, a "settings" bobbin without `scheme` and `key` settings), and [`is_unset`], the one
//! "an empty value means unset" rule the expansion applies.
//!
//! Must not: validate template values themselves: the expanded `[sources.<i>]` goes through
//! the template source's own checks (`sources::template`), exactly as a hand-written one.
//! A key the template source learns (a new scheme's option) needs one line here.

use super::setting_type::SettingType;

/// A template key and the setting types that may carry it.
pub struct TemplateKey {
    pub name: &'static str,
    pub types: &'static [SettingType],
}

const STRING: &[SettingType] = &[SettingType::String];
const BOOL: &[SettingType] = &[SettingType::Bool];
const INT: &[SettingType] = &[SettingType::Int];
const STRING_OR_LIST: &[SettingType] = &[SettingType::String, SettingType::List];
const TABLE: &[SettingType] = &[SettingType::Table];

/// The template source's keys (14.3.2a, plus `tolerance_s` for timestamped schemes and
/// `recipe` and `handshake`, issue 34).
pub const TEMPLATE_KEYS: &[TemplateKey] = &[
    TemplateKey {
        name: "scheme",
        types: STRING,
    },
    TemplateKey {
        name: "header",
        types: STRING,
    },
    TemplateKey {
        name: "prefix",
        types: STRING,
    },
    TemplateKey {
        name: "param",
        types: STRING,
    },
    TemplateKey {
        name: "callback_url",
        types: STRING,
    },
    TemplateKey {
        name: "head_handshake",
        types: BOOL,
    },
    TemplateKey {
        name: "key",
        types: STRING_OR_LIST,
    },
    TemplateKey {
        name: "dedup",
        types: STRING,
    },
    TemplateKey {
        name: "ignore",
        types: STRING_OR_LIST,
    },
    TemplateKey {
        name: "event_type",
        types: STRING,
    },
    TemplateKey {
        name: "attrs",
        types: TABLE,
    },
    TemplateKey {
        name: "sender_retries",
        types: BOOL,
    },
    TemplateKey {
        name: "tolerance_s",
        types: INT,
    },
    TemplateKey {
        name: "recipe",
        types: TABLE,
    },
    TemplateKey {
        name: "handshake",
        types: TABLE,
    },
    TemplateKey {
        name: "accepted_reply",
        types: STRING,
    },
];

/// The keys a "settings" bobbin must declare as settings: without them no instance could
/// build a template source.
pub const SETTINGS_FORM_REQUIRED: &[&str] = &["scheme", "key"];

pub fn template_key(name: &str) -> Option<&'static TemplateKey> {
    TEMPLATE_KEYS.iter().find(|k| k.name == name)
}

/// Whether a template key's value means unset, so the key is left out of the expanded
/// source: [`is_unset`], and 0 for an integer key (`tolerance_s`), which has no empty value
/// and no meaning at 0 (the template source takes 30 to 3600 s), so a "settings" bobbin's
/// integer setting can default to "the scheme's own".
pub fn is_unset_template_value(key: &str, v: &toml::Value) -> bool {
    let int_key = template_key(key).is_some_and(|k| k.types == INT);
    is_unset(v) || (int_key && v.as_integer() == Some(0))
}

/// "", [] and {} mean unset: the key is left out of the expanded source (14.3.2a).
pub fn is_unset(v: &toml::Value) -> bool {
    match v {
        toml::Value::String(s) => s.is_empty(),
        toml::Value::Array(a) => a.is_empty(),
        toml::Value::Table(t) => t.is_empty(),
        _ => false,
    }
}

/// The setting type `ty` may carry template key `key`; `Err` says what to write.
pub fn check_setting_type(key: &TemplateKey, ty: SettingType) -> Result<(), String> {
    if key.types.contains(&ty) {
        return Ok(());
    }
    Err(format!(
        "{} is a template key of type {}; write type = \"{}\"",
        key.name,
        key.types
            .iter()
            .map(|t| t.as_str())
            .collect::<Vec<_>>()
            .join(" or "),
        key.types[0].as_str()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn template_setting_types_follow_the_key() {
        let key = template_key("key").expect("key");
        assert!(check_setting_type(key, SettingType::List).is_ok());
        assert!(check_setting_type(key, SettingType::String).is_ok());
        let e = check_setting_type(template_key("head_handshake").unwrap(), SettingType::String)
            .unwrap_err();
        assert!(e.contains("type = \"bool\""), "{e}");
        assert!(check_setting_type(template_key("attrs").unwrap(), SettingType::Table).is_ok());
        assert!(template_key("owner").is_none());
    }

    #[test]
    fn template_tolerance_s_zero_is_unset() {
        assert!(is_unset_template_value(
            "tolerance_s",
            &toml::Value::Integer(0)
        ));
        assert!(!is_unset_template_value(
            "tolerance_s",
            &toml::Value::Integer(600)
        ));
        // Only an integer key reads 0 as unset.
        assert!(!is_unset_template_value(
            "head_handshake",
            &toml::Value::Boolean(false)
        ));
        assert!(is_unset_template_value(
            "header",
            &toml::Value::String(String::new())
        ));
    }

    #[test]
    fn template_empty_value_is_unset() {
        for v in ["v = \"\"", "v = []", "v = {}"] {
            let t: toml::Table = toml::from_str(v).unwrap();
            assert!(is_unset(&t["v"]), "{v}");
        }
        for v in ["v = \"x\"", "v = false", "v = 0", "v = [\"a\"]"] {
            let t: toml::Table = toml::from_str(v).unwrap();
            assert!(!is_unset(&t["v"]), "{v}");
        }
    }
}
