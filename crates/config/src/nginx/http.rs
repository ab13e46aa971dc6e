//! `http {}`, `server {}` and `location {}`: listeners, routes and the
//! inherited `proxy_*` settings.

use std::net::SocketAddr;

use super::sources::Placements;
use super::syntax::{Arg, Directive};
use super::upstream::upstream_block;
use super::{args, bad, block, number, on_off, one, origin, time, unknown, unsupported, Context};
use crate::addr::Use;
use crate::validate;
use crate::ConfigError;
use vigil_core::config::value::parse_size;
use vigil_core::config::{
    AddHeader, ClientSettings, HttpVersion, Listen, Location, LocationMatch, LocationRouting,
    LogFormatDef, ProxyPass, ProxySettings, Return, RewriteStep, ServerBlock, ServerConfig,
    SetHeader, UpstreamConfig,
};
use vigil_core::outcome::NextUpstream;

/// Settings inherited downwards, with nginx's array rule: a level that has
/// any `proxy_set_header` (or `add_header`) replaces the inherited list.
#[derive(Clone)]
struct Level {
    proxy: ProxySettings,
    /// http/server-level only (nginx: "not allowed here" in a location).
    client: ClientSettings,
    own_set_headers: bool,
    own_add_headers: bool,
    own_error_pages: bool,
    /// `default_type`: the `Content-Type` of a `return`'s text.
    default_type: String,
    /// Where the settings in force were written.
    placed: Placements,
    /// The `ssl_*` settings in force.
    tls: super::ssl::TlsLevel,
    /// The `log_format`s of `http {}` (for `access_log` to name).
    formats: Vec<LogFormatDef>,
    /// This level's own `access_log`: a file (true) or `off` (false);
    /// a second file is refused.
    own_access_log: Option<bool>,
    /// Whether this level has its own `gzip_types` (a second adds to it).
    own_gzip_types: bool,
    /// Whether this level has its own `allow`/`deny`, `set_real_ip_from`.
    own_access: crate::nginx::access::Own,
    /// Whether this level has its own proxy_redirect / hide / pass lists.
    own_headers: crate::nginx::filters::OwnHeaders,
    /// This level's own `resolver` (the http level's is the upstreams'
    /// default; a server's or location's is read and has no use in vigil).
    resolver: Option<vigil_core::config::ResolverConfig>,
    /// This level's own `resolver_timeout`.
    resolver_timeout: Option<std::time::Duration>,
    /// Whether this level has its own `limit_req`, `limit_conn`.
    own_limits: super::limit::Own,
    /// What this level set of the static-file directives.
    own_files: super::files::Own,
    /// The location this level is (its match and path), None for http
    /// and server.
    location: Option<(LocationMatch, String)>,
}

pub(super) fn http_block(cx: &mut Context<'_>, body: &[&Directive]) -> Result<(), ConfigError> {
    let mut level = Level::new(ProxySettings::default(), ClientSettings::default());
    let mut servers = Vec::new();
    for d in body {
        match d.name.as_str() {
            "upstream" => {
                let Some(up) = upstream_block(cx, d)? else {
                    continue;
                };
                if cx.config.upstreams.iter().any(|u| u.name == up.name) {
                    cx.refuse(ConfigError::invalid(
                        &d.span,
                        format!("duplicate upstream \"{}\"", up.name),
                    ))?;
                    continue;
                }
                cx.config.upstreams.push(up);
            }
            "server" => servers.push(*d),
            "map" => {
                let r = super::rewrite::map(d, super::rewrite::builtin).and_then(|m| {
                    if cx.config.maps.iter().any(|o| o.variable == m.variable) {
                        return Err(ConfigError::invalid(
                            &d.args[1].span,
                            format!("the duplicate \"{}\" variable", m.variable),
                        ));
                    }
                    Ok(m)
                });
                if let Some(m) = cx.keep(r)? {
                    cx.config.maps.push(m);
                }
            }
            "limit_req_zone" | "limit_conn_zone" => {
                let r = super::limit::zone(cx, d);
                cx.keep(r)?;
            }
            "log_format" => {
                let r = crate::nginx::log::log_format(d, &level.formats);
                if let Some(f) = cx.keep(r)? {
                    level.formats.push(f);
                }
            }
            _ => level_directive(cx, &mut level, d, "http")?,
        }
    }
    // `resolver` may follow the upstreams that use it, as in nginx.
    let mut ups = std::mem::take(&mut cx.config.upstreams);
    for up in &mut ups {
        let r =
            super::upstream::merge_resolver(up, level.resolver.as_ref(), level.resolver_timeout);
        cx.keep(r)?;
    }
    cx.config.upstreams = ups;
    // Servers after upstreams: proxy_pass may name an upstream defined later.
    for d in servers {
        let r = server_block(cx, d, &level);
        if let Some((s, placed)) = cx.keep(r)? {
            cx.config.servers.push(s);
            cx.sources.add_server_block(placed);
        }
    }
    super::limit::check_uses(cx)?;
    super::ssl::check_listeners(cx)
}

