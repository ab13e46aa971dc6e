//! What each location proxies to (`Route`: its upstream, pool, headers,
//! retry policy) and the URI it sends there, on top of `Router`, which
//! picks the block and location as nginx 1.22 does (router.rs); and the
//! phases a request is routed through (the server's rewrite script, the
//! location search, the location's script, again after `last`).

use std::borrow::Cow;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use http::request::Parts;
use http::HeaderName;
use vigil_core::config::{Config, Location};
use vigil_core::registry::Registry;
use vigil_core::{RetryPolicy, Upstream};

pub(crate) use crate::nginx::reply::Reply;
use crate::nginx::rewrite::{self, Net, Ran, Script};
pub(crate) use crate::nginx::router::Target;
pub use crate::nginx::router::{Refusal, RouteError, Router};
use crate::nginx::static_files::Files;
use crate::nginx::uri::{escape_uri, RequestUri};
use crate::nginx::vars::{Scope, Template};
use crate::upstream::pool::Pool;

/// The compiled routes of one configuration generation.
pub(crate) struct Routes {
    pub(crate) router: Router,
    /// By server block, then location (None: the location proxies nowhere).
    routes: Vec<Vec<Option<Answer>>>,
    /// By server block: its own `return`, if any.
    server_returns: Vec<Option<Answer>>,
    /// By server block: its rewrite script.
    pub(crate) server_scripts: Vec<Script>,
    /// By server block, then location: its rewrite script.
    pub(crate) scripts: Vec<Vec<Script>>,
    /// By server block, then location: its proxy route, if it proxies.
    pub(crate) proxies: Vec<Vec<Option<Arc<Route>>>>,
    /// By server block, then location: the headers, log and body limit of
    /// an answer the location's script makes (a redirect, a 500).
    bases: Vec<Vec<Reply>>,
    /// By server block, then location: a regex location's named groups
    /// and their indices.
    pub(crate) capture_names: Vec<Vec<GroupNames>>,
    /// By server block: its own level's pages and log.
    levels: Vec<ServerLevel>,
    /// By server block, then location: the access phase of a location
    /// that does not proxy and has `allow`/`deny` (boxed: rare).
    guards: Vec<Vec<Option<Box<Guard>>>>,
    /// By server block, then location: the static files of a location
    /// with no `proxy_pass` and no `return`.
    files: Vec<Vec<Option<Arc<Files>>>>,
    /// By server block: its own level's static files (a request no
    /// location takes).
    server_files: Vec<Arc<Files>>,
    /// By server block, then location: `internal`.
    internal: Vec<Vec<bool>>,
    /// Whether any location is `internal` (the proxy path reads no more
    /// than this when none is).
    any_internal: bool,
}

/// The access phase of a location with no handler (no `proxy_pass`): nginx
/// runs it before the content phase finds nothing to answer with, so a
/// denied client gets the access module's 403, not the static 404.
struct Guard {
    /// `allow` / `deny`.
    access: Vec<vigil_core::config::AccessRule>,
    /// The realip settings of the server and of the location (the real
    /// IP is the one checked, as for a location that proxies).
    server_real_ip: vigil_core::config::RealIp,
    real_ip: vigil_core::config::RealIp,
    /// The 403, with the location's headers and log.
    forbidden: Arc<Reply>,
}

/// A server block's own level (`error_page`, `access_log` of the server,
/// or inherited from `http`): what nginx uses for a request that no
/// location answers (a 404 of no location, the server's `return`, a 400).
pub(crate) struct ServerLevel {
    /// The server's `error_page`s (for vigil's own answers).
    pub(crate) error_pages: crate::nginx::error_page::ErrorPages,
    /// The server's access log, if on.
    pub(crate) access_log: Option<Arc<crate::obs::log::AccessLogWriter>>,
    /// What the server's script bases its redirects on (its log).
    base: Reply,
}

/// A regex's named groups and their indices.
pub(crate) type GroupNames = Vec<(Arc<str>, usize)>;

/// The URI a `proxy_pass` with variables made for this request.
#[derive(Clone, Debug)]
pub(crate) struct PassUri(pub(crate) String);

/// What a routed request gets.
#[derive(Clone)]
pub(crate) enum Answer {
    /// Proxied by this route.
    Proxy(Arc<Route>),
    /// Answered by a `return`.
    Return(Arc<Reply>),
    /// Answered from static files.
    Files(Arc<Files>),
}

