//! `ctx.oauth(secret)` (spec 14.3.7): the OAuth 2 refresh-token flow (RFC 6749 section 6).
//! The credential is a JSON document in a processor secret: `client_id`, `client_secret`,
//! `refresh_token` and optionally `token_uri` (Google's `authorized_user` file has this
//! shape; other keys are ignored). Access tokens are cached in the runtime's state
//! (`runtime.json`), refreshed when they expire or after one 401; a refresh token the
//! endpoint rotates is kept there and used from then on. The credential file is never
//! rewritten. When the file's client or refresh token changes (the operator ran the consent
//! again), the cache is dropped.
//!
//! The token endpoint is written once here; a provider names its endpoint and the only URIs
//! a credential may name ([`TokenEndpoint`]), so a credential cannot send the client secret
//! to another host.
//!
//! Must not: log, return or Debug-print an access token, a refresh token or the client
//! secret.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::ProcessorError;
use super::context::Context;
use super::http::{Body, HttpErrorKind};

/// An access token this close to its expiry is refreshed first (half its lifetime for a
/// token that lives less than twice this, so a short-lived token is still used).
pub const EXPIRY_MARGIN_S: f64 = 60.0;
/// When the endpoint gives no `expires_in`.
const EXPIRES_IN_S_DEFAULT: f64 = 3600.0;

/// A provider's token endpoint.
#[derive(Debug)]
pub struct TokenEndpoint {
    /// Used when the credential names none.
    pub default_uri: &'static str,
    /// The only `token_uri` values a credential may carry.
    pub allowed_uris: &'static [&'static str],
}

#[derive(Deserialize)]
struct Credential {
    client_id: String,
    client_secret: String,
    refresh_token: String,
    #[serde(default)]
    token_uri: Option<String>,
}

/// One secret's cached tokens (in `runtime.json`).
#[derive(Clone, Default, Serialize, Deserialize)]
pub struct TokenCache {
    /// Which credential file content this cache belongs to (a hash, not the token).
    fingerprint: String,
    #[serde(default)]
    access_token: Option<String>,
    /// Unix seconds after which the access token is refreshed before use.
    #[serde(default)]
    refresh_after: f64,
    /// A refresh token the endpoint rotated; used instead of the file's.
    #[serde(default)]
    refresh_token: Option<String>,
}

impl std::fmt::Debug for TokenCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenCache")
            .field("refresh_after", &self.refresh_after)
            .field("rotated", &self.refresh_token.is_some())
            .finish_non_exhaustive()
    }
}

/// The flow for one credential.
pub struct OAuth {
    secret: String,
    credential: Credential,
    token_uri: &'static str,
    fingerprint: String,
}

impl std::fmt::Debug for OAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OAuth")
            .field("secret", &self.secret)
            .finish_non_exhaustive()
    }
}

fn fingerprint(c: &Credential) -> String {
    let mut h = Sha256::new();
    h.update(c.client_id.as_bytes());
    h.update(b"\n");
    h.update(c.refresh_token.as_bytes());
    hex::encode(&h.finalize()[..16])
}

impl OAuth {
    pub(crate) fn new(
        ctx: &Context,
        secret: &str,
        endpoint: &'static TokenEndpoint,
    ) -> Result<OAuth, ProcessorError> {
        let value = ctx.secret(secret)?;
        let credential: Credential = serde_json::from_slice(value.expose()).map_err(|_| {
            ProcessorError::config(format!(
                "secret {secret} is not an OAuth credential (JSON with client_id, client_secret, refresh_token)"
            ))
        })?;
        let token_uri = match credential.token_uri.as_deref() {
            None => endpoint.default_uri,
            Some(uri) => endpoint
                .allowed_uris
                .iter()
                .copied()
                .find(|allowed| *allowed == uri)
                .ok_or_else(|| {
                    ProcessorError::config(format!(
                        "secret {secret}: token_uri is not the provider's token endpoint"
                    ))
                })?,
        };
        let fingerprint = fingerprint(&credential);
        Ok(OAuth {
            secret: secret.to_string(),
            credential,
            token_uri,
            fingerprint,
        })
    }

