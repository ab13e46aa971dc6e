//! The upstream request of an attempt: its head written from the
//! client's request (its fields less the hop-by-hop ones, `Host`, the
//! `proxy_set_header`s) where the attempt's client takes it, and the check
//! that its target can go on a request line at all.

use std::net::SocketAddr;

use http::header::{self, HeaderValue};
use http::request::Parts;

use super::upstream_head::Fields;
use super::{Cx, ReqBody};
use crate::handler::body::UpBody;
use crate::nginx::route::Route;
use crate::nginx::router::Target;
use crate::upstream::{HeadOut, Written};

/// The request of one attempt, its head written in the connection's
/// `room` from the field list (the target as it is: checked by
/// [`sendable`] before any attempt).
pub(super) fn build_request(
    cx: &Cx<'_>,
    parts: &Parts,
    uri: &str,
    body: UpBody,
    len: Option<u64>,
    upgrade: bool,
    room: HeadOut<'_>,
) -> (Written, UpBody) {
    let head = cx.conn.request_head();
    let mut fields = request_fields(
        cx.route,
        parts,
        head.as_ref(),
        cx.target,
        cx.client,
        cx.local,
        &len,
        upgrade,
    );
    let written = room.write(&parts.method, uri, &mut fields, &body);
    (written, body)
}

/// The upstream request's header fields: the client's without the
/// hop-by-hop ones (each under the name's spelling in `head`, the
/// client's request head, where there is one), then (in this order)
/// `Host`, `Content-Length`, the `proxy_set_header`s (under the names as
/// written) and `Upgrade`/`Connection`.
#[allow(
    clippy::too_many_arguments,
    reason = "the parts of one request, each read once"
)]
pub(super) fn request_fields<'p>(
    route: &'p Route,
    parts: &'p Parts,
    head: Option<&'p bytes::Bytes>,
    target: Option<&Target>,
    client: SocketAddr,
    local: SocketAddr,
    len: &Option<u64>,
    upgrade: bool,
) -> Fields<'p> {
    use crate::upstream::put::{CONNECTION, CONTENT_LENGTH, HOST};
    let mut fields = Fields::without_hop_by_hop(&parts.headers, head, 3 + route.set_headers.len());
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
        for (name, spelt, tpl) in &route.set_headers {
            fields.remove(name);
            if let Some(t) = tpl {
                // The value's bytes as they came (a client's obs-text too);
                // an empty one sends no field, as nginx.
                let v = t.expand(&cx);
                if !v.is_empty() {
                    if let Some(v) = crate::nginx::vars::field_value(v) {
                        fields.insert_spelt(name, spelt.as_bytes(), v);
                    }
                }
            }
        }
    }
    // The location's own `proxy_set_header Connection` (`""`: none, as
    // nginx's keepalive recipe writes; `close`) replaces nginx's default
    // `Connection: close` and vigil's `keep-alive` to a pool.
    let sets_connection = route
        .set_headers
        .iter()
        .any(|(n, _, _)| *n == header::CONNECTION);
    match upgrade {
        // The location's proxy_set_header put Upgrade and Connection.
        true if fields.contains(&header::UPGRADE) => {}
        _ if sets_connection => {
            fields.remove(&header::UPGRADE);
        }
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

/// Whether `uri` can be the target of the upstream request line. nginx
/// sends the URI it made as it is (a `$1` or `$uri` of `proxy_pass` may
/// hold a space, `<`, a control byte...), and so does vigil's own client;
/// but a CR, LF or NUL would end or split the request line (a second
/// request the client wrote), so vigil refuses those (nginx sends them).
pub(super) fn sendable(uri: &str) -> Result<(), String> {
    if let Some(b) = uri.bytes().find(|b| matches!(b, b'\r' | b'\n' | 0)) {
        return Err(format!(
            "its URI holds the byte 0x{b:02x}, which would end its request line"
        ));
    }
    Ok(())
}

/// The body's length, when it is known before it is sent (a buffered one).
pub(super) fn body_len(body: &ReqBody) -> Option<u64> {
    match body {
        ReqBody::Buffered(b) => Some(b.len()),
        ReqBody::Stream(_) => None,
    }
}
