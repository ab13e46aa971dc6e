//! Fleet `share_passive` for a peer without an active check: another
//! member ejected it on its own traffic, so this instance halves its weight
//! for that member's exclusion time rather than eject it blindly (one
//! instance's bad path must not empty the fleet) or ignore it.
//!
//! The halving is an atomic on the peer, like the `slow_start` ramp
//! ([`super::ramp`]): its end (0: none), set and cleared under the tier's
//! lock ([`Upstream::halve_weight`], [`settle`]) and read by every balancer
//! without it. The weight while it lasts is nginx-like integer rounding,
//! `max(1, weight/2)`: a peer of weight 1 keeps weight 1 (and the tier its
//! fast path). Smooth round robin caps its `effective_weight` with it,
//! least_conn and random compare it ([`nominal`]); hash, ip_hash and
//! consistent hash pick by the key and ignore it (their points are made
//! from the configured weights at build). A reload carries it over to the
//! peer that stays (as a slow-start ramp), to its end.
//!
//! A marked peer keeps the round-robin fast path off exactly as a ramping
//! one does ([`impairs`], read by [`super::at_rest`]); the first scan at or
//! after the end clears it (an event), and the tier plans its cycle again.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::clock::Timestamp;
use crate::event::EventKind;
use crate::peer::{Peer, PeerId};

use super::super::slot::Slot;
use super::super::tier::{Tier, TierState};
use super::super::Upstream;
use super::ramp;

type Events = Vec<(u32, EventKind)>;

/// The weight of a halved peer of weight `w`: `max(1, w/2)`.
pub(crate) fn halved(w: u32) -> u32 {
    (w / 2).max(1)
}

/// Whether `peer` is marked halved (an ended halving counts until
/// [`settle`] clears it).
#[inline]
pub(crate) fn marked(peer: &Peer) -> bool {
    peer.halved_until() != Timestamp(0)
}

/// Whether the halving is in force at `now`.
#[inline]
pub(crate) fn in_force(peer: &Peer, now: Timestamp) -> bool {
    let until = peer.halved_until();
    until != Timestamp(0) && now < until
}

/// Whether the mark keeps the tier off the round-robin fast path: it
/// changes the weight (weight 1 stays 1, so such a peer stays at rest).
#[inline]
pub(crate) fn impairs(peer: &Peer) -> bool {
    marked(peer) && halved(peer.config().weight.get()) < peer.config().weight.get()
}

/// `w` (a weight of `peer` now, ramped or not) under the halving at `now`.
#[inline]
fn cap(peer: &Peer, w: u32, now: Timestamp) -> u32 {
    if in_force(peer, now) {
        w.min(halved(peer.config().weight.get()))
    } else {
        w
    }
}

/// The weight smooth round robin adds for `peer` now: [`ramp::weight`]
/// capped by the halving.
pub(crate) fn weight(peer: &Peer, s: &Slot, now: Timestamp) -> i64 {
    let w = ramp::weight(peer, s, now);
    if in_force(peer, now) {
        w.min(i64::from(halved(peer.config().weight.get())))
    } else {
        w
    }
}

/// The weight least_conn and random compare: [`ramp::nominal`] capped by
/// the halving.
pub(crate) fn nominal(peer: &Peer, now: Timestamp) -> u32 {
    cap(peer, ramp::nominal(peer, now), now)
}

/// Clear every halving of `tier` that has ended at `now` (an event each),
/// so the tier may plan its cycle again. The caller holds the lock.
#[cold]
pub(crate) fn settle(
    tier: &Tier,
    st: &mut TierState,
    up: &Upstream,
    now: Timestamp,
    events: &mut Events,
) {
    for i in 0..st.len() {
        let global = tier.offset + i;
        let peer = &up.peers[global];
        let until = peer.halved_until();
        if until == Timestamp(0) || now < until {
            continue;
        }
        peer.set_halved_until(Timestamp(0));
        let by = peer.halved_by().map(|b| b.to_string()).unwrap_or_default();
        peer.set_halved_by(None);
        tier.halved.fetch_sub(1, Ordering::Relaxed);
        tier.refresh(st, i, peer);
        events.push((
            global as u32,
            EventKind::WeightRestored {
                weight: peer.config().weight.get(),
                by,
            },
        ));
    }
}

