//! vigil-checker: active health checks (tengine's `check` family) that
//! write their verdicts into core's shared peer records, and the pieces of
//! the checker-only deployment beside a stock nginx.
//!
//! - [`probe`]: one tcp, http or https probe against one target, with one
//!   deadline for the whole probe and the failing phase in the result;
//! - [`Checker`]: the scheduler: one probe loop per distinct target and
//!   check definition, shared by every upstream naming it, a global
//!   concurrency cap, initial spread and jitter, reload without losing
//!   streaks;
//! - [`status`]: tengine's status page (`/status?format=html|csv|json`) and
//!   Prometheus metrics (`/metrics`), as a hyper service over a registry;
//! - [`nginx`]: `vigil check`: render stock-nginx upstream blocks with
//!   `down` marks, test, reload and verify.

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

mod error;
pub mod metrics;
pub mod nginx;
pub mod probe;
mod schedule;
pub mod status;
mod target;

pub use error::CheckerError;
pub use metrics::Metrics;
pub use probe::tls::{TlsOptions, TlsPolicy};
pub use probe::{NetProber, ProbeFailure, Prober, Target};
pub use schedule::{Checker, CheckerOptions, Sharing, UpdateSummary};
pub use target::TargetKey;
