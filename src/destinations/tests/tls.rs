//! TLS against a local CA made with rcgen and a real rustls server: a certificate the
//! configured roots vouch for is delivered; an untrusted or misnamed one is `config`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use super::delivery;
use super::verify::sw_verify;
use crate::destinations::http::StaticSecrets;

const TLS_SECRET: &str = "whsec_dGxzLXNlY3JldC10bHMtc2VjcmV0LXRscy0h";
use crate::destinations::outcome::{Klass, OutcomeKind};
use crate::destinations::{HttpConfig, HttpDestination, TlsRoots};

struct Pki {
    ca_pem: String,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
}

/// A CA and a leaf for `names`, signed by it.
fn pki(names: &[&str]) -> Pki {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "hookspool test CA");
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let leaf_key = KeyPair::generate().unwrap();
    let mut leaf =
        CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
    leaf.distinguished_name
        .push(DnType::CommonName, "hookspool test receiver");
    let leaf_cert = leaf.signed_by(&leaf_key, &issuer).unwrap();
    Pki {
        ca_pem: ca_cert.pem(),
        chain: vec![leaf_cert.der().clone()],
        key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der())),
    }
}

/// A blocking rustls HTTP/1.1 server on 127.0.0.1:0 answering 200 to every request it can
/// read; counts the requests that completed a handshake and got an answer.
fn tls_server(pki: &Pki) -> (SocketAddr, Arc<AtomicUsize>, Arc<std::sync::Mutex<Vec<u8>>>) {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(pki.chain.clone(), pki.key.clone_key())
        .unwrap();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    let cfg = Arc::new(cfg);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let served = Arc::new(AtomicUsize::new(0));
    let last = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (s2, l2) = (served.clone(), last.clone());
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(tcp) = stream else { return };
            let (cfg, served, last) = (cfg.clone(), s2.clone(), l2.clone());
            std::thread::spawn(move || {
                let Ok(conn) = rustls::ServerConnection::new(cfg) else {
                    return;
                };
                let mut tls = rustls::StreamOwned::new(conn, tcp);
                let mut req = Vec::new();
                let mut buf = [0u8; 8192];
                // Read the head, then Content-Length bytes of body.
                loop {
                    match tls.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => req.extend_from_slice(&buf[..n]),
                    }
                    if let Some(end) = req.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&req[..end]).to_ascii_lowercase();
                        let len: usize = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse().ok())
                            .unwrap_or(0);
                        if req.len() >= end + 4 + len {
                            *last.lock().unwrap() = req.clone();
                            break;
                        }
                    }
                }
                let _ = tls.write_all(
                    b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}",
                );
                let _ = tls.flush();
                served.fetch_add(1, Ordering::SeqCst);
                tls.conn.send_close_notify();
                let _ = tls.flush();
            });
        }
    });
    (addr, served, last)
}

/// The tests' TLS receivers listen on 127.0.0.1, which the egress policy admits here
/// explicitly, as a deployment's `allow_private` would.
fn dest(url: String, roots: TlsRoots) -> HttpDestination {
    HttpDestination::new(
        HttpConfig {
            allow_private: crate::egress::Allow::Blocks(vec!["127.0.0.1/32".parse().unwrap()]),
            ..HttpConfig::new(url)
        },
        Arc::new(StaticSecrets(vec![TLS_SECRET.as_bytes().to_vec()])),
        roots,
    )
    .unwrap()
}

#[tokio::test]
async fn trusted_certificate_delivers() {
    let p = pki(&["localhost", "127.0.0.1"]);
    let (addr, served, last) = tls_server(&p);
    let d = dest(
        format!("https://127.0.0.1:{}/in", addr.port()),
        TlsRoots::Only(p.ca_pem.clone().into_bytes()),
    );
    let o = d.deliver(&delivery("{\"tls\": true}")).await;
    assert_eq!(o.kind, OutcomeKind::Ok, "{o:?}");
    assert_eq!(served.load(Ordering::SeqCst), 1);
    // The request that crossed TLS is signed like any other.
    let raw = last.lock().unwrap().clone();
    let text = String::from_utf8(raw).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let headers: Vec<(String, String)> = head
        .lines()
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let rec = super::receiver::Recorded {
        method: "POST".into(),
        path: "/in".into(),
        query: None,
        headers,
        body: body.as_bytes().to_vec(),
    };
    sw_verify(TLS_SECRET, &rec).unwrap();

    // Merge mode (platform roots plus the CA) trusts it too.
    let merged = dest(
        format!("https://127.0.0.1:{}/in", addr.port()),
        TlsRoots::Merge(p.ca_pem.into_bytes()),
    );
    let o = merged.deliver(&delivery("{}")).await;
    assert_eq!(o.kind, OutcomeKind::Ok, "{o:?}");
}

#[tokio::test]
async fn untrusted_or_misnamed_certificate_is_config() {
    let p = pki(&["localhost", "127.0.0.1"]);
    let (addr, served, _) = tls_server(&p);
    let url = format!("https://127.0.0.1:{}/in", addr.port());
    let other_ca = pki(&["localhost"]).ca_pem.into_bytes();
    for roots in [TlsRoots::Only(other_ca), TlsRoots::Platform] {
        let o = dest(url.clone(), roots.clone())
            .deliver(&delivery("{}"))
            .await;
        assert_eq!(
            (o.kind, o.klass),
            (OutcomeKind::Retry, Some(Klass::Config)),
            "{roots:?}: {o:?}"
        );
        assert_eq!(o.reason, "tls certificate rejected");
    }
    let misnamed = pki(&["receiver.example"]);
    let (addr2, _, _) = tls_server(&misnamed);
    let o = dest(
        format!("https://127.0.0.1:{}/in", addr2.port()),
        TlsRoots::Only(misnamed.ca_pem.into_bytes()),
    )
    .deliver(&delivery("{}"))
    .await;
    assert_eq!(
        (o.klass, o.reason.as_str()),
        (Some(Klass::Config), "tls certificate rejected"),
        "{o:?}"
    );
    assert_eq!(
        served.load(Ordering::SeqCst),
        0,
        "nothing was sent over an unverified connection"
    );
}

#[test]
fn a_bad_ca_bundle_is_a_build_error() {
    let r = HttpDestination::new(
        HttpConfig::new("https://127.0.0.1:1/"),
        Arc::new(StaticSecrets(vec![])),
        TlsRoots::Only(b"not pem".to_vec()),
    );
    assert!(r.is_err());
}
