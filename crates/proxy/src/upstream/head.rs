//! Request heads out and response heads in, as hyper's client writes and
//! reads them (`hyper::proto::h1::role::Client`).

use bytes::BytesMut;
use http::header::{CONNECTION, CONTENT_LENGTH, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Version};

use super::Error;
use crate::wire::hop::{Common, HopFilter, Names};
use crate::wire::raw_head::RawFields;
use vigil_http1::{Framed, Framing};

/// hyper's default limit of response header fields.
pub(super) const MAX_HEADERS: usize = 100;

/// A parsed response head.
pub(super) struct PeerHead {
    pub(super) status: StatusCode,
    pub(super) version: Version,
    pub(super) headers: HeaderMap,
    /// The kept fields as they came, `headers` then empty (see
    /// [`parse_with`]).
    pub(super) raw: Option<Box<RawFields>>,
    /// A reason phrase that is not the status's canonical one.
    pub(super) reason: Option<hyper::ext::ReasonPhrase>,
    /// The response lets the connection be kept (its version and
    /// `Connection` say so).
    pub(super) keep_alive: bool,
    /// The framing fields it has (seen while the map was built).
    pub(super) framed: Framed,
}

/// Whether the connection may be kept: the version's answer, then the
/// `Connection` lines'.
struct KeepAlive {
    keep: bool,
    saw_close: bool,
}

impl KeepAlive {
    fn new(version: Version) -> Self {
        Self {
            keep: version == Version::HTTP_11,
            saw_close: false,
        }
    }

    /// One `Connection` line: once one asks to close, a later keep-alive
    /// does not undo it.
    fn line(&mut self, value: &[u8]) {
        // The values servers send, told without splitting them.
        let (close, kept) = if value.eq_ignore_ascii_case(b"keep-alive") {
            (false, true)
        } else if value.eq_ignore_ascii_case(b"close") {
            (true, false)
        } else {
            (
                has_token_in(value, "close"),
                has_token_in(value, "keep-alive"),
            )
        };
        if self.saw_close || close {
            self.saw_close = true;
            self.keep = false;
        } else if !self.keep {
            self.keep = kept;
        }
    }
}

