//! One client request, by nginx's phases: route it (`crate::nginx::route`: the
//! server, the rewrite phases, the location), then for a location that
//! proxies:
//!
//! - [`intake`]: the phases before the content handler (realip, access,
//!   `client_max_body_size`) and the body, buffered or streamed;
//! - [`attempts`]: walk the upstream's peers with core's rules, racing
//!   hedges and the client's going away, each attempt written into the
//!   [`ledger`] (the `$upstream_*` record, the metrics, core's verdict);
//!   the attempt's request is [`outgoing`]'s;
//! - [`respond`]: pass the upstream's response through, or answer as nginx
//!   would (502 for errors and "no live upstreams", 504 for timeouts);
//!   then `error_page` ([`pages`]), `add_header`s and the access log.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use vigil_net::clock::{coarse_tick, Tick};

use http::request::Parts;
use http::StatusCode;
use hyper::Response;
use smallvec::SmallVec;
use vigil_core::config::ProxySettings;
use vigil_core::{RequestFacts, SelectKey};

use crate::handler::body::{Buffered, ClientBody, RequestBody, UpBody};
use crate::handler::record::{AttemptRecord, EarlierAttempts};
use crate::nginx::route::{Answer, Route};
use crate::nginx::router::Target;
use crate::nginx::status_page::error_page;
use crate::nginx::vars::VarContext;
use crate::obs::telemetry::request::RequestObserver;
use crate::server::Proxy;
use crate::wire::raw_head::RawFields;

mod attempts;
pub(crate) mod body;
mod files;
mod intake;
mod ledger;
mod outgoing;
mod pages;
pub(crate) mod record;
mod respond;
mod upstream_head;

pub(crate) use respond::refused_head;

use attempts::{Job, Settled};
use ledger::Ledger;
use pages::{error_paged, not_routed, Page};
use respond::{decorate, refused, returned};

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
        if let Some(id) = crate::nginx::vars::RequestId::draw() {
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
                    let resp = returned(&reply, &parts, target.as_ref(), local, client, start);
                    let down = Downstream {
                        local,
                        client,
                        conn,
                    };
                    return match (target, paged_return(&reply, &resp, &parts)) {
                        (Some(target), true) => {
                            let mut raw = None;
                            let page = Page {
                                generation: &generation,
                                pages: &reply.error_pages,
                                parts,
                                target,
                            };
                            let response = Box::pin(error_paged(
                                proxy, page, &mut body, down, start, resp, &mut raw,
                            ))
                            .await;
                            Handled { response, raw }
                        }
                        _ => resp.into(),
                    };
                }
                Answer::Files(files) => {
                    let mut raw = None;
                    let down = Downstream {
                        local,
                        client,
                        conn,
                    };
                    let response = match target {
                        Some(target) => {
                            Box::pin(files::served(
                                proxy,
                                &generation,
                                files,
                                (parts, target),
                                &mut body,
                                down,
                                start,
                                &mut raw,
                            ))
                            .await
                        }
                        None => error_page(StatusCode::INTERNAL_SERVER_ERROR),
                    };
                    return Handled { response, raw };
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
            Cx {
                proxy,
                route: &route,
                target: target.as_ref(),
                local: net.local,
                client: net.client,
                conn: net.conn,
                start,
            },
            &mut parts,
            &mut body,
            &mut obs,
        )
        .await;
        // Done with (logged): the map's and the extensions' room is a later
        // message's.
        crate::wire::spare::keep(std::mem::take(&mut parts.headers));
        crate::wire::spare::keep_extensions(std::mem::take(&mut parts.extensions));
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

/// Whether a `return`'s answer goes to its `error_page`: nginx's
/// `return CODE` without a text, a redirect (`return 302 URL`, a
/// rewrite's) and a `deny`'s 403 are special responses, which an
/// `error_page` of their code replaces (the page's answer then has no
/// `Location` of the first); a text or 444 is sent as it is. Not for the answer of a page
/// (`recursive_error_pages off`).
pub(super) fn paged_return(
    reply: &crate::nginx::reply::Reply,
    resp: &Response<UpBody>,
    parts: &Parts,
) -> bool {
    (reply.text.is_none() || vigil_core::config::Return::redirects(reply.code))
        && reply.code != 444
        && parts
            .extensions
            .get::<crate::nginx::error_page::Paged>()
            .is_none()
        && reply.error_pages.replaces(resp.status().as_u16(), true)
}

