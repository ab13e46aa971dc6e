//! The scheduler in paused time, with a scripted prober: rise/fall,
//! initial state, spread and jitter bounds, no overlap, the global cap,
//! dedup, and reload.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use vigil_checker::probe::{FailureKind, ProbeFuture};
use vigil_checker::{Checker, CheckerOptions, ProbeFailure, Prober, Target};
use vigil_core::event::EventKind;
use vigil_core::health::ProbePhase;
use vigil_core::registry::Registry;

use crate::support::{load, registry};

/// Answers from a script per address (then `default`), after `delay`.
#[derive(Default)]
struct Scripted {
    script: Mutex<HashMap<SocketAddr, VecDeque<bool>>>,
    default_ok: bool,
    delay: Duration,
    starts: Mutex<Vec<(SocketAddr, Instant)>>,
    in_flight: Mutex<HashMap<SocketAddr, usize>>,
    max_per_target: AtomicUsize,
    total: AtomicUsize,
    max_total: AtomicUsize,
}

impl Scripted {
    fn new(default_ok: bool, delay: Duration) -> Arc<Self> {
        Arc::new(Self {
            default_ok,
            delay,
            ..Self::default()
        })
    }

    fn script(&self, addr: &str, results: &[bool]) {
        self.script.lock().expect("test step").insert(
            addr.parse().expect("test step"),
            results.iter().copied().collect(),
        );
    }

    fn starts_of(&self, addr: &str) -> Vec<Instant> {
        let a: SocketAddr = addr.parse().expect("test step");
        self.starts
            .lock()
            .expect("test step")
            .iter()
            .filter(|(x, _)| *x == a)
            .map(|(_, t)| *t)
            .collect()
    }

    fn probes(&self) -> usize {
        self.starts.lock().expect("test step").len()
    }
}

impl Prober for Scripted {
    fn probe<'a>(&'a self, target: &'a Target) -> ProbeFuture<'a> {
        Box::pin(async move {
            let addr = target.addr;
            self.starts
                .lock()
                .expect("test step")
                .push((addr, Instant::now()));
            let n = {
                let mut m = self.in_flight.lock().expect("test step");
                let n = m.entry(addr).or_default();
                *n += 1;
                *n
            };
            self.max_per_target.fetch_max(n, Ordering::SeqCst);
            let total = self.total.fetch_add(1, Ordering::SeqCst) + 1;
            self.max_total.fetch_max(total, Ordering::SeqCst);
            tokio::time::sleep(self.delay).await;
            self.total.fetch_sub(1, Ordering::SeqCst);
            *self
                .in_flight
                .lock()
                .expect("test step")
                .get_mut(&addr)
                .expect("test step") -= 1;
            let ok = self
                .script
                .lock()
                .expect("test step")
                .get_mut(&addr)
                .and_then(|q| q.pop_front())
                .unwrap_or(self.default_ok);
            if ok {
                Ok("HTTP 200".into())
            } else {
                Err(ProbeFailure::new(
                    ProbePhase::FirstByte,
                    FailureKind::Timeout,
                    "scripted failure",
                ))
            }
        })
    }
}

fn start(
    r: &Arc<Registry>,
    clock: &Arc<dyn vigil_core::Clock>,
    p: &Arc<Scripted>,
    opts: CheckerOptions,
) -> Checker {
    Checker::with_prober(
        r.clone(),
        clock.clone(),
        CheckerOptions {
            seed: Some(7),
            ..opts
        },
        p.clone(),
    )
    .expect("checker")
}

fn routable(r: &Registry, upstream: &str, i: usize) -> bool {
    r.get(upstream).expect("test step").peers()[i].is_routable()
}