/// One location, ready to serve.
pub(crate) struct Route {
    /// The configured location.
    pub(crate) location: Location,
    /// Its upstream.
    pub(crate) upstream: Arc<Upstream>,
    /// The upstream's place in the registry's list (and in the
    /// generation's counters: see `GenerationStats::upstream_at`).
    pub(crate) upstream_index: usize,
    /// Idle connections to the upstream's peers.
    pub(crate) pool: Arc<Pool>,
    /// `$proxy_host`: the Host sent upstream by default.
    pub(crate) proxy_host: String,
    /// `proxy_host` as the upstream request's `Host` value (None: no value
    /// can carry it, and the request has no `Host`).
    pub(crate) host_value: Option<http::HeaderValue>,
    /// TLS settings when `proxy_pass` is `https://`.
    pub(crate) tls: Option<crate::upstream::connect::TlsSettings>,
    /// Retry limits.
    pub(crate) policy: RetryPolicy,
    /// `proxy_set_header`: the name, as written (nginx sends that
    /// spelling), and the value (None = remove the header).
    pub(crate) set_headers: Vec<(HeaderName, Box<str>, Option<Template>)>,
    /// `add_header`.
    pub(crate) add_headers: Vec<(HeaderName, Template, bool)>,
    /// The `hash` key of the upstream, if it hashes.
    pub(crate) hash_key: Option<Template>,
    /// The access log, if on.
    pub(crate) access_log: Option<Arc<crate::obs::log::AccessLogWriter>>,
    /// The client-side settings of the location's server block.
    pub(crate) client: vigil_core::config::ClientSettings,
    /// A `proxy_pass` URI part with variables (`http://u/$1`), sent as it expands.
    pub(crate) pass_template: Option<Template>,
    /// `error_page` and `proxy_intercept_errors`.
    pub(crate) error_pages: crate::nginx::error_page::ErrorPages,
    /// `proxy_hide_header`, `proxy_pass_header`, `proxy_redirect`.
    pub(crate) headers: crate::nginx::redirect::Rules,
    /// `limit_req` / `limit_conn` (None: the location has none).
    pub(crate) limits: Option<Box<crate::nginx::limit::Limits>>,
    /// `expires` (nginx's headers filter sets it on proxied answers too).
    pub(crate) expires: vigil_core::config::Expires,
}

// === impl Routes ===

impl Routes {
    /// Compile the routes of `config` against `registry`'s upstreams
    /// (with new limit zones).
    #[cfg(test)]
    pub(crate) fn build(
        config: &Config,
        registry: &Registry,
        pools: &HashMap<String, Arc<Pool>>,
    ) -> Result<Self, RouteError> {
        let zones = crate::nginx::limit::Zones::build(config, None);
        Self::build_with(config, registry, pools, &zones)
    }

