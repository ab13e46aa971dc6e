//! One probe against one target: `tcp` (connect, then a short peek so that
//! a peer that closes or resets at once fails, as tengine's peek handler
//! does), `http` (send the raw `check_http_send` bytes, parse the status
//! line, accept by `check_http_expect_alive`, optionally look for a string
//! in the first 64 KiB of the body) and `https` (the same over rustls).
//!
//! One deadline, `timeout`, covers the whole probe (tengine arms one timer
//! for connect, send and receive together). Each step waits until that
//! deadline; the step that runs out names the phase of the failure.

mod http;
pub mod tls;

pub use http::judge_reply;

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::time::Instant;
use vigil_core::config::value::format_time;
use vigil_core::config::{CheckKind, HttpCheck};
use vigil_core::health::ProbePhase;

/// How long a tcp probe watches a fresh connection for an immediate close
/// or reset (tengine peeks once, right after connect).
const TCP_PEEK_WINDOW: Duration = Duration::from_millis(50);

/// What one probe loop probes.
#[derive(Clone)]
pub struct Target {
    /// Where to connect (the server's address, or its host with `port=`).
    pub addr: SocketAddr,
    /// The unix-domain socket to connect to instead of `addr` (`server
    /// unix:/path`; `port=` does not apply).
    pub unix: Option<std::path::PathBuf>,
    /// `tcp`, `http` or `https`.
    pub kind: CheckKind,
    /// The host part of the server's address as written: the TLS server
    /// name (SNI and certificate check) for `https`.
    pub server_name: String,
    /// The request and what to accept (`http` and `https`).
    pub http: HttpCheck,
    /// One deadline for the whole probe.
    pub timeout: Duration,
    /// Time between two probe starts.
    pub interval: Duration,
    /// Random extra delay, up to this much, added to each interval.
    pub jitter: Duration,
    /// rustls settings for `https`.
    pub tls: Option<Arc<rustls::ClientConfig>>,
}

/// Why a probe failed: the phase, a class for callers to ask about, and a
/// line for the operator.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{phase}: {detail}")]
pub struct ProbeFailure {
    phase: ProbePhase,
    kind: FailureKind,
    detail: String,
}

/// The class of a probe failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureKind {
    /// The deadline passed.
    Timeout,
    /// Connection refused.
    Refused,
    /// Reset or closed by the peer, or another socket error.
    Io,
    /// The TLS handshake failed (certificate, name, protocol).
    Tls,
    /// The response was not HTTP.
    Protocol,
    /// The status is not accepted.
    Status,
    /// The body does not contain the expected text.
    Body,
}

/// The result of one probe: a short description of what was seen.
pub type ProbeResult = Result<String, ProbeFailure>;

/// A boxed probe future.
pub type ProbeFuture<'a> = Pin<Box<dyn Future<Output = ProbeResult> + Send + 'a>>;

/// Runs probes. The scheduler owns timing; a prober only probes.
pub trait Prober: Send + Sync + 'static {
    /// Probe `target` once, within `target.timeout`.
    fn probe<'a>(&'a self, target: &'a Target) -> ProbeFuture<'a>;
}

/// The real prober: sockets on the network.
#[derive(Clone, Copy, Debug, Default)]
pub struct NetProber;

// === impl Target ===

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("addr", &self.addr)
            .field("unix", &self.unix)
            .field("kind", &self.kind)
            .field("server_name", &self.server_name)
            .field("timeout", &self.timeout)
            .field("interval", &self.interval)
            .finish()
    }
}

// === impl ProbeFailure ===

impl ProbeFailure {
    /// A failure in `phase`.
    pub fn new(phase: ProbePhase, kind: FailureKind, detail: impl Into<String>) -> Self {
        Self {
            phase,
            kind,
            detail: detail.into(),
        }
    }

    fn timeout(phase: ProbePhase, timeout: Duration, doing: &str) -> Self {
        Self::new(
            phase,
            FailureKind::Timeout,
            format!("timed out after {} {doing}", format_time(timeout)),
        )
    }

    fn io(phase: ProbePhase, e: &io::Error) -> Self {
        let (kind, detail) = match e.kind() {
            io::ErrorKind::ConnectionRefused => (FailureKind::Refused, "connection refused".into()),
            io::ErrorKind::ConnectionReset => (FailureKind::Io, "connection reset by peer".into()),
            io::ErrorKind::BrokenPipe => (FailureKind::Io, "connection closed by peer".into()),
            _ => (FailureKind::Io, e.to_string()),
        };
        Self::new(phase, kind, detail)
    }

    /// The phase that failed.
    pub fn phase(&self) -> ProbePhase {
        self.phase
    }

    /// The failure class.
    pub fn kind(&self) -> FailureKind {
        self.kind
    }

