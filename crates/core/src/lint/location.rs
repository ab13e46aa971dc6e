//! Traps of a location together with the upstream it proxies to:
//! timeouts against `fail_timeout`, `proxy_next_upstream` and its limits,
//! request buffering, upstream keepalive.

use std::time::Duration;

use super::{finding, t, times, Positioned, Severity};
use crate::config::{Config, HttpVersion, Location, UpstreamConfig};
use crate::outcome::{FailureClass, NextUpstream};

pub(super) const FAIL_TIMEOUT_VS_READ_TIMEOUT: &str = "fail-timeout-vs-read-timeout";
pub(super) const NEXT_UPSTREAM_4XX: &str = "next-upstream-4xx";
pub(super) const NEXT_UPSTREAM_NON_IDEMPOTENT: &str = "next-upstream-non-idempotent";
pub(super) const RETRIES_UNBOUNDED: &str = "retries-unbounded";
pub(super) const NO_BUFFERING_WITH_RETRIES: &str = "no-buffering-with-retries";
pub(super) const PROXY_HTTP_10_KEEPALIVE: &str = "proxy-http-10-keepalive";

/// `fail_timeout` must be at least this many times `proxy_read_timeout`.
const FAIL_TIMEOUT_FACTOR: u32 = 5;
/// Retries are reported as unbounded from this many peers on...
const UNBOUNDED_MIN_PEERS: usize = 3;
/// ...when one connect may take this long...
const UNBOUNDED_CONNECT: Duration = Duration::from_secs(5);
/// ...or one read may take this long.
const UNBOUNDED_READ: Duration = Duration::from_secs(20);

/// `fail-timeout-vs-read-timeout`, once per upstream: its servers against
/// the longest `proxy_read_timeout` of the locations that use it.
pub(super) fn lint_upstream(config: &Config, up: &UpstreamConfig, out: &mut Vec<Positioned>) {
    if up.is_single() {
        return;
    }
    let Some(loc) = config
        .servers
        .iter()
        .flat_map(|b| &b.locations)
        .filter(|l| uses(l, up))
        .fold(None::<&Location>, |worst, l| match worst {
            Some(w) if w.proxy.read_timeout >= l.proxy.read_timeout => Some(w),
            _ => Some(l),
        })
    else {
        return;
    };
    let read = loc.proxy.read_timeout;
    let floor = times(read, FAIL_TIMEOUT_FACTOR);
    // max_fails=0 never excludes, so its fail_timeout means nothing.
    let short: Vec<_> = up
        .servers
        .iter()
        .filter(|s| !s.down && s.max_fails != 0 && s.fail_timeout < floor)
        .collect();
    let Some(first) = short.first() else {
        return;
    };
    let fail = first.fail_timeout;
    let pct = busy_percent(read, fail);
    let more = match short.len() {
        1 => String::new(),
        2 => " (and 1 more server)".to_string(),
        n => format!(" (and {} more servers)", n - 1),
    };
    out.push(finding(
        FAIL_TIMEOUT_VS_READ_TIMEOUT,
        Severity::Warning,
        &first.origin,
        format!(
            "upstream {}: fail_timeout {} on {}{more} is under {FAIL_TIMEOUT_FACTOR} × proxy_read_timeout {} of location {}: a hung peer keeps getting requests ~{pct}% of the time",
            up.name,
            t(fail),
            first.address,
            t(read),
            loc.path
        ),
        format!(
            "fail_timeout is not a response timeout: it is both the window in which max_fails \
             failures are counted and how long a peer is then left out. nginx only learns that \
             a peer hangs when a request to it times out, after proxy_read_timeout ({read}); \
             until then the peer keeps its share of requests and each of them waits the full \
             {read}. The failure then takes the peer out for fail_timeout ({fail}) only, and \
             it comes back to hang again. By the field notes' measurement (seed 000: the hung \
             peer is picked during the first read_timeout and skipped during the following \
             fail_timeout, over and over), a hung peer keeps getting requests for \
             read_timeout / (read_timeout + fail_timeout) of the time, here ~{pct}%; the notes \
             conclude that exclusion only means something when fail_timeout is much longer \
             than proxy_read_timeout (their example: fail_timeout=300s with \
             proxy_read_timeout=2s). Raise fail_timeout to at least {floor} \
             ({FAIL_TIMEOUT_FACTOR} × proxy_read_timeout, at most ~17% of the time), or lower \
             proxy_read_timeout to what the backend really needs; an active `check` of \
             type=http with a short timeout finds a hung peer without waiting for client \
             requests.",
            read = t(read),
            fail = t(fail),
            floor = t(floor)
        ),
    ));
}

