//! vigil's own HTTP/1.x server loop on the wire, beside stock nginx where
//! nginx's bytes are the reference: pipelining, request bodies (chunked
//! with trailers, `Expect: 100-continue`, a client gone mid-body),
//! response framing (HEAD, 204, 304, HTTP/1.0 keep-alive and
//! close-delimited), and a 101 with bytes past the head.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::twin::Twin;

const PLAIN: &str = "upstream u { server {B0}; }
     server { listen {LISTEN};
       location / { proxy_pass http://u; }
       location = /204 { return 204; }
       location = /304 { return 304; }
       location = /raw { proxy_pass http://{R0}; }
       location = /ws { proxy_pass http://{R0}; proxy_http_version 1.1;
         proxy_set_header Upgrade $http_upgrade; proxy_set_header Connection upgrade; } }";

/// Read until the peer closes or 5 s pass.
async fn read_all(s: &mut TcpStream) -> Vec<u8> {
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf)).await;
    buf
}

/// Read until `buf` holds `needle` (or the peer closes, or 5 s pass).
async fn read_until(s: &mut TcpStream, buf: &mut Vec<u8>, needle: &[u8]) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !buf.windows(needle.len()).any(|w| w == needle) {
        let mut chunk = [0u8; 4096];
        match tokio::time::timeout_at(deadline, s.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return,
            Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

fn count(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len()).filter(|w| *w == needle).count()
}

/// A raw backend: answers every request on a connection with `answer`, and
/// after a 101 echoes what comes.
async fn raw_backend(answer: &'static [u8]) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut got = Vec::new();
                let mut chunk = [0u8; 4096];
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&chunk[..n]),
                    }
                }
                if s.write_all(answer).await.is_err() {
                    return;
                }
                if answer.starts_with(b"HTTP/1.1 101") {
                    let end = got.windows(4).position(|w| w == b"\r\n\r\n").unwrap_or(0) + 4;
                    let _ = s.write_all(&got[end..]).await;
                    while let Ok(n) = s.read(&mut chunk).await {
                        if n == 0 || s.write_all(&chunk[..n]).await.is_err() {
                            break;
                        }
                    }
                } else {
                    let _ = s.shutdown().await;
                }
            });
        }
    });
    addr
}

async fn twin(raw: &'static [u8]) -> Twin {
    let r = raw_backend(raw).await;
    Twin::start_with(PLAIN, 1, &[("{R0}", r)], &[("{R0}", r)]).await
}

const CHUNKED_ANSWER: &[u8] =
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n";

#[tokio::test]
async fn pipelined_requests_in_one_packet_are_answered_in_order() {
    let t = twin(CHUNKED_ANSWER).await;
    let two = b"GET /a HTTP/1.1\r\nHost: a\r\n\r\nGET /b HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n";
    for addr in [t.vigil.addr, t.nginx.addr] {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(two).await.expect("write");
        let got = read_all(&mut s).await;
        assert_eq!(
            count(&got, b"HTTP/1.1 200 OK\r\n"),
            2,
            "{}",
            String::from_utf8_lossy(&got)
        );
    }
    let (v, n) = t.uris();
    assert_eq!(v, n);
    assert_eq!(v, vec![vec!["/a".to_string(), "/b".to_string()]]);
}

#[tokio::test]
async fn a_chunked_request_body_with_trailers_reaches_the_backend_whole() {
    let t = twin(CHUNKED_ANSWER).await;
    let req =
        b"POST /up HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n\
                5;x=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Sum: 1\r\n\r\n";
    let (v, n) = t.send(req).await;
    assert_eq!((v.status, n.status), (200, 200), "{v:?}\n{n:?}");
    let (vs, ns) = t.seen(0);
    assert_eq!(vs.len(), 1);
    assert_eq!(vs[0].body, ns[0].body);
    assert_eq!(&vs[0].body[..], b"hello world");
}

