//! The dashboard's HTML, rendered on the server: the page (`GET /`) and
//! the upstream tables alone (`GET /dashboard/upstreams`, which the page's
//! script fetches every second and swaps in). The tables read the same
//! without JavaScript; the script adds the latency charts, the live event
//! log and the buttons.

use vigil_core::api::{ActiveView, EventView, NginxSyncView, PeerView, UpstreamView};
use vigil_core::upstream::PeerState;

use super::html::{clock_time, esc, micros, put};
use super::{Page, UpstreamPage, ENDPOINTS};

/// Events the page is rendered with (the script keeps up to 200).
pub(crate) const PAGE_EVENTS: usize = 50;

/// The whole page.
pub(crate) fn page(p: &Page) -> String {
    let mut o = String::with_capacity(16 * 1024);
    put(
        &mut o,
        format_args!(
            "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
             <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
             <meta name=\"referrer\" content=\"no-referrer\">\n\
             <title>vigil dashboard</title>\n\
             <link rel=\"stylesheet\" href=\"/dashboard.css\">\n\
             <script src=\"/dashboard.js\" defer></script>\n</head>\n\
             <body data-writes=\"{}\">\n<header>\n<h1>vigil</h1>\n\
             <p id=\"live\" class=\"static\">Static page: JavaScript is off or has not run; reload to refresh.</p>\n\
             <nav><a href=\"/status\">tengine status</a> · <a href=\"/api/status\">/api/status</a> · \
             <a href=\"/api/events\">/api/events</a> · <a href=\"/metrics\">/metrics</a></nav>\n</header>\n",
            if p.writes_enabled {
                "enabled"
            } else {
                "disabled"
            }
        ),
    );
    auth(&mut o, p.writes_enabled);
    o.push_str("<main id=\"upstreams\">\n");
    upstreams_into(&mut o, p);
    o.push_str("</main>\n");
    events_into(&mut o, p);
    o.push_str("<footer>\n<h2>Endpoints</h2>\n");
    endpoints_into(&mut o);
    o.push_str("</footer>\n</body>\n</html>\n");
    o
}

/// The upstream tables alone.
pub(crate) fn upstreams(p: &Page) -> String {
    let mut o = String::with_capacity(8 * 1024);
    upstreams_into(&mut o, p);
    o
}

/// The endpoint list (`<dl>`), also the whole of `GET /` with the dashboard off.
pub(crate) fn endpoints_into(o: &mut String) {
    o.push_str("<dl class=\"endpoints\">\n");
    for (route, what) in ENDPOINTS {
        put(
            o,
            format_args!(
                "<dt><code>{}</code></dt><dd>{}</dd>\n",
                esc(route),
                esc(what)
            ),
        );
    }
    o.push_str("</dl>\n");
}

fn auth(o: &mut String, writes_enabled: bool) {
    o.push_str("<section id=\"auth\" aria-labelledby=\"auth-h\">\n<h2 id=\"auth-h\">Operator actions</h2>\n");
    if writes_enabled {
        o.push_str(
            "<p id=\"auth-state\">Drain, up and down need JavaScript and the admin token.</p>\n\
             <label for=\"token\">Admin token</label> \
             <input id=\"token\" type=\"password\" autocomplete=\"off\" spellcheck=\"false\" size=\"24\">\n\
             <button type=\"button\" id=\"token-use\">Use token</button>\n\
             <button type=\"button\" id=\"token-forget\">Forget</button>\n",
        );
    } else {
        o.push_str(
            "<p id=\"auth-state\">Drain, up and down are disabled: this server has no admin token \
             configured (<code>admin.token</code>, <code>--admin-token</code> or <code>VIGIL_ADMIN_TOKEN</code>).</p>\n",
        );
    }
    o.push_str("<p id=\"action-result\" role=\"status\"></p>\n</section>\n");
}

fn upstreams_into(o: &mut String, p: &Page) {
    put(
        o,
        format_args!(
            "<p class=\"taken\" data-generation=\"{}\" data-now=\"{}\">Configuration generation {} · state at {}</p>\n",
            p.generation,
            p.now_unix_ms,
            p.generation,
            clock_time(p.now_unix_ms)
        ),
    );
    if let Some(n) = &p.nginx {
        nginx_into(o, n);
    }
    if p.upstreams.is_empty() {
        o.push_str("<p class=\"empty\">No upstreams are configured.</p>\n");
    }
    let check_mode = p.nginx.is_some();
    for u in &p.upstreams {
        upstream_into(o, u, p.writes_enabled, check_mode, p.now_unix_ms);
    }
}

