//! Bobbin names and directory layout (spec 14.3.1).
//!
//! Owns: [`BobbinName`] (`<vendor>.<product>`, exactly one dot, each part
//! `^[a-z][a-z0-9-]{0,39}$`), the reserved `hookspool.` namespace, the rule that a bobbin's
//! directory is `<vendor>/<product>/` below its root (each part may spell `-` as `_`, so two
//! directories that differ only by `-`/`_` name the same bobbin), and instance names (plain
//! identifiers, the `/hooks/<instance>` path segment).
//!
//! Must not: read files (the catalogue walks directories and asks these functions).

use std::fmt;

/// The longest vendor or product part, in characters.
pub const NAME_PART_CHARS_MAX: usize = 40;

/// The longest instance name, in characters (the config's identifier bound).
pub const INSTANCE_CHARS_MAX: usize = 64;

/// The namespace of the generic bobbins shipped with core (hookspool.webhook).
pub const RESERVED_VENDOR: &str = "hookspool";

/// A valid `<vendor>.<product>`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BobbinName {
    vendor: String,
    product: String,
}

/// Why a name is not a bobbin name. The Display text says what to write instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error(
        "{0:?} is not <vendor>.<product> with exactly one dot; write e.g. \"github.repo\" or \"google.gmail\""
    )]
    Dots(String),
    #[error(
        "{part:?} in {name:?} must start with a-z and hold only a-z, 0-9 and - (at most {NAME_PART_CHARS_MAX} characters); write e.g. {suggestion:?}"
    )]
    Part {
        name: String,
        part: String,
        suggestion: String,
    },
}

impl BobbinName {
    /// Parses `<vendor>.<product>`.
    pub fn parse(text: &str) -> Result<BobbinName, NameError> {
        let Some((vendor, product)) = text.split_once('.') else {
            return Err(NameError::Dots(text.to_string()));
        };
        if product.contains('.') {
            return Err(NameError::Dots(text.to_string()));
        }
        for part in [vendor, product] {
            if !is_name_part(part) {
                return Err(NameError::Part {
                    name: text.to_string(),
                    part: part.to_string(),
                    suggestion: suggest_part(part),
                });
            }
        }
        Ok(BobbinName {
            vendor: vendor.to_string(),
            product: product.to_string(),
        })
    }

    /// The name a `<vendor>/<product>` directory pair stands for (`_` read as `-`), or the
    /// reason it stands for none.
    pub fn from_dirs(vendor_dir: &str, product_dir: &str) -> Result<BobbinName, NameError> {
        BobbinName::parse(&format!(
            "{}.{}",
            vendor_dir.replace('_', "-"),
            product_dir.replace('_', "-")
        ))
    }

    pub fn vendor(&self) -> &str {
        &self.vendor
    }

    pub fn product(&self) -> &str {
        &self.product
    }

    /// In the namespace only core may ship bobbins in.
    pub fn is_reserved(&self) -> bool {
        self.vendor == RESERVED_VENDOR
    }

    /// The directory below a root, with `-` as written (`<vendor>/<product>`).
    pub fn rel_dir(&self) -> String {
        format!("{}/{}", self.vendor, self.product)
    }
}

impl fmt::Display for BobbinName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.vendor, self.product)
    }
}

fn is_name_part(part: &str) -> bool {
    let mut chars = part.chars();
    chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && part.chars().count() <= NAME_PART_CHARS_MAX
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

/// A nearby valid part, for the message.
fn suggest_part(part: &str) -> String {
    let mut s: String = part
        .to_ascii_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_lowercase() || c.is_ascii_digit() {
                c
            } else {
                '-'
            }
        })
        .collect();
    while s.starts_with(|c: char| !c.is_ascii_lowercase()) && !s.is_empty() {
        s.remove(0);
    }
    s.truncate(NAME_PART_CHARS_MAX);
    if s.is_empty() { "vendor".into() } else { s }
}

/// A `[bobbins.<instance>]` name: a plain identifier (lowercase letters, digits, `-`, `_`,
/// at most [`INSTANCE_CHARS_MAX`]), since it is also the `/hooks/<instance>` path segment.
pub fn is_instance_name(s: &str) -> bool {
    !s.is_empty()
        && s.chars().count() <= INSTANCE_CHARS_MAX
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn name_needs_exactly_one_dot() {
        assert!(matches!(
            BobbinName::parse("github"),
            Err(NameError::Dots(_))
        ));
        assert!(matches!(
            BobbinName::parse("google.gmail.push"),
            Err(NameError::Dots(_))
        ));
        let n = BobbinName::parse("google.gmail").expect("valid");
        assert_eq!((n.vendor(), n.product()), ("google", "gmail"));
        assert_eq!(n.to_string(), "google.gmail");
    }

    #[test]
    fn name_parts_are_lowercase_tokens() {
        for bad in ["Google.gmail", "google._x", "9x.y", "a.b_c", "a.", ".b"] {
            let e = BobbinName::parse(bad).expect_err(bad);
            assert!(e.to_string().contains("write e.g."), "{bad}: {e}");
        }
        let long = format!("a.{}", "b".repeat(NAME_PART_CHARS_MAX + 1));
        assert!(BobbinName::parse(&long).is_err());
        assert!(BobbinName::parse(&format!("a.{}", "b".repeat(NAME_PART_CHARS_MAX))).is_ok());
        assert!(BobbinName::parse("standard-webhooks.v1").is_ok());
    }

    #[test]
    fn name_reserved_namespace() {
        assert!(
            BobbinName::parse("hookspool.webhook")
                .unwrap()
                .is_reserved()
        );
        assert!(!BobbinName::parse("github.repo").unwrap().is_reserved());
    }

    #[test]
    fn name_dash_underscore_directories_collide() {
        let a = BobbinName::from_dirs("acme_corp", "big_widgets").expect("valid");
        let b = BobbinName::from_dirs("acme-corp", "big-widgets").expect("valid");
        assert_eq!(a, b);
        assert_eq!(a.rel_dir(), "acme-corp/big-widgets");
    }

    #[test]
    fn instance_names_are_identifiers() {
        assert!(is_instance_name("github-ci"));
        assert!(is_instance_name("gmail_2"));
        assert!(!is_instance_name("google.gmail"));
        assert!(!is_instance_name("Gmail"));
        assert!(!is_instance_name(""));
    }
}
