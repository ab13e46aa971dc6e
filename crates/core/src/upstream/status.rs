//! Why each peer does or does not get traffic: the rules in force at one
//! moment, for the admin API, `vigil status` and `vigil explain`, and the
//! two questions the checker asks core: which peers a health rule ejects
//! ([`Upstream::ejected_now`], what checker-only mode renders down) and
//! which peers wait for a recovery probe ([`Upstream::probes_wanted`]).

use std::sync::Arc;
use std::time::Duration;

use crate::clock::Timestamp;
use crate::config::Recovery;
use crate::health::ProbeReport;
use crate::peer::{Peer, PeerId};

use super::policy::{self, Ineligible};
use super::slot::Slot;
use super::tier::Tier;
use super::{PassiveView, PeerFigure, Upstream};

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
    /// Ejections in force that `max_ejected` overrides: the peer stays
    /// eligible despite them (it has the best record of the ejected).
    pub waived: Vec<Ineligible>,
    /// The weight it has now: its `weight`, lower while `slow_start` ramps.
    pub weight_now: u32,
    /// `passive_recovery probation=N`: (successes in a row, N) while it is
    /// half-open (one request at a time).
    pub probation: Option<(u32, u32)>,
    /// `eject_slow`: its time-to-header figure over the window now.
    pub header_figure: Option<PeerFigure>,
    /// `eject_stuck`: its attempts waiting for a header now.
    pub waiting: Option<WaitingNow>,
}

/// `eject_stuck`: a peer's attempts still waiting for a header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitingNow {
    /// How many.
    pub attempts: u32,
    /// How long the oldest has waited (zero: none).
    pub oldest: Duration,
}

/// `eject_stuck` at one moment.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StuckNow {
    /// The threshold now: max(min, K × p99).
    pub threshold: Duration,
    /// The upstream's recent p99 time-to-header (None: too few samples).
    pub p99: Option<Duration>,
}

/// A peer waiting for a recovery probe (`passive_recovery probe`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbeWanted {
    /// The peer.
    pub peer: PeerId,
    /// When its exclusion ends: a probe passing at or after this time
    /// readmits it. At or before now: probe it at once.
    pub at: Timestamp,
}

/// A peer a health rule ejects now.
#[derive(Clone, Debug, PartialEq)]
pub struct Ejection {
    /// The peer.
    pub peer: PeerId,
    /// The first ejecting rule (probes down, passive exclusion, a pending
    /// recovery probe, a slow or a stuck peer).
    pub reason: Ineligible,
    /// `max_ejected` keeps it eligible anyway: render it up.
    pub kept: bool,
}

/// What `max_ejected` decides for the primaries at one moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MaxEjectedNow {
    /// The configured percentage.
    pub percent: u8,
    /// Primaries in service ([`crate::upstream::policy::in_service`]: not
    /// `down`, admin state up).
    pub in_service: u32,
    /// Of those, how many a health rule ejects (the kept ones included).
    pub ejected: u32,
    /// How many may be ejected.
    pub allowed: u32,
}

// === impl Upstream (status) ===

impl Upstream {
    /// The state of every peer, with the reasons each is not eligible.
    pub fn status(&self, now: Timestamp) -> Vec<PeerStatus> {
        let mut out = Vec::with_capacity(self.peers.len());
        for tier in self.tiers() {
            let slots = self.slots(tier);
            let gate = tier.view(self, &slots, now);
            for (i, slot) in slots.iter().enumerate() {
                let peer = &self.peers[tier.offset + i];
                let (reasons, waived) = gate.reasons(peer, i, slot);
                out.push(PeerStatus {
                    peer: peer.clone(),
                    passive: PassiveView::of(slot),
                    health: peer.health().view(),
                    last_probe: peer.last_probe(),
                    backup: !tier.primary,
                    reasons,
                    waived,
                    weight_now: policy::halve::nominal(peer, now),
                    probation: policy::probation(&self.config.rules, peer, slot, tier.single, now),
                    header_figure: self.peer_header_figure(tier.offset + i, now),
                    waiting: self.waiting_now(tier.offset + i, now),
                });
            }
        }
        out
    }

    /// Every peer a health rule ejects at `now` (probes down, passive
    /// exclusion, a pending recovery probe; not `down` or the admin
    /// states), with whether `max_ejected` keeps it eligible. Checker-only
    /// mode renders the ones not kept as `down` in nginx's files.
    pub fn ejected_now(&self, now: Timestamp) -> Vec<Ejection> {
        self.status(now)
            .into_iter()
            .filter_map(|s| {
                let kept = s.reasons.iter().all(|r| !r.is_ejection());
                let reason = s
                    .reasons
                    .iter()
                    .chain(&s.waived)
                    .find(|r| r.is_ejection())?
                    .clone();
                Some(Ejection {
                    peer: s.peer.id(),
                    reason,
                    kept,
                })
            })
            .collect()
    }

    /// Under `passive_recovery probe`: every peer that is passively
    /// excluded or waits for its recovery probe, with the time from which a
    /// passing probe readmits it (the end of its exclusion). The checker
    /// probes each at that time, not at its next interval (the `excluded`
    /// event carries the same time as `until`). Empty under other rules.
    pub fn probes_wanted(&self) -> Vec<ProbeWanted> {
        if self.config.rules.recovery != Recovery::Probe {
            return Vec::new();
        }
        let mut out = Vec::new();
        for tier in self.tiers().filter(|t| !t.single) {
            for (i, s) in self.slots(tier).iter().enumerate() {
                let peer = &self.peers[tier.offset + i];
                if policy::over_max_fails(peer, s) {
                    out.push(ProbeWanted {
                        peer: peer.id(),
                        at: Timestamp(s.checked.0.saturating_add(policy::window_ms(peer, s))),
                    });
                }
            }
        }
        out
    }

    /// `max_ejected`'s count for the primaries now (None without the rule;
    /// `percent` is 100 when only its count form is set).
    pub fn max_ejected_now(&self, now: Timestamp) -> Option<MaxEjectedNow> {
        let percent = self.config.rules.max_ejected.unwrap_or(100);
        let slots = self.slots(&self.primary);
        let k = self.primary.kept_in(self, &slots, now)?;
        Some(MaxEjectedNow {
            percent,
            in_service: k.in_service,
            ejected: k.ejected,
            allowed: k.allowed,
        })
    }

    /// `eject_stuck`'s threshold and the p99 behind it (None without the rule).
    pub fn stuck_now(&self, now: Timestamp) -> Option<StuckNow> {
        let l = self.latency.as_deref()?;
        Some(StuckNow {
            threshold: Duration::from_micros(l.stuck_threshold_us()?),
            p99: self.header_time_quantile(0.99, now),
        })
    }

    fn waiting_now(&self, global: usize, now: Timestamp) -> Option<WaitingNow> {
        let w = self
            .latency
            .as_deref()?
            .peers
            .get(global)?
            .waiting
            .as_ref()?;
        let oldest = w.oldest();
        Some(WaitingNow {
            attempts: w.len() as u32,
            oldest: if oldest == 0 {
                Duration::ZERO
            } else {
                Duration::from_micros(now.0.saturating_mul(1000).saturating_sub(oldest))
            },
        })
    }

    fn tiers(&self) -> impl Iterator<Item = &Tier> {
        std::iter::once(&self.primary).chain(self.backup.as_ref())
    }

    /// A consistent copy of a tier's slots (one lock).
    fn slots(&self, tier: &Tier) -> Vec<Slot> {
        let mut st = tier.lock();
        tier.materialize(&mut st);
        st.to_vec()
    }
}