/// The per-location traps.
pub(super) fn lint(config: &Config, loc: &Location, out: &mut Vec<Positioned>) {
    let Some(up) = loc
        .proxy
        .pass
        .as_ref()
        .and_then(|p| config.upstream(&p.upstream))
    else {
        return;
    };
    let attempts = attempts(loc, up);
    if attempts > 1 {
        next_upstream_4xx(loc, up, attempts, out);
        non_idempotent(loc, up, out);
        no_buffering(loc, up, out);
    }
    unbounded(loc, up, out);
    http10_keepalive(loc, up, out);
}

/// `next-upstream-4xx`: `http_403`/`http_404` retried on every peer, never counted.
fn next_upstream_4xx(
    loc: &Location,
    up: &UpstreamConfig,
    attempts: usize,
    out: &mut Vec<Positioned>,
) {
    let nu = loc.proxy.next_upstream;
    let listed: Vec<&str> = [FailureClass::Http403, FailureClass::Http404]
        .into_iter()
        .filter(|c| nu.contains(*c))
        .map(FailureClass::as_str)
        .collect();
    if listed.is_empty() {
        return;
    }
    let listed = listed.join(" and ");
    out.push(finding(
        NEXT_UPSTREAM_4XX,
        Severity::Warning,
        &loc.origin,
        format!(
            "location {}: proxy_next_upstream lists {listed}: a request answered so is tried on up to {attempts} peers of upstream {} and never takes a peer out",
            loc.path, up.name
        ),
        format!(
            "With {listed} in proxy_next_upstream, nginx passes a request that got that \
             status to the next peer, up to proxy_next_upstream_tries (here {attempts} \
             attempts), and only the last answer reaches the client. The nginx docs add that \
             \"the cases of http_403 and http_404 are never considered unsuccessful \
             attempts\": a peer that really lost its content is never excluded, while every \
             request for a URL that exists nowhere costs {attempts} upstream requests. Field \
             notes 004 show a copied `proxy_next_upstream ... http_404` letting anyone \
             multiply the load by requesting a missing URI. Remove {listed} unless the peers \
             really serve different content; if it must stay, set proxy_next_upstream_tries 2."
        ),
    ));
}

/// `next-upstream-non-idempotent`: POST/LOCK/PATCH may run twice.
fn non_idempotent(loc: &Location, up: &UpstreamConfig, out: &mut Vec<Positioned>) {
    let nu = loc.proxy.next_upstream;
    if !nu.non_idempotent() || nu.classes().next().is_none() {
        return;
    }
    out.push(finding(
        NEXT_UPSTREAM_NON_IDEMPOTENT,
        Severity::Warning,
        &loc.origin,
        format!(
            "location {}: proxy_next_upstream non_idempotent lets POST, LOCK and PATCH requests go to a second peer of upstream {}",
            loc.path, up.name
        ),
        format!(
            "Since 1.9.13 nginx does not pass a request with a non-idempotent method (POST, \
             LOCK, PATCH) to the next server once the request was sent, because the first \
             server may already have acted on it; `non_idempotent` turns that safety off. \
             A failure listed here ({}) that happens after the backend committed the change \
             (a read timeout, a connection closed before the answer, a 5xx) then applies it a \
             second time (field notes 004: the client \
             sent one request and the backend created several orders). Remove \
             `non_idempotent` unless every such endpoint is idempotent (for example, it \
             deduplicates by an idempotency key); without it, a request whose connection was \
             refused is still retried, because it was never sent.",
            classes(nu)
        ),
    ));
}

/// `no-buffering-with-retries`: a streamed body cannot be sent again.
fn no_buffering(loc: &Location, up: &UpstreamConfig, out: &mut Vec<Positioned>) {
    let nu = loc.proxy.next_upstream;
    if loc.proxy.request_buffering || nu.classes().next().is_none() {
        return;
    }
    out.push(finding(
        NO_BUFFERING_WITH_RETRIES,
        Severity::Info,
        &loc.origin,
        format!(
            "location {}: proxy_request_buffering off: a request whose body is streamed to upstream {} is not retried",
            loc.path, up.name
        ),
        format!(
            "With proxy_request_buffering off a request body that is still arriving is \
             streamed to the upstream as it comes and no copy is kept, so it cannot be sent to \
             a second peer: nginx's ngx_http_upstream_next() gives up when the request was \
             sent and the body is unbuffered, and the client gets the 502 or 504 even though \
             proxy_next_upstream ({}) lists the failure (the nginx docs: \"the request cannot \
             be passed to the next server if nginx already started sending the request \
             body\"). Requests without a body, bodies that arrived whole with the headers, and \
             attempts whose connect failed before anything was sent are still retried. Buffering (the default) also \
             keeps slow uploads away from the backend (field notes 003). Keep \
             proxy_request_buffering on where failover matters, or accept that uploads fail \
             over only when the connect itself failed.",
            classes(nu)
        ),
    ));
}

