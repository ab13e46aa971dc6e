//! Traps of a location together with the upstream it proxies to:
//! timeouts against `fail_timeout`, `proxy_next_upstream` and its limits,
//! request buffering, upstream keepalive.

use std::time::Duration;

use super::{finding, t, times, Cx, Loc, Positioned, Severity};
use vigil_core::config::{CheckKind, HttpVersion, Location, UpstreamConfig};
use vigil_core::outcome::{FailureClass, NextUpstream};

pub(super) const FAIL_TIMEOUT_VS_READ_TIMEOUT: &str = "fail-timeout-vs-read-timeout";
pub(super) const NEXT_UPSTREAM_4XX: &str = "next-upstream-4xx";
pub(super) const NEXT_UPSTREAM_NON_IDEMPOTENT: &str = "next-upstream-non-idempotent";
pub(super) const RETRIES_UNBOUNDED: &str = "retries-unbounded";
pub(super) const NO_BUFFERING_WITH_RETRIES: &str = "no-buffering-with-retries";
pub(super) const PROXY_HTTP_10_KEEPALIVE: &str = "proxy-http-10-keepalive";

/// From this `proxy_read_timeout / fail_timeout` on, a hung peer holds
/// this many client requests at any moment: a warning (without an active
/// check that finds a hang). Below it, info. See docs/lint.md.
const WARN_RATIO: u32 = 30;
/// Retries are reported as unbounded from this many peers on...
const UNBOUNDED_MIN_PEERS: usize = 3;
/// ...when one connect may take this long...
const UNBOUNDED_CONNECT: Duration = Duration::from_secs(5);
/// ...or one read may take this long.
const UNBOUNDED_READ: Duration = Duration::from_secs(20);

