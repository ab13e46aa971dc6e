//! Simulated-time tests of nginx's passive accounting and retry rules
//! (`docs/semantics.md` names the test for each rule).

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;

use super::*;
use crate::clock::ManualClock;
use crate::config::{Balancer, CheckConfig, ServerConfig, UpstreamConfig};
use crate::event::EventBus;
use crate::health::ProbeReport;
use crate::outcome::{FailureClass, NextUpstream, TransportFailure};

struct Fixture {
    up: Arc<Upstream>,
    clock: Arc<ManualClock>,
    events: Arc<EventBus>,
}

fn srv(i: u16) -> ServerConfig {
    let addr = SocketAddr::from(([10, 0, 0, i as u8], 80));
    ServerConfig::new(format!("10.0.0.{i}:80"), addr)
}

fn fixture(servers: Vec<ServerConfig>, balancer: Balancer) -> Fixture {
    let mut cfg = UpstreamConfig::new("u");
    cfg.servers = servers;
    cfg.balancer = balancer;
    let clock = Arc::new(ManualClock::at(1_000_000));
    let events = Arc::new(EventBus::default());
    let up = Arc::new(Upstream::new(cfg, events.clone(), clock.clone()));
    Fixture { up, clock, events }
}

fn rr(servers: Vec<ServerConfig>) -> Fixture {
    fixture(servers, Balancer::RoundRobin)
}

fn error() -> TransportFailure {
    TransportFailure {
        class: FailureClass::Error,
        request_sent: true,
        cached_connection: false,
    }
}

fn refused() -> TransportFailure {
    TransportFailure {
        request_sent: false,
        ..error()
    }
}

/// What a backend does in a simulated request.
#[derive(Clone, Copy)]
enum Be {
    Ok,
    Status(u16),
    Fail(TransportFailure),
}

impl Fixture {
    fn now(&self) -> Timestamp {
        self.clock.now()
    }

    fn advance(&self, ms: u64) {
        self.clock.advance(Duration::from_millis(ms));
    }

    /// One request: returns (final status, peers tried by index).
    fn request(
        &self,
        policy: RetryPolicy,
        facts: RequestFacts,
        be: impl Fn(usize) -> Be,
    ) -> (u16, Vec<usize>) {
        let mut sel = self.up.begin(SelectKey::None, policy, facts, self.now());
        let mut seen = Vec::new();
        loop {
            let Ok(g) = self.up.select(&mut sel, self.now()) else {
                return (502, seen);
            };
            let i = g.peer().id().0 as usize;
            seen.push(i);
            match be(i) {
                Be::Ok => return (200, seen),
                Be::Status(s) => match sel.on_status(g, s, self.now()) {
                    StatusVerdict::Retry(_) => continue,
                    StatusVerdict::PassThrough(..) => return (s, seen),
                },
                Be::Fail(f) => match sel.on_failure(g, f, self.now()) {
                    FailureVerdict::Retry(_) => continue,
                    FailureVerdict::Fail { status: s, .. } => return (s, seen),
                },
            }
        }
    }

    /// Send requests until one of them tries peer 0.
    fn until_a(&self, be: impl Fn(usize) -> Be + Copy) {
        for _ in 0..10 {
            if self.get(be).1.contains(&0) {
                return;
            }
        }
        panic!("peer 0 never picked");
    }

    fn get(&self, be: impl Fn(usize) -> Be) -> (u16, Vec<usize>) {
        self.request(RetryPolicy::default(), RequestFacts::default(), be)
    }

    fn fails(&self, i: usize) -> u32 {
        self.up.status(self.now())[i].passive.fails
    }

    fn excluded(&self, i: usize) -> bool {
        self.up.status(self.now())[i]
            .reasons
            .iter()
            .any(|r| matches!(r, Ineligible::Excluded { .. }))
    }
}

fn with(mut s: ServerConfig, f: impl FnOnce(&mut ServerConfig)) -> ServerConfig {
    f(&mut s);
    s
}

#[test]
fn fail_timeout_is_a_quiet_period_not_a_sliding_window() {
    // max_fails=3 fail_timeout=10s: failures at t=0, 4, 8 with successes
    // in between still add up to 3 (anchors-proxy §1.2 (b)).
    let f = rr(vec![
        with(srv(1), |s| s.max_fails = 3),
        with(srv(2), |s| s.max_fails = 3),
    ]);
    for round in 0..3 {
        f.until_a(|i| if i == 0 { Be::Fail(error()) } else { Be::Ok });
        if round < 2 {
            f.until_a(|_| Be::Ok);
        }
        f.advance(4_000);
    }
    assert_eq!(f.fails(0), 3, "successes inside the window do not forgive");
    assert!(f.excluded(0));
}

#[test]
fn a_success_after_the_window_forgives_failures() {
    let f = rr(vec![with(srv(1), |s| s.max_fails = 2), srv(2)]);
    f.get(|i| if i == 0 { Be::Fail(error()) } else { Be::Ok });
    assert_eq!(f.fails(0), 1);
    f.advance(10_001);
    // The first pick of A after the window moves `checked`, so its success resets fails.
    loop {
        let (_, seen) = f.get(|_| Be::Ok);
        if seen == vec![0] {
            break;
        }
    }
    assert_eq!(f.fails(0), 0);
}

