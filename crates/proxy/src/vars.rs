//! nginx variables in `proxy_set_header`, `add_header` and `hash` values,
//! parsed once when the configuration loads and expanded per request
//! without re-parsing. Besides the built-ins: regex captures (`$1`..`$9`,
//! named groups), `set` variables and `map`s ([`Scope`], rewrite.rs).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;

use http::request::Parts;

use crate::wallclock::{self, Wall};

/// A value with `$variables`, split into literal and variable parts.
#[derive(Clone, Debug)]
pub struct Template {
    parts: Vec<Part>,
}

#[derive(Clone, Debug)]
enum Part {
    Lit(String),
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
    pub(crate) target: Option<&'a crate::router::Target>,
    pub(crate) client: SocketAddr,
    pub(crate) local: SocketAddr,
    pub(crate) proxy_host: &'a str,
    pub(crate) attempts: &'a [crate::record::AttemptRecord],
    pub(crate) status: u16,
    pub(crate) request_time: f64,
}

/// A `map`'s variable: its value for a request (the maps are compiled by
/// the rewrite phase's builder).
pub(crate) trait MapVar: std::fmt::Debug + Send + Sync {
    /// Append the value for the request of `cx` to `out`.
    fn write(&self, cx: &VarContext<'_>, out: &mut String);
}

/// The variables a configuration defines beyond the built-ins: `set`
/// names and named captures (per request, in [`RequestVars`]) and maps.
#[derive(Clone, Debug, Default)]
pub struct Scope {
    pub(crate) named: HashMap<String, Arc<str>>,
    pub(crate) maps: HashMap<String, Arc<dyn MapVar>>,
}

/// What the rewrite phase left for a request's variables: the captures of
/// the last regex that matched and the `set` / named-capture values.
#[derive(Clone, Debug, Default)]
pub(crate) struct RequestVars {
    /// Group 0 (the whole match) first; None for a group that took no part.
    pub(crate) captures: Vec<Option<String>>,
    pub(crate) named: HashMap<Arc<str>, String>,
}

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

    /// A literal value (no variables).
    pub(crate) fn literal(value: &str) -> Self {
        Self {
            parts: vec![Part::Lit(value.to_string())],
        }
    }

    /// [`Template::parse`] knowing the configuration's own variables.
    pub fn parse_with(value: &str, scope: &Scope) -> Result<Self, UnknownVariable> {
        let mut parts = Vec::new();
        let mut lit = String::new();
        let b = value.as_bytes();
        let mut i = 0;
        while i < b.len() {
            if b[i] != b'$' {
                let start = i;
                while i < b.len() && b[i] != b'$' {
                    i += 1;
                }
                lit.push_str(&value[start..i]);
                continue;
            }
            i += 1;
            // nginx: `$1`..`$9` is one digit, a capture.
            if let Some(d @ b'1'..=b'9') = b.get(i).copied() {
                if !lit.is_empty() {
                    parts.push(Part::Lit(std::mem::take(&mut lit)));
                }
                parts.push(Part::Var(Var::Capture(usize::from(d - b'0'))));
                i += 1;
                continue;
            }
            let (name, next) = if b.get(i) == Some(&b'{') {
                match value[i + 1..].find('}') {
                    Some(end) => (&value[i + 1..i + 1 + end], i + end + 2),
                    None => return Err(UnknownVariable(value[i..].to_string())),
                }
            } else {
                let start = i;
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                    i += 1;
                }
                (&value[start..i], i)
            };
            if name.is_empty() {
                lit.push('$');
                continue;
            }
            if !lit.is_empty() {
                parts.push(Part::Lit(std::mem::take(&mut lit)));
            }
            let var = match (scope.named.get(name), scope.maps.get(name)) {
                (_, Some(m)) => Var::Map(m.clone()),
                (Some(n), None) => Var::Named(n.clone()),
                (None, None) => Var::parse(name)?,
            };
            parts.push(Part::Var(var));
            i = next;
        }
        if !lit.is_empty() {
            parts.push(Part::Lit(lit));
        }
        Ok(Self { parts })
    }

    /// Whether the value has no variables.
    pub fn is_literal(&self) -> bool {
        self.parts.iter().all(|p| matches!(p, Part::Lit(_)))
    }

    pub(crate) fn expand(&self, cx: &VarContext<'_>) -> String {
        self.expand_with(cx, None)
    }

    /// Expand with `captures` standing for the request's (a map's regex).
    pub(crate) fn expand_with(
        &self,
        cx: &VarContext<'_>,
        captures: Option<&[Option<String>]>,
    ) -> String {
        let mut out = String::new();
        self.write(cx, captures, &mut out);
        out
    }

    pub(crate) fn write(
        &self,
        cx: &VarContext<'_>,
        captures: Option<&[Option<String>]>,
        out: &mut String,
    ) {
        for p in &self.parts {
            match p {
                Part::Lit(s) => out.push_str(s),
                Part::Var(Var::Capture(n)) => {
                    let caps = captures.or_else(|| {
                        cx.parts
                            .extensions
                            .get::<RequestVars>()
                            .map(|v| v.captures.as_slice())
                    });
                    if let Some(Some(c)) = caps.and_then(|c| c.get(*n)) {
                        out.push_str(c);
                    }
                }
                Part::Var(v) => v.write(cx, out),
            }
        }
    }
}

