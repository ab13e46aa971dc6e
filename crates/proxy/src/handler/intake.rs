//! A routed request's phases before its content handler, in nginx's
//! order: what it asks for (an upgrade, a body), the gate's header rules
//! with the location's server's settings, the realip module, the access
//! phase, `client_max_body_size`, and its body: read whole (buffered, to
//! replay on a retry) or streamed to the first attempt that connects.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::request::Parts;
use http::StatusCode;
use hyper::Request;

use super::{ClientRequestBody, Cx, Handled, ReqBody};
use crate::conn::client_io::OnClientUpgrade;
use crate::handler::body::{self, BodyError, Buffered, ClientBody, ClientFault, RequestBody};
use crate::nginx::route::Route;
use crate::nginx::status_page::error_page;

/// What the phases leave for the attempts and the answer.
pub(super) struct Intake {
    pub(super) asked: Asked,
    /// The client's side of a switch of protocols, when the request asks
    /// for one and the location passes it on.
    pub(super) on_upgrade: Option<OnClientUpgrade>,
    /// vigil's own HTTP/1 loop writes the response (with its fields as
    /// they came: crate::wire::raw_head); hyper's needs them in the map.
    pub(super) own_writer: bool,
    /// How a streamed body failed on the client's side, if it did.
    pub(super) fault: Option<Arc<ClientFault>>,
    /// The request's `limit_conn` counts, held until it ends (boxed: rare).
    pub(super) held: HeldLimits,
}

/// Run the phases; the client's address in `cx` becomes the realip
/// module's. `Err`: the request is answered already (403, 413, 408, 400).
/// The body, read, is left in `client_body`. An `async` block holding its
/// arguments once (see `super::handle`); reading a body to buffer it is
/// boxed out of it.
#[allow(
    clippy::manual_async_fn,
    reason = "an async fn would hold its arguments twice"
)]
pub(super) fn intake<'a, 'c>(
    cx: &'a mut Cx<'c>,
    parts: &'a mut Parts,
    client_body: &'a mut ClientRequestBody,
) -> impl Future<Output = Result<Intake, Handled>> + use<'a, 'c> {
    async move {
        let route = cx.route;
        // nginx tunnels when the client sent Upgrade and the upstream answered
        // 101 (`u->upgrade`); vigil asks the upstream to switch only where the
        // location passes Upgrade on (see `passes_upgrade`).
        let asked = Asked::of(&parts.headers);
        let own_writer = matches!(client_body, ClientRequestBody::Unread(RequestBody::H1(_)));
        let upgrade =
            parts.version == http::Version::HTTP_11 && asked.upgrade && passes_upgrade(route);
        let on_upgrade = if upgrade {
            let taken = std::mem::replace(parts, Request::new(()).into_parts().0);
            let mut req = Request::from_parts(taken, ());
            let on = crate::conn::client_io::on_upgrade(&mut req);
            *parts = req.into_parts().0;
            Some(on)
        } else {
            None
        };
        // What the gate did to HTTP/1 heads, here for every request (HTTP/2 too),
        // with the settings of the location's server.
        crate::wire::request_check::drop_invalid_headers(&mut parts.headers, &route.client);
        let settings = cx.settings();
        // The realip module, then the access phase (nginx's order).
        let real = crate::nginx::realip::client(
            &settings.server_real_ip,
            &settings.real_ip,
            cx.client,
            &parts.headers,
        );
        if real != cx.client {
            parts
                .extensions
                .insert(crate::nginx::realip::Original(cx.client));
            cx.client = real;
        }
        let cx = &*cx;
        // The preaccess phase (limit_req, limit_conn): out of line, rare.
        let held = match &route.limits {
            None => None,
            Some(limits) => limited(cx, limits, parts).await?,
        };
        if !crate::nginx::access::allows(&settings.access, cx.client.ip()) {
            tracing::debug!(client = %cx.client.ip(), "access forbidden by rule");
            return Err(cx.answer(parts, &[], error_page(StatusCode::FORBIDDEN)));
        }
        let max = settings.client_max_body_size;
        let declared = asked.length;
        // 413 before any attempt: by Content-Length, or while reading the body.
        if max != 0 && declared.is_some_and(|n| n > max) {
            return Err(cx.answer(parts, &[], error_page(StatusCode::PAYLOAD_TOO_LARGE)));
        }
        let has_body = declared.is_some_and(|n| n > 0) || asked.transfer_encoding;
        let mut fault = None;
        let incoming = match client_body {
            ClientRequestBody::Unread(_) => {
                let empty = ClientRequestBody::Read(ReqBody::Buffered(Buffered::Empty));
                match std::mem::replace(client_body, empty) {
                    ClientRequestBody::Unread(i) => Some(i),
                    ClientRequestBody::Read(_) => None,
                }
            }
            // Read by an earlier pass (an error_page's redirect).
            ClientRequestBody::Read(_) => None,
        };
        let read = match incoming {
            None => None,
            Some(_) if !has_body => Some(ReqBody::Buffered(Buffered::Empty)),
            Some(incoming) if settings.request_buffering => match Box::pin(body::buffer(
                incoming,
                max,
                cx.proxy.spool_dir(),
                settings.client_body_timeout,
            ))
            .await
            {
                Ok(b) => Some(ReqBody::Buffered(b)),
                Err(BodyError::TooLarge(_)) => {
                    return Err(cx.answer(parts, &[], error_page(StatusCode::PAYLOAD_TOO_LARGE)))
                }
                // nginx closes without a response and logs 408.
                Err(BodyError::Timeout(_)) => {
                    let timed_out = crate::conn::close_silently(StatusCode::REQUEST_TIMEOUT);
                    return Err(cx.answer(parts, &[], timed_out));
                }
                Err(BodyError::Client(_)) => {
                    return Err(Handled::from(error_page(StatusCode::BAD_REQUEST)))
                }
                Err(BodyError::Spool(e)) => {
                    tracing::error!(error = %e, "cannot spool request body");
                    return Err(Handled::from(error_page(StatusCode::INTERNAL_SERVER_ERROR)));
                }
            },
            Some(incoming) => {
                let streamed = ClientBody::new(incoming, settings.client_body_timeout);
                fault = Some(streamed.fault());
                Some(ReqBody::Stream(std::sync::Mutex::new(Some(streamed))))
            }
        };
        if let Some(b) = read {
            *client_body = ClientRequestBody::Read(b);
        }
        Ok(Intake {
            asked,
            on_upgrade,
            own_writer,
            fault,
            held,
        })
    }
}

