//! Which `server {}` block and location a request gets, from the
//! configuration alone (so the fuzz target drives it): the listener's
//! address picks the blocks that listen there, the request's host picks
//! one of them by `server_name` (vhost.rs), the normalised URI (uri.rs)
//! picks the location (location.rs); what nginx answers itself (400, 404,
//! the auto_redirect 301) is a `Refusal`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use http::header::{self, HeaderMap};
use http::request::Parts;
use http::{Uri, Version};
use vigil_core::config::Config;

use crate::nginx::location::{Found, Locations};
use crate::nginx::uri::{escape_uri, RequestUri, UriError};
use crate::nginx::vhost::{request_line_host, validate_host, Host, NameCaptures, ServerNames};

/// Which block and location a request gets, from the configuration alone.
#[derive(Debug)]
pub struct Router {
    /// Sorted by address (a few: searched without hashing).
    addresses: Vec<(SocketAddr, Address)>,
    servers: Vec<Server>,
}

/// The blocks listening on one address.
#[derive(Debug)]
struct Address {
    names: ServerNames,
    /// The `default_server`, else the first block listing the address.
    default: usize,
    /// Blocks listening on the address: with one, its names need no lookup.
    blocks: usize,
}

#[derive(Debug)]
struct Server {
    /// `$server_name`: the first name (`.x` as `x`), "" without one.
    name: Arc<str>,
    merge_slashes: bool,
    locations: Locations,
    /// Each location's `client_max_body_size` (a 413 comes before a 301).
    max_body: Vec<u64>,
    /// Each location's `absolute_redirect` and kin.
    redirects: Vec<vigil_core::config::Redirects>,
    /// A server-level `return` answers before any location is looked up.
    returns: bool,
}

/// A routed request: the block and location indices (into
/// `Config::servers` and its `locations`) and what nginx knows of it.
#[derive(Debug)]
pub struct Routed {
    /// Index of the server block.
    pub server: usize,
    /// Index of the location in that block; None when the block's own
    /// `return` answers (nginx's server rewrite phase, before locations).
    pub location: Option<usize>,
    /// The request's URI and host as nginx holds them.
    pub target: Target,
}

/// The request as routing saw it; the handler keeps it beside the
/// request's parts (`VarContext::target`), where `$uri`, `$host`,
/// `$server_name` and the upstream URI are read from.
#[derive(Clone, Debug)]
pub struct Target {
    /// The normalised URI and its query.
    pub uri: RequestUri,
    /// nginx's `r->headers_in.server`: the validated host from the request
    /// line, `Host` or `:authority`; "" when the request had none.
    pub host: Host,
    /// `$server_name` of the chosen block.
    pub server_name: Arc<str>,
    /// nginx's `r->internal`: a rewrite or internal redirect changed the
    /// URI (then it goes upstream escaped, never as the client sent it).
    pub internal: bool,
    /// nginx's `r->valid_location`: cleared by `rewrite ... break`, after
    /// which a `proxy_pass` URI part no longer replaces the location's path.
    pub valid_location: bool,
    /// Index of the server block (in `Config::servers`).
    pub server: usize,
    /// The request came over TLS: redirects vigil makes absolute say
    /// `https://` (and leave out port 443).
    pub secure: bool,
    /// The location's `absolute_redirect` and kin (the defaults before a
    /// location is found).
    pub redirects: vigil_core::config::Redirects,
}

/// A request routing answers itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// 400: an invalid URI or host (what, as nginx logs it).
    BadRequest(&'static str),
    /// 404: no location, or one that proxies nowhere.
    NotFound,
    /// 301 to `location` (nginx's auto_redirect of `/api` to `/api/`),
    /// unless the body is over `max_body` (then 413, as nginx checks first).
    Redirect {
        /// The `Location` value, absolute as nginx sends it.
        location: String,
        /// The location's `client_max_body_size` (0 = no limit).
        max_body: u64,
    },
    /// The request came in on an address this generation does not listen
    /// on (a reload dropped it): no block may answer for another's address.
    UnknownListener,
    /// 500: a location's regex could not finish its match (PCRE's match
    /// limit), nginx's find-config phase failing.
    RegexFailed,
    /// A `server_name` regex could not finish its match: nginx closes the
    /// request without an answer (logged as 500).
    ServerNameFailed,
}

// === impl Refusal ===

