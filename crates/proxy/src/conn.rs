//! Client connection timing, as nginx does it, with one deadline per
//! connection instead of a timer per request:
//!
//! - from accept, `client_header_timeout` (of the address's default server)
//!   until the request header is complete;
//! - while a request is served, no deadline (the body has its own
//!   `client_body_timeout`, see [`crate::body`]);
//! - after the response, `keepalive_timeout` (of the request's location)
//!   until the first byte of the next request, which starts
//!   `client_header_timeout` again; over HTTP/2, `keepalive_timeout` while no
//!   stream is open, refreshed by every frame;
//! - whenever a write waits for a client that does not read,
//!   `send_timeout` between two successful writes.
//!
//! The deadline lives in atomics of [`ConnState`] that [`TimedIo`] and the
//! service ([`tracking`]) update; [`Watched`] drives the hyper connection
//! with one sleep that is re-armed only when it fires early or the deadline
//! moves earlier, and drops the connection (closing it, as nginx does:
//! nothing is sent) when the deadline passes.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::task::AtomicWaker;
use http::{header, HeaderValue, Request, Response, StatusCode, Version};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::service::Service;
use hyper_util::server::graceful::GracefulConnection;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use vigil_core::config::ProxySettings;

use crate::body::{BoxError, UpBody};

/// The limits a connection starts with: those of its address's default server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Timeouts {
    /// `client_header_timeout`.
    pub(crate) header: Duration,
    /// `keepalive_timeout` until a request picks its location.
    pub(crate) keepalive: Duration,
    /// `send_timeout` until a request picks its location.
    pub(crate) send: Duration,
}

/// Which deadline closed a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Expiry {
    /// No complete request header within `client_header_timeout`.
    Header,
    /// Idle longer than `keepalive_timeout`.
    Idle,
    /// A write waited longer than `send_timeout`.
    Send,
}

/// The timing state of one client connection.
pub(crate) struct ConnState {
    origin: Instant,
    phase: AtomicU8,
    /// Milliseconds since `origin`, [`NONE`] for none.
    phase_deadline: AtomicU64,
    write_deadline: AtomicU64,
    in_flight: AtomicU32,
    h2: AtomicBool,
    header_ms: u64,
    keepalive_ms: AtomicU64,
    send_ms: AtomicU64,
    /// Wakes [`Watched`] when an HTTP/2 stream task (another task) sets a deadline.
    waker: AtomicWaker,
}

/// A request being served; dropping it (with the response body) ends it.
pub(crate) struct RequestGuard(Arc<ConnState>);

/// The response body, ending the request when hyper drops it.
pub(crate) struct Tracked {
    inner: UpBody,
    _request: RequestGuard,
}

/// The service closed the connection without a response (nginx's
/// `ngx_http_terminate_request`, e.g. on `client_body_timeout`).
#[derive(Debug, thiserror::Error)]
#[error("connection closed without a response (logged as {0})")]
pub(crate) struct Abort(StatusCode);

/// The connection's IO, reporting reads and blocked writes to its [`ConnState`].
pub(crate) struct TimedIo<T> {
    inner: T,
    state: Arc<ConnState>,
}

/// A hyper connection driven under its deadline and drained on `drain`.
pub(crate) struct Watched<C> {
    conn: Pin<Box<C>>,
    state: Arc<ConnState>,
    sleep: Pin<Box<Sleep>>,
    armed: Option<Instant>,
    drain: Pin<Box<WaitForCancellationFutureOwned>>,
    draining: bool,
}

/// How a watched connection ended.
#[derive(Debug)]
pub(crate) enum Closed<E> {
    /// hyper finished it (the client closed, or an error).
    Done(Result<(), E>),
    /// A deadline passed and vigil closed it.
    TimedOut(Expiry),
}

/// Response extension: close the connection without sending this response.
#[derive(Clone, Copy, Debug)]
struct CloseSilently;

const NONE: u64 = u64::MAX;
const HEADER: u8 = 0;
const BUSY: u8 = 1;
const IDLE: u8 = 2;
const TUNNEL: u8 = 3;

/// After an HTTP/2 GOAWAY for idleness, how long the client may take to close.
const GOAWAY_GRACE: Duration = Duration::from_secs(1);

tokio::task_local! {
    static CURRENT: Arc<ConnState>;
}

/// The request was routed to a location: its `keepalive_timeout` and
/// `send_timeout` apply to this connection from now on. (Called by the
/// handler; a no-op outside a connection served by [`tracking`].)
pub(crate) fn on_route(settings: &ProxySettings) {
    let _ = CURRENT.try_with(|c| c.set_location(settings));
}

