//! One attempt against one peer: take a kept-alive connection or open one,
//! send the request, wait for the response header within
//! `proxy_read_timeout`, and classify what went wrong in nginx's terms.

use std::time::{Duration, Instant};

use hyper::body::Incoming;
use hyper::{Request, Response};
use vigil_core::peer::Peer;
use vigil_core::{FailureClass, TransportFailure};

use crate::body::UpBody;
use crate::connect::{connect, ConnectError, TlsSettings};
use crate::pool::Conn;
use crate::route::Route;

/// A response header arrived.
pub(crate) struct Answered {
    pub(crate) response: Response<Incoming>,
    pub(crate) conn: Conn,
    pub(crate) connect_time: f64,
}

/// The attempt failed before a response header.
#[derive(Debug)]
pub(crate) struct Failed {
    pub(crate) failure: TransportFailure,
    pub(crate) detail: String,
    pub(crate) connect_time: Option<f64>,
}

/// Run one attempt. `make_request` is called only once a connection is
/// ready, so a refused connect leaves a streamed body unread for the next peer.
pub(crate) async fn run(
    route: &Route,
    peer: &Peer,
    tls: Option<&TlsSettings>,
    make_request: impl FnOnce() -> Result<Request<UpBody>, String>,
) -> Result<Answered, Failed> {
    let start = Instant::now();
    let settings = &route.location.proxy;
    let (mut conn, cached) = match route.pool.checkout(peer.id()) {
        Some(c) => (c, true),
        None => {
            let addr = peer.config().addr;
            let sni = tls.map(|t| (t, route.proxy_host.as_str()));
            match connect(addr, settings.connect_timeout, sni).await {
                Ok(sender) => (
                    Conn {
                        peer: peer.id(),
                        sender,
                        idle_since: Instant::now(),
                        requests: 0,
                    },
                    false,
                ),
                Err(e) => return Err(connect_failed(e)),
            }
        }
    };
    let connect_time = secs(start.elapsed());
    if let Err(e) = conn.sender.ready().await {
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
    let request = make_request().map_err(|detail| Failed {
        failure: TransportFailure {
            class: FailureClass::Error,
            request_sent: false,
            cached_connection: false,
        },
        detail,
        connect_time: Some(connect_time),
    })?;
    conn.requests += 1;
    let sent = conn.sender.send_request(request);
    match tokio::time::timeout(settings.read_timeout, sent).await {
        Ok(Ok(response)) => Ok(Answered {
            response,
            conn,
            connect_time,
        }),
        Ok(Err(e)) => Err(classify(e, cached, peer, connect_time)),
        Err(_) => Err(Failed {
            failure: TransportFailure {
                class: FailureClass::Timeout,
                request_sent: true,
                cached_connection: cached,
            },
            detail: format!(
                "upstream {} timed out ({}) while reading response header",
                peer.name(),
                fmt_duration(settings.read_timeout)
            ),
            connect_time: Some(connect_time),
        }),
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
fn classify(e: hyper::Error, cached: bool, peer: &Peer, connect_time: f64) -> Failed {
    let class = if e.is_parse() || e.is_parse_status() || e.is_parse_too_large() {
        FailureClass::InvalidHeader
    } else if is_timeout(&e) {
        FailureClass::Timeout
    } else {
        FailureClass::Error
    };
    // A request on a kept-alive connection that hyper cancelled never left.
    let request_sent = !(cached && e.is_canceled());
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
