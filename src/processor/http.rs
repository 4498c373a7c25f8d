//! `ctx.http` (spec 14.3.7): the processor's HTTP client to a provider's API. reqwest with
//! rustls, redirects never followed, a total deadline per request (DNS and connect
//! included), JSON in and out, at most [`RESPONSE_BYTES_MAX`] read, and the status mapped to
//! Retryable, Config or Permanent by [`HttpError::into_error`] (a caller that gives a status its own
//! meaning, such as Gmail's 404 for a too-old history id, matches it first).
//!
//! Base URLs: processors name the provider's real https URLs. Only in a build with the
//! `failpoints` feature (tests; packaged builds have it off) can HOOKSPOOL_TEST_PROVIDER_BASE
//! send them to a loopback test server instead, `https://<host>/<path>` becoming
//! `<base>/<host>/<path>`. The variable is a HOOKSPOOL_* name, which config can never set
//! for a script (check refuses it and the sandbox passes only PATH, HOME and LANG), so a
//! production config cannot point a processor at another host; a base that is not loopback
//! is refused even in a test build. In every build, `hookspool bobbin check` runs a
//! processor in its own process against the kit's stub server on 127.0.0.1:0
//! ([`Endpoints::stub`], reached only from `kit::processor_kit`).
//!
//! `get_text` (spec 14.4) is the pollers' GET: a 304 is an answer, not an error (so a
//! conditional GET with If-None-Match / If-Modified-Since works), the text is decoded with
//! the response's charset, else the encoding its XML declaration names, else UTF-8, and
//! the header names come back lower case; timeout, size cap and status mapping are the JSON
//! methods'. A client built by [`Http::stubbed`] (the conformance kit's) answers every
//! request from a list instead of the network.
//!
//! Egress (issue 35): the client is built by `egress::client_builder`, so an address in a
//! refused range (loopback, private, link-local, unspecified, multicast, CGNAT) is never
//! connected to, whether the URL names it or a lookup answers it, no proxy variable applies,
//! and the error is `config`; only the loopback test base or the kit's stub admits loopback.
//!
//! Must not: retry beyond one short Retry-After wait, log anything, or put a URL (its query
//! string may hold a token), a body or a header value into an error.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::header::{HeaderMap, RETRY_AFTER};
use reqwest::{RequestBuilder, Url};
use serde_json::Value;

use super::ProcessorError;
use crate::destinations::USER_AGENT;
use crate::destinations::retry_after;

/// The most of a response body read; a larger answer fails the request.
pub const RESPONSE_BYTES_MAX: usize = 16 * 1024 * 1024;
/// Each request's total deadline, DNS, connect, TLS and body included.
pub const REQUEST_S_MAX: u64 = 30;
const CONNECT_S_MAX: u64 = 10;
/// A 429 or 503 whose Retry-After is at most this is waited out once inside the request;
/// a longer one fails the batch as Retryable with the hint.
pub const RETRY_AFTER_INLINE_S_MAX: f64 = 5.0;
/// The test-only base (see the module docs).
pub const TEST_BASE_ENV: &str = crate::destinations::script::TEST_PROVIDER_BASE_ENV;
/// The most of an error body kept for the caller's classification.
const ERROR_BODY_BYTES_MAX: usize = 64 * 1024;

/// How a request failed. The body is kept (bounded) only so that provider code can read an
/// error's reason code; Debug shows the status and kind, never the body.
pub struct HttpError {
    pub status: Option<u16>,
    pub kind: HttpErrorKind,
    pub retry_after_s: Option<f64>,
    body: Vec<u8>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HttpErrorKind {
    /// A non-2xx answer.
    Status,
    /// DNS, connect, TLS, reset.
    Transport,
    Timeout,
    TooLarge,
    /// A 2xx whose body is not JSON.
    NotJson,
    /// The egress policy refused the address (issue 35): loopback, private, link-local,
    /// unspecified, multicast or carrier-grade NAT.
    Refused(crate::egress::Rule),
}

impl std::fmt::Debug for HttpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpError")
            .field("status", &self.status)
            .field("kind", &self.kind)
            .field("retry_after_s", &self.retry_after_s)
            .finish_non_exhaustive()
    }
}

impl HttpError {
    fn new(kind: HttpErrorKind) -> HttpError {
        HttpError {
            status: None,
            kind,
            retry_after_s: None,
            body: Vec::new(),
        }
    }

