//! The names of the rules that keep a peer from new requests, as the admin
//! API writes them (`GET /api/status`: each reason's `rule`, a peer's
//! `state`) and `vigil status`, `vigil explain`, the dashboard and the
//! metrics read them: one enum each, serialized as the same words, so that
//! nothing matches them as strings.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::peer::AdminState;

use super::Ineligible;

/// A rule in force against a peer ([`Ineligible`] without its numbers):
/// a reason's `rule` in the admin API.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Rule {
    /// `down` in the config.
    Down,
    /// Set down or draining through the admin API (the reason's detail is
    /// the admin state, `down` or `drain`).
    Admin,
    /// Active checks say down.
    ProbeDown,
    /// Passive: `fails >= max_fails` inside the exclusion window.
    Excluded,
    /// `passive_recovery probe`: waits for a passing probe.
    AwaitingProbe,
    /// `passive_recovery probation=N`: its one request is in flight.
    Probation,
    /// `eject_slow`.
    Slow,
    /// `eject_stuck`.
    Stuck,
    /// `max_conns` reached.
    Full,
    /// A rule this build does not know (read from another version's API).
    #[serde(other)]
    Unknown,
}

/// What a peer is now: eligible, or the first rule that keeps it out, the
/// admin state told apart (`admin_down`, `draining`). A peer's `state` in
/// the admin API and `vigil status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PeerState {
    /// No rule keeps it out.
    Eligible,
    /// `down` in the config.
    Down,
    /// Set down through the admin API.
    AdminDown,
    /// Draining through the admin API.
    Draining,
    /// Active checks say down.
    ProbeDown,
    /// Passive exclusion.
    Excluded,
    /// `passive_recovery probe`: waits for a passing probe.
    AwaitingProbe,
    /// `passive_recovery probation=N`: its one request is in flight.
    Probation,
    /// `eject_slow`.
    Slow,
    /// `eject_stuck`.
    Stuck,
    /// `max_conns` reached.
    Full,
    /// A state this build does not know (read from another version's API).
    #[serde(other)]
    Unknown,
}

// === impl Rule ===

impl Rule {
    /// Every rule core writes, in the order `vigil status` walks them.
    pub const ALL: [Rule; 9] = [
        Rule::Down,
        Rule::Admin,
        Rule::ProbeDown,
        Rule::Excluded,
        Rule::AwaitingProbe,
        Rule::Probation,
        Rule::Slow,
        Rule::Stuck,
        Rule::Full,
    ];

    /// The word in the admin API (the serde name).
    pub fn as_str(self) -> &'static str {
        match self {
            Rule::Down => "down",
            Rule::Admin => "admin",
            Rule::ProbeDown => "probe_down",
            Rule::Excluded => "excluded",
            Rule::AwaitingProbe => "awaiting_probe",
            Rule::Probation => "probation",
            Rule::Slow => "slow",
            Rule::Stuck => "stuck",
            Rule::Full => "full",
            Rule::Unknown => "unknown",
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

// === impl PeerState ===

impl PeerState {
    /// Every state core writes.
    pub const ALL: [PeerState; 11] = [
        PeerState::Eligible,
        PeerState::Down,
        PeerState::AdminDown,
        PeerState::Draining,
        PeerState::ProbeDown,
        PeerState::Excluded,
        PeerState::AwaitingProbe,
        PeerState::Probation,
        PeerState::Slow,
        PeerState::Stuck,
        PeerState::Full,
    ];

    /// The state of a peer with `reasons` in force (in the order
    /// `Gate::admit` walks them): the first one.
    pub fn of(reasons: &[Ineligible]) -> Self {
        reasons
            .first()
            .map_or(PeerState::Eligible, Ineligible::state)
    }

    /// The word in the admin API (the serde name).
    pub fn as_str(self) -> &'static str {
        match self {
            PeerState::Eligible => "eligible",
            PeerState::Down => "down",
            PeerState::AdminDown => "admin_down",
            PeerState::Draining => "draining",
            PeerState::ProbeDown => "probe_down",
            PeerState::Excluded => "excluded",
            PeerState::AwaitingProbe => "awaiting_probe",
            PeerState::Probation => "probation",
            PeerState::Slow => "slow",
            PeerState::Stuck => "stuck",
            PeerState::Full => "full",
            PeerState::Unknown => "unknown",
        }
    }
}

impl fmt::Display for PeerState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

// === impl Ineligible ===

impl Ineligible {
    /// The rule's name (a reason's `rule` in the API).
    pub fn rule(&self) -> Rule {
        match self {
            Ineligible::ConfigDown => Rule::Down,
            Ineligible::Admin { .. } => Rule::Admin,
            Ineligible::ProbeDown { .. } => Rule::ProbeDown,
            Ineligible::Excluded { .. } => Rule::Excluded,
            Ineligible::AwaitingProbe { .. } => Rule::AwaitingProbe,
            Ineligible::Probation { .. } => Rule::Probation,
            Ineligible::Slow { .. } => Rule::Slow,
            Ineligible::Stuck { .. } => Rule::Stuck,
            Ineligible::Full { .. } => Rule::Full,
        }
    }

