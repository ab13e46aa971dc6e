//! A file's answer (ngx_http_static_handler) through the header filters
//! that judge it: not_modified (412, 304), then range (206, 416, or the
//! whole file with `Accept-Ranges`).

use std::fs::File;
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Response, StatusCode};
use http_body_util::BodyExt;

use super::body::{read_at, FileBody, Piece, SMALL};
use super::path::FileName;
use super::range::{self, ByteRange, Ranges};
use super::{errno, is, outside, who, Files};
use crate::nginx::status_page::error_page;
use crate::nginx::vars::VarContext;
use crate::wire::payload::{self, UpBody};
use vigil_core::config::IfModifiedSince;

/// What the not_modified and range filters see of a file.
struct Meta<'a> {
    size: u64,
    mtime: i64,
    etag: Option<&'a str>,
}

/// ngx_http_static_handler for `uri` (not ending in `/`).
pub(super) fn file(
    files: &Files,
    cx: &VarContext<'_>,
    uri: &[u8],
    add_uri_to_alias: bool,
) -> Response<UpBody> {
    let name = files.file_name(cx, uri, add_uri_to_alias);
    if !name.is_safe() {
        return outside(&name, cx);
    }
    let opened = std::fs::OpenOptions::new()
        .read(true)
        // A FIFO must not block the worker (nginx opens with O_NONBLOCK too).
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
        .open(name.path());
    let f = match opened {
        Ok(f) => f,
        Err(e) => return open_failed(files, &name, &e, cx),
    };
    let meta = match f.metadata() {
        Ok(m) => m,
        Err(e) => {
            tracing::error!(
                "fstat() \"{}\" failed {}{}",
                name.display(),
                errno(&e),
                who(cx)
            );
            return error_page(StatusCode::INTERNAL_SERVER_ERROR);
        }
    };
    if meta.is_dir() {
        return to_directory(cx, uri);
    }
    if !meta.is_file() {
        tracing::error!("\"{}\" is not a regular file{}", name.display(), who(cx));
        return error_page(StatusCode::NOT_FOUND);
    }
    if cx.parts.method == Method::POST {
        return error_page(StatusCode::METHOD_NOT_ALLOWED);
    }
    let etag = files
        .settings
        .etag
        .then(|| format!("\"{:x}-{:x}\"", meta.mtime(), meta.len()));
    let m = Meta {
        size: meta.len(),
        mtime: meta.mtime(),
        etag: etag.as_deref(),
    };
    let mut head = HeaderMap::new();
    head.insert(header::CONTENT_TYPE, content_type(files, uri));
    head.insert(header::LAST_MODIFIED, http_time(m.mtime));
    if let Some(e) = m.etag.and_then(|e| HeaderValue::from_str(e).ok()) {
        head.insert(header::ETAG, e);
    }
    let req = &cx.parts.headers;
    // An error_page's file is answered whole, with the error's status.
    let paged = cx
        .parts
        .extensions
        .get::<crate::nginx::error_page::Paged>()
        .is_some();
    let judged = if paged {
        None
    } else {
        not_modified(files, req, &m)
    };
    if let Some(status) = judged {
        if status == StatusCode::PRECONDITION_FAILED {
            return error_page(status);
        }
        head.remove(header::CONTENT_TYPE);
        let mut r = Response::new(payload::empty());
        *r.status_mut() = status;
        *r.headers_mut() = head;
        return r;
    }
    let max = files.settings.max_ranges.map_or(i32::MAX as u32, |n| n);
    let ranges = match req.get(header::RANGE).filter(|_| !paged) {
        Some(v)
            if max != 0 && v.len() >= 7 && v.as_bytes()[..6].eq_ignore_ascii_case(b"bytes=") =>
        {
            if if_range_holds(req, &m) {
                range::parse(&v.as_bytes()[6..], m.size, max)
            } else {
                Ranges::Whole
            }
        }
        _ => Ranges::Whole,
    };
    let name: Arc<str> = Arc::from(name.display().as_ref());
    let (status, pieces) = match ranges {
        Ranges::NotSatisfiable => {
            let mut r = error_page(StatusCode::RANGE_NOT_SATISFIABLE);
            if let Ok(v) = HeaderValue::from_str(&format!("bytes */{}", m.size)) {
                r.headers_mut().insert(header::CONTENT_RANGE, v);
            }
            return r;
        }
        Ranges::Whole => {
            if max != 0 {
                head.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
            }
            let whole = Piece::File {
                offset: 0,
                len: m.size,
            };
            (StatusCode::OK, vec![whole])
        }
        Ranges::Some(rs) if rs.len() == 1 => {
            let r = rs[0];
            if let Ok(v) =
                HeaderValue::from_str(&format!("bytes {}-{}/{}", r.start, r.end - 1, m.size))
            {
                head.insert(header::CONTENT_RANGE, v);
            }
            let piece = Piece::File {
                offset: r.start,
                len: r.end - r.start,
            };
            (StatusCode::PARTIAL_CONTENT, vec![piece])
        }
        Ranges::Some(rs) => (
            StatusCode::PARTIAL_CONTENT,
            multipart(&mut head, &rs, m.size),
        ),
    };
    let len: u64 = pieces
        .iter()
        .map(|p| match p {
            Piece::Bytes(b) => b.len() as u64,
            Piece::File { len, .. } => *len,
        })
        .sum();
    head.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    let body = if cx.parts.method == Method::HEAD || len == 0 {
        payload::empty()
    } else if len <= SMALL {
        match read_now(&f, pieces) {
            Ok(b) => payload::full(b),
            Err(e) => {
                tracing::error!("read() \"{name}\" failed {}{}", errno(&e), who(cx));
                return error_page(StatusCode::INTERNAL_SERVER_ERROR);
            }
        }
    } else {
        FileBody::new(f, name, pieces).boxed()
    };
    let mut r = Response::new(body);
    *r.status_mut() = status;
    *r.headers_mut() = head;
    r
}