#[tokio::test(start_paused = true)]
async fn rise_and_fall_count_consecutive_results_through_the_scheduler() {
    let (r, events, clock) = registry(
        "upstream u { server 127.0.0.1:9001; check interval=1000 rise=2 fall=3 timeout=500; }",
    );
    let p = Scripted::new(true, Duration::ZERO);
    p.script(
        "127.0.0.1:9001",
        &[
            true, true, false, false, true, false, false, false, true, true,
        ],
    );
    assert!(
        !routable(&r, "u", 0),
        "default_down: down before any result"
    );
    let _c = start(&r, &clock, &p, CheckerOptions::default());
    tokio::time::sleep(Duration::from_millis(10_500)).await;
    assert!(p.probes() >= 10);
    let kinds: Vec<(String, u32)> = events
        .since(0, 100)
        .events
        .iter()
        .map(|e| match &e.kind {
            EventKind::ProbeUp { streak, .. } => ("up".to_string(), *streak),
            EventKind::ProbeDown { streak, detail } => {
                assert_eq!(detail, "first_byte: scripted failure (0 ms)");
                ("down".to_string(), *streak)
            }
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    // up after 2 passes; the pass at #5 resets the fall streak, so down
    // comes at #8 (3 in a row); up again after 2 passes (#10).
    assert_eq!(
        kinds,
        vec![("up".into(), 2), ("down".into(), 3), ("up".into(), 2)]
    );
    assert!(routable(&r, "u", 0));
}

#[tokio::test(start_paused = true)]
async fn initial_state_follows_default_down_and_initial() {
    let (r, _e, clock) = registry(
        "upstream a { server 127.0.0.1:9001; check interval=1000 rise=2 fall=2 timeout=500 default_down=false; }
         upstream b { server 127.0.0.1:9002; check interval=1000 rise=2 fall=2 timeout=500 initial=first-result; }
         upstream c { server 127.0.0.1:9003; check interval=1000 rise=2 fall=2 timeout=500; }",
    );
    assert!(routable(&r, "a", 0));
    assert!(routable(&r, "b", 0));
    assert!(!routable(&r, "c", 0));
    let p = Scripted::new(false, Duration::ZERO);
    let _c = start(&r, &clock, &p, CheckerOptions::default());
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    // One failure each: `a` needs fall=2, `b` is decided by its first result.
    assert!(routable(&r, "a", 0));
    assert!(!routable(&r, "b", 0));
    assert!(!routable(&r, "c", 0));
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert!(!routable(&r, "a", 0));
}

#[tokio::test(start_paused = true)]
async fn first_probe_is_spread_over_the_interval_and_jitter_stays_in_bounds() {
    let mut text = String::new();
    for i in 0..20 {
        text.push_str(&format!(
            "upstream u{i} {{ server 127.0.0.1:{}; check interval=1000 jitter=300 timeout=500; }}\n",
            9100 + i
        ));
    }
    let (r, _e, clock) = registry(&text);
    let p = Scripted::new(true, Duration::ZERO);
    let t0 = Instant::now();
    let _c = start(&r, &clock, &p, CheckerOptions::default());
    tokio::time::sleep(Duration::from_secs(20)).await;
    let mut firsts = Vec::new();
    let mut gaps = Vec::new();
    for i in 0..20 {
        let starts = p.starts_of(&format!("127.0.0.1:{}", 9100 + i));
        assert!(starts.len() >= 14, "{}", starts.len());
        let first = starts[0] - t0;
        assert!(
            first < Duration::from_millis(1000),
            "first probe at {first:?}"
        );
        firsts.push(first);
        for w in starts.windows(2) {
            let gap = w[1] - w[0];
            assert!(
                gap >= Duration::from_millis(1000) && gap <= Duration::from_millis(1300),
                "gap {gap:?} outside interval + [0, jitter]"
            );
            gaps.push(gap);
        }
    }
    firsts.sort();
    firsts.dedup();
    assert!(firsts.len() > 15, "first probes in lockstep: {firsts:?}");
    assert!(gaps.iter().any(|g| *g > Duration::from_millis(1150)));
    assert!(gaps.iter().any(|g| *g < Duration::from_millis(1150)));
}

#[tokio::test(start_paused = true)]
async fn a_slow_target_never_has_two_probes_in_flight_and_the_cap_holds() {
    let mut text =
        String::from("upstream slow { server 127.0.0.1:9001; check interval=1000 timeout=500; }\n");
    for i in 0..10 {
        text.push_str(&format!(
            "upstream u{i} {{ server 127.0.0.1:{}; check interval=1000 timeout=500; }}\n",
            9200 + i
        ));
    }
    let (r, _e, clock) = registry(&text);
    // The scripted probe takes 2.5 intervals (a stuck probe the timeout
    // would normally cut): the next one waits for it, none piles up.
    let p = Scripted::new(true, Duration::from_millis(2_500));
    let _c = start(
        &r,
        &clock,
        &p,
        CheckerOptions {
            max_concurrent: 3,
            ..CheckerOptions::default()
        },
    );
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(p.max_per_target.load(Ordering::SeqCst), 1);
    assert_eq!(p.max_total.load(Ordering::SeqCst), 3, "global cap");
    let starts = p.starts_of("127.0.0.1:9001");
    assert!(starts.len() >= 3);
    for w in starts.windows(2) {
        assert!(w[1] - w[0] >= Duration::from_millis(2_500));
    }
}

#[tokio::test(start_paused = true)]
async fn upstreams_naming_the_same_server_and_check_share_one_probe() {
    let text = "upstream a { server 127.0.0.1:9001; server 127.0.0.1:9002; check interval=1000 timeout=500 rise=1 fall=1; }
                upstream b { server 127.0.0.1:9001; check interval=1000 timeout=500 rise=1 fall=1; }
                upstream c { server 127.0.0.1:9001; check interval=2000 timeout=500 rise=1 fall=1; }
                upstream d { server 127.0.0.1:9003 weight=2; check interval=1000 timeout=500 port=9001 rise=1 fall=1; }";
    let (r, _e, clock) = registry(text);
    let p = Scripted::new(true, Duration::ZERO);
    let c = start(&r, &clock, &p, CheckerOptions::default());
    // a+b+d share 127.0.0.1:9001 with one definition; c's interval differs.
    assert_eq!(c.targets(), 3);
    tokio::time::sleep(Duration::from_millis(4_100)).await;
    let n = p.starts_of("127.0.0.1:9001").len();
    assert!(
        (6..=8).contains(&n),
        "{n} probes: 4-5 from the shared loop + 2-3 from c's"
    );
    for (u, i) in [("a", 0), ("b", 0), ("c", 0), ("d", 0), ("a", 1)] {
        let v = r.get(u).expect("test step").peers()[i].health().view();
        assert!(
            v.decided && v.ok_streak >= 1,
            "{u}[{i}] got the shared result"
        );
    }
    let off = start(
        &r,
        &clock,
        &p,
        CheckerOptions {
            dedup: false,
            ..CheckerOptions::default()
        },
    );
    assert_eq!(off.targets(), 5, "dedup off: one probe per server line");
}

#[tokio::test(start_paused = true)]
async fn reload_keeps_unchanged_targets_and_their_streaks() {
    let text = "upstream a { server 127.0.0.1:9001; server 127.0.0.1:9002; check interval=1000 timeout=500 rise=3 fall=3; }";
    let (r, events, clock) = registry(text);
    let p = Scripted::new(true, Duration::ZERO);
    let c = start(&r, &clock, &p, CheckerOptions::default());
    while p.starts_of("127.0.0.1:9001").len() < 2 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(10)).await;
    let before = r.get("a").expect("test step").peers()[0]
        .health()
        .view()
        .ok_streak;
    assert_eq!(before, 2);
    let text2 = "upstream a { server 127.0.0.1:9001; server 127.0.0.1:9003; check interval=1000 timeout=500 rise=3 fall=3; }";
    let r2 = Arc::new(Registry::build(
        &load(text2),
        Some(&r),
        events,
        clock.clone(),
    ));
    let s = c.update(r2.clone()).expect("test step");
    assert_eq!((s.kept, s.started, s.stopped), (1, 1, 1));
    assert_eq!(
        r2.get("a").expect("test step").peers()[0]
            .health()
            .view()
            .ok_streak,
        2
    );
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    // The kept loop went on writing into the new registry: rise reached.
    assert!(r2.get("a").expect("test step").peers()[0].is_routable());
    let n9002 = p.starts_of("127.0.0.1:9002").len();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        p.starts_of("127.0.0.1:9002").len(),
        n9002,
        "removed target stopped"
    );
    assert!(p.starts_of("127.0.0.1:9003").len() >= 3);
    c.shutdown();
    let n = p.probes();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(p.probes(), n, "shutdown stops every loop");
}

