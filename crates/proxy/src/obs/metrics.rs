//! The proxy's request metrics: counters kept in atomics, made once per
//! configuration generation (the request path holds them and does a
//! `fetch_add`: no lookup, no lock, no allocation), encoded for `/metrics`
//! by `prometheus-client` through a [`Collector`] that reads the atomics at
//! scrape time, and read by the OpenTelemetry exporter (the `telemetry` module)
//! from the same atomics, so nothing is counted twice.
//!
//! | name | type | labels | meaning |
//! |------|------|--------|---------|
//! | `vigil_requests_total` | counter | `upstream`, `status_class` | client requests routed to the upstream, by the class (`1xx`…`5xx`) of the status the client got (the upstream's, or vigil's 502/504/413/...) |
//! | `vigil_request_duration_seconds` | histogram | `upstream` | time from the request's arrival to the response header sent to the client (not the body) |
//! | `vigil_attempts_total` | counter | `upstream`, `peer`, `outcome` | attempts sent to a peer, by outcome: `ok` (a response header whose status `proxy_next_upstream` cannot name), `error`, `timeout`, `invalid_header` (no usable header), `http_500`…`http_429` (a header with that status, retried or not) |
//! | `vigil_retries_total` | counter | `upstream` | attempts that moved the request to the next peer |
//! | `vigil_failures_counted_total` | counter | `upstream`, `peer`, `class` | failures charged toward `max_fails`: every transport failure, and a listed status that was retried (never `http_403`/`http_404`) |
//! | `vigil_hedges_total` | counter | `upstream` | hedges sent (`hedge`): the request went to a second peer while the first had not answered |
//! | `vigil_retries_denied_total` | counter | `upstream`, `reason` | retries and hedges core did not allow, by reason: `tries`, `single_server`, `not_listed`, `non_idempotent`, `body_not_replayable`, `timeout`, `budget` (`retry_budget` empty), `no_peer` (a hedge found no other eligible peer), `not_safe` (a hedge of a request that may run only once at a time: a method other than GET, HEAD, OPTIONS, TRACE, or a body) |
//! | `vigil_no_live_upstreams_total` | counter | `upstream` | requests answered 502 because no peer was eligible ("no live upstreams") |
//! | `vigil_exclusions_total` | counter | `upstream`, `peer` | times the peer reached `max_fails` and was excluded for `fail_timeout` |
//! | `vigil_ejections_total` | counter | `upstream`, `peer`, `rule` | times a health rule took the peer out: `passive` (max_fails, as `vigil_exclusions_total`), `probe_down`, `slow` (`eject_slow`), `stuck` (`eject_stuck`) |
//! | `vigil_peer_active_connections` | gauge | `upstream`, `peer` | requests in flight to the peer now |
//! | `vigil_peer_state` | gauge | `upstream`, `peer`, `state` | 1 for the peer's state now, 0 for the others: `eligible`, `excluded`, `probe_down`, `admin_down`, `draining`, `down` (in the config), `full` (`max_conns`), `slow` (`eject_slow`), `stuck` (`eject_stuck`); the first rule in force wins, as in `vigil status` |
//! | `vigil_peer_fails` | gauge | `upstream`, `peer` | failures counted and not yet forgiven (nginx's `fails`) |
//! | `vigil_reloads_total` | counter | — | configuration reloads put in force since start |
//!
//! `peer` is the server's address as written in the configuration (a
//! second server line with the same address gets `#2`, and so on). Counters
//! of an upstream or peer that survives a reload keep counting; those of
//! a removed one disappear from the output.

mod collector;
mod stats;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use arc_swap::ArcSwapOption;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use vigil_core::event::{Event, EventKind};
use vigil_core::registry::Registry;
use vigil_core::Clock;

pub(crate) use collector::{help, state_index, COUNT_RULES, EJECTION_RULES, STATES as PEER_STATES};
pub(crate) use stats::{class_index, Outcome, PeerStats, UpstreamStats, BUCKETS, STATUS_CLASSES};

/// The proxy's metrics over every configuration generation it served.
#[derive(Default)]
pub struct ProxyMetrics {
    current: ArcSwapOption<GenerationStats>,
    attaching: Mutex<()>,
    reloads: AtomicU64,
}

/// The counters of one generation, aligned with its registry's upstreams.
pub(crate) struct GenerationStats {
    pub(crate) registry: Arc<Registry>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) upstreams: Vec<Arc<UpstreamStats>>,
    by_name: HashMap<Arc<str>, usize>,
}

// === impl ProxyMetrics ===

