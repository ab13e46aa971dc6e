//! The HTTP/1.1 upstream client, plain and TLS: the request's own task
//! writes the request and reads the response on a connection it owns
//! ([`H1`]), with no dispatcher task and no channel between them. The
//! response body ([`RespBody`]) owns the connection and hands it back only once the body
//! ended cleanly on a connection that may be kept.
//!
//! The bytes on the wire are hyper's (the client this replaced): the
//! request line, the header map in its order with lowercase names, the
//! body framed by Content-Length or chunked by hyper's rules; the response
//! head parsed with `httparse` with hyper's limits and framed as hyper's
//! client frames it. A TLS peer is spoken to the same way, over
//! rustls's stream ([`Stream::Tls`]).
//!
//! A peer may answer before it has read the whole request body (a 413, a
//! 401, a stream that answers as it reads): while the body goes, the
//! response head is watched for, as nginx reads the upstream whenever it
//! is readable. An early head is the response; what is left of the body
//! ([`Rest`]) is sent while the response is read, and dropped when the
//! response ends (nginx sends the body until it finalizes the request).

mod body;
mod head;
mod stream;

// One attempt against a peer, the connections it opens and keeps.
pub(crate) mod attempt;
pub mod connect;
pub(crate) mod pool;

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, BufMut, BytesMut};
use http::{Method, Response};
use http_body_util::BodyExt;
use hyper::body::Body as _;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

use crate::wire::hop::Names;
use crate::wire::payload::{BoxError, UpBody};
use crate::wire::raw_head::RawFields;

pub(crate) use body::RespBody;
pub(crate) use head::{put, RequestFields, Values};
pub(crate) use stream::Stream;

/// The longest response head read (hyper's default read buffer limit).
const MAX_HEAD: usize = 8192 + 4096 * 100;
/// Reads start at this size and grow while they fill.
const READ_MIN: u32 = 8 * 1024;
const READ_MAX: u32 = 64 * 1024;

/// One HTTP/1.1 connection to a peer (plain, TLS or unix).
pub(crate) struct H1 {
    io: Stream,
    /// Bytes read and not yet consumed (empty while idle).
    buf: BytesMut,
    /// The next read's size (grows while reads fill it).
    read_size: u32,
    /// The exchange in progress, for its response body.
    exchange: body::Exchange,
    /// The request head (and small bodies) on their way out.
    out: Vec<u8>,
}

/// A response head read from a peer, its body to come.
pub(crate) struct Received {
    pub(crate) response: Response<RespBody>,
    /// Its fields as they came, the map then empty (where the route
    /// passes fields so: see [`crate::wire::raw_head`]).
    pub(crate) raw: Option<Box<RawFields>>,
}

/// Which of nginx's two request timers ran out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// `proxy_send_timeout`: between two writes of the request.
    Sending,
    /// `proxy_read_timeout`: for the response header once all was sent.
    Waiting,
}

/// Why an exchange failed before a response header.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    /// Writing the request failed; `written`: whether any byte went out.
    #[error("writing the request failed: {source}")]
    Write {
        /// The OS error.
        #[source]
        source: io::Error,
        /// Some of the request left.
        written: bool,
    },
    /// Reading the response head failed.
    #[error("reading the response header failed: {0}")]
    Read(#[source] io::Error),
    /// The peer closed before a whole response head.
    #[error("connection closed before message completed")]
    Closed,
    /// The response head is not valid HTTP/1.x.
    #[error("invalid response header: {0}")]
    Parse(String),
    /// The response head has more than hyper's 100 header fields.
    #[error("invalid response header: too many header fields")]
    TooManyFields,
    /// The request body failed (the client's side).
    #[error("request body failed: {0}")]
    Body(#[source] BoxError),
    /// A timer ran out.
    #[error("timed out")]
    Timeout(Phase),
}

/// The two request timers.
#[derive(Clone, Copy, Debug)]
pub(crate) struct UpstreamTimers {
    /// `proxy_send_timeout`.
    pub(crate) send: Duration,
    /// `proxy_read_timeout`.
    pub(crate) read: Duration,
}

/// How the request body is framed on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BodyFraming {
    None,
    Length(u64),
    Chunked,
}

/// What is left to send of a request body the peer answered before it
/// all went; the bytes framed and not yet written wait in [`H1::out`].
pub(crate) struct Rest {
    /// The body, None once it ended (or its Content-Length went).
    body: Option<UpBody>,
    framing: BodyFraming,
    /// Content-Length bytes still to frame.
    left: Option<u64>,
    /// A write failed after the peer answered: nothing more goes, and the
    /// connection is not kept.
    failed: bool,
}

