//! nginx variables in `proxy_set_header`, `add_header` and `hash` values,
//! parsed once when the configuration loads and expanded per request
//! without re-parsing. Besides the built-ins: regex captures (`$1`..`$9`,
//! named groups), `set` variables and `map`s ([`Scope`], rewrite.rs).
//!
//! A value is bytes, as nginx's are: what came from the request (a
//! header's obs-text, a decoded `%FF` of `$uri`, a capture of it) goes on
//! as it came, never replaced by U+FFFD nor dropped for not being UTF-8.
//! Where an expansion becomes a header field, [`field_value`] says which
//! bytes a field can carry.

pub(crate) mod fields;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::request::Parts;
use http::HeaderValue;
use vigil_core::config::vars::{scan, Piece, ScanError, Syntax};

use crate::conn::wallclock::{self, Wall};

/// A value with `$variables`, split into literal and variable parts.
#[derive(Clone, Debug)]
pub struct Template {
    parts: Vec<Part>,
}

#[derive(Clone, Debug)]
enum Part {
    Lit(Box<[u8]>),
    Var(Var),
}

/// The variables vigil knows.
#[derive(Clone, Debug)]
pub(crate) enum Var {
    /// `$1`..`$9`: the last matching regex's groups.
    Capture(usize),
    /// A `set` variable or a named capture.
    Named(Arc<str>),
    /// A `map`'s variable.
    Map(Arc<dyn MapVar>),
    IsArgs,
    ServerAddr,
    Hostname,
    Msec,
    TimeIso8601,
    TimeLocal,
    BodyBytesSent,
    UpstreamHeaderTime,
    Host,
    RemoteAddr,
    /// `$binary_remote_addr`: the client's address as 4 or 16 bytes.
    BinaryRemoteAddr,
    /// `$limit_req_status`, `$limit_conn_status`.
    LimitReqStatus,
    LimitConnStatus,
    RemotePort,
    ProxyAddXForwardedFor,
    Scheme,
    Https,
    RequestUri,
    Uri,
    Args,
    RequestMethod,
    ServerPort,
    /// `$realip_remote_addr`: the connection's address before realip.
    RealIpRemoteAddr,
    /// `$realip_remote_port`: the connection's port before realip.
    RealIpRemotePort,
    ServerName,
    ProxyHost,
    Http(String),
    Arg(String),
    Cookie(String),
    RequestId,
    Request,
    UpstreamAddr,
    UpstreamStatus,
    UpstreamResponseTime,
    UpstreamConnectTime,
    RequestTime,
    Status,
}

/// An unknown variable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown variable \"${0}\"")]
pub struct UnknownVariable(pub String);

/// What a request knows when variables are expanded.
pub(crate) struct VarContext<'a> {
    pub(crate) parts: &'a Parts,
    /// What routing saw of the request (None before it was routed, or
    /// when routing refused it before a host was known).
    pub(crate) target: Option<&'a crate::nginx::router::Target>,
    pub(crate) client: SocketAddr,
    pub(crate) local: SocketAddr,
    pub(crate) proxy_host: &'a str,
    pub(crate) attempts: &'a [crate::handler::record::AttemptRecord],
    pub(crate) status: u16,
    pub(crate) request_time: f64,
}

/// A `map`'s variable: its value for a request (the maps are compiled by
/// the rewrite phase's builder).
pub(crate) trait MapVar: std::fmt::Debug + Send + Sync {
    /// Append the value for the request of `cx` to `out`.
    fn write(&self, cx: &VarContext<'_>, out: &mut Vec<u8>);
}

/// The variables a configuration defines beyond the built-ins: `set`
/// names and named captures (per request, in [`RequestVars`]) and maps.
#[derive(Clone, Debug, Default)]
pub struct Scope {
    pub(crate) named: HashMap<String, Arc<str>>,
    pub(crate) maps: HashMap<String, Arc<dyn MapVar>>,
}

/// What the rewrite phase left for a request's variables: the captures of
/// the last regex that matched and the `set` / named-capture values (bytes).
#[derive(Clone, Debug, Default)]
pub(crate) struct RequestVars {
    /// Group 0 (the whole match) first; None for a group that took no part.
    pub(crate) captures: Captures,
    pub(crate) named: HashMap<Arc<str>, Vec<u8>>,
}

/// A regex's groups (vigil_config's, bytes).
pub(crate) type Captures = vigil_config::pattern::Groups;

/// `fmt::Write` into bytes, for the variables written as numbers, addresses and times.
pub(crate) struct Text<'a>(pub(crate) &'a mut Vec<u8>);

