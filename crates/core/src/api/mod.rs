//! What the admin API serves and the CLI prints: serializable views of every
//! upstream and peer at one moment, and the plain-sentence explanation of
//! why a peer does or does not get traffic ([`explain`]). Pure functions of
//! core state, so `vigil serve`, `vigil check` and the CLI share them.

mod explain;
mod nginx;

use serde::{Deserialize, Serialize};

use crate::clock::{duration_ms, Clock, Timestamp};
use crate::config::{Balancer, CheckKind, HealthRules};
use crate::event::{Event, EventKind};
use crate::health::HealthState;
use crate::registry::Registry;
use crate::upstream::{Ineligible, PeerState, PeerStatus, Rule, Upstream};

pub use explain::{explain, explain_rules};
pub use nginx::{NginxGiven, NginxSyncView, NginxView};

/// `GET /api/status`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StatusDoc {
    /// Configuration generation (1 = first load).
    pub generation: u64,
    /// When this was taken, milliseconds since the Unix epoch.
    pub now_unix_ms: u64,
    /// Every upstream in config order.
    pub upstreams: Vec<UpstreamView>,
    /// `vigil check` only: the render and reload loop (what nginx runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nginx: Option<NginxSyncView>,
    /// The last configuration reload asked for (SIGHUP, `POST /api/reload`),
    /// if any since the start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_reload: Option<ReloadView>,
}

/// The result of a configuration reload.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReloadView {
    /// When, ms since the epoch.
    pub at_unix_ms: u64,
    /// It worked.
    pub ok: bool,
    /// The generation it made.
    pub generation: Option<u64>,
    /// Why it failed (`file:line:col: ...`); withheld without the admin token.
    pub error: Option<String>,
    /// Set when `error` was withheld (no token given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_withheld: Option<String>,
}

/// One upstream.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UpstreamView {
    /// Its name.
    pub name: String,
    /// `round_robin`, `least_conn`, `hash $key`, `hash $key consistent`, `ip_hash`, `random`, `random two`.
    pub balancer: String,
    /// nginx's single-server rule applies (never excluded, never retried).
    pub single: bool,
    /// The active check, if any.
    pub check: Option<CheckView>,
    /// vigil's peer rules beyond nginx in force (all off: nginx).
    #[serde(default)]
    pub rules: RulesView,
    /// Primaries, then backups.
    pub peers: Vec<PeerView>,
}

/// The vigil-only peer rules of an upstream.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RulesView {
    /// `passive_count`: `after_header`, `last_try` (empty: nginx's counting).
    pub passive_count: Vec<String>,
    /// `passive_recovery`: `window` (nginx), `probe`, `probation=N`.
    pub passive_recovery: String,
    /// `passive_penalty`, if set.
    pub passive_penalty: Option<PenaltyView>,
    /// `retry_budget`, if set, with its tokens now.
    #[serde(default)]
    pub retry_budget: Option<RetryBudgetView>,
    /// `hedge`, if set.
    #[serde(default)]
    pub hedge: Option<HedgeView>,
    /// `max_ejected`, if set, with its count now.
    pub max_ejected: Option<MaxEjectedView>,
    /// `eject_stuck`, if set, with its threshold now.
    #[serde(default)]
    pub eject_stuck: Option<EjectStuckView>,
    /// `eject_slow`, if set.
    #[serde(default)]
    pub eject_slow: Option<EjectSlowView>,
    /// `health_preset`, if written: which settings it supplied.
    #[serde(default)]
    pub health_preset: Option<PresetView>,
    /// The upstream's recent time-to-header, when core measures it.
    #[serde(default)]
    pub header_time: Option<HeaderTimeView>,
}

/// `eject_stuck factor= min=` and its threshold now.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EjectStuckView {
    /// K.
    pub factor: f64,
    /// T, ms.
    pub min_ms: u64,
    /// max(T, K × p99) now, ms (fractional).
    pub threshold_ms: f64,
}