    /// Compile the routes of `config` against `registry`'s upstreams and
    /// the generation's limit `zones`.
    pub(crate) fn build_with(
        config: &Config,
        registry: &Registry,
        pools: &HashMap<String, Arc<Pool>>,
        zones: &crate::nginx::limit::Zones,
    ) -> Result<Self, RouteError> {
        let router = Router::build(config)?;
        let mut scope = crate::nginx::rewrite::scope(config)?;
        for n in router.group_names() {
            scope.declare(n);
        }
        let scope = &scope;
        let mut logs: HashMap<std::path::PathBuf, Arc<crate::obs::log::AccessLogWriter>> =
            HashMap::new();
        let mut out = Self {
            router,
            routes: Vec::new(),
            server_returns: Vec::new(),
            server_scripts: Vec::new(),
            scripts: Vec::new(),
            proxies: Vec::new(),
            bases: Vec::new(),
            capture_names: Vec::new(),
            levels: Vec::new(),
            guards: Vec::new(),
            files: Vec::new(),
            server_files: Vec::new(),
            internal: Vec::new(),
            any_internal: false,
        };
        for s in &config.servers {
            let err = |message: String| RouteError {
                at: s.origin.to_string(),
                message,
            };
            let server_log = open_log(s.access_log.as_ref(), &mut logs, scope, &err)?;
            // The server's own answers are logged to its access log.
            let server_reply = |r: &vigil_core::config::Return,
                                logs: &mut HashMap<
                std::path::PathBuf,
                Arc<crate::obs::log::AccessLogWriter>,
            >| {
                let mut reply = Reply::build(r, (None, &s.error_pages), &s.origin, logs, scope)?;
                reply.access_log = server_log.clone();
                Ok(reply)
            };
            let mut compiled = Vec::new();
            let (mut scripts, mut proxies, mut bases, mut names, mut guards) =
                (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
            let (mut files, mut internal) = (Vec::new(), Vec::new());
            for loc in &s.locations {
                let proxy =
                    Route::build(loc, &s.client, (registry, pools, zones), &mut logs, scope)?
                        .map(Arc::new);
                let answer = match &loc.ret {
                    Some(r) => Some(Answer::Return(Arc::new(Reply::build(
                        r,
                        (Some(loc), &loc.proxy.error_pages),
                        &loc.origin,
                        &mut logs,
                        scope,
                    )?))),
                    None => proxy.clone().map(Answer::Proxy),
                };
                compiled.push(answer);
                scripts.push(Script::build(&loc.routing.script, Some(loc), scope, |r| {
                    Reply::build(
                        r,
                        (Some(loc), &loc.proxy.error_pages),
                        &loc.origin,
                        &mut logs,
                        scope,
                    )
                })?);
                let base = vigil_core::config::Return {
                    code: 500,
                    text: None,
                    content_type: "text/plain".into(),
                };
                let base = Reply::build(
                    &base,
                    (Some(loc), &loc.proxy.error_pages),
                    &loc.origin,
                    &mut logs,
                    scope,
                )?;
                guards.push((proxy.is_none() && !loc.proxy.access.is_empty()).then(|| {
                    Box::new(Guard {
                        access: loc.proxy.access.clone(),
                        server_real_ip: loc.proxy.server_real_ip.clone(),
                        real_ip: loc.proxy.real_ip.clone(),
                        forbidden: Arc::new(base.status(403)),
                    })
                }));
                bases.push(base);
                files.push(match (&proxy, &loc.ret) {
                    (None, None) => {
                        let mut f = Files::build(
                            &loc.proxy.files,
                            Some(loc),
                            &loc.origin,
                            &mut logs,
                            scope,
                            &loc.proxy.error_pages,
                        )?;
                        f.limits =
                            crate::nginx::limit::Limits::build(&loc.proxy.limits, zones, scope)
                                .map_err(|message| RouteError {
                                    at: loc.origin.to_string(),
                                    message: format!("limit_req / limit_conn: {message}"),
                                })?;
                        Some(Arc::new(f))
                    }
                    _ => None,
                });
                internal.push(loc.proxy.files.internal);
                proxies.push(proxy);
                names.push(group_indices(loc));
            }
            out.routes.push(compiled);
            out.scripts.push(scripts);
            out.proxies.push(proxies);
            out.bases.push(bases);
            out.capture_names.push(names);
            out.guards.push(guards);
            out.files.push(files);
            out.any_internal |= internal.iter().any(|i| *i);
            out.internal.push(internal);
            let mut own =
                Files::build(&s.files, None, &s.origin, &mut logs, scope, &s.error_pages)?;
            own.access_log = server_log.clone();
            out.server_files.push(Arc::new(own));
            out.server_scripts
                .push(Script::build(&s.rewrite, None, scope, |r| {
                    server_reply(r, &mut logs)
                })?);
            out.server_returns.push(match &s.ret {
                Some(r) => Some(Answer::Return(Arc::new(server_reply(r, &mut logs)?))),
                None => None,
            });
            out.levels.push(ServerLevel {
                error_pages: crate::nginx::error_page::ErrorPages::build(
                    &s.error_pages,
                    false,
                    scope,
                )?,
                base: server_reply(
                    &vigil_core::config::Return {
                        code: 500,
                        text: None,
                        content_type: "text/plain".into(),
                    },
                    &mut logs,
                )?,
                access_log: server_log,
            });
        }
        if let Some(e) = crate::nginx::error_page::check(config, &out.router)
            .into_iter()
            .next()
        {
            return Err(e);
        }
        // add_header's names go out as the conf spells them.
        crate::wire::names::set_conf_spellings(
            config
                .servers
                .iter()
                .flat_map(|s| s.locations.iter())
                .flat_map(|l| l.proxy.add_headers.iter())
                .map(|h| h.name.as_str()),
        );
        Ok(out)
    }

    /// The index (into `Config::servers`) of the default server of `listener`.
    pub(crate) fn default_server(&self, listener: SocketAddr) -> Option<usize> {
        self.router.default_server(listener)
    }

    /// Route a request that arrived on `listener` (the tests' shortcut:
    /// requests go through `route_parts`).
    #[cfg(test)]
    pub(crate) fn route(
        &self,
        listener: SocketAddr,
        version: http::Version,
        uri: &http::Uri,
        headers: &http::HeaderMap,
    ) -> Result<(Answer, Target), Refusal> {
        let r = self.router.route(listener, version, uri, headers)?;
        let answer = match r.location {
            Some(l) => self.routes.get(r.server).and_then(|s| s.get(l)),
            None => self.server_returns.get(r.server),
        };
        let answer = answer.and_then(Option::clone).ok_or(Refusal::NotFound)?;
        Ok((answer, r.target))
    }

    /// The pages and log of server block `server`'s own level.
    pub(crate) fn server_level(&self, server: usize) -> Option<&ServerLevel> {
        self.levels.get(server)
    }

    /// The reply a server's script bases its redirects on.
    pub(crate) fn server_base(&self, server: usize) -> Option<&Reply> {
        self.levels.get(server).map(|l| &l.base)
    }

    /// The reply a location's script bases its redirects on.
    pub(crate) fn redirect_base(&self, server: usize, location: usize) -> Option<&Reply> {
        self.bases.get(server).and_then(|s| s.get(location))
    }
}

/// The variables of `config` (maps, `set`, named captures) for values
/// compiled outside [`Routes::build`] (`vigil lint`).
pub fn scope_of(config: &Config) -> Result<Scope, RouteError> {
    let mut scope = crate::nginx::rewrite::scope(config)?;
    for s in &config.servers {
        for l in &s.locations {
            for (n, _) in group_indices(l) {
                scope.declare(&n);
            }
        }
    }
    Ok(scope)
}

/// Load every certificate and key of `config`'s TLS listeners as `vigil
/// serve` does at start (nginx -t loads them too): the first that fails,
/// at its directive.
pub fn certificate_errors(config: &Config) -> Result<(), RouteError> {
    crate::conn::tls::TlsSites::build(config).map(|_| ())
}

/// Every value of the rewrite phase `vigil serve` would refuse (an
/// unknown variable in a `return` text, a `rewrite` replacement, a `set`
/// value, a `map` value, a `proxy_pass` URI, an `add_header`, `root`,
/// `alias` or `try_files` of a location that does not proxy, or a
/// `limit_req_zone` / `limit_conn_zone` key), each at its directive
/// (`vigil lint`).
pub fn variable_errors(config: &Config) -> Vec<RouteError> {
    let scope = match scope_of(config) {
        Ok(s) => s,
        Err(e) => return vec![e],
    };
    let mut out = Vec::new();
    let mut check = |value: &str, at: &vigil_core::config::Origin, what: &str| {
        if let Err(e) = Template::parse_with(value, &scope) {
            out.push(RouteError {
                at: at.to_string(),
                message: format!("{e} in \"{what}\""),
            });
        }
    };
    let script = |steps: &[vigil_core::config::RewriteStep],
                  at: &vigil_core::config::Origin,
                  check: &mut dyn FnMut(&str, &vigil_core::config::Origin, &str)| {
        for step in steps {
            match step {
                vigil_core::config::RewriteStep::Rewrite(r) => {
                    check(&r.replacement, &r.origin, "rewrite")
                }
                vigil_core::config::RewriteStep::Set(v) => check(&v.value, &v.origin, "set"),
                vigil_core::config::RewriteStep::Return(r) => {
                    if let Some(t) = &r.text {
                        check(t, at, "return");
                    }
                }
            }
        }
    };
    for z in &config.limit_zones {
        check(&z.key, &z.origin, "zone key");
    }
    // Each location's proxy_redirect rules; each access log's format and
    // condition once, at the first place that logs with it.
    let mut later = Vec::new();
    for s in &config.servers {
        for l in &s.locations {
            if l.proxy.pass.is_some() {
                if let Err(e) = crate::nginx::redirect::Rules::of(l) {
                    later.push(RouteError {
                        at: l.origin.to_string(),
                        message: format!("proxy_redirect: {e}"),
                    });
                }
            }
        }
    }
    let mut logs: Vec<(&vigil_core::config::AccessLog, &vigil_core::config::Origin)> = Vec::new();
    for s in &config.servers {
        logs.extend(s.access_log.as_ref().map(|a| (a, &s.origin)));
        for l in &s.locations {
            logs.extend(l.proxy.access_log.as_ref().map(|a| (a, &l.origin)));
        }
    }
    for (i, (log, at)) in logs.iter().enumerate() {
        if logs[..i].iter().any(|(l, _)| l == log) {
            continue;
        }
        if let Err(message) = crate::obs::log::check(log, &scope) {
            later.push(RouteError {
                at: at.to_string(),
                message,
            });
        }
    }
    for s in &config.servers {
        script(&s.rewrite, &s.origin, &mut check);
        for l in &s.locations {
            script(&l.routing.script, &l.origin, &mut check);
            match &l.proxy.pass {
                Some(p) => {
                    if let Some(u) = p.uri.as_deref().filter(|u| u.contains('$')) {
                        check(u, &l.origin, "proxy_pass");
                    }
                }
                None => {
                    for h in &l.proxy.add_headers {
                        check(&h.value, &l.origin, "add_header");
                    }
                    if l.ret.is_none() {
                        files_values(&l.proxy.files, &l.origin, &mut check);
                    }
                }
            }
        }
    }
    out.extend(later);
    out
}

/// The values with variables of a location's static files (`root`,
/// `alias`, `try_files`), for [`variable_errors`].
fn files_values(
    f: &vigil_core::config::FileSettings,
    at: &vigil_core::config::Origin,
    check: &mut dyn FnMut(&str, &vigil_core::config::Origin, &str),
) {
    match &f.root {
        vigil_core::config::DocRoot::Root(p) => check(p, at, "root"),
        vigil_core::config::DocRoot::Alias { path, .. } => check(path, at, "alias"),
    }
    for t in &f.try_files {
        if !t.starts_with('=') && !t.starts_with('@') {
            check(t, at, "try_files");
        }
    }
}

/// The `error_page`s `vigil serve` refuses (a page that proxies, a named
/// location that does not exist), each at its directive (`vigil lint`).
pub fn error_page_errors(config: &Config) -> Vec<RouteError> {
    match Router::build(config) {
        Ok(router) => crate::nginx::error_page::check(config, &router),
        Err(_) => Vec::new(),
    }
}

/// The URI nginx sends upstream for `location` (the `proxy_pass` URI part
/// replacing the matched location path of the *normalised* URI, re-escaped
/// when the client's path had escapes, the query appended); without a URI
/// part, the client's request target exactly as sent: that is nginx's
/// behaviour (`r->unparsed_uri`), dots and escapes included.
pub fn upstream_target(location: &Location, uri: &RequestUri) -> String {
    target_uri(location, uri, false, true)
}

/// [`upstream_target`] after the rewrite phase: `internal` (the URI was
/// rewritten: escaped, never the client's) and `valid_location` (cleared
/// by `rewrite ... break`: the `proxy_pass` URI part is then not used and
/// the whole rewritten URI goes upstream), as ngx_http_proxy_create_request.
pub(crate) fn target_uri(
    location: &Location,
    uri: &RequestUri,
    internal: bool,
    valid_location: bool,
) -> String {
    if let Some(raw) = as_sent(location, uri, internal) {
        return raw.to_string();
    }
    let pass = pass_part(location).filter(|_| valid_location);
    let prefix = match location.matcher {
        vigil_core::config::LocationMatch::Exact
        | vigil_core::config::LocationMatch::Prefix
        | vigil_core::config::LocationMatch::PrefixNoRegex => {
            pass.map_or(0, |_| location.path.len())
        }
        _ => 0,
    };
    let rest = uri.path().get(prefix..).unwrap_or_default();
    let mut out = String::from(pass.unwrap_or(""));
    if uri.is_quoted() || internal {
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

/// A `proxy_pass` URI part without variables.
fn pass_part(location: &Location) -> Option<&str> {
    location
        .proxy
        .pass
        .as_ref()
        .and_then(|p| p.uri.as_deref())
        .filter(|u| !u.contains('$'))
}

/// The target as the client sent it, where [`target_uri`] sends it so.
fn as_sent<'u>(location: &Location, uri: &'u RequestUri, internal: bool) -> Option<&'u str> {
    if pass_part(location).is_none() && !internal {
        uri.unparsed()
    } else {
        None
    }
}

// === impl Answer ===

impl Answer {
    /// The route, when the request is proxied.
    #[cfg(test)]
    pub(crate) fn proxy(&self) -> Option<&Arc<Route>> {
        match self {
            Answer::Proxy(r) => Some(r),
            Answer::Return(_) | Answer::Files(_) => None,
        }
    }
}

// === impl Reply ===

impl Reply {
    pub(crate) fn build(
        ret: &vigil_core::config::Return,
        (loc, pages): (Option<&Location>, &[vigil_core::config::ErrorPage]),
        origin: &vigil_core::config::Origin,
        logs: &mut HashMap<std::path::PathBuf, Arc<crate::obs::log::AccessLogWriter>>,
        scope: &Scope,
    ) -> Result<Self, RouteError> {
        let err = |message: String| RouteError {
            at: origin.to_string(),
            message,
        };
        let text = match &ret.text {
            Some(t) => Some(Template::parse_with(t, scope).map_err(|e| err(e.to_string()))?),
            None => None,
        };
        let (add_headers, access_log) = match loc {
            Some(l) => (
                add_headers(l, &err, scope)?,
                access_log(l, logs, scope, &err)?,
            ),
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
            error_pages: Arc::new(
                crate::nginx::error_page::ErrorPages::build(pages, false, scope)
                    .map_err(|e| err(e.message))?,
            ),
        })
    }
}

