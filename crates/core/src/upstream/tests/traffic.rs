//! Simulated-time tests of `retry_budget` and `hedge`: the budget's limits
//! on retries, the hedge's limits (tries, budget, method, body, list), and
//! what a cancelled attempt leaves behind (nothing).

use super::rules::{ruled, rules};
use super::*;
use crate::config::{Hedge, HedgeAfter, RetryBudget};

fn budget(ratio_percent: u8, min_per_sec: u32) -> Option<RetryBudget> {
    Some(RetryBudget {
        ratio_percent,
        min_per_sec,
    })
}

fn hedge(ms: u64, max: u32) -> Option<Hedge> {
    Some(Hedge {
        after: HedgeAfter::Fixed(Duration::from_millis(ms)),
        max: NonZeroU32::new(max).expect("max > 0"),
    })
}

fn traffic(n: u16, budget: Option<RetryBudget>, hedge: Option<Hedge>, max_fails: u32) -> Fixture {
    let servers = (1..=n)
        .map(|i| with(srv(i), |s| s.max_fails = max_fails))
        .collect();
    let r = rules(|r| {
        r.retry_budget = budget;
        r.hedge = hedge;
    });
    ruled(servers, r, None, Balancer::RoundRobin)
}

impl Fixture {
    fn begin(&self, policy: RetryPolicy, facts: RequestFacts) -> Selection {
        self.up.begin(SelectKey::None, policy, facts, self.now())
    }

    fn tokens(&self) -> f64 {
        self.up
            .retry_budget_now(self.now())
            .expect("a budget")
            .tokens
    }

