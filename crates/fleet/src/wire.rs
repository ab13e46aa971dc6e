//! What the fleet writes to etcd, under `ROOT = PREFIX NAME /`:
//!
//! | key | value | lease |
//! | --- | --- | --- |
//! | `ROOT members/MEMBER` | [`MemberValue`] | the member's |
//! | `ROOT results/MEMBER/TARGET` | [`ResultValue`]: the last probe result | the member's |
//! | `ROOT passive/MEMBER/TARGET` | [`PassiveValue`]: a passive ejection (`share_passive`) | the member's |
//!
//! A passive ejection of a peer without an active check has no target: its
//! `TARGET` is [`peer_id`] of the upstream and the peer.
//!
//! Values are JSON. Everything a member wrote goes with its lease: when a
//! member dies its keys vanish after the TTL and the others re-assign its
//! targets. Which of these keys a member believes (a lease, the writer's
//! own lease, its own targets, bounded times) is the `trust` module's
//! business.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use vigil_core::health::{ProbePhase, ProbeReport};

use crate::options::is_name;

/// A member's key's value.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberValue {
    /// When it joined (ms since the epoch).
    pub joined_unix_ms: u64,
    /// Its process id.
    pub pid: u32,
    /// Its vigil version.
    pub version: String,
}

/// One probe result, as published by the member that probed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResultValue {
    /// Passed.
    pub ok: bool,
    /// The failing phase (`connect`, `tls`, `send`, `first_byte`, `status`, `body`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// What the probe saw.
    pub detail: String,
    /// How long it took, in ms.
    pub latency_ms: u64,
    /// When it finished, on the prober's wall clock (ms since the epoch).
    pub at_unix_ms: u64,
}

/// A passive ejection (`share_passive`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PassiveValue {
    /// The upstream.
    pub upstream: String,
    /// The peer, as configured.
    pub peer: String,
    /// When (ms since the epoch).
    pub at_unix_ms: u64,
    /// How long the ejecting member excludes the peer (`fail_timeout`, or
    /// the `passive_penalty` length then), in ms: a member without a check
    /// for the peer halves its weight for what is left of it. Absent from
    /// older members' values (then nothing is halved).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub penalty_ms: Option<u64>,
}

/// A key of the fleet, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Key<'a> {
    /// `members/MEMBER`.
    Member(&'a str),
    /// `results/MEMBER/TARGET`.
    Result {
        /// Who probed.
        member: &'a str,
        /// The target's id.
        target: &'a str,
    },
    /// `passive/MEMBER/TARGET`.
    Passive {
        /// Who ejected.
        member: &'a str,
        /// The target's id.
        target: &'a str,
    },
}

/// Parse a key below `root`; `None` for anything else (a newer member's
/// key kinds are ignored, not errors), and for a `MEMBER` no member can
/// be named (1 to 128 letters, digits, `.`, `_`, `-`).
pub fn parse_key<'a>(root: &str, key: &'a [u8]) -> Option<Key<'a>> {
    let key = std::str::from_utf8(key).ok()?.strip_prefix(root)?;
    let (kind, rest) = key.split_once('/')?;
    match kind {
        "members" if is_name(rest) => Some(Key::Member(rest)),
        "results" | "passive" => {
            let (member, target) = rest.split_once('/')?;
            if !is_name(member) || target.is_empty() {
                return None;
            }
            Some(if kind == "results" {
                Key::Result { member, target }
            } else {
                Key::Passive { member, target }
            })
        }
        _ => None,
    }
}

