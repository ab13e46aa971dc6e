//! Simulated-time tests of the latency rules: time-to-header as core
//! measures it, `eject_stuck`, `eject_slow`, and their interactions with
//! `max_ejected`, recovery, slow start and the round-robin fast path.

use super::rules::{ruled, up_check};
use super::*;
use crate::config::{EjectSlow, EjectStuck, HealthRules, Penalty, Recovery};

pub(super) fn stuck_rules(min_ms: u64) -> HealthRules {
    HealthRules {
        eject_stuck: Some(EjectStuck {
            factor: 3.0,
            min: Duration::from_millis(min_ms),
        }),
        ..HealthRules::default()
    }
}

pub(super) fn slow_rules() -> HealthRules {
    HealthRules {
        eject_slow: Some(EjectSlow {
            factor: 3.0,
            window: Duration::from_secs(10),
            min_requests: 20,
            min: Duration::from_millis(10),
            max: None,
        }),
        ..HealthRules::default()
    }
}

impl Fixture {
    fn advance_us(&self, us: u64) {
        self.clock.advance(Duration::from_micros(us));
    }

    /// One request whose header comes after `us` µs on whichever peer is
    /// picked (`slow(i)` µs for peer i); returns the peer.
    fn answered(&self, us: impl Fn(usize) -> u64) -> Option<usize> {
        let mut sel = self.up.begin(
            SelectKey::None,
            RetryPolicy::default(),
            RequestFacts::default(),
            self.now(),
        );
        let g = self.up.select(&mut sel, self.now()).ok()?;
        let i = g.peer().id().0 as usize;
        self.advance_us(us(i));
        match sel.on_status(g, 200, self.now()) {
            StatusVerdict::PassThrough(g, _) => drop(g),
            StatusVerdict::Retry(_) => panic!("a 200 is passed through"),
        }
        Some(i)
    }
}

#[test]
fn header_time_quantiles_are_measured_to_the_microsecond() {
    let f = ruled(
        vec![srv(1), srv(2)],
        stuck_rules(200),
        None,
        Balancer::RoundRobin,
    );
    assert!(f.up.measures_latency());
    assert_eq!(f.up.header_time_quantile(0.5, f.now()), None, "no samples");
    for _ in 0..19 {
        f.answered(|_| 100);
    }
    assert_eq!(f.up.header_time_quantile(0.5, f.now()), None, "19 < 20");
    f.answered(|_| 100);
    let p50 = f.up.header_time_quantile(0.5, f.now()).expect("20 samples");
    assert!(
        (Duration::from_micros(100)..=Duration::from_micros(113)).contains(&p50),
        "{p50:?}"
    );
    // 100 samples, 5 of them at 40 ms: the p99 is 40 ms (to 12.5%).
    for k in 0..80 {
        f.answered(|_| if k % 16 == 0 { 40_000 } else { 100 });
    }
    let p99 = f.up.header_time_quantile(0.99, f.now()).expect("100");
    assert!(
        (Duration::from_millis(40)..=Duration::from_millis(45)).contains(&p99),
        "{p99:?}"
    );
    // Failures are no samples.
    let before = f.up.header_time_quantile(0.5, f.now());
    for _ in 0..30 {
        let mut sel = f.up.begin(
            SelectKey::None,
            RetryPolicy::default(),
            RequestFacts::default(),
            f.now(),
        );
        let g = f.up.select(&mut sel, f.now()).expect("peer");
        f.advance_us(900_000);
        let _ = sel.on_failure(g, error(), f.now());
        f.advance(20_000);
    }
    assert_eq!(
        f.up.header_time_quantile(0.5, f.now()),
        None,
        "20 s later the window holds nothing (was {before:?})"
    );
}

#[test]
fn plain_nginx_mode_measures_nothing() {
    let f = rr(vec![srv(1), srv(2)]);
    assert!(!f.up.measures_latency());
    for _ in 0..50 {
        f.answered(|_| 100);
    }
    assert_eq!(f.up.header_time_quantile(0.5, f.now()), None);
}

