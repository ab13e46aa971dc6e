//! What each location proxies to (`Route`: its upstream, pool, headers,
//! retry policy) and the URI it sends there, on top of `Router`, which
//! picks the block and location as nginx 1.22 does (router.rs).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use http::header::HeaderMap;
use http::request::Parts;
use http::{HeaderName, Uri, Version};
use vigil_core::config::{Config, Location};
use vigil_core::registry::Registry;
use vigil_core::{RetryPolicy, Upstream};

use crate::pool::Pool;
pub use crate::router::{Refusal, RouteError, Routed, Router, Target};
use crate::uri::{escape_uri, RequestUri};
use crate::vars::Template;

/// The compiled routes of one configuration generation.
pub struct Routes {
    router: Router,
    /// By server block, then location (None: the location proxies nowhere).
    routes: Vec<Vec<Option<Arc<Route>>>>,
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

// === impl Routes ===

impl Routes {
    /// Compile the routes of `config` against `registry`'s upstreams.
    pub fn build(
        config: &Config,
        registry: &Registry,
        pools: &HashMap<String, Arc<Pool>>,
    ) -> Result<Self, RouteError> {
        let router = Router::build(config)?;
        let mut logs: HashMap<std::path::PathBuf, Arc<crate::log::AccessLogWriter>> =
            HashMap::new();
        let mut routes = Vec::new();
        for s in &config.servers {
            let mut compiled = Vec::new();
            for loc in &s.locations {
                compiled
                    .push(Route::build(loc, &s.client, registry, pools, &mut logs)?.map(Arc::new));
            }
            routes.push(compiled);
        }
        Ok(Self { router, routes })
    }

    /// The index (into `Config::servers`) of the default server of `listener`.
    pub(crate) fn default_server(&self, listener: SocketAddr) -> Option<usize> {
        self.router.default_server(listener)
    }

    /// Route a request that arrived on `listener`.
    pub fn route(
        &self,
        listener: SocketAddr,
        version: Version,
        uri: &Uri,
        headers: &HeaderMap,
    ) -> Result<(Arc<Route>, Target), Refusal> {
        let r = self.router.route(listener, version, uri, headers)?;
        let route = self
            .routes
            .get(r.server)
            .and_then(|s| s.get(r.location))
            .and_then(Option::clone)
            .ok_or(Refusal::NotFound)?;
        Ok((route, r.target))
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

/// The URI nginx sends upstream for `location` (the `proxy_pass` URI part
/// replacing the matched location path of the *normalised* URI, re-escaped
/// when the client's path had escapes, the query appended); without a URI
/// part, the client's request target exactly as sent: that is nginx's
/// behaviour (`r->unparsed_uri`), dots and escapes included.
pub fn upstream_target(location: &Location, uri: &RequestUri) -> String {
    let pass = location.proxy.pass.as_ref().and_then(|p| p.uri.as_deref());
    if pass.is_none() {
        if let Some(raw) = uri.unparsed() {
            return raw.to_string();
        }
    }
    let prefix = pass.map_or(0, |_| location.path.len());
    let rest = uri.path().get(prefix..).unwrap_or_default();
    let mut out = String::from(pass.unwrap_or(""));
    if uri.is_quoted() {
        escape_uri(&mut out, rest);
    } else {
        // Not decoded, so these are bytes of the (UTF-8) target.
        out.push_str(&String::from_utf8_lossy(rest));
    }
    if !uri.args().is_empty() {
        out.push('?');
        out.push_str(uri.args());
    }
    out
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

    /// The URI sent upstream for this request (routed by `Routes`, which
    /// left its `Target` in the extensions): see `upstream_target`.
    pub(crate) fn upstream_uri(&self, parts: &Parts) -> String {
        match parts.extensions.get::<Target>() {
            Some(t) => upstream_target(&self.location, &t.uri),
            // Not routed by Routes: nothing normalised to build from.
            None => parts
                .uri
                .path_and_query()
                .map_or("/", |p| p.as_str())
                .to_string(),
        }
    }
}

#[cfg(test)]
mod tests;