impl Refusal {
    /// A 400 for the request line (its target or its host), which nginx
    /// answers before it reads any header: its log line shows none.
    pub(crate) fn in_request_line(&self) -> bool {
        matches!(
            self,
            Refusal::BadRequest(
                "invalid request target" | "invalid request URI" | "invalid host in request line"
            )
        )
    }
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

// === impl Router ===

impl Router {
    /// Index `config`'s blocks by address and name, and their locations.
    /// Errors: a `server_name` nginx refuses, two `default_server`s on one
    /// address, a duplicate location.
    pub fn build(config: &Config) -> Result<Self, RouteError> {
        let mut addresses: HashMap<SocketAddr, Address> = HashMap::new();
        let mut servers = Vec::new();
        for (si, s) in config.servers.iter().enumerate() {
            let at = |message: String| RouteError {
                at: s.origin.to_string(),
                message,
            };
            for l in &s.listen {
                let a = addresses.entry(l.addr).or_insert_with(|| Address {
                    names: ServerNames::default(),
                    default: si,
                    blocks: 0,
                });
                if l.default_server {
                    let earlier = config.servers[..si].iter().any(|o| {
                        o.listen
                            .iter()
                            .any(|ol| ol.addr == l.addr && ol.default_server)
                    });
                    if earlier {
                        return Err(at(format!("a duplicate default server for {}", l.addr)));
                    }
                    a.default = si;
                }
            }
            // The names go to every address the block listens on (once each).
            let mut seen = Vec::new();
            for l in &s.listen {
                if seen.contains(&l.addr) {
                    continue;
                }
                seen.push(l.addr);
                let Some(a) = addresses.get_mut(&l.addr) else {
                    continue;
                };
                a.blocks += 1;
                if s.server_names.is_empty() {
                    // nginx's default: server_name "".
                    a.names.add("", si).map_err(|e| at(e.0))?;
                }
                for n in &s.server_names {
                    a.names.add(n, si).map_err(|e| at(e.0))?;
                }
            }
            let locations = Locations::build(&s.locations).map_err(|message| {
                let at = s
                    .locations
                    .iter()
                    .rev()
                    .find(|l| message.contains(&format!("\"{}\"", l.path)))
                    .map_or_else(|| s.origin.to_string(), |l| l.origin.to_string());
                RouteError { at, message }
            })?;
            servers.push(Server {
                name: server_name(&s.server_names).into(),
                merge_slashes: s.client.merge_slashes,
                locations,
                max_body: s
                    .locations
                    .iter()
                    .map(|l| l.proxy.client_max_body_size)
                    .collect(),
                redirects: s.locations.iter().map(|l| l.proxy.redirects).collect(),
                returns: s.ret.is_some(),
            });
        }
        let mut addresses: Vec<(SocketAddr, Address)> = addresses.into_iter().collect();
        addresses.sort_unstable_by_key(|(a, _)| *a);
        Ok(Self { addresses, servers })
    }

    /// Route a request that arrived on `listener` (HTTP/1.x: `uri` is the
    /// request target, absolute-form included; HTTP/2: `:authority` and
    /// `:path`).
    pub fn route(
        &self,
        listener: SocketAddr,
        version: Version,
        uri: &Uri,
        headers: &HeaderMap,
    ) -> Result<Routed, Refusal> {
        let (server, target, _) = self.select(listener, version, uri, headers)?;
        if self.servers.get(server).is_some_and(|s| s.returns) {
            return Ok(Routed {
                server,
                location: None,
                target,
            });
        }
        let (location, _) = self.locate(listener, server, &target)?;
        Ok(Routed {
            server,
            location: Some(location),
            target,
        })
    }

