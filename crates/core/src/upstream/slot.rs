//! The record one peer carries in its tier: nginx's passive fields and the
//! state of vigil's passive rules. A leaf: the tier holds one per peer
//! under its lock, and each rule in `policy/` reads and writes it.

use crate::clock::Timestamp;

/// nginx's passive fields of one peer, and the state of vigil's passive
/// rules (all zero without them, so nginx's behaviour).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Slot {
    pub(crate) current: i64,
    pub(crate) effective: i64,
    pub(crate) fails: u32,
    pub(crate) accessed: Timestamp,
    pub(crate) checked: Timestamp,
    /// `passive_penalty`: the current exclusion's length in ms (0:
    /// `fail_timeout`, nginx).
    pub(crate) pause_ms: u32,
    /// `passive_penalty`: exclusions in a row (k).
    pub(crate) nth: u8,
    /// nginx's trial request is in flight (the pick after a window).
    pub(crate) trial: bool,
    /// `passive_recovery probation`: successes in a row so far.
    pub(crate) probation_ok: u16,
    /// When the peer was last readmitted after an exclusion (the clean
    /// period of `passive_penalty` counts from here).
    pub(crate) clean_since: Timestamp,
    /// `eject_slow`: the exclusion in force (or the recovery it owes) is a
    /// slow ejection.
    pub(crate) slow: bool,
    /// `eject_slow`: its figure and the others' median when ejected, µs.
    pub(crate) slow_figure_us: u32,
    pub(crate) slow_median_us: u32,
    /// `eject_slow`: `max=` alone made it slow (not the others' median).
    pub(crate) slow_by_max: bool,
}

/// The peer's `fails_hint`: nonzero while a success may change its record
/// (failures to forgive, or a slow ejection to end).
pub(crate) fn hint(s: &Slot) -> u32 {
    s.fails.max(u32::from(s.slow))
}
