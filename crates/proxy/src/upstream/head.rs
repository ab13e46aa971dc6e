//! Request heads out and response heads in, as hyper's client writes and
//! reads them (`hyper::proto::h1::role::Client`).

use bytes::BytesMut;
use http::header::{CONNECTION, CONTENT_LENGTH, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Version};

use super::body::Kind;
use super::Error;

/// hyper's default limit of response header fields.
const MAX_HEADERS: usize = 100;

/// A parsed response head.
pub(super) struct Head {
    pub(super) status: StatusCode,
    pub(super) version: Version,
    pub(super) headers: HeaderMap,
    /// A reason phrase that is not the status's canonical one.
    pub(super) reason: Option<hyper::ext::ReasonPhrase>,
    /// The response lets the connection be kept (its version and
    /// `Connection` say so).
    pub(super) keep_alive: bool,
}

/// The request line and header fields, as hyper's `Client::encode` writes
/// them (the header map's order, its lowercase names).
pub(super) fn encode(parts: &http::request::Parts, dst: &mut Vec<u8>) {
    dst.reserve(30 + parts.headers.len() * 32);
    dst.extend_from_slice(parts.method.as_str().as_bytes());
    dst.push(b' ');
    match parts.uri.path_and_query() {
        Some(pq) if parts.uri.scheme().is_none() && parts.uri.authority().is_none() => {
            dst.extend_from_slice(pq.as_str().as_bytes())
        }
        _ => {
            let _ = std::io::Write::write_fmt(dst, format_args!("{}", parts.uri));
        }
    }
    dst.extend_from_slice(if parts.version == Version::HTTP_10 {
        b" HTTP/1.0\r\n"
    } else {
        b" HTTP/1.1\r\n"
    });
    for (name, value) in &parts.headers {
        dst.extend_from_slice(name.as_str().as_bytes());
        dst.extend_from_slice(b": ");
        dst.extend_from_slice(value.as_bytes());
        dst.extend_from_slice(b"\r\n");
    }
    dst.extend_from_slice(b"\r\n");
}

/// Whether a request's `Connection` asks to close after the response.
pub(super) fn asks_close(headers: &HeaderMap) -> bool {
    headers
        .get_all(CONNECTION)
        .iter()
        .any(|v| has_token(v, "close"))
}

fn has_token(value: &HeaderValue, needle: &str) -> bool {
    value
        .to_str()
        .is_ok_and(|s| s.split(',').any(|t| t.trim().eq_ignore_ascii_case(needle)))
}

/// Parse a response head at the start of `buf`, taking it out of `buf`
/// when it is whole (None: not yet whole).
pub(super) fn parse(buf: &mut BytesMut) -> Result<Option<Head>, Error> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut spans = [(0usize, 0usize, 0usize, 0usize); MAX_HEADERS];
    let mut res = httparse::Response::new(&mut fields);
    let base = buf.as_ptr() as usize;
    let (len, code, reason, version, count) = match res.parse(buf) {
        Ok(httparse::Status::Complete(len)) => {
            let offset = |s: &[u8]| s.as_ptr() as usize - base;
            for (span, h) in spans.iter_mut().zip(res.headers.iter()) {
                let n = offset(h.name.as_bytes());
                let v = offset(h.value);
                *span = (n, n + h.name.len(), v, v + h.value.len());
            }
            let code = res.code.unwrap_or(0);
            let reason = res.reason.unwrap_or("");
            let reason = (Some(reason)
                != StatusCode::from_u16(code)
                    .ok()
                    .and_then(|s| s.canonical_reason()))
            .then(|| bytes::Bytes::copy_from_slice(reason.as_bytes()));
            let version = if res.version == Some(1) {
                Version::HTTP_11
            } else {
                Version::HTTP_10
            };
            (len, code, reason, version, res.headers.len())
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(Error::Parse(e.to_string())),
    };
    let status =
        StatusCode::from_u16(code).map_err(|_| Error::Parse(format!("invalid status {code}")))?;
    let head = buf.split_to(len).freeze();
    let mut headers = HeaderMap::with_capacity(count);
    let mut keep_alive = version == Version::HTTP_11;
    let mut saw_close = false;
    for &(n0, n1, v0, v1) in &spans[..count] {
        let name = HeaderName::from_bytes(&head[n0..n1])
            .map_err(|e| Error::Parse(format!("header name: {e}")))?;
        let value = HeaderValue::from_maybe_shared(head.slice(v0..v1))
            .map_err(|e| Error::Parse(format!("header value: {e}")))?;
        if name == CONNECTION {
            // Once a Connection asks to close, a later keep-alive does not undo it.
            if saw_close || has_token(&value, "close") {
                saw_close = true;
                keep_alive = false;
            } else if !keep_alive {
                keep_alive = has_token(&value, "keep-alive");
            }
        }
        headers.append(name, value);
    }
    let reason = match reason {
        Some(r) => Some(
            hyper::ext::ReasonPhrase::try_from(r)
                .map_err(|_| Error::Parse("invalid reason phrase".to_owned()))?,
        ),
        None => None,
    };
    Ok(Some(Head {
        status,
        version,
        headers,
        reason,
        keep_alive,
    }))
}

