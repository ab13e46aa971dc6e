//! Static files beside a stock nginx: the same conf and the same files
//! (one temporary directory both serve), the same request bytes, and the
//! answers compared: status, the headers a client or cache acts on
//! (Content-Type, Content-Length, Last-Modified, ETag, Accept-Ranges,
//! Content-Range, Location, Cache-Control, Expires) and, for answers that
//! are files, the bodies (the error pages' differ by their signature).

use std::path::Path;

use crate::twin::{Raw, Twin};

/// The files both sides serve.
fn tree() -> tempfile::TempDir {
    let d = tempfile::tempdir().expect("tmp");
    let w = |p: &str, body: &[u8]| {
        let path = d.path().join(p);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("mkdir");
        }
        std::fs::write(path, body).expect("write");
    };
    w("www/a.txt", b"hello world\n");
    w("www/style.CSS", b"body{}\n");
    w("www/page.html", b"<p>page</p>\n");
    w("www/dir/index.html", b"<h1>dir</h1>\n");
    w("www/dir/sub/index.htm", b"<h1>htm</h1>\n");
    w("www/404.html", b"<h1>not here</h1>\n");
    w("www/app/only.txt", b"static\n");
    w("www/.hidden", b"dot\n");
    w("secret/s.txt", b"secret\n");
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    w("www/big.bin", &big);
    std::fs::create_dir_all(d.path().join("www/empty")).expect("mkdir");
    std::os::unix::fs::symlink(d.path().join("secret/s.txt"), d.path().join("www/link.txt"))
        .expect("symlink");
    // Not a regular file: opened (non-blocking) and never read.
    rustix::fs::mknodat(
        rustix::fs::CWD,
        d.path().join("www/fifo"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .expect("mkfifo");
    w(
        "html/index.nginx-debian.html",
        b"<h1>Welcome to nginx!</h1>\n",
    );
    // One time for every file, long past (2020-01-01): `expires modified`
    // is then the same on both sides whatever the second.
    let past = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_577_836_800);
    for f in ["a.txt", "style.CSS", "page.html", "big.bin", "404.html"] {
        std::fs::File::options()
            .write(true)
            .open(d.path().join("www").join(f))
            .and_then(|f| f.set_modified(past))
            .expect("set mtime");
    }
    d
}

/// A twin serving `conf` with `{ROOT}` the tree's directory and one
/// backend; `{MIME}` is nginx's /etc/nginx/mime.types for nginx and a
/// `mime.types` vigil's prefix does not have (its built-in copy) for vigil.
async fn twin(conf: &str) -> (Twin, tempfile::TempDir) {
    let d = tree();
    let side = |p: &Path, mime: &str| {
        vec![
            ("{ROOT}".to_string(), p.display().to_string()),
            ("{MIME}".to_string(), mime.to_string()),
        ]
    };
    let t = Twin::start_texts(
        conf,
        1,
        &side(d.path(), "mime.types"),
        &side(d.path(), "/etc/nginx/mime.types"),
    )
    .await;
    (t, d)
}

/// The headers compared, with each side's own address taken out of `Location`.
const COMPARED: &[&str] = &[
    "content-type",
    "content-length",
    "last-modified",
    "etag",
    "accept-ranges",
    "content-range",
    "location",
    "cache-control",
];

/// `v` and `n` agree on the status, the compared headers and (when the
/// answer is a file's) the body, the multipart boundary aside.
fn same(t: &Twin, what: &str, v: &Raw, n: &Raw) {
    assert_eq!(v.status, n.status, "{what}\nvigil {v:?}\nnginx {n:?}");
    let generated = v.status >= 300 && v.header("content-type") == "text/html";
    for h in COMPARED {
        if generated && *h == "content-length" {
            continue;
        }
        let fixed = |r: &Raw, addr: std::net::SocketAddr| {
            r.header(h).replace(&format!(":{}/", addr.port()), ":PORT/")
        };
        assert_eq!(
            fixed(v, t.vigil.addr),
            fixed(n, t.nginx.addr),
            "{what}: {h}\nvigil {}\nnginx {}",
            v.head,
            n.head
        );
    }
    assert_eq!(
        v.header("expires").is_empty(),
        n.header("expires").is_empty(),
        "{what}: expires\nvigil {}\nnginx {}",
        v.head,
        n.head
    );
    if !generated {
        assert_eq!(v.body, n.body, "{what}: body");
    }
}