// === impl Upstream (halve) ===

impl Upstream {
    /// Fleet `share_passive`: fleet member `by` ejected peer `id` on its own
    /// traffic, and this instance has no active check to probe it: halve
    /// its weight (`max(1, weight/2)`) until `until`. Publishes a
    /// [`EventKind::WeightHalved`] event, and [`EventKind::WeightRestored`]
    /// when it ends (at the first pick or [`Upstream::settle_halvings`] at
    /// or after `until`). Returns false for an unknown peer or an end not
    /// after `now`.
    pub fn halve_weight(&self, id: PeerId, until: Timestamp, by: &str, now: Timestamp) -> bool {
        if until <= now || self.peers.get(id.0 as usize).is_none() {
            return false;
        }
        let Some(tier) = self.tier_of(id) else {
            return false;
        };
        let i = id.0 as usize - tier.offset;
        let peer = &self.peers[id.0 as usize];
        let mut events = Vec::new();
        {
            let mut st = tier.lock();
            // A later end extends a halving in force; an earlier one leaves it.
            let was = peer.halved_until();
            if was == Timestamp(0) {
                tier.halved.fetch_add(1, Ordering::Relaxed);
            }
            let until = until.max(was);
            peer.set_halved_until(until);
            peer.set_halved_by(Some(Arc::from(by)));
            if impairs(peer) {
                // Off the cycle now (a weight-1 peer keeps it).
                tier.materialize(&mut st);
            }
            tier.refresh(&mut st, i, peer);
            let from = peer.config().weight.get();
            events.push((
                id.0,
                EventKind::WeightHalved {
                    from,
                    to: halved(from),
                    until,
                    for_ms: until.millis_since(now),
                    by: by.to_string(),
                },
            ));
        }
        self.publish(events, now);
        true
    }

    /// A reload: peer `id` of this new generation keeps the halving its
    /// predecessor had (`until`, by `by`), without a new event (the one
    /// that announced it still holds; its end is announced as usual).
    pub(crate) fn carry_halving(&self, id: PeerId, until: Timestamp, by: Option<Arc<str>>) {
        let Some(tier) = self.tier_of(id) else {
            return;
        };
        let Some(peer) = self.peers.get(id.0 as usize) else {
            return;
        };
        let i = id.0 as usize - tier.offset;
        let mut st = tier.lock();
        if peer.halved_until() == Timestamp(0) {
            tier.halved.fetch_add(1, Ordering::Relaxed);
        }
        peer.set_halved_until(until);
        peer.set_halved_by(by);
        if impairs(peer) {
            tier.materialize(&mut st);
        }
        tier.refresh(&mut st, i, peer);
    }

    /// End the halvings that are over at `now` (each publishes its
    /// [`EventKind::WeightRestored`]); a pick does it too, this is for an
    /// upstream without traffic.
    pub fn settle_halvings(&self, now: Timestamp) {
        let mut events = Vec::new();
        for tier in std::iter::once(&self.primary).chain(self.backup.as_ref()) {
            if tier.halved.load(Ordering::Relaxed) == 0 {
                continue;
            }
            let mut st = tier.lock();
            settle(tier, &mut st, self, now, &mut events);
        }
        self.publish(events, now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halving_rounds_down_and_never_reaches_zero() {
        assert_eq!(halved(10), 5);
        assert_eq!(halved(5), 2);
        assert_eq!(halved(3), 1);
        assert_eq!(halved(2), 1);
        assert_eq!(halved(1), 1);
    }
}