/// A response that is never sent: the connection is closed and `status` is
/// only what the access log shows (nginx closes silently on timeouts).
pub(crate) fn close_silently(status: StatusCode) -> Response<UpBody> {
    let mut r = Response::new(crate::body::empty());
    *r.status_mut() = status;
    r.extensions_mut().insert(CloseSilently);
    r
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
        let guard = state.request(version);
        let served = CURRENT.scope(state.clone(), handle(req));
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
    Ok(resp.map(|inner| Tracked {
        inner,
        _request: guard,
    }))
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(NONE)
}

// === impl ConnState ===

impl ConnState {
    /// A connection accepted now.
    pub(crate) fn new(t: Timeouts) -> Arc<Self> {
        let header_ms = ms(t.header);
        Arc::new(Self {
            origin: Instant::now(),
            phase: AtomicU8::new(HEADER),
            phase_deadline: AtomicU64::new(header_ms),
            write_deadline: AtomicU64::new(NONE),
            in_flight: AtomicU32::new(0),
            h2: AtomicBool::new(false),
            header_ms,
            keepalive_ms: AtomicU64::new(ms(t.keepalive)),
            send_ms: AtomicU64::new(ms(t.send)),
            waker: AtomicWaker::new(),
        })
    }

    fn now_ms(&self) -> u64 {
        ms(Instant::now().saturating_duration_since(self.origin))
    }

    fn after(&self, timeout_ms: u64) -> u64 {
        self.now_ms().saturating_add(timeout_ms)
    }

    fn at(&self, deadline_ms: u64) -> Option<Instant> {
        if deadline_ms == NONE {
            return None;
        }
        self.origin.checked_add(Duration::from_millis(deadline_ms))
    }

    /// Bytes came from the client.
    fn on_read(&self) {
        if self.phase.load(Ordering::Relaxed) != IDLE {
            return;
        }
        if self.h2.load(Ordering::Relaxed) {
            // Any frame keeps an idle HTTP/2 connection (nginx re-arms its
            // idle timer on every read).
            let ka = self.keepalive_ms.load(Ordering::Relaxed);
            self.phase_deadline.store(self.after(ka), Ordering::Relaxed);
        } else {
            // The first byte of the next request: the header timer starts.
            self.phase.store(HEADER, Ordering::Relaxed);
            self.phase_deadline
                .store(self.after(self.header_ms), Ordering::Relaxed);
        }
    }

    /// A write could not proceed: `send_timeout` runs unless it already does.
    fn on_write_blocked(&self) {
        if self.write_deadline.load(Ordering::Relaxed) == NONE {
            let send = self.send_ms.load(Ordering::Relaxed);
            self.write_deadline
                .store(self.after(send), Ordering::Relaxed);
        }
    }

    /// A write went through.
    fn on_written(&self) {
        if self.write_deadline.load(Ordering::Relaxed) == NONE {
            return;
        }
        self.write_deadline.store(NONE, Ordering::Relaxed);
        if self.phase.load(Ordering::Relaxed) == IDLE {
            // The end of the response is out only now: idle from here.
            let ka = self.keepalive_ms.load(Ordering::Relaxed);
            self.phase_deadline.store(self.after(ka), Ordering::Relaxed);
        }
    }

    /// A request header is complete.
    fn request(self: &Arc<Self>, version: Version) -> RequestGuard {
        if version == Version::HTTP_2 && !self.h2.load(Ordering::Relaxed) {
            self.h2.store(true, Ordering::Relaxed);
        }
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        if self.phase.load(Ordering::Relaxed) != TUNNEL {
            self.phase.store(BUSY, Ordering::Relaxed);
            self.phase_deadline.store(NONE, Ordering::Relaxed);
        }
        RequestGuard(self.clone())
    }

    /// A request is over (its response body dropped by hyper).
    fn finished(&self) {
        if self.in_flight.fetch_sub(1, Ordering::AcqRel) != 1
            || self.phase.load(Ordering::Relaxed) == TUNNEL
        {
            return;
        }
        self.phase.store(IDLE, Ordering::Relaxed);
        let ka = self.keepalive_ms.load(Ordering::Relaxed);
        self.phase_deadline.store(self.after(ka), Ordering::Relaxed);
        if self.h2.load(Ordering::Relaxed) {
            // HTTP/2 streams run in their own tasks.
            self.waker.wake();
        }
    }

    fn set_location(&self, settings: &ProxySettings) {
        self.keepalive_ms
            .store(ms(settings.client_keepalive_timeout), Ordering::Relaxed);
        self.send_ms
            .store(ms(settings.client_send_timeout), Ordering::Relaxed);
    }

    /// The connection became a tunnel (101): no client timers any more.
    fn upgraded(&self) {
        self.phase.store(TUNNEL, Ordering::Relaxed);
        self.phase_deadline.store(NONE, Ordering::Relaxed);
        self.write_deadline.store(NONE, Ordering::Relaxed);
    }

