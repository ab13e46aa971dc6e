//! A tier of peers (the primaries, or the backups) and nginx's passive
//! accounting state for them, kept in one short critical section.
//!
//! Why a mutex and not per-field atomics: every round-robin pick adds each
//! eligible peer's `effective_weight` to its `current_weight` and takes the
//! total from the winner, and a failure moves `fails`, `accessed`,
//! `checked` and `effective_weight` together. Those are multi-field,
//! multi-peer updates; nginx itself takes the peers' write lock for them
//! when a `zone` is configured. The lock is held for the scan only, never
//! across I/O. Connection counts, admin and probe states stay atomics on
//! the peer so other components never take this lock.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::clock::Timestamp;
use crate::event::EventKind;
use crate::outcome::PeerOutcome;
use crate::peer::Peer;

use super::fast::Plan;
use super::policy::ejection::{self, Kept};
use super::policy::passive::Record;
use super::policy::{self, Gate};

use super::slot::{hint, Slot};
use super::{Accounting, Tried, Upstream};

/// What freeing a peer did: the accounting, and whether the tier is `single`.
pub(crate) type Freed = (Accounting, bool);

/// A read-only copy of a peer's passive state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PassiveView {
    /// Failures counted and not yet forgiven.
    pub fails: u32,
    /// Time of the last failure.
    pub accessed: Timestamp,
    /// Time of the last failure or trial pick.
    pub checked: Timestamp,
    /// Smooth round-robin effective weight.
    pub effective_weight: i64,
    /// Smooth round-robin current weight.
    pub current_weight: i64,
    /// `passive_penalty`: exclusions in a row (0: none yet, or no penalty).
    pub penalty_nth: u32,
    /// `passive_recovery probation`: successes in a row so far.
    pub probation_successes: u32,
}

impl PassiveView {
    pub(crate) fn of(s: &Slot) -> Self {
        Self {
            fails: s.fails,
            accessed: s.accessed,
            checked: s.checked,
            effective_weight: s.effective,
            current_weight: s.current,
            penalty_nth: u32::from(s.nth),
            probation_successes: u32::from(s.probation_ok),
        }
    }
}

pub(crate) struct Tier {
    pub(crate) offset: usize,
    pub(crate) single: bool,
    /// The primaries (what `max_ejected` limits), not the backups.
    pub(crate) primary: bool,
    /// Some server has `slow_start`: weights may ramp.
    ramps: bool,
    /// Peers marked halved by a fleet member (`policy::halve`), counted
    /// under the lock: while not 0 the weights are read as ramping ones.
    pub(crate) halved: AtomicUsize,
    /// Non-down peers (nginx's `peers->tries`).
    pub(crate) tries: u32,
    /// Peers in the tier.
    pub(crate) size: usize,
    /// Weights for planning (0 = `down`), when the fast path applies
    /// (`fast.rs`): round robin, several live peers, no `max_conns`.
    plannable: Option<Vec<i64>>,
    state: Mutex<TierState>,
}

/// The slots, plus what the fast path needs: which peers are not at full
/// weight and eligible, and the position on the cycle while it is followed
/// (then the slots' `current` values are stale).
pub(crate) struct TierState {
    slots: Vec<Slot>,
    impaired: Vec<bool>,
    impaired_count: usize,
    /// The cycle being followed, and the position on it.
    plan: Option<Plan>,
    pub(crate) fast: Option<usize>,
    /// Scans since the last planning attempt while healthy.
    settling: usize,
    /// The peers `max_ejected` kept eligible at the last scan (for events).
    kept: Tried,
}

impl Tier {
    pub(crate) fn new(
        peers: &[Arc<Peer>],
        offset: usize,
        single: bool,
        round_robin: bool,
        primary: bool,
    ) -> Self {
        let slots = peers
            .iter()
            .map(|p| Slot {
                effective: i64::from(p.config().weight.get()),
                ..Slot::default()
            })
            .collect();
        // The fast path needs a static eligible set: no max_conns anywhere.
        let weights: Vec<i64> = peers
            .iter()
            .map(|p| {
                if p.config().down {
                    0
                } else {
                    i64::from(p.config().weight.get())
                }
            })
            .collect();
        let plannable = (round_robin
            && !single
            && peers.iter().all(|p| p.config().max_conns == 0)
            && Plan::worth_it(&weights))
        .then_some(weights);
        let plan = plannable
            .as_ref()
            .and_then(|w| Plan::from_state(w, &vec![0; w.len()]));
        let fast = plan.as_ref().map(|_| 0);
        Self {
            offset,
            single,
            primary,
            ramps: peers
                .iter()
                .any(|p| p.config().slow_start.is_some_and(|t| !t.is_zero())),
            halved: AtomicUsize::new(0),
            tries: peers.iter().filter(|p| !p.config().down).count() as u32,
            size: peers.len(),
            state: Mutex::new(TierState {
                slots,
                impaired: vec![false; peers.len()],
                impaired_count: 0,
                plan,
                fast,
                settling: 0,
                kept: Tried::default(),
            }),
            plannable,
        }
    }

