//! The intake's HTTP answers (spec 9): the JSON status bodies, the empty 401, and the 4xx/5xx
//! answers with their headers (Retry-After, Allow, Connection: close).
//!
//! Must not: echo anything from the request (no body, header or query text in an answer).

use bytes::Bytes;
use http_body_util::Full;
use hyper::Response;
use hyper::header::{ALLOW, CONNECTION, CONTENT_TYPE, HeaderValue, RETRY_AFTER};

pub type Answer = Response<Full<Bytes>>;

/// Retry-After on a 503 for low disk space (spec 9).
pub const RETRY_AFTER_LOW_SPACE_S: u64 = 60;
/// Retry-After of a 503 while the spool's PostgreSQL server cannot be reached: a restart
/// or a failover takes seconds.
pub const RETRY_AFTER_UNREACHABLE_S: u64 = 5;

/// The answers a webhook request can get once it reached its source, each with its one
/// status and body; `hookspool source test` prints the same ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Said {
    Queued,
    Duplicate,
    Replayed,
    Quarantined,
    Ignored,
    /// 503: the spool cannot take the write, or verification could not decide.
    Unavailable,
}

impl Said {
    pub fn status(self) -> u16 {
        match self {
            Said::Quarantined => 202,
            Said::Unavailable => 503,
            Said::Queued | Said::Duplicate | Said::Replayed | Said::Ignored => 200,
        }
    }

    pub fn word(self) -> &'static str {
        match self {
            Said::Queued => "queued",
            Said::Duplicate => "duplicate",
            Said::Replayed => "replayed",
            Said::Quarantined => "quarantined",
            Said::Ignored => "ignored",
            Said::Unavailable => "unavailable",
        }
    }

    /// The exact body sent.
    pub fn body(self) -> String {
        status_body(self.word())
    }
}

/// The answer for `s`.
pub fn said(s: Said) -> Answer {
    status_json(s.status(), s.word())
}

/// `{"status":"<word>"}`, the body of every status answer.
pub fn status_body(word: &str) -> String {
    serde_json::json!({ "status": word }).to_string()
}

pub fn status_json(status: u16, word: &str) -> Answer {
    json(status, &serde_json::json!({ "status": word }))
}

pub fn json(status: u16, value: &serde_json::Value) -> Answer {
    let mut r = Response::new(Full::new(Bytes::from(value.to_string())));
    *r.status_mut() = code(status);
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

pub fn text(status: u16, content_type: &'static str, body: String) -> Answer {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = code(status);
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

pub fn empty(status: u16) -> Answer {
    let mut r = Response::new(Full::new(Bytes::new()));
    *r.status_mut() = code(status);
    r
}

/// An error answer after which the connection is closed (the rest of the request body is
/// never read).
pub fn closing(status: u16, word: &str) -> Answer {
    let mut r = status_json(status, word);
    r.headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("close"));
    r
}

pub fn method_not_allowed(allow: &'static str) -> Answer {
    let mut r = status_json(405, "method_not_allowed");
    r.headers_mut()
        .insert(ALLOW, HeaderValue::from_static(allow));
    r
}

pub fn unavailable(word: &str, retry_after_s: Option<u64>) -> Answer {
    let mut r = status_json(503, word);
    if let Some(s) = retry_after_s {
        r.headers_mut().insert(RETRY_AFTER, HeaderValue::from(s));
    }
    r
}

/// A 503 with Retry-After that also closes the connection: the request's body was never
/// read, so the connection cannot carry another request.
pub fn unavailable_closing(word: &str, retry_after_s: u64) -> Answer {
    let mut r = unavailable(word, Some(retry_after_s));
    r.headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("close"));
    r
}

/// A source's handshake answer, as the source built it.
pub fn from_source(resp: crate::sources::Response) -> Answer {
    let mut r = Response::new(Full::new(Bytes::from(resp.body)));
    *r.status_mut() = code(resp.status);
    for (k, v) in resp.headers {
        if let (Ok(name), Ok(value)) = (
            hyper::header::HeaderName::from_bytes(k.as_bytes()),
            HeaderValue::from_str(&v),
        ) {
            r.headers_mut().append(name, value);
        }
    }
    r
}

fn code(status: u16) -> hyper::StatusCode {
    hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR)
}
