//! Probe counters and latency histograms, per target, kept in atomics
//! that each probe task holds (no lookup per probe) and encoded for
//! `/metrics` by `prometheus-client` through [`Metrics`]'s [`Collector`],
//! which reads them at scrape time. Peer state metrics (tengine's
//! `nginx_upstream_*` and vigil's state gauges) are read from the registry
//! by [`crate::status`].

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use vigil_core::health::ProbePhase;

use crate::TargetKey;

/// Histogram bucket bounds, in seconds.
const BUCKETS: [f64; 13] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

const PHASES: [ProbePhase; 6] = [
    ProbePhase::Connect,
    ProbePhase::Tls,
    ProbePhase::Send,
    ProbePhase::FirstByte,
    ProbePhase::Status,
    ProbePhase::Body,
];

/// The checker's own counters.
#[derive(Default)]
pub struct Metrics {
    /// Every probe task looks its target up here when it starts (and after
    /// a reload), while the metrics endpoint reads them all: a sharded
    /// concurrent map, so neither waits on the other.
    targets: DashMap<TargetKey, Arc<TargetStats>>,
    transitions_up: AtomicU64,
    transitions_down: AtomicU64,
}

/// Counters of one target.
pub(crate) struct TargetStats {
    /// The `peer` label: where the probe connects.
    /// The `addr` label: `ip:port`, or `unix:/path` for a unix-socket peer.
    addr: Arc<str>,
    /// The `type` label.
    kind: &'static str,
    ok: AtomicU64,
    failed: [AtomicU64; 6],
    buckets: [AtomicU64; 13],
    sum_us: AtomicU64,
    count: AtomicU64,
}

#[derive(Default)]
struct Sum {
    ok: u64,
    failed: [u64; 6],
    buckets: [u64; 13],
    sum_us: u64,
    count: u64,
}

// === impl Metrics ===

impl Metrics {
    /// The counters of `key`, made on first use.
    pub(crate) fn target(&self, key: &TargetKey) -> Arc<TargetStats> {
        if let Some(stats) = self.targets.get(key) {
            return Arc::clone(&stats);
        }
        self.targets
            .entry(key.clone())
            .or_insert_with(|| Arc::new(TargetStats::new(key)))
            .clone()
    }

    /// Forget targets that are no longer probed.
    pub(crate) fn retain(&self, keys: &HashSet<TargetKey>) {
        self.targets.retain(|k, _| keys.contains(k));
    }

    pub(crate) fn transition(&self, up: bool) {
        let c = if up {
            &self.transitions_up
        } else {
            &self.transitions_down
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// Targets being probed.
    pub fn targets(&self) -> usize {
        self.targets.len()
    }

    /// Probes run so far, over all targets.
    pub fn probes(&self) -> u64 {
        self.targets
            .iter()
            .map(|s| s.count.load(Ordering::Relaxed))
            .sum()
    }
}

/// At each scrape: the probe counters, targets with the same address and
/// type (dedup off) summed, and the transition counters.
impl Collector for Metrics {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        let mut sums: BTreeMap<(Arc<str>, &'static str), Sum> = BTreeMap::new();
        for s in self.targets.iter() {
            let sum = sums.entry((s.addr.clone(), s.kind)).or_default();
            sum.ok += s.ok.load(Ordering::Relaxed);
            for (a, b) in sum.failed.iter_mut().zip(&s.failed) {
                *a += b.load(Ordering::Relaxed);
            }
            for (a, b) in sum.buckets.iter_mut().zip(&s.buckets) {
                *a += b.load(Ordering::Relaxed);
            }
            sum.sum_us += s.sum_us.load(Ordering::Relaxed);
            sum.count += s.count.load(Ordering::Relaxed);
        }
        let sums: Vec<(Arc<str>, &'static str, Sum)> = sums
            .into_iter()
            .map(|((addr, kind), s)| (addr, kind, s))
            .collect();
        let m = enc.encode_descriptor(
            "vigil_probe_targets",
            "Distinct probe targets being probed.",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(sums.len() as u64).encode(m)?;
        let mut m = enc.encode_descriptor(
            "vigil_probe_results",
            "Probe results by probed peer address, check type, result and failing phase.",
            None,
            MetricType::Counter,
        )?;
        for (peer, kind, s) in &sums {
            let labels = [
                ("peer", &**peer),
                ("type", kind),
                ("result", "ok"),
                ("phase", "none"),
            ];
            ConstCounter::new(s.ok).encode(m.encode_family(&labels)?)?;
            for (phase, n) in PHASES.iter().zip(s.failed) {
                let labels = [
                    ("peer", &**peer),
                    ("type", kind),
                    ("result", "fail"),
                    ("phase", phase.as_str()),
                ];
                ConstCounter::new(n).encode(m.encode_family(&labels)?)?;
            }
        }
        let mut m = enc.encode_descriptor(
            "vigil_probe_duration_seconds",
            "Time one probe took, successful or not.",
            None,
            MetricType::Histogram,
        )?;
        for (peer, kind, s) in &sums {
            // Non-cumulative counts per bound, then what took longer than
            // the last one at +Inf: the encoder accumulates them.
            let mut buckets = [(f64::INFINITY, 0); BUCKETS.len() + 1];
            for (b, (le, n)) in buckets.iter_mut().zip(BUCKETS.iter().zip(s.buckets)) {
                *b = (*le, n);
            }
            let within: u64 = s.buckets.iter().sum();
            if let Some(last) = buckets.last_mut() {
                last.1 = s.count.saturating_sub(within);
            }
            m.encode_family(&[("peer", &**peer), ("type", kind)])?
                .encode_histogram::<NoLabelSet>(s.sum_us as f64 / 1e6, s.count, &buckets, None)?;
        }
        let mut m = enc.encode_descriptor(
            "vigil_probe_transitions",
            "Peer state changes caused by probes.",
            None,
            MetricType::Counter,
        )?;
        for (to, n) in [
            ("up", &self.transitions_up),
            ("down", &self.transitions_down),
        ] {
            ConstCounter::new(n.load(Ordering::Relaxed)).encode(m.encode_family(&[("to", to)])?)?;
        }
        Ok(())
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("targets", &self.targets())
            .finish()
    }
}

// === impl TargetStats ===

impl TargetStats {
    fn new(key: &TargetKey) -> Self {
        Self {
            addr: match &key.unix {
                Some(path) => format!("unix:{}", path.display()).into(),
                None => key.addr.to_string().into(),
            },
            kind: key.kind_name(),
            ok: AtomicU64::new(0),
            failed: Default::default(),
            buckets: Default::default(),
            sum_us: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }

    /// Count one probe.
    pub(crate) fn record(&self, failed: Option<ProbePhase>, latency: Duration) {
        match failed {
            None => self.ok.fetch_add(1, Ordering::Relaxed),
            Some(p) => {
                let i = PHASES.iter().position(|x| *x == p).unwrap_or(0);
                self.failed[i].fetch_add(1, Ordering::Relaxed)
            }
        };
        let secs = latency.as_secs_f64();
        if let Some(i) = BUCKETS.iter().position(|le| secs <= *le) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.sum_us.fetch_add(us, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests;
