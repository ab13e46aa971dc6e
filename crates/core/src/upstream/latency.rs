//! Time-to-header as core measures it: from the pick of an attempt
//! ([`PeerGuard`] made) to its response header ([`Selection::on_status`]),
//! in microseconds on core's clock ([`Clock::now_micros`]). An attempt
//! that fails before its header is no sample (its time says how long the
//! failure took to show, not how fast the peer answers); the attempts
//! still waiting are tracked apart for `eject_stuck` ([`Waiting`]).
//!
//! Figures are kept in [`Windowed`] histograms: log-linear buckets (8 per
//! power of two, so a quantile is at most 12.5% above the true value) of
//! atomic counters, in two halves of a window that take turns: the
//! current half fills while the other holds the half before, so a figure
//! covers the last half-window to window. Recording is a few relaxed
//! atomic adds, no lock; a figure is read by scanning the buckets.
//!
//! - per upstream, every primary and backup attempt, over
//!   [`UPSTREAM_WINDOW`]: [`Upstream::header_time_quantile`] (the p99 of
//!   `eject_stuck`, and `hedge after=pNN`);
//! - per peer, under `eject_slow`, over its `window=`: the median and the
//!   request count ([`PeerFigure`]).
//!
//! Core measures only when a rule needs it ([`wanted`]); without one no
//! clock is read and nothing is stored beyond nginx's accounting.
//!
//! [`PeerGuard`]: super::PeerGuard
//! [`Selection::on_status`]: super::Selection::on_status
//! [`Clock::now_micros`]: crate::clock::Clock::now_micros

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use crate::clock::{duration_ms, duration_us, Timestamp};
use crate::config::{EjectSlow, EjectStuck, HedgeAfter, UpstreamConfig};

use super::{PeerGuard, Upstream};

/// The window of the upstream's figures (two halves of 5 s).
pub const UPSTREAM_WINDOW: Duration = Duration::from_secs(10);

/// A quantile needs at least this many samples in the window (and at
/// least 1 / (1 − q), so a p99 needs 100).
pub const MIN_SAMPLES: u64 = 20;

/// Sub-buckets per power of two (2^3 = 8: 12.5% resolution).
const SUB_BITS: u32 = 3;
const SUB: u64 = 1 << SUB_BITS;
/// Values below this have one bucket each.
const EXACT: u64 = 2 * SUB;
/// The largest power of two kept (2^37 µs is 38 hours; longer is capped).
const MAX_EXP: u32 = 36;
const BUCKETS: usize = (EXACT + (MAX_EXP as u64 - SUB_BITS as u64) * SUB) as usize;

/// Whether core measures time-to-header for this upstream: some rule
/// reads the figures.
pub(crate) fn wanted(config: &UpstreamConfig) -> bool {
    let r = &config.rules;
    r.eject_stuck.is_some()
        || r.eject_slow.is_some()
        || r.hedge
            .is_some_and(|h| matches!(h.after, crate::config::HedgeAfter::Percentile(_)))
}

/// A peer's figure over the `eject_slow` window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerFigure {
    /// The median time-to-header (the upper edge of its bucket), if any sample.
    pub median: Option<Duration>,
    /// Headers in the window.
    pub requests: u64,
}

/// The measurement state of one upstream (present only when [`wanted`]).
pub(crate) struct Latency {
    /// Every attempt's time-to-header.
    pub(crate) header: Windowed,
    /// Per peer, by global index.
    pub(crate) peers: Box<[PeerLatency]>,
    /// `eject_stuck`, with its threshold.
    pub(crate) stuck: Option<StuckRule>,
    /// `eject_slow`: when the figures are next compared (ms).
    pub(crate) slow: Option<SlowRule>,
    /// `hedge after=pNN`: the delay, refreshed from the window.
    pub(crate) hedge: Option<HedgeDelay>,
}

