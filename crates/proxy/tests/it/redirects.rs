//! `proxy_redirect`, `proxy_hide_header`, `proxy_pass_header`: the same
//! upstream answers through vigil and a stock nginx on the same conf give
//! the client the same `Location`, `Refresh` and headers.

use bytes::Bytes;
use http_body_util::Full;
use hyper::Response;

use crate::support::{Backend, Seen};
use crate::twin::{Raw, Twin};

/// Redirects to `http://HOST` + the path + `/next`, HOST being the Host
/// it was sent (the upstream's name), with headers nginx hides.
fn redirecting(s: &Seen) -> Response<Full<Bytes>> {
    let host = s
        .headers
        .get("host")
        .and_then(|h| h.to_str().ok())
        .unwrap_or("")
        .to_string();
    let path = s.uri.split('?').next().unwrap_or("").to_string();
    let mut r = Response::new(Full::new(Bytes::from_static(b"moved")));
    *r.status_mut() = http::StatusCode::FOUND;
    let h = r.headers_mut();
    let loc = if path.ends_with("/rel") {
        format!("{path}/next")
    } else {
        format!("http://{host}{path}/next")
    };
    h.insert("location", loc.parse().expect("location"));
    h.insert(
        "refresh",
        format!("5; URL=http://{host}/two/r")
            .parse()
            .expect("refresh"),
    );
    for (n, v) in [
        ("server", "backend/1"),
        ("x-pad", "pad"),
        ("x-accel-buffering", "no"),
        ("x-secret", "s"),
        ("x-keep", "k"),
    ] {
        h.insert(n, v.parse().expect("value"));
    }
    r
}

fn masked(r: &Raw, port: u16, name: &str) -> String {
    r.header(name).replace(&format!(":{port}"), ":PORT")
}

#[tokio::test]
async fn redirects_and_hidden_headers_are_nginx_s() {
    let (vb, nb) = (
        Backend::start(redirecting).await,
        Backend::start(redirecting).await,
    );
    let t = Twin::start_with(
        "upstream u { server {R0}; }
         server { listen {LISTEN}; server_name h.test;
           location /one/ { proxy_pass http://u/two/; proxy_hide_header X-Secret; }
           location /plain/ { proxy_pass http://u; proxy_pass_header Server;
             proxy_pass_header X-Accel-Buffering; }
           location /off/ { proxy_pass http://u/two/; proxy_redirect off; }
           location /explicit/ { proxy_pass http://u/x/;
             proxy_redirect http://u/x/a/ http://$host/ex/; proxy_redirect default; }
         }
         server { listen {LISTEN}; server_name s2.test;
           location /srv/ { proxy_pass http://u/; }
           location /one/ { proxy_pass http://u/two/; }
           proxy_redirect http://u/ /from-server/;
         }",
        0,
        &[("{R0}", vb.addr)],
        &[("{R0}", nb.addr)],
    )
    .await;
    let mut seen = Vec::new();
    for path in [
        "/one/p",
        "/one/rel",
        "/plain/q",
        "/off/p",
        "/explicit/a/b",
        "/explicit/c",
        "s2.test/srv/z",
        "s2.test/one/p",
    ] {
        let (host, path) = match path.split_once('/') {
            Some((h, p)) if !h.is_empty() => (h, format!("/{p}")),
            _ => ("h.test", path.to_string()),
        };
        let req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        let (v, n) = t.send(req.as_bytes()).await;
        let (vp, np) = (t.vigil.addr.port(), t.nginx.addr.port());
        assert_eq!((v.status, n.status), (302, 302), "{path}");
        for name in ["location", "refresh"] {
            assert_eq!(masked(&v, vp, name), masked(&n, np, name), "{path} {name}");
            seen.push(masked(&v, vp, name));
        }
        for name in ["x-pad", "x-accel-buffering", "x-secret", "x-keep"] {
            assert_eq!(v.header(name), n.header(name), "{path} {name}");
        }
        let server = n.header("server");
        if server.starts_with("nginx") {
            assert_eq!(
                v.header("server"),
                "",
                "{path}: the upstream's Server is hidden"
            );
        } else {
            assert_eq!(v.header("server"), server, "{path}");
        }
    }
    // What those were (so that the test shows nginx's rules).
    assert_eq!(
        seen,
        [
            "http://h.test:PORT/one/p/next",
            "5; URL=/one/r",
            "/two/rel/next",
            "5; URL=/one/r",
            "http://h.test:PORT/plain/q/next",
            "5; URL=/two/r",
            "http://u/two/p/next",
            "5; URL=http://u/two/r",
            "http://h.test/ex/b/next",
            "5; URL=http://u/two/r",
            "http://h.test:PORT/explicit/c/next",
            "5; URL=http://u/two/r",
            "http://s2.test:PORT/from-server/z/next",
            "5; URL=/from-server/two/r",
            "http://s2.test:PORT/from-server/two/p/next",
            "5; URL=/from-server/two/r",
        ]
    );
}

#[tokio::test]
async fn absolute_redirect_server_name_and_port_in_redirect_as_nginx() {
    let t = Twin::start(
        "upstream u { server {B0}; }
         absolute_redirect off;
         server { listen {LISTEN}; server_name first.test second.test;
           location /rel { return 301 /to; }
           location /abs { absolute_redirect on; return 301 /to; }
           location /name { absolute_redirect on; server_name_in_redirect on; return 302 /to; }
           location /noport { absolute_redirect on; port_in_redirect off; return 302 /to; }
           location /dir/ { absolute_redirect on; port_in_redirect off; proxy_pass http://u; }
           location /reldir/ { proxy_pass http://u; }
           location /full { return 302 http://x.test/y; } }",
        1,
    )
    .await;
    for path in [
        "/rel", "/abs", "/name", "/noport", "/dir", "/reldir", "/full",
    ] {
        let req =
            format!("GET {path}?a=1 HTTP/1.1\r\nHost: host.test\r\nConnection: close\r\n\r\n");
        let (v, n) = t.send(req.as_bytes()).await;
        // Each side's own port in an absolute Location.
        let loc = |r: &Raw, port: u16| r.header("location").replace(&port.to_string(), "PORT");
        assert_eq!(
            (v.status, loc(&v, t.vigil.addr.port())),
            (n.status, loc(&n, t.nginx.addr.port())),
            "{path}"
        );
    }
}
