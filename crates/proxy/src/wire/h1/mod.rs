//! vigil's own HTTP/1.x server connection: one loop per connection, in the
//! connection's task, over one read buffer. Each head is judged as nginx
//! judges it ([`HeadScan`]) and parsed once: at once where it came whole
//! and the gate takes it as it is ([`read::at_once`]), else line by line
//! and then parsed ([`read::parse`]). It is served by the
//! handler, and its response written as hyper writes it ([`write`]); then
//! the next head (pipelined bytes stay in the buffer). An HTTP/2 preface
//! hands the connection (with the bytes read) to hyper; a 101 hands it to
//! the handler's tunnel. A connection closed while the client may still
//! be sending lingers as nginx's does ([`linger`]).

pub(crate) mod read;
pub(crate) mod write;

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use http::{Request, Response, StatusCode, Version};
use hyper::body::Body;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use smallvec::SmallVec;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::oneshot;

use crate::conn::{self, ConnState, Graceful};
use crate::server::Proxy;
use crate::wire::payload::{BoxError, UpBody};
use crate::wire::request_body::RequestBody;
use crate::wire::request_check::gate::{self, Refused};
use crate::wire::request_check::{ClientFraming, HeadLimits, HeadScan, Step, Verdict};
use read::{BoxIo, H1Body, Reading, Wire};
use write::{Asked, BodyLength};

use crate::conn::client_io::PendingUpgrade;

/// The HTTP/2 connection preface (RFC 9113 §3.4).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Unread body bytes discarded before the next head, at most (else close).
const DRAIN_LIMIT: usize = 64 * 1024;

/// Response pieces buffered before they are written, at most.
const MAX_PIECES: usize = 16;

/// nginx's `lingering_time` and `lingering_timeout` defaults (vigil has
/// no directives for them): how long a connection closed with request
/// bytes unread is read from and discarded, in all and between reads.
const LINGERING_TIME: Duration = Duration::from_secs(30);
const LINGERING_TIMEOUT: Duration = Duration::from_secs(5);
/// What one discarding read takes at most (`NGX_HTTP_LINGERING_BUFFER_SIZE`).
const LINGERING_BUFFER: usize = 4096;

/// What the connection fails with.
pub(crate) type ConnError = Box<dyn std::error::Error + Send + Sync>;

/// How requests on a connection are answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Serve {
    /// HTTP on a plain address (HTTP/2 with prior knowledge too).
    Plain,
    /// HTTP/1.x inside TLS.
    Tls,
    /// Plain HTTP sent to a TLS address: every request is answered 400.
    PlainOnTls,
}

/// What a connection is served with.
pub(crate) struct Ctx {
    pub(crate) proxy: Arc<Proxy>,
    pub(crate) local: SocketAddr,
    pub(crate) client: SocketAddr,
    pub(crate) serve: Serve,
    pub(crate) limits: HeadLimits,
    pub(crate) state: Arc<ConnState>,
    /// For an HTTP/2 preface (plain addresses).
    pub(crate) h2: Option<Arc<auto::Builder<TokioExecutor>>>,
    /// nginx's answer to plain HTTP on a TLS port.
    pub(crate) plain_to_https: fn() -> Response<UpBody>,
}

/// One client connection served by the loop; see [`Graceful`].
pub(crate) struct Connection {
    fut: Pin<Box<dyn Future<Output = Result<(), ConnError>> + Send>>,
    shutdown: Arc<AtomicBool>,
}

/// A stream with bytes already read in front of it.
pub(crate) struct Rewind<T> {
    pre: Bytes,
    inner: T,
}

