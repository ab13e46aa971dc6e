//! One attempt against one peer: take a kept-alive connection or open one,
//! send the request, wait for the response header within
//! `proxy_read_timeout`, and classify what went wrong in nginx's terms.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use vigil_core::peer::Peer;
use vigil_core::{FailureClass, TransportFailure};

use crate::nginx::route::Route;
use crate::upstream::connect::{connect, ConnectError, TlsSettings};
use crate::upstream::pool::{Conn, Link};
use crate::upstream::{self, HeadOut, Phase, RespBody, Written, H1};
use crate::wire::payload::UpBody;
use crate::wire::raw_head::RawFields;

/// A response header arrived.
pub(crate) struct Answered {
    pub(crate) response: http::Response<RespBody>,
    /// The connection (for a plain one, lent to the response body, which
    /// gives it back when it ended cleanly).
    pub(crate) conn: Conn,
    pub(crate) connect_time: f64,
    /// The response's fields as they came (vigil's own reader, on a route
    /// that passes fields so: see [`crate::wire::raw_head`]).
    pub(crate) raw: Option<Box<RawFields>>,
}

/// The attempt failed before a response header.
#[derive(Debug)]
pub(crate) struct Failed {
    pub(crate) failure: TransportFailure,
    pub(crate) detail: String,
    pub(crate) connect_time: Option<f64>,
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
/// The peer (plain, TLS or unix) is spoken to by [`crate::upstream::H1`]
/// in this task. What it awaits is boxed (the
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
    F: FnOnce(HeadOut<'_>) -> (Written, UpBody),
{
    async move {
        let start = vigil_net::clock::coarse_tick();
        let settings = &route.location.proxy;
        let (mut conn, cached) = match route.pool.checkout(peer.id()) {
            Some(c) => (c, true),
            None => {
                let addr = peer.config().peer_addr();
                let tls = tls.map(|t| (t, route.proxy_host.as_str()));
                let link = Box::pin(connect(&addr, settings.connect_timeout, tls))
                    .await
                    .map(|io| Link::H1(H1::new(io)));
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
        let connect_time = secs(vigil_net::clock::coarse_tick().since(start));
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
        let Link::H1(mut h1) = std::mem::replace(&mut conn.link, Link::Lent) else {
            return Err(Failed {
                failure: TransportFailure {
                    class: FailureClass::Error,
                    request_sent: false,
                    cached_connection: cached,
                },
                detail: format!("connection to {} is in use", peer.name()),
                connect_time: Some(connect_time),
            });
        };
        let (written, body) = make_request(h1.head_out());
        conn.requests += 1;
        let asked_upgrade = written.upgrade;
        let t = upstream::UpstreamTimers {
            send: settings.send_timeout,
            read: settings.read_timeout,
        };
        let sent = crate::wire::spare::boxed(|| {
            h1.send(
                written,
                body,
                t,
                route.headers.hidden(),
                route.passes_fields_as_they_came(),
            )
        })
        .await;
        let (response, raw) = match sent {
            Ok(r) => (r.response, r.raw),
            Err(upstream::Error::Timeout(phase)) => return Err(timed_out(phase)),
            Err(e) => return Err(classify(e, cached, replayable, peer, connect_time)),
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

/// The client's error in nginx's classes: a malformed header is
/// `invalid_header`, a timeout `timeout`, anything else `error`; a request
/// on a kept-alive connection none of which left may go again.
fn classify(
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

pub(crate) fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

fn fmt_duration(d: Duration) -> String {
    vigil_core::config::value::format_time(d)
}
