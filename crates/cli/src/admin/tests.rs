//! The admin router called in-process, and once over a socket.

use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use vigil_checker::status::StatusPage;
use vigil_config::{literal_resolver, nginx};
use vigil_core::event::EventBus;
use vigil_core::peer::AdminState;
use vigil_core::registry::Registry;
use vigil_core::{Clock, ManualClock};

use super::{Admin, Route};

fn setup(token: Option<&str>) -> (Admin, Arc<Registry>) {
    setup_with(
        "upstream api { server 10.0.0.1:80; server 10.0.0.2:80 max_fails=2; }
         upstream solo { server 10.0.0.9:80; }",
        token,
    )
}

/// An admin API over `conf` (nginx.conf text) on a manual clock, with
/// `token` for mutations; the dashboard's tests use it too.
pub(crate) fn setup_with(conf: &str, token: Option<&str>) -> (Admin, Arc<Registry>) {
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
async fn the_fleet_endpoint_serves_the_fleet_view_or_says_there_is_none() {
    let (admin, _) = setup(None);
    let (st, v) = call(&admin, Method::GET, "/api/fleet", None).await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    assert!(v["error"]
        .as_str()
        .is_some_and(|e| e.contains("not in a fleet")));
    let admin = admin.with_fleet(|| serde_json::json!({"fleet": "edge", "members": ["m1"]}));
    let (st, v) = call(&admin, Method::GET, "/api/fleet", None).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(v["members"][0], "m1");
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
        .header("host", "127.0.0.1")
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

/// Write `raw` on a fresh connection to `addr` and read until the server closes.
async fn raw_exchange(addr: std::net::SocketAddr, raw: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(raw).await.expect("write");
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.expect("read");
    String::from_utf8_lossy(&out).into_owned()
}

async fn serving(admin: Admin) -> (std::net::SocketAddr, tokio_util::sync::CancellationToken) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let stop = tokio_util::sync::CancellationToken::new();
    tokio::spawn(admin.serve(listener, stop.clone()));
    (addr, stop)
}

#[tokio::test]
async fn the_issues_query_is_answered_not_a_panic() {
    // Issue item 6: `%` followed by a multi-byte character sliced a &str
    // inside the character, before authentication.
    assert_eq!(
        Route::decode(&Method::GET, "/api/status", Some("x=%€")),
        Ok(Route::Status)
    );
    assert_eq!(
        super::parse_query("x=%€&y=%e2%82%ac&z=a+b%2Bc%"),
        Ok([("x", "%€"), ("y", "€"), ("z", "a b+c%")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect())
    );
    let (admin, _) = setup(None);
    let (addr, stop) = serving(admin).await;
    let reply = raw_exchange(
        addr,
        b"GET /api/status?x=%\xe2\x82\xac HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(
        reply.starts_with("HTTP/1.1 200"),
        "answered, not dropped: {reply}"
    );
    stop.cancel();
}

#[tokio::test]
async fn undecodable_input_is_a_400_that_says_why() {
    let (admin, _) = setup(Some("t"));
    let (st, v) = call(&admin, Method::GET, "/api/explain?upstream=%FF", None).await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    assert_eq!(
        v["error"],
        "the value of query parameter \"upstream\" is not UTF-8 after percent-decoding"
    );
    let (st, v) = call(&admin, Method::GET, "/api/upstreams/%C3%28", None).await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    assert_eq!(
        v["error"],
        "path segment \"%C3%28\" is not UTF-8 after percent-decoding"
    );
    let (st, v) = call(&admin, Method::GET, "/api/events?since=-1", None).await;
    assert_eq!(
        (st, v["error"].as_str()),
        (
            StatusCode::BAD_REQUEST,
            Some("since=\"-1\" is not a non-negative integer")
        )
    );
    let (st, _) = call(
        &admin,
        Method::POST,
        "/api/peers/api/10.0.0.1%3A80%FF/down",
        Some("t"),
    )
    .await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    // Every segment is decoded, the upstream's too (the CLI encodes both).
    let (st, v) = call(&admin, Method::GET, "/api/upstreams/so%6Co", None).await;
    assert_eq!((st, v["name"].as_str()), (StatusCode::OK, Some("solo")));
    let (st, _) = call(&admin, Method::DELETE, "/api/reload", Some("t")).await;
    assert_eq!(st, StatusCode::METHOD_NOT_ALLOWED);
}

#[tokio::test]
async fn the_token_check_takes_any_header_bytes() {
    let (admin, _) = setup(Some("s3cret"));
    for given in [
        &b"Bearer s3cre"[..],
        b"Bearer s3cret2",
        b"Bearer \xff\xfe",
        b"bearer s3cret",
        b"Bearer",
        b"",
    ] {
        let req = Request::builder()
            .method(Method::POST)
            .uri("/api/reload")
            .header(
                "authorization",
                http::HeaderValue::from_bytes(given).expect("header value"),
            )
            .body(())
            .expect("request");
        assert_eq!(
            admin.handle(&req).status(),
            StatusCode::UNAUTHORIZED,
            "{}",
            String::from_utf8_lossy(given)
        );
    }
    assert!(super::token_matches(b"s3cret", b"s3cret"));
}

#[tokio::test]
async fn config_shows_the_reload_error_only_with_the_token() {
    let (admin, _) = setup(Some("t"));
    let secret = "nginx.conf:7:5: invalid value \"Basic dXNlcjpwYXNz\" in \"proxy_set_header\"";
    admin.record_reload(&Err(secret.into()));
    let (st, v) = call(&admin, Method::GET, "/api/config", None).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(v["last_reload"]["ok"], false);
    assert!(v["last_reload"]["error"].is_null(), "{v}");
    let withheld = v["last_reload"]["error_withheld"].as_str().unwrap_or("");
    assert!(
        withheld.starts_with("last reload failed at Tue, 14 Nov 2023 22:13:20 GMT;"),
        "{withheld}"
    );
    assert!(!v.to_string().contains("dXNlcjpwYXNz"), "{v}");
    let (_, v) = call(&admin, Method::GET, "/api/config", Some("wrong")).await;
    assert!(v["last_reload"]["error"].is_null(), "{v}");
    let (_, v) = call(&admin, Method::GET, "/api/config", Some("t")).await;
    assert_eq!(v["last_reload"]["error"], secret);
    assert!(v["last_reload"]["error_withheld"].is_null(), "{v}");
    // A successful reload has nothing to withhold.
    admin.record_reload(&Ok(2));
    let (_, v) = call(&admin, Method::GET, "/api/config", None).await;
    assert_eq!(
        (
            v["last_reload"]["ok"].as_bool(),
            v["last_reload"]["generation"].as_u64()
        ),
        (Some(true), Some(2))
    );
}

#[tokio::test(start_paused = true)]
async fn a_silent_connection_is_closed_after_the_header_timeout() {
    use tokio::io::AsyncReadExt;
    let (admin, _) = setup(None);
    let (addr, stop) = serving(admin).await;
    let started = tokio::time::Instant::now();
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let mut buf = [0u8; 64];
    // Never sends a byte: the server closes it (EOF, or a reset).
    let n = tokio::time::timeout(super::HEADER_TIMEOUT * 2, s.read(&mut buf))
        .await
        .expect("closed by the server")
        .unwrap_or(0);
    assert_eq!(n, 0, "{:?}", String::from_utf8_lossy(&buf[..n]));
    assert!(
        started.elapsed() >= super::HEADER_TIMEOUT,
        "closed by the header timer, not at once ({:?})",
        started.elapsed()
    );
    stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn an_idle_kept_alive_connection_is_closed_too() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (admin, _) = setup(None);
    let (addr, stop) = serving(admin).await;
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(b"GET /api/config HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .expect("write");
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains("\"last_reload\"") {
        let n = s.read(&mut buf).await.expect("read");
        assert!(n > 0, "closed before the response");
        got.extend_from_slice(&buf[..n]);
    }
    let answered = tokio::time::Instant::now();
    // A partial header then silence: the keep-alive connection's header timer runs.
    s.write_all(b"GET /api/st").await.expect("write");
    let n = tokio::time::timeout(super::HEADER_TIMEOUT * 2, s.read(&mut buf))
        .await
        .expect("closed by the server")
        .unwrap_or(0);
    let rest = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert!(n == 0 || rest.starts_with("HTTP/1.1 408"), "{rest}");
    assert!(answered.elapsed() >= super::HEADER_TIMEOUT);
    stop.cancel();
}

#[tokio::test]
async fn at_the_cap_the_longest_idle_connection_gives_way() {
    use tokio::io::AsyncReadExt;
    let (admin, _) = setup(None);
    let admin = admin.with_limits(super::Limits {
        max_connections: 2,
        ..super::Limits::default()
    });
    let (addr, stop) = serving(admin.clone()).await;
    let mut first = tokio::net::TcpStream::connect(addr).await.expect("1");
    let _second = tokio::net::TcpStream::connect(addr).await.expect("2");
    // A third, at the cap: served, and the first (idle longest) is closed.
    let reply = raw_exchange(
        addr,
        b"GET /api/config HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(std::time::Duration::from_secs(10), first.read(&mut buf))
        .await
        .expect("the first was closed, not held")
        .unwrap_or(0);
    assert_eq!(n, 0);
    assert_eq!(
        (admin.evicted_connections(), admin.refused_connections()),
        (1, 0)
    );
    stop.cancel();
}

#[tokio::test]
async fn idle_and_slowloris_connections_past_the_cap_do_not_keep_an_operator_out() {
    use tokio::io::AsyncWriteExt;
    let (admin, _) = setup(None);
    let admin = admin.with_limits(super::Limits {
        max_connections: 16,
        ..super::Limits::default()
    });
    let (addr, stop) = serving(admin.clone()).await;
    let mut held = Vec::new();
    for i in 0..40 {
        let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
        if i % 3 == 0 {
            s.write_all(b"GET /api/st").await.expect("partial head");
        }
        held.push(s);
    }
    // Bounded: answered long before the header timeout would free a place.
    let reply = tokio::time::timeout(
        super::HEADER_TIMEOUT / 2,
        raw_exchange(
            addr,
            b"GET /api/status HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
        ),
    )
    .await
    .expect("answered while the idle connections are open");
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    // Each connection past the 16th closed the one idle longest.
    assert_eq!(admin.evicted_connections(), 40 + 1 - 16);
    assert_eq!(admin.refused_connections(), 0);
    drop(held);
    stop.cancel();
}

/// The answer to a raw request on `addr`: (status, body).
async fn status_of(addr: std::net::SocketAddr, raw: &str) -> (u16, String) {
    let reply = raw_exchange(addr, raw.as_bytes()).await;
    let status = reply.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = reply
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

#[tokio::test]
async fn only_requests_naming_the_listener_are_answered() {
    let (admin, _) = setup(None);
    let admin = admin.with_hosts(["vigil.internal".to_string()]);
    let (addr, stop) = serving(admin).await;
    let get = |host: &str| {
        format!("GET /api/status HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n")
    };
    for (host, expected) in [
        ("127.0.0.1", 200),
        ("127.0.0.1:9901", 200),
        ("10.1.2.3:80", 200),
        ("[::1]", 200),
        ("[::1]:9901", 200),
        ("localhost", 200),
        ("LocalHost:9901", 200),
        ("localhost.", 200),
        ("dashboard.localhost:9901", 200),
        ("vigil.internal", 200),
        ("Vigil.Internal.:8080", 200),
        ("evil.example", 421),
        ("evil.example:9901", 421),
        ("localhost.evil.example", 421),
        ("127.0.0.1.evil.example", 421),
        ("vigil.internal.evil.example", 421),
        ("localhost:99999999", 421),
        ("127.0.0.1:x", 421),
        ("[::1", 421),
        ("::1", 421),
        (".localhost", 421),
    ] {
        let (status, body) = status_of(addr, &get(host)).await;
        assert_eq!(status, expected, "Host: {host}: {body}");
        if expected == 421 {
            assert_eq!(
                body,
                format!("Host \"{host}\" is not a name of this admin listener; an IP address, localhost or a name in [admin] hosts (--admin-host) is\n")
            );
        }
    }
    // No Host: HTTP/1.0 (no browser sends it) is served, HTTP/1.1 is a 400.
    let (status, _) = status_of(addr, "GET /api/status HTTP/1.0\r\n\r\n").await;
    assert_eq!(status, 200);
    let (status, body) = status_of(
        addr,
        "GET /api/status HTTP/1.1\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(
        (status, body.as_str()),
        (400, "an HTTP/1.1 request needs a Host header\n")
    );
    let (status, _) = status_of(
        addr,
        "GET /api/status HTTP/1.1\r\nHost: localhost\r\nHost: evil.example\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status, 400);
    // An absolute-form target's authority is judged too.
    let (status, _) = status_of(
        addr,
        "GET http://evil.example/api/status HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status, 421);
    // The dashboard and tengine's page are behind the same check.
    for path in ["/", "/status", "/metrics"] {
        let (status, _) = status_of(
            addr,
            &format!("GET {path} HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n"),
        )
        .await;
        assert_eq!(status, 421, "{path}");
    }
    stop.cancel();
}

#[tokio::test]
async fn a_refused_host_is_echoed_escaped_and_cut() {
    let (admin, _) = setup(None);
    let (addr, stop) = serving(admin).await;
    let long = "a".repeat(150);
    let raw = format!("GET / HTTP/1.1\r\nHost: {long}\r\nConnection: close\r\n\r\n");
    let (status, body) = status_of(addr, &raw).await;
    assert_eq!(status, 421);
    assert!(
        body.starts_with(&format!("Host \"{}...\" is not", "a".repeat(100))),
        "{body}"
    );
    let raw = "GET / HTTP/1.1\r\nHost: x\\\"é\r\nConnection: close\r\n\r\n";
    let (_, body) = status_of(addr, raw).await;
    assert!(body.starts_with(r#"Host "x\\\"\xc3\xa9" is not"#), "{body}");
    stop.cancel();
}

/// A page on another site can make a browser send a POST without reading
/// the answer (CSRF). It cannot make it send `Authorization` without a
/// CORS preflight, which the admin API never grants, and without a
/// configured token every write is refused anyway: writes need no other guard.
#[tokio::test]
async fn a_cross_site_page_cannot_write() {
    for token in [None, Some("t")] {
        let (admin, _) = setup(token);
        let (addr, stop) = serving(admin).await;
        let reply = String::from_utf8_lossy(
            raw_exchange(
                addr,
                b"OPTIONS /api/peers/api/10.0.0.1:80/down HTTP/1.1\r\nHost: 127.0.0.1:9901\r\nOrigin: http://evil.example\r\nAccess-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: authorization\r\nConnection: close\r\n\r\n",
            )
            .await
            .as_bytes(),
        )
        .to_ascii_lowercase();
        assert!(reply.starts_with("http/1.1 405"), "{reply}");
        assert!(!reply.contains("access-control-allow"), "{reply}");
        // The simple POST a form or fetch(no-cors) can send: no token in it.
        let (status, _) = status_of(
            addr,
            "POST /api/peers/api/10.0.0.1:80/down HTTP/1.1\r\nHost: 127.0.0.1:9901\r\nOrigin: http://evil.example\r\nContent-Type: text/plain\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert_eq!(status, if token.is_some() { 401 } else { 403 });
        stop.cancel();
    }
}

#[tokio::test(start_paused = true)]
async fn a_write_the_client_never_reads_times_out() {
    use tokio::io::AsyncWriteExt;
    let (near, _far) = tokio::io::duplex(16);
    let mut w = super::listener::SendTimeout::new(near, super::SEND_TIMEOUT);
    let started = tokio::time::Instant::now();
    let big = vec![b'x'; 1024];
    let err = w.write_all(&big).await.expect_err("the reader never reads");
    assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
    assert!(started.elapsed() >= super::SEND_TIMEOUT);
}

#[tokio::test]
async fn a_taken_port_is_reported_as_in_use() {
    let holder = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = holder.local_addr().expect("addr");
    let (admin, _) = setup(None);
    let err = admin
        .listen(addr, tokio_util::sync::CancellationToken::new())
        .await
        .expect_err("taken");
    assert!(err.is_addr_in_use(), "{err}");
    let text = super::default_unavailable_message(&err, "set --admin-listen");
    assert_eq!(
        text,
        format!(
            "{addr} is in use (EADDRINUSE) by another process; the admin API is off. `vigil status` and the other commands would talk to that process and send it your token (set --admin-listen to serve the admin API elsewhere)"
        )
    );
}

#[tokio::test]
async fn check_mode_status_says_what_the_reload_loop_did_and_reloads_show_for_every_upstream() {
    let (admin, _) = setup(None);
    let (_, v) = call(&admin, Method::GET, "/api/status", None).await;
    assert!(v.get("nginx").is_none(), "vigil serve: no nginx loop: {v}");
    let admin = admin.with_nginx_status(|| vigil_core::api::NginxSyncView {
        reloads: 1,
        reload_failures: 1,
        reload_pending: true,
        reload_failed: true,
        last_error: Some("no new worker".into()),
        ..Default::default()
    });
    let (_, v) = call(&admin, Method::GET, "/api/status", None).await;
    assert_eq!(v["nginx"]["reload_failed"], true, "{v}");
    assert_eq!(v["nginx"]["last_error"], "no new worker", "{v}");
    // A reload concerns nginx as a whole (no upstream): listed for any.
    admin.events.publish(vigil_core::event::Event {
        seq: 0,
        at: vigil_core::clock::Timestamp(1),
        unix_ms: 1,
        upstream: "".into(),
        peer: "".into(),
        kind: vigil_core::event::EventKind::Reload {
            files: vec!["api.conf".into()],
            took_ms: 40,
            timing: vigil_core::event::Timing::AtOnce,
        },
    });
    let (_, v) = call(&admin, Method::GET, "/api/events?upstream=api", None).await;
    assert_eq!(v["events"][0]["kind"], "reload", "{v}");
    assert_eq!(
        v["events"][0]["text"],
        "nginx reloaded at once (a server leaves nginx): new workers in 40 ms, running api.conf"
    );
}

#[tokio::test]
async fn status_carries_the_last_reload_with_the_error_text_only_for_the_token() {
    let (admin, _) = setup(Some("t"));
    let (_, v) = call(&admin, Method::GET, "/api/status", None).await;
    assert!(v.get("last_reload").is_none(), "{v}");
    let error = "t.conf:3:1: unexpected \"}\"";
    admin.record_reload(&Err(error.into()));
    let (_, v) = call(&admin, Method::GET, "/api/status", None).await;
    assert_eq!(v["last_reload"]["ok"], false, "{v}");
    assert!(v["last_reload"]["error"].is_null(), "{v}");
    assert!(v["last_reload"]["error_withheld"].is_string(), "{v}");
    let (_, v) = call(&admin, Method::GET, "/api/status", Some("t")).await;
    assert_eq!(v["last_reload"]["error"], error, "{v}");
    // `vigil status` reads it back.
    let doc: vigil_core::api::StatusDoc = serde_json::from_value(v).expect("a status document");
    assert_eq!(
        doc.last_reload.map(|r| (r.ok, r.error)),
        Some((false, Some(error.to_string())))
    );
}
