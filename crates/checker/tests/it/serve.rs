//! `vigil serve` with active checks: a hung backend (accepts, never
//! answers) is taken out by probes, and after that no client request is
//! sent to it: every request gets a fast 200 from the good peer.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use tokio_util::sync::CancellationToken;
use vigil_checker::{Checker, CheckerOptions, TlsPolicy};
use vigil_core::event::EventBus;
use vigil_core::Clock;
use vigil_net::SystemClock;
use vigil_proxy::{Generation, Proxy};

use crate::support::{eventually, load, Behaviour, Raw};

const GOOD: &str = "HTTP/1.1 200 OK\r\nContent-Length: 4\r\nConnection: close\r\n\r\ngood";

async fn get(addr: std::net::SocketAddr) -> (u16, String) {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect proxy");
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    let req = http::Request::get("/")
        .header("host", "client.example")
        .body(Empty::<Bytes>::new())
        .expect("request");
    let resp = sender.send_request(req).await.expect("response");
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_backend_is_taken_out_before_clients_pay_for_it() {
    let good = Raw::start(Behaviour::Answer(GOOD)).await;
    let hung = Raw::start(Behaviour::Hang).await;
    let listen = std::net::TcpListener::bind("127.0.0.1:0").expect("test step");
    let addr = listen.local_addr().expect("test step");
    drop(listen);
    let text = format!(
        "upstream app {{
            server {hung};
            server {good};
            check type=http interval=100 rise=1 fall=2 timeout=80 default_down=false;
            check_http_send \"GET /health HTTP/1.0\\r\\n\\r\\n\";
        }}
        server {{
            listen {addr};
            location / {{ proxy_pass http://app; proxy_read_timeout 30s; proxy_next_upstream off; }}
        }}",
        hung = hung.addr,
        good = good.addr
    );
    let config = load(&text);
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    let events = Arc::new(EventBus::default());
    let generation =
        Generation::build(config, None, events.clone(), clock.clone()).expect("routes");
    let registry = generation.registry.clone();
    let checker = Checker::start(
        registry.clone(),
        clock.clone(),
        CheckerOptions {
            tls: TlsPolicy::from_config(&generation.config),
            ..CheckerOptions::default()
        },
    )
    .expect("checker");
    let proxy = Arc::new(Proxy::new(generation, events, clock, std::env::temp_dir()));
    let shutdown = CancellationToken::new();
    let listener = vigil_proxy::bind(addr, false, None).expect("bind proxy");
    tokio::spawn(vigil_proxy::serve(
        proxy,
        listener,
        shutdown.clone(),
        Duration::from_secs(1),
    ));

    let hung_peer = registry.get("app").expect("test step").peers()[0].clone();
    assert!(hung_peer.is_routable(), "default_down=false: starts up");
    eventually(
        "probes to take the hung peer out",
        Duration::from_secs(5),
        || !hung_peer.is_routable(),
    )
    .await;
    let probes_seen = hung.conns.load(Ordering::SeqCst);
    assert!(probes_seen >= 2, "fall=2 probes reached the hung backend");

    for _ in 0..20 {
        let (status, body) = tokio::time::timeout(Duration::from_secs(5), get(addr))
            .await
            .expect("a request must not wait on the hung backend");
        assert_eq!((status, body.as_str()), (200, "good"));
    }
    // What the operator is told: the last probe of the hung peer failed
    // waiting for the first byte.
    let last = hung_peer.last_probe().expect("probed");
    assert!(!last.ok);
    assert_eq!(last.phase, Some(vigil_core::health::ProbePhase::FirstByte));
    shutdown.cancel();
    checker.shutdown();
}
