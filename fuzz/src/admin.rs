//! `admin_query`: a request line's method, target and token through the
//! admin API's decoding (`vigil::admin::Route`) and router
//! (`Admin::handle`, which acts on an in-memory registry); no socket.

use std::path::Path;
use std::sync::Arc;

use http::{Method, Request};
use vigil::admin::{self, Admin, Route};
use vigil_checker::status::StatusPage;
use vigil_config::{literal_resolver, nginx};
use vigil_core::event::EventBus;
use vigil_core::registry::Registry;
use vigil_core::ManualClock;

const TOKEN: &str = "fuzz-token";
/// What a failed reload "said": it must never reach a caller without the token.
const RELOAD_SECRET: &str = "reload-error-quoting-a-secret";

/// Byte 0 picks the method, byte 1 the `Authorization` header, the rest is
/// the request target (`/api/...?...`) as the client sent it.
pub fn admin_query(data: &[u8]) {
    let [m, auth, target @ ..] = data else {
        return;
    };
    let method = match m % 8 {
        0 => Method::GET,
        1 => Method::POST,
        2 => Method::PUT,
        3 => Method::DELETE,
        4 => Method::HEAD,
        5 => Method::OPTIONS,
        6 => Method::PATCH,
        _ => Method::from_bytes(b"PURGE").unwrap_or(Method::GET),
    };
    // The decoder alone, on text no URI parser has checked.
    let text = String::from_utf8_lossy(target);
    let (path, query) = match text.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (&*text, None),
    };
    let _ = Route::decode(&method, path, query);
    let _ = admin::segments(path);
    let _ = admin::parse_query(query.unwrap_or(""));
    // The whole router, on what hyper would hand it.
    let Ok(uri) = http::Uri::try_from(target) else {
        return;
    };
    let mut req = Request::builder().method(method).uri(uri);
    let authorized = auth % 4 == 1;
    match auth % 4 {
        1 => req = req.header("authorization", format!("Bearer {TOKEN}")),
        2 => req = req.header("authorization", "Bearer fuzz-tokeN"),
        3 => {
            if let Ok(v) = http::HeaderValue::from_bytes(target) {
                req = req.header("authorization", v);
            }
        }
        _ => {}
    }
    let Ok(req) = req.body(()) else {
        return;
    };
    let admin = fresh_admin();
    let resp = admin.handle(&req);
    let status = resp.status();
    assert!(
        !status.is_server_error() || status == http::StatusCode::NOT_IMPLEMENTED,
        "{status} for {req:?}"
    );
    // An error may quote the request; only a secret the request did not
    // itself carry (raw or percent-decoded) counts as leaked.
    let decoded = admin::percent_decode_utf8(&text.replace('+', " ")).unwrap_or_default();
    let echoed = text.contains(RELOAD_SECRET) || decoded.contains(RELOAD_SECRET);
    if !authorized && !echoed {
        let body = body_text(resp);
        assert!(
            !body.contains(RELOAD_SECRET),
            "the reload error reached a caller without the token: {req:?}\n{body}"
        );
    }
}

/// A new admin API per input, so that one input's writes do not change the
/// next one's answers: two upstreams, a failed reload on record.
fn fresh_admin() -> Admin {
    let conf = "upstream api { server 10.0.0.1:80; server 10.0.0.2:80 max_fails=2; server [::1]:8080 backup; }
                upstream \"odd name\" { server 10.0.0.9:80; }";
    let config = nginx::load_str(conf, Path::new("f.conf"), Path::new("."), &literal_resolver)
        .map(|l| l.config)
        .unwrap_or_default();
    let clock = Arc::new(ManualClock::at(1_700_000_000_000));
    let events = Arc::new(EventBus::default());
    let reg = Arc::new(Registry::build(
        &config,
        None,
        events.clone(),
        clock.clone(),
    ));
    let r2 = reg.clone();
    let status = StatusPage::new(move || r2.clone());
    let admin = Admin::new(
        move || reg.clone(),
        clock,
        events,
        Some(TOKEN.to_string()),
        status,
    );
    admin.record_reload(&Err(RELOAD_SECRET.to_string()));
    admin
}

fn body_text(resp: http::Response<http_body_util::Full<bytes::Bytes>>) -> String {
    use http_body_util::BodyExt;
    use std::future::Future;
    let body = resp.into_body();
    // `Full` is ready at once: poll it without a runtime.
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    let mut fut = std::pin::pin!(body.collect());
    match fut.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(Ok(c)) => String::from_utf8_lossy(&c.to_bytes()).into_owned(),
        _ => String::new(),
    }
}
