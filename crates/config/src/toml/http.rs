//! `[[server]]` and `[[server.location]]` → [`ServerBlock`]s, with the
//! nginx front end's rules: a server's proxy keys are its locations'
//! defaults, and a `proxy_pass` to a `host:port` that names no upstream
//! makes an implicit single-server upstream.

use std::net::SocketAddr;

use super::at::At;
use super::forms::{RawAccessLog, RawHeaderBuffers, RawListen};
use super::raw::{RawLocation, RawProxy, RawReturn, RawServer};
use crate::addr::Use;
use crate::validate;
use crate::{ConfigError, Resolver};
use vigil_core::config::{
    AccessLog, AddHeader, ClientSettings, HttpVersion, Listen, Location, LocationMatch, LogEscape,
    LogFormat, LogFormatDef, Origin, ProxyPass, ProxySettings, Return, ServerBlock, ServerConfig,
    SetHeader, UpstreamConfig,
};
use vigil_core::outcome::NextUpstream;

/// What building servers needs: the resolver and the upstreams so far
/// (implicit ones are appended).
pub(super) struct Cx<'a, 'r> {
    pub(super) resolve: Resolver<'r>,
    pub(super) upstreams: &'a mut Vec<UpstreamConfig>,
    /// Every server's listen addresses so far (nginx's cross-server checks).
    pub(super) listens: validate::ListenBook,
}

pub(super) fn server(
    cx: &mut Cx<'_, '_>,
    raw: &RawServer,
    at: &At<'_>,
) -> Result<ServerBlock, ConfigError> {
    let mut listen: Vec<Listen> = Vec::new();
    for (i, l) in raw.listen.iter().enumerate() {
        let at = at.key("listen").index(i);
        let entry = listen_entry(cx, l, &at)?;
        let options =
            matches!(l, RawListen::Table(t) if t.reuseport == Some(true) || t.backlog.is_some());
        cx.listens
            .add(&listen, &entry, options)
            .map_err(|m| at.err(m))?;
        listen.push(entry);
    }
    if listen.is_empty() {
        // nginx's default: *:80.
        listen.push(Listen {
            addr: SocketAddr::from(([0, 0, 0, 0], 80)),
            default_server: false,
            reuseport: false,
            backlog: None,
            ssl: false,
            http2: false,
        });
    }
    let defaults = proxy(&raw.proxy(), ProxySettings::default(), at)?;
    let mut locations = Vec::new();
    for (i, l) in raw.location.iter().enumerate() {
        let at = at.key("location").index(i);
        let loc = location(cx, l, &defaults, &at)?;
        validate::duplicate_location(&locations, &loc).map_err(|m| at.key("path").err(m))?;
        locations.push(loc);
    }
    Ok(ServerBlock {
        listen,
        server_names: raw.server_name.clone(),
        client: client(raw, at)?,
        locations,
        rewrite: script(ret(raw.ret.as_ref(), at)?),
        ret: ret(raw.ret.as_ref(), at)?,
        origin: Default::default(),
        tls: Default::default(),
        error_pages: Vec::new(),
        access_log: defaults.access_log,
        files: Default::default(),
    })
}

/// The server-level header-phase keys (nginx's http/server-level
/// `client_header_timeout`, `large_client_header_buffers`, ...).
fn client(raw: &RawServer, at: &At<'_>) -> Result<ClientSettings, ConfigError> {
    let mut c = ClientSettings::default();
    if let Some(t) = &raw.client_header_timeout {
        c.header_timeout = at.key("client_header_timeout").time(t)?;
    }
    if let Some(b) = &raw.large_client_header_buffers {
        let at = at.key("large_client_header_buffers");
        let (number, size) = match b {
            RawHeaderBuffers::Words(w) => {
                let words: Vec<&str> = w.split_whitespace().collect();
                let [n, size] = words.as_slice() else {
                    return Err(at.err(format!(
                        "invalid value \"{w}\", expected \"NUMBER SIZE\" (e.g. \"4 8k\")"
                    )));
                };
                let n = Some(*n)
                    .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
                    .and_then(|n| n.parse::<u32>().ok())
                    .ok_or_else(|| {
                        at.err(format!(
                            "invalid number \"{n}\" in \"{w}\", expected \"NUMBER SIZE\" (e.g. \"4 8k\")"
                        ))
                    })?;
                (n, at.size(size)?)
            }
            RawHeaderBuffers::Table(t) => (t.number, at.key("size").size(&t.size)?),
        };
        validate::header_buffers(number, size).map_err(|m| at.err(m))?;
        c.header_buffers = number;
        c.header_buffer_size = size;
    }
    for (value, slot) in [
        (raw.underscores_in_headers, &mut c.underscores_in_headers),
        (raw.ignore_invalid_headers, &mut c.ignore_invalid_headers),
        (raw.merge_slashes, &mut c.merge_slashes),
    ] {
        if let Some(v) = value {
            *slot = v;
        }
    }
    Ok(c)
}

