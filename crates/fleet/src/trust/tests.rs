//! The filters of what a member believes, each on its own.

use super::*;

const NOW: u64 = 1_700_000_000_000;
const TTL: Duration = Duration::from_secs(5);

/// m1, m2, m3 under leases 11, 12, 13.
fn roster() -> Roster {
    let mut r = Roster::default();
    for (m, l) in [("m2", 12), ("m1", 11), ("m3", 13)] {
        r.put(m, l).expect("a leased member counts");
    }
    r
}

/// A target each member owns (R=1).
fn owned_by(r: &Roster, member: &str) -> String {
    (0..)
        .map(|i| format!("http-127.0.0.1:{}-0000abcd", 8000 + i))
        .find(|t| rendezvous::owns(member, t, r.names(), 1))
        .expect("some target")
}

#[test]
fn a_member_key_without_a_lease_never_counts_and_takes_a_leased_name_out() {
    let mut r = roster();
    assert_eq!(r.names(), ["m1", "m2", "m3"]);
    for ghost in ["ghost-1", "ghost-2", "ghost-3", "ghost-4"] {
        assert_eq!(r.put(ghost, 0), Err(Why::NoLease));
    }
    assert_eq!(r.names(), ["m1", "m2", "m3"], "ghosts take no target");
    // A real member's key put again without its lease is no longer a member.
    assert_eq!(r.put("m2", 0), Err(Why::NoLease));
    assert_eq!(r.names(), ["m1", "m3"]);
    assert_eq!(r.lease_of("m2"), None);
    r.put("m2", 22).expect("leased again");
    assert_eq!(r.lease_of("m2"), Some(22));
    r.delete("m3");
    assert_eq!(r.names(), ["m1", "m2"]);
}

#[test]
fn a_result_counts_only_from_its_owner_under_its_members_lease() {
    let r = roster();
    let t = owned_by(&r, "m2");
    let at = (NOW - 20, NOW);
    assert_eq!(r.check_result("m2", 12, &t, 1, at, TTL), Ok(()));
    assert_eq!(
        r.check_result("intruder", 0, &t, 1, at, TTL),
        Err(Why::NotMember)
    );
    assert_eq!(
        r.check_result("m2", 0, &t, 1, at, TTL),
        Err(Why::OtherLease),
        "lease-less"
    );
    assert_eq!(
        r.check_result("m2", 11, &t, 1, at, TTL),
        Err(Why::OtherLease),
        "under m1's lease"
    );
    assert_eq!(r.check_result("m1", 11, &t, 1, at, TTL), Err(Why::NotOwner));
    // With R=3 every member owns every target.
    assert_eq!(r.check_result("m1", 11, &t, 3, at, TTL), Ok(()));
}

#[test]
fn a_result_from_the_future_or_stale_is_not_believed() {
    let r = roster();
    let t = owned_by(&r, "m1");
    let check = |at: u64| r.check_result("m1", 11, &t, 1, (at, NOW), TTL);
    assert_eq!(check(NOW + 5_000), Ok(()), "within the skew");
    assert_eq!(check(NOW + 5_001), Err(Why::Future(5_001)));
    assert_eq!(check(u64::MAX), Err(Why::Future(u64::MAX - NOW)));
    assert_eq!(check(NOW - 10_000), Ok(()), "TTL plus the skew");
    assert_eq!(check(NOW - 10_001), Err(Why::Stale(10_001)));
    assert_eq!(check(0), Err(Why::Stale(NOW)));
}

#[test]
fn an_ejection_counts_only_from_a_member_under_its_lease_and_not_from_the_future() {
    let r = roster();
    assert_eq!(r.check_ejection("m3", 13, (NOW, NOW)), Ok(()));
    assert_eq!(
        r.check_ejection("m3", 13, (0, NOW)),
        Ok(()),
        "over: no halving"
    );
    assert_eq!(
        r.check_ejection("intruder", 13, (NOW, NOW)),
        Err(Why::NotMember)
    );
    assert_eq!(r.check_ejection("m3", 0, (NOW, NOW)), Err(Why::OtherLease));
    assert_eq!(
        r.check_ejection("m3", 13, (NOW + 365 * 86_400_000, NOW)),
        Err(Why::Future(365 * 86_400_000))
    );
}

#[test]
fn each_ignored_key_is_logged_once_and_every_write_is_counted() {
    let mut i = Ignored::default();
    for _ in 0..100 {
        i.note(b"/vigil/fleet/edge/members/ghost", Why::NoLease);
    }
    assert_eq!(i.count(), 100);
    assert_eq!(i.logged.len(), 1, "one key, one line");
    i.note(b"/vigil/fleet/edge/results/m1/t", Why::Future(9_000));
    i.note(b"/vigil/fleet/edge/results/m1/t", Why::Future(9_500));
    i.note(b"/vigil/fleet/edge/results/m1/t", Why::NotOwner);
    assert_eq!(i.logged.len(), 3, "per key and kind");
    // A writer of many distinct keys fills the set once, then is counted.
    for n in 0..3 * LOGGED_KEYS {
        i.note(
            format!("/vigil/fleet/edge/members/g{n}").as_bytes(),
            Why::NoLease,
        );
    }
    assert_eq!(i.logged.len(), LOGGED_KEYS);
    assert!(i.full);
    assert_eq!(i.count(), 103 + 3 * LOGGED_KEYS as u64);
}
