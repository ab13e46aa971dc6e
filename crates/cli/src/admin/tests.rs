//! The admin router called in-process, and once over a socket.

use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use vigil_checker::status::StatusPage;
use vigil_core::config::{literal_resolver, nginx};
use vigil_core::event::EventBus;
use vigil_core::peer::AdminState;
use vigil_core::registry::Registry;
use vigil_core::{Clock, ManualClock};

use super::Admin;

fn setup(token: Option<&str>) -> (Admin, Arc<Registry>) {
    let conf = "upstream api { server 10.0.0.1:80; server 10.0.0.2:80 max_fails=2; }
                upstream solo { server 10.0.0.9:80; }";
    let loaded =
        nginx::load_str(conf, "t.conf".as_ref(), ".".as_ref(), &literal_resolver).expect("conf");
    let clock = Arc::new(ManualClock::at(1_700_000_000_000));
    let events = Arc::new(EventBus::default());
    let reg = Arc::new(Registry::build(
        &loaded.config,
        None,
        events.clone(),
        clock.clone(),
    ));
    let r2 = reg.clone();
    let status = StatusPage::new(move || r2.clone());
    let r3 = reg.clone();
    let admin = Admin::new(
        move || r3.clone(),
        clock,
        events,
        token.map(String::from),
        status,
    );
    (admin, reg)
}

async fn call(
    admin: &Admin,
    method: Method,
    uri: &str,
    token: Option<&str>,
) -> (StatusCode, serde_json::Value) {
    let mut b = Request::builder().method(method).uri(uri);
    if let Some(t) = token {
        b = b.header("authorization", format!("Bearer {t}"));
    }
    let req = b.body(()).expect("request");
    let resp = admin.handle(&req);
    let status = resp.status();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    let v = serde_json::from_slice(&body).unwrap_or(serde_json::Value::String(
        String::from_utf8_lossy(&body).into(),
    ));
    (status, v)
}

