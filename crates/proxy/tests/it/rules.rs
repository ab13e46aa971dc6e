//! The health rules beyond nginx (`passive_penalty`, `passive_recovery
//! probation`, `slow_start`, `max_ejected`) through the proxy, against real
//! backends on 127.0.0.1, in tokio's paused time: the windows, penalties
//! and ramps are core's, on tokio's clock, so the tests move time instead
//! of waiting for it.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio::time::advance;

use crate::support::{eventually, get, start_proxy, Backend, Running};

/// A port nothing listens on: connecting is refused at once.
fn refused() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr")
}

fn upstreams_of(conf: &str) -> String {
    format!(
        "http {{ {conf}
           server {{ listen {{LISTEN}};
             add_header X-Upstream-Addr $upstream_addr always;
             location / {{ proxy_pass http://u; proxy_next_upstream error timeout http_503; }} }} }}"
    )
}

async fn attempts(p: &Running, path: &str) -> String {
    get(p.addr, path).await.header("x-upstream-addr")
}

/// A backend that answers 503 while `failing`, and holds `/hold`
/// requests until `release` (counting those held).
struct Flaky {
    addr: SocketAddr,
    failing: Arc<AtomicBool>,
    held: Arc<AtomicUsize>,
    release: Arc<Notify>,
}

impl Flaky {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let failing = Arc::new(AtomicBool::new(false));
        let held = Arc::new(AtomicUsize::new(0));
        let release = Arc::new(Notify::new());
        let (f, h, r) = (failing.clone(), held.clone(), release.clone());
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (f, h, r) = (f.clone(), h.clone(), r.clone());
                tokio::spawn(async move {
                    let svc = service_fn(move |req: Request<Incoming>| {
                        let (f, h, r) = (f.clone(), h.clone(), r.clone());
                        async move {
                            let mut resp = Response::new(Full::new(Bytes::from("flaky")));
                            if f.load(Ordering::SeqCst) {
                                *resp.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                            } else if req.uri().path() == "/hold" {
                                let released = r.notified();
                                h.fetch_add(1, Ordering::SeqCst);
                                released.await;
                                h.fetch_sub(1, Ordering::SeqCst);
                            }
                            Ok::<_, Infallible>(resp)
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Self {
            addr,
            failing,
            held,
            release,
        }
    }

    fn fail(&self, on: bool) {
        self.failing.store(on, Ordering::SeqCst);
    }

    fn held(&self) -> usize {
        self.held.load(Ordering::SeqCst)
    }
}

/// Each exclusion in a row lasts twice the one before, up to `max`; a
/// backup shows when the primary is left out, so no round-robin weights
/// blur the window.
#[tokio::test(start_paused = true)]
async fn passive_penalty_doubles_each_exclusion_in_a_row_up_to_max() {
    let dead = refused();
    let good = Backend::named("good").await;
    let p = start_proxy(&upstreams_of(&format!(
        "upstream u {{ server {dead} fail_timeout=1s; server {} backup;
           passive_penalty base=10s max=40s; }}",
        good.addr
    )))
    .await;
    let tried = format!("{dead}, {}", good.addr);
    let skipped = good.addr.to_string();
    assert_eq!(attempts(&p, "/").await, tried, "first failure");
    for secs in [10, 20, 40, 40] {
        advance(Duration::from_secs(secs - 1)).await;
        assert_eq!(
            attempts(&p, "/").await,
            skipped,
            "inside a {secs}s exclusion"
        );
        advance(Duration::from_secs(2)).await;
        assert_eq!(attempts(&p, "/").await, tried, "after a {secs}s exclusion");
    }
}

/// Without `passive_penalty` the same peer is left out for `fail_timeout`
/// every time (nginx).
#[tokio::test(start_paused = true)]
async fn without_passive_penalty_every_exclusion_lasts_fail_timeout() {
    let dead = refused();
    let good = Backend::named("good").await;
    let p = start_proxy(&upstreams_of(&format!(
        "upstream u {{ server {dead} fail_timeout=10s; server {} backup; }}",
        good.addr
    )))
    .await;
    let tried = format!("{dead}, {}", good.addr);
    assert_eq!(attempts(&p, "/").await, tried);
    for _ in 0..3 {
        advance(Duration::from_secs(9)).await;
        assert_eq!(attempts(&p, "/").await, good.addr.to_string());
        advance(Duration::from_secs(2)).await;
        assert_eq!(attempts(&p, "/").await, tried);
    }
}

/// `passive_recovery probation=2`: after its exclusion the peer takes one
/// request at a time (a second concurrent one goes to the backup) until
/// two succeed in a row, where nginx readmits it after one; then it takes concurrent requests again. A failed
/// probation request excludes it again at once.
#[tokio::test(start_paused = true)]
async fn probation_admits_one_request_at_a_time_until_two_succeed() {
    let flaky = Flaky::start().await;
    let good = Backend::named("good").await;
    let p = start_proxy(&upstreams_of(&format!(
        "upstream u {{ server {} fail_timeout=5s; server {} backup;
           passive_recovery probation=2; }}",
        flaky.addr, good.addr
    )))
    .await;
    let (f, g) = (flaky.addr.to_string(), good.addr.to_string());
    flaky.fail(true);
    assert_eq!(attempts(&p, "/").await, format!("{f}, {g}"));
    flaky.fail(false);
    advance(Duration::from_secs(6)).await;

    // Probation: the first request is held at the peer; a second one
    // meanwhile goes to the backup (nginx's trial request is alone too).
    let addr = p.addr;
    let first = tokio::spawn(async move { get(addr, "/hold").await });
    eventually("the probation request at the peer", || flaky.held() == 1).await;
    assert_eq!(attempts(&p, "/").await, g, "one at a time in probation");
    flaky.release.notify_waiters();
    assert_eq!(first.await.expect("join").header("x-upstream-addr"), f);
    // One success is not enough (nginx would readmit it now): still one at
    // a time.
    let second = tokio::spawn(async move { get(addr, "/hold").await });
    eventually("the second probation request", || flaky.held() == 1).await;
    assert_eq!(attempts(&p, "/hold").await, g, "still in probation");
    flaky.release.notify_waiters();
    assert_eq!(second.await.expect("join").header("x-upstream-addr"), f);
    // Two in a row: back in full service, concurrent requests again.
    let held: Vec<_> = (0..2)
        .map(|_| tokio::spawn(async move { get(addr, "/hold").await }))
        .collect();
    eventually("two concurrent requests at the peer", || flaky.held() == 2).await;
    flaky.release.notify_waiters();
    for h in held {
        assert_eq!(h.await.expect("join").header("x-upstream-addr"), f);
    }

    // Fail again: excluded; after the window a failed probation request
    // excludes it again at once, without waiting for a second failure.
    flaky.fail(true);
    assert_eq!(attempts(&p, "/").await, format!("{f}, {g}"));
    advance(Duration::from_secs(6)).await;
    assert_eq!(
        attempts(&p, "/").await,
        format!("{f}, {g}"),
        "probation try fails"
    );
    flaky.fail(false);
    assert_eq!(attempts(&p, "/").await, g, "excluded again");
}

/// `slow_start=20s`: after its exclusion the peer's share of round robin
/// grows over the ramp instead of jumping back to half.
#[tokio::test(start_paused = true)]
async fn slow_start_ramps_a_readmitted_peers_share() {
    let flaky = Flaky::start().await;
    let steady = Backend::named("steady").await;
    let p = start_proxy(&upstreams_of(&format!(
        "upstream u {{ server {} weight=10 slow_start=20s; server {} weight=10; }}",
        flaky.addr, steady.addr
    )))
    .await;
    let f = flaky.addr.to_string();
    flaky.fail(true);
    assert_eq!(
        attempts(&p, "/").await,
        format!("{f}, {}", steady.addr),
        "the first pick is the flaky peer, which fails"
    );
    flaky.fail(false);
    advance(Duration::from_secs(11)).await;
    let mut shares = Vec::new();
    // Batches at the ramp's start, near its middle, and after its end.
    for step in [0, 9, 16] {
        advance(Duration::from_secs(step)).await;
        let mut got = 0;
        for _ in 0..60 {
            if attempts(&p, "/").await == f {
                got += 1;
            }
        }
        shares.push(got);
    }
    assert!(
        shares[0] < shares[1] && shares[1] < shares[2],
        "the share grows: {shares:?}"
    );
    assert!(shares[0] <= 15, "ramp start near a tenth: {shares:?}");
    assert!(
        (29..=31).contains(&shares[2]),
        "full weight after the ramp: {shares:?}"
    );
}

/// `max_ejected 34%` of three peers: when two fail, only one may be left
/// out, so the other keeps taking requests (and answering them, once it is
/// well); without the rule both are left out for `fail_timeout`.
#[tokio::test(start_paused = true)]
async fn max_ejected_keeps_the_least_bad_peer_in_service() {
    for (rule, kept) in [("", false), ("max_ejected 34%;", true)] {
        let a = Flaky::start().await;
        let b = Flaky::start().await;
        let c = Backend::named("c").await;
        let p = start_proxy(&upstreams_of(&format!(
            "upstream u {{ server {} fail_timeout=30s; server {} fail_timeout=30s;
               server {} fail_timeout=30s; {rule} }}",
            a.addr, b.addr, c.addr
        )))
        .await;
        a.fail(true);
        b.fail(true);
        // A, then B on the next pick: both fail and are charged.
        let mut saw = Vec::new();
        for _ in 0..3 {
            saw.push(attempts(&p, "/").await);
        }
        a.fail(false);
        b.fail(false);
        let (sa, sb) = (a.addr.to_string(), b.addr.to_string());
        let mut reached = 0;
        for _ in 0..12 {
            let got = attempts(&p, "/").await;
            if got.contains(&sa) || got.contains(&sb) {
                reached += 1;
            }
        }
        if kept {
            assert!(
                reached >= 3,
                "{rule}: one of A, B stays in service ({reached}, {saw:?})"
            );
        } else {
            assert_eq!(reached, 0, "nginx: both left out ({saw:?})");
        }
    }
}
