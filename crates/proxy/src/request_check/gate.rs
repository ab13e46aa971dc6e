//! The client connection as hyper reads it: every HTTP/1 request head goes
//! through [`HeadScan`] first. An accepted head is handed on (with invalid
//! lines cut), then its `Content-Length` body byte for byte, then the next
//! head; a refused head is replaced by a stand-in head whose [`Verdict`]
//! tells the service to answer nginx's status and close. After a chunked
//! body or an upgrade request the gate stops judging heads and passes bytes
//! through (the response closes the connection unless it is a tunnel), as
//! it does for an HTTP/2 connection from its preface on.

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use http::header::{self, HeaderValue};
use http::{Request, Response, StatusCode, Version};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::{Framing, HeadLimits, HeadScan, Step, Verdict};

/// The HTTP/2 connection preface (RFC 9113 §3.4).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// What a refused head is replaced by: hyper reads it as a request, and the
/// service answers the verdict's status to it.
const STAND_IN: &[u8] = b"GET / HTTP/1.1\r\nHost: refused\r\n\r\n";

/// The verdicts of one connection's heads, in order, from the gate to the
/// service (hyper serves HTTP/1 requests one after the other), with a
/// refused head's request line.
#[derive(Clone, Debug, Default)]
pub(crate) struct Verdicts(Arc<Mutex<VecDeque<Judged>>>);

/// One head's verdict, and its request line when it was refused.
type Judged = (Verdict, Option<Bytes>);

/// A refused head: the status to answer, and its request line as read
/// (for the access log; None when no whole line came).
#[derive(Debug)]
pub(crate) struct Refused {
    /// nginx's status for the head.
    pub(crate) status: StatusCode,
    /// The request line, without its line end.
    pub(crate) line: Option<Bytes>,
}

/// A client connection with its request heads judged.
pub(crate) struct Gate<I> {
    inner: I,
    limits: HeadLimits,
    verdicts: Verdicts,
    state: State,
    /// Read from `inner`, not handed to hyper yet.
    buf: BytesMut,
    /// Ready for hyper.
    out: BytesMut,
    first: bool,
}

#[derive(Debug)]
enum State {
    Head(HeadScan),
    Body(u64),
    /// Pass everything through.
    Blind,
    /// A head was refused: nothing more is read.
    Stopped,
}

// === impl Verdicts ===

impl Verdicts {
    fn push(&self, v: Verdict, line: Option<Bytes>) {
        if let Ok(mut q) = self.0.lock() {
            q.push_back((v, line));
        }
    }

    fn pop(&self) -> Option<Judged> {
        self.0.lock().ok()?.pop_front()
    }

    /// Admit one request hyper parsed: `Err` is the status to answer a
    /// refused head with (see [`refused`]), also for a request the gate did
    /// not see (never expected). HTTP/2 requests are not judged here.
    pub(crate) fn admit<B>(&self, mut req: Request<B>) -> Result<Request<B>, Refused> {
        if req.version() >= Version::HTTP_2 {
            return Ok(req);
        }
        match self.pop() {
            Some((v @ Verdict { refuse: None, .. }, _)) => {
                req.extensions_mut().insert(v);
                Ok(req)
            }
            Some((
                Verdict {
                    refuse: Some(status),
                    ..
                },
                line,
            )) => Err(Refused { status, line }),
            None => {
                tracing::error!("request without a judged head; closing the connection");
                Err(Refused {
                    status: StatusCode::BAD_REQUEST,
                    line: None,
                })
            }
        }
    }
}

/// Close the connection after `resp` when the gate stopped judging heads
/// on it, unless `resp` turned it into a tunnel.
pub(crate) fn close_if_blind<B>(verdict: Option<&Verdict>, resp: &mut Response<B>) {
    if verdict.is_some_and(|v| v.close) && resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
}

/// The request line at the start of `head` (after the empty lines nginx
/// skips), without its line end; None before a whole line.
pub(crate) fn request_line(head: &[u8]) -> Option<Bytes> {
    let start = head.iter().position(|b| *b != b'\r' && *b != b'\n')?;
    let rest = &head[start..];
    let end = rest.iter().position(|b| *b == b'\n')?;
    let line = rest[..end].strip_suffix(b"\r").unwrap_or(&rest[..end]);
    Some(Bytes::copy_from_slice(line))
}

/// nginx's error page for a refused head; the connection closes after it.
pub(crate) fn refused(status: StatusCode) -> Response<crate::payload::UpBody> {
    let mut resp = crate::status_page::error_page(status);
    resp.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    resp
}

