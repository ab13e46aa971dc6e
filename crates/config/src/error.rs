//! Configuration errors: each names where (file, line, column, or the
//! TOML field path) and what was found versus expected.

use std::path::PathBuf;

use crate::nginx::syntax::SyntaxError;

/// A configuration that cannot be used. Nothing is started on one.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// nginx.conf grammar error.
    #[error(transparent)]
    Syntax(#[from] SyntaxError),
    /// A directive or setting with a bad value, in the wrong place, or not supported.
    #[error("{at}: {message}")]
    Invalid {
        /// `file:line:col` or `file: field.path`.
        at: String,
        /// What was found and what was expected.
        message: String,
    },
    /// TOML that does not parse or does not fit the schema.
    #[error("{}: {message}", path.display())]
    Toml {
        /// The file.
        path: PathBuf,
        /// The TOML parser's message (it carries line and column).
        message: String,
    },
}

impl ConfigError {
    pub(crate) fn invalid(at: impl std::fmt::Display, message: impl Into<String>) -> Self {
        ConfigError::Invalid {
            at: at.to_string(),
            message: message.into(),
        }
    }
}
