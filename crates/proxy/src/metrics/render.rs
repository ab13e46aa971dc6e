//! The Prometheus text of [`super::ProxyMetrics`]: counters from the
//! atomics, gauges read from core's peer status at scrape time.

use std::fmt::Write as _;
use std::sync::atomic::Ordering;

use vigil_core::peer::AdminState;
use vigil_core::upstream::{Ineligible, PeerStatus};
use vigil_core::{FailureClass, RetryDenied};

use super::stats::{class_index, Outcome, STATUS_CLASSES};
use super::{GenerationStats, BUCKETS};

/// The values of `vigil_peer_state`'s `state` label.
pub(crate) const STATES: [&str; 9] = [
    "eligible",
    "excluded",
    "probe_down",
    "admin_down",
    "draining",
    "down",
    "full",
    "slow",
    "stuck",
];

/// The values of `vigil_ejections_total`'s `rule` label, by
/// [`ejection_index`].
pub(crate) const EJECTION_RULES: [&str; 4] = ["passive", "probe_down", "slow", "stuck"];

/// The `rule` label of `vigil_rule_charges_total`, by
/// [`super::stats::rule_index`].
pub(crate) const COUNT_RULES: [&str; 2] = ["after_header", "last_try"];

/// The `# HELP` texts, shared with the OpenTelemetry descriptions.
pub(crate) mod help {
    pub(crate) const RELOADS: &str = "Configuration reloads put in force since start.";
    pub(crate) const REQUESTS: &str =
        "Client requests routed to an upstream, by the class of the status answered.";
    pub(crate) const DURATION: &str =
        "Time from a request's arrival to the response header sent to the client.";
    pub(crate) const ATTEMPTS: &str =
        "Attempts sent to a peer, by outcome (ok, or nginx's failure class).";
    pub(crate) const RETRIES: &str = "Attempts that moved a request to the next peer.";
    pub(crate) const COUNTED: &str = "Failures charged to a peer toward max_fails, by class.";
    pub(crate) const RULE_CHARGES: &str = "Failures charged by a vigil-only passive_count rule where nginx charges none (part of vigil_failures_counted_total).";
    pub(crate) const NO_LIVE: &str =
        "Requests answered 502 because no peer of the upstream was eligible.";
    pub(crate) const EJECTIONS: &str =
        "Times a health rule took the peer out, by rule: passive (max_fails), probe_down, slow (eject_slow), stuck (eject_stuck).";
    pub(crate) const EXCLUSIONS: &str =
        "Times a peer reached max_fails and was excluded for fail_timeout.";
    pub(crate) const CONNS: &str = "Requests in flight to the peer.";
    pub(crate) const STATE: &str =
        "1 for the peer's current state (the first rule in force), 0 for the others.";
    pub(crate) const FAILS: &str = "Failures counted against the peer and not yet forgiven.";
    pub(crate) const HEDGES: &str =
        "Hedges sent: the same request to a second peer while the first had not answered.";
    pub(crate) const DENIED: &str =
        "Retries and hedges core did not allow, by reason (budget: retry_budget was empty).";
}

/// Write every metric; with no generation only `vigil_reloads_total`.
pub(super) fn write(out: &mut String, g: Option<&GenerationStats>, reloads: u64) {
    if let Some(g) = g {
        counters(out, g);
        gauges(out, g);
    }
    header(out, "vigil_reloads_total", "counter", help::RELOADS);
    let _ = writeln!(out, "vigil_reloads_total {reloads}");
}