#[tokio::test]
async fn status_lists_every_upstream_and_peer() {
    let (admin, _) = setup(None);
    let (st, v) = call(&admin, Method::GET, "/api/status", None).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(v["generation"], 1);
    assert_eq!(v["upstreams"][0]["name"], "api");
    assert_eq!(v["upstreams"][0]["peers"][1]["address"], "10.0.0.2:80");
    assert_eq!(v["upstreams"][0]["peers"][1]["max_fails"], 2);
    assert_eq!(v["upstreams"][0]["peers"][1]["state"], "eligible");
    assert_eq!(v["upstreams"][1]["single"], true);
    let (st, v) = call(&admin, Method::GET, "/api/upstreams/solo", None).await;
    assert_eq!(
        (st, v["peers"][0]["address"].as_str()),
        (StatusCode::OK, Some("10.0.0.9:80"))
    );
    assert_eq!(
        call(&admin, Method::GET, "/api/upstreams/nope", None)
            .await
            .0,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn writes_need_the_bearer_token_and_take_effect_at_once() {
    let (open, _) = setup(None);
    let (st, v) = call(
        &open,
        Method::POST,
        "/api/peers/api/10.0.0.1:80/down",
        Some("x"),
    )
    .await;
    assert_eq!(
        st,
        StatusCode::FORBIDDEN,
        "no token configured: writes disabled ({v})"
    );

    let (admin, reg) = setup(Some("s3cret"));
    assert_eq!(
        call(
            &admin,
            Method::POST,
            "/api/peers/api/10.0.0.1:80/down",
            None
        )
        .await
        .0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        call(
            &admin,
            Method::POST,
            "/api/peers/api/10.0.0.1:80/down",
            Some("wrong")
        )
        .await
        .0,
        StatusCode::UNAUTHORIZED
    );
    let (st, v) = call(
        &admin,
        Method::POST,
        "/api/peers/api/10.0.0.1%3A80/drain",
        Some("s3cret"),
    )
    .await;
    assert_eq!(
        (st, v["from"].as_str(), v["to"].as_str()),
        (StatusCode::OK, Some("up"), Some("drain"))
    );
    let peer = reg
        .get("api")
        .expect("api")
        .peer_by_name("10.0.0.1:80")
        .expect("peer")
        .clone();
    assert_eq!(
        peer.admin(),
        AdminState::Drain,
        "the proxy's record changed"
    );
    assert!(!peer.is_routable());
    let (_, v) = call(&admin, Method::GET, "/api/events", None).await;
    assert_eq!(v["events"][0]["kind"], "admin");
    assert_eq!(v["events"][0]["text"], "admin state up -> drain");
    let (st, _) = call(
        &admin,
        Method::POST,
        "/api/peers/api/10.0.0.1:80/sideways",
        Some("s3cret"),
    )
    .await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    let (st, _) = call(
        &admin,
        Method::POST,
        "/api/peers/api/10.9.9.9:80/down",
        Some("s3cret"),
    )
    .await;
    assert_eq!(st, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn explain_answers_in_sentences() {
    let (admin, reg) = setup(Some("t"));
    let up = reg.get("api").expect("api");
    up.set_admin(
        vigil_core::peer::PeerId(1),
        AdminState::Down,
        ManualClock::at(0).now(),
    );
    let (st, v) = call(
        &admin,
        Method::GET,
        "/api/explain?upstream=api&peer=10.0.0.2:80",
        None,
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    let s = v["peers"][0]["sentences"][0].as_str().unwrap_or("");
    assert!(
        s.starts_with("10.0.0.2:80 gets no traffic: an operator set it down"),
        "{s}"
    );
    let (_, v) = call(&admin, Method::GET, "/api/explain?upstream=api", None).await;
    assert_eq!(v["peers"].as_array().map(Vec::len), Some(2));
    assert_eq!(
        call(&admin, Method::GET, "/api/explain", None).await.0,
        StatusCode::BAD_REQUEST
    );
}

#[tokio::test]
async fn reload_runs_the_callback_and_is_reported() {
    let (admin, _) = setup(Some("t"));
    assert_eq!(
        call(&admin, Method::POST, "/api/reload", Some("t")).await.0,
        StatusCode::NOT_IMPLEMENTED
    );
    admin.set_reload(|| Err("t.conf:3:1: unexpected \"}\"".into()));
    let (st, v) = call(&admin, Method::POST, "/api/reload", Some("t")).await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(v["error"]
        .as_str()
        .is_some_and(|e| e.contains("t.conf:3:1")));
    let (_, v) = call(&admin, Method::GET, "/api/config", None).await;
    assert_eq!(v["last_reload"]["ok"], false);
}

#[tokio::test]
async fn status_page_and_metrics_are_mounted() {
    let (admin, _) = setup(None);
    let req = Request::builder()
        .uri("/status?format=json")
        .body(())
        .expect("req");
    let resp = admin.handle(&req);
    assert_eq!(resp.status(), StatusCode::OK);
    let req = Request::builder().uri("/metrics").body(()).expect("req");
    let body = admin
        .handle(&req)
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    assert!(String::from_utf8_lossy(&body).contains("# TYPE"));
}

#[tokio::test]
async fn over_a_socket() {
    let (admin, _) = setup(Some("tok"));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let stop = tokio_util::sync::CancellationToken::new();
    tokio::spawn(admin.serve(listener, stop.clone()));
    let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (mut tx, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .expect("handshake");
    tokio::spawn(conn);
    let req = Request::builder()
        .method(Method::POST)
        .uri("/api/peers/api/10.0.0.2:80/down")
        .header("host", "admin")
        .header("authorization", "Bearer tok")
        .body(Full::new(Bytes::new()))
        .expect("req");
    let resp = tx.send_request(req).await.expect("response");
    assert_eq!(resp.status(), StatusCode::OK);
    stop.cancel();
}

#[tokio::test]
async fn a_public_listen_address_needs_a_token() {
    let (admin, _) = setup(None);
    let err = admin
        .listen(
            "0.0.0.0:0".parse().expect("addr"),
            tokio_util::sync::CancellationToken::new(),
        )
        .await
        .expect_err("refused");
    assert!(err.to_string().contains("not loopback"));
}
