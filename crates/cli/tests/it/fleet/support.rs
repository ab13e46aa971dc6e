//! The fleet tests' fixtures: a real etcd (`/usr/bin/etcd`, started here on 127.0.0.1
//! with a temporary data dir), real `vigil serve` processes and real
//! backends that tell which process probed them (the probe's socket is
//! looked up in /proc, so a count at the backend is a count per member).
//!
//! The four scenarios of issue 14: each target probed by exactly R
//! members; a failing backend leaves every member's rotation; a killed
//! member's targets are probed again by the others; with etcd stopped
//! every member probes everything and serves, and rejoins when it is back.

use std::collections::{BTreeSet, HashMap};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
pub(super) use vigil_testkit::free_addr as free_port;

use tokio::time::Instant;

use serde_json::Value;

pub(super) const INTERVAL_MS: u64 = 300;
const ETCD: &str = "/usr/bin/etcd";

// === etcd ===

/// One etcd member on 127.0.0.1, stopped on drop.
pub(super) struct Etcd {
    dir: tempfile::TempDir,
    client: SocketAddr,
    peer: SocketAddr,
    /// TLS on the client URL: (certificate, key, CA) files; clients need
    /// a certificate of that CA (`--client-cert-auth`).
    tls: Option<(PathBuf, PathBuf, PathBuf)>,
    pub(super) child: Option<Child>,
}

impl Etcd {
    pub(super) fn start() -> Self {
        let mut e = Etcd {
            dir: data_dir(),
            client: free_port(),
            peer: free_port(),
            tls: None,
            child: None,
        };
        e.restart();
        e
    }

    /// An etcd that serves clients over TLS only and asks for their certificates.
    pub(super) fn start_tls(cert: PathBuf, key: PathBuf, ca: PathBuf) -> Self {
        let mut e = Etcd {
            dir: data_dir(),
            client: free_port(),
            peer: free_port(),
            tls: Some((cert, key, ca)),
            child: None,
        };
        e.restart();
        e
    }

