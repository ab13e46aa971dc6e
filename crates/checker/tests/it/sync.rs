//! The sync loop in paused time with a fake nginx: debounce, rate limit,
//! rollback on a failed test, retried reloads, no surprise `down`.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use vigil_checker::nginx::control::NginxFuture;
use vigil_checker::nginx::{
    source, Annotator, Guard, Nginx, Snapshot, SyncError, SyncOptions, SyncStatus, Syncer,
};
use vigil_core::api::{self, NginxGiven, NginxView};
use vigil_core::clock::Timestamp;
use vigil_core::config::literal_resolver;
use vigil_core::event::EventBus;
use vigil_core::health::ProbeReport;
use vigil_core::peer::PeerId;
use vigil_core::registry::Registry;
use vigil_core::{Clock, ManualClock};

#[derive(Default)]
struct FakeNginx {
    tests: AtomicUsize,
    test_fails: AtomicBool,
    reloads: Mutex<Vec<Instant>>,
    reload_failures_left: AtomicUsize,
}

impl Nginx for FakeNginx {
    fn test(&self) -> NginxFuture<'_> {
        Box::pin(async move {
            self.tests.fetch_add(1, Ordering::SeqCst);
            if self.test_fails.load(Ordering::SeqCst) {
                return Err(SyncError::TestFailed {
                    command: "nginx -t".into(),
                    output: "invalid parameter".into(),
                });
            }
            Ok(())
        })
    }

    fn reload(&self) -> NginxFuture<'_> {
        Box::pin(async move {
            self.reloads.lock().expect("test step").push(Instant::now());
            if self
                .reload_failures_left
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
            {
                return Err(SyncError::ReloadUnverified("no new worker".into()));
            }
            Ok(())
        })
    }
}

struct Rig {
    dir: tempfile::TempDir,
    registry: Arc<Registry>,
    clock: Arc<dyn Clock>,
    annotator: Annotator,
    nginx: Arc<FakeNginx>,
    status: Arc<Mutex<SyncStatus>>,
    wake: Arc<Notify>,
    cancel: CancellationToken,
}

const SRC: &str = "upstream app {\n    server 127.0.0.1:9001;\n    server 127.0.0.1:9002;\n    server 127.0.0.1:9003;\n    check interval=1000 rise=2 fall=2 timeout=500;\n}\n";

async fn rig(nginx: FakeNginx) -> Rig {
    let dir = tempfile::tempdir().expect("test step");
    let src = dir.path().join("src.conf");
    std::fs::write(&src, SRC).expect("test step");
    let out = dir.path().join("out");
    std::fs::create_dir(&out).expect("test step");
    // As `vigil check` loads it: the guard in core's rules.
    let mut s = source::load(&src, None, &literal_resolver).expect("test step");
    Guard::default().apply(&mut s.config);
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::at(1_000));
    let registry = Arc::new(Registry::build(
        &s.config,
        None,
        Arc::new(EventBus::default()),
        clock.clone(),
    ));
    let snapshot = Arc::new(ArcSwap::from_pointee(Snapshot {
        blocks: s.blocks,
        registry: registry.clone(),
        clock: clock.clone(),
    }));
    let mut o = SyncOptions::new(out);
    o.debounce = Duration::from_millis(500);
    o.max_delay = Duration::from_secs(3);
    o.min_reload_interval = Duration::from_secs(5);
    o.poll = Duration::from_millis(200);
    let nginx = Arc::new(nginx);
    let status = Arc::new(Mutex::new(SyncStatus::default()));
    let annotator = Annotator::new(snapshot.clone(), status.clone());
    let mut syncer = Syncer::new(o, nginx.clone(), snapshot, status.clone()).expect("test step");
    syncer.converge(true).await.expect("test step");
    syncer.reload().await.expect("test step");
    let wake = Arc::new(Notify::new());
    let cancel = CancellationToken::new();
    tokio::spawn(syncer.run(wake.clone(), cancel.clone(), false));
    Rig {
        dir,
        registry,
        clock,
        annotator,
        nginx,
        status,
        wake,
        cancel,
    }
}

