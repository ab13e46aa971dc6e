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
    routes: Vec<Vec<Option<Answer>>>,
    /// By server block: its own `return`, if any.
    server_returns: Vec<Option<Answer>>,
}

/// What a routed request gets.
#[derive(Clone)]
pub enum Answer {
    /// Proxied by this route.
    Proxy(Arc<Route>),
    /// Answered by a `return`.
    Return(Arc<Reply>),
}

/// A compiled `return`.
pub struct Reply {
    /// The status; 444 closes the connection without a response.
    pub code: u16,
    /// The body, or the `Location` of a redirecting code.
    pub text: Option<Template>,
    /// The body's `Content-Type` (`default_type`).
    pub content_type: http::HeaderValue,
    /// The location's `client_max_body_size` (nginx checks it when the
    /// location is found, before its `return` runs); 0 for a server's.
    pub max_body: u64,
    /// The location's `add_header`s (none for a server's `return`).
    pub add_headers: Vec<(HeaderName, Template, bool)>,
    /// The location's access log (none for a server's `return`).
    pub access_log: Option<Arc<crate::log::AccessLogWriter>>,
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
    /// `proxy_hide_header`, `proxy_pass_header`, `proxy_redirect`.
    pub headers: crate::redirect::Rules,
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
        let mut server_returns = Vec::new();
        for s in &config.servers {
            let mut compiled = Vec::new();
            for loc in &s.locations {
                let answer = match &loc.ret {
                    Some(r) => Some(Answer::Return(Arc::new(Reply::build(
                        r,
                        Some(loc),
                        &loc.origin,
                        &mut logs,
                    )?))),
                    None => Route::build(loc, &s.client, registry, pools, &mut logs)?
                        .map(|r| Answer::Proxy(Arc::new(r))),
                };
                compiled.push(answer);
            }
            routes.push(compiled);
            server_returns.push(match &s.ret {
                Some(r) => Some(Answer::Return(Arc::new(Reply::build(
                    r, None, &s.origin, &mut logs,
                )?))),
                None => None,
            });
        }
        Ok(Self {
            router,
            routes,
            server_returns,
        })
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
    ) -> Result<(Answer, Target), Refusal> {
        let r = self.router.route(listener, version, uri, headers)?;
        let answer = match r.location {
            Some(l) => self.routes.get(r.server).and_then(|s| s.get(l)),
            None => self.server_returns.get(r.server),
        };
        let answer = answer.and_then(Option::clone).ok_or(Refusal::NotFound)?;
        Ok((answer, r.target))
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

// === impl Answer ===

impl Answer {
    /// The route, when the request is proxied.
    pub fn proxy(&self) -> Option<&Arc<Route>> {
        match self {
            Answer::Proxy(r) => Some(r),
            Answer::Return(_) => None,
        }
    }
}

// === impl Reply ===

impl Reply {
    fn build(
        ret: &vigil_core::config::Return,
        loc: Option<&Location>,
        origin: &vigil_core::config::Origin,
        logs: &mut HashMap<std::path::PathBuf, Arc<crate::log::AccessLogWriter>>,
    ) -> Result<Self, RouteError> {
        let err = |message: String| RouteError {
            at: origin.to_string(),
            message,
        };
        let text = match &ret.text {
            Some(t) => Some(Template::parse(t).map_err(|e| err(e.to_string()))?),
            None => None,
        };
        let (add_headers, access_log) = match loc {
            Some(l) => (add_headers(l, &err)?, access_log(l, logs, &err)?),
            None => (Vec::new(), None),
        };
        let content_type = http::HeaderValue::from_str(&ret.content_type)
            .map_err(|_| err(format!("invalid default_type \"{}\"", ret.content_type)))?;
        Ok(Self {
            code: ret.code,
            text,
            content_type,
            max_body: loc.map_or(0, |l| l.proxy.client_max_body_size),
            add_headers,
            access_log,
        })
    }
}

fn add_headers(
    loc: &Location,
    err: &impl Fn(String) -> RouteError,
) -> Result<Vec<(HeaderName, Template, bool)>, RouteError> {
    let mut out = Vec::new();
    for h in &loc.proxy.add_headers {
        let name = HeaderName::from_bytes(h.name.as_bytes())
            .map_err(|_| err(format!("invalid header name \"{}\"", h.name)))?;
        out.push((
            name,
            Template::parse(&h.value).map_err(|e| err(e.to_string()))?,
            h.always,
        ));
    }
    Ok(out)
}

fn access_log(
    loc: &Location,
    logs: &mut HashMap<std::path::PathBuf, Arc<crate::log::AccessLogWriter>>,
    err: &impl Fn(String) -> RouteError,
) -> Result<Option<Arc<crate::log::AccessLogWriter>>, RouteError> {
    let Some(a) = &loc.proxy.access_log else {
        return Ok(None);
    };
    // One file per path; each access_log its own format and if=.
    let w = Arc::new(
        crate::log::AccessLogWriter::open(a, logs.get(&a.path).map(|w| &**w)).map_err(err)?,
    );
    logs.entry(a.path.clone()).or_insert_with(|| w.clone());
    Ok(Some(w))
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
        let add_headers = add_headers(loc, &err)?;
        let hash_key = match &upstream.config().balancer {
            vigil_core::config::Balancer::Hash { key, .. } => {
                Some(Template::parse(key).map_err(|e| err(format!("hash key: {e}")))?)
            }
            _ => None,
        };
        let access_log = access_log(loc, logs, &err)?;
        let headers =
            crate::redirect::Rules::of(loc).map_err(|e| err(format!("proxy_redirect: {e}")))?;
        Ok(Some(Self {
            headers,
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
