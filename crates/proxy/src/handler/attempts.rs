//! The attempts of one request: pick a peer by core's rules, run the
//! attempt, and race it against the hedge timer and the client's going
//! away; on each end, core judges it through the [`Ledger`], and the
//! request moves on or settles. What it settles to — an upstream's
//! response to pass through, or an answer vigil makes itself — goes to
//! [`super::respond`].

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::Poll;

use http::request::Parts;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::BodyExt;
use smallvec::SmallVec;
use tokio::time::Instant;
use vigil_core::peer::Peer;
use vigil_core::upstream::PeerGuard;
use vigil_core::{FailureVerdict, StatusVerdict};
use vigil_net::clock::{coarse_tick, Tick};

use super::ledger::Ledger;
use super::{outgoing, Cx, ReqBody};
use crate::handler::body::{self, ClientFault, Fault, UpBody};
use crate::nginx::status_page::error_page;
use crate::upstream::attempt::{self, Answered, Failed};

/// What every attempt of one request sends.
pub(super) struct Job<'a> {
    pub(super) cx: Cx<'a>,
    pub(super) parts: &'a Parts,
    /// The upstream request's target.
    pub(super) uri: &'a str,
    pub(super) body: &'a ReqBody,
    /// The request asks the upstream to switch protocols.
    pub(super) upgrade: bool,
    pub(super) replayable: bool,
    /// The upstream has `hedge`: attempts may race.
    pub(super) hedged: bool,
    /// For a request that cannot be sent twice at once (any method but GET,
    /// HEAD, OPTIONS and TRACE, or a body: core's `RequestFacts::sends_twice`)
    /// that may be hedged: taken by the first of its attempts to connect.
    pub(super) once: Option<Arc<AtomicBool>>,
}

/// What the attempts came to.
pub(super) enum Settled {
    /// A response header core lets through, from the attempt on `peer`.
    Upstream {
        guard: PeerGuard,
        answered: Box<Answered>,
    },
    /// vigil's own answer (502, 504, 499, the client's 400 ...), with the
    /// attempts in the log.
    Answer(Response<UpBody>),
    /// vigil's own answer, logged without the attempts (408: the client's
    /// body timed out, as before any attempt).
    Unattempted(Response<UpBody>),
    /// An answer that is neither decorated nor logged (vigil could not
    /// start an attempt: 500).
    Bare(Response<UpBody>),
}

/// The attempts in flight (inline while one: more only while hedges race).
type Flights<'a> = SmallVec<[Flight<'a>; 1]>;

/// One attempt in flight: its peer, when it started, its place in the
/// `$upstream_*` list, and the future that runs it.
struct Flight<'a> {
    guard: PeerGuard,
    /// The guard's peer, borrowed from the route's upstream.
    peer: &'a Peer,
    t0: Tick,
    record: usize,
    /// Watched while hedges may race (None without `hedge`).
    race: Option<Arc<attempt::Race>>,
    run: Pin<Box<dyn Future<Output = Result<Box<Answered>, Failed>> + Send + 'a>>,
}

/// What [`race`] saw first. Lives only between the race and its match,
/// so the size of the result (the response head) is not worth a box.
#[allow(clippy::large_enum_variant)]
enum Raced {
    /// Attempt `i` ended.
    Done(usize, Result<Box<Answered>, Failed>),
    /// The hedge timer fired.
    Hedge,
    /// The client closed its connection.
    ClientGone,
}

