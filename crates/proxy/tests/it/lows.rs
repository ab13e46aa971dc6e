//! Low-severity differences from nginx 1.22 found by sending the same bytes
//! to both, each beside a stock nginx serving the same conf: `Expect` is
//! answered here and not sent upstream, a request pipelined after a
//! chunked body is answered, `allow`/`deny` run before a location with no
//! handler answers 404, a bare CR and a request line without a version
//! are answered at once, and an upstream's early answer to a streamed body
//! reaches the client while the body is still coming.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::twin::Twin;

const CONF: &str = "upstream u { server {B0}; }
    server { listen {LISTEN}; client_header_timeout 30s;
      location / { proxy_pass http://u; }
      location /nobuf/ { proxy_pass http://u; proxy_request_buffering off; }
      location ~ ^/adm$ { deny all; }
      location /lan { allow 10.0.0.0/8; deny all; }
      location /here { allow 127.0.0.1; deny all; }
      location /open { } }";

/// Write `bytes` on a new connection (left open) and read until the
/// server closes it or 5 s pass: what came, and whether the server closed.
async fn exchange(addr: std::net::SocketAddr, bytes: &[u8]) -> (Vec<u8>, bool) {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(bytes).await.expect("write");
    let mut got = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut got))
        .await
        .is_ok();
    (got, closed)
}

/// Read until `want` has come (true), or the peer closes or 5 s pass.
async fn read_until(s: &mut TcpStream, got: &mut Vec<u8>, want: &[u8]) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let mut chunk = [0u8; 4096];
    while !got.windows(want.len()).any(|w| w == want) {
        match tokio::time::timeout_at(deadline, s.read(&mut chunk)).await {
            Ok(Ok(n)) if n > 0 => got.extend_from_slice(&chunk[..n]),
            _ => return false,
        }
    }
    true
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn count(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len()).filter(|w| *w == needle).count()
}

#[tokio::test]
async fn expect_100_continue_is_answered_here_and_not_sent_upstream() {
    let t = Twin::start(CONF, 1).await;
    for path in ["/e", "/nobuf/e"] {
        for (side, addr) in [("vigil", t.vigil.addr), ("nginx", t.nginx.addr)] {
            let mut s = TcpStream::connect(addr).await.expect("connect");
            let head = format!(
                "POST {path} HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\
                 Expect: 100-continue\r\nConnection: close\r\n\r\n"
            );
            s.write_all(head.as_bytes()).await.expect("write");
            let mut got = Vec::new();
            read_until(&mut s, &mut got, b"\r\n\r\n").await;
            assert_eq!(
                text(&got),
                "HTTP/1.1 100 Continue\r\n\r\n",
                "{side} {path}: the body is asked for before it is sent"
            );
            s.write_all(b"hello").await.expect("body");
            let mut rest = Vec::new();
            let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest)).await;
            assert!(
                rest.starts_with(b"HTTP/1.1 200 "),
                "{side} {path}: {}",
                text(&rest)
            );
        }
    }
    let (vs, ns) = t.seen(0);
    assert_eq!((vs.len(), ns.len()), (2, 2));
    for (side, seen) in [("vigil", &vs), ("nginx", &ns)] {
        for s in seen {
            assert_eq!(&s.body[..], b"hello", "{side} {}", s.uri);
            assert!(
                s.headers.get("expect").is_none(),
                "{side} {}: Expect went upstream: {:?}",
                s.uri,
                s.headers
            );
        }
    }
}

#[tokio::test]
async fn a_request_pipelined_after_a_chunked_body_is_answered() {
    let t = Twin::start(CONF, 1).await;
    for path in ["/p", "/nobuf/p"] {
        let bytes = format!(
            "POST {path} HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n\
             5\r\nhello\r\n0\r\nX-Sum: 1\r\n\r\n\
             GET /two HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"
        );
        for (side, addr) in [("vigil", t.vigil.addr), ("nginx", t.nginx.addr)] {
            let (got, closed) = exchange(addr, bytes.as_bytes()).await;
            assert!(closed, "{side} {path}: not closed after the second answer");
            assert_eq!(
                count(&got, b"HTTP/1.1 200 OK\r\n"),
                2,
                "{side} {path}: {}",
                text(&got)
            );
        }
    }
    let (vs, ns) = t.seen(0);
    for (side, seen) in [("vigil", &vs), ("nginx", &ns)] {
        let got: Vec<(&str, &[u8])> = seen.iter().map(|s| (s.uri.as_str(), &s.body[..])).collect();
        assert_eq!(
            got,
            [
                ("/p", &b"hello"[..]),
                ("/two", b""),
                ("/nobuf/p", b"hello"),
                ("/two", b"")
            ],
            "{side}"
        );
    }
}

