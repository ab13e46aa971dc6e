//! The body type of every message vigil sends, to a client or to an
//! upstream (a leaf: every layer that builds or relays a message uses it).

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};

/// Any error a body can carry.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body type sent upstream and to clients.
pub(crate) type UpBody = BoxBody<Bytes, BoxError>;

/// An empty body.
pub(crate) fn empty() -> UpBody {
    Full::new(Bytes::new())
        .map_err(|never| match never {})
        .boxed()
}

/// A body of these bytes.
pub(crate) fn full(b: impl Into<Bytes>) -> UpBody {
    Full::new(b.into()).map_err(|never| match never {}).boxed()
}
