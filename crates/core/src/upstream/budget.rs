//! `retry_budget ratio=R% min=N/s`: how many retries and hedges an
//! upstream's requests may make (Finagle's `RetryBudget`, Envoy's
//! `retry_budget`), in core's time so it is tested on a [`ManualClock`].
//!
//! Two sources pay for a retry, in this order:
//!
//! - the **ratio**: every request deposits R% of a token
//!   ([`RetryBudgetState::deposit`], at [`Upstream::begin`]); a retry takes
//!   one whole token. Deposits and withdrawals count for
//!   [`RetryBudget::WINDOW`] (10 one-second slots), so a burst of traffic an
//!   hour ago buys no retries now;
//! - the **reserve**: N per second, a `governor` rate limiter (GCRA, burst
//!   N) on [`GovernorClock`], core's clock seen through governor's `Clock`
//!   trait. It lets a quiet upstream retry at all (20% of one request is
//!   no retry).
//!
//! When neither pays, the retry is denied ([`super::RetryDenied::Budget`]).
//!
//! One mutex per upstream with a budget (none without): taken once per
//! request and once per retry, for a few additions.
//!
//! [`ManualClock`]: crate::clock::ManualClock
//! [`Upstream::begin`]: super::Upstream::begin

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use governor::middleware::StateInformationMiddleware;
use governor::nanos::Nanos;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};

use crate::clock::{Clock, Timestamp};
use crate::config::RetryBudget;

/// Core's [`Clock`] as governor's: milliseconds on core's timeline, as
/// nanoseconds.
#[derive(Clone)]
pub struct GovernorClock(pub Arc<dyn Clock>);

/// One upstream's retry budget: the ratio's window and the reserve.
pub(crate) struct RetryBudgetState {
    config: RetryBudget,
    window: Mutex<Window>,
    reserve: Option<Reserve>,
    denied: AtomicU64,
}

type Limiter = RateLimiter<NotKeyed, InMemoryState, GovernorClock, StateInformationMiddleware>;

/// The `min=N/s` reserve, and what governor last said was left in it.
struct Reserve {
    limiter: Limiter,
    per_sec: NonZeroU32,
    /// Tokens left after the last withdrawal, and when (for display).
    last: Mutex<(u32, Timestamp)>,
}

/// Deposits and withdrawals of the last [`SLOTS`] seconds.
#[derive(Default)]
struct Window {
    /// The second (`now / 1000`) of the newest slot.
    second: u64,
    deposits: [u64; SLOTS],
    withdrawals: [u64; SLOTS],
}

const SLOTS: usize = 10;

/// What paid for a retry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Paid {
    /// A token of the ratio.
    Ratio,
    /// The `min=` reserve.
    Reserve,
}

/// The budget at one moment, for `status` and `explain`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BudgetNow {
    /// `ratio=R%`.
    pub ratio_percent: u8,
    /// `min=N/s`.
    pub min_per_sec: u32,
    /// Tokens available now: the ratio's whole and fractional tokens plus
    /// the reserve's.
    pub tokens: f64,
    /// Requests counted in the window.
    pub requests: u64,
    /// Retries and hedges the ratio paid for in the window.
    pub retries: u64,
    /// Retries and hedges denied since the upstream was built (or its
    /// budget last changed).
    pub denied: u64,
}

// === impl GovernorClock ===

impl governor::clock::Clock for GovernorClock {
    type Instant = Nanos;

    fn now(&self) -> Nanos {
        Nanos::from(Duration::from_millis(self.0.now().0))
    }
}

// === impl RetryBudgetState ===

impl RetryBudgetState {
    /// A full reserve and an empty ratio.
    pub(crate) fn new(config: RetryBudget, clock: Arc<dyn Clock>) -> Self {
        let now = clock.now();
        let reserve = NonZeroU32::new(config.min_per_sec).map(|per_sec| Reserve {
            limiter: RateLimiter::direct_with_clock(
                Quota::per_second(per_sec),
                GovernorClock(clock.clone()),
            )
            .with_middleware::<StateInformationMiddleware>(),
            per_sec,
            last: Mutex::new((per_sec.get(), now)),
        });
        Self {
            config,
            window: Mutex::new(Window {
                second: now.0 / 1000,
                ..Window::default()
            }),
            reserve,
            denied: AtomicU64::new(0),
        }
    }

