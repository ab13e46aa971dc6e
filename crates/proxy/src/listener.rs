//! The accept loop of one listen address: each connection is served by
//! hyper under its deadline ([`crate::conn`]), a failed accept backs off
//! ([`crate::accept`]), and on stop the open connections finish their
//! requests and close.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::accept::AcceptBackoff;
use crate::conn::{self, Closed, ConnState, Drain, TimedIo, Timeouts, Watched};
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
        let state = ConnState::new(site.timeouts);
        let io = TokioIo::new(TimedIo::new(stream, state.clone()));
        let p = proxy.clone();
        let svc = conn::tracking(state.clone(), move |req| {
            crate::handler::handle(p.clone(), addr, client, req)
        });
        let conn = site
            .builder
            .serve_connection_with_upgrades(io, svc)
            .into_owned();
        let watched = Watched::new(conn, state, drain.clone());
        let open = open.clone();
        tokio::spawn(async move {
            match watched.await {
                Closed::TimedOut(why) => tracing::debug!(%client, "client timed out {why}"),
                Closed::Done(Err(e)) => match conn::aborted(&*e) {
                    Some(abort) => tracing::debug!(%client, "{abort}"),
                    None => tracing::debug!(%client, error = %e, "client connection ended"),
                },
                Closed::Done(Ok(())) => {}
            }
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

/// How connections on one address are served under one generation: its
/// default server's header limits (nginx applies them before the Host is known).
struct Site {
    generation: u64,
    builder: auto::Builder<TokioExecutor>,
    timeouts: Timeouts,
}

impl Site {
    fn of(generation: &Generation, addr: SocketAddr) -> Self {
        let d = generation.default_server(addr);
        let mut builder = auto::Builder::new(TokioExecutor::new());
        // The whole header within large_client_header_buffers (NUMBER × SIZE);
        // hyper refuses a smaller buffer than 8 KiB. No header_read_timeout:
        // the connection's deadline (crate::conn) covers the header, from accept.
        builder.http1().max_buf_size(d.max_buf);
        Self {
            generation: generation.registry.generation(),
            builder,
            timeouts: d.timeouts,
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
