//! Why each peer does or does not get traffic: the rules in force at one
//! moment, for the admin API, `vigil status` and `vigil explain`.

use std::sync::Arc;

use crate::clock::{duration_ms, Timestamp};
use crate::health::ProbeReport;
use crate::peer::{AdminState, Peer};

use super::{PassiveView, Upstream};

/// Why a peer gets no new requests right now.
#[derive(Clone, Debug, PartialEq)]
pub enum Ineligible {
    /// `down` in the config.
    ConfigDown,
    /// Set down or draining through the admin API.
    Admin {
        /// The state.
        state: AdminState,
        /// Since when.
        since: Timestamp,
    },
    /// Active checks say down.
    ProbeDown {
        /// Since when (0 = initial state, no result yet).
        since: Timestamp,
        /// Consecutive failed probes.
        fail_streak: u32,
        /// Passes still needed.
        rise_needed: u32,
    },
    /// Passive: `fails >= max_fails` inside `fail_timeout` of the last failure.
    Excluded {
        /// Failures counted.
        fails: u32,
        /// The threshold.
        max_fails: u32,
        /// The last failure (or trial request).
        since: Timestamp,
        /// When one request will be let through to test it.
        until: Timestamp,
    },
    /// `max_conns` reached.
    Full {
        /// In flight.
        conns: u32,
        /// The limit.
        max_conns: u32,
    },
}

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
                let passive = tier.map(|t| t.view(i - t.offset)).unwrap_or_default();
                let mut reasons = Vec::new();
                let cfg = peer.config();
                if cfg.down {
                    reasons.push(Ineligible::ConfigDown);
                }
                if peer.admin() != AdminState::Up {
                    reasons.push(Ineligible::Admin {
                        state: peer.admin(),
                        since: peer.admin_since(),
                    });
                }
                let health = peer.health().view();
                if !peer.health().allows_traffic() {
                    let rise = peer.health().policy().map_or(0, |p| p.rise);
                    reasons.push(Ineligible::ProbeDown {
                        since: health.since,
                        fail_streak: health.fail_streak,
                        rise_needed: rise.saturating_sub(health.ok_streak),
                    });
                }
                let single = !backup && self.primary.single;
                if !single
                    && cfg.max_fails != 0
                    && passive.fails >= cfg.max_fails
                    && now.millis_since(passive.checked) <= duration_ms(cfg.fail_timeout)
                {
                    reasons.push(Ineligible::Excluded {
                        fails: passive.fails,
                        max_fails: cfg.max_fails,
                        since: passive.checked,
                        until: passive.checked.after(cfg.fail_timeout),
                    });
                }
                if peer.is_full() {
                    reasons.push(Ineligible::Full {
                        conns: peer.conns(),
                        max_conns: cfg.max_conns,
                    });
                }
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