    /// The configuration it enforces.
    pub(crate) fn config(&self) -> RetryBudget {
        self.config
    }

    /// A request began: R% of a token.
    pub(crate) fn deposit(&self, now: Timestamp) {
        let mut w = self.window.lock().unwrap_or_else(PoisonError::into_inner);
        let i = w.advance(now);
        w.deposits[i] += 1;
    }

    /// Take a token for one retry or hedge, if any source has one.
    pub(crate) fn withdraw(&self, now: Timestamp) -> Option<Paid> {
        {
            let mut w = self.window.lock().unwrap_or_else(PoisonError::into_inner);
            let i = w.advance(now);
            if w.balance_milli(self.config.ratio_percent) >= 1000 {
                w.withdrawals[i] += 1;
                return Some(Paid::Ratio);
            }
        }
        if let Some(r) = &self.reserve {
            if let Ok(snapshot) = r.limiter.check() {
                let mut last = r.last.lock().unwrap_or_else(PoisonError::into_inner);
                *last = (snapshot.remaining_burst_capacity(), now);
                return Some(Paid::Reserve);
            }
        }
        self.denied.fetch_add(1, Ordering::Relaxed);
        None
    }

    /// Give back a token that paid for nothing (a hedge that found no
    /// peer). The reserve cannot take one back: governor has no refund.
    pub(crate) fn refund(&self, paid: Paid, now: Timestamp) {
        if paid == Paid::Ratio {
            let mut w = self.window.lock().unwrap_or_else(PoisonError::into_inner);
            let i = w.advance(now);
            w.withdrawals[i] = w.withdrawals[i].saturating_sub(1);
        }
    }

    /// The budget now.
    pub(crate) fn now(&self, now: Timestamp) -> BudgetNow {
        let (requests, retries, ratio_milli) = {
            let mut w = self.window.lock().unwrap_or_else(PoisonError::into_inner);
            w.advance(now);
            (
                w.deposits.iter().sum::<u64>(),
                w.withdrawals.iter().sum::<u64>(),
                w.balance_milli(self.config.ratio_percent),
            )
        };
        let reserve = self.reserve.as_ref().map_or(0.0, |r| r.tokens(now));
        BudgetNow {
            ratio_percent: self.config.ratio_percent,
            min_per_sec: self.config.min_per_sec,
            tokens: ratio_milli.max(0) as f64 / 1000.0 + reserve,
            requests,
            retries,
            denied: self.denied.load(Ordering::Relaxed),
        }
    }
}

// === impl Reserve ===

impl Reserve {
    /// Tokens in the reserve now: what governor said was left at the last
    /// withdrawal, refilled at N per second since, at most N.
    fn tokens(&self, now: Timestamp) -> f64 {
        let (left, at) = *self.last.lock().unwrap_or_else(PoisonError::into_inner);
        let per_sec = f64::from(self.per_sec.get());
        let refilled = now.millis_since(at) as f64 / 1000.0 * per_sec;
        (f64::from(left) + refilled).min(per_sec).floor()
    }
}

// === impl Window ===

impl Window {
    /// Move the window to `now`, emptying the slots that fell out of it;
    /// the slot of `now`.
    fn advance(&mut self, now: Timestamp) -> usize {
        let second = now.0 / 1000;
        if second > self.second {
            let gone = (second - self.second).min(SLOTS as u64);
            for k in 1..=gone {
                let i = ((self.second + k) % SLOTS as u64) as usize;
                self.deposits[i] = 0;
                self.withdrawals[i] = 0;
            }
            self.second = second;
        }
        // A clock that went back (it does not: core's is monotonic) stays
        // in the newest slot.
        (self.second % SLOTS as u64) as usize
    }

    /// The ratio's tokens, in thousandths: R% of the deposits less the
    /// withdrawals.
    fn balance_milli(&self, ratio_percent: u8) -> i64 {
        let deposits: u64 = self.deposits.iter().sum();
        let withdrawals: u64 = self.withdrawals.iter().sum();
        let earned = deposits.saturating_mul(u64::from(ratio_percent) * 10);
        i64::try_from(earned).unwrap_or(i64::MAX)
            - i64::try_from(withdrawals.saturating_mul(1000)).unwrap_or(i64::MAX)
    }
}

