//! One client request: route it, buffer its body, walk the upstream's
//! peers with core's rules, and answer as nginx would (the upstream's
//! response, 502 for errors and "no live upstreams", 504 for timeouts).

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use tokio::time::Instant;
use vigil_core::clock::{coarse_tick, Tick};

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::request::Parts;
use http::StatusCode;
use http_body_util::BodyExt;
use hyper::{Request, Response};
use smallvec::SmallVec;
use vigil_core::peer::Peer;
use vigil_core::upstream::PeerGuard;
use vigil_core::{FailureVerdict, RequestFacts, SelectKey, StatusVerdict};

use crate::attempt::{self, Answered, Failed, Outgoing, Room};
use crate::body::{self, BodyError, Buffered, ClientBody, RequestBody, Streamed, UpBody};
use crate::hop::strip_hop_by_hop;
use crate::metrics::Outcome;
use crate::raw_head::RawFields;
use crate::record::{AttemptRecord, EarlierAttempts};
use crate::route::{Answer, Refusal, Reply, Route};
use crate::router::Target;
use crate::server::Proxy;
use crate::status_page::error_page;
use crate::telemetry::request::RequestObserver;
use crate::vars::VarContext;

mod pages;
mod upstream_head;

use pages::{error_paged, not_routed, paged_status, Page};
use upstream_head::Fields;

enum ReqBody {
    Buffered(Buffered),
    /// Taken by the attempt that first has a connection ready.
    Stream(std::sync::Mutex<Option<ClientBody>>),
}

/// The client's request body across one request's passes (the first, and
/// the internal redirect of an `error_page` that proxies): not read yet,
/// or read by a pass (nginx's `r->request_body`, which a page's upstream
/// request sends again).
enum ClientRequestBody {
    /// Not read yet.
    Unread(RequestBody),
    /// Read (or being streamed) by an earlier pass.
    Read(ReqBody),
}

/// The request's metrics (its upstream's counters in `generation`) and
/// trace, for `route`.
fn observer<'p>(
    proxy: &'p Proxy,
    generation: &crate::server::Generation,
    route: &Route,
    parts: &Parts,
    start: Tick,
) -> RequestObserver<'p> {
    let stats = generation
        .stats()
        .and_then(|g| g.upstream_at(route.upstream_index, route.upstream.name()))
        .cloned();
    RequestObserver::new(
        start,
        stats,
        proxy.tracer(),
        &parts.method,
        &route.location.path,
        route.upstream.name(),
    )
}

/// Serve one request that came on the connection of `conn` (whose timers
/// take the location's once it is routed). An `async` block rather than an
/// `async fn`, whose future would hold its arguments twice
/// (rust-lang/rust#62958); the request comes as its parts and body, which
/// the block uses where they were captured (a `Request` taken apart would
/// stay in the future beside its parts); what only some requests need (an
/// error page, a refusal's page) is boxed out of it.
#[allow(
    clippy::manual_async_fn,
    reason = "an async fn would hold its arguments twice"
)]
pub(crate) fn handle<'a>(
    proxy: &'a Arc<Proxy>,
    local: SocketAddr,
    client: SocketAddr,
    (mut parts, body): (Parts, RequestBody),
    conn: &'a Arc<crate::conn::ConnState>,
) -> impl Future<Output = Handled> + Send + 'a {
    async move {
        let start = coarse_tick();
        // Only where a template or log line may read it ($request_id).
        if let Some(id) = crate::vars::RequestId::draw() {
            parts.extensions.insert(id);
        }
        let generation = proxy.current();
        // Routing leaves $uri, $host and $server_name in `target`, the
        // rewrite phases' captures and a proxy_pass URI with variables in the
        // request's extensions.
        let mut target = None;
        let routed = generation
            .routes
            .route_parts(local, client, &mut parts, &mut target);
        // error_page: the request as routed (a page redirects it); boxed,
        // to keep it out of the size of every request's future.
        let saved = match (&routed, &target) {
            (Ok(Answer::Proxy(r)), Some(t)) if !r.error_pages.is_empty() => {
                Some(Box::new((parts.clone(), t.clone())))
            }
            _ => None,
        };
        let mut body = ClientRequestBody::Unread(body);
        let route = match routed {
            Ok(answer) => match answer {
                Answer::Proxy(route) => route,
                Answer::Return(reply) => {
                    drop(generation);
                    return returned(&reply, &parts, target.as_ref(), local, client, start).into();
                }
            },
            Err(refusal) => {
                let mut raw = None;
                let down = Downstream {
                    local,
                    client,
                    conn,
                };
                let response = Box::pin(not_routed(
                    proxy,
                    &generation,
                    refusal,
                    (parts, target),
                    body,
                    down,
                    start,
                    &mut raw,
                ))
                .await;
                return Handled { response, raw };
            }
        };
        crate::conn::on_route(conn, &route.location.proxy);
        let mut obs = observer(proxy, &generation, &route, &parts, start);
        // error_page redirects with the routes of this generation.
        let pages = saved.map(|p| (generation.clone(), p));
        drop(generation);
        let net = Downstream {
            local,
            client,
            conn,
        };
        let Handled {
            response: resp,
            mut raw,
        } = proxy_request(
            proxy,
            &route,
            net,
            &mut parts,
            target.as_ref(),
            &mut body,
            start,
            &mut obs,
        )
        .await;
        // Done with (logged): the map's and the extensions' room is a later
        // message's.
        crate::spare::keep(std::mem::take(&mut parts.headers));
        crate::spare::keep_extensions(std::mem::take(&mut parts.extensions));
        drop(parts);
        let resp = match pages {
            Some((g, saved)) => {
                let (parts, target) = *saved;
                let page = Page {
                    generation: &g,
                    pages: &route.error_pages,
                    parts,
                    target,
                };
                Box::pin(error_paged(
                    proxy, page, &mut body, net, start, resp, &mut raw,
                ))
                .await
            }
            None => resp,
        };
        obs.finish(resp.status().as_u16());
        Handled {
            response: resp,
            raw,
        }
    }
}

