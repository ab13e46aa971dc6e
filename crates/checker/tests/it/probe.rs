//! Probes against in-process servers on 127.0.0.1: each failure names its
//! phase and says what happened.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use vigil_checker::probe::{run, FailureKind};
use vigil_checker::{Target, TlsOptions};
use vigil_core::config::{CheckKind, HttpCheck, StatusClass};
use vigil_core::health::ProbePhase;

use crate::support::{refused_addr, Behaviour, Blackhole, Raw};

const OK: &str = "HTTP/1.1 200 OK\r\nContent-Length: 7\r\nConnection: close\r\n\r\nall ok\n";

fn target(addr: SocketAddr, kind: CheckKind) -> Target {
    Target {
        addr,
        unix: None,
        kind,
        server_name: "127.0.0.1".into(),
        http: HttpCheck::default(),
        timeout: Duration::from_millis(300),
        interval: Duration::from_secs(10),
        jitter: Duration::ZERO,
        tls: None,
    }
}

#[tokio::test]
async fn refused_is_a_connect_failure() {
    let f = run(&target(refused_addr(), CheckKind::Http))
        .await
        .expect_err("expected a failure");
    assert_eq!(f.phase(), ProbePhase::Connect);
    assert!(f.is_refused(), "{f}");
    assert_eq!(f.detail(), "connection refused");
}

#[tokio::test]
async fn blackholed_connect_times_out_in_the_connect_phase() {
    let hole = Blackhole::start().await;
    let f = run(&target(hole.addr, CheckKind::Tcp))
        .await
        .expect_err("expected a failure");
    assert_eq!(f.phase(), ProbePhase::Connect);
    assert!(f.is_timeout(), "{f}");
    assert_eq!(f.detail(), "timed out after 300ms connecting");
}

#[tokio::test]
async fn accepts_but_never_answers_fails_waiting_for_the_first_byte() {
    let b = Raw::start(Behaviour::Hang).await;
    let f = run(&target(b.addr, CheckKind::Http))
        .await
        .expect_err("expected a failure");
    assert_eq!(f.phase(), ProbePhase::FirstByte);
    assert!(f.is_timeout());
    assert_eq!(
        f.detail(),
        "timed out after 300ms waiting for the first byte"
    );
    // tcp only asks for a connection: the same backend passes.
    assert_eq!(
        run(&target(b.addr, CheckKind::Tcp)).await.as_deref(),
        Ok("connected")
    );
}

#[tokio::test]
async fn tcp_fails_when_the_peer_closes_right_after_connect() {
    let b = Raw::start(Behaviour::Close).await;
    let f = run(&target(b.addr, CheckKind::Tcp))
        .await
        .expect_err("expected a failure");
    assert_eq!(f.phase(), ProbePhase::Connect);
    assert_eq!(f.kind(), FailureKind::Io);
}

#[tokio::test]
async fn http_status_is_judged_by_the_expected_classes() {
    let ok = Raw::start(Behaviour::Answer(OK)).await;
    assert_eq!(
        run(&target(ok.addr, CheckKind::Http)).await.as_deref(),
        Ok("HTTP 200")
    );
    let bad = Raw::start(Behaviour::Answer(
        "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n",
    ))
    .await;
    let f = run(&target(bad.addr, CheckKind::Http))
        .await
        .expect_err("expected a failure");
    assert_eq!(f.phase(), ProbePhase::Status);
    assert_eq!(f.kind(), FailureKind::Status);
    assert_eq!(f.detail(), "status 503 not in http_2xx http_3xx");
    let mut t = target(bad.addr, CheckKind::Http);
    t.http.expect = vec![StatusClass::Exact(503)];
    assert_eq!(run(&t).await.as_deref(), Ok("HTTP 503"));
    let garbage = Raw::start(Behaviour::Answer("SSH-2.0-OpenSSH_9.2\r\n")).await;
    let f = run(&target(garbage.addr, CheckKind::Http))
        .await
        .expect_err("expected a failure");
    assert_eq!(
        (f.phase(), f.kind()),
        (ProbePhase::Status, FailureKind::Protocol)
    );
}