/// hyper's `Client::decoder`: how the body is framed, and whether the
/// connection is being upgraded.
pub(super) fn decoder(
    status: StatusCode,
    method: &Method,
    version: Version,
    headers: &HeaderMap,
) -> Result<(Kind, bool), Error> {
    match status.as_u16() {
        101 => return Ok((Kind::Done, true)),
        204 | 304 => return Ok((Kind::Done, false)),
        _ => {}
    }
    if *method == Method::HEAD {
        return Ok((Kind::Done, false));
    }
    if *method == Method::CONNECT && status.is_success() {
        return Ok((Kind::Done, true));
    }
    if headers.contains_key(TRANSFER_ENCODING) {
        if version == Version::HTTP_10 {
            return Err(Error::Parse(
                "HTTP/1.0 response with Transfer-Encoding".to_owned(),
            ));
        }
        let chunked = headers
            .get_all(TRANSFER_ENCODING)
            .iter()
            .next_back()
            .is_some_and(|v| last_token_is_chunked(v.as_bytes()));
        return Ok((
            if chunked {
                Kind::chunked()
            } else {
                Kind::Close
            },
            false,
        ));
    }
    match content_length_parse_all(headers) {
        Some(0) => Ok((Kind::Done, false)),
        Some(n) => Ok((Kind::Length(n), false)),
        None if headers.contains_key(CONTENT_LENGTH) => {
            Err(Error::Parse("invalid Content-Length".to_owned()))
        }
        None => Ok((Kind::Close, false)),
    }
}

/// Whether the last coding of a Transfer-Encoding value is `chunked`.
pub(super) fn last_token_is_chunked(v: &[u8]) -> bool {
    std::str::from_utf8(v).is_ok_and(|s| {
        s.rsplit(',')
            .next()
            .is_some_and(|t| t.trim().eq_ignore_ascii_case("chunked"))
    })
}

/// hyper's `content_length_parse_all`: every Content-Length value (also
/// comma-separated ones) is digits and they all agree.
pub(super) fn content_length_parse_all(headers: &HeaderMap) -> Option<u64> {
    let mut found: Option<u64> = None;
    for h in headers.get_all(CONTENT_LENGTH) {
        let line = h.to_str().ok()?;
        for v in line.split(',') {
            let n = from_digits(v.trim().as_bytes())?;
            match found {
                None => found = Some(n),
                Some(m) if m != n => return None,
                Some(_) => {}
            }
        }
    }
    found
}

fn from_digits(b: &[u8]) -> Option<u64> {
    if b.is_empty() {
        return None;
    }
    let mut n: u64 = 0;
    for &c in b {
        if !c.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_add(u64::from(c - b'0'))?;
    }
    Some(n)
}