/// A request's response, with its fields as they came where the route
/// passes them so (see [`crate::wire::raw_head`]).
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

/// What every phase of one proxied request reads: where it came from,
/// where it goes, and when it started.
#[derive(Clone, Copy)]
struct Cx<'a> {
    proxy: &'a Proxy,
    route: &'a Route,
    /// What routing saw of the request.
    target: Option<&'a Target>,
    local: SocketAddr,
    /// The client, as the realip module sees it once [`intake`] ran.
    client: SocketAddr,
    conn: &'a crate::conn::ConnState,
    start: Tick,
}

impl<'a> Cx<'a> {
    /// The location's settings.
    fn settings(&self) -> &'a ProxySettings {
        &self.route.location.proxy
    }

    /// The request's variables for a response of `status`.
    fn vars<'p>(&self, parts: &'p Parts, status: u16) -> VarContext<'p>
    where
        'a: 'p,
    {
        self.route
            .vars(parts, self.target, self.client, self.local, status)
    }

    /// vigil's own answer to the client, through the location's
    /// `error_page`, `add_header`s and access log (`attempts` in its
    /// `$upstream_*`).
    fn answer(&self, parts: &Parts, attempts: &[AttemptRecord], resp: Response<UpBody>) -> Handled {
        Handled::from(respond::finish(self, parts, attempts, resp))
    }
}

/// The request, routed to a location that proxies: its intake, its
/// attempts, its answer. An `async` block holding `parts` once (see
/// [`handle`]).
#[allow(
    clippy::manual_async_fn,
    reason = "an async fn would hold its arguments twice"
)]
fn proxy_request<'a, 'o>(
    mut cx: Cx<'a>,
    parts: &'a mut Parts,
    client_body: &'a mut ClientRequestBody,
    obs: &'a mut RequestObserver<'o>,
) -> impl Future<Output = Handled> + use<'a, 'o> {
    async move {
        let (proxy, route, target) = (cx.proxy, cx.route, cx.target);
        let intake = match intake::intake(&mut cx, parts, client_body).await {
            Ok(i) => i,
            Err(answered) => return answered,
        };
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
            .map(|t| t.expand(&cx.vars(parts, 0)));
        let key = match (&hash_key, &upstream.config().balancer) {
            (Some(k), _) => SelectKey::Hash(k),
            (None, vigil_core::config::Balancer::IpHash) => SelectKey::Client(cx.client.ip()),
            _ => SelectKey::None,
        };
        let clock = proxy.clock();
        let sel = upstream.begin(key, route.policy, facts, clock.now());
        // An error_page's pass goes on with the first pass's attempts.
        let earlier = parts
            .extensions
            .remove::<EarlierAttempts>()
            .map(|e| SmallVec::from_vec(e.0))
            .unwrap_or_default();
        let mut ledger = Ledger::new(obs, sel, upstream, &**clock, earlier);
        let parts = &*parts;
        let uri = route.upstream_uri(parts, target);
        // A URI no request line can carry is vigil's to refuse, before any
        // peer is picked: it is no evidence against one.
        if let Err(why) = outgoing::sendable(&uri) {
            tracing::error!(upstream = %upstream.name(), uri = ?uri, "cannot send the request upstream: {why}");
            return cx.answer(parts, &[], error_page(StatusCode::INTERNAL_SERVER_ERROR));
        }
        let hedged = upstream.config().rules.hedge.is_some();
        let job = Job {
            cx,
            parts,
            uri: &uri,
            body,
            upgrade: intake.on_upgrade.is_some(),
            replayable: facts.body_replayable,
            hedged,
            once: facts
                .sends_once(hedged)
                .then(|| Arc::new(std::sync::atomic::AtomicBool::new(false))),
        };
        let settled = attempts::run(&job, &mut ledger, intake.fault.as_deref()).await;
        match settled {
            Settled::Upstream { guard, answered } => {
                respond::pass_through(&cx, parts, &ledger, intake, (guard, answered))
            }
            Settled::Answer(resp) => cx.answer(parts, ledger.records(), resp),
            Settled::Unattempted(resp) => cx.answer(parts, &[], resp),
            Settled::Bare(resp) => Handled::from(resp),
        }
    }
}
