//! One attempt against one peer: take a kept-alive connection or open one,
//! send the request, wait for the response header within
//! `proxy_read_timeout`, and classify what went wrong in nginx's terms.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use http_body_util::BodyExt;
use hyper::body::Body as _;

use hyper::body::Incoming;
use hyper::{Request, Response};
use vigil_core::config::PeerAddr;
use vigil_core::peer::Peer;
use vigil_core::{FailureClass, TransportFailure};

use hyper::client::conn::http1::SendRequest;

use crate::connect::{connect, connect_plain, ConnectError, TlsSettings};
use crate::payload::UpBody;
use crate::pool::{Conn, Link};
use crate::raw_head::RawFields;
use crate::route::Route;
use crate::upstream::{self, Phase, RespBody, H1};

/// A response header arrived.
pub(crate) struct Answered {
    pub(crate) response: Response<RespBody>,
    /// The connection (for a plain one, lent to the response body, which
    /// gives it back when it ended cleanly).
    pub(crate) conn: Conn,
    pub(crate) connect_time: f64,
    /// The response's fields as they came (vigil's own reader, on a route
    /// that passes fields so: see [`crate::raw_head`]).
    pub(crate) raw: Option<Box<RawFields>>,
}

/// The attempt failed before a response header.
#[derive(Debug)]
pub(crate) struct Failed {
    pub(crate) failure: TransportFailure,
    pub(crate) detail: String,
    pub(crate) connect_time: Option<f64>,
}

/// Where an attempt's request is built, once its connection is ready:
/// vigil's own client takes its head written from the request's fields
/// (no header map); hyper's (a TLS peer) a request with a map, built in
/// the room of one whose message is done.
pub(crate) enum Room<'o> {
    Head(upstream::HeadOut<'o>),
    Map(http::HeaderMap),
}

/// An attempt's request, as its [`Room`] asked.
pub(crate) enum Outgoing {
    H1(upstream::Written, UpBody),
    Hyper(Request<UpBody>),
}

/// What the request's handler sees of one attempt while it runs.
#[derive(Debug, Default)]
pub(crate) struct Race {
    /// The connection is ready (from then on the request may be sent).
    pub(crate) connected: AtomicBool,
    /// Another attempt of a request that cannot be sent twice connected
    /// first: this one ended without sending anything.
    pub(crate) lost: AtomicBool,
    /// This attempt took such a request's one send.
    pub(crate) claimed: AtomicBool,
}

