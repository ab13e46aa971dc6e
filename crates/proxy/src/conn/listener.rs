//! The accept loop of one listen address ([`vigil_net::accept_loop`]): each
//! connection is served under its deadline ([`crate::conn`]), HTTP/1.x by
//! vigil's own loop ([`crate::wire::h1`], which judges every head as nginx does)
//! and HTTP/2 (ALPN `h2`) by hyper; on stop the open connections finish
//! their requests and close.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::header::{self, HeaderValue};
use http::{Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use vigil_net::tls::server;

use crate::wire::payload::UpBody;

use crate::conn::tls::{Secure, TlsSite};
use crate::conn::{self, Closed, ConnState, Drain, TimedIo, Watched};
use crate::server::{Generation, Proxy};
use crate::wire::request_check::HeadLimits;

/// Accept on `listener` until `shutdown`, then let open connections finish
/// for at most `grace`.
pub async fn serve(
    proxy: Arc<Proxy>,
    listener: TcpListener,
    shutdown: CancellationToken,
    grace: Duration,
) {
    let addr = match listener.local_addr() {
        Ok(a) => a,
        Err(e) => {
            tracing::error!(error = %e, "listener has no address");
            return;
        }
    };
    let stopping = crate::conn::stop::Shutdown::with_graceful(shutdown.clone());
    let bound = {
        let stopping = stopping.clone();
        async move {
            shutdown.cancelled().await;
            stopping.graceful(Some(grace));
        }
    };
    tokio::join!(
        serve_on(
            proxy,
            listener,
            addr,
            stopping.graceful_token().clone(),
            stopping.clone()
        ),
        bound
    );
}

/// Accept on `listener` (the configured address `addr`) until `stop`; then
/// let its connections finish their requests and close: idle keep-alive
/// connections at once, the others after their request; without limit while
/// the proxy runs (a listener removed by a reload), until `shutdown` says
/// close once a stop began.
pub(crate) async fn serve_on(
    proxy: Arc<Proxy>,
    listener: TcpListener,
    addr: SocketAddr,
    stop: CancellationToken,
    shutdown: crate::conn::stop::Shutdown,
) {
    let open = TaskTracker::new();
    let drain = Arc::new(Drain::default());
    let mut site = Site::of(&proxy.current(), addr);
    vigil_net::accept_loop(&listener, "proxy", addr, &stop, &open, |stream, client| {
        Site::refresh(&mut site, &proxy, addr);
        let (site, proxy, drain) = (site.clone(), proxy.clone(), drain.clone());
        Some(async move { accepted(site, proxy, stream, addr, client, drain).await })
    })
    .await;
    drop(listener);
    drain.start();
    open.close();
    tokio::select! {
        () = open.wait() => {}
        () = shutdown.closing() => {
            tracing::info!(%addr, connections = open.len(), "closing the connections still open");
        }
    }
}

/// Serve one accepted connection: plain HTTP, or on a TLS address the
/// handshake first. nginx's order: peek at the first byte; plain HTTP on
/// a TLS port is read and answered 400 "The plain HTTP request was sent to
/// HTTPS port"; the handshake counts against `client_header_timeout`.
async fn accepted(
    site: Arc<Site>,
    proxy: Arc<Proxy>,
    stream: TcpStream,
    addr: SocketAddr,
    client: SocketAddr,
    drain: Arc<Drain>,
) {
    let origin = Instant::now();
    let Some(tls) = site.tls.clone() else {
        let served = connection(
            &site,
            Kind::Plain,
            proxy,
            crate::conn::sock::Tcp::new(stream),
            addr,
            client,
            drain,
            origin,
        );
        return log_closed(client, served.await);
    };
    // Boxed: the handshake's and HTTP/2's futures are kilobytes, and a
    // future inline here would make every plain connection's task as large
    // for its whole life (benches/load/idle.py).
    Box::pin(secure(
        site, tls, proxy, stream, addr, client, drain, origin,
    ))
    .await;
}

/// A connection on a TLS address: the first byte's sniff, the handshake
/// (both under `client_header_timeout` from accept), then HTTP/1.x or,
/// when ALPN chose it, HTTP/2.
#[allow(clippy::too_many_arguments)]
async fn secure(
    site: Arc<Site>,
    tls: Arc<TlsSite>,
    proxy: Arc<Proxy>,
    stream: TcpStream,
    addr: SocketAddr,
    client: SocketAddr,
    drain: Arc<Drain>,
    origin: Instant,
) {
    let deadline = origin + site.timeouts.header;
    let is_tls = match tokio::time::timeout_at(deadline, server::sniff(&stream)).await {
        Ok(Ok(Some(is_tls))) => is_tls,
        Ok(Ok(None)) => return,
        Ok(Err(e)) => return tracing::debug!(%client, error = %e, "client connection ended"),
        Err(_) => return tracing::debug!(%client, "client timed out before the TLS handshake"),
    };
    if !is_tls {
        let served = connection(
            &site,
            Kind::PlainOnTls,
            proxy,
            crate::conn::sock::Tcp::new(stream),
            addr,
            client,
            drain,
            origin,
        );
        return log_closed(client, served.await);
    }
    let handshake = server::handshake(stream, |sni| tls.choose(sni));
    let stream = match tokio::time::timeout_at(deadline, handshake).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return tracing::debug!(%client, error = %e, "TLS handshake failed"),
        Err(_) => return tracing::debug!(%client, "client timed out in the TLS handshake"),
    };
    // As nginx: HTTP/2 only when ALPN chose it, else HTTP/1.x.
    if server::is_h2(&stream) {
        let served = h2_connection(&site, proxy, stream, addr, client, drain, origin);
        return log_closed(client, served.await);
    }
    let served = connection(&site, Kind::Tls, proxy, stream, addr, client, drain, origin);
    log_closed(client, served.await);
}

