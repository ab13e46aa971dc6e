//! The accept loop of one listen address: each connection's request heads
//! are judged as nginx judges them ([`crate::request_check`]), then served by
//! hyper under its deadline ([`crate::conn`]); a failed accept backs off
//! ([`crate::accept`]), and on stop the open connections finish their
//! requests and close.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::accept::AcceptBackoff;
use crate::conn::{self, Closed, ConnState, Drain, TimedIo, Watched};
use crate::request_check::{gate, HeadLimits, Verdict};
use crate::server::{Generation, Proxy};

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
    serve_on(proxy, listener, addr, shutdown.clone(), shutdown, grace).await;
}

/// Accept on `listener` (the configured address `addr`) until `stop`; then
/// let its connections finish their requests and close: without limit while
/// the proxy runs (a listener removed by a reload), within `grace` once
/// `shutdown` fires.
pub(crate) async fn serve_on(
    proxy: Arc<Proxy>,
    listener: TcpListener,
    addr: SocketAddr,
    stop: CancellationToken,
    shutdown: CancellationToken,
    grace: Duration,
) {
    // Each connection holds a sender: recv() returns None once all closed.
    let (open, mut all_closed) = tokio::sync::mpsc::channel::<()>(1);
    let drain = Arc::new(Drain::default());
    let mut backoff = AcceptBackoff::new();
    let mut site = Site::of(&proxy.current(), addr);
    let stopped = stop.cancelled();
    tokio::pin!(stopped);
    loop {
        let accepted = tokio::select! {
            biased;
            _ = &mut stopped => break,
            a = listener.accept() => a,
        };
        let (stream, client) = match accepted {
            Ok(a) => a,
            Err(e) => {
                let r = backoff.on_error(&e, tokio::time::Instant::now());
                if let Some(suppressed) = r.log {
                    tracing::error!(%addr, error = %e, suppressed, retry_in = ?r.wait, "accept failed");
                } else if r.wait.is_zero() {
                    tracing::debug!(%addr, error = %e, "accept failed");
                }
                if !r.wait.is_zero() {
                    tokio::select! {
                        _ = &mut stopped => break,
                        _ = tokio::time::sleep(r.wait) => {}
                    }
                }
                continue;
            }
        };
        if let Some(suppressed) = backoff.on_accept(tokio::time::Instant::now()) {
            tracing::warn!(%addr, suppressed, "accepting again");
        }
        site.refresh(&proxy, addr);
        let _ = stream.set_nodelay(true);
        let served = connection(&site, proxy.clone(), stream, addr, client, drain.clone());
        let open = open.clone();
        tokio::spawn(async move {
            log_closed(client, served.await);
            drop(open);
        });
    }
    drop(listener);
    drain.start();
    drop(open);
    tokio::select! {
        _ = all_closed.recv() => {}
        _ = async { shutdown.cancelled().await; tokio::time::sleep(grace).await } => {
            tracing::warn!(%addr, "grace period over; closing remaining connections");
        }
    }
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
    let served = connection(&site, proxy, io, local, client, Arc::new(Drain::default()));
    log_closed(client, served.await);
}

/// One connection: the gate (nginx's head rules) over the timed socket
/// (its deadlines), hyper over both, every request tracked.
fn connection<I>(
    site: &Site,
    proxy: Arc<Proxy>,
    io: I,
    addr: SocketAddr,
    client: SocketAddr,
    drain: Arc<Drain>,
) -> impl std::future::Future<Output = Closed<ConnError>> + Send + 'static
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let state = ConnState::new(site.timeouts);
    let verdicts = gate::Verdicts::default();
    let io = gate::Gate::new(
        TimedIo::new(io, state.clone()),
        site.limits,
        verdicts.clone(),
    );
    let svc = conn::tracking(state.clone(), move |req| {
        let proxy = proxy.clone();
        let admitted = verdicts.admit(req);
        async move {
            let req = match admitted {
                Ok(req) => req,
                Err(status) => return gate::refused(status),
            };
            let verdict = req.extensions().get::<Verdict>().copied();
            let mut resp = crate::handler::handle(proxy, addr, client, req).await;
            gate::close_if_blind(verdict.as_ref(), &mut resp);
            resp
        }
    });
    let conn = site
        .builder
        .serve_connection_with_upgrades(TokioIo::new(io), svc)
        .into_owned();
    Watched::new(conn, state, drain)
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
/// Host is known).
struct Site {
    generation: u64,
    builder: auto::Builder<TokioExecutor>,
    timeouts: conn::Timeouts,
    limits: HeadLimits,
}

impl Site {
    fn of(generation: &Generation, addr: SocketAddr) -> Self {
        let d = generation.default_server(addr);
        let mut builder = auto::Builder::new(TokioExecutor::new());
        // The gate bounds the head by large_client_header_buffers; hyper's
        // own limit sits above it. No header_read_timeout: the connection's
        // deadline (crate::conn) covers the header, from accept.
        builder.http1().max_buf_size(d.max_buf());
        Self {
            generation: generation.registry.generation(),
            builder,
            timeouts: d.timeouts,
            limits: d.limits,
        }
    }

    /// Follow a reload.
    fn refresh(&mut self, proxy: &Proxy, addr: SocketAddr) {
        let g = proxy.current();
        if g.registry.generation() != self.generation {
            *self = Site::of(&g, addr);
        }
    }
}
