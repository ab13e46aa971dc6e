//! The steady-state fast path of smooth weighted round robin.
//!
//! nginx's pick scans every peer (O(n)). While every peer of a tier is
//! eligible at full weight and a request has tried nobody yet, each pick
//! adds the same weights and the state moves along a cycle whose length
//! divides W = Σ weight. So the cycle is computed once (a [`Plan`]: the
//! winners of W steps from a start state, with checkpoints) and a pick is a
//! table lookup. The moment anything else happens (a failure, an admin or
//! probe change, a retry) the exact `current_weight`s are rebuilt from the
//! nearest checkpoint and nginx's scan takes over. Once the tier is healthy
//! again, a new plan is made from the scan's state as soon as that state
//! proves periodic (smooth WRR has several cycles; after a disturbance it
//! usually settles on another one than the cycle from zero). Same answers
//! as the scan in every case (property-tested against it), O(1) when healthy.

/// Distance between stored checkpoints of the cycle.
const CHECKPOINT_EVERY: usize = 64;

/// Plans costing more than this many steps × peers are not made (the
/// build runs under the tier's lock: 4M steps is a few milliseconds).
pub(crate) const MAX_BUILD_WORK: usize = 4_000_000;

/// One tier's cycle from a start state.
#[derive(Debug)]
pub(crate) struct Plan {
    /// The winner (tier index) of each step.
    schedule: Vec<u32>,
    /// States (current weights) at every `CHECKPOINT_EVERY`-th step.
    checkpoints: Vec<Vec<i64>>,
    /// Weights of the tier (0 for `down` peers, which never take part).
    weights: Vec<i64>,
    total: i64,
}

impl Plan {
    /// Whether a tier of these weights can have plans at all.
    pub(crate) fn worth_it(weights: &[i64]) -> bool {
        let total: i64 = weights.iter().sum();
        let live = weights.iter().filter(|w| **w > 0).count();
        live >= 2 && total > 0 && (total as usize).saturating_mul(weights.len()) <= MAX_BUILD_WORK
    }

    /// The cycle through `start`, or None when `start` is not on a cycle
    /// (the scan is still settling) or the weights are not worth planning.
    pub(crate) fn from_state(weights: &[i64], start: &[i64]) -> Option<Self> {
        if !Self::worth_it(weights) || weights.len() != start.len() {
            return None;
        }
        let total: i64 = weights.iter().sum();
        let mut cur = start.to_vec();
        let mut schedule = Vec::with_capacity(total as usize);
        let mut checkpoints = Vec::new();
        for k in 0..total as usize {
            if k % CHECKPOINT_EVERY == 0 {
                checkpoints.push(cur.clone());
            }
            schedule.push(step(&mut cur, weights, total) as u32);
        }
        (cur == start).then(|| Self {
            schedule,
            checkpoints,
            weights: weights.to_vec(),
            total,
        })
    }

    /// The winner at `pos`, and the next position.
    pub(crate) fn next(&self, pos: usize) -> (usize, usize) {
        let winner = self.schedule[pos] as usize;
        let next = if pos + 1 == self.schedule.len() {
            0
        } else {
            pos + 1
        };
        (winner, next)
    }

    /// The exact current weights at `pos`.
    pub(crate) fn state_at(&self, pos: usize) -> Vec<i64> {
        let cp = pos / CHECKPOINT_EVERY;
        let mut cur = self.checkpoints[cp].clone();
        for _ in cp * CHECKPOINT_EVERY..pos {
            step(&mut cur, &self.weights, self.total);
        }
        cur
    }

    /// Steps in one cycle.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.schedule.len()
    }
}

/// One step of nginx's smooth WRR with every peer eligible at full weight.
fn step(cur: &mut [i64], weights: &[i64], total: i64) -> usize {
    let mut best: Option<usize> = None;
    for i in 0..cur.len() {
        if weights[i] == 0 {
            continue;
        }
        cur[i] += weights[i];
        if best.is_none_or(|b| cur[i] > cur[b]) {
            best = Some(i);
        }
    }
    let b = best.unwrap_or(0);
    cur[b] -= total;
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cycle_from_zero_is_nginx_order() {
        let p = Plan::from_state(&[5, 1, 1], &[0, 0, 0]).expect("plan");
        let order: String = (0..7)
            .scan(0, |pos, _| {
                let (w, next) = p.next(*pos);
                *pos = next;
                Some(['A', 'B', 'C'][w])
            })
            .collect();
        assert_eq!(order, "AABACAA");
        assert_eq!(p.state_at(0), vec![0, 0, 0]);
        assert_eq!(p.len(), 7);
    }

    #[test]
    fn a_state_off_every_cycle_gets_no_plan() {
        // (3,-3) with weights (1,1) settles onto the cycle only after a transient.
        assert!(Plan::from_state(&[1, 1], &[3, -3]).is_none());
        assert!(Plan::from_state(&[1, 1], &[-1, 1]).is_some());
    }

    #[test]
    fn down_peers_take_no_part() {
        let p = Plan::from_state(&[1, 0, 1], &[0, 0, 0]).expect("plan");
        assert_eq!((p.next(0).0, p.next(1).0), (0, 2));
        assert!(!Plan::worth_it(&[1, 0]), "one live peer: nothing to plan");
    }
}
