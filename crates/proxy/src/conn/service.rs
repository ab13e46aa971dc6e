//! The connection's service: each request is tracked from its header to
//! the drop of its response body, the location's timeouts are taken when
//! the handler routes it, and a response can close the connection unsent.

use std::future::Future;
use std::ops::Deref;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{header, HeaderValue, Request, Response, StatusCode, Version};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::service::Service;
use vigil_core::config::ProxySettings;

use super::ConnState;
use crate::wire::payload::{BoxError, UpBody};

/// A request being served; dropping it (with the response body) ends it.
/// HTTP/2's is in the response body and holds the connection's state; an
/// HTTP/1 exchange's lives inside the connection's loop and borrows it.
pub(crate) struct RequestGuard<S: Deref<Target = ConnState> = Arc<ConnState>>(S);

/// The response body, ending the request when hyper drops it.
pub(crate) struct Tracked {
    inner: UpBody,
    _request: RequestGuard,
}

/// The service closed the connection without a response (nginx's
/// `ngx_http_terminate_request`, e.g. on `client_body_timeout`).
#[derive(Debug, thiserror::Error)]
#[error("connection closed without a response (access log: {})", .0.as_u16())]
pub(crate) struct Abort(StatusCode);

/// Response extension: close the connection without sending this response.
#[derive(Clone, Copy, Debug)]
struct CloseSilently;

/// The request was routed to a location: its `keepalive_timeout` and
/// `send_timeout` apply to the connection of `state` from now on (called by
/// the handler).
pub(crate) fn on_route(state: &ConnState, settings: &ProxySettings) {
    state.set_location(settings);
}

/// A response that is never sent: the connection is closed and `status` is
/// only what the access log shows (nginx closes silently on timeouts).
pub(crate) fn close_silently(status: StatusCode) -> Response<UpBody> {
    let mut r = Response::new(crate::wire::payload::empty());
    *r.status_mut() = status;
    r.extensions_mut().insert(CloseSilently);
    r
}

/// The [`Abort`] in `e`'s chain, if the service closed the connection.
pub(crate) fn aborted<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a Abort> {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(a) = err.downcast_ref::<Abort>() {
            return Some(a);
        }
        cur = err.source();
    }
    None
}

/// Wrap `handle` into the connection's service: every request is tracked
/// until hyper drops its response body, `keepalive_timeout 0` adds
/// `Connection: close`, a 101 turns the timers off (the tunnel has its own).
pub(crate) fn tracking<F, Fut>(
    state: Arc<ConnState>,
    handle: F,
) -> impl Service<
    Request<Incoming>,
    Response = Response<Tracked>,
    Error = Abort,
    Future = impl Future<Output = Result<Response<Tracked>, Abort>> + Send + 'static,
> + Clone
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Response<UpBody>> + Send + 'static,
{
    hyper::service::service_fn(move |req: Request<Incoming>| {
        let version = req.version();
        let guard = RequestGuard::new(state.clone(), version);
        // Boxed per request: hyper keeps one slot for the service's future
        // per connection for as long as it lives, idle or not, so an inline
        // handler future (several KiB) would be held by every idle
        // keep-alive connection. nginx, too, allocates a request's memory
        // per request and frees it when the connection goes idle.
        let served = Box::pin(handle(req));
        async move {
            let resp = served.await;
            respond(resp, guard, version)
        }
    })
}

fn respond(
    mut resp: Response<UpBody>,
    guard: RequestGuard,
    version: Version,
) -> Result<Response<Tracked>, Abort> {
    prepare(&mut resp, &guard, version)?;
    Ok(resp.map(|inner| Tracked {
        inner,
        _request: guard,
    }))
}

/// A request (of `version`) starts on the connection of `state`; it ends
/// when the guard drops.
pub(crate) fn begin(state: &ConnState, version: Version) -> RequestGuard<&ConnState> {
    RequestGuard::new(state, version)
}

/// What the service does to a response before it is sent: `Err` when it
/// must not be sent (the connection closes); a 101 turns the timers off;
/// `keepalive_timeout 0` adds `Connection: close`.
pub(crate) fn prepare<S: Deref<Target = ConnState>>(
    resp: &mut Response<UpBody>,
    guard: &RequestGuard<S>,
    version: Version,
) -> Result<(), Abort> {
    if resp.extensions().get::<CloseSilently>().is_some() {
        return Err(Abort(resp.status()));
    }
    let state = &guard.0;
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        state.upgraded();
    } else if version < Version::HTTP_2 && state.keepalive_ms.load(Ordering::Relaxed) == 0 {
        // nginx's keepalive_timeout 0: no keep-alive, said in the response.
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    Ok(())
}

// === impl RequestGuard ===

impl<S: Deref<Target = ConnState>> RequestGuard<S> {
    fn new(state: S, version: Version) -> Self {
        state.request(version);
        Self(state)
    }
}

impl<S: Deref<Target = ConnState>> Drop for RequestGuard<S> {
    fn drop(&mut self) {
        self.0.finished();
    }
}

// === impl Tracked ===

impl Body for Tracked {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