/// `retries-unbounded`: no tries/timeout limit, many peers, long timeouts.
fn unbounded(loc: &Location, up: &UpstreamConfig, out: &mut Vec<Positioned>) {
    let p = &loc.proxy;
    if p.next_upstream_tries != 0
        || p.next_upstream_timeout.is_some()
        || !p.next_upstream.contains(FailureClass::Timeout)
    {
        return;
    }
    let peers = live_peers(up);
    if peers < UNBOUNDED_MIN_PEERS
        || (p.connect_timeout < UNBOUNDED_CONNECT && p.read_timeout < UNBOUNDED_READ)
    {
        return;
    }
    let n = u32::try_from(peers).unwrap_or(u32::MAX);
    let connect = times(p.connect_timeout, n);
    let read = times(p.read_timeout, n);
    out.push(finding(
        RETRIES_UNBOUNDED,
        Severity::Warning,
        &loc.origin,
        format!(
            "location {}: retries are unbounded: {peers} peers × proxy_connect_timeout {} = {} when upstream {} is unreachable, {peers} × proxy_read_timeout {} = {} when it hangs",
            loc.path,
            t(p.connect_timeout),
            t(connect),
            up.name,
            t(p.read_timeout),
            t(read)
        ),
        format!(
            "With neither proxy_next_upstream_tries nor proxy_next_upstream_timeout set, \
             nginx passes a request that timed out to every peer of the upstream in turn \
             (tries = the {peers} servers not marked down), and each attempt may use its full \
             timeout: a client waits {connect} before its 504 when the peers do not answer \
             the connect, and {read} when they accept and hang, while a slow request is also \
             run on every peer. Field notes 004: with proxy_connect_timeout 10 and n servers \
             an idempotent request hangs 10 × n seconds; their fix bounds 3 peers × 3s with \
             `proxy_next_upstream_timeout 6s` and `proxy_next_upstream_tries 3`. Set \
             proxy_next_upstream_tries (it counts the first attempt) and/or \
             proxy_next_upstream_timeout (checked before each new attempt, so a running \
             attempt is not cut short), and keep proxy_connect_timeout short.",
            connect = t(connect),
            read = t(read)
        ),
    ));
}

/// `proxy-http-10-keepalive`: nginx needs HTTP/1.1 to reuse connections.
fn http10_keepalive(loc: &Location, up: &UpstreamConfig, out: &mut Vec<Positioned>) {
    if up.keepalive.is_none() || loc.proxy.http_version != HttpVersion::Http10 {
        return;
    }
    out.push(finding(
        PROXY_HTTP_10_KEEPALIVE,
        Severity::Info,
        &loc.origin,
        format!(
            "location {}: proxy_http_version 1.0, so nginx would not reuse the keepalive connections of upstream {}; vigil speaks HTTP/1.1 and does",
            loc.path, up.name
        ),
        "nginx's upstream keepalive needs HTTP/1.1 towards the upstream: its docs say that \
         \"the proxy_http_version directive should be set to 1.1 and the Connection header \
         field should be cleared\". With the default 1.0 nginx opens a new connection for \
         every request and the keepalive cache stays empty. vigil speaks HTTP/1.1 to an \
         upstream that has `keepalive` whatever the version says, so the backends see far \
         fewer new connections under vigil than under nginx with the same file. Set \
         `proxy_http_version 1.1;` and `proxy_set_header Connection \"\";` so that both \
         behave the same."
            .to_string(),
    ));
}

/// The listed failure classes, space separated (without `non_idempotent`).
fn classes(nu: NextUpstream) -> String {
    nu.classes()
        .map(FailureClass::as_str)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Whether `loc` proxies to `up`.
fn uses(loc: &Location, up: &UpstreamConfig) -> bool {
    loc.proxy
        .pass
        .as_ref()
        .is_some_and(|p| p.upstream == up.name)
}

/// Servers nginx counts in `tries`: primaries and backups not marked down.
fn live_peers(up: &UpstreamConfig) -> usize {
    up.servers.iter().filter(|s| !s.down).count()
}

/// The most attempts one request can make: 1 for a single server (never
/// retried), else the live peers capped by `proxy_next_upstream_tries`.
fn attempts(loc: &Location, up: &UpstreamConfig) -> usize {
    if up.is_single() {
        return 1;
    }
    let peers = live_peers(up);
    match usize::try_from(loc.proxy.next_upstream_tries) {
        Ok(0) | Err(_) => peers,
        Ok(tries) => tries.min(peers),
    }
}

/// `read / (read + fail)` in whole percent.
fn busy_percent(read: Duration, fail: Duration) -> u128 {
    let r = read.as_millis();
    let total = r.saturating_add(fail.as_millis());
    if total == 0 {
        return 0;
    }
    (r.saturating_mul(100) + total / 2) / total
}