/// The `limit_conn` counts a request holds, if any.
type HeldLimits = Option<Box<crate::nginx::limit::Held>>;

/// The preaccess phase of a location with `limits`: what the request
/// holds until it ends, or its answer (the limit's refusal, or 499 for a
/// client that left while delayed). Boxed, so that the intake of a
/// location without limits does not carry its state.
#[inline(never)]
fn limited<'a>(
    cx: &'a Cx<'_>,
    limits: &'a crate::nginx::limit::Limits,
    parts: &'a mut Parts,
) -> Pin<Box<dyn Future<Output = Result<HeldLimits, Handled>> + Send + 'a>> {
    Box::pin(async move {
        let net = (cx.client, cx.local, cx.conn);
        let now = cx.proxy.clock().now().0;
        match crate::nginx::limit::preaccess(
            limits,
            &cx.route.proxy_host,
            cx.target,
            net,
            parts,
            now,
        )
        .await
        {
            Ok(h) => Ok(h.map(Box::new)),
            Err(refused) => Err(cx.answer(parts, &[], refused.response())),
        }
    })
}

/// The request fields the proxying reads: whether it asks to upgrade, its
/// length (the first `Content-Length`, as a lookup finds it), whether it
/// has a `Transfer-Encoding`, and its first `Host` (for the error log).
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Asked {
    upgrade: bool,
    length: Option<u64>,
    transfer_encoding: bool,
    pub(super) host: Option<HeaderValue>,
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

pub(super) fn content_length(h: &HeaderMap) -> Option<u64> {
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
            .any(|(n, _, v)| n == name && v.is_some())
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
