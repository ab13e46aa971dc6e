//! Active-check state of one peer: up or down, with consecutive rise/fall
//! streaks and an initial-state policy.
//!
//! State and both streaks are packed in one `AtomicU64` and updated with a
//! compare-exchange loop, so a probe result moves them together even if two
//! writers race (the checker runs one probe loop per target, so in practice
//! there is one writer).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::clock::Timestamp;
use crate::config::InitialState;

/// Rise/fall settings of one check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HealthPolicy {
    /// Consecutive passes that bring a down peer up.
    pub rise: u32,
    /// Consecutive failures that take an up peer down.
    pub fall: u32,
    /// The state before the first result.
    pub initial: InitialState,
}

/// Active-check state of one peer.
#[derive(Debug)]
pub struct ActiveHealth {
    policy: Option<HealthPolicy>,
    packed: AtomicU64,
    since: AtomicU64,
}

/// A snapshot of [`ActiveHealth`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HealthView {
    /// `None` when no check is configured.
    pub state: Option<HealthState>,
    /// Whether any probe result has arrived.
    pub decided: bool,
    /// Current run of passes.
    pub ok_streak: u32,
    /// Current run of failures.
    pub fail_streak: u32,
    /// When the state last changed (0 = never).
    pub since: Timestamp,
}

/// Up or down, as the probes say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HealthState {
    /// Routable.
    Up,
    /// Not routable.
    Down,
}

/// In which phase a probe failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbePhase {
    /// TCP connect.
    Connect,
    /// TLS handshake.
    Tls,
    /// Sending the request.
    Send,
    /// Waiting for the first response byte.
    FirstByte,
    /// The status line or headers (unparseable or status not accepted).
    Status,
    /// Reading or matching the body.
    Body,
}

/// One probe result, as the checker reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeReport {
    /// Whether the probe passed.
    pub ok: bool,
    /// The failing phase, for a failure.
    pub phase: Option<ProbePhase>,
    /// Time the probe took.
    pub latency: Duration,
    /// What it saw (`HTTP 200`, `connection refused`, `timed out after 1s`, ...).
    pub detail: String,
    /// When it finished.
    pub at: Timestamp,
}

/// A state change caused by a probe result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transition {
    /// The state before.
    pub from: HealthState,
    /// The state after.
    pub to: HealthState,
    /// The streak that caused it.
    pub streak: u32,
}

const STREAK_MAX: u64 = (1 << 30) - 1;

#[derive(Clone, Copy)]
struct Packed {
    down: bool,
    decided: bool,
    ok: u32,
    fail: u32,
}

// === impl Packed ===

impl Packed {
    fn decode(v: u64) -> Self {
        Packed {
            down: v & 1 != 0,
            decided: v & 2 != 0,
            ok: ((v >> 2) & STREAK_MAX) as u32,
            fail: ((v >> 32) & STREAK_MAX) as u32,
        }
    }

    fn encode(self) -> u64 {
        u64::from(self.down)
            | (u64::from(self.decided) << 1)
            | ((u64::from(self.ok) & STREAK_MAX) << 2)
            | ((u64::from(self.fail) & STREAK_MAX) << 32)
    }

    fn state(self) -> HealthState {
        if self.down {
            HealthState::Down
        } else {
            HealthState::Up
        }
    }
}

// === impl ActiveHealth ===

impl ActiveHealth {
    /// No active check: always routable.
    pub fn disabled() -> Self {
        Self {
            policy: None,
            packed: AtomicU64::new(0),
            since: AtomicU64::new(0),
        }
    }

    /// A checked peer in its initial state.
    pub fn new(policy: HealthPolicy) -> Self {
        let down = policy.initial == InitialState::Down;
        let p = Packed {
            down,
            decided: false,
            ok: 0,
            fail: 0,
        };
        Self {
            policy: Some(policy),
            packed: AtomicU64::new(p.encode()),
            since: AtomicU64::new(0),
        }
    }

