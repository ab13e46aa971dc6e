//! Request bodies (buffering on/off, 413, spooling) and truncated responses.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::Response;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::{eventually, get, send, start_proxy, Backend};

/// Send headers and half a body, then the rest once `release` says so.
async fn slow_post(
    addr: std::net::SocketAddr,
    release: impl std::future::Future<Output = ()>,
) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(
        b"POST /up HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\nConnection: close\r\n\r\nhello",
    )
    .await
    .expect("write");
    release.await;
    s.write_all(b"world").await.expect("write");
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn buffering_on_reads_the_whole_body_before_contacting_the_upstream() {
    let b = Backend::named("ok").await;
    let p = start_proxy(&format!(
        "http {{ upstream u {{ server {}; }} server {{ listen {{LISTEN}}; location / {{ proxy_pass http://u; }} }} }}",
        b.addr
    ))
    .await;
    let conns = b.connections.clone();
    // Release the second half only after giving the proxy a chance to (wrongly) connect.
    let out = slow_post(p.addr, async {
        for _ in 0..20 {
            tokio::task::yield_now().await;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(
            conns.load(std::sync::atomic::Ordering::SeqCst),
            0,
            "upstream contacted before the body was complete"
        );
    })
    .await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert_eq!(b.requests()[0].body, Bytes::from("helloworld"));
}

#[tokio::test]
async fn buffering_off_streams_the_body_as_it_arrives() {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let tx = std::sync::Mutex::new(Some(tx));
    // The backend signals as soon as the request head is in (hyper calls
    // the service before the body is read).
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let baddr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        if let Ok((mut s, _)) = listener.accept().await {
            let mut got = Vec::new();
            let mut buf = [0u8; 1024];
            let mut signalled = false;
            loop {
                let n = s.read(&mut buf).await.unwrap_or(0);
                if n == 0 {
                    return;
                }
                got.extend_from_slice(&buf[..n]);
                if !signalled && got.windows(4).any(|w| w == b"\r\n\r\n") {
                    signalled = true;
                    if let Some(tx) = tx.lock().expect("lock").take() {
                        let _ = tx.send(());
                    }
                }
                if got.ends_with(b"helloworld") {
                    let _ = s
                        .write_all(
                            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
                        )
                        .await;
                    return;
                }
            }
        }
    });
    let p = start_proxy(&format!(
        "http {{ upstream u {{ server {baddr}; }} server {{ listen {{LISTEN}}; location / {{ proxy_pass http://u; proxy_request_buffering off; }} }} }}"
    ))
    .await;
    let out = slow_post(p.addr, async {
        tokio::time::timeout(Duration::from_secs(5), rx)
            .await
            .expect("upstream saw the request before the body was complete")
            .expect("signal");
    })
    .await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
}

#[tokio::test]
async fn bodies_over_client_max_body_size_get_413() {
    let b = Backend::named("ok").await;
    let p = start_proxy(&format!(
        "http {{ upstream u {{ server {}; }} server {{ listen {{LISTEN}}; client_max_body_size 1k; location / {{ proxy_pass http://u; }} }} }}",
        b.addr
    ))
    .await;
    let big: &'static str = Box::leak("x".repeat(2048).into_boxed_str());
    let r = send(p.addr, crate::support::request("POST", "/", big)).await;
    assert_eq!(r.status, 413);
    // chunked, no Content-Length
    let mut s = tokio::net::TcpStream::connect(p.addr)
        .await
        .expect("connect");
    s.write_all(b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n800\r\n")
        .await
        .expect("write");
    s.write_all(&[b'y'; 2048]).await.expect("write");
    s.write_all(b"\r\n0\r\n\r\n").await.expect("write");
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
    assert!(String::from_utf8_lossy(&out).starts_with("HTTP/1.1 413"));
    assert!(b.requests().is_empty(), "nothing reached the upstream");
}

#[tokio::test]
async fn large_bodies_spool_to_disk_and_replay_on_retry() {
    let dead = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let dead_addr = dead.local_addr().expect("addr");
    drop(dead);
    let b =
        Backend::start(|s| Response::new(Full::new(Bytes::from(s.body.len().to_string())))).await;
    let p = start_proxy(&format!(
        "http {{ upstream u {{ server {dead_addr}; server {}; }} server {{ listen {{LISTEN}}; client_max_body_size 10m; location / {{ proxy_pass http://u; }} }} }}",
        b.addr
    ))
    .await;
    let big: &'static str = Box::leak("z".repeat(300_000).into_boxed_str());
    let r = send(p.addr, crate::support::request("PUT", "/", big)).await;
    assert_eq!((r.status, r.text()), (200, "300000".to_string()));
}

#[tokio::test]
async fn a_response_cut_after_the_header_is_truncated_not_retried() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let baddr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf).await;
            let _ = s
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
                .await;
            let _ = s.write_all(&[b'a'; 100]).await;
            drop(s);
        }
    });
    let other = Backend::named("other").await;
    let p = start_proxy(&format!(
        "http {{ upstream u {{ server {baddr}; server {}; }} server {{ listen {{LISTEN}}; location / {{ proxy_pass http://u; }} }} }}",
        other.addr
    ))
    .await;
    let r = get(p.addr, "/").await;
    assert_eq!(r.status, 200);
    assert!(r.body.is_err(), "the client sees a truncated body");
    assert!(
        other.requests().is_empty(),
        "no retry once the header went out"
    );
    let gen = p.proxy.current();
    let up = gen.registry.get("u").expect("u").clone();
    eventually("peer released", || up.peers()[0].conns() == 0).await;
    assert!(
        up.status(p.proxy.clock().now())[0].reasons.is_empty(),
        "not excluded (nginx: state 0)"
    );
}

#[tokio::test]
async fn proxy_send_timeout_stops_an_upload_the_upstream_does_not_read() {
    // A backend that accepts and never reads: the write side stalls once the
    // socket buffers are full, and only proxy_send_timeout can end it (the
    // read timeout here is far longer than the test may take).
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let baddr = listener.local_addr().expect("addr");
    let held = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let keep = held.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            keep.lock().expect("lock").push(s);
        }
    });
    let p = start_proxy(&format!(
        "http {{ upstream u {{ server {baddr}; }} server {{ listen {{LISTEN}}; client_max_body_size 64m;
           location / {{ proxy_pass http://u; proxy_send_timeout 300ms; proxy_read_timeout 60s; }} }} }}"
    ))
    .await;
    let big: &'static str = Box::leak("s".repeat(32 << 20).into_boxed_str());
    let r = tokio::time::timeout(
        Duration::from_secs(30),
        send(p.addr, crate::support::request("PUT", "/", big)),
    )
    .await
    .expect("answered by the send timeout, not the 60s read timeout");
    assert_eq!(r.status, 504);
    assert_eq!(
        held.lock().expect("lock").len(),
        1,
        "one attempt: a single server is not retried"
    );
}
