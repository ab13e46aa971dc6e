//! Checks both front ends share, on already-typed values.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use vigil_core::config::{CheckConfig, Listen, Location, LocationMatch};

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
            vigil_core::config::value::format_time(c.timeout),
            vigil_core::config::value::format_time(c.interval)
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

/// A percentage as both front ends write it: `N%`, N in 0..=100.
pub(crate) fn percent(text: &str) -> Result<u8, String> {
    text.strip_suffix('%')
        .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|n| n.parse::<u8>().ok())
        .filter(|n| *n <= 100)
        .ok_or_else(|| format!("invalid percentage \"{text}\", expected 0% to 100%"))
}

/// `factor=K` of `eject_stuck` (K >= 1) and `eject_slow` (K > 1), both at
/// most 1000, as a decimal number (`3`, `2.5`).
pub(crate) fn factor(text: &str, slow: bool) -> Result<f64, String> {
    let digits = !text.is_empty()
        && text.bytes().all(|b| b.is_ascii_digit() || b == b'.')
        && text.bytes().filter(|b| *b == b'.').count() <= 1;
    match digits.then(|| text.parse::<f64>().ok()).flatten() {
        Some(k) => factor_value(k, slow).map_err(|_| factor_error(&format!("\"{text}\""), slow)),
        None => Err(factor_error(&format!("\"{text}\""), slow)),
    }
}

/// [`factor`] of a number (TOML).
pub(crate) fn factor_value(k: f64, slow: bool) -> Result<f64, String> {
    let ok = k.is_finite() && k <= 1000.0 && if slow { k > 1.0 } else { k >= 1.0 };
    if ok {
        Ok(k)
    } else {
        Err(factor_error(&k.to_string(), slow))
    }
}

fn factor_error(shown: &str, slow: bool) -> String {
    let range = if slow {
        "a number above 1 and at most 1000"
    } else {
        "a number from 1 to 1000"
    };
    format!("invalid factor {shown}, expected {range} (such as 3 or 2.5)")
}

/// `min_requests=N`: 1 to 1,000,000.
pub(crate) fn min_requests(text: &str) -> Result<u32, String> {
    text.parse::<u32>()
        .ok()
        .filter(|n| (1..=1_000_000).contains(n))
        .ok_or_else(|| format!("invalid min_requests \"{text}\", expected 1 to 1000000"))
}

/// `window=T` of `eject_slow`: at least 100ms (two halves of 50 ms).
pub(crate) fn slow_window(w: std::time::Duration) -> Result<(), String> {
    if w < std::time::Duration::from_millis(100) {
        return Err(format!(
            "\"eject_slow\" window={} is too short, expected at least 100ms",
            vigil_core::config::value::format_time(w)
        ));
    }
    Ok(())
}

/// `max=T` of `eject_slow`: above zero (a bound of 0 would eject every
/// peer that answered at all).
pub(crate) fn slow_max(t: std::time::Duration) -> Result<(), String> {
    if t.is_zero() {
        return Err("\"eject_slow\" max=0 would eject every peer, expected a time above 0".into());
    }
    Ok(())
}

/// Which rule of an upstream cannot work, for the front end to point at.
#[derive(Debug)]
pub(crate) enum RuleProblem {
    /// `passive_recovery probe` without a `check`.
    ProbeWithoutCheck(String),
    /// `passive_penalty` with a zero `base` or `max`.
    Penalty(String),
    /// `slow_start` on server `index` with a balancer that cannot ramp.
    SlowStart(usize, String),
}

/// The vigil-only rules of an upstream that cannot work with the rest of it.
pub(crate) fn rules(up: &vigil_core::config::UpstreamConfig) -> Result<(), RuleProblem> {
    use vigil_core::config::{Balancer, Recovery};
    let r = &up.rules;
    if r.recovery == Recovery::Probe && up.check.is_none() {
        return Err(RuleProblem::ProbeWithoutCheck(format!(
            "\"passive_recovery probe\" in upstream \"{}\" needs an active \"check\": the peer returns after an exclusion only when a probe passes",
            up.name
        )));
    }
    if let Some(p) = &r.penalty {
        if p.base.is_zero() || p.max.is_zero() {
            return Err(RuleProblem::Penalty(
                "\"passive_penalty\" base and max must be greater than 0".into(),
            ));
        }
    }
    let hashing = match &up.balancer {
        Balancer::Hash { .. } => Some("hash"),
        Balancer::IpHash => Some("ip_hash"),
        _ => None,
    };
    if let Some(method) = hashing {
        if let Some(i) = up.servers.iter().position(|s| s.slow_start.is_some()) {
            return Err(RuleProblem::SlowStart(
                i,
                format!(
                    "server parameter \"slow_start\" cannot be used with \"{method}\" in upstream \"{}\" (nginx Plus refuses it too: with a hash the weights decide which keys go to which server, so a ramp would move keys)",
                    up.name
                ),
            ));
        }
    }
    Ok(())
}
