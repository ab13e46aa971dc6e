//! Which `Host` the admin API answers (DNS rebinding). A page on
//! `evil.example` whose name an attacker re-points at 127.0.0.1 is, to the
//! browser, same-origin with the admin listener: it could read `/api/*` and
//! the dashboard. Its requests still say `Host: evil.example`, so the
//! listener answers only requests that name it:
//!
//! - an IP address (`127.0.0.1`, `[::1]`, any other: an address in the URL
//!   is not a name anyone can re-point), with or without a port;
//! - `localhost` and `*.localhost` (RFC 6761: they never leave the host,
//!   browsers resolve them to loopback themselves);
//! - a name the operator listed (`[admin] hosts`, `--admin-host`).
//!
//! Anything else is answered 421 Misdirected Request (RFC 9110 15.5.20:
//! this server does not answer for that authority; a 403 would say the
//! client lacks a right, which a token cannot fix). An HTTP/1.0 request
//! without `Host` is served (it cannot come from a browser); an HTTP/1.1
//! request without one, or with two, is a 400 as in nginx. In an
//! absolute-form target (`GET http://h/ HTTP/1.1`) its authority is judged
//! too. Pure: no I/O.

use bytes::Bytes;
use http::{header, Request, Response, StatusCode, Version};
use http_body_util::Full;

/// The names a request may give besides addresses and `localhost`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllowedHosts {
    /// Lower-case, no trailing dot (`AdminConfig::host_name`).
    names: Vec<String>,
}

// === impl AllowedHosts ===

impl AllowedHosts {
    /// `names` as `vigil_core::config::AdminConfig::host_name` returns them.
    pub fn new(names: impl IntoIterator<Item = String>) -> Self {
        let mut names: Vec<String> = names.into_iter().collect();
        names.sort();
        names.dedup();
        Self { names }
    }

    /// Whether the authority `host` (`name[:port]`, `v4[:port]`,
    /// `[v6][:port]`) names this listener.
    pub fn admits(&self, host: &str) -> bool {
        let Some(name) = without_port(host) else {
            return false;
        };
        if let Some(v6) = name.strip_prefix('[') {
            return v6
                .strip_suffix(']')
                .is_some_and(|a| a.parse::<std::net::Ipv6Addr>().is_ok());
        }
        if name.parse::<std::net::Ipv4Addr>().is_ok() {
            return true;
        }
        let name = name.strip_suffix('.').unwrap_or(name);
        name.eq_ignore_ascii_case("localhost")
            || name
                .len()
                .checked_sub(".localhost".len())
                .filter(|&at| at > 0)
                .and_then(|at| name.get(at..))
                .is_some_and(|tail| tail.eq_ignore_ascii_case(".localhost"))
            || self.names.iter().any(|n| n.eq_ignore_ascii_case(name))
    }

    /// `Ok` when `req` may be answered; else the answer (421 or 400).
    pub fn check<B>(&self, req: &Request<B>) -> Result<(), Box<Response<Full<Bytes>>>> {
        let mut hosts = req.headers().get_all(header::HOST).iter();
        let host = match (hosts.next(), hosts.next()) {
            (Some(_), Some(_)) => {
                return Err(refusal(
                    StatusCode::BAD_REQUEST,
                    "two Host headers in one request",
                ))
            }
            (Some(h), None) => Some(h.as_bytes()),
            (None, _) => None,
        };
        if host.is_none() && req.version() != Version::HTTP_10 && req.version() != Version::HTTP_09
        {
            return Err(refusal(
                StatusCode::BAD_REQUEST,
                "an HTTP/1.1 request needs a Host header",
            ));
        }
        let target = req.uri().authority().map(|a| a.as_str().as_bytes());
        for given in [host, target].into_iter().flatten() {
            let admitted = std::str::from_utf8(given).is_ok_and(|h| self.admits(h));
            if !admitted {
                return Err(refusal(
                    StatusCode::MISDIRECTED_REQUEST,
                    &format!(
                        "Host {} is not a name of this admin listener; an IP address, localhost or a name in [admin] hosts (--admin-host) is",
                        quoted(given)
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// The host of an authority without its port; None when the port is not
/// digits or the authority has userinfo.
fn without_port(authority: &str) -> Option<&str> {
    if authority.contains('@') {
        return None;
    }
    let (name, port) = match authority.rfind(':') {
        // `[v6]` alone: the colon is inside the brackets.
        Some(at) if !authority[at..].contains(']') => (&authority[..at], &authority[at + 1..]),
        _ => (authority, ""),
    };
    (!name.is_empty() && port.len() <= 5 && port.bytes().all(|b| b.is_ascii_digit()))
        .then_some(name)
}

/// At most 100 bytes of `raw`, quoted, with anything but printable ASCII
/// escaped (the answer echoes the request).
fn quoted(raw: &[u8]) -> String {
    let mut out = String::from("\"");
    for &b in raw.iter().take(100) {
        match b {
            b'"' | b'\\' => {
                out.push('\\');
                out.push(char::from(b));
            }
            0x20..=0x7e => out.push(char::from(b)),
            _ => out.push_str(&format!("\\x{b:02x}")),
        }
    }
    if raw.len() > 100 {
        out.push_str("...");
    }
    out.push('"');
    out
}

/// A one-line plain-text answer.
fn refusal(status: StatusCode, line: &str) -> Box<Response<Full<Bytes>>> {
    let mut r = Response::new(Full::new(Bytes::from(format!("{line}\n"))));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    super::no_store(h);
    Box::new(r)
}
