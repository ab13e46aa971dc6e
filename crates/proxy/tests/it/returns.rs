//! `return` in `server` and `location` blocks, each form sent to vigil and
//! to a stock nginx serving the same conf: the status, `Location`, body
//! (for text) and `Content-Type` each client got, and that no backend saw
//! the request.

use crate::twin::{Raw, Twin};

fn get(target: &str, host: &str) -> Vec<u8> {
    format!("GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").into_bytes()
}

/// The two answers to the same bytes, with each side's own port in
/// `Location` written as `PORT` (the two listen on different ports).
async fn both(t: &Twin, bytes: &[u8]) -> (Raw, Raw) {
    let (v, n) = t.send(bytes).await;
    let what = String::from_utf8_lossy(bytes);
    assert_eq!(v.status, n.status, "status for {what:?}\n{v:?}\n{n:?}");
    let loc = |r: &Raw, port: u16| r.header("location").replace(&format!(":{port}"), ":PORT");
    assert_eq!(
        loc(&v, t.vigil.addr.port()),
        loc(&n, t.nginx.addr.port()),
        "Location for {what:?}"
    );
    assert_eq!(
        v.header("content-type"),
        n.header("content-type"),
        "Content-Type for {what:?}"
    );
    (v, n)
}

fn no_backend_saw_anything(t: &Twin) {
    let (v, n) = t.uris();
    assert_eq!(v, n);
    assert!(v.iter().all(Vec::is_empty), "backends saw {v:?}");
}

#[tokio::test]
async fn every_form_of_return_in_a_location_answers_as_nginx() {
    let t = Twin::start(
        r#"upstream u { server {B0}; }
         server { listen {LISTEN}; server_name srv.test;
           location /text { return 200 "hi $arg_a $request_method $host"; }
           location /forbidden { return 403 "nope"; }
           location /page { return 404; }
           location /empty { return 200; }
           location /none { return 204; }
           location /rel { return 301 /elsewhere?x=$arg_a; }
           location /abs { return 307 https://ex.test$uri; }
           location /bare { return https://ex.test/u; }
           location /see { return 303 "x"; }
           location /close { return 444; }
           location /first { return 200 "one"; return 200 "two"; }
           location /added { add_header X-Loc "l $status"; add_header X-Always a always;
             return 404 "e"; }
           location /both { proxy_pass http://u; return 200 "returned"; }
           location / { proxy_pass http://u; }
         }"#,
        1,
    )
    .await;
    let (v, _) = both(&t, &get("/text?a=1", "h.test")).await;
    assert_eq!(
        (v.status, v.body.as_slice()),
        (200, &b"hi 1 GET h.test"[..])
    );
    assert_eq!(v.header("content-type"), "text/plain");
    let (v, n) = both(&t, &get("/forbidden", "h.test")).await;
    assert_eq!((v.status, &v.body), (403, &n.body));
    assert_eq!(v.body, b"nope");
    let (v, _) = both(&t, &get("/page", "h.test")).await;
    assert_eq!(
        (v.status, v.header("content-type").as_str()),
        (404, "text/html")
    );
    let (v, n) = both(&t, &get("/empty", "h.test")).await;
    assert_eq!((v.status, &v.body), (200, &n.body));
    assert_eq!(v.header("content-length"), "0");
    let (v, n) = both(&t, &get("/none", "h.test")).await;
    assert_eq!((v.status, &v.body), (204, &n.body));
    let (v, _) = both(&t, &get("/rel?a=5", "h.test:8080")).await;
    assert_eq!(v.status, 301);
    assert_eq!(
        v.header("location"),
        format!("http://h.test:{}/elsewhere?x=5", t.vigil.addr.port())
    );
    let (v, _) = both(&t, &get("/abs/b", "h.test")).await;
    assert_eq!(
        (v.status, v.header("location").as_str()),
        (307, "https://ex.test/abs/b")
    );
    let (v, _) = both(&t, &get("/bare", "h.test")).await;
    assert_eq!(
        (v.status, v.header("location").as_str()),
        (302, "https://ex.test/u")
    );
    let (v, _) = both(&t, &get("/see", "h.test")).await;
    assert_eq!((v.status, v.header("location").as_str()), (303, "x"));
    let (v, n) = both(&t, &get("/close", "h.test")).await;
    assert_eq!(
        (v.status, v.body.len(), n.body.len()),
        (0, 0, 0),
        "444 closes"
    );
    let (v, n) = both(
        &t,
        b"HEAD /text?a=1 HTTP/1.1\r\nHost: h.test\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!((v.status, &v.body), (200, &n.body), "HEAD: no body");
    assert_eq!(v.header("content-length"), n.header("content-length"));
    let (v, n) = both(&t, &get("/added", "h.test")).await;
    assert_eq!(
        (v.header("x-loc"), v.header("x-always")),
        (n.header("x-loc"), n.header("x-always")),
        "add_header on a return (only `always` on a 404)"
    );
    assert_eq!(v.header("x-always"), "a");
    let (v, _) = both(&t, &get("/first", "h.test")).await;
    assert_eq!(v.body, b"one");
    let (v, _) = both(&t, &get("/both", "h.test")).await;
    assert_eq!(v.body, b"returned");
    no_backend_saw_anything(&t);
    let (v, _) = both(&t, &get("/proxied", "h.test")).await;
    assert_eq!((v.status, v.body.as_slice()), (200, &b"b0"[..]));
}

#[tokio::test]
async fn a_server_return_answers_before_any_location() {
    let t = Twin::start(
        r#"upstream u { server {B0}; }
         server { listen {LISTEN}; server_name a.test;
           return 301 https://b.test$request_uri;
           location / { proxy_pass http://u; }
           location /api/ { proxy_pass http://u; }
         }"#,
        1,
    )
    .await;
    for target in ["/x?k=1", "/api", "/api/v1"] {
        let (v, _) = both(&t, &get(target, "a.test")).await;
        assert_eq!(v.status, 301, "{target}");
        assert_eq!(v.header("location"), format!("https://b.test{target}"));
    }
    no_backend_saw_anything(&t);
}

#[tokio::test]
async fn a_location_return_comes_after_the_body_size_check() {
    let t = Twin::start(
        r#"server { listen {LISTEN};
           client_max_body_size 10;
           location / { return 200 "ok"; } }"#,
        0,
    )
    .await;
    let (v, _) = both(
        &t,
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\nConnection: close\r\n\r\nhello world",
    )
    .await;
    assert_eq!(v.status, 413);
    let (v, _) = both(
        &t,
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
    )
    .await;
    assert_eq!((v.status, v.body.as_slice()), (200, &b"ok"[..]));
}

#[tokio::test]
async fn the_text_has_the_default_type_in_force() {
    let t = Twin::start(
        r#"server { listen {LISTEN};
           location / { return 200 "x"; }
           location /j { default_type application/json; return 200 "{}"; }
           location /gone { return 410; } }
         default_type text/x-late;"#,
        0,
    )
    .await;
    for (target, ct) in [
        ("/a", "text/x-late"),
        ("/j", "application/json"),
        ("/gone", "text/html"),
    ] {
        let (v, _) = both(&t, &get(target, "h.test")).await;
        assert_eq!(v.header("content-type"), ct, "{target}");
    }
}