    #[cfg(test)]
    pub(crate) fn disable_fast_path(&mut self) {
        self.plannable = None;
        let st = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        st.plan = None;
        st.fast = None;
    }

    /// Whether weights may differ from the configured ones now: some
    /// server has `slow_start`, or a fleet member's halving is marked.
    #[inline]
    fn ramps_now(&self) -> bool {
        self.ramps || self.halved.load(Ordering::Relaxed) != 0
    }

    /// Whether this tier can use the fast path at all.
    pub(crate) fn plannable(&self) -> bool {
        self.plannable.is_some()
    }

    /// Peers in the tier (fixed when it is built: no lock).
    pub(crate) fn len(&self) -> usize {
        self.size
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, TierState> {
        // A panic while holding the lock cannot leave a slot half-written
        // (every update is a few integer stores), so poisoning is ignored.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Leave the fast path: write the exact current weights into the slots.
    pub(crate) fn materialize(&self, st: &mut TierState) {
        if let (Some(pos), Some(plan)) = (st.fast.take(), &st.plan) {
            let state = plan.state_at(pos);
            for (s, c) in st.slots.iter_mut().zip(state) {
                s.current = c;
            }
        }
    }

    /// The next pick on the cycle, if the tier follows one.
    pub(crate) fn fast_pick(&self, st: &mut TierState) -> Option<usize> {
        let (pos, plan) = (st.fast?, st.plan.as_ref()?);
        let (winner, next) = plan.next(pos);
        st.fast = Some(next);
        Some(winner)
    }

    /// After a fresh scan with every peer healthy: plan the cycle through
    /// the scan's state. A state still settling gets no plan; the next
    /// attempt waits one cycle length of scans, so planning costs O(n) per
    /// pick at most, like the scan itself.
    pub(crate) fn try_resume(&self, st: &mut TierState) {
        let Some(weights) = &self.plannable else {
            return;
        };
        if st.fast.is_some() || st.impaired_count != 0 {
            return;
        }
        let period: i64 = weights.iter().sum();
        if st.settling > 0 && (st.settling as i64) < period {
            st.settling += 1;
            return;
        }
        let cur: Vec<i64> = st.slots.iter().map(|s| s.current).collect();
        match Plan::from_state(weights, &cur) {
            Some(plan) => {
                st.plan = Some(plan);
                st.fast = Some(0);
                st.settling = 0;
            }
            None => st.settling = 1,
        }
    }

    /// Recompute whether peer `i` keeps the tier off the fast path.
    pub(crate) fn refresh(&self, st: &mut TierState, i: usize, peer: &Peer) {
        if self.plannable.is_none() {
            return;
        }
        let impaired = !peer.config().down && !policy::at_rest(peer, &st.slots[i]);
        if impaired != st.impaired[i] {
            st.impaired[i] = impaired;
            if impaired {
                st.impaired_count += 1;
            } else {
                st.impaired_count -= 1;
            }
        }
    }

    pub(crate) fn slot(&self, i: usize) -> Slot {
        let mut st = self.lock();
        self.materialize(&mut st);
        st.get(i).copied().unwrap_or_default()
    }

    pub(crate) fn restore(&self, i: usize, slot: Slot, peer: &Peer) {
        let mut st = self.lock();
        self.materialize(&mut st);
        if let Some(s) = st.get_mut(i) {
            *s = slot;
            peer.set_fails_hint(hint(&slot));
            self.refresh(&mut st, i, peer);
        }
    }

    /// The rules of this tier at `now` for a pick: with `max_ejected`, the
    /// peers it keeps eligible, and an event for each peer that starts or
    /// stops being kept.
    #[inline(always)]
    pub(crate) fn gate<'a>(
        &self,
        up: &'a Upstream,
        st: &mut TierState,
        now: Timestamp,
        events: &mut Vec<(u32, EventKind)>,
    ) -> Gate<'a> {
        let rules = &up.config.rules;
        if up.latency.is_some() {
            self.announce_stuck(up, now, events);
        }
        if self.halved.load(Ordering::Relaxed) != 0 {
            self.settle_halvings(st, up, now, events);
        }
        if !self.primary || !rules.limits_ejection() {
            return Gate::new(rules, self.single, now, None, self.ramps_now())
                .with_latency(up.latency.as_deref());
        }
        self.limited_gate(up, st, now, events)
    }

