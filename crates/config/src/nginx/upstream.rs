//! `upstream NAME { ... }` blocks, including tengine's `check` family and
//! vigil's own peer rules ([`rules`]).

mod ejection;
mod rules;
mod traffic;

use std::num::NonZeroU32;
use std::time::Duration;

use super::sources::{Placed, Placements};
use super::syntax::{Arg, Directive};
use super::{args, bad, no_block, number, one, origin, time, unknown, unsupported, Context};
use crate::addr;
use crate::ConfigError;
use vigil_core::config::value::parse_time;
use vigil_core::config::{
    Balancer, CheckConfig, CheckKind, InitialState, Keepalive, ResolverConfig, ServerConfig,
    StatusClass, UpstreamConfig,
};

/// An `upstream` block; None when lenient mode refused it as a whole.
pub(super) fn upstream_block(
    cx: &mut Context<'_>,
    d: &Directive,
) -> Result<Option<UpstreamConfig>, ConfigError> {
    let name = d.args.first().filter(|_| d.args.len() == 1).ok_or_else(|| {
        ConfigError::invalid(
            &d.span,
            "invalid number of arguments in \"upstream\" directive",
        )
    });
    let Some(name) = cx.keep(name)? else {
        return Ok(None);
    };
    let name = &name.value;
    let Some(body) = cx.keep(super::block(d))? else {
        cx.refused_upstreams.push(name.clone());
        return Ok(None);
    };
    let mut up = UpstreamConfig::new(name.clone());
    up.origin = origin(&d.span);
    let mut placed_servers = Vec::new();
    let mut placed = Placements::default();
    let mut balancer_at: Option<&Directive> = None;
    let mut keepalive_timeout = Duration::from_secs(60);
    let mut keepalive_requests = 1000;
    let mut check: Option<CheckConfig> = None;
    let mut http_send: Option<String> = None;
    let mut http_expect: Option<Vec<StatusClass>> = None;
    let mut rules_seen = Vec::new();
    let mut traffic_seen = Vec::new();
    let mut servers_refused = false;
    for d in body {
        let r = upstream_directive(
            cx,
            d,
            &mut up,
            &mut balancer_at,
            &mut keepalive_timeout,
            &mut keepalive_requests,
            &mut check,
            &mut http_send,
            &mut http_expect,
            &mut rules_seen,
            &mut traffic_seen,
        );
        let kept = cx.keep(r)?.is_some();
        if !kept && d.name == "server" {
            servers_refused = true;
        }
        if kept {
            if d.name == "server" {
                placed_servers.push(Placed::of(d));
            } else {
                placed.set(d);
            }
        }
    }
    if let Some(k) = &mut up.keepalive {
        k.timeout = keepalive_timeout;
        k.requests = keepalive_requests;
    }
    if up.servers.is_empty() {
        // Lenient: when its server lines were refused, that was the news.
        if !servers_refused {
            cx.refuse(ConfigError::invalid(
                &d.span,
                format!("no servers are inside upstream \"{}\"", up.name),
            ))?;
        }
        cx.refused_upstreams.push(up.name);
        return Ok(None);
    }
    if let Some(c) = &mut check {
        if let Some(s) = http_send {
            c.http.send = s;
        }
        if let Some(e) = http_expect {
            c.http.expect = e;
        }
    } else if http_send.is_some() || http_expect.is_some() {
        cx.refuse(ConfigError::invalid(
            &d.span,
            format!(
                "upstream \"{}\" has check_http_* directives but no \"check\"",
                up.name
            ),
        ))?;
    }
    up.check = check;
    if let Some(p) = up.rules.preset {
        crate::preset::expand(&mut up, p.preset, |name| {
            rules_seen
                .iter()
                .chain(&traffic_seen)
                .any(|(n, _)| n == name)
        });
    }
    cx.keep(rules::check(&up))?;
    if !matches!(up.balancer, Balancer::RoundRobin | Balancer::LeastConn) {
        if let Some(s) = up.servers.iter().find(|s| s.backup) {
            cx.refuse(ConfigError::invalid(
                s.origin.clone(),
                format!(
                    "\"backup\" cannot be used with \"{}\" in upstream \"{}\" (nginx rejects this: hash, ip_hash and random have no backup tier)",
                    balancer_at.map_or("", |d| d.name.as_str()),
                    up.name
                ),
            ))?;
        }
    }
    cx.sources.add_upstream(&up.name, placed_servers, placed);
    Ok(Some(up))
}

