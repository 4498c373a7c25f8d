//! A stub provider API for the processor tests: a real HTTP/1 server on 127.0.0.1:0, on its
//! own thread and runtime (the tests block on the real binary), that records every request
//! (method, path, decoded query, headers, body) and answers through the test's handler.
//! The runtime reaches it through HOOKSPOOL_TEST_PROVIDER_BASE, which turns
//! `https://<host>/<path>` into `<base>/<host>/<path>`. The answer shapes each handler gives
//! name the Google reference page they follow, in the test that builds them.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

#[derive(Debug, Clone)]
pub struct Req {
    pub method: String,
    /// With the host as its first segment: `/gmail.googleapis.com/gmail/v1/...`.
    pub path: String,
    pub query: Vec<(String, String)>,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Req {
    pub fn q(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    pub fn bearer(&self) -> Option<&str> {
        self.header("authorization")
            .and_then(|v| v.strip_prefix("Bearer "))
    }
    /// The form fields of an x-www-form-urlencoded body.
    pub fn form(&self, name: &str) -> Option<String> {
        form_urlencoded::parse(&self.body)
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.into_owned())
    }
}

#[derive(Debug, Clone)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Resp {
    pub fn json(status: u16, v: serde_json::Value) -> Resp {
        Resp {
            status,
            headers: vec![("content-type".into(), "application/json".into())],
            body: v.to_string(),
        }
    }
    pub fn header(mut self, k: &str, v: &str) -> Resp {
        self.headers.push((k.into(), v.into()));
        self
    }
}

type Handler = Arc<dyn Fn(&Req) -> Resp + Send + Sync>;

#[derive(Clone)]
pub struct Stub {
    pub base: String,
    log: Arc<Mutex<Vec<Req>>>,
    handler: Arc<Mutex<Handler>>,
}

impl Stub {
    pub fn start(handler: impl Fn(&Req) -> Resp + Send + Sync + 'static) -> Stub {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let stub = Stub {
            base,
            log: Arc::default(),
            handler: Arc::new(Mutex::new(Arc::new(handler))),
        };
        let s = stub.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        continue;
                    };
                    let s = s.clone();
                    tokio::spawn(async move {
                        let svc = service_fn(move |req: Request<Incoming>| {
                            let s = s.clone();
                            async move { Ok::<_, Infallible>(s.answer(req).await) }
                        });
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), svc)
                            .await;
                    });
                }
            });
        });
        stub
    }

    async fn answer(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        let method = req.method().to_string();
        let path = req.uri().path().to_string();
        let query = req
            .uri()
            .query()
            .map(|q| {
                form_urlencoded::parse(q.as_bytes())
                    .map(|(k, v)| (k.into_owned(), v.into_owned()))
                    .collect()
            })
            .unwrap_or_default();
        let headers = req
            .headers()
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_string()))
            .collect();
        let body = req
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes().to_vec())
            .unwrap_or_default();
        let r = Req {
            method,
            path,
            query,
            headers,
            body,
        };
        let handler = self.handler.lock().unwrap().clone();
        let a = handler(&r);
        self.log.lock().unwrap().push(r);
        let mut resp = Response::builder().status(a.status);
        for (k, v) in &a.headers {
            resp = resp.header(k, v);
        }
        resp.body(Full::new(Bytes::from(a.body))).unwrap()
    }

    pub fn requests(&self) -> Vec<Req> {
        self.log.lock().unwrap().clone()
    }

    /// Requests whose path ends with `suffix`.
    pub fn count(&self, suffix: &str) -> usize {
        self.requests()
            .iter()
            .filter(|r| r.path.ends_with(suffix))
            .count()
    }

    pub fn clear(&self) {
        self.log.lock().unwrap().clear();
    }
}