/// Where a request came from (nginx's downstream): the connection's local
/// and client addresses, and its state, which says when an HTTP/1 client
/// went away while its request waited ([`crate::conn::ConnState::client_gone`]).
#[derive(Clone, Copy)]
pub(crate) struct Downstream<'c> {
    pub(crate) local: SocketAddr,
    pub(crate) client: SocketAddr,
    pub(crate) conn: &'c crate::conn::ConnState,
}

/// A request's response, with its fields as they came where the route
/// passes them so (see [`crate::raw_head`]).
pub(crate) struct Handled {
    pub(crate) response: Response<UpBody>,
    /// For vigil's own HTTP/1 writer (None for any other client).
    pub(crate) raw: Option<Box<RawFields>>,
}

impl From<Response<UpBody>> for Handled {
    fn from(response: Response<UpBody>) -> Self {
        Self {
            response,
            raw: None,
        }
    }
}

/// A request routing answered itself, as nginx answers it (400s and 421
/// close the connection, as nginx does after a 400). No location is
/// nginx's static handler: 405 for a method other than GET, HEAD and
/// POST, else 404.
fn refused(refusal: Refusal, parts: &Parts) -> Response<UpBody> {
    let headers = &parts.headers;
    let close = |mut r: Response<UpBody>| {
        r.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        r
    };
    match refusal {
        Refusal::BadRequest(why) => {
            tracing::debug!(reason = why, "client sent invalid request");
            close(error_page(StatusCode::BAD_REQUEST))
        }
        Refusal::NotFound
            if !matches!(
                parts.method,
                http::Method::GET | http::Method::HEAD | http::Method::POST
            ) =>
        {
            error_page(StatusCode::METHOD_NOT_ALLOWED)
        }
        Refusal::NotFound => error_page(StatusCode::NOT_FOUND),
        Refusal::Redirect { max_body, .. }
            if max_body != 0 && content_length(headers).is_some_and(|n| n > max_body) =>
        {
            error_page(StatusCode::PAYLOAD_TOO_LARGE)
        }
        Refusal::Redirect { location, .. } => {
            let mut r = error_page(StatusCode::MOVED_PERMANENTLY);
            if let Ok(v) = HeaderValue::from_str(&location) {
                r.headers_mut().insert(header::LOCATION, v);
            }
            r
        }
        Refusal::UnknownListener => close(error_page(StatusCode::MISDIRECTED_REQUEST)),
        Refusal::RegexFailed => error_page(StatusCode::INTERNAL_SERVER_ERROR),
        Refusal::ServerNameFailed => crate::conn::close_silently(StatusCode::INTERNAL_SERVER_ERROR),
    }
}

/// A head the request check refused (crate::request_check): nginx's page
/// for its status, logged to the default server's access log with its
/// request line (and no header: nginx may have read some).
pub(crate) fn refused_head(
    proxy: &Proxy,
    local: SocketAddr,
    client: SocketAddr,
    refused: crate::request_check::gate::Refused,
) -> Response<UpBody> {
    let resp = crate::request_check::gate::refused(refused.status);
    let Some(parts) = refused.line.as_deref().and_then(request_line_parts) else {
        return resp;
    };
    let generation = proxy.current();
    let routes = &generation.routes;
    let server = routes.default_server(local);
    pages::server_logged(
        routes,
        server,
        &parts,
        None,
        (local, client),
        Tick::now(),
        resp,
    )
}

/// `GET /x HTTP/1.1` as a request's parts (for `$request` and the
/// request variables of a log line); None when it is not one.
fn request_line_parts(line: &[u8]) -> Option<Parts> {
    let line = std::str::from_utf8(line).ok()?;
    let mut words = line.split(' ').filter(|w| !w.is_empty());
    let (method, target, version) = (words.next()?, words.next()?, words.next());
    let version = match version {
        Some("HTTP/1.0") => http::Version::HTTP_10,
        Some("HTTP/1.1") => http::Version::HTTP_11,
        _ => return None,
    };
    let req = Request::builder()
        .method(method)
        .uri(target)
        .version(version)
        .body(())
        .ok()?;
    Some(req.into_parts().0)
}

