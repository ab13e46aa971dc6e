//! The real clock and the workers' cached reading of it, on tokio's clock
//! so paused-time tests see them move only as tokio's time is advanced.
//!
//! - [`SystemClock`]: core's [`Clock`] for a running vigil (the proxy, the
//!   checker, the admin API): monotonic milliseconds since it was made,
//!   and microseconds for latency figures.
//! - [`coarse_now`] / [`coarse_tick`]: now, as a worker read it after its
//!   last wait for events ([`refresh`], nginx's `ngx_time_update`), for the
//!   millisecond figures of the hot path.
//! - [`Tick`]: a reading as nanoseconds on one process-wide timeline, so
//!   two subtract as integers.
//!
//! Core keeps the [`Clock`] trait, [`Timestamp`] and `ManualClock`: it has
//! no runtime.

use std::cell::Cell;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;
use vigil_core::clock::{duration_ms, Clock, Timestamp};

/// The real clock: monotonic time since the clock was made, and the wall
/// clock read once at that moment. It reads tokio's clock, so in a
/// paused-time test runtime it moves only as tokio's time does (outside a
/// runtime, and in a running one, tokio's clock is the OS's monotonic clock).
#[derive(Debug)]
pub struct SystemClock {
    start: Tick,
    start_unix_ms: u64,
}

thread_local! {
    /// This thread's cached reading of the clock, as an `Instant` and as a
    /// [`Tick`]; None until [`refresh`] runs here (then the thread keeps a
    /// cache). Three cells, not one of a tuple: the hot path reads a count
    /// and a tick, not the whole reading.
    static AT: Cell<Option<Instant>> = const { Cell::new(None) };
    static TICK: Cell<Tick> = const { Cell::new(Tick(0)) };
    /// How many more [`coarse_now`] / [`coarse_tick`] calls the reading
    /// serves (0 on a thread without the cache).
    static LEFT: Cell<u32> = const { Cell::new(0) };
}

/// [`coarse_now`] calls one cached reading serves before the clock is read
/// again (bounds its age when the event loop is busy and does not park).
const REUSE: u32 = 32;

/// Read the clock into this thread's cache (and turn the cache on for the
/// thread). vigil's workers call it after each wait for events
/// (`on_thread_unpark`), as nginx updates its cached time once per
/// event-loop iteration (`ngx_time_update` after `epoll_wait`).
pub fn refresh() {
    let now = Instant::now();
    AT.set(Some(now));
    TICK.set(Tick::of(now));
    LEFT.set(REUSE);
}

/// Whether this thread's cached reading serves one more call (and count
/// the call); false where it must be read again, or there is no cache.
fn cache_serves() -> bool {
    let left = LEFT.get();
    if left > 0 {
        LEFT.set(left - 1);
        return true;
    }
    // Used up: read again, where the thread keeps a cache.
    if AT.get().is_some() {
        refresh();
        return true;
    }
    false
}

/// Now, for millisecond figures on the hot path (`$request_time`,
/// `$upstream_response_time`, pool idle times, [`SystemClock::now`]): on a
/// thread that calls [`refresh`] (a worker), the reading taken after its
/// last wait for events, re-read after [`REUSE`] calls when the loop does
/// not wait (busy); elsewhere (tests, the main runtime) the clock itself.
/// tokio's clock either way, so paused time is seen.
pub fn coarse_now() -> Instant {
    match cache_serves().then(|| AT.get()).flatten() {
        Some(at) => at,
        None => Instant::now(),
    }
}

/// [`coarse_now`] as a [`Tick`], for a duration to be measured from it.
pub fn coarse_tick() -> Tick {
    if cache_serves() {
        TICK.get()
    } else {
        Tick::now()
    }
}

/// A reading of tokio's clock as nanoseconds on one process-wide
/// monotonic timeline. Two ticks subtract as integers, where two
/// `Instant`s go through std's `Timespec` arithmetic (an out-of-line
/// call of about 30 instructions, which a request made a dozen times
/// when its times were kept as `Instant`s).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Tick(u64);