fn listen_entry(cx: &Cx<'_, '_>, raw: &RawListen, at: &At<'_>) -> Result<Listen, ConfigError> {
    let (text, at) = match raw {
        RawListen::Addr(a) => (a, at.clone()),
        RawListen::Table(t) => (&t.addr, at.key("addr")),
    };
    // A bare number is a port, `*` any address, no port 80 (as nginx's `listen`).
    let addr = at.resolve(cx.resolve, text, 80, Use::Listen)?;
    let mut l = Listen {
        addr,
        default_server: false,
        reuseport: false,
        backlog: None,
        ssl: false,
        http2: false,
    };
    if let RawListen::Table(t) = raw {
        l.default_server = t.default_server.unwrap_or(false);
        l.reuseport = t.reuseport.unwrap_or(false);
        l.backlog = t.backlog;
    }
    Ok(l)
}

fn location(
    cx: &mut Cx<'_, '_>,
    raw: &RawLocation,
    defaults: &ProxySettings,
    at: &At<'_>,
) -> Result<Location, ConfigError> {
    if raw.path.is_empty() {
        return Err(at.key("path").err("a location needs a path"));
    }
    if raw.path.starts_with('@') {
        return Err(at
            .key("path")
            .err("named locations are not supported by vigil"));
    }
    let matcher = match raw.matcher.as_deref() {
        None | Some("prefix") => LocationMatch::Prefix,
        Some("exact") => LocationMatch::Exact,
        Some("prefix_no_regex") => LocationMatch::PrefixNoRegex,
        Some("regex") | Some("regex_case_insensitive") => {
            return Err(at.key("match").err(
                "regular-expression locations are not supported by vigil; use prefix or exact",
            ))
        }
        Some(other) => {
            return Err(at.key("match").err(format!(
                "invalid match \"{other}\", expected prefix, exact or prefix_no_regex"
            )))
        }
    };
    let mut settings = proxy(&raw.proxy(), defaults.clone(), at)?;
    if let Some(url) = &raw.proxy_pass {
        settings.pass = Some(proxy_pass(cx, url, &at.key("proxy_pass"))?);
    }
    // A return's content_type is nginx's default_type of its location.
    if let Some(r) = ret(raw.ret.as_ref(), at)? {
        settings.files.default_type = r.content_type;
    }
    Ok(Location {
        matcher,
        path: raw.path.clone(),
        proxy: settings,
        ret: ret(raw.ret.as_ref(), at)?,
        routing: vigil_core::config::LocationRouting {
            parent: None,
            script: script(ret(raw.ret.as_ref(), at)?),
        },
        origin: Default::default(),
    })
}

/// A `return` as the block's whole rewrite script (as nginx.conf's front end has it).
fn script(ret: Option<Return>) -> Vec<vigil_core::config::RewriteStep> {
    ret.map(vigil_core::config::RewriteStep::Return)
        .into_iter()
        .collect()
}

/// `return = { code, text }`.
fn ret(raw: Option<&RawReturn>, at: &At<'_>) -> Result<Option<Return>, ConfigError> {
    let Some(r) = raw else {
        return Ok(None);
    };
    if r.code > 999 {
        return Err(at
            .key("return")
            .key("code")
            .err(format!("invalid return code \"{}\"", r.code)));
    }
    Ok(Some(Return {
        code: r.code,
        text: r.text.clone(),
        content_type: r
            .content_type
            .clone()
            .unwrap_or_else(|| "text/plain".to_string()),
    }))
}

/// `http(s)://NAME[/uri]`: an upstream, or an implicit single-server
/// upstream for `host[:port]` (as nginx makes one).
fn proxy_pass(cx: &mut Cx<'_, '_>, url: &str, at: &At<'_>) -> Result<ProxyPass, ConfigError> {
    const EXPECTED: &str = "expected http://UPSTREAM[/uri] or https://UPSTREAM[/uri]";
    if url.contains('$') {
        return Err(at.err("proxy_pass with variables is not supported by vigil"));
    }
    let (tls, rest) = if let Some(r) = url.strip_prefix("http://") {
        (false, r)
    } else if let Some(r) = url.strip_prefix("https://") {
        (true, r)
    } else {
        return Err(at.err(format!("invalid proxy_pass \"{url}\", {EXPECTED}")));
    };
    let (host, uri) = match rest.find('/') {
        Some(i) => (&rest[..i], Some(rest[i..].to_string())),
        None => (rest, None),
    };
    if host.is_empty() {
        return Err(at.err(format!(
            "invalid proxy_pass \"{url}\": no upstream or host, {EXPECTED}"
        )));
    }
    if !cx.upstreams.iter().any(|u| u.name == host) {
        let addrs = at
            .resolve_all(cx.resolve, host, if tls { 443 } else { 80 })
            .map_err(|e| match e {
                ConfigError::Invalid { at, message } => ConfigError::Invalid {
                    at,
                    message: format!("no upstream \"{host}\" is defined, and {message}"),
                },
                other => other,
            })?;
        let mut up = UpstreamConfig::new(host);
        // nginx makes the implicit upstream one peer per address of the name.
        up.servers
            .extend(ServerConfig::new(host, addrs[0]).per_address(&addrs));
        cx.upstreams.push(up);
    }
    Ok(ProxyPass {
        tls,
        upstream: host.to_string(),
        uri,
    })
}

