//! Simulated-time tests of the latency rules: time-to-header as core
//! measures it, `eject_stuck`, `eject_slow`, and their interactions with
//! `max_ejected`, recovery, slow start and the round-robin fast path.

use super::rules::ruled;
use super::*;
use crate::config::{preset, EjectSlow, EjectStuck, HealthRules};

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
    let _ = preset::STUCK;
}
