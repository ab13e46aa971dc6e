//! The proxy's shared state (one configuration generation behind an
//! `ArcSwap`, swapped whole on reload) and the listeners' accept loops
//! (backing off when accept fails, see [`crate::accept`]) with graceful
//! shutdown; each connection runs under its deadline ([`crate::conn`]).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use arc_swap::ArcSwap;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use vigil_core::config::{Config, ProxySettings, ServerBlock};
use vigil_core::event::EventBus;
use vigil_core::registry::Registry;
use vigil_core::Clock;

use crate::accept::AcceptBackoff;
use crate::conn::{self, Closed, ConnState, TimedIo, Timeouts, Watched};
use crate::metrics::{GenerationStats, ProxyMetrics};
use crate::pool::Pool;
use crate::route::{RouteError, Routes};
use crate::telemetry::RequestTracer;

/// One configuration, compiled: upstreams with their state, pools, routes.
pub struct Generation {
    /// The configuration.
    pub config: Config,
    /// Its upstreams.
    pub registry: Arc<Registry>,
    /// Its routes.
    pub routes: Routes,
    pools: HashMap<String, Arc<Pool>>,
    /// Per listen address, the limits of its default server.
    listeners: HashMap<SocketAddr, ListenerDefaults>,
    /// Its counters, once the proxy has metrics.
    stats: OnceLock<Arc<GenerationStats>>,
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
    /// and unchanged upstreams keep their idle connections.
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
        let routes = Routes::build(&config, &registry, &pools)?;
        Ok(Self {
            listeners: ListenerDefaults::by_address(&config),
            config,
            registry,
            routes,
            pools,
            stats: OnceLock::new(),
        })
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

/// Accept on `listener` until `shutdown`, then let open connections finish
/// for at most `grace`.
pub async fn serve(
    proxy: Arc<Proxy>,
    listener: TcpListener,
    shutdown: CancellationToken,
    grace: Duration,
) {
    let addr = match listener.local_addr() {
        Ok(a) => a,
        Err(e) => {
            tracing::error!(error = %e, "listener has no address");
            return;
        }
    };
    serve_on(proxy, listener, addr, shutdown.clone(), shutdown, grace).await;
}

/// Accept on `listener` (the configured address `addr`) until `stop`; then
/// let its connections finish their requests and close: without limit while
/// the proxy runs (a listener removed by a reload), within `grace` once
/// `shutdown` fires.
pub(crate) async fn serve_on(
    proxy: Arc<Proxy>,
    listener: TcpListener,
    addr: SocketAddr,
    stop: CancellationToken,
    shutdown: CancellationToken,
    grace: Duration,
) {
    // Each connection holds a sender: recv() returns None once all closed.
    let (open, mut all_closed) = tokio::sync::mpsc::channel::<()>(1);
    let mut backoff = AcceptBackoff::new();
    let mut site = Site::of(&proxy.current(), addr);
    loop {
        let accepted = tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            a = listener.accept() => a,
        };
        let (stream, client) = match accepted {
            Ok(a) => a,
            Err(e) => {
                let r = backoff.on_error(&e, tokio::time::Instant::now());
                if let Some(suppressed) = r.log {
                    tracing::error!(%addr, error = %e, suppressed, retry_in = ?r.wait, "accept failed");
                } else if r.wait.is_zero() {
                    tracing::debug!(%addr, error = %e, "accept failed");
                }
                if !r.wait.is_zero() {
                    tokio::select! {
                        _ = stop.cancelled() => break,
                        _ = tokio::time::sleep(r.wait) => {}
                    }
                }
                continue;
            }
        };
        if let Some(suppressed) = backoff.on_accept(tokio::time::Instant::now()) {
            tracing::warn!(%addr, suppressed, "accepting again");
        }
        site.refresh(&proxy, addr);
        let _ = stream.set_nodelay(true);
        let state = ConnState::new(site.timeouts);
        let io = TokioIo::new(TimedIo::new(stream, state.clone()));
        let p = proxy.clone();
        let svc = conn::tracking(state.clone(), move |req| {
            crate::handler::handle(p.clone(), addr, client, req)
        });
        let conn = site
            .builder
            .serve_connection_with_upgrades(io, svc)
            .into_owned();
        let watched = Watched::new(conn, state, stop.clone());
        let open = open.clone();
        tokio::spawn(async move {
            match watched.await {
                Closed::TimedOut(why) => tracing::debug!(%client, "client timed out {why}"),
                Closed::Done(Err(e)) => {
                    tracing::debug!(%client, error = %e, "client connection ended")
                }
                Closed::Done(Ok(())) => {}
            }
            drop(open);
        });
    }
    drop(listener);
    drop(open);
    tokio::select! {
        _ = all_closed.recv() => {}
        _ = async { shutdown.cancelled().await; tokio::time::sleep(grace).await } => {
            tracing::warn!(%addr, "grace period over; closing remaining connections");
        }
    }
}

