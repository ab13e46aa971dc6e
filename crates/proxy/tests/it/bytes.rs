//! Values from the request keep their bytes on the way out, as nginx
//! keeps them: a client's header that is not ASCII (`café`, `a\xffb`,
//! `\x80`) in `proxy_set_header`, `$proxy_add_x_forwarded_for`,
//! `add_header`, `return`, a capture of a decoded `$uri`, and the access
//! log (escape=default and escape=json), each compared byte for byte with
//! a stock nginx on the same conf.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::eventually;
use crate::twin::Twin;

const CONF: &str = r#"
    upstream u { server {B0}; }
    server { listen {LISTEN};
      location ~ ^/cap/(.*)$ {
        proxy_set_header X-Cap $1;
        add_header X-Cap $1 always;
        proxy_pass http://u;
      }
      location ~ ^/echo/(.*)$ { add_header X-Cap $1 always; return 200 "ok"; }
      location /ret { return 200 "[$http_x_tag|$uri]"; }
      location /redir { return 302 /to$uri; }
      location / {
        proxy_set_header X-Tag $http_x_tag;
        proxy_set_header X-Fwd $proxy_add_x_forwarded_for;
        proxy_set_header X-Uri $uri;
        proxy_set_header X-Host $host;
        add_header X-Echo $http_x_tag always;
        proxy_pass http://u;
      }
    }"#;

/// The bytes the peer at `addr` answered `req` with (until it closed).
async fn exchange(addr: SocketAddr, req: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(req).await.expect("write request");
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf)).await;
    buf
}

/// The status and the value of the response head's field `name` (the
/// first; case-insensitive), as bytes.
fn answer(resp: &[u8], name: &str) -> (u16, Option<Vec<u8>>) {
    let end = resp
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or(resp.len());
    let mut lines = resp[..end].split(|&b| b == b'\n');
    let status = lines
        .next()
        .and_then(|l| l.split(|&b| b == b' ').nth(1))
        .and_then(|s| std::str::from_utf8(s).ok()?.parse().ok())
        .unwrap_or(0);
    let value = lines.find_map(|l| {
        let l = l.strip_suffix(b"\r").unwrap_or(l);
        let colon = l.iter().position(|&b| b == b':')?;
        l[..colon]
            .eq_ignore_ascii_case(name.as_bytes())
            .then(|| l[colon + 1..].trim_ascii().to_vec())
    });
    (status, value)
}

/// The last request's field `name` as each side's backend got it.
fn got(t: &Twin, name: &str) -> (Option<Vec<u8>>, Option<Vec<u8>>) {
    let (v, n) = t.seen(0);
    let field = |seen: &[crate::support::Seen]| {
        seen.last()
            .and_then(|r| r.headers.get(name))
            .map(|v| v.as_bytes().to_vec())
    };
    (field(&v), field(&n))
}

#[tokio::test]
async fn a_clients_header_bytes_go_upstream_and_back_as_nginx_sends_them() {
    let t = Twin::start(CONF, 1).await;
    for tag in [&b"caf\xc3\xa9"[..], b"a\xffb", b"\x80"] {
        let mut req = b"GET /x HTTP/1.1\r\nHost: h.test\r\nX-Tag: ".to_vec();
        req.extend_from_slice(tag);
        req.extend_from_slice(b"\r\nX-Forwarded-For: 1.2.3.4\xff\r\nConnection: close\r\n\r\n");
        let v = exchange(t.vigil.addr, &req).await;
        let n = exchange(t.nginx.addr, &req).await;
        assert_eq!(answer(&n, "x-echo"), (200, Some(tag.to_vec())), "nginx");
        assert_eq!(
            answer(&v, "x-echo"),
            answer(&n, "x-echo"),
            "add_header {tag:?}"
        );
        let (vt, nt) = got(&t, "x-tag");
        assert_eq!(nt.as_deref(), Some(tag), "nginx");
        assert_eq!(vt, nt, "proxy_set_header X-Tag $http_x_tag with {tag:?}");
        let (vf, nf) = got(&t, "x-fwd");
        assert_eq!(nf.as_deref(), Some(&b"1.2.3.4\xff, 127.0.0.1"[..]), "nginx");
        assert_eq!(vf, nf, "$proxy_add_x_forwarded_for");
        // The client's own X-Forwarded-For passes as it came.
        assert_eq!(
            got(&t, "x-forwarded-for").0.as_deref(),
            Some(&b"1.2.3.4\xff"[..])
        );
    }
}

