//! What a run (or a slice of one) comes to: counts by status and failure,
//! bodies cut short, slow requests, percentiles, and who answered.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use super::load::{Failure, Outcome, Run};

/// A request slower than this is "slow" (issues 9 and 10 count them).
pub const SLOW: Duration = Duration::from_millis(900);

/// The figures of a run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Summary {
    /// Requests sent.
    pub total: usize,
    /// Responses by status (cut short or not).
    pub by_status: BTreeMap<u16, usize>,
    /// Requests without a response head, by cause.
    pub failed: BTreeMap<Failure, usize>,
    /// Responses whose body was cut short.
    pub cut_short: usize,
    /// Failed requests: no head, cut short, or status ≥ 500.
    pub failures: usize,
    /// Of those, POSTs.
    pub failed_posts: usize,
    /// Requests slower than [`SLOW`].
    pub slow: usize,
    /// Median latency.
    pub p50: Duration,
    /// 99th percentile latency.
    pub p99: Duration,
    /// Responses by the backend that answered (`X-Backend`).
    pub by_backend: BTreeMap<usize, usize>,
    /// Achieved rate, requests per second.
    pub rate: f64,
}

// === impl Summary ===

impl Summary {
    /// The figures of `run`.
    pub fn of(run: &Run) -> Self {
        let mut s = Summary {
            total: run.records.len(),
            ..Summary::default()
        };
        let mut latencies: Vec<Duration> = Vec::with_capacity(run.records.len());
        for r in &run.records {
            latencies.push(r.latency);
            if r.latency > SLOW {
                s.slow += 1;
            }
            if r.failed() {
                s.failures += 1;
                s.failed_posts += usize::from(r.post);
            }
            match r.outcome {
                Outcome::Response { status, complete } => {
                    *s.by_status.entry(status).or_default() += 1;
                    if !complete {
                        s.cut_short += 1;
                    }
                }
                Outcome::Failed(f) => *s.failed.entry(f).or_default() += 1,
            }
            if let Some(b) = r.backend {
                *s.by_backend.entry(b).or_default() += 1;
            }
        }
        latencies.sort_unstable();
        s.p50 = percentile(&latencies, 50);
        s.p99 = percentile(&latencies, 99);
        let secs = run.elapsed.as_secs_f64();
        s.rate = if secs > 0.0 {
            s.total as f64 / secs
        } else {
            0.0
        };
        s
    }

    /// Share of responses backend `b` gave, 0..=1.
    pub fn share(&self, b: usize) -> f64 {
        let all: usize = self.by_backend.values().sum();
        if all == 0 {
            return 0.0;
        }
        self.by_backend.get(&b).copied().unwrap_or(0) as f64 / all as f64
    }
}

fn percentile(sorted: &[Duration], p: usize) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = (sorted.len() * p).div_ceil(100).saturating_sub(1);
    sorted[i.min(sorted.len() - 1)]
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} requests ({:.0}/s), {} failed ({} POSTs), {} cut short, {} slower than {}ms, p50 {:.1}ms p99 {:.1}ms; status",
            self.total,
            self.rate,
            self.failures,
            self.failed_posts,
            self.cut_short,
            self.slow,
            SLOW.as_millis(),
            self.p50.as_secs_f64() * 1e3,
            self.p99.as_secs_f64() * 1e3,
        )?;
        for (s, n) in &self.by_status {
            write!(f, " {s}:{n}")?;
        }
        for (c, n) in &self.failed {
            write!(f, " {}:{n}", c.word())?;
        }
        write!(f, "; served")?;
        for (b, n) in &self.by_backend {
            write!(f, " b{b}:{n}")?;
        }
        Ok(())
    }
}
