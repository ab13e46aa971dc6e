//! `server NAME resolve` (nginx 1.27.3+): while vigil runs, every such
//! name is asked again of the upstream's `resolver` servers, every
//! `valid=` or, without it, when the answer's TTL runs out (at least
//! [`MIN_INTERVAL`]). When the set of addresses changes, the upstream's
//! servers are rebuilt (one per address, as at load) and put in force
//! through the reload path, so the peers of addresses that stay keep their
//! passive and active state. A failed or empty answer keeps the addresses
//! in force, as nginx keeps them.
//!
//! At load the names are resolved through the system resolver as every
//! name is, so start does not wait on the configured DNS servers.

use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Weak};
use std::time::Duration;

use hickory_resolver::config::{
    LookupIpStrategy, NameServerConfig, Protocol, ResolverConfig as DnsConfig, ResolverOpts,
};
use hickory_resolver::TokioAsyncResolver;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use vigil_core::config::{Config, ResolverConfig, ServerConfig};
use vigil_core::event::{Event, EventBus, EventKind};
use vigil_core::Clock;

/// The shortest time between two queries of one name.
pub(crate) const MIN_INTERVAL: Duration = Duration::from_secs(1);

/// After a failed query, the next one comes after `valid=` or this.
const RETRY_AFTER_ERROR: Duration = Duration::from_secs(5);

/// The longest sleep between two looks at the configuration in force (a
/// reload may have brought new names).
const RESCAN: Duration = Duration::from_secs(1);

/// One `server NAME resolve` line of one upstream.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    upstream: String,
    address: String,
}

/// A line as the configuration in force has it.
struct Line {
    key: Key,
    host: String,
    port: u16,
    resolver: ResolverConfig,
    addrs: Vec<SocketAddr>,
}

/// Every resolve line of `config`, its addresses in force.
fn lines(config: &Config) -> Vec<Line> {
    let mut out: Vec<Line> = Vec::new();
    for u in &config.upstreams {
        let Some(r) = &u.resolver else { continue };
        for s in u.servers.iter().filter(|s| s.resolve) {
            let key = Key {
                upstream: u.name.clone(),
                address: s.address.clone(),
            };
            if let Some(l) = out.iter_mut().find(|l| l.key == key) {
                l.addrs.push(s.addr);
                continue;
            }
            let host = host_of(&s.address);
            out.push(Line {
                key,
                host,
                port: s.addr.port(),
                resolver: r.clone(),
                addrs: vec![s.addr],
            });
        }
    }
    out
}

/// `app.test:8080` → `app.test.` (a fully qualified name: no search list).
fn host_of(address: &str) -> String {
    let host = match address.rsplit_once(':') {
        Some((h, p)) if p.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => address,
    };
    if host.ends_with('.') {
        host.to_string()
    } else {
        format!("{host}.")
    }
}

/// The addresses of `host` from `r`'s servers, and how long they stand
/// (the smallest TTL of the answer's records, as nginx takes it).
async fn query(r: &ResolverConfig, host: &str) -> Result<(Vec<IpAddr>, Duration), String> {
    let mut cfg = DnsConfig::new();
    for s in &r.servers {
        cfg.add_name_server(NameServerConfig::new(*s, Protocol::Udp));
    }
    let mut opts = ResolverOpts::default();
    opts.timeout = r.timeout;
    opts.attempts = 1;
    // nginx's resolver reads no hosts file and keeps its own cache per
    // answer: a new client per query, so that no cache outlives `valid=`.
    opts.use_hosts_file = false;
    opts.ip_strategy = match (r.ipv4, r.ipv6) {
        (true, true) => LookupIpStrategy::Ipv4AndIpv6,
        (false, true) => LookupIpStrategy::Ipv6Only,
        _ => LookupIpStrategy::Ipv4Only,
    };
    let resolver = TokioAsyncResolver::tokio(cfg, opts);
    let answer = tokio::time::timeout(r.timeout + r.timeout, resolver.lookup_ip(host))
        .await
        .map_err(|_| format!("no answer within {:?}", r.timeout))?
        .map_err(|e| e.to_string())?;
    let ttl = answer
        .as_lookup()
        .record_iter()
        .map(|r| r.ttl())
        .min()
        .unwrap_or(0);
    Ok((answer.iter().collect(), Duration::from_secs(u64::from(ttl))))
}

/// The servers of `config`'s upstream `key.upstream` with the line
/// `key.address` rebuilt for `addrs`; None when the line is gone.
fn rebuilt(config: &Config, key: &Key, addrs: &[SocketAddr]) -> Option<Config> {
    let mut next = config.clone();
    let u = next.upstreams.iter_mut().find(|u| u.name == key.upstream)?;
    let at = u
        .servers
        .iter()
        .position(|s| s.resolve && s.address == key.address)?;
    let template: ServerConfig = u.servers[at].clone();
    u.servers
        .retain(|s| !(s.resolve && s.address == key.address));
    let fresh = template.per_address(addrs);
    u.servers.splice(at..at, fresh);
    Some(next)
}

