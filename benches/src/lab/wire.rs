//! Minimal HTTP/1.1 for the lab, written by hand so that a fault is exactly
//! the bytes a backend sends: one message head read from a buffered stream,
//! bodies by `Content-Length` or chunked, nothing else (no pipelining
//! beyond what the buffer already holds, no trailers kept).

use std::io;

use tokio::io::{AsyncRead, AsyncReadExt};

/// Longest head accepted (request or response).
const MAX_HEAD: usize = 32 * 1024;

/// A message head: the start line and the header fields, as received.
#[derive(Debug, Clone, Default)]
pub struct Head {
    /// `GET / HTTP/1.1` or `HTTP/1.1 200 OK`.
    pub start: String,
    /// Header fields in order, names as sent.
    pub fields: Vec<(String, String)>,
}

/// A stream with the bytes read from it but not used yet.
#[derive(Debug)]
pub struct Reader<S> {
    stream: S,
    buf: Vec<u8>,
}

/// How a body read ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyEnd {
    /// Every byte the framing announced arrived.
    Complete,
    /// The stream ended or failed before the announced end.
    CutShort,
}

// === impl Head ===

impl Head {
    /// The first value of field `name` (case-insensitive).
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// `Content-Length`, when present and a number.
    pub fn content_length(&self) -> Option<usize> {
        self.field("content-length")?.trim().parse().ok()
    }

    /// Whether the body is chunked.
    pub fn chunked(&self) -> bool {
        self.field("transfer-encoding")
            .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"))
    }

    /// Whether the sender asked to close after this message (`Connection:
    /// close`, or HTTP/1.0 without `keep-alive`).
    pub fn closes(&self) -> bool {
        let conn = self.field("connection").map(str::to_ascii_lowercase);
        let http10 = self.start.contains("HTTP/1.0");
        match conn.as_deref() {
            Some(c) if c.contains("close") => true,
            Some(c) if c.contains("keep-alive") => false,
            _ => http10,
        }
    }

    /// The request method (first word of a request line).
    pub fn method(&self) -> &str {
        self.start.split(' ').next().unwrap_or("")
    }

    /// The status code of a response line.
    pub fn status(&self) -> Option<u16> {
        self.start.split(' ').nth(1)?.parse().ok()
    }

    fn parse(raw: &[u8]) -> io::Result<Self> {
        let text = String::from_utf8_lossy(raw);
        let mut lines = text.split("\r\n");
        let start = lines.next().unwrap_or("").to_string();
        let mut fields = Vec::new();
        for line in lines.filter(|l| !l.is_empty()) {
            let Some((n, v)) = line.split_once(':') else {
                return Err(invalid(format!("header line without a colon: {line:?}")));
            };
            fields.push((n.trim().to_string(), v.trim().to_string()));
        }
        Ok(Self { start, fields })
    }
}

// === impl Reader ===

impl<S: AsyncRead + Unpin> Reader<S> {
    /// A reader over `stream` with an empty buffer.
    pub fn new(stream: S) -> Self {
        Self {
            stream,
            buf: Vec::with_capacity(4096),
        }
    }

    /// The stream (to write to it, or to set socket options).
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.stream
    }

    /// The stream.
    pub fn get_ref(&self) -> &S {
        &self.stream
    }

    /// The next head; `None` on a clean end of stream before its first byte.
    pub async fn head(&mut self) -> io::Result<Option<Head>> {
        loop {
            if let Some(end) = find(&self.buf, b"\r\n\r\n") {
                let head = Head::parse(&self.buf[..end])?;
                self.buf.drain(..end + 4);
                return Ok(Some(head));
            }
            if self.buf.len() > MAX_HEAD {
                return Err(invalid("head longer than 32 KiB".to_string()));
            }
            if self.fill().await? == 0 {
                if self.buf.is_empty() {
                    return Ok(None);
                }
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "stream ended inside a message head",
                ));
            }
        }
    }

    /// Read and keep exactly `n` body bytes; fewer on an early end.
    pub async fn body(&mut self, n: usize) -> (Vec<u8>, BodyEnd) {
        while self.buf.len() < n {
            match self.fill().await {
                Ok(0) | Err(_) => return (std::mem::take(&mut self.buf), BodyEnd::CutShort),
                Ok(_) => {}
            }
        }
        let rest = self.buf.split_off(n);
        (std::mem::replace(&mut self.buf, rest), BodyEnd::Complete)
    }

    /// Read and drop the body that `head` announces (`Content-Length`,
    /// chunked, or none). `until_close` is for a response without either:
    /// its body runs to the end of the stream, and is complete there.
    pub async fn skip_body(&mut self, head: &Head, until_close: bool) -> BodyEnd {
        if head.chunked() {
            return self.skip_chunked().await;
        }
        if let Some(n) = head.content_length() {
            return self.body(n).await.1;
        }
        if until_close {
            loop {
                self.buf.clear();
                match self.fill().await {
                    Ok(0) => return BodyEnd::Complete,
                    Err(_) => return BodyEnd::CutShort,
                    Ok(_) => {}
                }
            }
        }
        BodyEnd::Complete
    }

    async fn skip_chunked(&mut self) -> BodyEnd {
        loop {
            let Some(line) = self.line().await else {
                return BodyEnd::CutShort;
            };
            let size = line.split(';').next().unwrap_or("").trim();
            let Ok(size) = usize::from_str_radix(size, 16) else {
                return BodyEnd::CutShort;
            };
            if size == 0 {
                // Trailers, up to the empty line.
                loop {
                    match self.line().await {
                        None => return BodyEnd::CutShort,
                        Some(l) if l.is_empty() => return BodyEnd::Complete,
                        Some(_) => {}
                    }
                }
            }
            if self.body(size + 2).await.1 == BodyEnd::CutShort {
                return BodyEnd::CutShort;
            }
        }
    }

    async fn line(&mut self) -> Option<String> {
        loop {
            if let Some(end) = find(&self.buf, b"\r\n") {
                let line = String::from_utf8_lossy(&self.buf[..end]).into_owned();
                self.buf.drain(..end + 2);
                return Some(line);
            }
            if self.buf.len() > MAX_HEAD {
                return None;
            }
            match self.fill().await {
                Ok(0) | Err(_) => return None,
                Ok(_) => {}
            }
        }
    }

    async fn fill(&mut self) -> io::Result<usize> {
        let mut chunk = [0u8; 8192];
        let n = self.stream.read(&mut chunk).await?;
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(n)
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn heads_and_bodies_by_each_framing() {
        let raw: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nX-Backend: 2\r\n\r\nabc\
            HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n0\r\n\r\n\
            HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nabc";
        let mut r = Reader::new(raw);
        let h = r.head().await.unwrap().unwrap();
        assert_eq!((h.status(), h.field("x-backend")), (Some(200), Some("2")));
        assert_eq!(r.skip_body(&h, false).await, BodyEnd::Complete);
        let h = r.head().await.unwrap().unwrap();
        assert_eq!(r.skip_body(&h, false).await, BodyEnd::Complete);
        let h = r.head().await.unwrap().unwrap();
        assert_eq!(r.skip_body(&h, false).await, BodyEnd::CutShort);
        assert!(r.head().await.unwrap().is_none());
    }
}
