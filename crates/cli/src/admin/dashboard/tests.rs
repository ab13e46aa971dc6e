//! The dashboard's routes called in-process: types, headers, escaping,
//! the off switch, and that its buttons stay inert without the token.

use std::sync::Arc;

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use vigil_core::peer::{AdminState, PeerId};
use vigil_core::registry::Registry;
use vigil_core::{Clock, ManualClock};

use super::{PAGE_CSP, SCRIPT};
use crate::admin::{Admin, DashboardAsset, Route};

const HOSTILE: &str = "<script>alert(1)</script>";

fn setup(conf: &str, token: Option<&str>) -> (Admin, Arc<Registry>) {
    crate::admin::tests::setup_with(conf, token)
}

fn plain() -> &'static str {
    "upstream api { server 10.0.0.1:80; server 10.0.0.2:80 max_fails=2 weight=3; }"
}

fn get(admin: &Admin, uri: &str) -> Response<Full<Bytes>> {
    request(admin, Method::GET, uri, None)
}

fn request(admin: &Admin, method: Method, uri: &str, token: Option<&str>) -> Response<Full<Bytes>> {
    let mut b = Request::builder().method(method).uri(uri);
    if let Some(t) = token {
        b = b.header(header::AUTHORIZATION, format!("Bearer {t}"));
    }
    admin.handle(&b.body(()).expect("request"))
}

async fn text(r: Response<Full<Bytes>>) -> String {
    let body = r.into_body().collect().await.expect("body").to_bytes();
    String::from_utf8(body.to_vec()).expect("UTF-8")
}

fn header(r: &Response<Full<Bytes>>, name: header::HeaderName) -> &str {
    r.headers()
        .get(&name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_else(|| panic!("no {name} header"))
}

/// The `<tr>` of `peer`, as rendered.
fn row<'a>(html: &'a str, peer: &str) -> &'a str {
    let at = html
        .find(&format!("data-peer=\"{peer}\""))
        .unwrap_or_else(|| panic!("no row for {peer} in {html}"));
    let end = html[at..].find("</tr>").map_or(html.len(), |e| at + e);
    &html[at..end]
}

#[test]
fn the_routes_decode() {
    let r = |m: &Method, p: &str| Route::decode(m, p, None).expect("decodes");
    assert_eq!(r(&Method::GET, "/"), Route::Index);
    assert_eq!(
        r(&Method::GET, "/dashboard/upstreams"),
        Route::DashboardUpstreams
    );
    assert_eq!(
        r(&Method::GET, "/dashboard.js"),
        Route::DashboardAsset(DashboardAsset::Script)
    );
    assert_eq!(
        r(&Method::GET, "/dashboard.css"),
        Route::DashboardAsset(DashboardAsset::Style)
    );
    assert_eq!(r(&Method::POST, "/"), Route::NotFound);
    assert_eq!(r(&Method::GET, "/dashboard.js/x"), Route::NotFound);
}

#[tokio::test]
async fn the_page_is_html_under_a_strict_policy_and_never_cached() {
    let (admin, _) = setup(plain(), Some("s3cret"));
    let r = get(&admin, "/");
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(header(&r, header::CONTENT_TYPE), "text/html; charset=utf-8");
    let csp = header(&r, header::CONTENT_SECURITY_POLICY);
    assert_eq!(csp, PAGE_CSP);
    assert!(csp.contains("script-src 'self'") && csp.contains("default-src 'none'"));
    assert!(!csp.contains("unsafe"), "{csp}");
    assert_eq!(header(&r, header::X_CONTENT_TYPE_OPTIONS), "nosniff");
    assert_eq!(header(&r, header::CACHE_CONTROL), "no-store");
    assert_eq!(header(&r, header::X_FRAME_OPTIONS), "DENY");
    let html = text(r).await;
    // The one script is the embedded file: no inline script to allow.
    assert_eq!(html.matches("<script").count(), 1, "{html}");
    assert!(html.contains("<script src=\"/dashboard.js\" defer></script>"));
    assert!(
        !html.contains(" style=") && !html.contains("<style"),
        "inline style"
    );
    // The table reads without JavaScript: every peer with its figures.
    let second = row(&html, "10.0.0.2:80");
    assert!(second.contains("data-state=\"eligible\""), "{second}");
    assert!(second.contains("0 failure(s), limit 2 in 10 s"), "{second}");
    assert!(second.contains("<td class=\"weight\">3 / 3"), "{second}");
    assert!(second.contains("no check"), "{second}");
    assert!(
        second.contains("10.0.0.2:80 is eligible"),
        "the explain sentence: {second}"
    );
    assert!(row(&html, "10.0.0.1:80").contains("<code>10.0.0.1:80</code>"));
    assert!(html.contains("data-writes=\"enabled\""));
}

#[tokio::test]
async fn the_embedded_files_have_their_types() {
    let (admin, _) = setup(plain(), None);
    let js = get(&admin, "/dashboard.js");
    assert_eq!(js.status(), StatusCode::OK);
    assert_eq!(
        header(&js, header::CONTENT_TYPE),
        "text/javascript; charset=utf-8"
    );
    assert_eq!(header(&js, header::X_CONTENT_TYPE_OPTIONS), "nosniff");
    assert!(text(js).await.contains("/dashboard/upstreams"));
    let css = get(&admin, "/dashboard.css");
    assert_eq!(
        header(&css, header::CONTENT_TYPE),
        "text/css; charset=utf-8"
    );
    assert!(text(css).await.contains("table.peers"));
}

