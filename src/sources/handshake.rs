//! The handshakes a template source declares (issue 34 item 2): the `handshake = { ... }`
//! table, its validation (every refusal names `handshake.<key>` and says what to write),
//! and the answer to a request that is the handshake.
//!
//! | `kind` | what the sender does | answered |
//! | --- | --- | --- |
//! | `echo` | POSTs a signed body carrying a challenge when `when` holds (Slack `url_verification`, Twitch `webhook_callback_verification`) and expects it back | after verification; `field` (a selector) is the challenge, `reply` is `text` (the challenge as `text/plain`) or `json:<member>` (`{"<member>": challenge}`) |
//! | `ping` | POSTs a signed ping when `when` holds (Discord's `type` 1) and expects a fixed answer | after verification; `reply` is the JSON answer (`{"type":1}`) |
//! | `header` | GETs the URL with the challenge in header `challenge` (Okta's `X-Okta-Verification-Challenge`) and its usual credential, and expects it back | after verification (the scheme checks the GET's credential, a token header); `reply` as for `echo` |
//! | `query` | GETs the URL with the challenge in query parameter `challenge` (Meta `hub.challenge`, Dropbox `challenge`, Microsoft Graph `validationToken`) and expects it back as `text/plain` | with `token` (the parameter holding a verify token, Meta's `hub.verify_token`): only when it equals the secret `verify_token`, compared in constant time; without `token`: before verification, since the answer is the sender's own text and derives from no secret |
//!
//! Must not: read a secret itself (the template source passes the candidates in), compare
//! secret-derived bytes other than through [`verify::static_token`], or enqueue: a request
//! that is the handshake is answered or refused, never accepted. A challenge is echoed only
//! if it is 1 to [`CHALLENGE_BYTES_MAX`] printable ASCII characters, as `text/plain` with
//! `nosniff` or inside a JSON string, so a reflected value is never read as markup.

use serde_json::Value;

use super::opts::invalid;
use super::select::{Expr, Rule};
use super::verify;
use super::{Request, Response, SourceConfigError, SourceError};

/// The keys a handshake table takes.
pub const HANDSHAKE_KEYS: &[&str] = &["kind", "when", "field", "reply", "challenge", "token"];

/// The secret a `query` handshake with `token` compares the verify token with.
pub const VERIFY_TOKEN: &str = "verify_token";