/// A request head written where its connection sends it from, straight
/// from the request's fields (no header map), by hyper's client rules.
pub(crate) struct HeadOut<'o> {
    out: &'o mut Vec<u8>,
}

impl<'o> HeadOut<'o> {
    /// A head written at the end of `out`.
    pub(crate) fn new(out: &'o mut Vec<u8>) -> Self {
        Self { out }
    }

    /// Write the request line (`target` as it is: nginx sends the URI it
    /// made, bytes a `Uri` refuses included; see [`crate::handler`]'s
    /// check for the bytes that cannot go on a request line) and `fields`,
    /// framed for `body` as hyper's client frames it (`set_length`).
    pub(crate) fn write(
        self,
        method: &Method,
        target: &str,
        fields: &mut impl RequestFields,
        body: &UpBody,
    ) -> Written {
        let (te, close, upgrade) = head::request_facts(fields);
        let framing = set_length(fields, method, body, te);
        head::encode(method, target, fields, self.out);
        Written {
            method: method.clone(),
            framing,
            close,
            upgrade,
        }
    }
}

/// What the client keeps of a request whose head [`HeadOut`] wrote.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Written {
    method: Method,
    framing: BodyFraming,
    /// Its `Connection` asks to close after the response.
    close: bool,
    /// It asks to `Upgrade`.
    pub(crate) upgrade: bool,
}

impl H1 {
    /// A connection over `io` (connected, TCP_NODELAY set on TCP).
    pub(crate) fn new(io: Stream) -> Self {
        Self {
            io,
            buf: BytesMut::new(),
            read_size: READ_MIN,
            exchange: body::Exchange::default(),
            out: Vec::new(),
        }
    }

    /// Whether an idle connection is still usable: nothing arrived on it
    /// (a close, or bytes nobody asked for, make it unusable). Checked
    /// without waiting, at checkout.
    pub(crate) fn is_usable(&mut self) -> bool {
        if !self.buf.is_empty() {
            return false;
        }
        let mut probe = [0u8; 1];
        match self.io.try_read(&mut probe) {
            Err(e) => e.kind() == io::ErrorKind::WouldBlock,
            Ok(_) => false,
        }
    }