/// One directive of an `upstream` block.
#[allow(clippy::too_many_arguments)]
fn upstream_directive<'d>(
    cx: &mut Context<'_>,
    d: &'d Directive,
    up: &mut UpstreamConfig,
    balancer_at: &mut Option<&'d Directive>,
    keepalive_timeout: &mut Duration,
    keepalive_requests: &mut u32,
    check: &mut Option<CheckConfig>,
    http_send: &mut Option<String>,
    http_expect: &mut Option<Vec<StatusClass>>,
    rules_seen: &mut Vec<(String, String)>,
    traffic_seen: &mut Vec<(String, String)>,
) -> Result<(), ConfigError> {
    match d.name.as_str() {
        "server" => up.servers.extend(server(cx, d)?),
        "least_conn" | "ip_hash" | "hash" | "random" => {
            if let Some(prev) = balancer_at {
                return Err(ConfigError::invalid(
                    &d.span,
                    format!(
                        "load balancing method redefined (first \"{}\" at {})",
                        prev.name, prev.span
                    ),
                ));
            }
            up.balancer = balancer(d)?;
            *balancer_at = Some(d);
        }
        "keepalive" => {
            let a = one(d)?;
            let n = number(d, a)?;
            let idle = NonZeroU32::new(n)
                .ok_or_else(|| bad(a, d, "a positive number of idle connections"))?;
            up.keepalive = Some(Keepalive {
                idle,
                timeout: Duration::ZERO,
                requests: 0,
                origin: origin(&d.span),
            });
        }
        "keepalive_timeout" => *keepalive_timeout = time(d, one(d)?)?,
        "keepalive_requests" => *keepalive_requests = number(d, one(d)?)?,
        "keepalive_time" => cx.ignore(d),
        "zone" => up.zone = Some(args(d, 1, 2)?[0].value.clone()),
        "resolver" => {
            if up.resolver.is_some() {
                return Err(ConfigError::invalid(
                    &d.span,
                    "\"resolver\" directive is duplicate",
                ));
            }
            up.resolver = Some(resolver(cx, d)?);
        }
        "resolver_timeout" => up.resolver_timeout = Some(time(d, one(d)?)?),
        name if traffic::DIRECTIVES.contains(&name) => {
            traffic::directive(&mut up.rules, traffic_seen, d)?
        }
        "check" => *check = Some(check_directive(d)?),
        "check_http_send" => *http_send = Some(one(d)?.value.clone()),
        "check_http_expect_alive" => {
            let list = args(d, 1, 16)?
                .iter()
                .map(|a| {
                    StatusClass::parse(&a.value)
                        .ok_or_else(|| bad(a, d, "http_1xx .. http_5xx or a status"))
                })
                .collect::<Result<Vec<_>, _>>()?;
            *http_expect = Some(list);
        }
        "check_keepalive_requests" => {
            let a = one(d)?;
            if number(d, a)? > 1 {
                return Err(unsupported(d, "vigil opens one connection per probe"));
            }
        }
        "check_shm_size" => cx.ignore(d),
        name if rules::DIRECTIVES.contains(&name) => {
            rules::directive(&mut up.rules, rules_seen, d)?
        }
        "sticky" | "ntlm" | "least_time" | "queue" | "state" => {
            return Err(unsupported(d, "not implemented by vigil"));
        }
        _ => return Err(unknown(d, "upstream")),
    }
    Ok(())
}

