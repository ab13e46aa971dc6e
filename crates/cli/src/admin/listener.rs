//! The admin API's accept loop. The admin listener shares the process's
//! file descriptors with the proxy, so it is bounded like the proxy's:
//!
//! - HTTP/1.1 only (the CLI speaks nothing else; no HTTP/2 connection can
//!   sit idle without a header timer);
//! - [`HEADER_TIMEOUT`] (nginx's `client_header_timeout` default, as the
//!   proxy listener): from the connection's first poll, or the end of the
//!   previous response on a kept-alive connection, to the end of the request
//!   header. A connection that never sends a byte is closed after it, and so
//!   is a kept-alive one left idle: the header timer is the keep-alive idle
//!   timeout too;
//! - [`SEND_TIMEOUT`] (nginx's `send_timeout` default): a response write that
//!   makes no progress for that long closes the connection (a client that
//!   asks for `/metrics` and never reads);
//! - at most [`MAX_CONNECTIONS`] open at once: a connection past that is
//!   closed at once, counted, and logged at most once per
//!   [`REFUSED_LOG_INTERVAL`].

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::Admin;

/// Most admin connections open at once.
pub const MAX_CONNECTIONS: usize = 256;
/// Time to receive a request header (nginx `client_header_timeout` default).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest stall of a response write (nginx `send_timeout` default).
pub const SEND_TIMEOUT: Duration = Duration::from_secs(60);
/// Refused connections are logged at most this often.
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

/// Connections refused at the cap since start (shared by an `Admin`'s clones).
#[derive(Debug, Default)]
pub(super) struct Refused(AtomicU64);

impl Refused {
    pub(super) fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Serve on `listener` until `shutdown` (open connections close then too).
pub(super) async fn serve(admin: Admin, listener: TcpListener, shutdown: CancellationToken) {
    let limits = admin.limits;
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true);
    let mut unlogged = 0u64;
    let mut last_log: Option<Instant> = None;
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
            let Ok(permit) = permits.clone().try_acquire_owned() else {
                drop(stream);
                admin.refused.0.fetch_add(1, Ordering::Relaxed);
                unlogged += 1;
                if last_log.is_none_or(|t| t.elapsed() >= REFUSED_LOG_INTERVAL) {
                    tracing::warn!(
                        refused = unlogged,
                        max = limits.max_connections,
                        last = %peer,
                        "admin API connection limit reached; new connections are closed at once"
                    );
                    unlogged = 0;
                    last_log = Some(Instant::now());
                }
                return None;
            };
            let a = admin.clone();
            let svc = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                let a = a.clone();
                async move { Ok::<_, std::convert::Infallible>(a.answer(&req)) }
            });
            let io = TokioIo::new(SendTimeout::new(stream, limits.send_timeout));
            let conn = builder.serve_connection(io, svc);
            let stop = shutdown.clone();
            Some(async move {
                let _permit = permit;
                tokio::pin!(conn);
                tokio::select! {
                    r = conn.as_mut() => {
                        if let Err(e) = r {
                            tracing::debug!(%peer, error = %e, "admin connection closed");
                        }
                    }
                    _ = stop.cancelled() => {}
                }
            })
        },
    )
    .await;
}

/// An I/O stream whose writes fail with `TimedOut` after making no progress
/// for `timeout` (nginx's `send_timeout`: the time between two writes).
pub(super) struct SendTimeout<S> {
    inner: S,
    timeout: Duration,
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<S> SendTimeout<S> {
    pub(super) fn new(inner: S, timeout: Duration) -> Self {
        Self {
            inner,
            timeout,
            stalled: None,
        }
    }

    /// After the inner write returned `Pending`: fail once the stall is too long.
    fn pending<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        let timeout = self.timeout;
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
                self.stalled = None;
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