/// Send `req` (a request line and headers, and after a blank line a
/// body) to both, with a Host and `Connection: close`.
async fn both(t: &Twin, req: &str) -> (Raw, Raw) {
    let (head, body) = req.split_once("\r\n\r\n").unwrap_or((req, ""));
    let bytes = format!("{head}\r\nHost: files.test\r\nConnection: close\r\n\r\n{body}");
    t.send(bytes.as_bytes()).await
}

async fn check(t: &Twin, req: &str) -> (Raw, Raw) {
    let (v, n) = both(t, req).await;
    same(t, req, &v, &n);
    (v, n)
}

const PLAIN: &str = "include {MIME};
     server { listen {LISTEN}; root {ROOT}/www;
       location /alias/ { alias {ROOT}/www/dir/; }
       location /al { alias {ROOT}/www/; }
       location ~ ^/re/(.+)$ { alias {ROOT}/www/$1; }
       location /idx/ { alias {ROOT}/www/dir/; index nope.html sub/index.htm index.html; }
       location /noidx/ { alias {ROOT}/www/dir/; index none.html; }
       location /typed/ { alias {ROOT}/www/; types { text/x-mine txt; } default_type application/x-def; }
       location /limited/ { alias {ROOT}/www/; max_ranges 1; }
       location /noranges/ { alias {ROOT}/www/; max_ranges 0; etag off; }
       location /before/ { alias {ROOT}/www/; if_modified_since before; }
       location /ims-off/ { alias {ROOT}/www/; if_modified_since off; }
       location /small/ { alias {ROOT}/www/; client_max_body_size 2; }
     }";

#[tokio::test]
async fn files_directories_and_indexes_answer_as_nginx() {
    let (t, _d) = twin(PLAIN).await;
    for req in [
        "GET /a.txt HTTP/1.1",
        "HEAD /a.txt HTTP/1.1",
        "GET /style.CSS HTTP/1.1",
        "GET /page.html HTTP/1.1",
        "GET /.hidden HTTP/1.1",
        "GET /big.bin HTTP/1.1",
        "GET /dir HTTP/1.1",
        "GET /dir?x=1 HTTP/1.1",
        "GET /dir/ HTTP/1.1",
        "GET /dir/?q HTTP/1.1",
        "GET /empty/ HTTP/1.1",
        "GET /nope HTTP/1.1",
        "GET /nope/ HTTP/1.1",
        "GET /a.txt/ HTTP/1.1",
        "GET /a.txt/x HTTP/1.1",
        "GET /fifo HTTP/1.1",
        "POST /a.txt HTTP/1.1\r\nContent-Length: 0",
        "POST /dir/ HTTP/1.1\r\nContent-Length: 0",
        "DELETE /a.txt HTTP/1.1",
        "DELETE /dir/ HTTP/1.1",
        "POST /small/a.txt HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc",
        "GET /small/a.txt HTTP/1.1\r\nContent-Length: 2\r\n\r\nab",
        "GET /alias/ HTTP/1.1",
        "GET /alias/index.html HTTP/1.1",
        "GET /al/a.txt HTTP/1.1",
        "GET /al/dir HTTP/1.1",
        "GET /re/a.txt HTTP/1.1",
        "GET /re/dir HTTP/1.1",
        "GET /idx/ HTTP/1.1",
        "GET /idx/sub/ HTTP/1.1",
        "GET /noidx/ HTTP/1.1",
        "GET /typed/a.txt HTTP/1.1",
        "GET /typed/page.html HTTP/1.1",
        "GET /typed/dir/ HTTP/1.1",
    ] {
        check(&t, req).await;
    }
    // Not only alike: what nginx answers is what a client wants.
    let (v, _) = both(&t, "GET /dir HTTP/1.1").await;
    assert_eq!(v.status, 301);
    assert!(v.header("location").ends_with("/dir/"), "{}", v.head);
    let (v, _) = both(&t, "GET /big.bin HTTP/1.1").await;
    assert_eq!(v.body.len(), 300_000);
    let (v, _) = both(
        &t,
        "POST /small/a.txt HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc",
    )
    .await;
    assert_eq!(v.status, 413);
}

