//! What the session with etcd and the checker share: the live member list,
//! whether this member is in the fleet, the last verdict of each target and
//! where it came from, and the queue of results to publish.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::mpsc;
use vigil_checker::{Checker, Sharing};
use vigil_core::event::{Event, EventBus, EventKind};
use vigil_core::health::ProbeReport;
use vigil_core::upstream::policy::{self, PeerHere, RemoteAnswer, RemoteEjection};
use vigil_core::Clock;

use crate::rendezvous;
use crate::trust::{Ignored, Why};
use crate::view::{FleetView, HistoryView, TargetView, VerdictView};
use crate::wire::{self, PassiveValue, ResultValue};
use crate::FleetOptions;

/// Results waiting to be published at most (a slow etcd drops the
/// newest: the next probe publishes again).
const OUTBOX: usize = 4096;
/// State changes kept for the view.
const HISTORY: usize = 32;

/// What to publish.
#[derive(Debug)]
pub(crate) enum Outgoing {
    /// A probe result of an owned target.
    Result { target: String, value: ResultValue },
    /// A passive ejection (`share_passive`).
    Passive { target: String, value: PassiveValue },
}

pub(crate) struct Shared {
    pub(crate) opts: FleetOptions,
    pub(crate) root: String,
    /// Live members, sorted.
    members: ArcSwap<Vec<String>>,
    /// In the fleet: probe only owned targets. Off while joining and
    /// degraded: probe everything here.
    joined: AtomicBool,
    status: Mutex<Status>,
    verdicts: Mutex<HashMap<String, VerdictView>>,
    /// Writes under the prefix not believed ([`crate::trust`]).
    ignored: Mutex<Ignored>,
    outbox: mpsc::Sender<Outgoing>,
    checker: OnceLock<Weak<Checker>>,
    /// Where state changes go as events (`vigil events`), once given.
    events: OnceLock<(Arc<EventBus>, Arc<dyn Clock>)>,
}

struct Status {
    state: &'static str,
    since: u64,
    reason: Option<String>,
    history: VecDeque<HistoryView>,
}

pub(crate) fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

// === impl Shared ===

impl Shared {
    pub(crate) fn new(opts: FleetOptions) -> (Arc<Self>, mpsc::Receiver<Outgoing>) {
        let (tx, rx) = mpsc::channel(OUTBOX);
        let root = opts.root();
        let shared = Arc::new(Self {
            opts,
            root,
            members: ArcSwap::from_pointee(Vec::new()),
            joined: AtomicBool::new(false),
            status: Mutex::new(Status {
                state: "joining",
                since: unix_ms(),
                reason: None,
                history: VecDeque::new(),
            }),
            verdicts: Mutex::new(HashMap::new()),
            ignored: Mutex::new(Ignored::default()),
            outbox: tx,
            checker: OnceLock::new(),
            events: OnceLock::new(),
        });
        (shared, rx)
    }

    pub(crate) fn attach(&self, checker: &Arc<Checker>) {
        let _ = self.checker.set(Arc::downgrade(checker));
    }

    /// From now on, state changes are events on `bus`; the changes before
    /// (the session starts before the bus is wired) are published now, in
    /// order. Under the status lock, so each change is published once.
    pub(crate) fn publish_to(&self, bus: Arc<EventBus>, clock: Arc<dyn Clock>) {
        let earlier: Vec<HistoryView> = {
            let Ok(s) = self.status.lock() else {
                return;
            };
            if self.events.set((bus, clock)).is_err() {
                return;
            }
            s.history.iter().cloned().collect()
        };
        for h in earlier {
            self.publish(state_name(&h.state), h.detail);
        }
    }

    fn publish(&self, state: &'static str, detail: String) {
        if let Some((bus, clock)) = self.events.get() {
            let at = clock.now();
            bus.publish(Event {
                seq: 0,
                at,
                unix_ms: clock.unix_ms(at),
                upstream: "".into(),
                peer: "".into(),
                kind: EventKind::Fleet { state, detail },
            });
        }
    }

    pub(crate) fn me(&self) -> &str {
        &self.opts.member
    }

    pub(crate) fn is_joined(&self) -> bool {
        self.joined.load(Ordering::Acquire)
    }

    /// The live member list changed.
    pub(crate) fn set_members(&self, mut members: Vec<String>) {
        members.sort();
        members.dedup();
        self.members.store(Arc::new(members));
    }

    pub(crate) fn members(&self) -> Arc<Vec<String>> {
        self.members.load_full()
    }

