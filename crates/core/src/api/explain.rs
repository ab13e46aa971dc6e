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
    // The sentences of configurations read through the nginx front end:
    // crates/config/tests/it/explain.rs.

    #[test]
    fn clock_formats_utc() {
        assert_eq!(super::clock(12 * 3_600_000 + 67_000), "12:01:07");
    }
}
