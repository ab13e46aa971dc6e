//! vigil-fleet: many vigil instances share one health view through etcd.
//!
//! Core still decides everything about health; the fleet only chooses who
//! probes a target and carries the results:
//! - each instance joins with an etcd lease (TTL, kept alive) and its
//!   member key; every member watches the fleet's prefix;
//! - each target is probed by the `R` live members that rendezvous hashing
//!   ([`rendezvous`]) picks; the others skip it (the checker asks
//!   [`vigil_checker::Sharing::owns`] before each probe);
//! - the probing member publishes each result under its lease; the others
//!   record it into their own core through
//!   [`vigil_checker::Checker::record_remote`], the path a local result
//!   takes, so rise/fall apply identically and `explain` names the prober;
//! - a write under the prefix is believed only where a member could have
//!   made it (a member key with a lease; a result of a live member under
//!   its lease for its own target; times within a few seconds): see
//!   `trust`; the defence against a hostile writer is etcd's auth and TLS;
//! - etcd unreachable or slow: the member probes every target itself
//!   (within one interval), logs it, and rejoins when etcd is back; traffic
//!   never waits on etcd.
//!
//! The keys are described in [`wire`]; docs/fleet.md has the consistency
//! model.

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

mod error;
mod options;
pub mod rendezvous;
mod session;
mod state;
mod trust;
mod view;
pub mod wire;

use std::sync::Arc;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use vigil_checker::{Checker, Sharing};

pub use error::FleetError;
pub use options::{
    EtcdTls, EtcdUser, FleetOptions, DEFAULT_ETCD_TIMEOUT, DEFAULT_PREFIX, DEFAULT_TTL, MIN_TTL,
};
pub use view::{FleetView, HistoryView, TargetView, VerdictView};

/// A running member of a fleet. Dropping it stops the session (the lease
/// then expires after its TTL; [`Fleet::leave`] revokes it at once).
pub struct Fleet {
    shared: Arc<state::Shared>,
    cancel: CancellationToken,
    task: std::sync::Mutex<Option<JoinHandle<()>>>,
}

// === impl Fleet ===

impl Fleet {
    /// Start the session with etcd (in the background: until it has joined,
    /// this instance probes every target). Must be called inside a tokio
    /// runtime. Fails only on bad options or unreadable TLS files.
    pub fn start(options: FleetOptions) -> Result<Self, FleetError> {
        options.validate()?;
        let connect = session::connect_options(&options)?;
        let (shared, outbox) = state::Shared::new(options);
        let cancel = CancellationToken::new();
        let task = tokio::spawn(session::run(
            shared.clone(),
            connect,
            outbox,
            cancel.clone(),
        ));
        Ok(Self {
            shared,
            cancel,
            task: std::sync::Mutex::new(Some(task)),
        })
    }

    /// The hook to give the checker ([`vigil_checker::CheckerOptions::sharing`]).
    pub fn sharing(&self) -> Arc<dyn Sharing> {
        self.shared.clone()
    }

    /// The checker that remote results go to (once it runs).
    pub fn attach(&self, checker: &Arc<Checker>) {
        self.shared.attach(checker);
    }

    /// Publish this member's state changes (joined, degraded, left) on
    /// `bus` as [`EventKind::Fleet`](vigil_core::event::EventKind::Fleet)
    /// events, from now on.
    pub fn publish_to(
        &self,
        bus: Arc<vigil_core::event::EventBus>,
        clock: Arc<dyn vigil_core::Clock>,
    ) {
        self.shared.publish_to(bus, clock);
    }

    /// This instance ejected `peer` of `upstream` on its own traffic for
    /// `penalty_ms` (feed it the core event bus's `Excluded` events): with
    /// `share_passive`, the other members probe that peer at once, or,
    /// where it has no check, halve its weight for the rest of the penalty
    /// ([`vigil_core::upstream::Upstream::halve_weight`]).
    pub fn ejected(&self, upstream: &str, peer: &str, penalty_ms: u64) {
        self.shared.ejected(upstream, peer, penalty_ms);
    }

    /// The fleet as this member sees it.
    pub fn view(&self) -> FleetView {
        self.shared.view()
    }

    /// Leave the fleet: revoke the lease (the others take over this
    /// member's targets at once) and stop.
    pub async fn leave(&self) {
        self.cancel.cancel();
        let task = self.task.lock().ok().and_then(|mut t| t.take());
        if let Some(t) = task {
            let _ = t.await;
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fleet")
            .field("shared", &self.shared)
            .finish()
    }
}
