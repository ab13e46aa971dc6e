//! `max_ejected P%`: never more than P% of the primaries in service ejected
//! at once by every health rule together (passive exclusion, a pending
//! recovery probe, probes down, `eject_slow`, `eject_stuck`; not `down`,
//! not the admin states, not `max_conns`).
//!
//! In service: a primary that is neither `down` in the config nor set down
//! or draining through the admin API. Of the n in service at most
//! `min(floor(n × P / 100), n − 1)` may be ejected, so at least one primary
//! always remains. When more would be, the ejected peers with the best
//! recent record stay eligible ("kept"), and only the worst are ejected.
//! The record, best first:
//!
//! 1. the fewest failures counted against it now (passive `fails` plus
//!    failed probes in a row);
//! 2. then the latest ejection (it was serving until more recently: the
//!    last counted failure or slow ejection, the probe state change, or
//!    the start of the stuck attempt);
//! 3. then config order.
//!
//! A kept peer is charged as usual, so one that keeps failing moves down
//! the ranking and another takes its place. Unlike Envoy's panic mode
//! (which routes to every host once too many are unhealthy), only as many
//! are kept as the limit needs.

use std::sync::Arc;

use crate::clock::Timestamp;
use crate::config::HealthRules;
use crate::peer::{AdminState, Peer};

use super::super::latency::Latency;
use super::super::tier::Slot;
use super::super::Tried;
use super::passive_reason;

/// The tier indices `max_ejected` keeps eligible now, and the counts
/// behind it. None without the rule.
pub(crate) fn kept(
    rules: &HealthRules,
    peers: &[Arc<Peer>],
    slots: &[Slot],
    single: bool,
    now: Timestamp,
    latency: Option<&Latency>,
) -> Option<Kept> {
    let percent = rules.max_ejected?;
    let mut in_service = 0usize;
    // (tier index, failures, since)
    let mut ejected: Vec<(usize, u64, Timestamp)> = Vec::new();
    for (i, (peer, s)) in peers.iter().zip(slots).enumerate() {
        if peer.config().down || peer.admin() != AdminState::Up {
            continue;
        }
        in_service += 1;
        let mut fails = 0u64;
        let mut since = Timestamp(0);
        let mut hit = false;
        if !peer.health().allows_traffic() {
            let h = peer.health().view();
            fails += u64::from(h.fail_streak);
            since = since.max(h.since);
            hit = true;
        }
        if passive_reason(rules, peer, s, single, now).is_some_and(|r| r.is_ejection()) {
            fails += u64::from(s.fails);
            since = since.max(s.accessed);
            hit = true;
        }
        if let Some((oldest, _)) = latency
            .filter(|_| !single)
            .and_then(|l| l.stuck(peer.id().0 as usize, now))
        {
            since = since.max(Timestamp(oldest / 1000));
            hit = true;
        }
        if hit {
            ejected.push((i, fails, since));
        }
    }
    let allowed = (in_service * usize::from(percent) / 100).min(in_service.saturating_sub(1));
    let mut set = Tried::default();
    let over = ejected.len().saturating_sub(allowed);
    if over > 0 {
        ejected.sort_by(|a, b| a.1.cmp(&b.1).then(b.2.cmp(&a.2)).then(a.0.cmp(&b.0)));
        for (i, _, _) in &ejected[..over] {
            set.insert(*i);
        }
    }
    Some(Kept {
        set,
        ejected: ejected.len() as u32,
        allowed: allowed as u32,
        in_service: in_service as u32,
    })
}

/// What `max_ejected` decided for a tier at one moment.
#[derive(Clone, Debug, Default)]
pub(crate) struct Kept {
    /// The tier indices kept eligible despite an ejection.
    pub(crate) set: Tried,
    /// How many primaries in service a health rule ejects (kept included).
    pub(crate) ejected: u32,
    /// How many may be ejected.
    pub(crate) allowed: u32,
    /// Primaries in service.
    pub(crate) in_service: u32,
}
