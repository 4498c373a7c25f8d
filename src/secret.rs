//! Secret references (spec 10), on the bottom floor so that config, the destinations, the
//! expansion and the processor runtime all read them without reaching up: `{ file = "..." }`, `{ env = "NAME" }` or
//! `{ env_file = "...", key = "NAME" }`, or a list of them during a rotation (every one is a
//! valid candidate). Values are read at use time, never cached, never logged, never stored.
//! Errors name the reference (a path or a variable name), never a value.

use std::path::PathBuf;

use serde::Deserialize;

/// One reference.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(untagged, deny_unknown_fields)]
pub enum SecretRef {
    File { file: PathBuf },
    Env { env: String },
    EnvFile { env_file: PathBuf, key: String },
}

/// A reference or, during a rotation, several.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(untagged)]
pub enum SecretRefs {
    One(SecretRef),
    Many(Vec<SecretRef>),
}

impl SecretRefs {
    pub fn refs(&self) -> Vec<&SecretRef> {
        match self {
            SecretRefs::One(r) => vec![r],
            SecretRefs::Many(v) => v.iter().collect(),
        }
    }
}

/// Why one reference could not be read. Names the reference (a path or a variable name),
/// never a value. A named secret's error ([`SecretError::Unreadable`]) carries it as text.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RefError {
    #[error("secret file {0} cannot be read: {1}")]
    File(String, String),
    #[error("environment variable {0} is not set")]
    EnvMissing(String),
    #[error("env file {0} cannot be read: {1}")]
    EnvFile(String, String),
    #[error("env file {0} has no {1}=")]
    EnvFileKey(String, String),
    #[error("secret {0} is empty")]
    Empty(String),
    #[error("no secret named {0} is configured")]
    Unknown(String),
}

impl SecretRef {
    /// Where the value lives, for messages.
    pub fn describe(&self) -> String {
        match self {
            SecretRef::File { file } => format!("file {}", file.display()),
            SecretRef::Env { env } => format!("env {env}"),
            SecretRef::EnvFile { env_file, key } => {
                format!("env_file {} key {key}", env_file.display())
            }
        }
    }

    /// Read the value now.
    pub fn resolve(&self) -> Result<Vec<u8>, RefError> {
        let value = match self {
            SecretRef::File { file } => {
                let mut v = std::fs::read(file).map_err(|e| {
                    RefError::File(file.display().to_string(), e.kind().to_string())
                })?;
                // A trailing newline from `echo secret > file` is never part of the secret.
                while v.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
                    v.pop();
                }
                v
            }
            SecretRef::Env { env } => std::env::var_os(env)
                .ok_or_else(|| RefError::EnvMissing(env.clone()))?
                .into_encoded_bytes(),
            SecretRef::EnvFile { env_file, key } => {
                let text = std::fs::read_to_string(env_file).map_err(|e| {
                    RefError::EnvFile(env_file.display().to_string(), e.kind().to_string())
                })?;
                env_file_value(&text, key)
                    .ok_or_else(|| {
                        RefError::EnvFileKey(env_file.display().to_string(), key.clone())
                    })?
                    .into_bytes()
            }
        };
        if value.is_empty() {
            return Err(RefError::Empty(self.describe()));
        }
        Ok(value)
    }
}

/// Why a named secret could not be had, for whoever asked by name (a source verifying a
/// request, a destination signing one). Carries the secret's name, never its value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("secret {name}: not configured")]
    NotConfigured { name: String },
    /// `reason` says what failed (missing file, bad mode, unset variable), never the value.
    #[error("secret {name}: cannot be read ({reason})")]
    Unreadable { name: String, reason: String },
    #[error("secret {name}: has no value")]
    Empty { name: String },
    /// Handed to an unauthenticated challenge, which must not read secrets.
    #[error("secret {name}: not available before verification")]
    Refused { name: String },
}

/// Where secrets come from when they are needed, asked at every use (spec 10: never cached,
/// so a rotated file takes effect on the next request or attempt). The one seam between a
/// secret's reader and whoever resolves it: the intake's sources, `replay --verify`, `source
/// test`, the kit, and the http destinations all ask through it.
pub trait SecretSource {
    /// Every currently valid value of the secret `name`, newest first. Several values mean a
    /// rotation is in progress: a verifier tries every one, a signer signs with the first.
    fn candidates(&self, name: &str) -> Result<Vec<Vec<u8>>, SecretError>;
}

