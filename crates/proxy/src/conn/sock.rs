//! TCP writes, and reads into initialized room, made as system calls of
//! their own (a leaf).
//!
//! In a process with more than one thread, glibc wraps each `send` and
//! `writev` in a cancellation point: two compare-and-swaps on the thread's
//! cancellation state around the call (`__pthread_enable_asynccancel`,
//! `__pthread_disable_asynccancel`), about 1 % of a worker's CPU with two
//! writes a request (docs/performance.md). nginx, single-threaded, skips
//! them. vigil never cancels a thread, so the writes to clients and to
//! peers go to the kernel through rustix instead, under tokio's readiness
//! ([`TcpStream::try_io`]): the same calls, the same flags (`MSG_NOSIGNAL`
//! on `send`, as std sets it), the same errors, and tokio's readiness rule
//! ([`try_op`]): a short read or write (the socket emptied, or full) clears
//! the readiness as a `WouldBlock` does, so the next one waits for the
//! next event instead of finding `EAGAIN` itself.
//!
//! A client's read goes the same way when its room is initialized memory
//! already ([`ReadBuf::initialized`] covers it): a request head's first
//! read, into a worker's own chunk zeroed once ([`crate::wire::h1`]'s
//! `Wire::poll_fill`), and the tunnel's. A read into uninitialized room
//! (the rest of a head, a body, the upstream response's: into a buffer's
//! spare capacity; hyper's) stays tokio's: passing that room to the
//! kernel needs code this crate does not allow (`unsafe`), and zeroing it
//! first costs more than the wrapper.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use rustix::net::{RecvFlags, SendFlags};
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::TcpStream;

/// A client's TCP stream whose writes are [`poll_send`] and [`poll_writev`],
/// and whose reads into initialized room are `recv` through rustix.
#[derive(Debug)]
pub(crate) struct Tcp(TcpStream);

