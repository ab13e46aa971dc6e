//! nginx's process habits, side by side: the same conf under stock nginx
//! (its master and one worker, in the foreground) and under the `vigil`
//! binary, the same signals sent to each, and what the clients, the
//! backend and the log files saw compared.
//!
//! - SIGQUIT: graceful stop. The listener closes, an idle keep-alive
//!   connection is closed, the requests in flight finish whole, then the
//!   process exits 0 (and `worker_shutdown_timeout` bounds it);
//! - SIGTERM: fast stop, the requests in flight are cut;
//! - SIGUSR1: the access log is reopened (logrotate's `mv` then USR1):
//!   no line lost, none written to the moved file after the new one began;
//! - an address another process listens on: the start fails, naming it.
//!
//! The backend holds each response half-sent until the test opens its gate,
//! so that "in flight" is a state the test sets, not a race it hopes to win.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use vigil_testkit::{free_addr, nginx_bin};

/// The body every response of the gated backend carries: a first half
/// sent at once, the second when the gate opens.
const HALF: usize = 4096;

/// A backend whose responses stop half-way until [`Gated::open`].
struct Gated {
    addr: SocketAddr,
    /// Requests whose header and first half went out.
    started: Arc<AtomicUsize>,
    gate: Arc<(Mutex<bool>, Condvar)>,
}

impl Gated {
    fn start() -> Self {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr");
        let started = Arc::new(AtomicUsize::new(0));
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let (s, g) = (started.clone(), gate.clone());
        std::thread::spawn(move || {
            for conn in l.incoming() {
                let Ok(mut conn) = conn else { continue };
                let (s, g) = (s.clone(), g.clone());
                std::thread::spawn(move || {
                    if read_head(&mut conn).is_none() {
                        return;
                    }
                    let half = vec![b'a'; HALF];
                    let head = format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        2 * HALF
                    );
                    if conn.write_all(head.as_bytes()).is_err() || conn.write_all(&half).is_err() {
                        return;
                    }
                    let _ = conn.flush();
                    s.fetch_add(1, Ordering::SeqCst);
                    let (open, cv) = &*g;
                    let mut o = open.lock().expect("gate");
                    while !*o {
                        o = cv.wait(o).expect("gate");
                    }
                    drop(o);
                    let _ = conn.write_all(&vec![b'b'; HALF]);
                });
            }
        });
        Self {
            addr,
            started,
            gate,
        }
    }

    fn open(&self) {
        let (open, cv) = &*self.gate;
        *open.lock().expect("gate") = true;
        cv.notify_all();
    }
}

impl Drop for Gated {
    fn drop(&mut self) {
        self.open();
    }
}

