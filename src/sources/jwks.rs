//! Verification keys published as a JWK Set at an HTTPS URL (Google's
//! `https://www.googleapis.com/oauth2/v3/certs`, or a recipe's `jwks_url`), and the guarded
//! cache every source that names such a URL shares.
//!
//! Owns: when a JWK Set may be fetched and for how long its keys are trusted. A set is
//! fetched on the first request naming a `kid` (after the token's structure and algorithm
//! passed), and again when a request names a `kid` the set does not hold or the set is older
//! than [`REFRESH_AFTER_S`]; at most one fetch per URL per [`FETCH_INTERVAL_S`],
//! process-wide, claimed before the lock is released, so unauthenticated requests with random
//! kids cannot amplify against the key host or tie up intake threads (the rule Plaid's
//! [`KeyCache`](super::plaid::KeyCache) keeps). Keys are used at most [`KEYS_MAX_AGE_S`]
//! after the fetch that brought them (a failed refresh keeps them until then, so a short
//! outage of the key host does not refuse good tokens); past that, a token is refused or,
//! when the fetch itself failed, answered "could not decide" (503: the sender retries).
//! The cache holds at most [`URLS_MAX`] URLs and [`JWKS_KEYS_MAX`] keys per
//! set. `Cache-Control` is not read: the bounds above are the lifetime.
//!
//! Must not: do the fetch itself. The network call (a GET of the URL through the egress
//! policy, its answer capped at [`RESPONSE_BYTES_MAX`]) is behind [`JwksFetcher`], which the
//! intake installs with [`set_fetcher`]; this module parses the answer and decides, and never
//! holds its lock while a fetch runs. Time comes from `Request::now`, so tests drive the
//! guards. Nothing here logs; an error names the failure, never the answer's text.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use serde_json::Value;

use super::plaid::FetchError;
use super::{SourceConfigError, SourceError};

/// The most keys read from one JWK Set, stored as a secret or fetched (a set rotates two
/// or three).
pub const JWKS_KEYS_MAX: usize = 16;

/// Google's published keys for the ID tokens Pub/Sub push sends (OIDC).
pub const GOOGLE_CERTS_URL: &str = "https://www.googleapis.com/oauth2/v3/certs";
/// A set is fetched again on the next request after this long.
pub const REFRESH_AFTER_S: f64 = 3600.0;
/// A key is never used longer than this after the fetch that brought it.
pub const KEYS_MAX_AGE_S: f64 = 6.0 * 3600.0;
/// At most one fetch per URL in this window, process-wide.
pub const FETCH_INTERVAL_S: f64 = 60.0;
/// The most URLs the cache holds (a config names a handful).
pub const URLS_MAX: usize = 64;
/// The most of a key host's answer read (Google's set is about 2 KiB).
pub const RESPONSE_BYTES_MAX: usize = 64 * 1024;
/// The longest URL accepted as `jwks_url`.
pub const URL_BYTES_MAX: usize = 2048;

/// Where a source's keys come from: the URL, and the address blocks the egress policy
/// admits for it beyond the public internet (`jwks_allow_private`: a test's stub on
/// 127.0.0.1, an identity provider on the LAN). Empty: public addresses only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JwksUrl {
    pub url: String,
    pub allow_private: Vec<String>,
}

/// The network half: GET `url` and answer the body (at most [`RESPONSE_BYTES_MAX`]).
/// `allow_private` are CIDR blocks the egress policy admits for this fetch.
pub trait JwksFetcher: Send + Sync {
    fn fetch(&self, url: &str, allow_private: &[String]) -> Result<Vec<u8>, FetchError>;
}

static FETCHER: RwLock<Option<Arc<dyn JwksFetcher>>> = RwLock::new(None);

/// Installs the process's JWK Set fetcher (the intake's reqwest-based one).
pub fn set_fetcher(fetcher: Arc<dyn JwksFetcher>) {
    *FETCHER.write().unwrap_or_else(|e| e.into_inner()) = Some(fetcher);
}

