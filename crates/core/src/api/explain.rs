//! `vigil explain`: why a peer does or does not get traffic, in sentences,
//! one per rule in force, with times.

use super::{EventView, PeerView, UpstreamView};
use crate::peer::AdminState;
use crate::upstream::Rule;

/// Sentences about `peer` of `up`, newest events last in `events`.
pub fn explain(up: &UpstreamView, peer: &PeerView, events: &[EventView]) -> Vec<String> {
    let mut out = Vec::new();
    let addr = &peer.address;
    let last_exclusion = events
        .iter()
        .rev()
        .find(|e| e.upstream == up.name && &e.peer == addr && e.kind == "excluded");
    for r in &peer.reasons {
        let s = match r.rule {
            Rule::Down => format!("{addr} gets no traffic: it is marked `down` in the configuration."),
            Rule::Admin if r.detail == AdminState::Drain.as_str() => format!(
                "{addr} gets no new requests: an operator set it to drain{}; the {} request(s) in flight finish. `vigil peer up {} {addr}` undoes it.",
                at(r.since_unix_ms),
                peer.conns,
                up.name
            ),
            Rule::Admin => format!(
                "{addr} gets no traffic: an operator set it down{}. `vigil peer up {} {addr}` undoes it.",
                at(r.since_unix_ms),
                up.name
            ),
            Rule::ProbeDown => {
                let probe = peer
                    .active
                    .as_ref()
                    .and_then(|a| a.last_probe.as_ref())
                    .map(|p| format!(" (last probe: {})", probe_text(p)))
                    .unwrap_or_default();
                let check = up
                    .check
                    .as_ref()
                    .map(|c| format!(" (rise={}, a probe every {})", c.rise, dur(c.interval_ms)))
                    .unwrap_or_default();
                let since = match r.since_unix_ms {
                    Some(t) => format!(" since {}", clock(t)),
                    None => " from the start (the check starts peers down until they pass)".into(),
                };
                format!("{addr} gets no traffic: active checks say down{since}: {}{probe}; it comes back after passing probes{check}.", r.detail)
            }
            Rule::Excluded => {
                let cause = last_exclusion
                    .map(|e| format!(" (last: {} at {})", cause_of(&e.text), clock(e.at_unix_ms)))
                    .unwrap_or_default();
                let length = match (&up.rules.passive_penalty, r.nth) {
                    (Some(p), nth) if nth > 0 => {
                        let lasts = r
                            .until_unix_ms
                            .zip(r.since_unix_ms)
                            .map(|(u, s)| dur(u.saturating_sub(s)))
                            .unwrap_or_else(|| "?".into());
                        format!(
                            "exclusion {nth} in a row, {lasts} (passive_penalty base={} max={}{})",
                            dur(p.base_ms),
                            dur(p.max_ms),
                            if p.jitter_percent > 0 {
                                format!(" jitter={}%", p.jitter_percent)
                            } else {
                                String::new()
                            }
                        )
                    }
                    _ => format!("fail_timeout={}", dur(peer.fail_timeout_ms)),
                };
                format!(
                    "{addr} gets no traffic: {} failure(s){cause} reached max_fails={}; excluded until {} ({length}); {}",
                    peer.fails,
                    peer.max_fails,
                    r.until_unix_ms.map(clock).unwrap_or_else(|| "?".into()),
                    recovery_text(&up.rules.passive_recovery)
                )
            }
            Rule::AwaitingProbe => {
                let probe = peer
                    .active
                    .as_ref()
                    .and_then(|a| a.last_probe.as_ref())
                    .map(|p| format!(" (last probe: {})", probe_text(p)))
                    .unwrap_or_default();
                format!(
                    "{addr} gets no traffic: its exclusion ended{} and under passive_recovery probe it returns only when an active probe passes{probe}; no client request is spent testing it.",
                    at(r.since_unix_ms)
                )
            }
            Rule::Probation => format!(
                "{addr} is on probation (passive_recovery {}): {}; it takes one request at a time, and that one is in flight.",
                up.rules.passive_recovery, r.detail
            ),
            Rule::Full => format!(
                "{addr} is skipped while at max_conns: {}; it gets requests again as soon as one finishes.",
                r.detail
            ),
            Rule::Slow => {
                let rule = up
                    .rules
                    .eject_slow
                    .as_ref()
                    .map(|s| {
                        format!(
                            " (eject_slow factor={} window={} min_requests={} min={})",
                            s.factor,
                            dur(s.window_ms),
                            s.min_requests,
                            dur(s.min_ms)
                        )
                    })
                    .unwrap_or_default();
                let length = match (&up.rules.passive_penalty, r.nth) {
                    (Some(_), nth) if nth > 0 => format!("exclusion {nth} in a row, passive_penalty"),
                    _ => format!("fail_timeout={}", dur(peer.fail_timeout_ms)),
                };
                format!(
                    "{addr} gets no traffic: it was slow{}: {}{rule}; excluded until {} ({length}); its figure starts afresh, so it is judged again on new requests only; {}",
                    at(r.since_unix_ms),
                    r.detail,
                    r.until_unix_ms.map(clock).unwrap_or_else(|| "?".into()),
                    recovery_text(&up.rules.passive_recovery)
                )
            }
            Rule::Stuck => {
                let p99 = up
                    .rules
                    .header_time
                    .as_ref()
                    .and_then(|h| h.p99_us)
                    .map(|p| format!("the upstream's recent p99 is {}", micros(p)))
                    .unwrap_or_else(|| "too few recent headers for a p99".into());
                let rule = up
                    .rules
                    .eject_stuck
                    .as_ref()
                    .map(|s| format!("eject_stuck factor={} min={}: {p99}", s.factor, dur(s.min_ms)))
                    .unwrap_or_default();
                format!(
                    "{addr} takes no new requests: {} ({rule}); it is back as soon as that attempt gets its header, fails (charged as usual) or is cancelled.",
                    r.detail
                )
            }
            Rule::Unknown => format!("{addr}: {} ({})", r.rule, r.detail),
        };
        out.push(s);
    }
    for r in &peer.waived {
        let limit = up
            .rules
            .max_ejected
            .as_ref()
            .map(|m| {
                format!(
                    "max_ejected {}% keeps it eligible: {} of the {} primaries in service would be ejected and at most {} may be",
                    m.percent, m.ejected, m.in_service, m.allowed
                )
            })
            .unwrap_or_else(|| "max_ejected keeps it eligible".into());
        out.push(format!(
            "{addr} would be ejected ({}: {}) but {limit}; of those it has the best recent record (fewest failures counted, then the most recent to fail), so it still gets requests and is charged as usual.",
            r.rule, r.detail
        ));
    }
    if peer.backup {
        let primaries: Vec<&PeerView> = up.peers.iter().filter(|p| !p.backup).collect();
        let live = primaries.iter().filter(|p| p.reasons.is_empty()).count();
        out.push(format!(
            "{addr} is a backup: it gets traffic only when no primary server is eligible (now {live} of {} primaries are).",
            primaries.len()
        ));
    }
    if up.single {
        out.push(format!(
            "{addr} is the only server of {}: nginx's single-server rule applies, so failures never exclude it and a failed request is not retried.",
            up.name
        ));
    }
    if peer.reasons.is_empty()
        && !(peer.backup && up.peers.iter().any(|p| !p.backup && p.reasons.is_empty()))
    {
        let mut s = format!("{addr} is eligible");
        if peer.fails > 0 && peer.max_fails > 0 && peer.probation.is_none() {
            s.push_str(&format!(
                "; it carries {} unforgiven failure(s) of max_fails={} (a success more than fail_timeout={} after the last failure clears them)",
                peer.fails,
                peer.max_fails,
                dur(peer.fail_timeout_ms)
            ));
        }
        if let Some(p) = &peer.probation {
            s.push_str(&format!(
                "; it is on probation (passive_recovery probation={}): one request at a time until {} succeed in a row ({} so far), and a failure excludes it again",
                p.needed, p.needed, p.successes
            ));
        }
        if let (true, Some(until)) = (peer.weight_now < peer.weight, peer.ramp_until_unix_ms) {
            s.push_str(&format!(
                "; slow start: its weight is {} of {} now, rising until {} (slow_start={})",
                peer.weight_now,
                peer.weight,
                clock(until),
                dur(peer.slow_start_ms.unwrap_or(0))
            ));
        }
        if let Some(until) = peer.halved_until_unix_ms {
            s.push_str(&halved_text(up, peer, until));
        }
        s.push_str(&pick_hint(up, peer));
        s.push('.');
        out.push(s);
    }
    if let Some(a) = &peer.active {
        if a.state == "up" {
            if let Some(p) = &a.last_probe {
                out.push(format!(
                    "Active checks say up: last probe {}.",
                    probe_text(p)
                ));
            }
        }
    }
    super::nginx::amend(&up.name, peer, &mut out);
    out
}

