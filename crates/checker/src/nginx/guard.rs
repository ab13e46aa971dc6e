//! The minimum-healthy guard of `vigil check` (`--min-healthy N`,
//! `--fail-closed`), which is core's `max_ejected` rule in its count form:
//! [`Guard::apply`] sets [`HealthRules::keep_in_service`] on every upstream
//! of the source, so core itself keeps at least N primaries of each in
//! service (the least bad of the failing ones), and what `vigil check`
//! renders, `status` and `explain` all come from that one rule. An
//! upstream's own `max_ejected P%;` applies as well: the stricter wins.

use std::num::NonZeroU32;

use vigil_core::config::{Config, HealthRules};

/// How many servers of an upstream the probes may not take out of nginx.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Guard {
    /// Primaries in service that stay in nginx whatever the probes say
    /// (default 1): when more fail, the ones with the best record are kept
    /// up. 0: no guard.
    pub min_healthy: usize,
    /// `true` (default): the guard holds; `false` (`--fail-closed`): no
    /// guard, every failing server is marked down, even all of them (nginx
    /// then answers 502, or uses `backup` servers). An upstream's own
    /// `max_ejected` still applies.
    pub fail_open: bool,
}

// === impl Guard ===

impl Default for Guard {
    fn default() -> Self {
        Self {
            min_healthy: 1,
            fail_open: true,
        }
    }
}

impl Guard {
    /// The count `max_ejected` keeps, if the guard holds.
    pub fn keep(&self) -> Option<NonZeroU32> {
        if !self.fail_open {
            return None;
        }
        NonZeroU32::new(u32::try_from(self.min_healthy).unwrap_or(u32::MAX))
    }

    /// Put the guard into core's rules of every upstream of `config`.
    pub fn apply(&self, config: &mut Config) {
        for u in &mut config.upstreams {
            self.apply_to(&mut u.rules);
        }
    }

    /// Put the guard into one upstream's rules.
    pub fn apply_to(&self, rules: &mut HealthRules) {
        rules.keep_in_service = self.keep();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fail_closed_and_zero_set_no_count() {
        assert_eq!(Guard::default().keep(), NonZeroU32::new(1));
        let two = Guard {
            min_healthy: 2,
            fail_open: true,
        };
        assert_eq!(two.keep(), NonZeroU32::new(2));
        let closed = Guard {
            min_healthy: 2,
            fail_open: false,
        };
        assert_eq!(closed.keep(), None);
        let zero = Guard {
            min_healthy: 0,
            fail_open: true,
        };
        assert_eq!(zero.keep(), None);
    }
}
