//! The connection's socket, telling its [`ConnState`] about the bytes that
//! come in (the first byte of a request after an idle period) and the
//! writes that cannot proceed (`send_timeout`).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::ConnState;

/// The connection's IO, reporting reads and blocked writes to its [`ConnState`].
pub(crate) struct TimedIo<T> {
    inner: T,
    state: Arc<ConnState>,
}

// === impl TimedIo ===

impl<T> TimedIo<T> {
    pub(crate) fn new(inner: T, state: Arc<ConnState>) -> Self {
        Self { inner, state }
    }

    /// The stream it times.
    pub(crate) fn inner(&self) -> &T {
        &self.inner
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
