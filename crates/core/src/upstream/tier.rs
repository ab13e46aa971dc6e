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
use std::sync::{Arc, Mutex, MutexGuard};

use crate::clock::{duration_ms, Timestamp};
use crate::event::EventKind;
use crate::outcome::PeerOutcome;
use crate::peer::Peer;

use super::fast::Plan;
use super::policy;

use super::{Accounting, Upstream};

/// What freeing a peer did: the accounting, and whether the tier is `single`.
pub(crate) type Freed = (Accounting, bool);

/// nginx's passive fields of one peer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Slot {
    pub(crate) current: i64,
    pub(crate) effective: i64,
    pub(crate) fails: u32,
    pub(crate) accessed: Timestamp,
    pub(crate) checked: Timestamp,
}

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
}

impl PassiveView {
    pub(crate) fn of(s: &Slot) -> Self {
        Self {
            fails: s.fails,
            accessed: s.accessed,
            checked: s.checked,
            effective_weight: s.effective,
            current_weight: s.current,
        }
    }
}

pub(crate) struct Tier {
    pub(crate) offset: usize,
    pub(crate) single: bool,
    /// Non-down peers (nginx's `peers->tries`).
    pub(crate) tries: u32,
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
}

impl Tier {
    pub(crate) fn new(peers: &[Arc<Peer>], offset: usize, single: bool, round_robin: bool) -> Self {
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
            tries: peers.iter().filter(|p| !p.config().down).count() as u32,
            state: Mutex::new(TierState {
                slots,
                impaired: vec![false; peers.len()],
                impaired_count: 0,
                plan,
                fast,
                settling: 0,
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

    /// Whether this tier can use the fast path at all.
    pub(crate) fn plannable(&self) -> bool {
        self.plannable.is_some()
    }

    pub(crate) fn len(&self) -> usize {
        self.lock().len()
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
            peer.set_fails_hint(slot.fails);
            self.refresh(&mut st, i, peer);
        }
    }

    /// `ngx_http_upstream_free_round_robin_peer`: what was charged, and
    /// whether the tier is `single`.
    pub(crate) fn free(
        &self,
        up: &Upstream,
        global: usize,
        outcome: PeerOutcome,
        now: Timestamp,
        events: &mut Vec<(u32, EventKind)>,
    ) -> Freed {
        let peer = &up.peers[global];
        if self.single {
            // nginx never charges the single server of an upstream.
            peer.release();
            return (Accounting::default(), true);
        }
        if outcome == PeerOutcome::Success && peer.fails_hint() == 0 {
            // Nothing to forgive: a success changes no passive field.
            peer.release();
            return (Accounting::default(), false);
        }
        let mut accounting = Accounting::default();
        let mut slots = self.lock();
        let cfg = peer.config();
        let i = global - self.offset;
        if let Some(s) = slots.get_mut(i) {
            match outcome {
                PeerOutcome::Failed(cause) => {
                    accounting.charged = Some(cause);
                    s.fails = s.fails.saturating_add(1);
                    s.accessed = now;
                    s.checked = now;
                    if let Some(cut) = cfg.weight.get().checked_div(cfg.max_fails) {
                        s.effective -= i64::from(cut);
                        if policy::over_max_fails(peer, s) {
                            accounting.excluded = true;
                            events.push((
                                global as u32,
                                EventKind::Excluded {
                                    cause,
                                    fails: s.fails,
                                    max_fails: cfg.max_fails,
                                    until: now.after(cfg.fail_timeout),
                                },
                            ));
                        }
                    }
                    s.effective = s.effective.max(0);
                }
                PeerOutcome::Success | PeerOutcome::Next(_) => {
                    if s.accessed < s.checked {
                        if policy::over_max_fails(peer, s) {
                            events.push((global as u32, EventKind::Readmitted { fails: s.fails }));
                        }
                        s.fails = 0;
                    }
                }
            }
            peer.set_fails_hint(s.fails);
            self.refresh(&mut slots, i, peer);
        }
        peer.release();
        (accounting, false)
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

/// After a pick: `if (now - best->checked > best->fail_timeout) best->checked = now;`
/// A peer that was excluded gets its one trial request here.
pub(crate) fn mark_checked(
    peer: &Peer,
    s: &mut Slot,
    global: usize,
    now: Timestamp,
    events: &mut Vec<(u32, EventKind)>,
) {
    let cfg = peer.config();
    if now.millis_since(s.checked) > duration_ms(cfg.fail_timeout) {
        if policy::over_max_fails(peer, s) {
            events.push((global as u32, EventKind::TrialRequest));
        }
        s.checked = now;
    }
}
