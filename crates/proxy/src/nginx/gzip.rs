//! `gzip on`: nginx's gzip filter (1.22) on responses to clients. When
//! (`ngx_http_gzip_header_filter`): status 200, 403 or 404, no
//! `Content-Encoding` yet, `Content-Length` absent or at least
//! `gzip_min_length`, a type of `gzip_types` (`text/html` always); then `Vary: Accept-Encoding` with `gzip_vary on`; then whether
//! the client takes gzip (`ngx_http_gzip_ok`: `Accept-Encoding`,
//! `gzip_http_version`, `gzip_disable msie6`, `gzip_proxied` for requests
//! with `Via`). The body is compressed as it streams, each upstream chunk
//! flushed (as nginx flushes when it proxies unbuffered).

use std::io::Write;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use flate2::write::GzEncoder;
use flate2::Compression;
use http::header::{self, HeaderMap, HeaderValue};
use http::request::Parts;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame};
use hyper::Response;
use vigil_core::config::{Gzip, GzipProxied, HttpVersion};

use crate::wire::payload::{BoxError, UpBody};

/// `resp`, compressed if nginx would compress it for `parts`.
pub(crate) fn filter(g: &Gzip, parts: &Parts, mut resp: Response<UpBody>) -> Response<UpBody> {
    if !g.enable || !candidate(g, &resp) {
        return resp;
    }
    if g.vary {
        resp.headers_mut()
            .append(header::VARY, HeaderValue::from_static("Accept-Encoding"));
    }
    if !client_takes_gzip(g, parts, resp.headers()) {
        return resp;
    }
    let h = resp.headers_mut();
    h.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    h.remove(header::CONTENT_LENGTH);
    h.remove(header::ACCEPT_RANGES);
    weak_etag(h);
    let level = Compression::new(g.comp_level.clamp(1, 9));
    resp.map(|inner| {
        Gzipped {
            inner,
            enc: Some(GzEncoder::new(Vec::new(), level)),
        }
        .boxed()
    })
}

/// The header filter's first test: whether this response may be compressed.
fn candidate(g: &Gzip, resp: &Response<UpBody>) -> bool {
    let h = resp.headers();
    let status = resp.status().as_u16();
    let encoded = h
        .get(header::CONTENT_ENCODING)
        .is_some_and(|v| !v.is_empty());
    let short = content_length(h).is_some_and(|n| n < g.min_length);
    matches!(status, 200 | 403 | 404)
        && !encoded
        && !short
        && type_listed(&g.types, h.get(header::CONTENT_TYPE))
    // `r->header_only` (HEAD) is set after this filter, in the header
    // filter: nginx says gzip to a HEAD too.
}

