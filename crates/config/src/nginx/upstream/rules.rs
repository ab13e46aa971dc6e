//! vigil's peer rules beyond nginx, inside `upstream {}`: `passive_count`,
//! `passive_recovery`, `passive_penalty` and `max_ejected`. Stock nginx does
//! not know them (`vigil check` leaves them out of the files it renders).

use std::num::NonZeroU32;

use super::super::syntax::Directive;
use super::super::{args, bad, one, origin, time};
use crate::validate::{self, RuleProblem};
use crate::ConfigError;
use vigil_core::config::{HealthRules, Penalty, Recovery, UpstreamConfig};

/// The rule directives, as named in nginx.conf.
pub(super) const DIRECTIVES: [&str; 7] = HealthRules::DIRECTIVES;

/// `d` is given for the first time in its block (`seen`: the directives so
/// far, with their places); a second time is an error naming the first.
pub(super) fn once(seen: &mut Vec<(String, String)>, d: &Directive) -> Result<(), ConfigError> {
    if let Some((_, at)) = seen.iter().find(|(n, _)| *n == d.name) {
        return Err(ConfigError::invalid(
            &d.span,
            format!("\"{}\" directive is duplicate (first at {at})", d.name),
        ));
    }
    seen.push((d.name.clone(), d.span.to_string()));
    Ok(())
}

/// Read one rule directive into `rules`; a directive given twice is an error.
pub(super) fn directive(
    rules: &mut HealthRules,
    seen: &mut Vec<(String, String)>,
    d: &Directive,
) -> Result<(), ConfigError> {
    once(seen, d)?;
    match d.name.as_str() {
        "eject_stuck" | "eject_slow" | "health_preset" => super::ejection::directive(rules, d)?,
        "passive_count" => {
            for a in args(d, 1, 2)? {
                let flag = match a.value.as_str() {
                    "after_header" => &mut rules.count.after_header,
                    "last_try" => &mut rules.count.last_try,
                    _ => return Err(bad(a, d, "after_header or last_try")),
                };
                if *flag {
                    return Err(bad(a, d, "each word once"));
                }
                *flag = true;
            }
            rules.origins.count = origin(&d.span);
        }
        "passive_recovery" => {
            let a = one(d)?;
            rules.recovery = match a.value.split_once('=') {
                None if a.value == "window" => Recovery::Window,
                None if a.value == "probe" => Recovery::Probe,
                Some(("probation", n)) => Recovery::Probation(
                    n.parse::<u32>()
                        .ok()
                        .and_then(NonZeroU32::new)
                        .ok_or_else(|| bad(a, d, "probation=N with N >= 1"))?,
                ),
                _ => return Err(bad(a, d, "window, probe or probation=N")),
            };
            rules.origins.recovery = origin(&d.span);
        }
        "passive_penalty" => {
            let (mut base, mut max, mut jitter) = (None, None, 0);
            for a in args(d, 2, 3)? {
                let (key, value) = a.value.split_once('=').unwrap_or((a.value.as_str(), ""));
                let v = super::value_arg(a, value);
                match key {
                    "base" if base.is_none() => base = Some(time(d, &v)?),
                    "max" if max.is_none() => max = Some(time(d, &v)?),
                    "jitter" => {
                        jitter = validate::percent(value).map_err(|m| {
                            ConfigError::invalid(&a.span, format!("\"passive_penalty\" {m}"))
                        })?
                    }
                    _ => return Err(bad(a, d, "base=T, max=T and jitter=P%, each once")),
                }
            }
            let (Some(base), Some(max)) = (base, max) else {
                return Err(ConfigError::invalid(
                    &d.span,
                    "\"passive_penalty\" needs base=T and max=T",
                ));
            };
            rules.penalty = Some(Penalty {
                base,
                max,
                jitter_percent: jitter,
            });
            rules.origins.penalty = origin(&d.span);
        }
        _ => {
            let a = one(d)?;
            rules.max_ejected = Some(
                validate::percent(&a.value)
                    .map_err(|m| ConfigError::invalid(&a.span, format!("\"max_ejected\": {m}")))?,
            );
            rules.origins.max_ejected = origin(&d.span);
        }
    }
    Ok(())
}

/// The shared checks, with the error at the directive or server line at fault.
pub(super) fn check(up: &UpstreamConfig) -> Result<(), ConfigError> {
    validate::rules(up).map_err(|p| match p {
        RuleProblem::ProbeWithoutCheck(m) => {
            ConfigError::invalid(up.rules.origins.recovery.clone(), m)
        }
        RuleProblem::Penalty(m) => ConfigError::invalid(up.rules.origins.penalty.clone(), m),
        RuleProblem::SlowStart(i, m) => ConfigError::invalid(
            up.servers
                .get(i)
                .map_or_else(|| up.origin.clone(), |s| s.origin.clone()),
            m,
        ),
    })
}