#[tokio::test]
async fn conditional_requests_get_304_and_412_as_nginx() {
    let (t, _d) = twin(PLAIN).await;
    let (v, _) = check(&t, "GET /a.txt HTTP/1.1").await;
    let (lm, etag) = (v.header("last-modified"), v.header("etag"));
    assert!(!lm.is_empty() && etag.starts_with('"'), "{}", v.head);
    let old = "Thu, 01 Jan 1970 00:00:01 GMT";
    let later = "Fri, 01 Jan 2100 00:00:00 GMT";
    for path in ["/a.txt", "/before/a.txt", "/ims-off/a.txt"] {
        for h in [
            format!("If-Modified-Since: {lm}"),
            format!("If-Modified-Since: {old}"),
            format!("If-Modified-Since: {later}"),
            "If-Modified-Since: not a date".to_string(),
            format!("If-None-Match: {etag}"),
            format!("If-None-Match: W/{etag}"),
            format!("If-None-Match: \"x\", {etag}"),
            "If-None-Match: *".to_string(),
            "If-None-Match: \"x\"".to_string(),
            format!("If-None-Match: \"x\"\r\nIf-Modified-Since: {lm}"),
            format!("If-Match: {etag}"),
            "If-Match: \"x\"".to_string(),
            format!("If-Match: W/{etag}"),
            format!("If-Unmodified-Since: {lm}"),
            format!("If-Unmodified-Since: {old}"),
            "If-Unmodified-Since: garbage".to_string(),
        ] {
            check(&t, &format!("GET {path} HTTP/1.1\r\n{h}")).await;
        }
    }
    let (v, _) = both(&t, &format!("GET /a.txt HTTP/1.1\r\nIf-None-Match: {etag}")).await;
    assert_eq!(v.status, 304);
    assert!(v.body.is_empty());
}

#[tokio::test]
async fn ranges_answer_206_416_and_multipart_as_nginx() {
    let (t, _d) = twin(PLAIN).await;
    let (v, _) = check(&t, "GET /a.txt HTTP/1.1").await;
    let (lm, etag) = (v.header("last-modified"), v.header("etag"));
    for path in ["/a.txt", "/big.bin", "/limited/a.txt", "/noranges/a.txt"] {
        for range in [
            "bytes=0-4",
            "bytes=6-",
            "bytes=-5",
            "bytes=-100",
            "bytes=2-1000000",
            "bytes=100000-",
            "bytes=5-3",
            "bytes=x",
            "bytes = 0-1",
            "BYTES=0-1",
            "bytes=0-1,4-5",
            "bytes=0-5,3-9",
            "bytes=0-1,-2",
            "bytes=0-0,2-2,4-4",
            "bytes=1-2,100000-",
            "chunks=0-1",
        ] {
            check(&t, &format!("GET {path} HTTP/1.1\r\nRange: {range}")).await;
        }
        for if_range in [
            etag.clone(),
            "\"other\"".to_string(),
            lm.clone(),
            "Thu, 01 Jan 1970 00:00:01 GMT".to_string(),
        ] {
            check(
                &t,
                &format!("GET {path} HTTP/1.1\r\nRange: bytes=0-3\r\nIf-Range: {if_range}"),
            )
            .await;
        }
    }
    check(&t, "HEAD /a.txt HTTP/1.1\r\nRange: bytes=0-3").await;
    let (v, _) = both(&t, "GET /a.txt HTTP/1.1\r\nRange: bytes=0-4").await;
    assert_eq!((v.status, &v.body[..]), (206, &b"hello"[..]));
    let (v, _) = both(&t, "GET /a.txt HTTP/1.1\r\nRange: bytes=50-").await;
    assert_eq!(v.status, 416);
    assert_eq!(v.header("content-range"), "bytes */12");
}

