//! A response head encoded as hyper 1.x's server encodes it
//! (`proto/h1/role.rs`, `Server::encode` with lower-case names, and
//! `Conn::enforce_version`), so that clients see the same bytes, and the
//! body framing it chose.

use std::cell::RefCell;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{BufMut, Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode, Version};
use tokio::time::Instant;

use crate::wire::raw_head::RawFields;

/// How a response body is framed on the wire.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum RespFraming {
    /// Exactly this many bytes (0: no body is sent).
    Length(u64),
    /// `Transfer-Encoding: chunked`, with the trailer fields the `Trailer`
    /// header announced (None: no trailers are sent).
    Chunked(Option<Vec<HeaderName>>),
    /// Until the connection closes (HTTP/1.0 without a length).
    CloseDelimited,
}

/// What the body announced before its first frame (hyper's `BodyLength`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BodyLength {
    /// `is_end_stream` already: nothing to send.
    None,
    /// An exact size hint.
    Known(u64),
    /// No exact size.
    Unknown,
}

/// The request facts the response head depends on.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Asked<'a> {
    /// The request's method.
    pub(crate) method: &'a Method,
    /// The request's version.
    pub(crate) version: Version,
    /// The connection may stay open after this response (the request's
    /// `Connection` and version, and no shutdown under way).
    pub(crate) keep_alive: bool,
}

/// An encoded head: its bytes, the body's framing, and whether the
/// connection closes after the response.
#[derive(Debug)]
pub(crate) struct Encoded {
    pub(crate) framing: RespFraming,
    pub(crate) last: bool,
}

/// The formatted `Date` value of the current second, one per thread.
struct CachedDate {
    bytes: [u8; 29],
    /// When, by the worker's cached clock, the second `bytes` names ends
    /// (None before the first response).
    until: Option<Instant>,
}

thread_local! {
    static DATE: RefCell<CachedDate> = const {
        RefCell::new(CachedDate {
            bytes: [b' '; 29],
            until: None,
        })
    };
}

/// The `Date` of a response, written in place. As nginx's
/// `ngx_cached_http_time`, it follows the worker's cached clock
/// (`vigil_net::clock::coarse_now`): the wall clock itself is read only
/// when a new second is formatted, not once per response.
fn extend_date(dst: &mut BytesMut) {
    DATE.with(|c| {
        let mut c = c.borrow_mut();
        let now = vigil_net::clock::coarse_now();
        if c.until.is_none_or(|until| now >= until) {
            let wall = SystemTime::now();
            let text = httpdate::fmt_http_date(wall);
            let n = text.len().min(29);
            c.bytes[..n].copy_from_slice(&text.as_bytes()[..n]);
            let nanos = wall
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default()
                .subsec_nanos();
            c.until = Some(now + Duration::from_secs(1) - Duration::from_nanos(u64::from(nanos)));
        }
        dst.extend_from_slice(&c.bytes);
    });
}

/// Whether a comma-separated header value holds `token` (any case).
pub(crate) fn has_token(value: &HeaderValue, token: &str) -> bool {
    has_token_in(value.as_bytes(), token)
}

fn has_token_in(value: &[u8], token: &str) -> bool {
    value
        .split(|&b| b == b',')
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
}

fn can_chunked(method: &Method, status: StatusCode) -> bool {
    if method == Method::HEAD
        || method == Method::CONNECT && status.is_success()
        || status.is_informational()
    {
        false
    } else {
        !matches!(status, StatusCode::NO_CONTENT | StatusCode::NOT_MODIFIED)
    }
}

fn can_have_content_length(method: &Method, status: StatusCode) -> bool {
    if status.is_informational() || method == Method::CONNECT && status.is_success() {
        false
    } else {
        !matches!(status, StatusCode::NO_CONTENT | StatusCode::NOT_MODIFIED)
    }
}

