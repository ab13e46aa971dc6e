//! Which writes under the fleet's prefix a member believes. etcd lets
//! anyone with write access there put any key, so a member counts and
//! records only:
//! - member keys attached to a lease: a lease-less key never counts. In
//!   etcd a key with a lease exists only while its lease lives (a put with
//!   an unknown lease is refused; the lease's expiry or revocation deletes
//!   its keys in the same revision), so attached means alive, with no
//!   call to etcd;
//! - results and ejections of a current member, carried under that
//!   member's own lease (the one its member key has); results only for
//!   targets that rendezvous assigns to their writer, as this member
//!   computes it (same member list, this member's `replicas`);
//! - times within [`MAX_SKEW`] of this member's clock; a result older than
//!   the TTL plus [`MAX_SKEW`] is stale. What a believed ejection does here
//!   (a halving no longer than this member's own config could exclude the
//!   peer) is core's `policy::remote_ejection`.
//!
//! A write that is not believed is counted and logged once per key
//! ([`Ignored`]). This is hygiene, not authentication: lease ids are
//! readable, so a writer can join with a real lease or write under a
//! member's; the defence is etcd's auth and TLS (docs/security.md).

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use crate::rendezvous;

/// How far apart the members' wall clocks may be: a time more than this
/// ahead of this member's clock is not believed.
pub(crate) const MAX_SKEW: Duration = Duration::from_secs(5);
/// Distinct ignored keys logged at most; past that they are only counted.
const LOGGED_KEYS: usize = 1024;

/// The live members, each with the lease its member key is attached to.
#[derive(Debug, Default)]
pub(crate) struct Roster {
    leases: BTreeMap<String, i64>,
    /// The names, sorted (what rendezvous hashing takes).
    names: Vec<String>,
}

/// Why a write under the prefix was not believed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Why {
    /// A member key with no lease.
    NoLease,
    /// A result or ejection named for no live member.
    NotMember,
    /// A result or ejection under another lease than its member's key.
    OtherLease,
    /// A result for a target rendezvous does not assign to its writer.
    NotOwner,
    /// Stamped this many ms ahead of this member's clock (over [`MAX_SKEW`]).
    Future(u64),
    /// A result stamped this many ms ago (over the TTL plus [`MAX_SKEW`]).
    Stale(u64),
    /// A result or ejection whose value is not one (not the JSON a member
    /// writes).
    Unreadable,
}

/// Ignored writes: how many, and which keys were logged.
#[derive(Debug, Default)]
pub(crate) struct Ignored {
    count: u64,
    logged: HashSet<(&'static str, String)>,
    full: bool,
}

// === impl Roster ===

impl Roster {
    /// A member key was put with `lease` (0: none). A lease-less key
    /// takes the name out: it never counts.
    pub(crate) fn put(&mut self, member: &str, lease: i64) -> Result<(), Why> {
        if lease == 0 {
            self.delete(member);
            return Err(Why::NoLease);
        }
        if self.leases.insert(member.to_string(), lease).is_none() {
            self.names = self.leases.keys().cloned().collect();
        }
        Ok(())
    }

    /// A member key was deleted (its lease ended, or someone deleted it).
    pub(crate) fn delete(&mut self, member: &str) {
        if self.leases.remove(member).is_some() {
            self.names = self.leases.keys().cloned().collect();
        }
    }

    /// The lease of `member`'s key, if it is a live member.
    pub(crate) fn lease_of(&self, member: &str) -> Option<i64> {
        self.leases.get(member).copied()
    }

    /// The live members, sorted.
    pub(crate) fn names(&self) -> &[String] {
        &self.names
    }

    /// A write of `member` carried under `lease`: believed only from a
    /// live member, under its member key's lease.
    pub(crate) fn check_writer(&self, member: &str, lease: i64) -> Result<(), Why> {
        match self.lease_of(member) {
            None => Err(Why::NotMember),
            Some(l) if l != lease => Err(Why::OtherLease),
            Some(_) => Ok(()),
        }
    }