/// The installed fetcher, if any.
pub fn installed_fetcher() -> Option<Arc<dyn JwksFetcher>> {
    FETCHER.read().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Reads `jwks_url` (and `jwks_allow_private`) as a source option's value: an `https://`
/// URL with a host, no credentials and no fragment; `http://` only for an IP-literal host
/// that `jwks_allow_private` admits (a stub on the same machine). `key` is the option's
/// full name for the error (`recipe.jwks_url`, `jwks_url`).
pub fn parse_url(
    key: &str,
    url: &str,
    allow_key: &str,
    allow_private: Vec<String>,
) -> Result<JwksUrl, SourceConfigError> {
    // The key as written where it stands (inside `recipe = { ... }`: its last name).
    let short = key.rsplit('.').next().unwrap_or(key);
    let allow_short = allow_key.rsplit('.').next().unwrap_or(allow_key);
    let bad = |why: &str| SourceConfigError::Invalid {
        key: key.to_string(),
        message: format!(
            "{why}; write {short} = \"https://www.googleapis.com/oauth2/v3/certs\" (the sender's published JWK Set)"
        ),
    };
    if url.len() > URL_BYTES_MAX || url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(bad("is not a URL"));
    }
    let Ok(u) = url::Url::parse(url) else {
        return Err(bad("is not a URL"));
    };
    if !u.username().is_empty() || u.password().is_some() {
        return Err(bad("must not carry credentials"));
    }
    if u.fragment().is_some() {
        return Err(bad("must not have a #fragment"));
    }
    let blocks = allow_private
        .iter()
        .map(|b| parse_cidr(b).ok_or(()))
        .collect::<Result<Vec<_>, ()>>()
        .map_err(|_| SourceConfigError::Invalid {
            key: allow_key.to_string(),
            message: format!(
                "must be a list of address blocks; write {allow_short} = [\"127.0.0.1/32\"]"
            ),
        })?;
    match (u.scheme(), u.host()) {
        ("https", Some(_)) => {}
        ("http", Some(url::Host::Ipv4(ip))) if admitted(&blocks, ip.into()) => {}
        ("http", Some(url::Host::Ipv6(ip))) if admitted(&blocks, ip.into()) => {}
        _ => return Err(bad("must be an https:// URL")),
    }
    Ok(JwksUrl {
        url: url.to_string(),
        allow_private,
    })
}

/// `a.b.c.d/n` or `x::y/n` as (address, prefix length).
fn parse_cidr(s: &str) -> Option<(std::net::IpAddr, u8)> {
    let (addr, len) = s.split_once('/')?;
    let addr: std::net::IpAddr = addr.parse().ok()?;
    let len: u8 = len.parse().ok()?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    (len <= max).then_some((addr, len))
}

fn admitted(blocks: &[(std::net::IpAddr, u8)], ip: std::net::IpAddr) -> bool {
    use std::net::IpAddr;
    blocks.iter().any(|(net, len)| match (net, ip) {
        (IpAddr::V4(n), IpAddr::V4(a)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(*len)).unwrap_or(0);
            u32::from(*n) & mask == u32::from(a) & mask
        }
        (IpAddr::V6(n), IpAddr::V6(a)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(*len)).unwrap_or(0);
            u128::from(*n) & mask == u128::from(a) & mask
        }
        _ => false,
    })
}

/// The keys of a JWK Set document that carry a `kid`, at most [`JWKS_KEYS_MAX`].
pub fn parse_set(body: &[u8]) -> Result<Vec<Value>, FetchError> {
    if body.len() > RESPONSE_BYTES_MAX {
        return Err(FetchError::BadResponse);
    }
    let doc: Value = serde_json::from_slice(body).map_err(|_| FetchError::BadResponse)?;
    let keys = doc
        .get("keys")
        .and_then(Value::as_array)
        .ok_or(FetchError::BadResponse)?;
    Ok(keys
        .iter()
        .filter(|k| k.get("kid").and_then(Value::as_str).is_some())
        .take(JWKS_KEYS_MAX)
        .cloned()
        .collect())
}