impl Rig {
    fn file(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("out/app.conf")).expect("test step")
    }

    fn probe(&self, peer: u32, ok: bool) {
        let up = self.registry.get("app").expect("test step");
        let t = up.record_probe(
            PeerId(peer),
            ProbeReport {
                ok,
                phase: None,
                latency: Duration::ZERO,
                detail: String::new(),
                at: Timestamp(1),
            },
        );
        if t.is_some() {
            self.wake.notify_one();
        }
    }

    /// What the admin API says nginx was given for server `i`.
    fn nginx(&self, i: usize) -> NginxView {
        let up = self.registry.get("app").expect("test step");
        let mut view = api::upstream_view(up, &*self.clock, self.clock.now());
        self.annotator.annotate(&mut view);
        view.peers[i].nginx.clone().expect("annotated")
    }

    fn reloads(&self) -> Vec<Instant> {
        self.nginx.reloads.lock().expect("test step").clone()
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

fn marked(text: &str) -> usize {
    text.matches(" down; # vigil").count()
}

async fn settle(d: Duration) {
    tokio::time::sleep(d).await;
}

/// Wait (paused time, in 100 ms steps, at most a minute) until `f` holds.
async fn until(f: impl Fn() -> bool) {
    for _ in 0..600 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("condition not reached within a minute of paused time");
}

#[tokio::test(start_paused = true)]
async fn startup_renders_the_source_and_first_passes_mark_nothing() {
    let r = rig(FakeNginx::default()).await;
    assert_eq!(marked(&r.file()), 0);
    assert!(r.file().contains("    server 127.0.0.1:9001;\n"));
    assert_eq!(r.reloads().len(), 1, "one reload at startup");
    // default_down peers: in check mode the first result decides, so one
    // pass keeps a server up (no surprise down) ...
    for p in 0..2 {
        r.probe(p, true);
    }
    // ... and a first failure marks it (it was never proven).
    r.probe(2, false);
    settle(Duration::from_secs(2)).await;
    assert_eq!(marked(&r.file()), 1);
    assert!(r.file().contains("server 127.0.0.1:9003 down;"));
    // After that, fall=2 as configured: one failure of a server that is up
    // does not mark it, the second does.
    r.probe(0, false);
    settle(Duration::from_secs(2)).await;
    assert_eq!(marked(&r.file()), 1);
    r.probe(0, false);
    settle(Duration::from_secs(7)).await;
    assert_eq!(marked(&r.file()), 2);
}

#[tokio::test(start_paused = true)]
async fn a_burst_of_transitions_gives_one_reload_after_the_debounce() {
    let r = rig(FakeNginx::default()).await;
    for p in 0..3 {
        r.probe(p, true);
        r.probe(p, true);
    }
    settle(Duration::from_secs(6)).await;
    let base = r.reloads().len();
    let t0 = Instant::now();
    for p in 0..2 {
        r.probe(p, false);
        settle(Duration::from_millis(100)).await;
        r.probe(p, false);
        settle(Duration::from_millis(100)).await;
    }
    settle(Duration::from_secs(3)).await;
    let reloads = r.reloads();
    assert_eq!(reloads.len(), base + 1, "one reload for the burst");
    assert!(
        reloads[base] - t0 >= Duration::from_millis(500),
        "after the quiet period"
    );
    assert_eq!(marked(&r.file()), 2);
    assert_eq!(r.status.lock().expect("test step").marked.len(), 2);
    // Another change right away waits for the rate limit.
    r.probe(0, true);
    r.probe(0, true);
    settle(Duration::from_secs(10)).await;
    let again = r.reloads();
    assert_eq!(again.len(), base + 2);
    assert!(again[base + 1] - reloads[base] >= Duration::from_secs(5));
    assert_eq!(marked(&r.file()), 1);
}

#[tokio::test(start_paused = true)]
async fn every_server_failing_keeps_the_least_bad_one_up() {
    let r = rig(FakeNginx::default()).await;
    for p in 0..3 {
        r.probe(p, false);
    }
    // :9001 fails once more: of the three, :9002 and :9003 have the better
    // record (ties go to config order), and --min-healthy 1 keeps one.
    r.probe(0, false);
    settle(Duration::from_secs(3)).await;
    assert_eq!(marked(&r.file()), 2, "{}", r.file());
    assert!(
        r.file().contains(
            "    server 127.0.0.1:9002; # vigil: failing its checks, kept by max_ejected (3 of 3 would be ejected, at most 2 may be)\n"
        ),
        "{}",
        r.file()
    );
    let st = r.status.lock().expect("test step").clone();
    assert_eq!(st.guarded, vec!["app".to_string()]);
    assert_eq!(
        st.kept,
        vec![("app".to_string(), "server 127.0.0.1:9002".to_string())]
    );
}

#[tokio::test(start_paused = true)]
async fn the_api_says_what_nginx_was_given_waiting_failed_and_loaded() {
    let r = rig(FakeNginx::default()).await;
    let as_written = NginxView {
        given: Some(NginxGiven::AsWritten),
        given_note: None,
        decided: NginxGiven::AsWritten,
        decided_note: None,
        pending: None,
    };
    assert_eq!(
        r.nginx(1),
        as_written,
        "the startup reload loaded the source"
    );
    // Decided down, before the debounce ends: nginx still has it up.
    r.nginx.reload_failures_left.store(1, Ordering::SeqCst);
    r.probe(1, false);
    let waiting = r.nginx(1);
    assert_eq!(waiting.given, Some(NginxGiven::AsWritten));
    assert_eq!(waiting.decided, NginxGiven::Down);
    assert_eq!(
        waiting.decided_note.as_deref(),
        Some("down by active check")
    );
    assert_eq!(waiting.pending.as_deref(), Some("waiting_for_reload"));
    // The reload fails: still up in nginx, and said so.
    until(|| r.reloads().len() == 2).await;
    assert_eq!(r.nginx(1).pending.as_deref(), Some("reload_failed"));
    assert_eq!(r.nginx(1).given, Some(NginxGiven::AsWritten));
    // The retry succeeds: nginx has it down.
    until(|| r.reloads().len() == 3).await;
    let down = r.nginx(1);
    assert_eq!(down.given, Some(NginxGiven::Down));
    assert_eq!(down.pending, None);
    assert_eq!(r.nginx(0), as_written);
    // explain leads with it.
    let up = r.registry.get("app").expect("test step");
    let mut view = api::upstream_view(up, &*r.clock, r.clock.now());
    r.annotator.annotate(&mut view);
    let sentences = api::explain(&view, &view.peers[1], &[]);
    assert!(
        sentences[0].starts_with(
            "In nginx: 127.0.0.1:9002 is marked `down` in app.conf (down by active check)"
        ),
        "{sentences:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_rejected_render_is_rolled_back_and_not_reloaded() {
    let r = rig(FakeNginx::default()).await;
    let before = r.file();
    let reloads = r.reloads().len();
    r.nginx.test_fails.store(true, Ordering::SeqCst);
    r.probe(0, false);
    settle(Duration::from_secs(3)).await;
    assert_eq!(r.file(), before, "previous file restored");
    let prev = std::fs::read_to_string(r.dir.path().join("out/app.conf.prev")).expect("test step");
    assert_eq!(prev, before);
    let st = r.status.lock().expect("test step").clone();
    assert_eq!(st.test_failures, 1, "the same render is not retried");
    assert!(st.last_error.expect("test step").contains("rolled back"));
    assert_eq!(r.reloads().len(), reloads);
    assert!(!Path::new(&r.dir.path().join("out/.app.conf.tmp")).exists());
}

#[tokio::test(start_paused = true)]
async fn a_failed_reload_is_retried_with_backoff() {
    let r = rig(FakeNginx::default()).await;
    r.nginx.reload_failures_left.store(2, Ordering::SeqCst);
    let base = r.reloads().len();
    r.probe(0, false);
    settle(Duration::from_secs(30)).await;
    let reloads = r.reloads();
    assert_eq!(reloads.len(), base + 3, "two failures, then success");
    let gaps: Vec<Duration> = reloads[base..].windows(2).map(|w| w[1] - w[0]).collect();
    assert!(
        gaps[0] >= Duration::from_secs(5),
        "rate limit also spaces retries"
    );
    assert!(gaps[1] >= gaps[0]);
    let st = r.status.lock().expect("test step").clone();
    assert_eq!(st.reload_failures, 2);
    assert!(!st.reload_pending);
}

#[tokio::test(start_paused = true)]
async fn an_admin_down_or_drain_is_rendered_and_undone() {
    let r = rig(FakeNginx::default()).await;
    let up = r.registry.get("app").expect("app").clone();
    up.set_admin(PeerId(1), vigil_core::peer::AdminState::Drain, Timestamp(1));
    r.wake.notify_one();
    settle(Duration::from_secs(6)).await;
    assert!(
        r.file().contains("server 127.0.0.1:9002 down;"),
        "{}",
        r.file()
    );
    assert_eq!(marked(&r.file()), 1);
    up.set_admin(PeerId(1), vigil_core::peer::AdminState::Up, Timestamp(2));
    r.wake.notify_one();
    settle(Duration::from_secs(6)).await;
    assert_eq!(marked(&r.file()), 0, "back up: no mark");
}
