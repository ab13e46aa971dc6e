//! `limit_req_zone` / `limit_req` (`ngx_http_limit_req_module`) and
//! `limit_conn_zone` / `limit_conn` (`ngx_http_limit_conn_module`),
//! parsed as nginx 1.22 parses them, with its messages. A zone may be
//! named before it is declared (nginx's shared memory is bound at the end
//! of the load): the uses are checked against the zones once the `http`
//! block is read ([`check_uses`]).

use super::syntax::{Arg, Directive, Span};
use super::{args, origin, Context};
use crate::ConfigError;
use vigil_core::config::value::parse_size;
use vigil_core::config::{
    ConnLimit, LimitLogLevel, LimitZone, ProxySettings, ReqDelay, ReqLimit, ZoneKind,
};

/// Which of this level's lists and settings are its own (a first
/// `limit_req` replaces the inherited list, the next ones add to it).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Own {
    req: bool,
    conn: bool,
}

/// A zone named by `limit_req` or `limit_conn`, to be declared by the end
/// of the `http` block.
#[derive(Clone, Debug)]
pub(crate) struct Use {
    name: String,
    conn: bool,
    span: Span,
}

/// `limit_req_zone KEY zone=NAME:SIZE rate=RATE;` or
/// `limit_conn_zone KEY zone=NAME:SIZE;` (http level), into the model.
pub(super) fn zone(cx: &mut Context<'_>, d: &Directive) -> Result<(), ConfigError> {
    let conn = d.name == "limit_conn_zone";
    let a = if conn { args(d, 2, 2)? } else { args(d, 3, 3)? };
    let key = a[0].value.clone();
    let mut name = None;
    let mut size = 0;
    let mut rate = 1000;
    for p in &a[1..] {
        if let Some(z) = p.value.strip_prefix("zone=") {
            let (n, s) = z.split_once(':').ok_or_else(|| zone_size(p))?;
            // ngx_parse_size: k and m only (no g).
            size = match s.as_bytes().last() {
                Some(b'g' | b'G') => return Err(zone_size(p)),
                _ => parse_size(s).map_err(|_| zone_size(p))?,
            };
            if size < 8 * 4096 {
                return Err(ConfigError::invalid(
                    &p.span,
                    format!("zone \"{}\" is too small", p.value),
                ));
            }
            name = Some(n.to_string());
        } else if !conn && p.value.starts_with("rate=") {
            rate = parse_rate(p)?;
        } else {
            return Err(invalid_parameter(p));
        }
    }
    let Some(name) = name.filter(|n| !n.is_empty()) else {
        return Err(ConfigError::invalid(
            &d.span,
            format!("\"{}\" must have \"zone\" parameter", d.name),
        ));
    };
    let kind = if conn {
        ZoneKind::Conn
    } else {
        ZoneKind::Req { rate }
    };
    if let Some(z) = cx.config.limit_zones.iter().find(|z| z.name == name) {
        let message = if matches!(z.kind, ZoneKind::Conn) == conn {
            format!(
                "{} \"{name}\" is already bound to key \"{}\"",
                d.name, z.key
            )
        } else {
            format!("the shared memory zone \"{name}\" is already declared for a different use")
        };
        return Err(ConfigError::invalid(&d.span, message));
    }
    cx.config.limit_zones.push(LimitZone {
        name,
        key,
        size,
        kind,
        origin: origin(&d.span),
    });
    Ok(())
}

/// Apply one `limit_req*` / `limit_conn*` directive of a level; false if
/// it is not one.
pub(super) fn directive(
    cx: &mut Context<'_>,
    p: &mut ProxySettings,
    own: &mut Own,
    d: &Directive,
) -> Result<bool, ConfigError> {
    let l = &mut p.limits;
    match d.name.as_str() {
        "limit_req" => {
            let limit = req(d)?;
            if !std::mem::replace(&mut own.req, true) {
                l.req.clear();
            }
            if l.req.iter().any(|r| r.zone == limit.zone) {
                return Err(duplicate(d));
            }
            cx.limit_uses.push(Use {
                name: limit.zone.clone(),
                conn: false,
                span: d.span.clone(),
            });
            l.req.push(limit);
        }
        "limit_conn" => {
            let a = args(d, 2, 2)?;
            let zone = a[0].value.clone();
            if !std::mem::replace(&mut own.conn, true) {
                l.conn.clear();
            }
            if l.conn.iter().any(|c| c.zone == zone) {
                return Err(duplicate(d));
            }
            let n = atoi(&a[1].value).filter(|n| *n > 0).ok_or_else(|| {
                ConfigError::invalid(
                    &a[1].span,
                    format!("invalid number of connections \"{}\"", a[1].value),
                )
            })?;
            let conn = u32::try_from(n)
                .ok()
                .filter(|n| *n <= 65535)
                .ok_or_else(|| {
                    ConfigError::invalid(&a[1].span, "connection limit must be less 65536")
                })?;
            cx.limit_uses.push(Use {
                name: zone.clone(),
                conn: true,
                span: d.span.clone(),
            });
            l.conn.push(ConnLimit { zone, conn });
        }
        "limit_req_status" => l.req_status = status(d)?,
        "limit_conn_status" => l.conn_status = status(d)?,
        "limit_req_log_level" => l.req_log_level = log_level(d)?,
        "limit_conn_log_level" => l.conn_log_level = log_level(d)?,
        "limit_req_dry_run" => l.req_dry_run = flag(d)?,
        "limit_conn_dry_run" => l.conn_dry_run = flag(d)?,
        "limit_req_zone" | "limit_conn_zone" => {
            return Err(ConfigError::invalid(
                &d.span,
                format!("\"{}\" directive is not allowed here", d.name),
            ))
        }
        _ => return Ok(false),
    }
    Ok(true)
}

