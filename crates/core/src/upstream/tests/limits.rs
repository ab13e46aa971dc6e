//! Simulated-time tests of `slow_start` (the weight ramp after any
//! readmission) and `max_ejected` (the cap on ejections), alone and with
//! the fast path and probe recovery.

use super::rules::{ruled, rules, up_check};
use super::*;
use crate::config::{HealthRules, Recovery};

fn weighted(i: u16, w: u32, slow: Option<u64>) -> ServerConfig {
    with(srv(i), |s| {
        s.weight = NonZeroU32::new(w).expect("w");
        s.slow_start = slow.map(Duration::from_millis);
    })
}

fn weight_now(f: &Fixture, i: usize) -> u32 {
    f.up.status(f.now())[i].weight_now
}

fn fail_a(i: usize) -> Be {
    if i == 0 {
        Be::Fail(error())
    } else {
        Be::Ok
    }
}

#[test]
fn slow_start_ramps_the_weight_after_an_admin_up() {
    let f = rr(vec![weighted(1, 10, Some(10_000)), weighted(2, 10, None)]);
    assert_eq!(weight_now(&f, 0), 10, "no ramp at start");
    f.up.set_admin(PeerId(0), AdminState::Down, f.now());
    f.up.set_admin(PeerId(0), AdminState::Up, f.now());
    assert_eq!(f.kinds_named("slow_start"), 1);
    let mut got = vec![weight_now(&f, 0)];
    for _ in 0..2 {
        f.advance(5_000);
        got.push(weight_now(&f, 0));
    }
    assert_eq!(got, vec![1, 5, 10], "linear from weight/10 over slow_start");
}

#[test]
fn a_ramping_peer_gets_its_ramped_share_of_round_robin() {
    let f = rr(vec![weighted(1, 10, Some(100_000)), weighted(2, 10, None)]);
    f.up.set_admin(PeerId(0), AdminState::Down, f.now());
    f.up.set_admin(PeerId(0), AdminState::Up, f.now());
    // weight 1 against 10: one pick in 11.
    let a = (0..110).filter(|_| f.get(|_| Be::Ok).1 == vec![0]).count();
    assert_eq!(a, 10);
    f.advance(100_000);
    let a = (0..100).filter(|_| f.get(|_| Be::Ok).1 == vec![0]).count();
    assert_eq!(a, 50, "full weight after the ramp");
}

#[test]
fn slow_start_follows_passive_and_probe_readmissions_but_not_the_first_probe_up() {
    let mut check = up_check();
    check.initial = crate::config::InitialState::Down;
    check.fall = NonZeroU32::MIN;
    let f = ruled(
        vec![weighted(1, 20, Some(10_000)), weighted(2, 20, None)],
        HealthRules::default(),
        Some(check),
        Balancer::RoundRobin,
    );
    f.probe(0, true);
    f.probe(1, true);
    assert_eq!(weight_now(&f, 0), 20, "starting up is no readmission");
    // Probes down, then up again: the ramp starts.
    f.probe(0, false);
    f.probe(0, true);
    assert_eq!(weight_now(&f, 0), 2);
    f.advance(10_000);
    assert_eq!(weight_now(&f, 0), 20);
    // Passive: excluded, then the trial request succeeds: readmitted, ramp.
    f.until_a(fail_a);
    f.advance(10_001);
    f.until_a(|_| Be::Ok);
    assert_eq!(f.fails(0), 0);
    assert_eq!(weight_now(&f, 0), 2);
    assert_eq!(f.kinds_named("slow_start"), 2);
}

