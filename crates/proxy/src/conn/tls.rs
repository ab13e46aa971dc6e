//! TLS listeners of one configuration generation: per TLS address, each
//! block's rustls configuration (its certificates, `ssl_protocols`,
//! session settings; ALPN `h2` when the address has `http2`), and the SNI
//! lookup that picks it as nginx's `ngx_http_ssl_servername` does: the
//! block whose `server_name` matches, else the address's default server;
//! a block without certificates answers with the default server's.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use rustls::ServerConfig;
use vigil_core::config::{Config, ServerBlock, SessionCache};
use vigil_net::tls::server::{self, Key, ServerOptions};

use crate::nginx::router::RouteError;
use crate::nginx::vhost::{validate_host, ServerNames};

pub(crate) use crate::nginx::marks::Secure;

/// Every TLS address of a generation.
#[derive(Default)]
pub(crate) struct TlsSites {
    by_addr: HashMap<SocketAddr, Arc<TlsSite>>,
}

/// One TLS address.
pub(crate) struct TlsSite {
    names: ServerNames,
    /// The configuration of the default server.
    default: Arc<ServerConfig>,
    /// By block index: the configuration of each block that has certificates.
    configs: HashMap<usize, Arc<ServerConfig>>,
}

// === impl TlsSites ===

impl TlsSites {
    /// Load every block's certificates (a block that does not listen on a
    /// TLS address too, as nginx does) and build each TLS address.
    pub(crate) fn build(config: &Config) -> Result<Self, RouteError> {
        let keys = config
            .servers
            .iter()
            .map(load_keys)
            .collect::<Result<Vec<_>, _>>()?;
        // Once per `ssl_protocols` directive (blocks inherit it from http).
        let mut warned: Vec<String> = Vec::new();
        for t in config.servers.iter().map(|s| &s.tls) {
            let at = t.protocols_origin.to_string();
            if !t.not_offered.is_empty() && !warned.contains(&at) {
                tracing::warn!(
                    %at,
                    protocols = %t.not_offered.join(" "),
                    "ssl_protocols: not offered (rustls implements TLSv1.2 and TLSv1.3 only)"
                );
                warned.push(at);
            }
        }
        // By address: TLS, HTTP/2, default block, blocks in order.
        let mut addrs: Vec<(SocketAddr, bool, bool, usize, Vec<usize>)> = Vec::new();
        for (i, s) in config.servers.iter().enumerate() {
            for l in &s.listen {
                let pos = match addrs.iter().position(|a| a.0 == l.addr) {
                    Some(p) => p,
                    None => {
                        addrs.push((l.addr, false, false, i, Vec::new()));
                        addrs.len() - 1
                    }
                };
                let a = &mut addrs[pos];
                a.1 |= l.ssl;
                a.2 |= l.http2;
                if l.default_server {
                    a.3 = i;
                }
                if !a.4.contains(&i) {
                    a.4.push(i);
                }
            }
        }
        let mut by_addr = HashMap::new();
        for (addr, ssl, h2, default, blocks) in addrs {
            if !ssl {
                continue;
            }
            let mut names = ServerNames::default();
            let mut configs = HashMap::new();
            for &i in &blocks {
                let s = &config.servers[i];
                if s.server_names.is_empty() {
                    let _ = names.add("", i);
                }
                for n in &s.server_names {
                    // The router refuses a bad name with its place.
                    let _ = names.add(n, i);
                }
                if keys[i].is_empty() {
                    continue;
                }
                let built =
                    server::server_config(keys[i].clone(), &options(s, h2)).map_err(|e| {
                        RouteError {
                            at: s.origin.to_string(),
                            message: format!("TLS settings of the server block: {e}"),
                        }
                    })?;
                configs.insert(i, built);
            }
            let Some(default_config) = configs.get(&default).cloned() else {
                return Err(RouteError {
                    at: config.servers[default].origin.to_string(),
                    message:
                        "no \"ssl_certificate\" is defined for the \"listen ... ssl\" directive"
                            .into(),
                });
            };
            by_addr.insert(
                addr,
                Arc::new(TlsSite {
                    names,
                    default: default_config,
                    configs,
                }),
            );
        }
        Ok(Self { by_addr })
    }

    /// The TLS address `addr`, if it is one.
    pub(crate) fn site(&self, addr: SocketAddr) -> Option<Arc<TlsSite>> {
        self.by_addr.get(&addr).cloned()
    }
}

// === impl TlsSite ===

impl TlsSite {
    /// The configuration for a client hello naming `sni`.
    pub(crate) fn choose(&self, sni: Option<&str>) -> Arc<ServerConfig> {
        // A server_name regex that cannot finish its match: nginx fails
        // the handshake; here the default certificate, and the request's
        // Host meets the same regex again (and is closed).
        sni.and_then(|n| validate_host(n.as_bytes()))
            .and_then(|host| self.names.find(&host).ok().flatten())
            .and_then(|i| self.configs.get(&i))
            .unwrap_or(&self.default)
            .clone()
    }
}

fn options(s: &ServerBlock, h2: bool) -> ServerOptions {
    let t = &s.tls;
    ServerOptions {
        tls12: t.tls12,
        tls13: t.tls13,
        h2,
        session_cache: match t.session_cache {
            SessionCache::Off | SessionCache::None => None,
            SessionCache::Sessions(n) => Some(usize::try_from(n).unwrap_or(usize::MAX)),
        },
        tickets: t.session_tickets,
        prefer_server_ciphers: t.prefer_server_ciphers,
    }
}

/// A block's certificates, each checked against its key; errors at the
/// directive naming the file at fault.
fn load_keys(s: &ServerBlock) -> Result<Vec<Key>, RouteError> {
    s.tls
        .certificates
        .iter()
        .map(|c| {
            server::load_key(&c.certificate, &c.key).map_err(|e| {
                let (at, directive) = if e.path() == Some(c.key.as_path()) {
                    (&c.key_origin, "ssl_certificate_key")
                } else {
                    (&c.certificate_origin, "ssl_certificate")
                };
                RouteError {
                    at: at.to_string(),
                    message: format!("cannot load \"{directive}\": {e}"),
                }
            })
        })
        .collect()
}
