//! Reloads that change `listen`, on real workers (threads with their own
//! runtimes and listeners): new addresses answer, removed ones stop
//! accepting while their requests finish, and a reload that cannot listen
//! is refused whole.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;
use vigil_core::event::EventBus;
use vigil_core::Clock;
use vigil_net::SystemClock;
use vigil_proxy::worker::{self, ReloadError, Workers};
use vigil_proxy::{Generation, Proxy};

use crate::support::{eventually, get, load};

/// A backend answering with its name; `/slow` waits until released.
struct Gated {
    addr: SocketAddr,
    arrived: Arc<AtomicUsize>,
    release: watch::Sender<bool>,
}

impl Gated {
    async fn start(name: &'static str) -> Self {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = l.local_addr().expect("addr");
        let arrived = Arc::new(AtomicUsize::new(0));
        let (release, open) = watch::channel(false);
        let a = arrived.clone();
        tokio::spawn(async move {
            while let Ok((s, _)) = l.accept().await {
                let (a, open) = (a.clone(), open.clone());
                let svc = service_fn(move |req: Request<Incoming>| {
                    let (a, mut open) = (a.clone(), open.clone());
                    async move {
                        if req.uri().path() == "/slow" {
                            a.fetch_add(1, Ordering::SeqCst);
                            let _ = open.wait_for(|v| *v).await;
                        }
                        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(name))))
                    }
                });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(s), svc),
                );
            }
        });
        Self {
            addr,
            arrived,
            release,
        }
    }
}

fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
}

fn conf(backend: SocketAddr, listen: &[SocketAddr]) -> vigil_core::config::Config {
    let listens: String = listen.iter().map(|a| format!("listen {a}; ")).collect();
    load(&format!(
        "http {{ upstream u {{ server {backend}; }}
           server {{ {listens} location / {{ proxy_pass http://u; }} }} }}"
    ))
}

/// Two workers serving `config`; stopped on drop.
struct Served {
    proxy: Arc<Proxy>,
    workers: Option<Workers>,
    shutdown: worker::Shutdown,
}

impl Served {
    fn start(config: vigil_core::config::Config) -> Self {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
        let events = Arc::new(EventBus::default());
        let listens = worker::listens(&config);
        let generation =
            Generation::build(config, None, events.clone(), clock.clone()).expect("routes");
        let proxy = Arc::new(Proxy::new(generation, events, clock, std::env::temp_dir()));
        let shutdown = worker::Shutdown::default();
        let workers = worker::spawn(proxy.clone(), &listens, 2, shutdown.clone()).expect("listen");
        Self {
            proxy,
            workers: Some(workers),
            shutdown,
        }
    }

    fn workers(&self) -> &Workers {
        self.workers.as_ref().expect("running")
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.shutdown.fast();
        if let Some(w) = self.workers.take() {
            w.join();
        }
    }
}

/// Whether a connection to `addr` is refused now.
async fn refused(addr: SocketAddr) -> bool {
    matches!(
        tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(addr)).await,
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused
    )
}

#[tokio::test]
async fn a_reload_listens_on_new_addresses_and_drains_removed_ones() {
    let b = Gated::start("b").await;
    let (old, new) = (free_addr(), free_addr());
    let served = Served::start(conf(b.addr, &[old]));
    assert_eq!(get(old, "/").await.status, 200);
    assert!(refused(new).await);

    // A request in flight on the address about to go.
    let in_flight = tokio::spawn(get(old, "/slow"));
    let arrived = b.arrived.clone();
    eventually("the request to reach the backend", || {
        arrived.load(Ordering::SeqCst) == 1
    })
    .await;

    served
        .workers()
        .reload(conf(b.addr, &[new]))
        .expect("reload");
    assert_eq!(served.workers().addrs(), vec![new]);
    let got = get(new, "/").await;
    assert_eq!(
        (got.status, got.text()),
        (200, "b".to_string()),
        "the new address answers"
    );

    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !refused(old).await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the removed address still accepts"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!in_flight.is_finished());
    b.release.send_replace(true);
    let done = tokio::time::timeout(Duration::from_secs(5), in_flight)
        .await
        .expect("the request in flight finishes")
        .expect("join");
    assert_eq!((done.status, done.text()), (200, "b".to_string()));
}

#[tokio::test]
async fn a_reload_that_cannot_listen_fails_and_keeps_the_running_config() {
    let (before, after) = (Gated::start("before").await, Gated::start("after").await);
    let addr = free_addr();
    let served = Served::start(conf(before.addr, &[addr]));
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let taken_addr = taken.local_addr().expect("addr");
    let generation = served.proxy.current().registry.generation();

    let err = served
        .workers()
        .reload(conf(after.addr, &[addr, taken_addr]))
        .expect_err("the address is taken");
    assert!(
        matches!(&err, ReloadError::Listen { addr, .. } if *addr == taken_addr),
        "{err}"
    );
    assert!(err.to_string().contains(&taken_addr.to_string()), "{err}");

    // Nothing of the new configuration is in force.
    assert_eq!(served.proxy.reloads(), 0);
    assert_eq!(served.proxy.current().registry.generation(), generation);
    assert_eq!(served.workers().addrs(), vec![addr]);
    let got = get(addr, "/").await;
    assert_eq!((got.status, got.text()), (200, "before".to_string()));
}

#[tokio::test]
async fn a_kept_address_keeps_its_socket_and_connections_across_a_reload() {
    let (one, two) = (Gated::start("one").await, Gated::start("two").await);
    let (kept, added) = (free_addr(), free_addr());
    let served = Served::start(conf(one.addr, &[kept]));
    // A kept-alive connection opened before the reload.
    let stream = tokio::net::TcpStream::connect(kept).await.expect("connect");
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    let req = || crate::support::request("GET", "/", "");
    assert_eq!(
        sender.send_request(req()).await.expect("first").status(),
        200
    );

    served
        .workers()
        .reload(conf(two.addr, &[kept, added]))
        .expect("reload");
    let r = sender
        .send_request(req())
        .await
        .expect("the same connection still serves");
    let body = http_body_util::BodyExt::collect(r.into_body())
        .await
        .expect("body")
        .to_bytes();
    assert_eq!(body, "two", "under the new configuration");
    for a in [kept, added] {
        assert_eq!(get(a, "/").await.text(), "two", "{a}");
    }
}
