//! nginx variables in `proxy_set_header`, `add_header` and `hash` values,
//! parsed once when the configuration loads and expanded per request
//! without re-parsing.

use std::fmt::Write as _;
use std::net::SocketAddr;

use http::request::Parts;

/// A value with `$variables`, split into literal and variable parts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Template {
    parts: Vec<Part>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Part {
    Lit(String),
    Var(Var),
}

/// The variables vigil knows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Var {
    Host,
    RemoteAddr,
    RemotePort,
    ProxyAddXForwardedFor,
    Scheme,
    RequestUri,
    Uri,
    Args,
    RequestMethod,
    ServerPort,
    ServerName,
    ProxyHost,
    Http(String),
    Arg(String),
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
    pub(crate) client: SocketAddr,
    pub(crate) local: SocketAddr,
    pub(crate) proxy_host: &'a str,
    pub(crate) attempts: &'a [crate::handler::AttemptRecord],
    pub(crate) status: u16,
    pub(crate) request_time: f64,
}

// === impl Template ===

impl Template {
    /// Parse `value` (`$name`, `${name}`; `$$` is not special in nginx, nor here).
    pub fn parse(value: &str) -> Result<Self, UnknownVariable> {
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
            parts.push(Part::Var(Var::parse(name)?));
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
        let mut out = String::new();
        for p in &self.parts {
            match p {
                Part::Lit(s) => out.push_str(s),
                Part::Var(v) => v.write(cx, &mut out),
            }
        }
        out
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
            "request_uri" => Var::RequestUri,
            "uri" | "document_uri" => Var::Uri,
            "args" | "query_string" => Var::Args,
            "request_method" => Var::RequestMethod,
            "server_port" => Var::ServerPort,
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
            n => return Err(UnknownVariable(n.to_string())),
        })
    }

    fn write(&self, cx: &VarContext<'_>, out: &mut String) {
        let p = cx.parts;
        match self {
            // nginx: the validated host, else the block's server_name.
            Var::Host => match target(p) {
                Some(t) if !t.host.is_empty() => out.push_str(&t.host),
                Some(t) => out.push_str(&t.server_name),
                None => out.push_str(&crate::router::host_of(p)),
            },
            Var::ServerName => {
                if let Some(t) = target(p) {
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
            Var::Scheme => out.push_str("http"),
            Var::RequestUri => out.push_str(p.uri.path_and_query().map_or("/", |pq| pq.as_str())),
            // The normalised URI (decoded bytes; shown lossily if not UTF-8).
            Var::Uri => match target(p) {
                Some(t) => out.push_str(&String::from_utf8_lossy(t.uri.path())),
                None => out.push_str(p.uri.path()),
            },
            Var::Args => out.push_str(p.uri.query().unwrap_or("")),
            Var::RequestMethod => out.push_str(p.method.as_str()),
            Var::ServerPort => {
                let _ = write!(out, "{}", cx.local.port());
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
                if let Some(q) = p.uri.query() {
                    if let Some(v) = q
                        .split('&')
                        .filter_map(|kv| kv.split_once('=').or(Some((kv, ""))))
                        .find(|(k, _)| k.eq_ignore_ascii_case(name))
                        .map(|(_, v)| v)
                    {
                        out.push_str(v);
                    }
                }
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

/// What routing found, when the handler routed the request.
fn target(p: &Parts) -> Option<&crate::route::Target> {
    p.extensions.get::<crate::route::Target>()
}

fn join(
    out: &mut String,
    attempts: &[crate::handler::AttemptRecord],
    f: impl Fn(&crate::handler::AttemptRecord, &mut String),
) {
    for (i, a) in attempts.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
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
}