/// `fail-timeout-vs-read-timeout`, once per upstream: its servers against
/// the longest `proxy_read_timeout` of the locations that use it.
///
/// nginx (`ngx_http_upstream_get_peer`) skips a peer with `fails >=
/// max_fails` while `now - checked <= fail_timeout`, and sets `checked`
/// when it picks a peer whose `fail_timeout` has passed; a failure
/// (`ngx_http_upstream_free_round_robin_peer`) sets `checked` again. So a
/// hung peer, once out, is tried with one client request per
/// `fail_timeout`, and each of those waits `proxy_read_timeout`: it holds
/// `read / fail` requests at any moment.
pub(super) fn lint_upstream(cx: &Cx<'_>, up: &UpstreamConfig, out: &mut Vec<Positioned>) {
    if up.is_single() {
        return;
    }
    let Some(l) = cx
        .locations()
        .filter(|l| uses(l.loc, up))
        .fold(None::<Loc<'_>>, |worst, l| match worst {
            Some(w) if w.loc.proxy.read_timeout >= l.loc.proxy.read_timeout => Some(w),
            _ => Some(l),
        })
    else {
        return;
    };
    let loc = l.loc;
    let read = loc.proxy.read_timeout;
    // max_fails=0 never excludes, so its fail_timeout means nothing.
    let short: Vec<(usize, _)> = up
        .servers
        .iter()
        .enumerate()
        .filter(|(_, s)| !s.down && s.max_fails != 0 && s.fail_timeout < read)
        .collect();
    let Some(&(index, first)) = short.first() else {
        return;
    };
    let fail = first.fail_timeout;
    let ratio = ratio(read, fail);
    let bites = ratio >= u128::from(WARN_RATIO);
    let severity = match up.check.as_ref().map(|c| c.kind) {
        // An HTTP check with its own short timeout finds a hung peer.
        Some(CheckKind::Http | CheckKind::Https) => return,
        // A TCP check finds a dead peer, not one that accepts and hangs.
        Some(CheckKind::Tcp) if bites => Severity::Info,
        Some(CheckKind::Tcp) => return,
        None if bites => Severity::Warning,
        None => Severity::Info,
    };
    // The cause: fail_timeout= when written, else proxy_read_timeout when
    // written, else the server line (both at nginx's defaults).
    let line = cx.server_line(up, index);
    let at = match line.and_then(|p| p.param("fail_timeout")) {
        Some(a) => crate::nginx::origin(&a.span),
        None => match cx.directive(&l, "proxy_read_timeout") {
            Some(d) => d.origin(),
            None => line.map_or_else(|| first.origin.clone(), |p| p.origin()),
        },
    };
    let more = match short.len() {
        1 => String::new(),
        2 => " (and 1 more server)".to_string(),
        n => format!(" (and {} more servers)", n - 1),
    };
    let retried = if loc.proxy.next_upstream.contains(FailureClass::Timeout) {
        "then it is passed to the next server (proxy_next_upstream lists timeout)"
    } else {
        "then the client gets 504 (proxy_next_upstream does not list timeout)"
    };
    let checked = match up.check.as_ref().map(|c| c.kind) {
        Some(CheckKind::Tcp) => {
            " The upstream's `check` is type=tcp: it finds a peer that refuses connections, \
             not one that accepts them and never answers; type=http with a short timeout \
             finds both."
        }
        _ => "",
    };
    out.push(finding(
        FAIL_TIMEOUT_VS_READ_TIMEOUT,
        severity,
        &at,
        format!(
            "upstream {}: fail_timeout {} on {}{more} is {}× shorter than proxy_read_timeout {} of location {}: a hung peer is retried with a client request every {}, each waiting {}",
            up.name,
            t(fail),
            first.address,
            ratio,
            t(read),
            loc.path,
            t(fail),
            t(read)
        ),
        format!(
            "fail_timeout is not a response timeout: it is the window in which max_fails \
             failures are counted and how long a peer is then left out. nginx learns that a \
             peer hangs (accepts the connection, never answers) only when a request to it \
             times out after proxy_read_timeout ({read}); during that first {read} the peer \
             keeps its full share of requests. Once it is out, ngx_http_upstream_get_peer() \
             (src/http/ngx_http_upstream_round_robin.c) skips it while now - checked <= \
             fail_timeout and, when fail_timeout has passed, lets one request through and sets \
             checked = now; the failure of that request \
             (ngx_http_upstream_free_round_robin_peer()) sets checked again. So with \
             fail_timeout ({fail}) shorter than proxy_read_timeout, a new client request goes \
             to the hung peer every {fail} and waits {read}, {retried}: about {ratio} client \
             requests are held by the peer at any moment, for as long as it hangs. From \
             {WARN_RATIO}× on (minutes of proxy_read_timeout against seconds of fail_timeout) \
             this is a warning; nginx's defaults (10s and 60s, 6×) are reported as info.{checked} \
             Give the upstream an active `check` of type=http with a short timeout (it takes a \
             hung peer out without client requests; the nginx docs, \
             https://nginx.org/en/docs/http/ngx_http_upstream_module.html#server, describe \
             the passive rule this replaces), lower proxy_read_timeout to what the backend \
             really needs, or set fail_timeout to at least {read} so that one request at a \
             time tests the peer.",
            read = t(read),
            fail = t(fail),
        ),
    ));
}

/// The per-location traps.
pub(super) fn lint(cx: &Cx<'_>, l: &Loc<'_>, out: &mut Vec<Positioned>) {
    let loc = l.loc;
    let Some(up) = loc
        .proxy
        .pass
        .as_ref()
        .and_then(|p| cx.config.upstream(&p.upstream))
    else {
        return;
    };
    let attempts = attempts(loc, up);
    if attempts > 1 {
        next_upstream_4xx(cx, l, up, attempts, out);
        non_idempotent(cx, l, up, out);
        no_buffering(cx, l, up, out);
    }
    unbounded(cx, l, up, out);
    http10_keepalive(cx, l, up, out);
}