    /// The state a peer is in when this is the first rule in force (what
    /// `vigil status` and the API show).
    pub fn state(&self) -> PeerState {
        match self {
            Ineligible::ConfigDown => PeerState::Down,
            Ineligible::Admin {
                state: AdminState::Drain,
                ..
            } => PeerState::Draining,
            Ineligible::Admin { .. } => PeerState::AdminDown,
            Ineligible::ProbeDown { .. } => PeerState::ProbeDown,
            Ineligible::Excluded { .. } => PeerState::Excluded,
            Ineligible::AwaitingProbe { .. } => PeerState::AwaitingProbe,
            Ineligible::Probation { .. } => PeerState::Probation,
            Ineligible::Slow { .. } => PeerState::Slow,
            Ineligible::Stuck { .. } => PeerState::Stuck,
            Ineligible::Full { .. } => PeerState::Full,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_serde_names_are_the_words_and_read_back() {
        for r in Rule::ALL.into_iter().chain([Rule::Unknown]) {
            let json = serde_json::to_string(&r).expect("a rule serializes");
            assert_eq!(json, format!("\"{}\"", r.as_str()));
            assert_eq!(serde_json::from_str::<Rule>(&json).ok(), Some(r));
        }
        for s in PeerState::ALL.into_iter().chain([PeerState::Unknown]) {
            let json = serde_json::to_string(&s).expect("a state serializes");
            assert_eq!(json, format!("\"{}\"", s.as_str()));
            assert_eq!(serde_json::from_str::<PeerState>(&json).ok(), Some(s));
        }
    }

    #[test]
    fn a_word_of_another_version_reads_as_unknown() {
        assert_eq!(
            serde_json::from_str::<Rule>("\"quarantined\"").ok(),
            Some(Rule::Unknown)
        );
        assert_eq!(
            serde_json::from_str::<PeerState>("\"quarantined\"").ok(),
            Some(PeerState::Unknown)
        );
    }

    #[test]
    fn the_state_tells_the_admin_states_apart_and_the_rule_does_not() {
        let admin = |state| Ineligible::Admin {
            state,
            since: crate::clock::Timestamp(0),
        };
        assert_eq!(admin(AdminState::Drain).state(), PeerState::Draining);
        assert_eq!(admin(AdminState::Down).state(), PeerState::AdminDown);
        assert_eq!(admin(AdminState::Drain).rule(), Rule::Admin);
        assert_eq!(Ineligible::ConfigDown.rule(), Rule::Down);
        assert_eq!(Ineligible::ConfigDown.state(), PeerState::Down);
        assert_eq!(PeerState::of(&[]), PeerState::Eligible);
    }
}
