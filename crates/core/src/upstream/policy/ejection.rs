//! `max_ejected P%`: never more than P% of the primaries in service ejected
//! at once by every health rule together (passive exclusion, a pending
//! recovery probe, probes down, `eject_slow`, `eject_stuck`; not `down`,
//! not the admin states, not `max_conns`).
//!
//! In service ([`super::in_service`]): a primary that is neither `down` in
//! the config nor set down or draining through the admin API. Of the n in
//! service at most
//! `min(floor(n × P / 100), n − 1)` may be ejected, so at least one primary
//! always remains. The count form, [`HealthRules::keep_in_service`] = K
//! (what `vigil check --min-healthy K` sets), keeps at least K: at most
//! `n − min(K, n)` may be ejected. With both, the stricter (the smaller
//! number) holds; with K alone, P is 100. When more would be, the ejected peers with the best
//! recent record stay eligible ("kept"), and only the worst are ejected.
//! The record, best first:
//!
//! 1. the fewest failures counted against it now (passive `fails` plus
//!    failed probes in a row, the latter counted up to `fall`: past it
//!    every peer that keeps failing its probes ranks the same, so two of
//!    them do not swap places at each probe, which in checker-only mode
//!    would rewrite nginx's files and reload it every interval);
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
use crate::peer::Peer;

use super::super::latency::Latency;
use super::super::slot::Slot;
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
    spare: usize,
) -> Option<Kept> {
    if !rules.limits_ejection() {
        return None;
    }
    let mut in_service = 0usize;
    // (tier index, failures, since)
    let mut ejected: Vec<(usize, u64, Timestamp)> = Vec::new();
    for (i, (peer, s)) in peers.iter().zip(slots).enumerate() {
        if !super::in_service(peer) {
            continue;
        }
        in_service += 1;
        let mut fails = 0u64;
        let mut since = Timestamp(0);
        let mut hit = false;
        if !peer.health().allows_traffic() {
            let h = peer.health().view();
            let fall = peer.health().policy().map_or(u32::MAX, |p| p.fall);
            fails += u64::from(h.fail_streak.min(fall));
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
    let allowed = allowed(rules, in_service, spare);
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

/// How many of `in_service` primaries `max_ejected` lets be ejected: by
/// its percentage (100 when only the count form is set), never so many
/// that fewer than `keep_in_service` (at least one) remain. The count form
/// (`vigil check --min-healthy N`) counts the `spare` backups in service
/// (probes passing) toward its N, as nginx would send them the traffic: with
/// a healthy backup every failing primary may be marked down. The
/// percentage form always keeps one primary.
pub(crate) fn allowed(rules: &HealthRules, in_service: usize, spare: usize) -> usize {
    let by_percent = rules
        .max_ejected
        .map_or(in_service, |p| in_service * usize::from(p) / 100);
    let keep = match rules.keep_in_service {
        Some(k) => {
            let n = usize::try_from(k.get())
                .unwrap_or(usize::MAX)
                .saturating_sub(spare);
            if rules.max_ejected.is_some() {
                n.max(1)
            } else {
                n
            }
        }
        None => 1,
    };
    by_percent.min(in_service.saturating_sub(keep))
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

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;

    use super::*;

    fn rules(percent: Option<u8>, keep: Option<u32>) -> HealthRules {
        HealthRules {
            max_ejected: percent,
            keep_in_service: keep.and_then(NonZeroU32::new),
            ..HealthRules::default()
        }
    }

    #[test]
    fn the_percentage_keeps_one_and_the_count_keeps_k_the_stricter_wins() {
        // (percent, keep, in service) -> allowed
        let cases = [
            (Some(50), None, 1, 0),
            (Some(50), None, 2, 1),
            (Some(50), None, 3, 1),
            (Some(100), None, 3, 2),
            (Some(0), None, 3, 0),
            (None, Some(1), 1, 0),
            (None, Some(1), 2, 1),
            (None, Some(1), 3, 2),
            (None, Some(2), 1, 0),
            (None, Some(2), 2, 0),
            (None, Some(2), 3, 1),
            (Some(50), Some(1), 4, 2),
            (Some(50), Some(3), 4, 1),
            (Some(100), Some(2), 4, 2),
            (None, Some(5), 0, 0),
        ];
        for (p, k, n, want) in cases {
            assert_eq!(
                allowed(&rules(p, k), n, 0),
                want,
                "max_ejected {p:?}% keep {k:?} of {n}"
            );
        }
    }
}
