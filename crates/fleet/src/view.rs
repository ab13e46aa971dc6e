//! What `GET /api/fleet` and `vigil status --fleet` show: the members, who
//! probes which target, and where each target's last verdict came from.

use serde::{Deserialize, Serialize};

/// The fleet as this member sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FleetView {
    /// The fleet's name.
    pub fleet: String,
    /// This member's name.
    pub member: String,
    /// `joining` (not yet in the fleet: probing every target here),
    /// `joined`, or `degraded` (etcd unreachable or slow: probing every
    /// target here).
    pub state: String,
    /// Since when, ms since the epoch.
    pub since_unix_ms: u64,
    /// Why degraded (the last etcd error).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Members probing each target.
    pub replicas: usize,
    /// The lease TTL, ms.
    pub ttl_ms: u64,
    /// Live members, by name (this one included once joined).
    pub members: Vec<String>,
    /// Every target of this instance.
    pub targets: Vec<TargetView>,
    /// The last state changes (joined, degraded, rejoined), oldest first.
    pub history: Vec<HistoryView>,
    /// Writes under the fleet's prefix not believed since this member
    /// started (a member key without a lease, a result or ejection of no
    /// live member, under another lease, for a target not its writer's,
    /// or stamped too far ahead or too long ago): each key is logged once.
    #[serde(default)]
    pub ignored_writes: u64,
}

/// One target.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TargetView {
    /// Its id (the same in every member).
    pub id: String,
    /// The members that should probe it (rendezvous over `members`).
    pub owners: Vec<String>,
    /// Whether this instance probes it now (an owner, or not joined).
    pub probed_here: bool,
    /// The last result recorded here, and who probed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last: Option<VerdictView>,
}

/// A result and where it came from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VerdictView {
    /// The member that probed.
    pub member: String,
    /// Passed.
    pub ok: bool,
    /// What it saw.
    pub detail: String,
    /// When it was probed, ms since the epoch (the prober's clock).
    pub at_unix_ms: u64,
}

/// A state change of this member.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HistoryView {
    /// When, ms since the epoch.
    pub at_unix_ms: u64,
    /// `joined`, `degraded`, `left`.
    pub state: String,
    /// Details (the etcd error, the member count).
    pub detail: String,
}
