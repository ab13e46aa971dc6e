//! The realip module (`ngx_http_realip_handler`, 1.22): when the peer is
//! one of `set_real_ip_from`, the client address is taken from
//! `real_ip_header` (`X-Real-IP`, every `X-Forwarded-For` line from the
//! last, or any header), walking back through trusted addresses with
//! `real_ip_recursive on` (`ngx_http_get_forwarded_addr`). The peer's own
//! address stays known as `$realip_remote_addr`.

use std::net::{IpAddr, SocketAddr};

use http::HeaderMap;
use vigil_core::config::{Cidr, RealIp, RealIpHeader};

/// The address the connection came from, when realip replaced it (the
/// request's extensions hold it for `$realip_remote_addr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Original(pub(crate) SocketAddr);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Found {
    Ok,
    Done,
    Declined,
}

/// The client as nginx sees it after the realip module: the server's
/// settings first (the post-read phase), else the location's (the
/// preaccess phase); `peer` when neither applies.
pub(crate) fn client(
    server: &RealIp,
    location: &RealIp,
    peer: SocketAddr,
    headers: &HeaderMap,
) -> SocketAddr {
    replaced(server, peer, headers)
        .or_else(|| replaced(location, peer, headers))
        .unwrap_or(peer)
}

/// The address `ri` takes from the headers, if it applies (None is
/// nginx's NGX_DECLINED).
fn replaced(ri: &RealIp, peer: SocketAddr, headers: &HeaderMap) -> Option<SocketAddr> {
    if ri.from.is_empty() {
        return None;
    }
    let mut addr = peer;
    let found = match &ri.header {
        RealIpHeader::XForwardedFor => {
            let lines: Vec<&[u8]> = headers
                .get_all("x-forwarded-for")
                .iter()
                .map(|v| v.as_bytes())
                .collect();
            if lines.is_empty() {
                return None;
            }
            let mut rc = Found::Declined;
            let mut found = false;
            for line in lines.iter().rev() {
                rc = walk(&mut addr, line, &ri.from, ri.recursive);
                if !ri.recursive {
                    break;
                }
                if rc == Found::Declined && found {
                    rc = Found::Done;
                    break;
                }
                if rc != Found::Ok {
                    break;
                }
                found = true;
            }
            rc
        }
        h => {
            let name = match h {
                RealIpHeader::Other(n) => n.as_str(),
                _ => "x-real-ip",
            };
            let v = headers.get(name)?;
            walk(&mut addr, v.as_bytes(), &ri.from, ri.recursive)
        }
    };
    (found != Found::Declined).then_some(addr)
}

fn trusted(ip: IpAddr, from: &[Cidr]) -> bool {
    from.iter().any(|c| c.contains(ip))
}

/// `ngx_http_get_forwarded_addr_internal`: the last address of `xff`
/// while `addr` is trusted (and, recursively, the ones before it).
fn walk(addr: &mut SocketAddr, xff: &[u8], from: &[Cidr], recursive: bool) -> Found {
    let mut found = false;
    let mut len = xff.len();
    loop {
        if !trusted(addr.ip(), from) {
            return if found { Found::Done } else { Found::Declined };
        }
        if len == 0 {
            return if found { Found::Done } else { Found::Declined };
        }
        let mut p = len - 1;
        while p > 0 && (xff[p] == b' ' || xff[p] == b',') {
            p -= 1;
            len -= 1;
        }
        while p > 0 {
            if xff[p] == b' ' || xff[p] == b',' {
                p += 1;
                break;
            }
            p -= 1;
        }
        match addr_port(&xff[p..len]) {
            Some(a) => *addr = a,
            None => return if found { Found::Done } else { Found::Declined },
        }
        found = true;
        if !(recursive && p > 0) {
            return Found::Ok;
        }
        len = p - 1;
    }
}

/// `ngx_parse_addr_port`: `ADDR`, `ADDR:PORT` or `[ADDR6]:PORT` (port 0
/// when none is given).
fn addr_port(s: &[u8]) -> Option<SocketAddr> {
    let s = std::str::from_utf8(s).ok()?;
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(SocketAddr::new(ip, 0));
    }
    let (host, port) = match s.strip_prefix('[') {
        Some(rest) => {
            let (h, p) = rest.split_once(']')?;
            (h, p.strip_prefix(':')?)
        }
        None => s.split_once(':')?,
    };
    if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let port: u16 = port.parse().ok().filter(|p| *p >= 1)?;
    Some(SocketAddr::new(host.parse().ok()?, port))
}

#[cfg(test)]
mod tests;
