//! The one TLS client configuration builder (proxy upstreams over
//! `https://`, checker `https` probes) and the one verifier that accepts
//! any certificate (`proxy_ssl_verify off`, `vigil check --tls-no-verify`).

use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::sign::SingleCertAndKey;
use rustls::{ClientConfig, DigitallySignedStruct, SignatureScheme};

use super::{certified_key, provider, read_certs, TlsError};

/// What a TLS client configuration is made of.
#[derive(Clone, Copy, Debug)]
pub struct ClientTls<'a> {
    /// Verify the chain and the name (against the system roots plus
    /// `ca_file`); off: any certificate is accepted (still a real handshake).
    pub verify: bool,
    /// Extra trusted CA certificates (PEM).
    pub ca_file: Option<&'a Path>,
    /// A client certificate chain and its key (PEM), for servers that ask.
    pub client_auth: Option<(&'a Path, &'a Path)>,
}

// === impl ClientTls ===

impl ClientTls<'_> {
    /// The rustls configuration (TLS 1.2 and 1.3, SNI on).
    pub fn build(&self) -> Result<ClientConfig, TlsError> {
        let provider = provider();
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()?;
        let builder = if self.verify {
            let mut roots = rustls::RootCertStore::empty();
            for c in rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(c);
            }
            if let Some(path) = self.ca_file {
                for c in read_certs(path)? {
                    roots.add(c).map_err(|e| TlsError::file(path, e))?;
                }
            }
            builder.with_root_certificates(roots)
        } else {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(NoVerify(provider)))
        };
        match self.client_auth {
            None => Ok(builder.with_no_client_auth()),
            Some((cert, key)) => {
                let certified = certified_key(cert, key)?;
                Ok(builder.with_client_cert_resolver(Arc::new(SingleCertAndKey::from(certified))))
            }
        }
    }
}

/// Verification off: any certificate (signatures are still checked, so
/// the handshake is a real one).
#[derive(Debug)]
pub struct NoVerify(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
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
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
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
