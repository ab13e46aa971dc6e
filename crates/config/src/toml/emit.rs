//! The model → the TOML schema, for [`super::to_toml_string`]: defaults
//! are left out, a setting most locations of a server share is written
//! once on the server, and implicit upstreams (made by a `proxy_pass` to a
//! `host:port`) are left for `proxy_pass` to make again.

use std::path::Path;
use std::time::Duration;

use super::forms::{RawAccessLog, RawAccessLogTable, RawHeaderBuffers, RawListen, RawListenTable};
use super::ordered::Ordered;
use super::raw::{
    RawAddHeader, RawAdmin, RawCheck, RawConfig, RawEjectSlow, RawEjectStuck, RawLocation, RawPeer,
    RawPenalty, RawProxy, RawReturn, RawServer, RawSetHeader, RawUpstream,
};
use vigil_core::config::value::format_time;
use vigil_core::config::{
    AdminConfig, Balancer, CheckConfig, CheckKind, ClientSettings, Config, HealthRules,
    HttpVersion, InitialState, Listen, Location, LocationMatch, LogFormat, ProxySettings, Recovery,
    Return, ServerBlock, ServerConfig, UpstreamConfig,
};

pub(super) fn config(c: &Config) -> RawConfig {
    let implicit = implicit_upstreams(c);
    RawConfig {
        worker_shutdown_timeout: c.shutdown_timeout.map(format_time),
        admin: admin(&c.admin),
        upstream: Ordered(
            c.upstreams
                .iter()
                .zip(implicit)
                .filter(|(_, implicit)| !implicit)
                .map(|(u, _)| (u.name.clone(), upstream(u)))
                .collect(),
        ),
        server: c.servers.iter().map(server).collect(),
        telemetry: super::telemetry::emit(&c.telemetry),
        fleet: None,
    }
}

fn admin(a: &AdminConfig) -> Option<RawAdmin> {
    (*a != AdminConfig::default()).then(|| RawAdmin {
        listen: a.listen.map(|l| l.to_string()),
        token: a.token.clone(),
        dashboard: (!a.dashboard).then_some(false),
        hosts: (!a.hosts.is_empty()).then(|| a.hosts.clone()),
    })
}

/// Which upstreams `proxy_pass` would make again by itself, in the same
/// place: single default servers named by their address, referenced by a
/// `proxy_pass`, and in the order the loader would append them. If
/// leaving them out would change the order, all are written.
fn implicit_upstreams(c: &Config) -> Vec<bool> {
    let passes: Vec<&str> = c
        .servers
        .iter()
        .flat_map(|s| &s.locations)
        .filter_map(|l| l.proxy.pass.as_ref())
        .map(|p| p.upstream.as_str())
        .collect();
    let candidate: Vec<bool> = c
        .upstreams
        .iter()
        .map(|u| passes.contains(&u.name.as_str()) && is_implicit_shape(u))
        .collect();
    let mut names: Vec<&str> = c
        .upstreams
        .iter()
        .zip(&candidate)
        .filter(|(_, c)| !**c)
        .map(|(u, _)| u.name.as_str())
        .collect();
    for p in passes {
        if !names.contains(&p) {
            names.push(p);
        }
    }
    if names
        .iter()
        .copied()
        .eq(c.upstreams.iter().map(|u| u.name.as_str()))
    {
        candidate
    } else {
        vec![false; c.upstreams.len()]
    }
}

fn is_implicit_shape(u: &UpstreamConfig) -> bool {
    let [s] = u.servers.as_slice() else {
        return false;
    };
    let mut implicit = UpstreamConfig::new(u.name.clone());
    implicit
        .servers
        .push(ServerConfig::new(u.name.clone(), s.addr));
    *u == implicit
}

