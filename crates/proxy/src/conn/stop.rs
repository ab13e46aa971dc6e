//! How the workers are told to stop, as nginx's signals ask: a graceful
//! stop (listeners and idle connections closed, what is in flight
//! finishes) and, at its bound or at once, a fast one.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// How the workers are told to stop: `graceful` stops accepting and lets
/// what is in flight finish; `now` closes whatever is still open.
#[derive(Clone, Debug, Default)]
pub struct Shutdown {
    graceful: CancellationToken,
    now: CancellationToken,
}

// === impl Shutdown ===

impl Shutdown {
    /// Stop with `graceful` as the token that starts a graceful stop (it
    /// may be shared with other parts of the process that stop with it).
    pub fn with_graceful(graceful: CancellationToken) -> Self {
        Self {
            graceful,
            now: CancellationToken::new(),
        }
    }

    /// The token that starts a graceful stop.
    pub fn graceful_token(&self) -> &CancellationToken {
        &self.graceful
    }

    /// A graceful stop: listeners close, idle connections close, requests
    /// and tunnels in flight finish; when `bound` passes (None: never),
    /// the rest are closed. Call on a tokio runtime (the bound's timer runs
    /// on it). A second call does not move an earlier bound.
    pub fn graceful(&self, bound: Option<Duration>) {
        if self.graceful.is_cancelled() {
            return;
        }
        self.graceful.cancel();
        if let Some(bound) = bound {
            let now = self.now.clone();
            tokio::spawn(async move {
                tokio::select! {
                    () = tokio::time::sleep(bound) => {
                        tracing::warn!(
                            bound = %vigil_core::config::value::format_time(bound),
                            "graceful stop: the time given is over; closing the connections still open"
                        );
                        now.cancel();
                    }
                    () = now.cancelled() => {}
                }
            });
        }
    }

    /// A fast stop: every connection is closed now (also during a graceful
    /// stop).
    pub fn fast(&self) {
        self.graceful.cancel();
        self.now.cancel();
    }

    /// The graceful stop has begun.
    pub(crate) async fn begun(&self) {
        self.graceful.cancelled().await;
    }

    /// The connections still open must close.
    pub(crate) async fn closing(&self) {
        self.now.cancelled().await;
    }
}