/// `next-upstream-4xx`: `http_403`/`http_404` retried on every peer, never counted.
fn next_upstream_4xx(
    cx: &Cx<'_>,
    l: &Loc<'_>,
    up: &UpstreamConfig,
    attempts: usize,
    out: &mut Vec<Positioned>,
) {
    let loc = l.loc;
    let nu = loc.proxy.next_upstream;
    let listed: Vec<&str> = [FailureClass::Http403, FailureClass::Http404]
        .into_iter()
        .filter(|c| nu.contains(*c))
        .map(FailureClass::as_str)
        .collect();
    if listed.is_empty() {
        return;
    }
    let at = cx.at_word(l, "proxy_next_upstream", listed[0]);
    let listed = listed.join(" and ");
    out.push(finding(
        NEXT_UPSTREAM_4XX,
        Severity::Warning,
        &at,
        format!(
            "location {}: proxy_next_upstream lists {listed}: a request answered so is tried on up to {attempts} peers of upstream {} and never takes a peer out",
            loc.path, up.name
        ),
        format!(
            "With {listed} in proxy_next_upstream, nginx passes a request that got that \
             status to the next peer, up to proxy_next_upstream_tries (here {attempts} \
             attempts), and only the last answer reaches the client. The nginx docs add that \
             \"the cases of http_403 and http_404 are never considered unsuccessful \
             attempts\" (https://nginx.org/en/docs/http/ngx_http_proxy_module.html#proxy_next_upstream): \
             a peer that really lost its content is never excluded, while every request for a \
             URL that exists nowhere costs {attempts} upstream requests, so anyone can \
             multiply the load on the backends by requesting missing URIs. Remove {listed} \
             unless the peers really serve different content; if it must stay, set \
             proxy_next_upstream_tries 2."
        ),
    ));
}

/// `next-upstream-non-idempotent`: POST/LOCK/PATCH may run twice.
fn non_idempotent(cx: &Cx<'_>, l: &Loc<'_>, up: &UpstreamConfig, out: &mut Vec<Positioned>) {
    let loc = l.loc;
    let nu = loc.proxy.next_upstream;
    if !nu.non_idempotent() || nu.classes().next().is_none() {
        return;
    }
    out.push(finding(
        NEXT_UPSTREAM_NON_IDEMPOTENT,
        Severity::Warning,
        &cx.at_word(l, "proxy_next_upstream", "non_idempotent"),
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
             second time: the client sent one request and the backend acts on it several \
             times (the nginx docs, \
             https://nginx.org/en/docs/http/ngx_http_proxy_module.html#proxy_next_upstream, \
             call such requests \"unsafe\"). Remove \
             `non_idempotent` unless every such endpoint is idempotent (for example, it \
             deduplicates by an idempotency key); without it, a request whose connection was \
             refused is still retried, because it was never sent.",
            classes(nu)
        ),
    ));
}

/// `no-buffering-with-retries`: a streamed body cannot be sent again.
fn no_buffering(cx: &Cx<'_>, l: &Loc<'_>, up: &UpstreamConfig, out: &mut Vec<Positioned>) {
    let loc = l.loc;
    let nu = loc.proxy.next_upstream;
    if loc.proxy.request_buffering || nu.classes().next().is_none() {
        return;
    }
    out.push(finding(
        NO_BUFFERING_WITH_RETRIES,
        Severity::Info,
        &cx.at_directive(l, "proxy_request_buffering"),
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
             attempts whose connect failed before anything was sent are still retried. \
             Buffering (the default) also keeps slow uploads away from the backend. Keep \
             proxy_request_buffering on where failover matters, or accept that uploads fail \
             over only when the connect itself failed.",
            classes(nu)
        ),
    ));
}

/// `retries-unbounded`: no tries/timeout limit, many peers, long timeouts.
fn unbounded(cx: &Cx<'_>, l: &Loc<'_>, up: &UpstreamConfig, out: &mut Vec<Positioned>) {
    let loc = l.loc;
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
    // The cause is what is missing: point at `timeout` of a written
    // proxy_next_upstream, else at the proxy_pass.
    let at = match cx.directive(l, "proxy_next_upstream") {
        Some(d) => d.origin_of_word("timeout"),
        None => cx.at_directive(l, "proxy_pass"),
    };
    out.push(finding(
        RETRIES_UNBOUNDED,
        Severity::Warning,
        &at,
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
             run on every peer (ngx_http_upstream_next() in src/http/ngx_http_upstream.c \
             moves on while tries and proxy_next_upstream_timeout allow; both are unlimited \
             by default: https://nginx.org/en/docs/http/ngx_http_proxy_module.html#proxy_next_upstream_tries). \
             For example, 3 peers × 3s are bounded with `proxy_next_upstream_timeout 6s` and \
             `proxy_next_upstream_tries 3`. Set \
             proxy_next_upstream_tries (it counts the first attempt) and/or \
             proxy_next_upstream_timeout (checked before each new attempt, so a running \
             attempt is not cut short), and keep proxy_connect_timeout short.",
            connect = t(connect),
            read = t(read)
        ),
    ));
}

