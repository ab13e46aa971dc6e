//! Routing and forwarding as nginx 1.22 sees a request: the exact bytes of
//! each attack of the issue (and the Host cases) go to vigil and to a stock
//! nginx serving the same conf, and the test compares the status each
//! client got and the URI / Host each side's backends saw. HTTP/2 (h2c)
//! runs against vigil alone with the same expectations.

use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::Request;

use crate::support::start_proxy;
use crate::twin::Twin;

/// `GET TARGET HTTP/1.1` with `Host: x.test` and `Connection: close`.
fn get(target: &str) -> Vec<u8> {
    format!("GET {target} HTTP/1.1\r\nHost: x.test\r\nConnection: close\r\n\r\n").into_bytes()
}

/// Send `bytes` to both; assert both answered `status`; (vigil's, nginx's) responses.
async fn both(t: &Twin, bytes: &[u8], status: u16) -> (crate::twin::Raw, crate::twin::Raw) {
    let (v, n) = t.send(bytes).await;
    let what = String::from_utf8_lossy(bytes);
    assert_eq!(n.status, status, "nginx, for {what:?}: {n:?}");
    assert_eq!(v.status, status, "vigil, for {what:?}: {v:?}");
    (v, n)
}

/// The URIs each side's backends saw, asserted equal; vigil's.
fn same_uris(t: &Twin) -> Vec<Vec<String>> {
    let (v, n) = t.uris();
    assert_eq!(v, n, "backend URIs (vigil, nginx)");
    v
}

fn none() -> Vec<String> {
    Vec::new()
}

fn one(u: &str) -> Vec<String> {
    vec![u.to_string()]
}

