//! `health_preset recommended;`: every health rule beyond nginx in one
//! line, with the values below. A directive written beside the preset
//! overrides that one setting; `expand` fills in only what was not
//! written and records which settings it supplied
//! ([`vigil_core::config::PresetSettings`]), so `vigil explain` can tell the
//! two apart and `vigil convert` writes the preset line plus the overrides.
//!
//! The values, from the failure they are for (a backend that hangs, one
//! that stops answering SYNs, one that answers after 300 ms while its
//! peers answer in ~1 ms; 1 s connect/read timeouts, a 500 ms check):
//!
//! - `passive_count after_header last_try`: a body cut short and a listed
//!   5xx that could not be retried are the evidence of a peer going bad
//!   that nginx ignores.
//! - `passive_recovery probe` with a `check` (the check decides, no user
//!   request is spent testing a peer), else `probation=3`: three
//!   successes in a row, one request at a time, before full traffic.
//! - `passive_penalty base=5s max=60s jitter=10%`: the first exclusion is
//!   half of nginx's default `fail_timeout=10s` (with probe recovery the
//!   peer is probed when it ends, so a blip costs 5 s), a peer that keeps
//!   failing stays out 10, 20, 40, 60 s; jitter spreads the returns of
//!   peers excluded by one shared cause.
//! - `max_ejected 50%`: a fault that hits every peer (a bad deploy, a
//!   shared dependency) never takes more than half the primaries out.
//! - `eject_stuck factor=3 min=25ms`: 25 ms is well above a healthy LAN
//!   backend's p99 (a few ms), and 3 × the recent p99 raises the bar for
//!   an upstream that is slow by nature. Every request sent to a hung peer
//!   before the rule sees it stuck waits for the read timeout if it cannot
//!   be hedged (a POST), so the bar must be low: measured with the
//!   `faults` bench (docs/performance.md), `min=200ms` left 10–11 requests
//!   over 900 ms, `min=50ms` 2–7, `min=25ms` 3–4 (each a POST that was
//!   sent before the hang was seen, or in flight when it began). A stuck
//!   ejection ends by
//!   itself (the peer is back as soon as its old attempt ends), so a false
//!   alarm costs little; long polling needs a larger `min`.
//! - `eject_slow factor=3 window=1s min_requests=10 min=10ms`: 3 × the
//!   median of the others is a peer clearly apart from its fleet (the
//!   300 ms peer is 300 ×); a median is not moved by a few outliers (hangs
//!   are `eject_stuck`'s business); a 1 s window (figures over the last
//!   0.5 to 1 s) sees a peer turn slow within a second: measured, the
//!   300 ms peer kept 12% of the requests of its slow phase with
//!   `window=10s`, 1.0% with `2s` and 0.4–0.6% with `1s`. With fewer than
//!   10 requests a second to a peer the rule does not judge it (no
//!   ejection on thin evidence); write `eject_slow window=10s` for quiet
//!   upstreams. `min=10ms` keeps a 0.3 ms peer among 0.1 ms ones (noise a
//!   user never sees) in.
//! - `retry_budget ratio=20% min=3/s`: Envoy's and Finagle's 20% (a
//!   retry storm can add at most a fifth to the load); the 3/s reserve
//!   lets a quiet upstream still retry (it is per upstream, shared by every
//!   client, where Finagle's 10/s is per client).
//! - `hedge after=p99 max=1`: a hung or blackholed attempt never gives a
//!   header, so the upstream's p99 keeps following its healthy peers and a
//!   request caught by a hang is sent to another peer after about the
//!   time 99% of requests take, not after the 1 s timeout; in steady state
//!   about 1% of requests are hedged (well inside the budget), and
//!   `max=1` bounds the worst case at twice the load. Only idempotent
//!   requests with a buffered or empty body are hedged.

use std::num::NonZeroU32;
use std::time::Duration;

use vigil_core::config::{
    EjectSlow, EjectStuck, Hedge, HedgeAfter, Penalty, Preset, PresetSettings, PresetUse, Recovery,
    RetryBudget, UpstreamConfig,
};

/// The `eject_stuck` of the preset, and of `eject_stuck;` without parameters.
pub const STUCK: EjectStuck = EjectStuck {
    factor: 3.0,
    min: Duration::from_millis(25),
};

/// The `eject_slow` of the preset, and the values of parameters left out.
pub const SLOW: EjectSlow = EjectSlow {
    factor: 3.0,
    window: Duration::from_secs(1),
    min_requests: 10,
    min: Duration::from_millis(10),
    max: None,
};

/// The `passive_penalty` of the preset.
pub const PENALTY: Penalty = Penalty {
    base: Duration::from_secs(5),
    max: Duration::from_secs(60),
    jitter_percent: 10,
};

