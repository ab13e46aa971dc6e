//! Errors of the checker library (probe failures are results, not errors:
//! see [`ProbeFailure`](crate::ProbeFailure)).

use std::path::PathBuf;

/// Why the checker could not start or apply a configuration.
#[derive(Debug, thiserror::Error)]
pub enum CheckerError {
    /// A TLS file (CA, client certificate or key) could not be used.
    #[error("probe TLS settings: {path}: {message}")]
    TlsFile {
        /// The file.
        path: PathBuf,
        /// What was wrong with it.
        message: String,
    },
    /// rustls refused the TLS settings.
    #[error("probe TLS settings: {0}")]
    Tls(String),
}

impl CheckerError {
    /// Whether the error is about TLS settings.
    pub fn is_tls(&self) -> bool {
        matches!(self, CheckerError::TlsFile { .. } | CheckerError::Tls(_))
    }
}
