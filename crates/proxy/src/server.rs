//! The proxy's shared state (one configuration generation behind an
//! `ArcSwap`, swapped whole on reload) and the listeners' accept loops with
//! graceful shutdown.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use arc_swap::ArcSwap;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use vigil_core::config::Config;
use vigil_core::event::EventBus;
use vigil_core::registry::Registry;
use vigil_core::Clock;

use crate::metrics::{GenerationStats, ProxyMetrics};
use crate::pool::Pool;
use crate::request_check::{gate, Verdict};
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
    let local = match listener.local_addr() {
        Ok(a) => a,
        Err(e) => {
            tracing::error!(error = %e, "listener has no address");
            return;
        }
    };
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, client) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // EMFILE and friends: back off instead of spinning.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let watcher = graceful.watcher();
                tokio::spawn(serve_one(proxy.clone(), stream, local, client, Some(watcher)));
            }
            _ = shutdown.cancelled() => break,
        }
    }
    drop(listener);
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(grace) => {
            tracing::warn!(%local, "grace period over; closing remaining connections");
        }
    }
}

/// Serve one client connection on `io` (any byte stream: a socket, or one
/// end of `tokio::io::duplex`) until it closes, as [`serve`] serves each
/// accepted one: request heads judged as nginx judges them
/// ([`crate::request_check`]), then HTTP/1.1 or HTTP/2. `local` is the
/// address it arrived on (it picks the server block), `client` the peer's.
pub async fn serve_connection<I>(proxy: Arc<Proxy>, io: I, local: SocketAddr, client: SocketAddr)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    serve_one(proxy, io, local, client, None).await;
}

async fn serve_one<I>(
    proxy: Arc<Proxy>,
    io: I,
    local: SocketAddr,
    client: SocketAddr,
    watcher: Option<hyper_util::server::graceful::Watcher>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let limits = gate::limits_for(&proxy.current().config, local);
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // nginx's client_header_timeout (60s): a client that opens a connection
    // and sends no complete header is cut off. The gate bounds the head by
    // large_client_header_buffers; hyper's own limit sits above it.
    builder
        .http1()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(Duration::from_secs(60))
        .max_buf_size(
            limits
                .max_head()
                .saturating_add(16 * 1024)
                .max(8192 + 4096 * 100),
        );
    let verdicts = gate::Verdicts::default();
    let io = gate::Gate::new(io, limits, verdicts.clone());
    let svc = service_fn(move |req| {
        let proxy = proxy.clone();
        let admitted = verdicts.admit(req);
        async move {
            let req = match admitted {
                Ok(req) => req,
                Err(status) => return Ok::<_, Infallible>(gate::refused(status)),
            };
            let verdict = req.extensions().get::<Verdict>().copied();
            let mut resp = crate::handler::handle(proxy, local, client, req).await;
            gate::close_if_blind(verdict.as_ref(), &mut resp);
            Ok(resp)
        }
    });
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), svc);
    match watcher {
        Some(w) => {
            let _ = w.watch(conn.into_owned()).await;
        }
        None => {
            let _ = conn.await;
        }
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