// === impl Var ===

impl Var {
    fn parse(name: &str) -> Result<Self, UnknownVariable> {
        Ok(match name {
            "host" => Var::Host,
            "remote_addr" => Var::RemoteAddr,
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

    fn write(&self, cx: &VarContext<'_>, out: &mut String) {
        let p = cx.parts;
        match self {
            Var::Capture(_) => {}
            Var::Named(name) => {
                if let Some(v) = p
                    .extensions
                    .get::<RequestVars>()
                    .and_then(|v| v.named.get(name))
                {
                    out.push_str(v);
                }
            }
            Var::Map(m) => m.write(cx, out),
            Var::IsArgs => {
                if !args_of(cx).is_empty() {
                    out.push('?');
                }
            }
            Var::ServerAddr => {
                let _ = write!(out, "{}", cx.local.ip());
            }
            Var::Hostname => out.push_str(hostname()),
            Var::Msec => {
                let _ = wallclock::write(out, Wall::Msec, std::time::SystemTime::now());
            }
            Var::TimeIso8601 => {
                let _ = wallclock::write(out, Wall::Iso8601, std::time::SystemTime::now());
            }
            Var::TimeLocal => {
                let _ = wallclock::write(out, Wall::Local, std::time::SystemTime::now());
            }
            Var::BodyBytesSent => {
                let n = p.extensions.get::<BodyBytes>().map_or(0, |b| b.0);
                let _ = write!(out, "{n}");
            }
            Var::UpstreamHeaderTime => join(out, cx.attempts, |a, o| match a.status {
                Some(_) => {
                    let _ = write!(o, "{:.3}", a.response_time);
                }
                None => o.push('-'),
            }),
            // nginx: the validated host, else the block's server_name.
            Var::Host => match cx.target {
                Some(t) if !t.host.is_empty() => out.push_str(&t.host),
                Some(t) => out.push_str(&t.server_name),
                None => out.push_str(&crate::router::host_of(p)),
            },
            Var::ServerName => {
                if let Some(t) = cx.target {
                    out.push_str(&t.server_name);
                }
            }
            Var::RemoteAddr => {
                let _ = write!(out, "{}", cx.client.ip());
            }
            Var::RemotePort => {
                let _ = write!(out, "{}", cx.client.port());
            }
            Var::ProxyAddXForwardedFor => {
                // nginx 1.22: every X-Forwarded-For line, each followed by
                // ", " (an empty one too), then the client's address.
                for v in p.headers.get_all("x-forwarded-for") {
                    out.push_str(&String::from_utf8_lossy(v.as_bytes()));
                    out.push_str(", ");
                }
                let _ = write!(out, "{}", cx.client.ip());
            }
            Var::Scheme => out.push_str(if secure(p) { "https" } else { "http" }),
            Var::Https => out.push_str(if secure(p) { "on" } else { "" }),
            Var::RequestUri => out.push_str(p.uri.path_and_query().map_or("/", |pq| pq.as_str())),
            // The normalised URI (decoded bytes; shown lossily if not UTF-8).
            Var::Uri => match cx.target {
                Some(t) => out.push_str(&String::from_utf8_lossy(t.uri.path())),
                None => out.push_str(p.uri.path()),
            },
            Var::Args => out.push_str(args_of(cx)),
            Var::RequestMethod => out.push_str(p.method.as_str()),
            Var::ServerPort => {
                let _ = write!(out, "{}", cx.local.port());
            }
            Var::RealIpRemoteAddr => {
                let peer = p
                    .extensions
                    .get::<crate::realip::Original>()
                    .map_or(cx.client, |o| o.0);
                let _ = write!(out, "{}", peer.ip());
            }
            Var::ProxyHost => out.push_str(cx.proxy_host),
            // nginx 1.22 takes HTTP/2's :authority as the Host header.
            Var::Http(name) if name == "host" && p.version == http::Version::HTTP_2 => {
                match p.uri.authority() {
                    Some(a) => out.push_str(a.as_str()),
                    None => {
                        if let Some(v) = p.headers.get(http::header::HOST) {
                            out.push_str(v.to_str().unwrap_or(""));
                        }
                    }
                }
            }
            Var::Http(name) => {
                let v = p
                    .headers
                    .get_all(name.as_str())
                    .iter()
                    .filter_map(|v| v.to_str().ok());
                for (i, v) in v.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    out.push_str(v);
                }
            }
            Var::Arg(name) => {
                if let Some(v) = p.uri.query().and_then(|q| arg(q, name)) {
                    out.push_str(v);
                }
            }
            Var::Cookie(name) => {
                let lines = p
                    .headers
                    .get_all(http::header::COOKIE)
                    .iter()
                    .map(|v| v.as_bytes());
                if let Some(v) = cookie(lines, name.as_bytes()) {
                    out.push_str(&String::from_utf8_lossy(v));
                }
            }
            Var::RequestId => {
                let id = p.extensions.get::<RequestId>().copied();
                let _ = write!(out, "{}", id.unwrap_or_else(RequestId::new));
            }
            Var::Request => {
                // nginx's request line; hyper keeps its parts, not its bytes.
                let target = if p.uri.scheme().is_some() {
                    p.uri.to_string()
                } else {
                    p.uri
                        .path_and_query()
                        .map_or("/", |pq| pq.as_str())
                        .to_string()
                };
                let version = match p.version {
                    http::Version::HTTP_09 => "HTTP/0.9",
                    http::Version::HTTP_10 => "HTTP/1.0",
                    http::Version::HTTP_2 => "HTTP/2.0",
                    _ => "HTTP/1.1",
                };
                // An error_page's redirect made it a GET; the line is the client's.
                let method = p
                    .extensions
                    .get::<crate::marks::Paged>()
                    .map_or(&p.method, |paged| &paged.method);
                let _ = write!(out, "{method} {target} {version}");
            }
            Var::UpstreamAddr => join(out, cx.attempts, |a, o| o.push_str(&a.addr)),
            Var::UpstreamStatus => join(out, cx.attempts, |a, o| match a.status {
                Some(s) => {
                    let _ = write!(o, "{s}");
                }
                None => o.push('-'),
            }),
            Var::UpstreamResponseTime => join(out, cx.attempts, |a, o| {
                let _ = write!(o, "{:.3}", a.response_time);
            }),
            Var::UpstreamConnectTime => join(out, cx.attempts, |a, o| match a.connect_time {
                Some(t) => {
                    let _ = write!(o, "{t:.3}");
                }
                None => o.push('-'),
            }),
            Var::RequestTime => {
                let _ = write!(out, "{:.3}", cx.request_time);
            }
            Var::Status => {
                let _ = write!(out, "{}", cx.status);
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

/// `$arg_NAME` as `ngx_http_arg` finds it: the first `NAME=` (name
/// case-insensitive) at the start of the query or after `&`; a bare `NAME`
/// without `=` does not count.
fn arg<'q>(query: &'q str, name: &str) -> Option<&'q str> {
    query.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        k.eq_ignore_ascii_case(name).then_some(v)
    })
}

/// `$cookie_NAME` as nginx 1.22's `ngx_http_parse_multi_header_lines`
/// finds it in the Cookie lines: pairs split at `;` or `,`, the name
/// matched case-insensitively, spaces allowed around `=`, the value up to
/// the next `;`.
fn cookie<'c>(lines: impl Iterator<Item = &'c [u8]>, name: &[u8]) -> Option<&'c [u8]> {
    for line in lines {
        let mut i = 0;
        while i < line.len() {
            let rest = &line[i..];
            if rest.len() >= name.len() && rest[..name.len()].eq_ignore_ascii_case(name) {
                let mut j = i + name.len();
                while line.get(j) == Some(&b' ') {
                    j += 1;
                }
                if line.get(j) == Some(&b'=') {
                    j += 1;
                    while line.get(j) == Some(&b' ') {
                        j += 1;
                    }
                    let end = line[j..]
                        .iter()
                        .position(|&b| b == b';')
                        .map_or(line.len(), |e| j + e);
                    return Some(&line[j..end]);
                }
            }
            // Skip to the next pair.
            while i < line.len() {
                let b = line[i];
                i += 1;
                if b == b';' || b == b',' {
                    break;
                }
            }
            while line.get(i) == Some(&b' ') {
                i += 1;
            }
        }
    }
    None
}