#[tokio::test(start_paused = true)]
async fn a_recovery_probe_runs_when_the_exclusion_ends_not_at_the_next_interval() {
    use vigil_core::{Clock, ManualClock, RequestFacts, RetryPolicy, SelectKey, TransportFailure};
    let clock = Arc::new(ManualClock::at(1_000));
    let dyn_clock: Arc<dyn vigil_core::Clock> = clock.clone();
    let events = Arc::new(vigil_core::event::EventBus::default());
    let r = Arc::new(Registry::build(
        &load(
            "upstream u { server 127.0.0.1:9001 max_fails=1 fail_timeout=2s; server 127.0.0.1:9002;
               passive_recovery probe;
               check interval=30000 rise=1 fall=1 timeout=500 default_down=false; }",
        ),
        None,
        events,
        dyn_clock.clone(),
    ));
    let p = Scripted::new(true, Duration::ZERO);
    let _c = start(&r, &dyn_clock, &p, CheckerOptions::default());
    // Past the first (spread) probe of both targets.
    tokio::time::sleep(Duration::from_secs(31)).await;
    clock.advance(Duration::from_secs(31));
    let before = p.starts_of("127.0.0.1:9001").len();

    // A request fails on the first server: excluded for fail_timeout (2 s).
    let up = r.get("u").expect("u").clone();
    let mut sel = up.begin(
        SelectKey::None,
        RetryPolicy::default(),
        RequestFacts::default(),
        clock.now(),
    );
    loop {
        let g = up.select(&mut sel, clock.now()).expect("peer");
        if g.peer().id().0 == 0 {
            let failure = TransportFailure {
                class: vigil_core::FailureClass::Error,
                request_sent: false,
                cached_connection: false,
            };
            let _ = sel.on_failure(g, failure, clock.now());
            break;
        }
        drop(g);
        sel = up.begin(
            SelectKey::None,
            RetryPolicy::default(),
            RequestFacts::default(),
            clock.now(),
        );
    }
    assert!(!up.peers()[0].is_routable() || !up.probes_wanted().is_empty());
    let excluded_at = Instant::now();
    // The loop hears of the exclusion and plans its probe for its end.
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(p.starts_of("127.0.0.1:9001").len(), before, "no probe yet");
    // Core's (manual) clock reaches the end of the exclusion with tokio's;
    // the probe comes then, 28 s before the interval would have.
    clock.advance(Duration::from_millis(2_000));
    tokio::time::sleep(Duration::from_millis(2_090)).await;
    let starts = p.starts_of("127.0.0.1:9001");
    assert_eq!(starts.len(), before + 1, "one recovery probe: {starts:?}");
    let waited = starts[before] - excluded_at;
    assert!(
        waited >= Duration::from_millis(2_000) && waited < Duration::from_millis(2_100),
        "probed {waited:?} after the exclusion began"
    );
    assert!(
        up.probes_wanted().is_empty(),
        "the passing probe readmitted it"
    );
}

