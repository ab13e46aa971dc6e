//! What a request leaves behind: the access log (`log`), the error log's
//! lines for what breaks after the header (`errlog`), the Prometheus
//! counters (`metrics`) and OpenTelemetry traces and metrics
//! (`telemetry`).

pub(crate) mod errlog;
pub(crate) mod log;
pub(crate) mod metrics;
pub(crate) mod telemetry;