fn upstream(u: &UpstreamConfig) -> RawUpstream {
    let (balancer, hash, consistent) = match &u.balancer {
        // Written even though it is the default: it documents the choice
        // and gives the upstream its own `[upstream.NAME]` header.
        Balancer::RoundRobin => (Some("round_robin"), None, None),
        Balancer::LeastConn => (Some("least_conn"), None, None),
        Balancer::IpHash => (Some("ip_hash"), None, None),
        Balancer::Random { two: false } => (Some("random"), None, None),
        Balancer::Random { two: true } => (Some("random_two"), None, None),
        Balancer::Hash { key, consistent } => (None, Some(key.clone()), consistent.then_some(true)),
    };
    let k = u.keepalive.as_ref();
    let rules = &u.rules;
    let raw = RawUpstream {
        balancer: balancer.map(str::to_string),
        hash,
        consistent,
        keepalive: k.map(|k| k.idle.get()),
        keepalive_timeout: k
            .filter(|k| k.timeout != Duration::from_secs(60))
            .map(|k| format_time(k.timeout)),
        keepalive_requests: k.filter(|k| k.requests != 1000).map(|k| k.requests),
        zone: u.zone.clone(),
        // One entry per written line: its other addresses come back on load.
        server: u
            .servers
            .iter()
            .filter(|s| s.addr_nth == 0)
            .map(peer)
            .collect(),
        check: u.check.as_ref().map(check),
        passive_count: passive_count(rules),
        passive_recovery: (rules.recovery != Recovery::Window).then(|| rules.recovery.word()),
        passive_penalty: rules.penalty.map(|p| RawPenalty {
            base: format_time(p.base),
            max: format_time(p.max),
            jitter: (p.jitter_percent != 0).then(|| format!("{}%", p.jitter_percent)),
        }),
        retry_budget: rules.retry_budget.map(|b| super::raw::RawRetryBudget {
            ratio: format!("{}%", b.ratio_percent),
            min: format!("{}/s", b.min_per_sec),
        }),
        hedge: rules.hedge.map(|h| super::raw::RawHedge {
            after: h.after.word(),
            max: (h.max.get() != 1).then(|| i64::from(h.max.get())),
        }),
        max_ejected: rules.max_ejected.map(|p| format!("{p}%")),
        eject_stuck: rules.eject_stuck.map(|s| RawEjectStuck {
            factor: Some(s.factor),
            min: Some(format_time(s.min)),
        }),
        eject_slow: rules.eject_slow.map(|s| RawEjectSlow {
            factor: Some(s.factor),
            window: Some(format_time(s.window)),
            min_requests: Some(s.min_requests),
            min: Some(format_time(s.min)),
            max: s.max.map(format_time),
        }),
        health_preset: rules.preset.map(|p| p.preset.word().to_string()),
    };
    without_supplied(raw, rules)
}

/// `health_preset`: the settings the preset supplied are left for it to
/// supply again; only the ones written beside it are emitted.
fn without_supplied(mut raw: RawUpstream, rules: &HealthRules) -> RawUpstream {
    let Some(p) = rules.preset else {
        return raw;
    };
    let s = p.supplied;
    if s.passive_count {
        raw.passive_count = None;
    }
    if s.passive_recovery {
        raw.passive_recovery = None;
    }
    if s.passive_penalty {
        raw.passive_penalty = None;
    }
    if s.max_ejected {
        raw.max_ejected = None;
    }
    if s.eject_stuck {
        raw.eject_stuck = None;
    }
    if s.eject_slow {
        raw.eject_slow = None;
    }
    if s.retry_budget {
        raw.retry_budget = None;
    }
    if s.hedge {
        raw.hedge = None;
    }
    raw
}

fn passive_count(r: &HealthRules) -> Option<Vec<String>> {
    let words: Vec<String> = [
        (r.count.after_header, "after_header"),
        (r.count.last_try, "last_try"),
    ]
    .into_iter()
    .filter(|(on, _)| *on)
    .map(|(_, w)| w.to_string())
    .collect();
    (!words.is_empty()).then_some(words)
}