#[tokio::test(start_paused = true)]
async fn the_start_round_probes_up_to_rise_times_back_to_back_and_stops_at_a_failure() {
    let (r, _e, clock) = registry(
        "upstream u { server 127.0.0.1:9001; server 127.0.0.1:9002; check interval=30000 rise=3 fall=2 timeout=500; }
         upstream v { server 127.0.0.1:9003; check interval=30000 rise=2 fall=2 timeout=500 default_down=false; }",
    );
    let p = Scripted::new(true, Duration::from_millis(10));
    p.script("127.0.0.1:9002", &[true, false]);
    assert!(!routable(&r, "u", 0));
    let c = start(
        &r,
        &clock,
        &p,
        CheckerOptions {
            start_round: true,
            ..CheckerOptions::default()
        },
    );
    assert!(c.start_round(Duration::from_millis(500)).await);
    // rise=3 passes back to back: up, long before the first interval ends.
    assert!(routable(&r, "u", 0));
    assert_eq!(p.starts_of("127.0.0.1:9001").len(), 3);
    // A pass, then a failure: the round stops there and the peer stays down.
    assert!(!routable(&r, "u", 1));
    assert_eq!(p.starts_of("127.0.0.1:9002").len(), 2);
    // A peer that does not start down needs one probe.
    assert_eq!(p.starts_of("127.0.0.1:9003").len(), 1);
    assert!(routable(&r, "v", 0));
    // Asked again: done at once; the regular schedule follows.
    assert!(c.start_round(Duration::ZERO).await);
    tokio::time::sleep(Duration::from_millis(30_000)).await;
    assert!(p.starts_of("127.0.0.1:9001").len() >= 4);
}

#[tokio::test(start_paused = true)]
async fn the_start_round_is_bounded_and_off_by_default() {
    let (r, _e, clock) = registry(
        "upstream u { server 127.0.0.1:9001; check interval=30000 rise=2 fall=2 timeout=500; }",
    );
    let slow = Scripted::new(true, Duration::from_millis(2_000));
    let c = start(
        &r,
        &clock,
        &slow,
        CheckerOptions {
            start_round: true,
            ..CheckerOptions::default()
        },
    );
    assert!(!c.start_round(Duration::from_millis(500)).await);
    assert!(!routable(&r, "u", 0));
    // Without the option there is no round to wait for, and no probe yet.
    let (r2, _e2, clock2) = registry(
        "upstream u { server 127.0.0.1:9002; check interval=30000 rise=2 fall=2 timeout=500; }",
    );
    let p = Scripted::new(true, Duration::from_millis(10));
    let c2 = start(&r2, &clock2, &p, CheckerOptions::default());
    assert!(c2.start_round(Duration::from_millis(500)).await);
    assert!(!routable(&r2, "u", 0));
}