/// `proxy-http-10-keepalive`: nginx needs HTTP/1.1 to reuse connections.
fn http10_keepalive(cx: &Cx<'_>, l: &Loc<'_>, up: &UpstreamConfig, out: &mut Vec<Positioned>) {
    let loc = l.loc;
    if up.keepalive.is_none() || loc.proxy.http_version != HttpVersion::Http10 {
        return;
    }
    // An explicit `proxy_http_version 1.0`, else the proxy_pass (the default).
    let at = match cx.directive(l, "proxy_http_version") {
        Some(d) => d.origin(),
        None => cx.at_directive(l, "proxy_pass"),
    };
    out.push(finding(
        PROXY_HTTP_10_KEEPALIVE,
        Severity::Info,
        &at,
        format!(
            "location {}: proxy_http_version 1.0, so nginx would not reuse the keepalive connections of upstream {}; vigil speaks HTTP/1.1 and does",
            loc.path, up.name
        ),
        "nginx's upstream keepalive needs HTTP/1.1 towards the upstream: its docs say that \
         \"the proxy_http_version directive should be set to 1.1 and the Connection header \
         field should be cleared\" (https://nginx.org/en/docs/http/ngx_http_upstream_module.html#keepalive). With the default 1.0 nginx opens a new connection for \
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

/// `read / fail`, rounded down (a zero fail_timeout counts as 1 ms).
fn ratio(read: Duration, fail: Duration) -> u128 {
    read.as_millis() / fail.as_millis().max(1)
}

pub(super) const INHERITED_HEADERS_DROPPED: &str = "inherited-headers-dropped";

/// `inherited-headers-dropped`: a level (server or location) with an
/// `add_header` or `proxy_set_header` of its own inherits none of the
/// outer levels' (nginx merges these arrays only into a level that has
/// none), so the headers written above silently stop there.
pub(super) fn lint_shadowed(sources: &crate::nginx::Sources, out: &mut Vec<Positioned>) {
    for s in sources.shadowed() {
        let name = &s.by.name;
        // A field the block sets again itself is not lost: the names of
        // its own directives, where the block is a location.
        let own: Vec<String> = sources
            .locations()
            .map(|(_, _, p)| p.all(name))
            .find(|all| all.iter().any(|d| d.span == s.by.span))
            .map(|all| {
                all.iter()
                    .filter_map(|d| d.args.first())
                    .map(|a| a.value.to_ascii_lowercase())
                    .collect()
            })
            .unwrap_or_default();
        let lost: Vec<&crate::nginx::Placed> = s
            .dropped
            .iter()
            .filter(|d| {
                d.args
                    .first()
                    .is_none_or(|a| !own.contains(&a.value.to_ascii_lowercase()))
            })
            .collect();
        if lost.is_empty() {
            continue;
        }
        let dropped: Vec<String> = lost
            .iter()
            .map(|d| {
                let field = d.args.first().map_or("", |a| a.value.as_str());
                format!("{field} ({})", d.origin())
            })
            .collect();
        out.push(finding(
            INHERITED_HEADERS_DROPPED,
            Severity::Warning,
            &s.by.origin(),
            format!(
                "this \"{name}\" drops {} \"{name}\" inherited from the outer level: {}",
                lost.len(),
                dropped.join(", ")
            ),
            format!(
                "nginx inherits \"{name}\" directives only into a block that has none of its own: \
                 the first \"{name}\" here replaces every one written in the enclosing server or http \
                 block, so those headers are no longer {} for requests handled here. Repeat them \
                 in this block (an `include` of a shared snippet in each block keeps them in one \
                 place), or move this one out."
                ,
                if name == "add_header" { "added to responses" } else { "sent to the upstream" }
            ),
        ));
    }
}
