//! Which worker thread runs this code: state kept per worker (the
//! upstream connection pools' shards, the request metrics' counters) is
//! picked by it (a leaf, set once by each worker as it starts).
//!
//! Per-worker state is made with [`count`] shards, one per core: the
//! default of one worker per core gives each worker a shard of its own,
//! written by no other thread, so two workers never move one cache line
//! between their cores per request. Workers past that count share shards
//! (`--threads` above the core count).

use std::cell::Cell;
use std::sync::OnceLock;

/// Shards at most, however many cores.
const MAX: usize = 64;

thread_local! {
    static WORKER: Cell<usize> = const { Cell::new(0) };
}

/// The index of the worker running this code (0 outside workers).
pub(crate) fn current() -> usize {
    WORKER.with(Cell::get)
}

/// This thread is worker `i` from now on.
pub(crate) fn enter(i: usize) {
    WORKER.with(|w| w.set(i));
}

/// How many shards per-worker state is made with: the cores this process
/// may run on (at most [`MAX`]), read once.
pub(crate) fn count() -> usize {
    static COUNT: OnceLock<usize> = OnceLock::new();
    *COUNT.get_or_init(|| {
        std::thread::available_parallelism()
            .map_or(1, std::num::NonZeroUsize::get)
            .min(MAX)
    })
}

/// The shard of `shards` (one of [`count`], or any number) this worker
/// uses; None only when there are none.
pub(crate) fn of<T>(shards: &[T]) -> Option<&T> {
    shards.get(current() % shards.len().max(1))
}