/// An http- or server-level directive that is not a block: applied to
/// `level`, ignored, or refused.
fn level_directive(
    cx: &mut Context<'_>,
    level: &mut Level,
    d: &Directive,
    context: &str,
) -> Result<(), ConfigError> {
    if let Some(r) = level.tls.directive(d) {
        return cx.keep(r).map(drop);
    }
    let r = level.directive(cx, d).and_then(|done| {
        if done {
            return Ok(true);
        }
        level.client_directive(d)
    });
    match cx.keep(r)? {
        Some(true) | None => Ok(()),
        Some(false) if ignorable(cx, d) => Ok(()),
        Some(false) => cx.refuse(unknown(d, context)),
    }
}

fn server_block(
    cx: &mut Context<'_>,
    d: &Directive,
    parent: &Level,
) -> Result<(ServerBlock, Vec<Placements>), ConfigError> {
    let body = block(d)?;
    let mut level = parent.child();
    let mut listen: Vec<Listen> = Vec::new();
    let mut server_names = Vec::new();
    let mut locations = Vec::new();
    let mut ret = None;
    let mut script = Vec::new();
    for d in body {
        match d.name.as_str() {
            "listen" => {
                let r = listen_directive(cx, d);
                let Some((l, options)) = cx.keep(r)? else {
                    continue;
                };
                let r = seen_listen(cx, d, &listen, &l, options);
                if cx.keep(r)?.is_some() {
                    listen.push(l);
                }
            }
            "server_name" => {
                let r = args(d, 1, 64);
                if let Some(a) = cx.keep(r)? {
                    server_names.extend(a.iter().map(|a| a.value.clone()));
                }
            }
            "location" => locations.push(d),
            _ if script_directive(cx, d, &mut ret, &mut script)? => {}
            _ => level_directive(cx, &mut level, d, "server")?,
        }
    }
    if listen.is_empty() {
        // nginx's default: *:80 (or 8000 when not root); vigil takes 80.
        listen.push(Listen {
            addr: SocketAddr::from(([0, 0, 0, 0], 80)),
            default_server: false,
            reuseport: false,
            backlog: None,
            ssl: false,
            http2: false,
        });
    }
    let tls = cx.keep(level.tls.finish())?.unwrap_or_default();
    // nginx's post-read phase applies the server's realip settings.
    level.proxy.server_real_ip = level.proxy.real_ip.clone();
    let mut out: Vec<Location> = Vec::new();
    let mut placed = Vec::new();
    for l in locations {
        location_block(cx, l, &level, None, &mut out, &mut placed)?;
    }
    Ok((
        ServerBlock {
            listen,
            server_names,
            client: level.client,
            locations: out,
            ret: ret.map(|r| Return {
                content_type: level.default_type.clone(),
                ..r
            }),
            rewrite: typed(script, &level.default_type),
            origin: origin(&d.span),
            tls,
            error_pages: level.proxy.error_pages.clone(),
            access_log: level.proxy.access_log.clone(),
            files: vigil_core::config::FileSettings {
                default_type: level.default_type.clone(),
                ..level.proxy.files.clone()
            },
        },
        placed,
    ))
}

