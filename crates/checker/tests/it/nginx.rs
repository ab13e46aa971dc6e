//! `vigil check` beside a real, stock nginx started by the test: three
//! backends; stop one → nginx sends it nothing; start it → nginx uses it
//! again; stop all → the upstream is not emptied (core's max_ejected, the
//! minimum-healthy guard, keeps the least bad); two of two failing their
//! probes → nginx sends everything to the kept one, and status and explain
//! say so; a render nginx rejects → rolled back, nginx still serving; a
//! server going down reaches nginx's new workers at once (timed). The
//! checker runs in-process through the library; rendering, `nginx -t` and
//! the verified reload are real.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use vigil_checker::nginx::{
    render_once, CheckOnly, CheckOnlyOptions, CommandLine, NginxControl, SyncOptions,
};
use vigil_checker::CheckerOptions;
use vigil_core::api::{self, NginxGiven, UpstreamView};
use vigil_core::event::{EventKind, Timing};
use vigil_core::health::HealthState;
use vigil_core::upstream::{PeerState, Rule};

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
    setup_with(3, server_params, "").await
}

/// `n` servers with `server_params`, and `inner` directives in the block.
async fn setup_with(n: usize, server_params: &str, inner: &str) -> Setup {
    setup_opts(n, server_params, inner, |_| {}).await
}

/// As [`setup_with`], with the sync loop's options changed by `f`.
async fn setup_opts(
    n: usize,
    server_params: &str,
    inner: &str,
    f: impl FnOnce(&mut SyncOptions),
) -> Setup {
    let bin = nginx_bin();
    let tmp = tempfile::tempdir().expect("test step");
    let dir = tmp.path().to_path_buf();
    let render = dir.join("upstreams");
    std::fs::create_dir_all(&render).expect("test step");
    let ports: Vec<u16> = (0..n).map(|_| free_port()).collect();
    let src = dir.join("upstreams.src.conf");
    write_src_with(&src, &ports, server_params, inner, "");
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
    f(&mut sync);
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
    write_src_with(src, ports, params, "", extra);
}

fn write_src_with(src: &Path, ports: &[u16], params: &str, inner: &str, extra: &str) {
    let mut text = String::from("upstream app {\n");
    for p in ports {
        text.push_str(&format!("    server 127.0.0.1:{p} {params};\n"));
    }
    text.push_str(inner);
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
    // The old workers drain after the reload (nginx's graceful reload: one
    // still accepting for a moment can try b2): wait, bounded, until a whole
    // spray avoids it; then another must too.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let answers = spray(addr, 30).await;
        assert!(answers.iter().all(|(status, _, _)| *status == 200));
        if answers
            .iter()
            .all(|(_, upstream, _)| !upstream.contains(&b2))
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "nginx still tried b2 after its old workers had 5 s to drain: {answers:?}"
        );
    }
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

    // Stop all: the upstream is never emptied. --min-healthy 1 is core's
    // max_ejected: two are marked down, the least bad one stays.
    for b in backends.iter_mut() {
        if let Some(b) = b.take() {
            b.stop();
        }
    }
    eventually("all three down by probes", Duration::from_secs(5), || {
        (0..3).all(|i| peer_state(&s.vigil, i) == Some(HealthState::Down))
    })
    .await;
    eventually(
        "two marked, one kept, reloaded",
        Duration::from_secs(5),
        || {
            let st = s.vigil.status();
            st.guarded == vec!["app".to_string()]
                && st.marked.len() == 2
                && st.kept.len() == 1
                && !st.reload_pending
        },
    )
    .await;
    let text = std::fs::read_to_string(&file).expect("test step");
    assert_eq!(
        text.matches(" down; # vigil: down by active check").count(),
        2,
        "{text}"
    );
    assert_eq!(
        text.matches("; # vigil: failing its checks, kept by max_ejected (3 of 3 would be ejected, at most 2 may be)").count(),
        1,
        "{text}"
    );
    let kept = s.vigil.status().kept[0].1.clone();
    let k = s
        .ports
        .iter()
        .position(|p| kept == format!("server 127.0.0.1:{p} max_fails=0"))
        .expect("the kept one is a server of the source");
    // So the kept backend, when it comes back, is used by nginx at once,
    // before any probe rises.
    backends[k] = Some(backend(s.ports[k], names[k]).await);
    let got = spray(addr, 3).await;
    assert!(
        got.iter().any(|(st, _, b)| *st == 200 && b == names[k]),
        "{got:?}"
    );
    drop(backends);
    s.vigil.shutdown().await;
}

