//! Fleet mode with a real etcd (`/usr/bin/etcd`, started here on 127.0.0.1
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

use tokio::time::Instant;

use serde_json::Value;

const INTERVAL_MS: u64 = 300;
const ETCD: &str = "/usr/bin/etcd";

// === etcd ===

/// One etcd member on 127.0.0.1, stopped on drop.
struct Etcd {
    dir: tempfile::TempDir,
    client: SocketAddr,
    peer: SocketAddr,
    child: Option<Child>,
}

impl Etcd {
    fn start() -> Self {
        let mut e = Etcd {
            dir: tempfile::tempdir().expect("test step"),
            client: free_port(),
            peer: free_port(),
            child: None,
        };
        e.restart();
        e
    }

    fn url(&self) -> String {
        format!("http://{}", self.client)
    }

    /// (Re)start on the same ports and data dir.
    fn restart(&mut self) {
        let client = self.url();
        let peer = format!("http://{}", self.peer);
        let log = std::fs::File::create(self.dir.path().join("etcd.log")).expect("test step");
        let child = Command::new(ETCD)
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
        wait_for("etcd to be healthy", Duration::from_secs(20), || {
            http_get(addr, "/health").is_some_and(|(s, b)| s == 200 && b.contains("true"))
        });
    }

    /// Send a signal to etcd (`STOP` freezes it: the slow etcd case).
    fn signal(&self, sig: &str) {
        let pid = self.child.as_ref().map(Child::id).expect("etcd running");
        let ok = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(pid.to_string())
            .status()
            .expect("kill");
        assert!(ok.success(), "kill -{sig} {pid}");
    }

