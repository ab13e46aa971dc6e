//! Misuse of vigil's latency rules (`eject_stuck`, `eject_slow`), also
//! when `health_preset` switched them on: settings that load but cannot
//! act, or act where they should not.

use std::time::Duration;

use super::{finding, t, Cx, Positioned, Severity};
use vigil_core::config::{Location, UpstreamConfig};

pub(super) const EJECT_SLOW_FEW_PEERS: &str = "eject-slow-few-peers";
pub(super) const EJECT_SLOW_TWO_PEERS: &str = "eject-slow-two-peers";
pub(super) const EJECT_STUCK_NEVER: &str = "eject-stuck-never";
pub(super) const EJECT_STUCK_LONG_POLL: &str = "eject-stuck-long-poll";

/// A read timeout above this suggests headers held back on purpose.
const LONG_POLL: Duration = Duration::from_secs(60);

pub(super) fn lint(cx: &Cx<'_>, up: &UpstreamConfig, out: &mut Vec<Positioned>) {
    slow(up, out);
    stuck(cx, up, out);
}

fn live_primaries(up: &UpstreamConfig) -> usize {
    up.servers.iter().filter(|s| !s.backup && !s.down).count()
}

/// `eject-slow-few-peers`, `eject-slow-two-peers`.
fn slow(up: &UpstreamConfig, out: &mut Vec<Positioned>) {
    let Some(rule) = &up.rules.eject_slow else {
        return;
    };
    let at = &up.rules.origins.eject_slow;
    let n = live_primaries(up);
    if n < 2 {
        out.push(finding(
            EJECT_SLOW_FEW_PEERS,
            Severity::Warning,
            at,
            format!(
                "upstream {}: eject_slow never ejects: it has {n} primary server(s) in service and a peer is judged against the others",
                up.name
            ),
            "eject_slow compares a peer's median time-to-header with the median of the other \
             peers' (each with min_requests headers in the window). With one server there is \
             no other to compare with (and nginx's single-server rule keeps it anyway), so the \
             rule does nothing. Add servers, or remove eject_slow and rely on eject_stuck and \
             the timeouts."
                .to_string(),
        ));
    } else if n == 2 {
        out.push(finding(
            EJECT_SLOW_TWO_PEERS,
            Severity::Info,
            at,
            format!(
                "upstream {}: with two servers, eject_slow judges each against the other: the slower one goes when it is {}× slower",
                up.name, rule.factor
            ),
            "With two primaries the median of a peer's others is the other peer's figure, so \
             the rule ejects whichever is factor× slower than the other, and the remaining one \
             takes every request. If the two share the load because one alone cannot carry \
             it, a slow ejection moves the slowness (overload) to the other: keep max_ejected \
             below 50% (it then allows no ejection of two) or use a higher factor."
                .to_string(),
        ));
    }
}

/// `eject-stuck-never`, `eject-stuck-long-poll`.
fn stuck(cx: &Cx<'_>, up: &UpstreamConfig, out: &mut Vec<Positioned>) {
    let config = cx.config;
    let Some(rule) = &up.rules.eject_stuck else {
        return;
    };
    let at = &up.rules.origins.eject_stuck;
    if up.servers.len() == 1 {
        out.push(finding(
            EJECT_STUCK_NEVER,
            Severity::Warning,
            at,
            format!(
                "upstream {}: eject_stuck never acts on its single server",
                up.name
            ),
            "nginx's single-server rule applies to an upstream with one server: it is never \
             excluded, so vigil does not take it out for a stuck attempt either (there would \
             be nowhere else to send the request). Add a server or remove eject_stuck."
                .to_string(),
        ));
        return;
    }
    let locations: Vec<&Location> = config
        .servers
        .iter()
        .flat_map(|b| &b.locations)
        .filter(|l| l.proxy.pass.as_ref().is_some_and(|p| p.upstream == up.name))
        .collect();
    let wait = |l: &Location| l.proxy.connect_timeout + l.proxy.read_timeout;
    if let Some(longest) = locations.iter().map(|l| wait(l)).max() {
        if rule.min >= longest {
            out.push(finding(
                EJECT_STUCK_NEVER,
                Severity::Warning,
                &cx.at_upstream_param(up, "eject_stuck", "min", at),
                format!(
                    "upstream {}: eject_stuck min={} is not below proxy_connect_timeout + proxy_read_timeout ({}): an attempt times out before it can be stuck",
                    up.name,
                    t(rule.min),
                    t(longest)
                ),
                format!(
                    "eject_stuck takes a peer out of rotation while one of its attempts has waited \
                     longer than max(min, factor × the recent p99) for its response header. An \
                     attempt waits at most proxy_connect_timeout + proxy_read_timeout ({}) before \
                     it fails, so with min={} the rule never acts. Lower min well under the \
                     timeouts (the recommended preset uses 25ms against 1s timeouts).",
                    t(longest),
                    t(rule.min)
                ),
            ));
            return;
        }
    }
    if let Some(l) = locations.iter().find(|l| l.proxy.read_timeout > LONG_POLL) {
        out.push(finding(
            EJECT_STUCK_LONG_POLL,
            Severity::Info,
            at,
            format!(
                "upstream {}: location {} waits up to proxy_read_timeout {} for a header; eject_stuck takes a peer out after {} of waiting",
                up.name,
                l.path,
                t(l.proxy.read_timeout),
                t(rule.min)
            ),
            "A read timeout this long usually means the backend holds the response header \
             back on purpose (long polling, server push). eject_stuck counts only the wait for \
             the header, so every peer with a parked long poll would look stuck and take no \
             new requests. Give the long-poll location its own upstream without eject_stuck, \
             or raise eject_stuck's min above the longest intended wait."
                .to_string(),
        ));
    }
}
