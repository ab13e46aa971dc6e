//! nginx's command line, side by side: the same directory, conf and
//! commands given to stock nginx and to the `vigil` binary standing in for
//! it (`vigil -p DIR -c nginx.conf ...`), and what each printed, exited
//! with, wrote and served compared.
//!
//! - `-t` on a good conf, a bad one and a missing one; `-q`; `-T`;
//! - start with `daemon on` (nginx's default): the command returns, the
//!   pid file names the server, which serves;
//! - `-s reload` after the conf changed: the new answer is served;
//! - `-s reopen` after `mv` of the logs: the access log starts again at
//!   its path, nothing more goes to the moved file;
//! - `-s quit` with a request in flight: it finishes whole, the server
//!   exits and its pid file goes;
//! - `-s reload` with no server: nginx's error and exit code.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;
use tokio::time::Instant;
use vigil_testkit::{free_addr, nginx_bin};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Which {
    Nginx,
    Vigil,
}

fn binary(which: Which) -> PathBuf {
    match which {
        Which::Nginx => nginx_bin(),
        Which::Vigil => PathBuf::from(env!("CARGO_BIN_EXE_vigil")),
    }
}

/// A prefix directory with its nginx.conf.
struct Site {
    which: Which,
    dir: tempfile::TempDir,
    addr: SocketAddr,
}

impl Site {
    /// `http_body` is the inside of `http {}` (`{LISTEN}` becomes the
    /// address); `main` goes in the main context.
    fn new(which: Which, main: &str, http_body: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let addr = free_addr();
        let site = Self { which, dir, addr };
        site.write_conf(main, http_body);
        site
    }

