//! vigil-proxy: the reverse proxy of `vigil serve`. It routes as nginx
//! does, asks core whom to pick, reports every attempt's outcome to core,
//! and retries only when core's rules say so.

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

mod access;
mod attempt;
mod body;
mod client_io;
mod conn;
pub mod connect;
mod errlog;
mod error_page;
mod gzip;
mod h1;
mod handler;
mod hop;
mod listener;
mod location;
mod log;
mod marks;
mod metrics;
mod names;
mod payload;
mod pool;
mod raw_head;
mod realip;
mod record;
mod redirect;
mod reply;
mod request_body;
mod request_check;
mod rewrite;
pub mod route;
mod router;
mod server;
mod shard;
mod sock;
mod spare;
mod status_page;
mod stop;
mod telemetry;
mod timer;
mod tls;
mod tunnel;
mod upstream;
pub mod uri;
pub mod vars;
mod vhost;
mod wallclock;
pub mod worker;

pub use listener::{serve, serve_connection};
pub use log::{reopen as reopen_logs, Reopened};
pub use metrics::ProxyMetrics;
pub use server::{bind, Generation, Proxy};
pub use telemetry::{Telemetry, TelemetryError};
