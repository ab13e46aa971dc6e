//! Shared setup for vigil's benchmarks (see `benches/pick.rs` and `load/`),
//! and the fault lab ([`lab`]) of the load scenarios and the cli's health tests.

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod lab;

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::sync::Arc;

use vigil_core::config::{Balancer, ServerConfig, UpstreamConfig};
use vigil_core::event::EventBus;
use vigil_core::Upstream;
use vigil_net::SystemClock;

/// An upstream of `n` peers with weights 1..=3, on the real clock.
pub fn upstream(n: usize, balancer: Balancer) -> Arc<Upstream> {
    let mut cfg = UpstreamConfig::new("bench");
    cfg.balancer = balancer;
    cfg.servers = (0..n)
        .map(|i| {
            let addr = SocketAddr::from(([10, (i >> 16) as u8, (i >> 8) as u8, i as u8], 80));
            let mut s = ServerConfig::new(addr.to_string(), addr);
            s.weight = NonZeroU32::new(1 + (i % 3) as u32).unwrap_or(NonZeroU32::MIN);
            s
        })
        .collect();
    Arc::new(Upstream::new(
        cfg,
        Arc::new(EventBus::default()),
        Arc::new(SystemClock::new()),
    ))
}
