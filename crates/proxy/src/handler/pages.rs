//! The handler's `error_page` passes (crate::nginx::error_page): a page's
//! answer for a location's (or a server's) own errors, through the page's
//! `return` or its upstream (the client's body read for the first pass
//! goes again, as nginx sends `r->request_body` again), and the answers
//! for requests no location takes, logged to the server's access log.

use std::net::SocketAddr;
use std::sync::Arc;
use vigil_net::clock::Tick;

use http::request::Parts;
use http::{Response, StatusCode};

use super::{decorate, proxy_request, refused, returned, ClientRequestBody, ReqBody};
use crate::handler::body::{Buffered, UpBody};
use crate::nginx::error_page::{ErrorPages, To};
use crate::nginx::rewrite::Net;
use crate::nginx::route::{Answer, Refusal, Reply, Routes};
use crate::nginx::router::Target;
use crate::nginx::vars::Template;
use crate::nginx::vars::VarContext;
use crate::server::Proxy;

/// What an `error_page` redirects: the request as routed, with the pages
/// of the location (or server) that answered.
pub(super) struct Page<'a> {
    pub(super) generation: &'a crate::server::Generation,
    pub(super) pages: &'a crate::nginx::error_page::ErrorPages,
    pub(super) parts: Parts,
    /// What routing saw of it.
    pub(super) target: Target,
}

/// `error_page` of the location for a response it got (crate::nginx::error_page):
/// the page's answer (a `return`, a redirect, or an upstream's through the
/// page's location: nginx's internal redirect, which sends the request
/// body again), with the status `=CODE` or the original one gives it. A
/// page's own answer is not paged again (`recursive_error_pages off`).
pub(super) async fn error_paged(
    proxy: &Proxy,
    page: Page<'_>,
    body: &mut ClientRequestBody,
    down: super::Downstream<'_>,
    start: Tick,
    mut resp: Response<UpBody>,
    raw: &mut Option<Box<crate::wire::raw_head::RawFields>>,
) -> Response<UpBody> {
    let (local, client) = (down.local, down.client);
    let routes = &page.generation.routes;
    let status = resp.status().as_u16();
    let generated = resp
        .extensions()
        .get::<crate::nginx::status_page::Generated>()
        .is_some();
    let Some(redirected) = apply(
        routes,
        page.pages,
        status,
        generated,
        (page.parts, page.target),
        local,
        client,
    ) else {
        return resp;
    };
    let earlier = resp
        .extensions_mut()
        .remove::<crate::handler::record::EarlierAttempts>();
    let limited = resp
        .extensions_mut()
        .remove::<crate::nginx::limit::LimitStatus>();
    // The page answers instead: no fields of the response it replaces,
    // but an upstream's 401 gives the page's answer its WWW-Authenticate
    // (nginx's ngx_http_upstream_intercept_errors).
    let authenticate = (status == 401 && !generated)
        .then(|| www_authenticate(&resp, raw.as_deref()))
        .flatten();
    // A redirect vigil made keeps its Location through a page that is an
    // internal redirect (nginx's headers_out outlive it); a page that
    // redirects puts its own.
    let location = generated
        .then(|| resp.headers().get(http::header::LOCATION).cloned())
        .flatten();
    drop(resp);
    *raw = None;
    let Redirected {
        answer,
        mut parts,
        target,
        forced,
        method,
    } = redirected;
    parts.extensions.insert(crate::nginx::error_page::Paged {
        status: forced,
        method,
    });
    if let Some(e) = earlier {
        parts.extensions.insert(e);
    }
    if let Some(l) = limited {
        parts.extensions.insert(l);
    }
    let answered = match answer {
        Ok(Answer::Return(reply)) => returned(&reply, &parts, Some(&target), local, client, start),
        Ok(Answer::Proxy(route)) => {
            let gone = match &*body {
                // A body over client_max_body_size is discarded (nginx's
                // ngx_http_discard_request_body): the page gets none.
                _ if status == 413 => true,
                // Streamed to the first upstream (taken by an attempt that
                // connected): nothing is left to send; still there when
                // no attempt connected, then the page sends it.
                ClientRequestBody::Read(ReqBody::Stream(s)) => {
                    s.lock().map_or(true, |s| s.is_none())
                }
                _ => false,
            };
            if gone {
                *body = ClientRequestBody::Read(ReqBody::Buffered(Buffered::Empty));
            }
            // The page's upstream counts (and traces) its own attempts.
            let mut obs = super::observer(proxy, page.generation, &route, &parts, start);
            let cx = super::Cx {
                proxy,
                route: &route,
                target: Some(&target),
                local: down.local,
                client: down.client,
                conn: down.conn,
                start,
            };
            let super::Handled {
                response: resp,
                raw: fields,
            } = Box::pin(proxy_request(cx, &mut parts, body, &mut obs)).await;
            *raw = fields;
            obs.finish(resp.status().as_u16());
            resp
        }
        Ok(Answer::Files(files)) => {
            Box::pin(super::files::served(
                proxy,
                page.generation,
                files,
                (parts, target),
                body,
                down,
                start,
                raw,
            ))
            .await
        }
        // The page's URI found no location: nginx's 404 (not paged
        // again), logged by the server.
        Err(refusal) => {
            let resp = refused(refusal, &parts);
            let at = (local, client);
            server_logged(
                routes,
                Some(target.server),
                &parts,
                Some(&target),
                at,
                start,
                resp,
            )
        }
    };
    let mut answered = answered;
    if let Some(v) = authenticate {
        answered
            .headers_mut()
            .insert(http::header::WWW_AUTHENTICATE, v);
    }
    if let Some(v) = location {
        if !answered.headers().contains_key(http::header::LOCATION) {
            answered.headers_mut().insert(http::header::LOCATION, v);
        }
    }
    answered
}

