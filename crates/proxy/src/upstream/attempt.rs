//! One attempt against one peer: take a kept-alive connection or open one,
//! send the request, wait for the response header within
//! `proxy_read_timeout`, and classify what went wrong in nginx's terms.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use vigil_core::peer::Peer;
use vigil_core::{FailureClass, TransportFailure};
use vigil_net::clock::Tick;

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
        let (mut conn, cached) = connection(route, peer, tls, start).await?;
        let connect_time = secs(vigil_net::clock::coarse_tick().since(start));
        let failed = |class, request_sent, detail| Failed {
            failure: TransportFailure {
                class,
                request_sent,
                cached_connection: cached,
            },
            detail,
            connect_time: Some(connect_time),
        };
        if !claim(race.as_deref(), once.as_deref()) {
            route.pool.checkin(conn);
            return Err(failed(
                FailureClass::Error,
                false,
                format!(
                    "connected to {} after another attempt had the request",
                    peer.name()
                ),
            ));
        }
        let Link::H1(mut h1) = std::mem::replace(&mut conn.link, Link::Lent) else {
            let detail = format!("connection to {} is in use", peer.name());
            return Err(failed(FailureClass::Error, false, detail));
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
            Err(upstream::Error::Timeout(phase)) => {
                let (what, limit) = match phase {
                    Phase::Sending => ("sending the request", settings.send_timeout),
                    Phase::Waiting => ("reading response header", settings.read_timeout),
                };
                let detail = format!(
                    "upstream {} timed out ({}) while {what}",
                    peer.name(),
                    fmt_duration(limit)
                );
                return Err(failed(FailureClass::Timeout, true, detail));
            }
            Err(e) => return Err(classify(e, cached, replayable, peer, connect_time)),
        };
        // A switch the request did not ask for: the response is not HTTP
        // any more, and nothing can be relayed (nginx would relay bytes
        // raw if its client had sent Upgrade, even unasked upstream).
        if response.status() == http::StatusCode::SWITCHING_PROTOCOLS && !asked_upgrade {
            let detail = format!(
                "upstream {} sent 101 Switching Protocols to a request that did not ask to upgrade",
                peer.name()
            );
            return Err(failed(FailureClass::InvalidHeader, true, detail));
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

/// A kept-alive connection to `peer` from the pool, else a new one (the
/// connect boxed: see [`run`]); whether it was kept.
async fn connection(
    route: &Route,
    peer: &Peer,
    tls: Option<&TlsSettings>,
    start: Tick,
) -> Result<(Conn, bool), Failed> {
    if let Some(c) = route.pool.checkout(peer.id()) {
        return Ok((c, true));
    }
    let addr = peer.config().peer_addr();
    let tls = tls.map(|t| (t, route.proxy_host.as_str()));
    let io = Box::pin(connect(&addr, route.location.proxy.connect_timeout, tls))
        .await
        .map_err(connect_failed)?;
    let conn = Conn {
        peer: peer.id(),
        link: Link::H1(H1::new(io)),
        idle_since: start,
        requests: 0,
    };
    Ok((conn, false))
}

/// Whether an attempt whose connection is ready may send: always without
/// a race; in one, tell the handler it connected, and for a request that
/// goes once (`once`, shared by its attempts) only the first to connect
/// may (a later one is marked `lost`).
fn claim(race: Option<&Race>, once: Option<&AtomicBool>) -> bool {
    let Some(race) = race else {
        return true;
    };
    race.connected.store(true, Ordering::Release);
    if let Some(once) = once {
        if once.swap(true, Ordering::AcqRel) {
            race.lost.store(true, Ordering::Release);
            return false;
        }
        race.claimed.store(true, Ordering::Release);
    }
    true
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
