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
        Timestamp(duration_ms(self.start.elapsed()))
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
