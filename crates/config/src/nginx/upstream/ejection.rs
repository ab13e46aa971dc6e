//! vigil's latency rules and the preset, inside `upstream {}`:
//! `eject_stuck factor=K min=T;`, `eject_slow factor=K window=T
//! min_requests=N [min=T] [max=T];` and `health_preset recommended;`. Every
//! parameter left out takes the preset's value ([`preset`]). Stock nginx
//! does not know them (`vigil check` leaves them out of the files it
//! renders).

use super::super::syntax::{Arg, Directive};
use super::super::{args, bad, one, origin, time};
use crate::validate;
use crate::{preset, ConfigError};
use vigil_core::config::{HealthRules, PresetSettings, PresetUse};

/// Read `eject_stuck`, `eject_slow` or `health_preset` into `rules`.
pub(super) fn directive(rules: &mut HealthRules, d: &Directive) -> Result<(), ConfigError> {
    match d.name.as_str() {
        "eject_stuck" => {
            let mut r = preset::STUCK;
            let mut seen = Vec::new();
            for a in args(d, 0, 2)? {
                let (key, value) = split(a, d, &mut seen, "factor=K and min=T")?;
                match key {
                    "factor" => r.factor = factor(a, d, value, false)?,
                    "min" => r.min = time(d, &super::value_arg(a, value))?,
                    _ => return Err(bad(a, d, "factor=K and min=T, each once")),
                }
            }
            rules.eject_stuck = Some(r);
            rules.origins.eject_stuck = origin(&d.span);
        }
        "eject_slow" => {
            let mut r = preset::SLOW;
            let mut seen = Vec::new();
            let expected = "factor=K, window=T, min_requests=N, min=T and max=T";
            for a in args(d, 0, 5)? {
                let (key, value) = split(a, d, &mut seen, expected)?;
                match key {
                    "factor" => r.factor = factor(a, d, value, true)?,
                    "window" => {
                        r.window = time(d, &super::value_arg(a, value))?;
                        validate::slow_window(r.window)
                            .map_err(|m| ConfigError::invalid(&a.span, m))?;
                    }
                    "min_requests" => {
                        r.min_requests = validate::min_requests(value).map_err(|m| {
                            ConfigError::invalid(&a.span, format!("\"eject_slow\" {m}"))
                        })?
                    }
                    "min" => r.min = time(d, &super::value_arg(a, value))?,
                    "max" => {
                        let t = time(d, &super::value_arg(a, value))?;
                        validate::slow_max(t).map_err(|m| ConfigError::invalid(&a.span, m))?;
                        r.max = Some(t);
                    }
                    _ => return Err(bad(a, d, &format!("{expected}, each once"))),
                }
            }
            rules.eject_slow = Some(r);
            rules.origins.eject_slow = origin(&d.span);
        }
        _ => {
            let a = one(d)?;
            let preset = preset::parse(&a.value).ok_or_else(|| bad(a, d, "recommended"))?;
            // Expanded once the block is read: directives written beside it win.
            rules.preset = Some(PresetUse {
                preset,
                supplied: PresetSettings::default(),
            });
            rules.origins.preset = origin(&d.span);
        }
    }
    Ok(())
}

/// `key=value`, each key once.
fn split<'a>(
    a: &'a Arg,
    d: &Directive,
    seen: &mut Vec<&'a str>,
    expected: &str,
) -> Result<(&'a str, &'a str), ConfigError> {
    let Some((key, value)) = a.value.split_once('=') else {
        return Err(bad(a, d, expected));
    };
    if seen.contains(&key) {
        return Err(bad(a, d, &format!("{expected}, each once")));
    }
    seen.push(key);
    Ok((key, value))
}

fn factor(a: &Arg, d: &Directive, value: &str, slow: bool) -> Result<f64, ConfigError> {
    validate::factor(value, slow)
        .map_err(|m| ConfigError::invalid(&a.span, format!("\"{}\": {m}", d.name)))
}
