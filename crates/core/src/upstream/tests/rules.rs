//! Simulated-time tests of vigil's passive rules beyond nginx:
//! `passive_count`, `passive_recovery` and `passive_penalty`, alone and
//! together (probation with penalty growth).

use super::*;
use crate::config::{HealthRules, Penalty, Recovery};

pub(super) fn rules(f: impl FnOnce(&mut HealthRules)) -> HealthRules {
    let mut r = HealthRules::default();
    f(&mut r);
    r
}

/// A check that starts peers up, so probes change nothing until they say so.
pub(super) fn up_check() -> CheckConfig {
    CheckConfig {
        initial: crate::config::InitialState::Up,
        rise: NonZeroU32::MIN,
        fall: NonZeroU32::new(3).expect("3"),
        ..CheckConfig::default()
    }
}

pub(super) fn ruled(
    servers: Vec<ServerConfig>,
    rules: HealthRules,
    check: Option<CheckConfig>,
    balancer: Balancer,
) -> Fixture {
    let mut cfg = UpstreamConfig::new("u");
    cfg.servers = servers;
    cfg.balancer = balancer;
    cfg.rules = rules;
    cfg.check = check;
    let clock = Arc::new(ManualClock::at(1_000_000));
    let events = Arc::new(EventBus::default());
    let up = Arc::new(Upstream::new(cfg, events.clone(), clock.clone()));
    up.seed_jitter(7);
    Fixture { up, clock, events }
}

impl Fixture {
    pub(super) fn probe(&self, i: u32, ok: bool) {
        self.up.record_probe(
            PeerId(i),
            ProbeReport {
                ok,
                phase: None,
                latency: Duration::from_millis(1),
                detail: if ok { "HTTP 200" } else { "HTTP 500" }.into(),
                at: self.now(),
            },
        );
    }

    pub(super) fn kinds(&self) -> Vec<&'static str> {
        self.events
            .since(0, 1000)
            .events
            .iter()
            .map(|e| e.kind.name())
            .collect()
    }

    pub(super) fn reasons(&self, i: usize) -> Vec<Ineligible> {
        self.up.status(self.now())[i].reasons.clone()
    }

    /// Select for a fresh request until peer `i` is picked (the other
    /// picks succeed), and hold that guard.
    pub(super) fn hold(&self, i: usize) -> (Selection, PeerGuard) {
        for _ in 0..50 {
            let mut sel = self.up.begin(
                SelectKey::None,
                RetryPolicy::default(),
                RequestFacts::default(),
                self.now(),
            );
            let g = self.up.select(&mut sel, self.now()).expect("a peer");
            if g.peer().id().0 as usize == i {
                return (sel, g);
            }
        }
        panic!("peer {i} never picked");
    }

    /// The end and count of peer `i`'s exclusion.
    pub(super) fn exclusion(&self, i: usize) -> (u64, u32) {
        match self.reasons(i).first() {
            Some(Ineligible::Excluded { until, nth, .. }) => (until.0 - self.now().0, *nth),
            other => panic!("peer {i} not excluded: {other:?}"),
        }
    }
}

fn fail_a(i: usize) -> Be {
    if i == 0 {
        Be::Fail(error())
    } else {
        Be::Ok
    }
}

fn http503() -> RetryPolicy {
    RetryPolicy {
        next_upstream: NextUpstream::nginx_default().with(FailureClass::Http503),
        ..RetryPolicy::default()
    }
}

