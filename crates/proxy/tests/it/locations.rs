//! Regex, nested and named locations, captures, `rewrite`, `set` and
//! `map`, each conf served by vigil and by a stock nginx: the same
//! requests, compared on the status and body each client got and the URIs
//! (and headers) each backend saw.

use crate::twin::{Raw, Twin};

pub(crate) fn get(target: &str, host: &str) -> Vec<u8> {
    format!("GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").into_bytes()
}

/// Send each target to both; assert the same status, body and
/// `Location` (each side's own port as PORT); the answers.
pub(crate) async fn same(t: &Twin, targets: &[&str]) -> Vec<(Raw, Raw)> {
    let mut out = Vec::new();
    for target in targets {
        let (v, n) = t.send(&get(target, "h.test")).await;
        let loc = |r: &Raw, port: u16| r.header("location").replace(&format!(":{port}"), ":PORT");
        // Error pages differ in their signature line only (vigil / nginx).
        let body = |r: &Raw| String::from_utf8_lossy(&r.body).replace("nginx/1.22.1", "vigil");
        assert_eq!(
            (v.status, body(&v)),
            (n.status, body(&n)),
            "{target}\nvigil {v:?}\nnginx {n:?}\n{}",
            t.stock.error_log()
        );
        assert_eq!(
            loc(&v, t.vigil.addr.port()),
            loc(&n, t.nginx.addr.port()),
            "Location for {target}"
        );
        out.push((v, n));
    }
    out
}

pub(crate) fn same_uris(t: &Twin) {
    // Another test's active check may reach a port a backend here reuses.
    let ours = |sides: Vec<Vec<String>>| -> Vec<Vec<String>> {
        sides
            .into_iter()
            .map(|b| b.into_iter().filter(|u| u != "/health").collect())
            .collect()
    };
    let (v, n) = t.uris();
    let (v, n) = (ours(v), ours(n));
    assert_eq!(v, n, "what the backends saw (vigil, nginx)");
}

