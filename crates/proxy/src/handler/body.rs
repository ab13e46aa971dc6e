//! Bodies: the request body as buffered for replay (memory, then a temp
//! file, bounded by `client_max_body_size`) or streamed ([`ClientBody`]),
//! both with `client_body_timeout` between two reads, and the upstream response body
//! streamed to the client with `proxy_read_timeout` between two reads,
//! which releases the peer and returns the connection to the pool at the end.

use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Body, Frame, SizeHint};

use crate::upstream::RespBody;
use tokio::io::AsyncWriteExt;
use vigil_core::upstream::PeerGuard;

use crate::obs::metrics::UpstreamStats;
use crate::upstream::pool::{Conn, Link, Shard};

pub(crate) use crate::wire::payload::{empty, full, BoxError, UpBody};

/// A request body read completely so it can be sent again on a retry.
#[derive(Debug)]
pub(crate) enum Buffered {
    /// No body.
    Empty,
    /// Small bodies stay in memory.
    Memory(Bytes),
    /// Larger ones go to a temp file (deleted on drop).
    File {
        /// The spool file.
        file: Arc<tempfile::TempPath>,
        /// Its length.
        len: u64,
    },
}

/// Why a request body could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BodyError {
    /// More than `client_max_body_size`: 413.
    #[error("request body larger than client_max_body_size ({0} bytes)")]
    TooLarge(u64),
    /// The client went away or sent garbage.
    #[error("reading the request body failed: {0}")]
    Client(#[source] BoxError),
    /// The spool file could not be written.
    #[error("spooling the request body failed: {0}")]
    Spool(#[source] std::io::Error),
    /// The client sent nothing for `client_body_timeout`.
    #[error("client sent no request body bytes for {0:?} (client_body_timeout)")]
    Timeout(Duration),
}

/// A streamed request body (`proxy_request_buffering off`) with
/// `client_body_timeout` between two reads; how it failed, if it did, is
/// kept for the handler ([`ClientBody::fault`]): the attempt that was
/// sending it fails, but by the client's doing.
pub(crate) struct ClientBody {
    inner: RequestBody,
    idle: Idle,
    fault: Arc<ClientFault>,
}

/// How a streamed request body failed on the client's side: none yet, or
/// one of [`Fault`]. Set once by the body, read by the handler.
#[derive(Debug, Default)]
pub(crate) struct ClientFault(AtomicU8);

/// The client's failure while its body was streamed, and how nginx ends
/// such a request (`ngx_http_read_unbuffered_request_body`'s status; the
/// peer is freed with state 0: nothing charged, nothing retried).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fault {
    /// Nothing came for `client_body_timeout`: 408, the connection closed
    /// without an answer.
    Timeout,
    /// A malformed body (a bad chunk): 400, answered.
    Bad,
    /// The client closed or reset the connection (HTTP/2: reset the
    /// stream) before the body's end: 400 in the log ("client prematurely
    /// closed connection"; nginx logs 400 for an HTTP/2 reset too),
    /// nothing sent.
    Closed,
}

/// `client_body_timeout`: one sleep, re-armed only when it fires while
/// bytes came in meanwhile.
struct Idle {
    timeout: Duration,
    last: tokio::time::Instant,
    sleep: Option<crate::conn::timer::Sleep>,
}

pub(crate) use crate::wire::request_body::RequestBody;

impl std::fmt::Debug for RequestBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RequestBody::Hyper(_) => f.write_str("RequestBody::Hyper"),
            RequestBody::H1(b) => b.fmt(f),
        }
    }
}

/// Bodies up to this size stay in memory (nginx's `client_body_buffer_size`
/// is 8–16 KiB; vigil keeps more in memory and spools the rest).
pub(crate) const MEMORY_LIMIT: usize = 64 * 1024;

