//! Coarse per-thread timers for the upstream side (`proxy_connect_timeout`,
//! `proxy_send_timeout`, `proxy_read_timeout`, the hedge delay), as nginx
//! keeps one tree of timers per worker instead of one kernel timer each.
//!
//! Every [`Sleep`] of a thread is an entry in that thread's [`Wheel`] (a
//! slab of entries and a heap of their deadlines); ONE tokio sleep per
//! wheel, in a sweeper task, wakes the entries whose deadline passed. The
//! sweeper's sleep is moved only:
//! - later, when it fired (to the earliest deadline left, and no sooner
//!   than [`SPACING`] after the sweep), and
//! - earlier, when a new deadline is more than [`LAZY`] before it.
//!
//! A cancelled entry (dropped) is removed from the slab at once; its heap
//! item is dropped when it reaches the top or when the heap is compacted.
//! So a request arms no tokio timer: the sweeper's sleep, armed for the
//! earliest deadline (60 s away with nginx's defaults), stays armed while
//! requests come and go, and tokio's time driver is not woken (its
//! eventfd written) because an earlier timer was registered.
//!
//! Resolution: an entry never fires before its deadline; it fires at most
//! [`LAZY`] (30 ms) after it on a runtime that is not busy (nginx's timers
//! are in ms, with a 300 ms lazy delay when a timer is moved). In paused
//! time (tests) an isolated deadline fires exactly: the sweeper sleeps on
//! tokio's clock, which auto-advances to it.
//!
//! The wheel is per thread and found through a thread-local; the first
//! entry registered on a thread spawns that thread's sweeper on the
//! current runtime (vigil's workers are current-thread runtimes, one per
//! thread; on a multi-thread runtime each thread has its own wheel, and an
//! entry keeps the wheel it registered in). When the sweeper's runtime is
//! dropped the wheel is marked dead and the next entry makes a new one.
//! Outside any runtime an entry falls back to a tokio sleep.

use std::cell::RefCell;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use futures_util::future::{try_join, Either, FutureExt as _};
use tokio::time::Instant;

/// A deadline earlier than the armed sweep by less than this does not move
/// the sweep (it fires that much late at most).
pub(crate) const LAZY: Duration = Duration::from_millis(30);
/// Two sweeps are at least this far apart.
pub(crate) const SPACING: Duration = Duration::from_millis(10);

/// A deadline passed (as tokio's `Elapsed`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Elapsed;

impl std::fmt::Display for Elapsed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("deadline has elapsed")
    }
}

impl std::error::Error for Elapsed {}

/// Run `fut` until `deadline`. No timer is registered unless `fut` is
/// pending.
///
/// A struct future that holds `fut` once, pinned in place (no unsafe
/// here): `try_join` polls `fut` first and ends at the first side that
/// "fails", and each side fails as soon as it is done. An `async fn` would
/// keep its argument beside the pinned copy (a TLS connect future is
/// kilobytes, and the attempt's future is moved into a box).
pub(crate) fn timeout_at<F: Future>(
    deadline: Instant,
    fut: F,
) -> impl Future<Output = Result<F::Output, Elapsed>> {
    try_join(
        fut.map(|v| Err::<Infallible, _>(Either::Left(v))),
        sleep_until(deadline).map(|()| Err::<Infallible, _>(Either::Right(Elapsed))),
    )
    .map(|r| match r {
        Ok((never, _)) => match never {},
        Err(Either::Left(v)) => Ok(v),
        Err(Either::Right(e)) => Err(e),
    })
}

/// Run `fut` for at most `limit` from now.
pub(crate) fn timeout<F: Future>(
    limit: Duration,
    fut: F,
) -> impl Future<Output = Result<F::Output, Elapsed>> {
    timeout_at(after(limit), fut)
}

/// `limit` from now (far in the future when that overflows).
pub(crate) fn after(limit: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(limit)
        .unwrap_or_else(|| now + Duration::from_secs(86400 * 365 * 30))
}

/// A future ready `limit` from now.
pub(crate) fn sleep(limit: Duration) -> Sleep {
    sleep_until(after(limit))
}

/// A future ready at `deadline` (registered on its first poll).
pub(crate) fn sleep_until(deadline: Instant) -> Sleep {
    Sleep {
        deadline,
        state: State::Idle,
    }
}

/// A deadline on this thread's wheel (`Unpin`; no allocation).
#[derive(Debug)]
pub(crate) struct Sleep {
    deadline: Instant,
    state: State,
}

#[derive(Debug)]
enum State {
    /// Not registered yet.
    Idle,
    /// An entry of a wheel.
    On {
        wheel: Arc<Wheel>,
        key: u32,
        gen: u32,
    },
    /// Outside a runtime with a wheel: tokio's own.
    Fallback(Pin<Box<tokio::time::Sleep>>),
    /// Fired.
    Done,
}

