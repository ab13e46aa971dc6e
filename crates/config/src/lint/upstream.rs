//! Traps of an `upstream` block on its own, whoever proxies to it.

use std::time::Duration;

use super::{finding, t, times, Cx, Positioned, Severity};
use vigil_core::config::{InitialState, UpstreamConfig};

pub(super) const MAX_FAILS_SINGLE_SERVER: &str = "max-fails-single-server";
pub(super) const KEEPALIVE_IS_NOT_A_CAP: &str = "keepalive-is-not-a-cap";
pub(super) const DEFAULT_DOWN_LONG_INTERVAL: &str = "default-down-long-interval";
pub(super) const ALL_SERVERS_DOWN: &str = "all-servers-down";

/// nginx's `server` defaults: `max_fails=1 fail_timeout=10s`.
const DEFAULT_MAX_FAILS: u32 = 1;
const DEFAULT_FAIL_TIMEOUT: Duration = Duration::from_secs(10);

/// From this long (`interval × rise`) on, starting peers down is reported.
const DEFAULT_DOWN_LIMIT: Duration = Duration::from_secs(10);

pub(super) fn lint(cx: &Cx<'_>, up: &UpstreamConfig, out: &mut Vec<Positioned>) {
    single_server(cx, up, out);
    keepalive(up, out);
    default_down(cx, up, out);
    all_down(cx, up, out);
}

/// `max-fails-single-server`: parameters nginx ignores on a single server.
fn single_server(cx: &Cx<'_>, up: &UpstreamConfig, out: &mut Vec<Positioned>) {
    if !up.is_single() {
        return;
    }
    let Some((index, s)) = up.servers.iter().enumerate().find(|(_, s)| !s.backup) else {
        return;
    };
    // max_fails=0 says "never exclude", which is what happens anyway.
    let set = s.max_fails != 0
        && (s.max_fails != DEFAULT_MAX_FAILS
            || s.fail_timeout != DEFAULT_FAIL_TIMEOUT
            || s.slow_start.is_some());
    if !set {
        return;
    }
    let mut params = Vec::new();
    if s.max_fails != DEFAULT_MAX_FAILS {
        params.push(format!("max_fails={}", s.max_fails));
    }
    if s.fail_timeout != DEFAULT_FAIL_TIMEOUT {
        params.push(format!("fail_timeout={}", t(s.fail_timeout)));
    }
    if let Some(ss) = s.slow_start {
        params.push(format!("slow_start={}", t(ss)));
    }
    let verb = if params.len() == 1 { "is" } else { "are" };
    // The first parameter written, else the server line.
    let at = cx.server_line(up, index).map_or_else(
        || s.origin.clone(),
        |line| {
            params
                .iter()
                .filter_map(|p| p.split_once('=').and_then(|(k, _)| line.param(k)))
                .next()
                .map_or_else(|| line.origin(), |a| crate::nginx::origin(&a.span))
        },
    );
    let params = params.join(" ");
    out.push(finding(
        MAX_FAILS_SINGLE_SERVER,
        Severity::Warning,
        &at,
        format!(
            "upstream {} has a single server: {params} on {} {verb} ignored, it is never taken out",
            up.name, s.address
        ),
        format!(
            "nginx marks a group with one primary server and no backup as single \
             (peers->single) and never considers that server unavailable: the nginx docs say \
             \"If there is only a single server in a group, max_fails, fail_timeout and \
             slow_start parameters are ignored, and such a server will never be considered \
             unavailable\" (https://nginx.org/en/docs/http/ngx_http_upstream_module.html#server), \
             and a failed request is not retried either \
             (ngx_http_upstream_free_round_robin_peer() returns at once for a single peer). So \
             `{params}` does nothing here: when {addr} hangs, every request waits the full \
             proxy_connect_timeout or proxy_read_timeout before it fails. Add a second server or a \
             `backup` for the parameters to take effect, give the upstream an active `check` \
             so that a dead server is known without client requests, or shorten the timeouts; \
             otherwise remove the parameters so the file says what happens. vigil cannot tell \
             an explicit `max_fails=1 fail_timeout=10s` from nginx's defaults, so only \
             non-default values are reported.",
            addr = s.address
        ),
    ));
}