/// Bytes of the response body sent so far (for `$body_bytes_sent` in a
/// log line written at the end), when the writer knows them.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct BodyBytes(pub(crate) u64);

// === impl Scope ===

impl Scope {
    /// Declare a `set` variable or a named capture.
    pub fn declare(&mut self, name: &str) {
        self.named
            .entry(name.to_string())
            .or_insert_with(|| Arc::from(name));
    }
}

// === impl Template ===

impl Template {
    /// Parse `value` (`$name`, `${name}`; `$$` is not special in nginx, nor here).
    pub fn parse(value: &str) -> Result<Self, UnknownVariable> {
        Self::parse_with(value, &Scope::default())
    }

    /// A literal value (no variables): a redirect's URL, which may hold
    /// any byte of the request's.
    pub(crate) fn literal(value: &[u8]) -> Self {
        Self {
            parts: vec![Part::Lit(value.into())],
        }
    }

    /// [`Template::parse`] knowing the configuration's own variables.
    pub fn parse_with(value: &str, scope: &Scope) -> Result<Self, UnknownVariable> {
        let mut parts = Vec::new();
        let mut lit = String::new();
        let flush = |lit: &mut String, parts: &mut Vec<Part>| {
            if !lit.is_empty() {
                parts.push(Part::Lit(std::mem::take(lit).into_bytes().into()));
            }
        };
        let pieces = scan(value, Syntax::Template).map_err(|e| match e {
            ScanError::Unclosed { rest, .. } | ScanError::NoName(rest) => UnknownVariable(rest),
        })?;
        for piece in pieces {
            let var = match piece {
                Piece::Text(t) => {
                    lit.push_str(t);
                    continue;
                }
                Piece::Capture(n) => Var::Capture(n),
                Piece::Name(name) => match (scope.named.get(name), scope.maps.get(name)) {
                    (_, Some(m)) => Var::Map(m.clone()),
                    (Some(n), None) => Var::Named(n.clone()),
                    (None, None) => Var::parse(name)?,
                },
            };
            flush(&mut lit, &mut parts);
            parts.push(Part::Var(var));
        }
        flush(&mut lit, &mut parts);
        Ok(Self { parts })
    }

    /// Whether the value has no variables.
    pub fn is_literal(&self) -> bool {
        self.parts.iter().all(|p| matches!(p, Part::Lit(_)))
    }

    /// The value for the request of `cx`: bytes, as nginx's.
    pub(crate) fn expand(&self, cx: &VarContext<'_>) -> Vec<u8> {
        let mut out = Vec::new();
        self.write(cx, None, &mut out);
        out
    }

    /// Append the value to `out`, with `captures` standing for the
    /// request's (a map's regex).
    pub(crate) fn write(
        &self,
        cx: &VarContext<'_>,
        captures: Option<&Captures>,
        out: &mut Vec<u8>,
    ) {
        for p in &self.parts {
            match p {
                Part::Lit(s) => out.extend_from_slice(s),
                Part::Var(Var::Capture(n)) => {
                    let caps = captures.or_else(|| {
                        cx.parts
                            .extensions
                            .get::<RequestVars>()
                            .map(|v| &v.captures)
                    });
                    if let Some(Some(c)) = caps.and_then(|c| c.get(*n)) {
                        out.extend_from_slice(c);
                    }
                }
                Part::Var(v) => v.write(cx, out),
            }
        }
    }
}

