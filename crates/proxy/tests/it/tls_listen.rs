//! TLS listeners against stock nginx on the same conf: the certificate
//! SNI picks, `$scheme` / `$https` sent upstream, ALPN, the protocol
//! versions, plain HTTP sent to a TLS port; and certificate errors at
//! start and on reload.

use std::path::{Path, PathBuf};

use rcgen::{CertificateParams, KeyPair};

use crate::support::load;
use crate::twin::{tls_raw, Twin};

/// A self-signed certificate for `name` written to `dir`: (certificate
/// path, key path, DER).
fn pair(dir: &Path, name: &str) -> (PathBuf, PathBuf, Vec<u8>) {
    let key = KeyPair::generate().expect("key");
    let cert = CertificateParams::new(vec![name.to_string()])
        .expect("params")
        .self_signed(&key)
        .expect("cert");
    let (c, k) = (
        dir.join(format!("{name}.crt")),
        dir.join(format!("{name}.key")),
    );
    std::fs::write(&c, cert.pem()).expect("write cert");
    std::fs::write(&k, key.serialize_pem()).expect("write key");
    (c, k, cert.der().to_vec())
}

/// Three blocks on one TLS address: `a.test` (the default, its own
/// certificate), `b.test` (its own), `c.test` (none: the default's). Keep
/// it alive as long as the twin: `nginx -s stop` reads the certificates.
struct Sites {
    _dir: tempfile::TempDir,
    conf: String,
    a: Vec<u8>,
    b: Vec<u8>,
}

