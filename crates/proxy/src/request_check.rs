//! The client's request head judged as nginx 1.22 judges it, on the raw
//! bytes, before hyper parses them: header lines and names by
//! `ngx_http_parse_header_line` (`underscores_in_headers`,
//! `ignore_invalid_headers`), the line and header limits of
//! `large_client_header_buffers` (`ngx_http_alloc_large_header_buffer`),
//! and the framing rules of `ngx_http_process_request_header`
//! (Content-Length, Transfer-Encoding, Host, unique headers). Invalid lines
//! are cut out of the head; a refused head gets nginx's status.
//!
//! The connection wrapper that runs it on every head is in
//! [`gate`](self::gate).

pub(crate) mod gate;
mod line;

pub(crate) use line::drop_invalid_headers;
use line::{atoof, parse_header_line};

use http::StatusCode;
use vigil_core::config::ClientSettings;

/// nginx's `client_header_buffer_size` default: the first buffer a request
/// head is read into, before the large buffers.
const FIRST_BUFFER: usize = 1024;

/// Headers nginx 1.22 allows once (`ngx_http_process_unique_header_line`,
/// and `Host` by `ngx_http_process_host`): a second line is a 400.
const UNIQUE: &[&[u8]] = &[
    b"host",
    b"if-modified-since",
    b"if-unmodified-since",
    b"if-match",
    b"if-none-match",
    b"content-length",
    b"content-range",
    b"if-range",
    b"transfer-encoding",
    b"expect",
    b"authorization",
];

/// The server's settings for reading a request head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct HeadLimits {
    /// `large_client_header_buffers` SIZE, bytes.
    pub(crate) buffer_size: usize,
    /// `large_client_header_buffers` NUMBER.
    pub(crate) buffers: usize,
    /// `underscores_in_headers`.
    pub(crate) underscores: bool,
    /// `ignore_invalid_headers`.
    pub(crate) ignore_invalid: bool,
}

/// How the body after an accepted head is framed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Framing {
    /// No body: the next head follows.
    None,
    /// `Content-Length: N`.
    Length(u64),
    /// `Transfer-Encoding: chunked`, or an upgrade request: the gate stops
    /// reading heads on this connection and the response closes it.
    Opaque,
}

/// The gate's word on one request, for the handler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Verdict {
    /// Refused with this status (the handler answers it and closes).
    pub(crate) refuse: Option<StatusCode>,
    /// The gate reads no more heads on this connection: the response
    /// must close it (unless it becomes a tunnel).
    pub(crate) close: bool,
}

/// What one step of scanning found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// The head is not complete yet.
    More,
    /// The head is refused with this status.
    Refuse(StatusCode),
    /// The head is complete at `end` (just past its blank line) and
    /// accepted; `rewritten` replaces `buf[..end]` when lines were cut.
    Done {
        end: usize,
        rewritten: Option<Vec<u8>>,
        framing: Framing,
    },
}

/// One request head being read, line by line as bytes arrive.
#[derive(Debug)]
pub(crate) struct HeadScan {
    limits: HeadLimits,
    /// Where the next unscanned line starts.
    next: usize,
    /// Where the request line starts (leading empty lines skipped).
    start: Option<usize>,
    /// nginx's header buffers: room left in the current one, and how many
    /// large ones are taken.
    room: usize,
    busy: usize,
    http10: bool,
    /// Byte ranges of header lines to cut (invalid names), and of lines
    /// without a colon (kept with one added).
    cut: Vec<(usize, usize)>,
    no_colon: Vec<usize>,
    seen: Seen,
}

/// The special headers met so far (`r->headers_in`).
#[derive(Debug, Default)]
struct Seen {
    unique: u16,
    content_length: Option<Vec<u8>>,
    transfer_encoding: Option<Vec<u8>>,
    upgrade: bool,
    /// CONNECT or TRACE (nginx refuses both).
    refused_method: bool,
}

// === impl HeadLimits ===

