//! From a registry to the set of probe targets: one per distinct address
//! and check definition (tengine's `unique=true`, always on unless dedup is
//! turned off), each with the peers that share its result.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use vigil_core::config::{CheckConfig, CheckKind, ServerConfig, StatusClass};
use vigil_core::peer::PeerId;
use vigil_core::registry::Registry;
use vigil_core::upstream::Upstream;

use crate::probe::tls::{host_of, TlsCache, TlsPolicy};
use crate::probe::Target;
use crate::{CheckerError, TlsOptions};

/// What makes two probes the same probe: everything that changes what is
/// sent, where, and how the answer is judged or timed.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TargetKey {
    /// Where the probe connects.
    pub addr: SocketAddr,
    /// The unix-domain socket the probe connects to instead (`server unix:`).
    pub unix: Option<std::path::PathBuf>,
    kind: u8,
    /// TLS server name (https only; empty otherwise).
    server_name: String,
    send: String,
    expect: Vec<(u8, u16)>,
    body_contains: Option<String>,
    timeout: Duration,
    interval: Duration,
    jitter: Duration,
    tls: Option<TlsOptions>,
    /// With dedup off: the one peer this target belongs to.
    owner: Option<(String, u32)>,
}

/// One peer that takes a target's results.
#[derive(Clone, Debug)]
pub(crate) struct Member {
    pub(crate) upstream: Arc<Upstream>,
    pub(crate) peer: PeerId,
}

/// A target with its members.
pub(crate) struct Planned {
    pub(crate) key: TargetKey,
    pub(crate) target: Arc<Target>,
    pub(crate) members: Vec<Member>,
}

/// Every target of `registry`, in the order first met (upstreams, then
/// peers, in config order).
pub(crate) fn plan(
    registry: &Registry,
    dedup: bool,
    policy: &TlsPolicy,
    cache: &TlsCache,
) -> Result<Vec<Planned>, CheckerError> {
    let mut out: Vec<Planned> = Vec::new();
    let mut index: HashMap<TargetKey, usize> = HashMap::new();
    for up in registry.upstreams() {
        let Some(check) = up.config().check.as_ref() else {
            continue;
        };
        let tls = (check.kind == CheckKind::Https).then(|| policy.for_upstream(up.name()));
        for peer in up.peers() {
            let key = key_of(check, peer.config(), tls, || {
                (!dedup).then(|| (up.name().to_string(), peer.id().0))
            });
            let member = Member {
                upstream: up.clone(),
                peer: peer.id(),
            };
            if let Some(&i) = index.get(&key) {
                out[i].members.push(member);
                continue;
            }
            let target = Target {
                addr: key.addr,
                unix: key.unix.clone(),
                kind: check.kind,
                server_name: host_of(&peer.config().address).to_string(),
                http: check.http.clone(),
                timeout: check.timeout,
                interval: check.interval,
                jitter: check.jitter,
                tls: match tls {
                    Some(o) => Some(cache.get(o)?),
                    None => None,
                },
            };
            index.insert(key.clone(), out.len());
            out.push(Planned {
                key,
                target: Arc::new(target),
                members: vec![member],
            });
        }
    }
    Ok(out)
}

fn key_of(
    check: &CheckConfig,
    server: &ServerConfig,
    tls: Option<&TlsOptions>,
    owner: impl FnOnce() -> Option<(String, u32)>,
) -> TargetKey {
    let address = server.address.as_str();
    let mut addr = server.addr;
    if let Some(port) = check.port {
        addr.set_port(port);
    }
    let http = check.kind != CheckKind::Tcp;
    TargetKey {
        addr,
        unix: server.unix.clone(),
        kind: match check.kind {
            CheckKind::Tcp => 0,
            CheckKind::Http => 1,
            CheckKind::Https => 2,
        },
        server_name: if tls.is_some() {
            host_of(address).to_string()
        } else {
            String::new()
        },
        send: if http {
            check.http.send.clone()
        } else {
            String::new()
        },
        expect: if http {
            check
                .http
                .expect
                .iter()
                .map(|c| match c {
                    StatusClass::Class(n) => (*n, 0),
                    StatusClass::Exact(s) => (0, *s),
                })
                .collect()
        } else {
            Vec::new()
        },
        body_contains: if http {
            check.http.body_contains.clone()
        } else {
            None
        },
        timeout: check.timeout,
        interval: check.interval,
        jitter: check.jitter,
        tls: tls.cloned(),
        owner: owner(),
    }
}

impl TargetKey {
    /// A name of this target that is the same in every instance running
    /// the same check definition (the fleet's key for it): the check type,
    /// the address, and a CRC-32 of everything else that makes the probe,
    /// e.g. `http-127.0.0.1:8080-1c291ca3`.
    pub fn id(&self) -> String {
        let rest = format!(
            "{}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}",
            self.server_name,
            self.send,
            self.expect,
            self.body_contains,
            self.timeout,
            self.interval,
            self.jitter,
            self.tls,
            self.owner
        );
        let addr = match &self.unix {
            Some(p) => format!("unix:{}", p.display()),
            None => self.addr.to_string(),
        };
        format!(
            "{}-{addr}-{:08x}",
            self.kind_name(),
            crc32fast::hash(rest.as_bytes())
        )
    }

    /// The check type's name (`tcp`, `http`, `https`).
    pub fn kind_name(&self) -> &'static str {
        match self.kind {
            0 => "tcp",
            1 => "http",
            _ => "https",
        }
    }
}