/// `keepalive-is-not-a-cap`: `keepalive N` read as a connection limit.
fn keepalive(up: &UpstreamConfig, out: &mut Vec<Positioned>) {
    let Some(k) = &up.keepalive else {
        return;
    };
    if up.servers.iter().any(|s| s.max_conns > 0) {
        return;
    }
    out.push(finding(
        KEEPALIVE_IS_NOT_A_CAP,
        Severity::Info,
        &k.origin,
        format!(
            "upstream {}: keepalive {} caches idle connections, it does not limit connections (no server has max_conns)",
            up.name, k.idle
        ),
        format!(
            "nginx's `keepalive {n}` is the number of idle connections to the upstream that \
             each worker keeps in its cache; the nginx docs add that it \"does not limit the \
             total number of connections to upstream servers that an nginx worker process can \
             open\". Under load nginx (and vigil) opens one connection per concurrent request, \
             and closes those beyond {n} once they are idle. If the intent was to protect the \
             backends from too many connections, set `max_conns=N` on the servers (vigil \
             counts it across the whole process; nginx counts it per worker unless the \
             upstream has a `zone`); if the intent was only connection reuse, this is fine.",
            n = k.idle
        ),
    ));
}

/// `default-down-long-interval`: peers that start down wait `interval × rise`.
fn default_down(cx: &Cx<'_>, up: &UpstreamConfig, out: &mut Vec<Positioned>) {
    let Some(c) = &up.check else {
        return;
    };
    if c.initial != InitialState::Down {
        return;
    }
    let wait = times(c.interval, c.rise.get());
    if wait < DEFAULT_DOWN_LIMIT {
        return;
    }
    let at = cx
        .upstream_directive(up, "check")
        .map_or_else(|| c.origin.clone(), |d| d.origin_of_param("interval"));
    out.push(finding(
        DEFAULT_DOWN_LONG_INTERVAL,
        Severity::Warning,
        &at,
        format!(
            "upstream {}: check starts peers down, so a new peer gets no traffic for up to rise {} × interval {} = {}",
            up.name,
            c.rise,
            t(c.interval),
            t(wait)
        ),
        format!(
            "tengine's `check` starts every peer down (default_down=true is its default) and \
             marks it up only after `rise` consecutive successful probes, one per interval: \
             here up to {wait}. Until then the peer gets no traffic. tengine probes every \
             peer from scratch after each start and reload, so when all the servers of the \
             upstream are new (first start, a reload that replaced them) every request is \
             answered 502 \"no live upstreams\" for that long. `vigil serve` closes the \
             window at its start (it probes every peer up to `rise` times back to back \
             before it accepts traffic, for at most the check's timeout), not for servers \
             a reload adds: those wait for the regular probes. Shorten the interval (for \
             example interval=2000 rise=2), or start peers up with `default_down=false` (or \
             vigil's `initial=first-result`, where the first probe alone decides) and let \
             failed probes take a dead peer out.",
            wait = t(wait)
        ),
    ));
}

/// `all-servers-down`: nothing left to pick.
fn all_down(cx: &Cx<'_>, up: &UpstreamConfig, out: &mut Vec<Positioned>) {
    if up.servers.is_empty() || up.servers.iter().any(|s| !s.down) {
        return;
    }
    let backups = up.servers.iter().filter(|s| s.backup).count();
    let what = if backups == 0 {
        "every server is marked down and there is no backup".to_string()
    } else {
        "every server, backups included, is marked down".to_string()
    };
    // The `down` of the first server.
    let at = cx
        .server_line(up, 0)
        .map_or_else(|| up.origin.clone(), |l| l.origin_of_word("down"));
    out.push(finding(
        ALL_SERVERS_DOWN,
        Severity::Error,
        &at,
        format!("upstream {}: {what}: every request gets 502", up.name),
        "nginx never picks a server marked `down`; when no server is left the request fails \
         at once with 502 \"no live upstreams\" (ngx_http_upstream_get_peer() skips every \
         peer->down; nginx 1.11.5 removed the old last-resort reset of failed peers, and \
         `down` servers were never part of it). Remove `down` from \
         at least one server, or add a `backup` server that is not down."
            .to_string(),
    ));
}