/// `eject_slow factor= window= min_requests= min=`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EjectSlowView {
    /// K.
    pub factor: f64,
    /// The window, ms.
    pub window_ms: u64,
    /// N.
    pub min_requests: u32,
    /// The floor, ms.
    pub min_ms: u64,
}

/// `health_preset NAME`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PresetView {
    /// `recommended`.
    pub name: String,
    /// The settings it supplied (directive names).
    pub supplied: Vec<String>,
    /// The settings written beside it, which override it.
    pub written: Vec<String>,
}

/// An upstream's recent time-to-header (the last 5 to 10 s).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HeaderTimeView {
    /// Median, µs (None: too few samples).
    pub p50_us: Option<u64>,
    /// 99th percentile, µs (None: too few samples).
    pub p99_us: Option<u64>,
}

/// `retry_budget ratio= min=` and its state now.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RetryBudgetView {
    /// R, percent of the requests.
    pub ratio_percent: u8,
    /// N per second whatever the ratio.
    pub min_per_sec: u32,
    /// Retries or hedges it could pay for now (ratio and reserve).
    pub tokens: f64,
    /// Requests counted in the last 10 s.
    pub requests: u64,
    /// Retries and hedges the ratio paid for in the last 10 s.
    pub retries: u64,
    /// Retries and hedges denied since the budget was set.
    pub denied: u64,
}

/// `hedge after= max=`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HedgeView {
    /// `after=` as written: `50ms` or `p95`.
    pub after: String,
    /// Hedges per request.
    pub max: u32,
    /// The delay in force now, ms (for `pNN`: None while too few headers).
    pub after_now_ms: Option<f64>,
}

/// `passive_penalty base= max= jitter=`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PenaltyView {
    /// The first exclusion, ms.
    pub base_ms: u64,
    /// The longest exclusion and the clean period that resets growth, ms.
    pub max_ms: u64,
    /// ± this percentage at random.
    pub jitter_percent: u8,
}

/// `max_ejected P%` and what it decides now.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MaxEjectedView {
    /// P.
    pub percent: u8,
    /// Primaries in service ([`crate::upstream::policy::in_service`]: not
    /// `down`, admin state up).
    pub in_service: u32,
    /// Of those, how many a health rule ejects (kept ones included).
    pub ejected: u32,
    /// How many may be ejected: `min(floor(in_service × P / 100), in_service − keep)`.
    pub allowed: u32,
    /// The count form: at least this many stay in service (1 unless set,
    /// as by `vigil check --min-healthy`; left out of the JSON when 1).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub keep: u32,
}

fn one() -> u32 {
    1
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

/// An upstream's active check.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CheckView {
    /// `tcp`, `http` or `https`.
    pub kind: String,
    /// Milliseconds between probes.
    pub interval_ms: u64,
    /// Passes to come up.
    pub rise: u32,
    /// Failures to go down.
    pub fall: u32,
    /// Milliseconds per probe.
    pub timeout_ms: u64,
}

