//! The values of vigil's traffic directives inside `upstream {}`
//! (`retry_budget`, `hedge`), shared by both front ends, and the checks of
//! what they may be combined with.

use std::num::NonZeroU32;

use super::value::parse_time;
use super::{Hedge, HedgeAfter, UpstreamConfig};

/// `min=N/s`: a whole number of retries per second.
pub(crate) fn per_second(text: &str) -> Result<u32, String> {
    text.strip_suffix("/s")
        .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|n| n.parse::<u32>().ok())
        .ok_or_else(|| format!("invalid rate \"{text}\", expected N/s (a whole number per second)"))
}

/// `after=T` (a time above 0) or `after=pNN` (NN from 1 to 99).
pub(crate) fn hedge_after(text: &str) -> Result<HedgeAfter, String> {
    if let Some(p) = text.strip_prefix('p') {
        return Some(p)
            .filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|p| p.parse::<u8>().ok())
            .filter(|p| (1..=99).contains(p))
            .map(HedgeAfter::Percentile)
            .ok_or_else(|| {
                format!("invalid percentile \"{text}\", expected p1 to p99 (p95: the 95th)")
            });
    }
    match parse_time(text) {
        Ok(d) if !d.is_zero() => Ok(HedgeAfter::Fixed(d)),
        Ok(_) => Err("after= must be greater than 0".into()),
        Err(_) => Err(format!(
            "invalid delay \"{text}\", expected a time (50ms) or a percentile (p95)"
        )),
    }
}

/// `max=M`: hedges per request, 1 to [`Hedge::MAX`].
pub(crate) fn hedge_max(n: i64) -> Result<NonZeroU32, String> {
    u32::try_from(n)
        .ok()
        .filter(|n| *n <= Hedge::MAX)
        .and_then(NonZeroU32::new)
        .ok_or_else(|| format!("invalid max={n}, expected 1 to {} hedges", Hedge::MAX))
}

/// A traffic rule of an upstream that cannot work.
#[derive(Debug)]
pub(crate) enum TrafficProblem {
    /// `hedge after=pNN` while core measures no time-to-header.
    HedgeNeedsLatency(String),
}

/// The traffic rules of `up` that cannot work with the rest of vigil.
pub(crate) fn check(up: &UpstreamConfig) -> Result<(), TrafficProblem> {
    if let Some(Hedge {
        after: HedgeAfter::Percentile(p),
        ..
    }) = up.rules.hedge
    {
        if !crate::upstream::MEASURES_LATENCY {
            return Err(TrafficProblem::HedgeNeedsLatency(format!(
                "\"hedge after=p{p}\" in upstream \"{}\" needs latency measurement, which this build of vigil does not have: use after=T (a fixed delay)",
                up.name
            )));
        }
    }
    Ok(())
}