/// The rewrite module's directives (`return`, `rewrite`, `set`, and `if`,
/// which vigil refuses), alike in a server and a location: true when `d`
/// was one of them.
fn script_directive(
    cx: &mut Context<'_>,
    d: &Directive,
    ret: &mut Option<Return>,
    script: &mut Vec<RewriteStep>,
) -> Result<bool, ConfigError> {
    match d.name.as_str() {
        "return" => {
            if let Some(r) = cx.keep(return_directive(d))? {
                // nginx runs the first `return` of a block; the rest never.
                ret.get_or_insert(r.clone());
                script.push(RewriteStep::Return(r));
            }
        }
        "rewrite" | "set" => {
            if let Some(step) = cx.keep(script_step(d))? {
                script.push(step);
            }
        }
        "if" => cx.refuse(unsupported(
            d,
            "vigil has no `if` yet (to keep this conf on nginx, run `vigil check` beside it)",
        ))?,
        _ => return Ok(false),
    }
    Ok(true)
}

/// A `rewrite` or `set`.
fn script_step(d: &Directive) -> Result<RewriteStep, ConfigError> {
    Ok(match d.name.as_str() {
        "rewrite" => RewriteStep::Rewrite(super::rewrite::rewrite(d)?),
        _ => RewriteStep::Set(super::rewrite::set(d, super::rewrite::builtin)?),
    })
}

/// The script with its `return`s given the block's `default_type`.
fn typed(mut script: Vec<RewriteStep>, default_type: &str) -> Vec<RewriteStep> {
    for s in &mut script {
        if let RewriteStep::Return(r) = s {
            r.content_type = default_type.to_string();
        }
    }
    script
}

/// A location and the locations nested in it, pushed to `out` (with the
/// directives in force in `placed`) in file order, each knowing its parent.
fn location_block(
    cx: &mut Context<'_>,
    d: &Directive,
    parent: &Level,
    parent_index: Option<usize>,
    out: &mut Vec<Location>,
    placed: &mut Vec<Placements>,
) -> Result<(), ConfigError> {
    let r = location_head(d);
    let Some((matcher, path)) = cx.keep(r)? else {
        return Ok(());
    };
    let r = nesting(d, &matcher, &path, parent_index.and_then(|i| out.get(i)));
    if cx.keep(r)?.is_none() {
        return Ok(());
    }
    let Some(body) = cx.keep(block(d))? else {
        return Ok(());
    };
    let mut level = parent.child();
    // try_files and internal are the location's own (nginx merges neither).
    level.proxy.files.try_files.clear();
    level.proxy.files.internal = false;
    level.location = Some((matcher, path.clone()));
    let mut pass = None;
    let mut ret = None;
    let mut script = Vec::new();
    let mut nested = Vec::new();
    for d in body {
        match d.name.as_str() {
            "proxy_pass" => {
                let r = proxy_pass(cx, d).and_then(|p| match matcher {
                    LocationMatch::Regex | LocationMatch::RegexCaseless | LocationMatch::Named
                        if p.uri.as_ref().is_some_and(|u| !u.contains('$')) =>
                    {
                        Err(ConfigError::invalid(
                            &d.span,
                            "\"proxy_pass\" cannot have URI part in location given by regular expression, or inside named location, or inside \"if\" statement, or inside \"limit_except\" block",
                        ))
                    }
                    _ => Ok(p),
                });
                if let Some(p) = cx.keep(r)? {
                    pass = Some(p);
                    level.placed.set(d);
                }
            }
            "location" => nested.push(d),
            _ if script_directive(cx, d, &mut ret, &mut script)? => {}
            _ if Level::is_client_directive(&d.name) => cx.refuse(ConfigError::invalid(
                &d.span,
                format!("\"{}\" directive is not allowed here", d.name),
            ))?,
            _ => {
                let r = level.directive(cx, d);
                if cx.keep(r)? == Some(false) && !ignorable(cx, d) {
                    cx.refuse(unknown(d, "location"))?;
                }
            }
        }
    }
    level.proxy.files.default_type = level.default_type.clone();
    if pass.is_some() {
        let r = proxied_files(d, &level.placed, &level.proxy.files);
        cx.keep(r)?;
    }
    level.proxy.pass = pass;
    let loc = Location {
        matcher,
        path,
        proxy: level.proxy.clone(),
        ret: ret.map(|r| Return {
            content_type: level.default_type.clone(),
            ..r
        }),
        routing: LocationRouting {
            parent: parent_index,
            script: typed(script, &level.default_type),
        },
        origin: origin(&d.span),
    };
    let siblings: Vec<Location> = out
        .iter()
        .filter(|o| o.routing.parent == parent_index)
        .cloned()
        .collect();
    let dup =
        validate::duplicate_location(&siblings, &loc).map_err(|m| ConfigError::invalid(&d.span, m));
    if cx.keep(dup)?.is_none() {
        return Ok(());
    }
    let index = out.len();
    out.push(loc);
    placed.push(level.placed.clone());
    // Nested locations inherit from this one, as nginx merges them.
    level.placed.clear("proxy_pass");
    level.proxy.pass = None;
    for n in nested {
        location_block(cx, n, &level, Some(index), out, placed)?;
    }
    Ok(())
}