fn nginx_into(o: &mut String, n: &NginxSyncView) {
    let state = if n.reload_failed {
        "the last reload failed: nginx runs older files"
    } else if n.render_rejected {
        "the last render was rejected by the test command"
    } else if n.reload_pending {
        "a reload is owed"
    } else {
        "nginx runs what vigil rendered"
    };
    put(
        o,
        format_args!(
            "<p class=\"nginx{}\">nginx: {} · {} verified reload(s), {} failed, {} render(s) rejected{}</p>\n",
            if n.reload_failed || n.render_rejected {
                " bad"
            } else {
                ""
            },
            state,
            n.reloads,
            n.reload_failures,
            n.renders_rejected,
            n.last_reload_unix_ms
                .map(|t| format!(" · last reload at {}", clock_time(t)))
                .unwrap_or_default()
        ),
    );
}

fn upstream_into(
    o: &mut String,
    u: &UpstreamPage,
    writes: bool,
    check_mode: bool,
    now_unix_ms: u64,
) {
    let v = &u.view;
    put(
        o,
        format_args!(
            "<section class=\"upstream\" data-upstream=\"{}\">\n<h2>{}</h2>\n<p class=\"meta\">{}",
            esc(&v.name),
            esc(&v.name),
            esc(&v.balancer)
        ),
    );
    if v.single {
        o.push_str(" · single server (nginx never excludes it)");
    }
    match &v.check {
        Some(c) => put(
            o,
            format_args!(
                " · {} check every {} ms, rise {}, fall {}, timeout {} ms",
                esc(&c.kind),
                c.interval_ms,
                c.rise,
                c.fall,
                c.timeout_ms
            ),
        ),
        None => o.push_str(" · no active check"),
    }
    if let Some(h) = &v.rules.header_time {
        let q = |x: Option<u64>| x.map_or_else(|| "too few samples".into(), micros);
        put(
            o,
            format_args!(
                " · time-to-header p50 {}, p99 {}",
                esc(&q(h.p50_us)),
                esc(&q(h.p99_us))
            ),
        );
    }
    o.push_str("</p>\n");
    if !u.rules.is_empty() {
        o.push_str("<ul class=\"rules\">\n");
        for r in &u.rules {
            put(o, format_args!("<li>{}</li>\n", esc(r)));
        }
        o.push_str("</ul>\n");
    }
    o.push_str(
        "<table class=\"peers\">\n<thead><tr><th scope=\"col\">peer</th><th scope=\"col\">state</th>\
         <th scope=\"col\">passive</th><th scope=\"col\">active</th><th scope=\"col\">admin</th>\
         <th scope=\"col\">weight now / set</th><th scope=\"col\">conns</th><th scope=\"col\">recent latency</th>\
         <th scope=\"col\">explain</th><th scope=\"col\">actions</th></tr></thead>\n<tbody>\n",
    );
    for (i, peer) in v.peers.iter().enumerate() {
        let sentences = u.sentences.get(i).map(Vec::as_slice).unwrap_or(&[]);
        peer_into(o, v, peer, sentences, writes, check_mode, now_unix_ms);
    }
    o.push_str("</tbody>\n</table>\n</section>\n");
}

fn badge(state: PeerState) -> &'static str {
    match state {
        PeerState::Eligible => "ok",
        PeerState::Draining | PeerState::AdminDown | PeerState::Down => "admin",
        PeerState::Full | PeerState::Probation | PeerState::AwaitingProbe => "warn",
        PeerState::ProbeDown
        | PeerState::Excluded
        | PeerState::Slow
        | PeerState::Stuck
        | PeerState::Unknown => "bad",
    }
}