    /// Where the next request's head is written: the connection's own
    /// buffer, emptied.
    pub(crate) fn head_out(&mut self) -> HeadOut<'_> {
        self.out.clear();
        HeadOut::new(&mut self.out)
    }

    /// Send the request whose head [`H1::head_out`] took, and `body`, and
    /// read the response head, within nginx's two timers. An `async`
    /// block, holding `self` once (rust-lang/rust#62958), with a body's
    /// writing boxed out of it. The fields in `hidden` stay out of the
    /// response's map (see [`head::parse_with`]); `raw`: nothing on the
    /// response's way reads or edits its fields, which may then come as
    /// they came ([`crate::wire::raw_head`], in [`Received::raw`]).
    #[allow(
        clippy::manual_async_fn,
        reason = "an async fn would hold its arguments twice"
    )]
    pub(crate) fn send<'h>(
        mut self,
        written: Written,
        mut body: UpBody,
        t: UpstreamTimers,
        hidden: &'h Names,
        raw: bool,
    ) -> impl Future<Output = Result<Received, Error>> + Send + 'h {
        async move {
            let Written {
                method,
                framing,
                close,
                ..
            } = written;
            let keep = !close;
            let mut sent = false;
            // Some when the peer answered before the whole body went.
            let mut rest = None;
            if matches!(framing, BodyFraming::None | BodyFraming::Length(0)) {
                self.write_out(&mut sent, None, t.send).await?;
            } else {
                rest = Box::pin(self.send_body(&mut body, framing, &mut sent, t.send)).await?;
            }
            drop(body);
            let deadline = vigil_net::clock::coarse_now() + t.read;
            let head = loop {
                if !self.buf.is_empty() {
                    match head::parse_with(&mut self.buf, hidden, raw)? {
                        Some(h) if h.status.is_informational() && h.status.as_u16() != 101 => {
                            continue
                        }
                        Some(h) => break h,
                        None if self.buf.len() >= MAX_HEAD => {
                            return Err(Error::Parse("response header too large".to_owned()))
                        }
                        None => {}
                    }
                }
                let n = match crate::conn::timer::timeout_at(deadline, self.read_more()).await {
                    Ok(r) => r.map_err(Error::Read)?,
                    Err(_) => return Err(Error::Timeout(Phase::Waiting)),
                };
                if n == 0 {
                    return Err(Error::Closed);
                }
            };
            let head::PeerHead {
                status,
                version,
                headers,
                raw: fields,
                reason,
                keep_alive,
                framed,
            } = head;
            let (kind, upgrade) = head::decode(status, &method, version, framed)?;
            let mut resp = Response::new(());
            *resp.status_mut() = status;
            *resp.version_mut() = version;
            if let Some(r) = reason {
                resp.extensions_mut().insert(r);
            }
            *resp.headers_mut() = headers;
            let keep = keep && keep_alive && !upgrade && kind != vigil_http1::Framing::Close;
            Ok(Received {
                response: resp.map(|()| {
                    RespBody::new(self, vigil_http1::Decoder::new(kind), keep, upgrade, rest)
                }),
                raw: fields,
            })
        }
    }

    /// Write the request body after the head: each write (and each wait
    /// for the client's next piece) within `proxy_send_timeout`. hyper's
    /// rules: Content-Length bytes and no more; chunked ends with `0`.
    /// While it waits (for the socket, or for the client), a response
    /// head that comes whole ends the sending: what is left of the body
    /// is returned, the head left in the buffer for `send` to read.
    async fn send_body(
        &mut self,
        body: &mut UpBody,
        framing: BodyFraming,
        written: &mut bool,
        send: Duration,
    ) -> Result<Option<Box<Rest>>, Error> {
        let mut left = match framing {
            BodyFraming::Length(n) => Some(n),
            _ => None,
        };
        let mut ended = false;
        let mut last = Instant::now();
        // The first piece goes out with the head when it is there at once.
        let mut first = futures_util::FutureExt::now_or_never(body.frame());
        loop {
            let frame = match first.take() {
                Some(f) => f,
                None => {
                    if !self.out.is_empty() {
                        match self.write_or_answer(written, last + send).await {
                            Wrote::All => {}
                            Wrote::Answered => {
                                return Ok(Some(Rest::of(body, framing, left, ended)));
                            }
                            Wrote::Broken => return Ok(Some(Rest::failed())),
                            Wrote::Failed(e) => return Err(e),
                        }
                        last = Instant::now();
                    }
                    if ended || left == Some(0) {
                        return Ok(None);
                    }
                    // The client's next piece, unless the answer comes first.
                    let next = std::future::poll_fn(|cx| {
                        if let Poll::Ready(answered) = self.poll_answered(cx) {
                            return Poll::Ready(Err(answered));
                        }
                        Pin::new(&mut *body).poll_frame(cx).map(Ok)
                    });
                    match crate::conn::timer::timeout_at(last + send, next).await {
                        Ok(Ok(f)) => f,
                        Ok(Err(answered)) => {
                            answered?;
                            return Ok(Some(Rest::of(body, framing, left, ended)));
                        }
                        Err(_) => return Err(Error::Timeout(Phase::Sending)),
                    }
                }
            };
            match frame {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        put_piece(&mut self.out, framing, &mut left, data);
                    }
                }
                Some(Err(e)) => return Err(Error::Body(e)),
                None => {
                    put_end(&mut self.out, framing, left)?;
                    ended = true;
                }
            }
        }
    }

    /// [`H1::write_out`] within `deadline`, watching for the answer while
    /// the socket is full ([`Wrote::Answered`]: what was not written stays
    /// in `out`). A write that fails after the peer answered gives that
    /// answer ([`Wrote::Broken`]), as hyper's client does.
    async fn write_or_answer(&mut self, written: &mut bool, deadline: Instant) -> Wrote {
        let mut at = 0;
        let mut failed = None;
        match self.io.try_write(&self.out) {
            Ok(n) => at = n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(source) => failed = Some(source),
        }
        if at > 0 {
            *written = true;
        }
        if failed.is_none() && (at < self.out.len() || self.io.unflushed()) {
            let writing = std::future::poll_fn(|cx| loop {
                let step = if at == self.out.len() {
                    // TLS: the records rustls holds go before the answer
                    // is waited for.
                    match Pin::new(&mut self.io).poll_flush(cx) {
                        Poll::Ready(Ok(())) => return Poll::Ready(Ok(Wrote::All)),
                        Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
                        Poll::Pending => Poll::Pending,
                    }
                } else {
                    Pin::new(&mut self.io)
                        .poll_write(cx, &self.out[at..])
                        .map_ok(Some)
                };
                match step {
                    Poll::Ready(Ok(Some(0))) => {
                        return Poll::Ready(Err(io::ErrorKind::WriteZero.into()))
                    }
                    Poll::Ready(Ok(Some(n))) => {
                        at += n;
                        *written = true;
                    }
                    Poll::Ready(Ok(None)) => {}
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => {
                        return self.poll_answered(cx).map(|answered| {
                            Ok(match answered {
                                Ok(()) => Wrote::Answered,
                                Err(e) => Wrote::Failed(e),
                            })
                        });
                    }
                }
            });
            match crate::conn::timer::timeout_at(deadline, writing).await {
                Ok(Ok(Wrote::All)) => {}
                Ok(Ok(Wrote::Answered)) => {
                    self.out.drain(..at);
                    return Wrote::Answered;
                }
                Ok(Ok(other)) => return other,
                Ok(Err(source)) => failed = Some(source),
                Err(_) => return Wrote::Failed(Error::Timeout(Phase::Sending)),
            }
        }
        if let Some(source) = failed {
            // The peer may have answered and closed before the rest went.
            let answered = std::future::poll_fn(|cx| Poll::Ready(self.poll_answered(cx)));
            if let Poll::Ready(Ok(())) = answered.await {
                return Wrote::Broken;
            }
            return Wrote::Failed(Error::Write {
                source,
                written: *written,
            });
        }
        self.out.clear();
        Wrote::All
    }

    /// Write all of `out`: at once when the socket takes it (the common
    /// case: no timer), else waiting within the send timer.
    async fn write_out(
        &mut self,
        written: &mut bool,
        deadline: Option<Instant>,
        send: Duration,
    ) -> Result<(), Error> {
        let mut at = 0;
        match self.io.try_write(&self.out) {
            Ok(n) => at = n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(source) => {
                return Err(Error::Write {
                    source,
                    written: *written,
                })
            }
        }
        if at > 0 {
            *written = true;
        }
        if at < self.out.len() || self.io.unflushed() {
            let deadline = deadline.unwrap_or_else(|| Instant::now() + send);
            let rest = &self.out[at..];
            // TLS: what rustls took waits in its buffer until flushed.
            let io = &mut self.io;
            let all = async move {
                io.write_all(rest).await?;
                io.flush().await
            };
            match crate::conn::timer::timeout_at(deadline, all).await {
                Ok(Ok(())) => *written = true,
                Ok(Err(source)) => {
                    return Err(Error::Write {
                        source,
                        written: *written,
                    })
                }
                Err(_) => return Err(Error::Timeout(Phase::Sending)),
            }
        }
        self.out.clear();
        Ok(())
    }

    /// Read what is there (waiting for some), growing the buffer.
    async fn read_more(&mut self) -> io::Result<usize> {
        std::future::poll_fn(|cx| self.poll_read_more(cx)).await
    }

    /// Whether a response head came whole (Ready(Ok)), reading more while
    /// it has not: the answer watched for while the body goes. Interim
    /// (1xx but 101) heads are taken out; the final one is left for
    /// `send` to parse, and so is anything `httparse` refuses (it says
    /// why). The peer closing first is [`Error::Closed`].
    fn poll_answered(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        loop {
            if !self.buf.is_empty() {
                let mut fields = [httparse::EMPTY_HEADER; head::MAX_HEADERS];
                let mut res = httparse::Response::new(&mut fields);
                match res.parse(&self.buf) {
                    Ok(httparse::Status::Complete(len)) => {
                        let code = res.code.unwrap_or(0);
                        if (100..200).contains(&code) && code != 101 {
                            self.buf.advance(len);
                            continue;
                        }
                        return Poll::Ready(Ok(()));
                    }
                    Ok(httparse::Status::Partial) if self.buf.len() < MAX_HEAD => {}
                    _ => return Poll::Ready(Ok(())),
                }
            }
            match std::task::ready!(self.poll_read_more(cx)) {
                Ok(0) => return Poll::Ready(Err(Error::Closed)),
                Ok(_) => {}
                Err(e) => return Poll::Ready(Err(Error::Read(e))),
            }
        }
    }

    fn poll_read_more(&mut self, cx: &mut Context<'_>) -> std::task::Poll<io::Result<usize>> {
        let want = self.read_size as usize;
        if self.buf.capacity() - self.buf.len() < want / 2 {
            self.buf.reserve(want);
        }
        let room = self.buf.capacity() - self.buf.len();
        let n = std::task::ready!(tokio_util::io::poll_read_buf(
            Pin::new(&mut self.io),
            cx,
            &mut self.buf
        ))?;
        if n >= room && self.read_size < READ_MAX {
            self.read_size *= 2;
        } else if n < room / 4 && self.read_size > READ_MIN {
            self.read_size /= 2;
        }
        std::task::Poll::Ready(Ok(n))
    }
}

