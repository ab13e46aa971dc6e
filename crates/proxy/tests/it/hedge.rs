//! `hedge` and `retry_budget` through the proxy: a hanging backend and a
//! fast one, who answered, what each backend saw, what the access log and
//! the metrics say. Every wait is bounded; nothing asserts a duration.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use http_body_util::Full;
use hyper::Response;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;
use vigil_core::event::EventBus;
use vigil_core::Clock;
use vigil_net::SystemClock;
use vigil_proxy::{Generation, Proxy, ProxyMetrics};

use crate::support::{eventually, load, request, send, Backend, Got};

/// A backend that reads each request head and never answers; it notes the
/// request line and when the proxy closes the connection.
pub(crate) struct Hang {
    pub(crate) addr: SocketAddr,
    lines: Arc<Mutex<Vec<String>>>,
    closed: Arc<AtomicUsize>,
}

impl Hang {
    pub(crate) async fn start() -> Self {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = l.local_addr().expect("addr");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let closed = Arc::new(AtomicUsize::new(0));
        let (ls, cs) = (lines.clone(), closed.clone());
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let (ls, cs) = (ls.clone(), cs.clone());
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 4096];
                    loop {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => {
                                let noted = head.windows(4).any(|w| w == b"\r\n\r\n");
                                head.extend_from_slice(&buf[..n]);
                                if !noted && head.windows(4).any(|w| w == b"\r\n\r\n") {
                                    let text = String::from_utf8_lossy(&head);
                                    let line = text.lines().next().unwrap_or("").to_string();
                                    ls.lock().expect("lock").push(line);
                                }
                            }
                        }
                    }
                    // EOF: the proxy closed the connection.
                    cs.fetch_add(1, Ordering::SeqCst);
                    let _ = s.shutdown().await;
                });
            }
        });
        Self {
            addr,
            lines,
            closed,
        }
    }

    fn lines(&self) -> Vec<String> {
        self.lines.lock().expect("lock").clone()
    }
}

struct Served {
    addr: SocketAddr,
    metrics: Arc<ProxyMetrics>,
    _shutdown: CancellationToken,
}

impl Served {
    fn metric(&self, line_start: &str) -> u64 {
        let mut text = String::new();
        self.metrics.write_prometheus(&mut text);
        text.lines()
            .find_map(|l| l.strip_prefix(line_start))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {line_start} in\n{text}"))
    }
}

async fn serve(conf: &str) -> Served {
    let addr = vigil_testkit::free_addr();
    let config = load(&conf.replace("{LISTEN}", &addr.to_string()));
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    let events = Arc::new(EventBus::default());
    let generation =
        Generation::build(config, None, events.clone(), clock.clone()).expect("routes");
    let metrics = Arc::new(ProxyMetrics::new());
    let proxy = Arc::new(
        Proxy::new(generation, events, clock, std::env::temp_dir()).with_metrics(metrics.clone()),
    );
    let listener = vigil_proxy::bind(addr, false, None).expect("bind proxy");
    let shutdown = CancellationToken::new();
    tokio::spawn(vigil_proxy::serve(
        proxy,
        listener,
        shutdown.clone(),
        Duration::from_secs(1),
    ));
    Served {
        addr,
        metrics,
        _shutdown: shutdown,
    }
}

/// A request answered within 10 s (a hedge that never went out would wait
/// for the 60 s read timeout).
async fn bounded(addr: SocketAddr, method: &str) -> Got {
    let body = if method == "POST" { "payload" } else { "" };
    tokio::time::timeout(
        Duration::from_secs(10),
        send(addr, request(method, "/h", body)),
    )
    .await
    .expect("answered within 10 s")
}

fn log_lines(path: &std::path::Path, n: usize) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .take(n)
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

async fn logged(path: &std::path::Path, n: usize) -> Vec<serde_json::Value> {
    eventually("access log lines", || {
        std::fs::read_to_string(path).is_ok_and(|s| s.lines().count() >= n)
    })
    .await;
    log_lines(path, n)
}