fn peer(s: &ServerConfig) -> RawPeer {
    let d = ServerConfig::new(s.address.clone(), s.addr);
    RawPeer {
        address: s.address.clone(),
        weight: (s.weight != d.weight).then_some(s.weight.get()),
        max_fails: (s.max_fails != d.max_fails).then_some(s.max_fails),
        fail_timeout: (s.fail_timeout != d.fail_timeout).then(|| format_time(s.fail_timeout)),
        max_conns: (s.max_conns != d.max_conns).then_some(s.max_conns),
        backup: s.backup.then_some(true),
        down: s.down.then_some(true),
        slow_start: s.slow_start.map(format_time),
    }
}

fn check(c: &CheckConfig) -> RawCheck {
    let d = CheckConfig::default();
    RawCheck {
        kind: Some(
            match c.kind {
                CheckKind::Tcp => "tcp",
                CheckKind::Http => "http",
                CheckKind::Https => "https",
            }
            .to_string(),
        ),
        interval: (c.interval != d.interval).then(|| format_time(c.interval)),
        rise: (c.rise != d.rise).then_some(c.rise.get()),
        fall: (c.fall != d.fall).then_some(c.fall.get()),
        timeout: (c.timeout != d.timeout).then(|| format_time(c.timeout)),
        port: c.port.map(u32::from),
        initial: (c.initial != d.initial).then(|| {
            match c.initial {
                InitialState::Up => "up",
                InitialState::Down => "down",
                InitialState::FirstResult => "first-result",
            }
            .to_string()
        }),
        jitter: (c.jitter != d.jitter).then(|| format_time(c.jitter)),
        send: (c.http.send != d.http.send).then(|| c.http.send.clone()),
        expect: (c.http.expect != d.http.expect)
            .then(|| c.http.expect.iter().map(|s| s.word()).collect()),
        body_contains: c.http.body_contains.clone(),
    }
}

fn server(s: &ServerBlock) -> RawServer {
    let mut shared = shared(&s.locations);
    // The server level's own log (what no location answers goes there).
    shared.access_log = s.access_log.clone();
    let mut raw = RawServer {
        listen: s.listen.iter().map(listen).collect(),
        server_name: s.server_names.clone(),
        location: s.locations.iter().map(|l| location(l, &shared)).collect(),
        ret: s.ret.as_ref().map(ret),
        ..RawServer::default()
    };
    raw.set_proxy(diff(&shared, &ProxySettings::default()));
    client(&s.client, &mut raw);
    raw
}

/// The server's header-phase keys that differ from nginx's defaults.
fn client(c: &ClientSettings, raw: &mut RawServer) {
    let d = ClientSettings::default();
    // Destructured so that a new model field fails to compile here.
    let ClientSettings {
        header_timeout,
        header_buffers,
        header_buffer_size,
        underscores_in_headers,
        ignore_invalid_headers,
        merge_slashes,
    } = c;
    raw.client_header_timeout =
        (*header_timeout != d.header_timeout).then(|| format_time(*header_timeout));
    raw.large_client_header_buffers = (*header_buffers != d.header_buffers
        || *header_buffer_size != d.header_buffer_size)
        .then(|| {
            RawHeaderBuffers::Words(format!(
                "{header_buffers} {}",
                format_size(*header_buffer_size)
            ))
        });
    raw.underscores_in_headers =
        (*underscores_in_headers != d.underscores_in_headers).then_some(*underscores_in_headers);
    raw.ignore_invalid_headers =
        (*ignore_invalid_headers != d.ignore_invalid_headers).then_some(*ignore_invalid_headers);
    raw.merge_slashes = (*merge_slashes != d.merge_slashes).then_some(*merge_slashes);
}

fn listen(l: &Listen) -> RawListen {
    if !l.default_server && !l.reuseport && l.backlog.is_none() {
        return RawListen::Addr(l.addr.to_string());
    }
    RawListen::Table(RawListenTable {
        addr: l.addr.to_string(),
        default_server: l.default_server.then_some(true),
        reuseport: l.reuseport.then_some(true),
        backlog: l.backlog,
    })
}

