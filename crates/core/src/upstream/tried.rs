//! The per-request set of peers already tried (nginx's `rrp->tried` bitmap).

/// A bitset of peer indices; inline up to 128 peers, on the heap beyond.
#[derive(Clone, Debug, Default)]
pub struct Tried {
    inline: u128,
    spill: Vec<u64>,
}

impl Tried {
    /// Whether peer `i` was tried.
    pub fn contains(&self, i: usize) -> bool {
        if i < 128 {
            self.inline & (1u128 << i) != 0
        } else {
            let j = i - 128;
            self.spill
                .get(j / 64)
                .is_some_and(|w| w & (1u64 << (j % 64)) != 0)
        }
    }

    /// Mark peer `i` as tried.
    pub fn insert(&mut self, i: usize) {
        if i < 128 {
            self.inline |= 1u128 << i;
        } else {
            let j = i - 128;
            if self.spill.len() <= j / 64 {
                self.spill.resize(j / 64 + 1, 0);
            }
            self.spill[j / 64] |= 1u64 << (j % 64);
        }
    }

    /// Whether no peer was tried.
    pub fn is_empty(&self) -> bool {
        self.inline == 0 && self.spill.iter().all(|w| *w == 0)
    }

    /// Forget every peer (moving to the backup tier).
    pub fn clear(&mut self) {
        self.inline = 0;
        self.spill.iter_mut().for_each(|w| *w = 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn behaves_like_a_set(ops in proptest::collection::vec(0usize..2000, 0..64)) {
            let mut t = Tried::default();
            let mut s = std::collections::BTreeSet::new();
            for i in &ops { t.insert(*i); s.insert(*i); }
            for i in 0..2000 { prop_assert_eq!(t.contains(i), s.contains(&i)); }
            t.clear();
            for i in &ops { prop_assert!(!t.contains(*i)); }
        }
    }
}
