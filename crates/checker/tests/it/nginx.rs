//! `vigil check` beside a real, stock nginx started by the test: three
//! backends; stop one → nginx sends it nothing; start it → nginx uses it
//! again; stop all → the upstream is not emptied; a render nginx rejects →
//! rolled back, nginx still serving. The checker runs in-process through
//! the library; rendering, `nginx -t` and the verified reload are real.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use vigil_checker::nginx::{
    render_once, CheckOnly, CheckOnlyOptions, CommandLine, NginxControl, SyncOptions,
};
use vigil_checker::CheckerOptions;
use vigil_core::health::HealthState;

use crate::stock::{free_port, get, nginx_bin, Nginx};
use crate::support::{eventually, Behaviour, Raw};

const INTERVAL_MS: u64 = 200;
const FALL: u64 = 2;
const DEBOUNCE_MS: u64 = 100;

fn answer(name: &'static str) -> Behaviour {
    let text: &'static str = Box::leak(
        format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{name}",
            name.len()
        )
        .into_boxed_str(),
    );
    Behaviour::Answer(text)
}

/// Fields drop in order: nginx is stopped before its directory goes.
struct Setup {
    src: PathBuf,
    render: PathBuf,
    nginx: Nginx,
    vigil: CheckOnly,
    ports: Vec<u16>,
    _tmp: tempfile::TempDir,
}

async fn setup(server_params: &str) -> Setup {
    let bin = nginx_bin();
    let tmp = tempfile::tempdir().expect("test step");
    let dir = tmp.path().to_path_buf();
    let render = dir.join("upstreams");
    std::fs::create_dir_all(&render).expect("test step");
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let src = dir.join("upstreams.src.conf");
    write_src(&src, &ports, server_params, "");
    let port = free_port();
    let conf = Nginx::write_conf(&dir, port);
    let nginx_cmds = |tail: &[&str]| {
        let mut v = vec![
            bin.display().to_string(),
            "-p".into(),
            dir.display().to_string(),
            "-c".into(),
            conf.display().to_string(),
        ];
        v.extend(tail.iter().map(|s| s.to_string()));
        v
    };
    let mut control = NginxControl::new(&bin, &conf);
    control.test = CommandLine::Argv(nginx_cmds(&["-t", "-q"]));
    control.reload = CommandLine::Argv(nginx_cmds(&["-s", "reload"]));
    control.verify_timeout = Duration::from_secs(5);
    assert_eq!(
        control.pid_file,
        dir.join("nginx.pid"),
        "pid file read from nginx.conf"
    );
    let mut sync = SyncOptions::new(render.clone());
    sync.debounce = Duration::from_millis(DEBOUNCE_MS);
    sync.max_delay = Duration::from_millis(500);
    sync.min_reload_interval = Duration::from_millis(200);
    sync.poll = Duration::from_millis(100);
    sync.retry_min = Duration::from_millis(200);
    let options = CheckOnlyOptions {
        source: src.clone(),
        default_check: None,
        control,
        sync,
        checker: CheckerOptions::default(),
        status_listen: Some("127.0.0.1:0".parse().expect("test step")),
    };
    // Before nginx first starts, the files it includes must exist.
    render_once(&options)
        .await
        .expect("first render passes nginx -t");
    let nginx = Nginx::start(&bin, &dir, &conf, port);
    let pid = dir.join("nginx.pid");
    eventually("nginx to start", Duration::from_secs(10), || {
        pid.exists() && std::net::TcpStream::connect(nginx.addr()).is_ok()
    })
    .await;
    let vigil = CheckOnly::start(options).await.expect("vigil check starts");
    assert_eq!(
        vigil.status().reloads,
        1,
        "tested and reloaded once at startup"
    );
    Setup {
        src,
        render,
        nginx,
        vigil,
        ports,
        _tmp: tmp,
    }
}

fn write_src(src: &Path, ports: &[u16], params: &str, extra: &str) {
    let mut text = String::from("upstream app {\n");
    for p in ports {
        text.push_str(&format!("    server 127.0.0.1:{p} {params};\n"));
    }
    text.push_str(&format!(
        "    check interval={INTERVAL_MS} rise=2 fall={FALL} timeout=150 type=http;\n    check_http_send \"GET /health HTTP/1.0\\r\\n\\r\\n\";\n}}\n"
    ));
    text.push_str(extra);
    std::fs::write(src, text).expect("test step");
}

async fn backend(port: u16, name: &'static str) -> Raw {
    let l = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], port)))
        .await
        .expect("bind backend");
    Raw::on(l, answer(name))
}

/// Send `n` requests through nginx; the upstream addresses they used.
async fn spray(addr: SocketAddr, n: usize) -> Vec<(u16, String, String)> {
    let mut out = Vec::new();
    for _ in 0..n {
        if let Some(r) = get(addr).await {
            out.push(r);
        }
    }
    out
}