/// The `hedge after=pNN` delay, refreshed from the window at most every
/// [`HedgeDelay::REFRESH_MS`], as `eject_stuck`'s threshold is: a request
/// reads one atomic instead of ranking the window's buckets.
pub(crate) struct HedgeDelay {
    /// The quantile (0.99 for p99).
    q: f64,
    /// The delay in µs; [`HedgeDelay::NONE`] while the window has too
    /// few samples.
    us: AtomicU64,
    next_refresh: Every,
}

/// One peer's measurement state.
pub(crate) struct PeerLatency {
    /// `eject_slow`: its time-to-header over the rule's window.
    pub(crate) header: Option<Windowed>,
    /// `eject_stuck`: its attempts still waiting for a header.
    pub(crate) waiting: Option<Waiting>,
}

/// `eject_stuck` and its threshold, refreshed from the p99 at most every
/// [`StuckRule::REFRESH_MS`] (so a pick reads one atomic).
pub(crate) struct StuckRule {
    pub(crate) rule: EjectStuck,
    threshold_us: AtomicU64,
    next_refresh: Every,
}

/// When a periodic refresh is next due (ms): of all the callers that find
/// it due, one claims it (the others go on with the value in force).
#[derive(Default)]
pub(crate) struct Every(AtomicU64);

/// `eject_slow` and the time of its next comparison.
pub(crate) struct SlowRule {
    pub(crate) rule: EjectSlow,
    next: Every,
}

/// The attempts of one peer still waiting for a header: their start times
/// (µs), and the oldest in an atomic the picks read without the lock.
#[derive(Default)]
pub(crate) struct Waiting {
    oldest_us: AtomicU64,
    /// The start of the attempt last announced stuck (an event).
    announced: AtomicU64,
    starts: Mutex<Vec<u64>>,
}

/// A histogram of µs values over a window kept as two halves.
pub(crate) struct Windowed {
    half_ms: u64,
    halves: [Half; 2],
}

struct Half {
    /// Which half-window (time / half) the counts belong to.
    epoch: AtomicU64,
    count: AtomicU64,
    buckets: Box<[AtomicU32]>,
}

// === impl Upstream (latency) ===

impl Upstream {
    /// The `q` quantile (0..=1; 0.99 for p99) of the upstream's recent
    /// time-to-header, over the last 5 to 10 s ([`UPSTREAM_WINDOW`]), at
    /// `now`: the upper edge of the bucket holding it (at most 12.5% above
    /// the true value, to the microsecond). None when core does not
    /// measure this upstream (no rule needs it) or has too few samples in
    /// the window ([`MIN_SAMPLES`], and at least 1 / (1 − q)).
    pub fn header_time_quantile(&self, q: f64, now: Timestamp) -> Option<Duration> {
        self.latency.as_ref()?.header.quantile(q, now)
    }

    /// A peer's `eject_slow` figure at `now` (None without the rule).
    pub fn peer_header_figure(&self, index: usize, now: Timestamp) -> Option<PeerFigure> {
        let w = self.latency.as_ref()?.peers.get(index)?.header.as_ref()?;
        Some(w.figure(now))
    }

    /// Whether core measures time-to-header for this upstream.
    pub fn measures_latency(&self) -> bool {
        self.latency.is_some()
    }
}

// === impl PeerGuard (latency) ===

impl PeerGuard {
    /// The response header came at `now`: a time-to-header sample, and the
    /// attempt no longer waits.
    pub(crate) fn header_came(&mut self, now: Timestamp) {
        let (Some(l), true) = (&self.upstream.latency, self.started_us != 0) else {
            return;
        };
        let start = std::mem::take(&mut self.started_us);
        let index = self.index as usize;
        let us = self.upstream.clock.now_micros().saturating_sub(start);
        if l.ended(index, start) {
            self.upstream.unstuck(index, us, "its header came", now);
        }
        l.header(index, us, now);
        if l.slow_due(now) {
            self.upstream.compare_slow(index, now);
        }
    }

