//! One record per configured server, shared by every thread and every
//! route that uses the upstream.
//!
//! The fields another component writes while the proxy reads them live
//! here as atomics: the active-connection count, the admin state and the
//! active-check state. nginx's passive accounting (`fails`, `accessed`,
//! `checked`, `effective_weight`, `current_weight`) moves several fields of
//! several peers together on every pick, so it lives in the upstream tier's
//! short critical section instead (see `upstream::tier` and
//! `docs/architecture.md`).

use std::fmt;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use crate::clock::Timestamp;
use crate::config::ServerConfig;
use crate::health::ActiveHealth;

/// Index of a peer inside its upstream (config order, primaries then backups).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PeerId(pub u32);

/// The operator's say over a peer, set through the admin API.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AdminState {
    /// Normal.
    Up,
    /// No requests.
    Down,
    /// No new requests; in-flight ones finish.
    Drain,
}

/// One backend server of one upstream.
pub struct Peer {
    id: PeerId,
    upstream: Arc<str>,
    name: Arc<str>,
    addr_text: Arc<str>,
    config: ServerConfig,
    conns: AtomicU32,
    /// A copy of the passive `fails` (written under the tier lock), so a
    /// success on a peer without failures needs no lock.
    fails_hint: AtomicU32,
    admin: AtomicU8,
    admin_since: AtomicU64,
    /// End of the `slow_start` ramp (0: none), written under the tier lock.
    ramp_until: AtomicU64,
    /// Fleet `share_passive`: end of a halving of the weight another
    /// member asked for (0: none), written under the tier lock.
    halved_until: AtomicU64,
    /// The member that asked for it.
    halved_by: Mutex<Option<Arc<str>>>,
    health: ActiveHealth,
    last_probe: Mutex<Option<crate::health::ProbeReport>>,
}

// === impl AdminState ===

impl AdminState {
    fn from_u8(v: u8) -> Self {
        match v {
            1 => AdminState::Down,
            2 => AdminState::Drain,
            _ => AdminState::Up,
        }
    }

    fn as_u8(self) -> u8 {
        match self {
            AdminState::Up => 0,
            AdminState::Down => 1,
            AdminState::Drain => 2,
        }
    }

    /// The word used in the API and CLI.
    pub fn as_str(self) -> &'static str {
        match self {
            AdminState::Up => "up",
            AdminState::Down => "down",
            AdminState::Drain => "drain",
        }
    }
}

impl fmt::Display for AdminState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for AdminState {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "up" => Ok(AdminState::Up),
            "down" => Ok(AdminState::Down),
            "drain" => Ok(AdminState::Drain),
            other => Err(format!(
                "unknown admin state \"{other}\", expected up, down or drain"
            )),
        }
    }
}

// === impl Peer ===

impl Peer {
    /// A peer for `config`, with active-check state per `health`.
    pub(crate) fn new(
        id: PeerId,
        upstream: Arc<str>,
        config: ServerConfig,
        health: ActiveHealth,
    ) -> Self {
        Self {
            id,
            upstream,
            name: config.peer_name().into(),
            addr_text: config.peer_addr().to_string().into(),
            config,
            conns: AtomicU32::new(0),
            fails_hint: AtomicU32::new(0),
            admin: AtomicU8::new(AdminState::Up.as_u8()),
            admin_since: AtomicU64::new(0),
            ramp_until: AtomicU64::new(0),
            halved_until: AtomicU64::new(0),
            halved_by: Mutex::new(None),
            health,
            last_probe: Mutex::new(None),
        }
    }

    /// Index inside the upstream.
    pub fn id(&self) -> PeerId {
        self.id
    }

    /// The upstream's name.
    pub fn upstream(&self) -> &Arc<str> {
        &self.upstream
    }

    /// The peer's name ([`ServerConfig::peer_name`]): the address as
    /// configured, or the resolved address when the configured name has
    /// several.
    pub fn name(&self) -> &Arc<str> {
        &self.name
    }

