//! The response body on a connection of [`super::H1`]: framed by
//! Content-Length, chunked or the close, decoded by vigil's one HTTP/1
//! body codec ([`vigil_http1::Decoder`]).
//! Errors are `std::io::Error`s of the kinds the error log maps to
//! nginx's lines (`UnexpectedEof`: premature close; `InvalidData`: a bad
//! chunk).

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes};
use hyper::body::{Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use vigil_http1::{Decoded, Decoder, Framing, Premature};

use super::{Rest, H1};

/// A response body that owns its connection. (Its flags are the
/// connection's, [`Exchange`]: in the room beside `H1::read_size`, where
/// fields of their own would make the body, moved with every response, a
/// word larger.)
pub(crate) struct RespBody {
    conn: Option<H1>,
    body: Decoder,
    /// What is left to send of a request body the peer answered before it
    /// all went (see [`RespBody::pump`]).
    rest: Option<Box<Rest>>,
}

/// Where the exchange on a connection stands, for its response body.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Exchange {
    /// The connection may be kept once the body ends cleanly.
    pub(super) keep: bool,
    /// The response is a 101: the connection goes to a tunnel.
    pub(super) upgrade: bool,
    /// A failure was seen and held back one turn (see `poll_frame`).
    pub(super) held: bool,
}

/// How far [`RespBody::pump`] got.
enum Pumped {
    /// It waits for the socket or the client.
    Waiting,
    /// All of the body went.
    Sent,
    /// The body or the write failed: no more of it goes.
    Failed,
}

impl RespBody {
    pub(super) fn new(
        mut conn: H1,
        body: Decoder,
        keep: bool,
        upgrade: bool,
        rest: Option<Box<Rest>>,
    ) -> Self {
        conn.exchange = Exchange {
            keep,
            upgrade,
            held: false,
        };
        Self {
            conn: Some(conn),
            body,
            rest,
        }
    }

    /// The connection, when the body ended cleanly, nothing came past its
    /// end, the whole request went and it may be kept.
    pub(crate) fn reclaim(&mut self) -> Option<H1> {
        let keep = self.conn.as_ref().is_some_and(|c| c.exchange.keep);
        if !keep || !self.body.is_done() || self.rest.is_some() {
            return None;
        }
        let conn = self.conn.take()?;
        conn.buf.is_empty().then_some(conn)
    }

    /// Send what the client gives of a request body the peer answered
    /// before it all went, while the response is read: nginx goes on
    /// sending it until it finalizes the request (and a peer that answers
    /// as it reads needs it). No timer of its own: a peer that stops
    /// reading is held to `proxy_read_timeout` by its response; what is
    /// not sent when the response ends is dropped with it.
    fn pump(&mut self, cx: &mut Context<'_>) {
        let (Some(rest), Some(conn)) = (self.rest.as_deref_mut(), self.conn.as_mut()) else {
            return;
        };
        let pumped = loop {
            if rest.failed {
                break Pumped::Failed;
            }
            if !conn.out.is_empty() {
                match Pin::new(&mut conn.io).poll_write(cx, &conn.out) {
                    Poll::Ready(Ok(n)) if n > 0 => {
                        conn.out.drain(..n);
                        continue;
                    }
                    Poll::Pending => break Pumped::Waiting,
                    Poll::Ready(_) => break Pumped::Failed,
                }
            }
            // TLS: what rustls took but the socket did not goes before
            // more is asked of the client (and before the body is done).
            if conn.io.unflushed() {
                match Pin::new(&mut conn.io).poll_flush(cx) {
                    Poll::Ready(Ok(())) => {}
                    Poll::Pending => break Pumped::Waiting,
                    Poll::Ready(Err(_)) => break Pumped::Failed,
                }
            }
            let Some(body) = rest.body.as_mut() else {
                break Pumped::Sent;
            };
            match hyper::body::Body::poll_frame(Pin::new(body), cx) {
                Poll::Pending => break Pumped::Waiting,
                Poll::Ready(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        super::put_piece(&mut conn.out, rest.framing, &mut rest.left, data);
                    }
                    if rest.left == Some(0) {
                        rest.body = None;
                    }
                }
                Poll::Ready(None) => {
                    if super::put_end(&mut conn.out, rest.framing, rest.left).is_err() {
                        break Pumped::Failed;
                    }
                    rest.body = None;
                }
                Poll::Ready(Some(Err(_))) => break Pumped::Failed,
            }
        };
        match pumped {
            Pumped::Waiting => {}
            Pumped::Sent => self.rest = None,
            Pumped::Failed => {
                self.rest = None;
                conn.exchange.keep = false;
            }
        }
    }

    /// The connection of a 101, with what was read past the head.
    pub(crate) fn upgraded(mut self) -> Option<Upgraded> {
        let conn = self.conn.take()?;
        if !conn.exchange.upgrade {
            return None;
        }
        let (io, pre) = super::into_parts(conn);
        Some(Upgraded {
            io,
            pre: pre.freeze(),
        })
    }

    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<io::Result<Frame<Bytes>>>> {
        if self.rest.is_some() {
            self.pump(cx);
        }
        loop {
            let Some(conn) = self.conn.as_mut() else {
                return Poll::Ready(None);
            };
            match self.body.decode(&mut conn.buf) {
                Ok(Some(Decoded::Data(d))) => return Poll::Ready(Some(Ok(Frame::data(d)))),
                Ok(Some(Decoded::Trailers(t))) => return Poll::Ready(Some(Ok(Frame::trailers(t)))),
                Ok(Some(Decoded::End)) => return Poll::Ready(None),
                Ok(None) => {}
                Err(what) => return Poll::Ready(Some(Err(invalid(what)))),
            }
            if ready!(conn.poll_read_more(cx))? == 0 {
                return Poll::Ready(match self.body.closed() {
                    Ok(()) => None,
                    Err(Premature) => Some(Err(eof())),
                });
            }
        }
    }
}

impl hyper::body::Body for RespBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<io::Result<Frame<Bytes>>>> {
        let this = self.get_mut();
        let r = this.poll_next(cx);
        if let Poll::Ready(Some(Err(_))) = &r {
            let first = this
                .conn
                .as_mut()
                .is_some_and(|c| !std::mem::replace(&mut c.exchange.held, true));
            if first {
                // The bytes before the failure go out first: the server
                // writes what it took when the body waits, and a failure
                // at once would abort the response before its head left
                // (hyper's client delivered it one hop later too).
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            // A broken body leaves the connection unusable (and the body
            // at its end).
            this.body = Decoder::new(Framing::Empty);
            this.conn = None;
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_done()
    }

    fn size_hint(&self) -> SizeHint {
        match self.body.remaining() {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}

fn eof() -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "upstream closed the connection before the body was complete",
    )
}

fn invalid(what: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

/// An upgraded (101) upstream connection: the bytes read past the head
/// first, then the socket.
pub(crate) struct Upgraded {
    io: super::Stream,
    pre: Bytes,
}

impl AsyncRead for Upgraded {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.pre.is_empty() {
            let n = this.pre.len().min(buf.remaining());
            buf.put_slice(&this.pre[..n]);
            this.pre.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Upgraded {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}
