//! `slow_start=T` (nginx Plus's server parameter): after a readmission the
//! peer's weight rises linearly from `max(1, weight/10)` to `weight` over T.
//!
//! The ramp's end is an atomic on the peer (0: no ramp), set by the one
//! readmission entry point ([`super::passive::readmit`]) under the tier's
//! lock and read by every balancer without it. A finished ramp is cleared
//! by the next scan that sees it ([`settle`]), which also tells the
//! round-robin fast path the peer is at rest again.

use crate::clock::{duration_ms, Timestamp};
use crate::peer::Peer;

use super::super::slot::Slot;

/// The weight smooth round robin adds for `peer` now: nginx's
/// `effective_weight` (lowered by failures, regained one step per pick),
/// capped by the slow-start ramp.
pub(crate) fn weight(peer: &Peer, s: &Slot, now: Timestamp) -> i64 {
    if peer.config().slow_start.is_none() {
        return s.effective;
    }
    s.effective.min(i64::from(nominal(peer, now)))
}

/// The configured weight with the slow-start ramp applied: what least_conn
/// and random compare.
pub(crate) fn nominal(peer: &Peer, now: Timestamp) -> u32 {
    let w = peer.config().weight.get();
    let Some(t) = peer.config().slow_start else {
        return w;
    };
    ramped(w, duration_ms(t), peer.ramp_until(), now)
}

/// `w` on a ramp of `t` ms ending at `until` (0: none), at `now`.
pub(crate) fn ramped(w: u32, t: u64, until: Timestamp, now: Timestamp) -> u32 {
    if until == Timestamp(0) || now >= until || t == 0 {
        return w;
    }
    let left = until.0 - now.0;
    let elapsed = t.saturating_sub(left);
    let low = (w / 10).max(1);
    let span = u64::from(w - low);
    // low + span × elapsed / t, in u128 so no product overflows.
    let step = (u128::from(span) * u128::from(elapsed) / u128::from(t)) as u32;
    low + step
}

/// Whether `peer` is still marked as ramping (a finished ramp counts until
/// [`settle`] clears it).
pub(crate) fn ramping(peer: &Peer) -> bool {
    peer.ramp_until() != Timestamp(0)
}

/// Start a ramp at `now`; returns its end, or None when the server has no
/// `slow_start`.
pub(crate) fn start(peer: &Peer, now: Timestamp) -> Option<Timestamp> {
    let t = peer.config().slow_start.filter(|t| !t.is_zero())?;
    let until = now.after(t).max(Timestamp(1));
    peer.set_ramp_until(until);
    Some(until)
}

/// Clear a ramp that has ended; true when it did (the caller refreshes the
/// fast path's view of the peer).
pub(crate) fn settle(peer: &Peer, now: Timestamp) -> bool {
    let until = peer.ramp_until();
    if until != Timestamp(0) && now >= until {
        peer.set_ramp_until(Timestamp(0));
        return true;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ramp_is_linear_from_a_tenth_to_the_weight() {
        // weight 20 over 10 s: 2 at the start, 11 halfway, 20 at the end.
        let until = Timestamp(11_000);
        assert_eq!(ramped(20, 10_000, until, Timestamp(1_000)), 2);
        assert_eq!(ramped(20, 10_000, until, Timestamp(6_000)), 11);
        assert_eq!(ramped(20, 10_000, until, Timestamp(10_999)), 19);
        assert_eq!(ramped(20, 10_000, until, Timestamp(11_000)), 20);
        // weight 1..9 starts at 1 (never 0: the peer keeps a share).
        assert_eq!(ramped(5, 10_000, until, Timestamp(1_000)), 1);
        assert_eq!(ramped(1, 10_000, until, Timestamp(1_000)), 1);
        assert_eq!(
            ramped(7, 10_000, Timestamp(0), Timestamp(1_000)),
            7,
            "no ramp"
        );
    }
}