/// The loop's own failures (for the connection log).
#[derive(Debug, thiserror::Error)]
enum H1Error {
    #[error("connection closed before the request head was complete")]
    Incomplete,
    #[error("invalid request head ({0})")]
    Parse(StatusCode),
    #[error("writing the response failed: {0}")]
    Write(#[source] io::Error),
    #[error("reading the request failed: {0}")]
    Read(#[source] io::Error),
    #[error("response body failed: {0}")]
    Body(#[source] BoxError),
    #[error("response body ended before its content-length ({0} bytes missing)")]
    Short(u64),
    #[error("response head refused: {0}")]
    Head(&'static str),
}

// === impl Rewind ===

impl<T> Rewind<T> {
    pub(crate) fn new(inner: T, pre: Bytes) -> Self {
        Self { pre, inner }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Rewind<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.pre.is_empty() {
            let n = self.pre.len().min(buf.remaining());
            buf.put_slice(&self.pre[..n]);
            self.pre.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Rewind<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

// === impl Connection ===

impl Connection {
    /// Serve `io` (already timed by `cx.state`).
    pub(crate) fn new(cx: Ctx, io: BoxIo) -> Self {
        let shutdown = Arc::new(AtomicBool::new(false));
        let fut = Box::pin(run(cx, io, shutdown.clone()));
        Self { fut, shutdown }
    }
}

impl Future for Connection {
    type Output = Result<(), ConnError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.fut.as_mut().poll(cx)
    }
}

impl Graceful for Connection {
    type Failure = ConnError;

    fn graceful_shutdown(self: Pin<&mut Self>) {
        // Seen by the loop when it is polled next (the watcher polls it
        // right after this): idle, it closes; busy, the response in flight
        // says `connection: close`.
        self.shutdown.store(true, Ordering::Release);
    }
}

/// What reading a head found.
#[allow(
    clippy::large_enum_variant,
    reason = "the accepted head is nearly every one, and a box would be an allocation a request; \
              a head is a value of the loop's stack, never of a connection's future"
)]
enum NextHead {
    /// A head the gate accepted, with its framing, as hyper parsed it
    /// (`Err`: hyper's answer to a head it cannot parse).
    Accepted(Result<read::Parsed, StatusCode>, ClientFraming),
    /// A head the gate refused.
    Refused(Refused),
    /// The HTTP/2 preface.
    H2,
    /// Nothing more: the client closed, or shutdown while idle.
    Closed,
}

/// The connection's [`Wire`]: the loop's own while no request body can
/// read it (no lock taken), shared with the body behind a lock while one
/// can (a request with a body, from its head until its exchange is done).
struct Held {
    /// The wire while it is not lent (an empty one while it is).
    own: Box<Wire>,
    /// The wire while the current request's body may read it.
    lent: Option<Arc<Mutex<Wire>>>,
}

fn lock(wire: &Mutex<Wire>) -> std::sync::MutexGuard<'_, Wire> {
    wire.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

thread_local! {
    /// Shared wires (emptied) kept per thread for the bodies of later
    /// requests (`spare::take` and `spare::put`).
    static SHARED: std::cell::RefCell<Vec<Arc<Mutex<Wire>>>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// The wire in `shared`, if nothing else holds it.
fn room(shared: &mut Arc<Mutex<Wire>>) -> Option<&mut Wire> {
    Arc::get_mut(shared).map(|m| {
        m.get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    })
}

// === impl Held ===

impl Held {
    fn new(wire: Wire) -> Self {
        Self {
            own: Box::new(wire),
            lent: None,
        }
    }

    /// `f` on the wire, wherever it is.
    fn with<R>(&mut self, f: impl FnOnce(&mut Wire) -> R) -> R {
        match &self.lent {
            Some(shared) => f(&mut lock(shared)),
            None => f(&mut self.own),
        }
    }

    /// The wire, shared, for a request body to read: in a shared wire a
    /// done body of this thread's gave back (emptied), or a new one.
    fn lend(&mut self) -> Arc<Mutex<Wire>> {
        if let Some(shared) = &self.lent {
            return shared.clone();
        }
        let mut shared = crate::wire::spare::take(&SHARED).unwrap_or_default();
        match room(&mut shared) {
            Some(room) => std::mem::swap(room, &mut self.own),
            // (Spares are kept only unshared.)
            None => shared = Arc::new(Mutex::new(std::mem::take(&mut *self.own))),
        }
        self.lent = Some(shared.clone());
        shared
    }

    /// The wire back from the body it was lent to, once nothing else
    /// holds it (a body that outlives its exchange keeps it shared; it
    /// reads nothing of a later request's, `Wire::seq`).
    fn reclaim(&mut self) {
        let Some(mut shared) = self.lent.take() else {
            return;
        };
        let Some(room) = room(&mut shared) else {
            self.lent = Some(shared);
            return;
        };
        std::mem::swap(room, &mut self.own);
        // The shared wire now holds the empty one: a later body's.
        crate::wire::spare::put(&SHARED, shared);
    }
}

/// Read the next head into the buffer and judge it.
async fn read_head(
    held: &mut Held,
    limits: HeadLimits,
    first: bool,
    shutdown: &AtomicBool,
) -> Result<NextHead, H1Error> {
    let mut scan = HeadScan::new(limits);
    std::future::poll_fn(|cx| {
        held.with(|w| {
            loop {
                if !w.buf.is_empty() {
                    if first {
                        let n = w.buf.len().min(H2_PREFACE.len());
                        if w.buf[..n] == H2_PREFACE[..n] {
                            if n == H2_PREFACE.len() {
                                return Poll::Ready(Ok(NextHead::H2));
                            }
                            // Not decided yet: read more.
                        } else if let Some(h) = judge(w, &mut scan) {
                            return Poll::Ready(Ok(h));
                        }
                    } else if let Some(h) = judge(w, &mut scan) {
                        return Poll::Ready(Ok(h));
                    }
                } else if shutdown.load(Ordering::Acquire) {
                    return Poll::Ready(Ok(NextHead::Closed));
                }
                match w.poll_fill(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(H1Error::Read(e))),
                    Poll::Ready(Ok(0)) => {
                        return Poll::Ready(if w.buf.is_empty() {
                            Ok(NextHead::Closed)
                        } else {
                            Err(H1Error::Incomplete)
                        })
                    }
                    Poll::Ready(Ok(_)) => {}
                }
            }
        })
    })
    .await
}

/// One judging step over the buffer; None when more bytes are needed.
///
/// A head that came whole in the scan's first look is parsed once, the
/// gate's rules checked on what `httparse` found ([`read::at_once`]); any
/// other (one in pieces, one the gate might refuse or rewrite) is judged
/// line by line as its bytes come, then parsed.
fn judge(w: &mut Wire, scan: &mut HeadScan) -> Option<NextHead> {
    if scan.first_look() {
        let mut fields = [read::Span::default(); read::STACK_HEADERS];
        if let Some((end, framing, spans)) = read::at_once(&w.buf, scan.limits(), &mut fields) {
            // (The buffer's empty rest is kept, as below.)
            let head = w.buf.split_to(end).freeze();
            return Some(NextHead::Accepted(
                read::build(&head, spans, &fields),
                framing,
            ));
        }
    }
    match scan.feed(&w.buf) {
        Step::More => None,
        Step::Refuse(status) => {
            let line = gate::request_line(&w.buf);
            w.buf = BytesMut::new();
            Some(NextHead::Refused(Refused { status, line }))
        }
        Step::Done {
            end,
            rewritten,
            framing,
        } => {
            // The buffer's empty rest is kept until the request is done,
            // and then given back for a later head (`spare::read_room`).
            let head = w.buf.split_to(end).freeze();
            let head = rewritten.map_or(head, Bytes::from);
            Some(NextHead::Accepted(read::parse(&head), framing))
        }
    }
}

/// The connection's loop. An `async` block rather than an `async fn`, whose
/// future would hold its arguments twice (rust-lang/rust#62958): this one
/// is every connection's, idle or not, so its size is memory per
/// connection; what is rare (a refused head, HTTP/2, a parse error) is
/// boxed out of it, and each request's state is boxed per request.
#[allow(
    clippy::manual_async_fn,
    reason = "an async fn would hold its arguments twice"
)]
fn run(
    cx: Ctx,
    io: BoxIo,
    shutdown: Arc<AtomicBool>,
) -> impl Future<Output = Result<(), ConnError>> + Send {
    async move {
        let mut held = Held::new(Wire::new(io, BytesMut::new()));
        let mut first = true;
        let mut seq = 0u64;
        loop {
            let was_first = std::mem::replace(&mut first, false);
            // (Matched as a temporary and every other head boxed out: a head
            // bound to a name here, its request moved out of it, would keep
            // its storage in every connection's future across the exchange.)
            let (parsed, framing) = match read_head(&mut held, cx.limits, was_first, &shutdown)
                .await?
            {
                NextHead::Accepted(Ok(parsed), framing) => (parsed, framing),
                other => {
                    return Box::pin(unaccepted(&cx, &mut held, &shutdown, other, was_first)).await
                }
            };
            seq += 1;
            // (Read out of `parsed` first: a closure borrowing it would
            // keep its storage in this future across the exchange.)
            let body = Reading::Body(vigil_http1::Decoder::new(parsed.body));
            let continue_at = parsed.expect_continue.then_some(0);
            held.with(|w| {
                w.seq = seq;
                w.body = body;
                w.continue_at = continue_at;
            });
            // Boxed per request: an idle connection holds no request state.
            let after = crate::wire::spare::boxed(|| {
                exchange(&cx, &mut held, parsed, framing, seq, &shutdown)
            })
            .await?;
            if after == After::Gone {
                return Ok(());
            }
            held.reclaim();
            // The next head, if the rest of this request's body is here
            // already; under one lock of the connection.
            let next = std::future::poll_fn(|task| {
                held.with(|w| {
                    let next =
                        after == After::Next && !shutdown.load(Ordering::Acquire) && drain(w, task);
                    if next {
                        // (drain cleared `continue_at`.)
                        w.seq = 0;
                        w.body = Reading::done();
                        if w.buf.is_empty() {
                            // Idle: no per-request memory held; the buffer the
                            // head came in is a later head's.
                            crate::wire::spare::keep_read_room(std::mem::take(&mut w.buf));
                        }
                        return Poll::Ready(None);
                    }
                    // Closing with the client maybe still sending (a body
                    // not read to its end, bytes past the request): nginx's
                    // lingering close.
                    let unread = !w.body.is_done() || !w.buf.is_empty();
                    Poll::Ready(Some(unread && !w.eof))
                })
            })
            .await;
            match next {
                None => {}
                Some(true) => {
                    Box::pin(linger(&mut held)).await;
                    return Ok(());
                }
                Some(false) => {
                    close(&mut held).await;
                    return Ok(());
                }
            }
        }
    }
}

/// A head that is not a request to serve: the HTTP/2 preface, a head the
/// gate refused or hyper could not parse, or the connection's end.
async fn unaccepted(
    cx: &Ctx,
    wire: &mut Held,
    shutdown: &AtomicBool,
    head: NextHead,
    was_first: bool,
) -> Result<(), ConnError> {
    match head {
        // hyper's answer to a head it cannot parse.
        NextHead::Accepted(Err(status), _) => parse_failed(wire, status).await,
        // (Not passed here: the loop serves it.)
        NextHead::Accepted(Ok(_), _) | NextHead::Closed => {
            close(wire).await;
            Ok(())
        }
        NextHead::H2 if was_first && cx.h2.is_some() => {
            // Boxed: hyper's HTTP/2 connection is kilobytes.
            Box::pin(serve_h2(cx, wire, shutdown)).await
        }
        // HTTP/1 only here: hyper's answer to a head it cannot parse.
        NextHead::H2 => parse_failed(wire, StatusCode::BAD_REQUEST).await,
        NextHead::Refused(refused) => {
            let guard = conn::begin(&cx.state, Version::HTTP_11);
            let mut resp = crate::handler::refused_head(&cx.proxy, cx.local, cx.client, refused);
            conn::prepare(&mut resp, &guard, Version::HTTP_11).map_err(Box::new)?;
            let asked = Asked {
                method: &http::Method::GET,
                version: Version::HTTP_11,
                keep_alive: true,
            };
            let r = write_response(wire, resp, None, &asked).await;
            drop(guard);
            r?;
            // The rest of a refused head may still be coming.
            linger(wire).await;
            Ok(())
        }
    }
}

/// hyper's automatic answer to a head it cannot parse; no request is
/// served, and the connection closes.
async fn parse_failed(wire: &mut Held, status: StatusCode) -> Result<(), ConnError> {
    let mut out = BytesMut::new();
    write::parse_error(status, &mut out);
    let mut q = Out::default();
    q.push(out.freeze());
    q.write(wire).await?;
    linger(wire).await;
    Err(H1Error::Parse(status).into())
}

/// What follows a request on the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum After {
    /// The next head.
    Next,
    /// Close the connection.
    Close,
    /// The stream went to a tunnel: nothing more here.
    Gone,
}

/// Serve one parsed request: the handler, then its response. The request
/// is built before the `async` block, which holds it and not `parsed` too
/// (as an `async fn` would, twice: see [`run`]).
fn exchange<'a>(
    cx: &'a Ctx,
    wire: &'a mut Held,
    parsed: read::Parsed,
    framing: ClientFraming,
    seq: u64,
    shutdown: &'a AtomicBool,
) -> impl Future<Output = Result<After, ConnError>> + Send + 'a {
    let verdict = Verdict {
        refuse: None,
        close: framing == ClientFraming::Opaque,
    };
    let version = parsed.version;
    let keep_alive = parsed.keep_alive;
    let method = parsed.method.clone();
    cx.state.set_request_head(Some(parsed.head));
    let body = RequestBody::H1(H1Body::new(|| wire.lend(), seq, parsed.body));
    let (mut parts, ()) = Request::new(()).into_parts();
    parts.method = parsed.method;
    parts.uri = parsed.uri;
    parts.version = version;
    parts.headers = parsed.headers;
    parts.extensions = crate::wire::spare::extensions();
    let upgrade = if parsed.wants_upgrade {
        let (tx, rx) = oneshot::channel();
        parts
            .extensions
            .insert(PendingUpgrade(Arc::new(Mutex::new(Some(rx)))));
        Some(tx)
    } else {
        None
    };
    async move {
        let guard = conn::begin(&cx.state, version);
        let crate::handler::Handled {
            response: mut resp,
            raw,
        } = match cx.serve {
            Serve::PlainOnTls => {
                tracing::debug!(client = %cx.client, "client sent plain HTTP request to HTTPS port");
                drop((parts, body));
                (cx.plain_to_https)().into()
            }
            serve => {
                if serve == Serve::Tls {
                    parts.extensions.insert(crate::conn::tls::Secure);
                }
                let req = (parts, body);
                // Pinned where it is made: moved into `watch` it would be
                // held twice in this future.
                let handling = std::pin::pin!(crate::handler::handle(
                    &cx.proxy, cx.local, cx.client, req, &cx.state
                ));
                watch(handling, wire, &cx.state).await
            }
        };
        gate::close_if_blind(&verdict, &mut resp);
        if let Err(abort) = conn::prepare(&mut resp, &guard, version) {
            return Err(Box::new(abort) as ConnError);
        }
        let switching = resp.status() == StatusCode::SWITCHING_PROTOCOLS;
        let asked = Asked {
            method: &method,
            version,
            keep_alive: keep_alive && !shutdown.load(Ordering::Acquire),
        };
        // An idle connection holds no buffer (the head's neither).
        cx.state.set_request_head(None);
        let written = write_response(wire, resp, raw.as_deref(), &asked).await;
        if let Some(raw) = raw {
            crate::wire::spare::keep_raw_fields(raw);
        }
        drop(guard);
        let last = written?;
        if switching {
            let (io, pre) = wire.with(|w| {
                w.seq = 0;
                (w.io.take(), w.buf.split().freeze())
            });
            if let (Some(io), Some(tx)) = (io, upgrade) {
                let _ = tx.send(Box::new(Rewind::new(io, pre)));
            }
            return Ok(After::Gone);
        }
        Ok(if last || verdict.close {
            After::Close
        } else {
            After::Next
        })
    }
}

