//! TLS to PostgreSQL with rustls (issue 32), against a throwaway cluster listening on
//! 127.0.0.1 with `ssl = on` and a certificate from a test CA: `sslmode=require` encrypts,
//! `verify-full` with the CA as `sslrootcert` connects and checks the chain and the name,
//! with another CA or another name it refuses, and `disable` stays in the clear.

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};

use hookspool::store::pg::PgStore;

use super::pg::{Cluster, ServerTls};
use super::pg_spool::SENTINEL;

/// A CA (its PEM) and a server certificate for `localhost` it signed (PEM, key PEM).
fn pki() -> (String, ServerTls) {
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
    let key = KeyPair::generate().unwrap();
    let mut leaf = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    leaf.distinguished_name
        .push(DnType::CommonName, "localhost");
    let cert = leaf.signed_by(&key, &issuer).unwrap();
    (
        ca_cert.pem(),
        ServerTls {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        },
    )
}

#[test]
fn tls_is_used_as_the_urls_sslmode_asks_and_verify_full_checks_chain_and_name() {
    let (ca_pem, server) = pki();
    let pg = match Cluster::start_with_tls(server) {
        Ok(c) => c,
        Err(why) => return super::skip::skip_or_fail(&why),
    };
    let tmp = tempfile::tempdir().unwrap();
    let ca = tmp.path().join("ca.pem");
    std::fs::write(&ca, &ca_pem).unwrap();
    let (other_ca, _) = pki();
    let other = tmp.path().join("other-ca.pem");
    std::fs::write(&other, &other_ca).unwrap();

    let tls_of = |url: &str| PgStore::connect(url).map(|mut s| s.session_tls().unwrap());
    assert!(!tls_of(&pg.tcp_url("localhost", "hookspool", "sslmode=disable")).unwrap());
    assert!(tls_of(&pg.tcp_url("localhost", "hookspool", "sslmode=require")).unwrap());
    let verified = format!("sslmode=verify-full&sslrootcert={}", ca.display());
    assert!(tls_of(&pg.tcp_url("localhost", "hookspool", &verified)).unwrap());

    // Another CA, or a name the certificate does not hold: refused, naming the target and
    // never the password.
    let wrong_ca = format!("sslmode=verify-full&sslrootcert={}", other.display());
    let url = pg
        .tcp_url("localhost", "hookspool", &wrong_ca)
        .replace(pg.password(), SENTINEL);
    let e = PgStore::connect(&url).unwrap_err().to_string();
    assert!(e.contains("hookspool@localhost:"), "{e}");
    assert!(e.to_lowercase().contains("certificate"), "{e}");
    assert!(!e.contains(SENTINEL), "{e}");
    let e = PgStore::connect(&pg.tcp_url("127.0.0.1", "hookspool", &verified))
        .unwrap_err()
        .to_string();
    assert!(e.to_lowercase().contains("certificate"), "{e}");
}
