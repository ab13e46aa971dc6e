//! `host[:port]` as nginx reads it (`ngx_parse_url`), for `listen`, an
//! upstream's `server` and `proxy_pass`, in both front ends. Checked
//! against nginx 1.22 (`nginx -t`):
//!
//! | text | `listen` | `server` / `proxy_pass` |
//! | --- | --- | --- |
//! | `8080` | port 8080 on 0.0.0.0 | host `8080`, port 80 |
//! | `99999`, `0` | invalid port | host, port 80 |
//! | `*`, `*:8080` | 0.0.0.0 | host `*` (not found) |
//! | `h:0`, `h:99999`, `h:`, `h:+80`, `h:80x`, `h:80:80`, `::1` | invalid port | invalid port |
//! | `:80` | no host | no host |
//! | `[::1`, `[::1]x` | invalid host | invalid host |
//! | `[zz]:80` | invalid IPv6 address | invalid IPv6 address |
//!
//! A port is 1 to 65535 in decimal digits (leading zeros allowed: `0080`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::Resolver;

/// Which directive the address is for (only `listen` takes a bare port and `*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Use {
    /// `listen`.
    Listen,
    /// An upstream `server`, or `proxy_pass`.
    Upstream,
}

/// Why an address is refused, in nginx's words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum AddrError {
    /// `invalid port`.
    InvalidPort,
    /// `invalid host`.
    InvalidHost,
    /// `invalid IPv6 address`.
    InvalidIpv6,
    /// `no host`.
    NoHost,
    /// `unix:` addresses.
    Unix,
    /// `unix:` with nothing after it.
    NoUnixPath,
    /// A `unix:` path longer than `sun_path` holds (107 bytes).
    UnixPathTooLong,
    /// `host not found`, with what the resolver said.
    NotFound(String),
}

// === impl AddrError ===

impl AddrError {
    /// nginx's words for it (`invalid port`).
    pub(crate) fn words(&self) -> &'static str {
        match self {
            AddrError::InvalidPort => "invalid port",
            AddrError::InvalidHost => "invalid host",
            AddrError::InvalidIpv6 => "invalid IPv6 address",
            AddrError::NoHost => "no host",
            AddrError::Unix => "unix sockets are not supported",
            AddrError::NoUnixPath => "no path in the unix domain socket",
            AddrError::UnixPathTooLong => "too long path in the unix domain socket",
            AddrError::NotFound(_) => "host not found",
        }
    }

    /// `WORDS in CONTEXT "TEXT"[: resolver detail]`, where `context` is
    /// `""` or `"upstream "`; `suffix` follows the quoted text (`of the
    /// "listen" directive`).
    pub(crate) fn message(&self, context: &str, text: &str, suffix: &str) -> String {
        let mut m = match self {
            AddrError::Unix => format!("\"{text}\": unix sockets are not supported"),
            _ => format!("{} in {context}\"{text}\"{suffix}", self.words()),
        };
        if let AddrError::NotFound(detail) = self {
            if !detail.is_empty() {
                m.push_str(": ");
                m.push_str(detail);
            }
        }
        m
    }
}

/// The path of a `unix:/path` address (nginx's `ngx_parse_unix_domain_url`:
/// the prefix in any case, a path of 1 to 107 bytes, as `sun_path` holds it
/// with its NUL); None when `text` is not a `unix:` address.
pub(crate) fn unix_path(text: &str) -> Option<Result<std::path::PathBuf, AddrError>> {
    let prefix = text.get(..5)?;
    if !prefix.eq_ignore_ascii_case("unix:") {
        return None;
    }
    let path = &text[5..];
    Some(match path.len() {
        0 => Err(AddrError::NoUnixPath),
        n if n + 1 > 108 => Err(AddrError::UnixPathTooLong),
        _ => Ok(std::path::PathBuf::from(path)),
    })
}

/// Parse and resolve `text` to one address (`default_port` when it has
/// none): the first the resolver gives, as nginx's `listen` takes.
pub(crate) fn resolve(
    text: &str,
    default_port: u16,
    used: Use,
    resolve: Resolver<'_>,
) -> Result<SocketAddr, AddrError> {
    resolve_all(text, default_port, used, resolve).map(|a| a[0])
}

/// Parse and resolve `text` to every address its name has, in the
/// resolver's order (nginx's `ngx_inet_resolve_host`: getaddrinfo's order,
/// IPv4 and IPv6 alike, nothing removed); never empty.
pub(crate) fn resolve_all(
    text: &str,
    default_port: u16,
    used: Use,
    resolve: Resolver<'_>,
) -> Result<Vec<SocketAddr>, AddrError> {
    if text.starts_with("unix:") {
        return Err(AddrError::Unix);
    }
    let (host, port) = split(text, default_port, used)?;
    let host = match host {
        Host::Ip(ip) => return Ok(vec![SocketAddr::new(ip, port)]),
        Host::Name(h) => h,
    };
    let addrs = resolve(host, port).map_err(|e| AddrError::NotFound(e.to_string()))?;
    if addrs.is_empty() {
        return Err(AddrError::NotFound(String::new()));
    }
    Ok(addrs)
}

enum Host<'a> {
    Ip(IpAddr),
    Name(&'a str),
}

