//! OpenTelemetry export, off unless `[telemetry] otlp_endpoint` is set:
//! OTLP over HTTP with protobuf bodies for
//!
//! - metrics: the counters and gauges of [`crate::obs::metrics`], read from the
//!   same atomics by observable instruments every `export_interval`;
//! - traces: one `request` span per client request (method, location,
//!   upstream, final status) with one `attempt` child per attempt (peer,
//!   outcome class, connect time, duration).
//!
//! The SDK batches spans and exports from its own threads; the HTTP
//! requests run on the tokio runtime [`Telemetry::start`] was called on.
//! With telemetry off the proxy has no tracer and a request builds no
//! span and reads no clock for one.

mod client;
mod instruments;
pub(crate) mod request;

use std::sync::Arc;
use std::time::Duration;

use opentelemetry::metrics::MeterProvider as _;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{ExporterBuildError, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::error::OTelSdkError;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use opentelemetry_sdk::Resource;
use vigil_core::config::TelemetryConfig;

use crate::obs::metrics::ProxyMetrics;
use client::ExportClient;

/// How long one export request may take.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// The instrumentation scope of vigil's spans and instruments.
const SCOPE: &str = "vigil-proxy";

/// Running OTLP exporters for traces and metrics.
pub struct Telemetry {
    traces: SdkTracerProvider,
    meters: SdkMeterProvider,
    tracer: RequestTracer,
    endpoint: String,
}

/// What the proxy makes request spans with ([`crate::Proxy::with_tracer`]).
#[derive(Clone, Debug)]
pub struct RequestTracer(pub(crate) SdkTracer);

/// Telemetry could not be started, flushed or stopped.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// [`Telemetry::start`] was called outside a tokio runtime.
    #[error("OpenTelemetry export must be started from inside a tokio runtime")]
    NoRuntime(#[source] tokio::runtime::TryCurrentError),
    /// The OTLP exporter refused its settings.
    #[error("cannot build the OTLP {signal} exporter for {endpoint}")]
    Exporter {
        /// `traces` or `metrics`.
        signal: &'static str,
        /// The URL it was to send to.
        endpoint: String,
        /// Why.
        #[source]
        source: ExporterBuildError,
    },
    /// Exporting or stopping failed (the collector is unreachable, say).
    #[error("OpenTelemetry {signal}: {action} failed")]
    Sdk {
        /// `traces` or `metrics`.
        signal: &'static str,
        /// `flush` or `shutdown`.
        action: &'static str,
        /// Why.
        #[source]
        source: OTelSdkError,
    },
    /// The blocking task doing the work panicked.
    #[error("OpenTelemetry {0} task did not finish")]
    Join(&'static str, #[source] tokio::task::JoinError),
}

// === impl Telemetry ===

impl Telemetry {
    /// Start exporting `metrics` and request traces as `config` says;
    /// `Ok(None)` when no `otlp_endpoint` is set. Must be called inside a
    /// tokio runtime that keeps running while telemetry is on: export
    /// requests run on it.
    pub fn start(
        config: &TelemetryConfig,
        metrics: Arc<ProxyMetrics>,
    ) -> Result<Option<Self>, TelemetryError> {
        let Some(base) = config.otlp_endpoint.as_deref() else {
            return Ok(None);
        };
        let runtime = tokio::runtime::Handle::try_current().map_err(TelemetryError::NoRuntime)?;
        let client = ExportClient::new(runtime, EXPORT_TIMEOUT);
        let base = base.trim_end_matches('/');
        let resource = Resource::builder()
            .with_service_name(config.service_name.clone())
            .build();

        let endpoint = format!("{base}/v1/traces");
        let spans = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(client.clone())
            .with_endpoint(endpoint.clone())
            .with_timeout(EXPORT_TIMEOUT)
            .build()
            .map_err(|source| TelemetryError::Exporter {
                signal: "traces",
                endpoint,
                source,
            })?;
        let traces = SdkTracerProvider::builder()
            .with_batch_exporter(spans)
            .with_resource(resource.clone())
            .build();

        let endpoint = format!("{base}/v1/metrics");
        let exporter = opentelemetry_otlp::MetricExporter::builder()
            .with_http()
            .with_http_client(client)
            .with_endpoint(endpoint.clone())
            .with_timeout(EXPORT_TIMEOUT)
            .build()
            .map_err(|source| TelemetryError::Exporter {
                signal: "metrics",
                endpoint,
                source,
            })?;
        let reader = PeriodicReader::builder(exporter)
            .with_interval(config.export_interval)
            .build();
        let meters = SdkMeterProvider::builder()
            .with_reader(reader)
            .with_resource(resource)
            .build();
        instruments::register(&meters.meter(SCOPE), &metrics);

        let tracer = RequestTracer(traces.tracer(SCOPE));
        Ok(Some(Self {
            traces,
            meters,
            tracer,
            endpoint: base.to_string(),
        }))
    }

    /// The tracer to give the proxy.
    pub fn tracer(&self) -> RequestTracer {
        self.tracer.clone()
    }

    /// Export the spans ended so far and the metrics as they are now.
    pub async fn flush(&self) -> Result<(), TelemetryError> {
        let (traces, meters) = (self.traces.clone(), self.meters.clone());
        blocking("flush", move || {
            let t = traces.force_flush();
            let m = meters.force_flush();
            sdk("traces", "flush", t).and(sdk("metrics", "flush", m))
        })
        .await
    }

    /// Export what is left and stop the exporters.
    pub async fn shutdown(self) -> Result<(), TelemetryError> {
        let Self { traces, meters, .. } = self;
        blocking("shutdown", move || {
            let t = traces.shutdown();
            let m = meters.shutdown();
            sdk("traces", "shutdown", t).and(sdk("metrics", "shutdown", m))
        })
        .await
    }
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telemetry")
            .field("endpoint", &self.endpoint)
            .finish()
    }
}

/// Run the SDK's blocking `f` off the runtime: its exports need the
/// runtime free to drive their HTTP requests.
async fn blocking(
    what: &'static str,
    f: impl FnOnce() -> Result<(), TelemetryError> + Send + 'static,
) -> Result<(), TelemetryError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| TelemetryError::Join(what, e))?
}

fn sdk(
    signal: &'static str,
    action: &'static str,
    r: Result<(), OTelSdkError>,
) -> Result<(), TelemetryError> {
    r.map_err(|source| TelemetryError::Sdk {
        signal,
        action,
        source,
    })
}
