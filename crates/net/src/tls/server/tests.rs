use std::path::PathBuf;

use rcgen::{CertificateParams, KeyPair};
use rustls::pki_types::ServerName;
use tokio::net::TcpListener;

use super::*;
use crate::tls::client::ClientTls;

/// A self-signed certificate for `name` and its key, written to `dir`.
fn pair(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec![name.to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let (c, k) = (
        dir.join(format!("{name}.crt")),
        dir.join(format!("{name}.key")),
    );
    std::fs::write(&c, cert.pem()).unwrap();
    std::fs::write(&k, key.serialize_pem()).unwrap();
    (c, k)
}

fn options() -> ServerOptions {
    ServerOptions {
        tls12: true,
        tls13: true,
        h2: false,
        session_cache: None,
        tickets: false,
        prefer_server_ciphers: false,
    }
}

#[test]
fn a_key_of_another_certificate_is_refused_with_both_files() {
    let dir = tempfile::tempdir().unwrap();
    let (a, _) = pair(dir.path(), "a.test");
    let (_, kb) = pair(dir.path(), "b.test");
    let e = load_key(&a, &kb).unwrap_err().to_string();
    assert!(
        e.contains("b.test.key") && e.contains("does not match the certificate"),
        "{e}"
    );
    assert!(e.contains("a.test.crt"), "{e}");
}

#[test]
fn missing_and_empty_files_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let (a, ka) = pair(dir.path(), "a.test");
    let missing = dir.path().join("none.crt");
    let e = load_key(&missing, &ka).unwrap_err();
    assert_eq!(e.path(), Some(missing.as_path()));
    // The key file given as the certificate: no certificate in it.
    let e = load_key(&ka, &ka).unwrap_err().to_string();
    assert!(e.contains("no certificate found"), "{e}");
    // The certificate given as the key.
    let e = load_key(&a, &a).unwrap_err().to_string();
    assert!(e.contains("no private key"), "{e}");
}

/// Handshake with `sni` and `alpn` against a listener whose configuration
/// is chosen by name; what the client saw: (certificate's name, ALPN).
async fn hello(sni: &str, alpn: &[&[u8]], h2: bool) -> (String, Option<Vec<u8>>) {
    let dir = tempfile::tempdir().unwrap();
    let (ca, ka) = pair(dir.path(), "a.test");
    let (cb, kb) = pair(dir.path(), "b.test");
    let o = ServerOptions { h2, ..options() };
    let a = server_config(vec![load_key(&ca, &ka).unwrap()], &o).unwrap();
    let b = server_config(vec![load_key(&cb, &kb).unwrap()], &o).unwrap();
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        let (s, _) = l.accept().await.unwrap();
        assert_eq!(sniff(&s).await.unwrap(), Some(true));
        let tls = handshake(s, |name| match name {
            Some("b.test") => b,
            _ => a,
        })
        .await
        .unwrap();
        let _ = is_h2(&tls);
        // Keep the connection until the client has looked.
        let mut tls = tls;
        let _ = tokio::io::AsyncReadExt::read(&mut tls, &mut [0u8; 1]).await;
    });
    let mut config = ClientTls {
        verify: false,
        ca_file: None,
        client_auth: None,
    }
    .build()
    .unwrap();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let tcp = TcpStream::connect(addr).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from(sni.to_string()).unwrap(), tcp)
        .await
        .unwrap();
    let (_, conn) = tls.get_ref();
    let cert = conn.peer_certificates().unwrap()[0].clone();
    let served = if cert.as_ref().windows(6).any(|w| w == b"b.test") {
        "b.test"
    } else {
        "a.test"
    };
    (served.to_string(), conn.alpn_protocol().map(<[u8]>::to_vec))
}

#[tokio::test]
async fn sni_picks_the_configuration_and_alpn_offers_h2_only_when_asked() {
    assert_eq!(
        hello("b.test", &[b"h2", b"http/1.1"], true).await,
        ("b.test".into(), Some(b"h2".to_vec()))
    );
    assert_eq!(
        hello("other.test", &[b"h2", b"http/1.1"], false).await,
        ("a.test".into(), Some(b"http/1.1".to_vec()))
    );
    assert_eq!(hello("a.test", &[], true).await, ("a.test".into(), None));
}