/// The fields of a request vigil's own client sends, as hyper's client
/// rules read and edit them and in the order they go out: the handler's
/// edit list of the client's fields, written without a header map (and,
/// in the tests, a `HeaderMap`: the rules as they were written for one).
/// The edits are the map's: `remove` moves the last field into the
/// removed one's place, `insert` keeps a name's place, `append` adds to a
/// name's values, a new name goes last.
pub(crate) trait RequestFields {
    /// The values of `name`, in order.
    fn values(&self, name: &HeaderName) -> Values<'_>;
    /// `HeaderMap::remove`.
    fn remove(&mut self, name: &HeaderName);
    /// `HeaderMap::insert`.
    fn insert(&mut self, name: &'static HeaderName, value: HeaderValue);
    /// `HeaderMap::append`.
    fn append(&mut self, name: &'static HeaderName, value: HeaderValue);
    /// Each field in the order it goes out, a name's values one after
    /// another.
    fn each(&self, f: impl FnMut(&HeaderName, &HeaderValue));
    /// [`RequestFields::each`] with each name as it goes on the wire (by
    /// default lower case).
    fn each_spelt(&self, mut f: impl FnMut(&[u8], &HeaderValue)) {
        self.each(|name, value| f(name.as_str().as_bytes(), value));
    }
}

/// The values of one name of a [`RequestFields`].
pub(crate) enum Values<'a> {
    /// None or one.
    One(Option<&'a HeaderValue>),
    /// Values an edit put (a taken one skipped).
    Put(std::slice::Iter<'a, Option<HeaderValue>>),
    /// A map's.
    Map(http::header::ValueIter<'a, HeaderValue>),
}

impl<'a> Iterator for Values<'a> {
    type Item = &'a HeaderValue;

    fn next(&mut self) -> Option<&'a HeaderValue> {
        match self {
            Values::One(v) => v.take(),
            Values::Put(i) => i.find_map(Option::as_ref),
            Values::Map(i) => i.next(),
        }
    }
}

/// A map's fields: the rules as they were written for a map, which the
/// handler's list is held to.
#[cfg(test)]
impl RequestFields for HeaderMap {
    fn values(&self, name: &HeaderName) -> Values<'_> {
        Values::Map(self.get_all(name).iter())
    }

    fn remove(&mut self, name: &HeaderName) {
        HeaderMap::remove(self, name);
    }

    fn insert(&mut self, name: &'static HeaderName, value: HeaderValue) {
        HeaderMap::insert(self, name.clone(), value);
    }

    fn append(&mut self, name: &'static HeaderName, value: HeaderValue) {
        HeaderMap::append(self, name.clone(), value);
    }

    fn each(&self, mut f: impl FnMut(&HeaderName, &HeaderValue)) {
        for (name, value) in self {
            f(name, value);
        }
    }

    fn each_spelt(&self, mut f: impl FnMut(&[u8], &HeaderValue)) {
        for (name, value) in self {
            f(put::spelling(name), value);
        }
    }
}

/// The names put into a [`RequestFields`] list, which borrows its names:
/// by the handler's edits (`Host`, `Content-Length`, `Connection`) and by
/// hyper's framing rules (`Content-Length`, `Transfer-Encoding`).
pub(crate) mod put {
    use http::header::{self, HeaderName};

    pub(crate) static HOST: HeaderName = header::HOST;
    pub(crate) static CONTENT_LENGTH: HeaderName = header::CONTENT_LENGTH;
    pub(crate) static CONNECTION: HeaderName = header::CONNECTION;
    pub(crate) static TRANSFER_ENCODING: HeaderName = header::TRANSFER_ENCODING;

    /// How nginx spells a name it puts in an upstream request (its
    /// `proxy_set_header` defaults `Host` and `Connection`, its
    /// `Content-Length`, `Transfer-Encoding`); others lower case.
    pub(crate) fn spelling(name: &HeaderName) -> &[u8] {
        match *name {
            header::HOST => b"Host",
            header::CONTENT_LENGTH => b"Content-Length",
            header::CONNECTION => b"Connection",
            header::TRANSFER_ENCODING => b"Transfer-Encoding",
            header::UPGRADE => b"Upgrade",
            _ => name.as_str().as_bytes(),
        }
    }
}

/// The request line (HTTP/1.1, which vigil's client always speaks) and
/// `fields`, in the order hyper's `Client::encode` writes them, each name
/// as [`RequestFields::each_spelt`] spells it (the client's spelling, a
/// `proxy_set_header`'s as written, nginx's `Host`).
pub(super) fn encode(
    method: &Method,
    target: &str,
    fields: &impl RequestFields,
    dst: &mut Vec<u8>,
) {
    dst.reserve(256);
    dst.extend_from_slice(method.as_str().as_bytes());
    dst.push(b' ');
    dst.extend_from_slice(target.as_bytes());
    dst.extend_from_slice(b" HTTP/1.1\r\n");
    fields.each_spelt(|name, value| {
        dst.extend_from_slice(name);
        dst.extend_from_slice(b": ");
        dst.extend_from_slice(value.as_bytes());
        dst.extend_from_slice(b"\r\n");
    });
    dst.extend_from_slice(b"\r\n");
}

/// What the client reads of a request's fields before it writes them:
/// whether it has a `Transfer-Encoding`, whether its `Connection` asks to
/// close after the response, whether it asks to `Upgrade`. One pass.
pub(super) fn request_facts(fields: &impl RequestFields) -> (bool, bool, bool) {
    let (mut te, mut close, mut upgrade) = (false, false, false);
    fields.each(|name, value| {
        if *name == TRANSFER_ENCODING {
            te = true;
        } else if *name == CONNECTION {
            close = close || has_token(value, "close");
        } else if *name == http::header::UPGRADE {
            upgrade = true;
        }
    });
    (te, close, upgrade)
}

/// Whether a request's `Connection` asks to close after the response.
#[cfg(test)]
fn asks_close(headers: &HeaderMap) -> bool {
    headers
        .get_all(CONNECTION)
        .iter()
        .any(|v| has_token(v, "close"))
}

/// Whether a comma-separated token of `value` is `needle` (any case).
fn has_token(value: &HeaderValue, needle: &str) -> bool {
    has_token_in(value.as_bytes(), needle)
}

fn has_token_in(value: &[u8], needle: &str) -> bool {
    crate::wire::hop::tokens_in(value)
        .is_some_and(|mut t| t.any(|t| t.eq_ignore_ascii_case(needle.as_bytes())))
}

/// Header fields parsed on the stack; a head with more is parsed again
/// with room for [`MAX_HEADERS`].
const FAST_HEADERS: usize = 24;

/// Parse a response head at the start of `buf`, taking it out of `buf`
/// when it is whole (None: not yet whole). The hop-by-hop fields
/// ([`crate::wire::hop::strip_hop_by_hop`]'s, with `Upgrade` kept on a 101) and
/// those named in `hidden` are read for the framing and the connection's
/// fate as any other, and left out of the head's map: the client is never
/// sent them, and leaving them out keeps the others in the upstream's
/// order, as nginx sends them (removing them later would move the last
/// field into their place).
#[cfg(test)]
pub(super) fn parse(buf: &mut BytesMut, hidden: &Names) -> Result<Option<PeerHead>, Error> {
    parse_with(buf, hidden, false)
}

/// [`parse`], with the kept fields left as they came ([`RawFields`], the
/// head's map empty) where `raw` asks for it and the head allows it (see
/// [`raw_fields`]).
pub(super) fn parse_with(
    buf: &mut BytesMut,
    hidden: &Names,
    raw: bool,
) -> Result<Option<PeerHead>, Error> {
    let mut spans = [Span::default(); FAST_HEADERS];
    let scanned = {
        let mut fields = [httparse::EMPTY_HEADER; FAST_HEADERS];
        scan(buf, &mut fields, &mut spans)
    };
    match scanned {
        Err(Error::TooManyFields) => {
            let mut spans = vec![Span::default(); MAX_HEADERS];
            let scanned = {
                let mut fields = vec![httparse::EMPTY_HEADER; MAX_HEADERS];
                scan(buf, &mut fields, &mut spans)
            };
            match scanned? {
                Some(line) => build(buf, line, &spans, hidden, false).map(Some),
                None => Ok(None),
            }
        }
        Ok(Some(line)) => build(buf, line, &spans, hidden, raw).map(Some),
        Ok(None) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Where a field's name and value are in the head.
#[derive(Clone, Copy, Default)]
struct Span {
    name: (u32, u32),
    value: (u32, u32),
}

/// A whole head's status line, length and number of fields.
struct Line {
    len: usize,
    code: u16,
    reason: Option<bytes::Bytes>,
    version: Version,
    count: usize,
}

fn scan<'b>(
    buf: &'b [u8],
    fields: &mut [httparse::Header<'b>],
    spans: &mut [Span],
) -> Result<Option<Line>, Error> {
    let mut res = httparse::Response::new(fields);
    let base = buf.as_ptr() as usize;
    match res.parse(buf) {
        Ok(httparse::Status::Complete(len)) => {
            if len > super::MAX_HEAD {
                return Err(Error::Parse("response header too large".to_owned()));
            }
            // The head is at most MAX_HEAD bytes: offsets fit in u32.
            let offset = |s: &[u8]| u32::try_from(s.as_ptr() as usize - base).unwrap_or(0);
            for (span, h) in spans.iter_mut().zip(res.headers.iter()) {
                let n = offset(h.name.as_bytes());
                let v = offset(h.value);
                *span = Span {
                    name: (n, n + h.name.len() as u32),
                    value: (v, v + h.value.len() as u32),
                };
            }
            let code = res.code.unwrap_or(0);
            let reason = res.reason.unwrap_or("");
            let canonical = StatusCode::from_u16(code)
                .ok()
                .and_then(|s| s.canonical_reason());
            Ok(Some(Line {
                len,
                code,
                reason: (Some(reason) != canonical)
                    .then(|| bytes::Bytes::copy_from_slice(reason.as_bytes())),
                version: if res.version == Some(1) {
                    Version::HTTP_11
                } else {
                    Version::HTTP_10
                },
                count: res.headers.len(),
            }))
        }
        Ok(httparse::Status::Partial) => Ok(None),
        Err(httparse::Error::TooManyHeaders) => Err(Error::TooManyFields),
        Err(e) => Err(Error::Parse(e.to_string())),
    }
}

fn build(
    buf: &mut BytesMut,
    line: Line,
    spans: &[Span],
    hidden: &Names,
    raw: bool,
) -> Result<PeerHead, Error> {
    let Line {
        len,
        code,
        reason,
        version,
        count,
    } = line;
    let status =
        StatusCode::from_u16(code).map_err(|_| Error::Parse(format!("invalid status {code}")))?;
    let head = buf.split_to(len).freeze();
    let reason = match reason {
        Some(r) => Some(
            hyper::ext::ReasonPhrase::try_from(r)
                .map_err(|_| Error::Parse("invalid reason phrase".to_owned()))?,
        ),
        None => None,
    };
    if raw && status != StatusCode::SWITCHING_PROTOCOLS {
        if let Some((fields, keep_alive, framed)) =
            raw_fields(&head, &spans[..count], version, hidden)?
        {
            return Ok(PeerHead {
                status,
                version,
                headers: HeaderMap::new(),
                raw: Some(fields),
                reason,
                keep_alive,
                framed,
            });
        }
    }
    let mut headers = crate::wire::spare::map(count);
    let mut keep_alive = KeepAlive::new(version);
    let mut framed = Framed::default();
    // A 101's Upgrade goes on to the client (the handler lets a 101 through
    // only to a request that asked for it).
    let mut hop = HopFilter::new(status == StatusCode::SWITCHING_PROTOCOLS);
    for s in &spans[..count] {
        let (n0, n1) = (s.name.0 as usize, s.name.1 as usize);
        let (v0, v1) = (s.value.0 as usize, s.value.1 as usize);
        let (name, common) =
            name_of(&head[n0..n1]).map_err(|e| Error::Parse(format!("header name: {e}")))?;
        let read = match common {
            Some(Common::Connection | Common::TransferEncoding | Common::ContentLength) => true,
            // No other common name is hop-by-hop.
            Some(c) if hidden.has(c) => continue,
            Some(_) => false,
            // Spelt otherwise (`content-length`) or not common.
            None => {
                let read =
                    name == CONNECTION || name == TRANSFER_ENCODING || name == CONTENT_LENGTH;
                if !read && (hop.skips_name(&name) || hidden.contains(&name)) {
                    // Left out and read for nothing: no value is made
                    // (httparse allowed exactly the bytes a HeaderValue allows).
                    continue;
                }
                read
            }
        };
        let value = HeaderValue::from_maybe_shared(head.slice(v0..v1))
            .map_err(|e| Error::Parse(format!("header value: {e}")))?;
        if read {
            if name == CONNECTION {
                keep_alive.line(value.as_bytes());
            }
            if name == TRANSFER_ENCODING {
                framed.transfer_encoding(value.as_bytes());
            } else if name == CONTENT_LENGTH {
                framed.content_length(value.as_bytes());
            }
            if hop.skips(&name, &value) || hidden.contains(&name) {
                continue;
            }
        }
        headers.append(name, value);
    }
    hop.finish(&mut headers);
    if framed.has_transfer_encoding() && framed.has_content_length() {
        // RFC 9112 §6.3: Transfer-Encoding overrides Content-Length (nginx
        // clears the length of a chunked response).
        headers.remove(CONTENT_LENGTH);
    }
    Ok(PeerHead {
        status,
        version,
        headers,
        raw: None,
        reason,
        keep_alive: keep_alive.keep,
        framed,
    })
}

/// The kept fields of a head as they came, with whether the connection
/// may be kept and the framing fields, read as [`build`] reads them; None
/// where a map is the simpler way to the same fields: a kept `Location`
/// or `Refresh` (`proxy_redirect` reads them), a `Connection` naming a
/// kept field, `Transfer-Encoding` beside `Content-Length`, a framing
/// name spelt otherwise than servers spell it, a name past 1 KiB.
fn raw_fields(
    head: &bytes::Bytes,
    spans: &[Span],
    version: Version,
    hidden: &Names,
) -> Result<Option<(Box<RawFields>, bool, Framed)>, Error> {
    // Boxed: the fields go on beside the response, a pointer at each step
    // (unboxed, some 200 bytes were copied at each).
    let mut fields = crate::wire::spare::raw_fields(head.clone());
    match fill_raw(&mut fields, head, spans, version, hidden) {
        Ok(Some((keep_alive, framed))) => Ok(Some((fields, keep_alive, framed))),
        other => {
            crate::wire::spare::keep_raw_fields(fields);
            other.map(|_| None)
        }
    }
}

/// [`raw_fields`] into `fields`.
fn fill_raw(
    fields: &mut RawFields,
    head: &bytes::Bytes,
    spans: &[Span],
    version: Version,
    hidden: &Names,
) -> Result<Option<(bool, Framed)>, Error> {
    use crate::wire::raw_head::Kind;
    let mut keep_alive = KeepAlive::new(version);
    let mut framed = Framed::default();
    let mut connection: smallvec::SmallVec<[&[u8]; 2]> = smallvec::SmallVec::new();
    let mut again = false;
    for s in spans {
        let name = head
            .get(s.name.0 as usize..s.name.1 as usize)
            .unwrap_or_default();
        let kind = match common_of(name) {
            Some(Common::Connection) => {
                let value = value_bytes(head, s);
                keep_alive.line(value);
                connection.push(value);
                continue;
            }
            Some(Common::TransferEncoding) => {
                framed.transfer_encoding(value_bytes(head, s));
                continue;
            }
            Some(Common::ContentLength) => {
                framed.content_length(value_bytes(head, s));
                if hidden.has(Common::ContentLength) {
                    continue;
                }
                Kind::ContentLength
            }
            Some(c) if hidden.has(c) => continue,
            Some(Common::Location) => return Ok(None),
            Some(Common::Date) => Kind::Date,
            Some(c) => Kind::Named(c),
            None => {
                if name.len() > 1024
                    || name.eq_ignore_ascii_case(b"connection")
                    || name.eq_ignore_ascii_case(b"transfer-encoding")
                    || name.eq_ignore_ascii_case(b"content-length")
                {
                    return Ok(None);
                }
                if crate::wire::hop::is_hop_by_hop_spelt(name, false) || hidden.contains_spelt(name)
                {
                    continue;
                }
                if name.eq_ignore_ascii_case(b"refresh") || name.eq_ignore_ascii_case(b"location") {
                    return Ok(None);
                }
                if name.eq_ignore_ascii_case(b"date") {
                    Kind::Date
                } else {
                    Kind::Other
                }
            }
        };
        again |= fields.push(s.name, s.value, kind);
    }
    if framed.has_transfer_encoding() && framed.has_content_length()
        || crate::wire::hop::connection_names_any(&connection, fields.iter().map(|f| f.name))
    {
        return Ok(None);
    }
    if again {
        fields.group();
    }
    Ok(Some((keep_alive.keep, framed)))
}

fn value_bytes<'h>(head: &'h bytes::Bytes, s: &Span) -> &'h [u8] {
    head.get(s.value.0 as usize..s.value.1 as usize)
        .unwrap_or_default()
}

/// `HeaderName::from_bytes`, with the names servers send most, spelt as
/// they send them, picked without lower-casing and matching the name (and
/// told as such), and the others from the worker's table (`crate::wire::names`).
fn name_of(b: &[u8]) -> Result<(HeaderName, Option<Common>), http::header::InvalidHeaderName> {
    match common_of(b) {
        Some(c) => Ok((c.name(), Some(c))),
        None => crate::wire::names::header_name(b).map(|n| (n, None)),
    }
}

/// The common name spelt `b` as servers spell it.
fn common_of(b: &[u8]) -> Option<Common> {
    Some(match b {
        b"Server" => Common::Server,
        b"Date" => Common::Date,
        b"Content-Type" => Common::ContentType,
        b"Content-Length" => Common::ContentLength,
        b"Connection" => Common::Connection,
        b"Last-Modified" => Common::LastModified,
        b"ETag" => Common::ETag,
        b"Accept-Ranges" => Common::AcceptRanges,
        b"Transfer-Encoding" => Common::TransferEncoding,
        b"Location" => Common::Location,
        b"Cache-Control" => Common::CacheControl,
        b"Expires" => Common::Expires,
        b"Vary" => Common::Vary,
        b"Content-Encoding" => Common::ContentEncoding,
        b"Set-Cookie" => Common::SetCookie,
        _ => return None,
    })
}

/// How the response is framed, and whether its connection is being
/// upgraded: vigil's one codec's answer ([`Framed::response`]) to the
/// request's method and the response's version.
pub(super) fn decode(
    status: StatusCode,
    method: &Method,
    version: Version,
    framed: Framed,
) -> Result<(Framing, bool), Error> {
    framed
        .response(
            status.as_u16(),
            *method == Method::HEAD,
            *method == Method::CONNECT,
            version == Version::HTTP_10,
        )
        .map_err(|e| Error::Parse(e.to_string()))
}

/// hyper's `content_length_parse_all`: every Content-Length value (also
/// comma-separated ones) is digits and they all agree.
pub(super) fn content_length_parse_all(fields: &impl RequestFields) -> Option<u64> {
    let mut framed = Framed::default();
    for v in fields.values(&CONTENT_LENGTH) {
        framed.content_length(v.as_bytes());
    }
    framed.length()
}

#[cfg(test)]
mod tests {
    /// The framing fields of a map, as a reader tells them line by line.
    fn framed_of(headers: &HeaderMap) -> Framed {
        let mut f = Framed::default();
        for (name, value) in headers {
            if name == TRANSFER_ENCODING {
                f.transfer_encoding(value.as_bytes());
            } else if name == CONTENT_LENGTH {
                f.content_length(value.as_bytes());
            }
        }
        f
    }

    use super::*;

    fn head_with(fields: usize) -> BytesMut {
        let mut b = BytesMut::from(&b"HTTP/1.1 200 Fine\r\n"[..]);
        for i in 0..fields {
            b.extend_from_slice(format!("X-F{i}: v{i}\r\n").as_bytes());
        }
        b.extend_from_slice(b"\r\nrest");
        b
    }

    #[test]
    fn a_head_is_taken_off_the_buffer_with_its_fields_in_order() {
        let mut b = head_with(3);
        let h = parse(&mut b, &Names::default()).unwrap().unwrap();
        assert_eq!(&b[..], b"rest");
        assert_eq!(h.status, 200);
        assert!(h.keep_alive);
        assert!(h.reason.is_some(), "Fine is not OK");
        let names: Vec<_> = h.headers.keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["x-f0", "x-f1", "x-f2"]);
        assert_eq!(h.headers["x-f2"], "v2");
    }

    #[test]
    fn hidden_fields_are_read_for_the_framing_and_left_out_of_the_map_in_order() {
        let mut b = BytesMut::from(
            &b"HTTP/1.1 200 OK\r\nServer: up\r\nDate: d\r\nContent-Type: t\r\n\
               Content-Length: 3\r\nConnection: close\r\nETag: e\r\nX-Pad: p\r\n\r\nabc"[..],
        );
        let hidden = Names::new(vec![
            http::header::SERVER,
            http::header::DATE,
            HeaderName::from_static("x-pad"),
            CONTENT_LENGTH,
            CONNECTION,
        ]);
        let h = parse(&mut b, &hidden).unwrap().unwrap();
        let names: Vec<_> = h.headers.keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["content-type", "etag"]);
        // Hidden or not, Content-Length frames the body and Connection
        // decides the connection's fate (as nginx reads them before its
        // hide filter).
        assert_eq!(h.framed.length(), Some(3));
        assert!(!h.keep_alive);
        assert_eq!(&b[..], b"abc");
    }