#[test]
fn old_failures_are_never_forgotten_without_a_success() {
    // Failures at t=0 and t=5s, then nothing until t=1h, then one failure:
    // fails=3 reaches max_fails=3 at once.
    let f = rr(vec![with(srv(1), |s| s.max_fails = 3), srv(2)]);
    let a_fails = |i: usize| if i == 0 { Be::Fail(error()) } else { Be::Ok };
    f.get(a_fails);
    f.advance(5_000);
    while !f.get(a_fails).1.contains(&0) {}
    assert_eq!(f.fails(0), 2);
    f.advance(3_600_000);
    while !f.get(a_fails).1.contains(&0) {}
    assert_eq!(f.fails(0), 3);
    assert!(f.excluded(0));
}

#[test]
fn exclusion_lasts_fail_timeout_then_one_trial_request() {
    let f = rr(vec![srv(1), srv(2)]);
    let (st, seen) = f.get(|i| if i == 0 { Be::Fail(error()) } else { Be::Ok });
    assert_eq!((st, seen), (200, vec![0, 1]));
    f.advance(9_999);
    assert!(f.excluded(0));
    for _ in 0..5 {
        assert_eq!(f.get(|_| Be::Ok).1, vec![1]);
    }
    f.advance(2);
    // Window over: A is eligible, gets one request, and its failure
    // starts a new window at once.
    let mut trial = None;
    for _ in 0..4 {
        let (_, seen) = f.get(|i| if i == 0 { Be::Fail(error()) } else { Be::Ok });
        if seen[0] == 0 {
            trial = Some(seen);
            break;
        }
    }
    assert_eq!(trial, Some(vec![0, 1]));
    assert!(f.excluded(0));
    let kinds: Vec<&str> = f
        .events
        .since(0, 100)
        .events
        .iter()
        .map(|e| e.kind.name())
        .collect();
    assert_eq!(kinds, vec!["excluded", "trial_request", "excluded"]);
}

#[test]
fn max_fails_zero_never_excludes() {
    let f = rr(vec![with(srv(1), |s| s.max_fails = 0), srv(2)]);
    for _ in 0..6 {
        let (st, _) = f.get(|i| if i == 0 { Be::Fail(error()) } else { Be::Ok });
        assert_eq!(st, 200);
    }
    assert!(f.fails(0) >= 3, "fails still counts");
    assert!(!f.excluded(0));
    // A is still picked every other request.
    let picks: Vec<usize> = (0..4).map(|_| f.get(|_| Be::Ok).1[0]).collect();
    assert!(picks.contains(&0));
}

#[test]
fn a_failure_cuts_effective_weight_by_weight_over_max_fails() {
    let f = rr(vec![
        with(srv(1), |s| {
            s.weight = NonZeroU32::new(6).expect("6");
            s.max_fails = 3;
        }),
        srv(2),
    ]);
    f.get(|i| if i == 0 { Be::Fail(error()) } else { Be::Ok });
    // 6 - 6/3 = 4, then +1 on the pick that followed (A was considered again? no: A was tried)
    let eff = f.up.status(f.now())[0].passive.effective_weight;
    assert_eq!(eff, 4);
    // weight 1, max_fails 3: the cut is 1/3 = 0
    let g = rr(vec![with(srv(1), |s| s.max_fails = 3), srv(2)]);
    g.get(|i| if i == 0 { Be::Fail(error()) } else { Be::Ok });
    assert_eq!(g.up.status(g.now())[0].passive.effective_weight, 1);
}

#[test]
fn single_server_is_never_excluded_and_never_retried() {
    let f = rr(vec![with(srv(1), |s| s.max_fails = 1)]);
    for _ in 0..3 {
        assert_eq!(f.get(|_| Be::Fail(error())), (502, vec![0]));
    }
    assert_eq!(f.fails(0), 0);
    assert!(!f.excluded(0));
    assert_eq!(f.get(|_| Be::Ok), (200, vec![0]));
    // A listed 503 is passed through (tries was 1).
    let p = RetryPolicy {
        next_upstream: NextUpstream::nginx_default().with(FailureClass::Http503),
        ..RetryPolicy::default()
    };
    assert_eq!(
        f.request(p, RequestFacts::default(), |_| Be::Status(503)),
        (503, vec![0])
    );
}

#[test]
fn a_down_primary_still_makes_the_upstream_single_or_not() {
    // Two primaries, one `down`: not single, so the live one is excluded after a failure.
    let f = rr(vec![srv(1), with(srv(2), |s| s.down = true)]);
    assert!(!f.up.is_single());
    assert_eq!(f.get(|_| Be::Fail(error())), (502, vec![0]));
    assert!(f.excluded(0));
    assert_eq!(
        f.get(|_| Be::Ok),
        (502, vec![]),
        "no live upstreams at once, no reset"
    );
}

#[test]
fn no_live_upstreams_is_immediate_and_resets_nobody() {
    let f = rr(vec![srv(1), srv(2)]);
    assert_eq!(f.get(|_| Be::Fail(error())), (502, vec![0, 1]));
    assert_eq!(f.get(|_| Be::Ok), (502, vec![]));
    assert_eq!((f.fails(0), f.fails(1)), (1, 1));
}

