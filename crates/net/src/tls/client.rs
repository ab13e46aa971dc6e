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

/// The host part of a server address as written (`api.internal:8443` →
/// `api.internal`, `[::1]:443` → `::1`, a bare `::1` as it is): what a
/// TLS server name is made of, for the proxy's upstreams and the
/// checker's probes.
pub fn host_of(address: &str) -> &str {
    if let Some(rest) = address.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match address.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) => {
            host
        }
        _ => address,
    }
}

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

#[cfg(test)]
mod tests {
    #[test]
    fn a_server_name_is_the_host_without_port_or_brackets() {
        for (name, host) in [
            ("api.internal:8443", "api.internal"),
            ("api.internal", "api.internal"),
            ("127.0.0.1:80", "127.0.0.1"),
            ("[::1]:443", "::1"),
            ("[::1]", "::1"),
            ("::1", "::1"),
            ("host:http", "host:http"),
        ] {
            assert_eq!(super::host_of(name), host, "{name}");
        }
    }
}