#[tokio::test]
async fn try_files_internal_and_error_pages_answer_as_nginx() {
    let conf = "server { listen {LISTEN}; root {ROOT}/www;
       error_page 404 /404.html;
       location = /404.html { internal; }
       location /app/ { try_files $uri $uri/ @app; }
       location @app { proxy_pass http://{B0}; }
       location /spa/ { try_files $uri /page.html; }
       location /strict/ { try_files $uri =404; }
       location /code/ { try_files /nope =418; }
       location /dirs/ { alias {ROOT}/www/; try_files $uri $uri/ =403; }
       location /args/ { try_files /nope /a.txt?x=1; }
       location /quiet/ { alias {ROOT}/www/; log_not_found off; error_page 404 =200 /a.txt; }
     }";
    let (t, _d) = twin(conf).await;
    for req in [
        "GET /app/only.txt HTTP/1.1",
        "GET /app/dynamic?q=1 HTTP/1.1",
        "POST /app/dynamic HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc",
        "GET /spa/deep/link HTTP/1.1",
        "GET /strict/missing HTTP/1.1",
        "GET /code/x HTTP/1.1",
        "GET /dirs/dir HTTP/1.1",
        "GET /dirs/dir/ HTTP/1.1",
        "GET /dirs/nothing HTTP/1.1",
        "GET /args/x HTTP/1.1",
        "GET /404.html HTTP/1.1",
        "GET /missing HTTP/1.1",
        "HEAD /missing HTTP/1.1",
        "GET /quiet/missing HTTP/1.1",
    ] {
        check(&t, req).await;
    }
    // The fallbacks reached the backend with the client's URI (and body).
    let (v, n) = t.uris();
    assert_eq!(v, n);
    assert_eq!(v[0], ["/app/dynamic?q=1", "/app/dynamic"]);
    // The page's file under the error's status.
    let (v, _) = both(&t, "GET /missing HTTP/1.1").await;
    assert_eq!((v.status, &v.body[..]), (404, &b"<h1>not here</h1>\n"[..]));
}

#[tokio::test]
async fn traversal_attempts_get_nginx_answers() {
    let conf = "server { listen {LISTEN}; root {ROOT}/www;
       location /alias/ { alias {ROOT}/www/dir/; }
     }";
    let (t, _d) = twin(conf).await;
    for req in [
        "GET /alias/../secret/s.txt HTTP/1.1",
        "GET /alias/../../secret/s.txt HTTP/1.1",
        "GET /alias/%2e%2e/%2e%2e/secret/s.txt HTTP/1.1",
        "GET /alias/..%2f..%2fsecret/s.txt HTTP/1.1",
        "GET /alias/%2E%2E%2F%2E%2E%2Fsecret%2Fs.txt HTTP/1.1",
        "GET /../secret/s.txt HTTP/1.1",
        "GET /%2e%2e/secret/s.txt HTTP/1.1",
        "GET /dir/..%2f..%2fsecret/s.txt HTTP/1.1",
        "GET /dir/%2e%2e/a.txt HTTP/1.1",
        "GET /a.txt%00.html HTTP/1.1",
        "GET /alias/index.html%2f HTTP/1.1",
    ] {
        let (v, _) = check(&t, req).await;
        assert!(!v.body.starts_with(b"secret"), "{req}: {v:?}");
    }
}

#[tokio::test]
async fn debians_default_site_serves_as_nginx() {
    // /etc/nginx/sites-available/default, its root moved to the tree.
    let conf = "include {MIME};
     default_type application/octet-stream;
     server {
        listen {LISTEN} default_server;
        root {ROOT}/html;
        index index.html index.htm index.nginx-debian.html;
        server_name _;
        location / {
                try_files $uri $uri/ =404;
        }
     }";
    let (t, _d) = twin(conf).await;
    for req in [
        "GET / HTTP/1.1",
        "HEAD / HTTP/1.1",
        "GET /index.nginx-debian.html HTTP/1.1",
        "GET /missing HTTP/1.1",
        "GET /missing/ HTTP/1.1",
    ] {
        check(&t, req).await;
    }
    let (v, _) = both(&t, "GET / HTTP/1.1").await;
    assert_eq!(
        (v.status, &v.body[..]),
        (200, &b"<h1>Welcome to nginx!</h1>\n"[..])
    );
}