#[tokio::test]
async fn allow_and_deny_run_before_a_location_with_no_handler_answers() {
    let t = Twin::start(CONF, 1).await;
    for (path, want) in [("/adm", 403), ("/lan", 403), ("/here", 404), ("/open", 404)] {
        let req = format!("GET {path} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
        let (v, n) = t.send(req.as_bytes()).await;
        assert_eq!((v.status, n.status), (want, want), "{path}");
        // POST: the static handler's 405 comes after the access phase too.
        let req = format!(
            "PUT {path} HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        let (v, n) = t.send(req.as_bytes()).await;
        assert_eq!(v.status, n.status, "PUT {path}");
    }
    assert_eq!(t.uris(), (vec![vec![]], vec![vec![]]), "nothing proxied");
}

#[tokio::test]
async fn a_bare_cr_is_answered_400_at_once() {
    let t = Twin::start(CONF, 1).await;
    for bytes in [
        &b"GET / HTTP/1.1\rHost: x\r\r\n"[..],
        b"GET / HTTP/1.1\rX",
        b"GET / HTTP/1.1\r\nHost: x\rX: y",
        b"GET / HTTP/1.1\r\nHost: x\r\nX-A: 1\r2",
    ] {
        for (side, addr) in [("vigil", t.vigil.addr), ("nginx", t.nginx.addr)] {
            // client_header_timeout is 30 s: the answer is the CR's.
            let (got, closed) = exchange(addr, bytes).await;
            let raw = crate::twin::parse(&got);
            assert_eq!(raw.status, 400, "{side} {:?}: {}", text(bytes), text(&got));
            assert!(closed, "{side} {:?}: left open", text(bytes));
        }
    }
    assert_eq!(t.uris(), (vec![vec![]], vec![vec![]]), "nothing proxied");
}

#[tokio::test]
async fn a_request_line_without_a_version_is_answered_at_once() {
    let t = Twin::start(CONF, 1).await;
    // nginx serves an HTTP/0.9 GET: the body alone, no status line; vigil
    // refuses it with a 400 (docs/security.md). Both answer at once and close.
    let (v, vclosed) = exchange(t.vigil.addr, b"GET /\r\n").await;
    let (n, nclosed) = exchange(t.nginx.addr, b"GET /\r\n").await;
    assert!(
        vclosed && nclosed,
        "left open: vigil {vclosed}, nginx {nclosed}"
    );
    assert_eq!(text(&n), "b0", "nginx's HTTP/0.9 answer");
    assert_eq!(crate::twin::parse(&v).status, 400, "{}", text(&v));
    assert_eq!(t.uris(), (vec![vec![]], vec![vec!["/".to_string()]]));
    // Another method: nginx's 400 page without a head, vigil's with one.
    let (v, vclosed) = exchange(t.vigil.addr, b"POST /\r\n").await;
    let (n, nclosed) = exchange(t.nginx.addr, b"POST /\r\n").await;
    assert!(
        vclosed && nclosed,
        "left open: vigil {vclosed}, nginx {nclosed}"
    );
    assert!(
        text(&n).starts_with("<html>\r\n<head><title>400 Bad Request"),
        "{}",
        text(&n)
    );
    assert_eq!(crate::twin::parse(&v).status, 400, "{}", text(&v));
}

/// What a raw backend read on its connections, and how many it saw end.
#[derive(Clone, Default)]
struct Record {
    bytes: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    ended: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Record {
    fn bytes(&self) -> Vec<u8> {
        self.bytes.lock().expect("lock").clone()
    }

    fn ended(&self) -> usize {
        self.ended.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// How a raw backend answers a request with a body.
#[derive(Clone, Copy)]
enum Early {
    /// These bytes once the head came, then read until the proxy closes.
    Answer(&'static [u8]),
    /// These bytes once the head came, and nothing read any more.
    AnswerDeaf(&'static [u8]),
    /// A close-delimited 200 once the head came, then each piece of the
    /// body echoed as it comes (`echo:` before it); closed after the
    /// Content-Length's last byte.
    Echo,
}

/// A backend on 127.0.0.1 that answers before it read the request body.
async fn early_backend(how: Early) -> (std::net::SocketAddr, Record) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = l.local_addr().expect("addr");
    let record = Record::default();
    let r = record.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let r = r.clone();
            tokio::spawn(async move {
                let mut got = Vec::new();
                let mut chunk = [0u8; 4096];
                let end = loop {
                    if let Some(p) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                        break p + 4;
                    }
                    match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&chunk[..n]),
                    }
                };
                r.bytes.lock().expect("lock").extend_from_slice(&got);
                let head = text(&got[..end]).to_ascii_lowercase();
                let length: usize = head
                    .split("content-length:")
                    .nth(1)
                    .and_then(|v| v.lines().next())
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                let mut body = got.len() - end;
                match how {
                    Early::Answer(answer) => {
                        let _ = s.write_all(answer).await;
                        while let Ok(n) = s.read(&mut chunk).await {
                            if n == 0 {
                                break;
                            }
                            r.bytes.lock().expect("lock").extend_from_slice(&chunk[..n]);
                        }
                    }
                    Early::AnswerDeaf(answer) => {
                        let _ = s.write_all(answer).await;
                        // Held open, unread, until the test ends.
                        std::future::pending::<()>().await;
                    }
                    Early::Echo => {
                        let mut out = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n".to_vec();
                        if body > 0 {
                            out.extend_from_slice(b"echo:");
                            out.extend_from_slice(&got[end..]);
                        }
                        let _ = s.write_all(&out).await;
                        while body < length {
                            let n = match s.read(&mut chunk).await {
                                Ok(0) | Err(_) => break,
                                Ok(n) => n,
                            };
                            body += n;
                            r.bytes.lock().expect("lock").extend_from_slice(&chunk[..n]);
                            let mut out = b"echo:".to_vec();
                            out.extend_from_slice(&chunk[..n]);
                            if s.write_all(&out).await.is_err() {
                                break;
                            }
                        }
                    }
                }
                r.ended.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            });
        }
    });
    (addr, record)
}