/// Where ticks count from: an hour before the first tick was taken (less
/// where std cannot go that far back), so that a paused-time
/// test runtime built a little before that moment (its clock starts at
/// the real time it was built) still reads after it.
#[allow(
    clippy::disallowed_types,
    reason = "the origin is the OS's clock, not a paused runtime's: a test that advanced its time must not move it"
)]
fn origin() -> std::time::Instant {
    static ORIGIN: OnceLock<std::time::Instant> = OnceLock::new();
    *ORIGIN.get_or_init(|| {
        let now = std::time::Instant::now();
        [3600, 60, 1]
            .into_iter()
            .find_map(|s| now.checked_sub(Duration::from_secs(s)))
            .unwrap_or(now)
    })
}

// === impl Tick ===

impl Tick {
    /// `at` on the tick timeline (0 for a reading before its origin).
    pub fn of(at: Instant) -> Tick {
        let since = at.into_std().saturating_duration_since(origin());
        Tick(u64::try_from(since.as_nanos()).unwrap_or(u64::MAX))
    }

    /// tokio's clock now (not the cached reading: see [`coarse_tick`]).
    pub fn now() -> Tick {
        Tick::of(Instant::now())
    }

    /// The time from `earlier` to this tick, or zero if `earlier` is later.
    pub fn since(self, earlier: Tick) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }

    /// The tick `d` before this one (the origin at the earliest).
    pub fn minus(self, d: Duration) -> Tick {
        Tick(
            self.0
                .saturating_sub(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
        )
    }

    /// [`Tick::since`] in whole milliseconds.
    pub fn millis_since(self, earlier: Tick) -> u64 {
        self.0.saturating_sub(earlier.0) / 1_000_000
    }

    /// [`Tick::since`] in whole microseconds.
    pub fn micros_since(self, earlier: Tick) -> u64 {
        self.0.saturating_sub(earlier.0) / 1_000
    }
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
            start: Tick::now(),
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
        Timestamp(coarse_tick().millis_since(self.start))
    }

    fn now_micros(&self) -> u64 {
        Tick::now().micros_since(self.start)
    }

    fn unix_ms(&self, at: Timestamp) -> u64 {
        self.start_unix_ms.saturating_add(at.0)
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
            assert_eq!(AT.get(), None, "no cache on this thread");
            assert_eq!(LEFT.get(), 0);
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
            let at = AT.get().expect("refreshed by the hook");
            assert!(at >= due);
            assert_eq!(coarse_now(), at);
            assert!(clock.now() >= Timestamp(20));
        });
    }

    #[test]
    fn ticks_subtract_to_the_durations_between_their_instants() {
        let a = Instant::now();
        let b = a + Duration::from_micros(1_234_567);
        let (ta, tb) = (Tick::of(a), Tick::of(b));
        assert_eq!(tb.since(ta), Duration::from_micros(1_234_567));
        assert_eq!(tb.millis_since(ta), 1_234);
        assert_eq!(tb.micros_since(ta), 1_234_567);
        assert_eq!(ta.since(tb), Duration::ZERO, "saturates, as Instant's does");
        assert_eq!(ta.millis_since(tb), 0);
        assert_eq!(tb.minus(Duration::from_micros(1_234_567)), ta);
        assert_eq!(ta.minus(Duration::MAX), Tick(0));
    }

    #[test]
    fn a_cached_tick_is_the_cached_instant_on_the_tick_timeline() {
        std::thread::spawn(|| {
            refresh();
            let (at, tick) = (coarse_now(), coarse_tick());
            assert_eq!(tick, Tick::of(at));
        })
        .join()
        .unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn in_paused_time_the_system_clock_moves_exactly_as_tokio_is_advanced() {
        let clock = SystemClock::new();
        let (t0, us0) = (clock.now(), clock.now_micros());
        let tick = coarse_tick();
        tokio::time::advance(Duration::from_micros(1_500_250)).await;
        assert_eq!(clock.now().millis_since(t0), 1_500);
        assert_eq!(clock.now_micros() - us0, 1_500_250);
        assert_eq!(coarse_tick().since(tick), Duration::from_micros(1_500_250));
    }
}
