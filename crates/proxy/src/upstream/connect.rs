//! Opening upstream connections: TCP with `proxy_connect_timeout`, TLS
//! through rustls (SNI and verification on by default), or a unix-domain
//! socket; the HTTP/1.1 client ([`crate::upstream::H1`]) speaks over it.

use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use vigil_core::config::PeerAddr;

use crate::upstream::Stream;

/// Why a connection could not be opened.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnectError {
    /// Refused, reset, unreachable.
    #[error("connect to {addr} failed: {source}")]
    Io {
        /// The peer.
        addr: PeerAddr,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// `proxy_connect_timeout` elapsed (connect plus TLS handshake).
    #[error("connect to {addr} timed out after {timeout:?}")]
    Timeout {
        /// The peer.
        addr: PeerAddr,
        /// The limit.
        timeout: Duration,
    },
    /// The TLS handshake failed (certificate, protocol).
    #[error("TLS handshake with {addr} failed: {message}")]
    Tls {
        /// The peer.
        addr: PeerAddr,
        /// What rustls said.
        message: String,
    },
}

impl ConnectError {
    /// Whether this is a timeout (nginx class `timeout`, else `error`).
    pub(crate) fn is_timeout(&self) -> bool {
        matches!(self, ConnectError::Timeout { .. })
    }
}

/// TLS settings for `https://` upstreams.
#[derive(Clone)]
pub struct TlsSettings {
    config: Arc<rustls::ClientConfig>,
}

impl TlsSettings {
    /// Build from a location's settings: system roots plus an optional CA
    /// file, or no verification when `verify` is off.
    pub fn new(verify: bool, ca_file: Option<&std::path::Path>, sni: bool) -> Result<Self, String> {
        let mut config = vigil_net::tls::client::ClientTls {
            verify,
            ca_file,
            client_auth: None,
        }
        .build()
        .map_err(|e| e.to_string())?;
        // proxy_ssl_server_name off: no SNI (vigil's default is on).
        config.enable_sni = sni;
        Ok(Self {
            config: Arc::new(config),
        })
    }
}

impl std::fmt::Debug for TlsSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TlsSettings")
    }
}

/// Open a connection to `addr` within `timeout` (nginx's
/// `proxy_connect_timeout` covers the TLS handshake too): TCP with
/// TCP_NODELAY set, then TLS with `server_name` (its port left off) as SNI
/// and the name verified when `tls` is given; or a unix-domain socket.
pub(crate) async fn connect(
    addr: &PeerAddr,
    timeout: Duration,
    tls: Option<(&TlsSettings, &str)>,
) -> Result<Stream, ConnectError> {
    let io = |source| ConnectError::Io {
        addr: addr.clone(),
        source,
    };
    let fut = async {
        let tcp = match addr {
            PeerAddr::Inet(a) => TcpStream::connect(a).await.map_err(io)?,
            PeerAddr::Unix(p) => {
                if tls.is_some() {
                    return Err(io(std::io::Error::new(
                        std::io::ErrorKind::Unsupported,
                        "TLS to a unix-domain socket is not supported by vigil",
                    )));
                }
                return tokio::net::UnixStream::connect(p)
                    .await
                    .map(Stream::Unix)
                    .map_err(io);
            }
        };
        let _ = tcp.set_nodelay(true);
        let Some((settings, server_name)) = tls else {
            return Ok(Stream::Tcp(tcp));
        };
        let tls_failed = |message: String| ConnectError::Tls {
            addr: addr.clone(),
            message,
        };
        let name = ServerName::try_from(vigil_net::tls::client::host_of(server_name).to_owned())
            .map_err(|_| tls_failed(format!("invalid server name \"{server_name}\"")))?;
        let stream = TlsConnector::from(settings.config.clone())
            .connect(name, tcp)
            .await
            // An OS error is the connection's; one carrying rustls's the
            // handshake's (certificate, protocol).
            .map_err(|e| match e.get_ref() {
                None => io(e),
                Some(_) => tls_failed(e.to_string()),
            })?;
        Ok(Stream::Tls(Box::new(stream)))
    };
    match crate::conn::timer::timeout(timeout, fut).await {
        Ok(r) => r,
        Err(_) => Err(ConnectError::Timeout {
            addr: addr.clone(),
            timeout,
        }),
    }
}