    fn stop(&mut self) {
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

// === backends ===

/// Backends that answer `GET /health` (probes) and anything else
/// (traffic), recording which registered process sent each probe.
struct Backends {
    addrs: Vec<SocketAddr>,
    /// Per backend: the member names whose probes it saw, in order.
    probes: Vec<Arc<Mutex<Vec<String>>>>,
    /// Per backend: traffic requests.
    traffic: Vec<Arc<AtomicUsize>>,
    /// Per backend: answer 500 to everything.
    failing: Vec<Arc<AtomicBool>>,
    /// Per backend: close traffic connections unanswered (probes pass).
    broken: Vec<Arc<AtomicBool>>,
    /// pid -> member name, for the /proc look-up.
    pids: Arc<Mutex<HashMap<u32, String>>>,
}

impl Backends {
    fn start(n: usize) -> Self {
        let pids: Arc<Mutex<HashMap<u32, String>>> = Arc::default();
        let mut b = Backends {
            addrs: Vec::new(),
            probes: Vec::new(),
            traffic: Vec::new(),
            failing: Vec::new(),
            broken: Vec::new(),
            pids: pids.clone(),
        };
        for _ in 0..n {
            let l = TcpListener::bind("127.0.0.1:0").expect("test step");
            let addr = l.local_addr().expect("test step");
            let probes: Arc<Mutex<Vec<String>>> = Arc::default();
            let traffic = Arc::new(AtomicUsize::new(0));
            let failing = Arc::new(AtomicBool::new(false));
            let broken = Arc::new(AtomicBool::new(false));
            let (p, t, f, pids) = (
                probes.clone(),
                traffic.clone(),
                (failing.clone(), broken.clone()),
                pids.clone(),
            );
            std::thread::spawn(move || {
                for s in l.incoming() {
                    let Ok(s) = s else { continue };
                    let (p, t, f, pids) = (p.clone(), t.clone(), f.clone(), pids.clone());
                    std::thread::spawn(move || serve_one(s, addr, &p, &t, &f, &pids));
                }
            });
            b.addrs.push(addr);
            b.probes.push(probes);
            b.traffic.push(traffic);
            b.failing.push(failing);
            b.broken.push(broken);
        }
        b
    }

    fn clear_probes(&self) {
        for p in &self.probes {
            p.lock().expect("test step").clear();
        }
    }

    /// Who probed backend `i` since the last clear.
    fn probers(&self, i: usize) -> Vec<String> {
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
struct Member {
    name: String,
    listen: SocketAddr,
    admin: SocketAddr,
    log: PathBuf,
    child: Option<Child>,
}

/// How a member runs.
struct How {
    replicas: usize,
    interval_ms: u64,
    share_passive: bool,
    /// Parameters of every `server` line.
    server_params: &'static str,
}

impl Default for How {
    fn default() -> Self {
        How {
            replicas: 1,
            interval_ms: INTERVAL_MS,
            share_passive: false,
            server_params: "",
        }
    }
}

impl Member {
    fn start(
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
    fn start_with(
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
        let conf = format!(
            "events {{}} http {{ upstream u {{ {servers} \
             check interval={interval_ms} rise=1 fall=2 timeout={timeout_ms} type=http; \
             check_http_send \"GET /health HTTP/1.0\\r\\n\\r\\n\"; }} \
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
        }
        let child = cmd
            .env_remove("VIGIL_ADMIN_TOKEN")
            .env("VIGIL_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("test step"))
            .spawn()
            .expect("test step");
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
                if etcd.is_empty() {
                    http_get(m.admin, "/api/status").is_some()
                } else {
                    m.fleet().is_some()
                }
            },
        );
        m
    }

    fn fleet(&self) -> Option<Value> {
        let (s, body) = http_get(self.admin, "/api/fleet")?;
        (s == 200).then(|| serde_json::from_str(&body).ok())?
    }

    fn state(&self) -> String {
        self.fleet()
            .and_then(|v| v["state"].as_str().map(str::to_string))
            .unwrap_or_default()
    }

    fn members(&self) -> Vec<String> {
        self.fleet()
            .and_then(|v| serde_json::from_value(v["members"].clone()).ok())
            .unwrap_or_default()
    }

    /// Target address -> its owners, as this member computes them.
    fn owners(&self) -> HashMap<String, Vec<String>> {
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
    fn peer_state(&self, addr: SocketAddr) -> String {
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

    fn explain(&self, addr: SocketAddr) -> String {
        http_get(self.admin, &format!("/api/explain?upstream=u&peer={addr}"))
            .map(|(_, b)| b)
            .unwrap_or_default()
    }

    fn kill(&mut self) {
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

fn fleet_of(dir: &Path, fleet: &str, etcd: &str, replicas: usize, b: &Backends) -> Vec<Member> {
    let members: Vec<Member> = (1..=3)
        .map(|i| Member::start(dir, &format!("{fleet}-m{i}"), fleet, etcd, replicas, b))
        .collect();
    settle(&members, 3);
    members
}

/// Wait until every member is joined and sees `n` members.
fn settle(members: &[Member], n: usize) {
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

fn free_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .expect("test step")
        .local_addr()
        .expect("test step")
}

/// GET `path`: (status, body).
fn http_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let status = out.get(9..12)?.parse().ok()?;
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_string())?;
    Some((status, body))
}

fn wait_for(what: &str, bound: Duration, mut cond: impl FnMut() -> bool) {
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
fn probed_at_least(b: &Backends, n: usize, bound: Duration) {
    wait_for(&format!("{n} probes at every backend"), bound, || {
        (0..b.addrs.len()).all(|i| b.probers(i).len() >= n)
    });
}

fn distinct(v: &[String]) -> BTreeSet<String> {
    v.iter().cloned().collect()
}

// === the scenarios ===

#[test]
fn with_three_members_and_30_targets_each_target_is_probed_by_exactly_r_members() {
    let dir = tempfile::tempdir().expect("test step");
    let etcd = Etcd::start();
    let b = Backends::start(30);
    // Two fleets on one etcd (their keys are apart by name): R=1 and R=2.
    let one = fleet_of(dir.path(), "r1", &etcd.url(), 1, &b);
    let two = fleet_of(dir.path(), "r2", &etcd.url(), 2, &b);
    b.clear_probes();
    probed_at_least(&b, 9, Duration::from_secs(30));
    let owners1 = one[0].owners();
    let owners2 = two[0].owners();
    let mut load = HashMap::<String, usize>::new();
    for (i, addr) in b.addrs.iter().enumerate() {
        let seen = distinct(&b.probers(i));
        assert!(
            !seen.contains("?"),
            "{addr}: a probe from an unknown process: {seen:?}"
        );
        let r1: BTreeSet<String> = seen
            .iter()
            .filter(|m| m.starts_with("r1-"))
            .cloned()
            .collect();
        let r2: BTreeSet<String> = seen
            .iter()
            .filter(|m| m.starts_with("r2-"))
            .cloned()
            .collect();
        assert_eq!(r1.len(), 1, "{addr}: fleet r1 (R=1) probers {r1:?}");
        assert_eq!(r2.len(), 2, "{addr}: fleet r2 (R=2) probers {r2:?}");
        assert_eq!(
            r1,
            distinct(&owners1[&addr.to_string()]),
            "{addr}: r1's prober is its owner"
        );
        assert_eq!(
            r2,
            distinct(&owners2[&addr.to_string()]),
            "{addr}: r2's probers are its owners"
        );
        for m in r1 {
            *load.entry(m).or_default() += 1;
        }
    }
    // Every member of r1 takes a share (rendezvous spreads 30 over 3).
    assert_eq!(load.len(), 3, "targets per member in r1: {load:?}");
    eprintln!("targets per member (R=1): {load:?}");
}

#[test]
fn a_failing_backend_leaves_every_members_rotation_after_the_deciding_probe() {
    let dir = tempfile::tempdir().expect("test step");
    let etcd = Etcd::start();
    let b = Backends::start(3);
    let members = fleet_of(dir.path(), "f", &etcd.url(), 1, &b);
    let bad = b.addrs[1];
    let owner = members[0].owners()[&bad.to_string()][0].clone();
    wait_for(
        "every member to route to every peer",
        Duration::from_secs(10),
        || {
            members
                .iter()
                .all(|m| b.addrs.iter().all(|a| m.peer_state(*a) == "eligible"))
        },
    );
    b.failing[1].store(true, Ordering::SeqCst);
    let failed_at = Instant::now();
    // fall=2: the owner's second failing probe decides; the others follow
    // from its published results.
    wait_for(
        "every member to take the failing peer out",
        Duration::from_secs(10),
        || members.iter().all(|m| m.peer_state(bad) == "probe_down"),
    );
    eprintln!(
        "all three members had {bad} down {:?} after it started failing (interval {INTERVAL_MS} ms, fall=2)",
        failed_at.elapsed()
    );
    let before = b.traffic[1].load(Ordering::SeqCst);
    for m in &members {
        for _ in 0..12 {
            let (status, _) = http_get(m.listen, "/").expect("answer");
            assert_eq!(status, 200, "{}: served by a healthy backend", m.name);
        }
    }
    assert_eq!(
        b.traffic[1].load(Ordering::SeqCst),
        before,
        "no member sent it traffic"
    );
    for m in members.iter().filter(|m| m.name != owner) {
        let text = m.explain(bad);
        assert!(
            text.contains(&format!("probed by member {owner}")),
            "{}: explain names the member that probed: {text}",
            m.name
        );
    }
}

#[test]
fn a_killed_members_targets_are_probed_again_within_ttl_and_interval() {
    let dir = tempfile::tempdir().expect("test step");
    let etcd = Etcd::start();
    let b = Backends::start(12);
    let mut members = fleet_of(dir.path(), "k", &etcd.url(), 1, &b);
    let victim = members[2].name.clone();
    let owners = members[0].owners();
    let orphans: Vec<usize> = (0..b.addrs.len())
        .filter(|i| owners[&b.addrs[*i].to_string()] == [victim.clone()])
        .collect();
    assert!(
        !orphans.is_empty(),
        "{victim} owns some of the 12 targets: {owners:?}"
    );
    members[2].kill();
    let killed_at = Instant::now();
    b.clear_probes();
    // TTL 2s + interval 0.3s, plus etcd's lease check: bounded at 15s.
    wait_for(
        "the orphaned targets to be probed by a survivor",
        Duration::from_secs(15),
        || {
            orphans
                .iter()
                .all(|i| b.probers(*i).iter().any(|m| m != &victim && m != "?"))
        },
    );
    eprintln!(
        "{} orphaned targets probed again {:?} after {victim} was killed (TTL 2s, interval {INTERVAL_MS} ms)",
        orphans.len(),
        killed_at.elapsed()
    );
    settle(&members, 2);
    assert!(members[0].members().iter().all(|m| *m != victim));
    // A member stopped with SIGTERM leaves: it revokes its lease.
    let pid = members[1].child.as_ref().map(Child::id).expect("running");
    let status = Command::new("kill")
        .arg(pid.to_string())
        .status()
        .expect("kill");
    assert!(status.success());
    if let Some(mut c) = members[1].child.take() {
        let _ = c.wait();
    }
    let log = std::fs::read_to_string(&members[1].log).unwrap_or_default();
    assert!(log.contains("fleet: left (lease revoked"), "{log}");
    settle(&members, 1);
    // The last member probes every target, once an interval.
    b.clear_probes();
    probed_at_least(&b, 4, Duration::from_secs(20));
    for i in 0..b.addrs.len() {
        let seen = distinct(&b.probers(i));
        assert_eq!(seen.len(), 1, "{}: probers {seen:?}", b.addrs[i]);
    }
}

#[test]
fn with_etcd_stopped_every_member_probes_on_its_own_and_serves_then_rejoins() {
    let dir = tempfile::tempdir().expect("test step");
    let mut etcd = Etcd::start();
    let b = Backends::start(6);
    let members = fleet_of(dir.path(), "d", &etcd.url(), 1, &b);
    etcd.stop();
    wait_for(
        "every member to notice etcd is gone",
        Duration::from_secs(15),
        || members.iter().all(|m| m.state() == "degraded"),
    );
    b.clear_probes();
    wait_for(
        "every member to probe every target itself",
        Duration::from_secs(15),
        || (0..b.addrs.len()).all(|i| distinct(&b.probers(i)).len() == 3),
    );
    for m in &members {
        for _ in 0..6 {
            let (status, _) = http_get(m.listen, "/").expect("answer");
            assert_eq!(status, 200, "{} serves without etcd", m.name);
        }
        let log = std::fs::read_to_string(&m.log).unwrap_or_default();
        assert!(
            log.contains("etcd unreachable or slow; probing every target here"),
            "{}: {log}",
            m.name
        );
    }
    etcd.restart();
    settle(&members, 3);
    for m in &members {
        let v = m.fleet().expect("test step");
        let history: Vec<&str> = v["history"]
            .as_array()
            .expect("test step")
            .iter()
            .filter_map(|h| h["state"].as_str())
            .collect();
        assert_eq!(history, ["joined", "degraded", "joined"], "{}", m.name);
    }
    b.clear_probes();
    probed_at_least(&b, 4, Duration::from_secs(20));
    for i in 0..b.addrs.len() {
        let seen = distinct(&b.probers(i));
        assert_eq!(
            seen.len(),
            1,
            "{}: sharded again after the rejoin: {seen:?}",
            b.addrs[i]
        );
    }
}

/// The probe load at the backends with 1, 3 and 10 members, in a fleet
/// (R=1) and as plain instances: the figures of docs/fleet.md. A
/// measurement, not a test (no assertion on the figures); run it with
/// `cargo test -p vigil --features fleet --test it fleet::probe_load -- --ignored --nocapture`.
#[test]
#[ignore = "a measurement for docs/fleet.md, ~1 min"]
fn probe_load_at_1_3_and_10_members() {
    let dir = tempfile::tempdir().expect("test step");
    let etcd = Etcd::start();
    let b = Backends::start(30);
    // 1 s, not the tests' 300 ms: ten processes on two cores must not
    // saturate the machine, or the figures measure the CPU, not the fleet.
    let interval_ms = 1000;
    let window = Duration::from_secs(10);
    for n in [1, 3, 10] {
        for in_fleet in [false, true] {
            let fleet = format!("load{n}{}", if in_fleet { "f" } else { "p" });
            let url = if in_fleet { etcd.url() } else { String::new() };
            let members: Vec<Member> = (1..=n)
                .map(|i| {
                    let how = How {
                        interval_ms,
                        ..How::default()
                    };
                    Member::start_with(dir.path(), &format!("{fleet}-m{i}"), &fleet, &url, &b, &how)
                })
                .collect();
            if in_fleet {
                settle(&members, n);
            } else {
                // Past every start round.
                std::thread::sleep(Duration::from_millis(2 * interval_ms));
            }
            b.clear_probes();
            let start = Instant::now();
            std::thread::sleep(window);
            let total: usize = (0..b.addrs.len()).map(|i| b.probers(i).len()).sum();
            let unknown: usize = (0..b.addrs.len())
                .map(|i| b.probers(i).iter().filter(|m| *m == "?").count())
                .sum();
            let per_s = total as f64 / start.elapsed().as_secs_f64();
            let max_probers = (0..b.addrs.len())
                .map(|i| distinct(&b.probers(i)).len())
                .max()
                .unwrap_or(0);
            eprintln!(
                "members={n:>2} {:<6} 30 targets, interval {interval_ms} ms: {per_s:7.1} probes/s at the backends ({:.2} per target per interval), at most {max_probers} prober(s) per target, {unknown} probe(s) of no known member",
                if in_fleet { "fleet" } else { "plain" },
                per_s / 30.0 * interval_ms as f64 / 1000.0,
            );
            drop(members);
        }
    }
}

#[test]
fn with_share_passive_a_peer_one_member_ejects_is_probed_by_the_others_not_ejected() {
    let dir = tempfile::tempdir().expect("test step");
    let etcd = Etcd::start();
    let b = Backends::start(3);
    // A long interval: a probe a member does not own is a probe asked for.
    let how = How {
        interval_ms: 60_000,
        share_passive: true,
        server_params: "max_fails=1 fail_timeout=30s",
        ..How::default()
    };
    let members: Vec<Member> = (1..=3)
        .map(|i| Member::start_with(dir.path(), &format!("p-m{i}"), "p", &etcd.url(), &b, &how))
        .collect();
    settle(&members, 3);
    let bad = b.addrs[0];
    let owner = members[0].owners()[&bad.to_string()][0].clone();
    let mut others = members.iter().filter(|m| m.name != owner);
    let (ejector, bystander) = (
        others.next().expect("test step"),
        others.next().expect("test step"),
    );
    wait_for(
        "the start round to bring every peer up",
        Duration::from_secs(10),
        || {
            members
                .iter()
                .all(|m| b.addrs.iter().all(|a| m.peer_state(*a) == "eligible"))
        },
    );
    b.clear_probes();
    b.broken[0].store(true, Ordering::SeqCst);
    // The ejector's traffic meets the broken peer (round robin over 3).
    wait_for(
        "the ejector to exclude the peer",
        Duration::from_secs(10),
        || {
            let _ = http_get(ejector.listen, "/");
            ejector.peer_state(bad) == "excluded"
        },
    );
    wait_for(
        "the bystander to probe the ejected peer at once",
        Duration::from_secs(10),
        || b.probers(0).contains(&bystander.name),
    );
    let log = std::fs::read_to_string(&bystander.log).unwrap_or_default();
    assert!(
        log.contains(&format!(
            "fleet: member {} ejected upstream u server {bad} on its traffic; probing it here now",
            ejector.name
        )),
        "{log}"
    );
    // Its probe passed (only traffic is broken): the others keep the peer.
    let owner = members.iter().find(|m| m.name == owner).expect("test step");
    for m in [bystander, owner] {
        assert_eq!(
            m.peer_state(bad),
            "eligible",
            "{} did not eject it blindly",
            m.name
        );
    }
}

#[test]
fn a_frozen_etcd_is_a_slow_one_every_member_probes_on_its_own_until_it_answers() {
    let dir = tempfile::tempdir().expect("test step");
    let etcd = Etcd::start();
    let b = Backends::start(6);
    let members = fleet_of(dir.path(), "s", &etcd.url(), 1, &b);
    // SIGSTOP: connections stay open, nothing answers (no error to see).
    etcd.signal("STOP");
    wait_for(
        "every member to call etcd slow",
        Duration::from_secs(15),
        || {
            members.iter().all(|m| {
                m.fleet().is_some_and(|v| {
                    v["state"] == "degraded"
                        && v["reason"]
                            .as_str()
                            .is_some_and(|r| r.contains("no answer within"))
                })
            })
        },
    );
    b.clear_probes();
    wait_for(
        "every member to probe every target itself",
        Duration::from_secs(15),
        || (0..b.addrs.len()).all(|i| distinct(&b.probers(i)).len() == 3),
    );
    etcd.signal("CONT");
    settle(&members, 3);
}