#[tokio::test]
async fn the_raw_request_is_sent_as_written() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("test step");
    let addr = listener.local_addr().expect("test step");
    let seen = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.expect("test step");
        let mut buf = vec![0u8; 256];
        let mut got = Vec::new();
        while !got.ends_with(b"\r\n\r\n") {
            let n = s.read(&mut buf).await.expect("test step");
            assert!(n > 0);
            got.extend_from_slice(&buf[..n]);
        }
        s.write_all(OK.as_bytes()).await.expect("test step");
        String::from_utf8(got).expect("test step")
    });
    let mut t = target(addr, CheckKind::Http);
    t.http.send = "HEAD /health HTTP/1.0\r\nHost: api\r\n\r\n".into();
    run(&t).await.expect("test step");
    assert_eq!(
        seen.await.expect("test step"),
        "HEAD /health HTTP/1.0\r\nHost: api\r\n\r\n"
    );
}

#[tokio::test]
async fn body_match_reads_a_bounded_body() {
    let ok = Raw::start(Behaviour::Answer(OK)).await;
    let mut t = target(ok.addr, CheckKind::Http);
    t.http.body_contains = Some("all ok".into());
    assert_eq!(
        run(&t).await.as_deref(),
        Ok("HTTP 200, body contains \"all ok\"")
    );
    t.http.body_contains = Some("READY".into());
    let f = run(&t).await.expect_err("expected a failure");
    assert_eq!((f.phase(), f.kind()), (ProbePhase::Body, FailureKind::Body));
    assert_eq!(f.detail(), "body does not contain \"READY\" (7 bytes read)");
    let chunked = Raw::start(Behaviour::Answer(
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nREA\r\n2\r\nDY\r\n0\r\n\r\n",
    ))
    .await;
    let mut t = target(chunked.addr, CheckKind::Http);
    t.http.body_contains = Some("READY".into());
    assert!(run(&t).await.is_ok());
}

#[tokio::test]
async fn slow_body_times_out_in_the_body_phase() {
    let slow = Raw::start(Behaviour::SlowBody(
        "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n",
        "not yet ok",
        Duration::from_millis(100),
    ))
    .await;
    let mut t = target(slow.addr, CheckKind::Http);
    t.http.body_contains = Some("ok".into());
    let f = run(&t).await.expect_err("expected a failure");
    assert_eq!(f.phase(), ProbePhase::Body);
    assert!(f.is_timeout());
    assert_eq!(f.detail(), "timed out after 300ms reading the body");
    // Without a body match the body is read as framed all the same.
    let f = run(&target(slow.addr, CheckKind::Http))
        .await
        .expect_err("the body did not come in time");
    assert_eq!(f.phase(), ProbePhase::Body);
}

/// A peer that sends its status and part of its body, then resets, fails
/// its probe as it fails its clients (the proxy cuts their bodies short),
/// with a body match or without.
#[tokio::test]
async fn a_body_cut_short_by_a_reset_or_a_close_fails_the_probe() {
    for b in [
        Behaviour::AnswerThenReset("HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\nfirst half"),
        Behaviour::Answer("HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\nfirst half"),
    ] {
        let cut = Raw::start(b).await;
        for needle in [None, Some("first")] {
            let mut t = target(cut.addr, CheckKind::Http);
            t.http.body_contains = needle.map(str::to_string);
            let f = run(&t).await.expect_err("a body cut short");
            assert_eq!(
                (f.phase(), f.kind()),
                (ProbePhase::Body, FailureKind::Io),
                "{needle:?}: {f}"
            );
        }
    }
    let whole = Raw::start(Behaviour::Answer(OK)).await;
    assert!(run(&target(whole.addr, CheckKind::Http)).await.is_ok());
}

struct Pki {
    ca_file: tempfile::NamedTempFile,
    server: tokio_rustls::rustls::ServerConfig,
}

fn pki(names: &[&str]) -> Pki {
    use tokio_rustls::rustls;
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
    let ca_file = tempfile::NamedTempFile::new().expect("tmp");
    std::fs::write(ca_file.path(), ca.pem()).expect("write ca");
    Pki { ca_file, server }
}