#[test]
fn backups_only_when_no_primary_is_eligible_and_the_request_stays_there() {
    let f = rr(vec![
        srv(1),
        srv(2),
        with(srv(3), |s| s.backup = true),
        with(srv(4), |s| s.backup = true),
    ]);
    assert_eq!(f.get(|_| Be::Ok).1, vec![0]);
    assert_eq!(f.get(|_| Be::Ok).1, vec![1]);
    // both primaries fail inside one request: on to a backup
    let (st, seen) = f.get(|i| if i < 2 { Be::Fail(error()) } else { Be::Ok });
    assert_eq!((st, seen), (200, vec![0, 1, 2]));
    // within the window: backups in round robin
    assert_eq!(f.get(|_| Be::Ok).1, vec![3]);
    // a backup failure retries on the other backup, not on a primary
    f.advance(10_001);
    let (_, seen) = f.get(|i| {
        if i == 2 || i == 3 {
            Be::Fail(error())
        } else {
            Be::Ok
        }
    });
    assert!(seen[0] < 2, "primaries are back after the window: {seen:?}");
}

#[test]
fn tries_caps_attempts_and_counts_the_first() {
    let f = rr(vec![srv(1), srv(2), srv(3)]);
    let p = RetryPolicy {
        tries: 2,
        ..RetryPolicy::default()
    };
    assert_eq!(
        f.request(p, RequestFacts::default(), |_| Be::Fail(error())),
        (502, vec![0, 1])
    );
}

#[test]
fn a_listed_status_on_the_last_try_is_passed_through_and_counts_as_success() {
    let f = rr(vec![srv(1), srv(2)]);
    let p = RetryPolicy {
        next_upstream: NextUpstream::nginx_default().with(FailureClass::Http503),
        ..RetryPolicy::default()
    };
    assert_eq!(
        f.request(p, RequestFacts::default(), |_| Be::Status(503)),
        (503, vec![0, 1])
    );
    assert_eq!(f.fails(0), 1);
    assert_eq!(
        f.fails(1),
        0,
        "the last try's 503 is a success for accounting"
    );
}

#[test]
fn http_404_retries_but_never_counts() {
    let f = rr(vec![srv(1), srv(2)]);
    let p = RetryPolicy {
        next_upstream: NextUpstream::nginx_default().with(FailureClass::Http404),
        ..RetryPolicy::default()
    };
    for _ in 0..4 {
        f.request(p, RequestFacts::default(), |i| {
            if i == 0 {
                Be::Status(404)
            } else {
                Be::Ok
            }
        });
    }
    assert_eq!(f.fails(0), 0);
    assert!(!f.excluded(0));
}

#[test]
fn unlisted_errors_still_count_and_timeouts_answer_504() {
    let f = rr(vec![srv(1), srv(2)]);
    let p = RetryPolicy {
        next_upstream: NextUpstream::OFF.with(FailureClass::Error),
        ..RetryPolicy::default()
    };
    let timeout = TransportFailure {
        class: FailureClass::Timeout,
        request_sent: true,
        cached_connection: false,
    };
    assert_eq!(
        f.request(p, RequestFacts::default(), |_| Be::Fail(timeout)),
        (504, vec![0])
    );
    assert!(f.excluded(0));
}

#[test]
fn post_is_retried_only_if_it_was_never_sent() {
    let f = rr(vec![srv(1), srv(2)]);
    let post = RequestFacts {
        non_idempotent: true,
        body_replayable: true,
        hedgeable: false,
    };
    assert_eq!(
        f.request(RetryPolicy::default(), post, |_| Be::Fail(error())),
        (502, vec![0])
    );
    let g = rr(vec![srv(1), srv(2)]);
    assert_eq!(
        g.request(RetryPolicy::default(), post, |i| if i == 0 {
            Be::Fail(refused())
        } else {
            Be::Ok
        }),
        (200, vec![0, 1])
    );
}

#[test]
fn an_unreplayable_body_stops_retries_once_sent() {
    let f = rr(vec![srv(1), srv(2)]);
    let streamed = RequestFacts {
        non_idempotent: false,
        body_replayable: false,
        hedgeable: false,
    };
    assert_eq!(
        f.request(RetryPolicy::default(), streamed, |_| Be::Fail(error())),
        (502, vec![0])
    );
    let f = rr(vec![srv(1), srv(2)]);
    f.get(|_| Be::Ok);
    assert_eq!(
        f.request(RetryPolicy::default(), streamed, |i| if i == 1 {
            Be::Fail(refused())
        } else {
            Be::Ok
        }),
        (200, vec![1, 0])
    );
}

#[test]
fn next_upstream_timeout_is_checked_only_before_a_new_attempt() {
    let f = rr(vec![srv(1), srv(2), srv(3)]);
    let p = RetryPolicy {
        timeout: Some(Duration::from_secs(6)),
        ..RetryPolicy::default()
    };
    let mut sel =
        f.up.begin(SelectKey::None, p, RequestFacts::default(), f.now());
    let g = f.up.select(&mut sel, f.now()).expect("peer");
    f.advance(3_000);
    let to = TransportFailure {
        class: FailureClass::Timeout,
        request_sent: false,
        cached_connection: false,
    };
    assert!(sel.on_failure(g, to, f.now()).is_retry());
    let g = f.up.select(&mut sel, f.now()).expect("peer");
    f.advance(3_000);
    let v = sel.on_failure(g, to, f.now());
    assert_eq!(v.status(), Some(504), "6s elapsed: no third attempt");
    assert!(
        matches!(v, FailureVerdict::Fail { denied: RetryDenied::Timeout, accounting, .. } if accounting.charged == Some(FailureClass::Timeout)),
        "{v:?}"
    );
}