    pub(super) fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.client)
    }

    /// (Re)start on the same ports and data dir.
    pub(super) fn restart(&mut self) {
        let client = self.url();
        let peer = format!("http://{}", self.peer);
        let log = std::fs::File::create(self.dir.path().join("etcd.log")).expect("test step");
        let mut cmd = Command::new(ETCD);
        if let Some((cert, key, ca)) = &self.tls {
            cmd.arg(format!("--cert-file={}", cert.display()))
                .arg(format!("--key-file={}", key.display()))
                .arg(format!("--trusted-ca-file={}", ca.display()))
                .arg("--client-cert-auth");
        }
        let child = cmd
            .arg("--name=t")
            .arg(format!(
                "--data-dir={}",
                self.dir.path().join("data").display()
            ))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=t={peer}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start /usr/bin/etcd (Debian's etcd-server)");
        self.child = Some(child);
        let addr = self.client;
        if self.tls.is_some() {
            // No TLS client here: an accepted connection will do.
            wait_for("etcd to listen", Duration::from_secs(20), || {
                TcpStream::connect(addr).is_ok()
            });
            return;
        }
        wait_for("etcd to be healthy", Duration::from_secs(20), || {
            http_get(addr, "/health").is_some_and(|(s, b)| s == 200 && b.contains("true"))
        });
    }

    /// Send a signal to etcd (`STOP` freezes it: the slow etcd case).
    pub(super) fn signal(&self, sig: &str) {
        let pid = self.child.as_ref().map(Child::id).expect("etcd running");
        let ok = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(pid.to_string())
            .status()
            .expect("kill");
        assert!(ok.success(), "kill -{sig} {pid}");
    }

    pub(super) fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `etcdctl` (API v3) against one etcd: the hostile writer of the trust
/// tests. Missing, it is a failure, not a skip, as a missing etcd is.
pub(super) struct Etcdctl {
    endpoint: String,
}

impl Etcdctl {
    pub(super) fn new(etcd: &Etcd) -> Self {
        let ctl = Etcdctl {
            endpoint: etcd.url(),
        };
        let out = ctl.command().arg("version").output().unwrap_or_else(|e| {
            panic!("cannot run etcdctl ({e}): install it (Debian: apt-get install etcd-client)")
        });
        assert!(out.status.success(), "etcdctl version: {out:?}");
        ctl
    }

    fn command(&self) -> Command {
        let mut c = Command::new("etcdctl");
        c.env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.endpoint));
        c
    }

    /// `etcdctl put KEY VALUE`, under `lease` (hex, as etcdctl takes it) if given.
    pub(super) fn put(&self, key: &str, value: &str, lease: Option<&str>) {
        let mut c = self.command();
        c.arg("put");
        if let Some(l) = lease {
            c.arg(format!("--lease={l}"));
        }
        let out = c.arg(key).arg(value).output().expect("run etcdctl");
        assert!(
            out.status.success(),
            "etcdctl put {key} {value} (lease {lease:?}): {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The lease `key` is attached to, in hex (0: none).
    pub(super) fn lease_of(&self, key: &str) -> String {
        let out = self
            .command()
            .args(["get", key, "-w", "json"])
            .output()
            .expect("run etcdctl");
        assert!(out.status.success(), "etcdctl get {key}: {out:?}");
        let v: Value = serde_json::from_slice(&out.stdout).expect("etcdctl's json");
        let lease = v["kvs"][0]["lease"].as_i64().unwrap_or(0);
        format!("{lease:x}")
    }
}

// === backends ===

/// Backends that answer `GET /health` (probes) and anything else
/// (traffic), recording which registered process sent each probe.
pub(super) struct Backends {
    pub(super) addrs: Vec<SocketAddr>,
    /// Per backend: the member names whose probes it saw, in order.
    pub(super) probes: Vec<Arc<Mutex<Vec<String>>>>,
    /// Per backend: traffic requests.
    pub(super) traffic: Vec<Arc<AtomicUsize>>,
    /// Per backend: answer 500 to everything.
    pub(super) failing: Vec<Arc<AtomicBool>>,
    /// Per backend: close traffic connections unanswered (probes pass).
    pub(super) broken: Vec<Arc<AtomicBool>>,
    /// Per backend: stopped, answering nothing: every connection, probes
    /// too, is closed as soon as it is accepted.
    pub(super) stopped: Vec<Arc<AtomicBool>>,
    /// pid -> member name, for the /proc look-up.
    pub(super) pids: Arc<Mutex<HashMap<u32, String>>>,
}

impl Backends {
    pub(super) fn start(n: usize) -> Self {
        let pids: Arc<Mutex<HashMap<u32, String>>> = Arc::default();
        let mut b = Backends {
            addrs: Vec::new(),
            probes: Vec::new(),
            traffic: Vec::new(),
            failing: Vec::new(),
            broken: Vec::new(),
            stopped: Vec::new(),
            pids: pids.clone(),
        };
        for _ in 0..n {
            let l = TcpListener::bind("127.0.0.1:0").expect("test step");
            let addr = l.local_addr().expect("test step");
            let probes: Arc<Mutex<Vec<String>>> = Arc::default();
            let traffic = Arc::new(AtomicUsize::new(0));
            let failing = Arc::new(AtomicBool::new(false));
            let broken = Arc::new(AtomicBool::new(false));
            let stopped = Arc::new(AtomicBool::new(false));
            let (p, t, f, pids, st) = (
                probes.clone(),
                traffic.clone(),
                (failing.clone(), broken.clone()),
                pids.clone(),
                stopped.clone(),
            );
            std::thread::spawn(move || {
                for s in l.incoming() {
                    let Ok(s) = s else { continue };
                    if st.load(Ordering::SeqCst) {
                        continue; // dropped: closed unanswered
                    }
                    let (p, t, f, pids) = (p.clone(), t.clone(), f.clone(), pids.clone());
                    std::thread::spawn(move || serve_one(s, addr, &p, &t, &f, &pids));
                }
            });
            b.addrs.push(addr);
            b.probes.push(probes);
            b.traffic.push(traffic);
            b.failing.push(failing);
            b.broken.push(broken);
            b.stopped.push(stopped);
        }
        b
    }

    pub(super) fn clear_probes(&self) {
        for p in &self.probes {
            p.lock().expect("test step").clear();
        }
    }

    /// Who probed backend `i` since the last clear.
    pub(super) fn probers(&self, i: usize) -> Vec<String> {
        self.probes[i].lock().expect("test step").clone()
    }
}

fn serve_one(
    mut s: TcpStream,
    me: SocketAddr,
    probes: &Mutex<Vec<String>>,
    traffic: &AtomicUsize,
    (failing, broken): &(Arc<AtomicBool>, Arc<AtomicBool>),
    pids: &Mutex<HashMap<u32, String>>,
) {
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let mut got = Vec::new();
    let mut buf = [0u8; 2048];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    if got.starts_with(b"GET /health ") {
        // The prober's socket is still open while it waits for this answer.
        let who = s
            .peer_addr()
            .ok()
            .and_then(|peer| owner_of(peer, me, &pids.lock().expect("test step")))
            .unwrap_or_else(|| "?".into());
        probes.lock().expect("test step").push(who);
    } else {
        traffic.fetch_add(1, Ordering::SeqCst);
        if broken.load(Ordering::SeqCst) {
            return; // closed before any response byte: an `error`
        }
    }
    let status = if failing.load(Ordering::SeqCst) {
        "500 Internal Server Error"
    } else {
        "200 OK"
    };
    let _ = write!(
        s,
        "HTTP/1.1 {status}\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
    );
}

/// The registered process holding the client end `peer` -> `me` of a
/// loopback TCP connection: the socket's inode from the kernel's socket
/// diagnostics (netlink `SOCK_DIAG_BY_FAMILY`, one exact look-up, not a scan
/// of /proc/net/tcp), then the process whose /proc/PID/fd holds it.
fn owner_of(peer: SocketAddr, me: SocketAddr, pids: &HashMap<u32, String>) -> Option<String> {
    let inode = diag_inode(peer, me)?;
    let want = format!("socket:[{inode}]");
    pids.iter().find_map(|(pid, name)| {
        let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?;
        fds.flatten()
            .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l.to_string_lossy() == want))
            .then(|| name.clone())
    })
}