/// A backend answering every request at once with a short body.
fn quick_backend() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(mut conn) = conn else { continue };
            std::thread::spawn(move || {
                while read_head(&mut conn).is_some() {
                    if conn
                        .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                        .is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// Read one request head (a request without a body); None at EOF.
fn read_head(conn: &mut TcpStream) -> Option<Vec<u8>> {
    let mut got = Vec::new();
    let mut b = [0u8; 1];
    while !got.ends_with(b"\r\n\r\n") {
        match conn.read(&mut b) {
            Ok(0) | Err(_) => return None,
            Ok(_) => got.push(b[0]),
        }
    }
    Some(got)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Which {
    Nginx,
    Vigil,
}

/// nginx or vigil, in the foreground on one conf, in a directory of its own.
struct Proc {
    which: Which,
    addr: SocketAddr,
    dir: tempfile::TempDir,
    child: Child,
}

impl Proc {
    /// `which` on `http_body` (the inside of `http {}`: `{LISTEN}` becomes
    /// its address, `{DIR}` its directory) with `main` in the main context.
    fn start(which: Which, main: &str, http_body: &str) -> Self {
        let addr = free_addr();
        let (proc, out) = Self::try_start(which, addr, main, http_body);
        let mut proc = proc;
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(addr).is_err() {
            if let Ok(Some(status)) = proc.child.try_wait() {
                panic!("{which:?} exited {status} at start: {}", out.read());
            }
            assert!(
                Instant::now() < deadline,
                "{which:?} did not listen on {addr}: {}",
                out.read()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        proc
    }

    /// Start `which` listening on `addr`; do not wait for it.
    fn try_start(which: Which, addr: SocketAddr, main: &str, http_body: &str) -> (Self, Output) {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path().display().to_string();
        for sub in ["body", "proxy", "fastcgi", "uwsgi", "scgi"] {
            std::fs::create_dir_all(dir.path().join(sub)).expect("mkdir");
        }
        let http_body = http_body
            .replace("{LISTEN}", &addr.to_string())
            .replace("{DIR}", &d);
        let conf = dir.path().join("nginx.conf");
        std::fs::write(
            &conf,
            format!(
                "worker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/error.log info;\n{main}\n\
                 events {{ worker_connections 256; }}\n\
                 http {{\n    client_body_temp_path {d}/body;\n    proxy_temp_path {d}/proxy;\n\
                 \x20   fastcgi_temp_path {d}/fastcgi;\n    uwsgi_temp_path {d}/uwsgi;\n    scgi_temp_path {d}/scgi;\n\
                 {http_body}\n}}\n"
            ),
        )
        .expect("write nginx.conf");
        let stderr = dir.path().join("stderr");
        let err = std::fs::File::create(&stderr).expect("stderr file");
        let mut cmd = match which {
            Which::Nginx => {
                let mut c = Command::new(nginx_bin());
                c.arg("-p")
                    .arg(dir.path())
                    .arg("-c")
                    .arg(&conf)
                    .args(["-g", "daemon off;"]);
                c
            }
            Which::Vigil => {
                let mut c = Command::new(env!("CARGO_BIN_EXE_vigil"));
                c.arg("serve")
                    .arg("--nginx-conf")
                    .arg(&conf)
                    .arg("--admin-listen")
                    .arg(free_addr().to_string())
                    .args(["--threads", "2"]);
                c
            }
        };
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .expect("start");
        let out = Output(stderr);
        (
            Self {
                which,
                addr,
                dir,
                child,
            },
            out,
        )
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn signal(&self, sig: &str) {
        assert!(self.send(sig), "kill -{sig}");
    }

    /// Send `sig`; whether it was delivered.
    fn send(&self, sig: &str) -> bool {
        Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.child.id().to_string())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// Wait (bounded) for the process to exit.
    fn exited(&mut self, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(s) = self.child.try_wait().expect("wait") {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "{:?} did not exit within {within:?}",
                self.which
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether it is still running.
    fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.running() {
            // nginx's workers outlive a killed master: a fast stop first,
            // as `nginx -s stop` (vigil stops at once on it too).
            self.send("TERM");
            let until = Instant::now() + Duration::from_secs(5);
            while self.running() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A process's standard error, written to a file.
struct Output(PathBuf);

impl Output {
    fn read(&self) -> String {
        std::fs::read_to_string(&self.0).unwrap_or_default()
    }
}

/// Wait (bounded) for `cond`.
fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(15);
    while !cond() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One request in flight: its connection and what came back so far, read
/// on a thread of its own until the connection ends.
struct InFlight {
    done: std::thread::JoinHandle<Vec<u8>>,
}

impl InFlight {
    fn send(addr: SocketAddr, path: &str) -> Self {
        let mut s = TcpStream::connect(addr).expect("connect");
        write!(s, "GET {path} HTTP/1.1\r\nHost: t\r\n\r\n").expect("send");
        let done = std::thread::spawn(move || {
            let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
            let mut got = Vec::new();
            let _ = s.read_to_end(&mut got);
            got
        });
        Self { done }
    }

    /// What came: a 200 status line, and all of the body or a cut part
    /// (how much of a cut body came depends on each proxy's buffers).
    fn seen(self) -> Response {
        let got = self.done.join().expect("reader");
        let body = got
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .map_or(0, |i| got.len() - i - 4);
        if !got.starts_with(b"HTTP/1.1 200") {
            return Response::Other;
        }
        match body {
            b if b == 2 * HALF => Response::Whole,
            0 => Response::Other,
            _ => Response::Cut,
        }
    }
}

/// What a client saw of one response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Response {
    /// The status line and all of the body.
    Whole,
    /// The status line and part of the body: the connection closed.
    Cut,
    /// Anything else.
    Other,
}

/// A keep-alive connection that made one request and now waits.
fn idle_connection(addr: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).expect("connect");
    write!(s, "GET /idle HTTP/1.1\r\nHost: t\r\n\r\n").expect("send");
    s.set_read_timeout(Some(Duration::from_secs(15)))
        .expect("timeout");
    let mut r = BufReader::new(s.try_clone().expect("clone"));
    let mut len = 0usize;
    loop {
        let mut line = String::new();
        r.read_line(&mut line).expect("head");
        if line == "\r\n" {
            break;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            len = v.trim().parse().expect("length");
        }
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).expect("body");
    s
}

/// Whether the server closed `s` (EOF or reset), waiting at most 15 s.
fn closed_by_server(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 1];
    match s.read(&mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    }
}

fn refused(addr: SocketAddr) -> bool {
    TcpStream::connect_timeout(&addr, Duration::from_secs(2)).is_err()
}

/// Two locations: `/` to the gated backend, `/idle` to a quick one.
fn gated_conf(gated: SocketAddr, quick: SocketAddr) -> String {
    format!(
        "access_log off;\n\
         upstream gated {{ server {gated}; }}\n\
         upstream quick {{ server {quick}; keepalive 4; }}\n\
         server {{ listen {{LISTEN}}; keepalive_timeout 60s;\n\
           location / {{ proxy_pass http://gated; proxy_read_timeout 30s; }}\n\
           location /idle {{ proxy_pass http://quick; proxy_http_version 1.1; proxy_set_header Connection \"\"; }}\n\
           location /n/ {{ proxy_pass http://quick; }}\n\
         }}"
    )
}

/// What a client saw of a graceful stop.
#[derive(Debug, PartialEq, Eq)]
struct GracefulSeen {
    idle_closed: bool,
    refused_while_draining: bool,
    running_while_draining: bool,
    responses: Vec<Response>,
    exit_ok: bool,
    /// Under a load of new connections through the stop: responses cut.
    load_cut: usize,
}

fn graceful_stop(which: Which) -> GracefulSeen {
    let gated = Gated::start();
    let quick = quick_backend();
    let mut p = Proc::start(which, "", &gated_conf(gated.addr, quick));
    let mut idle = idle_connection(p.addr);
    let load = Load::start(p.addr);
    wait_for("load before the stop", || load.done() >= 20);
    let flights: Vec<InFlight> = (0..4)
        .map(|i| InFlight::send(p.addr, &format!("/{i}")))
        .collect();
    wait_for("four responses half-sent", || {
        gated.started.load(Ordering::SeqCst) == 4
    });
    p.signal("QUIT");
    // Idle first: the keep-alive connection is closed while four are in flight.
    let idle_closed = closed_by_server(&mut idle);
    let mut refused_while_draining = false;
    let until = Instant::now() + Duration::from_secs(15);
    while Instant::now() < until {
        if refused(p.addr) {
            refused_while_draining = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let running_while_draining = p.running();
    gated.open();
    let responses = flights.into_iter().map(InFlight::seen).collect();
    let exit_ok = p.exited(Duration::from_secs(15)).success();
    let load_cut = load.cut();
    load.finish();
    GracefulSeen {
        idle_closed,
        refused_while_draining,
        running_while_draining,
        responses,
        exit_ok,
        load_cut,
    }
}

#[test]
fn sigquit_closes_idle_connections_and_lets_requests_in_flight_finish_as_nginx() {
    let nginx = graceful_stop(Which::Nginx);
    let vigil = graceful_stop(Which::Vigil);
    assert_eq!(
        nginx,
        GracefulSeen {
            idle_closed: true,
            refused_while_draining: true,
            running_while_draining: true,
            responses: vec![Response::Whole; 4],
            exit_ok: true,
            load_cut: 0,
        },
        "nginx"
    );
    assert_eq!(vigil, nginx, "vigil as nginx");
}

/// What clients saw of a stop that did not wait: SIGTERM, or SIGQUIT once
/// `worker_shutdown_timeout` passed.
fn cut_stop(which: Which, main: &str, sig: &str) -> (Vec<Response>, bool) {
    let gated = Gated::start();
    let quick = quick_backend();
    let mut p = Proc::start(which, main, &gated_conf(gated.addr, quick));
    let flights: Vec<InFlight> = (0..3)
        .map(|i| InFlight::send(p.addr, &format!("/{i}")))
        .collect();
    wait_for("three responses half-sent", || {
        gated.started.load(Ordering::SeqCst) == 3
    });
    p.signal(sig);
    // The gate stays shut: only a stop that cuts the requests ends them.
    let status = p.exited(Duration::from_secs(15));
    let responses = flights.into_iter().map(InFlight::seen).collect();
    (responses, status.success())
}

#[test]
fn sigterm_stops_at_once_cutting_requests_in_flight_as_nginx() {
    let nginx = cut_stop(Which::Nginx, "", "TERM");
    let vigil = cut_stop(Which::Vigil, "", "TERM");
    assert_eq!(nginx, (vec![Response::Cut; 3], true), "nginx");
    assert_eq!(vigil, nginx, "vigil as nginx");
}

#[test]
fn worker_shutdown_timeout_bounds_a_graceful_stop_as_nginx() {
    let main = "worker_shutdown_timeout 1s;";
    let nginx = cut_stop(Which::Nginx, main, "QUIT");
    let vigil = cut_stop(Which::Vigil, main, "QUIT");
    assert_eq!(nginx, (vec![Response::Cut; 3], true), "nginx");
    assert_eq!(vigil, nginx, "vigil as nginx");
}

/// Requests sent one after another (`/n/SEQ`) until told to stop; how many
/// were answered.
struct Load {
    stop: Arc<AtomicBool>,
    done: Arc<AtomicUsize>,
    /// Responses that began and did not end whole.
    cut: Arc<AtomicUsize>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Load {
    fn start(addr: SocketAddr) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicUsize::new(0));
        let cut = Arc::new(AtomicUsize::new(0));
        let (st, d, c) = (stop.clone(), done.clone(), cut.clone());
        let thread = std::thread::spawn(move || {
            let mut seq = 0usize;
            while !st.load(Ordering::SeqCst) {
                let Ok(mut s) = TcpStream::connect(addr) else {
                    // Refused: the listener closed (a full backlog drops
                    // a SYN, it does not refuse one), and it does not
                    // come back; not a cut response.
                    break;
                };
                let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
                if write!(
                    s,
                    "GET /n/{seq} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
                )
                .is_err()
                {
                    continue;
                }
                let mut got = Vec::new();
                let _ = s.read_to_end(&mut got);
                if got.starts_with(b"HTTP/1.1 200") && got.ends_with(b"ok") {
                    seq += 1;
                    d.fetch_add(1, Ordering::SeqCst);
                } else if !got.is_empty() {
                    c.fetch_add(1, Ordering::SeqCst);
                }
            }
        });
        Self {
            stop,
            done,
            cut,
            thread: Some(thread),
        }
    }

    fn done(&self) -> usize {
        self.done.load(Ordering::SeqCst)
    }

    fn finish(mut self) -> usize {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            t.join().expect("load");
        }
        self.done()
    }

    /// Responses that were cut.
    fn cut(&self) -> usize {
        self.cut.load(Ordering::SeqCst)
    }
}

/// The sequence numbers of the requests a log file holds, in order.
fn logged(path: &Path) -> Vec<usize> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.ends_with(" 200"))
        .filter_map(|l| l.split("/n/").nth(1)?.split(' ').next()?.parse().ok())
        .collect()
}

/// logrotate's way: `mv` the log, SIGUSR1, under load; then how many
/// requests were answered and what each file holds.
fn rotate(which: Which) -> (usize, Vec<usize>, Vec<usize>) {
    let quick = quick_backend();
    let body = format!(
        "log_format seq '$request_uri $status';\n\
         upstream quick {{ server {quick}; }}\n\
         server {{ listen {{LISTEN}}; access_log {{DIR}}/access.log seq;\n\
           location / {{ proxy_pass http://quick; }}\n\
         }}"
    );
    let mut p = Proc::start(which, "", &body);
    let log = p.path("access.log");
    let moved = p.path("access.log.1");
    let load = Load::start(p.addr);
    wait_for("requests before the move", || load.done() >= 50);
    std::fs::rename(&log, &moved).expect("mv");
    let at_move = load.done();
    p.signal("USR1");
    wait_for("the log reopened", || {
        logged(&log).len() >= 20 && load.done() >= at_move + 50
    });
    let answered = load.finish();
    p.signal("QUIT");
    assert!(p.exited(Duration::from_secs(15)).success());
    (answered, logged(&moved), logged(&log))
}

#[test]
fn sigusr1_reopens_the_access_log_moved_away_as_nginx() {
    for which in [Which::Nginx, Which::Vigil] {
        let (answered, old, new) = rotate(which);
        assert_eq!(
            old.len() + new.len(),
            answered,
            "{which:?}: every answered request is logged once, in one file or the other"
        );
        let mut all = old.clone();
        all.extend(&new);
        assert_eq!(
            all,
            (0..answered).collect::<Vec<_>>(),
            "{which:?}: the moved file holds the first requests, the new one the rest (none went to the old file after the new one began)"
        );
        assert!(!new.is_empty() && !old.is_empty(), "{which:?}");
    }
}

#[test]
fn an_address_another_process_listens_on_is_refused_as_nginx() {
    let quick = quick_backend();
    let body = format!(
        "upstream quick {{ server {quick}; }}\n\
         server {{ listen {{LISTEN}}; location / {{ proxy_pass http://quick; }} }}"
    );
    for holder in [Which::Nginx, Which::Vigil] {
        let held = Proc::start(holder, "", &body);
        for which in [Which::Nginx, Which::Vigil] {
            let (mut second, out) = Proc::try_start(which, held.addr, "", &body);
            let status = second.exited(Duration::from_secs(20));
            let said = out.read();
            assert_eq!(
                status.code(),
                Some(1),
                "{which:?} on {holder:?}'s address exits 1: {said}"
            );
            assert!(
                said.contains(&held.addr.to_string()) && said.contains("Address already in use"),
                "{which:?} names the address taken: {said}"
            );
        }
    }
    // `reuseport` on both listen lines: as nginx, two processes share it.
    let shared = body.replace("listen {LISTEN};", "listen {LISTEN} reuseport;");
    let first = Proc::start(Which::Vigil, "", &shared);
    let (mut second, out) = Proc::try_start(Which::Vigil, first.addr, "", &shared);
    wait_for("the second vigil listening beside the first", || {
        assert!(second.running(), "the second vigil exited: {}", out.read());
        out.read().contains("listening")
    });
}

/// A backend that switches protocols on every request and then echoes.
fn echo_upgrade_backend() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(mut conn) = conn else { continue };
            std::thread::spawn(move || {
                if read_head(&mut conn).is_none() {
                    return;
                }
                let _ = conn.write_all(
                    b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n",
                );
                let mut b = [0u8; 1024];
                loop {
                    match conn.read(&mut b) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            if conn.write_all(&b[..n]).is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    addr
}

/// What a client saw of a tunnel across a graceful stop.
#[derive(Debug, PartialEq, Eq)]
struct TunnelSeen {
    switched: bool,
    echoed_before: bool,
    refused_while_open: bool,
    echoed_after: bool,
    running_while_open: bool,
    exit_ok: bool,
}

fn tunnel_across_quit(which: Which) -> TunnelSeen {
    let echo = echo_upgrade_backend();
    let body = format!(
        "upstream echo {{ server {echo}; }}\n\
         server {{ listen {{LISTEN}};\n\
           location / {{ proxy_pass http://echo; proxy_http_version 1.1;\n\
             proxy_set_header Upgrade $http_upgrade; proxy_set_header Connection \"upgrade\"; }}\n\
         }}"
    );
    let mut p = Proc::start(which, "", &body);
    let mut s = TcpStream::connect(p.addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    write!(
        s,
        "GET /ws HTTP/1.1\r\nHost: t\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n"
    )
    .expect("send");
    let head = read_head(&mut s).unwrap_or_default();
    let switched = head.starts_with(b"HTTP/1.1 101");
    let echo_of = |s: &mut TcpStream, word: &[u8]| {
        let mut b = vec![0u8; word.len()];
        s.write_all(word).is_ok() && s.read_exact(&mut b).is_ok() && b == word
    };
    let echoed_before = echo_of(&mut s, b"ping-1");
    p.signal("QUIT");
    let mut refused_while_open = false;
    let until = Instant::now() + Duration::from_secs(15);
    while Instant::now() < until {
        if refused(p.addr) {
            refused_while_open = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let echoed_after = echo_of(&mut s, b"ping-2");
    let running_while_open = p.running();
    let _ = s.shutdown(std::net::Shutdown::Write);
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    let exit_ok = p.exited(Duration::from_secs(15)).success();
    TunnelSeen {
        switched,
        echoed_before,
        refused_while_open,
        echoed_after,
        running_while_open,
        exit_ok,
    }
}

#[test]
fn a_tunnel_open_at_sigquit_works_until_it_ends_as_nginx() {
    let nginx = tunnel_across_quit(Which::Nginx);
    assert_eq!(
        nginx,
        TunnelSeen {
            switched: true,
            echoed_before: true,
            refused_while_open: true,
            echoed_after: true,
            running_while_open: true,
            exit_ok: true,
        },
        "nginx"
    );
    assert_eq!(tunnel_across_quit(Which::Vigil), nginx, "vigil as nginx");
}