#[test]
fn an_error_on_a_cached_connection_does_not_use_up_a_try_but_counts() {
    let f = rr(vec![srv(1)]);
    let cached = TransportFailure {
        cached_connection: true,
        ..error()
    };
    // Single server: the stale keepalive connection is retried once on a fresh one.
    let mut sel = f.up.begin(
        SelectKey::None,
        RetryPolicy::default(),
        RequestFacts::default(),
        f.now(),
    );
    let g = f.up.select(&mut sel, f.now()).expect("peer");
    let v = sel.on_failure(g, cached, f.now());
    assert!(v.is_retry());
    assert_eq!(
        v.accounting().charged,
        None,
        "a single server is never charged (nginx's peers->single)"
    );
    let g =
        f.up.select(&mut sel, f.now())
            .expect("the same single peer again");
    assert_eq!(g.peer().id().0, 0);
    drop(g);
    // Two peers: the failure counts toward max_fails.
    let h = rr(vec![srv(1), srv(2)]);
    let p = RetryPolicy {
        tries: 1,
        ..RetryPolicy::default()
    };
    let (st, seen) = h.request(p, RequestFacts::default(), |i| {
        if i == 0 {
            Be::Fail(cached)
        } else {
            Be::Ok
        }
    });
    assert_eq!(
        (st, seen),
        (200, vec![0, 1]),
        "tries=1 but the cached error gave one back"
    );
    assert_eq!(h.fails(0), 1);
}

#[test]
fn max_conns_skips_a_full_peer_without_advancing_it() {
    let f = rr(vec![with(srv(1), |s| s.max_conns = 1), srv(2)]);
    let mut held = f.up.begin(
        SelectKey::None,
        RetryPolicy::default(),
        RequestFacts::default(),
        f.now(),
    );
    let g = f.up.select(&mut held, f.now()).expect("A");
    assert_eq!(g.peer().id().0, 0);
    for _ in 0..3 {
        assert_eq!(f.get(|_| Be::Ok).1, vec![1]);
    }
    drop(g);
    let order: Vec<usize> = (0..3).map(|_| f.get(|_| Be::Ok).1[0]).collect();
    assert_eq!(order, vec![1, 0, 1], "as nginx s14: B, A, B");
    // A single peer at max_conns: immediate 502.
    let s = rr(vec![with(srv(1), |s| s.max_conns = 1)]);
    let mut held = s.up.begin(
        SelectKey::None,
        RetryPolicy::default(),
        RequestFacts::default(),
        s.now(),
    );
    let _g = s.up.select(&mut held, s.now()).expect("A");
    assert_eq!(s.get(|_| Be::Ok), (502, vec![]));
}

#[test]
fn least_conn_prefers_fewer_connections_per_weight_then_round_robin() {
    let f = fixture(
        vec![
            with(srv(1), |s| s.weight = NonZeroU32::new(2).expect("2")),
            srv(2),
            srv(3),
        ],
        Balancer::LeastConn,
    );
    let mut sels: Vec<Selection> = (0..4)
        .map(|_| {
            f.up.begin(
                SelectKey::None,
                RetryPolicy::default(),
                RequestFacts::default(),
                f.now(),
            )
        })
        .collect();
    let mut held = Vec::new();
    let mut picks = Vec::new();
    for sel in sels.iter_mut() {
        let g = f.up.select(sel, f.now()).expect("peer");
        picks.push(g.peer().id().0);
        held.push(g);
    }
    // all idle: round robin among ties by weight (A has weight 2);
    // then loads 1/2, 0, 0 → B and C; then 1/2, 1, 1 → A
    assert_eq!(picks[0], 0);
    assert!(
        picks[1..3].contains(&1) && picks[1..3].contains(&2),
        "{picks:?}"
    );
    assert_eq!(picks[3], 0);
}

#[test]
fn active_down_takes_a_peer_out_at_once_and_admin_drain_too() {
    let mut a = srv(1);
    a.max_fails = 1;
    let mut cfg = UpstreamConfig::new("u");
    cfg.servers = vec![a, srv(2)];
    cfg.check = Some(CheckConfig {
        initial: crate::config::InitialState::Up,
        ..CheckConfig::default()
    });
    let clock = Arc::new(ManualClock::at(5));
    let events = Arc::new(EventBus::default());
    let up = Arc::new(Upstream::new(cfg, events.clone(), clock.clone()));
    let f = Fixture { up, clock, events };
    for _ in 0..5 {
        f.up.record_probe(
            PeerId(0),
            ProbeReport {
                ok: false,
                phase: Some(crate::health::ProbePhase::Connect),
                latency: Duration::from_millis(1),
                detail: "connection refused".into(),
                at: f.now(),
            },
        );
    }
    for _ in 0..4 {
        assert_eq!(f.get(|_| Be::Ok).1, vec![1]);
    }
    let reasons = &f.up.status(f.now())[0].reasons;
    assert!(
        matches!(reasons[0], Ineligible::ProbeDown { fail_streak: 5, .. }),
        "{reasons:?}"
    );
    f.up.set_admin(PeerId(1), AdminState::Drain, f.now());
    assert_eq!(f.get(|_| Be::Ok), (502, vec![]));
    let kinds: Vec<&str> = f
        .events
        .since(0, 10)
        .events
        .iter()
        .map(|e| e.kind.name())
        .collect();
    assert_eq!(kinds, vec!["probe_down", "admin"]);
}

