//! rustls client configuration for each sslmode (ring provider).
//!
//! - prefer/require: encryption only. Any certificate is accepted, but the
//!   handshake signatures are still verified, so the peer must hold the key of
//!   the certificate it presented (libpq's behaviour without a root cert).
//! - require with `sslrootcert`: as verify-ca, as libpq does when a root CA
//!   file is given (review A1).
//! - verify-ca: the chain must lead to a root in `sslrootcert`; the host name
//!   is not checked.
//! - verify-full: chain as above and the certificate must name the host.

use std::path::Path;
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::ParsedCertificate;
use rustls::{
    ClientConfig, DigitallySignedStruct, Error as TlsError, RootCertStore, SignatureScheme,
};

use super::config::{SslMode, TlsSettings};

/// Why a TLS client configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TlsConfigError {
    #[error("cannot read sslrootcert {path}: {source}")]
    ReadRoot {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("sslrootcert {path} contains no usable certificate")]
    NoRoots { path: String },
    #[error("TLS setup: {0}")]
    Rustls(String),
}

/// RFC 5929 `tls-server-end-point` channel-binding data: the hash of the
/// server's certificate (DER) with the hash function of the certificate's
/// signature algorithm, SHA-256 when that is MD5 or SHA-1. `None` when the
/// algorithm defines no such hash (e.g. Ed25519, RSASSA-PSS) or the
/// certificate cannot be parsed: then there is nothing to bind to.
pub(crate) fn tls_server_end_point(cert: &[u8]) -> Option<Vec<u8>> {
    use sha2::Digest;
    use x509_cert::der::Decode;
    use x509_cert::der::oid::ObjectIdentifier as Oid;
    const SHA256: [Oid; 5] = [
        Oid::new_unwrap("1.2.840.113549.1.1.4"), // md5WithRSAEncryption
        Oid::new_unwrap("1.2.840.113549.1.1.5"), // sha1WithRSAEncryption
        Oid::new_unwrap("1.2.840.113549.1.1.11"), // sha256WithRSAEncryption
        Oid::new_unwrap("1.2.840.10045.4.1"),    // ecdsa-with-SHA1
        Oid::new_unwrap("1.2.840.10045.4.3.2"),  // ecdsa-with-SHA256
    ];
    const SHA384: [Oid; 2] = [
        Oid::new_unwrap("1.2.840.113549.1.1.12"), // sha384WithRSAEncryption
        Oid::new_unwrap("1.2.840.10045.4.3.3"),   // ecdsa-with-SHA384
    ];
    const SHA512: [Oid; 2] = [
        Oid::new_unwrap("1.2.840.113549.1.1.13"), // sha512WithRSAEncryption
        Oid::new_unwrap("1.2.840.10045.4.3.4"),   // ecdsa-with-SHA512
    ];
    let oid = x509_cert::Certificate::from_der(cert)
        .ok()?
        .signature_algorithm
        .oid;
    if SHA256.contains(&oid) {
        Some(sha2::Sha256::digest(cert).to_vec())
    } else if SHA384.contains(&oid) {
        Some(sha2::Sha384::digest(cert).to_vec())
    } else if SHA512.contains(&oid) {
        Some(sha2::Sha512::digest(cert).to_vec())
    } else {
        None
    }
}

/// The client configuration for `settings`, or `None` for sslmode=disable.
pub(crate) fn client_config(
    settings: &TlsSettings,
) -> Result<Option<Arc<ClientConfig>>, TlsConfigError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsConfigError::Rustls(e.to_string()))?;
    let verifier: Arc<dyn ServerCertVerifier> = match settings.mode {
        SslMode::Disable => return Ok(None),
        SslMode::Prefer => Arc::new(WithoutHostName {
            roots: None,
            algorithms: provider.signature_verification_algorithms,
        }),
        SslMode::Require if settings.root_cert.is_none() => Arc::new(WithoutHostName {
            roots: None,
            algorithms: provider.signature_verification_algorithms,
        }),
        SslMode::Require | SslMode::VerifyCa => Arc::new(WithoutHostName {
            roots: Some(Arc::new(load_roots(settings)?)),
            algorithms: provider.signature_verification_algorithms,
        }),
        SslMode::VerifyFull => {
            WebPkiServerVerifier::builder_with_provider(Arc::new(load_roots(settings)?), provider)
                .build()
                .map_err(|e| TlsConfigError::Rustls(e.to_string()))?
        }
    };
    let config = builder
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    Ok(Some(Arc::new(config)))
}

fn load_roots(settings: &TlsSettings) -> Result<RootCertStore, TlsConfigError> {
    // The config parser guarantees a root cert for the verifying modes.
    let path = settings.root_cert.as_deref().unwrap_or(Path::new(""));
    let shown = path.display().to_string();
    let pem = std::fs::read(path).map_err(|source| TlsConfigError::ReadRoot {
        path: shown.clone(),
        source,
    })?;
    let mut roots = RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
        let cert = cert.map_err(|source| TlsConfigError::ReadRoot {
            path: shown.clone(),
            source,
        })?;
        roots
            .add(cert)
            .map_err(|e| TlsConfigError::Rustls(format!("sslrootcert {shown}: {e}")))?;
    }
    if roots.is_empty() {
        return Err(TlsConfigError::NoRoots { path: shown });
    }
    Ok(roots)
}

/// prefer/require and verify-ca: the handshake must be signed by the key of
/// the certificate presented; with `roots` (verify-ca) that certificate's
/// chain must also reach one of them. The host name is never checked here
/// (verify-full uses rustls' own verifier).
#[derive(Debug)]
struct WithoutHostName {
    roots: Option<Arc<RootCertStore>>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for WithoutHostName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, TlsError> {
        if let Some(roots) = &self.roots {
            let cert = ParsedCertificate::try_from(end_entity)?;
            rustls::client::verify_server_cert_signed_by_trust_anchor(
                &cert,
                roots,
                intermediates,
                now,
                self.algorithms.all,
            )?;
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, TlsError> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, TlsError> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn disable_has_no_tls_config() {
        let s = TlsSettings {
            mode: SslMode::Disable,
            root_cert: None,
        };
        assert!(client_config(&s).unwrap().is_none());
    }

    #[test]
    fn encryption_only_modes_need_no_roots() {
        for mode in [SslMode::Prefer, SslMode::Require] {
            let s = TlsSettings {
                mode,
                root_cert: None,
            };
            assert!(client_config(&s).unwrap().is_some());
        }
    }

    #[test]
    fn require_with_a_root_file_verifies_the_chain() {
        // Read as verify-ca: an unreadable root file is an error, as it is
        // there (libpq reads it too).
        let s = TlsSettings {
            mode: SslMode::Require,
            root_cert: Some(PathBuf::from("/nonexistent/ca.pem")),
        };
        assert!(matches!(
            client_config(&s),
            Err(TlsConfigError::ReadRoot { .. })
        ));
    }

    #[test]
    fn missing_or_empty_root_file_is_an_error() {
        let s = TlsSettings {
            mode: SslMode::VerifyFull,
            root_cert: Some(PathBuf::from("/nonexistent/ca.pem")),
        };
        assert!(matches!(
            client_config(&s),
            Err(TlsConfigError::ReadRoot { .. })
        ));
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let s = TlsSettings {
            mode: SslMode::VerifyCa,
            root_cert: Some(empty),
        };
        assert!(matches!(
            client_config(&s),
            Err(TlsConfigError::NoRoots { .. })
        ));
    }
}