/// How [`H1::write_or_answer`] ended.
enum Wrote {
    /// All of `out` went.
    All,
    /// The peer answered while the rest waited.
    Answered,
    /// A write failed, but the peer had answered (nothing more of the
    /// body can go).
    Broken,
    /// The write (or the answer) failed.
    Failed(Error),
}

// === impl Rest ===

impl Rest {
    /// What is left of `body` (taken, an empty body left in its place)
    /// unless it `ended` or its length went.
    fn of(body: &mut UpBody, framing: BodyFraming, left: Option<u64>, ended: bool) -> Box<Self> {
        let more = !ended && left != Some(0);
        Box::new(Self {
            body: more.then(|| std::mem::replace(body, crate::wire::payload::empty())),
            framing,
            left,
            failed: false,
        })
    }

    /// Nothing more can go: a write failed after the peer answered.
    fn failed() -> Box<Self> {
        Box::new(Self {
            body: None,
            framing: BodyFraming::None,
            left: None,
            failed: true,
        })
    }
}

/// Frame a piece of the body into `out` (at most the `left` of a
/// Content-Length body).
fn put_piece(
    out: &mut Vec<u8>,
    framing: BodyFraming,
    left: &mut Option<u64>,
    mut data: bytes::Bytes,
) {
    if let Some(l) = left.as_mut() {
        let take = usize::try_from(*l).unwrap_or(usize::MAX).min(data.len());
        data.truncate(take);
        *l -= take as u64;
    }
    if data.is_empty() {
        return;
    }
    if framing == BodyFraming::Chunked {
        let _ = std::io::Write::write_fmt(out, format_args!("{:X}\r\n", data.len()));
        out.put_slice(&data);
        out.put_slice(b"\r\n");
    } else {
        out.put_slice(&data);
    }
}