#[test]
fn after_header_charges_a_body_failure_only_under_the_rule_and_never_retries() {
    let pass_through = |f: &Fixture| {
        let (mut sel, g) = f.hold(0);
        match sel.on_status(g, 200, f.now()) {
            StatusVerdict::PassThrough(g, None) => g,
            _ => panic!("a 200 is passed through"),
        }
    };
    // nginx: a body cut short after the header is a success for accounting.
    let f = rr(vec![srv(1), srv(2)]);
    let mut g = pass_through(&f);
    assert_eq!(
        g.fail_after_header(FailureClass::Error, f.now()),
        Accounting::default()
    );
    drop(g);
    assert_eq!(f.fails(0), 0);

    let after_header = rules(|r| r.count.after_header = true);
    let f = ruled(
        vec![srv(1), srv(2)],
        after_header.clone(),
        None,
        Balancer::RoundRobin,
    );
    let mut g = pass_through(&f);
    let a = g.fail_after_header(FailureClass::Timeout, f.now());
    assert_eq!(
        a,
        Accounting {
            charged: Some(FailureClass::Timeout),
            excluded: true,
            rule: Some(CountRule::AfterHeader),
        }
    );
    assert_eq!(g.accounting(), a);
    assert_eq!(
        g.fail_after_header(FailureClass::Error, f.now()),
        Accounting::default(),
        "charged once"
    );
    assert_eq!(f.up.peers()[0].conns(), 1, "held until the body is done");
    drop(g);
    assert_eq!(f.up.peers()[0].conns(), 0);
    assert_eq!(f.fails(0), 1, "the drop is no success that forgives");
    assert!(f.excluded(0));
    assert_eq!(f.get(|_| Be::Ok).1, vec![1]);

    // The single server of an upstream is never charged.
    let f = ruled(vec![srv(1)], after_header, None, Balancer::RoundRobin);
    let mut g = pass_through(&f);
    assert_eq!(
        g.fail_after_header(FailureClass::Error, f.now()),
        Accounting::default()
    );
}

#[test]
fn last_try_charges_a_listed_status_that_cannot_be_retried() {
    let f = ruled(
        vec![srv(1), srv(2)],
        rules(|r| r.count.last_try = true),
        None,
        Balancer::RoundRobin,
    );
    // Both answer 503: the first is retried (charged as in nginx), the
    // last try's 503 goes to the client and is charged too.
    let mut sel =
        f.up.begin(SelectKey::None, http503(), RequestFacts::default(), f.now());
    let g = f.up.select(&mut sel, f.now()).expect("a");
    assert!(matches!(
        sel.on_status(g, 503, f.now()),
        StatusVerdict::Retry(_)
    ));
    let g = f.up.select(&mut sel, f.now()).expect("b");
    let v = sel.on_status(g, 503, f.now());
    assert_eq!(
        v.accounting(),
        Accounting {
            charged: Some(FailureClass::Http503),
            excluded: true,
            rule: Some(CountRule::LastTry),
        }
    );
    assert!(matches!(
        v,
        StatusVerdict::PassThrough(_, Some(RetryDenied::Tries))
    ));
    drop(v);
    assert_eq!((f.fails(0), f.fails(1)), (1, 1));

    // A POST that got a 503 cannot be retried: charged as well.
    let f = ruled(
        vec![srv(1), srv(2)],
        rules(|r| r.count.last_try = true),
        None,
        Balancer::RoundRobin,
    );
    let post = RequestFacts {
        non_idempotent: true,
        body_replayable: true,
        hedgeable: false,
    };
    assert_eq!(
        f.request(http503(), post, |_| Be::Status(503)),
        (503, vec![0])
    );
    assert_eq!(f.fails(0), 1);
    // Unlisted statuses and 404 stay successes.
    let p404 = RetryPolicy {
        next_upstream: NextUpstream::nginx_default().with(FailureClass::Http404),
        ..RetryPolicy::default()
    };
    let g = ruled(
        vec![srv(1), srv(2)],
        rules(|r| r.count.last_try = true),
        None,
        Balancer::RoundRobin,
    );
    assert_eq!(
        g.request(RetryPolicy::default(), post, |_| Be::Status(503)),
        (503, vec![0])
    );
    assert_eq!(
        g.request(p404, RequestFacts::default(), |_| Be::Status(404))
            .0,
        404
    );
    assert_eq!((g.fails(0), g.fails(1)), (0, 0));
}

