//! The fuzz targets' bodies: each function takes arbitrary bytes, feeds
//! them to one of vigil's parsers, and panics only where vigil itself would
//! (a violated invariant), never because the input is bad. The
//! `fuzz_targets/` binaries call these under libFuzzer; `tests/corpus.rs`
//! replays every kept input on stable.

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

mod proxy;
mod uri_route;

pub use proxy::proxy_request;
pub use uri_route::uri_route;

/// A target's body.
pub type Target = fn(&[u8]);

/// Every target, by the name of its corpus directory and fuzz binary.
pub const TARGETS: &[(&str, Target)] =
    &[("proxy_request", proxy_request), ("uri_route", uri_route)];