/// The admin API's view of `app` in check mode (what `vigil status` and
/// `vigil explain` print).
fn app_view(v: &CheckOnly) -> UpstreamView {
    let reg = v.checker().registry();
    let up = reg.get("app").expect("test step");
    let mut view = api::upstream_view(up, &**v.clock(), v.clock().now());
    v.annotator().annotate(&mut view);
    view
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_of_two_failing_their_probes_nginx_keeps_the_least_bad_and_explain_says_so() {
    // The backends serve every request, but their probes expect a 3xx: both
    // fail every probe while serving nginx fine, so where nginx sends
    // requests shows what it was given.
    let s = setup_with(2, "max_fails=0", "    check_http_expect_alive http_3xx;\n").await;
    let names = ["b1", "b2"];
    let mut backends = Vec::new();
    for (p, n) in s.ports.iter().zip(names) {
        backends.push(backend(*p, n).await);
    }
    eventually("both down by probes", Duration::from_secs(5), || {
        (0..2).all(|i| peer_state(&s.vigil, i) == Some(HealthState::Down))
    })
    .await;
    eventually(
        "one marked, one kept, and nginx running it",
        Duration::from_secs(10),
        || {
            let st = s.vigil.status();
            let view = app_view(&s.vigil);
            st.marked.len() == 1
                && st.kept.len() == 1
                && view
                    .peers
                    .iter()
                    .all(|p| p.nginx.as_ref().is_some_and(|n| n.pending.is_none()))
        },
    )
    .await;
    let view = app_view(&s.vigil);
    let k = view
        .peers
        .iter()
        .position(|p| p.nginx.as_ref().map(|n| n.given) == Some(Some(NginxGiven::Kept)))
        .expect("one kept");
    let d = 1 - k;
    let (kept, down) = (&view.peers[k], &view.peers[d]);
    assert_eq!(
        down.nginx.as_ref().and_then(|n| n.given),
        Some(NginxGiven::Down)
    );
    // Status: the kept one is eligible by core's rules, its ejection waived.
    assert_eq!(kept.state, PeerState::Eligible);
    assert_eq!(kept.waived.len(), 1, "{kept:?}");
    assert_eq!(kept.waived[0].rule, Rule::ProbeDown);
    assert_eq!(down.state, PeerState::ProbeDown);
    let m = view
        .rules
        .max_ejected
        .as_ref()
        .expect("the guard is core's rule");
    assert_eq!(
        (m.percent, m.keep, m.in_service, m.ejected, m.allowed),
        (100, 1, 2, 2, 1)
    );
    // nginx sends everything to the kept one, nothing to the other.
    let got = spray(s.nginx.addr(), 20).await;
    assert_eq!(got.len(), 20);
    for (status, upstream, body) in &got {
        assert_eq!(*status, 200);
        assert_eq!(body, names[k]);
        assert_eq!(upstream, &kept.address);
    }
    // explain: what nginx was given, and never "gets no traffic" for the kept one.
    let said = api::explain(&view, kept, &[]);
    assert!(
        said[0].starts_with(&format!(
            "In nginx: {} stays up in app.conf although it fails its checks (failing its checks, kept by max_ejected (2 of 2 would be ejected, at most 1 may be)): nginx still sends it traffic.",
            kept.address
        )),
        "{said:?}"
    );
    assert!(
        said.iter().all(|l| !l.contains("gets no traffic")),
        "{said:?}"
    );
    assert!(
        said.iter().any(|l| l.contains("would be ejected")),
        "{said:?}"
    );
    let said = api::explain(&view, down, &[]);
    assert!(
        said[0].starts_with(&format!(
            "In nginx: {} is marked `down` in app.conf (down by active check)",
            down.address
        )),
        "{said:?}"
    );
    // The choice holds while both keep failing: more probes, no new reload.
    let reloads = s.vigil.status().reloads;
    let text = std::fs::read_to_string(s.render.join("app.conf")).expect("test step");
    let streak = |i: usize| {
        s.vigil
            .checker()
            .registry()
            .get("app")
            .expect("test step")
            .peers()[i]
            .health()
            .view()
            .fail_streak
    };
    let (s0, s1) = (streak(0), streak(1));
    eventually(
        "three more failed probes each",
        Duration::from_secs(5),
        || streak(0) >= s0 + 3 && streak(1) >= s1 + 3,
    )
    .await;
    let st = s.vigil.status();
    assert_eq!((st.reloads, st.reload_pending), (reloads, false));
    assert_eq!(
        std::fs::read_to_string(s.render.join("app.conf")).expect("test step"),
        text
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

/// One event as the test saw it arrive.
#[derive(Clone, Debug)]
struct Seen {
    at: tokio::time::Instant,
    peer: String,
    kind: EventKind,
}

/// Record every event of `v`'s bus with the moment it was published.
fn record(v: &CheckOnly) -> Arc<Mutex<Vec<Seen>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s2 = seen.clone();
    v.events().subscribe(move |e| {
        let at = tokio::time::Instant::now();
        s2.lock().expect("test step").push(Seen {
            at,
            peer: e.peer.to_string(),
            kind: e.kind.clone(),
        });
    });
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn down_to_nginx_a_failing_server_reaches_new_workers_at_once() {
    // The debounce and the least time between other reloads are a minute:
    // a down that reaches nginx before then did not wait for them. Only the
    // least time between a reload and a down reload applies (its default).
    let down_interval = SyncOptions::new(PathBuf::new()).down_reload_interval;
    let s = setup_opts(5, "max_fails=0", "", |o| {
        o.debounce = Duration::from_secs(60);
        o.max_delay = Duration::from_secs(60);
        o.min_reload_interval = Duration::from_secs(60);
        o.down_reload_interval = down_interval;
    })
    .await;
    let names = ["b1", "b2", "b3", "b4", "b5"];
    let mut backends = Vec::new();
    for (p, n) in s.ports.iter().zip(names) {
        backends.push(Some(backend(*p, n).await));
    }
    eventually("all five up by probes", Duration::from_secs(5), || {
        (0..5).all(|i| peer_state(&s.vigil, i) == Some(HealthState::Up))
    })
    .await;
    let seen = record(&s.vigil);
    let mut last_reload = tokio::time::Instant::now();
    let mut figures = Vec::new();
    // Four of five go down one after the other (--min-healthy 1 keeps one).
    for i in 0..4 {
        // Measure the path, not the rate limit: the last reload is older
        // than the least time between reloads.
        eventually("the down interval to pass", down_interval * 2, || {
            last_reload.elapsed() > down_interval
        })
        .await;
        let addr = format!("127.0.0.1:{}", s.ports[i]);
        let from = seen.lock().expect("test step").len();
        if let Some(b) = backends[i].take() {
            b.stop();
        }
        eventually("the down to be reloaded", Duration::from_secs(10), || {
            seen.lock().expect("test step")[from..]
                .iter()
                .any(|e| matches!(e.kind, EventKind::Reload { .. }))
        })
        .await;
        let ev = seen.lock().expect("test step")[from..].to_vec();
        let probe = ev
            .iter()
            .position(|e| e.peer == addr && matches!(e.kind, EventKind::ProbeDown { .. }))
            .expect("the deciding probe");
        let render = ev
            .iter()
            .position(|e| matches!(e.kind, EventKind::Render { .. }))
            .expect("a render");
        let reload = ev
            .iter()
            .position(|e| matches!(e.kind, EventKind::Reload { .. }))
            .expect("a reload");
        // The order: the deciding probe, the render, the reload, at once.
        assert!(probe < render && render < reload, "{ev:?}");
        assert_eq!(ev[render].peer, addr, "{ev:?}");
        assert!(
            matches!(
                &ev[render].kind,
                EventKind::Render {
                    given: Some(NginxGiven::Down),
                    timing: Timing::AtOnce,
                    ..
                }
            ),
            "{ev:?}"
        );
        let EventKind::Reload {
            timing, took_ms, ..
        } = &ev[reload].kind
        else {
            unreachable!("found as a reload");
        };
        assert_eq!(*timing, Timing::AtOnce, "{ev:?}");
        // nginx's new workers serve without it (and the ones down before).
        for (status, upstream, body) in spray(s.nginx.addr(), 15).await {
            assert_eq!(status, 200);
            for gone in &s.ports[..=i] {
                let gone = format!("127.0.0.1:{gone}");
                assert!(!upstream.contains(&gone), "nginx tried {gone}: {upstream}");
            }
            assert!(!names[..=i].contains(&body.as_str()), "{body}");
        }
        let total = ev[reload].at - ev[probe].at;
        let rendered = ev[render].at - ev[probe].at;
        println!(
            "down-to-nginx {}: deciding probe -> new workers serving without {addr}: {} ms (render + nginx -t {} ms, reload + verify {took_ms} ms)",
            i + 1,
            total.as_millis(),
            rendered.as_millis()
        );
        figures.push(total);
        last_reload = ev[reload].at;
    }
    figures.sort();
    println!(
        "down-to-nginx median of {}: {} ms",
        figures.len(),
        figures[figures.len() / 2].as_millis()
    );
    drop(backends);
    s.vigil.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_source_reloader_gives_the_new_generation_or_the_error_at_its_line() {
    let s = setup("weight=1").await;
    let reloader = s.vigil.source_reloader();
    assert_eq!(s.vigil.checker().registry().generation(), 1);
    write_src(&s.src, &s.ports, "weight=2", "");
    let (generation, summary) = reloader.reload().expect("a good source reloads");
    assert_eq!(generation, 2);
    assert_eq!(summary.kept, s.ports.len());
    assert_eq!(s.vigil.checker().registry().generation(), 2);
    // A bad source: the error names the file and line; nothing changes.
    std::fs::write(
        &s.src,
        "upstream app {\n    server 127.0.0.1:1 weight=0;\n}\n",
    )
    .expect("test step");
    let err = reloader
        .reload()
        .expect_err("weight=0 is refused")
        .to_string();
    let at = format!("{}:2:", s.src.display());
    assert!(err.contains(&at) && err.contains("weight"), "{err}");
    assert_eq!(s.vigil.checker().registry().generation(), 2);
    s.vigil.shutdown().await;
}
