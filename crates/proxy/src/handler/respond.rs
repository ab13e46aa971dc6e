//! The answer to a proxied request: an upstream's response passed through
//! (hop-by-hop fields out, `proxy_hide_header`, `proxy_redirect`, a 101's
//! tunnel, the body streamed under `proxy_read_timeout`), or an answer
//! vigil makes itself; then, as nginx's filters, the location's
//! `error_page`, `add_header`s, gzip and the access log line. Also the
//! answers routing makes (a `return`, a refusal) and the gate's.

use std::net::SocketAddr;

use http::header::{self, HeaderName, HeaderValue};
use http::request::Parts;
use http::StatusCode;
use http_body_util::BodyExt;
use hyper::{Request, Response};
use vigil_core::upstream::PeerGuard;
use vigil_net::clock::{coarse_tick, Tick};

use super::intake::{content_length, Intake};
use super::ledger::Ledger;
use super::pages::{self, paged_status};
use super::{Cx, Handled};
use crate::handler::body::{self, Streamed, UpBody};
use crate::handler::record::{AttemptRecord, EarlierAttempts};
use crate::nginx::route::{Refusal, Reply};
use crate::nginx::router::Target;
use crate::nginx::status_page::error_page;
use crate::nginx::vars::VarContext;
use crate::server::Proxy;
use crate::upstream::attempt::Answered;

/// Pass the response header core let through (from the attempt on `peer`,
/// whose `guard` the response body keeps until it ends) to the client.
pub(super) fn pass_through(
    cx: &Cx<'_>,
    parts: &Parts,
    ledger: &Ledger<'_, '_>,
    intake: Intake,
    (guard, answered): (PeerGuard, Box<Answered>),
) -> Handled {
    let route = cx.route;
    let settings = cx.settings();
    let Intake {
        mut asked,
        on_upgrade,
        own_writer,
        held,
        ..
    } = intake;
    let Answered {
        response,
        conn,
        raw: fields,
        ..
    } = *answered;
    let (mut head, incoming) = response.into_parts();
    // The fields as they came go beside the response to vigil's own
    // writer, into the map for another.
    let raw = match fields {
        Some(f) if !own_writer => {
            f.fill(&mut head.headers);
            None
        }
        f => f,
    };
    let errlog = crate::obs::errlog::Context::new(cx.client, parts, asked.host.take());
    if head.status == StatusCode::SWITCHING_PROTOCOLS {
        // attempt::run lets a 101 through only when this request asked for
        // it, so on_upgrade is there.
        if let Some(client_up) = on_upgrade {
            let upstream_up = incoming.upgraded();
            let timeouts = crate::conn::tunnel::TunnelTimers {
                idle: settings.read_timeout,
                upstream_send: settings.send_timeout,
                client_send: settings.client_send_timeout,
            };
            crate::conn::tunnel::spawn(async move {
                match (client_up.await, upstream_up) {
                    (Ok(a), Some(b)) => {
                        crate::conn::tunnel::run(a, b, timeouts, &errlog, &guard).await;
                        // limit_conn counts the tunnel until it closes.
                        drop(held);
                    }
                    (a, b) => tracing::warn!(
                        client = %errlog.client,
                        upstream = %guard.upstream().name(),
                        client_ok = a.is_ok(),
                        upstream_ok = b.is_some(),
                        "upgrade failed"
                    ),
                }
            });
            let mut resp = Response::from_parts(head, body::empty());
            resp.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
            return cx.answer(parts, ledger.records(), resp);
        }
    }
    let pooled = route.pool.shard().map(|s| (s.clone(), conn));
    let streamed = Streamed::new(
        incoming,
        settings.read_timeout,
        guard,
        pooled,
        errlog,
        ledger.stats(),
    );
    let mut body = BodyExt::boxed(streamed);
    if let Some(h) = held {
        body = crate::nginx::limit::HeldBody::wrap(body, *h);
    }
    let mut resp = Response::from_parts(head, body);
    // proxy_pass_header / proxy_redirect (the reader left the hop-by-hop
    // fields and proxy_hide_header's set out as it built the map: see
    // upstream::head::parse_with; a Transfer-Encoding's Content-Length too).
    let vars = cx.vars(parts, resp.status().as_u16());
    route.headers.apply(resp.headers_mut(), &vars, cx.local);
    let response = finish(cx, parts, ledger.records(), resp);
    Handled { response, raw }
}

