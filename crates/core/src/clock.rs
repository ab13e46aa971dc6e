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
//!
//! The real clock, which reads the runtime's, is `vigil_net::SystemClock`
//! (`crates/net/src/clock.rs`, beside the workers' cached clock): core has
//! no runtime.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

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

/// A time of `us` microseconds for people: three significant digits, in
/// µs, ms or s (`850 µs`, `1.23 ms`, `12.3 ms`, `300 ms`, `1.00 s`), as
/// `explain`, the events and the dashboard print figures.
pub fn human_us(us: u64) -> String {
    if us < 1000 {
        return format!("{us} µs");
    }
    // Rounded (half up) to three significant digits.
    let mut p: u64 = 1;
    while us / p >= 1000 {
        p *= 10;
    }
    let r = us.saturating_add(p / 2) / p * p;
    let (unit, name) = if r < 1_000_000 {
        (1_000, "ms")
    } else {
        (1_000_000, "s")
    };
    let whole = r / unit;
    let decimals = 3usize.saturating_sub(whole.to_string().len());
    if decimals == 0 {
        return format!("{whole} {name}");
    }
    let frac = r % unit / (unit / 10u64.pow(decimals as u32));
    format!("{whole}.{frac:0decimals$} {name}")
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
    fn a_manual_clock_moves_only_when_told_to_the_microsecond() {
        let clock = ManualClock::at(1_000);
        assert_eq!(
            (clock.now(), clock.now_micros()),
            (Timestamp(1_000), 1_000_000)
        );
        clock.advance(Duration::from_micros(1_500_250));
        assert_eq!(clock.now(), Timestamp(2_500));
        assert_eq!(clock.now_micros(), 2_500_250);
        clock.set(Timestamp(7));
        assert_eq!(clock.now_micros(), 7_000);
        assert_eq!(clock.unix_ms(Timestamp(7)), 7);
        assert_eq!(Timestamp(5).millis_since(Timestamp(7)), 0, "saturates");
        assert_eq!(Timestamp(5).after(Duration::MAX), Timestamp(u64::MAX));
    }

    #[test]
    fn times_for_people_have_three_significant_digits() {
        for (us, text) in [
            (0, "0 µs"),
            (850, "850 µs"),
            (999, "999 µs"),
            (1_000, "1.00 ms"),
            (1_234, "1.23 ms"),
            (1_235, "1.24 ms"),
            (9_995, "10.0 ms"),
            (12_345, "12.3 ms"),
            (300_000, "300 ms"),
            (999_600, "1.00 s"),
            (12_345_678, "12.3 s"),
            (61_000_000, "61.0 s"),
            (1_234_000_000, "1230 s"),
            (u64::MAX, "18400000000000 s"),
        ] {
            assert_eq!(human_us(us), text, "{us}");
        }
    }
}