fn balancer(d: &Directive) -> Result<Balancer, ConfigError> {
    Ok(match d.name.as_str() {
        "least_conn" => {
            args(d, 0, 0)?;
            Balancer::LeastConn
        }
        "ip_hash" => {
            args(d, 0, 0)?;
            Balancer::IpHash
        }
        "hash" => {
            let a = args(d, 1, 2)?;
            let consistent = match a.get(1) {
                None => false,
                Some(c) if c.value == "consistent" => true,
                Some(c) => return Err(bad(c, d, "\"consistent\"")),
            };
            Balancer::Hash {
                key: a[0].value.clone(),
                consistent,
            }
        }
        _ => {
            let a = args(d, 0, 2)?;
            let words: Vec<&str> = a.iter().map(|a| a.value.as_str()).collect();
            match words.as_slice() {
                [] => Balancer::Random { two: false },
                ["two"] | ["two", "least_conn"] => Balancer::Random { two: true },
                _ => return Err(bad(&a[a.len() - 1], d, "\"two\" or \"two least_conn\"")),
            }
        }
    })
}

/// A `server` line: one server per address its name resolves to, as nginx
/// makes one peer per address.
fn server(cx: &mut Context<'_>, d: &Directive) -> Result<Vec<ServerConfig>, ConfigError> {
    no_block(d)?;
    let Some((addr_arg, params)) = d.args.split_first() else {
        return Err(ConfigError::invalid(
            &d.span,
            "invalid number of arguments in \"server\" directive",
        ));
    };
    let (mut s, addrs) = match addr::unix_path(&addr_arg.value) {
        Some(path) => {
            let path = path.map_err(|e| {
                ConfigError::invalid(&addr_arg.span, e.message("upstream ", &addr_arg.value, ""))
            })?;
            (ServerConfig::unix(addr_arg.value.clone(), path), Vec::new())
        }
        None => {
            let addrs = resolve_all(cx, addr_arg, &addr_arg.value, 80)?;
            (ServerConfig::new(addr_arg.value.clone(), addrs[0]), addrs)
        }
    };
    s.origin = origin(&d.span);
    // `resolve` (nginx 1.27.3+): re-resolved while running, through the
    // upstream's `resolver` (checked once the http level is read). An
    // address written as an IP stays what it is, as in nginx.
    s.resolve = !addrs.is_empty()
        && params.iter().any(|p| p.value == "resolve")
        && addr_arg.value.parse::<std::net::SocketAddr>().is_err()
        && addr_arg.value.parse::<std::net::IpAddr>().is_err();
    for p in params.iter().filter(|p| p.value != "resolve") {
        // Lenient: a refused parameter is left out, the server kept.
        let r = server_param(&mut s, d, p);
        cx.keep(r)?;
    }
    Ok(s.per_address(&addrs))
}

fn server_param(s: &mut ServerConfig, d: &Directive, p: &Arg) -> Result<(), ConfigError> {
    let (key, value) = p.value.split_once('=').unwrap_or((p.value.as_str(), ""));
    match key {
        "weight" => {
            let n = number(d, &value_arg(p, value))?;
            s.weight = NonZeroU32::new(n).ok_or_else(|| bad(p, d, "weight=N with N >= 1"))?;
        }
        "max_fails" => s.max_fails = number(d, &value_arg(p, value))?,
        "max_conns" => s.max_conns = number(d, &value_arg(p, value))?,
        "fail_timeout" => s.fail_timeout = time(d, &value_arg(p, value))?,
        "slow_start" => s.slow_start = Some(time(d, &value_arg(p, value))?),
        "backup" if value.is_empty() => s.backup = true,
        "down" if value.is_empty() => s.down = true,
        "service" | "route" | "drain" => {
            return Err(ConfigError::invalid(
                &p.span,
                format!("server parameter \"{key}\" is not supported by vigil"),
            ))
        }
        _ => {
            return Err(bad(
                p,
                d,
                "weight=, max_fails=, fail_timeout=, max_conns=, slow_start=, backup or down",
            ))
        }
    }
    Ok(())
}

