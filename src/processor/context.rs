//! The [`Context`] a built-in processor calls (spec 14.3.4, 14.3.7): settings, secrets,
//! `http`, `oauth`, `pace`, staged state, `log`, `now` and the deployment's `hook`s
//! (14.3.6). Everything that is the same for
//! two services is here or in `providers`, never in a processor.
//!
//! Must not: log or Debug-print a secret's value, a state value or a setting's value; read
//! the process environment (the contract is parsed once, in `contract`); write state (writes
//! are staged and the runtime journals them before applying).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::ProcessorError;
use super::hooks::Hooks;
use super::http::Http;
use super::oauth::{OAuth, TokenCache, TokenEndpoint};
use super::pace::Pacer;
use super::state::{RUNTIME_FILE, atomic_write, read_json};
use crate::clock::Clock;
use crate::secret::SecretRefs;

/// A secret's value. Debug never shows it; `expose` is the one way to read it.
pub struct Secret(Vec<u8>);

impl Secret {
    pub fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// The runtime's own state (OAuth caches), apart from the processor's staged state: it is
/// written at once, never staged, because a rotated refresh token must survive a batch that
/// fails after the refresh (the old token may already be invalid).
#[derive(Debug, Default, Serialize, Deserialize)]
struct RuntimeFile {
    #[serde(default)]
    oauth: BTreeMap<String, TokenCache>,
}

pub(crate) struct RuntimeState {
    dir: Option<PathBuf>,
    file: RuntimeFile,
}

impl RuntimeState {
    /// Reads `runtime.json` from the (locked) state directory; without one, tokens live only
    /// for this run.
    pub(crate) fn load(dir: Option<&Path>) -> Result<RuntimeState, ProcessorError> {
        let file = match dir {
            Some(d) => read_json(&d.join(RUNTIME_FILE))?.unwrap_or_default(),
            None => RuntimeFile::default(),
        };
        Ok(RuntimeState {
            dir: dir.map(Path::to_path_buf),
            file,
        })
    }

    pub(crate) fn token(&self, secret: &str) -> Option<&TokenCache> {
        self.file.oauth.get(secret)
    }

    pub(crate) fn set_token(
        &mut self,
        secret: &str,
        cache: TokenCache,
    ) -> Result<(), ProcessorError> {
        self.file.oauth.insert(secret.to_string(), cache);
        let Some(dir) = &self.dir else {
            return Ok(());
        };
        // Serialising plain strings and numbers cannot fail.
        let bytes = serde_json::to_vec_pretty(&self.file).unwrap_or_default();
        atomic_write(dir, RUNTIME_FILE, &bytes)
            .map_err(|e| ProcessorError::state_io("writing runtime.json", &e))
    }
}

/// What a built-in processor works with for one batch.
pub struct Context {
    instance: String,
    batch_id: i64,
    bobbin_dir: PathBuf,
    settings: Map<String, Value>,
    secret_refs: BTreeMap<String, SecretRefs>,
    state: Map<String, Value>,
    staged: Map<String, Value>,
    pub(crate) runtime: RuntimeState,
    http: Http,
    clock: Arc<dyn Clock>,
    /// The deployment's hooks program (14.3.6), from the `hooks` setting.
    hooks: Option<Hooks>,
}

/// The parts a context is built from (the runtime fills them in).
pub(crate) struct Parts {
    pub instance: String,
    pub batch_id: i64,
    pub bobbin_dir: PathBuf,
    pub settings: Map<String, Value>,
    pub secret_refs: BTreeMap<String, SecretRefs>,
    pub state: Map<String, Value>,
    pub runtime: RuntimeState,
    pub http: Http,
    pub clock: Arc<dyn Clock>,
}

impl Context {
    pub(crate) fn new(p: Parts) -> Context {
        let hooks = Hooks::from_settings(&p.settings);
        Context {
            hooks,
            instance: p.instance,
            batch_id: p.batch_id,
            bobbin_dir: p.bobbin_dir,
            settings: p.settings,
            secret_refs: p.secret_refs,
            state: p.state,
            staged: Map::new(),
            runtime: p.runtime,
            http: p.http,
            clock: p.clock,
        }
    }

    pub fn instance(&self) -> &str {
        &self.instance
    }

    pub fn batch_id(&self) -> i64 {
        self.batch_id
    }

    /// The bobbin's directory (its data files, such as rule packs).
    pub fn bobbin_dir(&self) -> &Path {
        &self.bobbin_dir
    }

    /// The instance has a hooks program (spec 14.3.6).
    pub fn has_hooks(&self) -> bool {
        self.hooks.is_some()
    }

    /// Calls hook `name` of the deployment's hooks program (spec 14.3.6) with `args`: its
    /// answer, or `None` when the instance has no hooks or the hook has no opinion.
    pub fn hook(
        &self,
        name: &str,
        args: Value,
    ) -> Result<Option<Map<String, Value>>, ProcessorError> {
        let Some(h) = &self.hooks else {
            return Ok(None);
        };
        h.call(
            name,
            args,
            &self.instance,
            self.batch_id,
            &self.settings,
            self.bobbin_dir.clone(),
        )
    }

    /// The typed settings, defaults applied by the expansion.
    pub fn settings(&self) -> &Map<String, Value> {
        &self.settings
    }

