//! The addresses and networks of `allow`, `deny` and `set_real_ip_from`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// An address or network of `allow`, `deny` and `set_real_ip_from`, read
/// as `ngx_ptocidr` reads it: `ADDR`, `ADDR/BITS` (low bits beyond the
/// mask dropped, as nginx does after its warning), or every address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cidr {
    /// `all`.
    All,
    /// An IPv4 or IPv6 network.
    Net {
        /// The network address (masked).
        addr: IpAddr,
        /// Prefix length.
        bits: u8,
    },
    /// `unix:` (clients on unix sockets; vigil has none).
    Unix,
}

impl Cidr {
    /// Parse `ADDR[/BITS]`; None where nginx says "invalid parameter".
    pub fn parse(text: &str) -> Option<Self> {
        let (a, bits) = match text.split_once('/') {
            Some((a, b)) => {
                if b.is_empty() || !b.bytes().all(|c| c.is_ascii_digit()) {
                    return None;
                }
                (a, Some(b.parse::<u32>().ok()?))
            }
            None => (text, None),
        };
        let addr: IpAddr = a.parse().ok()?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let bits = bits.unwrap_or(max);
        if bits > max {
            return None;
        }
        let bits = bits as u8;
        Some(Cidr::Net {
            addr: mask(addr, bits),
            bits,
        })
    }

    /// Whether `ip` is in it (an IPv4 network never holds an IPv6
    /// address, as in nginx's per-family rule lists).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match *self {
            Cidr::All => true,
            Cidr::Unix => false,
            Cidr::Net { addr, bits } => addr.is_ipv4() == ip.is_ipv4() && mask(ip, bits) == addr,
        }
    }
}

fn mask(ip: IpAddr, bits: u8) -> IpAddr {
    match ip {
        IpAddr::V4(v) => {
            let m = u32::MAX.checked_shl(32 - u32::from(bits)).unwrap_or(0);
            IpAddr::V4(Ipv4Addr::from(u32::from(v) & m))
        }
        IpAddr::V6(v) => {
            let m = u128::MAX.checked_shl(128 - u32::from(bits)).unwrap_or(0);
            IpAddr::V6(Ipv6Addr::from(u128::from(v) & m))
        }
    }
}
