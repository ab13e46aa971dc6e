//! The status endpoints, as a hyper service over a registry, so that
//! `vigil check` serves them on `--status-listen` and `vigil serve` can
//! mount them on its admin listener:
//!
//! - `GET /status?format=html|csv|json|prometheus&status=up|down`:
//!   tengine's `check_status` page, same layout and field names;
//! - `GET /metrics`: Prometheus text: tengine's `nginx_upstream_*`, vigil's
//!   per-peer state and the checker's probe counters and latency histogram.

pub mod format;

use std::convert::Infallible;
use std::fmt::Write as _;
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
use vigil_core::health::HealthState;
use vigil_core::registry::Registry;

use crate::metrics::{escape, header as help};
use crate::{Checker, Metrics};
use format::Filter;

type RegistryFn = Arc<dyn Fn() -> Arc<Registry> + Send + Sync>;
type ExtraFn = Arc<dyn Fn(&mut String) + Send + Sync>;

/// The status endpoints over one registry source.
#[derive(Clone)]
pub struct StatusPage {
    registry: RegistryFn,
    metrics: Option<Arc<Metrics>>,
    extra: Option<ExtraFn>,
}

// === impl StatusPage ===

impl StatusPage {
    /// Endpoints over whatever registry `registry` returns at each request.
    pub fn new(registry: impl Fn() -> Arc<Registry> + Send + Sync + 'static) -> Self {
        Self {
            registry: Arc::new(registry),
            metrics: None,
            extra: None,
        }
    }

    /// Endpoints over a checker's registry and probe counters.
    pub fn for_checker(checker: Arc<Checker>) -> Self {
        let metrics = checker.metrics().clone();
        Self::new(move || checker.registry()).with_metrics(metrics)
    }

    /// Add the checker's probe counters to `/metrics`.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Add more Prometheus text to `/metrics`.
    pub fn with_extra_metrics(mut self, f: impl Fn(&mut String) + Send + Sync + 'static) -> Self {
        self.extra = Some(Arc::new(f));
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
            "/metrics" => text(
                StatusCode::OK,
                "text/plain; version=0.0.4",
                self.metrics_text(),
            ),
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

    /// The whole `/metrics` text.
    pub fn metrics_text(&self) -> String {
        let registry = (self.registry)();
        let rows = format::rows(&registry);
        let mut out = format::prometheus(&rows, Filter::All, registry.generation());
        let mut up_samples = String::new();
        let mut decided = String::new();
        for up in registry.upstreams() {
            if up.config().check.is_none() {
                continue;
            }
            for peer in up.peers() {
                let view = peer.health().view();
                let labels = format!(
                    "upstream=\"{}\",peer=\"{}\"",
                    escape(up.name()),
                    escape(peer.name())
                );
                let _ = writeln!(
                    up_samples,
                    "vigil_peer_up{{{labels}}} {}",
                    u8::from(view.state != Some(HealthState::Down))
                );
                let _ = writeln!(
                    decided,
                    "vigil_peer_probe_decided{{{labels}}} {}",
                    u8::from(view.decided)
                );
            }
        }
        help(
            &mut out,
            "vigil_peer_up",
            "gauge",
            "1 when active checks let traffic to the peer, 0 when they say down.",
        );
        out.push_str(&up_samples);
        help(
            &mut out,
            "vigil_peer_probe_decided",
            "gauge",
            "1 once the peer has a probe result.",
        );
        out.push_str(&decided);
        if let Some(m) = &self.metrics {
            m.write_prometheus(&mut out);
        }
        if let Some(extra) = &self.extra {
            extra(&mut out);
        }
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
