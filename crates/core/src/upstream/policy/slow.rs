//! `eject_slow factor=K window=T min_requests=N [min=T] [max=T]`: which peers of a
//! tier are slow, judged on core's time-to-header figures
//! ([`super::super::latency`]).
//!
//! A peer's figure is its median time-to-header over the window (the last
//! T/2 to T). It is judged when it has at least N headers in the window,
//! against the median of the figures of the *other* peers of its tier that
//! have N too (so with 2 peers, against the other one; with fewer than 2
//! such peers nobody is judged by it). It is slow when its figure is above
//! both K × that median and `min`, or, with `max=`, above `max` whatever
//! the others' (a peer with N headers is judged by `max` alone where it
//! has no sibling to compare with). A slow peer is ejected as a passive exclusion
//! ([`super::passive::Record::slow`]) and its figure forgotten, so on its
//! return it is judged on new requests only, never on the samples that
//! had it ejected (a figure is forgotten again when it is readmitted: the
//! few requests it served while out, or on probation, say little).
//!
//! The comparison runs at most every window/50 (20 ms to 1 s), by the
//! request whose header finds it due; peers already out are skipped.

use crate::clock::{duration_us, Timestamp};
use crate::config::EjectSlow;

use super::super::Upstream;
use super::over_max_fails;
use super::passive::Record;

/// One peer's verdict: (tier index, its figure µs, the others' median µs
/// (0 when none had a figure), whether `max=` alone made it slow).
pub(crate) type Verdict = (usize, u64, u64, bool);

/// The slow peers among `figures` (per tier index: median µs and count,
/// None for a peer that is out or has no figure).
pub(crate) fn judge(rule: &EjectSlow, figures: &[Option<(u64, u64)>]) -> Vec<Verdict> {
    let n = u64::from(rule.min_requests);
    let judged: Vec<(usize, u64)> = figures
        .iter()
        .enumerate()
        .filter_map(|(i, f)| f.filter(|(_, c)| *c >= n).map(|(m, _)| (i, m)))
        .collect();
    let floor = duration_us(rule.min);
    let mut out = Vec::new();
    for &(i, figure) in &judged {
        let mut others: Vec<u64> = judged
            .iter()
            .filter(|(j, _)| *j != i)
            .map(|(_, m)| *m)
            .collect();
        let median = median(&mut others);
        let outlier =
            median.is_some_and(|m| figure as f64 > (m as f64 * rule.factor).max(floor as f64));
        let over_max = rule.max.is_some_and(|t| figure > duration_us(t));
        if outlier || over_max {
            out.push((i, figure, median.unwrap_or(0), !outlier));
        }
    }
    out
}

/// The median of `v` (the mean of the middle two for an even count).
fn median(v: &mut [u64]) -> Option<u64> {
    if v.is_empty() {
        return None;
    }
    v.sort_unstable();
    let mid = v.len() / 2;
    Some(if v.len() % 2 == 1 {
        v[mid]
    } else {
        v[mid - 1] / 2 + v[mid] / 2 + (v[mid - 1] % 2 + v[mid] % 2) / 2
    })
}

// === impl Upstream (eject_slow) ===

impl Upstream {
    /// Compare the figures of the tier of peer `global` and eject the slow.
    pub(crate) fn compare_slow(&self, global: usize, now: Timestamp) {
        let (Some(l), Some(rule)) = (
            self.latency.as_deref(),
            self.config.rules.eject_slow.as_ref(),
        ) else {
            return;
        };
        let Some(tier) = self.peers.get(global).and_then(|p| self.tier_of(p.id())) else {
            return;
        };
        if tier.single {
            return;
        }
        let mut events = Vec::new();
        let mut forget = Vec::new();
        {
            let mut st = tier.lock();
            tier.materialize(&mut st);
            let figures: Vec<Option<(u64, u64)>> = (0..st.len())
                .map(|i| {
                    let peer = &self.peers[tier.offset + i];
                    if over_max_fails(peer, &st[i]) || !peer.is_routable() {
                        return None;
                    }
                    let f = self.peer_header_figure(tier.offset + i, now)?;
                    Some((duration_us(f.median?), f.requests))
                })
                .collect();
            for (i, figure, median, by_max) in judge(rule, &figures) {
                let g = tier.offset + i;
                let peer = &self.peers[g];
                let requests = figures[i].map_or(0, |(_, c)| c);
                Record {
                    rules: &self.config.rules,
                    peer,
                    s: &mut st[i],
                    global: g,
                    events: &mut events,
                }
                .slow(figure, median, by_max, requests, now, || self.jitter());
                peer.set_fails_hint(super::super::slot::hint(&st[i]));
                tier.refresh(&mut st, i, peer);
                forget.push(g);
            }
        }
        for g in forget {
            l.forget(g);
        }
        self.publish(events, now);
    }

