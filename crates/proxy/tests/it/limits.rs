//! `limit_req` and `limit_conn` side by side with stock nginx on one conf:
//! which requests of a burst passed, were delayed or were refused (the
//! status, and `$limit_req_status` / `$limit_conn_status` in a response
//! field), and what the backends saw. No time is measured: a delayed
//! request is told by `DELAYED`, and the rates are slow (6r/m, or 1r/s for
//! the delays) so a busy machine sends a burst well inside one request's
//! worth of time.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::support::eventually;
use crate::twin::{parse, Addressed, PerSide, Twin};

const REQ: &str = r#"
    limit_req_zone $binary_remote_addr zone=nd:1m rate=6r/m;
    limit_req_zone $binary_remote_addr zone=dl:1m rate=1r/s;
    limit_req_zone $binary_remote_addr zone=d1:1m rate=1r/s;
    limit_req_zone $binary_remote_addr zone=st:1m rate=6r/m;
    limit_req_zone $binary_remote_addr zone=a:1m rate=6r/m;
    limit_req_zone $http_x_key zone=b:1m rate=6r/m;
    limit_req_zone $binary_remote_addr zone=dry:1m rate=6r/m;
    limit_req_zone $binary_remote_addr zone=dn:1m rate=6r/m;
    limit_req_zone $binary_remote_addr zone=ep:1m rate=6r/m;
    upstream u { server {B0}; }
    server { listen {LISTEN};
      add_header X-Limit $limit_req_status always;
      location /nodelay { limit_req zone=nd burst=2 nodelay; proxy_pass http://u; }
      location /delay { limit_req zone=dl burst=2; proxy_pass http://u; }
      location /delay1 { limit_req zone=d1 burst=2 delay=1; proxy_pass http://u; }
      location /status { limit_req zone=st; limit_req_status 429; proxy_pass http://u; }
      location /ret { limit_req zone=st; return 200 "r"; }
      location /two { limit_req zone=a burst=3 nodelay; limit_req zone=b nodelay; proxy_pass http://u; }
      location /dry { limit_req zone=dry; limit_req_dry_run on; proxy_pass http://u; }
      location /deny { limit_req zone=dn; deny all; proxy_pass http://u; }
      location /paged { limit_req zone=ep; error_page 503 = @busy; proxy_pass http://u; }
      location @busy { limit_req zone=ep; proxy_pass http://u; }
    }"#;

fn get(path: &str, extra: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: h.test\r\n{extra}Connection: close\r\n\r\n").into_bytes()
}

/// A response as the comparison sees it: its status and its limit field.
fn verdict(r: &crate::twin::Raw, field: &str) -> (u16, String) {
    (r.status, r.header(field))
}

/// `n` requests for `path` on connections of their own, all written
/// before any answer is read; the answers in the order written.
async fn burst(addr: SocketAddr, path: &str, n: usize) -> Vec<(u16, String)> {
    let mut conns = Vec::new();
    for _ in 0..n {
        conns.push(TcpStream::connect(addr).await.expect("connect"));
    }
    for c in &mut conns {
        c.write_all(&get(path, "")).await.expect("write");
    }
    let mut out = Vec::new();
    for c in conns {
        out.push(verdict(&read_all(c).await, "X-Limit"));
    }
    out
}

/// The response on `s`, read until the proxy closes it.
async fn read_all(mut s: TcpStream) -> crate::twin::Raw {
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut buf)).await;
    parse(&buf)
}

/// Sorted: which answers a burst got, whatever order they were served in.
fn sorted(mut v: Vec<(u16, String)>) -> Vec<(u16, String)> {
    v.sort();
    v
}

fn expect(v: &[(u16, &str)]) -> Vec<(u16, String)> {
    v.iter().map(|(s, w)| (*s, w.to_string())).collect()
}

#[tokio::test]
async fn limit_req_passes_delays_and_refuses_the_requests_nginx_does() {
    let t = Twin::start(REQ, 1).await;
    // One after the other, each answered before the next.
    let cases: &[(&str, &[(u16, &str)])] = &[
        (
            "/nodelay",
            &[
                (200, "PASSED"),
                (200, "PASSED"),
                (200, "PASSED"),
                (503, "REJECTED"),
                (503, "REJECTED"),
            ],
        ),
        ("/status", &[(200, "PASSED"), (429, "REJECTED")]),
        // `return` runs in the rewrite phase, before the limits.
        ("/ret", &[(200, ""), (200, "")]),
        (
            "/dry",
            &[
                (200, "PASSED"),
                (200, "REJECTED_DRY_RUN"),
                (200, "REJECTED_DRY_RUN"),
            ],
        ),
        // The preaccess phase runs before allow/deny.
        ("/deny", &[(403, "PASSED"), (503, "REJECTED")]),
        // An error_page's location does not run the limits again.
        ("/paged", &[(200, "PASSED"), (200, "REJECTED")]),
    ];
    for (path, want) in cases {
        let mut got = Vec::new();
        for _ in 0..want.len() {
            let (v, n) = t.send(&get(path, "")).await;
            got.push((verdict(&v, "X-Limit"), verdict(&n, "X-Limit")));
        }
        let (v, n): (Vec<_>, Vec<_>) = got.into_iter().unzip();
        assert_eq!(v, n, "{path}: vigil, then nginx");
        assert_eq!(n, expect(want), "{path}: nginx as expected");
    }
    // Two limits: a rejection by the second charges none of the first; an
    // empty key ($http_x_key without the field) is not accounted.
    let keys = ["k1", "k1", "k2", "k3", "", "k4"];
    let mut got = Vec::new();
    for k in keys {
        let extra = if k.is_empty() {
            String::new()
        } else {
            format!("X-Key: {k}\r\n")
        };
        let (v, n) = t.send(&get("/two", &extra)).await;
        got.push((verdict(&v, "X-Limit"), verdict(&n, "X-Limit")));
    }
    let (v, n): (Vec<_>, Vec<_>) = got.into_iter().unzip();
    assert_eq!(v, n, "/two: vigil, then nginx");
    let statuses: Vec<u16> = n.iter().map(|(s, _)| *s).collect();
    assert_eq!(statuses, [200, 503, 200, 200, 200, 503]);
    // Each backend saw the requests that passed, and only those.
    let (vs, ns) = t.seen(0);
    let uris = |s: &[crate::support::Seen]| s.iter().map(|r| r.uri.clone()).collect::<Vec<_>>();
    assert_eq!(uris(&vs), uris(&ns));
    assert_eq!(ns.len(), 3 + 1 + 3 + 2 + 4);
}

#[tokio::test]
async fn a_burst_is_delayed_as_nginx_delays_it() {
    let t = Twin::start(REQ, 1).await;
    for (path, want) in [
        (
            "/delay",
            expect(&[
                (200, "DELAYED"),
                (200, "DELAYED"),
                (200, "PASSED"),
                (503, "REJECTED"),
                (503, "REJECTED"),
            ]),
        ),
        (
            "/delay1",
            expect(&[
                (200, "DELAYED"),
                (200, "PASSED"),
                (200, "PASSED"),
                (503, "REJECTED"),
            ]),
        ),
    ] {
        let (v, n) = tokio::join!(
            burst(t.vigil.addr, path, want.len()),
            burst(t.nginx.addr, path, want.len())
        );
        assert_eq!(sorted(v), sorted(n.clone()), "{path}: vigil, then nginx");
        assert_eq!(sorted(n), want, "{path}: nginx as expected");
    }
    let (vs, ns) = t.seen(0);
    assert_eq!(
        (vs.len(), ns.len()),
        (6, 6),
        "the delayed reached the backend"
    );
}

#[tokio::test]
async fn limit_conn_refuses_a_second_request_in_flight_until_the_first_ends() {
    let conf = r#"
        limit_conn_zone $binary_remote_addr zone=perip:1m;
        upstream g { server {R0}; }
        server { listen {LISTEN};
          add_header X-Conn $limit_conn_status always;
          location /held { limit_conn perip 1; proxy_pass http://g; }
          location /free { proxy_pass http://g; }
        }"#;
    let sides = PerSide::start(
        conf,
        [Gated::start().await, Gated::start().await],
        [Gated::start().await, Gated::start().await],
    )
    .await;
    let mut outcomes = Vec::new();
    for (addr, backends, name) in sides.sides() {
        let gate = &backends[0];
        let mut first = TcpStream::connect(addr).await.expect("connect");
        first.write_all(&get("/held", "")).await.expect("write");
        eventually(&format!("{name}: the first request upstream"), || {
            gate.requests() == 1
        })
        .await;
        let second = crate::twin::raw(addr, &get("/held", "")).await;
        // A location without limit_conn is not counted.
        let mut free = TcpStream::connect(addr).await.expect("connect");
        free.write_all(&get("/free", "")).await.expect("write");
        eventually(&format!("{name}: /free upstream"), || gate.requests() == 2).await;
        gate.release();
        let first = read_all(first).await;
        let free = read_all(free).await;
        let third = crate::twin::raw(addr, &get("/held", "")).await;
        outcomes.push((
            [
                verdict(&first, "X-Conn"),
                verdict(&second, "X-Conn"),
                verdict(&free, "X-Conn"),
                verdict(&third, "X-Conn"),
            ],
            gate.requests(),
        ));
    }
    assert_eq!(outcomes[0], outcomes[1], "vigil, then nginx");
    assert_eq!(
        outcomes[1],
        (
            [
                (200, "PASSED".to_string()),
                (503, "REJECTED".to_string()),
                (200, String::new()),
                (200, "PASSED".to_string()),
            ],
            3
        )
    );
}

/// A backend that reads a request head and answers 200 once released
/// (at once after that); it counts the requests it read.
#[derive(Clone)]
struct Gated {
    addr: SocketAddr,
    requests: Arc<AtomicUsize>,
    open: Arc<tokio::sync::watch::Sender<bool>>,
}

impl Gated {
    async fn start() -> Self {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let gated = Self {
            addr: l.local_addr().expect("addr"),
            requests: Arc::default(),
            open: Arc::new(tokio::sync::watch::channel(false).0),
        };
        let g = gated.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let g = g.clone();
                tokio::spawn(async move {
                    let mut got = Vec::new();
                    let mut b = [0u8; 1024];
                    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                        match s.read(&mut b).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => got.extend_from_slice(&b[..n]),
                        }
                    }
                    g.requests.fetch_add(1, Ordering::SeqCst);
                    let mut open = g.open.subscribe();
                    if open.wait_for(|o| *o).await.is_err() {
                        return;
                    }
                    let _ = s
                        .write_all(
                            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
                        )
                        .await;
                });
            }
        });
        gated
    }

    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }

    fn release(&self) {
        self.open.send_replace(true);
    }
}

impl Addressed for Gated {
    fn addr(&self) -> SocketAddr {
        self.addr
    }
}

#[tokio::test]
async fn a_client_that_leaves_while_delayed_is_logged_499_and_never_sent_upstream() {
    let conf = r#"
        log_format st "$request_uri $status $limit_req_status";
        limit_req_zone $binary_remote_addr zone=g:1m rate=1r/m;
        upstream u { server {B0}; }
        server { listen {LISTEN}; access_log {LOG}/st.log st;
          location / { limit_req zone=g burst=5; proxy_pass http://u; } }"#;
    let (vd, nd) = (
        tempfile::tempdir().expect("tmp"),
        tempfile::tempdir().expect("tmp"),
    );
    let side = |d: &std::path::Path| vec![("{LOG}".to_string(), d.display().to_string())];
    let t = Twin::start_texts(conf, 1, &side(vd.path()), &side(nd.path())).await;
    let (v, n) = t.send(&get("/1", "")).await;
    assert_eq!((v.status, n.status), (200, 200));
    for addr in [t.vigil.addr, t.nginx.addr] {
        // Delayed 62.5 s (longer than any wait here); the client leaves at once.
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(&get("/2", "")).await.expect("write");
        drop(s);
    }
    let log = |d: &std::path::Path| std::fs::read_to_string(d.join("st.log")).unwrap_or_default();
    eventually("both logs to note /2", || {
        log(vd.path()).contains("/2 ") && log(nd.path()).contains("/2 ")
    })
    .await;
    assert_eq!(log(vd.path()), log(nd.path()), "vigil, then nginx");
    assert_eq!(log(nd.path()), "/1 200 PASSED\n/2 499 DELAYED\n");
    let (vs, ns) = t.seen(0);
    assert_eq!(
        (vs.len(), ns.len()),
        (1, 1),
        "the delayed request never went upstream"
    );
}

#[tokio::test]
async fn limits_apply_where_files_are_served_as_nginx() {
    let root = tempfile::tempdir().expect("tmp");
    std::fs::write(root.path().join("f.txt"), "file\n").expect("write");
    let conf = r#"
        limit_req_zone $binary_remote_addr zone=fs:1m rate=6r/m;
        limit_req zone=fs burst=1 nodelay;
        server { listen {LISTEN};
          add_header X-Limit $limit_req_status always;
          location /f.txt { root {ROOT}; }
          location /own/ { limit_req_status 429; alias {ROOT}/; }
        }"#;
    let side = vec![("{ROOT}".to_string(), root.path().display().to_string())];
    let t = Twin::start_texts(conf, 0, &side, &side).await;
    // The http level's limit reaches the static location: two pass (one
    // and the burst), the third is refused; the other location has its
    // own key space in the same zone, so its first is refused too, 429.
    for (path, want) in [
        (
            "/f.txt",
            &[(200, "PASSED"), (200, "PASSED"), (503, "REJECTED")][..],
        ),
        ("/own/f.txt", &[(429, "REJECTED")][..]),
    ] {
        let mut got = Vec::new();
        for _ in 0..want.len() {
            let (v, n) = t.send(&get(path, "")).await;
            got.push((verdict(&v, "X-Limit"), verdict(&n, "X-Limit")));
        }
        let (v, n): (Vec<_>, Vec<_>) = got.into_iter().unzip();
        assert_eq!(v, n, "{path}: vigil, then nginx");
        assert_eq!(n, expect(want), "{path}: nginx as expected");
    }
}
