//! Only the upstream's behaviour is evidence against a peer: what the
//! client did, or vigil's own inability to send, never is. Side by side
//! with stock nginx on the same conf and the same bytes:
//!
//! - a URI with bytes a `Uri` refuses (a space, `<`, DEL, from a `$1` of
//!   `proxy_pass`) is sent as nginx sends it, and nobody is charged;
//! - a URI that would split the request line (CR, LF from `%0d%0a`) is
//!   vigil's to refuse: 500, no peer contacted (nginx sends it);
//! - a streamed upload (`proxy_request_buffering off`) the client abandons
//!   or breaks is the client's: 400 as nginx, no retry, nothing charged.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::support::eventually;
use crate::twin::{Addressed, PerSide};

/// A backend on raw TCP that records each request line and what became of
/// the connection; it answers 200 right after the head (`answer`), or
/// reads the body until the proxy closes.
#[derive(Clone)]
struct Raw {
    addr: SocketAddr,
    lines: Arc<Mutex<Vec<Vec<u8>>>>,
    /// Connections that ended (EOF or reset) without an answer.
    ended: Arc<Mutex<usize>>,
}

impl Raw {
    async fn start(answer: bool) -> Self {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let raw = Self {
            addr: l.local_addr().expect("addr"),
            lines: Arc::default(),
            ended: Arc::default(),
        };
        let r = raw.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let r = r.clone();
                tokio::spawn(async move {
                    let mut got = Vec::new();
                    let mut b = [0u8; 4096];
                    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                        match s.read(&mut b).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => got.extend_from_slice(&b[..n]),
                        }
                    }
                    let line = got.split(|&c| c == b'\n').next().unwrap_or_default();
                    r.lines
                        .lock()
                        .expect("lock")
                        .push(line.strip_suffix(b"\r").unwrap_or(line).to_vec());
                    if answer {
                        let _ = s
                            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
                            .await;
                        return;
                    }
                    loop {
                        match s.read(&mut b).await {
                            Ok(0) | Err(_) => break,
                            Ok(_) => {}
                        }
                    }
                    *r.ended.lock().expect("lock") += 1;
                });
            }
        });
        raw
    }

    fn lines(&self) -> Vec<String> {
        self.lines
            .lock()
            .expect("lock")
            .iter()
            .map(|l| String::from_utf8_lossy(l).into_owned())
            .collect()
    }

    fn ended(&self) -> usize {
        *self.ended.lock().expect("lock")
    }
}

impl Addressed for Raw {
    fn addr(&self) -> SocketAddr {
        self.addr
    }
}

type Sides = PerSide<Raw>;

/// Two raw backends a side (answering, or reading until the proxy
/// closes); each side logs `$status $upstream_status`; `options` go on the
/// listen line, `location` is the server's location.
async fn start_on(options: &str, answer: bool, location: &str) -> Sides {
    let conf = format!(
        "log_format st '$status $upstream_status';\n\
         upstream u {{ server {{R0}} max_fails=1; server {{R1}} max_fails=1; }}\n\
         server {{ listen {{LISTEN}}{options}; access_log {{LOG}} st;\n{location}\n}}"
    );
    let vigil = [Raw::start(answer).await, Raw::start(answer).await];
    let nginx = [Raw::start(answer).await, Raw::start(answer).await];
    PerSide::start(&conf, vigil, nginx).await
}

async fn start(answer: bool, location: &str) -> Sides {
    start_on("", answer, location).await
}

/// The target of a request line (`GET /a b HTTP/1.0` -> `/a b`).
fn target(line: &str) -> String {
    let rest = line.split_once(' ').map_or("", |(_, r)| r);
    rest.rsplit_once(' ').map_or(rest, |(t, _)| t).to_string()
}

/// Send `bytes` and read what comes back until the connection closes.
async fn exchange(addr: SocketAddr, bytes: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(bytes).await.expect("send");
    let mut got = Vec::new();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), s.read_to_end(&mut got)).await;
    String::from_utf8_lossy(&got).into_owned()
}

#[tokio::test]
async fn a_uri_a_uri_type_refuses_is_sent_as_nginx_sends_it_and_nobody_is_charged() {
    let s = start(true, "location ~ ^/x/(.*)$ { proxy_pass http://u/$1; }").await;
    // A space, `<`, `>`, a backquote, DEL and a tab, each from a %XX.
    for (i, path) in ["/x/a%20b", "/x/%3Cs%3E", "/x/a%60b%7F", "/x/a%09b"]
        .iter()
        .enumerate()
    {
        let req = format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
        let v = exchange(s.twin.vigil.addr, req.as_bytes()).await;
        let n = exchange(s.twin.nginx.addr, req.as_bytes()).await;
        assert!(n.starts_with("HTTP/1.1 200"), "{path}: nginx: {n}");
        assert!(v.starts_with("HTTP/1.1 200"), "{path}: vigil: {v}");
        // Round robin: request i went to backend i % 2 on both sides.
        let (vl, nl) = (s.vigil[i % 2].lines(), s.nginx[i % 2].lines());
        assert_eq!(
            vl.last().map(|l| target(l)),
            nl.last().map(|l| target(l)),
            "{path}: the target the backend saw"
        );
    }
    assert_eq!(s.fails(), [0, 0], "nobody charged");
}

