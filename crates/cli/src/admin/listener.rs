//! The admin API's accept loop. The admin listener shares the process's
//! file descriptors with the proxy, so it is bounded like the proxy's, and
//! so that idle or slow clients cannot keep an operator out:
//!
//! - HTTP/1.1 only (the CLI speaks nothing else; no HTTP/2 connection can
//!   sit idle without a header timer);
//! - [`HEADER_TIMEOUT`]: from the connection's first poll, or the end of the
//!   previous response on a kept-alive connection, to the end of the request
//!   header (hyper's `header_read_timeout`). A connection that never sends a
//!   byte is closed after it, and so is a kept-alive one left idle: the
//!   header timer is the keep-alive idle timeout too. Shorter than nginx's
//!   60 s `client_header_timeout`: the CLI sends its head in one write;
//! - [`SEND_TIMEOUT`] (nginx's `send_timeout` default): a response write that
//!   makes no progress for that long closes the connection (a client that
//!   asks for `/metrics` and never reads);
//! - at most [`MAX_CONNECTIONS`] open at once. At the cap a new connection
//!   closes the one that has waited longest without a request in hand
//!   ([`slots`](super::slots): idle keep-alive, a head still coming, a
//!   stalled write), as nginx reuses idle connections; only when every one
//!   is being answered is the new one closed at once. Both are counted and
//!   logged at most once per [`REFUSED_LOG_INTERVAL`].

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::slots::{Admission, Slot, Slots};
use super::Admin;

/// Most admin connections open at once.
pub const MAX_CONNECTIONS: usize = 256;
/// Time to receive a request header, and the keep-alive idle timeout.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest stall of a response write (nginx `send_timeout` default).
pub const SEND_TIMEOUT: Duration = Duration::from_secs(60);
/// Refused and closed-for-room connections are logged at most this often.
pub const REFUSED_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// The bounds of the admin listener (the constants above by default).
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Most connections open at once.
    pub max_connections: usize,
    /// Time to receive a request header, and the keep-alive idle timeout.
    pub header_timeout: Duration,
    /// Longest stall of a response write.
    pub send_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: MAX_CONNECTIONS,
            header_timeout: HEADER_TIMEOUT,
            send_timeout: SEND_TIMEOUT,
        }
    }
}

/// Connections refused, and closed to make room, at the cap since start
/// (shared by an `Admin`'s clones).
#[derive(Debug, Default)]
pub(super) struct Refused {
    refused: AtomicU64,
    evicted: AtomicU64,
}

impl Refused {
    pub(super) fn get(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    pub(super) fn evicted(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }
}

/// Serve on `listener` until `shutdown` (open connections close then too).
pub(super) async fn serve(admin: Admin, listener: TcpListener, shutdown: CancellationToken) {
    let limits = admin.limits;
    let slots = Slots::new(limits.max_connections);
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true);
    let mut log = AtCap::default();
    let addr = match listener.local_addr() {
        Ok(a) => a,
        Err(e) => {
            tracing::error!(error = %e, "admin listener has no address");
            return;
        }
    };
    let open = TaskTracker::new();
    vigil_net::accept_loop(
        &listener,
        "admin",
        addr,
        &shutdown,
        &open,
        |stream, peer| {
            let place = match slots.admit(Instant::now()) {
                Admission::Admitted(p) => p,
                Admission::Evicted(p) => {
                    admin.refused.evicted.fetch_add(1, Ordering::Relaxed);
                    log.note(false, limits.max_connections, peer);
                    p
                }
                Admission::Full => {
                    drop(stream);
                    admin.refused.refused.fetch_add(1, Ordering::Relaxed);
                    log.note(true, limits.max_connections, peer);
                    return None;
                }
            };
            let a = admin.clone();
            let slot = place.slot();
            let svc = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                let response = a.answer(&req).map(|body| slot.answer(body));
                async move { Ok::<_, std::convert::Infallible>(response) }
            });
            let io = TokioIo::new(
                SendTimeout::new(stream, limits.send_timeout).reporting_to(place.slot()),
            );
            let conn = builder.serve_connection(io, svc);
            let stop = shutdown.clone();
            Some(async move {
                tokio::pin!(conn);
                tokio::select! {
                    r = conn.as_mut() => {
                        if let Err(e) = r {
                            tracing::debug!(%peer, error = %e, "admin connection closed");
                        }
                    }
                    _ = place.closed().cancelled() => {
                        tracing::debug!(%peer, "admin connection closed to make room for a new one");
                    }
                    _ = stop.cancelled() => {}
                }
                drop(place);
            })
        },
    )
    .await;
}

/// What was done at the cap since the last log line.
#[derive(Default)]
struct AtCap {
    refused: u64,
    evicted: u64,
    last_log: Option<Instant>,
}

impl AtCap {
    /// One more new connection `refused` (else one closed for room); log
    /// the counts if the last line is old enough.
    fn note(&mut self, refused: bool, max: usize, last: std::net::SocketAddr) {
        if refused {
            self.refused += 1;
        } else {
            self.evicted += 1;
        }
        if self
            .last_log
            .is_none_or(|t| t.elapsed() >= REFUSED_LOG_INTERVAL)
        {
            tracing::warn!(
                closed_for_room = self.evicted,
                refused = self.refused,
                max,
                %last,
                "admin API connection limit reached: the longest-idle connections were closed to make room; \
                 new ones are refused only while every connection is being answered"
            );
            *self = AtCap {
                last_log: Some(Instant::now()),
                ..AtCap::default()
            };
        }
    }
}

/// An I/O stream whose writes fail with `TimedOut` after making no progress
/// for `timeout` (nginx's `send_timeout`: the time between two writes).
pub(super) struct SendTimeout<S> {
    inner: S,
    timeout: Duration,
    stalled: Option<Pin<Box<Sleep>>>,
    /// Told when a write stalls and when it moves again.
    slot: Option<Slot>,
}

impl<S> SendTimeout<S> {
    pub(super) fn new(inner: S, timeout: Duration) -> Self {
        Self {
            inner,
            timeout,
            stalled: None,
            slot: None,
        }
    }

    /// Tell `slot` when a write stalls (the connection may then give way
    /// to a new one) and when it moves again.
    pub(super) fn reporting_to(mut self, slot: Slot) -> Self {
        self.slot = Some(slot);
        self
    }

    /// After the inner write returned `Pending`: fail once the stall is too long.
    fn pending<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        let timeout = self.timeout;
        if self.stalled.is_none() {
            if let Some(slot) = &self.slot {
                slot.stalled(Some(Instant::now()));
            }
        }
        let sleep = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        if sleep.as_mut().poll(cx).is_ready() {
            self.stalled = None;
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client read nothing for {}s", timeout.as_secs()),
            )));
        }
        Poll::Pending
    }

    fn progress<T>(&mut self, r: Poll<io::Result<T>>, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        match r {
            Poll::Pending => self.pending(cx),
            ready => {
                if self.stalled.take().is_some() {
                    if let Some(slot) = &self.slot {
                        slot.stalled(None);
                    }
                }
                ready
            }
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for SendTimeout<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for SendTimeout<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.progress(r, cx)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_flush(cx);
        self.progress(r, cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.progress(r, cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.progress(r, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
