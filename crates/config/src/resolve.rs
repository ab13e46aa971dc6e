//! Name lookups for the front ends: they take a [`Resolver`] function, so
//! tests and configs that must not depend on DNS pass [`literal_resolver`].

use std::net::{SocketAddr, ToSocketAddrs};

/// Turns a host name and port into addresses. The front ends never look
/// names up themselves; the binary passes [`system_resolver`].
pub type Resolver<'a> = &'a dyn Fn(&str, u16) -> std::io::Result<Vec<SocketAddr>>;

/// Accepts only IP literals and `localhost` (tests, and configs that must not depend on DNS).
pub fn literal_resolver(host: &str, port: u16) -> std::io::Result<Vec<SocketAddr>> {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.eq_ignore_ascii_case("localhost") {
        return Ok(vec![SocketAddr::from(([127, 0, 0, 1], port))]);
    }
    host.parse::<std::net::IpAddr>()
        .map(|ip| vec![SocketAddr::new(ip, port)])
        .map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("\"{host}\" is not an IP address (name lookup is off)"),
            )
        })
}

/// Looks names up with the system resolver.
pub fn system_resolver(host: &str, port: u16) -> std::io::Result<Vec<SocketAddr>> {
    if let Ok(v) = literal_resolver(host, port) {
        return Ok(v);
    }
    Ok((host, port).to_socket_addrs()?.collect())
}