    fn denied(&self) -> u64 {
        self.up
            .retry_budget_now(self.now())
            .expect("a budget")
            .denied
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

fn tries(n: u32) -> RetryPolicy {
    RetryPolicy {
        tries: n,
        ..RetryPolicy::default()
    }
}

fn idx(g: &PeerGuard) -> usize {
    g.peer().id().0 as usize
}

#[test]
fn an_empty_budget_answers_the_failure_and_still_charges_it() {
    // min=1/s and no ratio: one retry a second for the whole upstream.
    let f = traffic(3, budget(0, 1), None, 10);
    let (status, seen) = f.get(|_| Be::Fail(error()));
    // The first failure is retried (the reserve pays), the second is not.
    assert_eq!((status, seen.len()), (502, 2));
    assert_eq!(f.denied(), 1);
    for &i in &seen {
        assert_eq!(f.fails(i), 1, "peer {i} charged, retried or not");
    }
    // The verdict names the budget.
    let mut sel = f.begin(RetryPolicy::default(), RequestFacts::default());
    let g = f.up.select(&mut sel, f.now()).expect("a peer");
    match sel.on_failure(g, error(), f.now()) {
        FailureVerdict::Fail {
            status: 502,
            denied: RetryDenied::Budget,
            accounting,
        } => assert!(accounting.charged.is_some(), "charged as usual"),
        v => panic!("expected a budget denial, got {v:?}"),
    }
    // A second later the reserve has a token again.
    f.advance(1_000);
    assert_eq!(f.get(|_| Be::Fail(error())).1.len(), 2);
}

#[test]
fn a_status_the_budget_cannot_retry_passes_through_charged() {
    let f = traffic(2, budget(0, 0), None, 10);
    let mut sel = f.begin(http503(), RequestFacts::default());
    let g = f.up.select(&mut sel, f.now()).expect("a peer");
    let i = idx(&g);
    match sel.on_status(g, 503, f.now()) {
        StatusVerdict::PassThrough(g, Some(RetryDenied::Budget)) => {
            assert_eq!(g.accounting().charged, Some(FailureClass::Http503));
            assert_eq!(g.accounting().rule, None, "nginx would have charged it too");
        }
        _ => panic!("a 503 the budget cannot retry is passed through"),
    }
    // Dropping the guard after the body does not turn it into a success.
    assert_eq!(f.fails(i), 1);
    // Without a budget the same 503 is retried.
    let f = traffic(2, None, None, 10);
    assert_eq!(
        f.request(http503(), RequestFacts::default(), |i| if i == 0 {
            Be::Status(503)
        } else {
            Be::Ok
        })
        .1,
        vec![0, 1]
    );
}

#[test]
fn the_ratio_pays_for_r_percent_of_the_requests_and_the_min_for_the_rest() {
    // 25% and no reserve: every fourth request earns one retry.
    let f = traffic(2, budget(25, 0), None, 0);
    let mut retried = 0;
    for _ in 0..20 {
        if f.get(fail_a).1.len() == 2 {
            retried += 1;
        }
    }
    // 20 requests deposit 5 tokens; about half the requests try peer 0.
    assert!(retried <= 5, "{retried} retries for 20 requests at 25%");
    assert!(retried >= 4, "the ratio pays as its tokens come: {retried}");
    // With min=2/s too, two more a second on top of the ratio.
    let f = traffic(2, budget(25, 2), None, 0);
    let mut retried = 0;
    for _ in 0..20 {
        if f.get(fail_a).1.len() == 2 {
            retried += 1;
        }
    }
    assert!((6..=7).contains(&retried), "{retried}");
    // Ten seconds later the old requests no longer pay.
    f.advance(10_000);
    assert!(
        f.tokens() <= 2.0,
        "only the reserve is left: {}",
        f.tokens()
    );
}

#[test]
fn a_hedge_is_a_try_and_a_budget_token() {
    let f = traffic(3, budget(0, 1), hedge(50, 2), 1);
    let facts = RequestFacts::default();
    // proxy_next_upstream_tries 2: one hedge, not two.
    let mut sel = f.begin(tries(2), facts);
    let a = f.up.select(&mut sel, f.now()).expect("a peer");
    assert_eq!(
        f.up.hedge_after(&sel, f.now(), false),
        Some(Duration::from_millis(50))
    );
    let b = f.up.hedge(&mut sel, f.now(), false).expect("a hedge");
    assert_ne!(idx(&a), idx(&b));
    assert_eq!(sel.attempts(), 2);
    assert_eq!(
        f.up.hedge(&mut sel, f.now(), false).err(),
        Some(RetryDenied::Tries)
    );
    // The hedge took the reserve's one token: the next request's is denied.
    let mut sel = f.begin(RetryPolicy::default(), facts);
    let _c = f.up.select(&mut sel, f.now()).expect("a peer");
    assert_eq!(
        f.up.hedge(&mut sel, f.now(), false).err(),
        Some(RetryDenied::Budget)
    );
    assert_eq!(f.denied(), 1);
    // And so is a retry after a failure.
    drop((a, b));
    f.advance(1_000);
    let mut sel = f.begin(RetryPolicy::default(), facts);
    let _d = f.up.select(&mut sel, f.now()).expect("a peer");
    let _e = f.up.hedge(&mut sel, f.now(), false).expect("a token again");
    assert_eq!(
        f.up.hedge(&mut sel, f.now(), false).err(),
        Some(RetryDenied::Budget)
    );
}

#[test]
fn max_hedges_per_request() {
    let f = traffic(4, None, hedge(50, 2), 1);
    let mut sel = f.begin(RetryPolicy::default(), RequestFacts::default());
    let _a = f.up.select(&mut sel, f.now()).expect("a peer");
    let _b = f.up.hedge(&mut sel, f.now(), false).expect("hedge 1");
    assert!(f.up.hedge_after(&sel, f.now(), false).is_some());
    let _c = f.up.hedge(&mut sel, f.now(), false).expect("hedge 2");
    assert_eq!(sel.hedges(), 2);
    assert_eq!(f.up.hedge_after(&sel, f.now(), false), None, "max=2 sent");
    assert_eq!(
        f.up.hedge(&mut sel, f.now(), false).err(),
        Some(RetryDenied::Tries)
    );
}

#[test]
fn the_cancelled_attempt_is_neither_charged_nor_counted_a_success() {
    let f = traffic(2, None, hedge(50, 1), 2);
    // Peer 0 carries one failure; a success more than fail_timeout later
    // would forgive it, a cancel must not.
    f.until_a(fail_a);
    assert_eq!(f.fails(0), 1);
    f.advance(11_000);
    let (mut sel, a) = f.hold(0);
    let b = f.up.hedge(&mut sel, f.now(), false).expect("a hedge");
    assert_eq!(idx(&b), 1);
    match sel.on_status(b, 200, f.now()) {
        StatusVerdict::PassThrough(b, None) => drop(b),
        _ => panic!("the hedge's 200 wins"),
    }
    let events = f.kinds().len();
    a.cancel();
    let st = f.up.status(f.now());
    assert_eq!(st[0].passive.fails, 1, "not charged, not forgiven");
    assert_eq!(st[0].peer.conns(), 0, "released");
    assert_eq!(f.kinds().len(), events, "no event");
}

#[test]
fn while_a_hedge_races_a_failure_waits_for_it() {
    let f = traffic(3, budget(0, 1), hedge(50, 1), 1);
    let mut sel = f.begin(http503(), RequestFacts::default());
    let a = f.up.select(&mut sel, f.now()).expect("a peer");
    let ia = idx(&a);
    let b = f.up.hedge(&mut sel, f.now(), false).expect("a hedge");
    // The first attempt fails: charged, and the request waits for the hedge
    // (no token is taken: the budget paid for the hedge already).
    let v = sel.on_failure(a, error(), f.now());
    assert!(v.is_retry() && v.accounting().charged.is_some());
    assert_eq!(f.fails(ia), 1);
    assert_eq!(sel.in_flight(), 1);
    // The hedge answers 503: now nothing is in flight and the budget is
    // empty, so the 503 goes to the client.
    match sel.on_status(b, 503, f.now()) {
        StatusVerdict::PassThrough(_, Some(RetryDenied::Budget)) => {}
        _ => panic!("the hedge's 503 is the answer"),
    }
    // A listed status while the other races: charged, wait for the other.
    let f = traffic(3, None, hedge(50, 1), 1);
    let mut sel = f.begin(http503(), RequestFacts::default());
    let a = f.up.select(&mut sel, f.now()).expect("a peer");
    let ia = idx(&a);
    let _b = f.up.hedge(&mut sel, f.now(), false).expect("a hedge");
    assert!(matches!(
        sel.on_status(a, 503, f.now()),
        StatusVerdict::Retry(Accounting {
            charged: Some(FailureClass::Http503),
            ..
        })
    ));
    assert_eq!(f.fails(ia), 1);
}

#[test]
fn only_requests_that_may_time_out_onto_another_peer_are_hedged() {
    let f = traffic(2, None, hedge(50, 1), 1);
    let cases = [
        (
            RetryPolicy::default(),
            RequestFacts::new("POST", true),
            RetryDenied::NonIdempotent,
        ),
        (
            // Even where proxy_next_upstream allows non_idempotent.
            RetryPolicy {
                next_upstream: NextUpstream::nginx_default().with_non_idempotent(),
                ..RetryPolicy::default()
            },
            RequestFacts::new("PATCH", true),
            RetryDenied::NonIdempotent,
        ),
        (
            RetryPolicy::default(),
            RequestFacts::new("PUT", false),
            RetryDenied::BodyNotReplayable,
        ),
        (
            RetryPolicy {
                next_upstream: NextUpstream::OFF.with(FailureClass::Error),
                ..RetryPolicy::default()
            },
            RequestFacts::default(),
            RetryDenied::NotListed,
        ),
    ];
    for (policy, facts, why) in cases {
        let mut sel = f.begin(policy, facts);
        let a = f.up.select(&mut sel, f.now()).expect("a peer");
        assert_eq!(f.up.hedge_after(&sel, f.now(), false), None, "{why:?}");
        assert_eq!(f.up.hedge(&mut sel, f.now(), false).err(), Some(why));
        assert_eq!(sel.attempts(), 1);
        // While the attempt is still connecting nothing was sent: a POST
        // or a streamed body may race a connect (it will be sent once);
        // without `timeout` listed, still no hedge.
        let racing = f.up.hedge(&mut sel, f.now(), true);
        if why == RetryDenied::NotListed {
            assert_eq!(racing.err(), Some(why));
        } else {
            assert!(
                f.up.hedge_after(&sel, f.now(), true).is_none(),
                "one hedge sent"
            );
            racing.expect("a connect race").cancel();
        }
        drop(a);
    }
    // A single server is never hedged.
    let f = traffic(1, None, hedge(50, 1), 1);
    let mut sel = f.begin(RetryPolicy::default(), RequestFacts::default());
    let _a = f.up.select(&mut sel, f.now()).expect("a peer");
    assert_eq!(f.up.hedge_after(&sel, f.now(), false), None);
    assert_eq!(
        f.up.hedge(&mut sel, f.now(), false).err(),
        Some(RetryDenied::SingleServer)
    );
    // Nor after proxy_next_upstream_timeout.
    let f = traffic(2, None, hedge(50, 1), 1);
    let policy = RetryPolicy {
        timeout: Some(Duration::from_millis(40)),
        ..RetryPolicy::default()
    };
    let mut sel = f.begin(policy, RequestFacts::default());
    let _a = f.up.select(&mut sel, f.now()).expect("a peer");
    f.advance(50);
    assert_eq!(
        f.up.hedge(&mut sel, f.now(), false).err(),
        Some(RetryDenied::Timeout)
    );
}

#[test]
fn a_hedge_that_finds_no_peer_gives_its_ratio_token_back() {
    let f = traffic(2, budget(100, 0), hedge(50, 1), 1);
    f.up.set_admin(
        crate::peer::PeerId(1),
        crate::peer::AdminState::Down,
        f.now(),
    );
    let mut sel = f.begin(RetryPolicy::default(), RequestFacts::default());
    let _a = f.up.select(&mut sel, f.now()).expect("a peer");
    assert_eq!(f.tokens(), 1.0);
    assert_eq!(
        f.up.hedge(&mut sel, f.now(), false).err(),
        Some(RetryDenied::NoPeer)
    );
    assert_eq!(f.tokens(), 1.0, "refunded");
    assert_eq!(f.denied(), 0, "not a budget denial");
}

#[test]
fn requests_are_counted_at_begin_and_a_reload_keeps_an_unchanged_budget() {
    let f = traffic(2, budget(10, 0), None, 1);
    for _ in 0..30 {
        drop(f.begin(RetryPolicy::default(), RequestFacts::default()));
    }
    let now = f.up.retry_budget_now(f.now()).expect("a budget");
    assert_eq!((now.requests, now.tokens), (30, 3.0));
    let next = Upstream::with_previous(
        f.up.config().clone(),
        Some(&f.up),
        f.events.clone(),
        f.clock.clone(),
    );
    assert_eq!(next.retry_budget_now(f.now()).map(|b| b.requests), Some(30));
    let mut cfg = f.up.config().clone();
    cfg.rules.retry_budget = budget(20, 0);
    let next = Upstream::with_previous(cfg, Some(&f.up), f.events.clone(), f.clock.clone());
    assert_eq!(next.retry_budget_now(f.now()).map(|b| b.requests), Some(0));
}

/// Two peers, hedged after the upstream's recent p90 time-to-header.
fn hedging_at_p90() -> Fixture {
    let mut f = traffic(2, None, None, 1);
    let mut cfg = f.up.config().clone();
    cfg.rules.hedge = Some(Hedge {
        after: HedgeAfter::Percentile(90),
        max: NonZeroU32::MIN,
    });
    f.up = Arc::new(Upstream::new(cfg, f.events.clone(), f.clock.clone()));
    f
}

/// One request whose header comes `ms` after it was sent.
fn answered_after(f: &mut Fixture, ms: u64) {
    let mut sel = f.begin(RetryPolicy::default(), RequestFacts::default());
    let g = f.up.select(&mut sel, f.now()).expect("a peer");
    f.advance(ms);
    match sel.on_status(g, 200, f.now()) {
        StatusVerdict::PassThrough(g, None) => drop(g),
        _ => panic!("200 passes"),
    }
}

#[test]
fn after_a_percentile_hedges_once_the_upstream_has_enough_headers() {
    let mut f = hedging_at_p90();
    let first = f.begin(RetryPolicy::default(), RequestFacts::default());
    assert_eq!(
        f.up.hedge_after(&first, f.now(), false),
        None,
        "no samples yet"
    );
    // Headers after 10 ms, and one in ten after 200 ms.
    for i in 0..super::super::MIN_SAMPLES * 2 {
        answered_after(&mut f, if i % 10 == 9 { 200 } else { 10 });
    }
    let sel = f.begin(RetryPolicy::default(), RequestFacts::default());
    let after = f.up.hedge_after(&sel, f.now(), false).expect("a p90 now");
    assert!(
        after >= Duration::from_millis(10) && after < Duration::from_millis(200),
        "p90 of 90% at 10 ms: {after:?}"
    );
}

#[test]
fn a_percentile_delay_follows_the_window_at_most_every_100_ms() {
    let mut f = hedging_at_p90();
    let n = super::super::MIN_SAMPLES;
    // Headers after 10 ms (8 of them) and at once (enough for a p90).
    for i in 0..n + 8 {
        answered_after(&mut f, if i < 8 { 10 } else { 0 });
    }
    let sel = f.begin(RetryPolicy::default(), RequestFacts::default());
    let fast = f.up.hedge_after(&sel, f.now(), false).expect("a p90");
    assert!(fast < Duration::from_millis(20), "{fast:?}");
    // Many attempts started now and answered 90 ms later: the window's
    // p90 is about 90 ms now, and the delay read stays for 100 ms.
    let mut waiting = Vec::new();
    for _ in 0..4 * n {
        let mut s = f.begin(RetryPolicy::default(), RequestFacts::default());
        let g = f.up.select(&mut s, f.now()).expect("a peer");
        waiting.push((s, g));
    }
    f.advance(90);
    for (mut s, g) in waiting {
        match s.on_status(g, 200, f.now()) {
            StatusVerdict::PassThrough(g, None) => drop(g),
            _ => panic!("200 passes"),
        }
    }
    assert_eq!(
        f.up.hedge_after(&sel, f.now(), false),
        Some(fast),
        "within 100 ms of the last reading"
    );
    f.advance(20);
    let later = f.up.hedge_after(&sel, f.now(), false).expect("a p90");
    assert!(later >= Duration::from_millis(80), "read again: {later:?}");
}

/// A POST in a connect race is sent once, by the attempt that connected
/// first: when that attempt fails after sending (or answers a listed
/// status), the other may not take over (nginx's non-idempotent rule),
/// unless `non_idempotent` is listed; a failure before sending waits for
/// the other, as for any hedge.
#[test]
fn a_post_in_a_connect_race_is_not_sent_again_after_the_sender_failed() {
    let f = traffic(3, None, hedge(50, 1), 1);
    let sent = TransportFailure {
        class: FailureClass::Error,
        request_sent: true,
        cached_connection: false,
    };
    let mut sel = f.begin(http503(), RequestFacts::new("POST", true));
    let a = f.up.select(&mut sel, f.now()).expect("a peer");
    let b = f.up.hedge(&mut sel, f.now(), true).expect("a connect race");
    match sel.on_failure(a, sent, f.now()) {
        FailureVerdict::Fail {
            denied: RetryDenied::NonIdempotent,
            ..
        } => {}
        v => panic!("the sender failed: {v:?}"),
    }
    b.cancel();
    let f = traffic(3, None, hedge(50, 1), 1);
    let mut sel = f.begin(http503(), RequestFacts::new("POST", true));
    let a = f.up.select(&mut sel, f.now()).expect("a peer");
    let b = f.up.hedge(&mut sel, f.now(), true).expect("a connect race");
    assert!(matches!(
        sel.on_status(a, 503, f.now()),
        StatusVerdict::PassThrough(_, Some(RetryDenied::NonIdempotent))
    ));
    b.cancel();
    // With non_idempotent listed, the other attempt may take over.
    let policy = RetryPolicy {
        next_upstream: NextUpstream::nginx_default().with_non_idempotent(),
        ..RetryPolicy::default()
    };
    let f = traffic(3, None, hedge(50, 1), 1);
    let mut sel = f.begin(policy, RequestFacts::new("POST", true));
    let a = f.up.select(&mut sel, f.now()).expect("a peer");
    let _b = f.up.hedge(&mut sel, f.now(), true).expect("a connect race");
    assert!(sel.on_failure(a, sent, f.now()).is_retry());
    // A failure before anything was sent (the connect) waits for the other.
    let f = traffic(3, None, hedge(50, 1), 1);
    let mut sel = f.begin(http503(), RequestFacts::new("POST", true));
    let a = f.up.select(&mut sel, f.now()).expect("a peer");
    let _b = f.up.hedge(&mut sel, f.now(), true).expect("a connect race");
    assert!(sel.on_failure(a, refused(), f.now()).is_retry());
}
