//! The values of vigil's traffic directives inside `upstream {}`
//! (`retry_budget`, `hedge`), shared by both front ends.

use std::num::NonZeroU32;

use vigil_core::config::value::parse_time;
use vigil_core::config::{Hedge, HedgeAfter};

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
