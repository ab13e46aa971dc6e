//! Checks both front ends share, on already-typed values.

use super::CheckConfig;

/// A check definition that cannot work.
pub(crate) fn check(c: &CheckConfig) -> Result<(), String> {
    if c.interval.is_zero() {
        return Err("check interval must be greater than 0".into());
    }
    if c.timeout.is_zero() {
        return Err("check timeout must be greater than 0".into());
    }
    if c.timeout >= c.interval {
        return Err(format!(
            "check timeout ({}) must be shorter than interval ({}): a probe would still run when the next is due",
            super::value::format_time(c.timeout),
            super::value::format_time(c.interval)
        ));
    }
    if c.jitter >= c.interval {
        return Err("check jitter must be shorter than interval".into());
    }
    Ok(())
}
