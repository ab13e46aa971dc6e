//! Test backends, a proxy started from nginx.conf text, and a client.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use vigil_config::{literal_resolver, nginx, Resolver};
use vigil_core::event::EventBus;
use vigil_core::Clock;
use vigil_net::SystemClock;
use vigil_proxy::{Generation, Proxy};

/// What a backend saw.
#[derive(Clone, Debug)]
pub(crate) struct Seen {
    pub(crate) method: String,
    pub(crate) uri: String,
    pub(crate) headers: http::HeaderMap,
    pub(crate) body: Bytes,
}

type Handler = Arc<dyn Fn(&Seen) -> Response<Full<Bytes>> + Send + Sync>;

/// An HTTP/1.1 backend on 127.0.0.1 that counts connections and records requests.
pub(crate) struct Backend {
    pub(crate) addr: SocketAddr,
    pub(crate) connections: Arc<AtomicUsize>,
    pub(crate) seen: Arc<Mutex<Vec<Seen>>>,
    stop: CancellationToken,
}

impl Backend {
    pub(crate) async fn start(
        handler: impl Fn(&Seen) -> Response<Full<Bytes>> + Send + Sync + 'static,
    ) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind backend");
        Self::serve(listener, Arc::new(handler))
    }

    /// A backend answering 200 with `name` on `addr` (another loopback
    /// address, a chosen port); None when it is taken.
    pub(crate) async fn named_on(addr: SocketAddr, name: &'static str) -> Option<Self> {
        let listener = TcpListener::bind(addr).await.ok()?;
        Some(Self::serve(
            listener,
            Arc::new(move |_: &Seen| Response::new(Full::new(Bytes::from(name)))),
        ))
    }

    /// A backend answering 200 with `name` as the body.
    pub(crate) async fn named(name: &'static str) -> Self {
        Self::start(move |_| Response::new(Full::new(Bytes::from(name)))).await
    }

    fn serve(listener: TcpListener, handler: Handler) -> Self {
        let addr = listener.local_addr().expect("addr");
        let connections = Arc::new(AtomicUsize::new(0));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = CancellationToken::new();
        let (c, s, st) = (connections.clone(), seen.clone(), stop.clone());
        tokio::spawn(async move {
            loop {
                let (stream, _) = tokio::select! {
                    r = listener.accept() => match r { Ok(x) => x, Err(_) => continue },
                    _ = st.cancelled() => return,
                };
                c.fetch_add(1, Ordering::SeqCst);
                let (s, h) = (s.clone(), handler.clone());
                tokio::spawn(async move {
                    let svc = service_fn(move |req: Request<Incoming>| {
                        let (s, h) = (s.clone(), h.clone());
                        async move {
                            let (parts, body) = req.into_parts();
                            let body = body
                                .collect()
                                .await
                                .map(|b| b.to_bytes())
                                .unwrap_or_default();
                            let seen = Seen {
                                method: parts.method.to_string(),
                                uri: parts.uri.to_string(),
                                headers: parts.headers,
                                body,
                            };
                            let resp = h(&seen);
                            s.lock().expect("lock").push(seen);
                            Ok::<_, Infallible>(resp)
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .with_upgrades()
                        .await;
                });
            }
        });
        Self {
            addr,
            connections,
            seen,
            stop,
        }
    }

    pub(crate) fn requests(&self) -> Vec<Seen> {
        self.seen.lock().expect("lock").clone()
    }

    pub(crate) fn conns(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// A proxy serving nginx.conf text where `{LISTEN}` is replaced by its address.
pub(crate) struct Running {
    pub(crate) addr: SocketAddr,
    pub(crate) proxy: Arc<Proxy>,
    pub(crate) shutdown: CancellationToken,
    pub(crate) task: tokio::task::JoinHandle<()>,
    pub(crate) text: String,
}

pub(crate) fn load(text: &str) -> vigil_core::config::Config {
    load_with(text, &literal_resolver)
}

fn load_with(text: &str, resolve: Resolver<'_>) -> vigil_core::config::Config {
    nginx::load_str(text, "test.conf".as_ref(), ".".as_ref(), resolve)
        .unwrap_or_else(|e| panic!("{e}\n{text}"))
        .config
}

pub(crate) async fn start_proxy(conf: &str) -> Running {
    start_proxy_with(conf, &literal_resolver).await
}

/// As [`start_proxy`], names looked up with `resolve`.
pub(crate) async fn start_proxy_with(conf: &str, resolve: Resolver<'_>) -> Running {
    let addr = vigil_testkit::free_addr();
    let text = conf.replace("{LISTEN}", &addr.to_string());
    let config = load_with(&text, resolve);
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    let events = Arc::new(EventBus::default());
    let generation =
        Generation::build(config, None, events.clone(), clock.clone()).expect("routes");
    let proxy = Arc::new(Proxy::new(generation, events, clock, std::env::temp_dir()));
    let listener = vigil_proxy::bind(addr, false, None).expect("bind proxy");
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(vigil_proxy::serve(
        proxy.clone(),
        listener,
        shutdown.clone(),
        Duration::from_secs(5),
    ));
    Running {
        addr,
        proxy,
        shutdown,
        task,
        text,
    }
}

/// A response as the client saw it.
#[derive(Debug)]
pub(crate) struct Got {
    pub(crate) status: u16,
    pub(crate) headers: http::HeaderMap,
    pub(crate) body: Result<Bytes, String>,
}

impl Got {
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(self.body.as_ref().expect("complete body")).into_owned()
    }

    pub(crate) fn header(&self, name: &str) -> String {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    }
}

/// One request on a fresh connection.
pub(crate) async fn send(addr: SocketAddr, req: Request<Full<Bytes>>) -> Got {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect proxy");
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    let resp = sender.send_request(req).await.expect("response");
    let (parts, body) = resp.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .map_err(|e| e.to_string());
    Got {
        status: parts.status.as_u16(),
        headers: parts.headers,
        body,
    }
}

pub(crate) async fn get(addr: SocketAddr, path: &str) -> Got {
    send(addr, request("GET", path, "")).await
}

pub(crate) fn request(method: &str, path: &str, body: &'static str) -> Request<Full<Bytes>> {
    Request::builder()
        .method(method)
        .uri(path)
        .header("host", "client.example")
        .body(Full::new(Bytes::from(body)))
        .expect("request")
}

/// Wait for `cond`, up to 20 s (a bound for a loaded machine: a passing
/// test waits only as long as the condition takes).
pub(crate) async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub(crate) fn _executor() -> TokioExecutor {
    TokioExecutor::new()
}
