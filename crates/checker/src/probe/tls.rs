//! TLS for `https` probes: rustls with verification on by default (system
//! roots plus an optional CA file), SNI from the server's host name, and an
//! optional client certificate.
//!
//! The check model (`CheckConfig`) has no TLS fields, so these settings
//! come from the checker: `vigil check` flags, or in `vigil serve` the
//! `proxy_ssl_verify` / `proxy_ssl_trusted_certificate` of the location
//! that proxies to the upstream over https ([`TlsPolicy::from_config`]).

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use rustls::pki_types::ServerName;
use tokio_rustls::client::TlsStream;
use vigil_core::config::Config;
use vigil_core::health::ProbePhase;

use super::{Deadline, FailureKind, ProbeFailure, Target};
use crate::CheckerError;

/// TLS settings of `https` probes.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TlsOptions {
    /// Verify the certificate chain and name (default on).
    pub verify: bool,
    /// Extra trusted CA certificates (PEM), added to the system roots.
    pub ca_file: Option<PathBuf>,
    /// Client certificate chain (PEM), for servers that ask for one.
    pub client_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    pub client_key: Option<PathBuf>,
}

/// Which [`TlsOptions`] each upstream's `https` probes use.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsPolicy {
    /// For upstreams not listed in `per_upstream`.
    pub default: TlsOptions,
    /// By upstream name.
    pub per_upstream: HashMap<String, TlsOptions>,
}

/// Built rustls configurations, one per distinct [`TlsOptions`].
#[derive(Default)]
pub(crate) struct TlsCache {
    built: Mutex<HashMap<TlsOptions, Arc<rustls::ClientConfig>>>,
}

// === impl TlsOptions ===

impl Default for TlsOptions {
    fn default() -> Self {
        Self {
            verify: true,
            ca_file: None,
            client_cert: None,
            client_key: None,
        }
    }
}

impl TlsOptions {
    /// Build the rustls client configuration.
    pub fn client_config(&self) -> Result<rustls::ClientConfig, CheckerError> {
        let client_auth = match (&self.client_cert, &self.client_key) {
            (None, None) => None,
            (Some(cert), Some(key)) => Some((cert.as_path(), key.as_path())),
            (Some(p), None) | (None, Some(p)) => {
                return Err(CheckerError::TlsFile {
                    path: p.clone(),
                    message: "a client certificate needs both the certificate and the key".into(),
                })
            }
        };
        vigil_net::tls::client::ClientTls {
            verify: self.verify,
            ca_file: self.ca_file.as_deref(),
            client_auth,
        }
        .build()
        .map_err(|e| match e {
            vigil_net::TlsError::File { path, message } => CheckerError::TlsFile { path, message },
            e => CheckerError::Tls(e.to_string()),
        })
    }
}

// === impl TlsPolicy ===

impl TlsPolicy {
    /// Every upstream with `default`.
    pub fn uniform(default: TlsOptions) -> Self {
        Self {
            default,
            per_upstream: HashMap::new(),
        }
    }

    /// In `vigil serve`: an upstream proxied over https by some location
    /// is probed with that location's `proxy_ssl_verify` and
    /// `proxy_ssl_trusted_certificate` (the first such location in file
    /// order); every other upstream verifies against the system roots.
    pub fn from_config(config: &Config) -> Self {
        let mut per_upstream = HashMap::new();
        for server in &config.servers {
            for loc in &server.locations {
                let Some(pass) = loc.proxy.pass.as_ref().filter(|p| p.tls) else {
                    continue;
                };
                per_upstream
                    .entry(pass.upstream.clone())
                    .or_insert_with(|| TlsOptions {
                        verify: loc.proxy.ssl_verify,
                        ca_file: loc.proxy.ssl_trusted_certificate.clone(),
                        client_cert: None,
                        client_key: None,
                    });
            }
        }
        Self {
            default: TlsOptions::default(),
            per_upstream,
        }
    }

    /// The options for `upstream`.
    pub fn for_upstream(&self, upstream: &str) -> &TlsOptions {
        self.per_upstream.get(upstream).unwrap_or(&self.default)
    }
}

// === impl TlsCache ===

impl TlsCache {
    pub(crate) fn get(
        &self,
        options: &TlsOptions,
    ) -> Result<Arc<rustls::ClientConfig>, CheckerError> {
        if let Ok(built) = self.built.lock() {
            if let Some(c) = built.get(options) {
                return Ok(c.clone());
            }
        }
        let config = Arc::new(options.client_config()?);
        if let Ok(mut built) = self.built.lock() {
            built.insert(options.clone(), config.clone());
        }
        Ok(config)
    }
}

pub use vigil_net::tls::client::host_of;

/// The TLS handshake of an `https` probe.
pub(super) async fn handshake<S>(
    tcp: S,
    t: &Target,
    deadline: &Deadline,
) -> Result<TlsStream<S>, ProbeFailure>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let fail = |detail: String| ProbeFailure::new(ProbePhase::Tls, FailureKind::Tls, detail);
    let Some(config) = t.tls.clone() else {
        return Err(fail("no TLS settings for an https probe".into()));
    };
    let name = match t.server_name.parse::<IpAddr>() {
        Ok(ip) => ServerName::IpAddress(ip.into()),
        Err(_) => ServerName::try_from(t.server_name.clone())
            .map_err(|_| fail(format!("invalid server name \"{}\"", t.server_name)))?,
    };
    let connector = tokio_rustls::TlsConnector::from(config);
    deadline
        .within(
            ProbePhase::Tls,
            "during the TLS handshake",
            connector.connect(name, tcp),
        )
        .await?
        .map_err(|e| match e.get_ref() {
            Some(inner) => fail(format!("TLS handshake failed: {inner}")),
            None => ProbeFailure::io(ProbePhase::Tls, &e),
        })
}