#[test]
fn probe_recovery_keeps_the_peer_out_until_a_probe_passes_after_the_exclusion() {
    let f = ruled(
        vec![srv(1), srv(2)],
        rules(|r| r.recovery = Recovery::Probe),
        Some(up_check()),
        Balancer::RoundRobin,
    );
    f.until_a(fail_a);
    let t0 = f.now();
    assert!(f.excluded(0));
    let end = Timestamp(t0.0 + 10_000);
    assert_eq!(
        f.up.probes_wanted(),
        vec![ProbeWanted {
            peer: PeerId(0),
            at: end
        }]
    );
    // A probe passing inside the exclusion does not shorten it.
    f.advance(5_000);
    f.probe(0, true);
    assert!(f.excluded(0));
    // The exclusion ends: no trial request, the peer waits for a probe.
    f.advance(5_001);
    assert_eq!(
        f.reasons(0),
        vec![Ineligible::AwaitingProbe {
            fails: 1,
            since: end
        }]
    );
    for _ in 0..6 {
        assert_eq!(f.get(|_| Be::Ok).1, vec![1], "no request tests it");
    }
    f.probe(0, false);
    assert!(matches!(
        f.reasons(0)[..],
        [Ineligible::AwaitingProbe { .. }]
    ));
    f.probe(0, true);
    assert_eq!(f.fails(0), 0);
    assert!(f.reasons(0).is_empty());
    assert!(f.up.probes_wanted().is_empty());
    let picks: Vec<usize> = (0..4).map(|_| f.get(|_| Be::Ok).1[0]).collect();
    assert!(picks.contains(&0), "{picks:?}");
    assert_eq!(f.kinds(), vec!["excluded", "probe_readmitted"]);
}

#[test]
fn probation_admits_one_request_at_a_time_until_n_succeed_in_a_row() {
    let f = ruled(
        vec![srv(1), srv(2)],
        rules(|r| r.recovery = Recovery::Probation(NonZeroU32::new(3).expect("3"))),
        None,
        Balancer::RoundRobin,
    );
    f.until_a(fail_a);
    f.advance(10_001);
    for done in 0..3u32 {
        let (_sel, g) = f.hold(0);
        assert_eq!(
            f.reasons(0),
            vec![Ineligible::Probation {
                successes: done,
                needed: 3
            }]
        );
        for _ in 0..3 {
            assert_eq!(f.get(|_| Be::Ok).1, vec![1], "one request at a time");
        }
        drop(g);
    }
    assert!(f.reasons(0).is_empty());
    assert_eq!(f.up.status(f.now())[0].probation, None);
    assert_eq!(f.fails(0), 0);
    assert_eq!(
        f.kinds(),
        vec!["excluded", "probation_started", "probation_passed"]
    );
    // Back in full rotation: two requests at once may both go to it.
    let (_s1, g1) = f.hold(0);
    let (_s2, g2) = f.hold(0);
    drop((g1, g2));
}

#[test]
fn a_probation_failure_excludes_again_with_the_penalty_grown() {
    let f = ruled(
        vec![srv(1), srv(2)],
        rules(|r| {
            r.recovery = Recovery::Probation(NonZeroU32::new(2).expect("2"));
            r.penalty = Some(Penalty {
                base: Duration::from_secs(1),
                max: Duration::from_secs(8),
                jitter_percent: 0,
            });
        }),
        None,
        Balancer::RoundRobin,
    );
    f.until_a(fail_a);
    assert_eq!(f.exclusion(0), (1_000, 1));
    f.advance(1_001);
    f.until_a(fail_a);
    assert_eq!(
        f.exclusion(0),
        (2_000, 2),
        "the probation failure doubles it"
    );
    f.advance(2_001);
    // One success, then a failure: the streak starts over, the pause grows.
    f.until_a(|_| Be::Ok);
    assert_eq!(f.up.status(f.now())[0].probation, Some((1, 2)));
    f.until_a(fail_a);
    assert_eq!(f.exclusion(0), (4_000, 3));
    f.advance(4_001);
    f.until_a(|_| Be::Ok);
    f.until_a(|_| Be::Ok);
    assert_eq!(f.fails(0), 0, "two in a row: probation passed");
    // A failure within `max` of the readmission continues the run...
    f.advance(7_999);
    f.until_a(fail_a);
    assert_eq!(f.exclusion(0), (8_000, 4));
    // ...after a clean period as long as `max`, it starts again at base.
    f.advance(8_001);
    f.until_a(|_| Be::Ok);
    f.until_a(|_| Be::Ok);
    f.advance(8_000);
    f.until_a(fail_a);
    assert_eq!(f.exclusion(0), (1_000, 1));
}

