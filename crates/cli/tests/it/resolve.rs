//! `server NAME resolve` with `resolver`: a tiny DNS server on 127.0.0.1
//! answers for NAME; `vigil serve` follows its answers, and the peer of an
//! address that stays keeps its state.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs, UdpSocket};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, ResponseCode};
use hickory_proto::rr::{rdata::A, RData, Record, RecordType};
use tokio::time::Instant;
use vigil_testkit::free_addr;

/// What the DNS server answers for A queries: addresses, or SERVFAIL.
#[derive(Clone)]
struct Zone(Arc<Mutex<(Option<Vec<Ipv4Addr>>, u32)>>);

impl Zone {
    fn set(&self, v: Option<Vec<Ipv4Addr>>) {
        self.0.lock().expect("test setup").0 = v;
    }
    fn queries(&self) -> u32 {
        self.0.lock().expect("test setup").1
    }
}

/// A UDP DNS responder on 127.0.0.1, TTL 1 s.
fn dns(zone: Zone) -> SocketAddr {
    let sock = UdpSocket::bind("127.0.0.1:0").expect("test setup");
    let addr = sock.local_addr().expect("test setup");
    std::thread::spawn(move || {
        let mut buf = [0u8; 1500];
        loop {
            let Ok((n, from)) = sock.recv_from(&mut buf) else {
                return;
            };
            let Ok(req) = Message::from_vec(&buf[..n]) else {
                continue;
            };
            let mut resp = Message::new();
            resp.set_id(req.id())
                .set_message_type(MessageType::Response)
                .set_op_code(req.op_code())
                .set_recursion_desired(req.recursion_desired())
                .set_recursion_available(true);
            resp.add_queries(req.queries().to_vec());
            let answer = {
                let mut z = zone.0.lock().expect("test setup");
                z.1 += 1;
                z.0.clone()
            };
            match answer {
                None => {
                    resp.set_response_code(ResponseCode::ServFail);
                }
                Some(ips) => {
                    for q in req.queries() {
                        if q.query_type() == RecordType::A {
                            for ip in &ips {
                                resp.add_answer(Record::from_rdata(
                                    q.name().clone(),
                                    1,
                                    RData::A(A(*ip)),
                                ));
                            }
                        }
                    }
                }
            }
            let _ = sock.send_to(&resp.to_vec().expect("test setup"), from);
        }
    });
    addr
}

/// A backend on `l` answering every request with `body`.
fn backend(l: TcpListener, body: &'static str) {
    crate::serve::answer_on(l, body);
}

fn get(addr: SocketAddr, path: &str) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

fn body(addr: SocketAddr) -> String {
    let r = get(addr, "/").unwrap_or_default();
    r.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or(r)
}

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(15);
    while !cond() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The name the upstream's `server` line resolves, and how `vigil serve`
/// sees it at load (through the system resolver, before its own resolver
/// takes over).
///
/// As root with `unshare -m`, vigil runs in a private mount namespace with
/// a hosts file of the test bound over /etc/hosts, naming `app.test`
/// 127.0.0.1 (CI requires this: VIGIL_REQUIRE_NAMESPACES). Elsewhere, a
/// name /etc/hosts already gives 127.0.0.1 alone, besides `localhost`
/// (which DNS clients answer themselves).
struct Hosts {
    name: String,
    /// The hosts file bound over /etc/hosts, when namespaces work.
    file: Option<tempfile::TempDir>,
}

impl Hosts {
    fn new() -> Self {
        let private = Command::new("sh")
            .args([
                "-c",
                "[ \"$(id -u)\" = 0 ] && unshare -m sh -c 'mount --bind /dev/null /etc/hosts'",
            ])
            .status()
            .is_ok_and(|s| s.success());
        if private {
            let dir = tempfile::tempdir().expect("test setup");
            std::fs::write(dir.path().join("hosts"), "127.0.0.1 app.test\n").expect("test setup");
            return Hosts {
                name: "app.test".into(),
                file: Some(dir),
            };
        }
        assert!(
            std::env::var_os("VIGIL_REQUIRE_NAMESPACES").is_none(),
            "VIGIL_REQUIRE_NAMESPACES is set but `unshare -m` with a bind mount over /etc/hosts does not work here"
        );
        Hosts {
            name: loopback_name(),
            file: None,
        }
    }
}

/// A name of /etc/hosts (not `localhost`, which DNS clients answer
/// themselves) that the system resolves to 127.0.0.1 alone.
fn loopback_name() -> String {
    let hosts = std::fs::read_to_string("/etc/hosts").unwrap_or_default();
    hosts
        .lines()
        .filter_map(|l| l.split('#').next())
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            (w.next()? == "127.0.0.1").then(|| w.map(str::to_string).collect::<Vec<_>>())
        })
        .flatten()
        .find(|n| {
            n != "localhost"
                && (n.as_str(), 80).to_socket_addrs().is_ok_and(|a| {
                    let a: Vec<SocketAddr> = a.collect();
                    a == vec![SocketAddr::from(([127, 0, 0, 1], 80))]
                })
        })
        .expect("without root and `unshare -m`: a name of /etc/hosts for 127.0.0.1 alone, besides localhost")
}

