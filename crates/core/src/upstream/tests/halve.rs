//! Simulated-time tests of a fleet member's halving of a peer's weight
//! (`share_passive` for a peer without an active check): the share it
//! leaves over a cycle, its end at the given time, the round-robin fast
//! path leaving and coming back, weight 1, least_conn, random, and reload.

use super::*;
use crate::event::EventKind;

fn weighted(w: &[u32], balancer: Balancer) -> Fixture {
    let servers = w
        .iter()
        .enumerate()
        .map(|(i, w)| {
            with(srv(i as u16 + 1), |s| {
                s.weight = NonZeroU32::new(*w).expect("weight > 0")
            })
        })
        .collect();
    fixture(servers, balancer)
}

impl Fixture {
    /// Picks of `n` fresh requests, per peer.
    fn shares(&self, n: usize) -> Vec<usize> {
        let mut counts = vec![0; self.up.peers().len()];
        for _ in 0..n {
            let (_, seen) = self.get(|_| Be::Ok);
            counts[seen[0]] += 1;
        }
        counts
    }

    fn halve(&self, i: u32, ms: u64) -> bool {
        let now = self.now();
        self.up
            .halve_weight(PeerId(i), Timestamp(now.0 + ms), "b", now)
    }

    fn halving_events(&self) -> Vec<EventKind> {
        self.events
            .since(0, 1000)
            .events
            .into_iter()
            .map(|e| e.kind)
            .collect()
    }
}

#[test]
fn a_halved_peer_gets_its_halved_share_over_a_cycle_and_all_of_it_after() {
    // weights 4, 4: halved, 2 of every 6 picks go to the first.
    let f = weighted(&[4, 4], Balancer::RoundRobin);
    assert_eq!(f.shares(80), vec![40, 40]);
    assert!(f.halve(0, 10_000));
    assert_eq!(f.shares(60), vec![20, 40]);
    let st = &f.up.status(f.now())[0];
    assert_eq!((st.peer.config().weight.get(), st.weight_now), (4, 2));
    // It ends at T exactly: one ms before, still halved.
    f.advance(9_999);
    assert_eq!(f.up.status(f.now())[0].weight_now, 2);
    f.advance(1);
    assert_eq!(f.up.status(f.now())[0].weight_now, 4);
    let counts = f.shares(800);
    assert!(
        (399..=401).contains(&counts[0]),
        "whole again after the end: {counts:?}"
    );
}

#[test]
fn the_halving_and_its_end_are_events_naming_the_member() {
    let f = weighted(&[5, 1], Balancer::RoundRobin);
    let t0 = f.now();
    assert!(f.halve(0, 3_000));
    f.advance(3_000);
    f.get(|_| Be::Ok);
    let kinds = f.halving_events();
    assert_eq!(
        kinds,
        vec![
            EventKind::WeightHalved {
                from: 5,
                to: 2,
                until: Timestamp(t0.0 + 3_000),
                for_ms: 3_000,
                by: "b".into(),
            },
            EventKind::WeightRestored {
                weight: 5,
                by: "b".into()
            },
        ]
    );
    assert_eq!(f.up.peers()[0].halved_until(), Timestamp(0), "cleared");
    // An end in the past, or an unknown peer, is refused.
    assert!(!f.halve(0, 0));
    assert!(!f.halve(7, 1_000));
}

#[test]
fn a_halved_peer_leaves_the_fast_path_and_it_comes_back_at_the_end() {
    let f = weighted(&[4, 2, 2], Balancer::RoundRobin);
    f.get(|_| Be::Ok);
    assert!(f.up.on_fast_path());
    assert!(f.halve(0, 5_000));
    assert!(!f.up.on_fast_path(), "a halving leaves it");
    for _ in 0..20 {
        f.get(|_| Be::Ok);
        assert!(!f.up.on_fast_path(), "not while it lasts");
    }
    f.advance(5_000);
    for _ in 0..50 {
        f.get(|_| Be::Ok);
    }
    assert!(f.up.on_fast_path(), "back on the cycle once it ended");
    // Traffic-free ends are cleared by settle_halvings.
    assert!(f.halve(1, 1_000));
    f.advance(1_000);
    f.up.settle_halvings(f.now());
    assert_eq!(f.up.peers()[1].halved_until(), Timestamp(0));
    assert!(matches!(
        f.halving_events().last(),
        Some(EventKind::WeightRestored { weight: 2, .. })
    ));
}

#[test]
fn weight_one_stays_one_and_on_the_fast_path() {
    let f = weighted(&[1, 1], Balancer::RoundRobin);
    f.get(|_| Be::Ok);
    assert!(f.halve(0, 5_000));
    assert!(f.up.on_fast_path(), "nothing to halve: the cycle stands");
    assert_eq!(f.up.status(f.now())[0].weight_now, 1);
    assert_eq!(f.shares(40), vec![20, 20]);
    assert!(matches!(
        f.halving_events().last(),
        Some(EventKind::WeightHalved { from: 1, to: 1, .. })
    ));
}

