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
use line::{atoof, invalid_name, parse_header_line};

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

/// The lengths of the [`UNIQUE`] names, as bits: a name of another length
/// is none of them (one test, where most fields are not).
const UNIQUE_LENGTHS: u64 = {
    let mut bits = 0u64;
    let mut i = 0;
    while i < UNIQUE.len() {
        bits |= 1 << UNIQUE[i].len();
        i += 1;
    }
    bits
};

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
pub(crate) enum ClientFraming {
    /// No body: the next head follows.
    None,
    /// `Content-Length: N`.
    Length(u64),
    /// `Transfer-Encoding: chunked`: the loop's decoder finds the body's
    /// end, and the next head follows (as in nginx).
    Chunked,
    /// An upgrade request: the response closes the connection unless it
    /// is a tunnel.
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
        framing: ClientFraming,
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
    /// The first look was taken ([`first_look`](Self::first_look)).
    looked: bool,
}

/// The special headers met so far (`r->headers_in`).
#[derive(Debug, Default)]
struct Seen {
    unique: u16,
    /// Where the values of `Content-Length` and `Transfer-Encoding` are in
    /// the buffer, as nginx trims them.
    content_length: Option<(usize, usize)>,
    transfer_encoding: Option<(usize, usize)>,
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
            looked: false,
        }
    }

    /// The limits the scan reads under.
    pub(crate) fn limits(&self) -> HeadLimits {
        self.limits
    }

    /// True the first time it is asked of a scan (of each head): whether a
    /// head may be read at once ([`accepts_parsed`](Self::accepts_parsed))
    /// before it is scanned line by line. Asked once, so that a head sent
    /// in many pieces is not parsed whole again at each.
    pub(crate) fn first_look(&mut self) -> bool {
        !std::mem::replace(&mut self.looked, true)
    }

    /// Scan what `buf` (the head so far, from its first byte) adds.
    pub(crate) fn feed(&mut self, buf: &[u8]) -> Step {
        loop {
            let rest = &buf[self.next..];
            let lf = match line_end(rest, self.start.is_none()) {
                LineEnd::At(lf) => lf,
                // The line so far must still fit in nginx's buffers.
                LineEnd::More => {
                    return match self.fits(rest.len()) {
                        Ok(()) => Step::More,
                        Err(status) => Step::Refuse(status),
                    }
                }
                // nginx's parser stops at the byte after the CR: 400, at
                // once (unless the line had outgrown its buffer by then).
                LineEnd::BareCr(at) => {
                    return Step::Refuse(match self.fits(at + 2) {
                        Ok(()) => StatusCode::BAD_REQUEST,
                        Err(status) => status,
                    })
                }
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

    /// The gate's word on a head `httparse` read whole from the start of
    /// `buf` (`len` bytes, with these fields), without scanning it line by
    /// line again: `Some(framing)` where [`feed`](Self::feed) would accept
    /// the head as it is (`Step::Done` at `len`, nothing rewritten); `None`
    /// where it might refuse or rewrite it, or the head starts with empty
    /// lines, for `feed` to decide.
    ///
    /// What `httparse` accepted already holds to what `feed` checks of
    /// each line's syntax (a method, a target and `HTTP/1.0` or `1.1`;
    /// names are tokens and end at a colon, values have no NUL or bare CR,
    /// lines end in LF or CRLF); the rest is checked here with `feed`'s own
    /// code: the buffers each line takes, the method's letters, nginx's
    /// name rule, the unique and framing fields.
    pub(crate) fn accepts_parsed(
        limits: HeadLimits,
        buf: &[u8],
        len: usize,
        req: &httparse::Request<'_, '_>,
    ) -> Option<ClientFraming> {
        let fields = &*req.headers;
        let head = buf.get(..len)?;
        if matches!(head.first(), None | Some(b'\r' | b'\n')) {
            return None;
        }
        // The blank line that ends the head (CRLF or a bare LF).
        let blank = if head.get(len.checked_sub(2)?) == Some(&b'\r') {
            len - 2
        } else {
            len - 1
        };
        let base = head.as_ptr() as usize;
        // Where a field's line starts: its name starts it.
        let start = |h: &httparse::Header<'_>| (h.name.as_ptr() as usize).wrapping_sub(base);
        let mut scan = Self::new(limits);
        let first_end = fields.first().map_or(blank, start);
        scan.account(first_end)?;
        scan.start = Some(0);
        // The request line as `request_line` reads it: httparse took the
        // method to the first space and the version as HTTP/1.0 or 1.1.
        scan.method(req.method?.as_bytes()).ok()?;
        scan.http10 = req.version? == 0;
        for (i, h) in fields.iter().enumerate() {
            let at = start(h);
            let text = head.get(at..fields.get(i + 1).map_or(blank, start))?;
            scan.account(text.len())?;
            let name = h.name.as_bytes();
            if invalid_name(name, limits.underscores) {
                return None;
            }
            // nginx trims a value of spaces only, httparse of tabs too: the
            // values nginx reads are taken as nginx takes them.
            let value = if Seen::reads_value(name) {
                let v = parse_header_line(text, limits.underscores)?.value;
                let from = at + (v.as_ptr() as usize - text.as_ptr() as usize);
                (from, from + v.len())
            } else {
                (0, 0)
            };
            scan.seen.note(name, value).ok()?;
        }
        scan.account(len - blank)?;
        scan.seen.framing(head, scan.http10).ok()
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

    /// A whole line of `len` bytes, accounted where it fits; None where
    /// it does not.
    fn account(&mut self, len: usize) -> Option<()> {
        self.fits(len).ok()?;
        self.take(len);
        Some(())
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
    /// would not: the method's letters and the major version, and a line
    /// without a version (nginx's HTTP/0.9 request, or its 400): refused
    /// at once, where waiting for header lines would wait for ever.
    /// Anything else malformed is left to hyper (a 400 either way).
    fn request_line(&mut self, line: &[u8]) -> Result<(), StatusCode> {
        let line = line.strip_suffix(b"\n").unwrap_or(line);
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let method_end = line.iter().position(|&b| b == b' ').unwrap_or(line.len());
        self.method(&line[..method_end])?;
        // (nginx allows spaces after the version.)
        let end = line.iter().rposition(|&b| b != b' ').map_or(0, |p| p + 1);
        let version = line[method_end..end]
            .rsplit(|&b| b == b' ')
            .next()
            .unwrap_or_default();
        let Some(v) = version.strip_prefix(b"HTTP/") else {
            return Err(StatusCode::BAD_REQUEST);
        };
        let major = v.split(|&b| b == b'.').next().unwrap_or_default();
        let digits = !major.is_empty() && major.iter().all(u8::is_ascii_digit);
        if digits && major.first() != Some(&b'0') && major != b"1" {
            return Err(StatusCode::HTTP_VERSION_NOT_SUPPORTED);
        }
        self.http10 = v.starts_with(b"1.") && v.get(2) == Some(&b'0') && v.len() == 3;
        if v == b"0.9" {
            self.http10 = true;
        }
        Ok(())
    }

    /// The request line's method: nginx's letters (`A`-`Z`, `_`, `-`).
    fn method(&mut self, method: &[u8]) -> Result<(), StatusCode> {
        if method.is_empty()
            || !method
                .iter()
                .all(|&b| b.is_ascii_uppercase() || b == b'_' || b == b'-')
        {
            return Err(StatusCode::BAD_REQUEST);
        }
        self.seen.refused_method = method == b"CONNECT" || method == b"TRACE";
        Ok(())
    }

    /// One header line (at `at` in the buffer): cut it if its name is
    /// invalid and nginx ignores such lines, refuse the head where nginx does.
    fn header_line(&mut self, at: usize, line: &[u8]) -> Result<(), StatusCode> {
        let h = parse_header_line(line, self.limits.underscores).ok_or(StatusCode::BAD_REQUEST)?;
        if h.invalid && self.limits.ignore_invalid {
            self.cut.push((at, at + line.len()));
            return Ok(());
        }
        if !h.has_colon {
            self.no_colon.push(at + h.name.len());
        }
        let value = at + (h.value.as_ptr() as usize - line.as_ptr() as usize);
        self.seen.note(h.name, (value, value + h.value.len()))
    }

    /// The whole head is in: `ngx_http_process_request_header`'s checks.
    fn done(&mut self, buf: &[u8]) -> Step {
        let end = self.next;
        let framing = match self.seen.framing(buf, self.http10) {
            Ok(framing) => framing,
            Err(status) => return Step::Refuse(status),
        };
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

/// Where a line of the head ends, as nginx's parsers find its end.
#[derive(Debug, PartialEq, Eq)]
enum LineEnd {
    /// At this LF.
    At(usize),
    /// Not in the bytes so far.
    More,
    /// A CR at this offset is followed by a byte nginx refuses there.
    BareCr(usize),
}

/// The end of the line at the start of `rest`: its LF, found with the CRs
/// (one pass, where the line ends are looked for anyway). A CR must be
/// followed by LF in the request line (`ngx_http_parse_request_line`'s
/// `sw_almost_done`), by more CRs and then LF in a header line
/// (`ngx_http_parse_header_line`'s); nginx refuses anything else as soon
/// as it comes, where waiting for an LF would wait for ever.
fn line_end(rest: &[u8], request_line: bool) -> LineEnd {
    let mut from = 0;
    loop {
        let Some(i) = memchr::memchr2(b'\r', b'\n', &rest[from..]) else {
            return LineEnd::More;
        };
        let at = from + i;
        if rest[at] == b'\n' {
            return LineEnd::At(at);
        }
        match rest.get(at + 1) {
            None => return LineEnd::More,
            Some(b'\n') => return LineEnd::At(at + 1),
            Some(b'\r') if !request_line => from = at + 1,
            Some(_) => return LineEnd::BareCr(at),
        }
    }
}

// === impl Seen ===

impl Seen {
    /// A kept header line: `name`, and where its value (as nginx trims it)
    /// is in the buffer.
    fn note(&mut self, name: &[u8], value: (usize, usize)) -> Result<(), StatusCode> {
        let maybe_unique = name.len() < 64 && UNIQUE_LENGTHS & (1 << name.len()) != 0;
        if let Some(i) = maybe_unique
            .then(|| UNIQUE.iter().position(|u| u.eq_ignore_ascii_case(name)))
            .flatten()
        {
            let bit = 1u16 << i;
            if self.unique & bit != 0 {
                return Err(StatusCode::BAD_REQUEST);
            }
            self.unique |= bit;
        }
        if name.eq_ignore_ascii_case(b"content-length") {
            self.content_length = Some(value);
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            self.transfer_encoding = Some(value);
        } else if name.eq_ignore_ascii_case(b"upgrade") {
            self.upgrade = true;
        }
        Ok(())
    }

    /// Whether nginx needs a header's value: it reads `Content-Length`'s
    /// and `Transfer-Encoding`'s.
    fn reads_value(name: &[u8]) -> bool {
        name.eq_ignore_ascii_case(b"content-length")
            || name.eq_ignore_ascii_case(b"transfer-encoding")
    }

    /// The head is whole (its values in `buf`): its framing, or nginx's
    /// status for it.
    fn framing(&self, buf: &[u8], http10: bool) -> Result<ClientFraming, StatusCode> {
        let value = |(from, to): (usize, usize)| buf.get(from..to).unwrap_or_default();
        // HTTP/1.1 without Host (bit 0 of `unique`).
        if !http10 && self.unique & 1 == 0 {
            return Err(StatusCode::BAD_REQUEST);
        }
        let length = match self.content_length {
            None => None,
            Some(v) => Some(atoof(value(v)).ok_or(StatusCode::BAD_REQUEST)?),
        };
        let mut framing = length.map_or(ClientFraming::None, ClientFraming::Length);
        if let Some(te) = self.transfer_encoding {
            if http10 {
                return Err(StatusCode::BAD_REQUEST);
            }
            if !value(te).eq_ignore_ascii_case(b"chunked") {
                return Err(StatusCode::NOT_IMPLEMENTED);
            }
            if length.is_some() {
                return Err(StatusCode::BAD_REQUEST);
            }
            framing = ClientFraming::Chunked;
        }
        if self.refused_method {
            return Err(StatusCode::METHOD_NOT_ALLOWED);
        }
        if self.upgrade {
            framing = ClientFraming::Opaque;
        }
        Ok(framing)
    }
}

#[cfg(test)]
mod tests;
