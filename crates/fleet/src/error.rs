//! The fleet's errors.

use std::path::PathBuf;

/// Why the fleet cannot start or a session with etcd ended.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    /// A setting is wrong (`what` names it).
    #[error("fleet: {what}: {why}")]
    Invalid {
        /// The setting (`--fleet-etcd`, `fleet.ttl`, ...).
        what: &'static str,
        /// What is wrong with it.
        why: String,
    },
    /// A TLS or password file cannot be read.
    #[error("fleet: cannot read {what} {path}: {source}")]
    File {
        /// Which file (`etcd CA`, `etcd client certificate`, ...).
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// An etcd call failed.
    #[error("fleet: etcd {op}: {source}")]
    Etcd {
        /// What was being done (`lease grant`, `put member key`, ...).
        op: &'static str,
        /// The client's error.
        #[source]
        source: etcd_client::Error,
    },
    /// An etcd call did not answer in time (etcd is slow or unreachable).
    #[error("fleet: etcd {op}: no answer within {ms} ms")]
    Slow {
        /// What was being done.
        op: &'static str,
        /// The bound, in milliseconds.
        ms: u128,
    },
    /// The session with etcd ended for another reason (a stream closed,
    /// the lease expired, our member key vanished).
    #[error("fleet: {0}")]
    Lost(String),
}

impl FleetError {
    pub(crate) fn invalid(what: &'static str, why: impl Into<String>) -> Self {
        Self::Invalid {
            what,
            why: why.into(),
        }
    }
}