/// A `secrets` table (a source's), resolved at every call for verification. Every reference
/// of a rotation list is a candidate, in the order written (newest first by convention). A
/// reference that cannot be read is skipped while another one can (a rotation whose old file
/// was already removed keeps working); when none can be read the first failure is returned,
/// so verification answers 503, never 401 or 2xx.
pub struct ConfigSecrets<'a> {
    refs: &'a std::collections::BTreeMap<String, SecretRefs>,
}

impl<'a> ConfigSecrets<'a> {
    pub fn new(refs: &'a std::collections::BTreeMap<String, SecretRefs>) -> Self {
        ConfigSecrets { refs }
    }
}

impl SecretSource for ConfigSecrets<'_> {
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

/// A signer's one secret (an http destination's `secret`, then `secret_previous` during a
/// rotation), resolved at every attempt. Unlike verification, every reference must read:
/// signing with the previous secret alone because the current one is missing would send
/// what the receiver is about to stop accepting, so an unreadable one fails the attempt
/// (the config class) and says which.
#[derive(Clone)]
pub struct SigningSecrets {
    refs: Vec<SecretRef>,
}

impl SigningSecrets {
    /// The current secret's references first, then the previous one's.
    pub fn new(current: &SecretRefs, previous: Option<&SecretRefs>) -> Self {
        let refs = current
            .refs()
            .into_iter()
            .chain(previous.into_iter().flat_map(|p| p.refs()))
            .cloned()
            .collect();
        SigningSecrets { refs }
    }
}

impl std::fmt::Debug for SigningSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SigningSecrets({} references)", self.refs.len())
    }
}

impl SecretSource for SigningSecrets {
    fn candidates(&self, name: &str) -> Result<Vec<Vec<u8>>, SecretError> {
        self.refs
            .iter()
            .map(|r| {
                r.resolve().map_err(|e| SecretError::Unreadable {
                    name: name.to_string(),
                    reason: e.to_string(),
                })
            })
            .collect()
    }
}

/// Values fixed at construction, for every name (tests and the kit's signer).
#[derive(Clone)]
pub struct StaticSecrets(pub Vec<Vec<u8>>);

impl std::fmt::Debug for StaticSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StaticSecrets({} redacted)", self.0.len())
    }
}

impl SecretSource for StaticSecrets {
    fn candidates(&self, _name: &str) -> Result<Vec<Vec<u8>>, SecretError> {
        Ok(self.0.clone())
    }
}

/// Group or others may not read a secret file.
const SECRET_MODE_OTHERS_MASK: u32 = 0o077;

/// What is wrong with where the config's secret files are (issue 28), as (config key,
/// advice) pairs that name paths and modes, never a value: a file group or others can read,
/// and a reference that is (or passes through) a symlink resolving outside every directory
/// the config names for secrets (the directories its file references sit in), such as a link
/// to /etc/shadow used as an HMAC key. A file that does not exist is not reported here (its
/// reference fails at use time, and `check` says so).
pub fn exposures(files: &[(String, PathBuf)]) -> Vec<(String, String)> {
    use std::os::unix::fs::PermissionsExt;
    let dirs: std::collections::BTreeSet<PathBuf> = files
        .iter()
        .filter_map(|(_, f)| f.parent())
        .filter_map(|d| std::fs::canonicalize(d).ok())
        .collect();
    let mut out = Vec::new();
    for (key, file) in files {
        let shown = file.display();
        if let Ok(m) = std::fs::metadata(file) {
            let mode = m.permissions().mode() & 0o777;
            if mode & SECRET_MODE_OTHERS_MASK != 0 {
                out.push((
                    key.clone(),
                    format!("{shown} has mode {mode:04o}: group or others can read it; run chmod 600 {shown}"),
                ));
            }
        }
        let Ok(target) = std::fs::canonicalize(file) else {
            continue;
        };
        let written = file
            .parent()
            .and_then(|d| std::fs::canonicalize(d).ok())
            .zip(file.file_name())
            .map(|(d, n)| d.join(n));
        let is_link = written.as_deref() != Some(target.as_path())
            || std::fs::symlink_metadata(file).is_ok_and(|m| m.file_type().is_symlink());
        if is_link && !dirs.iter().any(|d| target.starts_with(d)) {
            let names: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
            out.push((
                key.clone(),
                format!(
                    "{shown} is a symlink to {}, outside the directories the config names for secrets ({}); copy the secret into one of them, or point the reference at the file itself",
                    target.display(),
                    names.join(", ")
                ),
            ));
        }
    }
    out
}

