//! Which worker thread runs this code: state kept per worker (the
//! upstream connection pools' shards) is picked by it (a leaf, set once by
//! each worker as it starts).

use std::cell::Cell;

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