/// The addresses in force for a line after an answer: those that stay,
/// in their order, then the new ones in the answer's order. None when the
/// set did not change (or the answer was empty: nginx keeps the last).
fn merged(now: &[SocketAddr], answer: &[IpAddr], port: u16) -> Option<Vec<SocketAddr>> {
    let answer: Vec<SocketAddr> = answer.iter().map(|ip| SocketAddr::new(*ip, port)).collect();
    if answer.is_empty() {
        return None;
    }
    let old: BTreeSet<SocketAddr> = now.iter().copied().collect();
    let new: BTreeSet<SocketAddr> = answer.iter().copied().collect();
    if old == new {
        return None;
    }
    let mut out: Vec<SocketAddr> = now.iter().filter(|a| new.contains(a)).copied().collect();
    for a in answer {
        if !out.contains(&a) {
            out.push(a);
        }
    }
    Some(out)
}

/// What re-resolving needs of the running stack (`crate::stack::Stack`):
/// the configuration in force, and a reload that puts a new one in force.
pub(crate) trait Reload: Send + Sync + 'static {
    /// The generation in force.
    fn current(&self) -> Arc<vigil_proxy::Generation>;
    /// Put `config` in force; the new generation's number, or why not.
    fn reload(&self, config: Config) -> Result<u64, String>;
}

/// Re-resolve the resolve lines of the stack's configuration until
/// `shutdown`; the task holds the stack weakly.
pub(crate) fn spawn(
    stack: Weak<dyn Reload>,
    events: Arc<EventBus>,
    clock: Arc<dyn Clock>,
    shutdown: CancellationToken,
) {
    tokio::spawn(async move {
        let mut due: HashMap<Key, Instant> = HashMap::new();
        loop {
            // The lines of the configuration in force (a reload may have
            // brought or taken some); nothing is cloned when there are none.
            let Some(current) = stack.upgrade().map(|s| lines(&s.current().config)) else {
                return;
            };
            let now = Instant::now();
            let mut next = now + RESCAN;
            due.retain(|k, _| current.iter().any(|l| &l.key == k));
            for line in current {
                let at = *due.entry(line.key.clone()).or_insert(now);
                if at > now {
                    next = next.min(at);
                    continue;
                }
                let wait = match query(&line.resolver, &line.host).await {
                    Ok((ips, ttl)) => {
                        if let Some(addrs) = merged(&line.addrs, &ips, line.port) {
                            apply(&stack, &events, &clock, &line, &addrs);
                        } else if ips.is_empty() {
                            tracing::warn!(upstream = %line.key.upstream, server = %line.key.address, "the resolver's answer has no address; keeping the addresses in force");
                        }
                        line.resolver.valid.unwrap_or(ttl)
                    }
                    Err(e) => {
                        tracing::warn!(upstream = %line.key.upstream, server = %line.key.address, error = %e, "could not be resolved; keeping the addresses in force");
                        line.resolver.valid.unwrap_or(RETRY_AFTER_ERROR)
                    }
                };
                let at = Instant::now() + wait.max(MIN_INTERVAL);
                due.insert(line.key.clone(), at);
                next = next.min(at);
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep_until(next) => {}
            }
        }
    });
}

/// Put the line's new addresses in force and say so.
fn apply(
    stack: &Weak<dyn Reload>,
    events: &EventBus,
    clock: &Arc<dyn Clock>,
    line: &Line,
    addrs: &[SocketAddr],
) {
    let Some(stack) = stack.upgrade() else { return };
    // The configuration in force now (a reload may have come in between).
    let config = stack.current().config.clone();
    let Some(next) = rebuilt(&config, &line.key, addrs) else {
        return;
    };
    let show = |v: &[SocketAddr]| v.iter().map(|a| a.to_string()).collect::<Vec<_>>();
    let added: Vec<SocketAddr> = addrs
        .iter()
        .filter(|a| !line.addrs.contains(a))
        .copied()
        .collect();
    let removed: Vec<SocketAddr> = line
        .addrs
        .iter()
        .filter(|a| !addrs.contains(a))
        .copied()
        .collect();
    match stack.reload(next) {
        Ok(generation) => {
            let now = clock.now();
            events.publish(Event {
                seq: 0,
                at: now,
                unix_ms: clock.unix_ms(now),
                upstream: line.key.upstream.as_str().into(),
                peer: line.key.address.as_str().into(),
                kind: EventKind::Resolved {
                    added: show(&added),
                    removed: show(&removed),
                    now: show(addrs),
                },
            });
            tracing::debug!(generation, "resolve change in force");
        }
        Err(e) => {
            tracing::error!(upstream = %line.key.upstream, server = %line.key.address, error = %e, "new addresses not put in force; keeping the running configuration");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(s: &str) -> SocketAddr {
        s.parse().expect("address")
    }

    #[test]
    fn an_answer_changes_the_set_not_the_order() {
        let now = [sa("10.0.0.1:80"), sa("10.0.0.2:80")];
        let ip = |s: &str| s.parse::<IpAddr>().expect("address");
        // Same set, other order (DNS servers rotate): no change.
        assert_eq!(merged(&now, &[ip("10.0.0.2"), ip("10.0.0.1")], 80), None);
        // Empty: the last addresses are kept.
        assert_eq!(merged(&now, &[], 80), None);
        // Staying first, in their order; new ones after.
        assert_eq!(
            merged(&now, &[ip("10.0.0.3"), ip("10.0.0.2")], 80),
            Some(vec![sa("10.0.0.2:80"), sa("10.0.0.3:80")])
        );
    }

    #[test]
    fn the_host_is_queried_fully_qualified() {
        assert_eq!(host_of("app.test:8080"), "app.test.");
        assert_eq!(host_of("app.test"), "app.test.");
        assert_eq!(host_of("app.test.:80"), "app.test.");
    }
}