/// A `return`'s answer, as `ngx_http_rewrite_return` and
/// `ngx_http_send_response` make it: 444 closes the connection; a
/// redirecting code sends its URL as `Location` (made absolute when it
/// starts with `/`) with the code's page; other codes send their text
/// (`text/plain`), or with no text the code's page from 400 up and an
/// empty body below.
fn returned(
    reply: &Reply,
    parts: &Parts,
    target: Option<&Target>,
    local: SocketAddr,
    client: SocketAddr,
    start: Tick,
) -> Response<UpBody> {
    // An error_page's return: the first pass's attempts.
    let attempts = earlier_attempts(parts);
    let cx = |status: u16| VarContext {
        parts,
        target,
        client,
        local,
        proxy_host: "",
        attempts,
        status,
        request_time: coarse_tick().since(start).as_secs_f64(),
    };
    let too_large =
        reply.max_body != 0 && content_length(&parts.headers).is_some_and(|n| n > reply.max_body);
    let code = StatusCode::from_u16(reply.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let text = reply.text.as_ref().map(|t| t.expand(&cx(reply.code)));
    let resp = if too_large {
        error_page(StatusCode::PAYLOAD_TOO_LARGE)
    } else if reply.code == 444 {
        crate::conn::close_silently(code)
    } else if vigil_core::config::Return::redirects(reply.code) {
        let mut r = error_page(code);
        let mut url = text.unwrap_or_default();
        if url.starts_with(b"/") {
            if let Some(t) = target {
                let mut abs = crate::router::absolute_prefix(t, local).into_bytes();
                abs.extend_from_slice(&url);
                url = abs;
            }
        }
        if let Some(v) = crate::vars::field_value(url) {
            r.headers_mut().insert(header::LOCATION, v);
        }
        r
    } else if text.is_some() || reply.code < 400 {
        let mut r = Response::new(body::full(text.unwrap_or_default()));
        *r.status_mut() = code;
        if reply.code != 204 {
            r.headers_mut()
                .insert(header::CONTENT_TYPE, reply.content_type.clone());
        }
        r
    } else {
        error_page(code)
    };
    let mut resp = resp;
    paged_status(parts, &mut resp);
    decorate(
        &reply.add_headers,
        None,
        reply.access_log.as_deref(),
        &cx(resp.status().as_u16()),
        parts,
        resp,
    )
}

/// The request, routed: walk the upstream's peers until one answers or
/// core's rules say stop. An `async` block holding `parts` once (see
/// [`handle`]); reading a body to buffer it is boxed out of it.
#[allow(
    clippy::manual_async_fn,
    reason = "an async fn would hold its arguments twice"
)]
#[allow(clippy::too_many_arguments)]
fn proxy_request<'a, 'o>(
    proxy: &'a Proxy,
    route: &'a Route,
    down: Downstream<'a>,
    parts: &'a mut Parts,
    target: Option<&'a Target>,
    client_body: &'a mut ClientRequestBody,
    start: Tick,
    obs: &'a mut RequestObserver<'o>,
) -> impl Future<Output = Handled> + use<'a, 'o> {
    async move {
        let (local, client) = (down.local, down.client);
        // nginx tunnels when the client sent Upgrade and the upstream answered
        // 101 (`u->upgrade`); vigil asks the upstream to switch only where the
        // location passes Upgrade on (see `passes_upgrade`).
        let mut asked = Asked::of(&parts.headers);
        // vigil's own HTTP/1 loop writes a response's fields as they came
        // (crate::raw_head); hyper's needs them in the map.
        let own_writer = matches!(client_body, ClientRequestBody::Unread(RequestBody::H1(_)));
        let upgrade =
            parts.version == http::Version::HTTP_11 && asked.upgrade && passes_upgrade(route);
        let on_upgrade = if upgrade {
            let taken = std::mem::replace(parts, Request::new(()).into_parts().0);
            let mut req = Request::from_parts(taken, ());
            let on = crate::client_io::on_upgrade(&mut req);
            *parts = req.into_parts().0;
            Some(on)
        } else {
            None
        };
        // What the gate did to HTTP/1 heads, here for every request (HTTP/2 too),
        // with the settings of the location's server.
        crate::request_check::drop_invalid_headers(&mut parts.headers, &route.client);
        let settings = &route.location.proxy;
        // The realip module, then the access phase (nginx's order).
        let client = {
            let real = crate::realip::client(
                &settings.server_real_ip,
                &settings.real_ip,
                client,
                &parts.headers,
            );
            if real != client {
                parts.extensions.insert(crate::realip::Original(client));
            }
            real
        };
        // An answer to the client with the location's add_headers and its
        // log line (`parts`: as the request is now).
        let answer = |parts: &Parts, attempts: &[AttemptRecord], resp| {
            Handled::from(finish(
                route, parts, target, client, local, attempts, start, resp,
            ))
        };
        if !crate::access::allows(&settings.access, client.ip()) {
            tracing::debug!(client = %client.ip(), "access forbidden by rule");
            return answer(parts, &[], error_page(StatusCode::FORBIDDEN));
        }
        let max = settings.client_max_body_size;
        let declared = asked.length;
        // 413 before any attempt: by Content-Length, or while reading the body.
        let too_large =
            |parts: &Parts| answer(parts, &[], error_page(StatusCode::PAYLOAD_TOO_LARGE));
        if max != 0 && declared.is_some_and(|n| n > max) {
            return too_large(parts);
        }
        let has_body = declared.is_some_and(|n| n > 0) || asked.transfer_encoding;
        let body_timed_out = |parts: &Parts| {
            answer(
                parts,
                &[],
                crate::conn::close_silently(StatusCode::REQUEST_TIMEOUT),
            )
        };
        // How a streamed body failed on the client's side, if it did.
        let mut client_fault = None;
        let incoming = match client_body {
            ClientRequestBody::Unread(_) => {
                let empty = ClientRequestBody::Read(ReqBody::Buffered(Buffered::Empty));
                match std::mem::replace(client_body, empty) {
                    ClientRequestBody::Unread(i) => Some(i),
                    ClientRequestBody::Read(_) => None,
                }
            }
            ClientRequestBody::Read(_) => None,
        };
        let read = match incoming {
            None => None,
            Some(_) if !has_body => Some(ReqBody::Buffered(Buffered::Empty)),
            Some(incoming) if settings.request_buffering => match Box::pin(body::buffer(
                incoming,
                max,
                proxy.spool_dir(),
                settings.client_body_timeout,
            ))
            .await
            {
                Ok(b) => Some(ReqBody::Buffered(b)),
                Err(BodyError::TooLarge(_)) => return too_large(parts),
                // nginx closes without a response and logs 408.
                Err(BodyError::Timeout(_)) => return body_timed_out(parts),
                Err(BodyError::Client(_)) => {
                    return Handled::from(error_page(StatusCode::BAD_REQUEST))
                }
                Err(BodyError::Spool(e)) => {
                    tracing::error!(error = %e, "cannot spool request body");
                    return Handled::from(error_page(StatusCode::INTERNAL_SERVER_ERROR));
                }
            },
            Some(incoming) => {
                let streamed = ClientBody::new(incoming, settings.client_body_timeout);
                client_fault = Some(streamed.fault());
                Some(ReqBody::Stream(std::sync::Mutex::new(Some(streamed))))
            }
        };
        if let Some(b) = read {
            *client_body = ClientRequestBody::Read(b);
        }
        // Read by this pass or an earlier one (an error_page's redirect).
        let body: &ReqBody = match &*client_body {
            ClientRequestBody::Read(b) => b,
            ClientRequestBody::Unread(_) => {
                return Handled::from(error_page(StatusCode::INTERNAL_SERVER_ERROR))
            }
        };
        let with_body = match body {
            ReqBody::Buffered(b) => b.len() > 0,
            ReqBody::Stream(_) => true,
        };
        let facts = RequestFacts::new(parts.method.as_str(), matches!(body, ReqBody::Buffered(_)))
            .with_body(with_body);
        let upstream = &route.upstream;
        let hash_key = route
            .hash_key
            .as_ref()
            .map(|t| t.expand(&route.vars(parts, target, client, local, 0)));
        let key = match (&hash_key, &upstream.config().balancer) {
            (Some(k), _) => SelectKey::Hash(k),
            (None, vigil_core::config::Balancer::IpHash) => SelectKey::Client(client.ip()),
            _ => SelectKey::None,
        };
        let clock = proxy.clock();
        let mut sel = upstream.begin(key, route.policy, facts, clock.now());
        // An error_page's pass goes on with the first pass's attempts.
        let mut attempts: Attempts = parts
            .extensions
            .remove::<EarlierAttempts>()
            .map(|e| SmallVec::from_vec(e.0))
            .unwrap_or_default();
        let group = attempts.len();
        let upstream_uri = route.upstream_uri(parts, target);
        // A URI no request line can carry is vigil's to refuse, before any
        // peer is picked: it is no evidence against one.
        if let Err(why) = sendable(&upstream_uri, route.tls.is_some()) {
            tracing::error!(upstream = %upstream.name(), uri = ?upstream_uri, "cannot send the request upstream: {why}");
            return answer(parts, &[], error_page(StatusCode::INTERNAL_SERVER_ERROR));
        }
        let job = Job {
            route,
            parts,
            target,
            uri: &upstream_uri,
            body,
            len: body_len(body),
            client,
            local,
            upgrade,
            replayable: facts.body_replayable,
            hedged: upstream.config().rules.hedge.is_some(),
            once: (upstream.config().rules.hedge.is_some() && !facts.sends_twice())
                .then(|| Arc::new(std::sync::atomic::AtomicBool::new(false))),
            group,
        };
        // The attempts in flight: one, or more while hedges race.
        let mut flights: Flights<'_> = SmallVec::new();
        // The client's close ends them (nginx's broken-connection check),
        // unless proxy_ignore_client_abort is on.
        let watched = (!settings.ignore_client_abort).then_some(down.conn);
        let mut hedging = job.hedged;
        loop {
            if flights.is_empty() {
                let guard = match upstream.select(&mut sel, clock.now()) {
                    Ok(g) => g,
                    Err(_) => {
                        obs.no_live_upstreams();
                        tracing::error!(upstream = %upstream.name(), "no live upstreams");
                        attempts.push(AttemptRecord {
                            addr: upstream.name().clone(),
                            status: Some(502),
                            response_time: 0.0,
                            connect_time: None,
                            redirected: group > 0 && attempts.len() == group,
                        });
                        return answer(parts, &attempts, error_page(StatusCode::BAD_GATEWAY));
                    }
                };
                match job.launch(guard, &mut attempts).await {
                    Ok(f) => flights.push(f),
                    Err(page) => return Handled::from(page),
                }
            }
            // The next hedge is due after the latest attempt's start. While
            // every attempt is still connecting, even a request that cannot be
            // sent twice may race a connect (it is sent once, by the first).
            let connecting = |flights: &[Flight<'_>]| {
                flights.iter().all(|f| {
                    f.race
                        .as_ref()
                        .is_none_or(|r| !r.connected.load(std::sync::atomic::Ordering::Acquire))
                })
            };
            let hedge_at = if hedging {
                flights
                    .iter()
                    .map(|f| f.t0)
                    .max()
                    .zip(upstream.hedge_after(&sel, clock.now(), connecting(&flights)))
                    .map(|(t0, after)| {
                        // Due `after` the latest start: from one reading of
                        // the clock, what is left of it (none: at once).
                        let now = vigil_core::clock::coarse_now();
                        now + after.saturating_sub(Tick::of(now).since(t0))
                    })
            } else {
                None
            };
            let (flight, result) = match race(&mut flights, hedge_at, watched).await {
                Raced::ClientGone => {
                    // As nginx's 499: the attempts end, their connections
                    // closed and their peers freed as nginx frees them
                    // (state 0: nothing charged); nothing is retried and
                    // nothing is sent.
                    tracing::info!(%client, upstream = %upstream.name(), "client closed the connection while waiting for the upstream's answer");
                    for f in flights.drain(..) {
                        if let Some(r) = attempts.get_mut(f.record) {
                            r.response_time = attempt::secs(coarse_tick().since(f.t0));
                        }
                        drop(f);
                    }
                    let gone = StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST);
                    return answer(parts, &attempts, crate::conn::close_silently(gone));
                }
                Raced::Hedge => {
                    match upstream.hedge(&mut sel, clock.now(), connecting(&flights)) {
                        Ok(guard) => {
                            obs.hedge();
                            tracing::debug!(upstream = %upstream.name(), peer = %guard.peer().name(), "hedge");
                            match job.launch(guard, &mut attempts).await {
                                Ok(f) => flights.push(f),
                                Err(page) => return Handled::from(page),
                            }
                        }
                        Err(denied) => {
                            // Keep waiting on the attempts in flight.
                            obs.denied(denied);
                            hedging = false;
                        }
                    }
                    continue;
                }
                Raced::Done(i, _)
                    if flights[i]
                        .race
                        .as_ref()
                        .is_some_and(|r| r.lost.load(std::sync::atomic::Ordering::Acquire)) =>
                {
                    // Lost a connect race: the request goes out on the other
                    // connection; this one sent nothing and is not charged.
                    let f = flights.swap_remove(i);
                    if let Some(r) = attempts.get_mut(f.record) {
                        r.response_time = attempt::secs(coarse_tick().since(f.t0));
                    }
                    f.guard.withdraw(&mut sel);
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
            // Core let the request move on after the attempt that had its one
            // send: the next attempt may send it (nginx's `non_idempotent`).
            let release_send = || {
                if let Some(o) = &job.once {
                    if ran
                        .as_ref()
                        .is_some_and(|r| r.claimed.load(std::sync::atomic::Ordering::Acquire))
                    {
                        o.store(false, std::sync::atomic::Ordering::Release);
                    }
                }
            };
            match result {
                Ok(answered) => {
                    let status = answered.response.status().as_u16();
                    let took = coarse_tick().since(t0);
                    // The record launch pushed names this peer already: its
                    // address is kept, not cloned again.
                    if let Some(r) = attempts.get_mut(record) {
                        r.status = Some(status);
                        r.response_time = attempt::secs(took);
                        r.connect_time = Some(answered.connect_time);
                    }
                    let outcome = Outcome::of_status(status);
                    obs.attempt(
                        peer,
                        outcome,
                        Some(status),
                        Some(answered.connect_time),
                        took,
                    );
                    match sel.on_status(guard, status, clock.now()) {
                        StatusVerdict::Retry(accounting) => {
                            obs.charged(peer, accounting);
                            obs.retry();
                            release_send();
                            continue;
                        }
                        StatusVerdict::PassThrough(guard, denied) => {
                            if let Some(why) = denied {
                                obs.denied(why);
                            }
                            // The first header through wins: the others are
                            // cancelled, their connections closed.
                            cancel(&mut flights, &mut attempts);
                            // `passive_count last_try` may have charged a passed-through status.
                            obs.charged(peer, guard.accounting());
                            let Answered {
                                response,
                                conn,
                                raw: fields,
                                ..
                            } = *answered;
                            let (mut head, incoming) = response.into_parts();
                            // The fields as they came go beside the response
                            // to vigil's own writer, into the map for another.
                            let raw = match fields {
                                Some(f) if !own_writer => {
                                    f.fill(&mut head.headers);
                                    None
                                }
                                f => f,
                            };
                            // vigil's own reader left the hop-by-hop fields out as it
                            // built the map (upstream::head::parse); hyper's did not.
                            let stripped = matches!(incoming, crate::upstream::RespBody::H1(_));
                            let cx = crate::errlog::Context::new(client, parts, asked.host.take());
                            if head.status == StatusCode::SWITCHING_PROTOCOLS {
                                // attempt::run lets a 101 through only when this
                                // request asked for it, so on_upgrade is there.
                                if let Some(client_up) = on_upgrade {
                                    let upstream_up =
                                        crate::upstream::OnUpgrade::new(&head, incoming);
                                    let timeouts = crate::tunnel::Timeouts {
                                        idle: settings.read_timeout,
                                        upstream_send: settings.send_timeout,
                                        client_send: settings.client_send_timeout,
                                    };
                                    crate::tunnel::spawn(async move {
                                        match (client_up.await, upstream_up.io().await) {
                                            (Ok(a), Ok(b)) => {
                                                crate::tunnel::run(a, b, timeouts, &cx, &guard)
                                                    .await;
                                            }
                                            (a, b) => tracing::warn!(
                                                client = %cx.client,
                                                upstream = %guard.upstream().name(),
                                                client_ok = a.is_ok(),
                                                upstream_ok = b.is_ok(),
                                                "upgrade failed"
                                            ),
                                        }
                                    });
                                    let mut resp = Response::from_parts(head, body::empty());
                                    if !stripped {
                                        strip_hop_by_hop(resp.headers_mut(), true);
                                        // proxy_hide_header's set, as vigil's own reader left it out.
                                        crate::hop::remove_present(
                                            resp.headers_mut(),
                                            route.headers.hidden(),
                                        );
                                    }
                                    resp.headers_mut().insert(
                                        header::CONNECTION,
                                        HeaderValue::from_static("upgrade"),
                                    );
                                    return answer(parts, &attempts, resp);
                                }
                            }
                            let pooled = route.pool.shard().map(|s| (s.clone(), conn));
                            // RFC 9112 §6.3: Transfer-Encoding overrides Content-Length
                            // (nginx clears the length of a chunked response; vigil's own
                            // reader did as it built the map).
                            if !stripped && head.headers.contains_key(header::TRANSFER_ENCODING) {
                                head.headers.remove(header::CONTENT_LENGTH);
                            }
                            let streamed = Streamed::new(
                                incoming,
                                settings.read_timeout,
                                guard,
                                pooled,
                                cx,
                                obs.stats(),
                            );
                            let mut resp = Response::from_parts(head, BodyExt::boxed(streamed));
                            if !stripped {
                                strip_hop_by_hop(resp.headers_mut(), false);
                            }
                            upstream_headers(
                                route, parts, target, client, local, &mut resp, stripped,
                            );
                            let response =
                                finish(route, parts, target, client, local, &attempts, start, resp);
                            return Handled { response, raw };
                        }
                    }
                }
                Err(failed) => {
                    if let Some(fault) = client_fault.as_ref().and_then(|f| f.get()) {
                        // The client's doing, while its body was streamed: no
                        // evidence against the peer, which is freed as nginx
                        // frees it (state 0: the guard dropped), and nothing
                        // is retried.
                        tracing::info!(%client, upstream = %upstream.name(), peer = %peer.name(), ?fault, "{}", failed.detail);
                        if let Some(r) = attempts.get_mut(record) {
                            r.response_time = attempt::secs(coarse_tick().since(t0));
                            r.connect_time = failed.connect_time;
                        }
                        drop(guard);
                        cancel(&mut flights, &mut attempts);
                        let resp = match fault {
                            body::Fault::Timeout => return body_timed_out(parts),
                            body::Fault::Bad => {
                                let mut r = error_page(StatusCode::BAD_REQUEST);
                                r.headers_mut()
                                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
                                r
                            }
                            body::Fault::Closed => {
                                crate::conn::close_silently(StatusCode::BAD_REQUEST)
                            }
                        };
                        return answer(parts, &attempts, resp);
                    }
                    tracing::warn!(upstream = %upstream.name(), peer = %peer.name(), class = %failed.failure.class, "{}", failed.detail);
                    let took = coarse_tick().since(t0);
                    let class = failed.failure.class;
                    if let Some(r) = attempts.get_mut(record) {
                        r.status = Some(class.final_status());
                        r.response_time = attempt::secs(took);
                        r.connect_time = failed.connect_time;
                    }
                    obs.attempt(
                        peer,
                        Outcome::Failed(class),
                        None,
                        failed.connect_time,
                        took,
                    );
                    let verdict = sel.on_failure(guard, failed.failure, clock.now());
                    // What core charged (nothing for the single server of an upstream).
                    obs.charged(peer, verdict.accounting());
                    match verdict {
                        FailureVerdict::Retry(_) => {
                            obs.retry();
                            release_send();
                            continue;
                        }
                        FailureVerdict::Fail { status, denied, .. } => {
                            obs.denied(denied);
                            cancel(&mut flights, &mut attempts);
                            let code =
                                StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
                            return answer(parts, &attempts, error_page(code));
                        }
                    }
                }
            }
        }
    }
}

/// A request's attempts, in the order they started (inline while they are
/// two: a malloc and a free fewer per request).
type Attempts = SmallVec<[AttemptRecord; 2]>;

/// The attempts in flight (inline while one: more only while hedges race).
type Flights<'a> = SmallVec<[Flight<'a>; 1]>;

