//! `error_page` whose page proxies (a URI or a named location), the
//! server's pages for a 404 of no location, and the access log lines of
//! the answers routing makes itself: the same conf and requests through
//! vigil and a stock nginx, comparing what the client, the backend and
//! the access log saw.

use std::path::Path;

use crate::twin::{Raw, Twin};

/// Both sides' log directory, and a twin whose `{LOG}` is each side's.
async fn twin(conf: &str) -> (Twin, tempfile::TempDir, tempfile::TempDir) {
    let (vd, nd) = (
        tempfile::tempdir().expect("tmp"),
        tempfile::tempdir().expect("tmp"),
    );
    let side = |d: &Path| vec![("{LOG}".to_string(), d.display().to_string())];
    let t = Twin::start_texts(conf, 1, &side(vd.path()), &side(nd.path())).await;
    (t, vd, nd)
}

/// The lines of `file` on both sides once each has `n`, the time masked.
async fn lines(vd: &Path, nd: &Path, file: &str, n: usize) -> (Vec<String>, Vec<String>) {
    let read = |d: &Path| -> Vec<String> {
        std::fs::read_to_string(d.join(file))
            .unwrap_or_default()
            .lines()
            .map(|l| match (l.find('['), l.find(']')) {
                (Some(a), Some(b)) if a < b => format!("{}[TIME]{}", &l[..a], &l[b + 1..]),
                _ => l.to_string(),
            })
            .collect()
    };
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    while (read(vd).len() < n || read(nd).len() < n) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let (v, n2) = (read(vd), read(nd));
    assert!(
        v.len() >= n && n2.len() >= n,
        "{n} lines in {file}\nvigil {v:#?}\nnginx {n2:#?}"
    );
    (v, n2)
}

/// The lines of both sides alike, but for the size of vigil's own error
/// pages (their signature `vigil` is 7 bytes shorter than `nginx/1.22.1`).
fn same_lines(v: &[String], n: &[String]) {
    let size = |l: &str| -> Option<(String, u64)> {
        // `... "GET / HTTP/1.1" 404 146 "-" "ua"`: status and size after the request.
        let after = l.split('"').nth(2)?;
        let mut f = after.split_whitespace();
        Some((f.next()?.to_string(), f.next()?.parse().ok()?))
    };
    assert_eq!(v.len(), n.len(), "vigil {v:#?}\nnginx {n:#?}");
    for (vl, nl) in v.iter().zip(n) {
        let fixed = match (size(vl), size(nl)) {
            (Some((s, a)), Some((_, b))) if a + 7 == b => {
                vl.replacen(&format!("\" {s} {a} "), &format!("\" {s} {b} "), 1)
            }
            _ => vl.clone(),
        };
        assert_eq!(&fixed, nl, "vigil {v:#?}\nnginx {n:#?}");
    }
}

/// Send `req` to both; the same status and body (error pages differ in
/// their signature line only), and the responses.
async fn same(t: &Twin, req: &str) -> (Raw, Raw) {
    let (v, n) = t.send(req.as_bytes()).await;
    let body = |r: &Raw| String::from_utf8_lossy(&r.body).replace("nginx/1.22.1", "vigil");
    assert_eq!(
        (v.status, body(&v)),
        (n.status, body(&n)),
        "{req}\nvigil {v:?}\nnginx {n:?}\n{}",
        t.stock.error_log()
    );
    (v, n)
}

/// What backend 0 of each side saw: method, URI, Content-Length, body.
fn seen(t: &Twin) -> (Vec<String>, Vec<String>) {
    let show = |s: Vec<crate::support::Seen>| -> Vec<String> {
        s.into_iter()
            .map(|r| {
                let len = r
                    .headers
                    .get("content-length")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("-")
                    .to_string();
                format!(
                    "{} {} len={len} {:?}",
                    r.method,
                    r.uri,
                    String::from_utf8_lossy(&r.body)
                )
            })
            .collect()
    };
    let (v, n) = t.seen(0);
    (show(v), show(n))
}

fn get(method: &str, target: &str, host: &str, body: &str) -> String {
    let len = if body.is_empty() {
        String::new()
    } else {
        format!("Content-Length: {}\r\n", body.len())
    };
    format!(
        "{method} {target} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: twin\r\n{len}Connection: close\r\n\r\n{body}"
    )
}