/// A regex location's named groups, with their indices.
fn group_indices(loc: &Location) -> GroupNames {
    use vigil_core::config::LocationMatch;
    let caseless = match loc.matcher {
        LocationMatch::Regex => false,
        LocationMatch::RegexCaseless => true,
        _ => return Vec::new(),
    };
    let Ok(re) = vigil_config::pattern::compile(&loc.path, caseless) else {
        return Vec::new();
    };
    re.capture_names()
        .enumerate()
        .filter_map(|(i, n)| n.map(|n| (Arc::from(n), i)))
        .collect()
}

pub(crate) fn add_headers(
    loc: &Location,
    err: &impl Fn(String) -> RouteError,
    scope: &Scope,
) -> Result<Vec<(HeaderName, Template, bool)>, RouteError> {
    let mut out = Vec::new();
    for h in &loc.proxy.add_headers {
        let name = HeaderName::from_bytes(h.name.as_bytes())
            .map_err(|_| err(format!("invalid header name \"{}\"", h.name)))?;
        out.push((
            name,
            Template::parse_with(&h.value, scope).map_err(|e| err(e.to_string()))?,
            h.always,
        ));
    }
    Ok(out)
}

pub(crate) fn access_log(
    loc: &Location,
    logs: &mut HashMap<std::path::PathBuf, Arc<crate::obs::log::AccessLogWriter>>,
    scope: &Scope,
    err: &impl Fn(String) -> RouteError,
) -> Result<Option<Arc<crate::obs::log::AccessLogWriter>>, RouteError> {
    open_log(loc.proxy.access_log.as_ref(), logs, scope, err)
}