/// Which version frames the body and whether the connection stays: an
/// HTTP/1.0 client's (`Connection: keep-alive` when it stays open,
/// `Connection: close` when not); an HTTP/1.1 client that is not kept
/// gets `Connection: close`. The status line says `HTTP/1.1` to both, as
/// nginx's does. Returns the head's
/// version and whether the connection stays open.
fn enforce_version(
    headers: &mut HeaderMap,
    version: Version,
    asked: &Asked<'_>,
) -> (Version, bool) {
    let mut keep_alive = asked.keep_alive;
    match asked.version {
        Version::HTTP_10 => {
            let kept = headers
                .get_all(header::CONNECTION)
                .iter()
                .any(|v| has_token(v, "keep-alive"));
            if !kept {
                match version {
                    Version::HTTP_10 => keep_alive = false,
                    Version::HTTP_11 if keep_alive => {
                        headers.append(header::CONNECTION, HeaderValue::from_static("keep-alive"));
                    }
                    _ => {}
                }
            }
            // nginx says `Connection: close` to an HTTP/1.0 client it
            // does not keep, as to any other.
            if !keep_alive
                && !headers
                    .get_all(header::CONNECTION)
                    .iter()
                    .any(|v| has_token(v, "close"))
            {
                headers.append(header::CONNECTION, HeaderValue::from_static("close"));
            }
            (Version::HTTP_10, keep_alive)
        }
        _ => {
            if !keep_alive
                && !headers
                    .get_all(header::CONNECTION)
                    .iter()
                    .any(|v| has_token(v, "close"))
            {
                headers.append(header::CONNECTION, HeaderValue::from_static("close"));
            }
            (version, keep_alive)
        }
    }
}

/// A response head to encode.
pub(crate) struct RespHead<'a> {
    pub(crate) status: StatusCode,
    /// The response's version.
    pub(crate) version: Version,
    /// A custom reason phrase.
    pub(crate) reason: Option<&'a [u8]>,
    /// Its fields (which may gain a `Connection` field), after the ones
    /// that came as they came (`raw`).
    pub(crate) headers: &'a mut HeaderMap,
    pub(crate) raw: Option<&'a RawFields>,
}