/// Whether the request came over TLS (`$scheme`, `$https`).
fn secure(p: &Parts) -> bool {
    p.extensions.get::<crate::marks::Secure>().is_some()
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
    out: &mut String,
    attempts: &[crate::record::AttemptRecord],
    f: impl Fn(&crate::record::AttemptRecord, &mut String),
) {
    for (i, a) in attempts.iter().enumerate() {
        if i > 0 {
            // nginx: ` : ` between the groups of an internal redirect.
            out.push_str(if a.redirected { " : " } else { ", " });
        }
        f(a, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cx_parts(uri: &str) -> Parts {
        let (p, _) = http::Request::builder()
            .uri(uri)
            .header("host", "Example.com:8080")
            .header("x-forwarded-for", "1.2.3.4")
            .header("x-req-id", "r1")
            .body(())
            .expect("request")
            .into_parts();
        p
    }

    #[test]
    fn expands_the_common_variables() {
        let parts = cx_parts("/a/b?x=1&k=v");
        let cx = VarContext {
            parts: &parts,
            target: None,
            client: "10.0.0.9:5555".parse().expect("addr"),
            local: "127.0.0.1:8080".parse().expect("addr"),
            proxy_host: "api",
            attempts: &[],
            status: 200,
            request_time: 0.0,
        };
        let t = |s: &str| Template::parse(s).expect("parse").expand(&cx);
        assert_eq!(t("$host"), "example.com");
        assert_eq!(t("$remote_addr:$remote_port"), "10.0.0.9:5555");
        assert_eq!(t("$proxy_add_x_forwarded_for"), "1.2.3.4, 10.0.0.9");
        assert_eq!(t("$request_uri|$uri|$args"), "/a/b?x=1&k=v|/a/b|x=1&k=v");
        assert_eq!(t("${arg_k}-$http_x_req_id"), "v-r1");
        assert_eq!(t("$proxy_host"), "api");
        assert_eq!(t("cost: 5$"), "cost: 5$");
        assert!(Template::parse("$nope").is_err());
        assert!(Template::parse("plain").expect("parse").is_literal());
    }

    #[test]
    fn captures_set_variables_and_clock_variables_expand() {
        let mut parts = cx_parts("/a?x=1");
        parts.extensions.insert(RequestVars {
            captures: vec![Some("/a".into()), Some("a".into()), None],
            named: [(Arc::from("v"), "set".to_string())].into_iter().collect(),
        });
        let cx = VarContext {
            parts: &parts,
            target: None,
            client: "10.0.0.9:5555".parse().expect("addr"),
            local: "127.0.0.1:8080".parse().expect("addr"),
            proxy_host: "api",
            attempts: &[],
            status: 200,
            request_time: 0.0,
        };
        let mut scope = Scope::default();
        scope.declare("v");
        let t = |s: &str| Template::parse_with(s, &scope).expect("parse").expand(&cx);
        assert_eq!(t("$1|$2|$3|$12"), "a|||a2");
        assert_eq!(t("[$v]$is_args$args"), "[set]?x=1");
        assert_eq!(t("$server_addr"), "127.0.0.1");
        assert!(Template::parse("$v").is_err(), "unknown without the scope");
    }

    #[test]
    fn args_and_cookies_are_found_as_nginx_finds_them() {
        assert_eq!(arg("a&a=2", "a"), Some("2"));
        assert_eq!(arg("xa=1&A=5", "a"), Some("5"));
        assert_eq!(arg("b=1", "a"), None);
        let c = |lines: &[&str], n: &str| {
            cookie(lines.iter().map(|l| l.as_bytes()), n.as_bytes())
                .map(|v| String::from_utf8_lossy(v).into_owned())
        };
        assert_eq!(c(&["a=1; b=2"], "b").as_deref(), Some("2"));
        assert_eq!(c(&["xb=1; b = 4 ; c=5"], "b").as_deref(), Some("4 "));
        assert_eq!(c(&["a=1, b=7"], "b").as_deref(), Some("7"));
        assert_eq!(c(&["c=1", "B=9;d"], "b").as_deref(), Some("9"));
        assert_eq!(c(&["bb=1;b"], "b"), None);
        let id = RequestId::new().to_string();
        assert_eq!(id.len(), 32);
        assert!(id.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(RequestId(0xab).to_string(), format!("{:0>32}", "ab"));
        assert_ne!(id, RequestId::new().to_string());
    }

    #[test]
    fn a_template_reading_request_id_makes_requests_draw_one() {
        // The flag is the process's (other tests may have set it first);
        // what must hold is that after a template reads the id, every
        // request draws a fresh one.
        Template::parse("id=$request_id").unwrap();
        let (a, b) = (RequestId::draw(), RequestId::draw());
        assert!(a.is_some() && b.is_some());
        assert_ne!(a, b);
    }
}
