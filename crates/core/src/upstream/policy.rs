//! Every rule that decides whether a peer takes new requests, in one place.
//!
//! [`admit`] answers "may this peer take a new request now, and if not, why,
//! since when, until when". The balancers ask it (stopping at the first
//! reason), `status`/`explain` ask it (collecting every reason), and the
//! round-robin fast path asks [`at_rest`] whether a peer can be left to the
//! precomputed cycle. [`weight`] is the weight a peer has now. Nothing else
//! in vigil tests `fails >= max_fails` or reads the admin and probe states
//! to decide routing.

use std::ops::ControlFlow;

use crate::clock::{duration_ms, Timestamp};
use crate::peer::{AdminState, Peer};

use super::tier::Slot;

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

/// nginx's passive threshold: `max_fails != 0 && fails >= max_fails`. Past
/// the window such a peer is not excluded but owes a trial request.
pub(crate) fn over_max_fails(peer: &Peer, s: &Slot) -> bool {
    let max = peer.config().max_fails;
    max != 0 && s.fails >= max
}

/// The passive exclusion in force at `now`, if any (never for the single
/// server of an upstream: nginx does not exclude it).
pub(crate) fn passive_exclusion(
    peer: &Peer,
    s: &Slot,
    single: bool,
    now: Timestamp,
) -> Option<Ineligible> {
    let cfg = peer.config();
    (!single
        && over_max_fails(peer, s)
        && now.millis_since(s.checked) <= duration_ms(cfg.fail_timeout))
    .then(|| Ineligible::Excluded {
        fails: s.fails,
        max_fails: cfg.max_fails,
        since: s.checked,
        until: s.checked.after(cfg.fail_timeout),
    })
}

/// Walk the rules that keep `peer` from a new request at `now`, in the order
/// `vigil status` shows them, calling `reason` for each one in force until it
/// says stop. Returns whether the peer may take the request (no rule in force).
///
/// `single` is nginx's `peers->single`: that peer is never passively excluded.
/// The request's own `tried` set is the caller's business.
pub(crate) fn admit(
    peer: &Peer,
    s: &Slot,
    single: bool,
    now: Timestamp,
    mut reason: impl FnMut(Ineligible) -> ControlFlow<()>,
) -> bool {
    let cfg = peer.config();
    let mut admitted = true;
    let mut each = |r: Ineligible| {
        admitted = false;
        reason(r)
    };
    let mut walk = || -> ControlFlow<()> {
        if cfg.down {
            each(Ineligible::ConfigDown)?;
        }
        let admin = peer.admin();
        if admin != AdminState::Up {
            each(Ineligible::Admin {
                state: admin,
                since: peer.admin_since(),
            })?;
        }
        if !peer.health().allows_traffic() {
            let health = peer.health().view();
            let rise = peer.health().policy().map_or(0, |p| p.rise);
            each(Ineligible::ProbeDown {
                since: health.since,
                fail_streak: health.fail_streak,
                rise_needed: rise.saturating_sub(health.ok_streak),
            })?;
        }
        if let Some(r) = passive_exclusion(peer, s, single, now) {
            each(r)?;
        }
        if peer.is_full() {
            each(Ineligible::Full {
                conns: peer.conns(),
                max_conns: cfg.max_conns,
            })?;
        }
        ControlFlow::Continue(())
    };
    let _ = walk();
    admitted
}

/// Whether `peer` may take a new request at `now` (the balancers' test).
pub(crate) fn eligible(peer: &Peer, s: &Slot, single: bool, now: Timestamp) -> bool {
    admit(peer, s, single, now, |_| ControlFlow::Break(()))
}

/// Every rule in force (empty: eligible), for status and explain.
pub(crate) fn reasons(peer: &Peer, s: &Slot, single: bool, now: Timestamp) -> Vec<Ineligible> {
    let mut out = Vec::new();
    admit(peer, s, single, now, |r| {
        out.push(r);
        ControlFlow::Continue(())
    });
    out
}

/// The weight the balancer gives `peer` now: nginx's `effective_weight`,
/// lowered by failures and regained one step per pick.
pub(crate) fn weight(_peer: &Peer, s: &Slot) -> i64 {
    s.effective
}

/// Whether a live (not `down`) peer is at rest: eligible at its full weight
/// with no passive state pending, so the round-robin fast path may follow its
/// precomputed cycle. `max_conns` is not looked at: tiers with `max_conns`
/// never plan.
pub(crate) fn at_rest(peer: &Peer, s: &Slot) -> bool {
    peer.is_routable()
        && !over_max_fails(peer, s)
        && weight(peer, s) == i64::from(peer.config().weight.get())
}