/// The location's `error_page` (the answer then is the page's), else its
/// `expires`, `add_header`s and its access log line.
pub(super) fn finish(
    cx: &Cx<'_>,
    parts: &Parts,
    attempts: &[AttemptRecord],
    mut resp: Response<UpBody>,
) -> Response<UpBody> {
    let route = cx.route;
    if parts
        .extensions
        .get::<crate::nginx::error_page::Paged>()
        .is_none()
    {
        let generated = resp
            .extensions()
            .get::<crate::nginx::status_page::Generated>()
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
            // The page's pass does not run the limits again.
            crate::nginx::limit::carry(&parts.extensions, resp.extensions_mut());
            return resp;
        }
    }
    paged_status(parts, &mut resp);
    if route.expires != vigil_core::config::Expires::Off {
        crate::nginx::static_files::expires(route.expires, &mut resp, std::time::SystemTime::now());
    }
    let vars = VarContext {
        parts,
        target: cx.target,
        client: cx.client,
        local: cx.local,
        proxy_host: &route.proxy_host,
        attempts,
        status: resp.status().as_u16(),
        request_time: coarse_tick().since(cx.start).as_secs_f64(),
    };
    decorate(
        &route.add_headers,
        Some(&route.location.proxy.gzip),
        route.access_log.as_deref(),
        &vars,
        parts,
        resp,
    )
}

/// A request routing answered itself, as nginx answers it (400s and 421
/// close the connection, as nginx does after a 400). No location is
/// nginx's static handler: 405 for a method other than GET, HEAD and
/// POST, else 404.
pub(super) fn refused(refusal: Refusal, parts: &Parts) -> Response<UpBody> {
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

/// A head the request check refused (crate::wire::request_check): nginx's page
/// for its status, logged to the default server's access log with its
/// request line (and no header: nginx may have read some).
pub(crate) fn refused_head(
    proxy: &Proxy,
    local: SocketAddr,
    client: SocketAddr,
    refused: crate::wire::request_check::gate::Refused,
) -> Response<UpBody> {
    let resp = crate::wire::request_check::gate::refused(refused.status);
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
pub(super) fn returned(
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
                let mut abs = crate::nginx::router::absolute_prefix(t, local).into_bytes();
                abs.extend_from_slice(&url);
                url = abs;
            }
        }
        if let Some(v) = crate::nginx::vars::field_value(url) {
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

/// The attempts of an earlier pass of this request (an `error_page`'s).
pub(super) fn earlier_attempts(parts: &Parts) -> &[AttemptRecord] {
    parts
        .extensions
        .get::<EarlierAttempts>()
        .map_or(&[], |e| e.0.as_slice())
}

/// `add_header`s (only `always` ones on other statuses than nginx's
/// list), gzip, and the access log line (nginx's filter order).
pub(super) fn decorate(
    add_headers: &[(HeaderName, crate::nginx::vars::Template, bool)],
    gzip: Option<&vigil_core::config::Gzip>,
    access_log: Option<&crate::obs::log::AccessLogWriter>,
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
        if let Some(v) = crate::nginx::vars::field_value(v) {
            resp.headers_mut().append(name.clone(), v);
        }
    }
    if let Some(g) = gzip {
        resp = crate::nginx::gzip::filter(g, parts, resp);
    }
    match access_log {
        Some(log) => log.attach(cx, parts, resp),
        None => resp,
    }
}