#[test]
fn reload_keeps_state_of_unchanged_peers_only() {
    let f = rr(vec![srv(1), srv(2)]);
    f.get(|i| if i == 0 { Be::Fail(error()) } else { Be::Ok });
    assert!(f.excluded(0));
    let mut cfg = f.up.config().clone();
    cfg.servers[1].weight = NonZeroU32::new(3).expect("3");
    cfg.servers.push(srv(3));
    let up2 = Arc::new(Upstream::with_previous(
        cfg,
        Some(&f.up),
        f.events.clone(),
        f.clock.clone(),
    ));
    let st = up2.status(f.now());
    assert_eq!(st[0].passive.fails, 1, "unchanged peer keeps its failures");
    assert!(st[0]
        .reasons
        .iter()
        .any(|r| matches!(r, Ineligible::Excluded { .. })));
    assert_eq!(
        st[1].passive,
        PassiveView {
            effective_weight: 3,
            ..PassiveView::default()
        }
    );
}

#[derive(Clone, Debug)]
enum Op {
    Request(Vec<u8>),
    Advance(u16),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        proptest::collection::vec(0u8..6, 1..6).prop_map(Op::Request),
        (0u16..3000).prop_map(Op::Advance),
    ]
}

proptest! {
    /// Whatever happens, no connection count leaks, a request never sees a
    /// peer twice (within a tier), and attempts never exceed the tries.
    #[test]
    fn accounting_invariants(
        weights in proptest::collection::vec(1u32..5, 1..6),
        backup in any::<bool>(),
        balancer in 0u8..5,
        ops in proptest::collection::vec(op(), 1..60),
    ) {
        let mut servers: Vec<ServerConfig> = weights.iter().enumerate().map(|(i, w)| with(srv(i as u16 + 1), |s| {
            s.weight = NonZeroU32::new(*w).unwrap_or(NonZeroU32::MIN);
            s.fail_timeout = Duration::from_secs(2);
        })).collect();
        let balancer = match balancer {
            0 => Balancer::RoundRobin,
            1 => Balancer::LeastConn,
            2 => Balancer::Hash { key: "k".into(), consistent: true },
            3 => Balancer::IpHash,
            _ => Balancer::Random { two: true },
        };
        let hashing = !matches!(balancer, Balancer::RoundRobin | Balancer::LeastConn);
        if backup && !hashing {
            servers.push(with(srv(9), |s| s.backup = true));
        }
        let f = fixture(servers, balancer);
        let n = f.up.peers().len();
        for op in ops {
            match op {
                Op::Advance(ms) => f.advance(u64::from(ms)),
                Op::Request(script) => {
                    let p = RetryPolicy { next_upstream: NextUpstream::nginx_default().with(FailureClass::Http503), ..RetryPolicy::default() };
                    let key = [script[0]];
                    let mut sel = f.up.begin(SelectKey::Hash(&key), p, RequestFacts::default(), f.now());
                    let mut seen = Vec::new();
                    for step in script.iter().cycle().take(10) {
                        let Ok(g) = f.up.select(&mut sel, f.now()) else { break };
                        let id = g.peer().id().0 as usize;
                        prop_assert!(!seen.contains(&id), "peer {} twice in {:?}", id, seen);
                        seen.push(id);
                        let done = match step % 3 {
                            0 => { drop(g); true }
                            1 => matches!(sel.on_status(g, 503, f.now()), StatusVerdict::PassThrough(..)),
                            _ => !sel.on_failure(g, error(), f.now()).is_retry(),
                        };
                        if done { break; }
                    }
                    prop_assert!(seen.len() <= n);
                }
            }
            for p in f.up.peers() {
                prop_assert_eq!(p.conns(), 0);
            }
        }
    }
}

#[derive(Clone, Debug)]
enum FastOp {
    /// A request; each attempt's result from the script (0 ok, 1 error, 2
    /// listed 503, 3 404, 4 a body cut short after a 200).
    Request(Vec<u8>),
    Advance(u16),
    Probe(u8, bool),
    Admin(u8, u8),
    Status,
    /// A fleet member's halving of a peer's weight for so many ms.
    Halve(u8, u16),
}

fn fast_op() -> impl Strategy<Value = FastOp> {
    prop_oneof![
        6 => proptest::collection::vec(0u8..5, 1..4).prop_map(FastOp::Request),
        2 => (0u16..4000).prop_map(FastOp::Advance),
        1 => (0u8..8, any::<bool>()).prop_map(|(p, ok)| FastOp::Probe(p, ok)),
        1 => (0u8..8, 0u8..3).prop_map(|(p, a)| FastOp::Admin(p, a)),
        1 => Just(FastOp::Status),
        1 => (0u8..8, 1u16..4000).prop_map(|(p, ms)| FastOp::Halve(p, ms)),
    ]
}

