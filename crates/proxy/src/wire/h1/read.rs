//! The client's side of an HTTP/1.x connection as read: the connection's
//! read state ([`Wire`]), a judged head parsed once with `httparse` into
//! what hyper made of it, and the request body ([`H1Body`]): a
//! `Content-Length` body byte for byte, or a chunked one decoded (with its
//! trailers).

use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, StatusCode, Uri, Version};
use hyper::body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use vigil_http1::{Decoded, Decoder};

use super::write::has_token;
use crate::conn::client_io::Io;
use crate::wire::payload::BoxError;
use crate::wire::request_check::{ClientFraming, HeadLimits, HeadScan};

/// The bytes a read into an empty connection buffer takes at most.
const CHUNK_SIZE: usize = 8192;

thread_local! {
    /// A worker's chunk the reads of idle connections go into before their
    /// bytes are copied to a buffer: zeroed once, so a read into it is
    /// safe code all the way to the kernel (`crate::conn::sock`).
    static CHUNK: std::cell::RefCell<[u8; CHUNK_SIZE]> =
        const { std::cell::RefCell::new([0; CHUNK_SIZE]) };
}

/// The connection's stream, boxed once per connection.
pub(crate) type BoxIo = Box<dyn Io>;

/// hyper's limit on the request target (`MAX_URI_LEN`).
const MAX_URI_LEN: usize = (u16::MAX - 1) as usize;

/// hyper's default limit on the number of request headers (431 above).
const MAX_HEADERS: usize = 100;

/// Headers parsed from a stack array first.
pub(crate) const STACK_HEADERS: usize = 32;

/// The connection as the request loop and the request body share it.
pub(crate) struct Wire {
    /// The stream; None once handed to a tunnel or to hyper.
    pub(crate) io: Option<BoxIo>,
    /// Read and not consumed yet.
    pub(crate) buf: BytesMut,
    /// The current request's body.
    pub(crate) body: Reading,
    /// The current request's number: a body of an earlier one reads nothing.
    pub(crate) seq: u64,
    /// `HTTP/1.1 100 Continue` to send before the body is read: how much
    /// of it is written.
    pub(crate) continue_at: Option<usize>,
    /// The client closed its side.
    pub(crate) eof: bool,
}

/// Where the current request's body is.
#[derive(Debug)]
pub(crate) enum Reading {
    /// Being decoded (to its end: done, or none).
    Body(Decoder),
    /// The body broke (a client error): the connection closes.
    Failed,
}

impl Reading {
    /// No body (left to read).
    pub(crate) fn done() -> Self {
        Reading::Body(Decoder::new(BodyKind::Empty))
    }

    /// Whether nothing of the body is left to read.
    pub(crate) fn is_done(&self) -> bool {
        matches!(self, Reading::Body(d) if d.is_done())
    }
}

/// A request body on an HTTP/1.x connection, read from the connection's
/// [`Wire`] on demand.
pub(crate) struct H1Body {
    /// None when there is no body (most requests): nothing to share, and
    /// `ended` is set.
    wire: Option<Arc<Mutex<Wire>>>,
    seq: u64,
    /// `Content-Length`, for the size hint.
    length: Option<u64>,
    ended: bool,
}

