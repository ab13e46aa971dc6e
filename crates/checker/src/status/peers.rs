//! The peer gauges of `/metrics`, as a `prometheus-client` collector read
//! at scrape time: tengine's `nginx_upstream_*` series (the same samples as
//! `/status?format=prometheus`, unfiltered), then vigil's `vigil_peer_up`
//! and `vigil_peer_probe_decided` for every checked peer.

use std::fmt;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabel, EncodeLabelSet, EncodeMetric, LabelSetEncoder,
};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use vigil_core::health::{HealthState, HealthView};

use super::format::{rows, Row};
use super::RegistryFn;

/// The peer gauges over whatever registry the page's source returns at
/// each scrape ([`super::StatusPage::prometheus_registry`] registers it).
pub(super) struct PeerMetrics {
    pub(super) registry: RegistryFn,
}

/// tengine's label set of one server: `index`, `upstream`, `name`,
/// `status` (on rise and fall only), `type`, `port`.
struct ServerLabels<'a> {
    row: &'a Row,
    status: bool,
}

// === impl PeerMetrics ===

impl Collector for PeerMetrics {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        let registry = (self.registry)();
        let rows = rows(&registry);
        let up = rows.iter().filter(|r| r.up).count() as u64;
        let total = rows.len() as u64;
        for (name, help, value) in [
            (
                "nginx_upstream_count_total",
                "Nginx total number of servers",
                total,
            ),
            (
                "nginx_upstream_count_up",
                "Nginx total number of servers that are UP",
                up,
            ),
            (
                "nginx_upstream_count_down",
                "Nginx total number of servers that are DOWN",
                total - up,
            ),
            (
                "nginx_upstream_count_generation",
                "Nginx generation",
                registry.generation(),
            ),
        ] {
            let m = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
            ConstGauge::new(value).encode(m)?;
        }
        for (name, help, status, value) in [
            (
                "nginx_upstream_server_rise",
                "Nginx rise counter",
                true,
                (|r: &Row| u64::from(r.rise)) as fn(&Row) -> u64,
            ),
            (
                "nginx_upstream_server_fall",
                "Nginx fall counter",
                true,
                |r| u64::from(r.fall),
            ),
            (
                "nginx_upstream_server_active",
                "Nginx active 1 for UP / 0 for DOWN",
                false,
                |r| u64::from(r.up),
            ),
        ] {
            let mut m = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for row in &rows {
                let labels = ServerLabels { row, status };
                ConstGauge::new(value(row)).encode(m.encode_family(&labels)?)?;
            }
        }
        let checked = || {
            registry
                .upstreams()
                .iter()
                .filter(|up| up.config().check.is_some())
                .flat_map(|up| up.peers().iter().map(move |p| (up, p)))
        };
        let up_help = "1 when active checks let traffic to the peer, 0 when they say down.";
        for (name, help, value) in [
            (
                "vigil_peer_up",
                up_help,
                (|v: &HealthView| v.state != Some(HealthState::Down)) as fn(&HealthView) -> bool,
            ),
            (
                "vigil_peer_probe_decided",
                "1 once the peer has a probe result.",
                |v| v.decided,
            ),
        ] {
            let mut m = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for (up, peer) in checked() {
                let labels = [("upstream", &**up.name()), ("peer", &**peer.name())];
                let v = u64::from(value(&peer.health().view()));
                ConstGauge::new(v).encode(m.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for PeerMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PeerMetrics").finish()
    }
}

// === impl ServerLabels ===

impl EncodeLabelSet for ServerLabels<'_> {
    fn encode(&self, enc: &mut LabelSetEncoder) -> fmt::Result {
        let r = self.row;
        ("index", r.index).encode(enc.encode_label())?;
        ("upstream", &*r.upstream).encode(enc.encode_label())?;
        ("name", &*r.name).encode(enc.encode_label())?;
        if self.status {
            ("status", if r.up { "up" } else { "down" }).encode(enc.encode_label())?;
        }
        ("type", r.kind).encode(enc.encode_label())?;
        ("port", r.port).encode(enc.encode_label())
    }
}
