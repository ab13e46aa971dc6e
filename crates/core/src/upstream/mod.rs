//! An upstream group: its peers, their shared passive state, the balancing
//! method, and the per-request [`Selection`] that walks them with nginx's
//! exact rules.
//!
//! ```text
//! let mut sel = upstream.begin(key, policy, facts, now);
//! loop {
//!     let guard = upstream.select(&mut sel, now)?;     // Err: 502 "no live upstreams"
//!     match attempt(guard.peer()) {
//!         Header(status) => match sel.on_status(guard, status, now) {
//!             StatusVerdict::Retry(_) => continue,
//!             StatusVerdict::PassThrough(mut guard, _) => {
//!                 stream the body;
//!                 if it broke: guard.fail_after_header(class, now);  // passive_count after_header
//!                 drop(guard)
//!             }
//!         },
//!         Failed(f) => match sel.on_failure(guard, f, now) {
//!             FailureVerdict::Retry(_) => continue,
//!             FailureVerdict::Fail { status, .. } => answer status,
//!         },
//!     }
//! }
//! ```

mod budget;
mod build;
mod fast;
mod halving;
mod hedge;
mod latency;
mod pick;
pub mod policy;
mod selection;
mod slot;
mod status;
mod tier;
mod tried;
mod verdict;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::balancer::{ip_hash_key, Method};
use crate::clock::{Clock, Timestamp};
use crate::config::{InitialState, UpstreamConfig};
use crate::event::{Event, EventBus, EventKind};
use crate::health::ProbeReport;
use crate::outcome::{NextUpstream, PeerOutcome, RequestFacts};
use crate::peer::{AdminState, Peer, PeerId};

pub use budget::{BudgetNow, GovernorClock};
pub use latency::{PeerFigure, MIN_SAMPLES, UPSTREAM_WINDOW};
pub use policy::{Ineligible, PeerState, Rule};
pub use status::{Ejection, MaxEjectedNow, PeerStatus, ProbeWanted, StuckNow, WaitingNow};
pub use tier::PassiveView;
use tier::Tier;
pub use tried::Tried;
pub use verdict::{Accounting, CountRule, FailureVerdict, RetryDenied, StatusVerdict};

/// One upstream group, shared by every route that names it.
pub struct Upstream {
    name: Arc<str>,
    config: UpstreamConfig,
    peers: Box<[Arc<Peer>]>,
    primary: Tier,
    backup: Option<Tier>,
    method: Method,
    /// `retry_budget`, if set (kept over a reload that leaves it unchanged).
    budget: Option<Arc<budget::RetryBudgetState>>,
    events: Arc<EventBus>,
    clock: Arc<dyn Clock>,
    /// splitmix64 state for the `passive_penalty` jitter.
    jitter: AtomicU64,
    /// Time-to-header figures and waiting attempts, when a rule needs them.
    latency: Option<Box<latency::Latency>>,
}

/// The retry limits of a location (`proxy_next_upstream*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct RetryPolicy {
    /// Which failures may move the request on.
    pub next_upstream: NextUpstream,
    /// `proxy_next_upstream_tries`: attempts in all, 0 = as many as peers.
    pub tries: u32,
    /// `proxy_next_upstream_timeout`: no new attempt after this much time.
    pub timeout: Option<Duration>,
}

/// The request's balancing key.
#[derive(Clone, Copy, Debug)]
pub enum SelectKey<'a> {
    /// No key (round robin, least_conn, random).
    None,
    /// The evaluated `hash` key.
    Hash(&'a [u8]),
    /// The client address, for `ip_hash`.
    Client(std::net::IpAddr),
}

/// The per-request walk over an upstream's peers (nginx's
/// `ngx_http_upstream_rr_peer_data_t` plus `u->peer.tries`).
#[derive(Debug)]
pub struct Selection {
    tried: Tried,
    in_backup: bool,
    tries: u32,
    started: Timestamp,
    policy: RetryPolicy,
    facts: RequestFacts,
    attempts: u32,
    /// Attempts picked and not yet handed back (more than one while a
    /// hedge races).
    in_flight: u32,
    /// Hedges sent.
    hedges: u32,
    key: KeyState,
}