/// Encode `head` to `asked`, whose body announced `body`. `Err` where
/// hyper refuses the head (it then closes the connection without a
/// response). (Long: the status line, the framing decision and one pass
/// over the fields, on every response's path; the pieces share the
/// decisions they make, which split functions would pass around.)
pub(crate) fn encode(
    head: RespHead<'_>,
    mut body: BodyLength,
    asked: &Asked<'_>,
    dst: &mut BytesMut,
) -> Result<Encoded, &'static str> {
    let RespHead {
        status,
        version,
        reason,
        headers,
        raw,
    } = head;
    let method = asked.method;
    let (version, keep_alive) = enforce_version(headers, version, asked);
    let mut wrote_len = false;
    let mut status = status;
    let mut unsupported = false;
    let is_last = if status == StatusCode::SWITCHING_PROTOCOLS {
        true
    } else if method == Method::CONNECT && status.is_success() {
        wrote_len = true;
        true
    } else if status.is_informational() {
        // hyper answers a 1xx response with a bare 500.
        headers.clear();
        status = StatusCode::INTERNAL_SERVER_ERROR;
        body = BodyLength::None;
        unsupported = true;
        true
    } else {
        !keep_alive
    };
    // The whole head in one allocation: status line, headers, and what
    // may be added (length, date).
    let raw = raw.filter(|_| !unsupported);
    let size: usize = headers
        .iter()
        .map(|(n, v)| n.as_str().len() + v.len() + 4)
        .sum::<usize>()
        + raw.map_or(0, RawFields::wire_len);
    dst.reserve(size + 128);
    if status == StatusCode::OK && reason.is_none() {
        dst.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
    } else {
        // nginx's status line is `HTTP/1.1` whatever the client's
        // version (`ngx_http_status_lines`); `version` still frames the
        // body (no chunks for an HTTP/1.0 client).
        dst.extend_from_slice(b"HTTP/1.1 ");
        dst.extend_from_slice(status.as_str().as_bytes());
        dst.put_u8(b' ');
        match reason {
            Some(r) => dst.extend_from_slice(r),
            None => dst.extend_from_slice(status.canonical_reason().unwrap_or("<none>").as_bytes()),
        }
        dst.extend_from_slice(b"\r\n");
    }
    let mut w = Fields {
        method,
        status,
        version,
        body,
        framing: RespFraming::Length(0),
        trailer_fields: None,
        wrote_len,
        wrote_date: false,
        is_name_written: false,
        must_write_chunked: false,
        prev_con_len: None,
        is_last,
    };
    // The fields that came as they came first (a map's fields are the
    // ones added since: `Connection`, which never comes so).
    for f in raw.into_iter().flat_map(RawFields::iter) {
        use crate::wire::raw_head::Kind as Raw;
        let (kind, name) = match f.kind {
            Raw::ContentLength => (Kind::ContentLength, Name::Spelt(f.name)),
            Raw::Date => (Kind::Date, Name::Spelt(f.name)),
            Raw::Named(_) => (Kind::Other, Name::Spelt(f.name)),
            Raw::Other => (Kind::Other, Name::Spelt(f.name)),
        };
        w.field(dst, f.first_of_name, kind, name, f.value)?;
    }
    let mut cur: Option<&HeaderName> = None;
    for (name, value) in headers.iter() {
        let first_of_name = cur != Some(name);
        cur = Some(name);
        let kind = match *name {
            header::CONTENT_LENGTH => Kind::ContentLength,
            header::TRANSFER_ENCODING => Kind::TransferEncoding,
            header::CONNECTION => Kind::Connection,
            header::DATE => Kind::Date,
            header::TRAILER => Kind::Trailer,
            _ => Kind::Other,
        };
        w.field(
            dst,
            first_of_name,
            kind,
            Name::Lower(name.as_str()),
            value.as_bytes(),
        )?;
    }
    w.close_name(dst);
    let Fields {
        mut framing,
        trailer_fields,
        wrote_len,
        wrote_date,
        mut is_last,
        ..
    } = w;
    if !wrote_len {
        framing = match body {
            BodyLength::Unknown => {
                if version == Version::HTTP_10 || !can_chunked(method, status) {
                    RespFraming::CloseDelimited
                } else {
                    dst.extend_from_slice(b"Transfer-Encoding: chunked\r\n");
                    RespFraming::Chunked(None)
                }
            }
            BodyLength::None | BodyLength::Known(0) => {
                if can_have_content_length(method, status) && method != Method::HEAD {
                    dst.extend_from_slice(b"Content-Length: 0\r\n");
                }
                RespFraming::Length(0)
            }
            BodyLength::Known(len) => {
                if can_have_content_length(method, status) {
                    dst.extend_from_slice(b"Content-Length: ");
                    push_u64(dst, len);
                    dst.extend_from_slice(b"\r\n");
                    RespFraming::Length(len)
                } else {
                    RespFraming::Length(0)
                }
            }
        };
    }
    if !can_chunked(method, status) {
        framing = RespFraming::Length(0);
    }
    if !wrote_date {
        dst.extend_from_slice(b"Date: ");
        extend_date(dst);
        dst.extend_from_slice(b"\r\n\r\n");
    } else {
        dst.extend_from_slice(b"\r\n");
    }
    if let (RespFraming::Chunked(t), Some(fields)) = (&mut framing, trailer_fields) {
        *t = Some(fields);
    }
    if framing == RespFraming::CloseDelimited {
        is_last = true;
    }
    if unsupported {
        return Ok(Encoded {
            framing: RespFraming::Length(0),
            last: true,
        });
    }
    Ok(Encoded {
        framing,
        last: is_last,
    })
}

/// What the writer does with a field, by its name.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    ContentLength,
    TransferEncoding,
    Connection,
    Date,
    Trailer,
    Other,
}

/// A field's name: a map's (lower-case), or as an upstream spelt it
/// (written lower-case, as a map would have it).
#[derive(Clone, Copy)]
enum Name<'a> {
    Lower(&'a str),
    Spelt(&'a [u8]),
}

/// hyper's `Server::encode` over the fields one at a time, with what it
/// learns on the way.
struct Fields<'a> {
    method: &'a Method,
    status: StatusCode,
    version: Version,
    body: BodyLength,
    framing: RespFraming,
    trailer_fields: Option<Vec<HeaderName>>,
    wrote_len: bool,
    wrote_date: bool,
    is_name_written: bool,
    must_write_chunked: bool,
    prev_con_len: Option<u64>,
    is_last: bool,
}