#[tokio::test]
async fn dot_segments_do_not_leave_a_prefix_location() {
    let t = Twin::start(
        "upstream files { server {B0}; }
         server { listen {LISTEN}; location /public/ { proxy_pass http://files; } }",
        1,
    )
    .await;
    for target in [
        "/public/../secret/flag.txt",
        "/public/%2e%2e/secret/flag.txt",
        "/public/%2E%2E%2Fsecret/flag.txt",
        "/public/x/..%2f..%2fsecret/flag.txt",
    ] {
        both(&t, &get(target), 404).await;
    }
    assert_eq!(same_uris(&t), vec![none()], "the files backend saw nothing");
    // What does belong to the location gets there, as the client sent it.
    both(&t, &get("/public/a/../b.txt"), 200).await;
    assert_eq!(same_uris(&t), vec![one("/public/a/../b.txt")]);
}

#[tokio::test]
async fn a_catch_all_gets_the_dots_raw_as_nginx_sends_them() {
    let t = Twin::start(
        "upstream files { server {B0}; } upstream app { server {B1}; }
         server { listen {LISTEN};
           location /public/ { proxy_pass http://files; }
           location / { proxy_pass http://app; } }",
        2,
    )
    .await;
    both(&t, &get("/public/../secret/flag.txt"), 200).await;
    both(&t, &get("/public/%2e%2e/secret/flag.txt"), 200).await;
    // nginx routes on /secret/flag.txt but, without a URI part in
    // proxy_pass, forwards the client's target unchanged.
    assert_eq!(
        same_uris(&t),
        vec![
            none(),
            vec![
                "/public/../secret/flag.txt".to_string(),
                "/public/%2e%2e/secret/flag.txt".to_string()
            ]
        ]
    );
}

#[tokio::test]
async fn a_uri_part_sends_the_normalised_uri_re_escaped() {
    let t = Twin::start(
        "upstream app { server {B0}; }
         server { listen {LISTEN}; location /static/ { proxy_pass http://app/files/; } }",
        1,
    )
    .await;
    both(&t, &get("/static/../../etc/passwd"), 400).await;
    both(&t, &get("/static/%2e%2e/%2e%2e/etc/passwd"), 400).await;
    both(&t, &get("/static/a/../../etc/passwd"), 404).await;
    assert_eq!(same_uris(&t), vec![none()]);
    both(&t, &get("/static/a/../b/./c//d?q=1"), 200).await;
    both(&t, &get("/static/%61%20b%3F%23%25%2B+?q=%zz"), 200).await;
    both(&t, &get("/static/a%2fb"), 200).await;
    both(&t, &get("/static/%C3%A9\\x"), 200).await;
    both(&t, &get("/static/é/./x"), 200).await;
    assert_eq!(
        same_uris(&t),
        vec![vec![
            "/files/b/c/d?q=1".to_string(),
            "/files/a%20b%3F%23%25++?q=%zz".to_string(),
            "/files/a/b".to_string(),
            "/files/%C3%A9%5Cx".to_string(),
            "/files/é/x".to_string(),
        ]]
    );
}

/// Targets built from the pieces nginx's normaliser cares about, by a
/// fixed generator (the same list every run).
fn generated_targets(n: usize) -> Vec<String> {
    const PIECES: &[&str] = &[
        "/", "/", ".", "..", "%2e", "%2E", "%2f", "%2F", "%25", "%3f", "%3F", "%23", "%00", "%zz",
        "%4", "?", "a", "b", "+", "%20", "%C3%A9", "~", "%7e", "\\", "//", "/./", "/../", ";",
    ];
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move |m: usize| {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (seed >> 33) as usize % m
    };
    (0..n)
        .map(|_| {
            let len = 1 + next(8);
            let tail: String = (0..len).map(|_| PIECES[next(PIECES.len())]).collect();
            format!("/static/{tail}")
        })
        .collect()
}

#[tokio::test]
async fn generated_targets_are_judged_and_forwarded_as_nginx() {
    let t = Twin::start(
        "upstream app { server {B0}; } upstream files { server {B1}; }
         server { listen {LISTEN};
           location / { proxy_pass http://app; add_header X-Uri $uri; }
           location /static/ { proxy_pass http://files/files/; } }",
        2,
    )
    .await;
    let mut statuses = std::collections::BTreeMap::new();
    for target in generated_targets(300) {
        let (v, n) = t.send(&get(&target)).await;
        assert_eq!(
            (v.status, v.header("x-uri")),
            (n.status, n.header("x-uri")),
            "vigil vs nginx for {target}"
        );
        *statuses.entry(n.status).or_insert(0) += 1;
    }
    same_uris(&t);
    // The list reaches each outcome: 400s, the catch-all and /static/.
    assert!(statuses.get(&400).is_some_and(|&n| n > 20), "{statuses:?}");
    assert!(statuses.get(&200).is_some_and(|&n| n > 100), "{statuses:?}");
    let (v, _) = t.uris();
    assert!(
        v.iter().all(|b| b.len() > 5),
        "both backends got some: {v:?}"
    );
}

#[tokio::test]
async fn slashes_and_escapes_do_not_dodge_a_location() {
    let t = Twin::start(
        "upstream admin { server {B0}; } upstream app { server {B1}; }
         server { listen {LISTEN};
           location /admin { proxy_pass http://admin; }
           location / { proxy_pass http://app; } }",
        2,
    )
    .await;
    for target in ["//admin/x", "/%61dmin/x", "/./admin/x", "/x/../admin/x"] {
        both(&t, &get(target), 200).await;
    }
    assert_eq!(
        same_uris(&t),
        vec![
            vec![
                "//admin/x".to_string(),
                "/%61dmin/x".to_string(),
                "/./admin/x".to_string(),
                "/x/../admin/x".to_string()
            ],
            none()
        ]
    );
}

#[tokio::test]
async fn merge_slashes_off_keeps_them_for_matching() {
    let t = Twin::start(
        "upstream admin { server {B0}; } upstream app { server {B1}; }
         server { listen {LISTEN}; merge_slashes off;
           location /admin { proxy_pass http://admin; }
           location / { proxy_pass http://app; } }",
        2,
    )
    .await;
    both(&t, &get("//admin/x"), 200).await;
    assert_eq!(same_uris(&t), vec![none(), one("//admin/x")]);
}

#[tokio::test]
async fn nul_and_broken_escapes_are_400() {
    let t = Twin::start(
        "upstream app { server {B0}; }
         server { listen {LISTEN}; location / { proxy_pass http://app; } }",
        1,
    )
    .await;
    for target in ["/a%00b", "/a%zz", "/a%4", "/a%", "/.."] {
        let (v, _) = both(&t, &get(target), 400).await;
        assert!(
            v.header("connection").eq_ignore_ascii_case("close"),
            "{v:?}"
        );
    }
    // The query is not decoded: nothing in it is an error.
    both(&t, &get("/a?b=%zz%00"), 200).await;
    assert_eq!(same_uris(&t), vec![one("/a?b=%zz%00")]);
}

#[tokio::test]
async fn a_missing_slash_is_a_301_to_the_location() {
    let t = Twin::start(
        "upstream app { server {B0}; }
         server { listen {LISTEN};
           location /api/ { proxy_pass http://app/v1/; }
           location = /exact/ { proxy_pass http://app; } }",
        1,
    )
    .await;
    let port = |s: &crate::twin::Side| s.addr.port();
    let cases: [(&[u8], &str); 4] = [
        (
            b"GET /api HTTP/1.1\r\nHost: x.test\r\nConnection: close\r\n\r\n",
            "http://x.test:{P}/api/",
        ),
        (
            b"GET /api?q=1 HTTP/1.1\r\nHost: Ex.Test:8080\r\nConnection: close\r\n\r\n",
            "http://ex.test:{P}/api/?q=1",
        ),
        (b"GET /api HTTP/1.0\r\n\r\n", "http://127.0.0.1:{P}/api/"),
        (
            b"GET /exact HTTP/1.1\r\nHost: x.test\r\nConnection: close\r\n\r\n",
            "http://x.test:{P}/exact/",
        ),
    ];
    for (bytes, want) in cases {
        let (v, n) = both(&t, bytes, 301).await;
        let want_v = want.replace("{P}", &port(&t.vigil).to_string());
        let want_n = want.replace("{P}", &port(&t.nginx).to_string());
        assert_eq!(n.header("location"), want_n);
        assert_eq!(v.header("location"), want_v);
    }
    // nginx checks client_max_body_size before it redirects.
    let big = b"GET /api HTTP/1.1\r\nHost: x.test\r\nContent-Length: 2000000\r\nConnection: close\r\n\r\n";
    both(&t, big, 413).await;
    both(&t, &get("/api/x"), 200).await;
    assert_eq!(same_uris(&t), vec![one("/v1/x")]);
}

#[tokio::test]
async fn variables_come_from_routing() {
    let t = Twin::start(
        "upstream a { server {B0}; }
         server { listen {LISTEN}; server_name .dot.test other.test;
           location / { proxy_pass http://a;
             add_header X-Uri $uri; add_header X-Sn $server_name; add_header X-Host $host; } }",
        1,
    )
    .await;
    let cases: [&[u8]; 3] = [
        b"GET /a/%2e%2e/b%20c//d?q=1 HTTP/1.1\r\nHost: Z.Dot.Test:1\r\nConnection: close\r\n\r\n",
        b"GET /x HTTP/1.0\r\n\r\n",
        b"GET http://Other.Test./y HTTP/1.1\r\nHost: z.dot.test\r\nConnection: close\r\n\r\n",
    ];
    let vars = |r: &crate::twin::Raw| ["x-uri", "x-sn", "x-host"].map(|h| r.header(h));
    let mut seen = Vec::new();
    for bytes in cases {
        let (v, n) = both(&t, bytes, 200).await;
        assert_eq!(
            vars(&v),
            vars(&n),
            "for {:?}",
            String::from_utf8_lossy(bytes)
        );
        seen.push(vars(&n));
    }
    assert_eq!(
        seen,
        [
            ["/b c/d", "dot.test", "z.dot.test"],
            ["/x", "dot.test", "dot.test"],
            ["/y", "dot.test", "other.test"]
        ]
        .map(|r| r.map(String::from))
    );
}

/// Four blocks on one address, each proxying to its own backend and
/// forwarding `$host`; the default is the second.
const VHOSTS: &str = "
    upstream a { server {B0}; } upstream b { server {B1}; }
    upstream c { server {B2}; } upstream d { server {B3}; }
    server { listen {LISTEN}; server_name a.test *.wild.test;
      location / { proxy_pass http://a; proxy_set_header Host $host; } }
    server { listen {LISTEN} default_server; server_name b.test;
      location / { proxy_pass http://b; proxy_set_header Host $host; } }
    server { listen {LISTEN};
      location / { proxy_pass http://c; proxy_set_header Host $host; } }
    server { listen {LISTEN}; server_name .dot.test www.tail.* ~^re[0-9]+\\.test$ *.a.wild.test;
      location / { proxy_pass http://d; proxy_set_header Host $host; } }";

/// Which backend (index) and what Host it saw, on each side, for `host`.
async fn picked(t: &Twin, request: &[u8]) -> ((usize, String), (usize, String)) {
    let before = |s: &crate::twin::Side| {
        s.backends
            .iter()
            .map(|b| b.requests().len())
            .collect::<Vec<_>>()
    };
    let (bv, bn) = (before(&t.vigil), before(&t.nginx));
    both(t, request, 200).await;
    let got = |s: &crate::twin::Side, was: &[usize]| {
        let i = s
            .backends
            .iter()
            .zip(was)
            .position(|(b, &n)| b.requests().len() > n)
            .expect("some backend got it");
        let seen = s.backends[i].requests().pop().expect("request");
        let host = seen
            .headers
            .get("host")
            .map(|h| String::from_utf8_lossy(h.as_bytes()).into_owned())
            .unwrap_or_default();
        (i, host)
    };
    (got(&t.vigil, &bv), got(&t.nginx, &bn))
}

#[tokio::test]
async fn the_host_picks_the_server_block() {
    let t = Twin::start(VHOSTS, 4).await;
    let with_host = |h: &str| format!("GET / HTTP/1.1\r\nHost: {h}\r\nConnection: close\r\n\r\n");
    let cases = [
        ("a.test", 0, "a.test"),
        ("A.TEST.:8080", 0, "a.test"),
        ("b.test", 1, "b.test"),
        ("unknown.test", 1, "unknown.test"),
        ("x.wild.test", 0, "x.wild.test"),
        ("y.x.wild.test", 0, "y.x.wild.test"),
        ("q.a.wild.test", 3, "q.a.wild.test"),
        ("wild.test", 1, "wild.test"),
        ("dot.test", 3, "dot.test"),
        ("z.dot.test", 3, "z.dot.test"),
        ("www.tail.example", 3, "www.tail.example"),
        ("www.tail", 1, "www.tail"),
        ("re12.test", 3, "re12.test"),
        ("re12.testx", 1, "re12.testx"),
        ("[::1]:8080", 1, "[::1]"),
        ("a\\b", 1, "a\\b"),
    ];
    for (host, backend, forwarded) in cases {
        let (v, n) = picked(&t, with_host(host).as_bytes()).await;
        assert_eq!(n, (backend, forwarded.to_string()), "nginx for Host {host}");
        assert_eq!(v, n, "vigil for Host {host}");
    }
    // No Host on HTTP/1.0: the block named "" (no server_name), not the default.
    let (v, n) = picked(&t, b"GET / HTTP/1.0\r\n\r\n").await;
    assert_eq!(n.0, 2, "nginx");
    assert_eq!(v.0, n.0, "vigil");
    // An absolute-form target's host wins over Host.
    let (v, n) = picked(
        &t,
        b"GET http://a.test/ HTTP/1.1\r\nHost: b.test\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(n, (0, "a.test".to_string()), "nginx");
    assert_eq!(v, n, "vigil");
}

#[tokio::test]
async fn invalid_hosts_are_400() {
    let t = Twin::start(VHOSTS, 4).await;
    let cases: [&[u8]; 9] = [
        b"GET / HTTP/1.1\r\nHost: a/b\r\nConnection: close\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a..b\r\nConnection: close\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: :80\r\nConnection: close\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: \r\nConnection: close\r\n\r\n",
        b"GET / HTTP/1.0\r\nHost: \r\n\r\n",
        b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a.test\r\nHost: a.test\r\nConnection: close\r\n\r\n",
        b"GET http://a.test/ HTTP/1.1\r\nConnection: close\r\n\r\n",
        b"GET http://u@a.test/ HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n",
    ];
    for bytes in cases {
        both(&t, bytes, 400).await;
    }
    let (v, n) = t.uris();
    assert_eq!(v, n);
    assert!(v.iter().all(Vec::is_empty), "no backend saw any: {v:?}");
}

/// An h2c connection to `addr`.
async fn h2(addr: SocketAddr) -> hyper::client::conn::http2::SendRequest<Empty<Bytes>> {
    let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .expect("h2 handshake");
    tokio::spawn(conn);
    sender
}

/// One h2 request: (status, body).
async fn h2_get(addr: SocketAddr, uri: &str, host: Option<&str>) -> (u16, String) {
    let mut b = Request::builder().uri(uri);
    if let Some(h) = host {
        b = b.header("host", h);
    }
    let resp = h2(addr)
        .await
        .send_request(b.body(Empty::new()).expect("request"))
        .await
        .expect("response");
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test]
async fn http2_is_normalised_and_routed_the_same() {
    let a = crate::support::Backend::named("a").await;
    let b = crate::support::Backend::named("b").await;
    let p = start_proxy(&format!(
        "http {{ upstream a {{ server {}; }} upstream b {{ server {}; }}
           server {{ listen {{LISTEN}}; server_name a.test;
             location /public/ {{ proxy_pass http://a; }}
             location /static/ {{ proxy_pass http://a/files/; }} }}
           server {{ listen {{LISTEN}} default_server; server_name b.test;
             location / {{ proxy_pass http://b; proxy_set_header Host $host; }} }} }}",
        a.addr, b.addr
    ))
    .await;
    let at = |path: &str| format!("http://a.test{path}");
    assert_eq!(
        h2_get(p.addr, &at("/public/%2e%2e/secret"), None).await.0,
        404
    );
    assert_eq!(h2_get(p.addr, &at("/public/../secret"), None).await.0, 404);
    assert_eq!(
        h2_get(p.addr, &at("/static/../../etc/passwd"), None)
            .await
            .0,
        400
    );
    assert_eq!(h2_get(p.addr, &at("/x%00"), None).await.0, 400);
    assert_eq!(
        h2_get(p.addr, &at("/static/a/../b//c%20d"), None).await,
        (200, "a".into())
    );
    assert_eq!(
        h2_get(p.addr, &at("/public/x"), None).await,
        (200, "a".into())
    );
    // :authority picks the block; $host comes from it, brackets kept.
    assert_eq!(
        h2_get(p.addr, "http://[::1]:9/y", None).await,
        (200, "b".into())
    );
    // No :authority, Host instead: nginx takes it; both at once: 400.
    assert_eq!(
        h2_get(p.addr, "/public/x", Some("a.test")).await,
        (200, "a".into())
    );
    assert_eq!(
        h2_get(p.addr, &at("/public/x"), Some("a.test")).await.0,
        400
    );
    assert_eq!(
        h2_get(p.addr, "/public/x", None).await.0,
        400,
        "no host at all"
    );
    assert_eq!(h2_get(p.addr, "http://a..b/x", None).await.0, 400);
    let uris: Vec<String> = a.requests().into_iter().map(|s| s.uri).collect();
    assert_eq!(uris, ["/files/b/c%20d", "/public/x", "/public/x"]);
    let seen = b.requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].uri, "/y");
    assert_eq!(
        seen[0].headers.get("host").map(|h| h.as_bytes()),
        Some(&b"[::1]"[..])
    );
}