fn sites(listen_params: &str, extra: &str) -> Sites {
    let dir = tempfile::tempdir().expect("tempdir");
    let (ac, ak, a) = pair(dir.path(), "a.test");
    let (bc, bk, b) = pair(dir.path(), "b.test");
    let conf = format!(
        "{extra}
         server {{ listen {{LISTEN}} {listen_params}; server_name a.test;
                  ssl_certificate {ac}; ssl_certificate_key {ak};
                  location / {{ proxy_pass http://{{B0}}; }} }}
         server {{ listen {{LISTEN}} {listen_params}; server_name b.test;
                  ssl_certificate {bc}; ssl_certificate_key {bk};
                  location / {{ proxy_pass http://{{B1}}; }} }}
         server {{ listen {{LISTEN}} {listen_params}; server_name c.test;
                  location / {{ proxy_pass http://{{B2}}; }} }}",
        ac = ac.display(),
        ak = ak.display(),
        bc = bc.display(),
        bk = bk.display(),
    );
    Sites {
        _dir: dir,
        conf,
        a,
        b,
    }
}

fn get(host: &str) -> Vec<u8> {
    format!("GET /x HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").into_bytes()
}

#[tokio::test]
async fn sni_picks_the_certificate_as_nginx_does() {
    let s = sites("ssl", "");
    let t = Twin::start(&s.conf, 3).await;
    let name_of = |der: &[u8]| match der {
        d if d == s.a.as_slice() => "a.test",
        d if d == s.b.as_slice() => "b.test",
        _ => "another",
    };
    // (SNI, Host) -> (certificate served, backend that answered).
    for (sni, host, cert, body) in [
        (Some("a.test"), "a.test", "a.test", "b0"),
        (Some("b.test"), "b.test", "b.test", "b1"),
        // A block without certificates: the default server's.
        (Some("c.test"), "c.test", "a.test", "b2"),
        // An unknown name, no SNI: the default server's.
        (Some("unknown.test"), "b.test", "a.test", "b1"),
        (None, "b.test", "a.test", "b1"),
    ] {
        let (v, n) = t.send_tls(sni, &["http/1.1"], &get(host)).await;
        let seen = (name_of(&v.cert), name_of(&n.cert));
        assert_eq!(seen, (cert, cert), "SNI {sni:?}");
        assert_eq!((v.raw.status, n.raw.status), (200, 200), "{v:?}\n{n:?}");
        assert_eq!(
            (v.raw.body.as_slice(), n.raw.body.as_slice()),
            (body.as_bytes(), body.as_bytes()),
            "SNI {sni:?}, Host {host}"
        );
    }
}

#[tokio::test]
async fn scheme_and_https_reach_the_backend() {
    let headers = "proxy_set_header X-Forwarded-Proto $scheme; proxy_set_header X-Https $https;";
    let s = sites("ssl", headers);
    let t = Twin::start(&s.conf, 3).await;
    let (v, n) = t.send_tls(Some("a.test"), &[], &get("a.test")).await;
    assert_eq!((v.raw.status, n.raw.status), (200, 200));
    let sent = |seen: Vec<crate::support::Seen>| {
        let h = &seen[0].headers;
        let get = |name: &str| h.get(name).map(|v| v.to_str().unwrap_or("?").to_string());
        (get("x-forwarded-proto"), get("x-https"))
    };
    let (vs, ns) = t.seen(0);
    let tls = (Some("https".to_string()), Some("on".to_string()));
    assert_eq!((sent(vs), sent(ns)), (tls.clone(), tls));
    // On a plain address: http, and no X-Https (an empty value is not sent).
    let plain = Twin::start(
        &format!(
            "server {{ listen {{LISTEN}}; {headers} location / {{ proxy_pass http://{{B0}}; }} }}"
        ),
        1,
    )
    .await;
    let (v, n) = plain.send(&get("a.test")).await;
    assert_eq!((v.status, n.status), (200, 200));
    let (vs, ns) = plain.seen(0);
    let http = (Some("http".to_string()), None);
    assert_eq!((sent(vs), sent(ns)), (http.clone(), http));
}

#[tokio::test]
async fn alpn_offers_h2_only_on_http2_listeners() {
    let both = ["h2", "http/1.1"];
    let s1 = sites("ssl http2", "");
    let t = Twin::start(&s1.conf, 3).await;
    let (v, n) = t.send_tls(Some("a.test"), &both, b"").await;
    assert_eq!(
        (v.alpn.as_deref(), n.alpn.as_deref()),
        (Some("h2"), Some("h2"))
    );
    let s2 = sites("ssl", "");
    let t = Twin::start(&s2.conf, 3).await;
    let (v, n) = t.send_tls(Some("a.test"), &both, b"").await;
    assert_eq!(
        (v.alpn.as_deref(), n.alpn.as_deref()),
        (Some("http/1.1"), Some("http/1.1"))
    );
    // Without ALPN an HTTP/1.1 request is served on an http2 listener too.
    let s3 = sites("ssl http2", "");
    let t = Twin::start(&s3.conf, 3).await;
    let (v, n) = t.send_tls(Some("b.test"), &[], &get("b.test")).await;
    assert_eq!((v.alpn.as_deref(), n.alpn.as_deref()), (None, None));
    assert_eq!((v.raw.body, n.raw.body), (b"b1".to_vec(), b"b1".to_vec()));
}

#[tokio::test]
async fn ssl_protocols_as_nginx_1_22() {
    // nginx 1.22's default has no TLSv1.3.
    let s4 = sites("ssl", "");
    let t = Twin::start(&s4.conf, 3).await;
    let (v, n) = t.send_tls(Some("a.test"), &[], b"").await;
    assert_eq!(
        (v.version.as_str(), n.version.as_str()),
        ("TLSv1_2", "TLSv1_2")
    );
    // TLSv1.1 is accepted, not offered (rustls has none; nor has the
    // client here).
    let s5 = sites("ssl", "ssl_protocols TLSv1.1 TLSv1.2 TLSv1.3;");
    let t = Twin::start(&s5.conf, 3).await;
    let (v, n) = t.send_tls(Some("a.test"), &[], b"").await;
    assert_eq!(
        (v.version.as_str(), n.version.as_str()),
        ("TLSv1_3", "TLSv1_3")
    );
}

#[tokio::test]
async fn plain_http_to_a_tls_port_is_answered_400() {
    let s6 = sites("ssl", "");
    let t = Twin::start(&s6.conf, 3).await;
    let (v, n) = t.send(b"GET / HTTP/1.1\r\nHost: a.test\r\n\r\n").await;
    assert_eq!((v.status, n.status), (400, 400), "{v:?}\n{n:?}");
    let nginx_body = String::from_utf8_lossy(&n.body)
        .replace("nginx/1.22.1", "vigil")
        .replace("<center>nginx</center>", "<center>vigil</center>");
    assert_eq!(String::from_utf8_lossy(&v.body), nginx_body);
    assert_eq!(
        (v.header("connection"), n.header("connection")),
        ("close".to_string(), "close".to_string()),
        "the connection closes after it"
    );
    assert_eq!(
        (v.header("content-type"), n.header("content-type")),
        ("text/html".to_string(), "text/html".to_string())
    );
    // No backend saw it.
    let (vu, nu) = t.uris();
    assert!(vu.iter().chain(&nu).all(Vec::is_empty));
}

/// Build a generation of `text`: the error's text, if any.
fn build(text: &str) -> Result<(), String> {
    let clock: std::sync::Arc<dyn vigil_core::Clock> =
        std::sync::Arc::new(vigil_net::SystemClock::new());
    let events = std::sync::Arc::new(vigil_core::event::EventBus::default());
    vigil_proxy::Generation::build(load(text), None, events, clock)
        .map(drop)
        .map_err(|e| e.to_string())
}

#[test]
fn certificate_errors_name_the_directive_and_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (ac, ak, _) = pair(dir.path(), "a.test");
    let (_, bk, _) = pair(dir.path(), "b.test");
    let conf = |c: &Path, k: &Path| {
        format!(
            "http {{\nserver {{ listen 127.0.0.1:8443 ssl;\n ssl_certificate {};\n ssl_certificate_key {};\n location / {{ proxy_pass http://127.0.0.1:9; }} }}\n}}",
            c.display(),
            k.display()
        )
    };
    assert!(build(&conf(&ac, &ak)).is_ok());
    let missing = dir.path().join("missing.crt");
    let e = build(&conf(&missing, &ak)).unwrap_err();
    assert!(
        e.starts_with("test.conf:3:2: cannot load \"ssl_certificate\": "),
        "{e}"
    );
    assert!(e.contains("missing.crt"), "{e}");
    let e = build(&conf(&ac, &bk)).unwrap_err();
    assert!(
        e.starts_with("test.conf:4:2: cannot load \"ssl_certificate_key\": "),
        "{e}"
    );
    assert!(e.contains("does not match the certificate"), "{e}");
    // Each wrong key file: at the key's directive, the file and what it holds.
    let empty = dir.path().join("empty.key");
    std::fs::write(&empty, "").expect("write");
    let encrypted = dir.path().join("encrypted.key");
    std::fs::write(
        &encrypted,
        "-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIHsMFcGCSqGSIb3DQEFDTBKMCkGCSqGSIb3DQEFDDAcBAjyhsp0RG8WVwICCAAw\n-----END ENCRYPTED PRIVATE KEY-----\n",
    )
    .expect("write");
    for (cert, key, expected) in [
        (
            &ac,
            &bk,
            format!(
                "test.conf:4:2: cannot load \"ssl_certificate_key\": {}: the key does not match the certificate {} (the server's own certificate must come first in that file, before its chain)",
                bk.display(),
                ac.display()
            ),
        ),
        (
            &ac,
            &ac,
            format!(
                "test.conf:4:2: cannot load \"ssl_certificate_key\": {}: no private key found (the file holds a CERTIFICATE block)",
                ac.display()
            ),
        ),
        (
            &ac,
            &empty,
            format!(
                "test.conf:4:2: cannot load \"ssl_certificate_key\": {}: no private key found (the file is empty)",
                empty.display()
            ),
        ),
        (
            &ac,
            &encrypted,
            format!(
                "test.conf:4:2: cannot load \"ssl_certificate_key\": {}: the key is encrypted (a passphrase-protected PEM key); vigil reads unencrypted keys only (nginx's ssl_password_file is not supported): `openssl pkey -in KEY -out PLAIN` writes one",
                encrypted.display()
            ),
        ),
        // The two files swapped: the certificate's directive is read first.
        (
            &ak,
            &ac,
            format!(
                "test.conf:3:2: cannot load \"ssl_certificate\": {}: no certificate found (the file holds a PRIVATE KEY block)",
                ak.display()
            ),
        ),
    ] {
        assert_eq!(build(&conf(cert, key)), Err(expected));
    }
}

#[tokio::test]
async fn a_bad_certificate_on_reload_keeps_the_old_configuration() {
    let s = sites("ssl", "");
    let running = crate::support::start_proxy(&format!(
        "http {{\n{}\n}}",
        s.conf
            .replace("{B0}", "127.0.0.1:9")
            .replace("{B1}", "127.0.0.1:9")
            .replace("{B2}", "127.0.0.1:9")
    ))
    .await;
    let before = running.proxy.reloads();
    let broken = running.text.replace("a.test.key", "b.test.key");
    let e = running
        .proxy
        .reload(load(&broken))
        .map(drop)
        .unwrap_err()
        .to_string();
    assert!(e.contains("does not match the certificate"), "{e}");
    assert_eq!(running.proxy.reloads(), before);
    let got = tls_raw(running.addr, Some("a.test"), &[], b"").await;
    assert_eq!(got.cert, s.a, "the old certificate is still served");
}

#[tokio::test]
async fn redirects_made_absolute_on_a_tls_listener_say_https_as_nginx() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (cert, key, _) = pair(dir.path(), "a.test");
    let conf = format!(
        "server {{ listen {{LISTEN}} ssl; server_name a.test;
                  ssl_certificate {}; ssl_certificate_key {};
                  location = /old {{ return 301 /new; }}
                  location /dir/ {{ proxy_pass http://{{B0}}; }} }}",
        cert.display(),
        key.display()
    );
    let t = Twin::start(&conf, 1).await;
    for path in ["/old", "/dir"] {
        let req = format!("GET {path} HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n");
        let (v, n) = t.send_tls(Some("a.test"), &[], req.as_bytes()).await;
        let loc = |r: &crate::twin::Raw, port: u16| {
            r.header("location").replace(&format!(":{port}"), ":PORT")
        };
        let (lv, ln) = (
            loc(&v.raw, t.vigil.addr.port()),
            loc(&n.raw, t.nginx.addr.port()),
        );
        assert_eq!((v.raw.status, &lv), (n.raw.status, &ln), "{path}");
        assert!(lv.starts_with("https://a.test:PORT/"), "{path}: {lv}");
    }
}
