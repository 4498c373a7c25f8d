//! The Plaid webhook source and its guarded verification-key cache.
//!
//! Owns: `Plaid-Verification` checking (a compact ES256 JWS: structure and `alg == ES256`
//! before anything else, then the key for its `kid`, the signature, `iat` within 300 s both
//! ways, and the `request_body_sha256` claim against the body in constant time); the
//! process-wide [`KeyCache`] (known keys kept, unknown kids negative-cached for
//! [`NEGATIVE_TTL_S`], at most one fetch per [`FETCH_INTERVAL_S`] per Plaid environment) so
//! unauthenticated requests with random kids cannot amplify against Plaid's API or tie up
//! intake threads (spec section 10); dedup on the body's SHA-256 (Plaid bodies carry no id,
//! hence the 600 s window).
//!
//! Must not: do the fetch itself. The network call (`POST /webhook_verification_key/get`
//! with client_id, secret and key_id) is behind [`JwkFetcher`], which the intake installs
//! with [`set_fetcher`]; this module only decides when a fetch may happen, and never holds
//! its lock while one runs. Time comes from `Request::now`, so tests drive the guards.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::opts::{Opts, invalid};
use super::verify::{self, TOLERANCE_S_DEFAULT};
use super::{
    Declared, Request, SecretError, SecretSource, Source, SourceConfigError, SourceError, names,
    need_candidates,
};

pub const VERIFICATION_HEADER: &str = "Plaid-Verification";
pub const SECRET_CLIENT_ID: &str = "client_id";
pub const SECRET_SECRET: &str = "secret";
/// Plaid's environments, i.e. the hosts a key may be fetched from.
pub const ENVS: &[&str] = &["production", "sandbox", "development"];

/// How long an unknown kid is answered "unknown" without asking Plaid again.
pub const NEGATIVE_TTL_S: f64 = 600.0;
/// At most one key fetch per environment in this window, process-wide.
pub const FETCH_INTERVAL_S: f64 = 60.0;
/// Bounds on what the cache holds, so a flood of random kids cannot grow it.
pub const KNOWN_KEYS_MAX: usize = 64;
pub const NEGATIVE_KIDS_MAX: usize = 4096;
/// Plaid kids are UUIDs; anything much longer is not one and is refused before the cache.
pub const KID_BYTES_MAX: usize = 128;
/// Plaid keeps webhooks for days; a short dedup window means an identical body a day later
/// is a new event (spec section 7).
pub const DEDUP_WINDOW_S: u64 = 600;

/// A Plaid verification key, as `/webhook_verification_key/get` returns it under `key`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlaidJwk {
    pub kid: String,
    #[serde(default)]
    pub alg: String,
    pub kty: String,
    pub crv: String,
    pub x: String,
    pub y: String,
    #[serde(default)]
    pub created_at: Option<i64>,
    #[serde(default)]
    pub expired_at: Option<i64>,
}

/// Why a key fetch failed. Names the failure, never the credentials or the response body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
    #[error("no key fetcher is installed")]
    NoFetcher,
    #[error("key service unreachable ({reason})")]
    Transport { reason: String },
    #[error("key service answered HTTP {status}")]
    Status { status: u16 },
    #[error("key service answer is malformed")]
    BadResponse,
}

/// The network half of key lookup. `Ok(None)`: Plaid says there is no such key.
pub trait JwkFetcher: Send + Sync {
    fn fetch(
        &self,
        env: &str,
        kid: &str,
        client_id: &[u8],
        secret: &[u8],
    ) -> Result<Option<PlaidJwk>, FetchError>;
}

/// A fetcher that answers from a fixed list (the kit and tests; an offline `source test`).
pub struct StaticJwkFetcher {
    pub keys: Vec<PlaidJwk>,
    pub calls: std::sync::atomic::AtomicUsize,
}