    /// When the connection must be closed, if nothing changes.
    fn deadline(&self) -> Option<Instant> {
        if self.phase.load(Ordering::Relaxed) == TUNNEL {
            return None;
        }
        match self.write_deadline.load(Ordering::Relaxed) {
            NONE => self.at(self.phase_deadline.load(Ordering::Relaxed)),
            w => self.at(w),
        }
    }

    /// Which deadline has passed at `now`, if one has.
    fn expired(&self, now: Instant) -> Option<Expiry> {
        let phase = self.phase.load(Ordering::Relaxed);
        if phase == TUNNEL {
            return None;
        }
        let now = ms(now.saturating_duration_since(self.origin));
        match self.write_deadline.load(Ordering::Relaxed) {
            NONE => {}
            w => return (now >= w).then_some(Expiry::Send),
        }
        let p = self.phase_deadline.load(Ordering::Relaxed);
        if p == NONE || now < p {
            return None;
        }
        match phase {
            HEADER => Some(Expiry::Header),
            IDLE if self.in_flight.load(Ordering::Acquire) == 0 => Some(Expiry::Idle),
            _ => None,
        }
    }

    /// Give a connection that was told to go away `grace` to do so.
    fn extend(&self, grace: Duration) {
        self.phase_deadline
            .store(self.after(ms(grace)), Ordering::Relaxed);
    }
}

// === impl RequestGuard ===

impl Drop for RequestGuard {
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

// === impl TimedIo ===

impl<T> TimedIo<T> {
    pub(crate) fn new(inner: T, state: Arc<ConnState>) -> Self {
        Self { inner, state }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for TimedIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.state.on_read();
        }
        r
    }
}

impl<T: AsyncWrite + Unpin> TimedIo<T> {
    fn note(&self, r: &Poll<io::Result<usize>>) {
        match r {
            Poll::Pending => self.state.on_write_blocked(),
            Poll::Ready(Ok(n)) if *n > 0 => self.state.on_written(),
            Poll::Ready(_) => {}
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for TimedIo<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.note(&r);
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.note(&r);
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

// === impl Watched ===

impl<C> Watched<C>
where
    C: GracefulConnection,
{
    /// Drive `conn` under `state`'s deadline; on `drain`, finish the
    /// request in flight (HTTP/2: the open streams) and close.
    pub(crate) fn new(conn: C, state: Arc<ConnState>, drain: CancellationToken) -> Self {
        let first = state.deadline();
        let far = Instant::now() + Duration::from_secs(86400 * 365);
        Self {
            conn: Box::pin(conn),
            sleep: Box::pin(tokio::time::sleep_until(first.unwrap_or(far))),
            armed: first,
            state,
            drain: Box::pin(drain.cancelled_owned()),
            draining: false,
        }
    }

    fn go_away(&mut self) {
        if !self.draining {
            self.draining = true;
            self.conn.as_mut().graceful_shutdown();
        }
    }
}

impl<C> Future for Watched<C>
where
    C: GracefulConnection,
{
    type Output = Closed<C::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if !this.draining && this.drain.as_mut().poll(cx).is_ready() {
            this.go_away();
        }
        if let Poll::Ready(r) = this.conn.as_mut().poll(cx) {
            return Poll::Ready(Closed::Done(r));
        }
        if this.state.h2.load(Ordering::Relaxed) {
            // Streams end in their own tasks and may set the deadline.
            this.state.waker.register(cx.waker());
        }
        loop {
            let Some(deadline) = this.state.deadline() else {
                return Poll::Pending;
            };
            // Re-arm only when the deadline moved earlier than the sleep;
            // a later one is noticed when the sleep fires.
            if this.armed.is_none_or(|a| deadline < a) {
                this.sleep.as_mut().reset(deadline);
                this.armed = Some(deadline);
            }
            if this.sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            this.armed = None;
            match this.state.expired(Instant::now()) {
                None => continue,
                Some(Expiry::Idle) if this.state.h2.load(Ordering::Relaxed) && !this.draining => {
                    // nginx ends an idle HTTP/2 connection with a GOAWAY.
                    this.go_away();
                    this.state.extend(GOAWAY_GRACE);
                    if let Poll::Ready(r) = this.conn.as_mut().poll(cx) {
                        return Poll::Ready(Closed::Done(r));
                    }
                }
                Some(why) => return Poll::Ready(Closed::TimedOut(why)),
            }
        }
    }
}

// === impl Expiry ===

impl std::fmt::Display for Expiry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Expiry::Header => "while reading the request header (client_header_timeout)",
            Expiry::Idle => "while idle (keepalive_timeout)",
            Expiry::Send => "while sending to the client (send_timeout)",
        })
    }
}

#[cfg(test)]
mod tests;