fn content_length(h: &HeaderMap) -> Option<u64> {
    h.get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// `ngx_http_test_content_type` on the type as the upstream module keeps
/// it: the whole value, cut at the `;` before a `charset=` parameter only
/// (`ngx_http_upstream_copy_content_type`), lowercased.
fn type_listed(types: &[String], ct: Option<&HeaderValue>) -> bool {
    if types.iter().any(|t| t == "*") {
        return true;
    }
    let Some(v) = ct.map(HeaderValue::as_bytes).filter(|v| !v.is_empty()) else {
        return false;
    };
    let mut len = v.len();
    let mut i = 0;
    while i < v.len() {
        if v[i] == b';' {
            let last = i;
            let mut j = i + 1;
            while v.get(j) == Some(&b' ') {
                j += 1;
            }
            if v.len() >= j + 8 && v[j..j + 8].eq_ignore_ascii_case(b"charset=") {
                len = last;
                break;
            }
            i = j;
            continue;
        }
        i += 1;
    }
    let t = String::from_utf8_lossy(&v[..len]).to_ascii_lowercase();
    t == "text/html" || types.contains(&t)
}

/// `ngx_http_gzip_ok`.
fn client_takes_gzip(g: &Gzip, parts: &Parts, out: &HeaderMap) -> bool {
    let h = &parts.headers;
    let Some(ae) = h.get(header::ACCEPT_ENCODING).map(HeaderValue::as_bytes) else {
        return false;
    };
    if ae.len() < 4 || (!ae.starts_with(b"gzip,") && !accepts_gzip(ae)) {
        return false;
    }
    if g.disable_msie6
        && h.get(header::USER_AGENT)
            .is_some_and(|u| msie6(u.as_bytes()))
    {
        return false;
    }
    let below = match parts.version {
        http::Version::HTTP_09 => true,
        http::Version::HTTP_10 => g.http_version == HttpVersion::Http11,
        _ => false,
    };
    if below {
        return false;
    }
    if !h.contains_key(header::VIA) {
        return true;
    }
    let p = g.proxied;
    if p == GzipProxied::default() {
        // `gzip_proxied off`.
        return false;
    }
    if p.any {
        return true;
    }
    if p.auth && h.contains_key(header::AUTHORIZATION) {
        return true;
    }
    if let Some(e) = out.get(header::EXPIRES) {
        if !p.expired {
            return false;
        }
        let when = |v: &HeaderValue| httpdate::parse_http_date(v.to_str().ok()?).ok();
        let Some(expires) = when(e) else {
            return false;
        };
        let date = match out.get(header::DATE) {
            Some(d) => match when(d) {
                Some(d) => d,
                None => return false,
            },
            None => std::time::SystemTime::now(),
        };
        return expires < date;
    }
    let cc: Vec<&HeaderValue> = out.get_all(header::CACHE_CONTROL).iter().collect();
    if !cc.is_empty() {
        let has = |word: &str| cc.iter().any(|v| has_token(v.as_bytes(), word.as_bytes()));
        return (p.no_cache && has("no-cache"))
            || (p.no_store && has("no-store"))
            || (p.private && has("private"));
    }
    if p.no_last_modified && out.contains_key(header::LAST_MODIFIED) {
        return false;
    }
    if p.no_etag && out.contains_key(header::ETAG) {
        return false;
    }
    // nginx falls through to "ok" here.
    true
}

/// `ngx_http_gzip_accept_encoding`: a `gzip` token (after the start, `,`
/// or a space) not given `q=0`.
fn accepts_gzip(ae: &[u8]) -> bool {
    let mut start = 0;
    let p = loop {
        let Some(off) = ae[start..]
            .windows(4)
            .position(|w| w.eq_ignore_ascii_case(b"gzip"))
        else {
            return false;
        };
        let p = start + off;
        if p == 0 || ae[p - 1] == b',' || ae[p - 1] == b' ' {
            break p;
        }
        start = p + 4;
    };
    let mut i = p + 4;
    loop {
        let Some(&c) = ae.get(i) else { return true };
        i += 1;
        match c {
            b',' => return true,
            b';' => break,
            b' ' => continue,
            _ => return false,
        }
    }
    loop {
        let Some(&c) = ae.get(i) else { return true };
        i += 1;
        match c {
            b'q' | b'Q' => break,
            b' ' => continue,
            _ => return false,
        }
    }
    if i + 2 > ae.len() || ae[i] != b'=' {
        return false;
    }
    quantity(&ae[i + 1..]) != 0
}

/// `ngx_http_gzip_quantity`, with its sum of the decimals.
fn quantity(s: &[u8]) -> u32 {
    let Some((&c, mut rest)) = s.split_first() else {
        return 0;
    };
    if c != b'0' && c != b'1' {
        return 0;
    }
    let mut q = u32::from(c - b'0') * 100;
    let Some((&c, r)) = rest.split_first() else {
        return q;
    };
    rest = r;
    if c == b',' || c == b' ' {
        return q;
    }
    if c != b'.' {
        return 0;
    }
    let mut n = 0;
    for &c in rest {
        if c == b',' || c == b' ' {
            break;
        }
        if !c.is_ascii_digit() {
            return 0;
        }
        q += u32::from(c - b'0');
        n += 1;
    }
    if q > 100 || n > 3 {
        return 0;
    }
    q
}

/// `r->headers_in.msie6` as `ngx_http_process_user_agent` sets it.
fn msie6(ua: &[u8]) -> bool {
    if find(ua, b"Opera").is_some() {
        return false;
    }
    let Some(m) = find(ua, b"MSIE ") else {
        return false;
    };
    if m + 7 >= ua.len() || ua[m + 6] != b'.' {
        return false;
    }
    match ua[m + 5] {
        b'4' | b'5' => true,
        b'6' => find(&ua[m + 8..], b"SV1").is_none(),
        _ => false,
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Whether a Cache-Control value lists `word` (case-insensitive, as
/// `ngx_http_parse_multi_header_lines` finds it).
fn has_token(v: &[u8], word: &[u8]) -> bool {
    v.split(|&b| b == b',' || b == b';').any(|t| {
        let t = t.trim_ascii();
        let name = t.split(|&b| b == b'=').next().unwrap_or(t);
        name.eq_ignore_ascii_case(word)
    })
}

/// `ngx_http_weak_etag`: a strong ETag made weak, any other dropped.
fn weak_etag(h: &mut HeaderMap) {
    let Some(e) = h.get(header::ETAG).map(|e| e.as_bytes().to_vec()) else {
        return;
    };
    if e.len() > 2 && e.starts_with(b"W/") {
        return;
    }
    if !e.starts_with(b"\"") {
        h.remove(header::ETAG);
        return;
    }
    let mut weak = b"W/".to_vec();
    weak.extend_from_slice(&e);
    match HeaderValue::from_bytes(&weak) {
        Ok(v) => {
            h.insert(header::ETAG, v);
        }
        Err(_) => {
            h.remove(header::ETAG);
        }
    }
}

/// A body compressed as it streams.
struct Gzipped {
    inner: UpBody,
    /// None once finished.
    enc: Option<GzEncoder<Vec<u8>>>,
}

impl Body for Gzipped {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        loop {
            if self.enc.is_none() {
                return Poll::Ready(None);
            }
            match Pin::new(&mut self.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(Some(Ok(frame))) => {
                    let Ok(data) = frame.into_data() else {
                        // Trailers are not sent after a compressed body.
                        continue;
                    };
                    let Some(enc) = self.enc.as_mut() else {
                        return Poll::Ready(None);
                    };
                    if let Err(e) = enc.write_all(&data).and_then(|()| enc.flush()) {
                        return Poll::Ready(Some(Err(Box::new(e))));
                    }
                    let out = std::mem::take(enc.get_mut());
                    if !out.is_empty() {
                        return Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))));
                    }
                }
                Poll::Ready(None) => {
                    let Some(enc) = self.enc.take() else {
                        return Poll::Ready(None);
                    };
                    return match enc.finish() {
                        Ok(out) => Poll::Ready(Some(Ok(Frame::data(Bytes::from(out))))),
                        Err(e) => Poll::Ready(Some(Err(Box::new(e)))),
                    };
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.enc.is_none()
    }
}

#[cfg(test)]
mod tests;