fn peer_state(v: &CheckOnly, i: usize) -> Option<HealthState> {
    v.checker()
        .registry()
        .get("app")
        .expect("test step")
        .peers()[i]
        .health()
        .view()
        .state
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_follows_the_probes_and_is_never_emptied() {
    // max_fails=0: nginx's own passive check is off, so only vigil's
    // `down` marks can keep nginx away from a dead server.
    let s = setup("max_fails=0").await;
    let names = ["b1", "b2", "b3"];
    let mut backends: Vec<Option<Raw>> = Vec::new();
    for (p, n) in s.ports.iter().zip(names) {
        backends.push(Some(backend(*p, n).await));
    }
    let addr = s.nginx.addr();
    let b2 = format!("127.0.0.1:{}", s.ports[1]);

    // Healthy: nginx spreads over all three.
    let mut seen = std::collections::BTreeSet::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while seen.len() < 3 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "nginx never used all three: {seen:?}"
        );
        for (status, _, body) in spray(addr, 6).await {
            assert_eq!(status, 200);
            seen.insert(body);
        }
    }
    eventually("all three up by probes", Duration::from_secs(5), || {
        (0..3).all(|i| peer_state(&s.vigil, i) == Some(HealthState::Up))
    })
    .await;

    // Stop b2: within fall × interval + debounce (+ one spread interval,
    // the probe timeout and the reload), nginx stops sending it anything.
    let reloads = s.vigil.status().reloads;
    if let Some(b) = backends[1].take() {
        b.stop();
    }
    let limit = Duration::from_millis(FALL * INTERVAL_MS + INTERVAL_MS + 150 + DEBOUNCE_MS + 2_000);
    let file = s.render.join("app.conf");
    let marked = format!("server {b2} max_fails=0 down;");
    eventually("b2 marked down in the rendered file", limit, || {
        std::fs::read_to_string(&file)
            .expect("test step")
            .contains(&marked)
    })
    .await;
    eventually("the reload to be verified", Duration::from_secs(5), || {
        s.vigil.status().reloads > reloads
    })
    .await;
    for (status, upstream, body) in spray(addr, 30).await {
        assert_eq!(status, 200);
        assert!(!upstream.contains(&b2), "nginx tried b2: {upstream}");
        assert_ne!(body, "b2");
    }

    // Start b2 again: after rise passes nginx uses it again.
    backends[1] = Some(backend(s.ports[1], "b2").await);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "nginx never went back to b2"
        );
        if spray(addr, 6).await.iter().any(|(_, _, b)| b == "b2") {
            break;
        }
    }
    let view = s
        .vigil
        .checker()
        .registry()
        .get("app")
        .expect("test step")
        .peers()[1]
        .health()
        .view();
    assert_eq!(view.state, Some(HealthState::Up));
    assert!(view.ok_streak >= 2, "rise=2 passes first");

    // Stop all: the file keeps every server usable (fail-open guard).
    for b in backends.iter_mut() {
        if let Some(b) = b.take() {
            b.stop();
        }
    }
    eventually("all three down by probes", Duration::from_secs(5), || {
        (0..3).all(|i| peer_state(&s.vigil, i) == Some(HealthState::Down))
    })
    .await;
    eventually("the guard to engage", Duration::from_secs(5), || {
        s.vigil.status().guarded == vec!["app".to_string()] && !s.vigil.status().reload_pending
    })
    .await;
    let text = std::fs::read_to_string(&file).expect("test step");
    assert!(!text.contains(" down;"), "no server marked down:\n{text}");
    for p in &s.ports {
        assert!(text.contains(&format!("server 127.0.0.1:{p} max_fails=0;")));
    }
    // So a backend that comes back is used by nginx at once, before any probe rises.
    backends[0] = Some(backend(s.ports[0], "b1").await);
    let got = spray(addr, 3).await;
    assert!(
        got.iter().any(|(st, _, b)| *st == 200 && b == "b1"),
        "{got:?}"
    );
    drop(backends);
    s.vigil.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_render_nginx_rejects_is_rolled_back_while_nginx_keeps_serving() {
    let s = setup("weight=1").await;
    let mut backends = Vec::new();
    for (p, n) in s.ports.iter().zip(["b1", "b2", "b3"]) {
        backends.push(backend(*p, n).await);
    }
    let addr = s.nginx.addr();
    let file = s.render.join("app.conf");
    let before = std::fs::read_to_string(&file).expect("test step");
    // An upstream that nginx.conf already defines: vigil renders it,
    // nginx -t refuses the duplicate.
    write_src(
        &s.src,
        &s.ports,
        "weight=1",
        "upstream legacy {\n    server 127.0.0.1:10;\n}\n",
    );
    s.vigil.reload_source().await.expect("source reloads");
    eventually(
        "nginx -t to reject the render",
        Duration::from_secs(5),
        || s.vigil.status().test_failures == 1,
    )
    .await;
    assert_eq!(
        std::fs::read_to_string(&file).expect("test step"),
        before,
        "previous file restored"
    );
    assert!(s
        .vigil
        .status()
        .last_error
        .is_some_and(|e| e.contains("duplicate upstream")));
    assert!(
        !s.render.join("legacy.conf").exists(),
        "the new file was removed again"
    );
    for (status, _, _) in spray(addr, 5).await {
        assert_eq!(status, 200, "nginx still serving");
    }
    // The status page says what vigil sees.
    let st = s.vigil.status_addr().expect("status listener");
    let mut c = TcpStream::connect(st).await.expect("test step");
    c.write_all(b"GET /metrics HTTP/1.0\r\n\r\n")
        .await
        .expect("test step");
    let mut buf = String::new();
    c.read_to_string(&mut buf).await.expect("test step");
    assert!(
        buf.contains("vigil_nginx_renders_total{result=\"rejected\"} 1"),
        "{buf}"
    );
    drop(backends);
    s.vigil.shutdown().await;
}
