//! Fleet `share_passive` on an upstream: halve a peer's weight for
//! another member's exclusion time, carry it over a reload, end it (the
//! rules on one peer are `policy::halve`).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::clock::Timestamp;
use crate::event::EventKind;
use crate::peer::PeerId;

use super::policy::halve::{halved, impairs};
use super::Upstream;

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
            tier.settle_halvings(&mut st, self, now, &mut events);
        }
        self.publish(events, now);
    }
}
