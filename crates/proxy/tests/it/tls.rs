//! HTTPS upstreams through hyper-rustls: verification with a custom CA,
//! SNI from the upstream name, wrong names refused, verification off.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper::Response;
use hyper_util::rt::TokioIo;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use tokio_rustls::rustls;

use crate::support::{get, start_proxy};

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
    let clock: Arc<dyn vigil_core::Clock> = Arc::new(vigil_core::SystemClock::new());
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
