//! The body type of every message vigil sends, to a client or to an
//! upstream (a leaf: every layer that builds or relays a message uses it).

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full};

/// Any error a body can carry.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body type sent upstream and to clients.
pub(crate) type UpBody = BoxBody<Bytes, BoxError>;

/// An empty body. (`Empty` has no size: boxing it allocates nothing, where
/// a `Full` of no bytes was an allocation per request without a body.)
pub(crate) fn empty() -> UpBody {
    Empty::new().map_err(|never| match never {}).boxed()
}

/// A body of these bytes.
pub(crate) fn full(b: impl Into<Bytes>) -> UpBody {
    Full::new(b.into()).map_err(|never| match never {}).boxed()
}

#[cfg(test)]
mod tests {
    use hyper::body::Body;

    #[test]
    fn an_empty_body_is_at_its_end_with_no_bytes_to_come() {
        let b = super::empty();
        assert!(b.is_end_stream());
        assert_eq!(b.size_hint().exact(), Some(0));
        assert_eq!(
            std::mem::size_of_val(&http_body_util::Empty::<bytes::Bytes>::new()),
            0
        );
    }
}
