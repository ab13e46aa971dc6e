//! Opening upstream connections: TCP with `proxy_connect_timeout`, TLS
//! through hyper-rustls (SNI and verification on by default), then an
//! HTTP/1.1 handshake whose connection task runs on its own.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::client::conn::http1;
use hyper::client::conn::http1::SendRequest;
use hyper::Uri;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tower_service::Service;

use vigil_core::config::PeerAddr;

use crate::payload::UpBody;
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
    /// The HTTP handshake failed.
    #[error("HTTP handshake with {addr} failed: {source}")]
    Handshake {
        /// The peer.
        addr: PeerAddr,
        /// hyper's error.
        #[source]
        source: hyper::Error,
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

/// Open a connection to `addr` (TLS with `server_name` as SNI when `tls` is given).
pub(crate) async fn connect(
    sockaddr: SocketAddr,
    timeout: Duration,
    tls: Option<(&TlsSettings, &str)>,
) -> Result<SendRequest<UpBody>, ConnectError> {
    let addr = PeerAddr::Inet(sockaddr);
    let addr = &addr;
    let fut =
        async {
            match tls {
                None => {
                    let tcp =
                        TcpStream::connect(sockaddr)
                            .await
                            .map_err(|source| ConnectError::Io {
                                addr: addr.clone(),
                                source,
                            })?;
                    let _ = tcp.set_nodelay(true);
                    handshake(TokioIo::new(tcp), addr).await
                }
                Some((settings, server_name)) => {
                    let mut https = hyper_rustls::HttpsConnectorBuilder::new()
                        .with_tls_config((*settings.config).clone())
                        .https_only()
                        .enable_http1()
                        .wrap_connector(Fixed(sockaddr));
                    let host = if server_name.contains(':') && !server_name.starts_with('[') {
                        server_name.rsplit_once(':').map_or(server_name, |(h, _)| h)
                    } else {
                        server_name
                    };
                    let uri: Uri =
                        format!("https://{host}/")
                            .parse()
                            .map_err(|_| ConnectError::Tls {
                                addr: addr.clone(),
                                message: format!("invalid server name \"{host}\""),
                            })?;
                    let io = https.call(uri).await.map_err(|e| {
                        match e.downcast::<std::io::Error>() {
                            Ok(io) if io.get_ref().is_none() => ConnectError::Io {
                                addr: addr.clone(),
                                source: *io,
                            },
                            Ok(io) => ConnectError::Tls {
                                addr: addr.clone(),
                                message: io.to_string(),
                            },
                            Err(other) => ConnectError::Tls {
                                addr: addr.clone(),
                                message: other.to_string(),
                            },
                        }
                    })?;
                    handshake(io, addr).await
                }
            }
        };
    match crate::timer::timeout(timeout, fut).await {
        Ok(r) => r,
        Err(_) => Err(ConnectError::Timeout {
            addr: addr.clone(),
            timeout,
        }),
    }
}

/// Open a plain connection to `addr` within `timeout`: TCP with
/// TCP_NODELAY set, or a unix-domain socket (for the request-driven
/// HTTP/1.1 client, no handshake task).
pub(crate) async fn connect_plain(
    addr: &PeerAddr,
    timeout: Duration,
) -> Result<Stream, ConnectError> {
    let fut = async {
        match addr {
            PeerAddr::Inet(a) => TcpStream::connect(a).await.map(|tcp| {
                let _ = tcp.set_nodelay(true);
                Stream::Tcp(tcp)
            }),
            PeerAddr::Unix(p) => tokio::net::UnixStream::connect(p).await.map(Stream::Unix),
        }
    };
    match crate::timer::timeout(timeout, fut).await {
        Ok(Ok(s)) => Ok(s),
        Ok(Err(source)) => Err(ConnectError::Io {
            addr: addr.clone(),
            source,
        }),
        Err(_) => Err(ConnectError::Timeout {
            addr: addr.clone(),
            timeout,
        }),
    }
}

async fn handshake<T>(io: T, addr: &PeerAddr) -> Result<SendRequest<UpBody>, ConnectError>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (sender, conn) = http1::Builder::new()
        .handshake(io)
        .await
        .map_err(|source| ConnectError::Handshake {
            addr: addr.clone(),
            source,
        })?;
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    Ok(sender)
}

/// A connector that always dials one address (the balancer already chose
/// the peer; the URI only carries the TLS server name).
#[derive(Clone, Copy)]
struct Fixed(SocketAddr);

impl Service<Uri> for Fixed {
    type Response = TokioIo<TcpStream>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Uri) -> Self::Future {
        let addr = self.0;
        Box::pin(async move {
            let tcp = TcpStream::connect(addr).await?;
            let _ = tcp.set_nodelay(true);
            Ok(TokioIo::new(tcp))
        })
    }
}
