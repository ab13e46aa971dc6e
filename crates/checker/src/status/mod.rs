//! The status endpoints, as a hyper service over a registry, so that
//! `vigil check` serves them on `--status-listen` and `vigil serve` can
//! mount them on its admin listener:
//!
//! - `GET /status?format=html|csv|json|prometheus&status=up|down`:
//!   tengine's `check_status` page, same layout and field names;
//! - `GET /metrics`: the page's `prometheus-client` registry (tengine's
//!   `nginx_upstream_*`, vigil's per-peer state, the checker's probe
//!   counters and latency histogram, and whatever the caller registered),
//!   in Prometheus text 0.0.4, or in OpenMetrics text when the scraper's
//!   `Accept` asks for `application/openmetrics-text`.

pub mod format;
mod peers;

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use vigil_core::registry::Registry;

use crate::{Checker, Metrics};
use format::Filter;

type RegistryFn = Arc<dyn Fn() -> Arc<Registry> + Send + Sync>;

/// The `Content-Type` of OpenMetrics text, served when asked for.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The status endpoints over one registry source.
#[derive(Clone)]
pub struct StatusPage {
    registry: RegistryFn,
    /// What `/metrics` encodes.
    prometheus: Arc<prometheus_client::registry::Registry>,
}

// === impl StatusPage ===

impl StatusPage {
    /// Endpoints over whatever registry `registry` returns at each request;
    /// `/metrics` shows the peer gauges.
    pub fn new(registry: impl Fn() -> Arc<Registry> + Send + Sync + 'static) -> Self {
        let registry: RegistryFn = Arc::new(registry);
        let prometheus = Arc::new(peer_registry(&registry, None));
        Self {
            registry,
            prometheus,
        }
    }

    /// Endpoints over a checker's registry; `/metrics` shows the peer
    /// gauges and the probe counters.
    pub fn for_checker(checker: Arc<Checker>) -> Self {
        let metrics = checker.metrics().clone();
        let page = Self::new(move || checker.registry());
        let prometheus = page.prometheus_registry(Some(metrics));
        page.with_prometheus(Arc::new(prometheus))
    }

    /// A new `prometheus-client` registry holding this page's peer gauges
    /// and, when given, the checker's probe counters: register more
    /// collectors on it (the proxy's, the nginx sync's) and hand it back
    /// with [`StatusPage::with_prometheus`].
    pub fn prometheus_registry(
        &self,
        probes: Option<Arc<Metrics>>,
    ) -> prometheus_client::registry::Registry {
        peer_registry(&self.registry, probes)
    }

    /// Encode `registry` on `/metrics` (instead of the peer gauges alone).
    pub fn with_prometheus(mut self, registry: Arc<prometheus_client::registry::Registry>) -> Self {
        self.prometheus = registry;
        self
    }

    /// Answer one request (the body is not read).
    pub fn respond<B>(&self, req: &Request<B>) -> Response<Full<Bytes>> {
        let head = req.method() == Method::HEAD;
        if req.method() != Method::GET && !head {
            let mut r = text(
                StatusCode::METHOD_NOT_ALLOWED,
                "text/plain",
                "GET or HEAD only\n",
            );
            r.headers_mut()
                .insert(header::ALLOW, header::HeaderValue::from_static("GET, HEAD"));
            return r;
        }
        let query = req.uri().query().unwrap_or("");
        let mut resp = match req.uri().path() {
            "/status" | "/status/" => self.status(query),
            "/metrics" => {
                let mut r = if wants_openmetrics(req) {
                    text(
                        StatusCode::OK,
                        OPENMETRICS_CONTENT_TYPE,
                        self.openmetrics_text(),
                    )
                } else {
                    let ct = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;
                    text(StatusCode::OK, ct, self.metrics_text())
                };
                // The format depends on `Accept`: caches must know.
                r.headers_mut()
                    .insert(header::VARY, header::HeaderValue::from_static("accept"));
                r
            }
            _ => text(
                StatusCode::NOT_FOUND,
                "text/plain",
                "not found: try /status or /metrics\n",
            ),
        };
        if head {
            *resp.body_mut() = Full::new(Bytes::new());
        }
        resp
    }