/// Serve one client connection on `io` (any byte stream: a socket, or one
/// end of `tokio::io::duplex`) until it closes, exactly as an accepted one
/// on `local` is served: heads judged as nginx judges them, the
/// connection's deadlines, then HTTP/1.1 or HTTP/2. `client` is the peer's
/// address.
pub async fn serve_connection<I>(proxy: Arc<Proxy>, io: I, local: SocketAddr, client: SocketAddr)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let site = Site::of(&proxy.current(), local);
    let drain = Arc::new(Drain::default());
    let served = connection(
        &site,
        Kind::Plain,
        proxy,
        io,
        local,
        client,
        drain,
        Instant::now(),
    );
    log_closed(client, served.await);
}

/// What a connection carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// HTTP on a plain address.
    Plain,
    /// HTTP inside TLS.
    Tls,
    /// Plain HTTP sent to a TLS address: every request is answered 400.
    PlainOnTls,
}

/// One HTTP/1.x connection accepted at `origin` (HTTP/2 with prior
/// knowledge on a plain address is handed to hyper): vigil's own loop
/// ([`crate::wire::h1`]) over the timed socket (its deadlines), nginx's head
/// rules on every head, every request tracked.
#[allow(clippy::too_many_arguments)]
fn connection<I>(
    site: &Site,
    kind: Kind,
    proxy: Arc<Proxy>,
    io: I,
    addr: SocketAddr,
    client: SocketAddr,
    drain: Arc<Drain>,
    origin: Instant,
) -> impl std::future::Future<Output = Closed<ConnError>> + Send + 'static
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let state = ConnState::since(site.timeouts, origin);
    let io: Box<dyn crate::conn::client_io::Io> = Box::new(TimedIo::new(io, state.clone()));
    let cx = crate::wire::h1::Ctx {
        proxy,
        local: addr,
        client,
        serve: match kind {
            Kind::Plain => crate::wire::h1::Serve::Plain,
            Kind::Tls => crate::wire::h1::Serve::Tls,
            Kind::PlainOnTls => crate::wire::h1::Serve::PlainOnTls,
        },
        limits: site.limits,
        state: state.clone(),
        h2: (kind == Kind::Plain).then(|| site.h2.clone()),
        plain_to_https,
    };
    Watched::new(crate::wire::h1::Connection::new(cx, io), state, drain)
}