const PAGES: &str = r#"
    upstream dead { server 127.0.0.1:1; }
    upstream st { server {B0}; }
    server { listen {LISTEN};
      access_log {LOG}/access.log;
      location /a/ { proxy_pass http://dead; error_page 502 503 /maint; }
      location = /maint { proxy_pass http://st; }
      location /b/ { proxy_pass http://dead; error_page 502 =200 @fallback; }
      location @fallback { proxy_pass http://st; }
      location /c/ { proxy_pass http://dead; error_page 502 = /eq?x=1; }
      location = /eq { proxy_pass http://st/eqpath; }
      location /d/ { proxy_pass http://dead; error_page 502 =404 /maint?from=d; }
      location /e/ { proxy_pass http://dead; error_page 502 /rw; }
      location = /rw { rewrite ^ /rewritten break; proxy_pass http://st; }
      location /f/ { proxy_pass http://dead; error_page 502 =200 /denied; }
      location = /denied { deny all; proxy_pass http://st; }
      location /g/ { proxy_pass http://dead; error_page 502 /again; }
      location = /again { proxy_pass http://dead; error_page 502 /maint; }
      location /h/ { proxy_pass http://dead; error_page 502 /nowhere; }
      location /i/ { proxy_pass http://dead; error_page 502 =201 @ret; }
      location @ret { return 200 "named $request_method $uri"; }
      location /s/ { proxy_pass http://dead; proxy_request_buffering off; error_page 502 /maint?from=s; }
      location /t/ { proxy_pass http://dead; client_max_body_size 4; error_page 413 /maint?from=t; }
    }"#;

#[tokio::test]
async fn pages_that_proxy_answer_as_nginx() {
    let (t, vd, nd) = twin(PAGES).await;
    let reqs = [
        get("GET", "/a/x?q=1", "h.test", ""),
        get("POST", "/a/post", "h.test", "hello=world"),
        get("HEAD", "/a/head", "h.test", ""),
        get("POST", "/b/named?k=v", "h.test", "named=1"),
        get("GET", "/c/eq", "h.test", ""),
        get("GET", "/d/x", "h.test", ""),
        get("GET", "/e/x", "h.test", ""),
        get("GET", "/f/x", "h.test", ""),
        get("GET", "/g/x", "h.test", ""),
        get("GET", "/h/x", "h.test", ""),
        get("PUT", "/i/x", "h.test", "put"),
        get("POST", "/s/x", "h.test", "streamed=1"),
        get("POST", "/t/x", "h.test", "toolarge=1"),
    ];
    for r in &reqs {
        same(&t, r).await;
    }
    let (v, mut n) = seen(&t);
    // A discarded body: nginx still says `Content-Length: 0`, vigil sends
    // none (as for every empty body).
    for l in n.iter_mut().filter(|l| l.starts_with("GET /maint?from=t ")) {
        *l = l.replace(" len=0 ", " len=- ");
    }
    assert_eq!(v, n, "what the backends saw (vigil, nginx)");
    assert_eq!(
        v[v.len() - 2..],
        [
            "GET /maint?from=s len=10 \"streamed=1\"",
            "GET /maint?from=t len=- \"\""
        ],
        "a streamed body no attempt took goes to the page; one over the limit does not"
    );
    assert_eq!(
        v[..5],
        [
            "GET /maint len=- \"\"",
            "GET /maint len=11 \"hello=world\"",
            "HEAD /maint len=- \"\"",
            "POST /b/named?k=v len=7 \"named=1\"",
            "GET /eqpath?x=1 len=- \"\"",
        ],
        "a URI page is a GET (HEAD stays), a named one keeps the method; the body goes again"
    );
    let (vl, nl) = lines(vd.path(), nd.path(), "access.log", reqs.len()).await;
    same_lines(&vl, &nl);
    assert_eq!(
        vl.len(),
        reqs.len(),
        "one line per request, with the page's status"
    );
    assert!(
        vl[0].contains("\"GET /a/x?q=1 HTTP/1.1\" 502 2 "),
        "{}",
        vl[0]
    );
}

#[tokio::test]
async fn server_pages_answer_a_404_of_no_location_as_nginx() {
    let conf = r#"
    upstream st { server {B0}; }
    server { listen {LISTEN} default_server; server_name a.test;
      access_log {LOG}/a.log;
      error_page 404 /nf;
      location = /nf { proxy_pass http://st; }
      location /api/ { proxy_pass http://st; }
    }
    server { listen {LISTEN}; server_name b.test;
      access_log {LOG}/b.log;
      error_page 404 = @fb;
      location @fb { proxy_pass http://st; }
      location /x/ { return 200 "x"; }
    }
    server { listen {LISTEN}; server_name c.test;
      access_log {LOG}/c.log;
      error_page 404 =200 /ret;
      location = /ret { return 200 "ret $uri $args"; }
    }"#;
    let (t, vd, nd) = twin(conf).await;
    let reqs = [
        get("GET", "/zz?k=v", "a.test", ""),
        get("POST", "/zz", "a.test", "nf=3"),
        get("GET", "/api", "a.test", ""),
        get("DELETE", "/none/1?q", "b.test", ""),
        get("GET", "/none/2?q", "b.test", ""),
        get("GET", "/none", "c.test", ""),
    ];
    for r in &reqs {
        same(&t, r).await;
    }
    let (v, n) = seen(&t);
    assert_eq!(v, n, "what the backends saw (vigil, nginx)");
    assert_eq!(v.len(), 3, "{v:?}");
    let (va, na) = lines(vd.path(), nd.path(), "a.log", 3).await;
    same_lines(&va, &na);
    assert!(va[1].contains("\"POST /zz HTTP/1.1\" 404 2 "), "{}", va[1]);
    let (vb, nb) = lines(vd.path(), nd.path(), "b.log", 2).await;
    same_lines(&vb, &nb);
    assert!(
        vb[0].contains("\"DELETE /none/1?q HTTP/1.1\" 405 "),
        "{}",
        vb[0]
    );
    let (vc, nc) = lines(vd.path(), nd.path(), "c.log", 1).await;
    same_lines(&vc, &nc);
}

#[tokio::test]
async fn answers_routing_makes_itself_are_logged_as_nginx() {
    let conf = r#"
    upstream u { server {B0}; }
    server { listen {LISTEN} default_server; server_name a.test;
      access_log {LOG}/a.log;
      location /p/ { proxy_pass http://u; }
      location /r/ { return 302 /elsewhere; }
      location /w/ { rewrite ^/w/(.*)$ /p/$1 permanent; }
      location /d/ { deny all; proxy_pass http://u; }
    }
    server { listen {LISTEN}; server_name ret.test;
      access_log {LOG}/ret.log;
      return 403;
    }
    server { listen {LISTEN}; server_name rw.test;
      access_log {LOG}/rw.log;
      rewrite ^ http://example.test/moved redirect;
    }"#;
    let (t, vd, nd) = twin(conf).await;
    let reqs = [
        get("GET", "/none?x=1", "a.test", ""),
        get("GET", "/p", "a.test", ""),
        get("GET", "/r/", "a.test", ""),
        get("GET", "/w/a", "a.test", ""),
        get("GET", "/d/", "a.test", ""),
        get("GET", "/a/../../above", "a.test", ""),
        get("PUT", "/none", "a.test", "x"),
        // Refused by the request-head check (the default server logs them).
        "GET /dup HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\nConnection: close\r\n\r\n".into(),
        "GET /nohost?q=1 HTTP/1.1\r\nConnection: close\r\n\r\n".into(),
        "\r\nGET /badline HTTP/1.1\r\nHost: a.test\r\nBad Header: x\r\n\r\n".into(),
        get("GET", "/x", "ret.test", ""),
        get("GET", "/y", "rw.test", ""),
    ];
    for r in &reqs {
        same(&t, r).await;
    }
    let (va, na) = lines(vd.path(), nd.path(), "a.log", 10).await;
    same_lines(&va, &na);
    assert!(
        va[0].contains("\"GET /none?x=1 HTTP/1.1\" 404 "),
        "{}",
        va[0]
    );
    let (vr, nr) = lines(vd.path(), nd.path(), "ret.log", 1).await;
    same_lines(&vr, &nr);
    assert!(vr[0].contains("\"GET /x HTTP/1.1\" 403 "), "{}", vr[0]);
    let (vw, nw) = lines(vd.path(), nd.path(), "rw.log", 1).await;
    same_lines(&vw, &nw);
}

#[tokio::test]
async fn upstream_variables_of_a_paged_request_as_nginx() {
    let conf = r#"
    log_format up '"$request" $status $upstream_addr|$upstream_status';
    upstream dead { server 127.0.0.1:1; }
    upstream st { server {B0}; }
    server { listen {LISTEN};
      access_log {LOG}/up.log up;
      location /a/ { proxy_pass http://dead; error_page 502 /maint; }
      location = /maint { proxy_pass http://st; }
      location /r/ { proxy_pass http://dead; error_page 502 =200 @ret; }
      location @ret { return 200 "r"; }
    }"#;
    let (t, vd, nd) = twin(conf).await;
    for target in ["/a/x", "/r/y"] {
        same(&t, &get("GET", target, "h.test", "")).await;
    }
    let (mut v, mut n) = lines(vd.path(), nd.path(), "up.log", 2).await;
    // Each side's backend has its own port.
    let (va, na) = (t.vigil.backends[0].addr, t.nginx.backends[0].addr);
    v.iter_mut()
        .for_each(|l| *l = l.replace(&va.to_string(), "B0"));
    n.iter_mut()
        .for_each(|l| *l = l.replace(&na.to_string(), "B0"));
    assert_eq!(v, n);
    assert_eq!(
        v,
        [
            "\"GET /a/x HTTP/1.1\" 502 127.0.0.1:1 : B0|502 : 200",
            "\"GET /r/y HTTP/1.1\" 200 127.0.0.1:1|502",
        ],
        "the groups of an internal redirect are separated by ` : `"
    );
}

#[tokio::test]
async fn an_intercepted_401_keeps_the_upstreams_www_authenticate_as_nginx() {
    const DENIED: &[u8] = b"HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Basic realm=\"x\"\r\n\
        X-Other: o\r\nContent-Length: 4\r\nConnection: close\r\n\r\nnope";
    let (vb, _) = crate::twin::raw_backend(DENIED).await;
    let (nb, _) = crate::twin::raw_backend(DENIED).await;
    let t = Twin::start_with(
        "upstream u { server {R0}; }
         server { listen {LISTEN};
           location / { proxy_pass http://u; proxy_intercept_errors on; error_page 401 /denied; }
           location = /denied { return 401 \"denied\\n\"; } }",
        0,
        &[("{R0}", vb)],
        &[("{R0}", nb)],
    )
    .await;
    let (v, n) = same(
        &t,
        "GET /x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(v.status, 401);
    // nginx's ngx_http_upstream_intercept_errors carries this one field
    // of the upstream's 401 to the page's answer, and no other.
    assert_eq!(v.header("www-authenticate"), n.header("www-authenticate"));
    assert_eq!(v.header("www-authenticate"), "Basic realm=\"x\"");
    assert_eq!(v.header("x-other"), n.header("x-other"));
}

#[tokio::test]
async fn a_return_without_text_and_a_deny_go_to_their_error_page_as_nginx() {
    let (t, _vd, _nd) = twin(
        "upstream u { server {B0}; }
         server { listen {LISTEN};
           error_page 404 /nf;
           location /gone { return 404; }
           location /text { return 404 \"text\\n\"; }
           location = /nf { return 200 \"not found page\\n\"; }
           location /deny { deny all; error_page 403 /forbidden; proxy_pass http://u; }
           location = /forbidden { return 200 \"forbidden page\\n\"; }
           location /coded { error_page 410 =202 /nf; return 410; }
           location /again { error_page 404 /gone/2; return 404; }
           location /plain { error_page 500 /nf; return 404; }
           location /moved { error_page 302 /nf; return 302 /elsewhere; }
         }",
    )
    .await;
    for path in [
        "/gone", "/text", "/deny/x", "/coded", "/again", "/plain", "/nf", "/moved",
    ] {
        let (v, n) = same(
            &t,
            &format!("GET {path} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"),
        )
        .await;
        assert!(v.status != 0, "{path}");
        // A page that is an internal redirect keeps the first answer's
        // Location (each side's own port in it).
        let path_of = |l: String| l.splitn(4, '/').nth(3).map(str::to_string);
        assert_eq!(
            path_of(v.header("location")),
            path_of(n.header("location")),
            "{path}"
        );
    }
}
