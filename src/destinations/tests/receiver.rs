//! Real receivers on 127.0.0.1:0 for the destination tests: a hyper server whose answers the
//! test scripts and which records every request, plus raw TCP servers that stall or drip.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// One request as the receiver saw it.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub query: Option<String>,
    /// Lowercase names, in arrival order (repeated names kept).
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Recorded {
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn count(&self, name: &str) -> usize {
        let name = name.to_ascii_lowercase();
        self.headers.iter().filter(|(k, _)| *k == name).count()
    }
}

/// A scripted answer.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub delay: Duration,
}

impl Reply {
    pub fn status(status: u16) -> Reply {
        Reply {
            status,
            headers: Vec::new(),
            body: Vec::new(),
            delay: Duration::ZERO,
        }
    }

    pub fn json(status: u16, body: &str) -> Reply {
        Reply {
            body: body.as_bytes().to_vec(),
            ..Reply::status(status)
        }
        .header("content-type", "application/json")
    }

    pub fn header(mut self, k: &str, v: &str) -> Reply {
        self.headers.push((k.into(), v.into()));
        self
    }

    pub fn after(mut self, d: Duration) -> Reply {
        self.delay = d;
        self
    }
}

struct State {
    script: VecDeque<Reply>,
    requests: Vec<Recorded>,
    connections: usize,
}

/// The scripted hyper receiver. Answers queued replies in order, then 200 `{}`.
pub struct Receiver {
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
    task: JoinHandle<()>,
}

impl Receiver {
    pub async fn start(replies: Vec<Reply>) -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State {
            script: replies.into(),
            requests: Vec::new(),
            connections: 0,
        }));
        let st = state.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                st.lock().unwrap().connections += 1;
                let st = st.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req: Request<Incoming>| {
                        let st = st.clone();
                        async move { Ok::<_, Infallible>(answer(st, req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Receiver { addr, state, task }
    }

    pub fn url(&self, path_and_query: &str) -> String {
        format!("http://{}{}", self.addr, path_and_query)
    }

    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn push(&self, r: Reply) {
        self.state.lock().unwrap().script.push_back(r);
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.state.lock().unwrap().requests.clone()
    }

    /// TCP connections accepted so far.
    pub fn connections(&self) -> usize {
        self.state.lock().unwrap().connections
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn answer(st: Arc<Mutex<State>>, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes().to_vec())
        .unwrap_or_default();
    let rec = Recorded {
        method: parts.method.to_string(),
        path: parts.uri.path().to_string(),
        query: parts.uri.query().map(str::to_owned),
        headers: parts
            .headers
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str().to_string(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect(),
        body,
    };
    let reply = {
        let mut s = st.lock().unwrap();
        s.requests.push(rec);
        s.script
            .pop_front()
            .unwrap_or_else(|| Reply::json(200, "{}"))
    };
    if !reply.delay.is_zero() {
        tokio::time::sleep(reply.delay).await;
    }
    let mut resp = Response::builder().status(reply.status);
    for (k, v) in &reply.headers {
        resp = resp.header(k, v);
    }
    resp.body(Full::new(Bytes::from(reply.body))).unwrap()
}

/// How a raw receiver misbehaves.
#[derive(Debug, Clone, Copy)]
pub enum Stall {
    /// Accept, read the request, never answer.
    Silent,
    /// Answer a status line and headers, then drip the body one byte per `DRIP_EVERY`.
    DripBody,
    /// Drip the status line itself.
    DripHead,
}

pub const DRIP_EVERY: Duration = Duration::from_millis(50);

/// A raw TCP server on 127.0.0.1:0 that misbehaves as told. Returns its address and the task.
pub async fn stalling(mode: Stall) -> (SocketAddr, JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                let _ = s.read(&mut buf).await;
                match mode {
                    Stall::Silent => tokio::time::sleep(Duration::from_secs(3600)).await,
                    Stall::DripBody => {
                        let head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100000\r\n\r\n";
                        if s.write_all(head).await.is_err() {
                            return;
                        }
                        loop {
                            if s.write_all(b" ").await.is_err() {
                                return;
                            }
                            tokio::time::sleep(DRIP_EVERY).await;
                        }
                    }
                    Stall::DripHead => {
                        for b in b"HTTP/1.1 200 OK\r\nx-slow: "
                            .iter()
                            .chain(std::iter::repeat(&b'a'))
                        {
                            if s.write_all(&[*b]).await.is_err() {
                                return;
                            }
                            tokio::time::sleep(DRIP_EVERY).await;
                        }
                    }
                }
            });
        }
    });
    (addr, task)
}
