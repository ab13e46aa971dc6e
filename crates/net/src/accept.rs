//! The one accept loop of vigil's listeners (the proxy's, the admin API's,
//! the checker's status page): accept, `TCP_NODELAY`, hand the connection
//! to the caller's service on a [`TaskTracker`], stop on a token.
//!
//! When `accept()` fails: out of descriptors or memory (EMFILE, ENFILE,
//! ENOBUFS, ENOMEM) the error repeats until a connection closes, and
//! retrying at once would spin and log thousands of lines a second. nginx
//! disables accept for a moment and logs each failure at `alert`; vigil
//! backs off (10 ms doubling to 1 s, reset by a successful accept) and logs
//! once per second with the count of failures not logged.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// First wait after a failed accept.
pub const MIN_DELAY: Duration = Duration::from_millis(10);
/// Longest wait between two tries.
pub const MAX_DELAY: Duration = Duration::from_secs(1);
/// At most one message per this interval.
pub const LOG_INTERVAL: Duration = Duration::from_secs(1);

/// The accept loop's memory of recent failures.
#[derive(Debug)]
pub struct AcceptBackoff {
    delay: Duration,
    last_log: Option<Instant>,
    /// Failures since the last message that were not logged.
    suppressed: u64,
}

/// What to do about one failed accept.
#[derive(Debug, PartialEq, Eq)]
pub struct OnError {
    /// Wait this long before accepting again (zero: try again at once).
    pub wait: Duration,
    /// Log now, with this many earlier failures that were not logged.
    pub log: Option<u64>,
}

// === impl AcceptBackoff ===

impl Default for AcceptBackoff {
    fn default() -> Self {
        Self::new()
    }
}

impl AcceptBackoff {
    /// No failure yet.
    pub fn new() -> Self {
        Self {
            delay: MIN_DELAY,
            last_log: None,
            suppressed: 0,
        }
    }

    /// `accept()` failed with `e` at `now`.
    pub fn on_error(&mut self, e: &io::Error, now: Instant) -> OnError {
        if is_per_connection(e) {
            // The client gave up before we took its connection: the next one is fine.
            return OnError {
                wait: Duration::ZERO,
                log: None,
            };
        }
        let wait = self.delay;
        self.delay = (self.delay * 2).min(MAX_DELAY);
        let due = self
            .last_log
            .is_none_or(|t| now.saturating_duration_since(t) >= LOG_INTERVAL);
        let log = if due {
            self.last_log = Some(now);
            Some(std::mem::take(&mut self.suppressed))
        } else {
            self.suppressed += 1;
            None
        };
        OnError { wait, log }
    }

    /// A connection was accepted at `now`. Returns the failures not yet
    /// logged when it is time to say that accepting works again.
    pub fn on_accept(&mut self, now: Instant) -> Option<u64> {
        self.delay = MIN_DELAY;
        if self.suppressed == 0 {
            return None;
        }
        let due = self
            .last_log
            .is_none_or(|t| now.saturating_duration_since(t) >= LOG_INTERVAL);
        due.then(|| {
            self.last_log = Some(now);
            std::mem::take(&mut self.suppressed)
        })
    }
}

/// Errors about one connection, not about the listener.
fn is_per_connection(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
    )
}