    proptest::proptest! {
        /// The map built without the hop-by-hop fields holds what
        /// strip_hop_by_hop leaves of the map with them (in the upstream's
        /// order, where the removals reorder).
        #[test]
        fn the_hop_by_hop_fields_left_out_are_the_ones_strip_hop_by_hop_removes(
            fields in proptest::collection::vec(
                (
                    proptest::sample::select(&[
                        "Connection", "Keep-Alive", "Proxy-Connection", "TE", "Trailer",
                        "Upgrade", "X-A", "x-b", "Close", "Server", "Vary",
                    ][..]),
                    proptest::sample::select(&[
                        "keep-alive", "close", "x-a", "X-A, x-b", "upgrade", "a, b, c, d, x-b",
                        "1", "",
                    ][..]),
                ),
                0..10,
            ),
            switching in proptest::bool::ANY,
        ) {
            let status = if switching { "101 Switching Protocols" } else { "200 OK" };
            let mut text = format!("HTTP/1.1 {status}\r\n");
            let mut all = HeaderMap::new();
            for (n, v) in &fields {
                text.push_str(&format!("{n}: {v}\r\n"));
                all.append(
                    HeaderName::from_bytes(n.as_bytes()).unwrap(),
                    HeaderValue::from_str(v).unwrap(),
                );
            }
            text.push_str("\r\n");
            let mut b = BytesMut::from(text.as_str());
            let built = parse(&mut b, &Names::default()).unwrap().unwrap().headers;
            crate::wire::hop::strip_hop_by_hop(&mut all, switching);
            let sorted = |h: &HeaderMap| {
                let mut v: Vec<(String, Vec<u8>)> = h
                    .iter()
                    .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
                    .collect();
                v.sort();
                v
            };
            proptest::prop_assert_eq!(sorted(&built), sorted(&all));
            // Those that stay keep the upstream's order.
            let order: Vec<&str> = built.keys().map(|k| k.as_str()).collect();
            let mut upstream: Vec<String> = Vec::new();
            for (n, _) in &fields {
                let n = n.to_ascii_lowercase();
                if order.contains(&n.as_str()) && !upstream.contains(&n) {
                    upstream.push(n);
                }
            }
            proptest::prop_assert_eq!(order, upstream);
        }
    }