    /// The error body as JSON, for provider code that reads a reason code from it. Never
    /// log it or put it in an error.
    pub fn body_json(&self) -> Option<Value> {
        serde_json::from_slice(&self.body).ok()
    }

    /// The shared status mapping: 429, 408 and 5xx Retryable (with Retry-After as the hint),
    /// 401 and 403 Config (the credential or its scopes need the operator), any other answer
    /// Permanent, transport failures Retryable.
    pub fn into_error(self) -> ProcessorError {
        use HttpErrorKind::*;
        match (self.kind, self.status) {
            (Transport, _) => ProcessorError::retryable("provider API unreachable"),
            (Timeout, _) => ProcessorError::retryable("provider API timed out"),
            (TooLarge, _) => ProcessorError::retryable("provider API answer too large"),
            (NotJson, _) => ProcessorError::retryable("provider API answer is not JSON"),
            (Refused(rule), _) => ProcessorError::config(format!(
                "provider URL is at a {} address, which the egress policy refuses (egress refused: {})",
                rule.as_str(),
                rule.as_str()
            )),
            (Status, Some(s)) if s == 429 || s == 408 || s >= 500 => {
                ProcessorError::retryable(format!("provider API answered {s}"))
                    .with_retry_after(self.retry_after_s)
            }
            (Status, Some(401)) => {
                ProcessorError::config("provider API refused the credential (401)")
            }
            (Status, Some(403)) => ProcessorError::config(
                "provider API refused access (403): check the credential's scopes and that the API is enabled",
            ),
            (Status, Some(s)) if (300..400).contains(&s) => {
                ProcessorError::permanent(format!("provider API redirected ({s})"))
            }
            (Status, s) => ProcessorError::permanent(format!(
                "provider API refused the request ({})",
                s.unwrap_or(0)
            )),
        }
    }
}

/// Where provider URLs really go (see the module docs).
#[derive(Debug, Clone, Default)]
pub struct Endpoints {
    test_base: Option<Url>,
}

impl Endpoints {
    /// Production: every URL as written. With the `failpoints` feature, a loopback
    /// HOOKSPOOL_TEST_PROVIDER_BASE redirects them.
    pub fn from_env() -> Result<Endpoints, ProcessorError> {
        #[cfg(feature = "failpoints")]
        if let Some(base) = std::env::var(TEST_BASE_ENV).ok().filter(|v| !v.is_empty()) {
            return Endpoints::stub(&base);
        }
        Ok(Endpoints { test_base: None })
    }

    /// Every URL redirected to a stub server at `base`, which must be plain http on a
    /// loopback address: the failpoints builds' test seam above, and the kit's processor row
    /// (`kit::processor_kit`), which starts its own stub in the checking process.
    pub(crate) fn stub(base: &str) -> Result<Endpoints, ProcessorError> {
        let url = Url::parse(base)
            .map_err(|_| ProcessorError::permanent("test provider base is not a URL"))?;
        let host = url.host_str().unwrap_or_default();
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let loopback = host == "localhost"
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|a| a.is_loopback());
        if !loopback || url.scheme() != "http" {
            return Err(ProcessorError::permanent(
                "test provider base must be an http URL on a loopback address",
            ));
        }
        Ok(Endpoints {
            test_base: Some(url),
        })
    }

    /// A test server for every URL (unit tests).
    #[cfg(test)]
    pub fn test(base: &str) -> Endpoints {
        Endpoints {
            test_base: Url::parse(base).ok(),
        }
    }

    pub fn is_test(&self) -> bool {
        self.test_base.is_some()
    }

    /// The URL a request for `url` goes to.
    pub fn resolve(&self, url: &str) -> Result<Url, ProcessorError> {
        let real = Url::parse(url).map_err(|_| ProcessorError::bug("provider URL invalid"))?;
        if real.scheme() != "https" {
            return Err(ProcessorError::bug("provider URLs must be https"));
        }
        let Some(base) = &self.test_base else {
            return Ok(real);
        };
        let host = real.host_str().unwrap_or_default();
        let mut moved = base.clone();
        moved.set_path(&format!(
            "{}/{host}{}",
            base.path().trim_end_matches('/'),
            real.path()
        ));
        moved.set_query(real.query());
        Ok(moved)
    }
}

/// The client, built once per run.
#[derive(Clone)]
pub struct Http {
    client: reqwest::Client,
    /// The egress policy (issue 35): every range refused, except loopback when the
    /// endpoints are a test build's or the kit's loopback stub.
    policy: crate::egress::Policy,
    endpoints: Endpoints,
    stub: Option<Stub>,
}

