//! vigil's traffic directives inside `upstream {}`: `retry_budget` and
//! `hedge`. Stock nginx does not know them (`vigil check` leaves them out
//! of the files it renders).

use std::num::NonZeroU32;

use super::super::syntax::Directive;
use super::super::{args, bad, origin};
use crate::traffic;
use crate::ConfigError;
use vigil_core::config::{HealthRules, Hedge, RetryBudget};

/// The traffic directives, as named in nginx.conf.
pub(super) const DIRECTIVES: [&str; 2] = HealthRules::TRAFFIC_DIRECTIVES;

/// Read one traffic directive into `rules`; a directive given twice is an error.
pub(super) fn directive(
    rules: &mut HealthRules,
    seen: &mut Vec<(String, String)>,
    d: &Directive,
) -> Result<(), ConfigError> {
    super::rules::once(seen, d)?;
    let invalid = |a: &super::super::syntax::Arg, m: String| {
        ConfigError::invalid(&a.span, format!("\"{}\": {m}", d.name))
    };
    if d.name == "retry_budget" {
        let (mut ratio, mut min) = (None, None);
        for a in args(d, 2, 2)? {
            match a.value.split_once('=') {
                Some(("ratio", v)) if ratio.is_none() => {
                    ratio = Some(crate::validate::percent(v).map_err(|m| invalid(a, m))?)
                }
                Some(("min", v)) if min.is_none() => {
                    min = Some(traffic::per_second(v).map_err(|m| invalid(a, m))?)
                }
                _ => return Err(bad(a, d, "ratio=R% and min=N/s, each once")),
            }
        }
        let (Some(ratio_percent), Some(min_per_sec)) = (ratio, min) else {
            return Err(ConfigError::invalid(
                &d.span,
                "\"retry_budget\" needs ratio=R% and min=N/s",
            ));
        };
        rules.retry_budget = Some(RetryBudget {
            ratio_percent,
            min_per_sec,
        });
        rules.origins.retry_budget = origin(&d.span);
        return Ok(());
    }
    let (mut after, mut max) = (None, None);
    for a in args(d, 1, 2)? {
        match a.value.split_once('=') {
            Some(("after", v)) if after.is_none() => {
                after = Some(traffic::hedge_after(v).map_err(|m| invalid(a, m))?)
            }
            Some(("max", v)) if max.is_none() => {
                let n = v.parse::<i64>().map_err(|_| bad(a, d, "max=M, 1 to 8"))?;
                max = Some(traffic::hedge_max(n).map_err(|m| invalid(a, m))?)
            }
            _ => return Err(bad(a, d, "after=T or after=pNN, and max=M, each once")),
        }
    }
    let Some(after) = after else {
        return Err(ConfigError::invalid(
            &d.span,
            "\"hedge\" needs after=T or after=pNN",
        ));
    };
    rules.hedge = Some(Hedge {
        after,
        max: max.unwrap_or(NonZeroU32::MIN),
    });
    rules.origins.hedge = origin(&d.span);
    Ok(())
}