#[tokio::test]
async fn hostile_names_and_texts_are_escaped() {
    let conf = format!("upstream {HOSTILE} {{ server 10.0.0.1:80; server 10.0.0.2:80; }}");
    let (admin, reg) = setup(&conf, Some("t"));
    let up = reg.get(HOSTILE).expect("the upstream keeps its name");
    up.set_admin(PeerId(1), AdminState::Drain, ManualClock::at(0).now());
    for uri in ["/", "/dashboard/upstreams"] {
        let html = text(get(&admin, uri)).await;
        assert!(
            !html.contains(HOSTILE),
            "{uri} carries the raw name: {html}"
        );
        assert!(
            html.contains("data-upstream=\"&lt;script&gt;alert(1)&lt;/script&gt;\""),
            "{uri}: {html}"
        );
        assert!(html.contains("<h2>&lt;script&gt;alert(1)&lt;/script&gt;</h2>"));
        assert_eq!(html.matches("<script").count(), usize::from(uri == "/"));
    }
    // The event log names the upstream too.
    let html = text(get(&admin, "/")).await;
    let log = &html[html.find("id=\"events\"").expect("log")..];
    assert!(
        log.contains("<code>&lt;script&gt;alert(1)&lt;/script&gt;</code>"),
        "{log}"
    );
}

#[tokio::test]
async fn the_tables_alone_follow_the_state() {
    let (admin, reg) = setup(plain(), Some("t"));
    let before = text(get(&admin, "/dashboard/upstreams")).await;
    assert!(!before.contains("<html"), "a fragment: {before}");
    assert!(row(&before, "10.0.0.1:80").contains("data-state=\"eligible\""));
    let up = reg.get("api").expect("api");
    up.set_admin(PeerId(0), AdminState::Drain, ManualClock::at(0).now());
    let r = get(&admin, "/dashboard/upstreams");
    assert_eq!(header(&r, header::CACHE_CONTROL), "no-store");
    let after = text(r).await;
    let first = row(&after, "10.0.0.1:80");
    assert!(first.contains("data-state=\"draining\""), "{first}");
    assert!(first.contains("an operator set it to drain"), "{first}");
}

#[tokio::test]
async fn without_a_configured_token_the_page_says_why_the_buttons_are_off() {
    let (admin, _) = setup(plain(), None);
    let html = text(get(&admin, "/")).await;
    assert!(html.contains("data-writes=\"disabled\""));
    assert!(html.contains("this server has no admin token configured"));
    assert!(!html.contains("id=\"token\""), "no token field to fill");
    let buttons = html
        .matches("<button type=\"button\" class=\"act\"")
        .count();
    assert_eq!(buttons, 6, "drain, up, down for two peers");
    assert_eq!(html.matches(" disabled title=").count(), buttons);
    // And the API refuses the write the buttons would send.
    let r = request(
        &admin,
        Method::POST,
        "/api/peers/api/10.0.0.1:80/drain",
        None,
    );
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn mutations_need_the_token_the_page_sends_only_as_a_header() {
    let (admin, reg) = setup(plain(), Some("s3cret"));
    let html = text(get(&admin, "/")).await;
    assert!(html.contains("type=\"password\""));
    assert!(
        !html.contains("<form"),
        "no form could put the token in a URL"
    );
    for t in [None, Some("wrong")] {
        let r = request(&admin, Method::POST, "/api/peers/api/10.0.0.1%3A80/down", t);
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "token {t:?}");
    }
    let peer = reg
        .get("api")
        .and_then(|u| u.peer_by_name("10.0.0.1:80").cloned());
    assert_eq!(peer.map(|p| p.admin()), Some(AdminState::Up));
    // The script sends the token in the Authorization header, never in a URL.
    assert!(SCRIPT.contains("Authorization: \"Bearer \" + t"));
    assert!(!SCRIPT.contains("token="), "a token in a query string");
    assert!(SCRIPT.contains("sessionStorage"));
    assert!(!SCRIPT.contains("localStorage"));
}

#[tokio::test]
async fn with_the_dashboard_off_the_root_lists_the_endpoints() {
    let (admin, _) = setup(plain(), None);
    let admin = admin.with_dashboard(false);
    let r = get(&admin, "/");
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(header(&r, header::CONTENT_TYPE), "text/html; charset=utf-8");
    assert!(header(&r, header::CONTENT_SECURITY_POLICY).starts_with("default-src 'none'"));
    let html = text(r).await;
    assert!(html.contains("The dashboard is off"), "{html}");
    for path in [
        "GET /api/status",
        "GET /api/events",
        "GET /status",
        "GET /metrics",
    ] {
        assert!(html.contains(path), "{path} missing: {html}");
    }
    assert!(!html.contains("<script"));
    for uri in ["/dashboard.js", "/dashboard.css", "/dashboard/upstreams"] {
        assert_eq!(get(&admin, uri).status(), StatusCode::NOT_FOUND, "{uri}");
    }
}

#[tokio::test]
async fn api_answers_are_never_cached_or_sniffed() {
    let (admin, _) = setup(plain(), None);
    for uri in ["/api/status", "/api/events", "/api/nope"] {
        let r = get(&admin, uri);
        assert_eq!(header(&r, header::CACHE_CONTROL), "no-store", "{uri}");
        assert_eq!(
            header(&r, header::X_CONTENT_TYPE_OPTIONS),
            "nosniff",
            "{uri}"
        );
    }
}