/// One answer of a stubbed client (the kit's `http` list of a poll capture).
#[derive(Debug, Clone, PartialEq)]
pub struct StubAnswer {
    pub status: u16,
    pub text: String,
    pub headers: BTreeMap<String, String>,
}

/// The answers still to give, and the requests made (method, URL, request headers).
#[derive(Clone, Default)]
struct Stub {
    answers: Arc<Mutex<VecDeque<StubAnswer>>>,
    requests: Arc<Mutex<Vec<StubRequest>>>,
}

/// A request a stubbed client received.
#[derive(Debug, Clone, PartialEq)]
pub struct StubRequest {
    pub method: String,
    pub url: String,
    /// Request header names lower case.
    pub headers: BTreeMap<String, String>,
}

/// A text answer: a 2xx, or a 304 with empty text.
#[derive(Debug, Clone, PartialEq)]
pub struct TextAnswer {
    pub status: u16,
    pub text: String,
    /// Response header names lower case (the last value of a repeated name).
    pub headers: BTreeMap<String, String>,
}

/// The options of one `get_text`.
#[derive(Debug, Clone, Default)]
pub struct TextRequest<'a> {
    pub headers: &'a [(&'a str, &'a str)],
    pub query: &'a [(&'a str, &'a str)],
    pub bearer: Option<&'a str>,
    /// Shorter than [`REQUEST_S_MAX`] if given; never longer.
    pub timeout_s: Option<f64>,
}

