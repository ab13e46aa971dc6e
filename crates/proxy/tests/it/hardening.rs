//! Refuse what nginx refuses, tunnel only where nginx tunnels: each case
//! is the exact bytes of the security issue, sent to vigil and to a stock
//! nginx 1.22 serving the same conf, comparing the status the client got
//! and what the backend saw.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::twin::Twin;

const PLAIN: &str = "upstream u { server {B0}; }
    server { listen {LISTEN};
        location / {
            proxy_pass http://u;
            proxy_set_header X-Real-IP $remote_addr;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
        } }";

fn header<'a>(seen: &'a crate::support::Seen, name: &str) -> Option<&'a str> {
    seen.headers.get(name).and_then(|v| v.to_str().ok())
}

#[tokio::test]
async fn header_names_with_underscores_or_odd_bytes_are_dropped_as_nginx_drops_them() {
    let t = Twin::start(PLAIN, 1).await;
    let (v, n) = t
        .send(b"GET /u HTTP/1.1\r\nHost: a\r\nX_Real_IP: 6.6.6.6\r\nX.Dot: 1\r\nX@At: 1\r\nX-Ok: 1\r\nConnection: close\r\n\r\n")
        .await;
    assert_eq!((v.status, n.status), (200, 200), "{v:?}\n{n:?}");
    let (vs, ns) = t.seen(0);
    for (side, seen) in [("vigil", &vs[0]), ("nginx", &ns[0])] {
        assert_eq!(header(seen, "x_real_ip"), None, "{side}");
        assert_eq!(header(seen, "x-real-ip"), Some("127.0.0.1"), "{side}");
        assert_eq!(header(seen, "x.dot"), None, "{side}");
        assert_eq!(header(seen, "x-ok"), Some("1"), "{side}");
    }
}

#[tokio::test]
async fn every_head_of_a_kept_alive_connection_is_judged() {
    let t = Twin::start(PLAIN, 1).await;
    // A body of 5, then a second request on the same connection.
    let (v, n) = t
        .send(b"POST /one HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhelloGET /two HTTP/1.1\r\nHost: a\r\nX_Real_IP: 6.6.6.6\r\nConnection: close\r\n\r\n")
        .await;
    assert_eq!((v.status, n.status), (200, 200));
    let (vs, ns) = t.seen(0);
    for (side, seen) in [("vigil", &vs), ("nginx", &ns)] {
        let uris: Vec<&str> = seen.iter().map(|s| s.uri.as_str()).collect();
        assert_eq!(uris, ["/one", "/two"], "{side}");
        assert_eq!(seen[0].body, "hello", "{side}");
        assert_eq!(header(&seen[1], "x_real_ip"), None, "{side}");
    }
}

