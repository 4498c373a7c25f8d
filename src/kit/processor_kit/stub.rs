//! The processor row's stub provider API: a real HTTP/1 server on 127.0.0.1:0, on its own
//! thread and runtime, that answers from kit.toml's `[[stub.answer]]` list. The runtime
//! reaches it through `Endpoints::stub`, which turns `https://<host>/<path>` into
//! `<base>/<host>/<path>`. Each request takes the first answer in order whose method, host,
//! path and query match ([`matches`]) and that is unused or `repeat`; one that matches
//! nothing gets a 501 and is remembered for the row's findings.
//!
//! Must not: bind anything but loopback, or keep a request body.

use std::convert::Infallible;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

use crate::kit::capture::StubAnswer;

/// The answer to a request no `[[stub.answer]]` matches.
const UNANSWERED_STATUS: u16 = 501;

/// One request as the row reports it: no body, no header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Seen {
    pub method: String,
    pub host: String,
    pub path: String,
    pub query: Vec<(String, String)>,
}

struct Slot {
    id: usize,
    answer: StubAnswer,
    used: bool,
}

#[derive(Default)]
struct Inner {
    slots: Vec<Slot>,
    next_id: usize,
    seen: Vec<Seen>,
    unanswered: Vec<Seen>,
}

pub(super) struct StubServer {
    pub base: String,
    inner: Arc<Mutex<Inner>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl StubServer {
    pub fn start(answers: Vec<StubAnswer>) -> std::io::Result<StubServer> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let base = format!("http://{}", listener.local_addr()?);
        let mut inner = Inner::default();
        for answer in answers {
            let id = inner.next_id;
            inner.next_id += 1;
            inner.slots.push(Slot {
                id,
                answer,
                used: false,
            });
        }
        let inner = Arc::new(Mutex::new(inner));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let shared = inner.clone();
        let thread = std::thread::spawn(move || {
            rt.block_on(serve(listener, shared, stopped));
        });
        Ok(StubServer {
            base,
            inner,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every request so far, in order.
    pub fn requests(&self) -> Vec<Seen> {
        self.lock().seen.clone()
    }

    /// The requests no answer matched, each (method, host, path) once.
    pub fn unanswered(&self) -> Vec<Seen> {
        let mut out: Vec<Seen> = Vec::new();
        for s in &self.lock().unanswered {
            if !out
                .iter()
                .any(|o| (&o.method, &o.host, &o.path) == (&s.method, &s.host, &s.path))
            {
                out.push(s.clone());
            }
        }
        out
    }

    /// Puts `answer` before every other, for one use; returns its id.
    pub fn push_first(&self, mut answer: StubAnswer) -> usize {
        answer.repeat = false;
        let mut inner = self.lock();
        let id = inner.next_id;
        inner.next_id += 1;
        inner.slots.insert(
            0,
            Slot {
                id,
                answer,
                used: false,
            },
        );
        id
    }

    pub fn was_used(&self, id: usize) -> bool {
        self.lock().slots.iter().any(|s| s.id == id && s.used)
    }

    /// Removes an answer that was never used (so it cannot answer a later run).
    pub fn forget(&self, id: usize) {
        self.lock().slots.retain(|s| s.id != id);
    }
}

impl Drop for StubServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            // The server may have ended already; then there is nobody to tell.
            stop.send(()).ok();
        }
        if let Some(t) = self.thread.take() {
            // A panic in the server thread has already shown in the row's findings.
            t.join().ok();
        }
    }
}

async fn serve(
    listener: std::net::TcpListener,
    inner: Arc<Mutex<Inner>>,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
        return;
    };
    loop {
        let stream = tokio::select! {
            _ = &mut stopped => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(_) => continue,
            },
        };
        let inner = inner.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req: Request<Incoming>| {
                let inner = inner.clone();
                async move { Ok::<_, Infallible>(answer(&inner, &req)) }
            });
            // A connection the runtime drops mid-request is its own failure to report.
            hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await
                .ok();
        });
    }
}