impl ProxyMetrics {
    /// Metrics with no generation yet ([`crate::Proxy::with_metrics`] attaches them).
    pub fn new() -> Self {
        Self::default()
    }

    /// Append these metrics alone in Prometheus text format 0.0.4, as
    /// `prometheus-client` encodes them (for tests and tools; `/metrics`
    /// registers the metrics themselves as a [`Collector`]).
    pub fn write_prometheus(&self, out: &mut String) {
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(self.scrape()));
        // Writing to a String cannot fail, and the collector only fails
        // when its writer does.
        let _ = prometheus_client::encoding::prometheus_text::encode(out, &registry);
    }

    /// What one scrape reads: the generation in force and the reload count.
    fn scrape(&self) -> collector::Scrape {
        collector::Scrape {
            generation: self.current.load_full(),
            reloads: self.reloads(),
        }
    }

    /// Reloads put in force since the first generation.
    pub fn reloads(&self) -> u64 {
        self.reloads.load(Ordering::Relaxed)
    }

    /// The counters for `registry`'s generation: made on first sight,
    /// keeping the counters of every upstream and peer (by name) that the
    /// previous generation had. A new registry after the first counts as a reload.
    pub(crate) fn attach(
        &self,
        registry: &Arc<Registry>,
        clock: &Arc<dyn Clock>,
    ) -> Arc<GenerationStats> {
        let _one_at_a_time = self
            .attaching
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let previous = self.current.load_full();
        if let Some(p) = previous
            .as_ref()
            .filter(|p| Arc::ptr_eq(&p.registry, registry))
        {
            return p.clone();
        }
        let next = Arc::new(GenerationStats::build(
            registry,
            clock.clone(),
            previous.as_deref(),
        ));
        if previous.is_some() {
            self.reloads.fetch_add(1, Ordering::Relaxed);
        }
        self.current.store(Some(next.clone()));
        next
    }

    /// The generation in force, if any was attached.
    pub(crate) fn current(&self) -> Option<Arc<GenerationStats>> {
        self.current.load_full()
    }

    /// Count an exclusion or another ejection (called for every event on the bus).
    pub(crate) fn on_event(&self, event: &Event) {
        let Some(rule) = collector::ejection_index(&event.kind) else {
            return;
        };
        let current = self.current.load();
        let peer = current
            .as_ref()
            .and_then(|g| g.upstream(&event.upstream))
            .and_then(|u| u.peers.iter().find(|p| p.addr == event.peer));
        if let Some(p) = peer {
            if matches!(event.kind, EventKind::Excluded { .. }) {
                p.exclusions.fetch_add(1, Ordering::Relaxed);
            }
            p.ejections[rule].fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// At each scrape: every metric of the generation in force, then
/// `vigil_reloads_total` (only that one before the first generation).
impl Collector for ProxyMetrics {
    fn encode(&self, encoder: DescriptorEncoder) -> std::fmt::Result {
        self.scrape().encode(encoder)
    }
}

impl std::fmt::Debug for ProxyMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let current = self.current.load();
        f.debug_struct("ProxyMetrics")
            .field(
                "generation",
                &current.as_ref().map(|g| g.registry.generation()),
            )
            .field("reloads", &self.reloads())
            .finish()
    }
}

// === impl GenerationStats ===

impl GenerationStats {
    fn build(
        registry: &Arc<Registry>,
        clock: Arc<dyn Clock>,
        previous: Option<&GenerationStats>,
    ) -> Self {
        let mut upstreams = Vec::with_capacity(registry.upstreams().len());
        let mut by_name = HashMap::new();
        for up in registry.upstreams() {
            let old = previous.and_then(|p| p.upstream(up.name()));
            by_name.insert(up.name().clone(), upstreams.len());
            upstreams.push(Arc::new(UpstreamStats::build(up, old.map(|o| &**o))));
        }
        Self {
            registry: registry.clone(),
            clock,
            upstreams,
            by_name,
        }
    }

    /// The counters of the upstream called `name`.
    pub(crate) fn upstream(&self, name: &str) -> Option<&Arc<UpstreamStats>> {
        self.by_name.get(name).and_then(|&i| self.upstreams.get(i))
    }

    /// The counters of the upstream called `name`, found first at
    /// `index`, its place in the registry's list (where a route of this
    /// generation found it): per request, without hashing the name.
    pub(crate) fn upstream_at(&self, index: usize, name: &str) -> Option<&Arc<UpstreamStats>> {
        match self.upstreams.get(index) {
            Some(s) if *s.totals.name == *name => Some(s),
            _ => self.upstream(name),
        }
    }
}