/// What every attempt of one request sends.
struct Job<'a> {
    route: &'a Route,
    parts: &'a Parts,
    target: Option<&'a Target>,
    uri: &'a str,
    body: &'a ReqBody,
    len: Option<u64>,
    client: SocketAddr,
    local: SocketAddr,
    upgrade: bool,
    replayable: bool,
    /// The upstream has `hedge`: attempts may race.
    hedged: bool,
    /// For a request that cannot be sent twice at once (any method but GET,
    /// HEAD, OPTIONS and TRACE, or a body: core's `RequestFacts::sends_twice`)
    /// that may be hedged: taken by the first of its attempts to connect.
    once: Option<Arc<std::sync::atomic::AtomicBool>>,
    /// How many attempts an earlier pass made (see [`EarlierAttempts`]).
    group: usize,
}

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

impl<'a> Job<'a> {
    /// Start an attempt on `guard`'s peer; its record goes in `attempts`
    /// now, so the list keeps the order attempts started in (nginx's).
    async fn launch(
        &self,
        guard: PeerGuard,
        attempts: &mut Attempts,
    ) -> Result<Flight<'a>, Response<UpBody>> {
        // The route's own record of the peer (the guard is of the route's
        // upstream), borrowed for the attempt: a clone of its `Arc` per
        // request was a write to the peer's cache line from every worker.
        let Some(peer) = self
            .route
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
        attempts.push(AttemptRecord {
            addr: peer.addr_text().clone(),
            status: None,
            response_time: 0.0,
            connect_time: None,
            redirected: self.group > 0 && attempts.len() == self.group,
        });
        let (route, parts, target, uri, body, len) = (
            self.route,
            self.parts,
            self.target,
            self.uri,
            self.body,
            self.len,
        );
        let (client, local, upgrade, replayable) =
            (self.client, self.local, self.upgrade, self.replayable);
        let race = self.hedged.then(|| Arc::new(attempt::Race::default()));
        // The attempt's own future, boxed as it is (no block around it to
        // hold what it is given a second time).
        let run = crate::spare::boxed(|| {
            attempt::run(
                route,
                peer,
                route.tls.as_ref(),
                replayable,
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
                    build_request(
                        route, parts, target, uri, b, client, local, &len, upgrade, room,
                    )
                },
            )
        });
        Ok(Flight {
            guard,
            peer,
            t0: coarse_tick(),
            record: attempts.len() - 1,
            race,
            run,
        })
    }
}