/// The first `WWW-Authenticate` of an upstream's answer, in its map or
/// among its fields as they came.
fn www_authenticate(
    resp: &Response<UpBody>,
    raw: Option<&crate::wire::raw_head::RawFields>,
) -> Option<http::HeaderValue> {
    if let Some(v) = resp.headers().get(http::header::WWW_AUTHENTICATE) {
        return Some(v.clone());
    }
    raw?.iter()
        .find(|f| f.name.eq_ignore_ascii_case(b"www-authenticate"))
        .and_then(|f| http::HeaderValue::from_bytes(f.value).ok())
}

/// `resp` with the access log line of server block `server`'s level.
pub(super) fn server_logged(
    routes: &crate::nginx::route::Routes,
    server: Option<usize>,
    parts: &Parts,
    target: Option<&Target>,
    (local, client): (SocketAddr, SocketAddr),
    start: Tick,
    resp: Response<UpBody>,
) -> Response<UpBody> {
    let log = server
        .and_then(|s| routes.server_level(s))
        .and_then(|l| l.access_log.as_deref());
    let cx = VarContext {
        parts,
        target,
        client,
        local,
        proxy_host: "",
        attempts: super::respond::earlier_attempts(parts),
        status: resp.status().as_u16(),
        request_time: Tick::now().since(start).as_secs_f64(),
    };
    decorate(&[], None, log, &cx, parts, resp)
}

/// A request no location answers (404, the auto_redirect 301, 400s): the
/// server's `error_page` for a 404 (nginx runs it as for a location), and
/// the server's access log.
#[allow(clippy::too_many_arguments)]
pub(super) async fn not_routed(
    proxy: &Proxy,
    generation: &Arc<crate::server::Generation>,
    refusal: Refusal,
    (parts, target): (Parts, Option<Target>),
    mut body: ClientRequestBody,
    down: super::Downstream<'_>,
    start: Tick,
    raw: &mut Option<Box<crate::wire::raw_head::RawFields>>,
) -> Response<UpBody> {
    let (local, client) = (down.local, down.client);
    let routes = &generation.routes;
    let server = target
        .as_ref()
        .map(|t| t.server)
        .or_else(|| routes.default_server(local));
    if refusal == Refusal::UnknownListener {
        return refused(refusal, &parts);
    }
    if refusal.in_request_line() {
        // nginx logs it with no header read.
        let resp = refused(refusal, &parts);
        let mut bare = parts;
        bare.headers.clear();
        let at = (local, client);
        return server_logged(routes, server, &bare, target.as_ref(), at, start, resp);
    }
    let resp = refused(refusal, &parts);
    let level = server.and_then(|s| routes.server_level(s));
    // A page redirects the request as routing left it (a 400 before
    // routing has no URI to redirect; nginx's pages for it are not copied).
    let routed = target
        .as_ref()
        .zip(level)
        .filter(|(_, l)| !l.error_pages.is_empty());
    if let Some((target, level)) = routed {
        let generated = resp
            .extensions()
            .get::<crate::nginx::status_page::Generated>()
            .is_some();
        if level
            .error_pages
            .replaces(resp.status().as_u16(), generated)
        {
            let page = Page {
                generation,
                pages: &level.error_pages,
                parts: parts.clone(),
                target: target.clone(),
            };
            return error_paged(proxy, page, &mut body, down, start, resp, raw).await;
        }
    }
    server_logged(
        routes,
        server,
        &parts,
        target.as_ref(),
        (local, client),
        start,
        resp,
    )
}

