//! Why each peer does or does not get traffic: the rules in force at one
//! moment, for the admin API, `vigil status` and `vigil explain`.

use std::sync::Arc;

use crate::clock::Timestamp;
use crate::health::ProbeReport;
use crate::peer::Peer;

use super::policy::{self, Ineligible};
use super::{PassiveView, Upstream};

/// Everything known about one peer at one moment.
#[derive(Clone, Debug)]
pub struct PeerStatus {
    /// The peer.
    pub peer: Arc<Peer>,
    /// Passive accounting.
    pub passive: PassiveView,
    /// Active-check state.
    pub health: crate::health::HealthView,
    /// The last probe.
    pub last_probe: Option<ProbeReport>,
    /// Whether it is a backup.
    pub backup: bool,
    /// Why it would not be picked now (empty: eligible).
    pub reasons: Vec<Ineligible>,
}

// === impl Upstream (status) ===

impl Upstream {
    /// The state of every peer, with the reasons each is not eligible.
    pub fn status(&self, now: Timestamp) -> Vec<PeerStatus> {
        self.peers
            .iter()
            .map(|peer| {
                let i = peer.id().0 as usize;
                let backup = i >= self.primary.len();
                let tier = if backup {
                    self.backup.as_ref()
                } else {
                    Some(&self.primary)
                };
                let slot = tier.map(|t| t.slot(i - t.offset)).unwrap_or_default();
                let passive = PassiveView::of(&slot);
                let single = !backup && self.primary.single;
                let reasons = policy::reasons(peer, &slot, single, now);
                let health = peer.health().view();
                PeerStatus {
                    peer: peer.clone(),
                    passive,
                    health,
                    last_probe: peer.last_probe(),
                    backup,
                    reasons,
                }
            })
            .collect()
    }
}