/// Run the request's attempts until one's header passes through or core
/// says stop. `fault`: how a streamed body failed on the client's side,
/// if it did (the attempt's failure is then the client's).
#[allow(
    clippy::manual_async_fn,
    reason = "an async fn would hold its arguments twice"
)]
pub(super) fn run<'a, 'l, 'r, 'o>(
    job: &'a Job<'a>,
    ledger: &'l mut Ledger<'r, 'o>,
    fault: Option<&'a ClientFault>,
) -> impl Future<Output = Settled> + use<'a, 'l, 'r, 'o> {
    async move {
        let cx = &job.cx;
        // The attempts in flight: one, or more while hedges race.
        let mut flights: Flights<'a> = SmallVec::new();
        // The client's close ends them (nginx's broken-connection check),
        // unless proxy_ignore_client_abort is on.
        let watched = (!cx.settings().ignore_client_abort).then_some(cx.conn);
        let mut hedging = job.hedged;
        loop {
            if flights.is_empty() {
                let Some(guard) = ledger.pick() else {
                    return Settled::Answer(error_page(StatusCode::BAD_GATEWAY));
                };
                match job.launch(guard, ledger).await {
                    Ok(f) => flights.push(f),
                    Err(page) => return Settled::Bare(page),
                }
            }
            let hedge_at = if hedging {
                hedge_due(&flights, ledger)
            } else {
                None
            };
            let (flight, result) = match race(&mut flights, hedge_at, watched).await {
                Raced::ClientGone => {
                    // As nginx's 499: the attempts end, their connections
                    // closed and their peers freed as nginx frees them
                    // (state 0: nothing charged); nothing is retried and
                    // nothing is sent.
                    tracing::info!(client = %cx.client, upstream = %cx.route.upstream.name(), "client closed the connection while waiting for the upstream's answer");
                    for f in flights.drain(..) {
                        ledger.cut_short(f.record, f.t0, None);
                    }
                    let gone = StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST);
                    return Settled::Answer(crate::conn::close_silently(gone));
                }
                Raced::Hedge => {
                    match ledger.hedge(connecting(&flights)) {
                        Some(guard) => match job.launch(guard, ledger).await {
                            Ok(f) => flights.push(f),
                            Err(page) => return Settled::Bare(page),
                        },
                        // Keep waiting on the attempts in flight.
                        None => hedging = false,
                    }
                    continue;
                }
                Raced::Done(i, _)
                    if flights[i]
                        .race
                        .as_ref()
                        .is_some_and(|r| r.lost.load(Ordering::Acquire)) =>
                {
                    // Lost a connect race: the request goes out on the other
                    // connection; this one sent nothing and is not charged.
                    let f = flights.swap_remove(i);
                    ledger.withdraw(f.guard, f.record, f.t0);
                    continue;
                }
                Raced::Done(i, result) => (flights.swap_remove(i), result),
            };
            let Flight {
                guard,
                peer,
                t0,
                record,
                race: ran,
                ..
            } = flight;
            match result {
                Ok(answered) => {
                    let status = answered.response.status().as_u16();
                    let connect_time = answered.connect_time;
                    match ledger.answered(guard, peer, record, t0, status, connect_time) {
                        StatusVerdict::Retry(_) => {
                            job.release_send(ran.as_deref());
                            continue;
                        }
                        StatusVerdict::PassThrough(guard, _) => {
                            // The first header through wins: the others are
                            // cancelled, their connections closed.
                            cancel(&mut flights, ledger);
                            return Settled::Upstream { guard, answered };
                        }
                    }
                }
                Err(failed) => {
                    if let Some(fault) = fault.and_then(ClientFault::get) {
                        // The client's doing, while its body was streamed: no
                        // evidence against the peer, which is freed as nginx
                        // frees it (state 0: the guard dropped), and nothing
                        // is retried.
                        tracing::info!(client = %cx.client, upstream = %cx.route.upstream.name(), peer = %peer.name(), ?fault, "{}", failed.detail);
                        ledger.cut_short(record, t0, failed.connect_time);
                        drop(guard);
                        cancel(&mut flights, ledger);
                        return client_failed(fault);
                    }
                    match ledger.failed(guard, peer, record, t0, failed) {
                        FailureVerdict::Retry(_) => {
                            job.release_send(ran.as_deref());
                            continue;
                        }
                        FailureVerdict::Fail { status, .. } => {
                            cancel(&mut flights, ledger);
                            let code =
                                StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
                            return Settled::Answer(error_page(code));
                        }
                    }
                }
            }
        }
    }
}

/// nginx's answer to a client whose streamed body failed
/// (`ngx_http_read_unbuffered_request_body`'s status).
fn client_failed(fault: Fault) -> Settled {
    match fault {
        // nginx closes without a response and logs 408.
        Fault::Timeout => {
            Settled::Unattempted(crate::conn::close_silently(StatusCode::REQUEST_TIMEOUT))
        }
        Fault::Bad => {
            let mut r = error_page(StatusCode::BAD_REQUEST);
            r.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            Settled::Answer(r)
        }
        Fault::Closed => Settled::Answer(crate::conn::close_silently(StatusCode::BAD_REQUEST)),
    }
}

