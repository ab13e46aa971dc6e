//! The client's request body as the handler reads it, whichever
//! connection carries it (a leaf below the connection layers).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};

use crate::wire::payload::BoxError;

/// The client's request body: hyper's for HTTP/2, vigil's own HTTP/1
/// reader's (h1/read.rs) for HTTP/1.x.
pub(crate) enum RequestBody {
    /// An HTTP/2 stream's body (hyper's connection).
    Hyper(Incoming),
    /// An HTTP/1.x request's body (vigil's connection loop).
    H1(crate::wire::h1::read::H1Body),
}

impl RequestBody {
    /// An HTTP/2 request from hyper as the handler takes it: its parts
    /// and its body.
    pub(crate) fn hyper_request(req: http::Request<Incoming>) -> (http::request::Parts, Self) {
        let (parts, body) = req.into_parts();
        (parts, RequestBody::Hyper(body))
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            RequestBody::Hyper(b) => Pin::new(b)
                .poll_frame(cx)
                .map(|f| f.map(|r| r.map_err(BoxError::from))),
            RequestBody::H1(b) => Pin::new(b).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            RequestBody::Hyper(b) => b.is_end_stream(),
            RequestBody::H1(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            RequestBody::Hyper(b) => b.size_hint(),
            RequestBody::H1(b) => b.size_hint(),
        }
    }
}