/// The body ended: a chunked one's last chunk into `out`; a
/// Content-Length one short of its length is an error.
fn put_end(out: &mut Vec<u8>, framing: BodyFraming, left: Option<u64>) -> Result<(), Error> {
    match (framing, left) {
        (BodyFraming::Chunked, _) => out.put_slice(b"0\r\n\r\n"),
        (_, Some(l)) if l > 0 => {
            return Err(Error::Body(
                "request body ended before its Content-Length".into(),
            ))
        }
        _ => {}
    }
    Ok(())
}

/// hyper's `Client::set_length`: how the body goes, and the fields that
/// say so (a body of unknown length is chunked except for GET, HEAD and
/// CONNECT, which then send none). `te`: `fields` has a
/// `Transfer-Encoding`.
fn set_length(
    fields: &mut impl RequestFields,
    method: &Method,
    body: &UpBody,
    te: bool,
) -> BodyFraming {
    use head::put::{CONTENT_LENGTH, TRANSFER_ENCODING};
    if body.is_end_stream() {
        if te {
            fields.remove(&TRANSFER_ENCODING);
        }
        return BodyFraming::None;
    }
    let existing = head::content_length_parse_all(fields);
    if te {
        let mut values: smallvec::SmallVec<[http::HeaderValue; 2]> =
            fields.values(&TRANSFER_ENCODING).cloned().collect();
        let last_chunked = values
            .last()
            .is_some_and(|v| vigil_http1::last_token_is_chunked(v.as_bytes()));
        if !last_chunked {
            // hyper adds chunked to a Transfer-Encoding that lacks it.
            if let Some(last) = values.pop() {
                let mut v = last.as_bytes().to_vec();
                v.extend_from_slice(b", chunked");
                values.push(http::HeaderValue::from_bytes(&v).unwrap_or(last));
            }
            fields.remove(&TRANSFER_ENCODING);
            for v in values {
                fields.append(&TRANSFER_ENCODING, v);
            }
        }
        fields.remove(&CONTENT_LENGTH);
        return BodyFraming::Chunked;
    }
    if let Some(n) = existing {
        return BodyFraming::Length(n);
    }
    match body.size_hint().exact() {
        Some(n) => {
            fields.insert(&CONTENT_LENGTH, http::HeaderValue::from(n));
            BodyFraming::Length(n)
        }
        None => match *method {
            Method::GET | Method::HEAD | Method::CONNECT => BodyFraming::Length(0),
            _ => {
                fields.insert(
                    &TRANSFER_ENCODING,
                    http::HeaderValue::from_static("chunked"),
                );
                fields.remove(&CONTENT_LENGTH);
                BodyFraming::Chunked
            }
        },
    }
}

/// The stream of an upgraded connection (used by [`Upgraded`]).
pub(crate) fn into_parts(h1: H1) -> (Stream, BytesMut) {
    (h1.io, h1.buf)
}

#[cfg(test)]
mod tests;
