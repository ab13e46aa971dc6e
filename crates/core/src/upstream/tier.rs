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

use std::sync::{Arc, Mutex, MutexGuard};

use crate::clock::{duration_ms, Timestamp};
use crate::event::EventKind;
use crate::outcome::PeerOutcome;
use crate::peer::Peer;

use super::Upstream;

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

pub(crate) struct Tier {
    pub(crate) offset: usize,
    pub(crate) single: bool,
    /// Non-down peers (nginx's `peers->tries`).
    pub(crate) tries: u32,
    slots: Mutex<Vec<Slot>>,
}

impl Tier {
    pub(crate) fn new(peers: &[Arc<Peer>], offset: usize, single: bool) -> Self {
        let slots = peers
            .iter()
            .map(|p| Slot {
                effective: i64::from(p.config().weight.get()),
                ..Slot::default()
            })
            .collect();
        Self {
            offset,
            single,
            tries: peers.iter().filter(|p| !p.config().down).count() as u32,
            slots: Mutex::new(slots),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Vec<Slot>> {
        // A panic while holding the lock cannot leave a slot half-written
        // (every update is a few integer stores), so poisoning is ignored.
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn slot(&self, i: usize) -> Slot {
        self.lock().get(i).copied().unwrap_or_default()
    }

    pub(crate) fn restore(&self, i: usize, slot: Slot) {
        if let Some(s) = self.lock().get_mut(i) {
            *s = slot;
        }
    }

    pub(crate) fn view(&self, i: usize) -> PassiveView {
        let s = self.slot(i);
        PassiveView {
            fails: s.fails,
            accessed: s.accessed,
            checked: s.checked,
            effective_weight: s.effective,
            current_weight: s.current,
        }
    }

    /// `ngx_http_upstream_free_round_robin_peer`. Returns `single`.
    pub(crate) fn free(
        &self,
        up: &Upstream,
        global: usize,
        outcome: PeerOutcome,
        now: Timestamp,
        events: &mut Vec<(u32, EventKind)>,
    ) -> bool {
        let peer = &up.peers[global];
        let mut slots = self.lock();
        if self.single {
            peer.release();
            return true;
        }
        let cfg = peer.config();
        if let Some(s) = slots.get_mut(global - self.offset) {
            match outcome {
                PeerOutcome::Failed(cause) => {
                    s.fails = s.fails.saturating_add(1);
                    s.accessed = now;
                    s.checked = now;
                    if let Some(cut) = cfg.weight.get().checked_div(cfg.max_fails) {
                        s.effective -= i64::from(cut);
                        if s.fails >= cfg.max_fails {
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
                        if cfg.max_fails != 0 && s.fails >= cfg.max_fails {
                            events.push((global as u32, EventKind::Readmitted { fails: s.fails }));
                        }
                        s.fails = 0;
                    }
                }
            }
        }
        peer.release();
        false
    }
}

/// nginx's eligibility test for a non-single peer, minus `tried`.
pub(crate) fn eligible(peer: &Peer, s: &Slot, now: Timestamp) -> bool {
    let cfg = peer.config();
    let excluded = cfg.max_fails != 0
        && s.fails >= cfg.max_fails
        && now.millis_since(s.checked) <= duration_ms(cfg.fail_timeout);
    !cfg.down && peer.is_routable() && !excluded && !peer.is_full()
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
        if cfg.max_fails != 0 && s.fails >= cfg.max_fails {
            events.push((global as u32, EventKind::TrialRequest));
        }
        s.checked = now;
    }
}