/// The inode of the IPv4 TCP socket `src` -> `dst` (linux/inet_diag.h).
fn diag_inode(src: SocketAddr, dst: SocketAddr) -> Option<u32> {
    use socket2::{Domain, Protocol, Socket, Type};
    const AF_NETLINK: i32 = 16;
    const NETLINK_SOCK_DIAG: i32 = 4;
    const SOCK_DIAG_BY_FAMILY: u16 = 20;
    const NLM_F_REQUEST: u16 = 1;
    const NLMSG_ERROR: u16 = 2;
    let (SocketAddr::V4(s), SocketAddr::V4(d)) = (src, dst) else {
        return None;
    };
    let sock = Socket::new(
        Domain::from(AF_NETLINK),
        Type::DGRAM,
        Some(Protocol::from(NETLINK_SOCK_DIAG)),
    )
    .ok()?;
    let mut req = Vec::with_capacity(72);
    req.extend_from_slice(&72u32.to_ne_bytes()); // nlmsg_len
    req.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    req.extend_from_slice(&NLM_F_REQUEST.to_ne_bytes());
    req.extend_from_slice(&1u32.to_ne_bytes()); // seq
    req.extend_from_slice(&0u32.to_ne_bytes()); // pid
    req.extend_from_slice(&[2, 6, 0, 0]); // AF_INET, IPPROTO_TCP, ext, pad
    req.extend_from_slice(&u32::MAX.to_ne_bytes()); // every state
    req.extend_from_slice(&s.port().to_be_bytes());
    req.extend_from_slice(&d.port().to_be_bytes());
    let mut src16 = [0u8; 16];
    src16[..4].copy_from_slice(&s.ip().octets());
    let mut dst16 = [0u8; 16];
    dst16[..4].copy_from_slice(&d.ip().octets());
    req.extend_from_slice(&src16);
    req.extend_from_slice(&dst16);
    req.extend_from_slice(&0u32.to_ne_bytes()); // interface
    req.extend_from_slice(&u32::MAX.to_ne_bytes()); // no cookie
    req.extend_from_slice(&u32::MAX.to_ne_bytes());
    (&sock).write_all(&req).ok()?;
    let mut buf = [0u8; 512];
    let n = (&sock).read(&mut buf).ok()?;
    let kind = u16::from_ne_bytes([buf[4], buf[5]]);
    if n < 88 || kind == NLMSG_ERROR {
        return None;
    }
    // nlmsghdr (16) + family, state, timer, retrans (4) + sockid (48) +
    // expires, rqueue, wqueue, uid (16), then the inode.
    Some(u32::from_ne_bytes([buf[84], buf[85], buf[86], buf[87]]))
}

// === vigil members ===

/// One `vigil serve` in a fleet, killed on drop.
pub(super) struct Member {
    pub(super) name: String,
    pub(super) listen: SocketAddr,
    pub(super) admin: SocketAddr,
    pub(super) log: PathBuf,
    pub(super) child: Option<Child>,
}

