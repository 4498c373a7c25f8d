//! The [`SecretSource`] the intake hands to sources: a source's configured secret
//! references, resolved at every call (spec 10: never cached, so a rotated file takes effect
//! on the next request).
//!
//! Must not: keep, log or return a secret value anywhere but to the calling source; errors
//! name the secret and where it lives (a path or a variable name), never a value.

use std::collections::BTreeMap;

use crate::config::SecretRefs;
use crate::sources::{SecretError, SecretSource};

/// A source's `secrets` table as a `SecretSource`.
pub struct ConfigSecrets<'a> {
    refs: &'a BTreeMap<String, SecretRefs>,
}

impl<'a> ConfigSecrets<'a> {
    pub fn new(refs: &'a BTreeMap<String, SecretRefs>) -> Self {
        ConfigSecrets { refs }
    }
}

impl SecretSource for ConfigSecrets<'_> {
    /// Every reference of a rotation list is a candidate, in the order written (newest
    /// first by convention). A reference that cannot be read is skipped while another one
    /// can (a rotation whose old file was already removed keeps working); when none can be
    /// read the first failure is returned, so verification answers 503, never 401 or 2xx.
    fn candidates(&self, name: &str) -> Result<Vec<Vec<u8>>, SecretError> {
        let Some(refs) = self.refs.get(name) else {
            return Err(SecretError::NotConfigured {
                name: name.to_string(),
            });
        };
        let mut values = Vec::new();
        let mut first_error = None;
        for r in refs.refs() {
            match r.resolve() {
                Ok(v) => values.push(v),
                Err(e) => {
                    first_error.get_or_insert(SecretError::Unreadable {
                        name: name.to_string(),
                        reason: e.to_string(),
                    });
                }
            }
        }
        match (values.is_empty(), first_error) {
            (false, _) => Ok(values),
            (true, Some(e)) => Err(e),
            (true, None) => Err(SecretError::Empty {
                name: name.to_string(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SecretRef;

    #[test]
    fn every_readable_ref_is_a_candidate_and_errors_name_no_value() {
        let dir = tempfile::tempdir().unwrap();
        let new = dir.path().join("new");
        let old = dir.path().join("old");
        std::fs::write(&new, "SENTINEL-new\n").unwrap();
        std::fs::write(&old, "SENTINEL-old").unwrap();
        let mut refs = BTreeMap::new();
        refs.insert(
            "secret".to_string(),
            SecretRefs::Many(vec![
                SecretRef::File { file: new.clone() },
                SecretRef::File { file: old.clone() },
            ]),
        );
        let s = ConfigSecrets::new(&refs);
        assert_eq!(
            s.candidates("secret").unwrap(),
            vec![b"SENTINEL-new".to_vec(), b"SENTINEL-old".to_vec()]
        );
        std::fs::remove_file(&old).unwrap();
        assert_eq!(
            s.candidates("secret").unwrap().len(),
            1,
            "rotation keeps going"
        );
        std::fs::remove_file(&new).unwrap();
        let e = s.candidates("secret").unwrap_err().to_string();
        assert!(e.contains("secret") && !e.contains("SENTINEL"), "{e}");
        assert!(matches!(
            s.candidates("other"),
            Err(SecretError::NotConfigured { .. })
        ));
    }
}
