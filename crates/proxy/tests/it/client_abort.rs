//! A client that goes away while its request waits for the upstream, side
//! by side with stock nginx (`proxy_ignore_client_abort`): what the
//! backends saw (the request, then their connection closed; no other peer
//! tried), what both access logs say (499), and what core charged (nothing).
//! With `proxy_ignore_client_abort on` the request goes on to its answer.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

use crate::support::eventually;
use crate::twin::{Addressed, PerSide};

/// A backend that reads a request head and answers only when released;
/// it notes each request and each connection the proxy closed on it.
#[derive(Clone)]
struct Held {
    addr: SocketAddr,
    requests: Arc<AtomicUsize>,
    closed: Arc<AtomicUsize>,
    release: Arc<Notify>,
}

impl Held {
    async fn start() -> Self {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let held = Self {
            addr: l.local_addr().expect("addr"),
            requests: Arc::default(),
            closed: Arc::default(),
            release: Arc::default(),
        };
        let h = held.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let h = h.clone();
                tokio::spawn(async move {
                    let mut got = Vec::new();
                    let mut b = [0u8; 1024];
                    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                        match s.read(&mut b).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => got.extend_from_slice(&b[..n]),
                        }
                    }
                    h.requests.fetch_add(1, Ordering::SeqCst);
                    tokio::select! {
                        // The proxy closed the connection (EOF or reset).
                        r = s.read(&mut b) => {
                            if matches!(r, Ok(0) | Err(_)) {
                                h.closed.fetch_add(1, Ordering::SeqCst);
                            }
                        }
                        () = h.release.notified() => {
                            let _ = s
                                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nConnection: close\r\n\r\nlate")
                                .await;
                        }
                    }
                });
            }
        });
        held
    }

    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }

    fn closed(&self) -> usize {
        self.closed.load(Ordering::SeqCst)
    }
}

impl Addressed for Held {
    fn addr(&self) -> SocketAddr {
        self.addr
    }
}

/// Two held backends a side, each side logging `$status $upstream_addr
/// $upstream_status`; `location` adds to the proxying location.
async fn start(location: &str) -> PerSide<Held> {
    let conf = format!(
        "log_format abort '$status $upstream_addr $upstream_status';\n\
         upstream u {{ server {{R0}} max_fails=1; server {{R1}} max_fails=1; }}\n\
         server {{ listen {{LISTEN}}; access_log {{LOG}} abort;\n\
           location / {{ proxy_pass http://u; proxy_read_timeout 30s; {location} }}\n\
         }}"
    );
    let vigil = [Held::start().await, Held::start().await];
    let nginx = [Held::start().await, Held::start().await];
    PerSide::start(&conf, vigil, nginx).await
}

/// Send a request to `addr` and hang up once a backend of `held` has it.
async fn abandon(addr: SocketAddr, held: &[Held; 2]) {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(b"GET /slow HTTP/1.1\r\nHost: t\r\n\r\n")
        .await
        .expect("send");
    eventually("the request at a backend", || {
        held.iter().map(Held::requests).sum::<usize>() == 1
    })
    .await;
    drop(s);
}

#[tokio::test]
async fn a_client_that_hangs_up_ends_the_attempt_with_499_and_no_retry_as_nginx() {
    let a = start("").await;
    for (addr, held, side) in a.sides() {
        abandon(addr, held).await;
        eventually(&format!("{side}: the upstream connection closed"), || {
            held.iter().map(Held::closed).sum::<usize>() == 1
        })
        .await;
        eventually(&format!("{side}: the access log line"), || {
            !a.log(side).is_empty()
        })
        .await;
        assert_eq!(
            held.iter().map(Held::requests).sum::<usize>(),
            1,
            "{side}: no other peer is tried for a client that left"
        );
    }
    let (v, n) = (a.log("vigil"), a.log("nginx"));
    assert_eq!(n, ["499 R0 -"], "nginx");
    assert_eq!(v, n, "vigil's line as nginx's");
    // Nothing charged (with max_fails=1 a charge would exclude the peer).
    let proxy = &a.twin.running.proxy;
    let u = proxy
        .current()
        .registry
        .get("u")
        .cloned()
        .expect("upstream u");
    let fails: Vec<u32> = u
        .status(proxy.clock().now())
        .iter()
        .map(|p| p.passive.fails)
        .collect();
    assert_eq!(fails, [0, 0], "no peer is charged for a client that left");
}

#[tokio::test]
async fn with_proxy_ignore_client_abort_on_the_request_goes_on_to_its_answer_as_nginx() {
    let a = start("proxy_ignore_client_abort on;").await;
    for (addr, held, side) in a.sides() {
        abandon(addr, held).await;
        // The answer comes after the client left; it is read and logged.
        for h in held.iter() {
            h.release.notify_one();
        }
        eventually(&format!("{side}: the access log line"), || {
            !a.log(side).is_empty()
        })
        .await;
        assert_eq!(held.iter().map(Held::closed).sum::<usize>(), 0, "{side}");
    }
    let (v, n) = (a.log("vigil"), a.log("nginx"));
    assert_eq!(n, ["200 R0 200"], "nginx");
    assert_eq!(v, n, "vigil's line as nginx's");
}
