//! The client's byte stream as the connection layers hand it on: any
//! socket (plain or TLS), and after a 101 to the handler's tunnel (a leaf:
//! the HTTP/1 loop, hyper's HTTP/2 connection and the handler meet here).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use http::Request;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::oneshot;

/// A client connection's byte stream (`Any`: the connection loop asks a
/// plain TCP stream for its read readiness directly, `crate::wire::h1`'s watch).
pub(crate) trait Io: AsyncRead + AsyncWrite + Unpin + Send + std::any::Any {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> Io for T {}

/// The client's stream after a 101, with the bytes read past the head.
pub(crate) type ClientStream = Box<dyn Io>;

/// The handler's side of a pending upgrade (a request extension on HTTP/1).
/// (Extensions are cloned with the request: the first taker has it.)
#[derive(Clone)]
pub(crate) struct PendingUpgrade(pub(crate) Arc<Mutex<Option<oneshot::Receiver<ClientStream>>>>);

/// The client's stream once the 101 is sent: vigil's loop's, or hyper's
/// (HTTP/2 connections served by hyper).
pub(crate) enum OnClientUpgrade {
    /// vigil's HTTP/1 loop hands the stream over.
    Own(oneshot::Receiver<ClientStream>),
    /// hyper's connection does.
    Hyper(hyper::upgrade::OnUpgrade),
}

/// The upgrade did not happen.
#[derive(Debug, thiserror::Error)]
#[error("client connection upgrade failed: {0}")]
pub(crate) struct UpgradeFailed(String);

/// The upgrade future of `req`'s client connection (replaces
/// `hyper::upgrade::on`).
pub(crate) fn on_upgrade<B>(req: &mut Request<B>) -> OnClientUpgrade {
    let own = req
        .extensions_mut()
        .remove::<PendingUpgrade>()
        .and_then(|p| p.0.lock().ok()?.take());
    match own {
        Some(rx) => OnClientUpgrade::Own(rx),
        None => OnClientUpgrade::Hyper(hyper::upgrade::on(req)),
    }
}

// === impl OnClientUpgrade ===

impl Future for OnClientUpgrade {
    type Output = Result<ClientStream, UpgradeFailed>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            OnClientUpgrade::Own(rx) => Pin::new(rx)
                .poll(cx)
                .map(|r| r.map_err(|_| UpgradeFailed("the connection closed".into()))),
            OnClientUpgrade::Hyper(on) => Pin::new(on).poll(cx).map(|r| match r {
                Ok(up) => Ok(Box::new(TokioIo::new(up)) as ClientStream),
                Err(e) => Err(UpgradeFailed(e.to_string())),
            }),
        }
    }
}