    #[test]
    fn a_chunked_response_loses_its_length_as_its_map_is_built() {
        let mut b = BytesMut::from(
            &b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\nVary: a\r\n\r\n"[..],
        );
        let h = parse(&mut b, &Names::default()).unwrap().unwrap();
        let names: Vec<_> = h.headers.keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["vary"]);
        assert_eq!(
            h.framed.response(200, false, false, false),
            Ok((Framing::Chunked, false))
        );
        assert!(h.framed.has_content_length());
    }

    #[test]
    fn more_fields_than_the_stack_holds_parse_up_to_hypers_limit() {
        let mut b = head_with(FAST_HEADERS + 1);
        let h = parse(&mut b, &Names::default()).unwrap().unwrap();
        assert_eq!(h.headers.len(), FAST_HEADERS + 1);
        let mut b = head_with(MAX_HEADERS);
        assert_eq!(
            parse(&mut b, &Names::default())
                .unwrap()
                .unwrap()
                .headers
                .len(),
            MAX_HEADERS
        );
        let mut b = head_with(MAX_HEADERS + 1);
        assert!(matches!(
            parse(&mut b, &Names::default()),
            Err(Error::TooManyFields)
        ));
    }

    #[test]
    fn a_partial_head_waits_and_connection_decides_keep_alive() {
        let mut b = BytesMut::from(&b"HTTP/1.1 200 OK\r\nConnection: close\r\n"[..]);
        assert!(parse(&mut b, &Names::default()).unwrap().is_none());
        b.extend_from_slice(b"\r\n");
        assert!(
            !parse(&mut b, &Names::default())
                .unwrap()
                .unwrap()
                .keep_alive
        );
        let mut b = BytesMut::from(&b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\n\r\n"[..]);
        assert!(
            parse(&mut b, &Names::default())
                .unwrap()
                .unwrap()
                .keep_alive
        );
        let mut b = BytesMut::from(&b"HTTP/1.0 200 OK\r\n\r\n"[..]);
        assert!(
            !parse(&mut b, &Names::default())
                .unwrap()
                .unwrap()
                .keep_alive
        );
    }

    #[test]
    fn common_names_are_the_names_from_bytes_makes() {
        for n in [
            "Server",
            "Date",
            "Content-Type",
            "Content-Length",
            "Connection",
            "Last-Modified",
            "ETag",
            "Accept-Ranges",
            "Transfer-Encoding",
            "Location",
            "Cache-Control",
            "Expires",
            "Vary",
            "Content-Encoding",
            "Set-Cookie",
            "content-length",
            "X-Other",
            "Bad Name",
            "",
        ] {
            let fast = name_of(n.as_bytes()).map_err(|e| e.to_string());
            let slow = HeaderName::from_bytes(n.as_bytes()).map_err(|e| e.to_string());
            assert_eq!(fast.clone().map(|(name, _)| name), slow, "{n}");
            // A name told common is its Common's, spelt as servers spell it.
            if let Ok((name, Some(c))) = fast {
                assert_eq!(c.name(), name, "{n}");
                assert_eq!(c.lower(), name.as_str(), "{n}");
                assert_ne!(n, n.to_ascii_lowercase(), "{n}");
            }
        }
    }

    #[test]
    fn a_plain_head_comes_as_it_came_and_reads_as_its_map() {
        use crate::wire::h1::write::{Asked, BodyLength};
        let wire = b"HTTP/1.1 200 OK\r\nServer: nginx\r\nDate: D\r\nContent-Type: text/html\r\n\
            Set-Cookie: a=1\r\nContent-Length: 5\r\nX-App: 1\r\nset-cookie: b=2\r\n\
            Connection: keep-alive\r\n\r\n";
        let hidden = Names::new(vec![http::header::DATE, http::header::SERVER]);
        let asked = Asked {
            method: &Method::GET,
            version: Version::HTTP_11,
            keep_alive: true,
        };
        let by_map = relayed(wire, &hidden, false, BodyLength::Known(5), &asked).unwrap();
        let as_came = relayed(wire, &hidden, true, BodyLength::Known(5), &asked).unwrap();
        assert!(as_came.4, "it came as it came");
        // The map's names spelt as nginx spells its own; the fields as they
        // came keep the server's spelling (`set-cookie`).
        assert_eq!(
            dated(&by_map.0),
            "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\n\
             Content-Length: 5\r\nX-App: 1\r\nDate: D\r\n\r\n"
        );
        assert_eq!(
            dated(&as_came.0),
            "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nSet-Cookie: a=1\r\nset-cookie: b=2\r\n\
             Content-Length: 5\r\nX-App: 1\r\nDate: D\r\n\r\n"
        );
        // A Location to rewrite, a Connection naming a field: read with a map.
        for wire in [
            &b"HTTP/1.1 302 Found\r\nLocation: /a\r\nContent-Length: 0\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\nConnection: close, X-App\r\nX-App: 1\r\nContent-Length: 0\r\n\r\n",
        ] {
            assert!(
                !relayed(wire, &hidden, true, BodyLength::None, &asked)
                    .unwrap()
                    .4
            );
        }
    }

    /// A written head with the writer's own `Date` value (the clock's)
    /// as `D`.
    fn dated(head: &str) -> String {
        // (Any spelling: the writer's `Date`, a server's `date`.)
        match head.to_ascii_lowercase().find("\r\ndate: ") {
            Some(at) => {
                let from = at + "\r\ndate: ".len();
                let to = head[from..].find("\r\n").map_or(head.len(), |e| from + e);
                format!("{}D{}", &head[..from], &head[to..])
            }
            None => head.to_owned(),
        }
    }

    #[test]
    fn a_hidden_common_name_is_left_out_as_any_other() {
        let hidden = Names::new(vec![
            http::header::ETAG,
            http::header::CONTENT_LENGTH,
            HeaderName::from_static("x-pad"),
        ]);
        let mut buf = BytesMut::from(
            &b"HTTP/1.1 200 OK\r\nETag: \"1\"\r\netag: \"2\"\r\nX-Pad: a\r\nVary: b\r\n\
               Content-Length: 0\r\nConnection: close\r\n\r\n"[..],
        );
        let head = parse(&mut buf, &hidden).unwrap().unwrap();
        let names: Vec<_> = head.headers.keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["vary"]);
        assert!(head.framed.has_content_length() && !head.keep_alive);
        assert_eq!(head.framed.length(), Some(0));
    }

    /// The client's head of `wire` (an upstream's), read with a map or
    /// as it came (`raw`), then written as vigil writes it.
    fn relayed(
        wire: &[u8],
        hidden: &Names,
        raw: bool,
        body: crate::wire::h1::write::BodyLength,
        asked: &crate::wire::h1::write::Asked<'_>,
    ) -> Result<(String, bool, Framed, Option<String>, bool), String> {
        let mut buf = BytesMut::from(wire);
        let Some(mut h) = parse_with(&mut buf, hidden, raw).map_err(|e| format!("{e:?}"))? else {
            return Err("partial".into());
        };
        let came_raw = h.raw.is_some();
        let mut dst = BytesMut::new();
        let head = crate::wire::h1::write::RespHead {
            status: h.status,
            version: h.version,
            reason: h.reason.as_ref().map(|r| r.as_bytes()),
            headers: &mut h.headers,
            raw: h.raw.as_deref(),
        };
        let encoded = crate::wire::h1::write::encode(head, body, asked, &mut dst)
            .map(|e| format!("{:?} {}", e.framing, e.last))
            .ok();
        Ok((
            String::from_utf8_lossy(&dst).into_owned(),
            h.keep_alive,
            h.framed,
            encoded,
            came_raw,
        ))
    }

    const NAMES: [&str; 24] = [
        "Server",
        "Date",
        "date",
        "Content-Type",
        "content-type",
        "Content-Length",
        "content-length",
        "Connection",
        "Keep-Alive",
        "Set-Cookie",
        "set-cookie",
        "X-A",
        "x-a",
        "Location",
        "Refresh",
        "ETag",
        "Vary",
        "Transfer-Encoding",
        "Upgrade",
        "Trailer",
        "X-Pad",
        "Cache-Control",
        "X-Accel-Expires",
        "X-B",
    ];
    const VALUES: [&str; 10] = [
        "1",
        "0",
        "5",
        "close",
        "keep-alive",
        "chunked",
        "a, b",
        "x-a",
        "text/html",
        "close, X-B",
    ];

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]
        #[test]
        fn fields_as_they_came_reach_the_client_as_the_map_brings_them(
            status in proptest::sample::select(vec![200u16, 204, 206, 302, 304, 404, 500]),
            http10 in proptest::bool::ANY,
            fields in proptest::collection::vec((0usize..NAMES.len(), 0usize..VALUES.len()), 0..14),
            hide in 0usize..3,
            body in 0usize..4,
            head_request in proptest::bool::ANY,
            client10 in proptest::bool::ANY,
            keep in proptest::bool::ANY,
        ) {
            use crate::wire::h1::write::{Asked, BodyLength};
            let mut wire = format!("HTTP/1.{} {status} X\r\n", if http10 { 0 } else { 1 });
            for &(n, v) in &fields {
                wire.push_str(&format!("{}: {}\r\n", NAMES[n], VALUES[v]));
            }
            wire.push_str("\r\n");
            let names = |list: &[&'static str]| {
                Names::new(list.iter().map(|n| HeaderName::from_static(n)).collect())
            };
            // nginx's hidden set; with Date passed; with more hidden.
            let hidden = match hide {
                0 => names(&["date", "server", "x-pad", "x-accel-expires"]),
                1 => names(&["server", "x-pad"]),
                _ => names(&["date", "server", "etag", "set-cookie", "x-a", "content-length"]),
            };
            let body = [
                BodyLength::None,
                BodyLength::Known(5),
                BodyLength::Known(1),
                BodyLength::Unknown,
            ][body];
            let method = if head_request { Method::HEAD } else { Method::GET };
            let asked = Asked {
                method: &method,
                version: if client10 { Version::HTTP_10 } else { Version::HTTP_11 },
                keep_alive: keep,
            };
            let by_map = relayed(wire.as_bytes(), &hidden, false, body, &asked);
            let as_came = relayed(wire.as_bytes(), &hidden, true, body, &asked);
            match (by_map, as_came) {
                (Ok(a), Ok(b)) => {
                    // The same bytes but the names' case (the map's are
                    // nginx's own spelling, the others the server's).
                    proptest::prop_assert_eq!(
                        (dated(&a.0).to_ascii_lowercase(), a.1, a.2, &a.3),
                        (dated(&b.0).to_ascii_lowercase(), b.1, b.2, &b.3),
                        "{}", wire
                    );
                }
                (a, b) => proptest::prop_assert_eq!(a.is_err(), b.is_err(), "{}", wire),
            }
        }

        #[test]
        fn tokens_are_found_as_to_str_and_trim_found_them(
            value in proptest::collection::vec(
                proptest::sample::select(&b" \t,aAcClosekp-\x7f\x80\xff\x0b\x0c"[..]),
                0..24,
            ),
        ) {
            let Ok(v) = HeaderValue::from_bytes(&value) else { return Ok(()) };
            for needle in ["close", "keep-alive"] {
                let by_str = v
                    .to_str()
                    .is_ok_and(|s| s.split(',').any(|t| t.trim().eq_ignore_ascii_case(needle)));
                proptest::prop_assert_eq!(has_token(&v, needle), by_str, "{:?}", v);
            }
        }

        #[test]
        fn request_facts_read_as_the_lookups(
            fields in proptest::collection::vec(
                (0usize..11, proptest::sample::select(vec!["close", "keep-alive", "x, Close", "chunked", ""])),
                0..24,
            ),
        ) {
            // Up to 24 fields of 11 names, a name more than once.
            let names = [
                "transfer-encoding", "connection", "host", "x-a", "x-b", "upgrade",
                "x-c", "x-d", "x-e", "x-f", "x-g",
            ];
            let mut h = HeaderMap::new();
            for (n, v) in &fields {
                h.append(HeaderName::from_static(names[*n]), HeaderValue::from_static(v));
            }
            proptest::prop_assert_eq!(
                request_facts(&h),
                (
                    h.contains_key(TRANSFER_ENCODING),
                    asks_close(&h),
                    h.contains_key(http::header::UPGRADE)
                )
            );
            proptest::prop_assert_eq!(
                crate::wire::hop::has_field(&h, &http::header::UPGRADE),
                h.contains_key(http::header::UPGRADE)
            );
        }
    }

    #[test]
    fn a_token_is_found_in_any_case_among_others() {
        let v = |s: &'static str| HeaderValue::from_static(s);
        assert!(has_token(&v("Keep-Alive, CLOSE"), "close"));
        assert!(has_token(&v(" \tclose\t "), "close"));
        assert!(!has_token(&v("closed, x"), "close"));
        assert!(!has_token(&v(""), "close"));
        let obs = HeaderValue::from_bytes(b"close, \xff").unwrap();
        assert!(!has_token(&obs, "close"), "not visible ASCII: no token");
    }

    #[test]
    fn framing_seen_while_building_is_framing_read_from_the_map() {
        for fields in [
            "",
            "Content-Length: 12\r\n",
            "content-length: 12\r\nContent-Length: 12, 12\r\n",
            "Content-Length: 12\r\nContent-Length: 13\r\n",
            "Content-Length: 1x\r\nContent-Length: 12\r\n",
            "Content-Length: \r\n",
            "Content-Length: 0\r\n",
            "Content-Length: 12,\r\n",
            "Transfer-Encoding: chunked\r\n",
            "transfer-encoding: chunked\r\nTransfer-Encoding: gzip\r\n",
            "Transfer-Encoding: gzip\r\nTRANSFER-ENCODING: gzip, Chunked\r\n",
            "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n",
        ] {
            let mut buf = BytesMut::from(format!("HTTP/1.1 200 OK\r\n{fields}\r\n").as_str());
            let head = parse(&mut buf, &Names::default()).unwrap().unwrap();
            // The map the fields make, with Transfer-Encoding (which the
            // head's own map leaves out: hop-by-hop).
            let mut map = HeaderMap::new();
            for line in fields.split_terminator("\r\n") {
                let (n, v) = line.split_once(':').unwrap();
                map.append(
                    HeaderName::from_bytes(n.as_bytes()).unwrap(),
                    HeaderValue::from_str(v.trim()).unwrap(),
                );
            }
            assert_eq!(head.framed, framed_of(&map), "{fields:?}");
        }
    }
}