    fn write_conf(&self, main: &str, http_body: &str) {
        let d = self.dir.path().display().to_string();
        for sub in ["body", "proxy", "fastcgi", "uwsgi", "scgi"] {
            std::fs::create_dir_all(self.dir.path().join(sub)).expect("mkdir");
        }
        let http_body = http_body.replace("{LISTEN}", &self.addr.to_string());
        // Relative paths: against the prefix, in both.
        let text = format!(
            "pid nginx.pid;\nerror_log error.log notice;\n{main}\n\
             events {{ worker_connections 64; }}\n\
             http {{\n    client_body_temp_path {d}/body;\n    proxy_temp_path {d}/proxy;\n\
             \x20   fastcgi_temp_path {d}/fastcgi;\n    uwsgi_temp_path {d}/uwsgi;\n    scgi_temp_path {d}/scgi;\n\
             \x20   access_log access.log;\n{http_body}\n}}\n"
        );
        std::fs::write(self.path("nginx.conf"), text).expect("write nginx.conf");
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Run the binary with `-p DIR/ -c nginx.conf` and `args`; wait for it.
    fn run(&self, args: &[&str]) -> Output {
        let mut prefix = self.dir.path().as_os_str().to_owned();
        prefix.push("/");
        Command::new(binary(self.which))
            .arg("-p")
            .arg(prefix)
            .args(["-c", "nginx.conf"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run")
    }

    /// Standard error with the directory written as `DIR` and the error
    /// log's lines without their time and pid (`[emerg] MESSAGE`).
    fn stderr(&self, out: &Output) -> String {
        let text = String::from_utf8_lossy(&out.stderr)
            .replace(&self.dir.path().display().to_string(), "DIR");
        text.lines()
            .map(|l| {
                // `2026/12/07 23:06:32 [emerg] 22281#22281: MESSAGE`
                let logged = l.len() > 20 && l.as_bytes()[4] == b'/' && l.as_bytes()[19] == b' ';
                let line = match l[20.min(l.len())..].split_once(' ') {
                    Some((level, rest)) if logged => match rest.split_once(": ") {
                        Some((_, message)) => format!("{level} {message}"),
                        None => l.to_string(),
                    },
                    _ => l.to_string(),
                };
                line + "\n"
            })
            .collect()
    }

    fn pid(&self) -> Option<u32> {
        std::fs::read_to_string(self.path("nginx.pid"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    fn get(&self, path: &str) -> Option<String> {
        let mut s = TcpStream::connect(self.addr).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
        write!(s, "GET {path} HTTP/1.0\r\nHost: t\r\n\r\n").ok()?;
        let mut got = String::new();
        s.read_to_string(&mut got).ok()?;
        let body = got.split_once("\r\n\r\n")?.1.to_string();
        Some(body)
    }
}

impl Drop for Site {
    fn drop(&mut self) {
        // A server the test left running: stopped as `-s stop` would.
        if let Some(pid) = self.pid() {
            let _ = Command::new("kill")
                .arg(pid.to_string())
                .stderr(Stdio::null())
                .status();
            wait_for("the server to stop", || !alive(pid));
        }
    }
}

fn alive(pid: u32) -> bool {
    Command::new("kill")
        .args(["-0", &pid.to_string()])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Wait (bounded) for `cond`.
fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn code(out: &Output) -> Option<i32> {
    out.status.code()
}

const GOOD: &str = "server { listen {LISTEN}; location / { return 200 \"one\\n\"; } }";

/// What `-t` printed and exited with, for one binary.
#[derive(Debug, PartialEq, Eq)]
struct Tested {
    code: Option<i32>,
    first: String,
    last: String,
    lines: usize,
}

fn tested(site: &Site, args: &[&str]) -> Tested {
    let out = site.run(args);
    let err = site.stderr(&out);
    let lines: Vec<&str> = err.lines().collect();
    Tested {
        code: code(&out),
        first: lines.first().copied().unwrap_or("").to_string(),
        last: lines.last().copied().unwrap_or("").to_string(),
        lines: lines.len(),
    }
}

#[test]
fn t_answers_a_good_a_bad_and_a_missing_conf_as_nginx() {
    let [n, v] = [Which::Nginx, Which::Vigil].map(|w| Site::new(w, "", GOOD));
    // A good conf: the same two lines, exit 0; `-q`: nothing.
    let (tn, tv) = (tested(&n, &["-t"]), tested(&v, &["-t"]));
    assert_eq!(tn, tv);
    assert_eq!(tv.code, Some(0));
    assert_eq!(
        tv.first,
        "nginx: the configuration file DIR/nginx.conf syntax is ok"
    );
    assert_eq!(
        tv.last,
        "nginx: configuration file DIR/nginx.conf test is successful"
    );
    for s in [&n, &v] {
        let out = s.run(&["-t", "-q"]);
        assert_eq!(
            (code(&out), s.stderr(&out)),
            (Some(0), String::new()),
            "{:?}",
            s.which
        );
    }
    // `-T`: the test, then every file on standard output.
    for s in [&n, &v] {
        let out = s.run(&["-T"]);
        let dump = String::from_utf8_lossy(&out.stdout)
            .replace(&s.dir.path().display().to_string(), "DIR");
        assert!(
            dump.starts_with("# configuration file DIR/nginx.conf:\npid nginx.pid;\n"),
            "{:?}: {dump}",
            s.which
        );
    }
    // A bad one: `[emerg]` at the same line, the same last line, exit 1.
    for s in [&n, &v] {
        let conf = std::fs::read_to_string(s.path("nginx.conf")).expect("read");
        std::fs::write(
            s.path("nginx.conf"),
            conf.replace(
                "access_log access.log;",
                "access_log access.log;\n    frobnicate on;",
            ),
        )
        .expect("write");
    }
    let (tn, tv) = (tested(&n, &["-t"]), tested(&v, &["-t"]));
    assert_eq!((tn.code, tn.lines), (Some(1), 2), "{tn:?}");
    assert_eq!((tv.code, tv.lines), (Some(1), 2), "{tv:?}");
    assert_eq!(tv.last, tn.last);
    assert_eq!(
        tv.last,
        "nginx: configuration file DIR/nginx.conf test failed"
    );
    for t in [&tn, &tv] {
        assert!(t.first.starts_with("[emerg] "), "{t:?}");
        assert!(t.first.contains("\"frobnicate\""), "{t:?}");
        assert!(t.first.ends_with(" in DIR/nginx.conf:12"), "{t:?}");
    }
    // A missing one: nginx's words exactly.
    let (tn, tv) = (
        tested(&n, &["-t", "-c", "nope.conf"]),
        tested(&v, &["-t", "-c", "nope.conf"]),
    );
    assert_eq!(tn, tv);
    assert_eq!(
        tv.first,
        "[emerg] open() \"DIR/nope.conf\" failed (2: No such file or directory)"
    );
    // A bad argument.
    for s in [&n, &v] {
        let out = s.run(&["-s", "restart"]);
        assert_eq!(
            (code(&out), s.stderr(&out)),
            (
                Some(1),
                "nginx: invalid option: \"-s restart\"\n".to_string()
            ),
            "{:?}",
            s.which
        );
    }
}

/// What one binary did through a life of start, reload, reopen and quit.
#[derive(Debug, PartialEq, Eq)]
struct Life {
    start_code: Option<i32>,
    served: Option<String>,
    reload_code: Option<i32>,
    reopen_code: Option<i32>,
    /// Lines the moved file got after the reopen.
    moved_log_grew: bool,
    quit_code: Option<i32>,
    /// The request in flight at the quit came whole.
    in_flight_whole: bool,
    pid_file_left: bool,
    /// `-s reload` once stopped: exit code and message.
    reload_when_stopped: (Option<i32>, String),
}

fn life(which: Which) -> Life {
    let slow = SlowBackend::start();
    let http = format!(
        "server {{ listen {{LISTEN}}; location / {{ return 200 \"one\\n\"; }} \
         location /slow {{ proxy_pass http://{}; proxy_read_timeout 30s; }} }}",
        slow.addr
    );
    let site = Site::new(which, "", &http);
    // nginx's default is `daemon on`: the command returns, the server runs.
    let start = site.run(&[]);
    let start_code = code(&start);
    assert_eq!(start_code, Some(0), "{which:?}: {}", site.stderr(&start));
    wait_for("the pid file", || site.pid().is_some_and(alive));
    wait_for("the listener", || TcpStream::connect(site.addr).is_ok());
    let served = site.get("/");

    std::fs::write(
        site.path("nginx.conf"),
        std::fs::read_to_string(site.path("nginx.conf"))
            .expect("read")
            .replace("\"one\\n\"", "\"two\\n\""),
    )
    .expect("write");
    let reload_code = code(&site.run(&["-s", "reload"]));
    // (nginx's old worker may still take a connection or two.)
    wait_for("the reloaded answer", || {
        site.get("/").is_some_and(|b| b == "two\n")
    });

    let (log, moved) = (site.path("access.log"), site.path("access.log.1"));
    std::fs::rename(&log, &moved).expect("mv access.log");
    let reopen_code = code(&site.run(&["-s", "reopen"]));
    wait_for("the access log at its path again", || log.exists());
    let moved_len = std::fs::metadata(&moved).map(|m| m.len()).unwrap_or(0);
    let _ = site.get("/after-reopen");
    wait_for("the line in the new access log", || {
        std::fs::read_to_string(&log).is_ok_and(|t| t.contains("/after-reopen"))
    });
    let moved_log_grew = std::fs::metadata(&moved).map(|m| m.len()).unwrap_or(0) != moved_len;

    // A request in flight at `-s quit`.
    let mut s = TcpStream::connect(site.addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    write!(s, "GET /slow HTTP/1.0\r\nHost: t\r\n\r\n").expect("send");
    wait_for("the request at the backend", || slow.arrived());
    let pid = site.pid().expect("pid");
    let quit_code = code(&site.run(&["-s", "quit"]));
    // The listener closes while the request is still held.
    wait_for("the listener to close", || {
        TcpStream::connect(site.addr).is_err()
    });
    slow.release();
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    let in_flight_whole = got.ends_with(&[b's'; SLOW_BODY]) && got.starts_with(b"HTTP/1.1 200");
    eprintln!(
        "{which:?}: in flight at quit: {:?}",
        String::from_utf8_lossy(&got[..got.len().min(300)])
    );
    wait_for("the server to exit", || !alive(pid));
    wait_for("the pid file to go", || !site.path("nginx.pid").exists());
    let pid_file_left = site.path("nginx.pid").exists();
    let stopped = site.run(&["-s", "reload"]);
    Life {
        start_code,
        served,
        reload_code,
        reopen_code,
        moved_log_grew,
        quit_code,
        in_flight_whole,
        pid_file_left,
        reload_when_stopped: (code(&stopped), site.stderr(&stopped)),
    }
}

#[test]
fn start_reload_reopen_and_quit_through_the_pid_file_as_nginx() {
    let n = life(Which::Nginx);
    let v = life(Which::Vigil);
    assert_eq!(v, n);
    assert_eq!(v.served.as_deref(), Some("one\n"));
    assert!(v.in_flight_whole && !v.moved_log_grew && !v.pid_file_left);
    assert_eq!(
        v.reload_when_stopped,
        (
            Some(1),
            "[notice] signal process started\n\
             [error] open() \"DIR/nginx.pid\" failed (2: No such file or directory)\n"
                .to_string()
        )
    );
}

const SLOW_BODY: usize = 1000;

/// A backend that holds its one response until released.
struct SlowBackend {
    addr: SocketAddr,
    state: std::sync::Arc<(std::sync::Mutex<(bool, bool)>, std::sync::Condvar)>,
}

impl SlowBackend {
    fn start() -> Self {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr");
        let state = std::sync::Arc::new((
            std::sync::Mutex::new((false, false)),
            std::sync::Condvar::new(),
        ));
        let st = state.clone();
        std::thread::spawn(move || {
            for conn in l.incoming() {
                let Ok(mut conn) = conn else { continue };
                let st = st.clone();
                std::thread::spawn(move || {
                    let mut head = Vec::new();
                    let mut b = [0u8; 1];
                    while !head.ends_with(b"\r\n\r\n") {
                        match conn.read(&mut b) {
                            Ok(1) => head.push(b[0]),
                            _ => return,
                        }
                    }
                    let (m, cv) = &*st;
                    let mut g = m.lock().expect("state");
                    g.0 = true;
                    cv.notify_all();
                    while !g.1 {
                        g = cv.wait(g).expect("state");
                    }
                    drop(g);
                    let _ = write!(
                        conn,
                        "HTTP/1.1 200 OK\r\nContent-Length: {SLOW_BODY}\r\nConnection: close\r\n\r\n"
                    );
                    let _ = conn.write_all(&[b's'; SLOW_BODY]);
                });
            }
        });
        Self { addr, state }
    }

    fn arrived(&self) -> bool {
        self.state.0.lock().expect("state").0
    }

    fn release(&self) {
        let (m, cv) = &*self.state;
        m.lock().expect("state").1 = true;
        cv.notify_all();
    }
}

impl Drop for SlowBackend {
    fn drop(&mut self) {
        self.release();
    }
}

/// Debian's `/etc/nginx` (nginx.conf, its `modules-enabled`, `mime.types`,
/// the default site serving `/var/www/html`), copied under `dir` with
/// only what a test must change: the default site's `listen 80` lines
/// become `addr`, and the pid, error and access logs go to `dir`.
fn debian_conf(dir: &std::path::Path, addr: SocketAddr) -> Option<PathBuf> {
    let etc = std::path::Path::new("/etc/nginx");
    let site = std::fs::read_to_string(etc.join("sites-available/default")).ok()?;
    let main = std::fs::read_to_string(etc.join("nginx.conf")).ok()?;
    let d = dir.display();
    let main = main
        .replace("pid /run/nginx.pid;", &format!("pid {d}/nginx.pid;"))
        .replace("/var/log/nginx/", &format!("{d}/"))
        .replace(
            "include /etc/nginx/sites-enabled/*;",
            &format!("include {d}/sites-enabled/*;"),
        )
        .replace("user www-data;", "user root;");
    let site = site
        .lines()
        .filter(|l| !l.trim_start().starts_with("listen [::]:80"))
        .map(|l| {
            if l.trim_start().starts_with("listen 80 default_server;") {
                format!("\tlisten {addr} default_server;")
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::create_dir_all(dir.join("sites-enabled")).ok()?;
    std::fs::write(dir.join("sites-enabled/default"), site).ok()?;
    let conf = dir.join("nginx.conf");
    std::fs::write(&conf, main).ok()?;
    Some(conf)
}

#[test]
fn debians_default_conf_and_site_serve_as_nginx() {
    assert!(
        std::path::Path::new("/etc/nginx/sites-available/default").exists()
            && std::path::Path::new("/var/www/html").exists(),
        "Debian's nginx package is not installed (.ci/run installs it)"
    );
    let mut seen = Vec::new();
    for which in [Which::Nginx, Which::Vigil] {
        let dir = tempfile::tempdir().expect("tempdir");
        let addr = free_addr();
        let conf = debian_conf(dir.path(), addr).expect("Debian's conf copied");
        let run = |args: &[&str]| {
            Command::new(binary(which))
                .arg("-c")
                .arg(&conf)
                .args(args)
                .stdin(Stdio::null())
                .output()
                .expect("run")
        };
        let t = run(&["-t", "-q"]);
        assert_eq!(
            t.status.code(),
            Some(0),
            "{which:?} -t: {}",
            String::from_utf8_lossy(&t.stderr)
        );
        let start = run(&[]);
        assert_eq!(
            start.status.code(),
            Some(0),
            "{which:?}: {}",
            String::from_utf8_lossy(&start.stderr)
        );
        let pid_file = dir.path().join("nginx.pid");
        let pid =
            || -> Option<u32> { std::fs::read_to_string(&pid_file).ok()?.trim().parse().ok() };
        wait_for("the pid file", || pid().is_some_and(alive));
        wait_for("the listener", || TcpStream::connect(addr).is_ok());
        let get = |path: &str| -> String {
            let mut s = TcpStream::connect(addr).expect("connect");
            s.set_read_timeout(Some(Duration::from_secs(10)))
                .expect("timeout");
            write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").expect("send");
            let mut got = Vec::new();
            let _ = s.read_to_end(&mut got);
            String::from_utf8_lossy(&got).into_owned()
        };
        // The welcome page, a missing file, the directory without its slash.
        let answers: Vec<(String, usize)> = ["/", "/nope.html", "/index.nginx-debian.html"]
            .iter()
            .map(|p| {
                let r = get(p);
                let status = r.lines().next().unwrap_or("").to_string();
                let body = r.split_once("\r\n\r\n").map_or(0, |(_, b)| b.len());
                (status, body)
            })
            .collect();
        let stop = run(&["-s", "quit"]);
        assert_eq!(stop.status.code(), Some(0));
        wait_for("the server to stop", || !pid().is_some_and(alive));
        seen.push(answers);
    }
    // Same statuses; the same welcome page and file (404's page differs:
    // nginx's names nginx).
    assert_eq!(seen[1][0], seen[0][0], "the welcome page");
    assert_eq!(seen[1][2], seen[0][2], "the file by name");
    assert_eq!(seen[1][1].0, seen[0][1].0, "a missing file");
    assert!(seen[0][0].0.starts_with("HTTP/1.1 200"), "{seen:?}");
}
