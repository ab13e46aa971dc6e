//! `limit_req`'s leaky bucket, transcribed from
//! `ngx_http_limit_req_handler`, `ngx_http_limit_req_lookup`,
//! `ngx_http_limit_req_account`, `ngx_http_limit_req_unlock` and
//! `ngx_http_limit_req_expire` (nginx 1.22).
//!
//! Per key, `excess` in milli-requests and `last` in milliseconds: a
//! request finds `excess = excess - rate * ms / 1000 + 1000` (at least 0,
//! `ms` since `last`); more than `burst * 1000` rejects it and charges
//! nothing. With several limits, every limit but the last only looks (and
//! pins its key against eviction), the last one charges; if none rejects,
//! the earlier ones are charged too, and the request is delayed by the
//! longest `(excess - delay) * 1000 / rate` ms among them.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

/// One `limit_req_zone`'s keys.
#[derive(Debug)]
pub struct ReqZone {
    /// Bytes of slots the zone holds (see [`super::zone_bytes`]).
    budget: usize,
    state: Mutex<State>,
}

/// One `limit_req` as a request meets it.
#[derive(Clone, Copy, Debug)]
pub struct ReqRule<'z> {
    /// The zone.
    pub zone: &'z ReqZone,
    /// The zone's rate, milli-requests a second (at least 1).
    pub rate: u64,
    /// `burst`, milli-requests.
    pub burst: u64,
    /// `delay` (or `nodelay`), milli-requests: see
    /// [`crate::config::ReqDelay::milli`].
    pub delay: u64,
}

/// What the limits say of a request (`$limit_req_status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReqVerdict {
    /// No limit had a key: not accounted (the variable is not found).
    Declined,
    /// Passes at once.
    Passed,
    /// Passes after `ms`; `excess` in the zone of rule `rule` decided it.
    Delayed {
        /// How long to hold the request.
        ms: u64,
        /// The excess that decided it, milli-requests.
        excess: u64,
        /// The index of the limit that decided it.
        rule: usize,
    },
    /// Rejected by rule `rule` with `excess` over its burst.
    Rejected {
        /// The excess found, milli-requests.
        excess: u64,
        /// The index of the limit.
        rule: usize,
    },
    /// Rule `rule`'s zone had no room for a new key even after evicting
    /// its least recently used one (nginx: "could not allocate node",
    /// answered as a rejection).
    NoRoom {
        /// The index of the limit.
        rule: usize,
    },
}

const NIL: usize = usize::MAX;

#[derive(Debug, Default)]
struct State {
    index: HashMap<Box<[u8]>, usize>,
    nodes: Vec<Node>,
    free: Vec<usize>,
    /// Most recently used.
    head: usize,
    /// Least recently used.
    tail: usize,
    /// Bytes of slots in use.
    used: usize,
}

#[derive(Debug)]
struct Node {
    key: Box<[u8]>,
    /// None: never charged (nginx's `last = 0`, long ago).
    last: Option<u64>,
    excess: u64,
    /// Requests between their lookup and their charge (pinned).
    count: u32,
    prev: usize,
    next: usize,
}

/// What one lookup found.
enum Lookup {
    Busy(u64),
    Charged(u64),
    /// Looked, pinned: the node's slot.
    Again(usize),
    NoRoom,
}

/// The slab slot of a `limit_req` node with a key of `len` bytes.
pub fn slot(len: usize) -> usize {
    (80 + len).next_power_of_two()
}

