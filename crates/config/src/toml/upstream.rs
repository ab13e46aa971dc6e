//! `[upstream.NAME]` → [`UpstreamConfig`], with the nginx front end's rules.

use std::num::NonZeroU32;
use std::time::Duration;

use super::at::At;
use super::raw::{RawCheck, RawPeer, RawUpstream};
use crate::validate::RuleProblem;
use crate::{preset, validate, ConfigError, Resolver};
use vigil_core::config::{
    Balancer, CheckConfig, CheckKind, HealthRules, InitialState, Keepalive, Penalty,
    PresetSettings, PresetUse, Recovery, ServerConfig, StatusClass, UpstreamConfig,
};

/// The balancer words of `balancer =`.
const BALANCERS: &str =
    "round_robin, least_conn, ip_hash, random or random_two (for hash, set hash = \"KEY\")";

pub(super) fn upstream(
    name: &str,
    raw: &RawUpstream,
    at: &At<'_>,
    resolve: Resolver<'_>,
) -> Result<UpstreamConfig, ConfigError> {
    if name.is_empty() {
        return Err(at.err("an upstream needs a name"));
    }
    let mut up = UpstreamConfig::new(name);
    up.balancer = balancer(raw, at)?;
    for (i, s) in raw.server.iter().enumerate() {
        up.servers
            .extend(server(s, &at.key("server").index(i), resolve)?);
    }
    if up.servers.is_empty() {
        return Err(at
            .key("server")
            .err(format!("no servers are inside upstream \"{name}\"")));
    }
    up.keepalive = keepalive(raw, at)?;
    up.zone = raw.zone.clone();
    if let Some(c) = &raw.check {
        up.check = Some(check(c, &at.key("check"))?);
    }
    up.rules = rules(raw, at)?;
    ejection(raw, at, &mut up.rules)?;
    traffic(raw, &mut up.rules, at)?;
    if let Some(p) = up.rules.preset {
        crate::preset::expand(&mut up, p.preset, |name| written(raw, name));
    }
    validate::rules(&up).map_err(|p| match p {
        RuleProblem::ProbeWithoutCheck(m) => at.key("passive_recovery").err(m),
        RuleProblem::Penalty(m) => at.key("passive_penalty").err(m),
        RuleProblem::SlowStart(i, m) => at.key("server").index(i).key("slow_start").err(m),
    })?;
    if !matches!(up.balancer, Balancer::RoundRobin | Balancer::LeastConn) {
        if let Some(i) = up.servers.iter().position(|s| s.backup) {
            return Err(at.key("server").index(i).key("backup").err(format!(
                "\"backup\" cannot be used with the {} balancer in upstream \"{name}\" (nginx rejects this: hash, ip_hash and random have no backup tier)",
                balancer_word(&up.balancer)
            )));
        }
    }
    Ok(up)
}

fn balancer(raw: &RawUpstream, at: &At<'_>) -> Result<Balancer, ConfigError> {
    if let Some(key) = &raw.hash {
        if let Some(b) = &raw.balancer {
            return Err(at.key("balancer").err(format!(
                "balancer = \"{b}\" conflicts with hash = \"{key}\": hash sets the balancing method; remove one"
            )));
        }
        return Ok(Balancer::Hash {
            key: key.clone(),
            consistent: raw.consistent.unwrap_or(false),
        });
    }
    if raw.consistent.is_some() {
        return Err(at
            .key("consistent")
            .err("\"consistent\" applies only with hash = \"KEY\""));
    }
    Ok(match raw.balancer.as_deref() {
        None | Some("round_robin") => Balancer::RoundRobin,
        Some("least_conn") => Balancer::LeastConn,
        Some("ip_hash") => Balancer::IpHash,
        Some("random") => Balancer::Random { two: false },
        Some("random_two") => Balancer::Random { two: true },
        Some(other) => {
            return Err(at.key("balancer").err(format!(
                "invalid balancer \"{other}\", expected {BALANCERS}"
            )))
        }
    })
}