/// Open an `access_log` (one file per path, shared).
fn open_log(
    log: Option<&vigil_core::config::AccessLog>,
    logs: &mut HashMap<std::path::PathBuf, Arc<crate::obs::log::AccessLogWriter>>,
    scope: &Scope,
    err: &impl Fn(String) -> RouteError,
) -> Result<Option<Arc<crate::obs::log::AccessLogWriter>>, RouteError> {
    let Some(a) = log else {
        return Ok(None);
    };
    // One file per path; each access_log its own format and if=.
    let w = Arc::new(
        crate::obs::log::AccessLogWriter::open(a, logs.get(&a.path).map(|w| &**w), scope)
            .map_err(err)?,
    );
    logs.entry(a.path.clone()).or_insert_with(|| w.clone());
    Ok(Some(w))
}

// === impl Route ===

impl Route {
    /// Whether nothing on a response's way to the client reads or edits
    /// its upstream fields (no `add_header`, gzip, `error_page` or
    /// `expires`), which
    /// may then pass as they came ([`crate::wire::raw_head`]).
    pub(crate) fn passes_fields_as_they_came(&self) -> bool {
        self.add_headers.is_empty()
            && !self.location.proxy.gzip.enable
            && self.error_pages.is_empty()
            && self.expires == vigil_core::config::Expires::Off
    }