// === impl Sleep ===

impl Sleep {
    /// Move the deadline (also after it fired). Moving it later costs no
    /// heap operation; the entry is re-queued when its old deadline comes.
    pub(crate) fn reset(&mut self, deadline: Instant) {
        self.deadline = deadline;
        match &mut self.state {
            State::Idle => {}
            State::On { wheel, key, gen } => {
                let mut w = wheel.lock();
                if let Some(slot) = w.slot_mut(*key, *gen) {
                    slot.deadline = deadline;
                    if slot.fired || deadline < slot.queued {
                        slot.fired = false;
                        slot.queued = deadline;
                        w.heap.push(Reverse((deadline, *key, *gen)));
                        w.maybe_rearm(deadline);
                    }
                }
            }
            State::Fallback(s) => s.as_mut().reset(deadline),
            State::Done => self.state = State::Idle,
        }
    }

    fn register(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        match local_wheel() {
            Some(wheel) => {
                let (key, gen) = wheel.lock().insert(self.deadline, cx.waker().clone());
                self.state = State::On { wheel, key, gen };
                Poll::Pending
            }
            None => {
                let mut s = Box::pin(tokio::time::sleep_until(self.deadline));
                let r = s.as_mut().poll(cx);
                self.state = State::Fallback(s);
                r
            }
        }
    }
}

impl Future for Sleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let fired = match &mut this.state {
            State::Idle => return this.register(cx),
            State::Done => return Poll::Ready(()),
            State::Fallback(s) => return s.as_mut().poll(cx),
            State::On { wheel, key, gen } => {
                let mut w = wheel.lock();
                match w.slot_mut(*key, *gen) {
                    Some(slot) if !slot.fired => {
                        if !slot.waker.as_ref().is_some_and(|k| k.will_wake(cx.waker())) {
                            slot.waker = Some(cx.waker().clone());
                        }
                        false
                    }
                    _ => {
                        w.remove(*key, *gen);
                        true
                    }
                }
            }
        };
        if fired {
            this.state = State::Done;
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if let State::On { wheel, key, gen } = &self.state {
            wheel.lock().remove(*key, *gen);
        }
    }
}

// === the wheel ===

/// One thread's deadlines and its sweeper's arming.
#[derive(Debug)]
pub(crate) struct Wheel {
    inner: Mutex<Inner>,
    /// The sweeper task is gone (its runtime was dropped).
    dead: AtomicBool,
}

#[derive(Debug, Default)]
struct Inner {
    slots: Vec<Slot>,
    /// Free slots, to reuse.
    free: Vec<u32>,
    /// Used slots.
    used: usize,
    /// (deadline, slot, generation); an item is stale when its slot was
    /// freed, fired or re-queued (`Slot::queued` differs).
    heap: BinaryHeap<Reverse<(Instant, u32, u32)>>,
    /// What the sweeper's sleep is (or is asked to be) armed for.
    armed: Option<Instant>,
    /// The sweeper, woken to re-arm earlier.
    sweeper: Option<Waker>,
}

#[derive(Debug)]
struct Slot {
    gen: u32,
    used: bool,
    fired: bool,
    deadline: Instant,
    /// The deadline of its live heap item.
    queued: Instant,
    waker: Option<Waker>,
}