impl std::fmt::Debug for RetryBudgetState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RetryBudgetState")
            .field("config", &self.config)
            .field("denied", &self.denied.load(Ordering::Relaxed))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    fn budget(ratio: u8, min: u32) -> (RetryBudgetState, Arc<ManualClock>) {
        let clock = Arc::new(ManualClock::at(5_000));
        let b = RetryBudgetState::new(
            RetryBudget {
                ratio_percent: ratio,
                min_per_sec: min,
            },
            clock.clone(),
        );
        (b, clock)
    }

    #[test]
    fn the_reserve_pays_n_per_second_and_refills() {
        let (b, clock) = budget(0, 3);
        let now = clock.now();
        assert_eq!(b.now(now).tokens, 3.0);
        for _ in 0..3 {
            assert_eq!(b.withdraw(now), Some(Paid::Reserve));
        }
        assert_eq!(b.withdraw(now), None, "burst of 3 used up");
        assert_eq!(b.now(now).denied, 1);
        assert_eq!(b.now(now).tokens, 0.0);
        // One token comes back every 1/3 s.
        clock.advance(Duration::from_millis(340));
        assert_eq!(b.withdraw(clock.now()), Some(Paid::Reserve));
        assert_eq!(b.withdraw(clock.now()), None);
        clock.advance(Duration::from_secs(10));
        assert_eq!(b.now(clock.now()).tokens, 3.0, "refilled, never above N");
    }

    #[test]
    fn the_ratio_pays_r_percent_of_the_requests() {
        let (b, clock) = budget(20, 0);
        let now = clock.now();
        for _ in 0..4 {
            b.deposit(now);
        }
        assert_eq!(b.withdraw(now), None, "4 × 20% is less than one token");
        b.deposit(now);
        assert_eq!(b.now(now).tokens, 1.0);
        assert_eq!(b.withdraw(now), Some(Paid::Ratio));
        assert_eq!(b.withdraw(now), None);
        for _ in 0..10 {
            b.deposit(now);
        }
        assert_eq!(b.withdraw(now), Some(Paid::Ratio));
        assert_eq!(b.withdraw(now), Some(Paid::Ratio));
        assert_eq!(b.withdraw(now), None);
        let seen = b.now(now);
        assert_eq!((seen.requests, seen.retries, seen.denied), (15, 3, 3));
    }

    #[test]
    fn deposits_expire_after_the_window() {
        let (b, clock) = budget(50, 0);
        for _ in 0..10 {
            b.deposit(clock.now());
        }
        assert_eq!(b.now(clock.now()).tokens, 5.0);
        clock.advance(Duration::from_millis(9_000));
        assert_eq!(b.now(clock.now()).tokens, 5.0, "still inside 10 s");
        clock.advance(Duration::from_millis(1_000));
        assert_eq!(b.now(clock.now()).tokens, 0.0, "10 s later: gone");
        assert_eq!(b.withdraw(clock.now()), None);
    }

    #[test]
    fn withdrawals_expire_with_their_deposits() {
        let (b, clock) = budget(100, 0);
        b.deposit(clock.now());
        assert_eq!(b.withdraw(clock.now()), Some(Paid::Ratio));
        clock.advance(Duration::from_secs(10));
        b.deposit(clock.now());
        assert_eq!(
            b.withdraw(clock.now()),
            Some(Paid::Ratio),
            "the old withdrawal left the window with the old deposit"
        );
    }

    #[test]
    fn the_ratio_pays_first_then_the_reserve() {
        let (b, clock) = budget(50, 1);
        let now = clock.now();
        b.deposit(now);
        b.deposit(now);
        assert_eq!(b.withdraw(now), Some(Paid::Ratio));
        assert_eq!(b.withdraw(now), Some(Paid::Reserve));
        assert_eq!(b.withdraw(now), None);
        // A refund gives a ratio token back, not a reserve one.
        b.refund(Paid::Ratio, now);
        b.refund(Paid::Reserve, now);
        assert_eq!(b.withdraw(now), Some(Paid::Ratio));
        assert_eq!(b.withdraw(now), None);
    }

    #[test]
    fn a_zero_budget_denies_every_retry() {
        let (b, clock) = budget(0, 0);
        for _ in 0..100 {
            b.deposit(clock.now());
        }
        assert_eq!(b.withdraw(clock.now()), None);
        assert_eq!(b.now(clock.now()).denied, 1);
    }
}