/// Drive `handling` (a request's handler) and, while it runs, watch the
/// client's side of the connection as nginx's
/// `ngx_http_upstream_check_broken_connection` does: once the request body
/// is read, the client closing or resetting the connection is noted in
/// `state` ([`ConnState::client_gone`]) and the handler polled again at
/// once (it ends its attempts: 499); bytes of a next request end the watch.
/// The watch costs no system call while nothing comes: the socket's read
/// readiness is clear after the head's read, so the poll only registers.
async fn watch<F: Future>(
    mut handling: Pin<&mut F>,
    wire: &mut Held,
    state: &ConnState,
) -> F::Output {
    let mut watching = true;
    std::future::poll_fn(|task| loop {
        if let Poll::Ready(out) = handling.as_mut().poll(task) {
            return Poll::Ready(out);
        }
        if !watching {
            return Poll::Pending;
        }
        match wire.with(|w| client_left(w, task)) {
            Some(true) => {
                watching = false;
                state.set_client_gone();
            }
            Some(false) => {
                watching = false;
                return Poll::Pending;
            }
            None => return Poll::Pending,
        }
    })
    .await
}

/// Whether the client left while its request is served (`Some(true)`: it
/// closed or reset the connection; `Some(false)`: a next request's bytes
/// came, the watch ends), or not yet known (None; the task is woken when
/// the socket has news). While the body is still to be read, its reader
/// sees a close (and answers 400): None.
fn client_left(w: &mut Wire, task: &mut Context<'_>) -> Option<bool> {
    if !w.body.is_done() || w.continue_at.is_some() || w.io.is_none() {
        return None;
    }
    if !w.buf.is_empty() {
        return Some(false);
    }
    if w.eof {
        return Some(true);
    }
    // A plain TCP stream is asked for its readiness alone: nothing to read
    // (nearly always) costs only the registration, not a read's layers.
    let io: Option<&mut dyn std::any::Any> = w.io.as_mut().map(|io| &mut **io as _);
    if let Some(tcp) = io.and_then(|io| io.downcast_mut::<conn::TimedIo<crate::conn::sock::Tcp>>())
    {
        match tcp.inner().poll_read_ready(task) {
            Poll::Pending => return None,
            Poll::Ready(Err(_)) => return Some(true),
            // Something came (or the readiness is stale): read to know.
            Poll::Ready(Ok(())) => {}
        }
    }
    match w.poll_fill(task) {
        Poll::Pending => None,
        Poll::Ready(Ok(0) | Err(_)) => Some(true),
        Poll::Ready(Ok(_)) => Some(false),
    }
}