impl Fields<'_> {
    /// End a name whose values were written on one line.
    fn close_name(&mut self, dst: &mut BytesMut) {
        if self.is_name_written {
            dst.extend_from_slice(if self.must_write_chunked {
                b", chunked\r\n"
            } else {
                b"\r\n"
            });
        }
    }

    /// A value of a name whose values go on one line: after `name` for
    /// the first, after `, ` for the others.
    fn join(&mut self, dst: &mut BytesMut, name: &[u8], value: &[u8]) {
        if self.is_name_written {
            dst.extend_from_slice(b", ");
        } else {
            self.is_name_written = true;
            dst.extend_from_slice(name);
        }
        dst.extend_from_slice(value);
    }

    /// The field `name: value`; `first_of_name`: the field before it had
    /// another name.
    fn field(
        &mut self,
        dst: &mut BytesMut,
        first_of_name: bool,
        kind: Kind,
        name: Name<'_>,
        value: &[u8],
    ) -> Result<(), &'static str> {
        let (method, status, version) = (self.method, self.status, self.version);
        if first_of_name {
            self.close_name(dst);
            self.is_name_written = false;
        }
        match kind {
            Kind::ContentLength => {
                if self.wrote_len && !self.is_name_written {
                    return Err("unexpected content-length in the response");
                }
                match self.body {
                    BodyLength::Known(known) => {
                        if !self.is_name_written {
                            self.framing = RespFraming::Length(known);
                            dst.extend_from_slice(b"Content-Length: ");
                            dst.extend_from_slice(value);
                            self.wrote_len = true;
                            self.is_name_written = true;
                        }
                        return Ok(());
                    }
                    BodyLength::Unknown => {
                        let Some(len) = parse_content_length(value) else {
                            return Err("illegal content-length in the response");
                        };
                        if let Some(prev) = self.prev_con_len {
                            if prev != len {
                                return Err("multiple content-length values in the response");
                            }
                            return Ok(());
                        }
                        self.framing = RespFraming::Length(len);
                        dst.extend_from_slice(b"Content-Length: ");
                        dst.extend_from_slice(value);
                        self.wrote_len = true;
                        self.is_name_written = true;
                        self.prev_con_len = Some(len);
                        return Ok(());
                    }
                    BodyLength::None => {
                        if *method != Method::HEAD {
                            return Ok(());
                        }
                    }
                }
                self.wrote_len = true;
            }
            Kind::TransferEncoding => {
                if self.wrote_len && !self.is_name_written {
                    return Err("unexpected transfer-encoding in the response");
                }
                if version == Version::HTTP_10 || !can_chunked(method, status) {
                    return Ok(());
                }
                self.wrote_len = true;
                self.must_write_chunked = !is_chunked(value);
                if !self.is_name_written {
                    self.framing = RespFraming::Chunked(None);
                }
                self.join(dst, b"Transfer-Encoding: ", value);
                return Ok(());
            }
            Kind::Connection => {
                if !self.is_last && has_token_in(value, "close") {
                    self.is_last = true;
                }
                self.join(dst, b"Connection: ", value);
                return Ok(());
            }
            Kind::Date => self.wrote_date = true,
            Kind::Trailer => {
                if version == Version::HTTP_10 || !can_chunked(method, status) {
                    return Ok(());
                }
                self.join(dst, b"Trailer: ", value);
                // HeaderValue::to_str: visible ASCII and tabs only.
                if value.iter().all(|&b| b == b'\t' || (32..127).contains(&b)) {
                    if let Ok(text) = std::str::from_utf8(value) {
                        let names = text
                            .split(',')
                            .filter_map(|s| HeaderName::from_bytes(s.trim().as_bytes()).ok());
                        self.trailer_fields
                            .get_or_insert_with(Vec::new)
                            .extend(names);
                    }
                }
                return Ok(());
            }
            Kind::Other => {}
        }
        match name {
            Name::Lower(n) => crate::wire::names::put_spelling(dst, n),
            Name::Spelt(n) => dst.extend_from_slice(n),
        }
        dst.extend_from_slice(b": ");
        dst.extend_from_slice(value);
        dst.extend_from_slice(b"\r\n");
        Ok(())
    }
}

fn push_u64(dst: &mut BytesMut, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    dst.extend_from_slice(&digits[i..]);
}