    /// The attempt ended before its header: `failed`, or cancelled (the
    /// guard dropped).
    #[inline]
    pub(crate) fn stop_waiting(&mut self, failed: bool) {
        if self.started_us == 0 {
            return;
        }
        let start = std::mem::take(&mut self.started_us);
        if let Some(l) = &self.upstream.latency {
            if l.ended(self.index as usize, start) {
                let us = self.upstream.clock.now_micros().saturating_sub(start);
                let how = if failed {
                    "it failed"
                } else {
                    "it was cancelled"
                };
                self.upstream
                    .unstuck(self.index as usize, us, how, Timestamp(0));
            }
        }
    }
}

impl Upstream {
    /// `eject_stuck`: the attempt announced stuck ended after `us`.
    #[cold]
    fn unstuck(&self, index: usize, us: u64, how: &'static str, now: Timestamp) {
        let kind = crate::event::EventKind::StuckEnded {
            waited_ms: us / 1000,
            how,
        };
        self.publish(vec![(index as u32, kind)], now);
    }
}

// === impl Latency ===

impl Latency {
    /// The state for `config`'s `peers` peers, or None when no rule needs it.
    pub(crate) fn new(config: &UpstreamConfig, peers: usize) -> Option<Box<Self>> {
        if !wanted(config) {
            return None;
        }
        let r = &config.rules;
        Some(Box::new(Self {
            header: Windowed::new(UPSTREAM_WINDOW),
            peers: (0..peers)
                .map(|_| PeerLatency {
                    header: r.eject_slow.map(|s| Windowed::new(s.window)),
                    waiting: r.eject_stuck.map(|_| Waiting::default()),
                })
                .collect(),
            stuck: r.eject_stuck.map(|rule| StuckRule {
                rule,
                threshold_us: AtomicU64::new(duration_us(rule.min)),
                next_refresh: Every::default(),
            }),
            slow: r.eject_slow.map(|rule| SlowRule {
                rule,
                next: Every::default(),
            }),
            hedge: r.hedge.and_then(|h| match h.after {
                HedgeAfter::Percentile(p) => Some(HedgeDelay {
                    q: f64::from(p) / 100.0,
                    us: AtomicU64::new(HedgeDelay::NONE),
                    next_refresh: Every::default(),
                }),
                HedgeAfter::Fixed(_) => None,
            }),
        }))
    }

    /// An attempt on peer `index` started at `start_us`.
    #[inline]
    pub(crate) fn started(&self, index: usize, start_us: u64) {
        if let Some(w) = self.peers.get(index).and_then(|p| p.waiting.as_ref()) {
            w.add(start_us);
        }
    }

    /// The attempt of peer `index` started at `start_us` stopped waiting
    /// (header, failure or cancel); true when it had been announced stuck.
    #[inline]
    pub(crate) fn ended(&self, index: usize, start_us: u64) -> bool {
        self.peers
            .get(index)
            .and_then(|p| p.waiting.as_ref())
            .is_some_and(|w| w.remove(start_us))
    }

    /// Mark peer `index`'s attempt started at `oldest_us` as announced
    /// stuck; true the first time.
    pub(crate) fn announce(&self, index: usize, oldest_us: u64) -> bool {
        self.peers
            .get(index)
            .and_then(|p| p.waiting.as_ref())
            .is_some_and(|w| w.announced.swap(oldest_us, Ordering::Relaxed) != oldest_us)
    }

    /// A header of peer `index` after `us` microseconds, at `now`.
    pub(crate) fn header(&self, index: usize, us: u64, now: Timestamp) {
        self.header.record(us, now);
        if let Some(w) = self.peers.get(index).and_then(|p| p.header.as_ref()) {
            w.record(us, now);
        }
        if let Some(s) = &self.stuck {
            s.maybe_refresh(&self.header, now);
        }
    }

    /// Whether the `eject_slow` comparison is due at `now` (at most one
    /// caller per period wins it).
    pub(crate) fn slow_due(&self, now: Timestamp) -> bool {
        let Some(s) = &self.slow else {
            return false;
        };
        let period = (duration_ms(s.rule.window) / 50).clamp(20, 1000);
        s.next.claim(now, period)
    }

