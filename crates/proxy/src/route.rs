//! Routing as nginx does it: the listener picks the `server {}` block, the
//! request path picks the location (`= exact` first, then the longest
//! prefix), and `proxy_pass` with a URI part replaces the matched prefix.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use http::HeaderName;
use vigil_core::config::{Config, Location, LocationMatch};
use vigil_core::registry::Registry;
use vigil_core::{RetryPolicy, Upstream};

use crate::pool::Pool;
use crate::vars::Template;

/// The compiled routes of one configuration generation.
pub struct Routes {
    by_listener: HashMap<SocketAddr, usize>,
    servers: Vec<CompiledServer>,
}

struct CompiledServer {
    exact: HashMap<String, usize>,
    /// Indices of prefix locations, longest path first.
    prefixes: Vec<usize>,
    locations: Vec<Arc<Route>>,
}

/// One location, ready to serve.
pub struct Route {
    /// The configured location.
    pub location: Location,
    /// Its upstream.
    pub upstream: Arc<Upstream>,
    /// Idle connections to the upstream's peers.
    pub pool: Arc<Pool>,
    /// `$proxy_host`: the Host sent upstream by default.
    pub proxy_host: String,
    /// TLS settings when `proxy_pass` is `https://`.
    pub tls: Option<crate::connect::TlsSettings>,
    /// Retry limits.
    pub policy: RetryPolicy,
    /// `proxy_set_header` (None = remove the header).
    pub set_headers: Vec<(HeaderName, Option<Template>)>,
    /// `add_header`.
    pub add_headers: Vec<(HeaderName, Template, bool)>,
    /// The `hash` key of the upstream, if it hashes.
    pub hash_key: Option<Template>,
    /// The access log, if on.
    pub access_log: Option<Arc<crate::log::AccessLogWriter>>,
    /// The client-side settings of the location's server block.
    pub client: vigil_core::config::ClientSettings,
}

/// A configuration that cannot be served (a variable or header name vigil does not know).
#[derive(Debug, thiserror::Error)]
#[error("{at}: {message}")]
pub struct RouteError {
    /// Where.
    pub at: String,
    /// What.
    pub message: String,
}

// === impl Routes ===

impl Routes {
    /// Compile the routes of `config` against `registry`'s upstreams.
    pub fn build(
        config: &Config,
        registry: &Registry,
        pools: &HashMap<String, Arc<Pool>>,
    ) -> Result<Self, RouteError> {
        let mut logs: HashMap<std::path::PathBuf, Arc<crate::log::AccessLogWriter>> =
            HashMap::new();
        let mut by_listener = HashMap::new();
        let mut servers = Vec::new();
        for (si, s) in config.servers.iter().enumerate() {
            for l in &s.listen {
                // The first server on an address wins unless another says default_server.
                if l.default_server || !by_listener.contains_key(&l.addr) {
                    by_listener.insert(l.addr, si);
                }
            }
            let mut exact = HashMap::new();
            let mut prefixes = Vec::new();
            let mut locations = Vec::new();
            for loc in &s.locations {
                let Some(route) = Route::build(loc, &s.client, registry, pools, &mut logs)? else {
                    continue;
                };
                let i = locations.len();
                locations.push(Arc::new(route));
                match loc.matcher {
                    LocationMatch::Exact => {
                        exact.insert(loc.path.clone(), i);
                    }
                    _ => prefixes.push(i),
                }
            }
            prefixes.sort_by_key(|&i| std::cmp::Reverse(locations[i].location.path.len()));
            servers.push(CompiledServer {
                exact,
                prefixes,
                locations,
            });
        }
        Ok(Self {
            by_listener,
            servers,
        })
    }

    /// The route for a request that arrived on `listener` for `path`.
    pub fn find(&self, listener: SocketAddr, path: &str) -> Option<&Arc<Route>> {
        let si = self
            .by_listener
            .get(&listener)
            .or_else(|| {
                let any = SocketAddr::new(
                    match listener {
                        SocketAddr::V4(_) => std::net::Ipv4Addr::UNSPECIFIED.into(),
                        SocketAddr::V6(_) => std::net::Ipv6Addr::UNSPECIFIED.into(),
                    },
                    listener.port(),
                );
                self.by_listener.get(&any)
            })
            .copied()
            .unwrap_or(0);
        let s = self.servers.get(si)?;
        if let Some(&i) = s.exact.get(path) {
            return s.locations.get(i);
        }
        s.prefixes
            .iter()
            .map(|&i| &s.locations[i])
            .find(|r| path.starts_with(r.location.path.as_str()))
    }

    /// Every listen address.
    pub fn listeners(config: &Config) -> Vec<vigil_core::config::Listen> {
        let mut out: Vec<vigil_core::config::Listen> = Vec::new();
        for s in &config.servers {
            for l in &s.listen {
                if !out.iter().any(|o| o.addr == l.addr) {
                    out.push(l.clone());
                }
            }
        }
        out
    }
}

// === impl Route ===