#[derive(Debug)]
enum KeyState {
    None,
    Hash {
        key: Box<[u8]>,
        hash: u64,
        rehash: u64,
        tries: u32,
    },
    Consistent {
        point: u64,
        tries: u32,
        empty: bool,
    },
    Ip {
        addr: [u8; 16],
        len: usize,
        hash: u32,
        tries: u32,
    },
    Random {
        rng: u64,
        tries: u32,
    },
}

/// A peer picked for one attempt. Holds the peer's connection count; on
/// drop it is released and the attempt counts as a success for accounting
/// (nginx frees the peer with state 0 at finalize), unless it was handed to
/// [`Selection::on_status`] or [`Selection::on_failure`], or a rule of
/// `passive_count` already charged it a failure (then drop only releases).
pub struct PeerGuard {
    upstream: Arc<Upstream>,
    index: u32,
    done: bool,
    /// What a `passive_count` rule charged while the guard is still held.
    charged: Option<Accounting>,
    /// When the attempt started, on core's clock.
    started: Timestamp,
    /// The same in µs when core measures time-to-header (0: not measured,
    /// or no longer: the header came or the attempt ended).
    started_us: u64,
}

/// No peer is eligible: nginx's "no live upstreams", answered with 502.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("no live upstreams")]
pub struct NoLiveUpstreams;

// === impl Upstream ===

impl Upstream {
    /// Build an upstream from its configuration.
    pub fn new(config: UpstreamConfig, events: Arc<EventBus>, clock: Arc<dyn Clock>) -> Self {
        Self::with_previous(config, None, events, clock)
    }

    /// Seed the generator of the `passive_penalty` jitter (tests and
    /// simulations; by default it is seeded at random).
    pub fn seed_jitter(&self, seed: u64) {
        self.jitter.store(seed, Ordering::Relaxed);
    }