/// How a body goes out.
pub enum Body<'a> {
    None,
    Json(&'a Value),
    Form(&'a [(&'a str, &'a str)]),
}

impl Http {
    pub fn new(endpoints: Endpoints) -> Result<Http, ProcessorError> {
        let policy = crate::egress::Policy::new(if endpoints.is_test() {
            crate::egress::loopback_only()
        } else {
            crate::egress::Allow::None
        });
        let client = crate::egress::client_builder(
            &policy,
            std::sync::Arc::new(crate::egress::SystemLookup),
        )
        .user_agent(USER_AGENT)
        .timeout(Duration::from_secs(REQUEST_S_MAX))
        .connect_timeout(Duration::from_secs(CONNECT_S_MAX))
        .https_only(!endpoints.is_test())
        .build()
        .map_err(|_| ProcessorError::bug("http client cannot be built"))?;
        Ok(Http {
            client,
            policy,
            endpoints,
            stub: None,
        })
    }

    /// A client that answers every request, in order, from `answers` and never touches the
    /// network (the conformance kit's stub HTTP). Past the last answer a request fails as
    /// unreachable.
    pub fn stubbed(answers: Vec<StubAnswer>) -> Result<Http, ProcessorError> {
        let mut h = Http::new(Endpoints::default())?;
        h.stub = Some(Stub {
            answers: Arc::new(Mutex::new(answers.into())),
            requests: Arc::default(),
        });
        Ok(h)
    }

    /// The requests a stubbed client received (empty for a real one).
    pub fn stub_requests(&self) -> Vec<StubRequest> {
        self.stub
            .as_ref()
            .map(|s| s.requests.lock().unwrap_or_else(|p| p.into_inner()).clone())
            .unwrap_or_default()
    }

    /// GET `url` as text (see the module docs): `(status, text, headers)` for a 2xx or a
    /// 304, an [`HttpError`] for anything else.
    pub async fn get_text(&self, url: &str, r: &TextRequest<'_>) -> Result<TextAnswer, HttpError> {
        let mut headers: Vec<(String, String)> = r
            .headers
            .iter()
            .map(|(k, v)| (k.to_ascii_lowercase(), v.to_string()))
            .collect();
        if !headers.iter().any(|(k, _)| k == "accept") {
            headers.push((
                "accept".into(),
                "application/atom+xml, application/rss+xml, application/xml;q=0.9, text/xml;q=0.9, */*;q=0.5".into(),
            ));
        }
        let (status, response_headers, body) = match &self.stub {
            Some(stub) => stub.answer("GET", url, &headers)?,
            None => {
                let mut target = self
                    .endpoints
                    .resolve(url)
                    .map_err(|_| HttpError::new(HttpErrorKind::Transport))?;
                self.admit(&target)?;
                if !r.query.is_empty() {
                    target.query_pairs_mut().extend_pairs(r.query);
                }
                let mut req = self.client.get(target);
                for (k, v) in &headers {
                    req = req.header(k.as_str(), v.as_str());
                }
                if let Some(token) = r.bearer {
                    req = req.bearer_auth(token);
                }
                if let Some(t) = r.timeout_s.filter(|t| t.is_finite() && *t > 0.0) {
                    req = req.timeout(Duration::from_secs_f64(t.min(REQUEST_S_MAX as f64)));
                }
                let (status, h, body) = read_bounded(req).await?;
                (status, lower_headers(&h), body)
            }
        };
        let text = if status == 304 {
            String::new()
        } else {
            decode_text(
                &body,
                response_headers.get("content-type").map(String::as_str),
            )
        };
        Ok(TextAnswer {
            status,
            text,
            headers: response_headers,
        })
    }

    pub fn endpoints(&self) -> &Endpoints {
        &self.endpoints
    }

    /// An IP-literal host against the egress policy (a name is checked by the client's
    /// resolver when it connects).
    fn admit(&self, target: &Url) -> Result<(), HttpError> {
        self.policy
            .admit_url(target)
            .map_err(|r| HttpError::new(HttpErrorKind::Refused(r.rule)))
    }

    /// GET `url` with `query`, JSON back.
    pub async fn get_json(
        &self,
        url: &str,
        query: &[(&str, &str)],
        bearer: Option<&str>,
    ) -> Result<Value, HttpError> {
        self.send(reqwest::Method::GET, url, query, bearer, Body::None)
            .await
    }

    /// POST a body, JSON back.
    pub async fn post(
        &self,
        url: &str,
        bearer: Option<&str>,
        body: Body<'_>,
    ) -> Result<Value, HttpError> {
        self.send(reqwest::Method::POST, url, &[], bearer, body)
            .await
    }

    async fn send(
        &self,
        method: reqwest::Method,
        url: &str,
        query: &[(&str, &str)],
        bearer: Option<&str>,
        body: Body<'_>,
    ) -> Result<Value, HttpError> {
        if let Some(stub) = &self.stub {
            let (status, _, body) = stub.answer(method.as_str(), url, &[])?;
            return json_of(status, &body);
        }
        let mut target = self
            .endpoints
            .resolve(url)
            .map_err(|_| HttpError::new(HttpErrorKind::Transport))?;
        self.admit(&target)?;
        if !query.is_empty() {
            target.query_pairs_mut().extend_pairs(query);
        }
        let mut req = self
            .client
            .request(method, target)
            .header(reqwest::header::ACCEPT, "application/json");
        if let Some(token) = bearer {
            req = req.bearer_auth(token);
        }
        req = match body {
            Body::None => req,
            Body::Json(v) => req.json(v),
            Body::Form(pairs) => req
                .header(
                    reqwest::header::CONTENT_TYPE,
                    "application/x-www-form-urlencoded",
                )
                .body(
                    form_urlencoded::Serializer::new(String::new())
                        .extend_pairs(pairs.iter())
                        .finish(),
                ),
        };
        let again = req.try_clone();
        match once(req).await {
            Err(e) if waits_inline(&e) => match again {
                Some(again) => {
                    let wait = e.retry_after_s.unwrap_or(0.0);
                    tokio::time::sleep(Duration::from_secs_f64(wait)).await;
                    once(again).await
                }
                None => Err(e),
            },
            other => other,
        }
    }
}

fn waits_inline(e: &HttpError) -> bool {
    matches!(e.status, Some(429 | 503))
        && e.retry_after_s
            .is_some_and(|s| s <= RETRY_AFTER_INLINE_S_MAX)
}

fn transport(e: &reqwest::Error) -> HttpError {
    if let Some(r) = crate::egress::refused_in(e) {
        return HttpError::new(HttpErrorKind::Refused(r.rule));
    }
    HttpError::new(if e.is_timeout() {
        HttpErrorKind::Timeout
    } else {
        HttpErrorKind::Transport
    })
}

fn retry_after_of(headers: &HeaderMap) -> Option<f64> {
    let now = crate::clock::Clock::now(&crate::clock::SystemClock);
    headers
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| retry_after::parse(v, now))
}

async fn once(req: RequestBuilder) -> Result<Value, HttpError> {
    let (status, _, body) = read_bounded(req).await?;
    json_of(status, &body)
}