/// What vigil does not do yet in a location that proxies: `try_files`
/// (nginx tests the files, then proxies with the URI it found).
fn proxied_files(
    d: &Directive,
    placed: &Placements,
    files: &vigil_core::config::FileSettings,
) -> Result<(), ConfigError> {
    let at = |name: &str| placed.get(name).map_or(&d.span, |p| &p.span);
    if !files.try_files.is_empty() {
        return Err(ConfigError::invalid(
            at("try_files"),
            "\"try_files\" in a location with \"proxy_pass\" is not supported by vigil yet (name a location with proxy_pass as try_files' last argument: try_files $uri @app)",
        ));
    }
    Ok(())
}

/// The match kind and path of `location [=|^~|~|~*] PATH` or `location
/// @name` (also the one-word forms `=/x`, `^~/x`, `~\.php$`, as nginx reads them).
fn location_head(d: &Directive) -> Result<(LocationMatch, String), ConfigError> {
    let regex = |a: &Arg, p: &str, caseless: bool| {
        super::rewrite::regex(a, p, caseless).map(|()| {
            let m = if caseless {
                LocationMatch::RegexCaseless
            } else {
                LocationMatch::Regex
            };
            (m, p.to_string())
        })
    };
    match d.args.as_slice() {
        [m, p] => match m.value.as_str() {
            "=" => Ok((LocationMatch::Exact, p.value.clone())),
            "^~" => Ok((LocationMatch::PrefixNoRegex, p.value.clone())),
            "~" => regex(p, &p.value, false),
            "~*" => regex(p, &p.value, true),
            _ => Err(ConfigError::invalid(
                &m.span,
                format!("invalid location modifier \"{}\"", m.value),
            )),
        },
        [p] => {
            let v = p.value.as_str();
            if let Some(x) = v.strip_prefix('=') {
                Ok((LocationMatch::Exact, x.to_string()))
            } else if let Some(x) = v.strip_prefix("^~") {
                Ok((LocationMatch::PrefixNoRegex, x.to_string()))
            } else if let Some(x) = v.strip_prefix("~*") {
                regex(p, x, true)
            } else if let Some(x) = v.strip_prefix('~') {
                regex(p, x, false)
            } else if v.starts_with('@') {
                Ok((LocationMatch::Named, v.to_string()))
            } else {
                Ok((LocationMatch::Prefix, v.to_string()))
            }
        }
        _ => Err(ConfigError::invalid(
            &d.span,
            "invalid number of arguments in \"location\" directive",
        )),
    }
}

/// nginx's rules for a location inside another (ngx_http_core_location).
fn nesting(
    d: &Directive,
    matcher: &LocationMatch,
    path: &str,
    parent: Option<&Location>,
) -> Result<(), ConfigError> {
    let Some(p) = parent else {
        return Ok(());
    };
    let message = match p.matcher {
        LocationMatch::Exact => format!(
            "location \"{path}\" cannot be inside the exact location \"{}\"",
            p.path
        ),
        LocationMatch::Named => format!(
            "location \"{path}\" cannot be inside the named location \"{}\"",
            p.path
        ),
        _ if *matcher == LocationMatch::Named => {
            format!("named location \"{path}\" can be on the server level only")
        }
        _ if !matches!(matcher, LocationMatch::Regex | LocationMatch::RegexCaseless)
            && !path.starts_with(p.path.as_str()) =>
        {
            format!("location \"{path}\" is outside location \"{}\"", p.path)
        }
        _ => return Ok(()),
    };
    Err(ConfigError::invalid(&d.span, message))
}

