//! `upstream_response`: the bytes (after the first, which picks the
//! request's method) are what a backend on 127.0.0.1 answers, then it
//! closes; vigil's plain HTTP/1.1 upstream client (crates/proxy/src/upstream)
//! reads them as the response to a client request through the real service.
//! Checks: no panic, the exchange ends (no hang), and a plain request to
//! another upstream is still answered after.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::runtime::Runtime;
use vigil_proxy::Proxy;

use crate::proxy::{connection_ended, proxy_for, runtime};

const LOCAL: &str = "127.0.0.1:1";
const CLIENT: &str = "127.0.0.1:40001";

struct Harness {
    rt: Runtime,
    proxy: Arc<Proxy>,
    reply: Arc<Mutex<Vec<u8>>>,
}

fn harness() -> &'static Harness {
    static H: OnceLock<Harness> = OnceLock::new();
    H.get_or_init(|| {
        let rt = runtime();
        let reply = Arc::new(Mutex::new(Vec::new()));
        let scripted = rt.block_on(backend(Some(reply.clone())));
        let plain = rt.block_on(backend(None));
        let conf = format!(
            "http {{ upstream u {{ server {scripted}; keepalive 4; }}
               upstream p {{ server {plain}; keepalive 4; }}
               server {{ listen {LOCAL}; proxy_read_timeout 1s; proxy_send_timeout 1s;
                 location / {{ proxy_pass http://u; proxy_http_version 1.1; proxy_set_header Connection \"\"; }}
                 location /plain {{ proxy_pass http://p; proxy_http_version 1.1; proxy_set_header Connection \"\"; }} }} }}"
        );
        let proxy = proxy_for(&conf);
        Harness { rt, proxy, reply }
    })
}

/// A backend that reads a request head (and what follows it, briefly),
/// then writes `reply`'s bytes and closes; without one, a 200 `ok`.
async fn backend(reply: Option<Arc<Mutex<Vec<u8>>>>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind fuzz backend");
    let addr = listener.local_addr().expect("backend addr");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let reply = reply.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let bytes = match &reply {
                    Some(r) => r.lock().map(|r| r.clone()).unwrap_or_default(),
                    None => b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
                        .to_vec(),
                };
                let _ = s.write_all(&bytes).await;
                let _ = s.shutdown().await;
            });
        }
    });
    addr
}

/// One client request through the service; what came back.
async fn exchange(proxy: &Arc<Proxy>, request: &[u8]) -> Vec<u8> {
    let (mut client, server) = tokio::io::duplex(64 * 1024);
    let local: SocketAddr = LOCAL.parse().expect("local");
    let peer: SocketAddr = CLIENT.parse().expect("client");
    let conn = tokio::spawn(vigil_proxy::serve_connection(
        proxy.clone(),
        server,
        local,
        peer,
    ));
    let _ = client.write_all(request).await;
    let mut out = Vec::new();
    let _ = client.read_to_end(&mut out).await;
    connection_ended(conn).await;
    out
}

/// The target.
pub fn upstream_response(data: &[u8]) {
    let Some((&pick, reply)) = data.split_first() else {
        return;
    };
    let h = harness();
    if let Ok(mut r) = h.reply.lock() {
        *r = reply.to_vec();
    }
    let request: &[u8] = match pick % 3 {
        0 => b"GET /x HTTP/1.1\r\nHost: fuzz\r\nConnection: close\r\n\r\n",
        1 => b"HEAD /x HTTP/1.1\r\nHost: fuzz\r\nConnection: close\r\n\r\n",
        _ => b"POST /x HTTP/1.1\r\nHost: fuzz\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc",
    };
    h.rt.block_on(async {
        let bounded = tokio::time::timeout(Duration::from_secs(20), exchange(&h.proxy, request));
        assert!(bounded.await.is_ok(), "the exchange did not end");
        let plain = exchange(
            &h.proxy,
            b"GET /plain HTTP/1.1\r\nHost: fuzz\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert!(
            plain.starts_with(b"HTTP/1.1 200"),
            "a plain request after the input: {}",
            String::from_utf8_lossy(&plain)
        );
    });
}
