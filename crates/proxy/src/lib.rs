//! vigil-proxy: the reverse proxy of `vigil serve`. It routes as nginx
//! does, asks core whom to pick, reports every attempt's outcome to core,
//! and retries only when core's rules say so.

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub(crate) mod conn;
mod handler;
pub(crate) mod nginx;
pub(crate) mod obs;
mod server;
pub(crate) mod upstream;
pub(crate) mod wire;

pub use conn::listener::{serve, serve_connection};
pub use conn::wallclock::write_error_log_time;
pub use conn::worker;
pub use conn::worker::bind;
pub use nginx::{route, uri, vars};
pub use obs::log::{reopen as reopen_logs, Reopened};
pub use obs::metrics::ProxyMetrics;
pub use obs::telemetry::{Telemetry, TelemetryError};
pub use server::{Generation, Proxy};
pub use upstream::connect;