    /// The server block for a request and the request as nginx holds it
    /// (normalised URI, validated host), with what the `server_name` regex
    /// that picked the block captured; or what nginx answers itself.
    pub(crate) fn select(
        &self,
        listener: SocketAddr,
        version: Version,
        uri: &Uri,
        headers: &HeaderMap,
    ) -> Result<(usize, Target, Option<NameCaptures<'_>>), Refusal> {
        let address = self.address(listener).ok_or(Refusal::UnknownListener)?;
        let host = request_host(version, uri, headers)?;
        let target = uri.path_and_query();
        let h2 = version == Version::HTTP_2;
        // Only an absolute-form target may lack a path (`CONNECT host:443`'s
        // authority-form has no scheme, and nginx refuses it).
        let absolute_form = !h2 && uri.scheme().is_some();
        let normalise = |server: usize| {
            let merge = self.servers.get(server).is_none_or(|s| s.merge_slashes);
            RequestUri::parse_target(target, merge, absolute_form).map_err(|e| {
                Refusal::BadRequest(match e {
                    UriError::NotAbsolutePath => "invalid request target",
                    UriError::BadEscape | UriError::Nul | UriError::AboveRoot => {
                        "invalid request URI"
                    }
                })
            })
        };
        // ngx_http_optimize_servers: one block's names are looked up only
        // when a regex of them has groups to set.
        let pick = |host: &str| match address.blocks {
            1 if !address.names.captures() => Ok((address.default, None)),
            _ => match address.names.lookup(host) {
                Ok(Some(found)) => Ok(found),
                Ok(None) => Ok((address.default, None)),
                Err(e) => {
                    // nginx logs it at "alert" and closes the request.
                    tracing::error!(host, "{e}");
                    Err(Refusal::ServerNameFailed)
                }
            },
        };
        // HTTP/1.x reads the request line, with the address's default
        // block's settings, before any header; HTTP/2 clients send
        // :authority before :path, so nginx has picked the block by then.
        let ((server, captured), uri) = if h2 {
            let picked = pick(&host)?;
            let uri = normalise(picked.0)?;
            (picked, uri)
        } else {
            let uri = normalise(address.default)?;
            (pick(&host)?, uri)
        };
        let s = self.servers.get(server).ok_or(Refusal::NotFound)?;
        let target = Target {
            uri,
            host,
            server_name: s.name.clone(),
            internal: false,
            valid_location: true,
            server,
            secure: false,
            redirects: vigil_core::config::Redirects::default(),
        };
        Ok((server, target, captured))
    }

    /// The location of `server` for `target`'s URI (nginx's find-config
    /// phase) and the groups of the regex location that matched.
    pub(crate) fn locate(
        &self,
        listener: SocketAddr,
        server: usize,
        target: &Target,
    ) -> Result<(usize, Option<crate::nginx::location::Captures>), Refusal> {
        let s = self.servers.get(server).ok_or(Refusal::NotFound)?;
        match s.locations.search(target.uri.path()) {
            (Found::Location(location), caps) => Ok((location, caps)),
            (Found::Redirect(i), _) => Err(Refusal::Redirect {
                location: redirect_location(
                    target,
                    listener,
                    s.locations.path(i),
                    s.redirects.get(i).copied().unwrap_or_default(),
                ),
                max_body: s.max_body.get(i).copied().unwrap_or(0),
            }),
            (Found::Nothing, _) => Err(Refusal::NotFound),
            (Found::Failed, _) => Err(Refusal::RegexFailed),
        }
    }

    /// The `absolute_redirect` and kin of location `li` of `server`.
    pub(crate) fn redirects(&self, server: usize, li: usize) -> vigil_core::config::Redirects {
        self.servers
            .get(server)
            .and_then(|s| s.redirects.get(li))
            .copied()
            .unwrap_or_default()
    }

    /// The `@name` location of `server`.
    pub(crate) fn named(&self, server: usize, name: &str) -> Option<usize> {
        self.servers.get(server)?.locations.named(name)
    }

    /// The named groups of every regex location (variables of the configuration).
    pub(crate) fn group_names(&self) -> impl Iterator<Item = &str> {
        self.servers.iter().flat_map(|s| s.locations.group_names())
    }

    /// The blocks for a connection accepted on `listener`: its own address,
    /// else the wildcard address of its port (`listen 8080` is 0.0.0.0:8080).
    /// The index of the default server of `listener` (its `default_server`,
    /// else the first block listing it), if the configuration listens there.
    pub(crate) fn default_server(&self, listener: SocketAddr) -> Option<usize> {
        self.address(listener).map(|a| a.default)
    }