    /// The resolved socket address as text (`$upstream_addr`), made once.
    pub fn addr_text(&self) -> &Arc<str> {
        &self.addr_text
    }

    /// The server's configuration.
    pub fn config(&self) -> &ServerConfig {
        &self.config
    }

    /// Requests in flight to this peer.
    pub fn conns(&self) -> u32 {
        self.conns.load(Ordering::Relaxed)
    }

    pub(crate) fn fails_hint(&self) -> u32 {
        self.fails_hint.load(Ordering::Acquire)
    }

    pub(crate) fn set_fails_hint(&self, fails: u32) {
        self.fails_hint.store(fails, Ordering::Release);
    }

    pub(crate) fn acquire(&self) {
        self.conns.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn release(&self) {
        // Never wraps: every release pairs with one acquire (PeerGuard).
        let _ = self
            .conns
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| c.checked_sub(1));
    }

    /// Whether `max_conns` is reached.
    pub fn is_full(&self) -> bool {
        self.config.max_conns != 0 && self.conns() >= self.config.max_conns
    }

    /// The admin state.
    pub fn admin(&self) -> AdminState {
        AdminState::from_u8(self.admin.load(Ordering::Acquire))
    }

    /// When the admin state last changed.
    pub fn admin_since(&self) -> Timestamp {
        Timestamp(self.admin_since.load(Ordering::Relaxed))
    }

    /// Set the admin state; returns the previous one.
    pub(crate) fn set_admin(&self, to: AdminState, now: Timestamp) -> AdminState {
        let from = AdminState::from_u8(self.admin.swap(to.as_u8(), Ordering::AcqRel));
        if from != to {
            self.admin_since.store(now.0, Ordering::Relaxed);
        }
        from
    }

    /// When the `slow_start` weight ramp ends (0: no ramp; a past time:
    /// ended, not yet cleared).
    pub fn ramp_until(&self) -> Timestamp {
        Timestamp(self.ramp_until.load(Ordering::Relaxed))
    }

    pub(crate) fn set_ramp_until(&self, until: Timestamp) {
        self.ramp_until.store(until.0, Ordering::Relaxed);
    }

    /// When a fleet member's halving of the weight ends (0: none; a past
    /// time: ended, not yet cleared). See [`crate::upstream::Upstream::halve_weight`].
    pub fn halved_until(&self) -> Timestamp {
        Timestamp(self.halved_until.load(Ordering::Relaxed))
    }

    pub(crate) fn set_halved_until(&self, until: Timestamp) {
        self.halved_until.store(until.0, Ordering::Relaxed);
    }

    /// The fleet member that halved the weight (while [`Peer::halved_until`] is set).
    pub fn halved_by(&self) -> Option<Arc<str>> {
        self.halved_by.lock().ok().and_then(|g| g.clone())
    }

    pub(crate) fn set_halved_by(&self, by: Option<Arc<str>>) {
        if let Ok(mut g) = self.halved_by.lock() {
            *g = by;
        }
    }

    /// The active-check state.
    pub fn health(&self) -> &ActiveHealth {
        &self.health
    }

    /// The last probe result, if any.
    pub fn last_probe(&self) -> Option<crate::health::ProbeReport> {
        self.last_probe.lock().ok().and_then(|g| g.clone())
    }

    pub(crate) fn set_last_probe(&self, report: crate::health::ProbeReport) {
        if let Ok(mut g) = self.last_probe.lock() {
            *g = Some(report);
        }
    }

    /// Whether the admin and active-check states let new requests through
    /// (passive state and `max_conns` are checked by the balancer).
    pub fn is_routable(&self) -> bool {
        self.admin() == AdminState::Up && self.health.allows_traffic()
    }
}

impl fmt::Debug for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Peer")
            .field("upstream", &self.upstream)
            .field("name", &self.name)
            .field("conns", &self.conns())
            .field("admin", &self.admin())
            .finish()
    }
}