/// Sends and reads the answer within the caps: a 2xx or 304 as (status, headers, body), any
/// other status as an [`HttpError`] with a bounded error body.
async fn read_bounded(req: RequestBuilder) -> Result<(u16, HeaderMap, Vec<u8>), HttpError> {
    let mut resp = req.send().await.map_err(|e| transport(&e))?;
    let status = resp.status().as_u16();
    let retry_after_s = retry_after_of(resp.headers());
    let ok = resp.status().is_success() || status == 304;
    let cap = if ok {
        RESPONSE_BYTES_MAX
    } else {
        ERROR_BODY_BYTES_MAX
    };
    let mut body = Vec::new();
    let mut too_large = false;
    loop {
        match resp.chunk().await {
            Ok(Some(chunk)) => {
                if body.len() + chunk.len() > cap {
                    too_large = true;
                    break;
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => break,
            Err(e) if ok => return Err(transport(&e)),
            // An error answer cut short still has its status; the body is only a hint.
            Err(_) => break,
        }
    }
    if !ok {
        if too_large {
            body.clear();
        }
        return Err(HttpError {
            status: Some(status),
            kind: HttpErrorKind::Status,
            retry_after_s,
            body,
        });
    }
    if too_large {
        return Err(HttpError::new(HttpErrorKind::TooLarge));
    }
    Ok((status, resp.headers().clone(), body))
}

/// A 2xx body as JSON (empty is null); a 304 to a JSON method is not an answer it can use.
fn json_of(status: u16, body: &[u8]) -> Result<Value, HttpError> {
    if status == 304 {
        return Err(HttpError {
            status: Some(304),
            kind: HttpErrorKind::Status,
            retry_after_s: None,
            body: Vec::new(),
        });
    }
    if body.is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_slice(body).map_err(|_| HttpError::new(HttpErrorKind::NotJson))
}

fn lower_headers(h: &HeaderMap) -> BTreeMap<String, String> {
    h.iter()
        .filter_map(|(k, v)| {
            v.to_str()
                .ok()
                .map(|v| (k.as_str().to_ascii_lowercase(), v.to_string()))
        })
        .collect()
}

/// The most of a body searched for an XML declaration's encoding.
const XML_DECL_BYTES_MAX: usize = 256;

/// Decodes a text body: the Content-Type charset, else the XML declaration's encoding, else
/// UTF-8 (a byte order mark wins over both, as WHATWG's decode does). Undecodable bytes
/// become U+FFFD.
pub fn decode_text(body: &[u8], content_type: Option<&str>) -> String {
    let label = content_type
        .and_then(charset_of)
        .or_else(|| xml_declared_encoding(body));
    let encoding = label
        .and_then(|l| encoding_rs::Encoding::for_label(l.as_bytes()))
        .unwrap_or(encoding_rs::UTF_8);
    let (text, _, _) = encoding.decode(body);
    text.into_owned()
}

fn charset_of(content_type: &str) -> Option<String> {
    content_type.split(';').skip(1).find_map(|p| {
        let (k, v) = p.split_once('=')?;
        (k.trim().eq_ignore_ascii_case("charset"))
            .then(|| v.trim().trim_matches('"').to_string())
            .filter(|v| !v.is_empty())
    })
}

/// `<?xml version="1.0" encoding="ISO-8859-1"?>` -> `ISO-8859-1`.
fn xml_declared_encoding(body: &[u8]) -> Option<String> {
    let head = &body[..body.len().min(XML_DECL_BYTES_MAX)];
    let head = String::from_utf8_lossy(head);
    let decl = head.strip_prefix("<?xml")?;
    let decl = &decl[..decl.find("?>")?];
    let at = decl.find("encoding")?;
    let rest = decl[at + "encoding".len()..]
        .trim_start()
        .strip_prefix('=')?;
    let rest = rest.trim_start();
    let quote = rest.chars().next().filter(|c| *c == '"' || *c == '\'')?;
    let value = &rest[1..];
    Some(value[..value.find(quote)?].to_string())
}

/// An answer as read: status, lower-case headers, body.
type Raw = (u16, BTreeMap<String, String>, Vec<u8>);

impl Stub {
    fn answer(
        &self,
        method: &str,
        url: &str,
        headers: &[(String, String)],
    ) -> Result<Raw, HttpError> {
        self.requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(StubRequest {
                method: method.to_string(),
                url: url.to_string(),
                headers: headers.iter().cloned().collect(),
            });
        let next = self
            .answers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop_front()
            .ok_or_else(|| HttpError::new(HttpErrorKind::Transport))?;
        let ok = (200..300).contains(&next.status) || next.status == 304;
        if !ok {
            return Err(HttpError {
                status: Some(next.status),
                kind: HttpErrorKind::Status,
                retry_after_s: next.headers.get("retry-after").and_then(|v| v.parse().ok()),
                body: next.text.into_bytes(),
            });
        }
        let headers = next
            .headers
            .into_iter()
            .map(|(k, v)| (k.to_ascii_lowercase(), v))
            .collect();
        Ok((next.status, headers, next.text.into_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_endpoints_move_the_host_into_the_path_and_keep_the_query() {
        let e = Endpoints::test("http://127.0.0.1:9/");
        let u = e
            .resolve("https://gmail.googleapis.com/gmail/v1/users/me/history?x=1")
            .unwrap();
        assert_eq!(
            u.as_str(),
            "http://127.0.0.1:9/gmail.googleapis.com/gmail/v1/users/me/history?x=1"
        );
        let prod = Endpoints::default();
        assert_eq!(
            prod.resolve("https://oauth2.googleapis.com/token")
                .unwrap()
                .as_str(),
            "https://oauth2.googleapis.com/token"
        );
        assert!(prod.resolve("http://oauth2.googleapis.com/token").is_err());
    }

    /// Issue 35: a provider URL at a refused address (a literal, or a name the system's
    /// resolver answers with loopback) is a config failure naming the rule, and the
    /// listener there sees nothing; the loopback test base is the one exception.
    #[tokio::test]
    async fn a_provider_url_at_a_refused_address_is_config_and_sends_nothing() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let hits = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let h = hits.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                h.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}")
                    .await;
            }
        });
        let http = Http::new(Endpoints::default()).unwrap();
        for url in [
            format!("https://127.0.0.1:{port}/feed"),
            format!("https://localhost:{port}/feed"),
            format!("https://[::ffff:127.0.0.1]:{port}/feed"),
        ] {
            let e = http.get_json(&url, &[], None).await.expect_err("refused");
            assert_eq!(
                e.kind,
                HttpErrorKind::Refused(crate::egress::Rule::Loopback),
                "{url}"
            );
            let err = e.into_error();
            assert_eq!(err.failure, super::super::Failure::Config, "{url}");
            assert!(
                err.reason.contains("egress refused: loopback"),
                "{}",
                err.reason
            );
            let e = http
                .get_text(&url, &TextRequest::default())
                .await
                .expect_err("refused");
            assert_eq!(
                e.kind,
                HttpErrorKind::Refused(crate::egress::Rule::Loopback)
            );
        }
        assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 0);
        // The test base on loopback is admitted (plain http there).
        let test = Http::new(Endpoints::test(&format!("http://127.0.0.1:{port}/"))).unwrap();
        let v = test
            .get_json("https://api.example.com/x", &[], None)
            .await
            .expect("the loopback test base answers");
        assert_eq!(v, serde_json::json!({}));
        assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    #[test]
    fn the_status_mapping() {
        let e = |s| HttpError {
            status: Some(s),
            kind: HttpErrorKind::Status,
            retry_after_s: Some(7.0),
            body: b"SENTINEL-body".to_vec(),
        };
        use super::super::Failure::*;
        for (s, f) in [
            (429, Retryable),
            (500, Retryable),
            (503, Retryable),
            (408, Retryable),
            (401, Config),
            (403, Config),
            (404, Permanent),
            (400, Permanent),
            (302, Permanent),
        ] {
            let err = e(s).into_error();
            assert_eq!(err.failure, f, "{s}");
            assert!(!err.reason.contains("SENTINEL"));
        }
        assert_eq!(e(429).into_error().retry_after_s, Some(7.0));
        assert!(
            !format!("{:?}", e(500)).contains("SENTINEL"),
            "Debug omits the body"
        );
    }
}

/// Helpers for unit tests elsewhere in the crate.
#[cfg(test)]
pub(crate) mod test_support {
    use super::{HttpError, HttpErrorKind};

    /// A status answer with this body (unit tests of provider classification).
    pub fn status_error(status: u16, body: &str) -> HttpError {
        HttpError {
            status: Some(status),
            kind: HttpErrorKind::Status,
            retry_after_s: None,
            body: body.as_bytes().to_vec(),
        }
    }
}