    /// A random number for the `passive_penalty` jitter (splitmix64).
    fn jitter(&self) -> u64 {
        let mut z = self
            .jitter
            .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
            .wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// The same upstream without the round-robin fast path: nginx's scan on
    /// every pick (the reference the fast path is tested against).
    #[cfg(test)]
    pub(crate) fn without_fast_path(mut self) -> Self {
        for tier in std::iter::once(&mut self.primary).chain(self.backup.as_mut()) {
            tier.disable_fast_path();
        }
        self
    }

    /// Whether the primary tier follows the precomputed cycle right now.
    #[cfg(test)]
    pub(crate) fn on_fast_path(&self) -> bool {
        self.primary.lock().fast.is_some()
    }

    /// A peer's routability changed: the fast path must know.
    fn refresh(&self, peer: &Peer) {
        if let Some(tier) = self.tier_of(peer.id()) {
            let mut st = tier.lock();
            tier.refresh(&mut st, peer.id().0 as usize - tier.offset, peer);
        }
    }

    /// The upstream's name.
    pub fn name(&self) -> &Arc<str> {
        &self.name
    }

    /// The clock its rules run on.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// Its configuration.
    pub fn config(&self) -> &UpstreamConfig {
        &self.config
    }

    /// All peers: primaries in config order, then backups.
    pub fn peers(&self) -> &[Arc<Peer>] {
        &self.peers
    }

    /// The peer with this address text, if any.
    pub fn peer_by_name(&self, name: &str) -> Option<&Arc<Peer>> {
        self.peers.iter().find(|p| &**p.name() == name)
    }

    /// The event bus transitions go to.
    pub fn events(&self) -> &Arc<EventBus> {
        &self.events
    }

    /// nginx's `peers->single`.
    pub fn is_single(&self) -> bool {
        self.primary.single
    }

    fn tier_of(&self, id: PeerId) -> Option<&Tier> {
        let i = id.0 as usize;
        if i < self.primary.offset + self.primary.len() {
            Some(&self.primary)
        } else {
            self.backup.as_ref().filter(|b| i < b.offset + b.len())
        }
    }

    /// Start selecting for one client request.
    pub fn begin(
        &self,
        key: SelectKey<'_>,
        policy: RetryPolicy,
        facts: RequestFacts,
        now: Timestamp,
    ) -> Selection {
        let seed = match self.method {
            Method::Random { .. } => rand::random(),
            _ => 0,
        };
        self.begin_seeded(key, policy, facts, now, seed)
    }

    /// [`Upstream::begin`] with a fixed seed for `random` (tests, simulations).
    pub fn begin_seeded(
        &self,
        key: SelectKey<'_>,
        policy: RetryPolicy,
        facts: RequestFacts,
        now: Timestamp,
        seed: u64,
    ) -> Selection {
        let mut tries = self.primary.tries + self.backup.as_ref().map_or(0, |b| b.tries);
        if policy.tries != 0 && tries > policy.tries {
            tries = policy.tries;
        }
        let key = match (&self.method, key) {
            (Method::Hash(_), SelectKey::Hash(k)) => KeyState::Hash {
                key: k.into(),
                hash: 0,
                rehash: 0,
                tries: if k.is_empty() { u32::MAX } else { 0 },
            },
            (Method::Consistent(ring), SelectKey::Hash(k)) => KeyState::Consistent {
                point: ring.find(crc32fast::hash(k)) as u64,
                tries: 0,
                empty: k.is_empty(),
            },
            (Method::Consistent(_), _) => KeyState::Consistent {
                point: 0,
                tries: 0,
                empty: true,
            },
            (Method::Hash(_), _) => KeyState::Hash {
                key: Box::default(),
                hash: 0,
                rehash: 0,
                tries: u32::MAX,
            },
            (Method::IpHash(_), key) => {
                let ip = match key {
                    SelectKey::Client(ip) => Some(ip),
                    _ => None,
                };
                // nginx uses a pseudo address of three zero bytes for
                // non-IP clients (unix sockets).
                let (addr, len) = ip.map_or(([0u8; 16], 3), ip_hash_key);
                KeyState::Ip {
                    addr,
                    len,
                    hash: 89,
                    tries: 0,
                }
            }
            (Method::Random { .. }, _) => KeyState::Random {
                rng: seed | 1,
                tries: 0,
            },
            _ => KeyState::None,
        };
        if let Some(b) = &self.budget {
            b.deposit(now);
        }
        Selection {
            tried: Tried::default(),
            in_backup: false,
            tries,
            started: now,
            policy,
            facts,
            attempts: 0,
            in_flight: 0,
            hedges: 0,
            key,
        }
    }

    /// Pick a peer for the next attempt.
    pub fn select(
        self: &Arc<Self>,
        sel: &mut Selection,
        now: Timestamp,
    ) -> Result<PeerGuard, NoLiveUpstreams> {
        let mut events = Vec::new();
        let picked = if !sel.in_backup {
            match pick::primary(self, sel, now, &mut events) {
                Some(i) => Some(i),
                None => self.backup.as_ref().and_then(|b| {
                    sel.in_backup = true;
                    sel.tried.clear();
                    pick::tier(self, b, sel, now, &mut events)
                }),
            }
        } else {
            self.backup
                .as_ref()
                .and_then(|b| pick::tier(self, b, sel, now, &mut events))
        };
        self.publish(events, now);
        let index = picked.ok_or(NoLiveUpstreams)?;
        sel.attempts += 1;
        sel.in_flight += 1;
        let started_us = match &self.latency {
            Some(l) => {
                let us = self.clock.now_micros().max(1);
                l.started(index, us);
                us
            }
            None => 0,
        };
        Ok(PeerGuard {
            upstream: self.clone(),
            index: index as u32,
            done: false,
            charged: None,
            started: now,
            started_us,
        })
    }

    /// Free a peer after an attempt (`ngx_http_upstream_free_round_robin_peer`):
    /// what was charged, and whether the tier is `single` (no retry possible).
    fn free(
        &self,
        index: u32,
        outcome: PeerOutcome,
        started: Timestamp,
        now: Timestamp,
    ) -> (Accounting, bool) {
        let freed = self.account(index, outcome, started, now);
        self.peers[index as usize].release();
        freed
    }

    /// The accounting of [`Upstream::free`] without releasing the peer's
    /// connection count (the attempt's response is still streaming).
    fn account(
        &self,
        index: u32,
        outcome: PeerOutcome,
        started: Timestamp,
        now: Timestamp,
    ) -> (Accounting, bool) {
        let peer = &self.peers[index as usize];
        let Some(tier) = self.tier_of(peer.id()) else {
            return (Accounting::default(), false);
        };
        let mut events = Vec::new();
        let freed = tier.account(self, index as usize, outcome, started, now, &mut events);
        self.publish(events, now);
        freed
    }

    fn publish(&self, events: Vec<(u32, EventKind)>, now: Timestamp) {
        if events.is_empty() {
            return;
        }
        let now = if now == Timestamp(0) {
            self.clock.now()
        } else {
            now
        };
        for (index, kind) in events {
            self.emit(&self.peers[index as usize], kind, now);
        }
    }

    fn emit(&self, peer: &Peer, kind: EventKind, now: Timestamp) {
        self.events.publish(Event {
            seq: 0,
            at: now,
            unix_ms: self.clock.unix_ms(now),
            upstream: self.name.clone(),
            peer: peer.name().clone(),
            kind,
        });
    }

    /// Record an active probe result for a peer; publishes the transition.
    pub fn record_probe(
        &self,
        id: PeerId,
        report: ProbeReport,
    ) -> Option<crate::health::Transition> {
        let peer = self.peers.get(id.0 as usize)?;
        let now = report.at;
        // The first state change after start is no readmission (no slow
        // start: the peer was never in rotation, as HAProxy's slowstart).
        let changed_before = peer.health().view().since != Timestamp(0);
        let t = peer.health().record(report.ok, now);
        let came_up = changed_before && t.is_some_and(|t| t.to == crate::health::HealthState::Up);
        let mut readmitted = Vec::new();
        if let Some(tier) = self.tier_of(peer.id()) {
            let recovery = self.config.rules.recovery == crate::config::Recovery::Probe;
            if t.is_some() || (report.ok && recovery) {
                let i = id.0 as usize - tier.offset;
                tier.probe(self, i, report.ok, came_up, now, &mut readmitted);
            }
        }
        let detail = match report.phase {
            Some(phase) => format!(
                "{phase}: {} ({} ms)",
                report.detail,
                report.latency.as_millis()
            ),
            None => format!("{} ({} ms)", report.detail, report.latency.as_millis()),
        };
        peer.set_last_probe(report);
        if let Some(t) = t {
            let kind = match t.to {
                crate::health::HealthState::Up => EventKind::ProbeUp {
                    streak: t.streak,
                    detail,
                },
                crate::health::HealthState::Down => EventKind::ProbeDown {
                    streak: t.streak,
                    detail,
                },
            };
            self.emit(peer, kind, now);
        }
        self.publish(readmitted, now);
        t
    }

    /// Set a peer's admin state; publishes the change.
    pub fn set_admin(&self, id: PeerId, to: AdminState, now: Timestamp) -> Option<AdminState> {
        let peer = self.peers.get(id.0 as usize)?;
        let from = peer.set_admin(to, now);
        if from != to {
            self.refresh(peer);
            self.emit(peer, EventKind::Admin { from, to }, now);
            if to == AdminState::Up {
                if let Some(tier) = self.tier_of(id) {
                    let mut events = Vec::new();
                    tier.admin_up(self, id.0 as usize - tier.offset, now, &mut events);
                    self.publish(events, now);
                }
            }
        }
        Some(from)
    }

    /// Whether the check configuration starts peers down (for status pages).
    pub fn starts_down(&self) -> bool {
        self.config
            .check
            .as_ref()
            .is_some_and(|c| c.initial == InitialState::Down)
    }
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream")
            .field("name", &self.name)
            .field("peers", &self.peers.len())
            .finish()
    }
}

impl RetryPolicy {
    /// The policy of a location's proxy settings.
    pub fn of(settings: &crate::config::ProxySettings) -> Self {
        Self {
            next_upstream: settings.next_upstream,
            tries: settings.next_upstream_tries,
            timeout: settings.next_upstream_timeout,
        }
    }
}

impl Default for RequestFacts {
    fn default() -> Self {
        Self {
            non_idempotent: false,
            body_replayable: true,
            hedgeable: true,
        }
    }
}

#[cfg(test)]
mod tests;