fn is_chunked(value: &[u8]) -> bool {
    // hyper: the last encoding is `chunked`.
    value
        .rsplit(|&b| b == b',')
        .next()
        .is_some_and(|t| t.trim_ascii().eq_ignore_ascii_case(b"chunked"))
}

/// hyper's `content_length_parse`: digits only.
fn parse_content_length(b: &[u8]) -> Option<u64> {
    if b.is_empty() || b.len() > 19 || !b.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(b).ok()?.parse().ok()
}

/// The size line of one chunk.
pub(crate) fn chunk_size(len: usize) -> Bytes {
    let mut b = BytesMut::with_capacity(18);
    let _ = std::fmt::Write::write_fmt(&mut b, format_args!("{len:X}\r\n"));
    b.freeze()
}

/// The end of a chunked body with `trailers`, keeping only the announced
/// fields that may be trailers (hyper's `encode_trailers`); None when none
/// is left (the plain `0\r\n\r\n` follows).
pub(crate) fn trailers(allowed: &[HeaderName], trailers: &HeaderMap) -> Option<Bytes> {
    let mut out = BytesMut::new();
    for (name, value) in trailers {
        if !allowed.contains(name) || !valid_trailer(name) {
            continue;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if out.is_empty() {
        return None;
    }
    let mut all = BytesMut::with_capacity(out.len() + 5);
    all.extend_from_slice(b"0\r\n");
    all.extend_from_slice(&out);
    all.extend_from_slice(b"\r\n");
    Some(all.freeze())
}

fn valid_trailer(name: &HeaderName) -> bool {
    !matches!(
        *name,
        header::AUTHORIZATION
            | header::CACHE_CONTROL
            | header::CONTENT_ENCODING
            | header::CONTENT_LENGTH
            | header::CONTENT_RANGE
            | header::CONTENT_TYPE
            | header::HOST
            | header::MAX_FORWARDS
            | header::SET_COOKIE
            | header::TRAILER
            | header::TRANSFER_ENCODING
            | header::TE
    )
}

/// hyper's automatic answer to a head it cannot parse.
pub(crate) fn parse_error(status: StatusCode, dst: &mut BytesMut) {
    dst.extend_from_slice(b"HTTP/1.1 ");
    dst.extend_from_slice(status.as_str().as_bytes());
    dst.put_u8(b' ');
    dst.extend_from_slice(status.canonical_reason().unwrap_or("<none>").as_bytes());
    dst.extend_from_slice(b"\r\nContent-Length: 0\r\nDate: ");
    extend_date(dst);
    dst.extend_from_slice(b"\r\n\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(
        status: StatusCode,
        headers: &[(&str, &str)],
        body: BodyLength,
        method: &Method,
        version: Version,
        keep_alive: bool,
    ) -> (String, Encoded) {
        let mut map = HeaderMap::new();
        for (n, v) in headers {
            map.append(
                HeaderName::from_bytes(n.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        map.insert(header::DATE, HeaderValue::from_static("D"));
        let asked = Asked {
            method,
            version,
            keep_alive,
        };
        let mut dst = BytesMut::new();
        let head = RespHead {
            status,
            version: Version::HTTP_11,
            reason: None,
            headers: &mut map,
            raw: None,
        };
        let e = encode(head, body, &asked, &mut dst).unwrap();
        (String::from_utf8(dst.to_vec()).unwrap(), e)
    }

    #[test]
    fn a_known_length_is_written_and_a_head_request_keeps_its_content_length() {
        let (h, e) = head(
            StatusCode::OK,
            &[("content-type", "text/plain")],
            BodyLength::Known(5),
            &Method::GET,
            Version::HTTP_11,
            true,
        );
        assert_eq!(
            h,
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nDate: D\r\nContent-Length: 5\r\n\r\n"
        );
        assert_eq!(e.framing, RespFraming::Length(5));
        assert!(!e.last);
        let (h, e) = head(
            StatusCode::OK,
            &[("content-length", "42")],
            BodyLength::None,
            &Method::HEAD,
            Version::HTTP_11,
            true,
        );
        assert_eq!(
            h,
            "HTTP/1.1 200 OK\r\nContent-Length: 42\r\nDate: D\r\n\r\n"
        );
        assert_eq!(e.framing, RespFraming::Length(0));
    }

    #[test]
    fn no_body_and_no_length_for_204_and_304() {
        for status in [StatusCode::NO_CONTENT, StatusCode::NOT_MODIFIED] {
            let (h, e) = head(
                status,
                &[("content-length", "7")],
                BodyLength::Known(7),
                &Method::GET,
                Version::HTTP_11,
                true,
            );
            assert_eq!(e.framing, RespFraming::Length(0), "{h}");
            assert!(!h.contains("Transfer-Encoding"), "{h}");
        }
        let (h, _) = head(
            StatusCode::NO_CONTENT,
            &[],
            BodyLength::None,
            &Method::GET,
            Version::HTTP_11,
            true,
        );
        assert_eq!(h, "HTTP/1.1 204 No Content\r\nDate: D\r\n\r\n");
    }

    #[test]
    fn an_unknown_length_is_chunked_for_http11_and_close_delimited_for_http10() {
        let (h, e) = head(
            StatusCode::OK,
            &[],
            BodyLength::Unknown,
            &Method::GET,
            Version::HTTP_11,
            true,
        );
        assert_eq!(
            h,
            "HTTP/1.1 200 OK\r\nDate: D\r\nTransfer-Encoding: chunked\r\n\r\n"
        );
        assert_eq!(e.framing, RespFraming::Chunked(None));
        let (h, e) = head(
            StatusCode::OK,
            &[],
            BodyLength::Unknown,
            &Method::GET,
            Version::HTTP_10,
            false,
        );
        // nginx's status line, and its `Connection: close` to a client
        // it does not keep.
        assert_eq!(h, "HTTP/1.1 200 OK\r\nDate: D\r\nConnection: close\r\n\r\n");
        assert_eq!(e.framing, RespFraming::CloseDelimited);
        assert!(e.last);
    }

    #[test]
    fn http10_keep_alive_is_said_and_http11_close_is_said() {
        let (h, e) = head(
            StatusCode::OK,
            &[],
            BodyLength::Known(1),
            &Method::GET,
            Version::HTTP_10,
            true,
        );
        assert_eq!(
            h,
            "HTTP/1.1 200 OK\r\nDate: D\r\nConnection: keep-alive\r\nContent-Length: 1\r\n\r\n"
        );
        assert!(!e.last);
        let (h, e) = head(
            StatusCode::OK,
            &[],
            BodyLength::Known(1),
            &Method::GET,
            Version::HTTP_11,
            false,
        );
        assert_eq!(
            h,
            "HTTP/1.1 200 OK\r\nDate: D\r\nConnection: close\r\nContent-Length: 1\r\n\r\n"
        );
        assert!(e.last);
    }

    #[tokio::test(start_paused = true)]
    async fn the_date_is_formatted_again_only_when_the_worker_clock_passes_its_second() {
        let until = || DATE.with(|c| c.borrow().until).expect("formatted");
        let mut dst = BytesMut::new();
        extend_date(&mut dst);
        assert_eq!(dst.len(), 29, "an IMF-fixdate");
        assert!(httpdate::parse_http_date(std::str::from_utf8(&dst).unwrap()).is_ok());
        let first = until();
        let left = first - Instant::now();
        assert!(left > Duration::ZERO && left <= Duration::from_secs(1));
        tokio::time::advance(left / 2).await;
        extend_date(&mut BytesMut::new());
        assert_eq!(until(), first, "the same second: not formatted again");
        tokio::time::advance(left).await;
        extend_date(&mut BytesMut::new());
        assert!(until() > first, "a later second: formatted again");
    }

    #[tokio::test(start_paused = true)]
    async fn the_date_follows_the_worker_clock_not_the_clock() {
        let until = || DATE.with(|c| c.borrow().until).expect("formatted");
        vigil_net::clock::refresh();
        extend_date(&mut BytesMut::new());
        let first = until();
        // The clock passes the second, the worker's reading does not (no
        // wake-up since): the same Date.
        tokio::time::advance(Duration::from_secs(2)).await;
        extend_date(&mut BytesMut::new());
        assert_eq!(until(), first, "the cached reading, not the clock");
        vigil_net::clock::refresh();
        extend_date(&mut BytesMut::new());
        assert!(until() > first, "after the next wake-up: the next second");
    }
}