/// Sentences about the rules of `up` as a whole: the preset and what it
/// switched on, and the latency rules with their figures now.
pub fn explain_rules(up: &UpstreamView) -> Vec<String> {
    let mut out = Vec::new();
    let r = &up.rules;
    if let Some(p) = &r.health_preset {
        let mut s = format!(
            "{}: health_preset {} switched on {}",
            up.name,
            p.name,
            if p.supplied.is_empty() {
                "nothing (every setting it covers is written)".to_string()
            } else {
                p.supplied
                    .iter()
                    .map(|d| setting_text(up, d))
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        );
        if !p.written.is_empty() {
            s.push_str(&format!(
                "; written beside it, and overriding it: {}",
                p.written
                    .iter()
                    .map(|d| setting_text(up, d))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        s.push('.');
        out.push(s);
    }
    if let Some(h) = &r.header_time {
        out.push(format!(
            "{}: recent time-to-header (last 5 to 10 s): p50 {}, p99 {}.",
            up.name,
            h.p50_us
                .map_or_else(|| "unknown (too few headers)".into(), micros),
            h.p99_us
                .map_or_else(|| "unknown (too few headers)".into(), micros)
        ));
    }
    if let Some(s) = &r.eject_stuck {
        out.push(format!(
            "{}: eject_stuck factor={} min={}: a peer whose oldest attempt has waited more than {} for its header takes no new requests until that attempt ends.",
            up.name,
            s.factor,
            dur(s.min_ms),
            micros((s.threshold_ms * 1000.0) as u64)
        ));
    }
    if let Some(s) = &r.eject_slow {
        out.push(format!(
            "{}: eject_slow factor={} window={} min_requests={} min={}: a peer with at least {} headers in the window whose median time-to-header is above {}× the median of the other peers' (and above {}) is excluded like a failing one.",
            up.name,
            s.factor,
            dur(s.window_ms),
            s.min_requests,
            dur(s.min_ms),
            s.min_requests,
            s.factor,
            dur(s.min_ms)
        ));
    }
    out.extend(traffic_text(up));
    out
}

/// `retry_budget` and `hedge`, with their state now.
fn traffic_text(up: &UpstreamView) -> Vec<String> {
    let mut out = Vec::new();
    let r = &up.rules;
    if let Some(b) = &r.retry_budget {
        out.push(format!(
            "{}: retry_budget ratio={}% min={}/s: retries and hedges may not exceed {}% of the requests of the last 10 s plus {} a second; {:.1} token(s) now ({} requests and {} paid retries in the last 10 s); {} denied so far (the failure was answered instead, and charged as usual).",
            up.name,
            b.ratio_percent,
            b.min_per_sec,
            b.ratio_percent,
            b.min_per_sec,
            b.tokens,
            b.requests,
            b.retries,
            b.denied
        ));
    }
    if let Some(h) = &r.hedge {
        let now = match (&h.after_now_ms, h.after.starts_with('p')) {
            (Some(ms), true) => format!(" (now {})", micros((ms * 1000.0) as u64)),
            (None, true) => " (no hedge yet: too few recent headers for that percentile)".into(),
            _ => String::new(),
        };
        let budget = if r.retry_budget.is_some() {
            "each takes a token of retry_budget (a denied hedge just keeps waiting)"
        } else {
            "no retry_budget limits them"
        };
        out.push(format!(
            "{}: hedge after={}{now} max={}: an idempotent request (not POST, LOCK or PATCH; body buffered or empty) with no response header after that is sent to another peer too, where proxy_next_upstream lists timeout; the first header wins and the other attempt is cancelled uncharged; hedges count toward proxy_next_upstream_tries and {budget}.",
            up.name, h.after, h.max
        ));
    }
    out
}

/// A rule setting as written in nginx.conf (`max_ejected 50%`).
fn setting_text(up: &UpstreamView, name: &str) -> String {
    let r = &up.rules;
    match name {
        "passive_count" => format!("passive_count {}", r.passive_count.join(" ")),
        "passive_recovery" => format!("passive_recovery {}", r.passive_recovery),
        "passive_penalty" => r.passive_penalty.as_ref().map_or_else(
            || "passive_penalty".into(),
            |p| {
                format!(
                    "passive_penalty base={} max={} jitter={}%",
                    dur(p.base_ms),
                    dur(p.max_ms),
                    p.jitter_percent
                )
            },
        ),
        "max_ejected" => r.max_ejected.as_ref().map_or_else(
            || "max_ejected".into(),
            |m| format!("max_ejected {}%", m.percent),
        ),
        "eject_stuck" => r.eject_stuck.as_ref().map_or_else(
            || "eject_stuck".into(),
            |s| format!("eject_stuck factor={} min={}", s.factor, dur(s.min_ms)),
        ),
        "eject_slow" => r.eject_slow.as_ref().map_or_else(
            || "eject_slow".into(),
            |s| {
                format!(
                    "eject_slow factor={} window={} min_requests={} min={}",
                    s.factor,
                    dur(s.window_ms),
                    s.min_requests,
                    dur(s.min_ms)
                )
            },
        ),
        "retry_budget" => r.retry_budget.as_ref().map_or_else(
            || "retry_budget".into(),
            |b| {
                format!(
                    "retry_budget ratio={}% min={}/s",
                    b.ratio_percent, b.min_per_sec
                )
            },
        ),
        "hedge" => r.hedge.as_ref().map_or_else(
            || "hedge".into(),
            |h| format!("hedge after={} max={}", h.after, h.max),
        ),
        other => other.to_string(),
    }
}

fn micros(us: u64) -> String {
    super::micros_text(std::time::Duration::from_micros(us))
}

fn pick_hint(up: &UpstreamView, peer: &PeerView) -> String {
    let eligible: Vec<&PeerView> = up
        .peers
        .iter()
        .filter(|p| p.reasons.is_empty() && p.backup == peer.backup)
        .collect();
    match up.balancer.as_str() {
        "round_robin" => {
            let w = |p: &PeerView| if p.weight_now == 0 { p.weight } else { p.weight_now };
            let total: u64 = eligible.iter().map(|p| u64::from(w(p))).sum();
            let n = total.div_ceil(u64::from(w(peer).max(1)));
            format!(
                "; with weight {} of {total} it is picked about once every {n} request(s)",
                w(peer)
            )
        }
        "least_conn" => format!(
            "; least_conn picks it when it has the fewest requests in flight per weight (now {} at weight {})",
            peer.conns, peer.weight
        ),
        b if b.starts_with("hash") || b == "ip_hash" => "; it serves the keys that hash to it".into(),
        _ => format!("; {} of {} eligible peers", 1, eligible.len()),
    }
}

/// What happens when a passive exclusion ends, per `passive_recovery`.
fn recovery_text(mode: &str) -> String {
    match mode {
        "probe" => "after that it stays out until an active probe passes (passive_recovery probe: the probe runs when the exclusion ends); no client request is spent testing it.".into(),
        m if m.starts_with("probation=") => format!(
            "after that it takes one request at a time until {} succeed in a row (passive_recovery {m}); a failure excludes it again.",
            m.trim_start_matches("probation=")
        ),
        _ => "after that one request will test it, and only a success forgives the failures.".into(),
    }
}

fn probe_text(p: &super::ProbeView) -> String {
    let phase = p
        .phase
        .as_deref()
        .map(|ph| format!("{ph}: "))
        .unwrap_or_default();
    format!(
        "{}{phase}{} in {:.0} ms at {}",
        if p.ok { "passed, " } else { "failed, " },
        p.detail,
        p.latency_ms,
        clock(p.at_unix_ms)
    )
}

fn cause_of(text: &str) -> String {
    text.split_once("(last: ")
        .map(|(_, c)| c.split_once(')').map_or(c, |(c, _)| c).to_string())
        .unwrap_or_else(|| text.to_string())
}

fn at(t: Option<u64>) -> String {
    t.map(|t| format!(" at {}", clock(t))).unwrap_or_default()
}

/// `HH:MM:SS` (UTC) of a Unix time in milliseconds.
/// Fleet `share_passive`: why the weight is halved, and what it does
/// under the upstream's method.
fn halved_text(up: &UpstreamView, peer: &PeerView, until: u64) -> String {
    let by = peer.halved_by.as_deref().unwrap_or("?");
    let hashed = up.balancer.starts_with("hash") || up.balancer == "ip_hash";
    format!(
        "; weight {} → {} until {}: fleet member {by} ejected it on its traffic (share_passive; no active check here to probe it){}",
        peer.weight,
        peer.weight_now,
        clock(until),
        if hashed {
            " — the key picks under this method, so the halving changes no share"
        } else if peer.weight_now == peer.weight {
            " — weight 1 cannot be halved"
        } else {
            ""
        }
    )
}

pub(crate) fn clock(unix_ms: u64) -> String {
    let s = unix_ms / 1000 % 86_400;
    format!("{:02}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}

fn dur(ms: u64) -> String {
    crate::config::value::format_time(std::time::Duration::from_millis(ms))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use crate::config::{literal_resolver, nginx};
    use crate::event::EventBus;
    use crate::registry::Registry;
    use crate::{
        Clock, FailureClass, ManualClock, RequestFacts, RetryPolicy, SelectKey, TransportFailure,
    };

    fn setup(conf: &str) -> (Registry, Arc<ManualClock>, Arc<EventBus>) {
        let loaded = nginx::load_str(conf, "t.conf".as_ref(), ".".as_ref(), &literal_resolver)
            .expect("conf");
        let clock = Arc::new(ManualClock::at(12 * 3_600_000 + 67_000));
        let bus = Arc::new(EventBus::default());
        let reg = Registry::build(&loaded.config, None, bus.clone(), clock.clone());
        (reg, clock, bus)
    }

    #[test]
    fn retry_budget_and_hedge_are_explained_with_tokens_and_denials() {
        let (reg, clock, _) = setup(
            "http { upstream u { server 10.0.0.1:80; server 10.0.0.2:80;
                 retry_budget ratio=50% min=0/s; hedge after=40ms max=2; } }",
        );
        let up = reg.get("u").expect("u").clone();
        let now = clock.now();
        // Two requests: one token; one failure retried, the next denied.
        let fail = TransportFailure {
            class: FailureClass::Error,
            request_sent: true,
            cached_connection: false,
        };
        for _ in 0..2 {
            let mut sel = up.begin(
                SelectKey::None,
                RetryPolicy::default(),
                RequestFacts::default(),
                now,
            );
            let g = up.select(&mut sel, now).expect("a peer");
            let _ = sel.on_failure(g, fail, now);
        }
        let view = super::super::upstream_view(&up, &*clock, now);
        let b = view.rules.retry_budget.as_ref().expect("budget view");
        assert_eq!((b.requests, b.retries, b.denied), (2, 1, 1));
        assert_eq!(b.tokens, 0.0);
        let text = super::explain_rules(&view).join("\n");
        assert!(
            text.contains("u: retry_budget ratio=50% min=0/s: retries and hedges may not exceed 50% of the requests of the last 10 s plus 0 a second; 0.0 token(s) now (2 requests and 1 paid retries in the last 10 s); 1 denied so far"),
            "{text}"
        );
        assert!(
            text.contains("u: hedge after=40ms max=2: an idempotent request"),
            "{text}"
        );
        assert!(
            text.contains("each takes a token of retry_budget"),
            "{text}"
        );
        let json = serde_json::to_string(&view.rules).expect("json");
        assert!(
            json.contains("\"hedge\":{\"after\":\"40ms\",\"max\":2,\"after_now_ms\":40.0}"),
            "{json}"
        );
    }

    #[test]
    fn an_excluded_peer_is_explained_with_its_cause_and_times() {
        let (reg, clock, bus) = setup("upstream api { server 10.0.0.1:80; server 10.0.0.2:8080; }");
        let up = reg.get("api").expect("api").clone();
        // 10.0.0.2 answers 503 with http_503 listed: one failure at 12:01:07.
        let p = RetryPolicy {
            next_upstream: crate::NextUpstream::nginx_default().with(FailureClass::Http503),
            ..RetryPolicy::default()
        };
        let now = clock.now();
        let mut sel = up.begin(SelectKey::None, p, RequestFacts::default(), now);
        let g = up.select(&mut sel, now).expect("a");
        drop(g);
        let mut sel = up.begin(SelectKey::None, p, RequestFacts::default(), now);
        let g = up.select(&mut sel, now).expect("b");
        assert_eq!(&**g.peer().name(), "10.0.0.2:8080");
        let _ = sel.on_status(g, 503, now);
        let _ = TransportFailure {
            class: FailureClass::Error,
            request_sent: true,
            cached_connection: false,
        };
        clock.advance(Duration::from_secs(1));
        let doc = super::super::status(&reg, &*clock);
        let events: Vec<_> = bus
            .since(0, 100)
            .events
            .iter()
            .map(super::super::event_view)
            .collect();
        let upv = &doc.upstreams[0];
        let text = super::explain(upv, &upv.peers[1], &events).join(" ");
        assert!(
            text.contains("10.0.0.2:8080 gets no traffic: 1 failure(s) (last: http_503 at 12:01:07) reached max_fails=1; excluded until 12:01:17 (fail_timeout=10s); after that one request will test it"),
            "{text}"
        );
        let healthy = super::explain(upv, &upv.peers[0], &events).join(" ");
        assert!(healthy.contains("10.0.0.1:80 is eligible; with weight 1 of 1 it is picked about once every 1 request(s)"), "{healthy}");
    }

    #[test]
    fn a_fleet_halving_is_explained_with_the_member_and_the_end() {
        let (reg, clock, bus) = setup(
            "upstream api { server 10.0.0.1:80 weight=5; server 10.0.0.2:80; }
             upstream h { hash $uri; server 10.0.0.1:80 weight=4; server 10.0.0.2:80; }",
        );
        let now = clock.now();
        for name in ["api", "h"] {
            let up = reg.get(name).expect("upstream").clone();
            assert!(up.halve_weight(
                crate::peer::PeerId(0),
                now.after(Duration::from_secs(3)),
                "b",
                now
            ));
        }
        let doc = super::super::status(&reg, &*clock);
        let upv = &doc.upstreams[0];
        let p = &upv.peers[0];
        assert_eq!(
            (p.weight, p.weight_now, p.halved_by.as_deref()),
            (5, 2, Some("b"))
        );
        let text = super::explain(upv, p, &[]).join(" ");
        assert!(
            text.contains("10.0.0.1:80 is eligible; weight 5 → 2 until 12:01:10: fleet member b ejected it on its traffic (share_passive; no active check here to probe it)"),
            "{text}"
        );
        let h = &doc.upstreams[1];
        let text = super::explain(h, &h.peers[0], &[]).join(" ");
        assert!(text.contains("the key picks under this method"), "{text}");
        let json = serde_json::to_string(p).expect("json");
        assert!(json.contains("\"halved_by\":\"b\""), "{json}");
        let events: Vec<_> = bus
            .since(0, 10)
            .events
            .iter()
            .map(|e| e.kind.to_string())
            .collect();
        assert_eq!(events[0], "weight halved by fleet member b: 5 → 2 for 3000 ms (member b ejected it on its traffic; no active check here to probe it)");
        clock.advance(Duration::from_secs(3));
        let doc = super::super::status(&reg, &*clock);
        let p = &doc.upstreams[0].peers[0];
        assert_eq!((p.weight_now, p.halved_until_unix_ms), (5, None), "over");
    }

    #[test]
    fn single_backup_and_admin_rules_are_named() {
        let (reg, clock, _bus) = setup(
            "upstream one { server 10.0.0.1:80; }
             upstream two { server 10.0.0.1:80; server 10.0.0.2:80; server 10.0.0.3:80 backup; }",
        );
        let doc = super::super::status(&reg, &*clock);
        let one = &doc.upstreams[0];
        assert!(super::explain(one, &one.peers[0], &[])
            .join(" ")
            .contains("nginx's single-server rule applies"));
        let two_up = reg.get("two").expect("two");
        two_up.set_admin(
            crate::peer::PeerId(1),
            crate::peer::AdminState::Drain,
            clock.now(),
        );
        let doc = super::super::status(&reg, &*clock);
        let two = &doc.upstreams[1];
        let drain = super::explain(two, &two.peers[1], &[]).join(" ");
        assert!(
            drain.contains("set it to drain at 12:01:07")
                && drain.contains("vigil peer up two 10.0.0.2:80"),
            "{drain}"
        );
        let backup = super::explain(two, &two.peers[2], &[]).join(" ");
        assert!(backup.contains("is a backup: it gets traffic only when no primary server is eligible (now 1 of 2 primaries are)"), "{backup}");
        assert!(
            !backup.contains("10.0.0.3:80 is eligible"),
            "a backup behind live primaries gets no traffic"
        );
    }

    /// Requests (the other peers answer) until `addr` took one, which fails
    /// or succeeds.
    fn hit(up: &Arc<crate::Upstream>, now: crate::Timestamp, addr: &str, fail: bool) {
        for _ in 0..10 {
            let mut sel = up.begin(
                SelectKey::None,
                RetryPolicy::default(),
                RequestFacts::default(),
                now,
            );
            let Ok(g) = up.select(&mut sel, now) else {
                continue;
            };
            if &**g.peer().name() == addr {
                if fail {
                    let f = TransportFailure {
                        class: FailureClass::Error,
                        request_sent: true,
                        cached_connection: false,
                    };
                    let _ = sel.on_failure(g, f, now);
                }
                return;
            }
        }
        panic!("{addr} never picked");
    }

    fn sentences(
        reg: &Registry,
        clock: &ManualClock,
        bus: &EventBus,
        up: usize,
        peer: usize,
    ) -> String {
        let doc = super::super::status(reg, clock);
        let events: Vec<_> = bus
            .since(0, 100)
            .events
            .iter()
            .map(super::super::event_view)
            .collect();
        let upv = &doc.upstreams[up];
        super::explain(upv, &upv.peers[peer], &events).join(" ")
    }

    #[test]
    fn penalty_probe_recovery_and_max_ejected_are_explained() {
        let (reg, clock, bus) = setup(
            "upstream api {
                server 10.0.0.1:80; server 10.0.0.2:80;
                check interval=3000 rise=1 fall=3 timeout=1000 default_down=false;
                passive_recovery probe;
                passive_penalty base=2s max=8s;
                max_ejected 50%;
            }",
        );
        let up = reg.get("api").expect("api").clone();
        hit(&up, clock.now(), "10.0.0.2:80", true);
        let text = sentences(&reg, &clock, &bus, 0, 1);
        assert!(
            text.contains("10.0.0.2:80 gets no traffic: 1 failure(s) (last: error at 12:01:07) reached max_fails=1; excluded until 12:01:09 (exclusion 1 in a row, 2s (passive_penalty base=2s max=8s)); after that it stays out until an active probe passes"),
            "{text}"
        );
        clock.advance(Duration::from_millis(2_001));
        let text = sentences(&reg, &clock, &bus, 0, 1);
        assert!(
            text.contains("its exclusion ended at 12:01:09 and under passive_recovery probe it returns only when an active probe passes; no client request is spent testing it"),
            "{text}"
        );
        // The other one fails too: max_ejected keeps the one that failed last.
        hit(&up, clock.now(), "10.0.0.1:80", true);
        let text = sentences(&reg, &clock, &bus, 0, 0);
        assert!(
            text.contains("10.0.0.1:80 would be ejected (excluded: 1/1 failures) but max_ejected 50% keeps it eligible: 2 of the 2 primaries in service would be ejected and at most 1 may be"),
            "{text}"
        );
        let doc = super::super::status(&reg, &*clock);
        let json = serde_json::to_string(&doc.upstreams[0]).expect("json");
        for field in [
            "\"passive_recovery\":\"probe\"",
            "\"max_ejected\":{\"percent\":50,\"in_service\":2,\"ejected\":2,\"allowed\":1}",
            "\"state\":\"awaiting_probe\"",
            "\"waived\":[{\"rule\":\"excluded\"",
        ] {
            assert!(json.contains(field), "{field} in {json}");
        }
    }

    #[test]
    fn probation_and_slow_start_are_explained() {
        let (reg, clock, bus) = setup(
            "upstream app {
                server 10.0.0.1:80 weight=10 slow_start=30s; server 10.0.0.2:80;
                passive_recovery probation=2;
            }",
        );
        let up = reg.get("app").expect("app").clone();
        hit(&up, clock.now(), "10.0.0.1:80", true);
        clock.advance(Duration::from_millis(10_001));
        let text = sentences(&reg, &clock, &bus, 0, 0);
        assert!(
            text.contains("10.0.0.1:80 is eligible; it is on probation (passive_recovery probation=2): one request at a time until 2 succeed in a row (0 so far)"),
            "{text}"
        );
        hit(&up, clock.now(), "10.0.0.1:80", false);
        hit(&up, clock.now(), "10.0.0.1:80", false);
        let text = sentences(&reg, &clock, &bus, 0, 0);
        assert!(
            text.contains("10.0.0.1:80 is eligible; slow start: its weight is 1 of 10 now, rising until 12:01:47 (slow_start=30s)"),
            "{text}"
        );
        let kinds: Vec<String> = bus
            .since(0, 100)
            .events
            .iter()
            .map(|e| e.kind.name().to_string())
            .collect();
        assert_eq!(
            kinds,
            vec![
                "excluded",
                "probation_started",
                "probation_passed",
                "slow_start"
            ]
        );
    }

    #[test]
    fn a_ramping_peer_is_explained_with_its_weight_now() {
        let (reg, clock, bus) = setup(
            "upstream app { server 10.0.0.1:80 weight=10 slow_start=20s; server 10.0.0.2:80 weight=10; }",
        );
        let up = reg.get("app").expect("app").clone();
        up.set_admin(
            crate::peer::PeerId(0),
            crate::peer::AdminState::Down,
            clock.now(),
        );
        up.set_admin(
            crate::peer::PeerId(0),
            crate::peer::AdminState::Up,
            clock.now(),
        );
        clock.advance(Duration::from_secs(10));
        let text = sentences(&reg, &clock, &bus, 0, 0);
        assert!(
            text.contains("10.0.0.1:80 is eligible; slow start: its weight is 5 of 10 now, rising until 12:01:27 (slow_start=20s); with weight 5 of 15 it is picked about once every 3 request(s)"),
            "{text}"
        );
    }

    #[test]
    fn clock_formats_utc() {
        assert_eq!(super::clock(12 * 3_600_000 + 67_000), "12:01:07");
    }
}
