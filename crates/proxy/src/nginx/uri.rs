//! The request URI as nginx 1.22 sees it: `ngx_http_parse_complex_uri`
//! (percent-decoding, `merge_slashes`, `.` and `..` resolved, 400 above the
//! root and for a decoded NUL) and `ngx_http_process_request_uri` (the
//! query kept apart, `$uri` / `$args` / `$request_uri`), ported state for
//! state so that locations match on exactly the bytes nginx matches on; and
//! `ngx_escape_uri(NGX_ESCAPE_URI)`, which re-escapes that URI when it goes
//! upstream.
//!
//! What nginx (on Unix) does with the awkward bytes, and so does this:
//! `\` is an ordinary byte (only Win32 builds treat it as `/`); `+` stays
//! `+`; bytes ≥ 0x80 are ordinary; `%23` (`#`), `%25` (`%`) and `%3F` (`?`)
//! decode to literal bytes that end nothing; `%2F` is a real `/` (it merges
//! and takes part in `..`); an escape that is not two hex digits is a 400;
//! a raw `#` ends the path (the fragment; hyper drops it before this code
//! sees the target).

use std::fmt;

use smallvec::SmallVec;

/// A decoded path: inline up to 32 bytes (nearly every request's), so
/// parsing one allocates nothing.
type Path = SmallVec<[u8; 32]>;

/// A request target as nginx holds it after `ngx_http_process_request_uri`.
#[derive(Clone, PartialEq, Eq)]
pub struct RequestUri {
    /// `r->uri`: decoded and normalised; may hold any byte but NUL.
    path: Path,
    /// `r->args`: the query as sent, without `?` (empty when none).
    args: String,
    /// `r->quoted_uri`: the path had a `%` escape, so it goes upstream re-escaped.
    quoted: bool,
    /// `r->unparsed_uri` when valid (`r->valid_unparsed_uri`): the target as
    /// the client sent it. None for an absolute-form target without a path
    /// (`GET http://host?x`), where nginx builds one.
    unparsed: Option<Unparsed>,
}

/// The target as sent: the request's own (shared, not copied) or a copy.
#[derive(Clone)]
enum Unparsed {
    Shared(http::uri::PathAndQuery),
    Copied(String),
}

impl Unparsed {
    fn as_str(&self) -> &str {
        match self {
            Unparsed::Shared(p) => p.as_str(),
            Unparsed::Copied(s) => s,
        }
    }
}

impl PartialEq for Unparsed {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for Unparsed {}

impl fmt::Debug for Unparsed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

/// Why nginx answers 400 to a request target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum UriError {
    /// The target is not `/...` (`*`, `host:port`, `?x` in origin form).
    #[error("request target does not start with \"/\"")]
    NotAbsolutePath,
    /// `%` not followed by two hex digits.
    #[error("invalid %-escape in the request path")]
    BadEscape,
    /// `%00` in the path.
    #[error("%00 in the request path")]
    Nul,
    /// `..` would climb above `/`.
    #[error("\"..\" above the root in the request path")]
    AboveRoot,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    Usual,
    Slash,
    Dot,
    DotDot,
    Quoted,
    QuotedSecond,
}

/// nginx's `usual[]` (Unix build): bytes that need no look in the path.
const USUAL: [u32; 8] = [
    0x0000_0000,
    0x7fff_37d6, // not: space # % + . / ?
    0xffff_ffff,
    0x7fff_ffff, // not: DEL
    0xffff_ffff,
    0xffff_ffff,
    0xffff_ffff,
    0xffff_ffff,
];

/// nginx's `NGX_ESCAPE_URI` table: escaped when a URI goes upstream.
const ESCAPE_URI: [u32; 8] = [
    0xffff_ffff, // control bytes
    0xd000_002d, // space " # % < > ?
    0x5000_0000, // \ ^
    0xb800_0001, // ` { | } DEL
    0xffff_ffff,
    0xffff_ffff,
    0xffff_ffff,
    0xffff_ffff,
];

fn in_table(table: &[u32; 8], b: u8) -> bool {
    table[usize::from(b >> 5)] & (1 << (b & 0x1f)) != 0
}

// === impl RequestUri ===

