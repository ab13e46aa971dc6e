//! HTTPS upstreams on vigil's own HTTP/1.1 client over rustls:
//! verification with a custom CA, SNI from the upstream name, wrong names
//! refused, verification off; kept-alive connections, bodies both ways
//! and upgrades over TLS.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper::Response;
use hyper_util::rt::TokioIo;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use tokio_rustls::rustls;

use std::sync::atomic::{AtomicUsize, Ordering};

use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::{get, send, start_proxy};

struct Pki {
    ca_pem: String,
    server: rustls::ServerConfig,
}

fn pki(names: &[&str]) -> Pki {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca =
        CertifiedIssuer::self_signed(ca_params, KeyPair::generate().expect("key")).expect("ca");
    let key = KeyPair::generate().expect("key");
    let params = CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
        .expect("params");
    let cert = params.signed_by(&key, &ca).expect("cert");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let server = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der()).expect("key der"),
        )
        .expect("server config");
    Pki {
        ca_pem: ca.pem(),
        server,
    }
}

/// An HTTPS backend answering with the SNI it saw.
async fn tls_backend(server: rustls::ServerConfig) -> std::net::SocketAddr {
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(s).await else {
                    return;
                };
                let sni = tls.get_ref().1.server_name().unwrap_or("").to_string();
                let svc = service_fn(move |_req| {
                    let sni = sni.clone();
                    async move {
                        Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from(
                            sni,
                        ))))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn https_upstream_is_verified_against_a_custom_ca_with_sni() {
    let pki = pki(&["api.internal"]);
    let addr = tls_backend(pki.server).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, &pki.ca_pem).expect("write ca");
    let p = start_proxy(&format!(
        "http {{ upstream api.internal {{ server {addr}; }}
           server {{ listen {{LISTEN}};
             location /good {{ proxy_pass https://api.internal; proxy_ssl_trusted_certificate {}; }}
             location /noca {{ proxy_pass https://api.internal; }}
             location /off {{ proxy_pass https://api.internal; proxy_ssl_verify off; }} }} }}",
        ca.display()
    ))
    .await;
    let r = get(p.addr, "/good").await;
    assert_eq!(
        (r.status, r.text()),
        (200, "api.internal".to_string()),
        "SNI is the upstream name"
    );
    assert_eq!(
        get(p.addr, "/noca").await.status,
        502,
        "an unknown CA is refused"
    );
    assert_eq!(
        get(p.addr, "/off").await.status,
        200,
        "verification can be switched off"
    );
}

#[tokio::test]
async fn a_certificate_for_another_name_is_refused() {
    let pki = pki(&["other.internal"]);
    let addr = tls_backend(pki.server).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, &pki.ca_pem).expect("write ca");
    let p = start_proxy(&format!(
        "http {{ upstream api.internal {{ server {addr}; }}
           server {{ listen {{LISTEN}}; location / {{ proxy_pass https://api.internal; proxy_ssl_trusted_certificate {}; }} }} }}",
        ca.display()
    ))
    .await;
    assert_eq!(get(p.addr, "/").await.status, 502);
}

#[test]
fn a_trusted_certificate_that_is_not_a_regular_file_is_refused_at_load() {
    // /dev/zero would be read until memory runs out.
    let config = crate::support::load(
        "http { upstream u { server 127.0.0.1:1; }
           server { listen 127.0.0.1:1; location / { proxy_pass https://u;
             proxy_ssl_trusted_certificate /dev/zero; } } }",
    );
    let clock: Arc<dyn vigil_core::Clock> = Arc::new(vigil_net::SystemClock::new());
    let events = Arc::new(vigil_core::event::EventBus::default());
    let err = vigil_proxy::Generation::build(config, None, events, clock)
        .err()
        .expect("refused");
    let text = err.to_string();
    assert!(
        text.contains("/dev/zero") && text.contains("not a regular file"),
        "{text}"
    );
}

/// An HTTPS backend counting its connections: `/big` answers 2 MiB
/// chunked (no length known), an `Upgrade` is switched to an echo, any
/// other request is answered with the length and a sum of its body.
async fn counting_tls_backend(
    server: rustls::ServerConfig,
) -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let conns = Arc::new(AtomicUsize::new(0));
    let counted = conns.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            counted.fetch_add(1, Ordering::SeqCst);
            // A second handle on the socket, to peek at what waits unread.
            let Ok((s, raw)) = s.into_std().and_then(|s| {
                let raw = s.try_clone()?;
                Ok((tokio::net::TcpStream::from_std(s)?, Arc::new(raw)))
            }) else {
                continue;
            };
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(s).await else {
                    return;
                };
                let svc = service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
                    let raw = raw.clone();
                    async move {
                        type Body =
                            http_body_util::combinators::BoxBody<Bytes, std::convert::Infallible>;
                        if req.headers().contains_key("upgrade") {
                            let on = hyper::upgrade::on(&mut req);
                            tokio::spawn(async move {
                                let Ok(up) = on.await else { return };
                                let mut io = TokioIo::new(up);
                                let mut buf = [0u8; 1024];
                                loop {
                                    let n = io.read(&mut buf).await.unwrap_or(0);
                                    if n == 0 || io.write_all(&buf[..n]).await.is_err() {
                                        return;
                                    }
                                }
                            });
                            let r = Response::builder()
                                .status(101)
                                .header("upgrade", "echo")
                                .header("connection", "upgrade")
                                .body(Body::default())
                                .expect("101");
                            return Ok::<_, std::convert::Infallible>(r);
                        }
                        if req.uri().path() == "/big" {
                            let chunks = (0..512u32).map(|i| {
                                Ok::<_, std::convert::Infallible>(hyper::body::Frame::data(
                                    Bytes::from(vec![(i % 251) as u8; 4096]),
                                ))
                            });
                            let body =
                                http_body_util::StreamBody::new(futures_util::stream::iter(chunks));
                            return Ok(Response::new(BodyExt::boxed(body)));
                        }
                        if req.uri().path().ends_with("/echo") {
                            // Answered at once, the body echoed as it comes:
                            // the proxy sends the rest of the request while
                            // it reads the response.
                            let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(4);
                            let mut incoming = req.into_body();
                            tokio::spawn(async move {
                                while let Some(Ok(frame)) = incoming.frame().await {
                                    if let Ok(d) = frame.into_data() {
                                        if tx.send(d).await.is_err() {
                                            return;
                                        }
                                    }
                                }
                            });
                            let echo = futures_util::stream::unfold(rx, |mut rx| async move {
                                let d = rx.recv().await?;
                                Some((
                                    Ok::<_, std::convert::Infallible>(hyper::body::Frame::data(d)),
                                    rx,
                                ))
                            });
                            let body = http_body_util::StreamBody::new(echo);
                            return Ok(Response::new(BodyExt::boxed(body)));
                        }
                        if req.uri().path().ends_with("/slow") {
                            // Read late: once 32 KiB of the body wait unread
                            // in the socket, the proxy's writes meet a full
                            // one, and what rustls holds must still go.
                            let mut unread = vec![0u8; 32 * 1024];
                            crate::support::eventually("32 KiB unread at the late reader", || {
                                raw.peek(&mut unread).is_ok_and(|n| n == unread.len())
                            })
                            .await;
                        }
                        let body = req
                            .into_body()
                            .collect()
                            .await
                            .map(|b| b.to_bytes())
                            .unwrap_or_default();
                        let sum = body
                            .iter()
                            .fold(0u64, |a, b| a.wrapping_mul(31).wrapping_add(u64::from(*b)));
                        let text = format!("len={} sum={sum}", body.len());
                        Ok(Response::new(BodyExt::boxed(Full::new(Bytes::from(text)))))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), svc)
                    .with_upgrades()
                    .await;
            });
        }
    });
    (addr, conns)
}

#[tokio::test]
async fn a_tls_upstream_keeps_its_connections_and_carries_bodies_and_upgrades() {
    let pki = pki(&["api.internal"]);
    let (addr, conns) = counting_tls_backend(pki.server).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, &pki.ca_pem).expect("write ca");
    let p = start_proxy(&format!(
        "http {{ upstream api.internal {{ server {addr}; keepalive 4; }}
           server {{ listen {{LISTEN}}; client_max_body_size 0;
             proxy_ssl_trusted_certificate {ca};
             proxy_http_version 1.1;
             proxy_read_timeout 5s;
             location / {{ proxy_pass https://api.internal; proxy_set_header Connection \"\"; }}
             location /stream {{ proxy_pass https://api.internal; proxy_set_header Connection \"\";
               proxy_request_buffering off; }}
             location /ws {{ proxy_pass https://api.internal;
               proxy_set_header Upgrade $http_upgrade; proxy_set_header Connection upgrade; }} }} }}",
        ca = ca.display()
    ))
    .await;
    // Kept alive: the TLS 1.3 session tickets the backend sends after its
    // handshake do not make the idle connection look used.
    for _ in 0..3 {
        let r = get(p.addr, "/").await;
        assert_eq!((r.status, r.text()), (200, "len=0 sum=0".to_string()));
    }
    assert_eq!(conns.load(Ordering::SeqCst), 1, "one TLS connection kept");
    // Request bodies larger than the socket buffers, buffered and streamed.
    let body: Vec<u8> = (0..16 * 1024 * 1024u32).map(|i| (i % 253) as u8).collect();
    let sum = body
        .iter()
        .fold(0u64, |a, b| a.wrapping_mul(31).wrapping_add(u64::from(*b)));
    for path in ["/", "/stream", "/slow", "/stream/slow"] {
        let req = hyper::Request::builder()
            .method("POST")
            .uri(path)
            .header("host", "client.example")
            .body(Full::new(Bytes::from(body.clone())))
            .expect("request");
        let r = send(p.addr, req).await;
        assert_eq!(
            (r.status, r.text()),
            (200, format!("len={} sum={sum}", body.len())),
            "{path}"
        );
    }
    // A peer that answers at once and echoes the body as it reads it:
    // the rest of the request goes over TLS while the response comes.
    for path in ["/echo", "/stream/echo"] {
        let req = hyper::Request::builder()
            .method("POST")
            .uri(path)
            .header("host", "client.example")
            .body(Full::new(Bytes::from(body.clone())))
            .expect("request");
        let r = send(p.addr, req).await;
        let echoed = r.body.expect("whole body");
        assert_eq!(
            (r.status, echoed.len(), echoed.as_ref() == body.as_slice()),
            (200, body.len(), true),
            "{path}"
        );
    }
    // A response body with no length, 2 MiB of it.
    let r = get(p.addr, "/big").await;
    let got = r.body.expect("whole body");
    assert_eq!((r.status, got.len()), (200, 512 * 4096));
    assert!(got
        .chunks(4096)
        .enumerate()
        .all(|(i, c)| c.iter().all(|b| *b == (i % 251) as u8)));
    // An upgrade tunnelled over the TLS connection.
    let mut c = tokio::net::TcpStream::connect(p.addr)
        .await
        .expect("connect");
    c.write_all(b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
        .await
        .expect("write");
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = c.read(&mut buf).await.expect("read");
        assert!(
            n > 0,
            "closed before 101: {}",
            String::from_utf8_lossy(&head)
        );
        head.extend_from_slice(&buf[..n]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 101"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    c.write_all(b"ping").await.expect("write");
    let mut echo = [0u8; 4];
    c.read_exact(&mut echo).await.expect("echo");
    assert_eq!(&echo, b"ping");
}
