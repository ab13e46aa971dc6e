//! The HTTP exchange of an `http`/`https` probe: raw request bytes out;
//! status line, headers and the body as framed (Content-Length, chunked,
//! or until close; at most 64 KiB of it) in. A body cut short fails the
//! probe, as it fails a client (tengine judges the status line alone).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use vigil_core::config::{CheckKind, HttpCheck};
use vigil_core::health::ProbePhase;
use vigil_http1::{Decoded, Decoder, Framed, Framing};

use super::{Deadline, FailureKind, ProbeFailure, ProbeResult, Target};

/// Longest accepted status line plus headers.
const MAX_HEAD: usize = 16 * 1024;
/// How much of the body a probe reads (nginx Plus reads 256 KiB for a
/// match, HAProxy 16 KiB): a longer body passes once this much came.
pub(crate) const BODY_LIMIT: usize = 64 * 1024;

/// Send the request, read and judge the response.
pub(super) async fn exchange<S>(mut s: S, t: &Target, deadline: &Deadline) -> ProbeResult
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let send = async {
        s.write_all(t.http.send.as_bytes()).await?;
        s.flush().await
    };
    deadline
        .within(ProbePhase::Send, "sending the request", send)
        .await?
        .map_err(|e| ProbeFailure::io(ProbePhase::Send, &e))?;

    let mut buf = BytesMut::with_capacity(1024);
    let n = read_more(
        &mut s,
        &mut buf,
        deadline,
        ProbePhase::FirstByte,
        "waiting for the first byte",
    )
    .await?;
    if n == 0 {
        return Err(ProbeFailure::new(
            ProbePhase::FirstByte,
            FailureKind::Io,
            "connection closed before the first byte",
        ));
    }
    while !buf.contains(&b'\n') {
        if buf.len() > MAX_HEAD {
            return Err(protocol("status line longer than 16 KiB"));
        }
        let n = read_more(
            &mut s,
            &mut buf,
            deadline,
            ProbePhase::Status,
            "reading the status line",
        )
        .await?;
        if n == 0 {
            return Err(protocol("connection closed inside the status line"));
        }
    }
    let line_end = buf.iter().position(|&b| b == b'\n').unwrap_or(buf.len());
    let status = parse_status_line(&buf[..line_end])?;
    if !t.http.expect.iter().any(|c| c.accepts(status)) {
        let words: Vec<String> = t.http.expect.iter().map(|c| c.word()).collect();
        return Err(ProbeFailure::new(
            ProbePhase::Status,
            FailureKind::Status,
            format!("status {status} not in {}", words.join(" ")),
        ));
    }
    // The whole response is read as framed (up to BODY_LIMIT), so a peer
    // that cuts its bodies short fails its probe as it fails its clients.
    let head_end = loop {
        if let Some(i) = find(&buf, b"\r\n\r\n") {
            break i + 4;
        }
        if let Some(i) = find(&buf, b"\n\n") {
            break i + 2;
        }
        if buf.len() > MAX_HEAD {
            return Err(protocol("response header longer than 16 KiB"));
        }
        let n = read_more(
            &mut s,
            &mut buf,
            deadline,
            ProbePhase::Status,
            "reading the response header",
        )
        .await?;
        if n == 0 {
            return Err(protocol("connection closed inside the response header"));
        }
    };
    let (framing, _) = framed(&buf[..head_end])
        .response(
            status,
            t.http.send.starts_with("HEAD "),
            false,
            buf.starts_with(b"HTTP/1.0"),
        )
        .map_err(|e| protocol(&e.to_string()))?;
    let body = read_body(&mut s, buf.split_off(head_end), framing, deadline).await?;
    let body = &body[..body.len().min(BODY_LIMIT)];
    let Some(needle) = t.http.body_contains.as_deref() else {
        return Ok(format!("HTTP {status}"));
    };
    if find(body, needle.as_bytes()).is_some() {
        return Ok(format!("HTTP {status}, body contains \"{needle}\""));
    }
    Err(ProbeFailure::new(
        ProbePhase::Body,
        FailureKind::Body,
        format!(
            "body does not contain \"{needle}\" ({} bytes read)",
            body.len()
        ),
    ))
}