impl RequestUri {
    /// Normalise `target` (a request target's path and query, as hyper
    /// parsed it). `absolute_form`: it came from an absolute-form request
    /// line (`GET http://host?x`), where an empty path is allowed and means
    /// `/`; elsewhere a target must start with `/`.
    pub fn parse(target: &str, merge_slashes: bool, absolute_form: bool) -> Result<Self, UriError> {
        Self::parse_from(target, None, merge_slashes, absolute_form)
    }

    /// [`RequestUri::parse`] of a request's own path and query (kept as
    /// the unparsed target without a copy).
    pub(crate) fn parse_target(
        target: Option<&http::uri::PathAndQuery>,
        merge_slashes: bool,
        absolute_form: bool,
    ) -> Result<Self, UriError> {
        let text = target.map_or("", |p| p.as_str());
        Self::parse_from(text, target, merge_slashes, absolute_form)
    }

    fn parse_from(
        target: &str,
        shared: Option<&http::uri::PathAndQuery>,
        merge_slashes: bool,
        absolute_form: bool,
    ) -> Result<Self, UriError> {
        let src = target.as_bytes();
        let empty_path = absolute_form && matches!(src.first(), None | Some(b'?'));
        if !empty_path && src.first() != Some(&b'/') {
            return Err(UriError::NotAbsolutePath);
        }
        let mut uri = Self {
            path: Path::with_capacity(src.len() + 1),
            args: String::new(),
            quoted: false,
            unparsed: (!empty_path).then(|| match shared {
                Some(p) => Unparsed::Shared(p.clone()),
                None => Unparsed::Copied(target.to_string()),
            }),
        };
        if src.is_empty() {
            // `GET http://host HTTP/1.1`: nginx uses the single "/" it has.
            uri.path.push(b'/');
            uri.unparsed = Some(Unparsed::Copied("/".to_string()));
            return Ok(uri);
        }
        if let Some(args_at) = uri.complex(src, merge_slashes, empty_path)? {
            let rest = &target[args_at..];
            uri.args = rest.split('#').next().unwrap_or("").to_string();
        }
        Ok(uri)
    }

    /// `$uri`: the normalised path, matched against locations.
    pub fn path(&self) -> &[u8] {
        &self.path
    }

    /// `$args`: the query, without `?` ("" when none).
    pub fn args(&self) -> &str {
        &self.args
    }

    /// Whether the path had a `%` escape (then it goes upstream re-escaped).
    pub fn is_quoted(&self) -> bool {
        self.quoted
    }

    /// The target as the client sent it, when nginx would forward it as is.
    pub fn unparsed(&self) -> Option<&str> {
        self.unparsed.as_ref().map(Unparsed::as_str)
    }

    /// The URI after a `rewrite` (or `set $args`): the new path (taken as
    /// is, not decoded again) and arguments. A changed path is no longer
    /// the client's target.
    pub(crate) fn rewrite(&mut self, path: Vec<u8>, args: String) {
        if path[..] != self.path[..] {
            self.unparsed = None;
        }
        self.path = Path::from_vec(path);
        self.args = args;
    }

