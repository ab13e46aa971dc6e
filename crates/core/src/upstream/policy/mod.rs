//! Every rule that decides whether a peer takes new requests, in one place.
//!
//! `Gate::admit` answers "may this peer take a new request now, and if
//! not, why, since when, until when". The balancers ask it (stopping at the
//! first reason), `status`/`explain` ask it (collecting every reason), and
//! the round-robin fast path asks `at_rest` whether a peer can be left to
//! the precomputed cycle. `Gate::weight` and `Gate::nominal` are the
//! weights a peer has now (slow start, `ramp.rs`). What a failure or a
//! success does to the record is decided in `passive.rs` (exclusion,
//! penalty growth, recovery), and `ejection.rs` holds `max_ejected`, over
//! the peers [`in_service`].
//! Nothing else in vigil tests `fails >= max_fails` or reads the admin and
//! probe states to decide routing. [`Rule`] and [`PeerState`] name the
//! rules for the admin API and whoever reads it; [`remote_ejection`] is
//! what a fleet member's passive ejection does here (`share_passive`).
//!
//! With none of the vigil-only rules configured every function here is
//! nginx 1.22's rule, and the extra state in `Slot` stays at zero.

pub(crate) mod ejection;
pub(crate) mod halve;
pub(crate) mod passive;
pub(crate) mod ramp;
mod rule;
mod share;
pub(crate) mod slow;

use std::ops::ControlFlow;
use std::time::Duration;

use crate::clock::{duration_ms, Timestamp};
use crate::config::{HealthRules, Recovery};
use crate::peer::{AdminState, Peer};

use super::latency::Latency;
use super::slot::Slot;
use super::Tried;

pub use rule::{PeerState, Rule};
pub use share::{remote_ejection, PeerHere, RemoteAnswer, RemoteEjection};

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
    /// Passive: `fails >= max_fails` inside the exclusion window of the
    /// last failure (`fail_timeout`, or the `passive_penalty` length).
    Excluded {
        /// Failures counted.
        fails: u32,
        /// The threshold.
        max_fails: u32,
        /// The last failure (or trial request).
        since: Timestamp,
        /// When the exclusion ends: then one request tests it (`passive_recovery
        /// window`), a probe does (`probe`), or probation starts.
        until: Timestamp,
        /// `passive_penalty`: this is the nth exclusion in a row (0: no penalty set).
        nth: u32,
    },
    /// `passive_recovery probe`: the exclusion is over, and the peer waits
    /// for an active probe to pass; no user request tests it.
    AwaitingProbe {
        /// Failures counted.
        fails: u32,
        /// When the exclusion ended (a probe passing from then on readmits it).
        since: Timestamp,
    },
    /// `passive_recovery probation=N`: half-open, one request at a time,
    /// and that one is in flight.
    Probation {
        /// Successes in a row so far.
        successes: u32,
        /// Successes in a row needed.
        needed: u32,
    },
    /// `eject_slow`: its median time-to-header over the window was above
    /// K × the median of the other peers'; out as a passive exclusion
    /// (`passive_penalty` length, or `fail_timeout`), back through
    /// `passive_recovery` (after the window this becomes `AwaitingProbe`
    /// or `Probation` as for a failure).
    Slow {
        /// Its figure when ejected.
        figure: Duration,
        /// The median of the other peers' figures then (zero when none
        /// had a figure).
        median: Duration,
        /// `max=`, when that bound alone made it slow.
        max: Option<Duration>,
        /// When it was ejected (or its trial request picked).
        since: Timestamp,
        /// When the exclusion ends.
        until: Timestamp,
        /// `passive_penalty`: the nth exclusion in a row (0: no penalty set).
        nth: u32,
    },
    /// `eject_stuck`: its oldest attempt still waiting for a connect or a
    /// header has waited longer than the threshold; no new request until
    /// that attempt ends.
    Stuck {
        /// When that attempt started.
        since: Timestamp,
        /// How long it has waited.
        waited: Duration,
        /// max(min, K × the upstream's recent p99 time-to-header).
        threshold: Duration,
    },
    /// `max_conns` reached.
    Full {
        /// In flight.
        conns: u32,
        /// The limit.
        max_conns: u32,
    },
}