/// A header field of an expanded value, its bytes as they are: obs-text
/// (0x80-0xFF) included, as nginx sends it. None when a byte is one no
/// field can carry: a control byte other than HTAB, which only a decoded
/// `$uri` (`%0D%0A`, `%01`) or a capture of it can hold. nginx writes
/// those too, so `add_header X $uri` with `/%0D%0ASet-Cookie:...` splits
/// its response head; vigil sends no such field.
///
/// A value that ends with line breaks (`add_header X "$v\n"`) is sent
/// without them: nginx writes them out, which ends the field's line, so
/// a client reads the same value either way (nginx's head then has a
/// stray line break, vigil's does not).
///
/// The bytes become the field's without a copy.
pub(crate) fn field_value(mut v: Vec<u8>) -> Option<HeaderValue> {
    let had = v.len();
    while matches!(v.last(), Some(b'\r' | b'\n')) {
        v.pop();
    }
    if v.is_empty() && had > 0 {
        return None;
    }
    match HeaderValue::from_maybe_shared(Bytes::from(v)) {
        Ok(v) => Some(v),
        Err(_) => {
            // At info (nginx's notice): a client's decoded `$uri` can hold
            // such a byte on every request, so not at the default level.
            tracing::info!(
                "a header value with a control byte inside it (CR, LF, NUL, ...) is not sent: \
                 the field is left out, where nginx would split its head"
            );
            None
        }
    }
}

// === impl Text ===

impl std::fmt::Write for Text<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

// === impl Var ===

impl Var {
    fn parse(name: &str) -> Result<Self, UnknownVariable> {
        Ok(match name {
            "host" => Var::Host,
            "remote_addr" => Var::RemoteAddr,
            "binary_remote_addr" => Var::BinaryRemoteAddr,
            "limit_req_status" => Var::LimitReqStatus,
            "limit_conn_status" => Var::LimitConnStatus,
            "remote_port" => Var::RemotePort,
            "proxy_add_x_forwarded_for" => Var::ProxyAddXForwardedFor,
            "scheme" => Var::Scheme,
            "https" => Var::Https,
            "request_uri" => Var::RequestUri,
            "uri" | "document_uri" => Var::Uri,
            "args" | "query_string" => Var::Args,
            "request_method" => Var::RequestMethod,
            "server_port" => Var::ServerPort,
            "realip_remote_addr" => Var::RealIpRemoteAddr,
            "realip_remote_port" => Var::RealIpRemotePort,
            "server_name" => Var::ServerName,
            "proxy_host" => Var::ProxyHost,
            "upstream_addr" => Var::UpstreamAddr,
            "upstream_status" => Var::UpstreamStatus,
            "upstream_response_time" => Var::UpstreamResponseTime,
            "upstream_connect_time" => Var::UpstreamConnectTime,
            "request_time" => Var::RequestTime,
            "status" => Var::Status,
            n if n.starts_with("http_") => Var::Http(n[5..].replace('_', "-")),
            n if n.starts_with("arg_") => Var::Arg(n[4..].to_string()),
            n if n.starts_with("cookie_") => Var::Cookie(n[7..].to_string()),
            "request_id" => {
                RequestId::wanted();
                Var::RequestId
            }
            "request" => Var::Request,
            "is_args" => Var::IsArgs,
            "server_addr" => Var::ServerAddr,
            "hostname" => Var::Hostname,
            "msec" => Var::Msec,
            "time_iso8601" => Var::TimeIso8601,
            "time_local" => Var::TimeLocal,
            "body_bytes_sent" => Var::BodyBytesSent,
            "upstream_header_time" => Var::UpstreamHeaderTime,
            n => return Err(UnknownVariable(n.to_string())),
        })
    }

