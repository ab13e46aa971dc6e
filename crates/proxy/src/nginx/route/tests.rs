//! The router on conf text: block selection, location choice, refusals
//! and the URI sent upstream, each as stock nginx 1.22 did on the same
//! conf (the integration tests in tests/it/routing.rs run nginx itself).

use std::net::SocketAddr;
use std::sync::Arc;

use http::{HeaderMap, HeaderValue, Uri, Version};
use vigil_config::{literal_resolver, nginx};
use vigil_core::config::Config;
use vigil_core::event::EventBus;

use super::*;
use crate::nginx::router::host_of;

fn config(conf: &str) -> Config {
    nginx::load_str(conf, "t.conf".as_ref(), ".".as_ref(), &literal_resolver)
        .expect("conf")
        .config
}

fn routes(conf: &str) -> Routes {
    let config = config(conf);
    let clock: Arc<dyn vigil_core::Clock> = Arc::new(vigil_net::SystemClock::new());
    let reg = Registry::build(&config, None, Arc::new(EventBus::default()), clock);
    let pools = reg
        .upstreams()
        .iter()
        .map(|u| (u.name().to_string(), Arc::new(Pool::new(u.config()))))
        .collect();
    Routes::build(&config, &reg, &pools).expect("routes")
}

const L: &str = "127.0.0.1:8080";

fn listener() -> SocketAddr {
    L.parse().expect("addr")
}

fn head(host: Option<&str>) -> HeaderMap {
    let mut h = HeaderMap::new();
    if let Some(v) = host {
        h.insert("host", HeaderValue::from_str(v).expect("value"));
    }
    h
}

/// (location path, upstream URI) or the refusal, for an HTTP/1.1 request.
fn get(r: &Routes, target: &str) -> Result<(String, String), Refusal> {
    let uri: Uri = target.parse().expect("uri");
    let (answer, t) = r.route(listener(), Version::HTTP_11, &uri, &head(Some("x.test")))?;
    let route = answer.proxy().expect("a proxied location");
    Ok((
        route.location.path.clone(),
        upstream_target(&route.location, &t.uri),
    ))
}