fn servers(n: u16) -> Vec<ServerConfig> {
    (1..=n).map(srv).collect()
}

fn has(f: &Fixture, i: usize, rule: Rule) -> bool {
    f.up.status(f.now())[i]
        .reasons
        .iter()
        .any(|r| r.rule() == rule)
}

fn count(f: &Fixture, name: &str) -> usize {
    f.kinds().iter().filter(|k| **k == name).count()
}

/// Requests (peer `slow` answering in `slow_us`, the others in 1 ms) until
/// `slow` is slow-ejected; returns how many requests it served.
fn until_slow(f: &Fixture, slow: usize, slow_us: u64) -> usize {
    let mut served = 0;
    for _ in 0..2_000 {
        if has(f, slow, Rule::Slow) {
            return served;
        }
        if f.answered(|i| if i == slow { slow_us } else { 1_000 }) == Some(slow) {
            served += 1;
        }
    }
    panic!("peer {slow} never ejected as slow");
}

#[test]
fn with_max_a_tier_of_equally_slow_peers_loses_them_to_max_ejected_only() {
    let mut r = slow_rules();
    if let Some(s) = r.eject_slow.as_mut() {
        s.max = Some(Duration::from_millis(20));
    }
    r.max_ejected = Some(34);
    let f = ruled(servers(3), r, None, Balancer::RoundRobin);
    // Every peer answers in 50 ms: none is an outlier among the others,
    // every one is above max=20ms.
    for _ in 0..200 {
        f.answered(|_| 50_000);
    }
    let slow: Vec<usize> = (0..3).filter(|&i| has(&f, i, Rule::Slow)).collect();
    assert!(!slow.is_empty(), "max ejects where the median cannot");
    match f.reasons(slow[0]).first() {
        Some(Ineligible::Slow { max, figure, .. }) => {
            assert_eq!(*max, Some(Duration::from_millis(20)));
            assert!(*figure >= Duration::from_millis(50), "{figure:?}");
        }
        other => panic!("{other:?}"),
    }
    let text = f
        .events
        .since(0, 1000)
        .events
        .iter()
        .find(|e| e.kind.name() == "slow_ejected")
        .map(|e| e.kind.to_string())
        .expect("an event");
    assert!(text.contains("above eject_slow max=20"), "{text}");
    // max_ejected=34%: one of three may be out at a time; the others keep
    // serving.
    let serving = (0..60)
        .filter_map(|_| f.answered(|_| 50_000))
        .collect::<std::collections::BTreeSet<_>>();
    assert!(serving.len() >= 2, "{serving:?}");
    // Without max the same tier keeps all three.
    let f = ruled(servers(3), slow_rules(), None, Balancer::RoundRobin);
    for _ in 0..200 {
        f.answered(|_| 50_000);
    }
    assert!((0..3).all(|i| !has(&f, i, Rule::Slow)));
}

// === eject_stuck ===

#[test]
fn a_stuck_peer_takes_no_new_requests_until_its_attempt_ends() {
    let f = ruled(servers(3), stuck_rules(200), None, Balancer::RoundRobin);
    let (mut sel, g) = f.hold(0);
    f.advance(200);
    assert!(!has(&f, 0, Rule::Stuck), "at the threshold, not over it");
    f.advance(1);
    match &f.reasons(0)[..] {
        [Ineligible::Stuck {
            waited, threshold, ..
        }] => {
            assert_eq!(*threshold, Duration::from_millis(200));
            assert!(*waited > *threshold);
        }
        other => panic!("{other:?}"),
    }
    for _ in 0..20 {
        assert_ne!(f.get(|_| Be::Ok).1, vec![0], "no new request for peer 0");
    }
    assert_eq!(count(&f, "stuck"), 1, "announced once");
    // The attempt then fails: charged as usual (max_fails=1 excludes it).
    let _ = sel.on_failure(g, error(), f.now());
    assert_eq!(count(&f, "stuck_ended"), 1);
    assert!(f.excluded(0) && !has(&f, 0, Rule::Stuck));
}