fn location(l: &Location, shared: &ProxySettings) -> RawLocation {
    let mut raw = RawLocation {
        path: l.path.clone(),
        matcher: match l.matcher {
            LocationMatch::Prefix => None,
            LocationMatch::Exact => Some("exact".to_string()),
            LocationMatch::PrefixNoRegex => Some("prefix_no_regex".to_string()),
            LocationMatch::Regex => Some("regex".to_string()),
            LocationMatch::RegexCaseless => Some("regex_caseless".to_string()),
            LocationMatch::Named => Some("named".to_string()),
        },
        proxy_pass: l.proxy.pass.as_ref().map(|p| {
            let scheme = if p.tls { "https" } else { "http" };
            format!(
                "{scheme}://{}{}",
                p.upstream,
                p.uri.as_deref().unwrap_or("")
            )
        }),
        ret: l.ret.as_ref().map(ret),
        ..RawLocation::default()
    };
    raw.set_proxy(diff(&l.proxy, shared));
    raw
}

fn ret(r: &Return) -> RawReturn {
    RawReturn {
        code: r.code,
        text: r.text.clone(),
        content_type: (r.content_type != "text/plain").then(|| r.content_type.clone()),
    }
}

/// The settings written once on a server: for each key, the value most of
/// its locations have (when two or more share it); a location that differs
/// writes its own. The rest stay at their defaults.
fn shared(locations: &[Location]) -> ProxySettings {
    let mut s = ProxySettings::default();
    macro_rules! hoist {
        ($($field:ident),*) => {$(
            if let Some(v) = most_common(locations.iter().map(|l| &l.proxy.$field)) {
                s.$field = v.clone();
            }
        )*};
    }
    hoist!(
        next_upstream,
        next_upstream_tries,
        next_upstream_timeout,
        connect_timeout,
        send_timeout,
        read_timeout,
        request_buffering,
        ignore_client_abort,
        buffering,
        http_version,
        set_headers,
        add_headers,
        client_max_body_size,
        ssl_verify,
        ssl_server_name,
        access_log
    );
    // A location cannot unset a server's certificate, so it moves up only
    // when every location has the same one.
    if let [first, rest @ ..] = locations {
        let cert = &first.proxy.ssl_trusted_certificate;
        if !rest.is_empty()
            && rest
                .iter()
                .all(|l| &l.proxy.ssl_trusted_certificate == cert)
        {
            s.ssl_trusted_certificate = cert.clone();
        }
    }
    s
}

/// The value that occurs most often (the first on a tie), if at least twice.
fn most_common<'a, T: PartialEq + 'a>(
    values: impl Iterator<Item = &'a T> + Clone,
) -> Option<&'a T> {
    let mut best: Option<(&T, usize)> = None;
    for v in values.clone() {
        let n = values.clone().filter(|w| *w == v).count();
        if n >= 2 && best.is_none_or(|(_, m)| n > m) {
            best = Some((v, n));
        }
    }
    best.map(|(v, _)| v)
}