/// Run the limits `rules` for one request whose keys (one per rule, in
/// order; empty: that limit does not apply) are `keys`, at `now` ms.
pub fn check(rules: &[ReqRule<'_>], keys: &[&[u8]], now: u64) -> ReqVerdict {
    let last_rule = rules.len().saturating_sub(1);
    let mut pinned: Vec<(usize, usize)> = Vec::new();
    let mut charged = None;
    let mut looked = false;
    let mut at = last_rule;
    for (n, (rule, key)) in rules.iter().zip(keys).enumerate() {
        at = n;
        if key.is_empty() {
            continue;
        }
        match rule.zone.lookup(key, now, rule, n == last_rule) {
            Lookup::Again(slot) => {
                looked = true;
                pinned.push((n, slot));
            }
            Lookup::Charged(excess) => {
                charged = Some(excess);
                break;
            }
            Lookup::Busy(excess) => {
                unpin(rules, &pinned);
                return ReqVerdict::Rejected { excess, rule: n };
            }
            Lookup::NoRoom => {
                unpin(rules, &pinned);
                return ReqVerdict::NoRoom { rule: n };
            }
        }
    }
    let excess = match (charged, looked) {
        (Some(e), _) => e,
        (None, true) => 0,
        (None, false) => return ReqVerdict::Declined,
    };
    // ngx_http_limit_req_account.
    let mut decided = (excess, at);
    let mut max_delay = delay_of(&rules[at], excess);
    for &(n, slot) in pinned.iter().rev() {
        let rule = &rules[n];
        let e = rule.zone.charge(slot, now, rule.rate);
        let d = delay_of(rule, e);
        if d > max_delay {
            max_delay = d;
            decided = (e, n);
        }
    }
    match max_delay {
        0 => ReqVerdict::Passed,
        ms => ReqVerdict::Delayed {
            ms,
            excess: decided.0,
            rule: decided.1,
        },
    }
}

fn delay_of(rule: &ReqRule<'_>, excess: u64) -> u64 {
    if excess <= rule.delay {
        return 0;
    }
    (excess - rule.delay).saturating_mul(1000) / rule.rate.max(1)
}

/// ngx_http_limit_req_unlock: the pinned keys of a rejected request go
/// back uncharged.
fn unpin(rules: &[ReqRule<'_>], pinned: &[(usize, usize)]) {
    for &(n, slot) in pinned.iter().rev() {
        let mut s = rules[n].zone.lock();
        if let Some(node) = s.nodes.get_mut(slot) {
            node.count = node.count.saturating_sub(1);
        }
    }
}

/// The excess a key at `excess`, last charged at `last`, has at `now`
/// with one more request, and the milliseconds gone by (nginx's `ms`: 0
/// when `now` is earlier, 1 when over a minute earlier).
fn drained(excess: u64, last: Option<u64>, now: u64, rate: u64) -> (u64, u64) {
    let ms = match last {
        None => u64::MAX,
        Some(l) if now >= l => now - l,
        Some(l) if l - now > 60_000 => 1,
        Some(_) => 0,
    };
    let out = u128::from(rate) * u128::from(ms) / 1000;
    let e = (u128::from(excess) + 1000).saturating_sub(out);
    (u64::try_from(e).unwrap_or(u64::MAX), ms)
}

// === impl ReqZone ===

impl ReqZone {
    /// A zone of `size` bytes (as `zone=NAME:SIZE` says).
    pub fn new(size: u64) -> Self {
        Self {
            budget: super::zone_bytes(size),
            state: Mutex::new(State {
                head: NIL,
                tail: NIL,
                ..State::default()
            }),
        }
    }

    /// The number of keys the zone holds now.
    pub fn len(&self) -> usize {
        self.lock().index.len()
    }

    /// Whether the zone holds no key.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// ngx_http_limit_req_lookup.
    fn lookup(&self, key: &[u8], now: u64, rule: &ReqRule<'_>, account: bool) -> Lookup {
        let mut s = self.lock();
        if let Some(&i) = s.index.get(key) {
            s.bump(i);
            let node = &mut s.nodes[i];
            let (excess, ms) = drained(node.excess, node.last, now, rule.rate);
            if excess > rule.burst {
                return Lookup::Busy(excess);
            }
            if account {
                node.excess = excess;
                if ms != 0 {
                    node.last = Some(now);
                }
                return Lookup::Charged(excess);
            }
            node.count += 1;
            return Lookup::Again(i);
        }
        let cost = slot(key.len());
        s.expire(now, rule.rate, false);
        if s.used + cost > self.budget {
            s.expire(now, rule.rate, true);
            if s.used + cost > self.budget {
                return Lookup::NoRoom;
            }
        }
        let node = Node {
            key: key.into(),
            last: account.then_some(now),
            excess: 0,
            count: u32::from(!account),
            prev: NIL,
            next: NIL,
        };
        let i = s.insert(node, cost);
        if account {
            Lookup::Charged(0)
        } else {
            Lookup::Again(i)
        }
    }

    /// The charge of ngx_http_limit_req_account for a pinned key: its
    /// excess now, kept, and the pin released.
    fn charge(&self, slot: usize, now: u64, rate: u64) -> u64 {
        let mut s = self.lock();
        let Some(node) = s.nodes.get_mut(slot) else {
            return 0;
        };
        let (excess, ms) = drained(node.excess, node.last, now, rate);
        if ms != 0 {
            node.last = Some(now);
        }
        node.excess = excess;
        node.count = node.count.saturating_sub(1);
        excess
    }
}

// === impl State ===

impl State {
    /// ngx_http_limit_req_expire: from the least recently used end, drop
    /// up to two keys idle for a minute whose excess has drained; `force`
    /// first drops the least recently used key whatever its state. A key
    /// pinned by a request in flight stops the walk.
    fn expire(&mut self, now: u64, rate: u64, force: bool) {
        let mut n = if force { 0 } else { 1 };
        while n < 3 {
            let t = self.tail;
            let Some(node) = self.nodes.get(t) else {
                return;
            };
            if node.count != 0 {
                return;
            }
            if n != 0 {
                let ms = node.last.map_or(u64::MAX, |l| l.abs_diff(now));
                if ms < 60_000 {
                    return;
                }
                let out = u128::from(rate) * u128::from(ms) / 1000;
                if u128::from(node.excess) > out {
                    return;
                }
            }
            n += 1;
            self.remove(t);
        }
    }

    fn insert(&mut self, node: Node, cost: usize) -> usize {
        let key = node.key.clone();
        let i = match self.free.pop() {
            Some(i) => {
                self.nodes[i] = node;
                i
            }
            None => {
                self.nodes.push(node);
                self.nodes.len() - 1
            }
        };
        self.index.insert(key, i);
        self.used += cost;
        self.link_front(i);
        i
    }

    fn remove(&mut self, i: usize) {
        self.unlink(i);
        let key = std::mem::take(&mut self.nodes[i].key);
        self.used = self.used.saturating_sub(slot(key.len()));
        self.index.remove(&key);
        self.free.push(i);
    }

    fn bump(&mut self, i: usize) {
        if self.head != i {
            self.unlink(i);
            self.link_front(i);
        }
    }

    fn unlink(&mut self, i: usize) {
        let (prev, next) = (self.nodes[i].prev, self.nodes[i].next);
        match self.nodes.get_mut(prev) {
            Some(p) => p.next = next,
            None => self.head = next,
        }
        match self.nodes.get_mut(next) {
            Some(n) => n.prev = prev,
            None => self.tail = prev,
        }
        self.nodes[i].prev = NIL;
        self.nodes[i].next = NIL;
    }

    fn link_front(&mut self, i: usize) {
        let old = self.head;
        self.nodes[i].prev = NIL;
        self.nodes[i].next = old;
        match self.nodes.get_mut(old) {
            Some(o) => o.prev = i,
            None => self.tail = i,
        }
        self.head = i;
    }
}

#[cfg(test)]
mod tests;
