//! The handler's static-file passes (crate::nginx::static_files): serve
//! the request from files, follow the internal redirects that makes
//! (`index`, `try_files`' last argument: a URI or a named location, which
//! may proxy, return or serve files again), then the location's
//! `error_page`, `expires`, `add_header`s, gzip and access log.

use std::time::SystemTime;

use http::request::Parts;
use http::{Response, StatusCode};
use vigil_net::clock::{coarse_tick, Tick};

use super::pages::{error_paged, paged_status, server_logged, Page};
use super::{
    decorate, proxy_request, refused, returned, ClientRequestBody, Cx, Downstream, Handled,
};
use crate::nginx::error_page::Paged;
use crate::nginx::rewrite::Net;
use crate::nginx::route::{Answer, PassUri, Route};
use crate::nginx::router::Target;
use crate::nginx::static_files::{self, Files, Outcome, MAX_REDIRECTS};
use crate::nginx::status_page::{error_page, Generated};
use crate::nginx::vars::VarContext;
use crate::server::{Generation, Proxy};
use crate::wire::payload::UpBody;
use crate::wire::raw_head::RawFields;

/// Answer a request routing gave to `files`.
#[allow(clippy::too_many_arguments)]
pub(super) async fn served(
    proxy: &Proxy,
    generation: &Generation,
    mut files: std::sync::Arc<Files>,
    (mut parts, mut target): (Parts, Target),
    body: &mut ClientRequestBody,
    down: Downstream<'_>,
    start: Tick,
    raw: &mut Option<Box<RawFields>>,
) -> Response<UpBody> {
    let routes = &generation.routes;
    let net = Net {
        local: down.local,
        client: down.client,
    };
    // The limit_conn counts of the location that took the request, held
    // until its answer (a file's, or the location it redirects to's) ends.
    let mut held: Option<crate::nginx::limit::Held> = None;
    for _ in 0..MAX_REDIRECTS {
        if let Some(t) = &files.timers {
            crate::conn::on_route(down.conn, t);
        }
        // The preaccess phase, once a request (as a proxying location's:
        // `limit::preaccess` skips what ran already); its refusal is
        // answered as a file's answer would be.
        let outcome = match &files.limits {
            Some(limits) => {
                let now = proxy.clock().now().0;
                let at = (down.client, down.local, down.conn);
                match crate::nginx::limit::preaccess(limits, "", Some(&target), at, &mut parts, now)
                    .await
                {
                    Ok(h) => {
                        held = held.or(h);
                        files.serve(&parts, &target, net)
                    }
                    Err(refused) => Outcome::Answer(refused.response()),
                }
            }
            None => files.serve(&parts, &target, net),
        };
        let next = match outcome {
            Outcome::Answer(resp) => {
                let resp = answered(
                    proxy,
                    generation,
                    &files,
                    (parts, target),
                    body,
                    down,
                    start,
                    resp,
                    raw,
                )
                .await;
                return with_held(resp, held);
            }
            Outcome::Redirect(path, args) => {
                target.uri.rewrite(path, args);
                target.internal = true;
                parts.extensions.remove::<PassUri>();
                routes.phases(target.server, net, &mut parts, &mut target)
            }
            Outcome::Named(name) => {
                let Some(li) = routes.router.named(target.server, &name) else {
                    tracing::error!("could not find named location \"{name}\"");
                    let resp = error_page(StatusCode::INTERNAL_SERVER_ERROR);
                    return finish(&files, &parts, &target, down, start, resp);
                };
                target.internal = true;
                parts.extensions.remove::<PassUri>();
                routes.location_phase(target.server, li, net, &mut parts, &mut target)
            }
        };
        match next {
            Ok(Answer::Files(f)) => files = f,
            Ok(Answer::Return(reply)) => {
                let resp = returned(
                    &reply,
                    &parts,
                    Some(&target),
                    down.local,
                    down.client,
                    start,
                );
                if !super::paged_return(&reply, &resp, &parts) {
                    return resp;
                }
                let page = Page {
                    generation,
                    pages: &reply.error_pages,
                    parts,
                    target,
                };
                return Box::pin(error_paged(proxy, page, body, down, start, resp, raw)).await;
            }
            Ok(Answer::Proxy(route)) => {
                let resp = Box::pin(proxied(
                    proxy,
                    generation,
                    route,
                    (parts, target),
                    body,
                    down,
                    start,
                    raw,
                ))
                .await;
                return with_held(resp, held);
            }
            Err(refusal) => {
                let resp = refused(refusal, &parts);
                let at = (down.local, down.client);
                let server = Some(target.server);
                return server_logged(routes, server, &parts, Some(&target), at, start, resp);
            }
        }
    }
    tracing::error!("rewrite or internal redirection cycle while internally redirecting");
    let resp = error_page(StatusCode::INTERNAL_SERVER_ERROR);
    finish(&files, &parts, &target, down, start, resp)
}

