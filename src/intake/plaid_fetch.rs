//! Plaid's verification-key fetch over the network: `POST
//! https://{production,sandbox,development}.plaid.com/webhook_verification_key/get` with
//! client_id, secret and key_id, installed into the sources module with
//! `sources::plaid::set_fetcher` (which owns when a fetch may happen).
//!
//! Must not: be called on an async worker thread (it blocks on the runtime handle; the
//! intake runs Plaid sources on the blocking pool), follow redirects, or log or return the
//! credentials or the response body.

use std::time::Duration;

use serde::Deserialize;

use crate::sources::{FetchError, JwkFetcher, PlaidJwk};

/// One key fetch, connect to last byte.
pub const FETCH_TIMEOUT_S: u64 = 10;
/// The most of Plaid's answer read.
pub const RESPONSE_BYTES_MAX: usize = 64 * 1024;

/// The reqwest-based fetcher.
pub struct ReqwestJwkFetcher {
    client: reqwest::Client,
    /// Where the key endpoint lives: `https://{env}.plaid.com`, or, in a build with the
    /// `failpoints` test feature only, the plain-http stub named by
    /// `HOOKSPOOL_TEST_PLAID_BASE_URL` (so tests can drive the real binary's fetch).
    test_base: Option<String>,
}

/// The stub base URL for tests, honoured only in builds with the `failpoints` feature.
fn test_base() -> Option<String> {
    #[cfg(feature = "failpoints")]
    {
        std::env::var("HOOKSPOOL_TEST_PLAID_BASE_URL")
            .ok()
            .filter(|v| !v.is_empty())
    }
    #[cfg(not(feature = "failpoints"))]
    {
        None
    }
}

#[derive(Deserialize)]
struct KeyAnswer {
    key: PlaidJwk,
}

#[derive(Deserialize)]
struct ErrorAnswer {
    #[serde(default)]
    error_code: String,
}

fn plaid_base(env: &str) -> String {
    format!("https://{env}.plaid.com")
}

impl ReqwestJwkFetcher {
    pub fn new() -> Result<Self, FetchError> {
        let test_base = test_base();
        // The egress policy (issue 35): Plaid's hosts are public; only a test build's stub
        // base may be on loopback.
        let policy = crate::egress::Policy::new(if test_base.is_some() {
            crate::egress::loopback_only()
        } else {
            crate::egress::Allow::None
        });
        let client = crate::egress::client_builder(
            &policy,
            std::sync::Arc::new(crate::egress::SystemLookup),
        )
        .https_only(test_base.is_none())
        .timeout(Duration::from_secs(FETCH_TIMEOUT_S))
        .build()
        .map_err(|e| FetchError::Transport {
            reason: e.without_url().to_string(),
        })?;
        Ok(ReqwestJwkFetcher { client, test_base })
    }

    async fn fetch_async(
        &self,
        env: &str,
        kid: &str,
        client_id: &[u8],
        secret: &[u8],
    ) -> Result<Option<PlaidJwk>, FetchError> {
        let body = serde_json::json!({
            "client_id": String::from_utf8_lossy(client_id),
            "secret": String::from_utf8_lossy(secret),
            "key_id": kid,
        });
        let base = self.test_base.clone().unwrap_or_else(|| plaid_base(env));
        let url = format!("{base}/webhook_verification_key/get");
        let transport = |e: reqwest::Error| FetchError::Transport {
            reason: e.without_url().to_string(),
        };
        let resp = self
            .client
            .post(url)
            .json(&body)
            .send()
            .await
            .map_err(transport)?;
        let status = resp.status().as_u16();
        let bytes = resp.bytes().await.map_err(transport)?;
        if bytes.len() > RESPONSE_BYTES_MAX {
            return Err(FetchError::BadResponse);
        }
        match status {
            200 => serde_json::from_slice::<KeyAnswer>(&bytes)
                .map(|a| Some(a.key))
                .map_err(|_| FetchError::BadResponse),
            // Plaid answers 400 INVALID_INPUT for a key_id it does not know: that is "no
            // such key" (negative-cached). Bad credentials are a real failure.
            400 => match serde_json::from_slice::<ErrorAnswer>(&bytes) {
                Ok(e) if e.error_code.contains("API_KEYS") || e.error_code.contains("CLIENT") => {
                    Err(FetchError::Status { status })
                }
                _ => Ok(None),
            },
            404 => Ok(None),
            _ => Err(FetchError::Status { status }),
        }
    }
}

impl JwkFetcher for ReqwestJwkFetcher {
    fn fetch(
        &self,
        env: &str,
        kid: &str,
        client_id: &[u8],
        secret: &[u8],
    ) -> Result<Option<PlaidJwk>, FetchError> {
        // On the intake's blocking pool the thread knows its runtime; anywhere else (a CLI
        // `source test`) a small runtime lives for this one fetch.
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            return handle.block_on(self.fetch_async(env, kid, client_id, secret));
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| FetchError::Transport {
                reason: e.to_string(),
            })?;
        rt.block_on(self.fetch_async(env, kid, client_id, secret))
    }
}
