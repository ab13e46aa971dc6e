//! The live web dashboard on the admin listener (`GET /`), and the list of
//! endpoints that `GET /` answers instead when the dashboard is off
//! (`--no-dashboard`, `[admin] dashboard = false`).
//!
//! The page is rendered on the server ([`render`]) and reads without
//! JavaScript. Its script (`/dashboard.js`, embedded like the style sheet)
//! fetches `/dashboard/upstreams` (the tables alone) and
//! `/api/events?since=` every second, swaps the tables in, draws each
//! peer's recent latency from the figures it polled, and enables the
//! drain / up / down buttons once an admin token is entered (kept in the
//! tab's `sessionStorage`, sent only as `Authorization: Bearer`).
//!
//! Every dashboard response carries a strict Content-Security-Policy
//! (scripts and styles from this origin only, no inline script, no
//! framing, no form targets), `X-Content-Type-Options: nosniff` and
//! `Cache-Control: no-store`.

mod html;
mod render;

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::Full;
use vigil_core::api::{self, EventView, NginxSyncView, UpstreamView};

use super::route::DashboardAsset;
use super::Admin;

/// The policy of the dashboard page: nothing but this origin's script,
/// style sheet and API; no inline script or style, no plugins, no frames.
pub const PAGE_CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; \
     frame-ancestors 'none'";

/// The policy of the endpoint list and the embedded files: nothing at all.
pub const STATIC_CSP: &str =
    "default-src 'none'; style-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// Every endpoint of the admin listener, for `GET /` (and the page's footer).
pub const ENDPOINTS: &[(&str, &str)] = &[
    (
        "GET /",
        "this dashboard (or this list, with the dashboard off)",
    ),
    ("GET /api/status", "every upstream and peer, JSON"),
    ("GET /api/upstreams/NAME", "one upstream, JSON"),
    (
        "GET /api/explain?upstream=U[&peer=P]",
        "why a peer does or does not get traffic, in sentences",
    ),
    (
        "GET /api/events?since=SEQ&limit=N[&upstream=U]",
        "the transition log",
    ),
    (
        "GET /api/config",
        "configuration generation and the last reload",
    ),
    (
        "GET /api/fleet",
        "fleet mode: members, who probes what, where each verdict came from",
    ),
    (
        "POST /api/peers/UPSTREAM/PEER/{up,down,drain}",
        "admin state (Authorization: Bearer TOKEN)",
    ),
    (
        "POST /api/reload",
        "reload the configuration (Authorization: Bearer TOKEN)",
    ),
    (
        "GET /status",
        "tengine's status page (?format=json, ?format=csv)",
    ),
    ("GET /metrics", "Prometheus metrics"),
];

pub(crate) const SCRIPT: &str = include_str!("dashboard.js");
const STYLE: &str = include_str!("dashboard.css");

/// What one rendering of the dashboard shows: one registry snapshot.
pub(crate) struct Page {
    generation: u64,
    now_unix_ms: u64,
    upstreams: Vec<UpstreamPage>,
    nginx: Option<NginxSyncView>,
    events: Vec<EventView>,
    next_seq: u64,
    writes_enabled: bool,
}

/// One upstream with its explain sentences.
pub(crate) struct UpstreamPage {
    view: UpstreamView,
    /// `explain_rules`.
    rules: Vec<String>,
    /// `explain`, per peer in view order.
    sentences: Vec<Vec<String>>,
}

// === impl Admin (dashboard) ===

impl Admin {
    /// `GET /`.
    pub(super) fn index(&self) -> Response<Full<Bytes>> {
        if !self.dashboard {
            return endpoint_list();
        }
        respond(
            "text/html; charset=utf-8",
            PAGE_CSP,
            render::page(&self.dashboard_page(true)),
        )
    }

    /// `GET /dashboard/upstreams`.
    pub(super) fn dashboard_upstreams(&self) -> Response<Full<Bytes>> {
        if !self.dashboard {
            return not_found();
        }
        respond(
            "text/html; charset=utf-8",
            PAGE_CSP,
            render::upstreams(&self.dashboard_page(false)),
        )
    }

    /// `GET /dashboard.js`, `GET /dashboard.css`.
    pub(super) fn dashboard_asset(&self, asset: DashboardAsset) -> Response<Full<Bytes>> {
        if !self.dashboard {
            return not_found();
        }
        match asset {
            DashboardAsset::Script => respond("text/javascript; charset=utf-8", STATIC_CSP, SCRIPT),
            DashboardAsset::Style => respond("text/css; charset=utf-8", STATIC_CSP, STYLE),
        }
    }

    /// One snapshot: the registry is read once, so every table of a
    /// rendering shows the same generation.
    fn dashboard_page(&self, with_events: bool) -> Page {
        let reg = (self.registry)();
        let now = self.clock.now();
        let all = self.events.since(0, usize::MAX);
        let views: Vec<EventView> = all.events.iter().map(api::event_view).collect();
        let upstreams = reg
            .upstreams()
            .iter()
            .map(|u| {
                let view = self.annotated(api::upstream_view(u, &*self.clock, now));
                let own: Vec<EventView> = views
                    .iter()
                    .filter(|e| e.upstream == view.name)
                    .cloned()
                    .collect();
                let sentences = view
                    .peers
                    .iter()
                    .map(|p| api::explain(&view, p, &own))
                    .collect();
                UpstreamPage {
                    rules: api::explain_rules(&view),
                    sentences,
                    view,
                }
            })
            .collect();
        let events = if with_events {
            let skip = views.len().saturating_sub(render::PAGE_EVENTS);
            views.into_iter().skip(skip).collect()
        } else {
            Vec::new()
        };
        Page {
            generation: reg.generation(),
            now_unix_ms: self.clock.unix_ms(now),
            upstreams,
            nginx: self.nginx_status.as_ref().map(|f| f()),
            events,
            next_seq: all.next,
            writes_enabled: self.token.is_some(),
        }
    }
}

/// `GET /` with the dashboard off: the endpoints, as a small HTML page.
fn endpoint_list() -> Response<Full<Bytes>> {
    let mut o = String::from(
        "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <title>vigil admin API</title>\n</head>\n<body>\n<h1>vigil admin API</h1>\n\
         <p>The dashboard is off (<code>--no-dashboard</code> or <code>[admin] dashboard = false</code>). Endpoints:</p>\n",
    );
    render::endpoints_into(&mut o);
    o.push_str("</body>\n</html>\n");
    respond("text/html; charset=utf-8", STATIC_CSP, o)
}

fn not_found() -> Response<Full<Bytes>> {
    super::error(
        StatusCode::NOT_FOUND,
        "the dashboard is off (--no-dashboard or [admin] dashboard = false); GET / lists the endpoints".into(),
    )
}

fn respond(
    content_type: &'static str,
    csp: &'static str,
    body: impl Into<Bytes>,
) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(csp),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    super::no_store(h);
    r
}

#[cfg(test)]
mod tests;