/// Start a twin whose `{R0}` is an [`early_backend`] of each side's own.
async fn early_twin(how: Early) -> (Twin, Record, Record) {
    let ((va, vr), (na, nr)) = (early_backend(how).await, early_backend(how).await);
    let conf = "server { listen {LISTEN}; client_header_timeout 30s; client_max_body_size 0;
        location / { proxy_pass http://{R0}; proxy_request_buffering off; proxy_buffering off; } }";
    let t = Twin::start_with(conf, 0, &[("{R0}", va)], &[("{R0}", na)]).await;
    (t, vr, nr)
}

#[tokio::test]
async fn an_early_answer_to_a_streamed_body_reaches_the_client_at_once() {
    let answer = b"HTTP/1.1 413 Request Entity Too Large\r\nContent-Length: 3\r\n\r\nbig";
    let (t, vr, nr) = early_twin(Early::Answer(answer)).await;
    for (side, addr, record) in [("vigil", t.vigil.addr, &vr), ("nginx", t.nginx.addr, &nr)] {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(b"POST /up HTTP/1.1\r\nHost: a\r\nContent-Length: 100000\r\n\r\nabc")
            .await
            .expect("write");
        // The answer comes while the client has 99,997 bytes left to send.
        let mut got = Vec::new();
        assert!(
            read_until(&mut s, &mut got, b"\r\n\r\nbig").await,
            "{side}: no answer before the body's end: {}",
            text(&got)
        );
        assert_eq!(crate::twin::parse(&got).status, 413, "{side}");
        // More of the body: read and discarded (lingering close), not
        // sent on, not reset; and the connection closes (the body will
        // not be read to its end).
        for _ in 0..16 {
            let sent = s.write_all(&[b'x'; 4096]).await;
            assert!(
                sent.is_ok(),
                "{side}: the rest of the body was refused: {sent:?}"
            );
        }
        let mut rest = Vec::new();
        let closed = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest)).await;
        assert!(
            matches!(closed, Ok(Ok(0))),
            "{side}: not closed cleanly after the answer: {closed:?}"
        );
        crate::support::eventually(&format!("{side}'s backend connection closed"), || {
            record.ended() == 1
        })
        .await;
        let seen = record.bytes();
        assert!(
            seen.ends_with(b"\r\n\r\nabc"),
            "{side}: the backend got {}",
            text(&seen)
        );
    }
}