fn counters(out: &mut String, g: &GenerationStats) {
    let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    header(out, "vigil_requests_total", "counter", help::REQUESTS);
    for u in &g.upstreams {
        let t = &u.totals;
        for (class, n) in STATUS_CLASSES.iter().zip(&t.requests) {
            let _ = writeln!(
                out,
                "vigil_requests_total{{{},status_class=\"{class}\"}} {}",
                t.label,
                load(n)
            );
        }
    }
    header(
        out,
        "vigil_request_duration_seconds",
        "histogram",
        help::DURATION,
    );
    for u in &g.upstreams {
        let t = &u.totals;
        let mut cumulative = 0;
        for (le, n) in BUCKETS.iter().zip(&t.buckets) {
            cumulative += load(n);
            let _ = writeln!(
                out,
                "vigil_request_duration_seconds_bucket{{{},le=\"{le}\"}} {cumulative}",
                t.label
            );
        }
        cumulative += t.buckets.last().map_or(0, load);
        let l = &t.label;
        let _ = writeln!(
            out,
            "vigil_request_duration_seconds_bucket{{{l},le=\"+Inf\"}} {cumulative}"
        );
        let sum = load(&t.sum_us) as f64 / 1e6;
        let _ = writeln!(out, "vigil_request_duration_seconds_sum{{{l}}} {sum}");
        let _ = writeln!(
            out,
            "vigil_request_duration_seconds_count{{{l}}} {cumulative}"
        );
    }
    header(out, "vigil_attempts_total", "counter", help::ATTEMPTS);
    for p in g.upstreams.iter().flat_map(|u| u.peers.iter()) {
        for o in Outcome::ALL {
            let _ = writeln!(
                out,
                "vigil_attempts_total{{{},outcome=\"{}\"}} {}",
                p.label,
                o.as_str(),
                load(&p.attempts[o.index()])
            );
        }
    }
    header(out, "vigil_retries_total", "counter", help::RETRIES);
    for u in &g.upstreams {
        let t = &u.totals;
        let _ = writeln!(
            out,
            "vigil_retries_total{{{}}} {}",
            t.label,
            load(&t.retries)
        );
    }
    header(
        out,
        "vigil_failures_counted_total",
        "counter",
        help::COUNTED,
    );
    for p in g.upstreams.iter().flat_map(|u| u.peers.iter()) {
        for c in FailureClass::ALL.into_iter().filter(|c| c.is_counted()) {
            let _ = writeln!(
                out,
                "vigil_failures_counted_total{{{},class=\"{c}\"}} {}",
                p.label,
                load(&p.counted[class_index(c)])
            );
        }
    }
    header(
        out,
        "vigil_rule_charges_total",
        "counter",
        help::RULE_CHARGES,
    );
    for p in g.upstreams.iter().flat_map(|u| u.peers.iter()) {
        for (rule, n) in COUNT_RULES.iter().zip(&p.by_rule) {
            let _ = writeln!(
                out,
                "vigil_rule_charges_total{{{},rule=\"{rule}\"}} {}",
                p.label,
                load(n)
            );
        }
    }
    header(
        out,
        "vigil_no_live_upstreams_total",
        "counter",
        help::NO_LIVE,
    );
    for u in &g.upstreams {
        let t = &u.totals;
        let _ = writeln!(
            out,
            "vigil_no_live_upstreams_total{{{}}} {}",
            t.label,
            load(&t.no_live)
        );
    }
    traffic(out, g);
    header(out, "vigil_exclusions_total", "counter", help::EXCLUSIONS);
    for p in g.upstreams.iter().flat_map(|u| u.peers.iter()) {
        let _ = writeln!(
            out,
            "vigil_exclusions_total{{{}}} {}",
            p.label,
            load(&p.exclusions)
        );
    }
    header(out, "vigil_ejections_total", "counter", help::EJECTIONS);
    for p in g.upstreams.iter().flat_map(|u| u.peers.iter()) {
        for (rule, n) in EJECTION_RULES.iter().zip(&p.ejections) {
            let _ = writeln!(
                out,
                "vigil_ejections_total{{{},rule=\"{rule}\"}} {}",
                p.label,
                load(n)
            );
        }
    }
}

/// `vigil_hedges_total` and `vigil_retries_denied_total`.
fn traffic(out: &mut String, g: &GenerationStats) {
    let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    header(out, "vigil_hedges_total", "counter", help::HEDGES);
    for u in &g.upstreams {
        let t = &u.totals;
        let _ = writeln!(out, "vigil_hedges_total{{{}}} {}", t.label, load(&t.hedges));
    }
    header(out, "vigil_retries_denied_total", "counter", help::DENIED);
    for u in &g.upstreams {
        let t = &u.totals;
        for why in RetryDenied::ALL {
            let _ = writeln!(
                out,
                "vigil_retries_denied_total{{{},reason=\"{}\"}} {}",
                t.label,
                why.as_str(),
                load(&t.denied[why.index()])
            );
        }
    }
}

fn gauges(out: &mut String, g: &GenerationStats) {
    let now = g.clock.now();
    let mut conns = String::new();
    let mut states = String::new();
    let mut fails = String::new();
    for (up, stats) in g.registry.upstreams().iter().zip(&g.upstreams) {
        for (s, p) in up.status(now).iter().zip(stats.peers.iter()) {
            let l = &p.label;
            let _ = writeln!(
                conns,
                "vigil_peer_active_connections{{{l}}} {}",
                s.peer.conns()
            );
            let current = state_index(s);
            for (i, name) in STATES.iter().enumerate() {
                let _ = writeln!(
                    states,
                    "vigil_peer_state{{{l},state=\"{name}\"}} {}",
                    u8::from(i == current)
                );
            }
            let _ = writeln!(fails, "vigil_peer_fails{{{l}}} {}", s.passive.fails);
        }
    }
    header(out, "vigil_peer_active_connections", "gauge", help::CONNS);
    out.push_str(&conns);
    header(out, "vigil_peer_state", "gauge", help::STATE);
    out.push_str(&states);
    header(out, "vigil_peer_fails", "gauge", help::FAILS);
    out.push_str(&fails);
}

/// The position in [`STATES`] of the first rule keeping the peer out, as
/// the admin API names it.
pub(crate) fn state_index(s: &PeerStatus) -> usize {
    match s.reasons.first() {
        None => 0,
        // core's `awaiting_probe` is still a passive exclusion, and
        // `probation` (its one request in flight) a concurrency limit.
        Some(Ineligible::Excluded { .. } | Ineligible::AwaitingProbe { .. }) => 1,
        Some(Ineligible::ProbeDown { .. }) => 2,
        Some(Ineligible::Admin { state, .. }) if *state == AdminState::Drain => 4,
        Some(Ineligible::Admin { .. }) => 3,
        Some(Ineligible::ConfigDown) => 5,
        Some(Ineligible::Full { .. } | Ineligible::Probation { .. }) => 6,
        Some(Ineligible::Slow { .. }) => 7,
        Some(Ineligible::Stuck { .. }) => 8,
    }
}

/// The position in [`EJECTION_RULES`] of an event that ejects a peer.
pub(crate) fn ejection_index(kind: &vigil_core::event::EventKind) -> Option<usize> {
    use vigil_core::event::EventKind;
    match kind {
        EventKind::Excluded { .. } => Some(0),
        EventKind::ProbeDown { .. } => Some(1),
        EventKind::SlowEjected { .. } => Some(2),
        EventKind::Stuck { .. } => Some(3),
        _ => None,
    }
}

/// `# HELP` and `# TYPE` lines.
fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}
