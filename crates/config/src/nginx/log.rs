//! `log_format` and `access_log`, parsed as `ngx_http_log_module` parses
//! them (1.22): the same checks, the same messages.

use super::syntax::{Arg, Directive};
use super::{args, origin};
use crate::ConfigError;
use vigil_core::config::value::{parse_size, parse_time};
use vigil_core::config::vars::{scan, ScanError, Syntax};
use vigil_core::config::{AccessLog, LogEscape, LogFormat, LogFormatDef};

/// `log_format NAME [escape=default|json|none] STRING...;` (http level).
pub(super) fn log_format(
    d: &Directive,
    formats: &[LogFormatDef],
) -> Result<LogFormatDef, ConfigError> {
    let a = args(d, 2, 256)?;
    let name = &a[0].value;
    // nginx compares names case-sensitively here, case-insensitively in
    // access_log; `combined` is always defined.
    if name == "combined" || formats.iter().any(|f| &f.name == name) {
        return Err(ConfigError::invalid(
            &a[0].span,
            format!("duplicate \"log_format\" name \"{name}\""),
        ));
    }
    let mut rest = &a[1..];
    let mut escape = LogEscape::Default;
    if let Some(e) = rest.first().and_then(|w| w.value.strip_prefix("escape=")) {
        escape = match e {
            "default" => LogEscape::Default,
            "json" => LogEscape::Json,
            "none" => LogEscape::None,
            _ => {
                return Err(ConfigError::invalid(
                    &rest[0].span,
                    format!("unknown log format escaping \"{e}\""),
                ))
            }
        };
        rest = &rest[1..];
    }
    let mut text = String::new();
    for s in rest {
        check_text(s)?;
        text.push_str(&s.value);
    }
    Ok(LogFormatDef {
        name: name.clone(),
        escape,
        text,
        origin: origin(&d.span),
    })
}

/// `access_log off` or `access_log PATH [FORMAT [buffer=SIZE] [gzip[=LEVEL]]
/// [flush=TIME] [if=CONDITION]]`.
pub(super) fn access_log(
    d: &Directive,
    formats: &[LogFormatDef],
) -> Result<Option<AccessLog>, ConfigError> {
    let a = args(d, 1, 16)?;
    if a[0].value == "off" {
        return match a.get(1) {
            None => Ok(None),
            Some(p) => Err(ConfigError::invalid(
                &p.span,
                format!("invalid parameter \"{}\"", p.value),
            )),
        };
    }
    let path = &a[0];
    if path.value.starts_with("syslog:") {
        return Err(ConfigError::invalid(
            &path.span,
            "access_log to syslog is not supported by vigil; log to a file (or stderr via /dev/stderr)",
        ));
    }
    if path.value.contains('$') {
        return Err(ConfigError::invalid(
            &path.span,
            "access_log paths with variables are not supported by vigil",
        ));
    }
    let format = match a.get(1) {
        None => LogFormat::Combined,
        Some(n) if n.value.eq_ignore_ascii_case("combined") => LogFormat::Combined,
        Some(n) => match formats
            .iter()
            .find(|f| f.name.eq_ignore_ascii_case(&n.value))
        {
            Some(f) => LogFormat::Custom(f.clone()),
            // vigil's JSON lines, unless the conf defines a `json` format.
            None if n.value == "json" => LogFormat::Json,
            None => {
                return Err(ConfigError::invalid(
                    &n.span,
                    format!("unknown log format \"{}\"", n.value),
                ))
            }
        },
    };
    let mut condition = None;
    let mut buffered = false;
    let mut flush = None;
    for p in a.iter().skip(2) {
        let v = p.value.as_str();
        let invalid = |what: &str, s: &str| {
            Err(ConfigError::invalid(
                &p.span,
                format!("invalid {what} \"{s}\""),
            ))
        };
        if let Some(s) = v.strip_prefix("buffer=") {
            // vigil writes each line when the response ends; accepted.
            if !parse_size(s).is_ok_and(|n| n > 0) {
                return invalid("buffer size", s);
            }
            buffered = true;
        } else if let Some(s) = v.strip_prefix("flush=") {
            if !parse_time(s).is_ok_and(|t| !t.is_zero()) {
                return invalid("flush time", s);
            }
            flush = Some(p);
        } else if v == "gzip" || v.starts_with("gzip=") {
            return Err(ConfigError::invalid(
                &p.span,
                "compressed access logs (gzip) are not supported by vigil",
            ));
        } else if let Some(s) = v.strip_prefix("if=") {
            condition = Some(s.to_string());
        } else {
            return invalid("parameter", v);
        }
    }
    if flush.is_some() && !buffered {
        return Err(ConfigError::invalid(
            &d.span,
            format!("no buffer is defined for access_log \"{}\"", path.value),
        ));
    }
    Ok(Some(AccessLog {
        path: path.value.clone().into(),
        format,
        condition,
    }))
}

/// nginx's checks of a format string: a `$` needs a name, `${` its `}`.
fn check_text(s: &Arg) -> Result<(), ConfigError> {
    match scan(&s.value, Syntax::LogFormat) {
        Ok(_) => Ok(()),
        Err(ScanError::Unclosed { name, .. }) => Err(ConfigError::invalid(
            &s.span,
            format!("the closing bracket in \"{name}\" variable is missing"),
        )),
        Err(ScanError::NoName(rest)) => Err(ConfigError::invalid(
            &s.span,
            format!("invalid parameter \"{rest}\""),
        )),
    }
}