#[tokio::test]
async fn a_streamed_body_goes_on_while_the_answer_streams_back() {
    let (t, vr, nr) = early_twin(Early::Echo).await;
    for (side, addr, record) in [("vigil", t.vigil.addr, &vr), ("nginx", t.nginx.addr, &nr)] {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 15\r\n\r\nping1")
            .await
            .expect("write");
        let mut got = Vec::new();
        for (i, next) in [b"ping2", b"ping3"].into_iter().enumerate() {
            let want = format!("echo:ping{}", i + 1);
            assert!(
                read_until(&mut s, &mut got, want.as_bytes()).await,
                "{side}: {want} did not come back before the body's end: {}",
                text(&got)
            );
            s.write_all(next).await.expect("write");
        }
        assert!(
            read_until(&mut s, &mut got, b"echo:ping3").await,
            "{side}: {}",
            text(&got)
        );
        assert!(
            got.starts_with(b"HTTP/1.1 200 OK\r\n"),
            "{side}: {}",
            text(&got)
        );
        crate::support::eventually(&format!("{side}'s backend done"), || record.ended() == 1).await;
        assert!(
            record.bytes().ends_with(b"\r\n\r\nping1ping2ping3"),
            "{side}: {}",
            text(&record.bytes())
        );
    }
}

#[tokio::test]
async fn an_early_answer_comes_through_while_the_upstream_reads_no_more() {
    // A body far past what the sockets between proxy and backend hold:
    // the proxy's writes upstream stop, and the answer must come anyway.
    const LENGTH: usize = 64 << 20;
    let answer = b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 4\r\n\r\nwho?";
    let (t, _, _) = early_twin(Early::AnswerDeaf(answer)).await;
    for (side, addr) in [("vigil", t.vigil.addr), ("nginx", t.nginx.addr)] {
        let s = TcpStream::connect(addr).await.expect("connect");
        let (mut rd, mut wr) = s.into_split();
        let writer = tokio::spawn(async move {
            let head = format!("POST /up HTTP/1.1\r\nHost: a\r\nContent-Length: {LENGTH}\r\n\r\n");
            wr.write_all(head.as_bytes()).await?;
            let piece = vec![b'x'; 1 << 16];
            for _ in 0..LENGTH / piece.len() {
                wr.write_all(&piece).await?;
            }
            std::io::Result::Ok(wr)
        });
        let mut got = Vec::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        let mut chunk = [0u8; 4096];
        while !got.ends_with(b"who?") {
            match tokio::time::timeout_at(deadline, rd.read(&mut chunk)).await {
                Ok(Ok(n)) if n > 0 => got.extend_from_slice(&chunk[..n]),
                other => panic!("{side}: no answer ({other:?}): {}", text(&got)),
            }
        }
        assert_eq!(crate::twin::parse(&got).status, 401, "{side}");
        // The rest of the body is discarded, and the connection closed.
        let sent = tokio::time::timeout(Duration::from_secs(5), writer).await;
        assert!(
            matches!(sent, Ok(Ok(Ok(_)))),
            "{side}: the rest of the body was not taken: {sent:?}"
        );
        let mut rest = Vec::new();
        let closed = tokio::time::timeout(Duration::from_secs(5), rd.read_to_end(&mut rest)).await;
        assert!(matches!(closed, Ok(Ok(0))), "{side}: {closed:?}");
    }
}