/// One peer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PeerView {
    /// The peer's name: the address as configured, or the resolved
    /// address when the configured name resolved to several (then
    /// `server` has the configured text).
    pub address: String,
    /// The `server` line's address as written, when it is not `address`
    /// (a name that resolved to several addresses, one peer each).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
    /// The resolved socket address (`$upstream_addr`); the same text as
    /// `address` when that is an IP address and port.
    #[serde(default)]
    pub addr: String,
    /// A backup server.
    pub backup: bool,
    /// `eligible`, or the first rule that keeps it out: `down`, `admin_down`,
    /// `draining`, `probe_down`, `excluded`, `awaiting_probe`, `probation`,
    /// `slow`, `stuck`, `full`.
    pub state: PeerState,
    /// Configured weight.
    pub weight: u32,
    /// The weight it has now (lower while `slow_start` ramps).
    #[serde(default)]
    pub weight_now: u32,
    /// `slow_start` in milliseconds, if set.
    #[serde(default)]
    pub slow_start_ms: Option<u64>,
    /// End of the slow-start ramp in progress, ms since the epoch.
    #[serde(default)]
    pub ramp_until_unix_ms: Option<u64>,
    /// Fleet `share_passive`: the weight is halved (`max(1, weight/2)`)
    /// until then, ms since the epoch, because another member ejected the
    /// peer on its traffic (it has no active check here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub halved_until_unix_ms: Option<u64>,
    /// The member whose ejection halved it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub halved_by: Option<String>,
    /// `passive_penalty`: exclusions in a row so far.
    #[serde(default)]
    pub penalty_nth: u32,
    /// `passive_recovery probation=N`: while half-open (one request at a
    /// time), the successes in a row so far and N.
    #[serde(default)]
    pub probation: Option<ProbationView>,
    /// Smooth round-robin effective weight.
    pub effective_weight: i64,
    /// Requests in flight.
    pub conns: u32,
    /// `max_conns` (0 = none).
    pub max_conns: u32,
    /// Failures counted and not yet forgiven.
    pub fails: u32,
    /// `max_fails` (0 = never excluded).
    pub max_fails: u32,
    /// `fail_timeout` in milliseconds.
    pub fail_timeout_ms: u64,
    /// Last failure, ms since the epoch.
    pub last_failure_unix_ms: Option<u64>,
    /// Admin state: `up`, `down`, `drain`.
    pub admin: String,
    /// Active-check state, when the upstream has a check.
    pub active: Option<ActiveView>,
    /// Every rule in force against the peer now.
    pub reasons: Vec<ReasonView>,
    /// Ejections `max_ejected` overrides: the peer stays eligible despite them.
    #[serde(default)]
    pub waived: Vec<ReasonView>,
    /// `vigil check` only: what nginx was given for this server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nginx: Option<NginxView>,
    /// `eject_slow`: its median time-to-header over the window, µs.
    #[serde(default)]
    pub header_median_us: Option<u64>,
    /// `eject_slow`: headers in the window.
    #[serde(default)]
    pub header_requests: Option<u64>,
    /// `eject_stuck`: attempts waiting for a header now.
    #[serde(default)]
    pub waiting: Option<u32>,
    /// `eject_stuck`: how long the oldest of them has waited, ms.
    #[serde(default)]
    pub oldest_wait_ms: Option<u64>,
}

/// A peer on probation (`passive_recovery probation=N`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProbationView {
    /// Successes in a row so far.
    pub successes: u32,
    /// N.
    pub needed: u32,
}

/// Active-check state of a peer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ActiveView {
    /// `up` or `down`.
    pub state: String,
    /// Whether any probe result arrived yet.
    pub decided: bool,
    /// Consecutive passes.
    pub rise_streak: u32,
    /// Consecutive failures.
    pub fall_streak: u32,
    /// Last change, ms since the epoch (None: initial state).
    pub since_unix_ms: Option<u64>,
    /// The last probe.
    pub last_probe: Option<ProbeView>,
}

/// One probe result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProbeView {
    /// Passed.
    pub ok: bool,
    /// Failing phase.
    pub phase: Option<String>,
    /// Milliseconds it took.
    pub latency_ms: f64,
    /// What it saw.
    pub detail: String,
    /// When, ms since the epoch.
    pub at_unix_ms: u64,
}

/// A rule keeping a peer out.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReasonView {
    /// `down`, `admin`, `probe_down`, `excluded`, `awaiting_probe`,
    /// `probation`, `slow`, `stuck`, `full`.
    pub rule: Rule,
    /// Since when, ms since the epoch.
    pub since_unix_ms: Option<u64>,
    /// Until when (passive exclusion), ms since the epoch.
    pub until_unix_ms: Option<u64>,
    /// Numbers of the rule: `fails/max_fails`, `conns/max_conns`, streaks.
    pub detail: String,
    /// `passive_penalty`: the nth exclusion in a row (0: no penalty).
    #[serde(default)]
    pub nth: u32,
}

