//! Test backends on 127.0.0.1, registries from nginx.conf text, bounded waits.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use vigil_config::{literal_resolver, nginx};
use vigil_core::config::Config;
use vigil_core::event::EventBus;
use vigil_core::registry::Registry;
use vigil_core::{Clock, ManualClock};

/// The model of nginx.conf text.
pub(crate) fn load(text: &str) -> Config {
    nginx::load_str(text, "test.conf".as_ref(), ".".as_ref(), &literal_resolver)
        .unwrap_or_else(|e| panic!("{e}\n{text}"))
        .config
}

/// A registry of nginx.conf text, on a manual clock.
pub(crate) fn registry(text: &str) -> (Arc<Registry>, Arc<EventBus>, Arc<dyn Clock>) {
    let events = Arc::new(EventBus::default());
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::at(1_000));
    let r = Registry::build(&load(text), None, events.clone(), clock.clone());
    (Arc::new(r), events, clock)
}

/// What a raw backend does with each connection.
#[derive(Clone)]
pub(crate) enum Behaviour {
    /// Read the request, answer with these bytes, close.
    Answer(&'static str),
    /// Accept and never answer (keep the connection open).
    Hang,
    /// Accept and close at once.
    Close,
    /// Send a head, then the body one byte every `gap`.
    SlowBody(&'static str, &'static str, Duration),
    /// Read the request, send these bytes, then reset the connection
    /// (SO_LINGER 0).
    AnswerThenReset(&'static str),
}

/// A raw TCP backend; stops when dropped.
pub(crate) struct Raw {
    pub(crate) addr: SocketAddr,
    pub(crate) conns: Arc<AtomicUsize>,
    stop: CancellationToken,
}

impl Raw {
    pub(crate) async fn start(b: Behaviour) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        Self::on(listener, b)
    }

    pub(crate) fn on(listener: TcpListener, b: Behaviour) -> Self {
        let addr = listener.local_addr().expect("addr");
        let stop = CancellationToken::new();
        let conns = Arc::new(AtomicUsize::new(0));
        let (st, c) = (stop.clone(), conns.clone());
        tokio::spawn(async move {
            loop {
                let (mut s, _) = tokio::select! {
                    _ = st.cancelled() => return,
                    r = listener.accept() => match r { Ok(x) => x, Err(_) => continue },
                };
                c.fetch_add(1, Ordering::SeqCst);
                let (b, st) = (b.clone(), st.clone());
                tokio::spawn(async move {
                    let work = async {
                        match b {
                            Behaviour::Answer(text) => {
                                read_head(&mut s).await;
                                let _ = s.write_all(text.as_bytes()).await;
                                let _ = s.shutdown().await;
                            }
                            Behaviour::AnswerThenReset(text) => {
                                read_head(&mut s).await;
                                let _ = s.write_all(text.as_bytes()).await;
                                let _ = socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO));
                                drop(s);
                            }
                            Behaviour::Hang => std::future::pending::<()>().await,
                            Behaviour::Close => drop(s),
                            Behaviour::SlowBody(head, body, gap) => {
                                read_head(&mut s).await;
                                let _ = s.write_all(head.as_bytes()).await;
                                for b in body.bytes() {
                                    tokio::time::sleep(gap).await;
                                    if s.write_all(&[b]).await.is_err() {
                                        return;
                                    }
                                }
                            }
                        }
                    };
                    tokio::select! {
                        _ = work => {}
                        _ = st.cancelled() => {}
                    }
                });
            }
        });
        Self { addr, conns, stop }
    }

    pub(crate) fn stop(&self) {
        self.stop.cancel();
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn read_head(s: &mut TcpStream) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// An address that refuses connections (nothing listens there).
pub(crate) fn refused_addr() -> SocketAddr {
    vigil_testkit::free_addr()
}

/// An address whose connects time out: a listener with backlog 0 whose
/// accept queue is filled by connections that are never accepted, so the
/// kernel drops later SYNs.
pub(crate) struct Blackhole {
    pub(crate) addr: SocketAddr,
    _listener: tokio::net::TcpListener,
    _fillers: Vec<TcpStream>,
}

impl Blackhole {
    pub(crate) async fn start() -> Self {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket
            .bind("127.0.0.1:0".parse().expect("addr"))
            .expect("bind");
        let listener = socket.listen(0).expect("listen");
        let addr = listener.local_addr().expect("addr");
        let mut fillers = Vec::new();
        loop {
            match tokio::time::timeout(Duration::from_millis(200), TcpStream::connect(addr)).await {
                Ok(Ok(s)) => fillers.push(s),
                Ok(Err(e)) => panic!("filler connect failed: {e}"),
                Err(_) => break,
            }
            assert!(fillers.len() < 16, "the accept queue never filled");
        }
        Self {
            addr,
            _listener: listener,
            _fillers: fillers,
        }
    }
}

/// Wait up to `limit` for `cond`, polling.
pub(crate) async fn eventually(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + limit;
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
