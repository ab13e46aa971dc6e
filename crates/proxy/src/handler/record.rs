//! What a request's attempts were, as the access log and the
//! `$upstream_*` variables show them (a leaf: the handler fills it, the
//! log and the variables read it).

use std::sync::Arc;

/// One attempt as `$upstream_addr`, `$upstream_status`,
/// `$upstream_response_time` show it.
#[derive(Clone, Debug)]
pub(crate) struct AttemptRecord {
    /// The peer's address, or the upstream's name for "no live upstreams".
    pub addr: Arc<str>,
    /// The status the attempt produced (upstream's, or 502/504).
    pub status: Option<u16>,
    /// Seconds from the start of the attempt to its header or failure.
    pub response_time: f64,
    /// Seconds to connect, if it connected.
    pub connect_time: Option<f64>,
    /// The first attempt after an internal redirect (`error_page`) to
    /// another upstream: nginx separates the groups with ` : `.
    pub redirected: bool,
}

/// The attempts of a request's first pass, carried to its `error_page`
/// pass (response and request extension; on the page path only).
#[derive(Clone, Debug, Default)]
pub(crate) struct EarlierAttempts(pub(crate) Vec<AttemptRecord>);