/// One event.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EventView {
    /// Sequence number.
    pub seq: u64,
    /// When, ms since the epoch.
    pub at_unix_ms: u64,
    /// Upstream.
    pub upstream: String,
    /// Peer address.
    pub peer: String,
    /// `excluded`, `trial_request`, `readmitted`, `probation_started`,
    /// `probation_passed`, `probe_readmitted`, `slow_start`, `max_ejected`,
    /// `probe_up`, `probe_down`, `admin`; `vigil check`: `render`,
    /// `reload`, `reload_failed`, `rollback`.
    pub kind: String,
    /// The sentence.
    pub text: String,
}

/// The status of every upstream of `registry`.
pub fn status(registry: &Registry, clock: &dyn Clock) -> StatusDoc {
    let now = clock.now();
    StatusDoc {
        generation: registry.generation(),
        now_unix_ms: clock.unix_ms(now),
        upstreams: registry
            .upstreams()
            .iter()
            .map(|u| upstream_view(u, clock, now))
            .collect(),
        nginx: None,
        last_reload: None,
    }
}

/// The view of one upstream.
pub fn upstream_view(up: &Upstream, clock: &dyn Clock, now: Timestamp) -> UpstreamView {
    let cfg = up.config();
    UpstreamView {
        name: cfg.name.clone(),
        balancer: balancer_name(&cfg.balancer),
        single: up.is_single(),
        check: cfg.check.as_ref().map(|c| CheckView {
            kind: match c.kind {
                CheckKind::Tcp => "tcp",
                CheckKind::Http => "http",
                CheckKind::Https => "https",
            }
            .into(),
            interval_ms: crate::clock::duration_ms(c.interval),
            rise: c.rise.get(),
            fall: c.fall.get(),
            timeout_ms: crate::clock::duration_ms(c.timeout),
        }),
        rules: rules_view(up, now),
        peers: up.status(now).iter().map(|s| peer_view(s, clock)).collect(),
    }
}

fn rules_view(up: &Upstream, now: Timestamp) -> RulesView {
    let r: &HealthRules = &up.config().rules;
    let mut count = Vec::new();
    if r.count.after_header {
        count.push("after_header".to_string());
    }
    if r.count.last_try {
        count.push("last_try".to_string());
    }
    RulesView {
        passive_count: count,
        passive_recovery: r.recovery.word(),
        passive_penalty: r.penalty.map(|p| PenaltyView {
            base_ms: duration_ms(p.base),
            max_ms: duration_ms(p.max),
            jitter_percent: p.jitter_percent,
        }),
        retry_budget: up.retry_budget_now(now).map(|b| RetryBudgetView {
            ratio_percent: b.ratio_percent,
            min_per_sec: b.min_per_sec,
            tokens: b.tokens,
            requests: b.requests,
            retries: b.retries,
            denied: b.denied,
        }),
        hedge: r.hedge.map(|h| HedgeView {
            after: h.after.word(),
            max: h.max.get(),
            after_now_ms: up.hedge_delay_now(now).map(|d| d.as_secs_f64() * 1000.0),
        }),
        max_ejected: up.max_ejected_now(now).map(|m| MaxEjectedView {
            percent: m.percent,
            in_service: m.in_service,
            ejected: m.ejected,
            allowed: m.allowed,
            keep: r.keep_in_service.map_or(1, |k| k.get()),
        }),
        eject_stuck: r.eject_stuck.map(|s| EjectStuckView {
            factor: s.factor,
            min_ms: duration_ms(s.min),
            threshold_ms: up
                .stuck_now(now)
                .map_or(s.min, |n| n.threshold)
                .as_secs_f64()
                * 1000.0,
        }),
        eject_slow: r.eject_slow.map(|s| EjectSlowView {
            factor: s.factor,
            window_ms: duration_ms(s.window),
            min_requests: s.min_requests,
            min_ms: duration_ms(s.min),
        }),
        health_preset: r.preset.map(|p| {
            let supplied = p.supplied.names();
            PresetView {
                name: p.preset.word().into(),
                written: HealthRules::DIRECTIVES
                    .iter()
                    .filter(|d| **d != "health_preset" && !supplied.contains(d))
                    .filter(|d| written(r, d))
                    .map(|d| d.to_string())
                    .collect(),
                supplied: supplied.into_iter().map(String::from).collect(),
            }
        }),
        header_time: up.measures_latency().then(|| HeaderTimeView {
            p50_us: up
                .header_time_quantile(0.5, now)
                .map(crate::clock::duration_us),
            p99_us: up
                .header_time_quantile(0.99, now)
                .map(crate::clock::duration_us),
        }),
    }
}