/// nginx's rules (most cases), or some of vigil's on top.
fn rules_strategy() -> impl Strategy<Value = crate::config::HealthRules> {
    use crate::config::{HealthRules, PassiveCount, Penalty, Recovery};
    prop_oneof![
        2 => Just(HealthRules::default()),
        1 => (
            any::<(bool, bool)>(),
            prop_oneof![Just(Recovery::Window), Just(Recovery::Probe), (1u32..4).prop_map(|n| Recovery::Probation(NonZeroU32::new(n).unwrap_or(NonZeroU32::MIN)))],
            proptest::option::of((1u64..3000, 1u64..20_000, 0u8..=50)),
            proptest::option::of(0u8..=100),
        ).prop_map(|((after_header, last_try), recovery, penalty, max_ejected)| HealthRules {
            count: PassiveCount { after_header, last_try },
            recovery,
            penalty: penalty.map(|(b, m, j)| Penalty { base: Duration::from_millis(b), max: Duration::from_millis(m), jitter_percent: j }),
            max_ejected,
            ..HealthRules::default()
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// The round-robin fast path picks exactly what nginx's scan picks,
    /// through failures, exclusions, probe and admin changes, retries,
    /// status reads, fleet halvings and time, with or without slow-start
    /// ramps and the other vigil rules.
    #[test]
    fn fast_path_equals_the_scan(
        weights in proptest::collection::vec(1u32..6, 2..8),
        down in proptest::collection::vec(any::<bool>(), 8),
        slow_start in proptest::collection::vec(proptest::option::of(1u64..5000), 8),
        rules in rules_strategy(),
        backup in any::<bool>(),
        ops in proptest::collection::vec(fast_op(), 1..150),
    ) {
        let mut servers: Vec<ServerConfig> = weights.iter().enumerate().map(|(i, w)| with(srv(i as u16 + 1), |s| {
            s.weight = NonZeroU32::new(*w).unwrap_or(NonZeroU32::MIN);
            s.max_fails = 1 + (i as u32 % 3);
            s.fail_timeout = Duration::from_secs(2);
            s.down = down[i] && i > 1;
            s.slow_start = slow_start[i].map(Duration::from_millis);
        })).collect();
        if backup {
            servers.push(with(srv(20), |s| s.backup = true));
            servers.push(with(srv(21), |s| s.backup = true));
        }
        let mut cfg = UpstreamConfig::new("u");
        cfg.servers = servers;
        cfg.rules = rules;
        cfg.check = Some(CheckConfig { initial: crate::config::InitialState::Up, fall: NonZeroU32::MIN, rise: NonZeroU32::MIN, ..CheckConfig::default() });
        let clock = Arc::new(ManualClock::at(1_000_000));
        let fast = Arc::new(Upstream::new(cfg.clone(), Arc::new(EventBus::default()), clock.clone()));
        let slow = Arc::new(Upstream::new(cfg, Arc::new(EventBus::default()), clock.clone()).without_fast_path());
        fast.seed_jitter(11);
        slow.seed_jitter(11);
        let n = fast.peers().len();
        let p = RetryPolicy { next_upstream: NextUpstream::nginx_default().with(FailureClass::Http503).with(FailureClass::Http404), ..RetryPolicy::default() };
        let mut fast_picks = 0usize;
        for op in ops {
            let now = clock.now();
            match op {
                FastOp::Advance(ms) => clock.advance(Duration::from_millis(u64::from(ms))),
                FastOp::Probe(i, ok) => {
                    let id = PeerId(u32::from(i) % n as u32);
                    let report = ProbeReport { ok, phase: None, latency: Duration::ZERO, detail: String::new(), at: now };
                    fast.record_probe(id, report.clone());
                    slow.record_probe(id, report);
                }
                FastOp::Admin(i, a) => {
                    let id = PeerId(u32::from(i) % n as u32);
                    let to = [AdminState::Up, AdminState::Down, AdminState::Drain][a as usize];
                    fast.set_admin(id, to, now);
                    slow.set_admin(id, to, now);
                }
                FastOp::Halve(i, ms) => {
                    let id = PeerId(u32::from(i) % n as u32);
                    let until = Timestamp(now.0 + u64::from(ms));
                    fast.halve_weight(id, until, "m", now);
                    slow.halve_weight(id, until, "m", now);
                }
                FastOp::Status => {
                    let (a, b) = (fast.status(now), slow.status(now));
                    for (x, y) in a.iter().zip(b.iter()) {
                        prop_assert_eq!(x.passive, y.passive);
                    }
                }
                FastOp::Request(script) => {
                    let mut seqs = Vec::new();
                    for up in [&fast, &slow] {
                        if Arc::ptr_eq(up, &fast) && fast.on_fast_path() {
                            fast_picks += 1;
                        }
                        let mut sel = up.begin(SelectKey::None, p, RequestFacts::default(), now);
                        let mut seq = Vec::new();
                        for step in script.iter() {
                            let Ok(g) = up.select(&mut sel, now) else { seq.push(usize::MAX); break };
                            seq.push(g.peer().id().0 as usize);
                            let done = match step {
                                0 => { drop(g); true }
                                1 => !sel.on_failure(g, error(), now).is_retry(),
                                2 => matches!(sel.on_status(g, 503, now), StatusVerdict::PassThrough(..)),
                                3 => matches!(sel.on_status(g, 404, now), StatusVerdict::PassThrough(..)),
                                _ => match sel.on_status(g, 200, now) {
                                    StatusVerdict::PassThrough(mut g, _) => {
                                        g.fail_after_header(FailureClass::Error, now);
                                        true
                                    }
                                    StatusVerdict::Retry(_) => false,
                                },
                            };
                            if done { break; }
                        }
                        seqs.push(seq);
                    }
                    prop_assert_eq!(&seqs[0], &seqs[1]);
                }
            }
        }
        let (a, b) = (fast.status(clock.now()), slow.status(clock.now()));
        for (x, y) in a.iter().zip(b.iter()) {
            prop_assert_eq!(x.passive, y.passive);
        }
        let _ = fast_picks;
    }
}

#[test]
fn a_healthy_round_robin_tier_follows_the_cycle_and_comes_back_to_it() {
    let f = rr(vec![
        with(srv(1), |s| s.weight = NonZeroU32::new(3).expect("3")),
        srv(2),
        srv(3),
    ]);
    assert!(f.up.on_fast_path());
    f.get(|_| Be::Ok);
    assert!(f.up.on_fast_path(), "healthy picks stay on the cycle");
    f.until_a(|i| if i == 0 { Be::Fail(error()) } else { Be::Ok });
    f.get(|_| Be::Ok);
    assert!(!f.up.on_fast_path(), "a failure leaves it");
    f.advance(10_001);
    for _ in 0..50 {
        f.get(|_| Be::Ok);
    }
    assert!(
        f.up.on_fast_path(),
        "after readmission the scan lands back on the cycle"
    );
}

#[test]
fn random_spreads_by_weight_and_skips_ineligible_peers() {
    let f = fixture(
        vec![
            with(srv(1), |s| s.weight = NonZeroU32::new(3).expect("3")),
            srv(2),
            with(srv(3), |s| s.down = true),
        ],
        Balancer::Random { two: false },
    );
    let mut counts = [0usize; 3];
    for seed in 0..4000u64 {
        let mut sel = f.up.begin_seeded(
            SelectKey::None,
            RetryPolicy::default(),
            RequestFacts::default(),
            f.now(),
            seed * 7919 + 1,
        );
        let g = f.up.select(&mut sel, f.now()).expect("peer");
        counts[g.peer().id().0 as usize] += 1;
    }
    assert_eq!(counts[2], 0, "a down peer is never drawn");
    let share = counts[0] as f64 / 4000.0;
    assert!(
        (0.70..0.80).contains(&share),
        "weight 3 of 4 draws about 75%: {counts:?}"
    );
}

#[test]
fn random_two_keeps_the_less_loaded_and_the_second_draw_on_ties() {
    let f = fixture(vec![srv(1), srv(2)], Balancer::Random { two: true });
    // Load peer 0 with one request in flight: every pick must be peer 1.
    let mut held = f.up.begin_seeded(
        SelectKey::None,
        RetryPolicy::default(),
        RequestFacts::default(),
        f.now(),
        3,
    );
    let g0 = f.up.select(&mut held, f.now()).expect("peer");
    let busy = g0.peer().id().0 as usize;
    for seed in 1..200u64 {
        let mut sel = f.up.begin_seeded(
            SelectKey::None,
            RetryPolicy::default(),
            RequestFacts::default(),
            f.now(),
            seed,
        );
        let g = f.up.select(&mut sel, f.now()).expect("peer");
        assert_ne!(
            g.peer().id().0 as usize,
            busy,
            "two choices never keep the busier peer"
        );
    }
    drop(g0);
    // Equal load: both peers are picked (the second draw wins ties, so it is not always the first).
    let mut seen = [false; 2];
    for seed in 1..200u64 {
        let mut sel = f.up.begin_seeded(
            SelectKey::None,
            RetryPolicy::default(),
            RequestFacts::default(),
            f.now(),
            seed,
        );
        seen[f.up.select(&mut sel, f.now()).expect("peer").peer().id().0 as usize] = true;
    }
    assert_eq!(seen, [true, true]);
}

#[test]
fn hashing_rehashes_past_an_ineligible_peer_and_falls_back_to_round_robin_after_20_tries() {
    for balancer in [
        Balancer::Hash {
            key: "k".into(),
            consistent: false,
        },
        Balancer::Hash {
            key: "k".into(),
            consistent: true,
        },
        Balancer::IpHash,
    ] {
        let f = fixture(vec![srv(1), srv(2), srv(3)], balancer.clone());
        let key = |f: &Fixture| {
            let mut sel = f.up.begin(
                SelectKey::Hash(b"user-42"),
                RetryPolicy::default(),
                RequestFacts::default(),
                f.now(),
            );
            if balancer == Balancer::IpHash {
                sel = f.up.begin(
                    SelectKey::Client("10.1.2.3".parse().expect("ip")),
                    RetryPolicy::default(),
                    RequestFacts::default(),
                    f.now(),
                );
            }
            let g = f.up.select(&mut sel, f.now()).expect("peer");
            g.peer().id().0 as usize
        };
        let home = key(&f);
        assert_eq!(key(&f), home, "{balancer:?}: a key keeps its peer");
        // Take the home peer out: the key moves to another peer, deterministically.
        f.up.set_admin(PeerId(home as u32), AdminState::Down, f.now());
        let moved = key(&f);
        assert_ne!(moved, home);
        assert_eq!(key(&f), moved, "{balancer:?}: the rehash is deterministic");
        // Only the home peer left eligible, then none: after 20 misses the
        // hash gives up and round robin finds the one that is left.
        for i in 0..3 {
            f.up.set_admin(
                PeerId(i),
                if i as usize == home {
                    AdminState::Up
                } else {
                    AdminState::Down
                },
                f.now(),
            );
        }
        assert_eq!(key(&f), home);
    }
    // A single live peer behind many down ones: the hash misses 20 times
    // (down peers keep their place in the hash), then round robin finds it.
    let mut servers: Vec<ServerConfig> =
        (1..=40).map(|i| with(srv(i), |s| s.down = true)).collect();
    servers[17].down = false;
    let f = fixture(
        servers,
        Balancer::Hash {
            key: "k".into(),
            consistent: false,
        },
    );
    for k in 0..50u32 {
        let key = k.to_string();
        let mut sel = f.up.begin(
            SelectKey::Hash(key.as_bytes()),
            RetryPolicy::default(),
            RequestFacts::default(),
            f.now(),
        );
        assert_eq!(
            f.up.select(&mut sel, f.now()).expect("peer").peer().id().0,
            17
        );
    }
}

#[test]
fn every_verdict_says_what_core_charged_and_why_it_did_not_retry() {
    let http503 = RetryPolicy {
        next_upstream: NextUpstream::nginx_default().with(FailureClass::Http503),
        ..RetryPolicy::default()
    };
    // Two servers, max_fails=1: the first failure is charged and excludes.
    let f = rr(vec![srv(1), srv(2)]);
    let mut sel =
        f.up.begin(SelectKey::None, http503, RequestFacts::default(), f.now());
    let g = f.up.select(&mut sel, f.now()).expect("peer");
    let StatusVerdict::Retry(a) = sel.on_status(g, 503, f.now()) else {
        panic!("a listed 503 with another try left is retried");
    };
    assert_eq!(
        a,
        Accounting {
            charged: Some(FailureClass::Http503),
            excluded: true,
            rule: None,
        }
    );
    // The last try passes the 503 through, charged nothing (nginx counts it a success).
    let g = f.up.select(&mut sel, f.now()).expect("peer");
    assert!(matches!(
        sel.on_status(g, 503, f.now()),
        StatusVerdict::PassThrough(_, Some(RetryDenied::Tries))
    ));

    // A 404 listed moves on but is never charged.
    let f = rr(vec![srv(1), srv(2)]);
    let p404 = RetryPolicy {
        next_upstream: NextUpstream::nginx_default().with(FailureClass::Http404),
        ..RetryPolicy::default()
    };
    let mut sel =
        f.up.begin(SelectKey::None, p404, RequestFacts::default(), f.now());
    let g = f.up.select(&mut sel, f.now()).expect("peer");
    assert!(matches!(
        sel.on_status(g, 404, f.now()),
        StatusVerdict::Retry(Accounting {
            charged: None,
            excluded: false,
            rule: None,
        })
    ));

    // A POST that reached the peer is charged but not retried.
    let f = rr(vec![srv(1), srv(2)]);
    let post = RequestFacts {
        non_idempotent: true,
        body_replayable: true,
        hedgeable: false,
    };
    let mut sel =
        f.up.begin(SelectKey::None, RetryPolicy::default(), post, f.now());
    let g = f.up.select(&mut sel, f.now()).expect("peer");
    let v = sel.on_failure(g, error(), f.now());
    assert_eq!(
        v,
        FailureVerdict::Fail {
            status: 502,
            accounting: Accounting {
                charged: Some(FailureClass::Error),
                excluded: true,
                rule: None,
            },
            denied: RetryDenied::NonIdempotent,
        }
    );

    // A streamed body cannot be sent twice.
    let f = rr(vec![srv(1), srv(2)]);
    let streamed = RequestFacts {
        non_idempotent: false,
        body_replayable: false,
        hedgeable: false,
    };
    let mut sel =
        f.up.begin(SelectKey::None, RetryPolicy::default(), streamed, f.now());
    let g = f.up.select(&mut sel, f.now()).expect("peer");
    assert!(matches!(
        sel.on_failure(g, error(), f.now()),
        FailureVerdict::Fail {
            denied: RetryDenied::BodyNotReplayable,
            ..
        }
    ));

    // The single server of an upstream: never charged, never retried.
    let f = rr(vec![srv(1)]);
    let mut sel = f.up.begin(
        SelectKey::None,
        RetryPolicy::default(),
        RequestFacts::default(),
        f.now(),
    );
    let g = f.up.select(&mut sel, f.now()).expect("peer");
    assert_eq!(
        sel.on_failure(g, error(), f.now()),
        FailureVerdict::Fail {
            status: 502,
            accounting: Accounting::default(),
            denied: RetryDenied::SingleServer,
        }
    );
    assert_eq!(f.up.status(f.now())[0].passive.fails, 0);
}

#[test]
fn a_guard_knows_when_its_attempt_started() {
    let f = rr(vec![srv(1), srv(2)]);
    let mut sel = f.up.begin(
        SelectKey::None,
        RetryPolicy::default(),
        RequestFacts::default(),
        f.now(),
    );
    let t0 = f.now();
    let g = f.up.select(&mut sel, t0).expect("peer");
    f.advance(250);
    assert_eq!(g.started(), t0);
    assert_eq!(f.now().millis_since(g.started()), 250);
}

mod halve;
mod latency;
mod limits;
mod rules;
mod traffic;