impl HeadLimits {
    /// The limits of a server block.
    pub(crate) fn of(client: &ClientSettings) -> Self {
        Self {
            buffer_size: usize::try_from(client.header_buffer_size).unwrap_or(usize::MAX),
            buffers: usize::try_from(client.header_buffers).unwrap_or(usize::MAX),
            underscores: client.underscores_in_headers,
            ignore_invalid: client.ignore_invalid_headers,
        }
    }

    /// The most bytes an accepted head can take.
    pub(crate) fn max_head(&self) -> usize {
        FIRST_BUFFER.saturating_add(self.buffer_size.saturating_mul(self.buffers))
    }
}

impl Default for HeadLimits {
    fn default() -> Self {
        Self::of(&ClientSettings::default())
    }
}

// === impl HeadScan ===

impl HeadScan {
    /// A scan of a head that starts at offset 0 of the buffer.
    pub(crate) fn new(limits: HeadLimits) -> Self {
        Self {
            limits,
            next: 0,
            start: None,
            room: FIRST_BUFFER,
            busy: 0,
            http10: false,
            cut: Vec::new(),
            no_colon: Vec::new(),
            seen: Seen::default(),
        }
    }

    /// Scan what `buf` (the head so far, from its first byte) adds.
    pub(crate) fn feed(&mut self, buf: &[u8]) -> Step {
        loop {
            let rest = &buf[self.next..];
            let Some(lf) = memchr::memchr(b'\n', rest) else {
                // The line so far must still fit in nginx's buffers.
                return match self.fits(rest.len()) {
                    Ok(()) => Step::More,
                    Err(status) => Step::Refuse(status),
                };
            };
            let line = &rest[..=lf];
            let at = self.next;
            self.next += line.len();
            if self.start.is_none() && (line == b"\n" || line == b"\r\n") {
                // nginx skips empty lines before the request line.
                continue;
            }
            if let Err(status) = self.fits(line.len()) {
                return Step::Refuse(status);
            }
            self.take(line.len());
            if self.start.is_none() {
                self.start = Some(at);
                if let Err(status) = self.request_line(line) {
                    return Step::Refuse(status);
                }
                continue;
            }
            if line == b"\n" || line == b"\r\n" {
                return self.done(buf);
            }
            if let Err(status) = self.header_line(at, line) {
                return Step::Refuse(status);
            }
        }
    }

    /// Whether a line of `len` bytes (so far) fits where nginx would put
    /// it: past the room of the current buffer it moves to a new large
    /// buffer, which must exist and hold it whole.
    fn fits(&self, len: usize) -> Result<(), StatusCode> {
        if len <= self.room {
            return Ok(());
        }
        let too_large = if self.start.is_none() {
            StatusCode::URI_TOO_LONG
        } else {
            // nginx's 494 "Request Header Or Cookie Too Large", sent as 400.
            StatusCode::BAD_REQUEST
        };
        if len > self.limits.buffer_size || self.busy >= self.limits.buffers {
            return Err(too_large);
        }
        Ok(())
    }

    /// Account a line that fits.
    fn take(&mut self, len: usize) {
        if len <= self.room {
            self.room -= len;
        } else {
            self.busy += 1;
            self.room = self.limits.buffer_size.saturating_sub(len);
        }
    }

    /// `ngx_http_parse_request_line`, as far as it decides a status vigil
    /// would not: the method's letters and the major version. Anything
    /// else malformed is left to hyper (a 400 either way).
    fn request_line(&mut self, line: &[u8]) -> Result<(), StatusCode> {
        let line = line.strip_suffix(b"\n").unwrap_or(line);
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let method_end = line.iter().position(|&b| b == b' ').unwrap_or(line.len());
        let method = &line[..method_end];
        if method.is_empty()
            || !method
                .iter()
                .all(|&b| b.is_ascii_uppercase() || b == b'_' || b == b'-')
        {
            return Err(StatusCode::BAD_REQUEST);
        }
        self.seen.refused_method = method == b"CONNECT" || method == b"TRACE";
        let version = line.rsplit(|&b| b == b' ').next().unwrap_or_default();
        if let Some(v) = version.strip_prefix(b"HTTP/") {
            let major = v.split(|&b| b == b'.').next().unwrap_or_default();
            let digits = !major.is_empty() && major.iter().all(u8::is_ascii_digit);
            if digits && major.first() != Some(&b'0') && major != b"1" {
                return Err(StatusCode::HTTP_VERSION_NOT_SUPPORTED);
            }
            self.http10 = v.starts_with(b"1.") && v.get(2) == Some(&b'0') && v.len() == 3;
            if v == b"0.9" {
                self.http10 = true;
            }
        }
        Ok(())
    }

