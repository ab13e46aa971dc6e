//! `limit_conn`: the requests in flight per key, transcribed from
//! `ngx_http_limit_conn_handler` and `ngx_http_limit_conn_cleanup` (nginx
//! 1.22). A request takes one from each limit whose key is not empty, in
//! order; a key at its limit (or a zone with no room for a new key)
//! refuses it and gives back what it took. What it took goes back when
//! the [`ConnHold`]s drop (nginx: when the request's pool is cleaned, at
//! its end); a key with none left is forgotten.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

/// One `limit_conn_zone`'s keys.
#[derive(Debug)]
pub struct ConnZone {
    budget: usize,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    counts: HashMap<Box<[u8]>, u32>,
    used: usize,
}

/// One `limit_conn` as a request meets it.
#[derive(Clone, Copy, Debug)]
pub struct ConnRule<'z> {
    /// The zone.
    pub zone: &'z Arc<ConnZone>,
    /// The limit, 1..=65535.
    pub conn: u32,
}

/// What the limits say of a request (`$limit_conn_status`).
#[derive(Debug)]
pub enum ConnVerdict {
    /// No limit had a key.
    Declined,
    /// Taken: held until these drop.
    Passed(Vec<ConnHold>),
    /// Refused by limit `rule` (`full`: its key was at its limit; else
    /// its zone had no room for a new key).
    Rejected {
        /// The index of the limit.
        rule: usize,
        /// The key was at its limit (false: no room for a new key).
        full: bool,
    },
}

/// One request in flight on one key; given back on drop.
#[derive(Debug)]
pub struct ConnHold {
    zone: Arc<ConnZone>,
    key: Box<[u8]>,
}

/// The slab slot of a `limit_conn` node with a key of `len` bytes.
pub fn slot(len: usize) -> usize {
    (36 + len).next_power_of_two()
}

/// Take one from each of `rules` for a request whose keys are `keys`
/// (empty: that limit does not apply).
pub fn acquire(rules: &[ConnRule<'_>], keys: &[&[u8]]) -> ConnVerdict {
    let mut held = Vec::new();
    let mut any = false;
    for (n, (rule, key)) in rules.iter().zip(keys).enumerate() {
        if key.is_empty() {
            continue;
        }
        any = true;
        match rule.zone.take(key, rule.conn) {
            Ok(()) => held.push(ConnHold {
                zone: Arc::clone(rule.zone),
                key: (*key).into(),
            }),
            Err(full) => return ConnVerdict::Rejected { rule: n, full },
        }
    }
    if any {
        ConnVerdict::Passed(held)
    } else {
        ConnVerdict::Declined
    }
}

// === impl ConnZone ===

impl ConnZone {
    /// A zone of `size` bytes (as `zone=NAME:SIZE` says).
    pub fn new(size: u64) -> Self {
        Self {
            budget: super::zone_bytes(size),
            state: Mutex::default(),
        }
    }

    /// The requests in flight on `key`.
    pub fn count(&self, key: &[u8]) -> u32 {
        self.lock().counts.get(key).copied().unwrap_or(0)
    }

    /// The number of keys with requests in flight.
    pub fn len(&self) -> usize {
        self.lock().counts.len()
    }

    /// Whether no key has a request in flight.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One more on `key`; Err(true) at the limit, Err(false) no room.
    fn take(&self, key: &[u8], limit: u32) -> Result<(), bool> {
        let mut s = self.lock();
        if let Some(n) = s.counts.get_mut(key) {
            if *n >= limit {
                return Err(true);
            }
            *n += 1;
            return Ok(());
        }
        let cost = slot(key.len());
        if s.used + cost > self.budget {
            return Err(false);
        }
        s.used += cost;
        s.counts.insert(key.into(), 1);
        Ok(())
    }

    fn give_back(&self, key: &[u8]) {
        let mut s = self.lock();
        let gone = match s.counts.get_mut(key) {
            Some(n) => {
                *n = n.saturating_sub(1);
                *n == 0
            }
            None => false,
        };
        if gone {
            s.counts.remove(key);
            s.used = s.used.saturating_sub(slot(key.len()));
        }
    }
}

// === impl ConnHold ===

impl Drop for ConnHold {
    fn drop(&mut self) {
        self.zone.give_back(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zone() -> Arc<ConnZone> {
        Arc::new(ConnZone::new(1024 * 1024))
    }

    #[test]
    fn a_key_at_its_limit_is_refused_until_one_ends() {
        let z = zone();
        let r = [ConnRule { zone: &z, conn: 1 }];
        let first = acquire(&r, &[b"ip"]);
        assert!(matches!(first, ConnVerdict::Passed(ref h) if h.len() == 1));
        assert!(matches!(
            acquire(&r, &[b"ip"]),
            ConnVerdict::Rejected {
                rule: 0,
                full: true
            }
        ));
        assert!(matches!(acquire(&r, &[b"other"]), ConnVerdict::Passed(_)));
        drop(first);
        assert_eq!(z.count(b"ip"), 0);
        assert!(matches!(acquire(&r, &[b"ip"]), ConnVerdict::Passed(_)));
    }

    #[test]
    fn a_refusal_gives_back_what_the_earlier_limits_took() {
        let a = zone();
        let b = zone();
        let r = [
            ConnRule { zone: &a, conn: 5 },
            ConnRule { zone: &b, conn: 1 },
        ];
        let held = acquire(&r, &[b"k", b"k"]);
        assert!(matches!(
            acquire(&r, &[b"k", b"k"]),
            ConnVerdict::Rejected {
                rule: 1,
                full: true
            }
        ));
        assert_eq!(a.count(b"k"), 1);
        drop(held);
        assert!(a.is_empty() && b.is_empty());
        assert!(matches!(acquire(&r, &[b"", b""]), ConnVerdict::Declined));
    }

    #[test]
    fn a_full_zone_refuses_a_new_key() {
        // 32 KiB: 7 pages of 4096, 64 slots of 64 bytes each.
        let z = Arc::new(ConnZone::new(32 * 1024));
        let r = [ConnRule { zone: &z, conn: 1 }];
        let held: Vec<_> = (0u32..448)
            .map(|i| acquire(&r, &[&i.to_be_bytes()]))
            .collect();
        assert!(held.iter().all(|h| matches!(h, ConnVerdict::Passed(_))));
        assert!(matches!(
            acquire(&r, &[b"new"]),
            ConnVerdict::Rejected {
                rule: 0,
                full: false
            }
        ));
        drop(held);
        assert!(matches!(acquire(&r, &[b"new"]), ConnVerdict::Passed(_)));
    }
}