#[tokio::test]
async fn a_hung_peer_is_hedged_and_the_fast_one_answers() {
    let hang = Hang::start().await;
    let fast = Backend::named("fast").await;
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("access.log");
    // Round robin starts at the first server: the hanging one.
    let p = serve(&format!(
        "http {{ upstream u {{ server {}; server {}; hedge after=50ms; }}
           server {{ listen {{LISTEN}}; access_log {} json;
             location / {{ proxy_pass http://u; }} }} }}",
        hang.addr,
        fast.addr,
        log.display()
    ))
    .await;
    let got = bounded(p.addr, "GET").await;
    assert_eq!((got.status, got.text()), (200, "fast".to_string()));
    // Both attempts, in the order they started; the cancelled one has no
    // status (nginx shows `-` for an attempt cut short without a response).
    let v = &logged(&log, 1).await[0];
    assert_eq!(
        v["upstream_addr"],
        serde_json::json!([hang.addr.to_string(), fast.addr.to_string()])
    );
    assert_eq!(v["upstream_status"], serde_json::json!([null, 200]));
    // The hung attempt's connection is closed, never kept.
    eventually("the hung connection closed", || {
        hang.closed.load(Ordering::SeqCst) == 1
    })
    .await;
    assert_eq!(hang.lines(), vec!["GET /h HTTP/1.1".to_string()]);
    assert_eq!(fast.requests().len(), 1);
    assert_eq!(p.metric("vigil_hedges_total{upstream=\"u\"}"), 1);
    // The loser was not charged: the hanging peer is still eligible. Round
    // robin weighed the hedge as a pick of the fast peer, so the next
    // request goes to the fast one and the one after to the hanging one,
    // which is hedged again.
    assert_eq!(bounded(p.addr, "GET").await.text(), "fast");
    assert_eq!(hang.lines().len(), 1);
    assert_eq!(bounded(p.addr, "GET").await.text(), "fast");
    assert_eq!(hang.lines().len(), 2);
    assert_eq!(p.metric("vigil_hedges_total{upstream=\"u\"}"), 2);
    assert_eq!(fast.requests().len(), 3);
}

#[tokio::test]
async fn a_post_is_never_hedged() {
    let hang = Hang::start().await;
    let fast = Backend::named("fast").await;
    let p = serve(&format!(
        "http {{ upstream u {{ server {}; server {}; hedge after=50ms; }}
           server {{ listen {{LISTEN}};
             location / {{ proxy_pass http://u; proxy_read_timeout 300ms;
                           proxy_next_upstream error timeout non_idempotent; }} }} }}",
        hang.addr, fast.addr
    ))
    .await;
    let got = bounded(p.addr, "POST").await;
    // Even with non_idempotent listed, the POST is not hedged: it waits for
    // the read timeout on the hanging peer, and that timeout is retried
    // (nginx's non_idempotent rule) only after the first attempt ended.
    assert_eq!(hang.lines(), vec!["POST /h HTTP/1.1".to_string()]);
    assert_eq!(p.metric("vigil_hedges_total{upstream=\"u\"}"), 0);
    assert_eq!(got.status, 200, "retried after the timeout, as nginx does");
    assert_eq!(fast.requests().len(), 1);
    // Without non_idempotent: the hanging backend sees it exactly once and
    // nothing else sees anything.
    let hang = Hang::start().await;
    let fast = Backend::named("fast").await;
    let p = serve(&format!(
        "http {{ upstream u {{ server {}; server {}; hedge after=50ms; }}
           server {{ listen {{LISTEN}};
             location / {{ proxy_pass http://u; proxy_read_timeout 300ms; }} }} }}",
        hang.addr, fast.addr
    ))
    .await;
    let got = bounded(p.addr, "POST").await;
    assert_eq!(got.status, 504);
    assert_eq!(hang.lines(), vec!["POST /h HTTP/1.1".to_string()]);
    assert!(fast.requests().is_empty(), "{:?}", fast.requests());
    assert_eq!(p.metric("vigil_hedges_total{upstream=\"u\"}"), 0);
}

#[tokio::test]
async fn the_budget_stops_retries_when_exhausted() {
    let bad = Backend::start(|_| {
        let mut r = Response::new(Full::new(Bytes::from("busy")));
        *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        r
    })
    .await;
    let good = Backend::named("good").await;
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("access.log");
    // Each request earns half a retry; no reserve.
    let p = serve(&format!(
        "http {{ upstream u {{ server {} max_fails=10; server {}; retry_budget ratio=50% min=0/s; }}
           server {{ listen {{LISTEN}}; access_log {} json;
             location / {{ proxy_pass http://u; proxy_next_upstream error timeout http_503; }} }} }}",
        bad.addr,
        good.addr,
        log.display()
    ))
    .await;
    // 1st request: half a token, the 503 is not retried but answered.
    let first = bounded(p.addr, "GET").await;
    assert_eq!(first.status, 503);
    // 2nd: round robin goes to the good one (a whole token now).
    assert_eq!(bounded(p.addr, "GET").await.text(), "good");
    // 3rd: the bad one again, and this time the retry is paid for.
    assert_eq!(bounded(p.addr, "GET").await.text(), "good");
    let lines = logged(&log, 3).await;
    let statuses: Vec<_> = lines.iter().map(|l| l["upstream_status"].clone()).collect();
    assert_eq!(
        statuses,
        vec![
            serde_json::json!([503]),
            serde_json::json!([200]),
            serde_json::json!([503, 200])
        ]
    );
    assert_eq!(bad.requests().len(), 2);
    assert_eq!(
        p.metric("vigil_retries_denied_total{upstream=\"u\",reason=\"budget\"}"),
        1
    );
    assert_eq!(p.metric("vigil_retries_total{upstream=\"u\"}"), 1);
    // The denied 503 was still charged to the bad peer, as the retried one was.
    assert_eq!(
        p.metric(&format!(
            "vigil_failures_counted_total{{upstream=\"u\",peer=\"{}\",class=\"http_503\"}}",
            bad.addr
        )),
        2
    );
}

#[tokio::test]
async fn a_hedge_the_budget_denies_keeps_waiting_on_the_first() {
    let hang = Hang::start().await;
    let fast = Backend::named("fast").await;
    let p = serve(&format!(
        "http {{ upstream u {{ server {}; server {}; hedge after=50ms; retry_budget ratio=0% min=0/s; }}
           server {{ listen {{LISTEN}};
             location / {{ proxy_pass http://u; proxy_read_timeout 300ms; }} }} }}",
        hang.addr, fast.addr
    ))
    .await;
    let got = bounded(p.addr, "GET").await;
    // No hedge, and the timeout's retry is denied too: nginx's answer to a
    // timeout that cannot be retried.
    assert_eq!(got.status, 504);
    assert!(fast.requests().is_empty());
    assert_eq!(hang.lines().len(), 1);
    assert_eq!(p.metric("vigil_hedges_total{upstream=\"u\"}"), 0);
    assert_eq!(
        p.metric("vigil_retries_denied_total{upstream=\"u\",reason=\"budget\"}"),
        2,
        "the hedge and the retry"
    );
}

/// What one proxy did with a POST to a hanging first peer: the status,
/// the request lines the hanging peer saw, and the requests the fast one saw.
async fn post_to_hanging(next_upstream: &str, nginx: bool) -> (u16, Vec<String>, usize) {
    let hang = Hang::start().await;
    let fast = Backend::named("fast").await;
    let body = format!(
        "upstream u {{ server {}; server {}; }}
         server {{ listen {{LISTEN}};
           location / {{ proxy_pass http://u; proxy_read_timeout 300ms; {next_upstream} }} }}",
        hang.addr, fast.addr
    );
    let req =
        b"POST /h HTTP/1.1\r\nHost: x\r\nContent-Length: 7\r\nConnection: close\r\n\r\npayload";
    let status = if nginx {
        let addr = vigil_testkit::free_addr();
        let n = crate::twin::Nginx::start(&body.replace("{LISTEN}", &addr.to_string()), addr).await;
        let got = crate::twin::raw(n.addr, req).await.status;
        drop(n);
        got
    } else {
        let p = serve(&format!("http {{ {body} }}")).await;
        crate::twin::raw(p.addr, req).await.status
    };
    // vigil's wire is always HTTP/1.1, nginx's default 1.0: compare the
    // method and target.
    let lines = hang
        .lines()
        .iter()
        .map(|l| {
            l.rsplit_once(' ')
                .map_or(l.as_str(), |(a, _)| a)
                .to_string()
        })
        .collect();
    (status, lines, fast.requests().len())
}

#[tokio::test]
async fn a_post_sent_whole_times_out_at_proxy_read_timeout_as_in_nginx() {
    // The body is all sent at once, so proxy_read_timeout (300ms) runs, not
    // proxy_send_timeout (60s): `twin::raw` would give up after 5 s.
    for next in ["", "proxy_next_upstream error timeout non_idempotent;"] {
        let vigil = post_to_hanging(next, false).await;
        let nginx = post_to_hanging(next, true).await;
        assert_eq!(vigil, nginx, "{next}");
        let want = if next.is_empty() { 504 } else { 200 };
        assert_eq!(vigil.0, want, "{next}");
        assert_eq!(vigil.1, vec!["POST /h".to_string()]);
    }
}

/// A port whose SYNs go unanswered: a listener with a backlog of 0 that
/// never accepts, its accept queue filled first. Kept open while alive.
struct Blackhole {
    addr: SocketAddr,
    _listener: socket2::Socket,
    _fillers: Vec<std::net::TcpStream>,
}

impl Blackhole {
    fn start() -> Self {
        use socket2::{Domain, Socket, Type};
        let s = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
        s.bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into())
            .expect("bind");
        s.listen(0).expect("listen");
        let addr = s.local_addr().expect("addr").as_socket().expect("inet");
        let mut fillers = Vec::new();
        for _ in 0..8 {
            match std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
                Ok(c) => fillers.push(c),
                Err(_) => break,
            }
        }
        Self {
            addr,
            _listener: s,
            _fillers: fillers,
        }
    }
}

/// A POST cannot be sent twice, but while its attempt is still connecting
/// nothing was sent: it races a connect to another peer after `after`, and
/// is sent once, on the connection ready first. Without `hedge` it waits
/// for `proxy_connect_timeout` (nginx).
#[tokio::test]
async fn a_post_still_connecting_races_a_connect_and_is_sent_once() {
    let hole = Blackhole::start();
    let fast = Backend::named("fast").await;
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("access.log");
    // Round robin starts at the first server: the blackholed one.
    let p = serve(&format!(
        "http {{ upstream u {{ server {}; server {}; hedge after=50ms; }}
           server {{ listen {{LISTEN}}; access_log {} json;
             location / {{ proxy_pass http://u; proxy_connect_timeout 5s; }} }} }}",
        hole.addr,
        fast.addr,
        log.display()
    ))
    .await;
    let got = bounded(p.addr, "POST").await;
    assert_eq!((got.status, got.text()), (200, "fast".to_string()));
    let seen = fast.requests();
    assert_eq!(seen.len(), 1, "sent once");
    assert_eq!(
        (seen[0].method.as_str(), &seen[0].body[..]),
        ("POST", &b"payload"[..])
    );
    assert_eq!(p.metric("vigil_hedges_total{upstream=\"u\"}"), 1);
    let v = &logged(&log, 1).await[0];
    assert_eq!(
        v["upstream_addr"],
        serde_json::json!([hole.addr.to_string(), fast.addr.to_string()])
    );
    assert_eq!(v["upstream_status"], serde_json::json!([null, 200]));
    // A POST whose attempt connected is not raced (a_post_is_never_hedged),
    // and a GET to the blackhole is raced the same way.
    let got = bounded(p.addr, "GET").await;
    assert_eq!(got.text(), "fast");
}

/// A request with `method` and `body` answered within 10 s.
async fn bounded_with(addr: SocketAddr, method: &str, body: &'static str) -> Got {
    tokio::time::timeout(
        Duration::from_secs(10),
        send(addr, request(method, "/h", body)),
    )
    .await
    .expect("answered within 10 s")
}

#[tokio::test]
async fn only_safe_requests_without_a_body_are_hedged() {
    // DELETE and PUT are idempotent, but run twice at once a PUT can undo
    // another client's write between them and a DELETE's second run
    // answers 404; an unknown method's effects are unknown, and a GET with
    // a body has no defined meaning. Each waits for the read timeout on
    // the hanging peer and is then retried as nginx retries it (these are
    // not POST, LOCK or PATCH), never sent to two peers at once.
    for (method, body) in [
        ("DELETE", ""),
        ("PUT", "payload"),
        ("PURGE", ""),
        ("GET", "a body"),
    ] {
        let hang = Hang::start().await;
        let fast = Backend::named("fast").await;
        let p = serve(&format!(
            "http {{ upstream u {{ server {}; server {}; hedge after=50ms; }}
               server {{ listen {{LISTEN}};
                 location / {{ proxy_pass http://u; proxy_read_timeout 300ms; }} }} }}",
            hang.addr, fast.addr
        ))
        .await;
        let got = bounded_with(p.addr, method, body).await;
        assert_eq!(
            p.metric("vigil_hedges_total{upstream=\"u\"}"),
            0,
            "{method} with {body:?}: not hedged"
        );
        assert_eq!(hang.lines().len(), 1, "{method}");
        assert_eq!(
            (got.status, fast.requests().len()),
            (200, 1),
            "{method}: retried after the timeout, as nginx does"
        );
    }
    // The safe methods without a body are.
    for method in ["HEAD", "OPTIONS"] {
        let hang = Hang::start().await;
        let fast = Backend::named("fast").await;
        let p = serve(&format!(
            "http {{ upstream u {{ server {}; server {}; hedge after=50ms; }}
               server {{ listen {{LISTEN}};
                 location / {{ proxy_pass http://u; }} }} }}",
            hang.addr, fast.addr
        ))
        .await;
        let got = bounded_with(p.addr, method, "").await;
        assert_eq!(got.status, 200, "{method}");
        assert_eq!(
            p.metric("vigil_hedges_total{upstream=\"u\"}"),
            1,
            "{method}: hedged"
        );
    }
}