/// The `TARGET` of a passive ejection of a peer that has no active check
/// (no probe target): `peer-` and 16 hex digits of a hash (FNV-1a, 64 bits)
/// of the upstream's name and the peer's address as configured, so any
/// text is a safe key; the value names both.
pub fn peer_id(upstream: &str, peer: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in upstream.bytes().chain([0]).chain(peer.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("peer-{h:016x}")
}

/// `ROOT members/MEMBER`.
pub fn member_key(root: &str, member: &str) -> String {
    format!("{root}members/{member}")
}

/// `ROOT results/MEMBER/TARGET`.
pub fn result_key(root: &str, member: &str, target: &str) -> String {
    format!("{root}results/{member}/{target}")
}

/// `ROOT passive/MEMBER/TARGET`.
pub fn passive_key(root: &str, member: &str, target: &str) -> String {
    format!("{root}passive/{member}/{target}")
}

// === impl ResultValue ===

impl ResultValue {
    /// A local result, to publish.
    pub fn of(report: &ProbeReport, at_unix_ms: u64) -> Self {
        Self {
            ok: report.ok,
            phase: report.phase.map(|p| p.to_string()),
            detail: report.detail.clone(),
            latency_ms: u64::try_from(report.latency.as_millis()).unwrap_or(u64::MAX),
            at_unix_ms,
        }
    }

    /// The result as this instance records it: the same pass or failure
    /// and phase, its detail naming who probed (`explain` and the event
    /// then say so); `at` is this instance's (the checker stamps it).
    pub fn report(&self, member: &str) -> ProbeReport {
        ProbeReport {
            ok: self.ok,
            phase: self.phase.as_deref().and_then(phase),
            latency: Duration::from_millis(self.latency_ms),
            detail: format!("{} (probed by member {member})", self.detail),
            at: vigil_core::Timestamp(0),
        }
    }
}

fn phase(name: &str) -> Option<ProbePhase> {
    [
        ProbePhase::Connect,
        ProbePhase::Tls,
        ProbePhase::Send,
        ProbePhase::FirstByte,
        ProbePhase::Status,
        ProbePhase::Body,
    ]
    .into_iter()
    .find(|p| p.to_string() == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROOT: &str = "/vigil/fleet/edge/";

    #[test]
    fn keys_round_trip() {
        let k = result_key(ROOT, "m1", "http-127.0.0.1:80-0000abcd");
        assert_eq!(
            parse_key(ROOT, k.as_bytes()),
            Some(Key::Result {
                member: "m1",
                target: "http-127.0.0.1:80-0000abcd"
            })
        );
        let k = member_key(ROOT, "m2");
        assert_eq!(parse_key(ROOT, k.as_bytes()), Some(Key::Member("m2")));
        let k = passive_key(ROOT, "m3", "tcp-[::1]:80-00000000");
        assert_eq!(
            parse_key(ROOT, k.as_bytes()),
            Some(Key::Passive {
                member: "m3",
                target: "tcp-[::1]:80-00000000"
            })
        );
    }

    #[test]
    fn a_peer_without_a_check_gets_a_safe_stable_id_and_old_values_still_decode() {
        let id = peer_id("api", "unix:/run/app.sock");
        assert_eq!(id, peer_id("api", "unix:/run/app.sock"));
        assert_ne!(id, peer_id("ap", "iunix:/run/app.sock"));
        assert!(id.starts_with("peer-") && id.len() == 21, "{id}");
        let k = passive_key(ROOT, "m1", &id);
        assert_eq!(
            parse_key(ROOT, k.as_bytes()),
            Some(Key::Passive {
                member: "m1",
                target: &id
            })
        );
        let old: PassiveValue =
            serde_json::from_str(r#"{"upstream":"api","peer":"10.0.0.1:80","at_unix_ms":5}"#)
                .expect("test step");
        assert_eq!(old.penalty_ms, None);
        let new = PassiveValue {
            penalty_ms: Some(10_000),
            ..old
        };
        let text = serde_json::to_string(&new).expect("test step");
        assert!(text.contains(r#""penalty_ms":10000"#), "{text}");
    }

    #[test]
    fn foreign_or_malformed_keys_are_ignored() {
        for k in [
            "/vigil/fleet/other/members/m1",
            "/vigil/fleet/edge/members/",
            "/vigil/fleet/edge/members/a/b",
            "/vigil/fleet/edge/results/m1",
            "/vigil/fleet/edge/results//t",
            "/vigil/fleet/edge/members/a b",
            "/vigil/fleet/edge/results/a\nb/t",
            "/vigil/fleet/edge/passive/a\u{1b}[31m/t",
            "/vigil/fleet/edge/future/x",
        ] {
            assert_eq!(parse_key(ROOT, k.as_bytes()), None, "{k}");
        }
        assert_eq!(parse_key(ROOT, b"/vigil/fleet/edge/members/\xff"), None);
    }

    #[test]
    fn a_remote_result_keeps_pass_phase_and_says_who_probed() {
        let local = ProbeReport {
            ok: false,
            phase: Some(ProbePhase::FirstByte),
            latency: Duration::from_millis(7),
            detail: "timed out after 1s".into(),
            at: vigil_core::Timestamp(5),
        };
        let v = ResultValue::of(&local, 1_700_000_000_000);
        let text = serde_json::to_string(&v).expect("test step");
        let back: ResultValue = serde_json::from_str(&text).expect("test step");
        let r = back.report("m2");
        assert!(!r.ok);
        assert_eq!(r.phase, Some(ProbePhase::FirstByte));
        assert_eq!(r.latency, Duration::from_millis(7));
        assert_eq!(r.detail, "timed out after 1s (probed by member m2)");
        assert!(serde_json::from_slice::<ResultValue>(b"{\"ok\":1}").is_err());
    }
}