#[test]
fn least_conn_and_random_compare_ramped_weights() {
    let f = fixture(
        vec![weighted(1, 10, Some(100_000)), weighted(2, 10, None)],
        Balancer::LeastConn,
    );
    f.up.set_admin(PeerId(0), AdminState::Down, f.now());
    f.up.set_admin(PeerId(0), AdminState::Up, f.now());
    // One request in flight on each: A at weight 1 is 10× more loaded.
    let (_s0, _g0) = f.hold(0);
    let (_s1, _g1) = f.hold(1);
    for _ in 0..5 {
        assert_eq!(f.get(|_| Be::Ok).1, vec![1]);
    }

    let f = fixture(
        vec![weighted(1, 10, Some(100_000)), weighted(2, 10, None)],
        Balancer::Random { two: false },
    );
    f.up.set_admin(PeerId(0), AdminState::Down, f.now());
    f.up.set_admin(PeerId(0), AdminState::Up, f.now());
    let draws = |f: &Fixture| {
        (0..2000u64)
            .filter(|seed| {
                let mut sel = f.up.begin_seeded(
                    SelectKey::None,
                    RetryPolicy::default(),
                    RequestFacts::default(),
                    f.now(),
                    seed * 7919 + 1,
                );
                f.up.select(&mut sel, f.now()).expect("peer").peer().id().0 == 0
            })
            .count()
    };
    let ramping = draws(&f);
    assert!(
        (100..260).contains(&ramping),
        "about 1/11 of 2000: {ramping}"
    );
    f.advance(100_000);
    let full = draws(&f);
    assert!((900..1100).contains(&full), "about half: {full}");
}

#[test]
fn a_ramp_keeps_round_robin_off_the_fast_path_until_it_ends() {
    let f = rr(vec![
        weighted(1, 3, Some(2_000)),
        weighted(2, 1, None),
        weighted(3, 1, None),
    ]);
    assert!(f.up.on_fast_path());
    f.up.set_admin(PeerId(0), AdminState::Down, f.now());
    f.up.set_admin(PeerId(0), AdminState::Up, f.now());
    f.get(|_| Be::Ok);
    assert!(!f.up.on_fast_path(), "the scan while a peer ramps");
    f.advance(2_000);
    for _ in 0..50 {
        f.get(|_| Be::Ok);
    }
    assert!(
        f.up.on_fast_path(),
        "back on the cycle once the ramp is over"
    );
}

fn ejecting(servers: Vec<ServerConfig>, pct: u8, recovery: Recovery) -> Fixture {
    ruled(
        servers,
        rules(|r| {
            r.max_ejected = Some(pct);
            r.recovery = recovery;
        }),
        Some(up_check()),
        Balancer::RoundRobin,
    )
}

fn ejected(f: &Fixture) -> Vec<(u32, bool)> {
    f.up.ejected_now(f.now())
        .iter()
        .map(|e| (e.peer.0, e.kept))
        .collect()
}

fn probe_down(f: &Fixture, i: u32) {
    for _ in 0..3 {
        f.probe(i, false);
    }
}

#[test]
fn in_service_is_the_config_and_the_admin_state_not_the_health_rules() {
    let f = ejecting(
        vec![with(srv(1), |s| s.down = true), srv(2), srv(3), srv(4)],
        50,
        Recovery::Window,
    );
    f.up.set_admin(PeerId(1), AdminState::Down, f.now());
    f.up.set_admin(PeerId(2), AdminState::Drain, f.now());
    probe_down(&f, 3);
    let in_service: Vec<bool> = f.up.peers().iter().map(|p| policy::in_service(p)).collect();
    assert_eq!(
        in_service,
        vec![false, false, false, true],
        "probes down is in service"
    );
    f.up.set_admin(PeerId(2), AdminState::Up, f.now());
    assert!(policy::in_service(&f.up.peers()[2]));
    assert_eq!(
        f.up.max_ejected_now(f.now()).map(|m| m.in_service),
        Some(2),
        "max_ejected counts the same peers"
    );
}

#[test]
fn max_ejected_keeps_one_primary_of_one() {
    // A single primary and a backup (so not nginx's single server): probes
    // down, but it is the last primary in service.
    let f = ejecting(
        vec![srv(1), with(srv(2), |s| s.backup = true)],
        50,
        Recovery::Window,
    );
    probe_down(&f, 0);
    assert_eq!(ejected(&f), vec![(0, true)]);
    assert_eq!(f.get(|_| Be::Ok).1, vec![0], "kept, so no backup");
    let st = &f.up.status(f.now())[0];
    assert!(st.reasons.is_empty() && matches!(st.waived[..], [Ineligible::ProbeDown { .. }]));
}