fn peer_into(
    o: &mut String,
    up: &UpstreamView,
    p: &PeerView,
    sentences: &[String],
    writes: bool,
    check_mode: bool,
    now_unix_ms: u64,
) {
    let (latency_us, latency_kind, latency_text) = latency(p);
    // When the figure was taken: a probe's time is one sample per probe
    // however often the page polls; a windowed median is one per poll.
    let latency_at = match latency_kind {
        "probe" => p
            .active
            .as_ref()
            .and_then(|a| a.last_probe.as_ref())
            .map_or(0, |pr| pr.at_unix_ms),
        _ => now_unix_ms,
    };
    put(
        o,
        format_args!(
            "<tr class=\"peer\" data-peer=\"{}\" data-state=\"{}\" data-admin=\"{}\" data-latency-us=\"{}\" data-latency-kind=\"{}\" data-latency-at=\"{}\">\n",
            esc(&p.address),
            esc(p.state.as_str()),
            esc(&p.admin),
            latency_us.map(|u| u.to_string()).unwrap_or_default(),
            latency_kind,
            latency_at
        ),
    );
    put(
        o,
        format_args!(
            "<th scope=\"row\"><code>{}</code>{}</th>\n",
            esc(&p.address),
            if p.backup {
                " <span class=\"tag\">backup</span>"
            } else {
                ""
            }
        ),
    );
    // State: eligible, or every rule in force.
    put(
        o,
        format_args!(
            "<td class=\"state\"><span class=\"badge {}\">{}</span>",
            badge(p.state),
            esc(p.state.as_str())
        ),
    );
    if !p.reasons.is_empty() || !p.waived.is_empty() {
        o.push_str("<ul class=\"reasons\">");
        for r in &p.reasons {
            put(
                o,
                format_args!(
                    "<li>{}: {}{}</li>",
                    esc(r.rule.as_str()),
                    esc(&r.detail),
                    r.until_unix_ms
                        .map(|t| format!(", until {}", clock_time(t)))
                        .unwrap_or_default()
                ),
            );
        }
        for r in &p.waived {
            put(
                o,
                format_args!(
                    "<li class=\"waived\">waived by max_ejected: {}: {}</li>",
                    esc(r.rule.as_str()),
                    esc(&r.detail)
                ),
            );
        }
        o.push_str("</ul>");
    }
    o.push_str("</td>\n");
    // Passive: nginx's max_fails accounting (unseen in check mode).
    if check_mode {
        o.push_str("<td class=\"passive na\" title=\"vigil check sees no traffic: nginx routes it\">not seen by vigil check</td>\n");
    } else if p.max_fails == 0 {
        put(
            o,
            format_args!(
                "<td class=\"passive\">{} failure(s); never excluded (max_fails=0)</td>\n",
                p.fails
            ),
        );
    } else {
        put(
            o,
            format_args!(
                "<td class=\"passive\">{} failure(s), limit {} in {} s{}{}</td>\n",
                p.fails,
                p.max_fails,
                p.fail_timeout_ms as f64 / 1000.0,
                if p.penalty_nth > 0 {
                    format!("; exclusion #{} in a row", p.penalty_nth)
                } else {
                    String::new()
                },
                p.probation
                    .as_ref()
                    .map(|b| format!("; probation {}/{}", b.successes, b.needed))
                    .unwrap_or_default()
            ),
        );
    }
    // Active: the check's view.
    o.push_str("<td class=\"active\">");
    match &p.active {
        None => o.push_str("no check"),
        Some(a) => active_into(o, up, a),
    }
    o.push_str("</td>\n");
    put(
        o,
        format_args!("<td class=\"admin\">{}</td>\n", esc(&p.admin)),
    );
    // Weight and the slow-start ramp.
    put(
        o,
        format_args!("<td class=\"weight\">{} / {}", p.weight_now, p.weight),
    );
    match (p.ramp_until_unix_ms, p.slow_start_ms) {
        (Some(t), _) => put(
            o,
            format_args!(
                " <span class=\"ramp\">slow start until {}</span>",
                clock_time(t)
            ),
        ),
        (None, Some(ms)) => put(
            o,
            format_args!(
                " <span class=\"note\">slow_start {} s</span>",
                ms as f64 / 1000.0
            ),
        ),
        (None, None) => {}
    }
    o.push_str("</td>\n");
    if check_mode {
        o.push_str("<td class=\"conns na\" title=\"vigil check sees no traffic: nginx routes it\">—</td>\n");
    } else if p.max_conns > 0 {
        put(
            o,
            format_args!("<td class=\"conns\">{} / {}</td>\n", p.conns, p.max_conns),
        );
    } else {
        put(o, format_args!("<td class=\"conns\">{}</td>\n", p.conns));
    }
    put(
        o,
        format_args!(
            "<td class=\"latency\"><span class=\"figure\">{}</span> \
             <svg class=\"spark\" viewBox=\"0 0 120 24\" width=\"120\" height=\"24\" role=\"img\" aria-label=\"recent latency of {}\"></svg></td>\n",
            esc(&latency_text),
            esc(&p.address)
        ),
    );
    o.push_str("<td class=\"why\">");
    for s in sentences {
        put(o, format_args!("<p>{}</p>", esc(s)));
    }
    o.push_str("</td>\n<td class=\"actions\">");
    for action in ["drain", "up", "down"] {
        put(
            o,
            format_args!(
                "<button type=\"button\" class=\"act\" data-action=\"{action}\" data-upstream=\"{}\" data-peer=\"{}\" disabled{}>{action}</button>",
                esc(&up.name),
                esc(&p.address),
                if writes {
                    " title=\"needs JavaScript and the admin token\""
                } else {
                    " title=\"no admin token is configured on this server\""
                }
            ),
        );
    }
    o.push_str("</td>\n</tr>\n");
}

