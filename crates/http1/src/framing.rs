//! How a message's body is framed, from the framing fields of its head.

/// How a message's body ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// No body (`HEAD`, 1xx, 204, 304, `Content-Length: 0`, a request
    /// without framing fields).
    Empty,
    /// `Content-Length: n`.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Until the peer closes (a response without framing fields, or a
    /// transfer coding other than chunked last).
    Close,
}

/// Why a response's framing fields frame nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FramingError {
    /// `Transfer-Encoding` in an HTTP/1.0 response.
    TransferEncodingInHttp10,
    /// A `Content-Length` that is not digits, or two that disagree.
    InvalidContentLength,
}

impl std::fmt::Display for FramingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FramingError::TransferEncodingInHttp10 => "HTTP/1.0 response with Transfer-Encoding",
            FramingError::InvalidContentLength => "invalid Content-Length",
        })
    }
}

impl std::error::Error for FramingError {}

/// The framing fields of a head (`Transfer-Encoding`, `Content-Length`),
/// told line by line by its reader as it meets them, so framing looks
/// nothing up again.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Framed {
    te: bool,
    cl: bool,
    /// The last `Transfer-Encoding` line's last coding is `chunked`.
    chunked: bool,
    /// Its `Content-Length` lines, as [`Length`] reads them.
    length: Length,
}

/// `Content-Length` lines taken in order: every value (also
/// comma-separated ones) digits, and all of them agreeing (hyper's
/// `content_length_parse_all`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Length {
    /// No line yet.
    #[default]
    Absent,
    Is(u64),
    /// A value that is not digits, or two that disagree.
    Bad,
}

impl Framed {
    /// A `Transfer-Encoding` line with `value`.
    pub fn transfer_encoding(&mut self, value: &[u8]) {
        self.te = true;
        self.chunked = last_token_is_chunked(value);
    }

    /// A `Content-Length` line with `value`.
    pub fn content_length(&mut self, value: &[u8]) {
        self.cl = true;
        self.length = self.length.line(value);
    }

    /// Whether a `Transfer-Encoding` line came.
    pub fn has_transfer_encoding(&self) -> bool {
        self.te
    }

    /// Whether a `Content-Length` line came.
    pub fn has_content_length(&self) -> bool {
        self.cl
    }

    /// The `Content-Length` the lines agree on.
    pub fn length(&self) -> Option<u64> {
        match self.length {
            Length::Is(n) => Some(n),
            Length::Absent | Length::Bad => None,
        }
    }

    /// How a response with `status` to a request (`head`: a `HEAD`;
    /// `connect`: a `CONNECT`) is framed, and whether its connection
    /// switches protocols (101, or a 2xx to `CONNECT`): RFC 9112 §6.3, as
    /// hyper's client reads it. Transfer-Encoding overrides Content-Length.
    pub fn response(
        &self,
        status: u16,
        head: bool,
        connect: bool,
        http10: bool,
    ) -> Result<(Framing, bool), FramingError> {
        match status {
            101 => return Ok((Framing::Empty, true)),
            100..=199 | 204 | 304 => return Ok((Framing::Empty, false)),
            _ => {}
        }
        if head {
            return Ok((Framing::Empty, false));
        }
        if connect && (200..300).contains(&status) {
            return Ok((Framing::Empty, true));
        }
        if self.te {
            if http10 {
                return Err(FramingError::TransferEncodingInHttp10);
            }
            let f = if self.chunked {
                Framing::Chunked
            } else {
                Framing::Close
            };
            return Ok((f, false));
        }
        if !self.cl {
            return Ok((Framing::Close, false));
        }
        match self.length() {
            Some(0) => Ok((Framing::Empty, false)),
            Some(n) => Ok((Framing::Length(n), false)),
            None => Err(FramingError::InvalidContentLength),
        }
    }
}

impl Length {
    /// The lines so far and one with `value`.
    fn line(self, value: &[u8]) -> Self {
        if self == Length::Bad {
            return self;
        }
        let Some(tokens) = tokens_in(value) else {
            return Length::Bad;
        };
        let mut now = self;
        for v in tokens {
            now = match (from_digits(v), now) {
                (Some(n), Length::Absent) => Length::Is(n),
                (Some(n), Length::Is(m)) if m == n => now,
                _ => return Length::Bad,
            };
        }
        now
    }
}