/// `/<host>/<path>` and the query, as `Endpoints::stub` wrote them.
fn seen(req: &Request<Incoming>) -> Seen {
    let full = req.uri().path();
    let rest = full.trim_start_matches('/');
    let (host, path) = match rest.split_once('/') {
        Some((h, p)) => (h.to_string(), format!("/{p}")),
        None => (rest.to_string(), "/".to_string()),
    };
    let query = req
        .uri()
        .query()
        .map(|q| {
            form_urlencoded::parse(q.as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect()
        })
        .unwrap_or_default();
    Seen {
        method: req.method().to_string(),
        host,
        path,
        query,
    }
}

fn answer(inner: &Mutex<Inner>, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let s = seen(req);
    let mut inner = inner.lock().unwrap_or_else(|p| p.into_inner());
    inner.seen.push(s.clone());
    let found = inner
        .slots
        .iter_mut()
        .find(|slot| (slot.answer.repeat || !slot.used) && matches(&slot.answer, &s));
    let Some(slot) = found else {
        inner.unanswered.push(s);
        return respond(UNANSWERED_STATUS, &Default::default(), None);
    };
    slot.used = true;
    let a = slot.answer.clone();
    respond(a.status, &a.headers, a.body.as_ref())
}

fn respond(
    status: u16,
    headers: &std::collections::BTreeMap<String, String>,
    body: Option<&toml::Value>,
) -> Response<Full<Bytes>> {
    let bytes = body
        .and_then(|b| serde_json::to_vec(b).ok())
        .unwrap_or_default();
    let mut resp = Response::builder().status(status);
    if body.is_some()
        && !headers
            .keys()
            .any(|k| k.eq_ignore_ascii_case("content-type"))
    {
        resp = resp.header("content-type", "application/json");
    }
    for (k, v) in headers {
        resp = resp.header(k, v);
    }
    resp.body(Full::new(Bytes::from(bytes)))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

/// Whether `a` answers `s`: the method (case-insensitive), the host when given, the path
/// exactly, and every `query` pair among the request's.
pub(super) fn matches(a: &StubAnswer, s: &Seen) -> bool {
    a.method.eq_ignore_ascii_case(&s.method)
        && a.host.as_deref().is_none_or(|h| h == s.host)
        && a.path == s.path
        && a.query
            .iter()
            .all(|(k, v)| s.query.iter().any(|(qk, qv)| qk == k && qv == v))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(text: &str) -> StubAnswer {
        toml::from_str(text).unwrap()
    }

    fn seen(method: &str, host: &str, path: &str, query: &[(&str, &str)]) -> Seen {
        Seen {
            method: method.into(),
            host: host.into(),
            path: path.into(),
            query: query
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    #[test]
    fn an_answer_matches_method_host_path_and_its_query_pairs() {
        let a = answer(
            "host = \"gmail.googleapis.com\"\npath = \"/h\"\nquery = { startHistoryId = \"1\" }\n",
        );
        assert_eq!((a.method.as_str(), a.status), ("GET", 200));
        assert!(matches(
            &a,
            &seen(
                "get",
                "gmail.googleapis.com",
                "/h",
                &[("startHistoryId", "1"), ("maxResults", "500")]
            )
        ));
        assert!(!matches(
            &a,
            &seen(
                "GET",
                "gmail.googleapis.com",
                "/h",
                &[("startHistoryId", "2")]
            )
        ));
        assert!(!matches(
            &a,
            &seen("GET", "other.example", "/h", &[("startHistoryId", "1")])
        ));
        assert!(!matches(
            &a,
            &seen(
                "POST",
                "gmail.googleapis.com",
                "/h",
                &[("startHistoryId", "1")]
            )
        ));
        let any_host = answer("path = \"/h\"\n");
        assert!(matches(&any_host, &seen("GET", "x", "/h", &[])));
    }
}