/// The word naming `b` in messages.
fn balancer_word(b: &Balancer) -> &'static str {
    match b {
        Balancer::RoundRobin => "round_robin",
        Balancer::LeastConn => "least_conn",
        Balancer::Hash { .. } => "hash",
        Balancer::IpHash => "ip_hash",
        Balancer::Random { two: false } => "random",
        Balancer::Random { two: true } => "random_two",
    }
}

/// One server per address `raw.address` resolves to, as nginx makes one
/// peer per address of a `server` line.
fn server(
    raw: &RawPeer,
    at: &At<'_>,
    resolve: Resolver<'_>,
) -> Result<Vec<ServerConfig>, ConfigError> {
    let (mut s, addrs) = match crate::addr::unix_path(&raw.address) {
        Some(path) => {
            let path = path.map_err(|e| at.key("address").err(e.message("", &raw.address, "")))?;
            (ServerConfig::unix(raw.address.clone(), path), Vec::new())
        }
        None => {
            let addrs = at.key("address").resolve_all(resolve, &raw.address, 80)?;
            (ServerConfig::new(raw.address.clone(), addrs[0]), addrs)
        }
    };
    if let Some(w) = raw.weight {
        s.weight = NonZeroU32::new(w)
            .ok_or_else(|| at.key("weight").err("invalid weight 0, expected 1 or more"))?;
    }
    if let Some(n) = raw.max_fails {
        s.max_fails = n;
    }
    if let Some(t) = &raw.fail_timeout {
        s.fail_timeout = at.key("fail_timeout").time(t)?;
    }
    if let Some(n) = raw.max_conns {
        s.max_conns = n;
    }
    s.backup = raw.backup.unwrap_or(false);
    s.down = raw.down.unwrap_or(false);
    if let Some(t) = &raw.slow_start {
        s.slow_start = Some(at.key("slow_start").time(t)?);
    }
    Ok(s.per_address(&addrs))
}

/// The vigil-only rule keys of `[upstream.NAME]`.
fn rules(raw: &RawUpstream, at: &At<'_>) -> Result<HealthRules, ConfigError> {
    let mut r = HealthRules::default();
    if let Some(words) = &raw.passive_count {
        let at = at.key("passive_count");
        if words.is_empty() {
            return Err(
                at.err("passive_count lists nothing, expected after_header, last_try or both")
            );
        }
        for (i, w) in words.iter().enumerate() {
            let flag = match w.as_str() {
                "after_header" => &mut r.count.after_header,
                "last_try" => &mut r.count.last_try,
                _ => {
                    return Err(at.index(i).err(format!(
                        "invalid passive_count \"{w}\", expected after_header or last_try"
                    )))
                }
            };
            if *flag {
                return Err(at.index(i).err(format!("\"{w}\" is listed twice")));
            }
            *flag = true;
        }
    }
    if let Some(text) = &raw.passive_recovery {
        r.recovery = match text.split_once('=') {
            None if text == "window" => Recovery::Window,
            None if text == "probe" => Recovery::Probe,
            Some(("probation", n)) => {
                Recovery::Probation(n.parse::<u32>().ok().and_then(NonZeroU32::new).ok_or_else(
                    || {
                        at.key("passive_recovery").err(format!(
                            "invalid \"{text}\", expected probation=N with N >= 1"
                        ))
                    },
                )?)
            }
            _ => {
                return Err(at.key("passive_recovery").err(format!(
                    "invalid passive_recovery \"{text}\", expected window, probe or probation=N"
                )))
            }
        };
    }
    if let Some(p) = &raw.passive_penalty {
        let at = at.key("passive_penalty");
        r.penalty = Some(Penalty {
            base: at.key("base").time(&p.base)?,
            max: at.key("max").time(&p.max)?,
            jitter_percent: match &p.jitter {
                Some(j) => validate::percent(j).map_err(|m| at.key("jitter").err(m))?,
                None => 0,
            },
        });
    }
    if let Some(text) = &raw.max_ejected {
        r.max_ejected = Some(validate::percent(text).map_err(|m| at.key("max_ejected").err(m))?);
    }
    Ok(r)
}

