//! An upgraded connection (101) joined to its upstream as nginx's
//! `ngx_http_upstream_process_upgraded` does: bytes both ways,
//! `proxy_read_timeout` while nothing moves in either direction,
//! `proxy_send_timeout` for a write to the upstream and `send_timeout` for
//! a write to the client; either side closing, or any timeout, closes both.

use std::cell::RefCell;
use std::future::Future;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_util::task::TaskTracker;

use vigil_core::upstream::PeerGuard;

use crate::obs::errlog::{Context, Failure};

thread_local! {
    /// The worker's tunnels, which outlive the connection task that made
    /// them: a graceful stop waits for them too (`crate::conn::worker`).
    static TRACKED: RefCell<Option<TaskTracker>> = const { RefCell::new(None) };
}

/// Track the tunnels started on this thread with `tracker` from now on
/// (None: stop tracking).
pub(crate) fn track_on_this_thread(tracker: Option<TaskTracker>) {
    TRACKED.with(|t| *t.borrow_mut() = tracker);
}

/// Run `tunnel` on this thread's runtime, tracked where a worker tracks
/// its tunnels (outside a worker, as in tests, untracked).
pub(crate) fn spawn<F>(tunnel: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    match TRACKED.with(|t| t.borrow().clone()) {
        Some(tracker) => drop(tracker.spawn(tunnel)),
        None => drop(tokio::spawn(tunnel)),
    }
}

/// The timers of a tunnel.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TunnelTimers {
    /// `proxy_read_timeout`: the longest quiet spell.
    pub(crate) idle: Duration,
    /// `proxy_send_timeout`: one write to the upstream.
    pub(crate) upstream_send: Duration,
    /// `send_timeout`: one write to the client.
    pub(crate) client_send: Duration,
}

/// How a tunnel ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum End {
    /// A side closed (or failed).
    Closed,
    /// Nothing moved for `idle`, or the upstream did not take a write.
    UpstreamTimeout,
    /// The client did not take a write.
    ClientTimeout,
}

/// Copy between `client` and `upstream` until one closes or a timer fires;
/// `guard` is the attempt's, whose peer the error_log line names.
pub(crate) async fn run<C, U>(
    mut client: C,
    mut upstream: U,
    t: TunnelTimers,
    cx: &Context,
    guard: &PeerGuard,
) -> End
where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    let mut from_client = vec![0u8; 16 * 1024];
    let mut from_upstream = vec![0u8; 16 * 1024];
    let mut idle = crate::conn::timer::sleep(t.idle);
    let end = loop {
        tokio::select! {
            r = client.read(&mut from_client) => match r {
                Ok(0) | Err(_) => break End::Closed,
                Ok(n) => match crate::conn::timer::timeout(t.upstream_send, upstream.write_all(&from_client[..n])).await {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) => break End::Closed,
                    Err(_) => break End::UpstreamTimeout,
                },
            },
            r = upstream.read(&mut from_upstream) => match r {
                Ok(0) | Err(_) => break End::Closed,
                Ok(n) => match crate::conn::timer::timeout(t.client_send, client.write_all(&from_upstream[..n])).await {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) => break End::Closed,
                    Err(_) => break End::ClientTimeout,
                },
            },
            _ = &mut idle => break End::UpstreamTimeout,
        }
        idle.reset(crate::conn::timer::after(t.idle));
    };
    match end {
        End::UpstreamTimeout => cx.log(
            Some(guard),
            Failure::Timeout,
            "proxying upgraded connection",
            &"tunnel idle or upstream write stalled",
        ),
        End::ClientTimeout => tracing::info!(
            client = %cx.client.ip(),
            request = %cx.request(),
            "client timed out (110: Connection timed out) while proxying upgraded connection"
        ),
        End::Closed => {}
    }
    let _ = client.shutdown().await;
    let _ = upstream.shutdown().await;
    end
}