#[tokio::test]
async fn expect_100_continue_is_answered_before_the_body_is_sent() {
    let t = twin(CHUNKED_ANSWER).await;
    for addr in [t.vigil.addr, t.nginx.addr] {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(b"PUT /c HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n")
            .await
            .expect("write");
        let mut got = Vec::new();
        read_until(&mut s, &mut got, b"\r\n\r\n").await;
        assert!(
            got.starts_with(b"HTTP/1.1 100 Continue\r\n\r\n"),
            "{addr}: {}",
            String::from_utf8_lossy(&got)
        );
        s.write_all(b"hello").await.expect("body");
        let rest = read_all(&mut s).await;
        assert!(
            rest.starts_with(b"HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&rest)
        );
    }
    let (vs, ns) = t.seen(0);
    assert_eq!(&vs[0].body[..], b"hello");
    assert_eq!(vs[0].body, ns[0].body);
}

#[tokio::test]
async fn head_204_and_304_responses_have_no_body() {
    let t = twin(CHUNKED_ANSWER).await;
    let (v, n) = t
        .send(b"HEAD / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        .await;
    assert_eq!((v.status, n.status), (200, 200));
    assert_eq!(v.header("content-length"), n.header("content-length"));
    assert_eq!(v.header("content-length"), "2");
    assert!(v.body.is_empty() && n.body.is_empty(), "{v:?}\n{n:?}");
    for (path, status) in [("/204", 204), ("/304", 304)] {
        let req = format!("GET {path} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
        let (v, n) = t.send(req.as_bytes()).await;
        assert_eq!((v.status, n.status), (status, status));
        assert!(v.body.is_empty() && n.body.is_empty(), "{v:?}\n{n:?}");
        assert_eq!(v.header("content-length"), "");
        assert_eq!(v.header("transfer-encoding"), "");
    }
}

#[tokio::test]
async fn http10_keeps_the_connection_only_when_asked() {
    let t = twin(CHUNKED_ANSWER).await;
    for addr in [t.vigil.addr, t.nginx.addr] {
        // Asked: the response says so and the connection serves another.
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
            .await
            .expect("write");
        let mut got = Vec::new();
        read_until(&mut s, &mut got, b"b0").await;
        let text = String::from_utf8_lossy(&got).to_ascii_lowercase();
        assert!(
            text.contains("connection: keep-alive\r\n"),
            "{addr}: {text}"
        );
        s.write_all(b"GET /again HTTP/1.0\r\n\r\n")
            .await
            .expect("write");
        let rest = read_all(&mut s).await;
        assert!(
            rest.starts_with(b"HTTP/1."),
            "{addr}: {}",
            String::from_utf8_lossy(&rest)
        );
        assert!(rest.ends_with(b"b0"));
        // Not asked: closed after the response.
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(b"GET / HTTP/1.0\r\n\r\n").await.expect("write");
        let got = read_all(&mut s).await;
        assert!(
            got.ends_with(b"\r\n\r\nb0"),
            "{addr}: {}",
            String::from_utf8_lossy(&got)
        );
        let text = String::from_utf8_lossy(&got).to_ascii_lowercase();
        assert!(!text.contains("keep-alive"), "{addr}: {text}");
    }
}

#[tokio::test]
async fn a_body_of_unknown_length_to_http10_is_delimited_by_the_close() {
    let t = twin(CHUNKED_ANSWER).await;
    let (v, n) = t.send(b"GET /raw HTTP/1.0\r\n\r\n").await;
    assert_eq!((v.status, n.status), (200, 200), "{v:?}\n{n:?}");
    assert_eq!(v.body, b"hello");
    assert_eq!(v.body, n.body);
    for r in [&v, &n] {
        assert_eq!(r.header("content-length"), "");
        assert_eq!(r.header("transfer-encoding"), "");
    }
    // HTTP/1.1 gets it chunked.
    let (v, n) = t
        .send(b"GET /raw HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        .await;
    assert_eq!(v.header("transfer-encoding"), "chunked");
    assert_eq!(n.header("transfer-encoding"), "chunked");
    assert_eq!(v.body, b"5\r\nhello\r\n0\r\n\r\n");
}

#[tokio::test]
async fn a_client_gone_mid_body_reaches_no_backend() {
    let t = twin(CHUNKED_ANSWER).await;
    for addr in [t.vigil.addr, t.nginx.addr] {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nabc")
            .await
            .expect("write");
        s.shutdown().await.expect("half-close");
        let got = read_all(&mut s).await;
        assert!(
            !got.starts_with(b"HTTP/1.1 200"),
            "{addr}: {}",
            String::from_utf8_lossy(&got)
        );
    }
    let (vs, ns) = t.seen(0);
    assert!(vs.is_empty() && ns.is_empty(), "{vs:?} {ns:?}");
}

#[tokio::test]
async fn bytes_past_a_101_head_go_through_the_tunnel() {
    const SWITCH: &[u8] =
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: upgrade\r\n\r\n";
    let t = twin(SWITCH).await;
    for addr in [t.vigil.addr, t.nginx.addr] {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        // The first tunnel bytes in the same packet as the head.
        s.write_all(
            b"GET /ws HTTP/1.1\r\nHost: a\r\nUpgrade: echo\r\nConnection: upgrade\r\n\r\nping",
        )
        .await
        .expect("write");
        let mut got = Vec::new();
        read_until(&mut s, &mut got, b"ping").await;
        let text = String::from_utf8_lossy(&got);
        assert!(text.starts_with("HTTP/1.1 101"), "{addr}: {text}");
        assert!(text.ends_with("\r\n\r\nping"), "{addr}: {text}");
        s.write_all(b"pong").await.expect("write");
        let mut more = Vec::new();
        read_until(&mut s, &mut more, b"pong").await;
        assert_eq!(more, b"pong", "{addr}");
    }
}

/// The head a backend sent, through vigil and through nginx: the status
/// line as it came (a custom reason too), every field the client may see
/// (a name twice in any case, an application's own), whether or not
/// vigil's reader left them as they came.
#[tokio::test]
async fn a_response_head_reaches_the_client_with_its_reason_and_fields() {
    const ANSWER: &[u8] = b"HTTP/1.1 299 Fine Thanks\r\nServer: up\r\nX-App: 1\r\n\
        set-cookie: a=1\r\nX-Other: two words\r\nSet-Cookie: b=2\r\nContent-Length: 2\r\n\
        X-Pad: gone\r\nConnection: close\r\n\r\nok";
    let t = twin(ANSWER).await;
    let mut heads = Vec::new();
    for addr in [t.vigil.addr, t.nginx.addr] {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(b"GET /raw HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
            .await
            .expect("write");
        let got = read_all(&mut s).await;
        let text = String::from_utf8_lossy(&got).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").expect("a whole head");
        assert_eq!(body, "ok", "{addr}: {text}");
        let mut lines = head.split("\r\n");
        let status = lines.next().unwrap_or_default().to_owned();
        let mut fields: Vec<String> = lines
            .map(|l| {
                let (n, v) = l.split_once(':').unwrap_or((l, ""));
                format!("{}:{}", n.to_ascii_lowercase(), v.trim())
            })
            .filter(|f| !f.starts_with("date:") && !f.starts_with("server:"))
            .filter(|f| !f.starts_with("connection:"))
            .collect();
        fields.sort();
        heads.push((status, fields));
    }
    assert_eq!(heads[0], heads[1], "vigil, then nginx");
    assert_eq!(heads[0].0, "HTTP/1.1 299 Fine Thanks");
    assert_eq!(
        heads[0].1,
        [
            "content-length:2",
            "set-cookie:a=1",
            "set-cookie:b=2",
            "x-app:1",
            "x-other:two words"
        ]
    );
}

/// A chunked body off the client's wire (as both proxies write one): its
/// data, and whether it ended with its last chunk.
fn unchunk(mut b: &[u8]) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    loop {
        let Some(eol) = b.windows(2).position(|w| w == b"\r\n") else {
            return (out, false);
        };
        let Ok(size) = usize::from_str_radix(&String::from_utf8_lossy(&b[..eol]), 16) else {
            return (out, false);
        };
        if size == 0 {
            return (out, &b[eol..] == b"\r\n\r\n");
        }
        let data = &b[eol + 2..];
        if data.len() < size + 2 {
            out.extend_from_slice(&data[..data.len().min(size)]);
            return (out, false);
        }
        out.extend_from_slice(&data[..size]);
        b = &data[size + 2..];
    }
}

/// An upstream's chunked body read by nginx's rules (`ngx_http_parse_chunked`):
/// bare LFs, whitespace before an extension, leading zeros and trailer lines
/// that are not fields pass; a bad size line or data not followed by its
/// line end cut the client's body short, on both.
#[tokio::test]
async fn an_upstreams_chunked_body_is_read_as_nginx_reads_it() {
    for (answer, complete) in [
        (
            &b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5 ;x\nhello\n6\r\n world\n0\n\n"[..],
            true,
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\t\r\nhello\r\n0;last\r\n\r\n",
            true,
        ),
        // Trailer lines nginx does not judge: the body ends with them.
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nbad trailer\r\n\r\n",
            true,
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n00000000000000000005\r\nhello\r\n0\r\n\r\n",
            true,
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\nabc\r\n0\r\n\r\n",
            false,
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloX\r\n0\r\n\r\n",
            false,
        ),
    ] {
        let answer: &'static [u8] = Box::leak(answer.to_vec().into_boxed_slice());
        let t = twin(answer).await;
        let (v, n) = t
            .send(b"GET /raw HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
            .await;
        let shown = String::from_utf8_lossy(answer);
        let (vb, nb) = (unchunk(&v.body), unchunk(&n.body));
        assert_eq!((vb.1, nb.1), (complete, complete), "{shown}: {v:?} {n:?}");
        if complete {
            assert_eq!((v.status, n.status), (200, 200), "{shown}");
            assert_eq!(vb.0, nb.0, "{shown}");
        }
        // (Cut short, nginx flushed nothing of a body that broke in the
        // packet of its head, where vigil sends the head and what came
        // before the break: the client sees an incomplete response on both.)
    }
}