    /// The variables of `parts` on this route before any attempt (no
    /// `$upstream_*`, no request time), with response status `status` (0:
    /// none yet).
    pub(crate) fn vars<'a>(
        &'a self,
        parts: &'a Parts,
        target: Option<&'a Target>,
        client: SocketAddr,
        local: SocketAddr,
        status: u16,
    ) -> crate::nginx::vars::VarContext<'a> {
        crate::nginx::vars::VarContext {
            parts,
            target,
            client,
            local,
            proxy_host: &self.proxy_host,
            attempts: &[],
            status,
            request_time: 0.0,
        }
    }

    fn build(
        loc: &Location,
        client: &vigil_core::config::ClientSettings,
        (registry, pools, zones): (
            &Registry,
            &HashMap<String, Arc<Pool>>,
            &crate::nginx::limit::Zones,
        ),
        logs: &mut HashMap<std::path::PathBuf, Arc<crate::obs::log::AccessLogWriter>>,
        scope: &Scope,
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
        let upstream_index = registry
            .upstreams()
            .iter()
            .position(|u| Arc::ptr_eq(u, &upstream))
            .unwrap_or(usize::MAX);
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
                Some(Template::parse_with(&h.value, scope).map_err(|e| err(e.to_string()))?)
            };
            set_headers.push((name, h.name.clone().into_boxed_str(), value));
        }
        let add_headers = add_headers(loc, &err, scope)?;
        let pass_template = match pass.uri.as_deref() {
            Some(u) if u.contains('$') => {
                Some(Template::parse_with(u, scope).map_err(|e| err(format!("proxy_pass: {e}")))?)
            }
            _ => None,
        };
        let hash_key = match &upstream.config().balancer {
            vigil_core::config::Balancer::Hash { key, .. } => {
                Some(Template::parse_with(key, scope).map_err(|e| err(format!("hash key: {e}")))?)
            }
            _ => None,
        };
        let access_log = access_log(loc, logs, scope, &err)?;
        let headers = crate::nginx::redirect::Rules::of(loc)
            .map_err(|e| err(format!("proxy_redirect: {e}")))?;
        let limits = crate::nginx::limit::Limits::build(&loc.proxy.limits, zones, scope)
            .map_err(|e| err(format!("limit_req / limit_conn: {e}")))?;
        Ok(Some(Self {
            limits,
            headers,
            expires: loc.proxy.files.expires,
            client: client.clone(),
            access_log,
            policy: RetryPolicy::of(&loc.proxy),
            proxy_host: pass.upstream.clone(),
            host_value: http::HeaderValue::from_str(&pass.upstream).ok(),
            tls: if pass.tls {
                Some(
                    crate::upstream::connect::TlsSettings::new(
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
            upstream_index,
            pool,
            set_headers,
            add_headers,
            hash_key,
            pass_template,
            error_pages: crate::nginx::error_page::ErrorPages::build(
                &loc.proxy.error_pages,
                loc.proxy.intercept_errors,
                scope,
            )?,
        }))
    }

    /// Expand a `proxy_pass` with variables for this request (after the
    /// rewrite phase), for [`Route::upstream_uri`].
    pub(crate) fn pass_uri(
        &self,
        parts: &mut Parts,
        target: Option<&Target>,
        net: crate::nginx::rewrite::Net,
    ) {
        let Some(t) = &self.pass_template else {
            return;
        };
        // The URI sent upstream is text (`Route::upstream_uri`): bytes that
        // are not UTF-8 are replaced.
        let uri = t.expand(&self.vars(parts, target, net.client, net.local, 0));
        let mut uri = match String::from_utf8(uri) {
            Ok(uri) => uri,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        };
        // nginx: an evaluated URI starting with `?` gets its `/`.
        if uri.starts_with('?') {
            uri.insert(0, '/');
        }
        parts.extensions.insert(PassUri(uri));
    }

    /// The URI sent upstream for this request (`target`: what `Routes`
    /// saw of it): see `upstream_target`.
    pub(crate) fn upstream_uri<'p>(
        &self,
        parts: &'p Parts,
        target: Option<&'p Target>,
    ) -> Cow<'p, str> {
        if let Some(p) = parts
            .extensions
            .get::<PassUri>()
            .filter(|p| !p.0.is_empty())
        {
            return Cow::Borrowed(&p.0);
        }
        match target {
            Some(t) => match as_sent(&self.location, &t.uri, t.internal) {
                Some(raw) => Cow::Borrowed(raw),
                None => Cow::Owned(target_uri(
                    &self.location,
                    &t.uri,
                    t.internal,
                    t.valid_location,
                )),
            },
            // Not routed by Routes: nothing normalised to build from.
            None => Cow::Borrowed(parts.uri.path_and_query().map_or("/", |p| p.as_str())),
        }
    }
}