impl Wheel {
    fn new() -> Self {
        Self {
            inner: Mutex::new(Inner::default()),
            dead: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Inner {
    fn slot_mut(&mut self, key: u32, gen: u32) -> Option<&mut Slot> {
        self.slots
            .get_mut(key as usize)
            .filter(|s| s.used && s.gen == gen)
    }

    fn insert(&mut self, deadline: Instant, waker: Waker) -> (u32, u32) {
        let key = match self.free.pop() {
            Some(k) => k,
            None => {
                self.slots.push(Slot {
                    gen: 0,
                    used: false,
                    fired: false,
                    deadline,
                    queued: deadline,
                    waker: None,
                });
                u32::try_from(self.slots.len() - 1).unwrap_or(u32::MAX)
            }
        };
        let Some(slot) = self.slots.get_mut(key as usize) else {
            return (key, u32::MAX);
        };
        slot.gen = slot.gen.wrapping_add(1);
        slot.used = true;
        slot.fired = false;
        slot.deadline = deadline;
        slot.queued = deadline;
        slot.waker = Some(waker);
        let gen = slot.gen;
        self.used += 1;
        self.compact();
        self.heap.push(Reverse((deadline, key, gen)));
        self.maybe_rearm(deadline);
        (key, gen)
    }

    fn remove(&mut self, key: u32, gen: u32) {
        if let Some(slot) = self.slot_mut(key, gen) {
            slot.used = false;
            slot.waker = None;
            self.used -= 1;
            self.free.push(key);
        }
    }

    /// Ask the sweeper to arm for `deadline` when it is more than [`LAZY`]
    /// before what it is armed for (or nothing is armed).
    fn maybe_rearm(&mut self, deadline: Instant) {
        if self.armed.is_none_or(|a| deadline + LAZY < a) {
            self.armed = Some(deadline);
            if let Some(w) = &self.sweeper {
                w.wake_by_ref();
            }
        }
    }

    /// Drop the stale heap items once they are most of the heap (amortised
    /// O(1) per insert).
    fn compact(&mut self) {
        if self.heap.len() > 64 && self.heap.len() > 4 * self.used {
            let slots = &self.slots;
            self.heap.retain(|Reverse((d, k, g))| {
                slots
                    .get(*k as usize)
                    .is_some_and(|s| s.used && !s.fired && s.gen == *g && s.queued == *d)
            });
        }
    }

    /// Fire every entry due at `now` (their wakers into `woken`) and return
    /// the earliest deadline left.
    fn sweep(&mut self, now: Instant, woken: &mut Vec<Waker>) -> Option<Instant> {
        while let Some(&Reverse((d, key, gen))) = self.heap.peek() {
            let Some(slot) = self
                .slots
                .get_mut(key as usize)
                .filter(|s| s.used && !s.fired && s.gen == gen && s.queued == d)
            else {
                self.heap.pop();
                continue;
            };
            if slot.deadline <= now {
                slot.fired = true;
                woken.extend(slot.waker.take());
                self.heap.pop();
            } else if slot.deadline > d {
                // Moved later: queue it at its deadline.
                slot.queued = slot.deadline;
                let again = slot.deadline;
                self.heap.pop();
                self.heap.push(Reverse((again, key, gen)));
            } else {
                return Some(d);
            }
        }
        None
    }
}

thread_local! {
    static WHEEL: RefCell<Option<Arc<Wheel>>> = const { RefCell::new(None) };
}

/// This thread's wheel (with a sweeper on the current runtime), made on
/// first use; None outside a runtime.
fn local_wheel() -> Option<Arc<Wheel>> {
    WHEEL
        .try_with(|cell| {
            let mut cell = cell.borrow_mut();
            if let Some(w) = cell.as_ref().filter(|w| !w.dead.load(Ordering::Acquire)) {
                return Some(w.clone());
            }
            let handle = tokio::runtime::Handle::try_current().ok()?;
            let wheel = Arc::new(Wheel::new());
            drop(handle.spawn(Sweeper {
                wheel: wheel.clone(),
                sleep: None,
                set_at: None,
                last: None,
                woken: Vec::new(),
            }));
            *cell = Some(wheel.clone());
            Some(wheel)
        })
        .ok()
        .flatten()
}

/// Start this thread's wheel now (a worker does at start, so that its
/// first request does not spawn the sweeper).
pub(crate) fn install() {
    let _ = local_wheel();
}

/// The task that sleeps until the earliest deadline of a wheel.
struct Sweeper {
    wheel: Arc<Wheel>,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    /// What `sleep` is set to (None: not armed).
    set_at: Option<Instant>,
    /// When it last swept.
    last: Option<Instant>,
    woken: Vec<Waker>,
}

impl Future for Sweeper {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        loop {
            {
                let mut w = this.wheel.lock();
                if !w.sweeper.as_ref().is_some_and(|k| k.will_wake(cx.waker())) {
                    w.sweeper = Some(cx.waker().clone());
                }
                if w.armed != this.set_at {
                    match w.armed {
                        Some(mut at) => {
                            if let Some(earliest) = this.last.map(|l| l + SPACING) {
                                at = at.max(earliest);
                            }
                            w.armed = Some(at);
                            match &mut this.sleep {
                                Some(s) => s.as_mut().reset(at),
                                None => this.sleep = Some(Box::pin(tokio::time::sleep_until(at))),
                            }
                            this.set_at = Some(at);
                        }
                        None => this.set_at = None,
                    }
                }
            }
            let Some(sleep) = this.sleep.as_mut().filter(|_| this.set_at.is_some()) else {
                return Poll::Pending;
            };
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            let now = Instant::now();
            {
                let mut w = this.wheel.lock();
                w.armed = w.sweep(now, &mut this.woken);
            }
            this.set_at = None;
            this.last = Some(now);
            for k in this.woken.drain(..) {
                k.wake();
            }
        }
    }
}

impl Drop for Sweeper {
    fn drop(&mut self) {
        // Its runtime is going away (with the tasks of its entries); the
        // thread's next entry makes a new wheel.
        self.wheel.dead.store(true, Ordering::Release);
        self.wheel.lock().sweeper = None;
    }
}

#[cfg(test)]
mod tests;
