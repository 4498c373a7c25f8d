//! The network half of a JWK Set lookup (`sources::jwks`): a GET of the set's URL (Google's
//! `https://www.googleapis.com/oauth2/v3/certs`, a recipe's `jwks_url`) through the egress
//! policy, installed with `sources::jwks::set_fetcher` (the sources module owns when a fetch
//! may happen, at most one per URL a minute).
//!
//! Must not: be called on an async worker thread (it blocks on the runtime handle; the
//! intake runs source code on the blocking pool), follow redirects, use a proxy from the
//! environment, connect to an address the policy refuses (loopback, private, ... unless the
//! source's `jwks_allow_private` admits it), or log or return the URL or the answer's body.

use std::time::Duration;

use crate::egress::{Allow, Cidr, Policy};
use crate::sources::jwks::{JwksFetcher, RESPONSE_BYTES_MAX};
use crate::sources::plaid::FetchError;

/// One fetch, connect to last byte.
pub const FETCH_TIMEOUT_S: u64 = 10;

/// The reqwest-based fetcher.
#[derive(Default)]
pub struct ReqwestJwksFetcher;

fn transport(e: reqwest::Error) -> FetchError {
    FetchError::Transport {
        reason: e.without_url().to_string(),
    }
}

impl ReqwestJwksFetcher {
    async fn fetch_async(
        &self,
        url: &str,
        allow_private: &[String],
    ) -> Result<Vec<u8>, FetchError> {
        let blocks = allow_private
            .iter()
            .map(|b| b.parse::<Cidr>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| FetchError::Transport {
                reason: "jwks_allow_private is not a list of address blocks".to_string(),
            })?;
        let policy = Policy::new(if blocks.is_empty() {
            Allow::None
        } else {
            Allow::Blocks(blocks)
        });
        let parsed = url::Url::parse(url).map_err(|_| FetchError::Transport {
            reason: "the JWK Set URL does not parse".to_string(),
        })?;
        policy
            .admit_url(&parsed)
            .map_err(|r| FetchError::Transport {
                reason: r.to_string(),
            })?;
        let client = crate::egress::client_builder(
            &policy,
            std::sync::Arc::new(crate::egress::SystemLookup),
        )
        // Config admits http:// only for an IP literal the allow-list admits.
        .https_only(allow_private.is_empty())
        .timeout(Duration::from_secs(FETCH_TIMEOUT_S))
        .build()
        .map_err(transport)?;
        let mut resp = client
            .get(parsed)
            .header("Accept", "application/json")
            .send()
            .await
            .map_err(transport)?;
        let status = resp.status().as_u16();
        if status != 200 {
            return Err(FetchError::Status { status });
        }
        let mut body = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(transport)? {
            if body.len() + chunk.len() > RESPONSE_BYTES_MAX {
                return Err(FetchError::BadResponse);
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }
}

impl JwksFetcher for ReqwestJwksFetcher {
    fn fetch(&self, url: &str, allow_private: &[String]) -> Result<Vec<u8>, FetchError> {
        // On the intake's blocking pool the thread knows its runtime; anywhere else (a CLI
        // `source test`) a small runtime lives for this one fetch.
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            return handle.block_on(self.fetch_async(url, allow_private));
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| FetchError::Transport {
                reason: e.to_string(),
            })?;
        rt.block_on(self.fetch_async(url, allow_private))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without `jwks_allow_private`, a key URL on loopback or a private address is refused
    /// by the egress policy before any connection (the reason names the rule), and an
    /// admitted block does not admit another address.
    #[test]
    fn a_private_key_url_is_refused_unless_admitted() {
        let f = ReqwestJwksFetcher;
        for (url, allow) in [
            ("https://127.0.0.1:9/oauth2/v3/certs", vec![]),
            ("https://10.1.2.3:9/certs", vec![]),
            ("https://[::1]:9/certs", vec![]),
            ("http://127.0.0.2:9/certs", vec!["127.0.0.1/32".to_string()]),
        ] {
            match f.fetch(url, &allow) {
                Err(FetchError::Transport { reason }) => {
                    assert!(reason.starts_with("egress refused"), "{url}: {reason}");
                    assert!(!reason.contains("certs"), "{reason}");
                }
                other => panic!("{url}: {other:?}"),
            }
        }
    }
}