/// Run one attempt. `make_request` is called only once a connection is
/// ready, so a refused connect leaves a streamed body unread for the next
/// peer. `race`: what the handler watches while hedges may race (None
/// without `hedge`). `once`, for such a request that cannot be sent twice
/// (shared by its attempts): the first attempt whose connection is ready
/// takes it and sends; a later one puts its fresh connection in the pool
/// and ends with `race.lost` set.
///
/// A plain `http://` peer is spoken to by [`crate::upstream::H1`] in this
/// task; a TLS one through hyper's client. What it awaits is boxed (the
/// connect, the send): this future is boxed per attempt, and under glibc's
/// 1,032-byte limit each box takes its fast path.
/// An `async` block, holding `make_request` once (rust-lang/rust#62958).
#[allow(
    clippy::manual_async_fn,
    reason = "an async fn would hold its arguments twice"
)]
pub(crate) fn run<'a, F>(
    route: &'a Route,
    peer: &'a Peer,
    tls: Option<&'a TlsSettings>,
    replayable: bool,
    race: Option<Arc<Race>>,
    once: Option<Arc<AtomicBool>>,
    make_request: F,
) -> impl Future<Output = Result<Box<Answered>, Failed>> + use<'a, F>
where
    F: FnOnce(Room<'_>) -> Result<Outgoing, String>,
{
    async move {
        let start = vigil_core::clock::coarse_tick();
        let settings = &route.location.proxy;
        let (mut conn, cached) = match route.pool.checkout(peer.id()) {
            Some(c) => (c, true),
            None => {
                let addr = peer.config().peer_addr();
                let link = match (tls, &addr) {
                    (None, _) => Box::pin(connect_plain(&addr, settings.connect_timeout))
                        .await
                        .map(|io| Link::H1(H1::new(io))),
                    (Some(t), PeerAddr::Inet(a)) => Box::pin(connect(
                        *a,
                        settings.connect_timeout,
                        Some((t, route.proxy_host.as_str())),
                    ))
                    .await
                    .map(Link::Hyper),
                    (Some(_), PeerAddr::Unix(_)) => Err(ConnectError::Io {
                        addr: addr.clone(),
                        source: std::io::Error::new(
                            std::io::ErrorKind::Unsupported,
                            "TLS to a unix-domain socket is not supported by vigil",
                        ),
                    }),
                };
                match link {
                    Ok(link) => (
                        Conn {
                            peer: peer.id(),
                            link,
                            idle_since: start,
                            requests: 0,
                        },
                        false,
                    ),
                    Err(e) => return Err(connect_failed(e)),
                }
            }
        };
        let connect_time = secs(vigil_core::clock::coarse_tick().since(start));
        if let Link::Hyper(sender) = &mut conn.link {
            if let Err(e) = sender.ready().await {
                // A kept-alive connection the peer closed: nginx's cached `error`.
                return Err(Failed {
                    failure: TransportFailure {
                        class: FailureClass::Error,
                        request_sent: false,
                        cached_connection: cached,
                    },
                    detail: format!("connection to {} closed: {e}", peer.name()),
                    connect_time: Some(connect_time),
                });
            }
        }
        if let Some(race) = race.as_deref() {
            race.connected.store(true, Ordering::Release);
            if let Some(once) = once.as_deref() {
                if once.swap(true, Ordering::AcqRel) {
                    race.lost.store(true, Ordering::Release);
                    route.pool.checkin(conn);
                    return Err(Failed {
                        failure: TransportFailure {
                            class: FailureClass::Error,
                            request_sent: false,
                            cached_connection: cached,
                        },
                        detail: format!(
                            "connected to {} after another attempt had the request",
                            peer.name()
                        ),
                        connect_time: Some(connect_time),
                    });
                }
                race.claimed.store(true, Ordering::Release);
            }
        }
        let build_failed = |detail: String| Failed {
            failure: TransportFailure {
                class: FailureClass::Error,
                request_sent: false,
                cached_connection: false,
            },
            detail,
            connect_time: Some(connect_time),
        };
        let timed_out = |phase: Phase| {
            let (what, limit) = match phase {
                Phase::Sending => ("sending the request", settings.send_timeout),
                Phase::Waiting => ("reading response header", settings.read_timeout),
            };
            Failed {
                failure: TransportFailure {
                    class: FailureClass::Timeout,
                    request_sent: true,
                    cached_connection: cached,
                },
                detail: format!(
                    "upstream {} timed out ({}) while {what}",
                    peer.name(),
                    fmt_duration(limit)
                ),
                connect_time: Some(connect_time),
            }
        };
        let (response, asked_upgrade, raw) = match std::mem::replace(&mut conn.link, Link::Lent) {
            Link::H1(mut h1) => {
                let (written, body) = match make_request(Room::Head(h1.head_out())) {
                    Ok(Outgoing::H1(w, b)) => (w, b),
                    Ok(Outgoing::Hyper(_)) => {
                        return Err(build_failed("request built for another client".to_owned()))
                    }
                    Err(detail) => return Err(build_failed(detail)),
                };
                conn.requests += 1;
                let asked_upgrade = written.upgrade;
                let t = upstream::Timeouts {
                    send: settings.send_timeout,
                    read: settings.read_timeout,
                };
                match crate::spare::boxed(|| {
                    h1.send(
                        written,
                        body,
                        t,
                        route.headers.hidden(),
                        route.passes_fields_as_they_came(),
                    )
                })
                .await
                {
                    Ok(r) => (r.response.map(RespBody::H1), asked_upgrade, r.raw),
                    Err(upstream::Error::Timeout(phase)) => return Err(timed_out(phase)),
                    Err(e) => return Err(classify_h1(e, cached, replayable, peer, connect_time)),
                }
            }
            Link::Hyper(mut sender) => {
                // The request's fields go in the room of a map whose
                // message is done.
                let request = match make_request(Room::Map(crate::spare::map(0))) {
                    Ok(Outgoing::Hyper(r)) => r,
                    Ok(Outgoing::H1(..)) => {
                        return Err(build_failed("request built for another client".to_owned()))
                    }
                    Err(detail) => return Err(build_failed(detail)),
                };
                conn.requests += 1;
                let asked_upgrade =
                    crate::hop::has_field(request.headers(), &http::header::UPGRADE);
                let r = Box::pin(send_hyper(&mut sender, request, settings)).await;
                conn.link = Link::Hyper(sender);
                match r {
                    Ok(Ok(r)) => (r.map(RespBody::Hyper), asked_upgrade, None),
                    Ok(Err(e)) => return Err(classify(e, cached, replayable, peer, connect_time)),
                    Err(phase) => return Err(timed_out(phase)),
                }
            }
            Link::Lent => {
                return Err(Failed {
                    failure: TransportFailure {
                        class: FailureClass::Error,
                        request_sent: false,
                        cached_connection: cached,
                    },
                    detail: format!("connection to {} is in use", peer.name()),
                    connect_time: Some(connect_time),
                })
            }
        };
        // A switch the request did not ask for: the response is not HTTP
        // any more, and nothing can be relayed (nginx would relay bytes
        // raw if its client had sent Upgrade, even unasked upstream).
        if response.status() == http::StatusCode::SWITCHING_PROTOCOLS && !asked_upgrade {
            return Err(Failed {
                failure: TransportFailure {
                    class: FailureClass::InvalidHeader,
                    request_sent: true,
                    cached_connection: cached,
                },
                detail: format!(
                "upstream {} sent 101 Switching Protocols to a request that did not ask to upgrade",
                peer.name()
            ),
                connect_time: Some(connect_time),
            });
        }
        // Boxed: the answer is moved from the attempt's future through the
        // race to the handler, 456 bytes at each step unboxed.
        Ok(Box::new(Answered {
            response,
            conn,
            connect_time,
            raw,
        }))
    }
}

/// Send on hyper's client with nginx's two timers: proxy_send_timeout
/// between two writes of the request, then proxy_read_timeout for the
/// header once it is all sent. A request without a body is all sent with
/// its header: only the read timer runs, and nothing needs tracking.
async fn send_hyper(
    sender: &mut SendRequest<UpBody>,
    request: Request<UpBody>,
    settings: &vigil_core::config::ProxySettings,
) -> Result<Result<Response<Incoming>, hyper::Error>, Phase> {
    let sent_at = tokio::time::Instant::now();
    let progress = (!request.body().is_end_stream()).then(Progress::new);
    // hyper stops polling a body once it wrote Content-Length bytes, so
    // the end is also known by counting.
    let declared = request
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let request = match &progress {
        Some(p) => request.map(|b| BodyExt::boxed(Tracked::new(b, p.clone(), declared))),
        None => request,
    };
    let deadline = |progress: &Option<Progress>| match progress {
        Some(p) => p.deadline(settings.send_timeout, settings.read_timeout),
        None => (sent_at + settings.read_timeout, Phase::Waiting),
    };
    let mut sent = std::pin::pin!(sender.send_request(request));
    loop {
        let (deadline_at, phase) = deadline(&progress);
        // The body is sent by the connection's task: when it is all
        // sent, the read timer replaces the send timer at once.
        let all_sent = async {
            match &progress {
                Some(p) if phase == Phase::Sending => p.all_sent().await,
                _ => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            r = &mut sent => return Ok(r),
            () = all_sent => continue,
            () = crate::timer::sleep_until(deadline_at) => {
                if deadline(&progress).0 > Instant::now() {
                    continue;
                }
                return Err(phase);
            }
        }
    }
}

/// When hyper last took a piece of the request body, whether it took all,
/// and a wake-up for the attempt when it did.
#[derive(Clone)]
struct Progress(Arc<(AtomicU64, AtomicBool, Instant, tokio::sync::Notify)>);

impl Progress {
    fn new() -> Self {
        Self(Arc::new((
            AtomicU64::new(0),
            AtomicBool::new(false),
            Instant::now(),
            tokio::sync::Notify::new(),
        )))
    }

    /// Resolves once the whole body was taken (at once if it was).
    async fn all_sent(&self) {
        while !self.0 .1.load(Ordering::Acquire) {
            self.0 .3.notified().await;
        }
    }

    fn touch(&self) {
        let ms = u64::try_from(self.0 .2.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.0 .0.store(ms, Ordering::Release);
    }

    fn finish(&self) {
        self.touch();
        self.0 .1.store(true, Ordering::Release);
        self.0 .3.notify_one();
    }

    fn deadline(&self, send: Duration, read: Duration) -> (Instant, Phase) {
        let last = Duration::from_millis(self.0 .0.load(Ordering::Acquire));
        let base = self.0 .2 + last;
        if self.0 .1.load(Ordering::Acquire) {
            (base + read, Phase::Waiting)
        } else {
            (base + send, Phase::Sending)
        }
    }
}

/// The request body, reporting each piece hyper takes.
struct Tracked {
    inner: UpBody,
    progress: Progress,
    /// Bytes still to send by the request's Content-Length, if it has one.
    left: Option<u64>,
}

impl Tracked {
    fn new(inner: UpBody, progress: Progress, declared: Option<u64>) -> Self {
        if inner.is_end_stream() || declared == Some(0) {
            progress.finish();
        }
        Self {
            inner,
            progress,
            left: declared,
        }
    }
}

impl hyper::body::Body for Tracked {
    type Data = bytes::Bytes;
    type Error = crate::payload::BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<bytes::Bytes>, Self::Error>>> {
        let r = std::pin::Pin::new(&mut self.inner).poll_frame(cx);
        match &r {
            std::task::Poll::Ready(Some(Ok(frame))) => {
                let n = frame.data_ref().map_or(0, |d| d.len() as u64);
                let left = self.left.map(|l| l.saturating_sub(n));
                self.left = left;
                if self.inner.is_end_stream() || left == Some(0) {
                    self.progress.finish()
                } else {
                    self.progress.touch()
                }
            }
            std::task::Poll::Ready(_) => self.progress.finish(),
            std::task::Poll::Pending => {}
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

fn connect_failed(e: ConnectError) -> Failed {
    Failed {
        failure: TransportFailure {
            class: if e.is_timeout() {
                FailureClass::Timeout
            } else {
                FailureClass::Error
            },
            request_sent: false,
            cached_connection: false,
        },
        detail: e.to_string(),
        connect_time: None,
    }
}

/// hyper's error in nginx's classes: a malformed header is
/// `invalid_header`, a timeout `timeout`, anything else `error`.
fn classify(
    e: hyper::Error,
    cached: bool,
    replayable: bool,
    peer: &Peer,
    connect_time: f64,
) -> Failed {
    let class = if e.is_parse() || e.is_parse_status() || e.is_parse_too_large() {
        FailureClass::InvalidHeader
    } else if is_timeout(&e) {
        FailureClass::Timeout
    } else {
        FailureClass::Error
    };
    // A request on a kept-alive connection that hyper cancelled never left;
    // but a streamed body was handed over and is gone either way.
    let request_sent = !(cached && e.is_canceled() && replayable);
    let what = match class {
        FailureClass::InvalidHeader => "sent an invalid header",
        _ if e.is_incomplete_message() => "closed the connection prematurely",
        _ => "failed",
    };
    Failed {
        failure: TransportFailure {
            class,
            request_sent,
            cached_connection: cached,
        },
        detail: format!("upstream {} {what}: {e}", peer.name()),
        connect_time: Some(connect_time),
    }
}

/// The plain client's error in nginx's classes, as [`classify`] does for
/// hyper's: a request on a kept-alive connection none of which left may
/// go again.
fn classify_h1(
    e: upstream::Error,
    cached: bool,
    replayable: bool,
    peer: &Peer,
    connect_time: f64,
) -> Failed {
    use upstream::Error as E;
    let (class, request_sent, what) = match &e {
        E::Parse(_) | E::TooManyFields => {
            (FailureClass::InvalidHeader, true, "sent an invalid header")
        }
        E::Closed => (
            FailureClass::Error,
            true,
            "closed the connection prematurely",
        ),
        E::Write { written, .. } => (
            FailureClass::Error,
            !(cached && !written && replayable),
            "failed",
        ),
        E::Read(io) if io.kind() == std::io::ErrorKind::TimedOut => {
            (FailureClass::Timeout, true, "failed")
        }
        E::Read(_) | E::Body(_) => (FailureClass::Error, true, "failed"),
        E::Timeout(_) => (FailureClass::Timeout, true, "timed out"),
    };
    Failed {
        failure: TransportFailure {
            class,
            request_sent,
            cached_connection: cached,
        },
        detail: format!("upstream {} {what}: {e}", peer.name()),
        connect_time: Some(connect_time),
    }
}

fn is_timeout(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::TimedOut {
                return true;
            }
        }
        cur = err.source();
    }
    false
}

pub(crate) fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

fn fmt_duration(d: Duration) -> String {
    vigil_core::config::value::format_time(d)
}
