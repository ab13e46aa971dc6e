//! Errors of the checker-only mode.

use std::path::PathBuf;

/// What went wrong loading, rendering, testing or reloading.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// The upstreams source file is invalid.
    #[error("upstreams source: {0}")]
    Source(#[from] vigil_config::ConfigError),
    /// A source upstream cannot be rendered to a file (bad name).
    #[error("upstream \"{name}\": {message}")]
    Render {
        /// The upstream.
        name: String,
        /// Why.
        message: String,
    },
    /// The checker could not start or follow the source (TLS settings).
    #[error(transparent)]
    Checker(#[from] crate::CheckerError),
    /// A file could not be written, renamed or read.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A command could not be started or did not finish in time.
    #[error("cannot run `{command}`: {message}")]
    Command {
        /// The command line.
        command: String,
        /// Why.
        message: String,
    },
    /// The test command (`nginx -t`) rejected the rendered files; they were
    /// rolled back.
    #[error("`{command}` rejected the rendered files (rolled back): {output}")]
    TestFailed {
        /// The command line.
        command: String,
        /// Its stderr and stdout.
        output: String,
    },
    /// The reload command failed.
    #[error("`{command}` failed: {output}")]
    ReloadFailed {
        /// The command line.
        command: String,
        /// Its stderr and stdout.
        output: String,
    },
    /// The reload command succeeded but no new worker appeared in time.
    #[error("reload not verified: {0}")]
    ReloadUnverified(String),
}

impl SyncError {
    /// Whether `nginx -t` rejected a render.
    pub fn is_test_failure(&self) -> bool {
        matches!(self, SyncError::TestFailed { .. })
    }

    /// Whether a reload failed or could not be verified.
    pub fn is_reload(&self) -> bool {
        matches!(
            self,
            SyncError::ReloadFailed { .. } | SyncError::ReloadUnverified(_)
        )
    }

    /// Whether the reload ran but its effect was not seen.
    pub fn is_unverified(&self) -> bool {
        matches!(self, SyncError::ReloadUnverified(_))
    }

    /// Whether the source configuration is at fault.
    pub fn is_source(&self) -> bool {
        matches!(self, SyncError::Source(_) | SyncError::Render { .. })
    }

    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        SyncError::Io {
            path: path.into(),
            source,
        }
    }
}