    /// Carry the state of `old` over (a reload that kept the peer and its check).
    pub(crate) fn inherit(&self, old: &ActiveHealth) {
        if self.policy.is_some() && old.policy.is_some() {
            self.packed
                .store(old.packed.load(Ordering::Acquire), Ordering::Release);
            self.since
                .store(old.since.load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }

    /// The check policy, if any.
    pub fn policy(&self) -> Option<HealthPolicy> {
        self.policy
    }

    /// Whether probes let traffic through.
    pub fn allows_traffic(&self) -> bool {
        self.policy.is_none() || self.packed.load(Ordering::Acquire) & 1 == 0
    }

    /// A snapshot.
    pub fn view(&self) -> HealthView {
        let p = Packed::decode(self.packed.load(Ordering::Acquire));
        HealthView {
            state: self.policy.map(|_| p.state()),
            decided: p.decided,
            ok_streak: p.ok,
            fail_streak: p.fail,
            since: Timestamp(self.since.load(Ordering::Relaxed)),
        }
    }

    /// Apply one probe result. Returns the transition if the state changed.
    pub fn record(&self, ok: bool, now: Timestamp) -> Option<Transition> {
        let policy = self.policy?;
        let mut transition = None;
        let _ = self
            .packed
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                let mut p = Packed::decode(v);
                let first = !p.decided;
                let from = p.state();
                p.decided = true;
                transition = None;
                if ok {
                    p.ok = p.ok.saturating_add(1).min(STREAK_MAX as u32);
                    p.fail = 0;
                    let decide_now = first && policy.initial == InitialState::FirstResult;
                    if p.down && (p.ok >= policy.rise || decide_now) {
                        p.down = false;
                    }
                } else {
                    p.fail = p.fail.saturating_add(1).min(STREAK_MAX as u32);
                    p.ok = 0;
                    let decide_now = first && policy.initial == InitialState::FirstResult;
                    if !p.down && (p.fail >= policy.fall || decide_now) {
                        p.down = true;
                    }
                }
                if p.state() != from {
                    let streak = if ok { p.ok } else { p.fail };
                    transition = Some(Transition {
                        from,
                        to: p.state(),
                        streak,
                    });
                }
                Some(p.encode())
            });
        if transition.is_some() {
            self.since.store(now.0, Ordering::Relaxed);
        }
        transition
    }
}

// === impl HealthState, ProbePhase ===

impl HealthState {
    /// `up` or `down`.
    pub fn as_str(self) -> &'static str {
        match self {
            HealthState::Up => "up",
            HealthState::Down => "down",
        }
    }
}

impl fmt::Display for HealthState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl ProbePhase {
    /// The phase's name.
    pub fn as_str(self) -> &'static str {
        match self {
            ProbePhase::Connect => "connect",
            ProbePhase::Tls => "tls",
            ProbePhase::Send => "send",
            ProbePhase::FirstByte => "first_byte",
            ProbePhase::Status => "status",
            ProbePhase::Body => "body",
        }
    }
}

impl fmt::Display for ProbePhase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(initial: InitialState) -> HealthPolicy {
        HealthPolicy {
            rise: 2,
            fall: 3,
            initial,
        }
    }

    #[test]
    fn default_down_needs_rise_passes() {
        let h = ActiveHealth::new(policy(InitialState::Down));
        assert!(!h.allows_traffic());
        assert_eq!(h.record(true, Timestamp(1)), None);
        assert!(!h.allows_traffic());
        let t = h.record(true, Timestamp(2)).unwrap();
        assert_eq!(
            (t.from, t.to, t.streak),
            (HealthState::Down, HealthState::Up, 2)
        );
        assert!(h.allows_traffic());
        assert_eq!(h.view().since, Timestamp(2));
    }

    #[test]
    fn an_opposite_result_resets_the_streak() {
        let h = ActiveHealth::new(policy(InitialState::Up));
        assert!(h.allows_traffic());
        h.record(false, Timestamp(1));
        h.record(false, Timestamp(2));
        h.record(true, Timestamp(3));
        h.record(false, Timestamp(4));
        h.record(false, Timestamp(5));
        assert!(h.allows_traffic(), "streak was reset by the pass");
        let t = h.record(false, Timestamp(6)).unwrap();
        assert_eq!(t.to, HealthState::Down);
        assert_eq!(h.view().fail_streak, 3);
    }

    #[test]
    fn first_result_decides_alone() {
        let h = ActiveHealth::new(policy(InitialState::FirstResult));
        assert!(h.allows_traffic());
        assert!(h.record(false, Timestamp(1)).is_some());
        assert!(!h.allows_traffic());
        // later results need the full streak
        assert!(h.record(true, Timestamp(2)).is_none());
        assert!(h.record(true, Timestamp(3)).is_some());
    }

    #[test]
    fn disabled_always_allows() {
        let h = ActiveHealth::disabled();
        assert!(h.allows_traffic());
        assert_eq!(h.record(false, Timestamp(1)), None);
        assert_eq!(h.view().state, None);
    }
}