/// The rules of one tier at one moment: what the balancers, status and
/// explain consult through [`Gate::admit`].
pub(crate) struct Gate<'a> {
    rules: &'a HealthRules,
    single: bool,
    now: Timestamp,
    /// Tier indices whose ejections `max_ejected` waives now (boxed: the
    /// gate is made on every pick, the set only under `max_ejected`).
    kept: Option<Box<Tried>>,
    /// Some server of the tier has `slow_start` (else weights are static).
    ramps: bool,
    /// `eject_slow` or `eject_stuck` is on: the balancers' shortcut must
    /// test them too (off, in nginx mode, it tests nginx's rules alone).
    gray: bool,
    /// `eject_stuck` (not for a single server): the waiting attempts.
    latency: Option<&'a Latency>,
}

// === impl Ineligible ===

impl Ineligible {
    /// Whether this rule ejects the peer for its health (what `max_ejected`
    /// limits): passive exclusion, a pending recovery probe, probes down,
    /// a slow or a stuck peer. `down`, admin states, `max_conns` and
    /// probation's one-at-a-time are not.
    pub fn is_ejection(&self) -> bool {
        matches!(
            self,
            Ineligible::ProbeDown { .. }
                | Ineligible::Excluded { .. }
                | Ineligible::AwaitingProbe { .. }
                | Ineligible::Slow { .. }
                | Ineligible::Stuck { .. }
        )
    }
}

// === impl Gate ===

impl<'a> Gate<'a> {
    /// The gate of a tier whose `max_ejected` waivers are `kept` (None for
    /// backups and upstreams without the rule); `ramps`: some server of the
    /// tier has `slow_start`.
    pub(crate) fn new(
        rules: &'a HealthRules,
        single: bool,
        now: Timestamp,
        kept: Option<Box<Tried>>,
        ramps: bool,
    ) -> Self {
        Self {
            rules,
            single,
            now,
            kept,
            ramps,
            gray: rules.eject_slow.is_some() || rules.eject_stuck.is_some(),
            latency: None,
        }
    }

    /// The same gate judging `eject_stuck` with `latency`'s waiting
    /// attempts (None: the rule is off; never for a single server).
    pub(crate) fn with_latency(mut self, latency: Option<&'a Latency>) -> Self {
        self.latency = latency.filter(|l| l.stuck.is_some() && !self.single);
        self
    }

    /// `eject_stuck`: the rule in force against `peer` now, if any.
    #[inline]
    fn stuck(&self, peer: &Peer) -> Option<Ineligible> {
        let (oldest, threshold) = self.latency?.stuck(peer.id().0 as usize, self.now)?;
        Some(stuck_reason(oldest, threshold, self.now))
    }

    /// The weight smooth round robin adds for `peer` now ([`ramp::weight`],
    /// under a fleet member's halving: [`halve::weight`]).
    #[inline]
    pub(crate) fn weight(&self, peer: &Peer, s: &Slot) -> i64 {
        if self.ramps {
            halve::weight(peer, s, self.now)
        } else {
            s.effective
        }
    }

    /// The configured weight with any slow-start ramp ([`ramp::nominal`]):
    /// what least_conn and random compare.
    #[inline]
    pub(crate) fn nominal(&self, peer: &Peer) -> u32 {
        if self.ramps {
            halve::nominal(peer, self.now)
        } else {
            peer.config().weight.get()
        }
    }

    /// Clear `peer`'s ramp if it has ended; true when it did.
    #[inline]
    pub(crate) fn settle(&self, peer: &Peer) -> bool {
        self.ramps && ramp::settle(peer, self.now)
    }

    /// Whether some server of the tier has `slow_start` (or a fleet
    /// member's halving is marked): weights are read per peer.
    pub(crate) fn ramps(&self) -> bool {
        self.ramps
    }