/// Discard what is left of the request body if it is already here
/// (hyper's `poll_drain_or_close_read`); false when the connection must close.
fn drain(w: &mut Wire, task: &mut Context<'_>) -> bool {
    w.continue_at = None;
    let mut drained = 0usize;
    loop {
        match w.poll_body(task) {
            Poll::Ready(None) => return true,
            Poll::Ready(Some(Ok(f))) => {
                drained += f.data_ref().map_or(0, Bytes::len);
                if drained > DRAIN_LIMIT {
                    return false;
                }
            }
            Poll::Ready(Some(Err(_))) | Poll::Pending => return false,
        }
    }
}

/// Shut the stream down (as hyper does before dropping it).
async fn close(wire: &mut Held) {
    let _ = std::future::poll_fn(|cx| {
        wire.with(|w| match w.io.as_mut() {
            Some(io) => Pin::new(io).poll_shutdown(cx),
            None => Poll::Ready(Ok(())),
        })
    })
    .await;
}

/// Close as nginx's lingering close does (`ngx_http_set_lingering_close`)
/// where the client may still be sending: shut the sending side (the
/// client sees the end of the response at once), then read and discard
/// until the client closes, it is silent for [`LINGERING_TIMEOUT`], or
/// [`LINGERING_TIME`] passed. A close with unread bytes would reset the
/// connection, and a client still sending would lose the response that
/// was written before it had read it.
async fn linger(wire: &mut Held) {
    close(wire).await;
    let until = crate::conn::timer::after(LINGERING_TIME);
    loop {
        if wire.with(|w| w.eof || w.io.is_none()) || tokio::time::Instant::now() >= until {
            return;
        }
        let deadline = until.min(crate::conn::timer::after(LINGERING_TIMEOUT));
        let read = std::future::poll_fn(|cx| wire.with(|w| discard(w, cx)));
        match crate::conn::timer::timeout_at(deadline, read).await {
            Ok(true) => {}
            Ok(false) | Err(_) => return,
        }
    }
}