fn value_arg(p: &Arg, value: &str) -> Arg {
    Arg {
        value: value.to_string(),
        quoted: p.quoted,
        span: p.span.clone(),
    }
}

/// `resolver ADDRESS ... [valid=TIME] [ipv4=on|off] [ipv6=on|off]`, as
/// nginx's `ngx_resolver_create` reads it (port 53 by default; a name
/// stands for all its addresses). `resolver_timeout` is merged later.
pub(super) fn resolver(cx: &Context<'_>, d: &Directive) -> Result<ResolverConfig, ConfigError> {
    let mut r = ResolverConfig {
        servers: Vec::new(),
        valid: None,
        ipv4: true,
        ipv6: true,
        timeout: Duration::from_secs(30),
        origin: origin(&d.span),
    };
    let invalid =
        |a: &Arg| ConfigError::invalid(&a.span, format!("invalid parameter: {}", a.value));
    for a in args(d, 1, 64)? {
        let on_off = |v: &str| match v {
            "on" => Ok(true),
            "off" => Ok(false),
            _ => Err(invalid(a)),
        };
        if let Some(v) = a.value.strip_prefix("valid=") {
            r.valid = Some(parse_time(v).map_err(|_| invalid(a))?);
        } else if let Some(v) = a.value.strip_prefix("ipv4=") {
            r.ipv4 = on_off(v)?;
        } else if let Some(v) = a.value.strip_prefix("ipv6=") {
            r.ipv6 = on_off(v)?;
        } else {
            let addrs = addr::resolve_all(&a.value, 53, addr::Use::Upstream, cx.resolve)
                .map_err(|e| ConfigError::invalid(&a.span, e.message("resolver ", &a.value, "")))?;
            r.servers.extend(addrs);
        }
    }
    if !r.ipv4 && !r.ipv6 {
        return Err(ConfigError::invalid(
            &d.span,
            "\"ipv4\" and \"ipv6\" cannot both be \"off\"",
        ));
    }
    if r.servers.is_empty() {
        return Err(ConfigError::invalid(&d.span, "no name servers defined"));
    }
    Ok(r)
}

/// nginx's checks of an upstream with `server ... resolve` lines, once
/// the http level's `resolver` is known (`ngx_http_upstream_init_round_robin`):
/// `resolver` / `resolver_timeout` merged from `http`, a `zone` and a
/// resolver required.
pub(super) fn merge_resolver(
    up: &mut UpstreamConfig,
    http: Option<&ResolverConfig>,
    http_timeout: Option<Duration>,
) -> Result<(), ConfigError> {
    if up.resolver.is_none() {
        up.resolver = http.cloned();
    }
    let timeout = up
        .resolver_timeout
        .or(http_timeout)
        .unwrap_or(Duration::from_secs(30));
    if let Some(r) = &mut up.resolver {
        r.timeout = timeout;
    }
    let Some(s) = up.servers.iter().find(|s| s.resolve) else {
        return Ok(());
    };
    let at = match &up.origin.0 {
        Some(p) => format!(" in {}:{}", p.file.display(), p.line),
        None => String::new(),
    };
    if up.zone.is_none() {
        return Err(ConfigError::invalid(
            s.origin.clone(),
            format!(
                "resolving names at run time requires upstream \"{}\"{at} to be in shared memory",
                up.name
            ),
        ));
    }
    if up.resolver.is_none() {
        return Err(ConfigError::invalid(
            s.origin.clone(),
            format!(
                "no resolver defined to resolve names at run time in upstream \"{}\"{at}",
                up.name
            ),
        ));
    }
    Ok(())
}

/// Resolve an upstream address `text` (the address part of `a`) to every
/// address of its name, with nginx's errors (`host not found in upstream
/// "TEXT"`, quoting `a`).
pub(super) fn resolve_all(
    cx: &Context<'_>,
    a: &Arg,
    text: &str,
    default_port: u16,
) -> Result<Vec<std::net::SocketAddr>, ConfigError> {
    addr::resolve_all(text, default_port, addr::Use::Upstream, cx.resolve)
        .map_err(|e| ConfigError::invalid(&a.span, e.message("upstream ", &a.value, "")))
}