/// `return CODE [TEXT|URL]` or `return URL`, parsed as
/// `ngx_http_rewrite_return` parses it.
fn return_directive(d: &Directive) -> Result<Return, ConfigError> {
    let a = args(d, 1, 2)?;
    let first = &a[0];
    let code = Some(&first.value)
        .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|v| v.parse::<u32>().ok());
    let invalid = || {
        ConfigError::invalid(
            &first.span,
            format!("invalid return code \"{}\"", first.value),
        )
    };
    match code {
        Some(n) if n > 999 => Err(invalid()),
        Some(n) => Ok(Return {
            code: n as u16,
            text: a.get(1).map(|t| t.value.clone()),
            content_type: String::new(),
        }),
        None if a.len() == 1
            && ["http://", "https://", "$scheme"]
                .iter()
                .any(|p| first.value.starts_with(p)) =>
        {
            Ok(Return {
                code: 302,
                text: Some(first.value.clone()),
                content_type: String::new(),
            })
        }
        None => Err(invalid()),
    }
}

/// `proxy_pass http://NAME[/uri]`: an upstream block, or an implicit
/// single-server upstream for `host:port` (as nginx makes one).
fn proxy_pass(cx: &mut Context<'_>, d: &Directive) -> Result<ProxyPass, ConfigError> {
    let a = one(d)?;
    let url = a.value.as_str();
    let (tls, rest) = if let Some(r) = url.strip_prefix("http://") {
        (false, r)
    } else if let Some(r) = url.strip_prefix("https://") {
        (true, r)
    } else {
        return Err(bad(a, d, "http://UPSTREAM[/uri] or https://UPSTREAM[/uri]"));
    };
    // A variable right after the host starts the URI part (`http://u$request_uri`).
    let (host, uri) = match rest.find(['/', '$']) {
        Some(i) => (&rest[..i], Some(rest[i..].to_string())),
        None => (rest, None),
    };
    if host.is_empty() && uri.as_deref().is_some_and(|u| u.starts_with('$')) {
        return Err(ConfigError::invalid(
            &a.span,
            "proxy_pass with variables in the host is not supported by vigil (variables may follow the host)",
        ));
    }
    if host.is_empty() {
        return Err(bad(a, d, "a host or upstream name"));
    }
    if cx.refused_upstreams.iter().any(|u| u == host) {
        // Lenient: an upstream block that was refused, not a host.
        return Ok(ProxyPass {
            tls,
            upstream: host.to_string(),
            uri,
        });
    }
    let name = if cx.config.upstreams.iter().any(|u| u.name == host) {
        host.to_string()
    } else {
        let default_port = if tls { 443 } else { 80 };
        // nginx quotes what follows the scheme: `invalid port in upstream "h:0/x"`.
        let quoted = super::syntax::Arg {
            value: rest.to_string(),
            quoted: a.quoted,
            span: a.span.clone(),
        };
        // nginx makes the implicit upstream one peer per address of the name.
        let addrs = super::upstream::resolve_all(cx, &quoted, host, default_port)?;
        let mut up = UpstreamConfig::new(host);
        up.origin = origin(&d.span);
        let mut s = ServerConfig::new(host, addrs[0]);
        s.origin = origin(&d.span);
        up.servers.extend(s.per_address(&addrs));
        if !cx.config.upstreams.iter().any(|u| u.name == host) {
            cx.config.upstreams.push(up);
        }
        host.to_string()
    };
    Ok(ProxyPass {
        tls,
        upstream: name,
        uri,
    })
}