/// `KEY=value` lines (optionally `export KEY=value`, quoted values, `#` comments).
pub fn env_file_value(text: &str, key: &str) -> Option<String> {
    env_file_pairs(text)
        .into_iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v)
}

pub fn env_file_pairs(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let line = line.strip_prefix("export ").unwrap_or(line);
        let Some((k, v)) = line.split_once('=') else {
            continue;
        };
        let v = v.trim();
        let v = v
            .strip_prefix('"')
            .and_then(|s| s.strip_suffix('"'))
            .or_else(|| v.strip_prefix('\'').and_then(|s| s.strip_suffix('\'')))
            .unwrap_or(v);
        out.push((k.trim().to_string(), v.to_string()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposures_name_a_readable_file_and_a_link_outside_the_secret_directories() {
        use std::os::unix::fs::{PermissionsExt, symlink};
        let root = tempfile::tempdir().unwrap();
        let secrets = root.path().join("secrets");
        let elsewhere = root.path().join("elsewhere");
        std::fs::create_dir_all(&secrets).unwrap();
        std::fs::create_dir_all(&elsewhere).unwrap();
        let write = |p: &std::path::Path, mode: u32| {
            std::fs::write(p, "SENTINEL-VALUE").unwrap();
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        write(&secrets.join("good"), 0o600);
        write(&secrets.join("open"), 0o644);
        write(&elsewhere.join("target"), 0o600);
        write(&secrets.join("real"), 0o600);
        symlink(elsewhere.join("target"), secrets.join("away")).unwrap();
        symlink(secrets.join("real"), secrets.join("near")).unwrap();
        let files: Vec<(String, PathBuf)> = ["good", "open", "away", "near"]
            .iter()
            .map(|n| (format!("sources.s.secrets.{n}"), secrets.join(n)))
            .collect();
        let found = exposures(&files);
        let keys: Vec<&str> = found.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            ["sources.s.secrets.open", "sources.s.secrets.away"],
            "{found:?}"
        );
        assert!(found[0].1.contains("mode 0644") && found[0].1.contains("chmod 600"));
        assert!(
            found[1].1.contains("is a symlink to") && found[1].1.contains("elsewhere"),
            "{}",
            found[1].1
        );
        assert!(
            found.iter().all(|(_, m)| !m.contains("SENTINEL")),
            "no value"
        );
    }

    #[test]
    fn refs_resolve_at_use_time_and_errors_carry_no_value() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("s");
        std::fs::write(&f, "SENTINEL-abc\n").unwrap();
        let r = SecretRef::File { file: f.clone() };
        assert_eq!(r.resolve().unwrap(), b"SENTINEL-abc");
        std::fs::write(&f, "rotated").unwrap();
        assert_eq!(r.resolve().unwrap(), b"rotated", "never cached");
        let ef = dir.path().join("e.env");
        std::fs::write(&ef, "# c\nexport A=\"SENTINEL-1\"\nB=two\n").unwrap();
        let r = SecretRef::EnvFile {
            env_file: ef.clone(),
            key: "A".into(),
        };
        assert_eq!(r.resolve().unwrap(), b"SENTINEL-1");
        let r = SecretRef::EnvFile {
            env_file: ef,
            key: "C".into(),
        };
        let e = r.resolve().unwrap_err().to_string();
        assert!(e.contains("has no C=") && !e.contains("SENTINEL"), "{e}");
        let r = SecretRef::Env {
            env: "HOOKSPOOL_TEST_SURELY_UNSET".into(),
        };
        assert!(matches!(r.resolve(), Err(RefError::EnvMissing(_))));
    }

    #[test]
    fn toml_forms_parse() {
        #[derive(Deserialize)]
        struct T {
            a: SecretRefs,
            b: SecretRefs,
        }
        let t: T = toml::from_str(
            r#"a = { file = "/x" }
               b = [{ env = "X" }, { env_file = "/e", key = "K" }]"#,
        )
        .unwrap();
        assert_eq!(t.a.refs().len(), 1);
        assert_eq!(t.b.refs().len(), 2);
        assert!(
            toml::from_str::<T>(
                r#"a = { fil = "/x" }
b = { env = "X" }"#
            )
            .is_err()
        );
    }
}

#[cfg(test)]
mod config_secrets_tests {
    use super::*;
    use std::collections::BTreeMap;

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