/// How a member runs.
pub(super) struct How {
    pub(super) replicas: usize,
    pub(super) interval_ms: u64,
    pub(super) share_passive: bool,
    /// Parameters of every `server` line.
    pub(super) server_params: &'static str,
    /// More flags of `vigil serve`.
    pub(super) extra: Vec<String>,
    /// No `check` in the upstream: passive accounting only.
    pub(super) no_check: bool,
}

impl Default for How {
    fn default() -> Self {
        How {
            replicas: 1,
            interval_ms: INTERVAL_MS,
            share_passive: false,
            server_params: "",
            extra: Vec::new(),
            no_check: false,
        }
    }
}

impl Member {
    pub(super) fn start(
        dir: &Path,
        name: &str,
        fleet: &str,
        etcd: &str,
        replicas: usize,
        b: &Backends,
    ) -> Self {
        let how = How {
            replicas,
            ..How::default()
        };
        Self::start_with(dir, name, fleet, etcd, b, &how)
    }

    /// [`Member::start`] with other settings.
    pub(super) fn start_with(
        dir: &Path,
        name: &str,
        fleet: &str,
        etcd: &str,
        b: &Backends,
        how: &How,
    ) -> Self {
        let (interval_ms, replicas) = (how.interval_ms, how.replicas);
        let timeout_ms = (interval_ms * 5 / 6).min(900);
        let listen = free_port();
        let admin = free_port();
        let servers: String = b
            .addrs
            .iter()
            .map(|a| format!("server {a} {}; ", how.server_params))
            .collect();
        let check = if how.no_check {
            String::new()
        } else {
            format!(
                "check interval={interval_ms} rise=1 fall=2 timeout={timeout_ms} type=http; \
                 check_http_send \"GET /health HTTP/1.0\\r\\n\\r\\n\"; "
            )
        };
        let conf = format!(
            "events {{}} http {{ upstream u {{ {servers} {check}}} \
             server {{ listen {listen}; location / {{ proxy_pass http://u; }} }} }}\n"
        );
        let path = dir.join(format!("{name}.conf"));
        std::fs::write(&path, conf).expect("test step");
        let log = dir.join(format!("{name}.log"));
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_vigil"));
        cmd.args(["serve", "--threads", "1", "--nginx-conf"])
            .arg(&path)
            .arg(format!("--admin-listen={admin}"));
        // No etcd: a plain instance (the load measurement's baseline).
        if !etcd.is_empty() {
            cmd.arg(format!("--fleet-etcd={etcd}"))
                .arg(format!("--fleet-name={fleet}"))
                .arg(format!("--fleet-member={name}"))
                .arg(format!("--fleet-replicas={replicas}"))
                .args(["--fleet-ttl=2s", "--fleet-etcd-timeout=500ms"]);
            if how.share_passive {
                cmd.arg("--fleet-share-passive");
            }
            cmd.args(&how.extra);
        }
        let child = cmd
            .env_remove("VIGIL_ADMIN_TOKEN")
            .env("VIGIL_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("test step"))
            .spawn()
            .expect("test step");
        let without_fleet = etcd.is_empty();
        Member::started(b, name, listen, admin, log, child, |m| {
            if without_fleet {
                http_get(m.admin, "/api/status").is_some()
            } else {
                m.fleet().is_some()
            }
        })
    }

    /// A member's process just spawned: its pid registered with `b` (killed
    /// at the end), then waited for until `ready` (a panic if it exits).
    pub(super) fn started(
        b: &Backends,
        name: &str,
        listen: SocketAddr,
        admin: SocketAddr,
        log: PathBuf,
        child: Child,
        ready: impl Fn(&Member) -> bool,
    ) -> Member {
        b.pids
            .lock()
            .expect("test step")
            .insert(child.id(), name.to_string());
        let mut m = Member {
            name: name.to_string(),
            listen,
            admin,
            log,
            child: Some(child),
        };
        wait_for(
            &format!("{name}'s admin API"),
            Duration::from_secs(20),
            || {
                if let Some(Ok(Some(exit))) = m.child.as_mut().map(Child::try_wait) {
                    panic!("{name} exited ({exit})");
                }
                ready(&m)
            },
        );
        m
    }

    pub(super) fn fleet(&self) -> Option<Value> {
        let (s, body) = http_get(self.admin, "/api/fleet")?;
        (s == 200).then(|| serde_json::from_str(&body).ok())?
    }

    pub(super) fn state(&self) -> String {
        self.fleet()
            .and_then(|v| v["state"].as_str().map(str::to_string))
            .unwrap_or_default()
    }

    pub(super) fn members(&self) -> Vec<String> {
        self.fleet()
            .and_then(|v| serde_json::from_value(v["members"].clone()).ok())
            .unwrap_or_default()
    }

    /// Target address -> its owners, as this member computes them.
    pub(super) fn owners(&self) -> HashMap<String, Vec<String>> {
        let v = self.fleet().unwrap_or_default();
        v["targets"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|t| {
                let id = t["id"].as_str().unwrap_or("");
                // http-127.0.0.1:PORT-crc
                let addr = id.split('-').nth(1).unwrap_or("").to_string();
                let owners = serde_json::from_value(t["owners"].clone()).unwrap_or_default();
                (addr, owners)
            })
            .collect()
    }

    /// Peer `addr`'s state in upstream u (`eligible`, `probe_down`, ...).
    pub(super) fn peer_state(&self, addr: SocketAddr) -> String {
        let Some((200, body)) = http_get(self.admin, "/api/upstreams/u") else {
            return String::new();
        };
        let v: Value = serde_json::from_str(&body).unwrap_or_default();
        v["peers"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["address"] == addr.to_string())
            .and_then(|p| p["state"].as_str().map(str::to_string))
            .unwrap_or_default()
    }

    /// Peer `addr` of upstream u as the admin API shows it.
    pub(super) fn peer(&self, addr: SocketAddr) -> Value {
        let Some((200, body)) = http_get(self.admin, "/api/upstreams/u") else {
            return Value::Null;
        };
        let v: Value = serde_json::from_str(&body).unwrap_or_default();
        v["peers"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["address"] == addr.to_string())
            .cloned()
            .unwrap_or_default()
    }

    pub(super) fn explain(&self, addr: SocketAddr) -> String {
        http_get(self.admin, &format!("/api/explain?upstream=u&peer={addr}"))
            .map(|(_, b)| b)
            .unwrap_or_default()
    }

    pub(super) fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill(); // SIGKILL: no lease revoke, the TTL must run out
            let _ = c.wait();
        }
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            eprintln!("--- {} log ---\n{log}", self.name);
        }
    }
}