    pub fn setting_str(&self, name: &str) -> Option<&str> {
        self.settings
            .get(name)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
    }

    pub fn setting_i64(&self, name: &str) -> Option<i64> {
        self.settings.get(name).and_then(Value::as_i64)
    }

    pub fn setting_bool(&self, name: &str) -> Option<bool> {
        self.settings.get(name).and_then(Value::as_bool)
    }

    /// A required string setting; missing is Permanent (the expansion should have refused).
    pub fn required_str(&self, name: &'static str) -> Result<&str, ProcessorError> {
        self.setting_str(name)
            .ok_or_else(|| ProcessorError::permanent(format!("setting {name} is not set")))
    }

    /// Resolves a secret the manifest gave the processor (`processor = true`). A name not
    /// given is Permanent; an unreadable reference Retryable (a file mid-rotation, a mount
    /// not up yet). The value is never logged.
    pub fn secret(&self, name: &str) -> Result<Secret, ProcessorError> {
        let refs = self.secret_refs.get(name).ok_or_else(|| {
            ProcessorError::permanent(format!(
                "secret {name} is not given to the processor (mark it processor = true)"
            ))
        })?;
        refs.refs()
            .iter()
            .find_map(|r| r.resolve().ok())
            .map(Secret)
            .ok_or_else(|| ProcessorError::retryable(format!("secret {name} is unreadable")))
    }

    /// A saved value, staged writes first; `None` when never saved (or deleted).
    pub fn load_state(&self, name: &str) -> Option<&Value> {
        match self.staged.get(name) {
            Some(Value::Null) => None,
            Some(v) => Some(v),
            None => self.state.get(name),
        }
    }

    /// A state value that is a string (a cursor, a token), as `load_state` sees it.
    pub fn state_str(&self, name: &str) -> Option<String> {
        self.load_state(name)
            .and_then(Value::as_str)
            .map(str::to_string)
    }

    /// A state value that is a list of strings (ids seen), empty when absent.
    pub fn state_strings(&self, name: &str) -> Vec<String> {
        self.load_state(name)
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Stages a write; applied only after the journal holding it is durable.
    pub fn save_state(&mut self, name: &str, value: Value) {
        self.staged.insert(name.to_string(), value);
    }

    /// One log line on stderr (journald under systemd) with the batch and instance. Ids and
    /// counts only: never a body, a subject, an address or a token.
    pub fn log(&self, line: &str) {
        tracing::info!(batch = self.batch_id, source = %self.instance, "{line}");
    }

    pub fn now(&self) -> f64 {
        self.clock.now()
    }

    /// A pacer for a provider's request-rate rule.
    pub fn pace(&self, per_s: f64) -> Pacer {
        Pacer::new(per_s)
    }

    pub fn http(&self) -> &Http {
        &self.http
    }

    /// The OAuth 2 refresh-token flow for the credential in secret `secret` (14.3.7).
    pub fn oauth(
        &self,
        secret: &str,
        endpoint: &'static TokenEndpoint,
    ) -> Result<OAuth, ProcessorError> {
        OAuth::new(self, secret, endpoint)
    }

    /// The staged writes, for the journal.
    pub(crate) fn into_writes(self) -> Map<String, Value> {
        self.staged
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::secret::SecretRef;

    pub(crate) fn context(refs: BTreeMap<String, SecretRefs>) -> Context {
        Context::new(Parts {
            instance: "gmail".into(),
            batch_id: 1,
            bobbin_dir: PathBuf::from("/b"),
            settings: Map::new(),
            secret_refs: refs,
            state: serde_json::from_str(r#"{"a":1,"b":2}"#).unwrap(),
            runtime: RuntimeState::load(None).unwrap(),
            http: Http::new(super::super::http::Endpoints::default()).unwrap(),
            clock: Arc::new(crate::clock::SystemClock),
        })
    }

    #[test]
    fn secrets_resolve_by_name_and_never_show() {
        let tmp = tempfile::tempdir().unwrap();
        let f = tmp.path().join("s");
        std::fs::write(&f, "SENTINEL-secret\n").unwrap();
        let refs = BTreeMap::from([
            (
                "good".to_string(),
                SecretRefs::One(SecretRef::File { file: f }),
            ),
            (
                "gone".to_string(),
                SecretRefs::One(SecretRef::File {
                    file: tmp.path().join("missing"),
                }),
            ),
        ]);
        let ctx = context(refs);
        let s = ctx.secret("good").unwrap();
        assert_eq!(s.expose(), b"SENTINEL-secret");
        assert!(!format!("{s:?}").contains("SENTINEL"));
        use super::super::Failure::*;
        assert_eq!(ctx.secret("nope").unwrap_err().failure, Permanent);
        assert_eq!(ctx.secret("gone").unwrap_err().failure, Retryable);
    }

    #[test]
    fn state_writes_are_staged_over_the_applied_values() {
        let mut ctx = context(BTreeMap::new());
        ctx.save_state("a", Value::from(10));
        ctx.save_state("b", Value::Null);
        assert_eq!(ctx.load_state("a"), Some(&Value::from(10)));
        assert_eq!(ctx.load_state("b"), None);
        let w = ctx.into_writes();
        assert_eq!(w.len(), 2);
    }
}