#[test]
fn a_stuck_peer_is_back_when_its_header_comes() {
    let f = ruled(servers(2), stuck_rules(200), None, Balancer::RoundRobin);
    let (mut sel, g) = f.hold(1);
    f.advance(500);
    assert!(has(&f, 1, Rule::Stuck));
    assert_eq!(
        f.get(|_| Be::Ok).1,
        vec![0],
        "a pick sees it (and announces it)"
    );
    assert!(!f.up.on_fast_path(), "eject_stuck tiers scan");
    match sel.on_status(g, 200, f.now()) {
        StatusVerdict::PassThrough(g, _) => drop(g),
        StatusVerdict::Retry(_) => panic!(),
    }
    assert!(f.reasons(1).is_empty(), "back at once, nothing charged");
    let picked: Vec<usize> = (0..4).flat_map(|_| f.get(|_| Be::Ok).1).collect();
    assert!(picked.contains(&1));
    // A cancelled attempt (the guard dropped) ends the wait too.
    let (_sel, g) = f.hold(0);
    f.advance(300);
    assert!(has(&f, 0, Rule::Stuck));
    assert_eq!(f.get(|_| Be::Ok).1, vec![1]);
    drop(g);
    assert!(f.reasons(0).is_empty());
    assert_eq!(count(&f, "stuck_ended"), 2);
}

#[test]
fn the_stuck_threshold_follows_k_times_the_recent_p99() {
    let f = ruled(servers(2), stuck_rules(50), None, Balancer::RoundRobin);
    for _ in 0..120 {
        f.answered(|_| 40_000);
    }
    let now = f.up.stuck_now(f.now()).expect("rule");
    let p99 = now.p99.expect("120 samples");
    assert!(p99 >= Duration::from_millis(40), "{p99:?}");
    assert!(
        now.threshold >= Duration::from_millis(120) && now.threshold < Duration::from_millis(136),
        "3 × p99, above min: {:?}",
        now.threshold
    );
    let (_sel, _g) = f.hold(0);
    f.advance(110);
    assert!(!has(&f, 0, Rule::Stuck), "110 ms is under 3 × 40 ms");
    f.advance(30);
    assert!(has(&f, 0, Rule::Stuck));
}

#[test]
fn stuck_peers_count_toward_max_ejected() {
    // Two peers, both stuck: 50% of 2 lets one be ejected, the other stays.
    let mut r = stuck_rules(200);
    r.max_ejected = Some(50);
    let f = ruled(servers(2), r.clone(), None, Balancer::RoundRobin);
    let held = [f.hold(0), f.hold(1)];
    f.advance(300);
    let st = f.up.status(f.now());
    let out = st.iter().filter(|s| !s.reasons.is_empty()).count();
    let kept = st.iter().filter(|s| !s.waived.is_empty()).count();
    assert_eq!((out, kept), (1, 1), "{st:?}");
    let kept = st.iter().position(|s| !s.waived.is_empty()).expect("kept");
    assert!(matches!(st[kept].waived[0], Ineligible::Stuck { .. }));
    assert_eq!(
        f.get(|_| Be::Ok).1,
        vec![kept],
        "the kept one takes requests"
    );
    drop(held);
    // Three peers: one excluded by failures, one stuck; 34% of 3 allows one.
    r.max_ejected = Some(34);
    let f = ruled(servers(3), r, None, Balancer::RoundRobin);
    let (_s, _g) = f.hold(1);
    f.until_a(|i| if i == 0 { Be::Fail(error()) } else { Be::Ok });
    f.advance(300);
    let st = f.up.status(f.now());
    assert_eq!(
        st.iter().filter(|s| !s.waived.is_empty()).count(),
        1,
        "one of the two ejections is waived: {st:?}"
    );
    assert_eq!(f.up.max_ejected_now(f.now()).map(|m| m.ejected), Some(2));
}