#[tokio::test]
async fn symbolic_links_are_followed_as_nginx_by_default() {
    // disable_symlinks off: a link inside the root to a file outside it.
    let conf = "server { listen {LISTEN}; root {ROOT}/www; }";
    let (t, _d) = twin(conf).await;
    let (v, _) = check(&t, "GET /link.txt HTTP/1.1").await;
    assert_eq!((v.status, &v.body[..]), (200, &b"secret\n"[..]));
}

#[tokio::test]
async fn an_alias_without_its_slash_serves_nothing_above_it() {
    // nginx opens /www/../secret/s.txt for `/al../secret/s.txt` (the
    // location's path and the alias disagree on the slash): vigil does not.
    let conf = "server { listen {LISTEN}; root {ROOT}/www;
       location /al { alias {ROOT}/www/; }
     }";
    let (t, _d) = twin(conf).await;
    let (v, n) = both(&t, "GET /al../secret/s.txt HTTP/1.1").await;
    assert_eq!(n.status, 200, "nginx's trap: {n:?}");
    assert_eq!(v.status, 404, "{v:?}");
    check(&t, "GET /al/a.txt HTTP/1.1").await;
}

#[tokio::test]
async fn expires_sets_cache_control_as_nginx() {
    let conf = "server { listen {LISTEN}; root {ROOT}/www;
       location /h/ { alias {ROOT}/www/; expires 1h; }
       location /neg/ { alias {ROOT}/www/; expires -1; }
       location /epoch/ { alias {ROOT}/www/; expires epoch; }
       location /max/ { alias {ROOT}/www/; expires max; }
       location /zero/ { alias {ROOT}/www/; expires 0; }
       location /mod/ { alias {ROOT}/www/; expires modified 1h; }
       location /off/ { alias {ROOT}/www/; expires off; }
     }";
    let (t, _d) = twin(conf).await;
    for p in ["/h/", "/neg/", "/epoch/", "/max/", "/zero/", "/off/"] {
        check(&t, &format!("GET {p}a.txt HTTP/1.1")).await;
        check(&t, &format!("GET {p}missing HTTP/1.1")).await;
        check(&t, &format!("GET {p}dir HTTP/1.1")).await;
    }
    // `modified`: counted from the file's time (2020), long past: no-cache.
    let (v, _) = check(&t, "GET /mod/a.txt HTTP/1.1").await;
    assert_eq!(v.header("cache-control"), "no-cache");
    let (v, _) = both(&t, "GET /max/a.txt HTTP/1.1").await;
    assert_eq!(v.header("expires"), "Thu, 31 Dec 2037 23:55:55 GMT");
    assert_eq!(v.header("cache-control"), "max-age=315360000");
}

#[tokio::test]
async fn expires_applies_to_proxied_answers_as_nginx() {
    let conf = "server { listen {LISTEN};
       location /h/ { expires 1h; proxy_pass http://{B0}; }
       location /max/ { expires max; proxy_pass http://{B0}; }
       location /epoch/ { expires epoch; proxy_pass http://{B0}; }
       location /mod/ { expires modified 1h; proxy_pass http://{B0}; }
       location /none/ { proxy_pass http://{B0}; }
     }";
    let (t, _d) = twin(conf).await;
    for p in ["/h/", "/max/", "/epoch/", "/mod/", "/none/"] {
        check(&t, &format!("GET {p}x HTTP/1.1")).await;
    }
    let (v, _) = both(&t, "GET /h/x HTTP/1.1").await;
    assert_eq!(v.header("cache-control"), "max-age=3600");
    assert!(!v.header("expires").is_empty(), "{}", v.head);
}
