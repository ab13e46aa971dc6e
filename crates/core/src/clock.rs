//! Time as vigil's rules see it: a monotonic millisecond count from an
//! injected [`Clock`], so every window, penalty and streak can be tested in
//! simulated time without sleeping.
//!
//! nginx keeps `peer->checked` in whole seconds (`ngx_time()`); vigil keeps
//! milliseconds. Both give the same answer well inside a window and well
//! after it, which is what the recorded conformance scenarios probe.
//!
//! Latency is measured in microseconds on the same timeline
//! ([`Clock::now_micros`]; `now().0 == now_micros() / 1000`): a local
//! backend answers in ~100 µs, so a millisecond clock would read most
//! time-to-header samples as 0 and "K × the median" would mean nothing.
//! Rules keep their `Timestamp` in ms; only the latency figures
//! (`upstream::latency`) use µs.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

/// A point on a [`Clock`]'s monotonic timeline, in milliseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(pub u64);

/// The source of time for every rule in core.
pub trait Clock: Send + Sync + 'static {
    /// Now, on the monotonic timeline.
    fn now(&self) -> Timestamp;
    /// Now in microseconds on the same timeline (`now().0` is this / 1000).
    /// The default has millisecond resolution.
    fn now_micros(&self) -> u64 {
        self.now().0.saturating_mul(1000)
    }
    /// Wall-clock time (milliseconds since the Unix epoch) of a timestamp,
    /// for display in events and the admin API.
    fn unix_ms(&self, at: Timestamp) -> u64;
}

/// The real clock: monotonic time since the clock was made, and the wall
/// clock read once at that moment. It reads tokio's clock, so in a
/// paused-time test runtime it moves only as tokio's time does (outside a
/// runtime, and in a running one, tokio's clock is the OS's monotonic clock).
#[derive(Debug)]
pub struct SystemClock {
    start: Instant,
    start_unix_ms: u64,
}

/// A clock that only moves when told to: for tests and simulations. It
/// keeps microseconds, so sub-millisecond latencies can be simulated.
#[derive(Debug, Default)]
pub struct ManualClock {
    now_us: AtomicU64,
}

thread_local! {
    /// This thread's cached reading of the clock and how many more
    /// [`coarse_now`] calls it serves; None until [`refresh`] runs here.
    static CACHED: Cell<Option<(Instant, u32)>> = const { Cell::new(None) };
}

/// [`coarse_now`] calls one cached reading serves before the clock is read
/// again (bounds its age when the event loop is busy and does not park).
const REUSE: u32 = 32;

/// Read the clock into this thread's cache (and turn the cache on for the
/// thread). vigil's workers call it after each wait for events
/// (`on_thread_unpark`), as nginx updates its cached time once per
/// event-loop iteration (`ngx_time_update` after `epoll_wait`).
pub fn refresh() {
    CACHED.with(|c| c.set(Some((Instant::now(), REUSE))));
}

/// Now, for millisecond figures on the hot path (`$request_time`,
/// `$upstream_response_time`, pool idle times, [`SystemClock::now`]): on a
/// thread that calls [`refresh`] (a worker), the reading taken after its
/// last wait for events, re-read after [`REUSE`] calls when the loop does
/// not wait (busy); elsewhere (tests, the main runtime) the clock itself.
/// tokio's clock either way, so paused time is seen.
pub fn coarse_now() -> Instant {
    CACHED.with(|c| match c.get() {
        Some((at, left)) if left > 0 => {
            c.set(Some((at, left - 1)));
            at
        }
        Some(_) => {
            let now = Instant::now();
            c.set(Some((now, REUSE)));
            now
        }
        None => Instant::now(),
    })
}

// === impl Timestamp ===

impl Timestamp {
    /// Milliseconds since `earlier`, or 0 if `earlier` is later.
    pub fn millis_since(self, earlier: Timestamp) -> u64 {
        self.0.saturating_sub(earlier.0)
    }

    /// This timestamp moved forward by `d`.
    pub fn after(self, d: Duration) -> Timestamp {
        Timestamp(self.0.saturating_add(duration_ms(d)))
    }
}

/// A duration in whole milliseconds, saturating.
pub fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A duration in whole microseconds, saturating.
pub fn duration_us(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

// === impl SystemClock ===

impl SystemClock {
    /// A clock whose timeline starts now.
    pub fn new() -> Self {
        let start_unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(duration_ms)
            .unwrap_or(0);
        Self {
            start: Instant::now(),
            start_unix_ms,
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp(duration_ms(
            coarse_now().saturating_duration_since(self.start),
        ))
    }

    fn now_micros(&self) -> u64 {
        duration_us(self.start.elapsed())
    }

    fn unix_ms(&self, at: Timestamp) -> u64 {
        self.start_unix_ms.saturating_add(at.0)
    }
}

// === impl ManualClock ===

impl ManualClock {
    /// A manual clock at `ms`.
    pub fn at(ms: u64) -> Self {
        Self {
            now_us: AtomicU64::new(ms.saturating_mul(1000)),
        }
    }

    /// Move the clock forward (to the microsecond).
    pub fn advance(&self, d: Duration) {
        self.now_us.fetch_add(duration_us(d), Ordering::SeqCst);
    }

    /// Set the clock (to the start of millisecond `at`).
    pub fn set(&self, at: Timestamp) {
        self.now_us
            .store(at.0.saturating_mul(1000), Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.now_us.load(Ordering::SeqCst) / 1000)
    }

    fn now_micros(&self) -> u64 {
        self.now_us.load(Ordering::SeqCst)
    }

    fn unix_ms(&self, at: Timestamp) -> u64 {
        at.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_refresh_the_coarse_clock_is_the_clock() {
        std::thread::spawn(|| {
            let before = Instant::now();
            let read = coarse_now();
            let next = coarse_now();
            assert!(before <= read && read <= next);
            assert_eq!(CACHED.with(Cell::get), None, "no cache on this thread");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_refreshed_reading_serves_reuse_calls_then_is_read_again() {
        std::thread::spawn(|| {
            refresh();
            let cached = coarse_now();
            for _ in 1..REUSE {
                assert_eq!(coarse_now(), cached, "the cached reading");
            }
            let before = Instant::now();
            let again = coarse_now();
            assert!(again >= before, "read again after {REUSE} calls");
            assert_eq!(coarse_now(), again, "and cached anew");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_runtime_refreshing_on_unpark_reads_the_clock_after_each_wait() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .on_thread_unpark(refresh)
            .build()
            .unwrap();
        rt.block_on(async {
            let clock = SystemClock::new();
            let due = Instant::now() + Duration::from_millis(20);
            tokio::time::sleep_until(due).await;
            // The sleep parked the thread; the hook read the clock after.
            let (at, _) = CACHED.with(Cell::get).expect("refreshed by the hook");
            assert!(at >= due);
            assert_eq!(coarse_now(), at);
            assert!(clock.now() >= Timestamp(20));
        });
    }
}