/// Whether rule directive `name` is set to something other than nginx's
/// default (what a preset's "written beside it" lists).
fn written(r: &HealthRules, name: &str) -> bool {
    match name {
        "passive_count" => r.count.after_header || r.count.last_try,
        "passive_recovery" => r.recovery != crate::config::Recovery::Window,
        "passive_penalty" => r.penalty.is_some(),
        "max_ejected" => r.max_ejected.is_some(),
        "eject_stuck" => r.eject_stuck.is_some(),
        "eject_slow" => r.eject_slow.is_some(),
        _ => false,
    }
}

/// The view of one rule in force.
pub fn reason_view(r: &Ineligible, clock: &dyn Clock) -> ReasonView {
    let ms = |t: Timestamp| (t != Timestamp(0)).then(|| clock.unix_ms(t));
    let view = |since: Option<u64>, until: Option<u64>, detail: String| ReasonView {
        rule: r.rule(),
        since_unix_ms: since,
        until_unix_ms: until,
        detail,
        nth: 0,
    };
    match r {
        Ineligible::ConfigDown => view(None, None, "marked down in the configuration".into()),
        Ineligible::Admin { state, since } => view(ms(*since), None, state.to_string()),
        Ineligible::ProbeDown {
            since,
            fail_streak,
            rise_needed,
        } => view(
            ms(*since),
            None,
            format!("{fail_streak} failed probe(s) in a row; {rise_needed} pass(es) needed"),
        ),
        Ineligible::Excluded {
            fails,
            max_fails,
            since,
            until,
            nth,
        } => ReasonView {
            nth: *nth,
            ..view(
                ms(*since),
                Some(clock.unix_ms(*until)),
                format!("{fails}/{max_fails} failures"),
            )
        },
        Ineligible::AwaitingProbe { fails, since } => view(
            ms(*since),
            None,
            format!("{fails} failure(s); waiting for a passing probe"),
        ),
        Ineligible::Probation { successes, needed } => view(
            None,
            None,
            format!("{successes}/{needed} successes in a row; one request in flight"),
        ),
        Ineligible::Full { conns, max_conns } => {
            view(None, None, format!("{conns}/{max_conns} connections"))
        }
        Ineligible::Slow {
            figure,
            median,
            max,
            since,
            until,
            nth,
        } => ReasonView {
            nth: *nth,
            ..view(
                ms(*since),
                Some(clock.unix_ms(*until)),
                match max {
                    Some(max) => format!(
                        "median time-to-header {} above eject_slow max={}",
                        micros_text(*figure),
                        micros_text(*max)
                    ),
                    None => format!(
                        "median time-to-header {} against the other peers' {}",
                        micros_text(*figure),
                        micros_text(*median)
                    ),
                },
            )
        },
        Ineligible::Stuck {
            since,
            waited,
            threshold,
        } => view(
            ms(*since),
            None,
            format!(
                "an attempt has waited {} for its header, over the {} threshold",
                micros_text(*waited),
                micros_text(*threshold)
            ),
        ),
    }
}

/// A duration for people: `1.23 ms`, `250 µs` (three significant digits).
pub(crate) fn micros_text(d: std::time::Duration) -> String {
    crate::clock::human_us(crate::clock::duration_us(d))
}

