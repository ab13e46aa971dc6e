//! The real `vigil serve` process: one-line startup errors with exit code 2,
//! SIGHUP reload, SIGTERM shutdown.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A backend answering every request with `body`, on its own thread.
fn backend(body: &'static str) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                let mut got = Vec::new();
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = write!(
                    s,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            });
        }
    });
    addr
}

fn free_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
}

fn get(addr: SocketAddr) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn conf(upstream: SocketAddr, listen: SocketAddr) -> String {
    format!("events {{}} http {{ upstream u {{ server {upstream}; }} server {{ listen {listen}; location / {{ proxy_pass http://u; }} }} }}\n")
}

#[test]
fn a_bad_config_is_one_clear_line_and_exit_code_2() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("nginx.conf");
    std::fs::write(
        &path,
        "http {\n  upstream u { server 127.0.0.1:1 weight=0; }\n}\n",
    )
    .expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_vigil"))
        .args(["serve", "--nginx-conf"])
        .arg(&path)
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("nginx.conf:2:") && err.contains("weight"),
        "{err}"
    );
}

#[test]
fn sighup_reloads_and_sigterm_stops() {
    let (a, b) = (backend("A"), backend("B"));
    let listen = free_port();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("nginx.conf");
    std::fs::write(&path, conf(a, listen)).expect("write");
    let mut child = Command::new(env!("CARGO_BIN_EXE_vigil"))
        .args(["serve", "--no-admin", "--threads", "1", "--nginx-conf"])
        .arg(&path)
        .env("VIGIL_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start");
    wait_for("the proxy to answer from A", || {
        get(listen).is_some_and(|r| r.ends_with("\r\n\r\nA"))
    });
    std::fs::write(&path, conf(b, listen)).expect("rewrite");
    let kill = |sig: &str| {
        Command::new("kill")
            .args([sig, &child.id().to_string()])
            .status()
            .expect("kill")
    };
    assert!(kill("-HUP").success());
    wait_for("the reloaded config to send requests to B", || {
        get(listen).is_some_and(|r| r.ends_with("\r\n\r\nB"))
    });
    assert!(kill("-TERM").success());
    let until = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        assert!(Instant::now() < until, "vigil did not exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status}");
}