/// One `listen`, and whether it sets socket options (nginx allows those
/// on one server of an address only).
fn listen_directive(cx: &mut Context<'_>, d: &Directive) -> Result<(Listen, bool), ConfigError> {
    let a = args(d, 1, 16)?;
    if a[0].value.starts_with("unix:") {
        return Err(ConfigError::invalid(
            &a[0].span,
            "unix-socket listeners are not supported",
        ));
    }
    // A bare number is a port, `*` any address, no port 80.
    let addr = super::upstream::resolve_as(cx, &a[0], &a[0].value, 80, Use::Listen)?;
    let mut l = Listen {
        addr,
        default_server: false,
        reuseport: false,
        backlog: None,
        ssl: false,
        http2: false,
    };
    let mut options = false;
    for p in &a[1..] {
        match p.value.as_str() {
            "default_server" | "default" => l.default_server = true,
            "reuseport" => {
                l.reuseport = true;
                options = true;
            }
            "ssl" => l.ssl = true,
            "http2" => l.http2 = true,
            "deferred" | "bind" | "fastopen" => options = true,
            v if v.starts_with("backlog=") => {
                let r = v[8..].parse().map_err(|_| bad(p, d, "backlog=N"));
                if let Some(n) = cx.keep(r)? {
                    l.backlog = Some(n);
                    options = true;
                }
            }
            v if v.starts_with("rcvbuf=")
                || v.starts_with("sndbuf=")
                || v.starts_with("so_keepalive=")
                || v.starts_with("fastopen=") =>
            {
                options = true
            }
            // Lenient: the listen is kept without the parameter.
            "quic" | "proxy_protocol" => cx.refuse(ConfigError::invalid(
                &p.span,
                format!(
                    "listen parameter \"{}\" is not supported by vigil yet",
                    p.value
                ),
            ))?,
            _ => cx.refuse(bad(p, d, "default_server, reuseport, backlog=N"))?,
        }
    }
    Ok((l, options))
}

fn seen_listen(
    cx: &mut Context<'_>,
    d: &Directive,
    own: &[Listen],
    l: &Listen,
    options: bool,
) -> Result<(), ConfigError> {
    cx.listens
        .add(own, l, options)
        .map_err(|m| ConfigError::invalid(&d.span, m))
}

/// Directives with no meaning for vigil: accepted, reported once.
fn ignorable(cx: &mut Context<'_>, d: &Directive) -> bool {
    const IGNORED: &[&str] = &[
        "client_body_temp_path",
        "proxy_temp_path",
        "fastcgi_temp_path",
        "uwsgi_temp_path",
        "scgi_temp_path",
        "tcp_nodelay",
        "server_tokens",
        // vigil writes its errors to its own log (stderr or the journal).
        "error_log",
        "charset",
        "keepalive_requests",
        "reset_timedout_connection",
        "types_hash_max_size",
        "server_names_hash_bucket_size",
        "server_names_hash_max_size",
        "client_body_buffer_size",
        "client_header_buffer_size",
        "proxy_buffer_size",
        "proxy_buffers",
        "proxy_busy_buffers_size",
        "proxy_max_temp_file_size",
        "proxy_temp_file_write_size",
        "include_types",
    ];
    let name = d.name.as_str();
    if IGNORED.contains(&name) || super::files::ACCEPTED.contains(&name) {
        cx.ignore(d);
        return true;
    }
    false
}

// === impl Level ===

impl Level {
    fn new(proxy: ProxySettings, client: ClientSettings) -> Self {
        Self {
            proxy,
            client,
            own_set_headers: false,
            own_add_headers: false,
            own_error_pages: false,
            default_type: "text/plain".to_string(),
            placed: Placements::default(),
            tls: Default::default(),
            formats: Vec::new(),
            own_access_log: None,
            own_gzip_types: false,
            own_access: Default::default(),
            own_headers: Default::default(),
            resolver: None,
            resolver_timeout: None,
            own_limits: Default::default(),
            own_files: Default::default(),
            location: None,
        }
    }

    fn child(&self) -> Self {
        let mut c = Self::new(self.proxy.clone(), self.client.clone());
        c.placed = self.placed.clone();
        c.default_type = self.default_type.clone();
        c.tls = self.tls.child();
        c.formats = self.formats.clone();
        c
    }

    /// The http/server-level directives of the header phase.
    fn is_client_directive(name: &str) -> bool {
        matches!(
            name,
            "client_header_timeout"
                | "large_client_header_buffers"
                | "underscores_in_headers"
                | "ignore_invalid_headers"
                | "merge_slashes"
        )
    }

