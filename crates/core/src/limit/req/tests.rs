//! The bucket in simulated time: `now` is an argument, so every figure
//! below is nginx's to the millisecond.

use super::*;
use crate::config::ReqDelay;

const MB: u64 = 1024 * 1024;

fn rule(zone: &ReqZone, rate: u64, burst: u32, delay: ReqDelay) -> ReqRule<'_> {
    ReqRule {
        zone,
        rate,
        burst: u64::from(burst) * 1000,
        delay: delay.milli(),
    }
}

/// The verdicts of requests from one key at the times `at`.
fn run(rules: &[ReqRule<'_>], at: &[u64]) -> Vec<ReqVerdict> {
    let keys = vec![&b"k"[..]; rules.len()];
    at.iter().map(|&t| check(rules, &keys, t)).collect()
}

fn delayed(ms: u64, excess: u64, rule: usize) -> ReqVerdict {
    ReqVerdict::Delayed { ms, excess, rule }
}

fn rejected(excess: u64, rule: usize) -> ReqVerdict {
    ReqVerdict::Rejected { excess, rule }
}

use ReqVerdict::Passed;

#[test]
fn a_burst_with_nodelay_passes_burst_plus_one_and_rejects_the_rest() {
    let z = ReqZone::new(MB);
    let r = [rule(&z, 1000, 2, ReqDelay::NoDelay)];
    let got = run(&r, &[0, 1, 2, 3, 4]);
    assert_eq!(
        got,
        [Passed, Passed, Passed, rejected(2997, 0), rejected(2996, 0)]
    );
    // A second later one request's worth has drained.
    assert_eq!(run(&r, &[1002]), [Passed]);
    assert_eq!(run(&r, &[1003]), [rejected(2997, 0)]);
}

#[test]
fn without_nodelay_the_burst_waits_its_turn() {
    let z = ReqZone::new(MB);
    let r = [rule(&z, 1000, 2, ReqDelay::All)];
    // Same millisecond: nothing drains, `last` stays.
    let got = run(&r, &[0, 0, 0, 0]);
    assert_eq!(
        got,
        [
            Passed,
            delayed(1000, 1000, 0),
            delayed(2000, 2000, 0),
            rejected(3000, 0)
        ]
    );
}

#[test]
fn delay_n_lets_n_over_the_rate_pass_at_once() {
    let z = ReqZone::new(MB);
    let r = [rule(&z, 1000, 2, ReqDelay::After(1))];
    let got = run(&r, &[0, 0, 0, 0]);
    assert_eq!(
        got,
        [Passed, Passed, delayed(1000, 2000, 0), rejected(3000, 0)]
    );
}

#[test]
fn one_request_a_minute_is_sixteen_milli_requests_a_second() {
    // rate=1r/m is 1000 / 60 = 16 (rounded down): after exactly a minute
    // 960 have drained, so burst=0 still rejects; after 62.5 s it passes.
    let z = ReqZone::new(MB);
    let r = [rule(&z, 1000 / 60, 0, ReqDelay::All)];
    assert_eq!(run(&r, &[0]), [Passed]);
    assert_eq!(run(&r, &[60_000]), [rejected(40, 0)]);
    assert_eq!(run(&r, &[62_500]), [Passed]);
}

#[test]
fn a_fraction_drained_within_a_millisecond_step_is_lost() {
    // 6r/m = 100 milli a second: 9 ms drain 0.9, rounded to 0, and `last`
    // moves on, so requests 9 ms apart never drain anything.
    let z = ReqZone::new(MB);
    let r = [rule(&z, 100, 3, ReqDelay::NoDelay)];
    let got = run(&r, &[0, 9, 18, 27, 36]);
    assert_eq!(got, [Passed, Passed, Passed, Passed, rejected(4000, 0)]);
    // While one request 36 ms later would have found 3.6 drained.
    let z = ReqZone::new(MB);
    let r = [rule(&z, 100, 3, ReqDelay::NoDelay)];
    assert_eq!(run(&r, &[0, 0, 0, 0]), [Passed; 4]);
    assert_eq!(run(&r, &[40]), [rejected(3996, 0)]);
}

#[test]
fn a_rejection_by_a_later_limit_charges_none_of_the_earlier() {
    let a = ReqZone::new(MB);
    let b = ReqZone::new(MB);
    let both = [
        rule(&a, 1000, 5, ReqDelay::NoDelay),
        rule(&b, 1000, 0, ReqDelay::NoDelay),
    ];
    assert_eq!(
        run(&both, &[0, 0, 0, 0]),
        [
            Passed,
            rejected(1000, 1),
            rejected(1000, 1),
            rejected(1000, 1)
        ]
    );
    // `a` was charged once: one more fits a burst of 1, the next does not.
    let only_a = [rule(&a, 1000, 1, ReqDelay::NoDelay)];
    assert_eq!(run(&only_a, &[0, 0]), [Passed, rejected(2000, 0)]);
}

#[test]
fn with_several_limits_the_longest_delay_wins() {
    let a = ReqZone::new(MB);
    let b = ReqZone::new(MB);
    let r = [
        rule(&a, 500, 5, ReqDelay::All),
        rule(&b, 1000, 5, ReqDelay::All),
    ];
    assert_eq!(run(&r, &[0, 0]), [Passed, delayed(2000, 1000, 0)]);
    let c = ReqZone::new(MB);
    let d = ReqZone::new(MB);
    let r = [
        rule(&c, 1000, 5, ReqDelay::All),
        rule(&d, 500, 5, ReqDelay::All),
    ];
    assert_eq!(run(&r, &[0, 0]), [Passed, delayed(2000, 1000, 1)]);
}

#[test]
fn an_empty_key_is_not_accounted() {
    let z = ReqZone::new(MB);
    let r = [rule(&z, 1000, 0, ReqDelay::All)];
    for t in 0..3 {
        assert_eq!(check(&r, &[b""], t), ReqVerdict::Declined);
    }
    assert!(z.is_empty());
    // A later limit without a key: the earlier one decides alone.
    let other = ReqZone::new(MB);
    let r = [
        rule(&z, 1000, 0, ReqDelay::All),
        rule(&other, 1000, 0, ReqDelay::All),
    ];
    assert_eq!(check(&r, &[b"k", b""], 0), Passed);
    assert_eq!(check(&r, &[b"k", b""], 0), rejected(1000, 0));
    assert!(other.is_empty());
}

#[test]
fn a_full_zone_forgets_its_least_recently_used_key() {
    // 32 KiB: 7 pages of 4096, 32 slots of 128 bytes each.
    let z = ReqZone::new(32 * 1024);
    assert_eq!(crate::limit::keys_in(32 * 1024, 4), 224);
    let r = [rule(&z, 1000, 0, ReqDelay::All)];
    for i in 0u32..224 {
        assert_eq!(check(&r, &[&i.to_be_bytes()], 0), Passed);
    }
    assert_eq!(z.len(), 224);
    // Key 1 is used again: key 0 is now the least recently used.
    assert_eq!(check(&r, &[&1u32.to_be_bytes()], 0), rejected(1000, 0));
    assert_eq!(check(&r, &[&999u32.to_be_bytes()], 0), Passed);
    assert_eq!(z.len(), 224);
    // Key 0 was forgotten (a new key passes), key 1 was not.
    assert_eq!(check(&r, &[&1u32.to_be_bytes()], 0), rejected(1000, 0));
    assert_eq!(check(&r, &[&0u32.to_be_bytes()], 0), Passed);
}

#[test]
fn idle_drained_keys_expire_when_a_new_key_comes() {
    let z = ReqZone::new(MB);
    let r = [rule(&z, 1000, 0, ReqDelay::All)];
    for k in [b"a", b"b", b"c"] {
        assert_eq!(check(&r, &[k], 0), Passed);
    }
    // A minute on, a new key expires up to two drained keys.
    assert_eq!(check(&r, &[b"d"], 60_000), Passed);
    assert_eq!(z.len(), 2);
}
