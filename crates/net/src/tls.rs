//! TLS with rustls (ring provider): the client configuration of `https`
//! upstreams and probes ([`client`]), and TLS listeners ([`server`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

pub mod client;
pub mod server;

/// Why a TLS configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A certificate or key file could not be used.
    #[error("{}: {message}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// What was wrong with it.
        message: String,
    },
    /// rustls refused the settings.
    #[error("{0}")]
    Rustls(#[from] rustls::Error),
}

impl TlsError {
    /// The file at fault, if the error is about one.
    pub fn path(&self) -> Option<&Path> {
        match self {
            TlsError::File { path, .. } => Some(path),
            TlsError::Rustls(_) => None,
        }
    }

    fn file(path: &Path, message: impl std::fmt::Display) -> Self {
        TlsError::File {
            path: path.to_path_buf(),
            message: message.to_string(),
        }
    }
}

/// The crypto provider every configuration uses.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A file's bytes: a regular file of bounded size only (not a device or FIFO).
fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    vigil_core::config::read::read_regular_file(path).map_err(|e| TlsError::file(path, e))
}

/// The PEM certificates of `path`, at least one.
pub fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::file(path, e))?;
    if certs.is_empty() {
        return Err(TlsError::file(path, "no certificates in the file"));
    }
    Ok(certs)
}
