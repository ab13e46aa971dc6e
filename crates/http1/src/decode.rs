//! A message body decoded from the bytes read: Content-Length bytes,
//! chunked, or everything until the close.

use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue};

use crate::Framing;

/// The longest chunk-size line (with its extensions).
const SIZE_LINE_LIMIT: usize = 4096;
/// A chunked body's trailer section may take this much (hyper's default).
const TRAILERS_LIMIT: usize = 16 * 1024;
/// The most trailer fields (hyper's limit on a head's).
const MAX_TRAILERS: usize = 100;

/// A body being decoded. Fed the bytes read so far (it takes what it
/// decodes out of the reader's buffer, and leaves what follows the body:
/// the next message of a kept connection); told when the peer closed.
#[derive(Debug)]
pub struct Decoder {
    state: State,
}

#[derive(Debug)]
enum State {
    /// All of it decoded.
    Done,
    /// This many bytes still to come.
    Length(u64),
    /// Chunked, in this state.
    Chunked(Chunk),
    /// Until the peer closes.
    Close,
    /// Malformed: every call gives this again (a reader that holds an
    /// error back a turn finds it still there).
    Broken(&'static str),
}

/// Where a chunked body's decoder stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// Reading a size line.
    Size,
    /// In a chunk: bytes left.
    Data(u64),
    /// The CRLF after a chunk's data.
    DataEnd,
    /// After the last chunk: the trailer section until its empty line.
    Trailers,
}

/// One decoding step.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded {
    /// Body bytes.
    Data(Bytes),
    /// A chunked body's trailer fields (the body ended with them).
    Trailers(HeaderMap),
    /// The body ended.
    End,
}

/// The peer closed before the body's end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Premature;

impl Decoder {
    /// A decoder of a body framed by `framing`.
    pub fn new(framing: Framing) -> Self {
        let state = match framing {
            Framing::Empty | Framing::Length(0) => State::Done,
            Framing::Length(n) => State::Length(n),
            Framing::Chunked => State::Chunked(Chunk::Size),
            Framing::Close => State::Close,
        };
        Self { state }
    }

    /// Whether the body was decoded to its end.
    pub fn is_done(&self) -> bool {
        matches!(self.state, State::Done)
    }

    /// How many bytes are left, when that is known (Content-Length).
    pub fn remaining(&self) -> Option<u64> {
        match self.state {
            State::Done => Some(0),
            State::Length(n) => Some(n),
            State::Chunked(_) | State::Close | State::Broken(_) => None,
        }
    }

    /// The next step out of `buf`; None when more bytes are needed. Once
    /// the body ended every call is [`Decoded::End`]. The error says what
    /// is malformed (in a chunked body).
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Decoded>, &'static str> {
        match &mut self.state {
            State::Done => Ok(Some(Decoded::End)),
            State::Length(left) => {
                if buf.is_empty() {
                    return Ok(None);
                }
                let n = usize::try_from(*left).map_or(buf.len(), |l| l.min(buf.len()));
                *left -= n as u64;
                if *left == 0 {
                    self.state = State::Done;
                }
                Ok(Some(Decoded::Data(buf.split_to(n).freeze())))
            }
            State::Close => {
                if buf.is_empty() {
                    return Ok(None);
                }
                Ok(Some(Decoded::Data(buf.split().freeze())))
            }
            State::Chunked(chunk) => match chunked(chunk, buf) {
                Ok(step) => {
                    if matches!(step, Some(Decoded::Trailers(_) | Decoded::End)) {
                        self.state = State::Done;
                    }
                    Ok(step)
                }
                Err(what) => {
                    self.state = State::Broken(what);
                    Err(what)
                }
            },
            State::Broken(what) => Err(what),
        }
    }

    /// The peer closed (a read gave 0 bytes): the end of a body that
    /// lasts until the close, else premature.
    pub fn closed(&mut self) -> Result<(), Premature> {
        match self.state {
            State::Done => Ok(()),
            State::Close => {
                self.state = State::Done;
                Ok(())
            }
            State::Length(_) | State::Chunked(_) | State::Broken(_) => Err(Premature),
        }
    }
}

