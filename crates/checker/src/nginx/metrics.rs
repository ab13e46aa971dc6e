//! The nginx sync loop's counters on `/metrics` (check-only mode), as a
//! `prometheus-client` collector that reads [`SyncStatus`] at scrape time.

use std::fmt;
use std::sync::{Arc, Mutex};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

use super::sync::SyncStatus;

/// Renders, reloads and what the files on disk say, read from the sync
/// loop's status at each scrape.
pub(super) struct SyncMetrics(pub(super) Arc<Mutex<SyncStatus>>);

// === impl SyncMetrics ===

impl Collector for SyncMetrics {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        // A poisoned lock (a panicked sync loop) shows nothing rather than
        // numbers that may be half updated.
        let Ok(s) = self.0.lock() else {
            return Ok(());
        };
        for (name, help, samples) in [
            (
                "vigil_nginx_renders",
                "Rendered file sets by nginx -t result.",
                [("ok", s.applied), ("rejected", s.test_failures)],
            ),
            (
                "vigil_nginx_reloads",
                "nginx reloads by result (failed includes unverified).",
                [("ok", s.reloads), ("failed", s.reload_failures)],
            ),
        ] {
            let mut m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (result, n) in samples {
                ConstCounter::new(n).encode(m.encode_family(&[("result", result)])?)?;
            }
        }
        for (name, help, v) in [
            (
                "vigil_nginx_reload_pending",
                "1 while a reload is owed to nginx.",
                u64::from(s.reload_pending),
            ),
            (
                "vigil_nginx_marked_down",
                "Servers marked down in the rendered files.",
                s.marked.len() as u64,
            ),
            (
                "vigil_nginx_kept_up",
                "Failing servers max_ejected (the minimum-healthy guard) keeps up in the rendered files.",
                s.kept.len() as u64,
            ),
            (
                "vigil_nginx_guarded_upstreams",
                "Upstreams where max_ejected (the minimum-healthy guard) keeps failing servers up.",
                s.guarded.len() as u64,
            ),
        ] {
            let m = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
            ConstGauge::new(v).encode(m)?;
        }
        Ok(())
    }
}

impl fmt::Debug for SyncMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SyncMetrics").finish()
    }
}