fn peer_view(s: &PeerStatus, clock: &dyn Clock) -> PeerView {
    let cfg = s.peer.config();
    let ms = |t: Timestamp| (t != Timestamp(0)).then(|| clock.unix_ms(t));
    let reasons: Vec<ReasonView> = s.reasons.iter().map(|r| reason_view(r, clock)).collect();
    let state = PeerState::of(&s.reasons);
    let ramp = s.peer.ramp_until();
    let halved = s.peer.halved_until();
    let halved = (halved != Timestamp(0) && clock.now() < halved).then_some(halved);
    PeerView {
        address: s.peer.name().to_string(),
        server: (**s.peer.name() != *cfg.address).then(|| cfg.address.clone()),
        addr: s.peer.addr_text().to_string(),
        backup: s.backup,
        state,
        weight: cfg.weight.get(),
        weight_now: s.weight_now,
        slow_start_ms: cfg.slow_start.map(duration_ms),
        ramp_until_unix_ms: (s.weight_now < cfg.weight.get())
            .then(|| ms(ramp))
            .flatten(),
        halved_until_unix_ms: halved.and_then(ms),
        halved_by: halved
            .and_then(|_| s.peer.halved_by())
            .map(|b| b.to_string()),
        penalty_nth: s.passive.penalty_nth,
        probation: s
            .probation
            .map(|(successes, needed)| ProbationView { successes, needed }),
        effective_weight: s.passive.effective_weight,
        conns: s.peer.conns(),
        max_conns: cfg.max_conns,
        fails: s.passive.fails,
        max_fails: cfg.max_fails,
        fail_timeout_ms: crate::clock::duration_ms(cfg.fail_timeout),
        last_failure_unix_ms: (s.passive.fails > 0).then(|| clock.unix_ms(s.passive.accessed)),
        admin: s.peer.admin().to_string(),
        active: s.health.state.map(|st| ActiveView {
            state: match st {
                HealthState::Up => "up",
                HealthState::Down => "down",
            }
            .into(),
            decided: s.health.decided,
            rise_streak: s.health.ok_streak,
            fall_streak: s.health.fail_streak,
            since_unix_ms: ms(s.health.since),
            last_probe: s.last_probe.as_ref().map(|p| ProbeView {
                ok: p.ok,
                phase: p.phase.map(|ph| ph.to_string()),
                latency_ms: p.latency.as_secs_f64() * 1000.0,
                detail: p.detail.clone(),
                at_unix_ms: clock.unix_ms(p.at),
            }),
        }),
        reasons,
        waived: s.waived.iter().map(|r| reason_view(r, clock)).collect(),
        nginx: None,
        header_median_us: s
            .header_figure
            .and_then(|f| f.median)
            .map(crate::clock::duration_us),
        header_requests: s.header_figure.map(|f| f.requests),
        waiting: s.waiting.map(|w| w.attempts),
        oldest_wait_ms: s
            .waiting
            .filter(|w| w.attempts > 0)
            .map(|w| duration_ms(w.oldest)),
    }
}

/// An event for the API.
pub fn event_view(e: &Event) -> EventView {
    EventView {
        seq: e.seq,
        at_unix_ms: e.unix_ms,
        upstream: e.upstream.to_string(),
        peer: e.peer.to_string(),
        kind: e.kind.name().to_string(),
        text: e.kind.to_string(),
    }
}

fn balancer_name(b: &Balancer) -> String {
    match b {
        Balancer::RoundRobin => "round_robin".into(),
        Balancer::LeastConn => "least_conn".into(),
        Balancer::Hash { key, consistent } => {
            format!("hash {key}{}", if *consistent { " consistent" } else { "" })
        }
        Balancer::IpHash => "ip_hash".into(),
        Balancer::Random { two: false } => "random".into(),
        Balancer::Random { two: true } => "random two".into(),
    }
}

impl EventKind {
    /// Whether the event takes the peer out of rotation.
    pub fn is_down(&self) -> bool {
        matches!(
            self,
            EventKind::Excluded { .. }
                | EventKind::ProbeDown { .. }
                | EventKind::SlowEjected { .. }
                | EventKind::Stuck { .. }
        )
    }
}
