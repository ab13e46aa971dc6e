//! Fleet `share_passive` for a peer without an active check: another
//! member ejected it on its own traffic, so this instance halves its weight
//! for that member's exclusion time rather than eject it blindly (one
//! instance's bad path must not empty the fleet) or ignore it.
//!
//! The halving is an atomic on the peer, like the `slow_start` ramp
//! ([`super::ramp`]): its end (0: none), set and cleared under the tier's
//! lock (`Upstream::halve_weight` in upstream/halving.rs, and the tier's
//! `settle_halvings`) and read by every balancer without it. The weight while it lasts is nginx-like integer rounding,
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
//! This file holds the rules on one peer; the state changes are the
//! tier's and the upstream's.

use crate::clock::Timestamp;
use crate::peer::Peer;

use super::super::slot::Slot;
use super::ramp;

/// The weight of a halved peer of weight `w`: `max(1, w/2)`.
pub(crate) fn halved(w: u32) -> u32 {
    (w / 2).max(1)
}

/// Whether `peer` is marked halved (an ended halving counts until the
/// tier settles it).
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
