//! `gzip`: the same responses through vigil and a stock nginx on the same
//! conf: the same decision (Content-Encoding, Vary, Content-Length, ETag,
//! Accept-Ranges) and, decompressed, the same body.

use std::io::Read;

use bytes::Bytes;
use http_body_util::Full;
use hyper::Response;

use crate::support::{Backend, Seen};
use crate::twin::{Raw, Twin};

fn page(s: &Seen) -> Response<Full<Bytes>> {
    let html = "<html>".to_string() + &"vigil gzip ".repeat(100) + "</html>";
    let path = s.uri.split('?').next().unwrap_or("");
    let (status, ct, body, extra): (u16, &str, String, &[(&str, &str)]) =
        match path.trim_start_matches("/off") {
            "/small" => (200, "text/html", "tiny".into(), &[]),
            "/plain" => (200, "text/plain", html.clone(), &[]),
            "/json" => (200, "application/json; charset=utf-8", html.clone(), &[]),
            "/enc" => (
                200,
                "text/html",
                html.clone(),
                &[("content-encoding", "br")],
            ),
            "/nf" => (404, "text/html", html.clone(), &[]),
            "/err" => (500, "text/html", html.clone(), &[]),
            "/exp" => (
                200,
                "text/html",
                html.clone(),
                &[("expires", "Thu, 01 Jan 1970 00:00:01 GMT")],
            ),
            "/future" => (
                200,
                "text/html",
                html.clone(),
                &[("expires", "Fri, 01 Jan 2100 00:00:01 GMT")],
            ),
            "/cc" => (
                200,
                "text/html",
                html.clone(),
                &[("cache-control", "max-age=0, no-cache")],
            ),
            "/param" => (200, "text/html; q=1", html.clone(), &[]),
            "/none" => (200, "", html.clone(), &[]),
            _ => (200, "text/html; charset=utf-8", html.clone(), &[]),
        };
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = http::StatusCode::from_u16(status).expect("status");
    let h = r.headers_mut();
    if !ct.is_empty() {
        h.insert("content-type", ct.parse().expect("ct"));
    }
    h.insert("etag", "\"e1\"".parse().expect("etag"));
    h.insert("accept-ranges", "bytes".parse().expect("ar"));
    for (n, v) in extra {
        h.insert(*n, v.parse().expect("value"));
    }
    r
}

/// The body with chunked framing removed when the head says so.
fn body(r: &Raw) -> Vec<u8> {
    if !r
        .header("transfer-encoding")
        .eq_ignore_ascii_case("chunked")
    {
        return r.body.clone();
    }
    let (mut out, mut rest) = (Vec::new(), r.body.as_slice());
    loop {
        let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let size = std::str::from_utf8(&rest[..eol])
            .ok()
            .and_then(|s| usize::from_str_radix(s.split(';').next().unwrap_or("").trim(), 16).ok());
        let Some(n) = size.filter(|n| *n > 0) else {
            return out;
        };
        out.extend_from_slice(&rest[eol + 2..eol + 2 + n]);
        rest = &rest[eol + 4 + n..];
    }
}

fn decoded(r: &Raw) -> Vec<u8> {
    let b = body(r);
    if r.header("content-encoding") != "gzip" || b.is_empty() {
        return b;
    }
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(b.as_slice())
        .read_to_end(&mut out)
        .expect("valid gzip");
    out
}

/// What decides a compressed response, as a comparable summary.
fn summary(r: &Raw) -> String {
    let vary: Vec<&str> = r
        .head
        .lines()
        .filter_map(|l| l.split_once(':'))
        .filter(|(n, _)| n.eq_ignore_ascii_case("vary"))
        .map(|(_, v)| v.trim())
        .collect();
    format!(
        "{} ce={:?} vary={vary:?} cl={} etag={:?} ar={:?}",
        r.status,
        r.header("content-encoding"),
        !r.header("content-length").is_empty(),
        r.header("etag"),
        r.header("accept-ranges"),
    )
}

#[tokio::test]
async fn gzip_compresses_what_nginx_compresses() {
    let (vb, nb) = (Backend::start(page).await, Backend::start(page).await);
    let t = Twin::start_with(
        "upstream u { server {R0}; }
         server { listen {LISTEN};
           gzip on; gzip_types application/json; gzip_vary on; gzip_comp_level 6;
           gzip_proxied expired no-cache; gzip_disable msie6; gzip_buffers 16 8k;
           location / { proxy_pass http://u; }
           location /off/ { gzip off; proxy_pass http://u; }
           location /v10/ { gzip_http_version 1.0; proxy_pass http://u/; }
         }",
        0,
        &[("{R0}", vb.addr)],
        &[("{R0}", nb.addr)],
    )
    .await;
    let req = |path: &str, extra: &str, version: &str| {
        format!("GET {path} HTTP/{version}\r\nHost: h.test\r\n{extra}Connection: close\r\n\r\n")
    };
    let gz = "Accept-Encoding: gzip, deflate\r\n";
    let cases: Vec<(String, Option<bool>)> = vec![
        (req("/", gz, "1.1"), Some(true)),
        (req("/", "", "1.1"), Some(false)),
        (
            req("/", "Accept-Encoding: br;q=1, GZIP;q=0.5\r\n", "1.1"),
            Some(true),
        ),
        (
            req("/", "Accept-Encoding: gzip;q=0\r\n", "1.1"),
            Some(false),
        ),
        (req("/", "Accept-Encoding: deflate\r\n", "1.1"), Some(false)),
        (req("/small", gz, "1.1"), Some(false)),
        (req("/plain", gz, "1.1"), Some(false)),
        (req("/json", gz, "1.1"), Some(true)),
        (req("/enc", gz, "1.1"), Some(false)),
        (req("/nf", gz, "1.1"), Some(true)),
        (req("/err", gz, "1.1"), Some(false)),
        (req("/param", gz, "1.1"), Some(false)),
        (req("/none", gz, "1.1"), Some(false)),
        (req("/off/x", gz, "1.1"), Some(false)),
        (req("/", gz, "1.0"), Some(false)),
        (req("/v10/", gz, "1.0"), Some(true)),
        (
            req(
                "/",
                &format!("{gz}User-Agent: Mozilla/4.0 (compatible; MSIE 6.0; Windows NT 5.0)\r\n"),
                "1.1",
            ),
            Some(false),
        ),
        (req("/", &format!("{gz}Via: 1.1 cache\r\n"), "1.1"), None),
        (
            req("/exp", &format!("{gz}Via: 1.1 cache\r\n"), "1.1"),
            Some(true),
        ),
        (
            req("/future", &format!("{gz}Via: 1.1 cache\r\n"), "1.1"),
            Some(false),
        ),
        (
            req("/cc", &format!("{gz}Via: 1.1 cache\r\n"), "1.1"),
            Some(true),
        ),
        (
            format!("HEAD / HTTP/1.1\r\nHost: h.test\r\n{gz}Connection: close\r\n\r\n"),
            Some(true),
        ),
    ];
    for (bytes, expected) in cases {
        let (v, n) = t.send(bytes.as_bytes()).await;
        assert_eq!(summary(&v), summary(&n), "{bytes:?}\n{v:?}\n{n:?}");
        assert_eq!(decoded(&v), decoded(&n), "{bytes:?}");
        if let Some(e) = expected {
            assert_eq!(
                n.header("content-encoding") == "gzip",
                e,
                "nginx on {bytes:?}"
            );
        }
    }
}