    /// Forget peer `global`'s `eject_slow` figure.
    pub(crate) fn forget_figure(&self, global: usize) {
        if let Some(l) = self.latency.as_deref() {
            l.forget(global);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn rule() -> EjectSlow {
        EjectSlow {
            factor: 3.0,
            window: Duration::from_secs(10),
            min_requests: 20,
            min: Duration::from_millis(10),
            max: None,
        }
    }

    #[test]
    fn a_peer_far_above_the_others_median_is_slow() {
        let ms = |m: u64| Some((m * 1000, 50));
        // 300 ms among 1 ms peers.
        assert_eq!(
            judge(&rule(), &[ms(1), ms(300), ms(1), ms(1)]),
            vec![(1, 300_000, 1_000, false)]
        );
        // Two peers: each is judged against the other.
        assert_eq!(
            judge(&rule(), &[ms(1), ms(300)]),
            vec![(1, 300_000, 1_000, false)]
        );
        // Three peers, two slow: the median of each one's others is the
        // other slow one or the mean of slow and fast, so nobody is ejected.
        assert!(judge(&rule(), &[ms(300), ms(300), ms(1)]).is_empty());
        // Under the floor nobody is slow (3 ms among 0.1 ms peers).
        let us = |u: u64| Some((u, 50));
        assert!(judge(&rule(), &[us(100), us(3_000), us(100)]).is_empty());
    }

    #[test]
    fn too_few_requests_are_neither_judged_nor_counted() {
        let few = Some((300_000, 19));
        let ok = Some((1_000, 20));
        assert!(judge(&rule(), &[ok, few]).is_empty(), "19 < 20 requests");
        assert!(
            judge(&rule(), &[Some((300_000, 20)), Some((1_000, 19))]).is_empty(),
            "no other peer with enough requests to compare with"
        );
        assert!(judge(&rule(), &[Some((300_000, 20)), None]).is_empty());
        assert_eq!(median(&mut [1, 4]), Some(2));
        assert_eq!(median(&mut []), None);
        assert_eq!(median(&mut [u64::MAX, u64::MAX]), Some(u64::MAX));
    }

    #[test]
    fn max_makes_a_peer_slow_whatever_the_others_figures() {
        let ms = |m: u64| Some((m * 1000, 50));
        let max = EjectSlow {
            max: Some(Duration::from_millis(200)),
            ..rule()
        };
        // All three equally slow: no outlier, but all above max.
        assert_eq!(
            judge(&max, &[ms(300), ms(300), ms(150)]),
            vec![(0, 300_000, 225_000, true), (1, 300_000, 225_000, true)]
        );
        // An outlier is told as one, above max or not.
        assert_eq!(
            judge(&max, &[ms(1), ms(300), ms(1)]),
            vec![(1, 300_000, 1_000, false)]
        );
        // No sibling with enough requests to compare with: max alone
        // judges; a figure at max is not above it.
        assert_eq!(
            judge(&max, &[ms(300), Some((1_000, 3)), None]),
            vec![(0, 300_000, 0, true)]
        );
        assert!(judge(&max, &[ms(200), None]).is_empty());
        // Still not without its N requests.
        assert!(judge(&max, &[Some((900_000, 19)), ms(1)]).is_empty());
    }
}