/// `resp`, its body holding `held` (limit_conn counts) until it ends.
fn with_held(resp: Response<UpBody>, held: Option<crate::nginx::limit::Held>) -> Response<UpBody> {
    match held {
        Some(h) => resp.map(|b| crate::nginx::limit::HeldBody::wrap(b, h)),
        None => resp,
    }
}

/// A file's answer: the location's `error_page` for it, else its headers
/// and log line.
#[allow(clippy::too_many_arguments)]
async fn answered(
    proxy: &Proxy,
    generation: &Generation,
    files: &Files,
    (parts, target): (Parts, Target),
    body: &mut ClientRequestBody,
    down: Downstream<'_>,
    start: Tick,
    resp: Response<UpBody>,
    raw: &mut Option<Box<RawFields>>,
) -> Response<UpBody> {
    let generated = resp.extensions().get::<Generated>().is_some();
    let paged = parts.extensions.get::<Paged>().is_some();
    if !paged
        && files
            .error_pages
            .replaces(resp.status().as_u16(), generated)
    {
        let page = Page {
            generation,
            pages: &files.error_pages,
            parts,
            target,
        };
        return Box::pin(error_paged(proxy, page, body, down, start, resp, raw)).await;
    }
    finish(files, &parts, &target, down, start, resp)
}

/// `expires`, the `add_header`s, gzip and the access log line of a
/// static answer (the status an `error_page` gives it first).
fn finish(
    files: &Files,
    parts: &Parts,
    target: &Target,
    down: Downstream<'_>,
    start: Tick,
    mut resp: Response<UpBody>,
) -> Response<UpBody> {
    paged_status(parts, &mut resp);
    // A file answered under an error's status (an error_page's): nginx's
    // header filter sends Last-Modified only with 200, 206 and 304, its
    // range filter Accept-Ranges only with 200.
    let status = resp.status().as_u16();
    if status != 200 {
        let h = resp.headers_mut();
        h.remove(http::header::ACCEPT_RANGES);
        if !matches!(status, 206 | 304) {
            h.remove(http::header::LAST_MODIFIED);
        }
    }
    static_files::expires(files.expires(), &mut resp, SystemTime::now());
    let vars = VarContext {
        parts,
        target: Some(target),
        client: down.client,
        local: down.local,
        proxy_host: "",
        attempts: super::respond::earlier_attempts(parts),
        status: resp.status().as_u16(),
        request_time: coarse_tick().since(start).as_secs_f64(),
    };
    decorate(
        &files.add_headers,
        Some(&files.gzip),
        files.access_log.as_deref(),
        &vars,
        parts,
        resp,
    )
}

/// A static pass that ends in a location that proxies (`try_files $uri
/// @app`): the proxied request and its route's `error_page`.
#[allow(clippy::too_many_arguments)]
async fn proxied(
    proxy: &Proxy,
    generation: &Generation,
    route: std::sync::Arc<Route>,
    (mut parts, target): (Parts, Target),
    body: &mut ClientRequestBody,
    down: Downstream<'_>,
    start: Tick,
    raw: &mut Option<Box<RawFields>>,
) -> Response<UpBody> {
    crate::conn::on_route(down.conn, &route.location.proxy);
    let saved = (!route.error_pages.is_empty() && parts.extensions.get::<Paged>().is_none())
        .then(|| (parts.clone(), target.clone()));
    let mut obs = super::observer(proxy, generation, &route, &parts, start);
    let cx = Cx {
        proxy,
        route: &route,
        target: Some(&target),
        local: down.local,
        client: down.client,
        conn: down.conn,
        start,
    };
    let Handled {
        response,
        raw: fields,
    } = proxy_request(cx, &mut parts, body, &mut obs).await;
    *raw = fields;
    let resp = match saved {
        Some((parts, target)) => {
            let page = Page {
                generation,
                pages: &route.error_pages,
                parts,
                target,
            };
            error_paged(proxy, page, body, down, start, response, raw).await
        }
        None => response,
    };
    obs.finish(resp.status().as_u16());
    resp
}
