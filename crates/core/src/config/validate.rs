//! Checks both front ends share, on already-typed values.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use super::{CheckConfig, Listen, Location, LocationMatch};

/// A check definition that cannot work.
pub(crate) fn check(c: &CheckConfig) -> Result<(), String> {
    if c.interval.is_zero() {
        return Err("check interval must be greater than 0".into());
    }
    if c.timeout.is_zero() {
        return Err("check timeout must be greater than 0".into());
    }
    if c.timeout >= c.interval {
        return Err(format!(
            "check timeout ({}) must be shorter than interval ({}): a probe would still run when the next is due",
            super::value::format_time(c.timeout),
            super::value::format_time(c.interval)
        ));
    }
    if c.jitter >= c.interval {
        return Err("check jitter must be shorter than interval".into());
    }
    Ok(())
}

/// nginx's `connection_pool_size` on 64-bit systems (not configurable in
/// vigil): `large_client_header_buffers` may not be smaller.
pub(crate) const CONNECTION_POOL_SIZE: u64 = 512;

/// `large_client_header_buffers NUMBER SIZE` as nginx accepts it.
pub(crate) fn header_buffers(number: u32, size: u64) -> Result<(), String> {
    if number == 0 || size == 0 {
        return Err("\"large_client_header_buffers\" directive invalid value".into());
    }
    if size < CONNECTION_POOL_SIZE {
        return Err("the \"large_client_header_buffers\" size must be equal to or greater than \"connection_pool_size\"".into());
    }
    Ok(())
}

/// The listen addresses of the servers read so far, for nginx's checks
/// across servers (both front ends use one book per configuration).
#[derive(Debug, Default)]
pub(crate) struct ListenBook(BTreeMap<SocketAddr, Seen>);

#[derive(Clone, Copy, Debug, Default)]
struct Seen {
    default_server: bool,
    options: bool,
}

impl ListenBook {
    /// Add `l` of a server that already has `own`; `options` says it sets
    /// socket options (`backlog`, `reuseport`, ...). nginx's refusals, in
    /// its words and order: `a duplicate listen ADDR` (twice in one
    /// server), `duplicate listen options for ADDR` (options on two
    /// servers of an address), `a duplicate default server for ADDR`.
    pub(crate) fn add(&mut self, own: &[Listen], l: &Listen, options: bool) -> Result<(), String> {
        if own.iter().any(|o| o.addr == l.addr) {
            return Err(format!("a duplicate listen {}", l.addr));
        }
        let seen = self.0.entry(l.addr).or_default();
        if options && seen.options {
            return Err(format!("duplicate listen options for {}", l.addr));
        }
        if l.default_server && seen.default_server {
            return Err(format!("a duplicate default server for {}", l.addr));
        }
        seen.options |= options;
        seen.default_server |= l.default_server;
        Ok(())
    }
}

/// nginx's `duplicate location "/x"`: two prefix locations (`^~` or not)
/// or two exact ones of one path in a server; an exact and a prefix one of
/// the same path may coexist.
pub(crate) fn duplicate_location(earlier: &[Location], loc: &Location) -> Result<(), String> {
    let exact = |l: &Location| l.matcher == LocationMatch::Exact;
    if earlier
        .iter()
        .any(|o| o.path == loc.path && exact(o) == exact(loc))
    {
        return Err(format!("duplicate location \"{}\"", loc.path));
    }
    Ok(())
}
