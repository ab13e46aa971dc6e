//! nginx's error_log lines for what fails after the response header went
//! out (a broken body, an upgraded connection that times out): nginx's
//! words, and the context nginx appends (client, request, upstream, host),
//! kept as cheap clones and formatted only when a line is written.

use std::net::SocketAddr;

use http::request::Parts;
use http::{Method, Uri, Version};
use vigil_core::upstream::PeerGuard;

/// Who a failure after the header concerns.
#[derive(Clone, Debug)]
pub(crate) struct Context {
    pub(crate) client: SocketAddr,
    method: Method,
    uri: Uri,
    version: Version,
    host: Option<http::HeaderValue>,
}

/// What failed, in nginx's words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Failure {
    /// The upstream closed before the body was complete.
    PrematureClose,
    /// A chunk the upstream sent does not parse.
    InvalidChunk,
    /// The upstream reset the connection.
    Reset,
    /// Nothing arrived within proxy_read_timeout (or an upgraded
    /// connection was idle that long).
    Timeout,
    /// Any other read error.
    Other,
}

// === impl Context ===

impl Context {
    /// The context of `parts` (whose first `Host` is `host`). The
    /// upstream and the peer are the ones the line is about (from the
    /// attempt's guard): not kept here, as cloning their names was two
    /// atomic counts a request.
    pub(crate) fn new(client: SocketAddr, parts: &Parts, host: Option<http::HeaderValue>) -> Self {
        Self {
            client,
            method: parts.method.clone(),
            uri: parts.uri.clone(),
            version: parts.version,
            host,
        }
    }

    /// The request line, as nginx's `request: "..."`.
    pub(crate) fn request(&self) -> String {
        let pq = self.uri.path_and_query().map_or("/", |p| p.as_str());
        format!("{} {pq} {:?}", self.method, self.version)
    }

    /// The Host header, as nginx's `host: "..."`.
    pub(crate) fn host(&self) -> &str {
        self.host
            .as_ref()
            .and_then(|h| h.to_str().ok())
            .unwrap_or("")
    }

    /// Write one error_log line about the attempt of `guard` (its peer
    /// and upstream; empty without one): `failure` while `action` (nginx's
    /// `c->log->action`, e.g. "reading upstream").
    pub(crate) fn log(
        &self,
        guard: Option<&PeerGuard>,
        failure: Failure,
        action: &str,
        detail: &dyn std::fmt::Display,
    ) {
        let (upstream, peer) = guard.map_or(("", ""), |g| {
            (&**g.upstream().name(), &**g.peer().addr_text())
        });
        let what = match failure {
            Failure::PrematureClose => "upstream prematurely closed connection",
            Failure::InvalidChunk => "upstream sent invalid chunked response",
            Failure::Reset => "recv() failed (104: Connection reset by peer)",
            Failure::Timeout => "upstream timed out (110: Connection timed out)",
            Failure::Other => "upstream read failed",
        };
        tracing::error!(
            upstream = %upstream,
            peer = %peer,
            client = %self.client.ip(),
            request = %self.request(),
            host = %self.host(),
            error = %detail,
            "{what} while {action}, client: {}, request: \"{}\", upstream: \"{}\" ({}), host: \"{}\"",
            self.client.ip(),
            self.request(),
            peer,
            upstream,
            self.host(),
        );
    }
}

// === impl Failure ===

impl Failure {
    /// The failure a body read error stands for.
    pub(crate) fn of(e: &(dyn std::error::Error + 'static)) -> Self {
        let mut cur = Some(e);
        while let Some(err) = cur {
            if let Some(io) = err.downcast_ref::<std::io::Error>() {
                return match io.kind() {
                    std::io::ErrorKind::UnexpectedEof => Failure::PrematureClose,
                    std::io::ErrorKind::InvalidData | std::io::ErrorKind::InvalidInput => {
                        Failure::InvalidChunk
                    }
                    std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe => {
                        Failure::Reset
                    }
                    std::io::ErrorKind::TimedOut => Failure::Timeout,
                    _ => Failure::Other,
                };
            }
            if let Some(h) = err.downcast_ref::<hyper::Error>() {
                if h.is_incomplete_message() {
                    return Failure::PrematureClose;
                }
                if h.is_parse() {
                    return Failure::InvalidChunk;
                }
            }
            cur = err.source();
        }
        Failure::Other
    }
}