#[test]
fn max_ejected_of_two_keeps_the_one_with_the_better_record() {
    let f = ejecting(vec![srv(1), srv(2)], 50, Recovery::Window);
    f.until_a(fail_a);
    assert_eq!(ejected(&f), vec![(0, false)], "one of two may go");
    f.advance(1_000);
    // B fails too: A failed first, so B (serving until later) is kept.
    let (st, seen) = f.get(|_| Be::Fail(error()));
    assert_eq!((st, seen), (502, vec![1]));
    assert_eq!(ejected(&f), vec![(0, false), (1, true)]);
    for _ in 0..3 {
        assert_eq!(f.get(|_| Be::Ok).1, vec![1], "the kept one serves");
    }
    assert!(f.kinds().contains(&"max_ejected"));
    // A kept peer is still charged: with more failures than A it swaps.
    f.get(|_| Be::Fail(error()));
    assert_eq!(ejected(&f), vec![(0, true), (1, false)]);
}

#[test]
fn max_ejected_of_three_counts_every_rule_and_not_admin_down() {
    // 34% of 3: one may be ejected.
    let f = ejecting(vec![srv(1), srv(2), srv(3)], 34, Recovery::Window);
    probe_down(&f, 0);
    assert_eq!(ejected(&f), vec![(0, false)]);
    f.advance(1_000);
    f.request(RetryPolicy::default(), RequestFacts::default(), |i| {
        if i == 1 {
            Be::Fail(error())
        } else {
            Be::Ok
        }
    });
    // Probe down (3 failed probes) against one passive failure: B is kept.
    assert_eq!(ejected(&f), vec![(0, false), (1, true)]);
    // 67% of 3: two may be; the third failing keeps the best of three.
    let f = ejecting(vec![srv(1), srv(2), srv(3)], 67, Recovery::Window);
    probe_down(&f, 0);
    probe_down(&f, 1);
    assert_eq!(ejected(&f), vec![(0, false), (1, false)]);
    f.advance(1_000);
    assert_eq!(f.get(|_| Be::Fail(error())), (502, vec![2]));
    assert_eq!(ejected(&f), vec![(0, false), (1, false), (2, true)]);
    // Admin down is no ejection and leaves the pool: 50% of the 2 in service.
    let f = ejecting(vec![srv(1), srv(2), srv(3)], 50, Recovery::Window);
    f.up.set_admin(PeerId(2), AdminState::Down, f.now());
    probe_down(&f, 0);
    assert_eq!(ejected(&f), vec![(0, false)]);
    f.advance(1_000);
    probe_down(&f, 1);
    assert_eq!(
        ejected(&f),
        vec![(0, false), (1, true)],
        "B went down later"
    );
    assert_eq!(
        f.up.max_ejected_now(f.now()),
        Some(MaxEjectedNow {
            percent: 50,
            in_service: 2,
            ejected: 2,
            allowed: 1
        })
    );
}

#[test]
fn max_ejected_with_probe_recovery_keeps_one_and_readmits_on_probes() {
    let f = ejecting(vec![srv(1), srv(2)], 50, Recovery::Probe);
    f.until_a(fail_a);
    f.advance(1_000);
    f.get(|_| Be::Fail(error()));
    assert_eq!(ejected(&f), vec![(0, false), (1, true)]);
    // Both exclusions end: A waits for a probe and stays out; B is kept
    // although it waits for one too, and no request tests A.
    f.advance(10_001);
    assert!(matches!(
        f.reasons(0)[..],
        [Ineligible::AwaitingProbe { .. }]
    ));
    assert_eq!(ejected(&f), vec![(0, false), (1, true)]);
    for _ in 0..3 {
        assert_eq!(f.get(|_| Be::Ok).1, vec![1]);
    }
    assert_eq!(
        f.up.probes_wanted()
            .iter()
            .map(|w| w.peer.0)
            .collect::<Vec<_>>(),
        vec![0, 1],
        "both owe a probe; a kept request does not readmit"
    );
    // A's probe passes: A is back, B is now the only ejection and within the limit.
    f.probe(0, true);
    assert_eq!(ejected(&f), vec![(1, false)]);
    f.get(|_| Be::Ok);
    f.probe(1, true);
    assert!(ejected(&f).is_empty());
    let kinds = f.kinds();
    let released = f.events.since(0, 100).events.iter().any(|e| {
        e.kind
            == crate::event::EventKind::MaxEjected {
                kept: false,
                ejected: 1,
                allowed: 1,
            }
    });
    assert!(released, "{kinds:?}");
    assert_eq!(
        kinds.iter().filter(|k| **k == "probe_readmitted").count(),
        2
    );
}

impl Fixture {
    fn kinds_named(&self, name: &str) -> usize {
        self.kinds().iter().filter(|k| **k == name).count()
    }
}
