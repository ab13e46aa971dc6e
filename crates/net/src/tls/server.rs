//! TLS listeners: certificates loaded from PEM files and checked against
//! their key, one rustls server configuration per `server` block, the
//! sniff of the first byte (TLS or plain HTTP on a TLS port, as nginx's
//! `ngx_http_ssl_handshake`), and a handshake that picks the configuration
//! by the client's SNI before answering its hello.

use std::io;
use std::path::Path;
use std::sync::Arc;

use rustls::server::{
    ClientHello, NoServerSessionStorage, ResolvesServerCert, ServerSessionMemoryCache,
};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;
use tokio_rustls::LazyConfigAcceptor;

use super::{provider, TlsError};

/// The settings of one TLS `server` block besides its certificates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerOptions {
    /// Offer TLS 1.2.
    pub tls12: bool,
    /// Offer TLS 1.3.
    pub tls13: bool,
    /// Offer `h2` in ALPN (the address has `listen ... http2`).
    pub h2: bool,
    /// Sessions kept for resumption by session id (TLS 1.2) or stateful
    /// ticket (TLS 1.3); None: no cache.
    pub session_cache: Option<usize>,
    /// Issue stateless session tickets.
    pub tickets: bool,
    /// The server's cipher suite order, not the client's.
    pub prefer_server_ciphers: bool,
}

/// A certificate and its key, loaded.
pub type Key = Arc<CertifiedKey>;

/// ALPN names after `h2`, as nginx 1.22 offers them (`NGX_HTTP_ALPN_PROTOS`).
const HTTP1_ALPN: [&[u8]; 3] = [b"http/1.1", b"http/1.0", b"http/0.9"];

/// Load the chain of `cert` and the private key of `key` (PEM), and check
/// that they belong together ([`super::certified_key`]).
pub fn load_key(cert: &Path, key: &Path) -> Result<Key, TlsError> {
    super::certified_key(cert, key).map(Arc::new)
}

/// The server configuration of one `server` block with `keys` (the first
/// that can sign for the client is served).
pub fn server_config(keys: Vec<Key>, o: &ServerOptions) -> Result<Arc<ServerConfig>, TlsError> {
    let mut versions = Vec::new();
    if o.tls12 {
        versions.push(&rustls::version::TLS12);
    }
    if o.tls13 {
        versions.push(&rustls::version::TLS13);
    }
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&versions)?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(Keys(keys)));
    let mut alpn: Vec<Vec<u8>> = Vec::new();
    if o.h2 {
        alpn.push(b"h2".to_vec());
    }
    alpn.extend(HTTP1_ALPN.iter().map(|p| p.to_vec()));
    config.alpn_protocols = alpn;
    config.session_storage = match o.session_cache {
        Some(n) => ServerSessionMemoryCache::new(n.max(1)),
        None => Arc::new(NoServerSessionStorage {}),
    };
    if o.tickets {
        config.ticketer = rustls::crypto::ring::Ticketer::new()?;
    }
    config.ignore_client_order = o.prefer_server_ciphers;
    Ok(Arc::new(config))
}

/// Whether the client's first byte opens a TLS (or SSLv2) handshake, as
/// nginx decides; None when it closed without sending one.
pub async fn sniff(tcp: &TcpStream) -> io::Result<Option<bool>> {
    let mut b = [0u8; 1];
    let n = tcp.peek(&mut b).await?;
    Ok((n == 1).then_some(b[0] & 0x80 != 0 || b[0] == 0x16))
}

/// The TLS handshake on `io`: `choose` gets the client's SNI name (None
/// without one) and returns the configuration to answer with.
pub async fn handshake<S, F>(io: S, choose: F) -> io::Result<TlsStream<S>>
where
    S: AsyncRead + AsyncWrite + Unpin,
    F: FnOnce(Option<&str>) -> Arc<ServerConfig>,
{
    let start = LazyConfigAcceptor::new(rustls::server::Acceptor::default(), io).await?;
    let config = choose(start.client_hello().server_name());
    start.into_stream(config).await
}

/// Whether the handshake chose HTTP/2 (ALPN `h2`).
pub fn is_h2<S>(tls: &TlsStream<S>) -> bool {
    tls.get_ref().1.alpn_protocol() == Some(b"h2")
}

/// A `server` block's certificates: the first whose key can sign with a
/// scheme the client offers (an RSA and an ECDSA certificate side by side,
/// as nginx allows), else the first.
#[derive(Debug)]
struct Keys(Vec<Key>);

impl ResolvesServerCert for Keys {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Key> {
        let schemes = hello.signature_schemes();
        self.0
            .iter()
            .find(|k| k.key.choose_scheme(schemes).is_some())
            .or_else(|| self.0.first())
            .cloned()
    }
}

#[cfg(test)]
mod tests;