#[tokio::test]
async fn http_variables_take_the_first_line_and_join_cookie_and_x_forwarded_for() {
    let t = Twin::start(CONF, 1).await;
    let req = b"GET /x HTTP/1.1\r\nHost: h.test\r\nX-Tag: one\r\nX-Tag: two\r\n\
                X-Forwarded-For: 1.1.1.1\r\nX-Forwarded-For: 2.2.2.2\r\nConnection: close\r\n\r\n";
    let (v, n) = (
        exchange(t.vigil.addr, req).await,
        exchange(t.nginx.addr, req).await,
    );
    assert_eq!(answer(&v, "x-echo"), answer(&n, "x-echo"));
    assert_eq!(
        got(&t, "x-tag"),
        (Some(b"one".to_vec()), Some(b"one".to_vec()))
    );
    let fwd = b"1.1.1.1, 2.2.2.2, 127.0.0.1".to_vec();
    assert_eq!(got(&t, "x-fwd"), (Some(fwd.clone()), Some(fwd)));
}

#[tokio::test]
async fn decoded_uri_bytes_and_their_captures_are_sent_as_they_are() {
    let t = Twin::start(CONF, 1).await;
    // `$uri` is the decoded path: %FF is the byte 0xFF, %C3%A9 `é`.
    let req = b"GET /a%FFb%C3%A9 HTTP/1.1\r\nHost: h.test\r\nConnection: close\r\n\r\n";
    let (v, n) = (
        exchange(t.vigil.addr, req).await,
        exchange(t.nginx.addr, req).await,
    );
    assert_eq!(answer(&v, "x-echo").0, answer(&n, "x-echo").0);
    let (vu, nu) = got(&t, "x-uri");
    assert_eq!(nu.as_deref(), Some(&b"/a\xffb\xc3\xa9"[..]), "nginx");
    assert_eq!(vu, nu, "proxy_set_header X-Uri $uri");

    let req = b"GET /cap/%FF%C3%A9z HTTP/1.1\r\nHost: h.test\r\nConnection: close\r\n\r\n";
    let (v, n) = (
        exchange(t.vigil.addr, req).await,
        exchange(t.nginx.addr, req).await,
    );
    assert_eq!(
        answer(&n, "x-cap"),
        (200, Some(b"\xff\xc3\xa9z".to_vec())),
        "nginx"
    );
    assert_eq!(
        answer(&v, "x-cap"),
        answer(&n, "x-cap"),
        "add_header X-Cap $1"
    );
    let (vc, nc) = got(&t, "x-cap");
    assert_eq!(vc, nc, "proxy_set_header X-Cap $1");

    // The host's bytes too.
    let req = b"GET /x HTTP/1.1\r\nHost: caf\xc3\xa9.\xfftest\r\nConnection: close\r\n\r\n";
    let (v, n) = (
        exchange(t.vigil.addr, req).await,
        exchange(t.nginx.addr, req).await,
    );
    assert_eq!((answer(&v, "").0, answer(&n, "").0), (200, 200));
    let (vh, nh) = got(&t, "x-host");
    assert_eq!(nh.as_deref(), Some(&b"caf\xc3\xa9.\xfftest"[..]), "nginx");
    assert_eq!(vh, nh, "proxy_set_header X-Host $host");
}

#[tokio::test]
async fn return_texts_and_redirects_keep_the_bytes() {
    let t = Twin::start(CONF, 1).await;
    let req = b"GET /ret/%FF HTTP/1.1\r\nHost: h.test\r\nX-Tag: \xe9\r\nConnection: close\r\n\r\n";
    let (v, n) = (
        exchange(t.vigil.addr, req).await,
        exchange(t.nginx.addr, req).await,
    );
    let body = |r: &[u8]| {
        let at = r
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .map_or(r.len(), |i| i + 4);
        r[at..].to_vec()
    };
    assert_eq!(body(&n), b"[\xe9|/ret/\xff]", "nginx");
    assert_eq!(body(&v), body(&n), "return 200 \"[$http_x_tag|$uri]\"");

    let req = b"GET /redir/%FF%C3%A9 HTTP/1.1\r\nHost: h.test\r\nConnection: close\r\n\r\n";
    let (v, n) = (
        exchange(t.vigil.addr, req).await,
        exchange(t.nginx.addr, req).await,
    );
    // The absolute prefix names each side's own port.
    let (vs, vl) = answer(&v, "location");
    let (ns, nl) = answer(&n, "location");
    assert_eq!((vs, ns), (302, 302));
    for l in [vl, nl] {
        let l = l.expect("a Location");
        assert!(l.ends_with(b"/to/redir/\xff\xc3\xa9"), "{l:?}");
    }
}