/// The longest challenge echoed back (Microsoft Graph's validation tokens are the longest
/// seen, well under this).
pub const CHALLENGE_BYTES_MAX: usize = 1024;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EchoReply {
    Text,
    Json(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handshake {
    Echo {
        when: Rule,
        field: Expr,
        reply: EchoReply,
    },
    Ping {
        when: Rule,
        reply: String,
    },
    Query {
        challenge: String,
        token: Option<String>,
    },
    Header {
        challenge: String,
        reply: EchoReply,
    },
}

fn bad(key: &str, message: String) -> SourceConfigError {
    invalid(&format!("handshake.{key}"), message)
}

fn string(t: &toml::Table, key: &str, example: &str) -> Result<Option<String>, SourceConfigError> {
    match t.get(key) {
        None => Ok(None),
        Some(toml::Value::String(s)) if !s.trim().is_empty() => Ok(Some(s.trim().to_string())),
        Some(_) => Err(bad(
            key,
            format!("must be a non-empty string; write {key} = {example}"),
        )),
    }
}

fn required(
    t: &toml::Table,
    key: &str,
    kind: &str,
    example: &str,
) -> Result<String, SourceConfigError> {
    string(t, key, example)?.ok_or_else(|| {
        bad(
            key,
            format!("required by kind = \"{kind}\"; write {key} = {example}"),
        )
    })
}

fn is_param_name(p: &str) -> bool {
    !p.is_empty()
        && p.len() <= 64
        && p.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// A challenge fit to echo: printable ASCII (spaces included: Microsoft Graph's tokens have
/// them), bounded; no control character, so nothing can break out of the answer.
fn echoable(c: &str) -> bool {
    !c.is_empty()
        && c.len() <= CHALLENGE_BYTES_MAX
        && c.bytes().all(|b| b == b' ' || b.is_ascii_graphic())
}

fn text(body: &str) -> Response {
    Response {
        status: 200,
        headers: vec![
            (
                "Content-Type".to_string(),
                "text/plain; charset=utf-8".to_string(),
            ),
            ("X-Content-Type-Options".to_string(), "nosniff".to_string()),
        ],
        body: body.as_bytes().to_vec(),
    }
}

/// `text` or `json:<member>`.
fn echo_reply(r: &str) -> Result<EchoReply, SourceConfigError> {
    match r {
        "text" => Ok(EchoReply::Text),
        r => match r.strip_prefix("json:") {
            Some(m) if !m.is_empty() => Ok(EchoReply::Json(m.to_string())),
            _ => Err(bad(
                "reply",
                format!(
                    "\"{r}\" is not a reply; write reply = \"text\" (the challenge as text/plain) or reply = \"json:challenge\" ({{\"challenge\": ...}})"
                ),
            )),
        },
    }
}

fn reply_with(reply: &EchoReply, c: String) -> Response {
    match reply {
        EchoReply::Text => text(&c),
        EchoReply::Json(member) => {
            let mut m = serde_json::Map::new();
            m.insert(member.clone(), Value::String(c));
            Response::json(&Value::Object(m))
        }
    }
}

impl Handshake {
    /// Reads a `handshake = { ... }` table.
    pub fn parse(t: &toml::Table) -> Result<Handshake, SourceConfigError> {
        if let Some(k) = t.keys().find(|k| !HANDSHAKE_KEYS.contains(&k.as_str())) {
            return Err(bad(
                k,
                format!(
                    "not a handshake key; remove it (a handshake takes: {})",
                    HANDSHAKE_KEYS.join(", ")
                ),
            ));
        }
        let kind = string(t, "kind", "\"echo\"")?.ok_or_else(|| {
            bad(
                "kind",
                "required; write kind = \"echo\" (a challenge in the signed body), \"ping\" (a fixed answer) or \"query\" (a GET with the challenge in the query)".to_string(),
            )
        })?;
        let allowed: &[&str] = match kind.as_str() {
            "echo" => &["kind", "when", "field", "reply"],
            "ping" => &["kind", "when", "reply"],
            "query" => &["kind", "challenge", "token"],
            "header" => &["kind", "challenge", "reply"],
            other => {
                return Err(bad(
                    "kind",
                    format!(
                        "\"{other}\" is not a handshake; write kind = \"echo\", \"ping\", \"query\" or \"header\""
                    ),
                ));
            }
        };
        if let Some(k) = t.keys().find(|k| !allowed.contains(&k.as_str())) {
            return Err(bad(
                k,
                format!(
                    "not used by kind = \"{kind}\"; remove it (it takes: {})",
                    allowed.join(", ")
                ),
            ));
        }
        let when = |example: &str| -> Result<Rule, SourceConfigError> {
            Rule::parse("handshake.when", &required(t, "when", &kind, example)?)
        };
        Ok(match kind.as_str() {
            "echo" => {
                let when = when("\"payload.type=url_verification\"")?;
                let field = Expr::parse(
                    "handshake.field",
                    &required(t, "field", "echo", "\"payload.challenge\"")?,
                )?;
                let reply = echo_reply(&required(t, "reply", "echo", "\"text\"")?)?;
                Handshake::Echo { when, field, reply }
            }
            "ping" => {
                let when = when("\"payload.type=1\"")?;
                let reply = required(t, "reply", "ping", "'{\"type\":1}'")?;
                if serde_json::from_str::<Value>(&reply).is_err() {
                    return Err(bad(
                        "reply",
                        "must be JSON text (the body the sender expects); write reply = '{\"type\":1}'".to_string(),
                    ));
                }
                Handshake::Ping { when, reply }
            }
            "header" => {
                let challenge = required(
                    t,
                    "challenge",
                    "header",
                    "\"X-Okta-Verification-Challenge\"",
                )?;
                if !super::opts::is_header_name(&challenge) {
                    return Err(bad(
                        "challenge",
                        format!(
                            "\"{challenge}\" is not a header name; write challenge = \"X-Okta-Verification-Challenge\""
                        ),
                    ));
                }
                let reply = echo_reply(&required(t, "reply", "header", "\"json:verification\"")?)?;
                Handshake::Header { challenge, reply }
            }
            _ => {
                let challenge = required(t, "challenge", "query", "\"hub.challenge\"")?;
                let token = string(t, "token", "\"hub.verify_token\"")?;
                for (k, v) in [("challenge", Some(&challenge)), ("token", token.as_ref())] {
                    if let Some(p) = v
                        && !is_param_name(p)
                    {
                        return Err(bad(
                            k,
                            format!(
                                "\"{p}\" is not a query parameter name; write {k} = \"hub.challenge\""
                            ),
                        ));
                    }
                }
                Handshake::Query { challenge, token }
            }
        })
    }

    /// Answered before verification: a `query` handshake without a verify token (the
    /// answer is the sender's own text). The others need a verified request.
    pub fn unauthenticated(&self) -> bool {
        matches!(self, Handshake::Query { token: None, .. })
    }

    /// A `query` or `header` handshake (the sender's check may be a GET).
    pub fn is_get(&self) -> bool {
        matches!(self, Handshake::Query { .. } | Handshake::Header { .. })
    }

    /// The secret the handshake compares with, if any ([`VERIFY_TOKEN`]).
    pub fn secret(&self) -> Option<&'static str> {
        matches!(self, Handshake::Query { token: Some(_), .. }).then_some(VERIFY_TOKEN)
    }

    /// For a `query` handshake with `token`: `Some(verdict)` when `req` is the handshake (a
    /// GET carrying the challenge parameter), the verdict being whether its verify token
    /// equals one of `candidates` (constant time). `None` for any other request, which the
    /// recipe or scheme verifies as usual.
    /// `candidates` is called only for the handshake request.
    pub fn token_verifies(
        &self,
        req: &Request,
        candidates: impl FnOnce() -> Result<Vec<Vec<u8>>, SourceError>,
    ) -> Result<Option<bool>, SourceError> {
        let Handshake::Query {
            challenge,
            token: Some(token),
        } = self
        else {
            return Ok(None);
        };
        if !req.method.eq_ignore_ascii_case("GET") || req.query_param(challenge).is_none() {
            return Ok(None);
        }
        let Some(presented) = req.query_param(token) else {
            return Ok(Some(false));
        };
        Ok(Some(verify::static_token(presented, &candidates()?)))
    }

    /// Whether `req` is this handshake (before any answer): a GET with the challenge
    /// parameter, or a body for which `when` holds.
    pub fn matches(&self, req: &Request, payload: &Value) -> Result<bool, SourceError> {
        Ok(match self {
            // A GET (Meta, Dropbox), or a POST with no body (Microsoft Graph's validation).
            Handshake::Query { challenge, .. } => {
                req.query_param(challenge).is_some()
                    && (req.method.eq_ignore_ascii_case("GET") || req.body.is_empty())
            }
            Handshake::Echo { when, .. } | Handshake::Ping { when, .. } => {
                when.check(payload, req)?.is_some()
            }
            Handshake::Header { challenge, .. } => {
                req.method.eq_ignore_ascii_case("GET") && req.header(challenge).is_some()
            }
        })
    }

    /// The answer to `req`, which [`Handshake::matches`]; `Err(BadChallenge)` when the
    /// challenge is missing or unfit to echo (the caller refuses it: 401 before
    /// verification, [`Handshake::refused`] after; never enqueued).
    pub fn answer(&self, req: &Request, payload: &Value) -> Result<Response, SourceError> {
        match self {
            Handshake::Query { challenge, .. } => match req.query_param(challenge) {
                Some(c) if echoable(c) => Ok(text(c)),
                _ => Err(SourceError::BadChallenge),
            },
            Handshake::Echo { field, reply, .. } => {
                let c = field
                    .eval(payload, req)?
                    .filter(|c| echoable(c))
                    .ok_or(SourceError::BadChallenge)?;
                Ok(reply_with(reply, c))
            }
            Handshake::Header { challenge, reply } => match req.header(challenge) {
                Some(c) if echoable(c.trim()) => Ok(reply_with(reply, c.trim().to_string())),
                _ => Err(SourceError::BadChallenge),
            },
            Handshake::Ping { reply, .. } => {
                let v: Value =
                    serde_json::from_str(reply).map_err(|_| SourceError::BadChallenge)?;
                Ok(Response::json(&v))
            }
        }
    }

    /// The answer to a verified handshake whose challenge is missing or unfit to echo: a
    /// 400 that names no value, so the request is refused without being stored.
    pub fn refused() -> Response {
        Response {
            status: 400,
            headers: vec![("Content-Type".to_string(), "application/json".to_string())],
            body: br#"{"status":"bad_challenge"}"#.to_vec(),
        }
    }

    /// Whether deciding [`Handshake::matches`] needs the payload.
    pub fn uses_payload(&self) -> bool {
        match self {
            Handshake::Query { .. } | Handshake::Header { .. } => false,
            Handshake::Echo { when, field, .. } => when.uses_payload() || field.uses_payload(),
            Handshake::Ping { when, .. } => when.uses_payload(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `src` is the inside of a `handshake = { ... }` inline table.
    fn parse(src: &str) -> Result<Handshake, String> {
        let t: toml::Table = format!("h = {{ {src} }}").parse().expect("toml");
        let h = t["h"].as_table().expect("a table");
        Handshake::parse(h).map_err(|e| e.to_string())
    }

    #[test]
    fn refusals_name_the_key_and_what_to_write() {
        for (src, want) in [
            ("when = \"payload.type=1\"", "handshake.kind: required"),
            (
                "kind = \"pong\"",
                "handshake.kind: \"pong\" is not a handshake",
            ),
            (
                "kind = \"echo\", field = \"payload.challenge\", reply = \"text\"",
                "handshake.when: required by kind = \"echo\"",
            ),
            (
                "kind = \"echo\", when = \"payload.type=url_verification\", reply = \"text\"",
                "handshake.field: required",
            ),
            (
                "kind = \"echo\", when = \"payload.type=x\", field = \"payload.c\", reply = \"xml\"",
                "handshake.reply: \"xml\" is not a reply",
            ),
            (
                "kind = \"echo\", when = \"type=x\", field = \"payload.c\", reply = \"text\"",
                "handshake.when",
            ),
            (
                "kind = \"ping\", when = \"payload.type=1\", reply = \"PONG\"",
                "handshake.reply: must be JSON text",
            ),
            (
                "kind = \"ping\", when = \"payload.type=1\", reply = '{}', field = \"payload.x\"",
                "handshake.field: not used by kind = \"ping\"",
            ),
            (
                "kind = \"query\"",
                "handshake.challenge: required by kind = \"query\"",
            ),
            (
                "kind = \"query\", challenge = \"a b\"",
                "handshake.challenge: \"a b\" is not a query parameter name",
            ),
            (
                "kind = \"query\", challenge = \"c\", secret = \"x\"",
                "handshake.secret: not a handshake key",
            ),
            (
                "kind = \"header\", challenge = \"X Y\", reply = \"text\"",
                "handshake.challenge: \"X Y\" is not a header name",
            ),
            (
                "kind = \"header\", challenge = \"X-C\"",
                "handshake.reply: required by kind = \"header\"",
            ),
        ] {
            let got = parse(src).err().unwrap_or_else(|| "accepted".into());
            assert!(got.contains(want), "{src}\n got: {got}\nwant: {want}");
        }
    }

    #[test]
    fn query_tokens_are_compared_and_challenges_echoed_only_when_printable() {
        let h =
            parse("kind = \"query\", challenge = \"hub.challenge\", token = \"hub.verify_token\"")
                .unwrap();
        assert!(!h.unauthenticated());
        assert_eq!(h.secret(), Some(VERIFY_TOKEN));
        let req = |q: &[(&str, &str)]| {
            let mut r = Request::new("GET", "/hooks/m", 0.0);
            r.query = q
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            r
        };
        let good = vec![b"tok".to_vec()];
        let ok = |r: &Request| h.token_verifies(r, || Ok(good.clone())).unwrap();
        assert_eq!(
            ok(&req(&[
                ("hub.challenge", "42"),
                ("hub.verify_token", "tok")
            ])),
            Some(true)
        );
        assert_eq!(
            ok(&req(&[
                ("hub.challenge", "42"),
                ("hub.verify_token", "tok2")
            ])),
            Some(false)
        );
        assert_eq!(ok(&req(&[("hub.challenge", "42")])), Some(false));
        // Not the handshake: the recipe decides; the secret is not even read.
        let r = req(&[("hub.verify_token", "tok")]);
        assert_eq!(h.token_verifies(&r, || panic!("read")).unwrap(), None);
        let r = req(&[("hub.challenge", "4 2")]);
        assert_eq!(h.answer(&r, &Value::Null).unwrap().body, b"4 2");
        let r = req(&[("hub.challenge", "4\n2")]);
        assert!(h.answer(&r, &Value::Null).is_err());
        let long = "x".repeat(CHALLENGE_BYTES_MAX + 1);
        assert!(
            h.answer(&req(&[("hub.challenge", &long)]), &Value::Null)
                .is_err()
        );
    }

    #[test]
    fn echo_and_ping_answer_only_when_their_rule_holds() {
        let h = parse("kind = \"echo\", when = \"header.Twitch-Eventsub-Message-Type=webhook_callback_verification\", field = \"payload.challenge\", reply = \"text\"").unwrap();
        let payload = serde_json::json!({"challenge": "pogchamp-kappa-360noscope-vohiyo"});
        let req = Request::new("POST", "/hooks/t", 0.0).with_header(
            "Twitch-Eventsub-Message-Type",
            "webhook_callback_verification",
        );
        assert!(h.matches(&req, &payload).unwrap());
        assert_eq!(
            h.answer(&req, &payload).unwrap().body,
            b"pogchamp-kappa-360noscope-vohiyo"
        );
        let other = Request::new("POST", "/hooks/t", 0.0)
            .with_header("Twitch-Eventsub-Message-Type", "notification");
        assert!(!h.matches(&other, &payload).unwrap());
        let p =
            parse("kind = \"ping\", when = \"payload.type=1\", reply = '{\"type\":1}'").unwrap();
        let ping = Request::new("POST", "/hooks/d", 0.0);
        assert!(p.matches(&ping, &serde_json::json!({"type": 1})).unwrap());
        assert!(!p.matches(&ping, &serde_json::json!({"type": 2})).unwrap());
        assert_eq!(
            p.answer(&ping, &Value::Null).unwrap().body,
            br#"{"type":1}"#
        );
    }
}