/// `op` (a read or write of up to `want` bytes) under tokio's readiness
/// for `interest`, as tokio's own reads and writes do it: not tried while
/// the socket is not ready; a `WouldBlock` clears the readiness, and so
/// does a short transfer (the socket emptied, or full), whose bytes are
/// still returned.
fn try_op(
    s: &TcpStream,
    interest: Interest,
    want: usize,
    op: impl FnOnce() -> rustix::io::Result<usize>,
) -> io::Result<usize> {
    let mut short = None;
    let r = s.try_io(interest, || {
        let n = op().map_err(io::Error::from)?;
        if n > 0 && n < want {
            short = Some(n);
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(n)
    });
    short.map_or(r, Ok)
}

/// Write what fits of `buf` without waiting (`WouldBlock` when nothing does).
pub(crate) fn try_send(s: &TcpStream, buf: &[u8]) -> io::Result<usize> {
    try_op(s, Interest::WRITABLE, buf.len(), || {
        rustix::net::send(s, buf, SendFlags::NOSIGNAL)
    })
}

/// Read into `buf` without waiting (`WouldBlock` when nothing is there).
fn try_recv(s: &TcpStream, buf: &mut [u8]) -> io::Result<usize> {
    let want = buf.len();
    try_op(s, Interest::READABLE, want, || {
        rustix::net::recv(s, &mut *buf, RecvFlags::empty()).map(|(n, _)| n)
    })
}

/// Write `bufs` in one call, without waiting.
fn try_writev(s: &TcpStream, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
    let want = bufs.iter().map(|b| b.len()).sum();
    try_op(s, Interest::WRITABLE, want, || rustix::io::writev(s, bufs))
}

/// Write what fits of `buf`, once the socket takes some.
pub(crate) fn poll_send(
    s: &TcpStream,
    cx: &mut Context<'_>,
    buf: &[u8],
) -> Poll<io::Result<usize>> {
    poll_with(cx, |cx| s.poll_write_ready(cx), || try_send(s, buf))
}

/// Write what fits of `bufs` in one call, once the socket takes some.
pub(crate) fn poll_writev(
    s: &TcpStream,
    cx: &mut Context<'_>,
    bufs: &[IoSlice<'_>],
) -> Poll<io::Result<usize>> {
    poll_with(cx, |cx| s.poll_write_ready(cx), || try_writev(s, bufs))
}

/// tokio's read and write loop: wait until ready, try; a `WouldBlock`
/// (or a short transfer, [`try_op`]) cleared the readiness, so the next
/// wait registers the task.
fn poll_with(
    cx: &mut Context<'_>,
    mut ready: impl FnMut(&mut Context<'_>) -> Poll<io::Result<()>>,
    mut op: impl FnMut() -> io::Result<usize>,
) -> Poll<io::Result<usize>> {
    loop {
        ready!(ready(cx))?;
        match op() {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            r => return Poll::Ready(r),
        }
    }
}

// === impl Tcp ===

impl Tcp {
    pub(crate) fn new(s: TcpStream) -> Self {
        Self(s)
    }

    /// Ready once something can be read (bytes, or the end); registers the
    /// task otherwise. Reads nothing.
    pub(crate) fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.0.poll_read_ready(cx)
    }
}

impl AsyncRead for Tcp {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let s = &mut self.get_mut().0;
        if buf.initialized().len() < buf.capacity() {
            return Pin::new(s).poll_read(cx, buf);
        }
        let s = &*s;
        // All the room is initialized: read into it ourselves, as tokio's
        // read loop does.
        let n = ready!(poll_with(
            cx,
            |cx| s.poll_read_ready(cx),
            || try_recv(s, buf.initialize_unfilled())
        ))?;
        buf.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Tcp {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        poll_send(&self.0, cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        poll_writev(&self.0, cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    async fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (s, _) = l.accept().await.unwrap();
        (s, c)
    }

    #[tokio::test]
    async fn writes_reach_the_peer_whole_and_vectored() {
        let (s, mut peer) = pair().await;
        let mut tcp = Tcp::new(s);
        tcp.write_all(b"head ").await.unwrap();
        let n = tcp
            .write_vectored(&[IoSlice::new(b"one "), IoSlice::new(b"two")])
            .await
            .unwrap();
        assert_eq!(n, 7, "a small vectored write is taken whole");
        tcp.shutdown().await.unwrap();
        let mut got = Vec::new();
        peer.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"head one two");
    }

    #[tokio::test]
    async fn a_full_socket_waits_for_room_then_writes() {
        let (s, mut peer) = pair().await;
        let chunk = vec![7u8; 64 * 1024];
        let mut queued = 0usize;
        // Fill the socket: a write that finds no room says WouldBlock and
        // clears tokio's readiness.
        loop {
            match try_send(&s, &chunk) {
                Ok(n) => queued += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if s.poll_write_ready(&mut Context::from_waker(std::task::Waker::noop()))
                        .is_pending()
                    {
                        break;
                    }
                }
                Err(e) => panic!("{e}"),
            }
        }
        let mut tcp = Tcp::new(s);
        let reader = tokio::spawn(async move {
            let mut got = 0usize;
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                match peer.read(&mut buf).await.unwrap() {
                    0 => return got,
                    n => got += n,
                }
            }
        });
        // Pending until the peer reads, then written: the wait registered.
        // (Bounded: a wait that never registered would hang.)
        let wait = std::time::Duration::from_secs(30);
        tokio::time::timeout(wait, tcp.write_all(&chunk))
            .await
            .expect("woken once the peer read")
            .unwrap();
        tcp.shutdown().await.unwrap();
        assert_eq!(reader.await.unwrap(), queued + chunk.len());
    }

    #[tokio::test]
    async fn reads_into_initialized_and_uninitialized_room_get_the_same_bytes() {
        let (s, mut peer) = pair().await;
        let mut tcp = Tcp::new(s);
        // Nothing there yet: the read waits (registered: the peer's write
        // wakes it; bounded, so a wait that never registered fails).
        let writer = tokio::spawn(async move {
            tokio::task::yield_now().await;
            peer.write_all(b"first").await.unwrap();
            peer
        });
        let wait = std::time::Duration::from_secs(30);
        let mut room = [0u8; 16];
        let n = tokio::time::timeout(wait, tcp.read(&mut room))
            .await
            .expect("woken by the peer's write")
            .unwrap();
        assert_eq!(&room[..n], b"first", "into initialized room (rustix)");
        // A short read emptied the socket: the readiness is cleared, as
        // tokio's read clears it (the next read waits for an event, where
        // it would otherwise try the socket and find EAGAIN).
        let mut noop = Context::from_waker(std::task::Waker::noop());
        assert!(
            tcp.0.poll_read_ready(&mut noop).is_pending(),
            "readiness cleared by the short read"
        );
        let mut peer = writer.await.unwrap();
        peer.write_all(b"second").await.unwrap();
        let mut uninit = [std::mem::MaybeUninit::<u8>::uninit(); 16];
        let mut rb = ReadBuf::uninit(&mut uninit);
        std::future::poll_fn(|cx| Pin::new(&mut tcp).poll_read(cx, &mut rb))
            .await
            .unwrap();
        assert_eq!(rb.filled(), b"second", "into uninitialized room (tokio)");
        drop(peer);
        let n = tcp.read(&mut room).await.unwrap();
        assert_eq!(n, 0, "the peer's close is the end");
    }

    #[tokio::test]
    async fn a_write_to_a_reset_connection_is_an_error() {
        let (s, peer) = pair().await;
        peer.set_zero_linger().unwrap();
        drop(peer);
        let mut tcp = Tcp::new(s);
        let mut failed = None;
        for _ in 0..64 {
            if let Err(e) = tcp.write_all(b"after the reset").await {
                failed = Some(e.kind());
                break;
            }
        }
        let kind = failed.expect("the reset is seen by a write");
        assert!(
            matches!(
                kind,
                io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe
            ),
            "{kind:?}"
        );
    }
}