struct Set {
    keys: Vec<Value>,
    fetched_at: f64,
}

#[derive(Default)]
struct CacheState {
    sets: HashMap<String, Set>,
    /// url → time of the last fetch started.
    last_fetch_at: HashMap<String, f64>,
}

/// JWK Sets by URL, and the per-URL fetch guard. One is shared by the whole process
/// ([`JwksCache::shared`]); tests make their own.
#[derive(Default)]
pub struct JwksCache {
    state: Mutex<CacheState>,
}

fn find(set: Option<&Set>, kid: &str, now: f64) -> Option<Value> {
    let set = set?;
    if now - set.fetched_at > KEYS_MAX_AGE_S || set.fetched_at - now > KEYS_MAX_AGE_S {
        return None;
    }
    set.keys
        .iter()
        .find(|k| k.get("kid").and_then(Value::as_str) == Some(kid))
        .cloned()
}

impl JwksCache {
    pub fn new() -> Self {
        JwksCache::default()
    }

    /// The process-wide cache every source naming a JWK Set URL uses.
    pub fn shared() -> Arc<JwksCache> {
        static SHARED: OnceLock<Arc<JwksCache>> = OnceLock::new();
        SHARED.get_or_init(|| Arc::new(JwksCache::new())).clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CacheState> {
        // Plain maps of values: a panic elsewhere cannot leave them half-built.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The JWK for `kid` in the set at `url`: cached, or after a fetch when the guard allows
    /// one. `Ok(None)`: no such key (or the fetch budget for this URL is spent and the cached
    /// set lacks it). `Err`: the fetch failed and no usable cached key answers.
    pub fn key(
        &self,
        url: &str,
        kid: &str,
        now: f64,
        fetch: impl FnOnce() -> Result<Vec<u8>, FetchError>,
    ) -> Result<Option<Value>, SourceError> {
        let cached = {
            let mut s = self.lock();
            let cached = find(s.sets.get(url), kid, now);
            let fresh = s.sets.get(url).is_some_and(|set| {
                now - set.fetched_at < REFRESH_AFTER_S && set.fetched_at <= now + FETCH_INTERVAL_S
            });
            if cached.is_some() && fresh {
                return Ok(cached);
            }
            if s.last_fetch_at
                .get(url)
                .is_some_and(|at| (now - *at).abs() < FETCH_INTERVAL_S)
            {
                return Ok(cached);
            }
            if !s.last_fetch_at.contains_key(url) && s.last_fetch_at.len() >= URLS_MAX {
                s.last_fetch_at.clear();
                s.sets.clear();
            }
            // Claim this window's fetch before unlocking, so concurrent requests cannot all
            // pass the guard while the first fetch is in flight.
            s.last_fetch_at.insert(url.to_string(), now);
            cached
        };
        let keys = match fetch().and_then(|body| parse_set(&body)) {
            Ok(keys) => keys,
            // A failed refresh keeps a key still within its age.
            Err(_) if cached.is_some() => return Ok(cached),
            Err(e) => return Err(e.into()),
        };
        let mut s = self.lock();
        s.sets.insert(
            url.to_string(),
            Set {
                keys,
                fetched_at: now,
            },
        );
        Ok(find(s.sets.get(url), kid, now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    const URL: &str = "https://keys.example.com/certs";

    fn set(kids: &[&str]) -> Vec<u8> {
        let keys: Vec<Value> = kids
            .iter()
            .map(|k| serde_json::json!({"kid": k, "kty": "RSA", "n": "AQAB", "e": "AQAB"}))
            .collect();
        serde_json::json!({ "keys": keys }).to_string().into_bytes()
    }

    #[test]
    fn a_known_kid_is_served_from_the_cache_and_an_unknown_one_refetches_once_a_minute() {
        let c = JwksCache::new();
        let calls = Cell::new(0);
        let fetch = |kids: &'static [&'static str]| {
            let calls = &calls;
            move || {
                calls.set(calls.get() + 1);
                Ok(set(kids))
            }
        };
        assert!(c.key(URL, "a", 1000.0, fetch(&["a"])).unwrap().is_some());
        assert_eq!(calls.get(), 1);
        // Cached: no fetch.
        assert!(c.key(URL, "a", 1010.0, fetch(&["a"])).unwrap().is_some());
        assert_eq!(calls.get(), 1);
        // Unknown kid inside the interval: refused without a fetch.
        assert!(
            c.key(URL, "b", 1020.0, fetch(&["a", "b"]))
                .unwrap()
                .is_none()
        );
        assert_eq!(calls.get(), 1);
        // After the interval: one refetch finds the rotated key.
        assert!(
            c.key(URL, "b", 1061.0, fetch(&["a", "b"]))
                .unwrap()
                .is_some()
        );
        assert_eq!(calls.get(), 2);
        // Random kids cannot make more than one fetch per interval.
        for i in 0..50 {
            let kid = format!("x{i}");
            assert!(
                c.key(URL, &kid, 1062.0 + f64::from(i), fetch(&["a", "b"]))
                    .unwrap()
                    .is_none()
            );
        }
        assert_eq!(calls.get(), 2);
    }

    #[test]
    fn keys_are_refreshed_after_an_hour_and_never_used_past_their_age() {
        let c = JwksCache::new();
        assert!(c.key(URL, "a", 0.0, || Ok(set(&["a"]))).unwrap().is_some());
        // Past REFRESH_AFTER_S the set is fetched again; the new set no longer has "a".
        let t = REFRESH_AFTER_S + 1.0;
        assert!(c.key(URL, "a", t, || Ok(set(&["b"]))).unwrap().is_none());
        // A failed refresh keeps a key inside its age.
        let c = JwksCache::new();
        assert!(c.key(URL, "a", 0.0, || Ok(set(&["a"]))).unwrap().is_some());
        let down = || Err(FetchError::Status { status: 500 });
        assert!(c.key(URL, "a", t, down).unwrap().is_some());
        // Past KEYS_MAX_AGE_S it is not used, and the failure is "could not decide".
        let late = KEYS_MAX_AGE_S + 100.0;
        assert!(matches!(
            c.key(URL, "a", late, down),
            Err(SourceError::KeyFetch(_))
        ));
        // Within the interval after that failed fetch: refused, no key.
        assert!(c.key(URL, "a", late + 1.0, down).unwrap().is_none());
    }

    #[test]
    fn a_malformed_or_oversized_answer_is_a_bad_response() {
        assert_eq!(parse_set(b"not json"), Err(FetchError::BadResponse));
        assert_eq!(parse_set(b"{\"keys\":3}"), Err(FetchError::BadResponse));
        assert_eq!(
            parse_set(&vec![b' '; RESPONSE_BYTES_MAX + 1]),
            Err(FetchError::BadResponse)
        );
        let many: Vec<String> = (0..40).map(|i| format!("k{i}")).collect();
        let refs: Vec<&str> = many.iter().map(String::as_str).collect();
        assert_eq!(parse_set(&set(&refs)).unwrap().len(), JWKS_KEYS_MAX);
    }

    #[test]
    fn jwks_url_must_be_https_unless_a_literal_address_is_admitted() {
        let ok = |u: &str, allow: &[&str]| {
            parse_url(
                "jwks_url",
                u,
                "jwks_allow_private",
                allow.iter().map(|s| s.to_string()).collect(),
            )
        };
        assert!(ok("https://www.googleapis.com/oauth2/v3/certs", &[]).is_ok());
        assert!(ok("http://127.0.0.1:8080/certs", &["127.0.0.1/32"]).is_ok());
        for (u, allow) in [
            ("http://www.googleapis.com/oauth2/v3/certs", &[][..]),
            ("http://127.0.0.1:8080/certs", &[][..]),
            ("http://127.0.0.2:8080/certs", &["127.0.0.1/32"][..]),
            ("https://user:pw@keys.example.com/", &[][..]),
            ("https://keys.example.com/#x", &[][..]),
            ("not a url", &[][..]),
            ("ftp://keys.example.com/", &[][..]),
        ] {
            let e = ok(u, allow).unwrap_err().to_string();
            assert!(
                e.starts_with("jwks_url: ") && e.contains("write jwks_url = "),
                "{u}: {e}"
            );
            assert!(!e.contains("pw"), "{e}");
        }
        let e = ok("https://k.example.com/", &["127.0.0.1"])
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("jwks_allow_private: ") && e.contains("127.0.0.1/32"),
            "{e}"
        );
    }
}

/// RS256 tokens checked against keys fetched by URL, through the template source's recipe
/// (`jwks_url`) and the Gmail source's OIDC mode. The keys are generated here (aws-lc-rs) and
/// the tokens signed with them; the fetcher answers a JWK Set in Google's documented shape.
#[cfg(test)]
mod rs256_tests {
    use super::*;
    use crate::kit::signer::MapSecrets;
    use crate::sources::opts::Opts;
    use crate::sources::{Request, Source};
    use aws_lc_rs::signature::KeyPair as _;
    use base64::Engine as _;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct SetFetcher {
        body: Vec<u8>,
        calls: AtomicUsize,
    }

    impl JwksFetcher for SetFetcher {
        fn fetch(&self, url: &str, _allow: &[String]) -> Result<Vec<u8>, FetchError> {
            assert!(url.starts_with("https://"), "{url}");
            self.calls.fetch_add(1, Ordering::SeqCst);
            Ok(self.body.clone())
        }
    }

    fn b64url(b: &[u8]) -> String {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
    }

    struct Signer {
        kp: aws_lc_rs::rsa::KeyPair,
        kid: String,
    }

    impl Signer {
        fn new(kid: &str) -> Signer {
            Signer {
                kp: aws_lc_rs::rsa::KeyPair::generate(aws_lc_rs::rsa::KeySize::Rsa2048).unwrap(),
                kid: kid.to_string(),
            }
        }
        fn jwk(&self) -> Value {
            let pk = self.kp.public_key();
            serde_json::json!({
                "kty": "RSA", "alg": "RS256", "use": "sig", "kid": self.kid,
                "n": b64url(pk.modulus().big_endian_without_leading_zero()),
                "e": b64url(pk.exponent().big_endian_without_leading_zero()),
            })
        }
        fn token(&self, claims: &Value) -> String {
            let head = serde_json::json!({"alg": "RS256", "kid": self.kid, "typ": "JWT"});
            let input = format!(
                "{}.{}",
                b64url(head.to_string().as_bytes()),
                b64url(claims.to_string().as_bytes())
            );
            let mut sig = vec![0u8; self.kp.public_modulus_len()];
            self.kp
                .sign(
                    &aws_lc_rs::signature::RSA_PKCS1_SHA256,
                    &aws_lc_rs::rand::SystemRandom::new(),
                    input.as_bytes(),
                    &mut sig,
                )
                .unwrap();
            format!("{input}.{}", b64url(&sig))
        }
    }

    const AUD: &str = "https://hooks.example.org/hooks/gmail";
    const SA: &str = "push@my-project.iam.gserviceaccount.com";
    const NOW: f64 = 1_700_000_000.0;

    fn claims() -> Value {
        serde_json::json!({
            "iss": "https://accounts.google.com", "aud": AUD, "azp": "1234",
            "email": SA, "email_verified": true, "sub": "1234",
            "iat": NOW as i64 - 10, "exp": NOW as i64 + 3590,
        })
    }

    fn gmail(opts: &str, fetcher: Arc<SetFetcher>) -> crate::sources::gmail::Gmail {
        let t: toml::Table = opts.parse().unwrap();
        crate::sources::gmail::Gmail::build("gm", Opts::new("gmail", &t))
            .unwrap()
            .with_jwks(Arc::new(JwksCache::new()), fetcher)
    }

    fn push(token: Option<&str>) -> Request {
        let r = Request::new("POST", "/hooks/gm", NOW)
            .with_query("token", "tok")
            .with_body(
                br#"{"message":{"data":"e30=","messageId":"1"},"subscription":"s"}"#.to_vec(),
            );
        match token {
            Some(t) => r.with_header("Authorization", &format!("Bearer {t}")),
            None => r,
        }
    }

    #[test]
    fn gmail_oidc_accepts_googles_token_and_refuses_every_broken_one() {
        let good = Signer::new("k1");
        let other = Signer::new("k2"); // not in the set
        let set = serde_json::json!({"keys": [Signer::new("k0").jwk(), good.jwk()]});
        let f = Arc::new(SetFetcher {
            body: set.to_string().into_bytes(),
            calls: AtomicUsize::new(0),
        });
        let s = gmail(
            &format!("audience = \"{AUD}\"\nservice_account = \"{SA}\""),
            f.clone(),
        );
        let secrets = MapSecrets::new().with("push_token", b"tok");
        let ok = |r: &Request| s.verify(r, &secrets).unwrap();
        assert!(ok(&push(Some(&good.token(&claims())))));
        // The other issuer spelling is Google's too.
        let mut c = claims();
        c["iss"] = "accounts.google.com".into();
        assert!(ok(&push(Some(&good.token(&c)))));
        let with = |k: &str, v: Value| {
            let mut c = claims();
            c[k] = v;
            good.token(&c)
        };
        assert!(
            !ok(&push(Some(&with(
                "aud",
                "https://elsewhere.example/".into()
            )))),
            "aud"
        );
        assert!(
            !ok(&push(Some(&with("iss", "https://evil.example".into())))),
            "iss"
        );
        assert!(
            !ok(&push(Some(&with("exp", (NOW as i64 - 1).into())))),
            "expired"
        );
        assert!(
            !ok(&push(Some(&with("iat", (NOW as i64 + 600).into())))),
            "iat ahead"
        );
        assert!(
            !ok(&push(Some(&with("email", "x@example.com".into())))),
            "email"
        );
        assert!(
            !ok(&push(Some(&with("email_verified", false.into())))),
            "email_verified"
        );
        let mut t = good.token(&claims());
        let last = t.pop().unwrap();
        t.push(if last == 'A' { 'B' } else { 'A' });
        assert!(!ok(&push(Some(&t))), "tampered signature");
        assert!(!ok(&push(Some(&other.token(&claims())))), "unknown kid");
        assert!(!ok(&push(None)), "no token");
        // The query token still counts, and without it nothing is fetched.
        let before = f.calls.load(Ordering::SeqCst);
        let mut r = push(Some(&good.token(&claims())));
        r.query.clear();
        assert!(!ok(&r));
        assert_eq!(f.calls.load(Ordering::SeqCst), before);
        // One fetch for the set; the unknown kid's refetch is held by the minute's guard.
        assert_eq!(before, 1);
    }

    #[test]
    fn gmail_oidc_options_are_checked() {
        let refusal = |o: &str| {
            let t: toml::Table = o.parse().unwrap();
            crate::sources::gmail::Gmail::build("gm", Opts::new("gmail", &t))
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        assert!(refusal("service_account = \"a@b.c\"").starts_with("service_account: only used"));
        assert!(refusal("audience = \"\"").starts_with("audience: "));
        assert!(
            refusal(&format!(
                "audience = \"{AUD}\"\nservice_account = \"nobody\""
            ))
            .starts_with("service_account: ")
        );
        let e = refusal(&format!(
            "audience = \"{AUD}\"\njwks_url = \"http://www.googleapis.com/oauth2/v3/certs\""
        ));
        assert!(
            e.starts_with("jwks_url: must be an https:// URL; write jwks_url = "),
            "{e}"
        );
    }

    #[test]
    fn a_template_recipe_verifies_rs256_with_keys_from_its_jwks_url() {
        let good = Signer::new("k1");
        let set = serde_json::json!({"keys": [good.jwk()]});
        let f = Arc::new(SetFetcher {
            body: set.to_string().into_bytes(),
            calls: AtomicUsize::new(0),
        });
        let opts = format!(
            "recipe = {{ algorithm = \"jws-rs256\", header = \"Authorization\", prefix = \"Bearer \", jwks_url = \"https://idp.example.com/jwks\", issuer = \"https://idp.example.com\", audience = \"{AUD}\", body_claim = \"sha256\" }}\nkey = \"payload.id\""
        );
        let t: toml::Table = opts.parse().unwrap();
        let s = crate::sources::template::Template::build("tpl", Opts::new("template", &t))
            .unwrap()
            .with_jwks(Arc::new(JwksCache::new()), f.clone());
        assert!(s.declared().secrets.is_empty() && s.declared().fetches_keys);
        let body = br#"{"id":"evt_1"}"#;
        let c = serde_json::json!({
            "iss": "https://idp.example.com", "aud": [AUD, "x"], "exp": NOW as i64 + 60,
            "sha256": crate::sources::verify::sha256_hex(body),
        });
        let req = |tok: &str, body: &[u8]| {
            Request::new("POST", "/hooks/tpl", NOW)
                .with_header("Authorization", &format!("Bearer {tok}"))
                .with_body(body.to_vec())
        };
        let none = MapSecrets::new();
        assert!(s.verify(&req(&good.token(&c), body), &none).unwrap());
        assert!(
            !s.verify(&req(&good.token(&c), br#"{"id":"evt_2"}"#), &none)
                .unwrap()
        );
        // An HS256 token keyed with the public modulus is refused before any key use.
        let hs = format!(
            "{}.{}.x",
            b64url(br#"{"alg":"HS256","kid":"k1"}"#),
            b64url(c.to_string().as_bytes())
        );
        assert!(!s.verify(&req(&hs, body), &none).unwrap());
        assert_eq!(f.calls.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn recipe_jwks_keys_are_refused_where_they_do_not_fit() {
        let refusal = |r: &str| {
            let t: toml::Table = format!("recipe = {{ {r} }}\nkey = \"payload.id\"")
                .parse()
                .unwrap();
            crate::sources::template::Template::build("tpl", Opts::new("template", &t))
                .err()
                .map(|e| e.to_string())
                .unwrap_or_else(|| "accepted".into())
        };
        let base = "header = \"Authorization\", prefix = \"Bearer \"";
        let e = refusal(&format!(
            "algorithm = \"hmac-sha256\", signed = [\"body\"], encoding = \"hex\", {base}, jwks_url = \"https://k.example.com/\""
        ));
        assert!(
            e.starts_with("recipe.jwks_url: ") && e.contains("jws-rs256"),
            "{e}"
        );
        let e = refusal(&format!(
            "algorithm = \"jws-rs256\", {base}, jwks_url = \"https://k.example.com/\", key = \"jwks\", audience = \"a\""
        ));
        assert!(e.starts_with("recipe.key: "), "{e}");
        let e = refusal(&format!(
            "algorithm = \"jws-rs256\", {base}, jwks_url = \"https://k.example.com/\""
        ));
        assert!(
            e.starts_with("recipe.body_claim: ") && e.contains("audience"),
            "{e}"
        );
        let e = refusal(&format!(
            "algorithm = \"jws-rs256\", {base}, audience = \"a\""
        ));
        assert!(
            e.starts_with("recipe.key: ") && e.contains("jwks_url"),
            "{e}"
        );
        let e = refusal(&format!(
            "algorithm = \"jws-rs256\", {base}, audience = \"a\", jwks_url = \"http://k.example.com/\""
        ));
        assert!(
            e.starts_with("recipe.jwks_url: must be an https:// URL"),
            "{e}"
        );
        let e = refusal(&format!(
            "algorithm = \"jws-es256\", key = \"jwk\", {base}, body_claim = \"s\", jwks_allow_private = [\"127.0.0.1/32\"]"
        ));
        assert!(e.starts_with("recipe.jwks_allow_private: "), "{e}");
        assert_eq!(
            refusal(&format!(
                "algorithm = \"jws-es256\", {base}, body_claim = \"s\", jwks_url = \"https://k.example.com/\""
            )),
            "accepted"
        );
    }
}