fn split(text: &str, default_port: u16, used: Use) -> Result<(Host<'_>, u16), AddrError> {
    if let Some(rest) = text.strip_prefix('[') {
        let Some((inside, after)) = rest.split_once(']') else {
            return Err(AddrError::InvalidHost);
        };
        let port = match after {
            "" => default_port,
            _ => match after.strip_prefix(':') {
                Some(p) => port(p)?,
                None => return Err(AddrError::InvalidHost),
            },
        };
        let ip: Ipv6Addr = inside.parse().map_err(|_| AddrError::InvalidIpv6)?;
        return Ok((Host::Ip(IpAddr::V6(ip)), port));
    }
    let (host, port) = match text.split_once(':') {
        Some((h, p)) => (h, port(p)?),
        None if used == Use::Listen && is_digits(text) => ("*", port(text)?),
        None => (text, default_port),
    };
    if host.is_empty() {
        return Err(AddrError::NoHost);
    }
    if used == Use::Listen && host == "*" {
        return Ok((Host::Ip(IpAddr::V4(Ipv4Addr::UNSPECIFIED)), port));
    }
    match host.parse::<Ipv4Addr>() {
        Ok(ip) => Ok((Host::Ip(IpAddr::V4(ip)), port)),
        Err(_) => Ok((Host::Name(host), port)),
    }
}

fn is_digits(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

/// 1..=65535 in decimal digits.
fn port(p: &str) -> Result<u16, AddrError> {
    if !is_digits(p) {
        return Err(AddrError::InvalidPort);
    }
    let digits = p.trim_start_matches('0');
    if digits.len() > 5 {
        return Err(AddrError::InvalidPort);
    }
    digits
        .parse::<u16>()
        .ok()
        .filter(|n| *n != 0)
        .ok_or(AddrError::InvalidPort)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::literal_resolver;

    fn listen(t: &str) -> Result<SocketAddr, AddrError> {
        resolve(t, 80, Use::Listen, &literal_resolver)
    }

    fn upstream(t: &str) -> Result<SocketAddr, AddrError> {
        resolve(t, 80, Use::Upstream, &literal_resolver)
    }

    fn sa(s: &str) -> SocketAddr {
        s.parse().expect("socket address")
    }

    #[test]
    fn as_nginx_reads_them() {
        assert_eq!(listen("8080"), Ok(sa("0.0.0.0:8080")));
        assert_eq!(listen("0080"), Ok(sa("0.0.0.0:80")));
        assert_eq!(listen("*"), Ok(sa("0.0.0.0:80")));
        assert_eq!(listen("*:81"), Ok(sa("0.0.0.0:81")));
        assert_eq!(listen("127.0.0.1"), Ok(sa("127.0.0.1:80")));
        assert_eq!(listen("[::1]"), Ok(sa("[::1]:80")));
        assert_eq!(listen("[::1]:81"), Ok(sa("[::1]:81")));
        assert_eq!(listen("localhost:81"), Ok(sa("127.0.0.1:81")));
        assert_eq!(upstream("127.0.0.1"), Ok(sa("127.0.0.1:80")));
        assert_eq!(upstream("127.0.0.1:0080"), Ok(sa("127.0.0.1:80")));
        for bad in [
            "99999",
            "0",
            "65536",
            "127.0.0.1:0",
            "127.0.0.1:",
            "[::1]:0",
            "[::1]:",
        ] {
            assert_eq!(listen(bad), Err(AddrError::InvalidPort), "{bad}");
        }
        for bad in [
            "127.0.0.1:0",
            "127.0.0.1:99999",
            "127.0.0.1:",
            "127.0.0.1:+80",
            "127.0.0.1:80x",
            "127.0.0.1:80:80",
            "::1",
            "[::1]:0",
            "h:000000000000000000080000",
        ] {
            assert_eq!(upstream(bad), Err(AddrError::InvalidPort), "{bad}");
        }
        assert_eq!(listen(":80"), Err(AddrError::NoHost));
        assert_eq!(upstream(":80"), Err(AddrError::NoHost));
        assert_eq!(listen("[::1"), Err(AddrError::InvalidHost));
        assert_eq!(upstream("[::1]x"), Err(AddrError::InvalidHost));
        assert_eq!(listen("[zz]:80"), Err(AddrError::InvalidIpv6));
        assert!(matches!(listen("+80"), Err(AddrError::NotFound(_))));
        assert!(matches!(upstream("*"), Err(AddrError::NotFound(_))));
        // A bare number is a host name to an upstream (nginx resolves it).
        assert!(matches!(upstream("8080"), Err(AddrError::NotFound(_))));
    }

    #[test]
    fn unix_paths_as_nginx_reads_them() {
        assert_eq!(unix_path("127.0.0.1:80"), None);
        assert_eq!(unix_path("unix"), None);
        assert_eq!(
            unix_path("unix:/run/a.sock"),
            Some(Ok("/run/a.sock".into()))
        );
        assert_eq!(unix_path("UNIX:/a"), Some(Ok("/a".into())));
        // nginx takes any text as the path, relative ones too.
        assert_eq!(unix_path("unix:a b"), Some(Ok("a b".into())));
        assert_eq!(unix_path("unix:"), Some(Err(AddrError::NoUnixPath)));
        let longest = format!("unix:/{}", "x".repeat(106));
        assert!(matches!(unix_path(&longest), Some(Ok(_))));
        let too_long = format!("unix:/{}", "x".repeat(107));
        assert_eq!(unix_path(&too_long), Some(Err(AddrError::UnixPathTooLong)));
    }

    #[test]
    fn messages() {
        assert_eq!(
            AddrError::InvalidPort.message("", "99999", " of the \"listen\" directive"),
            "invalid port in \"99999\" of the \"listen\" directive"
        );
        assert_eq!(
            AddrError::InvalidPort.message("upstream ", "127.0.0.1:0", ""),
            "invalid port in upstream \"127.0.0.1:0\""
        );
    }
}
