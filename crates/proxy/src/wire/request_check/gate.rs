//! What the HTTP/1 connection loop (`crate::wire::h1`) does with a head's
//! verdict: a refused head is answered with nginx's page and the
//! connection closed; after an upgrade request the response closes the
//! connection unless it is a tunnel.

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Response, StatusCode};

use super::Verdict;

/// A refused head: the status to answer, and its request line as read
/// (for the access log; None when no whole line came).
#[derive(Debug)]
pub(crate) struct Refused {
    /// nginx's status for the head.
    pub(crate) status: StatusCode,
    /// The request line, without its line end.
    pub(crate) line: Option<Bytes>,
}

/// Close the connection after `resp` when the gate stopped judging heads
/// on it, unless `resp` turned it into a tunnel.
pub(crate) fn close_if_blind<B>(verdict: &Verdict, resp: &mut Response<B>) {
    if verdict.close && resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
}

/// The request line at the start of `head` (after the empty lines nginx
/// skips), without its line end; None before a whole line.
pub(crate) fn request_line(head: &[u8]) -> Option<Bytes> {
    let start = head.iter().position(|b| *b != b'\r' && *b != b'\n')?;
    let rest = &head[start..];
    let end = rest.iter().position(|b| *b == b'\n')?;
    let line = rest[..end].strip_suffix(b"\r").unwrap_or(&rest[..end]);
    Some(Bytes::copy_from_slice(line))
}

/// nginx's error page for a refused head; the connection closes after it.
pub(crate) fn refused(status: StatusCode) -> Response<crate::wire::payload::UpBody> {
    let mut resp = crate::nginx::status_page::error_page(status);
    resp.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    resp
}