fn active_into(o: &mut String, up: &UpstreamView, a: &ActiveView) {
    let (rise, fall) = up.check.as_ref().map_or((0, 0), |c| (c.rise, c.fall));
    put(
        o,
        format_args!(
            "<span class=\"badge {}\">{}</span>",
            if a.state == "up" { "ok" } else { "bad" },
            esc(&a.state)
        ),
    );
    if !a.decided {
        o.push_str(" (no probe yet)");
    } else if a.state == "up" && a.fall_streak > 0 {
        put(o, format_args!(" (failed {}/{})", a.fall_streak, fall));
    } else if a.state != "up" && a.rise_streak > 0 {
        put(o, format_args!(" (passed {}/{})", a.rise_streak, rise));
    }
    if let Some(pr) = &a.last_probe {
        put(
            o,
            format_args!(
                "<span class=\"probe {}\">{}{}: {} in {:.1} ms at {}</span>",
                if pr.ok { "ok" } else { "bad" },
                if pr.ok { "passed" } else { "failed" },
                pr.phase
                    .as_ref()
                    .map(|ph| format!(" ({})", esc(ph)))
                    .unwrap_or_default(),
                esc(&pr.detail),
                pr.latency_ms,
                clock_time(pr.at_unix_ms)
            ),
        );
    }
}

/// The peer's latency figure: core's median time-to-header (`eject_slow`)
/// where it measures one, else the last probe's time.
fn latency(p: &PeerView) -> (Option<u64>, &'static str, String) {
    if let Some(us) = p.header_median_us {
        let n = p.header_requests.unwrap_or(0);
        return (
            Some(us),
            "header",
            format!("time-to-header median {} ({n} headers)", micros(us)),
        );
    }
    if let Some(pr) = p.active.as_ref().and_then(|a| a.last_probe.as_ref()) {
        let us = (pr.latency_ms * 1000.0).round().max(0.0) as u64;
        return (Some(us), "probe", format!("probe {}", micros(us)));
    }
    (
        None,
        "none",
        "no figure (time-to-header is measured under eject_slow; probe time needs a check)".into(),
    )
}

fn events_into(o: &mut String, p: &Page) {
    put(
        o,
        format_args!(
            "<section id=\"log\" aria-labelledby=\"log-h\">\n<h2 id=\"log-h\">Events</h2>\n\
             <ol id=\"events\" reversed data-next=\"{}\">\n",
            p.next_seq
        ),
    );
    if p.events.is_empty() {
        o.push_str("<li class=\"empty\">No events yet.</li>\n");
    }
    for e in p.events.iter().rev() {
        event_into(o, e);
    }
    o.push_str("</ol>\n</section>\n");
}

fn event_into(o: &mut String, e: &EventView) {
    put(
        o,
        format_args!(
            "<li data-seq=\"{}\" data-kind=\"{}\"><time>{}</time> <span class=\"kind\">{}</span> <code>{}</code> <code>{}</code> {}</li>\n",
            e.seq,
            esc(&e.kind),
            clock_time(e.at_unix_ms),
            esc(&e.kind),
            esc(&e.upstream),
            esc(&e.peer),
            esc(&e.text)
        ),
    );
}