    /// Forget peer `index`'s `eject_slow` figure (it was ejected or readmitted:
    /// samples from before say nothing about it now).
    pub(crate) fn forget(&self, index: usize) {
        if let Some(w) = self.peers.get(index).and_then(|p| p.header.as_ref()) {
            w.reset();
        }
    }

    /// `eject_stuck`: the oldest waiting attempt of peer `index` (µs) and the
    /// threshold (µs), when that attempt has waited longer than it at `now`.
    #[inline]
    pub(crate) fn stuck(&self, index: usize, now: Timestamp) -> Option<(u64, u64)> {
        let rule = self.stuck.as_ref()?;
        let oldest = self.peers.get(index)?.waiting.as_ref()?.oldest();
        if oldest == 0 {
            return None;
        }
        let threshold = rule.threshold_us.load(Ordering::Relaxed);
        (now.0.saturating_mul(1000).saturating_sub(oldest) > threshold)
            .then_some((oldest, threshold))
    }

    /// The `eject_stuck` threshold now (µs).
    pub(crate) fn stuck_threshold_us(&self) -> Option<u64> {
        Some(self.stuck.as_ref()?.threshold_us.load(Ordering::Relaxed))
    }
}

// === impl Every ===

impl Every {
    /// Whether the refresh is due at `now` and this caller takes it (the
    /// next one is then due `period_ms` later).
    pub(crate) fn claim(&self, now: Timestamp, period_ms: u64) -> bool {
        let next = self.0.load(Ordering::Relaxed);
        now.0 >= next
            && self
                .0
                .compare_exchange(
                    next,
                    now.0 + period_ms,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
    }
}

// === impl StuckRule ===

impl StuckRule {
    /// How often the threshold follows the p99.
    pub(crate) const REFRESH_MS: u64 = 100;

    fn maybe_refresh(&self, header: &Windowed, now: Timestamp) {
        if !self.next_refresh.claim(now, Self::REFRESH_MS) {
            return;
        }
        self.threshold_us
            .store(threshold_us(&self.rule, header, now), Ordering::Relaxed);
    }
}

/// max(min, K × p99) in µs (min alone while there is no p99).
fn threshold_us(rule: &EjectStuck, header: &Windowed, now: Timestamp) -> u64 {
    let min = duration_us(rule.min);
    let p99 = header.quantile(0.99, now).map_or(0, duration_us);
    let scaled = (p99 as f64 * rule.factor).min(u64::MAX as f64) as u64;
    min.max(scaled)
}

// === impl HedgeDelay ===

impl HedgeDelay {
    /// How often the delay follows the window's quantile.
    pub(crate) const REFRESH_MS: u64 = 100;
    const NONE: u64 = u64::MAX;

    /// The delay at `now` (None while the window has too few samples).
    pub(crate) fn at(&self, header: &Windowed, now: Timestamp) -> Option<Duration> {
        if self.next_refresh.claim(now, Self::REFRESH_MS) {
            let us = header.quantile(self.q, now).map_or(Self::NONE, duration_us);
            self.us.store(us, Ordering::Relaxed);
            return (us != Self::NONE).then(|| Duration::from_micros(us));
        }
        match self.us.load(Ordering::Relaxed) {
            Self::NONE => None,
            us => Some(Duration::from_micros(us)),
        }
    }
}

// === impl Waiting ===

impl Waiting {
    fn add(&self, start_us: u64) {
        // 0 means "none": a start at 0 µs is taken as 1.
        let start = start_us.max(1);
        let mut v = self.starts.lock().unwrap_or_else(|e| e.into_inner());
        v.push(start);
        let oldest = self.oldest_us.load(Ordering::Relaxed);
        if oldest == 0 || start < oldest {
            self.oldest_us.store(start, Ordering::Relaxed);
        }
    }

