//! TLS with rustls (ring provider): the client configuration of `https`
//! upstreams and probes ([`client`]), and TLS listeners ([`server`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;

pub mod client;
pub mod pem;
pub mod server;

pub use pem::{certified_key, read_certs, read_key};

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
    vigil_config::read::read_regular_file(path).map_err(|e| TlsError::file(path, e))
}
