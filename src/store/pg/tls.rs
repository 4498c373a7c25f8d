//! TLS to PostgreSQL with rustls, as the URL's `sslmode` asks (libpq's words):
//!
//! | sslmode | here |
//! | --- | --- |
//! | absent, `disable`, `allow`, `prefer` | no TLS (write `require` or `verify-full` for TLS) |
//! | `require` | TLS; without `sslrootcert` the certificate is not checked (libpq's meaning: encryption only), with it the chain and the host name are |
//! | `verify-ca` | refused: write `verify-full` (rustls always checks the host name) |
//! | `verify-full` | TLS; chain and host name checked against the PEM file `sslrootcert` names |
//!
//! Must not: read a certificate file at any other time than connecting, or accept a
//! `verify-full` without roots.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::super::{Result, StoreError};

/// What the URL asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tls {
    Off,
    /// `sslmode=require` without roots: encrypted, the server's certificate unchecked.
    Encrypt,
    /// Chain and host name checked against the certificates in this PEM file.
    Verify {
        roots: std::path::PathBuf,
    },
}

impl Tls {
    pub fn from_params(mode: Option<&str>, root: Option<&str>) -> Result<Tls> {
        let root = root.filter(|r| !r.is_empty());
        match (mode.unwrap_or("disable"), root) {
            ("disable" | "allow" | "prefer", _) => Ok(Tls::Off),
            ("require", None) => Ok(Tls::Encrypt),
            ("require" | "verify-full", Some("system")) => Err(StoreError::Invalid(
                "sslrootcert=system is not supported; write sslrootcert=/path/to/ca.pem (the PEM certificates that sign the server's)".into(),
            )),
            ("require" | "verify-full", Some(r)) => Ok(Tls::Verify { roots: r.into() }),
            ("verify-full", None) => Err(StoreError::Invalid(
                "sslmode=verify-full needs the certificates to check the server against: add sslrootcert=/path/to/ca.pem to the URL".into(),
            )),
            ("verify-ca", _) => Err(StoreError::Invalid(
                "sslmode=verify-ca is not supported (rustls always checks the host name); write sslmode=verify-full with sslrootcert=/path/to/ca.pem".into(),
            )),
            (other, _) => Err(StoreError::Invalid(format!(
                "sslmode={other} is not a libpq sslmode; write sslmode=disable, require or verify-full"
            ))),
        }
    }

    /// The driver's TLS connector for this mode.
    pub fn connector(&self) -> Result<MakeRustlsConnect> {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| StoreError::Invalid(format!("TLS: {e}")))?;
        let config = match self {
            Tls::Off => {
                return Err(StoreError::Invalid(
                    "no TLS connector for sslmode=disable".into(),
                ));
            }
            Tls::Encrypt => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(EncryptOnly(provider)))
                .with_no_client_auth(),
            Tls::Verify { roots } => {
                let mut store = rustls::RootCertStore::empty();
                let certs = CertificateDer::pem_file_iter(roots).map_err(|e| {
                    StoreError::Invalid(format!(
                        "sslrootcert {} cannot be read: {e}",
                        roots.display()
                    ))
                })?;
                for c in certs {
                    let c = c.map_err(|e| {
                        StoreError::Invalid(format!(
                            "sslrootcert {} is not PEM certificates: {e}",
                            roots.display()
                        ))
                    })?;
                    store.add(c).map_err(|e| {
                        StoreError::Invalid(format!("sslrootcert {}: {e}", roots.display()))
                    })?;
                }
                if store.is_empty() {
                    return Err(StoreError::Invalid(format!(
                        "sslrootcert {} holds no certificate",
                        roots.display()
                    )));
                }
                builder.with_root_certificates(store).with_no_client_auth()
            }
        };
        Ok(MakeRustlsConnect::new(config))
    }
}

/// libpq's `sslmode=require` without roots: the channel is encrypted and the handshake's
/// signatures are checked, but the certificate is taken as it comes.
#[derive(Debug)]
struct EncryptOnly(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for EncryptOnly {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_sslmode_maps_as_the_table_says() {
        assert_eq!(Tls::from_params(None, None).unwrap(), Tls::Off);
        assert_eq!(Tls::from_params(Some("prefer"), None).unwrap(), Tls::Off);
        assert_eq!(
            Tls::from_params(Some("require"), None).unwrap(),
            Tls::Encrypt
        );
        assert_eq!(
            Tls::from_params(Some("verify-full"), Some("/ca.pem")).unwrap(),
            Tls::Verify {
                roots: "/ca.pem".into()
            }
        );
        for (mode, root, says) in [
            ("verify-full", None, "sslrootcert="),
            ("verify-ca", Some("/ca.pem"), "sslmode=verify-full"),
            ("bogus", None, "sslmode=disable, require or verify-full"),
        ] {
            let e = Tls::from_params(Some(mode), root).unwrap_err().to_string();
            assert!(e.contains(says), "{mode}: {e}");
        }
        assert!(Tls::Encrypt.connector().is_ok());
        assert!(
            Tls::Verify {
                roots: "/nonexistent/ca.pem".into()
            }
            .connector()
            .is_err()
        );
    }
}