/// Every zone named by a `limit_req` or `limit_conn` is declared, for
/// that module (nginx's messages when the shared memory is bound).
pub(super) fn check_uses(cx: &mut Context<'_>) -> Result<(), ConfigError> {
    let uses = std::mem::take(&mut cx.limit_uses);
    for u in uses {
        let zone = cx.config.limit_zones.iter().find(|z| z.name == u.name);
        let message = match zone {
            None => format!("zero size shared memory zone \"{}\"", u.name),
            Some(z) if matches!(z.kind, ZoneKind::Conn) != u.conn => format!(
                "the shared memory zone \"{}\" is already declared for a different use",
                u.name
            ),
            Some(_) => continue,
        };
        cx.refuse(ConfigError::invalid(&u.span, message))?;
    }
    Ok(())
}

/// `limit_req zone=NAME [burst=N] [nodelay | delay=N]`.
fn req(d: &Directive) -> Result<ReqLimit, ConfigError> {
    let a = args(d, 1, 3)?;
    let mut zone = None;
    let mut burst = 0;
    let mut delay = ReqDelay::All;
    let positive = |p: &Arg, skip: usize, what: &str| {
        atoi(&p.value[skip..])
            .filter(|n| *n > 0)
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| {
                ConfigError::invalid(&p.span, format!("invalid {what} value \"{}\"", p.value))
            })
    };
    for p in a {
        let v = p.value.as_str();
        if let Some(z) = v.strip_prefix("zone=") {
            zone = Some(z.to_string());
        } else if v.starts_with("burst=") {
            burst = positive(p, 6, "burst")?;
        } else if v.starts_with("delay=") {
            delay = ReqDelay::After(positive(p, 6, "delay")?);
        } else if v == "nodelay" {
            delay = ReqDelay::NoDelay;
        } else {
            return Err(invalid_parameter(p));
        }
    }
    let zone = zone.ok_or_else(|| {
        ConfigError::invalid(&d.span, "\"limit_req\" must have \"zone\" parameter")
    })?;
    Ok(ReqLimit { zone, burst, delay })
}

/// `rate=Nr/s`, `rate=Nr/m` or `rate=N` (per second), in milli-requests a
/// second as nginx keeps it.
fn parse_rate(p: &Arg) -> Result<u64, ConfigError> {
    let v = &p.value["rate=".len()..];
    let (n, scale) = if let Some(n) = v.strip_suffix("r/s") {
        (n, 1)
    } else if let Some(n) = v.strip_suffix("r/m") {
        (n, 60)
    } else {
        (v, 1)
    };
    atoi(n)
        .filter(|n| *n > 0)
        .map(|n| n.saturating_mul(1000) / scale)
        .filter(|r| *r > 0)
        .ok_or_else(|| ConfigError::invalid(&p.span, format!("invalid rate \"{}\"", p.value)))
}

/// `limit_req_status` / `limit_conn_status` (nginx's num slot, 400..=599).
fn status(d: &Directive) -> Result<u16, ConfigError> {
    let a = &args(d, 1, 1)?[0];
    let n = atoi(&a.value).ok_or_else(|| ConfigError::invalid(&a.span, "invalid number"))?;
    u16::try_from(n)
        .ok()
        .filter(|n| (400..=599).contains(n))
        .ok_or_else(|| ConfigError::invalid(&a.span, "value must be between 400 and 599"))
}

fn log_level(d: &Directive) -> Result<LimitLogLevel, ConfigError> {
    let a = &args(d, 1, 1)?[0];
    Ok(match a.value.as_str() {
        "info" => LimitLogLevel::Info,
        "notice" => LimitLogLevel::Notice,
        "warn" => LimitLogLevel::Warn,
        "error" => LimitLogLevel::Error,
        v => {
            return Err(ConfigError::invalid(
                &a.span,
                format!("invalid value \"{v}\""),
            ))
        }
    })
}

fn flag(d: &Directive) -> Result<bool, ConfigError> {
    let a = &args(d, 1, 1)?[0];
    match a.value.as_str() {
        "on" => Ok(true),
        "off" => Ok(false),
        v => Err(ConfigError::invalid(
            &a.span,
            format!(
                "invalid value \"{v}\" in \"{}\" directive, it must be \"on\" or \"off\"",
                d.name
            ),
        )),
    }
}

/// ngx_atoi: decimal digits only, no sign, none empty.
fn atoi(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

fn zone_size(p: &Arg) -> ConfigError {
    ConfigError::invalid(&p.span, format!("invalid zone size \"{}\"", p.value))
}

fn invalid_parameter(p: &Arg) -> ConfigError {
    ConfigError::invalid(&p.span, format!("invalid parameter \"{}\"", p.value))
}

fn duplicate(d: &Directive) -> ConfigError {
    ConfigError::invalid(&d.span, format!("\"{}\" directive is duplicate", d.name))
}
