//! The admin listener of a real `vigil serve`: it answers only requests
//! that name it (DNS rebinding), and idle or slow connections past its cap
//! do not keep `vigil status` out.

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

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

#[test]
fn three_hundred_idle_and_slowloris_connections_do_not_lock_vigil_status_out() {
    let _ = rlimit::increase_nofile_limit(4096);
    let a = backend("A");
    let (listen, admin) = (free_addr(), free_addr());
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("nginx.conf");
    std::fs::write(&path, conf(a, listen)).expect("write");
    let admin_s = admin.to_string();
    let _serving = serve_with_admin(&path, &admin_s, &[]);
    wait_for("the admin API", || {
        status_line(admin, "127.0.0.1").starts_with("HTTP/1.1 200")
    });
    // Past the 256-connection cap: silent ones, and every third sends a
    // partial request head and stops (slowloris).
    let mut held = Vec::with_capacity(300);
    for i in 0..300 {
        let mut s = TcpStream::connect_timeout(&admin, Duration::from_secs(5)).expect("connect");
        if i % 3 == 0 {
            s.write_all(b"GET /api/status HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Wait: ")
                .expect("partial head");
        }
        held.push(s);
    }
    // The operator's command, while all 300 are open (its own bounds: 5 s
    // to connect, 10 s for the answer; the header timeout that would free
    // places is 10 s too, so a refused connection fails it at once).
    let out = vigil(&["status", "--admin", &admin_s]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains(&a.to_string()), "{text}");
    drop(held);
}