#[test]
fn penalty_doubles_each_exclusion_in_a_row_up_to_max() {
    let f = ruled(
        vec![srv(1), srv(2)],
        rules(|r| {
            r.penalty = Some(Penalty {
                base: Duration::from_secs(2),
                max: Duration::from_secs(8),
                jitter_percent: 0,
            })
        }),
        None,
        Balancer::RoundRobin,
    );
    f.until_a(fail_a);
    let mut got = vec![f.exclusion(0)];
    for _ in 0..3 {
        // The exclusion ends; the trial request fails: the next in a row.
        f.advance(got.last().expect("one").0 + 1);
        f.until_a(fail_a);
        got.push(f.exclusion(0));
    }
    assert_eq!(got, vec![(2_000, 1), (4_000, 2), (8_000, 3), (8_000, 4)]);
    // Excluded means excluded for the whole grown length.
    f.advance(7_999);
    for _ in 0..4 {
        assert_eq!(f.get(|_| Be::Ok).1, vec![1]);
    }
    f.advance(2);
    f.until_a(|_| Be::Ok);
    assert_eq!(f.fails(0), 0, "the trial's success readmits it");
    assert_eq!(
        f.kinds().iter().filter(|k| **k == "trial_request").count(),
        4
    );
}

#[test]
fn failures_during_one_exclusion_do_not_grow_the_penalty() {
    let f = ruled(
        vec![
            with(srv(1), |s| s.weight = NonZeroU32::new(5).expect("5")),
            srv(2),
        ],
        rules(|r| {
            r.penalty = Some(Penalty {
                base: Duration::from_secs(2),
                max: Duration::from_secs(60),
                jitter_percent: 0,
            })
        }),
        None,
        Balancer::RoundRobin,
    );
    // Two requests in flight to A; both fail.
    let (mut s1, g1) = f.hold(0);
    let (mut s2, g2) = f.hold(0);
    assert!(s1.on_failure(g1, error(), f.now()).accounting().excluded);
    f.advance(500);
    assert!(s2.on_failure(g2, error(), f.now()).accounting().excluded);
    assert_eq!(f.exclusion(0), (2_000, 1), "the same exclusion, restarted");
}

#[test]
fn penalty_jitter_is_bounded_and_follows_the_seed() {
    let penalty = |seed: u64| {
        let f = ruled(
            vec![srv(1), srv(2)],
            rules(|r| {
                r.penalty = Some(Penalty {
                    base: Duration::from_secs(10),
                    max: Duration::from_secs(600),
                    jitter_percent: 50,
                })
            }),
            None,
            Balancer::RoundRobin,
        );
        f.up.seed_jitter(seed);
        let mut lengths = Vec::new();
        f.until_a(fail_a);
        for k in 0..6u32 {
            let (len, nth) = f.exclusion(0);
            assert_eq!(nth, k + 1);
            let d = 10_000u64 << k;
            assert!((d / 2..=d * 3 / 2).contains(&len), "{len} vs {d}");
            lengths.push(len);
            f.advance(len + 1);
            f.until_a(fail_a);
        }
        lengths
    };
    assert_eq!(penalty(42), penalty(42), "same seed, same exclusions");
    assert_ne!(penalty(42), penalty(43));
}