// === impl Routes (the rewrite phases) ===

impl Routes {
    /// Route a request as nginx's phases do: pick the server block, run
    /// its script, find the location, run the location's script (again
    /// from the search after `last`), and say who answers. What routing
    /// saw of the request is left in `target` (None when no server block
    /// took it), its variables in `parts.extensions`.
    pub(crate) fn route_parts(
        &self,
        local: SocketAddr,
        client: SocketAddr,
        parts: &mut Parts,
        target: &mut Option<Target>,
    ) -> Result<Answer, Refusal> {
        let (server, mut routed, captured) =
            self.router
                .select(local, parts.version, &parts.uri, &parts.headers)?;
        if let Some(c) = captured {
            // ngx_http_regex_exec on the host: `$1`.. and every named
            // group ("" for one that took no part).
            let v = rewrite::vars(parts);
            for (name, i) in c.names {
                let g = c.groups.get(*i).cloned().flatten().unwrap_or_default();
                v.named.insert(name.clone(), g);
            }
            v.captures = c.groups;
        }
        routed.secure = parts
            .extensions
            .get::<crate::nginx::marks::Secure>()
            .is_some();
        let target = target.insert(routed);
        self.phases(server, Net { local, client }, parts, target)
    }

    /// From the server's rewrite phase on (a request's first pass, or an
    /// internal redirect to a URI).
    pub(crate) fn phases(
        &self,
        server: usize,
        net: Net,
        parts: &mut Parts,
        target: &mut Target,
    ) -> Result<Answer, Refusal> {
        if let Some(script) = self.server_scripts.get(server).filter(|s| !s.is_empty()) {
            match script.run(parts, target, net, self.server_base(server)) {
                Ran::Return(r) => return Ok(Answer::Return(r)),
                Ran::Done | Ran::Last => {}
            }
        }
        self.locations_from(server, None, net, parts, target)
    }