    /// Remove one attempt; true when it was the one announced stuck.
    fn remove(&self, start_us: u64) -> bool {
        let start = start_us.max(1);
        let mut v = self.starts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = v.iter().position(|s| *s == start) {
            v.swap_remove(i);
        }
        if self.oldest_us.load(Ordering::Relaxed) == start || v.is_empty() {
            let oldest = v.iter().copied().min().unwrap_or(0);
            self.oldest_us.store(oldest, Ordering::Relaxed);
        }
        self.announced
            .compare_exchange(start, 0, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }

    /// The oldest start still waiting (µs), 0 for none.
    #[inline]
    pub(crate) fn oldest(&self) -> u64 {
        self.oldest_us.load(Ordering::Relaxed)
    }

    /// Attempts waiting.
    pub(crate) fn len(&self) -> usize {
        self.starts.lock().map_or(0, |v| v.len())
    }
}

// === impl Windowed ===

impl Windowed {
    pub(crate) fn new(window: Duration) -> Self {
        let half_ms = (duration_ms(window) / 2).max(1);
        Self {
            half_ms,
            halves: [Half::new(), Half::new()],
        }
    }

    /// Count a value of `us` microseconds at `now`.
    #[inline]
    pub(crate) fn record(&self, us: u64, now: Timestamp) {
        let epoch = now.0 / self.half_ms;
        let h = &self.halves[(epoch & 1) as usize];
        let seen = h.epoch.load(Ordering::Acquire);
        if seen != epoch {
            if seen > epoch {
                // A late sample of a half already reused: dropped.
                return;
            }
            if h.epoch
                .compare_exchange(seen, epoch, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                // Writers racing the reset may lose a sample or keep one
                // of the old half: an estimate, not an account.
                h.clear();
            }
        }
        h.buckets[bucket(us)].fetch_add(1, Ordering::Relaxed);
        h.count.fetch_add(1, Ordering::Relaxed);
    }

    /// Empty both halves.
    pub(crate) fn reset(&self) {
        for h in &self.halves {
            h.clear();
        }
    }

    /// The two halves' counts at `now` (halves older than the window count 0).
    fn live(&self, now: Timestamp) -> impl Iterator<Item = &Half> {
        let epoch = now.0 / self.half_ms;
        self.halves.iter().filter(move |h| {
            let e = h.epoch.load(Ordering::Acquire);
            e == epoch || e + 1 == epoch
        })
    }

    /// Samples in the window at `now`.
    pub(crate) fn count(&self, now: Timestamp) -> u64 {
        self.live(now)
            .map(|h| h.count.load(Ordering::Relaxed))
            .sum()
    }

    /// The `q` quantile at `now`, None with too few samples.
    pub(crate) fn quantile(&self, q: f64, now: Timestamp) -> Option<Duration> {
        if !(0.0..=1.0).contains(&q) {
            return None;
        }
        let total = self.count(now);
        let needed = if q >= 1.0 {
            MIN_SAMPLES
        } else {
            MIN_SAMPLES.max((1.0 / (1.0 - q)).ceil() as u64)
        };
        if total < needed {
            return None;
        }
        self.rank(q, now)
    }

    /// The median and count over the window at `now`, whatever the count.
    pub(crate) fn figure(&self, now: Timestamp) -> PeerFigure {
        PeerFigure {
            median: self.rank(0.5, now),
            requests: self.count(now),
        }
    }

    /// The value of rank ⌈q × n⌉ (at least 1) among the samples in the window.
    fn rank(&self, q: f64, now: Timestamp) -> Option<Duration> {
        let live: Vec<&Half> = self.live(now).collect();
        let counts: Vec<u64> = (0..BUCKETS)
            .map(|b| {
                live.iter()
                    .map(|h| u64::from(h.buckets[b].load(Ordering::Relaxed)))
                    .sum()
            })
            .collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return None;
        }
        let want = ((q * total as f64).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (b, c) in counts.iter().enumerate() {
            seen += c;
            if seen >= want {
                return Some(Duration::from_micros(upper(b)));
            }
        }
        Some(Duration::from_micros(upper(BUCKETS - 1)))
    }
}

impl Half {
    fn new() -> Self {
        Self {
            epoch: AtomicU64::new(0),
            count: AtomicU64::new(0),
            buckets: (0..BUCKETS).map(|_| AtomicU32::new(0)).collect(),
        }
    }