    /// `ngx_http_parse_complex_uri`, state for state; the index where the
    /// query starts, if there is one. (Long: one match arm per nginx state,
    /// kept in nginx's order so the two read side by side; split, the
    /// states would lose their one loop.)
    fn complex(
        &mut self,
        src: &[u8],
        merge_slashes: bool,
        empty_path: bool,
    ) -> Result<Option<usize>, UriError> {
        let u = &mut self.path;
        if empty_path {
            u.push(b'/');
        }
        let mut state = State::Usual;
        let mut quoted_state = State::Usual;
        let mut decoded = 0u8;
        // `p` is nginx's pointer: the index of the byte after `ch`. Past the
        // end it reads a terminator that the loop never looks at.
        let at = |i: usize| src.get(i).copied().unwrap_or(b'\n');
        let mut ch = at(0);
        let mut p = 1usize;
        while p <= src.len() {
            match state {
                State::Usual => {
                    if in_table(&USUAL, ch) {
                        u.push(ch);
                    } else {
                        match ch {
                            b'/' => {
                                state = State::Slash;
                                u.push(ch);
                            }
                            b'%' => {
                                quoted_state = state;
                                state = State::Quoted;
                            }
                            b'?' => return Ok(Some(p)),
                            b'#' => return Ok(None),
                            _ => u.push(ch),
                        }
                    }
                    ch = at(p);
                    p += 1;
                }
                State::Slash => {
                    if in_table(&USUAL, ch) {
                        state = State::Usual;
                        u.push(ch);
                    } else {
                        match ch {
                            b'/' => {
                                if !merge_slashes {
                                    u.push(ch);
                                }
                            }
                            b'.' => {
                                state = State::Dot;
                                u.push(ch);
                            }
                            b'%' => {
                                quoted_state = state;
                                state = State::Quoted;
                            }
                            b'?' => return Ok(Some(p)),
                            b'#' => return Ok(None),
                            _ => {
                                state = State::Usual;
                                u.push(ch);
                            }
                        }
                    }
                    ch = at(p);
                    p += 1;
                }
                State::Dot => {
                    if in_table(&USUAL, ch) {
                        state = State::Usual;
                        u.push(ch);
                    } else {
                        match ch {
                            b'/' => {
                                state = State::Slash;
                                u.pop();
                            }
                            b'.' => {
                                state = State::DotDot;
                                u.push(ch);
                            }
                            b'%' => {
                                quoted_state = state;
                                state = State::Quoted;
                            }
                            b'?' => {
                                u.pop();
                                return Ok(Some(p));
                            }
                            b'#' => {
                                u.pop();
                                return Ok(None);
                            }
                            _ => {
                                state = State::Usual;
                                u.push(ch);
                            }
                        }
                    }
                    ch = at(p);
                    p += 1;
                }
                State::DotDot => {
                    if in_table(&USUAL, ch) {
                        state = State::Usual;
                        u.push(ch);
                    } else {
                        match ch {
                            b'/' | b'?' | b'#' => {
                                up_one(u)?;
                                match ch {
                                    b'?' => return Ok(Some(p)),
                                    b'#' => return Ok(None),
                                    _ => state = State::Slash,
                                }
                            }
                            b'%' => {
                                quoted_state = state;
                                state = State::Quoted;
                            }
                            _ => {
                                state = State::Usual;
                                u.push(ch);
                            }
                        }
                    }
                    ch = at(p);
                    p += 1;
                }
                State::Quoted => {
                    self.quoted = true;
                    decoded = hex(ch).ok_or(UriError::BadEscape)?;
                    state = State::QuotedSecond;
                    ch = at(p);
                    p += 1;
                }
                State::QuotedSecond => {
                    let low = hex(ch).ok_or(UriError::BadEscape)?;
                    ch = (decoded << 4) | low;
                    match ch {
                        // Decoded, these are data: nothing ends at them.
                        b'%' | b'#' | b'?' => {
                            state = State::Usual;
                            u.push(ch);
                            ch = at(p);
                            p += 1;
                        }
                        0 => return Err(UriError::Nul),
                        // Anything else is read again in the state the
                        // escape interrupted: `%2F` is a slash, `%2E` a dot.
                        _ => state = quoted_state,
                    }
                }
            }
        }
        match state {
            State::Quoted | State::QuotedSecond => return Err(UriError::BadEscape),
            State::Dot => {
                u.pop();
            }
            State::DotDot => up_one(u)?,
            State::Usual | State::Slash => {}
        }
        Ok(None)
    }
}

impl fmt::Debug for RequestUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RequestUri")
            .field("path", &String::from_utf8_lossy(&self.path))
            .field("args", &self.args)
            .field("quoted", &self.quoted)
            .field("unparsed", &self.unparsed)
            .finish()
    }
}

/// `u` ends with `/..`: drop it and the segment before, as nginx's
/// `u -= 4` and scan back to the previous `/` do.
fn up_one(u: &mut Path) -> Result<(), UriError> {
    // u ends with "/..": the segment before starts after the slash before that.
    let before = u.len().checked_sub(3).ok_or(UriError::AboveRoot)?;
    match u[..before].iter().rposition(|&b| b == b'/') {
        Some(slash) => {
            u.truncate(slash + 1);
            Ok(())
        }
        None => Err(UriError::AboveRoot),
    }
}

fn hex(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        _ => match c | 0x20 {
            l @ b'a'..=b'f' => Some(l - b'a' + 10),
            _ => None,
        },
    }
}

/// Append `bytes` to `out` escaped as nginx's `ngx_escape_uri(...,
/// NGX_ESCAPE_URI)` does (upper-case hex); the result is ASCII.
pub fn escape_uri(out: &mut String, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &b in bytes {
        if in_table(&ESCAPE_URI, b) {
            out.push('%');
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0xf)]));
        } else {
            out.push(char::from(b));
        }
    }
}

#[cfg(test)]
mod tests;
