//! Client timeouts over real sockets, side by side with stock nginx on the
//! same conf (1 s timeouts, bounded waits): what the client receives and
//! when the connection is closed; what the backends saw. The exact
//! deadlines are tested in paused time beside the code (`conn/tests.rs`).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::support::{eventually, get, start_proxy};
use crate::twin::{Nginx, Twin};

/// The client timeouts of every conf here.
const CLIENT: &str = "client_header_timeout 1s; client_body_timeout 1s; send_timeout 1s;";

/// A conf with `keepalive_timeout ka` and three locations: `/` buffers the
/// request body, `/nb/` streams it, `/ka0/` has `keepalive_timeout 0`.
fn conf(ka: &str, upstream: &str) -> String {
    format!(
        "{CLIENT} keepalive_timeout {ka};
         upstream u {{ {upstream} }}
         server {{ listen {{LISTEN}};
           location / {{ proxy_pass http://u; }}
           location /nb/ {{ proxy_request_buffering off; proxy_pass http://u; }}
           location /ka0/ {{ keepalive_timeout 0; proxy_pass http://u; }} }}"
    )
}

/// What a client read, and whether the proxy closed the connection.
#[derive(Debug, PartialEq, Eq)]
struct Read {
    text: String,
    closed: bool,
}

/// Read until the proxy closes the connection, or `within` passes.
async fn until_closed(s: &mut TcpStream, within: Duration) -> Read {
    let mut got = Vec::new();
    let mut buf = [0u8; 16384];
    let closed = tokio::time::timeout(within, async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .is_ok();
    Read {
        text: String::from_utf8_lossy(&got).into_owned(),
        closed,
    }
}

/// Read one response whose body has a Content-Length (or until close).
async fn response(s: &mut TcpStream) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&got).into_owned();
        if let Some(end) = text.find("\r\n\r\n") {
            let len = text[..end].lines().find_map(|l| {
                let (n, v) = l.split_once(':')?;
                n.eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse::<usize>().ok())?
            });
            if len.is_some_and(|n| got.len() >= end + 4 + n) {
                return text;
            }
        }
        match tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => got.extend_from_slice(&buf[..n]),
            _ => return text,
        }
    }
}

fn status(resp: &str) -> u16 {
    resp.split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

fn has_header(resp: &str, name: &str, value: &str) -> bool {
    resp.lines().any(|l| {
        l.split_once(':').is_some_and(|(n, v)| {
            n.eq_ignore_ascii_case(name) && v.trim().eq_ignore_ascii_case(value)
        })
    })
}

/// Long enough for a 1 s timeout, short enough to tell it from none.
const WAIT: Duration = Duration::from_secs(4);

#[tokio::test]
async fn a_silent_connection_is_closed_with_nothing_sent_as_nginx_does() {
    let t = Twin::start(&conf("75s", "server {B0};"), 1).await;
    let silent = |addr: SocketAddr| async move {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        until_closed(&mut s, WAIT).await
    };
    let (v, n) = tokio::join!(silent(t.vigil.addr), silent(t.nginx.addr));
    let closed = Read {
        text: String::new(),
        closed: true,
    };
    assert_eq!(n, closed, "nginx");
    assert_eq!(v, closed, "vigil");
}

#[tokio::test]
async fn a_header_trickled_byte_by_byte_is_closed_at_client_header_timeout() {
    let t = Twin::start(&conf("75s", "server {B0};"), 1).await;
    let trickle = |addr: SocketAddr| async move {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        // 40 bytes, one per 100 ms: never a whole header within 1 s.
        for b in b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaa\r\n" {
            if s.write_all(&[*b]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        until_closed(&mut s, WAIT).await
    };
    let (v, n) = tokio::join!(trickle(t.vigil.addr), trickle(t.nginx.addr));
    assert_eq!((n.text.as_str(), n.closed), ("", true), "nginx");
    assert_eq!(v, n, "vigil");
    assert_eq!(t.uris(), (vec![vec![]], vec![vec![]]));
}

#[tokio::test]
async fn an_idle_kept_alive_connection_is_closed_at_keepalive_timeout() {
    let t = Twin::start(&conf("1s", "server {B0};"), 1).await;
    let idle = |addr: SocketAddr| async move {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .expect("write");
        let r = response(&mut s).await;
        (
            status(&r),
            has_header(&r, "connection", "close"),
            until_closed(&mut s, WAIT).await,
        )
    };
    let (v, n) = tokio::join!(idle(t.vigil.addr), idle(t.nginx.addr));
    let kept_then_closed = (
        200,
        false,
        Read {
            text: String::new(),
            closed: true,
        },
    );
    assert_eq!(n, kept_then_closed, "nginx");
    assert_eq!(v, kept_then_closed, "vigil");
}

#[tokio::test]
async fn keepalive_timeout_0_answers_connection_close_and_closes() {
    let t = Twin::start(&conf("75s", "server {B0};"), 1).await;
    let once = |addr: SocketAddr| async move {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(b"GET /ka0/ HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .expect("write");
        let r = response(&mut s).await;
        (
            status(&r),
            has_header(&r, "connection", "close"),
            until_closed(&mut s, WAIT).await.closed,
        )
    };
    let (v, n) = tokio::join!(once(t.vigil.addr), once(t.nginx.addr));
    assert_eq!(n, (200, true, true), "nginx");
    assert_eq!(v, n, "vigil");
}

#[tokio::test]
async fn the_first_byte_of_the_next_request_starts_client_header_timeout() {
    // keepalive_timeout 10s would keep the connection; the header timer
    // (1 s from the first byte) closes it.
    let t = Twin::start(&conf("10s", "server {B0};"), 1).await;
    let partial = |addr: SocketAddr| async move {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .expect("write");
        let r = response(&mut s).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        s.write_all(b"GE").await.expect("write");
        (status(&r), until_closed(&mut s, WAIT).await)
    };
    let (v, n) = tokio::join!(partial(t.vigil.addr), partial(t.nginx.addr));
    let closed = (
        200,
        Read {
            text: String::new(),
            closed: true,
        },
    );
    assert_eq!(n, closed, "nginx");
    assert_eq!(v, closed, "vigil");
}

#[tokio::test]
async fn a_request_body_that_stalls_is_closed_without_a_response_as_nginx_does() {
    let t = Twin::start(&conf("75s", "server {B0};"), 1).await;
    let stall = |addr: SocketAddr, path: &'static str| async move {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        let head = format!("POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc");
        s.write_all(head.as_bytes()).await.expect("write");
        until_closed(&mut s, WAIT).await
    };
    // nginx logs 408 and sends nothing (ngx_http_finalize_request ->
    // ngx_http_terminate_request for NGX_HTTP_REQUEST_TIME_OUT).
    let closed = Read {
        text: String::new(),
        closed: true,
    };
    for path in ["/buffered", "/nb/streamed"] {
        let (v, n) = tokio::join!(stall(t.vigil.addr, path), stall(t.nginx.addr, path));
        assert_eq!(n, closed, "nginx {path}");
        assert_eq!(v, closed, "vigil {path}");
    }
    // The buffered body never reached the backend; the streamed one did, and
    // its upstream connection was closed (the backend's read of it failed).
    eventually("the backends to see the streamed request", || {
        t.uris()
            == (
                vec![vec!["/nb/streamed".into()]],
                vec![vec!["/nb/streamed".into()]],
            )
    })
    .await;
}

#[tokio::test]
async fn a_streamed_body_that_times_out_does_not_count_against_the_peer() {
    // Two peers, one failure excludes: a body timeout charged to b0 would
    // send the next two requests both to b1.
    let t = Twin::start(
        &conf(
            "75s",
            "server {B0} max_fails=1 fail_timeout=30s; server {B1} max_fails=1 fail_timeout=30s;",
        ),
        2,
    )
    .await;
    let stall = |addr: SocketAddr| async move {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(b"POST /nb/stall HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc")
            .await
            .expect("write");
        until_closed(&mut s, WAIT).await.closed
    };
    let (v, n) = tokio::join!(stall(t.vigil.addr), stall(t.nginx.addr));
    assert!(v && n);
    for i in 0..2 {
        let (v, n) = t
            .send(
                format!("GET /next{i} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
            )
            .await;
        assert_eq!((v.status, n.status), (200, 200));
    }
    let (v, n) = t.uris();
    // Round robin goes on b0, b1, b0: b0 was not excluded.
    let rotation: Vec<Vec<String>> = vec![
        vec!["/nb/stall".into(), "/next1".into()],
        vec!["/next0".into()],
    ];
    assert_eq!(n, rotation, "nginx");
    assert_eq!(v, rotation, "vigil");
}

/// A backend that answers `/big` with 256 MiB, written until the proxy
/// closes the connection; `cut` is set when a write fails.
async fn endless_backend() -> (SocketAddr, Arc<AtomicBool>) {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("addr");
    let cut = Arc::new(AtomicBool::new(false));
    let c = cut.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let c = c.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let resp = b"HTTP/1.1 200 OK\r\nContent-Length: 268435456\r\n\r\n";
                if s.write_all(resp).await.is_err() {
                    return;
                }
                let chunk = vec![b'x'; 65536];
                for _ in 0..4096 {
                    if s.write_all(&chunk).await.is_err() {
                        c.store(true, Ordering::SeqCst);
                        return;
                    }
                }
            });
        }
    });
    (addr, cut)
}

/// Ask for `/big`, read a little, then stop reading; wait for the proxy to
/// cut the backend, then read what is left: (bytes received, closed).
async fn stop_reading(addr: SocketAddr, cut: &AtomicBool) -> (usize, bool) {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(16 * 1024).expect("rcvbuf");
    let mut s = socket.connect(addr).await.expect("connect");
    s.write_all(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    let mut first = [0u8; 1024];
    let _ = s.read(&mut first).await.expect("first bytes");
    eventually("the proxy to close the backend connection", || {
        cut.load(Ordering::SeqCst)
    })
    .await;
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut rest))
        .await
        .is_ok();
    (1024 + rest.len(), closed)
}

#[tokio::test]
async fn a_client_that_stops_reading_is_cut_after_send_timeout_and_the_upstream_released() {
    let conf = |backend: SocketAddr| {
        format!(
            "{CLIENT} upstream u {{ server {backend}; keepalive 4; }}
             server {{ listen {{LISTEN}};
               location / {{ proxy_buffering off; proxy_http_version 1.1;
                             proxy_set_header Connection \"\"; proxy_pass http://u; }} }}"
        )
    };
    let (vb, v_cut) = endless_backend().await;
    let (nb, n_cut) = endless_backend().await;
    let running = start_proxy(&format!("http {{ {} }}", conf(vb))).await;
    let naddr = vigil_testkit::free_addr();
    let _nginx = Nginx::start(&conf(nb).replace("{LISTEN}", &naddr.to_string()), naddr).await;
    let (v, n) = tokio::join!(
        stop_reading(running.addr, &v_cut),
        stop_reading(naddr, &n_cut)
    );
    let whole = 268_435_456;
    assert!(n.1 && n.0 < whole, "nginx cut the client: {n:?}");
    assert!(v.1 && v.0 < whole, "vigil cut the client: {v:?}");
    let generation = running.proxy.current();
    let peer = generation.registry.get("u").expect("u").peers()[0].clone();
    eventually("the peer's connection count to drop", || peer.conns() == 0).await;
    assert_eq!(
        get(running.addr, "/small").await.status,
        200,
        "the proxy still serves"
    );
}

#[tokio::test]
async fn eleven_hundred_silent_connections_are_closed_and_the_proxy_still_answers() {
    // The figure; the test process needs two descriptors per connection.
    let _ = rlimit::increase_nofile_limit(8192);
    let b = crate::support::Backend::named("b").await;
    let p = start_proxy(&format!(
        "http {{ client_header_timeout 1s; upstream u {{ server {}; }}
           server {{ listen {{LISTEN}}; location / {{ proxy_pass http://u; }} }} }}",
        b.addr
    ))
    .await;
    let mut silent = Vec::with_capacity(1100);
    for _ in 0..1100 {
        silent.push(TcpStream::connect(p.addr).await.expect("connect"));
    }
    assert_eq!(get(p.addr, "/").await.status, 200, "answers meanwhile");
    let reads: Vec<_> = silent
        .into_iter()
        .map(|mut s| {
            tokio::spawn(async move { until_closed(&mut s, Duration::from_secs(10)).await })
        })
        .collect();
    let mut open = 0;
    for r in reads {
        let r = r.await.expect("join");
        assert_eq!(r.text, "");
        open += usize::from(!r.closed);
    }
    assert_eq!(open, 0, "every silent connection was closed");
    assert_eq!(get(p.addr, "/").await.status, 200, "and answers after");
}

#[tokio::test]
async fn the_whole_header_may_not_exceed_large_client_header_buffers() {
    let t = Twin::start(
        "large_client_header_buffers 2 8k;
         upstream u { server {B0}; }
         server { listen {LISTEN}; location / { proxy_pass http://u; } }",
        1,
    )
    .await;
    let with_lines = |n: usize| {
        let mut r = String::from("GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n");
        for i in 0..n {
            r.push_str(&format!("X-Fill-{i:03}: {}\r\n", "a".repeat(1000)));
        }
        r.push_str("\r\n");
        r
    };
    // 10 KB of header passes both; 24 KB is refused by both.
    let (v, n) = t.send(with_lines(10).as_bytes()).await;
    assert_eq!((v.status, n.status), (200, 200));
    let (v, n) = t.send(with_lines(24).as_bytes()).await;
    // nginx answers 400 ("Request Header Or Cookie Too Large"); so does
    // vigil's head gate (crate::request_check), before hyper's own limit.
    assert_eq!(n.status, 400, "nginx");
    assert_eq!(v.status, 400, "vigil");
    assert_eq!(
        t.uris().0.concat().len(),
        1,
        "only the first reached vigil's backend"
    );
}

/// A request with a body, sent in full to a peer that never answers, gets
/// 504 after `proxy_read_timeout` as a GET does (nginx arms the read timer
/// once the whole request is sent), whether the body was buffered in
/// memory, spooled to a file, or streamed.
#[tokio::test(start_paused = true)]
async fn a_post_to_a_peer_that_never_answers_gets_504_after_read_timeout() {
    let hang = crate::hedge::Hang::start().await.addr;
    for (buffering, body) in [
        ("on", "x=1".to_string()),
        ("on", "y".repeat(200_000)),
        ("off", "x=1".to_string()),
    ] {
        let p = start_proxy(&format!(
            "http {{ upstream u {{ server {hang}; }}
               server {{ listen {{LISTEN}};
                 location / {{ proxy_pass http://u; proxy_read_timeout 1s;
                               proxy_request_buffering {buffering}; }} }} }}"
        ))
        .await;
        let body: &'static str = Box::leak(body.into_boxed_str());
        let started = tokio::time::Instant::now();
        let r = crate::support::send(p.addr, crate::support::request("POST", "/", body)).await;
        assert_eq!(r.status, 504, "buffering {buffering}, {} bytes", body.len());
        // Paused time: the answer came when the 1 s read timer fired, not
        // the 60 s send timer.
        let took = started.elapsed();
        assert!(
            (Duration::from_secs(1)..Duration::from_secs(2)).contains(&took),
            "buffering {buffering}, {} bytes: answered after {took:?}",
            body.len()
        );
    }
}
