//! The HTTP ceiling of the intake benchmark (issue 36): a bare hyper HTTP/1 server on the
//! same runtime shape as `hookspool intake` (tokio, `intake.threads` workers) that reads
//! each request's body, checks its `X-Signature: sha256=<hex>` HMAC with the bench
//! source's secret (the same `mac_hex` and constant-time comparison the intake uses),
//! and answers 200 `{"ok":true}`: no config, no routing, no JSON parse, no secret file read
//! per request, no store. What wrk gets from it on this machine is what the intake could
//! get if storing cost nothing.
//!
//! `bench_ceiling <port>`: serves 127.0.0.1:<port> until killed. `bench_intake pair` starts
//! it beside the intake runs, with the same wrk, script and bodies.

mod common;

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

use hookspool::sources::verify::{MacAlg, ct_eq, mac_hex};

/// Worker threads, as `intake.threads` defaults to.
const THREADS: usize = 4;

async fn answer(req: Request<hyper::body::Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let sig = req
        .headers()
        .get("x-signature")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("sha256="))
        .map(str::to_owned);
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => return Ok(status(StatusCode::BAD_REQUEST)),
    };
    let expected = mac_hex(MacAlg::Sha256, common::SOURCE_SECRET.as_bytes(), &[&body]);
    let ok = sig.is_some_and(|s| ct_eq(s.as_bytes(), expected.as_bytes()));
    Ok(if ok {
        Response::new(Full::new(Bytes::from_static(b"{\"ok\":true}")))
    } else {
        status(StatusCode::UNAUTHORIZED)
    })
}

fn status(code: StatusCode) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::new()));
    *r.status_mut() = code;
    r
}

fn main() -> Result<(), common::BoxError> {
    let port: u16 = std::env::args()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .ok_or("usage: bench_ceiling <port>")?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(THREADS)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
        loop {
            let (stream, _) = listener.accept().await?;
            tokio::spawn(async move {
                // A connection wrk closes at the end of its run ends here; nothing to report.
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service_fn(answer))
                    .await;
            });
        }
    })
}