/// Wait for the first attempt to end, for the hedge timer, or for the
/// client of `watched` to go away.
async fn race(
    flights: &mut [Flight<'_>],
    hedge_at: Option<Instant>,
    watched: Option<&crate::conn::ConnState>,
) -> Raced {
    let mut timer = std::pin::pin!(hedge_at.map(crate::timer::sleep_until));
    std::future::poll_fn(|cx| {
        // (Set by the connection's loop, which polls this request again
        // at once: crate::h1's watch.)
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
fn cancel(flights: &mut Flights<'_>, attempts: &mut [AttemptRecord]) {
    for f in flights.drain(..) {
        tracing::debug!(peer = %f.peer.name(), "hedged attempt cancelled");
        if let Some(r) = attempts.get_mut(f.record) {
            r.response_time = attempt::secs(coarse_tick().since(f.t0));
        }
        f.guard.cancel();
        drop(f.run);
    }
}

/// Whether `uri` can be the target of the upstream request line. nginx
/// sends the URI it made as it is (a `$1` or `$uri` of `proxy_pass` may
/// hold a space, `<`, a control byte...), and so does vigil's own client;
/// but a CR, LF or NUL would end or split the request line (a second
/// request the client wrote), so vigil refuses those (nginx sends them).
/// hyper's client (TLS upstreams) takes only what `http::Uri` parses.
fn sendable(uri: &str, hyper: bool) -> Result<(), String> {
    if let Some(b) = uri.bytes().find(|b| matches!(b, b'\r' | b'\n' | 0)) {
        return Err(format!(
            "its URI holds the byte 0x{b:02x}, which would end its request line"
        ));
    }
    if hyper {
        if let Err(e) = http::Uri::try_from(uri) {
            return Err(format!(
                "its URI is not one the TLS client can send ({e}); vigil's plain HTTP client would send it as nginx does"
            ));
        }
    }
    Ok(())
}

fn body_len(body: &ReqBody) -> Option<u64> {
    match body {
        ReqBody::Buffered(b) => Some(b.len()),
        ReqBody::Stream(_) => None,
    }
}

#[allow(clippy::too_many_arguments)]
fn build_request(
    route: &Route,
    parts: &Parts,
    target: Option<&Target>,
    uri: &str,
    body: UpBody,
    client: SocketAddr,
    local: SocketAddr,
    len: &Option<u64>,
    upgrade: bool,
    room: Room<'_>,
) -> Result<Outgoing, String> {
    let mut fields = request_fields(route, parts, target, client, local, len, upgrade);
    Ok(match room {
        // vigil's own client writes the target as it is (checked by
        // `sendable` before any attempt).
        Room::Head(head) => {
            let written = head.write(&parts.method, uri, &mut fields, &body);
            Outgoing::H1(written, body)
        }
        Room::Map(room) => {
            // The client's own target goes as it came (no parse).
            let built = match parts.uri.path_and_query() {
                Some(pq)
                    if pq.as_str() == uri
                        && parts.uri.scheme().is_none()
                        && parts.uri.authority().is_none() =>
                {
                    parts.uri.clone()
                }
                _ => http::Uri::try_from(uri)
                    .map_err(|e| format!("cannot build upstream request: {e}"))?,
            };
            let mut req = Request::new(body);
            *req.method_mut() = parts.method.clone();
            *req.uri_mut() = built;
            *req.version_mut() = http::Version::HTTP_11;
            *req.headers_mut() = fields.into_map(room);
            Outgoing::Hyper(req)
        }
    })
}

/// The upstream request's header fields: the client's without the
/// hop-by-hop ones, then (in this order) `Host`, `Content-Length`, the
/// `proxy_set_header`s and `Upgrade`/`Connection`.
fn request_fields<'p>(
    route: &'p Route,
    parts: &'p Parts,
    target: Option<&Target>,
    client: SocketAddr,
    local: SocketAddr,
    len: &Option<u64>,
    upgrade: bool,
) -> Fields<'p> {
    use crate::upstream::put::{CONNECTION, CONTENT_LENGTH, HOST};
    let mut fields = Fields::without_hop_by_hop(&parts.headers, 3 + route.set_headers.len());
    // insert replaces the client's Host; a proxy_host no header can carry
    // sends none.
    match &route.host_value {
        Some(v) => fields.insert(&HOST, v.clone()),
        None => fields.remove(&header::HOST),
    }
    // nginx's default proxy_set_header Expect "": the client's Expect was
    // answered here (100 Continue when its body is read), not upstream.
    fields.remove(&header::EXPECT);
    match len {
        Some(0) => fields.remove(&header::CONTENT_LENGTH),
        Some(n) => fields.insert(&CONTENT_LENGTH, HeaderValue::from(*n)),
        None => {}
    }
    if !route.set_headers.is_empty() {
        let cx = route.vars(parts, target, client, local, 0);
        for (name, tpl) in &route.set_headers {
            fields.remove(name);
            if let Some(t) = tpl {
                // The value's bytes as they came (a client's obs-text too);
                // an empty one sends no field, as nginx.
                let v = t.expand(&cx);
                if !v.is_empty() {
                    if let Some(v) = crate::vars::field_value(v) {
                        fields.insert(name, v);
                    }
                }
            }
        }
    }
    match upgrade {
        // The location's proxy_set_header put Upgrade and Connection.
        true if fields.contains(&header::UPGRADE) => {}
        // Otherwise no Upgrade goes upstream: what nginx sends with
        // proxy_http_version 1.0 a server must ignore (RFC 9110 §7.8).
        _ if route.pool.enabled() => {
            fields.remove(&header::UPGRADE);
            fields.insert(&CONNECTION, HeaderValue::from_static("keep-alive"));
        }
        _ => {
            fields.remove(&header::UPGRADE);
            fields.insert(&CONNECTION, HeaderValue::from_static("close"));
        }
    }
    fields
}

/// `proxy_hide_header` / `proxy_pass_header` / `proxy_redirect` on the
/// upstream's response; `hidden_out`: vigil's own reader left
/// `proxy_hide_header`'s set out of the map as it built it.
fn upstream_headers(
    route: &Route,
    parts: &Parts,
    target: Option<&Target>,
    client: SocketAddr,
    local: SocketAddr,
    resp: &mut Response<UpBody>,
    hidden_out: bool,
) {
    let cx = route.vars(parts, target, client, local, resp.status().as_u16());
    route
        .headers
        .apply(resp.headers_mut(), &cx, local, hidden_out);
}

/// Add the location's `add_header`s and write the access log line.
#[allow(clippy::too_many_arguments)]
fn finish(
    route: &Route,
    parts: &Parts,
    target: Option<&Target>,
    client: SocketAddr,
    local: SocketAddr,
    attempts: &[AttemptRecord],
    start: Tick,
    mut resp: Response<UpBody>,
) -> Response<UpBody> {
    if parts.extensions.get::<crate::error_page::Paged>().is_none() {
        let generated = resp
            .extensions()
            .get::<crate::status_page::Generated>()
            .is_some();
        if route
            .error_pages
            .replaces(resp.status().as_u16(), generated)
        {
            // An error_page answers instead: its answer is the one logged,
            // with these attempts first.
            if !attempts.is_empty() {
                resp.extensions_mut()
                    .insert(EarlierAttempts(attempts.to_vec()));
            }
            return resp;
        }
    }
    paged_status(parts, &mut resp);
    let cx = VarContext {
        parts,
        target,
        client,
        local,
        proxy_host: &route.proxy_host,
        attempts,
        status: resp.status().as_u16(),
        request_time: coarse_tick().since(start).as_secs_f64(),
    };
    decorate(
        &route.add_headers,
        Some(&route.location.proxy.gzip),
        route.access_log.as_deref(),
        &cx,
        parts,
        resp,
    )
}

/// The attempts of an earlier pass of this request (an `error_page`'s).
fn earlier_attempts(parts: &Parts) -> &[AttemptRecord] {
    parts
        .extensions
        .get::<EarlierAttempts>()
        .map_or(&[], |e| e.0.as_slice())
}

/// `add_header`s (only `always` ones on other statuses than nginx's
/// list), gzip, and the access log line (nginx's filter order).
fn decorate(
    add_headers: &[(HeaderName, crate::vars::Template, bool)],
    gzip: Option<&vigil_core::config::Gzip>,
    access_log: Option<&crate::log::AccessLogWriter>,
    cx: &VarContext<'_>,
    parts: &Parts,
    mut resp: Response<UpBody>,
) -> Response<UpBody> {
    let always_only = !matches!(
        cx.status,
        200 | 201 | 204 | 206 | 301 | 302 | 303 | 304 | 307 | 308
    );
    for (name, tpl, always) in add_headers {
        if always_only && !always {
            continue;
        }
        let v = tpl.expand(cx);
        if v.is_empty() {
            continue;
        }
        if let Some(v) = crate::vars::field_value(v) {
            resp.headers_mut().append(name.clone(), v);
        }
    }
    if let Some(g) = gzip {
        resp = crate::gzip::filter(g, parts, resp);
    }
    match access_log {
        Some(log) => log.attach(cx, parts, resp),
        None => resp,
    }
}

/// The request fields the proxying reads: whether it asks to upgrade, its
/// length (the first `Content-Length`, as a lookup finds it), whether it
/// has a `Transfer-Encoding`, and its first `Host` (for the error log).
#[derive(Debug, Default, PartialEq, Eq)]
struct Asked {
    upgrade: bool,
    length: Option<u64>,
    transfer_encoding: bool,
    host: Option<HeaderValue>,
}

impl Asked {
    /// The fields of `h`: one pass over a map of a few fields (as nearly
    /// every request's is) instead of three lookups, each hashing a name.
    fn of(h: &HeaderMap) -> Self {
        if h.len() > 16 {
            return Self {
                upgrade: h.contains_key(header::UPGRADE),
                length: content_length(h),
                transfer_encoding: h.contains_key(header::TRANSFER_ENCODING),
                host: h.get(header::HOST).cloned(),
            };
        }
        let mut asked = Self::default();
        let mut length = None;
        for (name, value) in h {
            if *name == header::UPGRADE {
                asked.upgrade = true;
            } else if *name == header::CONTENT_LENGTH {
                length = length.or(Some(value));
            } else if *name == header::TRANSFER_ENCODING {
                asked.transfer_encoding = true;
            } else if *name == header::HOST && asked.host.is_none() {
                asked.host = Some(value.clone());
            }
        }
        asked.length = length.and_then(length_of);
        asked
    }
}

fn content_length(h: &HeaderMap) -> Option<u64> {
    length_of(h.get(header::CONTENT_LENGTH)?)
}

fn length_of(v: &HeaderValue) -> Option<u64> {
    v.to_str().ok()?.trim().parse().ok()
}

/// Whether the location passes a client's Upgrade on: nginx drops the
/// client's Upgrade and Connection (hop-by-hop) and sends them only as
/// `proxy_set_header Upgrade ...; proxy_set_header Connection ...;` put
/// them, and a server honours Upgrade only in an HTTP/1.1 request
/// (`proxy_http_version 1.1`; vigil's wire is always 1.1, so it asks only
/// when nginx would ask in 1.1).
fn passes_upgrade(route: &Route) -> bool {
    let sets = |name: &HeaderName| {
        route
            .set_headers
            .iter()
            .any(|(n, v)| n == name && v.is_some())
    };
    route.location.proxy.http_version == vigil_core::config::HttpVersion::Http11
        && sets(&header::UPGRADE)
        && sets(&header::CONNECTION)
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        #[test]
        fn asked_reads_as_the_three_lookups(
            fields in proptest::collection::vec(
                (0usize..6, proptest::sample::select(vec!["0", "12", " 7 ", "x", "", "99999999999999999999"])),
                0..24,
            ),
        ) {
            let names = ["upgrade", "content-length", "transfer-encoding", "host", "x-a", "te"];
            let mut h = HeaderMap::new();
            for (n, v) in &fields {
                h.append(HeaderName::from_static(names[*n]), HeaderValue::from_static(v));
            }
            let looked_up = Asked {
                upgrade: h.contains_key(header::UPGRADE),
                length: content_length(&h),
                transfer_encoding: h.contains_key(header::TRANSFER_ENCODING),
                host: h.get(header::HOST).cloned(),
            };
            proptest::prop_assert_eq!(Asked::of(&h), looked_up);
        }
    }
}