    /// One header line: cut it if its name is invalid and nginx ignores
    /// such lines, refuse the head where nginx does.
    fn header_line(&mut self, at: usize, line: &[u8]) -> Result<(), StatusCode> {
        let h = parse_header_line(line, self.limits.underscores).ok_or(StatusCode::BAD_REQUEST)?;
        if h.invalid && self.limits.ignore_invalid {
            self.cut.push((at, at + line.len()));
            return Ok(());
        }
        if !h.has_colon {
            self.no_colon.push(at + h.name.len());
        }
        let name = h.name;
        if let Some(i) = UNIQUE.iter().position(|u| u.eq_ignore_ascii_case(name)) {
            let bit = 1u16 << i;
            if self.seen.unique & bit != 0 {
                return Err(StatusCode::BAD_REQUEST);
            }
            self.seen.unique |= bit;
        }
        if name.eq_ignore_ascii_case(b"content-length") {
            self.seen.content_length = Some(h.value.to_vec());
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            self.seen.transfer_encoding = Some(h.value.to_vec());
        } else if name.eq_ignore_ascii_case(b"upgrade") {
            self.seen.upgrade = true;
        }
        Ok(())
    }

    /// The whole head is in: `ngx_http_process_request_header`'s checks.
    fn done(&mut self, buf: &[u8]) -> Step {
        let end = self.next;
        let seen = &self.seen;
        // HTTP/1.1 without Host (bit 0 of `unique`).
        if !self.http10 && seen.unique & 1 == 0 {
            return Step::Refuse(StatusCode::BAD_REQUEST);
        }
        let length = match &seen.content_length {
            None => None,
            Some(v) => match atoof(v) {
                Some(n) => Some(n),
                None => return Step::Refuse(StatusCode::BAD_REQUEST),
            },
        };
        let mut framing = length.map_or(Framing::None, Framing::Length);
        if let Some(te) = &seen.transfer_encoding {
            if self.http10 {
                return Step::Refuse(StatusCode::BAD_REQUEST);
            }
            if !te.eq_ignore_ascii_case(b"chunked") {
                return Step::Refuse(StatusCode::NOT_IMPLEMENTED);
            }
            if length.is_some() {
                return Step::Refuse(StatusCode::BAD_REQUEST);
            }
            framing = Framing::Opaque;
        }
        if seen.refused_method {
            return Step::Refuse(StatusCode::METHOD_NOT_ALLOWED);
        }
        if seen.upgrade {
            framing = Framing::Opaque;
        }
        let rewritten =
            (!self.cut.is_empty() || !self.no_colon.is_empty()).then(|| self.rewrite(&buf[..end]));
        Step::Done {
            end,
            rewritten,
            framing,
        }
    }

    /// The head without the cut lines, with a colon after bare names.
    fn rewrite(&self, head: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(head.len());
        let mut from = 0;
        let mut cuts = self.cut.iter().peekable();
        let mut colons = self.no_colon.iter().peekable();
        loop {
            let next_cut = cuts.peek().map(|c| c.0);
            let next_colon = colons.peek().copied().copied();
            match (next_cut, next_colon) {
                (Some(c), Some(k)) if k < c => {
                    out.extend_from_slice(&head[from..k]);
                    out.push(b':');
                    from = k;
                    colons.next();
                }
                (Some(_), _) => {
                    let Some(&(s, e)) = cuts.next() else { break };
                    out.extend_from_slice(&head[from..s]);
                    from = e;
                }
                (None, Some(k)) => {
                    out.extend_from_slice(&head[from..k]);
                    out.push(b':');
                    from = k;
                    colons.next();
                }
                (None, None) => break,
            }
        }
        out.extend_from_slice(&head[from..]);
        out
    }
}

#[cfg(test)]
mod tests;