impl Route {
    fn build(
        loc: &Location,
        client: &vigil_core::config::ClientSettings,
        registry: &Registry,
        pools: &HashMap<String, Arc<Pool>>,
        logs: &mut HashMap<std::path::PathBuf, Arc<crate::log::AccessLogWriter>>,
    ) -> Result<Option<Self>, RouteError> {
        let err = |message: String| RouteError {
            at: loc.origin.to_string(),
            message,
        };
        let Some(pass) = &loc.proxy.pass else {
            return Ok(None);
        };
        let upstream = registry
            .get(&pass.upstream)
            .ok_or_else(|| err(format!("no upstream \"{}\"", pass.upstream)))?
            .clone();
        let pool = pools
            .get(&pass.upstream)
            .cloned()
            .ok_or_else(|| err(format!("no pool for upstream \"{}\"", pass.upstream)))?;
        let mut set_headers = Vec::new();
        for h in &loc.proxy.set_headers {
            let name = HeaderName::from_bytes(h.name.as_bytes())
                .map_err(|_| err(format!("invalid header name \"{}\"", h.name)))?;
            let value = if h.value.is_empty() {
                None
            } else {
                Some(Template::parse(&h.value).map_err(|e| err(e.to_string()))?)
            };
            set_headers.push((name, value));
        }
        let mut add_headers = Vec::new();
        for h in &loc.proxy.add_headers {
            let name = HeaderName::from_bytes(h.name.as_bytes())
                .map_err(|_| err(format!("invalid header name \"{}\"", h.name)))?;
            add_headers.push((
                name,
                Template::parse(&h.value).map_err(|e| err(e.to_string()))?,
                h.always,
            ));
        }
        let hash_key = match &upstream.config().balancer {
            vigil_core::config::Balancer::Hash { key, .. } => {
                Some(Template::parse(key).map_err(|e| err(format!("hash key: {e}")))?)
            }
            _ => None,
        };
        let access_log = match &loc.proxy.access_log {
            None => None,
            Some(a) => Some(match logs.get(&a.path) {
                Some(w) => w.clone(),
                None => {
                    let w = Arc::new(
                        crate::log::AccessLogWriter::open(&a.path, a.format).map_err(|e| {
                            err(format!("cannot open access log {}: {e}", a.path.display()))
                        })?,
                    );
                    logs.insert(a.path.clone(), w.clone());
                    w
                }
            }),
        };
        Ok(Some(Self {
            client: client.clone(),
            access_log,
            policy: RetryPolicy::of(&loc.proxy),
            proxy_host: pass.upstream.clone(),
            tls: if pass.tls {
                Some(
                    crate::connect::TlsSettings::new(
                        loc.proxy.ssl_verify,
                        loc.proxy.ssl_trusted_certificate.as_deref(),
                        loc.proxy.ssl_server_name,
                    )
                    .map_err(|e| err(format!("TLS settings: {e}")))?,
                )
            } else {
                None
            },
            location: loc.clone(),
            upstream,
            pool,
            set_headers,
            add_headers,
            hash_key,
        }))
    }

    /// The URI sent upstream: with a URI part in `proxy_pass`, the matched
    /// location prefix is replaced by it (`location /join/` +
    /// `proxy_pass http://u/v1` sends `/join/item` as `/v1item`); without
    /// one, the client's URI goes unchanged.
    pub fn upstream_uri(&self, path_and_query: &str) -> String {
        let Some(uri) = self
            .location
            .proxy
            .pass
            .as_ref()
            .and_then(|p| p.uri.as_deref())
        else {
            return path_and_query.to_string();
        };
        let prefix = self.location.path.as_str();
        match path_and_query.strip_prefix(prefix) {
            Some(rest) => format!("{uri}{rest}"),
            None => format!("{uri}{path_and_query}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vigil_core::config::{literal_resolver, nginx};
    use vigil_core::event::EventBus;

    fn routes(conf: &str) -> Routes {
        let loaded = nginx::load_str(conf, "t.conf".as_ref(), ".".as_ref(), &literal_resolver)
            .expect("conf");
        let clock: Arc<dyn vigil_core::Clock> = Arc::new(vigil_core::SystemClock::new());
        let reg = Registry::build(&loaded.config, None, Arc::new(EventBus::default()), clock);
        let pools = reg
            .upstreams()
            .iter()
            .map(|u| (u.name().to_string(), Arc::new(Pool::new(u.config()))))
            .collect();
        Routes::build(&loaded.config, &reg, &pools).expect("routes")
    }

    #[test]
    fn longest_prefix_and_exact_win() {
        let r = routes(
            "http { upstream u { server 127.0.0.1:1; }
               server { listen 127.0.0.1:8080;
                 location / { proxy_pass http://u; }
                 location /api/ { proxy_pass http://u/v2/; }
                 location = /api/x { proxy_pass http://u/exact; }
                 location /api/long/ { proxy_pass http://u; } } }",
        );
        let l: SocketAddr = "127.0.0.1:8080".parse().expect("addr");
        let path = |p: &str| r.find(l, p).map(|r| r.location.path.clone());
        assert_eq!(path("/"), Some("/".into()));
        assert_eq!(path("/api/y"), Some("/api/".into()));
        assert_eq!(path("/api/x"), Some("/api/x".into()));
        assert_eq!(path("/api/long/z"), Some("/api/long/".into()));
    }

    #[test]
    fn uri_replacement_follows_nginx() {
        let r = routes(
            "http { upstream u { server 127.0.0.1:1; }
               server { listen 127.0.0.1:8080;
                 location /join/ { proxy_pass http://u/v1; }
                 location /keep/ { proxy_pass http://u; }
                 location /slash/ { proxy_pass http://u/; }
                 location = /exact { proxy_pass http://u/other?x=1; } } }",
        );
        let l: SocketAddr = "127.0.0.1:8080".parse().expect("addr");
        let up = |p: &str| {
            r.find(l, p.split('?').next().unwrap_or(p))
                .map(|r| r.upstream_uri(p))
        };
        assert_eq!(up("/join/item").as_deref(), Some("/v1item"), "seed 003");
        assert_eq!(up("/keep/a?b=1").as_deref(), Some("/keep/a?b=1"));
        assert_eq!(up("/slash/a/b?q").as_deref(), Some("/a/b?q"));
        assert_eq!(up("/exact").as_deref(), Some("/other?x=1"));
    }
}
