//! [`super::ProxyMetrics`] as a `prometheus-client` collector: at scrape
//! time it reads the counters from the atomics and the gauges from core's
//! peer status, and hands them to the crate's encoder (Prometheus text
//! 0.0.4 or OpenMetrics, whichever the scraper asked for). Nothing here
//! runs on the request path.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabelSet, EncodeMetric, MetricEncoder, NoLabelSet,
};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType::{self, Counter, Gauge, Histogram};

use vigil_core::peer::AdminState;
use vigil_core::upstream::{Ineligible, PeerState, PeerStatus};
use vigil_core::{FailureClass, RetryDenied};

use super::stats::{class_index, Outcome, STATUS_CLASSES};
use super::{GenerationStats, PeerStats, BUCKETS};

/// The values of `vigil_peer_state`'s `state` label (core's names;
/// `awaiting_probe` and `probation` are counted as `excluded` and `full`,
/// [`state_index`]).
pub(crate) const STATES: [PeerState; 9] = [
    PeerState::Eligible,
    PeerState::Excluded,
    PeerState::ProbeDown,
    PeerState::AdminDown,
    PeerState::Draining,
    PeerState::Down,
    PeerState::Full,
    PeerState::Slow,
    PeerState::Stuck,
];

/// The values of `vigil_ejections_total`'s `rule` label, by
/// [`ejection_index`].
pub(crate) const EJECTION_RULES: [&str; 4] = ["passive", "probe_down", "slow", "stuck"];

/// The `rule` label of `vigil_rule_charges_total`, by
/// [`super::stats::rule_index`].
pub(crate) const COUNT_RULES: [&str; 2] = ["after_header", "last_try"];

/// The `# HELP` texts, shared with the OpenTelemetry descriptions.
pub(crate) mod help {
    pub(crate) const RELOADS: &str = "Configuration reloads put in force since start.";
    pub(crate) const REQUESTS: &str =
        "Client requests routed to an upstream, by the class of the status answered.";
    pub(crate) const DURATION: &str =
        "Time from a request's arrival to the response header sent to the client.";
    pub(crate) const ATTEMPTS: &str =
        "Attempts sent to a peer, by outcome (ok, or nginx's failure class).";
    pub(crate) const RETRIES: &str = "Attempts that moved a request to the next peer.";
    pub(crate) const COUNTED: &str = "Failures charged to a peer toward max_fails, by class.";
    pub(crate) const RULE_CHARGES: &str = "Failures charged by a vigil-only passive_count rule where nginx charges none (part of vigil_failures_counted_total).";
    pub(crate) const NO_LIVE: &str =
        "Requests answered 502 because no peer of the upstream was eligible.";
    pub(crate) const EJECTIONS: &str =
        "Times a health rule took the peer out, by rule: passive (max_fails), probe_down, slow (eject_slow), stuck (eject_stuck).";
    pub(crate) const EXCLUSIONS: &str =
        "Times a peer reached max_fails and was excluded for fail_timeout.";
    pub(crate) const CONNS: &str = "Requests in flight to the peer.";
    pub(crate) const STATE: &str =
        "1 for the peer's current state (the first rule in force), 0 for the others.";
    pub(crate) const FAILS: &str = "Failures counted against the peer and not yet forgiven.";
    pub(crate) const HEDGES: &str =
        "Hedges sent: the same request to a second peer while the first had not answered.";
    pub(crate) const DENIED: &str =
        "Retries and hedges core did not allow, by reason (budget: retry_budget was empty).";
}

/// What one scrape encodes: the generation in force (if any) and the
/// reload count, read when the scrape starts.
pub(super) struct Scrape {
    pub(super) generation: Option<Arc<GenerationStats>>,
    pub(super) reloads: u64,
}

// === impl Scrape ===

impl Collector for Scrape {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        if let Some(g) = &self.generation {
            counters(&mut enc, g)?;
            traffic(&mut enc, g)?;
            health(&mut enc, g)?;
            gauges(&mut enc, g)?;
        }
        let m = family(&mut enc, "vigil_reloads", help::RELOADS, Counter)?;
        ConstCounter::new(self.reloads).encode(m)
    }
}

impl fmt::Debug for Scrape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scrape")
            .field(
                "generation",
                &self.generation.as_ref().map(|g| g.registry.generation()),
            )
            .field("reloads", &self.reloads)
            .finish()
    }
}