/// How connections on one address are served under one generation: its
/// default server's header limits (nginx applies them before the Host is known).
struct Site {
    generation: u64,
    builder: auto::Builder<TokioExecutor>,
    timeouts: Timeouts,
}

impl Site {
    fn of(generation: &Generation, addr: SocketAddr) -> Self {
        let d = generation
            .listeners
            .get(&addr)
            .copied()
            .unwrap_or_else(|| ListenerDefaults::of(None));
        let mut builder = auto::Builder::new(TokioExecutor::new());
        // The whole header within large_client_header_buffers (NUMBER × SIZE);
        // hyper refuses a smaller buffer than 8 KiB. No header_read_timeout:
        // the connection's deadline (crate::conn) covers the header, from accept.
        builder.http1().max_buf_size(d.max_buf);
        Self {
            generation: generation.registry.generation(),
            builder,
            timeouts: d.timeouts,
        }
    }

    /// Follow a reload.
    fn refresh(&mut self, proxy: &Proxy, addr: SocketAddr) {
        let g = proxy.current.load();
        if g.registry.generation() != self.generation {
            *self = Site::of(&g, addr);
        }
    }
}

/// The default server's settings for one address.
#[derive(Clone, Copy, Debug)]
struct ListenerDefaults {
    timeouts: Timeouts,
    max_buf: usize,
}

impl ListenerDefaults {
    /// hyper's smallest read buffer.
    const MIN_BUF: u64 = 8192;

    fn of(server: Option<&ServerBlock>) -> Self {
        let client = server.map(|s| s.client.clone()).unwrap_or_default();
        // Before a location is known: the server's first location's (which
        // inherit the server's), else nginx's defaults.
        let fallback = ProxySettings::default();
        let loc = server
            .and_then(|s| s.locations.first())
            .map_or(&fallback, |l| &l.proxy);
        let whole = u64::from(client.header_buffers).saturating_mul(client.header_buffer_size);
        Self {
            timeouts: Timeouts {
                header: client.header_timeout,
                keepalive: loc.client_keepalive_timeout,
                send: loc.client_send_timeout,
            },
            max_buf: usize::try_from(whole.max(Self::MIN_BUF)).unwrap_or(usize::MAX),
        }
    }

    /// Per listen address, its default server: the one marked
    /// `default_server`, else the first that lists the address.
    fn by_address(config: &Config) -> HashMap<SocketAddr, ListenerDefaults> {
        let mut out = HashMap::new();
        for s in &config.servers {
            for l in &s.listen {
                if l.default_server || !out.contains_key(&l.addr) {
                    out.insert(l.addr, Self::of(Some(s)));
                }
            }
        }
        out
    }
}

/// Bind a listener (with `SO_REUSEADDR`, and `SO_REUSEPORT` when asked).
pub fn bind(
    addr: SocketAddr,
    reuseport: bool,
    backlog: Option<u32>,
) -> std::io::Result<TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    if reuseport {
        socket.set_reuseport(true)?;
    }
    socket.set_nodelay(true)?;
    socket.bind(addr)?;
    socket.listen(backlog.unwrap_or(511))
}