/// The keys that turn `base` into `p` (`pass` is not a proxy key).
fn diff(p: &ProxySettings, base: &ProxySettings) -> RawProxy {
    // Destructured so that a new model field fails to compile here.
    let ProxySettings {
        pass: _,
        next_upstream,
        next_upstream_tries,
        next_upstream_timeout,
        connect_timeout,
        send_timeout,
        read_timeout,
        request_buffering,
        ignore_client_abort,
        buffering,
        http_version,
        set_headers,
        add_headers,
        client_max_body_size,
        ssl_verify,
        ssl_trusted_certificate,
        ssl_server_name,
        access_log,
        client_body_timeout,
        client_send_timeout,
        client_keepalive_timeout,
        // The TOML front end has no error_page (an nginx.conf feature).
        error_pages: _,
        intercept_errors: _,
        // The TOML front end has no keys for the nginx.conf-only filters
        // yet (gzip, allow/deny, real_ip): `convert` does not carry them.
        gzip: _,
        access: _,
        real_ip: _,
        server_real_ip: _,
        redirect: _,
        hide_headers: _,
        pass_headers: _,
        // limit_req / limit_conn: no TOML keys yet; `convert` refuses them.
        limits: _,
        // Static files and the redirects' form have no TOML keys:
        // `convert` refuses a conf that sets them (convert::untranslatable).
        files: _,
        redirects: _,
    } = p;
    fn changed<T: PartialEq + Clone>(v: &T, base: &T) -> Option<T> {
        (v != base).then(|| v.clone())
    }
    RawProxy {
        next_upstream: changed(next_upstream, &base.next_upstream)
            .map(|n| n.words().into_iter().map(str::to_string).collect()),
        next_upstream_tries: changed(next_upstream_tries, &base.next_upstream_tries),
        next_upstream_timeout: changed(next_upstream_timeout, &base.next_upstream_timeout)
            .map(|t| format_time(t.unwrap_or_default())),
        connect_timeout: changed(connect_timeout, &base.connect_timeout).map(format_time),
        send_timeout: changed(send_timeout, &base.send_timeout).map(format_time),
        read_timeout: changed(read_timeout, &base.read_timeout).map(format_time),
        client_body_timeout: changed(client_body_timeout, &base.client_body_timeout)
            .map(format_time),
        client_send_timeout: changed(client_send_timeout, &base.client_send_timeout)
            .map(format_time),
        client_keepalive_timeout: changed(client_keepalive_timeout, &base.client_keepalive_timeout)
            .map(format_time),
        request_buffering: changed(request_buffering, &base.request_buffering),
        ignore_client_abort: changed(ignore_client_abort, &base.ignore_client_abort),
        buffering: changed(buffering, &base.buffering),
        http_version: changed(http_version, &base.http_version).map(|v| {
            match v {
                HttpVersion::Http10 => "1.0",
                HttpVersion::Http11 => "1.1",
            }
            .to_string()
        }),
        set_header: changed(set_headers, &base.set_headers).map(|list| {
            list.into_iter()
                .map(|h| RawSetHeader {
                    name: h.name,
                    value: h.value,
                })
                .collect()
        }),
        add_header: changed(add_headers, &base.add_headers).map(|list| {
            list.into_iter()
                .map(|h| RawAddHeader {
                    name: h.name,
                    value: h.value,
                    always: h.always.then_some(true),
                })
                .collect()
        }),
        client_max_body_size: changed(client_max_body_size, &base.client_max_body_size)
            .map(format_size),
        ssl_verify: changed(ssl_verify, &base.ssl_verify),
        ssl_server_name: changed(ssl_server_name, &base.ssl_server_name),
        // TOML cannot unset a certificate a server gave; `shared` only
        // hoists a value every location has, so that is never needed.
        ssl_trusted_certificate: changed(ssl_trusted_certificate, &base.ssl_trusted_certificate)
            .flatten()
            .map(|p| path_text(&p)),
        access_log: changed(access_log, &base.access_log).map(|log| match log {
            None => RawAccessLog::Off,
            Some(l) => RawAccessLog::Log(RawAccessLogTable {
                path: path_text(&l.path),
                format: match l.format {
                    LogFormat::Combined => None,
                    LogFormat::Json => Some("json".to_string()),
                    // TOML has no log_format: the text (its escape= is lost).
                    LogFormat::Custom(f) => Some(f.text.clone()),
                },
            }),
        }),
    }
}

fn path_text(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// A size in nginx's notation, in the largest unit that divides it.
fn format_size(n: u64) -> String {
    for (unit, per) in [("g", 1u64 << 30), ("m", 1 << 20), ("k", 1 << 10)] {
        if n != 0 && n.is_multiple_of(per) {
            return format!("{}{unit}", n / per);
        }
    }
    n.to_string()
}