/// One read of what the client sends, discarded; false at its end.
fn discard(w: &mut Wire, cx: &mut Context<'_>) -> Poll<bool> {
    w.buf.clear();
    let Some(io) = w.io.as_mut() else {
        return Poll::Ready(false);
    };
    let mut chunk = [0u8; LINGERING_BUFFER];
    let mut rb = ReadBuf::new(&mut chunk);
    match Pin::new(io).poll_read(cx, &mut rb) {
        Poll::Ready(Ok(())) if !rb.filled().is_empty() => Poll::Ready(true),
        Poll::Ready(_) => {
            w.eof = true;
            Poll::Ready(false)
        }
        Poll::Pending => Poll::Pending,
    }
}

/// Hand the connection to hyper's HTTP/2 server, with the bytes read.
async fn serve_h2(cx: &Ctx, wire: &mut Held, shutdown: &AtomicBool) -> Result<(), ConnError> {
    let (io, pre) = wire.with(|w| (w.io.take(), w.buf.split().freeze()));
    let (Some(io), Some(builder)) = (io, cx.h2.as_ref()) else {
        return Ok(());
    };
    let (proxy, local, client, state) = (cx.proxy.clone(), cx.local, cx.client, cx.state.clone());
    let svc = conn::tracking(
        cx.state.clone(),
        move |req: Request<hyper::body::Incoming>| {
            let (proxy, state) = (proxy.clone(), state.clone());
            async move {
                let req = RequestBody::hyper_request(req);
                crate::handler::handle(&proxy, local, client, req, &state)
                    .await
                    .response
            }
        },
    );
    let conn = builder
        .serve_connection_with_upgrades(TokioIo::new(Rewind::new(io, pre)), svc)
        .into_owned();
    let mut conn = std::pin::pin!(conn);
    let mut told = false;
    // The watcher's drain and idle GOAWAY reach hyper's connection.
    std::future::poll_fn(|cx| {
        if !told && shutdown.load(Ordering::Acquire) {
            told = true;
            conn.as_mut().graceful_shutdown();
        }
        conn.as_mut().poll(cx)
    })
    .await
}

/// Pieces of a response waiting to be written: its head, in the worker's
/// head room (`spare::head_room`), given back as soon as it is written
/// (not split off it as `Bytes`: a shared buffer's reference count, two
/// locked instructions a response); then the body's pieces, on the stack
/// while they are four (a body; a chunk's size, data and end), where a
/// `VecDeque` was an allocation per response.
#[derive(Default)]
struct Out {
    head: Option<BytesMut>,
    pieces: SmallVec<[Bytes; 4]>,
    /// The first piece not yet written whole.
    front: usize,
}

impl Out {
    /// Write `head` (what is not written yet of it) before the pieces.
    fn head(&mut self, head: BytesMut) {
        self.head = Some(head);
        self.wrote_head(0);
    }

    /// `n` bytes were written from the front of the head.
    fn wrote_head(&mut self, n: usize) {
        if let Some(h) = &mut self.head {
            h.advance(n.min(h.len()));
            if h.is_empty() {
                if let Some(room) = self.head.take() {
                    crate::wire::spare::keep_head_room(room);
                }
            }
        }
    }

    fn push(&mut self, b: Bytes) {
        if !b.is_empty() {
            self.pieces.push(b);
        }
    }

    fn push_static(&mut self, b: &'static [u8]) {
        self.pieces.push(Bytes::from_static(b));
    }

    fn full(&self) -> bool {
        self.pieces.len() - self.front >= MAX_PIECES
    }

