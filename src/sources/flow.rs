//! The intake's call order over a source, as one pure function.
//!
//! Owns: [`evaluate`] (= [`authenticate`] then [`classify`], split so the intake's panic
//! guard can tell a panic before verification from one after it), which runs a request through a source exactly as spec section 9
//! orders it (verify → challenge → ignore → payload → key, dedup_id, event_type, attrs →
//! action) and says what the intake should do, so the intake, `hookspool source test` and
//! the kit agree on one sequence. It also owns [`parse_capture`] for `.http` captures.
//!
//! Must not: do I/O, route, dedup or store (the body cap, 411/413, route resolution and the
//! enqueue transaction are the intake's). A `Verdict` never carries secret values.

use std::collections::BTreeMap;

use serde_json::Value;

use super::{Request, Response, SecretSource, Source, SourceError};

/// What an unauthenticated challenge gets: every access is refused and remembered.
#[derive(Debug, Default)]
pub struct RefusingSecrets {
    touched: std::sync::atomic::AtomicBool,
}

impl RefusingSecrets {
    pub fn new() -> Self {
        RefusingSecrets::default()
    }
    pub fn touched(&self) -> bool {
        self.touched.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl super::SecretSource for RefusingSecrets {
    fn candidates(&self, name: &str) -> Result<Vec<Vec<u8>>, super::SecretError> {
        self.touched
            .store(true, std::sync::atomic::Ordering::SeqCst);
        Err(super::SecretError::Refused {
            name: name.to_string(),
        })
    }
}

/// What the intake should do with a request.
#[derive(Debug)]
pub enum Verdict {
    /// 401, empty body, one log line.
    Unauthorized,
    /// Verification could not decide (a secret unreadable, a key service down): not 2xx.
    Undecided(SourceError),
    /// A handshake answer; never enqueued.
    Answer(Response),
    /// Verified, acknowledged, not enqueued; the reason is configuration text.
    Ignored(String),
    /// Verified, but the source failed: store as a quarantine event,
    /// `last_error = "plugin error: <class>"`.
    Quarantine {
        class: &'static str,
    },
    Accept(Accepted),
}

/// A verified, classified event.
#[derive(Debug, Clone, PartialEq)]
pub struct Accepted {
    pub payload: Value,
    pub key: String,
    pub dedup_id: Option<String>,
    pub event_type: String,
    pub attrs: BTreeMap<String, String>,
    pub action: Option<String>,
}

/// Runs `req` through `source` in the intake's order: [`authenticate`], then [`classify`].
pub fn evaluate(source: &dyn Source, req: &Request, secrets: &dyn SecretSource) -> Verdict {
    match authenticate(source, req, secrets) {
        Some(stop) => stop,
        None => classify(source, req, secrets),
    }
}

/// The steps before anything is known about the request: an unauthenticated handshake, then
/// `verify`. `Some` is the answer (a handshake, 401, or "could not decide"); `None` means the
/// request is verified and [`classify`] comes next. Nothing here may be stored.
pub fn authenticate(
    source: &dyn Source,
    req: &Request,
    secrets: &dyn SecretSource,
) -> Option<Verdict> {
    if source.declared().challenge_unauthenticated {
        // Before verify, with secrets that refuse: only a constant answer is possible.
        let refusing = RefusingSecrets::new();
        match source.challenge(req, &refusing) {
            Ok(Some(answer)) => return Some(Verdict::Answer(answer)),
            Ok(None) => {}
            // An unauthenticated request must not reach quarantine storage.
            Err(_) => return Some(Verdict::Unauthorized),
        }
    }
    match source.verify(req, secrets) {
        Ok(true) => None,
        Ok(false) => Some(Verdict::Unauthorized),
        Err(e) => Some(Verdict::Undecided(e)),
    }
}

/// The steps after a verified request: a signed handshake, ignore, then payload -> key,
/// dedup_id, event_type, attrs. Any source error quarantines.
pub fn classify(source: &dyn Source, req: &Request, secrets: &dyn SecretSource) -> Verdict {
    match accept(source, req, secrets) {
        Ok(v) => v,
        Err(e) => Verdict::Quarantine { class: e.class() },
    }
}

/// The fallible half of [`classify`]: challenge (for a source whose challenge
/// needs verification) → ignore → payload → key, dedup_id, event_type, attrs → action.
/// Quarantine replay resumes here (the stored request was verified when it arrived), and
/// `hookspool source test` calls it to name the error a quarantine verdict only classifies.
pub fn accept(
    source: &dyn Source,
    req: &Request,
    secrets: &dyn SecretSource,
) -> Result<Verdict, SourceError> {
    if !source.declared().challenge_unauthenticated
        && let Some(answer) = source.challenge(req, secrets)?
    {
        return Ok(Verdict::Answer(answer));
    }
    if let Some(reason) = source.ignore(req)? {
        return Ok(Verdict::Ignored(reason));
    }
    let payload = source.payload(req)?;
    let key = source.key(&payload, req)?;
    let dedup_id = source.dedup_id(&payload, req)?;
    let event_type = source.event_type(&payload, req)?;
    let attrs = source.attrs(&payload, req)?;
    Ok(Verdict::Accept(Accepted {
        payload,
        key,
        dedup_id,
        event_type,
        attrs,
        action: source.declared().action.clone(),
    }))
}

/// Why a capture could not be read. Carries line numbers, never content.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CaptureError {
    #[error("capture has no request line; write e.g. \"POST /hooks/github HTTP/1.1\" first")]
    NoRequestLine,
    #[error("capture line {line}: not a header; write \"Name: value\"")]
    BadHeader { line: usize },
}

/// Parses a captured request (`.http`: request line, headers, blank line, body). The body
/// is taken byte for byte (signatures cover exact bytes), cut to Content-Length when given.
pub fn parse_capture(text: &str, now: f64) -> Result<Request, CaptureError> {
    let (head, body) = match text.split_once("\r\n\r\n") {
        Some(split) => split,
        None => text.split_once("\n\n").unwrap_or((text, "")),
    };
    let mut lines = head.lines();
    let start = lines.next().ok_or(CaptureError::NoRequestLine)?;
    let mut parts = start.split_whitespace();
    let (Some(method), Some(target)) = (parts.next(), parts.next()) else {
        return Err(CaptureError::NoRequestLine);
    };
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let mut r = Request::new(method, path, now);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        r = r.with_query(k, v);
    }
    for (i, line) in lines.enumerate() {
        let (k, v) = line
            .split_once(':')
            .ok_or(CaptureError::BadHeader { line: i + 2 })?;
        r = r.with_header(k.trim(), v.trim());
    }
    let len = r
        .header("Content-Length")
        .and_then(|l| l.trim().parse::<usize>().ok())
        .unwrap_or(body.len());
    r.body = body.as_bytes()[..len.min(body.len())].to_vec();
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kit::signer::{KIT_NOW, Kit, MapSecrets, all_kits};