/// Accept on `listener` (called `name` in logs, listening on `addr`)
/// until `stop` fires. Each connection gets `TCP_NODELAY` and goes to
/// `on_accept`, whose future (None: the connection is dropped at once) runs
/// on `tracker`. A failed accept backs off ([`AcceptBackoff`]). Returns
/// when `stop` fires; the caller closes and waits on `tracker` as its
/// graceful stop requires.
pub async fn accept_loop<F, Fut>(
    listener: &TcpListener,
    name: &'static str,
    addr: SocketAddr,
    stop: &CancellationToken,
    tracker: &TaskTracker,
    mut on_accept: F,
) where
    F: FnMut(TcpStream, SocketAddr) -> Option<Fut>,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut backoff = AcceptBackoff::new();
    let stopped = stop.cancelled();
    tokio::pin!(stopped);
    loop {
        let accepted = tokio::select! {
            biased;
            _ = &mut stopped => return,
            a = listener.accept() => a,
        };
        let (stream, client) = match accepted {
            Ok(a) => a,
            Err(e) => {
                let r = backoff.on_error(&e, Instant::now());
                if let Some(suppressed) = r.log {
                    tracing::error!(listener = name, %addr, error = %e, suppressed, retry_in = ?r.wait, "accept failed");
                } else if r.wait.is_zero() {
                    tracing::debug!(listener = name, %addr, error = %e, "accept failed");
                }
                if !r.wait.is_zero() {
                    tokio::select! {
                        _ = &mut stopped => return,
                        _ = tokio::time::sleep(r.wait) => {}
                    }
                }
                continue;
            }
        };
        if let Some(suppressed) = backoff.on_accept(Instant::now()) {
            tracing::warn!(listener = name, %addr, suppressed, "accepting again");
        }
        let _ = stream.set_nodelay(true);
        if let Some(served) = on_accept(stream, client) {
            tracker.spawn(served);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn emfile() -> io::Error {
        // EMFILE on Linux and the BSDs.
        io::Error::from_raw_os_error(24)
    }

    #[tokio::test(start_paused = true)]
    async fn waits_double_up_to_a_second_and_reset_on_accept() {
        let mut b = AcceptBackoff::new();
        let now = Instant::now();
        let waits: Vec<u128> = (0..9)
            .map(|_| b.on_error(&emfile(), now).wait.as_millis())
            .collect();
        assert_eq!(waits, [10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        let _ = b.on_accept(now);
        assert_eq!(b.on_error(&emfile(), now).wait, MIN_DELAY);
    }

    #[tokio::test(start_paused = true)]
    async fn one_message_per_interval_with_the_count_not_logged() {
        let mut b = AcceptBackoff::new();
        // 2,876 failures in 70 s (the figure), 10 ms to 1 s apart:
        // the clock advances by each wait, as the accept loop sleeps it.
        let start = Instant::now();
        let mut logged = Vec::new();
        let mut failures = 0u64;
        while Instant::now() - start < Duration::from_secs(70) {
            let r = b.on_error(&emfile(), Instant::now());
            failures += 1;
            if let Some(n) = r.log {
                logged.push(n);
            }
            // Every fifth try finds a free descriptor for a moment.
            if failures.is_multiple_of(5) {
                if let Some(n) = b.on_accept(Instant::now()) {
                    logged.push(n);
                }
            }
            tokio::time::advance(r.wait).await;
        }
        let lines = logged.len() as u64;
        assert!(lines <= 71, "{lines} messages in 70 s");
        assert_eq!(logged[0], 0, "the first failure is logged at once");
        assert_eq!(
            logged.iter().sum::<u64>() + lines + b.suppressed,
            failures,
            "every failure is logged or counted in a later message"
        );
    }

    #[tokio::test]
    async fn connections_go_to_the_service_until_stop() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let tracker = TaskTracker::new();
        let (seen, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let serving = {
            let (stop, tracker) = (stop.clone(), tracker.clone());
            tokio::spawn(async move {
                accept_loop(&listener, "test", addr, &stop, &tracker, |s, _| {
                    let seen = seen.clone();
                    Some(async move {
                        let _ = seen.send(s.nodelay().unwrap());
                    })
                })
                .await;
            })
        };
        let _c = TcpStream::connect(addr).await.unwrap();
        assert_eq!(rx.recv().await, Some(true), "served, with TCP_NODELAY");
        stop.cancel();
        serving.await.unwrap();
        tracker.close();
        tracker.wait().await;
        assert!(
            TcpStream::connect(addr).await.is_err(),
            "the listener is closed after stop"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_gave_up_is_no_reason_to_wait() {
        let mut b = AcceptBackoff::new();
        let r = b.on_error(
            &io::Error::from(io::ErrorKind::ConnectionAborted),
            Instant::now(),
        );
        assert_eq!(
            r,
            OnError {
                wait: Duration::ZERO,
                log: None
            }
        );
        assert_eq!(b.on_error(&emfile(), Instant::now()).wait, MIN_DELAY);
    }
}