/// The status of an `error_page`'s answer: the original one, or
/// `=CODE`'s; `=` keeps the page's own (nginx's `r->err_status`). An
/// error vigil answers in the page's pass (its 403, 502, ...) keeps its
/// own, as nginx's special response sets `err_status` again.
pub(super) fn paged_status(parts: &Parts, resp: &mut Response<UpBody>) {
    if resp
        .extensions()
        .get::<crate::nginx::status_page::Generated>()
        .is_some()
    {
        return;
    }
    let forced = parts
        .extensions
        .get::<crate::nginx::error_page::Paged>()
        .and_then(|p| p.status)
        .and_then(|c| StatusCode::from_u16(c).ok());
    if let Some(code) = forced {
        *resp.status_mut() = code;
    }
}

/// Where an `error_page` sends a request.
struct Redirected {
    /// Who answers the redirected request (a refusal: its URI found no
    /// location, then nginx's 404).
    answer: Result<Answer, Refusal>,
    /// The request as redirected (URI, method).
    parts: Parts,
    /// What routing saw of it, as redirected.
    target: Target,
    /// The status of the answer (see [`crate::nginx::marks::Paged`]).
    forced: Option<u16>,
    /// The client's method.
    method: http::Method,
}

/// What an error page makes of a response of `status`: who answers the
/// redirected request and the status it gets; None keeps the response.
fn apply(
    routes: &Routes,
    pages: &ErrorPages,
    status: u16,
    generated: bool,
    (mut parts, mut target): (Parts, Target),
    local: SocketAddr,
    client: SocketAddr,
) -> Option<Redirected> {
    let page = pages.find(status, generated)?;
    let method = parts.method.clone();
    // nginx's err_status: the original code, `=CODE`, or (`=`) the page's own.
    let forced = match page.overwrite {
        -1 => Some(status),
        0 => None,
        c => u16::try_from(c).ok(),
    };
    let net = Net { local, client };
    let cx = |parts: &Parts, target: &Target, t: &Template| {
        t.expand(&VarContext {
            parts,
            target: Some(target),
            client,
            local,
            proxy_host: "",
            attempts: &[],
            status,
            request_time: 0.0,
        })
    };
    let server = target.server;
    let answer = match &page.to {
        To::Redirect(t) => {
            let url = cx(&parts, &target, t);
            let code = forced
                .filter(|c| matches!(c, 301 | 302 | 303 | 307 | 308))
                .unwrap_or(302);
            let base = Reply::internal_error();
            return Some(Redirected {
                answer: Ok(Answer::Return(Arc::new(base.redirect(code, &url)))),
                parts,
                target,
                forced: Some(code),
                method,
            });
        }
        To::Uri(t) => {
            let uri = cx(&parts, &target, t);
            // The path keeps its bytes; the routed arguments are text (uri.rs).
            let (path, args) = match uri.iter().position(|&b| b == b'?') {
                Some(q) => (
                    &uri[..q],
                    String::from_utf8_lossy(&uri[q + 1..]).into_owned(),
                ),
                None => (&uri[..], String::new()),
            };
            if parts.method != http::Method::HEAD {
                parts.method = http::Method::GET;
            }
            target.uri.rewrite(path.to_vec(), args);
            target.internal = true;
            // The earlier pass's proxy_pass URI is not this location's.
            parts.extensions.remove::<crate::nginx::route::PassUri>();
            routes.phases(server, net, &mut parts, &mut target)
        }
        To::Named(name) => {
            let li = routes.router.named(server, name)?;
            parts.extensions.remove::<crate::nginx::route::PassUri>();
            routes.location_phase(server, li, net, &mut parts, &mut target)
        }
    };
    Some(Redirected {
        answer,
        parts,
        target,
        forced,
        method,
    })
}
