//! The plain HTTP/1.1 upstream client (crates/proxy/src/upstream) against
//! stock nginx on kept-alive connections the backend ends: one it closed
//! while idle is not used, and a request that one closes unanswered goes
//! again on a new connection as nginx retries a cached connection.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::support::eventually;
use crate::twin::Twin;

/// What a backend does on each connection.
#[derive(Clone, Copy)]
enum Mode {
    /// Answer one request (keep-alive by its head), then close at once.
    CloseAfterAnswer,
    /// Answer the first request; read the second and close unanswered.
    DropSecond,
}

/// A backend on 127.0.0.1 counting connections, request heads and closes.
#[derive(Clone)]
struct Keeper {
    addr: SocketAddr,
    conns: Arc<AtomicUsize>,
    heads: Arc<AtomicUsize>,
    closed: Arc<AtomicUsize>,
}

impl Keeper {
    async fn start(mode: Mode) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let k = Keeper {
            addr: listener.local_addr().expect("addr"),
            conns: Arc::default(),
            heads: Arc::default(),
            closed: Arc::default(),
        };
        let kk = k.clone();
        tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                kk.conns.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(kk.clone().serve(s, mode));
            }
        });
        k
    }

    async fn serve(self, mut s: TcpStream, mode: Mode) {
        let mut n = 0;
        loop {
            if !read_request(&mut s).await {
                break;
            }
            self.heads.fetch_add(1, Ordering::SeqCst);
            n += 1;
            if matches!(mode, Mode::DropSecond) && n == 2 {
                break;
            }
            let _ = s
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                .await;
            if matches!(mode, Mode::CloseAfterAnswer) {
                break;
            }
        }
        drop(s);
        self.closed.fetch_add(1, Ordering::SeqCst);
    }
}

/// Read one request head and its Content-Length body; false at EOF.
async fn read_request(s: &mut TcpStream) -> bool {
    let mut buf = Vec::new();
    let mut b = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        match s.read(&mut b).await {
            Ok(1) => buf.push(b[0]),
            _ => return false,
        }
    }
    let head = String::from_utf8_lossy(&buf).to_ascii_lowercase();
    let len = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).await.is_ok()
}

const CONF: &str = "upstream u { server {R0}; keepalive 8; }
     server { listen {LISTEN};
       location / { proxy_pass http://u; proxy_http_version 1.1;
         proxy_set_header Connection \"\";
         add_header X-Status $upstream_status always; } }";

async fn twin(mode: Mode) -> (Twin, Keeper, Keeper) {
    let (v, n) = (Keeper::start(mode).await, Keeper::start(mode).await);
    let t = Twin::start_with(CONF, 0, &[("{R0}", v.addr)], &[("{R0}", n.addr)]).await;
    (t, v, n)
}

#[tokio::test]
async fn a_kept_connection_the_backend_closed_while_idle_is_not_used() {
    let (t, v, n) = twin(Mode::CloseAfterAnswer).await;
    let get = b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n";
    let (a, b) = t.send(get).await;
    assert_eq!((a.status, b.status), (200, 200));
    eventually("both backends closed their connection", || {
        v.closed.load(Ordering::SeqCst) == 1 && n.closed.load(Ordering::SeqCst) == 1
    })
    .await;
    let (a, b) = t.send(get).await;
    for (side, r) in [("vigil", &a), ("nginx", &b)] {
        assert_eq!(r.status, 200, "{side}: {r:?}");
        // One attempt: the closed connection was not tried.
        assert_eq!(r.header("x-status"), "200", "{side}: {r:?}");
    }
    for (side, k) in [("vigil", &v), ("nginx", &n)] {
        assert_eq!(k.heads.load(Ordering::SeqCst), 2, "{side}");
        assert_eq!(k.conns.load(Ordering::SeqCst), 2, "{side}");
    }
}

#[tokio::test]
async fn a_request_a_kept_connection_closes_unanswered_goes_again_as_nginx_does() {
    let (t, v, n) = twin(Mode::DropSecond).await;
    let get = b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n";
    let (a, b) = t.send(get).await;
    assert_eq!((a.status, b.status), (200, 200));
    // The second request goes out on the kept connection, which the
    // backend closes: a GET goes again on a new one (nginx: a cached
    // connection's error, not charged).
    let (a, b) = t.send(get).await;
    assert_eq!(a.status, b.status, "vigil {a:?}\nnginx {b:?}");
    assert_eq!(a.status, 200);
    assert_eq!(a.header("x-status"), b.header("x-status"));
    for (side, k) in [("vigil", &v), ("nginx", &n)] {
        assert_eq!(k.heads.load(Ordering::SeqCst), 3, "{side}");
        assert_eq!(k.conns.load(Ordering::SeqCst), 2, "{side}");
    }
    // A POST sent on the kept connection is not sent twice.
    let post = b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc";
    let (a, b) = t.send(post).await;
    assert_eq!(a.status, b.status, "vigil {a:?}\nnginx {b:?}");
    assert_eq!(a.header("x-status"), b.header("x-status"));
    assert_eq!(
        v.heads.load(Ordering::SeqCst),
        n.heads.load(Ordering::SeqCst)
    );
}