    /// What went wrong, for the operator.
    pub fn detail(&self) -> &str {
        &self.detail
    }

    /// Whether the deadline passed.
    pub fn is_timeout(&self) -> bool {
        self.kind == FailureKind::Timeout
    }

    /// Whether the connection was refused.
    pub fn is_refused(&self) -> bool {
        self.kind == FailureKind::Refused
    }
}

// === impl NetProber ===

impl Prober for NetProber {
    fn probe<'a>(&'a self, target: &'a Target) -> ProbeFuture<'a> {
        Box::pin(run(target))
    }
}

/// Probe `target` once over the network.
pub async fn run(target: &Target) -> ProbeResult {
    let deadline = Deadline::new(target.timeout);
    if let Some(path) = &target.unix {
        let s = deadline
            .within(
                ProbePhase::Connect,
                "connecting",
                tokio::net::UnixStream::connect(path),
            )
            .await?
            .map_err(|e| ProbeFailure::io(ProbePhase::Connect, &e))?;
        return match target.kind {
            CheckKind::Tcp => peek_unix(s, &deadline).await,
            CheckKind::Http => http::exchange(s, target, &deadline).await,
            CheckKind::Https => {
                let tls = tls::handshake(s, target, &deadline).await?;
                http::exchange(tls, target, &deadline).await
            }
        };
    }
    let tcp = deadline
        .within(
            ProbePhase::Connect,
            "connecting",
            TcpStream::connect(target.addr),
        )
        .await?
        .map_err(|e| ProbeFailure::io(ProbePhase::Connect, &e))?;
    let _ = tcp.set_nodelay(true);
    match target.kind {
        CheckKind::Tcp => peek(tcp, &deadline).await,
        CheckKind::Http => http::exchange(tcp, target, &deadline).await,
        CheckKind::Https => {
            let tls = tls::handshake(tcp, target, &deadline).await?;
            http::exchange(tls, target, &deadline).await
        }
    }
}

/// tengine's tcp check: connected, and the peer did not close or reset at once.
async fn peek(tcp: TcpStream, deadline: &Deadline) -> ProbeResult {
    let mut buf = [0u8; 1];
    let window = deadline.remaining().min(TCP_PEEK_WINDOW);
    peeked(tokio::time::timeout(window, tcp.peek(&mut buf)).await)
}

/// What the first byte (or its absence within the window) says.
fn peeked(r: Result<io::Result<usize>, tokio::time::error::Elapsed>) -> ProbeResult {
    match r {
        Err(_) => Ok("connected".into()),
        Ok(Ok(0)) => Err(ProbeFailure::new(
            ProbePhase::Connect,
            FailureKind::Io,
            "connection closed by the peer right after connect",
        )),
        Ok(Ok(_)) => Ok("connected (the peer spoke first)".into()),
        Ok(Err(e)) => Err(ProbeFailure::io(ProbePhase::Connect, &e)),
    }
}

/// [`peek`] on a unix-domain socket (tokio has no `peek` there: the byte
/// read, if any, is of a connection the probe drops anyway).
async fn peek_unix(s: tokio::net::UnixStream, deadline: &Deadline) -> ProbeResult {
    let window = deadline.remaining().min(TCP_PEEK_WINDOW);
    let watch = async {
        loop {
            s.readable().await?;
            let mut buf = [0u8; 1];
            match s.try_read(&mut buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                other => return other,
            }
        }
    };
    peeked(tokio::time::timeout(window, watch).await)
}

/// The one deadline of a probe.
pub(crate) struct Deadline {
    at: Instant,
    timeout: Duration,
}

impl Deadline {
    fn new(timeout: Duration) -> Self {
        Self {
            at: Instant::now() + timeout,
            timeout,
        }
    }

    fn remaining(&self) -> Duration {
        self.at.saturating_duration_since(Instant::now())
    }

    /// Run `f` until the deadline; running out fails `phase`.
    pub(crate) async fn within<F: Future>(
        &self,
        phase: ProbePhase,
        doing: &str,
        f: F,
    ) -> Result<F::Output, ProbeFailure> {
        tokio::time::timeout_at(self.at, f)
            .await
            .map_err(|_| ProbeFailure::timeout(phase, self.timeout, doing))
    }
}

/// An HTTP/1.0 request for `method path` with an optional `Host` header,
/// as raw bytes for [`HttpCheck::send`] (the model keeps tengine's raw
/// request; this builds one from its parts).
pub fn http_request(method: &str, path: &str, host: Option<&str>) -> String {
    let mut s = format!("{method} {path} HTTP/1.0\r\n");
    if let Some(h) = host {
        s.push_str(&format!("Host: {h}\r\n"));
    }
    s.push_str("User-Agent: vigil-checker\r\n\r\n");
    s
}