/// nginx writes a decoded `%0D%0A` of `$uri` into a field as it is, which
/// splits the head it writes (a field of the attacker's). vigil sends no
/// field whose value holds a control byte (nor `%01`, `%7F`, which nginx
/// writes as they are too).
#[tokio::test]
async fn a_decoded_crlf_sends_no_field_where_nginx_splits_the_head() {
    let t = Twin::start(CONF, 1).await;
    let req = b"GET /a%0D%0AX-Injected:%201 HTTP/1.1\r\nHost: h.test\r\nConnection: close\r\n\r\n";
    let (v, n) = (
        exchange(t.vigil.addr, req).await,
        exchange(t.nginx.addr, req).await,
    );
    assert_eq!((answer(&v, "").0, answer(&n, "").0), (200, 200));
    let (vi, ni) = got(&t, "x-injected");
    assert_eq!(ni.as_deref(), Some(&b"1"[..]), "nginx's head was split");
    assert_eq!(vi, None, "vigil's was not");
    assert_eq!(got(&t, "x-uri").0, None, "the field is left out");
    assert!(got(&t, "x-tag").0.is_none());
    // Decoded %01 and %7F: no field either (nginx sends the bytes).
    let req = b"GET /echo/%01%7F HTTP/1.1\r\nHost: h.test\r\nConnection: close\r\n\r\n";
    let (v, n) = (
        exchange(t.vigil.addr, req).await,
        exchange(t.nginx.addr, req).await,
    );
    assert_eq!(
        answer(&n, "x-cap"),
        (200, Some(b"\x01\x7f".to_vec())),
        "nginx"
    );
    assert_eq!(answer(&v, "x-cap"), (200, None));
}

const LOG_CONF: &str = r#"
    log_format d '$http_x_tag|$request_uri|$uri|$args|$arg_a|$http_cookie';
    log_format j escape=json '$http_x_tag|$request_uri|$uri|$args|$arg_a|$http_cookie';
    upstream u { server {B0}; }
    server { listen {LISTEN};
      location /d { access_log {LOG}/d.log d; proxy_pass http://u; }
      location /j { access_log {LOG}/j.log j; proxy_pass http://u; }
    }"#;

/// The lines of `file` in both directories once each has `n`, as bytes.
async fn log_lines(vd: &Path, nd: &Path, file: &str, n: usize) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let read = |d: &Path| -> Vec<Vec<u8>> {
        std::fs::read(d.join(file))
            .unwrap_or_default()
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .map(<[u8]>::to_vec)
            .collect()
    };
    eventually(&format!("{n} lines in {file}"), || {
        read(vd).len() >= n && read(nd).len() >= n
    })
    .await;
    (read(vd), read(nd))
}

#[tokio::test]
async fn access_log_lines_escape_the_requests_bytes_as_nginx() {
    let (vd, nd) = (
        tempfile::tempdir().expect("tmp"),
        tempfile::tempdir().expect("tmp"),
    );
    let side = |d: &Path| vec![("{LOG}".to_string(), d.display().to_string())];
    let t = Twin::start_texts(LOG_CONF, 1, &side(vd.path()), &side(nd.path())).await;
    let reqs: &[&[u8]] = &[
        b"GET /d/caf\xc3\xa9%FF?a=%FF&b=\xc3\xa9 HTTP/1.1\r\nHost: h.test\r\nX-Tag: caf\xc3\xa9\r\nConnection: close\r\n\r\n",
        b"GET /d/%0D%0A%01%7F%22 HTTP/1.1\r\nHost: h.test\r\nX-Tag: a\xffb\r\nCookie: c=\xfe\xfd\r\nConnection: close\r\n\r\n",
        b"GET /d HTTP/1.1\r\nHost: h.test\r\nX-Tag: \x80\r\nConnection: close\r\n\r\n",
        b"GET /j/caf\xc3\xa9%FF?a=%FF&b=\xc3\xa9 HTTP/1.1\r\nHost: h.test\r\nX-Tag: caf\xc3\xa9\r\nConnection: close\r\n\r\n",
        b"GET /j/%0D%0A%01%7F%22 HTTP/1.1\r\nHost: h.test\r\nX-Tag: a\xffb\r\nCookie: c=\xfe\xfd\r\nConnection: close\r\n\r\n",
        b"GET /j HTTP/1.1\r\nHost: h.test\r\nX-Tag: \x80\r\nConnection: close\r\n\r\n",
    ];
    for r in reqs {
        let (v, n) = (
            exchange(t.vigil.addr, r).await,
            exchange(t.nginx.addr, r).await,
        );
        assert_eq!(answer(&v, "").0, answer(&n, "").0, "{r:?}");
    }
    let (v, n) = log_lines(vd.path(), nd.path(), "d.log", 3).await;
    assert_eq!(
        n[0],
        b"caf\\xC3\\xA9|/d/caf\\xC3\\xA9%FF?a=%FF&b=\\xC3\\xA9|/d/caf\\xC3\\xA9\\xFF|a=%FF&b=\\xC3\\xA9|%FF|-",
        "nginx"
    );
    assert_eq!(v, n, "escape=default");
    let (v, n) = log_lines(vd.path(), nd.path(), "j.log", 3).await;
    assert_eq!(
        n[1], b"a\xffb|/j/%0D%0A%01%7F%22|/j/\\r\\n\\u0001\x7f\\\"|||c=\xfe\xfd",
        "nginx"
    );
    assert_eq!(v, n, "escape=json");
}