/// An HTTP/2 connection (ALPN `h2`) accepted at `origin`, served by hyper
/// under the connection's deadlines, every stream tracked.
fn h2_connection<I>(
    site: &Site,
    proxy: Arc<Proxy>,
    io: I,
    addr: SocketAddr,
    client: SocketAddr,
    drain: Arc<Drain>,
    origin: Instant,
) -> impl std::future::Future<Output = Closed<ConnError>> + Send + 'static
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let state = ConnState::since(site.timeouts, origin);
    let io = TimedIo::new(io, state.clone());
    let served = state.clone();
    let svc = conn::tracking(
        state.clone(),
        move |mut req: http::Request<hyper::body::Incoming>| {
            let (proxy, served) = (proxy.clone(), served.clone());
            req.extensions_mut().insert(Secure);
            let req = crate::handler::body::RequestBody::hyper_request(req);
            async move {
                crate::handler::handle(&proxy, addr, client, req, &served)
                    .await
                    .response
            }
        },
    );
    let conn = site
        .h2
        .serve_connection_with_upgrades(TokioIo::new(io), svc)
        .into_owned();
    Watched::new(conn, state, drain)
}

/// nginx's answer to plain HTTP on a TLS port (its code 497, sent as 400);
/// the connection closes after it.
fn plain_to_https() -> Response<UpBody> {
    const TEXT: &str = "The plain HTTP request was sent to HTTPS port";
    let page = format!(
        "<html>\r\n<head><title>400 {TEXT}</title></head>\r\n<body>\r\n<center><h1>400 Bad Request</h1></center>\r\n<center>{TEXT}</center>\r\n<hr><center>vigil</center>\r\n</body>\r\n</html>\r\n"
    );
    let mut resp = Response::new(crate::wire::payload::full(page));
    *resp.status_mut() = StatusCode::BAD_REQUEST;
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/html"));
    h.insert(header::CONNECTION, HeaderValue::from_static("close"));
    resp
}

fn log_closed(client: SocketAddr, closed: Closed<ConnError>) {
    match closed {
        Closed::TimedOut(why) => tracing::debug!(%client, "client timed out {why}"),
        Closed::Done(Err(e)) => match conn::aborted(&*e) {
            Some(abort) => tracing::debug!(%client, "{abort}"),
            None => tracing::debug!(%client, error = %e, "client connection ended"),
        },
        Closed::Done(Ok(())) => {}
    }
}

/// What hyper's auto connection fails with.
type ConnError = Box<dyn std::error::Error + Send + Sync>;

/// How connections on one address are served under one generation: its
/// default server's timeouts and head limits (nginx applies them before the
/// Host is known), and its TLS settings on a TLS address.
struct Site {
    generation: u64,
    /// HTTP/2 (ALPN `h2`, or prior knowledge on a plain address); HTTP/1.x
    /// is served by [`crate::wire::h1`]. Shared: every plain connection holds it
    /// (hyper's builder is a few hundred bytes).
    h2: Arc<auto::Builder<TokioExecutor>>,
    timeouts: conn::ConnLimits,
    limits: HeadLimits,
    tls: Option<Arc<TlsSite>>,
}

impl Site {
    fn of(generation: &Generation, addr: SocketAddr) -> Arc<Self> {
        let d = generation.default_server(addr);
        let builder = || {
            let mut b = auto::Builder::new(TokioExecutor::new());
            // The gate bounds the head by large_client_header_buffers; hyper's
            // own limit sits above it. No header_read_timeout: the connection's
            // deadline (crate::conn) covers the header, from accept.
            b.http1().max_buf_size(d.max_buf());
            b
        };
        Arc::new(Self {
            generation: generation.registry.generation(),
            h2: Arc::new(builder().http2_only()),
            timeouts: d.timeouts,
            limits: d.limits,
            tls: generation.tls_site(addr),
        })
    }

    /// Follow a reload.
    fn refresh(site: &mut Arc<Self>, proxy: &Proxy, addr: SocketAddr) {
        let g = proxy.current();
        if g.registry.generation() != site.generation {
            *site = Site::of(&g, addr);
        }
    }
}