    fn address(&self, listener: SocketAddr) -> Option<&Address> {
        let get = |addr: &SocketAddr| {
            self.addresses
                .binary_search_by(|(a, _)| a.cmp(addr))
                .ok()
                .and_then(|i| self.addresses.get(i))
                .map(|(_, a)| a)
        };
        get(&listener).or_else(|| {
            let any = SocketAddr::new(
                match listener {
                    SocketAddr::V4(_) => std::net::Ipv4Addr::UNSPECIFIED.into(),
                    SocketAddr::V6(_) => std::net::Ipv6Addr::UNSPECIFIED.into(),
                },
                listener.port(),
            );
            get(&any)
        })
    }
}

/// `$server_name` as nginx sets it: the first name, `.example.com` as
/// `example.com`, a regex with its `~`.
fn server_name(names: &[String]) -> String {
    match names.first() {
        None => String::new(),
        Some(n) if n.starts_with('~') => n.clone(),
        Some(n) => n
            .strip_prefix('.')
            .filter(|r| !r.is_empty())
            .unwrap_or(n)
            .to_ascii_lowercase(),
    }
}

/// The request's host as nginx's `r->headers_in.server`, or the 400 nginx
/// answers: two `Host`s, an invalid one (`ngx_http_validate_host`), none on
/// HTTP/1.1 or HTTP/2. On HTTP/1.x an absolute-form target's host wins
/// over `Host` (which must still be valid); nginx 1.22 takes HTTP/2's
/// `:authority` as a `Host` header, so both at once are two.
fn request_host(version: Version, uri: &Uri, headers: &HeaderMap) -> Result<Host, Refusal> {
    let bad = Refusal::BadRequest;
    let mut hosts = headers.get_all(header::HOST).iter();
    let first = hosts.next();
    let two = hosts.next().is_some();
    if version == Version::HTTP_2 {
        let authority = uri.authority().map(|a| a.as_str().as_bytes());
        if two || (authority.is_some() && first.is_some()) {
            return Err(bad("duplicate host header"));
        }
        let raw = authority
            .or(first.map(|v| v.as_bytes()))
            .ok_or(bad("request without host"))?;
        return validate_host(raw).ok_or(bad("invalid host header"));
    }
    if two {
        return Err(bad("duplicate host header"));
    }
    let line = match uri.authority() {
        Some(a) => Some(
            request_line_host(a.as_str())
                .and_then(|h| validate_host(h.as_bytes()))
                .ok_or(bad("invalid host in request line"))?,
        ),
        None => None,
    };
    let header = match first {
        Some(v) => Some(validate_host(v.as_bytes()).ok_or(bad("invalid host header"))?),
        None if version >= Version::HTTP_11 => return Err(bad("HTTP/1.1 request without host")),
        None => None,
    };
    Ok(line.or(header).unwrap_or_default())
}

/// nginx's auto_redirect `Location`: the location's path escaped, the
/// query kept, made absolute as its header filter does (`absolute_redirect
/// on`, `port_in_redirect on`): the request's host, else the listener's
/// address (an IPv6 one without brackets, as nginx writes it), and the
/// port unless it is 80.
fn redirect_location(
    target: &Target,
    listener: SocketAddr,
    path: &str,
    redirects: vigil_core::config::Redirects,
) -> String {
    let mut out = absolute_prefix_as(target, listener, redirects);
    escape_uri(&mut out, path.as_bytes());
    if !target.uri.args().is_empty() {
        out.push('?');
        out.push_str(target.uri.args());
    }
    out
}

/// What nginx's header filter puts before a `Location` that starts with
/// `/` (`absolute_redirect on`, `server_name_in_redirect off`,
/// `port_in_redirect on`): the scheme, the request's host (else the
/// listener's address) and the listener's port unless it is the scheme's
/// own (80 for `http://`, 443 for `https://`).
pub(crate) fn absolute_prefix(target: &Target, listener: SocketAddr) -> String {
    absolute_prefix_as(target, listener, target.redirects)
}

/// [`absolute_prefix`] under `redirects`: nothing with `absolute_redirect
/// off` (the `Location` stays relative); the server's first name for the
/// host with `server_name_in_redirect on` (the request's host when the
/// server has none); no port with `port_in_redirect off`.
fn absolute_prefix_as(
    target: &Target,
    listener: SocketAddr,
    redirects: vigil_core::config::Redirects,
) -> String {
    if !redirects.absolute {
        return String::new();
    }
    let (mut out, default_port) = if target.secure {
        (String::from("https://"), 443)
    } else {
        (String::from("http://"), 80)
    };
    if redirects.server_name && !target.server_name.is_empty() {
        out.push_str(&target.server_name);
    } else if target.host.is_empty() {
        out.push_str(&listener.ip().to_string());
    } else {
        out.push_str(&target.host);
    }
    if redirects.port && listener.port() != default_port {
        out.push(':');
        out.push_str(&listener.port().to_string());
    }
    out
}

/// `$host` of a request the handler did not route (unit tests of
/// variables): the same rules, "" where they would refuse it.
pub(crate) fn host_of(parts: &Parts) -> Host {
    request_host(parts.version, &parts.uri, &parts.headers).unwrap_or_default()
}