/// A family's `# HELP` and `# TYPE` lines; its samples follow.
fn family<'s>(
    enc: &'s mut DescriptorEncoder<'_>,
    name: &'s str,
    help: &str,
    kind: MetricType,
) -> Result<MetricEncoder<'s>, fmt::Error> {
    enc.encode_descriptor(name, help, None, kind)
}

/// `upstream`, `peer` and one more label of a peer's sample.
fn peer_labels<'a>(
    p: &'a PeerStats,
    key: &'static str,
    value: &'a str,
) -> [(&'static str, &'a str); 3] {
    [("upstream", &p.upstream), ("peer", &p.peer), (key, value)]
}

fn load(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

/// One counter sample with `labels`.
fn counter(m: &mut MetricEncoder<'_>, labels: &impl EncodeLabelSet, v: u64) -> fmt::Result {
    ConstCounter::new(v).encode(m.encode_family(labels)?)
}

/// One gauge sample with `labels`.
fn gauge(m: &mut MetricEncoder<'_>, labels: &impl EncodeLabelSet, v: u64) -> fmt::Result {
    ConstGauge::new(v).encode(m.encode_family(labels)?)
}

/// The per-upstream request counters and the duration histogram.
fn counters(enc: &mut DescriptorEncoder<'_>, g: &GenerationStats) -> fmt::Result {
    let mut m = family(enc, "vigil_requests", help::REQUESTS, Counter)?;
    for t in g.upstreams.iter().map(|u| &u.totals) {
        for (i, class) in STATUS_CLASSES.iter().enumerate() {
            counter(
                &mut m,
                &[("upstream", &*t.name), ("status_class", *class)],
                t.requests(i),
            )?;
        }
    }
    let mut m = family(
        enc,
        "vigil_request_duration_seconds",
        help::DURATION,
        Histogram,
    )?;
    for t in g.upstreams.iter().map(|u| &u.totals) {
        // Non-cumulative counts per bound, then the overflow at +Inf:
        // the encoder accumulates them.
        let counts = t.buckets();
        let mut buckets = [(f64::INFINITY, 0); BUCKETS.len() + 1];
        for (b, (le, n)) in buckets.iter_mut().zip(BUCKETS.iter().zip(counts)) {
            *b = (*le, n);
        }
        if let (Some(last), Some(n)) = (buckets.last_mut(), counts.last()) {
            last.1 = *n;
        }
        let count = buckets.iter().map(|b| b.1).sum();
        let sum = t.sum_us() as f64 / 1e6;
        m.encode_family(&[("upstream", &*t.name)])?
            .encode_histogram::<NoLabelSet>(sum, count, &buckets, None)?;
    }
    let mut m = family(enc, "vigil_attempts", help::ATTEMPTS, Counter)?;
    for p in g.upstreams.iter().flat_map(|u| u.peers.iter()) {
        for o in Outcome::ALL {
            let labels = peer_labels(p, "outcome", o.as_str());
            counter(&mut m, &labels, p.attempts(o))?;
        }
    }
    let mut m = family(enc, "vigil_retries", help::RETRIES, Counter)?;
    for t in g.upstreams.iter().map(|u| &u.totals) {
        counter(&mut m, &[("upstream", &*t.name)], load(&t.retries))?;
    }
    let mut m = family(enc, "vigil_failures_counted", help::COUNTED, Counter)?;
    for p in g.upstreams.iter().flat_map(|u| u.peers.iter()) {
        for c in FailureClass::ALL.into_iter().filter(|c| c.is_counted()) {
            let labels = peer_labels(p, "class", c.as_str());
            counter(&mut m, &labels, load(&p.counted[class_index(c)]))?;
        }
    }
    let mut m = family(enc, "vigil_rule_charges", help::RULE_CHARGES, Counter)?;
    for p in g.upstreams.iter().flat_map(|u| u.peers.iter()) {
        for (rule, n) in COUNT_RULES.iter().zip(&p.by_rule) {
            let labels = peer_labels(p, "rule", rule);
            counter(&mut m, &labels, load(n))?;
        }
    }
    let mut m = family(enc, "vigil_no_live_upstreams", help::NO_LIVE, Counter)?;
    for t in g.upstreams.iter().map(|u| &u.totals) {
        counter(&mut m, &[("upstream", &*t.name)], load(&t.no_live))?;
    }
    Ok(())
}

/// `vigil_hedges_total` and `vigil_retries_denied_total`.
fn traffic(enc: &mut DescriptorEncoder<'_>, g: &GenerationStats) -> fmt::Result {
    let mut m = family(enc, "vigil_hedges", help::HEDGES, Counter)?;
    for t in g.upstreams.iter().map(|u| &u.totals) {
        counter(&mut m, &[("upstream", &*t.name)], load(&t.hedges))?;
    }
    let mut m = family(enc, "vigil_retries_denied", help::DENIED, Counter)?;
    for t in g.upstreams.iter().map(|u| &u.totals) {
        for why in RetryDenied::ALL {
            let labels = [("upstream", &*t.name), ("reason", why.as_str())];
            counter(&mut m, &labels, load(&t.denied[why.index()]))?;
        }
    }
    Ok(())
}

/// `vigil_exclusions_total` and `vigil_ejections_total`.
fn health(enc: &mut DescriptorEncoder<'_>, g: &GenerationStats) -> fmt::Result {
    let mut m = family(enc, "vigil_exclusions", help::EXCLUSIONS, Counter)?;
    for p in g.upstreams.iter().flat_map(|u| u.peers.iter()) {
        counter(
            &mut m,
            &[("upstream", &*p.upstream), ("peer", &*p.peer)],
            load(&p.exclusions),
        )?;
    }
    let mut m = family(enc, "vigil_ejections", help::EJECTIONS, Counter)?;
    for p in g.upstreams.iter().flat_map(|u| u.peers.iter()) {
        for (rule, n) in EJECTION_RULES.iter().zip(&p.ejections) {
            let labels = peer_labels(p, "rule", rule);
            counter(&mut m, &labels, load(n))?;
        }
    }
    Ok(())
}

/// The per-peer gauges, read from core's peer status (once per peer per
/// scrape, at one `now`).
fn gauges(enc: &mut DescriptorEncoder<'_>, g: &GenerationStats) -> fmt::Result {
    let now = g.clock.now();
    let statuses: Vec<_> = g
        .registry
        .upstreams()
        .iter()
        .map(|up| up.status(now))
        .collect();
    let peers = || {
        statuses
            .iter()
            .zip(&g.upstreams)
            .flat_map(|(st, stats)| st.iter().zip(stats.peers.iter()))
    };
    let mut m = family(enc, "vigil_peer_active_connections", help::CONNS, Gauge)?;
    for (s, p) in peers() {
        gauge(
            &mut m,
            &[("upstream", &*p.upstream), ("peer", &*p.peer)],
            u64::from(s.peer.conns()),
        )?;
    }
    let mut m = family(enc, "vigil_peer_state", help::STATE, Gauge)?;
    for (s, p) in peers() {
        let current = state_index(s);
        for (i, name) in STATES.iter().enumerate() {
            let labels = peer_labels(p, "state", name.as_str());
            gauge(&mut m, &labels, u64::from(i == current))?;
        }
    }
    let mut m = family(enc, "vigil_peer_fails", help::FAILS, Gauge)?;
    for (s, p) in peers() {
        let labels = [("upstream", &*p.upstream), ("peer", &*p.peer)];
        gauge(&mut m, &labels, u64::from(s.passive.fails))?;
    }
    Ok(())
}

/// The position in [`STATES`] of the first rule keeping the peer out, as
/// the admin API names it.
pub(crate) fn state_index(s: &PeerStatus) -> usize {
    match s.reasons.first() {
        None => 0,
        // core's `awaiting_probe` is still a passive exclusion, and
        // `probation` (its one request in flight) a concurrency limit.
        Some(Ineligible::Excluded { .. } | Ineligible::AwaitingProbe { .. }) => 1,
        Some(Ineligible::ProbeDown { .. }) => 2,
        Some(Ineligible::Admin { state, .. }) if *state == AdminState::Drain => 4,
        Some(Ineligible::Admin { .. }) => 3,
        Some(Ineligible::ConfigDown) => 5,
        Some(Ineligible::Full { .. } | Ineligible::Probation { .. }) => 6,
        Some(Ineligible::Slow { .. }) => 7,
        Some(Ineligible::Stuck { .. }) => 8,
    }
}

/// The position in [`EJECTION_RULES`] of an event that ejects a peer.
pub(crate) fn ejection_index(kind: &vigil_core::event::EventKind) -> Option<usize> {
    use vigil_core::event::EventKind;
    match kind {
        EventKind::Excluded { .. } => Some(0),
        EventKind::ProbeDown { .. } => Some(1),
        EventKind::SlowEjected { .. } => Some(2),
        EventKind::Stuck { .. } => Some(3),
        _ => None,
    }
}