/// Every attempt in flight is still connecting: even a request that cannot
/// be sent twice may race a connect (it is sent once, by the first).
fn connecting(flights: &[Flight<'_>]) -> bool {
    flights.iter().all(|f| {
        f.race
            .as_ref()
            .is_none_or(|r| !r.connected.load(Ordering::Acquire))
    })
}

/// When the next hedge is due: `after` core's delay from the latest
/// attempt's start (None: no hedge).
fn hedge_due(flights: &[Flight<'_>], ledger: &Ledger<'_, '_>) -> Option<Instant> {
    flights
        .iter()
        .map(|f| f.t0)
        .max()
        .zip(ledger.hedge_after(connecting(flights)))
        .map(|(t0, after)| {
            // Due `after` the latest start: from one reading of the clock,
            // what is left of it (none: at once).
            let now = vigil_net::clock::coarse_now();
            now + after.saturating_sub(Tick::of(now).since(t0))
        })
}

// === impl Job ===

impl<'a> Job<'a> {
    /// Start an attempt on `guard`'s peer; its record goes in the ledger
    /// now, so the list keeps the order attempts started in (nginx's).
    async fn launch(
        &self,
        guard: PeerGuard,
        ledger: &mut Ledger<'_, '_>,
    ) -> Result<Flight<'a>, Response<UpBody>> {
        let route = self.cx.route;
        // The route's own record of the peer (the guard is of the route's
        // upstream), borrowed for the attempt: a clone of its `Arc` per
        // request was a write to the peer's cache line from every worker.
        let Some(peer) = route
            .upstream
            .peers()
            .get(guard.peer().id().0 as usize)
            .filter(|p| Arc::ptr_eq(p, guard.peer()))
        else {
            tracing::error!(peer = %guard.peer().name(), "picked peer is not the route's");
            return Err(error_page(StatusCode::INTERNAL_SERVER_ERROR));
        };
        let peer: &'a Peer = peer;
        let replay = match self.body {
            ReqBody::Buffered(b) => match b.replay().await {
                Ok(bd) => Some(bd),
                Err(e) => {
                    tracing::error!(error = %e, "cannot replay spooled body");
                    return Err(error_page(StatusCode::INTERNAL_SERVER_ERROR));
                }
            },
            ReqBody::Stream(_) => None,
        };
        let record = ledger.opened(peer);
        let (cx, parts, uri, body, upgrade) =
            (self.cx, self.parts, self.uri, self.body, self.upgrade);
        let len = outgoing::body_len(body);
        let race = self.hedged.then(|| Arc::new(attempt::Race::default()));
        // The attempt's own future, boxed as it is (no block around it to
        // hold what it is given a second time).
        let run = crate::wire::spare::boxed(|| {
            attempt::run(
                route,
                peer,
                route.tls.as_ref(),
                self.replayable,
                race.clone(),
                self.once.clone(),
                move |room| {
                    let b = match replay {
                        Some(b) => b,
                        None => match body {
                            ReqBody::Stream(s) => s
                                .lock()
                                .ok()
                                .and_then(|mut s| s.take())
                                .map_or_else(body::empty, |i| i.boxed()),
                            ReqBody::Buffered(_) => body::empty(),
                        },
                    };
                    outgoing::build_request(&cx, parts, uri, b, len, upgrade, room)
                },
            )
        });
        Ok(Flight {
            guard,
            peer,
            t0: coarse_tick(),
            record,
            race,
            run,
        })
    }

    /// Core let the request move on after the attempt that had its one
    /// send (`ran`): the next attempt may send it (nginx's `non_idempotent`).
    fn release_send(&self, ran: Option<&attempt::Race>) {
        if let Some(o) = &self.once {
            if ran.is_some_and(|r| r.claimed.load(Ordering::Acquire)) {
                o.store(false, Ordering::Release);
            }
        }
    }
}

/// Wait for the first attempt to end, for the hedge timer, or for the
/// client of `watched` to go away.
async fn race(
    flights: &mut [Flight<'_>],
    hedge_at: Option<Instant>,
    watched: Option<&crate::conn::ConnState>,
) -> Raced {
    let mut timer = std::pin::pin!(hedge_at.map(crate::conn::timer::sleep_until));
    std::future::poll_fn(|cx| {
        // (Set by the connection's loop, which polls this request again
        // at once: crate::wire::h1's watch.)
        if watched.is_some_and(crate::conn::ConnState::client_gone) {
            return Poll::Ready(Raced::ClientGone);
        }
        for (i, f) in flights.iter_mut().enumerate() {
            if let Poll::Ready(r) = f.run.as_mut().poll(cx) {
                return Poll::Ready(Raced::Done(i, r));
            }
        }
        let fired = timer
            .as_mut()
            .as_pin_mut()
            .is_some_and(|t| t.poll(cx).is_ready());
        if fired {
            Poll::Ready(Raced::Hedge)
        } else {
            Poll::Pending
        }
    })
    .await
}

/// The attempts that lost: released uncharged (core), their connections
/// closed (the futures dropped with their connections), shown with no
/// status and the time they ran (as nginx shows an attempt cut short).
fn cancel(flights: &mut Flights<'_>, ledger: &mut Ledger<'_, '_>) {
    for f in flights.drain(..) {
        tracing::debug!(peer = %f.peer.name(), "hedged attempt cancelled");
        ledger.cut_short(f.record, f.t0, None);
        f.guard.cancel();
        drop(f.run);
    }
}
