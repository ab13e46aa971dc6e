//! Fleet `share_passive`: what another member's passive ejection of a peer
//! does here. One instance's bad path must not empty the fleet, so no
//! member ejects a peer on another's word: where an active check probes
//! the peer here, it is probed at once and the result decides, as any
//! probe's; without a check, its weight is halved ([`super::halve`]) for
//! what is left of that member's penalty, never longer than the longest
//! exclusion this member's own config could give the peer; a peer this
//! member does not have, or an ejection over when heard, changes nothing.
//!
//! The fleet crate reads the message, asks the checker and the registry
//! what this member has, and applies the answer; the decision is here, over
//! plain numbers.

use std::time::Duration;

use crate::clock::duration_ms;
use crate::config::Penalty;

/// Another member's passive ejection of a peer, as heard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteEjection {
    /// How long that member excludes the peer, ms (None: it did not say).
    pub penalty_ms: Option<u64>,
    /// When it ejected the peer, ms since the epoch on its clock (the
    /// fleet believes only times within its skew of this member's).
    pub at_unix_ms: u64,
}

/// What this member has of the peer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PeerHere {
    /// An active check probes it here.
    Checked,
    /// It is a server of the upstream here, with no check.
    Unchecked {
        /// Its `fail_timeout` here.
        fail_timeout: Duration,
        /// The upstream's `passive_penalty` here, if any.
        penalty: Option<Penalty>,
    },
    /// No such upstream or server here.
    Absent,
}

/// What the ejection does here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RemoteAnswer {
    /// Probe the peer now; the result decides.
    ProbeNow,
    /// Nothing.
    Ignore,
    /// Halve its weight for this long, ms (at least 1).
    Halve {
        /// How long.
        ms: u64,
    },
}

/// What `heard` does to a peer this member has as `here`, at `now_unix_ms`
/// on this member's clock.
pub fn remote_ejection(heard: RemoteEjection, here: PeerHere, now_unix_ms: u64) -> RemoteAnswer {
    match here {
        PeerHere::Checked => RemoteAnswer::ProbeNow,
        PeerHere::Absent => RemoteAnswer::Ignore,
        PeerHere::Unchecked {
            fail_timeout,
            penalty,
        } => {
            let longest = longest_exclusion_ms(fail_timeout, penalty.as_ref());
            match halving_ms(heard.penalty_ms, heard.at_unix_ms, now_unix_ms, longest) {
                0 => RemoteAnswer::Ignore,
                ms => RemoteAnswer::Halve { ms },
            }
        }
    }
}

/// How long to halve a peer's weight for an ejection stamped `at_unix_ms`
/// with `penalty_ms`, heard at `now_unix_ms`: what is left of the penalty,
/// the penalty capped at `longest_ms` (the longest exclusion this member's
/// own config gives the peer, [`longest_exclusion_ms`]) and a time ahead
/// of now taken as now. 0: nothing to halve.
fn halving_ms(penalty_ms: Option<u64>, at_unix_ms: u64, now_unix_ms: u64, longest_ms: u64) -> u64 {
    let Some(penalty) = penalty_ms else {
        return 0;
    };
    let elapsed = now_unix_ms.saturating_sub(at_unix_ms);
    penalty.min(longest_ms).saturating_sub(elapsed)
}