    /// Write everything (one `writev` where the stream takes it) and flush.
    async fn write(&mut self, wire: &mut Held) -> Result<(), H1Error> {
        std::future::poll_fn(|cx| {
            wire.with(|w| {
                let Some(io) = w.io.as_mut() else {
                    return Poll::Ready(Err(H1Error::Write(io::ErrorKind::NotConnected.into())));
                };
                let mut io = Pin::new(io);
                let head = self.head.as_ref().map_or(0, BytesMut::len);
                if !io.is_write_vectored()
                    && usize::from(head > 0) + self.pieces.len() - self.front > 1
                {
                    let rest = &self.pieces[self.front..];
                    let mut flat =
                        BytesMut::with_capacity(head + rest.iter().map(Bytes::len).sum::<usize>());
                    if let Some(h) = &self.head {
                        flat.extend_from_slice(h);
                    }
                    for p in rest {
                        flat.extend_from_slice(p);
                    }
                    self.wrote_head(head);
                    self.pieces.clear();
                    self.front = 0;
                    self.pieces.push(flat.freeze());
                }
                while self.head.is_some() || self.front < self.pieces.len() {
                    let mut slices = [io::IoSlice::new(&[]); MAX_PIECES];
                    let mut k = 0;
                    if let Some(h) = &self.head {
                        slices[0] = io::IoSlice::new(h);
                        k = 1;
                    }
                    for p in self.pieces[self.front..].iter().take(MAX_PIECES - k) {
                        slices[k] = io::IoSlice::new(p);
                        k += 1;
                    }
                    let n = match io.as_mut().poll_write_vectored(cx, &slices[..k]) {
                        Poll::Ready(Ok(0)) => {
                            return Poll::Ready(Err(H1Error::Write(
                                io::ErrorKind::WriteZero.into(),
                            )))
                        }
                        Poll::Ready(Ok(n)) => n,
                        Poll::Ready(Err(e)) => return Poll::Ready(Err(H1Error::Write(e))),
                        Poll::Pending => return Poll::Pending,
                    };
                    let head = self.head.as_ref().map_or(0, BytesMut::len).min(n);
                    self.wrote_head(head);
                    let mut left = n - head;
                    while left > 0 {
                        let Some(front) = self.pieces.get_mut(self.front) else {
                            break;
                        };
                        if front.len() <= left {
                            left -= front.len();
                            self.front += 1;
                        } else {
                            front.advance(left);
                            left = 0;
                        }
                    }
                }
                // All written: the pieces go, the room stays.
                self.pieces.clear();
                self.front = 0;
                io.as_mut().poll_flush(cx).map_err(H1Error::Write)
            })
        })
        .await
    }
}

/// The next frame of `body` if it is ready now.
fn try_frame(
    body: &mut UpBody,
) -> impl Future<Output = Poll<Option<Result<hyper::body::Frame<Bytes>, BoxError>>>> + '_ {
    std::future::poll_fn(move |cx| Poll::Ready(Pin::new(&mut *body).poll_frame(cx)))
}

/// The next frame of `body`: at once if ready, else after writing what is
/// buffered.
async fn next_frame(
    body: &mut UpBody,
    out: &mut Out,
    wire: &mut Held,
) -> Result<Option<hyper::body::Frame<Bytes>>, H1Error> {
    let polled = match try_frame(body).await {
        Poll::Ready(f) => f,
        Poll::Pending => {
            out.write(wire).await?;
            std::future::poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await
        }
    };
    polled.transpose().map_err(H1Error::Body)
}

