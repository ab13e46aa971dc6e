//! Which worker thread runs this code: state kept per worker (the
//! upstream connection pools' shards, the request metrics' counters) is
//! picked by it (a leaf, set once by each worker as it starts).
//!
//! Per-worker state is made with [`count`] shards: one per core, or per
//! worker where more workers were planned ([`plan`], before the first
//! generation is built), so each worker has a shard of its own, written
//! by no other thread, and two workers never move one cache line between
//! their cores per request. Workers past [`MAX`] share shards.

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

/// Shards at most, however many cores.
const MAX: usize = 64;

thread_local! {
    static WORKER: Cell<usize> = const { Cell::new(0) };
}

/// The most workers any [`plan`] asked for.
static PLANNED: AtomicUsize = AtomicUsize::new(0);

/// The index of the worker running this code (0 outside workers).
pub(crate) fn current() -> usize {
    WORKER.with(Cell::get)
}

/// This thread is worker `i` from now on.
pub(crate) fn enter(i: usize) {
    WORKER.with(|w| w.set(i));
}

/// `workers` worker threads will run: state made from now on has a shard
/// for each.
pub(crate) fn plan(workers: usize) {
    PLANNED.fetch_max(workers, Ordering::Relaxed);
}

/// How many shards per-worker state is made with: the cores this process
/// may run on, or the workers planned if more, at most [`MAX`].
pub(crate) fn count() -> usize {
    static CORES: OnceLock<usize> = OnceLock::new();
    let cores = *CORES.get_or_init(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    cores.max(PLANNED.load(Ordering::Relaxed)).clamp(1, MAX)
}

/// The shard of `shards` (one of [`count`], or any number) this worker
/// uses; None only when there are none.
pub(crate) fn of<T>(shards: &[T]) -> Option<&T> {
    shards.get(current() % shards.len().max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_planned_past_the_cores_get_shards_of_their_own_up_to_the_cap() {
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
        assert!(count() >= cores.min(MAX));
        plan(cores + 3);
        assert!(count() >= (cores + 3).min(MAX), "{}", count());
        plan(MAX * 2);
        assert_eq!(count(), MAX);
        // Each worker's index picks its own shard while there are enough.
        let shards: Vec<usize> = (0..count()).collect();
        for w in [0, 1, MAX - 1, MAX, MAX + 1] {
            std::thread::scope(|s| {
                s.spawn(|| {
                    enter(w);
                    assert_eq!(of(&shards), Some(&(w % MAX)));
                });
            });
        }
        assert_eq!(of::<usize>(&[]), None, "no shards: none, not a panic");
    }
}
