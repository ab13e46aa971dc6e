//! What the admin API serves and the CLI prints: serializable views of every
//! upstream and peer at one moment, and the plain-sentence explanation of
//! why a peer does or does not get traffic ([`explain`]). Pure functions of
//! core state, so `vigil serve`, `vigil check` and the CLI share them.

mod explain;

use serde::{Deserialize, Serialize};

use crate::clock::{Clock, Timestamp};
use crate::config::{Balancer, CheckKind};
use crate::event::{Event, EventKind};
use crate::health::HealthState;
use crate::registry::Registry;
use crate::upstream::{Ineligible, PeerStatus, Upstream};

pub use explain::explain;

/// `GET /api/status`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StatusDoc {
    /// Configuration generation (1 = first load).
    pub generation: u64,
    /// When this was taken, milliseconds since the Unix epoch.
    pub now_unix_ms: u64,
    /// Every upstream in config order.
    pub upstreams: Vec<UpstreamView>,
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
    /// Primaries, then backups.
    pub peers: Vec<PeerView>,
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
    /// Address as configured.
    pub address: String,
    /// A backup server.
    pub backup: bool,
    /// `eligible`, or the first rule that keeps it out: `down`, `admin_down`,
    /// `draining`, `probe_down`, `excluded`, `full`.
    pub state: String,
    /// Configured weight.
    pub weight: u32,
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
    /// `down`, `admin`, `probe_down`, `excluded`, `full`.
    pub rule: String,
    /// Since when, ms since the epoch.
    pub since_unix_ms: Option<u64>,
    /// Until when (passive exclusion), ms since the epoch.
    pub until_unix_ms: Option<u64>,
    /// Numbers of the rule: `fails/max_fails`, `conns/max_conns`, streaks.
    pub detail: String,
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
    /// `excluded`, `trial_request`, `readmitted`, `probe_up`, `probe_down`, `admin`.
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
        peers: up.status(now).iter().map(|s| peer_view(s, clock)).collect(),
    }
}

fn peer_view(s: &PeerStatus, clock: &dyn Clock) -> PeerView {
    let cfg = s.peer.config();
    let ms = |t: Timestamp| (t != Timestamp(0)).then(|| clock.unix_ms(t));
    let reasons: Vec<ReasonView> = s
        .reasons
        .iter()
        .map(|r| match r {
            Ineligible::ConfigDown => ReasonView {
                rule: "down".into(),
                since_unix_ms: None,
                until_unix_ms: None,
                detail: "marked down in the configuration".into(),
            },
            Ineligible::Admin { state, since } => ReasonView {
                rule: "admin".into(),
                since_unix_ms: ms(*since),
                until_unix_ms: None,
                detail: state.to_string(),
            },
            Ineligible::ProbeDown {
                since,
                fail_streak,
                rise_needed,
            } => ReasonView {
                rule: "probe_down".into(),
                since_unix_ms: ms(*since),
                until_unix_ms: None,
                detail: format!(
                    "{fail_streak} failed probe(s) in a row; {rise_needed} pass(es) needed"
                ),
            },
            Ineligible::Excluded {
                fails,
                max_fails,
                since,
                until,
            } => ReasonView {
                rule: "excluded".into(),
                since_unix_ms: ms(*since),
                until_unix_ms: Some(clock.unix_ms(*until)),
                detail: format!("{fails}/{max_fails} failures"),
            },
            Ineligible::Full { conns, max_conns } => ReasonView {
                rule: "full".into(),
                since_unix_ms: None,
                until_unix_ms: None,
                detail: format!("{conns}/{max_conns} connections"),
            },
        })
        .collect();
    let state = match s.reasons.first() {
        None => "eligible",
        Some(Ineligible::ConfigDown) => "down",
        Some(Ineligible::Admin { state, .. }) if *state == crate::peer::AdminState::Drain => {
            "draining"
        }
        Some(Ineligible::Admin { .. }) => "admin_down",
        Some(Ineligible::ProbeDown { .. }) => "probe_down",
        Some(Ineligible::Excluded { .. }) => "excluded",
        Some(Ineligible::Full { .. }) => "full",
    };
    PeerView {
        address: cfg.address.clone(),
        backup: s.backup,
        state: state.into(),
        weight: cfg.weight.get(),
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
            EventKind::Excluded { .. } | EventKind::ProbeDown { .. }
        )
    }
}
