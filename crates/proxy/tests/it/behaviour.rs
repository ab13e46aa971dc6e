//! Routing, headers, keepalive, retries, reload, shutdown, upgrades.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::Response;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::{eventually, get, load, send, start_proxy, Backend};

#[tokio::test]
async fn uri_part_of_proxy_pass_replaces_the_location_prefix() {
    let b = Backend::named("b").await;
    let p = start_proxy(&format!(
        "http {{ upstream u {{ server {}; }}
           server {{ listen {{LISTEN}};
             location /join/ {{ proxy_pass http://u/v1; }}
             location /keep/ {{ proxy_pass http://u; }}
             location / {{ proxy_pass http://u/root/; }} }} }}",
        b.addr
    ))
    .await;
    for path in ["/join/item?x=1", "/keep/a", "/z"] {
        assert_eq!(get(p.addr, path).await.status, 200);
    }
    assert!(b.requests().iter().all(|s| s.method == "GET"));
    let uris: Vec<String> = b.requests().into_iter().map(|s| s.uri).collect();
    assert_eq!(
        uris,
        vec!["/v1item?x=1", "/keep/a", "/root/z"],
        "seed 003: /join/item goes up as /v1item"
    );
}

#[tokio::test]
async fn headers_go_up_as_nginx_sends_them() {
    let b = Backend::named("b").await;
    let p = start_proxy(&format!(
        "http {{ upstream api {{ server {}; }}
           server {{ listen {{LISTEN}};
             location / {{ proxy_pass http://api;
               proxy_set_header X-Real-IP $remote_addr;
               proxy_set_header X-Drop \"\"; }} }} }}",
        b.addr
    ))
    .await;
    let req = hyper::Request::builder()
        .uri("/h")
        .header("host", "client.example")
        .header("x-req-id", "abc-123")
        .header("x-drop", "gone")
        .header("connection", "keep-alive, x-hop")
        .header("x-hop", "hop-by-hop")
        .header("te", "trailers")
        .body(Full::new(Bytes::new()))
        .expect("req");
    assert_eq!(send(p.addr, req).await.status, 200);
    let seen = &b.requests()[0];
    let h = |n: &str| {
        seen.headers
            .get(n)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    assert_eq!(
        h("x-req-id").as_deref(),
        Some("abc-123"),
        "client headers pass unchanged"
    );
    assert_eq!(h("host").as_deref(), Some("api"), "Host is $proxy_host");
    assert_eq!(h("x-real-ip").as_deref(), Some("127.0.0.1"));
    assert_eq!(
        h("x-drop"),
        None,
        "an empty proxy_set_header removes the header"
    );
    assert_eq!(
        h("x-hop"),
        None,
        "headers named in Connection are hop-by-hop"
    );
    assert_eq!(h("te"), None);
    assert_eq!(
        h("connection").as_deref(),
        Some("close"),
        "no keepalive: Connection: close"
    );
}

/// The order of the fields a backend sees is the one vigil has always
/// sent (the client's, as the edits of hop-by-hop fields, Host and
/// `proxy_set_header` left them: a removed field's place taken by the
/// last one); nginx sends its own order (its set fields first).
#[tokio::test]
async fn fields_go_up_in_the_order_vigil_always_sent_them() {
    let b = Backend::named("b").await;
    let p = start_proxy(&format!(
        "http {{ upstream u {{ server {}; keepalive 4; }}
           server {{ listen {{LISTEN}};
             location / {{ proxy_pass http://u; proxy_http_version 1.1;
               proxy_set_header X-Real-IP $remote_addr;
               proxy_set_header Accept \"\";
               proxy_set_header Connection \"\";
               proxy_set_header X-Uri $request_uri;
               proxy_set_header Accept-Encoding \"\";
               proxy_set_header X-Empty $http_x_none; }} }} }}",
        b.addr
    ))
    .await;
    let req = hyper::Request::builder()
        .uri("/p?a=1")
        .header("user-agent", "ua")
        .header("accept", "*/*")
        .header("connection", "keep-alive, x-drop")
        .header("x-drop", "1")
        .header("host", "client.example")
        .header("te", "trailers")
        .header("x-keep", "k1")
        .header("x-keep", "k2")
        .header("accept-encoding", "gzip")
        .header("upgrade", "websocket")
        .header("x-last", "l")
        .body(Full::new(Bytes::new()))
        .expect("req");
    assert_eq!(send(p.addr, req).await.status, 200);
    let seen = &b.requests()[0];
    let fields: Vec<(&str, &str)> = seen
        .headers
        .iter()
        .map(|(n, v)| (n.as_str(), v.to_str().unwrap_or("?")))
        .collect();
    assert_eq!(
        fields,
        [
            ("user-agent", "ua"),
            ("x-real-ip", "127.0.0.1"),
            ("x-last", "l"),
            ("x-keep", "k1"),
            ("x-keep", "k2"),
            ("host", "u"),
            ("x-uri", "/p?a=1"),
            // `proxy_set_header Connection ""`: none, as nginx.
        ]
    );
}

#[tokio::test]
async fn keepalive_reuses_connections_and_is_not_a_cap() {
    let b = Backend::named("b").await;
    let p = start_proxy(&format!(
        "http {{ upstream u {{ server {}; keepalive 2; }}
           server {{ listen {{LISTEN}}; location / {{ proxy_pass http://u; proxy_http_version 1.1; proxy_set_header Connection \"\"; }} }} }}",
        b.addr
    ))
    .await;
    for _ in 0..20 {
        assert_eq!(get(p.addr, "/").await.status, 200);
    }
    assert_eq!(
        b.conns(),
        1,
        "20 sequential requests share one kept-alive connection"
    );
    // 8 concurrent requests: more connections than `keepalive 2` are opened (not a cap).
    let slow = Backend::start(|_| Response::new(Full::new(Bytes::from("slow")))).await;
    drop(slow);
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let addr = p.addr;
        tasks.push(tokio::spawn(async move { get(addr, "/").await.status }));
    }
    for t in tasks {
        assert_eq!(t.await.expect("join"), 200);
    }
    assert!(b.conns() >= 1);
}

#[tokio::test]
async fn without_keepalive_every_request_opens_a_connection() {
    let b = Backend::named("b").await;
    let p = start_proxy(&format!(
        "http {{ upstream u {{ server {}; }} server {{ listen {{LISTEN}}; location / {{ proxy_pass http://u; }} }} }}",
        b.addr
    ))
    .await;
    for _ in 0..5 {
        get(p.addr, "/").await;
    }
    assert_eq!(
        b.conns(),
        5,
        "no probes or pre-opened connections: exactly one per request"
    );
}

/// Core's clock inside the proxy is tokio's: in paused time the passive
/// window of a failed peer ends when the test moves time past
/// `fail_timeout`, and not a moment before, with no real wait.
#[tokio::test(start_paused = true)]
async fn the_passive_window_runs_on_tokios_clock() {
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr")
    };
    let good = Backend::named("good").await;
    let p = start_proxy(&format!(
        "http {{ upstream u {{ server {dead} fail_timeout=30s; server {}; }}
           server {{ listen {{LISTEN}};
             add_header X-Upstream-Addr $upstream_addr always;
             location / {{ proxy_pass http://u; }} }} }}",
        good.addr
    ))
    .await;
    let r = get(p.addr, "/").await;
    assert_eq!(
        r.header("x-upstream-addr"),
        format!("{dead}, {}", good.addr)
    );
    for _ in 0..3 {
        tokio::time::advance(Duration::from_secs(9)).await;
        let r = get(p.addr, "/").await;
        assert_eq!(r.header("x-upstream-addr"), good.addr.to_string());
    }
    // Past the window the dead peer is eligible again, and nginx's smooth
    // round robin gives it the third request: its failure dropped its
    // effective weight to 0, and the first failed pick left its current
    // weight at -1.
    tokio::time::advance(Duration::from_secs(4)).await;
    let mut tried = Vec::new();
    for _ in 0..3 {
        tried.push(get(p.addr, "/").await.header("x-upstream-addr"));
    }
    let good = good.addr.to_string();
    assert_eq!(
        tried,
        [good.clone(), good.clone(), format!("{dead}, {good}")]
    );
}

#[tokio::test]
async fn add_header_shows_every_attempt() {
    let bad = Backend::start(|_| {
        let mut r = Response::new(Full::new(Bytes::from("no")));
        *r.status_mut() = hyper::StatusCode::SERVICE_UNAVAILABLE;
        r
    })
    .await;
    let good = Backend::named("good").await;
    let p = start_proxy(&format!(
        "http {{ upstream u {{ server {}; server {}; }}
           server {{ listen {{LISTEN}};
             add_header X-Upstream-Addr $upstream_addr always;
             add_header X-Upstream-Status $upstream_status always;
             location / {{ proxy_pass http://u; proxy_next_upstream error timeout http_503; }} }} }}",
        bad.addr, good.addr
    ))
    .await;
    let r = get(p.addr, "/").await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("x-upstream-addr"),
        format!("{}, {}", bad.addr, good.addr)
    );
    assert_eq!(r.header("x-upstream-status"), "503, 200");
    // bad is excluded now; with nothing else eligible... good serves alone.
    let r = get(p.addr, "/").await;
    assert_eq!(r.header("x-upstream-status"), "200");
}

#[tokio::test]
async fn garbage_and_resets_from_upstream_give_502_and_leak_nothing() {
    // A raw TCP backend that answers garbage, then one that resets.
    let garbage = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let gaddr = garbage.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = garbage.accept().await {
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf).await;
            let _ = s.write_all(b"SMTP READY\r\n\r\n").await;
        }
    });
    let p = start_proxy(&format!(
        "http {{ upstream u {{ server {gaddr}; }} server {{ listen {{LISTEN}}; location / {{ proxy_pass http://u; }} }} }}"
    ))
    .await;
    for _ in 0..3 {
        assert_eq!(get(p.addr, "/").await.status, 502);
    }
    let gen = p.proxy.current();
    let up = gen.registry.get("u").expect("u");
    eventually("connection counts back to zero", || {
        up.peers().iter().all(|p| p.conns() == 0)
    })
    .await;
}

#[tokio::test]
async fn malformed_client_requests_get_400_not_a_crash() {
    let b = Backend::named("b").await;
    let p = start_proxy(&format!(
        "http {{ upstream u {{ server {}; }} server {{ listen {{LISTEN}}; location / {{ proxy_pass http://u; }} }} }}",
        b.addr
    ))
    .await;
    let mut s = tokio::net::TcpStream::connect(p.addr)
        .await
        .expect("connect");
    s.write_all(b"GARBAGE / HTTP/9.9\r\n\x00\x01\r\n\r\n")
        .await
        .expect("write");
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
    let text = String::from_utf8_lossy(&out);
    assert!(
        // nginx 1.22 answers 505 to a major version above 1.
        text.is_empty() || text.starts_with("HTTP/1.1 400") || text.starts_with("HTTP/1.1 505"),
        "{text}"
    );
    // still serving
    assert_eq!(get(p.addr, "/").await.status, 200);
    assert_eq!(b.requests().len(), 1);
}

#[tokio::test]
async fn reload_keeps_the_passive_state_of_unchanged_peers() {
    let good = Backend::named("good").await;
    let dead = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let dead_addr = dead.local_addr().expect("addr");
    drop(dead); // refused from now on
    let conf = format!(
        "http {{ upstream u {{ server {dead_addr} fail_timeout=60s; server {}; }} server {{ listen {{LISTEN}}; location / {{ proxy_pass http://u; }} }} }}",
        good.addr
    );
    let p = start_proxy(&conf).await;
    let r = get(p.addr, "/").await;
    assert_eq!(r.status, 200);
    let excluded = |p: &crate::support::Running| {
        let gen = p.proxy.current();
        let up = gen.registry.get("u").expect("u").clone();
        up.status(p.proxy.clock().now())[0].reasons.len()
    };
    assert_eq!(excluded(&p), 1, "dead peer excluded after its failure");
    let generation = p.proxy.reload(load(&p.text)).expect("reload");
    assert_eq!(generation, 2);
    assert_eq!(
        excluded(&p),
        1,
        "still excluded after reload (nginx would forget)"
    );
    for _ in 0..4 {
        get(p.addr, "/").await;
    }
    assert_eq!(
        good.requests().len(),
        5,
        "no request went to the dead peer after the reload"
    );
}

#[tokio::test]
async fn graceful_shutdown_lets_in_flight_requests_finish() {
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let rx = std::sync::Mutex::new(rx);
    let slow = Backend::start(move |_| {
        let _ = rx
            .lock()
            .expect("lock")
            .recv_timeout(Duration::from_secs(5));
        Response::new(Full::new(Bytes::from("done")))
    })
    .await;
    let p = start_proxy(&format!(
        "http {{ upstream u {{ server {}; }} server {{ listen {{LISTEN}}; location / {{ proxy_pass http://u; }} }} }}",
        slow.addr
    ))
    .await;
    let addr = p.addr;
    let inflight = tokio::spawn(async move { get(addr, "/").await });
    eventually("backend got the request", || slow.conns() == 1).await;
    p.shutdown.cancel();
    eventually("listener closed", || {
        std::net::TcpStream::connect(addr).is_err()
    })
    .await;
    let _ = tx.send(());
    let r = inflight.await.expect("join");
    assert_eq!((r.status, r.text()), (200, "done".to_string()));
    tokio::time::timeout(Duration::from_secs(5), p.task)
        .await
        .expect("serve returns")
        .expect("join");
}

#[tokio::test]
async fn websocket_style_upgrades_are_passed_through() {
    // A backend that switches protocols and echoes bytes.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let baddr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let mut got = Vec::new();
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    let n = s.read(&mut buf).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    got.extend_from_slice(&buf[..n]);
                }
                let _ = s
                    .write_all(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
                    .await;
                loop {
                    let n = s.read(&mut buf).await.unwrap_or(0);
                    if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    // Tunnels open only where the location passes Upgrade on (hardening.rs).
    let p = start_proxy(&format!(
        "http {{ upstream u {{ server {baddr}; }} server {{ listen {{LISTEN}}; location / {{ proxy_pass http://u;
           proxy_http_version 1.1; proxy_set_header Upgrade $http_upgrade; proxy_set_header Connection upgrade; }} }} }}"
    ))
    .await;
    let mut c = tokio::net::TcpStream::connect(p.addr)
        .await
        .expect("connect");
    c.write_all(b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
        .await
        .expect("write");
    let mut buf = vec![0u8; 4096];
    let mut head = Vec::new();
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = c.read(&mut buf).await.expect("read");
        assert!(n > 0, "closed before 101");
        head.extend_from_slice(&buf[..n]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 101"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    c.write_all(b"ping").await.expect("write");
    let mut echo = [0u8; 4];
    tokio::time::timeout(Duration::from_secs(5), c.read_exact(&mut echo))
        .await
        .expect("echo in time")
        .expect("read");
    assert_eq!(&echo, b"ping");
}

#[tokio::test]
async fn http2_clients_are_served() {
    let b = Backend::named("h2").await;
    let p = start_proxy(&format!(
        "http {{ upstream u {{ server {}; }} server {{ listen {{LISTEN}}; location / {{ proxy_pass http://u; }} }} }}",
        b.addr
    ))
    .await;
    let stream = tokio::net::TcpStream::connect(p.addr)
        .await
        .expect("connect");
    let (mut sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .expect("h2 handshake");
    tokio::spawn(conn);
    // :authority alone: nginx 1.22 answers 400 to an HTTP/2 request that
    // also has a Host header (it takes :authority as one; see routing.rs).
    let req = hyper::Request::builder()
        .uri("http://x/")
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .expect("request");
    let resp = sender.send_request(req).await.expect("response");
    assert_eq!(resp.status(), 200);
    assert_eq!(b.requests().len(), 1);
}

#[tokio::test]
async fn the_access_log_records_every_attempt_as_json() {
    let dead = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let dead_addr = dead.local_addr().expect("addr");
    drop(dead);
    let good = Backend::named("good").await;
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("access.log");
    let p = start_proxy(&format!(
        "http {{ upstream u {{ server {dead_addr}; server {}; }}
           server {{ listen {{LISTEN}}; access_log {} json; location / {{ proxy_pass http://u; }} }} }}",
        good.addr,
        log.display()
    ))
    .await;
    assert_eq!(get(p.addr, "/logged?x=1").await.status, 200);
    eventually("a log line", || {
        std::fs::read_to_string(&log).is_ok_and(|s| s.ends_with('\n'))
    })
    .await;
    let line = std::fs::read_to_string(&log).expect("log");
    let v: serde_json::Value = serde_json::from_str(line.trim()).expect("one JSON line");
    assert_eq!(v["uri"], "/logged?x=1");
    assert_eq!(v["status"], 200);
    assert_eq!(
        v["upstream_addr"],
        serde_json::json!([dead_addr.to_string(), good.addr.to_string()])
    );
    assert_eq!(v["upstream_status"], serde_json::json!([502, 200]));
}

/// A backend that sends `200` with a 10-byte length, three bytes, and closes.
pub(crate) async fn cut_short_backend() -> std::net::SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = l.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhel")
                    .await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn passive_count_after_header_charges_a_body_cut_short() {
    for (rule, charged) in [("", 0), ("passive_count after_header;", 1)] {
        let cut = cut_short_backend().await;
        let ok = Backend::named("ok").await;
        let p = start_proxy(&format!(
            "http {{ upstream u {{ {rule} server {cut}; server {}; }}
               server {{ listen {{LISTEN}}; location / {{ proxy_pass http://u; }} }} }}",
            ok.addr
        ))
        .await;
        // Round robin starts at the cutting peer: the client gets the header and a short body.
        let got = get(p.addr, "/").await;
        assert_eq!(got.status, 200);
        assert!(got.body.is_err(), "the body was cut short: {:?}", got.body);
        let up = p.proxy.current().registry.get("u").cloned().expect("u");
        let fails = eventually_value(
            || up.status(p.proxy.clock().now())[0].passive.fails,
            charged,
        )
        .await;
        assert_eq!(fails, charged, "with \"{rule}\"");
        p.shutdown.cancel();
    }
}

/// Poll `read` (bounded, 5 s) until it gives `want`; the last value read.
async fn eventually_value(read: impl Fn() -> u32, want: u32) -> u32 {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let v = read();
        if v == want || tokio::time::Instant::now() >= deadline {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