    /// `eject_stuck`: an event for each peer of the tier whose oldest
    /// waiting attempt has just passed the threshold.
    #[cold]
    fn announce_stuck(&self, up: &Upstream, now: Timestamp, events: &mut Vec<(u32, EventKind)>) {
        let Some(l) = up.latency.as_deref() else {
            return;
        };
        if self.single || l.stuck.is_none() {
            return;
        }
        for global in self.offset..self.offset + self.size {
            if let Some((oldest, threshold)) = l.stuck(global, now) {
                if l.announce(global, oldest) {
                    let waited = now.0.saturating_mul(1000).saturating_sub(oldest);
                    events.push((
                        global as u32,
                        EventKind::Stuck {
                            waited_ms: waited / 1000,
                            threshold_ms: threshold / 1000,
                        },
                    ));
                }
            }
        }
    }

    /// [`Tier::gate`] under `max_ejected`.
    fn limited_gate<'a>(
        &self,
        up: &'a Upstream,
        st: &mut TierState,
        now: Timestamp,
        events: &mut Vec<(u32, EventKind)>,
    ) -> Gate<'a> {
        let kept = self.kept(up, st, now);
        if let Some(k) = &kept {
            for i in 0..st.slots.len() {
                let (was, is) = (st.kept.contains(i), k.set.contains(i));
                if was != is {
                    events.push((
                        (self.offset + i) as u32,
                        EventKind::MaxEjected {
                            kept: is,
                            ejected: k.ejected,
                            allowed: k.allowed,
                        },
                    ));
                }
            }
            st.kept = k.set.clone();
        }
        Gate::new(
            &up.config.rules,
            self.single,
            now,
            kept.map(|k| Box::new(k.set)),
            self.ramps_now(),
        )
        .with_latency(up.latency.as_deref())
    }

    /// The gate for reading (status, explain, checker-only): no events.
    pub(crate) fn view<'a>(&self, up: &'a Upstream, slots: &[Slot], now: Timestamp) -> Gate<'a> {
        let kept = self.kept_in(up, slots, now).map(|k| Box::new(k.set));
        Gate::new(&up.config.rules, self.single, now, kept, self.ramps_now())
            .with_latency(up.latency.as_deref())
    }

    fn kept(&self, up: &Upstream, st: &TierState, now: Timestamp) -> Option<Kept> {
        self.kept_in(up, &st.slots, now)
    }

    /// `max_ejected`'s decision for this tier (primaries only).
    pub(crate) fn kept_in(&self, up: &Upstream, slots: &[Slot], now: Timestamp) -> Option<Kept> {
        if !self.primary || !up.config.rules.limits_ejection() {
            return None;
        }
        let peers = &up.peers[self.offset..self.offset + slots.len()];
        let latency = up.latency.as_deref();
        // Backups in service whose probes pass: the count form of
        // `max_ejected` counts them (checker-only mode's guard).
        let spare = match (&up.config.rules.keep_in_service, &up.backup) {
            (Some(_), Some(b)) => up.peers[b.offset..b.offset + b.len()]
                .iter()
                .filter(|p| policy::in_service(p) && p.health().allows_traffic())
                .count(),
            _ => 0,
        };
        ejection::kept(
            &up.config.rules,
            peers,
            slots,
            self.single,
            now,
            latency,
            spare,
        )
    }

    /// `ngx_http_upstream_free_round_robin_peer` without the release of the
    /// connection count: what was charged, and whether the tier is
    /// `single`. `started` is when the attempt was picked; `now` is 0 for a
    /// guard dropped without a time (a success), read from the clock when
    /// a rule needs it.
    pub(crate) fn account(
        &self,
        up: &Upstream,
        global: usize,
        outcome: PeerOutcome,
        started: Timestamp,
        now: Timestamp,
        events: &mut Vec<(u32, EventKind)>,
    ) -> Freed {
        let peer = &up.peers[global];
        if self.single {
            // nginx never charges the single server of an upstream.
            return (Accounting::default(), true);
        }
        if outcome != PeerOutcome::Success || peer.fails_hint() != 0 {
            let mut accounting = Accounting::default();
            let mut slots = self.lock();
            let i = global - self.offset;
            if let Some(s) = slots.get_mut(i) {
                let mut record = Record {
                    rules: &up.config.rules,
                    peer,
                    s,
                    global,
                    events,
                };
                let was_slow = record.s.slow;
                match outcome {
                    PeerOutcome::Failed(cause) => {
                        accounting.charged = Some(cause);
                        accounting.excluded = record.fail(cause, now, || up.jitter());
                    }
                    PeerOutcome::Success | PeerOutcome::Next(_) => {
                        let clock = || {
                            if now == Timestamp(0) {
                                up.clock.now()
                            } else {
                                now
                            }
                        };
                        record.succeed(started, clock);
                    }
                }
                if was_slow && !slots[i].slow {
                    up.forget_figure(global);
                }
                peer.set_fails_hint(hint(&slots[i]));
                self.refresh(&mut slots, i, peer);
            }
            return (accounting, false);
        }
        // Nothing to forgive: a success changes no passive field.
        (Accounting::default(), false)
    }

    /// A probe result for tier index `i`: the readmissions it causes
    /// (`passive_recovery probe`, and the slow-start ramp after probe up).
    pub(crate) fn probe(
        &self,
        up: &Upstream,
        i: usize,
        ok: bool,
        came_up: bool,
        at: Timestamp,
        events: &mut Vec<(u32, EventKind)>,
    ) {
        let global = self.offset + i;
        let peer = &up.peers[global];
        let mut st = self.lock();
        if let Some(s) = st.get_mut(i) {
            let mut record = Record {
                rules: &up.config.rules,
                peer,
                s,
                global,
                events,
            };
            let was_slow = record.s.slow;
            if ok {
                record.probe_passed(self.single, at);
            }
            if was_slow && !record.s.slow {
                up.forget_figure(global);
            }
            if came_up {
                record.readmit(at, policy::passive::Readmission::ProbeUp);
            }
            peer.set_fails_hint(hint(&st[i]));
        }
        self.refresh(&mut st, i, peer);
    }

    /// An operator set tier index `i` up again: the slow-start ramp.
    pub(crate) fn admin_up(
        &self,
        up: &Upstream,
        i: usize,
        now: Timestamp,
        events: &mut Vec<(u32, EventKind)>,
    ) {
        let global = self.offset + i;
        let peer = &up.peers[global];
        let mut st = self.lock();
        if let Some(s) = st.get_mut(i) {
            Record {
                rules: &up.config.rules,
                peer,
                s,
                global,
                events,
            }
            .readmit(now, policy::passive::Readmission::AdminUp);
        }
        self.refresh(&mut st, i, peer);
    }

    /// Clear every halving of this tier that has ended at `now` (an event each),
    /// so the tier may plan its cycle again. The caller holds the lock.
    #[cold]
    pub(crate) fn settle_halvings(
        &self,
        st: &mut TierState,
        up: &Upstream,
        now: Timestamp,
        events: &mut Vec<(u32, EventKind)>,
    ) {
        for i in 0..st.len() {
            let global = self.offset + i;
            let peer = &up.peers[global];
            let until = peer.halved_until();
            if until == Timestamp(0) || now < until {
                continue;
            }
            peer.set_halved_until(Timestamp(0));
            let by = peer.halved_by().map(|b| b.to_string()).unwrap_or_default();
            peer.set_halved_by(None);
            self.halved.fetch_sub(1, Ordering::Relaxed);
            self.refresh(st, i, peer);
            events.push((
                global as u32,
                EventKind::WeightRestored {
                    weight: peer.config().weight.get(),
                    by,
                },
            ));
        }
    }
}

// === impl TierState ===

impl TierState {
    /// Peers keeping the tier off the fast path.
    pub(crate) fn impaired_count(&self) -> usize {
        self.impaired_count
    }
}

impl Deref for TierState {
    type Target = Vec<Slot>;
    fn deref(&self) -> &Vec<Slot> {
        &self.slots
    }
}

impl DerefMut for TierState {
    fn deref_mut(&mut self) -> &mut Vec<Slot> {
        &mut self.slots
    }
}