/// One step of a chunked body (`ngx_http_parse_chunked`'s rules).
fn chunked(state: &mut Chunk, buf: &mut BytesMut) -> Result<Option<Decoded>, &'static str> {
    loop {
        match *state {
            Chunk::Size => {
                let Some(lf) = buf.iter().position(|&b| b == b'\n') else {
                    if buf.len() > SIZE_LINE_LIMIT {
                        return Err("chunk size line too long");
                    }
                    return Ok(None);
                };
                if lf > SIZE_LINE_LIMIT {
                    return Err("chunk size line too long");
                }
                let size = chunk_size(&buf[..lf])?;
                buf.advance(lf + 1);
                *state = if size == 0 {
                    Chunk::Trailers
                } else {
                    Chunk::Data(size)
                };
            }
            Chunk::Data(left) => {
                if buf.is_empty() {
                    return Ok(None);
                }
                let n = usize::try_from(left).map_or(buf.len(), |l| l.min(buf.len()));
                let data = buf.split_to(n).freeze();
                let left = left - n as u64;
                *state = if left == 0 {
                    Chunk::DataEnd
                } else {
                    Chunk::Data(left)
                };
                return Ok(Some(Decoded::Data(data)));
            }
            Chunk::DataEnd => {
                match buf.first() {
                    None => return Ok(None),
                    Some(b'\n') => buf.advance(1),
                    Some(b'\r') => match buf.get(1) {
                        None => return Ok(None),
                        Some(b'\n') => buf.advance(2),
                        Some(_) => return Err("chunk data not followed by CRLF"),
                    },
                    Some(_) => return Err("chunk data not followed by CRLF"),
                }
                *state = Chunk::Size;
            }
            Chunk::Trailers => return trailers(buf),
        }
    }
}

/// A chunk-size line (without its LF; a CR before it is taken off): hex
/// digits, then nothing, or whitespace or `;` and an extension. The size
/// may not pass nginx's bound (`NGX_MAX_OFF_T_VALUE / 16` before each
/// digit); leading zeros are no digits of it.
fn chunk_size(line: &[u8]) -> Result<u64, &'static str> {
    const BOUND: u64 = (i64::MAX as u64) / 16;
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 {
        return Err("invalid chunk size");
    }
    if !matches!(line.get(digits), None | Some(b';' | b' ' | b'\t')) {
        return Err("invalid chunk size");
    }
    let mut size: u64 = 0;
    for &b in &line[..digits] {
        let d = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            _ => b - b'A' + 10,
        };
        if size > BOUND {
            return Err("invalid chunk size");
        }
        size = size * 16 + u64::from(d);
    }
    Ok(size)
}