    /// The rules in force.
    pub(crate) fn rules(&self) -> &'a HealthRules {
        self.rules
    }

    /// The moment the gate judges.
    pub(crate) fn now(&self) -> Timestamp {
        self.now
    }

    /// Walk the rules that keep `peer` (tier index `i`) from a new request,
    /// in the order `vigil status` shows them, calling `reason` for each one
    /// in force until it says stop; `waived` is true for an ejection that
    /// `max_ejected` does not let keep the peer out. Returns whether the
    /// peer may take the request. The request's own `tried` set is the
    /// caller's business.
    pub(crate) fn admit(
        &self,
        peer: &Peer,
        i: usize,
        s: &Slot,
        mut reason: impl FnMut(Ineligible, bool) -> ControlFlow<()>,
    ) -> bool {
        let cfg = peer.config();
        let mut admitted = true;
        let mut each = |r: Ineligible| {
            let w = r.is_ejection() && self.kept.as_ref().is_some_and(|k| k.contains(i));
            if !w {
                admitted = false;
            }
            reason(r, w)
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
            if let Some(r) = passive_reason(self.rules, peer, s, self.single, self.now) {
                each(r)?;
            }
            if let Some(r) = self.stuck(peer) {
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

    /// Whether `peer` may take a new request (the balancers' test, once per
    /// peer per pick). First the common case, cheaply: every rule [`admit`]
    /// walks needs one of these conditions to be in force, so when none is,
    /// no rule is (debug builds check that against the walk); otherwise
    /// the walk decides.
    ///
    /// [`admit`]: Gate::admit
    #[inline(always)]
    ///
    /// Under `eject_stuck` every peer is walked (the tier scans anyway).
    pub(crate) fn eligible(&self, peer: &Peer, i: usize, s: &Slot) -> bool {
        let clear = in_service(peer)
            && peer.health().allows_traffic()
            && !failed_out(peer, s)
            && !peer.is_full()
            && (!self.gray || self.clear_of_gray_rules(peer, s));
        if clear {
            debug_assert!(self.walk(peer, i, s), "a rule in force the shortcut missed");
            return true;
        }
        self.walk(peer, i, s)
    }

    /// Neither slow-ejected nor stuck (kept out of the shortcut's line so
    /// that nginx mode pays one test per peer for both rules).
    #[inline(never)]
    fn clear_of_gray_rules(&self, peer: &Peer, s: &Slot) -> bool {
        !s.slow
            && self
                .latency
                .is_none_or(|l| l.stuck(peer.id().0 as usize, self.now).is_none())
    }

    fn walk(&self, peer: &Peer, i: usize, s: &Slot) -> bool {
        self.admit(peer, i, s, |_, waived| {
            if waived {
                ControlFlow::Continue(())
            } else {
                ControlFlow::Break(())
            }
        })
    }

    /// Every rule in force (empty: eligible), and the ejections
    /// `max_ejected` waives, for status and explain.
    pub(crate) fn reasons(
        &self,
        peer: &Peer,
        i: usize,
        s: &Slot,
    ) -> (Vec<Ineligible>, Vec<Ineligible>) {
        let (mut out, mut waived) = (Vec::new(), Vec::new());
        self.admit(peer, i, s, |r, w| {
            if w {
                waived.push(r);
            } else {
                out.push(r);
            }
            ControlFlow::Continue(())
        });
        (out, waived)
    }
}

/// In service: neither `down` in the config nor set down or draining
/// through the admin API, whatever its probes and passive record say. The
/// peers `max_ejected` takes its percentage of (and `vigil check
/// --min-healthy` its count), the backups in service that the count form
/// counts (when their probes pass too), and what checker-only mode leaves
/// to the health rules rather than render down for an operator.
#[inline]
pub fn in_service(peer: &Peer) -> bool {
    !peer.config().down && peer.admin() == AdminState::Up
}

/// nginx's passive threshold: `max_fails != 0 && fails >= max_fails`, or
/// an `eject_slow` ejection (which is a passive exclusion of its own
/// cause). Past the window such a peer is not excluded but owes a trial
/// request (or, with `passive_recovery`, a probe or probation).
#[inline]
pub(crate) fn over_max_fails(peer: &Peer, s: &Slot) -> bool {
    s.slow || failed_out(peer, s)
}

/// nginx's threshold alone: `max_fails != 0 && fails >= max_fails`.
#[inline]
pub(crate) fn failed_out(peer: &Peer, s: &Slot) -> bool {
    let max = peer.config().max_fails;
    max != 0 && s.fails >= max
}

/// The `Stuck` rule of an attempt waiting since `oldest_us` against
/// `threshold_us`, at `now`.
pub(crate) fn stuck_reason(oldest_us: u64, threshold_us: u64, now: Timestamp) -> Ineligible {
    Ineligible::Stuck {
        since: Timestamp(oldest_us / 1000),
        waited: Duration::from_micros(now.0.saturating_mul(1000).saturating_sub(oldest_us)),
        threshold: Duration::from_micros(threshold_us),
    }
}

/// The length of the window after `checked`, in ms: nginx's
/// `fail_timeout`, or the exclusion `passive_penalty` gave an over-the-
/// threshold peer.
#[inline]
pub(crate) fn window_ms(peer: &Peer, s: &Slot) -> u64 {
    if s.pause_ms != 0 && over_max_fails(peer, s) {
        u64::from(s.pause_ms)
    } else {
        duration_ms(peer.config().fail_timeout)
    }
}

/// Whether the exclusion window of an over-the-threshold peer has passed.
#[inline]
pub(crate) fn window_over(peer: &Peer, s: &Slot, now: Timestamp) -> bool {
    now.millis_since(s.checked) > window_ms(peer, s)
}

/// The passive rule in force at `now`, if any (never for the single server
/// of an upstream: nginx does not exclude it).
#[inline]
pub(crate) fn passive_reason(
    rules: &HealthRules,
    peer: &Peer,
    s: &Slot,
    single: bool,
    now: Timestamp,
) -> Option<Ineligible> {
    if single || !over_max_fails(peer, s) {
        return None;
    }
    let window = window_ms(peer, s);
    let until = Timestamp(s.checked.0.saturating_add(window));
    if now.millis_since(s.checked) <= window {
        if s.slow {
            return Some(Ineligible::Slow {
                figure: Duration::from_micros(u64::from(s.slow_figure_us)),
                median: Duration::from_micros(u64::from(s.slow_median_us)),
                max: rules
                    .eject_slow
                    .and_then(|r| r.max)
                    .filter(|_| s.slow_by_max),
                since: s.checked,
                until,
                nth: u32::from(s.nth),
            });
        }
        return Some(Ineligible::Excluded {
            fails: s.fails,
            max_fails: peer.config().max_fails,
            since: s.checked,
            until,
            nth: u32::from(s.nth),
        });
    }
    match rules.recovery {
        Recovery::Window => None,
        Recovery::Probe => Some(Ineligible::AwaitingProbe {
            fails: s.fails,
            since: until,
        }),
        Recovery::Probation(n) => (peer.conns() > 0).then(|| Ineligible::Probation {
            successes: u32::from(s.probation_ok),
            needed: n.get(),
        }),
    }
}

/// `passive_recovery probation=N`: (successes in a row, N) while the peer
/// is half-open, whether or not its one request is in flight.
pub(crate) fn probation(
    rules: &HealthRules,
    peer: &Peer,
    s: &Slot,
    single: bool,
    now: Timestamp,
) -> Option<(u32, u32)> {
    let Recovery::Probation(n) = rules.recovery else {
        return None;
    };
    (!single && over_max_fails(peer, s) && window_over(peer, s, now))
        .then(|| (u32::from(s.probation_ok), n.get()))
}

/// Whether a live (not `down`) peer is at rest: eligible at its full weight
/// with no passive state pending (a slow ejection is one), no
/// slow-start ramp and no fleet halving, so the round-robin fast path may follow its
/// precomputed cycle. `max_conns` is not looked at: tiers with `max_conns`
/// never plan, nor do tiers under `eject_stuck` (a peer becomes stuck by
/// time passing, with no event to leave the cycle on).
pub(crate) fn at_rest(peer: &Peer, s: &Slot) -> bool {
    peer.is_routable()
        && !over_max_fails(peer, s)
        && !ramp::ramping(peer)
        && !halve::impairs(peer)
        && s.effective == i64::from(peer.config().weight.get())
}
