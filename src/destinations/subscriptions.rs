//! A tolerant reader of Hermes' webhook subscriptions file (`hermes.subscriptions_path`,
//! `~/.hermes/webhook_subscriptions.json`), read fresh on every hermes attempt and by `check`.
//!
//! The shape Hermes writes (`hermes webhook subscribe <name>`) is one JSON object keyed by
//! route name:
//!
//! ```json
//! {"github-ci": {"secret": "…", "prompt": "…", "events": [], "deliver": "log",
//!                "profile": "default", "enabled": true}}
//! ```
//!
//! Accepted as well, because the file has changed hands between versions and tools: a UTF-8
//! BOM; the same map under a top-level `"subscriptions"` or `"routes"` key; and a list of
//! route objects (top level or under those keys) that name themselves with `"name"` or
//! `"route"`. Unknown fields are ignored. Read per route: `secret` (a string), `profile` (a
//! string; `"default"` means none), `enabled` (only an explicit `false` disables),
//! `events` and `coalesce` (for `check`, spec 5).
//!
//! Must not: cache anything between reads, or put the file's contents (secrets) into an error.

use std::path::Path;

use serde_json::Value;

/// A subscriptions file larger than this is refused rather than parsed on every attempt.
pub const SUBSCRIPTIONS_BYTES_MAX: u64 = 4 * 1024 * 1024;

/// What hookspool needs to know about one route.
#[derive(Clone, PartialEq, Eq)]
pub struct RouteEntry {
    pub secret: Option<String>,
    /// The route's profile; `None` for the default profile.
    pub profile: Option<String>,
    pub enabled: bool,
    /// The route sets a non-empty `events` filter.
    pub events: bool,
    /// The route sets Hermes' own `coalesce`.
    pub coalesce: bool,
}

impl std::fmt::Debug for RouteEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouteEntry")
            .field("secret", &self.secret.as_ref().map(|_| "<redacted>"))
            .field("profile", &self.profile)
            .field("enabled", &self.enabled)
            .field("events", &self.events)
            .field("coalesce", &self.coalesce)
            .finish()
    }
}

/// Why the route could not be read. Texts carry the route name and positions, never contents.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubsError {
    #[error(
        "hermes subscriptions file unreadable ({0}): check hermes.subscriptions_path and that \
         the hookspool user may read it"
    )]
    Unreadable(String),
    #[error("hermes subscriptions file is larger than {SUBSCRIPTIONS_BYTES_MAX} bytes")]
    TooLarge,
    #[error("hermes subscriptions file is not valid JSON (line {line}, column {column})")]
    NotJson { line: usize, column: usize },
    #[error("hermes subscriptions file is not a JSON object of routes")]
    Shape,
    #[error(
        "route {0:?} is not in the hermes subscriptions file: create it with \
         `hermes webhook subscribe {0}` or fix the destination name"
    )]
    NoRoute(String),
}

/// Read `path` now and return `route`'s entry.
pub async fn read(path: &Path, route: &str) -> Result<RouteEntry, SubsError> {
    let bytes = read_bounded(path).await?;
    parse(&bytes, route)
}

/// Blocking form for `hookspool check`.
pub fn read_blocking(path: &Path, route: &str) -> Result<RouteEntry, SubsError> {
    use std::io::Read as _;
    let file = std::fs::File::open(path).map_err(|e| SubsError::Unreadable(io_kind(&e)))?;
    let mut bytes = Vec::new();
    file.take(SUBSCRIPTIONS_BYTES_MAX + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| SubsError::Unreadable(io_kind(&e)))?;
    parse(&bytes, route)
}

/// Read at most one byte more than the cap, so a growing or huge file cannot cost memory.
async fn read_bounded(path: &Path) -> Result<Vec<u8>, SubsError> {
    use tokio::io::AsyncReadExt as _;
    let file = tokio::fs::File::open(path)
        .await
        .map_err(|e| SubsError::Unreadable(io_kind(&e)))?;
    let mut bytes = Vec::new();
    file.take(SUBSCRIPTIONS_BYTES_MAX + 1)
        .read_to_end(&mut bytes)
        .await
        .map_err(|e| SubsError::Unreadable(io_kind(&e)))?;
    Ok(bytes)
}