/// The 301 of a directory named without its `/`: to the URI with it
/// (escaped, with the arguments), absolute as nginx's header filter makes it.
fn to_directory(cx: &VarContext<'_>, uri: &[u8]) -> Response<UpBody> {
    let mut loc = String::new();
    crate::nginx::uri::escape_uri(&mut loc, uri);
    loc.push('/');
    if let Some(t) = cx.target {
        if !t.uri.args().is_empty() {
            loc.push('?');
            loc.push_str(t.uri.args());
        }
        loc.insert_str(0, &crate::nginx::router::absolute_prefix(t, cx.local));
    }
    let mut r = error_page(StatusCode::MOVED_PERMANENTLY);
    if let Ok(v) = HeaderValue::from_str(&loc) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    r
}

/// ngx_http_static_handler's answer to a failed open, logged as nginx logs it.
fn open_failed(
    files: &Files,
    name: &FileName,
    e: &io::Error,
    cx: &VarContext<'_>,
) -> Response<UpBody> {
    use rustix::io::Errno;
    let (status, log) = match e.kind() {
        io::ErrorKind::NotFound | io::ErrorKind::NotADirectory => {
            (StatusCode::NOT_FOUND, files.settings.log_not_found)
        }
        _ if is(e, Errno::NAMETOOLONG) => (StatusCode::NOT_FOUND, files.settings.log_not_found),
        io::ErrorKind::PermissionDenied => (StatusCode::FORBIDDEN, true),
        _ if is(e, Errno::LOOP) || is(e, Errno::MLINK) => (StatusCode::FORBIDDEN, true),
        _ => (StatusCode::INTERNAL_SERVER_ERROR, true),
    };
    if log {
        tracing::error!(
            "open() \"{}\" failed {}{}",
            name.display(),
            errno(e),
            who(cx)
        );
    }
    error_page(status)
}

/// The type of `uri`'s extension (ngx_http_set_exten: after the last `.`
/// of the last segment, not a leading one), else `default_type`.
fn content_type(files: &Files, uri: &[u8]) -> HeaderValue {
    let mut exten: &[u8] = b"";
    let mut i = uri.len().saturating_sub(1);
    while i > 1 {
        if uri[i] == b'.' && uri[i - 1] != b'/' {
            exten = &uri[i + 1..];
            break;
        }
        if uri[i] == b'/' {
            break;
        }
        i -= 1;
    }
    if !exten.is_empty() {
        let lower = String::from_utf8_lossy(exten).to_ascii_lowercase();
        if let Some(v) = files
            .settings
            .types
            .get(&lower)
            .and_then(|t| HeaderValue::from_str(t).ok())
        {
            return v;
        }
    }
    files.default_type.clone()
}

/// `Last-Modified`'s form of `secs` after the epoch.
pub(super) fn http_time(secs: i64) -> HeaderValue {
    let t = if secs >= 0 {
        UNIX_EPOCH + Duration::from_secs(secs.unsigned_abs())
    } else {
        UNIX_EPOCH
    };
    HeaderValue::from_str(&httpdate::fmt_http_date(t))
        .unwrap_or_else(|_| HeaderValue::from_static("Thu, 01 Jan 1970 00:00:00 GMT"))
}

/// ngx_parse_http_time: seconds after the epoch, -1 for a date it cannot read.
fn parse_time(v: &HeaderValue) -> i64 {
    v.to_str()
        .ok()
        .and_then(|s| httpdate::parse_http_date(s).ok())
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .and_then(|d| i64::try_from(d.as_secs()).ok())
        .unwrap_or(-1)
}