/// Judge a reply held in memory exactly as a probe judges one read from a
/// socket: the request `check.send` is "sent", then `reply` arrives at most
/// `chunk` bytes per read (at least 1) and the peer closes. Every read is
/// ready at once, so no timer fires (a tokio runtime with time enabled must
/// run it). For the `probe_response` fuzz target and tests: the same
/// [`exchange`] code runs, there is no second parser.
pub async fn judge_reply(
    check: &HttpCheck,
    reply: &[u8],
    chunk: usize,
) -> Result<String, ProbeFailure> {
    let target = Target {
        addr: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
        unix: None,
        kind: CheckKind::Http,
        server_name: "127.0.0.1".to_string(),
        http: check.clone(),
        timeout: std::time::Duration::from_secs(3600),
        interval: std::time::Duration::from_secs(7200),
        jitter: std::time::Duration::ZERO,
        tls: None,
    };
    let deadline = Deadline::new(target.timeout);
    let stream = Replay {
        reply,
        chunk: chunk.max(1),
    };
    exchange(stream, &target, &deadline).await
}

/// A peer that answers `reply`, `chunk` bytes at a time, then closes; what
/// is written to it is dropped.
struct Replay<'a> {
    reply: &'a [u8],
    chunk: usize,
}

impl AsyncRead for Replay<'_> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let n = self.reply.len().min(self.chunk).min(buf.remaining());
        let (now, later) = self.reply.split_at(n);
        buf.put_slice(now);
        self.reply = later;
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Replay<'_> {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// The body as `framing` frames it, decoded from `raw` (what came after
/// the head) and what more is read, up to [`BODY_LIMIT`]: a body cut
/// short or malformed fails the probe.
async fn read_body<S: AsyncRead + Unpin>(
    s: &mut S,
    mut raw: BytesMut,
    framing: Framing,
    deadline: &Deadline,
) -> Result<Vec<u8>, ProbeFailure> {
    let mut decoder = Decoder::new(framing);
    let mut body = Vec::new();
    'read: loop {
        loop {
            match decoder.decode(&mut raw) {
                Ok(Some(Decoded::Data(d))) => {
                    body.extend_from_slice(&d);
                    if body.len() >= BODY_LIMIT {
                        break 'read;
                    }
                }
                Ok(Some(Decoded::Trailers(_) | Decoded::End)) => break 'read,
                Ok(None) => break,
                Err(what) => {
                    return Err(ProbeFailure::new(
                        ProbePhase::Body,
                        FailureKind::Protocol,
                        format!("invalid chunked body: {what}"),
                    ))
                }
            }
        }
        // A read error here (a reset mid-body) fails the probe.
        let n = read_more(s, &mut raw, deadline, ProbePhase::Body, "reading the body").await?;
        if n == 0 {
            if decoder.closed().is_ok() {
                break;
            }
            let expected = match framing {
                Framing::Length(n) => format!(" of {n}"),
                _ => String::new(),
            };
            return Err(ProbeFailure::new(
                ProbePhase::Body,
                FailureKind::Io,
                format!(
                    "connection closed before the end of the body ({} bytes{expected} read)",
                    body.len()
                ),
            ));
        }
    }
    Ok(body)
}

fn protocol(detail: &str) -> ProbeFailure {
    ProbeFailure::new(ProbePhase::Status, FailureKind::Protocol, detail)
}

async fn read_more<S: AsyncRead + Unpin>(
    s: &mut S,
    buf: &mut BytesMut,
    deadline: &Deadline,
    phase: ProbePhase,
    doing: &str,
) -> Result<usize, ProbeFailure> {
    let mut chunk = [0u8; 4096];
    let n = deadline
        .within(phase, doing, s.read(&mut chunk))
        .await?
        .map_err(|e| ProbeFailure::io(phase, &e))?;
    buf.extend_from_slice(&chunk[..n]);
    Ok(n)
}

/// `HTTP/1.x NNN reason` → NNN.
pub(crate) fn parse_status_line(line: &[u8]) -> Result<u16, ProbeFailure> {
    let text = String::from_utf8_lossy(line);
    let text = text.trim_end_matches(['\r', '\n']);
    let bad = || protocol(&format!("invalid status line \"{}\"", shorten(text)));
    let rest = text.strip_prefix("HTTP/").ok_or_else(bad)?;
    let (version, rest) = rest.split_once(' ').ok_or_else(bad)?;
    if version.is_empty() || !version.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return Err(bad());
    }
    let code = rest.get(..3).ok_or_else(bad)?;
    if !code.bytes().all(|b| b.is_ascii_digit())
        || rest.as_bytes().get(3).is_some_and(|b| *b != b' ')
    {
        return Err(bad());
    }
    let status: u16 = code.parse().map_err(|_| bad())?;
    if !(100..=599).contains(&status) {
        return Err(bad());
    }
    Ok(status)
}

