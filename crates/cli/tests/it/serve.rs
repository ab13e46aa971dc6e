//! The real `vigil serve` process: one-line startup errors with exit code 2,
//! SIGHUP reload, SIGTERM shutdown.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;
use tokio::time::Instant;
use vigil_testkit::free_addr as free_port;

/// A backend answering every request with `body`, on its own thread.
pub(crate) fn backend(body: &'static str) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    answer_on(l, body);
    addr
}

/// Answer every request on `l` with `body` (`Connection: close`), on
/// threads of its own.
pub(crate) fn answer_on(l: TcpListener, body: &'static str) {
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
}

fn get(addr: SocketAddr) -> Option<String> {
    exchange(
        addr,
        "GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
    )
}

/// Send `request` on a new connection to `addr`; all that comes back.
pub(crate) fn exchange(addr: SocketAddr, request: &str) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(request.as_bytes()).ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

pub(crate) fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub(crate) fn conf(upstream: SocketAddr, listen: SocketAddr) -> String {
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
fn a_conf_with_several_refusals_names_each_in_one_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("nginx.conf");
    std::fs::write(
        &path,
        "http {\n  upstream u { server 127.0.0.1:1 weight=0; }\n  frobnicate on;\n  server { listen 127.0.0.1:1; location / { proxy_pass http://u; mirror /m; } }\n}\n",
    )
    .expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_vigil"))
        .args(["serve", "--nginx-conf"])
        .arg(&path)
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 3, "{err}");
    assert!(
        lines.iter().all(|l| l.starts_with("vigil: error: ")),
        "{err}"
    );
    assert!(
        lines[0].contains("nginx.conf:2:") && lines[0].contains("weight"),
        "{err}"
    );
    assert!(
        lines[1].contains("nginx.conf:3:") && lines[1].contains("frobnicate"),
        "{err}"
    );
    assert!(
        lines[2].contains("nginx.conf:4:") && lines[2].contains("mirror"),
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

/// A running `vigil serve` whose stderr is collected.
struct Serving {
    child: std::process::Child,
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Serving {
    /// `vigil serve` on `path`, through `sh -c` so a test can set limits first.
    fn start(prefix: &str, path: &std::path::Path, log: &str) -> Self {
        let mut child = Command::new("bash")
            .arg("-c")
            .arg(format!("{prefix} exec \"$0\" \"$@\""))
            .arg(env!("CARGO_BIN_EXE_vigil"))
            .args(["serve", "--no-admin", "--threads", "1", "--nginx-conf"])
            .arg(path)
            .env("VIGIL_LOG", log)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start");
        let stderr = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let (pipe, sink) = (child.stderr.take().expect("stderr"), stderr.clone());
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(pipe).lines() {
                let Ok(line) = line else { return };
                let mut s = sink.lock().expect("lock");
                s.push_str(&line);
                s.push('\n');
            }
        });
        Self { child, stderr }
    }

    fn log(&self) -> String {
        self.stderr.lock().expect("lock").clone()
    }

    fn hup(&self) {
        let ok = Command::new("kill")
            .args(["-HUP", &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(ok.success());
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn refused(addr: SocketAddr) -> bool {
    matches!(
        TcpStream::connect_timeout(&addr, Duration::from_secs(2)),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused
    )
}

#[test]
fn sighup_applies_a_changed_listen_and_refuses_one_it_cannot_bind() {
    let a = backend("A");
    let (first, second) = (free_port(), free_port());
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("nginx.conf");
    std::fs::write(&path, conf(a, first)).expect("write");
    let vigil = Serving::start("", &path, "info");
    wait_for("the first address to answer", || get(first).is_some());

    std::fs::write(&path, conf(a, second)).expect("rewrite");
    vigil.hup();
    wait_for("the new address to answer", || {
        get(second).is_some_and(|r| r.ends_with("\r\n\r\nA"))
    });
    wait_for("the removed address to refuse connections", || {
        refused(first)
    });

    // An address another socket holds: the reload fails, nothing changes.
    let taken = TcpListener::bind("127.0.0.1:0").expect("bind");
    let taken_addr = taken.local_addr().expect("addr");
    std::fs::write(&path, conf(a, taken_addr)).expect("rewrite");
    vigil.hup();
    let expected = format!("cannot listen on {taken_addr}");
    wait_for("the reload to be refused", || {
        vigil
            .log()
            .lines()
            .any(|l| l.contains("reload failed") && l.contains(&expected))
    });
    assert!(
        get(second).is_some_and(|r| r.ends_with("\r\n\r\nA")),
        "the running listener still serves"
    );
}

#[test]
fn silent_connections_under_a_1024_descriptor_limit_do_not_take_vigil_down() {
    // The case: 1,100 connections that never send a byte, a process
    // that cannot have more than 1,024 descriptors (hard limit: vigil cannot
    // raise it), and a short header timeout (long enough for this test to
    // open all 1,100 before the first is closed).
    let _ = rlimit::increase_nofile_limit(8192);
    let a = backend("A");
    let listen = free_port();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("nginx.conf");
    std::fs::write(
        &path,
        format!(
            "events {{}} http {{ client_header_timeout 3s; upstream u {{ server {a}; }}
               server {{ listen {listen}; location / {{ proxy_pass http://u; }} }} }}\n"
        ),
    )
    .expect("write");
    let vigil = Serving::start("ulimit -n 1024 &&", &path, "info");
    wait_for("vigil to answer", || get(listen).is_some());
    assert!(
        vigil.log().contains("limit=1024"),
        "the limit is logged: {}",
        vigil.log()
    );
    let mut silent = Vec::with_capacity(1100);
    for _ in 0..1100 {
        silent.push(TcpStream::connect_timeout(&listen, Duration::from_secs(5)).expect("connect"));
    }
    wait_for("vigil to answer again", || {
        get(listen).is_some_and(|r| r.ends_with("\r\n\r\nA"))
    });
    for mut s in silent {
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let mut buf = [0u8; 64];
        assert!(
            matches!(s.read(&mut buf), Ok(0) | Err(_)),
            "a silent connection was closed without a response"
        );
    }
    let log = vigil.log();
    let failures = log.lines().filter(|l| l.contains("accept failed")).count();
    assert!(
        (1..=10).contains(&failures),
        "descriptors ran out and were logged once per second, not per attempt ({failures} lines):\n{log}"
    );
}

/// A child process killed when the test ends.
pub(crate) struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `vigil serve` on `path` with its admin API on `admin` (and `args`).
pub(crate) fn serve_with_admin(path: &std::path::Path, admin: &str, args: &[&str]) -> Child {
    Child(
        Command::new(env!("CARGO_BIN_EXE_vigil"))
            .args(["serve", "--threads", "1", "--admin-listen", admin])
            .args(args)
            .arg("--nginx-conf")
            .arg(path)
            .env("VIGIL_LOG", "error")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start"),
    )
}

pub(crate) fn vigil(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_vigil"))
        .args(args)
        .env_remove("VIGIL_ADMIN_TOKEN")
        .output()
        .expect("run")
}

#[test]
fn vigil_reload_reloads_and_a_failed_one_names_the_line_and_shows_in_status() {
    let (a, b) = (backend("A"), backend("B"));
    let (listen, admin) = (free_port(), free_port());
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("nginx.conf");
    std::fs::write(&path, conf(a, listen)).expect("write");
    let admin_s = admin.to_string();
    let _serving = serve_with_admin(&path, &admin_s, &["--admin-token", "t"]);
    wait_for("the proxy to answer from A", || {
        get(listen).is_some_and(|r| r.ends_with("\r\n\r\nA"))
    });
    wait_for("the admin API", || TcpStream::connect(admin).is_ok());

    // A good configuration: the new generation, exit 0, and it serves.
    std::fs::write(&path, conf(b, listen)).expect("rewrite");
    let out = vigil(&["reload", "--admin", &admin_s, "--token", "t"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        (out.status.code(), text.trim()),
        (Some(0), "reloaded: generation 2")
    );
    wait_for("the reloaded config to send requests to B", || {
        get(listen).is_some_and(|r| r.ends_with("\r\n\r\nB"))
    });

    // Without the token: refused, exit 1, and it says how to pass one.
    let out = vigil(&["reload", "--admin", &admin_s]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("--token"), "{err}");

    // A bad one: exit 1, the error names the file and line, nothing changes.
    std::fs::write(
        &path,
        "events {}\nhttp {\n  upstream u { server 127.0.0.1:1 weight=0; }\n}\n",
    )
    .expect("break");
    let out = vigil(&["reload", "--admin", &admin_s, "--token", "t"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("reload failed; the running configuration is kept")
            && err.contains("nginx.conf:3:")
            && err.contains("weight"),
        "{err}"
    );
    assert!(get(listen).is_some_and(|r| r.ends_with("\r\n\r\nB")));

    // `vigil status`: the failure is the line above the tables; with the
    // token it quotes the error.
    let out = vigil(&["status", "--admin", &admin_s, "--token", "t"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    let line = text.lines().nth(1).unwrap_or("");
    assert!(
        line.starts_with("config: RELOAD FAILED at ")
            && line.contains("still running generation 2")
            && line.contains("nginx.conf:3:"),
        "{text}"
    );
    let out = vigil(&["status", "--admin", &admin_s]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines()
            .nth(1)
            .is_some_and(|l| l.starts_with("config: RELOAD FAILED") && !l.contains("weight")),
        "{text}"
    );
}

/// Connect as soon as `addr` accepts, then send one request on that very
/// connection: what a client arriving at the first moment gets.
fn first_answer(addr: SocketAddr) -> String {
    let until = Instant::now() + Duration::from_secs(10);
    let mut s = loop {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
            Ok(s) => break s,
            Err(_) => {
                assert!(Instant::now() < until, "{addr} never accepted");
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    };
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    s.write_all(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .expect("send");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// `conf` with an http check starting down (tengine's default), interval
/// 10 s: only the start round's probes run during a test.
fn checked_conf(upstream: SocketAddr, listen: SocketAddr) -> String {
    format!(
        "events {{}} http {{ upstream u {{ server {upstream}; \
         check interval=10000 rise=2 fall=2 timeout=1000 type=http; \
         check_http_send \"GET / HTTP/1.0\\r\\n\\r\\n\"; }} \
         server {{ listen {listen}; location / {{ proxy_pass http://u; }} }} }}\n"
    )
}

#[test]
fn with_a_check_starting_down_the_first_request_after_start_is_served() {
    // tengine's default: down until `rise` passes; interval 10s so that
    // without the start round the first answer would be a 502.
    let a = backend("A");
    let listen = free_port();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("nginx.conf");
    std::fs::write(&path, checked_conf(a, listen)).expect("write");
    let serving = Serving::start("", &path, "info");
    let got = first_answer(listen);
    assert!(
        got.starts_with("HTTP/1.1 200") && got.ends_with("\r\n\r\nA"),
        "{got}\n{}",
        serving.log()
    );
    wait_for("the start round's log line", || {
        serving
            .log()
            .contains("first probe round done before accepting traffic")
    });
}

/// `GET /metrics` on the admin port with `accept` as the `Accept` header:
/// (the content type, the body).
fn scrape(admin: SocketAddr, accept: &str) -> Option<(String, String)> {
    let out = exchange(
        admin,
        &format!(
            "GET /metrics HTTP/1.1\r\nHost: localhost\r\nAccept: {accept}\r\nConnection: close\r\n\r\n"
        ),
    )?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    let ct = head.lines().find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.eq_ignore_ascii_case("content-type")
            .then(|| value.trim().to_string())
    })?;
    Some((ct, body.to_string()))
}

#[test]
fn admin_metrics_hold_the_proxys_and_the_checkers_families_in_one_text() {
    let a = backend("A");
    let (listen, admin) = (free_port(), free_port());
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("nginx.conf");
    std::fs::write(&path, checked_conf(a, listen)).expect("write");
    let admin_s = admin.to_string();
    let _serving = serve_with_admin(&path, &admin_s, &[]);
    wait_for("the proxy to answer from A", || {
        get(listen).is_some_and(|r| r.ends_with("\r\n\r\nA"))
    });
    let sample = format!("vigil_attempts_total{{upstream=\"u\",peer=\"{a}\",outcome=\"ok\"}} 1\n");
    let mut text = String::new();
    wait_for("the request counted on /metrics", || {
        text = scrape(admin, "*/*").map(|(_, b)| b).unwrap_or_default();
        text.contains(&sample)
    });
    let (ct, _) = scrape(admin, "*/*").expect("scrape");
    assert_eq!(ct, "text/plain; version=0.0.4; charset=utf-8");
    // The peer gauges, the probe counters and the proxy's metrics, each
    // family declared once.
    for family in [
        "# TYPE nginx_upstream_count_total gauge",
        "# TYPE vigil_peer_up gauge",
        "# TYPE vigil_probe_results_total counter",
        "# TYPE vigil_requests_total counter",
        "# TYPE vigil_reloads_total counter",
    ] {
        assert_eq!(
            text.lines().filter(|l| *l == family).count(),
            1,
            "{family}\n{text}"
        );
    }
    assert!(text.contains("vigil_requests_total{upstream=\"u\",status_class=\"2xx\"} 1\n"));
    assert!(text.contains(&format!(
        "vigil_probe_results_total{{peer=\"{a}\",type=\"http\",result=\"ok\",phase=\"none\"}} "
    )));
    let (ct, om) = scrape(
        admin,
        "application/openmetrics-text;version=1.0.0;q=0.5,*/*;q=0.1",
    )
    .expect("scrape");
    assert_eq!(
        ct,
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    assert!(om.contains("# TYPE vigil_requests counter\n"), "{om}");
    assert!(om.contains(&sample), "the same samples: {om}");
    assert!(om.ends_with("# EOF\n"), "{om}");
}

#[test]
fn a_closed_log_pipe_does_not_stop_vigil() {
    // Every request to a refused upstream is logged (a warn and an error
    // line); the reader of vigil's log goes away first.
    let listen = free_port();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("nginx.conf");
    std::fs::write(
        &path,
        format!("events {{}} http {{ upstream u {{ server 127.0.0.1:1; }} server {{ listen {listen}; location / {{ proxy_pass http://u; }} }} }}\n"),
    )
    .expect("write");
    let mut running = Child(
        Command::new(env!("CARGO_BIN_EXE_vigil"))
            .args(["serve", "--no-admin", "--threads", "1", "--nginx-conf"])
            .arg(&path)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start"),
    );
    let child = &mut running.0;
    wait_for("vigil to answer", || get(listen).is_some());
    // The reader of both pipes closes them.
    drop(child.stderr.take());
    drop(child.stdout.take());
    for _ in 0..50 {
        let r = get(listen).unwrap_or_default();
        assert!(r.starts_with("HTTP/1.1 502"), "{r:?}");
    }
    assert!(
        child.try_wait().expect("wait").is_none(),
        "vigil is still running with its log pipe closed"
    );
    assert!(Command::new("kill")
        .args(["-QUIT", &child.id().to_string()])
        .status()
        .expect("kill")
        .success());
    let until = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        assert!(Instant::now() < until, "vigil did not exit after SIGQUIT");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "exit {status} (101 is a panic)");
}

#[test]
fn usr2_and_winch_are_refused_and_a_full_disk_does_not_stop_serving() {
    // nginx's binary-upgrade signals would end a process that does not
    // catch them; an access log on a full disk (/dev/full: ENOSPC on
    // every write) must cost no request.
    let b = backend("B");
    let listen = free_port();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("nginx.conf");
    std::fs::write(
        &path,
        format!("events {{}} http {{ upstream u {{ server {b}; }} server {{ listen {listen}; access_log /dev/full; location / {{ proxy_pass http://u; }} }} }}\n"),
    )
    .expect("write");
    let log = dir.path().join("stderr");
    let mut running = Child(
        Command::new(env!("CARGO_BIN_EXE_vigil"))
            .args(["serve", "--no-admin", "--threads", "1", "--nginx-conf"])
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("start"),
    );
    wait_for("vigil to answer", || {
        get(listen).is_some_and(|r| r.ends_with("\r\n\r\nB"))
    });
    for sig in ["-USR2", "-WINCH"] {
        assert!(Command::new("kill")
            .args([sig, &running.0.id().to_string()])
            .status()
            .expect("kill")
            .success());
    }
    wait_for("both refusals logged", || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        text.contains("\"SIGUSR2\"") && text.contains("\"SIGWINCH\"")
    });
    for _ in 0..20 {
        let r = get(listen).unwrap_or_default();
        assert!(r.ends_with("\r\n\r\nB"), "{r:?}");
    }
    assert!(
        running.0.try_wait().expect("wait").is_none(),
        "still running"
    );
}