    /// A result of `member` for `target`, stamped `at_unix_ms`, heard at
    /// `now_unix_ms` under `lease`.
    pub(crate) fn check_result(
        &self,
        member: &str,
        lease: i64,
        target: &str,
        replicas: usize,
        (at_unix_ms, now_unix_ms): (u64, u64),
        ttl: Duration,
    ) -> Result<(), Why> {
        self.check_writer(member, lease)?;
        if !rendezvous::owns(member, target, &self.names, replicas) {
            return Err(Why::NotOwner);
        }
        check_time(at_unix_ms, now_unix_ms)?;
        let age = now_unix_ms.saturating_sub(at_unix_ms);
        if age > ms(ttl + MAX_SKEW) {
            return Err(Why::Stale(age));
        }
        Ok(())
    }

    /// A passive ejection of `member` stamped `at_unix_ms`, heard at
    /// `now_unix_ms` under `lease` (whether it is over is core's
    /// `policy::remote_ejection`'s business).
    pub(crate) fn check_ejection(
        &self,
        member: &str,
        lease: i64,
        (at_unix_ms, now_unix_ms): (u64, u64),
    ) -> Result<(), Why> {
        self.check_writer(member, lease)?;
        check_time(at_unix_ms, now_unix_ms)
    }
}

/// Not more than [`MAX_SKEW`] ahead of now.
fn check_time(at_unix_ms: u64, now_unix_ms: u64) -> Result<(), Why> {
    let ahead = at_unix_ms.saturating_sub(now_unix_ms);
    if ahead > ms(MAX_SKEW) {
        return Err(Why::Future(ahead));
    }
    Ok(())
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

// === impl Why ===

impl Why {
    /// Its kind, for logging once per key and kind.
    fn kind(self) -> &'static str {
        match self {
            Why::NoLease => "no lease",
            Why::NotMember => "not a member",
            Why::OtherLease => "other lease",
            Why::NotOwner => "not the owner",
            Why::Future(_) => "future",
            Why::Stale(_) => "stale",
            Why::Unreadable => "unreadable",
        }
    }

    /// Worth a warning: anything but a result from a member whose view of
    /// the member list is a moment behind (a reassignment under way).
    fn warns(self) -> bool {
        self != Why::NotOwner
    }
}

impl std::fmt::Display for Why {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Why::NoLease => f.write_str("a member key without a lease never counts"),
            Why::NotMember => f.write_str("its writer is no live member"),
            Why::OtherLease => f.write_str("it is not under its member's lease"),
            Why::NotOwner => {
                f.write_str("rendezvous does not assign the target to its writer here")
            }
            Why::Future(ms) => write!(
                f,
                "stamped {ms} ms ahead of this member's clock (more than {} s: a forgery or a wrong clock)",
                MAX_SKEW.as_secs()
            ),
            Why::Stale(ms) => write!(
                f,
                "stamped {ms} ms ago (older than the lease TTL plus {} s: a replay or a wrong clock)",
                MAX_SKEW.as_secs()
            ),
            Why::Unreadable => f.write_str("its value is not a member's"),
        }
    }
}

// === impl Ignored ===

impl Ignored {
    /// Count an ignored write of `key`; log it the first time its key is
    /// ignored for this reason (a hostile writer cannot flood the log).
    pub(crate) fn note(&mut self, key: &[u8], why: Why) {
        self.count = self.count.saturating_add(1);
        let key = String::from_utf8_lossy(key);
        if self.logged.contains(&(why.kind(), key.to_string())) {
            return;
        }
        if self.logged.len() >= LOGGED_KEYS {
            if !self.full {
                self.full = true;
                tracing::warn!(target: "vigil::fleet", "fleet: {LOGGED_KEYS} keys under the fleet's prefix were ignored; more are counted (GET /api/fleet: ignored_writes), not logged");
            }
            return;
        }
        // `?key`: quoted and escaped, whatever bytes a writer chose.
        if why.warns() {
            tracing::warn!(target: "vigil::fleet", key = ?key, "fleet: ignored a write under the fleet's prefix: {why} (logged once per key)");
        } else {
            tracing::debug!(target: "vigil::fleet", key = ?key, "fleet: ignored a write under the fleet's prefix: {why} (logged once per key)");
        }
        self.logged.insert((why.kind(), key.into_owned()));
    }

    /// Writes ignored so far.
    pub(crate) fn count(&self) -> u64 {
        self.count
    }
}

#[cfg(test)]
mod tests;
