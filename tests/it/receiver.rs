//! A real HTTP receiver on 127.0.0.1:0 whose answers the test scripts: every request is
//! recorded (headers, body, arrival time); answers come from a queue, else from a default,
//! else from a function of the request.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

#[derive(Debug, Clone)]
#[allow(dead_code)] // arrival time and path are for the end-to-end tests
pub struct Recorded {
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub at: Instant,
    pub path: String,
}

impl Recorded {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
    pub delay: Duration,
}

impl Answer {
    pub fn status(status: u16) -> Answer {
        Answer {
            status,
            headers: vec![],
            body: String::new(),
            delay: Duration::ZERO,
        }
    }
    pub fn header(mut self, k: &str, v: &str) -> Answer {
        self.headers.push((k.into(), v.into()));
        self
    }
    pub fn delay(mut self, d: Duration) -> Answer {
        self.delay = d;
        self
    }
}

type Rule = Arc<dyn Fn(&Recorded) -> Option<Answer> + Send + Sync>;

#[derive(Clone)]
pub struct Receiver {
    pub addr: SocketAddr,
    log: Arc<Mutex<Vec<Recorded>>>,
    queue: Arc<Mutex<VecDeque<Answer>>>,
    rule: Arc<Mutex<Option<Rule>>>,
    default: Arc<Mutex<Answer>>,
}

impl Receiver {
    pub async fn start() -> Receiver {
        Receiver::start_on("127.0.0.1").await
    }

    /// A receiver on another local address (`ip`, port chosen by the kernel).
    pub async fn start_on(ip: &str) -> Receiver {
        let listener = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let r = Receiver {
            addr,
            log: Arc::default(),
            queue: Arc::default(),
            rule: Arc::default(),
            default: Arc::new(Mutex::new(Answer::status(200))),
        };
        let rr = r.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let rr = rr.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req: Request<Incoming>| {
                        let rr = rr.clone();
                        async move { Ok::<_, Infallible>(rr.answer(req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        r
    }

    async fn answer(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        let headers = req
            .headers()
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_string()))
            .collect();
        let path = req.uri().path().to_string();
        let body = req
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes().to_vec())
            .unwrap_or_default();
        let rec = Recorded {
            headers,
            body,
            at: Instant::now(),
            path,
        };
        let queued = self.queue.lock().unwrap().pop_front();
        let ruled = self.rule.lock().unwrap().as_ref().and_then(|f| f(&rec));
        let a = queued
            .or(ruled)
            .unwrap_or_else(|| self.default.lock().unwrap().clone());
        self.log.lock().unwrap().push(rec);
        if !a.delay.is_zero() {
            tokio::time::sleep(a.delay).await;
        }
        let mut resp = Response::builder().status(a.status);
        for (k, v) in &a.headers {
            resp = resp.header(k, v);
        }
        resp.body(Full::new(Bytes::from(a.body))).unwrap()
    }

    pub fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }
    pub fn push(&self, a: Answer) {
        self.queue.lock().unwrap().push_back(a);
    }
    pub fn set_default(&self, a: Answer) {
        *self.default.lock().unwrap() = a;
    }
    pub fn set_rule(&self, f: impl Fn(&Recorded) -> Option<Answer> + Send + Sync + 'static) {
        *self.rule.lock().unwrap() = Some(Arc::new(f));
    }
    pub fn requests(&self) -> Vec<Recorded> {
        self.log.lock().unwrap().clone()
    }
    #[allow(dead_code)] // used by the end-to-end tests
    pub async fn wait_for(&self, n: usize, within: Duration) -> Vec<Recorded> {
        let until = Instant::now() + within;
        while Instant::now() < until {
            let r = self.requests();
            if r.len() >= n {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.requests()
    }
}