/// Resolve `text` (the address part of `a`) for `used`; an error quotes
/// `a` as nginx does (`... in upstream "TEXT"`, `... in "TEXT" of the
/// "listen" directive`).
pub(super) fn resolve_as(
    cx: &Context<'_>,
    a: &Arg,
    text: &str,
    default_port: u16,
    used: addr::Use,
) -> Result<std::net::SocketAddr, ConfigError> {
    addr::resolve(text, default_port, used, cx.resolve).map_err(|e| {
        let message = match used {
            addr::Use::Listen => e.message("", &a.value, " of the \"listen\" directive"),
            addr::Use::Upstream => e.message("upstream ", &a.value, ""),
        };
        ConfigError::invalid(&a.span, message)
    })
}

/// tengine's `check interval=ms rise=n fall=n timeout=ms type=... default_down=... port=n`,
/// plus vigil's `jitter=` and `initial=up|down|first-result`. Bare numbers
/// for interval, timeout and jitter are milliseconds, as in tengine; units
/// (`3s`) are accepted too.
fn check_directive(d: &Directive) -> Result<CheckConfig, ConfigError> {
    let mut c = CheckConfig {
        origin: origin(&d.span),
        ..CheckConfig::default()
    };
    for p in args(d, 0, 16)? {
        let Some((key, value)) = p.value.split_once('=') else {
            return Err(bad(p, d, "key=value"));
        };
        let ms = |v: &str| -> Result<Duration, ConfigError> {
            if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
                return v
                    .parse::<u64>()
                    .map(Duration::from_millis)
                    .map_err(|_| bad(p, d, "milliseconds"));
            }
            parse_time(v)
                .map_err(|e| ConfigError::invalid(&p.span, format!("\"check\" {key}: {e}")))
        };
        let count = |v: &str| -> Result<NonZeroU32, ConfigError> {
            v.parse::<u32>()
                .ok()
                .and_then(NonZeroU32::new)
                .ok_or_else(|| bad(p, d, &format!("{key}=N with N >= 1")))
        };
        match key {
            "interval" => c.interval = ms(value)?,
            "timeout" => c.timeout = ms(value)?,
            "jitter" => c.jitter = ms(value)?,
            "rise" => c.rise = count(value)?,
            "fall" => c.fall = count(value)?,
            "port" => {
                c.port = Some(
                    value
                        .parse::<u16>()
                        .ok()
                        .filter(|p| *p != 0)
                        .ok_or_else(|| bad(p, d, "port=1..65535"))?,
                )
            }
            "type" => {
                c.kind = match value {
                    "tcp" => CheckKind::Tcp,
                    "http" => CheckKind::Http,
                    "https" => CheckKind::Https,
                    "ssl_hello" | "mysql" | "ajp" | "fastcgi" => {
                        return Err(ConfigError::invalid(
                            &p.span,
                            format!(
                            "check type \"{value}\" is not supported by vigil (tcp, http, https)"
                        ),
                        ))
                    }
                    _ => return Err(bad(p, d, "type=tcp|http|https")),
                }
            }
            "default_down" => {
                c.initial = match value {
                    "true" => InitialState::Down,
                    "false" => InitialState::Up,
                    _ => return Err(bad(p, d, "default_down=true|false")),
                }
            }
            "initial" => {
                c.initial = match value {
                    "up" => InitialState::Up,
                    "down" => InitialState::Down,
                    "first-result" => InitialState::FirstResult,
                    _ => return Err(bad(p, d, "initial=up|down|first-result")),
                }
            }
            "unique" => {}
            _ => {
                return Err(bad(
                    p,
                    d,
                    "interval=, rise=, fall=, timeout=, type=, default_down=, port=, jitter=",
                ))
            }
        }
    }
    super::super::validate::check(&c).map_err(|m| ConfigError::invalid(&d.span, m))?;
    Ok(c)
}