    #[test]
    fn every_kit_flows() {
        for kit in all_kits(b"flow-secret").expect("kits") {
            let s = kit.source.as_ref();
            let body = kit.sample_body.clone();
            match evaluate(s, &kit.signed(&body, KIT_NOW), &kit.secrets) {
                Verdict::Accept(a) => assert!(!a.key.is_empty(), "{}", kit.label),
                other => panic!("{}: {other:?}", kit.label),
            }
            assert!(matches!(
                evaluate(s, &kit.unsigned(&body, KIT_NOW), &kit.secrets),
                Verdict::Unauthorized
            ));
            // A verified body the source cannot classify is quarantined, never an error
            // status (calendar builds its payload from headers, so it needs a missing one).
            let mut broken = kit.signed(b"[1, 2", KIT_NOW);
            broken.remove_header("X-Goog-Channel-ID");
            match evaluate(s, &broken, &kit.secrets) {
                Verdict::Quarantine { class } => assert!(!class.is_empty()),
                other => panic!("{}: {other:?}", kit.label),
            }
            // Missing secrets: undecided, named. (Plaid reads its secrets only to fetch a key,
            // and the kit's key is cached by now.)
            if !matches!(s.declared().kind, "plaid") {
                let none = MapSecrets::new();
                assert!(
                    matches!(
                        evaluate(s, &kit.signed(&body, KIT_NOW), &none),
                        Verdict::Undecided(_)
                    ),
                    "{}",
                    kit.label
                );
            }
            if let Some(h) = kit.handshake(true, KIT_NOW) {
                assert!(
                    matches!(evaluate(s, &h, &kit.secrets), Verdict::Answer(_)),
                    "{}",
                    kit.label
                );
            }
            if matches!(kit.flags.handshake, crate::kit::signer::Handshake::Signed) {
                let bad = kit.handshake(false, KIT_NOW).expect("handshake");
                assert!(
                    matches!(evaluate(s, &bad, &kit.secrets), Verdict::Unauthorized),
                    "{}",
                    kit.label
                );
            }
        }
    }

    #[test]
    fn github_ping_is_ignored_after_verify() {
        let mut kit = Kit::builtin("github", b"s").expect("kit");
        kit.extra_headers = vec![("X-GitHub-Event".into(), "ping".into())];
        let r = kit.signed(b"{\"zen\":\"x\"}", KIT_NOW);
        let verdict = evaluate(kit.source.as_ref(), &r, &kit.secrets);
        assert!(
            matches!(verdict, Verdict::Ignored(ref why) if why.as_str() == "ping"),
            "{verdict:?}"
        );
        let unsigned = kit.unsigned(b"{\"zen\":\"x\"}", KIT_NOW);
        assert!(matches!(
            evaluate(kit.source.as_ref(), &unsigned, &kit.secrets),
            Verdict::Unauthorized
        ));
    }

    #[test]
    fn captures_parse() {
        let r = parse_capture(
            "POST /h?token=abc&x HTTP/1.1\nContent-Length: 2\nX-A: b\n\n{}\n",
            5.0,
        )
        .expect("parse");
        assert_eq!(
            (r.method.as_str(), r.path.as_str(), r.body.as_slice()),
            ("POST", "/h", b"{}".as_slice())
        );
        assert_eq!(r.query_param("token"), Some("abc"));
        assert_eq!(r.header("x-a"), Some("b"));
        assert_eq!(
            parse_capture("", 0.0).unwrap_err(),
            CaptureError::NoRequestLine
        );
        assert_eq!(
            parse_capture("GET / HTTP/1.1\nnonsense\n\n", 0.0).unwrap_err(),
            CaptureError::BadHeader { line: 2 }
        );
    }
}
