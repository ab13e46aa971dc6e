//! `proxy_request`: the bytes are one client connection to vigil's real
//! hyper service (`vigil_proxy::serve_connection` over an in-memory
//! duplex), in front of a backend on 127.0.0.1; started once, in a runtime
//! of its own. Checks: no panic, the connection ends once the client has
//! said all (no hang), and the proxy still answers a plain request after.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::runtime::Runtime;
use vigil_config::{literal_resolver, nginx};
use vigil_core::event::EventBus;
use vigil_core::Clock;
use vigil_net::SystemClock;
use vigil_proxy::{Generation, Proxy};

/// The address the conf listens on (never bound: connections come in
/// through `serve_connection`).
const LOCAL: &str = "127.0.0.1:1";
const CLIENT: &str = "127.0.0.1:40000";

struct Harness {
    rt: Runtime,
    proxy: Arc<Proxy>,
}

/// The proxy, its backend and their runtime, made on first use.
fn harness() -> &'static Harness {
    static H: OnceLock<Harness> = OnceLock::new();
    H.get_or_init(|| {
        let rt = runtime();
        let backend = rt.block_on(backend());
        let conf = format!(
            "http {{ upstream u {{ server {backend}; }}
               server {{ listen {LOCAL}; proxy_read_timeout 2s; proxy_send_timeout 2s;
                 location / {{ proxy_pass http://u; proxy_set_header X-Real-IP $remote_addr;
                   proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for; }}
                 location /ws/ {{ proxy_pass http://u; proxy_http_version 1.1;
                   proxy_set_header Upgrade $http_upgrade; proxy_set_header Connection upgrade; }}
                 location /nobuf/ {{ proxy_pass http://u; proxy_request_buffering off; }}
                 access_log /dev/null;
                 location /dead/ {{ proxy_pass http://dead; error_page 502 /page; }}
                 location /named/ {{ proxy_pass http://dead; proxy_request_buffering off; error_page 502 =200 @page; }}
                 location = /page {{ proxy_pass http://u; }}
                 location @page {{ proxy_pass http://u; }} }}
               upstream dead {{ server 127.0.0.1:9; }} }}"
        );
        let proxy = proxy_for(&conf);
        Harness { rt, proxy }
    })
}

/// A backend answering 200 `ok` to anything, after reading the body.
async fn backend() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind fuzz backend");
    let addr = listener.local_addr().expect("backend addr");
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let svc = service_fn(|req: hyper::Request<hyper::body::Incoming>| async move {
                    let _ = req.into_body().collect().await;
                    Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(
                        Bytes::from_static(b"ok"),
                    )))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    addr
}

/// Write `data` as one client connection (then end it, with `hang_up`);
/// what came back until the proxy closed.
async fn exchange(proxy: &Arc<Proxy>, data: Vec<u8>, hang_up: bool) -> Vec<u8> {
    let (mut client, server) = tokio::io::duplex(64 * 1024);
    let local: SocketAddr = LOCAL.parse().expect("local");
    let peer: SocketAddr = CLIENT.parse().expect("client");
    let conn = tokio::spawn(vigil_proxy::serve_connection(
        proxy.clone(),
        server,
        local,
        peer,
    ));
    let (mut rd, mut wr) = tokio::io::split(&mut client);
    let write = async move {
        let _ = wr.write_all(&data).await;
        if hang_up {
            let _ = wr.shutdown().await;
        } else {
            // Keep the write side open: a client that hangs up has its
            // request dropped (hyper, like nginx, aborts it).
            std::future::pending::<()>().await;
        }
    };
    let read = async move {
        let mut out = Vec::new();
        let _ = rd.read_to_end(&mut out).await;
        out
    };
    // Read to the end either way (a proxy that cannot write would stall).
    let out = if hang_up {
        tokio::join!(write, read).1
    } else {
        tokio::select! {
            _ = write => Vec::new(),
            out = read => out,
        }
    };
    // The client said all and read to the end: the connection is over.
    connection_ended(conn).await;
    out
}

/// The target.
pub fn proxy_request(data: &[u8]) {
    let h = harness();
    h.rt.block_on(async {
        let bounded = tokio::time::timeout(
            Duration::from_secs(20),
            exchange(&h.proxy, data.to_vec(), true),
        );
        assert!(bounded.await.is_ok(), "the exchange did not end");
        let plain = exchange(
            &h.proxy,
            b"GET /plain HTTP/1.1\r\nHost: fuzz\r\nConnection: close\r\n\r\n".to_vec(),
            false,
        )
        .await;
        assert!(
            plain.starts_with(b"HTTP/1.1 200"),
            "a plain request after the input: {}",
            String::from_utf8_lossy(&plain)
        );
    });
}

/// The fuzz targets' runtime (two workers, so a stuck task shows as a hang
/// of its exchange, not of the whole process).
pub(crate) fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("fuzz runtime")
}

/// The proxy `vigil serve` would run for the nginx.conf `conf`.
pub(crate) fn proxy_for(conf: &str) -> Arc<Proxy> {
    let config = nginx::load_str(conf, "fuzz.conf".as_ref(), ".".as_ref(), &literal_resolver)
        .expect("fuzz conf")
        .config;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    let events = Arc::new(EventBus::default());
    let generation =
        Generation::build(config, None, events.clone(), clock.clone()).expect("fuzz routes");
    Arc::new(Proxy::new(generation, events, clock, std::env::temp_dir()))
}

/// The client has gone: its connection must end soon, and without a panic
/// (a panic in the service is the fuzzer's finding, re-raised here).
pub(crate) async fn connection_ended(conn: tokio::task::JoinHandle<()>) {
    match tokio::time::timeout(Duration::from_secs(10), conn).await {
        Err(_) => panic!("the connection outlived its client"),
        Ok(Err(e)) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Ok(_) => {}
    }
}