/// The longest passive exclusion a peer with `fail_timeout` under
/// `passive_penalty` (if any) can get: `fail_timeout`, or the penalty's
/// `max` plus its jitter ([`super::passive::pause_ms`] never exceeds it).
fn longest_exclusion_ms(fail_timeout: Duration, penalty: Option<&Penalty>) -> u64 {
    let grown = penalty.map_or(0, |p| {
        let max = duration_ms(p.max);
        max.saturating_add(max / 100 * u64::from(p.jitter_percent) + u64::from(p.jitter_percent))
    });
    duration_ms(fail_timeout).max(grown)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_700_000_000_000;

    fn s(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    fn unchecked(fail_timeout: u64) -> PeerHere {
        PeerHere::Unchecked {
            fail_timeout: s(fail_timeout),
            penalty: None,
        }
    }

    fn heard(penalty_ms: Option<u64>, ago_ms: u64) -> RemoteEjection {
        RemoteEjection {
            penalty_ms,
            at_unix_ms: NOW - ago_ms,
        }
    }

    #[test]
    fn a_checked_peer_is_probed_and_an_absent_one_left_alone() {
        for h in [
            heard(Some(10_000), 0),
            heard(None, 0),
            heard(Some(1), 60_000),
        ] {
            assert_eq!(
                remote_ejection(h, PeerHere::Checked, NOW),
                RemoteAnswer::ProbeNow,
                "a probe decides, whatever the penalty: {h:?}"
            );
            assert_eq!(
                remote_ejection(h, PeerHere::Absent, NOW),
                RemoteAnswer::Ignore
            );
        }
    }

    #[test]
    fn an_unchecked_peer_is_halved_for_what_is_left_of_the_penalty() {
        let here = unchecked(10);
        assert_eq!(
            remote_ejection(heard(Some(10_000), 4_000), here, NOW),
            RemoteAnswer::Halve { ms: 6_000 }
        );
        assert_eq!(
            remote_ejection(heard(Some(10_000), 10_000), here, NOW),
            RemoteAnswer::Ignore,
            "over when heard"
        );
        assert_eq!(
            remote_ejection(heard(None, 0), here, NOW),
            RemoteAnswer::Ignore,
            "no penalty said: nothing"
        );
    }

    #[test]
    fn a_halving_never_outlasts_the_longest_exclusion_of_this_members_config() {
        let here = unchecked(10);
        assert_eq!(
            remote_ejection(heard(Some(u64::MAX), 0), here, NOW),
            RemoteAnswer::Halve { ms: 10_000 },
            "a penalty of for ever is capped"
        );
        let ahead = RemoteEjection {
            penalty_ms: Some(u64::MAX),
            at_unix_ms: NOW + 5_000,
        };
        assert_eq!(
            remote_ejection(ahead, here, NOW),
            RemoteAnswer::Halve { ms: 10_000 },
            "a time ahead is taken as now"
        );
        let penalty = Penalty {
            base: s(5),
            max: s(60),
            jitter_percent: 20,
        };
        let here = PeerHere::Unchecked {
            fail_timeout: s(10),
            penalty: Some(penalty),
        };
        assert_eq!(
            remote_ejection(heard(Some(u64::MAX), 0), here, NOW),
            RemoteAnswer::Halve {
                ms: 60_000 + 12_000 + 20
            },
            "the grown penalty with its jitter"
        );
    }

    #[test]
    fn the_longest_exclusion_is_fail_timeout_or_the_grown_penalty_with_its_jitter() {
        assert_eq!(longest_exclusion_ms(s(10), None), 10_000);
        let p = Penalty {
            base: s(5),
            max: s(60),
            jitter_percent: 20,
        };
        assert_eq!(longest_exclusion_ms(s(10), Some(&p)), 60_000 + 12_000 + 20);
        assert_eq!(longest_exclusion_ms(s(120), Some(&p)), 120_000);
    }

    #[test]
    fn no_exclusion_core_gives_outlasts_the_longest() {
        for (base, max, jitter) in [(5, 60, 20), (1, 7, 100), (3, 3, 0), (2, 999, 33)] {
            let p = Penalty {
                base: Duration::from_millis(base * 1000 + 7),
                max: Duration::from_millis(max * 1000 + 13),
                jitter_percent: jitter,
            };
            let longest = longest_exclusion_ms(s(1), Some(&p));
            for nth in [1, 2, 5, 20, u8::MAX] {
                for random in [0, 1, 99, 12_345, u64::MAX / 3, u64::MAX] {
                    let pause = super::super::passive::pause_ms(&p, nth, random);
                    assert!(
                        u64::from(pause) <= longest,
                        "{p:?} nth {nth} random {random}: {pause} > {longest}"
                    );
                }
            }
        }
    }
}