/// The trailer section, once whole (up to its empty line): its fields,
/// or the end when it has none.
fn trailers(buf: &mut BytesMut) -> Result<Option<Decoded>, &'static str> {
    let mut at = 0;
    loop {
        let Some(lf) = buf[at..].iter().position(|&b| b == b'\n') else {
            if buf.len() > TRAILERS_LIMIT {
                return Err("trailers too large");
            }
            return Ok(None);
        };
        let line = &buf[at..at + lf];
        let empty = line.is_empty() || line == b"\r";
        at += lf + 1;
        if at > TRAILERS_LIMIT {
            return Err("trailers too large");
        }
        if empty {
            break;
        }
    }
    let section = buf.split_to(at).freeze();
    if at <= 2 {
        return Ok(Some(Decoded::End));
    }
    // nginx reads trailer lines without judging them: a section that is
    // not header fields ends the body as well, its lines dropped.
    let mut fields = [httparse::EMPTY_HEADER; MAX_TRAILERS];
    let Ok(httparse::Status::Complete((_, parsed))) =
        httparse::parse_headers(&section, &mut fields)
    else {
        return Ok(Some(Decoded::End));
    };
    let mut map = HeaderMap::with_capacity(parsed.len());
    for f in parsed {
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(f.name.as_bytes()),
            HeaderValue::from_maybe_shared(section.slice_ref(f.value)),
        ) else {
            return Ok(Some(Decoded::End));
        };
        map.append(name, value);
    }
    if map.is_empty() {
        return Ok(Some(Decoded::End));
    }
    Ok(Some(Decoded::Trailers(map)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The data, the trailers, and what is left in the buffer.
    type Fed = (Vec<u8>, Option<HeaderMap>, Vec<u8>);

    /// Decode `input` fed `step` bytes at a time (every state must
    /// resume), the peer closing after it when `close`: the data, the
    /// trailers, and what is left in the buffer.
    fn feed(framing: Framing, input: &[u8], step: usize, close: bool) -> Result<Fed, String> {
        let mut d = Decoder::new(framing);
        let mut buf = BytesMut::new();
        let mut data = Vec::new();
        let mut trailers = None;
        for piece in input.chunks(step.max(1)) {
            buf.extend_from_slice(piece);
            while !d.is_done() {
                match d.decode(&mut buf).map_err(str::to_owned)? {
                    Some(Decoded::Data(b)) => data.extend_from_slice(&b),
                    Some(Decoded::Trailers(t)) => trailers = Some(t),
                    Some(Decoded::End) | None => break,
                }
            }
        }
        if !d.is_done() {
            if !close {
                return Err("incomplete".to_owned());
            }
            d.closed().map_err(|_| "premature".to_owned())?;
        }
        Ok((data, trailers, buf.to_vec()))
    }

    #[test]
    fn chunked_bodies_decode_with_extensions_and_trailers() {
        for step in [1, 2, 5, 1024] {
            let (d, t, rest) = feed(
                Framing::Chunked,
                b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Sum: 42\r\nX-B: 2\r\n\r\nNEXT",
                step,
                false,
            )
            .unwrap();
            assert_eq!(d, b"hello world");
            let t = t.expect("trailers");
            assert_eq!(
                (t["x-sum"].as_bytes(), t["x-b"].as_bytes()),
                (&b"42"[..], &b"2"[..])
            );
            assert_eq!(rest, b"NEXT", "what follows the body stays");
            let (d, t, _) = feed(Framing::Chunked, b"3\r\nabc\r\n0\r\n\r\n", step, false).unwrap();
            assert_eq!((d, t), (b"abc".to_vec(), None));
        }
    }

    #[test]
    fn chunked_lines_are_read_as_nginx_reads_them() {
        // A bare LF ends a line; whitespace or `;` may follow the size.
        let (d, _, _) = feed(Framing::Chunked, b"3 \nabc\n2\t;x\r\nde\r\n0\n\n", 1, false).unwrap();
        assert_eq!(d, b"abcde");
        for bad in [
            &b"zz\r\n"[..],
            b"3x\r\nabc\r\n0\r\n\r\n",
            b"3\r\nabcX\r\n",
            b"3\r\nabc\rX",
            b"FFFFFFFFFFFFFFFF\r\n",
        ] {
            assert!(feed(Framing::Chunked, bad, 1, false).is_err(), "{bad:?}");
        }
        // Leading zeros are no digits of the size (nginx bounds the value).
        let (d, _, _) = feed(
            Framing::Chunked,
            b"00000000000000000003\r\nabc\r\n0\r\n\r\n",
            7,
            false,
        )
        .unwrap();
        assert_eq!(d, b"abc");
        // A trailer section that is not header fields ends the body, its
        // lines dropped, as nginx reads it.
        let (d, t, rest) = feed(
            Framing::Chunked,
            b"1\r\nx\r\n0\r\nno colon\r\n\r\nNEXT",
            1,
            false,
        )
        .unwrap();
        assert_eq!((d, t, rest), (b"x".to_vec(), None, b"NEXT".to_vec()));
        // An error is given again on every call after it.
        let mut d = Decoder::new(Framing::Chunked);
        let mut buf = BytesMut::from(&b"zz\r\n"[..]);
        assert_eq!(d.decode(&mut buf), Err("invalid chunk size"));
        assert_eq!(d.decode(&mut BytesMut::new()), Err("invalid chunk size"));
        let long = [b"1;".to_vec(), vec![b'x'; SIZE_LINE_LIMIT]].concat();
        for step in [1, 4096, 10_000] {
            let with_lf = [long.clone(), b"\r\nx\r\n0\r\n\r\n".to_vec()].concat();
            assert_eq!(
                feed(Framing::Chunked, &with_lf, step, false),
                Err("chunk size line too long".to_owned()),
                "{step}-byte reads"
            );
        }
    }

    #[test]
    fn a_length_body_stops_at_its_length_and_a_close_body_at_the_close() {
        let (d, _, rest) = feed(Framing::Length(5), b"helloNEXT", 3, false).unwrap();
        assert_eq!((d, rest), (b"hello".to_vec(), b"NEXT".to_vec()));
        let (d, _, _) = feed(Framing::Close, b"all of it", 2, true).unwrap();
        assert_eq!(d, b"all of it");
        assert_eq!(
            feed(Framing::Length(10), b"short", 2, true),
            Err("premature".to_owned())
        );
        assert_eq!(
            feed(Framing::Chunked, b"5\r\nhel", 2, true),
            Err("premature".to_owned())
        );
        let mut empty = Decoder::new(Framing::Length(0));
        assert!(empty.is_done());
        assert_eq!(empty.decode(&mut BytesMut::new()), Ok(Some(Decoded::End)));
    }

    proptest::proptest! {
        /// Any body chunked any way, fed any way, decodes to itself.
        #[test]
        fn chunked_round_trips(
            body in proptest::collection::vec(proptest::num::u8::ANY, 0..600),
            sizes in proptest::collection::vec(1usize..64, 1..20),
            step in 1usize..40,
        ) {
            let mut wire = Vec::new();
            let mut rest = &body[..];
            let mut i = 0;
            while !rest.is_empty() {
                let n = sizes[i % sizes.len()].min(rest.len());
                wire.extend_from_slice(format!("{n:x}\r\n").as_bytes());
                wire.extend_from_slice(&rest[..n]);
                wire.extend_from_slice(b"\r\n");
                rest = &rest[n..];
                i += 1;
            }
            wire.extend_from_slice(b"0\r\n\r\n");
            let (d, t, left) = feed(Framing::Chunked, &wire, step, false).unwrap();
            proptest::prop_assert_eq!(d, body);
            proptest::prop_assert!(t.is_none() && left.is_empty());
        }
    }
}