/// An HTTPS backend answering 200 to anything.
async fn tls_backend(server: tokio_rustls::rustls::ServerConfig) -> SocketAddr {
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(s).await else {
                    return;
                };
                let mut buf = [0u8; 1024];
                let _ = tls.read(&mut buf).await;
                let _ = tls.write_all(OK.as_bytes()).await;
                let _ = tls.shutdown().await;
            });
        }
    });
    addr
}

fn https(addr: SocketAddr, name: &str, options: &TlsOptions) -> Target {
    let mut t = target(addr, CheckKind::Https);
    t.server_name = name.into();
    t.timeout = Duration::from_secs(2);
    t.tls = Some(Arc::new(options.client_config().expect("tls config")));
    t
}

#[tokio::test]
async fn https_verifies_against_a_test_ca_with_sni() {
    let pki = pki(&["localhost"]);
    let addr = tls_backend(pki.server).await;
    let trusting = TlsOptions {
        ca_file: Some(pki.ca_file.path().to_path_buf()),
        ..TlsOptions::default()
    };
    assert_eq!(
        run(&https(addr, "localhost", &trusting)).await.as_deref(),
        Ok("HTTP 200")
    );
    // The system roots alone do not know the test CA.
    let f = run(&https(addr, "localhost", &TlsOptions::default()))
        .await
        .expect_err("expected a failure");
    assert_eq!((f.phase(), f.kind()), (ProbePhase::Tls, FailureKind::Tls));
    assert!(f.detail().contains("certificate"), "{f}");
}

#[tokio::test]
async fn https_refuses_a_certificate_for_another_name() {
    let pki = pki(&["other.example"]);
    let addr = tls_backend(pki.server).await;
    let trusting = TlsOptions {
        ca_file: Some(pki.ca_file.path().to_path_buf()),
        ..TlsOptions::default()
    };
    let f = run(&https(addr, "localhost", &trusting))
        .await
        .expect_err("expected a failure");
    assert_eq!(f.phase(), ProbePhase::Tls);
    assert!(f.detail().contains("not valid for name"), "{f}");
    // Verification off: any certificate will do.
    let off = TlsOptions {
        verify: false,
        ..TlsOptions::default()
    };
    assert!(run(&https(addr, "localhost", &off)).await.is_ok());
}

/// A unix-domain socket in a temp dir that answers `reply` to each
/// connection (after reading the request), or closes at once when empty.
async fn unix_peer(reply: &'static str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("peer.sock");
    let listener = tokio::net::UnixListener::bind(&path).expect("bind unix");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            if reply.is_empty() {
                drop(s);
                continue;
            }
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf).await;
                let _ = s.write_all(reply.as_bytes()).await;
            });
        }
    });
    (dir, path)
}

fn unix_target(path: &std::path::Path, kind: CheckKind) -> Target {
    Target {
        unix: Some(path.to_path_buf()),
        ..target(refused_addr(), kind)
    }
}

#[tokio::test]
async fn probes_reach_a_unix_socket_peer() {
    let (_dir, path) = unix_peer(OK).await;
    assert_eq!(
        run(&unix_target(&path, CheckKind::Http)).await.as_deref(),
        Ok("HTTP 200")
    );
    // tcp on a unix socket: connected, nothing said.
    assert_eq!(
        run(&unix_target(&path, CheckKind::Tcp)).await.as_deref(),
        Ok("connected")
    );
    let (_dir2, closing) = unix_peer("").await;
    let f = run(&unix_target(&closing, CheckKind::Tcp))
        .await
        .expect_err("closed at once");
    assert_eq!(f.phase(), ProbePhase::Connect);
    assert_eq!(
        f.detail(),
        "connection closed by the peer right after connect"
    );
    // A path nobody listens on: a connect failure, as nginx's connect().
    let missing = _dir.path().join("missing.sock");
    let f = run(&unix_target(&missing, CheckKind::Http))
        .await
        .expect_err("no socket");
    assert_eq!(f.phase(), ProbePhase::Connect);
}
