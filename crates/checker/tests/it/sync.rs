//! The sync loop in paused time with a fake nginx: a server leaving nginx
//! reloaded at once, one coming back after the debounce, bursts batched,
//! no reload storm from a flapping server, rate limits, rollback on a
//! failed test, retried reloads, no surprise `down`, and the events of it.

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
use vigil_config::literal_resolver;
use vigil_core::api::{self, NginxGiven, NginxView};
use vigil_core::clock::Timestamp;
use vigil_core::event::{EventBus, EventKind, Timing};
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
    events: Arc<EventBus>,
    wake: Arc<Notify>,
    cancel: CancellationToken,
}

const DEBOUNCE: Duration = Duration::from_millis(500);
const MIN_RELOAD: Duration = Duration::from_secs(5);
const DOWN_RELOAD: Duration = Duration::from_secs(1);

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
    let events = Arc::new(EventBus::default());
    let registry = Arc::new(Registry::build(
        &s.config,
        None,
        events.clone(),
        clock.clone(),
    ));
    let snapshot = Arc::new(ArcSwap::from_pointee(Snapshot {
        blocks: s.blocks,
        registry: registry.clone(),
        clock: clock.clone(),
    }));
    let mut o = SyncOptions::new(out);
    o.debounce = DEBOUNCE;
    o.max_delay = Duration::from_secs(3);
    o.min_reload_interval = MIN_RELOAD;
    o.down_reload_interval = DOWN_RELOAD;
    o.poll = Duration::from_millis(200);
    let nginx = Arc::new(nginx);
    let status = Arc::new(Mutex::new(SyncStatus::default()));
    let annotator = Annotator::new(snapshot.clone(), status.clone());
    let mut syncer = Syncer::new(o, nginx.clone(), snapshot, status.clone())
        .expect("test step")
        .with_events(events.clone());
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
        events,
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

    /// Every event on the bus: (peer, kind).
    fn events(&self) -> Vec<(String, EventKind)> {
        self.events
            .since(0, usize::MAX)
            .events
            .into_iter()
            .map(|e| (e.peer.to_string(), e.kind))
            .collect()
    }

    /// The timing of every verified reload, oldest first.
    fn reload_timings(&self) -> Vec<Timing> {
        self.events()
            .into_iter()
            .filter_map(|(_, k)| match k {
                EventKind::Reload { timing, .. } => Some(timing),
                _ => None,
            })
            .collect()
    }

    /// Every server proven up (rise=2), and the loop idle again.
    async fn all_up(&self) {
        for p in 0..3 {
            self.probe(p, true);
            self.probe(p, true);
        }
        settle(Duration::from_secs(6)).await;
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
async fn a_server_leaving_nginx_is_reloaded_at_once_and_coming_back_after_the_debounce() {
    let r = rig(FakeNginx::default()).await;
    r.all_up().await;
    let base = r.reloads().len();
    let seen = r.events().len();
    r.probe(1, false);
    settle(Duration::from_millis(200)).await;
    assert_eq!(
        r.reloads().len(),
        base,
        "one failure of fall=2 changes nothing"
    );
    // The deciding probe: rendered, tested and reloaded without waiting for
    // the debounce (nor the 5 s interval: the last reload is older).
    let t0 = Instant::now();
    r.probe(1, false);
    until(|| r.reloads().len() == base + 1).await;
    let at = r.reloads()[base];
    assert!(
        at - t0 < DEBOUNCE,
        "the down reload waited {:?}, the debounce is {DEBOUNCE:?}",
        at - t0
    );
    assert!(r
        .file()
        .contains("server 127.0.0.1:9002 down; # vigil: down by active check"));
    // The events say what was rendered, why, and that it went at once.
    let new: Vec<(String, EventKind)> = r.events().split_off(seen);
    let kinds: Vec<&str> = new.iter().map(|(_, k)| k.name()).collect();
    assert_eq!(kinds, ["probe_down", "render", "reload"], "{new:?}");
    assert_eq!(new[1].0, "127.0.0.1:9002");
    assert_eq!(
        new[1].1,
        EventKind::Render {
            file: "app.conf".into(),
            given: Some(NginxGiven::Down),
            note: "down by active check".into(),
            timing: Timing::AtOnce,
        }
    );
    assert!(
        matches!(&new[2].1, EventKind::Reload { files, timing: Timing::AtOnce, .. } if files == &["app.conf".to_string()]),
        "{new:?}"
    );
    // Coming back waits for the debounce after the last transition, also
    // when the least time between reloads has long passed.
    settle(MIN_RELOAD).await;
    let seen = r.events().len();
    r.probe(1, true);
    let t1 = Instant::now();
    r.probe(1, true);
    until(|| r.reloads().len() == base + 2).await;
    let at = r.reloads()[base + 1];
    assert!(
        at - t1 >= DEBOUNCE,
        "the up reload came {:?} after the transition",
        at - t1
    );
    assert_eq!(marked(&r.file()), 0);
    let new = r.events().split_off(seen);
    assert!(
        new.iter().any(|(p, k)| p == "127.0.0.1:9002"
            && *k
                == EventKind::Render {
                    file: "app.conf".into(),
                    given: Some(NginxGiven::AsWritten),
                    note: "no longer marked `down`".into(),
                    timing: Timing::Debounced,
                }),
        "{new:?}"
    );
    assert_eq!(
        r.reload_timings(),
        [Timing::Startup, Timing::AtOnce, Timing::Debounced]
    );
}

#[tokio::test(start_paused = true)]
async fn a_burst_of_downs_is_batched_and_ups_wait_for_the_reload_interval() {
    let r = rig(FakeNginx::default()).await;
    r.all_up().await;
    let base = r.reloads().len();
    // Two servers go down 100 ms apart: the first at once, the second
    // batched into one reload the least time between reloads later.
    for p in 0..2 {
        r.probe(p, false);
        r.probe(p, false);
        settle(Duration::from_millis(100)).await;
    }
    until(|| r.reloads().len() == base + 2).await;
    settle(Duration::from_secs(2)).await;
    let reloads = r.reloads();
    assert_eq!(
        reloads.len(),
        base + 2,
        "one reload per server, not per probe"
    );
    assert!(reloads[base + 1] - reloads[base] >= DOWN_RELOAD);
    assert_eq!(marked(&r.file()), 2);
    assert_eq!(r.status.lock().expect("test step").marked.len(), 2);
    assert_eq!(
        r.reload_timings()[base..],
        [Timing::AtOnce, Timing::AtOnce],
        "both downs went at once"
    );
    // Both come back right after, 200 ms apart: one reload, after the
    // debounce from the last transition and --reload-min-interval since
    // the last reload.
    r.probe(0, true);
    r.probe(0, true);
    settle(Duration::from_millis(200)).await;
    let last = Instant::now();
    r.probe(1, true);
    r.probe(1, true);
    until(|| r.reloads().len() == base + 3).await;
    settle(Duration::from_secs(10)).await;
    let again = r.reloads();
    assert_eq!(again.len(), base + 3, "one reload for the burst of ups");
    assert!(again[base + 2] - again[base + 1] >= MIN_RELOAD);
    assert!(again[base + 2] - last >= DEBOUNCE);
    assert_eq!(marked(&r.file()), 0);
    assert_eq!(r.reload_timings()[base + 2..], [Timing::Debounced]);
}

#[tokio::test(start_paused = true)]
async fn a_flapping_server_cannot_make_nginx_reload_over_and_over() {
    let r = rig(FakeNginx::default()).await;
    r.all_up().await;
    let base = r.reloads().len();
    // :9001 flaps for 60 s: down (two failures), up (two passes), every
    // 400 ms: 150 transitions.
    let t0 = Instant::now();
    while Instant::now() - t0 < Duration::from_secs(60) {
        for ok in [false, false, true, true] {
            r.probe(0, ok);
            settle(Duration::from_millis(100)).await;
        }
    }
    settle(Duration::from_secs(10)).await;
    let reloads = r.reloads()[base..].to_vec();
    // Taking it out needs it back in nginx first, and it comes back at
    // most once per --reload-min-interval: two reloads per 5 s at most.
    let bound = 2 * (70 / MIN_RELOAD.as_secs() as usize) + 2;
    assert!(
        reloads.len() <= bound,
        "{} reloads for 150 transitions (bound {bound})",
        reloads.len()
    );
    assert!(
        reloads.len() >= 2,
        "the flapping server was taken out at least once"
    );
    let timings = r.reload_timings()[base..].to_vec();
    for (i, w) in reloads.windows(2).enumerate() {
        let gap = w[1] - w[0];
        assert!(gap >= DOWN_RELOAD, "reloads {gap:?} apart");
        if timings[i + 1] == Timing::Debounced {
            assert!(
                gap >= MIN_RELOAD,
                "a debounced reload {gap:?} after the last"
            );
        }
    }
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
    let seen = r.events().len();
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
    let kinds: Vec<&'static str> = r.events()[seen..].iter().map(|(_, k)| k.name()).collect();
    assert_eq!(kinds, ["probe_down", "rollback"], "no render reached nginx");
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
    // The reload takes a server out: retried after the backoff (1 s, 2 s),
    // and the least time between such reloads.
    assert!(gaps[0] >= DOWN_RELOAD, "{gaps:?}");
    assert!(gaps[1] >= 2 * gaps[0], "{gaps:?}");
    let st = r.status.lock().expect("test step").clone();
    assert_eq!(st.reload_failures, 2);
    assert!(!st.reload_pending);
    assert!(st.view().last_failure_unix_ms.is_some());
    let failed: Vec<EventKind> = r
        .events()
        .into_iter()
        .map(|(_, k)| k)
        .filter(|k| k.name() == "reload_failed")
        .collect();
    assert_eq!(failed.len(), 2);
    assert_eq!(
        failed[0],
        EventKind::ReloadFailed {
            files: vec!["app.conf".into()],
            error: "reload not verified: no new worker".into(),
            retry_ms: 1000,
        }
    );
    assert_eq!(
        r.reload_timings()[1..],
        [Timing::Retry],
        "the success after the failures"
    );
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