/// Apply the proxy keys present in `raw` over `p` (a present list key
/// replaces the inherited list, as nginx's array directives do).
fn proxy(raw: &RawProxy, mut p: ProxySettings, at: &At<'_>) -> Result<ProxySettings, ConfigError> {
    if let Some(words) = &raw.next_upstream {
        p.next_upstream = next_upstream(words, &at.key("next_upstream"))?;
    }
    if let Some(n) = raw.next_upstream_tries {
        p.next_upstream_tries = n;
    }
    if let Some(t) = &raw.next_upstream_timeout {
        let t = at.key("next_upstream_timeout").time(t)?;
        p.next_upstream_timeout = (!t.is_zero()).then_some(t);
    }
    for (key, value, slot) in [
        (
            "connect_timeout",
            &raw.connect_timeout,
            &mut p.connect_timeout,
        ),
        ("send_timeout", &raw.send_timeout, &mut p.send_timeout),
        ("read_timeout", &raw.read_timeout, &mut p.read_timeout),
        (
            "client_body_timeout",
            &raw.client_body_timeout,
            &mut p.client_body_timeout,
        ),
        (
            "client_send_timeout",
            &raw.client_send_timeout,
            &mut p.client_send_timeout,
        ),
        (
            "client_keepalive_timeout",
            &raw.client_keepalive_timeout,
            &mut p.client_keepalive_timeout,
        ),
    ] {
        if let Some(t) = value {
            *slot = at.key(key).time(t)?;
        }
    }
    for (value, slot) in [
        (raw.request_buffering, &mut p.request_buffering),
        (raw.ignore_client_abort, &mut p.ignore_client_abort),
        (raw.buffering, &mut p.buffering),
        (raw.ssl_verify, &mut p.ssl_verify),
        (raw.ssl_server_name, &mut p.ssl_server_name),
    ] {
        if let Some(v) = value {
            *slot = v;
        }
    }
    if let Some(v) = &raw.http_version {
        p.http_version = match v.as_str() {
            "1.0" => HttpVersion::Http10,
            "1.1" => HttpVersion::Http11,
            _ => {
                return Err(at.key("http_version").err(format!(
                    "invalid http_version \"{v}\", expected \"1.0\" or \"1.1\""
                )))
            }
        };
    }
    if let Some(list) = &raw.set_header {
        p.set_headers = list
            .iter()
            .map(|h| SetHeader {
                name: h.name.clone(),
                value: h.value.clone(),
            })
            .collect();
    }
    if let Some(list) = &raw.add_header {
        p.add_headers = list
            .iter()
            .map(|h| AddHeader {
                name: h.name.clone(),
                value: h.value.clone(),
                always: h.always.unwrap_or(false),
            })
            .collect();
    }
    if let Some(s) = &raw.client_max_body_size {
        p.client_max_body_size = at.key("client_max_body_size").size(s)?;
    }
    if let Some(path) = &raw.ssl_trusted_certificate {
        p.ssl_trusted_certificate = Some(path.into());
    }
    if let Some(log) = &raw.access_log {
        p.access_log = match log {
            RawAccessLog::Off => None,
            RawAccessLog::Log(t) => Some(AccessLog {
                path: t.path.clone().into(),
                format: match t.format.as_deref() {
                    None | Some("combined") => LogFormat::Combined,
                    Some("json") => LogFormat::Json,
                    // A format's text, as `convert` writes a `log_format`.
                    Some(text) if text.contains('$') => LogFormat::Custom(LogFormatDef {
                        name: "custom".to_string(),
                        escape: LogEscape::Default,
                        text: text.to_string(),
                        origin: Origin::default(),
                    }),
                    Some(other) => {
                        return Err(at.key("access_log").key("format").err(format!(
                            "invalid log format \"{other}\", expected combined, json or a format with $variables"
                        )))
                    }
                },
                condition: None,
            }),
        };
    }
    Ok(p)
}

fn next_upstream(words: &[String], at: &At<'_>) -> Result<NextUpstream, ConfigError> {
    if words.is_empty() {
        return Err(at.err("next_upstream lists nothing; write [\"off\"] to disable retries"));
    }
    if words.len() > 1 && words.iter().any(|w| w == "off") {
        return Err(at.err("\"off\" cannot be combined with other values in next_upstream"));
    }
    for (i, w) in words.iter().enumerate() {
        NextUpstream::parse_words([w.as_str()]).map_err(|e| at.index(i).err(e.to_string()))?;
    }
    NextUpstream::parse_words(words.iter().map(String::as_str)).map_err(|e| at.err(e.to_string()))
}