/// `passive_recovery probation=N` of the preset for an upstream without a check.
pub const PROBATION: NonZeroU32 = match NonZeroU32::new(3) {
    Some(n) => n,
    None => NonZeroU32::MIN,
};

/// The `max_ejected` of the preset.
pub const MAX_EJECTED: u8 = 50;

/// The `retry_budget` of the preset.
pub const RETRY_BUDGET: RetryBudget = RetryBudget {
    ratio_percent: 20,
    min_per_sec: 3,
};

/// The `hedge` of the preset.
pub const HEDGE: Hedge = Hedge {
    after: HedgeAfter::Percentile(99),
    max: NonZeroU32::MIN,
};

/// The preset named `word`, if any.
pub fn parse(word: &str) -> Option<Preset> {
    match word {
        "recommended" => Some(Preset::Recommended),
        _ => None,
    }
}

/// Apply `preset` to `up`, whose rules hold what was written: every
/// setting not `written` (by its directive name) takes the preset's value.
/// Call after the `check` is known (recovery depends on it).
pub(crate) fn expand(up: &mut UpstreamConfig, preset: Preset, written: impl Fn(&str) -> bool) {
    let Preset::Recommended = preset;
    let has_check = up.check.is_some();
    let r = &mut up.rules;
    let mut supplied = PresetSettings::default();
    if !written("passive_count") {
        r.count.after_header = true;
        r.count.last_try = true;
        supplied.passive_count = true;
    }
    if !written("passive_recovery") {
        r.recovery = if has_check {
            Recovery::Probe
        } else {
            Recovery::Probation(PROBATION)
        };
        supplied.passive_recovery = true;
    }
    if !written("passive_penalty") {
        r.penalty = Some(PENALTY);
        supplied.passive_penalty = true;
    }
    if !written("max_ejected") {
        r.max_ejected = Some(MAX_EJECTED);
        supplied.max_ejected = true;
    }
    if !written("eject_stuck") {
        r.eject_stuck = Some(STUCK);
        supplied.eject_stuck = true;
    }
    if !written("eject_slow") {
        r.eject_slow = Some(SLOW);
        supplied.eject_slow = true;
    }
    if !written("retry_budget") {
        r.retry_budget = Some(RETRY_BUDGET);
        supplied.retry_budget = true;
    }
    if !written("hedge") {
        r.hedge = Some(HEDGE);
        supplied.hedge = true;
    }
    // Findings about a supplied setting point at the preset line.
    let at = r.origins.preset.clone();
    let o = &mut r.origins;
    for (on, slot) in [
        (supplied.passive_count, &mut o.count),
        (supplied.passive_recovery, &mut o.recovery),
        (supplied.passive_penalty, &mut o.penalty),
        (supplied.max_ejected, &mut o.max_ejected),
        (supplied.eject_stuck, &mut o.eject_stuck),
        (supplied.eject_slow, &mut o.eject_slow),
        (supplied.retry_budget, &mut o.retry_budget),
        (supplied.hedge, &mut o.hedge),
    ] {
        if on {
            *slot = at.clone();
        }
    }
    r.preset = Some(PresetUse { preset, supplied });
}

#[cfg(test)]
mod tests {
    use super::*;
    use vigil_core::config::CheckConfig;

    #[test]
    fn the_preset_fills_what_was_not_written() {
        let mut up = UpstreamConfig::new("u");
        up.rules.max_ejected = Some(20);
        expand(&mut up, Preset::Recommended, |n| n == "max_ejected");
        let r = &up.rules;
        assert_eq!(r.max_ejected, Some(20), "written wins");
        assert_eq!(r.recovery, Recovery::Probation(PROBATION), "no check");
        assert_eq!((r.eject_stuck, r.eject_slow), (Some(STUCK), Some(SLOW)));
        assert!(r.count.after_header && r.count.last_try);
        let p = r.preset.expect("recorded");
        assert_eq!(
            p.supplied.names(),
            [
                "passive_count",
                "passive_recovery",
                "passive_penalty",
                "eject_stuck",
                "eject_slow",
                "retry_budget",
                "hedge"
            ]
        );
        assert_eq!((r.retry_budget, r.hedge), (Some(RETRY_BUDGET), Some(HEDGE)));
        let mut up = UpstreamConfig::new("u");
        up.rules.hedge = None;
        expand(&mut up, Preset::Recommended, |n| n == "hedge");
        assert_eq!(up.rules.hedge, None, "a written hedge (here none) wins");
        let mut up = UpstreamConfig::new("u");
        up.check = Some(CheckConfig::default());
        expand(&mut up, Preset::Recommended, |_| false);
        assert_eq!(up.rules.recovery, Recovery::Probe, "with a check");
    }
}
