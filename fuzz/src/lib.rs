//! The fuzz targets' bodies: each function takes arbitrary bytes, feeds
//! them to one of vigil's parsers, and panics only where vigil itself would
//! (a violated invariant), never because the input is bad. The
//! `fuzz_targets/` binaries call these under libFuzzer; `tests/corpus.rs`
//! replays every kept input on stable.

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

mod admin;
mod config;
mod probe;
mod proxy;
mod upstream;
mod uri_route;

pub use admin::admin_query;
pub use config::{nginx_conf, toml_conf};
pub use probe::probe_response;
pub use proxy::proxy_request;
pub use upstream::upstream_response;
pub use uri_route::uri_route;

/// A target's body.
pub type Target = fn(&[u8]);

/// Every target, by the name of its corpus directory and fuzz binary.
pub const TARGETS: &[(&str, Target)] = &[
    ("admin_query", admin_query),
    ("nginx_conf", nginx_conf),
    ("probe_response", probe_response),
    ("proxy_request", proxy_request),
    ("toml_conf", toml_conf),
    ("upstream_response", upstream_response),
    ("uri_route", uri_route),
];