    /// A named location's rewrite phase and on (`error_page ... @name`).
    pub(crate) fn location_phase(
        &self,
        server: usize,
        location: usize,
        net: Net,
        parts: &mut Parts,
        target: &mut Target,
    ) -> Result<Answer, Refusal> {
        self.locations_from(server, Some(location), net, parts, target)
    }

    /// The find-config, rewrite and post-rewrite phases: search the
    /// location (unless `first` is given), run its script, again after
    /// `last`.
    fn locations_from(
        &self,
        server: usize,
        mut first: Option<usize>,
        net: Net,
        parts: &mut Parts,
        target: &mut Target,
    ) -> Result<Answer, Refusal> {
        for _ in 0..=rewrite::MAX_URI_CHANGES {
            let li = match first.take() {
                Some(li) => li,
                None => {
                    let (li, caps) = match self.router.locate(net.local, server, target) {
                        Ok(found) => found,
                        // No location: the server's own root (nginx's
                        // static handler with the server's settings).
                        Err(Refusal::NotFound) => return self.server_files(server),
                        Err(e) => return Err(e),
                    };
                    if self.any_internal && !target.internal && self.is_internal(server, li) {
                        return Err(Refusal::NotFound);
                    }
                    if let Some(c) = caps {
                        let names = self.capture_names.get(server).and_then(|n| n.get(li));
                        let v = rewrite::vars(parts);
                        if let Some(names) = names {
                            // ngx_http_regex_exec sets every named group,
                            // "" for one that took no part.
                            for (name, i) in names {
                                let g = c.get(*i).cloned().flatten().unwrap_or_default();
                                v.named.insert(name.clone(), g);
                            }
                        }
                        v.captures = c;
                    }
                    li
                }
            };
            target.redirects = self.router.redirects(server, li);
            let script = self.scripts.get(server).and_then(|s| s.get(li));
            let base = self.redirect_base(server, li);

            let ran = match script {
                Some(s) if !s.is_empty() => s.run(parts, target, net, base),
                _ => Ran::Done,
            };
            match ran {
                Ran::Return(r) => return Ok(Answer::Return(r)),
                Ran::Last => continue,
                Ran::Done => {
                    let Some(route) = self
                        .proxies
                        .get(server)
                        .and_then(|s| s.get(li))
                        .and_then(Option::clone)
                    else {
                        return self.no_handler(server, li, net, parts);
                    };
                    route.pass_uri(parts, Some(target), net);
                    return Ok(Answer::Proxy(route));
                }
            }
        }
        tracing::error!("rewrite or internal redirection cycle");
        Ok(Answer::Return(Arc::new(Reply::internal_error())))
    }

    /// A location that neither proxies nor returns: its access phase
    /// (after the real IP is set), then nginx's static handler (404, or
    /// 405: see `handler::refused`).
    fn no_handler(
        &self,
        server: usize,
        location: usize,
        net: Net,
        parts: &Parts,
    ) -> Result<Answer, Refusal> {
        let guard = self
            .guards
            .get(server)
            .and_then(|s| s.get(location))
            .and_then(Option::as_deref);
        if let Some(g) = guard {
            let client = crate::nginx::realip::client(
                &g.server_real_ip,
                &g.real_ip,
                net.client,
                &parts.headers,
            );
            if !crate::nginx::access::allows(&g.access, client.ip()) {
                tracing::debug!(client = %client.ip(), "access forbidden by rule");
                return Ok(Answer::Return(g.forbidden.clone()));
            }
        }
        match self.files.get(server).and_then(|s| s.get(location)) {
            Some(Some(f)) => Ok(Answer::Files(f.clone())),
            _ => Err(Refusal::NotFound),
        }
    }

    /// Whether location `location` of `server` is `internal`.
    fn is_internal(&self, server: usize, location: usize) -> bool {
        self.internal.get(server).and_then(|s| s.get(location)) == Some(&true)
    }

    /// The static files of server block `server`'s own level.
    fn server_files(&self, server: usize) -> Result<Answer, Refusal> {
        match self.server_files.get(server) {
            Some(f) => Ok(Answer::Files(f.clone())),
            None => Err(Refusal::NotFound),
        }
    }
}

#[cfg(test)]
mod tests;