    fn cache<'a>(&self, ctx: &'a Context) -> Option<&'a TokenCache> {
        ctx.runtime
            .token(&self.secret)
            .filter(|c| c.fingerprint == self.fingerprint)
    }

    /// A valid access token: the cached one, or a fresh one from the token endpoint.
    pub async fn bearer(&self, ctx: &mut Context) -> Result<String, ProcessorError> {
        let now = ctx.now();
        if let Some(token) = self
            .cache(ctx)
            .filter(|c| c.refresh_after > now)
            .and_then(|c| c.access_token.clone())
        {
            return Ok(token);
        }
        self.refresh(ctx).await
    }

    /// `ctx.http().get_text` with this credential's bearer (spec 14.4: `get_text` on
    /// `ctx.oauth(name)`): a 304 is an answer; one 401 forgets the cached token and tries
    /// once more with a fresh one; anything else is the shared status mapping.
    pub async fn get_text(
        &self,
        ctx: &mut Context,
        url: &str,
        r: &super::http::TextRequest<'_>,
    ) -> Result<super::http::TextAnswer, ProcessorError> {
        let mut refreshed = false;
        loop {
            let token = self.bearer(ctx).await?;
            let mut with = r.clone();
            with.bearer = Some(&token);
            match ctx.http().get_text(url, &with).await {
                Ok(a) => return Ok(a),
                Err(e) if e.status == Some(401) && !refreshed => {
                    refreshed = true;
                    self.invalidate(ctx)?;
                }
                Err(e) => return Err(e.into_error()),
            }
        }
    }

    /// The API answered 401 to the cached token: forget it, so `bearer` refreshes.
    pub fn invalidate(&self, ctx: &mut Context) -> Result<(), ProcessorError> {
        let Some(mut cache) = self.cache(ctx).cloned() else {
            return Ok(());
        };
        cache.access_token = None;
        ctx.runtime.set_token(&self.secret, cache)
    }

    async fn refresh(&self, ctx: &mut Context) -> Result<String, ProcessorError> {
        let previous = self.cache(ctx).cloned().unwrap_or_default();
        let refresh_token = previous
            .refresh_token
            .clone()
            .unwrap_or_else(|| self.credential.refresh_token.clone());
        let form = [
            ("grant_type", "refresh_token"),
            ("client_id", self.credential.client_id.as_str()),
            ("client_secret", self.credential.client_secret.as_str()),
            ("refresh_token", refresh_token.as_str()),
        ];
        let answer = ctx
            .http()
            .post(self.token_uri, None, Body::Form(&form))
            .await
            .map_err(|e| token_error(&self.secret, e))?;
        let access_token = answer
            .get("access_token")
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| {
                ProcessorError::retryable("OAuth token endpoint answered without an access_token")
            })?
            .to_string();
        let expires_in = answer
            .get("expires_in")
            .and_then(Value::as_f64)
            .filter(|s| *s > 0.0)
            .unwrap_or(EXPIRES_IN_S_DEFAULT);
        let rotated = answer
            .get("refresh_token")
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty() && *t != refresh_token)
            .map(str::to_string);
        if rotated.is_some() {
            ctx.log(&format!(
                "oauth: the token endpoint rotated the refresh token of {}; keeping the new one in runtime state",
                self.secret
            ));
        }
        let cache = TokenCache {
            fingerprint: self.fingerprint.clone(),
            access_token: Some(access_token.clone()),
            refresh_after: ctx.now() + expires_in - EXPIRY_MARGIN_S.min(expires_in / 2.0),
            refresh_token: rotated.or(previous.refresh_token),
        };
        ctx.runtime.set_token(&self.secret, cache)?;
        ctx.log(&format!(
            "oauth: access token refreshed for {}",
            self.secret
        ));
        Ok(access_token)
    }
}

/// The token endpoint's answers (RFC 6749 section 5.2): `invalid_grant` means the refresh
/// token was revoked or expired and `invalid_client` that the client is wrong, both a
/// person's to fix; throttling, 5xx and transport failures are Retryable.
fn token_error(secret: &str, e: super::http::HttpError) -> ProcessorError {
    if e.kind != HttpErrorKind::Status || matches!(e.status, Some(s) if s == 429 || s >= 500) {
        let mut err = e.into_error();
        err.reason = format!("OAuth token endpoint: {}", err.reason).into();
        return err;
    }
    let code = e
        .body_json()
        .and_then(|b| b.get("error").and_then(Value::as_str).map(str::to_string));
    match code.as_deref() {
        Some("invalid_grant") => ProcessorError::config(format!(
            "OAuth refresh token of {secret} refused (invalid_grant): run the consent again and replace the credential file"
        )),
        Some("invalid_client" | "unauthorized_client") => ProcessorError::config(format!(
            "OAuth client of {secret} refused ({}): check client_id and client_secret",
            code.as_deref().unwrap_or_default()
        )),
        _ => ProcessorError::config(format!(
            "OAuth token endpoint refused the request ({})",
            e.status.unwrap_or(0)
        )),
    }
}