    fn status(&self, query: &str) -> Response<Full<Bytes>> {
        let mut format = "html".to_string();
        let mut filter = Filter::All;
        for pair in query.split('&') {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            match k {
                "format" => format = v.to_ascii_lowercase(),
                "status" => {
                    filter = match v.to_ascii_lowercase().as_str() {
                        "up" => Filter::Up,
                        "down" => Filter::Down,
                        _ => Filter::All,
                    }
                }
                _ => {}
            }
        }
        let registry = (self.registry)();
        let rows = format::rows(&registry);
        let generation = registry.generation();
        match format.as_str() {
            "csv" => text(StatusCode::OK, "text/plain", format::csv(&rows, filter)),
            "json" => text(
                StatusCode::OK,
                "application/json",
                format::json(&rows, filter, generation),
            ),
            "prometheus" => text(
                StatusCode::OK,
                "text/plain",
                format::prometheus(&rows, filter, generation),
            ),
            _ => text(
                StatusCode::OK,
                "text/html",
                format::html(&rows, filter, generation),
            ),
        }
    }

    /// The whole `/metrics` text, Prometheus text format 0.0.4.
    pub fn metrics_text(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail, and the collectors fail only
        // when their writer does.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &self.prometheus);
        out
    }

    /// The whole `/metrics` text, OpenMetrics text format 1.0.0 (ends
    /// with `# EOF`).
    pub fn openmetrics_text(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.prometheus);
        out
    }

    /// Serve on `listener` until `shutdown` (open connections close then too).
    pub async fn serve(self, listener: TcpListener, shutdown: CancellationToken) {
        let builder = auto::Builder::new(TokioExecutor::new());
        let addr = match listener.local_addr() {
            Ok(a) => a,
            Err(e) => {
                tracing::error!(error = %e, "status listener has no address");
                return;
            }
        };
        let open = TaskTracker::new();
        vigil_net::accept_loop(&listener, "status", addr, &shutdown, &open, |stream, _| {
            let page = self.clone();
            let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
                let page = page.clone();
                async move { Ok::<_, Infallible>(page.respond(&req)) }
            });
            let conn = builder
                .serve_connection(TokioIo::new(stream), svc)
                .into_owned();
            let stop = shutdown.clone();
            Some(async move {
                tokio::select! {
                    _ = conn => {}
                    _ = stop.cancelled() => {}
                }
            })
        })
        .await;
    }
}

impl std::fmt::Debug for StatusPage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusPage").finish()
    }
}

/// The peer gauges, then the probe counters when given.
fn peer_registry(
    registry: &RegistryFn,
    probes: Option<Arc<Metrics>>,
) -> prometheus_client::registry::Registry {
    let mut out = prometheus_client::registry::Registry::default();
    out.register_collector(Box::new(peers::PeerMetrics {
        registry: registry.clone(),
    }));
    if let Some(m) = probes {
        out.register_collector(Box::new(m));
    }
    out
}

/// Whether the scraper's `Accept` names OpenMetrics text (Prometheus
/// sends it first, with a weight; curl sends `*/*` and gets 0.0.4).
fn wants_openmetrics<B>(req: &Request<B>) -> bool {
    req.headers()
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|media| {
            let mut params = media.split(';').map(str::trim);
            let kind = params.next().unwrap_or("");
            kind.eq_ignore_ascii_case("application/openmetrics-text")
                && !params.any(|p| {
                    let q = p.strip_prefix("q=").or_else(|| p.strip_prefix("Q="));
                    q.and_then(|q| q.trim().parse::<f32>().ok()) == Some(0.0)
                })
        })
}

fn text(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    r
}