impl StaticJwkFetcher {
    pub fn new(keys: Vec<PlaidJwk>) -> Self {
        StaticJwkFetcher {
            keys,
            calls: std::sync::atomic::AtomicUsize::new(0),
        }
    }
    pub fn calls(&self) -> usize {
        self.calls.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl JwkFetcher for StaticJwkFetcher {
    fn fetch(
        &self,
        _env: &str,
        kid: &str,
        _client_id: &[u8],
        _secret: &[u8],
    ) -> Result<Option<PlaidJwk>, FetchError> {
        self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(self.keys.iter().find(|k| k.kid.as_str() == kid).cloned())
    }
}

static FETCHER: RwLock<Option<Arc<dyn JwkFetcher>>> = RwLock::new(None);

/// Installs the process's key fetcher (the intake's reqwest-based one).
pub fn set_fetcher(fetcher: Arc<dyn JwkFetcher>) {
    // A poisoned lock only means a writer panicked mid-assignment of an Option; the value
    // is still a valid Option, so take it over rather than fail.
    *FETCHER.write().unwrap_or_else(|e| e.into_inner()) = Some(fetcher);
}

fn installed_fetcher() -> Option<Arc<dyn JwkFetcher>> {
    FETCHER.read().unwrap_or_else(|e| e.into_inner()).clone()
}

#[derive(Default)]
struct CacheState {
    known: HashMap<(String, String), PlaidJwk>,
    /// (env, kid) → time until which the kid is answered "unknown".
    negative: HashMap<(String, String), f64>,
    /// env → time of the last fetch started.
    last_fetch_at: HashMap<String, f64>,
}

/// Known and unknown kids, and the per-environment fetch guard. One is shared by the whole
/// process ([`KeyCache::shared`]); tests make their own.
#[derive(Default)]
pub struct KeyCache {
    state: Mutex<CacheState>,
}

impl KeyCache {
    pub fn new() -> Self {
        KeyCache::default()
    }

    /// The process-wide cache every Plaid source built by `build` uses.
    pub fn shared() -> Arc<KeyCache> {
        static SHARED: OnceLock<Arc<KeyCache>> = OnceLock::new();
        SHARED.get_or_init(|| Arc::new(KeyCache::new())).clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CacheState> {
        // The state is maps of plain values; a panic elsewhere cannot leave them half-built.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The key for (env, kid): from the cache, or from `fetch` when the guards allow one.
    /// `Ok(None)`: unknown, negative-cached, or the environment's fetch budget is spent.
    pub fn get(
        &self,
        env: &str,
        kid: &str,
        now: f64,
        fetch: impl FnOnce() -> Result<Option<PlaidJwk>, SourceError>,
    ) -> Result<Option<PlaidJwk>, SourceError> {
        let id = (env.to_string(), kid.to_string());
        {
            let mut s = self.lock();
            if let Some(k) = s.known.get(&id) {
                return Ok(Some(k.clone()));
            }
            if s.negative.get(&id).is_some_and(|until| *until > now) {
                return Ok(None);
            }
            if s.last_fetch_at
                .get(env)
                .is_some_and(|at| now - *at < FETCH_INTERVAL_S)
            {
                return Ok(None);
            }
            // Claim this minute's fetch before unlocking, so concurrent requests cannot all
            // pass the guard while the first fetch is in flight.
            s.last_fetch_at.insert(env.to_string(), now);
        }
        let fetched = fetch()?;
        let mut s = self.lock();
        match fetched {
            Some(k) if k.kid.as_str() == kid => {
                if s.known.len() >= KNOWN_KEYS_MAX {
                    s.known.clear(); // keys are re-fetchable; a full cache starts over
                }
                s.known.insert(id, k.clone());
                Ok(Some(k))
            }
            _ => {
                if s.negative.len() >= NEGATIVE_KIDS_MAX {
                    s.negative.retain(|_, until| *until > now);
                }
                if s.negative.len() < NEGATIVE_KIDS_MAX {
                    s.negative.insert(id, now + NEGATIVE_TTL_S);
                }
                Ok(None)
            }
        }
    }
}

pub struct Plaid {
    declared: Declared,
    env: String,
    cache: Arc<KeyCache>,
    /// `None`: use the process's installed fetcher.
    fetcher: Option<Arc<dyn JwkFetcher>>,
}

impl Plaid {
    pub fn build(name: &str, mut o: Opts<'_>) -> Result<Self, SourceConfigError> {
        let env = o
            .string("env", "\"production\"")?
            .unwrap_or_else(|| "production".to_string());
        if !ENVS.contains(&env.as_str()) {
            return Err(invalid(
                "env",
                format!(
                    "\"{env}\" is not a Plaid environment; write env = \"production\" (or \"sandbox\", \"development\")"
                ),
            ));
        }
        o.finish()?;
        Ok(Plaid::with_parts(name, &env, KeyCache::shared(), None))
    }

    /// A Plaid source with its own cache and fetcher (tests, the kit, `source test`).
    pub fn with_parts(
        name: &str,
        env: &str,
        cache: Arc<KeyCache>,
        fetcher: Option<Arc<dyn JwkFetcher>>,
    ) -> Self {
        Plaid {
            declared: Declared {
                secrets: &[SECRET_CLIENT_ID, SECRET_SECRET],
                auth_headers: names(&[VERIFICATION_HEADER]),
                span: "sync",
                sender_retries: true,
                fetches_keys: true,
                ..Declared::builtin(name, "plaid")
            },
            env: env.to_string(),
            cache,
            fetcher,
        }
    }

    fn fetch(
        &self,
        kid: &str,
        secrets: &dyn SecretSource,
    ) -> Result<Option<PlaidJwk>, SourceError> {
        let fetcher = self
            .fetcher
            .clone()
            .or_else(installed_fetcher)
            .ok_or(FetchError::NoFetcher)?;
        // The fetch authenticates us to Plaid; the newest candidate is the one to use, and the
        // once-a-minute guard leaves no room for trying the others.
        let first = |name: &str| -> Result<Vec<u8>, SourceError> {
            need_candidates(secrets, name)?
                .into_iter()
                .find(|v| !v.is_empty())
                .ok_or_else(|| {
                    SecretError::Empty {
                        name: name.to_string(),
                    }
                    .into()
                })
        };
        let (client_id, secret) = (first(SECRET_CLIENT_ID)?, first(SECRET_SECRET)?);
        Ok(fetcher.fetch(&self.env, kid, &client_id, &secret)?)
    }
}

fn key_usable(k: &PlaidJwk, now: f64) -> bool {
    k.kty.as_str() == "EC"
        && k.crv.as_str() == "P-256"
        && (k.alg.is_empty() || k.alg.as_str() == "ES256")
        && k.expired_at.is_none_or(|t| (t as f64) > now)
}

fn webhook_type(payload: &Value) -> String {
    let t = payload
        .get("webhook_type")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let c = payload
        .get("webhook_code")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if c.is_empty() {
        t.to_string()
    } else {
        format!("{t}.{c}")
    }
}

impl Source for Plaid {
    fn declared(&self) -> &Declared {
        &self.declared
    }

    fn payload_is_body(&self, req: &Request) -> bool {
        super::body_is_payload(req)
    }

    fn verify(&self, req: &Request, secrets: &dyn SecretSource) -> Result<bool, SourceError> {
        let Some(jws) = req.header(VERIFICATION_HEADER) else {
            return Ok(false);
        };
        // Structure and alg first: nothing else, least of all the network, sees a request
        // that fails these.
        let Some(kid) = verify::jwt_es256_kid(jws) else {
            return Ok(false);
        };
        if kid.len() > KID_BYTES_MAX || !kid.bytes().all(|b| b.is_ascii_graphic()) {
            return Ok(false);
        }
        let Some(jwk) = self
            .cache
            .get(&self.env, &kid, req.now, || self.fetch(&kid, secrets))?
        else {
            return Ok(false);
        };
        if !key_usable(&jwk, req.now) {
            return Ok(false);
        }
        let Some(claims) = verify::jwt_es256(jws, &jwk.x, &jwk.y) else {
            return Ok(false);
        };
        let Some(iat) = claims.get("iat").and_then(Value::as_i64) else {
            return Ok(false);
        };
        if !verify::within_tolerance(iat, req.now, TOLERANCE_S_DEFAULT) {
            return Ok(false);
        }
        let Some(claimed) = claims.get("request_body_sha256").and_then(Value::as_str) else {
            return Ok(false);
        };
        Ok(verify::sha256_hex_matches(&req.body, claimed))
    }

    fn key(&self, payload: &Value, _req: &Request) -> Result<String, SourceError> {
        Ok(match payload.get("item_id").and_then(Value::as_str) {
            Some(item) if !item.is_empty() => format!("item:{item}"),
            // Item-less webhooks (e.g. link or transfer events) group by type.
            _ => webhook_type(payload),
        })
    }

    fn dedup_id(&self, _payload: &Value, req: &Request) -> Result<Option<String>, SourceError> {
        Ok(Some(verify::sha256_hex(&req.body)))
    }

    fn event_type(&self, payload: &Value, _req: &Request) -> Result<String, SourceError> {
        Ok(webhook_type(payload))
    }

    fn attrs(
        &self,
        payload: &Value,
        _req: &Request,
    ) -> Result<BTreeMap<String, String>, SourceError> {
        let mut a = BTreeMap::from([("event_type".to_string(), webhook_type(payload))]);
        if let Some(t) = payload.get("webhook_type").and_then(Value::as_str) {
            a.insert("webhook_type".to_string(), t.to_string());
        }
        Ok(a)
    }
}
