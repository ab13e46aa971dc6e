//! The socket under an upstream HTTP/1.1 connection: TCP, TLS over TCP
//! (`proxy_pass https://`), or a unix-domain socket (`server unix:/path`).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};
use tokio_rustls::client::TlsStream;

/// A connected stream to a peer.
#[derive(Debug)]
pub(crate) enum Stream {
    /// TCP (TCP_NODELAY set by the connector), written through
    /// [`crate::conn::sock`].
    Tcp(TcpStream),
    /// TLS over TCP, the handshake done. Boxed: rustls's connection state
    /// is over a kilobyte, and a plain connection should not carry it.
    Tls(Box<TlsStream<TcpStream>>),
    /// A unix-domain socket.
    Unix(UnixStream),
}

impl Stream {
    /// Read what is there without waiting (`WouldBlock` when nothing is).
    /// TLS: what rustls can decrypt from what the socket has, polled once
    /// with a waker nobody waits on (the next real poll registers its own).
    pub(crate) fn try_read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.try_read(buf),
            Stream::Unix(s) => s.try_read(buf),
            Stream::Tls(s) => {
                let mut cx = Context::from_waker(Waker::noop());
                let mut rb = ReadBuf::new(buf);
                match Pin::new(&mut **s).poll_read(&mut cx, &mut rb) {
                    Poll::Ready(Ok(())) => Ok(rb.filled().len()),
                    Poll::Ready(Err(e)) => Err(e),
                    Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
                }
            }
        }
    }

    /// Write what fits without waiting (`WouldBlock` when nothing does).
    /// TLS: what rustls took, some of which may wait in its buffer for the
    /// socket: [`Stream::unflushed`] says so, and a flush sends it.
    pub(crate) fn try_write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => crate::conn::sock::try_send(s, buf),
            Stream::Unix(s) => s.try_write(buf),
            Stream::Tls(s) => {
                let mut cx = Context::from_waker(Waker::noop());
                match Pin::new(&mut **s).poll_write(&mut cx, buf) {
                    Poll::Ready(r) => r,
                    Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
                }
            }
        }
    }

    /// Whether written bytes wait in this stream's own buffer (TLS
    /// records rustls made that the socket has not taken yet).
    pub(crate) fn unflushed(&self) -> bool {
        match self {
            Stream::Tls(s) => s.get_ref().1.wants_write(),
            Stream::Tcp(_) | Stream::Unix(_) => false,
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(&mut **s).poll_read(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => crate::conn::sock::poll_send(s, cx, buf),
            Stream::Tls(s) => Pin::new(&mut **s).poll_write(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => crate::conn::sock::poll_writev(s, cx, bufs),
            Stream::Tls(s) => Pin::new(&mut **s).poll_write_vectored(cx, bufs),
            Stream::Unix(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Tcp(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
            Stream::Unix(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(&mut **s).poll_flush(cx),
            Stream::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(&mut **s).poll_shutdown(cx),
            Stream::Unix(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}