pub(super) fn fleet_of(
    dir: &Path,
    fleet: &str,
    etcd: &str,
    replicas: usize,
    b: &Backends,
) -> Vec<Member> {
    let members: Vec<Member> = (1..=3)
        .map(|i| Member::start(dir, &format!("{fleet}-m{i}"), fleet, etcd, replicas, b))
        .collect();
    settle(&members, 3);
    members
}

/// Wait until every member is joined and sees `n` members.
pub(super) fn settle(members: &[Member], n: usize) {
    wait_for(
        "every member to join and see the others",
        Duration::from_secs(30),
        || {
            members
                .iter()
                .filter(|m| m.child.is_some())
                .all(|m| m.state() == "joined" && m.members().len() == n)
        },
    );
}

// === helpers ===

/// GET `path`: (status, body).
pub(super) fn http_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let status = out.get(9..12)?.parse().ok()?;
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_string())?;
    Some((status, body))
}

pub(super) fn wait_for(what: &str, bound: Duration, mut cond: impl FnMut() -> bool) {
    let until = Instant::now() + bound;
    while !cond() {
        assert!(
            Instant::now() < until,
            "timed out ({bound:?}) waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Wait until every backend has seen at least `n` probes since the last clear.
pub(super) fn probed_at_least(b: &Backends, n: usize, bound: Duration) {
    wait_for(&format!("{n} probes at every backend"), bound, || {
        (0..b.addrs.len()).all(|i| b.probers(i).len() >= n)
    });
}

pub(super) fn distinct(v: &[String]) -> BTreeSet<String> {
    v.iter().cloned().collect()
}

/// A directory for etcd's data: in memory (/dev/shm) where there is one, so
/// that its fsyncs do not wait on a disk the parallel tests keep busy (a
/// slow etcd is degraded mode, which the tests of sharding do not want).
fn data_dir() -> tempfile::TempDir {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(d) = tempfile::tempdir_in(shm) {
            return d;
        }
    }
    tempfile::tempdir().expect("test step")
}