/// `eject_stuck`, `eject_slow`, `health_preset` (expanded by the caller).
fn ejection(raw: &RawUpstream, at: &At<'_>, r: &mut HealthRules) -> Result<(), ConfigError> {
    if let Some(raw) = &raw.eject_stuck {
        let at = at.key("eject_stuck");
        let mut s = preset::STUCK;
        if let Some(k) = raw.factor {
            s.factor = validate::factor_value(k, false).map_err(|m| at.key("factor").err(m))?;
        }
        if let Some(t) = &raw.min {
            s.min = at.key("min").time(t)?;
        }
        r.eject_stuck = Some(s);
    }
    if let Some(raw) = &raw.eject_slow {
        let at = at.key("eject_slow");
        let mut s = preset::SLOW;
        if let Some(k) = raw.factor {
            s.factor = validate::factor_value(k, true).map_err(|m| at.key("factor").err(m))?;
        }
        if let Some(t) = &raw.window {
            let at = at.key("window");
            s.window = at.time(t)?;
            validate::slow_window(s.window).map_err(|m| at.err(m))?;
        }
        if let Some(n) = raw.min_requests {
            s.min_requests = validate::min_requests(&n.to_string())
                .map_err(|m| at.key("min_requests").err(m))?;
        }
        if let Some(t) = &raw.min {
            s.min = at.key("min").time(t)?;
        }
        if let Some(t) = &raw.max {
            let at = at.key("max");
            let max = at.time(t)?;
            validate::slow_max(max).map_err(|m| at.err(m))?;
            s.max = Some(max);
        }
        r.eject_slow = Some(s);
    }
    if let Some(word) = &raw.health_preset {
        let preset = preset::parse(word).ok_or_else(|| {
            at.key("health_preset").err(format!(
                "invalid health_preset \"{word}\", expected recommended"
            ))
        })?;
        r.preset = Some(PresetUse {
            preset,
            supplied: PresetSettings::default(),
        });
    }
    Ok(())
}

/// `retry_budget` and `hedge` (vigil only).
fn traffic(raw: &RawUpstream, r: &mut HealthRules, at: &At<'_>) -> Result<(), ConfigError> {
    use crate::traffic as t;
    if let Some(b) = &raw.retry_budget {
        let at = at.key("retry_budget");
        r.retry_budget = Some(vigil_core::config::RetryBudget {
            ratio_percent: validate::percent(&b.ratio).map_err(|m| at.key("ratio").err(m))?,
            min_per_sec: t::per_second(&b.min).map_err(|m| at.key("min").err(m))?,
        });
    }
    if let Some(h) = &raw.hedge {
        let at = at.key("hedge");
        r.hedge = Some(vigil_core::config::Hedge {
            after: t::hedge_after(&h.after).map_err(|m| at.key("after").err(m))?,
            max: match h.max {
                Some(n) => t::hedge_max(n).map_err(|m| at.key("max").err(m))?,
                None => NonZeroU32::MIN,
            },
        });
    }
    Ok(())
}

/// Whether the rule key `name` is written in `raw`.
fn written(raw: &RawUpstream, name: &str) -> bool {
    match name {
        "passive_count" => raw.passive_count.is_some(),
        "passive_recovery" => raw.passive_recovery.is_some(),
        "passive_penalty" => raw.passive_penalty.is_some(),
        "max_ejected" => raw.max_ejected.is_some(),
        "eject_stuck" => raw.eject_stuck.is_some(),
        "eject_slow" => raw.eject_slow.is_some(),
        "retry_budget" => raw.retry_budget.is_some(),
        "hedge" => raw.hedge.is_some(),
        _ => false,
    }
}