/// Why a request body could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BodyError {
    /// The client closed before the body's end.
    #[error("client closed the connection before the request body ended")]
    Eof,
    /// The chunked encoding is malformed.
    #[error("invalid chunked request body: {0}")]
    Chunked(&'static str),
    /// The connection failed.
    #[error("reading the request body failed: {0}")]
    Io(#[source] io::Error),
    /// The connection moved on (the body outlived its request).
    #[error("request body read after its response")]
    Stale,
}

/// A head, as hyper parsed it.
#[derive(Debug)]
pub(crate) struct Parsed {
    pub(crate) method: Method,
    pub(crate) uri: Uri,
    pub(crate) version: Version,
    pub(crate) headers: HeaderMap,
    /// The request leaves the connection open (version, `Connection`).
    pub(crate) keep_alive: bool,
    /// `Expect: 100-continue` on HTTP/1.1.
    pub(crate) expect_continue: bool,
    /// `Upgrade` on HTTP/1.1 (or CONNECT).
    pub(crate) wants_upgrade: bool,
    /// How its body is framed.
    pub(crate) body: BodyKind,
    /// The head its fields' values are pieces of: where the upstream
    /// request finds the client's spelling of each name.
    pub(crate) head: Bytes,
}

/// How a request body is framed: `Empty`, `Length` or `Chunked` (a
/// request is never framed by the close).
pub(crate) use vigil_http1::Framing as BodyKind;

// === impl Wire ===

/// An empty wire: no stream, nothing read (what the loop keeps while it
/// lends its wire to a request body).
impl Default for Wire {
    fn default() -> Self {
        Self {
            io: None,
            buf: BytesMut::new(),
            body: Reading::done(),
            seq: 0,
            continue_at: None,
            eof: false,
        }
    }
}

impl Wire {
    pub(crate) fn new(io: BoxIo, buf: BytesMut) -> Self {
        Self {
            io: Some(io),
            buf,
            body: Reading::done(),
            seq: 0,
            continue_at: None,
            eof: false,
        }
    }

    /// Read more into `buf`: through the worker's chunk when `buf` is
    /// empty (an idle connection waits holding no buffer; a head is copied
    /// into a worker's spare, `spare::read_room`), else into its room.
    /// Ready(0) at EOF.
    pub(crate) fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        let Some(io) = self.io.as_mut() else {
            return Poll::Ready(Ok(0));
        };
        if self.buf.is_empty() {
            let (buf, eof, seq) = (&mut self.buf, &mut self.eof, self.seq);
            let mut fill = |rb: &mut ReadBuf<'_>| {
                std::task::ready!(Pin::new(&mut *io).poll_read(cx, rb))?;
                let n = rb.filled().len();
                if n == 0 {
                    *eof = true;
                } else if buf.capacity() == 0 && seq == 0 {
                    // Between requests the connection holds no buffer: the
                    // head goes into the room of a done request's.
                    *buf = crate::wire::spare::read_room();
                }
                buf.extend_from_slice(rb.filled());
                Poll::Ready(Ok(n))
            };
            // The worker's chunk, initialized: the read is a system call of
            // its own (crate::conn::sock). A stack chunk where the thread's is
            // gone (its exit) or in use (never, on one thread).
            let chunked = CHUNK.try_with(|c| {
                let mut c = c.try_borrow_mut().ok()?;
                Some(fill(&mut ReadBuf::new(&mut c[..])))
            });
            return match chunked {
                Ok(Some(r)) => r,
                _ => {
                    let mut chunk = [MaybeUninit::<u8>::uninit(); CHUNK_SIZE];
                    fill(&mut ReadBuf::uninit(&mut chunk))
                }
            };
        }
        if self.buf.capacity() - self.buf.len() < 1024 {
            self.buf.reserve(8192);
        }
        let r = tokio_util::io::poll_read_buf(Pin::new(io), cx, &mut self.buf);
        if matches!(r, Poll::Ready(Ok(0))) {
            self.eof = true;
        }
        r
    }

    /// Write what is left of `HTTP/1.1 100 Continue`.
    fn poll_continue(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";
        while let Some(at) = self.continue_at {
            if at >= CONTINUE.len() {
                let Some(io) = self.io.as_mut() else {
                    self.continue_at = None;
                    break;
                };
                std::task::ready!(Pin::new(io).poll_flush(cx))?;
                self.continue_at = None;
                break;
            }
            let Some(io) = self.io.as_mut() else {
                self.continue_at = None;
                break;
            };
            let n = std::task::ready!(Pin::new(io).poll_write(cx, &CONTINUE[at..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.continue_at = Some(at + n);
        }
        Poll::Ready(Ok(()))
    }

    /// The next frame of the current body. Ready(None) at its end.
    pub(crate) fn poll_body(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        if self.continue_at.is_some() {
            if let Err(e) = std::task::ready!(self.poll_continue(cx)) {
                self.body = Reading::Failed;
                return Poll::Ready(Some(Err(BodyError::Io(e))));
            }
        }
        loop {
            let Reading::Body(decoder) = &mut self.body else {
                return Poll::Ready(Some(Err(BodyError::Eof)));
            };
            match decoder.decode(&mut self.buf) {
                Ok(Some(Decoded::Data(d))) => return Poll::Ready(Some(Ok(Frame::data(d)))),
                Ok(Some(Decoded::Trailers(t))) => return Poll::Ready(Some(Ok(Frame::trailers(t)))),
                Ok(Some(Decoded::End)) => return Poll::Ready(None),
                Ok(None) => {}
                Err(e) => {
                    self.body = Reading::Failed;
                    return Poll::Ready(Some(Err(BodyError::Chunked(e))));
                }
            }
            if self.eof {
                self.body = Reading::Failed;
                return Poll::Ready(Some(Err(BodyError::Eof)));
            }
            match std::task::ready!(self.poll_fill(cx)) {
                Ok(0) => {
                    self.body = Reading::Failed;
                    return Poll::Ready(Some(Err(BodyError::Eof)));
                }
                Ok(_) => {}
                Err(e) => {
                    self.body = Reading::Failed;
                    return Poll::Ready(Some(Err(BodyError::Io(e))));
                }
            }
        }
    }
}

// === impl H1Body ===

impl H1Body {
    /// The body of request `seq`, framed as `kind`; `share` lends it the
    /// connection's wire, if it has any bytes to read.
    pub(crate) fn new(share: impl FnOnce() -> Arc<Mutex<Wire>>, seq: u64, kind: BodyKind) -> Self {
        let ended = kind == BodyKind::Empty || kind == BodyKind::Length(0);
        Self {
            wire: (!ended).then(share),
            seq,
            length: match kind {
                BodyKind::Empty => Some(0),
                BodyKind::Length(n) => Some(n),
                BodyKind::Chunked | BodyKind::Close => None,
            },
            ended,
        }
    }
}

impl Body for H1Body {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let (false, Some(wire)) = (self.ended, self.wire.as_ref()) else {
            return Poll::Ready(None);
        };
        let polled = {
            let Ok(mut wire) = wire.lock() else {
                return Poll::Ready(Some(Err(Box::new(BodyError::Stale))));
            };
            if wire.seq != self.seq {
                Poll::Ready(Some(Err(BodyError::Stale)))
            } else {
                wire.poll_body(cx)
            }
        };
        match polled {
            Poll::Pending => Poll::Pending,
            Poll::Ready(None) => {
                self.ended = true;
                Poll::Ready(None)
            }
            Poll::Ready(Some(Ok(f))) => {
                if let (Some(d), Some(n)) = (f.data_ref(), self.length.as_mut()) {
                    *n = n.saturating_sub(d.len() as u64);
                    if *n == 0 {
                        self.ended = true;
                    }
                }
                if f.is_trailers() {
                    self.ended = true;
                }
                Poll::Ready(Some(Ok(f)))
            }
            Poll::Ready(Some(Err(e))) => {
                self.ended = true;
                Poll::Ready(Some(Err(Box::new(e))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended
    }

    fn size_hint(&self) -> SizeHint {
        match self.length {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}

impl std::fmt::Debug for H1Body {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("H1Body")
            .field("seq", &self.seq)
            .field("length", &self.length)
            .field("ended", &self.ended)
            .finish()
    }
}

// === parsing ===

/// Where a request head's pieces are in it (offsets: a head is far under
/// 4 GiB), as `httparse` found them.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Spans {
    method: (u32, u32),
    path: (u32, u32),
    /// `HTTP/1.x`'s x.
    minor: u8,
    /// How many of the fields' spans are filled.
    count: usize,
}

/// A field's name and value in the head.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Span {
    name: (u32, u32),
    value: (u32, u32),
}

/// The fields' spans of a head parsed from a stack array.
pub(crate) type FieldSpans = [Span; STACK_HEADERS];

/// A request head read straight off the connection's buffer, where the
/// gate's rules can be checked on what `httparse` found
/// ([`HeadScan::accepts_parsed`]): the head's length, its framing, and
/// where its pieces are (its fields' in `fields`). `None` where the gate
/// must read it line by line (an incomplete head, one `httparse` refuses,
/// one the gate might refuse or rewrite, more fields than the stack holds).
pub(crate) fn at_once(
    buf: &[u8],
    limits: HeadLimits,
    fields: &mut FieldSpans,
) -> Option<(usize, ClientFraming, Spans)> {
    let mut stack = [const { MaybeUninit::uninit() }; STACK_HEADERS];
    let mut req = httparse::Request::new(&mut []);
    let Ok(httparse::Status::Complete(len)) = req.parse_with_uninit_headers(buf, &mut stack) else {
        return None;
    };
    let framing = HeadScan::accepts_parsed(limits, buf, len, &req)?;
    Some((len, framing, spans_of(buf, &req, fields)?))
}

/// Where `req`'s pieces are in `buf`.
fn spans_of(buf: &[u8], req: &httparse::Request<'_, '_>, fields: &mut [Span]) -> Option<Spans> {
    let base = buf.as_ptr() as usize;
    // A piece of `buf` (httparse's are): its offsets.
    let at = |s: &[u8]| -> (u32, u32) {
        let from = (s.as_ptr() as usize).wrapping_sub(base);
        let from = u32::try_from(from).unwrap_or(u32::MAX);
        (
            from,
            from.saturating_add(u32::try_from(s.len()).unwrap_or(u32::MAX)),
        )
    };
    let (method, path, minor) = (req.method?, req.path?, req.version?);
    for (span, h) in fields.iter_mut().zip(req.headers.iter()) {
        *span = Span {
            name: at(h.name.as_bytes()),
            value: at(h.value),
        };
    }
    Some(Spans {
        method: at(method.as_bytes()),
        path: at(path.as_bytes()),
        minor,
        count: req.headers.len(),
    })
}

/// Parse a head the gate accepted, as hyper does; `Err` is hyper's
/// automatic answer (400, 414, 431).
pub(crate) fn parse(head: &Bytes) -> Result<Parsed, StatusCode> {
    let mut stack = [httparse::EMPTY_HEADER; STACK_HEADERS];
    let mut req = httparse::Request::new(&mut stack);
    match req.parse(head) {
        Ok(httparse::Status::Complete(_)) => {
            let mut fields = [Span::default(); STACK_HEADERS];
            let spans = spans_of(head, &req, &mut fields).ok_or(StatusCode::BAD_REQUEST)?;
            build(head, spans, &fields)
        }
        Ok(httparse::Status::Partial) => Err(StatusCode::BAD_REQUEST),
        Err(httparse::Error::TooManyHeaders) => {
            let mut heap = vec![httparse::EMPTY_HEADER; MAX_HEADERS];
            let mut req = httparse::Request::new(&mut heap);
            match req.parse(head) {
                Ok(httparse::Status::Complete(_)) => {
                    let mut fields = vec![Span::default(); MAX_HEADERS];
                    let spans = spans_of(head, &req, &mut fields).ok_or(StatusCode::BAD_REQUEST)?;
                    build(head, spans, &fields)
                }
                Err(httparse::Error::TooManyHeaders) => {
                    Err(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE)
                }
                _ => Err(StatusCode::BAD_REQUEST),
            }
        }
        Err(_) => Err(StatusCode::BAD_REQUEST),
    }
}

/// What hyper makes of a head `httparse` parsed: the pieces at `spans`
/// (its fields' in `fields`) of `head`.
pub(crate) fn build(head: &Bytes, spans: Spans, fields: &[Span]) -> Result<Parsed, StatusCode> {
    let piece = |(from, to): (u32, u32)| head.get(from as usize..to as usize).unwrap_or_default();
    let shared = |(from, to): (u32, u32)| {
        if from <= to && to as usize <= head.len() {
            head.slice(from as usize..to as usize)
        } else {
            Bytes::new()
        }
    };
    let fields = fields.get(..spans.count).unwrap_or_default();
    let path = piece(spans.path);
    if path.len() > MAX_URI_LEN {
        return Err(StatusCode::URI_TOO_LONG);
    }
    let method = Method::from_bytes(piece(spans.method)).map_err(|_| StatusCode::BAD_REQUEST)?;
    let uri = Uri::from_maybe_shared(shared(spans.path)).map_err(|_| StatusCode::BAD_REQUEST)?;
    let is_http_11 = spans.minor == 1;
    let version = if is_http_11 {
        Version::HTTP_11
    } else {
        Version::HTTP_10
    };
    let mut keep_alive = is_http_11;
    let mut body = BodyKind::Empty;
    let mut expect_continue = false;
    let mut wants_upgrade = method == Method::CONNECT;
    let mut con_len: Option<u64> = None;
    let (mut is_te, mut is_te_chunked, mut is_cl) = (false, false, false);
    let mut saw_close = false;
    let mut headers = crate::wire::spare::map(fields.len());
    for h in fields {
        let name =
            crate::wire::names::header_name(piece(h.name)).map_err(|_| StatusCode::BAD_REQUEST)?;
        let value =
            HeaderValue::from_maybe_shared(shared(h.value)).map_err(|_| StatusCode::BAD_REQUEST)?;
        match name {
            header::TRANSFER_ENCODING => {
                if !is_http_11 {
                    return Err(StatusCode::BAD_REQUEST);
                }
                is_te = true;
                if is_cl && con_len.take().is_some() {
                    headers.remove(header::CONTENT_LENGTH);
                }
                is_te_chunked = value
                    .as_bytes()
                    .rsplit(|&b| b == b',')
                    .next()
                    .is_some_and(|t| t.trim_ascii().eq_ignore_ascii_case(b"chunked"));
                if is_te_chunked {
                    body = BodyKind::Chunked;
                }
            }
            header::CONTENT_LENGTH => {
                is_cl = true;
                if is_te {
                    continue;
                }
                let len = content_length(value.as_bytes()).ok_or(StatusCode::BAD_REQUEST)?;
                if let Some(prev) = con_len {
                    if prev != len {
                        return Err(StatusCode::BAD_REQUEST);
                    }
                    continue;
                }
                body = if len == 0 {
                    BodyKind::Empty
                } else {
                    BodyKind::Length(len)
                };
                con_len = Some(len);
            }
            header::CONNECTION => {
                if saw_close || has_token(&value, "close") {
                    saw_close = true;
                    keep_alive = false;
                } else if !keep_alive {
                    keep_alive = has_token(&value, "keep-alive");
                }
            }
            header::EXPECT => {
                expect_continue = value.as_bytes().eq_ignore_ascii_case(b"100-continue");
            }
            header::UPGRADE => wants_upgrade = is_http_11,
            _ => {}
        }
        headers.append(name, value);
    }
    if is_te && !is_te_chunked {
        return Err(StatusCode::BAD_REQUEST);
    }
    if is_te && is_cl {
        keep_alive = false;
    }
    Ok(Parsed {
        method,
        uri,
        version,
        headers,
        keep_alive,
        expect_continue: expect_continue && is_http_11 && body != BodyKind::Empty,
        wants_upgrade,
        body,
        head: head.clone(),
    })
}

/// hyper's `content_length_parse_all`: comma-separated equal values of digits.
fn content_length(v: &[u8]) -> Option<u64> {
    let mut out: Option<u64> = None;
    for part in v.split(|&b| b == b',') {
        let part = part.trim_ascii();
        if part.is_empty() || part.len() > 19 || !part.iter().all(u8::is_ascii_digit) {
            return None;
        }
        let n: u64 = std::str::from_utf8(part).ok()?.parse().ok()?;
        match out {
            Some(m) if m != n => return None,
            _ => out = Some(n),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_parse_as_hyper_parses_them() {
        let head = Bytes::from_static(
            b"POST http://a.example/x?y HTTP/1.0\r\nHost: a\r\nConnection: keep-alive\r\nContent-Length: 3\r\n\r\n",
        );
        let p = parse(&head).unwrap();
        assert_eq!(p.method, Method::POST);
        assert_eq!(p.uri, "http://a.example/x?y");
        assert_eq!(p.version, Version::HTTP_10);
        assert!(p.keep_alive);
        assert_eq!(p.body, BodyKind::Length(3));
        let head =
            Bytes::from_static(b"OPTIONS * HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
        let p = parse(&head).unwrap();
        assert_eq!(p.uri, "*");
        assert!(!p.keep_alive);
        let many: String = (0..101).map(|i| format!("h{i}: v\r\n")).collect();
        let head = Bytes::from(format!("GET / HTTP/1.1\r\n{many}\r\n"));
        assert_eq!(
            parse(&head).unwrap_err(),
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
        );
        let some: String = (0..40).map(|i| format!("h{i}: v\r\n")).collect();
        let head = Bytes::from(format!("GET / HTTP/1.1\r\n{some}\r\n"));
        assert_eq!(parse(&head).unwrap().headers.len(), 40);
    }
}
