//! Helpers shared by the integration tests.

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::sync::Arc;

use vigil_core::config::{Balancer, ServerConfig, UpstreamConfig};
use vigil_core::event::EventBus;
use vigil_core::{ManualClock, Upstream};

/// A server line: address text and weight; the socket address is synthesized.
pub(crate) fn server(address: &str, weight: u32) -> ServerConfig {
    let addr: SocketAddr = address
        .parse()
        .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 1)));
    let mut s = ServerConfig::new(address, addr);
    s.weight = NonZeroU32::new(weight).expect("weight > 0");
    s
}

/// An upstream over `servers` with `balancer`, on a manual clock.
pub(crate) fn upstream(
    balancer: Balancer,
    servers: Vec<ServerConfig>,
) -> (Arc<Upstream>, Arc<ManualClock>) {
    let mut cfg = UpstreamConfig::new("u");
    cfg.balancer = balancer;
    cfg.servers = servers;
    let clock = Arc::new(ManualClock::at(1_000_000));
    let up = Arc::new(Upstream::new(
        cfg,
        Arc::new(EventBus::default()),
        clock.clone(),
    ));
    (up, clock)
}
