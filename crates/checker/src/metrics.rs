//! Probe counters and latency histograms, per target, written as
//! Prometheus text. Peer state metrics (tengine's `nginx_upstream_*` and
//! vigil's state gauge) are read from the registry by [`crate::status`].

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
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
    label: String,
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

    /// Append the checker's metrics in Prometheus text format. Targets
    /// with the same address and type (dedup off) are summed.
    pub fn write_prometheus(&self, out: &mut String) {
        let mut sums: BTreeMap<String, Sum> = BTreeMap::new();
        for s in self.targets.iter() {
            let sum = sums.entry(s.label.clone()).or_default();
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
        header(
            out,
            "vigil_probe_targets",
            "gauge",
            "Distinct probe targets being probed.",
        );
        let _ = writeln!(out, "vigil_probe_targets {}", sums.len());
        header(
            out,
            "vigil_probe_results_total",
            "counter",
            "Probe results by probed peer address, check type, result and failing phase.",
        );
        for (label, s) in &sums {
            let _ = writeln!(
                out,
                "vigil_probe_results_total{{{label},result=\"ok\",phase=\"none\"}} {}",
                s.ok
            );
            for (phase, n) in PHASES.iter().zip(s.failed) {
                let _ = writeln!(
                    out,
                    "vigil_probe_results_total{{{label},result=\"fail\",phase=\"{phase}\"}} {n}"
                );
            }
        }
        header(
            out,
            "vigil_probe_duration_seconds",
            "histogram",
            "Time one probe took, successful or not.",
        );
        for (label, s) in &sums {
            let mut cumulative = 0;
            for (le, n) in BUCKETS.iter().zip(s.buckets) {
                cumulative += n;
                let _ = writeln!(
                    out,
                    "vigil_probe_duration_seconds_bucket{{{label},le=\"{le}\"}} {cumulative}"
                );
            }
            let _ = writeln!(
                out,
                "vigil_probe_duration_seconds_bucket{{{label},le=\"+Inf\"}} {}",
                s.count
            );
            let _ = writeln!(
                out,
                "vigil_probe_duration_seconds_sum{{{label}}} {}",
                s.sum_us as f64 / 1e6
            );
            let _ = writeln!(
                out,
                "vigil_probe_duration_seconds_count{{{label}}} {}",
                s.count
            );
        }
        header(
            out,
            "vigil_probe_transitions_total",
            "counter",
            "Peer state changes caused by probes.",
        );
        let _ = writeln!(
            out,
            "vigil_probe_transitions_total{{to=\"up\"}} {}",
            self.transitions_up.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "vigil_probe_transitions_total{{to=\"down\"}} {}",
            self.transitions_down.load(Ordering::Relaxed)
        );
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("targets", &self.targets())
            .finish()
    }
}

/// `# HELP` and `# TYPE` lines.
pub(crate) fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// A Prometheus label value, escaped.
pub(crate) fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

// === impl TargetStats ===

impl TargetStats {
    fn new(key: &TargetKey) -> Self {
        Self {
            label: format!(
                "peer=\"{}\",type=\"{}\"",
                escape(&key.addr.to_string()),
                key.kind_name()
            ),
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