/// ngx_http_not_modified_header_filter: 412, 304, or None (200 stands).
fn not_modified(files: &Files, req: &HeaderMap, m: &Meta<'_>) -> Option<StatusCode> {
    if let Some(v) = req.get(header::IF_UNMODIFIED_SINCE) {
        if parse_time(v) < m.mtime {
            return Some(StatusCode::PRECONDITION_FAILED);
        }
    }
    if let Some(v) = req.get(header::IF_MATCH) {
        if !if_match(v.as_bytes(), m.etag, false) {
            return Some(StatusCode::PRECONDITION_FAILED);
        }
    }
    let ims = req.get(header::IF_MODIFIED_SINCE);
    let inm = req.get(header::IF_NONE_MATCH);
    if ims.is_none() && inm.is_none() {
        return None;
    }
    if let Some(v) = ims {
        let modified = match files.settings.if_modified_since {
            IfModifiedSince::Off => true,
            mode => {
                let t = parse_time(v);
                t != m.mtime && (mode == IfModifiedSince::Exact || t < m.mtime)
            }
        };
        if modified {
            return None;
        }
    }
    if let Some(v) = inm {
        if !if_match(v.as_bytes(), m.etag, true) {
            return None;
        }
    }
    Some(StatusCode::NOT_MODIFIED)
}

/// ngx_http_test_if_match: whether `list` names `etag` (`*` names any;
/// `weak`: `W/` prefixes are ignored on both sides).
fn if_match(list: &[u8], etag: Option<&str>, weak: bool) -> bool {
    if list == b"*" {
        return true;
    }
    let Some(etag) = etag else {
        return false;
    };
    let mut etag = etag.as_bytes();
    if weak && etag.len() > 2 && etag.starts_with(b"W/") {
        etag = &etag[2..];
    }
    let mut p = 0usize;
    let end = list.len();
    while p < end {
        if weak && end - p > 2 && list[p..].starts_with(b"W/") {
            p += 2;
        }
        if etag.len() > end - p {
            return false;
        }
        if list[p..].starts_with(etag) {
            let mut q = p + etag.len();
            while q < end && (list[q] == b' ' || list[q] == b'\t') {
                q += 1;
            }
            if q == end || list[q] == b',' {
                return true;
            }
        }
        while p < end && list[p] != b',' {
            p += 1;
        }
        while p < end && matches!(list[p], b' ' | b'\t' | b',') {
            p += 1;
        }
    }
    false
}

/// The range filter's `If-Range`: an entity tag (ending in `"`) must be
/// the ETag exactly, a date the modification time exactly.
fn if_range_holds(req: &HeaderMap, m: &Meta<'_>) -> bool {
    let Some(v) = req.get(header::IF_RANGE) else {
        return true;
    };
    let b = v.as_bytes();
    if b.len() >= 2 && b[b.len() - 1] == b'"' {
        return m.etag.is_some_and(|e| e.as_bytes() == b);
    }
    parse_time(v) == m.mtime
}

