//! The fault lab: backends on 127.0.0.1 that misbehave on command, a load
//! driver that records what every request got, and the proxy under test
//! (`vigil serve` or stock nginx) as a child process.
//!
//! ```text
//! let lab = Lab::start(4, BackendOptions::default()).await?;
//! let site = Site { server_params: "max_fails=1 fail_timeout=2s".into(), ..Site::new(free_addr(), lab.addrs()) };
//! let proxy = Proxy::nginx(&site).await?;
//! lab.wait_serving(proxy.addr).await?;
//! let load = tokio::spawn(Load::new(proxy.addr, Duration::from_secs(7)).run());
//! lab[1].set(Behaviour::PartialBody).await?;   // ... later: Behaviour::Ok
//! let run = load.await?;
//! println!("{}", Summary::of(&run));          // and lab.ledger().repeats()
//! ```
//!
//! Used by the cli's integration tests (`crates/cli/tests/it/health.rs`)
//! and by the `faults` bench binary.

mod backend;
mod load;
mod proxy;
mod summary;
pub mod wire;

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

pub use backend::{Backend, BackendOptions, Behaviour, Counts, Delivery, Ledger};
pub use load::{Failure, Load, Outcome, Record, Run};
pub use proxy::{Kind, Proxy, Site};
pub use summary::{Summary, SLOW};
pub use vigil_testkit::{find_nginx as nginx_bin, free_addr};

/// A set of backends sharing one ledger.
#[derive(Debug)]
pub struct Lab {
    backends: Vec<Backend>,
    ledger: Arc<Ledger>,
}

// === impl Lab ===

impl Lab {
    /// `n` backends, indices `0..n`, all `Ok`.
    pub async fn start(n: usize, options: BackendOptions) -> io::Result<Self> {
        let ledger = Ledger::new();
        let mut backends = Vec::with_capacity(n);
        for i in 0..n {
            backends.push(Backend::start(i, ledger.clone(), options.clone()).await?);
        }
        Ok(Self { backends, ledger })
    }

    /// The backends' addresses, in index order.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.backends.iter().map(Backend::addr).collect()
    }

    /// The shared ledger.
    pub fn ledger(&self) -> &Arc<Ledger> {
        &self.ledger
    }

    /// The backends.
    pub fn backends(&self) -> &[Backend] {
        &self.backends
    }

    /// Wait (at most 10 s) until GETs through `proxy` have been answered by
    /// every backend: the proxy is up and (with an active check) every peer
    /// was seen up.
    pub async fn wait_serving(&self, proxy: SocketAddr) -> io::Result<()> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let mut seen = vec![false; self.backends.len()];
        let mut probe = Load::new(proxy, Duration::from_millis(200));
        probe.clients = 1;
        probe.rate = 50;
        probe.post_every = 0;
        probe.timeout = Duration::from_secs(2);
        while seen.iter().any(|s| !s) {
            if tokio::time::Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("not every backend answered through {proxy} within 10s: {seen:?}"),
                ));
            }
            for r in probe.run().await.records {
                if let (Some(b), Some(200)) = (r.backend, r.status()) {
                    if let Some(s) = seen.get_mut(b) {
                        *s = true;
                    }
                }
            }
        }
        Ok(())
    }
}

impl std::ops::Index<usize> for Lab {
    type Output = Backend;
    fn index(&self, i: usize) -> &Backend {
        &self.backends[i]
    }
}

#[cfg(test)]
mod tests;