    /// Write the variable's value. (Long: one arm per variable nginx
    /// names, a table read as one.)
    fn write(&self, cx: &VarContext<'_>, out: &mut Vec<u8>) {
        let p = cx.parts;
        match self {
            Var::Capture(_) => {}
            Var::Named(name) => {
                if let Some(v) = p
                    .extensions
                    .get::<RequestVars>()
                    .and_then(|v| v.named.get(name))
                {
                    out.extend_from_slice(v);
                }
            }
            Var::Map(m) => m.write(cx, out),
            Var::IsArgs => {
                if !args_of(cx).is_empty() {
                    out.push(b'?');
                }
            }
            Var::ServerAddr => {
                let _ = write!(Text(out), "{}", cx.local.ip());
            }
            Var::Hostname => out.extend_from_slice(hostname().as_bytes()),
            Var::Msec => {
                let _ = wallclock::write(&mut Text(out), Wall::Msec, std::time::SystemTime::now());
            }
            Var::TimeIso8601 => {
                let _ =
                    wallclock::write(&mut Text(out), Wall::Iso8601, std::time::SystemTime::now());
            }
            Var::TimeLocal => {
                let _ = wallclock::write(&mut Text(out), Wall::Local, std::time::SystemTime::now());
            }
            Var::BodyBytesSent => {
                let n = p.extensions.get::<BodyBytes>().map_or(0, |b| b.0);
                let _ = write!(Text(out), "{n}");
            }
            Var::UpstreamHeaderTime => join(out, cx.attempts, |a, o| match a.status {
                Some(_) => {
                    let _ = write!(Text(o), "{:.3}", a.response_time);
                }
                None => o.push(b'-'),
            }),
            // nginx: the validated host, else the block's server_name.
            Var::Host => match cx.target {
                Some(t) if !t.host.is_empty() => fields::host(p, &t.host, out),
                Some(t) => out.extend_from_slice(t.server_name.as_bytes()),
                None => out.extend_from_slice(crate::nginx::router::host_of(p).as_bytes()),
            },
            Var::ServerName => {
                if let Some(t) = cx.target {
                    out.extend_from_slice(t.server_name.as_bytes());
                }
            }
            Var::RemoteAddr => {
                let _ = write!(Text(out), "{}", cx.client.ip());
            }
            Var::BinaryRemoteAddr => match cx.client.ip() {
                std::net::IpAddr::V4(a) => out.extend_from_slice(&a.octets()),
                std::net::IpAddr::V6(a) => out.extend_from_slice(&a.octets()),
            },
            Var::LimitReqStatus | Var::LimitConnStatus => {
                let status = p.extensions.get::<crate::nginx::limit::LimitStatus>();
                let word = status.and_then(|s| match self {
                    Var::LimitReqStatus => s.req,
                    _ => s.conn,
                });
                out.extend_from_slice(word.unwrap_or("").as_bytes());
            }
            Var::RemotePort => {
                let _ = write!(Text(out), "{}", cx.client.port());
            }
            Var::ProxyAddXForwardedFor => {
                // nginx 1.22: every X-Forwarded-For line, each followed by
                // ", " (an empty one too), then the client's address.
                for v in p.headers.get_all("x-forwarded-for") {
                    out.extend_from_slice(v.as_bytes());
                    out.extend_from_slice(b", ");
                }
                let _ = write!(Text(out), "{}", cx.client.ip());
            }
            Var::Scheme => out.extend_from_slice(if secure(p) { b"https" } else { b"http" }),
            Var::Https => out.extend_from_slice(if secure(p) { b"on" } else { b"" }),
            Var::RequestUri => out.extend_from_slice(
                p.uri
                    .path_and_query()
                    .map_or("/", |pq| pq.as_str())
                    .as_bytes(),
            ),
            // The normalised URI: decoded bytes, UTF-8 or not (`%FF` is 0xFF).
            Var::Uri => match cx.target {
                Some(t) => out.extend_from_slice(t.uri.path()),
                None => out.extend_from_slice(p.uri.path().as_bytes()),
            },
            Var::Args => out.extend_from_slice(args_of(cx).as_bytes()),
            Var::RequestMethod => out.extend_from_slice(p.method.as_str().as_bytes()),
            Var::ServerPort => {
                let _ = write!(Text(out), "{}", cx.local.port());
            }
            Var::RealIpRemoteAddr => {
                let peer = p
                    .extensions
                    .get::<crate::nginx::realip::Original>()
                    .map_or(cx.client, |o| o.0);
                let _ = write!(Text(out), "{}", peer.ip());
            }
            Var::RealIpRemotePort => {
                let peer = p
                    .extensions
                    .get::<crate::nginx::realip::Original>()
                    .map_or(cx.client, |o| o.0);
                let _ = write!(Text(out), "{}", peer.port());
            }
            Var::ProxyHost => out.extend_from_slice(cx.proxy_host.as_bytes()),
            Var::Http(name) => {
                fields::header(p, name, out);
            }
            Var::Arg(name) => {
                if let Some(v) = p.uri.query().and_then(|q| fields::arg(q, name)) {
                    out.extend_from_slice(v.as_bytes());
                }
            }
            Var::Cookie(name) => {
                let lines = p
                    .headers
                    .get_all(http::header::COOKIE)
                    .iter()
                    .map(|v| v.as_bytes());
                if let Some(v) = fields::cookie(lines, name.as_bytes()) {
                    out.extend_from_slice(v);
                }
            }
            Var::RequestId => {
                let id = p.extensions.get::<RequestId>().copied();
                let _ = write!(Text(out), "{}", id.unwrap_or_else(RequestId::new));
            }
            Var::Request => {
                // nginx's request line; hyper keeps its parts, not its bytes.
                let version = match p.version {
                    http::Version::HTTP_09 => "HTTP/0.9",
                    http::Version::HTTP_10 => "HTTP/1.0",
                    http::Version::HTTP_2 => "HTTP/2.0",
                    _ => "HTTP/1.1",
                };
                // An error_page's redirect made it a GET; the line is the client's.
                let method = p
                    .extensions
                    .get::<crate::nginx::marks::Paged>()
                    .map_or(&p.method, |paged| &paged.method);
                let mut line = Text(out);
                let _ = if p.uri.scheme().is_some() {
                    write!(line, "{method} {} {version}", p.uri)
                } else {
                    let target = p.uri.path_and_query().map_or("/", |pq| pq.as_str());
                    write!(line, "{method} {target} {version}")
                };
            }
            Var::UpstreamAddr => join(out, cx.attempts, |a, o| {
                o.extend_from_slice(a.addr.as_bytes())
            }),
            Var::UpstreamStatus => join(out, cx.attempts, |a, o| match a.status {
                Some(s) => {
                    let _ = write!(Text(o), "{s}");
                }
                None => o.push(b'-'),
            }),
            Var::UpstreamResponseTime => join(out, cx.attempts, |a, o| {
                let _ = write!(Text(o), "{:.3}", a.response_time);
            }),
            Var::UpstreamConnectTime => join(out, cx.attempts, |a, o| match a.connect_time {
                Some(t) => {
                    let _ = write!(Text(o), "{t:.3}");
                }
                None => o.push(b'-'),
            }),
            Var::RequestTime => {
                let _ = write!(Text(out), "{:.3}", cx.request_time);
            }
            Var::Status => {
                let _ = write!(Text(out), "{}", cx.status);
            }
        }
    }
}