    /// In the fleet (again): from now on only owned targets are probed.
    pub(crate) fn joined(&self) {
        let n = self.members.load().len();
        let was = self.status_of();
        self.joined.store(true, Ordering::Release);
        let detail = format!("{n} member(s) live; probing this member's share of the targets");
        if was == "degraded" {
            tracing::info!(target: "vigil::fleet", fleet = %self.opts.name, member = %self.me(), members = n, "fleet: etcd is back; rejoined, probing this member's share of the targets again");
        } else {
            tracing::info!(target: "vigil::fleet", fleet = %self.opts.name, member = %self.me(), members = n, "fleet: joined");
        }
        self.change("joined", None, detail);
    }

    /// etcd unreachable or slow: probe every target here until it is back.
    pub(crate) fn degraded(&self, reason: &str) {
        self.joined.store(false, Ordering::Release);
        if self.status_of() == "degraded" {
            if let Ok(mut s) = self.status.lock() {
                s.reason = Some(reason.to_string());
            }
            return;
        }
        tracing::warn!(target: "vigil::fleet", fleet = %self.opts.name, member = %self.me(), error = %reason, "fleet: etcd unreachable or slow; probing every target here until it is back (traffic is not affected)");
        self.change("degraded", Some(reason.to_string()), reason.to_string());
    }

    /// Left the fleet (shutdown).
    pub(crate) fn left(&self) {
        self.joined.store(false, Ordering::Release);
        tracing::info!(target: "vigil::fleet", fleet = %self.opts.name, member = %self.me(), "fleet: left (lease revoked: the others take over this member's targets now)");
        self.change("left", None, "lease revoked".into());
    }

    fn status_of(&self) -> &'static str {
        self.status.lock().map_or("joining", |s| s.state)
    }

    fn change(&self, state: &'static str, reason: Option<String>, detail: String) {
        let wired = {
            let Ok(mut s) = self.status.lock() else {
                return;
            };
            let now = unix_ms();
            s.state = state;
            s.since = now;
            s.reason = reason;
            if s.history.len() == HISTORY {
                s.history.pop_front();
            }
            s.history.push_back(HistoryView {
                at_unix_ms: now,
                state: state.into(),
                detail: detail.clone(),
            });
            self.events.get().is_some()
        };
        if wired {
            self.publish(state, detail);
        }
    }

    /// A write under the prefix was not believed: counted, logged once
    /// per key.
    pub(crate) fn ignore(&self, key: &[u8], why: Why) {
        if let Ok(mut i) = self.ignored.lock() {
            i.note(key, why);
        }
    }

    /// A result another member published (the session checked it is
    /// believed): record it here as active evidence, through the checker's
    /// own path.
    pub(crate) fn remote_result(&self, member: &str, target: &str, value: ResultValue) {
        if member == self.me() {
            return;
        }
        let Some(checker) = self.checker.get().and_then(Weak::upgrade) else {
            return;
        };
        let report = value.report(member);
        let verdict = VerdictView {
            member: member.to_string(),
            ok: value.ok,
            detail: value.detail,
            at_unix_ms: value.at_unix_ms,
        };
        if checker.record_remote(target, report) {
            if let Ok(mut v) = self.verdicts.lock() {
                v.insert(target.to_string(), verdict);
            }
        }
    }

    /// This instance ejected `peer` of `upstream` (passive evidence) for
    /// `penalty_ms`: with `share_passive`, tell the others, who probe it at
    /// once rather than eject it blindly, or, without a check there, halve
    /// its weight for what is left of the penalty.
    pub(crate) fn ejected(&self, upstream: &str, peer: &str, penalty_ms: u64) {
        if !self.opts.share_passive || !self.is_joined() {
            return;
        }
        let Some(checker) = self.checker.get().and_then(Weak::upgrade) else {
            return;
        };
        let target = checker
            .target_of(upstream, peer)
            .unwrap_or_else(|| wire::peer_id(upstream, peer));
        let _ = self.outbox.try_send(Outgoing::Passive {
            target,
            value: PassiveValue {
                upstream: upstream.to_string(),
                peer: peer.to_string(),
                at_unix_ms: unix_ms(),
                penalty_ms: Some(penalty_ms),
            },
        });
    }

    /// Another member ejected a peer passively (the session checked it is
    /// believed): core decides what that does here
    /// ([`policy::remote_ejection`]: a peer with a check here is probed
    /// now, one without has its weight halved for what is left of that
    /// member's penalty); this reads what this member has of the peer and
    /// applies the answer.
    pub(crate) fn remote_ejection(&self, member: &str, target: &str, value: &PassiveValue) {
        if member == self.me() || !self.opts.share_passive {
            return;
        }
        let Some(checker) = self.checker.get().and_then(Weak::upgrade) else {
            return;
        };
        // The target that probes it here: the sender's, or this member's
        // own for the upstream's server of that name.
        let probed = std::iter::once(target.to_string())
            .chain(checker.target_of(&value.upstream, &value.peer))
            .find(|t| checker.has_target(t));
        let registry = checker.registry();
        let found = registry
            .get(&value.upstream)
            .and_then(|up| Some((up, up.peer_by_name(&value.peer)?)));
        let here = match (&probed, found) {
            (Some(_), _) => PeerHere::Checked,
            (None, Some((up, peer))) => PeerHere::Unchecked {
                fail_timeout: peer.config().fail_timeout,
                penalty: up.config().rules.penalty,
            },
            (None, None) => PeerHere::Absent,
        };
        // The members' wall clocks are assumed within trust::MAX_SKEW.
        let heard = RemoteEjection {
            penalty_ms: value.penalty_ms,
            at_unix_ms: value.at_unix_ms,
        };
        let left = match policy::remote_ejection(heard, here, unix_ms()) {
            RemoteAnswer::Ignore => return,
            RemoteAnswer::ProbeNow => {
                if let Some(t) = probed {
                    checker.probe_now(&t);
                }
                tracing::info!(target: "vigil::fleet", %member, upstream = %value.upstream, peer = %value.peer, "fleet: member {member} ejected upstream {} server {} on its traffic; probing it here now instead of ejecting it blindly", value.upstream, value.peer);
                return;
            }
            RemoteAnswer::Halve { ms } => ms,
        };
        let (Some((up, peer)), Some((_, clock))) = (found, self.events.get()) else {
            return;
        };
        let id = peer.id();
        let now = clock.now();
        if !up.halve_weight(id, now.after(Duration::from_millis(left)), member, now) {
            return;
        }
        tracing::info!(target: "vigil::fleet", %member, upstream = %value.upstream, peer = %value.peer, ms = left, "fleet: member {member} ejected upstream {} server {} on its traffic; it has no check here: its weight is halved for {left} ms", value.upstream, value.peer);
        // End it on time even without traffic (a pick would, too).
        let (up, clock) = (Arc::downgrade(up), clock.clone());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(left + 5)).await;
            if let Some(up) = up.upgrade() {
                up.settle_halvings(clock.now());
            }
        });
    }

    pub(crate) fn view(&self) -> FleetView {
        let members = self.members();
        let joined = self.is_joined();
        let mut ids: Vec<String> = self
            .checker
            .get()
            .and_then(Weak::upgrade)
            .map(|c| c.target_keys().iter().map(|k| k.id()).collect())
            .unwrap_or_default();
        ids.sort();
        let verdicts = self.verdicts.lock().map(|v| v.clone()).unwrap_or_default();
        let targets = ids
            .into_iter()
            .map(|id| {
                let owners: Vec<String> = rendezvous::owners(&id, &members, self.opts.replicas)
                    .into_iter()
                    .map(str::to_string)
                    .collect();
                TargetView {
                    probed_here: !joined || owners.iter().any(|o| o == self.me()),
                    owners,
                    last: verdicts.get(&id).cloned(),
                    id,
                }
            })
            .collect();
        let (state, since, reason, history) = match self.status.lock() {
            Ok(s) => (
                s.state.to_string(),
                s.since,
                s.reason.clone(),
                s.history.iter().cloned().collect(),
            ),
            Err(_) => ("joining".into(), 0, None, Vec::new()),
        };
        FleetView {
            fleet: self.opts.name.clone(),
            member: self.me().to_string(),
            state,
            since_unix_ms: since,
            reason,
            replicas: self.opts.replicas,
            ttl_ms: u64::try_from(self.opts.ttl.as_millis()).unwrap_or(u64::MAX),
            members: members.as_ref().clone(),
            targets,
            history,
            ignored_writes: self.ignored.lock().map_or(0, |i| i.count()),
        }
    }
}

