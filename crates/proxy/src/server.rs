//! The proxy's shared state: one configuration generation behind an
//! `ArcSwap`, swapped whole on reload.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use arc_swap::ArcSwap;
use vigil_core::config::Config;
use vigil_core::event::EventBus;
use vigil_core::registry::Registry;
use vigil_core::Clock;

use crate::conn::tls::{TlsSite, TlsSites};
use crate::conn::DefaultServer;
use crate::nginx::route::{RouteError, Routes};
use crate::obs::metrics::{GenerationStats, ProxyMetrics};
use crate::obs::telemetry::RequestTracer;
use crate::upstream::pool::Pool;

/// One configuration, compiled: upstreams with their state, pools, routes.
pub struct Generation {
    /// The configuration.
    pub config: Config,
    /// Its upstreams.
    pub registry: Arc<Registry>,
    /// Its routes.
    pub(crate) routes: Routes,
    pools: HashMap<String, Arc<Pool>>,
    /// Its TLS addresses, certificates loaded.
    tls: TlsSites,
    /// Its counters, once the proxy has metrics.
    stats: OnceLock<Arc<GenerationStats>>,
    /// Its `limit_req_zone`s and `limit_conn_zone`s.
    zones: crate::nginx::limit::Zones,
}

/// The running proxy.
pub struct Proxy {
    current: ArcSwap<Generation>,
    clock: Arc<dyn Clock>,
    events: Arc<EventBus>,
    spool_dir: PathBuf,
    metrics: Option<Arc<ProxyMetrics>>,
    tracer: Option<RequestTracer>,
    reloads: AtomicU64,
}

// === impl Generation ===

impl Generation {
    /// Compile `config`. With `previous`, unchanged peers keep their state
    /// and unchanged upstreams keep their idle connections. Certificates
    /// are loaded here: a bad one fails the build (a reload keeps the
    /// generation in force).
    pub fn build(
        config: Config,
        previous: Option<&Generation>,
        events: Arc<EventBus>,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, RouteError> {
        let registry = Arc::new(Registry::build(
            &config,
            previous.map(|p| &*p.registry),
            events,
            clock,
        ));
        let pools: HashMap<String, Arc<Pool>> = config
            .upstreams
            .iter()
            .map(|u| {
                let kept = previous.and_then(|p| {
                    let same = p.config.upstream(&u.name) == Some(u);
                    same.then(|| p.pools.get(&u.name).cloned()).flatten()
                });
                (
                    u.name.clone(),
                    kept.unwrap_or_else(|| Arc::new(Pool::new(u))),
                )
            })
            .collect();
        let zones = crate::nginx::limit::Zones::build(&config, previous.map(|p| &p.zones));
        let routes = Routes::build_with(&config, &registry, &pools, &zones)?;
        let tls = TlsSites::build(&config)?;
        Ok(Self {
            config,
            registry,
            routes,
            pools,
            tls,
            stats: OnceLock::new(),
            zones,
        })
    }

    /// The limits in force on `addr` before a request is routed.
    pub(crate) fn default_server(&self, addr: SocketAddr) -> DefaultServer {
        let block = self
            .routes
            .default_server(addr)
            .and_then(|i| self.config.servers.get(i));
        DefaultServer::of(block)
    }

    /// The TLS settings of `addr`, when it is a TLS address.
    pub(crate) fn tls_site(&self, addr: SocketAddr) -> Option<Arc<TlsSite>> {
        self.tls.site(addr)
    }

    /// Its counters (None when the proxy has no metrics).
    pub(crate) fn stats(&self) -> Option<&Arc<GenerationStats>> {
        self.stats.get()
    }
}

// === impl Proxy ===

impl Proxy {
    /// A proxy serving `generation`.
    pub fn new(
        generation: Generation,
        events: Arc<EventBus>,
        clock: Arc<dyn Clock>,
        spool_dir: PathBuf,
    ) -> Self {
        Self {
            current: ArcSwap::from_pointee(generation),
            clock,
            events,
            spool_dir,
            metrics: None,
            tracer: None,
            reloads: AtomicU64::new(0),
        }
    }

    /// Count requests, attempts, retries and failures into `metrics`
    /// (and exclusions from the event bus), from now on and across reloads.
    pub fn with_metrics(mut self, metrics: Arc<ProxyMetrics>) -> Self {
        let generation = self.current();
        let _ = generation
            .stats
            .set(metrics.attach(&generation.registry, &self.clock));
        let weak = Arc::downgrade(&metrics);
        self.events.subscribe(move |e| {
            if let Some(m) = weak.upgrade() {
                m.on_event(e);
            }
        });
        self.metrics = Some(metrics);
        self
    }

    /// Make a span per request (and one per attempt) with `tracer`.
    pub fn with_tracer(mut self, tracer: RequestTracer) -> Self {
        self.tracer = Some(tracer);
        self
    }

    /// The metrics, if any.
    pub fn metrics(&self) -> Option<&Arc<ProxyMetrics>> {
        self.metrics.as_ref()
    }

    /// The request tracer, when traces are exported.
    pub(crate) fn tracer(&self) -> Option<&RequestTracer> {
        self.tracer.as_ref()
    }

    /// Reloads put in force since start.
    pub fn reloads(&self) -> u64 {
        self.reloads.load(Ordering::Relaxed)
    }

    /// The generation in force.
    pub fn current(&self) -> Arc<Generation> {
        self.current.load_full()
    }

    /// The clock rules run on.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// The event bus.
    pub fn events(&self) -> &Arc<EventBus> {
        &self.events
    }

    /// Where large request bodies are spooled.
    pub fn spool_dir(&self) -> &Path {
        &self.spool_dir
    }

    /// Replace the configuration; in-flight requests finish on the old one.
    pub fn reload(&self, config: Config) -> Result<u64, RouteError> {
        let old = self.current();
        let next = Generation::build(config, Some(&old), self.events.clone(), self.clock.clone())?;
        if let Some(m) = &self.metrics {
            let _ = next.stats.set(m.attach(&next.registry, &self.clock));
        }
        let generation = next.registry.generation();
        self.current.store(Arc::new(next));
        self.reloads.fetch_add(1, Ordering::Relaxed);
        Ok(generation)
    }
}