/// A `vigil serve` process, killed when dropped.
struct Serving(std::process::Child);

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `vigil serve` on `path`, its admin API on `admin`, seeing `hosts`.
fn serve(path: &std::path::Path, admin: SocketAddr, hosts: &Hosts) -> Serving {
    let vigil = env!("CARGO_BIN_EXE_vigil");
    let mut cmd = match &hosts.file {
        Some(dir) => {
            let mut c = Command::new("unshare");
            c.args([
                "-m",
                "sh",
                "-c",
                "mount --bind \"$0\" /etc/hosts && exec \"$@\"",
            ])
            .arg(dir.path().join("hosts"))
            .arg(vigil);
            c
        }
        None => Command::new(vigil),
    };
    Serving(
        cmd.args(["serve", "--threads", "1", "--admin-listen"])
            .arg(admin.to_string())
            .arg("--nginx-conf")
            .arg(path)
            .env("VIGIL_LOG", "error")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start vigil serve"),
    )
}

#[test]
fn resolve_follows_the_answers_and_a_staying_peer_keeps_its_state() {
    let hosts = Hosts::new();
    let name = hosts.name.clone();
    // One port on three loopback addresses; .2 does not listen yet.
    let l1 = TcpListener::bind("127.0.0.1:0").expect("test setup");
    let port = l1.local_addr().expect("test setup").port();
    let l3 = TcpListener::bind(("127.0.0.3", port)).expect("test setup");
    backend(l1, "b1");
    backend(l3, "b3");
    let zone = Zone(Arc::new(Mutex::new((
        Some(vec![
            Ipv4Addr::new(127, 0, 0, 1),
            Ipv4Addr::new(127, 0, 0, 2),
        ]),
        0,
    ))));
    let dns = dns(zone.clone());
    let (listen, admin) = (free_addr(), free_addr());
    let dir = tempfile::tempdir().expect("test setup");
    let path = dir.path().join("nginx.conf");
    std::fs::write(
        &path,
        format!(
            "events {{}}\nhttp {{\n  upstream u {{ zone u 64k; server {name}:{port} resolve max_fails=1 fail_timeout=60s; }}\n  resolver {dns} valid=1s ipv6=off;\n  server {{ listen {listen}; location / {{ proxy_pass http://u; }} }}\n}}\n"
        ),
    )
    .expect("test setup");
    let _serving = serve(&path, admin, &hosts);
    let events = || get(admin, "/api/events").unwrap_or_default();
    wait_for("the proxy to answer", || body(listen) == "b1");
    // The DNS server's first answer adds 127.0.0.2.
    let p2 = format!("127.0.0.2:{port}");
    wait_for("the first change", || {
        let e = events();
        e.contains("resolved") && e.contains(&format!("added [{p2}]"))
    });
    // 127.0.0.2 refuses: its first request fails over to .1 and excludes it.
    wait_for("127.0.0.2 excluded", || {
        assert_eq!(body(listen), "b1", "the refused attempt was retried on .1");
        events().contains("excluded")
    });
    // Now .2 listens, and the name moves to .2 and .3.
    let l2 = TcpListener::bind(("127.0.0.2", port)).expect("test setup");
    backend(l2, "b2");
    zone.set(Some(vec![
        Ipv4Addr::new(127, 0, 0, 2),
        Ipv4Addr::new(127, 0, 0, 3),
    ]));
    let p1 = format!("127.0.0.1:{port}");
    let p3 = format!("127.0.0.3:{port}");
    wait_for("the second change", || {
        events().contains(&format!("added [{p3}], removed [{p1}]"))
    });
    // Traffic moved to .3; .2 kept its exclusion (fail_timeout=60s): were
    // its state lost, round robin would send it every other request.
    for _ in 0..6 {
        assert_eq!(body(listen), "b3");
    }
    // A failing answer keeps the addresses.
    zone.set(None);
    let q = zone.queries();
    wait_for("two failed queries", || zone.queries() >= q + 2);
    for _ in 0..4 {
        assert_eq!(body(listen), "b3");
    }
    let e = events();
    assert_eq!(e.matches("name re-resolved").count(), 2, "{e}");
}

#[test]
fn without_valid_the_answers_ttl_paces_the_queries() {
    // nginx's default: an answer stands for its TTL (1 s here), then the
    // name is asked again.
    let hosts = Hosts::new();
    let name = hosts.name.clone();
    let l1 = TcpListener::bind("127.0.0.1:0").expect("test setup");
    let port = l1.local_addr().expect("test setup").port();
    let l2 = TcpListener::bind(("127.0.0.2", port)).expect("test setup");
    backend(l1, "b1");
    backend(l2, "b2");
    let zone = Zone(Arc::new(Mutex::new((
        Some(vec![Ipv4Addr::new(127, 0, 0, 2)]),
        0,
    ))));
    let dns = dns(zone.clone());
    let (listen, admin) = (free_addr(), free_addr());
    let dir = tempfile::tempdir().expect("test setup");
    let path = dir.path().join("nginx.conf");
    std::fs::write(
        &path,
        format!(
            "events {{}}\nhttp {{\n  resolver {dns} ipv6=off;\n  upstream u {{ zone u 64k; server {name}:{port} resolve; }}\n  server {{ listen {listen}; location / {{ proxy_pass http://u; }} }}\n}}\n"
        ),
    )
    .expect("test setup");
    let _serving = serve(&path, admin, &hosts);
    // Loaded as 127.0.0.1 (the system resolver); the DNS answer moves it.
    wait_for("traffic to move to 127.0.0.2", || body(listen) == "b2");
    zone.set(Some(vec![Ipv4Addr::new(127, 0, 0, 1)]));
    wait_for("traffic to move back after the TTL", || {
        body(listen) == "b1"
    });
    let e = get(admin, "/api/events").unwrap_or_default();
    assert_eq!(e.matches("name re-resolved").count(), 2, "{e}");
}