#[test]
fn a_later_halving_extends_an_earlier_one_never_shortens_it() {
    let f = weighted(&[4, 4], Balancer::RoundRobin);
    let t0 = f.now();
    assert!(f.halve(0, 5_000));
    assert!(f.halve(0, 1_000));
    assert_eq!(f.up.peers()[0].halved_until(), Timestamp(t0.0 + 5_000));
    f.advance(4_000);
    assert!(f.halve(0, 3_000));
    assert_eq!(f.up.peers()[0].halved_until(), Timestamp(t0.0 + 7_000));
    f.advance(2_999);
    assert_eq!(f.shares(60), vec![20, 40], "still halved");
}

#[test]
fn least_conn_compares_the_halved_weight() {
    // conns 2 of weight 4 (0.5) against 3 of weight 4 (0.75): the first is
    // less loaded; halved, 2 of weight 2 (1.0) is more loaded.
    let f = weighted(&[4, 4], Balancer::LeastConn);
    let (a, b) = (&f.up.peers()[0], &f.up.peers()[1]);
    for _ in 0..2 {
        a.acquire();
    }
    for _ in 0..3 {
        b.acquire();
    }
    let pick = |f: &Fixture| {
        let mut sel = f.up.begin(
            SelectKey::None,
            RetryPolicy::default(),
            RequestFacts::default(),
            f.now(),
        );
        let g = f.up.select(&mut sel, f.now()).expect("a peer");
        g.peer().id().0
    };
    assert_eq!(pick(&f), 0);
    assert!(f.halve(0, 5_000));
    assert_eq!(pick(&f), 1);
    f.advance(5_000);
    assert_eq!(pick(&f), 0, "whole again");
}

#[test]
fn random_draws_follow_the_halved_weight() {
    // weights 4, 4; the first halved: its share is 2 / (2 + 4).
    let f = weighted(&[4, 4], Balancer::Random { two: false });
    assert!(f.halve(0, 1_000_000));
    let mut counts = [0usize; 2];
    for seed in 0..6000u64 {
        let mut sel = f.up.begin_seeded(
            SelectKey::None,
            RetryPolicy::default(),
            RequestFacts::default(),
            f.now(),
            seed,
        );
        let g = f.up.select(&mut sel, f.now()).expect("a peer");
        counts[g.peer().id().0 as usize] += 1;
    }
    assert!(
        (1700..2300).contains(&counts[0]),
        "about a third: {counts:?}"
    );
}

#[test]
fn a_reload_carries_the_halving_to_its_end_without_announcing_it_again() {
    let mut f = weighted(&[4, 4], Balancer::RoundRobin);
    assert!(f.halve(0, 10_000));
    let until = f.up.peers()[0].halved_until();
    let again = Upstream::with_previous(
        f.up.config().clone(),
        Some(&f.up),
        f.events.clone(),
        f.clock.clone(),
    );
    f.up = Arc::new(again);
    assert_eq!(f.up.peers()[0].halved_until(), until);
    assert_eq!(f.up.peers()[0].halved_by().as_deref(), Some("b"));
    assert_eq!(f.up.status(f.now())[0].weight_now, 2);
    assert_eq!(f.shares(60), vec![20, 40]);
    f.advance(10_000);
    assert_eq!(f.up.status(f.now())[0].weight_now, 4);
    let counts = f.shares(800);
    assert!(
        (399..=401).contains(&counts[0]),
        "whole again after the end: {counts:?}"
    );
    let kinds = f.halving_events();
    let halved = kinds
        .iter()
        .filter(|k| matches!(k, EventKind::WeightHalved { .. }))
        .count();
    let restored = kinds
        .iter()
        .filter(|k| matches!(k, EventKind::WeightRestored { .. }))
        .count();
    assert_eq!((halved, restored), (1, 1), "{kinds:?}");
}

#[test]
fn hash_methods_pick_by_the_key_whatever_the_halving() {
    for balancer in [
        Balancer::Hash {
            key: "k".into(),
            consistent: false,
        },
        Balancer::Hash {
            key: "k".into(),
            consistent: true,
        },
    ] {
        let f = weighted(&[4, 4, 4], balancer.clone());
        let homes = |f: &Fixture| -> Vec<u32> {
            (0..60u32)
                .map(|k| {
                    let key = format!("user-{k}");
                    let mut sel = f.up.begin(
                        SelectKey::Hash(key.as_bytes()),
                        RetryPolicy::default(),
                        RequestFacts::default(),
                        f.now(),
                    );
                    f.up.select(&mut sel, f.now()).expect("peer").peer().id().0
                })
                .collect()
        };
        let before = homes(&f);
        assert!(
            before.contains(&0),
            "{balancer:?}: some key lives on peer 0"
        );
        assert!(f.halve(0, 10_000));
        assert_eq!(
            homes(&f),
            before,
            "{balancer:?}: the same peer for each key"
        );
    }
}