/// Write `resp` as hyper would to a request `asked`; true when the
/// connection closes after it.
async fn write_response(
    wire: &mut Held,
    resp: Response<UpBody>,
    raw: Option<&crate::wire::raw_head::RawFields>,
    asked: &Asked<'_>,
) -> Result<bool, H1Error> {
    let (mut parts, mut body) = resp.into_parts();
    let length = if body.is_end_stream() {
        BodyLength::None
    } else {
        body.size_hint()
            .exact()
            .map_or(BodyLength::Unknown, BodyLength::Known)
    };
    let reason = parts
        .extensions
        .get::<hyper::ext::ReasonPhrase>()
        .map(|r| r.as_bytes());
    let mut head = crate::wire::spare::head_room();
    let fields = write::RespHead {
        status: parts.status,
        version: parts.version,
        reason,
        headers: &mut parts.headers,
        raw,
    };
    let encoded = write::encode(fields, length, asked, &mut head);
    // Written: the map's room is a later message's, and so is the table
    // of the extensions (and the head's buffer, once the head is sent).
    crate::wire::spare::keep(parts.headers);
    crate::wire::spare::keep_extensions(parts.extensions);
    let encoded = match encoded {
        Ok(e) => e,
        Err(e) => {
            crate::wire::spare::keep_head_room(head);
            return Err(H1Error::Head(e));
        }
    };
    let mut out = Out::default();
    out.head(head);
    match encoded.framing {
        write::RespFraming::Length(0) => {}
        write::RespFraming::Length(mut rest) => {
            while rest > 0 {
                let Some(frame) = next_frame(&mut body, &mut out, wire).await? else {
                    out.write(wire).await?;
                    return Err(H1Error::Short(rest));
                };
                let Ok(mut data) = frame.into_data() else {
                    continue;
                };
                if let Ok(r) = usize::try_from(rest) {
                    data.truncate(r);
                }
                rest -= data.len() as u64;
                out.push(data);
                if out.full() {
                    out.write(wire).await?;
                }
            }
        }
        write::RespFraming::Chunked(allowed) => loop {
            let Some(frame) = next_frame(&mut body, &mut out, wire).await? else {
                out.push_static(b"0\r\n\r\n");
                break;
            };
            match frame.into_data() {
                Ok(data) => {
                    let eos = body.is_end_stream();
                    if !data.is_empty() {
                        out.push(write::chunk_size(data.len()));
                        out.push(data);
                        if eos {
                            out.push_static(b"\r\n0\r\n\r\n");
                            break;
                        }
                        out.push_static(b"\r\n");
                    } else if eos {
                        out.push_static(b"0\r\n\r\n");
                        break;
                    }
                }
                Err(frame) => {
                    if let Ok(t) = frame.into_trailers() {
                        match allowed.as_deref().and_then(|a| write::trailers(a, &t)) {
                            Some(enc) => out.push(enc),
                            None => out.push_static(b"0\r\n\r\n"),
                        }
                        break;
                    }
                }
            }
            if out.full() {
                out.write(wire).await?;
            }
        },
        write::RespFraming::CloseDelimited => {
            while let Some(frame) = next_frame(&mut body, &mut out, wire).await? {
                if let Ok(data) = frame.into_data() {
                    out.push(data);
                }
                if out.full() {
                    out.write(wire).await?;
                }
            }
        }
    }
    drop(body);
    out.write(wire).await?;
    Ok(encoded.last)
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncWriteExt;

    use super::*;

    fn uri(h: &NextHead) -> String {
        match h {
            NextHead::Accepted(Ok(parsed), _) => parsed.uri.to_string(),
            _ => "not accepted".into(),
        }
    }

    #[test]
    fn a_wire_lent_to_a_body_comes_back_once_nothing_else_holds_it() {
        let (_c, s) = tokio::io::duplex(64);
        let mut held = Held::new(Wire::new(Box::new(s), BytesMut::from(&b"rest"[..])));
        held.with(|w| w.seq = 7);
        let body = held.lend();
        assert!(held.own.io.is_none(), "lent: the loop keeps an empty wire");
        assert_eq!(lock(&body).seq, 7);
        assert!(Arc::ptr_eq(&body, &held.lend()), "lent once per request");
        held.with(|w| w.seq = 8);
        // A body that outlives its exchange keeps the wire shared.
        held.reclaim();
        assert!(held.lent.is_some());
        assert_eq!(held.with(|w| w.seq), 8, "the lent wire is the one used");
        drop(body);
        held.reclaim();
        assert!(held.lent.is_none(), "back once the body is gone");
        assert!(held.own.io.is_some());
        assert_eq!(&held.own.buf[..], b"rest");
        assert_eq!(held.with(|w| w.seq), 8);
        // The next body's shared wire is the one this body gave back.
        let given_back = SHARED.with(|s| s.borrow().last().map(Arc::as_ptr));
        assert!(given_back.is_some(), "kept for a later body");
        let body = held.lend();
        assert_eq!(Some(Arc::as_ptr(&body)), given_back);
        assert_eq!(lock(&body).seq, 8);
        assert_eq!(&lock(&body).buf[..], b"rest");
        drop(body);
        held.reclaim();
        assert!(held.lent.is_none() && held.own.io.is_some());
    }

    #[tokio::test]
    async fn pipelined_heads_stay_in_the_buffer_and_an_idle_connection_holds_none() {
        let (mut c, s) = tokio::io::duplex(4096);
        let mut wire = Held::new(Wire::new(Box::new(s), BytesMut::new()));
        let off = AtomicBool::new(false);
        let limits = HeadLimits::default();
        c.write_all(b"GET /1 HTTP/1.1\r\nHost: a\r\n\r\nGET /2 HTTP/1.1\r\nHost: a\r\n\r\n")
            .await
            .unwrap();
        let h = read_head(&mut wire, limits, true, &off).await.unwrap();
        assert_eq!(uri(&h), "/1");
        assert!(!wire.own.buf.is_empty(), "the second head is kept");
        let h = read_head(&mut wire, limits, false, &off).await.unwrap();
        assert_eq!(uri(&h), "/2");
        assert_eq!(wire.own.buf.capacity(), 0, "no buffer while idle");
        // A drain while idle closes at once.
        off.store(true, Ordering::Release);
        let h = read_head(&mut wire, limits, false, &off).await.unwrap();
        assert!(matches!(h, NextHead::Closed));
    }

    /// A stream that takes a few bytes a write, and is not ready every
    /// other time it is asked.
    struct Trickle {
        got: Arc<Mutex<Vec<u8>>>,
        vectored: bool,
        calls: usize,
    }

    impl AsyncRead for Trickle {
        fn poll_read(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            _: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    impl AsyncWrite for Trickle {
        fn poll_write(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.poll_write_vectored(cx, &[io::IoSlice::new(buf)])
        }

        fn poll_write_vectored(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            bufs: &[io::IoSlice<'_>],
        ) -> Poll<io::Result<usize>> {
            self.calls += 1;
            if self.calls.is_multiple_of(2) {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            let mut room = 5;
            let mut n = 0;
            let mut got = self.got.lock().unwrap();
            for b in bufs {
                let take = b.len().min(room);
                got.extend_from_slice(&b[..take]);
                (room, n) = (room - take, n + take);
                if room == 0 {
                    break;
                }
            }
            Poll::Ready(Ok(n))
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn is_write_vectored(&self) -> bool {
            self.vectored
        }
    }

    #[tokio::test]
    async fn queued_pieces_go_out_whole_and_in_order_through_short_writes() {
        let pieces: Vec<String> = (0..22).map(|i| format!("piece {i}; ")).collect();
        for vectored in [false, true] {
            let got = Arc::new(Mutex::new(Vec::new()));
            let io = Trickle {
                got: got.clone(),
                vectored,
                calls: 0,
            };
            let mut wire = Held::new(Wire::new(Box::new(io), BytesMut::new()));
            let mut out = Out::default();
            // A head first, in the worker's head room (taken from it).
            let mut head = crate::wire::spare::head_room();
            head.extend_from_slice(b"HTTP/1.1 200 OK\r\nx: yz\r\n\r\n");
            let room = head.as_ptr() as usize..head.as_ptr() as usize + head.capacity();
            out.head(head);
            // More than the four on the stack, and past MAX_PIECES (a
            // write before the queue takes more), an empty one among them.
            for (i, p) in pieces.iter().enumerate() {
                if out.full() {
                    out.write(&mut wire).await.unwrap();
                }
                if i == 3 {
                    out.push(Bytes::new());
                }
                out.push(Bytes::from(p.clone()));
            }
            out.push_static(b"end");
            out.write(&mut wire).await.unwrap();
            let want = "HTTP/1.1 200 OK\r\nx: yz\r\n\r\n".to_string() + &pieces.concat() + "end";
            assert_eq!(
                String::from_utf8(got.lock().unwrap().clone()).unwrap(),
                want,
                "vectored: {vectored}"
            );
            assert_eq!((out.pieces.len(), out.front), (0, 0), "nothing left queued");
            assert!(out.head.is_none(), "the head is written");
            let again = crate::wire::spare::head_room();
            assert!(again.is_empty());
            assert!(
                room.contains(&(again.as_ptr() as usize)),
                "the head room given back is the next head's"
            );
        }
    }

    /// The size of what `f` returns, without calling it.
    fn returned_size<A, R>(_: impl FnOnce(A) -> R) -> usize {
        std::mem::size_of::<R>()
    }

    #[test]
    fn the_futures_of_a_connection_and_of_a_request_stay_small() {
        type ExchangeArgs = (
            &'static Ctx,
            &'static mut Held,
            read::Parsed,
            ClientFraming,
            u64,
            &'static AtomicBool,
        );
        type HandleArgs = (
            &'static Arc<Proxy>,
            SocketAddr,
            SocketAddr,
            (http::request::Parts, RequestBody),
            &'static Arc<crate::conn::ConnState>,
        );
        type AttemptArgs = (
            &'static crate::nginx::route::Route,
            &'static vigil_core::peer::Peer,
        );
        // Every connection holds its loop's future, idle or not: memory per
        // connection. Each request boxes its exchange (the handler inside),
        // each attempt its own: a copy of the whole future each time, and
        // past 1,032 bytes glibc's slower path for the allocation. The
        // bounds: the sizes with the rare paths boxed, no argument held
        // twice and hyper's HTTP/2 builder shared (the loop, the exchange
        // and the handler: 472, 2,736 and 2,368 bytes in a test build with
        // rust 1.95, since the loop holds no head of its own and the
        // handler captures a request's parts and body rather than the
        // request; as `async fn`s with the rare paths inline and a builder
        // each they were 1,632, 5,216 and 4,160), and room to grow; an
        // attempt (784 bytes, was 3,816) boxes its connect and its send,
        // to stay under glibc's limit.
        let sizes = [
            (
                "the connection loop",
                returned_size(|(cx, io, off): (Ctx, BoxIo, Arc<AtomicBool>)| run(cx, io, off)),
                550,
            ),
            (
                "a request's exchange",
                returned_size(|(cx, w, p, f, n, off): ExchangeArgs| exchange(cx, w, p, f, n, off)),
                4100,
            ),
            (
                "the handler",
                returned_size(|(p, l, c, r, s): HandleArgs| crate::handler::handle(p, l, c, r, s)),
                3500,
            ),
            (
                "an attempt",
                returned_size(|(route, peer): AttemptArgs| {
                    crate::upstream::attempt::run(route, peer, None, true, None, None, |_| {
                        unreachable!("the future is measured, not run")
                    })
                }),
                1024,
            ),
        ];
        for (what, size, _) in &sizes {
            eprintln!("{what}: {size} bytes");
        }
        let over: Vec<String> = sizes
            .iter()
            .filter(|(_, size, bound)| size > bound)
            .map(|(what, size, bound)| format!("{what}: {size} bytes, more than {bound}"))
            .collect();
        assert!(over.is_empty(), "{}", over.join("; "));
    }

    #[tokio::test]
    async fn the_http2_preface_is_recognised_only_first_and_in_pieces() {
        let (mut c, s) = tokio::io::duplex(4096);
        let mut wire = Held::new(Wire::new(Box::new(s), BytesMut::new()));
        let off = AtomicBool::new(false);
        let (a, b) = H2_PREFACE.split_at(10);
        c.write_all(a).await.unwrap();
        let read = read_head(&mut wire, HeadLimits::default(), true, &off);
        tokio::pin!(read);
        assert!(futures_util::poll!(read.as_mut()).is_pending());
        c.write_all(b).await.unwrap();
        assert!(matches!(read.await.unwrap(), NextHead::H2));
    }

    #[tokio::test]
    async fn a_refused_head_carries_its_request_line_and_a_partial_one_at_eof_is_an_error() {
        let (mut c, s) = tokio::io::duplex(4096);
        let mut wire = Held::new(Wire::new(Box::new(s), BytesMut::new()));
        let off = AtomicBool::new(false);
        c.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        match read_head(&mut wire, HeadLimits::default(), true, &off)
            .await
            .unwrap()
        {
            NextHead::Refused(r) => {
                assert_eq!(r.status, StatusCode::BAD_REQUEST, "no Host");
                assert_eq!(r.line.as_deref(), Some(&b"GET / HTTP/1.1"[..]));
            }
            _ => panic!("accepted a head without Host"),
        }
        let (mut c, s) = tokio::io::duplex(4096);
        let mut wire = Held::new(Wire::new(Box::new(s), BytesMut::new()));
        c.write_all(b"GET / HT").await.unwrap();
        drop(c);
        assert!(matches!(
            read_head(&mut wire, HeadLimits::default(), true, &off).await,
            Err(H1Error::Incomplete)
        ));
    }
}
#[cfg(test)]
mod tmp_sizes {
    use super::*;
    fn returned_size<A, R>(_: impl FnOnce(A) -> R) -> usize {
        std::mem::size_of::<R>()
    }
    #[test]
    fn tmp_sizes() {
        eprintln!(
            "read_head {}",
            returned_size(
                |(h, l, f, s): (&'static mut Held, HeadLimits, bool, &'static AtomicBool)| {
                    read_head(h, l, f, s)
                }
            )
        );
        eprintln!(
            "Head {} Parsed {} HeadScan {}",
            std::mem::size_of::<NextHead>(),
            std::mem::size_of::<read::Parsed>(),
            std::mem::size_of::<HeadScan>()
        );
        eprintln!("close {}", returned_size(|h: &'static mut Held| close(h)));
    }
}