#[tokio::test]
async fn underscores_in_headers_on_and_ignore_invalid_headers_off_pass_them_on() {
    let conf = |directive: &str| {
        format!(
            "upstream u {{ server {{B0}}; }}
             server {{ listen {{LISTEN}}; {directive}
                 location / {{ proxy_pass http://u; }} }}"
        )
    };
    let req =
        b"GET / HTTP/1.1\r\nHost: a\r\nX_Real_IP: 6.6.6.6\r\nX.Dot: 1\r\nConnection: close\r\n\r\n";
    let t = Twin::start(&conf("underscores_in_headers on;"), 1).await;
    let (v, n) = t.send(req).await;
    assert_eq!((v.status, n.status), (200, 200));
    let (vs, ns) = t.seen(0);
    for seen in [&vs[0], &ns[0]] {
        assert_eq!(header(seen, "x_real_ip"), Some("6.6.6.6"));
        assert_eq!(header(seen, "x.dot"), None);
    }
    let t = Twin::start(&conf("ignore_invalid_headers off;"), 1).await;
    let (v, n) = t.send(req).await;
    assert_eq!((v.status, n.status), (200, 200));
    let (vs, ns) = t.seen(0);
    for seen in [&vs[0], &ns[0]] {
        assert_eq!(header(seen, "x_real_ip"), Some("6.6.6.6"));
        assert_eq!(header(seen, "x.dot"), Some("1"));
    }
    // A name hyper cannot hold (`@` is not a token byte): nginx passes it
    // on, vigil refuses the request (hyper's 400).
    let v = crate::twin::raw(
        t.vigil.addr,
        b"GET / HTTP/1.1\r\nHost: a\r\nX@At: 1\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(v.status, 400);
}

#[tokio::test]
async fn request_framing_nginx_refuses_is_refused_with_its_status() {
    let t = Twin::start(PLAIN, 1).await;
    let post = |extra: &str, body: &str| {
        format!("POST / HTTP/1.1\r\nHost: a\r\n{extra}Connection: close\r\n\r\n{body}").into_bytes()
    };
    let chunked = "5\r\nhello\r\n0\r\n\r\n";
    let cases: Vec<(&str, Vec<u8>, u16)> = vec![
        (
            "CL with TE",
            post(
                "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
                chunked,
            ),
            400,
        ),
        (
            "TE identity, chunked",
            post("Transfer-Encoding: identity, chunked\r\n", chunked),
            501,
        ),
        (
            "TE gzip, chunked",
            post("Transfer-Encoding: gzip, chunked\r\n", chunked),
            501,
        ),
        ("TE gzip", post("Transfer-Encoding: gzip\r\n", "hello"), 501),
        (
            "TE twice",
            post(
                "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
                chunked,
            ),
            400,
        ),
        (
            "TE with a tab",
            post("Transfer-Encoding:\tchunked\r\n", chunked),
            501,
        ),
        (
            "TE with a trailing tab",
            post("Transfer-Encoding: chunked\t\r\n", chunked),
            501,
        ),
        (
            "TE in capitals",
            post("Transfer-Encoding: CHUNKED\r\n", chunked),
            200,
        ),
        (
            "TE chunked",
            post("Transfer-Encoding: chunked\r\n", chunked),
            200,
        ),
        (
            "CL twice",
            post("Content-Length: 5\r\nContent-Length: 5\r\n", "hello"),
            400,
        ),
        (
            "CL with a sign",
            post("Content-Length: +5\r\n", "hello"),
            400,
        ),
        ("CL negative", post("Content-Length: -1\r\n", ""), 400),
        ("CL list", post("Content-Length: 5, 5\r\n", "hello"), 400),
        ("CL empty", post("Content-Length:\r\n", ""), 400),
        (
            "CL with spaces",
            post("Content-Length:  5  \r\n", "hello"),
            200,
        ),
        (
            "TE in HTTP/1.0",
            b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
                .to_vec(),
            400,
        ),
        (
            "no Host",
            b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n".to_vec(),
            400,
        ),
        ("two Hosts", post("Host: b\r\n", ""), 400),
        (
            "two Authorization",
            post("Authorization: a\r\nAuthorization: b\r\n", ""),
            400,
        ),
        (
            "lower-case method",
            b"get / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n".to_vec(),
            400,
        ),
        (
            "HTTP/2.0 line",
            b"GET / HTTP/2.0\r\nHost: a\r\nConnection: close\r\n\r\n".to_vec(),
            505,
        ),
        (
            "TRACE",
            b"TRACE / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n".to_vec(),
            405,
        ),
        ("space before colon", post("X-A : 1\r\n", ""), 400),
        ("folded line", post("X-A: 1\r\n  more\r\n", ""), 400),
        ("NUL in a value", post("X-A: a\0b\r\n", ""), 400),
        ("name without colon", post("X-Bare\r\n", ""), 200),
    ];
    let mut passed = 0;
    for (what, bytes, expected) in &cases {
        let (v, n) = t.send(bytes).await;
        assert_eq!(n.status, *expected, "nginx, {what}: {n:?}");
        assert_eq!(v.status, n.status, "vigil, {what}: {v:?}");
        if *expected == 200 {
            passed += 1;
        }
    }
    let (vs, ns) = t.seen(0);
    assert_eq!((vs.len(), ns.len()), (passed, passed));
    for (v, n) in vs.iter().zip(&ns) {
        assert_eq!(v.body, n.body);
        assert_eq!(header(v, "x-bare"), header(n, "x-bare"));
    }
}

#[tokio::test]
async fn header_lines_past_large_client_header_buffers_are_refused() {
    let t = Twin::start(PLAIN, 1).await;
    // A header line of exactly `len` bytes with its CRLF.
    let line = |len: usize| format!("X-Long: {}\r\n", "a".repeat(len - 10));
    let head = |lines: &[String]| {
        let mut h = String::from("GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n");
        for l in lines {
            h.push_str(l);
        }
        h.push_str("\r\n");
        h.into_bytes()
    };
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("one line of 8k", head(&[line(8192)])),
        ("one line of 8k + 1", head(&[line(8193)])),
        ("four lines of 8000", head(&vec![line(8000); 4])),
        ("five lines of 8000", head(&vec![line(8000); 5])),
        // (under hyper's 100 header lines, which vigil keeps: past them 431)
        ("90 lines of 300", head(&vec![line(300); 90])),
        // 3 of them fit the first 1k buffer, 27 each of the four 8k ones.
        ("112 lines of 300", head(&vec![line(300); 112])),
        (
            "request line of 8k",
            format!(
                "GET /{} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
                "u".repeat(8192 - 16)
            )
            .into_bytes(),
        ),
        (
            "request line of 8k + 1",
            format!(
                "GET /{} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
                "u".repeat(8193 - 16)
            )
            .into_bytes(),
        ),
    ];
    let mut statuses = Vec::new();
    for (what, bytes) in &cases {
        let (v, n) = t.send(bytes).await;
        assert_eq!(
            v.status, n.status,
            "{what}: vigil {v:?}\nnginx {:?}",
            n.status
        );
        statuses.push(n.status);
    }
    assert_eq!(statuses, [200, 400, 200, 400, 200, 400, 200, 414]);
}

#[tokio::test]
async fn every_x_forwarded_for_line_is_joined() {
    let t = Twin::start(PLAIN, 1).await;
    let (v, n) = t
        .send(b"GET / HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 1.1.1.1\r\nX-Forwarded-For: 2.2.2.2, 3.3.3.3\r\nConnection: close\r\n\r\n")
        .await;
    assert_eq!((v.status, n.status), (200, 200));
    let (vs, ns) = t.seen(0);
    for seen in [&vs[0], &ns[0]] {
        assert_eq!(
            header(seen, "x-forwarded-for"),
            Some("1.1.1.1, 2.2.2.2, 3.3.3.3, 127.0.0.1")
        );
    }
}

// === raw backends ===

/// What a raw backend does after it read a request head.
#[derive(Clone, Copy)]
enum Script {
    /// Write these bytes and close.
    Reply(&'static [u8]),
    /// Write these bytes and keep the connection open, silent.
    Stall(&'static [u8]),
    /// Switch only when asked as RFC 9110 says (HTTP/1.1 with Upgrade and
    /// Connection: upgrade), then echo; else a plain 200.
    Conforming,
    /// Answer 101 whatever was asked, then echo.
    AlwaysSwitch,
}

/// A backend on 127.0.0.1 writing exact bytes; the heads it read.
struct RawBackend {
    addr: SocketAddr,
    heads: Arc<Mutex<Vec<String>>>,
}

impl RawBackend {
    async fn start(script: Script) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let heads = Arc::new(Mutex::new(Vec::new()));
        let h = heads.clone();
        tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                tokio::spawn(serve_raw(s, script, h.clone()));
            }
        });
        Self { addr, heads }
    }

    fn heads(&self) -> Vec<String> {
        self.heads.lock().expect("lock").clone()
    }
}

async fn serve_raw(mut s: TcpStream, script: Script, heads: Arc<Mutex<Vec<String>>>) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let head = String::from_utf8_lossy(&buf).to_lowercase();
    heads.lock().expect("lock").push(head.clone());
    let switch = match script {
        Script::Reply(b) => {
            let _ = s.write_all(b).await;
            return;
        }
        Script::Stall(b) => {
            let _ = s.write_all(b).await;
            // Hold the connection until the peer goes.
            let _ = s.read(&mut chunk).await;
            return;
        }
        Script::AlwaysSwitch => true,
        Script::Conforming => {
            head.lines().next().is_some_and(|l| l.ends_with("http/1.1"))
                && head.contains("\nupgrade: websocket")
                && head.contains("\nconnection: upgrade")
        }
    };
    if !switch {
        let _ = s
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nplain")
            .await;
        return;
    }
    let _ = s
        .write_all(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
        .await;
    loop {
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                let mut out = b"echo:".to_vec();
                out.extend_from_slice(&chunk[..n]);
                if s.write_all(&out).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// A twin whose upstream `r` is a raw backend of its own on each side.
async fn raw_twin(conf: &str, script: Script) -> (Twin, RawBackend, RawBackend) {
    let (vb, nb) = (
        RawBackend::start(script).await,
        RawBackend::start(script).await,
    );
    let t = Twin::start_with(conf, 0, &[("{R0}", vb.addr)], &[("{R0}", nb.addr)]).await;
    (t, vb, nb)
}

/// Read one response head off `s`; its status, and whatever followed it.
async fn read_head(s: &mut TcpStream) -> (u16, Vec<u8>) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tokio::time::timeout_at(deadline, s.read(&mut chunk))
            .await
            .expect("response head in time")
            .expect("read");
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let raw = crate::twin::parse(&buf);
    (raw.status, raw.body)
}

/// Read until `want` has arrived (5 s at most).
async fn read_until(s: &mut TcpStream, mut got: Vec<u8>, want: &[u8]) -> Vec<u8> {
    let mut chunk = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !got.windows(want.len()).any(|w| w == want) {
        match tokio::time::timeout_at(deadline, s.read(&mut chunk)).await {
            Ok(Ok(n)) if n > 0 => got.extend_from_slice(&chunk[..n]),
            _ => break,
        }
    }
    got
}

const UPGRADES: &str = "upstream r { server {R0}; }
    server { listen {LISTEN};
        location /public/ { proxy_pass http://r; }
        location /ws/ {
            proxy_pass http://r;
            proxy_http_version 1.1;
            proxy_set_header Upgrade $http_upgrade;
            proxy_set_header Connection \"upgrade\";
            proxy_read_timeout 1s;
        }
        location /ws10/ {
            proxy_pass http://r;
            proxy_set_header Upgrade $http_upgrade;
            proxy_set_header Connection \"upgrade\";
        } }";

#[tokio::test]
async fn a_tunnel_opens_only_where_the_location_passes_upgrade_on() {
    let (t, vb, nb) = raw_twin(UPGRADES, Script::Conforming).await;
    let ask = |path: &str| {
        format!(
            "GET {path} HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
        )
    };
    for addr in [t.vigil.addr, t.nginx.addr] {
        // Passed on: 101, and bytes go both ways.
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(ask("/ws/chat").as_bytes())
            .await
            .expect("write");
        let (status, rest) = read_head(&mut s).await;
        assert_eq!(status, 101, "{addr}");
        s.write_all(b"PING").await.expect("write");
        let got = read_until(&mut s, rest, b"echo:PING").await;
        assert!(got.ends_with(b"echo:PING"), "{addr}: {got:?}");
        // Not passed on, or passed on in HTTP/1.0: an ordinary response.
        for path in ["/public/x", "/ws10/x"] {
            let mut s = TcpStream::connect(addr).await.expect("connect");
            s.write_all(ask(path).as_bytes()).await.expect("write");
            let (status, _) = read_head(&mut s).await;
            assert_eq!(status, 200, "{addr} {path}");
        }
    }
    // What each backend was asked: Upgrade only by the /ws/ location.
    for heads in [vb.heads(), nb.heads()] {
        let asked: Vec<bool> = heads.iter().map(|h| h.contains("\nupgrade:")).collect();
        let http11_upgrade = heads
            .iter()
            .filter(|h| {
                h.contains("\nupgrade:")
                    && h.lines().next().is_some_and(|l| l.ends_with("http/1.1"))
            })
            .count();
        assert_eq!(asked.len(), 3, "{heads:?}");
        assert!(
            !heads[1].contains("\nupgrade:"),
            "/public/ passed Upgrade on: {heads:?}"
        );
        assert_eq!(http11_upgrade, 1, "{heads:?}");
    }
}

#[tokio::test]
async fn an_h2c_upgrade_cannot_smuggle_a_request_past_the_location() {
    let (t, vb, nb) = raw_twin(UPGRADES, Script::Conforming).await;
    let attack = b"GET /public/ HTTP/1.1\r\nHost: a\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\nConnection: Upgrade, HTTP2-Settings\r\n\r\n\
GET /internal/secret HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n";
    for addr in [t.vigil.addr, t.nginx.addr] {
        let raw = crate::twin::raw(addr, attack).await;
        assert_eq!(raw.status, 200, "{addr}: {raw:?}");
    }
    for heads in [vb.heads(), nb.heads()] {
        assert!(
            heads.iter().all(|h| !h.contains("/internal/secret")),
            "{heads:?}"
        );
        assert!(heads.iter().all(|h| !h.contains("\nupgrade:")), "{heads:?}");
    }
}

#[tokio::test]
async fn a_switch_the_request_did_not_ask_for_is_a_502() {
    // A backend that answers 101 to anything. nginx 1.22 relays it raw
    // when its client sent Upgrade, even though nginx did not pass Upgrade
    // on (`u->upgrade` only looks at the client's header); vigil refuses
    // the switch it did not ask for.
    let (t, _vb, _nb) = raw_twin(UPGRADES, Script::AlwaysSwitch).await;
    let req =
        b"GET /public/ HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n";
    let mut s = TcpStream::connect(t.nginx.addr).await.expect("connect");
    s.write_all(req).await.expect("write");
    assert_eq!(read_head(&mut s).await.0, 101, "nginx tunnels it");
    let mut s = TcpStream::connect(t.vigil.addr).await.expect("connect");
    s.write_all(req).await.expect("write");
    assert_eq!(read_head(&mut s).await.0, 502, "vigil does not");
}

/// Everything vigil logs while the guard lives (the test's runtime runs
/// the proxy on this thread).
fn capture() -> (tracing::subscriber::DefaultGuard, Arc<Mutex<Vec<u8>>>) {
    #[derive(Clone)]
    struct Sink(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Sink {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("lock").extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let buf = Arc::new(Mutex::new(Vec::new()));
    let sink = Sink(buf.clone());
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .with_writer(move || sink.clone())
        .finish();
    (tracing::subscriber::set_default(subscriber), buf)
}

fn text(buf: &Arc<Mutex<Vec<u8>>>) -> String {
    String::from_utf8_lossy(&buf.lock().expect("lock")).into_owned()
}

#[tokio::test]
async fn an_idle_tunnel_is_closed_after_proxy_read_timeout() {
    let (_guard, log) = capture();
    let (t, _vb, _nb) = raw_twin(UPGRADES, Script::Conforming).await;
    for addr in [t.vigil.addr, t.nginx.addr] {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(
            b"GET /ws/ HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
        )
        .await
        .expect("write");
        assert_eq!(read_head(&mut s).await.0, 101, "{addr}");
        // Quiet in both directions: the proxy closes (proxy_read_timeout 1s).
        let mut rest = Vec::new();
        let closed = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut rest)).await;
        assert!(closed.is_ok(), "{addr} kept an idle tunnel open");
    }
    let ours = text(&log);
    assert!(
        ours.contains(
            "upstream timed out (110: Connection timed out) while proxying upgraded connection"
        ),
        "{ours}"
    );
    let theirs = t.stock.error_log();
    assert!(
        theirs.contains(
            "upstream timed out (110: Connection timed out) while proxying upgraded connection"
        ),
        "{theirs}"
    );
}

#[tokio::test]
async fn a_chunked_response_with_a_length_is_sent_whole() {
    let (t, _vb, _nb) = raw_twin(
        "upstream r { server {R0}; } server { listen {LISTEN}; location / { proxy_pass http://r; } }",
        Script::Reply(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
    )
    .await;
    let (v, n) = t
        .send(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        .await;
    for (side, r) in [("vigil", &v), ("nginx", &n)] {
        assert_eq!(r.status, 200, "{side}");
        assert_eq!(r.header("content-length"), "", "{side}: {r:?}");
        assert_eq!(r.header("transfer-encoding"), "chunked", "{side}: {r:?}");
        assert_eq!(dechunk(&r.body), b"hello", "{side}: {r:?}");
    }
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(eol) = b.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let size = usize::from_str_radix(std::str::from_utf8(&b[..eol]).unwrap_or("0").trim(), 16)
            .unwrap_or(0);
        if size == 0 || b.len() < eol + 2 + size {
            return out;
        }
        out.extend_from_slice(&b[eol + 2..eol + 2 + size]);
        b = &b[(eol + 4 + size).min(b.len())..];
    }
}

#[tokio::test]
async fn body_failures_after_the_header_are_logged_in_nginx_words() {
    let cases: [(&str, Script, &str); 3] = [
        (
            "cut short",
            Script::Reply(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhello"),
            "upstream prematurely closed connection while reading upstream",
        ),
        (
            "bad chunk",
            Script::Reply(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nZZ\r\n",
            ),
            "upstream sent invalid chunked response while reading upstream",
        ),
        (
            "read timeout",
            Script::Stall(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhello"),
            "upstream timed out (110: Connection timed out) while reading upstream",
        ),
    ];
    for (what, script, words) in cases {
        let (_guard, log) = capture();
        let (t, _vb, _nb) = raw_twin(
            "upstream r { server {R0}; }
             server { listen {LISTEN}; proxy_read_timeout 1s; location / { proxy_pass http://r; } }",
            script,
        )
        .await;
        let (v, n) = t
            .send(b"GET /x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
            .await;
        // nginx (proxy_buffering on) reads the bad chunk before it sends
        // the header and closes without one; vigil streams, so the client
        // gets the head if it went out before the bad chunk arrived.
        let bad_chunk = what == "bad chunk";
        assert_eq!(n.status, if bad_chunk { 0 } else { 200 }, "{what}");
        assert!(
            v.status == 200 || (bad_chunk && v.status == 0),
            "{what}: {v:?}"
        );
        let ours = text(&log);
        let line = ours.lines().find(|l| l.contains(words));
        let line = line.unwrap_or_else(|| panic!("{what}: vigil logged no \"{words}\":\n{ours}"));
        assert!(line.contains("ERROR"), "{what}: {line}");
        assert!(
            line.contains("request: \"GET /x HTTP/1.1\""),
            "{what}: {line}"
        );
        assert!(line.contains("client: 127.0.0.1"), "{what}: {line}");
        // The peer and its upstream, from the attempt's guard.
        assert!(
            line.contains("upstream: \"127.0.0.1:") && line.contains("\" (r), host: \"a\""),
            "{what}: {line}"
        );
        let theirs = t.stock.error_log();
        assert!(
            theirs.contains(words),
            "{what}: nginx logged otherwise:\n{theirs}"
        );
    }
}

#[tokio::test]
async fn http2_requests_drop_the_same_header_names() {
    // HTTP/2 bypasses the HTTP/1 gate; nginx's ngx_http_v2_validate_header
    // applies the same name rule there. (No Upgrade exists in HTTP/2.)
    let b = crate::support::Backend::named("h2").await;
    let p = crate::support::start_proxy(&format!(
        "http {{ upstream u {{ server {}; }} server {{ listen {{LISTEN}}; location / {{ proxy_pass http://u; }} }} }}",
        b.addr
    ))
    .await;
    let stream = TcpStream::connect(p.addr).await.expect("connect");
    let (mut sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .expect("h2 handshake");
    tokio::spawn(conn);
    // :authority only: with a Host header too, nginx (and vigil) answer 400.
    let mut req = http::Request::builder()
        .uri("http://x/")
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .expect("request");
    req.headers_mut()
        .insert("x_real_ip", http::HeaderValue::from_static("6.6.6.6"));
    req.headers_mut()
        .insert("x-ok", http::HeaderValue::from_static("1"));
    let resp = sender.send_request(req).await.expect("response");
    assert_eq!(resp.status(), 200);
    let seen = b.requests();
    assert_eq!(header(&seen[0], "x_real_ip"), None);
    assert_eq!(header(&seen[0], "x-ok"), Some("1"));
}