fn shorten(s: &str) -> String {
    s.chars().take(80).collect()
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() {
        return Some(0);
    }
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The framing fields of a response head (its status line first), as
/// the codec reads them.
fn framed(head: &[u8]) -> Framed {
    let mut f = Framed::default();
    for line in head.split(|&b| b == b'\n').skip(1) {
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        let (name, value) = (line[..colon].trim_ascii(), line[colon + 1..].trim_ascii());
        if name.eq_ignore_ascii_case(b"transfer-encoding") {
            f.transfer_encoding(value);
        } else if name.eq_ignore_ascii_case(b"content-length") {
            f.content_length(value);
        }
    }
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines() {
        assert_eq!(parse_status_line(b"HTTP/1.1 200 OK\r\n"), Ok(200));
        assert_eq!(parse_status_line(b"HTTP/1.0 503"), Ok(503));
        assert!(parse_status_line(b"HTTP/1.1 20 OK").is_err());
        assert!(parse_status_line(b"SSH-2.0-OpenSSH").is_err());
        assert!(parse_status_line(b"HTTP/1.1 2000 OK").is_err());
        let e = parse_status_line(b"garbage").unwrap_err();
        assert_eq!(e.phase(), ProbePhase::Status);
        assert_eq!(e.kind(), FailureKind::Protocol);
    }

    #[tokio::test]
    async fn a_reply_is_judged_the_same_whatever_the_read_sizes() {
        let check = HttpCheck {
            body_contains: Some("ok".into()),
            ..HttpCheck::default()
        };
        let chunked =
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\no\r\n1\r\nk\r\n0\r\n\r\n";
        for chunk in [1, 2, 7, 4096] {
            assert_eq!(
                judge_reply(&check, chunked, chunk).await,
                Ok("HTTP 200, body contains \"ok\"".to_string()),
                "{chunk}-byte reads"
            );
            let truncated = judge_reply(
                &check,
                b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nno",
                chunk,
            )
            .await
            .expect_err("closed early");
            assert_eq!(truncated.kind(), FailureKind::Io, "{truncated}");
        }
        let plain = HttpCheck::default();
        assert_eq!(
            judge_reply(&plain, b"HTTP/1.0 204 No Content\r\n\r\n", 3).await,
            Ok("HTTP 204".to_string())
        );
        // Without a body match the body is still read as framed: cut short
        // (by length or inside a chunk) it fails; until close it passes.
        for cut in [
            &b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\npartial"[..],
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab",
            b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n",
        ] {
            let e = judge_reply(&plain, cut, 4).await.expect_err("cut short");
            assert!(
                matches!(e.kind(), FailureKind::Io | FailureKind::Protocol),
                "{e}"
            );
        }
        assert_eq!(
            judge_reply(&plain, b"HTTP/1.0 200 OK\r\n\r\nuntil close", 4).await,
            Ok("HTTP 200".to_string())
        );
        let mut long = b"HTTP/1.1 200 OK\r\nContent-Length: 10000000\r\n\r\n".to_vec();
        long.resize(long.len() + BODY_LIMIT, b'x');
        assert_eq!(
            judge_reply(&plain, &long, 4096).await,
            Ok("HTTP 200".to_string()),
            "a body longer than the limit passes once the limit was read"
        );
        let e = judge_reply(&plain, b"HTTP/1.1 2", 1)
            .await
            .expect_err("cut in the status line");
        assert_eq!(e.kind(), FailureKind::Protocol);
    }

    #[test]
    fn framing_is_the_codecs() {
        let framing = |head: &str, head_request| {
            framed(head.as_bytes())
                .response(200, head_request, false, false)
                .map(|(f, _)| f)
        };
        let head = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n";
        assert_eq!(framing(head, false), Ok(Framing::Length(5)));
        assert_eq!(framing(head, true), Ok(Framing::Empty));
        let head = "HTTP/1.1 200 OK\r\ntransfer-encoding:  chunked\r\n\r\n";
        assert_eq!(framing(head, false), Ok(Framing::Chunked));
        let head = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n";
        assert!(framing(head, false).is_err());
    }

    #[tokio::test]
    async fn a_broken_chunked_body_or_length_fails_the_probe_as_it_fails_a_client() {
        let plain = HttpCheck::default();
        for reply in [
            &b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nok\r\n0\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\nContent-Length: 5, 6\r\n\r\nhello",
        ] {
            let e = judge_reply(&plain, reply, 3).await.expect_err("refused");
            assert_eq!(e.kind(), FailureKind::Protocol, "{e}");
        }
    }
}