// === impl Gate ===

impl<I> Gate<I> {
    /// Judge the heads read from `inner` with `limits`, telling `verdicts`.
    pub(crate) fn new(inner: I, limits: HeadLimits, verdicts: Verdicts) -> Self {
        Self {
            inner,
            limits,
            verdicts,
            state: State::Head(HeadScan::new(limits)),
            buf: BytesMut::new(),
            out: BytesMut::new(),
            first: true,
        }
    }

    /// Move what is decided from `buf` to `out`. `false` when more bytes
    /// must be read first.
    fn advance(&mut self) -> bool {
        match &mut self.state {
            State::Stopped => false,
            State::Blind => {
                if self.buf.is_empty() {
                    return false;
                }
                let all = self.buf.split();
                self.out.unsplit(all);
                true
            }
            State::Body(rest) => {
                if self.buf.is_empty() {
                    return false;
                }
                let n = usize::try_from(*rest).map_or(self.buf.len(), |r| r.min(self.buf.len()));
                let body = self.buf.split_to(n);
                self.out.unsplit(body);
                *rest -= n as u64;
                if *rest == 0 {
                    self.state = State::Head(HeadScan::new(self.limits));
                }
                true
            }
            State::Head(scan) => {
                if self.buf.is_empty() {
                    return false;
                }
                if self.first {
                    let n = self.buf.len().min(H2_PREFACE.len());
                    if self.buf[..n] == H2_PREFACE[..n] {
                        if n < H2_PREFACE.len() {
                            return false;
                        }
                        self.state = State::Blind;
                        return true;
                    }
                }
                match scan.feed(&self.buf) {
                    Step::More => false,
                    Step::Refuse(status) => {
                        let line = request_line(&self.buf);
                        let refused = Verdict {
                            refuse: Some(status),
                            close: true,
                        };
                        self.verdicts.push(refused, line);
                        self.buf.clear();
                        self.out.extend_from_slice(STAND_IN);
                        self.state = State::Stopped;
                        true
                    }
                    Step::Done {
                        end,
                        rewritten,
                        framing,
                    } => {
                        self.first = false;
                        let accepted = Verdict {
                            refuse: None,
                            close: framing == Framing::Opaque,
                        };
                        self.verdicts.push(accepted, None);
                        let head = self.buf.split_to(end);
                        match rewritten {
                            Some(h) => self.out.extend_from_slice(&h),
                            None => self.out.unsplit(head),
                        }
                        self.state = match framing {
                            Framing::None | Framing::Length(0) => {
                                State::Head(HeadScan::new(self.limits))
                            }
                            Framing::Length(n) => State::Body(n),
                            Framing::Opaque => State::Blind,
                        };
                        true
                    }
                }
            }
        }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Gate<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        dst: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if !this.out.is_empty() {
                let n = this.out.len().min(dst.remaining());
                dst.put_slice(&this.out[..n]);
                this.out.advance(n);
                return Poll::Ready(Ok(()));
            }
            if this.advance() {
                continue;
            }
            if matches!(this.state, State::Stopped) {
                // hyper answers the stand-in head and closes.
                return Poll::Pending;
            }
            // Straight into hyper's buffer when every byte read is passed on.
            let direct = this.buf.is_empty()
                && match this.state {
                    State::Blind => true,
                    State::Body(rest) => rest >= dst.remaining() as u64,
                    _ => false,
                };
            if direct {
                let before = dst.filled().len();
                ready!(Pin::new(&mut this.inner).poll_read(cx, dst))?;
                if let State::Body(rest) = &mut this.state {
                    let n = (dst.filled().len() - before) as u64;
                    *rest -= n;
                    if *rest == 0 {
                        this.state = State::Head(HeadScan::new(this.limits));
                    }
                }
                return Poll::Ready(Ok(()));
            }
            // A stack chunk, left uninitialised (no 8 KiB zeroed per read),
            // and not the buffer's own spare room: reserved there, 8 KiB
            // would stay allocated by every idle keep-alive connection
            // (the read waits with it), as benches/load/idle.py showed.
            let mut chunk = [std::mem::MaybeUninit::<u8>::uninit(); 8192];
            let mut rb = ReadBuf::uninit(&mut chunk);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut rb))?;
            if rb.filled().is_empty() {
                // EOF: a partial head or body is dropped; hyper sees the end.
                return Poll::Ready(Ok(()));
            }
            this.buf.extend_from_slice(rb.filled());
        }
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Gate<I> {
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
