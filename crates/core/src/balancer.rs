//! Precomputed data of the balancing methods, built once per upstream
//! (nginx builds the same at config time): cumulative weights for `hash`,
//! `ip_hash` and `random`, and the ketama ring for `hash ... consistent`.
//!
//! The per-request walk over these lives in `upstream::pick`.

use std::collections::HashMap;

use crate::config::{Balancer, ServerConfig};

/// What a balancing method needs at pick time.
#[derive(Debug)]
pub(crate) enum Method {
    RoundRobin,
    LeastConn,
    Hash(Cumulative),
    Consistent(Ring),
    IpHash(Cumulative),
    Random { ranges: Cumulative, two: bool },
}

/// Cumulative weights over the primary peers (down ones included, as nginx's
/// `total_weight`), searched in O(log n).
#[derive(Debug)]
pub(crate) struct Cumulative {
    ends: Vec<u64>,
}

/// The ketama ring: 160 points per unit of weight per server name, hashed
/// with crc32 exactly as `ngx_http_upstream_init_chash` does, so a key maps
/// to the same server as in nginx.
#[derive(Debug)]
pub(crate) struct Ring {
    /// (point hash, group index), sorted by hash, duplicates removed.
    points: Vec<(u32, u32)>,
    /// Peers (primary indices) sharing each server name, in config order.
    groups: Vec<Vec<u32>>,
}

// === impl Method ===

impl Method {
    pub(crate) fn build(balancer: &Balancer, primaries: &[&ServerConfig]) -> Self {
        match balancer {
            Balancer::RoundRobin => Method::RoundRobin,
            Balancer::LeastConn => Method::LeastConn,
            Balancer::Hash {
                consistent: false, ..
            } => Method::Hash(Cumulative::new(primaries)),
            Balancer::Hash {
                consistent: true, ..
            } => Method::Consistent(Ring::new(primaries)),
            Balancer::IpHash => Method::IpHash(Cumulative::new(primaries)),
            Balancer::Random { two } => Method::Random {
                ranges: Cumulative::new(primaries),
                two: *two,
            },
        }
    }
}

// === impl Cumulative ===

impl Cumulative {
    fn new(peers: &[&ServerConfig]) -> Self {
        let mut total = 0u64;
        let ends = peers
            .iter()
            .map(|s| {
                total += u64::from(s.weight.get());
                total
            })
            .collect();
        Self { ends }
    }

    pub(crate) fn total(&self) -> u64 {
        self.ends.last().copied().unwrap_or(0)
    }

    /// The peer whose range holds `w` (`w < total`): nginx's
    /// `while (w >= peer->weight) { w -= peer->weight; peer++; }`.
    pub(crate) fn find(&self, w: u64) -> usize {
        self.ends.partition_point(|&end| end <= w)
    }
}

// === impl Ring ===

impl Ring {
    fn new(peers: &[&ServerConfig]) -> Self {
        let mut group_of: HashMap<&str, u32> = HashMap::new();
        let mut groups: Vec<Vec<u32>> = Vec::new();
        let mut points = Vec::new();
        for (i, s) in peers.iter().enumerate() {
            let g = *group_of.entry(s.address.as_str()).or_insert_with(|| {
                groups.push(Vec::new());
                (groups.len() - 1) as u32
            });
            groups[g as usize].push(i as u32);
            let (host, port) = split_host_port(&s.address);
            let mut base = crc32fast::Hasher::new();
            base.update(host.as_bytes());
            base.update(b"\0");
            base.update(port.as_bytes());
            let mut prev = 0u32;
            for _ in 0..160 * s.weight.get() {
                let mut h = base.clone();
                h.update(&prev.to_le_bytes());
                prev = h.finalize();
                points.push((prev, g));
            }
        }
        // nginx sorts by hash with qsort and keeps the first of equal hashes;
        // a stable sort keeps config order among equal hashes.
        points.sort_by_key(|p| p.0);
        points.dedup_by_key(|p| p.0);
        Self { points, groups }
    }

    /// The first point at or after `hash` (may equal `len`, which wraps):
    /// `ngx_http_upstream_find_chash_point`.
    pub(crate) fn find(&self, hash: u32) -> usize {
        self.points.partition_point(|p| p.0 < hash)
    }

    pub(crate) fn len(&self) -> usize {
        self.points.len()
    }

    /// The group (peers of one server name) at point `i % len`.
    pub(crate) fn group_at(&self, i: u64) -> &[u32] {
        if self.points.is_empty() {
            return &[];
        }
        let p = self.points[(i % self.points.len() as u64) as usize];
        &self.groups[p.1 as usize]
    }
}

/// Split `host:port` as `ngx_http_upstream_init_chash` does: the port is
/// the trailing run of digits after the last `:`; `unix:` paths have none.
fn split_host_port(server: &str) -> (&str, &str) {
    if server.len() >= 5 && server[..5].eq_ignore_ascii_case("unix:") {
        return (&server[5..], "");
    }
    let bytes = server.as_bytes();
    for j in 0..bytes.len() {
        let c = bytes[bytes.len() - j - 1];
        if c == b':' {
            return (&server[..bytes.len() - j - 1], &server[bytes.len() - j..]);
        }
        if !c.is_ascii_digit() {
            break;
        }
    }
    (server, "")
}

/// `hash KEY` step: `(crc32([REHASH] KEY) >> 16) & 0x7fff`, with REHASH (the
/// decimal rehash count) omitted on the first round (Cache::Memcached).
pub(crate) fn hash_step(key: &[u8], rehash: u64) -> u64 {
    let mut h = crc32fast::Hasher::new();
    if rehash > 0 {
        h.update(rehash.to_string().as_bytes());
    }
    h.update(key);
    u64::from((h.finalize() >> 16) & 0x7fff)
}

/// `ip_hash` step over the key bytes (3 octets of IPv4, 16 of IPv6).
pub(crate) fn ip_hash_step(mut hash: u32, addr: &[u8]) -> u32 {
    for b in addr {
        hash = (hash * 113 + u32::from(*b)) % 6271;
    }
    hash
}

/// The key bytes nginx's `ip_hash` uses for a client address.
pub fn ip_hash_key(ip: std::net::IpAddr) -> ([u8; 16], usize) {
    let mut out = [0u8; 16];
    match ip {
        std::net::IpAddr::V4(v4) => {
            out[..3].copy_from_slice(&v4.octets()[..3]);
            (out, 3)
        }
        // nginx hashes all 16 bytes of any AF_INET6 address, mapped IPv4 included.
        std::net::IpAddr::V6(v6) => {
            out.copy_from_slice(&v6.octets());
            (out, 16)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port_split_matches_nginx() {
        assert_eq!(split_host_port("127.0.0.1:8080"), ("127.0.0.1", "8080"));
        assert_eq!(split_host_port("backend"), ("backend", ""));
        assert_eq!(split_host_port("[::1]:80"), ("[::1]", "80"));
        assert_eq!(split_host_port("unix:/tmp/s"), ("/tmp/s", ""));
        assert_eq!(split_host_port("host:ab"), ("host:ab", ""));
    }

    #[test]
    fn cumulative_find_walks_like_nginx() {
        let c = Cumulative {
            ends: vec![2, 3, 6],
        };
        let got: Vec<usize> = (0..6).map(|w| c.find(w)).collect();
        assert_eq!(got, vec![0, 0, 1, 2, 2, 2]);
    }
}