#[tokio::test]
async fn regex_locations_match_in_nginx_order() {
    let t = Twin::start(
        r#"upstream u0 { server {B0}; }
         upstream u1 { server {B1}; }
         server { listen {LISTEN};
           location / { proxy_pass http://u0; }
           location ^~ /static/ { return 200 "static"; }
           location /prefix/ { return 200 "prefix"; }
           location ~ \.php$ { return 200 "php"; }
           location ~* \.(jpg|PNG)$ { return 200 "img $1"; }
           location ~ ^/prefix/(.+)\.txt$ { return 200 "txt $1"; }
           location = /exact.php { return 200 "exact"; }
           location ~ ^/first { return 200 "first"; }
           location ~ ^/fir { return 200 "second"; }
           location ~ "^/users/(?<id>[0-9]+)/(\w+)$" { return 200 "user $id $2 $1"; }
           location ~ ^/up/(.*)$ { proxy_pass http://u1; }
         }"#,
        2,
    )
    .await;
    same(
        &t,
        &[
            "/",
            "/a.php",
            "/static/a.php",
            "/prefix/a.php",
            "/prefix/b.txt",
            "/prefix/x",
            "/exact.php",
            "/x/A.JPG",
            "/x/a.png",
            "/x/a.Png",
            "/first/x",
            "/fi",
            "/users/12/name",
            "/users/x/name",
            "/up/a%20b?q=1",
            "/A.PHP",
        ],
    )
    .await;
    same_uris(&t);
}

#[tokio::test]
async fn nested_and_named_locations_answer_as_nginx() {
    let t = Twin::start(
        r#"upstream u0 { server {B0}; }
         upstream u1 { server {B1}; }
         server { listen {LISTEN};
           location / { proxy_pass http://u0; }
           location ~ /v[0-9]+/ { return 200 "outer regex"; }
           location /api/ {
             proxy_pass http://u1;
             location /api/admin/ { return 403 "admin"; }
             location ~ /api/v(\d+)/ { return 200 "nested v$1"; }
           }
           location ^~ /app/ {
             location ~ \.js$ { return 200 "js"; }
             return 200 "app";
           }
           location ~ \.js$ { return 200 "top js"; }
           location @fallback { return 200 "named"; }
         }"#,
        2,
    )
    .await;
    same(
        &t,
        &[
            "/api/x",
            "/api/v2/x",
            "/api/admin/x",
            "/v3/x",
            "/app/a.js",
            "/app/x",
            "/b.js",
            "/@fallback",
            "/api",
        ],
    )
    .await;
    same_uris(&t);
}

#[tokio::test]
async fn captures_and_variables_in_proxy_pass_reach_the_backend_as_from_nginx() {
    let t = Twin::start(
        r#"upstream u0 { server {B0}; }
         server { listen {LISTEN};
           location ~ ^/api/(?<rest>.*)$ { proxy_pass http://u0/v2/$rest$is_args$args; }
           location ~ ^/raw/(.*)$ { proxy_pass http://u0/r/$1; }
           location ~ ^/whole { proxy_pass http://u0$request_uri; }
           location ~ ^/plain/ { proxy_pass http://u0; }
           location /pre/ { proxy_pass http://u0/p/; }
         }"#,
        1,
    )
    .await;
    same(
        &t,
        &[
            "/api/a/b?x=1",
            "/api/a/b",
            "/raw/q?z=2",
            "/whole/x?y=3",
            "/plain/%7Ex?k",
            "/pre/a%2Fb",
        ],
    )
    .await;
    same_uris(&t);
}

#[tokio::test]
async fn rewrite_in_server_and_location_as_nginx() {
    let t = Twin::start(
        r#"upstream u0 { server {B0}; }
         server { listen {LISTEN};
           rewrite ^/old/(.*)$ /new/$1;
           rewrite ^/perm/(.*)$ /p/$1 permanent;
           rewrite ^/ext https://example.test/z? redirect;
           rewrite ^/tmp/(.*) /t/$1?from=tmp redirect;
           location /new/ { proxy_pass http://u0; }
           location /l/ { rewrite ^/l/(.*)$ /target/$1 last; return 200 "not reached"; }
           location /target/ { proxy_pass http://u0; }
           location /b/ { rewrite ^/b/(.*)$ /bb/$1 break; proxy_pass http://u0/ignored/; }
           location /loop { rewrite ^ /loop last; }
           location /q/ { rewrite ^/q/(.*)$ /target/$1?a=1 last; }
           location /drop/ { rewrite ^/drop/(.*)$ /target/$1? last; }
           location /r/ { rewrite ^/r/(.*)$ /s/$1; rewrite ^/nomatch /x; return 200 "uri=$uri args=$args c=[$1]"; }
           location /set/ { set $who "w-$arg_a"; set $args "k=v"; return 200 "$who $args $is_args"; }
           location ~ ^/cap/(?<part>\w+) { rewrite ^ /target/$part last; }
           location /esc/ { rewrite ^/esc/(.*)$ /target/$1 break; proxy_pass http://u0; }
         }"#,
        1,
    )
    .await;
    same(
        &t,
        &[
            "/old/x?k=1",
            "/perm/x?k=2",
            "/ext?k=3",
            "/tmp/y?k=4",
            "/tmp/y",
            "/l/a?z=1",
            "/b/c?z=2",
            "/loop",
            "/q/d?z=3",
            "/q/d",
            "/drop/e?z=4",
            "/r/f?z=5",
            "/set/?a=7",
            "/cap/word",
            "/esc/a%20b",
        ],
    )
    .await;
    same_uris(&t);
}

#[tokio::test]
async fn maps_give_the_values_nginx_gives() {
    let t = Twin::start(
        r#"map $uri $m1 {
             default d;
             /exact e;
             ~^/re/(\d+) "re$1";
             ~*^/CI ci;
             \default escaped;
           }
           map $host $h {
             hostnames;
             default none;
             .example.test dot;
             *.sub.test star;
             www.tail.* tail;
             exact.test ex;
           }
           map $m1 $chained { volatile; e chained-e; default "c-$m1"; }
           server { listen {LISTEN};
             location / { return 200 "$m1 $h $chained"; }
           }"#,
        0,
    )
    .await;
    for host in [
        "example.test",
        "a.example.test",
        "x.sub.test",
        "sub.test",
        "www.tail.org",
        "EXACT.test",
        "other.test",
    ] {
        for target in ["/exact", "/EXACT", "/re/42x", "/ci/y", "/default", "/none"] {
            let (v, n) = t.send(&get(target, host)).await;
            assert_eq!(
                (v.status, String::from_utf8_lossy(&v.body)),
                (n.status, String::from_utf8_lossy(&n.body)),
                "{host} {target}"
            );
        }
    }
}

#[tokio::test]
async fn error_pages_answer_as_nginx() {
    use bytes::Bytes;
    use http_body_util::Full;
    let not_found = || async {
        crate::support::Backend::start(|_| {
            let mut r = hyper::Response::new(Full::new(Bytes::from("upstream 404")));
            *r.status_mut() = hyper::StatusCode::NOT_FOUND;
            r
        })
        .await
    };
    let (v404, n404) = (not_found().await, not_found().await);
    let t = Twin::start_with(
        r#"upstream dead { server 127.0.0.1:1; }
         upstream gone { server {R0}; }
         server { listen {LISTEN};
           error_page 502 =200 /srv;
           location = /srv { return 200 "server page"; }
           location /inherit/ { proxy_pass http://dead; }
           location /own/ { proxy_pass http://dead; error_page 404 /srv; }
           location /down/ { proxy_pass http://dead; error_page 502 =503 @maint; }
           location @maint { return 200 "maintenance $uri"; }
           location /down2/ { proxy_pass http://dead; error_page 502 504 /err.txt?code=5xx; }
           location = /err.txt { return 200 "err $args $request_method $uri"; }
           location /down3/ { proxy_pass http://dead; error_page 502 =301 http://example.test/moved; }
           location /down4/ { proxy_pass http://dead; error_page 502 = /eq; }
           location /down5/ { proxy_pass http://dead; error_page 502 http://example.test/tmp; }
           location = /eq { return 201 "eq"; }
           location /inter/ { proxy_pass http://gone; proxy_intercept_errors on; error_page 404 =200 /found; }
           location /nointer/ { proxy_pass http://gone; error_page 404 /found; }
           location = /found { return 200 "found"; }
         }"#,
        0,
        &[("{R0}", v404.addr)],
        &[("{R0}", n404.addr)],
    )
    .await;
    same(
        &t,
        &[
            "/down/x",
            "/down2/y?a=1",
            "/down3/z",
            "/down4/w",
            "/down5/v",
            "/inter/a",
            "/nointer/b",
            "/inherit/c",
            "/own/d",
        ],
    )
    .await;
}
