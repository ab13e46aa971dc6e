//! Rendezvous (highest random weight) hashing: the owners of a target are
//! the `r` live members with the highest score for it. Every member
//! computes the same owners from the same member list, with no
//! coordination; when a member leaves, only its targets move (each to the
//! member that scored next), and when one joins it takes about `1/n` of the
//! targets from the others.
//!
//! The score is FNV-1a 64 over `member 0xff target`, finished with the
//! splitmix64 mixer: stable across builds and versions (not `std`'s hasher,
//! whose output may change between Rust releases).

/// The owners of `target` among `members` (at most `r`, best score
/// first; ties, which need a 64-bit collision, go to the smaller name).
pub fn owners<'a>(target: &str, members: &'a [String], r: usize) -> Vec<&'a str> {
    let mut scored: Vec<(u64, &str)> = members
        .iter()
        .map(|m| (score(m, target), m.as_str()))
        .collect();
    scored.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(b.1)));
    scored.dedup_by(|a, b| a.1 == b.1);
    scored.into_iter().take(r).map(|(_, m)| m).collect()
}

/// Whether `me` is one of the owners of `target`.
pub fn owns(me: &str, target: &str, members: &[String], r: usize) -> bool {
    owners(target, members, r).contains(&me)
}

fn score(member: &str, target: &str) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h = OFFSET;
    for b in member
        .as_bytes()
        .iter()
        .chain(&[0xff])
        .chain(target.as_bytes())
    {
        h ^= u64::from(*b);
        h = h.wrapping_mul(PRIME);
    }
    // splitmix64's finalizer: FNV alone leaves the high bits of similar
    // names correlated.
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (1..=n).map(|i| format!("m{i}")).collect()
    }

    fn targets(n: usize) -> Vec<String> {
        (0..n)
            .map(|i| format!("http-127.0.0.1:{}-0000abcd", 8000 + i))
            .collect()
    }

    #[test]
    fn the_owners_do_not_depend_on_the_order_of_the_member_list() {
        let a = names(5);
        let mut b = a.clone();
        b.reverse();
        for t in targets(50) {
            assert_eq!(owners(&t, &a, 2), owners(&t, &b, 2));
        }
    }

    #[test]
    fn each_target_has_exactly_r_distinct_owners_capped_by_the_members() {
        let m = names(3);
        for t in targets(30) {
            for r in 1..=4 {
                let o = owners(&t, &m, r);
                assert_eq!(o.len(), r.min(3), "{t} r={r}: {o:?}");
                let mut d = o.clone();
                d.sort();
                d.dedup();
                assert_eq!(d.len(), o.len());
            }
        }
        assert!(owners("x", &[], 1).is_empty());
    }

    #[test]
    fn targets_spread_over_the_members() {
        let m = names(3);
        let mut count = [0usize; 3];
        for t in targets(300) {
            let o = owners(&t, &m, 1)[0];
            count[m.iter().position(|x| x == o).unwrap_or(0)] += 1;
        }
        // 100 each on average; a bad hash puts nearly all on one.
        assert!(count.iter().all(|c| (60..=140).contains(c)), "{count:?}");
    }

    #[test]
    fn a_member_leaving_moves_only_its_own_targets() {
        let all = names(4);
        let rest: Vec<String> = all.iter().filter(|m| *m != "m2").cloned().collect();
        let mut moved = 0;
        for t in targets(200) {
            let before = owners(&t, &all, 1)[0];
            let after = owners(&t, &rest, 1)[0];
            if before != "m2" {
                assert_eq!(before, after, "{t} moved though its owner stayed");
            } else {
                moved += 1;
            }
        }
        assert!(moved > 0);
    }

    #[test]
    fn scores_are_stable_across_builds() {
        // Pinned: a change here re-assigns every target of a running fleet
        // during a rolling upgrade.
        let s = score("m1", "http-127.0.0.1:8080-00000000");
        assert_eq!(s, 0xc5a7_430f_ff38_e4e4, "{s:#x}");
    }
}