fn keepalive(raw: &RawUpstream, at: &At<'_>) -> Result<Option<Keepalive>, ConfigError> {
    let Some(n) = raw.keepalive else {
        for (key, set) in [
            ("keepalive_timeout", raw.keepalive_timeout.is_some()),
            ("keepalive_requests", raw.keepalive_requests.is_some()),
        ] {
            if set {
                return Err(at
                    .key(key)
                    .err(format!("\"{key}\" has no effect without \"keepalive\"")));
            }
        }
        return Ok(None);
    };
    let idle = NonZeroU32::new(n).ok_or_else(|| {
        at.key("keepalive")
            .err("invalid keepalive 0, expected a positive number of idle connections")
    })?;
    let timeout = match &raw.keepalive_timeout {
        Some(t) => at.key("keepalive_timeout").time(t)?,
        None => Duration::from_secs(60),
    };
    Ok(Some(Keepalive {
        idle,
        timeout,
        requests: raw.keepalive_requests.unwrap_or(1000),
        origin: Default::default(),
    }))
}

fn check(raw: &RawCheck, at: &At<'_>) -> Result<CheckConfig, ConfigError> {
    let mut c = CheckConfig::default();
    if let Some(kind) = &raw.kind {
        let at = at.key("type");
        c.kind = match kind.as_str() {
            "tcp" => CheckKind::Tcp,
            "http" => CheckKind::Http,
            "https" => CheckKind::Https,
            "ssl_hello" | "mysql" | "ajp" | "fastcgi" => {
                return Err(at.err(format!(
                    "check type \"{kind}\" is not supported by vigil (tcp, http, https)"
                )))
            }
            _ => {
                return Err(at.err(format!(
                    "invalid check type \"{kind}\", expected tcp, http or https"
                )))
            }
        };
    }
    if let Some(t) = &raw.interval {
        c.interval = at.key("interval").time(t)?;
    }
    if let Some(t) = &raw.timeout {
        c.timeout = at.key("timeout").time(t)?;
    }
    if let Some(t) = &raw.jitter {
        c.jitter = at.key("jitter").time(t)?;
    }
    for (key, value, slot) in [
        ("rise", raw.rise, &mut c.rise),
        ("fall", raw.fall, &mut c.fall),
    ] {
        if let Some(n) = value {
            *slot = NonZeroU32::new(n).ok_or_else(|| {
                at.key(key)
                    .err(format!("invalid {key} 0, expected 1 or more"))
            })?;
        }
    }
    if let Some(p) = raw.port {
        c.port = Some(u16::try_from(p).ok().filter(|p| *p != 0).ok_or_else(|| {
            at.key("port")
                .err(format!("invalid port {p}, expected 1..65535"))
        })?);
    }
    if let Some(i) = &raw.initial {
        c.initial = match i.as_str() {
            "up" => InitialState::Up,
            "down" => InitialState::Down,
            "first-result" => InitialState::FirstResult,
            _ => {
                return Err(at.key("initial").err(format!(
                    "invalid initial state \"{i}\", expected up, down or first-result"
                )))
            }
        };
    }
    if let Some(s) = &raw.send {
        c.http.send = s.clone();
    }
    if let Some(list) = &raw.expect {
        let at = at.key("expect");
        if list.is_empty() {
            return Err(at.err("expect lists no status: every probe would fail"));
        }
        c.http.expect = list
            .iter()
            .enumerate()
            .map(|(i, w)| {
                StatusClass::parse(w).ok_or_else(|| {
                    at.index(i).err(format!(
                        "invalid status \"{w}\", expected http_1xx .. http_5xx or a status 100..599"
                    ))
                })
            })
            .collect::<Result<_, _>>()?;
    }
    c.http.body_contains = raw.body_contains.clone();
    validate::check(&c).map_err(|m| at.key(failing_key(&c)).err(m))?;
    Ok(c)
}

/// The key the shared [`validate::check`] objects to, to point at it.
fn failing_key(c: &CheckConfig) -> &'static str {
    if c.interval.is_zero() {
        "interval"
    } else if c.timeout.is_zero() || c.timeout >= c.interval {
        "timeout"
    } else {
        "jitter"
    }
}