    /// Apply one http/server-level header-phase directive; false if it is not one.
    fn client_directive(&mut self, d: &Directive) -> Result<bool, ConfigError> {
        let c = &mut self.client;
        match d.name.as_str() {
            "client_header_timeout" => c.header_timeout = time(d, one(d)?)?,
            "large_client_header_buffers" => {
                let a = args(d, 2, 2)?;
                // nginx says only "invalid value", for either word.
                let n = Some(&a[0].value)
                    .filter(|v| v.bytes().all(|b| b.is_ascii_digit()))
                    .and_then(|v| v.parse::<u32>().ok())
                    .unwrap_or(0);
                let size = parse_size(&a[1].value).unwrap_or(0);
                validate::header_buffers(n, size).map_err(|m| ConfigError::invalid(&d.span, m))?;
                c.header_buffers = n;
                c.header_buffer_size = size;
            }
            "underscores_in_headers" => c.underscores_in_headers = on_off(d)?,
            "ignore_invalid_headers" => c.ignore_invalid_headers = on_off(d)?,
            "merge_slashes" => c.merge_slashes = on_off(d)?,
            _ => return Ok(false),
        }
        self.placed.set(d);
        Ok(true)
    }

    /// Apply one inheritable directive; false if it is not one.
    fn directive(&mut self, cx: &mut Context<'_>, d: &Directive) -> Result<bool, ConfigError> {
        let p = &mut self.proxy;
        match d.name.as_str() {
            "proxy_next_upstream" => {
                let words = args(d, 1, 16)?;
                if words.len() > 1 && words.iter().any(|w| w.value == "off") {
                    return Err(ConfigError::invalid(
                        &d.span,
                        "\"off\" cannot be combined with other values in \"proxy_next_upstream\"",
                    ));
                }
                p.next_upstream = NextUpstream::parse_words(words.iter().map(|a| a.value.as_str()))
                    .map_err(|e| ConfigError::invalid(&d.span, e.to_string()))?;
            }
            "proxy_next_upstream_tries" => p.next_upstream_tries = number(d, one(d)?)?,
            "proxy_next_upstream_timeout" => {
                let t = time(d, one(d)?)?;
                p.next_upstream_timeout = (!t.is_zero()).then_some(t);
            }
            "proxy_connect_timeout" => p.connect_timeout = time(d, one(d)?)?,
            "proxy_send_timeout" => p.send_timeout = time(d, one(d)?)?,
            "proxy_read_timeout" => p.read_timeout = time(d, one(d)?)?,
            "proxy_request_buffering" => p.request_buffering = on_off(d)?,
            "proxy_ignore_client_abort" => p.ignore_client_abort = on_off(d)?,
            "absolute_redirect" => p.redirects.absolute = on_off(d)?,
            "server_name_in_redirect" => p.redirects.server_name = on_off(d)?,
            "port_in_redirect" => p.redirects.port = on_off(d)?,
            "proxy_buffering" => {
                // vigil streams responses (as proxy_buffering off); reported once.
                p.buffering = on_off(d)?;
                cx.ignore(d);
            }
            "proxy_http_version" => {
                let a = one(d)?;
                p.http_version = match a.value.as_str() {
                    "1.0" => HttpVersion::Http10,
                    "1.1" => HttpVersion::Http11,
                    _ => return Err(bad(a, d, "1.0 or 1.1")),
                };
            }
            "proxy_set_header" => {
                let a = args(d, 2, 2)?;
                if !self.own_set_headers {
                    p.set_headers.clear();
                    cx.sources.shadow(d, self.placed.all(&d.name));
                    self.placed.clear(&d.name);
                    self.own_set_headers = true;
                }
                p.set_headers.push(SetHeader {
                    name: a[0].value.clone(),
                    value: a[1].value.clone(),
                });
            }
            "add_header" => {
                let a = args(d, 2, 3)?;
                let always = match a.get(2) {
                    None => false,
                    Some(w) if w.value == "always" => true,
                    Some(w) => return Err(bad(w, d, "\"always\"")),
                };
                if !self.own_add_headers {
                    p.add_headers.clear();
                    cx.sources.shadow(d, self.placed.all(&d.name));
                    self.placed.clear(&d.name);
                    self.own_add_headers = true;
                }
                p.add_headers.push(AddHeader {
                    name: a[0].value.clone(),
                    value: a[1].value.clone(),
                    always,
                });
            }
            "error_page" => {
                let e = super::rewrite::error_page(d)?;
                if !self.own_error_pages {
                    p.error_pages.clear();
                    self.placed.clear(&d.name);
                    self.own_error_pages = true;
                }
                p.error_pages.push(e);
            }
            "proxy_intercept_errors" => p.intercept_errors = on_off(d)?,
            "client_max_body_size" => {
                let a = one(d)?;
                p.client_max_body_size = parse_size(&a.value)
                    .map_err(|e| ConfigError::invalid(&a.span, e.to_string()))?;
            }
            "client_body_timeout" => p.client_body_timeout = time(d, one(d)?)?,
            "send_timeout" => p.client_send_timeout = time(d, one(d)?)?,
            "keepalive_timeout" => {
                // The optional second argument (the Keep-Alive: timeout= header) is not sent.
                let a = args(d, 1, 2)?;
                p.client_keepalive_timeout = time(d, &a[0])?;
            }
            "default_type" => self.default_type = one(d)?.value.clone(),
            "proxy_ssl_verify" => p.ssl_verify = on_off(d)?,
            "proxy_ssl_server_name" => p.ssl_server_name = on_off(d)?,
            "proxy_ssl_trusted_certificate" => {
                p.ssl_trusted_certificate = Some(one(d)?.value.clone().into())
            }
            "access_log" => {
                let log = crate::nginx::log::access_log(d, &self.formats)?;
                // nginx: `off` on a level wins over its other access_logs.
                match (self.own_access_log, log) {
                    (None, log) => {
                        self.own_access_log = Some(log.is_some());
                        p.access_log = log;
                    }
                    (Some(_), None) => {
                        self.own_access_log = Some(false);
                        p.access_log = None;
                    }
                    (Some(false), Some(_)) => {}
                    (Some(true), Some(_)) => {
                        return Err(ConfigError::invalid(
                            &d.span,
                            "a second \"access_log\" on one level is not supported by vigil (it writes one access log per location)",
                        ))
                    }
                }
            }
            "proxy_redirect" | "proxy_hide_header" | "proxy_pass_header" => {
                crate::nginx::filters::headers(p, &mut self.own_headers, d)?;
            }
            "allow" | "deny" | "set_real_ip_from" | "real_ip_header" | "real_ip_recursive" => {
                crate::nginx::access::directive(p, &mut self.own_access, d)?;
            }
            n if n.starts_with("gzip") || n == "gunzip" || n == "postpone_gzipping" => {
                use crate::nginx::filters::{gzip, Done};
                match gzip(&mut p.gzip, d, &mut self.own_gzip_types)? {
                    Done::Set => {}
                    Done::Ignored => cx.ignore(d),
                    Done::No => return Ok(false),
                }
            }
            "log_format" => {
                return Err(ConfigError::invalid(
                    &d.span,
                    "\"log_format\" directive is not allowed here",
                ))
            }
            "resolver" => {
                if self.resolver.is_some() {
                    return Err(ConfigError::invalid(
                        &d.span,
                        "\"resolver\" directive is duplicate",
                    ));
                }
                self.resolver = Some(super::upstream::resolver(cx, d)?);
            }
            "resolver_timeout" => self.resolver_timeout = Some(time(d, one(d)?)?),
            n if n.starts_with("limit_") => {
                if !super::limit::directive(cx, p, &mut self.own_limits, d)? {
                    return Ok(false);
                }
            }
            _ => {
                let place = match &self.location {
                    Some((m, path)) => super::files::Place::Location(*m, path),
                    None => super::files::Place::Level,
                };
                if !super::files::directive(&mut p.files, &mut self.own_files, d, place)? {
                    return Ok(false);
                }
            }
        }
        match d.name.as_str() {
            "proxy_set_header" | "add_header" | "error_page" | "limit_req" | "limit_conn" => {
                self.placed.push(d)
            }
            _ => self.placed.set(d),
        }
        Ok(true)
    }
}