/// Read the whole body, spooling to `spool_dir` past [`MEMORY_LIMIT`], with
/// at most `timeout` (`client_body_timeout`) between two reads.
pub(crate) async fn buffer(
    mut body: RequestBody,
    max: u64,
    spool_dir: &std::path::Path,
    timeout: Duration,
) -> Result<Buffered, BodyError> {
    let mut mem = BytesMut::new();
    let mut file: Option<(tokio::fs::File, tempfile::TempPath)> = None;
    let mut total: u64 = 0;
    let mut idle = Idle::new(timeout);
    loop {
        let next = std::future::poll_fn(|cx| {
            if let Poll::Ready(f) = Pin::new(&mut body).poll_frame(cx) {
                return Poll::Ready(Ok(f));
            }
            idle.poll_expired(cx)
                .map(|()| Err(BodyError::Timeout(timeout)))
        })
        .await?;
        let Some(frame) = next else {
            break;
        };
        idle.progress();
        let frame = frame.map_err(BodyError::Client)?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        total += data.len() as u64;
        if max != 0 && total > max {
            return Err(BodyError::TooLarge(max));
        }
        match &mut file {
            Some((f, _)) => f.write_all(&data).await.map_err(BodyError::Spool)?,
            None if mem.len() + data.len() > MEMORY_LIMIT => {
                let tmp = tempfile::Builder::new()
                    .prefix("vigil-body-")
                    .tempfile_in(spool_dir)
                    .map_err(BodyError::Spool)?;
                let (std_file, path) = tmp.into_parts();
                let mut f = tokio::fs::File::from_std(std_file);
                f.write_all(&mem).await.map_err(BodyError::Spool)?;
                f.write_all(&data).await.map_err(BodyError::Spool)?;
                mem.clear();
                file = Some((f, path));
            }
            None => mem.extend_from_slice(&data),
        }
    }
    Ok(match file {
        Some((mut f, path)) => {
            f.flush().await.map_err(BodyError::Spool)?;
            Buffered::File {
                file: Arc::new(path),
                len: total,
            }
        }
        None if mem.is_empty() => Buffered::Empty,
        None => Buffered::Memory(mem.freeze()),
    })
}

impl Buffered {
    /// Its length.
    pub(crate) fn len(&self) -> u64 {
        match self {
            Buffered::Empty => 0,
            Buffered::Memory(b) => b.len() as u64,
            Buffered::File { len, .. } => *len,
        }
    }

    /// A fresh body for one attempt.
    pub(crate) async fn replay(&self) -> std::io::Result<UpBody> {
        Ok(match self {
            Buffered::Empty => empty(),
            Buffered::Memory(b) => full(b.clone()),
            Buffered::File { file, .. } => {
                let f = tokio::fs::File::open(&**file).await?;
                let stream = tokio_util::io::ReaderStream::new(f);
                let mapped = futures_util::StreamExt::map(stream, |r| {
                    r.map(Frame::data).map_err(BoxError::from)
                });
                StreamBody::new(mapped).boxed()
            }
        })
    }
}

// === impl ClientBody ===

impl ClientBody {
    /// Stream `inner` with `timeout` between two reads.
    pub(crate) fn new(inner: RequestBody, timeout: Duration) -> Self {
        Self {
            inner,
            idle: Idle::new(timeout),
            fault: Arc::default(),
        }
    }

    /// Set once the body failed on the client's side (the attempt's
    /// failure is then the client's, not the peer's).
    pub(crate) fn fault(&self) -> Arc<ClientFault> {
        self.fault.clone()
    }
}

// === impl ClientFault ===

impl ClientFault {
    const TIMEOUT: u8 = 1;
    const BAD: u8 = 2;
    const CLOSED: u8 = 3;

    fn set(&self, fault: Fault) {
        let v = match fault {
            Fault::Timeout => Self::TIMEOUT,
            Fault::Bad => Self::BAD,
            Fault::Closed => Self::CLOSED,
        };
        let _ = self
            .0
            .compare_exchange(0, v, Ordering::AcqRel, Ordering::Acquire);
    }

    /// The failure, if the body failed on the client's side.
    pub(crate) fn get(&self) -> Option<Fault> {
        match self.0.load(Ordering::Acquire) {
            Self::TIMEOUT => Some(Fault::Timeout),
            Self::BAD => Some(Fault::Bad),
            Self::CLOSED => Some(Fault::Closed),
            _ => None,
        }
    }
}

/// What a failed frame of the client's body says of the client.
fn fault_of(inner: &RequestBody, e: &BoxError) -> Fault {
    match inner {
        RequestBody::H1(_) => match e.downcast_ref::<crate::wire::h1::read::BodyError>() {
            Some(crate::wire::h1::read::BodyError::Chunked(_)) => Fault::Bad,
            _ => Fault::Closed,
        },
        RequestBody::Hyper(_) => Fault::Closed,
    }
}