#[tokio::test]
async fn a_uri_that_would_split_the_request_line_is_refused_without_a_peer() {
    // (`.` stops at a newline: the capture takes any byte.)
    let s = start(
        true,
        "location ~ ^/x/([\\s\\S]*)$ { proxy_pass http://u/$1; }",
    )
    .await;
    let req = b"GET /x/a%0d%0aX-Injected:%201 HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";
    let v = exchange(s.twin.vigil.addr, req).await;
    assert!(v.starts_with("HTTP/1.1 500"), "{v}");
    assert!(
        s.vigil.iter().all(|r| r.lines().is_empty()),
        "no peer contacted"
    );
    assert_eq!(s.fails(), [0, 0], "nobody charged");
    // (nginx sends the CR LF on: its backend sees a split request line.
    // A deliberate difference, docs/security.md.)
    let n = exchange(s.twin.nginx.addr, req).await;
    let seen: Vec<String> = s.nginx.iter().flat_map(Raw::lines).collect();
    assert_eq!(seen, ["GET /a"], "nginx split it: {n}");
}

/// A streamed upload broken by the client after part of its body, on both
/// sides: what the access logs say, and who was tried.
async fn broken_upload(tail: &[u8], chunked: bool) -> (Vec<String>, Vec<String>, Sides) {
    let s = start(
        false,
        // (HTTP/1.1 upstream: nginx streams a chunked body only so.)
        "location / { proxy_pass http://u; proxy_request_buffering off; proxy_http_version 1.1; \
         proxy_next_upstream error timeout non_idempotent; }",
    )
    .await;
    for (addr, raws, side) in s.sides() {
        let mut c = TcpStream::connect(addr).await.expect("connect");
        let head: &[u8] = if chunked {
            b"POST /up HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n"
        } else {
            b"POST /up HTTP/1.1\r\nHost: t\r\nContent-Length: 100000\r\n\r\nhello"
        };
        c.write_all(head).await.expect("send");
        eventually(&format!("{side}: the upload at a backend"), || {
            raws.iter().map(|r| r.lines().len()).sum::<usize>() == 1
        })
        .await;
        if tail.is_empty() {
            drop(c);
        } else {
            c.write_all(tail).await.expect("send");
            let mut rest = Vec::new();
            let _ =
                tokio::time::timeout(std::time::Duration::from_secs(5), c.read_to_end(&mut rest))
                    .await;
        }
        eventually(&format!("{side}: the upstream connection closed"), || {
            raws.iter().map(Raw::ended).sum::<usize>() == 1
        })
        .await;
        eventually(&format!("{side}: the log line"), || !s.log(side).is_empty()).await;
        assert_eq!(
            raws.iter().map(|r| r.lines().len()).sum::<usize>(),
            1,
            "{side}: no other peer tried"
        );
    }
    (s.log("vigil"), s.log("nginx"), s)
}

#[tokio::test]
async fn a_streamed_upload_the_client_abandons_is_the_clients_as_nginx() {
    let (v, n, s) = broken_upload(b"", false).await;
    assert_eq!(n, ["400 -"], "nginx");
    assert_eq!(v, n, "vigil as nginx");
    assert_eq!(s.fails(), [0, 0], "nobody charged");
}

#[tokio::test]
async fn a_streamed_upload_with_a_bad_chunk_is_the_clients_as_nginx() {
    let (v, n, s) = broken_upload(b"ZZ\r\nnot hex\r\n", true).await;
    assert_eq!(n, ["400 -"], "nginx");
    assert_eq!(v, n, "vigil as nginx");
    assert_eq!(s.fails(), [0, 0], "nobody charged");
}

/// A request body fed through a channel: dropping the sender without an
/// end leaves it unfinished.
struct Fed(tokio::sync::mpsc::Receiver<bytes::Bytes>);

impl hyper::body::Body for Fed {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<bytes::Bytes>, Self::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|d| d.map(|d| Ok(hyper::body::Frame::data(d))))
    }
}

#[tokio::test]
async fn an_http2_upload_the_client_cancels_is_the_clients_as_nginx() {
    let s = start_on(
        " http2",
        false,
        "location / { proxy_pass http://u; proxy_request_buffering off; proxy_http_version 1.1; \
         proxy_next_upstream error timeout non_idempotent; }",
    )
    .await;
    for (addr, raws, side) in s.sides() {
        let io = hyper_util::rt::TokioIo::new(TcpStream::connect(addr).await.expect("connect"));
        let (mut tx, conn) =
            hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
                .await
                .expect("h2 handshake");
        tokio::spawn(conn);
        let (feed, rx) = tokio::sync::mpsc::channel(4);
        let req = http::Request::post(format!("http://{addr}/up"))
            .header("content-length", "100000")
            .body(Fed(rx))
            .expect("request");
        let sent = tokio::spawn(async move { tx.send_request(req).await.map(|_| ()) });
        feed.send(bytes::Bytes::from_static(b"hello"))
            .await
            .expect("feed");
        eventually(&format!("{side}: the upload at a backend"), || {
            raws.iter().map(|r| r.lines().len()).sum::<usize>() == 1
        })
        .await;
        // The response future dropped: hyper resets the stream (CANCEL).
        sent.abort();
        drop(feed);
        eventually(&format!("{side}: the upstream connection closed"), || {
            raws.iter().map(Raw::ended).sum::<usize>() == 1
        })
        .await;
        eventually(&format!("{side}: the log line"), || !s.log(side).is_empty()).await;
        assert_eq!(
            raws.iter().map(|r| r.lines().len()).sum::<usize>(),
            1,
            "{side}: no other peer tried"
        );
    }
    let (v, n) = (s.log("vigil"), s.log("nginx"));
    assert_eq!(n, ["400 -"], "nginx logs a reset stream's upload 400");
    assert_eq!(v, n, "vigil as nginx");
    assert_eq!(s.fails(), [0, 0], "nobody charged");
}