// === eject_slow ===

#[test]
fn a_slow_peer_is_ejected_and_judged_afresh_on_its_return() {
    let mut r = slow_rules();
    r.recovery = Recovery::Probation(NonZeroU32::MIN);
    let f = ruled(servers(3), r, None, Balancer::RoundRobin);
    let served = until_slow(&f, 1, 50_000);
    assert!(
        (20..30).contains(&served),
        "judged after 20 requests: {served}"
    );
    match &f.reasons(1)[..] {
        [Ineligible::Slow {
            figure,
            median,
            max: None,
            since,
            until,
            nth,
        }] => {
            assert!(*figure >= Duration::from_millis(50), "{figure:?}");
            assert!(*median <= Duration::from_micros(1_125), "{median:?}");
            assert_eq!((until.0 - since.0, *nth), (10_000, 0), "fail_timeout");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(count(&f, "slow_ejected"), 1);
    let fig = f.up.peer_header_figure(1, f.now()).expect("rule");
    assert_eq!(fig.requests, 0, "forgotten on ejection");
    for _ in 0..30 {
        assert_ne!(f.answered(|_| 1_000), Some(1), "out for fail_timeout");
    }
    // After fail_timeout, probation: one request, and it is fast now.
    f.advance(10_001);
    let mut back = false;
    for _ in 0..6 {
        back |= f.answered(|_| 1_000) == Some(1);
    }
    assert!(back && f.reasons(1).is_empty(), "readmitted by probation");
    assert_eq!(count(&f, "probation_passed"), 1);
    // Its old 50 ms samples are gone: fast requests never re-eject it.
    for _ in 0..200 {
        f.answered(|_| 1_000);
    }
    assert!(!has(&f, 1, Rule::Slow));
    assert_eq!(count(&f, "slow_ejected"), 1);
}

#[test]
fn a_slow_peer_returns_through_a_probe_and_penalties_grow() {
    let mut r = slow_rules();
    r.recovery = Recovery::Probe;
    r.penalty = Some(Penalty {
        base: Duration::from_secs(2),
        max: Duration::from_secs(60),
        jitter_percent: 0,
    });
    let f = ruled(servers(3), r, Some(up_check()), Balancer::RoundRobin);
    until_slow(&f, 2, 50_000);
    let pause = |f: &Fixture| match f.reasons(2).first() {
        Some(Ineligible::Slow {
            until, since, nth, ..
        }) => (until.0 - since.0, *nth),
        other => panic!("{other:?}"),
    };
    assert_eq!(pause(&f), (2_000, 1));
    f.advance(2_001);
    assert!(has(&f, 2, Rule::AwaitingProbe), "{:?}", f.reasons(2));
    f.probe(2, true);
    assert!(f.reasons(2).is_empty(), "a passing probe readmits it");
    // Still slow: ejected again, in a row, for twice as long.
    until_slow(&f, 2, 50_000);
    assert_eq!(pause(&f), (4_000, 2));
}

#[test]
fn slow_ejection_is_bounded_by_max_ejected_with_two_and_three_peers() {
    // Two peers: each is judged against the other; 50% of 2 allows one.
    let mut r = slow_rules();
    r.max_ejected = Some(50);
    let f = ruled(servers(2), r.clone(), None, Balancer::RoundRobin);
    until_slow(&f, 0, 50_000);
    assert!(
        f.up.status(f.now())[0].waived.is_empty(),
        "one may be ejected"
    );
    // 0% allows none: the slow one is ejected but kept, and still served.
    r.max_ejected = Some(0);
    let f = ruled(servers(3), r.clone(), None, Balancer::RoundRobin);
    let waived = |f: &Fixture, i: usize| {
        f.up.status(f.now())[i]
            .waived
            .iter()
            .any(|w| matches!(w, Ineligible::Slow { .. }))
    };
    for _ in 0..400 {
        if waived(&f, 0) {
            break;
        }
        f.answered(|i| if i == 0 { 50_000 } else { 1_000 });
    }
    assert!(waived(&f, 0) && f.reasons(0).is_empty());
    assert_eq!(count(&f, "slow_ejected"), 1);
    assert!((0..6).any(|_| f.answered(|_| 1_000) == Some(0)));
    // Three peers, 34%: one excluded by failures already, so the slow one
    // is kept (it has no failures: the better record).
    r.max_ejected = Some(34);
    let f = ruled(servers(3), r, None, Balancer::RoundRobin);
    f.until_a(|i| if i == 0 { Be::Fail(error()) } else { Be::Ok });
    assert!(f.excluded(0));
    let mut judged = false;
    for _ in 0..400 {
        f.answered(|i| if i == 1 { 50_000 } else { 1_000 });
        let st = f.up.status(f.now());
        if st[1]
            .waived
            .iter()
            .any(|w| matches!(w, Ineligible::Slow { .. }))
        {
            judged = true;
            break;
        }
    }
    // With peer 0 out, peer 1 has one other to compare with (peer 2).
    assert!(judged, "slow but kept by max_ejected");
    assert_eq!(f.up.max_ejected_now(f.now()).map(|m| m.allowed), Some(1));
}

#[test]
fn slow_start_follows_a_slow_ejection() {
    let mut r = slow_rules();
    r.recovery = Recovery::Probation(NonZeroU32::MIN);
    let mut s = servers(3);
    s[1].slow_start = Some(Duration::from_secs(10));
    let f = ruled(s, r, None, Balancer::RoundRobin);
    until_slow(&f, 1, 50_000);
    f.advance(10_001);
    for _ in 0..6 {
        f.answered(|_| 1_000);
    }
    assert!(f.reasons(1).is_empty());
    assert_eq!(count(&f, "slow_start"), 1);
    assert!(f.up.peers()[1].ramp_until() > f.now(), "ramping");
}

#[test]
fn the_fast_path_leaves_the_cycle_while_a_peer_is_slow_ejected() {
    let f = ruled(servers(3), slow_rules(), None, Balancer::RoundRobin);
    for _ in 0..3 {
        f.answered(|_| 1_000);
    }
    assert!(f.up.on_fast_path(), "healthy: the cycle");
    until_slow(&f, 0, 50_000);
    f.answered(|_| 1_000);
    assert!(!f.up.on_fast_path(), "a slow-ejected peer is not at rest");
    // The same requests on an upstream without the fast path pick the same peers.
    let g = {
        let mut cfg = UpstreamConfig::new("u");
        cfg.servers = servers(3);
        cfg.rules = slow_rules();
        let clock = Arc::new(ManualClock::at(1_000_000));
        let events = Arc::new(EventBus::default());
        Fixture {
            up: Arc::new(Upstream::new(cfg, events.clone(), clock.clone()).without_fast_path()),
            clock,
            events,
        }
    };
    let f = ruled(servers(3), slow_rules(), None, Balancer::RoundRobin);
    let lat = |i: usize| if i == 0 { 50_000 } else { 1_000 };
    for _ in 0..300 {
        assert_eq!(f.answered(lat), g.answered(lat));
    }
    assert!(has(&f, 0, Rule::Slow) && has(&g, 0, Rule::Slow));
}

#[test]
fn a_single_server_is_never_stuck_or_slow() {
    let mut r = stuck_rules(200);
    r.eject_slow = slow_rules().eject_slow;
    let f = ruled(servers(1), r, None, Balancer::RoundRobin);
    let (_s, _g) = f.hold(0);
    f.advance(5_000);
    assert!(f.reasons(0).is_empty(), "nginx's single-server rule");
}