#[test]
fn longest_prefix_and_exact_win_on_the_normalised_uri() {
    let r = routes(
        "http { upstream u { server 127.0.0.1:1; }
           server { listen 127.0.0.1:8080;
             location / { proxy_pass http://u; }
             location /api/ { proxy_pass http://u/v2/; }
             location = /api/x { proxy_pass http://u/exact; }
             location /api/long/ { proxy_pass http://u; }
             location /admin { proxy_pass http://u; } } }",
    );
    let path = |t: &str| get(&r, t).map(|(p, _)| p);
    assert_eq!(path("/"), Ok("/".into()));
    assert_eq!(path("/api/y"), Ok("/api/".into()));
    assert_eq!(path("/api/x"), Ok("/api/x".into()));
    assert_eq!(path("/api/./x"), Ok("/api/x".into()));
    assert_eq!(path("/api/long/z"), Ok("/api/long/".into()));
    assert_eq!(path("//admin/x"), Ok("/admin".into()));
    assert_eq!(path("/%61dmin/x"), Ok("/admin".into()));
    assert_eq!(path("/api/long/../../admin"), Ok("/admin".into()));
}

#[test]
fn uri_replacement_follows_nginx() {
    let r = routes(
        "http { upstream u { server 127.0.0.1:1; }
           server { listen 127.0.0.1:8080;
             location / { proxy_pass http://u; }
             location /join/ { proxy_pass http://u/v1; }
             location /keep/ { proxy_pass http://u; }
             location /slash/ { proxy_pass http://u/; }
             location /static/ { proxy_pass http://u/files/; }
             location = /exact { proxy_pass http://u/other?x=1; } } }",
    );
    let up = |t: &str| get(&r, t).map(|(_, u)| u);
    assert_eq!(up("/join/item"), Ok("/v1item".into()), "seed 003");
    assert_eq!(up("/keep/a?b=1"), Ok("/keep/a?b=1".into()));
    assert_eq!(up("/slash/a/b?q"), Ok("/a/b?q".into()));
    assert_eq!(up("/exact"), Ok("/other?x=1".into()));
    // Each as stock nginx sent it upstream.
    assert_eq!(up("/static/a/../b/./c//d"), Ok("/files/b/c/d".into()));
    assert_eq!(up("/static/a%2fb"), Ok("/files/a/b".into()));
    assert_eq!(
        up("/static/%61%20b%3F%23%25%2B+?q=%zz"),
        Ok("/files/a%20b%3F%23%25++?q=%zz".into())
    );
    assert_eq!(
        up("/static/\"{}|^"),
        Ok("/files/\"{}|^".into()),
        "not quoted: sent as is"
    );
    assert_eq!(up("/static/a?"), Ok("/files/a".into()));
    // Without a URI part nginx sends the client's target untouched.
    assert_eq!(
        up("/public/../secret/flag.txt"),
        Ok("/public/../secret/flag.txt".into())
    );
    assert_eq!(up("/keep/%2e%2e/x"), Ok("/keep/%2e%2e/x".into()));
    assert_eq!(
        up("/static/../../etc/passwd"),
        Err(Refusal::BadRequest("invalid request URI"))
    );
    // Absolute form without a path is "/"; authority form (CONNECT) and "*" are 400.
    assert_eq!(up("http://x.test?q"), Ok("/?q".into()));
    let target = Err(Refusal::BadRequest("invalid request target"));
    assert_eq!(up("x.test:443"), target);
    assert_eq!(up("*"), target);
}

#[test]
fn a_missing_slash_redirects_and_nothing_else_falls_through() {
    let r = routes(
        "http { upstream u { server 127.0.0.1:1; }
           server { listen 127.0.0.1:8080;
             location /public/ { proxy_pass http://u; }
             location /api/ { proxy_pass http://u/v1/; }
             location /plain/ { } } }",
    );
    assert_eq!(get(&r, "/secret/flag.txt"), Err(Refusal::NotFound));
    assert_eq!(
        get(&r, "/public/../secret/flag.txt"),
        Err(Refusal::NotFound)
    );
    assert_eq!(
        get(&r, "/public/%2e%2e/secret/flag.txt"),
        Err(Refusal::NotFound)
    );
    assert_eq!(
        get(&r, "/plain/x"),
        Err(Refusal::NotFound),
        "a location without proxy_pass"
    );
    assert_eq!(
        get(&r, "/api?q=1"),
        Err(Refusal::Redirect {
            location: "http://x.test:8080/api/?q=1".into(),
            max_body: 1024 * 1024
        })
    );
}

fn server_of(
    r: &Routes,
    version: Version,
    uri: &str,
    headers: &HeaderMap,
) -> Result<String, Refusal> {
    let uri: Uri = uri.parse().expect("uri");
    r.route(listener(), version, &uri, headers).map(|(a, t)| {
        let route = a.proxy().expect("a proxied location");
        format!("{} {}", route.proxy_host, t.server_name)
    })
}

#[test]
fn the_host_picks_the_block() {
    let r = routes(
        "http { upstream a { server 127.0.0.1:1; } upstream b { server 127.0.0.1:2; }
           upstream c { server 127.0.0.1:3; } upstream d { server 127.0.0.1:4; }
           server { listen 127.0.0.1:8080; server_name a.test; location / { proxy_pass http://a; } }
           server { listen 127.0.0.1:8080 default_server; server_name b.test; location / { proxy_pass http://b; } }
           server { listen 127.0.0.1:8080; location / { proxy_pass http://c; } }
           server { listen 127.0.0.1:8080; server_name .d.test ~^re\\d+$; location / { proxy_pass http://d; } } }",
    );
    let h1 = |host: Option<&str>| server_of(&r, Version::HTTP_11, "/", &head(host));
    assert_eq!(h1(Some("a.test")), Ok("a a.test".into()));
    assert_eq!(h1(Some("A.Test.:99")), Ok("a a.test".into()));
    assert_eq!(
        h1(Some("unknown.test")),
        Ok("b b.test".into()),
        "default_server"
    );
    assert_eq!(h1(Some("x.d.test")), Ok("d d.test".into()));
    assert_eq!(h1(Some("re42")), Ok("d d.test".into()));
    assert_eq!(
        h1(Some("a/b")),
        Err(Refusal::BadRequest("invalid host header"))
    );
    assert_eq!(
        h1(None),
        Err(Refusal::BadRequest("HTTP/1.1 request without host"))
    );
    // HTTP/1.0 without a Host: the block named "" (no server_name), as nginx.
    assert_eq!(
        server_of(&r, Version::HTTP_10, "/", &head(None)),
        Ok("c ".into())
    );
    // The request line's host wins over Host.
    let abs = server_of(
        &r,
        Version::HTTP_11,
        "http://a.test/",
        &head(Some("b.test")),
    );
    assert_eq!(abs, Ok("a a.test".into()));
    let mut two = head(Some("a.test"));
    two.append("host", HeaderValue::from_static("a.test"));
    assert_eq!(
        server_of(&r, Version::HTTP_11, "/", &two),
        Err(Refusal::BadRequest("duplicate host header"))
    );
    // HTTP/2: :authority is the host; with a Host header too it is two.
    let h2 = |uri: &str, h: &HeaderMap| server_of(&r, Version::HTTP_2, uri, h);
    assert_eq!(h2("http://a.test/", &head(None)), Ok("a a.test".into()));
    assert_eq!(h2("/", &head(Some("a.test"))), Ok("a a.test".into()));
    assert_eq!(
        h2("/", &head(None)),
        Err(Refusal::BadRequest("request without host"))
    );
    assert_eq!(
        h2("http://a.test/", &head(Some("a.test"))),
        Err(Refusal::BadRequest("duplicate host header"))
    );
}

#[test]
fn a_request_on_an_unknown_listener_is_nobodys() {
    let r = routes(
        "http { upstream u { server 127.0.0.1:1; }
           server { listen 127.0.0.1:8080; location / { proxy_pass http://u; } }
           server { listen 9090; location / { proxy_pass http://u; } } }",
    );
    let uri: Uri = "/".parse().expect("uri");
    let on = |l: &str| {
        r.route(
            l.parse().expect("addr"),
            Version::HTTP_11,
            &uri,
            &head(Some("x")),
        )
        .map(|_| ())
    };
    assert_eq!(on("127.0.0.1:8081"), Err(Refusal::UnknownListener));
    assert_eq!(
        on("127.0.0.2:9090"),
        Ok(()),
        "a wildcard listen takes every address of its port"
    );
    assert_eq!(on(L), Ok(()));
}

#[test]
fn host_is_never_cut_inside_brackets() {
    let mut parts = http::Request::builder()
        .uri("/")
        .header("host", "[::1]:8080")
        .body(())
        .expect("request")
        .into_parts()
        .0;
    assert_eq!(host_of(&parts), "[::1]");
    parts
        .headers
        .insert("host", HeaderValue::from_static("[::1]"));
    assert_eq!(host_of(&parts), "[::1]");
}

#[test]
fn configurations_nginx_refuses_are_route_errors() {
    // Refused by the config loader (core validates duplicates) or by the router.
    let refused = |conf: &str| {
        let loaded = nginx::load_str(conf, "t.conf".as_ref(), ".".as_ref(), &literal_resolver)
            .map_err(|e| e.to_string())?;
        Router::build(&loaded.config)
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    let err = refused(
        "http { upstream u { server 127.0.0.1:1; }
           server { listen 127.0.0.1:8080; server_name ~(unclosed; location / { proxy_pass http://u; } } }",
    )
    .expect_err("bad regex");
    assert!(err.starts_with("t.conf:2:"), "{err}");
    assert!(
        err.ends_with("pcre2_compile() failed: missing closing parenthesis in \"(unclosed\""),
        "nginx's words: {err}"
    );
    for bad in [
        "server { listen 127.0.0.1:8080; server_name www.*.com; }",
        "server { listen 127.0.0.1:8080 default_server; } server { listen 127.0.0.1:8080 default_server; }",
        "server { listen 127.0.0.1:8080; location /a { } location /a { } }",
    ] {
        assert!(refused(&format!("http {{ {bad} }}")).is_err(), "{bad}");
    }
}

#[test]
fn an_error_page_that_proxies_is_served_and_a_missing_one_refused() {
    let build = |text: &str| {
        let config = config(text);
        let clock: Arc<dyn vigil_core::Clock> = Arc::new(vigil_net::SystemClock::new());
        let reg = Registry::build(&config, None, Arc::new(EventBus::default()), clock);
        let pools = reg
            .upstreams()
            .iter()
            .map(|u| (u.name().to_string(), Arc::new(Pool::new(u.config()))))
            .collect();
        Routes::build(&config, &reg, &pools).map(drop)
    };
    build(
        "http { upstream u { server 127.0.0.1:9; }
         server { listen 127.0.0.1:8080;
           location / { proxy_pass http://u; error_page 502 @p; }
           location @p { proxy_pass http://u; } } }",
    )
    .expect("a page that proxies");
    let e = build(
        "http { upstream u { server 127.0.0.1:9; }
         server { listen 127.0.0.1:8080;
           error_page 404 @none;
           location / { proxy_pass http://u; } } }",
    )
    .expect_err("refused");
    assert!(e.message.contains("no location \"@none\""), "{e}");
    assert!(e.at.starts_with("t.conf:3:"), "at the error_page: {e}");
}

#[test]
fn unknown_variables_of_static_files_are_variable_errors() {
    let c = config(
        "http { server { listen 127.0.0.1:8080;
           location /a { root /srv/$nope; }
           location /b { try_files $uri $missing/ =404; }
           location ~ ^/c/(.*)$ { alias /srv/$1; }
           location /d { proxy_pass http://127.0.0.1:9; } } }",
    );
    let errs: Vec<String> = variable_errors(&c).into_iter().map(|e| e.message).collect();
    assert_eq!(errs.len(), 2, "{errs:?}");
    assert!(
        errs[0].contains("nope") && errs[0].contains("\"root\""),
        "{errs:?}"
    );
    assert!(
        errs[1].contains("missing") && errs[1].contains("\"try_files\""),
        "{errs:?}"
    );
}