/// `$request_id`: 16 random bytes, drawn once per request (the handler
/// puts them in the request's extensions) as nginx draws them, and written
/// in hex only where a variable or a log line asks for them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RequestId(u128);

/// Whether any template or log format of this process reads
/// `$request_id` (set when one compiles, never cleared): until then the
/// handler draws no id and leaves the request's extensions empty (an
/// insert there costs a map and a box per request).
static REQUEST_ID_WANTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

impl RequestId {
    pub(crate) fn new() -> Self {
        Self(rand::random::<u128>())
    }

    /// A template or log format reads the id: from now on every request
    /// draws one.
    pub(crate) fn wanted() {
        REQUEST_ID_WANTED.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// The id a request draws, when anything may read it.
    pub(crate) fn draw() -> Option<Self> {
        REQUEST_ID_WANTED
            .load(std::sync::atomic::Ordering::Relaxed)
            .then(Self::new)
    }
}

impl std::fmt::Display for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// Whether the request came over TLS (`$scheme`, `$https`).
fn secure(p: &Parts) -> bool {
    p.extensions.get::<crate::nginx::marks::Secure>().is_some()
}

/// `$args`: the routed (maybe rewritten) arguments, else the query.
fn args_of<'a>(cx: &VarContext<'a>) -> &'a str {
    match cx.target {
        Some(t) => t.uri.args(),
        None => cx.parts.uri.query().unwrap_or(""),
    }
}

/// `$hostname`: the machine's name as gethostname() gives it, read once.
fn hostname() -> &'static str {
    static NAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    NAME.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|s| s.trim().to_string())
            .ok()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "localhost".to_string())
    })
}

fn join(
    out: &mut Vec<u8>,
    attempts: &[crate::handler::record::AttemptRecord],
    f: impl Fn(&crate::handler::record::AttemptRecord, &mut Vec<u8>),
) {
    for (i, a) in attempts.iter().enumerate() {
        if i > 0 {
            // nginx: ` : ` between the groups of an internal redirect.
            out.extend_from_slice(if a.redirected { b" : " } else { b", " });
        }
        f(a, out);
    }
}

#[cfg(test)]
mod tests;
