//! Bobbins: one directory per outside service, enabled by one config table (spec 14.3).
//!
//! Owns: bobbin names and layout ([`name`]), the manifest `bobbin.toml` ([`manifest`], with
//! [`provider`], [`template_keys`] and the documents' [`frontmatter`]), discovery of the
//! built-in bobbins compiled into the binary ([`embedded`]) and of `spool.bobbin_path`
//! directories with their ownership rules ([`catalog`]), instance expansion as a pure
//! function ([`expand`]: `[bobbins.<i>]` -> raw `[sources.<i>]`, `[destinations."script:<i>"]`
//! and `[[routes]]` tables), the capture and `captures/kit.toml` formats ([`capture`]), and
//! the conformance scorecard behind `hookspool bobbin check` ([`kit`], whose source-kit row
//! is `source_kit`), and the scaffold of `hookspool bobbin new` ([`scaffold`]).
//!
//! Must not: open the spool, resolve a secret's value (expansion copies references, and
//! `bobbin` commands print them, never values), or validate what the expanded tables'
//! owners validate (the config loader checks the expanded sources, destinations and routes
//! exactly as hand-written ones, and the template source checks its keys).
//!
//! How the config loader uses it (`config::expansion`): `Catalog::load(&bobbin_path)` on
//! every load (manifests are re-read each time), then `expand::expand_config(&root_table,
//! &catalog, &home)` before the raw config is deserialized; its problems carry the config
//! key and the fix, and its [`Instances`] name the instance key of any later problem.

pub mod catalog;
pub mod embedded;
pub mod expand;
pub mod frontmatter;
pub mod locate;
pub mod manifest;
pub mod name;
pub mod provider;
pub mod setting_type;
pub mod template_keys;

#[cfg(test)]
mod tests;

pub use catalog::{Catalog, Entry, Origin};
pub use expand::{
    ExpandError, Expanded, Expansion, InstanceOrigin, Instances, expand_config, expand_instance,
};
pub use manifest::Manifest;
pub use name::BobbinName;

use std::fmt;

/// One problem in a bobbin's files: `file:line: what to write instead` (line 0: the file as
/// a whole).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Finding {
    pub file: String,
    pub line: usize,
    pub message: String,
}

impl Finding {
    pub fn new(file: impl Into<String>, line: usize, message: impl Into<String>) -> Finding {
        Finding {
            file: file.into(),
            line,
            message: message.into(),
        }
    }
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}: {}", self.file, self.message)
        } else {
            write!(f, "{}:{}: {}", self.file, self.line, self.message)
        }
    }
}
