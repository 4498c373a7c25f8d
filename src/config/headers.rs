//! Which request headers are stored (spec 3, 9, 10; issue 17): a normal event keeps the
//! source type's `keep_headers` plus the configured ones; a quarantined request keeps every
//! header but the source's auth headers. Neither ever keeps a credential: the one list
//! [`CREDENTIAL_HEADERS`] applies whatever a source declares, and `check` refuses a
//! credential header in `keep_headers` with what to write instead.
//!
//! Why a list and not only `auth_headers`: a source declares the header its own scheme
//! verifies, but the proxy or the sender may add others (a bearer token, a session cookie, an
//! API key) that a quarantined request stored in clear text and `hookspool export` printed.
//!
//! Must not: read a file, a secret or the clock.

use crate::sources::{Request, Source};

/// Header names that carry a credential, lower case, `*` matching any run of characters:
/// any name holding one of these words is one (issue 28: a list of names missed
/// `Authentication:`, which some vendors send). Examples they cover: Authorization,
/// Authentication, Proxy-Authorization, X-Auth-Token, Cookie, Set-Cookie, X-Api-Key, Api-Key,
/// X-ApiKey, X-Access-Key, Private-Key, X-Session-Id, X-Gitlab-Token, X-Goog-Channel-Token,
/// X-Webhook-Secret, X-Hub-Signature-256, Webhook-Signature, X-Signature-Ed25519,
/// X-Shopify-Hmac-Sha256, X-Password, X-Amz-Credential. A harmless header that holds one of
/// the words (Idempotency-Key) is not stored either: losing it costs a replay nothing, since
/// the event's payload, key and attrs are what a route or a replay reads.
pub const CREDENTIAL_HEADERS: &[&str] = &[
    "*auth*",
    "*token*",
    "*secret*",
    "*key*",
    "*password*",
    "*passwd*",
    "*session*",
    "*cookie*",
    "*signature*",
    "*hmac*",
    "*credential*",
];

/// True when `name` (any case) is a credential header, which is never stored.
pub fn is_credential_header(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    CREDENTIAL_HEADERS.iter().any(|p| glob(p, &name))
}

/// `*` matches any run of characters (possibly empty); everything else matches itself.
fn glob(pattern: &str, name: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    let (first, rest) = match parts.split_first() {
        Some(x) => x,
        None => return name.is_empty(),
    };
    let Some(mut tail) = name.strip_prefix(first) else {
        return false;
    };
    let Some((last, middle)) = rest.split_last() else {
        // No `*` at all: the whole name must have matched.
        return tail.is_empty();
    };
    for part in middle {
        match tail.find(part) {
            Some(i) => tail = &tail[i + part.len()..],
            None => return false,
        }
    }
    tail.ends_with(last)
}

/// What a `keep_headers` entry of `[sources.<name>]` may not be: an auth header of the
/// source, or a credential. `None` when it may be kept.
pub fn refused_keep_header(src: &dyn Source, name: &str) -> Option<String> {
    if src
        .declared()
        .auth_headers
        .iter()
        .any(|a| a.eq_ignore_ascii_case(name))
    {
        return Some(format!(
            "{name} is an authentication header of this source and is never stored; remove it from keep_headers"
        ));
    }
    is_credential_header(name).then(|| {
        format!(
            "{name} carries a credential (it matches one of {}) and is never stored; remove it from keep_headers (the event's payload, key and attrs are what a route or a replay reads)",
            CREDENTIAL_HEADERS.join(", ")
        )
    })
}

/// Why a source may not read a credential header in a selector (a template's key, dedup,
/// event_type, attrs or ignore).
pub fn refused_selector_header(name: &str) -> String {
    format!(
        "a selector reads header.{name}, which carries a credential: its value would be stored as the key, dedup id, event type or attrs, and it is never kept for a replay; read the value from the payload (payload.<field>) instead"
    )
}

/// The source type's keep_headers plus the configured ones, never an auth header or a
/// credential, as a JSON object of the values the request carries.
pub fn kept_headers(keep: &[String], src: &dyn Source, req: &Request) -> String {
    let auth = &src.declared().auth_headers;
    let mut out = serde_json::Map::new();
    for name in src.declared().keep_headers.iter().chain(keep.iter()) {
        if auth.iter().any(|a| a.eq_ignore_ascii_case(name))
            || is_credential_header(name)
            || out.contains_key(name)
        {
            continue;
        }
        if let Some(v) = req.header(name) {
            out.insert(name.clone(), serde_json::Value::String(v.to_string()));
        }
    }
    serde_json::Value::Object(out).to_string()
}

/// A quarantined request's headers (spec 9): every header but the source's auth headers,
/// never a credential, the first value of a repeated name, as a JSON object.
pub fn quarantined_headers(src: &dyn Source, req: &Request) -> String {
    let auth = &src.declared().auth_headers;
    let mut out = serde_json::Map::new();
    for (k, v) in &req.headers {
        if auth.iter().any(|a| a.eq_ignore_ascii_case(k))
            || is_credential_header(k)
            || out.contains_key(k)
        {
            continue;
        }
        out.insert(k.clone(), serde_json::Value::String(v.clone()));
    }
    serde_json::Value::Object(out).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_credential_list_covers_the_usual_names_and_spares_the_kept_ones() {
        for h in [
            "Authorization",
            "proxy-authorization",
            "Cookie",
            "Set-Cookie",
            "X-Api-Key",
            "api-key",
            "X-ApiKey",
            "X-Auth-Token",
            "X-Gitlab-Token",
            "X-Goog-Channel-Token",
            "X-Webhook-Secret",
            "X-Hub-Signature",
            "X-Hub-Signature-256",
            "Webhook-Signature",
            "X-Signature-Ed25519",
            "X-Shopify-Hmac-Sha256",
            "X-Password",
            "X-Amz-Credential",
            "Authentication",
            "X-Access-Key",
            "Private-Key",
            "X-Session-Id",
            "Session",
            "X-Passwd",
            "Idempotency-Key",
        ] {
            assert!(is_credential_header(h), "{h}");
        }
        // The headers the built-in sources keep.
        for h in [
            "X-GitHub-Event",
            "X-GitHub-Delivery",
            "X-Goog-Channel-ID",
            "X-Goog-Message-Number",
            "X-Goog-Resource-State",
            "X-Goog-Resource-ID",
            "X-Slack-Request-Timestamp",
            "X-Slack-Retry-Num",
            "webhook-id",
            "webhook-timestamp",
            "x-zm-request-timestamp",
            "Content-Type",
            "User-Agent",
            "X-Event",
        ] {
            assert!(!is_credential_header(h), "{h}");
        }
    }

    #[test]
    fn glob_matches_prefix_suffix_and_middle() {
        assert!(glob("abc", "abc"));
        assert!(!glob("abc", "abcd"));
        assert!(glob("x-*", "x-"));
        assert!(glob("*-token", "x-auth-token"));
        assert!(!glob("*-token", "x-auth-tokens"));
        assert!(glob("*token*", "token"));
        assert!(glob("a*b*c", "aXbYc"));
        assert!(!glob("a*b*c", "aXcYb"));
        assert!(glob("*", ""));
    }
}