fn io_kind(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => "not found".into(),
        std::io::ErrorKind::PermissionDenied => "permission denied".into(),
        k => format!("{k:?}"),
    }
}

/// Parse the file's bytes and find `route`.
pub fn parse(bytes: &[u8], route: &str) -> Result<RouteEntry, SubsError> {
    if bytes.len() as u64 > SUBSCRIPTIONS_BYTES_MAX {
        return Err(SubsError::TooLarge);
    }
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    let top: Value = serde_json::from_slice(bytes).map_err(|e| SubsError::NotJson {
        line: e.line(),
        column: e.column(),
    })?;
    let found = match &top {
        Value::Object(map) => match map.get(route) {
            Some(Value::Object(o)) => Some(o),
            _ => ["subscriptions", "routes"]
                .iter()
                .find_map(|k| map.get(*k).and_then(|v| find_in(v, route))),
        },
        Value::Array(_) => find_in(&top, route),
        _ => return Err(SubsError::Shape),
    };
    let entry = found.ok_or_else(|| SubsError::NoRoute(route.to_string()))?;
    Ok(RouteEntry {
        secret: entry
            .get("secret")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_owned),
        profile: entry
            .get("profile")
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|p| !p.is_empty() && *p != "default")
            .map(str::to_owned),
        enabled: entry.get("enabled").and_then(Value::as_bool) != Some(false),
        events: entry.get("events").is_some_and(truthy),
        coalesce: entry.get("coalesce").is_some_and(truthy),
    })
}

fn find_in<'a>(v: &'a Value, route: &str) -> Option<&'a serde_json::Map<String, Value>> {
    match v {
        Value::Object(map) => map.get(route).and_then(Value::as_object),
        Value::Array(items) => items.iter().filter_map(Value::as_object).find(|o| {
            ["name", "route"]
                .iter()
                .any(|k| o.get(*k).and_then(Value::as_str) == Some(route))
        }),
        _ => None,
    }
}

/// Whether an option is set to something that takes effect.
fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64() != Some(0.0),
        Value::String(s) => !s.trim().is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_hermes_writes_and_tolerated_ones() {
        let plain = br#"{"ci": {"secret": "s1", "events": [], "profile": "default"}}"#;
        let e = parse(plain, "ci").unwrap();
        assert_eq!(e.secret.as_deref(), Some("s1"));
        assert_eq!(e.profile, None);
        assert!(e.enabled && !e.events && !e.coalesce);

        let bom =
            b"\xEF\xBB\xBF{\"ci\": {\"secret\": \"s\", \"profile\": \"work\", \"enabled\": false}}";
        let e = parse(bom, "ci").unwrap();
        assert_eq!(e.profile.as_deref(), Some("work"));
        assert!(!e.enabled);

        let wrapped =
            br#"{"subscriptions": {"ci": {"secret": "s", "events": ["push"], "coalesce": true}}}"#;
        let e = parse(wrapped, "ci").unwrap();
        assert!(e.events && e.coalesce);

        let list = br#"{"routes": [{"name": "other"}, {"name": "ci", "secret": "s"}]}"#;
        assert_eq!(parse(list, "ci").unwrap().secret.as_deref(), Some("s"));
        let top_list = br#"[{"route": "ci", "secret": "s"}]"#;
        assert_eq!(parse(top_list, "ci").unwrap().secret.as_deref(), Some("s"));

        let no_secret = br#"{"ci": {"secret": ""}}"#;
        assert_eq!(parse(no_secret, "ci").unwrap().secret, None);
    }

    #[test]
    fn errors_never_quote_contents() {
        let bad = br#"{"ci": {"secret": "TOPSECRET" "#;
        let err = parse(bad, "ci").unwrap_err();
        assert!(matches!(err, SubsError::NotJson { .. }));
        assert!(!err.to_string().contains("TOPSECRET"));
        assert_eq!(parse(b"42", "ci"), Err(SubsError::Shape));
        assert_eq!(parse(b"{}", "ci"), Err(SubsError::NoRoute("ci".into())));
    }
}