impl Sharing for Shared {
    fn owns(&self, id: &str) -> bool {
        // Not in the fleet (joining, degraded): probe everything here.
        !self.is_joined()
            || rendezvous::owns(self.me(), id, &self.members.load(), self.opts.replicas)
    }

    fn probed(&self, id: &str, report: &ProbeReport) {
        let now = unix_ms();
        let value = ResultValue::of(report, now);
        if let Ok(mut v) = self.verdicts.lock() {
            v.insert(
                id.to_string(),
                VerdictView {
                    member: self.me().to_string(),
                    ok: report.ok,
                    detail: report.detail.clone(),
                    at_unix_ms: now,
                },
            );
        }
        if self.is_joined() && self.owns(id) {
            // Full: etcd is slow; this result is lost, the next is sent.
            let _ = self.outbox.try_send(Outgoing::Result {
                target: id.to_string(),
                value,
            });
        }
    }
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fleet")
            .field("fleet", &self.opts.name)
            .field("member", &self.opts.member)
            .field("joined", &self.is_joined())
            .field("members", &self.members.load().len())
            .finish()
    }
}

/// A state's name as the events carry it.
fn state_name(state: &str) -> &'static str {
    match state {
        "joined" => "joined",
        "degraded" => "degraded",
        "left" => "left",
        _ => "joining",
    }
}