impl Body for ClientBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(f) => {
                this.idle.progress();
                if let Some(Err(e)) = &f {
                    this.fault.set(fault_of(&this.inner, e));
                }
                Poll::Ready(f)
            }
            Poll::Pending => {
                ready!(this.idle.poll_expired(cx));
                this.fault.set(Fault::Timeout);
                Poll::Ready(Some(Err(Box::new(BodyError::Timeout(this.idle.timeout)))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

// === impl Idle ===

impl Idle {
    fn new(timeout: Duration) -> Self {
        Self {
            timeout,
            last: tokio::time::Instant::now(),
            sleep: None,
        }
    }

    fn progress(&mut self) {
        self.last = tokio::time::Instant::now();
    }

    /// Ready once `timeout` passed since the last [`Idle::progress`].
    fn poll_expired(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let Some(due) = self.last.checked_add(self.timeout) else {
            return Poll::Pending;
        };
        let sleep = self
            .sleep
            .get_or_insert_with(|| crate::conn::timer::sleep_until(due));
        loop {
            ready!(Pin::new(&mut *sleep).poll(cx));
            if tokio::time::Instant::now() >= due {
                return Poll::Ready(());
            }
            sleep.reset(due);
        }
    }
}

/// The upstream's response body on its way to the client.
pub(crate) struct Streamed {
    inner: RespBody,
    read_timeout: Duration,
    /// `proxy_read_timeout`, armed when a read finds nothing (as nginx
    /// arms its read timer on EAGAIN); re-armed from then after progress.
    sleep: Option<crate::conn::timer::Sleep>,
    /// A frame came since the timer was armed.
    progressed: bool,
    guard: Option<PeerGuard>,
    conn: Option<(Arc<Shard>, Conn)>,
    /// For the error_log line when the body breaks (about the guard's
    /// peer).
    cx: crate::obs::errlog::Context,
    /// The upstream's counters, where a charge after the header is counted.
    stats: Option<Arc<UpstreamStats>>,
}

impl Streamed {
    pub(crate) fn new(
        inner: RespBody,
        read_timeout: Duration,
        guard: PeerGuard,
        conn: Option<(Arc<Shard>, Conn)>,
        cx: crate::obs::errlog::Context,
        stats: Option<Arc<UpstreamStats>>,
    ) -> Self {
        let mut s = Self {
            inner,
            read_timeout,
            sleep: None,
            progressed: false,
            guard: Some(guard),
            conn,
            cx,
            stats,
        };
        // No body (HEAD, 204, 304, Content-Length: 0): hyper's server does
        // not poll it, so the connection goes back now.
        if s.inner.is_end_stream() {
            s.finish(true);
        }
        s
    }

    /// The body broke after the header went out: nginx's error_log line
    /// (about the guard's peer), then core decides whether that is charged
    /// (`passive_count after_header`; nginx never charges it).
    fn broke(
        &mut self,
        class: vigil_core::FailureClass,
        failure: crate::obs::errlog::Failure,
        detail: &dyn std::fmt::Display,
    ) {
        self.cx
            .log(self.guard.as_ref(), failure, "reading upstream", detail);
        if let Some(g) = self.guard.as_mut() {
            let now = g.upstream().clock().now();
            let charged = g.fail_after_header(class, now);
            if let Some(s) = &self.stats {
                s.charged(g.peer().id(), charged);
            }
        }
        self.finish(false);
    }

    fn finish(&mut self, complete: bool) {
        if let Some((pool, mut conn)) = self.conn.take() {
            if complete {
                if matches!(conn.link, Link::Lent) {
                    // A plain connection comes back from its body.
                    if let Some(h1) = self.inner.reclaim() {
                        conn.link = Link::H1(h1);
                        pool.checkin(conn);
                    }
                } else {
                    pool.checkin(conn);
                }
            }
        }
        // nginx frees the peer with state 0 once the response is finished,
        // also when the body broke after the header went out (s15).
        self.guard.take();
    }

    /// Ready once `proxy_read_timeout` passed with nothing read.
    fn poll_timer(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let timeout = self.read_timeout;
        let sleep = self
            .sleep
            .get_or_insert_with(|| crate::conn::timer::sleep(timeout));
        if std::mem::take(&mut self.progressed) {
            sleep.reset(crate::conn::timer::after(timeout));
        }
        Pin::new(sleep).poll(cx)
    }
}

/// The upstream stopped sending within `proxy_read_timeout`.
#[derive(Debug, thiserror::Error)]
#[error("upstream timed out reading the response body")]
pub(crate) struct BodyTimeout;

impl Body for Streamed {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                this.progressed = true;
                if this.inner.is_end_stream() {
                    this.finish(true);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                // nginx: "upstream prematurely closed connection while
                // reading upstream" and its kin, at error level.
                let failure = crate::obs::errlog::Failure::of(&e);
                this.broke(vigil_core::FailureClass::Error, failure, &e);
                Poll::Ready(Some(Err(e.into())))
            }
            Poll::Ready(None) => {
                this.finish(true);
                Poll::Ready(None)
            }
            Poll::Pending => {
                ready!(this.poll_timer(cx));
                this.broke(
                    vigil_core::FailureClass::Timeout,
                    crate::obs::errlog::Failure::Timeout,
                    &BodyTimeout,
                );
                Poll::Ready(Some(Err(Box::new(BodyTimeout))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

use std::future::Future as _;
