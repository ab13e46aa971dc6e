//! The fuzz targets' bodies: each function takes arbitrary bytes, feeds
//! them to one of vigil's parsers, and panics only where vigil itself would
//! (a violated invariant), never because the input is bad. The
//! `fuzz_targets/` binaries call these under libFuzzer; `tests/corpus.rs`
//! replays every kept input on stable.

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

mod proxy;

pub use proxy::proxy_request;

/// A target: the name of its corpus directory and fuzz binary, and its body.
pub type Target = (&'static str, fn(&[u8]));

/// Every target.
pub const TARGETS: &[Target] = &[("proxy_request", proxy_request)];