    fn clear(&self) {
        for b in self.buckets.iter() {
            b.store(0, Ordering::Relaxed);
        }
        self.count.store(0, Ordering::Relaxed);
    }
}

/// The bucket of `v` µs: exact below 16, then 8 per power of two.
#[inline]
fn bucket(v: u64) -> usize {
    if v < EXACT {
        return v as usize;
    }
    let e = (63 - v.leading_zeros()).min(MAX_EXP);
    if e == MAX_EXP && v >> MAX_EXP > 1 {
        return BUCKETS - 1;
    }
    let m = (v >> (e - SUB_BITS)) & (SUB - 1);
    (EXACT + u64::from(e - SUB_BITS - 1) * SUB + m) as usize
}

/// The largest value of bucket `b`.
fn upper(b: usize) -> u64 {
    let b = b as u64;
    if b < EXACT {
        return b;
    }
    let e = (b - EXACT) / SUB + u64::from(SUB_BITS) + 1;
    let m = (b - EXACT) % SUB;
    ((SUB + m + 1) << (e - u64::from(SUB_BITS))) - 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_exact_then_within_an_eighth() {
        for v in 0..16 {
            assert_eq!(upper(bucket(v)), v);
        }
        for v in [16u64, 17, 31, 32, 35, 36, 100, 999, 1_000_000, 1 << 36] {
            let u = upper(bucket(v));
            assert!(u >= v && (u - v) * 8 <= v, "{v} -> {u}");
        }
        // Every bucket's range starts where the previous one ended.
        for b in 1..BUCKETS - 1 {
            assert_eq!(bucket(upper(b - 1) + 1), b, "bucket {b}");
        }
        assert_eq!(bucket(u64::MAX), BUCKETS - 1, "capped, no overflow");
    }

    #[test]
    fn quantiles_need_enough_samples_and_follow_the_window() {
        let w = Windowed::new(Duration::from_secs(10));
        let t = Timestamp(1_000);
        for _ in 0..19 {
            w.record(100, t);
        }
        assert_eq!(w.quantile(0.5, t), None, "19 samples are too few");
        w.record(100, t);
        let p50 = w.quantile(0.5, t).expect("20 samples");
        assert_eq!(p50, Duration::from_micros(103), "100 µs in its bucket");
        assert_eq!(w.quantile(0.99, t), None, "a p99 needs 100 samples");
        for i in 0..80 {
            w.record(if i < 78 { 100 } else { 50_000 }, t);
        }
        // 100 samples, 2 of them at 50 ms: rank 99 is one of those.
        let p99 = w.quantile(0.99, t).expect("100 samples");
        assert!(p99 >= Duration::from_millis(50), "{p99:?}");
        // The next half still holds them; the one after that does not.
        assert_eq!(w.count(Timestamp(9_999)), 100);
        assert_eq!(w.count(Timestamp(10_000)), 0);
        // A new half starts from zero even though its slot was used.
        w.record(7, Timestamp(10_001));
        assert_eq!(w.count(Timestamp(10_001)), 1);
        w.reset();
        assert_eq!(w.figure(Timestamp(10_001)).requests, 0);
    }

    #[test]
    fn the_oldest_waiting_attempt_follows_starts_and_ends() {
        let w = Waiting::default();
        assert_eq!(w.oldest(), 0);
        w.add(300);
        w.add(100);
        w.add(200);
        assert_eq!(w.oldest(), 100);
        w.remove(200);
        assert_eq!(w.oldest(), 100);
        w.remove(100);
        assert_eq!(w.oldest(), 300);
        w.remove(300);
        assert_eq!((w.oldest(), w.len()), (0, 0));
    }
}