/// ngx_http_range_multipart_header: the parts' pieces, the type and
/// length in `head`.
fn multipart(head: &mut HeaderMap, rs: &[ByteRange], size: u64) -> Vec<Piece> {
    let boundary = range::boundary();
    let part_type = head
        .get(header::CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .filter(|t| !t.is_empty());
    let part_head = match &part_type {
        Some(t) => format!("\r\n--{boundary}\r\nContent-Type: {t}\r\nContent-Range: bytes "),
        None => format!("\r\n--{boundary}\r\nContent-Range: bytes "),
    };
    let mut pieces = Vec::with_capacity(rs.len() * 2 + 1);
    for r in rs {
        let text = format!("{part_head}{}-{}/{size}\r\n\r\n", r.start, r.end - 1);
        pieces.push(Piece::Bytes(Bytes::from(text)));
        pieces.push(Piece::File {
            offset: r.start,
            len: r.end - r.start,
        });
    }
    pieces.push(Piece::Bytes(Bytes::from(format!("\r\n--{boundary}--\r\n"))));
    if let Ok(v) = HeaderValue::from_str(&format!("multipart/byteranges; boundary={boundary}")) {
        head.insert(header::CONTENT_TYPE, v);
    }
    pieces
}

/// The pieces read at once (a small answer).
fn read_now(f: &File, pieces: Vec<Piece>) -> io::Result<Bytes> {
    if let [Piece::File { offset, len }] = pieces[..] {
        return read_at(f, offset, len);
    }
    let mut out = Vec::new();
    for p in pieces {
        match p {
            Piece::Bytes(b) => out.extend_from_slice(&b),
            Piece::File { offset, len } => out.extend_from_slice(&read_at(f, offset, len)?),
        }
    }
    Ok(Bytes::from(out))
}

/// `expires` on an answer of `status` (ngx_http_set_expires; only the
/// statuses nginx's headers filter calls safe), `mtime` the file's
/// modification time when the answer is a file's.
pub(crate) fn expires(
    e: vigil_core::config::Expires,
    resp: &mut Response<UpBody>,
    now: SystemTime,
) {
    use vigil_core::config::Expires;
    if e == Expires::Off
        || !matches!(
            resp.status().as_u16(),
            200 | 201 | 204 | 206 | 301 | 302 | 303 | 304 | 307 | 308
        )
    {
        return;
    }
    let now_secs = now
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    let mtime = resp
        .headers()
        .get(header::LAST_MODIFIED)
        .map(parse_time)
        .filter(|t| *t >= 0);
    let (when, cc): (HeaderValue, String) = match e {
        Expires::Off => return,
        Expires::Epoch => (
            HeaderValue::from_static("Thu, 01 Jan 1970 00:00:01 GMT"),
            "no-cache".into(),
        ),
        Expires::Max => (
            HeaderValue::from_static("Thu, 31 Dec 2037 23:55:55 GMT"),
            "max-age=315360000".into(),
        ),
        Expires::After { seconds: 0, .. } => (http_time(now_secs), "max-age=0".into()),
        Expires::After { seconds, modified } => {
            let (at, max_age) = match (modified, mtime) {
                (true, Some(m)) => (m + seconds, m + seconds - now_secs),
                _ => (now_secs + seconds, seconds),
            };
            let cc = if seconds < 0 || max_age < 0 {
                "no-cache".to_string()
            } else {
                format!("max-age={max_age}")
            };
            (http_time(at), cc)
        }
        Expires::Daily(t) => {
            // ngx_next_time, in UTC (vigil has no time zone of its own).
            let day = now_secs - now_secs.rem_euclid(86_400);
            let mut at = day + t;
            if at <= now_secs {
                at += 86_400;
            }
            let max_age = at - now_secs;
            (http_time(at), format!("max-age={max_age}"))
        }
    };
    let h = resp.headers_mut();
    h.insert(header::EXPIRES, when);
    if let Ok(v) = HeaderValue::from_str(&cc) {
        h.insert(header::CACHE_CONTROL, v);
    }
}

#[cfg(test)]
mod tests {
    use super::if_match;

    #[test]
    fn if_match_lists() {
        let e = Some("\"5f-a\"");
        assert!(if_match(b"\"5f-a\"", e, false));
        assert!(if_match(b"\"x\", \"5f-a\"", e, false));
        assert!(if_match(b"*", None, false));
        assert!(!if_match(b"\"5f-b\"", e, false));
        assert!(!if_match(b"W/\"5f-a\"", e, false));
        assert!(if_match(b"W/\"5f-a\"", e, true));
        assert!(!if_match(b"\"5f-a\"", None, true));
    }
}

#[cfg(test)]
mod open_errors {
    use std::collections::HashMap;
    use std::io;

    use http::StatusCode;
    use rustix::io::Errno;

    use super::super::path::FileName;
    use super::super::Files;
    use super::open_failed;
    use crate::nginx::vars::{Scope, VarContext};

    /// The static module's status for each open() error (a test as root
    /// cannot make the file system say EACCES: the errors are made here).
    #[test]
    fn each_open_error_has_nginx_status() {
        let files = Files::build(
            &Default::default(),
            None,
            &Default::default(),
            &mut HashMap::new(),
            &Scope::default(),
            &[],
        )
        .expect("files");
        let parts = http::Request::new(()).into_parts().0;
        let cx = VarContext {
            parts: &parts,
            target: None,
            client: ([127, 0, 0, 1], 1).into(),
            local: ([127, 0, 0, 1], 2).into(),
            proxy_host: "",
            attempts: &[],
            status: 0,
            request_time: 0.0,
        };
        let name = FileName::join(b"/srv".to_vec(), b"/x");
        let status = |e: Errno| {
            open_failed(
                &files,
                &name,
                &io::Error::from_raw_os_error(e.raw_os_error()),
                &cx,
            )
            .status()
        };
        assert_eq!(status(Errno::NOENT), StatusCode::NOT_FOUND);
        assert_eq!(status(Errno::NOTDIR), StatusCode::NOT_FOUND);
        assert_eq!(status(Errno::NAMETOOLONG), StatusCode::NOT_FOUND);
        assert_eq!(status(Errno::ACCESS), StatusCode::FORBIDDEN);
        assert_eq!(status(Errno::LOOP), StatusCode::FORBIDDEN);
        assert_eq!(status(Errno::MLINK), StatusCode::FORBIDDEN);
        assert_eq!(status(Errno::IO), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(status(Errno::MFILE), StatusCode::INTERNAL_SERVER_ERROR);
    }
}
