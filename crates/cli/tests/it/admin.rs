//! The admin listener of a real `vigil serve`: it answers only requests
//! that name it (DNS rebinding).

use vigil_testkit::free_addr;

use crate::serve::{backend, conf, exchange, serve_with_admin, vigil, wait_for};

/// `GET /api/status` on `admin` with `host` as its `Host`: the status line.
fn status_line(admin: std::net::SocketAddr, host: &str) -> String {
    exchange(
        admin,
        &format!("GET /api/status HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"),
    )
    .and_then(|r| r.lines().next().map(str::to_string))
    .unwrap_or_default()
}

#[test]
fn a_rebound_name_is_misdirected_and_a_configured_one_is_served() {
    let a = backend("A");
    let (listen, admin) = (free_addr(), free_addr());
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("nginx.conf");
    std::fs::write(&path, conf(a, listen)).expect("write");
    let admin_s = admin.to_string();
    let _serving = serve_with_admin(&path, &admin_s, &["--admin-host", "Vigil.Internal"]);
    wait_for("the admin API", || {
        status_line(admin, "127.0.0.1").starts_with("HTTP/1.1 200")
    });
    assert!(status_line(admin, &admin_s).starts_with("HTTP/1.1 200"));
    assert!(status_line(admin, "localhost:9901").starts_with("HTTP/1.1 200"));
    assert!(status_line(admin, "vigil.internal:9901").starts_with("HTTP/1.1 200"));
    assert_eq!(
        status_line(admin, "evil.example:9901"),
        "HTTP/1.1 421 Misdirected Request"
    );
    // The CLI names the address it dials.
    let out = vigil(&["status", "--admin", &admin_s]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A name that is not a host name is refused when vigil starts.
    let out = vigil(&[
        "serve",
        "--admin-host",
        "*.example.com",
        "--nginx-conf",
        &path.to_string_lossy(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("\"*.example.com\" is not a host name"),
        "{err}"
    );
}