/// Whether the last coding of a `Transfer-Encoding` value is `chunked`.
pub fn last_token_is_chunked(v: &[u8]) -> bool {
    std::str::from_utf8(v).is_ok_and(|s| {
        s.rsplit(',')
            .next()
            .is_some_and(|t| t.trim().eq_ignore_ascii_case("chunked"))
    })
}

/// The comma-separated tokens of a value, trimmed, as
/// `value.to_str()?.split(',').map(str::trim)` gives them: None for a
/// value that is not visible ASCII, where spaces and tabs are all the
/// whitespace `str::trim` could take off a token.
pub fn tokens_in(b: &[u8]) -> Option<impl Iterator<Item = &[u8]>> {
    b.iter()
        .all(|&c| c == b'\t' || (0x20..0x7f).contains(&c))
        .then(|| b.split(|&c| c == b',').map(<[u8]>::trim_ascii))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(fields: &[(&str, &str)]) -> Framed {
        let mut f = Framed::default();
        for (name, value) in fields {
            match *name {
                "transfer-encoding" => f.transfer_encoding(value.as_bytes()),
                "content-length" => f.content_length(value.as_bytes()),
                _ => {}
            }
        }
        f
    }

    #[test]
    fn responses_are_framed_as_rfc_9112_says() {
        let none = framed(&[]);
        assert_eq!(
            none.response(200, false, false, false),
            Ok((Framing::Close, false))
        );
        assert_eq!(
            none.response(204, false, false, false),
            Ok((Framing::Empty, false))
        );
        assert_eq!(
            none.response(304, false, false, false),
            Ok((Framing::Empty, false))
        );
        assert_eq!(
            none.response(101, false, false, false),
            Ok((Framing::Empty, true))
        );
        assert_eq!(
            none.response(200, false, true, false),
            Ok((Framing::Empty, true))
        );
        let cl = framed(&[("content-length", "5")]);
        assert_eq!(
            cl.response(200, false, false, false),
            Ok((Framing::Length(5), false))
        );
        assert_eq!(
            cl.response(200, true, false, false),
            Ok((Framing::Empty, false))
        );
        let zero = framed(&[("content-length", "0")]);
        assert_eq!(
            zero.response(200, false, false, false),
            Ok((Framing::Empty, false))
        );
        let both = framed(&[
            ("content-length", "5"),
            ("transfer-encoding", "gzip, chunked"),
        ]);
        assert_eq!(
            both.response(200, false, false, false),
            Ok((Framing::Chunked, false))
        );
        let gzip = framed(&[("transfer-encoding", "chunked, gzip")]);
        assert_eq!(
            gzip.response(200, false, false, false),
            Ok((Framing::Close, false))
        );
        assert_eq!(
            both.response(200, false, false, true),
            Err(FramingError::TransferEncodingInHttp10)
        );
    }

    #[test]
    fn an_interim_status_has_no_body() {
        let cl = framed(&[("content-length", "5")]);
        for status in [100, 102, 103, 199] {
            assert_eq!(
                cl.response(status, false, false, false),
                Ok((Framing::Empty, false))
            );
        }
    }

    #[test]
    fn content_length_lines_must_be_digits_and_agree() {
        assert_eq!(framed(&[("content-length", "5, 5")]).length(), Some(5));
        assert_eq!(
            framed(&[("content-length", "5"), ("content-length", "5")]).length(),
            Some(5)
        );
        for bad in [
            &[("content-length", "5, 6")][..],
            &[("content-length", "+5")],
            &[("content-length", "")],
            &[("content-length", "5"), ("content-length", "6")],
            &[("content-length", "99999999999999999999")],
        ] {
            let f = framed(bad);
            assert_eq!(f.length(), None, "{bad:?}");
            assert_eq!(
                f.response(200, false, false, false),
                Err(FramingError::InvalidContentLength),
                "{bad:?}"
            );
        }
    }
}
